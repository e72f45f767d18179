/* zoff plan: what fits where, and the fastest configuration that fits, before
 * a run (src/plan; docs/plan.md).
 *
 * For one model shape, one base DeepSpeed config and one machine, the planner
 * predicts for each candidate setting (ZeRO stage x offload device x host
 * ratio) the bytes every rank holds on the device, in pinned and pageable host
 * memory and on disk, checks them against the machine's sizes with a margin,
 * predicts the step time from the machine's rates, and picks the fastest
 * setting that fits and that this version of zoff can run.
 *
 * The byte counts are the same arithmetic as the allocations of the model
 * (src/model/gpt2.c), the engine (src/zero/engine.c) and the training loop
 * (src/cli/train.c), re-derived here from the shape without allocating;
 * tests/test_plan.c checks them against the real allocations. Settings this
 * version cannot run yet (stage 3, nvme, more than one rank) are planned from
 * the formulas in docs/plan.md and marked not runnable.
 *
 * The planner lives in its own layer below model and zero: it needs GPT-2's
 * activation layout and the engine's placement rules, and the engine must not
 * know it trains GPT-2. */
#ifndef ZOFF_PLAN_H
#define ZOFF_PLAN_H

#include "zoff/config.h"
#include "zoff/device.h"
#include "zoff/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model's own allocations, from its shape (no allocation) ---- */
typedef struct zoff_plan_model_bytes {
    int64_t num_params;        /* elements of the flat parameter buffer */
    int64_t padded_vocab_size; /* Vp as the model resolves it */
    int64_t block_params;      /* elements of one transformer block */
    size_t params, grads;      /* device: flat 16/32-bit buffers */
    size_t activations;        /* device: the one activation allocation (256-byte aligned carving) */
    size_t host_losses;        /* pinned host: per-token losses for zoff_gpt2_mean_loss */
    size_t host_tokens;        /* pinned host, with zoff_gpt2_set_grad_rows: the forward's token ids */
} zoff_plan_model_bytes;

/* What zoff_gpt2_create(dev, o, ...) allocates. Validates the shape like the model. */
zoff_status zoff_plan_model_bytes_get(const zoff_gpt2_options *o, zoff_plan_model_bytes *out);

/* ---- the machine ---- */
typedef enum zoff_plan_source {
    ZOFF_PLAN_SRC_ASSUMED = 0, /* a fixed figure (docs/plan.md); no measurement */
    ZOFF_PLAN_SRC_PROBE,       /* the built-in quick probe on this machine */
    ZOFF_PLAN_SRC_BENCH,       /* a `zoff bench ... --json` file */
    ZOFF_PLAN_SRC_FLAG         /* given on the command line */
} zoff_plan_source;
const char *zoff_plan_source_name(zoff_plan_source s);

/* Rates, per rank. Each has a source. */
typedef struct zoff_plan_rates {
    double device_flops;       /* FLOP/s of forward+backward on the device, effective (whole model, not matmul peak) */
    double device_adam;        /* parameters/s of the device's fused Adam */
    double host_adam;          /* parameters/s of the host optimizer with fp32 states (model-dtype gradients, 16-bit
                                  copy), measured (probe, bench file); unused when assumed (zoff_plan_host_rate) */
    double host_mem_bw;        /* bytes/s, STREAM-style bound of the host optimizer's access pattern */
    double h2d, d2h;           /* bytes/s between pinned host memory and the device */
    double disk_read, disk_write; /* bytes/s at the nvme path */
    double link;               /* bytes/s per rank for collectives (ranks > 1) */
    zoff_plan_source src_compute, src_device_adam, src_host_adam, src_copy, src_disk, src_link;
    char bench_files[512];     /* the bench files that were read, for the report */
} zoff_plan_rates;

/* The host optimizer's parameters/s for a model of dtype dt with cfg's optimizer, its m and v in bf16 or
 * fp32. The update runs at its memory bound (zoff bench adam: every mode at 95-105% of it), so a
 * measured rate (r->host_adam: fp32 states) is scaled by the ratio of the two modes' bytes per
 * parameter (zoff_host_optimizer_traffic), and an assumed one is r->host_mem_bw over those bytes. */
double zoff_plan_host_rate(const zoff_plan_rates *r, const zoff_config *cfg, zoff_dtype dt, bool bf16_states);

