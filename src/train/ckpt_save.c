/* Saving training checkpoints (include/zoff/train.h): every array streams from the engine's
 * state straight into the .zckpt writer's piece buffers (zoff_ckpt_begin_entry /
 * append_space / append_done / end_entry: the CRC runs over each slice, the writer's aio
 * writes the full pieces; the file is the one zoff_ckpt_add would write), synchronously or,
 * with one rank, on a background writer thread while training goes on.
 *
 * With several ranks (or a partition not in model order) the fp32 master weights rank 0 stores
 * come from every rank a piece at a time (gather_piece: a collective over the same pieces in the
 * same order on every rank). State in an NVMe swap file streams the same way: zoff_engine_state_range
 * reads it through the swapper's own buffer (no whole-array copy anywhere). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "train/ckpt_internal.h"

size_t zoff_train_ckpt_piece_bytes(void) {
    /* tests: ZOFF_TEST_CKPT_PIECE_BYTES (a multiple of 4096) gives a small model many pieces */
    const char *t = getenv("ZOFF_TEST_CKPT_PIECE_BYTES");
    long long v = t ? atoll(t) : 0;
    return v >= 4096 && v % 4096 == 0 ? (size_t)v : (size_t)16 << 20;
}
size_t zoff_train_ckpt_load_bytes(void) { return 2 * zoff_train_ckpt_piece_bytes(); }
size_t zoff_train_ckpt_save_bytes(void) {
    size_t w = zoff_ckpt_writer_buffer_bytes(), l = zoff_train_ckpt_load_bytes();
    return w > l ? w : l;
}
size_t zoff_train_ckpt_gather_bytes(int world, int stage) {
    if (world <= 1) return 0;
    return stage >= 1 ? 2 * zoff_train_ckpt_piece_bytes() : 0;
}
size_t zoff_train_ckpt_data_bytes(const zoff_config *cfg, int64_t n) {
    const size_t per = zoff_placement_state_bytes_per_param(zoff_optimizer_state_arrays(cfg), zoff_checkpoint_state_dtype(cfg));
    return n > 0 && (size_t)n > SIZE_MAX / per ? SIZE_MAX : (size_t)(n > 0 ? n : 0) * per;
}
/* The entries write_entries and open_rank_file add, sized by the writer's layout rule
 * (zoff_ckpt_entry_span, zoff_ckpt_file_bytes); the blobs (partition JSON, meta, a config of
 * under 4 KiB) each take one 4 KiB block. */
size_t zoff_train_ckpt_bytes(const zoff_train_ckpt_size *in, const char **bound) {
    const zoff_config *cfg = in->cfg;
    const zoff_zero_config *z = &cfg->zero;
    const int world = in->world > 1 ? in->world : 1, arrays = zoff_engine_state_count(NULL); /* every optimizer's */
    const int64_t blob = zoff_ckpt_entry_span(1), es = (int64_t)zoff_dtype_size(zoff_checkpoint_state_dtype(cfg));
    const bool offload = z->offload_optimizer.device != ZOFF_OFFLOAD_NONE || z->cpu_offload;
    const bool pending = offload && z->delayed_param_update, shared = world > 1 && z->stage >= 1;
    const int nt = zoff_gpt2_num_tensors(in->shape->num_layers);
    zoff_tensor_info *t = calloc((size_t)(nt > 0 ? nt : 1), sizeof *t);
    zoff_gpt2_shape sh;
    if (bound) *bound = shared ? "at least" : pending ? "at most" : NULL;
    if (!t || zoff_gpt2_check_shape(in->shape, "checkpoint", &sh) != ZOFF_OK) {
        free(t);
        zoff_clear_error();
        if (bound) *bound = "at least";
        return zoff_train_ckpt_data_bytes(cfg, zoff_gpt2_count_params(in->shape));
    }
    const int64_t n = zoff_gpt2_tensor_table(&sh, t);
    int64_t spans = 0, total = 0;
    for (int i = 0; i < nt; i++) spans += zoff_ckpt_entry_span(t[i].numel * (int64_t)sizeof(float));
    free(t);
    /* the delayed update's device weights (a save while an update is pending: after its warm-up) */
    if (pending) spans += zoff_ckpt_entry_span(n * (int64_t)zoff_dtype_size(in->model_dtype));
    /* rank 0's state: all of it with one rank or a replica (stage 0); with several ranks in stage 1-3
     * at least its share (the others' files hold the rest, each aligned by itself: not counted) */
    const int64_t states = shared ? n * es : zoff_ckpt_entry_span(n * es);
    spans += (arrays - 1) * states + blob /* partition */ + blob /* meta */;
    spans += in->config_text && strlen(in->config_text) > 0 ? zoff_ckpt_entry_span((int64_t)strlen(in->config_text)) : blob;
    total = zoff_ckpt_file_bytes((size_t)(nt + pending + arrays - 1 + 3), spans);
    /* the other ranks: their state arrays (empty in stage 0), the partition blob */
    total += (int64_t)(world - 1) * zoff_ckpt_file_bytes((size_t)arrays, blob);
    if (in->step >= 0) total += (int64_t)zoff_ckpt_marker_bytes(in->step, world);
    return (size_t)total;
}

