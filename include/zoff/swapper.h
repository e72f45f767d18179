/* zoff swapper (src/zero/swapper.c): the NVMe optimizer state of ZeRO-Infinity.
 *
 * The arrays of each sub-group ("group" here: the fp32 master weights, exp_avg,
 * exp_avg_sq in fp32 or, with bf16.bf16_optimizer_states, bf16) live in one swap file on fast disk and are streamed through
 * buffer_count host buffers, each big enough for one group's arrays. A pass
 * visits groups in a given order; for every group the caller gets its arrays
 * in a buffer (next), works on them, and hands the buffer back (release):
 *
 *     zoff_swapper_begin(s, order, n, ZOFF_SWAP_UPDATE, mask);
 *     for (k = 0; k < n; k++) {
 *         zoff_swapper_next(s, &g, arrays);   // waits for group order[k]'s read
 *         update(g, arrays);                  // the disk reads k+1.. and writes k-1 meanwhile
 *         zoff_swapper_release(s);            // queues the write of group g
 *     }
 *     zoff_swapper_end(s);                    // returns without waiting for the last writes
 *
 * With pipeline_read the reads of the next buffer_count-1 groups run ahead of
 * the caller (read i+1 | update i | write i-1); with pipeline_write writes are
 * not waited for. pipeline_read and pipeline_write need 3 buffers (2 with one
 * of them, 1 with neither; never more than the number of groups); fewer is a
 * configuration error that names the needed count. At the end of an update
 * pass the first groups of the next identical pass are read ahead, so that
 * the disk keeps working while the caller does other things (forward and
 * backward); a pass of another kind discards them.
 *
 * Integrity: every block written is checksummed (CRC32C, computed on the I/O
 * threads) and checked when read back; the file size and its header (magic,
 * version) are checked at the start of each reading pass. A truncated or
 * changed file, a full disk, an I/O error or a short read is an error naming
 * the file and the offset. After any error the swapper refuses further passes
 * (its state may be half written): the caller resumes from a checkpoint.
 *
 * The file (DIR/zoff-<stem>-<pid>-<n>.swp, the first free n: zoff_swapper_open_file) is created by zoff_swapper_create,
 * unlinked as soon as it is open (ZOFF_AIO_TEMPORARY: freed when the process
 * ends, however it ends), reserved in full (a disk too small fails then) and
 * closed by destroy. */
#ifndef ZOFF_SWAPPER_H
#define ZOFF_SWAPPER_H

#include "zoff/aio.h"
#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ZOFF_SWAP_MAX_ARRAYS 3

typedef struct zoff_swapper zoff_swapper;

typedef struct zoff_swapper_options {
    const char *dir;         /* offload_optimizer.nvme_path; created (one level) if missing */
    const char *stem;        /* file name stem, e.g. "optimizer" */
    int num_groups;
    const int64_t *counts;   /* elements of each group (copied) */
    int num_arrays;          /* 1..ZOFF_SWAP_MAX_ARRAYS arrays per group */
    zoff_dtype dtype[ZOFF_SWAP_MAX_ARRAYS]; /* of each array: ZOFF_F32 (0, the default) or ZOFF_BF16 */
    int64_t buffer_count;    /* offload_optimizer.buffer_count */
    bool pipeline_read, pipeline_write;
    bool fast_init;          /* arrays 1.. are not written by the first pass that writes only array 0:
                                until written they read as init_value[a] without disk I/O */
    float init_value[ZOFF_SWAP_MAX_ARRAYS]; /* rounded to dtype[a] */
    zoff_aio_options aio;
    /* offload_optimizer.pin_memory: the buffers are pinned host memory (zoff_host_alloc_pinned on dev,
       zoff_swapper_pinned_padding more each, aligned by hand) and registered with io_uring as fixed buffers
       (at most ZOFF_AIO_MAX_FIXED of them), so the O_DIRECT requests do not pin their pages each time;
       else pageable, ordinary requests */
    bool pin_memory;
    struct zoff_device *dev;
} zoff_swapper_options;

/* The swapper's sizes, one home (zoff plan counts with them): the file is
 * ZOFF_SWAP_HEADER_BYTES + the sum of zoff_swapper_group_bytes over the groups; each
 * of the zoff_swapper_buffer_count buffers holds zoff_swapper_group_bytes of the
 * largest group; the header takes 2 x ZOFF_SWAP_HEADER_BYTES of host memory. */
#define ZOFF_SWAP_HEADER_BYTES ZOFF_AIO_ALIGN
size_t zoff_swapper_array_bytes(int64_t count, zoff_dtype dt); /* padded to ZOFF_AIO_ALIGN */
size_t zoff_swapper_group_bytes(int64_t count, int num_arrays, const zoff_dtype *dtype);
int zoff_swapper_buffer_count(int64_t buffer_count, int num_groups); /* min(buffer_count, num_groups) */
/* Whether the padding of the groups' arrays (zoff_swapper_array_bytes) is more than their data,
 * which small groups (a small sub_group_size) make so: *padded is the groups' bytes in the file
 * (zoff_swapper_group_bytes), *data their bytes unpadded, *min_count the elements per group from
 * which no array's padding can exceed its data (ZOFF_AIO_ALIGN over the smallest dtype's size). */
bool zoff_swapper_padding_exceeds(const int64_t *counts, int num_groups, int num_arrays, const zoff_dtype *dtype,
                                  size_t *padded, size_t *data, int64_t *min_count);
