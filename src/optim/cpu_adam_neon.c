/* NEON kernels (4 fp32 lanes, aarch64 only) for the host optimizers; the code
 * is cpu_optim_body.h. bf16 rounding with integer ops, fp16 with FCVTN/FCVTL
 * (nearest even under the default FPCR). On other architectures this file
 * compiles to nothing. */
#if defined(__aarch64__)
#include <arm_neon.h>
#include <stdint.h>

#include "optim/cpu_optim_internal.h"

typedef float32x4_t zv;
typedef uint32x4_t zi;
#define ZW 4

#define zv_set1(f) vdupq_n_f32(f)
#define zv_ld_f32(ptr) vld1q_f32(ptr)
#define zv_ld_bf16(ptr) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(ptr), 16))
#define zv_ld_f16(ptr) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(ptr)))
#define zv_st_f32(ptr, x) vst1q_f32((ptr), (x))
#define zv_add vaddq_f32
#define zv_sub vsubq_f32
#define zv_mul vmulq_f32
#define zv_div vdivq_f32
#define zv_sqrt vsqrtq_f32
#define zv_fma(a, b, c) vfmaq_f32((c), (a), (b))
#define zi_zero() vdupq_n_u32(0)
#define zi_lo16(r) vandq_u32((r), vdupq_n_u32(0xffff))
#define zi_hi16(r) vshrq_n_u32((r), 16)

static inline __attribute__((always_inline)) zv zv_negcopysign(zv mag, zv x) {
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    uint32x4_t r = vorrq_u32(vandq_u32(vreinterpretq_u32_f32(x), sign), vreinterpretq_u32_f32(mag));
    return vreinterpretq_f32_u32(veorq_u32(r, sign));
}

static inline __attribute__((always_inline)) zi zi_rand(uint32_t seed, uint32_t idx) {
    static const uint32_t lanes[4] = {0, ZO_WEYL, 2 * ZO_WEYL, 3 * ZO_WEYL};
    return vaddq_u32(vdupq_n_u32(idx * ZO_WEYL + seed), vld1q_u32(lanes));
}

static inline __attribute__((always_inline)) void zv_st_bf16(uint16_t *ptr, zv x) {
    uint32x4_t b = vreinterpretq_u32_f32(x);
    uint32x4_t hi = vshrq_n_u32(b, 16);
    uint32x4_t r = vaddq_u32(b, vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(hi, vdupq_n_u32(1))));
    r = vshrq_n_u32(r, 16);
    uint32x4_t notnan = vceqq_f32(x, x);
    r = vbslq_u32(notnan, r, vorrq_u32(hi, vdupq_n_u32(0x40)));
    vst1_u16(ptr, vmovn_u32(r));
}

static inline __attribute__((always_inline)) void zv_st_f16(uint16_t *ptr, zv x) {
    vst1_u16(ptr, vreinterpret_u16_f16(vcvt_f16_f32(x)));
}

static inline __attribute__((always_inline)) void zv_st_bf16_sr(uint16_t *ptr, zv x, zi r16) {
    uint32x4_t b = vreinterpretq_u32_f32(x);
    uint32x4_t notnan = vceqq_f32(x, x);
    uint32x4_t r = vbslq_u32(notnan, vaddq_u32(b, r16), vorrq_u32(b, vdupq_n_u32(0x00400000u)));
    vst1_u16(ptr, vmovn_u32(vshrq_n_u32(r, 16)));
}

#define zv_st16_bf16 zv_st_bf16
#define zv_st16_f16 zv_st_f16

#define ZO_FN(name) name##_neon
#include "optim/cpu_optim_body.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int zoff_cpu_adam_neon_unused;
#endif
