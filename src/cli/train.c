/* zoff train: the training loop. */
#define _GNU_SOURCE
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/resources.h"
#include "zoff/train.h"
#ifdef ZOFF_HAVE_MPI
#include <mpi.h>
#endif

/* The default job's DeepSpeed config: a small GPT-2 trained with AdamW and a warmup + cosine
 * schedule over --train-iters (warmup: its first tenth; DeepSpeed makes it at least 2 steps, from lr
 * 0). `zoff train --config FILE` replaces it;
 * a resume without --config takes the checkpoint's. */
static const char *DEFAULT_CONFIG_FMT =
    "{\n"
    "  \"train_micro_batch_size_per_gpu\": 8,\n"
    "  \"gradient_accumulation_steps\": 1,\n"
    "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 2e-3, \"betas\": [0.9, 0.95], \"eps\": 1e-8, "
    "\"weight_decay\": 0.1}},\n"
    "  \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"total_num_steps\": %lld, \"warmup_num_steps\": "
    "%lld, \"cos_min_ratio\": 0.1}},\n"
    "  \"gradient_clipping\": 1.0,\n"
    "  \"steps_per_print\": 10,\n"
    "  \"zero_optimization\": {\"stage\": 0}\n"
    "}\n"; /* no model section: the sizes are the flags', else --init-from's file's, else the defaults */

static void default_config(int64_t train_iters, char *buf, size_t cap) {
    long long total = train_iters > 0 ? (long long)train_iters : 1, warmup = total / 10 > 0 ? total / 10 : 1;
    snprintf(buf, cap, DEFAULT_CONFIG_FMT, total, warmup);
}

typedef struct train_args {
    zoff_trainer_options o;
    double comm_timeout; /* --comm-timeout (0: ZOFF_COMM_TIMEOUT or the default) */
} train_args;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: zoff train [options]\n"
            "\n"
            "With no options: trains a small GPT-2 (4 layers, width 128) on the bundled corpus\n"
            "(Debian's fortunes, GPT-2 BPE) on the CPU backend, writing out/gpt2-small/.\n"
            "\n"
            "  --config FILE               DeepSpeed JSON config (batch, optimizer, scheduler, zero_optimization, ...);\n"
            "                              without it: micro-batch 8, AdamW lr 2e-3, warmup + cosine over --train-iters\n"
            "                              (a resume: the checkpoint's config)\n"
            "  --num-layers N              transformer blocks             (config model.num_layers, default 4)\n"
            "  --hidden-size N             width                          (default 128)\n"
            "  --num-attention-heads N     heads                          (default 4)\n"
            "  --seq-length N              tokens per sequence            (default 64)\n"
            "  --max-position-embeddings N rows of the position table     (default: seq length)\n"
            "  --vocab-size N              vocabulary (default: the tokenizer's, 50257 for gpt2)\n"
            "  --micro-batch-size N        overrides train_micro_batch_size_per_gpu\n"
            "  --train-iters N             optimizer steps                (default 200)\n"
            "  --eval-iters N              validation batches before and after training, the same sequences\n"
            "                              whatever the number of ranks at one micro-batch size (default 20;\n"
            "                              0 = none)\n"
            "  --eval-interval N           also validate every N steps (val_loss lines in metrics.jsonl;\n"
            "                              default: only before and after training)\n"
            "  --data-path PATTERN         training shards: a .bin file, a directory (its .bin files), a\n"
            "                              quoted glob, or a comma-separated list of these, read in that\n"
            "                              order (see zoff tokenize)\n"
            "  --val-path PATTERN          validation shards, the same forms (default: the last 5%% of\n"
            "                              --data-path)\n"
            "  --tokenizer gpt2|byte       tokenizer of the default corpus (default gpt2)\n"
            "  --save DIR                  output folder: metrics.jsonl and checkpoints (default out/gpt2-small;\n"
            "                              with --load, the loaded run's folder)\n"
            "  --save-interval N           also save every N steps (default: only at the end)\n"
            "  --keep-last N               keep only the newest N checkpoints (default: all; a resume removes\n"
            "                              the older ones at start)\n"
            "  --no-checkpoint             write no checkpoint, not even at the end (metrics.jsonl still goes to\n"
            "                              --save): benchmarks and trial runs of models whose state fills the disk\n"
            "  --sync-save                 write the --save-interval checkpoints on the main thread (default: a\n"
            "                              background writer while training goes on, where the state allows;\n"
            "                              zoff plan's \"saves\" line says which)\n"
            "  --save-snapshot-memory SIZE|auto|off\n"
            "                              a background save's staging: an optimizer update copies the state the\n"
            "                              writer has not read yet here first and goes on (the file is the state\n"
            "                              at the save either way); when it is full updates wait for the writer.\n"
            "                              A Twin-Flow device share is copied into it whole at each save, beside\n"
            "                              the next forward and backward\n"
            "                              (less than that: synchronous saves). auto (default): the whole state,\n"
            "                              at most half the host memory available; off: the first update after a\n"
            "                              save waits for all of it (and a device share saves synchronously)\n"
            "  --load DIR                  resume from the newest complete checkpoint in DIR, or the step folder\n"
            "                              DIR/step_N (model shape, sequence length, optimizer and precision must\n"
            "                              be the checkpoint's; without --config its config; without --save the\n"
            "                              run goes on in its own folder)\n"
            "  --overwrite                 --save holds checkpoints of an earlier run: delete them and start over\n"
            "                              (without it such a --save is refused unless --load continues the run)\n"
            "  --init-from FILE|DIR        start from the GPT-2 weights of a safetensors file (zoff export, or\n"
            "                              Hugging Face's gpt2 model.safetensors), or of DIR/model.safetensors (a\n"
            "                              Hugging Face model folder); its model's sizes are the defaults\n"
            "                              of the flags above (the head count from its metadata or config.json);\n"
            "                              an lm_head.weight other than wte is refused (zoff ties the head)\n"
            "  --seed N                    initialisation and data order (default 1234)\n"
            "  --device cpu|cuda           backend (default: cuda when available, else cpu)\n"
            "  --device-memory SIZE        device memory budget, e.g. 256MiB (CPU backend: simulated)\n"
            "  --checkpoint-activations    recompute block activations in backward (less memory)\n"
            "  -q, --quiet                 no progress output\n"
            "  --comm-timeout SECONDS      data parallel (mpirun -np N zoff train): a collective that does not\n"
            "                              finish in time ends all ranks with an error (default: $ZOFF_COMM_TIMEOUT,\n"
            "                              else 300; see docs/multinode.md)\n");
}

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

