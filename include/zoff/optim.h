/* zoff optim: host (CPU) optimizers -- Adam/AdamW, Adagrad and Lion -- with
 * SIMD kernels chosen at run time (AVX-512, AVX2+FMA+F16C, NEON, portable C),
 * run on OpenMP threads over contiguous chunks, at memory bandwidth.
 *
 * One object per optimizer (not per tensor). Each step:
 *
 *     zoff_host_optimizer_begin_step(opt, step, lr);        // once per step
 *     for each range (sub-group, decay / no-decay part):
 *         zoff_host_optimizer_update(opt, &t, weight_decay, grad_scale);
 *
 * One update is a single pass over the range: it reads the fp32 master weights,
 * the state (fp32 or bf16) and the gradient (fp32, bf16 or fp16, widened to fp32
 * in registers: no fp32 gradient buffer is needed), and writes the weights, the
 * state and optionally a 16-bit copy of the new weights (params16). All math is
 * fp32. Per element, with g = grad * grad_scale (grad_scale = 1/loss_scale times
 * the clipping coefficient; 1 = none):
 *
 *   Adam/AdamW (DeepSpeed's CPUAdam semantics):
 *     L2 mode (Adam with adam_w_mode = false):  g += weight_decay * p
 *     m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
 *     decoupled mode (AdamW, or Adam with adam_w_mode): p -= lr * weight_decay * p
 *     p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps)
 *     with bc1 = 1 - b1^step, bc2 = 1 - b2^step, or 1 when bias_correction is off.
 *     The beta powers are kept incrementally across steps and recomputed with
 *     pow() when the betas change or the step is not the previous step + 1.
 *   Adagrad (DeepSpeed's CPUAdagrad): gd = g + weight_decay * p;  v += gd^2;
 *     p -= lr * g / (sqrt(v) + eps).  Note: DeepSpeed divides the gradient
 *     *without* the decay term (torch.optim.Adagrad divides gd); no lr_decay.
 *   Lion (DeepSpeed's CPULion): c = b1 m + (1-b1) g;
 *     p = p * (1 - lr * weight_decay) - lr * sign(c)   (sign(+-0) = +-1, as copysign);
 *     m = b2 m + (1-b2) g.
 *   Weight decay is applied when weight_decay != 0.
 *
 * Non-finite gradients: inf or NaN in g makes that element's state and weight
 * NaN (for all three optimizers; Lion too, unlike DeepSpeed whose sign() hides
 * NaN). Elements are independent: other elements are unaffected. The engine
 * checks for overflow before calling update and skips the step; the optimizer
 * does not check.
 *
 * Results do not depend on the thread count (every element is computed by the
 * same operations whichever thread or vector lane it lands in) and are
 * bit-identical across the scalar, AVX2, AVX-512 and NEON paths, with two
 * stated exceptions: (1) on the "avx512+bf16" path the hardware bf16 rounding
 * (VCVTNEPS2BF16), where it is used, flushes fp32 values below 2^-126 in
 * magnitude to +-0 where the other paths round them to bf16 subnormals (bf16
 * states, bf16 params16 only);
 * (2) NaN payloads may differ (NaN stays NaN). */
#ifndef ZOFF_OPTIM_H
#define ZOFF_OPTIM_H

#include "zoff/config.h"
#include "zoff/device.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zoff_host_optimizer zoff_host_optimizer;

/* SIMD kernel paths. $ZOFF_SIMD (scalar | avx2 | avx512 | avx512-nobf16 | neon)
 * forces one for ZOFF_SIMD_AUTO. */
typedef enum zoff_simd_path {
    ZOFF_SIMD_AUTO = 0,     /* $ZOFF_SIMD if set, else the best the CPU has */
    ZOFF_SIMD_SCALAR,       /* portable C */
    ZOFF_SIMD_AVX2,         /* AVX2 + FMA + F16C */
    ZOFF_SIMD_AVX512,       /* AVX-512 F/BW/VL/DQ; bf16 rounding in integer ops */
    ZOFF_SIMD_AVX512_BF16,  /* same plus AVX512_BF16's VCVTNEPS2BF16 ("avx512" picks this when present) */
    ZOFF_SIMD_NEON          /* aarch64 builds only */
} zoff_simd_path;

/* How fp32 results are rounded into bf16 optimizer state (m, v).
 * Nearest-even is DeepSpeed's behaviour but stalls v: with beta2 = 0.999 the
 * decay b2*v moves v by less than half a bf16 ulp, so v never decreases.
 * Stochastic rounding (unbiased; the random bits are a hash of the element's
 * global index and the step, so results are reproducible and independent of
 * threads and paths) keeps the expected trajectory of fp32 states. See
 * docs/performance.md "CPU Adam" for the measured effect. */
