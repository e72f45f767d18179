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
 * partitioned.
 *
 * NVMe (offload_param "nvme", ZeRO-Infinity): p_params is NULL; the partition
 * lives in a swap file (DIR/zoff-param-<pid>-<n>.swp) written and read through
 * src/aio with a CRC32C per block. The file holds one aligned slot per "run"
 * (a maximal stretch of local space whose elements belong to one group: one
 * per group without round-robin). A gather reads the group's runs into one of
 * buffer_count host buffers (pinned with pin_memory), waits for the read and
 * copies from there as from host memory; prefetch issues the reads of the
 * next groups in the recorded order ahead (up to the free buffers), so that
 * the disk works while the device computes. Whole groups of up to max_in_cpu
 * elements (in group order) stay resident in host memory and never touch the
 * file. The host optimizer writes its 16-bit output through
 * zoff_s3_out_span/zoff_s3_out_done, in descending local order: each run is
 * written as soon as it is complete, from a pool buffer, so no host copy of
 * the whole partition exists. */
#ifndef ZOFF_ZERO_STAGE3_H
#define ZOFF_ZERO_STAGE3_H

#include "zero/partition.h"
#include "zoff/aio.h"

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
    struct {                        /* offload_param "nvme" (dir non-NULL; p_params NULL) */
        const char *dir;            /* offload_param.nvme_path */
        int64_t buffer_count, buffer_size, max_in_cpu;
        bool pin_memory;
        zoff_aio_options aio;
    } nvme;
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

/* NVMe: the host optimizer's new weights. begin_update waits for the reads in
 * flight (their data is stale); then, in descending local order, out_span
 * gives where the 16-bit weights of [*lo, hi) go (*lo >= lo_bound: the part of
 * [lo_bound, hi) in the run holding element hi - 1), the caller fills them and
 * out_done queues the run's write once it is complete; end_update waits for
 * the writes. Without NVMe these do nothing (out_span is not to be called). */
zoff_status zoff_s3_begin_update(zoff_s3 *s);
zoff_status zoff_s3_out_span(zoff_s3 *s, int64_t lo_bound, int64_t hi, int64_t *lo, void **ptr);
zoff_status zoff_s3_out_done(zoff_s3 *s, int64_t lo, int64_t hi);
zoff_status zoff_s3_end_update(zoff_s3 *s);
bool zoff_s3_nvme(const zoff_s3 *s);
/* "…/zoff-param-123-0.swp (1.2 MiB, O_DIRECT), io_uring ...; 5 buffers of 64 KiB pinned; ..." ("" without NVMe) */
const char *zoff_s3_nvme_describe(const zoff_s3 *s);

typedef struct zoff_s3_stats {
    size_t pool_bytes;        /* device memory of the gather/gradient buffer pool (high-water mark) */
    size_t persistent_bytes;  /* whole copies of persistent groups */
    int groups, persistent;
    int64_t gathers, prefetched, prefetch_hits;
    /* offload_param nvme */
    int64_t nvme_file_bytes;       /* the swap file */
    size_t nvme_buffer_bytes;      /* the host buffers (pinned with pin_memory) */
    size_t nvme_resident_bytes;    /* max_in_cpu: resident part of the partition */
    int64_t nvme_resident_elems;
    int nvme_buffers;
    bool nvme_pinned;
    int64_t nvme_bytes_read, nvme_bytes_written, nvme_reads_ahead;
    const char *nvme_path;         /* NULL without NVMe */
} zoff_s3_stats;
void zoff_s3_get_stats(const zoff_s3 *s, zoff_s3_stats *out);

#endif
