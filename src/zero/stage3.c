/* ZeRO stage 3 parameter management (see stage3.h). */
#define _GNU_SOURCE
#include "zero/stage3.h"

#include <stdlib.h>
#include <string.h>

/* A pooled device buffer. Before a stream reuses it, it waits for both events. */
typedef struct s3_buf {
    void *ptr;
    int64_t elems;
    bool busy;
    zoff_event *ev_used; /* compute: after the last op that used it */
    zoff_event *ev_comm; /* comm: after the last collective that read or wrote it */
} s3_buf;

typedef struct s3_group {
    int64_t offset, count;
    bool persistent;
    int refs;          /* acquisitions not yet released */
    s3_buf *params;    /* gathered weights (NULL: not gathered) */
    zoff_event *ev_ready; /* comm: the gather is done */
    s3_buf *grads;     /* backward: the gradient buffer handed out */
    bool prefetched;   /* gathered ahead, not acquired yet */
} s3_group;

typedef struct s3_trace {
    int *g;
    int n, cap;
    bool valid, recording;
} s3_trace;

struct zoff_s3 {
    zoff_s3_options o;
    size_t es;
    s3_group *grp;
    int ngrp;
    s3_buf **bufs;
    int nbufs, cap_bufs;
    s3_trace trace[2]; /* forward, backward */
    int pass;          /* current pass: 0 forward, 1 backward, -1 none */
    int pos;           /* position in the current pass's trace */
    bool following;    /* the current pass follows its recorded trace */
    zoff_event *ev_tmp;
    zoff_s3_stats st;
};

static void *at(void *base, int64_t elem, size_t es) { return (char *)base + (size_t)elem * es; }

static void buf_free(zoff_s3 *s, s3_buf *b) {
    if (!b) return;
    zoff_event_destroy(b->ev_used);
    zoff_event_destroy(b->ev_comm);
    zoff_device_free(s->o.dev, b->ptr);
    free(b);
}

void zoff_s3_destroy(zoff_s3 *s) {
    if (!s) return;
    if (s->o.comm) (void)zoff_stream_synchronize(s->o.comm);
    if (s->o.compute) (void)zoff_stream_synchronize(s->o.compute);
    for (int i = 0; i < s->nbufs; i++) buf_free(s, s->bufs[i]);
    for (int g = 0; g < s->ngrp; g++) zoff_event_destroy(s->grp[g].ev_ready);
    for (int k = 0; k < 2; k++) free(s->trace[k].g);
    zoff_event_destroy(s->ev_tmp);
    free(s->bufs);
    free(s->grp);
    free(s);
}

/* A free buffer of exactly `elems` elements, or a new one. */
static zoff_status buf_get(zoff_s3 *s, int64_t elems, const char *what, s3_buf **out) {
    for (int i = 0; i < s->nbufs; i++)
        if (!s->bufs[i]->busy && s->bufs[i]->elems == elems) {
            s->bufs[i]->busy = true;
            *out = s->bufs[i];
            return ZOFF_OK;
        }
    if (s->nbufs == s->cap_bufs) {
        int cap = s->cap_bufs ? 2 * s->cap_bufs : 16;
        s3_buf **nb = realloc(s->bufs, (size_t)cap * sizeof *nb);
        if (!nb) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the stage 3 buffer pool");
        s->bufs = nb;
        s->cap_bufs = cap;
    }
    s3_buf *b = calloc(1, sizeof *b);
    if (!b) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the stage 3 buffer pool");
    zoff_status st = zoff_device_alloc(s->o.dev, (size_t)elems * s->es, what, &b->ptr);
    if (st == ZOFF_OK) st = zoff_event_create(s->o.dev, &b->ev_used);
    if (st == ZOFF_OK) st = zoff_event_create(s->o.dev, &b->ev_comm);
    if (st != ZOFF_OK) {
        buf_free(s, b);
        return zoff_error_context(st, "ZeRO stage 3 (lower stage3_prefetch_bucket_size, or raise "
                                      "stage3_param_persistence_threshold less)");
    }
    b->elems = elems;
    b->busy = true;
    s->bufs[s->nbufs++] = b;
    s->st.pool_bytes += (size_t)elems * s->es;
    *out = b;
    return ZOFF_OK;
}

static void buf_put(s3_buf *b) {
    if (b) b->busy = false;
}

