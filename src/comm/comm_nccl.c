/* zoff comm over NCCL: stream-ordered collectives on CUDA device buffers.
 *
 * Built only with CUDA, MPI and NCCL (ZOFF_HAVE_NCCL; see docs/multinode.md for
 * the CMake part): without them this file is empty. The world communicator is
 * MPI's (host-level calls, NCCL's unique id broadcast); zoff_comm_bind_device
 * with a CUDA device attaches NCCL on that device (each rank's GPU is its local
 * rank), and the stream-ordered collectives go to NCCL from then on.
 *
 * Ordering: each communicator has its own CUDA stream. A collective records an
 * event on the caller's stream, the NCCL stream waits for it, NCCL runs, and
 * the caller's stream waits for an event recorded after it. Sums of bf16/fp16
 * are done in fp32: the caller's stream widens into a device scratch buffer
 * (zoff's cast op), NCCL sums fp32, the caller's stream rounds back once.
 * Gathers and broadcasts move bytes. Reduce-scatter and all-gather with unequal
 * blocks are grouped ncclReduce / ncclBroadcast calls, one per rank.
 *
 * Watchdog: NCCL kernels wait for their peers forever. A thread per
 * communicator polls the events of the collectives in flight every 50 ms; one
 * that has not finished after the comm's timeout, or an asynchronous NCCL
 * error, makes it call ncclCommAbort (which unblocks the kernels) and record a
 * sticky communication error; the next synchronisation of the caller's stream
 * returns and the engine reports zoff_comm_error. It never exits the process.
 * Issuing holds the watchdog's mutex and refuses an aborted communicator, so
 * the watchdog never aborts (frees) a communicator another thread is using.
 *
 * Tested without a GPU by tests/cuda_emu (EMU_ONLY=nccl: the CUDA
 * emulator and an NCCL stand-in over MPI, tests/test_comm.c under mpirun). */
#if defined(ZOFF_HAVE_NCCL) && defined(ZOFF_HAVE_MPI) && defined(ZOFF_HAVE_CUDA)
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* nccl.h declares f() for f(void) */
#include <nccl.h>
#pragma GCC diagnostic pop
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zoff/device.h"
#include "comm/comm_internal.h"

#define WATCH_RING 64

typedef struct nccl_impl {
    zoff_comm *owner;
    zoff_device *dev;
    int ordinal;
    ncclComm_t nc;
    cudaStream_t cs;
    cudaEvent_t ev_in, ev_out;
    void *scratch; /* device, fp32 for 16-bit sums */
    size_t scratch_bytes;
    /* watchdog */
    pthread_t wd;
    bool wd_started, quit, aborted;
    pthread_mutex_t mu;
    cudaEvent_t ring[WATCH_RING];
    double issued[WATCH_RING];
    char what[WATCH_RING][64];
    int head, tail; /* pending entries: [tail, head) modulo WATCH_RING */
} nccl_impl;

static cudaStream_t native(zoff_stream *s) { return (cudaStream_t)zoff_stream_native(s); }

#define CUDA_TRY(c, call)                                                                                       \
    do {                                                                                                        \
        cudaError_t e_ = (call);                                                                                \
        if (e_ != cudaSuccess)                                                                                  \
            return zoff_error(ZOFF_ERR_DEVICE, "communication: %s failed on rank %d of %d: %s", #call, (c)->rank, \
                              (c)->size, cudaGetErrorString(e_));                                               \
    } while (0)

/* ------------------------------------------------------------------ watchdog */

static void *watchdog_main(void *arg) {
    nccl_impl *n = arg;
    zoff_comm *c = n->owner;
    for (;;) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&n->mu);
        if (n->quit) {
            pthread_mutex_unlock(&n->mu);
            break;
        }
        while (n->tail != n->head && cudaEventQuery(n->ring[n->tail]) == cudaSuccess)
            n->tail = (n->tail + 1) % WATCH_RING;
        char msg[512] = "";
        if (!n->aborted) {
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(n->nc, &async);
            if (async != ncclSuccess)
                snprintf(msg, sizeof msg, "communication: NCCL reported an asynchronous error on rank %d of %d: %s",
                         c->rank, c->size, ncclGetErrorString(async));
            else if (n->tail != n->head && zoff_now() - n->issued[n->tail] > c->timeout)
                snprintf(msg, sizeof msg,
                         "communication: NCCL %s did not finish within %.0f s on rank %d of %d: another rank died, "
                         "stalled or is not at the same step; the watchdog aborted the NCCL communicator (timeout: "
                         "ZOFF_COMM_TIMEOUT or --comm-timeout)",
                         n->what[n->tail], c->timeout, c->rank, c->size);
            if (msg[0]) {
                n->aborted = true;
                ncclCommAbort(n->nc);
            }
        }
        pthread_mutex_unlock(&n->mu);
        if (msg[0]) zoff_comm_set_sticky(c, ZOFF_ERR_COMM, msg);
    }
    return NULL;
}

