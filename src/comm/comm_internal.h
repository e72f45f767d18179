/* Private to src/comm: what the common layer (comm.c) and the implementations
 * (comm_mpi.c, comm_nccl.c) share.
 *
 * comm.c owns the zoff_comm handle: rank/size, the timeout, the sticky error of
 * stream-ordered collectives, argument checks, the one-rank implementation,
 * and running host-buffer collectives in stream order (a host function on the
 * caller's stream). An implementation provides blocking host-buffer
 * collectives and, if it works on device buffers itself (NCCL), stream ones. */
#ifndef ZOFF_COMM_INTERNAL_H
#define ZOFF_COMM_INTERNAL_H

#include <pthread.h>

#include "zoff/comm.h"

/* The host transport (MPI): blocking collectives on host buffers. */
typedef struct zoff_comm_vtable {
    const char *name;
    zoff_status (*dup)(zoff_comm *c, void **impl_out);
    void (*destroy)(zoff_comm *c);
    /* blocking, host buffers; arguments already checked */
    zoff_status (*barrier)(zoff_comm *c);
    zoff_status (*allreduce)(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, zoff_reduce_op op);
    zoff_status (*reduce_scatter)(zoff_comm *c, const void *send, void *recv, const int64_t *counts, zoff_dtype dt);
    zoff_status (*allgatherv)(zoff_comm *c, void *buf, const int64_t *counts, const int64_t *displs, zoff_dtype dt);
    zoff_status (*broadcast)(zoff_comm *c, void *buf, int64_t count, zoff_dtype dt, int root);
    zoff_status (*allreduce_f64)(zoff_comm *c, double *buf, int64_t n, zoff_reduce_op op);
    zoff_status (*allgather_bytes)(zoff_comm *c, const void *mine, void *all, size_t bytes);
    zoff_status (*broadcast_bytes)(zoff_comm *c, void *buf, size_t bytes, int root);
} zoff_comm_vtable;

/* A device transport (NCCL): stream-ordered collectives on device buffers. */
typedef struct zoff_comm_stream_vtable {
    const char *name;
    zoff_status (*dup)(zoff_comm *c, zoff_comm *child); /* collective; sets child->simpl */
    void (*destroy)(zoff_comm *c);
    zoff_status (*allreduce)(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt,
                             zoff_reduce_op op);
    zoff_status (*reduce_scatter)(zoff_comm *c, zoff_stream *s, const void *send, void *recv,
                                  const int64_t *counts, zoff_dtype dt);
    zoff_status (*allgatherv)(zoff_comm *c, zoff_stream *s, void *buf, const int64_t *counts,
                              const int64_t *displs, zoff_dtype dt);
    zoff_status (*broadcast)(zoff_comm *c, zoff_stream *s, void *buf, int64_t count, zoff_dtype dt, int root);
} zoff_comm_stream_vtable;

struct zoff_comm {
    const zoff_comm_vtable *vt;          /* host transport; NULL for the one-rank comm */
    void *impl;
    const zoff_comm_stream_vtable *svt;  /* device transport; NULL: host functions on the stream */
    void *simpl;
    int rank, size, local_rank, local_size;
    double timeout;
    bool world;          /* created by zoff_comm_init: destroy finalises */
    zoff_comm *parent;   /* dups: the communicator they were made from */
    zoff_device *dev;    /* bound device (NULL: host buffers) */
    pthread_mutex_t mu;  /* guards the sticky error */
    zoff_status sticky;
    char sticky_msg[1024];
};

/* Record a failure of a stream-ordered collective (first one wins). */
void zoff_comm_set_sticky(zoff_comm *c, zoff_status s, const char *msg);
/* Is c (or its parent) already failed? Returns the sticky status with its message set. */
zoff_status zoff_comm_check_sticky(zoff_comm *c);

/* fp32 <-> 16-bit conversion for sums in fp32 */
void zoff_comm_widen(const void *src, zoff_dtype dt, float *dst, int64_t n);
void zoff_comm_narrow(const float *src, void *dst, zoff_dtype dt, int64_t n);

/* implementations (comm_mpi.c, comm_nccl.c) */
zoff_status zoff_comm_mpi_init(int *argc, char ***argv, zoff_comm *c);
/* Collective: add the NCCL device transport to an MPI comm, on CUDA device dev.
 * Only in builds with NCCL (ZOFF_HAVE_NCCL). */
zoff_status zoff_comm_nccl_attach(zoff_comm *c, zoff_device *dev);

#endif