typedef enum zoff_state_rounding {
    ZOFF_STATE_ROUND_STOCHASTIC = 0, /* default */
    ZOFF_STATE_ROUND_NEAREST
} zoff_state_rounding;

typedef struct zoff_host_optimizer_options {
    int threads;                /* 0: $ZOFF_THREADS, else $OMP_NUM_THREADS, else all logical cores */
    zoff_simd_path path;        /* ZOFF_SIMD_AUTO (default) */
    zoff_state_rounding bf16_state_rounding;
    int64_t serial_below;       /* ranges shorter than this run on the calling thread only;
                                   0 = default (ZOFF_OPTIM_SERIAL_BELOW), < 0 = never */
    uint32_t seed;              /* salt for stochastic rounding (default 0) */
} zoff_host_optimizer_options;

/* Default serial threshold in elements: below it, waking the OpenMP team costs
 * more than the second core saves (measured: docs/performance.md). */
#define ZOFF_OPTIM_SERIAL_BELOW 32768

/* What an update does with zoff_optim_tensors' backup arrays. Each thread works
 * through its chunk in blocks of a few thousand elements (kept in cache between the
 * copy and the update), so the state is read from memory once: a saved update costs
 * about one update's traffic plus the backup's writes, a restored one about one
 * update's. The results are the plain update's bit for bit. */
typedef enum zoff_optim_backup {
    ZOFF_BACKUP_NONE = 0,
    ZOFF_BACKUP_SAVE,   /* the old params and state are written to the backup, then updated */
    ZOFF_BACKUP_RESTORE /* params and state start from the backup (an undone update redone) */
} zoff_optim_backup;

/* One contiguous range of parameters and its optimizer state. */
typedef struct zoff_optim_tensors {
    float *params;          /* fp32 master weights (n), updated in place */
    void *exp_avg;          /* m (n) of state_dt: Adam, Lion; NULL for Adagrad */
    void *exp_avg_sq;       /* v (n) of state_dt: Adam, Adagrad (sum of squares); NULL for Lion */
    zoff_dtype state_dt;    /* ZOFF_F32 or ZOFF_BF16 */
    const void *grads;      /* gradient (n) of grad_dt, read only */
    zoff_dtype grad_dt;     /* ZOFF_F32, ZOFF_BF16 or ZOFF_F16 */
    void *params16;         /* optional (NULL = none): receives the new weights as p16_dt.
                               May alias grads exactly (same pointer, both 16-bit). */
    zoff_dtype p16_dt;      /* ZOFF_BF16 or ZOFF_F16 (ignored without params16) */
    int64_t n;              /* elements; 0 is allowed (nothing is touched) */
    int64_t index_base;     /* global index of element 0 (seeds stochastic rounding, so
                               results do not depend on how ranges are split); 0 if unknown */
    /* optional backup of params, exp_avg and exp_avg_sq (same shapes and state_dt; a
       backup array may be NULL only where its state array is), for an update that may be
       undone (speculation): see zoff_optim_backup */
    zoff_optim_backup backup;
    float *backup_params;
    void *backup_exp_avg, *backup_exp_avg_sq;
    /* optional (NULL = none): called by the thread that works on elements [lo, hi) (indices of
       this range, blocks of a few thousand) before any of them is written, with the caller's
       ctx; it may run on several threads at once, for disjoint blocks. A background save's
       snapshot copies the old values away here (zoff_engine_snapshot_*), in the update's own
       pass; the stores it makes are fenced before the thread's part counts as done. */
    void (*before_write)(void *ctx, int64_t lo, int64_t hi);
    void *before_write_ctx;
} zoff_optim_tensors;

/* Create from the config's optimizer section. Adam: decoupled weight decay when
 * cfg->adam_w_mode, else L2; AdamW: always decoupled. threads as in options. */
zoff_status zoff_host_optimizer_create(const zoff_optimizer_config *cfg, int threads, zoff_host_optimizer **out);
/* Same with options (NULL = defaults). */
zoff_status zoff_host_optimizer_create_ex(const zoff_optimizer_config *cfg, const zoff_host_optimizer_options *opts,
                                          zoff_host_optimizer **out);
void zoff_host_optimizer_destroy(zoff_host_optimizer *opt);

/* Start step `step` (1-based) with learning rate lr. Updates the beta powers
 * (incrementally when step = previous + 1 and betas unchanged, else pow()). */
zoff_status zoff_host_optimizer_begin_step(zoff_host_optimizer *opt, int64_t step, double lr);
/* Change the betas (e.g. a momentum schedule); takes effect at the next begin_step. */
zoff_status zoff_host_optimizer_set_betas(zoff_host_optimizer *opt, double beta1, double beta2);
zoff_status zoff_host_optimizer_set_eps(zoff_host_optimizer *opt, double eps);

