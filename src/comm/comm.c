/* zoff comm, common layer: the handle, launcher detection, argument checks,
 * the one-rank implementation, stream ordering of host-buffer collectives,
 * the sticky error, and the consistency check. See include/zoff/comm.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/half_internal.h"
#include "comm/comm_internal.h"

#define DEFAULT_TIMEOUT_S 300.0

/* ------------------------------------------------------------------ small helpers */

uint64_t zoff_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001B3ull;
    }
    return h;
}

void zoff_comm_widen(const void *src, zoff_dtype dt, float *dst, int64_t n) {
    const uint16_t *h = src;
    if (dt == ZOFF_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = zoff_half_bf16_to_f32(h[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = zoff_f16_to_f32(h[i]);
}

void zoff_comm_narrow(const float *src, void *dst, zoff_dtype dt, int64_t n) {
    uint16_t *h = dst;
    if (dt == ZOFF_BF16)
        for (int64_t i = 0; i < n; i++) h[i] = zoff_half_f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) h[i] = zoff_half_f32_to_f16(src[i]);
}

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (*end || x < INT_MIN || x > INT_MAX) return dflt;
    return (int)x;
}

void zoff_comm_detect_launch(zoff_launch_info *o) {
    o->rank = 0;
    o->size = 1;
    o->local_rank = 0;
    o->local_size = 1;
    o->launcher = "none";
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        o->launcher = "openmpi";
        o->size = env_int("OMPI_COMM_WORLD_SIZE", 1);
        o->rank = env_int("OMPI_COMM_WORLD_RANK", 0);
        o->local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", -1);
        o->local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", -1);
    } else if (getenv("PMI_SIZE")) { /* MPICH / Intel MPI (hydra) */
        o->launcher = "pmi";
        o->size = env_int("PMI_SIZE", 1);
        o->rank = env_int("PMI_RANK", 0);
        o->local_rank = env_int("MPI_LOCALRANKID", -1);
        o->local_size = env_int("MPI_LOCALNRANKS", -1);
    }
    if (o->size < 1) o->size = 1;
}

bool zoff_comm_have_mpi(void) {
#ifdef ZOFF_HAVE_MPI
    return true;
#else
    return false;
#endif
}

bool zoff_comm_have_nccl(void) {
#if defined(ZOFF_HAVE_NCCL) && defined(ZOFF_HAVE_MPI) && defined(ZOFF_HAVE_CUDA)
    return true;
#else
    return false;
#endif
}

#if !defined(ZOFF_HAVE_MPI)
zoff_status zoff_comm_mpi_init(int *argc, char ***argv, zoff_comm *c) {
    (void)argc, (void)argv, (void)c;
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "this zoff was built without MPI");
}
#endif
#if !(defined(ZOFF_HAVE_NCCL) && defined(ZOFF_HAVE_MPI) && defined(ZOFF_HAVE_CUDA))
zoff_status zoff_comm_nccl_attach(zoff_comm *c, zoff_device *dev) {
    (void)c, (void)dev;
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "this zoff was built without NCCL");
}
#endif

/* ------------------------------------------------------------------ handle */

/* $ZOFF_COMM_TIMEOUT into *seconds (unchanged when unset or empty); anything but a positive finite
 * number of seconds is an error naming the variable. */
static zoff_status env_timeout(double *seconds) {
    const char *t = getenv("ZOFF_COMM_TIMEOUT");
    if (!t || !*t) return ZOFF_OK;
    char *end = NULL;
    errno = 0;
    double v = strtod(t, &end);
    if (end == t || *end || errno || !(v > 0) || !isfinite(v))
        return zoff_error(ZOFF_ERR_INVALID,
                          "ZOFF_COMM_TIMEOUT='%s' is invalid; expected a positive number of seconds (how long a "
                          "collective may wait for the other ranks, default %.0f): fix or unset it, or give "
                          "zoff train --comm-timeout SECONDS",
                          t, DEFAULT_TIMEOUT_S);
    *seconds = v;
    return ZOFF_OK;
}