zoff_status zoff_s3_create(const zoff_s3_options *o, zoff_s3 **out) {
    *out = NULL;
    zoff_s3 *s = calloc(1, sizeof *s);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for ZeRO stage 3");
    s->o = *o;
    s->es = zoff_dtype_size(o->dtype);
    s->pass = -1;
    /* groups: runs of equal `layer` in the tensor table */
    s->grp = calloc((size_t)o->num_tensors, sizeof *s->grp);
    zoff_status st = s->grp ? ZOFF_OK : zoff_error(ZOFF_ERR_NOMEM, "out of host memory for ZeRO stage 3");
    for (int i = 0; st == ZOFF_OK && i < o->num_tensors; i++) {
        if (i > 0 && o->tensors[i].layer == o->tensors[i - 1].layer) {
            s->grp[s->ngrp - 1].count += o->tensors[i].numel;
        } else {
            s->grp[s->ngrp].offset = o->tensors[i].offset;
            s->grp[s->ngrp].count = o->tensors[i].numel;
            s->ngrp++;
        }
    }
    for (int g = 0; st == ZOFF_OK && g < s->ngrp; g++) {
        s->grp[g].persistent = s->grp[g].count <= o->persistence_threshold;
        st = zoff_event_create(o->dev, &s->grp[g].ev_ready);
        if (st == ZOFF_OK && s->grp[g].persistent) {
            st = buf_get(s, s->grp[g].count, "stage 3 persistent parameters", &s->grp[g].params);
            s->st.persistent++;
            s->st.persistent_bytes += (size_t)s->grp[g].count * s->es;
            s->st.pool_bytes -= (size_t)s->grp[g].count * s->es;
        }
    }
    if (st == ZOFF_OK) st = zoff_event_create(o->dev, &s->ev_tmp);
    s->st.groups = s->ngrp;
    if (st != ZOFF_OK) {
        zoff_s3_destroy(s);
        return st;
    }
    *out = s;
    return ZOFF_OK;
}

static s3_group *find(zoff_s3 *s, int64_t offset, int64_t count) {
    int a = 0, b = s->ngrp - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (s->grp[mid].offset <= offset) a = mid;
        else b = mid - 1;
    }
    s3_group *g = &s->grp[a];
    if (s->ngrp == 0 || g->offset != offset || g->count != count) {
        zoff_error(ZOFF_ERR_INVALID,
                   "ZeRO stage 3: [%lld, +%lld) is not a parameter group (runs of one layer in the tensor table)",
                   (long long)offset, (long long)count);
        return NULL;
    }
    return g;
}

/* All-gather group g's weights into dst (device, g->count elements), on the comm stream. */
static zoff_status gather(zoff_s3 *s, s3_group *g, s3_buf *dst) {
    const zoff_dp_plan *p = s->o.plan;
    zoff_dp_layout *l = s->o.layout;
    zoff_stream *cs = s->o.comm;
    size_t es = s->es;
    zoff_copy_kind kind = s->o.params_on_host ? ZOFF_COPY_H2D : ZOFF_COPY_D2D;
    ZOFF_TRY(zoff_stream_wait_event(cs, dst->ev_used)); /* the compute stream is done with its old contents */
    int64_t a = g->offset;
    zoff_dp_layout_of(p, a, a + g->count, l);
    if (l->identity) { /* every rank's block at its place in the group: in place */
        for (int i = 0; i < l->np; i++)
            if (l->p[i].owner == p->rank)
                ZOFF_TRY(zoff_memcpy_async(cs, at(dst->ptr, l->p[i].model - a, es), at(s->o.p_params, l->p[i].local, es),
                                           (size_t)l->p[i].count * es, kind));
        ZOFF_TRY(zoff_comm_allgatherv(s->o.chan, cs, dst->ptr, l->counts, l->starts, s->o.dtype));
    } else { /* round-robin: through the packing buffer */
        void *pack = s->o.scratch->pack;
        int64_t pos = l->starts[p->rank];
        for (int i = 0; i < l->np; i++)
            if (l->p[i].owner == p->rank) {
                ZOFF_TRY(zoff_memcpy_async(cs, at(pack, pos, es), at(s->o.p_params, l->p[i].local, es),
                                           (size_t)l->p[i].count * es, kind));
                pos += l->p[i].count;
            }
        ZOFF_TRY(zoff_comm_allgatherv(s->o.chan, cs, pack, l->counts, l->starts, s->o.dtype));
        pos = 0;
        for (int i = 0; i < l->np; i++) {
            ZOFF_TRY(zoff_memcpy_async(cs, at(dst->ptr, l->p[i].model - a, es), at(pack, pos, es),
                                       (size_t)l->p[i].count * es, ZOFF_COPY_D2D));
            pos += l->p[i].count;
        }
    }
    ZOFF_TRY(zoff_event_record(g->ev_ready, cs));
    ZOFF_TRY(zoff_event_record(dst->ev_comm, cs));
    s->st.gathers++;
    return ZOFF_OK;
}