/* What a save copies from the engine into the writer's piece at a time (then checksummed in cache). */
static size_t slice_bytes(void) { return (size_t)256 << 10; }

/* One run of the model space held by one rank: model elements [model, model + count) are its
 * partition's elements [local, local + count). */
typedef struct owner_seg {
    int64_t model, count, local;
    int rank;
} owner_seg;

/* One save: what the main thread fixes at the step boundary, and what the writer needs. */
struct zoff_train_ckpt_job {
    char dir[4096], tag[32];
    zoff_engine *eng;
    const zoff_gpt2 *model;
    zoff_train_meta meta;
    char *config;         /* owned copy (NULL: none) */
    int rank, world, keep_last;
    int64_t n, pn;        /* num_params; this rank's partition */
    int64_t *runs;        /* this rank's partition runs */
    int nruns;
    bool replica;         /* stage 0, rank > 0: an empty partition */
    /* the master weights from the ranks a piece at a time (segs != NULL): every rank's runs in
     * model order; a piece in model order (rank 0) and the ranks' blocks packed (every rank) */
    zoff_comm *comm;
    owner_seg *segs;
    int nsegs;
    int64_t *gcount;      /* per rank: elements in the piece, their block's offset in gpack, a cursor */
    float *gpiece, *gpack;
    zoff_ckpt_writer *w;  /* background: opened (and the device weights written) by the caller */
    pthread_t thread;
    bool started;
    atomic_bool finished; /* the writer thread is done (zoff_train_ckpt_save_done) */
    bool snap;            /* background: the state is read through the engine's copy-on-update snapshot (until it ends) */
    bool snap_requested;  /* ... from the start (the caller's view: updates need not wait for the save) */
    zoff_engine_snapshot_stats snap_stats;
    zoff_status status;
    char msg[2048];
    double t0, seconds, cpu_seconds; /* wall time of the save; CPU time of the writer thread */
    /* tests only (ZOFF_TEST_CKPT_WRITER_PAUSE_MS): the background writer sleeps this long after
     * its first piece, so that a test can SIGKILL the process while a temp dir is half written */
    long pause_ms;
    size_t in_place; /* zoff_ckpt_writer_in_place of this rank's file */
};

static void job_free(zoff_train_ckpt_job *j) {
    if (!j) return;
    ZOFF_FREE_ALL(j->gpiece, j->gpack, j->segs, j->gcount, j->runs, j->config, j);
}

const char *zoff_train_ckpt_background_rule(const zoff_train_save_facts *f, char *buf, size_t cap) {
    /* the writer's thread reads host memory only (a device share is first copied there, on a stream of its own):
     * neither the engine's worker nor an NVMe swap file (whose passes the update runs) */
    const int64_t pn = f->partition_params;
    const double dev_pct = pn > 0 ? 100.0 * (double)(pn - f->host_params) / (double)pn : 0.0;
    char a[32], b[32];
    if (f->world > 1) snprintf(buf, cap, "this run has %d ranks", f->world);
    else if (f->nvme) snprintf(buf, cap, "the optimizer state is in NVMe swap files (offload_optimizer.device nvme)");
    else if (f->host_params == 0 && pn > 0) snprintf(buf, cap, "all of the optimizer state is on the device");
    else if (f->host_params != pn && f->snapshot_budget < 0)
        snprintf(buf, cap, "%.1f%% of the optimizer state is on the device (offload_optimizer.ratio below 1) and the "
                 "save takes no snapshot (--save-snapshot-memory off, or super_offload)", dev_pct);
    else if (f->host_params != pn && (size_t)f->snapshot_budget < f->device_copy)
        snprintf(buf, cap, "the copy of the device's %.1f%% of the optimizer state needs %s of host memory, the "
                 "snapshot may take %s (--save-snapshot-memory; auto: half the host memory available)", dev_pct,
                 zoff_format_bytes(f->device_copy, a, sizeof a), zoff_format_bytes((size_t)f->snapshot_budget, b, sizeof b));
    else return NULL;
    return buf;
}

