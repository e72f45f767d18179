/* zoff engine (src/zero): owns the optimizer side of training.
 *
 * The model hands the engine a flat parameter buffer and a flat gradient
 * buffer on the device (or, with gradient buckets, asks it for each layer
 * group's gradient buffer: zoff_engine_grad_acquire) plus a tensor table
 * (zoff_tensor_info); during backward
 * it reports finished gradient ranges through zoff_engine_grad_ready. The
 * engine keeps the fp32 master weights and optimizer state (where they live is
 * the configuration's choice: device, host, disk), and at each accumulation
 * boundary checks gradients, clips, steps the optimizer and writes the new
 * weights back into the model's parameter buffer. It never knows which model
 * it trains. */
#ifndef ZOFF_ENGINE_H
#define ZOFF_ENGINE_H

#include "zoff/comm.h"
#include "zoff/config.h"
#include "zoff/device.h"
#include "zoff/optim.h"
#include "zoff/param_space.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zoff_engine zoff_engine;

typedef struct zoff_engine_options {
    zoff_device *dev;
    const zoff_config *cfg;
    const zoff_tensor_info *tensors;
    int num_tensors;
    int64_t num_params;
    void *params;        /* device, num_params of dtype: the weights forward/backward use (NULL: stage 3) */
    void *grads;         /* device, num_params of dtype: backward accumulates here (NULL: stage 3, or
                            gradient buckets where zoff_placement_grad_buckets allows them) */
    zoff_dtype dtype;    /* F32, BF16 or F16 */
    const float *init_params; /* host fp32, num_params: initial master weights (or init_range) */
    /* Instead of init_params (no whole-model buffer): fills dst with the initial fp32 weights
     * of the model range [lo, hi). The engine calls it on each host sub-group's master range
     * directly and, for the device's part, through a bounded piece buffer, so it must give the
     * same values for any split of the range (zoff_gpt2_init_params_range does). */
    zoff_status (*init_range)(void *arg, int64_t lo, int64_t hi, float *dst);
    void *init_arg;
    /* Data parallel (NULL = one rank): the job's communicator, not owned; it must
     * outlive the engine. With N > 1 ranks create is collective (it checks that
     * every rank has the same configuration and tensor table, and dups comm), as
     * are zoff_engine_step, zoff_engine_sync_params, zoff_engine_flush, setting
     * state 0 and zoff_engine_state_gather: every rank calls them in the same
     * order. See "data parallel" below. */
    zoff_comm *comm;
    /* Record when the gradient stream reduces and copies each range the model
     * reports during the boundary backward (zoff_engine_grad_timeline). */
    bool timeline;
    /* The model calls zoff_engine_wait_weights before its forward reads each parameter
     * group (zoff_gpt2_set_weight_wait). Then, with stages 1-2 and the optimizer
     * state in host memory (several ranks: not with the delayed update), the step is
     * pipelined: zoff_engine_step returns after the gradient statistics, the host
     * update runs on the engine's worker thread in forward order, each sub-group's new
     * weights are copied to the device as soon as they are written (several ranks:
     * each layer group is then all-gathered, groups in forward order), and the next
     * forward waits for each group's weights only (no device-wide wait). */
    bool weight_waits;
    /* bf16.bf16_optimizer_states: how the host optimizer rounds m and v into bf16
     * (default stochastic; nearest for tests that follow DeepSpeed's arithmetic). */
    zoff_state_rounding state_rounding;
} zoff_engine_options;

/* Result of one optimizer step (one accumulation boundary). Times in seconds. */
typedef struct zoff_step_info {
    double grad_norm;    /* global L2 norm of the unscaled gradient, before clipping */
    double loss_scale;   /* loss scale used for this step's gradients */
    bool skipped;        /* gradients had inf/NaN: the update was skipped */
    double t_step;       /* wall time in zoff_engine_step */
    double t_wait_grads; /* waiting for the gradient statistics and the last gradient copies */
    double t_host;       /* host optimizer time on the step's critical path (delayed update: waiting for it) */
    double t_host_work;  /* host optimizer compute time (delayed update, pipelined step: the job that finished
                            during this step, i.e. the previous step's) */
    double t_device;     /* issuing the device optimizer (Twin-Flow / no offload) */
    double t_wait_device;/* waiting for the device optimizer after the host part was done (Twin-Flow) */
    double t_wait_weights; /* waiting for the last new weights to reach the device */
    bool rolled_back;    /* super_offload: the speculative update was undone (clipping, overflow, another lr) */
    int64_t rollbacks;   /* super_offload: rollbacks so far */
} zoff_step_info;

/* Where the engine keeps its memory, in bytes (for the memory report and zoff plan). */
typedef struct zoff_engine_memory {
    size_t device;       /* optimizer state and buffers the engine allocated on the device */
    size_t pinned;       /* pinned host memory the engine allocated */
    size_t pageable;     /* pageable host memory the engine allocated */
    int64_t host_params; /* parameters whose optimizer state and update live on the host */
    int64_t device_params;
    int num_subgroups;
    double host_ratio;   /* fraction of parameters on the host (chosen by "auto" or given) */
    size_t nvme;         /* bytes of the NVMe swap file (offload_optimizer.device "nvme"; the host
                            sub-groups' fp32 state, which then is not in pinned/pageable) */
} zoff_engine_memory;