/* Exit code for a failing status: bad input / config -> 2, runtime -> 1. The message says where
 * ("config: ...", "--load: ...") */
static char g_who[64] = "zoff train"; /* "zoff train [rank 1/2]" with several ranks */
static int fail(zoff_status s) {
    fprintf(stderr, "%s: %s\n", g_who, zoff_last_error());
    return cli_exit_code(s);
}

/* A run that failed on I/O (a full disk, a file size limit) after it began: fail, and where it
 * can go on from once that is fixed. */
static int fail_run(const zoff_trainer_options *o, zoff_status s) {
    int rc = fail(s);
    int64_t step = -1;
    if (s == ZOFF_ERR_IO && !o->no_checkpoint && zoff_ckpt_latest(o->save_dir, &step) == ZOFF_OK && step >= 0)
        fprintf(stderr, "%s: step %lld is saved under %s: once that is fixed, go on with --load %s\n", g_who,
                (long long)step, o->save_dir, o->save_dir);
    zoff_clear_error();
    return rc;
}

static int parse_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    zoff_trainer_options *o = &a->o;
    o->train_iters = 200;
    o->eval_iters = 20;
    o->save_dir = NULL; /* set after the flags: the default, or the loaded run's folder */
    o->tokenizer = "gpt2";
    o->default_data_dir = "out/data";
    int64_t seed = 1234;
    const cli_shape_fields shape = {&o->num_layers, &o->hidden_size, &o->num_heads,   &o->seq_length,
                                    &o->max_pos,    &o->vocab_size,  &o->micro_batch, &o->checkpoint_activations};
    const cli_string_flag strs[] = {{"--config", &o->config_path}, {"--save", &o->save_dir},
                                    {"--load", &o->load_dir},      {"--init-from", &o->init_from},
                                    {"--data-path", &o->data_path}, {"--val-path", &o->val_path}};
    const cli_int_flag ints[] = {{"--train-iters", 0, INT64_MAX / 2, &o->train_iters},
                                 {"--eval-iters", 0, 1 << 20, &o->eval_iters},
                                 {"--eval-interval", 1, INT64_MAX / 2, &o->eval_interval},
                                 {"--save-interval", 1, INT64_MAX / 2, &o->save_interval},
                                 {"--keep-last", 1, 1 << 20, &o->keep_last},
                                 {"--seed", 0, INT64_MAX, &seed}};
    const cli_bool_flag bools[] = {{"--overwrite", &o->overwrite, true},
                                   {"--sync-save", &o->sync_saves, true},
                                   {"--no-checkpoint", &o->no_checkpoint, true},
                                   {"--quiet", &o->quiet, true}};
    const cli_flag_tables tables = {&shape, strs, sizeof strs / sizeof *strs, ints, sizeof ints / sizeof *ints,
                                    bools,  sizeof bools / sizeof *bools,       train_usage};
    static const char *const tokenizers[] = {"gpt2", "byte", NULL}, *const devices[] = {"cpu", "cuda", NULL};
    for (int i = 1; i < argc; i++) {
        const char *v;
        char name[64];
        int took = cli_table_flags("train", &tables, name, sizeof name, argc, argv, &i);
        if (took == CLI_FLAG_TAKEN) continue;
        if (took != CLI_FLAG_NONE) return took == CLI_FLAG_HELP ? -1 : 2;
        if (!strcmp(name, "--tokenizer")) {
            if (!(o->tokenizer = cli_choice("train", name, tokenizers, argc, argv, &i))) return 2;
        } else if (!strcmp(name, "--device")) {
            if (!(o->device = cli_choice("train", name, devices, argc, argv, &i))) return 2;
        } else if (!strcmp(name, "--device-memory")) {
            if (!(v = cli_value("train", argc, argv, &i))) return 2;
            if (zoff_parse_size(v, &o->device_memory) != ZOFF_OK) {
                fprintf(stderr, "zoff train: --device-memory: %s\n", zoff_last_error());
                return 2;
            }
        } else if (!strcmp(name, "--save-snapshot-memory")) {
            if (!(v = cli_value("train", argc, argv, &i))) return 2;
            size_t b = 0;
            if (!strcmp(v, "off")) {
                o->save_snapshot_bytes = -1;
            } else if (strcmp(v, "auto") != 0) {
                bool parsed = zoff_parse_size(v, &b) == ZOFF_OK;
                if (!parsed || b == 0 || b > (size_t)INT64_MAX) {
                    fprintf(stderr, "zoff train: --save-snapshot-memory '%s': %s; or auto, or off\n", v,
                            parsed ? "give a size above 0 such as 512MiB" : zoff_last_error());
                    return 2;
                }
                o->save_snapshot_bytes = (int64_t)b;
            }
        } else if (!strcmp(name, "--comm-timeout")) {
            if (!(v = cli_value("train", argc, argv, &i))) return 2;
            if (!cli_parse_f64("train", name, v, 1e-3, 1e9, &a->comm_timeout)) return 2;
        } else {
            cli_unknown_option("train", argv[i], train_usage);
            return 2;
        }
    }
    o->seed = (uint64_t)seed;
    /* a resume without --save goes on in the loaded run's folder (a --load that is not a checkpoint
     * keeps the default: the trainer says what is wrong with it) */
    static char run_dir[4200];
    if (!o->save_dir && o->load_dir) {
        if (zoff_ckpt_run_dir(o->load_dir, run_dir, sizeof run_dir) == ZOFF_OK) o->save_dir = run_dir;
        else zoff_clear_error();
    }
    if (!o->save_dir) o->save_dir = "out/gpt2-small";
    static char default_text[1024];
    default_config(o->train_iters, default_text, sizeof default_text);
    o->config_text = default_text;
    if (o->eval_interval && !o->eval_iters) {
        fprintf(stderr, "zoff train: --eval-interval validates on --eval-iters batches, but --eval-iters is 0; give "
                        "--eval-iters N (N > 0) or drop --eval-interval\n");
        return 2;
    }
    if (o->no_checkpoint && (o->save_interval || o->keep_last || o->sync_saves)) {
        fprintf(stderr, "zoff train: --no-checkpoint writes no checkpoint, so %s has nothing to do; drop one of them\n",
                o->save_interval ? "--save-interval" : o->keep_last ? "--keep-last" : "--sync-save");
        return 2;
    }
    return 0;
}