/* Make sure group g's weights are gathered (or being gathered). */
static zoff_status fetch(zoff_s3 *s, s3_group *g, bool ahead) {
    if (g->params) return ZOFF_OK;
    ZOFF_TRY(buf_get(s, g->count, "stage 3 gathered parameters", &g->params));
    zoff_status st = gather(s, g, g->params);
    if (st != ZOFF_OK) {
        buf_put(g->params);
        g->params = NULL;
        return st;
    }
    g->prefetched = ahead;
    if (ahead) s->st.prefetched++;
    return ZOFF_OK;
}

/* Drop a gathered, unused group's buffer (it returns to the pool once the compute stream is past it). */
static zoff_status drop(zoff_s3 *s, s3_group *g) {
    if (g->persistent || g->refs > 0 || !g->params) return ZOFF_OK;
    ZOFF_TRY(zoff_event_record(g->params->ev_used, s->o.compute));
    buf_put(g->params);
    g->params = NULL;
    g->prefetched = false;
    return ZOFF_OK;
}

/* Gather the groups that follow in the recorded order, within the prefetch budget. */
static zoff_status prefetch(zoff_s3 *s) {
    if (s->pass < 0 || !s->following || s->o.prefetch_elems <= 0) return ZOFF_OK;
    const s3_trace *t = &s->trace[s->pass];
    int64_t ahead = 0;
    for (int g = 0; g < s->ngrp; g++)
        if (s->grp[g].prefetched) ahead += s->grp[g].count;
    for (int k = s->pos; k < t->n; k++) {
        s3_group *g = &s->grp[t->g[k]];
        if (g->persistent || g->params) continue;
        if (ahead + g->count > s->o.prefetch_elems) break;
        ZOFF_TRY(fetch(s, g, true));
        ahead += g->count;
    }
    return ZOFF_OK;
}

zoff_status zoff_s3_begin_pass(zoff_s3 *s, bool backward) {
    int k = backward ? 1 : 0;
    /* groups gathered ahead for the previous pass but not used: back to the pool */
    for (int g = 0; g < s->ngrp; g++)
        if (s->grp[g].prefetched) ZOFF_TRY(drop(s, &s->grp[g]));
    if (s->pass >= 0 && s->trace[s->pass].recording) { /* the previous pass's record is complete */
        s->trace[s->pass].recording = false;
        s->trace[s->pass].valid = true;
    }
    s->pass = k;
    s->pos = 0;
    s3_trace *t = &s->trace[k];
    s->following = t->valid;
    if (!t->valid) {
        t->n = 0;
        t->recording = true;
    }
    return prefetch(s);
}

zoff_status zoff_s3_acquire(zoff_s3 *s, int64_t offset, int64_t count, bool backward, void **params, void **grads) {
    s3_group *g = find(s, offset, count);
    if (!g) return ZOFF_ERR_INVALID;
    int gi = (int)(g - s->grp);
    /* follow or record the order */
    if (s->pass >= 0) {
        s3_trace *t = &s->trace[s->pass];
        if (t->recording) {
            if (t->n == t->cap) {
                int cap = t->cap ? 2 * t->cap : 64;
                int *ng = realloc(t->g, (size_t)cap * sizeof *ng);
                if (!ng) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the stage 3 trace");
                t->g = ng;
                t->cap = cap;
            }
            t->g[t->n++] = gi;
        } else if (s->following) {
            if (s->pos < t->n && t->g[s->pos] == gi) {
                s->pos++;
            } else { /* a different order: stop prefetching; record it at the next pass */
                s->following = false;
                t->valid = false;
            }
        }
    }
    if (g->prefetched) s->st.prefetch_hits++;
    g->prefetched = false;
    ZOFF_TRY(fetch(s, g, false));
    g->refs++;
    ZOFF_TRY(zoff_stream_wait_event(s->o.compute, g->ev_ready));
    *params = g->params->ptr;
    if (backward && grads) {
        if (!g->grads) {
            ZOFF_TRY(buf_get(s, g->count, "stage 3 gradient buffer", &g->grads));
            /* the last reduce-scatter that read it is done */
            ZOFF_TRY(zoff_stream_wait_event(s->o.compute, g->grads->ev_comm));
            ZOFF_TRY(zoff_memset_async(s->o.compute, g->grads->ptr, 0, (size_t)g->count * s->es));
        }
        *grads = g->grads->ptr;
    }
    return prefetch(s);
}