static zoff_comm *comm_alloc(void) {
    zoff_comm *c = calloc(1, sizeof *c);
    if (!c) {
        zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a communicator");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->rank = 0;
    c->size = 1;
    c->local_rank = 0;
    c->local_size = 1;
    c->timeout = DEFAULT_TIMEOUT_S;
    return c;
}

zoff_status zoff_comm_create_single(zoff_comm **out) {
    *out = comm_alloc();
    if (*out && env_timeout(&(*out)->timeout) != ZOFF_OK) { /* zoff_comm_init refuses it; here the default */
        zoff_log(ZOFF_LOG_WARN, "%s; using %.0f s", zoff_last_error(), (*out)->timeout);
        zoff_clear_error();
    }
    return *out ? ZOFF_OK : ZOFF_ERR_NOMEM;
}

zoff_status zoff_comm_init(int *argc, char ***argv, const zoff_comm_options *opts, zoff_comm **out) {
    *out = NULL;
    zoff_comm_options o = {0};
    if (opts) o = *opts;
    zoff_launch_info li;
    zoff_comm_detect_launch(&li);
    bool want_mpi = o.backend == ZOFF_COMM_MPI || o.backend == ZOFF_COMM_NCCL ||
                    (o.backend == ZOFF_COMM_AUTO && strcmp(li.launcher, "none") != 0);
    if (o.backend == ZOFF_COMM_SINGLE && li.size > 1)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "a one-rank communicator was asked for, but the launcher (%s) started %d ranks; run one "
                          "process, or let zoff use MPI",
                          li.launcher, li.size);
    if (want_mpi && !zoff_comm_have_mpi()) {
        if (li.size > 1 || o.backend == ZOFF_COMM_MPI || o.backend == ZOFF_COMM_NCCL)
            return zoff_error(ZOFF_ERR_UNSUPPORTED,
                              "started as rank %d of %d by a launcher (%s), but this zoff was built without MPI, so "
                              "its ranks cannot talk to each other; install Open MPI (apt-get install libopenmpi-dev "
                              "openmpi-bin) and rebuild (cmake -DZOFF_MPI=ON), or run a single process",
                              li.rank, li.size, li.launcher);
        want_mpi = false; /* mpirun -np 1 with a build without MPI: one rank is fine */
    }
    double timeout = o.timeout_s; /* else $ZOFF_COMM_TIMEOUT: a bad one is refused before any work */
    if (timeout <= 0) {
        timeout = DEFAULT_TIMEOUT_S;
        ZOFF_TRY(env_timeout(&timeout));
    }
    zoff_comm *c = comm_alloc();
    if (!c) return ZOFF_ERR_NOMEM;
    c->timeout = timeout;
    c->world = true;
    if (want_mpi) {
        zoff_status s = zoff_comm_mpi_init(argc, argv, c);
        if (s != ZOFF_OK) {
            pthread_mutex_destroy(&c->mu);
            free(c);
            return s;
        }
    }
    *out = c;
    return ZOFF_OK;
}

zoff_status zoff_comm_dup(zoff_comm *c, zoff_comm **out) {
    *out = NULL;
    ZOFF_TRY(zoff_comm_check_sticky(c));
    zoff_comm *d = comm_alloc();
    if (!d) return ZOFF_ERR_NOMEM;
    d->rank = c->rank;
    d->size = c->size;
    d->local_rank = c->local_rank;
    d->local_size = c->local_size;
    d->timeout = c->timeout;
    d->parent = c;
    d->dev = c->dev;
    d->vt = c->vt;
    zoff_status s = ZOFF_OK;
    if (c->vt) s = c->vt->dup(c, &d->impl);
    if (s == ZOFF_OK && c->svt) {
        d->svt = c->svt;
        s = c->svt->dup(c, d);
        if (s != ZOFF_OK) d->svt = NULL;
    }
    if (s == ZOFF_OK) *out = d;
    else zoff_comm_destroy(d);
    return s;
}

