/* The data-parallel partition plan and its collectives (see partition.h). */
#define _GNU_SOURCE
#include "zero/partition.h"

#include <stdlib.h>
#include <string.h>

void zoff_dp_plan_free(zoff_dp_plan *p) {
    if (!p) return;
    if (p->own)
        for (int r = 0; r < p->world; r++) free(p->own[r]);
    free(p->own);
    free(p->nown);
    free(p->numel);
    free(p->pieces);
    memset(p, 0, sizeof *p);
}

static int cmp_model(const void *a, const void *b) {
    const zoff_dp_piece *x = a, *y = b;
    return x->model < y->model ? -1 : x->model > y->model;
}

static int cmp_owner_local(const void *a, const void *b) {
    const zoff_dp_piece *x = a, *y = b;
    if (x->owner != y->owner) return x->owner < y->owner ? -1 : 1;
    return x->local < y->local ? -1 : x->local > y->local;
}

zoff_status zoff_dp_plan_build(zoff_dp_plan *p, const zoff_tensor_info *t, int nt, int64_t n, int world, int rank,
                               bool round_robin) {
    memset(p, 0, sizeof *p);
    if (world < 1 || rank < 0 || rank >= world || n <= 0 || nt <= 0)
        return zoff_error(ZOFF_ERR_INVALID, "partition plan: rank %d of %d ranks, %lld parameters in %d tensors",
                          rank, world, (long long)n, nt);
    p->world = world;
    p->rank = rank;
    p->n = n;
    p->round_robin = round_robin && world > 1;
    /* engine order: tensor indices */
    int *order = malloc((size_t)nt * sizeof *order);
    p->numel = calloc((size_t)world, sizeof *p->numel);
    p->own = calloc((size_t)world, sizeof *p->own);
    p->nown = calloc((size_t)world, sizeof *p->nown);
    /* at most one piece per tensor plus one per partition boundary */
    p->pieces = malloc(((size_t)nt + (size_t)world + 1) * sizeof *p->pieces);
    if (!order || !p->numel || !p->own || !p->nown || !p->pieces) {
        free(order);
        zoff_dp_plan_free(p);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition plan (%d tensors)", nt);
    }
    int k = 0;
    if (p->round_robin) { /* deal whole tensors: arrival order (last first), to the lightest bucket */
        int *bucket = malloc((size_t)nt * sizeof *bucket);
        int64_t *load = calloc((size_t)world, sizeof *load);
        if (!bucket || !load) {
            free(bucket);
            free(load);
            free(order);
            zoff_dp_plan_free(p);
            return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition plan (%d tensors)", nt);
        }
        for (int i = nt - 1; i >= 0; i--) {
            int b = 0;
            for (int r = 1; r < world; r++)
                if (load[r] < load[b]) b = r;
            bucket[i] = b;
            load[b] += t[i].numel;
        }
        for (int b = 0; b < world; b++)
            for (int i = 0; i < nt; i++)
                if (bucket[i] == b) order[k++] = i;
        free(bucket);
        free(load);
    } else {
        for (int i = 0; i < nt; i++) order[k++] = i;
    }
    /* split the engine order at nearly equal, aligned boundaries */
    int64_t align = n >= (int64_t)ZOFF_DP_ALIGN * world * 4 ? ZOFF_DP_ALIGN : 1;
    int64_t prev = 0;
    int ti = 0;           /* position in order */
    int64_t tpos = 0;     /* elements of order[ti] already assigned */
    for (int r = 0; r < world; r++) {
        int64_t end = r == world - 1 ? n : (int64_t)((double)n * (double)(r + 1) / (double)world) / align * align;
        if (end < prev) end = prev;
        int64_t local = 0, need = end - prev;
        while (need > 0) {
            const zoff_tensor_info *ts = &t[order[ti]];
            int64_t take = ts->numel - tpos < need ? ts->numel - tpos : need;
            int64_t model = ts->offset + tpos;
            zoff_dp_piece *last = p->npieces ? &p->pieces[p->npieces - 1] : NULL;
            if (take > 0) {
                if (last && last->owner == r && last->model + last->count == model) {
                    last->count += take;
                } else {
                    p->pieces[p->npieces++] = (zoff_dp_piece){.model = model, .local = local, .count = take, .owner = r};
                }
            }
            local += take;
            need -= take;
            tpos += take;
            if (tpos == ts->numel) {
                ti++;
                tpos = 0;
            }
        }
        p->numel[r] = end - prev;
        prev = end;
    }
    free(order);
    qsort(p->pieces, (size_t)p->npieces, sizeof *p->pieces, cmp_model);
    /* own lists: indices in local order (pieces of one owner sorted by local) */
    for (int i = 0; i < p->npieces; i++) p->nown[p->pieces[i].owner]++;
    for (int r = 0; r < world; r++) {
        p->own[r] = malloc((size_t)(p->nown[r] > 0 ? p->nown[r] : 1) * sizeof(int));
        if (!p->own[r]) {
            zoff_dp_plan_free(p);
            return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition plan");
        }
        p->nown[r] = 0;
    }
    for (int i = 0; i < p->npieces; i++) {
        int r = p->pieces[i].owner;
        p->own[r][p->nown[r]++] = i;
    }
    for (int r = 0; r < world; r++) { /* insertion sort by local offset */
        int *o = p->own[r];
        for (int a = 1; a < p->nown[r]; a++) {
            int v = o[a], b = a;
            while (b > 0 && p->pieces[o[b - 1]].local > p->pieces[v].local) {
                o[b] = o[b - 1];
                b--;
            }
            o[b] = v;
        }
    }
    return ZOFF_OK;
}