/* Bytes each pinned buffer takes beyond zoff_swapper_group_bytes (pin_memory: aligned by hand). */
size_t zoff_swapper_pinned_padding(void);

zoff_status zoff_swapper_create(const zoff_swapper_options *o, zoff_swapper **out);
/* Waits for outstanding I/O, closes and deletes the file. */
void zoff_swapper_destroy(zoff_swapper *s);

/* "…/zoff-optimizer-123-0.swp, 1.20 GiB, O_DIRECT, io_uring ..., 4 buffers of 48.0 MiB, pipelined read+write" */
const char *zoff_swapper_describe(const zoff_swapper *s);
/* A note (log, info) for each swap file in dir (zoff-<stem>-<pid>-<n>.swp) whose process is gone,
 * or whose pid is this process's (any <n>: an older process that had this pid, in a container where
 * zoff is always pid 1 or on an nvme_path shared by hosts): zoff unlinks its own as soon as they are
 * open, so such a file was left by an older zoff (or a process killed between create and unlink);
 * it is named with its size, never removed. Once per directory and process, before the process
 * creates a swap file there (zoff_swapper_open_file calls it; swap files are created one at a time). */
void zoff_swapper_note_stale(const char *dir);
/* Creates and opens DIR/zoff-<stem>-<pid>-<n>.swp (ZOFF_AIO_CREATE | ZOFF_AIO_TEMPORARY: unlinked once
 * open) with the next n of *counter whose name is free, after zoff_swapper_note_stale(dir); a name
 * already taken is a file left by an older process with this pid (a container where zoff is always
 * pid 1, an nvme_path shared over NFS by hosts): that note named it; it is kept, and the next n is
 * tried. path (cap bytes) gets the name taken; key names the config key of dir in messages. */
zoff_status zoff_swapper_open_file(zoff_aio *io, const char *dir, const char *stem, const char *key, int *counter,
                                   char *path, size_t cap, zoff_aio_file **out);
const char *zoff_swapper_path(const zoff_swapper *s);
int64_t zoff_swapper_file_bytes(const zoff_swapper *s);
size_t zoff_swapper_buffer_bytes(const zoff_swapper *s); /* host memory of all buffers (pinned with pin_memory) */
int zoff_swapper_buffers(const zoff_swapper *s);
/* Buffers needed by the pipeline flags for this many groups (1 + read + write, at most num_groups). */
int zoff_swapper_buffers_needed(bool pipeline_read, bool pipeline_write, int num_groups);
bool zoff_swapper_direct(const zoff_swapper *s);
zoff_aio_engine_kind zoff_swapper_engine(const zoff_swapper *s);

/* Pass kinds: READ reads the masked arrays of each group, WRITE writes them
 * (the buffer's previous contents are undefined: the caller fills it), UPDATE
 * does both. array_mask: bit a for array a. */
enum { ZOFF_SWAP_READ = 1, ZOFF_SWAP_WRITE = 2, ZOFF_SWAP_UPDATE = 3 };
zoff_status zoff_swapper_begin(zoff_swapper *s, const int *order, int n, unsigned mode, unsigned array_mask);
/* The next group of the pass and its arrays (arrays[a] for every a < num_arrays, of
 * dtype[a], ZOFF_AIO_ALIGN aligned; only the masked ones hold the group's data). */
zoff_status zoff_swapper_next(zoff_swapper *s, int *group, void *arrays[ZOFF_SWAP_MAX_ARRAYS]);
zoff_status zoff_swapper_release(zoff_swapper *s);
zoff_status zoff_swapper_end(zoff_swapper *s);
/* Wait for every write in flight (and report its failure). Read-ahead is kept. */
zoff_status zoff_swapper_flush(zoff_swapper *s);

/* Between passes (none begun and not ended): elements [first, first + count) of array `array` of
 * group `group`, read (write false) or written, without a group-sized buffer: they move through
 * the first of the swapper's buffers, at most ZOFF_SWAP_RANGE_BYTES at a time, as whole checksummed aio blocks
 * (a write reads first the blocks it changes in part, and gives a never-written array of
 * fast_init its init_value up to the range; the next pass completes such an array). fn(arg, k,
 * n, data) is called for consecutive parts in order: data holds elements [first + k, first + k +
 * n) in the array's dtype, to be read (read) or filled (write). The read-ahead of the last pass
 * is dropped and its writes are waited for; a read keeps its blocks for the next read (sequential
 * reads read each block once). Errors are those of the passes (the swapper then refuses to go on). */
#define ZOFF_SWAP_RANGE_BYTES ((size_t)16 << 20)
typedef void (*zoff_swapper_range_fn)(void *arg, int64_t k, int64_t n, void *data);
zoff_status zoff_swapper_range(zoff_swapper *s, int group, int array, int64_t first, int64_t count, bool write,
                               zoff_swapper_range_fn fn, void *arg);

typedef struct zoff_swapper_stats {
    int64_t bytes_read, bytes_written; /* since create */
    double t_wait_read;  /* seconds the caller waited in next() for reads */
    double t_wait_write; /* seconds the caller waited for writes (pipeline_write off, WRITE passes, flush) */
} zoff_swapper_stats;
void zoff_swapper_get_stats(const zoff_swapper *s, zoff_swapper_stats *out);

#ifdef __cplusplus
}
#endif
#endif
