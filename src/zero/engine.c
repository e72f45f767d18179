/* The engine: optimizer state, gradient checks, clipping, loss scaling and
 * the update, with the optimizer's memory and work on the device or offloaded
 * to the host (ZeRO-Offload).
 *
 * The flat parameter space [0, n) is cut into sub-groups of
 * zero_optimization.sub_group_size elements. Each sub-group is placed on the
 * host or on the device:
 *   - host: fp32 master, m, v in pageable host memory (only the CPU touches them;
 *     pin_memory pins the buffers device copies use); its 16-bit gradients
 *     are copied to a host buffer during the boundary micro-batch's backward,
 *     on a copy stream, as the model reports them final; the host optimizer
 *     (SIMD CPU Adam) widens them in registers and writes the new 16-bit
 *     weights into a staging buffer in the same pass; each sub-group's weights
 *     go back to the device as soon as it is done, overlapping the next one.
 *   - device: fp32 master, m, v in device memory, updated by the device's
 *     fused Adam op (stage 0 without offload).
 * No fp32 gradient buffer exists anywhere.
 *
 * Gradients of micro-batches before the boundary accumulate on the device in
 * the model's gradient buffer (its dtype); only the boundary backward streams
 * them out, so every micro-batch is counted exactly once.
 *
 * Delayed parameter update (ZeRO-Offload's one-step delay, off by default):
 * the host update of step t runs on a worker thread while forward and
 * backward of step t+1 run with the weights of step t-1's update; the new
 * weights of each group go to the device once backward t+1 is done with the
 * group (with the per-group weight waits) or at the next boundary. Host
 * gradients are double buffered so that backward t+1 never overwrites what the
 * worker reads (and never waits for it).
 *
 * With the per-group weight waits (options.weight_waits) the exact step is
 * pipelined (the worker updates in forward order, each group's weights are
 * pushed at once, the next forward waits per group: zero/wready.h), and
 * offload_optimizer.super_offload speculates the update during the boundary
 * backward and validates it at the step (docs/architecture.md). The placement
 * of sub-groups is zero/placement.c's; gradients to the host are
 * zero/gradients.c; the host optimizer runner (the worker
 * thread and the host update in each mode) is zero/hostrun.c; the state shared
 * by them is zero/engine_impl.h. */
#define _GNU_SOURCE
#include "zoff/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/half_internal.h"
#include "zero/engine_impl.h"
#include "zoff/resources.h"
#include "zoff/schedule.h"

/* ------------------------------------------------------------------ helpers */

static const char *state_names_adam[] = {"optimizer.master", "optimizer.exp_avg", "optimizer.exp_avg_sq"};

/* ------------------------------------------------------------------ data parallel (world > 1) */

/* Model offset of optimizer-space element `local`. */
static int64_t map_local(const zoff_engine *e, int64_t local) {
    int a = 0, b = e->nmap - 1;
    while (a < b) {
        int mid = (a + b) / 2;
        if (e->map[mid].local + e->map[mid].count <= local) a = mid + 1;
        else b = mid;
    }
    return e->map[a].model + (local - e->map[a].local);
}

/* What must agree across ranks: the engine's configuration and the tensor table. */
/* What every rank must agree on, in groups, so that a mismatch names its part: fingerprints of
 * the batch, the optimizer and its schedule, the precision, zero_optimization, the tensor table. */
enum { DP_FP_GROUPS = 5 };
static const char *const dp_fp_what[DP_FP_GROUPS] = {
    "the batch (train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps)",
    "the optimizer, its schedule or gradient_clipping (optimizer, scheduler)",
    "the precision (fp16, bf16 and their settings)",
    "zero_optimization (stage, sub_group_size, buckets, offload)",
    "the model (its tensors: the shape flags or the config's model section)"};
static void dp_fingerprints(const zoff_engine *e, const zoff_engine_options *o, uint64_t fp[DP_FP_GROUPS]) {
    const zoff_config *c = e->cfg;
    const zoff_zero_config *z = &c->zero;
    uint64_t h;
#define H(x) h = zoff_fnv1a(h, &(x), sizeof(x))
    h = ZOFF_FNV_INIT;
    H(c->train_batch_size); H(c->train_micro_batch_size_per_gpu); H(c->gradient_accumulation_steps);
    fp[0] = h;
    h = ZOFF_FNV_INIT;
    H(c->optimizer.type); H(c->optimizer.lr); H(c->optimizer.beta1); H(c->optimizer.beta2); H(c->optimizer.eps);
    H(c->optimizer.weight_decay); H(c->optimizer.adam_w_mode); H(c->optimizer.bias_correction);
    H(c->scheduler.type); H(c->scheduler.warmup_num_steps); H(c->scheduler.total_num_steps);
    H(c->gradient_clipping);
    fp[1] = h;
    h = ZOFF_FNV_INIT;
    H(c->fp16.enabled); H(c->fp16.loss_scale); H(c->fp16.initial_scale_power);
    H(c->fp16.loss_scale_window); H(c->fp16.hysteresis); H(c->fp16.consecutive_hysteresis); H(c->fp16.min_loss_scale);
    H(c->bf16_enabled); H(c->bf16_optimizer_states);
    H(o->dtype);
    fp[2] = h;
    h = ZOFF_FNV_INIT;
    H(z->stage); H(z->sub_group_size); H(z->round_robin_gradients); H(z->reduce_bucket_size);
    H(z->allgather_bucket_size); H(z->offload_optimizer.device); H(z->offload_optimizer.ratio);
    H(z->offload_optimizer.ratio_auto); H(z->offload_param.device); H(z->delayed_param_update);
    H(z->delayed_param_update_warmup); H(z->offload_optimizer.super_offload); H(z->stage3_prefetch_bucket_size); H(z->stage3_param_persistence_threshold);
    fp[3] = h;
    h = ZOFF_FNV_INIT;
    H(o->num_params);
    for (int i = 0; i < o->num_tensors; i++) {
        const zoff_tensor_info *t = &o->tensors[i];
        h = zoff_fnv1a(h, t->name, strlen(t->name));
        H(t->offset); H(t->numel); H(t->decay); H(t->layer);
    }
    fp[4] = h;
#undef H
}

/* Largest run of tensors of one layer: the largest range the model reports ready. */
static int64_t dp_max_group(const zoff_tensor_info *t, int nt) {
    int64_t best = 0, cur = 0;
    for (int i = 0; i < nt; i++) {
        cur = (i > 0 && t[i].layer == t[i - 1].layer) ? cur + t[i].numel : t[i].numel;
        if (cur > best) best = cur;
    }
    return best;
}

/* Before the sub-groups are built: the plan, this rank's optimizer space (e->n,
 * map), its tensor table (*ltab, decay flags per piece) and initial master
 * weights (*init_local); both NULL when the space is the model's. Collective
 * when world > 1 (fingerprint check, communicator dup). */
static zoff_status dp_setup(zoff_engine *e, const zoff_engine_options *o, zoff_tensor_info **ltab, int *nlt,
                            float **init_local) {
    const zoff_zero_config *z = &e->cfg->zero;
    *ltab = NULL;
    *nlt = 0;
    *init_local = NULL;
    e->n_model = o->num_params;
    e->tensors = o->tensors;
    e->ntensors = o->num_tensors;
    e->comm = o->comm;
    e->world = o->comm ? zoff_comm_size(o->comm) : 1;
    e->rank = o->comm ? zoff_comm_rank(o->comm) : 0;
    e->replicated = e->world > 1 && z->stage == 0;
    e->scatter = e->world > 1 && z->stage >= 2;
    e->stage3 = z->stage >= 3;
    if (e->stage3 && e->world == 1) { /* the same machinery over one rank */
        ZOFF_TRY(zoff_dp_plan_build(&e->plan, o->tensors, o->num_tensors, e->n_model, 1, 0, false));
        ZOFF_TRY(zoff_dp_layout_alloc(&e->plan, &e->layout));
        ZOFF_TRY(zoff_comm_create_single(&e->chan));
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_gather));
        e->scratch.elems = dp_max_group(o->tensors, o->num_tensors);
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)e->scratch.elems * e->esize, "reduce-scatter buffer",
                                   &e->scratch.recv));
    }
    if (e->world > 1) {
        uint64_t fp[DP_FP_GROUPS];
        dp_fingerprints(e, o, fp);
        for (int g = 0; g < DP_FP_GROUPS; g++) ZOFF_TRY(zoff_comm_check_same(e->comm, fp[g], dp_fp_what[g]));
        ZOFF_TRY(zoff_dp_plan_build(&e->plan, o->tensors, o->num_tensors, e->n_model, e->world, e->rank,
                                    z->round_robin_gradients));
        ZOFF_TRY(zoff_dp_layout_alloc(&e->plan, &e->layout));
        ZOFF_TRY(zoff_comm_dup(e->comm, &e->chan));
        ZOFF_TRY(zoff_comm_bind_device(e->chan, e->dev));
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_gather));
        /* scratch for reduce-scatter (recv) and round-robin packing (pack): one layer, at most a bucket */
        int64_t el = dp_max_group(o->tensors, o->num_tensors);
        /* stage 3 reduces and gathers a whole group at once */
        if (!e->stage3 && z->reduce_bucket_size > 0 && el > z->reduce_bucket_size) el = z->reduce_bucket_size;
        e->scratch.elems = el;
        if (e->scatter)
            ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)el * e->esize, "reduce-scatter buffer", &e->scratch.recv));
        if (e->plan.round_robin)
            ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)el * e->esize, "round-robin packing buffer", &e->scratch.pack));
    }
    if ((e->world == 1 && !e->stage3) || e->replicated) {
        e->map = malloc(sizeof *e->map);
        if (!e->map) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the engine");
        e->map[0] = (zoff_dp_piece){.model = 0, .local = 0, .count = e->n_model, .owner = e->rank};
        e->nmap = 1;
        e->n = e->n_model;
        return ZOFF_OK;
    }
    const zoff_dp_plan *p = &e->plan;
    e->n = p->numel[e->rank];
    if (e->n == 0)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "rank %d of %d: its partition is empty (%lld parameters over %d ranks); run fewer ranks",
                          e->rank, e->world, (long long)e->n_model, e->world);
    e->nmap = p->nown[e->rank];
    e->map = malloc((size_t)e->nmap * sizeof *e->map);
    /* one entry per (piece x tensor) */
    *ltab = calloc((size_t)(e->nmap + o->num_tensors), sizeof **ltab);
    if (!e->map || !*ltab) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition map");
    for (int k = 0; k < e->nmap; k++) {
        zoff_dp_piece q = p->pieces[p->own[e->rank][k]];
        e->map[k] = q;
        for (int64_t m = q.model; m < q.model + q.count;) {
            int a = 0, b = o->num_tensors - 1; /* the tensor holding m */
            while (a < b) {
                int mid = (a + b + 1) / 2;
                if (o->tensors[mid].offset <= m) a = mid;
                else b = mid - 1;
            }
            const zoff_tensor_info *t = &o->tensors[a];
            int64_t end = t->offset + t->numel < q.model + q.count ? t->offset + t->numel : q.model + q.count;
            zoff_tensor_info *lt = &(*ltab)[(*nlt)++];
            *lt = *t;
            lt->offset = q.local + (m - q.model);
            lt->numel = end - m;
            m = end;
        }
    }
    if (o->init_params) {
        *init_local = zoff_aligned_alloc(64, (size_t)e->n * sizeof(float), "initial weights of the partition");
        if (!*init_local) return ZOFF_ERR_NOMEM;
        zoff_dp_gather_local(p, o->init_params, *init_local, 0, e->n);
    }
    if (e->stage3) { /* the engine's buffers are the partition itself: the map is the identity */
        e->map[0] = (zoff_dp_piece){.model = 0, .local = 0, .count = e->n, .owner = e->rank};
        e->nmap = 1;
    }
    return ZOFF_OK;
}

/* Stage 3, after the host side exists: the partition's weights and gradients and the
 * group manager. With offload_param "cpu" the weights are the host optimizer's
 * 16-bit output buffer (fp32: the master) and nothing is pushed to the device. */
static zoff_status s3_setup(zoff_engine *e) {
    const zoff_zero_config *z = &e->cfg->zero;
    bool on_host = z->offload_param.device == ZOFF_OFFLOAD_CPU;
    if (e->pnvme) {
        e->params = NULL;
        e->no_push = true;
    } else if (on_host) {
        e->params = e->h_staging ? e->h_staging : (void *)e->h_master;
        e->no_push = true;
        if (e->h_staging && e->hb.staging == 2 * (size_t)e->n_host * e->esize) /* speculation: kept apart */
            e->h_spec = (char *)e->h_staging + (size_t)e->n_host * e->esize;
    } else {
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)e->n * e->esize, "stage 3 weight partition", &e->s3_params_dev));
        e->params = e->s3_params_dev;
    }
    ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)e->n * e->esize, "stage 3 gradient partition", &e->s3_grads_dev));
    e->grads = e->s3_grads_dev;
    ZOFF_TRY(zoff_memset_async(e->compute, e->grads, 0, (size_t)e->n * e->esize));
    if (e->plan.round_robin && !e->scratch.pack)
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)e->scratch.elems * e->esize, "round-robin packing buffer",
                                   &e->scratch.pack));
    zoff_s3_options so = {.dev = e->dev, .compute = e->compute, .comm = e->d2h, .chan = e->chan, .plan = &e->plan,
                          .layout = &e->layout, .scratch = &e->scratch, .dtype = e->dtype, .tensors = e->tensors,
                          .num_tensors = e->ntensors, .p_params = e->params, .params_on_host = on_host,
                          .p_grads = e->grads, .prefetch_elems = z->stage3_prefetch_bucket_size,
                          .persistence_threshold = z->stage3_param_persistence_threshold};
    if (e->pnvme) {
        const zoff_offload_param_config *op = &z->offload_param;
        so.nvme.dir = op->nvme_path;
        so.nvme.buffer_count = op->buffer_count;
        so.nvme.buffer_size = op->buffer_size;
        so.nvme.max_in_cpu = op->max_in_cpu;
        so.nvme.pin_memory = op->pin_memory;
        zoff_aio_options_from_config(&e->cfg->aio, &so.nvme.aio);
    }
    zoff_status st = zoff_s3_create(&so, &e->s3);
    if (st != ZOFF_OK && e->pnvme) return zoff_error_context(st, "offload_param.device nvme");
    return st;
}

