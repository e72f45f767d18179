/* zoff bench adam: the host optimizer step against the machine's memory bound.
 *
 * For each mode (dtypes of gradients, state and the 16-bit weight copy) it
 * measures, in the same run and with the same threads and chunks:
 *   bound: zoff_host_optimizer_bandwidth_probe, a STREAM-style in-place pass
 *          over the same arrays with the same byte counts and trivial math;
 *   mode:  zoff_host_optimizer_update over the same arrays.
 * Bound and mode are interleaved (bound, mode, bound, mode, ...) and the whole
 * sequence is repeated, because memory bandwidth drifts; it reports medians of
 * times and the median of the per-pair ratios with their min and max
 * (bench_stats.h), and says when they spread too wide. GB/s counts bytes read + bytes
 * written by the algorithm (no write-allocate traffic). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_stats.h"
#include "cli/common.h"
#include "cli/commands.h"
#include "zoff/core.h"
#include "zoff/optim.h"

typedef struct bench_mode {
    const char *name;
    zoff_dtype grad_dt, state_dt, p16_dt;
    bool copy;
} bench_mode;

static const bench_mode g_modes[] = {
    {"fp32-grads", ZOFF_F32, ZOFF_F32, ZOFF_BF16, false},
    {"bf16-grads+bf16-copy", ZOFF_BF16, ZOFF_F32, ZOFF_BF16, true},
    {"fp16-grads+fp16-copy", ZOFF_F16, ZOFF_F32, ZOFF_F16, true},
    {"bf16-states", ZOFF_BF16, ZOFF_BF16, ZOFF_BF16, true},
};
#define NMODES ((int)(sizeof g_modes / sizeof g_modes[0]))
#define MAX_REPEATS CLI_BENCH_MAX_ROUNDS

typedef struct bench_bufs {
    float *p, *m32, *v32, *g32;
    uint16_t *gb, *gh, *p16, *m16, *v16;
} bench_bufs;

static void usage(FILE *f) {
    fprintf(f,
            "usage: zoff bench adam [options]\n"
            "  Measures the host optimizer step against a STREAM-style in-place pass with the\n"
            "  same access pattern (the machine's bound), interleaved and repeated.\n"
            "options:\n"
            "  --params N        parameters (default 100M; k, M, G suffixes are decimal)\n"
            "  --threads T       threads (default, and 0: $ZOFF_THREADS, else $OMP_NUM_THREADS, else all\n"
            "                    cores)\n"
            "  --iters K         optimizer steps per measurement (default 5)\n"
            "  --rounds R        rounds of bound/mode pairs (default 5; --repeats R is the same)\n"
            "  --optimizer NAME  adamw (default), adam (L2), adagrad, lion\n"
            "  --simd PATH       scalar, avx2, avx512, avx512-nobf16, neon (default: best)\n"
            "  --mode NAME       only this mode (repeatable): fp32-grads, bf16-grads+bf16-copy,\n"
            "                    fp16-grads+fp16-copy, bf16-states\n"
            "  --latency         also time single calls on small ranges (thread wake-up cost)\n"
            "  --json            print one JSON object instead of the table\n"
            "  -q, --quiet       no notes on stderr (the library's); the table or JSON on stdout, warnings\n"
            "                    and errors still print\n");
}

static bool parse_count(const char *flag, const char *text, double min, double max, double *out) {
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || errno) goto bad;
    if (*end == 'k' || *end == 'K') v *= 1e3, end++;
    else if (*end == 'M' || *end == 'm') v *= 1e6, end++;
    else if (*end == 'G' || *end == 'g') v *= 1e9, end++;
    if (*end || !(v >= min && v <= max) || v != floor(v)) goto bad;
    *out = v;
    return true;
bad:
    fprintf(stderr, "zoff bench adam: %s: '%s' is not an integer in [%.0f, %.0f]\n", flag, text, min, max);
    return false;
}

static uint32_t mix32(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static void bufs_free(bench_bufs *b) {
    zoff_aligned_free(b->p);
    zoff_aligned_free(b->m32);
    zoff_aligned_free(b->v32);
    zoff_aligned_free(b->g32);
    zoff_aligned_free(b->gb);
    zoff_aligned_free(b->gh);
    zoff_aligned_free(b->p16);
    zoff_aligned_free(b->m16);
    zoff_aligned_free(b->v16);
    memset(b, 0, sizeof *b);
}

/* Allocate and fill (first touch on the benchmark's threads). */
static zoff_status bufs_alloc(bench_bufs *b, int64_t n, int threads) {
    memset(b, 0, sizeof *b);
    size_t n4 = (size_t)n * 4, n2 = (size_t)n * 2;
    if (!(b->p = zoff_aligned_alloc(64, n4, "bench params")) || !(b->m32 = zoff_aligned_alloc(64, n4, "bench exp_avg")) ||
        !(b->v32 = zoff_aligned_alloc(64, n4, "bench exp_avg_sq")) || !(b->g32 = zoff_aligned_alloc(64, n4, "bench fp32 grads")) ||
        !(b->gb = zoff_aligned_alloc(64, n2, "bench bf16 grads")) || !(b->gh = zoff_aligned_alloc(64, n2, "bench fp16 grads")) ||
        !(b->p16 = zoff_aligned_alloc(64, n2, "bench params16")) || !(b->m16 = zoff_aligned_alloc(64, n2, "bench bf16 exp_avg")) ||
        !(b->v16 = zoff_aligned_alloc(64, n2, "bench bf16 exp_avg_sq"))) {
        bufs_free(b);
        return ZOFF_ERR_NOMEM;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < n; i++) {
        uint32_t h1 = mix32((uint64_t)i * 2 + 1), h2 = mix32((uint64_t)i * 2 + 2);
        float p = ((float)(h1 >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.2f;  /* [-0.1, 0.1) */
        float g = ((float)(h2 >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.02f; /* [-0.01, 0.01) */
        if (fabsf(g) < 1e-4f) g = 1e-4f;                                     /* fp16-normal */
        b->p[i] = p;
        b->m32[i] = 0.0f;
        b->v32[i] = 0.0f;
        b->g32[i] = g;
        b->gb[i] = zoff_f32_to_bf16(g);
        b->gh[i] = zoff_f32_to_f16(g);
        b->p16[i] = 0;
        b->m16[i] = 0;
        b->v16[i] = 0;
    }
    return ZOFF_OK;
}

static zoff_optim_tensors mode_tensors(const bench_bufs *b, const bench_mode *md, int64_t n) {
    zoff_optim_tensors t = {0};
    t.params = b->p;
    t.exp_avg = md->state_dt == ZOFF_F32 ? (void *)b->m32 : (void *)b->m16;
    t.exp_avg_sq = md->state_dt == ZOFF_F32 ? (void *)b->v32 : (void *)b->v16;
    t.state_dt = md->state_dt;
    t.grad_dt = md->grad_dt;
    t.grads = md->grad_dt == ZOFF_F32 ? (const void *)b->g32 : md->grad_dt == ZOFF_BF16 ? (const void *)b->gb : (const void *)b->gh;
    t.params16 = md->copy ? b->p16 : NULL;
    t.p16_dt = md->p16_dt;
    t.n = n;
    return t;
}

/* Seconds per call, averaged over iters calls. */
static zoff_status time_update(zoff_host_optimizer *opt, const zoff_optim_tensors *t, int iters, int64_t *step,
                               double *sec) {
    double t0 = zoff_now();
    for (int k = 0; k < iters; k++) {
        ZOFF_TRY(zoff_host_optimizer_begin_step(opt, ++*step, 1e-4));
        ZOFF_TRY(zoff_host_optimizer_update(opt, t, 0.01, 1.0));
    }
    *sec = (zoff_now() - t0) / iters;
    return ZOFF_OK;
}

static zoff_status time_probe(zoff_host_optimizer *opt, const zoff_optim_tensors *t, int iters, double *sec) {
    double t0 = zoff_now();
    for (int k = 0; k < iters; k++) ZOFF_TRY(zoff_host_optimizer_bandwidth_probe(opt, t));
    *sec = (zoff_now() - t0) / iters;
    return ZOFF_OK;
}

static double load_average(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

/* Per-call latency on small, cache-resident ranges: serial vs threaded. */
static zoff_status latency(const zoff_optimizer_config *cfg, zoff_simd_path path, int threads, bool json) {
    static const int64_t sizes[] = {1024, 4096, 16384, 32768, 65536, 262144, 1048576};
    const int ns = (int)(sizeof sizes / sizeof sizes[0]);
    int64_t nmax = sizes[ns - 1];
    bench_bufs b;
    ZOFF_TRY(bufs_alloc(&b, nmax, threads));
    zoff_host_optimizer *ser = NULL, *par = NULL;
    zoff_host_optimizer_options o = {.threads = threads, .path = path, .serial_below = INT64_MAX};
    zoff_status s = zoff_host_optimizer_create_ex(cfg, &o, &ser);
    o.serial_below = -1;
    if (s == ZOFF_OK) s = zoff_host_optimizer_create_ex(cfg, &o, &par);
    if (json) printf(",\"latency\":[");
    else printf("\nper-call latency, cache-resident (bf16 grads + bf16 copy, fp32 states):\n%10s %14s %14s %14s\n", "n",
                "serial us", "threaded us", "threaded/serial");
    for (int i = 0; i < ns && s == ZOFF_OK; i++) {
        zoff_optim_tensors t = mode_tensors(&b, &g_modes[1], sizes[i]);
        int iters = (int)(20000000 / sizes[i]);
        if (iters > 20000) iters = 20000;
        if (iters < 20) iters = 20;
        double ts[5], tp[5];
        int64_t step = 0, step2 = 0;
        for (int r = 0; r < 5 && s == ZOFF_OK; r++) {
            s = time_update(ser, &t, iters, &step, &ts[r]);
            if (s == ZOFF_OK) s = time_update(par, &t, iters, &step2, &tp[r]);
        }
        if (s != ZOFF_OK) break;
        double a = cli_median(ts, 5) * 1e6, c = cli_median(tp, 5) * 1e6;
        if (json) printf("%s{\"n\":%lld,\"serial_us\":%.3f,\"threaded_us\":%.3f}", i ? "," : "", (long long)sizes[i], a, c);
        else printf("%10lld %14.2f %14.2f %14.2f\n", (long long)sizes[i], a, c, c / a);
    }
    if (json) printf("]");
    zoff_host_optimizer_destroy(ser);
    zoff_host_optimizer_destroy(par);
    bufs_free(&b);
    return s;
}

/* One line (or JSON object) per mode: medians of each side, the median of the paired
 * bound/optimizer ratios (the fraction of the bound reached) with min and max. */
static void report_modes(zoff_host_optimizer *opt, const bench_bufs *bp, int64_t n, const bool *want, int repeats,
                         double tb[][MAX_REPEATS], double tm[][MAX_REPEATS], bool json) {
    const bench_bufs b = *bp;
    bool first = true;
    int unsteady = 0;
    for (int k = 0; k < NMODES; k++) {
        if (!want[k]) continue;
        zoff_optim_tensors t = mode_tensors(&b, &g_modes[k], n);
        double bpp = zoff_host_optimizer_bytes_per_param(opt, &t);
        cli_paired pr; /* bound time / optimizer time of each pair = the fraction of the bound reached */
        cli_paired_ratios(tb[k], tm[k], repeats, &pr);
        double mb = pr.a_median, mm = pr.b_median;
        double bps = (double)n / mb, ops = (double)n / mm;
        double pct = 100.0 * pr.ratio_median, pmin = 100.0 * pr.ratio_min, pmax = 100.0 * pr.ratio_max;
        char why[400];
        cli_paired_verdict(&pr, why, sizeof why);
        if (json) {
            printf("%s{\"mode\":\"%s\",\"bytes_per_param\":%.0f,\"bound_params_per_s\":%.4g,\"bound_gb_per_s\":%.2f,"
                   "\"params_per_s\":%.4g,\"gb_per_s\":%.2f,\"pct_of_bound\":%.1f,\"pct_min\":%.1f,\"pct_max\":%.1f,",
                   first ? "" : ",", g_modes[k].name, bpp, bps, bps * bpp * 1e-9, ops, ops * bpp * 1e-9, pct, pmin, pmax);
            cli_paired_json(stdout, &pr);
            printf(",\"verdict\":\"%s\"}", why);
        } else {
            printf("%-22s %6.0f | %12.4g %9.2f | %12.4g %9.2f | %7.1f%% (%5.1f..%5.1f)%s\n", g_modes[k].name, bpp, bps,
                   bps * bpp * 1e-9, ops, ops * bpp * 1e-9, pct, pmin, pmax, why[0] ? "  (*)" : "");
            if (why[0]) unsteady++;
        }
        first = false;
    }
    if (json) printf("]");
    if (unsteady)
        printf("(*) %d mode%s: the rounds' ratios spread more than %.0f%% of their median (or fewer than %d rounds): "
               "the machine was too noisy for the %% of bound to mean more than its min..max\n",
               unsteady, unsteady == 1 ? "" : "s", 100.0 * CLI_BENCH_SPREAD_LIMIT, CLI_BENCH_MIN_ROUNDS);
}

int zoff_cmd_bench_adam(int argc, char **argv) {
    double dparams = 100e6, dthreads = 0, diters = 5, drepeats = 5;
    bool json = false, lat = false, quiet = false;
    bool want[NMODES] = {false};
    bool any_mode = false;
    zoff_simd_path path = ZOFF_SIMD_AUTO;
    zoff_optimizer_config cfg = {.type = ZOFF_OPTIM_ADAMW, .lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .adam_w_mode = true, .bias_correction = true};
    const char *optname = "adamw";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        const char *eq = strchr(a, '=');
        char flag[64];
        snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
        bool takes = !strcmp(flag, "--params") || !strcmp(flag, "--threads") || !strcmp(flag, "--iters") ||
                     !strcmp(flag, "--rounds") || !strcmp(flag, "--repeats") || !strcmp(flag, "--optimizer") || !strcmp(flag, "--simd") ||
                     !strcmp(flag, "--mode");
        if (takes) {
            if (eq) val = eq + 1;
            else if (i + 1 < argc) val = argv[++i];
            else {
                fprintf(stderr, "zoff bench adam: %s needs a value\n", flag);
                return 2;
            }
        }
        if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
            usage(stdout);
            return 0;
        } else if (cli_quiet_flag(a, &quiet)) {
        } else if (!strcmp(flag, "--json")) json = true;
        else if (!strcmp(flag, "--latency")) lat = true;
        else if (!strcmp(flag, "--params")) {
            if (!parse_count(flag, val, 1, 4e9, &dparams)) return 2;
        } else if (!strcmp(flag, "--threads")) {
            if (!parse_count(flag, val, 0, 4096, &dthreads)) return 2;
        } else if (!strcmp(flag, "--iters")) {
            if (!parse_count(flag, val, 1, 1e6, &diters)) return 2;
        } else if (!strcmp(flag, "--rounds") || !strcmp(flag, "--repeats")) {
            if (!parse_count(flag, val, 1, MAX_REPEATS, &drepeats)) return 2;
        } else if (!strcmp(flag, "--optimizer")) {
            optname = val;
            if (!strcmp(val, "adamw")) cfg.type = ZOFF_OPTIM_ADAMW;
            else if (!strcmp(val, "adam")) cfg.type = ZOFF_OPTIM_ADAM, cfg.adam_w_mode = false;
            else if (!strcmp(val, "adagrad")) cfg.type = ZOFF_OPTIM_ADAGRAD;
            else if (!strcmp(val, "lion")) cfg.type = ZOFF_OPTIM_LION;
            else {
                fprintf(stderr, "zoff bench adam: --optimizer: '%s' is not adamw, adam, adagrad or lion\n", val);
                return 2;
            }
        } else if (!strcmp(flag, "--simd")) {
            if (zoff_simd_path_parse(val, &path) != ZOFF_OK) {
                fprintf(stderr, "zoff bench adam: --simd: %s\n", zoff_last_error());
                return 2;
            }
        } else if (!strcmp(flag, "--mode")) {
            int k = 0;
            while (k < NMODES && strcmp(g_modes[k].name, val)) k++;
            if (k == NMODES) {
                fprintf(stderr, "zoff bench adam: --mode: unknown mode '%s' (see --help)\n", val);
                return 2;
            }
            want[k] = any_mode = true;
        } else {
            cli_unknown_option("bench adam", a, usage);
            return 2;
        }
    }
    if (!any_mode)
        for (int k = 0; k < NMODES; k++) want[k] = true;
    const int64_t n = (int64_t)dparams;
    const int iters = (int)diters, repeats = (int)drepeats;

    zoff_host_optimizer *opt = NULL;
    zoff_host_optimizer_options o = {.threads = (int)dthreads, .path = path};
    zoff_status cs = zoff_host_optimizer_create_ex(&cfg, &o, &opt);
    if (cs != ZOFF_OK) {
        fprintf(stderr, "zoff bench adam: %s\n", zoff_last_error());
        return cs == ZOFF_ERR_NOMEM || cs == ZOFF_ERR_INTERNAL ? 1 : 2;
    }
    const int threads = zoff_host_optimizer_threads(opt);
    bench_bufs b;
    if (bufs_alloc(&b, n, threads) != ZOFF_OK) {
        fprintf(stderr, "zoff bench adam: %s\n", zoff_last_error());
        zoff_host_optimizer_destroy(opt);
        return 1;
    }
    double load0 = load_average();
    static double tb[NMODES][MAX_REPEATS], tm[NMODES][MAX_REPEATS];
    int64_t step = 0;
    zoff_status s = ZOFF_OK;
    /* warm-up: one pass of each (page faults, frequency) */
    for (int k = 0; k < NMODES && s == ZOFF_OK; k++) {
        if (!want[k]) continue;
        zoff_optim_tensors t = mode_tensors(&b, &g_modes[k], n);
        double dummy;
        s = time_probe(opt, &t, 1, &dummy);
        if (s == ZOFF_OK) s = time_update(opt, &t, 1, &step, &dummy);
    }
    for (int r = 0; r < repeats && s == ZOFF_OK; r++) {
        for (int k = 0; k < NMODES && s == ZOFF_OK; k++) {
            if (!want[k]) continue;
            zoff_optim_tensors t = mode_tensors(&b, &g_modes[k], n);
            s = time_probe(opt, &t, iters, &tb[k][r]);
            if (s == ZOFF_OK) s = time_update(opt, &t, iters, &step, &tm[k][r]);
        }
    }
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff bench adam: %s\n", zoff_last_error());
        bufs_free(&b);
        zoff_host_optimizer_destroy(opt);
        return 1;
    }
    double load1 = load_average();
    if (json) {
        printf("{\"bench\":\"adam\",\"optimizer\":\"%s\",\"params\":%lld,\"threads\":%d,\"simd\":\"%s\",\"iters\":%d,"
               "\"repeats\":%d,\"loadavg_before\":%.2f,\"loadavg_after\":%.2f,\"modes\":[",
               optname, (long long)n, threads, zoff_host_optimizer_path(opt), iters, repeats, load0, load1);
    } else {
        char np[48], nt[32], ns[32], nr[32];
        printf("zoff bench adam: %s, %s, %s, simd %s, %s x %s (interleaved with the bound), load %.2f -> %.2f\n",
               optname, zoff_format_count(n, "parameter", np, sizeof np), zoff_format_count(threads, "thread", nt, sizeof nt),
               zoff_host_optimizer_path(opt), zoff_format_count(iters, "step", ns, sizeof ns),
               zoff_format_count(repeats, "round", nr, sizeof nr), load0, load1);
        printf("%-22s %6s | %12s %9s | %12s %9s | %8s %15s\n", "mode", "B/par", "bound par/s", "bound GB/s",
               "optim par/s", "optim GB/s", "% bound", "(min..max %)");
    }
    report_modes(opt, &b, n, want, repeats, tb, tm, json);
    bufs_free(&b);
    if (lat && latency(&cfg, zoff_host_optimizer_simd(opt), threads, json) != ZOFF_OK) {
        if (json) printf("}\n");
        fprintf(stderr, "zoff bench adam: %s\n", zoff_last_error());
        zoff_host_optimizer_destroy(opt);
        return 1;
    }
    if (json) printf("}\n");
    zoff_host_optimizer_destroy(opt);
    return 0;
}
