/* CPU backend kernels: the math of every zoff_op (see include/zoff/device.h
 * for each op's arguments and exact semantics).
 *
 * Every kernel is written once, in fp32. Storage dtypes (f32, bf16, f16) are
 * handled at the edges by a few view helpers: for f32 a "view" is the tensor
 * itself (no copy), for bf16/f16 it is a per-thread fp32 scratch row that is
 * converted on load and rounded to nearest even on store. Matrix products go
 * through OpenBLAS cblas_sgemm (16-bit operands are widened to fp32 scratch).
 *
 * Threads: OpenMP with nt = threads ? threads : omp_get_max_threads(); OpenBLAS
 * is set to one thread and sgemm calls are split over the OpenMP team. These
 * functions run on a stream's thread, never assume the main thread. Results
 * are deterministic for a given thread count; the reductions (dweight/dbias
 * of matmul and layernorm, dwte/dwpe, GRAD_STATS) are deterministic for any
 * thread count: they are parallelised over the output dimension or over
 * fixed-size chunks combined in a fixed order. */
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kernels_simd.h"
#include "core/half_internal.h"

#include <cblas.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Elements per block for the flat (elementwise) kernels; three such fp32
 * blocks live on the stack of each thread. */
#define BLK 1024
/* Ops with fewer elements than this run on one thread. */
#define PAR_MIN 16384
/* Rows per block in attention (S/P scratch is ATT_RB x T per thread). */
#define ATT_RB 64
/* Columns per block for column reductions (dbias, layernorm dweight). */
#define COL_BLK 64

/* ------------------------------------------------------------------ helpers */

static inline const zoff_cpu_vec_ops *vec(void);

static inline int nthreads(int threads) {
#if defined(__SANITIZE_THREAD__)
    /* libgomp is not built with ThreadSanitizer, so its barriers look like
     * races: under TSan the kernels run on the stream's own thread only (the
     * races that matter, between streams, are still seen). */
    (void)threads;
    return 1;
#else
    int nt = threads > 0 ? threads : omp_get_max_threads();
    return nt > 0 ? nt : 1;
#endif
}

static inline size_t dsize(zoff_dtype dt) { return dt == ZOFF_BF16 || dt == ZOFF_F16 ? 2 : 4; }

/* Address of element i of a tensor of dtype dt. */
static inline void *eptr(const void *base, int64_t i, zoff_dtype dt) {
    return (char *)base + (size_t)i * dsize(dt);
}

/* dst(n) fp32 = src(n) of dt. */
static void load_f32(float *dst, const void *src, int64_t n, zoff_dtype dt) {
    if (dt == ZOFF_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (dt == ZOFF_BF16) {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = zoff_half_bf16_to_f32(s[i]);
    } else {
        vec()->f16_to_f32(dst, src, n);
    }
}

/* dst(n) of dt = src(n) fp32, round to nearest even. */
static void store_f32(void *dst, const float *src, int64_t n, zoff_dtype dt) {
    if (dt == ZOFF_F32) {
        if (dst != src) memmove(dst, src, (size_t)n * 4);
    } else if (dt == ZOFF_BF16) {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = zoff_half_f32_to_bf16(src[i]);
    } else {
        vec()->f32_to_f16(dst, src, n);
    }
}

/* Read-only fp32 view of n elements at src: src itself for f32, else converted into scratch. */
static inline const float *view_rd(const void *src, int64_t n, zoff_dtype dt, float *scratch) {
    if (dt == ZOFF_F32) return src;
    load_f32(scratch, src, n, dt);
    return scratch;
}

/* Writable fp32 buffer for dst: dst itself for f32, else scratch (contents undefined). */
static inline float *view_wr(void *dst, zoff_dtype dt, float *scratch) {
    return dt == ZOFF_F32 ? (float *)dst : scratch;
}

/* Read-write fp32 view (for accumulation): dst itself for f32, else scratch loaded from dst. */
static inline float *view_rw(void *dst, int64_t n, zoff_dtype dt, float *scratch) {
    if (dt == ZOFF_F32) return dst;
    load_f32(scratch, dst, n, dt);
    return scratch;
}

/* Write back a view_wr/view_rw buffer (no-op for f32). */
static inline void view_commit(void *dst, const float *buf, int64_t n, zoff_dtype dt) {
    if (dt != ZOFF_F32) store_f32(dst, buf, n, dt);
}

/* Parallel dst(n) fp32 = src(n) of dt. */
static void load_f32_par(float *dst, const void *src, int64_t n, zoff_dtype dt, int nt) {
    int64_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, len = n - i0 < BLK ? n - i0 : BLK;
        load_f32(dst + i0, eptr(src, i0, dt), len, dt);
    }
}

/* Parallel rows: dst(rows, cols) fp32 (row stride ldd) = src(rows, cols) of dt (row stride lds). */
static void load_f32_2d(float *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows, int64_t cols,
                        zoff_dtype dt, int nt) {
#pragma omp parallel for num_threads(nt) if (rows * cols > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) load_f32(dst + r * ldd, eptr(src, r * lds, dt), cols, dt);
}

/* Parallel rows: dst(rows, cols) of dt (row stride ldd) (+)= src(rows, cols) fp32 (row stride lds). */
static void store_f32_2d(void *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows, int64_t cols,
                         zoff_dtype dt, int accumulate, int nt) {
#pragma omp parallel for num_threads(nt) if (rows * cols > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        void *d = eptr(dst, r * ldd, dt);
        const float *s = src + r * lds;
        if (!accumulate) {
            store_f32(d, s, cols, dt);
            continue;
        }
        float tmp[BLK];
        for (int64_t c0 = 0; c0 < cols; c0 += BLK) {
            int64_t len = cols - c0 < BLK ? cols - c0 : BLK;
            void *dc = eptr(d, c0, dt);
            float *acc = view_rw(dc, len, dt, tmp);
            for (int64_t c = 0; c < len; c++) acc[c] += s[c0 + c];
            view_commit(dc, acc, len, dt);
        }
    }
}

/* acc(cols) = sum over rows of x(rows, cols) (row stride ld), rows summed in order:
 * deterministic for any thread count (parallel over column blocks). */
static void colsum(float *acc, const float *x, int64_t ld, int64_t rows, int64_t cols, int nt) {
    int64_t ncb = (cols + COL_BLK - 1) / COL_BLK;
#pragma omp parallel for num_threads(nt) if (rows * cols > PAR_MIN) schedule(static)
    for (int64_t cb = 0; cb < ncb; cb++) {
        int64_t c0 = cb * COL_BLK, len = cols - c0 < COL_BLK ? cols - c0 : COL_BLK;
        float s[COL_BLK];
        for (int64_t c = 0; c < len; c++) s[c] = 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + r * ld + c0;
            for (int64_t c = 0; c < len; c++) s[c] += xr[c];
        }
        for (int64_t c = 0; c < len; c++) acc[c0 + c] = s[c];
    }
}

static float *scratch_alloc(int64_t count, const char *what) {
    return zoff_aligned_alloc(64, (size_t)(count > 0 ? count : 1) * sizeof(float), what);
}

static zoff_status check_dt(zoff_op op, const char *role, zoff_dtype dt) {
    if (dt == ZOFF_F32 || dt == ZOFF_BF16 || dt == ZOFF_F16) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_UNSUPPORTED,
                      "%s: %s dtype %s (%d) is not supported by the CPU backend; use f32, bf16 or f16",
                      zoff_op_name(op), role, (unsigned)dt < ZOFF_DTYPE_COUNT ? zoff_dtype_name(dt) : "invalid",
                      (int)dt);
}

static zoff_status check_blas_dim(zoff_op op, const char *name, int64_t v) {
    if (v >= 0 && v <= INT_MAX) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_UNSUPPORTED,
                      "%s: %s = %lld exceeds the BLAS limit of %d on the CPU backend; split the operation",
                      zoff_op_name(op), name, (long long)v, INT_MAX);
}

