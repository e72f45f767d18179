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

/* Run `iters` timed steps (after `warmup`) of one configuration; medians into *out. */
static zoff_status run_config(const char *json, const zoff_gpt2_shape *shape, int64_t T, zoff_dtype dt,
                              zoff_backend_kind kind, size_t budget, int warmup, int iters, step_stats *out,
                              size_t *dev_peak) {
    zoff_config cfg;
    ZOFF_TRY(zoff_config_load_string(json, "bench config", &cfg));
    zoff_status s = zoff_config_resolve_batch(&cfg, 1);
    int64_t B = cfg.train_micro_batch_size_per_gpu, accum = cfg.gradient_accumulation_steps;
    int32_t *dx = NULL, *hx = NULL;
    double *samples = NULL;
    zoff_train_stack stk = {0}; /* device -> model -> initial weights -> engine */
    zoff_train_stack_options so = {.device = {.kind = kind, .memory_budget = budget}, .cfg = &cfg, .shape = *shape,
                                   .batch_size = B, .seq_len = T, .dtype = dt, .seed = 1, .weight_waits = true};
    if (s == ZOFF_OK) s = zoff_train_stack_create(&so, &stk);
    zoff_device *dev = stk.dev;
    zoff_gpt2 *m = stk.model;
    zoff_engine *e = stk.eng;
    bench_tl tl = {.e = e};
    if (s == ZOFF_OK) s = tl_alloc(&tl, warmup + iters, (int)(accum * (2 * shape->num_layers + 8)));
    /* the bench's wait records the timeline around the engine's zoff_engine_wait_weights */
    if (s == ZOFF_OK) s = zoff_gpt2_set_weight_wait(m, bench_wait, &tl);
    size_t tb = (size_t)(B * T) * sizeof(int32_t);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "tokens", (void **)&dx);
    if (s == ZOFF_OK && !(hx = malloc(tb))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    if (s == ZOFF_OK && !(samples = calloc((size_t)iters * NFIELDS, sizeof(double)))) s = zoff_error(ZOFF_ERR_NOMEM, "oom");
    uint64_t rng = 88172645463325252ull;
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    for (int it = 0; s == ZOFF_OK && it < warmup + iters; it++) {
        double t0 = zoff_now();
        tl.cur = it;
        s = tl_stamp(&tl, st, 0, 0); /* the step's device work starts with zeroing the gradients */
        if (s == ZOFF_OK) s = zoff_engine_zero_grad(e);
        for (int64_t k = 0; s == ZOFF_OK && k < accum; k++) {
            for (int64_t i = 0; i < B * T; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                hx[i] = (int32_t)(rng % (uint64_t)shape->vocab_size);
            }
            s = zoff_memcpy_async(st, dx, hx, tb, ZOFF_COPY_H2D);
            /* as zoff train: the training forward (losses and dlogits), backward, the loss read (a
             * wait for the forward's loss copy only; it also frees hx for the next micro-batch) */
            if (s == ZOFF_OK && k > 0) s = tl_stamp(&tl, st, 0, 0);
            if (s == ZOFF_OK) s = zoff_gpt2_forward_train(m, dx, dx, B, T, zoff_engine_backward_scale(e));
            if (s == ZOFF_OK) s = tl_stamp(&tl, st, 0, 1);
            zoff_engine_begin_backward(e, k == accum - 1);
            if (s == ZOFF_OK) s = tl_stamp(&tl, st, 0, 0);
            if (s == ZOFF_OK) s = zoff_gpt2_backward(m, zoff_engine_grad_ready, e);
            if (s == ZOFF_OK) s = tl_stamp(&tl, st, 0, 1);
            float loss;
            if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(m, &loss);
        }
        zoff_step_info si;
        if (s == ZOFF_OK) s = zoff_engine_step(e, 1e-4, &si); /* synchronises the compute stream */
        if (s != ZOFF_OK) continue;
        tl.step_of[it] = si.skipped ? 0 : zoff_engine_steps_taken(e);
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
    if (s == ZOFF_OK) s = zoff_engine_flush(e);
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
        *dev_peak = ms.device_peak;
    }
    free(samples);
    tl_free(&tl);
    free(hx);
    if (dev && dx) zoff_device_free(dev, dx);
    zoff_train_stack_destroy(&stk);
    zoff_config_free(&cfg);
    return s;
}

