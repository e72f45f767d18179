/* The engine's state, shared by its files (private to src/zero): engine.c (creation,
 * placement, weights to the device, the step, state), gradients.c (gradients to the
 * host during backward, the gradient timeline), hostrun.c (the host optimizer
 * runner: its worker thread, the host update, the pipelined / delayed / speculative
 * jobs), wready.c (weights-arrived events per group), placement.c, partition.c,
 * stage3.c, swapper.c. */
#ifndef ZOFF_ZERO_ENGINE_IMPL_H
#define ZOFF_ZERO_ENGINE_IMPL_H

#include <pthread.h>

#include "zero/partition.h"
#include "zero/stage3.h"
#include "zero/wready.h"
#include "zoff/comm.h"
#include "zoff/engine.h"
#include "zoff/loss_scale.h"
#include "zoff/optim.h"
#include "zoff/swapper.h"

typedef struct range { /* a run of tensors with the same weight-decay flag */
    int64_t offset, count;
    bool decay;
} range;

typedef struct subgroup {
    int64_t offset, count; /* flat parameter range (this rank's optimizer space: see e->n) */
    int64_t model;         /* model-space offset of element `offset` (== offset with one rank) */
    bool on_host;
    int64_t state_off;     /* offset into the host or device state arrays */
} subgroup;

struct zoff_engine {
    zoff_device *dev;
    zoff_stream *compute, *d2h, *h2d, *opt_stream;
    const zoff_config *cfg;
    zoff_dtype dtype;
    size_t esize;
    int64_t n;
    void *params, *grads; /* the model's device buffers */

    range *ranges;
    int nranges;
    subgroup *sg; /* in flat order */
    int nsg;

    /* device-side state (device sub-groups). For fp32 weights the model's
     * parameter buffer is the master copy. */
    int64_t n_dev;
    float *d_master, *d_m, *d_v;
    float *stats_dev; /* 2 floats: sum of squares, non-finite flag */

    /* host-side state (host sub-groups) */
    int64_t n_host;
    bool pinned;         /* offload_optimizer.pin_memory: the DMA buffers pinned (hb.pinned) */
    bool state_thp;      /* the host state's large arrays ask for transparent huge pages ($ZOFF_HUGEPAGES) */
    zoff_engine_startup startup; /* zoff_engine_startup_times */
    float *h_master;
    void *h_m, *h_v;     /* exp_avg, exp_avg_sq of sdt (zoff_optimizer_state_dtype) */
    zoff_dtype sdt;
    zoff_state_rounding sround; /* zoff_engine_options.state_rounding */
    size_t ssize;        /* zoff_dtype_size(sdt) */
    /* during creation only: the initial weights (init_params in this rank's order, or init_range) */
    const float *init_full;
    zoff_status (*init_range)(void *arg, int64_t lo, int64_t hi, float *dst);
    void *init_arg;
    zoff_host_buffers hb; /* the sizes of the host buffers (zoff_placement_host_buffers) */
    void *h_grads[2];   /* gradient partition, model dtype; [1] only with the delayed update. With
                           hb.weights_in_grads the update writes the new 16-bit weights over the
                           gradients it reads, and the pushes read them there (h_grads[wbuf]) */
    int wbuf;           /* which h_grads holds the last update's weights (set by the thread running it) */
    void *h_staging;    /* separate new-weight staging (hb.staging: speculation, stage 3 offload_param
                           cpu, fp32 with NVMe); NULL otherwise */
    zoff_host_optimizer *hopt;
    struct zoff_snap *snap; /* the background save's copy-on-update snapshot (snapshot.c; NULL: none yet) */
    /* NVMe offload (offload_optimizer.device "nvme"): the host sub-groups' fp32
     * master, m, v live in a swap file (h_master, h_m, h_v stay NULL), streamed
     * through the swapper's buffers; h_staging exists for fp32 weights too. */
    zoff_swapper *swap;
    int *swap_sg;    /* engine sub-group of each swap group (host sub-groups in flat order) */
    int *swap_order; /* the update order: swap groups from the top down */
    int nswap;
    int gbuf;           /* which h_grads receives the current backward */
    bool boundary;      /* the current backward streams gradients out */
    zoff_event *ev_grads_done, *ev_weights_done, *ev_dev_done, *ev_stats;
    zoff_event **ev_ready; /* per grad-ready call: compute -> d2h ordering (pool) */
    int nready, cap_ready;
    char describe[1536];

