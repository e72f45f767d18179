/* zoff bench nvme: the NVMe swapper against fio on the same directory in the
 * same run (sequential read, write and mixed read+write; direct I/O, same
 * block size and queue depth), then training steps with the optimizer state on
 * NVMe against cpu offload. Each comparison is of pairs taken next to each other,
 * round by round (the order within a pair alternates), reported as the median of
 * the paired ratios with its min and max (bench_stats.h). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench_stats.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/engine.h"
#include "zoff/swapper.h"

enum { NKIND = 3 }; /* read, write, mixed (update pass: read + write) */
static const char *kind_names[NKIND] = {"read", "write", "read+write"};


typedef struct bench_args {
    const char *dir;
    int64_t size, block, qd, buffers, sgs, rounds, iters, B, T;
    zoff_gpt2_shape shape;
    const char *dts;
    bool json, fio, step, delayed, bf16_states, quiet;
} bench_args;

/* State bytes per parameter (master, m, v: zoff_placement_state_bytes_per_param). */
static size_t state_bytes(const bench_args *a) {
    return zoff_placement_state_bytes_per_param(3, a->bf16_states ? ZOFF_BF16 : ZOFF_F32);
}

/* ------------------------------------------------------------------ fio */

static bool have_fio(void) { return system("fio --version >/dev/null 2>&1") == 0; }

/* fio's file in --dir, created here (empty, O_EXCL) so that it is this process's own: benchmarks
 * sharing a scratch disk neither measure nor remove each other's file. zoff-bench-fio-<pid>.dat, else
 * (a file of that name left by an older process with this pid: a container where zoff is always pid 1,
 * hosts sharing the disk) zoff-bench-fio-<pid>-<n>.dat with the first free n; the file found is noted
 * and kept. */
static zoff_status fio_file_create(const bench_args *a, char *file, size_t cap) {
    for (int n = 0; n < 1000; n++) {
        int m = n ? snprintf(file, cap, "%s/zoff-bench-fio-%ld-%d.dat", a->dir, (long)getpid(), n)
                  : snprintf(file, cap, "%s/zoff-bench-fio-%ld.dat", a->dir, (long)getpid());
        if (m < 0 || (size_t)m >= cap) return zoff_error(ZOFF_ERR_INVALID, "--dir %s: the path is too long", a->dir);
        int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            close(fd);
            return ZOFF_OK;
        }
        if (errno != EEXIST) return zoff_error(ZOFF_ERR_IO, "cannot create fio's file %s: %s", file, strerror(errno));
        struct stat st;
        char b[32];
        if (!a->quiet)
            fprintf(stderr,
                    "zoff bench nvme: note: %s (%s) is left by an older benchmark with this process's id %ld (a "
                    "container where zoff runs as the same pid each time, or another machine sharing %s): kept, this "
                    "benchmark uses the next free name; remove it, unless a benchmark on another machine sharing %s "
                    "is running\n",
                    file, stat(file, &st) == 0 ? zoff_format_bytes((size_t)st.st_size, b, sizeof b) : "size unknown",
                    (long)getpid(), a->dir, a->dir);
    }
    return zoff_error(ZOFF_ERR_IO, "cannot create fio's file in %s: 1000 names taken (%s the last)", a->dir, file);
}

/* fio files in --dir of benchmarks whose process is gone (killed with SIGKILL: a Ctrl-C or SIGTERM
 * removes it): said, not removed (a benchmark on another machine sharing the disk may own it). */
