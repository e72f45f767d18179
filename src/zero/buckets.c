/* Layer groups, gradient buckets and per-group gradient statistics (see engine_impl.h and
 * zoff_placement_grad_buckets / zoff_placement_grad_device in include/zoff/engine.h).
 *
 * With buckets the model holds no gradient buffer: backward asks for each layer group's
 * (zoff_grad_hooks). A group of the device sub-groups gets its range of the engine's
 * device buffer [0, gd.device) (accumulated, read by the device optimizer); a group of the
 * host sub-groups gets a bucket (the first group its own, held through backward; the
 * others a ring of gd.nslots), zeroed on the compute stream after the bucket's previous
 * copies to the host are done. Its grad-ready call copies it to the host (gradients.c); its
 * release takes its statistics on the compute stream and records on the gradient stream
 * that the bucket is free once those copies are done. With accumulation (zoff_grad_buckets
 * "always") every backward's buckets go to the host, where the window's sum lives (the host
 * gradient buffer, h_grads[gbuf]); a later backward's bucket starts from that sum, copied
 * back on its own stream after the previous backward's copies and the bucket's last ones,
 * instead of from zero, so the device adds each micro-batch to the same bits the full
 * buffer would hold; statistics are taken at the boundary only. With several ranks every
 * group gets a bucket; its grad-ready reduces it over the ranks (every micro-batch, with
 * accumulation) and takes its statistics over this rank's pieces on the gradient stream
 * (zoff_bk_reduce, at the boundary), copies this rank's device pieces into the compact
 * buffer grads_dev, and then its host pieces go out; a later micro-batch's bucket starts from
 * this rank's pieces of the sum (host and compact) and zeros elsewhere. */
#include <stdlib.h>

#include "zero/engine_impl.h"

/* The group holding model offset `off` (-1 if none). */
static int group_at(const zoff_engine *e, int64_t off) {
    int a = zoff_group_find(e->goff, e->ngroups, off);
    return a >= 0 && off < e->goff[a] + e->gcnt[a] ? a : -1;
}

static zoff_status bk_groups(zoff_engine *e, const zoff_engine_options *o) {
    const zoff_tensor_info *t = o->tensors;
    int nt = o->num_tensors;
    e->goff = malloc((size_t)nt * sizeof *e->goff);
    e->gcnt = malloc((size_t)nt * sizeof *e->gcnt);
    if (!e->goff || !e->gcnt) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the layer groups");
    for (int i = 0; i < nt; i++) {
        if (i == 0 || t[i].layer != t[i - 1].layer) {
            e->goff[e->ngroups] = t[i].offset;
            e->ngroups++;
        }
        e->gcnt[e->ngroups - 1] = t[i].offset + t[i].numel - e->goff[e->ngroups - 1];
    }
    return ZOFF_OK;
}

static zoff_grad_device_in bk_input(const zoff_engine *e, int64_t device) {
    return (zoff_grad_device_in){.group_count = e->gcnt, .ngroups = e->ngroups, .device = device,
                                 .reduce_bucket_size = e->cfg->zero.reduce_bucket_size, .dtype = e->dtype,
                                 .spread = e->world > 1, .accumulate = e->cfg->gradient_accumulation_steps > 1};
}

zoff_status zoff_bk_groups(zoff_engine *e, const zoff_engine_options *o, size_t *auto_fixed, size_t *auto_per_param) {
    ZOFF_TRY(bk_groups(e, o));
    e->buckets = !o->grads && e->cfg->zero.stage < 3;
    zoff_grad_device_in in = bk_input(e, 0);
    zoff_placement_auto_engine_bytes(e->buckets ? &in : NULL, e->ngroups, auto_fixed, auto_per_param);
    return ZOFF_OK;
}

