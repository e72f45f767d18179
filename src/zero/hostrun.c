/* The host optimizer runner (see engine_impl.h): the engine's worker thread and the
 * host update of every host sub-group, in the modes of the exact, pipelined, delayed
 * and speculative steps; the per-group pushes of the delayed update; speculation's
 * save, rollback and commit; the timeline of the last update. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zero/engine_impl.h"

void *zoff_hr_worker_main(void *arg) {
    zoff_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->job_pending && !e->quit) pthread_cond_wait(&e->cv, &e->mu);
        if (e->quit) break;
        int gbuf = e->job.gbuf, mode = e->job.mode;
        double lr = e->job.lr, gs = e->job.grad_scale;
        int64_t t = e->job.t;
        pthread_mutex_unlock(&e->mu);
        double t0 = zoff_now();
        e->spec_first = 0;
        zoff_status s = zoff_hr_update(e, gbuf, t, lr, gs, mode);
        if (mode == HU_SPEC && e->spec_first > 0) t0 = e->spec_first;
        if (s == ZOFF_OK && mode == HU_PIPE) s = zoff_event_record(e->ev_weights_done, e->h2d);
        double t1 = zoff_now();
        if (s != ZOFF_OK && mode == HU_PIPE) zoff_wready_fail(e->wr, s, zoff_last_error());
        pthread_mutex_lock(&e->mu);
        e->job_status = s;
        if (s != ZOFF_OK) snprintf(e->job_error, sizeof e->job_error, "%s", zoff_last_error());
        e->job_seconds = t1 - t0;
        e->span_step = t;
        e->span_seq = e->updates;
        e->span_t0 = t0;
        e->span_t1 = t1;
        e->job_pending = false;
        e->job_done = true;
        pthread_cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* Hand the host update of step t to the worker. */
