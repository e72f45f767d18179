/* The trainer: a parsed config + model shape wired into a device, a GPT-2 model, the ZeRO
 * engine, data loaders, metrics and training checkpoints. `zoff train` parses flags, creates a
 * trainer and loops over zoff_trainer_step; everything between the CLI and the lower layers
 * (config, model, zero, data, ckpt, comm) is here.
 *
 *     zoff_trainer *t;
 *     ZOFF_TRY(zoff_trainer_create(&opts, comm, &t));  // config, data, model, engine, --load
 *     zoff_trainer_evaluate(t, &val);                   // val_loss line in metrics.jsonl
 *     while (zoff_trainer_info(t)->step < opts.train_iters) {
 *         zoff_trainer_step(t, &r);                     // zero grad, fwd, bwd, step, metrics
 *         if (interval) zoff_trainer_save(t, false);
 *     }
 *     zoff_trainer_save(t, true);                       // final checkpoint, unless saved already
 *     zoff_trainer_destroy(t);
 *
 * Training checkpoints: DIR/step_%08d/rank_%05d.zckpt (include/zoff/ckpt.h). Rank 0's file holds
 * every tensor's fp32 master weights under its Hugging Face name, the "meta" blob
 * (zoff_train_meta as JSON, format "zoff-train-state" version 1), the "config" blob and, while
 * the delayed update's weights are pending, the device's weights (ZOFF_TRAIN_DEVICE_WEIGHTS); every
 * rank's file holds its partition of the optimizer state ("optimizer.exp_avg", ...) and a
 * "partition" blob. Loading reshards: a rank reads its partition from whichever rank files
 * hold it, whatever the number of ranks that wrote them. */
#ifndef ZOFF_TRAIN_H
#define ZOFF_TRAIN_H

#include <signal.h>

#include "zoff/ckpt.h"
#include "zoff/comm.h"
#include "zoff/config.h"
#include "zoff/data.h"
#include "zoff/engine.h"
#include "zoff/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the training-checkpoint schema ---- */

/* The run's settings a resume compares (the "settings" object of the meta blob; derived from
 * the stored config for checkpoints written before it existed). */
typedef struct zoff_train_settings {
    bool known;                /* false: an old checkpoint without settings or config */
    char optimizer[16];        /* the update: "Adam" (adam_w_mode false), "AdamW" (Adam with it too), "Adagrad", "Lion" */
    char precision[8];         /* "fp32", "bf16", "fp16": the 16-bit type and its loss-scaler state */
    double lr;                 /* optimizer.params.lr */
    char scheduler[24];        /* scheduler.type ("none" without one) */
    int64_t warmup_steps, total_steps; /* scheduler.params.warmup_num_steps, total_num_steps */
    int64_t micro_batch, accumulation, world_size;
    double gradient_clipping;
} zoff_train_settings;

/* What a training checkpoint records besides tensors (the "meta" JSON blob). */
typedef struct zoff_train_meta {
    int64_t step; /* optimizer steps applied (iteration count) */
    zoff_gpt2_shape shape;
    int64_t seq_len;
    char tokenizer[16];
    uint64_t seed;
    zoff_loader_state loader;
    zoff_engine_scalars engine;
    double consumed_tokens;
    zoff_train_settings settings;
    /* --data-path / --val-path, absolute ("": not given: the default corpus, or no --val-path): a
     * resume without --data-path reads them */
    char data_path[1024], val_path[1024];
    /* the delayed update's weights were pending at the save (zoff_engine_weights_pending): rank
     * 0's file then holds the model's parameter buffer as entry ZOFF_TRAIN_DEVICE_WEIGHTS (the
     * model's dtype, [num_params]), the weights the next forward uses. -1: a checkpoint written
     * before this field existed (unknown) */
    int weights_pending;
    /* at a save: the training shards, recorded with their token counts ("shards": [[path, tokens],
     * ...], the paths resolved; at most ZOFF_TRAIN_SHARDS_MAX) so that a refused resume can say
     * which shard changed (zoff_train_ckpt_shard_changes). NULL: not recorded. Not read back. */
    const zoff_dataset *shards;
} zoff_train_meta;
#define ZOFF_TRAIN_SHARDS_MAX 1000
#define ZOFF_TRAIN_DEVICE_WEIGHTS "delayed_update.device_weights"