/* Watch the collective just issued on n->cs. */
static void watch(nccl_impl *n, const char *what) {
    pthread_mutex_lock(&n->mu);
    /* full: the oldest must finish first (the watchdog aborts it if it never does). The watchdog may
     * retire entries meanwhile: retire the one waited for only if it is still the oldest. */
    while ((n->head + 1) % WATCH_RING == n->tail) {
        int t = n->tail;
        pthread_mutex_unlock(&n->mu);
        cudaEventSynchronize(n->ring[t]);
        pthread_mutex_lock(&n->mu);
        if (n->tail == t) n->tail = (t + 1) % WATCH_RING;
    }
    cudaEventRecord(n->ring[n->head], n->cs);
    n->issued[n->head] = zoff_now();
    snprintf(n->what[n->head], sizeof n->what[n->head], "%s", what);
    n->head = (n->head + 1) % WATCH_RING;
    pthread_mutex_unlock(&n->mu);
}

/* ------------------------------------------------------------------ setup */

/* Has c or a communicator it was made from failed? (No error message is set.) */
static bool comm_failed(zoff_comm *c) {
    bool failed = false;
    for (zoff_comm *p = c; p && !failed; p = p->parent) {
        pthread_mutex_lock(&p->mu);
        failed = p->sticky != ZOFF_OK;
        pthread_mutex_unlock(&p->mu);
    }
    return failed;
}

/* force_abort: end the NCCL communicator with ncclCommAbort (setup failed on some rank). */
static void nccl_free(nccl_impl *n, bool force_abort) {
    if (!n) return;
    /* Collectives still in flight finish (or are aborted by the watchdog after the timeout) before the
     * watchdog stops; after a failure (of this comm or a parent) they may never finish: abort at once. */
    bool abort_it = force_abort || comm_failed(n->owner);
    if (n->nc && n->cs && !abort_it) cudaStreamSynchronize(n->cs);
    if (n->wd_started) {
        pthread_mutex_lock(&n->mu);
        n->quit = true;
        pthread_mutex_unlock(&n->mu);
        pthread_join(n->wd, NULL);
    }
    if (n->nc && !n->aborted) { /* the watchdog's ncclCommAbort already freed an aborted one */
        if (abort_it || comm_failed(n->owner)) ncclCommAbort(n->nc);
        else ncclCommDestroy(n->nc);
    }
    n->nc = NULL;
    if (n->cs) cudaStreamSynchronize(n->cs);
    for (int i = 0; i < WATCH_RING; i++)
        if (n->ring[i]) cudaEventDestroy(n->ring[i]);
    if (n->ev_in) cudaEventDestroy(n->ev_in);
    if (n->ev_out) cudaEventDestroy(n->ev_out);
    if (n->cs) cudaStreamDestroy(n->cs);
    if (n->scratch) zoff_device_free(n->dev, n->scratch);
    pthread_mutex_destroy(&n->mu);
    free(n);
}

/* Every rank learns whether every rank has succeeded so far (over c's MPI, with the timeout). A rank
 * that failed alone would leave the others in ncclCommInitRank, which waits for all ranks forever. */
static zoff_status agree(zoff_comm *c, zoff_status mine) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", mine != ZOFF_OK ? zoff_last_error() : "");
    double bad = mine != ZOFF_OK;
    zoff_status s = c->vt->allreduce_f64(c, &bad, 1, ZOFF_REDUCE_MAX);
    if (mine != ZOFF_OK) return zoff_error(mine, "%s", msg);
    if (s != ZOFF_OK) return s;
    if (bad != 0)
        return zoff_error(ZOFF_ERR_COMM, "communication: setting up NCCL failed on another rank (rank %d of %d is "
                                         "fine; that rank's message says why)",
                          c->rank, c->size);
    return ZOFF_OK;
}