static zoff_status check_tokens(const char *what, const int32_t *tokens, int64_t n, int64_t T, int64_t V) {
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= V)
            return zoff_error(ZOFF_ERR_INVALID,
                              "%s: token id %d at position %lld (b=%lld, t=%lld) is out of range [0, %lld); "
                              "check that the data was tokenized with this model's vocabulary",
                              what, (int)tokens[i], (long long)i, (long long)(i / T), (long long)(i % T),
                              (long long)V);
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ row math
 * exp/tanh-heavy rows and f16 conversion go through a table: AVX2+FMA+F16C
 * (cpu_kernels_avx2.c, vectorised exp) when the CPU has them, else the
 * portable scalar loops below (libm). One indirect call per row. */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static float sc_max(const float *x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static float sc_exp_sum(float *dst, const float *src, int64_t n, float shift) {
    float sum = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        float e = expf(src[j] - shift);
        if (dst) dst[j] = e;
        sum += e;
    }
    return sum;
}

static void sc_softmax_grad(float *s, float *d, int64_t n, float l, float D) {
    for (int64_t j = 0; j < n; j++) {
        float p = expf(s[j] - l);
        s[j] = p;
        d[j] = p * (d[j] - D);
    }
}

static void sc_gelu(float *o, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        o[i] = 0.5f * xi * (1.0f + tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi)));
    }
}

static void sc_gelu_grad(float *o, const float *x, const float *dy, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float th = tanhf(GELU_K * (xi + 0.044715f * xi * xi * xi));
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * xi * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * xi * xi);
        o[i] = g * dy[i];
    }
}

static void sc_f16_to_f32(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = zoff_f16_to_f32(src[i]);
}

static void sc_f32_to_f16(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = zoff_f32_to_f16(src[i]);
}

static const zoff_cpu_vec_ops g_vec_scalar = {
    .max = sc_max,
    .exp_sum = sc_exp_sum,
    .softmax_grad = sc_softmax_grad,
    .gelu = sc_gelu,
    .gelu_grad = sc_gelu_grad,
    .f16_to_f32 = sc_f16_to_f32,
    .f32_to_f16 = sc_f32_to_f16,
};

static const zoff_cpu_vec_ops *g_vec;
static pthread_once_t g_vec_once = PTHREAD_ONCE_INIT;

static void vec_select(void) {
    g_vec = &g_vec_scalar;
#if defined(__x86_64__)
    const zoff_cpu_features *f = zoff_cpu_features_get();
    const char *env = getenv("ZOFF_CPU_KERNELS");
    if (f->avx2 && f->fma && f->f16c && !(env && strcmp(env, "scalar") == 0)) g_vec = &zoff_cpu_vec_avx2;
#endif
}

/* The row-math table for this process (ZOFF_CPU_KERNELS=scalar forces the portable one). */
static inline const zoff_cpu_vec_ops *vec(void) {
    pthread_once(&g_vec_once, vec_select);
    return g_vec;
}

/* ------------------------------------------------------------------ embedding */

