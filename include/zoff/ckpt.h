/* zoff checkpoints: crash-safe, checksummed checkpoint directories.
 *
 * ==== Directory layout ====
 *
 *   DIR/step_00000100/              one directory per saved step ("step_%08lld";
 *       rank_00000.zckpt            more digits past step 99,999,999)
 *       rank_00001.zckpt            one container file per rank ("rank_%05d.zckpt")
 *       COMPLETE                    written last; a step directory without it is ignored
 *   DIR/step_00000200.tmp-<tag>/    a checkpoint being written, or left by a crash: ignored,
 *                                   and removed by the next successful save
 *   DIR/step_00000100.old-<tag>/    a complete checkpoint moved aside while it is being
 *                                   overwritten (ZOFF_CKPT_OVERWRITE): ignored; after a crash
 *                                   in that window it can be renamed back by hand
 *
 * COMPLETE is a small text file:  "zoff-checkpoint 1\nstep <step>\nranks <nranks>\n".
 *
 * ==== How a checkpoint is written ====
 *
 *   every rank:  zoff_ckpt_writer_open(DIR, step, rank, opts)   creates DIR/step_X.tmp-<tag>/
 *                zoff_ckpt_add(...) / zoff_ckpt_begin_entry + zoff_ckpt_append + zoff_ckpt_end_entry
 *                zoff_ckpt_commit(w)       writes the index and header, fsyncs and closes the file
 *   (ranks > 1:  barrier, so that every rank's file is committed)
 *   rank 0:      zoff_ckpt_finalize(DIR, step, nranks, opts)
 *                    checks every rank file's header, writes COMPLETE into the temp dir and
 *                    fsyncs it and the temp dir, renames the temp dir to DIR/step_X (the commit
 *                    point: the step dir appears with its marker), fsyncs DIR.
 *   single rank: commit, then finalize(DIR, step, 1, opts) right away.
 *
 * A crash at any point leaves the earlier checkpoints untouched plus, at worst, a temp
 * directory that readers ignore (with a log line) and the next successful finalize in DIR
 * removes (any step_X.tmp-<tag> whose tag is not its own): every DIR/step_X directory has its
 * COMPLETE marker (scripts/crash_test.sh checks this under SIGKILL). A step_X without COMPLETE (written
 * by an older zoff, or by hand) is ignored the same way and replaced by the next save of that
 * step. Every failure of a writer (ENOSPC, EIO, short write, bad argument) removes
 * its temp file (and the temp dir once empty) before the call returns; an existing complete
 * step_X is never touched unless ZOFF_CKPT_OVERWRITE is given, and even then it is only
 * removed after the new one is complete.
 *
 * ==== The .zckpt container, format version 1 ====
 *
 * All header and index integers are little-endian. Tensor data is stored in host byte order
 * (zoff builds only on little-endian hosts). CRCs are CRC32C (zoff_crc32c with seed 0).
 *
 *   bytes [0, 4096): header block; the first 128 bytes are used, the rest is zero
 *     off  size  field
 *       0     8  magic         "ZOFFCKPT" (no terminator)
 *       8     4  version       1 (ZOFF_CKPT_VERSION)
 *      12     4  header_bytes  128
 *      16     4  alignment     4096 (ZOFF_CKPT_ALIGN): every entry's data offset and the index
 *                              offset are multiples of it (O_DIRECT-friendly)
 *      20     4  entry_bytes   256: size of one index record
 *      24     8  step          int64, the training step of the checkpoint
 *      32     4  rank          uint32, the rank that wrote this file
 *      36     4  flags         0 (readers reject other values)
 *      40     8  entry_count   number of index records
 *      48     8  index_offset  file offset of the index (multiple of alignment, >= 4096)
 *      56     8  index_bytes   entry_count * 256
 *      64     8  file_bytes    total file size = index_offset + index_bytes
 *      72     4  index_crc     CRC32C of the index_bytes bytes at index_offset
 *      76    48  reserved      zero
 *     124     4  header_crc    CRC32C of header bytes [0, 124)
 *
 *   bytes [4096, index_offset): entry data, in the order the entries were added; each entry
 *     starts at a multiple of 4096 and the gaps are zero padding. Empty entries take no bytes.
 *     Since index_offset is aligned too, an O_DIRECT reader may read any entry rounded out to
 *     [offset, align_up(offset + bytes)) without running past the file.
 *
 *   bytes [index_offset, file_bytes): the index, entry_count records of 256 bytes, in file order
 *     off  size  field
 *       0   128  name          UTF-8, 1..127 bytes, NUL-terminated, NUL-padded; unique in the file
 *     128     4  dtype         zoff_dtype (0 f32, 1 bf16, 2 f16, 3 i32) or 255 (ZOFF_CKPT_RAW bytes)
 *     132     4  ndim          0..8 (ZOFF_CKPT_MAX_DIMS); ndim 0 is a scalar (or, for raw, "any size")
 *     136    64  shape[8]      int64 each, >= 0; unused dims 0
 *     200     8  offset        file offset of the data (multiple of 4096)
 *     208     8  bytes         data size = product(shape) * dtype size (raw with ndim 0: any)
 *     216     4  crc           CRC32C of the data bytes
 *     220    36  reserved      zero
 *
 * Readers check, before trusting a byte: magic, then version, then the header CRC and fixed
 * fields, the real file size against file_bytes (truncation), the index bounds and CRC, and for
 * every record its name, dtype, shape/size consistency, alignment and that its data lies inside
 * [4096, index_offset) without overlapping the previous entry. An entry's data CRC is checked
 * whenever the entry is read. Every error names the file, the entry, and what is wrong.
 *
 * ==== Partitioned entries (data parallel; written by src/train/checkpoint.c) ====
 *
 * Every rank file holds a "partition" blob, JSON:
 *   {"format":"zoff-partition","version":1,"rank":R,"world_size":N,"num_params":P,
 *    "runs":[[offset,count],...]}
 * and the optimizer state entries "optimizer.exp_avg", "optimizer.exp_avg_sq" (1-D; fp32, or
 * bf16 where every element kept bf16 state: zoff_checkpoint_state_dtype) of that rank only: element k of such an entry is model element (flat offset) of the
 * runs laid end to end in the order given (runs are ranges of the model's flat parameter
 * space; one run [0,P) for one rank; one per rank without round_robin_gradients, about one
 * per tensor with it; an empty list when the rank holds a replica: stage 0). The runs of
 * all rank files cover [0,P) exactly once. Consolidating = for each rank file, scatter each
 * entry through its runs into a P-element array. Tensor weights (fp32 master, Hugging Face
 * names), "meta" and "config" are whole, in rank_00000.zckpt only. A file without a
 * "partition" blob (one rank, older zoff) has full P-element optimizer entries. The blob is
 * written and read by zoff_ckpt_partition_json / zoff_ckpt_read_partition (one home).
 *
 * ==== Fault injection (tests) ====
 *
 * Every write and fsync of checkpoint files goes through one function, which calls the hook
 * set with zoff_ckpt_set_io_hook() when there is one. In addition the environment variable
 * ZOFF_CKPT_FAULT=<ENOSPC|EIO>@<offset> (read when a writer opens) makes every write to a
 * .zckpt file fail with that errno once it reaches byte <offset> of the file (the bytes before
 * it are written first, like a disk that fills up): for shell-level tests of the CLI.
 *
 * ==== How the bytes reach the disk ====
 *
 * A .zckpt file's bytes after the header block stream through a few aligned piece buffers: one
 * is filled (and checksummed) while the others are written through src/aio (io_uring, O_DIRECT
 * where the file system allows it, else buffered, the reason in zoff_ckpt_writer_io), into blocks
 * the writer allocates ahead of them (fallocate, where the file system can: a write that extends
 * the file would go to a kernel worker thread instead of being issued at once). The last
 * piece is padded to ZOFF_CKPT_ALIGN and the file cut back to its size; then the header, fsync.
 * Aligned runs of the caller's own memory (zoff_ckpt_append_external) are written from there,
 * between the pieces, without a copy.
 * The piece that reaches a ZOFF_CKPT_FAULT offset, and every piece while an I/O hook is set or
 * with ZOFF_CKPT_IO=buffered, is written with pwrite (buffered) from the writer's thread. */