/* After the update: every rank's new weights to every rank (stages 1, 2; pipelined: per
 * group, zoff_eng_pipe_gather). */
static zoff_status dp_gather_weights(zoff_engine *e) {
    if (e->s3) return zoff_s3_params_updated(e->s3); /* gathered on use; persistent groups now */
    if (e->world == 1 || e->replicated) return ZOFF_OK;
    /* the compute stream has waited for the host pushes and the device optimizer */
    ZOFF_TRY(zoff_event_record(e->ev_gather, e->compute));
    ZOFF_TRY(zoff_stream_wait_event(e->d2h, e->ev_gather));
    ZOFF_TRY(zoff_dp_allgather_params(&e->plan, e->chan, e->d2h, e->params, e->dtype, &e->scratch, &e->layout));
    ZOFF_TRY(zoff_event_record(e->ev_gather, e->d2h));
    return zoff_stream_wait_event(e->compute, e->ev_gather);
}

/* Pipelined, several ranks: the gathers of this round come after the device optimizer's
 * writes of this rank's device sub-groups (compute stream) and after the last backward's
 * reductions (the collective stream itself). Caller thread, before the job or commit. */
static zoff_status pipe_gather_after_compute(zoff_engine *e) {
    if (e->world == 1) return ZOFF_OK;
    ZOFF_TRY(zoff_event_record(e->ev_gather, e->compute));
    return zoff_stream_wait_event(e->d2h, e->ev_gather);
}

void zoff_eng_pipe_open(zoff_engine *e) {
    memcpy(e->group_left, e->group_hsg, (size_t)zoff_wready_groups(e->wr) * sizeof(int));
    e->pipe_next = 0;
}

zoff_status zoff_eng_pipe_gather(zoff_engine *e) {
    int ng = zoff_wready_groups(e->wr);
    for (; e->world > 1 && e->pipe_next < ng && e->group_left[e->pipe_next] == 0; e->pipe_next++) {
        int g = e->pipe_next;
        int64_t lo = zoff_wready_group_start(e->wr, g);
        int64_t hi = g + 1 < ng ? zoff_wready_group_start(e->wr, g + 1) : e->n_model;
        ZOFF_TRY(zoff_event_record(e->ev_pushed, e->h2d)); /* this rank's part of g is on its way */
        ZOFF_TRY(zoff_stream_wait_event(e->d2h, e->ev_pushed));
        ZOFF_TRY(zoff_dp_allgather_range(&e->plan, e->chan, e->d2h, e->params, e->dtype, &e->scratch, &e->layout,
                                         lo, hi));
        ZOFF_TRY(zoff_wready_arrive(e->wr, g, e->d2h));
    }
    return ZOFF_OK;
}

zoff_status zoff_eng_pipe_pushed(zoff_engine *e, int i) {
    int g = e->sg_group[i];
    if (--e->group_left[g] > 0) return ZOFF_OK;
    if (e->world > 1) return zoff_eng_pipe_gather(e);
    return zoff_wready_arrive(e->wr, g, e->h2d);
}

void zoff_eng_note_async(zoff_engine *e, zoff_status s, const char *what) {
    if (e->async_status == ZOFF_OK) {
        e->async_status = s;
        snprintf(e->async_msg, sizeof e->async_msg, "%s (rank %d of %d): %s", what, e->rank, e->world,
                 zoff_last_error());
    }
}

static zoff_status take_async(zoff_engine *e) {
    zoff_status s = e->async_status;
    if (s == ZOFF_OK) return ZOFF_OK;
    e->async_status = ZOFF_OK;
    return zoff_error(s, "%s", e->async_msg);
}

static zoff_status build_ranges(zoff_engine *e, const zoff_tensor_info *t, int nt) {
    e->ranges = calloc((size_t)(nt > 0 ? nt : 1), sizeof *e->ranges);
    if (!e->ranges) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the engine's tensor ranges");
    int64_t covered = 0;
    for (int i = 0; i < nt; i++) {
        if (t[i].offset != covered)
            return zoff_error(ZOFF_ERR_INVALID, "tensor table is not contiguous at '%s' (offset %lld, expected %lld)",
                              t[i].name, (long long)t[i].offset, (long long)covered);
        covered += t[i].numel;
        if (e->nranges > 0 && e->ranges[e->nranges - 1].decay == t[i].decay)
            e->ranges[e->nranges - 1].count += t[i].numel;
        else
            e->ranges[e->nranges++] = (range){t[i].offset, t[i].numel, t[i].decay};
    }
    if (covered != e->n)
        return zoff_error(ZOFF_ERR_INVALID, "tensor table covers %lld elements but num_params is %lld",
                          (long long)covered, (long long)e->n);
    return ZOFF_OK;
}

/* Where sub-groups must end, in this rank's optimizer space: where the partition's
 * pieces end (several pieces: each sub-group one model range) and where a layer
 * group starts inside a piece (zoff_placement_layer_cuts). */
static int64_t *subgroup_cuts(const zoff_engine *e, int *ncuts) {
    *ncuts = 0;
    bool layers = zoff_placement_layer_cuts(e->world, e->cfg->zero.stage,
                                            e->cfg->zero.offload_optimizer.device == ZOFF_OFFLOAD_NVME);
    int64_t *c = malloc((size_t)(e->nmap + (layers ? e->ntensors : 0) + 1) * sizeof *c);
    if (!c) return NULL;
    for (int k = 0; k < e->nmap; k++) { /* pieces in local order; each piece's cuts ascending */
        const zoff_dp_piece *q = &e->map[k];
        if (k > 0) c[(*ncuts)++] = q->local;
        for (int i = 1; layers && i < e->ntensors; i++) {
            int64_t off = e->tensors[i].offset;
            if (e->tensors[i].layer != e->tensors[i - 1].layer && off > q->model && off < q->model + q->count)
                c[(*ncuts)++] = q->local + (off - q->model);
        }
    }
    return c;
}

/* Cut [0, n) into sub-groups and place them (zoff_placement_build, shared with zoff plan). */
static zoff_status build_subgroups(zoff_engine *e, double host_ratio) {
    int ncuts = 0;
    int64_t *cuts = subgroup_cuts(e, &ncuts);
    if (!cuts) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the sub-group cuts");
    zoff_placement_input in = {.n = e->n, .sub_group_size = e->cfg->zero.sub_group_size, .ratio = host_ratio,
                               .cuts = cuts, .ncuts = ncuts};
    zoff_placement pl;
    zoff_status s = zoff_placement_build(&in, &pl);
    free(cuts);
    if (s != ZOFF_OK) return s;
    int64_t sgs = e->cfg->zero.sub_group_size > 0 ? e->cfg->zero.sub_group_size : e->n;
    if (pl.grid < sgs && pl.grid < e->n)
        zoff_log(ZOFF_LOG_INFO,
                 "offload_optimizer.ratio %.3g: sub-groups of %lld elements from sub_group_size %lld so that the "
                 "ratio can be honoured in whole sub-groups (%lld parameters)",
                 host_ratio, (long long)pl.grid, (long long)sgs, (long long)e->n);
    e->sg = calloc((size_t)pl.nsg, sizeof *e->sg);
    if (!e->sg) {
        zoff_placement_free(&pl);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %d sub-groups", pl.nsg);
    }
    e->nsg = pl.nsg;
    for (int i = 0; i < pl.nsg; i++) {
        subgroup *g = &e->sg[i];
        *g = (subgroup){.offset = pl.sg[i].offset, .count = pl.sg[i].count, .on_host = pl.sg[i].on_host};
        g->model = map_local(e, g->offset);
        g->state_off = g->on_host ? e->n_host : e->n_dev;
        if (g->on_host) e->n_host += g->count;
        else e->n_dev += g->count;
    }
    zoff_placement_free(&pl);
    return ZOFF_OK;
}

/* The host buffers a device copy reads or writes (gradients in, new weights out, staging, the
 * fp32 master where the device reads it: zoff_placement_host_buffers' hb.pinned): pinned with
 * pin_memory, since an asynchronous copy from pageable memory is staged by the driver and
 * synchronous. The time spent pinning is start-up's "pinning" phase. */
static zoff_status dma_alloc(zoff_engine *e, size_t bytes, const char *what, void **out) {
    if (!e->pinned) {
        *out = zoff_aligned_alloc(4096, bytes, what);
        return *out ? ZOFF_OK : ZOFF_ERR_NOMEM;
    }
    double t = zoff_now();
    zoff_status s = zoff_host_alloc_pinned(e->dev, bytes, what, out);
    e->startup.pinning += zoff_lap(&t);
    return s;
}

static void dma_free(zoff_engine *e, void *p) {
    if (!p) return;
    if (e->pinned) zoff_host_free_pinned(e->dev, p);
    else zoff_aligned_free(p);
}

/* Arrays from this size on are 2 MiB-aligned and asked for transparent huge pages. */
#define STATE_HUGE_ALIGN ((size_t)2 << 20)
#define STATE_HUGE_MIN ((size_t)64 << 20)

/* $ZOFF_HUGEPAGES: unset, empty or 1, the host state's large arrays ask for transparent huge pages
 * (the default); 0, they do not; anything else is an error naming the variable. */
static zoff_status state_huge_pages(bool *on) {
    const char *env = getenv("ZOFF_HUGEPAGES");
    *on = !env || !*env || !strcmp(env, "1");
    if (*on || !strcmp(env, "0")) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_CONFIG,
                      "environment variable ZOFF_HUGEPAGES=%s: give 1 (transparent huge pages for the host optimizer "
                      "state, the default) or 0 (ordinary 4 KiB pages), or unset it",
                      env);
}

/* Optimizer state that only the CPU touches (m, v, a master the device does not read, the
 * speculation's saved copy): pageable, whatever pin_memory says. The pages are not touched
 * here: state_first_touch faults them in by the optimizer's update chunks (NUMA placement).
 * Large arrays are 2 MiB-aligned and, unless ZOFF_HUGEPAGES=0 (e->state_thp), ask for
 * transparent huge pages (MADV_HUGEPAGE): 512 times fewer page faults at the first touch.
 * Measured (docs/performance.md, "Transparent huge pages for the optimizer state"): the 13B
 * plan's first touch on the H100 box 2.05-2.08 s with them against 4.27-10.96 s without, the
 * 354M job's here 0.74-0.98 s against 1.30-2.54 s (and no slower with the page cache full);
 * the update itself runs as fast either way. Freed with free(). */
