/* zoff core: status codes and error messages, logging, aligned allocation,
 * timers, CPU feature detection. Every other module builds on this one. */
#ifndef ZOFF_CORE_H
#define ZOFF_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every fallible function returns a zoff_status. On failure the thread-local
 * message (zoff_last_error) says what was wrong, with what value, and what to do. */
typedef enum zoff_status {
    ZOFF_OK = 0,
    ZOFF_ERR_INVALID,      /* bad argument or input value */
    ZOFF_ERR_CONFIG,       /* bad configuration (unknown key, wrong type, out of range, contradiction) */
    ZOFF_ERR_IO,           /* file system or I/O failure */
    ZOFF_ERR_FORMAT,       /* a file exists but its content is wrong (magic, version, size, checksum) */
    ZOFF_ERR_NOMEM,        /* host memory exhausted */
    ZOFF_ERR_DEVICE_OOM,   /* device memory budget exhausted */
    ZOFF_ERR_DEVICE,       /* device runtime failure (CUDA error, stream error) */
    ZOFF_ERR_UNSUPPORTED,  /* valid request that this build/backend/version does not implement */
    ZOFF_ERR_INTERNAL      /* a bug in zoff */
} zoff_status;

/* Name of a status code, e.g. "ZOFF_ERR_CONFIG". */
const char *zoff_status_name(zoff_status s);

/* Set the thread-local error message (printf-style) and return `code`.
 * Usage: return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno)); */
