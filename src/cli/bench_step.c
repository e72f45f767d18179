/* zoff bench step: one training step's time and its components, with the
 * optimizer on the device and offloaded to the host, side by side. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

typedef struct step_stats {
    double step, fwd, bwd, wait_grads, host, host_work, device, wait_weights, host_hidden, rolled_back;
} step_stats;
#define NFIELDS 10

/* ---- the per-step timeline, for host_hidden: the fraction of the host optimizer's
 * wall time during which the device ran forward or backward work of the same step or
 * the next one. Device times are stamps run by the compute stream itself (host
 * functions enqueued between the ops); the forward's waits for weights are gaps. */
enum { TL_MAX = 1024 };
typedef struct timeline {
    double *t;        /* stamps of one iteration: pairs (start, end) of busy spans, then of gaps */
    int nbusy, ngap;  /* pairs used */
    int cap;          /* pairs per kind */
} timeline;
typedef struct bench_tl {
    timeline *it;     /* per iteration */
    int n, cur;
    zoff_engine *e;
    int64_t *step_of; /* optimizer step launched in iteration i (0: none) */
    double *h0, *h1;  /* host update of the step launched in iteration i */
    double **spans;   /* ... its work per sub-group: (start, end) pairs */
    int *nspans;
} bench_tl;

static void stamp_fn(void *arg) { *(double *)arg = zoff_now(); }

/* Enqueue a stamp of the current iteration: kind 0 busy, 1 gap; end 0 start, 1 end. */
static zoff_status tl_stamp(bench_tl *b, zoff_stream *s, int kind, int end) {
    if (b->cur < 0) return ZOFF_OK; /* a step outside the timeline (profiled) */
    timeline *t = &b->it[b->cur];
    int *np = kind ? &t->ngap : &t->nbusy;
    if (*np >= t->cap) return ZOFF_OK; /* full: the rest is not recorded */
    double *slot = t->t + 2 * ((size_t)kind * (size_t)t->cap + (size_t)*np) + end;
    if (end) (*np)++;
    return zoff_stream_host_fn(s, stamp_fn, slot);
}

static zoff_status bench_wait(void *arg, zoff_stream *s, int64_t off, int64_t count) {
    bench_tl *b = arg;
    ZOFF_TRY(tl_stamp(b, s, 1, 0));
    ZOFF_TRY(zoff_engine_wait_weights(b->e, s, off, count));
    return tl_stamp(b, s, 1, 1);
}

static double overlap(double a0, double a1, double b0, double b1) {
    double lo = a0 > b0 ? a0 : b0, hi = a1 < b1 ? a1 : b1;
    return hi > lo ? hi - lo : 0.0;
}

/* Device busy time of iteration i inside [h0, h1]: its busy spans minus its gaps. */
static double busy_within(const timeline *t, double h0, double h1) {
    double x = 0;
    for (int k = 0; k < t->nbusy; k++) x += overlap(h0, h1, t->t[2 * k], t->t[2 * k + 1]);
    for (int k = 0; k < t->ngap; k++)
        x -= overlap(h0, h1, t->t[2 * ((size_t)t->cap + (size_t)k)], t->t[2 * ((size_t)t->cap + (size_t)k) + 1]);
    return x > 0 ? x : 0;
}

/* host_hidden of the host update launched in iteration i (its step and the next), over
 * the time it updated sub-groups (not the waits between them). */
static double tl_hidden(const bench_tl *b, int i) {
    if (b->step_of[i] == 0 || b->nspans[i] == 0) return NAN;
    double x = 0, work = 0;
    for (int k = 0; k < b->nspans[i]; k++) {
        double h0 = b->spans[i][2 * k], h1 = b->spans[i][2 * k + 1];
        work += h1 - h0;
        x += busy_within(&b->it[i], h0, h1) + (i + 1 < b->n ? busy_within(&b->it[i + 1], h0, h1) : 0);
    }
    return work > 0 ? fmin(1.0, x / work) : NAN;
}

static void tl_free(bench_tl *b) {
    for (int i = 0; b->it && i < b->n; i++) free(b->it[i].t);
    free(b->it);
    free(b->step_of);
    free(b->h0);
    free(b->h1);
    for (int i = 0; b->spans && i < b->n; i++) free(b->spans[i]);
    free(b->spans);
    free(b->nspans);
}

static zoff_status tl_alloc(bench_tl *b, int n, int pairs) {
    b->n = n;
    b->it = calloc((size_t)n, sizeof *b->it);
    b->step_of = calloc((size_t)n, sizeof *b->step_of);
    b->h0 = calloc((size_t)n, sizeof *b->h0);
    b->h1 = calloc((size_t)n, sizeof *b->h1);
    b->spans = calloc((size_t)n, sizeof *b->spans);
    b->nspans = calloc((size_t)n, sizeof *b->nspans);
    if (!b->it || !b->step_of || !b->h0 || !b->h1 || !b->spans || !b->nspans)
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    for (int i = 0; i < n; i++) {
        b->it[i].cap = pairs;
        if (!(b->it[i].t = calloc(4 * (size_t)pairs, sizeof(double)))) return zoff_error(ZOFF_ERR_NOMEM, "oom");
    }
    return ZOFF_OK;
}

