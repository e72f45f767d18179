/* Parallel bulk fills, copies and casts of large host buffers (start-up:
 * zeroing the optimizer state, copying and rounding the initial weights).
 * Each thread takes one contiguous piece, page aligned, so that the first
 * touch of fresh memory (the kernel's page clearing) is spread over the
 * threads too. Results do not depend on the thread count. */
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else /* a build without OpenMP (the fuzz harnesses' library): one thread */
static int omp_get_max_threads(void) { return 1; }
#endif

#if defined(__SSE2__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <emmintrin.h>
#define PAR_NT_COPY 1 /* (sanitizer builds copy with memcpy, which they check) */
#endif

#include "core/half_internal.h"
#include "core/parallel_internal.h"
#include "zoff/core.h"

/* below this many bytes a single thread does it (thread start-up costs more) */
#define PAR_MIN_BYTES ((size_t)1 << 20)
#define PAR_ALIGN_ELEMS 4096 /* piece boundaries: multiples of 4096 elements (>= one page) */

int zoff_par_threads(size_t bytes) {
    if (bytes < PAR_MIN_BYTES) return 1;
    int t = omp_get_max_threads();
    size_t most = bytes / (PAR_MIN_BYTES / 2);
    if ((size_t)t > most) t = (int)most;
    return t > 0 ? t : 1;
}

/* piece [*lo, *hi) of n elements for thread i of t */
static void piece(size_t n, int i, int t, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)t - 1) / (size_t)t;
    per = (per + PAR_ALIGN_ELEMS - 1) / PAR_ALIGN_ELEMS * PAR_ALIGN_ELEMS;
    *lo = per * (size_t)i < n ? per * (size_t)i : n;
    *hi = *lo + per < n ? *lo + per : n;
}

/* What one call moves: the piece functions below read what they need. */
typedef struct par_job {
    void *dst;
    const void *src;
    float f32;
    uint16_t u16;
    int byte;
} par_job;

/* Runs piece_fn on each thread's piece [lo, hi) of n elements; `bytes`, the size of the whole
 * job, sets the thread count. */
static void for_each_piece(size_t n, size_t bytes, void (*piece_fn)(const par_job *, size_t, size_t),
                           const par_job *job) {
    int t = zoff_par_threads(bytes);
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(n, i, t, &lo, &hi);
        if (hi > lo) piece_fn(job, lo, hi);
    }
}

static void memset_piece(const par_job *j, size_t lo, size_t hi) { memset((char *)j->dst + lo, j->byte, hi - lo); }
static void memcpy_piece(const par_job *j, size_t lo, size_t hi) {
    memcpy((char *)j->dst + lo, (const char *)j->src + lo, hi - lo);
}
static void fill_f32_piece(const par_job *j, size_t lo, size_t hi) {
    float *d = j->dst;
    for (size_t i = lo; i < hi; i++) d[i] = j->f32;
}
static void fill_u16_piece(const par_job *j, size_t lo, size_t hi) {
    uint16_t *d = j->dst;
    for (size_t i = lo; i < hi; i++) d[i] = j->u16;
}
static void bf16_piece(const par_job *j, size_t lo, size_t hi) {
    uint16_t *d = j->dst;
    const float *src = j->src;
    for (size_t i = lo; i < hi; i++) d[i] = zoff_half_f32_to_bf16(src[i]);
}
static void f16_piece(const par_job *j, size_t lo, size_t hi) {
    uint16_t *d = j->dst;
    const float *src = j->src;
    for (size_t i = lo; i < hi; i++) d[i] = zoff_half_f32_to_f16(src[i]);
}

void zoff_par_memset(void *dst, int byte, size_t bytes) {
    for_each_piece(bytes, bytes, memset_piece, &(par_job){.dst = dst, .byte = byte});
}

void zoff_par_memcpy(void *dst, const void *src, size_t bytes) {
    for_each_piece(bytes, bytes, memcpy_piece, &(par_job){.dst = dst, .src = src});
}

void zoff_par_fill_f32(float *dst, float value, size_t n) {
    for_each_piece(n, n * sizeof(float), fill_f32_piece, &(par_job){.dst = dst, .f32 = value});
}

