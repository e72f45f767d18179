/* The optimizer kernels, written once over a small vector vocabulary and
 * included by each SIMD path file (cpu_adam_{scalar,avx2,avx512,neon}.c).
 * Every path runs literally the same sequence of fp32 operations per element
 * (explicit fused multiply-adds, IEEE sqrt and division), which is why the
 * paths agree bit for bit.
 *
 * The including file defines, before including this header:
 *   ZO_FN(name)            name with the path's suffix (e.g. name##_avx2)
 *   zv, zi, ZW             float vector, 32-bit integer vector, lanes
 *   zv_set1(f)             broadcast
 *   zv_ld_f32(const float *), zv_ld_bf16(const uint16_t *), zv_ld_f16(const uint16_t *)
 *   zv_st_f32(float *, zv)
 *   zv_st_bf16(uint16_t *, zv), zv_st_f16(uint16_t *, zv)   round to nearest even
 *   zv_st_bf16_sr(uint16_t *, zv, zi r16)   stochastic: truncate(bits + r16), NaN quieted
 *   zv_st16_bf16 / zv_st16_f16 (uint16_t *, zv)  stores of params16 (may differ: NT)
 *   zv_add, zv_sub, zv_mul, zv_div, zv_sqrt, zv_fma(a, b, c) = a*b+c rounded once
 *   zv_negcopysign(mag, x) = -copysign(mag, x)
 *   zi_rand(uint32_t seed, uint32_t idx) = (idx + lane) * ZO_WEYL + seed per lane (mod 2^32)
 *   zi_lo16(zi), zi_hi16(zi)   r & 0xffff, r >> 16
 *   zi_zero()
 * All loads/stores are unaligned. */

#include <string.h>

#include "optim/cpu_optim_internal.h"

#define ZO_AI static inline __attribute__((always_inline))

typedef struct {
    zv gscale, b1, omb1, b2, omb2, eps, bc2inv, step, decay, lr;
} ZO_FN(zo_hv);

ZO_AI zv ZO_FN(zo_ld)(const void *base, int64_t i, const int dt) {
    if (dt == ZO_F32) return zv_ld_f32((const float *)base + i);
    if (dt == ZO_BF16) return zv_ld_bf16((const uint16_t *)base + i);
    return zv_ld_f16((const uint16_t *)base + i);
}

ZO_AI void ZO_FN(zo_st_state)(void *base, int64_t i, zv x, const int dt, int sround, zi r16) {
    if (dt == ZO_F32) zv_st_f32((float *)base + i, x);
    else if (sround) zv_st_bf16_sr((uint16_t *)base + i, x, r16);
    else zv_st_bf16((uint16_t *)base + i, x);
}

ZO_AI void ZO_FN(zo_st16)(void *base, int64_t i, zv x, const int dt) {
    if (dt == ZO_BF16) zv_st16_bf16((uint16_t *)base + i, x);
    else if (dt == ZO_F16) zv_st16_f16((uint16_t *)base + i, x);
}

/* One vector of ZW elements at offset i of the given bases; idx = global index of element i. */
/* decay_mode, sround and seed are the kargs fields, passed as values so that
 * the compiler keeps them in registers (stores to the arrays could alias *a). */
