/* zoff aio (src/aio): asynchronous, aligned file I/O for the NVMe optimizer
 * state (ZeRO-Infinity).
 *
 * Two engines, chosen automatically when the engine is created and reported
 * by zoff_aio_describe():
 *   - io_uring (liburing; only in builds that found it): each I/O thread owns
 *     a ring and keeps up to queue_depth block-size requests in flight;
 *   - a thread pool of pread/pwrite workers (where liburing is missing, the
 *     kernel is too old, or a container forbids io_uring): queue_depth
 *     workers per I/O thread, each with one request in flight.
 * $ZOFF_AIO_ENGINE (auto | uring | threads) forces one for ZOFF_AIO_AUTO.
 *
 * Files are opened with O_DIRECT where the file system allows it (not tmpfs
 * on older kernels, not some overlay and network file systems) and buffered
 * otherwise; zoff_aio_file_direct() tells which. Whatever the file, every
 * buffer address, file offset and length must be a multiple of ZOFF_AIO_ALIGN.
 *
 * The unit of work is a request: up to ZOFF_AIO_MAX_SEGMENTS segments (buffer,
 * file offset, length) of one file, all read or all written. The engine cuts
 * each segment into block_size chunks. A request may name up to two earlier
 * requests it must follow (`after`): it starts only when they have completed,
 * and fails without touching the file if one of them failed. Optional
 * integrity: a write stores the CRC32C of each chunk into seg.crcs, a read
 * checks each chunk against seg.crcs and fails naming the file and the bytes
 * that changed.
 *
 * Errors name the file, the offset, the length and what to do: disk full
 * (ENOSPC), I/O errors, short reads (a file truncated behind zoff's back),
 * checksum mismatches (a file changed behind zoff's back).
 *
 *     zoff_aio *io;  zoff_aio_file *f;
 *     zoff_aio_options o;  zoff_aio_options_default(&o);
 *     ZOFF_TRY(zoff_aio_create(&o, &io));
 *     ZOFF_TRY(zoff_aio_file_open(io, "/nvme/state.swp", ZOFF_AIO_CREATE, &f));
 *     zoff_aio_request w = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1,
 *                           .seg = {{.buf = buf, .offset = 0, .bytes = 1 << 20}}};
 *     ZOFF_TRY(zoff_aio_submit(io, &w));   // returns at once
 *     ...                                   // compute while the disk works
 *     ZOFF_TRY(zoff_aio_wait(io, &w));     // the request's own status
 */
#ifndef ZOFF_AIO_H
#define ZOFF_AIO_H

#include "zoff/config.h"
#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment of buffers, offsets and lengths (O_DIRECT's strictest common case). */
#define ZOFF_AIO_ALIGN 4096
#define ZOFF_AIO_MAX_SEGMENTS 4
#define ZOFF_AIO_MAX_FIXED 16 /* zoff_aio_options.fixed_buf */

typedef struct zoff_aio zoff_aio;
typedef struct zoff_aio_file zoff_aio_file;

typedef enum zoff_aio_engine_kind { ZOFF_AIO_AUTO = 0, ZOFF_AIO_URING, ZOFF_AIO_THREADS } zoff_aio_engine_kind;
typedef enum zoff_aio_op { ZOFF_AIO_READ = 0, ZOFF_AIO_WRITE } zoff_aio_op;

/* ---- fault injection (tests) ----
 * Called on an I/O thread before each chunk is issued. Return 0 to issue it
 * normally; a negative errno (-ENOSPC, -EIO) to fail the chunk with that error
 * without issuing it; a positive count below `bytes` to transfer only that many
 * bytes and report the chunk as short. Must be thread safe. */
typedef struct zoff_aio_fault_site {
    zoff_aio_op op;
    const char *path;
    int64_t offset;
    size_t bytes;
} zoff_aio_fault_site;
typedef int64_t (*zoff_aio_fault_fn)(void *arg, const zoff_aio_fault_site *site);
/* Process-wide hook for engines created afterwards whose options name none
 * (lets a test reach the engine inside zoff_engine). NULL removes it. */
void zoff_aio_set_fault_hook(zoff_aio_fault_fn fn, void *arg);

typedef struct zoff_aio_options {
    zoff_aio_engine_kind engine;  /* ZOFF_AIO_AUTO: io_uring when it works, else threads */
    int64_t block_size;           /* bytes per chunk, a multiple of ZOFF_AIO_ALIGN (aio.block_size, default 1 MiB) */
    int64_t queue_depth;          /* chunks in flight per I/O thread (aio.queue_depth, default 8) */
    int64_t threads;              /* I/O threads (aio.intra_op_parallelism, default 1) */
    bool single_submit;           /* io_uring: one submit call per chunk instead of per batch */
    bool overlap_events;          /* io_uring: submit new chunks while others complete (default true);
                                     false: batches of queue_depth chunks, each waited for entirely */
    int direct;                   /* 1 (default): O_DIRECT where the file system allows; 0: buffered */
    zoff_aio_fault_fn fault;      /* optional (tests) */
    void *fault_arg;
    /* io_uring: buffers registered with each ring (IORING_REGISTER_BUFFERS; the caller keeps them
       until zoff_aio_destroy). A chunk wholly inside one goes as a fixed-buffer read or write: its
       pages are pinned once here instead of by the kernel at every request (measured: 0.09-0.10 ->
       0.02-0.03 CPU-s per GiB of 8 MiB O_DIRECT writes). Best effort: where the kernel refuses
       (RLIMIT_MEMLOCK), chunks go as ordinary requests and zoff_aio_describe says why. */
    int nfixed;
    void *fixed_buf[ZOFF_AIO_MAX_FIXED];
    size_t fixed_bytes[ZOFF_AIO_MAX_FIXED];
} zoff_aio_options;

