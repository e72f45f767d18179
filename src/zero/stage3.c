/* ZeRO stage 3 parameter management (see stage3.h). */
#define _GNU_SOURCE
#include "zero/stage3.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zoff/engine.h" /* zoff_placement_param_swap */
#include "zoff/resources.h"
#include "zoff/swapper.h"

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
    /* offload_param nvme */
    int run0, nrun;    /* its runs: s->grun[run0 .. run0 + nrun) */
    int64_t lcount;    /* elements of this rank's partition in the group */
    size_t rbytes;     /* its runs laid out in a buffer, each padded to ZOFF_AIO_ALIGN */
    char *res;         /* max_in_cpu: resident (never on disk); NULL otherwise */
    int hb;            /* host buffer holding (or reading) it, -1 none */
} s3_group;

/* NVMe: a maximal stretch of local space whose elements belong to one group. */
typedef struct s3_run {
    int64_t lo, count; /* local space */
    int grp;
    size_t boff;       /* offset in the group's buffer layout */
    int64_t foff;      /* file offset (-1: resident group) */
    size_t bytes;      /* count * es, padded to ZOFF_AIO_ALIGN */
    uint32_t *crcs;    /* one per aio block */
    bool written;      /* the file holds it (else it reads as zeros) */
    int64_t filled;    /* out_span/out_done progress */
    int wbuf;          /* host buffer it is being filled in, -1 none */
} s3_run;

enum { HB_IDLE = 0, HB_READ, HB_FILL, HB_WRITE };
typedef struct s3_hbuf {
    char *ptr;          /* ZOFF_AIO_ALIGN-aligned */
    void *alloc;
    int mode, grp, run; /* HB_READ: group grp; HB_FILL, HB_WRITE: run */
    uint64_t seq;
    zoff_aio_request *req;
    int nreq, cap_req;  /* requests submitted and not waited for */
    zoff_event *ev;     /* comm: the copies out of it are done */
    bool ev_set;
} s3_hbuf;

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
    /* offload_param nvme */
    bool nv, broken;
    zoff_aio *io;
    zoff_aio_file *f;
    char path[4200];
    char describe[4096];
    s3_run *runs; /* by local offset */
    int nruns;
    int *grun;    /* run indices grouped by group */
    s3_hbuf *hb;
    int nhb;
    void *res_alloc;
    uint64_t seq;
};

static void *at(void *base, int64_t elem, size_t es) { return (char *)base + (size_t)elem * es; }

static void buf_free(zoff_s3 *s, s3_buf *b) {
    if (!b) return;
    zoff_event_destroy(b->ev_used);
    zoff_event_destroy(b->ev_comm);
    zoff_device_free(s->o.dev, b->ptr);
    free(b);
}

static void nv_free_mem(zoff_s3 *s, void *p) {
    if (!p) return;
    if (s->o.nvme.pin_memory) zoff_host_free_pinned(s->o.dev, p);
    else zoff_aligned_free(p);
}

static void nv_destroy(zoff_s3 *s) {
    for (int i = 0; i < s->nhb; i++) {
        s3_hbuf *b = &s->hb[i];
        for (int k = 0; k < b->nreq; k++) (void)zoff_aio_wait(s->io, &b->req[k]);
        free(b->req);
        zoff_event_destroy(b->ev);
        nv_free_mem(s, b->alloc);
    }
    free(s->hb);
    if (s->f) {
        zoff_aio_file_close(s->f);
    }
    if (s->io) zoff_aio_destroy(s->io);
    for (int r = 0; r < s->nruns; r++) free(s->runs[r].crcs);
    free(s->runs);
    free(s->grun);
    nv_free_mem(s, s->res_alloc);
}

