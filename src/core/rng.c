/* Counter-based random numbers: Philox4x32-10 (Salmon, Moraes, Dror, Shaw,
 * "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator of
 * Random123, cuRAND and PyTorch's CUDA RNG). A value is a pure function of
 * (key, counter), so any range of a stream can be generated on its own, by any
 * number of threads, with the same result.
 *
 * Normals (zoff_rng_normal): element e of stream s under seed k takes the
 * Philox block at counter {e/4 (64 bits), s, 0}, key k; lanes (x0, x1) give
 * elements 4j, 4j+1 and (x2, x3) elements 4j+2, 4j+3 by Box-Muller:
 *     u1 = ((x0 >> 9) + 1/2) / 2^23 in (0, 1),  u2 = (x1 >> 8) / 2^24 in [0, 1)
 *     z0 = sqrt(-2 ln u1) cos(2 pi u2),  z1 = sqrt(-2 ln u1) sin(2 pi u2)
 * computed in fp32 with the polynomials and Newton steps below (no libm: the
 * same bits on every machine; vectorisable), within a few 1e-7 relative of the
 * double formula. */
#include <string.h>

#include "core/half_internal.h"
#include "zoff/core.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* The 10 rounds on nb counters (c0[b], c1[b], c2[b], c3[b]) in place, in loops
 * over b that the compiler runs in SIMD lanes. */
static inline __attribute__((always_inline)) void philox_rounds(int nb, uint32_t *c0, uint32_t *c1, uint32_t *c2,
                                                                 uint32_t *c3, uint32_t k0, uint32_t k1) {
    for (int r = 0; r < 10; r++) {
        const uint32_t rk0 = k0 + (uint32_t)r * PHILOX_W0, rk1 = k1 + (uint32_t)r * PHILOX_W1;
        for (int b = 0; b < nb; b++) {
            uint64_t p0 = (uint64_t)PHILOX_M0 * c0[b], p1 = (uint64_t)PHILOX_M1 * c2[b];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[b] ^ rk0, n2 = (uint32_t)(p0 >> 32) ^ c3[b] ^ rk1;
            c1[b] = (uint32_t)p1;
            c3[b] = (uint32_t)p0;
            c0[b] = n0;
            c2[b] = n2;
        }
    }
}

void zoff_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c[4] = {ctr[0], ctr[1], ctr[2], ctr[3]};
    philox_rounds(1, c, c + 1, c + 2, c + 3, key[0], key[1]);
    memcpy(out, c, sizeof c);
}

/* c[0] x^(n-1) + c[1] x^(n-2) + ... + c[n-1] by Horner's rule, highest power first
 * (the order of the operations fixes the bits). */
static inline float horner(float x, const float *c, int n) {
    float p = c[0];
    for (int i = 1; i < n; i++) p = p * x + c[i];
    return p;
}

/* ln(u) for normal u in (0, 1): u = 2^e m, m in [sqrt(1/2), sqrt(2)),
 * ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716 (series to s^11). */
static inline float ln_unit(float u) {
    uint32_t b = zoff_f32_bits(u);
    int e = (int)(b >> 23) - 127;
    uint32_t mb = (b & 0x7fffffu) | 0x3f800000u;
    uint32_t big = mb > 0x3fb504f3u; /* m > sqrt(2): halve it */
    mb -= big << 23;
    e += (int)big;
    float m = zoff_bits_f32(mb);
    float s = (m - 1.0f) / (m + 1.0f), s2 = s * s;
    static const float atanh_c[] = {1.0f / 11.0f, 1.0f / 9.0f, 1.0f / 7.0f, 1.0f / 5.0f, 1.0f / 3.0f, 1.0f};
    float p = horner(s2, atanh_c, 6);
    return (float)e * 0.693147180559945309f + 2.0f * s * p;
}

/* sqrt(y) for normal y > 0 as y / sqrt(y): the classic bit-level first guess
 * of 1/sqrt(y) (relative error < 3.5e-3) and three Newton steps (< 1e-7 before
 * fp32 rounding). Plain arithmetic, unlike sqrtf, which may set errno and so
 * keeps the loop from vectorising. */
static inline float sqrt_pos(float y) {
    float g = zoff_bits_f32(0x5f3759dfu - (zoff_f32_bits(y) >> 1));
    for (int i = 0; i < 3; i++) g = g * (1.5f - 0.5f * y * g * g);
    return y * g;
}

