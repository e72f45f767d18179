/* The op test table: every zoff_op, on every available backend, against an
 * independent double-precision reference written here (after ggml's
 * test-backend-ops).
 *
 * For each table entry, each shape (odd sizes and n = 0 / 1 included), each
 * storage dtype and each variant (aliasing, optional outputs, ...):
 *   1. inputs are drawn at random and rounded to the storage dtype, so the
 *      reference sees exactly the values the device sees;
 *   2. the double reference computes the expected outputs;
 *   3. the op runs through the public API (zoff_device_create, zoff_device_alloc,
 *      ZOFF_LAUNCH on zoff_device_stream, zoff_stream_synchronize) on every
 *      backend that zoff_backend_available reports; outputs are compared with
 *      the reference by normalised error max|got - ref| / max(max|ref|, tiny),
 *      against the per-op limit of the tolerance table below; non-CPU backends
 *      are also compared with the CPU backend's result.
 * The backward references are themselves checked against central finite
 * differences of the double forward references (test_reference_gradients), so
 * nothing here depends on the code under test. The whole table runs twice: on
 * the row kernels the CPU backend picks for this machine (AVX2 where present)
 * and, in a child process with ZOFF_CPU_KERNELS=scalar, on the portable ones.
 *
 * Tolerances (normalised error; 16-bit outputs are rounded once on store, so
 * the limit is two units of roundoff 2^-8 for bf16, four of 2^-11 for f16;
 * attention backward also sees the rounded forward output):
 *
 *   op               f32      bf16     f16
 *   embed_fwd        1e-6     8e-3     2e-3
 *   embed_bwd        1e-5     8e-3     2e-3
 *   layernorm_fwd    2e-5     8e-3     2e-3
 *   layernorm_bwd    2e-5     1e-2     3e-3
 *   matmul_fwd       2e-5     8e-3     2e-3
 *   matmul_bwd       2e-5     8e-3     2e-3
 *   matmul_gelu_*    2e-5     8e-3     2e-3   (the matmul limits; GELU' near its extremes is < 1.2)
 *   attention_fwd    2e-5     1e-2     3e-3
 *   attention_bwd    5e-5     1.5e-2   4e-3
 *   gelu_fwd         1e-6     8e-3     2e-3
 *   gelu_bwd         1e-5     8e-3     2e-3
 *   add              1e-6     8e-3     2e-3
 *   cross_entropy    2e-5     8e-3     2e-3
 *   cast             exact    exact    exact
 *   scale            1e-6     8e-3     2e-3
 *   grad_stats       1e-6     1e-6     1e-6
 *   adam             1e-5     8e-3     2e-3
 *   residual_ln_fwd  2e-5     8e-3     2e-3   (as layernorm_fwd: the residual is one rounding)
 *   residual_ln_bwd  2e-5     1e-2     3e-3   (as layernorm_bwd)
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/cpu/cpu_kernels.h"
#include "zoff/device.h"

/* ------------------------------------------------------------------ numbers */

typedef struct rng { uint64_t s; } rng;

static uint64_t rng_next(rng *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
static double rng_normal(rng *r) {
    double u1 = rng_uniform(r), u2 = rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
static int64_t rng_int(rng *r, int64_t n) { return (int64_t)(rng_next(r) % (uint64_t)n); }

/* Round a double to the nearest value of dt (ties to even), written without
 * the library's conversion code: the reference must not share it. */
static double quant(double x, zoff_dtype dt) {
    if (dt == ZOFF_F32) return (double)(float)x;
    if (dt == ZOFF_I32 || x == 0 || isnan(x) || isinf(x)) return x;
    const int bits = dt == ZOFF_BF16 ? 8 : 11;     /* significant bits */
    const int emin = dt == ZOFF_BF16 ? -125 : -13; /* frexp exponent of the smallest normal */
    const double maxv = dt == ZOFF_BF16 ? 0x1.fep127 : 65504.0;
    int e;
    frexp(x, &e);
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - bits);
    double r = nearbyint(x / q) * q;
    return fabs(r) > maxv ? copysign(INFINITY, x) : r;
}

static size_t dt_size(zoff_dtype dt) { return dt == ZOFF_BF16 || dt == ZOFF_F16 ? 2 : 4; }

/* Encode a value exactly representable in dt (after quant) into its bits. */
static void encode(void *dst, int64_t i, double x, zoff_dtype dt) {
    if (dt == ZOFF_I32) {
        ((int32_t *)dst)[i] = (int32_t)x;
    } else if (dt == ZOFF_F32) {
        ((float *)dst)[i] = (float)x;
    } else if (dt == ZOFF_BF16) {
        float f = (float)x;
        uint32_t u;
        memcpy(&u, &f, 4);
        ((uint16_t *)dst)[i] = (uint16_t)(u >> 16);
    } else {
        uint16_t h, sign = signbit(x) ? 0x8000 : 0;
        double a = fabs(x);
        if (isnan(x)) h = 0x7e00;
        else if (isinf(x)) h = 0x7c00;
        else if (a == 0) h = 0;
        else {
            int e;
            double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
            if (e >= -13) h = (uint16_t)(((e + 14) << 10) | (uint16_t)llround((2 * m - 1) * 1024));
            else h = (uint16_t)llround(a * 16777216.0);
        }
        ((uint16_t *)dst)[i] = (uint16_t)(sign | h);
    }
}

static double decode(const void *src, int64_t i, zoff_dtype dt) {
    if (dt == ZOFF_I32) return ((const int32_t *)src)[i];
    if (dt == ZOFF_F32) return ((const float *)src)[i];
    uint16_t h = ((const uint16_t *)src)[i];
    if (dt == ZOFF_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    int E = (h >> 10) & 31, M = h & 1023;
    double v = E == 0 ? ldexp(M, -24) : E == 31 ? (M ? NAN : INFINITY) : ldexp(1024 + M, E - 25);
    return (h & 0x8000) ? -v : v;
}

/* ------------------------------------------------------------------ test cases */

enum { T_IN, T_OUT, T_INOUT };
#define MAXT 10
#define NBACK 2

typedef struct tensor {
    const char *name;
    int kind;
    zoff_dtype dt;
    int64_t n;
    int alias;        /* -1, or the index of the tensor whose device buffer this one shares */
    bool null;        /* pass NULL to the op */
    bool exact;       /* compare bit-exactly (NaN == NaN) */
    double *host;     /* inputs and initial values of INOUT, exactly representable in dt */
    double *ref;      /* expected OUT / INOUT values */
    double *got[NBACK]; /* results per backend */
} tensor;

typedef struct tcase tcase;
typedef struct op_entry {
    const char *name;
    zoff_op op;
    void (*setup)(tcase *c);                           /* declare tensors, draw inputs, compute the reference */
    zoff_status (*launch)(tcase *c, zoff_stream *s);   /* build the args struct from c->p and launch */
    int nshapes;
    int64_t shapes[8][5];
    int nvariants;
    double tol[3]; /* f32, bf16, f16; 0 = exact */
} op_entry;

struct tcase {
    const op_entry *e;
    const int64_t *d; /* the shape */
    zoff_dtype dt;
    int variant;
    rng r;
    int nt;
    tensor t[MAXT];
    void *p[MAXT]; /* device pointers for the current run (NULL for null tensors) */
    /* op scalars */
    float f[12];
    int iv;
};

static tensor *add_t(tcase *c, const char *name, int kind, zoff_dtype dt, int64_t n) {
    assert_true(c->nt < MAXT);
    tensor *t = &c->t[c->nt++];
    memset(t, 0, sizeof *t);
    t->name = name;
    t->kind = kind;
    t->dt = dt;
    t->n = n;
    t->alias = -1;
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(double);
    t->host = calloc(1, bytes);
    t->ref = calloc(1, bytes);
    for (int b = 0; b < NBACK; b++) t->got[b] = calloc(1, bytes);
    assert_non_null(t->host);
    assert_non_null(t->ref);
    return t;
}

static void fill_normal(tcase *c, tensor *t, double mean, double sd) {
    for (int64_t i = 0; i < t->n; i++) t->host[i] = quant(mean + sd * rng_normal(&c->r), t->dt);
}

static void set_host(tensor *t, int64_t i, double v) { t->host[i] = quant(v, t->dt); }

static void case_free(tcase *c) {
    for (int i = 0; i < c->nt; i++) {
        free(c->t[i].host);
        free(c->t[i].ref);
        for (int b = 0; b < NBACK; b++) free(c->t[i].got[b]);
    }
    c->nt = 0;
}

static void *P(tcase *c, int i) { return c->p[i]; }

/* Run the case on dev; results into t->got[slot]. Returns the synchronising status. */
static zoff_status exec_case(zoff_device *dev, tcase *c, int slot) {
    zoff_stream *s = zoff_device_stream(dev);
    void *stage[MAXT] = {0};
    zoff_status st = ZOFF_OK;
    memset(c->p, 0, sizeof c->p);
    for (int i = 0; i < c->nt && st == ZOFF_OK; i++) {
        tensor *t = &c->t[i];
        if (t->null || t->alias >= 0) continue;
        size_t bytes = (size_t)t->n * dt_size(t->dt);
        size_t abytes = bytes < 64 ? 64 : bytes;
        st = zoff_device_alloc(dev, abytes, t->name, &c->p[i]);
        if (st != ZOFF_OK) break;
        stage[i] = malloc(abytes);
        assert_non_null(stage[i]);
        if (t->kind == T_OUT) {
            memset(stage[i], 0xff, abytes); /* NaN: an element the op forgets to write shows up */
        } else {
            for (int64_t k = 0; k < t->n; k++) encode(stage[i], k, t->host[k], t->dt);
        }
        st = zoff_memcpy_async(s, c->p[i], stage[i], abytes, ZOFF_COPY_H2D);
    }
    for (int i = 0; i < c->nt; i++)
        if (!c->t[i].null && c->t[i].alias >= 0) c->p[i] = c->p[c->t[i].alias];
    if (st == ZOFF_OK) st = zoff_stream_synchronize(s);
    if (st == ZOFF_OK) {
        st = c->e->launch(c, s);
        if (st == ZOFF_OK) st = zoff_stream_synchronize(s);
    }
    if (st == ZOFF_OK) {
        for (int i = 0; i < c->nt && st == ZOFF_OK; i++) {
            tensor *t = &c->t[i];
            if (t->null || t->kind == T_IN) continue;
            int owner = t->alias >= 0 ? t->alias : i;
            size_t bytes = (size_t)t->n * dt_size(t->dt);
            if (bytes) st = zoff_memcpy_async(s, stage[owner], c->p[i], bytes, ZOFF_COPY_D2H);
            if (st == ZOFF_OK) st = zoff_stream_synchronize(s);
            for (int64_t k = 0; k < t->n && st == ZOFF_OK; k++) t->got[slot][k] = decode(stage[owner], k, t->dt);
        }
    }
    for (int i = 0; i < c->nt; i++) {
        if (c->t[i].alias < 0 && c->p[i]) zoff_device_free(dev, c->p[i]);
        free(stage[i]);
        c->p[i] = NULL;
    }
    return st;
}

/* max|a - b| / max(max|ref|, tiny); NaN where ref is not NaN counts as infinite. */
static double norm_err(const double *a, const double *ref, int64_t n, bool exact) {
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(ref[i]) && isnan(a[i])) continue;
        if (exact) {
            if (!(a[i] == ref[i])) return INFINITY;
            continue;
        }
        if (isinf(ref[i]) && a[i] == ref[i]) continue;
        double d = fabs(a[i] - ref[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        if (fabs(ref[i]) > mr) mr = fabs(ref[i]);
    }
    return md / (mr > 1e-30 ? mr : 1e-30);
}

/* ------------------------------------------------------------------ double references */

static const double LN_EPS = 1e-5;
static const double GELU_K = 0.7978845608028654; /* sqrt(2/pi) */

static double gelu_ref(double x) { return 0.5 * x * (1 + tanh(GELU_K * (x + 0.044715 * x * x * x))); }
static double gelu_grad_ref(double x) {
    double u = GELU_K * (x + 0.044715 * x * x * x), th = tanh(u);
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * GELU_K * (1 + 3 * 0.044715 * x * x);
}

/* out (N,C), mean, rstd (N) */
static void ln_fwd_ref(double *out, double *mean, double *rstd, const double *x, const double *w, const double *b,
                       int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[i * C + c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[i * C + c] - m) * (x[i * C + c] - m);
        double r = 1.0 / sqrt(v / (double)C + LN_EPS);
        for (int64_t c = 0; c < C; c++) out[i * C + c] = (x[i * C + c] - m) * r * w[c] + b[c];
        if (mean) mean[i] = m;
        if (rstd) rstd[i] = r;
    }
}

/* accumulates into dx (N,C), dw, db (C) (any may be NULL) */
static void ln_bwd_ref(double *dx, double *dw, double *db, const double *dy, const double *x, const double *w,
                       int64_t N, int64_t C) {
    for (int64_t i = 0; i < N; i++) {
        double m = 0, v = 0;
        for (int64_t c = 0; c < C; c++) m += x[i * C + c];
        m /= (double)C;
        for (int64_t c = 0; c < C; c++) v += (x[i * C + c] - m) * (x[i * C + c] - m);
        double r = 1.0 / sqrt(v / (double)C + LN_EPS), a = 0, bsum = 0;
        for (int64_t c = 0; c < C; c++) {
            double xh = (x[i * C + c] - m) * r, g = dy[i * C + c] * w[c];
            a += g;
            bsum += g * xh;
            if (dw) dw[c] += dy[i * C + c] * xh;
            if (db) db[c] += dy[i * C + c];
        }
        if (dx)
            for (int64_t c = 0; c < C; c++) {
                double xh = (x[i * C + c] - m) * r, g = dy[i * C + c] * w[c];
                dx[i * C + c] += r * (g - a / (double)C - xh * bsum / (double)C);
            }
    }
}

static void mm_fwd_ref(double *out, const double *x, const double *w, const double *b, int64_t N, int64_t C,
                       int64_t OC) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < OC; o++) {
            double s = b ? b[o] : 0;
            for (int64_t c = 0; c < C; c++) s += x[i * C + c] * w[o * C + c];
            out[i * OC + o] = s;
        }
}