typedef struct zoff_plan_machine {
    zoff_backend_kind backend;
    int ranks;                 /* data-parallel ranks (world size) >= 1 */
    int ranks_per_node;        /* ranks that share this host's memory and disk, 1..ranks */
    size_t device_bytes;       /* per rank; 0 = no limit (CPU backend without a budget) */
    bool device_budget;        /* device_bytes is the --device-memory budget the engine sees (auto ratio) */
    size_t host_bytes;         /* per node: host memory available (MemAvailable) */
    size_t pinned_limit;       /* per rank: lockable memory (RLIMIT_MEMLOCK); SIZE_MAX = unlimited */
    size_t disk_bytes;         /* free bytes at the nvme path, per node; 0 = unknown (disk not checked) */
    char disk_path[512];       /* that path (detected; "" when given as --disk-free or not detected) */
    /* offload_param.nvme_path on a file system of its own (another st_dev than disk_path's): the
     * parameter swap file is checked against param_disk_bytes (0 = unknown), the optimizer's against
     * disk_bytes; false: one file system holds both, checked together against disk_bytes */
    bool param_disk_own;
    size_t param_disk_bytes;
    char param_disk_path[512];
    double margin;             /* fraction of each capacity kept free, e.g. 0.10 */
    size_t runtime_reserve;    /* per rank device bytes the runtime takes outside zoff's accounting (CUDA) */
    size_t process_baseline;   /* per rank host bytes of the process itself (libraries, threads, tokenizer) */
    zoff_plan_rates rates;
} zoff_plan_machine;

/* Defaults: 1 rank, margin 0.10, no limits, assumed rates for the backend. */
void zoff_plan_machine_defaults(zoff_plan_machine *m, zoff_backend_kind backend);
/* Host memory (/proc/meminfo MemAvailable), pinned limit (RLIMIT_MEMLOCK; not on the CPU
 * backend, where pinned memory is ordinary memory: left unlimited) and free disk at
 * disk_path (statvfs; NULL or missing: left 0), and at param_disk_path (offload_param.nvme_path; NULL:
 * the same) when that is on another file system (param_disk_own). */
zoff_status zoff_plan_machine_detect(zoff_plan_machine *m, const char *disk_path, const char *param_disk_path);
/* Quick built-in probes on dev (about a second; docs/plan.md "Rates"): a small
 * GPT-2 forward+backward at the model's width and dtype (device FLOP/s), the
 * device Adam op, pinned copies both ways, and the host optimizer with its
 * STREAM-style bandwidth probe. Rates already set from a bench file are kept. */
zoff_status zoff_plan_probe(zoff_device *dev, const zoff_config *cfg, const zoff_gpt2_options *model,
                            zoff_plan_machine *m);
/* Read the output of `zoff bench adam --json`, `zoff bench step --json` or
 * `zoff bench nvme --json` (recognised by content) into m->rates. dtype picks
 * the matching bench-adam mode. ZOFF_ERR_FORMAT names the file and what is missing. */
zoff_status zoff_plan_read_bench(const char *path, zoff_dtype dtype, zoff_plan_machine *m);

/* ---- one setting ---- */
typedef struct zoff_plan_setting {
    int stage;                        /* zero_optimization.stage 0..3 */
    zoff_offload_device offload;      /* zero_optimization.offload_optimizer.device */
    zoff_offload_device param_offload;/* zero_optimization.offload_param.device (stage 3 only) */
    double ratio;                     /* offload_optimizer.ratio: fraction of the update on the host */
    bool ratio_auto;                  /* "ratio": "auto" */
    bool pin_memory;                  /* offload_optimizer.pin_memory */
    bool param_pin_memory;            /* offload_param.pin_memory: its swap buffers and resident part
                                         (offload_param nvme); false in the grid's pageable variant */
    int64_t sub_group_size;
    bool bf16_states;                 /* bf16.bf16_optimizer_states: the host optimizer's m and v in bf16
                                         (zoff_optimizer_state_dtype); a numerics change when the config
                                         did not ask for it */
} zoff_plan_setting;

/* The setting a config describes (legacy cpu_offload counts as offload "cpu"). */
void zoff_plan_setting_from_config(const zoff_config *cfg, zoff_plan_setting *out);
/* nvme grid rows with ratio 0 or 1 get at least this many sub-groups when the config's
 * sub_group_size gives fewer (with one, the swap buffers would hold the whole state). */
#define ZOFF_PLAN_MIN_SUBGROUPS 16
/* Whether a row's setting uses another sub_group_size than the config (the grid's nvme rows at
 * ratio 0 or 1 split the state into at least 16 sub-groups): the one test the text table's mark,
 * the JSON row's "sub_group_size_changed" and zoff_plan_config_json (which then writes it) use. */
bool zoff_plan_changes_sub_group_size(const zoff_config *base, const zoff_plan_setting *s);

