/* Host optimizers (src/optim/cpu_adam*.c): every SIMD path against a
 * double-precision reference with forward error bounds, bit-identity across
 * paths and thread counts, special values, the beta-power bookkeeping, the
 * config wiring, PyTorch Adam/AdamW/Adagrad trajectories (tests/fixtures/adam_torch.bin)
 * and the effect of bf16 optimizer state.
 *
 * Error bounds (u = 2^-24, fp32's unit roundoff): each output y is compared with
 * the reference y_ref computed in double from the same inputs, and must satisfy
 * |y - y_ref| <= 8 u S + 2^-140, where S is the sum of the magnitudes of the
 * terms that make y (so cancellation is accounted for); errors of m and v are
 * propagated into the weight update. bf16 state adds half a bf16 ulp (nearest
 * even) or one bf16 ulp (stochastic). params16 must equal the fp32 weights
 * rounded to nearest even, exactly. The largest observed errors, in units of u S,
 * are printed at the end of test_reference. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "zoff/core.h"
#include "zoff/optim.h"

#include "test_util.h"
#define OK(expr) assert_ok(expr)

static const double U32 = 5.9604644775390625e-08; /* 2^-24 */
static const double TINY = 7.2e-43;               /* ~2^-140: a few fp32 subnormal units */

/* ------------------------------------------------------------------ random numbers */

static uint64_t g_rng = 0x1234567887654321ull;
static uint64_t rnd_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0); }
static double rnd_normal(void) {
    double a = rnd_unit(), b = rnd_unit();
    if (a < 1e-300) a = 1e-300;
    return sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b);
}

/* ------------------------------------------------------------------ dtype helpers */

static size_t dsize(zoff_dtype dt) { return dt == ZOFF_F32 ? 4 : 2; }

static float ld(const void *base, int64_t i, zoff_dtype dt) {
    if (dt == ZOFF_F32) return ((const float *)base)[i];
    if (dt == ZOFF_BF16) return zoff_bf16_to_f32(((const uint16_t *)base)[i]);
    return zoff_f16_to_f32(((const uint16_t *)base)[i]);
}

static void st(void *base, int64_t i, zoff_dtype dt, float x) {
    if (dt == ZOFF_F32) ((float *)base)[i] = x;
    else if (dt == ZOFF_BF16) ((uint16_t *)base)[i] = zoff_f32_to_bf16(x);
    else ((uint16_t *)base)[i] = zoff_f32_to_f16(x);
}

/* spacing of dt numbers at |x| */
static double ulp_of(double x, zoff_dtype dt) {
    int mant = dt == ZOFF_BF16 ? 7 : dt == ZOFF_F16 ? 10 : 23;
    int emin = dt == ZOFF_F16 ? -14 : -126;
    x = fabs(x);
    int e = x > 0 ? (int)floor(log2(x)) : emin;
    if (e < emin) e = emin;
    return ldexp(1.0, e - mant);
}

/* ------------------------------------------------------------------ test buffers */

typedef struct tbuf {
    int64_t n;
    zoff_dtype gd, sd, pd; /* pd == ZOFF_I32 means no params16 */
    float *p;
    void *m, *v, *g, *p16;
    void *raw[5];
} tbuf;

#define NO_P16 ZOFF_I32

static void *alloc_off(size_t bytes, int off, size_t esize, void **raw) {
    /* exact-size allocation (ASan sees overruns); `off` elements of misalignment */
    *raw = malloc(bytes + (size_t)off * esize + 1);
    assert_non_null(*raw);
    return (char *)*raw + (size_t)off * esize;
}

static void tb_alloc(tbuf *b, int64_t n, zoff_dtype gd, zoff_dtype sd, zoff_dtype pd, int off) {
    memset(b, 0, sizeof *b);
    b->n = n;
    b->gd = gd;
    b->sd = sd;
    b->pd = pd;
    if (n == 0) return;
    b->p = alloc_off((size_t)n * 4, off, 4, &b->raw[0]);
    b->m = alloc_off((size_t)n * dsize(sd), off, dsize(sd), &b->raw[1]);
    b->v = alloc_off((size_t)n * dsize(sd), off, dsize(sd), &b->raw[2]);
    b->g = alloc_off((size_t)n * dsize(gd), off, dsize(gd), &b->raw[3]);
    if (pd != NO_P16) {
        b->p16 = alloc_off((size_t)n * 2, off, 2, &b->raw[4]);
        memset(b->p16, 0xA5, (size_t)n * 2);
    }
}

static void tb_free(tbuf *b) {
    for (int i = 0; i < 5; i++) free(b->raw[i]);
    memset(b, 0, sizeof *b);
}

static void tb_copy(tbuf *dst, const tbuf *src, int off) {
    tb_alloc(dst, src->n, src->gd, src->sd, src->pd, off);
    if (src->n == 0) return;
    memcpy(dst->p, src->p, (size_t)src->n * 4);
    memcpy(dst->m, src->m, (size_t)src->n * dsize(src->sd));
    memcpy(dst->v, src->v, (size_t)src->n * dsize(src->sd));
    memcpy(dst->g, src->g, (size_t)src->n * dsize(src->gd));
    if (src->p16) memcpy(dst->p16, src->p16, (size_t)src->n * 2);
}

enum { R_NORMAL = 0, R_LARGE, R_SMALL, R_MIXED, R_COUNT };
static const char *regime_name[] = {"normal", "large", "small", "mixed"};

/* Fill with random values of the regime; returns the grad_scale to use so that
 * the effective gradient has the regime's magnitude whatever the grad dtype. */
static double tb_fill(tbuf *b, int regime) {
    double ps = 0.5, ms = 1e-2, vs = 1e-2, gs = 0.1, graw = 0.1;
    switch (regime) {
    case R_LARGE: ps = 1e17, ms = 1e15, vs = 1e15, gs = 1e15; break;
    case R_SMALL: ps = 1e-30, ms = 1e-20, vs = 1e-20, gs = 1e-20; break;
    default: break;
    }
    if (b->gd == ZOFF_F16) graw = 1.0; /* keep fp16 gradients in range; grad_scale carries the magnitude */
    else graw = gs;
    double gscale = gs / graw;
    for (int64_t i = 0; i < b->n; i++) {
        double p = rnd_normal() * ps, m = rnd_normal() * ms, v = rnd_normal() * vs, g = rnd_normal() * graw;
        if (regime == R_MIXED) {
            double e = -30.0 + 45.0 * rnd_unit();
            p = rnd_normal() * pow(10.0, e);
            m = rnd_normal() * pow(10.0, -30.0 + 45.0 * rnd_unit());
            v = rnd_normal() * pow(10.0, -15.0 + 30.0 * rnd_unit());
            g = rnd_normal() * (b->gd == ZOFF_F16 ? pow(10.0, -4.0 + 8.0 * rnd_unit())
                                                  : pow(10.0, -20.0 + 35.0 * rnd_unit()));
        }
        b->p[i] = (float)p;
        st(b->m, i, b->sd, (float)m);
        st(b->v, i, b->sd, (float)(v * v));
        st(b->g, i, b->gd, (float)g);
    }
    return gscale;
}

/* ------------------------------------------------------------------ running the optimizer */

typedef struct ocase {
    const char *name;
    zoff_optimizer_type type;
    bool adam_w_mode, bias_correction;
    double beta1, beta2, eps, wd;
} ocase;

static const ocase g_ocases[] = {
    {"adam-l2", ZOFF_OPTIM_ADAM, false, true, 0.9, 0.999, 1e-8, 0.01},
    {"adam-w-mode", ZOFF_OPTIM_ADAM, true, true, 0.9, 0.999, 1e-8, 0.01},
    {"adamw", ZOFF_OPTIM_ADAMW, false, true, 0.8, 0.95, 1e-6, 0.1},
    {"adamw-nobc", ZOFF_OPTIM_ADAMW, true, false, 0.9, 0.999, 1e-8, 0.0},
    {"adagrad", ZOFF_OPTIM_ADAGRAD, false, true, 0.0, 0.0, 1e-10, 0.0},
    {"adagrad-wd", ZOFF_OPTIM_ADAGRAD, false, true, 0.0, 0.0, 1e-8, 0.05},
    {"lion", ZOFF_OPTIM_LION, false, true, 0.9, 0.99, 0.0, 0.0},
    {"lion-wd", ZOFF_OPTIM_LION, false, true, 0.95, 0.98, 0.0, 0.1},
};
#define NOCASES ((int)(sizeof g_ocases / sizeof g_ocases[0]))

static zoff_optimizer_config make_cfg(const ocase *oc) {
    zoff_optimizer_config c = {0};
    c.type = oc->type;
    c.lr = 1e-3;
    c.beta1 = oc->beta1;
    c.beta2 = oc->beta2;
    c.eps = oc->eps;
    c.weight_decay = oc->wd;
    c.adam_w_mode = oc->adam_w_mode;
    c.bias_correction = oc->bias_correction;
    return c;
}

static zoff_optim_tensors tensors_of(const tbuf *b, zoff_optimizer_type type) {
    zoff_optim_tensors t = {0};
    t.params = b->p;
    t.exp_avg = type == ZOFF_OPTIM_ADAGRAD ? NULL : b->m;
    t.exp_avg_sq = type == ZOFF_OPTIM_LION ? NULL : b->v;
    t.state_dt = b->sd;
    t.grads = b->g;
    t.grad_dt = b->gd;
    t.params16 = b->p16;
    t.p16_dt = b->pd == NO_P16 ? ZOFF_BF16 : b->pd;
    t.n = b->n;
    t.index_base = 1000;
    return t;
}

static zoff_host_optimizer *make_opt(const ocase *oc, zoff_simd_path path, int threads, zoff_state_rounding sr,
                                     int64_t serial_below) {
    zoff_optimizer_config c = make_cfg(oc);
    zoff_host_optimizer_options o = {.threads = threads, .path = path, .bf16_state_rounding = sr,
                                     .serial_below = serial_below, .seed = 7};
    zoff_host_optimizer *opt = NULL;
    OK(zoff_host_optimizer_create_ex(&c, &o, &opt));
    assert_int_equal(zoff_host_optimizer_simd(opt), path);
    return opt;
}