/* ---- placement (src/zero/placement.c): where the optimizer's partition lives.
 * Pure functions, called by the engine and by zoff plan, so that the two agree
 * to the element. The flat space [0, n) is cut at multiples of sub_group_size
 * (finer, in multiples of 64 and into at least 32 pieces, when a fractional
 * ratio needs it) and at the given cuts: where a layer group starts (the runs of
 * equal `layer` in the tensor table) when zoff_placement_layer_cuts says so, so
 * that a sub-group's gradients are final when one group's backward is done and
 * its new weights are what one group's forward needs; with several ranks, where
 * the partition's pieces end (each sub-group one model range). The host takes
 * whole sub-groups from the top (their gradients arrive first) until it holds
 * at least ceil(ratio * n) elements. */
typedef struct zoff_placement_input {
    int64_t n;               /* elements of this rank's optimizer space */
    int64_t sub_group_size;  /* zero_optimization.sub_group_size (<= 0: n) */
    double ratio;            /* host fraction in [0, 1] */
    const int64_t *cuts;     /* increasing offsets in (0, n) where a sub-group must end */
    int ncuts;
} zoff_placement_input;
typedef struct zoff_subgroup_place {
    int64_t offset, count;
    bool on_host;
} zoff_subgroup_place;
typedef struct zoff_placement {
    zoff_subgroup_place *sg; /* in flat order (owned: zoff_placement_free) */
    int nsg;
    int host_groups;         /* sub-groups on the host */
    int64_t host, device;    /* elements */
    int64_t grid;            /* the sub-group size used */
    int64_t largest_host;    /* elements of the largest host sub-group */
} zoff_placement;
zoff_status zoff_placement_build(const zoff_placement_input *in, zoff_placement *out);
void zoff_placement_free(zoff_placement *p);
/* Whether the sub-groups are cut at the layer groups: stages 0-2, the state in host
 * memory (offload_optimizer.device not "nvme"), with any number of ranks (world is
 * kept for the callers; several ranks cut each partition piece at the groups it meets). */
bool zoff_placement_layer_cuts(int world, int stage, bool nvme);
/* Whether the engine runs the pipelined step (the host update in forward order, the next forward
 * waiting per layer group) for a run whose host has part of the update and whose model waits per
 * group: the sub-groups cut at the layer groups, not stage 3, and with several ranks neither
 * stage 0 (replicated) nor the delayed update. The engine and zoff plan's step model ask it. */
bool zoff_placement_pipelined(int world, int stage, bool nvme, bool delayed);
/* "ratio": "auto": the smallest host fraction for which the device-side optimizer
 * state fits in what the device budget leaves after what is in use (the model's
 * weights, gradients, activations, the data-parallel buffers) and a margin of 5%
 * of the budget. budget 0 (no budget): ratio 0. fits false: not even ratio 1. */
typedef struct zoff_auto_ratio {
    size_t budget, in_use, margin, free_bytes, per_param;
    int64_t max_device;
    double ratio;
    bool fits;
} zoff_auto_ratio;
void zoff_placement_auto_ratio(size_t budget, size_t in_use, size_t engine_fixed, size_t grad_per_param, int64_t n,
                               zoff_dtype dtype, zoff_auto_ratio *out);

/* Device gradient storage under optimizer offload. Whether the engine gives the model its
 * gradient buffers group by group (zoff_grad_hooks: the model is created with
 * external_grads and holds no flat gradient buffer) instead of taking the model's full
 * one: stage 1 or 2, offload_optimizer.device "cpu" or "nvme" (a group's bucket goes to whichever
 * host sub-groups it meets; the device sub-groups' buffer ends at a group's end),
 * zero_optimization.zoff_grad_buckets true (the default) or "always", and
 * - one rank: gradient_accumulation_steps 1, or any with "always" (the earlier micro-batches'
 *   sum then lives in the host's 16-bit gradient buffer: each later micro-batch's bucket
 *   starts from it, copied back to the device, and every micro-batch's bucket goes to the host);
 * - several ranks: every group gets a bucket, reduced over the ranks; this rank's host pieces go
 *   to the host, its device pieces (Twin-Flow) to a compact device buffer (none when the buckets
 *   are flat and there is no accumulation: read where they are). gradient_accumulation_steps 1,
 *   or any with "always" (every micro-batch reduced; this rank's pieces of the sum on the host
 *   and in the compact buffer, each later micro-batch's bucket starting from them).
 * The one rule: the trainer, the engine and zoff plan ask it. */
bool zoff_placement_grad_buckets(const zoff_config *cfg);
/* The same rule from its inputs (zoff plan's rows vary stage and offload): zoff_grad_buckets,
 * stage, offload_optimizer.device, gradient_accumulation_steps (any number of ranks). */
bool zoff_placement_grad_buckets_for(zoff_grad_buckets_mode mode, int stage, zoff_offload_device optimizer,
                                     int64_t accumulation);
/* Why the rule says no (NULL where it says yes): a phrase for the log, naming the setting. */
const char *zoff_placement_grad_buckets_why_not(zoff_grad_buckets_mode mode, int stage, zoff_offload_device optimizer,
                                                int64_t accumulation);
const char *zoff_placement_grad_buckets_why(const zoff_config *cfg);
/* Speculation's row-sparse report of the tied embedding's gradient (zoff_engine_uses_grad_rows; the
 * model then keeps a pinned host copy of the tokens): one rank, stages 1-2 (stage 3's gradients reach
 * the host only after each group's reduction into the partition). */