zoff_status zoff_dp_layout_alloc(const zoff_dp_plan *p, zoff_dp_layout *l) {
    memset(l, 0, sizeof *l);
    l->p = malloc((size_t)(p->npieces > 0 ? p->npieces : 1) * sizeof *l->p);
    l->counts = calloc(2 * (size_t)p->world, sizeof *l->counts); /* the counts, then the starts */
    if (!l->p || !l->counts) {
        zoff_dp_layout_free(l);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a partition layout");
    }
    l->starts = l->counts + p->world;
    return ZOFF_OK;
}

void zoff_dp_layout_free(zoff_dp_layout *l) {
    if (!l) return;
    free(l->p);
    free(l->counts); /* and the starts */
    memset(l, 0, sizeof *l);
}

void zoff_dp_layout_of(const zoff_dp_plan *p, int64_t a, int64_t b, zoff_dp_layout *l) {
    l->np = 0;
    for (int r = 0; r < p->world; r++) l->counts[r] = 0;
    /* first piece ending after a */
    int lo = 0, hi = p->npieces;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (p->pieces[mid].model + p->pieces[mid].count <= a) lo = mid + 1;
        else hi = mid;
    }
    for (int i = lo; i < p->npieces && p->pieces[i].model < b; i++) {
        zoff_dp_piece q = p->pieces[i];
        int64_t s = q.model > a ? q.model : a, e = q.model + q.count < b ? q.model + q.count : b;
        if (s >= e) continue;
        l->p[l->np++] = (zoff_dp_piece){.model = s, .local = q.local + (s - q.model), .count = e - s, .owner = q.owner};
        l->counts[q.owner] += e - s;
    }
    qsort(l->p, (size_t)l->np, sizeof *l->p, cmp_owner_local);
    int64_t acc = 0;
    for (int r = 0; r < p->world; r++) {
        l->starts[r] = acc;
        acc += l->counts[r];
    }
    l->identity = true;
    for (int i = 0; i + 1 < l->np; i++)
        if (l->p[i].model + l->p[i].count != l->p[i + 1].model) l->identity = false;
}

int zoff_dp_own_find(const zoff_dp_plan *p, int64_t lo) {
    const int *o = p->own[p->rank];
    int a = 0, b = p->nown[p->rank];
    while (a < b) {
        int mid = (a + b) / 2;
        const zoff_dp_piece *q = &p->pieces[o[mid]];
        if (q->local + q->count <= lo) a = mid + 1;
        else b = mid;
    }
    return a;
}

static void local_copy(const zoff_dp_plan *p, const float *src_full, float *dst_full, const float *src_local,
                       float *dst_local, int64_t lo, int64_t hi) {
    const int *o = p->own[p->rank];
    for (int k = zoff_dp_own_find(p, lo); k < p->nown[p->rank]; k++) {
        const zoff_dp_piece *q = &p->pieces[o[k]];
        if (q->local >= hi) break;
        int64_t s = q->local > lo ? q->local : lo, e = q->local + q->count < hi ? q->local + q->count : hi;
        int64_t m = q->model + (s - q->local);
        if (dst_local) memcpy(dst_local + (s - lo), src_full + m, (size_t)(e - s) * sizeof(float));
        else memcpy(dst_full + m, src_local + (s - lo), (size_t)(e - s) * sizeof(float));
    }
}

void zoff_dp_gather_local(const zoff_dp_plan *p, const float *full, float *dst, int64_t lo, int64_t hi) {
    local_copy(p, full, NULL, NULL, dst, lo, hi);
}