/* Bytes per rank. Each total is the sum of the parts above it. */
typedef struct zoff_plan_memory {
    /* device */
    size_t params16;          /* the model's parameter buffer (stage 3: the engine's weight partition) */
    size_t grads16;           /* the model's gradient buffer (stage 3: the engine's gradient partition) */
    size_t activations;
    size_t tokens;            /* the training loop's input and target token buffers */
    size_t comm_buffers;      /* engine, ranks > 1 or stage 3: reduce-scatter (and round-robin packing) buffers */
    size_t gathered;          /* stage 3: persistent groups and the pool of gathered weights and gradient buffers */
    size_t device_optimizer;  /* engine: fp32 master (16-bit models), m, v of device sub-groups + statistics */
    size_t runtime_reserve;   /* CUDA context, cuBLASLt workspaces, scratch (estimate) */
    /* host: of these, host_pinned is pinned (pin_memory: the buffers device copies use), the rest pageable */
    size_t host_optimizer;    /* engine: fp32 master, m, v of host sub-groups in host memory (cpu offload) */
    size_t host_grads;        /* engine: gradient partition(s) in the model dtype */
    size_t host_staging;      /* engine: separate weight staging (speculation, stage 3 offload_param cpu,
                                 fp32 with nvme; otherwise the gradient buffer carries the weights) */
    size_t host_spec_backup;  /* engine, super_offload: the rollback copy of master, m, v (pageable host memory) */
    size_t swap_buffers;      /* nvme: the swapper's buffers for the optimizer state and its header */
    size_t swap_pinned;       /* ... of which pinned (offload_optimizer.pin_memory: the buffers; the rest is pageable) */
    size_t param_buffers;     /* stage 3, offload_param nvme: pinned parameter swap buffers */
    size_t host_params;       /* stage 3, offload_param cpu: this rank's 16-bit parameter partition */
    size_t host_pinned;       /* engine: the pinned part of host_optimizer + host_grads + host_staging
                                 (zoff_placement_host_buffers: gradients, staging, a master the device reads) */
    size_t model_pinned;      /* the model's pinned loss buffer */
    size_t loop_pageable;     /* the training loop: the checkpoint save's buffer, token buffers */
    /* disk */
    size_t disk_optimizer;    /* nvme: fp32 master, m, v */
    size_t disk_params;       /* stage 3, offload_param nvme: 16-bit parameter partition */
    size_t checkpoint;        /* zoff train's checkpoint, all ranks' .zckpt files (zoff_train_ckpt_bytes, without
                                 the COMPLETE marker; not in the totals: it goes to --save, which this plan does not know) */
    const char *checkpoint_bound; /* NULL: that figure is exact; "at least" / "at most" (zoff_train_ckpt_bytes) */
    size_t snapshot;          /* a background save's whole snapshot arena (zoff_placement_snapshot_bytes, as
                                 zoff_engine_snapshot_bytes; not in the totals: a save takes what is left) */
    size_t snapshot_copy;     /* ... of which the copy of a device share (zoff_engine_snapshot_min_bytes) */
    /* totals per rank */
    size_t device, pinned, pageable, disk;
} zoff_plan_memory;

/* Predicted seconds per optimizer step (one accumulation window), per rank. */
typedef struct zoff_plan_time {
    double compute;       /* forward + backward of all micro-batches (incl. recomputation, stage-3 fetches) */
    double grads_out;     /* D2H of the host part's gradients not hidden behind the boundary backward */
    double comm;          /* collectives not hidden (ranks > 1) */
    double host_optim;    /* host optimizer (nvme: the read | update | write pipeline) */
    double device_optim;  /* device optimizer (runs concurrently with the host part) */
    double weights_in;    /* H2D of new weights not hidden behind the host optimizer */
    double forward_overlap; /* the pipelined exact step (src/zero/engine.c pipe_setup): the next step's first
                               forward, run while the host optimizer updates (0: not pipelined) */
    double step;          /* the predicted step time */
} zoff_plan_time;

