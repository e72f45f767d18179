/* AVX-512 kernels (16 fp32 lanes) for the host optimizers: two variants of
 * the same code (cpu_optim_body.h):
 *   _avx512      AVX-512 F/BW/VL/DQ; bf16 rounding done with integer ops
 *   _avx512bf16  plus AVX512_BF16's VCVTNEPS2BF16 for nearest-even bf16 stores
 *                (it flushes fp32 subnormal inputs to +-0; see optim.h)
 * fp16 conversions use AVX-512F's VCVTPS2PH / VCVTPH2PS (exact, nearest even);
 * AVX512_FP16 arithmetic is not needed because all math is fp32.
 * Only called when zoff_cpu_features_get() reports the features. */
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include <stdint.h>

#include "optim/cpu_optim_internal.h"

typedef __m512 zv;
typedef __m512i zi;
#define ZW 16

#define zv_set1(f) _mm512_set1_ps(f)
#define zv_ld_f32(ptr) _mm512_loadu_ps(ptr)
#define zv_ld_bf16(ptr) \
    _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(ptr))), 16))
#define zv_ld_f16(ptr) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(ptr)))
#define zv_st_f32(ptr, x) _mm512_storeu_ps((ptr), (x))
#define zv_add _mm512_add_ps
#define zv_sub _mm512_sub_ps
#define zv_mul _mm512_mul_ps
#define zv_div _mm512_div_ps
#define zv_sqrt _mm512_sqrt_ps
#define zv_fma _mm512_fmadd_ps
#define zi_zero() _mm512_setzero_si512()
#define zi_lo16(r) _mm512_and_si512((r), _mm512_set1_epi32(0xffff))
#define zi_hi16(r) _mm512_srli_epi32((r), 16)

static inline __attribute__((always_inline)) zv zv_negcopysign(zv mag, zv x) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i r = _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(x), sign), _mm512_castps_si512(mag));
    return _mm512_castsi512_ps(_mm512_xor_si512(r, sign));
}

static inline __attribute__((always_inline)) zi zi_rand(uint32_t seed, uint32_t idx) {
    const __m512i lanes = _mm512_setr_epi32(0, (int)ZO_WEYL, (int)(2 * ZO_WEYL), (int)(3 * ZO_WEYL), (int)(4 * ZO_WEYL),
                                            (int)(5 * ZO_WEYL), (int)(6 * ZO_WEYL), (int)(7 * ZO_WEYL), (int)(8 * ZO_WEYL),
                                            (int)(9 * ZO_WEYL), (int)(10 * ZO_WEYL), (int)(11 * ZO_WEYL),
                                            (int)(12 * ZO_WEYL), (int)(13 * ZO_WEYL), (int)(14 * ZO_WEYL),
                                            (int)(15 * ZO_WEYL));
    return _mm512_add_epi32(_mm512_set1_epi32((int)(idx * ZO_WEYL + seed)), lanes);
}

/* 16 values (< 2^16 each, in 32-bit lanes) -> 16 uint16 */
#define zo_st_u16x16(ptr, r) _mm256_storeu_si256((__m256i *)(ptr), _mm512_cvtepi32_epi16(r))

/* nearest even with integer ops (same as zoff_f32_to_bf16) */
static inline __attribute__((always_inline)) void zo_st_bf16_int(uint16_t *ptr, zv x) {
    __m512i b = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(b, 16);
    __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1))));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
    zo_st_u16x16(ptr, r);
}

static inline __attribute__((always_inline)) void zo_st_bf16_hw(uint16_t *ptr, zv x) {
    __m256bh h = _mm512_cvtneps_pbh(x);
    __m256i hi;
    __builtin_memcpy(&hi, &h, sizeof hi);
    _mm256_storeu_si256((__m256i *)ptr, hi);
}