/* The host update the last step finished (delayed / pipelined: an earlier one). */
static void tl_note_host(bench_tl *b) {
    double h0, h1;
    int64_t t = zoff_engine_last_host_update(b->e, &h0, &h1);
    for (int i = b->cur; t > 0 && i >= 0; i--)
        if (b->step_of[i] == t) {
            b->h0[i] = h0;
            b->h1[i] = h1;
            const double *sp;
            int ns = zoff_engine_last_host_spans(b->e, &sp);
            free(b->spans[i]);
            b->spans[i] = ns > 0 ? malloc(2 * (size_t)ns * sizeof(double)) : NULL;
            if (b->spans[i]) memcpy(b->spans[i], sp, 2 * (size_t)ns * sizeof(double));
            b->nspans[i] = b->spans[i] ? ns : 0;
            break;
        }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One configuration's run: the stack, the tokens and the timeline. */
typedef struct bench_run {
    zoff_engine *e;
    zoff_gpt2 *m;
    zoff_stream *st;
    int32_t *dx, *hx;
    int64_t B, T, accum, vocab;
    uint64_t rng;
    bench_tl *tl;
} bench_run;

/* One training step as zoff train runs it; it >= 0: its stamps go to the timeline's
 * iteration it, it < 0: no stamps (the profiled steps). */
static zoff_status bench_iter(bench_run *r, int it, zoff_step_info *si) {
    bench_tl *tl = r->tl;
    size_t tb = (size_t)(r->B * r->T) * sizeof(int32_t);
    tl->cur = it;
    zoff_status s = tl_stamp(tl, r->st, 0, 0); /* the step's device work starts with zeroing the gradients */
    if (s == ZOFF_OK) s = zoff_engine_zero_grad(r->e);
    for (int64_t k = 0; s == ZOFF_OK && k < r->accum; k++) {
        for (int64_t i = 0; i < r->B * r->T; i++) {
            r->rng ^= r->rng << 13, r->rng ^= r->rng >> 7, r->rng ^= r->rng << 17;
            r->hx[i] = (int32_t)(r->rng % (uint64_t)r->vocab);
        }
        s = zoff_memcpy_async(r->st, r->dx, r->hx, tb, ZOFF_COPY_H2D);
        /* as zoff train: the training forward (losses and dlogits; targets: any valid ids), backward,
         * the loss read (a wait for the forward's loss copy only; it also frees hx for the next
         * micro-batch) */
        if (s == ZOFF_OK && k > 0) s = tl_stamp(tl, r->st, 0, 0);
        if (s == ZOFF_OK) s = zoff_gpt2_forward_train(r->m, r->dx, r->dx, r->B, r->T, zoff_engine_backward_scale(r->e));
        if (s == ZOFF_OK) s = tl_stamp(tl, r->st, 0, 1);
        zoff_engine_begin_backward(r->e, k == r->accum - 1);
        if (s == ZOFF_OK) s = tl_stamp(tl, r->st, 0, 0);
        if (s == ZOFF_OK) s = zoff_gpt2_backward(r->m, zoff_engine_grad_ready, r->e);
        if (s == ZOFF_OK) s = tl_stamp(tl, r->st, 0, 1);
        float loss;
        if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(r->m, &loss);
    }
    if (s == ZOFF_OK) s = zoff_engine_step(r->e, 1e-4, si); /* synchronises the compute stream */
    return s;
}

/* What a configuration's run measured besides its step components. */
typedef struct run_extra {
    size_t dev_peak;
    int64_t accum;          /* micro-batches per step */
    int prof_steps;         /* profiled steps (0: none) */
    zoff_profile prof;      /* their op profile, per step (means) */
    double prof_step;       /* their wall time, per step (seconds) */
} run_extra;

/* `n` more steps with the op profiler on; their per-step means into x. */
static zoff_status profile_steps(bench_run *r, zoff_device *dev, int n, run_extra *x) {
    ZOFF_TRY(zoff_profile_start(dev, 0));
    zoff_status s = ZOFF_OK;
    double t = 0;
    for (int i = 0; s == ZOFF_OK && i < n; i++) {
        zoff_step_info si;
        zoff_profile p = {0};
        double t0 = zoff_now();
        s = bench_iter(r, -1, &si);
        if (s == ZOFF_OK) s = zoff_profile_collect(dev, &p); /* synchronises every stream: the step's end */
        t += zoff_now() - t0;
        for (int c = 0; s == ZOFF_OK && c < ZOFF_CLASS_COUNT; c++) {
            x->prof.ms[c] += p.ms[c] / n;
            x->prof.flops[c] += p.flops[c] / n;
            x->prof.count[c] += p.count[c];
        }
        x->prof.busy_ms += p.busy_ms / n, x->prof.span_ms += p.span_ms / n, x->prof.dropped += p.dropped;
    }
    zoff_profile_stop(dev);
    for (int c = 0; c < ZOFF_CLASS_COUNT; c++) x->prof.count[c] /= n;
    x->prof_step = t / n;
    x->prof_steps = s == ZOFF_OK ? n : 0;
    return s;
}

/* Run `iters` timed steps (after `warmup`) of one configuration, medians into *out; then
 * `prof_iters` steps with the op profiler on (device time per op class) into *x. */
static zoff_status run_config(const char *json, const zoff_gpt2_shape *shape, int64_t T, zoff_dtype dt,
                              zoff_backend_kind kind, size_t budget, int warmup, int iters, int prof_iters,
                              step_stats *out, run_extra *x) {
    zoff_config cfg;
    ZOFF_TRY(zoff_config_load_string(json, "bench config", &cfg));
    zoff_status s = zoff_config_resolve_batch(&cfg, 1);
    int64_t B = cfg.train_micro_batch_size_per_gpu, accum = cfg.gradient_accumulation_steps;
    double *samples = NULL;
    zoff_train_stack stk = {0}; /* device -> model -> initial weights -> engine */
    zoff_train_stack_options so = {.device = {.kind = kind, .memory_budget = budget}, .cfg = &cfg, .shape = *shape,
                                   .batch_size = B, .seq_len = T, .dtype = dt, .seed = 1, .weight_waits = true};
    if (s == ZOFF_OK) s = zoff_train_stack_create(&so, &stk);
    zoff_device *dev = stk.dev;
    bench_tl tl = {.e = stk.eng};
    bench_run r = {.e = stk.eng, .m = stk.model, .B = B, .T = T, .accum = accum, .vocab = shape->vocab_size,
                   .rng = 88172645463325252ull, .tl = &tl};
    if (s == ZOFF_OK) s = tl_alloc(&tl, warmup + iters, (int)(accum * (2 * shape->num_layers + 8)));
    /* the bench's wait records the timeline around the engine's zoff_engine_wait_weights */
    if (s == ZOFF_OK) s = zoff_gpt2_set_weight_wait(r.m, bench_wait, &tl);
    size_t tb = (size_t)(B * T) * sizeof(int32_t);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "tokens", (void **)&r.dx);
    if (s == ZOFF_OK && !(r.hx = malloc(tb))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    if (s == ZOFF_OK && !(samples = calloc((size_t)iters * NFIELDS, sizeof(double)))) s = zoff_error(ZOFF_ERR_NOMEM, "oom");
    r.st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    for (int it = 0; s == ZOFF_OK && it < warmup + iters; it++) {
        double t0 = zoff_now();
        zoff_step_info si;
        s = bench_iter(&r, it, &si);
        if (s != ZOFF_OK) continue;
        tl.step_of[it] = si.skipped ? 0 : zoff_engine_steps_taken(r.e);
        tl_note_host(&tl);
        if (it < warmup) continue;
        const timeline *ti = &tl.it[it];
        double tf = 0, tbw = 0; /* device time of the forwards (less their waits) and backwards */
        for (int k = 0; k < ti->nbusy; k++) *(k % 2 ? &tbw : &tf) += ti->t[2 * k + 1] - ti->t[2 * k];
        for (int k = 0; k < ti->ngap; k++) tf -= ti->t[2 * (ti->cap + k) + 1] - ti->t[2 * (ti->cap + k)];
        double *p = samples + (size_t)(it - warmup) * NFIELDS;
        p[0] = zoff_now() - t0, p[1] = tf, p[2] = tbw, p[3] = si.t_wait_grads, p[4] = si.t_host;
        p[5] = si.t_host_work, p[6] = si.t_device, p[7] = si.t_wait_weights, p[9] = si.rolled_back;
    }
    if (s == ZOFF_OK) s = zoff_engine_flush(r.e);
    if (s == ZOFF_OK) {
        tl.cur = warmup + iters - 1;
        tl_note_host(&tl);
        for (int it = warmup; it < warmup + iters; it++) samples[(size_t)(it - warmup) * NFIELDS + 8] = tl_hidden(&tl, it);
    }
    if (s == ZOFF_OK) {
        double col[1024];
        double *dst[NFIELDS] = {&out->step,         &out->fwd,    &out->bwd,          &out->wait_grads,
                                &out->host,         &out->host_work, &out->device,   &out->wait_weights,
                                &out->host_hidden,  &out->rolled_back};
        int ni = iters < 1024 ? iters : 1024;
        for (int c = 0; c < NFIELDS; c++) {
            int k = 0;
            for (int i = 0; i < ni; i++) /* host_hidden: NaN where no host update ran */
                if (!isnan(samples[(size_t)i * NFIELDS + (size_t)c])) col[k++] = samples[(size_t)i * NFIELDS + (size_t)c];
            *dst[c] = k ? median(col, k) : NAN;
        }
        zoff_memory_stats ms;
        zoff_device_memory_stats(dev, &ms);
        x->dev_peak = ms.device_peak;
        x->accum = accum;
    }
    if (s == ZOFF_OK && prof_iters > 0) s = profile_steps(&r, dev, prof_iters, x);
    free(samples);
    tl_free(&tl);
    free(r.hx);
    if (dev && r.dx) zoff_device_free(dev, r.dx);
    zoff_train_stack_destroy(&stk);
    zoff_config_free(&cfg);
    return s;
}

/* The GEMM peak of the device, measured: TFLOP/s of the fastest of `reps` n x n x n
 * products (ZOFF_OP_MATMUL_FWD in dt, no bias; CUDA: cuBLASLt) on a device of its own,
 * timed by the op profiler after one warm-up product. Inputs: values in [-1, 1). */
static zoff_status peak_gemm(zoff_backend_kind kind, zoff_dtype dt, int64_t n, int reps, double *tflops) {
    *tflops = 0;
    zoff_device *dev = NULL;
    void *f32 = NULL, *a = NULL, *out = NULL;
    float *host = NULL;
    size_t nn = (size_t)n * (size_t)n, es = zoff_dtype_size(dt);
    zoff_device_options o = {.kind = kind};
    zoff_status s = zoff_device_create(&o, &dev);
    if (s == ZOFF_OK && !(host = malloc(nn * sizeof(float)))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    if (s == ZOFF_OK) { /* a random tile of up to 4096 values, doubled by copies up to n^2 */
        uint64_t rng = 0x9e3779b97f4a7c15ull;
        size_t have = nn < 4096 ? nn : 4096;
        for (size_t i = 0; i < have; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            host[i] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        for (; have < nn; have *= 2) memcpy(host + have, host, (have < nn - have ? have : nn - have) * sizeof(float));
    }
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, nn * sizeof(float), "peak GEMM input (fp32)", &f32);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, nn * es, "peak GEMM output", &out);
    if (s == ZOFF_OK && dt != ZOFF_F32) s = zoff_device_alloc(dev, nn * es, "peak GEMM input", &a);
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    if (s == ZOFF_OK) s = zoff_memcpy_async(st, f32, host, nn * sizeof(float), ZOFF_COPY_H2D);
    if (s == ZOFF_OK && a) {
        zoff_op_cast_args c = {.dst = a, .src = f32, .n = (int64_t)nn, .dst_dt = dt, .src_dt = ZOFF_F32};
        s = ZOFF_LAUNCH(st, ZOFF_OP_CAST, c);
    }
    if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
    zoff_op_matmul_fwd_args mm = {.out = out, .inp = a ? a : f32, .weight = a ? a : f32, .N = n, .C = n, .OC = n, .dt = dt};
    if (s == ZOFF_OK) s = zoff_profile_start(dev, 0);
    for (int i = 0; s == ZOFF_OK && i <= reps; i++) {
        zoff_profile p;
        s = ZOFF_LAUNCH(st, ZOFF_OP_MATMUL_FWD, mm);
        if (s == ZOFF_OK) s = zoff_profile_collect(dev, &p);
        double ms = p.ms[ZOFF_CLASS_GEMM];
        if (s == ZOFF_OK && i > 0 && ms > 0 && p.flops[ZOFF_CLASS_GEMM] / ms * 1e-9 > *tflops)
            *tflops = p.flops[ZOFF_CLASS_GEMM] / ms * 1e-9;
    }
    free(host);
    if (dev) {
        zoff_profile_stop(dev);
        zoff_device_free(dev, f32);
        zoff_device_free(dev, a);
        zoff_device_free(dev, out);
        zoff_device_destroy(dev);
    }
    return s != ZOFF_OK ? zoff_error_context(s, "measuring the GEMM peak (%lld^3, %s)", (long long)n, zoff_dtype_name(dt)) : s;
}

static void bench_step_usage(FILE *f) {
    fprintf(f, "usage: zoff bench step [options]\n"
               "\n"
               "Times training steps of one GPT-2 shape with the optimizer on the device (no offload),\n"
               "offloaded to the host (ZeRO-Offload, stage 2, the pipelined step), offloaded with the\n"
               "delayed parameter update, and with speculation-then-validation (super_offload),\n"
               "interleaved round by round; prints the median of each component and how much of the\n"
               "host step is hidden (step time vs the sum and vs the maximum of the components, and\n"
               "host-hidden from the per-step timeline). Then, for the device optimizer, the device time\n"
               "per op class from the op profiler, and the MFU against the GEMM peak measured in the run.\n"
               "\n"
               "  --num-layers N --hidden-size N --num-attention-heads N --seq-length N --vocab-size N\n"
               "                         model shape (default: the default job's, 4 x 128, 4 heads, 64, 50257)\n"
               "  --micro-batch-size N   (default 8)\n"
               "  --dtype f32|bf16|f16   weights on the device (default bf16)\n"
               "  --ratios LIST          Twin-Flow sweep instead: offload with these host ratios, e.g.\n"
               "                         0,0.25,0.5,0.75,1 (and \"auto\" when --device-memory is given)\n"
               "  --device-memory SIZE   device memory budget (CPU backend: simulated)\n"
               "  --gradient-clipping X  (default 1.0, DeepSpeed's; 0: off). A clipped step undoes the\n"
               "                         speculative update (offload+speculative: rolled_back)\n"
               "  --iters N              timed steps per configuration and round (default 5)\n"
               "  --rounds N             interleaved rounds (default 3)\n"
               "  --configs LIST         only these of the four, e.g. device-optimizer (each round builds each\n"
               "                         configuration's model and engine anew: fewer for large models)\n"
               "  --profile-iters N      steps of device-optimizer run after its last round with the op profiler\n"
               "                         on: device time per op class, TFLOP/s of GEMMs and attention (default 3;\n"
               "                         0: off)\n"
               "  --peak-gemm N          measure the device's GEMM peak with N x N x N products in --dtype (the\n"
               "                         MFU's denominator; default 8192 on CUDA, 1024 on the CPU; 0: off)\n"
               "  --device cpu|cuda      (default: cuda when available)\n"
               "  --json                 one JSON object on stdout\n"
               "  -q, --quiet            no notes on stderr (the library's); the table or JSON on stdout,\n"
               "                         warnings and errors still print\n");
}

/* The median over rounds of each component (NaN fields left out). */
static void median_rounds(const step_stats *acc, int rounds, step_stats *med) {
    for (int f = 0; f < NFIELDS; f++) {
        double v[100];
        int k = 0;
        for (int r = 0; r < rounds; r++)
            if (!isnan(((const double *)&acc[r])[f])) v[k++] = ((const double *)&acc[r])[f];
        ((double *)med)[f] = k ? median(v, k) : NAN;
    }
}

/* The configurations compared by default: zero_optimization of each. */
static const char *const k_names[4] = {"device-optimizer", "offload", "offload+delayed", "offload+speculative"};
static const char *const k_zero[4] = {
    "{\"stage\": 0}",
    "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
    "{\"stage\": 2, \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 1,"
    " \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
    "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, \"super_offload\": true}}"};

/* --ratios LIST: one offload config per ratio (Twin-Flow sweep); how many, or -1 (message printed). */
static int ratio_configs(const char *ratios, int maxc, char (*namebuf)[32], char (*zerobuf)[256], const char **names,
                         const char **zero) {
    int nconf = 0;
    char list[512];
    if (!cli_check_list("bench step", "--ratios", ratios, sizeof list)) return -1;
    snprintf(list, sizeof list, "%s", ratios);
    for (char *tok = strtok(list, ","); tok && nconf < maxc; tok = strtok(NULL, ",")) {
        double rv = 0;
        bool is_auto = !strcmp(tok, "auto");
        if (!is_auto && !cli_parse_f64("bench step", "--ratios", tok, 0, 1, &rv)) return -1;
        snprintf(namebuf[nconf], sizeof namebuf[nconf], "ratio %s", tok);
        snprintf(zerobuf[nconf], sizeof zerobuf[nconf],
                 "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": %s%s%s}}",
                 is_auto ? "\"" : "", tok, is_auto ? "\"" : "");
        names[nconf] = namebuf[nconf];
        zero[nconf] = zerobuf[nconf];
        nconf++;
    }
    if (nconf == 0) fprintf(stderr, "zoff bench step: --ratios: give a comma-separated list, e.g. 0,0.5,1\n");
    return nconf > 0 ? nconf : -1;
}