static void *state_alloc(const zoff_engine *e, size_t bytes, const char *what) {
    const bool huge = bytes >= STATE_HUGE_MIN;
    void *p = zoff_aligned_alloc(huge ? STATE_HUGE_ALIGN : 4096, bytes, what);
#ifdef MADV_HUGEPAGE
    if (p && huge && e->state_thp) (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice: a kernel may decline */
#else
    (void)e;
#endif
    return p;
}

/* The first touch of host state (master, m, v, or the speculation's copies), host sub-group by
 * sub-group in the chunks the optimizer's threads update (zoff_host_optimizer_first_touch):
 * m and v initialised, the master's pages faulted in (its values are the initial weights' or
 * a checkpoint's to write). Start-up's "first touch" phase. */
static zoff_status state_first_touch(zoff_engine *e, float *master, void *m, void *v) {
    double t0 = zoff_now();
    zoff_status s = ZOFF_OK;
    for (int i = 0; s == ZOFF_OK && i < e->nsg; i++) {
        const subgroup *g = &e->sg[i];
        if (!g->on_host) continue;
        zoff_optim_tensors t = {.params = master + g->state_off, .exp_avg = st_at(e, m, g->state_off),
                                .exp_avg_sq = st_at(e, v, g->state_off), .state_dt = e->sdt, .n = g->count};
        s = zoff_host_optimizer_first_touch(e->hopt, &t);
    }
    e->startup.first_touch += zoff_lap(&t0);
    return s;
}

/* Stage 3: what s3_setup and the gathers will allocate (zoff_placement_s3_auto_bytes) over the
 * model's layer groups: the first, the largest of the middle ones, the last. */
static size_t s3_auto_bytes(const zoff_engine *e) {
    const zoff_zero_config *z = &e->cfg->zero;
    int ng = e->ngroups;
    int64_t mid = 0;
    for (int g = 1; g < ng - 1; g++)
        if (e->gcnt[g] > mid) mid = e->gcnt[g];
    size_t gathered = zoff_placement_s3_gathered(e->gcnt[0], mid, ng > 2 ? ng - 2 : 0, ng > 1 ? e->gcnt[ng - 1] : 0,
                                                 z->stage3_param_persistence_threshold,
                                                 z->stage3_prefetch_bucket_size, e->esize);
    return zoff_placement_s3_auto_bytes(e->n, z->offload_param.device == ZOFF_OFFLOAD_NONE, gathered, e->esize);
}

/* "ratio": "auto" (zoff_placement_auto_ratio, shared with zoff plan); prints the arithmetic. */
static zoff_status auto_ratio(zoff_engine *e, size_t fixed, size_t grad_per_param, double *ratio) {
    const size_t s3 = e->cfg->zero.stage >= 3 ? s3_auto_bytes(e) : 0;
    fixed += s3;
    zoff_memory_stats ms;
    zoff_device_memory_stats(e->dev, &ms);
    zoff_auto_ratio ar;
    zoff_placement_auto_ratio(ms.device_budget, ms.device_in_use, fixed, grad_per_param, e->n, e->dtype, &ar);
    char b1[32], b2[32], b3[32], b4[32], b5[32];
    if (ms.device_budget == 0) {
        *ratio = 0.0;
        zoff_log(ZOFF_LOG_INFO,
                 "offload_optimizer.ratio auto: the device has no memory budget (CPU backend without "
                 "--device-memory): everything fits, host ratio 0");
        return ZOFF_OK;
    }
    if (!ar.fits)
        return zoff_error(ZOFF_ERR_DEVICE_OOM,
                          "offload_optimizer.ratio auto: the device budget %s is used up by the model (%s in use: "
                          "weights, gradients, activations), the engine's %s (statistics%s%s) and the %s margin "
                          "(5%%); even ratio 1 (all optimizer state on the host) does not fit. Lower the "
                          "micro-batch size, use --checkpoint-activations, or raise --device-memory",
                          zoff_format_bytes(ms.device_budget, b1, sizeof b1), zoff_format_bytes(ms.device_in_use, b2, sizeof b2),
                          zoff_format_bytes(fixed, b5, sizeof b5), grad_per_param ? ", gradient buckets" : "",
                          s3 ? ", stage 3 weight and gradient partitions, gathered groups" : "",
                          zoff_format_bytes(ar.margin, b3, sizeof b3));
    *ratio = ar.ratio;
    zoff_log(ZOFF_LOG_INFO,
             "offload_optimizer.ratio auto: budget %s - in use %s (weights, gradients, activations) - engine %s "
             "(statistics%s%s) - margin %s (5%%) = %s free; device optimizer state takes %zu B/param%s, so at most "
             "%lld of %lld parameters fit on the device: host ratio >= %.4f (rounded up to whole sub-groups)",
             zoff_format_bytes(ms.device_budget, b1, sizeof b1), zoff_format_bytes(ms.device_in_use, b2, sizeof b2),
             zoff_format_bytes(fixed, b5, sizeof b5), grad_per_param ? ", gradient buckets" : "",
             s3 ? ", stage 3 weight and gradient partitions, gathered groups" : "",
             zoff_format_bytes(ar.margin, b3, sizeof b3), zoff_format_bytes(ar.free_bytes, b4, sizeof b4), ar.per_param,
             grad_per_param ? " with its gradient" : "", (long long)(ar.max_device < e->n ? ar.max_device : e->n), (long long)e->n, *ratio);
    return ZOFF_OK;
}

/* With several ranks every rank must place its partition alike (the collectives' counts follow the
 * sub-groups): "auto" takes the largest host ratio any rank needs, which fits every rank's device.
 * Collective; s: this rank's status so far (a rank that failed says so to the others, none hangs). */
static zoff_status agree_ratio(zoff_engine *e, zoff_status s, double *ratio) {
    double v[2] = {s == ZOFF_OK ? *ratio : 0.0, s == ZOFF_OK ? 0.0 : 1.0};
    zoff_status c = zoff_comm_allreduce_f64(e->comm, v, 2, ZOFF_REDUCE_MAX);
    if (s != ZOFF_OK) return s;
    if (c != ZOFF_OK) return c;
    if (v[1] > 0)
        return zoff_error(ZOFF_ERR_DEVICE_OOM, "offload_optimizer.ratio auto: another rank could not place its "
                                               "optimizer state (its message says why)");
    if (v[0] != *ratio)
        zoff_log(ZOFF_LOG_INFO,
                 "offload_optimizer.ratio auto: the ranks take the largest host ratio any of them needs, %.4f (this "
                 "rank's device alone: %.4f), so that every rank places its partition alike",
                 v[0], *ratio);
    *ratio = v[0];
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ NVMe state (ZeRO-Infinity) */

/* Swap arrays: 0 master, then m (if the optimizer uses it), then v (if it does). */
/* Swap array of engine state i (0 master, 1 m, 2 v); -1 when the optimizer has none. */
static int nvme_array_of(const zoff_engine *e, int i) {
    if (i == 0) return 0;
    if (i == 1) return uses_m(e) ? 1 : -1;
    return uses_v(e) ? 1 + (int)uses_m(e) : -1;
}

/* A note at start when the swap file's alignment padding (zoff_swapper_padding_exceeds) is more than
 * the state itself: small sub-groups make a swap file many times the state, slow to create and to
 * save, which nothing else would explain. */
static void nvme_padding_note(const zoff_engine *e, const zoff_swapper_options *so) {
    size_t padded, data;
    int64_t min_count;
    if (!zoff_swapper_padding_exceeds(so->counts, so->num_groups, so->num_arrays, so->dtype, &padded, &data, &min_count))
        return;
    char pb[32], db[32], why[160];
    const int64_t sgs = e->cfg->zero.sub_group_size;
    if (sgs > 0 && sgs < min_count)
        snprintf(why, sizeof why, "a zero_optimization.sub_group_size of at least %lld elements (now %lld) keeps it "
                 "below the data", (long long)min_count, (long long)sgs);
    else
        snprintf(why, sizeof why, "the sub-groups are the model's layers, cut there for NVMe, and they are small");
    zoff_log(ZOFF_LOG_INFO,
             "note: offload_optimizer nvme: the swap file holds %s of optimizer state in %s: each of its %d "
             "sub-groups pads each state array to %d bytes (O_DIRECT), which makes it slow to create and to save; %s",
             zoff_format_bytes(data, db, sizeof db), zoff_format_bytes(padded, pb, sizeof pb), so->num_groups,
             ZOFF_AIO_ALIGN, why);
}

/* One swap group per host sub-group; updated from the top down like the host state. */
static zoff_status nvme_create(zoff_engine *e) {
    const zoff_offload_optimizer_config *oo = &e->cfg->zero.offload_optimizer;
    int nh = 0;
    for (int i = 0; i < e->nsg; i++) nh += e->sg[i].on_host;
    int64_t *counts = calloc((size_t)nh, sizeof *counts);
    e->swap_sg = calloc((size_t)nh, sizeof *e->swap_sg);
    e->swap_order = calloc((size_t)nh, sizeof *e->swap_order);
    if (!counts || !e->swap_sg || !e->swap_order) {
        free(counts);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %d NVMe sub-groups", nh);
    }
    for (int i = 0; i < e->nsg; i++)
        if (e->sg[i].on_host) {
            e->swap_sg[e->nswap] = i;
            counts[e->nswap++] = e->sg[i].count;
        }
    for (int k = 0; k < nh; k++) e->swap_order[k] = nh - 1 - k;
    zoff_swapper_options so = {.dir = oo->nvme_path, .stem = "optimizer", .num_groups = nh, .counts = counts,
                               .num_arrays = nvme_narrays(e), .buffer_count = oo->buffer_count,
                               .pipeline_read = oo->pipeline_read, .pipeline_write = oo->pipeline_write,
                               .fast_init = oo->fast_init, .pin_memory = e->pinned, .dev = e->dev};
    /* what zoff_host_optimizer_init_state writes: m = 0; v = 0 (Adagrad: initial_accumulator_value) */
    if (uses_v(e) && e->cfg->optimizer.type == ZOFF_OPTIM_ADAGRAD)
        so.init_value[nvme_array_of(e, 2)] = (float)e->cfg->optimizer.initial_accumulator_value;
    for (int i = 1; i <= 2; i++) /* m and v in the state dtype (zoff_optimizer_state_dtype), as in host memory */
        if (nvme_array_of(e, i) >= 0) so.dtype[nvme_array_of(e, i)] = e->sdt;
    zoff_aio_options_from_config(&e->cfg->aio, &so.aio);
    zoff_status s = zoff_swapper_create(&so, &e->swap);
    if (s == ZOFF_OK) nvme_padding_note(e, &so);
    free(counts);
    if (s != ZOFF_OK) return zoff_error_context(s, "offload_optimizer.device nvme");
    return ZOFF_OK;
}

/* The initial weights of this rank's optimizer-space range [lo, hi) into dst: from
 * init_params (gathered into this rank's order) or from init_range over the model runs
 * that make the range. */
static zoff_status init_fill(zoff_engine *e, int64_t lo, int64_t hi, float *dst) {
    if (e->init_full) {
        zoff_par_memcpy(dst, e->init_full + lo, (size_t)(hi - lo) * sizeof(float));
        return ZOFF_OK;
    }
    if ((e->world == 1 && !e->stage3) || e->replicated) return e->init_range(e->init_arg, lo, hi, dst);
    const zoff_dp_plan *p = &e->plan;
    for (int k = 0; k < p->nown[e->rank]; k++) {
        const zoff_dp_piece *q = &p->pieces[p->own[e->rank][k]];
        int64_t a = q->local > lo ? q->local : lo, b = q->local + q->count < hi ? q->local + q->count : hi;
        if (a < b) ZOFF_TRY(e->init_range(e->init_arg, q->model + (a - q->local), q->model + (b - q->local), dst + (a - lo)));
    }
    return ZOFF_OK;
}

/* The initial state on disk: master = init (zeros without), m and v as the
 * optimizer initialises them (fast_init: master only; m and v are produced in
 * memory at their first read). */
static zoff_status nvme_write_initial(zoff_engine *e, bool init) {
    bool fast = e->cfg->zero.offload_optimizer.fast_init;
    ZOFF_TRY(zoff_swapper_begin(e->swap, e->swap_order, e->nswap, ZOFF_SWAP_WRITE, fast ? 1u : nvme_all_arrays(e)));
    for (int k = 0; k < e->nswap; k++) {
        int sw;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        ZOFF_TRY(zoff_swapper_next(e->swap, &sw, arr));
        const subgroup *g = &e->sg[e->swap_sg[sw]];
        if (init) ZOFF_TRY(init_fill(e, g->offset, g->offset + g->count, arr[0]));
        else memset(arr[0], 0, (size_t)g->count * sizeof(float));
        if (!fast) {
            int am = nvme_array_of(e, 1), av = nvme_array_of(e, 2);
            zoff_optim_tensors t = {.params = arr[0], .exp_avg = am >= 0 ? arr[am] : NULL,
                                    .exp_avg_sq = av >= 0 ? arr[av] : NULL, .state_dt = e->sdt,
                                    .grads = arr[0], .grad_dt = ZOFF_F32, .n = g->count};
            ZOFF_TRY(zoff_host_optimizer_init_state(e->hopt, &t));
        }
        ZOFF_TRY(zoff_swapper_release(e->swap));
    }
    return zoff_swapper_end(e->swap);
}

/* zoff_hr_update: the next sub-group's state from the swapper (it must be sub-group i). */
zoff_status zoff_eng_nvme_next(zoff_engine *e, int i, float **master, void **m, void **v) {
    int sw;
    void *arr[ZOFF_SWAP_MAX_ARRAYS];
    ZOFF_TRY(zoff_swapper_next(e->swap, &sw, arr));
    if (e->swap_sg[sw] != i)
        return zoff_error(ZOFF_ERR_INTERNAL, "NVMe swapper returned sub-group %d, expected %d", e->swap_sg[sw], i);
    int am = nvme_array_of(e, 1), av = nvme_array_of(e, 2);
    *master = arr[0];
    *m = am >= 0 ? arr[am] : NULL;
    *v = av >= 0 ? arr[av] : NULL;
    return ZOFF_OK;
}

/* zoff_hr_update: sub-group g is updated; fp32 weights go to the device from the
 * staging buffer (the swap buffer is reused), then the state goes back to disk. */
zoff_status zoff_eng_nvme_release(zoff_engine *e, const subgroup *g, const float *master) {
    if (e->dtype == ZOFF_F32 && e->h_staging)
        memcpy((float *)e->h_staging + g->state_off, master, (size_t)g->count * sizeof(float));
    return zoff_swapper_release(e->swap);
}

/* offload_param nvme: the weights of host sub-group g's local range [lo, hi) from its fp32
 * master (mst: g's master at g->offset) to the stage 3 swap file, highest first. */
static zoff_status pn_put_master(zoff_engine *e, const subgroup *g, const float *mst, int64_t lo, int64_t hi) {
    while (hi > lo) {
        int64_t a;
        void *out;
        ZOFF_TRY(zoff_s3_out_span(e->s3, lo, hi, &a, &out));
        const float *src = mst + (a - g->offset);
        if (e->dtype == ZOFF_F32) memcpy(out, src, (size_t)(hi - a) * sizeof(float));
        else if (e->dtype == ZOFF_BF16) zoff_par_f32_to_bf16(out, src, (size_t)(hi - a));
        else zoff_par_f32_to_f16(out, src, (size_t)(hi - a));
        ZOFF_TRY(zoff_s3_out_done(e->s3, a, hi));
        hi = a;
    }
    return ZOFF_OK;
}

/* fn(e, g, master) for every host sub-group, its fp32 master read from the optimizer's swap file. */
static zoff_status each_swapped_master(zoff_engine *e, zoff_status (*fn)(zoff_engine *, const subgroup *, const float *)) {
    ZOFF_TRY(zoff_swapper_begin(e->swap, e->swap_order, e->nswap, ZOFF_SWAP_READ, 1u));
    for (int k = 0; k < e->nswap; k++) {
        int sw;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        ZOFF_TRY(zoff_swapper_next(e->swap, &sw, arr));
        ZOFF_TRY(fn(e, &e->sg[e->swap_sg[sw]], arr[0]));
        ZOFF_TRY(zoff_swapper_release(e->swap));
    }
    return zoff_swapper_end(e->swap);
}

static zoff_status pn_put_group(zoff_engine *e, const subgroup *g, const float *mst) {
    return pn_put_master(e, g, mst, g->offset, g->offset + g->count);
}

/* offload_param nvme: every host sub-group's master (host memory or the optimizer's swap
 * file) rounded into the parameter swap file (initial weights, restore). */
static zoff_status pn_master_to_file(zoff_engine *e) {
    ZOFF_TRY(zoff_s3_begin_update(e->s3));
    if (e->swap) {
        ZOFF_TRY(each_swapped_master(e, pn_put_group));
    } else {
        for (int i = e->nsg - 1; i >= 0; i--) {
            const subgroup *g = &e->sg[i];
            if (g->on_host) ZOFF_TRY(pn_put_group(e, g, e->h_master + g->state_off));
        }
    }
    return zoff_s3_end_update(e->s3);
}

static zoff_status staging_put_group(zoff_engine *e, const subgroup *g, const float *mst) {
    if (e->dtype == ZOFF_F32) {
        memcpy((float *)e->h_staging + g->state_off, mst, (size_t)g->count * sizeof(float));
    } else {
        uint16_t *st = (uint16_t *)host_weights_out(e) + g->state_off;
        if (e->dtype == ZOFF_BF16) zoff_par_f32_to_bf16(st, mst, (size_t)g->count);
        else zoff_par_f32_to_f16(st, mst, (size_t)g->count);
    }
    return ZOFF_OK;
}

/* The 16-bit (or fp32) weights of the host sub-groups from the master on disk. */
static zoff_status nvme_master_to_staging(zoff_engine *e) { return each_swapped_master(e, staging_put_group); }

/* n elements between state st (dtype dt) and the caller's h (dtype hdt: dt, a plain copy, or
 * fp32, which bf16 state widens to exactly and rounds from to nearest even); get: st -> h. */
static void state_convert(void *st, zoff_dtype dt, void *h, zoff_dtype hdt, int64_t n, bool get) {
    if (dt == hdt) {
        const size_t bytes = (size_t)n * zoff_dtype_size(dt);
        if (get) memcpy(h, st, bytes);
        else memcpy(st, h, bytes);
        return;
    }
    uint16_t *b = st;
    float *f = h;
    if (get)
        for (int64_t k = 0; k < n; k++) f[k] = zoff_half_bf16_to_f32(b[k]);
    else
        for (int64_t k = 0; k < n; k++) b[k] = zoff_half_f32_to_bf16(f[k]);
}

/* The dtype of host state array i (0 master, 1 m, 2 v). */
static zoff_dtype host_state_dt(const zoff_engine *e, int i) { return i == 0 ? ZOFF_F32 : e->sdt; }

/* state_io for the host sub-groups: one pass over the swap file, array i only. */
static zoff_status nvme_state_io(zoff_engine *e, int i, float *host, bool get, bool absent) {
    int a = nvme_array_of(e, i);
    if (absent || a < 0) {
        if (get)
            for (int k = 0; k < e->nswap; k++) {
                const subgroup *g = &e->sg[e->swap_sg[k]];
                memset(host + g->offset, 0, (size_t)g->count * sizeof(float));
            }
        return ZOFF_OK;
    }
    ZOFF_TRY(zoff_swapper_begin(e->swap, e->swap_order, e->nswap, get ? ZOFF_SWAP_READ : ZOFF_SWAP_WRITE, 1u << a));
    for (int k = 0; k < e->nswap; k++) {
        int sw;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        ZOFF_TRY(zoff_swapper_next(e->swap, &sw, arr));
        const subgroup *g = &e->sg[e->swap_sg[sw]];
        state_convert(arr[a], host_state_dt(e, i), host + g->offset, ZOFF_F32, g->count, get);
        ZOFF_TRY(zoff_swapper_release(e->swap));
    }
    return zoff_swapper_end(e->swap);
}

/* zoff_swapper_range's parts of a state array: its dtype in the swap file <-> host memory of hdt. */
typedef struct nvme_range_arg {
    void *host;
    zoff_dtype dt, hdt;
    bool get;
} nvme_range_arg;
static void nvme_range_convert(void *arg, int64_t k, int64_t n, void *data) {
    const nvme_range_arg *r = arg;
    state_convert(data, r->dt, (char *)r->host + (size_t)k * zoff_dtype_size(r->hdt), r->hdt, n, r->get);
}

/* state_range for host sub-group k: its elements [lo, lo + c) of state array i, in the swap file,
 * to or from h of dtype hdt. */
static zoff_status nvme_state_range(zoff_engine *e, int k, int i, int64_t lo, int64_t c, void *h, zoff_dtype hdt,
                                    bool get) {
    int a = nvme_array_of(e, i), sw = 0;
    if (a < 0) {
        if (get) memset(h, 0, (size_t)c * zoff_dtype_size(hdt));
        return ZOFF_OK;
    }
    while (sw < e->nswap && e->swap_sg[sw] != k) sw++;
    nvme_range_arg ra = {.host = h, .dt = host_state_dt(e, i), .hdt = hdt, .get = get};
    return zoff_swapper_range(e->swap, sw, a, lo, c, !get, nvme_range_convert, &ra);
}

/* ------------------------------------------------------------------ create / destroy */

void zoff_engine_destroy(zoff_engine *e) {
    if (!e) return;
    if (e->worker_started) {
        pthread_mutex_lock(&e->mu);
        e->quit = true;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->worker, NULL);
    }
    if (e->s3) {
        zoff_s3_stats ss;
        zoff_s3_get_stats(e->s3, &ss);
        zoff_log(ZOFF_LOG_DEBUG, "stage 3: %lld gathers, %lld of them ahead of use, %lld prefetch hits; pool %zu bytes",
                 (long long)ss.gathers, (long long)ss.prefetched, (long long)ss.prefetch_hits, ss.pool_bytes);
    }
    zoff_s3_destroy(e->s3); /* synchronises its streams */
    if (e->compute) zoff_stream_synchronize(e->compute);
    zoff_eng_snap_destroy(e); /* a device share's copy begun ahead of a save that never began, joined: it reads d_m.. */
    if (e->s3_params_dev) zoff_device_free(e->dev, e->s3_params_dev);
    if (e->s3_grads_dev) zoff_device_free(e->dev, e->s3_grads_dev);
    if (e->d2h) zoff_stream_destroy(e->d2h);
    if (e->h2d) zoff_stream_destroy(e->h2d);
    if (e->opt_stream) zoff_stream_destroy(e->opt_stream);
    zoff_event_destroy(e->ev_grads_done);
    zoff_event_destroy(e->ev_weights_done);
    zoff_event_destroy(e->ev_dev_done);
    zoff_event_destroy(e->ev_stats);
    for (int i = 0; i < e->cap_ready; i++) zoff_event_destroy(e->ev_ready[i]);
    free(e->ev_ready);
    if (e->dtype != ZOFF_F32) zoff_device_free(e->dev, e->d_master);
    zoff_device_free(e->dev, e->d_m);
    zoff_device_free(e->dev, e->d_v);
    zoff_bk_destroy(e);
    if (e->hb.master_dma) dma_free(e, e->h_master);
    else free(e->h_master);
    ZOFF_FREE_ALL(e->h_m, e->h_v); /* state_alloc's */
    dma_free(e, e->h_grads[0]);
    dma_free(e, e->h_grads[1]);
    dma_free(e, e->h_staging);
    zoff_host_optimizer_destroy(e->hopt);
    if (e->scratch.recv) zoff_device_free(e->dev, e->scratch.recv);
    if (e->scratch.pack) zoff_device_free(e->dev, e->scratch.pack);
    zoff_event_destroy(e->ev_gather);
    zoff_comm_destroy(e->chan);
    zoff_dp_layout_free(&e->layout);
    zoff_dp_plan_free(&e->plan);
    free(e->map);
    free(e->tl);
    zoff_swapper_destroy(e->swap);
    free(e->swap_sg);
    free(e->swap_order);
    if (e->mu_init) {
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
    }
    ZOFF_FREE_ALL(e->sg_group, e->sg_span[0], e->sg_span[1], e->sg_span_off[0], e->sg_span_off[1], e->group_left,
                  e->group_hsg, e->group_need, e->pipe_order);
    zoff_event_destroy(e->ev_pushed);
    for (int g = 0; e->ev_release && g < zoff_wready_groups(e->wr); g++) zoff_event_destroy(e->ev_release[g]);
    free(e->ev_release);
    ZOFF_FREE_ALL(e->g_updated, e->g_released, e->g_pushed, e->bk_master, e->bk_m, e->bk_v, e->sg_state, e->sp_run,
                  e->sp_gap);
    zoff_wready_destroy(e->wr);
    ZOFF_FREE_ALL(e->ranges, e->sg, e);
}

/* Several ranks: the host sub-groups' update order, by model offset (round-robin local
 * order need not be the model's); NULL when it is the index order. */
static zoff_status pipe_order(zoff_engine *e) {
    bool sorted = true;
    for (int i = 1; i < e->nsg; i++) sorted = sorted && e->sg[i].model > e->sg[i - 1].model;
    if (sorted) return ZOFF_OK;
    if (!(e->pipe_order = malloc((size_t)e->nsg * sizeof *e->pipe_order)))
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the weight pipeline");
    for (int i = 0; i < e->nsg; i++) { /* insertion sort: a few hundred sub-groups at most */
        int j = i;
        for (; j > 0 && e->sg[e->pipe_order[j - 1]].model > e->sg[i].model; j--) e->pipe_order[j] = e->pipe_order[j - 1];
        e->pipe_order[j] = i;
    }
    return ZOFF_OK;
}

/* The pipelined exact step (see the struct): each sub-group inside one layer group. */
static zoff_status pipe_setup(zoff_engine *e, const zoff_engine_options *o) {
    /* several ranks with the delayed update: the step's all-gather (not pipelined) */
    if (!o->weight_waits || !zoff_placement_pipelined(e->world, e->cfg->zero.stage, e->swap != NULL, e->dpu) ||
        e->n_host == 0)
        return ZOFF_OK;
    ZOFF_TRY(zoff_wready_create(e->dev, e->tensors, e->ntensors, &e->wr));
    int ng = zoff_wready_groups(e->wr);
    e->sg_group = calloc((size_t)e->nsg, sizeof *e->sg_group);
    e->group_left = calloc((size_t)ng, sizeof *e->group_left);
    e->group_hsg = calloc((size_t)ng, sizeof *e->group_hsg);
    e->group_need = calloc((size_t)ng, sizeof *e->group_need);
    if (!e->sg_group || !e->group_left || !e->group_hsg || !e->group_need)
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the weight pipeline");
    for (int i = 0; i < e->nsg; i++) {
        const subgroup *g = &e->sg[i];
        int a = zoff_wready_group_of(e->wr, g->model), b = zoff_wready_group_of(e->wr, g->model + g->count - 1);
        if (a != b) return ZOFF_OK; /* not cut at the layer groups: the step waits for all weights */
        e->sg_group[i] = a;
        if (g->on_host) {
            e->group_hsg[a]++;
            e->group_need[a] = true;
        }
    }
    if (e->world > 1) { /* every group is gathered, also those with no part on this rank */
        for (int g = 0; g < ng; g++) e->group_need[g] = true;
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_pushed));
        ZOFF_TRY(pipe_order(e));
    }
    if (e->dpu) {
        e->g_updated = calloc((size_t)ng, sizeof *e->g_updated);
        e->g_released = calloc((size_t)ng, sizeof *e->g_released);
        e->g_pushed = calloc((size_t)ng, sizeof *e->g_pushed);
        e->ev_release = calloc((size_t)ng, sizeof *e->ev_release);
        if (!e->g_updated || !e->g_released || !e->g_pushed || !e->ev_release)
            return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the weight pipeline");
        for (int g = 0; g < ng; g++) ZOFF_TRY(zoff_event_create(e->dev, &e->ev_release[g]));
    }
    e->pipelined = true;
    return ZOFF_OK;
}