bool zoff_placement_grad_rows(bool speculate, int world, int stage);
/* The device gradient bytes with buckets. The layer groups (runs of equal `layer`, in flat
 * order; the first one, GPT-2's embeddings, is held from the lm head to the end of backward)
 * split into the device sub-groups' (the bottom [0, device): one buffer, accumulated, read by
 * the device optimizer) and the host sub-groups' (written into a bucket, copied to the host
 * after the group's grad-ready, the bucket reused once that copy is done). The first group,
 * when on the host, has a bucket of its own; the others share a ring of nslots buckets of the
 * largest host one: reduce_bucket_size elements in whole buckets, at least 2 (copies overlap
 * compute); when that is as many as such groups, each its own bucket of its exact size
 * (flat). A group that `device` cuts (a fractional
 * ratio's sub-groups can be finer than the groups) is all in the device buffer, its host
 * part copied from there. stats: the gradient statistics, 2 floats per
 * layer group (the engine allocates them with or without buckets). */
typedef struct zoff_grad_device_in {
    const int64_t *group_count; /* elements of each layer group, in flat order */
    int ngroups;
    int64_t device;             /* elements of the device sub-groups: [0, device) (spread: anywhere) */
    int64_t reduce_bucket_size; /* zero_optimization.reduce_bucket_size (elements) */
    zoff_dtype dtype;
    bool spread;                /* several ranks: every group gets a bucket (each is reduced over the ranks);
                                   this rank's device sub-groups' gradients are copied out of it into a
                                   compact buffer until the step, or, flat, read where they are */
    bool accumulate;            /* spread, gradient_accumulation_steps > 1: the compact buffer holds the device
                                   pieces' sum from one micro-batch to the next, flat or not */
} zoff_grad_device_in;
typedef struct zoff_grad_device {
    int64_t device;  /* elements of the device buffer: the device sub-groups', to the end of their last group */
    int64_t held;    /* elements of the first group's bucket (0: on the device) */
    int64_t slot;    /* elements of one ring bucket (0 when flat) */
    int nslots;      /* ring buckets (0: no host group after the first) */
    bool flat;       /* reduce_bucket_size holds every such group: one bucket each, of its exact size, in
                        flat order (no reuse; the bytes of a full buffer, never more) */
    int64_t ring;    /* elements of the ring: nslots x slot, or (flat) the groups' sum */
    int64_t compact; /* spread, not flat: the device sub-groups' gradients (in.device elements) */
    size_t bytes;    /* device + held + ring + compact, in the model's dtype */
} zoff_grad_device;
void zoff_placement_grad_device(const zoff_grad_device_in *in, zoff_grad_device *out);
/* The gradient statistics' device bytes: 2 floats per layer group. */
size_t zoff_placement_stats_bytes(int ngroups);
/* What "auto" adds to the device state per parameter: the engine's fixed device bytes (the
 * statistics and, with buckets (in != NULL; its `device` ignored), the ring and the first
 * group's bucket, reserved although the device may end up holding that group) and, with
 * buckets, the device gradient of each device parameter. */
void zoff_placement_auto_engine_bytes(const zoff_grad_device_in *in, int ngroups, size_t *fixed, size_t *per_param);
/* Stage 3's gathered parameter groups at their high-water mark (device bytes, es per element): the
 * groups are the first (embeddings), mid_count groups of at most mid elements, the last. Groups of
 * at most persistence_threshold elements stay gathered; the others are gathered into pooled buffers
 * of their size. In backward every group also takes a gradient buffer of its size from the pool. At
 * the peak: the first group's weights and gradient buffer (held through backward), the last's, and
 * of the middle ones the one in use plus those prefetched within prefetch_elems (all of them when
 * persistent) and one gradient buffer. An estimate of a dynamic peak (src/zero/stage3.c; zoff plan
 * counts with it, checked against runs in tests/test_plan.c). */
size_t zoff_placement_s3_gathered(int64_t first, int64_t mid, int64_t mid_count, int64_t last,
                                  int64_t persistence_threshold, int64_t prefetch_elems, size_t es);
/* Stage 3's device bytes that "auto" must leave free besides the optimizer state, all allocated
 * after it chooses: this rank's gradient partition and (params_on_device: offload_param "none")
 * weight partition, part elements each, and the gathered groups (zoff_placement_s3_gathered). */
size_t zoff_placement_s3_auto_bytes(int64_t part, bool params_on_device, size_t gathered, size_t es);
/* Speculation's rollback copy (offload_optimizer.super_offload with device "cpu"): the
 * saved fp32 master, m and v (as the optimizer uses them) of host_params parameters, in
 * pageable host memory; 0 without it. The engine allocates it, zoff plan counts it. */
size_t zoff_placement_spec_backup_bytes(const zoff_config *cfg, int64_t host_params);
/* The dtype of the host optimizer's m and v (one home: the engine, zoff plan, the
 * checkpoints and the speculation copy use it): ZOFF_BF16 with bf16.bf16_optimizer_states,
 * else ZOFF_F32. The master stays fp32; the device part of a Twin-Flow split keeps fp32
 * state (the fused device Adam). */
zoff_dtype zoff_optimizer_state_dtype(const zoff_config *cfg);
/* The state arrays of the configured optimizer: the master (+ exp_avg unless Adagrad) (+
 * exp_avg_sq unless Lion); one home for the engine, zoff plan, the checks and checkpoints. */
