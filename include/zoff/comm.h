/* zoff comm: collectives over the ranks of a data-parallel job.
 *
 * Three implementations behind one interface:
 *   single  one rank, no MPI needed at build or run time: every collective is
 *           the identity (reduce-scatter copies the rank's block);
 *   mpi     Open MPI (or any MPI-3), host buffers. It is what the CPU backend
 *           uses: the CPU backend's "device" memory is host memory, so device
 *           pointers of a CPU device are passed to MPI directly;
 *   nccl    device buffers of a CUDA device, on NCCL's own stream ordered with
 *           events; host-level calls (barrier, checks) go over MPI, which also
 *           broadcasts NCCL's unique id. Built only with CUDA + NCCL + MPI.
 *
 * Launching: `mpirun -np N zoff train ...` starts N ranks. zoff_comm_init
 * reads the launcher's environment (Open MPI's OMPI_COMM_WORLD_*, MPICH/Intel's
 * PMI_*); under a launcher, a build with MPI calls MPI_Init_thread, a build
 * without MPI refuses N > 1 with an error that says how to rebuild. Local rank
 * and local size (ranks on this host) come from MPI_COMM_TYPE_SHARED; each rank
 * picks GPU (local rank) and, on the CPU backend, cores / local size threads.
 *
 * Sums of bf16/fp16 data are done in fp32: each rank widens its block to fp32,
 * the fp32 collective runs, the result is rounded once back to 16 bits (the
 * wire carries fp32: twice the bytes of a 16-bit collective, but a sum over N
 * ranks is rounded once, not N-1 times, and is the same on every rank).
 * Gathers and broadcasts of 16-bit data move the bits unchanged.
 *
 * Stream-ordered collectives (the `s` argument): the collective runs after the
 * work issued on s so far, and work issued on s afterwards sees its result.
 * MPI runs it in a host function on s (zoff_stream_host_fn: the CPU backend
 * runs it on the stream's thread); NCCL enqueues it on its own stream, ordered
 * with events. s == NULL: host buffers, and the call returns when the collective
 * is done. The collectives of one zoff_comm must be issued in the same order on
 * every rank, and the stream-ordered ones from one stream only: use
 * zoff_comm_dup for an independent channel (the engine dups one for its
 * gradient/weight stream; host-level calls use the parent).
 *
 * Failures never hang: every MPI wait polls with a deadline (the timeout:
 * ZOFF_COMM_TIMEOUT seconds in the environment, `zoff train --comm-timeout`,
 * or zoff_comm_set_timeout; default 300 s). A collective that does not finish
 * in time fails with ZOFF_ERR_COMM naming the collective, the rank and the
 * timeout. A failed stream-ordered collective cannot return its status through
 * the stream: it is sticky on the comm (zoff_comm_error), every later collective
 * of that comm fails at once, and the caller checks zoff_comm_error after it
 * synchronises the stream. After a communication failure the job cannot go on:
 * the CLI reports the error and ends all ranks (MPI_Abort in src/cli). NCCL
 * collectives are watched by a thread (the "watchdog" of docs/multinode.md)
 * that aborts the NCCL communicator when one runs past the timeout. */
#ifndef ZOFF_COMM_H
#define ZOFF_COMM_H

#include "zoff/core.h"
#include "zoff/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communication failure (timeout, dead peer, MPI/NCCL error); zoff_status has no
 * such code, so the comm module reports ZOFF_ERR_IO with a message that starts
 * with "communication". */
#define ZOFF_ERR_COMM ZOFF_ERR_IO

typedef struct zoff_comm zoff_comm;

typedef enum zoff_comm_backend {
    ZOFF_COMM_AUTO = 0, /* nccl for a CUDA device when built with it, else mpi under a launcher, else single */
    ZOFF_COMM_SINGLE,
    ZOFF_COMM_MPI,
    ZOFF_COMM_NCCL
} zoff_comm_backend;

typedef enum zoff_reduce_op { ZOFF_REDUCE_SUM = 0, ZOFF_REDUCE_MAX } zoff_reduce_op;

/* What the launcher says about this process (no MPI call needed). */
typedef struct zoff_launch_info {
    int rank, size;             /* 0 and 1 when not started by a launcher */
    int local_rank, local_size; /* ranks on this host as the launcher tells (may be -1: unknown) */
    const char *launcher;       /* "openmpi", "pmi", or "none" */
} zoff_launch_info;
/* Never fails. */
void zoff_comm_detect_launch(zoff_launch_info *out);
/* Was this build compiled with MPI / NCCL? */
bool zoff_comm_have_mpi(void);
bool zoff_comm_have_nccl(void);