static void fmt_hms(double s, char *buf, size_t n) {
    if (!(s >= 0) || s > 359999) s = 0;
    int t = (int)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%d:%02d:%02d", t / 3600, (t / 60) % 60, t % 60);
    else snprintf(buf, n, "%02d:%02d", t / 60, t % 60);
}

/* What runs where, how much memory, the model and the batch (all ranks together). */
static void print_banner(zoff_trainer *t) {
    const zoff_trainer_info *in = zoff_trainer_info_get(t);
    zoff_device *dev = zoff_trainer_device(t);
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    zoff_engine_memory em;
    zoff_engine_memory_usage(zoff_trainer_engine(t), &em);
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], ranks[48] = "", phases[256], nl[40], nh[40], np[48];
    zoff_startup_format(in->startup_phase_s, false, phases, sizeof phases);
    fprintf(stderr,
            "zoff: %s\n"
            "zoff: memory: device %s (model %s: weights, gradients unless in buckets, activations; engine %s: "
            "optimizer state, gradient buckets), pinned host %s, "
            "pageable host %s, disk %s\n",
            zoff_engine_describe(zoff_trainer_engine(t)), zoff_format_bytes(ms.device_in_use, b1, sizeof b1),
            zoff_format_bytes(zoff_gpt2_device_bytes(zoff_trainer_model(t)), b2, sizeof b2),
            zoff_format_bytes(em.device, b3, sizeof b3), zoff_format_bytes(ms.pinned_in_use, b4, sizeof b4),
            zoff_format_bytes(em.pageable, b5, sizeof b5), zoff_format_bytes(em.nvme, b6, sizeof b6));
    const int64_t B = in->micro_batch, A = in->accumulation, W = in->world, T = in->seq_len;
    if (W > 1) snprintf(ranks, sizeof ranks, " x %lld ranks", (long long)W);
    fprintf(stderr,
            "zoff: GPT-2 %s, width %lld, %s, seq %lld, vocab %lld: %s on %s\n"
            "zoff: batch %lld x %lld accumulation%s = %lld sequences (%lld tokens) per step, %s; "
            "device memory %s in use (budget %s)\n"
            "zoff: start-up %.2f s (%s)\n",
            zoff_format_count(in->shape.num_layers, "layer", nl, sizeof nl), (long long)in->shape.hidden_size,
            zoff_format_count(in->shape.num_heads, "head", nh, sizeof nh), (long long)T, (long long)in->shape.vocab_size,
            zoff_format_params(in->num_params, np, sizeof np), zoff_device_name(dev),
            (long long)B, (long long)A, ranks, (long long)(B * A * W), (long long)(B * A * W * T),
            zoff_dtype_name(in->dtype), zoff_format_bytes(ms.device_in_use, b1, sizeof b1),
            ms.device_budget ? zoff_format_bytes(ms.device_budget, b2, sizeof b2) : "unlimited", in->startup_s, phases);
}

