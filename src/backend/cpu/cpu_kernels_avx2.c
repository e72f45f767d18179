/* AVX2 + FMA + F16C row kernels of the CPU backend (see cpu_kernels_simd.h).
 * Built with -mavx2 -mfma -mf16c (the file name asks CMake for them); only
 * called when zoff_cpu_features_get() reports avx2, fma and f16c.
 * exp is Cephes' expf polynomial (within 2 ulp of the correctly rounded value
 * for x <= 88; 0 below -87.3; NaN stays NaN). */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels_simd.h"

#define AI static inline __attribute__((always_inline))

AI __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.33654475f), hi = _mm256_set1_ps(88.0f);
    __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi); /* NaN -> lo, restored below */
    __m256 fl = _mm256_floor_ps(_mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(fl, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(fl, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(_mm256_mul_ps(y, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_add_epi32(_mm256_cvtps_epi32(fl), _mm256_set1_epi32(127));
    __m256 e = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
    e = _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), e);
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|) */
AI __m256 tanh8(__m256 u) {
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), _mm256_andnot_ps(sign, u)));
    __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
    return _mm256_or_ps(t, _mm256_and_ps(sign, u));
}

/* Tail of n < 8 elements: load into zero-padded lanes, store back only n. */
AI __m256 ld_tail(const float *p, int64_t n) {
    float t[8] = {0};
    memcpy(t, p, (size_t)n * 4);
    return _mm256_loadu_ps(t);
}
AI void st_tail(float *p, __m256 v, int64_t n) {
    float t[8];
    _mm256_storeu_ps(t, v);
    memcpy(p, t, (size_t)n * 4);
}

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float avx2_max(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + j), m); /* NaN in x: keeps m */
    float t[8], mx;
    _mm256_storeu_ps(t, m);
    mx = t[0];
    for (int k = 1; k < 8; k++) mx = t[k] > mx ? t[k] : mx;
    for (; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static float avx2_exp_sum(float *dst, const float *src, int64_t n, float shift) {
    const __m256 sh = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(src + j), sh));
        if (dst) _mm256_storeu_ps(dst + j, e);
        acc = _mm256_add_ps(acc, e);
    }
    if (j < n) {
        __m256 x = _mm256_sub_ps(ld_tail(src + j, n - j), sh);
        __m256 keep = _mm256_castsi256_ps(
            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - j)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
        __m256 e = _mm256_and_ps(exp8(x), keep);
        if (dst) st_tail(dst + j, e, n - j);
        acc = _mm256_add_ps(acc, e);
    }
    return hsum(acc);
}

static void avx2_softmax_grad(float *s, float *d, int64_t n, float l, float D) {
    const __m256 vl = _mm256_set1_ps(l), vD = _mm256_set1_ps(D);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vl));
        _mm256_storeu_ps(s + j, p);
        _mm256_storeu_ps(d + j, _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(d + j), vD)));
    }
    if (j < n) {
        __m256 p = exp8(_mm256_sub_ps(ld_tail(s + j, n - j), vl));
        st_tail(s + j, p, n - j);
        st_tail(d + j, _mm256_mul_ps(p, _mm256_sub_ps(ld_tail(d + j, n - j), vD)), n - j);
    }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

AI __m256 gelu8(__m256 x) {
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_K), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    __m256 hx = _mm256_mul_ps(_mm256_set1_ps(0.5f), x);
    return _mm256_fmadd_ps(hx, tanh8(u), hx);
}

static void avx2_gelu(float *o, const float *x, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, gelu8(_mm256_loadu_ps(x + j)));
    if (j < n) st_tail(o + j, gelu8(ld_tail(x + j, n - j)), n - j);
}

/* GELU'(x) = 0.5 (1 + th) + 0.5 x (1 - th^2) K (1 + 3 * 0.044715 x^2) */
AI __m256 gelu_grad8(__m256 x, __m256 dy) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256 x2 = _mm256_mul_ps(x, x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_K), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), x2), x, x));
    __m256 th = tanh8(u);
    __m256 sech2 = _mm256_fnmadd_ps(th, th, one);
    __m256 du = _mm256_mul_ps(_mm256_set1_ps(GELU_K), _mm256_fmadd_ps(_mm256_set1_ps(3.0f * 0.044715f), x2, one));
    __m256 g = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2), du, _mm256_mul_ps(half, _mm256_add_ps(one, th)));
    return _mm256_mul_ps(g, dy);
}

static void avx2_gelu_grad(float *o, const float *x, const float *dy, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, gelu_grad8(_mm256_loadu_ps(x + j), _mm256_loadu_ps(dy + j)));
    if (j < n) st_tail(o + j, gelu_grad8(ld_tail(x + j, n - j), ld_tail(dy + j, n - j)), n - j);
}

static void avx2_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + j))));
    if (j < n) {
        uint16_t t[8] = {0};
        memcpy(t, src + j, (size_t)(n - j) * 2);
        st_tail(dst + j, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t)), n - j);
    }
}

static void avx2_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm_storeu_si128((__m128i *)(dst + j), _mm256_cvtps_ph(_mm256_loadu_ps(src + j), _MM_FROUND_TO_NEAREST_INT));
    if (j < n) {
        uint16_t t[8];
        _mm_storeu_si128((__m128i *)t, _mm256_cvtps_ph(ld_tail(src + j, n - j), _MM_FROUND_TO_NEAREST_INT));
        memcpy(dst + j, t, (size_t)(n - j) * 2);
    }
}

const zoff_cpu_vec_ops zoff_cpu_vec_avx2 = {
    .max = avx2_max,
    .exp_sum = avx2_exp_sum,
    .softmax_grad = avx2_softmax_grad,
    .gelu = avx2_gelu,
    .gelu_grad = avx2_gelu_grad,
    .f16_to_f32 = avx2_f16_to_f32,
    .f32_to_f16 = avx2_f32_to_f16,
};
#endif
