/* Gradients to the host (see engine_impl.h): the loss-gradient scale, the boundary
 * backward's bookkeeping, the grad-ready callback (reduction over ranks, the copies of
 * the host sub-groups' part on the gradient stream after the compute that produced
 * it, the marks of the delayed and speculative modes) and its timeline. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/engine_impl.h"

float zoff_engine_backward_scale(const zoff_engine *e) {
    int64_t acc = e->cfg->gradient_accumulation_steps > 0 ? e->cfg->gradient_accumulation_steps : 1;
    /* with N ranks each rank's gradient is pre-divided by N, so that their sum is the
     * mean: the reduced gradients have the one-rank magnitude (same fp16 overflow) */
    return (float)(e->ls.scale / ((double)acc * (double)e->world));
}

void zoff_engine_begin_backward(zoff_engine *e, bool is_boundary) {
    e->boundary = is_boundary;
    /* this backward writes the host gradient buffer: the boundary's, or every one when the
     * buckets carry the accumulation's sum there */
    const bool fills = is_boundary || e->bk_acc;
    if (fills && e->pipelined && !e->weights_pending) {
        /* the pipelined job reads the gradient buffer this backward fills: done by now
         * (the forward waited for its last group); its status goes to the next step */
        pthread_mutex_lock(&e->mu);
        while (e->job_pending) pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    }
    e->sp_pending = false;
    if (fills && e->hb.weights_in_grads && e->d2h &&
        zoff_stream_wait_event(e->d2h, e->ev_weights_done) != ZOFF_OK)
        /* One buffer carries the gradients in and the weights out: the copies of this backward's
         * gradients start after the last pushes of weights from it (the event recorded after
         * them, by whoever pushed last: the step, the pipelined job, the delayed update's
         * apply_pending_weights, sync_params). Implied already (the forward waited for those
         * weights before this backward's grad-ready events); this makes it explicit. */
        zoff_eng_note_async(e, ZOFF_ERR_INTERNAL, "ordering the gradient copies after the weight pushes");
    if (e->bk_acc && zoff_bk_begin_backward(e) != ZOFF_OK)
        zoff_eng_note_async(e, ZOFF_ERR_INTERNAL, "gradient buckets: ordering the sums' return after their copies");
    if (is_boundary && e->spec && e->have_lr && !e->spec_running) {
        /* speculate: the next step's update, assuming no clipping and no overflow */
        e->landed = INT64_MAX; /* the worker is idle: no lock needed until the job starts */
        e->sp_landed = false;
        e->spec_t = e->sc.steps_taken + 1;
        e->spec_running = true;
        e->pipe_unreported = false; /* the last exact job's time is not reported: the step reports this one's */
        zoff_hr_start_job(e, e->spec_t, e->spec_lr, 1.0 / e->ls.scale, HU_SPEC);
    }
    e->nready = 0;
    if (is_boundary && e->timeline) {
        /* grow between backwards only: the gradient stream stamps entries while one runs
         * (the last step waited for all of them) */
        if (e->want_tl > e->cap_tl) {
            zoff_grad_event *n = realloc(e->tl, (size_t)e->want_tl * sizeof *n);
            if (n) {
                e->tl = n;
                e->cap_tl = e->want_tl;
            }
        }
        e->ntl = 0;
        e->t_bwd0 = zoff_now();
    }
}

/* Timeline stamps, run on the gradient stream (host functions). */
typedef struct tl_stamp {
    zoff_engine *e;
    int i, which;
} tl_stamp;
static void tl_stamp_fn(void *arg) {
    tl_stamp *t = arg;
    double now = zoff_now() - t->e->t_bwd0;
    zoff_grad_event *ev = &t->e->tl[t->i];
    if (t->which == 0) ev->t_reduce_start = now;
    else if (t->which == 1) ev->t_reduce_end = now;
    else ev->t_copy_end = now;
    free(t);
}
static void tl_mark(zoff_engine *e, int i, int which) {
    tl_stamp *t = malloc(sizeof *t);
    if (!t) return;
    *t = (tl_stamp){e, i, which};
    if (zoff_stream_host_fn(e->d2h, tl_stamp_fn, t) != ZOFF_OK) free(t);
}
/* A new timeline entry for a reported range (-1 when off or out of memory). */
static int tl_begin(zoff_engine *e, int64_t offset, int64_t count) {
    if (!e->timeline) return -1;
    if (e->ntl == e->cap_tl) { /* lost for this backward; room for the next one */
        e->want_tl = e->cap_tl ? 2 * e->cap_tl : 64;
        return -1;
    }
    int i = e->ntl++;
    e->tl[i] = (zoff_grad_event){.offset = offset, .count = count, .t_ready = zoff_now() - e->t_bwd0};
    return i;
}