/* Speculation (offload_optimizer.super_offload): the saved state of every host sub-group. With
 * none (offload_optimizer.ratio 0, or "auto" choosing 0) there is nothing to speculate: the exact
 * step, said once. */
static zoff_status spec_setup(zoff_engine *e) {
    if (e->n_host == 0) {
        zoff_log(ZOFF_LOG_INFO, "offload_optimizer.super_offload: the whole optimizer update is on the device "
                 "(offload_optimizer.ratio %s 0), nothing to speculate on the host: every step is the exact one",
                 e->cfg->zero.offload_optimizer.ratio_auto ? "auto chose" : "is");
        return ZOFF_OK;
    }
    if (!e->pipelined && !e->stage3)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "zero_optimization.offload_optimizer.super_offload needs stage 1 or 2 with the optimizer "
                          "state in host memory (device \"cpu\") and a model that waits for each group's weights (zoff "
                          "train does; engine option weight_waits), or stage 3; set super_offload false");
    size_t b = (size_t)e->n_host * sizeof(float), bs = (size_t)e->n_host * e->ssize;
    e->bk_master = state_alloc(e, b, "speculation: saved master weights");
    if (e->h_m) e->bk_m = state_alloc(e, bs, "speculation: saved exp_avg");
    if (e->h_v) e->bk_v = state_alloc(e, bs, "speculation: saved exp_avg_sq");
    e->sg_state = calloc((size_t)e->nsg, 1);
    if (!e->bk_master || (e->h_m && !e->bk_m) || (e->h_v && !e->bk_v) || !e->sg_state) return ZOFF_ERR_NOMEM;
    e->spec = true;
    /* the first touch: the state (initialised by host_setup) copied in by the update's chunks */
    double t0 = zoff_now();
    zoff_status s = zoff_hr_spec_touch(e);
    e->startup.first_touch += zoff_lap(&t0);
    return s;
}

