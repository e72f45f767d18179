/* Private to src/zero: ZeRO stage 3 parameter management for the engine.
 *
 * Each rank keeps only its partition of the 16-bit weights (p_params, local
 * space of the partition plan; on the device, or in pinned host memory with
 * offload_param "cpu") and of the gradients (p_grads, device). The model asks
 * for a parameter group (a block, the embeddings, ln_f) before using it
 * (zoff_param_hooks); the group is all-gathered from every rank's partition
 * into a pooled device buffer on the engine's collective stream, and the
 * compute stream waits for it. Release returns the buffer to the pool once the
 * compute stream is past its last use. In backward, acquire also hands out a
 * zeroed gradient buffer of the group's size; when the model reports the
 * group's gradients final, they are reduce-scattered and this rank's pieces are
 * added into p_grads (every micro-batch: no full-size gradient buffer exists).
 *
 * Prefetch: the order of acquisitions of the first forward and of the first
 * backward is recorded; later passes that follow it gather the next groups
 * ahead, up to zero_optimization.stage3_prefetch_bucket_size elements gathered
 * and not yet used. A pass that departs from the recorded order stops
 * prefetching and is recorded anew.
 *
 * Persistence: a group of at most stage3_param_persistence_threshold elements
 * is kept whole on every rank (gathered once after each update, never freed).
 * zoff applies the threshold per group, because it gathers a group with one
 * collective; DeepSpeed applies it per tensor. Its optimizer state stays
 * partitioned. */
#ifndef ZOFF_ZERO_STAGE3_H
#define ZOFF_ZERO_STAGE3_H

#include "zero/partition.h"

typedef struct zoff_s3 zoff_s3;

typedef struct zoff_s3_options {
    zoff_device *dev;
    zoff_stream *compute;           /* the model's stream */
    zoff_stream *comm;              /* the engine's collective stream (chan is used only there) */
    zoff_comm *chan;
    const zoff_dp_plan *plan;
    zoff_dp_layout *layout;
    const zoff_dp_scratch *scratch; /* recv (and pack with round-robin) of at least the largest group */
    zoff_dtype dtype;
    const zoff_tensor_info *tensors;
    int num_tensors;
    void *p_params;                 /* this rank's partition weights (local space) */
    bool params_on_host;            /* offload_param "cpu": p_params is pinned host memory */
    void *p_grads;                  /* device, local space: gradients accumulate here */
    int64_t prefetch_elems;         /* stage3_prefetch_bucket_size */
    int64_t persistence_threshold;  /* stage3_param_persistence_threshold */
} zoff_s3_options;

zoff_status zoff_s3_create(const zoff_s3_options *o, zoff_s3 **out);
void zoff_s3_destroy(zoff_s3 *s);

zoff_status zoff_s3_begin_pass(zoff_s3 *s, bool backward);
zoff_status zoff_s3_acquire(zoff_s3 *s, int64_t offset, int64_t count, bool backward, void **params, void **grads);
zoff_status zoff_s3_release(zoff_s3 *s, int64_t offset, int64_t count, bool backward);
/* The group at [offset, offset + count) has final gradients (issued on `producer`):
 * reduce-scatter them and add this rank's pieces into p_grads, on the comm stream. */
zoff_status zoff_s3_reduce(zoff_s3 *s, zoff_stream *producer, int64_t offset, int64_t count);
/* p_params was updated (compute-stream order): later gathers see it; the
 * persistent groups are gathered again now. */
zoff_status zoff_s3_params_updated(zoff_s3 *s);

typedef struct zoff_s3_stats {
    size_t pool_bytes;        /* device memory of the gather/gradient buffer pool (high-water mark) */
    size_t persistent_bytes;  /* whole copies of persistent groups */
    int groups, persistent;
    int64_t gathers, prefetched, prefetch_hits;
} zoff_s3_stats;
void zoff_s3_get_stats(const zoff_s3 *s, zoff_s3_stats *out);

#endif