/* One step (the step number makes the beta powers non-trivial). */
static const int64_t STEP = 5;
static const double LR = 1e-3;

static void run_step(zoff_host_optimizer *opt, tbuf *b, zoff_optimizer_type type, double wd, double gscale) {
    OK(zoff_host_optimizer_begin_step(opt, STEP, LR));
    zoff_optim_tensors t = tensors_of(b, type);
    OK(zoff_host_optimizer_update(opt, &t, wd, gscale));
}

/* ------------------------------------------------------------------ the reference */

typedef struct errstats {
    double p, m, v; /* max |err| / (u S) observed */
    double pb;      /* max |err| / bound for p (the bound includes propagated m, v errors) */
} errstats;
static errstats g_err;

static void check_state(const char *what, int64_t i, double got, double ref, double bound, double scale,
                        zoff_dtype sd, bool sround, double *maxrel) {
    if (sd == ZOFF_BF16) {
        double q = ulp_of(fmax(fabs(ref), fabs(got)), ZOFF_BF16);
        bound += sround ? q : 0.5 * q;
        if (fabs(ref) < 1.2e-38 + bound && got == 0.0) return; /* hardware bf16 flushes fp32 subnormals */
    }
    double err = fabs(got - ref);
    if (!(err <= bound))
        fail_msg("%s[%lld]: got %.9g, reference %.9g, |err| %.3g > bound %.3g", what, (long long)i, got, ref, err,
                 bound);
    if (sd == ZOFF_F32 && U32 * scale > 1e-30) { /* in units of u S, where S is not subnormal */
        double rel = err / (U32 * scale);
        if (rel > *maxrel) *maxrel = rel;
    }
}

/* Compare out (after one step) with the double reference computed from in. */
static void check_reference(const ocase *oc, const tbuf *in, const tbuf *out, double gscale, bool sround) {
    const double K = 8.0 * U32;
    const double b1 = oc->beta1, b2 = oc->beta2, eps = oc->eps, wd = oc->wd, lr = LR;
    double bc1 = 1, bc2 = 1;
    if (oc->bias_correction && (oc->type == ZOFF_OPTIM_ADAM || oc->type == ZOFF_OPTIM_ADAMW)) {
        bc1 = 1 - pow(b1, (double)STEP);
        bc2 = 1 - pow(b2, (double)STEP);
    }
    const bool decoupled = oc->type == ZOFF_OPTIM_ADAMW || (oc->type == ZOFF_OPTIM_ADAM && oc->adam_w_mode);
    for (int64_t i = 0; i < in->n; i++) {
        double p = in->p[i], m = ld(in->m, i, in->sd), v = ld(in->v, i, in->sd), gr = ld(in->g, i, in->gd);
        double g = gr * gscale, Sg = fabs(g);
        double P = out->p[i];
        double pref, Sp, errp;
        bool signflip = false;
        if (oc->type == ZOFF_OPTIM_ADAM || oc->type == ZOFF_OPTIM_ADAMW) {
            if (!decoupled && wd != 0) {
                g = g + wd * p;
                Sg += fabs(wd * p);
            }
            double m1 = b1 * m + (1 - b1) * g, Sm = fabs(b1 * m) + (1 - b1) * Sg;
            double v1 = b2 * v + (1 - b2) * g * g, Sv = fabs(b2 * v) + (1 - b2) * Sg * Sg;
            double em = K * Sm + TINY, ev = K * Sv + TINY;
            double sq = sqrt(v1), c2 = 1 / sqrt(bc2);
            double denom = sq * c2 + eps;
            double dsq = v1 > 0 ? fmin(ev / (2 * sq), sqrt(ev)) : sqrt(ev);
            double edenom = dsq * c2 + K * denom;
            double u = m1 / denom;
            double eu = em / denom + fabs(u) * edenom / denom + K * fabs(u);
            double p1 = p, Sp1 = fabs(p);
            if (decoupled && wd != 0) {
                p1 = p - lr * wd * p;
                Sp1 = fabs(p) + fabs(lr * wd * p);
            }
            double step = lr / bc1;
            pref = p1 - step * u;
            Sp = Sp1 + fabs(step * u);
            errp = K * Sp + step * eu + TINY;
            check_state("m", i, ld(out->m, i, out->sd), m1, em, Sm, out->sd, sround, &g_err.m);
            check_state("v", i, ld(out->v, i, out->sd), v1, ev, Sv, out->sd, sround, &g_err.v);
        } else if (oc->type == ZOFF_OPTIM_ADAGRAD) {
            double gd = g, Sgd = Sg;
            if (wd != 0) {
                gd = g + wd * p;
                Sgd = Sg + fabs(wd * p);
            }
            double v1 = v + gd * gd, Sv = fabs(v) + Sgd * Sgd;
            double ev = K * Sv + TINY;
            double sq = sqrt(v1), denom = sq + eps;
            double dsq = v1 > 0 ? fmin(ev / (2 * sq), sqrt(ev)) : sqrt(ev);
            double u = gd / denom; /* L2: the decayed gradient in the update too (torch, DeepSpeed) */
            double eu = K * Sgd / denom + fabs(u) * (dsq + K * denom) / denom + K * fabs(u);
            pref = p - lr * u;
            Sp = fabs(p) + fabs(lr * u);
            errp = K * Sp + lr * eu + TINY;
            check_state("v", i, ld(out->v, i, out->sd), v1, ev, Sv, out->sd, sround, &g_err.v);
        } else { /* Lion */
            double c = b1 * m + (1 - b1) * g, Sc = fabs(b1 * m) + (1 - b1) * Sg;
            double t = -copysign(lr, c);
            double p1 = wd != 0 ? p * (1 - lr * wd) : p;
            pref = p1 + t;
            Sp = fabs(p) + lr;
            errp = K * Sp + TINY;
            if (fabs(c) <= K * Sc + TINY) { /* the sign of c is within rounding */
                errp += 2 * lr;
                signflip = true;
            }
            double m1 = b2 * m + (1 - b2) * g, Sm = fabs(b2 * m) + (1 - b2) * Sg;
            check_state("m", i, ld(out->m, i, out->sd), m1, K * Sm + TINY, Sm, out->sd, sround, &g_err.m);
        }
        double err = fabs(P - pref);
        if (!(err <= errp))
            fail_msg("%s: p[%lld]: got %.9g, reference %.9g, |err| %.3g > bound %.3g (p %.9g g %.9g)", oc->name,
                     (long long)i, P, pref, err, errp, p, g);
        if (errp > 0 && !signflip && err / errp > g_err.pb) g_err.pb = err / errp;
        if (U32 * Sp > 1e-30 && err / (U32 * Sp) > g_err.p) g_err.p = err / (U32 * Sp);
        if (out->pd != NO_P16) {
            uint16_t got = ((const uint16_t *)out->p16)[i];
            uint16_t want = out->pd == ZOFF_BF16 ? zoff_f32_to_bf16(out->p[i]) : zoff_f32_to_f16(out->p[i]);
            bool ftz = out->pd == ZOFF_BF16 && fabsf(out->p[i]) < 1.1754944e-38f && (got & 0x7fff) == 0;
            if (got != want && !ftz)
                fail_msg("%s: params16[%lld] = 0x%04x, want 0x%04x (fp32 %.9g)", oc->name, (long long)i, got, want,
                         (double)out->p[i]);
        }
    }
}

/* ------------------------------------------------------------------ paths */

static zoff_simd_path g_paths[8];
static int g_npaths;

static int setup_paths(void **state) {
    (void)state;
    static const zoff_simd_path all[] = {ZOFF_SIMD_SCALAR, ZOFF_SIMD_AVX2, ZOFF_SIMD_AVX512, ZOFF_SIMD_AVX512_BF16,
                                         ZOFF_SIMD_NEON};
    g_npaths = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (zoff_simd_path_available(all[i])) g_paths[g_npaths++] = all[i];
    return 0;
}

static void test_paths(void **state) {
    (void)state;
    assert_true(zoff_simd_path_available(ZOFF_SIMD_SCALAR));
    const zoff_cpu_features *f = zoff_cpu_features_get();
    assert_int_equal(zoff_simd_path_available(ZOFF_SIMD_AVX512_BF16), f->avx512f && f->avx512bw && f->avx512vl &&
                                                                          f->avx512dq && f->avx512_bf16);
    zoff_simd_path best = zoff_simd_path_best();
    print_message("paths available:");
    for (int i = 0; i < g_npaths; i++) print_message(" %s", zoff_simd_path_name(g_paths[i]));
    print_message("; best %s\n", zoff_simd_path_name(best));
#if defined(__x86_64__)
    if (f->avx2 && f->fma && f->f16c) assert_true(g_npaths >= 2);
#endif
    zoff_simd_path p;
    OK(zoff_simd_path_parse("avx2", &p));
    assert_int_equal(p, ZOFF_SIMD_AVX2);
    OK(zoff_simd_path_parse("scalar", &p));
    assert_int_equal(p, ZOFF_SIMD_SCALAR);
    assert_int_equal(zoff_simd_path_parse("sse9", &p), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "sse9"));

    /* $ZOFF_SIMD forces the path of an AUTO optimizer */
    const ocase *oc = &g_ocases[2];
    zoff_optimizer_config c = make_cfg(oc);
    zoff_host_optimizer *opt = NULL;
    for (int i = 0; i < g_npaths; i++) {
        const char *name = g_paths[i] == ZOFF_SIMD_AVX512 ? "avx512-nobf16" : zoff_simd_path_name(g_paths[i]);
        if (g_paths[i] == ZOFF_SIMD_AVX512_BF16) name = "avx512";
        setenv("ZOFF_SIMD", name, 1);
        OK(zoff_host_optimizer_create(&c, 1, &opt));
        assert_int_equal(zoff_host_optimizer_simd(opt), g_paths[i]);
        assert_string_equal(zoff_host_optimizer_path(opt), zoff_simd_path_name(g_paths[i]));
        zoff_host_optimizer_destroy(opt);
    }
    setenv("ZOFF_SIMD", "bogus", 1);
    assert_int_equal(zoff_host_optimizer_create(&c, 1, &opt), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "ZOFF_SIMD"));
    assert_null(opt);