/* out is (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) int32, wte (V,C), wpe (maxT,C). */
static zoff_status embed_fwd(const zoff_op_embed_fwd_args *a, int nt) {
    const int64_t BT = a->B * a->T, C = a->C;
    const zoff_dtype dt = a->dt;
    if (BT == 0 || C == 0) return ZOFF_OK;
    ZOFF_TRY(check_tokens("embedding forward", a->tokens, BT, a->T, a->V));
    float *scr = NULL;
    if (dt != ZOFF_F32 && !(scr = scratch_alloc((int64_t)nt * 3 * C, "embedding scratch"))) return ZOFF_ERR_NOMEM;
#pragma omp parallel num_threads(nt) if (BT * C > PAR_MIN)
    {
        float *s = scr ? scr + (int64_t)omp_get_thread_num() * 3 * C : NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < BT; i++) {
            int64_t t = i % a->T;
            const float *w = view_rd(eptr(a->wte, (int64_t)a->tokens[i] * C, dt), C, dt, s);
            const float *p = view_rd(eptr(a->wpe, t * C, dt), C, dt, s ? s + C : NULL);
            void *orow = eptr(a->out, i * C, dt);
            float *o = view_wr(orow, dt, s ? s + 2 * C : NULL);
            for (int64_t c = 0; c < C; c++) o[c] = w[c] + p[c];
            view_commit(orow, o, C, dt);
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* dwte (V,C) += dout rows by token; dwpe (maxT,C) row t += sum_b dout[b,t]; dout (B,T,C).
 * dwte: positions are sorted by token, each token's rows are summed in position
 * order in fp32 and added once, so it is deterministic for any thread count. */
static zoff_status embed_bwd(const zoff_op_embed_bwd_args *a, int nt) {
    const int64_t B = a->B, T = a->T, BT = B * T, C = a->C;
    const zoff_dtype dt = a->dt;
    if (BT == 0 || C == 0) return ZOFF_OK;
    if (a->dwte) ZOFF_TRY(check_tokens("embedding backward", a->tokens, BT, T, a->V));
    float *scr = scratch_alloc((int64_t)nt * 3 * C, "embedding backward scratch");
    if (!scr) return ZOFF_ERR_NOMEM;
    zoff_status st = ZOFF_OK;
    if (a->dwpe) {
#pragma omp parallel num_threads(nt) if (BT * C > PAR_MIN)
        {
            float *s = scr + (int64_t)omp_get_thread_num() * 3 * C;
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                float *acc = s;
                for (int64_t c = 0; c < C; c++) acc[c] = 0.0f;
                for (int64_t b = 0; b < B; b++) {
                    const float *d = view_rd(eptr(a->dout, (b * T + t) * C, dt), C, dt, s + C);
                    for (int64_t c = 0; c < C; c++) acc[c] += d[c];
                }
                void *prow = eptr(a->dwpe, t * C, dt);
                float *p = view_rw(prow, C, dt, s + 2 * C);
                for (int64_t c = 0; c < C; c++) p[c] += acc[c];
                view_commit(prow, p, C, dt);
            }
        }
    }
    if (a->dwte) {
        /* key = token * BT + position: sorting groups positions by token, in position order. */
        int64_t *keys = malloc((size_t)BT * sizeof(int64_t) + (size_t)(BT + 1) * sizeof(int64_t));
        if (!keys) {
            st = zoff_error(ZOFF_ERR_NOMEM, "embedding backward: out of host memory for %lld token keys",
                            (long long)BT);
        } else {
            int64_t *starts = keys + BT, ng = 0;
            for (int64_t i = 0; i < BT; i++) keys[i] = (int64_t)a->tokens[i] * BT + i;
            qsort(keys, (size_t)BT, sizeof(int64_t), cmp_i64);
            for (int64_t i = 0; i < BT; i++)
                if (i == 0 || keys[i] / BT != keys[i - 1] / BT) starts[ng++] = i;
            starts[ng] = BT;
#pragma omp parallel num_threads(nt) if (BT * C > PAR_MIN)
            {
                float *s = scr + (int64_t)omp_get_thread_num() * 3 * C;
#pragma omp for schedule(dynamic, 16)
                for (int64_t g = 0; g < ng; g++) {
                    float *acc = s;
                    for (int64_t c = 0; c < C; c++) acc[c] = 0.0f;
                    for (int64_t k = starts[g]; k < starts[g + 1]; k++) {
                        int64_t pos = keys[k] % BT;
                        const float *d = view_rd(eptr(a->dout, pos * C, dt), C, dt, s + C);
                        for (int64_t c = 0; c < C; c++) acc[c] += d[c];
                    }
                    int64_t tok = keys[starts[g]] / BT;
                    void *wrow = eptr(a->dwte, tok * C, dt);
                    float *w = view_rw(wrow, C, dt, s + 2 * C);
                    for (int64_t c = 0; c < C; c++) w[c] += acc[c];
                    view_commit(wrow, w, C, dt);
                }
            }
            free(keys);
        }
    }
    zoff_aligned_free(scr);
    return st;
}

/* ------------------------------------------------------------------ layernorm */

/* out (N,C) = (x - mean) * rstd * weight + bias; weight/bias (C), mean/rstd (N) fp32.
 * x (N,C) is a->a when a->b is NULL (ZOFF_OP_LAYERNORM_FWD); else the residual a + b, stored into
 * a->resid row by row (rounded to dt) and normalised from what was stored, so that LAYERNORM_FWD
 * on resid gives the same bits (resid may alias a or b: each row is read before it is written). */
static zoff_status layernorm_fwd(const zoff_op_residual_layernorm_fwd_args *a, int nt) {
    const int64_t N = a->N, C = a->C;
    const zoff_dtype dt = a->dt;
    if (N == 0 || C == 0) return ZOFF_OK;
    /* [w32 C][b32 C] shared + per thread [x C][o C][y C] */
    float *scr = scratch_alloc(2 * C + (int64_t)nt * 3 * C, "layernorm scratch");
    if (!scr) return ZOFF_ERR_NOMEM;
    const float *w = view_rd(a->weight, C, dt, scr);
    float *bz = scr + C;
    const float *bias;
    if (a->bias) {
        bias = view_rd(a->bias, C, dt, bz);
    } else {
        for (int64_t c = 0; c < C; c++) bz[c] = 0.0f;
        bias = bz;
    }
#pragma omp parallel num_threads(nt) if (N * C > PAR_MIN)
    {
        float *s = scr + 2 * C + (int64_t)omp_get_thread_num() * 3 * C;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            const void *xrow = eptr(a->a, i * C, dt);
            if (a->b) { /* resid = a + b, then x is the stored resid */
                load_f32(s, xrow, C, dt);
                const float *y = view_rd(eptr(a->b, i * C, dt), C, dt, s + 2 * C);
                for (int64_t c = 0; c < C; c++) s[c] += y[c];
                xrow = eptr(a->resid, i * C, dt);
                store_f32((void *)xrow, s, C, dt);
            }
            const float *x = view_rd(xrow, C, dt, s);
            float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
            for (int64_t c = 0; c < C; c++) sum += x[c];
            float m = sum / (float)C, var = 0.0f;
#pragma omp simd reduction(+ : var)
            for (int64_t c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
            float r = 1.0f / sqrtf(var / (float)C + 1e-5f);
            void *orow = eptr(a->out, i * C, dt);
            float *o = view_wr(orow, dt, s + C);
            for (int64_t c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + bias[c];
            view_commit(orow, o, C, dt);
            if (a->mean) a->mean[i] = m;
            if (a->rstd) a->rstd[i] = r;
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

/* dinp (N,C) = dresid + LayerNorm'(dout) (dresid NULL: 0; dresid == dinp: accumulate, as
 * ZOFF_OP_LAYERNORM_BWD), dweight (C) +=, dbias (C) +=; dout, inp (N,C); weight (C); mean, rstd (N)
 * fp32. dinp is row-parallel; dweight/dbias are column-parallel (rows summed in order). */
static zoff_status layernorm_bwd(const zoff_op_residual_layernorm_bwd_args *a, int nt) {
    const int64_t N = a->N, C = a->C;
    const zoff_dtype dt = a->dt;
    if (N == 0 || C == 0) return ZOFF_OK;
    /* [w32 C] shared + per thread [x C][dy C][dx C] */
    float *scr = scratch_alloc(C + (int64_t)nt * 3 * C, "layernorm backward scratch");
    if (!scr) return ZOFF_ERR_NOMEM;
    if (a->dinp) {
        const float *w = view_rd(a->weight, C, dt, scr);
#pragma omp parallel num_threads(nt) if (N * C > PAR_MIN)
        {
            float *s = scr + C + (int64_t)omp_get_thread_num() * 3 * C;
#pragma omp for schedule(static)
            for (int64_t i = 0; i < N; i++) {
                const float *x = view_rd(eptr(a->inp, i * C, dt), C, dt, s);
                const float *dy = view_rd(eptr(a->dout, i * C, dt), C, dt, s + C);
                const float m = a->mean[i], r = a->rstd[i];
                float dmean = 0.0f, dnmean = 0.0f;
#pragma omp simd reduction(+ : dmean, dnmean)
                for (int64_t c = 0; c < C; c++) {
                    float dn = w[c] * dy[c];
                    dmean += dn;
                    dnmean += dn * (x[c] - m) * r;
                }
                dmean /= (float)C;
                dnmean /= (float)C;
                void *drow = eptr(a->dinp, i * C, dt);
                float *dx = view_wr(drow, dt, s + 2 * C); /* starts as the row of dresid (or 0) */
                if (!a->dresid) {
                    for (int64_t c = 0; c < C; c++) dx[c] = 0.0f;
                } else if (a->dresid != a->dinp || dt != ZOFF_F32) {
                    load_f32(dx, eptr(a->dresid, i * C, dt), C, dt);
                }
                for (int64_t c = 0; c < C; c++) {
                    float norm = (x[c] - m) * r;
                    dx[c] += (w[c] * dy[c] - dmean - norm * dnmean) * r;
                }
                view_commit(drow, dx, C, dt);
            }
        }
    }
    if (a->dweight || a->dbias) {
        int64_t ncb = (C + COL_BLK - 1) / COL_BLK;
#pragma omp parallel for num_threads(nt) if (N * C > PAR_MIN) schedule(static)
        for (int64_t cb = 0; cb < ncb; cb++) {
            int64_t c0 = cb * COL_BLK, len = C - c0 < COL_BLK ? C - c0 : COL_BLK;
            float aw[COL_BLK], ab[COL_BLK], tx[COL_BLK], td[COL_BLK];
            for (int64_t c = 0; c < len; c++) aw[c] = ab[c] = 0.0f;
            for (int64_t i = 0; i < N; i++) {
                const float *x = view_rd(eptr(a->inp, i * C + c0, dt), len, dt, tx);
                const float *dy = view_rd(eptr(a->dout, i * C + c0, dt), len, dt, td);
                const float m = a->mean[i], r = a->rstd[i];
                for (int64_t c = 0; c < len; c++) {
                    aw[c] += dy[c] * ((x[c] - m) * r);
                    ab[c] += dy[c];
                }
            }
            if (a->dweight) {
                void *p = eptr(a->dweight, c0, dt);
                float *d = view_rw(p, len, dt, tx);
                for (int64_t c = 0; c < len; c++) d[c] += aw[c];
                view_commit(p, d, len, dt);
            }
            if (a->dbias) {
                void *p = eptr(a->dbias, c0, dt);
                float *d = view_rw(p, len, dt, tx);
                for (int64_t c = 0; c < len; c++) d[c] += ab[c];
                view_commit(p, d, len, dt);
            }
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ matmul */

/* OpenBLAS runs single-threaded: all parallelism of this backend is OpenMP.
 * Letting the pthread OpenBLAS start its own threads next to the OpenMP team
 * made the two pools fight for the cores (profile of the default training run:
 * ~40% of the time spinning in libgomp and in OpenBLAS' sched_yield; 10x
 * slower attention when sgemm was called inside an OpenMP loop). Set once per
 * process; no other module of zoff calls BLAS. */
static pthread_once_t g_blas_once = PTHREAD_ONCE_INIT;
static void blas_single_thread(void) { openblas_set_num_threads(1); }

/* Rows/columns per block of a parallel sgemm. Fixed (not derived from the
 * thread count), so every output element is computed by the same sgemm call
 * whatever the number of threads: results do not depend on it. */
#define GEMM_BLK 128

/* Row-major C(M,N) = alpha op(A)(M,K) op(B)(K,N) + beta C, op = transpose when
 * ta/tb. Split into GEMM_BLK blocks of the larger of M and N, one sgemm per
 * block, blocks spread over nt OpenMP threads. */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                 const float *Bm, int64_t ldb, float beta, float *Cm, int64_t ldc, int nt) {
    if (M == 0 || N == 0) return;
    const CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
    const int split_m = M >= N;
    const int64_t dim = split_m ? M : N, nb = (dim + GEMM_BLK - 1) / GEMM_BLK;
#pragma omp parallel for num_threads(nt) if (nb > 1 && M * N * K > 4 * PAR_MIN) schedule(dynamic, 1)
    for (int64_t b = 0; b < nb; b++) {
        int64_t d0 = b * GEMM_BLK, len = dim - d0 < GEMM_BLK ? dim - d0 : GEMM_BLK;
        if (split_m) /* rows d0.. of op(A) and C */
            cblas_sgemm(CblasRowMajor, TA, TB, (int)len, (int)N, (int)K, alpha, ta ? A + d0 : A + d0 * lda, (int)lda,
                        Bm, (int)ldb, beta, Cm + d0 * ldc, (int)ldc);
        else /* columns d0.. of op(B) and C */
            cblas_sgemm(CblasRowMajor, TA, TB, (int)M, (int)len, (int)K, alpha, A, (int)lda,
                        tb ? Bm + d0 * ldb : Bm + d0, (int)ldb, beta, Cm + d0, (int)ldc);
    }
}


/* OC rows per block when 16-bit operands are widened to fp32 scratch: bounds
 * the scratch to about 8M floats per operand block. */
static int64_t oc_block(int64_t N, int64_t C, int64_t OC) {
    int64_t big = N > C ? N : C;
    int64_t ob = ((int64_t)8 << 20) / (big > 0 ? big : 1);
    if (ob < 64) ob = 64;
    return ob < OC ? ob : OC;
}

typedef void (*ew_fn)(float *o, const float *x, const float *y, int64_t len, float alpha);
static void ew_blocks(void *out, const void *x, const void *y, int64_t n, zoff_dtype dt, int nt, ew_fn f,
                      float alpha);
static void ew_gelu(float *o, const float *x, const float *y, int64_t n, float alpha);

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC); bias may be NULL. */
static zoff_status matmul_fwd_plain(const zoff_op_matmul_fwd_args *a, int nt) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const zoff_dtype dt = a->dt;
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_FWD, "N", N));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_FWD, "C", C));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_FWD, "OC", OC));
    if (N == 0 || OC == 0) return ZOFF_OK;
    if (dt == ZOFF_F32) {
        float *out = a->out;
        const float *bias = a->bias;
#pragma omp parallel for num_threads(nt) if (N * OC > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) {
            float *o = out + i * OC;
            if (bias) memcpy(o, bias, (size_t)OC * 4);
            else memset(o, 0, (size_t)OC * 4);
        }
        if (C > 0)
            gemm(0, 1, N, OC, C, 1.0f, a->inp, C, a->weight, C, 1.0f, out, OC, nt);
        return ZOFF_OK;
    }
    const int64_t ob = oc_block(N, C, OC);
    float *inp32 = scratch_alloc(N * C, "matmul fp32 input");
    float *w32 = scratch_alloc(ob * C, "matmul fp32 weight block");
    float *o32 = scratch_alloc(N * ob, "matmul fp32 output block");
    float *b32 = scratch_alloc(OC, "matmul fp32 bias");
    zoff_status st = ZOFF_OK;
    if (!inp32 || !w32 || !o32 || !b32) {
        st = ZOFF_ERR_NOMEM;
        goto done;
    }
    load_f32_par(inp32, a->inp, N * C, dt, nt);
    if (a->bias) load_f32(b32, a->bias, OC, dt);
    else memset(b32, 0, (size_t)OC * 4);
    for (int64_t oc0 = 0; oc0 < OC; oc0 += ob) {
        int64_t n = OC - oc0 < ob ? OC - oc0 : ob;
        load_f32_par(w32, eptr(a->weight, oc0 * C, dt), n * C, dt, nt);
#pragma omp parallel for num_threads(nt) if (N * n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < N; i++) memcpy(o32 + i * n, b32 + oc0, (size_t)n * 4);
        if (C > 0)
            gemm(0, 1, N, n, C, 1.0f, inp32, C, w32, C, 1.0f, o32, n, nt);
        store_f32_2d(eptr(a->out, oc0, dt), OC, o32, n, N, n, dt, 0, nt);
    }