    zoff_loss_scaler ls;
    zoff_engine_scalars sc;

    /* delayed parameter update */
    bool dpu;
    int64_t dpu_warmup;
    pthread_t worker;
    bool worker_started, mu_init;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool job_pending, job_done, quit;
    struct {
        int gbuf;
        double lr, grad_scale;
        int64_t t;
        int mode; /* host_update's mode (HU_*) */
    } job;
    zoff_status job_status;
    char job_error[512];
    bool weights_pending; /* the worker finished a job whose weights are not on the device yet */
    double job_seconds;
    /* the last finished host update (guarded by mu once the worker runs): its step and wall interval */
    int64_t span_step;
    double span_t0, span_t1;
    double *sg_span[2];     /* per host sub-group (speculation: up to two): when its update began and ended,
                               update number k in [k % 2] */
    int64_t *sg_span_off[2]; /* ... the model offset of the sub-group of each span */
    int nspan[2];
    int64_t updates;        /* host updates begun (the thread running them only) */
    int64_t span_seq;       /* the update number of span_step's (guarded by mu once the worker runs) */

    /* pipelined exact step (options.weight_waits, stages 1-2, state in host memory, any
     * number of ranks; not the delayed update with several): the worker updates the host
     * sub-groups in forward order and pushes each at once; with several ranks, as soon as
     * a group's part of this rank is pushed (and every group before it), the worker issues
     * the group's all-gather on the collective stream, groups in forward order on every
     * rank; the model's forward waits per parameter group (zero/wready.h) */
    bool pipelined, pipe_unreported;
    zoff_wready *wr;
    int *sg_group;   /* layer group of each sub-group (pipelined) */
    int *group_left; /* host sub-groups of each group not yet pushed in this job */
    int *group_hsg;  /* host sub-groups of each group */
    bool *group_need; /* the round marks the group pending (several ranks: every group) */
    int *pipe_order; /* several ranks: host update order, by model offset (NULL: index order) */
    int pipe_next;   /* several ranks: the next group to all-gather in this round */
    zoff_event *ev_pushed; /* several ranks: the pushes so far (h2d), for the next gather */
    /* delayed update with the pipeline: job t's new weights of group g go to the device
     * as soon as the job has written them and backward t+1 no longer reads the old ones
     * (its grad-ready call for g); guarded by mu */
    bool *g_updated, *g_released, *g_pushed;
    zoff_event **ev_release; /* per group: backward t+1 is done with its weights (compute stream) */

    /* speculation-then-validation (offload_optimizer.super_offload; pipelined only): during
     * the boundary backward the worker updates each host sub-group as soon as its gradients
     * have landed, assuming no clipping and no overflow, saving its master, m and v into
     * bk_* in the same pass (ZOFF_BACKUP_SAVE); the step validates (norm, overflow, learning
     * rate) and keeps the result, or updates again correctly from the backup in one pass
     * (spec_redo: ZOFF_BACKUP_RESTORE), or (no update follows) copies the backup back */
    bool spec;
    bool spec_running;       /* a speculative job belongs to the current boundary (caller thread) */
    double spec_lr;          /* the learning rate it assumes: the last step's or zoff_engine_set_lr's */
    bool have_lr;
    int64_t spec_t;
    int64_t landed;          /* gradients of model offsets >= landed are on the host (guarded by mu) */
    float *bk_master;
    void *bk_m, *bk_v; /* of sdt */
    int64_t rollbacks;
    bool spec_redo;          /* rolled back: the next host update reads the state from bk_* (set by the
                                caller before the job starts, cleared by the update) */
    int64_t hopt_t0;         /* the first step the host optimizer began (0: none): replayed after a rollback */
    double spec_first;       /* worker: when the job's first sub-group update began */
    /* ... row-sparse (zoff_engine_grad_rows): the boundary backward reported [sp_lo, sp_hi)
     * final except the runs sp_run[0..nsp_run) (model space, (lo, hi) pairs, ascending,
     * disjoint); everything else of that range went to the host at once. Written by the
     * caller thread before the mark that sets sp_landed, read by the worker after it. */
    int64_t sp_lo, sp_hi;
    int64_t *sp_run, *sp_gap; /* sp_gap: scratch for merging runs */
    int nsp_run, cap_sp_run;
    bool sp_pending;          /* caller thread: this backward made the early copy */
    bool sp_landed;           /* the early copy is on the host (guarded by mu) */
    unsigned char *sg_state;  /* worker, per sub-group: 0 untouched, 1 outside the runs updated, 2 done
                                 (what bk_* holds: a pass updates all its pieces or none) */