void zoff_s3_destroy(zoff_s3 *s) {
    if (!s) return;
    if (s->o.comm) (void)zoff_stream_synchronize(s->o.comm);
    if (s->o.compute) (void)zoff_stream_synchronize(s->o.compute);
    nv_destroy(s);
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

/* ------------------------------------------------------------------ offload_param nvme */

static size_t align_up(size_t x) { return (x + ZOFF_AIO_ALIGN - 1) / ZOFF_AIO_ALIGN * ZOFF_AIO_ALIGN; }

static zoff_status nv_alloc_mem(zoff_s3 *s, size_t bytes, const char *what, void **alloc, char **aligned) {
    bytes += ZOFF_AIO_ALIGN; /* aligned by hand: pinned memory's alignment is the backend's */
    if (s->o.nvme.pin_memory) {
        ZOFF_TRY(zoff_host_alloc_pinned(s->o.dev, bytes, what, alloc));
    } else {
        *alloc = zoff_aligned_alloc(ZOFF_AIO_ALIGN, bytes, what);
        if (!*alloc) return ZOFF_ERR_NOMEM;
    }
    memset(*alloc, 0, bytes); /* padding is written too: keep it defined */
    *aligned = (char *)align_up((size_t)(uintptr_t)*alloc);
    return ZOFF_OK;
}

/* The group holding model element m. */
static int group_of(const zoff_s3 *s, int64_t m) {
    int a = 0, b = s->ngrp - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (s->grp[mid].offset <= m) a = mid;
        else b = mid - 1;
    }
    return a;
}

/* The run holding local element x. */
static s3_run *run_of(zoff_s3 *s, int64_t x) {
    int a = 0, b = s->nruns - 1;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (s->runs[mid].lo <= x) a = mid;
        else b = mid - 1;
    }
    return &s->runs[a];
}

/* This rank's pieces as runs cut at the group boundaries, and each group's runs laid out in a
 * buffer (slots of zoff_placement_param_slot_bytes). */
static zoff_status nv_layout_runs(zoff_s3 *s) {
    const zoff_dp_plan *p = s->o.plan;
    int nown = p->nown[p->rank];
    s->runs = calloc((size_t)(nown + s->ngrp), sizeof *s->runs);
    s->grun = calloc((size_t)(nown + s->ngrp), sizeof *s->grun);
    if (!s->runs || !s->grun) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap file");
    for (int k = 0; k < nown; k++) { /* this rank's pieces in local order, cut at group boundaries */
        const zoff_dp_piece *q = &p->pieces[p->own[p->rank][k]];
        for (int64_t m = q->model; m < q->model + q->count;) {
            int g = group_of(s, m);
            int64_t gend = s->grp[g].offset + s->grp[g].count;
            int64_t end = gend < q->model + q->count ? gend : q->model + q->count;
            int64_t local = q->local + (m - q->model);
            s3_run *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
            if (last && last->grp == g && last->lo + last->count == local) {
                last->count += end - m;
            } else {
                s->runs[s->nruns++] = (s3_run){.lo = local, .count = end - m, .grp = g, .wbuf = -1};
            }
            m = end;
        }
    }
    /* per group: its runs and their layout in a buffer */
    for (int r = 0; r < s->nruns; r++) s->grp[s->runs[r].grp].nrun++;
    int at_ = 0;
    for (int g = 0; g < s->ngrp; g++) {
        s->grp[g].run0 = at_;
        at_ += s->grp[g].nrun;
        s->grp[g].nrun = 0;
        s->grp[g].hb = -1;
    }
    for (int r = 0; r < s->nruns; r++) {
        s3_group *g = &s->grp[s->runs[r].grp];
        s->runs[r].bytes = zoff_placement_param_slot_bytes(s->runs[r].count, s->es);
        s->runs[r].boff = g->rbytes;
        g->rbytes += s->runs[r].bytes;
        g->lcount += s->runs[r].count;
        s->grun[g->run0 + g->nrun++] = r;
    }
    return ZOFF_OK;
}

/* offload_param.buffer_size against the largest part of one parameter group on disk on ANY rank
 * (need: this rank's, 0 when none is on disk; g: its group). Collective: every rank refuses with the
 * same message, naming the minimum that works on all of them (each rank's own figure differs). */