#if !defined(__aarch64__)
    setenv("ZOFF_SIMD", "neon", 1);
    assert_int_equal(zoff_host_optimizer_create(&c, 1, &opt), ZOFF_ERR_UNSUPPORTED);
    assert_non_null(strstr(zoff_last_error(), "neon"));
#endif
    unsetenv("ZOFF_SIMD");
    OK(zoff_host_optimizer_create(&c, 1, &opt));
    assert_int_equal(zoff_host_optimizer_simd(opt), best);
    zoff_host_optimizer_destroy(opt);
}

/* ------------------------------------------------------------------ tests */

static const int64_t g_lengths[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 100, 1027};
#define NLENGTHS ((int)(sizeof g_lengths / sizeof g_lengths[0]))

/* Every path x optimizer x dtype combination x length x value regime against the reference. */
static void test_reference(void **state) {
    (void)state;
    static const zoff_dtype gds[] = {ZOFF_F32, ZOFF_BF16, ZOFF_F16};
    static const zoff_dtype pds[] = {NO_P16, ZOFF_BF16, ZOFF_F16};
    int64_t runs = 0, elems = 0;
    memset(&g_err, 0, sizeof g_err);
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi++) {
            const ocase *oc = &g_ocases[oi];
            for (int sdi = 0; sdi < 3; sdi++) { /* f32, bf16 nearest, bf16 stochastic */
                zoff_dtype sd = sdi == 0 ? ZOFF_F32 : ZOFF_BF16;
                zoff_state_rounding sr = sdi == 2 ? ZOFF_STATE_ROUND_STOCHASTIC : ZOFF_STATE_ROUND_NEAREST;
                zoff_host_optimizer *opt = make_opt(oc, g_paths[pi], 2, sr, 64);
                for (int gi = 0; gi < 3; gi++)
                    for (int qi = 0; qi < 3; qi++)
                        for (int li = 0; li < NLENGTHS; li++) {
                            int regime = (int)((li + gi + qi) % R_COUNT);
                            if (pds[qi] == ZOFF_F16 && regime == R_LARGE) regime = R_NORMAL; /* fp16 overflow: below */
                            tbuf in, out;
                            tb_alloc(&in, g_lengths[li], gds[gi], sd, pds[qi], li % 3);
                            double gscale = tb_fill(&in, regime);
                            tb_copy(&out, &in, (li + 1) % 3);
                            run_step(opt, &out, oc->type, oc->wd, gscale);
                            check_reference(oc, &in, &out, gscale, sdi == 2);
                            tb_free(&in);
                            tb_free(&out);
                            runs++;
                            elems += g_lengths[li];
                        }
                zoff_host_optimizer_destroy(opt);
            }
        }
    print_message("reference: %lld runs, %lld elements; max observed error / (u S), fp32 state: m %.2f, v %.2f "
                  "(bound 8), p %.2f (bound 8 + propagated m, v error); p max error / its bound %.3f (Lion sign ties excluded)\n",
                  (long long)runs, (long long)elems, g_err.m, g_err.v, g_err.p, g_err.pb);
    (void)regime_name;
}

/* bit patterns equal, NaN == NaN; allow_ftz: a bf16 value that the AVX512_BF16
 * path flushed (fp32 subnormal input) may be +-0 in `a` */
static void assert_same_bits(const char *what, const void *a, const void *b, int64_t n, zoff_dtype dt, bool allow_ftz,
                             const char *pa, const char *pb) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == ZOFF_F32) {
            float x = ((const float *)a)[i], y = ((const float *)b)[i];
            if (isnan(x) && isnan(y)) continue;
            if (memcmp(&x, &y, 4))
                fail_msg("%s[%lld]: %s %.9g vs %s %.9g", what, (long long)i, pa, (double)x, pb, (double)y);
        } else {
            uint16_t x = ((const uint16_t *)a)[i], y = ((const uint16_t *)b)[i];
            float fx = dt == ZOFF_BF16 ? zoff_bf16_to_f32(x) : zoff_f16_to_f32(x);
            float fy = dt == ZOFF_BF16 ? zoff_bf16_to_f32(y) : zoff_f16_to_f32(y);
            if (isnan(fx) && isnan(fy)) continue;
            if (x == y) continue;
            if (allow_ftz && dt == ZOFF_BF16 && (x & 0x7fff) == 0 && (y & 0x7fff) <= 0x0080) continue;
            fail_msg("%s[%lld]: %s 0x%04x vs %s 0x%04x", what, (long long)i, pa, x, pb, y);
        }
    }
}

static void assert_tb_same(const tbuf *a, const tbuf *b, bool allow_ftz, const char *pa, const char *pb) {
    assert_int_equal(a->n, b->n);
    if (a->n == 0) return;
    assert_same_bits("p", a->p, b->p, a->n, ZOFF_F32, false, pa, pb);
    assert_same_bits("m", a->m, b->m, a->n, a->sd, allow_ftz, pa, pb);
    assert_same_bits("v", a->v, b->v, a->n, a->sd, allow_ftz, pa, pb);
    if (a->p16) assert_same_bits("p16", a->p16, b->p16, a->n, a->pd, allow_ftz, pa, pb);
}

/* One step of every other path (2 threads) on a copy of `in` gives ref's bits (the
 * scalar path's result); returns the number of paths compared. */
static int paths_match_scalar(const ocase *oc, const tbuf *in, const tbuf *ref, zoff_state_rounding sr,
                              double gscale) {
    int compared = 0;
    for (int pi = 0; pi < g_npaths; pi++) {
        if (g_paths[pi] == ZOFF_SIMD_SCALAR) continue;
        tbuf out;
        tb_copy(&out, in, 1);
        zoff_host_optimizer *o1 = make_opt(oc, g_paths[pi], 2, sr, 0);
        run_step(o1, &out, oc->type, oc->wd, gscale);
        zoff_host_optimizer_destroy(o1);
        assert_tb_same(&out, ref, g_paths[pi] == ZOFF_SIMD_AVX512_BF16, zoff_simd_path_name(g_paths[pi]), "scalar");
        tb_free(&out);
        compared++;
    }
    return compared;
}

/* Every path gives the scalar path's bits (stated exception: AVX512_BF16 flushing). */
static void test_paths_bit_identical(void **state) {
    (void)state;
    static const zoff_dtype gds[] = {ZOFF_F32, ZOFF_BF16, ZOFF_F16};
    static const zoff_dtype pds[] = {NO_P16, ZOFF_BF16, ZOFF_F16};
    int64_t compared = 0;
    for (int oi = 0; oi < NOCASES; oi++) {
        const ocase *oc = &g_ocases[oi];
        for (int sdi = 0; sdi < 3; sdi++) {
            zoff_dtype sd = sdi == 0 ? ZOFF_F32 : ZOFF_BF16;
            zoff_state_rounding sr = sdi == 2 ? ZOFF_STATE_ROUND_STOCHASTIC : ZOFF_STATE_ROUND_NEAREST;
            for (int gi = 0; gi < 3; gi++)
                for (int qi = 0; qi < 3; qi++)
                    for (int regime = 0; regime < R_COUNT; regime++) {
                        int64_t n = 1000 + 37 * regime + gi;
                        tbuf in, ref;
                        tb_alloc(&in, n, gds[gi], sd, pds[qi], 0);
                        double gscale = tb_fill(&in, regime);
                        tb_copy(&ref, &in, 0);
                        zoff_host_optimizer *o0 = make_opt(oc, ZOFF_SIMD_SCALAR, 1, sr, 0);
                        run_step(o0, &ref, oc->type, oc->wd, gscale);
                        zoff_host_optimizer_destroy(o0);
                        compared += n * paths_match_scalar(oc, &in, &ref, sr, gscale);
                        tb_free(&in);
                        tb_free(&ref);
                    }
        }
    }
    print_message("cross-path: %lld elements compared bit for bit with the scalar path\n", (long long)compared);
}

/* The result does not depend on the thread count or the split. */
static void test_threads_bit_identical(void **state) {
    (void)state;
    static const int threads[] = {1, 2, 3, 4, 7, 16};
    static const int64_t lengths[] = {37, 4097, 100003};
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi += 3)
            for (int li = 0; li < 3; li++) {
                const ocase *oc = &g_ocases[oi];
                tbuf in, ref;
                tb_alloc(&in, lengths[li], ZOFF_BF16, oi % 2 ? ZOFF_BF16 : ZOFF_F32, ZOFF_BF16, li);
                double gscale = tb_fill(&in, R_NORMAL);
                tb_copy(&ref, &in, 0);
                zoff_host_optimizer *o0 = make_opt(oc, g_paths[pi], 1, ZOFF_STATE_ROUND_STOCHASTIC, 0);
                run_step(o0, &ref, oc->type, oc->wd, gscale);
                zoff_host_optimizer_destroy(o0);
                for (size_t ti = 0; ti < sizeof threads / sizeof threads[0]; ti++) {
                    tbuf out;
                    tb_copy(&out, &in, (int)ti % 3);
                    zoff_host_optimizer *o1 = make_opt(oc, g_paths[pi], threads[ti], ZOFF_STATE_ROUND_STOCHASTIC, -1);
                    assert_int_equal(zoff_host_optimizer_threads(o1), threads[ti]);
                    run_step(o1, &out, oc->type, oc->wd, gscale);
                    zoff_host_optimizer_destroy(o1);
                    assert_tb_same(&out, &ref, false, "threaded", "one thread");
                    tb_free(&out);
                }
                tb_free(&in);
                tb_free(&ref);
            }
}

