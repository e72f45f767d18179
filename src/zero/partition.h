/* Private to src/zero: the data-parallel partition plan and the collectives the
 * engine runs on it (ZeRO stages 1-3 across ranks).
 *
 * The model's flat parameter space [0, n) ("model space") is cut into one
 * partition per rank. Rank r keeps the optimizer state (stages 1-3), receives
 * the reduced gradients (stage 2-3) and, in stage 3, keeps the 16-bit weights
 * of its partition only. A rank's partition, laid end to end, is its "local
 * space" [0, numel[r]); the engine's sub-groups cut the local space.
 *
 * Without round-robin ordering, partition r is one contiguous model range:
 * the flat space is split into N nearly equal parts (aligned to
 * ZOFF_DP_ALIGN elements). Backward finishes the highest offsets first, so
 * during backward the gradients arriving first all belong to rank N-1 and the
 * last ones to rank 0: one rank copies its gradients to the host while the
 * others have nothing to copy.
 *
 * With round_robin_gradients (DeepSpeed's load-balanced gradient copying),
 * whole tensors are first dealt into N buckets, the buckets are laid end to
 * end (bucket 0's tensors, then bucket 1's, ...) into an "engine order", and
 * that order is split evenly. Each rank then owns a share of every layer, so
 * the gradients of each finished layer are spread over all ranks and every
 * rank copies its share as the layer finishes. A partition is then a list of
 * pieces of tensors in model space.
 *
 * Dealing: DeepSpeed puts tensor i into bucket i mod N. In GPT-2 weights and
 * biases alternate, so with N = 2 every matrix lands in bucket 0, the even
 * split cuts bucket 0 in half and the partitions are contiguous again (each
 * block's gradients copied by one rank: measured, docs/multinode.md). zoff
 * deals in the order gradients arrive (the model's last tensor first) and
 * gives each tensor to the bucket holding the fewest elements so far (ties:
 * the lowest bucket): consecutive large tensors alternate between ranks and
 * the buckets stay within one tensor of equal, whatever the layout.
 *
 * The plan is the same on every rank (a pure function of the tensor table, N
 * and the flags). */
#ifndef ZOFF_ZERO_PARTITION_H
#define ZOFF_ZERO_PARTITION_H

#include "zoff/comm.h"
#include "zoff/param_space.h"

#define ZOFF_DP_ALIGN 64 /* partition boundaries are multiples of this (elements), except at n */

/* A run of one rank's partition: model elements [model, model + count) are local
 * elements [local, local + count) of rank `owner`. */
typedef struct zoff_dp_piece {
    int64_t model, local, count;
    int owner;
} zoff_dp_piece;

typedef struct zoff_dp_plan {
    int world, rank;
    int64_t n;
    bool round_robin;
    int64_t *numel;        /* [world]: elements of each partition */
    zoff_dp_piece *pieces; /* every partition's pieces, sorted by model offset, covering [0, n) */
    int npieces;
    int **own;             /* [world]: indices into pieces of rank r's pieces in local order */
    int *nown;             /* [world] */
} zoff_dp_plan;

zoff_status zoff_dp_plan_build(zoff_dp_plan *p, const zoff_tensor_info *t, int nt, int64_t n, int world, int rank,
                               bool round_robin);
void zoff_dp_plan_free(zoff_dp_plan *p);

/* The pieces of model range [a, b), in collective order: grouped by owner rank,
 * each owner's pieces in its local order. counts[r] = elements of rank r in the
 * range (world entries). identity: that order is the model order (no packing
 * needed: rank r's block sits at model offset ... in the range). `out` must hold
 * the plan's npieces entries; returns the number written. */
typedef struct zoff_dp_layout {
    zoff_dp_piece *p;
    int np;
    int64_t *counts;  /* [world] */
    int64_t *starts;  /* [world]: offset of rank r's block in the packed order (in the counts' block) */
    bool identity;
} zoff_dp_layout;
zoff_status zoff_dp_layout_alloc(const zoff_dp_plan *p, zoff_dp_layout *l);
void zoff_dp_layout_free(zoff_dp_layout *l);
void zoff_dp_layout_of(const zoff_dp_plan *p, int64_t a, int64_t b, zoff_dp_layout *l);

/* Local range [lo, hi) of this rank -> model pieces: index of the first own
 * piece that ends after lo (binary search), then walk p->own[rank]. */
int zoff_dp_own_find(const zoff_dp_plan *p, int64_t lo);

/* Gather this rank's local range out of a model-space fp32 array: dst[k] =
 * full[model of local lo + k] for k < hi - lo. */
void zoff_dp_gather_local(const zoff_dp_plan *p, const float *full, float *dst, int64_t lo, int64_t hi);
/* The inverse: full[model of local lo + k] = src[k]. */
void zoff_dp_scatter_local(const zoff_dp_plan *p, const float *src, float *full, int64_t lo, int64_t hi);

/* ---- collectives on the plan (stream-ordered on s, device buffers of dtype dt) ---- */

/* Scratch for the collectives: device buffers of `elems` elements each. */
typedef struct zoff_dp_scratch {
    void *pack, *recv;
    int64_t elems;
} zoff_dp_scratch;

/* Gradients of model range [a, b) of `grads` (which holds model offsets from g0 on: 0 for the
 * full buffer, a layer group's first offset for its bucket), summed over ranks:
 *   scatter = false (stages 0, 1): all-reduce in place, every rank gets all of it;
 *   scatter = true (stage 2): reduce-scatter; this rank's pieces of the range are
 *     written back into grads at their model offsets (the other pieces keep this
 *     rank's own contribution).
 * Ranges longer than the scratch are done in chunks. */
zoff_status zoff_dp_reduce_grads(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *grads, int64_t g0,
                                 zoff_dtype dt, int64_t a, int64_t b, bool scatter, const zoff_dp_scratch *sc,
                                 zoff_dp_layout *l);

/* Every rank's pieces of `params` (model space) to every rank (stages 1, 2: after
 * the update each rank has written only its partition). In place when the
 * layout is the identity; else through the scratch, in chunks. */
zoff_status zoff_dp_allgather_params(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *params,
                                     zoff_dtype dt, const zoff_dp_scratch *sc, zoff_dp_layout *l);
/* The same for model range [a, b) only (the pipelined step gathers one layer group at a
 * time): in chunks of the scratch, in place where the chunk's layout is the identity, else
 * through the scratch's pack buffer (round-robin plans allocate it). */
zoff_status zoff_dp_allgather_range(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *params, zoff_dtype dt,
                                    const zoff_dp_scratch *sc, zoff_dp_layout *l, int64_t a, int64_t b);

#endif