typedef struct progress {
    bool tty, quiet, breakdown;
    int64_t every, iters;
    double t_start;
} progress;

/* The progress line of a step: rewritten in place on a terminal, every N steps otherwise. */
static void print_step(const progress *p, const zoff_trainer_info *in, const zoff_train_step_result *r) {
    if (p->quiet) return;
    int64_t step = r->step, done = step - in->start_step;
    double elapsed = zoff_now() - p->t_start, left = (double)(p->iters - step) * (elapsed / (double)done);
    char e1[16], e2[16];
    fmt_hms(elapsed, e1, sizeof e1);
    fmt_hms(left, e2, sizeof e2);
    char loss[32];
    zoff_format_fixed(r->loss, 4, loss, sizeof loss); /* never "0.0000" for a small loss */
    if (p->tty) {
        fprintf(stderr, "\rstep %6lld/%lld | loss %9s | lr %.2e | %8.0f tok/s | %s elapsed | %s left   ",
                (long long)step, (long long)p->iters, loss, r->lr, r->tokens_per_s, e1, e2);
        if (step == p->iters) fputc('\n', stderr);
    } else if (step % p->every == 0 || step == p->iters || done == 1) {
        char norm[32] = "inf/NaN"; /* a skipped step's: not a norm (printf's "-nan"; metrics.jsonl: null) */
        if (isfinite(r->info.grad_norm)) zoff_format_fixed(r->info.grad_norm, 3, norm, sizeof norm);
        fprintf(stderr, "step %lld/%lld loss %s lr %.3e grad_norm %s tok/s %.0f elapsed %s left %s\n",
                (long long)step, (long long)p->iters, loss, r->lr, norm, r->tokens_per_s, e1, e2);
    }
    const zoff_step_info *si = &r->info;
    if (si->skipped) /* DeepSpeed's "OVERFLOW! Skipping step": every time, not every N steps */
        fprintf(stderr, "%sstep %lld: inf/NaN gradients at loss scale %.17g: update skipped\n", p->tty ? "\n" : "",
                (long long)step, si->loss_scale);
    if (p->breakdown && step % p->every == 0) /* in ms, as DeepSpeed's and the monitors' timers (0.0000 s hid 40 us) */
        fprintf(stderr,
                "%stime (ms): forward %.3f backward %.3f wait-grads %.3f host-step %.3f device-step %.3f "
                "wait-weights %.3f step %.3f\n",
                p->tty ? "\n" : "", 1e3 * r->t_forward, 1e3 * r->t_backward, 1e3 * si->t_wait_grads, 1e3 * si->t_host,
                1e3 * si->t_device, 1e3 * si->t_wait_weights, 1e3 * r->step_time);
}