/* Save weights (fp32 master, per tensor by name), this rank's optimizer state and, on rank 0,
 * meta and config_json (may be NULL) into DIR/step_X, over the ranks of comm (collective; NULL =
 * one rank). Atomic: every rank's file is committed before rank 0 finalizes; a failure on any
 * rank discards the checkpoint on all. */
zoff_status zoff_train_ckpt_save(const char *dir, zoff_engine *eng, const zoff_gpt2 *model,
                                 const zoff_train_meta *meta, const char *config_json, zoff_comm *comm);
/* Bytes of one piece a checkpoint load streams each array through (the one home of that bound; a
 * save streams through the writer's pieces, zoff_ckpt_writer_buffer_bytes): no whole-model
 * staging copy with one rank. */
size_t zoff_train_ckpt_piece_bytes(void);
/* Host bytes a load holds outside the engine: two pieces, one read (and checksummed) by a helper
 * thread while the other is handed on to the engine. */
size_t zoff_train_ckpt_load_bytes(void);
/* Host bytes a save or load with one rank holds at most outside the engine: the larger of the
 * writer's pieces and the load's two pieces (what train's host-memory check and zoff plan count). */
size_t zoff_train_ckpt_save_bytes(void);
/* What a save with several ranks holds on rank 0 on top of that: the master weights come from
 * the ranks a piece at a time (two pieces) when the state is partitioned (stage >= 1; in memory
 * or in an NVMe swap file alike), nothing in stage 0. */
size_t zoff_train_ckpt_gather_bytes(int world, int stage);
/* The data of one checkpoint of a model of n parameters trained with cfg, all ranks' files
 * together: the fp32 master weights and the optimizer's other state arrays in
 * zoff_checkpoint_state_dtype (the files add their metadata and alignment, under 1 MiB each for
 * GPT-2). zoff train refuses a --save whose disk has less free; zoff plan prints it. */
size_t zoff_train_ckpt_data_bytes(const zoff_config *cfg, int64_t n);
/* The files of one checkpoint (DIR/step_X: every rank's .zckpt file, the COMPLETE marker when
 * step >= 0), as zoff train's save writes them: the entries it adds sized by the .zckpt layout rule
 * (zoff_ckpt_file_bytes). *bound (may be NULL): NULL when the figure is exact to the byte (one
 * rank, or several in stage 0; a meta of under 4 KiB, which data paths of up to 1 KiB keep);
 * "at least" with several ranks in stage 1-3 (the other ranks' shares and partitions are not laid
 * out here); "at most" with the delayed parameter update (the device weights' entry is in the
 * saves made while an update is pending: after its warm-up). zoff plan prints it, zoff train checks
 * the --save disk against it. */
typedef struct zoff_train_ckpt_size {
    const zoff_config *cfg;
    const zoff_gpt2_shape *shape;
    zoff_dtype model_dtype;  /* the weights' dtype (the delayed update's device weights) */
    int world;               /* ranks */
    const char *config_text; /* the config the checkpoint stores (NULL: zoff train's built-in one, under 4 KiB) */
    int64_t step;            /* the step (its COMPLETE marker's size); -1: the marker not counted */
} zoff_train_ckpt_size;
size_t zoff_train_ckpt_bytes(const zoff_train_ckpt_size *in, const char **bound);