zoff_status zoff_s3_release(zoff_s3 *s, int64_t offset, int64_t count, bool backward) {
    s3_group *g = find(s, offset, count);
    if (!g) return ZOFF_ERR_INVALID;
    if (g->refs <= 0)
        return zoff_error(ZOFF_ERR_INVALID, "ZeRO stage 3: group [%lld, +%lld) released more often than acquired",
                          (long long)offset, (long long)count);
    g->refs--;
    if (g->refs == 0) {
        if (g->grads) { /* the gradient buffer: reused once compute and the reduce-scatter are past it */
            ZOFF_TRY(zoff_event_record(g->grads->ev_used, s->o.compute));
            buf_put(g->grads);
            g->grads = NULL;
        }
        ZOFF_TRY(drop(s, g));
    }
    (void)backward;
    return ZOFF_OK;
}

zoff_status zoff_s3_reduce(zoff_s3 *s, zoff_stream *producer, int64_t offset, int64_t count) {
    s3_group *g = find(s, offset, count);
    if (!g) return ZOFF_ERR_INVALID;
    if (!g->grads)
        return zoff_error(ZOFF_ERR_INVALID, "ZeRO stage 3: gradients of group [%lld, +%lld) reported without a "
                                            "backward acquisition",
                          (long long)offset, (long long)count);
    const zoff_dp_plan *p = s->o.plan;
    zoff_dp_layout *l = s->o.layout;
    zoff_stream *cs = s->o.comm;
    size_t es = s->es;
    ZOFF_TRY(zoff_event_record(s->ev_tmp, producer));
    ZOFF_TRY(zoff_stream_wait_event(cs, s->ev_tmp));
    int64_t a = g->offset;
    zoff_dp_layout_of(p, a, a + g->count, l);
    const void *send = g->grads->ptr;
    if (!l->identity) {
        int64_t pos = 0;
        for (int i = 0; i < l->np; i++) {
            ZOFF_TRY(zoff_memcpy_async(cs, at(s->o.scratch->pack, pos, es), at(g->grads->ptr, l->p[i].model - a, es),
                                       (size_t)l->p[i].count * es, ZOFF_COPY_D2D));
            pos += l->p[i].count;
        }
        send = s->o.scratch->pack;
    }
    ZOFF_TRY(zoff_comm_reduce_scatter(s->o.chan, cs, send, s->o.scratch->recv, l->counts, s->o.dtype));
    int64_t pos = 0;
    for (int i = 0; i < l->np; i++) { /* this rank's pieces, local order: accumulate */
        if (l->p[i].owner != p->rank) continue;
        void *dst = at(s->o.p_grads, l->p[i].local, es);
        zoff_op_add_args add = {.out = dst, .a = dst, .b = at(s->o.scratch->recv, pos, es), .n = l->p[i].count,
                                .dt = s->o.dtype};
        ZOFF_TRY(ZOFF_LAUNCH(cs, ZOFF_OP_ADD, add));
        pos += l->p[i].count;
    }
    return zoff_event_record(g->grads->ev_comm, cs);
}

zoff_status zoff_s3_params_updated(zoff_s3 *s) {
    ZOFF_TRY(zoff_event_record(s->ev_tmp, s->o.compute));
    ZOFF_TRY(zoff_stream_wait_event(s->o.comm, s->ev_tmp));
    for (int g = 0; g < s->ngrp; g++) {
        s3_group *gr = &s->grp[g];
        if (gr->persistent) {
            ZOFF_TRY(gather(s, gr, gr->params));
        } else if (gr->params && gr->refs == 0) {
            ZOFF_TRY(drop(s, gr)); /* a stale gather */
        }
    }
    return ZOFF_OK;
}

void zoff_s3_get_stats(const zoff_s3 *s, zoff_s3_stats *out) { *out = s->st; }
