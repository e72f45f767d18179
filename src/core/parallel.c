/* Parallel bulk fills, copies and casts of large host buffers (start-up:
 * zeroing the optimizer state, copying and rounding the initial weights).
 * Each thread takes one contiguous piece, page aligned, so that the first
 * touch of fresh memory (the kernel's page clearing) is spread over the
 * threads too. Results do not depend on the thread count. */
#include <omp.h>
#include <string.h>

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

void zoff_par_memset(void *dst, int byte, size_t bytes) {
    int t = zoff_par_threads(bytes);
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(bytes, i, t, &lo, &hi);
        if (hi > lo) memset((char *)dst + lo, byte, hi - lo);
    }
}

void zoff_par_memcpy(void *dst, const void *src, size_t bytes) {
    int t = zoff_par_threads(bytes);
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(bytes, i, t, &lo, &hi);
        if (hi > lo) memcpy((char *)dst + lo, (const char *)src + lo, hi - lo);
    }
}

void zoff_par_fill_f32(float *dst, float value, size_t n) {
    int t = zoff_par_threads(n * sizeof(float));
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(n, i, t, &lo, &hi);
        for (size_t j = lo; j < hi; j++) dst[j] = value;
    }
}

void zoff_par_fill_u16(uint16_t *dst, uint16_t value, size_t n) {
    int t = zoff_par_threads(n * sizeof(uint16_t));
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(n, i, t, &lo, &hi);
        for (size_t j = lo; j < hi; j++) dst[j] = value;
    }
}

void zoff_par_f32_to_bf16(uint16_t *dst, const float *src, size_t n) {
    int t = zoff_par_threads(n * sizeof(float));
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(n, i, t, &lo, &hi);
        for (size_t j = lo; j < hi; j++) dst[j] = zoff_half_f32_to_bf16(src[j]);
    }
}

void zoff_par_f32_to_f16(uint16_t *dst, const float *src, size_t n) {
    int t = zoff_par_threads(n * sizeof(float));
#pragma omp parallel for num_threads(t) schedule(static, 1)
    for (int i = 0; i < t; i++) {
        size_t lo, hi;
        piece(n, i, t, &lo, &hi);
        for (size_t j = lo; j < hi; j++) dst[j] = zoff_half_f32_to_f16(src[j]);
    }
}