zoff_status zoff_bk_alloc(zoff_engine *e) {
    ZOFF_TRY(zoff_device_alloc(e->dev, zoff_placement_stats_bytes(e->ngroups), "gradient statistics",
                               (void **)&e->stats_dev));
    if (!e->buckets) return ZOFF_OK;
    /* one rank: the device sub-groups are the bottom of the flat space */
    for (int i = 0; e->world == 1 && i < e->nsg; i++)
        if (!e->sg[i].on_host && e->sg[i].offset + e->sg[i].count > e->n_dev)
            return zoff_error(ZOFF_ERR_INTERNAL, "gradient buckets: device sub-group %d is not below the host ones", i);
    zoff_grad_device_in in = bk_input(e, e->n_dev);
    zoff_placement_grad_device(&in, &e->gd);
    const zoff_grad_device *d = &e->gd;
    if (d->device > 0) {
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)d->device * e->esize, "gradients of the device sub-groups",
                                   &e->grads));
        ZOFF_TRY(zoff_memset_async(e->compute, e->grads, 0, (size_t)d->device * e->esize));
    }
    if (d->compact > 0) /* several ranks: this rank's device pieces, in its state order */
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)d->compact * e->esize, "gradients of the device sub-groups",
                                   &e->grads_dev));
    if (d->held > 0)
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)d->held * e->esize, "gradient bucket (first layer group)",
                                   &e->gb_held));
    if (d->ring > 0)
        ZOFF_TRY(zoff_device_alloc(e->dev, (size_t)d->ring * e->esize, "gradient buckets", &e->gb_ring));
    int nb = d->nslots + 1;
    e->ev_bucket = calloc((size_t)nb, sizeof *e->ev_bucket);
    e->bucket_group = malloc((size_t)nb * sizeof *e->bucket_group);
    e->group_bucket = malloc((size_t)e->ngroups * sizeof *e->group_bucket);
    if (!e->ev_bucket || !e->bucket_group || !e->group_bucket)
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the gradient buckets");
    for (int k = 0; k < nb; k++) {
        e->bucket_group[k] = -1;
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_bucket[k]));
    }
    for (int g = 0; g < e->ngroups; g++) e->group_bucket[g] = -1;
    /* accumulation ("always"): with host groups, the sum so far goes back through the buckets */
    e->bk_acc = e->cfg->gradient_accumulation_steps > 1 && (d->held > 0 || d->nslots > 0);
    if (!e->bk_acc) return ZOFF_OK;
    e->ev_bk_up = calloc((size_t)nb, sizeof *e->ev_bk_up);
    e->ev_bk_free = calloc((size_t)nb, sizeof *e->ev_bk_free);
    if (!e->ev_bk_up || !e->ev_bk_free) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the gradient buckets");
    for (int k = 0; k < nb; k++) {
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_bk_up[k]));
        ZOFF_TRY(zoff_event_create(e->dev, &e->ev_bk_free[k]));
    }
    ZOFF_TRY(zoff_event_create(e->dev, &e->ev_bk_copies));
    return zoff_stream_create(e->dev, "gradient sums to device", &e->bk_up);
}

/* A per-bucket event array (NULL: none) and its n events. */
static void destroy_events(zoff_event **ev, int n) {
    for (int k = 0; ev && k < n; k++) zoff_event_destroy(ev[k]);
    free(ev);
}

void zoff_bk_destroy(zoff_engine *e) {
    if (e->buckets && e->grads) zoff_device_free(e->dev, e->grads);
    if (e->grads_dev) zoff_device_free(e->dev, e->grads_dev);
    if (e->gb_held) zoff_device_free(e->dev, e->gb_held);
    if (e->gb_ring) zoff_device_free(e->dev, e->gb_ring);
    if (e->stats_dev) zoff_device_free(e->dev, e->stats_dev);
    destroy_events(e->ev_bucket, e->gd.nslots + 1);
    destroy_events(e->ev_bk_up, e->gd.nslots + 1);
    destroy_events(e->ev_bk_free, e->gd.nslots + 1);
    if (e->ev_bk_copies) zoff_event_destroy(e->ev_bk_copies);
    if (e->bk_up) zoff_stream_destroy(e->bk_up);
    free(e->bucket_group);
    free(e->group_bucket);
    free(e->goff);
    free(e->gcnt);
}

bool zoff_engine_uses_grad_buckets(const zoff_engine *e) { return e && e->buckets; }

/* The first host group after the first group (flat buckets: bucket k is group g0 + k's). */
static int first_later_host(const zoff_engine *e) { return e->ngroups - e->gd.nslots; }