static zoff_status check_supported(const zoff_engine_options *o) {
    const zoff_config *cfg = o->cfg;
    const zoff_zero_config *z = &cfg->zero;
    bool offload = z->offload_optimizer.device == ZOFF_OFFLOAD_CPU ||
                   z->offload_optimizer.device == ZOFF_OFFLOAD_NVME || z->cpu_offload;
    if (z->offload_param.device != ZOFF_OFFLOAD_NONE &&
        (!offload || z->offload_optimizer.ratio_auto || z->offload_optimizer.ratio < 1.0))
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "zero_optimization.offload_param.device \"%s\" needs the whole optimizer on the host: "
                          "offload_optimizer.device \"cpu\" (or \"nvme\") with ratio 1 (the host optimizer writes "
                          "the partition's weights %s)",
                          z->offload_param.device == ZOFF_OFFLOAD_NVME ? "nvme" : "cpu",
                          z->offload_param.device == ZOFF_OFFLOAD_NVME ? "to the parameter swap file" : "in place");
    bool s3_nvme = z->stage >= 3 && z->offload_param.device == ZOFF_OFFLOAD_NVME;
    bool s3_cpu32 = z->stage >= 3 && z->offload_param.device == ZOFF_OFFLOAD_CPU && o->dtype == ZOFF_F32;
    if (z->offload_optimizer.super_offload && (!offload || z->offload_optimizer.device == ZOFF_OFFLOAD_NVME ||
                                               z->delayed_param_update || s3_nvme || s3_cpu32))
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "zero_optimization.offload_optimizer.super_offload (speculation-then-validation) is "
                          "implemented for stages 1-3 (any number of ranks) with offload_optimizer.device \"cpu\", "
                          "without zoff_delayed_param_update (got stage %d, device %s%s)%s; set super_offload false",
                          z->stage, z->offload_optimizer.device == ZOFF_OFFLOAD_NVME ? "nvme" : offload ? "cpu" : "none",
                          z->delayed_param_update ? ", delayed update" : "",
                          s3_nvme    ? ": with stage 3, offload_param.device \"nvme\" is not supported (the update "
                                       "writes the parameter swap file the gathers read; use offload_param \"cpu\")"
                          : s3_cpu32 ? ": with stage 3, offload_param.device \"cpu\" needs 16-bit weights (fp32: the "
                                       "gathers read the master the update writes; enable bf16 or fp16)"
                                     : "");
    if (cfg->bf16_optimizer_states && !offload)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "bf16.bf16_optimizer_states true needs the host optimizer (zero_optimization."
                          "offload_optimizer.device \"cpu\" or \"nvme\"); set bf16_optimizer_states false");
    if (z->stage >= 3 && z->delayed_param_update)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "zero_optimization.zoff_delayed_param_update is not implemented with stage 3; use stage 2");
    if (z->stage < 3 && (!o->params || (!o->grads && !zoff_placement_grad_buckets(cfg))))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_create: the model has no %s buffer, which only %s supports",
                          o->params ? "gradient" : "parameter",
                          o->params ? "gradient buckets (zoff_placement_grad_buckets: stage 1-2, "
                                      "offload_optimizer.device cpu or nvme; one rank: gradient_accumulation_steps 1 or "
                                      "zoff_grad_buckets \"always\" (several ranks: at ratio 1))"
                                    : "zero_optimization.stage 3");
    if (offload && z->stage == 0)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "zero_optimization.offload_optimizer needs zero_optimization.stage 1, 2 or 3 (got 0), as in "
                          "DeepSpeed; set \"stage\": 2");
    /* the device optimizer is fused Adam/AdamW only: Lion and Adagrad need the whole update on the host
     * (a Twin-Flow ratio below 1, or "auto", would give the device's sub-groups Adam's update) */
    const char *host_only = cfg->optimizer.type == ZOFF_OPTIM_LION      ? "Lion"
                            : cfg->optimizer.type == ZOFF_OPTIM_ADAGRAD ? "Adagrad"
                                                                        : NULL;
    if (host_only && !offload)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "optimizer.type %s runs on the host optimizer only: set "
                          "zero_optimization.offload_optimizer.device to \"cpu\" (stage 1 or 2)",
                          host_only);
    if (host_only && (z->offload_optimizer.ratio_auto || z->offload_optimizer.ratio < 1.0)) {
        char rv[64];
        if (z->offload_optimizer.ratio_auto) snprintf(rv, sizeof rv, "\"auto\" puts what fits of");
        else snprintf(rv, sizeof rv, "%g leaves part of", z->offload_optimizer.ratio);
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "zero_optimization.offload_optimizer.ratio %s the update on the device optimizer, which "
                          "is Adam/AdamW only, but optimizer.type %s runs on the host optimizer only: set ratio 1 "
                          "(or leave it out), or use Adam/AdamW",
                          rv, host_only);
    }
    if (z->delayed_param_update && !offload)
        return zoff_error(ZOFF_ERR_CONFIG, "zero_optimization.zoff_delayed_param_update needs "
                                           "offload_optimizer.device \"cpu\" or \"nvme\"");
    return ZOFF_OK;
}

/* Before the host allocations below: the exact bytes this rank's host part needs (see
 * include/zoff/resources.h), so that a job too large for the host fails here with what to
 * change instead of being OOM-killed when the pages are first touched. */
/* The sizes of the host buffers (one home: zoff_placement_host_buffers, which zoff plan calls). */
static void host_buffers_of(zoff_engine *e, bool nvme) {
    const zoff_zero_config *z = &e->cfg->zero;
    zoff_host_buffers_in in = {.n_host = e->n_host, .dtype = e->dtype, .state_arrays = 1 + uses_m(e) + uses_v(e),
                               .state_dt = e->sdt,
                               .nvme = nvme, .delayed = e->dpu, .speculate = z->offload_optimizer.super_offload,
                               .stage = z->stage, .param_offload = z->offload_param.device, .pin = e->pinned};
    zoff_placement_host_buffers(&in, &e->hb);
}

static zoff_status check_host_memory(const zoff_engine *e, bool nvme) {
    char what[200];
    snprintf(what, sizeof what, "the host part of the optimizer (%lld parameters on rank %d: fp32 master, %s "
             "moments, 16-bit gradient%s buffers%s)", (long long)e->n_host, e->rank, zoff_dtype_name(e->sdt),
             e->pnvme ? "" : " and weight",
             e->pinned ? ", the buffers device copies use pinned" : "");
    zoff_host_request rq = {.what = what,
                            .pageable = e->hb.pageable + zoff_placement_spec_backup_bytes(e->cfg, e->n_host),
                            .pinned = e->hb.pinned,
                            .hint = nvme ? "move part of the update to the device (offload_optimizer.ratio below "
                                           "1), or use more ranks (ZeRO stage 1-3 partition it)"
                                         : "move part of the update to the device (offload_optimizer.ratio below 1), "
                                           "keep the optimizer state on NVMe (offload_optimizer.device nvme), or use "
                                           "more ranks (ZeRO stage 1-3 partition it)"};
    return zoff_host_memory_check(&rq);
}

/* zoff_engine_describe's text (and the NVMe lines of the log). */
static void describe(zoff_engine *e) {
    const zoff_zero_config *z = &e->cfg->zero;
    int host_sgs = 0;
    for (int i = 0; i < e->nsg; i++) host_sgs += e->sg[i].on_host;
    if (e->n_host == 0)
        snprintf(e->describe, sizeof e->describe, "optimizer on the device (no offload), %d sub-group%s", e->nsg,
                 e->nsg == 1 ? "" : "s");
    else
        snprintf(e->describe, sizeof e->describe,
                 "optimizer offloaded to the host: %.1f%% of parameters in %d of %d sub-group%s, %s, %d thread%s, %s%s%s",
                 100.0 * (double)e->n_host / (double)e->n, host_sgs, e->nsg, e->nsg == 1 ? "" : "s",
                 zoff_host_optimizer_path(e->hopt), zoff_host_optimizer_threads(e->hopt),
                 zoff_host_optimizer_threads(e->hopt) == 1 ? "" : "s",
                 e->pinned ? "copy buffers pinned" : "pageable", e->sdt == ZOFF_BF16 ? ", bf16 m and v" : "",
                 e->dpu ? ", delayed parameter update" : e->spec ? ", speculative update (super_offload)"
                                                        : e->pipelined ? ", pipelined" : "");
    if (e->s3) {
        zoff_s3_stats ss;
        zoff_s3_get_stats(e->s3, &ss);
        size_t used = strlen(e->describe);
        snprintf(e->describe + used, sizeof e->describe - used,
                 "; stage 3: weights %s (%lld of %lld per rank), %d parameter groups gathered on use (%d kept whole, "
                 "<= %lld elements), prefetch %lld elements",
                 z->offload_param.device == ZOFF_OFFLOAD_CPU    ? "offloaded to the host"
                 : z->offload_param.device == ZOFF_OFFLOAD_NVME ? "offloaded to NVMe"
                                                                : "partitioned on the device",
                 (long long)e->n, (long long)e->n_model, ss.groups, ss.persistent,
                 (long long)z->stage3_param_persistence_threshold, (long long)z->stage3_prefetch_bucket_size);
    }
    if (e->world > 1) {
        size_t used = strlen(e->describe);
        snprintf(e->describe + used, sizeof e->describe - used,
                 "; data parallel: rank %d of %d (%s), stage %d: %s%s, %lld of %lld parameters in this rank's "
                 "partition%s",
                 e->rank, e->world, zoff_comm_backend_name(e->comm), z->stage,
                 e->replicated ? "gradients all-reduced, optimizer replicated"
                 : e->stage3   ? "gradients reduce-scattered every micro-batch, optimizer and weights partitioned"
                 : e->scatter  ? "gradients reduce-scattered, optimizer partitioned, weights all-gathered"
                               : "gradients all-reduced, optimizer partitioned, weights all-gathered",
                 e->plan.round_robin ? " (round-robin gradient order)" : "", (long long)e->n, (long long)e->n_model,
                 e->nmap > 1 ? "" : "");
    }
    if (e->pnvme) {
        size_t used = strlen(e->describe);
        snprintf(e->describe + used, sizeof e->describe - used, "; NVMe weights: %s", zoff_s3_nvme_describe(e->s3));
        zoff_log(ZOFF_LOG_INFO, "offload_param.device nvme: %s", zoff_s3_nvme_describe(e->s3));
    }
    if (e->swap) {
        size_t used = strlen(e->describe);
        snprintf(e->describe + used, sizeof e->describe - used, "; NVMe state: %s", zoff_swapper_describe(e->swap));
        zoff_log(ZOFF_LOG_INFO, "offload_optimizer.device nvme: %s", zoff_swapper_describe(e->swap));
    }
    if (e->n_host > 0 && !e->stage3) {
        size_t used = strlen(e->describe);
        if (e->buckets)
            snprintf(e->describe + used, sizeof e->describe - used,
                     "; device gradients: gradient buckets (%d x %lld elements%s, first layer group's %lld, device "
                     "sub-groups' %lld%s%s)",
                     e->gd.nslots, (long long)(e->gd.flat ? e->gd.ring : e->gd.slot),
                     e->gd.flat ? " in all: one per group, reduce_bucket_size holds them all" : "",
                     (long long)e->gd.held, (long long)(e->world > 1 ? e->n_dev : e->gd.device),
                     e->world == 1 || e->n_dev == 0 ? ""
                     : e->gd.compact ? " copied out of each reduced bucket" : " read in their buckets",
                     e->bk_acc ? "; the accumulation's sum on the host, through the buckets each micro-batch" : "");
        else {
            const char *why = zoff_placement_grad_buckets_why(e->cfg);
            snprintf(e->describe + used, sizeof e->describe - used,
                     "; device gradients: the full device gradient buffer (%s)",
                     why ? why : "the model gave one");
        }
    }
}

/* Elements of the bounded buffer the device's part of the initial weights goes through. */
#define INIT_PIECE_ELEMS ((int64_t)1 << 22) /* 16 MiB of fp32 */

/* The initial weights straight into their place: each host sub-group's master (or, NVMe, the
 * swap file: nvme_write_initial), the device's master (fp32: the model's weights) in pieces;
 * then the 16-bit weights from the masters (zoff_engine_sync_params). */
static zoff_status initial_weights(zoff_engine *e) {
    const size_t f4 = sizeof(float);
    float *piece = NULL;
    zoff_status s = ZOFF_OK;
    for (int i = 0; s == ZOFF_OK && i < e->nsg; i++) {
        const subgroup *g = &e->sg[i];
        if (g->on_host) {
            if (!e->swap) s = init_fill(e, g->offset, g->offset + g->count, e->h_master + g->state_off);
            continue;
        }
        float *dst = e->dtype == ZOFF_F32 ? (float *)e->params + g->model : e->d_master + g->state_off;
        if (e->init_full) {
            s = zoff_memcpy_async(e->compute, dst, e->init_full + g->offset, (size_t)g->count * f4, ZOFF_COPY_H2D);
            continue;
        }
        /* pageable: a transient buffer, not part of the pinned figures zoff plan predicts */
        if (!piece && !(piece = zoff_aligned_alloc(64, (size_t)INIT_PIECE_ELEMS * f4, "initial weights piece")))
            s = ZOFF_ERR_NOMEM;
        for (int64_t a = 0; s == ZOFF_OK && a < g->count; a += INIT_PIECE_ELEMS) {
            int64_t c = g->count - a < INIT_PIECE_ELEMS ? g->count - a : INIT_PIECE_ELEMS;
            s = zoff_stream_synchronize(e->compute); /* the piece's last copy is done */
            if (s == ZOFF_OK) s = init_fill(e, g->offset + a, g->offset + a + c, piece);
            if (s == ZOFF_OK) s = zoff_memcpy_async(e->compute, dst + a, piece, (size_t)c * f4, ZOFF_COPY_H2D);
        }
    }
    if (piece) {
        zoff_status ss = zoff_stream_synchronize(e->compute);
        if (s == ZOFF_OK) s = ss;
        zoff_aligned_free(piece);
    }
    if (s == ZOFF_OK) s = zoff_engine_sync_params(e);
    return s;
}

/* The host side: the state (pageable, or a swap file) and the buffers device copies use
 * (pinned with pin_memory: zoff_placement_host_buffers), first touched by the optimizer's
 * threads; the host optimizer; the copy streams. */
static zoff_status host_setup(zoff_engine *e, bool nvme, bool init) {
    const size_t nh = (size_t)e->n_host, f4 = sizeof(float);
    ZOFF_TRY(hopt_create(e));
    if (nvme) {
        ZOFF_TRY(nvme_create(e));
    } else {
        if (e->hb.master_dma) ZOFF_TRY(dma_alloc(e, nh * f4, "fp32 master weights (host)", (void **)&e->h_master));
        else if (!(e->h_master = state_alloc(e, nh * f4, "fp32 master weights (host)"))) return ZOFF_ERR_NOMEM;
        if (uses_m(e) && !(e->h_m = state_alloc(e, nh * e->ssize, "optimizer exp_avg (host)"))) return ZOFF_ERR_NOMEM;
        if (uses_v(e) && !(e->h_v = state_alloc(e, nh * e->ssize, "optimizer exp_avg_sq (host)"))) return ZOFF_ERR_NOMEM;
    }
    ZOFF_TRY(dma_alloc(e, e->hb.grad_buffer,
                       e->hb.weights_in_grads ? "gradient partition and new 16-bit weights (host)"
                                              : "gradient partition (host)",
                       &e->h_grads[0]));
    if (e->hb.grad_buffers > 1)
        ZOFF_TRY(dma_alloc(e, e->hb.grad_buffer, "second gradient partition (delayed update)", &e->h_grads[1]));
    if (e->hb.staging) ZOFF_TRY(dma_alloc(e, e->hb.staging, "weight staging (host)", &e->h_staging));
    if (nvme) ZOFF_TRY(nvme_write_initial(e, init));
    else ZOFF_TRY(state_first_touch(e, e->h_master, e->h_m, e->h_v));
    ZOFF_TRY(zoff_stream_create(e->dev, "gradients to host", &e->d2h));
    return zoff_stream_create(e->dev, "weights to device", &e->h2d);
}