#ifndef ZOFF_CKPT_H
#define ZOFF_CKPT_H

#include "zoff/core.h"
#include "zoff/device.h" /* zoff_dtype */

#ifdef __cplusplus
extern "C" {
#endif

#define ZOFF_CKPT_VERSION 1
#define ZOFF_CKPT_ALIGN 4096
#define ZOFF_CKPT_MAX_NAME 127 /* bytes, without the terminator */
#define ZOFF_CKPT_MAX_DIMS 8
/* dtype of an entry holding raw bytes (JSON state, RNG state, ...): element size 1. */
#define ZOFF_CKPT_RAW ((zoff_dtype)255)

/* One entry as stored in the index. */
typedef struct zoff_ckpt_entry {
    char name[ZOFF_CKPT_MAX_NAME + 1];
    zoff_dtype dtype; /* a zoff_dtype or ZOFF_CKPT_RAW */
    int ndim;
    int64_t shape[ZOFF_CKPT_MAX_DIMS];
    int64_t offset; /* byte offset of the data in the file (multiple of ZOFF_CKPT_ALIGN) */
    int64_t bytes;  /* size of the data */
    uint32_t crc32c;
} zoff_ckpt_entry;

/* Options shared by the writer and zoff_ckpt_finalize; a NULL pointer means all defaults. */
typedef struct zoff_ckpt_options {
    /* Replace an existing complete DIR/step_X. Without it that is an error (an incomplete
     * leftover step_X is always replaced). */
    bool overwrite;
    /* Suffix of the temp dir DIR/step_X.tmp-<tmp_tag>; [A-Za-z0-9_-], at most 64 characters.
     * NULL = the process id, which is right for one rank. With several ranks, all ranks and
     * the finalize call must pass the same tag (e.g. rank 0's pid, broadcast). */
    const char *tmp_tag;
} zoff_ckpt_options;

/* ---- paths ---- */

/* "DIR/step_%08lld" into out. Fails if it does not fit in cap. */
zoff_status zoff_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap);