static void bench_step_usage(FILE *f) {
    fprintf(f, "usage: zoff bench step [options]\n"
               "\n"
               "Times training steps of one GPT-2 shape with the optimizer on the device (no offload),\n"
               "offloaded to the host (ZeRO-Offload, stage 2, the pipelined step), offloaded with the\n"
               "delayed parameter update, and with speculation-then-validation (super_offload),\n"
               "interleaved round by round; prints the median of each component and how much of the\n"
               "host step is hidden (step time vs the sum and vs the maximum of the components, and\n"
               "host-hidden from the per-step timeline).\n"
               "\n"
               "  --num-layers N --hidden-size N --num-attention-heads N --seq-length N --vocab-size N\n"
               "                         model shape (default: the default job's, 4 x 128, 4 heads, 64, 50257)\n"
               "  --micro-batch-size N   (default 8)\n"
               "  --dtype f32|bf16|fp16  weights on the device (default bf16)\n"
               "  --ratios LIST          Twin-Flow sweep instead: offload with these host ratios, e.g.\n"
               "                         0,0.25,0.5,0.75,1 (and \"auto\" when --device-memory is given)\n"
               "  --device-memory SIZE   device memory budget (CPU backend: simulated)\n"
               "  --gradient-clipping X  (default 1.0, DeepSpeed's; 0: off). A clipped step undoes the\n"
               "                         speculative update (offload+speculative: rolled_back)\n"
               "  --iters N              timed steps per configuration and round (default 5)\n"
               "  --rounds N             interleaved rounds (default 3)\n"
               "  --device cpu|cuda      (default: cuda when available)\n"
               "  --json                 one JSON object on stdout\n");
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

int zoff_cmd_bench_step(int argc, char **argv) {
    zoff_gpt2_shape shape = {.num_layers = 4, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64,
                             .vocab_size = 50257};
    int64_t T = 64, B = 8, iters = 5, rounds = 3;
    const char *dts = "bf16", *device = NULL, *ratios = NULL;
    size_t budget = 0;
    bool json = false;
    double clip = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t x;
#define NUM(flag, lo, hi, dst) \
    else if (!strcmp(a, flag)) { \
        if (!(v = cli_value("bench step", argc, argv, &i)) || !cli_parse_i64("bench step", a, v, lo, hi, &x)) return 2; \
        dst = x; \
    }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_step_usage(stdout);
            return 0;
        }
        NUM("--num-layers", 1, ZOFF_GPT2_MAX_LAYERS, shape.num_layers)
        NUM("--hidden-size", 1, ZOFF_GPT2_MAX_HIDDEN, shape.hidden_size)
        NUM("--num-attention-heads", 1, ZOFF_GPT2_MAX_HIDDEN, shape.num_heads)
        NUM("--seq-length", 1, ZOFF_GPT2_MAX_SEQ, T)
        NUM("--vocab-size", 2, ZOFF_GPT2_MAX_TRAIN_VOCAB, shape.vocab_size)
        NUM("--micro-batch-size", 1, ZOFF_GPT2_MAX_BATCH, B)
        NUM("--iters", 1, 1000, iters)
        NUM("--rounds", 1, 100, rounds)
        else if (!strcmp(a, "--dtype")) {
            if (!(v = cli_value("bench step", argc, argv, &i))) return 2;
            dts = v;
        }
        else if (!strcmp(a, "--device")) {
            if (!(v = cli_value("bench step", argc, argv, &i))) return 2;
            device = v;
        }
        else if (!strcmp(a, "--ratios")) {
            if (!(v = cli_value("bench step", argc, argv, &i))) return 2;
            ratios = v;
        }
        else if (!strcmp(a, "--device-memory")) {
            if (!(v = cli_value("bench step", argc, argv, &i))) return 2;
            if (zoff_parse_size(v, &budget) != ZOFF_OK) {
                fprintf(stderr, "zoff bench step: --device-memory: %s\n", zoff_last_error());
                return 2;
            }
        }
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--gradient-clipping")) {
            if (!(v = cli_value("bench step", argc, argv, &i)) || !cli_parse_f64("bench step", a, v, 0, 1e30, &clip)) return 2;
        }
        else {
            fprintf(stderr, "zoff bench step: unknown option '%s' (--help lists them)\n", a);
            return 2;
        }