static zoff_status nv_check_buffer_size(zoff_s3 *s, int64_t need, int g) {
    int64_t mine[3] = {need, need > 0 ? s->grp[g].offset : 0, need > 0 ? s->grp[g].count : 0};
    const int world = s->o.chan ? zoff_comm_size(s->o.chan) : 1;
    int64_t *all = malloc((size_t)world * sizeof mine);
    if (!all) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap file");
    zoff_status st = world > 1 ? zoff_comm_allgather_bytes(s->o.chan, mine, all, sizeof mine) : ZOFF_OK;
    if (world == 1) memcpy(all, mine, sizeof mine);
    int top = 0; /* the lowest rank with the largest part */
    for (int r = 1; st == ZOFF_OK && r < world; r++)
        if (all[3 * r] > all[3 * top]) top = r;
    if (st == ZOFF_OK && all[3 * top] > s->o.nvme.buffer_size) {
        if (world > 1)
            st = zoff_error(ZOFF_ERR_CONFIG,
                            "zero_optimization.offload_param.buffer_size is %lld elements, but rank %d's part of "
                            "parameter group [%lld, +%lld) has %lld, the largest on any of the %d ranks: set "
                            "buffer_size to at least %lld (or raise max_in_cpu to keep such groups in host memory)",
                            (long long)s->o.nvme.buffer_size, top, (long long)all[3 * top + 1],
                            (long long)all[3 * top + 2], (long long)all[3 * top], world, (long long)all[3 * top]);
        else
            st = zoff_error(ZOFF_ERR_CONFIG,
                            "zero_optimization.offload_param.buffer_size is %lld elements, but this rank's part of "
                            "parameter group [%lld, +%lld) has %lld: set buffer_size to at least %lld (or raise "
                            "max_in_cpu to keep such groups in host memory)",
                            (long long)s->o.nvme.buffer_size, (long long)all[1], (long long)all[2],
                            (long long)all[0], (long long)all[0]);
    }
    free(all);
    return st;
}

/* A note at start when the swap file's slot padding (zoff_placement_param_padding_exceeds) is more
 * than the parameters: a narrow model's layers are small, and each is a slot padded to 4 KiB, which
 * sub_group_size does not change; what keeps them off the disk is max_in_cpu. */
static void nv_padding_note(const zoff_s3 *s, const zoff_param_swap *sw) {
    if (!zoff_placement_param_padding_exceeds(sw, s->es)) return;
    char pb[32], db[32];
    zoff_log(ZOFF_LOG_INFO,
             "note: offload_param nvme: the swap file holds %s of parameters in %s: each of its %d slots (the "
             "model's layers, or this rank's pieces of them, whatever sub_group_size is) is padded to a multiple of %d bytes "
             "(O_DIRECT), which makes it slow to create and to save; a zero_optimization.offload_param.max_in_cpu of "
             "at least %lld elements (now %lld) keeps these parameters in host memory instead",
             zoff_format_bytes((size_t)sw->file_elems * s->es, db, sizeof db), zoff_format_bytes(sw->file_bytes, pb, sizeof pb),
             sw->file_slots, ZOFF_AIO_ALIGN, (long long)(sw->resident_elems + sw->file_elems),
             (long long)s->o.nvme.max_in_cpu);
}