/* ---- writer ---- */

typedef struct zoff_ckpt_writer zoff_ckpt_writer;

/* Start this rank's file of checkpoint `step` under `dir` (created, with parents, if missing).
 * Fails at once if DIR/step_X is already complete and opts->overwrite is not set. */
zoff_status zoff_ckpt_writer_open(const char *dir, int64_t step, int rank, const zoff_ckpt_options *opts,
                                  zoff_ckpt_writer **out);

/* Add one entry from host memory. `bytes` must equal product(shape) * element size (for
 * ZOFF_CKPT_RAW with ndim 0 any size is allowed; shape may then be NULL). Names: 1..127 bytes,
 * unique within the file. */
zoff_status zoff_ckpt_add(zoff_ckpt_writer *w, const char *name, zoff_dtype dtype, int ndim, const int64_t *shape,
                          const void *data, size_t bytes);
/* Add raw bytes (e.g. a JSON text without its terminator): ZOFF_CKPT_RAW, ndim 0. */
zoff_status zoff_ckpt_add_blob(zoff_ckpt_writer *w, const char *name, const void *data, size_t bytes);

/* Add one entry in pieces (state streamed sub-group by sub-group): begin declares the entry,
 * append adds bytes in order, end checks that exactly product(shape) * element size bytes
 * were appended. Only one entry can be open at a time. */
zoff_status zoff_ckpt_begin_entry(zoff_ckpt_writer *w, const char *name, zoff_dtype dtype, int ndim,
                                  const int64_t *shape);
zoff_status zoff_ckpt_append(zoff_ckpt_writer *w, const void *data, size_t bytes);
zoff_status zoff_ckpt_end_entry(zoff_ckpt_writer *w);
/* Append without a copy: *dst is where the open entry's next bytes go in the writer's piece
 * buffer and *cap how many fit there (at most what the entry's shape still needs; > 0 while it
 * needs any); fill the first `bytes` <= *cap of them, then zoff_ckpt_append_done (which takes
 * their CRC32C while they are in cache and hands full pieces to the disk). Pieces and entry
 * offsets are multiples of ZOFF_CKPT_ALIGN, so while every append was a multiple of the element
 * size, *cap is one too. */