done:
    zoff_aligned_free(inp32);
    zoff_aligned_free(w32);
    zoff_aligned_free(o32);
    zoff_aligned_free(b32);
    return st;
}

/* The plain product, then gelu_out = GELU(out) from out as stored (the reference's order). */
static zoff_status matmul_fwd(const zoff_op_matmul_fwd_args *a, int nt) {
    ZOFF_TRY(matmul_fwd_plain(a, nt));
    if (a->gelu_out) ew_blocks(a->gelu_out, a->out, NULL, a->N * a->OC, a->dt, nt, ew_gelu, 0.0f);
    return ZOFF_OK;
}

/* The GELU epilogue of matmul backward on the fp32 dinp (N,C): dinp *= GELU'(gelu_pre);
 * dbias_pre (C) += its column sums (rows in order). */
static zoff_status dinp_gelu_epilogue(float *dinp32, const zoff_op_matmul_bwd_args *a, int nt) {
    const int64_t N = a->N, C = a->C, n = N * C, nb = (n + BLK - 1) / BLK;
    const zoff_dtype dt = a->dt;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, len = n - i0 < BLK ? n - i0 : BLK;
        float sx[BLK];
        const float *x = view_rd(eptr(a->gelu_pre, i0, dt), len, dt, sx);
        vec()->gelu_grad(dinp32 + i0, x, dinp32 + i0, len);
    }
    if (!a->dbias_pre) return ZOFF_OK;
    float *acc = scratch_alloc(C, "matmul dbias_pre scratch");
    if (!acc) return ZOFF_ERR_NOMEM;
    colsum(acc, dinp32, C, N, C, nt);
    store_f32_2d(a->dbias_pre, C, acc, C, 1, C, dt, 1, 1);
    zoff_aligned_free(acc);
    return ZOFF_OK;
}

/* dinp (N,C) (+)= dout (N,OC) @ weight (OC,C) (then the GELU epilogue when gelu_pre);
 * dweight (OC,C) += dout^T @ inp (N,C); dbias (OC) += column sums of dout. NULL outputs are skipped. */