static zoff_status nv_create(zoff_s3 *s) {
    const int64_t bs = s->o.nvme.aio.block_size > 0 ? s->o.nvme.aio.block_size : (1 << 20);
    ZOFF_TRY(nv_layout_runs(s));
    /* max_in_cpu: whole groups, in order, while they fit; the rest on disk (zoff_placement_param_swap,
     * the sizes zoff plan counts too) */
    int *gruns = calloc((size_t)s->ngrp, sizeof *gruns);
    int64_t *rcount = calloc((size_t)(s->nruns ? s->nruns : 1), sizeof *rcount);
    bool *resident = calloc((size_t)s->ngrp, sizeof *resident);
    if (!gruns || !rcount || !resident) {
        free(gruns), free(rcount), free(resident);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap file");
    }
    for (int g = 0, k = 0; g < s->ngrp; g++) {
        gruns[g] = s->grp[g].nrun;
        for (int j = 0; j < s->grp[g].nrun; j++) rcount[k++] = s->runs[s->grun[s->grp[g].run0 + j]].count;
    }
    zoff_param_swap sw;
    zoff_placement_param_swap(&(zoff_param_swap_in){.ngroups = s->ngrp, .group_runs = gruns, .run_count = rcount,
                                                    .es = s->es, .max_in_cpu = s->o.nvme.max_in_cpu},
                              resident, &sw);
    int max_req = 1;
    for (int g = 0; g < s->ngrp; g++) {
        if (resident[g]) s->grp[g].res = (char *)1; /* set below */
        else if (s->grp[g].lcount > 0) {
            int nr = (s->grp[g].nrun + ZOFF_AIO_MAX_SEGMENTS - 1) / ZOFF_AIO_MAX_SEGMENTS;
            if (nr > max_req) max_req = nr;
        }
    }
    free(gruns), free(rcount), free(resident);
    const int64_t res_elems = sw.resident_elems, biggest = sw.largest_elems;
    const size_t res_bytes = sw.resident_bytes, buf_bytes = sw.buffer_bytes;
    const int ondisk = sw.ondisk, biggest_g = sw.largest_group;
    ZOFF_TRY(nv_check_buffer_size(s, ondisk > 0 ? biggest : 0, biggest_g));
    if (ondisk > 0 && s->o.nvme.buffer_count < 1)
        return zoff_error(ZOFF_ERR_CONFIG, "zero_optimization.offload_param.buffer_count is %lld: it needs at least 1",
                          (long long)s->o.nvme.buffer_count);
    s->nhb = ondisk == 0 ? 0 : (int)(s->o.nvme.buffer_count < ondisk ? s->o.nvme.buffer_count : ondisk);
    char what[200];
    snprintf(what, sizeof what, "the parameter swap buffers (%d x %zu bytes) and %lld resident parameters "
             "(offload_param nvme)", s->nhb, buf_bytes, (long long)res_elems);
    zoff_host_request rq = {.what = what, .hint = "lower zero_optimization.offload_param.buffer_count or max_in_cpu"};
    size_t need = (size_t)s->nhb * (buf_bytes + ZOFF_AIO_ALIGN) + res_bytes;
    if (s->o.nvme.pin_memory) rq.pinned = need;
    else rq.pageable = need;
    ZOFF_TRY(zoff_host_memory_check(&rq));
    if (res_bytes > 0) {
        char *base;
        ZOFF_TRY(nv_alloc_mem(s, res_bytes, "resident parameters (offload_param.max_in_cpu)", &s->res_alloc, &base));
        for (int g = 0; g < s->ngrp; g++)
            if (s->grp[g].res) {
                s->grp[g].res = base;
                base += s->grp[g].rbytes;
            }
    }
    s->hb = calloc((size_t)(s->nhb ? s->nhb : 1), sizeof *s->hb);
    if (!s->hb) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap buffers");
    for (int i = 0; i < s->nhb; i++) {
        s3_hbuf *b = &s->hb[i];
        b->grp = b->run = -1;
        ZOFF_TRY(nv_alloc_mem(s, buf_bytes, "parameter swap buffer (offload_param nvme)", &b->alloc, &b->ptr));
        b->req = calloc((size_t)max_req, sizeof *b->req);
        if (!b->req) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap buffers");
        b->cap_req = max_req;
        ZOFF_TRY(zoff_event_create(s->o.dev, &b->ev));
    }
    /* the file: the runs of the groups on disk, group by group */
    int64_t fbytes = 0;
    for (int g = 0; g < s->ngrp; g++)
        for (int k = 0; k < s->grp[g].nrun; k++) {
            s3_run *r = &s->runs[s->grun[s->grp[g].run0 + k]];
            r->foff = -1;
            if (s->grp[g].res) continue;
            r->foff = fbytes;
            fbytes += (int64_t)r->bytes;
            r->crcs = calloc((size_t)(((int64_t)r->bytes + bs - 1) / bs) + 1, sizeof *r->crcs);
            if (!r->crcs) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the parameter swap checksums");
        }
    if ((size_t)fbytes != sw.file_bytes)
        return zoff_error(ZOFF_ERR_INTERNAL, "offload_param nvme: the swap file's slots add up to %lld bytes, "
                          "zoff_placement_param_swap says %zu", (long long)fbytes, sw.file_bytes);
    s->st.nvme_file_bytes = fbytes;
    nv_padding_note(s, &sw);
    s->st.nvme_buffers = s->nhb;
    s->st.nvme_buffer_bytes = (size_t)s->nhb * (buf_bytes + ZOFF_AIO_ALIGN); /* as allocated (nv_alloc_mem) */
    s->st.nvme_resident_bytes = res_bytes ? res_bytes + ZOFF_AIO_ALIGN : 0;
    s->st.nvme_resident_elems = res_elems;
    s->st.nvme_pinned = s->o.nvme.pin_memory;
    const char *dir = s->o.nvme.dir;
    ZOFF_TRY(zoff_make_work_dir(dir, "zero_optimization.offload_param.nvme_path"));
    static int counter;
    zoff_aio_options ao = s->o.nvme.aio; /* pinned buffers: registered with io_uring as fixed buffers */
    for (int i = 0; s->o.nvme.pin_memory && buf_bytes > 0 && i < s->nhb; i++)
        if (!zoff_aio_options_add_fixed(&ao, s->hb[i].ptr, buf_bytes)) break;
    ZOFF_TRY(zoff_aio_create(&ao, &s->io));
    ZOFF_TRY(zoff_swapper_open_file(s->io, dir, "param", "zero_optimization.offload_param.nvme_path", &counter,
                                    s->path, sizeof s->path, &s->f));
    if (fbytes > 0) ZOFF_TRY(zoff_aio_file_reserve(s->f, fbytes));
    s->st.nvme_path = s->path;
    char fb[32], bb[32], rb[32];
    snprintf(s->describe, sizeof s->describe, "%.2000s (%s, %.200s), %.400s; %d buffer%s of %s%s; %lld elements resident (%s)",
             s->path, zoff_format_bytes((size_t)fbytes, fb, sizeof fb),
             zoff_aio_file_direct(s->f) ? "O_DIRECT" : zoff_aio_file_direct_note(s->f), zoff_aio_describe(s->io),
             s->nhb, s->nhb == 1 ? "" : "s", zoff_format_bytes(buf_bytes, bb, sizeof bb),
             s->o.nvme.pin_memory ? " pinned" : "", (long long)res_elems, zoff_format_bytes(res_bytes, rb, sizeof rb));
    return ZOFF_OK;
}