/* Work sharing and the before_write hook. The thread that takes element 0 is made slow (2 ms
 * per block of the hook); the others, done with their own chunks, take the rest of its chunk.
 * Checked: every element went through the hook exactly once and before it was written (the
 * weights the hook sees are still the inputs), the results equal one thread's bit for bit,
 * and the slow thread's chunk was shared (more than one thread worked on it). */
typedef struct share_probe {
    const tbuf *in, *out;
    unsigned char *calls;     /* per element: hook calls */
    unsigned char *who;       /* per element: the number of the thread that went through it */
    _Atomic int threads_seen; /* thread numbers handed out */
    _Atomic int written_early;
    int gen;
} share_probe;

static _Thread_local int tl_gen = -1, tl_id, tl_slow;

static void share_hook(void *ctx, int64_t lo, int64_t hi) {
    share_probe *sp = ctx;
    if (tl_gen != sp->gen) { /* a pool thread from an earlier run: a fresh number */
        tl_gen = sp->gen;
        tl_id = atomic_fetch_add(&sp->threads_seen, 1);
        tl_slow = 0;
    }
    if (lo == 0) tl_slow = 1;
    if (memcmp(sp->out->p + lo, sp->in->p + lo, (size_t)(hi - lo) * 4)) atomic_store(&sp->written_early, 1);
    for (int64_t i = lo; i < hi; i++) sp->calls[i]++;
    memset(sp->who + lo, tl_id, (size_t)(hi - lo));
    if (tl_slow) nanosleep(&(struct timespec){0, 2000000}, NULL);
}

static void test_work_sharing(void **state) {
    (void)state;
    static int gen;
    const int T = 4;
    const int64_t n = (int64_t)T * 8 * 65536 + 123;
    const ocase *oc = &g_ocases[0];
    tbuf in, ref, out;
    tb_alloc(&in, n, ZOFF_BF16, ZOFF_F32, ZOFF_BF16, 0);
    double gscale = tb_fill(&in, R_NORMAL);
    tb_copy(&ref, &in, 0);
    tb_copy(&out, &in, 0);
    zoff_host_optimizer *o0 = make_opt(oc, g_paths[0], 1, ZOFF_STATE_ROUND_STOCHASTIC, 0);
    run_step(o0, &ref, oc->type, oc->wd, gscale);
    zoff_host_optimizer_destroy(o0);
    share_probe sp = {.in = &in, .out = &out, .calls = calloc((size_t)n, 1),
                      .who = calloc((size_t)n, 1), .gen = ++gen};
    assert_non_null(sp.calls);
    assert_non_null(sp.who);
    zoff_host_optimizer *o1 = make_opt(oc, g_paths[0], T, ZOFF_STATE_ROUND_STOCHASTIC, -1);
    OK(zoff_host_optimizer_begin_step(o1, STEP, LR));
    zoff_optim_tensors t = tensors_of(&out, oc->type);
    t.before_write = share_hook;
    t.before_write_ctx = &sp;
    OK(zoff_host_optimizer_update(o1, &t, oc->wd, gscale));
    zoff_host_optimizer_destroy(o1);
    assert_int_equal(atomic_load(&sp.written_early), 0);
    for (int64_t i = 0; i < n; i++)
        if (sp.calls[i] != 1) fail_msg("element %lld went through the hook %d times", (long long)i, sp.calls[i]);
    assert_tb_same(&out, &ref, false, "shared, one thread slow", "one thread");
    int64_t others = 0;
    for (int64_t i = 0; i < n / T; i++) others += sp.who[i] != sp.who[0];
    print_message("work sharing: %d threads, %lld of the slow thread's %lld elements done by others\n",
                  atomic_load(&sp.threads_seen), (long long)others, (long long)(n / T));
    assert_true(others > 0);
    free(sp.calls);
    free(sp.who);
    tb_free(&in);
    tb_free(&ref);
    tb_free(&out);
}

/* In place (the engine's one host buffer: the 16-bit gradient in, the new 16-bit weight
 * out): params16 aliasing the grads gives the separate-buffer result bit for bit on every
 * path, kind, 16-bit grad dtype, state dtype (the even/odd bf16 pass included), thread
 * count and a length with a tail; the aliased buffer ends holding the weights. */
static void test_params16_in_place(void **state) {
    (void)state;
    static const zoff_dtype g16[] = {ZOFF_BF16, ZOFF_F16};
    static const int64_t lengths[] = {1, 333, 4099};
    int64_t compared = 0;
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi++)
            for (int gi = 0; gi < 2; gi++)
                for (int sdi = 0; sdi < 2; sdi++)
                    for (int li = 0; li < 3; li++) {
                        const ocase *oc = &g_ocases[oi];
                        int threads = 1 + li % 2;
                        tbuf in, ref, out;
                        tb_alloc(&in, lengths[li], g16[gi], sdi ? ZOFF_BF16 : ZOFF_F32, g16[gi], li);
                        double gs = tb_fill(&in, R_NORMAL);
                        tb_copy(&ref, &in, 0);
                        tb_copy(&out, &in, li);
                        zoff_host_optimizer *opt = make_opt(oc, g_paths[pi], threads, ZOFF_STATE_ROUND_NEAREST, -1);
                        run_step(opt, &ref, oc->type, oc->wd, gs);
                        free(out.raw[4]);
                        out.raw[4] = NULL;
                        out.p16 = out.g; /* one buffer: grads in, weights out */
                        run_step(opt, &out, oc->type, oc->wd, gs);
                        zoff_host_optimizer_destroy(opt);
                        const char *pn = zoff_simd_path_name(g_paths[pi]);
                        assert_same_bits("p", out.p, ref.p, in.n, ZOFF_F32, false, pn, "separate buffers");
                        assert_same_bits("m", out.m, ref.m, in.n, in.sd, false, pn, "separate buffers");
                        assert_same_bits("v", out.v, ref.v, in.n, in.sd, false, pn, "separate buffers");
                        assert_same_bits("p16", out.g, ref.p16, in.n, in.pd, false, pn, "separate buffers");
                        compared += in.n;
                        tb_free(&in);
                        tb_free(&ref);
                        tb_free(&out);
                    }
    print_message("in place: %lld elements compared bit for bit with separate buffers\n", (long long)compared);
}

/* Splitting a range into pieces (with index_base) gives the same bits, stochastic rounding included. */
static void test_split_ranges(void **state) {
    (void)state;
    const ocase *oc = &g_ocases[1];
    const int64_t n = 5000, cut = 1234;
    tbuf in, whole, parts;
    tb_alloc(&in, n, ZOFF_F16, ZOFF_BF16, ZOFF_BF16, 0);
    double gscale = tb_fill(&in, R_NORMAL);
    tb_copy(&whole, &in, 0);
    tb_copy(&parts, &in, 0);
    zoff_host_optimizer *opt = make_opt(oc, zoff_simd_path_best(), 2, ZOFF_STATE_ROUND_STOCHASTIC, 0);
    run_step(opt, &whole, oc->type, oc->wd, gscale);
    OK(zoff_host_optimizer_begin_step(opt, STEP, LR));
    zoff_optim_tensors t = tensors_of(&parts, oc->type);
    zoff_optim_tensors a = t, b = t;
    a.n = cut;
    b.params += cut;
    b.exp_avg = (uint16_t *)b.exp_avg + cut;
    b.exp_avg_sq = (uint16_t *)b.exp_avg_sq + cut;
    b.grads = (const uint16_t *)b.grads + cut;
    b.params16 = (uint16_t *)b.params16 + cut;
    b.n = n - cut;
    b.index_base = t.index_base + cut;
    OK(zoff_host_optimizer_update(opt, &b, oc->wd, gscale));
    OK(zoff_host_optimizer_update(opt, &a, oc->wd, gscale));
    assert_tb_same(&parts, &whole, false, "split", "whole");
    zoff_host_optimizer_destroy(opt);
    tb_free(&in);
    tb_free(&whole);
    tb_free(&parts);
}

/* NaN / inf in gradients: that element's weight and state become NaN; the others are untouched. */
static void test_nonfinite(void **state) {
    (void)state;
    static const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi++)
            for (int gi = 0; gi < 3; gi++) {
                const ocase *oc = &g_ocases[oi];
                zoff_dtype gd = gi == 0 ? ZOFF_F32 : gi == 1 ? ZOFF_BF16 : ZOFF_F16;
                const int64_t n = 40;
                tbuf in, ref, out;
                tb_alloc(&in, n, gd, ZOFF_F32, ZOFF_F16, 0);
                double gscale = tb_fill(&in, R_NORMAL);
                tb_copy(&ref, &in, 0);
                tb_copy(&out, &in, 0);
                const int64_t idx[] = {0, 17, 39};
                for (int k = 0; k < 3; k++) st(out.g, idx[k], gd, bad[k]);
                zoff_host_optimizer *opt = make_opt(oc, g_paths[pi], 2, ZOFF_STATE_ROUND_NEAREST, 0);
                run_step(opt, &ref, oc->type, oc->wd, gscale);
                run_step(opt, &out, oc->type, oc->wd, gscale);
                zoff_host_optimizer_destroy(opt);
                for (int64_t i = 0; i < n; i++) {
                    bool hit = i == 0 || i == 17 || i == 39;
                    if (hit) {
                        assert_true(isnan(out.p[i]));
                        assert_true(isnan(zoff_f16_to_f32(((uint16_t *)out.p16)[i])));
                        if (oc->type != ZOFF_OPTIM_ADAGRAD) assert_true(isnan(((float *)out.m)[i]) || isinf(((float *)out.m)[i]));
                        if (oc->type != ZOFF_OPTIM_LION) assert_true(isnan(((float *)out.v)[i]) || isinf(((float *)out.v)[i]));
                    } else {
                        assert_memory_equal(&out.p[i], &ref.p[i], 4);
                        assert_memory_equal((float *)out.m + i, (float *)ref.m + i, 4);
                        assert_memory_equal((float *)out.v + i, (float *)ref.v + i, 4);
                    }
                }
                tb_free(&in);
                tb_free(&ref);
                tb_free(&out);
            }
}