static inline __attribute__((always_inline)) void zv_st_f16(uint16_t *ptr, zv x) {
    _mm256_storeu_si256((__m256i *)ptr, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __attribute__((always_inline)) void zv_st_bf16_sr(uint16_t *ptr, zv x, zi r16) {
    __m512i b = _mm512_castps_si512(x);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i r = _mm512_mask_or_epi32(_mm512_add_epi32(b, r16), nan, b, _mm512_set1_epi32(0x00400000));
    zo_st_u16x16(ptr, _mm512_srli_epi32(r, 16));
}

#define zv_st16_f16 zv_st_f16

/* ---- even/odd split for all-bf16 modes (cpu_optim_body.h, ZO_EO) ---- */
#define ZO_EO 1
static inline __attribute__((always_inline)) void zv_ld_f32_eo(const float *ptr, zv *e, zv *o) {
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    zv a = _mm512_loadu_ps(ptr), b = _mm512_loadu_ps(ptr + 16);
    *e = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, io, b);
}
static inline __attribute__((always_inline)) void zv_st_f32_eo(float *ptr, zv e, zv o) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    _mm512_storeu_ps(ptr, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(ptr + 16, _mm512_permutex2var_ps(e, hi, o));
}
static inline __attribute__((always_inline)) void zv_ld_bf16_eo(const uint16_t *ptr, zv *e, zv *o) {
    __m512i x = _mm512_loadu_si512(ptr);
    *e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
/* the bf16 rounding of x (nearest even) in the high half of each lane, x not NaN */
static inline __attribute__((always_inline)) zi zo_bits_rne_num(zv x) {
    __m512i b = _mm512_castps_si512(x);
    return _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                                _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1))));
}
/* the same with NaN quieted */
static inline __attribute__((always_inline)) zi zo_bits_rne(zv x) {
    return _mm512_mask_or_epi32(zo_bits_rne_num(x), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castps_si512(x),
                                _mm512_set1_epi32(0x00400000));
}
/* stochastic: bits + r16 in the high half, x not NaN */
#define zo_bits_sr_num(x, r16) _mm512_add_epi32(_mm512_castps_si512(x), (r16))
/* the same with NaN quieted (and not rounded) */
static inline __attribute__((always_inline)) zi zo_bits_sr(zv x, zi r16) {
    return _mm512_mask_or_epi32(zo_bits_sr_num(x, r16), _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_castps_si512(x),
                                _mm512_set1_epi32(0x00400000));
}
static inline __attribute__((always_inline)) int zo_any_nan6(zv a, zv b, zv c, zv d, zv e, zv f) {
    return (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q) |
            _mm512_cmp_ps_mask(e, f, _CMP_UNORD_Q)) != 0;
}
/* interleave the high halves of e (even elements) and o (odd elements) into 32 bf16 */
static inline __attribute__((always_inline)) void zo_st_bits_eo(uint16_t *ptr, zi e, zi o) {
    /* (o & 0xffff0000) | (e >> 16): ternary-logic truth table A | (B & C) = 0xF8 */
    __m512i x = _mm512_ternarylogic_epi32(_mm512_srli_epi32(e, 16), o, _mm512_set1_epi32((int)0xffff0000u), 0xF8);
    _mm512_storeu_si512(ptr, x);
}
static inline __attribute__((always_inline)) zi zi_rand_eo(uint32_t seed, uint32_t idx) {
    const __m512i le = _mm512_setr_epi32(0, (int)(2 * ZO_WEYL), (int)(4 * ZO_WEYL), (int)(6 * ZO_WEYL), (int)(8 * ZO_WEYL),
                                         (int)(10 * ZO_WEYL), (int)(12 * ZO_WEYL), (int)(14 * ZO_WEYL),
                                         (int)(16 * ZO_WEYL), (int)(18 * ZO_WEYL), (int)(20 * ZO_WEYL),
                                         (int)(22 * ZO_WEYL), (int)(24 * ZO_WEYL), (int)(26 * ZO_WEYL),
                                         (int)(28 * ZO_WEYL), (int)(30 * ZO_WEYL));
    return _mm512_add_epi32(_mm512_set1_epi32((int)(idx * ZO_WEYL + seed)), le);
}
#define zi_addc(x, c) _mm512_add_epi32((x), _mm512_set1_epi32((int)(uint32_t)(c)))

/* ---- variant 1: integer bf16 rounding ---- */
#define ZO_FN(name) name##_avx512
#define zv_st_bf16 zo_st_bf16_int
#define zv_st16_bf16 zo_st_bf16_int
#include "optim/cpu_optim_body.h"
#undef ZO_FN
#undef zv_st_bf16
#undef zv_st16_bf16

/* ---- variant 2: AVX512_BF16 rounding ---- */
#define ZO_FN(name) name##_avx512bf16
#define zv_st_bf16 zo_st_bf16_hw
#define zv_st16_bf16 zo_st_bf16_hw
#include "optim/cpu_optim_body.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int zoff_cpu_adam_avx512_unused;
#endif