/* Wait for a buffer's requests; the first failure is returned (the buffer is idle afterwards). */
static zoff_status hb_wait(zoff_s3 *s, s3_hbuf *b) {
    zoff_status st = ZOFF_OK;
    for (int k = 0; k < b->nreq; k++) {
        zoff_status r = zoff_aio_wait(s->io, &b->req[k]);
        if (r != ZOFF_OK && st == ZOFF_OK) st = r;
    }
    b->nreq = 0;
    return st;
}

/* A buffer to (re)use: an idle one whose copies are done; with `block`, any idle one
 * (waiting for its copies), else the read furthest ahead is dropped, else the
 * oldest write is waited for. -1: none now (without block). */
static zoff_status hb_take(zoff_s3 *s, bool block, int *out) {
    *out = -1;
    int idle = -1;
    for (int i = 0; i < s->nhb; i++) {
        s3_hbuf *b = &s->hb[i];
        if (b->mode != HB_IDLE) continue;
        if (!b->ev_set || zoff_event_query(b->ev)) {
            b->ev_set = false;
            *out = i;
            return ZOFF_OK;
        }
        if (idle < 0) idle = i;
    }
    if (!block) return ZOFF_OK;
    if (idle < 0) {
        int rd = -1, wr = -1;
        for (int i = 0; i < s->nhb; i++) {
            s3_hbuf *b = &s->hb[i];
            if (b->mode == HB_READ && (rd < 0 || b->seq > s->hb[rd].seq)) rd = i;
            if (b->mode == HB_WRITE && (wr < 0 || b->seq < s->hb[wr].seq)) wr = i;
        }
        if (wr >= 0) {
            s3_hbuf *b = &s->hb[wr];
            zoff_status st = hb_wait(s, b);
            b->mode = HB_IDLE;
            b->run = -1;
            if (st != ZOFF_OK) {
                s->broken = true;
                return zoff_error_context(st, "offload_param nvme: writing the new weights to %s", s->path);
            }
        } else if (rd >= 0) {
            s3_hbuf *b = &s->hb[rd];
            (void)hb_wait(s, b); /* read ahead for later: dropped (it is read again when needed) */
            s->grp[b->grp].hb = -1;
            b->mode = HB_IDLE;
            b->grp = -1;
        } else {
            return zoff_error(ZOFF_ERR_INTERNAL, "offload_param nvme: every parameter buffer is being filled "
                                                 "(the host optimizer's output is out of order)");
        }
        idle = rd >= 0 ? rd : wr;
    }
    s3_hbuf *b = &s->hb[idle];
    if (b->ev_set) ZOFF_TRY(zoff_event_synchronize(b->ev));
    b->ev_set = false;
    *out = idle;
    return ZOFF_OK;
}

