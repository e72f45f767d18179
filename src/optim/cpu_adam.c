/* Host optimizers: hyperparameters, beta powers, SIMD path dispatch and
 * threading. The kernels are in cpu_optim_body.h, compiled once per path
 * (cpu_adam_scalar.c, cpu_adam_avx2.c, cpu_adam_avx512.c, cpu_adam_neon.c). */
#define _POSIX_C_SOURCE 200809L
#include "zoff/optim.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "optim/cpu_optim_internal.h"

#if defined(__SANITIZE_THREAD__)
#include <pthread.h>
#endif
#include <stdatomic.h>

/* Chunk boundaries fall on multiples of this many elements past the first
 * 64-byte-aligned fp32 weight: 64 bytes of fp32 and of 16-bit arrays alike. */
#define ZO_ALIGN_ELEMS 32

struct zoff_host_optimizer {
    zoff_optimizer_type type;
    int kind;           /* ZO_KIND_* */
    bool decoupled;     /* Adam: decoupled weight decay */
    bool bias_correction;
    double beta1, beta2, eps, init_acc;
    /* beta powers, kept as DeepSpeed's Adam_Optimizer::IncrementStep does */
    int64_t step;       /* last step begun (0 = none) */
    double beta1_t, beta2_t;
    double pow_b1, pow_b2; /* the betas the powers were computed with */
    bool begun;
    double lr;
    float step_size, bc2inv;
    uint32_t step_seed;
    /* execution */
    int threads;
    int64_t serial_below;
    zoff_simd_path path;
    zoff_optim_range_fn (*select)(int kind, int gd, int sd, int pd);
    zoff_state_rounding sround;
    uint32_t salt;
};

/* ------------------------------------------------------------------ paths */

const char *zoff_simd_path_name(zoff_simd_path path) {
    switch (path) {
    case ZOFF_SIMD_AUTO: return "auto";
    case ZOFF_SIMD_SCALAR: return "scalar";
    case ZOFF_SIMD_AVX2: return "avx2";
    case ZOFF_SIMD_AVX512: return "avx512";
    case ZOFF_SIMD_AVX512_BF16: return "avx512+bf16";
    case ZOFF_SIMD_NEON: return "neon";
    }
    return "unknown";
}

zoff_status zoff_simd_path_parse(const char *name, zoff_simd_path *out) {
    if (!name) return zoff_error(ZOFF_ERR_INVALID, "SIMD path name is NULL");
    if (!strcmp(name, "auto")) *out = ZOFF_SIMD_AUTO;
    else if (!strcmp(name, "scalar")) *out = ZOFF_SIMD_SCALAR;
    else if (!strcmp(name, "avx2")) *out = ZOFF_SIMD_AVX2;
    else if (!strcmp(name, "avx512"))
        *out = zoff_simd_path_available(ZOFF_SIMD_AVX512_BF16) ? ZOFF_SIMD_AVX512_BF16 : ZOFF_SIMD_AVX512;
    else if (!strcmp(name, "avx512-nobf16")) *out = ZOFF_SIMD_AVX512;
    else if (!strcmp(name, "avx512+bf16")) *out = ZOFF_SIMD_AVX512_BF16;
    else if (!strcmp(name, "neon")) *out = ZOFF_SIMD_NEON;
    else
        return zoff_error(ZOFF_ERR_INVALID,
                          "unknown SIMD path '%s'; use one of auto, scalar, avx2, avx512, avx512-nobf16, neon", name);
    return ZOFF_OK;
}

bool zoff_simd_path_available(zoff_simd_path path) {
    const zoff_cpu_features *f = zoff_cpu_features_get();
    switch (path) {
    case ZOFF_SIMD_AUTO:
    case ZOFF_SIMD_SCALAR: return true;
#if defined(__x86_64__) || defined(__i386__)
    case ZOFF_SIMD_AVX2: return f->avx2 && f->fma && f->f16c;
    case ZOFF_SIMD_AVX512: return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
    case ZOFF_SIMD_AVX512_BF16:
        return f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c && f->avx512_bf16;
#endif
#if defined(__aarch64__)
    case ZOFF_SIMD_NEON: return f->neon;
#endif
    default: return false;
    }
}

zoff_simd_path zoff_simd_path_best(void) {
    static const zoff_simd_path order[] = {ZOFF_SIMD_AVX512_BF16, ZOFF_SIMD_AVX512, ZOFF_SIMD_AVX2, ZOFF_SIMD_NEON};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (zoff_simd_path_available(order[i])) return order[i];
    return ZOFF_SIMD_SCALAR;
}

