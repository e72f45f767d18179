/* zoff config: DeepSpeed's JSON config -> one validated zoff_config.
 *
 * A user's existing DeepSpeed file works unchanged. A key zoff does not know,
 * a value of the wrong type or out of range, or a contradiction is an error
 * (ZOFF_ERR_CONFIG) whose message names the key path (e.g.
 * "zero_optimization.offload_optimizer.device"), the value and what is allowed.
 * Defaults are DeepSpeed's.
 *
 * Every key zoff accepts is in one of three classes (docs/config.md lists them all):
 * implemented (zoff honours the value); accepted with no effect in zoff by design
 * (the key concerns something zoff does not have or does another way, so the value
 * cannot change training; zoff logs these keys at load); and valid DeepSpeed that
 * zoff does not implement yet, accepted at DeepSpeed's default (or with the feature
 * off) and otherwise refused by zoff_config_check_supported, naming key and value.
 * Hugging Face Trainer "auto" values are an error naming every such key, except
 * where zoff implements "auto" (offload_optimizer.ratio). */
#ifndef ZOFF_CONFIG_H
#define ZOFF_CONFIG_H

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zoff_optimizer_type {
    ZOFF_OPTIM_ADAM = 0,  /* "Adam": adam_w_mode defaults to true in DeepSpeed's fused/CPU Adam */
    ZOFF_OPTIM_ADAMW,     /* "AdamW": always decoupled weight decay */
    ZOFF_OPTIM_ADAGRAD,
    ZOFF_OPTIM_LION
} zoff_optimizer_type;

typedef enum zoff_scheduler_type {
    ZOFF_SCHED_NONE = 0,        /* constant lr */
    ZOFF_SCHED_WARMUP_LR,       /* "WarmupLR" */
    ZOFF_SCHED_WARMUP_DECAY_LR, /* "WarmupDecayLR" */
    ZOFF_SCHED_WARMUP_COSINE_LR, /* "WarmupCosineLR" */
    ZOFF_SCHED_ONE_CYCLE,        /* "OneCycle" */
    ZOFF_SCHED_LR_RANGE_TEST     /* "LRRangeTest" */
} zoff_scheduler_type;

typedef enum zoff_warmup_type { ZOFF_WARMUP_LOG = 0, ZOFF_WARMUP_LINEAR } zoff_warmup_type;

typedef enum zoff_offload_device { ZOFF_OFFLOAD_NONE = 0, ZOFF_OFFLOAD_CPU, ZOFF_OFFLOAD_NVME } zoff_offload_device;

typedef struct zoff_optimizer_config {
    zoff_optimizer_type type;
    double lr;              /* default 1e-3 (Adagrad: 1e-2) */
    double beta1, beta2;    /* betas, default [0.9, 0.999] */
    double eps;             /* default 1e-8 (Adagrad: 1e-10) */
    double weight_decay;    /* default 0 (Adam/AdamW: DeepSpeed default 0.0; Lion 0) */
    bool adam_w_mode;       /* default true */
    bool bias_correction;   /* default true */
    bool torch_adam;        /* accepted for compatibility; no effect (zoff has one Adam) */
    double initial_accumulator_value; /* Adagrad, default 0 */
} zoff_optimizer_config;