/* The command line of zoff bench step. */
typedef struct bench_opts {
    zoff_gpt2_shape shape;
    int64_t T, B, iters, rounds, prof_iters, peak_n; /* peak_n < 0: the backend's default */
    const char *dts, *device, *ratios, *configs;
    size_t budget;
    bool json, quiet;
    double clip;
} bench_opts;

/* Parse argv into *o: -1 to go on, or the exit status (help: 0, bad usage: 2). */
static int parse_args(int argc, char **argv, bench_opts *o) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t x;
#define NUM(flag, lo, hi, dst) \
    else if (!strcmp(a, flag)) { \
        if (!(v = cli_value("bench step", argc, argv, &i)) || !cli_parse_i64("bench step", a, v, lo, hi, &x)) return 2; \
        dst = x; \
    }
#define STR(flag, dst) \
    else if (!strcmp(a, flag)) { \
        if (!(v = cli_value("bench step", argc, argv, &i))) return 2; \
        dst = v; \
    }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_step_usage(stdout);
            return 0;
        }
        if (cli_quiet_flag(a, &o->quiet)) continue;
        NUM("--num-layers", 1, ZOFF_GPT2_MAX_LAYERS, o->shape.num_layers)
        NUM("--hidden-size", 1, ZOFF_GPT2_MAX_HIDDEN, o->shape.hidden_size)
        NUM("--num-attention-heads", 1, ZOFF_GPT2_MAX_HIDDEN, o->shape.num_heads)
        NUM("--seq-length", 1, ZOFF_GPT2_MAX_SEQ, o->T)
        NUM("--vocab-size", 2, ZOFF_GPT2_MAX_TRAIN_VOCAB, o->shape.vocab_size)
        NUM("--micro-batch-size", 1, ZOFF_GPT2_MAX_BATCH, o->B)
        NUM("--iters", 1, 1000, o->iters)
        NUM("--rounds", 1, 100, o->rounds)
        NUM("--profile-iters", 0, 1000, o->prof_iters)
        NUM("--peak-gemm", 0, 65536, o->peak_n)
        STR("--dtype", o->dts)
        STR("--device", o->device)
        STR("--ratios", o->ratios)
        STR("--configs", o->configs)
        else if (!strcmp(a, "--device-memory")) {
            if (!(v = cli_value("bench step", argc, argv, &i))) return 2;
            if (zoff_parse_size(v, &o->budget) != ZOFF_OK) {
                fprintf(stderr, "zoff bench step: --device-memory: %s\n", zoff_last_error());
                return 2;
            }
        }
        else if (!strcmp(a, "--json")) o->json = true;
        else if (!strcmp(a, "--gradient-clipping")) {
            if (!(v = cli_value("bench step", argc, argv, &i)) || !cli_parse_f64("bench step", a, v, 0, 1e30, &o->clip))
                return 2;
        }
        else {
            cli_unknown_option("bench step", a, bench_step_usage);
            return 2;
        }