zoff_status zoff_error(zoff_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Prefix the current message with context: "loading checkpoint: <old message>". Returns code. */
zoff_status zoff_error_context(zoff_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The status of a failed open, stat or mkdir (errno `err`) of a path the user named: an input
 * (a token shard, a checkpoint to load, --init-from) or an output (--save, --output, an
 * nvme_path). Where the path itself is wrong (no such file or folder, a component that is not
 * a folder, too long, a symlink loop, no permission, a read-only file system)
 * ZOFF_ERR_INVALID: the command line exits 2, "fix it and run again" (zoff --help); anything
 * else (EIO, ENOSPC, EMFILE, ENOMEM, ...) ZOFF_ERR_IO: exit 1, the run failed. The one home of
 * that rule. */
zoff_status zoff_status_of_path_errno(int err);
/* The calling thread's last error message ("" when none). */
const char *zoff_last_error(void);
void zoff_clear_error(void);

/* Propagate a failing status unchanged. */
#define ZOFF_TRY(expr)                         \
    do {                                       \
        zoff_status zoff_try_s_ = (expr);      \
        if (zoff_try_s_ != ZOFF_OK) return zoff_try_s_; \
    } while (0)

/* ---- element types of tensors (device buffers, checkpoints) ---- */
typedef enum zoff_dtype {
    ZOFF_F32 = 0,
    ZOFF_BF16 = 1,
    ZOFF_F16 = 2,
    ZOFF_I32 = 3,
    ZOFF_DTYPE_COUNT
} zoff_dtype;
/* Bytes per element (0 for a value out of range) and the name ("bf16"; "invalid-dtype"). */
size_t zoff_dtype_size(zoff_dtype dt);
const char *zoff_dtype_name(zoff_dtype dt);

/* ---- logging ---- */
typedef enum { ZOFF_LOG_DEBUG = 0, ZOFF_LOG_INFO, ZOFF_LOG_WARN, ZOFF_LOG_ERROR } zoff_log_level;
void zoff_log_set_level(zoff_log_level level);
zoff_log_level zoff_log_get_level(void);
/* Writes "zoff: [level] message\n" to stderr when level >= the set level. */
void zoff_log(zoff_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- aligned allocation (host, pageable) ---- */
/* Returns NULL on failure and sets the error message (naming `what` and the size). */
void *zoff_aligned_alloc(size_t alignment, size_t bytes, const char *what);
void zoff_aligned_free(void *p);
/* Free each of n pointers (free(); zoff_aligned_alloc's blocks too), in order; NULLs allowed. */
void zoff_free_all(void *const *p, size_t n);
/* ZOFF_FREE_ALL(a, b, c): zoff_free_all over the listed pointers (a destructor's free list). */
#define ZOFF_FREE_ALL(...)                                                  \
    do {                                                                    \
        void *const zoff_fa_[] = {__VA_ARGS__};                             \
        zoff_free_all(zoff_fa_, sizeof zoff_fa_ / sizeof zoff_fa_[0]);      \
    } while (0)

/* ---- timers ---- */
double zoff_now(void); /* monotonic seconds */
/* The phase clock: seconds since *mark, and *mark moved to now (start-up breakdowns). */
double zoff_lap(double *mark);

/* ---- names ---- */
/* Edit distance (insertions, deletions, substitutions) between two short names, for the
 * "did you mean" of an unknown config key or command-line flag; SIZE_MAX when either is
 * longer than 63 bytes. */
size_t zoff_edit_distance(const char *a, const char *b);

/* ---- sizes ---- */
/* Parse "256MiB", "1.5GB", "4096", "1e9", "80g" into bytes: a number (strtod's), optional spaces, a unit
 * of any case: none or B; K, M, G, T and KiB, MiB, GiB, TiB binary; kB, MB, GB, TB decimal. Else
 * ZOFF_ERR_INVALID, the message listing the units. */
zoff_status zoff_parse_size(const char *text, size_t *out);
/* Format bytes as e.g. "1.50 GiB" into buf. Returns buf. */
const char *zoff_format_bytes(size_t bytes, char *buf, size_t buflen);
/* "1 layer", "4 layers": n and `word` (its plural: word + "s") into buf, for the banners. Returns buf. */
const char *zoff_format_count(int64_t n, const char *word, char *buf, size_t buflen);
/* A model's size for the banners: "1.62M parameters" from a million on, else the count ("8256
 * parameters", "1 parameter"), never "0.0M". Returns buf. */
const char *zoff_format_params(int64_t n, char *buf, size_t buflen);
/* A figure that can get small (a loss, a gradient norm) with at least `digits` significant digits:
 * "%.*f" (digits decimals) from 0.1 up, and 0, inf and nan so; below 0.1 "%.*e" (digits - 1), so that
 * 0.0000123 is "1.230e-05", not "0.0000" (the console, metrics.jsonl). Returns buf. */
const char *zoff_format_fixed(double v, int digits, char *buf, size_t buflen);

/* ---- files ---- */
/* What to do about a failed write's errno, for the end of its message: "; the disk is full: free
 * space, or write elsewhere" (ENOSPC, EDQUOT; the process's advice instead where one is set, see
 * below), "; PATH would pass this process's file size limit (ulimit -f): ..." (EFBIG), else "". A
 * writer with a better hint of its own (checkpoints: keep fewer) gives that one for a full disk,
 * through zoff_disk_full_advice. */
const char *zoff_write_hint(int err);
/* The advice for a full disk (ENOSPC, EDQUOT) at the end of a writer's message: the process's, when
 * one was set, else the writer's own (`own`: checkpoints keep fewer, a swap file another nvme_path).
 * A program whose files are not a training run's sets its own once, before anything is written
 * (zoff bench: free space in --dir, another --dir, a smaller size); it is copied; NULL puts the
 * writers' own back. */
void zoff_set_disk_full_advice(const char *advice);
const char *zoff_disk_full_advice(const char *own);
/* Write `text` to `path` atomically: a temp file beside it (PATH.tmp-PID), fsync,
 * rename, then an fsync of the directory; a failed fsync of the directory is an
 * error when `dir_sync_required`, else ignored (the rename is done). On failure
 * `path` is as it was and no temp file is left. */
zoff_status zoff_write_file_atomic(const char *path, const char *text, bool dir_sync_required);
/* Its first half, for writing several files that appear together: `text` in PATH.tmp-PID, complete
 * and fsynced, its name in *tmp_out (free it) for the caller to rename over `path` (or unlink),
 * then zoff_temp_forget it. On failure no temp file is left and *tmp_out is NULL. */
zoff_status zoff_write_file_staged(const char *path, const char *text, char **tmp_out);
/* Temp files: a writer registers a temp file by its name before creating it (or creates it with
 * zoff_temp_create), and forgets it once it is renamed or removed; with
 * zoff_temp_cleanup_on_signals (the zoff CLI's main calls it), SIGINT, SIGTERM and SIGHUP (Ctrl-C,
 * a job stopped) remove every registered one (a folder with all in it) and then stop the process
 * as the signal would (exit status 130, 143, 129), so that an interrupted tokenize, export or bench
 * leaves no temp file behind. Signals that already have a handler (zoff train's) or are ignored
 * keep it. Up to 32 at a time (more are not removed); forget takes the registered path. */
void zoff_temp_cleanup_on_signals(void);
void zoff_temp_register(const char *path);
void zoff_temp_forget(const char *path);
/* mkstemp (returns the fd) or, with `dir`, mkdtemp (returns 0) of `templ`, registered at once (no
 * signal comes between); -1 with errno on failure. */
int zoff_temp_create(char *templ, bool dir);
/* The folder an output file `path` goes in exists and is writable (checked before any work, so
 * that a wrong path fails at once): ZOFF_OK, or ZOFF_ERR_INVALID (not there, not a folder: what
 * to do) or the errno's status (not writable), naming the folder. */
zoff_status zoff_check_output_parent(const char *path);
/* A folder zoff writes its own files into (what: the config key or flag that names it, for the
 * message): created if missing (its parent must exist); a file of that name, or a folder zoff
 * cannot write into (permissions, a read-only file system), is ZOFF_ERR_INVALID (exit 2). */
zoff_status zoff_make_work_dir(const char *dir, const char *what);
/* `path` can be written as a file (a file there is replaced): not empty, not ending in '/', not an
 * existing folder, and zoff_check_output_parent. ZOFF_OK, or ZOFF_ERR_INVALID saying which and what
 * to give instead, or zoff_check_output_parent's status. */
zoff_status zoff_check_output_file(const char *path);

/* ---- CPU features ---- */
typedef struct zoff_cpu_features {
    bool avx2, fma, f16c;
    bool avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_fp16;
    bool neon;
    int logical_cores;
} zoff_cpu_features;
const zoff_cpu_features *zoff_cpu_features_get(void);

/* ---- half-precision conversion (scalar, round-to-nearest-even) ---- */
float zoff_bf16_to_f32(uint16_t h);
uint16_t zoff_f32_to_bf16(float f);
float zoff_f16_to_f32(uint16_t h);
uint16_t zoff_f32_to_f16(float f);

/* ---- parallel bulk operations on large host buffers (parallel.c) ----
 * OpenMP threads (omp_get_max_threads) over contiguous page-aligned pieces;
 * one thread below 1 MiB. The result does not depend on the thread count. */
int zoff_par_threads(size_t bytes); /* threads these functions use for a buffer of this size */
void zoff_par_memset(void *dst, int byte, size_t bytes);
void zoff_par_memcpy(void *dst, const void *src, size_t bytes); /* no overlap */
void zoff_par_fill_f32(float *dst, float value, size_t n);
void zoff_par_fill_u16(uint16_t *dst, uint16_t value, size_t n);
void zoff_par_f32_to_bf16(uint16_t *dst, const float *src, size_t n); /* zoff_f32_to_bf16 per element */
void zoff_par_f32_to_f16(uint16_t *dst, const float *src, size_t n);  /* zoff_f32_to_f16 per element */
/* dst = src (n bytes, no overlap) on the calling thread where dst is not read soon (a backup, a
 * snapshot): streaming stores on x86 (no read for ownership of dst's lines, the cache left to
 * the caller's work); zoff_store_fence makes them visible before a later release (a flag, a
 * thread's join). */
void zoff_copy_streaming(void *dst, const void *src, size_t n);
void zoff_store_fence(void);

/* ---- counter-based random numbers (rng.c) ---- */
/* Philox4x32-10: out = the 4 x 32 bits at counter ctr under key (Random123's values). */
void zoff_philox4x32(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* dst[i] = std * N(0, 1) number (first + i) of the stream (seed, stream), i < n:
 * a pure function of (seed, stream, index), so any split of a stream into
 * ranges and threads gives the same values. Box-Muller over Philox4x32-10 in
 * fp32 (see rng.c for the exact definition). */
void zoff_rng_normal(uint64_t seed, uint32_t stream, int64_t first, int64_t n, float std, float *dst);

/* ---- checksums ---- */
uint32_t zoff_crc32c(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif
#endif