void zoff_hr_start_job(zoff_engine *e, int64_t t, double lr, double grad_scale, int mode) {
    if (mode == HU_PIPE) zoff_wready_open(e->wr, e->group_need);
    pthread_mutex_lock(&e->mu);
    if (mode == HU_NO_PUSH && e->g_updated) {
        size_t ng = (size_t)zoff_wready_groups(e->wr);
        memset(e->g_updated, 0, ng * sizeof(bool));
        memset(e->g_released, 0, ng * sizeof(bool));
        memset(e->g_pushed, 0, ng * sizeof(bool));
    }
    e->job.gbuf = e->gbuf;
    e->job.lr = lr;
    e->job.grad_scale = grad_scale;
    e->job.t = t;
    e->job.mode = mode;
    e->job_pending = true;
    e->job_done = false;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* Wait for the worker's job (if any); returns its status. */
zoff_status zoff_hr_wait_job(zoff_engine *e) {
    if (!e->worker_started) return ZOFF_OK;
    pthread_mutex_lock(&e->mu);
    while (e->job_pending) pthread_cond_wait(&e->cv, &e->mu);
    zoff_status s = e->job_status;
    e->job_status = ZOFF_OK;
    if (s != ZOFF_OK) zoff_error(s, "%s: %s", e->dpu ? "delayed parameter update" : "host optimizer", e->job_error);
    pthread_mutex_unlock(&e->mu);
    return s;
}

/* Before anything reads the weights, the host state or the host gradients outside
 * the forward: the job is done and the compute stream is after every group's weights. */
/* Speculation, on the gradient stream after a range's copies: gradients >= offset landed. */
void zoff_hr_spec_land_fn(void *arg) {
    zoff_hr_spec_land *l = arg;
    zoff_engine *e = l->e;
    pthread_mutex_lock(&e->mu);
    if (l->rows) e->sp_landed = true;
    else if (l->offset < e->landed) e->landed = l->offset;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    free(l);
}

zoff_status zoff_hr_settle(zoff_engine *e) {
    if (e->spec_running) { /* a boundary backward without its step: let the job run out and undo it */
        ZOFF_TRY(zoff_stream_synchronize(e->d2h));
        pthread_mutex_lock(&e->mu);
        e->landed = 0;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        zoff_status s = zoff_hr_wait_job(e);
        e->spec_running = false;
        if (s == ZOFF_OK) s = zoff_hr_spec_rollback(e, false);
        e->rollbacks--; /* not a failed validation */
        ZOFF_TRY(s);
    }
    ZOFF_TRY(zoff_hr_wait_job(e));
    if (e->pipelined) ZOFF_TRY(zoff_wready_wait_all(e->wr, e->compute));
    return ZOFF_OK;
}

/* What update_piece does with speculation's backup: bk (zoff_optim_backup), and whether it
 * only copies (no update). */
typedef struct piece_bk {
    zoff_optim_backup bk;
    bool copy_only;
} piece_bk;

/* The host optimizer on [lo, hi) (model space) of host sub-group g, whose state starts at
 * master/hm/hv; the new 16-bit weights go to out16 (offload_param nvme) or the staging buffer;
 * with pb's backup (host state only), at the same offsets of bk_*. */
static zoff_status update_piece(zoff_engine *e, const subgroup *g, int gbuf, float *master, void *hm, void *hv,
                                int64_t lo, int64_t hi, void *out16, double weight_decay, double grad_scale,
                                piece_bk pb) {
    int64_t d = lo - g->offset, so = g->state_off + d;
    void *w16 = host_weights_out(e); /* with one buffer: over the gradients read here (in place, element by element) */
    void *p16 = out16 ? out16 : w16 ? (char *)w16 + (size_t)so * e->esize : NULL;
    zoff_optim_tensors tt = {.params = master + d,
                             .exp_avg = st_at(e, hm, d),
                             .exp_avg_sq = st_at(e, hv, d),
                             .state_dt = e->sdt,
                             .grads = (const char *)e->h_grads[gbuf] + (size_t)so * e->esize,
                             .grad_dt = e->dtype,
                             .params16 = e->dtype != ZOFF_F32 ? p16 : NULL,
                             .p16_dt = e->dtype,
                             .n = hi - lo,
                             .index_base = g->model + d, /* model index: rounding independent of ranks */
                             .backup = pb.bk,
                             .backup_params = pb.bk ? e->bk_master + so : NULL,
                             .backup_exp_avg = pb.bk ? st_at(e, e->bk_m, so) : NULL,
                             .backup_exp_avg_sq = pb.bk ? st_at(e, e->bk_v, so) : NULL};
    zoff_snap_hook hook = {e, so}; /* a background save's blocks this pass fills (zoff_eng_snap_protect's fuse) */
    if (pb.bk == ZOFF_BACKUP_NONE && zoff_eng_snap_pending(e)) {
        tt.before_write = zoff_eng_snap_before_write;
        tt.before_write_ctx = &hook;
    }
    if (pb.copy_only) return zoff_host_optimizer_copy_backup(e->hopt, &tt);
    return zoff_host_optimizer_update(e->hopt, &tt, weight_decay, grad_scale);
}

/* Delayed update, pipelined: group g's new weights to the device after backward t+1's
 * use of the old ones (mu held; called by whichever of the worker and grad_ready
 * comes second). */
static zoff_status dpu_push_group(zoff_engine *e, int g) {
    e->g_pushed[g] = true;
    ZOFF_TRY(zoff_stream_wait_event(e->h2d, e->ev_release[g]));
    for (int i = 0; i < e->nsg; i++)
        if (e->sg[i].on_host && e->sg_group[i] == g) ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
    return zoff_wready_arrive(e->wr, g, e->h2d);
}

/* Delayed update, pipelined: mark group g (in g_updated or g_released); the group is pushed once
 * it is both updated and released. */
static zoff_status dpu_mark(zoff_engine *e, bool *marks, int g) {
    zoff_status s = ZOFF_OK;
    pthread_mutex_lock(&e->mu);
    marks[g] = true;
    if (e->g_updated[g] && e->g_released[g] && !e->g_pushed[g]) s = dpu_push_group(e, g);
    pthread_mutex_unlock(&e->mu);
    return s;
}

/* Delayed update, pipelined: the job has written host sub-group i. */
static zoff_status dpu_updated(zoff_engine *e, int i) {
    int g = e->sg_group[i];
    if (--e->group_left[g] > 0) return ZOFF_OK;
    return dpu_mark(e, e->g_updated, g);
}

/* Delayed update, pipelined: the boundary backward reported group g's range final, so
 * it no longer reads g's weights (caller thread). */
zoff_status zoff_hr_dpu_released(zoff_engine *e, zoff_stream *stream, int64_t offset) {
    int g = zoff_wready_group_of(e->wr, offset);
    if (g < 0 || !e->group_need[g]) return ZOFF_OK;
    ZOFF_TRY(zoff_event_record(e->ev_release[g], stream));
    return dpu_mark(e, e->g_released, g);
}

/* The timeline's slot for span k of update seq, which updates sub-group g (NULL: none). */
static double *span_slot(zoff_engine *e, int64_t seq, int k, const subgroup *g) {
    if (!e->sg_span[seq % 2]) return NULL;
    e->sg_span_off[seq % 2][k] = g->model;
    return e->sg_span[seq % 2] + 2 * (size_t)k;
}

/* Speculation: wait for work, the next host sub-group (top down) whose gradients have
 * all landed, else one that meets the early part of a row-sparse report and is
 * untouched; *late: the former. -1 when every sub-group is done. */
static int spec_next(zoff_engine *e, bool *late) {
    int pick = -1;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        bool left = false;
        for (int i = e->nsg - 1; i >= 0 && pick < 0; i--) {
            const subgroup *g = &e->sg[i];
            if (!g->on_host || e->sg_state[i] == 2) continue;
            left = true;
            if (e->landed <= g->model) pick = i, *late = true;
        }
        for (int i = e->nsg - 1; i >= 0 && pick < 0 && e->sp_landed; i--) {
            const subgroup *g = &e->sg[i];
            if (g->on_host && e->sg_state[i] == 0 && g->model < e->sp_hi && g->model + g->count > e->sp_lo)
                pick = i, *late = false;
        }
        if (pick >= 0 || !left || e->quit) break;
        pthread_cond_wait(&e->cv, &e->mu);
    }
    bool quit = e->quit && pick < 0;
    pthread_mutex_unlock(&e->mu);
    return quit ? -2 : pick;
}