static zoff_optim_range_fn (*path_select(zoff_simd_path path))(int, int, int, int) {
    switch (path) {
#if defined(__x86_64__) || defined(__i386__)
    case ZOFF_SIMD_AVX2: return zoff_optim_select_avx2;
    case ZOFF_SIMD_AVX512: return zoff_optim_select_avx512;
    case ZOFF_SIMD_AVX512_BF16: return zoff_optim_select_avx512bf16;
#endif
#if defined(__aarch64__)
    case ZOFF_SIMD_NEON: return zoff_optim_select_neon;
#endif
    default: return zoff_optim_select_scalar;
    }
}

zoff_status zoff_host_optimizer_set_path(zoff_host_optimizer *opt, zoff_simd_path path) {
    if (!opt) return zoff_error(ZOFF_ERR_INVALID, "optimizer is NULL");
    if (path == ZOFF_SIMD_AUTO) {
        const char *env = getenv("ZOFF_SIMD");
        if (env && *env) {
            zoff_status s = zoff_simd_path_parse(env, &path);
            if (s != ZOFF_OK) return zoff_error_context(s, "environment variable ZOFF_SIMD");
        }
        if (path == ZOFF_SIMD_AUTO) path = zoff_simd_path_best();
    }
    if (!zoff_simd_path_available(path)) {
        const zoff_cpu_features *f = zoff_cpu_features_get();
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "SIMD path '%s' is not available on this CPU/build (avx2=%d fma=%d f16c=%d avx512f=%d "
                          "avx512bw=%d avx512vl=%d avx512dq=%d avx512_bf16=%d neon=%d); best available is '%s' "
                          "(unset ZOFF_SIMD or choose another path)",
                          zoff_simd_path_name(path), f->avx2, f->fma, f->f16c, f->avx512f, f->avx512bw, f->avx512vl,
                          f->avx512dq, f->avx512_bf16, f->neon, zoff_simd_path_name(zoff_simd_path_best()));
    }
    opt->path = path;
    opt->select = path_select(path);
    return ZOFF_OK;
}

zoff_simd_path zoff_host_optimizer_simd(const zoff_host_optimizer *opt) { return opt->path; }
const char *zoff_host_optimizer_path(const zoff_host_optimizer *opt) { return zoff_simd_path_name(opt->path); }
int zoff_host_optimizer_threads(const zoff_host_optimizer *opt) { return opt->threads; }
zoff_optimizer_type zoff_host_optimizer_type(const zoff_host_optimizer *opt) { return opt->type; }
bool zoff_host_optimizer_uses_exp_avg(const zoff_host_optimizer *opt) { return opt->kind != ZO_KIND_ADAGRAD; }
bool zoff_host_optimizer_uses_exp_avg_sq(const zoff_host_optimizer *opt) { return opt->kind != ZO_KIND_LION; }

/* ------------------------------------------------------------------ threads */

/* Leading positive integer of an environment variable; 0 if unset or not one. */
static int env_threads(const char *name, bool strict, zoff_status *st) {
    const char *s = getenv(name);
    *st = ZOFF_OK;
    if (!s || !*s) return 0;
    errno = 0;
    char *end = NULL;
    long v = strtol(s, &end, 10);
    bool ok = end != s && errno == 0 && v > 0 && v <= 4096 && (!strict || *end == '\0');
    if (!ok) {
        if (strict)
            *st = zoff_error(ZOFF_ERR_INVALID, "environment variable %s='%s' is not a thread count (1..4096)", name, s);
        return 0;
    }
    return (int)v;
}

int zoff_host_optimizer_threads_for_share(double share) {
    if (share < 0) return 0;
    long t = lround(share * (double)zoff_cpu_features_get()->logical_cores);
    return t < 1 ? 1 : t > 4096 ? 4096 : (int)t;
}

zoff_status zoff_host_optimizer_set_threads(zoff_host_optimizer *opt, int threads) {
    if (!opt) return zoff_error(ZOFF_ERR_INVALID, "optimizer is NULL");
    if (threads < 0 || threads > 4096)
        return zoff_error(ZOFF_ERR_INVALID, "optimizer thread count %d is out of range (0 = default, 1..4096)", threads);
    if (threads == 0) {
        zoff_status st;
        threads = env_threads("ZOFF_THREADS", true, &st);
        if (st != ZOFF_OK) return st;
        if (threads == 0) threads = env_threads("OMP_NUM_THREADS", false, &st);
        if (threads == 0) threads = zoff_cpu_features_get()->logical_cores;
        if (threads < 1) threads = 1;
    }
    opt->threads = threads;
    return ZOFF_OK;
}

static int64_t chunk_bound(int k, int nt, int64_t n, int64_t head) {
    if (k <= 0) return 0;
    if (k >= nt) return n;
    int64_t x = (n / nt) * k + ((n % nt) * k) / nt;
    if (x <= head) return head < n ? head : n;
    x = head + ((x - head) / ZO_ALIGN_ELEMS) * ZO_ALIGN_ELEMS;
    return x < n ? x : n;
}