static zoff_status matmul_bwd(const zoff_op_matmul_bwd_args *a, int nt) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const zoff_dtype dt = a->dt;
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_BWD, "N", N));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_BWD, "C", C));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_MATMUL_BWD, "OC", OC));
    if (N == 0) return ZOFF_OK;
    if (OC == 0) { /* an empty product: an overwritten dinp is 0 (and so is GELU' times it) */
        if (a->dinp && a->dinp_overwrite) memset(a->dinp, 0, (size_t)(N * C) * dsize(dt));
        return ZOFF_OK;
    }
    if (dt == ZOFF_F32) {
        if (a->dinp && C > 0) {
            gemm(0, 0, N, C, OC, 1.0f, a->dout, OC, a->weight, C, a->dinp_overwrite ? 0.0f : 1.0f, a->dinp, C, nt);
            if (a->gelu_pre) ZOFF_TRY(dinp_gelu_epilogue(a->dinp, a, nt));
        }
        if (a->dweight && C > 0)
            gemm(1, 0, OC, C, N, 1.0f, a->dout, OC, a->inp, C, 1.0f, a->dweight, C, nt);
        if (a->dbias) {
            float *acc = scratch_alloc(OC, "matmul dbias scratch");
            if (!acc) return ZOFF_ERR_NOMEM;
            colsum(acc, a->dout, OC, N, OC, nt);
            float *db = a->dbias;
            for (int64_t o = 0; o < OC; o++) db[o] += acc[o];
            zoff_aligned_free(acc);
        }
        return ZOFF_OK;
    }
    const int64_t ob = oc_block(N, C, OC);
    const int need_inp = a->dweight && C > 0, need_dinp = a->dinp && C > 0;
    float *inp32 = need_inp ? scratch_alloc(N * C, "matmul backward fp32 input") : NULL;
    float *dinp32 = need_dinp ? scratch_alloc(N * C, "matmul backward fp32 dinp") : NULL;
    float *do32 = scratch_alloc(N * ob, "matmul backward fp32 dout block");
    float *w32 = scratch_alloc(ob * C, "matmul backward fp32 weight block");
    float *db32 = scratch_alloc(ob, "matmul backward fp32 dbias block");
    zoff_status st = ZOFF_OK;
    if ((need_inp && !inp32) || (need_dinp && !dinp32) || !do32 || !w32 || !db32) {
        st = ZOFF_ERR_NOMEM;
        goto done;
    }
    if (need_inp) load_f32_par(inp32, a->inp, N * C, dt, nt);
    if (need_dinp) memset(dinp32, 0, (size_t)(N * C) * 4);
    for (int64_t oc0 = 0; oc0 < OC; oc0 += ob) {
        int64_t n = OC - oc0 < ob ? OC - oc0 : ob;
        load_f32_2d(do32, n, eptr(a->dout, oc0, dt), OC, N, n, dt, nt);
        if (need_dinp) {
            load_f32_par(w32, eptr(a->weight, oc0 * C, dt), n * C, dt, nt);
            gemm(0, 0, N, C, n, 1.0f, do32, n, w32, C, 1.0f, dinp32, C, nt);
        }
        if (need_inp) {
            gemm(1, 0, n, C, N, 1.0f, do32, n, inp32, C, 0.0f, w32, C, nt);
            store_f32_2d(eptr(a->dweight, oc0 * C, dt), C, w32, C, n, C, dt, 1, nt);
        }
        if (a->dbias) {
            colsum(db32, do32, n, N, n, nt);
            store_f32_2d(eptr(a->dbias, oc0, dt), n, db32, n, 1, n, dt, 1, 1);
        }
    }
    if (need_dinp && a->gelu_pre) st = dinp_gelu_epilogue(dinp32, a, nt);
    if (need_dinp && st == ZOFF_OK) store_f32_2d(a->dinp, C, dinp32, C, N, C, dt, !a->dinp_overwrite, nt);
done:
    zoff_aligned_free(inp32);
    zoff_aligned_free(dinp32);
    zoff_aligned_free(do32);
    zoff_aligned_free(w32);
    zoff_aligned_free(db32);
    return st;
}

/* ------------------------------------------------------------------ attention */

/* Attention runs one (b,h) head per OpenMP thread and does its products with
 * (single-threaded) cblas_sgemm on tiles of ATT_RB query rows x att_cb(HS)
 * keys, skipping the tiles above the causal diagonal; tight C loops were 3-5x
 * slower than these small sgemms. */
#define ATT_MNK_MAX 262144 /* multiply-adds per tile product: keeps S, P tiles in L2 */

/* keys per tile for head size HS (8..ATT_RB) */
static int64_t att_cb(int64_t HS) {
    int64_t cb = ATT_MNK_MAX / (ATT_RB * (HS > 0 ? HS : 1));
    return cb < 8 ? 8 : cb > ATT_RB ? ATT_RB : cb;
}

static inline void sgemm_rm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                            const float *Bm, int64_t ldb, float beta, float *Cm, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                alpha, A, (int)lda, Bm, (int)ldb, beta, Cm, (int)ldc);
}

/* One (b,h) head, causal. q, k, v are (T,HS) with row stride ldq; o (T,HS) row
 * stride ldo; lse (T). S is ATT_RB x T scratch. Per block of ATT_RB query rows
 * [i0,i1): S = scale Q_blk K[0:i1]^T, masked softmax (P stored in S, zero above
 * the diagonal), O_blk = P V[0:i1]. */
static void attn_fwd_head(const float *q, const float *k, const float *v, int64_t ldq, float *o, int64_t ldo,
                          float *lse, int64_t T, int64_t HS, float *S) {
    const float scale = 1.0f / sqrtf((float)HS);
    const int64_t cb = att_cb(HS);
    for (int64_t i0 = 0; i0 < T; i0 += ATT_RB) {
        int64_t i1 = T - i0 < ATT_RB ? T : i0 + ATT_RB, rb = i1 - i0, nc = i1;
        for (int64_t j0 = 0; j0 < nc; j0 += cb) {
            int64_t w = nc - j0 < cb ? nc - j0 : cb;
            sgemm_rm(0, 1, rb, w, HS, scale, q + i0 * ldq, ldq, k + j0 * ldq, ldq, 0.0f, S + j0, nc);
        }
        for (int64_t r = 0; r < rb; r++) {
            int64_t i = i0 + r;
            float *row = S + r * nc;
            float mx = vec()->max(row, i + 1);
            float sum = vec()->exp_sum(row, row, i + 1, mx);
            float inv = 1.0f / sum;
            for (int64_t j = 0; j <= i; j++) row[j] *= inv;
            for (int64_t j = i + 1; j < nc; j++) row[j] = 0.0f;
            lse[i] = mx + logf(sum);
        }
        for (int64_t j0 = 0; j0 < nc; j0 += cb) {
            int64_t w = nc - j0 < cb ? nc - j0 : cb;
            sgemm_rm(0, 0, rb, HS, w, 1.0f, S + j0, nc, v + j0 * ldq, ldq, j0 ? 1.0f : 0.0f, o + i0 * ldo, ldo);
        }
    }
}

/* One (b,h) head backward. q,k,v (T,HS) stride ldq; o, dout (T,HS) stride ldo;
 * dq,dk,dv (T,HS) stride ldd (overwritten). P is recomputed from lse:
 *   P = exp(scale q k^T - lse), D_i = dout_i . o_i, dS = P * (dout v^T - D),
 *   dq = scale dS k, dk = scale dS^T q, dv = P^T dout.
 * S, dP: ATT_RB x T scratch each; D: T scratch. */