zoff_status zoff_engine_create(const zoff_engine_options *o, zoff_engine **out) {
    const double t_create = zoff_now();
    *out = NULL;
    if (!o || !o->dev || !o->cfg || !o->tensors || o->num_params <= 0)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_create: missing device, config or tensor table");
    if (o->dtype != ZOFF_F32 && o->dtype != ZOFF_BF16 && o->dtype != ZOFF_F16)
        return zoff_error(ZOFF_ERR_INVALID, "engine dtype must be f32, bf16 or f16 (got %s)", zoff_dtype_name(o->dtype));
    ZOFF_TRY(check_supported(o));
    bool state_thp;
    ZOFF_TRY(state_huge_pages(&state_thp));
    const zoff_config *cfg = o->cfg;
    const zoff_zero_config *z = &cfg->zero;
    bool nvme = z->offload_optimizer.device == ZOFF_OFFLOAD_NVME;
    bool offload = z->offload_optimizer.device == ZOFF_OFFLOAD_CPU || nvme || z->cpu_offload;

    zoff_engine *e = calloc(1, sizeof *e);
    if (!e) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the engine");
    e->dev = o->dev;
    e->compute = zoff_device_stream(o->dev);
    e->cfg = cfg;
    e->dtype = o->dtype;
    e->esize = zoff_dtype_size(o->dtype);
    e->n = o->num_params;
    e->params = o->params;
    e->grads = o->grads;
    e->pinned = z->offload_optimizer.pin_memory || z->cpu_offload;
    e->state_thp = state_thp;
    e->sdt = zoff_optimizer_state_dtype(cfg);
    e->ssize = zoff_dtype_size(e->sdt);
    e->sround = o->state_rounding;
    e->pnvme = z->stage >= 3 && z->offload_param.device == ZOFF_OFFLOAD_NVME;
    if (o->dtype == ZOFF_F16) zoff_loss_scaler_init(&e->ls, &cfg->fp16);
    else zoff_loss_scaler_init_fixed(&e->ls, 1.0);
    e->dpu = offload && z->delayed_param_update;
    e->timeline = o->timeline;
    e->want_tl = o->timeline ? 64 : 0;
    e->dpu_warmup = z->delayed_param_update_warmup;

    double ratio = offload ? z->offload_optimizer.ratio : 0.0;
    /* this rank's optimizer space (the model's with one rank) */
    zoff_tensor_info *ltab = NULL;
    int nlt = 0;
    float *init_local = NULL;
    zoff_status s = dp_setup(e, o, &ltab, &nlt, &init_local);
    const float *init = init_local ? init_local : o->init_params;
    e->init_full = init;
    e->init_range = init ? NULL : o->init_range;
    e->init_arg = o->init_arg;
    if (s == ZOFF_OK) s = build_ranges(e, ltab ? ltab : o->tensors, ltab ? nlt : o->num_tensors);
    size_t auto_fixed = 0, auto_grad = 0;
    if (s == ZOFF_OK) s = zoff_bk_groups(e, o, &auto_fixed, &auto_grad);
    if (s == ZOFF_OK && offload && z->offload_optimizer.ratio_auto) s = auto_ratio(e, auto_fixed, auto_grad, &ratio);
    if (offload && z->offload_optimizer.ratio_auto && e->world > 1) s = agree_ratio(e, s, &ratio);
    if (s == ZOFF_OK) s = build_subgroups(e, ratio);
    size_t f4 = sizeof(float);
    /* device side */
    if (s == ZOFF_OK && e->n_dev > 0) {
        if (e->dtype != ZOFF_F32)
            s = zoff_device_alloc(e->dev, (size_t)e->n_dev * f4, "fp32 master weights (device)", (void **)&e->d_master);
        if (s == ZOFF_OK)
            s = zoff_device_alloc(e->dev, (size_t)e->n_dev * f4, "Adam exp_avg (device)", (void **)&e->d_m);
        if (s == ZOFF_OK)
            s = zoff_device_alloc(e->dev, (size_t)e->n_dev * f4, "Adam exp_avg_sq (device)", (void **)&e->d_v);
        if (s == ZOFF_OK) s = zoff_memset_async(e->compute, e->d_m, 0, (size_t)e->n_dev * f4);
        if (s == ZOFF_OK) s = zoff_memset_async(e->compute, e->d_v, 0, (size_t)e->n_dev * f4);
    }
    if (s == ZOFF_OK) s = zoff_bk_alloc(e); /* statistics, gradient buckets */
    /* host side */
    if (s == ZOFF_OK) host_buffers_of(e, nvme);
    if (s == ZOFF_OK && e->n_host > 0) s = check_host_memory(e, nvme);
    if (s == ZOFF_OK && e->n_host > 0) s = host_setup(e, nvme, init != NULL || e->init_range);
    if (s == ZOFF_OK && e->n_dev > 0 && e->n_host > 0)
        s = zoff_stream_create(e->dev, "device optimizer", &e->opt_stream);
    if (s == ZOFF_OK && (e->world > 1 || e->stage3) && !e->d2h) /* the collectives' stream */
        s = zoff_stream_create(e->dev, "collectives", &e->d2h);
    if (s == ZOFF_OK && e->stage3) s = s3_setup(e);
    if (s == ZOFF_OK) s = zoff_event_create(e->dev, &e->ev_grads_done);
    if (s == ZOFF_OK) s = zoff_event_create(e->dev, &e->ev_weights_done);
    if (s == ZOFF_OK) s = zoff_event_create(e->dev, &e->ev_dev_done);
    if (s == ZOFF_OK) s = zoff_event_create(e->dev, &e->ev_stats);
    for (int k = 0; s == ZOFF_OK && e->n_host > 0 && k < 2; k++)
        if (!(e->sg_span[k] = calloc(4 * (size_t)e->nsg, sizeof(double))) || /* 2 per sub-group */
            !(e->sg_span_off[k] = calloc(2 * (size_t)e->nsg, sizeof(int64_t))))
            s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) s = pipe_setup(e, o);
    if (s == ZOFF_OK && z->offload_optimizer.super_offload) s = spec_setup(e);
    if (s == ZOFF_OK && (e->dpu || e->pipelined || e->spec)) {
        pthread_mutex_init(&e->mu, NULL);
        pthread_cond_init(&e->cv, NULL);
        e->mu_init = true;
        if (pthread_create(&e->worker, NULL, zoff_hr_worker_main, e) != 0)
            s = zoff_error(ZOFF_ERR_INTERNAL, "cannot start the host optimizer's worker thread");
        else
            e->worker_started = true;
    }
    double t_init = zoff_now();
    if (s == ZOFF_OK && (init || e->init_range)) s = initial_weights(e);
    e->startup.initial_weights = zoff_lap(&t_init);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(e->compute);
    free(ltab);
    zoff_aligned_free(init_local);
    e->init_full = NULL; /* creation only */
    e->init_range = NULL;
    if (s != ZOFF_OK) {
        zoff_engine_destroy(e);
        return s;
    }
    describe(e);
    e->startup.total = zoff_now() - t_create;
    *out = e;
    return ZOFF_OK;
}

void zoff_engine_startup_times(const zoff_engine *e, zoff_engine_startup *out) { *out = e->startup; }

/* ------------------------------------------------------------------ weights to the device */

/* Device sub-groups: master -> model weights (16-bit cast; nothing for fp32). */
static zoff_status sync_device_subgroups(zoff_engine *e, zoff_stream *st) {
    if (e->dtype == ZOFF_F32) return ZOFF_OK;
    for (int i = 0; i < e->nsg; i++) {
        subgroup *g = &e->sg[i];
        if (g->on_host) continue;
        zoff_op_cast_args a = {.dst = (char *)e->params + (size_t)g->model * e->esize,
                               .src = e->d_master + g->state_off, .n = g->count, .dst_dt = e->dtype,
                               .src_dt = ZOFF_F32};
        ZOFF_TRY(ZOFF_LAUNCH(st, ZOFF_OP_CAST, a));
    }
    return ZOFF_OK;
}

/* Host sub-group g's new weights -> the model's buffer, on the h2d stream. */
zoff_status zoff_eng_push_host_subgroup(zoff_engine *e, const subgroup *g) {
    if (e->no_push) { /* stage 3, offload_param: written in place, or (speculation) copied into place */
        if (e->h_spec)
            memcpy((char *)e->params + (size_t)g->model * e->esize, (const char *)e->h_spec + (size_t)g->state_off * e->esize,
                   (size_t)g->count * e->esize);
        return ZOFF_OK;
    }
    void *dst = (char *)e->params + (size_t)g->model * e->esize;
    const void *src = e->dtype == ZOFF_F32 && !e->swap
                          ? (const void *)(e->h_master + g->state_off)
                          : (const void *)((const char *)host_weights_out(e) + (size_t)g->state_off * e->esize);
    return zoff_memcpy_async(e->h2d, dst, src, (size_t)g->count * e->esize, ZOFF_COPY_H2D);
}

/* Round the host master weights to 16 bits into the weights' output buffer (initial weights,
 * restore; with one buffer it holds no gradients between steps: zoff_engine_sync_params is
 * called outside a step). */
static zoff_status host_master_to_staging(zoff_engine *e) {
    if (e->pnvme) return pn_master_to_file(e);
    if (e->swap) return nvme_master_to_staging(e);
    if (e->dtype == ZOFF_F32) return ZOFF_OK;
    if (e->dtype == ZOFF_BF16) zoff_par_f32_to_bf16(host_weights_out(e), e->h_master, (size_t)e->n_host);
    else zoff_par_f32_to_f16(host_weights_out(e), e->h_master, (size_t)e->n_host);
    return ZOFF_OK;
}

zoff_status zoff_engine_sync_params(zoff_engine *e) {
    ZOFF_TRY(zoff_hr_settle(e));
    ZOFF_TRY(sync_device_subgroups(e, e->compute));
    if (e->n_host > 0) {
        ZOFF_TRY(host_master_to_staging(e));
        ZOFF_TRY(zoff_event_record(e->ev_stats, e->compute)); /* h2d after whatever compute did */
        ZOFF_TRY(zoff_stream_wait_event(e->h2d, e->ev_stats));
        for (int i = 0; i < e->nsg; i++)
            if (e->sg[i].on_host) ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
        ZOFF_TRY(zoff_event_record(e->ev_weights_done, e->h2d));
        ZOFF_TRY(zoff_stream_wait_event(e->compute, e->ev_weights_done));
        e->weights_pending = false;
    }
    ZOFF_TRY(dp_gather_weights(e));
    ZOFF_TRY(zoff_stream_synchronize(e->compute));
    return e->chan ? zoff_comm_error(e->chan) : ZOFF_OK;
}

/* ---- stage 3 parameter hooks (zoff_param_hooks; arg = the engine) ---- */
zoff_status zoff_engine_begin_pass(void *engine, zoff_stream *s, bool backward) {
    zoff_engine *e = engine;
    (void)s;
    if (!e->s3) return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_begin_pass: the engine is not in stage 3");
    return zoff_s3_begin_pass(e->s3, backward);
}
zoff_status zoff_engine_acquire(void *engine, zoff_stream *s, int64_t offset, int64_t count, bool backward,
                                void **params, void **grads) {
    zoff_engine *e = engine;
    (void)s;
    if (!e->s3) return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_acquire: the engine is not in stage 3");
    return zoff_s3_acquire(e->s3, offset, count, backward, params, grads);
}
zoff_status zoff_engine_release(void *engine, zoff_stream *s, int64_t offset, int64_t count, bool backward) {
    zoff_engine *e = engine;
    (void)s;
    if (!e->s3) return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_release: the engine is not in stage 3");
    return zoff_s3_release(e->s3, offset, count, backward);
}

int64_t zoff_engine_steps_taken(const zoff_engine *e) { return e->sc.steps_taken; }

/* ------------------------------------------------------------------ the step */

zoff_status zoff_eng_step_betas(const zoff_engine *e, int64_t t, double *beta1, double *beta2) {
    const zoff_config *c = e->cfg;
    zoff_betas_at(&c->scheduler, &c->optimizer, t - 1, beta1, beta2);
    if (*beta1 >= 0 && *beta1 < 1 && *beta2 >= 0 && *beta2 < 1) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID,
                      "scheduler %s: the momentum (beta1) for optimizer step %lld is %g, not below 1 (decay_mom_rate %g "
                      "makes it grow after the cycle): give scheduler.params.decay_mom_rate 0, or a smaller one",
                      zoff_scheduler_name(c->scheduler.type), (long long)t, *beta1, c->scheduler.decay_mom_rate);
}

zoff_status zoff_eng_hopt_begin(zoff_engine *e, int64_t t, double lr) {
    double b1, b2;
    ZOFF_TRY(zoff_eng_step_betas(e, t, &b1, &b2));
    ZOFF_TRY(zoff_host_optimizer_set_betas(e->hopt, b1, b2));
    return zoff_host_optimizer_begin_step(e->hopt, t, lr);
}