/* Start reading group g's runs into a buffer (none free without block: nothing done). */
static zoff_status nv_read(zoff_s3 *s, s3_group *g, bool block) {
    if (g->res || g->nrun == 0 || g->hb >= 0) return ZOFF_OK;
    if (s->broken)
        return zoff_error(ZOFF_ERR_IO, "offload_param nvme: %s is half written after an earlier error; resume from "
                                       "a checkpoint", s->path);
    int i;
    ZOFF_TRY(hb_take(s, block, &i));
    if (i < 0) return ZOFF_OK;
    s3_hbuf *b = &s->hb[i];
    b->mode = HB_READ;
    b->grp = (int)(g - s->grp);
    b->seq = ++s->seq;
    b->nreq = 0;
    g->hb = i;
    zoff_aio_request *rq = NULL;
    for (int k = 0; k < g->nrun; k++) {
        s3_run *r = &s->runs[s->grun[g->run0 + k]];
        if (!r->written) { /* never written: zeros */
            memset(b->ptr + r->boff, 0, r->bytes);
            continue;
        }
        if (!rq || rq->nseg == ZOFF_AIO_MAX_SEGMENTS) {
            if (rq) {
                zoff_status st = zoff_aio_submit(s->io, rq);
                if (st != ZOFF_OK) return st;
                b->nreq++;
            }
            rq = &b->req[b->nreq];
            memset(rq, 0, sizeof *rq);
            *rq = (zoff_aio_request){.op = ZOFF_AIO_READ, .file = s->f, .flags = ZOFF_AIO_CRC_VERIFY};
        }
        rq->seg[rq->nseg++] = (zoff_aio_segment){.buf = b->ptr + r->boff, .offset = r->foff, .bytes = r->bytes,
                                                 .crcs = r->crcs};
        s->st.nvme_bytes_read += (int64_t)r->bytes;
    }
    if (rq) {
        ZOFF_TRY(zoff_aio_submit(s->io, rq));
        b->nreq++;
    }
    return ZOFF_OK;
}

/* Group g's runs are in host memory (read, or resident) when this returns. */
static zoff_status nv_ready(zoff_s3 *s, s3_group *g) {
    if (g->res || g->nrun == 0) return ZOFF_OK;
    ZOFF_TRY(nv_read(s, g, true));
    s3_hbuf *b = &s->hb[g->hb];
    zoff_status st = hb_wait(s, b);
    if (st != ZOFF_OK) {
        b->mode = HB_IDLE;
        b->grp = -1;
        g->hb = -1;
        return zoff_error_context(st, "offload_param nvme: reading the weights of parameter group [%lld, +%lld) "
                                      "from %s",
                                  (long long)g->offset, (long long)g->count, s->path);
    }
    return ZOFF_OK;
}

