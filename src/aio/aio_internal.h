/* Private to src/aio: the engine object shared by the common code (aio.c:
 * requests, files, the thread-pool engine) and the io_uring engine (aio_uring.c). */
#ifndef ZOFF_AIO_INTERNAL_H
#define ZOFF_AIO_INTERNAL_H

#include <pthread.h>
#include <sys/types.h>

#include "zoff/aio.h"

struct zoff_aio_file {
    int fd;
    bool direct;
    char note[256];
    char path[4096];
    dev_t dev;                         /* its file system (set when reserved) */
    int64_t reserved;                  /* bytes zoff_aio_file_reserve gave it (0: none) */
    struct zoff_aio_file *next_reserved; /* the process's reserved files (aio.c g_reserved) */
};

/* One block (or less) of one segment of one request, as an I/O thread handles it. */
typedef struct aio_chunk {
    zoff_aio_request *r;
    int seg;
    size_t off;       /* within the segment */
    size_t len;       /* bytes to transfer */
    size_t done;      /* bytes transferred so far */
    size_t index;     /* chunk number within the segment (crcs[index]) */
    size_t limit;     /* fault injection: transfer at most this many bytes, then report short (0 = none) */
    int err;          /* errno of a failure (0 = none) */
    bool crc_bad;     /* read: checksum mismatch */
    uint32_t crc_got;
} aio_chunk;

struct zoff_aio {
    zoff_aio_options o;
    zoff_aio_engine_kind kind;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a chunk may be startable (new request, a dependency completed, quit) */
    pthread_cond_t cv_done; /* a request completed */
    zoff_aio_request *head, *tail; /* requests with chunks not yet issued, in submission order */
    bool quit;
    uint64_t gen;
    int nthreads;
    pthread_t *threads;
    void *uring; /* aio_uring.c's state */
    int64_t fixed_requests; /* chunks issued with a registered buffer (atomic) */
    char fixed_note[128];   /* what became of zoff_aio_options.fixed_buf ("" when none were given) */
    char describe[512];
};

/* Under a->mu: the next startable chunk (false if none). Fails requests whose
 * dependency failed (completing them if nothing is in flight). */
bool zoff_aio__take_chunk(zoff_aio *a, aio_chunk *c);
/* Without the lock, before issuing: the fault hook (sets c->limit or c->err).
 * Returns false when the chunk must not be issued (c->err set). */
bool zoff_aio__prepare_chunk(zoff_aio *a, aio_chunk *c);
/* Without the lock, before the chunk completes (a write's buffer does not
 * change while it is in flight, so after issuing it is fine): a write's
 * checksum when the request asks for ZOFF_AIO_CRC_STORE. */
void zoff_aio__store_crc(aio_chunk *c);
/* Without the lock, after the transfer: read checksum verification. */
void zoff_aio__finish_chunk(zoff_aio *a, aio_chunk *c);
/* Under a->mu: account the finished chunk; completes its request when it was the last. */
void zoff_aio__complete_chunk(zoff_aio *a, aio_chunk *c);
/* Where the chunk's bytes are. */
static inline char *zoff_aio__chunk_buf(const aio_chunk *c) {
    return (char *)c->r->seg[c->seg].buf + c->off + c->done;
}
static inline int64_t zoff_aio__chunk_offset(const aio_chunk *c) {
    return c->r->seg[c->seg].offset + (int64_t)(c->off + c->done);
}

#ifdef ZOFF_HAVE_URING
/* Start a->o.threads io_uring threads. On failure nothing is started and
 * `why` says what the kernel answered. */
zoff_status zoff_aio__uring_start(zoff_aio *a, char *why, size_t whylen);
/* Join the threads (a->quit is set) and free the rings. */
void zoff_aio__uring_stop(zoff_aio *a);
#endif

#endif
