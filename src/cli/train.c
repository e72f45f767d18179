/* zoff train: the training loop. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/iofault.h"
#include "zoff/resources.h"
#include "zoff/safetensors.h"
#include "zoff/schedule.h"
#ifdef ZOFF_HAVE_MPI
#include <mpi.h>
#endif

/* The default job's DeepSpeed config: a small GPT-2 trained with AdamW and a
 * warmup + cosine schedule. `zoff train --config FILE` replaces it. */
static const char *DEFAULT_CONFIG =
    "{\n"
    "  \"train_micro_batch_size_per_gpu\": 8,\n"
    "  \"gradient_accumulation_steps\": 1,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3, \"betas\": [0.9, 0.95], \"eps\": 1e-8, "
    "\"weight_decay\": 0.1}},\n"
    "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": 200, \"warmup_num_steps\": "
    "20, \"cos_min_ratio\": 0.1}},\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 10,\n"
    "  \"zero_optimization\": {\"stage\": 0},\n"
    "  \"model\": {\"num_layers\": 4, \"hidden_size\": 128, \"num_attention_heads\": 4, \"seq_length\": 64}\n"
    "}\n";

typedef struct train_args {
    const char *config_path;
    int64_t num_layers, hidden_size, num_heads, seq_length, vocab_size, max_pos, micro_batch;
    int64_t train_iters, eval_iters, save_interval, keep_last;
    const char *save_dir, *load_dir, *data_path, *val_path, *tokenizer, *device;
    const char *init_from; /* --init-from: safetensors weights to start from */
    size_t device_memory;
    uint64_t seed;
    bool checkpoint_activations, quiet;
    double comm_timeout; /* --comm-timeout (0: ZOFF_COMM_TIMEOUT or the default) */
} train_args;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: zoff train [options]\n"
            "\n"
            "With no options: trains a small GPT-2 (4 layers, width 128) on the bundled corpus\n"
            "(Debian's fortunes, GPT-2 BPE) on the CPU backend, writing out/gpt2-small/.\n"
            "\n"
            "  --config FILE               DeepSpeed JSON config (batch, optimizer, scheduler, zero_optimization, ...)\n"
            "  --num-layers N              transformer blocks             (config model.num_layers, default 4)\n"
            "  --hidden-size N             width                          (default 128)\n"
            "  --num-attention-heads N     heads                          (default 4)\n"
            "  --seq-length N              tokens per sequence            (default 64)\n"
            "  --max-position-embeddings N rows of the position table     (default: seq length)\n"
            "  --vocab-size N              vocabulary (default: the tokenizer's, 50257 for gpt2)\n"
            "  --micro-batch-size N        overrides train_micro_batch_size_per_gpu\n"
            "  --train-iters N             optimizer steps                (default 200)\n"
            "  --eval-iters N              validation batches before and after training (default 20; 0 = none)\n"
            "  --data-path PATTERN         training shards (.bin file, directory or glob; see zoff tokenize)\n"
            "  --val-path PATTERN          validation shards (default: the last 5%% of --data-path)\n"
            "  --tokenizer gpt2|byte       tokenizer of the default corpus (default gpt2)\n"
            "  --save DIR                  output folder: metrics.jsonl and checkpoints (default out/gpt2-small)\n"
            "  --save-interval N           also save every N steps (default: only at the end)\n"
            "  --keep-last N               keep only the newest N checkpoints (default: all)\n"
            "  --load DIR                  resume from the newest complete checkpoint in DIR\n"
            "  --init-from FILE            start from the GPT-2 weights of a safetensors file (zoff export, or\n"
            "                              Hugging Face's gpt2 model.safetensors); the flags must give its shape\n"
            "  --seed N                    initialisation and data order (default 1234)\n"
            "  --device cpu|cuda           backend (default: cuda when available, else cpu)\n"
            "  --device-memory SIZE        device memory budget, e.g. 256MiB (CPU backend: simulated)\n"
            "  --checkpoint-activations    recompute block activations in backward (less memory)\n"
            "  --quiet                     no progress output\n"
            "  --comm-timeout SECONDS      data parallel (mpirun -np N zoff train): a collective that does not\n"
            "                              finish in time ends all ranks with an error (default: $ZOFF_COMM_TIMEOUT,\n"
            "                              else 300; see docs/multinode.md)\n");
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

/* Exit code for a failing status: bad input / config -> 2, runtime -> 1. */
static char g_who[64] = "zoff train"; /* "zoff train [rank 1/2]" with several ranks */
static int fail(const char *what, zoff_status s) {
    fprintf(stderr, "%s: %s: %s\n", g_who, what, zoff_last_error());
    return (s == ZOFF_ERR_CONFIG || s == ZOFF_ERR_INVALID || s == ZOFF_ERR_FORMAT || s == ZOFF_ERR_UNSUPPORTED) ? 2
                                                                                                              : 1;
}

static int parse_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->train_iters = 200;
    a->eval_iters = 20;
    a->seed = 1234;
    a->save_dir = "out/gpt2-small";
    a->tokenizer = "gpt2";
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *v;
        int64_t x;
        char name[64];
        const char *eq = strchr(arg, '=');
        size_t nl = eq ? (size_t)(eq - arg) : strlen(arg);
        snprintf(name, sizeof name, "%.*s", (int)(nl < 63 ? nl : 63), arg);
#define FLAG(s) (!strcmp(name, s))
#define VALUE() \
    if (!(v = cli_value("train", argc, argv, &i))) return 2
