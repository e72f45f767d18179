/* Row kernels of the CPU backend with SIMD implementations (internal to
 * src/backend/cpu). cpu_kernels.c picks one table per process:
 * zoff_cpu_vec_avx2 when zoff_cpu_features_get() reports avx2, fma and f16c,
 * else its own portable scalar table. Each entry works on one row, so the
 * dispatch costs one indirect call per row, never per element. */
#ifndef ZOFF_CPU_KERNELS_SIMD_H
#define ZOFF_CPU_KERNELS_SIMD_H

#include <stdint.h>

typedef struct zoff_cpu_vec_ops {
    /* max of x(n); -inf for n = 0; NaN elements are skipped (they poison the exp sum instead) */
    float (*max)(const float *x, int64_t n);
    /* dst(n) = exp(src - shift) (dst may alias src, or be NULL); returns the sum */
    float (*exp_sum)(float *dst, const float *src, int64_t n, float shift);
    /* s(n) = exp(s - l); d(n) = s * (d - D)   (attention backward) */
    void (*softmax_grad)(float *s, float *d, int64_t n, float l, float D);
    /* o(n) = GELU(x), tanh approximation */
    void (*gelu)(float *o, const float *x, int64_t n);
    /* o(n) = GELU'(x) * dy; o may alias dy */
    void (*gelu_grad)(float *o, const float *x, const float *dy, int64_t n);
    /* f16 <-> f32, round to nearest even */
    void (*f16_to_f32)(float *dst, const uint16_t *src, int64_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, int64_t n);
} zoff_cpu_vec_ops;

#if defined(__x86_64__)
extern const zoff_cpu_vec_ops zoff_cpu_vec_avx2;
#endif

#endif