typedef struct zoff_scheduler_config {
    zoff_scheduler_type type;
    /* WarmupLR / WarmupDecayLR */
    double warmup_min_lr;      /* default 0 */
    double warmup_max_lr;      /* default 0.001 (WarmupDecayLR); see warmup_max_lr_given */
    /* false when the key is absent: WarmupLR then warms up to the optimizer's lr
     * (DeepSpeed 0.19: warmup_max_lr=None), WarmupDecayLR to 0.001. */
    bool warmup_max_lr_given;
    int64_t warmup_num_steps;  /* default 1000; >= 1 (the schedule uses max(2, n) as DeepSpeed does) */
    zoff_warmup_type warmup_type; /* default log */
    int64_t total_num_steps;   /* WarmupDecayLR, WarmupCosineLR: required (0 = not given) */
    /* WarmupCosineLR */
    double warmup_min_ratio;   /* default 0 */
    double cos_min_ratio;      /* default 0.0001 */
    /* OneCycle (DeepSpeed's OneCycle: the lr, and the momentum inversely, over one cycle, then decay) */
    double cycle_min_lr, cycle_max_lr; /* required */
    double decay_lr_rate;      /* default 0 (no decay after the cycle) */
    int64_t cycle_first_step_size;  /* default 2000 */
    int64_t cycle_second_step_size; /* default -1: cycle_first_step_size */
    /* stairs: the lr and momentum held flat over each of that many steps of the half cycle */
    int64_t cycle_first_stair_count;  /* default 0: continuous */
    int64_t cycle_second_stair_count; /* default -1: cycle_first_stair_count */
    int64_t decay_step_size;   /* default 0: no decay */
    bool cycle_momentum;       /* default true: beta1 cycles between the moms below, beta2 is 0.99 (as
                                  DeepSpeed sets it); not for Adagrad, which has no betas */
    double cycle_min_mom, cycle_max_mom; /* defaults 0.8, 0.9 */
    double decay_mom_rate;     /* default 0 */
    /* LRRangeTest */
    double lr_range_test_min_lr;   /* default 0.001 */
    int64_t lr_range_test_step_size; /* default 2000 */
    double lr_range_test_step_rate;  /* default 1.0 */
    bool lr_range_test_staircase;    /* default false */
} zoff_scheduler_config;

typedef struct zoff_fp16_config {
    bool enabled;
    double loss_scale;          /* 0 = dynamic (default) */
    int initial_scale_power;    /* default 16 */
    int loss_scale_window;      /* default 1000 */
    int hysteresis;             /* default 2 */
    bool consecutive_hysteresis;/* default false */
    double min_loss_scale;      /* default 1 */
} zoff_fp16_config;

typedef struct zoff_offload_optimizer_config {
    zoff_offload_device device; /* "none" (default), "cpu", "nvme" */
    char nvme_path[4096];
    bool pin_memory;            /* default true (DeepSpeed 0.19; older releases: false) */
    int64_t buffer_count;       /* default 4 */
    bool pipeline_read, pipeline_write; /* default false */
    bool fast_init;             /* default false */
    double ratio;               /* default 1.0: fraction of the update on the host (Twin-Flow) */
    bool ratio_auto;            /* "ratio": "auto" */
    bool super_offload;         /* default false: speculation-then-validation (SuperOffload), docs/architecture.md */
    double cpuadam_cores_perc;  /* share of the logical cores for the host optimizer's threads, [0, 1]
                                   (zoff_host_optimizer_threads_for_share); default -1: not given
                                   ($ZOFF_THREADS, $OMP_NUM_THREADS or all cores) */
} zoff_offload_optimizer_config;

typedef struct zoff_offload_param_config {
    zoff_offload_device device; /* "none" (default), "cpu", "nvme" */
    char nvme_path[4096];
    bool pin_memory;            /* default true (DeepSpeed 0.19; older releases: false) */
    int64_t buffer_count;       /* default 5 */
    int64_t buffer_size;        /* default 1e8 */
    int64_t max_in_cpu;         /* default 1e9 */
} zoff_offload_param_config;

/* zero_optimization.zoff_grad_buckets (a zoff extension; zoff_placement_grad_buckets is the rule). */
typedef enum zoff_grad_buckets_mode {
    ZOFF_GRAD_BUCKETS_OFF = 0, /* false: the full device gradient buffer everywhere */
    ZOFF_GRAD_BUCKETS_ON = 1,  /* true (default): buckets where they add no transfers (accumulation 1) */
    ZOFF_GRAD_BUCKETS_ALWAYS = 2, /* "always": also with gradient accumulation; the micro-batches' sum
                                     lives in the host's 16-bit gradient buffer and goes through the
                                     buckets (back to the device before each later micro-batch's backward) */
} zoff_grad_buckets_mode;