/* Where the training loop's time went (seconds): the steps (zoff_train_step_result.step_time; the first of
 * this run also alone), the validations and periodic saves between them (and how many); wall: the whole loop. */
typedef struct loop_times {
    double wall, steps, first, evals, saves;
    int64_t nevals, nsaves;
} loop_times;

/* The throughput line: tokens and samples per second over the steps' own time, as DeepSpeed's
 * ThroughputTimer measures it (not the validations and saves between them), first step included and,
 * from two steps on, without it (DeepSpeed leaves its first steps out as warm-up). */
static void print_throughput(const zoff_trainer_info *in, int64_t steps, const loop_times *lt) {
    const double seqs = (double)(in->micro_batch * in->accumulation * in->world), tokens = seqs * (double)in->seq_len;
    if (steps <= 0 || !(lt->steps > 0)) return;
    char rest[96] = "", out[160] = "", v[64] = "", c[64] = "";
    if (steps > 1 && lt->steps - lt->first > 0)
        snprintf(rest, sizeof rest, "; without it %.0f tokens/s",
                 tokens * (double)(steps - 1) / (lt->steps - lt->first));
    if (lt->nevals) snprintf(v, sizeof v, "%lld validations %.2f s", (long long)lt->nevals, lt->evals);
    if (lt->nsaves) snprintf(c, sizeof c, "%lld periodic checkpoints %.2f s", (long long)lt->nsaves, lt->saves);
    if (v[0] || c[0]) snprintf(out, sizeof out, "; not counted: %s%s%s", v, v[0] && c[0] ? ", " : "", c);
    fprintf(stderr,
            "zoff: throughput: %.0f tokens/s (%.2f samples/s) over the steps' %.3f s (the first step's %.3f s "
            "included%s)%s\n",
            tokens * (double)steps / lt->steps, seqs * (double)steps / lt->steps, lt->steps, lt->first, rest, out);
}

/* The closing lines; validation figures only when they were measured. save_dir NULL: no checkpoint.
 * sig > 0: a signal stopped the run: said on the first line, and the checkpoint lines are the caller's. */