#define INTV(field, lo, hi) \
    VALUE(); \
    if (!cli_parse_i64("train", name, v, lo, hi, &x)) return 2; \
    a->field = x
        if (FLAG("-h") || FLAG("--help")) {
            train_usage(stdout);
            return -1;
        } else if (FLAG("--config")) {
            VALUE();
            a->config_path = v;
        } else if (FLAG("--num-layers")) {
            INTV(num_layers, 1, 1024);
        } else if (FLAG("--hidden-size")) {
            INTV(hidden_size, 1, 1 << 20);
        } else if (FLAG("--num-attention-heads")) {
            INTV(num_heads, 1, 4096);
        } else if (FLAG("--seq-length")) {
            INTV(seq_length, 1, 1 << 20);
        } else if (FLAG("--max-position-embeddings")) {
            INTV(max_pos, 1, 1 << 20);
        } else if (FLAG("--vocab-size")) {
            INTV(vocab_size, 2, 65536);
        } else if (FLAG("--micro-batch-size")) {
            INTV(micro_batch, 1, 1 << 20);
        } else if (FLAG("--train-iters")) {
            INTV(train_iters, 0, INT64_MAX / 2);
        } else if (FLAG("--eval-iters")) {
            INTV(eval_iters, 0, 1 << 20);
        } else if (FLAG("--save-interval")) {
            INTV(save_interval, 1, INT64_MAX / 2);
        } else if (FLAG("--keep-last")) {
            INTV(keep_last, 1, 1 << 20);
        } else if (FLAG("--seed")) {
            INTV(seed, 0, INT64_MAX);
        } else if (FLAG("--save")) {
            VALUE();
            a->save_dir = v;
        } else if (FLAG("--load")) {
            VALUE();
            a->load_dir = v;
        } else if (FLAG("--init-from")) {
            VALUE();
            a->init_from = v;
        } else if (FLAG("--data-path")) {
            VALUE();
            a->data_path = v;
        } else if (FLAG("--val-path")) {
            VALUE();
            a->val_path = v;
        } else if (FLAG("--tokenizer")) {
            VALUE();
            if (strcmp(v, "gpt2") && strcmp(v, "byte")) {
                fprintf(stderr, "zoff train: --tokenizer: '%s' is not one of gpt2, byte\n", v);
                return 2;
            }
            a->tokenizer = v;
        } else if (FLAG("--device")) {
            VALUE();
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "zoff train: --device: '%s' is not one of cpu, cuda\n", v);
                return 2;
            }
            a->device = v;
        } else if (FLAG("--device-memory")) {
            VALUE();
            if (zoff_parse_size(v, &a->device_memory) != ZOFF_OK) {
                fprintf(stderr, "zoff train: --device-memory: %s\n", zoff_last_error());
                return 2;
            }
        } else if (FLAG("--checkpoint-activations")) {
            a->checkpoint_activations = true;
        } else if (FLAG("--quiet")) {
            a->quiet = true;
        } else if (FLAG("--comm-timeout")) {
            VALUE();
            if (!cli_parse_f64("train", name, v, 1e-3, 1e9, &a->comm_timeout)) return 2;
        } else {
            fprintf(stderr, "zoff train: unknown option '%s' (zoff train --help lists them)\n", arg);
            return 2;
        }
#undef FLAG
#undef VALUE
#undef INTV
    }
    return 0;
}

/* Resolve the model shape: flags override the config's model section, which overrides defaults. */
static int resolve_shape(const train_args *a, const zoff_config *cfg, int64_t tok_vocab, zoff_gpt2_shape *sh,
                         int64_t *seq_len) {
    const zoff_model_config *m = &cfg->model;
#define PICK(flag, cfgv, def) ((flag) ? (flag) : (cfgv) ? (cfgv) : (def))
    sh->num_layers = PICK(a->num_layers, m->num_layers, 4);
    sh->hidden_size = PICK(a->hidden_size, m->hidden_size, 128);
    sh->num_heads = PICK(a->num_heads, m->num_attention_heads, 4);
    *seq_len = PICK(a->seq_length, m->seq_length, 64);
    sh->max_seq_len = PICK(a->max_pos, m->max_position_embeddings, *seq_len);
    sh->vocab_size = PICK(a->vocab_size, m->vocab_size, tok_vocab);
#undef PICK
    sh->padded_vocab_size = 0;
    if (sh->vocab_size < tok_vocab) {
        fprintf(stderr,
                "zoff train: vocab size %lld is smaller than the %lld tokens of the tokenizer; use --vocab-size >= "
                "%lld\n",
                (long long)sh->vocab_size, (long long)tok_vocab, (long long)tok_vocab);
        return 2;
    }
    if (*seq_len > sh->max_seq_len) {
        fprintf(stderr, "zoff train: --seq-length %lld exceeds --max-position-embeddings %lld\n",
                (long long)*seq_len, (long long)sh->max_seq_len);
        return 2;
    }
    return 0;
}

/* Output directory: create it and prove it is writable before training starts. */
static zoff_status check_output_dir(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return zoff_error(ZOFF_ERR_IO, "cannot create output directory %s: %s (choose another --save)", buf,
                              strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return zoff_error(ZOFF_ERR_IO, "cannot create output directory %s: %s (choose another --save)", buf,
                          strerror(errno));
    snprintf(buf, sizeof buf, "%s/.zoff-write-test-%d", dir, (int)getpid());
    FILE *f = fopen(buf, "w");
    if (!f)
        return zoff_error(ZOFF_ERR_IO, "output directory %s is not writable: %s (choose another --save)", dir,
                          strerror(errno));
    fclose(f);
    unlink(buf);
    return ZOFF_OK;
}

/* Mean loss over n validation batches (forward only). */
static zoff_status evaluate(zoff_gpt2 *model, zoff_loader *val, int64_t n, int64_t B, int64_t T, int32_t *hx,
                            int32_t *hy, int32_t *dx, int32_t *dy, zoff_stream *st, double *out) {
    double sum = 0;
    zoff_loader_reset(val);
    for (int64_t i = 0; i < n; i++) {
        ZOFF_TRY(zoff_loader_next(val, hx, hy));
        ZOFF_TRY(zoff_memcpy_async(st, dx, hx, (size_t)(B * T) * sizeof(int32_t), ZOFF_COPY_H2D));
        ZOFF_TRY(zoff_memcpy_async(st, dy, hy, (size_t)(B * T) * sizeof(int32_t), ZOFF_COPY_H2D));
        ZOFF_TRY(zoff_gpt2_forward(model, dx, dy, B, T));
        float l;
        ZOFF_TRY(zoff_gpt2_mean_loss(model, &l));
        sum += l;
    }
    *out = n > 0 ? sum / (double)n : NAN;
    return ZOFF_OK;
}

/* One metrics line, written straight to the file (no stdio buffer): a crash (kill -9) loses
 * at most the line being written, never the lines of steps a checkpoint already holds, and a
 * write error (a full disk) stops the run with the file named instead of being dropped. */
static zoff_status metrics_line(FILE *f, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static zoff_status metrics_line(FILE *f, const char *path, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof line) return zoff_error(ZOFF_ERR_INTERNAL, "metrics line for %s too long", path);
    /* JSON has no inf/nan (printf's text for an fp16 overflow step's grad_norm): write null */
    for (char *v = line; (v = strchr(v, ':')) != NULL; v++) {
        char *t = v + 1 + (v[1] == '-');
        if ((!strncmp(t, "inf", 3) || !strncmp(t, "nan", 3)) && (t[3] == ',' || t[3] == '}') &&
            (size_t)n + 1 < sizeof line) {
            memmove(v + 5, t + 3, strlen(t + 3) + 1); /* the rest first: "null" may be longer */
            memcpy(v + 1, "null", 4);
            n = (int)strlen(line);
        }
    }
    for (size_t done = 0; done < (size_t)n;) {
        ssize_t w = zoff_io_write(fileno(f), line + done, (size_t)n - done, path);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return zoff_error(ZOFF_ERR_IO, "cannot write %s: %s%s", path, strerror(e),
                              e == ENOSPC || e == EDQUOT
                                  ? " (the disk is full: free space, or keep fewer checkpoints with --keep-last)"
                                  : "");
        }
        done += (size_t)w;
    }
    return ZOFF_OK;
}

