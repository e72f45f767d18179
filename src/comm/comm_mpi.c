/* zoff comm over MPI (compiled only when CMake finds MPI: ZOFF_HAVE_MPI).
 *
 * Every collective is the non-blocking MPI-3 call (MPI_Iallreduce, ...)
 * followed by a wait that polls MPI_Test with a deadline (the comm's timeout),
 * so a dead or stalled rank turns into an error instead of a hang. Between
 * tests the waiting thread yields, then sleeps with a growing back-off (at
 * most POLL_MAX_SLEEP_NS): ranks often share cores with each other and with
 * the CPU backend's stream threads, and a spinning wait would steal them.
 *
 * Threads: the engine runs collectives from a stream thread while the main
 * thread runs host-level ones, on different communicators. zoff asks for
 * MPI_THREAD_MULTIPLE and accepts MPI_THREAD_SERIALIZED: every MPI call is made
 * under one process-wide mutex (waits release it between tests).
 *
 * Sums of bf16/fp16 are widened to fp32 around the collective (comm.h). */
#define _GNU_SOURCE
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_internal.h"

#define POLL_SPIN_S 0.002         /* yield-only polling for the first 2 ms */
#define POLL_MAX_SLEEP_NS 200000L /* then sleep, doubling from 1 us up to 200 us */

typedef struct mpi_impl {
    MPI_Comm comm;
    bool initialised_mpi; /* this comm called MPI_Init_thread: destroy finalises */
} mpi_impl;

static pthread_mutex_t g_mpi_mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCKED(call)                            \
    ({                                          \
        pthread_mutex_lock(&g_mpi_mu);          \
        int locked_rc_ = (call);                \
        pthread_mutex_unlock(&g_mpi_mu);        \
        locked_rc_;                             \
    })

static MPI_Comm comm_of(const zoff_comm *c) { return ((const mpi_impl *)c->impl)->comm; }

static zoff_status mpi_fail(zoff_comm *c, int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error %d", rc);
    msg[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING] = 0;
    return zoff_error(ZOFF_ERR_COMM, "communication: %s failed on rank %d of %d: %s", what, c->rank, c->size, msg);
}