/* Collective over c: a new NCCL communicator on c's ranks (id from rank 0 over c's MPI). */
static zoff_status nccl_open(zoff_comm *c, zoff_device *dev, nccl_impl **out) {
    *out = NULL;
    nccl_impl *n = calloc(1, sizeof *n);
    if (!n) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the NCCL communicator");
    pthread_mutex_init(&n->mu, NULL);
    n->owner = c;
    n->dev = dev;
    n->ordinal = zoff_device_ordinal(dev);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    zoff_status s = ZOFF_OK;
    if (c->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess)
        s = zoff_error(ZOFF_ERR_COMM, "communication: ncclGetUniqueId failed on rank 0");
    /* every rank takes part in the broadcast, even after a local failure (else the others wait) */
    zoff_status bs = c->vt->broadcast_bytes(c, &id, sizeof id, 0);
    if (s == ZOFF_OK) s = bs;
    if (s == ZOFF_OK && cudaSetDevice(n->ordinal) != cudaSuccess)
        s = zoff_error(ZOFF_ERR_DEVICE, "communication: cudaSetDevice(%d) failed on rank %d", n->ordinal, c->rank);
    s = agree(c, s); /* all ranks call ncclCommInitRank, or none */
    bool all_init = s == ZOFF_OK;
    if (s == ZOFF_OK) {
        ncclResult_t r = ncclCommInitRank(&n->nc, c->size, id, c->rank);
        if (r != ncclSuccess) {
            n->nc = NULL;
            s = zoff_error(ZOFF_ERR_COMM,
                           "communication: ncclCommInitRank failed on rank %d of %d (GPU %d): %s; check "
                           "NCCL_SOCKET_IFNAME and that every rank reaches rank 0 (NCCL_DEBUG=INFO tells more)",
                           c->rank, c->size, n->ordinal, ncclGetErrorString(r));
        }
    }
    if (s == ZOFF_OK && cudaStreamCreateWithFlags(&n->cs, cudaStreamNonBlocking) != cudaSuccess)
        s = zoff_error(ZOFF_ERR_DEVICE, "communication: cannot create the NCCL stream on rank %d", c->rank);
    if (s == ZOFF_OK && (cudaEventCreateWithFlags(&n->ev_in, cudaEventDisableTiming) != cudaSuccess ||
                         cudaEventCreateWithFlags(&n->ev_out, cudaEventDisableTiming) != cudaSuccess))
        s = zoff_error(ZOFF_ERR_DEVICE, "communication: cannot create CUDA events on rank %d", c->rank);
    for (int i = 0; s == ZOFF_OK && i < WATCH_RING; i++)
        if (cudaEventCreateWithFlags(&n->ring[i], cudaEventDisableTiming) != cudaSuccess)
            s = zoff_error(ZOFF_ERR_DEVICE, "communication: cannot create CUDA events on rank %d", c->rank);
    if (s == ZOFF_OK) {
        if (pthread_create(&n->wd, NULL, watchdog_main, n) != 0)
            s = zoff_error(ZOFF_ERR_INTERNAL, "communication: cannot start the NCCL watchdog thread");
        else
            n->wd_started = true;
    }
    if (all_init) s = agree(c, s); /* every rank keeps its communicator, or none does */
    if (s != ZOFF_OK) {
        nccl_free(n, true);
        return s;
    }
    *out = n;
    return ZOFF_OK;
}

static zoff_status scratch(zoff_comm *c, nccl_impl *n, zoff_stream *s, size_t bytes) {
    if (bytes <= n->scratch_bytes) return ZOFF_OK;
    /* The previous call's readers of the old buffer: NCCL (on n->cs) and the cast back to 16 bits on
     * the caller's stream, which may not have run yet (waiting for NCCL): both must finish. */
    CUDA_TRY(c, cudaStreamSynchronize(n->cs));
    CUDA_TRY(c, cudaStreamSynchronize(native(s)));
    if (n->scratch) zoff_device_free(n->dev, n->scratch);
    n->scratch = NULL;
    n->scratch_bytes = 0;
    ZOFF_TRY(zoff_device_alloc(n->dev, bytes, "NCCL fp32 reduction buffer", &n->scratch));
    n->scratch_bytes = bytes;
    return ZOFF_OK;
}