/* Elements per block of a backed-up update: 16 KB of each fp32 array, still in L2 when
 * the kernel reads what the copy just read or wrote. A multiple of ZO_ALIGN_ELEMS. */
#define ZO_BK_BLOCK 4096
/* Elements per call of a before_write hook: 128 KiB of each fp32 array (what it copies away is
 * still in L2 when the kernel reads it; fewer calls, fewer store fences). A multiple of
 * ZO_BK_BLOCK. */
#define ZO_HOOK_BLOCK 32768

static void zo_copy_here(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }

/* The backup copy of [lo, hi) (a->bk_dir: 1 state to backup, 2 backup to state). */
static void zo_bk_copy(const zoff_optim_kargs *a, int64_t lo, int64_t hi) {
    const size_t n = (size_t)(hi - lo), ss = (size_t)a->ssize, o = (size_t)lo;
    const bool save = a->bk_dir == 1;
    void (*copy)(void *, const void *, size_t) = save ? zoff_copy_streaming : zo_copy_here;
    float *p = a->p + o, *pb = a->pb + o;
    copy(save ? pb : p, save ? p : pb, n * 4);
    if (a->m) {
        char *m = (char *)a->m + o * ss, *mb = (char *)a->mb + o * ss;
        copy(save ? mb : m, save ? m : mb, n * ss);
    }
    if (a->v) {
        char *v = (char *)a->v + o * ss, *vb = (char *)a->vb + o * ss;
        copy(save ? vb : v, save ? v : vb, n * ss);
    }
}

/* A piece [lo, hi) of one thread: the kernel (fn; NULL: the backup copy only), with the
 * caller's before_write hook and the backup copy block by block just before the kernel runs
 * on the block. Splitting a range changes no result (every element is computed alone; tails
 * as full vectors). */
static void zo_run(zoff_optim_range_fn fn, const zoff_optim_kargs *a, int64_t lo, int64_t hi) {
    if (!a->bk_dir && !a->before_write) {
        fn(a, lo, hi);
        return;
    }
    const int64_t step = a->before_write ? ZO_HOOK_BLOCK : ZO_BK_BLOCK;
    for (int64_t b = lo; b < hi; b += step) {
        int64_t e = hi - b > step ? b + step : hi;
        if (a->before_write) a->before_write(a->before_write_ctx, b, e);
        for (int64_t c = b; c < e && a->bk_dir; c += ZO_BK_BLOCK) {
            int64_t ce = e - c > ZO_BK_BLOCK ? c + ZO_BK_BLOCK : e;
            zo_bk_copy(a, c, ce);
            if (fn) fn(a, c, ce);
        }
        if (!a->bk_dir && fn) fn(a, b, e);
    }
    zoff_store_fence(); /* the streaming stores visible before the thread's part counts as done */
}

/* Work sharing. Each thread's chunk (chunk_bound: contiguous, aligned) is taken in pieces of
 * ZO_PIECE_ELEMS from its front through an atomic cursor, first by its own thread, then by
 * any thread done with its own: a thread the scheduler holds back (a checkpoint writer, the
 * data loader, another process on its core) no longer holds the whole update back, while in
 * the common case every thread still works through its own chunk (the pages it first
 * touched, init_state). A piece is computed the same whichever thread runs it. */
#define ZO_PIECE_ELEMS 65536 /* 256 KiB of each fp32 array; a multiple of ZO_ALIGN_ELEMS */

typedef struct zo_cursor {
    _Atomic int64_t next; /* elements of the chunk taken */
    char pad[64 - sizeof(int64_t)];
} zo_cursor;

static void zo_share(zoff_optim_range_fn fn, const zoff_optim_kargs *a, zo_cursor *cur, int nt, int k, int64_t head) {
    for (int d = 0; d < nt; d++) {
        const int j = (k + d) % nt;
        const int64_t lo = chunk_bound(j, nt, a->n, head), hi = chunk_bound(j + 1, nt, a->n, head);
        for (;;) {
            int64_t x = lo + atomic_fetch_add_explicit(&cur[j].next, ZO_PIECE_ELEMS, memory_order_relaxed);
            if (x >= hi) break;
            zo_run(fn, a, x, hi - x > ZO_PIECE_ELEMS ? x + ZO_PIECE_ELEMS : hi);
        }
    }
}

#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer cannot see libgomp's fork/join synchronisation (libgomp is not
 * instrumented) and reports every parallel region as a race. TSan builds fork
 * and join plain pthreads instead: the same chunks and kernels, with
 * synchronisation TSan understands. */
typedef struct zo_job {
    zoff_optim_range_fn fn;
    const zoff_optim_kargs *a;
    zo_cursor *cur;
    int nt, k;
    int64_t lo, hi, head;
} zo_job;