/* Where this rank's local element x of group g is in host memory (after nv_ready). */
static void *nv_src(zoff_s3 *s, s3_group *g, int64_t x) {
    const s3_run *r = run_of(s, x);
    char *base = g->res ? g->res : s->hb[g->hb].ptr;
    return base + r->boff + (size_t)(x - r->lo) * s->es;
}

/* After the gather's copies were queued on the comm stream: the buffer is free once they are done. */
static zoff_status nv_done(zoff_s3 *s, s3_group *g) {
    if (g->res || g->hb < 0) return ZOFF_OK;
    s3_hbuf *b = &s->hb[g->hb];
    ZOFF_TRY(zoff_event_record(b->ev, s->o.comm));
    b->ev_set = true;
    b->mode = HB_IDLE;
    b->grp = -1;
    g->hb = -1;
    return ZOFF_OK;
}

bool zoff_s3_nvme(const zoff_s3 *s) { return s->nv; }

zoff_status zoff_s3_begin_update(zoff_s3 *s) {
    if (!s->nv) return ZOFF_OK;
    /* gathers still copying out of the resident part or the buffers (restore, initial weights;
     * in a step the collective stream is drained already) */
    ZOFF_TRY(zoff_stream_synchronize(s->o.comm));
    for (int i = 0; i < s->nhb; i++) { /* reads ahead of stale weights: waited for and dropped */
        s3_hbuf *b = &s->hb[i];
        if (b->mode != HB_READ) continue;
        (void)hb_wait(s, b);
        s->grp[b->grp].hb = -1;
        b->mode = HB_IDLE;
        b->grp = -1;
    }
    for (int r = 0; r < s->nruns; r++) s->runs[r].filled = 0;
    return ZOFF_OK;
}

zoff_status zoff_s3_out_span(zoff_s3 *s, int64_t lo_bound, int64_t hi, int64_t *lo, void **ptr) {
    s3_run *r = run_of(s, hi - 1);
    int64_t a = lo_bound > r->lo ? lo_bound : r->lo;
    *lo = a;
    s3_group *g = &s->grp[r->grp];
    if (g->res) {
        *ptr = g->res + r->boff + (size_t)(a - r->lo) * s->es;
        return ZOFF_OK;
    }
    if (r->wbuf < 0) {
        if (s->broken)
            return zoff_error(ZOFF_ERR_IO, "offload_param nvme: %s is half written after an earlier error; resume "
                                           "from a checkpoint", s->path);
        int i;
        ZOFF_TRY(hb_take(s, true, &i));
        s3_hbuf *b = &s->hb[i];
        b->mode = HB_FILL;
        b->run = (int)(r - s->runs);
        b->seq = ++s->seq;
        r->wbuf = i;
    }
    *ptr = s->hb[r->wbuf].ptr + (size_t)(a - r->lo) * s->es;
    return ZOFF_OK;
}

zoff_status zoff_s3_out_done(zoff_s3 *s, int64_t lo, int64_t hi) {
    s3_run *r = run_of(s, lo);
    r->filled += hi - lo;
    if (r->filled < r->count || s->grp[r->grp].res) return ZOFF_OK;
    s3_hbuf *b = &s->hb[r->wbuf];
    size_t used = (size_t)r->count * s->es;
    memset(b->ptr + used, 0, r->bytes - used);
    zoff_aio_request *rq = &b->req[0];
    memset(rq, 0, sizeof *rq);
    *rq = (zoff_aio_request){.op = ZOFF_AIO_WRITE, .file = s->f, .flags = ZOFF_AIO_CRC_STORE, .nseg = 1,
                             .seg = {{.buf = b->ptr, .offset = r->foff, .bytes = r->bytes, .crcs = r->crcs}}};
    r->wbuf = -1;
    b->mode = HB_WRITE;
    r->written = true;
    s->st.nvme_bytes_written += (int64_t)r->bytes;
    zoff_status st = zoff_aio_submit(s->io, rq);
    if (st != ZOFF_OK) {
        b->mode = HB_IDLE;
        s->broken = true;
        return st;
    }
    b->nreq = 1;
    return ZOFF_OK;
}