/* The host optimizer on [lo, hi) (model space, within host sub-group g; state in host
 * memory), in pieces with one weight-decay value each (elementwise: the same arithmetic
 * as one call over the sub-group); pb as update_piece's. */
static zoff_status update_span(zoff_engine *e, const subgroup *g, int gbuf, int64_t lo, int64_t hi,
                               double grad_scale, piece_bk pb) {
    const zoff_optimizer_config *oc = &e->cfg->optimizer;
    float *master = e->h_master + g->state_off;
    void *hm = st_at(e, e->h_m, g->state_off), *hv = st_at(e, e->h_v, g->state_off);
    for (int k = 0; k < e->nranges; k++) {
        const range *rg = &e->ranges[k];
        int64_t a = rg->offset > lo ? rg->offset : lo, b = rg->offset + rg->count < hi ? rg->offset + rg->count : hi;
        if (a < b)
            ZOFF_TRY(update_piece(e, g, gbuf, master, hm, hv, a, b, NULL, rg->decay ? oc->weight_decay : 0.0, grad_scale,
                                  pb));
    }
    return ZOFF_OK;
}

/* Speculation's backup copied (copy_only) on what sg_state says it holds of each host
 * sub-group, in direction bk: the whole sub-group, or the early part of a row-sparse report. */
static zoff_status spec_copy(zoff_engine *e, zoff_optim_backup bk, bool all) {
    piece_bk pb = {bk, true};
    for (int i = 0; i < e->nsg; i++) {
        const subgroup *g = &e->sg[i];
        int st = all ? 2 : e->sg_state[i];
        int64_t lo = g->offset, hi = g->offset + g->count, a, b;
        if (!g->on_host || st == 0) continue;
        if (st == 2) ZOFF_TRY(update_span(e, g, e->gbuf, lo, hi, 1.0, pb));
        for (int k = 0; st == 1 && k < sp_npieces(e, false); k++)
            if (sp_piece(e, false, k, lo, hi, &a, &b)) ZOFF_TRY(update_span(e, g, e->gbuf, a, b, 1.0, pb));
    }
    return ZOFF_OK;
}

zoff_status zoff_hr_spec_touch(zoff_engine *e) {
    if (!e->hopt) return ZOFF_OK;
    return spec_copy(e, ZOFF_BACKUP_SAVE, true);
}

/* The speculative update (HU_SPEC, update number seq): each host sub-group as soon as its
 * gradients have landed, top down; with a row-sparse report, first everything of its
 * early part, then the rest (the reported rows) once the ordinary report landed. Each
 * sub-group's state is saved before its first update; no push (after validation). */