static void *zo_job_main(void *arg) {
    zo_job *j = arg;
    if (j->cur) zo_share(j->fn, j->a, j->cur, j->nt, j->k, j->head);
    else if (j->lo < j->hi) zo_run(j->fn, j->a, j->lo, j->hi);
    return NULL;
}

static void run_pthreads(zoff_optim_range_fn fn, const zoff_optim_kargs *a, zo_cursor *cur, int nt, int64_t head) {
    enum { MAXT = 64 };
    zo_job jobs[MAXT];
    pthread_t th[MAXT];
    bool started[MAXT] = {false};
    if (nt > MAXT) nt = MAXT;
    for (int k = 0; k < nt; k++)
        jobs[k] = (zo_job){fn, a, cur, nt, k, chunk_bound(k, nt, a->n, head), chunk_bound(k + 1, nt, a->n, head), head};
    for (int k = 1; k < nt; k++) started[k] = pthread_create(&th[k], NULL, zo_job_main, &jobs[k]) == 0;
    zo_job_main(&jobs[0]);
    for (int k = 1; k < nt; k++) {
        if (started[k]) pthread_join(th[k], NULL);
        else zo_job_main(&jobs[k]);
    }
}
#endif

/* Run fn over [0, n) (with the hook and the backup copy, if any): serially when short, else
 * one contiguous aligned chunk per thread, shared (zo_share) or, share false (init_state: the
 * first touch places each page with its thread), each thread its own only. */
static void run_range(const zoff_host_optimizer *opt, zoff_optim_range_fn fn, const zoff_optim_kargs *a, bool share) {
    const int64_t n = a->n;
    int nt = opt->threads;
    int64_t maxt = (n + ZO_ALIGN_ELEMS - 1) / ZO_ALIGN_ELEMS; /* at least one aligned block each */
    if (maxt < nt) nt = (int)maxt;
    if (nt <= 1 || (opt->serial_below > 0 && n < opt->serial_below) || omp_in_parallel()) {
        zo_run(fn, a, 0, n);
        return;
    }
    uintptr_t addr = (uintptr_t)a->p;
    int64_t head = (addr & 3) ? 0 : (int64_t)(((64 - (addr & 63)) & 63) / 4);
    enum { STACK_CURSORS = 64 };
    zo_cursor stack_cur[STACK_CURSORS], *cur = NULL;
    if (share) cur = nt <= STACK_CURSORS ? stack_cur : aligned_alloc(64, (size_t)nt * sizeof *cur);
    for (int k = 0; cur && k < nt; k++) atomic_init(&cur[k].next, 0); /* (no memory: each thread its own) */
#if defined(__SANITIZE_THREAD__)
    run_pthreads(fn, a, cur, nt, head);
#else
#pragma omp parallel num_threads(nt)
    {
        int tn = omp_get_num_threads(), k = omp_get_thread_num();
        if (cur) { /* every chunk is taken, however many threads the runtime gave */
            zo_share(fn, a, cur, nt, k, head);
        } else {
            int64_t lo = chunk_bound(k, tn, n, head), hi = chunk_bound(k + 1, tn, n, head);
            if (lo < hi) zo_run(fn, a, lo, hi);
        }
    }
#endif
    if (cur != stack_cur) free(cur);
}

/* ------------------------------------------------------------------ lifecycle */

zoff_status zoff_host_optimizer_create(const zoff_optimizer_config *cfg, int threads, zoff_host_optimizer **out) {
    zoff_host_optimizer_options o = {0};
    o.threads = threads;
    return zoff_host_optimizer_create_ex(cfg, &o, out);
}

static bool finite_in(double x, double lo, double hi) { return isfinite(x) && x >= lo && x <= hi; }