void zoff_comm_destroy(zoff_comm *c) {
    if (!c) return;
    if (c->svt && c->svt->destroy) c->svt->destroy(c);
    if (c->vt && c->vt->destroy) c->vt->destroy(c);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int zoff_comm_rank(const zoff_comm *c) { return c ? c->rank : 0; }
int zoff_comm_size(const zoff_comm *c) { return c ? c->size : 1; }
int zoff_comm_local_rank(const zoff_comm *c) { return c ? c->local_rank : 0; }
int zoff_comm_local_size(const zoff_comm *c) { return c ? c->local_size : 1; }
const char *zoff_comm_backend_name(const zoff_comm *c) {
    if (!c || !c->vt) return "single";
    return c->svt ? c->svt->name : c->vt->name;
}
double zoff_comm_timeout(const zoff_comm *c) { return c ? c->timeout : DEFAULT_TIMEOUT_S; }
void zoff_comm_set_timeout(zoff_comm *c, double seconds) {
    if (c && seconds > 0) c->timeout = seconds;
}

zoff_status zoff_comm_bind_device(zoff_comm *c, zoff_device *dev) {
    if (!c) return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_bind_device: comm is NULL");
    if (dev && zoff_device_kind(dev) == ZOFF_BACKEND_CUDA && c->vt && !c->svt) {
        if (!zoff_comm_have_nccl())
            return zoff_error(ZOFF_ERR_UNSUPPORTED,
                              "rank %d: %d ranks on CUDA devices need NCCL, and this zoff was built without it; "
                              "install NCCL (nccl.h, libnccl) and rebuild, or train on the CPU backend (--device cpu)",
                              c->rank, c->size);
        ZOFF_TRY(zoff_comm_nccl_attach(c, dev));
    }
    c->dev = dev;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ sticky error */

void zoff_comm_set_sticky(zoff_comm *c, zoff_status s, const char *msg) {
    for (zoff_comm *p = c; p; p = p->parent) {
        pthread_mutex_lock(&p->mu);
        if (p->sticky == ZOFF_OK) {
            p->sticky = s;
            snprintf(p->sticky_msg, sizeof p->sticky_msg, "%s", msg);
        }
        pthread_mutex_unlock(&p->mu);
    }
}

zoff_status zoff_comm_check_sticky(zoff_comm *c) {
    for (zoff_comm *p = c; p; p = p->parent) {
        pthread_mutex_lock(&p->mu);
        zoff_status s = p->sticky;
        char msg[sizeof p->sticky_msg];
        if (s != ZOFF_OK) memcpy(msg, p->sticky_msg, sizeof msg);
        pthread_mutex_unlock(&p->mu);
        if (s != ZOFF_OK) return zoff_error(s, "%s", msg);
    }
    return ZOFF_OK;
}

zoff_status zoff_comm_error(zoff_comm *c) { return c ? zoff_comm_check_sticky(c) : ZOFF_OK; }

/* A host collective failed: make it sticky so that later calls fail at once. */
static zoff_status note(zoff_comm *c, zoff_status s) {
    if (s != ZOFF_OK) zoff_comm_set_sticky(c, s, zoff_last_error());
    return s;
}

/* ------------------------------------------------------------------ argument checks */

static zoff_status check_dt(const char *fn, zoff_dtype dt, bool reduce) {
    if (dt == ZOFF_F32 || dt == ZOFF_BF16 || dt == ZOFF_F16 || dt == ZOFF_I32) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID, "%s: dtype %d is not f32, bf16, f16 or i32%s", fn, (int)dt,
                      reduce ? " (reductions)" : "");
}

static zoff_status check_counts(const zoff_comm *c, const char *fn, const int64_t *counts, const int64_t *displs) {
    if (!counts) return zoff_error(ZOFF_ERR_INVALID, "%s: counts is NULL", fn);
    for (int r = 0; r < c->size; r++) {
        if (counts[r] < 0 || counts[r] > INT_MAX)
            return zoff_error(ZOFF_ERR_INVALID, "%s: counts[%d] = %lld is outside [0, %d]; split the collective", fn,
                              r, (long long)counts[r], INT_MAX);
        if (displs && (displs[r] < 0 || displs[r] > INT_MAX))
            return zoff_error(ZOFF_ERR_INVALID, "%s: displs[%d] = %lld is outside [0, %d]; split the collective", fn,
                              r, (long long)displs[r], INT_MAX);
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ host functions on a stream */

enum { JOB_ALLREDUCE, JOB_REDUCE_SCATTER, JOB_ALLGATHERV, JOB_BROADCAST };

typedef struct comm_job {
    zoff_comm *c;
    int kind;
    void *buf;
    const void *send;
    void *recv;
    int64_t count;
    zoff_dtype dt;
    zoff_reduce_op op;
    int root;
    int64_t *counts, *displs; /* copies (size entries each) */
} comm_job;

static zoff_status run_host(comm_job *j) {
    zoff_comm *c = j->c;
    switch (j->kind) {
    case JOB_ALLREDUCE: return c->vt->allreduce(c, j->buf, j->count, j->dt, j->op);
    case JOB_REDUCE_SCATTER: return c->vt->reduce_scatter(c, j->send, j->recv, j->counts, j->dt);
    case JOB_ALLGATHERV: return c->vt->allgatherv(c, j->buf, j->counts, j->displs, j->dt);
    default: return c->vt->broadcast(c, j->buf, j->count, j->dt, j->root);
    }
}

static void job_free(comm_job *j) {
    if (!j) return;
    free(j->counts);
    free(j->displs);
    free(j);
}

/* Runs on the stream (the CPU backend: the stream's thread). */
static void job_main(void *arg) {
    comm_job *j = arg;
    if (zoff_comm_check_sticky(j->c) == ZOFF_OK) note(j->c, run_host(j));
    job_free(j);
}

/* Either run now (s == NULL) or enqueue on s. Takes ownership of j. */
static zoff_status submit(comm_job *j, zoff_stream *s) {
    zoff_comm *c = j->c;
    if (!s) {
        zoff_status st = note(c, run_host(j));
        job_free(j);
        return st;
    }
    zoff_status st = zoff_stream_host_fn(s, job_main, j);
    if (st != ZOFF_OK) job_free(j);
    return st;
}

/* A job of the call `args` (kind and operands), with copies of counts and displs. */
static comm_job *job_new(zoff_comm *c, comm_job args, const int64_t *counts, const int64_t *displs) {
    comm_job *j = calloc(1, sizeof *j);
    if (!j) {
        zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a collective");
        return NULL;
    }
    *j = args;
    j->c = c;
    j->counts = j->displs = NULL;
    size_t nb = (size_t)c->size * sizeof(int64_t);
    if (counts && !(j->counts = malloc(nb))) goto nomem;
    if (displs && !(j->displs = malloc(nb))) goto nomem;
    if (counts) memcpy(j->counts, counts, nb);
    if (displs) memcpy(j->displs, displs, nb);
    return j;
nomem:
    job_free(j);
    zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a collective");
    return NULL;
}

/* The host transport's path of every collective: the call becomes a job, run on s's order. */
static zoff_status submit_new(zoff_comm *c, zoff_stream *s, comm_job args, const int64_t *counts,
                              const int64_t *displs) {
    comm_job *j = job_new(c, args, counts, displs);
    return j ? submit(j, s) : ZOFF_ERR_NOMEM;
}

/* ------------------------------------------------------------------ collectives */

zoff_status zoff_comm_allreduce(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt,
                                zoff_reduce_op op) {
    if (!c || (!buf && count > 0) || count < 0)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_allreduce: bad arguments (buf %p, count %lld)", buf,
                          (long long)count);
    ZOFF_TRY(check_dt("zoff_comm_allreduce", dt, true));
    ZOFF_TRY(zoff_comm_check_sticky(c));
    if (!c->vt || count == 0) return ZOFF_OK; /* one rank: the identity */
    if (s && c->svt) return note(c, c->svt->allreduce(c, s, buf, count, dt, op));
    return submit_new(c, s, (comm_job){.kind = JOB_ALLREDUCE, .buf = buf, .count = count, .dt = dt, .op = op}, NULL,
                      NULL);
}

zoff_status zoff_comm_reduce_scatter(zoff_comm *c, zoff_stream *s, const void *send, void *recv,
                                     const int64_t *counts, zoff_dtype dt) {
    if (!c) return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_reduce_scatter: comm is NULL");
    ZOFF_TRY(check_dt("zoff_comm_reduce_scatter", dt, true));
    ZOFF_TRY(check_counts(c, "zoff_comm_reduce_scatter", counts, NULL));
    int64_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if ((total > 0 && !send) || (counts[c->rank] > 0 && !recv))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_reduce_scatter: send or recv is NULL");
    size_t es = zoff_dtype_size(dt);
    const char *sb = send, *rb = recv;
    if (counts[c->rank] > 0 && rb < sb + (size_t)total * es && sb < rb + (size_t)counts[c->rank] * es)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_reduce_scatter: recv overlaps send");
    ZOFF_TRY(zoff_comm_check_sticky(c));
    if (!c->vt) { /* one rank: copy the block */
        size_t bytes = (size_t)counts[0] * es;
        if (bytes == 0) return ZOFF_OK;
        if (s) return zoff_memcpy_async(s, recv, send, bytes, ZOFF_COPY_D2D);
        memcpy(recv, send, bytes);
        return ZOFF_OK;
    }
    if (s && c->svt) return note(c, c->svt->reduce_scatter(c, s, send, recv, counts, dt));
    return submit_new(c, s, (comm_job){.kind = JOB_REDUCE_SCATTER, .send = send, .recv = recv, .dt = dt}, counts,
                      NULL);
}

zoff_status zoff_comm_allgatherv(zoff_comm *c, zoff_stream *s, void *buf, const int64_t *counts,
                                 const int64_t *displs, zoff_dtype dt) {
    if (!c || !displs) return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_allgatherv: comm or displs is NULL");
    ZOFF_TRY(check_dt("zoff_comm_allgatherv", dt, false));
    ZOFF_TRY(check_counts(c, "zoff_comm_allgatherv", counts, displs));
    int64_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    if (total > 0 && !buf) return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_allgatherv: buf is NULL");
    ZOFF_TRY(zoff_comm_check_sticky(c));
    if (!c->vt || total == 0) return ZOFF_OK;
    if (s && c->svt) return note(c, c->svt->allgatherv(c, s, buf, counts, displs, dt));
    return submit_new(c, s, (comm_job){.kind = JOB_ALLGATHERV, .buf = buf, .dt = dt}, counts, displs);
}

zoff_status zoff_comm_broadcast(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt, int root) {
    if (!c || (!buf && count > 0) || count < 0 || count > INT_MAX)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_broadcast: bad arguments (buf %p, count %lld)", buf,
                          (long long)count);
    if (root < 0 || root >= c->size)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_broadcast: root %d is not a rank of %d", root, c->size);
    ZOFF_TRY(check_dt("zoff_comm_broadcast", dt, false));
    ZOFF_TRY(zoff_comm_check_sticky(c));
    if (!c->vt || count == 0) return ZOFF_OK;
    if (s && c->svt) return note(c, c->svt->broadcast(c, s, buf, count, dt, root));
    return submit_new(c, s, (comm_job){.kind = JOB_BROADCAST, .buf = buf, .count = count, .dt = dt, .root = root},
                      NULL, NULL);
}

/* ------------------------------------------------------------------ host-level helpers */

zoff_status zoff_comm_barrier(zoff_comm *c) {
    if (!c) return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_barrier: comm is NULL");
    ZOFF_TRY(zoff_comm_check_sticky(c));
    return c->vt ? note(c, c->vt->barrier(c)) : ZOFF_OK;
}

zoff_status zoff_comm_allreduce_f64(zoff_comm *c, double *buf, int64_t n, zoff_reduce_op op) {
    if (!c || (!buf && n > 0) || n < 0 || n > INT_MAX)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_allreduce_f64: bad arguments");
    ZOFF_TRY(zoff_comm_check_sticky(c));
    return c->vt && n > 0 ? note(c, c->vt->allreduce_f64(c, buf, n, op)) : ZOFF_OK;
}

zoff_status zoff_comm_broadcast_bytes(zoff_comm *c, void *buf, size_t bytes, int root) {
    if (!c || (!buf && bytes > 0) || bytes > INT_MAX || root < 0 || root >= c->size)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_broadcast_bytes: bad arguments (root %d)", root);
    ZOFF_TRY(zoff_comm_check_sticky(c));
    return c->vt && bytes > 0 ? note(c, c->vt->broadcast_bytes(c, buf, bytes, root)) : ZOFF_OK;
}

zoff_status zoff_comm_allgather_bytes(zoff_comm *c, const void *mine, void *all, size_t bytes) {
    if (!c || (bytes > 0 && (!mine || !all)) || bytes > INT_MAX / 1024)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_comm_allgather_bytes: bad arguments");
    ZOFF_TRY(zoff_comm_check_sticky(c));
    if (!c->vt) {
        if (bytes) memmove(all, mine, bytes);
        return ZOFF_OK;
    }
    return bytes > 0 ? note(c, c->vt->allgather_bytes(c, mine, all, bytes)) : ZOFF_OK;
}

zoff_status zoff_comm_check_same(zoff_comm *c, uint64_t fp, const char *what) {
    if (!c || c->size == 1) return ZOFF_OK;
    uint64_t *all = calloc((size_t)c->size, sizeof *all);
    if (!all) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory comparing %s across ranks", what);
    zoff_status s = zoff_comm_allgather_bytes(c, &fp, all, sizeof fp);
    if (s == ZOFF_OK) {
        char list[512];
        size_t used = 0;
        int bad = 0;
        list[0] = 0;
        for (int r = 1; r < c->size; r++) {
            if (all[r] == all[0]) continue;
            if (bad++ < 8 && used < sizeof list) {
                int m = snprintf(list + used, sizeof list - used, "%srank %d has %016llx", used ? ", " : "", r,
                                 (unsigned long long)all[r]);
                if (m > 0) used += (size_t)m;
            }
        }
        if (bad)
            s = zoff_error(ZOFF_ERR_CONFIG,
                           "%s differs across ranks (seen on rank %d of %d): %s%s, rank 0 has %016llx; every rank "
                           "must run with the same config file, flags and model shape",
                           what, c->rank, c->size, list, bad > 8 ? ", ..." : "", (unsigned long long)all[0]);
    }
    free(all);
    return s;
}
