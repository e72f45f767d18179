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
 *   zv_st_bf16_sr(uint16_t *, zv, zi r16)   stochastic: truncate(bits + r16); NaN: quieted, truncated
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

/* The update of one vector, in registers: p, m, v in/out (m, v as the kind uses them). */
ZO_AI void ZO_FN(zo_math)(const int kind, const int decay_mode, const ZO_FN(zo_hv) *h, zv *pp, zv gr, zv *mp,
                          zv *vp) {
    zv pv = *pp;
    if (kind == ZO_KIND_ADAM) {
        zv mv = *mp, vv = *vp;
        zv gv = zv_mul(gr, h->gscale);
        if (decay_mode == ZO_DECAY_L2) gv = zv_fma(pv, h->decay, gv);
        mv = zv_fma(gv, h->omb1, zv_mul(mv, h->b1));
        vv = zv_fma(zv_mul(gv, gv), h->omb2, zv_mul(vv, h->b2));
        zv denom = zv_fma(zv_sqrt(vv), h->bc2inv, h->eps);
        zv u = zv_div(mv, denom);
        if (decay_mode == ZO_DECAY_DECOUPLED) pv = zv_fma(pv, h->decay, pv);
        pv = zv_fma(u, h->step, pv);
        *mp = mv;
        *vp = vv;
    } else if (kind == ZO_KIND_ADAGRAD) {
        zv vv = *vp;
        zv gv = zv_mul(gr, h->gscale);
        if (decay_mode != ZO_DECAY_NONE) gv = zv_fma(pv, h->decay, gv); /* L2: in the sum and the update */
        vv = zv_fma(gv, gv, vv);
        zv u = zv_div(gv, zv_add(zv_sqrt(vv), h->eps));
        pv = zv_fma(u, h->step, pv);
        *vp = vv;
    } else if (kind == ZO_KIND_LION) {
        zv mv = *mp;
        zv gv = zv_mul(gr, h->gscale);
        zv c = zv_fma(gv, h->omb1, zv_mul(mv, h->b1));
        zv t = zv_add(zv_negcopysign(h->lr, c), zv_sub(c, c));
        pv = decay_mode != ZO_DECAY_NONE ? zv_fma(pv, h->decay, t) : zv_add(pv, t);
        *mp = zv_fma(gv, h->omb2, zv_mul(mv, h->b2));
    } else { /* ZO_KIND_PROBE: trivial math (gscale = 0, b1 = 1: values unchanged) */
        pv = zv_fma(gr, h->gscale, pv);
        *mp = zv_mul(*mp, h->b1);
        *vp = zv_mul(*vp, h->b1);
    }
    *pp = pv;
}

/* One vector of ZW elements at offset i of the given bases; idx = global index of element i.
 * decay_mode, sround and seed are the kargs fields, passed as values so that
 * the compiler keeps them in registers (stores to the arrays could alias *a). */
ZO_AI void ZO_FN(zo_vec)(const int kind, const int gd, const int sd, const int pd, const int decay_mode,
                         const int sround, const uint32_t seed, const ZO_FN(zo_hv) *h, float *p, void *m, void *v,
                         const void *g, void *p16, int64_t i, uint32_t idx) {
    const int usem = kind == ZO_KIND_PROBE ? m != NULL : kind != ZO_KIND_ADAGRAD;
    const int usev = kind == ZO_KIND_PROBE ? v != NULL : kind != ZO_KIND_LION;
    zv pv = zv_ld_f32(p + i);
    zv gr = ZO_FN(zo_ld)(g, i, gd);
    zv mv = usem ? ZO_FN(zo_ld)(m, i, sd) : zv_set1(0.0f);
    zv vv = usev ? ZO_FN(zo_ld)(v, i, sd) : zv_set1(0.0f);
    const int sr = (sd == ZO_BF16) && sround && kind != ZO_KIND_PROBE;
    zi r = sr ? zi_rand(seed, idx) : zi_zero();
    ZO_FN(zo_math)(kind, decay_mode, h, &pv, gr, &mv, &vv);
    zv_st_f32(p + i, pv);
    if (usem) ZO_FN(zo_st_state)(m, i, mv, sd, sr, zi_lo16(r));
    if (usev) ZO_FN(zo_st_state)(v, i, vv, sd, sr, zi_hi16(r));
    if (pd != ZO_NONE) ZO_FN(zo_st16)(p16, i, pv, pd);
}