/* Device sub-groups: fused Adam on the device (own stream when the host works too). */
static zoff_status device_update(zoff_engine *e, int64_t t, double lr, double grad_scale) {
    const zoff_optimizer_config *oc = &e->cfg->optimizer;
    zoff_stream *st = e->opt_stream ? e->opt_stream : e->compute;
    ZOFF_TRY(zoff_eng_snap_device_gate(e)); /* a background save's copy of this state taken first */
    if (e->opt_stream) {
        ZOFF_TRY(zoff_event_record(e->ev_stats, e->compute));
        ZOFF_TRY(zoff_stream_wait_event(st, e->ev_stats));
    }
    bool w_mode = oc->type == ZOFF_OPTIM_ADAMW || oc->adam_w_mode;
    double beta1, beta2;
    ZOFF_TRY(zoff_eng_step_betas(e, t, &beta1, &beta2));
    double bc1 = oc->bias_correction ? 1.0 - pow(beta1, (double)t) : 1.0;
    double bc2 = oc->bias_correction ? 1.0 - pow(beta2, (double)t) : 1.0;
    for (int i = 0; i < e->nsg; i++) {
        const subgroup *g = &e->sg[i];
        if (g->on_host) continue;
        for (int r = 0; r < e->nranges; r++) {
            const range *rg = &e->ranges[r];
            int64_t lo = rg->offset > g->offset ? rg->offset : g->offset;
            int64_t hi = rg->offset + rg->count < g->offset + g->count ? rg->offset + rg->count : g->offset + g->count;
            if (lo >= hi) continue;
            int64_t so = g->state_off + (lo - g->offset), mo = g->model + (lo - g->offset);
            bool f32 = e->dtype == ZOFF_F32;
            zoff_op_adam_args a = {
                .params = f32 ? (float *)e->params + mo : e->d_master + so,
                .m = e->d_m + so, .v = e->d_v + so,
                .grads = zoff_bk_device_grads(e, mo, so),
                .params16 = f32 ? NULL : (char *)e->params + (size_t)mo * e->esize,
                .n = hi - lo, .grad_dt = e->dtype, .p16_dt = e->dtype,
                .lr = (float)lr, .beta1 = (float)beta1, .beta2 = (float)beta2, .eps = (float)oc->eps,
                .weight_decay = rg->decay ? (float)oc->weight_decay : 0.0f,
                .bc1 = (float)bc1, .bc2 = (float)bc2, .grad_scale = (float)grad_scale, .adam_w_mode = w_mode};
            ZOFF_TRY(ZOFF_LAUNCH(st, ZOFF_OP_ADAM, a));
        }
    }
    if (e->opt_stream) {
        ZOFF_TRY(zoff_event_record(e->ev_dev_done, st));
        ZOFF_TRY(zoff_stream_wait_event(e->compute, e->ev_dev_done));
    }
    return ZOFF_OK;
}

/* Delayed update: put the finished job's weights on the device. */
static zoff_status apply_pending_weights(zoff_engine *e, double *t_wait, double *t_work) {
    double t0 = zoff_now();
    ZOFF_TRY(zoff_hr_wait_job(e));
    *t_wait += zoff_now() - t0;
    if (t_work && e->weights_pending) *t_work += e->job_seconds;
    if (!e->weights_pending) return ZOFF_OK;
    ZOFF_TRY(zoff_event_record(e->ev_stats, e->compute));
    ZOFF_TRY(zoff_stream_wait_event(e->h2d, e->ev_stats));
    if (e->g_updated) { /* pipelined: the groups not pushed during backward (the job is done) */
        for (int g = zoff_wready_groups(e->wr) - 1; g >= 0; g--)
            if (e->group_need[g] && !e->g_pushed[g]) {
                for (int i = e->nsg - 1; i >= 0; i--)
                    if (e->sg[i].on_host && e->sg_group[i] == g) ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
                e->g_pushed[g] = true;
                ZOFF_TRY(zoff_wready_arrive(e->wr, g, e->h2d));
            }
    } else {
        for (int i = e->nsg - 1; i >= 0; i--)
            if (e->sg[i].on_host) ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
    }
    ZOFF_TRY(zoff_event_record(e->ev_weights_done, e->h2d));
    /* pipelined: the next forward waits per group */
    if (!e->pipelined) ZOFF_TRY(zoff_stream_wait_event(e->compute, e->ev_weights_done));
    e->weights_pending = false;
    return ZOFF_OK;
}

/* The gradient statistics on the device (sum of squares, non-finite flag) after the
 * last gradient copies, global over ranks. The one host synchronisation of a step. */
static zoff_status grad_stats(zoff_engine *e, double *sumsq, double *nonfinite) {
    float stats[2] = {0, 0};
    if (e->d2h) ZOFF_TRY(zoff_event_record(e->ev_grads_done, e->d2h));
    if (e->world > 1 || e->stage3) /* the reduced gradients */
        ZOFF_TRY(zoff_stream_wait_event(e->compute, e->ev_grads_done));
    if (!e->stage3) { /* per layer group (the same bits with or without buckets); several ranks: this
                       * rank's pieces (stage 0: its share of the replicated sum), summed over ranks below */
        ZOFF_TRY(zoff_bk_grad_stats(e, sumsq, nonfinite));
        if (e->d2h) ZOFF_TRY(zoff_event_synchronize(e->ev_grads_done));
        if (e->world == 1) return ZOFF_OK;
    } else { /* this rank's partition, e->n elements */
        ZOFF_TRY(zoff_memset_async(e->compute, e->stats_dev, 0, sizeof stats));
        zoff_op_grad_stats_args ga = {.stats = e->stats_dev, .x = e->grads, .n = e->n, .dt = e->dtype};
        ZOFF_TRY(ZOFF_LAUNCH(e->compute, ZOFF_OP_GRAD_STATS, ga));
        ZOFF_TRY(zoff_memcpy_async(e->compute, stats, e->stats_dev, sizeof stats, ZOFF_COPY_D2H));
        ZOFF_TRY(zoff_stream_synchronize(e->compute));
        if (e->d2h) ZOFF_TRY(zoff_event_synchronize(e->ev_grads_done));
        *sumsq = stats[0];
        *nonfinite = stats[1];
    }
    if (e->world > 1) { /* global statistics: every rank takes the same decision */
        ZOFF_TRY(take_async(e));
        ZOFF_TRY(zoff_comm_error(e->chan));
        double g[2] = {*sumsq, *nonfinite};
        ZOFF_TRY(zoff_comm_allreduce_f64(e->comm, g, 2, ZOFF_REDUCE_SUM));
        *sumsq = g[0];
        *nonfinite = g[1];
    }
    return ZOFF_OK;
}

/* The host part of a step that is not skipped: delayed (the worker runs it during
 * the next forward and backward), pipelined (the worker runs it now, the next
 * forward waits per group), or here, pushing as it goes. */
static zoff_status host_step(zoff_engine *e, int64_t t, double lr, double grad_scale, zoff_step_info *si) {
    if (e->dpu && t > e->dpu_warmup) {
        /* weights of the previous job go to the device now; this step's job runs in the background */
        ZOFF_TRY(apply_pending_weights(e, &si->t_host, &si->t_host_work));
        e->weights_pending = true;
        zoff_hr_start_job(e, t, lr, grad_scale, HU_NO_PUSH);
        e->gbuf ^= 1; /* the next backward fills the other buffer */
        return ZOFF_OK;
    }
    if (e->dpu) ZOFF_TRY(apply_pending_weights(e, &si->t_host, &si->t_host_work)); /* warm-up */
    if (e->pipelined) {
        ZOFF_TRY(pipe_gather_after_compute(e));
        zoff_hr_start_job(e, t, lr, grad_scale, HU_PIPE);
        e->pipe_unreported = true;
        return ZOFF_OK;
    }
    double th = zoff_now();
    ZOFF_TRY(zoff_hr_update(e, e->gbuf, t, lr, grad_scale, HU_PUSH));
    double th1 = zoff_now();
    zoff_hr_note_span(e, t, th, th1);
    si->t_host += th1 - th;
    si->t_host_work += th1 - th;
    if (e->opt_stream) {
        double tdv = zoff_now();
        ZOFF_TRY(zoff_event_synchronize(e->ev_dev_done));
        si->t_wait_device = zoff_now() - tdv;
    }
    ZOFF_TRY(zoff_event_record(e->ev_weights_done, e->h2d));
    ZOFF_TRY(zoff_stream_wait_event(e->compute, e->ev_weights_done));
    double tw = zoff_now();
    ZOFF_TRY(zoff_event_synchronize(e->ev_weights_done));
    si->t_wait_weights = zoff_now() - tw;
    return ZOFF_OK;
}

zoff_status zoff_engine_step(zoff_engine *e, double lr, zoff_step_info *info) {
    double t0 = zoff_now();
    zoff_step_info si = {.loss_scale = e->ls.scale};
    bool spec = e->spec_running; /* this boundary's speculative update is running or done */
    if (!spec) ZOFF_TRY(zoff_hr_settle(e)); /* the previous job (pipelined: done by now, the forward waited for it) */
    if (e->dpu) si.t_host = zoff_now() - t0; /* delayed update: waiting for the worker */
    if (e->pipe_unreported && !spec) { /* its host time, off the critical path (spec: the job runs now) */
        si.t_host_work = e->job_seconds;
        e->pipe_unreported = false;
    }
    double sumsq = 0, nonfinite = 0;
    zoff_status gs = grad_stats(e, &sumsq, &nonfinite);
    if (spec) { /* every gradient has landed (the copies are done): the job runs out */
        e->spec_running = false;
        pthread_mutex_lock(&e->mu);
        e->landed = 0; /* (also if a landing mark was lost) */
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        double tj = zoff_now();
        zoff_status js = zoff_hr_wait_job(e);
        si.t_host = zoff_now() - tj;
        si.t_host_work = e->job_seconds;
        if (gs == ZOFF_OK) gs = js;
        if (gs != ZOFF_OK) ZOFF_TRY(zoff_hr_spec_rollback(e, false)); /* keep the state consistent; report gs */
    }
    ZOFF_TRY(gs);
    si.t_wait_grads = zoff_now() - t0 - si.t_host;

    double scale = e->ls.scale;
    double norm = sqrt(sumsq) / scale;
    bool overflow = nonfinite != 0.0 || !isfinite(norm);
    si.grad_norm = norm;
    si.skipped = overflow;
    if (overflow) {
        e->sc.steps_skipped++;
        zoff_log(e->dtype == ZOFF_F16 ? ZOFF_LOG_DEBUG : ZOFF_LOG_WARN,
                 "gradient has inf/NaN (loss scale %g): step skipped", scale);
    }
    ZOFF_TRY(zoff_loss_scaler_update(&e->ls, overflow));
    double clip = e->cfg->gradient_clipping;
    bool clipped = clip > 0 && norm > clip;
    if (spec && !overflow && !clipped && lr == e->spec_lr) { /* validated: keep it */
        int64_t t = ++e->sc.steps_taken;
        double td = zoff_now();
        if (e->n_dev > 0) ZOFF_TRY(device_update(e, t, lr, 1.0 / scale));
        si.t_device = zoff_now() - td;
        if (e->pipelined) ZOFF_TRY(pipe_gather_after_compute(e));
        ZOFF_TRY(zoff_hr_spec_commit(e)); /* stage 3: gathered on use after dp_gather_weights below */
    } else if (spec) { /* clipping, overflow or another learning rate: undo, then the exact step */
        ZOFF_TRY(zoff_hr_spec_rollback(e, !overflow && e->n_host > 0)); /* the exact update restores */
        si.rolled_back = true;
    }
    bool kept = spec && !si.rolled_back;
    if (!overflow && !kept) {
        double coef = clipped ? clip / (norm + 1e-6) : 1.0;
        double grad_scale = coef / scale;
        int64_t t = ++e->sc.steps_taken;
        double td = zoff_now();
        zoff_status us = e->n_dev > 0 ? device_update(e, t, lr, grad_scale) : ZOFF_OK;
        si.t_device = zoff_now() - td;
        if (us == ZOFF_OK && e->n_host > 0) us = host_step(e, t, lr, grad_scale, &si);
        if (us != ZOFF_OK) { /* (a rollback's exact update that did not start or failed: the state back) */
            zoff_status r = zoff_hr_spec_undo_redo(e, us);
            if (r != ZOFF_OK) zoff_log(ZOFF_LOG_ERROR, "restoring the state after a failed update: %s", zoff_last_error());
            return us;
        }
    } else if (e->dpu && e->n_host > 0) {
        /* nothing new to run; still apply what the worker finished */
        ZOFF_TRY(apply_pending_weights(e, &si.t_host, &si.t_host_work));
    }
    double tw = zoff_now();
    /* pipelined: the job (or the commit) gathers group by group */
    if (!e->pipelined && (!overflow || (e->dpu && e->n_host > 0))) ZOFF_TRY(dp_gather_weights(e));
    /* pipelined: everything after is stream-ordered (the forward waits per group) */
    if (!e->pipelined) ZOFF_TRY(zoff_stream_synchronize(e->compute));
    if (e->chan) ZOFF_TRY(zoff_comm_error(e->chan));
    si.t_wait_weights += zoff_now() - tw;
    si.t_step = zoff_now() - t0;
    si.rollbacks = e->rollbacks;
    e->spec_lr = lr; /* the next speculation's learning rate, unless zoff_engine_set_lr says otherwise */
    e->have_lr = true;
    if (info) *info = si;
    return ZOFF_OK;
}

void zoff_engine_set_lr(zoff_engine *e, double lr) {
    e->spec_lr = lr;
    e->have_lr = true;
}

zoff_status zoff_engine_wait_weights(void *engine, zoff_stream *s, int64_t offset, int64_t count) {
    zoff_engine *e = engine;
    (void)count;
    if (!e->pipelined) return ZOFF_OK; /* the step made the compute stream wait for all of them */
    return zoff_wready_wait(e->wr, zoff_wready_group_of(e->wr, offset), s);
}

zoff_status zoff_engine_flush_state(zoff_engine *e) {
    ZOFF_TRY(zoff_hr_settle(e)); /* the delayed update's job is done; its weights stay pending */
    if (e->swap) ZOFF_TRY(zoff_swapper_flush(e->swap)); /* NVMe writes still in flight */
    return zoff_stream_synchronize(e->compute);
}

bool zoff_engine_state_fixed_until_step(const zoff_engine *e) { return !e->dpu && !e->spec; }

zoff_status zoff_engine_flush(zoff_engine *e) {
    ZOFF_TRY(zoff_engine_flush_state(e));
    if (!e->dpu || !e->weights_pending) return ZOFF_OK;
    double dummy = 0;
    ZOFF_TRY(apply_pending_weights(e, &dummy, NULL));
    ZOFF_TRY(dp_gather_weights(e));
    return zoff_stream_synchronize(e->compute);
}

/* ------------------------------------------------------------------ the delayed update's pending weights */

bool zoff_engine_weights_pending(const zoff_engine *e) { return e->dpu && e->weights_pending; }