zoff_status zoff_host_optimizer_create_ex(const zoff_optimizer_config *cfg, const zoff_host_optimizer_options *opts,
                                          zoff_host_optimizer **out) {
    if (!cfg || !out) return zoff_error(ZOFF_ERR_INVALID, "zoff_host_optimizer_create: cfg and out must not be NULL");
    *out = NULL;
    zoff_host_optimizer_options o = {0};
    if (opts) o = *opts;
    int kind;
    switch (cfg->type) {
    case ZOFF_OPTIM_ADAM:
    case ZOFF_OPTIM_ADAMW: kind = ZO_KIND_ADAM; break;
    case ZOFF_OPTIM_ADAGRAD: kind = ZO_KIND_ADAGRAD; break;
    case ZOFF_OPTIM_LION: kind = ZO_KIND_LION; break;
    default: return zoff_error(ZOFF_ERR_INVALID, "optimizer.type %d is not a known optimizer", (int)cfg->type);
    }
    if (kind != ZO_KIND_ADAGRAD) {
        if (!finite_in(cfg->beta1, 0.0, 1.0) || cfg->beta1 >= 1.0 || !finite_in(cfg->beta2, 0.0, 1.0) ||
            cfg->beta2 >= 1.0)
            return zoff_error(ZOFF_ERR_CONFIG, "optimizer.params.betas [%g, %g] must both be in [0, 1)", cfg->beta1,
                              cfg->beta2);
    }
    if (kind != ZO_KIND_LION && !finite_in(cfg->eps, 0.0, HUGE_VAL))
        return zoff_error(ZOFF_ERR_CONFIG, "optimizer.params.eps %g must be finite and >= 0", cfg->eps);
    if (!isfinite(cfg->initial_accumulator_value) || cfg->initial_accumulator_value < 0)
        return zoff_error(ZOFF_ERR_CONFIG, "optimizer.params.initial_accumulator_value %g must be finite and >= 0",
                          cfg->initial_accumulator_value);
    if (o.bf16_state_rounding != ZOFF_STATE_ROUND_STOCHASTIC && o.bf16_state_rounding != ZOFF_STATE_ROUND_NEAREST)
        return zoff_error(ZOFF_ERR_INVALID, "bf16_state_rounding %d is not a zoff_state_rounding",
                          (int)o.bf16_state_rounding);

    zoff_host_optimizer *opt = calloc(1, sizeof *opt);
    if (!opt) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory allocating the host optimizer");
    opt->type = cfg->type;
    opt->kind = kind;
    opt->decoupled = cfg->type == ZOFF_OPTIM_ADAMW || (cfg->type == ZOFF_OPTIM_ADAM && cfg->adam_w_mode);
    opt->bias_correction = cfg->bias_correction;
    opt->beta1 = cfg->beta1;
    opt->beta2 = cfg->beta2;
    opt->eps = cfg->eps;
    opt->init_acc = cfg->initial_accumulator_value;
    opt->beta1_t = opt->beta2_t = 1.0;
    opt->pow_b1 = cfg->beta1;
    opt->pow_b2 = cfg->beta2;
    opt->sround = o.bf16_state_rounding;
    opt->salt = o.seed;
    opt->serial_below = o.serial_below == 0 ? ZOFF_OPTIM_SERIAL_BELOW : o.serial_below;
    zoff_status s = zoff_host_optimizer_set_threads(opt, o.threads);
    if (s == ZOFF_OK) s = zoff_host_optimizer_set_path(opt, o.path);
    if (s != ZOFF_OK) {
        free(opt);
        return s;
    }
    *out = opt;
    return ZOFF_OK;
}

void zoff_host_optimizer_destroy(zoff_host_optimizer *opt) { free(opt); }

zoff_status zoff_host_optimizer_set_betas(zoff_host_optimizer *opt, double beta1, double beta2) {
    if (!opt) return zoff_error(ZOFF_ERR_INVALID, "optimizer is NULL");
    if (!finite_in(beta1, 0.0, 1.0) || beta1 >= 1.0 || !finite_in(beta2, 0.0, 1.0) || beta2 >= 1.0)
        return zoff_error(ZOFF_ERR_INVALID, "betas [%g, %g] must both be in [0, 1)", beta1, beta2);
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    return ZOFF_OK;
}

zoff_status zoff_host_optimizer_set_eps(zoff_host_optimizer *opt, double eps) {
    if (!opt) return zoff_error(ZOFF_ERR_INVALID, "optimizer is NULL");
    if (!finite_in(eps, 0.0, HUGE_VAL)) return zoff_error(ZOFF_ERR_INVALID, "eps %g must be finite and >= 0", eps);
    opt->eps = eps;
    return ZOFF_OK;
}