int zoff_optimizer_state_arrays(const zoff_config *cfg);
/* The dtype a checkpoint stores m and v in (decided from the config, so that every rank's file
 * agrees): the host's state dtype when all of the state is on the host (ratio 1), else fp32 (the
 * device share keeps fp32). The master is fp32 always. */
zoff_dtype zoff_checkpoint_state_dtype(const zoff_config *cfg);
/* Host bytes of the optimizer state of one parameter: master 4 + m and v of state_dt
 * (state_arrays: master (+ exp_avg) (+ exp_avg_sq)). */
size_t zoff_placement_state_bytes_per_param(int state_arrays, zoff_dtype state_dt);

/* The engine's host buffers for this rank's host sub-groups (one home: the engine
 * allocates from it and checks and reports it; zoff plan counts it). With 16-bit
 * weights one buffer per gradient buffer carries the gradient in (copied during
 * backward) and the new weight out (the host optimizer writes it over the gradient
 * it read, element by element, and the copy to the device reads it), except where
 * the gradients or the weights must outlive the update: speculation (a rollback
 * updates again from the same gradients) and stage 3 with offload_param "cpu" (the
 * weights stay on the host as the partition the gathers read) keep a separate
 * staging buffer. fp32 weights: the master goes to the device (no staging), with
 * the state on NVMe through an fp32 staging buffer. offload_param "nvme": the
 * weights go to the parameter swap file (no staging). Speculation with stage 3 and
 * offload_param "cpu": twice the staging, the second half the speculative weights kept
 * apart from the partition the gathers read until validation commits them.
 * Pinned memory (pin = offload_optimizer.pin_memory): exactly the buffers a device copy
 * reads or writes (the gradient buffers, the staging, and the fp32 master where the
 * device reads it: fp32 weights in host memory, pushed or gathered from it); m, v (and
 * the master the device never reads) are touched by the CPU only and stay pageable, so
 * that the pinned limit constrains only what DMA needs and start-up does not lock and
 * zero the whole state (cudaHostAlloc). */
typedef struct zoff_host_buffers_in {
    int64_t n_host;          /* host parameters of this rank */
    zoff_dtype dtype;        /* the model's weights (and gradients) */
    int state_arrays;        /* arrays of the optimizer: master (+ exp_avg) (+ exp_avg_sq) */
    zoff_dtype state_dt;     /* exp_avg / exp_avg_sq: ZOFF_F32 (0) or ZOFF_BF16 (zoff_optimizer_state_dtype) */
    bool nvme;               /* offload_optimizer.device "nvme": master, m, v in a swap file */
    bool delayed;            /* delayed parameter update: two gradient buffers */
    bool speculate;          /* offload_optimizer.super_offload */
    int stage;
    zoff_offload_device param_offload; /* stage 3's offload_param.device */
    bool pin;                /* offload_optimizer.pin_memory (or the legacy cpu_offload) */
} zoff_host_buffers_in;
typedef struct zoff_host_buffers {
    size_t state;            /* master, m, v in host memory (0 with nvme) */
    size_t grad_buffer;      /* one gradient buffer (model dtype) */
    int grad_buffers;        /* 1, or 2 with the delayed update */
    size_t staging;          /* a separate weight staging buffer (0: none) */
    bool weights_in_grads;   /* the new 16-bit weights go out through the gradient buffer */
    size_t total;            /* state + grad_buffers x grad_buffer + staging */
    bool master_dma;         /* the device copies read the fp32 master (fp32 weights in host memory) */
    size_t pinned;           /* of total, pinned: the DMA buffers when pin (else 0) */
    size_t pageable;         /* total - pinned */
} zoff_host_buffers;
void zoff_placement_host_buffers(const zoff_host_buffers_in *in, zoff_host_buffers *out);

/* Stage 3 with offload_param nvme (src/zero/stage3.c): this rank's weight partition in the
 * parameter swap file (one home: stage3.c lays out and allocates from it, zoff plan counts it).
 * A run is this rank's contiguous piece of one parameter group (embeddings, a block, ln_f); each
 * has a slot of zoff_placement_param_slot_bytes (O_DIRECT: ZOFF_AIO_ALIGN-aligned), in the file
 * and in a buffer. Whole groups, in model order, stay in host memory (resident) while this rank's
 * elements of them add up to at most max_in_cpu; the slots of the others make the file, group by
 * group; a swap buffer holds the largest of those groups' slots. */
size_t zoff_placement_param_slot_bytes(int64_t count, size_t es);
typedef struct zoff_param_swap_in {
    int ngroups;
    const int *group_runs;    /* runs of each group on this rank (0: none of it here) */
    const int64_t *run_count; /* the runs' elements, group by group (sum of group_runs entries) */
    size_t es;                /* bytes per weight element */
    int64_t max_in_cpu;       /* offload_param.max_in_cpu */
} zoff_param_swap_in;
typedef struct zoff_param_swap {
    size_t file_bytes;      /* the swap file */
    size_t buffer_bytes;    /* one swap buffer's data (the largest on-disk group's slots; 0: none on disk) */
    size_t resident_bytes;  /* the resident groups' slots */
    int64_t resident_elems; /* their elements */
    int ondisk;             /* groups in the file */
    int largest_group;      /* the on-disk group with the most elements on this rank (-1: none) */
    int64_t largest_elems;  /* its elements (offload_param.buffer_size must hold them) */
    int64_t file_elems;     /* the parameters in the file (file_elems x es bytes of data) */
    int file_slots;         /* its slots: one per run of a group (a layer of the model) on this rank */
} zoff_param_swap;
/* resident (NULL or ngroups entries): whether each group stays in host memory. */
void zoff_placement_param_swap(const zoff_param_swap_in *in, bool *resident, zoff_param_swap *out);
/* Whether the file's slot padding (zoff_placement_param_slot_bytes) is more than its data: many
 * small groups (a narrow model) make a swap file many times the parameters. */