ZO_AI void ZO_FN(zo_vec)(const int kind, const int gd, const int sd, const int pd, const int decay_mode,
                         const int sround, const uint32_t seed, const ZO_FN(zo_hv) *h, float *p, void *m, void *v,
                         const void *g, void *p16, int64_t i, uint32_t idx) {
    zv pv = zv_ld_f32(p + i);
    zv gr = ZO_FN(zo_ld)(g, i, gd);
    const int sr = (sd == ZO_BF16) && sround && kind != ZO_KIND_PROBE;
    zi r = sr ? zi_rand(seed, idx) : zi_zero();
    if (kind == ZO_KIND_ADAM) {
        zv mv = ZO_FN(zo_ld)(m, i, sd);
        zv vv = ZO_FN(zo_ld)(v, i, sd);
        zv gv = zv_mul(gr, h->gscale);
        if (decay_mode == ZO_DECAY_L2) gv = zv_fma(pv, h->decay, gv);
        mv = zv_fma(gv, h->omb1, zv_mul(mv, h->b1));
        vv = zv_fma(zv_mul(gv, gv), h->omb2, zv_mul(vv, h->b2));
        zv denom = zv_fma(zv_sqrt(vv), h->bc2inv, h->eps);
        zv u = zv_div(mv, denom);
        if (decay_mode == ZO_DECAY_DECOUPLED) pv = zv_fma(pv, h->decay, pv);
        pv = zv_fma(u, h->step, pv);
        zv_st_f32(p + i, pv);
        ZO_FN(zo_st_state)(m, i, mv, sd, sr, zi_lo16(r));
        ZO_FN(zo_st_state)(v, i, vv, sd, sr, zi_hi16(r));
    } else if (kind == ZO_KIND_ADAGRAD) {
        zv vv = ZO_FN(zo_ld)(v, i, sd);
        zv gv = zv_mul(gr, h->gscale);
        zv gd2 = decay_mode != ZO_DECAY_NONE ? zv_fma(pv, h->decay, gv) : gv;
        vv = zv_fma(gd2, gd2, vv);
        zv u = zv_div(gv, zv_add(zv_sqrt(vv), h->eps));
        pv = zv_fma(u, h->step, pv);
        zv_st_f32(p + i, pv);
        ZO_FN(zo_st_state)(v, i, vv, sd, sr, zi_hi16(r));
    } else if (kind == ZO_KIND_LION) {
        zv mv = ZO_FN(zo_ld)(m, i, sd);
        zv gv = zv_mul(gr, h->gscale);
        zv c = zv_fma(gv, h->omb1, zv_mul(mv, h->b1));
        zv t = zv_add(zv_negcopysign(h->lr, c), zv_sub(c, c));
        pv = decay_mode != ZO_DECAY_NONE ? zv_fma(pv, h->decay, t) : zv_add(pv, t);
        mv = zv_fma(gv, h->omb2, zv_mul(mv, h->b2));
        zv_st_f32(p + i, pv);
        ZO_FN(zo_st_state)(m, i, mv, sd, sr, zi_lo16(r));
    } else { /* ZO_KIND_PROBE: same loads and stores, trivial math, values unchanged */
        pv = zv_fma(gr, h->gscale, pv);
        zv_st_f32(p + i, pv);
        if (m) ZO_FN(zo_st_state)(m, i, zv_mul(ZO_FN(zo_ld)(m, i, sd), h->b1), sd, 0, r);
        if (v) ZO_FN(zo_st_state)(v, i, zv_mul(ZO_FN(zo_ld)(v, i, sd), h->b1), sd, 0, r);
    }
    if (pd != ZO_NONE) ZO_FN(zo_st16)(p16, i, pv, pd);
}