const char *zoff_train_ckpt_background_blocker(const zoff_engine *eng, const zoff_comm *comm, int64_t snapshot_budget,
                                              char *buf, size_t cap) {
    zoff_engine_memory m;
    zoff_engine_memory_usage(eng, &m);
    const zoff_train_save_facts f = {.world = zoff_comm_size(comm), .nvme = m.nvme > 0, .host_params = m.host_params,
                                     .partition_params = zoff_engine_partition_numel(eng),
                                     .snapshot_budget = snapshot_budget,
                                     .device_copy = zoff_engine_snapshot_min_bytes(eng)};
    return zoff_train_ckpt_background_rule(&f, buf, cap);
}

bool zoff_train_ckpt_can_background(const zoff_engine *eng, const zoff_comm *comm, int64_t snapshot_budget) {
    char why[320];
    return zoff_train_ckpt_background_blocker(eng, comm, snapshot_budget, why, sizeof why) == NULL;
}

static int seg_cmp(const void *a, const void *b) {
    const owner_seg *x = a, *y = b;
    return x->model < y->model ? -1 : x->model > y->model;
}

/* Every rank's runs (collective), as owner segments in model order. */
static zoff_status owner_segments(zoff_train_ckpt_job *j) {
    const int W = j->world;
    int64_t mine = j->nruns, *counts = calloc((size_t)W, sizeof *counts), maxr = 0, total = 0;
    zoff_status s = counts ? ZOFF_OK : ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK && W > 1) s = zoff_comm_allgather_bytes(j->comm, &mine, counts, sizeof mine);
    if (s == ZOFF_OK && W == 1) counts[0] = mine;
    for (int r = 0; s == ZOFF_OK && r < W; r++) {
        maxr = counts[r] > maxr ? counts[r] : maxr;
        total += counts[r];
    }
    int64_t *runs = s == ZOFF_OK ? calloc((size_t)(2 * maxr * W + 2), sizeof *runs) : NULL, *all = NULL;
    if (s == ZOFF_OK && !(all = runs)) s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK && W > 1) {
        int64_t *pad = calloc((size_t)(2 * maxr + 2), sizeof *pad);
        if (!pad) s = ZOFF_ERR_NOMEM;
        if (pad) memcpy(pad, j->runs, (size_t)(2 * j->nruns) * sizeof *pad);
        if (s == ZOFF_OK) s = zoff_comm_allgather_bytes(j->comm, pad, all, (size_t)(2 * maxr) * sizeof *pad);
        free(pad);
    }
    if (s == ZOFF_OK && W == 1) memcpy(all, j->runs, (size_t)(2 * j->nruns) * sizeof *all);
    if (s == ZOFF_OK && !(j->segs = malloc((size_t)(total + 1) * sizeof *j->segs))) s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK && !(j->gcount = calloc(3 * (size_t)W, sizeof *j->gcount))) s = ZOFF_ERR_NOMEM;
    for (int r = 0; s == ZOFF_OK && r < W; r++)
        for (int64_t k = 0, local = 0; k < counts[r]; k++) {
            const int64_t *run = all + 2 * maxr * r + 2 * k;
            j->segs[j->nsegs++] = (owner_seg){.model = run[0], .count = run[1], .local = local, .rank = r};
            local += run[1];
        }
    if (s == ZOFF_OK) qsort(j->segs, (size_t)j->nsegs, sizeof *j->segs, seg_cmp);
    free(all);
    free(counts);
    return s;
}

/* Collective: model elements [lo, hi) of the master weights into j->gpiece on rank 0. Each rank
 * packs its elements of the piece (model order) at its block of gpack; the blocks are gathered
 * (allgatherv) and rank 0 puts them in model order. */