zoff_status zoff_ckpt_append_space(zoff_ckpt_writer *w, void **dst, size_t *cap);
zoff_status zoff_ckpt_append_done(zoff_ckpt_writer *w, size_t bytes);
/* Append `bytes` from the caller's memory without copying them: when the writer uses aio, data
 * and bytes are multiples of ZOFF_CKPT_ALIGN and the entry's position is one, the CRC32C is
 * taken from data and the disk's DMA reads them there; otherwise they are copied through the
 * pieces. release(ctx, data) is called exactly once, when the writer no longer reads data
 * (after the write completed, or at once when copied or on failure; at the latest in
 * zoff_ckpt_commit or zoff_ckpt_abort), on the writer's thread. */
typedef void (*zoff_ckpt_release_fn)(void *ctx, const void *data);
/* zoff_ckpt_append_external's writes in flight at most: the next one waits for the oldest. Measured
 * (docs/performance.md, 1.5 GiB in 1 MiB runs, O_DIRECT): 16 -> 48 took the write from a median 0.82 to
 * 0.77 s on the 2-core box's disk and 0.84 to 0.74 s on the H100 box's; 24 MiB in 8 MiB pieces, 0.67 s
 * there. The disk wants bytes in flight, and a staged block is at most 1 MiB. */
#define ZOFF_CKPT_EXTERNAL_IN_FLIGHT 48
zoff_status zoff_ckpt_append_external(zoff_ckpt_writer *w, const void *data, size_t bytes, zoff_ckpt_release_fn release,
                                      void *ctx);
/* The external writes already completed, their memory released now (zoff_ckpt_append_external
 * does this too, before each new one): a caller whose memory is limited frees it before asking
 * for more. A failed write's error is returned (and the writer fails). */
zoff_status zoff_ckpt_reap_external(zoff_ckpt_writer *w);
/* Bytes zoff_ckpt_append_external handed to the disk in place so far (not copied). */
int64_t zoff_ckpt_writer_in_place(const zoff_ckpt_writer *w);
/* Host bytes a writer holds for its piece buffers (the one home of that figure). */
size_t zoff_ckpt_writer_buffer_bytes(void);
/* The layout rule of a .zckpt file (the format above, the one home of its sizes): the bytes an
 * entry of `bytes` data takes in the file (aligned up to ZOFF_CKPT_ALIGN; 0 for an empty one),
 * and the size of a file of `count` entries whose spans add up to `spans` (the header block,
 * the spans, the index). zoff_ckpt_marker_bytes: the COMPLETE marker of a step folder. */
int64_t zoff_ckpt_entry_span(int64_t bytes);
int64_t zoff_ckpt_file_bytes(size_t count, int64_t spans);
size_t zoff_ckpt_marker_bytes(int64_t step, int nranks);
/* How this writer's file is written, e.g. "io_uring, 1 thread x queue depth 3, 8.00 MiB blocks;
 * O_DIRECT" or "pwrite from the caller's thread, buffered (ZOFF_CKPT_IO=buffered)". */
const char *zoff_ckpt_writer_io(const zoff_ckpt_writer *w);

/* Write the index and header, fsync and close the file. Always frees the writer. On failure
 * the file has been removed (and the temp dir, when empty). The checkpoint is not visible
 * to readers until zoff_ckpt_finalize. */
zoff_status zoff_ckpt_commit(zoff_ckpt_writer *w);
/* Give up: remove this rank's file (and the temp dir, when empty) and free the writer.
 * NULL is allowed. Use it after any writer error as well (the files are already gone then). */
void zoff_ckpt_abort(zoff_ckpt_writer *w);

/* After every rank committed (rank 0 only, after a barrier): check that the temp dir holds
 * rank_00000 .. rank_<nranks-1> files with valid headers and no others, then make the
 * checkpoint visible atomically (see the top of this file). On failure the temp dir is
 * removed and any earlier complete checkpoint, including an overwritten step_X, is intact. */
zoff_status zoff_ckpt_finalize(const char *dir, int64_t step, int nranks, const zoff_ckpt_options *opts);

/* Remove DIR/step_X.tmp-<tag> (all rank files): for a caller that learns another rank failed. */
zoff_status zoff_ckpt_discard(const char *dir, int64_t step, const zoff_ckpt_options *opts);

/* ---- finding checkpoints ---- */

/* Newest step under `dir` whose step directory has a COMPLETE marker; *step = -1 when there
 * is none (that is not an error). Temp and incomplete directories are skipped with a log line.
 * Fails only if `dir` cannot be read. */