#undef NUM
#undef STR
    }
    return -1;
}

/* --configs LIST: keep the default configurations named in LIST (in their order); how many, or -1. */
static int select_configs(const char *list, const char **names, const char **zero) {
    int n = 0;
    for (int c = 0; c < 4; c++) {
        size_t len = strlen(k_names[c]);
        for (const char *p = list; (p = strstr(p, k_names[c])) != NULL; p += len)
            if ((p == list || p[-1] == ',') && (p[len] == ',' || p[len] == '\0')) {
                names[n] = k_names[c], zero[n] = k_zero[c], n++;
                break;
            }
    }
    int commas = 0;
    for (const char *p = list; *p; p++) commas += *p == ',';
    if (n == 0 || n != commas + 1) {
        fprintf(stderr, "zoff bench step: --configs '%s': give a comma-separated list of %s, %s, %s, %s\n", list,
                k_names[0], k_names[1], k_names[2], k_names[3]);
        return -1;
    }
    return n;
}

/* The op profile of the device-optimizer configuration, the measured GEMM peak and the MFU:
 * a JSON member (",\"profile\":...") or a table. step: the configuration's median step (s). */
static void print_profile(const bench_opts *o, const run_extra *x, double step, double peak, zoff_dtype dt) {
    const zoff_profile *p = &x->prof;
    double total = 0;
    for (int c = 0; c < ZOFF_CLASS_COUNT; c++) total += p->ms[c];
    double mflops = zoff_gpt2_step_flops(&o->shape, o->B, o->T) * (double)x->accum;
    double mfu = peak > 0 && step > 0 ? mflops / step * 1e-12 / peak : NAN;
    char pk[32] = "null", mf[32] = "null";
    if (peak > 0) snprintf(pk, sizeof pk, "%.4f", peak);
    if (!isnan(mfu)) snprintf(mf, sizeof mf, "%.6f", mfu);
    if (o->json) {
        printf(",\"profile\":{\"config\":\"device-optimizer\",\"steps\":%d,\"classes\":{", x->prof_steps);
        for (int c = 0; c < ZOFF_CLASS_COUNT; c++) {
            char tf[32] = "null";
            if (p->flops[c] > 0 && p->ms[c] > 0) snprintf(tf, sizeof tf, "%.6f", p->flops[c] / p->ms[c] * 1e-9);
            printf("%s\"%s\":{\"ms\":%.6f,\"share\":%.6f,\"count\":%lld,\"flops\":%.17g,\"tflops\":%s}", c ? "," : "",
                   zoff_op_class_name((zoff_op_class)c), p->ms[c], total > 0 ? p->ms[c] / total : 0.0,
                   (long long)p->count[c], p->flops[c], tf);
        }
        printf("},\"total_ms\":%.6f,\"busy_ms\":%.6f,\"span_ms\":%.6f,\"step_ms\":%.6f,\"dropped\":%lld},"
               "\"peak_gemm\":{\"n\":%lld,\"dtype\":\"%s\",\"tflops\":%s},\"model_flops_per_step\":%.17g,\"mfu\":%s",
               total, p->busy_ms, p->span_ms, x->prof_step * 1e3, (long long)p->dropped, (long long)o->peak_n,
               o->dts, pk, mflops, mf);
        return;
    }
    printf("\ndevice time per step by op class (device-optimizer, mean of %d profiled steps, op profiler):\n"
           "%-14s %10s %7s %7s %9s\n", x->prof_steps, "class", "ms/step", "share", "ops", "TFLOP/s");
    for (int c = 0; c < ZOFF_CLASS_COUNT; c++) {
        if (p->count[c] == 0) continue;
        printf("%-14s %10.3f %6.1f%% %7lld", zoff_op_class_name((zoff_op_class)c), p->ms[c],
               total > 0 ? 100 * p->ms[c] / total : 0.0, (long long)p->count[c]);
        if (p->flops[c] > 0 && p->ms[c] > 0) printf(" %9.3f", p->flops[c] / p->ms[c] * 1e-9);
        printf("\n");
    }
    printf("%-14s %10.3f   (device busy %.3f ms of a %.3f ms span; profiled step %.3f ms)\n", "total", total,
           p->busy_ms, p->span_ms, x->prof_step * 1e3);
    if (peak > 0)
        printf("GEMM peak (%lld^3 %s, measured): %.3f TFLOP/s; model FLOPs per step %.4g; MFU %.2f%% (step %.4f s)\n",
               (long long)o->peak_n, zoff_dtype_name(dt), peak, mflops, 100 * mfu, step);
}