zoff_status zoff_host_optimizer_begin_step(zoff_host_optimizer *opt, int64_t step, double lr) {
    if (!opt) return zoff_error(ZOFF_ERR_INVALID, "optimizer is NULL");
    if (step < 1) return zoff_error(ZOFF_ERR_INVALID, "optimizer step %lld must be >= 1 (steps are 1-based)", (long long)step);
    if (!isfinite(lr)) return zoff_error(ZOFF_ERR_INVALID, "learning rate %g is not finite", lr);
    /* DeepSpeed's IncrementStep: multiply on consecutive steps, pow() after a jump or a change of betas */
    if (opt->beta1 != opt->pow_b1 || opt->beta2 != opt->pow_b2 || step != opt->step + 1) {
        opt->beta1_t = pow(opt->beta1, (double)step);
        opt->beta2_t = pow(opt->beta2, (double)step);
        opt->pow_b1 = opt->beta1;
        opt->pow_b2 = opt->beta2;
    } else {
        opt->beta1_t *= opt->beta1;
        opt->beta2_t *= opt->beta2;
    }
    opt->step = step;
    opt->lr = lr;
    double bc1 = 1.0, bc2 = 1.0;
    if (opt->kind == ZO_KIND_ADAM && opt->bias_correction) {
        bc1 = 1.0 - opt->beta1_t;
        bc2 = 1.0 - opt->beta2_t;
    }
    if (opt->kind == ZO_KIND_ADAM) {
        opt->step_size = (float)(-lr / bc1);
        opt->bc2inv = (float)(1.0 / sqrt(bc2));
    } else {
        opt->step_size = (float)(-lr);
        opt->bc2inv = 1.0f;
    }
    uint64_t su = (uint64_t)step;
    opt->step_seed = zoff_optim_hash32(opt->salt ^ zoff_optim_hash32((uint32_t)su ^ zoff_optim_hash32((uint32_t)(su >> 32) + 0x9e3779b9u)));
    opt->begun = true;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ update */

static int zo_dt(zoff_dtype dt) {
    switch (dt) {
    case ZOFF_F32: return ZO_F32;
    case ZOFF_BF16: return ZO_BF16;
    case ZOFF_F16: return ZO_F16;
    default: return -1;
    }
}

/* The backup arrays (t->n > 0): one for each array the optimizer uses. */
static zoff_status check_backup(const zoff_host_optimizer *opt, const zoff_optim_tensors *t, const char *fn) {
    if (t->backup == ZOFF_BACKUP_NONE) return ZOFF_OK;
    if (t->backup != ZOFF_BACKUP_SAVE && t->backup != ZOFF_BACKUP_RESTORE)
        return zoff_error(ZOFF_ERR_INVALID, "%s: backup %d is not a zoff_optim_backup", fn, (int)t->backup);
    if (!t->backup_params || (zoff_host_optimizer_uses_exp_avg(opt) && !t->backup_exp_avg) ||
        (zoff_host_optimizer_uses_exp_avg_sq(opt) && !t->backup_exp_avg_sq))
        return zoff_error(ZOFF_ERR_INVALID, "%s: a backup needs backup_params and a backup of each state array used",
                          fn);
    return ZOFF_OK;
}

static zoff_status check_tensors(const zoff_host_optimizer *opt, const zoff_optim_tensors *t, const char *fn, int *gd,
                                 int *sd, int *pd) {
    if (!opt || !t) return zoff_error(ZOFF_ERR_INVALID, "%s: optimizer and tensors must not be NULL", fn);
    if (t->n < 0) return zoff_error(ZOFF_ERR_INVALID, "%s: n = %lld is negative", fn, (long long)t->n);
    *gd = zo_dt(t->grad_dt);
    if (*gd < 0)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: gradient dtype %s is not supported (use f32, bf16 or f16)", fn,
                          zoff_dtype_name(t->grad_dt));
    *sd = zo_dt(t->state_dt);
    if (*sd != ZO_F32 && *sd != ZO_BF16)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: optimizer state dtype %s is not supported (use f32 or bf16)", fn,
                          zoff_dtype_name(t->state_dt));
    *pd = ZO_NONE;
    if (t->params16) {
        *pd = zo_dt(t->p16_dt);
        if (*pd != ZO_BF16 && *pd != ZO_F16)
            return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: params16 dtype %s is not supported (use bf16 or f16)", fn,
                              zoff_dtype_name(t->p16_dt));
        if ((const void *)t->params16 == t->grads && *gd == ZO_F32)
            return zoff_error(ZOFF_ERR_INVALID, "%s: params16 aliases fp32 grads; it may alias 16-bit grads only", fn);
    }
    if (t->n == 0) return ZOFF_OK;
    if (!t->params || !t->grads)
        return zoff_error(ZOFF_ERR_INVALID, "%s: params and grads must not be NULL (n = %lld)", fn, (long long)t->n);
    if (zoff_host_optimizer_uses_exp_avg(opt) && !t->exp_avg)
        return zoff_error(ZOFF_ERR_INVALID, "%s: %s needs exp_avg (m) but it is NULL", fn,
                          opt->kind == ZO_KIND_LION ? "Lion" : "Adam");
    if (zoff_host_optimizer_uses_exp_avg_sq(opt) && !t->exp_avg_sq)
        return zoff_error(ZOFF_ERR_INVALID, "%s: %s needs exp_avg_sq (v) but it is NULL", fn,
                          opt->kind == ZO_KIND_ADAGRAD ? "Adagrad" : "Adam");
    return check_backup(opt, t, fn);
}