/* Background save (one rank): zoff_train_ckpt_save_start fixes the meta and config now and
 * starts a writer thread ("zoff-ckpt"; ZOFF_CKPT_WRITER_NICE lowers its priority) that streams the engine's host state
 * (weights, optimizer state) into DIR/step_X through the writer's pieces, finalizes it (atomic, as zoff_train_ckpt_save) and prunes
 * to keep_last (0 = keep all); the delayed update's device weights, which the next backward
 * changes, are written before it returns, on the calling thread. Call it after zoff_engine_flush_state.
 * snapshot_budget >= 0: the state is read through the engine's copy-on-update snapshot
 * (zoff_engine_snapshot_begin, staging of at most that many bytes): optimizer updates may run
 * while it writes and the file holds the state of the call (byte for byte what
 * zoff_train_ckpt_save writes). snapshot_budget < 0: the engine's state must not change until
 * zoff_train_ckpt_save_wait returned, so wait before the next call that starts an optimizer
 * update (zoff_engine_step); forward/backward may run meanwhile. Either way one save at a
 * time. Only when zoff_train_ckpt_can_background (one rank, the optimizer state in host memory
 * or, through the snapshot, partly on the device). zoff_train_ckpt_save_done: the writer has finished (wait will not block).
 * zoff_train_ckpt_save_snapshots: the job reads through a snapshot. wait joins the writer and
 * returns its status (errors name the file and say the earlier checkpoints are intact); *done
 * (may be NULL) gets the writer's wall time, its thread's CPU time and the snapshot's figures.
 * NULL job: ZOFF_OK. */
typedef struct zoff_train_ckpt_job zoff_train_ckpt_job;
typedef struct zoff_train_ckpt_done {
    double seconds, cpu_seconds;
    bool snapshot_used;
    zoff_engine_snapshot_stats snapshot;
    size_t in_place; /* bytes the disk read straight from the snapshot's staging copies (no copy) */
} zoff_train_ckpt_done;
/* snapshot_budget: what the save's snapshot may take (< 0: none, as for zoff_train_ckpt_save_start). */
bool zoff_train_ckpt_can_background(const zoff_engine *eng, const zoff_comm *comm, int64_t snapshot_budget);
/* What decides whether a periodic save can run in the background: an engine's figures (zoff train)
 * or a planned setting's (zoff plan). */
typedef struct zoff_train_save_facts {
    int world;                /* ranks */
    bool nvme;                /* optimizer state or parameters in NVMe swap files */
    int64_t host_params;      /* of this rank's partition: parameters whose optimizer state is on the host */
    int64_t partition_params; /* this rank's partition */
    int64_t snapshot_budget;  /* < 0: no snapshot (--save-snapshot-memory off, super_offload) */
    size_t device_copy;       /* the snapshot's copy of a device share (zoff_engine_snapshot_min_bytes) */
} zoff_train_save_facts;
/* Why a save with these facts cannot run in the background, as a phrase written into buf ("this run
 * has 2 ranks", "the optimizer state is in NVMe swap files ...", a device share without a snapshot,
 * or with a budget below its copy), or NULL where it can (the one home of that rule). */
const char *zoff_train_ckpt_background_rule(const zoff_train_save_facts *f, char *buf, size_t cap);
/* zoff_train_ckpt_background_rule with the engine's facts. */
const char *zoff_train_ckpt_background_blocker(const zoff_engine *eng, const zoff_comm *comm, int64_t snapshot_budget,
                                              char *buf, size_t cap);
zoff_status zoff_train_ckpt_save_start(const char *dir, zoff_engine *eng, const zoff_gpt2 *model,
                                       const zoff_train_meta *meta, const char *config_json, int keep_last,
                                       int64_t snapshot_budget, zoff_train_ckpt_job **out);
bool zoff_train_ckpt_save_done(zoff_train_ckpt_job *job);
bool zoff_train_ckpt_save_snapshots(const zoff_train_ckpt_job *job);
zoff_status zoff_train_ckpt_save_wait(zoff_train_ckpt_job *job, zoff_train_ckpt_done *done);
/* Read meta from a checkpoint (rank 0's reader). *config_json (malloc'd, may be NULL; pass
 * NULL not to read it). */