zoff_dtype zoff_engine_dtype(const zoff_engine *e) { return e->dtype; }

zoff_status zoff_engine_device_weights(zoff_engine *e, int64_t offset, int64_t count, void *host, bool get) {
    if (e->stage3 || !e->params)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "the device weights of stage 3 are partitioned: no model buffer");
    if (offset < 0 || count < 0 || offset > e->n_model - count)
        return zoff_error(ZOFF_ERR_INVALID, "device weights range [%lld, +%lld) outside [0, %lld)", (long long)offset,
                          (long long)count, (long long)e->n_model);
    void *d = (char *)e->params + (size_t)offset * e->esize;
    ZOFF_TRY(zoff_memcpy_async(e->compute, get ? host : d, get ? (const void *)d : (const void *)host,
                               (size_t)count * e->esize, get ? ZOFF_COPY_D2H : ZOFF_COPY_H2D));
    return zoff_stream_synchronize(e->compute);
}

/* As the uninterrupted run after its update t, whose job is done and whose weights have not
 * gone out: they are in the output buffer the next backward does not fill (the master's, cast
 * as the host optimizer writes them), every group updated, none released or pushed. */
zoff_status zoff_engine_mark_weights_pending(zoff_engine *e, bool *marked) {
    *marked = e->dpu && e->n_host > 0;
    if (!*marked) return ZOFF_OK;
    ZOFF_TRY(zoff_hr_settle(e));
    e->wbuf = e->gbuf ^ 1;
    ZOFF_TRY(host_master_to_staging(e));
    if (e->g_updated) {
        size_t ng = (size_t)zoff_wready_groups(e->wr);
        memset(e->g_updated, 1, ng * sizeof(bool));
        memset(e->g_released, 0, ng * sizeof(bool));
        memset(e->g_pushed, 0, ng * sizeof(bool));
    }
    e->job_seconds = 0;
    e->weights_pending = true;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ state */

int zoff_engine_state_count(const zoff_engine *e) { (void)e; return 3; }

const char *zoff_engine_state_name(const zoff_engine *e, int i) {
    (void)e;
    return i >= 0 && i < 3 ? state_names_adam[i] : NULL;
}

float *zoff_eng_device_state(const zoff_engine *e, int i, const subgroup *g) {
    if (i == 0) return e->dtype == ZOFF_F32 ? (float *)e->params + g->model : e->d_master + g->state_off;
    return (i == 1 ? e->d_m : e->d_v) + g->state_off;
}

void *zoff_eng_state_ptr(const zoff_engine *e, int i, int64_t so) {
    if ((i == 1 && !uses_m(e)) || (i == 2 && !uses_v(e))) return NULL;
    return i == 0 ? (void *)(e->h_master + so) : st_at(e, i == 1 ? e->h_m : e->h_v, so);
}

void zoff_eng_state_to(const zoff_engine *e, int i, const void *src, int64_t c, zoff_dtype hdt, void *h) {
    state_convert((void *)src, host_state_dt(e, i), h, hdt, c, true); /* get: src is only read */
}

/* Host state array i (0 master, 1 m, 2 v) elements [so, so + c) to (get) or from the array h of
 * hdt (state_convert: the state's own dtype, or fp32); an array the optimizer does not use reads
 * as zeros. */
static void host_state_io(zoff_engine *e, int i, int64_t so, int64_t c, void *h, zoff_dtype hdt, bool get) {
    void *src = zoff_eng_state_ptr(e, i, so);
    if (!src) {
        if (get) memset(h, 0, (size_t)c * zoff_dtype_size(hdt));
        return;
    }
    state_convert(src, host_state_dt(e, i), h, hdt, c, get);
}

zoff_dtype zoff_engine_state_dtype(const zoff_engine *e, int i) {
    return i > 0 ? zoff_checkpoint_state_dtype(e->cfg) : ZOFF_F32; /* every rank's file agrees */
}

/* Copy state array i (0 master, 1 m, 2 v) between the engine and a host array of n floats. */
static zoff_status state_io(zoff_engine *e, int i, float *host, bool get) {
    if (i < 0 || i > 2) return zoff_error(ZOFF_ERR_INVALID, "engine state index %d out of range", i);
    ZOFF_TRY(zoff_hr_settle(e));
    size_t f4 = sizeof(float);
    bool absent = (i == 1 && !uses_m(e)) || (i == 2 && !uses_v(e));
    for (int k = 0; k < e->nsg; k++) {
        const subgroup *g = &e->sg[k];
        float *h = host + g->offset;
        if (g->on_host && e->swap) continue; /* below: one pass over the swap file */
        if (g->on_host) {
            host_state_io(e, i, g->state_off, g->count, h, ZOFF_F32, get);
        } else {
            float *d = zoff_eng_device_state(e, i, g);
            ZOFF_TRY(zoff_memcpy_async(e->compute, get ? (void *)h : (void *)d, get ? (const void *)d : (const void *)h,
                                       (size_t)g->count * f4, get ? ZOFF_COPY_D2H : ZOFF_COPY_H2D));
        }
    }
    if (e->swap) ZOFF_TRY(nvme_state_io(e, i, host, get, absent));
    ZOFF_TRY(zoff_stream_synchronize(e->compute));
    if (!get && i == 0) {
        e->weights_pending = false;
        ZOFF_TRY(zoff_engine_sync_params(e));
    }
    return ZOFF_OK;
}

zoff_status zoff_engine_state_get(zoff_engine *e, int i, float *host_dst) { return state_io(e, i, host_dst, true); }

int64_t zoff_engine_partition_numel(const zoff_engine *e) { return e->n; }

int zoff_engine_partition(const zoff_engine *e, int64_t *model_offsets, int64_t *counts, int cap) {
    if (e->stage3) { /* the plan's pieces (the engine's own map is the identity of its local space) */
        const zoff_dp_plan *p = &e->plan;
        for (int k = 0; k < p->nown[p->rank] && k < cap; k++) {
            model_offsets[k] = p->pieces[p->own[p->rank][k]].model;
            counts[k] = p->pieces[p->own[p->rank][k]].count;
        }
        return p->nown[p->rank];
    }
    for (int k = 0; k < e->nmap && k < cap; k++) {
        model_offsets[k] = e->map[k].model;
        counts[k] = e->map[k].count;
    }
    return e->nmap;
}

zoff_status zoff_engine_state_gather(zoff_engine *e, int i, float *full) {
    if (e->world == 1 || e->replicated) return state_io(e, i, full, true); /* local == model */
    float *loc = zoff_aligned_alloc(64, (size_t)e->n * sizeof(float), "engine state of this rank's partition");
    zoff_dp_scratch hs = {.elems = e->scratch.elems};
    if (e->plan.round_robin)
        hs.pack = zoff_aligned_alloc(64, (size_t)hs.elems * sizeof(float), "engine state gather buffer");
    zoff_status s = !loc || (e->plan.round_robin && !hs.pack) ? ZOFF_ERR_NOMEM : state_io(e, i, loc, true);
    if (s == ZOFF_OK) {
        zoff_dp_scatter_local(&e->plan, loc, full, 0, e->n);
        s = zoff_dp_allgather_params(&e->plan, e->comm, NULL, full, ZOFF_F32, &hs, &e->layout);
    }
    zoff_aligned_free(hs.pack);
    zoff_aligned_free(loc);
    return s;
}

zoff_status zoff_engine_state_set(zoff_engine *e, int i, const float *host_src) {
    return state_io(e, i, (float *)host_src, false);
}

zoff_status zoff_eng_check_state_range(const zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt) {
    if (i < 0 || i > 2 || offset < 0 || count < 0 || offset > e->n - count)
        return zoff_error(ZOFF_ERR_INVALID, "engine state %d range [%lld, +%lld) outside [0, %lld)", i,
                          (long long)offset, (long long)count, (long long)e->n);
    if (dt != ZOFF_F32 && dt != zoff_engine_state_dtype(e, i))
        return zoff_error(ZOFF_ERR_INVALID, "engine state %d: a range in %s, where the engine keeps it in %s (ask for "
                                            "f32 or %s)",
                          i, zoff_dtype_name(dt), zoff_dtype_name(zoff_engine_state_dtype(e, i)),
                          zoff_dtype_name(zoff_engine_state_dtype(e, i)));
    return ZOFF_OK;
}

zoff_status zoff_engine_state_range(zoff_engine *e, int i, int64_t offset, int64_t count, float *host, bool get) {
    return zoff_engine_state_range_as(e, i, offset, count, ZOFF_F32, host, get);
}

/* [offset, offset + count) of state array i in dtype dt, one sub-group at a time (see engine.h). */
zoff_status zoff_engine_state_range_as(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                       void *host, bool get) {
    ZOFF_TRY(zoff_eng_check_state_range(e, i, offset, count, dt));
    const size_t hs = zoff_dtype_size(dt);
    /* as state_io, no update job may use the swapper; cheap when none runs (a save calls this per
     * 256 KiB slice): the full settle only with a speculative job of this boundary in flight */
    if (e->swap) ZOFF_TRY(e->spec_running ? zoff_hr_settle(e) : zoff_hr_wait_job(e));
    bool dev = false;
    const size_t f4 = sizeof(float);
    for (int k = 0; k < e->nsg; k++) {
        const subgroup *g = &e->sg[k];
        int64_t lo = g->offset > offset ? g->offset : offset;
        int64_t hi = g->offset + g->count < offset + count ? g->offset + g->count : offset + count;
        if (lo >= hi) continue;
        void *h = (char *)host + (size_t)(lo - offset) * hs;
        int64_t so = g->state_off + (lo - g->offset);
        if (g->on_host) {
            if (e->swap) ZOFF_TRY(nvme_state_range(e, k, i, lo - g->offset, hi - lo, h, dt, get));
            else host_state_io(e, i, so, hi - lo, h, dt, get);
            continue;
        }
        /* on the device: fp32 (zoff_engine_state_dtype is f32 wherever a sub-group is, so dt is) */
        float *d = zoff_eng_device_state(e, i, g) + (lo - g->offset);
        ZOFF_TRY(zoff_memcpy_async(e->compute, get ? (void *)h : (void *)d, get ? (const void *)d : (const void *)h,
                                   (size_t)(hi - lo) * f4, get ? ZOFF_COPY_D2H : ZOFF_COPY_H2D));
        dev = true;
    }
    return dev ? zoff_stream_synchronize(e->compute) : ZOFF_OK;
}

void zoff_engine_get_scalars(const zoff_engine *e, zoff_engine_scalars *out) {
    *out = e->sc;
    out->rollbacks = e->rollbacks;
    out->loss_scale = e->ls.scale;
    out->scaler_iter = e->ls.iter;
    out->last_overflow_iter = e->ls.last_overflow_iter;
    out->hysteresis_left = e->ls.hysteresis_left;
}

zoff_status zoff_engine_set_scalars(zoff_engine *e, const zoff_engine_scalars *in) {
    if (in->steps_taken < 0 || in->steps_skipped < 0 || !(in->loss_scale > 0) || !isfinite(in->loss_scale))
        return zoff_error(ZOFF_ERR_FORMAT,
                          "engine state has steps_taken %lld and loss_scale %g: the checkpoint is corrupt",
                          (long long)in->steps_taken, in->loss_scale);
    e->sc.steps_taken = in->steps_taken;
    e->sc.steps_skipped = in->steps_skipped;
    zoff_loss_scaler_restore(&e->ls, in->loss_scale, in->scaler_iter, in->last_overflow_iter, in->hysteresis_left);
    e->rollbacks = in->rollbacks;
    /* the host optimizer multiplies its bias-correction products step by step (pow() after a
     * jump): begin the steps taken again, so that they are those of the uninterrupted run */
    for (int64_t k = 1; e->hopt && k <= e->sc.steps_taken; k++) {
        ZOFF_TRY(zoff_eng_hopt_begin(e, k, e->cfg->optimizer.lr));
        e->hopt_t0 = 1;
    }
    return ZOFF_OK;
}

void zoff_engine_memory_usage(const zoff_engine *e, zoff_engine_memory *m) {
    size_t f4 = sizeof(float);
    memset(m, 0, sizeof *m);
    m->device = (size_t)e->n_dev * f4 * ((e->dtype != ZOFF_F32) + 2) + zoff_placement_stats_bytes(e->ngroups);
    if (e->buckets) m->device += e->gd.bytes; /* the gradients (the model holds none) */
    if (e->s3) { /* stage 3: the partition's weights and gradients, gathered groups, scratch */
        zoff_s3_stats ss;
        zoff_s3_get_stats(e->s3, &ss);
        m->device += ss.pool_bytes + ss.persistent_bytes + (size_t)e->n * e->esize * (1 + (e->s3_params_dev != NULL));
    }
    if (e->scratch.recv) m->device += (size_t)e->scratch.elems * e->esize;
    if (e->scratch.pack) m->device += (size_t)e->scratch.elems * e->esize;
    m->pinned = e->hb.pinned;
    m->pageable = e->hb.pageable;
    if (e->bk_master) m->pageable += zoff_placement_spec_backup_bytes(e->cfg, e->n_host); /* super_offload */
    if (e->swap) { /* the state on disk (fp32 master, m and v in sdt); host memory holds only the swapper's buffers */
        if (e->pinned) m->pinned += zoff_swapper_buffer_bytes(e->swap); /* (pin_memory) */
        else m->pageable += zoff_swapper_buffer_bytes(e->swap);
        m->nvme = (size_t)zoff_swapper_file_bytes(e->swap);
    }
    if (e->s3 && e->pnvme) { /* the weight partition on disk: host memory holds the buffers and max_in_cpu */
        zoff_s3_stats ss;
        zoff_s3_get_stats(e->s3, &ss);
        size_t h = ss.nvme_buffer_bytes + ss.nvme_resident_bytes;
        if (ss.nvme_pinned) m->pinned += h;
        else m->pageable += h;
        m->nvme += (size_t)ss.nvme_file_bytes;
    }
    m->host_params = e->n_host;
    m->device_params = e->n_dev;
    m->num_subgroups = e->nsg;
    m->host_ratio = (double)e->n_host / (double)e->n;
}

const char *zoff_engine_describe(const zoff_engine *e) { return e->describe; }