/* Before appending on resume: cut a last line that a crash or a full disk left unfinished,
 * so that every line of metrics.jsonl stays whole JSON. */
static zoff_status metrics_drop_torn_tail(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? ZOFF_OK : zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    zoff_status s = ZOFF_OK;
    if (fstat(fd, &st) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    off_t end = s == ZOFF_OK ? st.st_size : 0, keep = -1;
    char buf[4096];
    for (off_t pos = end; s == ZOFF_OK && pos > 0 && keep < 0;) { /* back to the last newline */
        size_t n = pos < (off_t)sizeof buf ? (size_t)pos : sizeof buf;
        pos -= (off_t)n;
        if (pread(fd, buf, n, pos) != (ssize_t)n) s = zoff_error(ZOFF_ERR_IO, "cannot read %s: %s", path, strerror(errno));
        for (size_t i = n; s == ZOFF_OK && keep < 0 && i-- > 0;)
            if (buf[i] == '\n') keep = pos + (off_t)i + 1;
    }
    if (keep < 0) keep = 0;
    if (s == ZOFF_OK && keep != end) {
        if (ftruncate(fd, keep) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot truncate %s: %s", path, strerror(errno));
        else zoff_log(ZOFF_LOG_WARN, "%s: removed an unfinished last line (%lld bytes) left by an interrupted run",
                      path, (long long)(end - keep));
    }
    close(fd);
    return s;
}

/* Host memory this job needs at least, checked before anything large is allocated: the
 * initial fp32 weights and the checkpoint staging buffer (4 bytes per parameter each), the
 * optimizer state the engine keeps on the host (offload_optimizer.device cpu: fp32 master and
 * the optimizer's moments, plus 16-bit gradients and weight staging), and on the CPU backend
 * the "device" memory too (weights, gradients, a lower bound for activations, optimizer state
 * not offloaded). A lower bound: the engine checks its own allocations exactly. */
static zoff_status check_host_memory(const train_args *a, const zoff_config *cfg, const zoff_gpt2_shape *sh,
                                     int64_t B, int64_t T, zoff_dtype dtype) {
    /* a shape the model will refuse: leave the message to zoff_gpt2_create */
    if (sh->num_layers < 1 || sh->num_layers > (1 << 20) || sh->hidden_size < 1 || sh->hidden_size > (1 << 20) ||
        sh->vocab_size < 1 || sh->vocab_size > INT32_MAX || sh->max_seq_len < 1 || sh->max_seq_len > (1 << 24) ||
        sh->padded_vocab_size < 0 || sh->padded_vocab_size > INT32_MAX || B < 1 || T < 1 || B > (1 << 24) ||
        T > (1 << 24))
        return ZOFF_OK;
    const double L = (double)sh->num_layers, C = (double)sh->hidden_size;
    const double Vp = (double)(sh->padded_vocab_size ? sh->padded_vocab_size : (sh->vocab_size + 127) / 128 * 128);
    const double N = Vp * C + (double)sh->max_seq_len * C + L * (12 * C * C + 13 * C) + 2 * C;
    const double d = dtype == ZOFF_F32 ? 4 : 2;
    const zoff_optimizer_type ot = cfg->optimizer.type;
    const double moments = ot == ZOFF_OPTIM_ADAM || ot == ZOFF_OPTIM_ADAMW ? 2 : 1;
    const zoff_offload_optimizer_config *oo = &cfg->zero.offload_optimizer;
    /* ratio "auto" is decided by the engine: count it as all on the device (a lower bound either way) */
    double host_part = oo->device != ZOFF_OFFLOAD_CPU ? 0 : oo->ratio_auto ? 0 : oo->ratio > 0 && oo->ratio < 1 ? oo->ratio : 1;
    double cli = 8 * N, pinned = host_part * 2 * d * N, host_state = host_part * 4 * (1 + moments) * N;
    double dev_on_host = 0;
    bool cuda = (a->device && !strcmp(a->device, "cuda")) || (!a->device && zoff_backend_available(ZOFF_BACKEND_CUDA));
    if (!cuda) /* the CPU backend's device memory is host memory */
        dev_on_host = 2 * d * N + (1 - host_part) * 4 * (1 + moments) * N + d * (double)B * (double)T * C * (L + 1) * 4;
    double pageable = cli + host_state + dev_on_host;
    char what[256];
    snprintf(what, sizeof what,
             "this training job (GPT-2 %lld layers, width %lld: %.2fM parameters%s; at least this much)",
             (long long)sh->num_layers, (long long)sh->hidden_size, N / 1e6,
             cuda ? "" : ", CPU backend: device memory is host memory");
    zoff_host_request rq = {.what = what,
                            .pageable = pageable >= 0x1p63 ? SIZE_MAX / 2 : (size_t)pageable,
                            .pinned = pinned >= 0x1p62 ? SIZE_MAX / 4 : (size_t)pinned,
                            .hint = "use a smaller model (--num-layers, --hidden-size) or --micro-batch-size, or "
                                    "keep the optimizer state on NVMe (offload_optimizer.device nvme)"};
    return zoff_host_memory_check(&rq);
}

static void fmt_hms(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 359999) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, n, "%02d:%02d", t / 60, t % 60);
}