/* (cos, sin) of 2 pi t / 2^24 for t < 2^24: quadrant from the top 2 bits, then
 * Taylor series of x = (pi/2) f, f in [0, 1), to x^13 / x^14 (error < 7e-10). */
static inline void cos_sin_turn(uint32_t t, float *c, float *s) {
    uint32_t q = t >> 22;
    float x = (float)(t & 0x3fffffu) * (1.57079632679489662f / 4194304.0f);
    float x2 = x * x;
    /* sin x = x + x^3 (x^10/13! - x^8/11! + ... - 1/3!), cos x = 1 - x^2 (x^12/14! - x^10/12! + ... + 1/2!) */
    static const float sin_c[] = {1.0f / 6227020800.0f, -1.0f / 39916800.0f, 1.0f / 362880.0f,
                                  -1.0f / 5040.0f,      1.0f / 120.0f,       -1.0f / 6.0f};
    static const float cos_c[] = {1.0f / 87178291200.0f, -1.0f / 479001600.0f, 1.0f / 3628800.0f, -1.0f / 40320.0f,
                                  1.0f / 720.0f,         -1.0f / 24.0f,        0.5f};
    float sn = x + x * x2 * horner(x2, sin_c, 6);
    float cs = 1.0f - x2 * horner(x2, cos_c, 7);
    /* rotate by q quarter turns: (c, s) -> (-s, c) */
    float c1 = q & 1 ? -sn : cs, s1 = q & 1 ? cs : sn;
    *c = q & 2 ? -c1 : c1;
    *s = q & 2 ? -s1 : s1;
}

/* NB consecutive Philox blocks j0.. of (key, stream) -> 4 NB normals times std,
 * written as loops over the blocks so that the compiler runs them in SIMD lanes
 * (integer ops and IEEE +, -, *, /, sqrt: the same bits in any lane). */
#define NB 16
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
/* an AVX2 clone chosen at load time: the same operations (no FMA contraction:
 * "avx2" does not enable FMA), so the same bits, in twice the lanes. Not under
 * ThreadSanitizer: its instrumented ifunc resolver runs before the runtime is
 * up and crashes the program at load. */
__attribute__((target_clones("avx2", "default")))
#endif
static void normal_blocks(uint64_t j0, uint32_t stream, uint32_t k0, uint32_t k1, float std, float *z) {
    uint32_t c0[NB], c1[NB], c2[NB], c3[NB];
    for (int b = 0; b < NB; b++) {
        c0[b] = (uint32_t)(j0 + (uint64_t)b);
        c1[b] = (uint32_t)((j0 + (uint64_t)b) >> 32);
        c2[b] = stream;
        c3[b] = 0;
    }
    philox_rounds(NB, c0, c1, c2, c3, k0, k1);
    float zc[2][NB], zs[2][NB];
    for (int p = 0; p < 2; p++) {
        const uint32_t *xr = p ? c2 : c0, *xt = p ? c3 : c1;
        for (int b = 0; b < NB; b++) {
            float u1 = ((float)(xr[b] >> 9) + 0.5f) * (1.0f / 8388608.0f); /* exact: 24 significant bits */
            float r = sqrt_pos(-2.0f * ln_unit(u1)) * std;
            float c, sn;
            cos_sin_turn(xt[b] >> 8, &c, &sn);
            zc[p][b] = r * c;
            zs[p][b] = r * sn;
        }
    }
    for (int b = 0; b < NB; b++) {
        z[4 * b] = zc[0][b];
        z[4 * b + 1] = zs[0][b];
        z[4 * b + 2] = zc[1][b];
        z[4 * b + 3] = zs[1][b];
    }
}

void zoff_rng_normal(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float std, float *dst) {
    if (n <= 0) return;
    const uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    const int64_t W = 4 * NB; /* elements per batch of blocks */
    float z[4 * NB];
    int64_t e = first, end = first + n;
    while (e < end) {
        int64_t base = e - e % W, lo = e - base, hi = end - base < W ? end - base : W;
        if (lo == 0 && hi == W) {
            normal_blocks((uint64_t)base / 4, stream, k0, k1, std, dst + (e - first));
        } else { /* a partial batch at either end */
            normal_blocks((uint64_t)base / 4, stream, k0, k1, std, z);
            memcpy(dst + (e - first), z + lo, (size_t)(hi - lo) * sizeof(float));
        }
        e = base + hi;
    }
}
