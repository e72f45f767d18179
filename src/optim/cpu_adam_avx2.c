/* AVX2 + FMA + F16C kernels (8 fp32 lanes) for the host optimizers; the code
 * is cpu_optim_body.h. bf16 rounding is done with integer ops (AVX2 has no bf16
 * conversion), fp16 with F16C (exact, nearest even). Only called when
 * zoff_cpu_features_get() reports avx2, fma and f16c. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdint.h>

#include "optim/cpu_optim_internal.h"

typedef __m256 zv;
typedef __m256i zi;
#define ZW 8

#define zv_set1(f) _mm256_set1_ps(f)
#define zv_ld_f32(ptr) _mm256_loadu_ps(ptr)
#define zv_ld_bf16(ptr) \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(ptr))), 16))
#define zv_ld_f16(ptr) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(ptr)))
#define zv_st_f32(ptr, x) _mm256_storeu_ps((ptr), (x))
#define zv_add _mm256_add_ps
#define zv_sub _mm256_sub_ps
#define zv_mul _mm256_mul_ps
#define zv_div _mm256_div_ps
#define zv_sqrt _mm256_sqrt_ps
#define zv_fma _mm256_fmadd_ps
#define zi_zero() _mm256_setzero_si256()
#define zi_lo16(r) _mm256_and_si256((r), _mm256_set1_epi32(0xffff))
#define zi_hi16(r) _mm256_srli_epi32((r), 16)

static inline __attribute__((always_inline)) zv zv_negcopysign(zv mag, zv x) {
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    return _mm256_xor_ps(_mm256_or_ps(_mm256_and_ps(x, sign), mag), sign);
}

static inline __attribute__((always_inline)) zi zi_rand(uint32_t seed, uint32_t idx) {
    const __m256i lanes = _mm256_setr_epi32(0, (int)ZO_WEYL, (int)(2 * ZO_WEYL), (int)(3 * ZO_WEYL), (int)(4 * ZO_WEYL),
                                            (int)(5 * ZO_WEYL), (int)(6 * ZO_WEYL), (int)(7 * ZO_WEYL));
    return _mm256_add_epi32(_mm256_set1_epi32((int)(idx * ZO_WEYL + seed)), lanes);
}

/* 8 values (< 2^16 each, in 32-bit lanes) -> 8 uint16 */
static inline __attribute__((always_inline)) void zo_st_u16x8(uint16_t *ptr, __m256i r) {
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    _mm_storeu_si128((__m128i *)ptr, _mm_packus_epi32(lo, hi));
}

static inline __attribute__((always_inline)) void zv_st_bf16(uint16_t *ptr, zv x) {
    __m256i b = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(b, 16);
    __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    zo_st_u16x8(ptr, r);
}

static inline __attribute__((always_inline)) void zv_st_f16(uint16_t *ptr, zv x) {
    _mm_storeu_si128((__m128i *)ptr, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __attribute__((always_inline)) void zv_st_bf16_sr(uint16_t *ptr, zv x, zi r16) {
    __m256i b = _mm256_castps_si256(x);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    __m256i r = _mm256_blendv_epi8(_mm256_add_epi32(b, r16), _mm256_or_si256(b, _mm256_set1_epi32(0x00400000)), nan);
    zo_st_u16x8(ptr, _mm256_srli_epi32(r, 16));
}

#define zv_st16_bf16 zv_st_bf16
#define zv_st16_f16 zv_st_f16

/* ---- even/odd split for all-bf16 modes (cpu_optim_body.h, ZO_EO) ----
 * 16 elements per step. A 256-bit load of 16 bf16 holds elements 2k, 2k+1 in
 * 32-bit lane k, so a shift (even) and a mask (odd) widen them in place. The
 * fp32 weights are brought into the same order without a cross-lane shuffle:
 * a = [p0..p3 | p8..p11] and b = [p4..p7 | p12..p15] (128-bit loads), then
 * shuffle_ps picks the even / odd elements within each 128-bit lane. */
#define ZO_EO 1
static inline __attribute__((always_inline)) void zv_ld_f32_eo(const float *ptr, zv *e, zv *o) {
    __m256 a = _mm256_loadu2_m128(ptr + 8, ptr), b = _mm256_loadu2_m128(ptr + 12, ptr + 4);
    *e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    *o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
}
static inline __attribute__((always_inline)) void zv_st_f32_eo(float *ptr, zv e, zv o) {
    __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o); /* [p0..p3|p8..p11], [p4..p7|p12..p15] */
    _mm256_storeu_ps(ptr, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(ptr + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
}
static inline __attribute__((always_inline)) void zv_ld_bf16_eo(const uint16_t *ptr, zv *e, zv *o) {
    __m256i x = _mm256_loadu_si256((const __m256i *)ptr);
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}
/* the bf16 rounding of x (nearest even) in the high half of each lane, x not NaN */
static inline __attribute__((always_inline)) zi zo_bits_rne_num(zv x) {
    __m256i b = _mm256_castps_si256(x);
    return _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                                                _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1))));
}
/* the same with NaN quieted */
static inline __attribute__((always_inline)) zi zo_bits_rne(zv x) {
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(zo_bits_rne_num(x), _mm256_or_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x00400000)),
                              nan);
}
/* stochastic: bits + r16 in the high half, x not NaN */
#define zo_bits_sr_num(x, r16) _mm256_add_epi32(_mm256_castps_si256(x), (r16))
/* the same with NaN quieted (and not rounded) */
static inline __attribute__((always_inline)) zi zo_bits_sr(zv x, zi r16) {
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(zo_bits_sr_num(x, r16),
                              _mm256_or_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x00400000)), nan);
}
static inline __attribute__((always_inline)) int zo_any_nan6(zv a, zv b, zv c, zv d, zv e, zv f) {
    __m256 x = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_UNORD_Q), _mm256_cmp_ps(c, d, _CMP_UNORD_Q)),
                            _mm256_cmp_ps(e, f, _CMP_UNORD_Q));
    return !_mm256_testz_ps(x, x);
}
/* interleave the high halves of e (even elements) and o (odd elements) into 16 bf16 */
static inline __attribute__((always_inline)) void zo_st_bits_eo(uint16_t *ptr, zi e, zi o) {
    _mm256_storeu_si256((__m256i *)ptr, _mm256_blend_epi16(_mm256_srli_epi32(e, 16), o, 0xAA));
}
static inline __attribute__((always_inline)) zi zi_rand_eo(uint32_t seed, uint32_t idx) {
    const __m256i le = _mm256_setr_epi32(0, (int)(2 * ZO_WEYL), (int)(4 * ZO_WEYL), (int)(6 * ZO_WEYL),
                                         (int)(8 * ZO_WEYL), (int)(10 * ZO_WEYL), (int)(12 * ZO_WEYL),
                                         (int)(14 * ZO_WEYL));
    return _mm256_add_epi32(_mm256_set1_epi32((int)(idx * ZO_WEYL + seed)), le);
}
#define zi_addc(x, c) _mm256_add_epi32((x), _mm256_set1_epi32((int)(uint32_t)(c)))

#define ZO_FN(name) name##_avx2
#include "optim/cpu_optim_body.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int zoff_cpu_adam_avx2_unused;
#endif