static void mm_bwd_ref(double *dx, double *dw, double *db, const double *dy, const double *x, const double *w,
                       int64_t N, int64_t C, int64_t OC) {
    for (int64_t i = 0; i < N; i++)
        for (int64_t o = 0; o < OC; o++) {
            double g = dy[i * OC + o];
            if (db) db[o] += g;
            for (int64_t c = 0; c < C; c++) {
                if (dx) dx[i * C + c] += g * w[o * C + c];
                if (dw) dw[o * C + c] += g * x[i * C + c];
            }
        }
}

/* qkv (B,T,3C) -> out (B,T,C), lse (B,NH,T) */
static void attn_fwd_ref(double *out, double *lse, const double *qkv, int64_t B, int64_t T, int64_t C, int64_t NH) {
    int64_t HS = C / NH;
    double sc = 1.0 / sqrt((double)HS);
    double *s = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * HS;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * HS;
                    double d = 0;
                    for (int64_t c = 0; c < HS; c++) d += q[c] * k[c];
                    s[j] = d * sc;
                    if (s[j] > mx) mx = s[j];
                }
                for (int64_t j = 0; j <= i; j++) sum += exp(s[j] - mx);
                double *o = out + (b * T + i) * C + h * HS;
                for (int64_t c = 0; c < HS; c++) o[c] = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *v = qkv + (b * T + j) * 3 * C + 2 * C + h * HS;
                    double p = exp(s[j] - mx) / sum;
                    for (int64_t c = 0; c < HS; c++) o[c] += p * v[c];
                }
                if (lse) lse[(b * NH + h) * T + i] = mx + log(sum);
            }
    free(s);
}

/* dqkv (B,T,3C) = (overwritten) gradient given dout (B,T,C) */
static void attn_bwd_ref(double *dqkv, const double *dout, const double *qkv, int64_t B, int64_t T, int64_t C,
                         int64_t NH) {
    int64_t HS = C / NH;
    double sc = 1.0 / sqrt((double)HS);
    double *p = malloc((size_t)(T > 0 ? T : 1) * sizeof(double)), *dp = malloc((size_t)(T > 0 ? T : 1) * sizeof(double));
    memset(dqkv, 0, (size_t)(B * T * 3 * C) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * HS, *go = dout + (b * T + i) * C + h * HS;
                double mx = -INFINITY, sum = 0, dsum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * HS;
                    double d = 0;
                    for (int64_t c = 0; c < HS; c++) d += q[c] * k[c];
                    p[j] = d * sc;
                    if (p[j] > mx) mx = p[j];
                }
                for (int64_t j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t j = 0; j <= i; j++) {
                    const double *v = qkv + (b * T + j) * 3 * C + 2 * C + h * HS;
                    double *dv = dqkv + (b * T + j) * 3 * C + 2 * C + h * HS;
                    p[j] /= sum;
                    double d = 0;
                    for (int64_t c = 0; c < HS; c++) {
                        d += go[c] * v[c];
                        dv[c] += p[j] * go[c];
                    }
                    dp[j] = d;
                    dsum += p[j] * d;
                }
                double *dq = dqkv + (b * T + i) * 3 * C + h * HS;
                for (int64_t j = 0; j <= i; j++) {
                    double ds = p[j] * (dp[j] - dsum) * sc;
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * HS;
                    double *dk = dqkv + (b * T + j) * 3 * C + C + h * HS;
                    for (int64_t c = 0; c < HS; c++) {
                        dq[c] += ds * k[c];
                        dk[c] += ds * q[c];
                    }
                }
            }
    free(p);
    free(dp);
}

/* losses (N); dlogits (N,Vp) or NULL */
static void ce_ref(double *losses, double *dlogits, const double *logits, const double *targets, int64_t N,
                   int64_t V, int64_t Vp, double dloss) {
    for (int64_t i = 0; i < N; i++) {
        const double *l = logits + i * Vp;
        int64_t t = (int64_t)targets[i];
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < V; j++) mx = l[j] > mx ? l[j] : mx;
        for (int64_t j = 0; j < V; j++) sum += exp(l[j] - mx);
        double lse = mx + log(sum);
        losses[i] = t >= 0 ? lse - l[t] : 0;
        if (dlogits)
            for (int64_t j = 0; j < Vp; j++)
                dlogits[i * Vp + j] = (t >= 0 && j < V) ? (exp(l[j] - lse) - (j == t)) * dloss : 0;
    }
}

/* ------------------------------------------------------------------ the table: setup + launch per op */

static double tol_of(const op_entry *e, zoff_dtype dt) { return e->tol[dt == ZOFF_F32 ? 0 : dt == ZOFF_BF16 ? 1 : 2]; }

/* embed_fwd: shape (B, T, C, V, maxT) */
static void setup_embed_fwd(tcase *c) {
    int64_t B = c->d[0], T = c->d[1], C = c->d[2], V = c->d[3], maxT = c->d[4];
    tensor *out = add_t(c, "out", T_OUT, c->dt, B * T * C);
    tensor *tok = add_t(c, "tokens", T_IN, ZOFF_I32, B * T);
    tensor *wte = add_t(c, "wte", T_IN, c->dt, V * C);
    tensor *wpe = add_t(c, "wpe", T_IN, c->dt, maxT * C);
    for (int64_t i = 0; i < B * T; i++) tok->host[i] = (double)rng_int(&c->r, V);
    fill_normal(c, wte, 0, 1);
    fill_normal(c, wpe, 0, 0.5);
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t k = 0; k < C; k++)
            out->ref[i * C + k] = wte->host[(int64_t)tok->host[i] * C + k] + wpe->host[(i % T) * C + k];
}
static zoff_status launch_embed_fwd(tcase *c, zoff_stream *s) {
    zoff_op_embed_fwd_args a = {.out = P(c, 0), .tokens = P(c, 1), .wte = P(c, 2), .wpe = P(c, 3),
                                .B = c->d[0], .T = c->d[1], .C = c->d[2], .V = c->d[3], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_EMBED_FWD, a);
}

static void setup_embed_bwd(tcase *c) {
    int64_t B = c->d[0], T = c->d[1], C = c->d[2], V = c->d[3], maxT = c->d[4];
    tensor *dwte = add_t(c, "dwte", T_INOUT, c->dt, V * C);
    tensor *dwpe = add_t(c, "dwpe", T_INOUT, c->dt, maxT * C);
    tensor *dout = add_t(c, "dout", T_IN, c->dt, B * T * C);
    tensor *tok = add_t(c, "tokens", T_IN, ZOFF_I32, B * T);
    fill_normal(c, dwte, 0, 1);
    fill_normal(c, dwpe, 0, 1);
    fill_normal(c, dout, 0, 1);
    for (int64_t i = 0; i < B * T; i++) tok->host[i] = (double)rng_int(&c->r, V);
    memcpy(dwte->ref, dwte->host, (size_t)(V * C) * sizeof(double));
    memcpy(dwpe->ref, dwpe->host, (size_t)(maxT * C) * sizeof(double));
    for (int64_t i = 0; i < B * T; i++)
        for (int64_t k = 0; k < C; k++) {
            dwte->ref[(int64_t)tok->host[i] * C + k] += dout->host[i * C + k];
            dwpe->ref[(i % T) * C + k] += dout->host[i * C + k];
        }
}
static zoff_status launch_embed_bwd(tcase *c, zoff_stream *s) {
    zoff_op_embed_bwd_args a = {.dwte = P(c, 0), .dwpe = P(c, 1), .dout = P(c, 2), .tokens = P(c, 3),
                                .B = c->d[0], .T = c->d[1], .C = c->d[2], .V = c->d[3], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_EMBED_BWD, a);
}