static void attn_bwd_head(const float *q, const float *k, const float *v, int64_t ldq, const float *o,
                          const float *dout, int64_t ldo, const float *lse, float *dq, float *dk, float *dv,
                          int64_t ldd, int64_t T, int64_t HS, float *S, float *dP, float *D) {
    const float scale = 1.0f / sqrtf((float)HS);
    const int64_t cb = att_cb(HS);
    for (int64_t t = 0; t < T; t++) {
        float s = 0.0f;
        for (int64_t c = 0; c < HS; c++) {
            s += dout[t * ldo + c] * o[t * ldo + c];
            dk[t * ldd + c] = 0.0f;
            dv[t * ldd + c] = 0.0f;
        }
        D[t] = s;
    }
    for (int64_t i0 = 0; i0 < T; i0 += ATT_RB) {
        int64_t i1 = T - i0 < ATT_RB ? T : i0 + ATT_RB, rb = i1 - i0, nc = i1;
        for (int64_t j0 = 0; j0 < nc; j0 += cb) {
            int64_t w = nc - j0 < cb ? nc - j0 : cb;
            sgemm_rm(0, 1, rb, w, HS, scale, q + i0 * ldq, ldq, k + j0 * ldq, ldq, 0.0f, S + j0, nc);
            sgemm_rm(0, 1, rb, w, HS, 1.0f, dout + i0 * ldo, ldo, v + j0 * ldq, ldq, 0.0f, dP + j0, nc);
        }
        for (int64_t r = 0; r < rb; r++) {
            int64_t i = i0 + r;
            float *srow = S + r * nc, *drow = dP + r * nc;
            const float l = lse[i], Di = D[i];
            vec()->softmax_grad(srow, drow, i + 1, l, Di);
            for (int64_t j = i + 1; j < nc; j++) srow[j] = drow[j] = 0.0f;
        }
        for (int64_t j0 = 0; j0 < nc; j0 += cb) {
            int64_t w = nc - j0 < cb ? nc - j0 : cb;
            /* dv[j0:j0+w] += P[:, tile]^T dout_blk;  dk[tile] += scale dS[:, tile]^T q_blk */
            sgemm_rm(1, 0, w, HS, rb, 1.0f, S + j0, nc, dout + i0 * ldo, ldo, 1.0f, dv + j0 * ldd, ldd);
            sgemm_rm(1, 0, w, HS, rb, scale, dP + j0, nc, q + i0 * ldq, ldq, 1.0f, dk + j0 * ldd, ldd);
            /* dq_blk (+)= scale dS[:, tile] k[tile] */
            sgemm_rm(0, 0, rb, HS, w, scale, dP + j0, nc, k + j0 * ldq, ldq, j0 ? 1.0f : 0.0f, dq + i0 * ldd, ldd);
        }
    }
}

static zoff_status check_heads(zoff_op op, int64_t C, int64_t NH) {
    if (NH > 0 && C % NH == 0) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID, "%s: C = %lld is not divisible by NH = %lld; C must be a multiple of the head count",
                      zoff_op_name(op), (long long)C, (long long)NH);
}

/* Gather head h of rows (T) from a (T, ld) tensor of dt at column offset col into fp32 (T,HS). */
static void gather_head(float *dst, const void *src, int64_t ld, int64_t col, int64_t T, int64_t HS, zoff_dtype dt) {
    for (int64_t t = 0; t < T; t++) load_f32(dst + t * HS, eptr(src, t * ld + col, dt), HS, dt);
}

static void scatter_head(void *dst, int64_t ld, int64_t col, const float *src, int64_t T, int64_t HS, zoff_dtype dt) {
    for (int64_t t = 0; t < T; t++) store_f32(eptr(dst, t * ld + col, dt), src + t * HS, HS, dt);
}

/* out (B,T,C) = causal softmax(q k^T / sqrt(HS)) v per head; qkv (B,T,3C); lse (B,NH,T) fp32. */
static zoff_status attention_fwd(const zoff_op_attention_fwd_args *a, int nt) {
    const int64_t B = a->B, T = a->T, C = a->C, NH = a->NH;
    const zoff_dtype dt = a->dt;
    ZOFF_TRY(check_heads(ZOFF_OP_ATTENTION_FWD, C, NH));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_ATTENTION_FWD, "3C", 3 * C));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_ATTENTION_FWD, "T", T));
    if (B == 0 || T == 0 || C == 0) return ZOFF_OK;
    const int64_t HS = C / NH, C3 = 3 * C;
    /* per thread: S (ATT_RB x T), lse fallback (T), and for 16-bit q,k,v,o (T x HS each) */
    const int64_t per = ATT_RB * T + T + (dt == ZOFF_F32 ? 0 : 4 * T * HS);
    float *scr = scratch_alloc((int64_t)nt * per, "attention scratch");
    if (!scr) return ZOFF_ERR_NOMEM;
#pragma omp parallel num_threads(nt) if (B * NH > 1 && B * T * C > PAR_MIN)
    {
        float *s = scr + (int64_t)omp_get_thread_num() * per;
        float *S = s, *lse_tmp = s + ATT_RB * T, *h16 = lse_tmp + T;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * NH; bh++) {
            int64_t b = bh / NH, h = bh % NH;
            float *lse = a->lse ? a->lse + bh * T : lse_tmp;
            if (dt == ZOFF_F32) {
                const float *base = (const float *)a->qkv + b * T * C3 + h * HS;
                attn_fwd_head(base, base + C, base + 2 * C, C3, (float *)a->out + b * T * C + h * HS, C, lse, T, HS,
                              S);
            } else {
                float *q = h16, *k = q + T * HS, *v = k + T * HS, *o = v + T * HS;
                const void *base = eptr(a->qkv, b * T * C3, dt);
                gather_head(q, base, C3, h * HS, T, HS, dt);
                gather_head(k, base, C3, C + h * HS, T, HS, dt);
                gather_head(v, base, C3, 2 * C + h * HS, T, HS, dt);
                attn_fwd_head(q, k, v, HS, o, HS, lse, T, HS, S);
                scatter_head(eptr(a->out, b * T * C, dt), C, h * HS, o, T, HS, dt);
            }
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

/* dqkv (B,T,3C) = gradient of attention; dout, out (B,T,C); qkv (B,T,3C); lse (B,NH,T). */
static zoff_status attention_bwd(const zoff_op_attention_bwd_args *a, int nt) {
    const int64_t B = a->B, T = a->T, C = a->C, NH = a->NH;
    const zoff_dtype dt = a->dt;
    ZOFF_TRY(check_heads(ZOFF_OP_ATTENTION_BWD, C, NH));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_ATTENTION_BWD, "3C", 3 * C));
    ZOFF_TRY(check_blas_dim(ZOFF_OP_ATTENTION_BWD, "T", T));
    if (B == 0 || T == 0 || C == 0) return ZOFF_OK;
    const int64_t HS = C / NH, C3 = 3 * C;
    /* per thread: S, dP (ATT_RB x T each), D (T); for 16-bit q,k,v,o,dout,dq,dk,dv (T x HS each) */
    const int64_t per = 2 * ATT_RB * T + T + (dt == ZOFF_F32 ? 0 : 8 * T * HS);
    float *scr = scratch_alloc((int64_t)nt * per, "attention backward scratch");
    if (!scr) return ZOFF_ERR_NOMEM;