int zoff_engine_grad_timeline(const zoff_engine *e, const zoff_grad_event **events) {
    *events = e->tl;
    return e->ntl;
}

static zoff_event *ready_event(zoff_engine *e) {
    if (e->nready == e->cap_ready) {
        int cap = e->cap_ready ? 2 * e->cap_ready : 16;
        zoff_event **ne = realloc(e->ev_ready, (size_t)cap * sizeof *ne);
        if (!ne) return NULL;
        e->ev_ready = ne;
        for (int i = e->cap_ready; i < cap; i++)
            if (zoff_event_create(e->dev, &e->ev_ready[i]) != ZOFF_OK) {
                e->cap_ready = i;
                return NULL;
            }
        e->cap_ready = cap;
    }
    return e->ev_ready[e->nready++];
}

/* Called by the model in stream order as [offset, offset+count) of the
 * gradient buffer becomes final. Copies the host sub-groups' part to the host
 * on the d2h stream, ordered after the compute work that produced it.
 * Failures here are sticky on the d2h stream's next synchronisation or noted
 * in the log; the step reports them. */
bool zoff_eng_sg_part(const zoff_engine *e, int i, int64_t offset, int64_t end, int64_t *lo, int64_t *hi) {
    const subgroup *g = &e->sg[i];
    *lo = offset > g->model ? offset : g->model; /* model space */
    *hi = end < g->model + g->count ? end : g->model + g->count;
    return *lo < *hi;
}

void *zoff_eng_host_grad_piece(const zoff_engine *e, int i, int buf, int64_t offset, int64_t end, int64_t *lo,
                               int64_t *hi) {
    const subgroup *g = &e->sg[i];
    if (!g->on_host || !zoff_eng_sg_part(e, i, offset, end, lo, hi)) return NULL;
    return (char *)e->h_grads[buf] + (size_t)(g->state_off + *lo - g->model) * e->esize;
}

/* The host sub-groups' part of e->grads [offset, end) (the engine's space: the
 * model's, or stage 3's local space) to the host, on the d2h stream. */
static void copy_host_grads(zoff_engine *e, int64_t offset, int64_t end, int ti) {
    for (int i = 0; i < e->nsg; i++) {
        int64_t lo, hi;
        void *dst = zoff_eng_host_grad_piece(e, i, e->gbuf, offset, end, &lo, &hi);
        if (!dst) continue;
        const void *src = zoff_bk_grad_ptr(e, lo); /* the model's buffer, or the group's bucket */
        if (!src) {
            zoff_eng_note_async(e, ZOFF_ERR_INTERNAL, "gradient buckets: a reported range is in no held bucket");
            return;
        }
        if (zoff_memcpy_async(e->d2h, dst, src, (size_t)(hi - lo) * e->esize, ZOFF_COPY_D2H) != ZOFF_OK)
            zoff_log(ZOFF_LOG_ERROR, "gradient copy failed: %s", zoff_last_error());
        if (ti >= 0) e->tl[ti].copy_bytes += (hi - lo) * (int64_t)e->esize;
    }
}

static void spec_mark(zoff_engine *e, int64_t offset, bool rows);

/* Stage 3, speculation: the lowest local offset from which every element of this rank's
 * partition lies at model offset >= offset (those landed once the model's [offset, end)
 * did: the backward reports ranges top down), for any order of the pieces. */
static int64_t s3_local_from(const zoff_dp_plan *p, int64_t offset) {
    int64_t from = 0;
    for (int k = 0; k < p->nown[p->rank]; k++) {
        const zoff_dp_piece *q = &p->pieces[p->own[p->rank][k]];
        if (q->model >= offset) continue;
        int64_t below = offset - q->model < q->count ? offset - q->model : q->count; /* elements below offset */
        if (q->local + below > from) from = q->local + below;
    }
    return from;
}

/* Stage 3: every micro-batch's group gradients are reduce-scattered into the
 * partition; at the boundary this rank's pieces then go to the host. */