static void *bucket_ptr(const zoff_engine *e, int k) {
    if (k == e->gd.nslots) return e->gb_held;
    if (e->gd.flat) {
        int g0 = first_later_host(e);
        return (char *)e->gb_ring + (size_t)(e->goff[g0 + k] - e->goff[g0]) * e->esize;
    }
    return (char *)e->gb_ring + (size_t)k * (size_t)e->gd.slot * e->esize;
}

/* Copies between a held bucket b (group g's) and the compact buffer grads_dev of this rank's device pieces
 * in group g, on stream s: out of the bucket (to_compact) or into it. */
static zoff_status compact_copy(zoff_engine *e, zoff_stream *s, int g, void *b, bool to_compact) {
    for (int i = 0; e->grads_dev && i < e->nsg; i++) {
        const subgroup *q = &e->sg[i];
        int64_t lo, hi;
        if (q->on_host || !zoff_eng_sg_part(e, i, e->goff[g], e->goff[g] + e->gcnt[g], &lo, &hi)) continue;
        char *c = (char *)e->grads_dev + (size_t)(q->state_off + lo - q->model) * e->esize;
        char *x = (char *)b + (size_t)(lo - e->goff[g]) * e->esize;
        ZOFF_TRY(zoff_memcpy_async(s, to_compact ? c : x, to_compact ? x : c, (size_t)(hi - lo) * e->esize,
                                   ZOFF_COPY_D2D));
    }
    return ZOFF_OK;
}

/* Group g's sum so far into its bucket, on bk_up: its host pieces from the host sub-groups' h_grads[gbuf].
 * Several ranks: the host holds this rank's host pieces of the sum and grads_dev its device pieces (each
 * micro-batch was reduced over the ranks); the rest of the bucket starts from zero, so that the next
 * reduction adds every rank's micro-batch to this rank's sum, once. */
static zoff_status bucket_upload(zoff_engine *e, int g, void *buf) {
    if (e->world > 1) {
        ZOFF_TRY(zoff_memset_async(e->bk_up, buf, 0, (size_t)e->gcnt[g] * e->esize));
        ZOFF_TRY(compact_copy(e, e->bk_up, g, buf, false));
    }
    for (int i = 0; i < e->nsg; i++) {
        int64_t lo, hi;
        const void *src = zoff_eng_host_grad_piece(e, i, e->gbuf, e->goff[g], e->goff[g] + e->gcnt[g], &lo, &hi);
        if (src)
            ZOFF_TRY(zoff_memcpy_async(e->bk_up, (char *)buf + (size_t)(lo - e->goff[g]) * e->esize, src,
                                       (size_t)(hi - lo) * e->esize, ZOFF_COPY_H2D));
    }
    return ZOFF_OK;
}

zoff_status zoff_bk_begin_backward(zoff_engine *e) {
    e->bk_upload = e->bk_sum_on_host;
    e->bk_sum_on_host = true; /* after this backward's copies */
    if (!e->bk_upload) return ZOFF_OK;
    /* the sums read back are what the previous backward's copies wrote */
    ZOFF_TRY(zoff_event_record(e->ev_bk_copies, e->d2h));
    return zoff_stream_wait_event(e->bk_up, e->ev_bk_copies);
}