zoff_status zoff_train_ckpt_read_meta(zoff_ckpt_reader *r, zoff_train_meta *meta, char **config_json);
/* What changed between the training shards a checkpoint records and ds, into out (cap bytes):
 * "removed PATH (N tokens)", "added PATH (N tokens)", "PATH resized to N tokens from M", joined by
 * ", "; "" when the checkpoint records none (an older one) or none changed. */
void zoff_train_ckpt_shard_changes(zoff_ckpt_reader *r, const zoff_dataset *ds, char *out, size_t cap);
/* Read the fp32 master weights of every tensor of `model` into host_params (num_params floats). */
zoff_status zoff_train_ckpt_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params);
/* The same for the model range [lo, hi) only, into dst (hi - lo floats): whole tensors are read
 * with their CRC checked, parts of tensors through zoff_ckpt_read_range (the first part read of
 * a tensor checks the whole entry's CRC); each tensor met is checked as zoff_ckpt_read_tensor
 * does. Any split of [0, num_params) gives the same values. */
zoff_status zoff_train_ckpt_read_weights_range(zoff_ckpt_reader *r, const zoff_gpt2 *model, int64_t lo, int64_t hi,
                                               float *dst);
/* Restore the engine's optimizer state: this rank's partition, read from whichever rank files
 * hold it (resharding). r is rank 0's file. */
zoff_status zoff_train_ckpt_read_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t num_params);
/* After zoff_train_ckpt_read_state, for a checkpoint with meta.weights_pending: the delayed
 * update's pending weights marked in the engine and the device's weights read from the entry
 * ZOFF_TRAIN_DEVICE_WEIGHTS (every rank reads all of it). *restored false: the engine has no
 * delayed update and keeps the master's weights. */
zoff_status zoff_train_ckpt_read_device_weights(zoff_ckpt_reader *r, zoff_engine *eng, int64_t num_params,
                                                bool *restored);

/* ---- files ---- */

/* mkdir -p DIR; made (may be NULL) gets the top-most directory this call created ("" if none). */
zoff_status zoff_train_mkdir_p(const char *dir, char *made, size_t cap);
/* The default corpus: Debian's `fortunes`, tokenised once into DIR/fortunes_<tok>_{train,val}.bin. */
zoff_status zoff_train_default_data(const char *dir, zoff_tokenizer *tok, char *train_path, size_t cap,
                                    char *val_path, size_t vcap);

/* ---- device -> model -> initial weights -> engine ----
 * The wiring every training program needs (zoff train, the benchmarks that train). */
typedef struct zoff_train_stack_options {
    zoff_device_options device;
    const zoff_config *cfg;          /* optimizer, zero_optimization (kept by the engine: outlive the stack) */
    zoff_gpt2_shape shape;
    int64_t batch_size, seq_len;
    zoff_dtype dtype;
    bool checkpoint_activations;
    uint64_t seed;                   /* random initial weights when init_range is NULL (generated
                                        straight into the engine's master: no whole-model buffer) */
    /* fills dst with the initial weights of the model range [lo, hi) (a checkpoint's, a
     * safetensors file's), called by the engine piece by piece (any split, the same values):
     * no whole-model buffer */
    zoff_status (*init_range)(void *arg, const zoff_gpt2 *model, int64_t lo, int64_t hi, float *dst);
    void *init_arg;
    zoff_comm *comm;                 /* NULL: one rank */
    bool timeline;                   /* record the gradient-stream timeline (zoff_engine_grad_timeline) */
    /* the forward waits per layer group for its weights (engine options.weight_waits,
     * zoff_gpt2_set_weight_wait): the pipelined step; ignored in stage 3 (parameter hooks) */
    bool weight_waits;
} zoff_train_stack_options;

typedef struct zoff_train_stack {
    zoff_device *dev;
    zoff_gpt2 *model;
    zoff_engine *eng;
} zoff_train_stack;

/* Create the device, the model (stage 3: its weights come from the engine through the
 * parameter hooks) and the engine, which takes the initial fp32 weights piece by piece.
 * On error the error context names the part ("device", "model", "engine") and *out is empty. */