zoff_status zoff_s3_end_update(zoff_s3 *s) {
    if (!s->nv) return ZOFF_OK;
    zoff_status st = ZOFF_OK;
    for (int i = 0; i < s->nhb; i++) {
        s3_hbuf *b = &s->hb[i];
        if (b->mode == HB_FILL && st == ZOFF_OK) {
            s->broken = true;
            st = zoff_error(ZOFF_ERR_INTERNAL, "offload_param nvme: local elements [%lld, +%lld) were not all "
                                               "written by the update",
                            (long long)s->runs[b->run].lo, (long long)s->runs[b->run].count);
        }
        if (b->mode == HB_WRITE) {
            zoff_status r = hb_wait(s, b);
            if (r != ZOFF_OK && st == ZOFF_OK) {
                s->broken = true;
                st = zoff_error_context(r, "offload_param nvme: writing the new weights to %s", s->path);
            }
        }
        if (b->mode == HB_FILL) s->runs[b->run].wbuf = -1;
        b->mode = HB_IDLE;
        b->run = b->grp = -1;
    }
    return st;
}

const char *zoff_s3_nvme_describe(const zoff_s3 *s) { return s->nv ? s->describe : ""; }

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
    s->nv = o->nvme.dir != NULL;
    if (st == ZOFF_OK && s->nv) st = nv_create(s);
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

static void *src_at(zoff_s3 *s, s3_group *g, int64_t local) {
    return s->nv ? nv_src(s, g, local) : at(s->o.p_params, local, s->es);
}

/* All-gather group g's weights into dst (device, g->count elements), on the comm stream. */
static zoff_status gather(zoff_s3 *s, s3_group *g, s3_buf *dst) {
    const zoff_dp_plan *p = s->o.plan;
    zoff_dp_layout *l = s->o.layout;
    zoff_stream *cs = s->o.comm;
    size_t es = s->es;
    zoff_copy_kind kind = s->o.params_on_host || s->nv ? ZOFF_COPY_H2D : ZOFF_COPY_D2D;
    if (s->nv) ZOFF_TRY(nv_ready(s, g)); /* this rank's runs of the group in host memory */
    ZOFF_TRY(zoff_stream_wait_event(cs, dst->ev_used)); /* the compute stream is done with its old contents */
    int64_t a = g->offset;
    zoff_dp_layout_of(p, a, a + g->count, l);
    if (l->identity) { /* every rank's block at its place in the group: in place */
        for (int i = 0; i < l->np; i++)
            if (l->p[i].owner == p->rank)
                ZOFF_TRY(zoff_memcpy_async(cs, at(dst->ptr, l->p[i].model - a, es), src_at(s, g, l->p[i].local),
                                           (size_t)l->p[i].count * es, kind));
        ZOFF_TRY(zoff_comm_allgatherv(s->o.chan, cs, dst->ptr, l->counts, l->starts, s->o.dtype));
    } else { /* round-robin: through the packing buffer */
        void *pack = s->o.scratch->pack;
        int64_t pos = l->starts[p->rank];
        for (int i = 0; i < l->np; i++)
            if (l->p[i].owner == p->rank) {
                ZOFF_TRY(zoff_memcpy_async(cs, at(pack, pos, es), src_at(s, g, l->p[i].local),
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
    if (s->nv) ZOFF_TRY(nv_done(s, g));
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
    if (s->nv) { /* NVMe: the reads of the next groups first, into the free buffers (no waiting) */
        int64_t rd = ahead;
        for (int k = s->pos; k < t->n; k++) {
            s3_group *g = &s->grp[t->g[k]];
            if (g->persistent || g->params) continue;
            if (rd + g->count > s->o.prefetch_elems) break;
            rd += g->count;
            if (g->res || g->nrun == 0 || g->hb >= 0) continue;
            ZOFF_TRY(nv_read(s, g, false));
            if (g->hb < 0) break; /* no free buffer */
            s->st.nvme_reads_ahead++;
        }
    }
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