static void print_summary(const zoff_trainer_info *in, const char *save_dir, const loop_times *lt, double last_loss,
                          int64_t skipped, double val_before, double val_after, const zoff_memory_stats *ms, int sig) {
    int64_t steps = in->step - in->start_step;
    char val[96] = "", loss[64] = "", skip[96] = "", stop[48] = "", ck[4200], v1[32], v2[32];
    if (steps > 0) snprintf(loss, sizeof loss, "; train loss %s (last step)", zoff_format_fixed(last_loss, 4, v1, 32));
    if (skipped) snprintf(skip, sizeof skip, " (%lld of them skipped: inf/NaN gradients)", (long long)skipped);
    if (!isnan(val_after))
        snprintf(val, sizeof val, "; validation loss %s -> %s", zoff_format_fixed(val_before, 4, v1, sizeof v1),
                 zoff_format_fixed(val_after, 4, v2, sizeof v2));
    if (sig > 0) snprintf(stop, sizeof stop, " (stopped by signal %d)", sig);
    fprintf(stderr, "zoff: trained %lld step%s%s%s in %.2f s%s%s\n", (long long)steps, steps == 1 ? "" : "s", skip,
            stop, lt->wall, loss, val);
    print_throughput(in, steps, lt);
    char b1[32], b2[32], b3[32], host[96] = "";
    zoff_host_memory hm; /* the whole process: pageable optimizer state, data, buffers (CPU backend: the device's) */
    if (zoff_host_memory_query(&hm) == ZOFF_OK && hm.resident_peak != SIZE_MAX)
        snprintf(host, sizeof host, ", host resident %s (%s VmHWM)", zoff_format_bytes(hm.resident_peak, b3, sizeof b3),
                 in->world > 1 ? "rank 0's" : "the process's");
    fprintf(stderr, "zoff: peak memory: device %s, pinned host %s%s\n", zoff_format_bytes(ms->device_peak, b1, sizeof b1),
            zoff_format_bytes(ms->pinned_peak, b2, sizeof b2), host);
    if (sig > 0) return;
    if (!save_dir) {
        fprintf(stderr, "zoff: no checkpoint (--no-checkpoint), metrics %s\n", in->metrics_path);
        return;
    }
    zoff_ckpt_step_path(save_dir, in->step, ck, sizeof ck);
    fprintf(stderr, "zoff: checkpoint %s, metrics %s\nzoff: try: zoff sample --load %s\n", ck, in->metrics_path,
            save_dir);
}

/* The closing summary of train() (not under --quiet), with the memory peaks: what zoff plan predicts
 * (stage 3 gathers weights on use). sig > 0: a signal stopped the run. */
static void summarize(zoff_trainer *t, const zoff_trainer_options *o, const loop_times *lt, double last_loss,
                      int64_t skipped, double val_before, double val_after, int sig) {
    if (o->quiet) return;
    zoff_memory_stats ms;
    zoff_device_memory_stats(zoff_trainer_device(t), &ms);
    print_summary(zoff_trainer_info_get(t), o->no_checkpoint ? NULL : o->save_dir, lt, last_loss, skipped, val_before,
                  val_after, &ms, sig);
}