typedef struct zoff_zero_config {
    int stage;                        /* 0..3, default 0 */
    bool contiguous_gradients;        /* default true */
    bool overlap_comm;                /* default false (stage 3: true) */
    bool reduce_scatter;              /* default true */
    bool allgather_partitions;        /* default true */
    int64_t reduce_bucket_size;       /* default 5e8 */
    int64_t allgather_bucket_size;    /* default 5e8 */
    int64_t sub_group_size;           /* default 1e9 */
    bool round_robin_gradients;       /* default false */
    bool cpu_offload;                 /* legacy key: same as offload_optimizer.device = "cpu" */
    int64_t stage3_prefetch_bucket_size;       /* default 5e7 */
    int64_t stage3_param_persistence_threshold;/* default 1e5 */
    int64_t stage3_max_live_parameters;        /* default 1e9 */
    int64_t stage3_max_reuse_distance;         /* default 1e9 */
    bool stage3_gather_16bit_weights_on_model_save; /* default false */
    bool elastic_checkpoint;          /* accepted; no effect */
    /* zoff extension: ZeRO-Offload's delayed parameter update (one-step delay). */
    bool delayed_param_update;        /* "zoff_delayed_param_update", default false */
    zoff_grad_buckets_mode grad_buckets; /* "zoff_grad_buckets": true (default), false or "always": bounded
                                         device gradient buckets under optimizer offload
                                         (zoff_placement_grad_buckets) */
    int64_t delayed_param_update_warmup; /* "zoff_delayed_param_update_warmup", default 10 */
    zoff_offload_optimizer_config offload_optimizer;
    zoff_offload_param_config offload_param;
} zoff_zero_config;

typedef struct zoff_aio_config {
    int64_t block_size;           /* default 1048576 */
    int64_t queue_depth;          /* default 8 */
    int64_t intra_op_parallelism; /* default 1; older name "thread_count" */
    bool single_submit;           /* default false */
    bool overlap_events;          /* default true */
} zoff_aio_config;

/* The "model" section (zoff's own; Megatron-style flags override it). 0 = unset. */
typedef struct zoff_model_config {
    int64_t num_layers, hidden_size, num_attention_heads, seq_length, vocab_size, max_position_embeddings;
} zoff_model_config;

/* "tensorboard" and "csv_monitor": DeepSpeed's monitors (rank 0 writes OUTPUT_PATH/JOB_NAME/). */
typedef struct zoff_monitor_config {
    bool enabled;            /* default false */
    char output_path[4096];  /* default "" (the working directory) */
    char job_name[256];      /* default "DeepSpeedJobName" */
} zoff_monitor_config;

typedef struct zoff_config {
    /* batch: as given (0 = not given) and resolved by zoff_config_resolve_batch */
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    zoff_optimizer_config optimizer;
    bool optimizer_given;
    zoff_scheduler_config scheduler;
    double gradient_clipping;     /* max global norm; 0 = off. Default 1.0 (DeepSpeed 0.19; older releases: 0) */
    zoff_fp16_config fp16;
    bool bf16_enabled;            /* "bf16": {"enabled": true}; "bfloat16" is accepted as an alias */
    bool grad_accum_dtype_given;  /* data_types.grad_accum_dtype given (not null): the training dtype */
    bool bf16_optimizer_states;   /* "bf16": {"bf16_optimizer_states": true}: the host optimizer keeps
                                     exp_avg / exp_avg_sq in bf16 (zoff_optimizer_state_dtype) */
    int64_t steps_per_print;      /* default 10 */
    bool wall_clock_breakdown;    /* default false */
    bool prescale_gradients;      /* default false */
    double gradient_predivide_factor; /* default 1 */
    zoff_zero_config zero;
    zoff_aio_config aio;
    zoff_model_config model;
    zoff_monitor_config tensorboard, csv_monitor;
    char *source;                 /* the JSON text as given (owned; NULL for defaults) */
    char *source_name;            /* the file name (or load_string's source_name) for messages (owned; NULL for defaults) */
    /* Keys given that have no effect in zoff (accepted by design, or a not-implemented
     * feature at its default / off), ", "-separated, as logged at load (owned; NULL if none). */
    char *no_effect;
    /* Settings given that are valid DeepSpeed but not implemented in zoff, "; "-separated
     * as "key value (hint)"; zoff_config_check_supported refuses them (owned; NULL if none). */
    char *unsupported;
} zoff_config;