static zoff_status cast(zoff_stream *s, void *dst, zoff_dtype ddt, const void *src, zoff_dtype sdt, int64_t n) {
    if (n == 0) return ZOFF_OK;
    zoff_op_cast_args a = {.dst = dst, .src = src, .n = n, .dst_dt = ddt, .src_dt = sdt};
    return ZOFF_LAUNCH(s, ZOFF_OP_CAST, a);
}

static zoff_status enter(zoff_comm *c, nccl_impl *n, zoff_stream *s) {
    CUDA_TRY(c, cudaEventRecord(n->ev_in, native(s)));
    CUDA_TRY(c, cudaStreamWaitEvent(n->cs, n->ev_in, 0));
    return ZOFF_OK;
}

static zoff_status leave(zoff_comm *c, nccl_impl *n, zoff_stream *s, const char *what) {
    CUDA_TRY(c, cudaEventRecord(n->ev_out, n->cs));
    CUDA_TRY(c, cudaStreamWaitEvent(native(s), n->ev_out, 0));
    watch(n, what);
    return ZOFF_OK;
}

/* Issuing NCCL calls: under n->mu (the watchdog aborts under it too), never on an aborted communicator. */
static zoff_status issue_lock(zoff_comm *c, nccl_impl *n) {
    pthread_mutex_lock(&n->mu);
    if (!n->aborted) return ZOFF_OK;
    pthread_mutex_unlock(&n->mu);
    return zoff_error(ZOFF_ERR_COMM, "communication: the NCCL communicator of rank %d of %d was aborted", c->rank,
                      c->size);
}

static zoff_status issue_unlock(zoff_comm *c, nccl_impl *n, ncclResult_t r, const char *what) {
    pthread_mutex_unlock(&n->mu);
    if (r == ncclSuccess) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_COMM, "communication: %s failed on rank %d of %d: %s", what, c->rank, c->size,
                      ncclGetErrorString(r));
}

/* Closes the group even when a call inside it failed (an open group would swallow every later
 * NCCL call of this thread); the first failure is returned. */