typedef struct zoff_comm_options {
    zoff_comm_backend backend; /* AUTO */
    double timeout_s;          /* 0 = $ZOFF_COMM_TIMEOUT, else 300 */
} zoff_comm_options;

/* The world communicator of this process. argc/argv may be NULL. Under a launcher
 * with N > 1 ranks in a build without MPI: ZOFF_ERR_UNSUPPORTED. Call once per
 * process (MPI can be initialised only once); destroy finalises MPI. */
zoff_status zoff_comm_init(int *argc, char ***argv, const zoff_comm_options *opts, zoff_comm **out);
/* A one-rank communicator (tests, tools); no MPI involved. */
zoff_status zoff_comm_create_single(zoff_comm **out);
/* Collective: a new communicator over the same ranks whose collectives are ordered
 * independently of c's. The parent must outlive it. */
zoff_status zoff_comm_dup(zoff_comm *c, zoff_comm **out);
/* Frees c; the world communicator also finalises MPI (after a failure, the CLI ends
 * the job with MPI_Abort instead: MPI_Finalize could wait for a dead rank). NULL ok. */
void zoff_comm_destroy(zoff_comm *c);

int zoff_comm_rank(const zoff_comm *c);
int zoff_comm_size(const zoff_comm *c);
int zoff_comm_local_rank(const zoff_comm *c);
int zoff_comm_local_size(const zoff_comm *c);
const char *zoff_comm_backend_name(const zoff_comm *c); /* "single", "mpi", "nccl" */
double zoff_comm_timeout(const zoff_comm *c);
void zoff_comm_set_timeout(zoff_comm *c, double seconds);

/* Tell the comm which device's memory the stream-ordered collectives get. MPI
 * accepts a CPU device (its memory is host memory) and refuses a CUDA device
 * (use NCCL); single and NCCL accept theirs. Without a bound device, buffers are
 * host memory. Not collective. */
zoff_status zoff_comm_bind_device(zoff_comm *c, zoff_device *dev);

/* The sticky error of stream-ordered collectives (ZOFF_OK when none), with its
 * message set on the calling thread. */
zoff_status zoff_comm_error(zoff_comm *c);

/* ---- collectives. s: stream (stream-ordered) or NULL (host buffers, blocking).
 * Counts are elements of dt; dt is F32, BF16, F16 or I32 (sums of I32 are exact). */

/* buf (count) = op over ranks of buf, in place. */
zoff_status zoff_comm_allreduce(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt,
                                zoff_reduce_op op);
/* send holds the blocks of every rank back to back (counts[0] elements for rank 0,
 * then counts[1] ...); recv (counts[rank]) receives the sum over ranks of this
 * rank's block. recv must not overlap send. counts has size() entries, each >= 0. */
zoff_status zoff_comm_reduce_scatter(zoff_comm *c, zoff_stream *s, const void *send, void *recv,
                                     const int64_t *counts, zoff_dtype dt);
/* In place: on entry rank r's block is at buf + displs[r] (counts[r] elements) on
 * rank r; on return every rank's block is at its place on every rank. Blocks must
 * not overlap. */
zoff_status zoff_comm_allgatherv(zoff_comm *c, zoff_stream *s, void *buf, const int64_t *counts,
                                 const int64_t *displs, zoff_dtype dt);
/* buf (count) of rank root -> every rank. */
zoff_status zoff_comm_broadcast(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt, int root);

/* ---- host-level helpers (blocking) ---- */
zoff_status zoff_comm_barrier(zoff_comm *c);
/* buf (n doubles) = op over ranks, in place. */
zoff_status zoff_comm_allreduce_f64(zoff_comm *c, double *buf, int64_t n, zoff_reduce_op op);
/* `bytes` bytes of root -> every rank. */
zoff_status zoff_comm_broadcast_bytes(zoff_comm *c, void *buf, size_t bytes, int root);
/* mine (bytes) of every rank into all (size() * bytes), rank order. */
zoff_status zoff_comm_allgather_bytes(zoff_comm *c, const void *mine, void *all, size_t bytes);
/* Every rank passes a fingerprint of something that must agree (config, model
 * shape); the ranks whose value differs from rank 0's are named in a
 * ZOFF_ERR_CONFIG error on every rank ("`what` differs across ranks: rank 1 has
 * 0x..., rank 0 has 0x..."). */
zoff_status zoff_comm_check_same(zoff_comm *c, uint64_t fingerprint, const char *what);

/* FNV-1a over bytes, for fingerprints (start with ZOFF_FNV_INIT). */
#define ZOFF_FNV_INIT 0xCBF29CE484222325ull
uint64_t zoff_fnv1a(uint64_t h, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