#undef NUM
    }
    shape.max_seq_len = T;
    zoff_dtype dt;
    const char *prec;
    if (!strcmp(dts, "f32")) dt = ZOFF_F32, prec = "";
    else if (!strcmp(dts, "bf16")) dt = ZOFF_BF16, prec = "\"bf16\": {\"enabled\": true},";
    else if (!strcmp(dts, "fp16")) dt = ZOFF_F16, prec = "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12},";
    else {
        fprintf(stderr, "zoff bench step: --dtype: '%s' is not one of f32, bf16, fp16\n", dts);
        return 2;
    }
    zoff_backend_kind kind = ZOFF_BACKEND_CPU;
    if ((device && !strcmp(device, "cuda")) || (!device && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        kind = ZOFF_BACKEND_CUDA;
    enum { MAXC = 16 };
    char namebuf[MAXC][32], zerobuf[MAXC][256];
    const char *names[MAXC], *zero[MAXC];
    int nconf = 4;
    for (int c = 0; c < nconf; c++) names[c] = k_names[c], zero[c] = k_zero[c];
    if (ratios && (nconf = ratio_configs(ratios, MAXC, namebuf, zerobuf, names, zero)) <= 0) return 2;
    static step_stats acc[MAXC][100];
    size_t peak[MAXC] = {0};
    for (int64_t r = 0; r < rounds; r++) {
        for (int c = 0; c < nconf; c++) {
            char js[1024];
            snprintf(js, sizeof js,
                     "{\"train_micro_batch_size_per_gpu\": %lld, %s \"optimizer\": {\"type\": \"AdamW\"},"
                     " \"gradient_clipping\": %g, \"zero_optimization\": %s}",
                     (long long)B, prec, clip, zero[c]);
            zoff_status s = run_config(js, &shape, T, dt, kind, budget, 2, (int)iters, &acc[c][r], &peak[c]);
            if (s != ZOFF_OK) {
                fprintf(stderr, "zoff bench step: %s: %s\n", names[c], zoff_last_error());
                return 1;
            }
        }
    }
    step_stats med[MAXC];
    for (int c = 0; c < nconf; c++) median_rounds(acc[c], (int)rounds, &med[c]);
    double tokens = (double)(B * T);
    if (json) printf("{\"shape\":{\"layers\":%lld,\"hidden\":%lld,\"heads\":%lld,\"seq\":%lld,\"vocab\":%lld},"
                     "\"micro_batch\":%lld,\"dtype\":\"%s\",\"backend\":\"%s\",\"rounds\":%lld,\"iters\":%lld,\"configs\":{",
                     (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads,
                     (long long)T, (long long)shape.vocab_size, (long long)B, dts,
                     kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu", (long long)rounds, (long long)iters);
    else
        printf("zoff bench step: GPT-2 %lld x %lld, %lld heads, seq %lld, vocab %lld, batch %lld, %s, %s backend\n"
               "medians of %lld rounds x %lld steps (seconds)\n\n"
               "%-20s %8s %8s %8s %9s %9s %9s %9s %9s %10s %9s %9s %11s\n",
               (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads, (long long)T,
               (long long)shape.vocab_size, (long long)B, dts, kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu",
               (long long)rounds, (long long)iters, "config", "step", "forward", "backward", "wait-grad", "host-opt",
               "host-work", "dev-opt", "wait-wts", "tokens/s", "step/sum", "step/max", "host-hidden");
    for (int c = 0; c < nconf; c++) {
        const step_stats *m = &med[c];
        double work = m->host_work > 0 ? m->host_work : m->host;
        double sum = m->fwd + m->bwd + m->wait_grads + work + m->device + m->wait_weights;
        double mx = fmax(m->fwd + m->bwd, work);
        char hh[32]; /* null: no host optimizer */
        if (isnan(m->host_hidden)) snprintf(hh, sizeof hh, "null");
        else snprintf(hh, sizeof hh, "%.4f", m->host_hidden);
        if (json)
            printf("%s\"%s\":{\"step\":%.6f,\"forward\":%.6f,\"backward\":%.6f,\"wait_grads\":%.6f,\"host_step\":%.6f,"
                   "\"host_work\":%.6f,\"device_step\":%.6f,\"wait_weights\":%.6f,\"tokens_per_s\":%.1f,"
                   "\"step_over_sum\":%.4f,\"step_over_max\":%.4f,\"host_hidden\":%s,\"rolled_back\":%.2f,\"device_peak_bytes\":%zu}",
                   c ? "," : "", names[c], m->step, m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device,
                   m->wait_weights, tokens / m->step, m->step / sum, m->step / mx, hh, m->rolled_back, peak[c]);
        else
            printf("%-20s %8.4f %8.4f %8.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.0f %9.3f %9.3f %11.3f\n", names[c], m->step,
                   m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device, m->wait_weights, tokens / m->step,
                   m->step / sum, m->step / mx, m->host_hidden);
    }
    if (json) printf("}}\n");
    else {
        printf("\ndevice memory peak:");
        for (int c = 0; c < nconf; c++) {
            char b0[32];
            printf("%s %s %s", c ? "," : "", names[c], zoff_format_bytes(peak[c], b0, sizeof b0));
        }
        printf("\nstep/sum < 1: part of the work overlaps; step/max = 1: the step is as short as its longest part\n"
               "host-hidden: fraction of the host optimizer's wall time during which the device ran forward or\n"
               "backward work of the same step or the next (from the compute stream's own time stamps)\n");
    }
    return 0;
}