/* Wait for req with the comm's deadline. */
static zoff_status wait_req(zoff_comm *c, MPI_Request *req, const char *what) {
    double t0 = zoff_now(), deadline = t0 + c->timeout;
    long sleep_ns = 1000;
    for (;;) {
        int done = 0;
        int rc = LOCKED(MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (rc != MPI_SUCCESS) return mpi_fail(c, rc, what);
        if (done) return ZOFF_OK;
        double now = zoff_now();
        if (now > deadline)
            return zoff_error(ZOFF_ERR_COMM,
                              "communication: %s timed out after %.0f s on rank %d of %d: another rank died, stalled "
                              "or is not at the same step (look at the other ranks' messages); the timeout is "
                              "ZOFF_COMM_TIMEOUT or --comm-timeout",
                              what, c->timeout, c->rank, c->size);
        if (now - t0 < POLL_SPIN_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            if (sleep_ns < POLL_MAX_SLEEP_NS) sleep_ns *= 2;
        }
    }
}

/* Issue and wait: `start` is a non-blocking MPI call that fills req. */
#define RUN(c, what, start)                                                  \
    do {                                                                     \
        MPI_Request req_ = MPI_REQUEST_NULL;                                 \
        int rc_ = LOCKED(start);                                             \
        if (rc_ != MPI_SUCCESS) return mpi_fail((c), rc_, (what));           \
        return wait_req((c), &req_, (what));                                 \
    } while (0)

static MPI_Datatype move_type(zoff_dtype dt) { /* for data that is only moved */
    switch (dt) {
    case ZOFF_F32: return MPI_FLOAT;
    case ZOFF_I32: return MPI_INT32_T;
    default: return MPI_UINT16_T;
    }
}

static MPI_Op mpi_op(zoff_reduce_op op) { return op == ZOFF_REDUCE_MAX ? MPI_MAX : MPI_SUM; }

static bool is16(zoff_dtype dt) { return dt == ZOFF_BF16 || dt == ZOFF_F16; }

static const char *dt_name(zoff_dtype dt) { return zoff_dtype_name(dt); }

/* ------------------------------------------------------------------ init / dup / destroy */

static zoff_status mpi_dup(zoff_comm *c, void **out);
static void mpi_destroy(zoff_comm *c);
static zoff_status mpi_barrier(zoff_comm *c);
static zoff_status mpi_allreduce(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, zoff_reduce_op op);
static zoff_status mpi_reduce_scatter(zoff_comm *c, const void *send, void *recv, const int64_t *counts,
                                      zoff_dtype dt);
static zoff_status mpi_allgatherv(zoff_comm *c, void *buf, const int64_t *counts, const int64_t *displs,
                                  zoff_dtype dt);
static zoff_status mpi_broadcast(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, int root);
static zoff_status mpi_allreduce_f64(zoff_comm *c, double *buf, int64_t n, zoff_reduce_op op);
static zoff_status mpi_allgather_bytes(zoff_comm *c, const void *mine, void *all, size_t bytes);
static zoff_status mpi_broadcast_bytes(zoff_comm *c, void *buf, size_t bytes, int root);

static const zoff_comm_vtable mpi_vtable = {
    .name = "mpi",
    .dup = mpi_dup,
    .destroy = mpi_destroy,
    .barrier = mpi_barrier,
    .allreduce = mpi_allreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .allgatherv = mpi_allgatherv,
    .broadcast = mpi_broadcast,
    .allreduce_f64 = mpi_allreduce_f64,
    .allgather_bytes = mpi_allgather_bytes,
    .broadcast_bytes = mpi_broadcast_bytes,
};

zoff_status zoff_comm_mpi_init(int *argc, char ***argv, zoff_comm *c) {
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    bool we_init = false;
    if (!inited) {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS)
            return zoff_error(ZOFF_ERR_COMM, "communication: MPI_Init_thread failed (MPI error %d); is this process "
                                             "started by mpirun, and can the ranks reach each other?",
                              rc);
        we_init = true;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        if (we_init) MPI_Finalize();
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "communication: this MPI provides thread level %d; zoff needs MPI_THREAD_SERIALIZED or "
                          "better (Open MPI does; check the MPI build)",
                          provided);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    mpi_impl *m = calloc(1, sizeof *m);
    if (!m) {
        if (we_init) MPI_Finalize();
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the MPI communicator");
    }
    m->initialised_mpi = we_init;
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    if (rc != MPI_SUCCESS) {
        free(m);
        if (we_init) MPI_Finalize();
        return zoff_error(ZOFF_ERR_COMM, "communication: MPI_Comm_dup of MPI_COMM_WORLD failed (MPI error %d)", rc);
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &c->rank);
    MPI_Comm_size(m->comm, &c->size);
    MPI_Comm local;
    if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &local) == MPI_SUCCESS) {
        MPI_Comm_rank(local, &c->local_rank);
        MPI_Comm_size(local, &c->local_size);
        MPI_Comm_free(&local);
    }
    c->vt = &mpi_vtable;
    c->impl = m;
    return ZOFF_OK;
}

static zoff_status mpi_dup(zoff_comm *c, void **out) {
    mpi_impl *m = calloc(1, sizeof *m);
    if (!m) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for an MPI communicator");
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = LOCKED(MPI_Comm_idup(comm_of(c), &m->comm, &req));
    zoff_status s = rc == MPI_SUCCESS ? wait_req(c, &req, "MPI_Comm_idup") : mpi_fail(c, rc, "MPI_Comm_idup");
    if (s != ZOFF_OK) {
        free(m);
        return s;
    }
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    *out = m;
    return ZOFF_OK;
}

static void mpi_destroy(zoff_comm *c) {
    mpi_impl *m = c->impl;
    if (!m) return;
    bool failed = c->sticky != ZOFF_OK;
    /* after a failure, collectives may still be pending on the communicator: leave it */
    if (!failed) LOCKED(MPI_Comm_free(&m->comm));
    if (m->initialised_mpi) {
        int fin = 0;
        MPI_Finalized(&fin);
        if (!fin && !failed) MPI_Finalize();
    }
    free(m);
    c->impl = NULL;
}

/* ------------------------------------------------------------------ collectives */

static zoff_status mpi_barrier(zoff_comm *c) { RUN(c, "MPI_Ibarrier", MPI_Ibarrier(comm_of(c), &req_)); }

static zoff_status allreduce_chunk(zoff_comm *c, void *buf, int n, MPI_Datatype t, MPI_Op op, const char *what) {
    RUN(c, what, MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, comm_of(c), &req_));
}