static void s3_grad_ready(zoff_engine *e, zoff_stream *stream, int64_t offset, int64_t count) {
    int ti = e->boundary ? tl_begin(e, offset, count) : -1;
    if (ti >= 0) tl_mark(e, ti, 0);
    zoff_status s = zoff_s3_reduce(e->s3, stream, offset, count);
    if (s != ZOFF_OK) {
        zoff_eng_note_async(e, s, "stage 3 gradient reduction");
        return;
    }
    if (ti >= 0) tl_mark(e, ti, 1);
    if (e->boundary && e->n_host > 0) { /* this rank's pieces of the range, in its local space */
        const zoff_dp_plan *p = &e->plan;
        for (int k = 0; k < p->nown[p->rank]; k++) {
            const zoff_dp_piece *q = &p->pieces[p->own[p->rank][k]];
            int64_t x = q->model > offset ? q->model : offset;
            int64_t y = q->model + q->count < offset + count ? q->model + q->count : offset + count;
            if (x < y) copy_host_grads(e, q->local + (x - q->model), q->local + (y - q->model), ti);
        }
        if (e->spec_running) spec_mark(e, s3_local_from(p, offset), false);
    }
    if (ti >= 0) tl_mark(e, ti, 2);
}

/* Speculation: the worker learns, on the gradient stream after the copies just issued,
 * that the gradients from offset on (rows: the row-sparse report's early part) landed. */
static void spec_mark(zoff_engine *e, int64_t offset, bool rows) {
    zoff_hr_spec_land *l = malloc(sizeof *l);
    if (l) *l = (zoff_hr_spec_land){e, offset, rows};
    if (!l || zoff_stream_host_fn(e->d2h, zoff_hr_spec_land_fn, l) != ZOFF_OK) {
        free(l);
        zoff_eng_note_async(e, ZOFF_ERR_NOMEM, "speculative update: marking gradients landed");
    }
}

/* The d2h stream waits for what `stream` has issued so far (false: failed, logged). */
static bool d2h_after(zoff_engine *e, zoff_stream *stream) {
    zoff_event *ev = ready_event(e);
    if (!ev || zoff_event_record(ev, stream) != ZOFF_OK || zoff_stream_wait_event(e->d2h, ev) != ZOFF_OK) {
        zoff_log(ZOFF_LOG_ERROR, "gradient copy ordering failed: %s", zoff_last_error());
        return false;
    }
    return true;
}

void zoff_engine_grad_ready(void *engine, zoff_stream *stream, int64_t offset, int64_t count) {
    zoff_engine *e = engine;
    if (e->s3) {
        s3_grad_ready(e, stream, offset, count);
        return;
    }
    if (!e->boundary && e->bk_acc) { /* an earlier micro-batch: its buckets' sums to the host */
        if (!d2h_after(e, stream)) return;
        zoff_status s = e->world > 1 ? zoff_bk_reduce(e, offset, offset + count) : ZOFF_OK;
        if (s != ZOFF_OK) zoff_eng_note_async(e, s, "gradient reduction");
        else copy_host_grads(e, offset, offset + count, -1);
        return;
    }
    if (!e->boundary || (e->n_host == 0 && e->world == 1)) return;
    /* Delayed update: no wait for the worker here. This backward fills the host
     * gradient buffer the worker does not read (double-buffered); the job that read
     * it last (two steps ago) was waited for by the last step before it started the
     * worker's current job (apply_pending_weights). */
    if (e->g_updated && e->weights_pending && zoff_hr_dpu_released(e, stream, offset) != ZOFF_OK) {
        zoff_eng_note_async(e, ZOFF_ERR_INTERNAL, "delayed parameter update: pushing the new weights");
        return;
    }
    if (!d2h_after(e, stream)) return;
    int64_t end = offset + count;
    int ti = tl_begin(e, offset, count);
    if (ti >= 0) tl_mark(e, ti, 0);
    if (e->world > 1) { /* sum over ranks first (stage 2: only this rank's pieces come back) */
        zoff_status s = e->buckets ? zoff_bk_reduce(e, offset, end)
                                   : zoff_dp_reduce_grads(&e->plan, e->chan, e->d2h, e->grads, 0, e->dtype, offset,
                                                          end, e->scatter, &e->scratch, &e->layout);
        if (s != ZOFF_OK) {
            zoff_eng_note_async(e, s, "gradient reduction");
            return;
        }
    }
    if (ti >= 0) tl_mark(e, ti, 1);
    if (e->sp_pending) /* what the early row-sparse copy did not take */
        for (int k = 0; k < sp_npieces(e, true); k++) {
            int64_t a, b;
            if (sp_piece(e, true, k, offset, end, &a, &b)) copy_host_grads(e, a, b, ti);
        }
    else
        copy_host_grads(e, offset, end, ti);
    if (ti >= 0) tl_mark(e, ti, 2);
    if (e->spec_running) spec_mark(e, offset, false);
}