#pragma omp parallel num_threads(nt) if (B * NH > 1 && B * T * C > PAR_MIN)
    {
        float *s = scr + (int64_t)omp_get_thread_num() * per;
        float *S = s, *dP = S + ATT_RB * T, *D = dP + ATT_RB * T, *h16 = D + T;
#pragma omp for schedule(static)
        for (int64_t bh = 0; bh < B * NH; bh++) {
            int64_t b = bh / NH, h = bh % NH;
            const float *lse = a->lse + bh * T;
            if (dt == ZOFF_F32) {
                const float *base = (const float *)a->qkv + b * T * C3 + h * HS;
                float *dbase = (float *)a->dqkv + b * T * C3 + h * HS;
                const float *o = (const float *)a->out + b * T * C + h * HS;
                const float *dout = (const float *)a->dout + b * T * C + h * HS;
                attn_bwd_head(base, base + C, base + 2 * C, C3, o, dout, C, lse, dbase, dbase + C, dbase + 2 * C, C3,
                              T, HS, S, dP, D);
            } else {
                const int64_t TH = T * HS;
                float *q = h16, *k = q + TH, *v = k + TH, *o = v + TH, *dout = o + TH, *dq = dout + TH,
                      *dk = dq + TH, *dv = dk + TH;
                const void *base = eptr(a->qkv, b * T * C3, dt);
                gather_head(q, base, C3, h * HS, T, HS, dt);
                gather_head(k, base, C3, C + h * HS, T, HS, dt);
                gather_head(v, base, C3, 2 * C + h * HS, T, HS, dt);
                gather_head(o, eptr(a->out, b * T * C, dt), C, h * HS, T, HS, dt);
                gather_head(dout, eptr(a->dout, b * T * C, dt), C, h * HS, T, HS, dt);
                attn_bwd_head(q, k, v, HS, o, dout, HS, lse, dq, dk, dv, HS, T, HS, S, dP, D);
                void *dbase = eptr(a->dqkv, b * T * C3, dt);
                scatter_head(dbase, C3, h * HS, dq, T, HS, dt);
                scatter_head(dbase, C3, C + h * HS, dk, T, HS, dt);
                scatter_head(dbase, C3, 2 * C + h * HS, dv, T, HS, dt);
            }
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ elementwise */

/* The elementwise ops' one loop: out[i] = f(x[i], y[i]) in fp32 over blocks of BLK elements on
 * nt threads (16-bit data is widened per block and rounded back). y may be NULL (unary ops);
 * out may alias x or y (each block is read before it is written). */
static void ew_blocks(void *out, const void *x, const void *y, int64_t n, zoff_dtype dt, int nt, ew_fn f,
                      float alpha) {
    const int64_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, len = n - i0 < BLK ? n - i0 : BLK;
        float sx[BLK], sy[BLK], so[BLK];
        const float *xv = view_rd(eptr(x, i0, dt), len, dt, sx);
        const float *yv = y ? view_rd(eptr(y, i0, dt), len, dt, sy) : NULL;
        void *op = eptr(out, i0, dt);
        float *o = view_wr(op, dt, so);
        f(o, xv, yv, len, alpha);
        view_commit(op, o, len, dt);
    }
}

static void ew_gelu(float *o, const float *x, const float *y, int64_t n, float alpha) { vec()->gelu(o, x, n); }
static void ew_gelu_grad(float *o, const float *x, const float *dy, int64_t n, float alpha) {
    vec()->gelu_grad(o, x, dy, n);
}
static void ew_add(float *o, const float *x, const float *y, int64_t n, float alpha) {
    for (int64_t i = 0; i < n; i++) o[i] = x[i] + y[i];
}
static void ew_scale(float *o, const float *x, const float *y, int64_t n, float alpha) {
    for (int64_t i = 0; i < n; i++) o[i] = x[i] * alpha;
}

/* out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), inp (n). */
static zoff_status gelu_fwd(const zoff_op_gelu_fwd_args *a, int nt) {
    ew_blocks(a->out, a->inp, NULL, a->n, a->dt, nt, ew_gelu, 0.0f);
    return ZOFF_OK;
}

/* dinp (n) = GELU'(inp) * dout; dinp may alias dout. */
static zoff_status gelu_bwd(const zoff_op_gelu_bwd_args *a, int nt) {
    ew_blocks(a->dinp, a->inp, a->dout, a->n, a->dt, nt, ew_gelu_grad, 0.0f);
    return ZOFF_OK;
}

/* out (n) = a + b; out may alias a or b. */
static zoff_status add_op(const zoff_op_add_args *a, int nt) {
    ew_blocks(a->out, a->a, a->b, a->n, a->dt, nt, ew_add, 0.0f);
    return ZOFF_OK;
}

/* x (n) *= alpha. */
static zoff_status scale_op(const zoff_op_scale_args *a, int nt) {
    ew_blocks(a->x, a->x, NULL, a->n, a->dt, nt, ew_scale, a->alpha);
    return ZOFF_OK;
}

/* dst (n) of dst_dt = src (n) of src_dt, round to nearest even. */
static zoff_status cast_op(const zoff_op_cast_args *a, int nt) {
    const int64_t n = a->n;
    if (a->dst_dt == a->src_dt && (unsigned)a->dst_dt < ZOFF_DTYPE_COUNT) {
        if (n > 0 && a->dst != a->src) memmove(a->dst, a->src, (size_t)n * zoff_dtype_size(a->dst_dt));
        return ZOFF_OK;
    }
    ZOFF_TRY(check_dt(ZOFF_OP_CAST, "source", a->src_dt));
    ZOFF_TRY(check_dt(ZOFF_OP_CAST, "destination", a->dst_dt));
    if (n > 0 && a->dst != a->src && dsize(a->dst_dt) != dsize(a->src_dt)) {
        /* in place only when the element sizes match (each block is read before it is written) */
        const char *d = a->dst, *s = a->src;
        size_t db = (size_t)n * dsize(a->dst_dt), sb = (size_t)n * dsize(a->src_dt);
        if (d < s + sb && s < d + db)
            return zoff_error(ZOFF_ERR_INVALID, "cast: source and destination overlap with different element sizes "
                                                "(%s -> %s); use separate buffers", zoff_dtype_name(a->src_dt),
                              zoff_dtype_name(a->dst_dt));
    }
    const int64_t nb = (n + BLK - 1) / BLK;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, len = n - i0 < BLK ? n - i0 : BLK;
        float sx[BLK];
        const float *x = view_rd(eptr(a->src, i0, a->src_dt), len, a->src_dt, sx);
        if (a->dst_dt == ZOFF_F32) {
            memmove(eptr(a->dst, i0, ZOFF_F32), x, (size_t)len * 4);
        } else {
            store_f32(eptr(a->dst, i0, a->dst_dt), x, len, a->dst_dt);
        }
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ cross entropy */

/* losses (N) fp32 = logsumexp(logits[i,:V]) - logits[i,target]; logits (N,Vp);
 * dlogits (N,Vp) = (softmax - onehot) * dloss, padded columns 0; may alias logits. */
static zoff_status cross_entropy(const zoff_op_cross_entropy_args *a, int nt) {
    const int64_t N = a->N, V = a->V, Vp = a->Vp;
    const zoff_dtype dt = a->dt;
    if (N == 0) return ZOFF_OK;
    if (V < 1 || Vp < V)
        return zoff_error(ZOFF_ERR_INVALID, "cross entropy: need 1 <= V <= Vp, got V = %lld, Vp = %lld",
                          (long long)V, (long long)Vp);
    for (int64_t i = 0; i < N; i++)
        if (a->targets[i] >= V)
            return zoff_error(ZOFF_ERR_INVALID,
                              "cross entropy: target %d at row %lld is >= the vocabulary size V = %lld; targets "
                              "must be in [0, V), or negative to ignore a row",
                              (int)a->targets[i], (long long)i, (long long)V);
    float *scr = NULL;
    if (dt != ZOFF_F32 && !(scr = scratch_alloc((int64_t)nt * 2 * Vp, "cross entropy scratch"))) return ZOFF_ERR_NOMEM;
    const float dloss = a->dloss;
#pragma omp parallel num_threads(nt) if (N * Vp > PAR_MIN)
    {
        float *s = scr ? scr + (int64_t)omp_get_thread_num() * 2 * Vp : NULL;
#pragma omp for schedule(static)
        for (int64_t i = 0; i < N; i++) {
            const int32_t tgt = a->targets[i];
            const float *l = view_rd(eptr(a->logits, i * Vp, dt), V, dt, s);
            const float mx = vec()->max(l, V);
            const float lt = tgt >= 0 ? l[tgt] : 0.0f;
            float sum = 0.0f;
            void *drow = a->dlogits ? eptr(a->dlogits, i * Vp, dt) : NULL;
            if (drow && tgt >= 0) {
                /* one exp per element: d = exp(l - max) (in place when d aliases l), then scale */
                float *d = view_wr(drow, dt, s ? s + Vp : NULL);
                sum = vec()->exp_sum(d, l, V, mx);
                const float sc = dloss / sum;
                for (int64_t j = 0; j < V; j++) d[j] *= sc;
                d[tgt] -= dloss;
                for (int64_t j = V; j < Vp; j++) d[j] = 0.0f;
                view_commit(drow, d, Vp, dt);
            } else {
                if (tgt >= 0) sum = vec()->exp_sum(NULL, l, V, mx);
                if (drow) {
                    if (dt == ZOFF_F32) memset(drow, 0, (size_t)Vp * 4);
                    else memset(drow, 0, (size_t)Vp * 2); /* +0 in bf16 and f16 */
                }
            }
            if (a->losses) a->losses[i] = tgt >= 0 ? mx + logf(sum) - lt : 0.0f;
        }
    }
    zoff_aligned_free(scr);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ optimizer support */

/* Elements per GRAD_STATS chunk: partial sums are combined in chunk order, so
 * the result is the same for any thread count. */
#define GS_CHUNK 65536

/* stats[0] += sum of x^2 (fp64 accumulation); stats[1] = 1 if x has inf/NaN. x (n). */
static zoff_status grad_stats(const zoff_op_grad_stats_args *a, int nt) {
    const int64_t n = a->n, nch = (n + GS_CHUNK - 1) / GS_CHUNK;
    const zoff_dtype dt = a->dt;
    if (n == 0) return ZOFF_OK;
    double *part = malloc((size_t)nch * sizeof(double));
    if (!part)
        return zoff_error(ZOFF_ERR_NOMEM, "grad stats: out of host memory for %lld partial sums", (long long)nch);
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t ch = 0; ch < nch; ch++) {
        int64_t c0 = ch * GS_CHUNK, c1 = n - c0 < GS_CHUNK ? n : c0 + GS_CHUNK;
        double s = 0.0;
        for (int64_t i0 = c0; i0 < c1; i0 += BLK) {
            int64_t len = c1 - i0 < BLK ? c1 - i0 : BLK;
            float sx[BLK];
            const float *x = view_rd(eptr(a->x, i0, dt), len, dt, sx);
            double bs = 0.0;
#pragma omp simd reduction(+ : bs)
            for (int64_t i = 0; i < len; i++) bs += (double)x[i] * (double)x[i];
            s += bs;
        }
        part[ch] = s;
    }
    double total = 0.0;
    for (int64_t ch = 0; ch < nch; ch++) total += part[ch];
    free(part);
    /* squares of finite floats are < 2^256, so the fp64 sum is finite unless an element was inf/NaN */
    if (!isfinite(total)) a->stats[1] = 1.0f;
    a->stats[0] = (float)((double)a->stats[0] + total);
    return ZOFF_OK;
}

/* Fused Adam/AdamW over n elements; params, m, v fp32 (n); grads (n) of grad_dt;
 * params16 (n) of p16_dt (optional copy of the new weights). */
static zoff_status adam(const zoff_op_adam_args *a, int nt) {
    const int64_t n = a->n, nb = (n + BLK - 1) / BLK;
    const zoff_dtype gdt = a->grad_dt, pdt = a->p16_dt;
    const float lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
    const float ibc1 = 1.0f / a->bc1, ibc2 = 1.0f / a->bc2, gs = a->grad_scale;
    const int adamw = a->adam_w_mode;
#pragma omp parallel for num_threads(nt) if (n > PAR_MIN) schedule(static)
    for (int64_t b = 0; b < nb; b++) {
        int64_t i0 = b * BLK, len = n - i0 < BLK ? n - i0 : BLK;
        float sg[BLK];
        const float *g = view_rd(eptr(a->grads, i0, gdt), len, gdt, sg);
        float *p = a->params + i0, *m = a->m + i0, *v = a->v + i0;
        for (int64_t i = 0; i < len; i++) {
            float gi = g[i] * gs, pi = p[i];
            if (!adamw) gi += wd * pi;
            float mi = b1 * m[i] + (1.0f - b1) * gi;
            float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
            m[i] = mi;
            v[i] = vi;
            if (adamw) pi -= lr * wd * pi;
            pi -= lr * (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
            p[i] = pi;
        }
        if (a->params16) {
            if (pdt == ZOFF_F32) memcpy(eptr(a->params16, i0, pdt), p, (size_t)len * 4);
            else store_f32(eptr(a->params16, i0, pdt), p, len, pdt);
        }
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ dispatch */

zoff_status zoff_cpu_run_op(zoff_op op, const void *args, int threads) {
    if (!args) return zoff_error(ZOFF_ERR_INVALID, "zoff_cpu_run_op: args is NULL for op %d", (int)op);
    const int nt = nthreads(threads);
    pthread_once(&g_blas_once, blas_single_thread);
    switch (op) {
    case ZOFF_OP_EMBED_FWD: {
        const zoff_op_embed_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return embed_fwd(a, nt);
    }
    case ZOFF_OP_EMBED_BWD: {
        const zoff_op_embed_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return embed_bwd(a, nt);
    }
    case ZOFF_OP_LAYERNORM_FWD: {
        const zoff_op_layernorm_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return layernorm_fwd(&(zoff_op_residual_layernorm_fwd_args){.out = a->out, .mean = a->mean, .rstd = a->rstd,
                                 .a = a->inp, .weight = a->weight, .bias = a->bias, .N = a->N, .C = a->C, .dt = a->dt}, nt);
    }
    case ZOFF_OP_LAYERNORM_BWD: {
        const zoff_op_layernorm_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return layernorm_bwd(&(zoff_op_residual_layernorm_bwd_args){.dinp = a->dinp, .dresid = a->dinp,
                                 .dweight = a->dweight, .dbias = a->dbias, .dout = a->dout, .inp = a->inp,
                                 .weight = a->weight, .mean = a->mean, .rstd = a->rstd, .N = a->N, .C = a->C,
                                 .dt = a->dt}, nt);
    }
    case ZOFF_OP_MATMUL_FWD: {
        const zoff_op_matmul_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return matmul_fwd(a, nt);
    }
    case ZOFF_OP_MATMUL_BWD: {
        const zoff_op_matmul_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return matmul_bwd(a, nt);
    }
    case ZOFF_OP_ATTENTION_FWD: {
        const zoff_op_attention_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return attention_fwd(a, nt);
    }
    case ZOFF_OP_ATTENTION_BWD: {
        const zoff_op_attention_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return attention_bwd(a, nt);
    }
    case ZOFF_OP_GELU_FWD: {
        const zoff_op_gelu_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return gelu_fwd(a, nt);
    }
    case ZOFF_OP_GELU_BWD: {
        const zoff_op_gelu_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return gelu_bwd(a, nt);
    }
    case ZOFF_OP_ADD: {
        const zoff_op_add_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return add_op(a, nt);
    }
    case ZOFF_OP_CROSS_ENTROPY: {
        const zoff_op_cross_entropy_args *a = args;
        ZOFF_TRY(check_dt(op, "logits", a->dt));
        return cross_entropy(a, nt);
    }
    case ZOFF_OP_CAST:
        return cast_op(args, nt);
    case ZOFF_OP_SCALE: {
        const zoff_op_scale_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return scale_op(a, nt);
    }
    case ZOFF_OP_GRAD_STATS: {
        const zoff_op_grad_stats_args *a = args;
        ZOFF_TRY(check_dt(op, "gradient", a->dt));
        return grad_stats(a, nt);
    }
    case ZOFF_OP_ADAM: {
        const zoff_op_adam_args *a = args;
        ZOFF_TRY(check_dt(op, "gradient", a->grad_dt));
        if (a->params16) ZOFF_TRY(check_dt(op, "params16", a->p16_dt));
        return adam(a, nt);
    }
    case ZOFF_OP_RESIDUAL_LAYERNORM_FWD: {
        const zoff_op_residual_layernorm_fwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return layernorm_fwd(a, nt);
    }
    case ZOFF_OP_RESIDUAL_LAYERNORM_BWD: {
        const zoff_op_residual_layernorm_bwd_args *a = args;
        ZOFF_TRY(check_dt(op, "storage", a->dt));
        return layernorm_bwd(a, nt);
    }
    case ZOFF_OP_COUNT:
        break;
    }
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "CPU backend: unknown op code %d; valid ops are 0..%d", (int)op,
                      (int)ZOFF_OP_COUNT - 1);
}