zoff_status zoff_train_stack_create(const zoff_train_stack_options *opts, zoff_train_stack *out);
void zoff_train_stack_destroy(zoff_train_stack *s); /* engine, model, device; NULL members allowed */

/* ---- the trainer ---- */

typedef struct zoff_trainer_options {
    const char *config_path;    /* DeepSpeed JSON file; NULL: config_text */
    const char *config_text;    /* the default config (used when config_path is NULL) */
    /* model shape: 0 = not given (then the config's model section, then the defaults
     * 4 x 128, 4 heads, seq 64, the tokenizer's vocabulary) */
    int64_t num_layers, hidden_size, num_heads, seq_length, max_pos, vocab_size;
    int64_t micro_batch;        /* overrides train_micro_batch_size_per_gpu (0 = no) */
    int64_t train_iters, eval_iters, save_interval, keep_last;
    int64_t eval_interval;      /* also evaluate every eval_interval steps (0: before and after training only) */
    const char *save_dir, *load_dir, *init_from, *data_path, *val_path;
    const char *tokenizer;      /* "gpt2" or "byte" (a checkpoint's own wins on --load) */
    const char *default_data_dir; /* where the default corpus is built (no data_path) */
    const char *device;         /* "cpu", "cuda" or NULL (cuda when available) */
    size_t device_memory;       /* device budget (0 = all) */
    uint64_t seed;
    bool checkpoint_activations;
    bool quiet;                 /* no progress lines from the trainer (errors still) */
    bool overwrite;             /* --save holds checkpoints of another run: delete them */
    bool sync_saves;            /* zoff_trainer_save_periodic saves on the calling thread */
    int64_t save_snapshot_bytes; /* background saves' snapshot staging (zoff_engine_snapshot_begin): 0 auto (the
                                    whole host state, at most half the host memory available at the save), > 0
                                    at most this, < 0 none (the next update waits for the whole save) */
    bool no_checkpoint;         /* metrics only, no checkpoint at the end (benchmarks, smoke runs) */
    volatile sig_atomic_t *stop; /* a signal handler sets it; all ranks agree (may be NULL) */
} zoff_trainer_options;

typedef struct zoff_trainer zoff_trainer;

/* The phases of zoff_trainer_create's start-up, in order: config (config, checks, tokenizer),
 * data (the shards opened), model (device, model, token buffers), then the engine's
 * (zoff_engine_startup): initial weights, engine allocation (and set-up), first touch of the
 * optimizer state, pinning; other (output directory, restore, metrics file). */
enum {
    ZOFF_STARTUP_CONFIG,
    ZOFF_STARTUP_DATA,
    ZOFF_STARTUP_MODEL,
    ZOFF_STARTUP_INITIAL_WEIGHTS,
    ZOFF_STARTUP_ENGINE_ALLOC,
    ZOFF_STARTUP_FIRST_TOUCH,
    ZOFF_STARTUP_PINNING,
    ZOFF_STARTUP_OTHER,
    ZOFF_STARTUP_PHASES
};
/* The breakdown as text ("config 0.01, data 0.02, ... s": the log) or as JSON fields
 * (",\"startup_config\":0.010,...": metrics.jsonl's start-up line) into buf. */
void zoff_startup_format(const double *phase_s, bool json, char *buf, size_t size);

/* What the CLI prints: fixed at create, except step. */
typedef struct zoff_trainer_info {
    int64_t step, start_step;         /* optimizer steps done; where this run began */
    zoff_gpt2_shape shape;
    int64_t seq_len, micro_batch, accumulation, num_params;
    int64_t eval_iters;               /* validation batches actually evaluated (0: none) */
    int rank, world;
    zoff_dtype dtype;
    double startup_s;                 /* zoff_trainer_create's time, up to the first step */
    double startup_phase_s[ZOFF_STARTUP_PHASES]; /* startup_s by phase (zoff_startup_phase_name) */
    double consumed_tokens;
    const char *metrics_path;
    const char *tokenizer;
} zoff_trainer_info;