zoff_status zoff_engine_grad_acquire(void *engine, zoff_stream *s, int64_t offset, int64_t count, void **grads) {
    zoff_engine *e = engine;
    *grads = NULL;
    if (!e->buckets)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_grad_acquire: this engine uses the model's gradient buffer "
                                            "(no gradient buckets)");
    int g = group_at(e, offset);
    if (g < 0 || e->goff[g] != offset || e->gcnt[g] != count)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_grad_acquire: [%lld, +%lld) is not a layer group",
                          (long long)offset, (long long)count);
    if (offset + count <= e->gd.device) { /* a device sub-group's: accumulated in the device buffer */
        *grads = (char *)e->grads + (size_t)offset * e->esize;
        return ZOFF_OK;
    }
    if (!e->boundary && !e->bk_acc)
        return zoff_error(ZOFF_ERR_INVALID, "gradient buckets: a backward that is not an accumulation boundary, and "
                                            "the engine was made for gradient_accumulation_steps 1");
    int k = e->gd.nslots; /* the first group: its own bucket */
    if (g > 0 && e->gd.flat) {
        k = g - first_later_host(e);
    } else if (g > 0) {
        k = e->next_bucket;
        e->next_bucket = (k + 1) % e->gd.nslots;
    }
    if (e->bucket_group[k] >= 0)
        return zoff_error(ZOFF_ERR_INVALID,
                          "gradient buckets: layer group %d needs bucket %d, which still holds group %d (more groups "
                          "held at once than the %d buckets); raise zero_optimization.reduce_bucket_size",
                          g, k, e->bucket_group[k], e->gd.nslots);
    void *buf = bucket_ptr(e, k);
    if (e->bk_upload) { /* a later micro-batch: the bucket starts from the host's sum */
        /* its last copies to the host, and its last reader on the compute stream (the statistics), are done */
        ZOFF_TRY(zoff_stream_wait_event(e->bk_up, e->ev_bucket[k]));
        ZOFF_TRY(zoff_stream_wait_event(e->bk_up, e->ev_bk_free[k]));
        ZOFF_TRY(bucket_upload(e, g, buf));
        ZOFF_TRY(zoff_event_record(e->ev_bk_up[k], e->bk_up));
        ZOFF_TRY(zoff_stream_wait_event(s, e->ev_bk_up[k]));
    } else {
        ZOFF_TRY(zoff_stream_wait_event(s, e->ev_bucket[k])); /* its last copies to the host are done */
        ZOFF_TRY(zoff_memset_async(s, buf, 0, (size_t)count * e->esize));
    }
    e->bucket_group[k] = g;
    e->group_bucket[g] = k;
    *grads = buf;
    return ZOFF_OK;
}

/* Group g's statistics from x into its two floats of stats_dev, on stream s. */
static zoff_status group_stats(zoff_engine *e, zoff_stream *s, int g, const void *x) {
    ZOFF_TRY(zoff_memset_async(s, e->stats_dev + 2 * g, 0, 2 * sizeof(float)));
    zoff_op_grad_stats_args ga = {.stats = e->stats_dev + 2 * g, .x = x, .n = e->gcnt[g], .dt = e->dtype};
    return ZOFF_LAUNCH(s, ZOFF_OP_GRAD_STATS, ga);
}

/* Several ranks: group g's statistics over this rank's pieces of it (after their reduction),
 * from x (holding model offsets from g0 on), on stream s; the pieces in plan order. */
static zoff_status own_stats(zoff_engine *e, zoff_stream *s, int g, const void *x, int64_t g0) {
    ZOFF_TRY(zoff_memset_async(s, e->stats_dev + 2 * g, 0, 2 * sizeof(float)));
    const zoff_dp_plan *p = &e->plan;
    for (int k = 0; k < p->nown[p->rank]; k++) {
        const zoff_dp_piece *q = &p->pieces[p->own[p->rank][k]];
        int64_t lo = q->model > e->goff[g] ? q->model : e->goff[g];
        int64_t hi = q->model + q->count < e->goff[g] + e->gcnt[g] ? q->model + q->count : e->goff[g] + e->gcnt[g];
        if (lo >= hi) continue;
        zoff_op_grad_stats_args ga = {.stats = e->stats_dev + 2 * g, .x = (const char *)x + (size_t)(lo - g0) * e->esize,
                                      .n = hi - lo, .dt = e->dtype};
        ZOFF_TRY(ZOFF_LAUNCH(s, ZOFF_OP_GRAD_STATS, ga));
    }
    return ZOFF_OK;
}