typedef struct zoff_plan_row {
    zoff_plan_setting setting;
    int64_t partition_params;   /* parameters whose optimizer state this rank owns */
    int64_t host_params, device_params; /* of the partition: on the host (cpu/nvme) / on the device */
    double host_ratio;          /* host_params / partition_params after rounding to whole sub-groups (and auto) */
    int num_subgroups;
    bool auto_failed;           /* ratio auto: the engine would refuse (the model alone fills the budget) */
    bool bad_config;            /* the setting is a configuration error with this config (e.g. nvme buffer_count) */
    bool ratio_fitted;          /* the grid's smallest ratio whose device bytes fit with the margin */
    zoff_plan_memory mem;
    zoff_plan_time time;
    size_t host_use;            /* per node: host memory this setting uses (CPU backend: device memory too) */
    bool fits_device, fits_pinned, fits_host, fits_disk, fits;
    bool runnable;              /* this version of zoff can run it (zoff_config_check_supported and the engine's rules) */
    /* zoff train's periodic saves with --save-snapshot-memory auto: the snapshot's budget (half the host memory this
     * setting leaves, zoff_placement_snapshot_auto_budget; < 0: none, super_offload), and whether they run in the
     * background (zoff_train_ckpt_background_rule; else saves_why says why training waits for each) */
    int64_t snapshot_budget;
    bool background_saves;
    char saves_why[320];
    char why[320];              /* what does not fit, or why it is not runnable ("" when it fits and runs) */
} zoff_plan_row;

typedef struct zoff_plan_inputs {
    const zoff_config *cfg;     /* the base config (batch resolved for machine.ranks) */
    zoff_gpt2_options model;    /* shape, micro-batch (batch_size), seq_len, dtype, checkpointing */
    zoff_plan_machine machine;
} zoff_plan_inputs;

/* Predict one setting. */
zoff_status zoff_plan_evaluate(const zoff_plan_inputs *in, const zoff_plan_setting *s, zoff_plan_row *out);

typedef struct zoff_plan {
    zoff_plan_model_bytes model;
    zoff_plan_row *rows;
    int nrows;
    int best;        /* fastest row that fits and runs; -1 when none */
    int best_any;    /* fastest row that fits, runnable or not; -1 when none */
} zoff_plan;

/* The grid: stage 0 without offload; stages 1-3 x offload none / cpu / nvme,
 * and for cpu and nvme each of ratios[0..nratios) (ratios NULL: 0, 0.25, 0.5,
 * 0.75, 1), the smallest ratio that fits the device with the margin (when the
 * device has a size and that ratio is strictly between 0 and 1), and "auto".
 * Stage 3 rows keep the config's offload_param; when it is none, the ratio-1
 * rows of cpu and nvme are followed by the same setting with offload_param on
 * that device (ZeRO-Infinity). A row whose pinned bytes exceed the
 * pinned limit is followed by the same setting with pin_memory false. Ties in
 * predicted time (within 2%) go to the config's own stage, then less memory,
 * then stage 2, 0, 1, 3. */
zoff_status zoff_plan_build(const zoff_plan_inputs *in, const double *ratios, int nratios, zoff_plan *out);
void zoff_plan_free(zoff_plan *p);

/* The base config's JSON with the setting of `row` applied to zero_optimization
 * (stage, offload_optimizer device / ratio / pin_memory / nvme_path, offload_param,
 * sub_group_size), every other key kept. nvme_path (NULL or "": ".") is the nvme rows'
 * swap-file folder where the base names none; with replace_nvme_path (zoff plan
 * --nvme-path, the folder the plan measured) also where it names one, for both swap files.
 * The result loads with zoff_config_load_string. *out is malloc'd. */
zoff_status zoff_plan_config_json(const zoff_config *base, const zoff_plan_row *row, const char *nvme_path,
                                  bool replace_nvme_path, char **out);
/* Write text to path atomically: a temporary file in the same directory,
 * fsync, rename, fsync of the directory. */
zoff_status zoff_plan_write_file_atomic(const char *path, const char *text);

/* ---- DeepSpeed's published estimators, for comparison (docs/plan.md) ----
 * deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs and
 * deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs, with
 * additional_buffer_factor 1.5, for the Hugging Face GPT-2 of this shape
 * (unpadded vocabulary, tied lm_head counted once). Bytes; "cpu" is per node. */
typedef struct zoff_plan_deepspeed {
    int64_t total_params, largest_layer_params;
    double z2_offload_gpu, z2_offload_cpu;   /* offload_optimizer cpu */
    double z2_none_gpu, z2_none_cpu;         /* no offload */
    double z3_both_gpu, z3_both_cpu;         /* offload_param cpu + offload_optimizer cpu, zero_init */
    double z3_opt_gpu, z3_opt_cpu;           /* offload_optimizer cpu, zero_init */
    double z3_none_gpu, z3_none_cpu;         /* no offload, zero_init */
} zoff_plan_deepspeed;
void zoff_plan_deepspeed_estimate(const zoff_gpt2_shape *shape, int gpus_per_node, int nodes, zoff_plan_deepspeed *out);

/* Names for output. */
const char *zoff_plan_offload_name(zoff_offload_device d);

#ifdef __cplusplus
}
#endif
#endif