#ifdef ZO_EO
/* Two vectors (2 ZW elements) when every array but the weights is bf16: each
 * 16-bit array is read and written as whole vectors split into even and odd
 * elements with shifts (no widening or narrowing shuffles); the fp32 weights
 * are permuted into the same order. Elementwise math does not care about the
 * order, so the results are the per-vector path's bit for bit (bf16 rounding
 * done in integer ops, as on the paths without AVX512_BF16). The path defines:
 *   zv_ld_f32_eo(const float *, zv *e, zv *o), zv_st_f32_eo(float *, zv e, zv o)
 *   zv_ld_bf16_eo(const uint16_t *, zv *e, zv *o)
 *   zi zo_bits_rne(zv), zi zo_bits_sr(zv, zi r16): the rounded bf16 in the high half
 *   zi zo_bits_rne_num(zv), zi zo_bits_sr_num(zv, zi r16): the same for lanes that
 *     are not NaN (no NaN quieting)
 *   int zo_any_nan6(zv a, zv b, zv c, zv d, zv e, zv f): some lane of some argument is NaN
 *   zo_st_bits_eo(uint16_t *, zi e, zi o)
 *   zi zi_rand_eo(seed, idx): zi_rand's values for the even elements idx, idx + 2, ...
 *   zi zi_addc(zi, uint32_t c): + c in every lane (mod 2^32)
 * NaN quieting (a compare and a blend or two logic ops per vector and array)
 * is most of the integer work of the rounding, and NaN never occurs in a
 * healthy run: one test of all the outputs per step picks the version without
 * it, the same bits wherever no lane is NaN. */
/* The 16-bit stores of one even/odd step; nan: some lane may be NaN (quiet it). */
ZO_AI void ZO_FN(zo_st_eo)(const int usem, const int usev, const int pd, const int sround, const int nan, void *m,
                           void *v, void *p16, int64_t i, zv me, zv mo, zv ve, zv vo, zv pe, zv po, zi re, zi ro) {
#define ZO_SR(x, r) (nan ? zo_bits_sr((x), (r)) : zo_bits_sr_num((x), (r)))
#define ZO_RNE(x) (nan ? zo_bits_rne(x) : zo_bits_rne_num(x))
    if (usem) {
        if (sround) zo_st_bits_eo((uint16_t *)m + i, ZO_SR(me, zi_lo16(re)), ZO_SR(mo, zi_lo16(ro)));
        else zo_st_bits_eo((uint16_t *)m + i, ZO_RNE(me), ZO_RNE(mo));
    }
    if (usev) {
        if (sround) zo_st_bits_eo((uint16_t *)v + i, ZO_SR(ve, zi_hi16(re)), ZO_SR(vo, zi_hi16(ro)));
        else zo_st_bits_eo((uint16_t *)v + i, ZO_RNE(ve), ZO_RNE(vo));
    }
    if (pd == ZO_BF16) zo_st_bits_eo((uint16_t *)p16 + i, ZO_RNE(pe), ZO_RNE(po));
#undef ZO_SR
#undef ZO_RNE
}

/* One even/odd step at offset i; re: the random bits of its even elements (zi_rand_eo). */
ZO_AI void ZO_FN(zo_vec_eo)(const int kind, const int pd, const int decay_mode, const int sround,
                            const ZO_FN(zo_hv) *h, float *p, void *m, void *v, const void *g, void *p16, int64_t i,
                            zi re) {
    const int usem = kind != ZO_KIND_ADAGRAD, usev = kind != ZO_KIND_LION;
    zv pe, po, ge, go, me, mo, ve, vo;
    zv_ld_f32_eo(p + i, &pe, &po);
    zv_ld_bf16_eo((const uint16_t *)g + i, &ge, &go);
    if (usem) zv_ld_bf16_eo((const uint16_t *)m + i, &me, &mo);
    else me = mo = zv_set1(0.0f);
    if (usev) zv_ld_bf16_eo((const uint16_t *)v + i, &ve, &vo);
    else ve = vo = zv_set1(0.0f);
    const zi ro = zi_addc(re, ZO_WEYL);
    ZO_FN(zo_math)(kind, decay_mode, h, &pe, ge, &me, &ve);
    ZO_FN(zo_math)(kind, decay_mode, h, &po, go, &mo, &vo);
    zv_st_f32_eo(p + i, pe, po);
    /* unused m / v are 0 (never NaN); p is tested even without params16 */
    if (__builtin_expect(!zo_any_nan6(me, mo, ve, vo, pe, po), 1))
        ZO_FN(zo_st_eo)(usem, usev, pd, sround, 0, m, v, p16, i, me, mo, ve, vo, pe, po, re, ro);
    else
        ZO_FN(zo_st_eo)(usem, usev, pd, sround, 1, m, v, p16, i, me, mo, ve, vo, pe, po, re, ro);
}
#endif