void zoff_par_fill_u16(uint16_t *dst, uint16_t value, size_t n) {
    for_each_piece(n, n * sizeof(uint16_t), fill_u16_piece, &(par_job){.dst = dst, .u16 = value});
}

void zoff_par_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    for_each_piece(n, n * sizeof(float), bf16_piece, &(par_job){.dst = dst, .src = src});
}

void zoff_par_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
    for_each_piece(n, n * sizeof(float), f16_piece, &(par_job){.dst = dst, .src = src});
}

/* Streaming copies: dst's lines written whole, without being read first (no read for ownership)
 * and without displacing the caller's cache. Full-line stores (64 bytes, AVX-512) beat four
 * 16-byte ones on the Xeons measured (bench/snapshot_staging_cost.c, docs/performance.md). */
#ifdef PAR_NT_COPY
#include <immintrin.h>
#include <stdint.h>

/* bytes before d's first w-aligned byte (at most n) */
static size_t nt_head(const char *d, size_t w, size_t n) {
    size_t h = (w - ((uintptr_t)d & (w - 1))) & (w - 1);
    return h < n ? h : n;
}

static size_t nt_copy16(char *d, const char *s, size_t n) {
    size_t done = 0;
    for (; n - done >= 64; done += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + done)), x1 = _mm_loadu_si128((const __m128i *)(s + done + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + done + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + done + 48));
        _mm_stream_si128((__m128i *)(d + done), x0);
        _mm_stream_si128((__m128i *)(d + done + 16), x1);
        _mm_stream_si128((__m128i *)(d + done + 32), x2);
        _mm_stream_si128((__m128i *)(d + done + 48), x3);
    }
    return done;
}

__attribute__((target("avx"))) static size_t nt_copy32(char *d, const char *s, size_t n) {
    size_t done = 0;
    for (; n - done >= 128; done += 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(s + done)), x1 = _mm256_loadu_si256((const __m256i *)(s + done + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(s + done + 64)), x3 = _mm256_loadu_si256((const __m256i *)(s + done + 96));
        _mm256_stream_si256((__m256i *)(d + done), x0);
        _mm256_stream_si256((__m256i *)(d + done + 32), x1);
        _mm256_stream_si256((__m256i *)(d + done + 64), x2);
        _mm256_stream_si256((__m256i *)(d + done + 96), x3);
    }
    return done;
}

__attribute__((target("avx512f"))) static size_t nt_copy64(char *d, const char *s, size_t n) {
    size_t done = 0;
    for (; n - done >= 256; done += 256) {
        __m512i x0 = _mm512_loadu_si512(s + done), x1 = _mm512_loadu_si512(s + done + 64);
        __m512i x2 = _mm512_loadu_si512(s + done + 128), x3 = _mm512_loadu_si512(s + done + 192);
        _mm512_stream_si512((void *)(d + done), x0);
        _mm512_stream_si512((void *)(d + done + 64), x1);
        _mm512_stream_si512((void *)(d + done + 128), x2);
        _mm512_stream_si512((void *)(d + done + 192), x3);
    }
    return done;
}
#endif

int zoff_copy_streaming__widest(void) {
#ifdef PAR_NT_COPY
    const zoff_cpu_features *f = zoff_cpu_features_get();
    return f->avx512f ? 64 : f->avx2 ? 32 : 16;
#else
    return 0;
#endif
}

void zoff_copy_streaming__width(void *dst, const void *src, size_t n, int width) {
#ifdef PAR_NT_COPY
    if (width >= 16) {
        char *d = dst;
        const char *s = src;
        size_t head = nt_head(d, (size_t)width, n);
        memcpy(d, s, head);
        d += head, s += head, n -= head;
        size_t done = width >= 64 ? nt_copy64(d, s, n) : width >= 32 ? nt_copy32(d, s, n) : nt_copy16(d, s, n);
        memcpy(d + done, s + done, n - done);
        return;
    }
#else
    (void)width;
#endif
    memcpy(dst, src, n);
}

void zoff_copy_streaming(void *dst, const void *src, size_t n) {
    zoff_copy_streaming__width(dst, src, n, zoff_copy_streaming__widest());
}

void zoff_store_fence(void) {
#ifdef PAR_NT_COPY
    _mm_sfence();
#endif
}