/* Speculation: at most this many runs of rows are left for the ordinary call after a
 * row-sparse report (the closest runs merged, their gaps updated late): each run is one
 * copy per sub-group it meets, in both calls. $ZOFF_TEST_SPEC_MAX_RUNS: fewer (tests). */
enum { SPEC_MAX_RUNS = 1024 };
static int64_t spec_max_runs(void) {
    const char *t = getenv("ZOFF_TEST_SPEC_MAX_RUNS");
    long v = t ? strtol(t, NULL, 10) : 0;
    return v >= 1 && v < SPEC_MAX_RUNS ? v : SPEC_MAX_RUNS;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The runs of consecutive rows as element ranges (e->sp_run), the smallest gaps between
 * them merged until at most spec_max_runs() are left. false: rows not ascending and
 * distinct within count / row_len rows, or out of memory (the report is then ignored). */
static bool spec_runs(zoff_engine *e, int64_t offset, int64_t count, int64_t row_len, const int64_t *rows,
                      int64_t nrows) {
    if (row_len <= 0 || count % row_len || nrows < 0 || nrows > count / row_len) return false;
    if (nrows > e->cap_sp_run) {
        int64_t *r = realloc(e->sp_run, 2 * (size_t)nrows * sizeof *r);
        if (r) e->sp_run = r;
        int64_t *g = r ? realloc(e->sp_gap, (size_t)nrows * sizeof *g) : NULL;
        if (g) e->sp_gap = g;
        if (!r || !g) return false;
        e->cap_sp_run = (int)nrows;
    }
    int64_t ng = 0; /* gaps between runs */
    for (int64_t i = 0; i < nrows; i++) {
        if (rows[i] < (i ? rows[i - 1] + 1 : 0) || rows[i] >= count / row_len) return false;
        if (i && rows[i] > rows[i - 1] + 1) e->sp_gap[ng++] = rows[i] - rows[i - 1] - 1;
    }
    int64_t merge = 0, maxr = spec_max_runs(); /* gaps of at most `merge` rows are merged */
    if (ng + 1 > maxr) {
        qsort(e->sp_gap, (size_t)ng, sizeof *e->sp_gap, cmp_i64);
        merge = e->sp_gap[ng + 1 - maxr - 1];
    }
    int n = 0;
    for (int64_t i = 0; i < nrows; i++) {
        if (n && rows[i] - rows[i - 1] - 1 <= merge) {
            e->sp_run[2 * n - 1] = offset + (rows[i] + 1) * row_len;
            continue;
        }
        e->sp_run[2 * n] = offset + rows[i] * row_len;
        e->sp_run[2 * n + 1] = offset + (rows[i] + 1) * row_len;
        n++;
    }
    e->nsp_run = n;
    e->sp_lo = offset;
    e->sp_hi = offset + count;
    return true;
}

/* One rank only: the early copy goes to the host before the range is reduced over ranks. */
bool zoff_engine_uses_grad_rows(const zoff_engine *e) {
    return e && zoff_placement_grad_rows(e->spec, e->world, e->cfg->zero.stage);
}

void zoff_engine_grad_rows(void *engine, zoff_stream *stream, int64_t offset, int64_t count, int64_t row_len,
                           const int64_t *rows, int64_t nrows) {
    zoff_engine *e = engine;
    /* speculation's boundary backward only, one rank (zoff_engine_uses_grad_rows); once per backward */
    if (!zoff_engine_uses_grad_rows(e) || !e->boundary || !e->spec_running || e->sp_pending || e->n_host == 0) return;
    if (!spec_runs(e, offset, count, row_len, rows, nrows)) {
        zoff_log(ZOFF_LOG_DEBUG, "row-sparse gradient report ignored (rows out of order or out of memory)");
        return;
    }
    if (!d2h_after(e, stream)) return;
    int ti = tl_begin(e, offset, count);
    if (ti >= 0) tl_mark(e, ti, 0);
    if (ti >= 0) tl_mark(e, ti, 1);
    for (int k = 0; k < sp_npieces(e, false); k++) {
        int64_t a, b;
        if (sp_piece(e, false, k, offset, offset + count, &a, &b)) copy_host_grads(e, a, b, ti);
    }
    if (ti >= 0) tl_mark(e, ti, 2);
    e->sp_pending = true;
    spec_mark(e, offset, true);
}

zoff_status zoff_engine_zero_grad(zoff_engine *e) { return zoff_bk_zero_grad(e); }

