/* Portable C kernels (one element at a time) for the host optimizers; the code
 * is cpu_optim_body.h with a one-lane "vector". fmaf() is the fused
 * multiply-add the SIMD paths use, so results match them bit for bit. This path
 * runs on any CPU; it is the fallback, not the fast path. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/half_internal.h"
#include "optim/cpu_optim_internal.h"
#include "zoff/core.h"

typedef float zv;
typedef uint32_t zi;
#define ZW 1

#define zv_set1(f) (f)
#define zv_ld_f32(ptr) (*(ptr))
#define zv_ld_bf16(ptr) zoff_half_bf16_to_f32(*(ptr))
#define zv_ld_f16(ptr) zoff_f16_to_f32(*(ptr))
#define zv_st_f32(ptr, x) (*(ptr) = (x))
#define zv_st_bf16(ptr, x) (*(ptr) = zoff_f32_to_bf16(x))
#define zv_st_f16(ptr, x) (*(ptr) = zoff_f32_to_f16(x))
#define zv_st16_bf16 zv_st_bf16
#define zv_st16_f16 zv_st_f16
#define zv_add(a, b) ((a) + (b))
#define zv_sub(a, b) ((a) - (b))
#define zv_mul(a, b) ((a) * (b))
#define zv_div(a, b) ((a) / (b))
#define zv_sqrt(a) sqrtf(a)
#define zv_fma(a, b, c) fmaf((a), (b), (c))
#define zv_negcopysign(mag, x) (-copysignf((mag), (x)))
#define zi_zero() 0u
#define zi_lo16(r) ((r) & 0xffffu)
#define zi_hi16(r) ((r) >> 16)
#define zi_rand(seed, idx) ((idx) * ZO_WEYL + (seed))

/* NaN: quieted and truncated, as zoff_f32_to_bf16 does (adding r16 could carry
 * a NaN's payload into the sign bit and give +-0) */
static inline void zv_st_bf16_sr(uint16_t *ptr, float x, uint32_t r16) {
    uint32_t b = zoff_f32_bits(x);
    *ptr = x != x ? (uint16_t)((b >> 16) | 0x40u) : (uint16_t)((b + r16) >> 16);
}

#define ZO_FN(name) name##_scalar
#include "optim/cpu_optim_body.h"