void zoff_dp_scatter_local(const zoff_dp_plan *p, const float *src, float *full, int64_t lo, int64_t hi) {
    local_copy(p, NULL, full, src, NULL, lo, hi);
}

/* ------------------------------------------------------------------ collectives */

static void *at(void *base, int64_t elem, size_t es) { return (char *)base + (size_t)elem * es; }

/* A copy in stream order, or now for host buffers (s == NULL). */
static zoff_status copy(zoff_stream *s, void *dst, const void *src, size_t bytes) {
    if (s) return zoff_memcpy_async(s, dst, src, bytes, ZOFF_COPY_D2D);
    memcpy(dst, src, bytes);
    return ZOFF_OK;
}

zoff_status zoff_dp_reduce_grads(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *grads, int64_t g0,
                                 zoff_dtype dt, int64_t a, int64_t b, bool scatter, const zoff_dp_scratch *sc,
                                 zoff_dp_layout *l) {
    size_t es = zoff_dtype_size(dt);
    if (!scatter) return zoff_comm_allreduce(c, s, at(grads, a - g0, es), b - a, dt, ZOFF_REDUCE_SUM);
    int64_t chunk = sc->elems > 0 ? sc->elems : b - a;
    for (int64_t x = a; x < b; x += chunk) {
        int64_t y = x + chunk < b ? x + chunk : b;
        zoff_dp_layout_of(p, x, y, l);
        const void *send = at(grads, x - g0, es);
        if (!l->identity) { /* pack: every owner's pieces back to back */
            int64_t pos = 0;
            for (int i = 0; i < l->np; i++) {
                ZOFF_TRY(copy(s, at(sc->pack, pos, es), at(grads, l->p[i].model - g0, es),
                                           (size_t)l->p[i].count * es));
                pos += l->p[i].count;
            }
            send = sc->pack;
        }
        ZOFF_TRY(zoff_comm_reduce_scatter(c, s, send, sc->recv, l->counts, dt));
        /* this rank's pieces, in its local order, back to their model offsets */
        int64_t pos = 0;
        for (int i = 0; i < l->np; i++) {
            if (l->p[i].owner != p->rank) continue;
            ZOFF_TRY(copy(s, at(grads, l->p[i].model - g0, es), at(sc->recv, pos, es),
                                       (size_t)l->p[i].count * es));
            pos += l->p[i].count;
        }
    }
    return ZOFF_OK;
}

zoff_status zoff_dp_allgather_params(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *params,
                                     zoff_dtype dt, const zoff_dp_scratch *sc, zoff_dp_layout *l) {
    if (!p->round_robin) { /* one piece per rank, in rank order: in place */
        zoff_dp_layout_of(p, 0, p->n, l);
        if (l->identity) {
            int64_t *displs = l->starts; /* identity from 0: a rank's block starts at its model offset */
            return zoff_comm_allgatherv(c, s, params, l->counts, displs, dt);
        }
    }
    return zoff_dp_allgather_range(p, c, s, params, dt, sc, l, 0, p->n);
}

zoff_status zoff_dp_allgather_range(const zoff_dp_plan *p, zoff_comm *c, zoff_stream *s, void *params, zoff_dtype dt,
                                    const zoff_dp_scratch *sc, zoff_dp_layout *l, int64_t a, int64_t b) {
    size_t es = zoff_dtype_size(dt);
    int64_t chunk = sc->elems > 0 ? sc->elems : b - a;
    for (int64_t x = a; x < b; x += chunk) {
        int64_t y = x + chunk < b ? x + chunk : b;
        zoff_dp_layout_of(p, x, y, l);
        if (l->identity) {
            for (int r = 0; r < p->world; r++) l->starts[r] += x;
            ZOFF_TRY(zoff_comm_allgatherv(c, s, params, l->counts, l->starts, dt));
            continue;
        }
        int64_t pos = l->starts[p->rank];
        for (int i = 0; i < l->np; i++) {
            if (l->p[i].owner != p->rank) continue;
            ZOFF_TRY(copy(s, at(sc->pack, pos, es), at(params, l->p[i].model, es),
                                       (size_t)l->p[i].count * es));
            pos += l->p[i].count;
        }
        ZOFF_TRY(zoff_comm_allgatherv(c, s, sc->pack, l->counts, l->starts, dt));
        pos = 0;
        for (int i = 0; i < l->np; i++) {
            if (l->p[i].owner != p->rank)
                ZOFF_TRY(copy(s, at(params, l->p[i].model, es), at(sc->pack, pos, es),
                                           (size_t)l->p[i].count * es));
            pos += l->p[i].count;
        }
    }
    return ZOFF_OK;
}