/* layernorm: shape (N, C) */
static void setup_ln_fwd(tcase *c) {
    int64_t N = c->d[0], C = c->d[1];
    tensor *out = add_t(c, "out", T_OUT, c->dt, N * C);
    tensor *mean = add_t(c, "mean", T_OUT, ZOFF_F32, N);
    tensor *rstd = add_t(c, "rstd", T_OUT, ZOFF_F32, N);
    tensor *inp = add_t(c, "inp", T_IN, c->dt, N * C);
    tensor *w = add_t(c, "weight", T_IN, c->dt, C);
    tensor *b = add_t(c, "bias", T_IN, c->dt, C);
    fill_normal(c, inp, 1.0, 2.0);
    fill_normal(c, w, 1.0, 0.3);
    fill_normal(c, b, 0, 0.3);
    ln_fwd_ref(out->ref, mean->ref, rstd->ref, inp->host, w->host, b->host, N, C);
}
static zoff_status launch_ln_fwd(tcase *c, zoff_stream *s) {
    zoff_op_layernorm_fwd_args a = {.out = P(c, 0), .mean = P(c, 1), .rstd = P(c, 2), .inp = P(c, 3),
                                    .weight = P(c, 4), .bias = P(c, 5), .N = c->d[0], .C = c->d[1], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_FWD, a);
}

/* layernorm backward: shape (N, C). LAYERNORM_BWD: dinp accumulates. RESIDUAL_LAYERNORM_BWD: dinp = dresid +
 * LayerNorm'(dout); variant 0: separate dresid; 1: dresid NULL (dinp starts as NaN: it must be written, not
 * accumulated); 2: dresid aliases dinp (accumulate in place). mean, rstd: the forward's fp32 statistics. */
static void setup_ln_bwd(tcase *c) {
    const bool res = c->e->op == ZOFF_OP_RESIDUAL_LAYERNORM_BWD;
    int64_t N = c->d[0], C = c->d[1];
    tensor *dinp = add_t(c, "dinp", res ? T_OUT : T_INOUT, c->dt, N * C);
    tensor *dres = res ? add_t(c, "dresid", T_IN, c->dt, N * C) : dinp;
    tensor *dw = add_t(c, "dweight", T_INOUT, c->dt, C);
    tensor *db = add_t(c, "dbias", T_INOUT, c->dt, C);
    tensor *dout = add_t(c, "dout", T_IN, c->dt, N * C);
    tensor *inp = add_t(c, "inp", T_IN, c->dt, N * C);
    tensor *w = add_t(c, "weight", T_IN, c->dt, C);
    tensor *mean = add_t(c, "mean", T_IN, ZOFF_F32, N);
    tensor *rstd = add_t(c, "rstd", T_IN, ZOFF_F32, N);
    fill_normal(c, dres, 0, 1);
    fill_normal(c, dw, 0, 1);
    fill_normal(c, db, 0, 1);
    fill_normal(c, dout, 0, 1);
    fill_normal(c, inp, 1.0, 2.0);
    fill_normal(c, w, 1.0, 0.3);
    if (res) {
        dres->null = c->variant == 1;
        if (c->variant == 2) dinp->alias = 1;
    }
    double *tmp = calloc((size_t)(N * C + 1), sizeof(double)), *bz = calloc((size_t)(C + 1), sizeof(double));
    ln_fwd_ref(tmp, mean->host, rstd->host, inp->host, w->host, bz, N, C);
    for (int64_t i = 0; i < N; i++) {
        mean->host[i] = quant(mean->host[i], ZOFF_F32);
        rstd->host[i] = quant(rstd->host[i], ZOFF_F32);
    }
    free(tmp);
    free(bz);
    if (!dres->null) memcpy(dinp->ref, dres->host, (size_t)(N * C) * sizeof(double));
    memcpy(dw->ref, dw->host, (size_t)C * sizeof(double));
    memcpy(db->ref, db->host, (size_t)C * sizeof(double));
    ln_bwd_ref(dinp->ref, dw->ref, db->ref, dout->host, inp->host, w->host, N, C);
}
static zoff_status launch_ln_bwd(tcase *c, zoff_stream *s) {
    zoff_op_layernorm_bwd_args a = {.dinp = P(c, 0), .dweight = P(c, 1), .dbias = P(c, 2), .dout = P(c, 3),
                                    .inp = P(c, 4), .weight = P(c, 5), .mean = P(c, 6), .rstd = P(c, 7),
                                    .N = c->d[0], .C = c->d[1], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_BWD, a);
}

/* residual + layernorm: shape (N, C). resid = a + b rounded to dt (what the device stores), then the
 * LayerNorm of those stored values. variant 0: separate resid; 1: resid aliases a; 2: resid aliases b */
static void setup_resid_ln_fwd(tcase *c) {
    int64_t N = c->d[0], C = c->d[1];
    tensor *resid = add_t(c, "resid", T_OUT, c->dt, N * C);
    tensor *out = add_t(c, "out", T_OUT, c->dt, N * C);
    tensor *mean = add_t(c, "mean", T_OUT, ZOFF_F32, N);
    tensor *rstd = add_t(c, "rstd", T_OUT, ZOFF_F32, N);
    tensor *a = add_t(c, "a", T_IN, c->dt, N * C);
    tensor *b = add_t(c, "b", T_IN, c->dt, N * C);
    tensor *w = add_t(c, "weight", T_IN, c->dt, C);
    tensor *bias = add_t(c, "bias", T_IN, c->dt, C);
    fill_normal(c, a, 1.0, 2.0);
    fill_normal(c, b, -0.5, 1.0);
    fill_normal(c, w, 1.0, 0.3);
    fill_normal(c, bias, 0, 0.3);
    if (c->variant) resid->alias = 3 + c->variant;
    for (int64_t i = 0; i < N * C; i++) resid->ref[i] = quant(a->host[i] + b->host[i], c->dt);
    ln_fwd_ref(out->ref, mean->ref, rstd->ref, resid->ref, w->host, bias->host, N, C);
}
static zoff_status launch_resid_ln_fwd(tcase *c, zoff_stream *s) {
    zoff_op_residual_layernorm_fwd_args a = {.resid = P(c, 0), .out = P(c, 1), .mean = P(c, 2), .rstd = P(c, 3),
                                             .a = P(c, 4), .b = P(c, 5), .weight = P(c, 6), .bias = P(c, 7),
                                             .N = c->d[0], .C = c->d[1], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_FWD, a);
}

static zoff_status launch_resid_ln_bwd(tcase *c, zoff_stream *s) {
    zoff_op_residual_layernorm_bwd_args a = {.dinp = P(c, 0), .dresid = P(c, 1), .dweight = P(c, 2),
                                             .dbias = P(c, 3), .dout = P(c, 4), .inp = P(c, 5), .weight = P(c, 6),
                                             .mean = P(c, 7), .rstd = P(c, 8), .N = c->d[0], .C = c->d[1],
                                             .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_BWD, a);
}

/* matmul: shape (N, C, OC); fwd variant 1: no bias */
static void setup_mm_fwd(tcase *c) {
    int64_t N = c->d[0], C = c->d[1], OC = c->d[2];
    tensor *out = add_t(c, "out", T_OUT, c->dt, N * OC);
    tensor *inp = add_t(c, "inp", T_IN, c->dt, N * C);
    tensor *w = add_t(c, "weight", T_IN, c->dt, OC * C);
    tensor *b = add_t(c, "bias", T_IN, c->dt, OC);
    fill_normal(c, inp, 0, 1);
    fill_normal(c, w, 0, 0.2);
    fill_normal(c, b, 0, 1);
    b->null = c->variant == 1;
    mm_fwd_ref(out->ref, inp->host, w->host, b->null ? NULL : b->host, N, C, OC);
}
static zoff_status launch_mm_fwd(tcase *c, zoff_stream *s) {
    zoff_op_matmul_fwd_args a = {.out = P(c, 0), .inp = P(c, 1), .weight = P(c, 2), .bias = P(c, 3),
                                 .N = c->d[0], .C = c->d[1], .OC = c->d[2], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, a);
}

/* The six tensors of matmul backward (dinp, dweight, dbias, dout, inp, weight) into t, filled, with the
 * references of the accumulated outputs set to their initial values (dinp's to 0 when kind is T_OUT:
 * overwritten, starting as NaN on the device). */
static void mm_bwd_tensors(tcase *c, int dinp_kind, tensor **t) {
    int64_t N = c->d[0], C = c->d[1], OC = c->d[2];
    t[0] = add_t(c, "dinp", dinp_kind, c->dt, N * C);
    t[1] = add_t(c, "dweight", T_INOUT, c->dt, OC * C);
    t[2] = add_t(c, "dbias", T_INOUT, c->dt, OC);
    t[3] = add_t(c, "dout", T_IN, c->dt, N * OC);
    t[4] = add_t(c, "inp", T_IN, c->dt, N * C);
    t[5] = add_t(c, "weight", T_IN, c->dt, OC * C);
    for (int i = 0; i < 6; i++) fill_normal(c, t[i], 0, i == 5 ? 0.2 : 1);
    if (dinp_kind == T_OUT) memset(t[0]->ref, 0, (size_t)(N * C) * sizeof(double));
    else memcpy(t[0]->ref, t[0]->host, (size_t)(N * C) * sizeof(double));
    memcpy(t[1]->ref, t[1]->host, (size_t)(OC * C) * sizeof(double));
    memcpy(t[2]->ref, t[2]->host, (size_t)OC * sizeof(double));
}

/* variant 1: dinp NULL; variant 2: dbias NULL */
static void setup_mm_bwd(tcase *c) {
    tensor *t[6];
    mm_bwd_tensors(c, T_INOUT, t);
    t[0]->null = c->variant == 1;
    t[2]->null = c->variant == 2;
    mm_bwd_ref(t[0]->null ? NULL : t[0]->ref, t[1]->ref, t[2]->null ? NULL : t[2]->ref, t[3]->host, t[4]->host,
               t[5]->host, c->d[0], c->d[1], c->d[2]);
}
static zoff_status launch_mm_bwd(tcase *c, zoff_stream *s) {
    zoff_op_matmul_bwd_args a = {.dinp = P(c, 0), .dweight = P(c, 1), .dbias = P(c, 2), .dout = P(c, 3),
                                 .inp = P(c, 4), .weight = P(c, 5), .N = c->d[0], .C = c->d[1], .OC = c->d[2],
                                 .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, a);
}

/* matmul + GELU epilogue, forward: out = the pre-activation, gelu_out = GELU(out); variant 1: no bias */
static void setup_mm_gelu_fwd(tcase *c) {
    setup_mm_fwd(c);
    const int64_t n = c->d[0] * c->d[2];
    tensor *g = add_t(c, "gelu_out", T_OUT, c->dt, n);
    for (int64_t i = 0; i < n; i++) g->ref[i] = gelu_ref(c->t[0].ref[i]);
}
static zoff_status launch_mm_gelu_fwd(tcase *c, zoff_stream *s) {
    zoff_op_matmul_fwd_args a = {.out = P(c, 0), .inp = P(c, 1), .weight = P(c, 2), .bias = P(c, 3),
                                 .N = c->d[0], .C = c->d[1], .OC = c->d[2], .dt = c->dt, .gelu_out = P(c, 4)};
    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, a);
}