    /* data parallel over world > 1 ranks (zero/partition.c). e->n is this rank's
     * optimizer space: its partition (stages 1-2) or everything (stage 0, one
     * rank); sub-groups cut it and `map` takes it to the model's flat space. */
    zoff_comm *comm;        /* the job's communicator (not owned); NULL = one rank */
    zoff_comm *chan;        /* dup of comm for the collectives on the d2h stream (owned) */
    int world, rank;
    int64_t n_model;        /* the model's parameters */
    bool replicated;        /* stage 0 over ranks: every rank updates every parameter */
    bool scatter;           /* stage 2: reduce-scatter the gradients */
    zoff_dp_plan plan;
    zoff_dp_layout layout;
    zoff_dp_scratch scratch;
    zoff_dp_piece *map;     /* optimizer space -> model space, in local order */
    int nmap;
    zoff_event *ev_gather;
    const zoff_tensor_info *tensors; /* the model's table (not owned) */
    int ntensors;
    /* ZeRO stage 3 (zero/stage3.c): the model has no flat buffers; e->params and
     * e->grads are this rank's partition of the weights and gradients (local
     * space, map = identity), the groups are gathered on use */
    zoff_s3 *s3;
    bool stage3;
    void *s3_params_dev, *s3_grads_dev; /* owned (the weights are on the host with offload_param) */
    void *h_spec;           /* speculation, stage 3, offload_param cpu: the host optimizer's new 16-bit weights
                               (the second half of h_staging), copied into the partition (h_staging's first half,
                               what the gathers read) by the push: at the step, or at a validated commit */
    bool no_push;           /* offload_param cpu: the host optimizer writes the partition weights in place */
    bool pnvme;             /* offload_param nvme: the partition weights live in the stage 3 swap file; the host
                               optimizer writes them there (zoff_s3_out_span), no h_staging */
    zoff_status async_status; /* a failure inside grad_ready, reported by the next step */
    char async_msg[512];
    /* layer groups (the runs of equal `layer` in the model's table): the gradient statistics
     * per group (one rank, not stage 3: 2 floats each in stats_dev), and with gradient buckets
     * (zero/buckets.c) where each group's gradients are while backward holds them */
    int ngroups;
    int64_t *goff, *gcnt;
    bool buckets;            /* e->grads is the device sub-groups' buffer (gd.device elements, or NULL) */
    void *grads_dev;         /* several ranks, ring buckets: this rank's device pieces' gradients (gd.compact,
                                state order), copied out of each group's bucket after its reduction */
    zoff_grad_device gd;
    void *gb_held, *gb_ring; /* the first group's bucket; the ring (gd.nslots x gd.slot) */
    zoff_event **ev_bucket;  /* [gd.nslots + 1] (the held bucket last): its last copies are done (d2h) */
    int *bucket_group;       /* [gd.nslots + 1]: the group in each bucket (-1: free) */
    int *group_bucket;       /* [ngroups]: the bucket group g is in (-1: none, or on the device) */
    int next_bucket;
    /* accumulation through the buckets (zoff_grad_buckets "always", gradient_accumulation_steps > 1):
     * the window's sum so far lives in h_grads[gbuf], the host part's only copy */
    bool bk_acc;              /* every backward's buckets go to the host, not only the boundary's */
    bool bk_sum_on_host;      /* a backward of this window has sent its buckets (zoff_bk_zero_grad clears it) */
    bool bk_upload;           /* this backward's buckets start from the host's sum (else from zero) */
    zoff_stream *bk_up;       /* the sums back to the device */
    zoff_event *ev_bk_copies; /* d2h: the previous backward's copies are done (begin_backward) */
    zoff_event **ev_bk_up;    /* [gd.nslots + 1]: the bucket's sum is on the device (bk_up) */
    zoff_event **ev_bk_free;  /* [gd.nslots + 1]: compute is done with the bucket (its release, after the statistics) */
    /* gradient stream timeline (options.timeline) */
    bool timeline;
    double t_bwd0;
    zoff_grad_event *tl;
    int ntl, cap_tl, want_tl;
};