/* bf16 state with stochastic rounding (the all-bf16 modes take the even/odd step on
 * AVX2 / AVX-512, whose NaN handling is a separate branch): NaN / inf gradients and
 * NaN weights with awkward payloads (signalling, all-ones: adding the rounding bits
 * would carry into the sign) give NaN in the weight, its 16-bit copy and the state
 * that depends on them, never a number; every other element, including those in the
 * same vector, gets the bits of the run without them; every path gives the scalar
 * path's bits. */
static void test_nonfinite_bf16_state(void **state) {
    (void)state;
    static const uint32_t badp[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7fc00000u};
    static const float badg[] = {NAN, INFINITY, -INFINITY};
    const int64_t n = 203; /* two-step iterations, one step, single vectors and a tail */
    for (int oi = 0; oi < NOCASES; oi++)
        for (int qi = 0; qi < 2; qi++) {
            const ocase *oc = &g_ocases[oi];
            tbuf in, bad, ref;
            tb_alloc(&in, n, ZOFF_BF16, ZOFF_BF16, qi ? ZOFF_BF16 : NO_P16, 0);
            double gscale = tb_fill(&in, R_NORMAL);
            tb_copy(&bad, &in, 0);
            const int64_t gi[] = {0, 37, 65}, pi_[] = {20, 100, 150, 190};
            for (int k = 0; k < 3; k++) st(bad.g, gi[k], ZOFF_BF16, badg[k]);
            for (int k = 0; k < 4; k++) memcpy(&bad.p[pi_[k]], &badp[k], 4);
            tb_copy(&ref, &bad, 0);
            zoff_host_optimizer *o0 = make_opt(oc, ZOFF_SIMD_SCALAR, 1, ZOFF_STATE_ROUND_STOCHASTIC, 0);
            run_step(o0, &ref, oc->type, oc->wd, gscale);
            run_step(o0, &in, oc->type, oc->wd, gscale); /* the run without bad values */
            zoff_host_optimizer_destroy(o0);
            for (int64_t i = 0; i < n; i++) {
                bool hitg = i == 0 || i == 37 || i == 65, hitp = i == 20 || i == 100 || i == 150 || i == 190;
                const uint16_t *m = ref.m, *v = ref.v, *m0 = in.m, *v0 = in.v;
                if (hitg || hitp) {
                    assert_true(isnan(ref.p[i]));
                    if (ref.p16) assert_true(isnan(zoff_bf16_to_f32(((uint16_t *)ref.p16)[i])));
                    /* the state sees the weight only through L2 decay (Adam, Adagrad) */
                    bool state_sees = hitg || (oc->wd != 0 && oc->type == ZOFF_OPTIM_ADAM && !oc->adam_w_mode) ||
                                      (oc->wd != 0 && oc->type == ZOFF_OPTIM_ADAGRAD);
                    float fm = zoff_bf16_to_f32(m[i]), fv = zoff_bf16_to_f32(v[i]);
                    if (state_sees && oc->type != ZOFF_OPTIM_ADAGRAD) assert_true(isnan(fm) || isinf(fm));
                    if (state_sees && oc->type != ZOFF_OPTIM_LION) assert_true(isnan(fv) || isinf(fv));
                    if (!state_sees) {
                        assert_int_equal(m[i], m0[i]);
                        assert_int_equal(v[i], v0[i]);
                    }
                } else {
                    assert_memory_equal(&ref.p[i], &in.p[i], 4);
                    assert_int_equal(m[i], m0[i]);
                    assert_int_equal(v[i], v0[i]);
                }
            }
            paths_match_scalar(oc, &bad, &ref, ZOFF_STATE_ROUND_STOCHASTIC, gscale);
            tb_free(&in);
            tb_free(&bad);
            tb_free(&ref);
        }
}

/* Large weights overflow fp16 params16 to inf (documented); bf16 holds them. */
static void test_fp16_copy_overflow(void **state) {
    (void)state;
    const ocase *oc = &g_ocases[2];
    for (int pi = 0; pi < g_npaths; pi++) {
        tbuf b;
        tb_alloc(&b, 19, ZOFF_F32, ZOFF_F32, ZOFF_F16, 0);
        tb_fill(&b, R_NORMAL);
        b.p[3] = 1e6f;
        b.p[4] = -70000.0f;
        b.p[5] = 65504.0f;
        zoff_host_optimizer *opt = make_opt(oc, g_paths[pi], 1, ZOFF_STATE_ROUND_NEAREST, 0);
        run_step(opt, &b, oc->type, 0.0, 1.0);
        zoff_host_optimizer_destroy(opt);
        const uint16_t *h = b.p16;
        assert_int_equal(h[3], 0x7c00);
        assert_int_equal(h[4], 0xfc00);
        assert_int_equal(h[5], zoff_f32_to_f16(b.p[5]));
        tb_free(&b);
    }
}

/* n = 0 touches nothing (NULL pointers allowed); argument errors are reported. */
static void test_errors_and_empty(void **state) {
    (void)state;
    const ocase *oc = &g_ocases[0];
    zoff_optimizer_config c = make_cfg(oc);
    zoff_host_optimizer *opt = NULL;
    OK(zoff_host_optimizer_create(&c, 1, &opt));
    zoff_optim_tensors t = {.state_dt = ZOFF_F32, .grad_dt = ZOFF_BF16, .n = 0};
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_INVALID); /* before begin_step */
    assert_non_null(strstr(zoff_last_error(), "begin_step"));
    assert_int_equal(zoff_host_optimizer_begin_step(opt, 0, 1e-3), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_host_optimizer_begin_step(opt, 1, NAN), ZOFF_ERR_INVALID);
    OK(zoff_host_optimizer_begin_step(opt, 1, 1e-3));
    OK(zoff_host_optimizer_update(opt, &t, 0, 1));
    OK(zoff_host_optimizer_bandwidth_probe(opt, &t));
    OK(zoff_host_optimizer_init_state(opt, &t));
    t.n = 10;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_INVALID);
    float p[10] = {0}, m[10] = {0}, v[10] = {0};
    uint16_t g[10] = {0};
    t.params = p;
    t.grads = g;
    t.exp_avg = m;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_INVALID); /* no exp_avg_sq */
    assert_non_null(strstr(zoff_last_error(), "exp_avg_sq"));
    t.exp_avg_sq = v;
    OK(zoff_host_optimizer_update(opt, &t, 0, 1));
    t.grad_dt = ZOFF_I32;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_UNSUPPORTED);
    t.grad_dt = ZOFF_BF16;
    t.state_dt = ZOFF_F16;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_UNSUPPORTED);
    t.state_dt = ZOFF_F32;
    t.params16 = p;
    t.p16_dt = ZOFF_F32;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_UNSUPPORTED);
    t.params16 = NULL;
    t.n = -1;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, 1), ZOFF_ERR_INVALID);
    t.n = 10;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, NAN, 1), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0, INFINITY), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_host_optimizer_set_betas(opt, 1.0, 0.9), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_host_optimizer_set_threads(opt, -2), ZOFF_ERR_INVALID);
    zoff_host_optimizer_destroy(opt);

    c.beta2 = 1.5;
    assert_int_equal(zoff_host_optimizer_create(&c, 1, &opt), ZOFF_ERR_CONFIG);
    assert_non_null(strstr(zoff_last_error(), "betas"));
    c.beta2 = 0.999;
    setenv("ZOFF_THREADS", "two", 1);
    assert_int_equal(zoff_host_optimizer_create(&c, 0, &opt), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "ZOFF_THREADS"));
    setenv("ZOFF_THREADS", "3", 1);
    OK(zoff_host_optimizer_create(&c, 0, &opt));
    assert_int_equal(zoff_host_optimizer_threads(opt), 3);
    zoff_host_optimizer_destroy(opt);
    unsetenv("ZOFF_THREADS");
    OK(zoff_host_optimizer_create(&c, 5, &opt)); /* explicit beats the environment */
    assert_int_equal(zoff_host_optimizer_threads(opt), 5);
    zoff_host_optimizer_destroy(opt);
}

/* Config wiring: Adam's adam_w_mode picks L2 or decoupled; AdamW is always decoupled;
 * params16 may alias 16-bit grads; init_state. */