bool zoff_placement_param_padding_exceeds(const zoff_param_swap *sw, size_t es);

zoff_status zoff_engine_create(const zoff_engine_options *opts, zoff_engine **out);
void zoff_engine_destroy(zoff_engine *e);

void zoff_engine_memory_usage(const zoff_engine *e, zoff_engine_memory *out);
/* Human-readable description of the placement ("host optimizer (cpu offload), avx512+bf16, 2 threads"). */
const char *zoff_engine_describe(const zoff_engine *e);
/* Where zoff_engine_create's time went, in seconds (the start-up breakdown of zoff train). */
typedef struct zoff_engine_startup {
    double total;           /* zoff_engine_create */
    double pinning;         /* pinned host allocations (cudaHostAlloc locks and zeroes every page) */
    double first_touch;     /* host optimizer state: m, v zeroed, the master's pages faulted in */
    double initial_weights; /* the initial weights into the masters, the 16-bit weights from them */
} zoff_engine_startup;      /* total - the others: allocation and set-up */
void zoff_engine_startup_times(const zoff_engine *e, zoff_engine_startup *out);

/* Call before each micro-batch's backward: is_boundary is true for the last
 * micro-batch of the accumulation window, whose backward streams the finished
 * gradients to the host (earlier micro-batches accumulate on the device). */
void zoff_engine_begin_backward(zoff_engine *e, bool is_boundary);
/* Loss gradient multiplier for backward: loss scale / (accumulation steps x ranks). */
float zoff_engine_backward_scale(const zoff_engine *e);
/* ZeRO stage 3 (zero_optimization.stage 3): the model is created with
 * external_params (no flat buffers: options.params/grads are NULL) and given
 * these three as its zoff_param_hooks (arg = the engine). Each rank keeps its
 * partition of the 16-bit weights (on the device, or with offload_param "cpu"
 * in the host optimizer's output buffer) and of the gradients; a group is
 * all-gathered when the model acquires it (prefetched along the recorded order,
 * stage3_prefetch_bucket_size), freed after release (small groups, at most
 * stage3_param_persistence_threshold elements, stay whole), and its gradients
 * are reduce-scattered into the partition every micro-batch. */
zoff_status zoff_engine_begin_pass(void *engine, zoff_stream *s, bool backward);
zoff_status zoff_engine_acquire(void *engine, zoff_stream *s, int64_t offset, int64_t count, bool backward,
                                void **params, void **grads);
zoff_status zoff_engine_release(void *engine, zoff_stream *s, int64_t offset, int64_t count, bool backward);

/* zoff_weight_wait_fn for the model (arg = the engine; options.weight_waits):
 * orders s after the newest weights of the group at [offset, offset+count),
 * blocking the caller while the host optimizer has not written them yet. */
zoff_status zoff_engine_wait_weights(void *engine, zoff_stream *s, int64_t offset, int64_t count);
/* The last finished host update: returns its optimizer step (0: none yet) and its
 * wall-clock interval (zoff_now) in *start, *end, for the step timeline. */
int64_t zoff_engine_last_host_update(const zoff_engine *e, double *start, double *end);
/* The same update's work: (start, end) per host sub-group it updated, in update order
 * (without the waits between them); returns how many. Valid until the next update after
 * it finishes (the step after next). */
int zoff_engine_last_host_spans(const zoff_engine *e, const double **spans);
/* ... and the first parameter (model space) of the sub-group each of those spans updated
 * (a speculative update with a row-sparse report updates a sub-group in two spans). */
int zoff_engine_last_host_span_offsets(const zoff_engine *e, const int64_t **offsets);

/* Gradient buckets (zoff_placement_grad_buckets; options.grads NULL with stages 1-2): the
 * model is created with external_grads and given these two as its zoff_grad_hooks (arg = the
 * engine). A device sub-group's group gets its range of the engine's device gradient buffer
 * (accumulated, zoff_engine_zero_grad zeroes it); a host sub-group's group gets a bucket,
 * zeroed, whose gradients go to the host after its grad-ready call and whose statistics
 * are taken at release; the bucket is reused once that copy is done. With accumulation
 * (zoff_grad_buckets "always") every micro-batch's buckets go to the host, and a later
 * micro-batch's bucket starts from the host's sum instead of zero (statistics at the boundary
 * only). */
zoff_status zoff_engine_grad_acquire(void *engine, zoff_stream *s, int64_t offset, int64_t count, void **grads);
zoff_status zoff_engine_grad_release(void *engine, zoff_stream *s, int64_t offset, int64_t count);
/* Whether the engine provides the gradient buffers (the model must then use the hooks above). */
bool zoff_engine_uses_grad_buckets(const zoff_engine *e);