/* The host optimizer's threads (offload_optimizer.cpuadam_cores_perc, else the default rule). */
static inline int hopt_threads(const zoff_engine *e) {
    return zoff_host_optimizer_threads_for_share(e->cfg->zero.offload_optimizer.cpuadam_cores_perc);
}
/* The host optimizer with the engine's state rounding (creation, and a speculation's rollback). */
static inline zoff_status hopt_create(zoff_engine *e) {
    zoff_host_optimizer_options o = {.threads = hopt_threads(e), .bf16_state_rounding = e->sround};
    return zoff_host_optimizer_create_ex(&e->cfg->optimizer, &o, &e->hopt);
}
static inline bool uses_m(const zoff_engine *e) { return e->cfg->optimizer.type != ZOFF_OPTIM_ADAGRAD; }
static inline bool uses_v(const zoff_engine *e) { return e->cfg->optimizer.type != ZOFF_OPTIM_LION; }


/* Where the host sub-groups' new 16-bit (fp32 with NVMe: fp32) weights are written and
 * pushed from (NULL: fp32 in host memory, the master is pushed; offload_param nvme). */
static inline void *host_weights_out(const zoff_engine *e) {
    if (e->h_spec) return e->h_spec;
    return e->h_staging ? e->h_staging : e->hb.weights_in_grads ? e->h_grads[e->wbuf] : NULL;
}

/* Element off of a host state array of sdt (m, v, their saved copies); NULL stays NULL. */
static inline void *st_at(const zoff_engine *e, void *base, int64_t off) {
    return base ? (char *)base + (size_t)off * e->ssize : NULL;
}

static inline int nvme_narrays(const zoff_engine *e) { return 1 + (int)uses_m(e) + (int)uses_v(e); }
static inline unsigned nvme_all_arrays(const zoff_engine *e) { return (1u << nvme_narrays(e)) - 1; }

/* Speculation, row-sparse (sp_*): piece k of the early part (late false, k in [0, nsp_run]:
 * the gaps between the runs within [sp_lo, sp_hi)) or of the rest (late true, k in
 * [0, nsp_run + 1]: before sp_lo, each run, from sp_hi on), clipped to [lo, hi) into
 * [*a, *b); false when that is empty. */
static inline int sp_npieces(const zoff_engine *e, bool late) { return e->nsp_run + 1 + (int)late; }
static inline bool sp_piece(const zoff_engine *e, bool late, int k, int64_t lo, int64_t hi, int64_t *a, int64_t *b) {
    const int64_t *r = e->sp_run;
    int64_t x, y;
    if (!late) {
        x = k == 0 ? e->sp_lo : r[2 * k - 1];
        y = k == e->nsp_run ? e->sp_hi : r[2 * k];
    } else {
        x = k == 0 ? INT64_MIN : k <= e->nsp_run ? r[2 * (k - 1)] : e->sp_hi;
        y = k == 0 ? e->sp_lo : k <= e->nsp_run ? r[2 * (k - 1) + 1] : INT64_MAX;
    }
    *a = x > lo ? x : lo;
    *b = y < hi ? y : hi;
    return *a < *b;
}

/* Host state array i (0 master, 1 m, 2 v; in use) from c elements at src (its own dtype) to h of
 * dtype hdt (its own: a copy; or fp32). */
void zoff_eng_state_to(const zoff_engine *e, int i, const void *src, int64_t c, zoff_dtype hdt, void *h);
/* The arguments of a state range in dtype dt (zoff_engine_state_range_as): the error, or ZOFF_OK. */
zoff_status zoff_eng_check_state_range(const zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt);
/* Host state array i at host state offset so (NULL: an array the optimizer does not use). */
void *zoff_eng_state_ptr(const zoff_engine *e, int i, int64_t so);
/* Device sub-group g's state array i on the device (fp32: the master is the model's weights when they are fp32). */
float *zoff_eng_device_state(const zoff_engine *e, int i, const subgroup *g);

/* ---- snapshot.c: the background save's copy-on-update snapshot (zoff_engine_snapshot_*) ---- */

/* Before host sub-group g is updated (the thread running the update): every block of its
 * state the writer has not read gets a staging slot (or, budget spent, is read by the writer
 * first). With fuse (an exact update follows, which writes every element of g once) the
 * blocks wholly inside g are filled by the update's own pass, through
 * zoff_eng_snap_before_write; the others are copied here. */