/* Update one range (see the formulas above). weight_decay applies to all n
 * elements: call once per decay / no-decay range. Ranges shorter than the
 * serial threshold run on the calling thread; longer ones are split into one
 * contiguous, 64-byte-aligned chunk per thread, each taken in pieces from its front by
 * its own thread first and then by any thread done with its own (a thread held back by
 * the scheduler does not hold the update back). update() only reads the
 * optimizer object, so updates of disjoint ranges may run concurrently; none
 * may run concurrently with begin_step or the setters. */
zoff_status zoff_host_optimizer_update(zoff_host_optimizer *opt, const zoff_optim_tensors *t, double weight_decay,
                                       double grad_scale);

/* Only the copy of t->backup (SAVE: params and state to the backup; RESTORE: back from
 * it), no update: the same chunks and threads as update() on t (so the backup's pages are
 * first touched where the update touches the state's). grads is not read. */
zoff_status zoff_host_optimizer_copy_backup(zoff_host_optimizer *opt, const zoff_optim_tensors *t);

/* Initialise a range's state: m = 0, v = 0 (Adagrad: v = initial_accumulator_value), each
 * thread the chunk an update() of the same range gives it (a fresh page is first touched,
 * and so placed on its NUMA node, by the thread that later updates it). */
zoff_status zoff_host_optimizer_init_state(zoff_host_optimizer *opt, const zoff_optim_tensors *t);
/* init_state, and params' pages touched likewise (one element of each 4 KiB page set to 0;
 * the values are the caller's to write next): the first touch of freshly allocated state. */
zoff_status zoff_host_optimizer_first_touch(zoff_host_optimizer *opt, const zoff_optim_tensors *t);

/* Measure the machine's bound: a STREAM-style pass with the same access pattern
 * as update() on t (reads and writes the same arrays, same dtypes, same chunks
 * and threads) and trivial arithmetic (p = fma(g, 0, p), m = m * 1, v = v * 1);
 * finite values are left unchanged (up to the sign of a zero weight), params16
 * receives the weights. */
zoff_status zoff_host_optimizer_bandwidth_probe(zoff_host_optimizer *opt, const zoff_optim_tensors *t);

/* Bytes read + written per element by update() on t's dtypes (no write-allocate). */
double zoff_host_optimizer_bytes_per_param(const zoff_host_optimizer *opt, const zoff_optim_tensors *t);
/* The same count from the dtypes alone (the one home of it; zoff plan scales the host optimizer's
 * rate by it): the fp32 master read and written, `moments` state arrays read and written in
 * state_dt, the gradient read in grad_dt, with params16 the 16-bit copy written. */
double zoff_host_optimizer_traffic(int moments, zoff_dtype state_dt, zoff_dtype grad_dt, bool params16);

/* Which state arrays the optimizer uses. */
bool zoff_host_optimizer_uses_exp_avg(const zoff_host_optimizer *opt);
bool zoff_host_optimizer_uses_exp_avg_sq(const zoff_host_optimizer *opt);
zoff_optimizer_type zoff_host_optimizer_type(const zoff_host_optimizer *opt);

/* The chosen SIMD path and its name ("avx512+bf16", "avx512", "avx2", "neon", "scalar"). */
zoff_simd_path zoff_host_optimizer_simd(const zoff_host_optimizer *opt);
const char *zoff_host_optimizer_path(const zoff_host_optimizer *opt);
/* Force a path (tests, benchmarks). ZOFF_ERR_UNSUPPORTED if this CPU/build lacks it. */
zoff_status zoff_host_optimizer_set_path(zoff_host_optimizer *opt, zoff_simd_path path);
int zoff_host_optimizer_threads(const zoff_host_optimizer *opt);
zoff_status zoff_host_optimizer_set_threads(zoff_host_optimizer *opt, int threads);
/* The thread count for a share of this machine's logical cores (DeepSpeed's
 * offload_optimizer.cpuadam_cores_perc): max(1, round(share x cores)); 0 (the default
 * rule of options.threads) when share < 0 (not given). */
int zoff_host_optimizer_threads_for_share(double share);

const char *zoff_simd_path_name(zoff_simd_path path);
/* Parse "scalar", "avx2", "avx512", "avx512-nobf16", "neon", "auto". */
zoff_status zoff_simd_path_parse(const char *name, zoff_simd_path *out);
/* Is the path compiled in and supported by this CPU? */
bool zoff_simd_path_available(zoff_simd_path path);
/* The best available path (ignores $ZOFF_SIMD). */
zoff_simd_path zoff_simd_path_best(void);

#ifdef __cplusplus
}
#endif
#endif