static zoff_status spec_update(zoff_engine *e, int gbuf, double grad_scale, int64_t seq) {
    memset(e->sg_state, 0, (size_t)e->nsg);
    /* the arguments that differ from piece to piece, checked before any: a failed update would
     * leave a sub-group's backup half written where sg_state does not say so */
    if (!isfinite(grad_scale) || !isfinite(e->cfg->optimizer.weight_decay))
        return zoff_error(ZOFF_ERR_INVALID, "speculative update: grad_scale %g, weight_decay %g must be finite",
                          grad_scale, e->cfg->optimizer.weight_decay);
    const piece_bk save = {ZOFF_BACKUP_SAVE, false}; /* each element's first update this step */
    int nsp = 0;
    for (;;) {
        bool late = false;
        int i = spec_next(e, &late);
        if (i == -1) break;
        if (i < 0) return zoff_error(ZOFF_ERR_INTERNAL, "speculative update stopped: the engine is being destroyed");
        const subgroup *g = &e->sg[i];
        double *span = span_slot(e, seq, nsp++, g);
        if (e->sg_state[i] == 0) ZOFF_TRY(zoff_eng_snap_protect(e, g, false));
        if (e->spec_first == 0) e->spec_first = zoff_now(); /* the timeline: when updating began */
        if (span) span[0] = zoff_now();
        int64_t lo = g->offset, hi = g->offset + g->count;
        if (late && e->sg_state[i] == 0) {
            ZOFF_TRY(update_span(e, g, gbuf, lo, hi, grad_scale, save));
        } else { /* the early part of the row-sparse report, or the rest after it */
            for (int k = 0; k < sp_npieces(e, late); k++) {
                int64_t a, b;
                if (sp_piece(e, late, k, lo, hi, &a, &b)) ZOFF_TRY(update_span(e, g, gbuf, a, b, grad_scale, save));
            }
        }
        if (span) span[1] = zoff_now();
        e->sg_state[i] = late ? 2 : 1;
    }
    e->nspan[seq % 2] = nsp;
    return ZOFF_OK;
}

/* Speculation failed or was abandoned: the saved state back (redo, every sub-group
 * updated: by the exact update that follows, which reads it from the backup; else copied
 * now by the host optimizer's threads), and the host optimizer's step chain as if the
 * speculative step had never begun (a fresh one that begins the committed steps again:
 * its bias-correction products are those of the unbroken chain). */
zoff_status zoff_hr_spec_rollback(zoff_engine *e, bool redo) {
    for (int i = 0; i < e->nsg && redo; i++)
        if (e->sg[i].on_host && e->sg_state[i] != 2) redo = false;
    if (!redo) ZOFF_TRY(spec_copy(e, ZOFF_BACKUP_RESTORE, false));
    memset(e->sg_state, 0, (size_t)e->nsg); /* restored, or (redo) restored by the update */
    e->spec_redo = redo;
    zoff_host_optimizer_destroy(e->hopt);
    e->hopt = NULL;
    ZOFF_TRY(hopt_create(e));
    int64_t t0 = e->hopt_t0;
    e->hopt_t0 = 0;
    for (int64_t k = t0; k > 0 && k <= e->sc.steps_taken; k++) {
        ZOFF_TRY(zoff_eng_hopt_begin(e, k, e->spec_lr));
        if (e->hopt_t0 == 0) e->hopt_t0 = k;
    }
    e->rollbacks++;
    return ZOFF_OK;
}

/* Tests only (ZOFF_TEST_UPDATE_FAIL_STEP=t): the exact host update of step t fails at the first
 * sub-group whose blocks a background save's snapshot left to its pass, before writing any (test_engine: a background save's snapshot is then failed, not left
 * waiting for blocks the update never filled). */
static bool test_update_fails(int64_t t) {
    const char *v = getenv("ZOFF_TEST_UPDATE_FAIL_STEP");
    return v && strtoll(v, NULL, 10) == t;
}

/* The host part of a step: every host sub-group, each pushed to the device as soon
 * as it is done (HU_PUSH: last layers first, their gradients arrived first; HU_PIPE:
 * first layers first, what the next forward needs first arrives first; HU_NO_PUSH,
 * the delayed update: the boundary code pushes them). */
