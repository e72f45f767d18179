/* Internal to src: a float's bits and back, and the scalar bf16 / fp16 rounding
 * rules (nearest even, NaN quieted), inline so that the loops that use them
 * (core/parallel.c, core/rng.c, the CPU kernels, the scalar host optimizer) and
 * the public one-value functions (core/util.c) share one definition. */
#ifndef ZOFF_HALF_INTERNAL_H
#define ZOFF_HALF_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* The bits of a float and the float of some bits (memcpy: no aliasing, one move). */
static inline uint32_t zoff_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float zoff_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* bf16 is fp32's high half: widening is exact. */
static inline float zoff_half_bf16_to_f32(uint16_t h) { return zoff_bits_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a (quiet) NaN. Branch-free, so loops vectorise. */
static inline uint16_t zoff_half_f32_to_bf16(float f) {
    uint32_t u = zoff_f32_bits(f);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t q = (u >> 16) | 0x40u; /* quiet NaN */
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? q : r);
}

static inline uint16_t zoff_half_f32_to_f16(float f) {
    uint32_t u = zoff_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);     /* NaN */
    if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* overflow -> inf (rounds past 65504) */
    if (au < 0x38800000u) {                                      /* subnormal or zero in f16 */
        float a = zoff_bits_f32(au);
        /* round to nearest even at 2^-24 granularity */
        float q = a * 16777216.0f; /* 2^24 */
        float r = nearbyintf(q);
        return (uint16_t)(sign | (uint32_t)r);
    }
    uint32_t mant_round = au + 0xfffu + ((au >> 13) & 1u);
    uint32_t h = ((mant_round >> 13) - (112u << 10));
    return (uint16_t)(sign | h);
}

#endif