static ncclResult_t group_end(ncclResult_t r) {
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

static bool is16(zoff_dtype dt) { return dt == ZOFF_BF16 || dt == ZOFF_F16; }
static ncclDataType_t ntype(zoff_dtype dt) { return dt == ZOFF_I32 ? ncclInt32 : ncclFloat32; }

/* ------------------------------------------------------------------ collectives */

static zoff_status n_allreduce(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt,
                               zoff_reduce_op op) {
    nccl_impl *n = c->simpl;
    ncclRedOp_t rop = op == ZOFF_REDUCE_MAX ? ncclMax : ncclSum;
    void *p = buf;
    if (is16(dt)) {
        ZOFF_TRY(scratch(c, n, s, (size_t)count * sizeof(float)));
        ZOFF_TRY(cast(s, n->scratch, ZOFF_F32, buf, dt, count));
        p = n->scratch;
    }
    ZOFF_TRY(enter(c, n, s));
    ZOFF_TRY(issue_lock(c, n));
    ncclResult_t r = ncclAllReduce(p, p, (size_t)count, is16(dt) ? ncclFloat32 : ntype(dt), rop, n->nc, n->cs);
    ZOFF_TRY(issue_unlock(c, n, r, "ncclAllReduce"));
    ZOFF_TRY(leave(c, n, s, "all-reduce"));
    if (is16(dt)) ZOFF_TRY(cast(s, buf, dt, n->scratch, ZOFF_F32, count));
    return ZOFF_OK;
}

static zoff_status n_reduce_scatter(zoff_comm *c, zoff_stream *s, const void *send, void *recv,
                                    const int64_t *counts, zoff_dtype dt) {
    nccl_impl *n = c->simpl;
    int64_t total = 0, before = 0, mine = counts[c->rank];
    bool equal = true;
    for (int r = 0; r < c->size; r++) {
        if (r < c->rank) before += counts[r];
        total += counts[r];
        equal = equal && counts[r] == counts[0];
    }
    const void *sp = send;
    void *rp = recv;
    if (is16(dt)) { /* [send as fp32 | recv as fp32] */
        ZOFF_TRY(scratch(c, n, s, (size_t)(total + mine) * sizeof(float)));
        ZOFF_TRY(cast(s, n->scratch, ZOFF_F32, send, dt, total));
        sp = n->scratch;
        rp = (float *)n->scratch + total;
    }
    ncclDataType_t t = is16(dt) ? ncclFloat32 : ntype(dt);
    size_t es = 4;
    ZOFF_TRY(enter(c, n, s));
    ZOFF_TRY(issue_lock(c, n));
    ncclResult_t nr;
    if (equal) {
        nr = ncclReduceScatter(sp, rp, (size_t)counts[0], t, ncclSum, n->nc, n->cs);
    } else {
        nr = ncclGroupStart();
        if (nr == ncclSuccess) {
            int64_t off = 0;
            for (int r = 0; r < c->size && nr == ncclSuccess; r++) {
                if (counts[r] > 0)
                    nr = ncclReduce((const char *)sp + (size_t)off * es, rp, (size_t)counts[r], t, ncclSum, r, n->nc,
                                    n->cs);
                off += counts[r];
            }
            nr = group_end(nr);
        }
    }
    ZOFF_TRY(issue_unlock(c, n, nr, equal ? "ncclReduceScatter" : "grouped ncclReduce"));
    ZOFF_TRY(leave(c, n, s, "reduce-scatter"));
    (void)before;
    if (is16(dt)) ZOFF_TRY(cast(s, recv, dt, rp, ZOFF_F32, mine));
    return ZOFF_OK;
}

static zoff_status n_allgatherv(zoff_comm *c, zoff_stream *s, void *buf, const int64_t *counts,
                                const int64_t *displs, zoff_dtype dt) {
    nccl_impl *n = c->simpl;
    size_t es = zoff_dtype_size(dt);
    bool regular = true;
    for (int r = 0; r < c->size; r++) regular = regular && counts[r] == counts[0] && displs[r] == displs[0] + r * counts[0];
    char *b = buf;
    ZOFF_TRY(enter(c, n, s));
    ZOFF_TRY(issue_lock(c, n));
    ncclResult_t nr;
    if (regular) {
        char *base = b + (size_t)displs[0] * es;
        nr = ncclAllGather(base + (size_t)c->rank * (size_t)counts[0] * es, base, (size_t)counts[0] * es, ncclUint8,
                           n->nc, n->cs);
    } else {
        nr = ncclGroupStart();
        if (nr == ncclSuccess) {
            for (int r = 0; r < c->size && nr == ncclSuccess; r++)
                if (counts[r] > 0) {
                    char *p = b + (size_t)displs[r] * es;
                    nr = ncclBroadcast(p, p, (size_t)counts[r] * es, ncclUint8, r, n->nc, n->cs);
                }
            nr = group_end(nr);
        }
    }
    ZOFF_TRY(issue_unlock(c, n, nr, regular ? "ncclAllGather" : "grouped ncclBroadcast"));
    return leave(c, n, s, "all-gather");
}

static zoff_status n_broadcast(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt, int root) {
    nccl_impl *n = c->simpl;
    ZOFF_TRY(enter(c, n, s));
    ZOFF_TRY(issue_lock(c, n));
    ncclResult_t r = ncclBroadcast(buf, buf, (size_t)count * zoff_dtype_size(dt), ncclUint8, root, n->nc, n->cs);
    ZOFF_TRY(issue_unlock(c, n, r, "ncclBroadcast"));
    return leave(c, n, s, "broadcast");
}

static zoff_status n_dup(zoff_comm *c, zoff_comm *child) {
    nccl_impl *n = c->simpl, *m = NULL;
    ZOFF_TRY(nccl_open(child, n->dev, &m));
    child->simpl = m;
    return ZOFF_OK;
}

static void n_destroy(zoff_comm *c) {
    nccl_free(c->simpl, false);
    c->simpl = NULL;
}

static const zoff_comm_stream_vtable nccl_vtable = {
    .name = "nccl",
    .dup = n_dup,
    .destroy = n_destroy,
    .allreduce = n_allreduce,
    .reduce_scatter = n_reduce_scatter,
    .allgatherv = n_allgatherv,
    .broadcast = n_broadcast,
};

zoff_status zoff_comm_nccl_attach(zoff_comm *c, zoff_device *dev) {
    if (!c->vt)
        return zoff_error(ZOFF_ERR_INVALID, "communication: NCCL needs the MPI communicator of an mpirun job");
    nccl_impl *n = NULL;
    ZOFF_TRY(nccl_open(c, dev, &n));
    c->simpl = n;
    c->svt = &nccl_vtable;
    return ZOFF_OK;
}

#else
typedef int zoff_comm_nccl_not_built; /* ISO C: a translation unit is not empty */
#endif