static void test_config_wiring(void **state) {
    (void)state;
    const int64_t n = 50;
    struct {
        zoff_optimizer_type type;
        bool adam_w_mode, expect_decoupled;
    } w[] = {{ZOFF_OPTIM_ADAM, false, false}, {ZOFF_OPTIM_ADAM, true, true}, {ZOFF_OPTIM_ADAMW, false, true},
             {ZOFF_OPTIM_ADAMW, true, true}};
    for (int k = 0; k < 4; k++) {
        ocase oc = {"wiring", w[k].type, w[k].adam_w_mode, true, 0.9, 0.999, 1e-8, 0.2};
        ocase expect = {"expect", w[k].expect_decoupled ? ZOFF_OPTIM_ADAMW : ZOFF_OPTIM_ADAM,
                        w[k].expect_decoupled, true, 0.9, 0.999, 1e-8, 0.2};
        tbuf in, out;
        tb_alloc(&in, n, ZOFF_F32, ZOFF_F32, NO_P16, 0);
        double gs = tb_fill(&in, R_NORMAL);
        for (int64_t i = 0; i < n; i++) in.p[i] = 3.0f; /* make the decay term dominate */
        tb_copy(&out, &in, 0);
        zoff_host_optimizer *opt = make_opt(&oc, zoff_simd_path_best(), 1, ZOFF_STATE_ROUND_NEAREST, 0);
        run_step(opt, &out, oc.type, oc.wd, gs);
        zoff_host_optimizer_destroy(opt);
        check_reference(&expect, &in, &out, gs, false);
        tb_free(&in);
        tb_free(&out);
    }
    /* params16 aliasing the 16-bit gradient buffer */
    {
        const ocase *oc = &g_ocases[2];
        tbuf in, ref, out;
        tb_alloc(&in, 333, ZOFF_BF16, ZOFF_F32, ZOFF_BF16, 0);
        double gs = tb_fill(&in, R_NORMAL);
        tb_copy(&ref, &in, 0);
        tb_copy(&out, &in, 0);
        zoff_host_optimizer *opt = make_opt(oc, zoff_simd_path_best(), 2, ZOFF_STATE_ROUND_NEAREST, -1);
        run_step(opt, &ref, oc->type, oc->wd, gs);
        free(out.raw[4]);
        out.raw[4] = NULL;
        out.p16 = out.g; /* alias */
        run_step(opt, &out, oc->type, oc->wd, gs);
        assert_memory_equal(out.p, ref.p, 333 * 4);
        assert_memory_equal(out.g, ref.p16, 333 * 2);
        zoff_host_optimizer_destroy(opt);
        tb_free(&in);
        tb_free(&ref);
        tb_free(&out);
    }
    /* init_state: zeros, Adagrad's initial accumulator */
    {
        zoff_optimizer_config c = {.type = ZOFF_OPTIM_ADAGRAD, .lr = 1e-2, .eps = 1e-10, .initial_accumulator_value = 0.1};
        zoff_host_optimizer *opt = NULL;
        OK(zoff_host_optimizer_create(&c, 1, &opt));
        assert_false(zoff_host_optimizer_uses_exp_avg(opt));
        assert_true(zoff_host_optimizer_uses_exp_avg_sq(opt));
        float v[9];
        uint16_t vb[9];
        zoff_optim_tensors t = {.exp_avg_sq = v, .state_dt = ZOFF_F32, .n = 9};
        OK(zoff_host_optimizer_init_state(opt, &t));
        for (int i = 0; i < 9; i++) assert_true(v[i] == 0.1f);
        t.exp_avg_sq = vb;
        t.state_dt = ZOFF_BF16;
        OK(zoff_host_optimizer_init_state(opt, &t));
        for (int i = 0; i < 9; i++) assert_int_equal(vb[i], zoff_f32_to_bf16(0.1f));
        zoff_host_optimizer_destroy(opt);
        zoff_optimizer_config a = {.type = ZOFF_OPTIM_ADAM, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
        OK(zoff_host_optimizer_create(&a, 1, &opt));
        float m[9], vv[9];
        for (int i = 0; i < 9; i++) m[i] = vv[i] = 5;
        zoff_optim_tensors t2 = {.exp_avg = m, .exp_avg_sq = vv, .state_dt = ZOFF_F32, .n = 9};
        OK(zoff_host_optimizer_init_state(opt, &t2));
        for (int i = 0; i < 9; i++) assert_true(m[i] == 0 && vv[i] == 0);
        zoff_host_optimizer_destroy(opt);
    }
}

/* Beta powers: incremental across consecutive steps, pow() after a jump or a change of betas. */
static void test_beta_powers(void **state) {
    (void)state;
    ocase oc = g_ocases[2];
    const int64_t n = 64;
    tbuf in;
    tb_alloc(&in, n, ZOFF_F32, ZOFF_F32, NO_P16, 0);
    double gs = tb_fill(&in, R_NORMAL);
    /* consecutive steps 1..STEP then the checked step equals a fresh jump to STEP */
    zoff_host_optimizer *inc = make_opt(&oc, zoff_simd_path_best(), 1, ZOFF_STATE_ROUND_NEAREST, 0);
    zoff_host_optimizer *jmp = make_opt(&oc, zoff_simd_path_best(), 1, ZOFF_STATE_ROUND_NEAREST, 0);
    tbuf scratch;
    tb_copy(&scratch, &in, 0);
    for (int64_t s = 1; s < STEP; s++) {
        OK(zoff_host_optimizer_begin_step(inc, s, LR));
        zoff_optim_tensors t = tensors_of(&scratch, oc.type);
        OK(zoff_host_optimizer_update(inc, &t, oc.wd, gs));
    }
    tbuf a, b;
    tb_copy(&a, &in, 0);
    tb_copy(&b, &in, 0);
    run_step(inc, &a, oc.type, oc.wd, gs); /* STEP after STEP-1: incremental */
    run_step(jmp, &b, oc.type, oc.wd, gs); /* STEP from nothing: pow */
    check_reference(&oc, &in, &a, gs, false);
    check_reference(&oc, &in, &b, gs, false);
    for (int64_t i = 0; i < n; i++) assert_true(fabs(a.p[i] - b.p[i]) <= 2 * U32 * fabs(in.p[i]) + 1e-12);
    /* jump backwards, then forwards: recomputed with pow() */
    OK(zoff_host_optimizer_begin_step(inc, 2, LR));
    OK(zoff_host_optimizer_begin_step(inc, STEP - 1, LR));
    /* new betas: the next (consecutive) step must recompute the powers with the new betas */
    OK(zoff_host_optimizer_set_betas(inc, 0.5, 0.6));
    oc.beta1 = 0.5;
    oc.beta2 = 0.6;
    tbuf c;
    tb_copy(&c, &in, 0);
    run_step(inc, &c, oc.type, oc.wd, gs);
    check_reference(&oc, &in, &c, gs, false);
    zoff_host_optimizer_destroy(inc);
    zoff_host_optimizer_destroy(jmp);
    tb_free(&in);
    tb_free(&scratch);
    tb_free(&a);
    tb_free(&b);
    tb_free(&c);
}

/* Stochastic rounding of bf16 state is unbiased; nearest-even stalls v (documented). */
static void test_bf16_state_rounding(void **state) {
    (void)state;
    /* b1 = 0: m = g exactly, so the stored m is the rounding of a known fp32 value */
    ocase oc = {"sr", ZOFF_OPTIM_ADAMW, true, true, 0.0, 0.999, 1e-8, 0.0};
    const int64_t n = 200000;
    const float x = 1.0f + (1.0f / 3.0f) * 0.0078125f; /* a third of a bf16 ulp above 1 */
    for (int pi = 0; pi < g_npaths; pi++) {
        tbuf b;
        tb_alloc(&b, n, ZOFF_F32, ZOFF_BF16, NO_P16, 0);
        for (int64_t i = 0; i < n; i++) {
            b.p[i] = 0;
            ((uint16_t *)b.m)[i] = 0;
            ((uint16_t *)b.v)[i] = 0;
            ((float *)b.g)[i] = x;
        }
        zoff_host_optimizer *opt = make_opt(&oc, g_paths[pi], 2, ZOFF_STATE_ROUND_STOCHASTIC, 0);
        run_step(opt, &b, oc.type, 0.0, 1.0);
        zoff_host_optimizer_destroy(opt);
        int64_t up = 0;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = ((uint16_t *)b.m)[i];
            assert_true(h == 0x3f80 || h == 0x3f81);
            up += h == 0x3f81;
        }
        double frac = (double)up / (double)n;
        if (fabs(frac - 1.0 / 3.0) > 0.01) fail_msg("%s: stochastic rounding went up %.4f of the time, want 1/3",
                                                   zoff_simd_path_name(g_paths[pi]), frac);
        tb_free(&b);
    }
    /* v decay: g = 0 after v = 1: fp32 v decays as 0.999^k; bf16 nearest-even never moves */
    oc.beta1 = 0.9;
    for (int rnd = 0; rnd < 2; rnd++) {
        const int64_t nn = 4096;
        tbuf b;
        tb_alloc(&b, nn, ZOFF_F32, ZOFF_BF16, NO_P16, 0);
        for (int64_t i = 0; i < nn; i++) {
            b.p[i] = 0;
            ((uint16_t *)b.m)[i] = 0;
            ((uint16_t *)b.v)[i] = zoff_f32_to_bf16(1.0f);
            ((float *)b.g)[i] = 0;
        }
        zoff_host_optimizer *opt =
            make_opt(&oc, zoff_simd_path_best(), 1, rnd ? ZOFF_STATE_ROUND_STOCHASTIC : ZOFF_STATE_ROUND_NEAREST, 0);
        for (int64_t s = 1; s <= 500; s++) {
            OK(zoff_host_optimizer_begin_step(opt, s, LR));
            zoff_optim_tensors t = tensors_of(&b, oc.type);
            OK(zoff_host_optimizer_update(opt, &t, 0.0, 1.0));
        }
        zoff_host_optimizer_destroy(opt);
        double mean = 0;
        for (int64_t i = 0; i < nn; i++) mean += zoff_bf16_to_f32(((uint16_t *)b.v)[i]);
        mean /= (double)nn;
        double want = pow(0.999, 500);
        print_message("bf16 v after 500 steps of zero gradient from 1: %s %.4f (fp32 math: %.4f)\n",
                      rnd ? "stochastic" : "nearest-even", mean, want);
        if (rnd) assert_true(fabs(mean - want) < 0.01);
        else assert_true(mean == 1.0);
        tb_free(&b);
    }
}

/* The bandwidth probe touches the same arrays as update() and leaves the values unchanged
 * (params16 receives the weights); bytes_per_param counts what update() reads and writes. */