static void note_stale_fio(const bench_args *a) {
    DIR *d = opendir(a->dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        long pid;
        int end = 0;
        int n, dash = 0;
        if (sscanf(e->d_name, "zoff-bench-fio-%ld%n", &pid, &dash) == 1 && e->d_name[dash] == '-' &&
            sscanf(e->d_name + dash, "-%d%n", &n, &end) == 1)
            end += dash; /* zoff-bench-fio-<pid>-<n>.dat */
        else
            end = dash;
        if (!dash || strncmp(e->d_name + end, ".dat", 5) != 0 || pid <= 0 ||
            pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        struct stat st;
        char path[4400], b[32];
        snprintf(path, sizeof path, "%s/%s", a->dir, e->d_name);
        fprintf(stderr,
                "zoff bench nvme: note: %s (%s) is left by a benchmark that was killed (no process %ld runs here): "
                "remove it, unless a benchmark on another machine sharing %s is running\n",
                path, stat(path, &st) == 0 ? zoff_format_bytes((size_t)st.st_size, b, sizeof b) : "size unknown", pid,
                a->dir);
    }
    if (d) closedir(d);
}

/* One fio job; bytes per second (read + write for the mixed job). */
static zoff_status run_fio(const bench_args *a, const char *file, int kind, bool uring, double *bps) {
    char cmd[8192], errf[64];
    snprintf(errf, sizeof errf, "/tmp/zoff-bench-fio-%ld.err", (long)getpid());
    const char *rw = kind == 0 ? "read" : kind == 1 ? "write" : "rw --rwmixread=50";
    if (uring)
        snprintf(cmd, sizeof cmd,
                 "fio --name=zoff --filename='%s' --size=%lld --bs=%lld --iodepth=%lld --direct=1 --ioengine=io_uring "
                 "--rw=%s --output-format=json 2>%s",
                 file, (long long)a->size, (long long)a->block, (long long)a->qd, rw, errf);
    else /* the thread-pool engine: queue_depth synchronous workers */
        snprintf(cmd, sizeof cmd,
                 "fio --name=zoff --filename='%s' --size=%lld --offset_increment=%lld --numjobs=%lld "
                 "--group_reporting --bs=%lld --direct=1 --ioengine=psync --rw=%s --output-format=json 2>%s",
                 file, (long long)(a->size / a->qd), (long long)(a->size / a->qd), (long long)a->qd,
                 (long long)a->block, rw, errf);
    zoff_temp_register(errf); /* removed by a Ctrl-C too */
    FILE *p = popen(cmd, "r");
    if (!p) {
        zoff_temp_forget(errf);
        return zoff_error(ZOFF_ERR_IO, "cannot run fio: %s", strerror(errno));
    }
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    size_t got;
    while (out && (got = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += got;
        if (len + 1 == cap) {
            char *n2 = realloc(out, cap *= 2);
            if (!n2) break;
            out = n2;
        }
    }
    int rc = pclose(p);
    if (!out) return zoff_error(ZOFF_ERR_NOMEM, "out of memory reading fio's output");
    out[len] = '\0';
    char *brace = strchr(out, '{'); /* fio may print notes before the JSON */
    json_error_t je;
    json_t *root = rc == 0 && brace ? json_loads(brace, 0, &je) : NULL;
    free(out);
    if (!root) {
        char msg[512] = "";
        FILE *e = fopen(errf, "r");
        if (e) {
            size_t n = fread(msg, 1, sizeof msg - 1, e);
            msg[n] = '\0';
            fclose(e);
        }
        unlink(errf);
        zoff_temp_forget(errf);
        return zoff_error(ZOFF_ERR_IO, "fio %s on %s failed (exit %d): %s", kind_names[kind], a->dir, rc, msg);
    }
    unlink(errf);
    zoff_temp_forget(errf);
    json_t *job = json_array_get(json_object_get(root, "jobs"), 0);
    double r = json_number_value(json_object_get(json_object_get(job, "read"), "bw_bytes"));
    double w = json_number_value(json_object_get(json_object_get(job, "write"), "bw_bytes"));
    json_decref(root);
    *bps = kind == 0 ? r : kind == 1 ? w : r + w;
    if (!(*bps > 0)) return zoff_error(ZOFF_ERR_IO, "fio %s reported no bandwidth", kind_names[kind]);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ the swapper */

/* One pass over all groups; bytes per second moved (read + write for an update pass). */
static zoff_status swapper_pass(zoff_swapper *s, int ng, const int *order, int kind, double *bps) {
    unsigned mode = kind == 0 ? ZOFF_SWAP_READ : kind == 1 ? ZOFF_SWAP_WRITE : ZOFF_SWAP_UPDATE;
    double t0 = zoff_now();
    ZOFF_TRY(zoff_swapper_begin(s, order, ng, mode, 7u));
    for (int k = 0; k < ng; k++) {
        int g;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        ZOFF_TRY(zoff_swapper_next(s, &g, arr));
        ZOFF_TRY(zoff_swapper_release(s));
    }
    ZOFF_TRY(zoff_swapper_end(s));
    ZOFF_TRY(zoff_swapper_flush(s));
    double dt = zoff_now() - t0;
    *bps = (double)(zoff_swapper_file_bytes(s) - ZOFF_AIO_ALIGN) * (kind == 2 ? 2 : 1) / dt; /* less the header */
    if (kind == 2) { /* an update pass reads ahead the next one: wait for it, outside the timing */
        ZOFF_TRY(zoff_swapper_begin(s, order, 0, ZOFF_SWAP_READ, 7u));
        ZOFF_TRY(zoff_swapper_end(s));
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ training steps */

typedef struct step_result {
    double step, compute, host;
} step_result;

static zoff_status run_steps(const bench_args *a, const char *json, zoff_dtype dt, zoff_backend_kind kind,
                             step_result *out, int64_t *nparams) {
    zoff_config cfg;
    ZOFF_TRY(zoff_config_load_string(json, "bench config", &cfg));
    zoff_status s = zoff_config_resolve_batch(&cfg, 1);
    int64_t B = a->B, T = a->T;
    int32_t *dx = NULL, *hx = NULL;
    int iters = (int)a->iters, warm = 2;
    double *samp = calloc((size_t)iters * 3, sizeof(double));
    zoff_train_stack stk = {0}; /* device -> model -> initial weights -> engine */
    zoff_train_stack_options so = {.device = {.kind = kind}, .cfg = &cfg, .shape = a->shape, .batch_size = B,
                                   .seq_len = T, .dtype = dt, .seed = 1};
    if (s == ZOFF_OK) s = zoff_train_stack_create(&so, &stk);
    zoff_device *dev = stk.dev;
    zoff_gpt2 *m = stk.model;
    zoff_engine *e = stk.eng;
    size_t tb = (size_t)(B * T) * sizeof(int32_t);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "tokens", (void **)&dx);
    if (s == ZOFF_OK && (!(hx = malloc(tb)) || !samp)) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    uint64_t rng = 88172645463325252ull;
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    for (int it = 0; s == ZOFF_OK && it < warm + iters; it++) {
        double t0 = zoff_now();
        s = zoff_engine_zero_grad(e);
        for (int64_t i = 0; i < B * T; i++) {
            rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
            hx[i] = (int32_t)(rng % (uint64_t)a->shape.vocab_size);
        }
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, dx, hx, tb, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_gpt2_forward_train(m, dx, dx, B, T, zoff_engine_backward_scale(e));
        zoff_engine_begin_backward(e, true);
        if (s == ZOFF_OK) s = zoff_gpt2_backward(m, zoff_engine_grad_ready, e);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        double tc = zoff_now() - t0;
        zoff_step_info si;
        if (s == ZOFF_OK) s = zoff_engine_step(e, 1e-4, &si);
        if (s != ZOFF_OK || it < warm) continue;
        double *p = samp + (size_t)(it - warm) * 3;
        p[0] = zoff_now() - t0, p[1] = tc, p[2] = si.t_host_work;
    }
    if (s == ZOFF_OK) s = zoff_engine_flush(e);
    if (s == ZOFF_OK) {
        double col[1000];
        double *dst[3] = {&out->step, &out->compute, &out->host};
        for (int c = 0; c < 3; c++) {
            for (int i = 0; i < iters; i++) col[i] = samp[(size_t)i * 3 + (size_t)c];
            *dst[c] = cli_median(col, iters);
        }
        *nparams = zoff_gpt2_num_params(m);
    }
    free(samp);
    free(hx);
    if (dev && dx) zoff_device_free(dev, dx);
    zoff_train_stack_destroy(&stk);
    zoff_config_free(&cfg);
    return s;
}

/* ------------------------------------------------------------------ the command */

#define MAX_ROUNDS 99

static void usage(FILE *f) {
    fprintf(f,
            "usage: zoff bench nvme [options]\n"
            "\n"
            "Measures, on one directory and in one run, fio's sequential read, write and mixed\n"
            "read+write bandwidth (direct I/O, same block size and queue depth) and zoff's NVMe\n"
            "swapper reading, writing and updating (read + write) optimizer state of the same size,\n"
            "in pairs taken next to each other, round by round; prints per pass each side's median\n"
            "and the median of the paired swapper/fio ratios with their min and max. Then times\n"
            "training steps with offload_optimizer.device nvme against cpu offload for one model,\n"
            "paired the same way. When the rounds' ratios spread more than %.0f%% of their median the\n"
            "bench says so: the median is then no measurement of zoff.\n"
            "\n"
            "  --dir DIR              directory on the disk to measure (default /tmp)\n"
            "  --size BYTES           optimizer state streamed per pass, e.g. 1GiB (default 256MiB)\n"
            "  --block-size BYTES     aio.block_size and fio --bs (default 1MiB)\n"
            "  --queue-depth N        aio.queue_depth and fio --iodepth (default 8)\n"
            "  --buffer-count N       offload_optimizer.buffer_count (default 4)\n"
            "  --sub-group-size N     elements per sub-group (default: size / 12 / 16; steps: params / 16)\n"
            "  --rounds N             interleaved rounds, 1..%d (default 5)\n"
            "  --no-fio               swapper only\n"
            "  --no-step              I/O only\n"
            "  --delayed              steps with the delayed parameter update (both configurations)\n"
            "  --bf16-states          bf16 m and v (bf16.bf16_optimizer_states; both configurations, the swap\n"
            "                         file's too; needs --dtype bf16)\n"
            "  --num-layers N --hidden-size N --num-attention-heads N --seq-length N --vocab-size N\n"
            "                         model for the steps (default 4 x 128, 4 heads, 64, 50257)\n"
            "  --micro-batch-size N   (default 8)\n"
            "  --dtype f32|bf16|f16   (default bf16)\n"
            "  --iters N              timed steps per configuration and round (default 3)\n"
            "  --json                 one JSON object on stdout\n"
            "  -q, --quiet            no notes on stderr (fio files left in --dir, the library's); the\n"
            "                         table or JSON on stdout, warnings and errors still print\n",
            100.0 * CLI_BENCH_SPREAD_LIMIT, MAX_ROUNDS);
}

/* --size, --block-size: a byte count > 0 (e.g. 1GiB) into *dst; false (the error printed) otherwise. */
static bool size_value(const char *flag, int argc, char **argv, int *i, int64_t *dst) {
    const char *v = cli_value("bench nvme", argc, argv, i);
    size_t sz;
    if (!v) return false;
    if (zoff_parse_size(v, &sz) != ZOFF_OK) {
        fprintf(stderr, "zoff bench nvme: %s: %s\n", flag, zoff_last_error());
        return false;
    }
    if (sz == 0) {
        fprintf(stderr, "zoff bench nvme: %s: '%s' is no bytes; give a size such as 1GiB\n", flag, v);
        return false;
    }
    *dst = (int64_t)sz;
    return true;
}

/* 0: go on; -1: --help printed; else the exit code. */
static int parse_args(int argc, char **argv, bench_args *a) {
    const cli_string_flag strs[] = {{"--dir", &a->dir}, {"--dtype", &a->dts}};
    const cli_int_flag ints[] = {
        {"--queue-depth", 1, 4096, &a->qd},
        {"--buffer-count", 1, 1024, &a->buffers},
        {"--sub-group-size", 1024, (int64_t)1 << 40, &a->sgs},
        {"--rounds", 1, MAX_ROUNDS, &a->rounds},
        {"--iters", 1, 999, &a->iters},
        {"--num-layers", 1, ZOFF_GPT2_MAX_LAYERS, &a->shape.num_layers},
        {"--hidden-size", 1, ZOFF_GPT2_MAX_HIDDEN, &a->shape.hidden_size},
        {"--num-attention-heads", 1, ZOFF_GPT2_MAX_HIDDEN, &a->shape.num_heads},
        {"--seq-length", 1, ZOFF_GPT2_MAX_SEQ, &a->T},
        {"--vocab-size", 2, ZOFF_GPT2_MAX_TRAIN_VOCAB, &a->shape.vocab_size},
        {"--micro-batch-size", 1, ZOFF_GPT2_MAX_BATCH, &a->B},
    };
    const cli_bool_flag bools[] = {{"--no-fio", &a->fio, false},
                                   {"--no-step", &a->step, false},
                                   {"--delayed", &a->delayed, true},
                                   {"--bf16-states", &a->bf16_states, true},
                                   {"--json", &a->json, true}};
    const cli_flag_tables tables = {NULL,  strs, sizeof strs / sizeof *strs, ints, sizeof ints / sizeof *ints,
                                    bools, sizeof bools / sizeof *bools,       usage};
    for (int i = 1; i < argc; i++) {
        char o[64];
        if (cli_quiet_flag(argv[i], &a->quiet)) continue;
        int took = cli_table_flags("bench nvme", &tables, o, sizeof o, argc, argv, &i);
        if (took == CLI_FLAG_TAKEN) continue;
        if (took != CLI_FLAG_NONE) return took == CLI_FLAG_HELP ? -1 : 2;
        if (!strcmp(o, "--size")) {
            if (!size_value(o, argc, argv, &i, &a->size)) return 2;
        } else if (!strcmp(o, "--block-size")) {
            if (!size_value(o, argc, argv, &i, &a->block)) return 2;
        } else {
            cli_unknown_option("bench nvme", argv[i], usage);
            return 2;
        }
    }
    a->shape.max_seq_len = a->T;
    if (a->block % ZOFF_AIO_ALIGN) {
        fprintf(stderr, "zoff bench nvme: --block-size %lld is not a multiple of %d\n", (long long)a->block,
                ZOFF_AIO_ALIGN);
        return 2;
    }
    if (cli_bench_dir("bench nvme", a->dir,
                      "a smaller --size (for the steps, a smaller model: --num-layers, --hidden-size, --vocab-size)"))
        return 2;
    if (strchr(a->dir, '\'')) {
        fprintf(stderr, "zoff bench nvme: --dir must not contain a quote\n");
        return 2;
    }
    return 0;
}

/* What the I/O rounds measured: bytes per second per kind and round. */
typedef struct io_result {
    double fio[NKIND][MAX_ROUNDS], zoff[NKIND][MAX_ROUNDS];
    cli_paired pair[NKIND];          /* zoff / fio */
    double zoff_median[NKIND];       /* --no-fio: the swapper alone */
    bool uring, direct;
} io_result;

/* The swapper sized to --size against fio, round by round: per kind one fio job and one
 * swapper pass next to each other, the order alternating with the round. */
/* The I/O rounds' sub-groups: how many, of *sgs elements each. */
static int io_groups(const bench_args *a, int64_t *sgs) {
    const int64_t per = (int64_t)state_bytes(a);
    *sgs = a->sgs ? a->sgs : a->size / per / 16;
    *sgs = *sgs / 1024 * 1024;
    if (*sgs < 1024) *sgs = 1024;
    return (int)((a->size / per + *sgs - 1) / *sgs);
}

static zoff_status io_rounds(const bench_args *a, io_result *res) {
    int64_t sgs;
    int ng = io_groups(a, &sgs);
    int64_t *counts = calloc((size_t)ng, sizeof *counts);
    int *order = calloc((size_t)ng, sizeof *order);
    if (!counts || !order) {
        free(counts);
        free(order);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    }
    for (int g = 0; g < ng; g++) counts[g] = sgs, order[g] = ng - 1 - g;
    zoff_swapper_options so = {.dir = a->dir, .stem = "bench", .num_groups = ng, .counts = counts, .num_arrays = 3,
                               .buffer_count = a->buffers, .pipeline_read = true, .pipeline_write = true};
    if (a->bf16_states) so.dtype[1] = so.dtype[2] = ZOFF_BF16; /* m and v as the engine keeps them */
    zoff_aio_options_default(&so.aio);
    so.aio.block_size = a->block;
    so.aio.queue_depth = a->qd;
    zoff_swapper *sw = NULL;
    zoff_status s = zoff_swapper_create(&so, &sw);
    free(counts);
    if (s != ZOFF_OK) {
        free(order);
        return s;
    }
    res->uring = zoff_swapper_engine(sw) == ZOFF_AIO_URING;
    res->direct = zoff_swapper_direct(sw);
    char fb[32];
    if (!a->json)
        printf("zoff bench nvme: %s\n  swapper: %s\n  state per pass %s in %d sub-groups of %lld elements; %lld "
               "rounds\n",
               a->dir, zoff_swapper_describe(sw), zoff_format_bytes((size_t)zoff_swapper_file_bytes(sw), fb, sizeof fb),
               ng, (long long)sgs, (long long)a->rounds);
    double bps;
    char fiofile[4200] = "";
    if (a->fio) s = fio_file_create(a, fiofile, sizeof fiofile);
    const bool own_fio = a->fio && s == ZOFF_OK;             /* the name found on failure is not ours */
    if (own_fio) zoff_temp_register(fiofile);                 /* removed by a Ctrl-C too */
    if (s == ZOFF_OK && a->fio) s = run_fio(a, fiofile, 1, res->uring, &bps); /* lay the file out; not measured */
    if (s == ZOFF_OK) s = swapper_pass(sw, ng, order, 1, &bps); /* the initial write */
    for (int r = 0; s == ZOFF_OK && r < a->rounds; r++) {
        for (int k = 0; s == ZOFF_OK && k < NKIND; k++) {
            int kind = k == 0 ? 1 : k == 1 ? 0 : 2; /* write, read, mixed */
            bool fio_first = r % 2 == 0;
            if (a->fio && fio_first) s = run_fio(a, fiofile, kind, res->uring, &res->fio[kind][r]);
            if (s == ZOFF_OK) s = swapper_pass(sw, ng, order, kind, &res->zoff[kind][r]);
            if (s == ZOFF_OK && a->fio && !fio_first) s = run_fio(a, fiofile, kind, res->uring, &res->fio[kind][r]);
        }
    }
    if (own_fio) unlink(fiofile);
    if (own_fio) zoff_temp_forget(fiofile);
    zoff_swapper_destroy(sw);
    free(order);
    for (int k = 0; s == ZOFF_OK && k < NKIND; k++) {
        res->zoff_median[k] = cli_median(res->zoff[k], (int)a->rounds);
        if (a->fio) cli_paired_ratios(res->zoff[k], res->fio[k], (int)a->rounds, &res->pair[k]);
    }
    return s;
}

static void io_report(const bench_args *a, const io_result *res) {
    char why[400], rb[32];
    if (a->json)
        printf("{\"dir\":\"%s\",\"direct\":%s,\"engine\":\"%s\",\"block_size\":%lld,\"queue_depth\":%lld,"
               "\"buffer_count\":%lld,\"state_bytes\":%lld,\"rounds\":%lld,\"spread_limit\":%.2f,\"io\":{",
               a->dir, res->direct ? "true" : "false", res->uring ? "io_uring" : "threads", (long long)a->block,
               (long long)a->qd, (long long)a->buffers, (long long)a->size, (long long)a->rounds,
               CLI_BENCH_SPREAD_LIMIT);
    else
        printf("\n%s, pairs next to each other (MB/s = 1e6 bytes/s; ratio = swapper / fio of each pair)\n"
               "%-12s %12s %12s %8s %8s %8s\n",
               zoff_format_count(a->rounds, "round", rb, sizeof rb), "pass", "fio median", "zoff median", "ratio", "min", "max");
    for (int k = 0; k < NKIND; k++) {
        const cli_paired *p = &res->pair[k];
        if (a->json) {
            printf("%s\"%s\":{\"swapper_bps\":%.0f", k ? "," : "", kind_names[k], res->zoff_median[k]);
            if (a->fio) {
                printf(",\"fio_bps\":%.0f,", p->b_median);
                cli_paired_json(stdout, p);
                printf(",\"verdict\":\"%s\"", cli_paired_verdict(p, why, sizeof why));
            }
            printf("}");
        } else if (a->fio) {
            printf("%-12s %12.1f %12.1f %8.3f %8.3f %8.3f%s\n", kind_names[k], p->b_median / 1e6,
                   res->zoff_median[k] / 1e6, p->ratio_median, p->ratio_min, p->ratio_max, p->steady ? "" : "  (*)");
        } else {
            printf("%-12s %12s %12.1f %8s\n", kind_names[k], "-", res->zoff_median[k] / 1e6, "-");
        }
    }
    if (a->json) printf("}");
    for (int k = 0; !a->json && a->fio && k < NKIND; k++)
        if (!res->pair[k].steady)
            printf("(*) %s: %s\n", kind_names[k], cli_paired_verdict(&res->pair[k], why, sizeof why));
}

/* Training steps, cpu offload and nvme next to each other in each round (order alternating). */
static zoff_status step_rounds(const bench_args *a, zoff_dtype dt, const char *prec, zoff_backend_kind bk,
                               step_result res[2][MAX_ROUNDS], int64_t *n) {
    zoff_status s = ZOFF_OK;
    for (int r = 0; s == ZOFF_OK && r < a->rounds; r++)
        for (int i = 0; s == ZOFF_OK && i < 2; i++) {
            int c = r % 2 ? 1 - i : i; /* 0 cpu offload, 1 nvme */
            char js[6000], sg[64];
            /* default: about 16 sub-groups (GPT-2's parameter count without padding) */
            zoff_gpt2_shape unpadded = a->shape;
            unpadded.max_seq_len = a->T;
            unpadded.padded_vocab_size = a->shape.vocab_size;
            int64_t approx = zoff_gpt2_count_params(&unpadded);
            snprintf(sg, sizeof sg, ", \"sub_group_size\": %lld", (long long)(a->sgs ? a->sgs : (approx + 15) / 16));
            snprintf(js, sizeof js,
                     "{\"train_micro_batch_size_per_gpu\": %lld, %s \"optimizer\": {\"type\": \"AdamW\"},"
                     " \"zero_optimization\": {\"stage\": 2 %s %s, \"offload_optimizer\": {\"device\": \"%s\","
                     " \"nvme_path\": \"%s\", \"buffer_count\": %lld, \"pipeline_read\": true,"
                     " \"pipeline_write\": true}}, \"aio\": {\"block_size\": %lld, \"queue_depth\": %lld}}",
                     (long long)a->B, prec, sg,
                     a->delayed ? ", \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 1" : "",
                     c == 0 ? "cpu" : "nvme", a->dir, (long long)a->buffers, (long long)a->block, (long long)a->qd);
            s = run_steps(a, js, dt, bk, &res[c][r], n);
        }
    return s;
}

static void step_report(const bench_args *a, const io_result *io, zoff_backend_kind bk,
                        step_result res[2][MAX_ROUNDS], int64_t n) {
    int R = (int)a->rounds;
    double v[2][3][MAX_ROUNDS], med[2][3];
    for (int c = 0; c < 2; c++)
        for (int r = 0; r < R; r++) v[c][0][r] = res[c][r].step, v[c][1][r] = res[c][r].compute, v[c][2][r] = res[c][r].host;
    for (int c = 0; c < 2; c++)
        for (int f = 0; f < 3; f++) med[c][f] = cli_median(v[c][f], R);
    cli_paired p; /* nvme step / cpu offload step, per round */
    cli_paired_ratios(v[1][0], v[0][0], R, &p);
    const double per = (double)state_bytes(a);
    double disk_bytes = 2.0 * per * (double)n; /* read and write master, m, v */
    double fr = io->pair[0].b_median, fw = io->pair[1].b_median;
    double disk_t = a->fio ? per * (double)n / fr + per * (double)n / fw : 0;
    bool carries = a->fio && disk_t <= med[0][1];
    char why[400], bb[32];
    const char *backend = bk == ZOFF_BACKEND_CUDA ? "cuda" : "cpu";
    if (a->json) {
        printf(",\"steps\":{\"backend\":\"%s\",\"params\":%lld,\"dtype\":\"%s\",\"delayed\":%s,\"bf16_states\":%s,"
               "\"cpu_offload\":{\"step\":%.6f,\"compute\":%.6f,\"host_work\":%.6f},"
               "\"nvme\":{\"step\":%.6f,\"compute\":%.6f,\"host_work\":%.6f},\"nvme_over_cpu\":{",
               backend, (long long)n, a->dts, a->delayed ? "true" : "false", a->bf16_states ? "true" : "false", med[0][0], med[0][1], med[0][2], med[1][0],
               med[1][1], med[1][2]);
        cli_paired_json(stdout, &p);
        printf(",\"verdict\":\"%s\"},\"disk_bytes_per_step\":%.0f,\"disk_seconds_at_fio\":%.6f,"
               "\"disk_carries_within_compute\":%s}}\n",
               cli_paired_verdict(&p, why, sizeof why), disk_bytes, disk_t, carries ? "true" : "false");
        return;
    }
    char np[48], nr[32];
    printf("\ntraining steps: GPT-2 %lld x %lld (%s), batch %lld x %lld, %s, %s backend%s%s; medians of "
           "%s\n%-12s %10s %10s %10s\n%-12s %10.4f %10.4f %10.4f\n%-12s %10.4f %10.4f %10.4f\n"
           "nvme / cpu offload step time, paired per round: median %.3f (min %.3f, max %.3f); target <= 1.25 where "
           "the disk carries %.0f B/param/step within the compute time\n",
           (long long)a->shape.num_layers, (long long)a->shape.hidden_size, zoff_format_count(n, "parameter", np, sizeof np),
           (long long)a->B, (long long)a->T, a->dts, backend, a->delayed ? ", delayed parameter update" : "",
           a->bf16_states ? ", bf16 optimizer states" : "", zoff_format_count(R, "round", nr, sizeof nr), "config", "step",
           "compute", "host-opt", "cpu offload", med[0][0], med[0][1], med[0][2], "nvme", med[1][0], med[1][1],
           med[1][2], p.ratio_median, p.ratio_min, p.ratio_max, 2.0 * per);
    if (!p.steady) printf("(*) nvme / cpu offload: %s\n", cli_paired_verdict(&p, why, sizeof why));
    if (a->fio)
        printf("disk: %s per step at fio's median read and write speeds = %.4f s; compute (forward + backward) "
               "%.4f s: the disk %s carry it within the compute time\n",
               zoff_format_bytes((size_t)disk_bytes, bb, sizeof bb), disk_t, med[0][1], carries ? "can" : "cannot");
}

int zoff_cmd_bench_nvme(int argc, char **argv) {
    bench_args a = {.dir = "/tmp", .size = (int64_t)256 << 20, .block = 1 << 20, .qd = 8, .buffers = 4, .rounds = 5,
                    .iters = 3, .B = 8, .T = 64, .dts = "bf16", .fio = true, .step = true,
                    .shape = {.num_layers = 4, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64,
                              .vocab_size = 50257}};
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    zoff_dtype dt;
    if (!cli_parse_dtype("bench nvme", "--dtype", a.dts, &dt)) return 2;
    a.dts = cli_bench_dtype_name(dt);
    const char *prec = dt == ZOFF_F32 ? ""
                       : dt == ZOFF_F16
                           ? "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12},"
                       : a.bf16_states ? "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},"
                                       : "\"bf16\": {\"enabled\": true},";
    if (a.bf16_states && dt != ZOFF_BF16) {
        fprintf(stderr, "zoff bench nvme: --bf16-states needs --dtype bf16 (bf16 optimizer states are a bf16-training "
                        "option), got --dtype %s\n", a.dts);
        return 2;
    }
    int64_t sgs;
    int ng = io_groups(&a, &sgs), need = zoff_swapper_buffers_needed(true, true, ng);
    if (a.buffers < need) { /* before any measuring */
        fprintf(stderr,
                "zoff bench nvme: --buffer-count %lld is too few: the swapper's pipelined read and write of %d "
                "sub-groups need %d buffers (read i+1 | update i | write i-1); give --buffer-count %d or more\n",
                (long long)a.buffers, ng, need, need);
        return 2;
    }
    if (a.fio && !have_fio()) {
        fprintf(stderr, "zoff bench nvme: fio not found (apt-get install fio, or scripts/deps.sh); measuring the "
                        "swapper only\n");
        a.fio = false;
    }
    if (a.fio && !a.quiet) note_stale_fio(&a);
    static io_result io;
    memset(&io, 0, sizeof io);
    zoff_status s = io_rounds(&a, &io);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff bench nvme: %s\n", zoff_last_error());
        return cli_exit_code(s);
    }
    io_report(&a, &io);
    if (!a.step) {
        if (a.json) printf("}\n");
        return 0;
    }
    zoff_backend_kind bk = zoff_backend_available(ZOFF_BACKEND_CUDA) ? ZOFF_BACKEND_CUDA : ZOFF_BACKEND_CPU;
    static step_result res[2][MAX_ROUNDS];
    int64_t n = 0;
    if ((s = step_rounds(&a, dt, prec, bk, res, &n)) != ZOFF_OK) {
        if (a.json) printf("}\n");
        fprintf(stderr, "zoff bench nvme: steps: %s\n", zoff_last_error());
        return cli_exit_code(s);
    }
    step_report(&a, &io, bk, res, n);
    return 0;
}