/* One optimizer step's figures (also written to metrics.jsonl). */
typedef struct zoff_train_step_result {
    int64_t step;          /* after this step */
    double loss;           /* mean over micro-batches and ranks */
    double lr, tokens_per_s, step_time, t_forward, t_backward;
    double beta1;          /* the optimizer's beta1 for this step (the schedule's: OneCycle's momentum) */
    double t_ckpt_wait;    /* waiting for a background checkpoint before the optimizer update */
    zoff_step_info info;   /* grad norm, loss scale, skipped, host/device/wait times */
} zoff_train_step_result;

/* Validate everything (config, shape, resume compatibility, data, memory, --save) before
 * anything is written, then create the output directory, device, model, engine, loaders,
 * metrics file, and restore --load. comm: NULL for one rank. On error nothing is left
 * allocated and no empty --save directory is left behind. */
zoff_status zoff_trainer_create(const zoff_trainer_options *opts, zoff_comm *comm, zoff_trainer **out);
void zoff_trainer_destroy(zoff_trainer *t); /* NULL is allowed */
const zoff_trainer_info *zoff_trainer_info_get(const zoff_trainer *t);
zoff_device *zoff_trainer_device(zoff_trainer *t);
zoff_engine *zoff_trainer_engine(zoff_trainer *t);
zoff_gpt2 *zoff_trainer_model(zoff_trainer *t);
const zoff_config *zoff_trainer_config(const zoff_trainer *t);

/* One optimizer step over the accumulation micro-batches; writes its metrics line. */
zoff_status zoff_trainer_step(zoff_trainer *t, zoff_train_step_result *out);
/* Should training stop (a signal seen by any rank)? Collective: call on every rank. */
zoff_status zoff_trainer_should_stop(zoff_trainer *t, bool *stop);
/* Mean validation loss over eval_iters batches of micro_batch sequences, the same sequences
 * whatever the number of ranks; writes a val_loss line. NAN (and no line) when there is no
 * validation, or when a signal (options.stop) came during it: it stops at the next batch.
 * Collective. */
zoff_status zoff_trainer_evaluate(zoff_trainer *t, double *val_loss);
/* Checkpoint at the current step (and prune to keep_last). only_if_new: skip when the newest
 * checkpoint in --save is already this step (rank 0's view decides). Collective. */
zoff_status zoff_trainer_save(zoff_trainer *t, bool only_if_new);
/* A periodic checkpoint at the current step: written by a background writer thread while
 * training goes on when zoff_train_ckpt_can_background allows it (one rank, the optimizer state
 * in host memory) and sync_saves is not set; else as zoff_trainer_save(t, false). The meta,
 * loader position and loss-scaler state are taken now. The writer reads the state as of now
 * through the engine's snapshot (save_snapshot_bytes >= 0: the updates go on, staging what the
 * writer has not read), else zoff_trainer_step waits for the writer before its optimizer update.
 * With the snapshot, where the engine's state stays fixed until the next update
 * (zoff_engine_state_fixed_until_step), the save itself starts in the next zoff_trainer_step just
 * before that update, or when anything joins the save first (zoff_trainer_save, destroy): the
 * update this save waits for then overlaps that step's forward. zoff_trainer_step joins a writer that has finished at its end and returns the writer's error,
 * if any; a save waits for the one in flight first. Collective. */
zoff_status zoff_trainer_save_periodic(zoff_trainer *t);
/* The step at or after the current one at which a periodic save comes (a multiple of save_interval
 * below train_iters: the last step has the final save), -1 if none. The training loop saves when
 * it is the current step. */
int64_t zoff_trainer_next_save(const zoff_trainer *t);
/* Whether the training loop evaluates at the current step: a multiple of eval_interval below
 * train_iters (the last step has the evaluation after training), with validation data.
 * zoff_trainer_evaluate between steps does not change the run: it reads the weights the next
 * step's forward uses (with the delayed update, those of the update before the last). */
bool zoff_trainer_eval_due(const zoff_trainer *t);
#ifdef __cplusplus
}
#endif
#endif