typedef struct train_ctx {
    train_args a;
    zoff_config cfg;
    char *config_text;
    zoff_tokenizer *tok;
    zoff_dataset *train_ds, *val_ds;
    zoff_loader *train_ld, *val_ld;
    zoff_device *dev;
    zoff_gpt2 *model;
    zoff_engine *eng;
    float *init;
    zoff_st_file *init_st; /* --init-from */
    int32_t *hx, *hy, *dx, *dy;
    FILE *metrics;
    /* data parallel: mpirun -np N zoff train */
    zoff_comm *comm;
    int rank, world;
    FILE *timeline; /* DIR/grad_timeline_rank_%05d.jsonl with several ranks */
} train_ctx;

static void ctx_free(train_ctx *c) {
    if (c->metrics) fclose(c->metrics);
    zoff_engine_destroy(c->eng);
    if (c->dev) {
        zoff_device_free(c->dev, c->dx);
        zoff_device_free(c->dev, c->dy);
    }
    zoff_gpt2_destroy(c->model);
    zoff_device_destroy(c->dev);
    free(c->hx);
    free(c->hy);
    zoff_aligned_free(c->init);
    zoff_st_close(c->init_st);
    zoff_loader_free(c->train_ld);
    zoff_loader_free(c->val_ld);
    zoff_dataset_free(c->train_ds);
    zoff_dataset_free(c->val_ds);
    zoff_tokenizer_free(c->tok);
    free(c->config_text);
    zoff_config_free(&c->cfg);
    if (c->timeline) fclose(c->timeline);
}

/* ------------------------------------------------------------------ data parallel */

/* Mean over ranks (loss, validation loss); the identity with one rank. */
static zoff_status dp_mean(train_ctx *c, double *v) {
    if (c->world == 1) return ZOFF_OK;
    ZOFF_TRY(zoff_comm_allreduce_f64(c->comm, v, 1, ZOFF_REDUCE_SUM));
    *v /= c->world;
    return ZOFF_OK;
}

/* All ranks stop at the same step: a signal seen by any rank stops every rank. */
static zoff_status dp_agree_stop(train_ctx *c) {
    if (c->world == 1) return ZOFF_OK;
    double sig = (double)g_stop;
    ZOFF_TRY(zoff_comm_allreduce_f64(c->comm, &sig, 1, ZOFF_REDUCE_MAX));
    g_stop = (sig_atomic_t)sig;
    return ZOFF_OK;
}

/* One line per step of this rank's gradient-stream timeline (see zoff_grad_event). */
static void dp_write_timeline(train_ctx *c, int64_t step, const zoff_step_info *si, double t_bwd) {
    if (!c->timeline) return;
    const zoff_grad_event *ev;
    int n = zoff_engine_grad_timeline(c->eng, &ev);
    fprintf(c->timeline, "{\"step\":%lld,\"rank\":%d,\"backward\":%.6f,\"wait_grads\":%.6f,\"ranges\":[", (long long)step,
            c->rank, t_bwd, si->t_wait_grads);
    for (int i = 0; i < n; i++)
        fprintf(c->timeline, "%s[%lld,%lld,%.6f,%.6f,%.6f,%.6f,%lld]", i ? "," : "", (long long)ev[i].offset,
                (long long)ev[i].count, ev[i].t_ready, ev[i].t_reduce_start, ev[i].t_reduce_end, ev[i].t_copy_end,
                (long long)ev[i].copy_bytes);
    fprintf(c->timeline, "]}\n");
}