zoff_status zoff_ckpt_latest(const char *dir, int64_t *step);
/* How many complete checkpoints (step directories with a COMPLETE marker) `dir` holds, quietly. */
zoff_status zoff_ckpt_count(const char *dir, size_t *count);

/* Accept either a checkpoint root ("out": its newest complete step) or a step directory
 * ("out/step_00000100", which must be complete). Writes the step directory into out and its
 * step into *step (either may be NULL/0). Errors say what was found instead. */
zoff_status zoff_ckpt_resolve(const char *path, char *out, size_t cap, int64_t *step);
/* The folder of the run `path` names (as zoff_ckpt_resolve: the folder itself, or the one holding the
 * step directory given), where its later steps go. */
zoff_status zoff_ckpt_run_dir(const char *path, char *out, size_t cap);

/* Remove all but the newest keep_last (>= 1) complete checkpoints under dir. Each is first
 * renamed to DIR/step_X.tmp-prune-<pid>, so an interrupted prune leaves an ignored temp dir.
 * Other temp and incomplete directories are left alone. */
zoff_status zoff_ckpt_prune(const char *dir, int keep_last);

/* ---- reader ---- */

typedef struct zoff_ckpt_reader zoff_ckpt_reader;

/* Open rank `rank`'s file of the checkpoint named by `path` (a root or a step directory, as in
 * zoff_ckpt_resolve). Validates the header and the whole index (see the top of this file);
 * entry data is checked as it is read. */
zoff_status zoff_ckpt_open(const char *path, int rank, zoff_ckpt_reader **out);
void zoff_ckpt_close(zoff_ckpt_reader *r); /* NULL is allowed */

int64_t zoff_ckpt_reader_step(const zoff_ckpt_reader *r);
int zoff_ckpt_reader_nranks(const zoff_ckpt_reader *r); /* number of ranks that wrote the checkpoint */
const char *zoff_ckpt_reader_path(const zoff_ckpt_reader *r); /* the .zckpt file */

/* Entries in file order, and lookup by name (NULL when absent). */
size_t zoff_ckpt_num_entries(const zoff_ckpt_reader *r);
const zoff_ckpt_entry *zoff_ckpt_entry_at(const zoff_ckpt_reader *r, size_t i);
const zoff_ckpt_entry *zoff_ckpt_find(const zoff_ckpt_reader *r, const char *name);

/* Read a whole entry into dst and check its CRC. `bytes` must equal the entry's size.
 * On a checksum error dst holds the (corrupt) bytes and must not be used. */
zoff_status zoff_ckpt_read(zoff_ckpt_reader *r, const char *name, void *dst, size_t bytes);
/* Like zoff_ckpt_read, and first check that the entry has this dtype and shape, with an error
 * that shows both shapes ("shape mismatch for 'wte.weight': checkpoint has [50304, 768] but the
 * model has [50304, 128]: ..."). */
zoff_status zoff_ckpt_read_tensor(zoff_ckpt_reader *r, const char *name, zoff_dtype dtype, int ndim,
                                  const int64_t *shape, void *dst, size_t bytes);
/* zoff_ckpt_read_tensor's checks (present, dtype, shape) without reading. */
zoff_status zoff_ckpt_check_tensor(zoff_ckpt_reader *r, const char *name, zoff_dtype dtype, int ndim,
                                   const int64_t *shape);
/* Read a whole entry into a new malloc'ed buffer with a NUL byte appended (for JSON text);
 * *bytes (may be NULL) receives the size without the NUL. Free with free(). */
zoff_status zoff_ckpt_read_blob(zoff_ckpt_reader *r, const char *name, char **data, size_t *bytes);
/* Read bytes [offset, offset + bytes) of an entry (streaming a large entry in pieces). The
 * first range read of an entry checks the CRC of the whole entry (one extra sequential pass
 * through a bounce buffer) unless zoff_ckpt_read/verify already did, or
 * zoff_ckpt_reader_verify_in_order is on. */
zoff_status zoff_ckpt_read_range(zoff_ckpt_reader *r, const char *name, int64_t offset, void *dst, size_t bytes);
/* The same in two halves, for a reader thread beside a checking one: _unchecked reads the bytes
 * and touches none of the CRC bookkeeping; zoff_ckpt_checksum_range then does that bookkeeping
 * over the bytes read (as zoff_ckpt_read_range would have). One thread may call _unchecked while
 * another calls checksum_range on the same reader (nothing else meanwhile); the ranges must be
 * checksummed in the order read_range would have read them. */