zoff_status zoff_bk_reduce(zoff_engine *e, int64_t offset, int64_t end) {
    int g = group_at(e, offset);
    int k = g >= 0 ? e->group_bucket[g] : -1;
    /* (the model reports whole layer groups: the statistics below are the group's) */
    if (k < 0 || offset != e->goff[g] || end != e->goff[g] + e->gcnt[g])
        return zoff_error(ZOFF_ERR_INTERNAL, "gradient buckets: [%lld, %lld) is not a held layer group",
                          (long long)offset, (long long)end);
    void *b = bucket_ptr(e, k);
    ZOFF_TRY(zoff_dp_reduce_grads(&e->plan, e->chan, e->d2h, b, e->goff[g], e->dtype, offset, end, e->scatter,
                                  &e->scratch, &e->layout));
    /* this rank's device pieces, kept until the step (with accumulation: the sum so far, which the next
     * micro-batch's bucket starts from) */
    ZOFF_TRY(compact_copy(e, e->d2h, g, b, true));
    return e->boundary ? own_stats(e, e->d2h, g, b, e->goff[g]) : ZOFF_OK;
}

zoff_status zoff_engine_grad_release(void *engine, zoff_stream *s, int64_t offset, int64_t count) {
    zoff_engine *e = engine;
    (void)count;
    int g = group_at(e, offset);
    int k = g >= 0 && e->group_bucket ? e->group_bucket[g] : -1;
    if (k < 0) return ZOFF_OK; /* the device buffer's */
    /* of the window's sum (several ranks: taken after the reduction, zoff_bk_reduce) */
    if (e->boundary && e->world == 1) ZOFF_TRY(group_stats(e, s, g, bucket_ptr(e, k)));
    if (e->bk_acc) ZOFF_TRY(zoff_event_record(e->ev_bk_free[k], s)); /* the next upload into it waits for this */
    /* after the copies its grad-ready call issued on the gradient stream */
    ZOFF_TRY(zoff_event_record(e->ev_bucket[k], e->d2h));
    e->bucket_group[k] = -1;
    e->group_bucket[g] = -1;
    return ZOFF_OK;
}

void *zoff_bk_grad_ptr(const zoff_engine *e, int64_t lo) {
    if (!e->buckets || lo < e->gd.device) return (char *)e->grads + (size_t)lo * e->esize;
    int g = group_at(e, lo);
    int k = g >= 0 ? e->group_bucket[g] : -1;
    return k < 0 ? NULL : (char *)bucket_ptr(e, k) + (size_t)(lo - e->goff[g]) * e->esize;
}

const void *zoff_bk_device_grads(const zoff_engine *e, int64_t mo, int64_t so) {
    if (!e->buckets || e->world == 1) return (const char *)e->grads + (size_t)mo * e->esize;
    if (e->grads_dev) return (const char *)e->grads_dev + (size_t)so * e->esize;
    int g = group_at(e, mo); /* flat: every group keeps its own bucket until the next backward */
    int k = g == 0 ? e->gd.nslots : g - first_later_host(e);
    return (const char *)bucket_ptr(e, k) + (size_t)(mo - e->goff[g]) * e->esize;
}

zoff_status zoff_bk_grad_stats(zoff_engine *e, double *sumsq, double *nonfinite) {
    for (int g = 0; g < e->ngroups; g++) {
        if (e->buckets && e->goff[g] >= e->gd.device) continue; /* bucketed: at their release or reduction */
        if (e->world > 1) ZOFF_TRY(own_stats(e, e->compute, g, e->grads, 0));
        else ZOFF_TRY(group_stats(e, e->compute, g, (const char *)e->grads + (size_t)e->goff[g] * e->esize));
    }
    float *st = malloc(zoff_placement_stats_bytes(e->ngroups));
    if (!st) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the gradient statistics");
    zoff_status s = zoff_memcpy_async(e->compute, st, e->stats_dev, 2 * sizeof(float) * (size_t)e->ngroups,
                                      ZOFF_COPY_D2H);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(e->compute);
    double sq = 0, nf = 0;
    for (int g = 0; s == ZOFF_OK && g < e->ngroups; g++) {
        sq += st[2 * g];
        nf += st[2 * g + 1];
    }
    free(st);
    *sumsq = sq;
    *nonfinite = nf;
    return s;
}

zoff_status zoff_bk_zero_grad(zoff_engine *e) {
    e->bk_sum_on_host = false;
    size_t n = e->buckets ? (size_t)e->gd.device : (size_t)(e->stage3 ? e->n : e->n_model);
    return n ? zoff_memset_async(e->compute, e->grads, 0, n * e->esize) : ZOFF_OK;
}