/* Fill DeepSpeed's defaults (no file). */
void zoff_config_defaults(zoff_config *cfg);
/* DeepSpeed's names: "Adam", "AdamW", "Adagrad", "Lion"; "WarmupLR", ... ("none" for ZOFF_SCHED_NONE). */
const char *zoff_optimizer_name(zoff_optimizer_type t);
const char *zoff_scheduler_name(zoff_scheduler_type t);
/* Parse and validate a DeepSpeed JSON file. cfg need not be initialised; what it
 * held before is overwritten, not freed (zoff_config_free it first). On error cfg
 * is left at the defaults, owning nothing. Every error is ZOFF_ERR_CONFIG (zoff exits 2),
 * a path that is missing, a directory or unreadable included; ZOFF_ERR_IO only when reading
 * an opened file fails. */
zoff_status zoff_config_load_file(const char *path, zoff_config *cfg);
/* Same, from a string; `source_name` names it in messages. */
zoff_status zoff_config_load_string(const char *json, const char *source_name, zoff_config *cfg);
/* DeepSpeed's batch relation: train_batch_size = micro * accum * world_size.
 * Any two give the third; all three must agree; with only one given the others
 * default as DeepSpeed does (micro only: accum 1; global only: accum 1, micro = global / world);
 * neither train_batch_size nor micro given is an error, as in DeepSpeed. Overwrites the
 * three fields with the resolved values (calling it again with the same world size is a no-op). */
zoff_status zoff_config_resolve_batch(zoff_config *cfg, int world_size);
/* Settings that parse and validate but that this version of zoff does not
 * implement yet: an error (ZOFF_ERR_UNSUPPORTED) naming the key, not silently ignored. */
zoff_status zoff_config_check_supported(const zoff_config *cfg);
void zoff_config_free(zoff_config *cfg);

/* The key tables, for documentation and tests. */
typedef enum zoff_config_key_class {
    ZOFF_KEY_IMPLEMENTED = 0, /* zoff honours the value */
    ZOFF_KEY_NO_EFFECT,       /* accepted; no effect in zoff by design (note: why) */
    ZOFF_KEY_NOT_IMPLEMENTED  /* valid DeepSpeed; accepted at DeepSpeed's default or with the feature off,
                                 any other value refused by zoff_config_check_supported (note: hint) */
} zoff_config_key_class;

typedef struct zoff_config_key {
    const char *path;     /* e.g. "zero_optimization.offload_optimizer.ratio" (valid during the call only) */
    zoff_config_key_class cls;
    const char *alias_of; /* the key of the same object this is another name for, or NULL */
    const char *note;     /* the reason, hint or extra words, or NULL */
    const char *dflt;     /* not implemented: the one value accepted, DeepSpeed's default, as JSON; else NULL */
    const char *on_key;   /* the section of a feature: the key that turns it on ("enabled"), or NULL when
                             anything in it does (the section is accepted only empty) */
} zoff_config_key;

/* Calls fn for every key zoff accepts (the keys of objects, not the objects), in table
 * order. The section of a DeepSpeed feature zoff does not implement (e.g. "elasticity",
 * accepted while off) is one key: the keys inside it are not checked while it is off. */
void zoff_config_foreach_key(void (*fn)(const zoff_config_key *key, void *ctx), void *ctx);

#ifdef __cplusplus
}
#endif
#endif