#if ZW > 1
/* Software prefetch ZO_PF_DIST elements ahead in every stream: measured to
 * raise both the STREAM-style bound and the update on the 2-core benchmark
 * machine (the hardware prefetchers alone leave bandwidth unused at 2 threads). */
#ifndef ZO_PF_DIST
#define ZO_PF_DIST 1024
#endif
ZO_AI void ZO_FN(zo_prefetch)(const int gd, const int sd, const int pd, const float *p, const void *m, const void *v,
                              const void *g, const void *p16, int64_t i) {
    const int64_t j = i + ZO_PF_DIST;
    const size_t ss = sd == ZO_F32 ? 4 : 2, gs = gd == ZO_F32 ? 4 : 2;
    __builtin_prefetch(p + j, 1, 3);
    if (m) __builtin_prefetch((const char *)m + (size_t)j * ss, 1, 3);
    if (v) __builtin_prefetch((const char *)v + (size_t)j * ss, 1, 3);
    __builtin_prefetch((const char *)g + (size_t)j * gs, 0, 3);
    if (pd != ZO_NONE) __builtin_prefetch((const char *)p16 + (size_t)j * 2, 1, 3);
}
#endif

#ifdef ZO_EO
/* The even/odd steps over [lo, hi) while 2 ZW elements remain; returns where they stopped. */
ZO_AI int64_t ZO_FN(zo_loop_eo)(const int kind, const int pd, const int decay_mode, const int sround,
                                const uint32_t seed, const ZO_FN(zo_hv) *h, float *p, void *m, void *v, const void *g,
                                void *p16, uint32_t idx0, int64_t lo, int64_t hi) {
    /* U steps per iteration: 64 bytes of each 16-bit array, two lines of fp32 weights, one
     * prefetch per line */
    enum { U = 2 * ZW * 2 >= 64 ? 1 : 64 / (2 * ZW * 2), E = U * 2 * ZW };
    const int usem = kind != ZO_KIND_ADAGRAD, usev = kind != ZO_KIND_LION;
    int64_t i = lo;
    /* the random bits advance by one vector add per step instead of being recomputed */
    zi re = sround ? zi_rand_eo(seed, idx0 + (uint32_t)lo) : zi_zero();
    for (; i + E <= hi; i += E) {
        const int64_t j = i + ZO_PF_DIST;
        __builtin_prefetch(p + j, 1, 3);
        __builtin_prefetch(p + j + 16, 1, 3);
        if (usem) __builtin_prefetch((const uint16_t *)m + j, 1, 3);
        if (usev) __builtin_prefetch((const uint16_t *)v + j, 1, 3);
        __builtin_prefetch((const uint16_t *)g + j, 0, 3);
        if (pd != ZO_NONE) __builtin_prefetch((const uint16_t *)p16 + j, 1, 3);
        for (int u = 0; u < U; u++) {
            ZO_FN(zo_vec_eo)(kind, pd, decay_mode, sround, h, p, m, v, g, p16, i + u * 2 * ZW, re);
            re = zi_addc(re, 2 * ZW * ZO_WEYL);
        }
    }
    for (; i + 2 * ZW <= hi; i += 2 * ZW) {
        ZO_FN(zo_vec_eo)(kind, pd, decay_mode, sround, h, p, m, v, g, p16, i, re);
        re = zi_addc(re, 2 * ZW * ZO_WEYL);
    }
    return i;
}
#endif

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
#ifdef ZO_EO
    if (kind != ZO_KIND_PROBE && gd == ZO_BF16 && sd == ZO_BF16 && (pd == ZO_BF16 || pd == ZO_NONE)) {
        /* one loop per (decay_mode, sround), so that neither is tested inside it */
        i = ZO_FN(zo_loop_eo)(kind, pd, decay_mode, sround, seed, &h, p, m, v, g, p16, idx0, lo, hi);
    }
#endif
    for (; i + ZW <= hi; i += ZW) {
#if ZW > 1
        if (((i - lo) & 15) == 0) ZO_FN(zo_prefetch)(gd, sd, pd, p, m, v, g, p16, i); /* one per 64 B of fp32 */
#endif
        ZO_FN(zo_vec)(kind, gd, sd, pd, decay_mode, sround, seed, &h, p, m, v, g, p16, i, idx0 + (uint32_t)i);
    }
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