static zoff_status gather_piece(zoff_train_ckpt_job *j, int64_t lo, int64_t hi) {
    int64_t *counts = j->gcount, *displs = counts + j->world, *at = displs + j->world;
    memset(counts, 0, 3 * (size_t)j->world * sizeof *counts);
    for (int k = 0; k < j->nsegs; k++) {
        const owner_seg *g = &j->segs[k];
        int64_t a = g->model > lo ? g->model : lo, b = g->model + g->count < hi ? g->model + g->count : hi;
        if (a < b) counts[g->rank] += b - a;
    }
    for (int r = 1; r < j->world; r++) displs[r] = displs[r - 1] + counts[r - 1];
    for (int k = 0; k < j->nsegs; k++) { /* this rank's block */
        const owner_seg *g = &j->segs[k];
        int64_t a = g->model > lo ? g->model : lo, b = g->model + g->count < hi ? g->model + g->count : hi;
        if (a >= b || g->rank != j->rank) continue;
        ZOFF_TRY(zoff_engine_state_range(j->eng, 0, g->local + (a - g->model), b - a,
                                         j->gpack + displs[j->rank] + at[j->rank], true));
        at[j->rank] += b - a;
    }
    if (j->world > 1) ZOFF_TRY(zoff_comm_allgatherv(j->comm, NULL, j->gpack, counts, displs, ZOFF_F32));
    if (j->rank != 0) return ZOFF_OK;
    memset(at, 0, (size_t)j->world * sizeof *at);
    for (int k = 0; k < j->nsegs; k++) { /* model order */
        const owner_seg *g = &j->segs[k];
        int64_t a = g->model > lo ? g->model : lo, b = g->model + g->count < hi ? g->model + g->count : hi;
        if (a >= b) continue;
        memcpy(j->gpiece + (a - lo), j->gpack + displs[g->rank] + at[g->rank], (size_t)(b - a) * sizeof(float));
        at[g->rank] += b - a;
    }
    return ZOFF_OK;
}

/* Collective: whether every rank's status so far is ZOFF_OK (before each gather, so that a rank
 * that failed, e.g. rank 0's disk, stops the others instead of leaving them in a collective). */
static zoff_status all_ok(zoff_train_ckpt_job *j, zoff_status mine) {
    double bad = mine != ZOFF_OK;
    if (j->world > 1) ZOFF_TRY(zoff_comm_allreduce_f64(j->comm, &bad, 1, ZOFF_REDUCE_SUM));
    if (mine != ZOFF_OK) return mine;
    return bad > 0 ? zoff_error(ZOFF_ERR_IO, "another rank failed while the master weights were gathered (see its "
                                             "message)")
                   : ZOFF_OK;
}

/* The weights entries through gather_piece (every rank: the collectives; rank 0 writes). */
static zoff_status put_gathered_weights(zoff_train_ckpt_job *j, zoff_ckpt_writer *w) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(j->model, &nt);
    const int64_t piece = (int64_t)(zoff_train_ckpt_piece_bytes() / sizeof(float));
    zoff_status s = ZOFF_OK;
    for (int i = 0; i < nt; i++) {
        if (j->rank == 0) s = zoff_ckpt_begin_entry(w, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape);
        for (int64_t p = 0; p < t[i].numel; p += piece) {
            int64_t c = t[i].numel - p < piece ? t[i].numel - p : piece;
            ZOFF_TRY(all_ok(j, s));
            ZOFF_TRY(gather_piece(j, t[i].offset + p, t[i].offset + p + c));
            if (j->rank == 0) s = zoff_ckpt_append(w, j->gpiece, (size_t)c * sizeof(float));
        }
        if (j->rank == 0 && s == ZOFF_OK) s = zoff_ckpt_end_entry(w);
    }
    return all_ok(j, s);
}

/* Tests (pause_ms): once per job, in the writer's own entries. */
static void writer_pause(zoff_train_ckpt_job *j) {
    if (j->pause_ms <= 0) return;
    usleep((useconds_t)j->pause_ms * 1000);
    j->pause_ms = 0;
}

/* zoff_ckpt_append_external's release of a borrowed staging block. */
static void snapshot_return(void *eng, const void *data) { zoff_engine_snapshot_return(eng, data); }

/* Entry `name` = elements [off, off + count) of state array i, in the dtype the engine keeps it
 * (zoff_engine_state_dtype: bf16 m and v with bf16_optimizer_states, copied as they are), or with
 * i < 0 of the model's parameter buffer (the engine's dtype): straight from the engine into the
 * writer's piece buffer, a slice at a time (the writer checksums each slice while it is in
 * cache). Through a snapshot, where the file position is aligned and the snapshot lends its staged
 * copy there (zoff_engine_snapshot_borrow), the disk writes that copy as it is; the snapshot says how
 * far to read before asking again. */
