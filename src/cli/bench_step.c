/* zoff bench step: one training step's time and its components, with the
 * optimizer on the device and offloaded to the host, side by side. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

typedef struct step_stats {
    double step, fwd, bwd, wait_grads, host, host_work, device, wait_weights;
} step_stats;

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
                                   .batch_size = B, .seq_len = T, .dtype = dt, .seed = 1};
    if (s == ZOFF_OK) s = zoff_train_stack_create(&so, &stk);
    zoff_device *dev = stk.dev;
    zoff_gpt2 *m = stk.model;
    zoff_engine *e = stk.eng;
    size_t tb = (size_t)(B * T) * sizeof(int32_t);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "tokens", (void **)&dx);
    if (s == ZOFF_OK && !(hx = malloc(tb))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    if (s == ZOFF_OK && !(samples = calloc((size_t)iters * 8, sizeof(double)))) s = zoff_error(ZOFF_ERR_NOMEM, "oom");
    uint64_t rng = 88172645463325252ull;
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    for (int it = 0; s == ZOFF_OK && it < warmup + iters; it++) {
        double t0 = zoff_now(), tf = 0, tbw = 0;
        s = zoff_engine_zero_grad(e);
        for (int64_t k = 0; s == ZOFF_OK && k < accum; k++) {
            for (int64_t i = 0; i < B * T; i++) {
                rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
                hx[i] = (int32_t)(rng % (uint64_t)shape->vocab_size);
            }
            double ta = zoff_now();
            s = zoff_memcpy_async(st, dx, hx, tb, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward(m, dx, dx, B, T); /* targets: any valid ids */
            if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
            double tm = zoff_now();
            zoff_engine_begin_backward(e, k == accum - 1);
            if (s == ZOFF_OK) s = zoff_gpt2_backward(m, zoff_engine_backward_scale(e), zoff_engine_grad_ready, e);
            if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
            tf += tm - ta;
            tbw += zoff_now() - tm;
        }
        zoff_step_info si;
        if (s == ZOFF_OK) s = zoff_engine_step(e, 1e-4, &si);
        if (s != ZOFF_OK || it < warmup) continue;
        double *p = samples + (size_t)(it - warmup) * 8;
        p[0] = zoff_now() - t0, p[1] = tf, p[2] = tbw, p[3] = si.t_wait_grads, p[4] = si.t_host;
        p[5] = si.t_host_work, p[6] = si.t_device, p[7] = si.t_wait_weights;
    }
    if (s == ZOFF_OK) s = zoff_engine_flush(e);
    if (s == ZOFF_OK) {
        double col[1024];
        double *dst[8] = {&out->step, &out->fwd, &out->bwd, &out->wait_grads,
                          &out->host, &out->host_work, &out->device, &out->wait_weights};
        int ni = iters < 1024 ? iters : 1024;
        for (int c = 0; c < 8; c++) {
            for (int i = 0; i < ni; i++) col[i] = samples[(size_t)i * 8 + (size_t)c];
            *dst[c] = median(col, ni);
        }
        zoff_memory_stats ms;
        zoff_device_memory_stats(dev, &ms);
        *dev_peak = ms.device_peak;
    }
    free(samples);
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
               "offloaded to the host (ZeRO-Offload, stage 2), and offloaded with the delayed parameter\n"
               "update, interleaved round by round; prints the median of each component and how much of\n"
               "the host step is hidden (step time vs the sum and vs the maximum of the components).\n"
               "\n"
               "  --num-layers N --hidden-size N --num-attention-heads N --seq-length N --vocab-size N\n"
               "                         model shape (default: the default job's, 4 x 128, 4 heads, 64, 50257)\n"
               "  --micro-batch-size N   (default 8)\n"
               "  --dtype f32|bf16|fp16  weights on the device (default bf16)\n"
               "  --ratios LIST          Twin-Flow sweep instead: offload with these host ratios, e.g.\n"
               "                         0,0.25,0.5,0.75,1 (and \"auto\" when --device-memory is given)\n"
               "  --device-memory SIZE   device memory budget (CPU backend: simulated)\n"
               "  --iters N              timed steps per configuration and round (default 5)\n"
               "  --rounds N             interleaved rounds (default 3)\n"
               "  --device cpu|cuda      (default: cuda when available)\n"
               "  --json                 one JSON object on stdout\n");
}