static zoff_status hr_update(zoff_engine *e, int gbuf, int64_t t, double lr, double grad_scale, int mode) {
    const zoff_optimizer_config *oc = &e->cfg->optimizer;
    const piece_bk pb = {e->spec_redo ? ZOFF_BACKUP_RESTORE : ZOFF_BACKUP_NONE, false}; /* after a rollback */
    ZOFF_TRY(zoff_eng_hopt_begin(e, t, lr));
    if (e->hopt_t0 == 0) e->hopt_t0 = t;
    e->wbuf = gbuf; /* one buffer: the new weights go out through the gradients' buffer */
    /* the previous pushes read the staging buffer (or, fp32, the master): they must be done */
    ZOFF_TRY(zoff_event_synchronize(e->ev_weights_done));
    if (e->pnvme) ZOFF_TRY(zoff_s3_begin_update(e->s3));
    if (e->swap) ZOFF_TRY(zoff_swapper_begin(e->swap, e->swap_order, e->nswap, ZOFF_SWAP_UPDATE, nvme_all_arrays(e)));
    bool early = mode == HU_NO_PUSH && e->g_updated; /* delayed update, pipelined */
    const bool test_fail = test_update_fails(t);
    int nsp = 0;
    int64_t seq = ++e->updates;
    if (mode == HU_SPEC) return spec_update(e, gbuf, grad_scale, seq);
    if (mode == HU_PIPE || early) zoff_eng_pipe_open(e);
    if (mode == HU_PIPE) ZOFF_TRY(zoff_eng_pipe_gather(e)); /* several ranks: leading groups with no part here */
    for (int q = 0; q < e->nsg; q++) {
        int i = mode != HU_PIPE ? e->nsg - 1 - q : e->pipe_order ? e->pipe_order[q] : q;
        const subgroup *g = &e->sg[i];
        if (!g->on_host) continue;
        /* this sub-group's state: in host memory, or read from the NVMe swap file (m and v of sdt) */
        float *master = e->h_master ? e->h_master + g->state_off : NULL;
        void *hm = st_at(e, e->h_m, g->state_off), *hv = st_at(e, e->h_v, g->state_off);
        if (e->swap) ZOFF_TRY(zoff_eng_nvme_next(e, i, &master, &hm, &hv));
        /* a background save has its old state first (the exact update's own pass copies most of it) */
        if (!e->swap) ZOFF_TRY(zoff_eng_snap_protect(e, g, pb.bk == ZOFF_BACKUP_NONE));
        if (test_fail && zoff_eng_snap_pending(e))
            return zoff_error(ZOFF_ERR_INTERNAL, "the host update of step %lld failed (ZOFF_TEST_UPDATE_FAIL_STEP)",
                              (long long)t);
        double *span = span_slot(e, seq, nsp++, g);
        if (span) span[0] = zoff_now();
        /* pieces with one weight-decay value; with offload_param nvme from the top down, each cut
         * where the swap file's runs end, every run written as soon as it is complete
         * (elementwise update: the same arithmetic as one call per piece) */
        for (int k = 0; k < e->nranges; k++) {
            const range *rg = &e->ranges[e->pnvme ? e->nranges - 1 - k : k];
            double wd = rg->decay ? oc->weight_decay : 0.0;
            int64_t lo = rg->offset > g->offset ? rg->offset : g->offset;
            int64_t hi = rg->offset + rg->count < g->offset + g->count ? rg->offset + rg->count : g->offset + g->count;
            if (!e->pnvme) {
                if (lo < hi) ZOFF_TRY(update_piece(e, g, gbuf, master, hm, hv, lo, hi, NULL, wd, grad_scale, pb));
                continue;
            }
            while (hi > lo) {
                int64_t a;
                void *out;
                ZOFF_TRY(zoff_s3_out_span(e->s3, lo, hi, &a, &out));
                ZOFF_TRY(update_piece(e, g, gbuf, master, hm, hv, a, hi, out, wd, grad_scale, pb));
                if (e->dtype == ZOFF_F32) memcpy(out, master + (a - g->offset), (size_t)(hi - a) * sizeof(float));
                ZOFF_TRY(zoff_s3_out_done(e->s3, a, hi));
                hi = a;
            }
        }
        if (span) span[1] = zoff_now();
        if (e->swap) ZOFF_TRY(zoff_eng_nvme_release(e, g, master));
        if (mode == HU_PUSH || mode == HU_PIPE) ZOFF_TRY(zoff_eng_push_host_subgroup(e, g)); /* HU_SPEC: after validation */
        if (mode == HU_PIPE) ZOFF_TRY(zoff_eng_pipe_pushed(e, i));
        if (early) ZOFF_TRY(dpu_updated(e, i));
    }
    if (mode == HU_PIPE) ZOFF_TRY(zoff_eng_pipe_gather(e)); /* several ranks: trailing groups */
    if (e->swap) ZOFF_TRY(zoff_swapper_end(e->swap));
    if (e->pnvme) ZOFF_TRY(zoff_s3_end_update(e->s3));
    e->nspan[seq % 2] = nsp;
    return ZOFF_OK;
}