int zoff_cmd_bench_step(int argc, char **argv) {
    bench_opts o = {.shape = {.num_layers = 4, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64, .vocab_size = 50257},
                    .T = 64, .B = 8, .iters = 5, .rounds = 3, .prof_iters = 3, .peak_n = -1, .dts = "bf16", .clip = 1.0};
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;
    zoff_gpt2_shape shape = o.shape;
    int64_t T = o.T, B = o.B;
    shape.max_seq_len = T;
    o.shape = shape;
    if (zoff_gpt2_check_shape(&shape, "model shape", NULL) != ZOFF_OK) { /* before any measuring */
        fprintf(stderr, "zoff bench step: %s\n", zoff_last_error());
        return 2;
    }
    zoff_dtype dt;
    if (!cli_parse_dtype("bench step", "--dtype", o.dts, &dt)) return 2;
    const char *dts = o.dts = cli_bench_dtype_name(dt); /* the peak's line too */
    const char *prec = dt == ZOFF_F32    ? ""
                       : dt == ZOFF_BF16 ? "\"bf16\": {\"enabled\": true},"
                                         : "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12},";
    zoff_backend_kind kind = ZOFF_BACKEND_CPU;
    if ((o.device && !strcmp(o.device, "cuda")) || (!o.device && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        kind = ZOFF_BACKEND_CUDA;
    if (o.peak_n < 0) o.peak_n = kind == ZOFF_BACKEND_CUDA ? 8192 : 1024;
    enum { MAXC = 16 };
    char namebuf[MAXC][32], zerobuf[MAXC][256];
    const char *names[MAXC], *zero[MAXC];
    int nconf = 4;
    for (int c = 0; c < nconf; c++) names[c] = k_names[c], zero[c] = k_zero[c];
    if (o.ratios && (nconf = ratio_configs(o.ratios, MAXC, namebuf, zerobuf, names, zero)) <= 0) return 2;
    if (!o.ratios && o.configs && (nconf = select_configs(o.configs, names, zero)) <= 0) return 2;
    int prof_conf = -1; /* the op profile: of the device-optimizer configuration, in the last round */
    for (int c = 0; c < nconf; c++)
        if (!strcmp(names[c], k_names[0]) && o.prof_iters > 0) prof_conf = c;
    double peak = 0; /* TFLOP/s, measured before the configurations (their memory is not yet taken) */
    if (prof_conf >= 0 && o.peak_n > 0 && peak_gemm(kind, dt, o.peak_n, 5, &peak) != ZOFF_OK) {
        fprintf(stderr, "zoff bench step: %s (--peak-gemm 0 skips it)\n", zoff_last_error());
        return 1;
    }
    static step_stats acc[MAXC][100];
    static run_extra ex[MAXC];
    for (int64_t r = 0; r < o.rounds; r++) {
        for (int c = 0; c < nconf; c++) {
            char js[1024];
            snprintf(js, sizeof js,
                     "{\"train_micro_batch_size_per_gpu\": %lld, %s \"optimizer\": {\"type\": \"AdamW\"},"
                     " \"gradient_clipping\": %g, \"zero_optimization\": %s}",
                     (long long)B, prec, o.clip, zero[c]);
            int pi = c == prof_conf && r == o.rounds - 1 ? (int)o.prof_iters : 0;
            zoff_status s = run_config(js, &shape, T, dt, kind, o.budget, 2, (int)o.iters, pi, &acc[c][r], &ex[c]);
            if (s != ZOFF_OK) {
                fprintf(stderr, "zoff bench step: %s: %s\n", names[c], zoff_last_error());
                return 1;
            }
        }
    }
    step_stats med[MAXC];
    for (int c = 0; c < nconf; c++) median_rounds(acc[c], (int)o.rounds, &med[c]);
    double tokens = (double)(B * T);
    if (o.json) printf("{\"shape\":{\"layers\":%lld,\"hidden\":%lld,\"heads\":%lld,\"seq\":%lld,\"vocab\":%lld},"
                       "\"micro_batch\":%lld,\"dtype\":\"%s\",\"backend\":\"%s\",\"rounds\":%lld,\"iters\":%lld,\"configs\":{",
                       (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads,
                       (long long)T, (long long)shape.vocab_size, (long long)B, dts,
                       kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu", (long long)o.rounds, (long long)o.iters);
    else {
        char nh[32], nr[32], ns[32];
        printf("zoff bench step: GPT-2 %lld x %lld, %s, seq %lld, vocab %lld, batch %lld, %s, %s backend\n"
               "medians of %s x %s (seconds)\n\n"
               "%-20s %8s %8s %8s %9s %9s %9s %9s %9s %10s %9s %9s %11s\n",
               (long long)shape.num_layers, (long long)shape.hidden_size,
               zoff_format_count(shape.num_heads, "head", nh, sizeof nh), (long long)T, (long long)shape.vocab_size,
               (long long)B, dts, kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu",
               zoff_format_count(o.rounds, "round", nr, sizeof nr), zoff_format_count(o.iters, "step", ns, sizeof ns),
               "config", "step", "forward", "backward", "wait-grad", "host-opt",
               "host-work", "dev-opt", "wait-wts", "tokens/s", "step/sum", "step/max", "host-hidden");
    }
    for (int c = 0; c < nconf; c++) {
        const step_stats *m = &med[c];
        double work = m->host_work > 0 ? m->host_work : m->host;
        double sum = m->fwd + m->bwd + m->wait_grads + work + m->device + m->wait_weights;
        double mx = fmax(m->fwd + m->bwd, work);
        char hh[32]; /* no host optimizer: null in the JSON, n/a in the table */
        if (isnan(m->host_hidden)) snprintf(hh, sizeof hh, "%s", o.json ? "null" : "n/a");
        else snprintf(hh, sizeof hh, o.json ? "%.4f" : "%.3f", m->host_hidden);
        if (o.json)
            printf("%s\"%s\":{\"step\":%.6f,\"forward\":%.6f,\"backward\":%.6f,\"wait_grads\":%.6f,\"host_step\":%.6f,"
                   "\"host_work\":%.6f,\"device_step\":%.6f,\"wait_weights\":%.6f,\"tokens_per_s\":%.1f,"
                   "\"step_over_sum\":%.4f,\"step_over_max\":%.4f,\"host_hidden\":%s,\"rolled_back\":%.2f,\"device_peak_bytes\":%zu}",
                   c ? "," : "", names[c], m->step, m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device,
                   m->wait_weights, tokens / m->step, m->step / sum, m->step / mx, hh, m->rolled_back, ex[c].dev_peak);
        else
            printf("%-20s %8.4f %8.4f %8.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.0f %9.3f %9.3f %11s\n", names[c], m->step,
                   m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device, m->wait_weights, tokens / m->step,
                   m->step / sum, m->step / mx, hh);
    }
    if (o.json) {
        printf("}");
        if (prof_conf >= 0) print_profile(&o, &ex[prof_conf], med[prof_conf].step, peak, dt);
        printf("}\n");
    } else {
        printf("\ndevice memory peak:");
        for (int c = 0; c < nconf; c++) {
            char b0[32];
            printf("%s %s %s", c ? "," : "", names[c], zoff_format_bytes(ex[c].dev_peak, b0, sizeof b0));
        }
        printf("\nstep/sum < 1: part of the work overlaps; step/max = 1: the step is as short as its longest part\n"
               "host-hidden: fraction of the host optimizer's wall time during which the device ran forward or\n"
               "backward work of the same step or the next (from the compute stream's own time stamps);\n"
               "n/a: no host optimizer (device-optimizer)\n");
        if (prof_conf >= 0) print_profile(&o, &ex[prof_conf], med[prof_conf].step, peak, dt);
    }
    return 0;
}