/* matmul backward with dinp overwritten (it starts as NaN: beta = 0 must not read it) and the GELU
 * epilogue: dinp = (dout @ W) * GELU'(gelu_pre), dbias_pre += its column sums.
 * variant 0: all; 1: dbias_pre NULL; 2: dbias NULL; 3: no GELU (overwrite only) */
static void setup_mm_gelu_bwd(tcase *c) {
    int64_t N = c->d[0], C = c->d[1];
    tensor *t[6];
    mm_bwd_tensors(c, T_OUT, t);
    tensor *pre = add_t(c, "gelu_pre", T_IN, c->dt, N * C);
    tensor *dbp = add_t(c, "dbias_pre", T_INOUT, c->dt, C);
    fill_normal(c, pre, 0, 2);
    fill_normal(c, dbp, 0, 1);
    t[2]->null = c->variant == 2;
    pre->null = c->variant == 3;
    dbp->null = c->variant == 1 || c->variant == 3;
    memcpy(dbp->ref, dbp->host, (size_t)C * sizeof(double));
    mm_bwd_ref(t[0]->ref, t[1]->ref, t[2]->null ? NULL : t[2]->ref, t[3]->host, t[4]->host, t[5]->host, N, C, c->d[2]);
    if (pre->null) return;
    for (int64_t i = 0; i < N * C; i++) {
        t[0]->ref[i] *= gelu_grad_ref(pre->host[i]);
        dbp->ref[i % C] += t[0]->ref[i];
    }
}
static zoff_status launch_mm_gelu_bwd(tcase *c, zoff_stream *s) {
    zoff_op_matmul_bwd_args a = {.dinp = P(c, 0), .dweight = P(c, 1), .dbias = P(c, 2), .dout = P(c, 3),
                                 .inp = P(c, 4), .weight = P(c, 5), .N = c->d[0], .C = c->d[1], .OC = c->d[2],
                                 .dt = c->dt, .dinp_overwrite = 1, .gelu_pre = P(c, 6), .dbias_pre = P(c, 7)};
    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, a);
}

/* attention: shape (B, T, C, NH) */
static void setup_attn_fwd(tcase *c) {
    int64_t B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
    tensor *out = add_t(c, "out", T_OUT, c->dt, B * T * C);
    tensor *lse = add_t(c, "lse", T_OUT, ZOFF_F32, B * NH * T);
    tensor *qkv = add_t(c, "qkv", T_IN, c->dt, B * T * 3 * C);
    fill_normal(c, qkv, 0, 1.5);
    attn_fwd_ref(out->ref, lse->ref, qkv->host, B, T, C, NH);
}
static zoff_status launch_attn_fwd(tcase *c, zoff_stream *s) {
    zoff_op_attention_fwd_args a = {.out = P(c, 0), .lse = P(c, 1), .qkv = P(c, 2),
                                    .B = c->d[0], .T = c->d[1], .C = c->d[2], .NH = c->d[3], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, a);
}

static void setup_attn_bwd(tcase *c) {
    int64_t B = c->d[0], T = c->d[1], C = c->d[2], NH = c->d[3];
    tensor *dqkv = add_t(c, "dqkv", T_OUT, c->dt, B * T * 3 * C);
    tensor *dout = add_t(c, "dout", T_IN, c->dt, B * T * C);
    tensor *qkv = add_t(c, "qkv", T_IN, c->dt, B * T * 3 * C);
    tensor *out = add_t(c, "out", T_IN, c->dt, B * T * C);
    tensor *lse = add_t(c, "lse", T_IN, ZOFF_F32, B * NH * T);
    fill_normal(c, dout, 0, 1);
    fill_normal(c, qkv, 0, 1.5);
    attn_fwd_ref(out->host, lse->host, qkv->host, B, T, C, NH);
    for (int64_t i = 0; i < out->n; i++) out->host[i] = quant(out->host[i], c->dt);
    for (int64_t i = 0; i < lse->n; i++) lse->host[i] = quant(lse->host[i], ZOFF_F32);
    attn_bwd_ref(dqkv->ref, dout->host, qkv->host, B, T, C, NH);
}
static zoff_status launch_attn_bwd(tcase *c, zoff_stream *s) {
    zoff_op_attention_bwd_args a = {.dqkv = P(c, 0), .dout = P(c, 1), .qkv = P(c, 2), .out = P(c, 3),
                                    .lse = P(c, 4), .B = c->d[0], .T = c->d[1], .C = c->d[2], .NH = c->d[3],
                                    .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_BWD, a);
}