/* After the host update that follows a rollback (s: its status, or the failure that kept
 * it from starting): done, or failed (the state as before the step, copied back whole:
 * the pieces already updated again from the backup too). */
zoff_status zoff_hr_spec_undo_redo(zoff_engine *e, zoff_status s) {
    if (!e->spec_redo) return ZOFF_OK;
    e->spec_redo = false;
    if (s == ZOFF_OK) return ZOFF_OK;
    return spec_copy(e, ZOFF_BACKUP_RESTORE, true);
}

zoff_status zoff_hr_update(zoff_engine *e, int gbuf, int64_t t, double lr, double grad_scale, int mode) {
    zoff_status s = zoff_eng_snap_pass_done(e, hr_update(e, gbuf, t, lr, grad_scale, mode));
    zoff_status r = zoff_hr_spec_undo_redo(e, s);
    return s != ZOFF_OK ? s : r;
}

/* Speculation validated: the new weights of every host sub-group to the device, group
 * by group in forward order (the backward is done: the step synchronised the compute
 * stream), each group marked arrived for the next forward (several ranks: after its
 * all-gather, issued here on the caller thread, in the same order on every rank). */
zoff_status zoff_hr_spec_commit(zoff_engine *e) {
    if (!e->pipelined) { /* stage 3: into the partition the gathers read (device, or host with offload_param) */
        for (int i = 0; i < e->nsg; i++)
            if (e->sg[i].on_host) ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
        ZOFF_TRY(zoff_event_record(e->ev_weights_done, e->h2d));
        return zoff_stream_wait_event(e->compute, e->ev_weights_done);
    }
    int ng = zoff_wready_groups(e->wr);
    zoff_eng_pipe_open(e);
    ZOFF_TRY(zoff_eng_pipe_gather(e));
    for (int g = 0; g < ng; g++)
        for (int i = 0; e->group_hsg[g] > 0 && i < e->nsg; i++)
            if (e->sg[i].on_host && e->sg_group[i] == g) {
                ZOFF_TRY(zoff_eng_push_host_subgroup(e, &e->sg[i]));
                ZOFF_TRY(zoff_eng_pipe_pushed(e, i));
            }
    ZOFF_TRY(zoff_eng_pipe_gather(e));
    return zoff_event_record(e->ev_weights_done, e->h2d);
}

/* The last finished host update's interval, for the step timeline. */
void zoff_hr_note_span(zoff_engine *e, int64_t t, double t0, double t1) {
    if (e->mu_init) pthread_mutex_lock(&e->mu);
    e->span_step = t;
    e->span_seq = e->updates;
    e->span_t0 = t0;
    e->span_t1 = t1;
    if (e->mu_init) pthread_mutex_unlock(&e->mu);
}

int64_t zoff_engine_last_host_update(const zoff_engine *e, double *start, double *end) {
    zoff_engine *m = (zoff_engine *)e; /* the lock only */
    if (m->mu_init) pthread_mutex_lock(&m->mu);
    int64_t t = e->span_step;
    *start = e->span_t0;
    *end = e->span_t1;
    if (m->mu_init) pthread_mutex_unlock(&m->mu);
    return t;
}

int zoff_engine_last_host_span_offsets(const zoff_engine *e, const int64_t **offsets) {
    const double *spans;
    int n = zoff_engine_last_host_spans(e, &spans);
    *offsets = spans ? e->sg_span_off[(spans == e->sg_span[1])] : NULL;
    return n;
}

int zoff_engine_last_host_spans(const zoff_engine *e, const double **spans) {
    zoff_engine *m = (zoff_engine *)e; /* the lock only */
    if (m->mu_init) pthread_mutex_lock(&m->mu);
    int64_t k = e->span_seq; /* the update running now, if any, writes the other buffer */
    if (m->mu_init) pthread_mutex_unlock(&m->mu);
    *spans = k > 0 ? e->sg_span[k % 2] : NULL;
    return k > 0 ? e->nspan[k % 2] : 0;
}