zoff_status zoff_eng_snap_protect(zoff_engine *e, const subgroup *g, bool fuse);
/* Blocks wait for an update's pass to fill them (the pass must then pass the hook). */
bool zoff_eng_snap_pending(const zoff_engine *e);
/* zoff_optim_tensors.before_write for an update of the host state from offset state_off on
 * (ctx: a zoff_snap_hook). */
typedef struct zoff_snap_hook {
    zoff_engine *e;
    int64_t state_off;
} zoff_snap_hook;
void zoff_eng_snap_before_write(void *ctx, int64_t lo, int64_t hi);
/* After a host update (s: its status): a block still waiting to be filled (a failed update)
 * fails the save's snapshot instead of handing the writer half a block; returns s, or an
 * error if s was ZOFF_OK. */
zoff_status zoff_eng_snap_pass_done(zoff_engine *e, zoff_status s);
void zoff_eng_snap_destroy(zoff_engine *e);
/* Before the device's share of the optimizer state is updated (device_update, the training thread): while a save's
 * copy of it has not been taken, take it here (the writer has not begun it) or wait until the writer has. */
zoff_status zoff_eng_snap_device_gate(zoff_engine *e);
/* The betas of optimizer step t (1-based): the config's, or the schedule's (OneCycle's momentum,
 * zoff_betas_at); an error naming the schedule when they leave [0, 1). */
zoff_status zoff_eng_step_betas(const zoff_engine *e, int64_t t, double *beta1, double *beta2);
/* The host optimizer's step t begun with learning rate lr and zoff_eng_step_betas's betas. */
zoff_status zoff_eng_hopt_begin(zoff_engine *e, int64_t t, double lr);
/* The staging arena (zoff_engine_snapshot_held bytes; NULL: none), for tests. */
const void *zoff_eng_snap_arena(const zoff_engine *e);

/* ---- hostrun.c: the host optimizer runner ---- */

/* zoff_hr_update's modes: push each sub-group as it is done, last layers first (the
 * exact step, synchronous); do not push (delayed update: pushed when backward t+1 is
 * done with a group, or at the boundary); forward order, push each at once and mark its
 * layer group arrived (pipelined); as its gradients land during backward, no push
 * (speculative: pushed after validation). */
enum { HU_PUSH = 0, HU_NO_PUSH = 1, HU_PIPE = 2, HU_SPEC = 3 };
/* The host part of step t over every host sub-group (see the modes). */
zoff_status zoff_hr_update(zoff_engine *e, int gbuf, int64_t t, double lr, double grad_scale, int mode);
/* The worker thread's loop (arg = the engine). */
void *zoff_hr_worker_main(void *arg);
/* Hand the host update of step t to the worker. */
void zoff_hr_start_job(zoff_engine *e, int64_t t, double lr, double grad_scale, int mode);
/* Wait for the worker's job (if any); returns its status. */
zoff_status zoff_hr_wait_job(zoff_engine *e);
/* The job done (a speculation without its step undone) and, pipelined, the compute
 * stream after every group's weights: before anything else reads weights or state. */
zoff_status zoff_hr_settle(zoff_engine *e);
/* The last finished host update's step and interval (caller-thread updates). */
void zoff_hr_note_span(zoff_engine *e, int64_t t, double t0, double t1);
/* Delayed update, pipelined: the boundary backward reported the range at offset final. */
zoff_status zoff_hr_dpu_released(zoff_engine *e, zoff_stream *stream, int64_t offset);
/* Speculation: a mark the gradient stream runs after a range's copies (arg: a
 * zoff_hr_spec_land, freed), the saved state back, the validated weights out. */
typedef struct zoff_hr_spec_land {
    zoff_engine *e;
    int64_t offset;
    bool rows; /* the early part of zoff_engine_grad_rows (sp_landed), not offset */
} zoff_hr_spec_land;
void zoff_hr_spec_land_fn(void *arg);
/* redo: the exact update follows at once (it restores from the backup in its pass);
 * else the backup is copied back now. */
zoff_status zoff_hr_spec_rollback(zoff_engine *e, bool redo);
/* The host optimizer's threads write the backup once over the update's pieces (its pages
 * first touched where the state's are; at set-up). */
