/* Parallel bulk fills, copies and casts of large host buffers (start-up:
 * zeroing the optimizer state, copying and rounding the initial weights).
 * Each thread takes one contiguous piece, page aligned, so that the first
 * touch of fresh memory (the kernel's page clearing) is spread over the
 * threads too. Results do not depend on the thread count. */
#include <omp.h>
#include <string.h>

#if defined(__SSE2__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#include <emmintrin.h>
#define PAR_NT_COPY 1 /* (sanitizer builds copy with memcpy, which they check) */
#endif

#include "core/half_internal.h"
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

void zoff_copy_streaming(void *dst, const void *src, size_t n) {
#ifdef PAR_NT_COPY
    char *d = dst;
    const char *s = src;
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    if (head > n) head = n;
    memcpy(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)s), x1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32)), x3 = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, x0);
        _mm_stream_si128((__m128i *)(d + 16), x1);
        _mm_stream_si128((__m128i *)(d + 32), x2);
        _mm_stream_si128((__m128i *)(d + 48), x3);
    }
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

void zoff_store_fence(void) {
#ifdef PAR_NT_COPY
    _mm_sfence();
#endif
}