static void test_probe(void **state) {
    (void)state;
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi += 2) {
            const ocase *oc = &g_ocases[oi];
            for (int sdi = 0; sdi < 2; sdi++) {
                tbuf in, out;
                tb_alloc(&in, 3001, sdi ? ZOFF_BF16 : ZOFF_F32, sdi ? ZOFF_BF16 : ZOFF_F32, ZOFF_BF16, 1);
                tb_fill(&in, R_MIXED);
                tb_copy(&out, &in, 2);
                zoff_host_optimizer *opt = make_opt(oc, g_paths[pi], 2, ZOFF_STATE_ROUND_STOCHASTIC, -1);
                zoff_optim_tensors t = tensors_of(&out, oc->type);
                OK(zoff_host_optimizer_bandwidth_probe(opt, &t));
                assert_memory_equal(out.p, in.p, 3001 * 4);
                assert_memory_equal(out.m, in.m, 3001 * dsize(in.sd));
                assert_memory_equal(out.v, in.v, 3001 * dsize(in.sd));
                for (int64_t i = 0; i < 3001; i++) {
                    uint16_t h = ((uint16_t *)out.p16)[i];
                    bool ftz = fabsf(in.p[i]) < 1.1754944e-38f && (h & 0x7fff) == 0;
                    if (h != zoff_f32_to_bf16(in.p[i]) && !ftz) fail_msg("probe params16[%lld]", (long long)i);
                }
                int nstates = oc->type == ZOFF_OPTIM_ADAM || oc->type == ZOFF_OPTIM_ADAMW ? 2 : 1;
                double want = 8 + 2.0 * (double)dsize(in.sd) * nstates + (double)dsize(in.gd) + 2;
                assert_true(zoff_host_optimizer_bytes_per_param(opt, &t) == want);
                zoff_host_optimizer_destroy(opt);
                tb_free(&in);
                tb_free(&out);
            }
        }
}

/* ------------------------------------------------------------------ PyTorch fixtures */

typedef struct fixture_case {
    uint32_t kind, n, steps;
    double lr, b1, b2, eps, wd, loss_scale;
    const float *p0, *grads, *traj, *m, *v;
} fixture_case;

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s (regenerate with /usr/bin/python3 tests/fixtures/gen_adam_fixture.py)", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)sz);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *len = (size_t)sz;
    return buf;
}

static void test_torch_fixture(void **state) {
    (void)state;
    size_t len;
    uint8_t *buf = read_file(ZOFF_TEST_DIR "/fixtures/adam_torch.bin", &len);
    assert_true(len >= 32);
    assert_memory_equal(buf, "ZOFFADMF", 8);
    uint32_t version, ncases, crc;
    uint64_t payload;
    memcpy(&version, buf + 8, 4);
    memcpy(&ncases, buf + 12, 4);
    memcpy(&payload, buf + 16, 8);
    memcpy(&crc, buf + 24, 4);
    assert_int_equal(version, 1);
    assert_int_equal(payload, len - 32);
    assert_int_equal(zoff_crc32c(0, buf + 32, (size_t)payload), crc);
    fixture_case cases[16];
    assert_true(ncases >= 4 && ncases <= 16);
    size_t off = 32;
    for (uint32_t c = 0; c < ncases; c++) {
        fixture_case *fc = &cases[c];
        uint32_t hdr[4];
        double hp[6];
        assert_true(off + 16 + 48 <= len);
        memcpy(hdr, buf + off, 16);
        memcpy(hp, buf + off + 16, 48);
        off += 64;
        fc->kind = hdr[0];
        fc->n = hdr[1];
        fc->steps = hdr[2];
        fc->lr = hp[0], fc->b1 = hp[1], fc->b2 = hp[2], fc->eps = hp[3], fc->wd = hp[4], fc->loss_scale = hp[5];
        size_t need = (size_t)fc->n * 4 * (3 + 2 * (size_t)fc->steps);
        assert_true(fc->kind <= 2 && fc->n > 0 && fc->steps > 0 && off + need <= len);
        const float *f = (const float *)(buf + off); /* 8-aligned: header and doubles keep alignment */
        fc->p0 = f;
        fc->grads = f + fc->n;
        fc->traj = fc->grads + (size_t)fc->n * fc->steps;
        fc->m = fc->traj + (size_t)fc->n * fc->steps;
        fc->v = fc->m + fc->n;
        off += need;
    }
    assert_int_equal(off, len);

    double worst = 0;
    for (int pi = 0; pi < g_npaths; pi++)
        for (uint32_t c = 0; c < ncases; c++)
            for (int gi = 0; gi < 3; gi++) {
                const fixture_case *fc = &cases[c];
                zoff_dtype gd = gi == 0 ? ZOFF_F32 : gi == 1 ? ZOFF_BF16 : ZOFF_F16;
                static const zoff_optimizer_type kinds[] = {ZOFF_OPTIM_ADAM, ZOFF_OPTIM_ADAMW, ZOFF_OPTIM_ADAGRAD};
                static const char *const names[] = {"Adam", "AdamW", "Adagrad"};
                zoff_optimizer_config cfg = {.type = kinds[fc->kind], .lr = fc->lr,
                                             .beta1 = fc->b1, .beta2 = fc->b2, .eps = fc->eps, .adam_w_mode = false,
                                             .bias_correction = true, .weight_decay = fc->wd};
                zoff_host_optimizer_options o = {.threads = 2, .path = g_paths[pi], .serial_below = -1};
                zoff_host_optimizer *opt = NULL;
                OK(zoff_host_optimizer_create_ex(&cfg, &o, &opt));
                tbuf b;
                tb_alloc(&b, fc->n, gd, ZOFF_F32, ZOFF_BF16, 1);
                memcpy(b.p, fc->p0, (size_t)fc->n * 4);
                OK(zoff_host_optimizer_init_state(opt, &(zoff_optim_tensors){.exp_avg = b.m, .exp_avg_sq = b.v,
                                                                             .state_dt = ZOFF_F32, .n = fc->n}));
                for (uint32_t s = 0; s < fc->steps; s++) {
                    for (uint32_t i = 0; i < fc->n; i++) {
                        float g = fc->grads[(size_t)s * fc->n + i];
                        st(b.g, i, gd, g);
                        assert_true(ld(b.g, i, gd) == g); /* exactly representable by construction */
                    }
                    OK(zoff_host_optimizer_begin_step(opt, s + 1, fc->lr));
                    zoff_optim_tensors t = tensors_of(&b, cfg.type);
                    OK(zoff_host_optimizer_update(opt, &t, fc->wd, 1.0 / fc->loss_scale));
                    for (uint32_t i = 0; i < fc->n; i++) {
                        double want = fc->traj[(size_t)s * fc->n + i];
                        double err = fabs(b.p[i] - want);
                        /* fp32 rounding differs (torch: p * (1 - lr wd) where zoff fuses p + p (-lr wd);
                         * sqrt(v) / sqrt(bc2) where zoff multiplies by 1/sqrt(bc2)) and p is rounded
                         * every step, so allow one ulp of p per step plus 1e-6 lr per step */
                        double tol = (s + 1) * (2 * U32 * fabs(want) + 1e-6 * fc->lr);
                        double rel = err / (2 * U32 * fabs(want) + 1e-6 * fc->lr);
                        if (rel > worst) worst = rel;
                        if (!(err <= tol))
                            fail_msg("torch case %u (%s, %s grads, %s) step %u p[%u]: %.9g vs torch %.9g (err %.3g > %.3g)",
                                     c, names[fc->kind], zoff_dtype_name(gd),
                                     zoff_simd_path_name(g_paths[pi]), s + 1, i, (double)b.p[i], want, err, tol);
                    }
                }
                double gmax = 0;
                for (size_t i = 0; i < (size_t)fc->n * fc->steps; i++)
                    gmax = fmax(gmax, fabs(fc->grads[i] / fc->loss_scale));
                for (uint32_t i = 0; i < fc->n; i++) {
                    float m = ((float *)b.m)[i], v = ((float *)b.v)[i];
                    if (fc->kind == 2) m = 0; /* Adagrad has no exp_avg (the fixture's are 0) */
                    if (!(fabs(m - fc->m[i]) <= 1e-5 * fabs(fc->m[i]) + 1e-7 * gmax) ||
                        !(fabs(v - fc->v[i]) <= 1e-5 * fabs(fc->v[i]) + 1e-7 * gmax * gmax))
                        fail_msg("torch case %u: state[%u] m %.9g vs %.9g, v %.9g vs %.9g", c, i, (double)m,
                                 (double)fc->m[i], (double)v, (double)fc->v[i]);
                }
                tb_free(&b);
                zoff_host_optimizer_destroy(opt);
            }
    print_message("torch fixtures: %u cases x %d paths x 3 grad dtypes, 20 steps; max |p - torch| = %.2f x (ulp(p) + 1e-6 lr) (bound: step number)\n",
                  ncases, g_npaths, worst);
    free(buf);
}

/* ------------------------------------------------------------------ bf16 state: accuracy over many steps */

/* A noisy ill-conditioned quadratic, f(p) = 1/2 sum a_i (p_i - t_i)^2 with a_i from
 * 1e-2 to 1e2, started 3 units away, with gradient noise: AdamW with fp32 state
 * vs bf16 state (nearest even and stochastic), same gradient noise. Reports the
 * loss along the way and the drift of the weights from the fp32-state run
 * relative to the distance the fp32 run travelled. */