ZO_AI void ZO_FN(zo_range)(const int kind, const int gd, const int sd, const int pd, const zoff_optim_kargs *a,
                           int64_t lo, int64_t hi) {
    ZO_FN(zo_hv) h;
    h.gscale = zv_set1(a->gscale);
    h.b1 = zv_set1(a->b1);
    h.omb1 = zv_set1(a->omb1);
    h.b2 = zv_set1(a->b2);
    h.omb2 = zv_set1(a->omb2);
    h.eps = zv_set1(a->eps);
    h.bc2inv = zv_set1(a->bc2inv);
    h.step = zv_set1(a->step);
    h.decay = zv_set1(a->decay);
    h.lr = zv_set1(a->lr);
    float *p = a->p;
    void *m = a->m, *v = a->v, *p16 = a->p16;
    const void *g = a->g;
    const int decay_mode = a->decay_mode, sround = a->sround;
    const uint32_t seed = a->seed, idx0 = a->idx0;
    int64_t i = lo;
    for (; i + ZW <= hi; i += ZW)
        ZO_FN(zo_vec)(kind, gd, sd, pd, decay_mode, sround, seed, &h, p, m, v, g, p16, i, idx0 + (uint32_t)i);
#if ZW > 1
    if (i < hi) { /* tail: the same vector code on copies, so tails match full vectors bit for bit */
        const size_t r = (size_t)(hi - i);
        const size_t ss = sd == ZO_F32 ? 4 : 2, gs = gd == ZO_F32 ? 4 : 2;
        struct {
            float p[ZW];
            uint32_t m[ZW], v[ZW], g[ZW];
            uint16_t p16[ZW];
        } tb;
        memset(&tb, 0, sizeof tb);
        memcpy(tb.p, p + i, r * 4);
        if (m) memcpy(tb.m, (const char *)m + (size_t)i * ss, r * ss);
        if (v) memcpy(tb.v, (const char *)v + (size_t)i * ss, r * ss);
        memcpy(tb.g, (const char *)g + (size_t)i * gs, r * gs);
        ZO_FN(zo_vec)(kind, gd, sd, pd, decay_mode, sround, seed, &h, tb.p, m ? (void *)tb.m : NULL,
                      v ? (void *)tb.v : NULL, tb.g, tb.p16, 0, idx0 + (uint32_t)i);
        memcpy(p + i, tb.p, r * 4);
        if (m) memcpy((char *)m + (size_t)i * ss, tb.m, r * ss);
        if (v) memcpy((char *)v + (size_t)i * ss, tb.v, r * ss);
        if (pd != ZO_NONE) memcpy((char *)p16 + (size_t)i * 2, tb.p16, r * 2);
    }
#endif
}

/* Instantiate every (kind, grad dtype, state dtype, params16 dtype). */
#define ZO_I(K, G, S, P)                                                                                 \
    static void ZO_FN(zo_k_##K##_##G##_##S##_##P)(const zoff_optim_kargs *a, int64_t lo, int64_t hi) { \
        ZO_FN(zo_range)(K, G, S, P, a, lo, hi);                                                          \
    }
#define ZO_IP(K, G, S) ZO_I(K, G, S, 1) ZO_I(K, G, S, 2) ZO_I(K, G, S, 3)
#define ZO_IS(K, G) ZO_IP(K, G, 0) ZO_IP(K, G, 1)
#define ZO_IG(K) ZO_IS(K, 0) ZO_IS(K, 1) ZO_IS(K, 2)
ZO_IG(0)
ZO_IG(1)
ZO_IG(2)
ZO_IG(3)

#define ZO_T(K, G, S, P) [K][G][S][P] = ZO_FN(zo_k_##K##_##G##_##S##_##P),
#define ZO_TP(K, G, S) ZO_T(K, G, S, 1) ZO_T(K, G, S, 2) ZO_T(K, G, S, 3)
#define ZO_TS(K, G) ZO_TP(K, G, 0) ZO_TP(K, G, 1)
#define ZO_TG(K) ZO_TS(K, 0) ZO_TS(K, 1) ZO_TS(K, 2)
static const zoff_optim_range_fn ZO_FN(zo_table)[ZO_KIND_COUNT][3][2][4] = {ZO_TG(0) ZO_TG(1) ZO_TG(2) ZO_TG(3)};

zoff_optim_range_fn ZO_FN(zoff_optim_select)(int kind, int gd, int sd, int pd) {
    if (kind < 0 || kind >= ZO_KIND_COUNT || gd < 0 || gd > 2 || sd < 0 || sd > 1 || pd < 1 || pd > 3) return NULL;
    return ZO_FN(zo_table)[kind][gd][sd][pd];
}

#undef ZO_I
#undef ZO_IP
#undef ZO_IS
#undef ZO_IG
#undef ZO_T
#undef ZO_TP
#undef ZO_TS
#undef ZO_TG
#undef ZO_AI