/* Grad-ready callback to pass to the model's backward (arg = the engine). */
void zoff_engine_grad_ready(void *engine, zoff_stream *stream, int64_t offset, int64_t count);
/* zoff_grad_rows_fn for the model (arg = the engine; zoff_gpt2_set_grad_rows), when
 * zoff_engine_uses_grad_rows says so. Speculation (super_offload): the range's
 * gradients outside the listed rows go to the host at once and their speculative
 * update starts before the backward ends; the ordinary grad-ready call for the range
 * then copies only the listed rows. Otherwise ignored. */
void zoff_engine_grad_rows(void *engine, zoff_stream *stream, int64_t offset, int64_t count, int64_t row_len,
                           const int64_t *rows, int64_t nrows);
/* Whether zoff_engine_grad_rows does anything for this engine (the model then need not
 * make the report). */
bool zoff_engine_uses_grad_rows(const zoff_engine *e);
/* Zero the device gradient buffer (start of an accumulation window). */
zoff_status zoff_engine_zero_grad(zoff_engine *e);
/* Check, clip and update with learning rate lr; afterwards the model's
 * parameter buffer holds the new weights (stream-ordered on the compute stream).
 * With the delayed parameter update, the host part of this step runs in the
 * background and the weights it produces are applied during the next boundary
 * backward or at the next call. Pipelined (options.weight_waits): the host part
 * runs on the worker after this returns, and the new weights are in the buffer
 * for whatever waits on zoff_engine_wait_weights (the model's forward); the
 * engine functions that read weights or state (sync_params, state get/set, flush,
 * the next step) wait for the job first. */
zoff_status zoff_engine_step(zoff_engine *e, double lr, zoff_step_info *info);
/* offload_optimizer.super_offload: the learning rate the next step will use, so that the
 * update speculated during its boundary backward uses it (default: the last step's; a
 * step with another learning rate rolls the speculation back). */
void zoff_engine_set_lr(zoff_engine *e, double lr);
/* Optimizer steps taken (skipped ones excluded). */
int64_t zoff_engine_steps_taken(const zoff_engine *e);

/* ---- state for checkpoints ----
 * The engine's state is a list of named fp32 arrays ("master", "exp_avg",
 * "exp_avg_sq", ...) over this rank's partition (zoff_engine_partition_numel
 * elements, in partition order; with one rank: num_params elements in model
 * order) plus scalars. get copies one to a host buffer; set restores it (and
 * refreshes the model's weights from master). */
int zoff_engine_state_count(const zoff_engine *e); /* the same for every engine and optimizer: e may be NULL */
const char *zoff_engine_state_name(const zoff_engine *e, int i);
zoff_status zoff_engine_state_get(zoff_engine *e, int i, float *host_dst);
zoff_status zoff_engine_state_set(zoff_engine *e, int i, const float *host_src);
/* Elements [offset, offset + count) of state array i (this rank's partition order) to
 * (get) or from host memory, for checkpoints that stream through a bounded buffer. Call it
 * after zoff_engine_flush; a set of i = 0 does not refresh the model's weights (call
 * zoff_engine_sync_params after the last piece). When all the state is in host memory
 * (zoff_engine_memory: host_params == partition numel, no nvme) a get is a plain copy that
 * touches neither the engine's streams nor its worker: it may run on another thread while the
 * model runs forward/backward, as long as no optimizer update runs. State in an NVMe swap
 * file: read and written in place through zoff_swapper_range (no host buffer beyond the
 * swapper's; the engine's job is waited for first, as zoff_engine_state_get/set do). */
zoff_status zoff_engine_state_range(zoff_engine *e, int i, int64_t offset, int64_t count, float *host, bool get);
/* The same with host of dtype dt: ZOFF_F32 (as above), or the dtype the engine keeps the array in
 * (zoff_engine_state_dtype: bf16 m and v, copied as they are, no conversion either way). Any
 * other dtype is refused (ZOFF_ERR_INVALID). */
zoff_status zoff_engine_state_range_as(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                       void *host, bool get);
/* Copy-on-update snapshot for a background save (one rank, the state in host memory, not in
 * NVMe swap files: zoff_train_ckpt_can_background). zoff_engine_snapshot_begin (caller thread, no
 * update running: after zoff_engine_flush_state) starts one: a device share's state (Twin-Flow) is
 * copied whole into the front of the arena (zoff_engine_snapshot_min_bytes: a smaller budget is
 * refused, ZOFF_ERR_INVALID) as it is at begin, on a stream of its own, by the first of:
 * zoff_engine_snapshot_device_ahead (at the step boundary the save is of, when its begin comes
 * later but before the next zoff_engine_step: a thread of its own copies it from there, where the
 * arena is already held), the writer's zoff_engine_snapshot_device_copy (its thread waits for the
 * copy: call it first), its first read of a device sub-group, and the next device update (which
 * waits for a copy begun elsewhere); and from then on a host update of a
 * sub-group whose state the writer has not yet read first copies that state (blocks of
 * zoff_engine_snapshot_block_data_bytes: in the exact update's own pass, each element just before
 * it is written, or whole blocks on up to the optimizer's threads) into a staging arena of
 * at most budget bytes, and zoff_engine_snapshot_read (the writer thread) reads each element
 * of state array i exactly once, from the staging copy where there is one, else from the live
 * state: what it reads is the state at begin, whatever updates run meanwhile. When the
 * budget is spent an update waits until the writer has read the blocks it would modify (said
 * once in the log). zoff_engine_snapshot_finish (the writer thread, also after a failure)
 * ends it and fills *stats (may be NULL); updates never wait after it. The arena is kept for
 * the next save (zoff_engine_snapshot_held bytes: its pages are faulted in once) and freed
 * with the engine, or by a begin that needs a larger one. Budget 0: no staging, every update
 * waits for the writer. A read fails (ZOFF_ERR_INTERNAL) when an update failed while it was
 * staging the state. zoff_engine_snapshot_prepare (caller thread, before a save; optional)
 * allocates the arena for a budget ahead of the first save and faults its pages in on a
 * background thread at the lowest priority (zoff_engine_snapshot_prefaulted bytes so far);
 * begin stops it where it got to. Nothing is done where begin would refuse. */