static zoff_status put_array(zoff_train_ckpt_job *j, zoff_ckpt_writer *w, const char *name, int ndim,
                             const int64_t *shape, int i, int64_t off, int64_t count) {
    const zoff_dtype dt = i < 0 ? zoff_engine_dtype(j->eng) : zoff_engine_state_dtype(j->eng, i);
    const size_t es = zoff_dtype_size(dt), A = zoff_engine_snapshot_align();
    ZOFF_TRY(zoff_ckpt_begin_entry(w, name, dt, ndim, shape));
    const int64_t slice = (int64_t)(slice_bytes() / es);
    const bool borrow = j->snap && i >= 0 && A % es == 0;
    int64_t ask = 0; /* where to ask the snapshot for its copy next (the entry starts aligned in the file) */
    for (int64_t p = 0; p < count;) {
        if (borrow && p >= ask && (size_t)p * es % A != 0) { /* read up to the next aligned position first */
            ask = p + (int64_t)((A - (size_t)p * es % A) / es);
        } else if (borrow && p >= ask) {
            const void *staged = NULL;
            int64_t got = 0, until = 0;
            ZOFF_TRY(zoff_ckpt_reap_external(w)); /* finished writes give their copies back: they count against the
                                                     snapshot's lending */
            ZOFF_TRY(zoff_engine_snapshot_borrow(j->eng, i, off + p, count - p, dt, &staged, &got, &until));
            if (staged) { /* the disk reads it where it is, no copy */
                ZOFF_TRY(zoff_ckpt_append_external(w, staged, (size_t)got * es, snapshot_return, j->eng));
                p += got;
                ask = p;
                writer_pause(j);
                continue;
            }
            ask = p + until;
        }
        void *dst = NULL;
        size_t cap = 0;
        ZOFF_TRY(zoff_ckpt_append_space(w, &dst, &cap));
        int64_t c = (int64_t)(cap / es); /* > 0: pieces and entries are aligned, appends whole elements */
        if (c > slice) c = slice;
        if (c > count - p) c = count - p;
        if (borrow && ask > p && c > ask - p) c = ask - p;
        if (c <= 0) return zoff_error(ZOFF_ERR_INTERNAL, "checkpoint entry '%s': no room for an element", name);
        if (i < 0) ZOFF_TRY(zoff_engine_device_weights(j->eng, off + p, c, dst, true));
        else ZOFF_TRY(j->snap ? zoff_engine_snapshot_read_as(j->eng, i, off + p, c, dt, dst)
                              : zoff_engine_state_range_as(j->eng, i, off + p, c, dt, dst, true));
        ZOFF_TRY(zoff_ckpt_append_done(w, (size_t)c * es));
        if (i >= 0) writer_pause(j);
        p += c;
    }
    return zoff_ckpt_end_entry(w);
}

/* This rank's file: weights (rank 0), optimizer state partition, partition blob, meta and config
 * (rank 0). */
static zoff_status write_entries(zoff_train_ckpt_job *j, zoff_ckpt_writer *w) {
    zoff_status s = ZOFF_OK;
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(j->model, &nt);
    if (j->segs) s = put_gathered_weights(j, w);
    for (int i = 0; !j->segs && j->rank == 0 && s == ZOFF_OK && i < nt; i++) /* Hugging Face names, zoff layout */
        s = put_array(j, w, t[i].name, t[i].ndim, t[i].shape, 0, t[i].offset, t[i].numel);
    for (int k = 1; s == ZOFF_OK && k < zoff_engine_state_count(j->eng); k++) {
        int64_t shape[1] = {j->replica ? 0 : j->pn};
        s = put_array(j, w, zoff_engine_state_name(j->eng, k), 1, shape, k, 0, shape[0]);
    }
    char *pj = s == ZOFF_OK ? zoff_ckpt_partition_json(j->rank, j->world, j->n, j->runs, (size_t)j->nruns) : NULL;
    if (s == ZOFF_OK) s = pj ? zoff_ckpt_add_blob(w, "partition", pj, strlen(pj))
                             : zoff_error(ZOFF_ERR_NOMEM, "cannot encode the checkpoint's partition");
    free(pj);
    if (s != ZOFF_OK || j->rank != 0) return s;
    char *txt = train_meta_to_text(&j->meta);
    s = txt ? zoff_ckpt_add_blob(w, "meta", txt, strlen(txt))
            : zoff_error(ZOFF_ERR_INTERNAL, "cannot encode checkpoint metadata");
    free(txt);
    if (s == ZOFF_OK && j->config) s = zoff_ckpt_add_blob(w, "config", j->config, strlen(j->config));
    return s;
}