zoff_status zoff_ckpt_read_range_unchecked(zoff_ckpt_reader *r, const char *name, int64_t offset, void *dst,
                                           size_t bytes);
zoff_status zoff_ckpt_checksum_range(zoff_ckpt_reader *r, const char *name, int64_t offset, const void *data,
                                     size_t bytes);
/* Check the CRC of one entry (NULL name: of every entry) without keeping the data (with
 * zoff_ckpt_reader_verify_in_order: only what was not checksummed yet is read). */
zoff_status zoff_ckpt_verify(zoff_ckpt_reader *r, const char *name);
/* on: zoff_ckpt_read_range checks an entry as it reads it instead of first: the bytes of each range
 * past what was checksummed so far are checksummed in the caller's buffer (anything skipped before
 * them is read and checksummed first), and the CRC is compared when the entry's last byte has
 * been read (that read fails on a mismatch) or by zoff_ckpt_verify, which reads what is left. An
 * entry read in order from its start is then read from the file once instead of twice, but a
 * range is handed over before its entry is checked: the caller must zoff_ckpt_verify the entry
 * before it relies on what it read (a load: before training on it). Off when opened. Returns the
 * setting it replaces. */
bool zoff_ckpt_reader_verify_in_order(zoff_ckpt_reader *r, bool on);

/* ---- the "partition" blob of a rank file (see "Partitioned entries" above) ---- */
typedef struct zoff_ckpt_partition {
    bool present;       /* false: the file has no blob (one rank, older zoff): its entries are whole */
    int64_t num_params; /* P, the elements of the flat space (0 when !present) */
    int64_t *runs;      /* [offset0, count0, offset1, count1, ...], each inside [0, P) (malloc'd) */
    size_t nruns;
} zoff_ckpt_partition;
/* Read and check rank file r's blob: format "zoff-partition", version 1, the "rank" field (when
 * present) equal to `rank`, num_params, runs [offset, count] inside [0, num_params). Errors name
 * the file. A file without the blob gives present = false (not an error). */
zoff_status zoff_ckpt_read_partition(zoff_ckpt_reader *r, int rank, zoff_ckpt_partition *out);
void zoff_ckpt_partition_free(zoff_ckpt_partition *p); /* NULL is allowed */
/* The blob's JSON text for rank `rank` of `world` (malloc'd; NULL when out of memory). */
char *zoff_ckpt_partition_json(int rank, int world, int64_t num_params, const int64_t *runs, size_t nruns);

/* ---- fault-injection hook (tests) ----
 * While set, every write and fsync of a checkpoint file (the .zckpt files and COMPLETE) and
 * fsync of a checkpoint directory calls hook instead of pwrite/fsync. It returns what
 * pwrite/fsync would: WRITE the number of bytes written (short counts are retried; 0 is an
 * error) or -1 with errno set; FSYNC 0 or -1 with errno set. It may pass a call on to
 * zoff_ckpt_io_default. Process-wide; set it while no writer is running. NULL restores the
 * default. */
/* ZOFF_CKPT_IO: "auto" (default: io_uring, O_DIRECT where the file system allows) or "buffered"
 * (pwrite through the page cache) for every file src/ckpt writes; an invalid value is an error
 * (ZOFF_ERR_INVALID), which zoff train reports before training, not at its first save. */
zoff_status zoff_ckpt_io_buffered(bool *buffered);

typedef enum zoff_ckpt_io_op { ZOFF_CKPT_IO_WRITE = 0, ZOFF_CKPT_IO_FSYNC = 1 } zoff_ckpt_io_op;
typedef int64_t (*zoff_ckpt_io_hook)(void *user, zoff_ckpt_io_op op, const char *path, int fd, const void *buf,
                                     size_t bytes, int64_t offset);
void zoff_ckpt_set_io_hook(zoff_ckpt_io_hook hook, void *user);
int64_t zoff_ckpt_io_default(zoff_ckpt_io_op op, int fd, const void *buf, size_t bytes, int64_t offset);

#ifdef __cplusplus
}
#endif
#endif