/* elementwise: shape (n) */
static void setup_gelu_fwd(tcase *c) {
    int64_t n = c->d[0];
    tensor *out = add_t(c, "out", T_OUT, c->dt, n);
    tensor *inp = add_t(c, "inp", T_IN, c->dt, n);
    fill_normal(c, inp, 0, 3);
    for (int64_t i = 0; i < n; i++) out->ref[i] = gelu_ref(inp->host[i]);
}
static zoff_status launch_gelu_fwd(tcase *c, zoff_stream *s) {
    zoff_op_gelu_fwd_args a = {.out = P(c, 0), .inp = P(c, 1), .n = c->d[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, a);
}

/* variant 1: dinp aliases dout */
static void setup_gelu_bwd(tcase *c) {
    int64_t n = c->d[0];
    tensor *dinp = add_t(c, "dinp", T_OUT, c->dt, n);
    tensor *inp = add_t(c, "inp", T_IN, c->dt, n);
    tensor *dout = add_t(c, "dout", T_IN, c->dt, n);
    fill_normal(c, inp, 0, 3);
    fill_normal(c, dout, 0, 1);
    if (c->variant == 1) dinp->alias = 2;
    for (int64_t i = 0; i < n; i++) dinp->ref[i] = gelu_grad_ref(inp->host[i]) * dout->host[i];
}
static zoff_status launch_gelu_bwd(tcase *c, zoff_stream *s) {
    zoff_op_gelu_bwd_args a = {.dinp = P(c, 0), .inp = P(c, 1), .dout = P(c, 2), .n = c->d[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_GELU_BWD, a);
}

/* variant 1: out aliases a; variant 2: out aliases b */
static void setup_add(tcase *c) {
    int64_t n = c->d[0];
    tensor *out = add_t(c, "out", T_OUT, c->dt, n);
    tensor *a = add_t(c, "a", T_IN, c->dt, n);
    tensor *b = add_t(c, "b", T_IN, c->dt, n);
    fill_normal(c, a, 0, 1);
    fill_normal(c, b, 0, 1);
    if (c->variant) out->alias = c->variant;
    for (int64_t i = 0; i < n; i++) out->ref[i] = a->host[i] + b->host[i];
}
static zoff_status launch_add(tcase *c, zoff_stream *s) {
    zoff_op_add_args a = {.out = P(c, 0), .a = P(c, 1), .b = P(c, 2), .n = c->d[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_ADD, a);
}

/* cross entropy: shape (N, V, Vp); about one row in five ignored (target -1).
 * variant 0: separate dlogits; 1: dlogits aliases logits; 2: no dlogits */
static void setup_ce(tcase *c) {
    int64_t N = c->d[0], V = c->d[1], Vp = c->d[2];
    tensor *losses = add_t(c, "losses", T_OUT, ZOFF_F32, N);
    tensor *dl = add_t(c, "dlogits", T_OUT, c->dt, N * Vp);
    tensor *logits = add_t(c, "logits", T_IN, c->dt, N * Vp);
    tensor *tg = add_t(c, "targets", T_IN, ZOFF_I32, N);
    fill_normal(c, logits, 0, 3);
    for (int64_t i = 0; i < N; i++) {
        for (int64_t j = V; j < Vp; j++) set_host(logits, i * Vp + j, 1e4); /* padding: must be ignored */
        tg->host[i] = (N > 1 && rng_int(&c->r, 5) == 0) || (N > 2 && i == 1) ? -1 : (double)rng_int(&c->r, V);
    }
    if (c->variant == 1) dl->alias = 2;
    dl->null = c->variant == 2;
    c->f[0] = 0.37f;
    ce_ref(losses->ref, dl->ref, logits->host, tg->host, N, V, Vp, (double)c->f[0]);
}
static zoff_status launch_ce(tcase *c, zoff_stream *s) {
    zoff_op_cross_entropy_args a = {.losses = P(c, 0), .dlogits = P(c, 1), .logits = P(c, 2), .targets = P(c, 3),
                                    .N = c->d[0], .V = c->d[1], .Vp = c->d[2], .dloss = c->f[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_CROSS_ENTROPY, a);
}

/* cast: shape (n); c->dt is the source dtype, variant the destination dtype.
 * Inputs include ties, subnormals, overflow, inf and NaN. */
static void setup_cast(tcase *c) {
    int64_t n = c->d[0];
    zoff_dtype dst_dt = (zoff_dtype)c->variant;
    tensor *dst = add_t(c, "dst", T_OUT, dst_dt, n);
    tensor *src = add_t(c, "src", T_IN, c->dt, n);
    dst->exact = true;
    static const double special[] = {0.0, -0.0, 1.0, -1.0, 1.0 + 0x1p-8, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-8,
                                     1.0 + 0x1p-12, 1.0 + 3 * 0x1p-12, 65504.0, 65520.0, 70000.0, -1e6,
                                     0x1p-24, 0x1p-25, 0x1.8p-24, 0x1p-14, 0x1p-130, 3e38, INFINITY, -INFINITY, NAN,
                                     1e-40, 0.1, 1.0 / 3.0};
    const int64_t ns = (int64_t)(sizeof special / sizeof special[0]);
    for (int64_t i = 0; i < n; i++) {
        double v = i < ns ? special[i] : rng_normal(&c->r) * ldexp(1.0, (int)rng_int(&c->r, 40) - 20);
        src->host[i] = quant(v, c->dt);
    }
    for (int64_t i = 0; i < n; i++) dst->ref[i] = quant(src->host[i], dst_dt);
}
static zoff_status launch_cast(tcase *c, zoff_stream *s) {
    zoff_op_cast_args a = {.dst = P(c, 0), .src = P(c, 1), .n = c->d[0], .dst_dt = (zoff_dtype)c->variant,
                           .src_dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_CAST, a);
}

static void setup_scale(tcase *c) {
    int64_t n = c->d[0];
    tensor *x = add_t(c, "x", T_INOUT, c->dt, n);
    fill_normal(c, x, 0, 1);
    c->f[0] = -0.6180339f;
    for (int64_t i = 0; i < n; i++) x->ref[i] = x->host[i] * (double)c->f[0];
}
static zoff_status launch_scale(tcase *c, zoff_stream *s) {
    zoff_op_scale_args a = {.x = P(c, 0), .alpha = c->f[0], .n = c->d[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_SCALE, a);
}

static void setup_grad_stats(tcase *c) {
    int64_t n = c->d[0];
    tensor *st = add_t(c, "stats", T_INOUT, ZOFF_F32, 2);
    tensor *x = add_t(c, "x", T_IN, c->dt, n);
    fill_normal(c, x, 0.1, 2);
    st->host[0] = 1.5;
    st->host[1] = 0;
    double s = 1.5;
    for (int64_t i = 0; i < n; i++) s += x->host[i] * x->host[i];
    st->ref[0] = s;
    st->ref[1] = 0;
}
static zoff_status launch_grad_stats(tcase *c, zoff_stream *s) {
    zoff_op_grad_stats_args a = {.stats = P(c, 0), .x = P(c, 1), .n = c->d[0], .dt = c->dt};
    return ZOFF_LAUNCH(s, ZOFF_OP_GRAD_STATS, a);
}

/* adam: shape (n); c->dt is grad_dt; params16 has dtype dt when dt is 16-bit (else NULL).
 * variant 0: AdamW; 1: Adam with L2 decay; 2: AdamW, no bias correction, no params16 */
static void setup_adam(tcase *c) {
    int64_t n = c->d[0];
    tensor *p = add_t(c, "params", T_INOUT, ZOFF_F32, n);
    tensor *m = add_t(c, "m", T_INOUT, ZOFF_F32, n);
    tensor *v = add_t(c, "v", T_INOUT, ZOFF_F32, n);
    tensor *g = add_t(c, "grads", T_IN, c->dt, n);
    zoff_dtype p16dt = c->dt == ZOFF_F32 ? ZOFF_BF16 : c->dt;
    tensor *p16 = add_t(c, "params16", T_OUT, p16dt, n);
    p16->null = c->dt == ZOFF_F32 || c->variant == 2;
    fill_normal(c, p, 0, 1);
    fill_normal(c, m, 0, 0.1);
    fill_normal(c, g, 0, 1);
    for (int64_t i = 0; i < n; i++) v->host[i] = quant(fabs(rng_normal(&c->r)) * 0.01, ZOFF_F32);
    float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float bc1 = c->variant == 2 ? 1.0f : 1.0f - powf(b1, 3), bc2 = c->variant == 2 ? 1.0f : 1.0f - powf(b2, 3);
    float f[] = {lr, b1, b2, eps, wd, bc1, bc2, gs};
    memcpy(c->f, f, sizeof f);
    c->iv = c->variant != 1;
    for (int64_t i = 0; i < n; i++) {
        double pi = p->host[i], gi = g->host[i] * gs;
        if (!c->iv) gi += (double)wd * pi;
        double mi = (double)b1 * m->host[i] + (1 - (double)b1) * gi;
        double vi = (double)b2 * v->host[i] + (1 - (double)b2) * gi * gi;
        if (c->iv) pi -= (double)lr * (double)wd * pi;
        pi -= (double)lr * (mi / (double)bc1) / (sqrt(vi / (double)bc2) + (double)eps);
        p->ref[i] = pi;
        m->ref[i] = mi;
        v->ref[i] = vi;
        p16->ref[i] = quant(pi, p16dt);
    }
}
static zoff_status launch_adam(tcase *c, zoff_stream *s) {
    zoff_op_adam_args a = {.params = P(c, 0), .m = P(c, 1), .v = P(c, 2), .grads = P(c, 3), .params16 = P(c, 4),
                           .n = c->d[0], .grad_dt = c->dt, .p16_dt = c->t[4].dt,
                           .lr = c->f[0], .beta1 = c->f[1], .beta2 = c->f[2], .eps = c->f[3],
                           .weight_decay = c->f[4], .bc1 = c->f[5], .bc2 = c->f[6], .grad_scale = c->f[7],
                           .adam_w_mode = c->iv};
    return ZOFF_LAUNCH(s, ZOFF_OP_ADAM, a);
}

#define FLAT_SHAPES 7, {{0}, {1}, {7}, {1000}, {1025}, {20001}, {70001}}

static const op_entry g_ops[] = {
    {"embed_fwd", ZOFF_OP_EMBED_FWD, setup_embed_fwd, launch_embed_fwd, 5,
     {{0, 3, 4, 5, 3}, {1, 1, 1, 1, 1}, {2, 5, 7, 11, 6}, {3, 17, 33, 13, 20}, {4, 64, 96, 50, 64}}, 1,
     {1e-6, 8e-3, 2e-3}},
    {"embed_bwd", ZOFF_OP_EMBED_BWD, setup_embed_bwd, launch_embed_bwd, 5,
     {{0, 3, 4, 5, 3}, {1, 1, 1, 1, 1}, {2, 5, 7, 11, 6}, {3, 17, 33, 13, 20}, {4, 64, 96, 50, 64}}, 1,
     {1e-5, 8e-3, 2e-3}},
    {"layernorm_fwd", ZOFF_OP_LAYERNORM_FWD, setup_ln_fwd, launch_ln_fwd, 6,
     {{0, 8}, {1, 1}, {5, 7}, {33, 65}, {64, 768}, {3, 1}}, 1, {2e-5, 8e-3, 2e-3}},
    {"layernorm_bwd", ZOFF_OP_LAYERNORM_BWD, setup_ln_bwd, launch_ln_bwd, 6,
     {{0, 8}, {1, 1}, {5, 7}, {33, 65}, {64, 768}, {3, 1}}, 1, {2e-5, 1e-2, 3e-3}},
    {"matmul_fwd", ZOFF_OP_MATMUL_FWD, setup_mm_fwd, launch_mm_fwd, 7,
     {{0, 3, 4}, {1, 1, 1}, {5, 7, 3}, {33, 65, 17}, {64, 128, 384}, {7, 0, 5}, {3, 4, 0}}, 2, {2e-5, 8e-3, 2e-3}},
    {"matmul_bwd", ZOFF_OP_MATMUL_BWD, setup_mm_bwd, launch_mm_bwd, 7,
     {{0, 3, 4}, {1, 1, 1}, {5, 7, 3}, {33, 65, 17}, {64, 128, 384}, {7, 0, 5}, {3, 4, 0}}, 3, {2e-5, 8e-3, 2e-3}},
    /* the GELU / bias-gradient epilogues (fused on CUDA where the GELU matrix's ld is a multiple of 8): */
    {"matmul_gelu_fwd", ZOFF_OP_MATMUL_FWD, setup_mm_gelu_fwd, launch_mm_gelu_fwd, 7,
     {{0, 3, 8}, {1, 1, 1}, {5, 7, 3}, {33, 65, 24}, {64, 128, 384}, {7, 0, 8}, {3, 4, 0}}, 2, {2e-5, 8e-3, 2e-3}},
    {"matmul_gelu_bwd", ZOFF_OP_MATMUL_BWD, setup_mm_gelu_bwd, launch_mm_gelu_bwd, 7,
     {{0, 8, 4}, {1, 1, 1}, {5, 7, 3}, {33, 24, 65}, {64, 384, 128}, {7, 0, 5}, {3, 8, 0}}, 4, {2e-5, 8e-3, 2e-3}},
    {"attention_fwd", ZOFF_OP_ATTENTION_FWD, setup_attn_fwd, launch_attn_fwd, 6,
     {{0, 4, 8, 2}, {1, 1, 4, 1}, {1, 1, 4, 4}, {2, 5, 12, 3}, {1, 67, 32, 2}, {2, 130, 64, 4}}, 1,
     {2e-5, 1e-2, 3e-3}},
    {"attention_bwd", ZOFF_OP_ATTENTION_BWD, setup_attn_bwd, launch_attn_bwd, 6,
     {{0, 4, 8, 2}, {1, 1, 4, 1}, {1, 1, 4, 4}, {2, 5, 12, 3}, {1, 67, 32, 2}, {2, 130, 64, 4}}, 1,
     {5e-5, 1.5e-2, 4e-3}},
    /* the tensor-core kernels (bf16/f16, head size 64 and 128; f32 runs the fp32 kernels): T = 1, T not a
     * multiple of the 64-row tiles, many heads */
    {"attention_mma_fwd", ZOFF_OP_ATTENTION_FWD, setup_attn_fwd, launch_attn_fwd, 6,
     {{1, 1, 64, 1}, {2, 67, 128, 2}, {1, 130, 128, 1}, {1, 1, 256, 2}, {1, 80, 256, 2}, {1, 20, 768, 12}}, 1,
     {2e-5, 1e-2, 3e-3}},
    {"attention_mma_bwd", ZOFF_OP_ATTENTION_BWD, setup_attn_bwd, launch_attn_bwd, 6,
     {{1, 1, 64, 1}, {2, 67, 128, 2}, {1, 130, 128, 1}, {1, 1, 256, 2}, {1, 80, 256, 2}, {1, 20, 768, 12}}, 1,
     {5e-5, 1.5e-2, 4e-3}},
    {"gelu_fwd", ZOFF_OP_GELU_FWD, setup_gelu_fwd, launch_gelu_fwd, FLAT_SHAPES, 1, {1e-6, 8e-3, 2e-3}},
    {"gelu_bwd", ZOFF_OP_GELU_BWD, setup_gelu_bwd, launch_gelu_bwd, FLAT_SHAPES, 2, {1e-5, 8e-3, 2e-3}},
    {"add", ZOFF_OP_ADD, setup_add, launch_add, FLAT_SHAPES, 3, {1e-6, 8e-3, 2e-3}},
    /* Vp a multiple of 16 bytes or not (the CUDA kernel's 16-byte packs), V not a multiple of a pack,
     * whole padding packs (13 of 24), rows longer than one pack per thread (9000) */
    {"cross_entropy", ZOFF_OP_CROSS_ENTROPY, setup_ce, launch_ce, 8,
     {{0, 5, 8}, {1, 1, 1}, {1, 7, 7}, {3, 5, 8}, {5, 13, 24}, {17, 100, 128}, {64, 1000, 1024}, {3, 9000, 9024}},
     3, {2e-5, 8e-3, 2e-3}},
    {"cast", ZOFF_OP_CAST, setup_cast, launch_cast, FLAT_SHAPES, 3, {0, 0, 0}},
    {"scale", ZOFF_OP_SCALE, setup_scale, launch_scale, FLAT_SHAPES, 1, {1e-6, 8e-3, 2e-3}},
    {"grad_stats", ZOFF_OP_GRAD_STATS, setup_grad_stats, launch_grad_stats, FLAT_SHAPES, 1, {1e-6, 1e-6, 1e-6}},
    {"adam", ZOFF_OP_ADAM, setup_adam, launch_adam, FLAT_SHAPES, 3, {1e-5, 8e-3, 2e-3}},
    /* N = 1; C not a multiple of the 16-byte pack (7, 65, 100 for 16-bit, 1030) next to 768 */
    {"residual_layernorm_fwd", ZOFF_OP_RESIDUAL_LAYERNORM_FWD, setup_resid_ln_fwd, launch_resid_ln_fwd, 8,
     {{0, 8}, {1, 1}, {1, 768}, {5, 7}, {33, 65}, {64, 768}, {3, 100}, {2, 1030}}, 3, {2e-5, 8e-3, 2e-3}},
    {"residual_layernorm_bwd", ZOFF_OP_RESIDUAL_LAYERNORM_BWD, setup_ln_bwd, launch_resid_ln_bwd, 8,
     {{0, 8}, {1, 1}, {1, 768}, {5, 7}, {33, 65}, {64, 768}, {3, 100}, {2, 1030}}, 3, {2e-5, 1e-2, 3e-3}},
};
#define NOPS ((int)(sizeof g_ops / sizeof g_ops[0]))

/* ------------------------------------------------------------------ harness */

static const zoff_backend_kind g_kinds[NBACK] = {ZOFF_BACKEND_CPU, ZOFF_BACKEND_CUDA};
static const zoff_dtype g_dts[3] = {ZOFF_F32, ZOFF_BF16, ZOFF_F16};

static zoff_device *make_device(zoff_backend_kind kind, int threads) {
    zoff_device_options o = {.kind = kind, .threads = threads};
    zoff_device *dev = NULL;
    zoff_status st = zoff_device_create(&o, &dev);
    if (st != ZOFF_OK) fail_msg("zoff_device_create(%d): %s", (int)kind, zoff_last_error());
    return dev;
}

static void shape_str(const int64_t *d, int nd, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < nd && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, i ? ",%lld" : "%lld", (long long)d[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
}

static void test_op(void **state) {
    const op_entry *e = *state;
    zoff_device *devs[NBACK] = {0};
    for (int b = 0; b < NBACK; b++)
        if (zoff_backend_available(g_kinds[b])) devs[b] = make_device(g_kinds[b], 0);
    assert_non_null(devs[0]);
    const char *req = getenv("ZOFF_TEST_REQUIRE_CUDA");
    if (req && *req == '1' && !devs[1]) fail_msg("%s: ZOFF_TEST_REQUIRE_CUDA=1 but no CUDA backend is available", e->name);
    int failures = 0, runs = 0;
    double worst[NBACK][3] = {{0}};
    for (int si = 0; si < e->nshapes; si++)
        for (int di = 0; di < 3; di++)
            for (int var = 0; var < e->nvariants; var++) {
                tcase c;
                memset(&c, 0, sizeof c);
                c.e = e;
                c.d = e->shapes[si];
                c.dt = g_dts[di];
                c.variant = var;
                c.r.s = 0x5eed0000ull + (uint64_t)(si * 131 + di * 17 + var) + (uint64_t)e->op * 100003ull;
                e->setup(&c);
                const double tol = tol_of(e, c.dt);
                char shp[96];
                shape_str(c.d, 5, shp, sizeof shp);
                for (int b = 0; b < NBACK; b++) {
                    if (!devs[b]) continue;
                    zoff_status st = exec_case(devs[b], &c, b);
                    runs++;
                    if (st != ZOFF_OK) {
                        print_error("%s %s dt=%s variant=%d on %s: %s: %s\n", e->name, shp, zoff_dtype_name(c.dt), var,
                                    zoff_device_name(devs[b]), zoff_status_name(st), zoff_last_error());
                        failures++;
                        continue;
                    }
                    for (int i = 0; i < c.nt; i++) {
                        tensor *t = &c.t[i];
                        if (t->null || t->kind == T_IN) continue;
                        double err = norm_err(t->got[b], t->ref, t->n, t->exact || tol == 0);
                        if (t->exact || tol == 0) err = err == 0 ? 0 : INFINITY;
                        if (err > worst[b][di] || isnan(err)) worst[b][di] = err;
                        if (!(err <= tol)) {
                            print_error("%s %s dt=%s variant=%d on %s: %s normalised error %.3g > %.3g\n", e->name, shp,
                                        zoff_dtype_name(c.dt), var, zoff_device_name(devs[b]), t->name, err, tol);
                            for (int64_t k = 0; k < t->n; k++)
                                if (!(fabs(t->got[b][k] - t->ref[k]) <= tol * fabs(t->ref[k]) + 1e-30) &&
                                    !(isnan(t->got[b][k]) && isnan(t->ref[k]))) {
                                    print_error("    first mismatch at %lld: got %.9g want %.9g\n", (long long)k,
                                                t->got[b][k], t->ref[k]);
                                    break;
                                }
                            failures++;
                        }
                        if (b > 0) { /* compare with the CPU backend */
                            double e2 = norm_err(t->got[b], t->got[0], t->n, t->exact || tol == 0);
                            if (!(e2 <= (tol == 0 ? 0 : 2 * tol))) {
                                print_error("%s %s dt=%s variant=%d: %s differs from the CPU backend by %.3g\n",
                                            e->name, shp, zoff_dtype_name(c.dt), var, t->name, e2);
                                failures++;
                            }
                        }
                    }
                }
                case_free(&c);
            }
    for (int b = 0; b < NBACK; b++)
        if (devs[b])
            print_message("  %-14s %-28s max normalised error f32 %.2e (limit %.2g)  bf16 %.2e (%.2g)  f16 %.2e (%.2g)\n",
                          e->name, zoff_device_name(devs[b]), worst[b][0], e->tol[0], worst[b][1], e->tol[1],
                          worst[b][2], e->tol[2]);
    for (int b = 0; b < NBACK; b++)
        if (devs[b]) zoff_device_destroy(devs[b]);
    assert_true(runs > 0);
    assert_int_equal(failures, 0);
}

/* ------------------------------------------------------------------ the references against finite differences */

typedef struct fd_ctx {
    int op;
    int64_t d[4];
    double *x[3];   /* inputs being differentiated */
    const double *w; /* random weights of the scalar loss L = sum(out * w) */
    const double *aux; /* targets (cross entropy), tokens (embedding) */
} fd_ctx;

/* L = sum(forward(x) * w) in double */
static double fd_loss(const fd_ctx *f) {
    int64_t n = 0;
    double *out = NULL, L = 0;
    switch (f->op) {
    case 0: /* layernorm (N,C): x0 inp, x1 weight, x2 bias */
        n = f->d[0] * f->d[1];
        out = malloc((size_t)n * sizeof(double));
        ln_fwd_ref(out, NULL, NULL, f->x[0], f->x[1], f->x[2], f->d[0], f->d[1]);
        break;
    case 1: /* matmul (N,C,OC): x0 inp, x1 weight, x2 bias */
        n = f->d[0] * f->d[2];
        out = malloc((size_t)n * sizeof(double));
        mm_fwd_ref(out, f->x[0], f->x[1], f->x[2], f->d[0], f->d[1], f->d[2]);
        break;
    case 2: /* attention (B,T,C,NH): x0 qkv */
        n = f->d[0] * f->d[1] * f->d[2];
        out = malloc((size_t)n * sizeof(double));
        attn_fwd_ref(out, NULL, f->x[0], f->d[0], f->d[1], f->d[2], f->d[3]);
        break;
    case 3: /* gelu (n): x0 */
        n = f->d[0];
        out = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < n; i++) out[i] = gelu_ref(f->x[0][i]);
        break;
    case 4: /* cross entropy (N,V,V): x0 logits; L = sum losses * 0.37 */
        n = f->d[0];
        out = malloc((size_t)n * sizeof(double));
        ce_ref(out, NULL, f->x[0], f->aux, f->d[0], f->d[1], f->d[1], 1.0);
        for (int64_t i = 0; i < n; i++) L += out[i] * 0.37;
        free(out);
        return L;
    case 5: /* embedding (B,T,C,V): x0 wte, x1 wpe */
        n = f->d[0] * f->d[1] * f->d[2];
        out = malloc((size_t)n * sizeof(double));
        for (int64_t i = 0; i < f->d[0] * f->d[1]; i++)
            for (int64_t k = 0; k < f->d[2]; k++)
                out[i * f->d[2] + k] = f->x[0][(int64_t)f->aux[i] * f->d[2] + k] + f->x[1][(i % f->d[1]) * f->d[2] + k];
        break;
    }
    for (int64_t i = 0; i < n; i++) L += out[i] * f->w[i];
    free(out);
    return L;
}

static double fd_compare(fd_ctx *f, double *x, int64_t n, const double *analytic) {
    double md = 0, mr = 0;
    for (int64_t i = 0; i < n; i++) {
        double x0 = x[i], h = 1e-6 * (fabs(x0) > 1 ? fabs(x0) : 1);
        x[i] = x0 + h;
        double lp = fd_loss(f);
        x[i] = x0 - h;
        double lm = fd_loss(f);
        x[i] = x0;
        double g = (lp - lm) / (2 * h);
        if (fabs(g - analytic[i]) > md) md = fabs(g - analytic[i]);
        if (fabs(analytic[i]) > mr) mr = fabs(analytic[i]);
    }
    return md / (mr > 1e-30 ? mr : 1e-30);
}

static double *randv(rng *r, int64_t n, double mean, double sd) {
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (int64_t i = 0; i < n; i++) v[i] = mean + sd * rng_normal(r);
    return v;
}

static void test_reference_gradients(void **state) {
    (void)state;
    rng r = {42};
    const double lim = 1e-6;
    { /* layernorm */
        int64_t N = 3, C = 7;
        double *x = randv(&r, N * C, 1, 2), *w = randv(&r, C, 1, 0.3), *b = randv(&r, C, 0, 0.3);
        double *dy = randv(&r, N * C, 0, 1);
        double *dx = calloc((size_t)(N * C), 8), *dw = calloc((size_t)C, 8), *db = calloc((size_t)C, 8);
        ln_bwd_ref(dx, dw, db, dy, x, w, N, C);
        fd_ctx f = {.op = 0, .d = {N, C}, .x = {x, w, b}, .w = dy};
        assert_true(fd_compare(&f, x, N * C, dx) < lim);
        assert_true(fd_compare(&f, w, C, dw) < lim);
        assert_true(fd_compare(&f, b, C, db) < lim);
        free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db);
    }
    { /* matmul */
        int64_t N = 4, C = 5, OC = 3;
        double *x = randv(&r, N * C, 0, 1), *w = randv(&r, OC * C, 0, 1), *b = randv(&r, OC, 0, 1);
        double *dy = randv(&r, N * OC, 0, 1);
        double *dx = calloc((size_t)(N * C), 8), *dw = calloc((size_t)(OC * C), 8), *db = calloc((size_t)OC, 8);
        mm_bwd_ref(dx, dw, db, dy, x, w, N, C, OC);
        fd_ctx f = {.op = 1, .d = {N, C, OC}, .x = {x, w, b}, .w = dy};
        assert_true(fd_compare(&f, x, N * C, dx) < lim);
        assert_true(fd_compare(&f, w, OC * C, dw) < lim);
        assert_true(fd_compare(&f, b, OC, db) < lim);
        free(x), free(w), free(b), free(dy), free(dx), free(dw), free(db);
    }
    { /* attention */
        int64_t B = 2, T = 5, C = 6, NH = 2;
        double *qkv = randv(&r, B * T * 3 * C, 0, 1), *dy = randv(&r, B * T * C, 0, 1);
        double *dqkv = calloc((size_t)(B * T * 3 * C), 8);
        attn_bwd_ref(dqkv, dy, qkv, B, T, C, NH);
        fd_ctx f = {.op = 2, .d = {B, T, C, NH}, .x = {qkv}, .w = dy};
        assert_true(fd_compare(&f, qkv, B * T * 3 * C, dqkv) < lim);
        free(qkv), free(dy), free(dqkv);
    }
    { /* gelu */
        int64_t n = 50;
        double *x = randv(&r, n, 0, 3), *dy = randv(&r, n, 0, 1), *dx = malloc((size_t)n * 8);
        for (int64_t i = 0; i < n; i++) dx[i] = gelu_grad_ref(x[i]) * dy[i];
        fd_ctx f = {.op = 3, .d = {n}, .x = {x}, .w = dy};
        assert_true(fd_compare(&f, x, n, dx) < lim);
        free(x), free(dy), free(dx);
    }
    { /* cross entropy */
        int64_t N = 4, V = 9;
        double *l = randv(&r, N * V, 0, 2), tg[4] = {3, -1, 0, 8}, *losses = malloc((size_t)N * 8);
        double *dl = malloc((size_t)(N * V) * 8);
        ce_ref(losses, dl, l, tg, N, V, V, 0.37);
        fd_ctx f = {.op = 4, .d = {N, V}, .x = {l}, .aux = tg};
        assert_true(fd_compare(&f, l, N * V, dl) < lim);
        free(l), free(losses), free(dl);
    }
    { /* embedding */
        int64_t B = 2, T = 3, C = 4, V = 5;
        double *wte = randv(&r, V * C, 0, 1), *wpe = randv(&r, T * C, 0, 1), *dy = randv(&r, B * T * C, 0, 1);
        double tok[6] = {1, 4, 1, 0, 1, 3};
        double *dwte = calloc((size_t)(V * C), 8), *dwpe = calloc((size_t)(T * C), 8);
        for (int64_t i = 0; i < B * T; i++)
            for (int64_t k = 0; k < C; k++) {
                dwte[(int64_t)tok[i] * C + k] += dy[i * C + k];
                dwpe[(i % T) * C + k] += dy[i * C + k];
            }
        fd_ctx f = {.op = 5, .d = {B, T, C, V}, .x = {wte, wpe}, .w = dy, .aux = tok};
        assert_true(fd_compare(&f, wte, V * C, dwte) < lim);
        assert_true(fd_compare(&f, wpe, T * C, dwpe) < lim);
        free(wte), free(wpe), free(dy), free(dwte), free(dwpe);
    }
}

/* ------------------------------------------------------------------ edge cases */

static const op_entry *find_op(zoff_op op) {
    for (int i = 0; i < NOPS; i++)
        if (g_ops[i].op == op) return &g_ops[i];
    return NULL;
}

/* A token id out of range makes the stream fail with ZOFF_ERR_INVALID and a message naming it. */
static void test_embed_token_out_of_range(void **state) {
    (void)state;
    for (int b = 0; b < NBACK; b++) {
        if (!zoff_backend_available(g_kinds[b])) continue;
        for (int bwd = 0; bwd < 2; bwd++) {
            zoff_device *dev = make_device(g_kinds[b], 0);
            static const int64_t shape[5] = {2, 3, 4, 5, 3};
            tcase c;
            memset(&c, 0, sizeof c);
            c.e = find_op(bwd ? ZOFF_OP_EMBED_BWD : ZOFF_OP_EMBED_FWD);
            c.d = shape;
            c.dt = ZOFF_F32;
            c.r.s = 7;
            c.e->setup(&c);
            c.t[bwd ? 3 : 1].host[4] = 5; /* == V */
            zoff_status st = exec_case(dev, &c, b);
            assert_int_equal(st, ZOFF_ERR_INVALID);
            assert_non_null(strstr(zoff_last_error(), "token id 5"));
            case_free(&c);
            zoff_device_destroy(dev);
        }
    }
}

/* target >= V fails the stream; a negative target ignores the row. */
static void test_cross_entropy_bad_target(void **state) {
    (void)state;
    for (int b = 0; b < NBACK; b++) {
        if (!zoff_backend_available(g_kinds[b])) continue;
        zoff_device *dev = make_device(g_kinds[b], 0);
        static const int64_t shape[3] = {3, 5, 8};
        tcase c;
        memset(&c, 0, sizeof c);
        c.e = find_op(ZOFF_OP_CROSS_ENTROPY);
        c.d = shape;
        c.dt = ZOFF_F32;
        c.r.s = 9;
        c.e->setup(&c);
        c.t[3].host[2] = 5; /* == V */
        zoff_status st = exec_case(dev, &c, b);
        assert_int_equal(st, ZOFF_ERR_INVALID);
        assert_non_null(strstr(zoff_last_error(), "target 5"));
        case_free(&c);
        zoff_device_destroy(dev);
    }
}

/* GRAD_STATS flags inf and NaN (and never resets the flag); finite input leaves it. */
static void test_grad_stats_nonfinite(void **state) {
    (void)state;
    for (int b = 0; b < NBACK; b++) {
        if (!zoff_backend_available(g_kinds[b])) continue;
        zoff_device *dev = make_device(g_kinds[b], 0);
        for (int di = 0; di < 3; di++)
            for (int kind = 0; kind < 3; kind++) {
                static const int64_t shape[1] = {100000};
                tcase c;
                memset(&c, 0, sizeof c);
                c.e = find_op(ZOFF_OP_GRAD_STATS);
                c.d = shape;
                c.dt = g_dts[di];
                c.r.s = 11;
                c.e->setup(&c);
                if (kind == 0) c.t[1].host[77777] = INFINITY;
                if (kind == 1) c.t[1].host[3] = NAN;
                if (kind == 2) c.t[0].host[1] = 1.0; /* flag already set: finite input keeps it */
                assert_int_equal(exec_case(dev, &c, b), ZOFF_OK);
                assert_true(c.t[0].got[b][1] == 1.0);
                if (kind == 0) assert_true(isinf(c.t[0].got[b][0]));
                if (kind == 1) assert_true(isnan(c.t[0].got[b][0]));
                case_free(&c);
            }
        zoff_device_destroy(dev);
    }
}

/* The reductions give bit-identical results for any kernel thread count, and
 * every op is deterministic for a given thread count. */
static void test_deterministic_across_threads(void **state) {
    (void)state;
    static const struct { zoff_op op; int64_t d[5]; zoff_dtype dt; } cases[] = {
        {ZOFF_OP_MATMUL_BWD, {67, 96, 130}, ZOFF_F32},   {ZOFF_OP_MATMUL_BWD, {67, 96, 130}, ZOFF_BF16},
        {ZOFF_OP_LAYERNORM_BWD, {129, 200}, ZOFF_F32},   {ZOFF_OP_LAYERNORM_BWD, {129, 200}, ZOFF_BF16},
        {ZOFF_OP_EMBED_BWD, {4, 64, 96, 50, 64}, ZOFF_F32}, {ZOFF_OP_EMBED_BWD, {4, 64, 96, 50, 64}, ZOFF_BF16},
        {ZOFF_OP_GRAD_STATS, {300001}, ZOFF_F32},        {ZOFF_OP_ATTENTION_BWD, {2, 70, 32, 4}, ZOFF_F32},
        {ZOFF_OP_CROSS_ENTROPY, {33, 1000, 1024}, ZOFF_F32},
        {ZOFF_OP_RESIDUAL_LAYERNORM_BWD, {129, 200}, ZOFF_BF16},
    };
    const int threads[3] = {1, 2, 3};
    zoff_device *devs[3];
    for (int k = 0; k < 3; k++) devs[k] = make_device(ZOFF_BACKEND_CPU, threads[k]);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double *first[MAXT] = {0};
        for (int k = 0; k < 3; k++) {
            for (int rep = 0; rep < 2; rep++) {
                tcase c;
                memset(&c, 0, sizeof c);
                c.e = find_op(cases[i].op);
                c.d = cases[i].d;
                c.dt = cases[i].dt;
                c.r.s = 1234;
                c.e->setup(&c);
                assert_int_equal(exec_case(devs[k], &c, 0), ZOFF_OK);
                for (int t = 0; t < c.nt; t++) {
                    if (c.t[t].kind == T_IN || c.t[t].null) continue;
                    size_t bytes = (size_t)c.t[t].n * sizeof(double);
                    if (!first[t]) {
                        first[t] = malloc(bytes);
                        memcpy(first[t], c.t[t].got[0], bytes);
                    } else if (memcmp(first[t], c.t[t].got[0], bytes) != 0) {
                        fail_msg("%s: %s differs between runs / thread counts (threads=%d)", c.e->name, c.t[t].name,
                                 threads[k]);
                    }
                }
                case_free(&c);
            }
        }
        for (int t = 0; t < MAXT; t++) free(first[t]);
    }
    for (int k = 0; k < 3; k++) zoff_device_destroy(devs[k]);
}

/* ---- the fused residual ops against the unfused ones, bit for bit (the model relies on it: an activation-
 * checkpointing recomputation normalises the stored residual with LAYERNORM_FWD) */

/* n random values of dt (mean mu, sd 1), encoded into a new host buffer */
static void *rand_bits(rng *r, int64_t n, zoff_dtype dt, double mu) {
    void *h = malloc((size_t)(n > 0 ? n : 1) * dt_size(dt));
    assert_non_null(h);
    for (int64_t k = 0; k < n; k++) encode(h, k, quant(mu + rng_normal(r), dt), dt);
    return h;
}

/* a device buffer of `bytes` holding host (NULL: zeros) */
static void *dev_buf(zoff_device *dev, const void *host, size_t bytes) {
    void *d = NULL;
    zoff_stream *s = zoff_device_stream(dev);
    assert_int_equal(zoff_device_alloc(dev, bytes ? bytes : 1, "bits", &d), ZOFF_OK);
    if (host) assert_int_equal(zoff_memcpy_async(s, d, host, bytes, ZOFF_COPY_H2D), ZOFF_OK);
    else assert_int_equal(zoff_memset_async(s, d, 0, bytes), ZOFF_OK);
    return d;
}

/* do the device buffers x and y hold the same bytes? */
static bool dev_same(zoff_device *dev, const void *x, const void *y, size_t bytes) {
    zoff_stream *s = zoff_device_stream(dev);
    char *hx = malloc(bytes + 1), *hy = malloc(bytes + 1);
    assert_true(hx && hy);
    assert_int_equal(zoff_memcpy_async(s, hx, x, bytes, ZOFF_COPY_D2H), ZOFF_OK);
    assert_int_equal(zoff_memcpy_async(s, hy, y, bytes, ZOFF_COPY_D2H), ZOFF_OK);
    assert_int_equal(zoff_stream_synchronize(s), ZOFF_OK);
    bool same = memcmp(hx, hy, bytes) == 0;
    free(hx);
    free(hy);
    return same;
}

/* RESIDUAL_LAYERNORM_FWD == ADD then LAYERNORM_FWD of the sum; b at an offset of off elements (off = 1
 * misaligns it for 16-byte loads while the other operands stay aligned) */
static void resid_ln_fwd_bits(zoff_device *dev, zoff_dtype dt, int64_t N, int64_t C, int64_t off) {
    rng r = {0xb175ull + (uint64_t)(N * 7 + C * 3 + off)};
    const size_t es = dt_size(dt), nb = (size_t)(N * C) * es, sb = (size_t)N * 4;
    void *ha = rand_bits(&r, N * C, dt, 1.0), *hb = rand_bits(&r, N * C + off, dt, -0.5);
    void *hw = rand_bits(&r, C, dt, 1.0), *hbi = rand_bits(&r, C, dt, 0.0);
    void *a = dev_buf(dev, ha, nb), *bfull = dev_buf(dev, hb, nb + (size_t)off * es), *w = dev_buf(dev, hw, (size_t)C * es);
    void *bi = dev_buf(dev, hbi, (size_t)C * es);
    void *res = dev_buf(dev, NULL, nb), *out = dev_buf(dev, NULL, nb), *mean = dev_buf(dev, NULL, sb);
    void *rstd = dev_buf(dev, NULL, sb), *sum = dev_buf(dev, NULL, nb), *out2 = dev_buf(dev, NULL, nb);
    void *mean2 = dev_buf(dev, NULL, sb), *rstd2 = dev_buf(dev, NULL, sb);
    const void *b = (const char *)bfull + (size_t)off * es;
    zoff_stream *s = zoff_device_stream(dev);
    zoff_op_residual_layernorm_fwd_args f = {.resid = res, .out = out, .mean = mean, .rstd = rstd, .a = a, .b = b,
                                             .weight = w, .bias = bi, .N = N, .C = C, .dt = dt};
    zoff_op_add_args add = {.out = sum, .a = a, .b = b, .n = N * C, .dt = dt};
    zoff_op_layernorm_fwd_args ln = {.out = out2, .mean = mean2, .rstd = rstd2, .inp = sum, .weight = w, .bias = bi,
                                     .N = N, .C = C, .dt = dt};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_FWD, f), ZOFF_OK);
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_ADD, add), ZOFF_OK);
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_FWD, ln), ZOFF_OK);
    if (!dev_same(dev, res, sum, nb) || !dev_same(dev, out, out2, nb) || !dev_same(dev, mean, mean2, sb) ||
        !dev_same(dev, rstd, rstd2, sb))
        fail_msg("residual_layernorm_fwd on %s, %s (%lld,%lld), b offset %lld: not bit for bit ADD + LAYERNORM_FWD",
                 zoff_device_name(dev), zoff_dtype_name(dt), (long long)N, (long long)C, (long long)off);
    void *dv[] = {a, bfull, w, bi, res, out, mean, rstd, sum, out2, mean2, rstd2};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) zoff_device_free(dev, dv[i]);
    free(ha);
    free(hb);
    free(hw);
    free(hbi);
}