static void fill_kargs(const zoff_host_optimizer *opt, const zoff_optim_tensors *t, zoff_optim_kargs *a) {
    memset(a, 0, sizeof *a);
    a->p = t->params;
    a->m = zoff_host_optimizer_uses_exp_avg(opt) ? t->exp_avg : NULL;
    a->v = zoff_host_optimizer_uses_exp_avg_sq(opt) ? t->exp_avg_sq : NULL;
    a->g = t->grads;
    a->p16 = t->params16;
    a->n = t->n;
    a->idx0 = (uint32_t)(uint64_t)t->index_base;
    a->bk_dir = t->backup == ZOFF_BACKUP_SAVE ? 1 : t->backup == ZOFF_BACKUP_RESTORE ? 2 : 0;
    a->ssize = (int)zoff_dtype_size(t->state_dt);
    a->pb = t->backup_params;
    a->mb = a->m ? t->backup_exp_avg : NULL;
    a->vb = a->v ? t->backup_exp_avg_sq : NULL;
    a->before_write = t->before_write;
    a->before_write_ctx = t->before_write_ctx;
}

zoff_status zoff_host_optimizer_update(zoff_host_optimizer *opt, const zoff_optim_tensors *t, double weight_decay,
                                       double grad_scale) {
    int gd = 0, sd = 0, pd = ZO_NONE;
    ZOFF_TRY(check_tensors(opt, t, "optimizer update", &gd, &sd, &pd));
    if (!opt->begun) return zoff_error(ZOFF_ERR_INVALID, "optimizer update before zoff_host_optimizer_begin_step");
    if (!isfinite(weight_decay)) return zoff_error(ZOFF_ERR_INVALID, "weight_decay %g is not finite", weight_decay);
    if (!isfinite(grad_scale)) return zoff_error(ZOFF_ERR_INVALID, "grad_scale %g is not finite", grad_scale);
    if (t->n == 0) return ZOFF_OK;
    zoff_optim_kargs a;
    fill_kargs(opt, t, &a);
    a.seed = opt->step_seed;
    a.sround = sd == ZO_BF16 && opt->sround == ZOFF_STATE_ROUND_STOCHASTIC;
    a.gscale = (float)grad_scale;
    a.step = opt->step_size;
    a.bc2inv = opt->bc2inv;
    a.eps = (float)opt->eps;
    a.b1 = (float)opt->beta1;
    a.omb1 = (float)(1.0 - opt->beta1);
    a.b2 = (float)opt->beta2;
    a.omb2 = (float)(1.0 - opt->beta2);
    a.lr = (float)opt->lr;
    const bool decay = weight_decay != 0.0;
    switch (opt->kind) {
    case ZO_KIND_ADAM:
        a.decay_mode = !decay ? ZO_DECAY_NONE : opt->decoupled ? ZO_DECAY_DECOUPLED : ZO_DECAY_L2;
        a.decay = (float)(opt->decoupled ? -opt->lr * weight_decay : weight_decay);
        break;
    case ZO_KIND_ADAGRAD:
        a.decay_mode = decay ? ZO_DECAY_L2 : ZO_DECAY_NONE;
        a.decay = (float)weight_decay;
        break;
    default: /* Lion */
        a.decay_mode = decay ? ZO_DECAY_DECOUPLED : ZO_DECAY_NONE;
        a.decay = (float)(1.0 - opt->lr * weight_decay);
        break;
    }
    zoff_optim_range_fn fn = opt->select(opt->kind, gd, sd, pd);
    if (!fn) return zoff_error(ZOFF_ERR_INTERNAL, "no optimizer kernel for kind %d dtypes %d/%d/%d", opt->kind, gd, sd, pd);
    run_range(opt, fn, &a, true);
    return ZOFF_OK;
}

zoff_status zoff_host_optimizer_copy_backup(zoff_host_optimizer *opt, const zoff_optim_tensors *t) {
    int gd = 0, sd = 0, pd = ZO_NONE;
    if (t && t->n > 0 && !t->grads) { /* not read: any non-NULL pointer passes the checks */
        zoff_optim_tensors c = *t;
        c.grads = t->params;
        return zoff_host_optimizer_copy_backup(opt, &c);
    }
    ZOFF_TRY(check_tensors(opt, t, "optimizer backup copy", &gd, &sd, &pd));
    if (t->backup == ZOFF_BACKUP_NONE)
        return zoff_error(ZOFF_ERR_INVALID, "optimizer backup copy: backup is ZOFF_BACKUP_NONE (nothing to copy)");
    if (t->n == 0) return ZOFF_OK;
    zoff_optim_kargs a;
    fill_kargs(opt, t, &a);
    run_range(opt, NULL, &a, true);
    return ZOFF_OK;
}