typedef struct zoff_engine_snapshot_stats {
    size_t budget, staged; /* arena bytes; bytes copied into it */
    size_t prefaulted;     /* arena bytes faulted in ahead by zoff_engine_snapshot_prepare (the first save after it) */
    size_t staged_in_update; /* of staged: copied by the updates' own passes */
    double update_wait;    /* seconds updates waited for the writer (budget spent) */
    size_t device;         /* bytes of the device's state copied (a device share), in device_seconds */
    double device_seconds;
    double device_wait;    /* seconds the training thread spent on that copy (waiting for it, or making it) */
} zoff_engine_snapshot_stats;
/* The snapshot's slots (bytes); the state bytes each block of an array holds (a slot less
 * zoff_engine_snapshot_align: room to shift the copy, see zoff_engine_snapshot_borrow); the
 * alignment of what the writer may borrow. */
size_t zoff_engine_snapshot_block_bytes(void);
size_t zoff_engine_snapshot_block_data_bytes(void);
size_t zoff_engine_snapshot_align(void);
/* The arena that stages the whole host state (no update ever waits) and holds the device share's
 * copy: the largest useful budget (zoff_placement_snapshot_bytes of this engine; 0 with the state
 * in NVMe swap files or no host share). */
size_t zoff_engine_snapshot_bytes(const zoff_engine *e);
/* The least budget begin accepts: the device share's copy (zoff_placement_snapshot_image_bytes;
 * 0 without a device share). */
size_t zoff_engine_snapshot_min_bytes(const zoff_engine *e);
/* One home for the snapshot's sizes (the engine's arena and zoff plan): the device share's copy,
 * n_dev x 4 bytes per state array (fp32 on the device), in whole blocks; and the whole arena, each
 * host state array (the master fp32, the others of state_dt) over n_host elements in blocks of
 * zoff_engine_snapshot_block_data_bytes, a slot each, plus that copy (0 when n_host is 0: no host
 * state to stage). */
size_t zoff_placement_snapshot_image_bytes(int64_t n_dev, int state_arrays);
size_t zoff_placement_snapshot_bytes(int64_t n_host, int64_t n_dev, int state_arrays, zoff_dtype state_dt);
/* A background save's snapshot budget under --save-snapshot-memory auto: half the host memory
 * left (left: what the system still has; held: the arena this engine already holds, counted as
 * left), at least what is held (kept from the last save, free to reuse), at most full (the whole
 * arena: zoff_engine_snapshot_bytes). zoff train and zoff plan both use it. */
size_t zoff_placement_snapshot_auto_budget(size_t full, size_t held, size_t left);
zoff_status zoff_engine_snapshot_prepare(zoff_engine *e, size_t budget);
size_t zoff_engine_snapshot_prefaulted(const zoff_engine *e);
zoff_status zoff_engine_snapshot_begin(zoff_engine *e, size_t budget);
zoff_status zoff_engine_snapshot_device_copy(zoff_engine *e);
zoff_status zoff_engine_snapshot_device_ahead(zoff_engine *e);
zoff_status zoff_engine_snapshot_read(zoff_engine *e, int i, int64_t offset, int64_t count, float *host);
/* The same in dtype dt (as zoff_engine_state_range_as: fp32, or the array's own dtype). */
zoff_status zoff_engine_snapshot_read_as(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                         void *host);
/* The writer, instead of a read, at elements [offset, offset + count) of state array i (in dtype dt,
 * the array's own), where a save's file holds them from a position aligned to
 * zoff_engine_snapshot_align: when offset's block of a host sub-group is staged, its copy lies
 * aligned at offset (each block's copy sits in its slot at the shift that aligns the longest run of
 * it one checkpoint entry holds: m and v one entry over the partition, the master one per model
 * tensor) and fewer than a quarter of the arena's slots are lent out already (or it has a slot for every
 * block), *data is that copy
 * at offset and *got its elements up to the end of the block, the sub-group or count, in whole
 * alignment units (> 0), which count as read; *until = 0. Else *data = NULL, *got = 0 and *until
 * (>= 1) is how many elements to read (zoff_engine_snapshot_read_as) before asking again. The copy
 * stays the writer's until zoff_engine_snapshot_return(e, *data) (the writer's thread, before
 * finish or after it), so that a save's disk writes can read it in place. */
zoff_status zoff_engine_snapshot_borrow(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                        const void **data, int64_t *got, int64_t *until);
void zoff_engine_snapshot_return(zoff_engine *e, const void *data);
void zoff_engine_snapshot_finish(zoff_engine *e, zoff_engine_snapshot_stats *stats);
size_t zoff_engine_snapshot_held(const zoff_engine *e);
/* The dtype state array i keeps in the engine (what a checkpoint stores): ZOFF_BF16 for m
 * and v when every element keeps bf16 state (bf16_optimizer_states with offload_optimizer
 * ratio 1: no fp32 device part on any rank), else ZOFF_F32. get widens bf16 exactly; set rounds to nearest-even (exact
 * for values that were bf16). */