int zoff_cmd_bench_step(int argc, char **argv) {
    zoff_gpt2_shape shape = {.num_layers = 4, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64,
                             .vocab_size = 50257};
    int64_t T = 64, B = 8, iters = 5, rounds = 3;
    const char *dts = "bf16", *device = NULL, *ratios = NULL;
    size_t budget = 0;
    bool json = false;
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
    const char *names[MAXC] = {"device-optimizer", "offload", "offload+delayed"};
    const char *zero[MAXC] = {"{\"stage\": 0}",
                              "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
                              "{\"stage\": 2, \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 1,"
                              " \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}"};
    int nconf = 3;
    if (ratios) { /* Twin-Flow sweep: one offload config per ratio */
        nconf = 0;
        char list[512];
        snprintf(list, sizeof list, "%s", ratios);
        for (char *tok = strtok(list, ","); tok && nconf < MAXC; tok = strtok(NULL, ",")) {
            double rv = 0;
            bool is_auto = !strcmp(tok, "auto");
            if (!is_auto && !cli_parse_f64("bench step", "--ratios", tok, 0, 1, &rv)) return 2;
            snprintf(namebuf[nconf], sizeof namebuf[nconf], "ratio %s", tok);
            snprintf(zerobuf[nconf], sizeof zerobuf[nconf],
                     "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": %s%s%s}}",
                     is_auto ? "\"" : "", tok, is_auto ? "\"" : "");
            names[nconf] = namebuf[nconf];
            zero[nconf] = zerobuf[nconf];
            nconf++;
        }
        if (nconf == 0) {
            fprintf(stderr, "zoff bench step: --ratios: give a comma-separated list, e.g. 0,0.5,1\n");
            return 2;
        }
    }
    static step_stats acc[MAXC][100];
    size_t peak[MAXC] = {0};
    for (int64_t r = 0; r < rounds; r++) {
        for (int c = 0; c < nconf; c++) {
            char js[1024];
            snprintf(js, sizeof js,
                     "{\"train_micro_batch_size_per_gpu\": %lld, %s \"optimizer\": {\"type\": \"AdamW\"},"
                     " \"zero_optimization\": %s}",
                     (long long)B, prec, zero[c]);
            zoff_status s = run_config(js, &shape, T, dt, kind, budget, 2, (int)iters, &acc[c][r], &peak[c]);
            if (s != ZOFF_OK) {
                fprintf(stderr, "zoff bench step: %s: %s\n", names[c], zoff_last_error());
                return 1;
            }
        }
    }
    /* median over rounds of each component */
    step_stats med[MAXC];
    for (int c = 0; c < nconf; c++) {
        double v[100];
        double *fields[8] = {&med[c].step, &med[c].fwd, &med[c].bwd, &med[c].wait_grads,
                             &med[c].host, &med[c].host_work, &med[c].device, &med[c].wait_weights};
        for (int f = 0; f < 8; f++) {
            for (int64_t r = 0; r < rounds; r++) v[r] = ((double *)&acc[c][r])[f];
            *fields[f] = median(v, (int)rounds);
        }
    }
    double tokens = (double)(B * T);
    if (json) printf("{\"shape\":{\"layers\":%lld,\"hidden\":%lld,\"heads\":%lld,\"seq\":%lld,\"vocab\":%lld},"
                     "\"micro_batch\":%lld,\"dtype\":\"%s\",\"backend\":\"%s\",\"rounds\":%lld,\"iters\":%lld,\"configs\":{",
                     (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads,
                     (long long)T, (long long)shape.vocab_size, (long long)B, dts,
                     kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu", (long long)rounds, (long long)iters);
    else
        printf("zoff bench step: GPT-2 %lld x %lld, %lld heads, seq %lld, vocab %lld, batch %lld, %s, %s backend\n"
               "medians of %lld rounds x %lld steps (seconds)\n\n"
               "%-18s %8s %8s %8s %9s %9s %9s %9s %9s %10s %9s %9s\n",
               (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads, (long long)T,
               (long long)shape.vocab_size, (long long)B, dts, kind == ZOFF_BACKEND_CUDA ? "cuda" : "cpu",
               (long long)rounds, (long long)iters, "config", "step", "forward", "backward", "wait-grad", "host-opt",
               "host-work", "dev-opt", "wait-wts", "tokens/s", "step/sum", "step/max");
    for (int c = 0; c < nconf; c++) {
        const step_stats *m = &med[c];
        double work = m->host_work > 0 ? m->host_work : m->host;
        double sum = m->fwd + m->bwd + m->wait_grads + work + m->device + m->wait_weights;
        double mx = fmax(m->fwd + m->bwd, work);
        if (json)
            printf("%s\"%s\":{\"step\":%.6f,\"forward\":%.6f,\"backward\":%.6f,\"wait_grads\":%.6f,\"host_step\":%.6f,"
                   "\"host_work\":%.6f,\"device_step\":%.6f,\"wait_weights\":%.6f,\"tokens_per_s\":%.1f,"
                   "\"step_over_sum\":%.4f,\"step_over_max\":%.4f,\"device_peak_bytes\":%zu}",
                   c ? "," : "", names[c], m->step, m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device,
                   m->wait_weights, tokens / m->step, m->step / sum, m->step / mx, peak[c]);
        else
            printf("%-18s %8.4f %8.4f %8.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10.0f %9.3f %9.3f\n", names[c], m->step,
                   m->fwd, m->bwd, m->wait_grads, m->host, m->host_work, m->device, m->wait_weights, tokens / m->step,
                   m->step / sum, m->step / mx);
    }
    if (json) printf("}}\n");
    else {
        printf("\ndevice memory peak:");
        for (int c = 0; c < nconf; c++) {
            char b0[32];
            printf("%s %s %s", c ? "," : "", names[c], zoff_format_bytes(peak[c], b0, sizeof b0));
        }
        printf("\nstep/sum < 1: part of the work overlaps; step/max = 1: the step is as short as its longest part\n");
    }
    return 0;
}