zoff_status zoff_hr_spec_touch(zoff_engine *e);
/* After the host update that follows a rollback (s: its status, or the failure that kept
 * it from starting): done, or failed (the state as before the step, copied back whole). */
zoff_status zoff_hr_spec_undo_redo(zoff_engine *e, zoff_status s);
zoff_status zoff_hr_spec_commit(zoff_engine *e);

/* ---- buckets.c: layer groups, gradient buckets, per-group statistics ---- */
/* The layer groups, whether there are buckets (options.grads NULL, stages 1-2), and what
 * "auto" must add for them (zoff_placement_auto_engine_bytes). */
zoff_status zoff_bk_groups(zoff_engine *e, const zoff_engine_options *o, size_t *auto_fixed, size_t *auto_per_param);
/* After the placement: the statistics buffer and the buckets. */
zoff_status zoff_bk_alloc(zoff_engine *e);
void zoff_bk_destroy(zoff_engine *e);
/* The device address of model element `lo`'s gradient (its group acquired, with buckets). */
void *zoff_bk_grad_ptr(const zoff_engine *e, int64_t lo);
/* Several ranks: a held layer group's bucket [offset, end) summed over the ranks, on the gradient
 * stream, and at the boundary this rank's device pieces copied out (grads_dev) and the group's
 * statistics over this rank's pieces. */
zoff_status zoff_bk_reduce(zoff_engine *e, int64_t offset, int64_t end);
/* Where the device optimizer reads the gradient of model offset mo (state offset so): the device
 * buffer; several ranks with buckets: grads_dev, or the element's flat bucket. */
const void *zoff_bk_device_grads(const zoff_engine *e, int64_t mo, int64_t so);
/* Sum of squares and non-finite flag over every group (not stage 3; several ranks: this rank's
 * pieces, summed over the ranks by the caller): the groups not in a bucket are measured now,
 * on the compute stream; the bucketed ones were at their release (one rank) or reduction
 * (several). The per-group values are summed in group order, so the bits do not depend on
 * whether a group was bucketed. */
zoff_status zoff_bk_grad_stats(zoff_engine *e, double *sumsq, double *nonfinite);
/* The device sub-groups' gradients (zoff_engine_zero_grad); a new accumulation window. */
zoff_status zoff_bk_zero_grad(zoff_engine *e);
/* Accumulation through the buckets (e->bk_acc), at the start of each backward: whether its
 * buckets start from the host's sum, ordered after the previous backward's copies. */
zoff_status zoff_bk_begin_backward(zoff_engine *e);

/* ---- gradients.c ---- */
/* Sub-group i's part [*lo, *hi) of the range [offset, end) (the engine's space); false when they do
 * not meet. */
bool zoff_eng_sg_part(const zoff_engine *e, int i, int64_t offset, int64_t end, int64_t *lo, int64_t *hi);
/* Host sub-group i's part [*lo, *hi) of the range [offset, end) (the engine's space) and its
 * place in h_grads[buf]; NULL when they do not meet. */
void *zoff_eng_host_grad_piece(const zoff_engine *e, int i, int buf, int64_t offset, int64_t end, int64_t *lo,
                               int64_t *hi);

/* ---- engine.c, for the runner and the gradient path ---- */
/* A failure inside grad_ready (no status to return): kept for the next step. */
void zoff_eng_note_async(zoff_engine *e, zoff_status s, const char *what);
zoff_status zoff_eng_push_host_subgroup(zoff_engine *e, const subgroup *g);
/* Pipelined: a new round's pushes (group_left from group_hsg, no group gathered yet). */
void zoff_eng_pipe_open(zoff_engine *e);
/* Pipelined: host sub-group i is pushed. Its layer group arrives when it was the group's
 * last (one rank: the push's event); several ranks: every leading group that is complete
 * is all-gathered, in forward order, and arrives after its gather (zoff_eng_pipe_gather). */
zoff_status zoff_eng_pipe_pushed(zoff_engine *e, int i);
/* Several ranks: all-gather every group from pipe_next on whose part of this rank is
 * pushed, in forward order (the worker during a pipelined job, the caller at a commit). */
zoff_status zoff_eng_pipe_gather(zoff_engine *e);
zoff_status zoff_eng_nvme_next(zoff_engine *e, int i, float **master, void **m, void **v);
zoff_status zoff_eng_nvme_release(zoff_engine *e, const subgroup *g, const float *master);

#endif