zoff_dtype zoff_engine_state_dtype(const zoff_engine *e, int i);
/* Scalars: step count and loss-scaler state, as a small JSON-free struct. */
typedef struct zoff_engine_scalars {
    int64_t steps_taken, steps_skipped;
    /* loss scaler (zoff_loss_scaler) */
    double loss_scale;
    int64_t scaler_iter, last_overflow_iter;
    int hysteresis_left;
    int64_t rollbacks;   /* super_offload: speculative updates undone so far (zoff_step_info.rollbacks) */
} zoff_engine_scalars;
void zoff_engine_get_scalars(const zoff_engine *e, zoff_engine_scalars *out);
zoff_status zoff_engine_set_scalars(zoff_engine *e, const zoff_engine_scalars *in);
/* ---- data parallel ----
 * With N > 1 ranks the model's flat space is cut into one partition per rank
 * (zero/partition.h): stage 0 all-reduces gradients and every rank updates
 * everything; stage 1 all-reduces gradients, each rank updates its partition
 * and the new weights are all-gathered; stage 2 reduce-scatters the gradients
 * instead. Gradient norm, overflow and loss scale are global: the statistics
 * are summed over ranks. zoff_engine_backward_scale pre-divides each rank's
 * loss gradient by N, so that the sum over ranks is the mean gradient, of the
 * same magnitude as one rank's (fp16 overflows the same way). A partition is a
 * list of runs of the model space (one run unless round_robin_gradients). */
int64_t zoff_engine_partition_numel(const zoff_engine *e);
/* This rank's partition as runs (model offset, count) in partition order: copies
 * up to cap runs, returns how many there are. */
int zoff_engine_partition(const zoff_engine *e, int64_t *model_offsets, int64_t *counts, int cap);
/* Collective: state array i of every rank, in model order, into full (num_params) on every rank. */
zoff_status zoff_engine_state_gather(zoff_engine *e, int i, float *full);

/* With zoff_engine_options.timeline: the gradient stream's work for each range
 * the model reported during the last boundary backward, in report order. Times
 * are seconds since zoff_engine_begin_backward; valid after zoff_engine_step
 * until the next boundary backward. */
typedef struct zoff_grad_event {
    int64_t offset, count;  /* the range (model space) */
    double t_ready;         /* reported by the model (issue time on the host) */
    double t_reduce_start;  /* the gradient stream reached it (after the compute that produced it) */
    double t_reduce_end;    /* summed over ranks (equals t_reduce_start with one rank) */
    double t_copy_end;      /* this rank's host sub-groups' part copied to the host */
    int64_t copy_bytes;     /* bytes this rank copied to the host for it */
} zoff_grad_event;
int zoff_engine_grad_timeline(const zoff_engine *e, const zoff_grad_event **events);

/* Copy the current fp32 master weights to the model's parameter buffer. The host
 * sub-groups' 16-bit weights go out through the host gradient buffer: call it between
 * steps, not between a boundary backward and its zoff_engine_step. */
zoff_status zoff_engine_sync_params(zoff_engine *e);
/* Wait for background work (delayed update) so that the state is final, and put the delayed
 * update's pending weights on the device (what evaluation after training wants). */
zoff_status zoff_engine_flush(zoff_engine *e);
/* The same without putting them there: the next forward still uses the weights the uninterrupted
 * run would use (a checkpoint calls this, so that saving does not change the run). */
zoff_status zoff_engine_flush_state(zoff_engine *e);
/* Whether the host optimizer state stays as the last zoff_engine_step left it (its update, once
 * done) through the forwards and backwards up to the next zoff_engine_step: no update runs in
 * them. False with the delayed update (its job runs then) and with super_offload (it speculates
 * the update during the boundary backward). Where true, a background save of the state as of a
 * step may start just before the next zoff_engine_step (the trainer's periodic saves: by then the
 * pipelined update it waits for has overlapped that step's forward). */
bool zoff_engine_state_fixed_until_step(const zoff_engine *e);

/* ---- the delayed update's pending weights (resuming it bit for bit) ----
 * With zero_optimization.zoff_delayed_param_update, after a step the newest update's weights
 * are not on the device yet: the next forward uses those of the update before, which exist
 * only in the model's parameter buffer. A checkpoint stores that buffer when
 * zoff_engine_weights_pending; a resume restores the state, calls
 * zoff_engine_mark_weights_pending (the master's weights become the pending update, put on the
 * device when the uninterrupted run would put them there) and then sets the buffer from the
 * checkpoint with zoff_engine_device_weights. *marked false: the engine has no delayed update
 * (the device keeps the master's weights). */
bool zoff_engine_weights_pending(const zoff_engine *e);
zoff_status zoff_engine_mark_weights_pending(zoff_engine *e, bool *marked);
/* Elements [offset, offset + count) of the model's parameter buffer (model order, the engine's
 * dtype) to (get) or from host; stages 0-2, between steps (after zoff_engine_flush_state). */
zoff_status zoff_engine_device_weights(zoff_engine *e, int64_t offset, int64_t count, void *host, bool get);
zoff_dtype zoff_engine_dtype(const zoff_engine *e);

#ifdef __cplusplus
}
#endif
#endif