zoff_status zoff_host_optimizer_bandwidth_probe(zoff_host_optimizer *opt, const zoff_optim_tensors *t) {
    int gd = 0, sd = 0, pd = ZO_NONE;
    ZOFF_TRY(check_tensors(opt, t, "bandwidth probe", &gd, &sd, &pd));
    if (t->n == 0) return ZOFF_OK;
    zoff_optim_kargs a;
    fill_kargs(opt, t, &a);
    a.gscale = 0.0f; /* p = fma(g, 0, p) = p for finite g and p */
    a.b1 = 1.0f;     /* m = m * 1, v = v * 1 */
    zoff_optim_range_fn fn = opt->select(ZO_KIND_PROBE, gd, sd, pd);
    if (!fn) return zoff_error(ZOFF_ERR_INTERNAL, "no probe kernel for dtypes %d/%d/%d", gd, sd, pd);
    run_range(opt, fn, &a, true);
    return ZOFF_OK;
}

double zoff_host_optimizer_traffic(int moments, zoff_dtype state_dt, zoff_dtype grad_dt, bool params16) {
    return 8.0 + 2.0 * (double)zoff_dtype_size(state_dt) * moments + (double)zoff_dtype_size(grad_dt) +
           (params16 ? 2.0 : 0.0);
}

double zoff_host_optimizer_bytes_per_param(const zoff_host_optimizer *opt, const zoff_optim_tensors *t) {
    int nstates = (int)zoff_host_optimizer_uses_exp_avg(opt) + (int)zoff_host_optimizer_uses_exp_avg_sq(opt);
    return zoff_host_optimizer_traffic(nstates, t->state_dt, t->grad_dt, t->params16 != NULL);
}

/* One thread's chunk of init_state: m = 0, v = its initial value, p's 4 KiB pages touched. */
static void init_chunk(const zoff_optim_kargs *a, int64_t lo, int64_t hi) {
    const size_t ss = (size_t)a->ssize, c = (size_t)(hi - lo);
    if (a->m) memset((char *)a->m + (size_t)lo * ss, 0, c * ss);
    if (a->v) {
        if (a->v_init == 0.0f) {
            memset((char *)a->v + (size_t)lo * ss, 0, c * ss);
        } else if (ss == 4) {
            for (int64_t i = lo; i < hi; i++) ((float *)a->v)[i] = a->v_init;
        } else {
            const uint16_t b = zoff_f32_to_bf16(a->v_init);
            for (int64_t i = lo; i < hi; i++) ((uint16_t *)a->v)[i] = b;
        }
    }
    if (a->touch_p) { /* one element per page (and the last): every page of [lo, hi) faulted in here */
        for (int64_t i = lo; i < hi; i += 4096 / (int64_t)sizeof(float)) a->p[i] = 0.0f;
        a->p[hi - 1] = 0.0f;
    }
}

/* init_state and first_touch: in the chunks run_range gives each thread for an update of
 * this range (same threads, same split), so that a fresh page is first touched, and placed
 * on its NUMA node, by the thread that updates it. */
static zoff_status init_state(zoff_host_optimizer *opt, const zoff_optim_tensors *t, bool touch_p, const char *fn) {
    if (!opt || !t) return zoff_error(ZOFF_ERR_INVALID, "%s: optimizer and tensors must not be NULL", fn);
    if (t->n < 0) return zoff_error(ZOFF_ERR_INVALID, "%s: n = %lld is negative", fn, (long long)t->n);
    const int sd = zo_dt(t->state_dt);
    if (sd != ZO_F32 && sd != ZO_BF16)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: state dtype %s is not supported (use f32 or bf16)", fn,
                          zoff_dtype_name(t->state_dt));
    if (t->n == 0) return ZOFF_OK;
    zoff_optim_kargs a = {.p = t->params, .n = t->n, .ssize = (int)zoff_dtype_size(t->state_dt), .touch_p = (int)touch_p};
    if (zoff_host_optimizer_uses_exp_avg(opt)) {
        if (!t->exp_avg) return zoff_error(ZOFF_ERR_INVALID, "%s: exp_avg is NULL", fn);
        a.m = t->exp_avg;
    }
    if (zoff_host_optimizer_uses_exp_avg_sq(opt)) {
        if (!t->exp_avg_sq) return zoff_error(ZOFF_ERR_INVALID, "%s: exp_avg_sq is NULL", fn);
        a.v = t->exp_avg_sq;
        a.v_init = opt->kind == ZO_KIND_ADAGRAD ? (float)opt->init_acc : 0.0f;
    }
    if (touch_p && !t->params) return zoff_error(ZOFF_ERR_INVALID, "%s: params is NULL", fn);
    run_range(opt, init_chunk, &a, false);
    return ZOFF_OK;
}

zoff_status zoff_host_optimizer_init_state(zoff_host_optimizer *opt, const zoff_optim_tensors *t) {
    return init_state(opt, t, false, "optimizer init_state");
}

zoff_status zoff_host_optimizer_first_touch(zoff_host_optimizer *opt, const zoff_optim_tensors *t) {
    return init_state(opt, t, true, "optimizer first_touch");
}