static zoff_status rank_file_failed(zoff_train_ckpt_job *j, zoff_ckpt_writer *w, zoff_status s) {
    zoff_ckpt_abort(w);
    return zoff_error_context(s, "saving checkpoint step %lld under %s (rank %d of %d)", (long long)j->meta.step,
                              j->dir, j->rank, j->world);
}

/* Open this rank's file and write its first entry, the delayed update's device weights (rank 0,
 * meta.weights_pending: the model's parameter buffer, which the next backward changes), on the
 * calling thread. */
static zoff_status open_rank_file(zoff_train_ckpt_job *j, zoff_ckpt_writer **w) {
    zoff_ckpt_options opts = {.tmp_tag = j->tag[0] ? j->tag : NULL};
    *w = NULL;
    zoff_status s = zoff_ckpt_writer_open(j->dir, j->meta.step, j->rank, &opts, w);
    int64_t shape[1] = {j->n};
    if (s == ZOFF_OK && j->rank == 0 && j->meta.weights_pending > 0)
        s = put_array(j, *w, ZOFF_TRAIN_DEVICE_WEIGHTS, 1, shape, -1, 0, j->n);
    if (s != ZOFF_OK) {
        s = rank_file_failed(j, *w, s);
        *w = NULL;
    }
    return s;
}

/* The snapshot of a background save ends (once): the state has been read, or never will be. */
static void snap_end(zoff_train_ckpt_job *j) {
    if (!j->snap) return;
    zoff_engine_snapshot_finish(j->eng, &j->snap_stats);
    j->snap = false;
}

/* The rest of this rank's file, then commit (any thread); the snapshot ends once the state is in the writer's
 * pieces or in the disk writes it has issued from borrowed staging copies (which nothing writes after the end,
 * until the next save's begin, after this job is joined), before the commit's flush and fsync. */
static zoff_status finish_rank_file(zoff_train_ckpt_job *j, zoff_ckpt_writer *w) {
    zoff_status s = write_entries(j, w);
    j->in_place = (size_t)zoff_ckpt_writer_in_place(w);
    snap_end(j);
    return s != ZOFF_OK ? rank_file_failed(j, w, s) : zoff_ckpt_commit(w);
}

static zoff_status write_rank_file(zoff_train_ckpt_job *j) {
    zoff_ckpt_writer *w = NULL;
    zoff_status s = open_rank_file(j, &w);
    if (s != ZOFF_OK && j->segs) (void)all_ok(j, s); /* the others stop at their first check of the gather */
    return s != ZOFF_OK ? s : finish_rank_file(j, w);
}

/* The job, fixed at the step boundary (main thread). With several ranks the master weights are
 * gathered here: a collective every rank calls in the same order. */
static zoff_status job_create(const char *dir, zoff_engine *eng, const zoff_gpt2 *model, const zoff_train_meta *meta,
                              const char *config_json, zoff_comm *comm, const char *tag, zoff_train_ckpt_job **out) {
    *out = NULL;
    zoff_train_ckpt_job *j = calloc(1, sizeof *j);
    if (!j) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a checkpoint");
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    snprintf(j->tag, sizeof j->tag, "%s", tag ? tag : "");
    j->eng = eng;
    j->model = model;
    j->meta = *meta;
    j->rank = zoff_comm_rank(comm);
    j->world = zoff_comm_size(comm);
    j->n = zoff_gpt2_num_params(model);
    j->pn = zoff_engine_partition_numel(eng);
    zoff_status s = train_partition_runs(eng, &j->runs, &j->nruns);
    if (s == ZOFF_OK && config_json && !(j->config = strdup(config_json)))
        s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a checkpoint");
    bool local_is_model = j->nruns == 1 && j->runs[0] == 0 && j->runs[1] == j->n;
    double others = !local_is_model; /* stage 0: every rank holds the model, rank 0 streams its own */
    if (s == ZOFF_OK && j->world > 1) s = zoff_comm_allreduce_f64(comm, &others, 1, ZOFF_REDUCE_SUM);
    j->comm = comm;
    if (s == ZOFF_OK && others > 0) { /* collective: the ranks' runs, then pieces as written */
        const size_t pb = zoff_train_ckpt_piece_bytes();
        s = owner_segments(j);
        if (s == ZOFF_OK && !(j->gpack = zoff_aligned_alloc(64, pb, "checkpoint gather pieces"))) s = ZOFF_ERR_NOMEM;
        if (s == ZOFF_OK && j->rank == 0 && !(j->gpiece = zoff_aligned_alloc(64, pb, "checkpoint gather pieces")))
            s = ZOFF_ERR_NOMEM;
    }
    /* stage 0 replicates the state: rank 0 stores it, the other ranks an empty partition */
    j->replica = s == ZOFF_OK && j->rank > 0 && local_is_model;
    if (j->replica) j->nruns = 0;
    if (s != ZOFF_OK) {
        job_free(j);
        return zoff_error_context(s, "saving checkpoint step %lld", (long long)meta->step);
    }
    *out = j;
    return ZOFF_OK;
}