static zoff_status mpi_allreduce(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, zoff_reduce_op op) {
    char what[96];
    snprintf(what, sizeof what, "MPI_Iallreduce (%lld x %s)", (long long)count, dt_name(dt));
    const int64_t chunk = (int64_t)1 << 28;
    float *tmp = NULL;
    if (is16(dt)) {
        tmp = malloc((size_t)(count < chunk ? count : chunk) * sizeof(float));
        if (!tmp) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for an fp32 all-reduce of %lld elements",
                                    (long long)count);
    }
    zoff_status s = ZOFF_OK;
    size_t es = zoff_dtype_size(dt);
    for (int64_t off = 0; s == ZOFF_OK && off < count; off += chunk) {
        int n = (int)(count - off < chunk ? count - off : chunk);
        char *p = (char *)buf + (size_t)off * es;
        if (tmp) {
            zoff_comm_widen(p, dt, tmp, n);
            s = allreduce_chunk(c, tmp, n, MPI_FLOAT, mpi_op(op), what);
            if (s == ZOFF_OK) zoff_comm_narrow(tmp, p, dt, n);
        } else {
            s = allreduce_chunk(c, p, n, move_type(dt), mpi_op(op), what);
        }
    }
    free(tmp);
    return s;
}

static zoff_status mpi_reduce_scatter(zoff_comm *c, const void *send, void *recv, const int64_t *counts,
                                      zoff_dtype dt) {
    char what[96];
    int64_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    snprintf(what, sizeof what, "MPI_Ireduce_scatter (%lld x %s)", (long long)total, dt_name(dt));
    int *rc = malloc((size_t)c->size * sizeof *rc);
    float *ts = NULL, *tr = NULL;
    zoff_status s = ZOFF_OK;
    if (!rc) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for a reduce-scatter");
    for (int r = 0; r < c->size; r++) rc[r] = (int)counts[r];
    int64_t mine = counts[c->rank];
    if (is16(dt)) {
        ts = malloc((size_t)(total > 0 ? total : 1) * sizeof(float));
        tr = malloc((size_t)(mine > 0 ? mine : 1) * sizeof(float));
        if (!ts || !tr) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for an fp32 reduce-scatter of %lld elements",
                                       (long long)total);
        if (s == ZOFF_OK) zoff_comm_widen(send, dt, ts, total);
    }
    if (s == ZOFF_OK) {
        MPI_Request req = MPI_REQUEST_NULL;
        int e = LOCKED(MPI_Ireduce_scatter(ts ? (const void *)ts : send, tr ? (void *)tr : recv, rc,
                                           ts ? MPI_FLOAT : move_type(dt), MPI_SUM, comm_of(c), &req));
        s = e == MPI_SUCCESS ? wait_req(c, &req, what) : mpi_fail(c, e, what);
    }
    if (s == ZOFF_OK && tr) zoff_comm_narrow(tr, recv, dt, mine);
    free(ts);
    free(tr);
    free(rc);
    return s;
}

static zoff_status mpi_allgatherv(zoff_comm *c, void *buf, const int64_t *counts, const int64_t *displs,
                                  zoff_dtype dt) {
    char what[96];
    int64_t total = 0;
    for (int r = 0; r < c->size; r++) total += counts[r];
    snprintf(what, sizeof what, "MPI_Iallgatherv (%lld x %s)", (long long)total, dt_name(dt));
    int *rc = malloc((size_t)c->size * 2 * sizeof *rc);
    if (!rc) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for an all-gather");
    for (int r = 0; r < c->size; r++) {
        rc[r] = (int)counts[r];
        rc[c->size + r] = (int)displs[r];
    }
    MPI_Request req = MPI_REQUEST_NULL;
    int e = LOCKED(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, rc, rc + c->size, move_type(dt),
                                   comm_of(c), &req));
    zoff_status s = e == MPI_SUCCESS ? wait_req(c, &req, what) : mpi_fail(c, e, what);
    free(rc);
    return s;
}

static zoff_status mpi_broadcast(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, int root) {
    char what[96];
    snprintf(what, sizeof what, "MPI_Ibcast (%lld x %s from rank %d)", (long long)count, dt_name(dt), root);
    RUN(c, what, MPI_Ibcast(buf, (int)count, move_type(dt), root, comm_of(c), &req_));
}

static zoff_status mpi_allreduce_f64(zoff_comm *c, double *buf, int64_t n, zoff_reduce_op op) {
    RUN(c, "MPI_Iallreduce (f64)", MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_DOUBLE, mpi_op(op), comm_of(c), &req_));
}

static zoff_status mpi_allgather_bytes(zoff_comm *c, const void *mine, void *all, size_t bytes) {
    RUN(c, "MPI_Iallgather", MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm_of(c), &req_));
}

static zoff_status mpi_broadcast_bytes(zoff_comm *c, void *buf, size_t bytes, int root) {
    RUN(c, "MPI_Ibcast (bytes)", MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, comm_of(c), &req_));
}