static void test_bf16_state_accuracy(void **state) {
    (void)state;
    enum { N = 4096, STEPS = 3000, CHECKS = 3 };
    static double a[N], tgt[N];
    static float p0[N], pf[3][N];
    double loss[3][CHECKS];
    uint64_t saved = g_rng;
    g_rng = 12345;
    for (int64_t i = 0; i < N; i++) {
        a[i] = pow(10.0, -2.0 + 4.0 * rnd_unit());
        tgt[i] = rnd_normal();
        p0[i] = (float)(tgt[i] + 3.0 * rnd_normal());
    }
    for (int k = 0; k < 3; k++) {
        ocase oc = {"acc", ZOFF_OPTIM_ADAMW, true, true, 0.9, 0.999, 1e-8, 0.0};
        zoff_host_optimizer *opt = make_opt(&oc, zoff_simd_path_best(), 2,
                                            k == 1 ? ZOFF_STATE_ROUND_NEAREST : ZOFF_STATE_ROUND_STOCHASTIC, 0);
        tbuf b;
        tb_alloc(&b, N, ZOFF_BF16, k == 0 ? ZOFF_F32 : ZOFF_BF16, NO_P16, 0);
        memcpy(b.p, p0, sizeof p0);
        OK(zoff_host_optimizer_init_state(opt, &(zoff_optim_tensors){.exp_avg = b.m, .exp_avg_sq = b.v,
                                                                     .state_dt = b.sd, .n = N}));
        g_rng = 99; /* the same noise for all three runs */
        for (int s = 1; s <= STEPS; s++) {
            for (int64_t i = 0; i < N; i++) st(b.g, i, ZOFF_BF16, (float)(a[i] * (b.p[i] - tgt[i]) + 0.01 * rnd_normal()));
            OK(zoff_host_optimizer_begin_step(opt, s, 1e-3));
            zoff_optim_tensors t = tensors_of(&b, oc.type);
            OK(zoff_host_optimizer_update(opt, &t, 0.0, 1.0));
            if (s % (STEPS / CHECKS) == 0) {
                double l = 0;
                for (int64_t i = 0; i < N; i++) l += 0.5 * a[i] * (b.p[i] - tgt[i]) * (b.p[i] - tgt[i]);
                loss[k][s / (STEPS / CHECKS) - 1] = l / N;
            }
        }
        memcpy(pf[k], b.p, sizeof p0);
        tb_free(&b);
        zoff_host_optimizer_destroy(opt);
    }
    g_rng = saved;
    double travel = 0, drift[3] = {0};
    for (int64_t i = 0; i < N; i++) {
        travel += (pf[0][i] - p0[i]) * (pf[0][i] - p0[i]);
        for (int k = 1; k < 3; k++) drift[k] += (pf[k][i] - pf[0][i]) * (pf[k][i] - pf[0][i]);
    }
    drift[1] = sqrt(drift[1] / travel);
    drift[2] = sqrt(drift[2] / travel);
    print_message("bf16 state accuracy (noisy quadratic, %d params, AdamW lr 1e-3, bf16 grads):\n", N);
    static const char *names[] = {"fp32 state", "bf16 nearest", "bf16 stochastic"};
    for (int k = 0; k < 3; k++)
        print_message("  %-16s loss at steps %d/%d/%d: %.4f %.4f %.4f; weight drift from fp32 run / fp32 travel %.4f\n",
                      names[k], STEPS / 3, 2 * STEPS / 3, STEPS, loss[k][0], loss[k][1], loss[k][2], drift[k]);
    /* stochastic rounding tracks the fp32-state run; nearest even does not (it biases v) */
    for (int c = 0; c < CHECKS; c++) assert_true(fabs(loss[2][c] - loss[0][c]) <= 0.02 * loss[0][c]);
    assert_true(drift[2] < 0.02);
    assert_true(drift[1] > 2 * drift[2]);
}

/* Speculation's backup (zoff_optim_tensors.backup): an update with ZOFF_BACKUP_SAVE gives
 * the plain update's bits and leaves the inputs (compared with a copy taken before) in the
 * backup; ZOFF_BACKUP_RESTORE from that backup over other state (a speculated update)
 * gives the plain update's bits again, the backup untouched; copy_backup copies either way.
 * Every path, kind, grad and state dtype, stochastic rounding, thread counts and lengths
 * inside one block, over several blocks of the per-thread copy and with tails. */
static void bk_point(tbuf *b, zoff_optim_tensors *t, zoff_optim_backup dir, const tbuf *bk) {
    t->backup = dir;
    t->backup_params = bk->p;
    t->backup_exp_avg = t->exp_avg ? bk->m : NULL;
    t->backup_exp_avg_sq = t->exp_avg_sq ? bk->v : NULL;
    (void)b;
}

static void assert_state_same(const tbuf *a, const tbuf *b, zoff_optimizer_type type, const char *pa, const char *pb) {
    assert_same_bits("p", a->p, b->p, a->n, ZOFF_F32, false, pa, pb);
    if (type != ZOFF_OPTIM_ADAGRAD) assert_same_bits("m", a->m, b->m, a->n, a->sd, false, pa, pb);
    if (type != ZOFF_OPTIM_LION) assert_same_bits("v", a->v, b->v, a->n, a->sd, false, pa, pb);
}

static void backup_case(const ocase *oc, zoff_simd_path path, zoff_dtype gd, zoff_dtype sd, int64_t n, int threads) {
    const char *pn = zoff_simd_path_name(path);
    tbuf in, ref, out, bk, other;
    tb_alloc(&in, n, gd, sd, ZOFF_BF16, 1);
    double gs = tb_fill(&in, R_NORMAL);
    tb_copy(&ref, &in, 0);
    tb_copy(&out, &in, 2);
    tb_alloc(&bk, n, gd, sd, ZOFF_BF16, 3);
    memset(bk.p, 0xCD, (size_t)n * 4);
    memset(bk.m, 0xCD, (size_t)n * dsize(sd));
    memset(bk.v, 0xCD, (size_t)n * dsize(sd));
    zoff_host_optimizer *opt = make_opt(oc, path, threads, ZOFF_STATE_ROUND_STOCHASTIC, -1);
    run_step(opt, &ref, oc->type, oc->wd, gs);
    /* save: the plain update's bits, the inputs in the backup */
    OK(zoff_host_optimizer_begin_step(opt, STEP, LR));
    zoff_optim_tensors t = tensors_of(&out, oc->type);
    bk_point(&out, &t, ZOFF_BACKUP_SAVE, &bk);
    OK(zoff_host_optimizer_update(opt, &t, oc->wd, gs));
    assert_tb_same(&out, &ref, false, pn, "plain update");
    assert_state_same(&bk, &in, oc->type, "backup", "input");
    /* restore: over the state of another update (a speculated one), the plain update's bits */
    tb_copy(&other, &in, 0);
    run_step(opt, &other, oc->type, oc->wd, 3.0 * gs);
    run_step(opt, &other, oc->type, oc->wd, 0.5 * gs);
    OK(zoff_host_optimizer_begin_step(opt, STEP, LR));
    t = tensors_of(&other, oc->type);
    bk_point(&other, &t, ZOFF_BACKUP_RESTORE, &bk);
    OK(zoff_host_optimizer_update(opt, &t, oc->wd, gs));
    assert_tb_same(&other, &ref, false, pn, "plain update");
    assert_state_same(&bk, &in, oc->type, "backup after restore", "input");
    /* the copies alone: restore puts the inputs back, save writes the state into the backup */
    OK(zoff_host_optimizer_copy_backup(opt, &t));
    assert_state_same(&other, &in, oc->type, "restored", "input");
    t = tensors_of(&ref, oc->type);
    bk_point(&ref, &t, ZOFF_BACKUP_SAVE, &bk);
    t.grads = NULL; /* not read */
    OK(zoff_host_optimizer_copy_backup(opt, &t));
    assert_state_same(&bk, &ref, oc->type, "saved", "state");
    zoff_host_optimizer_destroy(opt);
    tb_free(&in);
    tb_free(&ref);
    tb_free(&out);
    tb_free(&bk);
    tb_free(&other);
}

static void test_backup_fused(void **state) {
    (void)state;
    static const zoff_dtype gds[] = {ZOFF_BF16, ZOFF_F16, ZOFF_F32};
    static const int64_t lengths[] = {1, 37, 4096, 4097, 3 * 4096 + 123, 100003};
    int cases = 0;
    for (int pi = 0; pi < g_npaths; pi++)
        for (int oi = 0; oi < NOCASES; oi++)
            for (int gi = 0; gi < 3; gi++)
                for (int sdi = 0; sdi < 2; sdi++)
                    for (int li = 0; li < 6; li++) {
                        if ((oi + gi + sdi + li) % 2 && li != 4) continue; /* half of the grid; every longer one */
                        backup_case(&g_ocases[oi], g_paths[pi], gds[gi], sdi ? ZOFF_BF16 : ZOFF_F32, lengths[li],
                                    1 + (li + oi) % 3);
                        cases++;
                    }
    print_message("backup: %d cases bit for bit with the plain update\n", cases);
    /* bad input */
    tbuf a, bk;
    tb_alloc(&a, 100, ZOFF_BF16, ZOFF_F32, NO_P16, 0);
    tb_alloc(&bk, 100, ZOFF_BF16, ZOFF_F32, NO_P16, 0);
    tb_fill(&a, R_NORMAL);
    zoff_host_optimizer *opt = make_opt(&g_ocases[0], zoff_simd_path_best(), 2, ZOFF_STATE_ROUND_NEAREST, 0);
    OK(zoff_host_optimizer_begin_step(opt, STEP, LR));
    zoff_optim_tensors t = tensors_of(&a, ZOFF_OPTIM_ADAM);
    assert_int_equal(zoff_host_optimizer_copy_backup(opt, &t), ZOFF_ERR_INVALID); /* NONE: nothing to copy */
    bk_point(&a, &t, ZOFF_BACKUP_SAVE, &bk);
    t.backup_exp_avg_sq = NULL;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0.0, 1.0), ZOFF_ERR_INVALID);
    t.backup = (zoff_optim_backup)7;
    assert_int_equal(zoff_host_optimizer_update(opt, &t, 0.0, 1.0), ZOFF_ERR_INVALID);
    zoff_host_optimizer_destroy(opt);
    tb_free(&a);
    tb_free(&bk);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths),
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_paths_bit_identical),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_work_sharing),
        cmocka_unit_test(test_split_ranges),
        cmocka_unit_test(test_backup_fused),
        cmocka_unit_test(test_params16_in_place),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_nonfinite_bf16_state),
        cmocka_unit_test(test_fp16_copy_overflow),
        cmocka_unit_test(test_errors_and_empty),
        cmocka_unit_test(test_config_wiring),
        cmocka_unit_test(test_beta_powers),
        cmocka_unit_test(test_bf16_state_rounding),
        cmocka_unit_test(test_probe),
        cmocka_unit_test(test_torch_fixture),
        cmocka_unit_test(test_bf16_state_accuracy),
    };
    return cmocka_run_group_tests(tests, setup_paths, NULL);
}