/* RESIDUAL_LAYERNORM_BWD with dresid (at an offset of off elements) == LAYERNORM_BWD accumulating into a
 * copy of dresid; with dresid NULL == LAYERNORM_BWD accumulating into zeros (dweight, dbias too) */
static void resid_ln_bwd_bits(zoff_device *dev, zoff_dtype dt, int64_t N, int64_t C, int64_t off) {
    rng r = {0xb0bull + (uint64_t)(N * 7 + C * 3 + off)};
    const size_t es = dt_size(dt), nb = (size_t)(N * C) * es, cb = (size_t)C * es;
    void *hdy = rand_bits(&r, N * C, dt, 0.0), *hx = rand_bits(&r, N * C, dt, 1.0), *hw = rand_bits(&r, C, dt, 1.0);
    void *hdr = rand_bits(&r, N * C + off, dt, 0.0), *hdw = rand_bits(&r, C, dt, 0.0), *hdb = rand_bits(&r, C, dt, 0.0);
    float *hm = malloc((size_t)(N + 1) * 4), *hr = malloc((size_t)(N + 1) * 4);
    assert_true(hm && hr);
    for (int64_t i = 0; i < N; i++) {
        hm[i] = (float)rng_normal(&r);
        hr[i] = (float)(0.5 + fabs(rng_normal(&r)));
    }
    void *dy = dev_buf(dev, hdy, nb), *x = dev_buf(dev, hx, nb), *w = dev_buf(dev, hw, cb);
    void *m = dev_buf(dev, hm, (size_t)N * 4), *rs = dev_buf(dev, hr, (size_t)N * 4);
    void *drfull = dev_buf(dev, hdr, nb + (size_t)off * es);
    void *dx[4], *dw[4], *db[4];
    for (int k = 0; k < 4; k++) {
        /* 0: fused from dresid; 1: LAYERNORM_BWD into a copy of dresid; 2: fused, dresid NULL; 3: into zeros */
        dx[k] = dev_buf(dev, k == 1 ? (const char *)hdr + (size_t)off * es : NULL, nb);
        dw[k] = dev_buf(dev, hdw, cb);
        db[k] = dev_buf(dev, hdb, cb);
    }
    zoff_stream *s = zoff_device_stream(dev);
    for (int k = 0; k < 4; k++) {
        if (k % 2 == 0) {
            zoff_op_residual_layernorm_bwd_args f = {.dinp = dx[k], .dresid = k ? NULL : (char *)drfull + (size_t)off * es,
                                                     .dweight = dw[k], .dbias = db[k], .dout = dy, .inp = x,
                                                     .weight = w, .mean = m, .rstd = rs, .N = N, .C = C, .dt = dt};
            assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_BWD, f), ZOFF_OK);
        } else {
            zoff_op_layernorm_bwd_args l = {.dinp = dx[k], .dweight = dw[k], .dbias = db[k], .dout = dy, .inp = x,
                                            .weight = w, .mean = m, .rstd = rs, .N = N, .C = C, .dt = dt};
            assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_BWD, l), ZOFF_OK);
        }
    }
    for (int k = 0; k < 4; k += 2)
        if (!dev_same(dev, dx[k], dx[k + 1], nb) || !dev_same(dev, dw[k], dw[k + 1], cb) ||
            !dev_same(dev, db[k], db[k + 1], cb))
            fail_msg("residual_layernorm_bwd on %s, %s (%lld,%lld), dresid %s (offset %lld): not bit for bit "
                     "LAYERNORM_BWD", zoff_device_name(dev), zoff_dtype_name(dt), (long long)N, (long long)C,
                     k ? "NULL" : "given", (long long)off);
    void *dv[] = {dy, x, w, m, rs, drfull};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) zoff_device_free(dev, dv[i]);
    for (int k = 0; k < 4; k++) {
        zoff_device_free(dev, dx[k]);
        zoff_device_free(dev, dw[k]);
        zoff_device_free(dev, db[k]);
    }
    void *hv[] = {hdy, hx, hw, hdr, hdw, hdb, hm, hr};
    for (size_t i = 0; i < sizeof hv / sizeof hv[0]; i++) free(hv[i]);
}