/* The training loop. */
static int train(zoff_trainer *t, const zoff_trainer_options *o) {
    const zoff_trainer_info *in = zoff_trainer_info_get(t);
    const zoff_config *cfg = zoff_trainer_config(t);
    zoff_status s;
    double val_before = NAN, val_after = NAN;
    if (!o->quiet) print_banner(t);
    if (in->start_step > 0 && in->start_step >= o->train_iters)
        fprintf(stderr,
                "zoff: the run is at step %lld already and --train-iters %lld counts steps from the run's start: "
                "nothing to train (give --train-iters above %lld to go on)\n",
                (long long)in->start_step, (long long)o->train_iters, (long long)in->start_step);
    if ((s = zoff_trainer_evaluate(t, &val_before)) != ZOFF_OK) return fail(s);
    char vb[32];
    if (!o->quiet && !isnan(val_before))
        fprintf(stderr, "zoff: validation loss before training: %s\n", zoff_format_fixed(val_before, 4, vb, sizeof vb));

    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal); /* the terminal closed (an ssh session dropped): save and stop too, exit 129 */
    progress p = {.tty = isatty(STDERR_FILENO) && !o->quiet, .quiet = o->quiet, .iters = o->train_iters,
                  .breakdown = cfg->wall_clock_breakdown, .every = cfg->steps_per_print > 0 ? cfg->steps_per_print : 10,
                  .t_start = zoff_now()};
    zoff_train_step_result r = {.loss = NAN};
    int64_t skipped = 0;
    loop_times lt = {0};
    for (bool stop = false;;) {
        if ((s = zoff_trainer_should_stop(t, &stop)) != ZOFF_OK) return fail(s);
        if (stop || in->step >= o->train_iters) break;
        if ((s = zoff_trainer_step(t, &r)) != ZOFF_OK) return fail_run(o, s);
        if (!isfinite(r.loss)) {
            fprintf(stderr, "zoff train: loss is %f at step %lld; stopping (lower the learning rate?)\n", r.loss,
                    (long long)r.step);
            return 1;
        }
        skipped += r.info.skipped;
        if (lt.steps == 0) lt.first = r.step_time;
        lt.steps += r.step_time;
        print_step(&p, in, &r);
        double mark = zoff_now();
        if (zoff_trainer_next_save(t) == in->step) {
            if ((s = zoff_trainer_save_periodic(t)) != ZOFF_OK) return fail_run(o, s);
            lt.saves += zoff_lap(&mark), lt.nsaves++;
        }
        if (zoff_trainer_eval_due(t)) {
            double val = NAN;
            if ((s = zoff_trainer_evaluate(t, &val)) != ZOFF_OK) return fail_run(o, s);
            lt.evals += zoff_lap(&mark), lt.nevals++;
            if (!o->quiet && !isnan(val)) { /* NAN: a signal stopped it; the loop stops next */
                if (p.tty) fputc('\n', stderr); /* below the progress line it would overwrite */
                fprintf(stderr, "step %lld validation loss %s\n", (long long)in->step,
                        zoff_format_fixed(val, 4, vb, sizeof vb));
            }
        }
    }
    if (p.tty && in->step < o->train_iters) fputc('\n', stderr);
    lt.wall = zoff_now() - p.t_start;
    if (g_stop && !o->quiet)
        fprintf(stderr, "zoff: signal %d: %s at step %lld\n", (int)g_stop,
                o->no_checkpoint ? "stopping (--no-checkpoint: no checkpoint)" : "saving a checkpoint",
                (long long)in->step);
    /* final, also on SIGINT/SIGTERM/SIGHUP */
    if (!o->no_checkpoint && (s = zoff_trainer_save(t, true)) != ZOFF_OK) return fail_run(o, s);
    if (g_stop) {
        summarize(t, o, &lt, r.loss, skipped, val_before, NAN, (int)g_stop);
        if (!o->quiet && !o->no_checkpoint)
            fprintf(stderr, "zoff: step %lld saved under %s; go on with --load %s\n", (long long)in->step, o->save_dir,
                    o->save_dir);
        return 128 + (int)g_stop;
    }
    /* the delayed update's last weights on the device (the save left them pending) */
    if ((s = zoff_engine_flush(zoff_trainer_engine(t))) != ZOFF_OK) return fail(s);
    if ((s = zoff_trainer_evaluate(t, &val_after)) != ZOFF_OK) return fail(s);
    if (g_stop) { /* during the final validation: the checkpoint is written, the figure is not */
        summarize(t, o, &lt, r.loss, skipped, val_before, NAN, (int)g_stop);
        if (!o->quiet)
            fprintf(stderr, "zoff: signal %d: the final validation stopped; step %lld is %s\n", (int)g_stop,
                    (long long)in->step, o->no_checkpoint ? "not saved (--no-checkpoint)" : "saved");
        return 128 + (int)g_stop;
    }
    summarize(t, o, &lt, r.loss, skipped, val_before, val_after, 0);
    return 0;
}

/* After a failure with several ranks the others may wait in a collective: end the job (the
 * failing rank printed why). */
static void dp_abort(int world, int rc) {
    if (world <= 1) return;
    fflush(stderr);
#ifdef ZOFF_HAVE_MPI
    MPI_Abort(MPI_COMM_WORLD, rc);
#else
    (void)rc;
#endif
}

int zoff_cmd_train(int argc, char **argv) {
    train_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc < 0 ? 0 : rc;
    /* one rank, or rank r of N under mpirun (docs/multinode.md) */
    zoff_comm_options co = {.timeout_s = a.comm_timeout};
    zoff_comm *comm = NULL;
    zoff_status s = zoff_comm_init(NULL, NULL, &co, &comm);
    if (s != ZOFF_OK) return fail(zoff_error_context(s, "data parallel"));
    int world = zoff_comm_size(comm);
    if (world > 1) snprintf(g_who, sizeof g_who, "zoff train [rank %d/%d]", zoff_comm_rank(comm), world);
    if (zoff_comm_rank(comm) > 0) a.o.quiet = true; /* progress from rank 0 only; errors from every rank */
    /* --quiet: nothing on success, from any layer (the corpus, NVMe and engine notes are INFO);
     * warnings and errors still print */
    if (a.o.quiet) cli_quiet_logs();
    a.o.stop = &g_stop;
    zoff_trainer *t = NULL;
    s = zoff_trainer_create(&a.o, world > 1 ? comm : NULL, &t);
    rc = s != ZOFF_OK ? fail(s) : train(t, &a.o);
    if (rc == 1 || rc == 2) dp_abort(world, rc);
    zoff_trainer_destroy(t);
    zoff_comm_destroy(comm); /* last: finalises MPI */
    return rc;
}