/* Several ranks: every rank's file is committed (or failed, status s) before rank 0 makes the
 * checkpoint visible; a failure anywhere discards it everywhere. */
static zoff_status finish_over_ranks(const char *dir, int64_t step, zoff_status s, zoff_comm *comm,
                                     const zoff_ckpt_options *opts) {
    int rank = zoff_comm_rank(comm);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", s == ZOFF_OK ? "" : zoff_last_error());
    double failed = s != ZOFF_OK, fin = 0;
    ZOFF_TRY(zoff_comm_allreduce_f64(comm, &failed, 1, ZOFF_REDUCE_SUM));
    if (failed > 0) {
        if (rank == 0) (void)zoff_ckpt_discard(dir, step, opts);
        if (s != ZOFF_OK) return zoff_error(s, "%s", msg);
        return zoff_error(ZOFF_ERR_IO, "saving checkpoint step %lld under %s: %.0f rank(s) failed to write their "
                                       "part (see their messages); the checkpoint was discarded",
                          (long long)step, dir, failed);
    }
    if (rank == 0) {
        s = zoff_ckpt_finalize(dir, step, zoff_comm_size(comm), opts);
        if (s != ZOFF_OK) snprintf(msg, sizeof msg, "%s", zoff_last_error());
        fin = s != ZOFF_OK;
    }
    ZOFF_TRY(zoff_comm_allreduce_f64(comm, &fin, 1, ZOFF_REDUCE_SUM));
    if (fin > 0)
        return rank == 0 ? zoff_error(s, "%s", msg)
                         : zoff_error(ZOFF_ERR_IO, "saving checkpoint step %lld under %s: rank 0 could not finalize "
                                                   "it (see its message)",
                                      (long long)step, dir);
    return ZOFF_OK;
}

zoff_status zoff_train_ckpt_save(const char *dir, zoff_engine *eng, const zoff_gpt2 *model,
                                 const zoff_train_meta *meta, const char *config_json, zoff_comm *comm) {
    int world = zoff_comm_size(comm);
    /* all ranks write into one temp dir: its tag is rank 0's pid */
    long long pid = (long long)getpid();
    zoff_status s = world > 1 ? zoff_comm_broadcast_bytes(comm, &pid, sizeof pid, 0) : ZOFF_OK;
    if (s != ZOFF_OK) return zoff_error_context(s, "saving checkpoint step %lld", (long long)meta->step);
    char tag[32];
    snprintf(tag, sizeof tag, "%lld", pid);
    zoff_ckpt_options opts = {.tmp_tag = tag};
    zoff_train_ckpt_job *j = NULL;
    s = job_create(dir, eng, model, meta, config_json, comm, tag, &j);
    if (s == ZOFF_OK) s = write_rank_file(j);
    job_free(j);
    if (world == 1) return s == ZOFF_OK ? zoff_ckpt_finalize(dir, meta->step, 1, &opts) : s;
    return finish_over_ranks(dir, meta->step, s, comm, &opts);
}

/* ------------------------------------------------------------------ the background writer */

/* The writer's nice value (this thread only; the writer's aio threads, which it creates,
 * inherit it): ZOFF_CKPT_WRITER_NICE (0..19, for measurements), default 0. A higher one lets the
 * training threads win the cores, but on a shared busy machine the other processes win them
 * too and the next update waits longer for the writer (docs/performance.md). */
static void writer_lower_priority(void) {
    const char *e = getenv("ZOFF_CKPT_WRITER_NICE");
    char *end = NULL;
    long nice = e && *e ? strtol(e, &end, 10) : 0;
    if (e && *e && (*end || nice < 0 || nice > 19)) {
        zoff_log(ZOFF_LOG_WARN, "ZOFF_CKPT_WRITER_NICE='%s' is not a nice value 0..19; the writer keeps its priority", e);
        nice = 0;
    }
    if (nice > 0 && setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), (int)nice) != 0)
        zoff_log(ZOFF_LOG_DEBUG, "checkpoint writer: cannot lower its priority: %s", strerror(errno));
}

