/* Internal to src/core: the scalar bf16 / fp16 rounding rules (nearest even,
 * NaN quieted), inline so that the parallel cast loops (parallel.c) and the
 * public one-value functions (util.c) share one definition. */
#ifndef ZOFF_HALF_INTERNAL_H
#define ZOFF_HALF_INTERNAL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t zoff_half_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline uint16_t zoff_half_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);     /* NaN */
    if (au >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* overflow -> inf (rounds past 65504) */
    if (au < 0x38800000u) {                                      /* subnormal or zero in f16 */
        float a;
        memcpy(&a, &au, 4);
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