static int run(train_ctx *c) {
    train_args *a = &c->a;
    zoff_status s;
    /* 1. configuration: everything is validated before anything is written */
    if (a->config_path) s = zoff_config_load_file(a->config_path, &c->cfg);
    else s = zoff_config_load_string(DEFAULT_CONFIG, "the default config", &c->cfg);
    if (s != ZOFF_OK) return fail("config", s);
    if (a->micro_batch) {
        c->cfg.train_micro_batch_size_per_gpu = a->micro_batch;
        if (c->cfg.train_batch_size && c->cfg.gradient_accumulation_steps) c->cfg.gradient_accumulation_steps = 0;
    }
    if ((s = zoff_config_resolve_batch(&c->cfg, c->world)) != ZOFF_OK) return fail("config", s);
    if (c->rank > 0) a->quiet = true; /* progress from rank 0 only; errors from every rank */
    if (c->world > 1) { /* what the engine's check cannot see must agree too */
        uint64_t h = ZOFF_FNV_INIT;
        const char *str[] = {a->data_path, a->val_path, a->tokenizer, a->save_dir, a->load_dir, a->init_from};
        for (size_t i = 0; i < sizeof str / sizeof str[0]; i++)
            h = str[i] ? zoff_fnv1a(h, str[i], strlen(str[i]) + 1) : zoff_fnv1a(h, "", 1);
        int64_t nums[] = {(int64_t)a->seed, a->train_iters, a->eval_iters, a->save_interval, a->keep_last};
        h = zoff_fnv1a(h, nums, sizeof nums);
        if ((s = zoff_comm_check_same(c->comm, h, "the command line (data, seed, iterations, save, load)")) != ZOFF_OK)
            return fail("data parallel", s);
    }
    if ((s = zoff_config_check_supported(&c->cfg)) != ZOFF_OK) return fail("config", s);
    zoff_dtype dtype = c->cfg.bf16_enabled ? ZOFF_BF16 : c->cfg.fp16.enabled ? ZOFF_F16 : ZOFF_F32;

    const char *tokname = a->tokenizer;
    cli_meta resume;
    memset(&resume, 0, sizeof resume);
    zoff_ckpt_reader *rd = NULL;
    if (a->load_dir) {
        if ((s = zoff_ckpt_open(a->load_dir, 0, &rd)) != ZOFF_OK) return fail("--load", s);
        if ((s = cli_read_meta(rd, &resume, NULL)) != ZOFF_OK) {
            zoff_ckpt_close(rd);
            return fail("--load", s);
        }
        tokname = resume.tokenizer;
    }
    if ((s = zoff_tokenizer_open(tokname, &c->tok)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("tokenizer", s);
    }
    zoff_gpt2_shape shape;
    int64_t T;
    int rc = resolve_shape(a, &c->cfg, zoff_tokenizer_vocab_size(c->tok), &shape, &T);
    if (rc) {
        zoff_ckpt_close(rd);
        return rc;
    }
    if (rd) { /* the checkpoint's shape wins; flags that contradict it are an error */
        const zoff_gpt2_shape *r = &resume.shape;
        if ((a->num_layers && a->num_layers != r->num_layers) || (a->hidden_size && a->hidden_size != r->hidden_size) ||
            (a->num_heads && a->num_heads != r->num_heads)) {
            fprintf(stderr,
                    "zoff train: --load %s holds a model with %lld layers, width %lld, %lld heads, which the flags "
                    "contradict\n",
                    a->load_dir, (long long)r->num_layers, (long long)r->hidden_size, (long long)r->num_heads);
            zoff_ckpt_close(rd);
            return 2;
        }
        shape = *r;
        T = resume.seq_len;
    }
    if (a->init_from) { /* checked against the model shape before anything is written */
        if (rd) {
            fprintf(stderr, "zoff train: --init-from and --load exclude each other: --load resumes a run (weights, "
                            "optimizer state, data position), --init-from starts a new run from weights\n");
            zoff_ckpt_close(rd);
            return 2;
        }
        if ((s = zoff_st_open(a->init_from, &c->init_st)) != ZOFF_OK ||
            (s = zoff_gpt2_st_check(c->init_st, &shape)) != ZOFF_OK)
            return fail("--init-from", s);
    }
    int64_t B = c->cfg.train_micro_batch_size_per_gpu, accum = c->cfg.gradient_accumulation_steps;
    if ((s = check_host_memory(a, &c->cfg, &shape, B, T, dtype)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("host memory", s);
    }

    /* 2. data (validated before any output is written) */
    char train_path[4096], val_path[4096];
    if (!a->data_path) {
        /* several ranks: local rank 0 builds the corpus, the others wait and find it */
        bool first = c->world == 1 || zoff_comm_local_rank(c->comm) == 0;
        if (!first && (s = zoff_comm_barrier(c->comm)) != ZOFF_OK) return fail("default corpus", s);
        s = cli_prepare_default_data("out/data", c->tok, train_path, sizeof train_path, val_path, sizeof val_path);
        if (s == ZOFF_OK && first && c->world > 1) s = zoff_comm_barrier(c->comm);
        if (s != ZOFF_OK) {
            zoff_ckpt_close(rd);
            return fail("default corpus", s);
        }
    } else {
        snprintf(train_path, sizeof train_path, "%s", a->data_path);
        snprintf(val_path, sizeof val_path, "%s", a->val_path ? a->val_path : "");
    }
    int32_t vocab = (int32_t)shape.vocab_size;
    if ((s = zoff_dataset_open(train_path, vocab, &c->train_ds)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("--data-path", s);
    }
    zoff_loader_options lo = zoff_loader_defaults(B, T);
    lo.seed = a->seed;
    lo.rank = c->rank; /* rank r takes rows [r*B, (r+1)*B) of each global batch of world*B */
    lo.world_size = c->world;
    bool split_val = !val_path[0];
    int64_t total = zoff_dataset_num_tokens(c->train_ds);
    if (split_val) {
        lo.split = ZOFF_SPLIT_TRAIN;
        lo.val_tokens = total / 20;
    } else if ((s = zoff_dataset_open(val_path, vocab, &c->val_ds)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("--val-path", s);
    }
    if ((s = zoff_loader_create(c->train_ds, &lo, &c->train_ld)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("training data", s);
    }
    if (a->eval_iters > 0) {
        zoff_loader_options vo = zoff_loader_defaults(B, T);
        vo.shuffle = false;
        vo.rank = c->rank;
        vo.world_size = c->world;
        if (split_val) {
            vo.split = ZOFF_SPLIT_VAL;
            vo.val_tokens = lo.val_tokens;
        }
        s = zoff_loader_create(split_val ? c->train_ds : c->val_ds, &vo, &c->val_ld);
        if (s != ZOFF_OK) {
            zoff_ckpt_close(rd);
            return fail("validation data", s);
        }
        int64_t nb = zoff_loader_batches_per_epoch(c->val_ld);
        if (a->eval_iters > nb) a->eval_iters = nb;
    }

    /* 3. output directory, device, model, engine */
    if ((s = check_output_dir(a->save_dir)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("--save", s);
    }
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .memory_budget = a->device_memory};
    if (c->world > 1) { /* GPU by local rank; on the CPU backend the host's cores are shared out */
        int local = zoff_comm_local_rank(c->comm), nlocal = zoff_comm_local_size(c->comm);
        dopt.ordinal = local;
        if (!getenv("ZOFF_THREADS")) {
            int per = zoff_cpu_features_get()->logical_cores / (nlocal > 0 ? nlocal : 1);
            char buf[16];
            snprintf(buf, sizeof buf, "%d", per > 0 ? per : 1);
            setenv("ZOFF_THREADS", buf, 1); /* the host optimizer's threads */
            dopt.threads = per > 0 ? per : 1;
        }
    }
    if ((a->device && !strcmp(a->device, "cuda")) || (!a->device && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        dopt.kind = ZOFF_BACKEND_CUDA;
    if ((s = zoff_device_create(&dopt, &c->dev)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("device", s);
    }
    zoff_gpt2_options mo = {.shape = shape, .batch_size = B, .seq_len = T, .dtype = dtype,
                            .checkpoint_activations = a->checkpoint_activations,
                            .external_params = c->cfg.zero.stage == 3}; /* stage 3: weights from the engine */
    if ((s = zoff_gpt2_create(c->dev, &mo, &c->model)) != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail("model", s);
    }
    shape = *zoff_gpt2_get_shape(c->model);
    int64_t nparams = zoff_gpt2_num_params(c->model);
    c->init = zoff_aligned_alloc(64, (size_t)nparams * sizeof(float), "initial weights");
    if (!c->init) {
        zoff_ckpt_close(rd);
        return fail("model", ZOFF_ERR_NOMEM);
    }
    int nt = 0;
    const zoff_tensor_info *tensors = zoff_gpt2_tensors(c->model, &nt);
    if (rd) s = cli_read_weights(rd, c->model, c->init);
    else if (c->init_st) s = zoff_gpt2_st_load(c->init_st, &shape, tensors, nt, c->init);
    else zoff_gpt2_init_params(c->model, a->seed, c->init);
    if (s != ZOFF_OK) {
        zoff_ckpt_close(rd);
        return fail(rd ? "--load" : "--init-from", s);
    }
    if (c->init_st) {
        zoff_log(ZOFF_LOG_INFO, "initialised the weights from %s (%s layout)", a->init_from,
                 zoff_gpt2_st_layout(c->init_st) == ZOFF_GPT2_LAYOUT_ZOFF ? "zoff" : "Hugging Face");
        zoff_st_close(c->init_st);
        c->init_st = NULL;
    }
    zoff_engine_options eo = {.dev = c->dev, .cfg = &c->cfg, .tensors = tensors, .num_tensors = nt,
                              .num_params = nparams, .params = zoff_gpt2_params(c->model),
                              .grads = zoff_gpt2_grads(c->model), .dtype = dtype, .init_params = c->init,
                              .comm = c->world > 1 ? c->comm : NULL, .timeline = c->world > 1,
                              .weight_waits = c->cfg.zero.stage < 3};
    if ((s = zoff_engine_create(&eo, &c->eng)) != ZOFF_OK ||
        (c->cfg.zero.stage < 3 && (s = zoff_gpt2_set_weight_wait(c->model, zoff_engine_wait_weights, c->eng)) != ZOFF_OK)) {
        zoff_ckpt_close(rd);
        return fail("engine", s);
    }
    zoff_aligned_free(c->init); /* the engine holds the master weights now: 4 B/param less on the host */
    c->init = NULL;
    if (c->cfg.zero.stage == 3) { /* the model asks the engine for each group's weights */
        zoff_param_hooks hk = {.arg = c->eng, .begin_pass = zoff_engine_begin_pass, .acquire = zoff_engine_acquire,
                               .release = zoff_engine_release};
        if ((s = zoff_gpt2_set_param_hooks(c->model, &hk)) != ZOFF_OK) {
            zoff_ckpt_close(rd);
            return fail("engine", s);
        }
    }
    int64_t start_step = 0;
    double consumed = 0;
    if (rd) {
        s = cli_read_engine_state(rd, c->eng, nparams);
        if (s == ZOFF_OK) s = zoff_engine_set_scalars(c->eng, &resume.engine);
        if (s == ZOFF_OK) s = zoff_loader_set_state(c->train_ld, &resume.loader);
        zoff_ckpt_close(rd);
        rd = NULL;
        if (s != ZOFF_OK) return fail("--load", s);
        start_step = resume.step;
        consumed = resume.consumed_tokens;
        zoff_log(ZOFF_LOG_INFO, "resumed from %s at step %lld", a->load_dir, (long long)start_step);
    }
    size_t tok_bytes = (size_t)(B * T) * sizeof(int32_t);
    c->hx = malloc(tok_bytes);
    c->hy = malloc(tok_bytes);
    if (!c->hx || !c->hy) return fail("buffers", zoff_error(ZOFF_ERR_NOMEM, "out of host memory"));
    if ((s = zoff_device_alloc(c->dev, tok_bytes, "input tokens", (void **)&c->dx)) != ZOFF_OK ||
        (s = zoff_device_alloc(c->dev, tok_bytes, "target tokens", (void **)&c->dy)) != ZOFF_OK)
        return fail("device", s);
    zoff_stream *st = zoff_device_stream(c->dev);

    zoff_memory_stats ms;
    zoff_device_memory_stats(c->dev, &ms);
    zoff_engine_memory em;
    zoff_engine_memory_usage(c->eng, &em);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    if (!a->quiet) {
        fprintf(stderr,
                "zoff: %s\n"
                "zoff: memory: device %s (model %s: weights, gradients, activations; optimizer %s), pinned host %s, "
                "pageable host %s, disk %s\n",
                zoff_engine_describe(c->eng), zoff_format_bytes(ms.device_in_use, b1, sizeof b1),
                zoff_format_bytes(zoff_gpt2_device_bytes(c->model), b2, sizeof b2),
                zoff_format_bytes(em.device, b3, sizeof b3), zoff_format_bytes(ms.pinned_in_use, b4, sizeof b4),
                zoff_format_bytes(em.pageable, b5, sizeof b5), zoff_format_bytes(em.nvme, b6, sizeof b6));
        fprintf(stderr,
                "zoff: GPT-2 %lld layers, width %lld, %lld heads, seq %lld, vocab %lld: %.2fM parameters on %s\n"
                "zoff: batch %lld x %lld accumulation = %lld sequences (%lld tokens) per step, %lld steps, %s; "
                "device memory %s in use (budget %s)\n",
                (long long)shape.num_layers, (long long)shape.hidden_size, (long long)shape.num_heads, (long long)T,
                (long long)shape.vocab_size, (double)nparams / 1e6, zoff_device_name(c->dev), (long long)B,
                (long long)accum, (long long)(B * accum), (long long)(B * accum * T), (long long)a->train_iters,
                zoff_dtype_name(dtype), zoff_format_bytes(ms.device_in_use, b1, sizeof b1),
                ms.device_budget ? zoff_format_bytes(ms.device_budget, b2, sizeof b2) : "unlimited");
    }

    char mpath[4200];
    if (c->rank == 0) snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", a->save_dir);
    else snprintf(mpath, sizeof mpath, "%s/metrics_rank_%05d.jsonl", a->save_dir, c->rank); /* own breakdown */
    if (c->world > 1) {
        char tpath[4200];
        snprintf(tpath, sizeof tpath, "%s/grad_timeline_rank_%05d.jsonl", a->save_dir, c->rank);
        if (!(c->timeline = fopen(tpath, start_step > 0 ? "a" : "w")))
            return fail("--save", zoff_error(ZOFF_ERR_IO, "cannot write %s: %s", tpath, strerror(errno)));
    }
    if (start_step > 0 && (s = metrics_drop_torn_tail(mpath)) != ZOFF_OK) return fail("--save", s);
    c->metrics = fopen(mpath, start_step > 0 ? "a" : "w");
    if (!c->metrics) return fail("--save", zoff_error(ZOFF_ERR_IO, "cannot write %s: %s", mpath, strerror(errno)));

    double val_before = NAN, val_after = NAN;
    if (c->val_ld && a->eval_iters > 0) {
        s = evaluate(c->model, c->val_ld, a->eval_iters, B, T, c->hx, c->hy, c->dx, c->dy, st, &val_before);
        if (s == ZOFF_OK) s = dp_mean(c, &val_before);
        if (s != ZOFF_OK) return fail("evaluation", s);
        if (!a->quiet) fprintf(stderr, "zoff: validation loss before training: %.4f\n", val_before);
        s = metrics_line(c->metrics, mpath, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)start_step, val_before);
        if (s != ZOFF_OK) return fail("metrics", s);
    }

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    bool tty = isatty(STDERR_FILENO) && !a->quiet;
    int64_t print_every = c->cfg.steps_per_print > 0 ? c->cfg.steps_per_print : 10;
    double t_start = zoff_now();
    float last_loss = NAN;
    int64_t step = start_step;
    const zoff_optimizer_config *oc = &c->cfg.optimizer;
    if ((s = dp_agree_stop(c)) != ZOFF_OK) return fail("step", s);
    while (step < a->train_iters && !g_stop) {
        double t0 = zoff_now(), t_fwd = 0, t_bwd = 0;
        if ((s = zoff_engine_zero_grad(c->eng)) != ZOFF_OK) return fail("step", s);
        double loss_sum = 0;
        for (int64_t mb = 0; mb < accum; mb++) {
            double ta = zoff_now();
            if ((s = zoff_loader_next(c->train_ld, c->hx, c->hy)) != ZOFF_OK) return fail("data", s);
            s = zoff_memcpy_async(st, c->dx, c->hx, tok_bytes, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_memcpy_async(st, c->dy, c->hy, tok_bytes, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward(c->model, c->dx, c->dy, B, T);
            float l = 0;
            if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(c->model, &l);
            double tb = zoff_now();
            if (mb == accum - 1) /* super_offload speculates this step's update during this backward */
                zoff_engine_set_lr(c->eng, zoff_lr_at(&c->cfg.scheduler, oc->lr, zoff_engine_steps_taken(c->eng)));
            zoff_engine_begin_backward(c->eng, mb == accum - 1);
            if (s == ZOFF_OK)
                s = zoff_gpt2_backward(c->model, zoff_engine_backward_scale(c->eng), zoff_engine_grad_ready, c->eng);
            if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
            if (s != ZOFF_OK) return fail("forward/backward", s);
            t_fwd += tb - ta;
            t_bwd += zoff_now() - tb;
            loss_sum += l;
        }
        double lr = zoff_lr_at(&c->cfg.scheduler, oc->lr, zoff_engine_steps_taken(c->eng));
        zoff_step_info si;
        if ((s = zoff_engine_step(c->eng, lr, &si)) != ZOFF_OK) return fail("optimizer step", s);
        if ((s = dp_mean(c, &loss_sum)) != ZOFF_OK || (s = dp_agree_stop(c)) != ZOFF_OK) return fail("step", s);
        step++;
        dp_write_timeline(c, step, &si, t_bwd);
        consumed += (double)(B * T * accum * c->world);
        double dt = zoff_now() - t0, elapsed = zoff_now() - t_start;
        last_loss = (float)(loss_sum / (double)accum);
        double tps = (double)(B * T * accum * c->world) / dt; /* all ranks */
        s = metrics_line(c->metrics, mpath,
                "{\"step\":%lld,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens_per_s\":%.1f,\"step_time\":%.6f,"
                "\"forward\":%.6f,\"backward\":%.6f,\"wait_grads\":%.6f,\"host_step\":%.6f,\"device_step\":%.6f,"
                "\"wait_weights\":%.6f,\"other\":%.6f,\"loss_scale\":%g,\"skipped\":%s,\"rollbacks\":%lld}\n",
                (long long)step, last_loss, lr, si.grad_norm, tps, dt, t_fwd, t_bwd, si.t_wait_grads, si.t_host,
                si.t_device, si.t_wait_weights,
                fmax(0.0, dt - t_fwd - t_bwd - si.t_wait_grads - si.t_host - si.t_device - si.t_wait_weights),
                si.loss_scale, si.skipped ? "true" : "false", (long long)si.rollbacks);
        if (s != ZOFF_OK) return fail("metrics", s);
        if (!isfinite(last_loss)) {
            fprintf(stderr, "zoff train: loss is %f at step %lld; stopping (lower the learning rate?)\n", last_loss,
                    (long long)step);
            return 1;
        }
        double left = (double)(a->train_iters - step) * (elapsed / (double)(step - start_step));
        char e1[16], e2[16];
        fmt_hms(elapsed, e1, sizeof e1);
        fmt_hms(left, e2, sizeof e2);
        if (tty) {
            fprintf(stderr, "\rstep %6lld/%lld | loss %7.4f | lr %.2e | %8.0f tok/s | %s elapsed | %s left   ",
                    (long long)step, (long long)a->train_iters, last_loss, lr, tps, e1, e2);
            if (step == a->train_iters) fputc('\n', stderr);
        } else if (!a->quiet && (step % print_every == 0 || step == a->train_iters || step == start_step + 1)) {
            fprintf(stderr, "step %lld/%lld loss %.4f lr %.3e grad_norm %.3f tok/s %.0f elapsed %s left %s\n",
                    (long long)step, (long long)a->train_iters, last_loss, lr, si.grad_norm, tps, e1, e2);
        }
        if (c->cfg.wall_clock_breakdown && !a->quiet && step % print_every == 0)
            fprintf(stderr,
                    "%stime (s): forward %.4f backward %.4f wait-grads %.4f host-step %.4f device-step %.4f "
                    "wait-weights %.4f step %.4f\n",
                    tty ? "\n" : "", t_fwd, t_bwd, si.t_wait_grads, si.t_host, si.t_device, si.t_wait_weights, dt);
        if (a->save_interval && step % a->save_interval == 0 && step < a->train_iters) {
            if ((s = zoff_engine_flush(c->eng)) != ZOFF_OK) return fail("optimizer step", s);
            cli_meta m = {.step = step, .shape = shape, .seq_len = T, .seed = a->seed, .consumed_tokens = consumed};
            snprintf(m.tokenizer, sizeof m.tokenizer, "%s", zoff_tokenizer_name(c->tok));
            m.loader = zoff_loader_get_state(c->train_ld);
            zoff_engine_get_scalars(c->eng, &m.engine);
            if ((s = cli_save_checkpoint_dp(a->save_dir, c->eng, c->model, &m, c->cfg.source, c->comm)) != ZOFF_OK)
                return fail("checkpoint", s);
            if (a->keep_last && c->rank == 0 && (s = zoff_ckpt_prune(a->save_dir, (int)a->keep_last)) != ZOFF_OK)
                return fail("checkpoint", s);
        }
    }
    if (tty && step < a->train_iters) fputc('\n', stderr);
    fflush(c->metrics);
    double train_time = zoff_now() - t_start;
    if (g_stop && !a->quiet) fprintf(stderr, "zoff: signal %d: saving a checkpoint at step %lld\n", (int)g_stop, (long long)step);

    /* final checkpoint (also on SIGINT/SIGTERM) */
    if ((s = zoff_engine_flush(c->eng)) != ZOFF_OK) return fail("optimizer step", s);
    cli_meta m = {.step = step, .shape = shape, .seq_len = T, .seed = a->seed, .consumed_tokens = consumed};
    snprintf(m.tokenizer, sizeof m.tokenizer, "%s", zoff_tokenizer_name(c->tok));
    m.loader = zoff_loader_get_state(c->train_ld);
    zoff_engine_get_scalars(c->eng, &m.engine);
    int64_t latest = -1;
    zoff_ckpt_latest(a->save_dir, &latest);
    if (c->world > 1 && (s = zoff_comm_broadcast_bytes(c->comm, &latest, sizeof latest, 0)) != ZOFF_OK)
        return fail("checkpoint", s); /* rank 0's view decides, for all */
    if (latest != step) {
        if ((s = cli_save_checkpoint_dp(a->save_dir, c->eng, c->model, &m, c->cfg.source, c->comm)) != ZOFF_OK)
            return fail("checkpoint", s);
        if (a->keep_last && c->rank == 0 && (s = zoff_ckpt_prune(a->save_dir, (int)a->keep_last)) != ZOFF_OK)
            return fail("checkpoint", s);
    }
    if (g_stop) return 128 + (int)g_stop;

    if (c->val_ld && a->eval_iters > 0) {
        s = evaluate(c->model, c->val_ld, a->eval_iters, B, T, c->hx, c->hy, c->dx, c->dy, st, &val_after);
        if (s == ZOFF_OK) s = dp_mean(c, &val_after);
        if (s != ZOFF_OK) return fail("evaluation", s);
        s = metrics_line(c->metrics, mpath, "{\"step\":%lld,\"val_loss\":%.6f}\n", (long long)step, val_after);
        if (s != ZOFF_OK) return fail("metrics", s);
    }
    if (!a->quiet) {
        char ck[4200];
        zoff_ckpt_step_path(a->save_dir, step, ck, sizeof ck);
        fprintf(stderr,
                "zoff: trained %lld steps in %.1f s (%.0f tokens/s); train loss %.4f; validation loss %.4f -> %.4f\n"
                "zoff: checkpoint %s, metrics %s\n"
                "zoff: try: zoff sample --load %s\n",
                (long long)(step - start_step), train_time,
                (double)(step - start_step) * (double)(B * T * accum * c->world) / train_time, last_loss, val_before, val_after,
                ck, mpath, a->save_dir);
    }
    return 0;
}

/* After a failure with several ranks the others may wait in a collective: end
 * the job (the failing rank printed why). */
static void dp_abort(train_ctx *c, int rc) {
    if (c->world <= 1) return;
    fflush(stderr);
#ifdef ZOFF_HAVE_MPI
    MPI_Abort(MPI_COMM_WORLD, rc);
#endif
}

int zoff_cmd_train(int argc, char **argv) {
    train_ctx c;
    memset(&c, 0, sizeof c);
    int rc = parse_args(argc, argv, &c.a);
    if (rc) return rc < 0 ? 0 : rc;
    /* one rank, or rank r of N under mpirun (docs/multinode.md) */
    zoff_comm_options co = {.timeout_s = c.a.comm_timeout};
    zoff_status s = zoff_comm_init(NULL, NULL, &co, &c.comm);
    if (s != ZOFF_OK) return fail("data parallel", s);
    c.rank = zoff_comm_rank(c.comm);
    c.world = zoff_comm_size(c.comm);
    if (c.world > 1) snprintf(g_who, sizeof g_who, "zoff train [rank %d/%d]", c.rank, c.world);
    rc = run(&c);
    if (rc == 1 || rc == 2) dp_abort(&c, rc);
    ctx_free(&c);
    zoff_comm_destroy(c.comm); /* last: finalises MPI */
    return rc;
}