static void *writer_main(void *arg) {
    zoff_train_ckpt_job *j = arg;
    pthread_setname_np(pthread_self(), "zoff-ckpt"); /* for top, perf */
    writer_lower_priority();
    zoff_ckpt_options opts = {.tmp_tag = j->tag};
    /* a device share's copy first: the next device update waits for it */
    zoff_status s = j->snap ? zoff_engine_snapshot_device_copy(j->eng) : ZOFF_OK;
    if (s == ZOFF_OK && !j->w) s = open_rank_file(j, &j->w);
    if (s == ZOFF_OK) s = finish_rank_file(j, j->w);
    snap_end(j); /* also when the file could not be opened */
    if (s == ZOFF_OK) s = zoff_ckpt_finalize(j->dir, j->meta.step, 1, &opts);
    if (s == ZOFF_OK && j->keep_last > 0) s = zoff_ckpt_prune(j->dir, j->keep_last);
    if (s != ZOFF_OK) snprintf(j->msg, sizeof j->msg, "%s", zoff_last_error()); /* thread-local: carried over */
    j->status = s;
    j->seconds = zoff_now() - j->t0;
    struct timespec cpu;
    j->cpu_seconds = clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0 ? (double)cpu.tv_sec + 1e-9 * (double)cpu.tv_nsec : 0;
    atomic_store(&j->finished, true);
    return NULL;
}

zoff_status zoff_train_ckpt_save_start(const char *dir, zoff_engine *eng, const zoff_gpt2 *model,
                                       const zoff_train_meta *meta, const char *config_json, int keep_last,
                                       int64_t snapshot_budget, zoff_train_ckpt_job **out) {
    *out = NULL;
    char why[320];
    if (zoff_train_ckpt_background_blocker(eng, NULL, snapshot_budget, why, sizeof why))
        return zoff_error(ZOFF_ERR_INVALID, "a background checkpoint is not possible here (%s): save synchronously",
                          why);
    char tag[32];
    snprintf(tag, sizeof tag, "%lld", (long long)getpid());
    zoff_train_ckpt_job *j = NULL;
    ZOFF_TRY(job_create(dir, eng, model, meta, config_json, NULL, tag, &j));
    j->keep_last = keep_last;
    const char *pause = getenv("ZOFF_TEST_CKPT_WRITER_PAUSE_MS");
    j->pause_ms = pause ? strtol(pause, NULL, 10) : 0;
    j->t0 = zoff_now();
    /* the device weights change in the next backward: written now (the writer opens the file otherwise) */
    zoff_status s = j->meta.weights_pending > 0 ? open_rank_file(j, &j->w) : ZOFF_OK;
    if (s == ZOFF_OK && snapshot_budget >= 0) s = zoff_engine_snapshot_begin(eng, (size_t)snapshot_budget);
    j->snap = j->snap_requested = s == ZOFF_OK && snapshot_budget >= 0;
    if (s != ZOFF_OK) {
        zoff_ckpt_abort(j->w);
        job_free(j);
        return s;
    }
    int rc = pthread_create(&j->thread, NULL, writer_main, j);
    if (rc != 0) {
        snap_end(j);
        zoff_ckpt_abort(j->w);
        job_free(j);
        return zoff_error(ZOFF_ERR_INTERNAL, "cannot start the checkpoint writer thread: %s", strerror(rc));
    }
    j->started = true;
    *out = j;
    return ZOFF_OK;
}

bool zoff_train_ckpt_save_done(zoff_train_ckpt_job *j) { return !j || atomic_load(&j->finished); }
bool zoff_train_ckpt_save_snapshots(const zoff_train_ckpt_job *j) { return j && j->snap_requested; }

zoff_status zoff_train_ckpt_save_wait(zoff_train_ckpt_job *j, zoff_train_ckpt_done *done) {
    if (!j) return ZOFF_OK;
    if (j->started) pthread_join(j->thread, NULL);
    zoff_status s = j->status;
    if (done) *done = (zoff_train_ckpt_done){.seconds = j->seconds, .cpu_seconds = j->cpu_seconds,
                                             .snapshot = j->snap_stats, .snapshot_used = j->snap_requested,
                                             .in_place = j->in_place};
    if (s != ZOFF_OK)
        s = zoff_error(s, "background checkpoint of step %lld under %s failed (the checkpoints saved before it are "
                          "intact): %s",
                       (long long)j->meta.step, j->dir, j->msg);
    job_free(j);
    return s;
}