void zoff_aio_options_default(zoff_aio_options *o);
/* Offer [buf, buf + bytes) for registration (fixed_buf): false, nothing added, once ZOFF_AIO_MAX_FIXED are
 * offered (chunks in the others go as ordinary requests). */
bool zoff_aio_options_add_fixed(zoff_aio_options *o, void *buf, size_t bytes);
/* The config's "aio" section (DeepSpeed's keys) -> options. */
void zoff_aio_options_from_config(const zoff_aio_config *c, zoff_aio_options *o);

zoff_status zoff_aio_create(const zoff_aio_options *o, zoff_aio **out);
/* All submitted requests must have been waited for. */
void zoff_aio_destroy(zoff_aio *a);
zoff_aio_engine_kind zoff_aio_engine(const zoff_aio *a);
/* "io_uring, 1 thread x queue depth 8, 1 MiB blocks" or
 * "thread pool, 8 workers, 1 MiB blocks (io_uring unavailable: Operation not permitted)". */
const char *zoff_aio_describe(const zoff_aio *a);
/* Chunks issued so far as fixed-buffer requests (zoff_aio_options.fixed_buf; io_uring only). */
int64_t zoff_aio_fixed_requests(const zoff_aio *a);

/* ---- files ---- */
enum {
    ZOFF_AIO_CREATE = 1,    /* create the file; it must not exist (O_EXCL) */
    ZOFF_AIO_TEMPORARY = 2, /* with CREATE: unlink the name as soon as the file is open, so that the
                               file disappears with the process however it ends (exit, crash,
                               SIGKILL); the path stays the file's name in messages */
};
/* On failure errno is open(2)'s: EEXIST when CREATE finds the name taken. */
zoff_status zoff_aio_file_open(zoff_aio *a, const char *path, int flags, zoff_aio_file **out);
void zoff_aio_file_close(zoff_aio_file *f);
bool zoff_aio_file_direct(const zoff_aio_file *f);
/* Why the file is buffered ("" when O_DIRECT), e.g. "O_DIRECT not supported by /dev/shm: Invalid argument". */
const char *zoff_aio_file_direct_note(const zoff_aio_file *f);
const char *zoff_aio_file_path(const zoff_aio_file *f);
int zoff_aio_file_fd(const zoff_aio_file *f);
/* Reserve `bytes` for the file (fallocate where supported, else extend it):
 * a full disk is reported now, naming the directory and the free space (and
 * what this process's other reserved files on that file system hold, freed
 * when it exits: the total needed), not in the middle of training. */
zoff_status zoff_aio_file_reserve(zoff_aio_file *f, int64_t bytes);
/* The ranks of a data-parallel job on this host (each reserves swap files like this process's on
 * the same nvme_path): a full disk's message then says about how much they need together. */
void zoff_aio_set_host_ranks(int n);

/* ---- requests ---- */
enum {
    ZOFF_AIO_CRC_STORE = 1,  /* write: store each chunk's CRC32C into seg.crcs[chunk] */
    ZOFF_AIO_CRC_VERIFY = 2, /* read: check each chunk against seg.crcs[chunk] */
};

typedef struct zoff_aio_segment {
    void *buf;        /* aligned */
    int64_t offset;   /* in the file, aligned */
    size_t bytes;     /* aligned; 0 is allowed */
    uint32_t *crcs;   /* one per block_size chunk of this segment (ceil(bytes / block_size)); with the CRC flags */
} zoff_aio_segment;

typedef struct zoff_aio_request zoff_aio_request;
struct zoff_aio_request {
    /* set by the caller before zoff_aio_submit */
    zoff_aio_op op;
    zoff_aio_file *file;
    int nseg;
    zoff_aio_segment seg[ZOFF_AIO_MAX_SEGMENTS];
    unsigned flags;                /* ZOFF_AIO_CRC_* */
    zoff_aio_request *after[2];    /* optional: start only when these have completed */
    /* owned by the engine between submit and wait; the caller must not touch them */
    struct {
        int state; /* 0 idle, 1 queued or in flight, 2 done */
        uint64_t gen;
        uint64_t after_gen[2];
        int cur_seg;
        size_t cur_off;
        int inflight;
        bool issuing_done;
        zoff_status status;
        int64_t err_offset;
        int err; /* errno of the failure at err_offset (0: short transfer, checksum, dependency) */
        zoff_aio_request *next;
        char msg[640];
    } priv;
};

/* Queue a request; returns at once (ZOFF_ERR_INVALID for a malformed request:
 * misaligned, no file, already in flight). The request memory must stay valid
 * until zoff_aio_wait returns. A request may be submitted again after it was waited for. */
zoff_status zoff_aio_submit(zoff_aio *a, zoff_aio_request *r);
/* Block until r has completed; returns its status, with its message as the
 * thread's error message. Waiting on a request that was never submitted returns ZOFF_OK. */
zoff_status zoff_aio_wait(zoff_aio *a, zoff_aio_request *r);
/* After a failed zoff_aio_wait: the errno of the failure (0 when it was a short transfer, a
 * checksum mismatch or a failed dependency) and, in *offset, the file offset it happened at
 * (callers that word their own messages: the checkpoint writer). */
int zoff_aio_request_errno(const zoff_aio_request *r, int64_t *offset);
/* Non-blocking: has r completed (or was it never submitted)? */
bool zoff_aio_done(zoff_aio *a, zoff_aio_request *r);

/* CRC32C (Castagnoli): zoff_crc32c (SSE4.2 where the CPU has it), kept under this
 * name for the I/O engine's callers. */
uint32_t zoff_aio_crc32c(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