static void test_residual_layernorm_bits(void **state) {
    (void)state;
    static const int64_t shapes[][2] = {{1, 768}, {37, 64}, {5, 100}, {3, 7}};
    for (int b = 0; b < NBACK; b++) {
        if (!zoff_backend_available(g_kinds[b])) continue;
        zoff_device *dev = make_device(g_kinds[b], 0);
        for (int di = 0; di < 3; di++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                for (int64_t off = 0; off < 2; off++) {
                    resid_ln_fwd_bits(dev, g_dts[di], shapes[si][0], shapes[si][1], off);
                    resid_ln_bwd_bits(dev, g_dts[di], shapes[si][0], shapes[si][1], off);
                }
        zoff_device_destroy(dev);
    }
}

/* Direct kernel call: dtypes the CPU backend does not implement are
 * ZOFF_ERR_UNSUPPORTED with a message naming op and dtype. */
static void test_unsupported_dtype(void **state) {
    (void)state;
    float x[4] = {0}, y[4] = {0};
    zoff_op_gelu_fwd_args g = {.out = y, .inp = x, .n = 4, .dt = ZOFF_I32};
    assert_int_equal(zoff_cpu_run_op(ZOFF_OP_GELU_FWD, &g, 1), ZOFF_ERR_UNSUPPORTED);
    assert_non_null(strstr(zoff_last_error(), "gelu"));
    assert_non_null(strstr(zoff_last_error(), "i32"));
    zoff_op_cast_args c = {.dst = y, .src = x, .n = 4, .dst_dt = ZOFF_I32, .src_dt = ZOFF_F32};
    assert_int_equal(zoff_cpu_run_op(ZOFF_OP_CAST, &c, 1), ZOFF_ERR_UNSUPPORTED);
    zoff_op_adam_args a = {.params = x, .m = x, .v = x, .grads = y, .n = 4, .grad_dt = ZOFF_I32};
    assert_int_equal(zoff_cpu_run_op(ZOFF_OP_ADAM, &a, 1), ZOFF_ERR_UNSUPPORTED);
}

/* Is name in the comma-separated list (ZOFF_TEST_OPS)? An unset list selects every test. */
static bool selected(const char *list, const char *name) {
    if (!list || !*list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return true;
        p += len + (end ? 1 : 0);
    }
    return false;
}

/* Environment: ZOFF_TEST_OPS=name,name,... runs only those tests (op names of the table and
 * the names of the other tests; an unknown name is an error); ZOFF_TEST_REQUIRE_CUDA=1 fails
 * every op test that finds no CUDA backend (the emulator's run must not pass on the CPU alone). */
int main(void) {
    struct CMUnitTest all[NOPS + 7], tests[NOPS + 7];
    for (int i = 0; i < NOPS; i++) {
        struct CMUnitTest t = {g_ops[i].name, test_op, NULL, NULL, (void *)&g_ops[i]};
        all[i] = t;
    }
    struct CMUnitTest extra[] = {
        cmocka_unit_test(test_reference_gradients),   cmocka_unit_test(test_embed_token_out_of_range),
        cmocka_unit_test(test_cross_entropy_bad_target), cmocka_unit_test(test_grad_stats_nonfinite),
        cmocka_unit_test(test_deterministic_across_threads), cmocka_unit_test(test_unsupported_dtype),
        cmocka_unit_test(test_residual_layernorm_bits),
    };
    memcpy(all + NOPS, extra, sizeof extra);
    const int nall = NOPS + (int)(sizeof extra / sizeof extra[0]);
    const char *want = getenv("ZOFF_TEST_OPS");
    int n = 0;
    for (int i = 0; i < nall; i++)
        if (selected(want, all[i].name)) tests[n++] = all[i];
    for (const char *p = want; p && *p;) { /* every name must exist */
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        bool found = false;
        for (int i = 0; i < nall && !found; i++) found = strlen(all[i].name) == len && !strncmp(all[i].name, p, len);
        if (!found) {
            fprintf(stderr, "test_ops: ZOFF_TEST_OPS names '%.*s', which is no test here\n", (int)len, p);
            return 2;
        }
        p += len + (end ? 1 : 0);
    }
    const char *path = getenv("ZOFF_CPU_KERNELS");
    int rc = _cmocka_run_group_tests(path && *path ? "ops (portable kernels)" : "ops", tests, (size_t)n, NULL, NULL);
    if (path) return rc;
    /* Run the table again in a child on the portable scalar row kernels, which
     * the SIMD ones replace on this CPU (the choice is made once per process). */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("ZOFF_CPU_KERNELS", "scalar", 1);
        execl("/proc/self/exe", "test_ops", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "test_ops: the run on the portable kernels failed (status %d)\n", status);
        return rc ? rc : 1;
    }
    return rc;
}
