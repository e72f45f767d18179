/* Crash-safe checkpoint directories and the .zckpt container (format: include/zoff/ckpt.h). */
#define _GNU_SOURCE /* nftw, O_CLOEXEC, O_DIRECTORY */
#include "zoff/ckpt.h"
#include "ckpt_internal.h"
#include "zoff/aio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "zoff checkpoints store tensor data in little-endian byte order; this host is big-endian"
#endif

#define CK_MAGIC "ZOFFCKPT"
#define CK_HEADER_BYTES 128
#define CK_HEADER_CRC_AT 124
#define CK_ENTRY_BYTES 256
#define CK_PATH 4096
#define CK_RBUF_BYTES ((size_t)4 << 20)  /* verification bounce buffer */
#define CK_IO_CHUNK ((size_t)1 << 30)    /* largest single pread/pwrite */
#define CK_DIRECT_CHUNK ((size_t)8 << 20) /* O_DIRECT read requests */
#define CK_MARKER "COMPLETE"
#define CK_MAX_TAG 64

static const uint8_t g_zeros[ZOFF_CKPT_ALIGN];

/* ------------------------------------------------------------------ little helpers */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static int64_t align_up(int64_t x) { return (x + ZOFF_CKPT_ALIGN - 1) / ZOFF_CKPT_ALIGN * ZOFF_CKPT_ALIGN; }

static bool dtype_valid(zoff_dtype dt) { return (unsigned)dt < (unsigned)ZOFF_DTYPE_COUNT || dt == ZOFF_CKPT_RAW; }

int64_t zoff_ckpt_dtype_bytes(zoff_dtype dt) {
    if (dt == ZOFF_CKPT_RAW) return 1;
    size_t n = zoff_dtype_size(dt);
    return n ? (int64_t)n : 1;
}

const char *zoff_ckpt_dtype_str(zoff_dtype dt) {
    if (dt == ZOFF_CKPT_RAW) return "raw bytes";
    return (unsigned)dt < (unsigned)ZOFF_DTYPE_COUNT ? zoff_dtype_name(dt) : "unknown dtype";
}

bool zoff_ckpt_json_u63(json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (int64_t)x;
    return true;
}

void *zoff_ckpt_grow(void *items, size_t *cap, size_t n, size_t size, size_t first) {
    if (n < *cap) return items;
    size_t c = *cap ? 2 * *cap : first;
    void *p = realloc(items, c * size);
    if (p) *cap = c;
    return p;
}

ptrdiff_t zoff_ckpt_find_sorted(const void *items, const size_t *order, size_t n, const char *name,
                                const char *(*name_of)(const void *items, size_t i)) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name_of(items, order[mid]), name);
        if (c == 0) return (ptrdiff_t)order[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

void zoff_ckpt_free_pairs(char **keys, char **values, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(keys[i]);
        free(values[i]);
    }
    free(keys);
    free(values);
}

const char *zoff_ckpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* Checks name, dtype and shape; *expect = data size implied by them, -1 for "any" (raw, ndim 0). */
static zoff_status check_meta(const char *name, zoff_dtype dtype, int ndim, const int64_t *shape, int64_t *expect) {
    if (!name || !name[0]) return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry name is empty");
    size_t len = strlen(name);
    if (len > ZOFF_CKPT_MAX_NAME)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry name '%.40s...' is %zu bytes long; the limit is %d",
                          name, len, ZOFF_CKPT_MAX_NAME);
    if (!dtype_valid(dtype))
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': invalid dtype %d (expected a zoff_dtype or ZOFF_CKPT_RAW)",
                          name, (int)dtype);
    if (ndim < 0 || ndim > ZOFF_CKPT_MAX_DIMS)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': ndim %d is out of range 0..%d", name, ndim,
                          ZOFF_CKPT_MAX_DIMS);
    if (ndim > 0 && !shape) return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': ndim %d but shape is NULL", name, ndim);
    if (dtype == ZOFF_CKPT_RAW && ndim == 0) {
        *expect = -1;
        return ZOFF_OK;
    }
    int64_t elems = 1, es = zoff_ckpt_dtype_bytes(dtype);
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': dimension %d is negative (%" PRId64 ")", name, i,
                              shape[i]);
        if (shape[i] > 0 && elems > INT64_MAX / es / shape[i])
            return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': shape is too large", name);
        elems *= shape[i];
    }
    *expect = elems * es;
    return ZOFF_OK;
}

static zoff_status path_join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint path '%s/%s' is too long (limit %zu characters)", a, b, cap - 1);
    return ZOFF_OK;
}

/* Copy dir without trailing slashes ("out/" -> "out"). */
static zoff_status norm_dir(const char *dir, char *out, size_t cap) {
    if (!dir || !dir[0]) return zoff_error(ZOFF_ERR_INVALID, "the checkpoint path is empty (''): give a folder");
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (n >= cap) return zoff_error(ZOFF_ERR_INVALID, "checkpoint directory '%s' is too long", dir);
    memcpy(out, dir, n);
    out[n] = '\0';
    return ZOFF_OK;
}

static zoff_status tmp_tag(const zoff_ckpt_options *opts, char *out, size_t cap) {
    if (!opts || !opts->tmp_tag) {
        snprintf(out, cap, "%ld", (long)getpid());
        return ZOFF_OK;
    }
    const char *t = opts->tmp_tag;
    size_t n = strlen(t);
    if (n == 0 || n > CK_MAX_TAG || n >= cap)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint tmp_tag '%s' must be 1..%d characters", t, CK_MAX_TAG);
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return zoff_error(ZOFF_ERR_INVALID, "checkpoint tmp_tag '%s' may only contain letters, digits, '_' and '-'", t);
    }
    memcpy(out, t, n + 1);
    return ZOFF_OK;
}

static zoff_status step_dir_path(const char *dir, int64_t step, const char *suffix, const char *tag, char *out,
                                 size_t cap) {
    int n = snprintf(out, cap, "%s/step_%08" PRId64 "%s%s", dir, step, suffix, tag);
    if (n < 0 || (size_t)n >= cap) return zoff_error(ZOFF_ERR_INVALID, "checkpoint path under '%s' is too long", dir);
    return ZOFF_OK;
}

zoff_status zoff_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap) {
    if (step < 0) return zoff_error(ZOFF_ERR_INVALID, "checkpoint step must be >= 0 (got %" PRId64 ")", step);
    char d[CK_PATH];
    ZOFF_TRY(norm_dir(dir, d, sizeof d));
    return step_dir_path(d, step, "", "", out, cap);
}

static zoff_status rank_file_path(const char *stepdir, int rank, char *out, size_t cap) {
    char name[32];
    snprintf(name, sizeof name, "rank_%05d.zckpt", rank);
    return path_join(out, cap, stepdir, name);
}

/* Directory entry names: "step_<digits>" exactly as written by us, or with a temp/old suffix. */
enum { NAME_OTHER = 0, NAME_STEP, NAME_TMP, NAME_OLD };
static int parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return NAME_OTHER;
    const char *p = name + 5;
    int64_t v = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
        if (v > (INT64_MAX - 9) / 10) return NAME_OTHER;
        v = v * 10 + (*p - '0');
        p++;
        digits++;
    }
    if (digits == 0) return NAME_OTHER;
    char canon[40];
    int cn = snprintf(canon, sizeof canon, "step_%08" PRId64, v);
    if (cn != (int)(p - name) || strncmp(canon, name, (size_t)cn) != 0) return NAME_OTHER;
    *step = v;
    if (*p == '\0') return NAME_STEP;
    if (strncmp(p, ".tmp-", 5) == 0) return NAME_TMP;
    if (strncmp(p, ".old-", 5) == 0) return NAME_OLD;
    return NAME_OTHER;
}

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_marker(const char *stepdir) {
    char p[CK_PATH];
    struct stat st;
    if (snprintf(p, sizeof p, "%s/" CK_MARKER, stepdir) >= (int)sizeof p) return false;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int rm_cb(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    int rc = (type == FTW_DP || type == FTW_D) ? rmdir(path) : unlink(path);
    return (rc != 0 && errno != ENOENT) ? -1 : 0;
}

/* rm -rf path; 0 on success (also when it does not exist), -1 with errno otherwise. */
static int rmtree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    return nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static zoff_status mkdir_p(const char *dir) {
    char p[CK_PATH];
    size_t n = strlen(dir);
    if (n >= sizeof p) return zoff_error(ZOFF_ERR_INVALID, "checkpoint directory '%s' is too long", dir);
    memcpy(p, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return zoff_error(zoff_status_of_path_errno(errno), "cannot create checkpoint directory %s: %s", p,
                              strerror(errno));
        if (!is_dir(p))
            return zoff_error(ZOFF_ERR_INVALID, "cannot create checkpoint directory %s: a file of that name exists", p);
        p[i] = c;
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ the one I/O path */

static zoff_ckpt_io_hook g_hook;
static void *g_hook_user;

void zoff_ckpt_set_io_hook(zoff_ckpt_io_hook hook, void *user) {
    __atomic_store_n(&g_hook_user, user, __ATOMIC_RELEASE);
    __atomic_store_n(&g_hook, hook, __ATOMIC_RELEASE);
}

int64_t zoff_ckpt_io_default(zoff_ckpt_io_op op, int fd, const void *buf, size_t bytes, int64_t offset) {
    switch (op) {
    case ZOFF_CKPT_IO_WRITE: return (int64_t)pwrite(fd, buf, bytes, (off_t)offset);
    case ZOFF_CKPT_IO_FSYNC: return fsync(fd);
    }
    errno = EINVAL;
    return -1;
}

static int64_t io_call(zoff_ckpt_io_op op, const char *path, int fd, const void *buf, size_t n, int64_t off) {
    zoff_ckpt_io_hook h = __atomic_load_n(&g_hook, __ATOMIC_ACQUIRE);
    if (h) return h(__atomic_load_n(&g_hook_user, __ATOMIC_ACQUIRE), op, path, fd, buf, n, off);
    return zoff_ckpt_io_default(op, fd, buf, n, off);
}

zoff_status zoff_ckpt_fault_from_env(zoff_ckpt_fault *f, const char *files) {
    f->at = -1;
    f->err = 0;
    const char *s = getenv("ZOFF_CKPT_FAULT");
    if (!s || !s[0]) return ZOFF_OK;
    const char *at = strchr(s, '@');
    char *end = NULL;
    if (at) {
        errno = 0;
        long long v = strtoll(at + 1, &end, 10);
        if (errno || end == at + 1 || *end || v < 0) at = NULL;
        else f->at = v;
    }
    if (at && (size_t)(at - s) == 6 && strncmp(s, "ENOSPC", 6) == 0) f->err = ENOSPC;
    else if (at && (size_t)(at - s) == 3 && strncmp(s, "EIO", 3) == 0) f->err = EIO;
    else {
        f->at = -1;
        return zoff_error(ZOFF_ERR_INVALID, "ZOFF_CKPT_FAULT='%s' is invalid; expected ENOSPC@<offset> or EIO@<offset>", s);
    }
    zoff_log(ZOFF_LOG_WARN, "ZOFF_CKPT_FAULT=%s: %s writes will fail from that offset on (fault-injection test)", s,
             files);
    return ZOFF_OK;
}

bool zoff_ckpt_fault_allows(const zoff_ckpt_fault *f, int64_t pos, size_t *chunk) {
    if (!f || f->at < 0) return true;
    if (pos >= f->at) {
        errno = f->err;
        return false;
    }
    if (pos + (int64_t)*chunk > f->at) *chunk = (size_t)(f->at - pos);
    return true;
}

static zoff_status write_failed(const char *path, int64_t off, size_t n, int e) {
    const char *hint = "", *full = NULL;
    if (e == ENOSPC || e == EDQUOT) full = zoff_disk_full_advice("free space, or keep fewer checkpoints (--keep-last)");
    else if (e == EIO) hint = "; the storage device reported an I/O error";
    else hint = zoff_write_hint(e);
    return zoff_error(ZOFF_ERR_IO, "cannot write checkpoint file %s at offset %" PRId64 " (%zu bytes): %s%s%s", path, off,
                      n, strerror(e), full ? "; the disk is full: " : hint, full ? full : "");
}

/* Write all n bytes at off. Short writes are continued; a write of 0 bytes is an error. */
static zoff_status io_write_all(const char *path, int fd, const void *buf, size_t n, int64_t off, const zoff_ckpt_fault *fault) {
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < CK_IO_CHUNK ? n - done : CK_IO_CHUNK;
        int64_t pos = off + (int64_t)done;
        int64_t r = zoff_ckpt_fault_allows(fault, pos, &chunk) ? io_call(ZOFF_CKPT_IO_WRITE, path, fd, p + done, chunk, pos)
                                                               : -1;
        if (r < 0) {
            if (errno == EINTR) continue;
            return write_failed(path, pos, n - done, errno);
        }
        if (r == 0)
            return zoff_error(ZOFF_ERR_IO,
                              "short write to checkpoint file %s at offset %" PRId64 ": 0 of %zu bytes were written "
                              "(is the disk full?)",
                              path, pos, n - done);
        if ((uint64_t)r > chunk)
            return zoff_error(ZOFF_ERR_INTERNAL, "write to %s returned %" PRId64 " for a %zu-byte request", path, r, chunk);
        done += (size_t)r;
    }
    return ZOFF_OK;
}

static zoff_status io_fsync(const char *path, int fd) {
    for (;;) {
        if (io_call(ZOFF_CKPT_IO_FSYNC, path, fd, NULL, 0, 0) == 0) return ZOFF_OK;
        if (errno != EINTR) break;
    }
    int e = errno;
    return zoff_error(ZOFF_ERR_IO, "cannot fsync %s: %s%s", path, strerror(e),
                      e == EIO ? "; the storage device reported an I/O error" : "");
}

static zoff_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot open directory %s to fsync it: %s", dir, strerror(errno));
    zoff_status st = io_fsync(dir, fd);
    close(fd);
    return st;
}

/* Read all n bytes at off; end of file is a format error (truncated file). */
static zoff_status io_read_all(const char *path, int fd, void *buf, size_t n, int64_t off) {
    uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < CK_IO_CHUNK ? n - done : CK_IO_CHUNK;
        int64_t pos = off + (int64_t)done;
        ssize_t r = pread(fd, p + done, chunk, (off_t)pos);
        if (r < 0) {
            if (errno == EINTR) continue;
            return zoff_error(ZOFF_ERR_IO, "cannot read checkpoint file %s at offset %" PRId64 " (%zu bytes): %s", path,
                              pos, n - done, strerror(errno));
        }
        if (r == 0)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "unexpected end of checkpoint file %s at offset %" PRId64
                              ": the file is truncated (or changed while being read); use an earlier checkpoint",
                              path, pos);
        done += (size_t)r;
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ header */

typedef struct ck_header {
    uint32_t version, header_bytes, alignment, entry_bytes, rank, flags, index_crc;
    int64_t step;
    uint64_t count, index_offset, index_bytes, file_bytes;
} ck_header;

static void encode_header(const ck_header *h, uint8_t *b /* ZOFF_CKPT_ALIGN bytes */) {
    memset(b, 0, ZOFF_CKPT_ALIGN);
    memcpy(b, CK_MAGIC, 8);
    put_u32(b + 8, h->version);
    put_u32(b + 12, h->header_bytes);
    put_u32(b + 16, h->alignment);
    put_u32(b + 20, h->entry_bytes);
    put_u64(b + 24, (uint64_t)h->step);
    put_u32(b + 32, h->rank);
    put_u32(b + 36, h->flags);
    put_u64(b + 40, h->count);
    put_u64(b + 48, h->index_offset);
    put_u64(b + 56, h->index_bytes);
    put_u64(b + 64, h->file_bytes);
    put_u32(b + 72, h->index_crc);
    put_u32(b + CK_HEADER_CRC_AT, zoff_crc32c(0, b, CK_HEADER_CRC_AT));
}

static const char *corrupt = "the file is corrupt; use an earlier checkpoint";

/* Read and check the header of an open .zckpt file (everything except the index content). */
static zoff_status read_header(const char *path, int fd, ck_header *h) {
    struct stat st;
    if (fstat(fd, &st) != 0) return zoff_error(ZOFF_ERR_IO, "cannot stat checkpoint file %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return zoff_error(ZOFF_ERR_FORMAT, "checkpoint file %s is not a regular file", path);
    int64_t size = (int64_t)st.st_size;
    if (size < CK_HEADER_BYTES)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s is %" PRId64 " bytes, too small for the %d-byte header: the file is "
                          "truncated or not a zoff checkpoint; use an earlier checkpoint",
                          path, size, CK_HEADER_BYTES);
    uint8_t b[CK_HEADER_BYTES];
    ZOFF_TRY(io_read_all(path, fd, b, sizeof b, 0));
    if (memcmp(b, CK_MAGIC, 8) != 0) {
        char m[40];
        for (int i = 0; i < 8; i++) snprintf(m + 2 * i, 3, "%02x", b[i]);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s is not a zoff checkpoint file: its magic number is %s (hex), expected \"" CK_MAGIC "\"",
                          path, m);
    }
    h->version = get_u32(b + 8);
    if (h->version != ZOFF_CKPT_VERSION)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint file %s has format version %u but this zoff reads version %d: %s",
                          path, h->version, ZOFF_CKPT_VERSION,
                          h->version > ZOFF_CKPT_VERSION ? "it was written by a newer zoff; upgrade zoff to load it"
                                                         : corrupt);
    uint32_t stored = get_u32(b + CK_HEADER_CRC_AT), computed = zoff_crc32c(0, b, CK_HEADER_CRC_AT);
    if (stored != computed)
        return zoff_error(ZOFF_ERR_FORMAT, "header checksum mismatch in %s (stored 0x%08x, computed 0x%08x): %s", path,
                          stored, computed, corrupt);
    h->header_bytes = get_u32(b + 12);
    h->alignment = get_u32(b + 16);
    h->entry_bytes = get_u32(b + 20);
    h->step = (int64_t)zoff_ckpt_get_u64(b + 24);
    h->rank = get_u32(b + 32);
    h->flags = get_u32(b + 36);
    h->count = zoff_ckpt_get_u64(b + 40);
    h->index_offset = zoff_ckpt_get_u64(b + 48);
    h->index_bytes = zoff_ckpt_get_u64(b + 56);
    h->file_bytes = zoff_ckpt_get_u64(b + 64);
    h->index_crc = get_u32(b + 72);
    if (h->header_bytes != CK_HEADER_BYTES || h->alignment != ZOFF_CKPT_ALIGN || h->entry_bytes != CK_ENTRY_BYTES ||
        h->flags != 0)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s has an unsupported layout (header %u bytes, alignment %u, index record "
                          "%u bytes, flags 0x%x; expected %d, %d, %d, 0): %s",
                          path, h->header_bytes, h->alignment, h->entry_bytes, h->flags, CK_HEADER_BYTES,
                          ZOFF_CKPT_ALIGN, CK_ENTRY_BYTES, corrupt);
    if (h->file_bytes > (uint64_t)INT64_MAX || (int64_t)h->file_bytes > size)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s is %" PRId64 " bytes but its header says %" PRIu64
                          ": the file is truncated (was the disk full, or a copy interrupted?); use an earlier checkpoint",
                          path, size, h->file_bytes);
    if ((int64_t)h->file_bytes < size)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint file %s is %" PRId64 " bytes but its header says %" PRIu64 ": %s",
                          path, size, h->file_bytes, corrupt);
    if (h->index_offset < ZOFF_CKPT_ALIGN || h->index_offset % ZOFF_CKPT_ALIGN != 0 ||
        h->count > h->file_bytes / CK_ENTRY_BYTES || h->index_bytes != h->count * CK_ENTRY_BYTES ||
        h->index_offset > h->file_bytes || h->file_bytes - h->index_offset != h->index_bytes)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s: index of %" PRIu64 " entries at offset %" PRIu64 " (%" PRIu64
                          " bytes) does not fit a %" PRIu64 "-byte file: %s",
                          path, h->count, h->index_offset, h->index_bytes, h->file_bytes, corrupt);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ writer */

/* The file's bytes after the header block (entries, padding, index) stream through
 * CK_NPIECES aligned piece buffers of CK_PIECE_BYTES (include/zoff/ckpt.h, "How the bytes
 * reach the disk"): the writer fills one while src/aio writes the others. */
#define CK_PIECE_BYTES ((size_t)8 << 20)
#define CK_NPIECES 3
#define CK_CRC_STEP ((size_t)256 << 10) /* copy then checksum this much at a time: it is still in cache */

#define CK_NEXT ZOFF_CKPT_EXTERNAL_IN_FLIGHT /* zoff_ckpt_append_external's writes in flight */

typedef struct ck_piece {
    uint8_t *buf;
    int64_t off; /* file offset of buf[0] */
    size_t len;  /* bytes filled */
    bool busy;   /* handed to aio, not yet waited for */
    zoff_aio_request req;
} ck_piece;

/* One zoff_ckpt_append_external write from the caller's memory, released once it is done. */
typedef struct ck_ext {
    bool busy;
    zoff_aio_request req;
    zoff_ckpt_release_fn release;
    void *ctx;
} ck_ext;

struct zoff_ckpt_writer {
    char dir[CK_PATH], tmpdir[CK_PATH], file[CK_PATH];
    int64_t step;
    int rank;
    int fd; /* buffered: pwrite path, faults, header, ftruncate, fsync */
    bool failed;
    zoff_ckpt_fault fault;
    zoff_ckpt_entry *ents;
    size_t n, cap;
    ck_piece piece[CK_NPIECES];
    int cur; /* the piece being filled */
    ck_ext ext[CK_NEXT];
    int ext_next; /* the next ext to use (the oldest when all are busy) */
    int64_t in_place; /* bytes written from the callers' memory (zoff_ckpt_append_external) */
    zoff_aio *aio; /* NULL: every piece written with pwrite from this thread */
    zoff_aio_file *af;
    int64_t reserved; /* the file's bytes allocated ahead of the aio writes (w_reserve) */
    bool no_reserve;  /* the filesystem cannot (fallocate unsupported) */
    char io[512]; /* zoff_ckpt_writer_io */
    /* the open entry of begin/append/end */
    bool in_entry;
    zoff_ckpt_entry cur_ent;
    int64_t cur_expect; /* -1: any size */
};

static int64_t w_pos(const zoff_ckpt_writer *w) { return w->piece[w->cur].off + (int64_t)w->piece[w->cur].len; }

/* Wait for piece p's aio write; its failure worded like the pwrite path's. */
static zoff_status w_wait_piece(zoff_ckpt_writer *w, ck_piece *p) {
    if (!p->busy) return ZOFF_OK;
    p->busy = false;
    zoff_status s = zoff_aio_wait(w->aio, &p->req);
    if (s == ZOFF_OK) return ZOFF_OK;
    int64_t at = p->off;
    int e = zoff_aio_request_errno(&p->req, &at);
    return e ? write_failed(w->file, at, (size_t)(p->off + (int64_t)p->req.seg[0].bytes - at), e) : s;
}

/* Wait for an external write; its memory goes back to the caller whatever the outcome. */
static zoff_status w_wait_ext(zoff_ckpt_writer *w, ck_ext *x) {
    if (!x->busy) return ZOFF_OK;
    x->busy = false;
    zoff_status s = zoff_aio_wait(w->aio, &x->req);
    int64_t at = x->req.seg[0].offset;
    int e = s == ZOFF_OK ? 0 : zoff_aio_request_errno(&x->req, &at);
    x->release(x->ctx, x->req.seg[0].buf);
    if (s == ZOFF_OK) return ZOFF_OK;
    return e ? write_failed(w->file, at, (size_t)(x->req.seg[0].offset + (int64_t)x->req.seg[0].bytes - at), e) : s;
}

/* The external writes already done, released (their memory goes back to the callers at once). */
static zoff_status w_reap(zoff_ckpt_writer *w) {
    zoff_status first = ZOFF_OK;
    for (int k = 0; k < CK_NEXT; k++) {
        ck_ext *x = &w->ext[k];
        if (!x->busy || !zoff_aio_done(w->aio, &x->req)) continue;
        zoff_status s = w_wait_ext(w, x);
        if (first == ZOFF_OK) first = s;
    }
    return first;
}

/* Every aio write done (external memory released); the first failure is returned, all are waited for. */
static zoff_status w_drain(zoff_ckpt_writer *w) {
    zoff_status first = ZOFF_OK;
    char msg[1536] = "";
    for (int i = 0; i < CK_NPIECES + CK_NEXT; i++) {
        zoff_status s = i < CK_NPIECES ? w_wait_piece(w, &w->piece[(w->cur + 1 + i) % CK_NPIECES]) /* oldest first */
                                       : w_wait_ext(w, &w->ext[(w->ext_next + i - CK_NPIECES) % CK_NEXT]);
        if (s != ZOFF_OK && first == ZOFF_OK) {
            first = s;
            snprintf(msg, sizeof msg, "%s", zoff_last_error());
        }
    }
    return first == ZOFF_OK ? ZOFF_OK : zoff_error(first, "%s", msg);
}

/* The file's blocks allocated (fallocate, unwritten; the size set) through end before an aio write
 * reaches there, in growing steps (twice the last, 16 MiB to 256 MiB ahead): a write within the file's
 * size into allocated blocks is issued by io_uring at once, where one that allocates or extends the file
 * goes to a kernel worker thread (iou-wrk) that takes a core from the training. Measured
 * (docs/performance.md): the in-place writes (1 MiB from unregistered memory, then 16 in flight) spent 0.12 s
 * of CPU per GiB outside the writer's thread without it and 0.05 s with it, and finish sooner; the
 * pieces alone (8 MiB, registered, 3 in flight: the synchronous save) 0.03 s against 0.015 s at the same
 * speed or a few percent slower, so a file is reserved from its first in-place write on. Without room
 * for a step, exactly what the write needs; any failure leaves it to the write (which reports a full disk
 * as it always did). zoff_ckpt_commit cuts the file back to its size. */
static void w_reserve(zoff_ckpt_writer *w, int64_t end) {
    if (w->no_reserve || end <= w->reserved) return;
    const int64_t lo = (int64_t)16 << 20, hi = (int64_t)256 << 20;
    int64_t step = w->reserved < lo ? lo : w->reserved > hi ? hi : w->reserved;
    int64_t want = w->reserved + step > end ? w->reserved + step : end;
    want = align_up(want);
    if (fallocate(w->fd, 0, w->reserved, want - w->reserved) != 0) {
        const int e = errno;
        if (e == EOPNOTSUPP || e == ENOSYS || e == EINVAL) {
            w->no_reserve = true;
            return;
        }
        want = align_up(end);
        if (fallocate(w->fd, 0, w->reserved, want - w->reserved) != 0) return;
    }
    w->reserved = want;
}

/* Write piece p's len bytes: through aio (padded with zeros to ZOFF_CKPT_ALIGN, which only the
 * last piece needs), or, with no aio or when the bytes reach a ZOFF_CKPT_FAULT offset, with
 * pwrite after the writes in flight. */
static zoff_status w_write_piece(zoff_ckpt_writer *w, ck_piece *p) {
    bool faulted = w->fault.at >= 0 && p->off + (int64_t)p->len > w->fault.at;
    if (!w->aio || faulted) {
        if (w->aio) ZOFF_TRY(w_drain(w));
        return io_write_all(w->file, w->fd, p->buf, p->len, p->off, &w->fault);
    }
    size_t padded = (size_t)align_up((int64_t)p->len);
    memset(p->buf + p->len, 0, padded - p->len);
    if (w->reserved > 0) w_reserve(w, p->off + (int64_t)padded); /* a file with in-place writes */
    p->req = (zoff_aio_request){.op = ZOFF_AIO_WRITE, .file = w->af, .nseg = 1,
                                .seg = {{.buf = p->buf, .offset = p->off, .bytes = padded}}};
    ZOFF_TRY(zoff_aio_submit(w->aio, &p->req));
    p->busy = true;
    return ZOFF_OK;
}

/* The filled piece goes to the disk; the next one (its earlier write done) is filled next. */
static zoff_status w_next(zoff_ckpt_writer *w) {
    ck_piece *p = &w->piece[w->cur];
    ZOFF_TRY(w_write_piece(w, p));
    int64_t off = p->off + (int64_t)p->len;
    w->cur = (w->cur + 1) % CK_NPIECES;
    ck_piece *q = &w->piece[w->cur];
    ZOFF_TRY(w_wait_piece(w, q));
    q->off = off;
    q->len = 0;
    return ZOFF_OK;
}

static zoff_status w_put(zoff_ckpt_writer *w, const void *data, size_t n) {
    const uint8_t *d = data;
    while (n > 0) {
        ck_piece *p = &w->piece[w->cur];
        if (zoff_ckpt_fill(p->buf, &p->len, CK_PIECE_BYTES, &d, &n)) ZOFF_TRY(w_next(w));
    }
    return ZOFF_OK;
}

static zoff_status w_pad(zoff_ckpt_writer *w) {
    int64_t pad = align_up(w_pos(w)) - w_pos(w);
    return w_put(w, g_zeros, (size_t)pad);
}

/* Writes in flight finished (errors ignored), the files closed and removed, the temp dir too
 * when empty. */
static void w_cleanup(zoff_ckpt_writer *w) {
    if (w->aio) (void)w_drain(w);
    zoff_aio_file_close(w->af);
    w->af = NULL;
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    if (w->file[0]) unlink(w->file);
    if (w->tmpdir[0] && rmdir(w->tmpdir) == 0) (void)fsync_dir(w->dir);
    zoff_clear_error(); /* keep the caller's message: cleanup errors are secondary */
}

/* Mark the writer failed, remove its files, and add what happened to the message. */
static zoff_status w_fail(zoff_ckpt_writer *w, zoff_status st) {
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", zoff_last_error());
    w->failed = true;
    w_cleanup(w);
    return zoff_error(st, "%s; checkpoint step %" PRId64 " (rank %d) was not saved and its temporary files were removed; "
                          "earlier checkpoints in %s are untouched",
                      msg, w->step, w->rank, w->dir);
}

static zoff_status w_usable(zoff_ckpt_writer *w) {
    if (!w) return zoff_error(ZOFF_ERR_INVALID, "checkpoint writer is NULL");
    if (w->failed)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint writer for step %" PRId64 " already failed; call zoff_ckpt_abort",
                          w->step);
    return ZOFF_OK;
}

/* The process-wide aio fault hook (zoff_aio_set_fault_hook: the NVMe swap tests) is not the
 * checkpoint's: its own injection is ZOFF_CKPT_FAULT and the I/O hook. */
static int64_t no_aio_fault(void *arg, const zoff_aio_fault_site *site) {
    (void)arg;
    (void)site;
    return 0;
}

/* The aio engine and the file opened through it (O_DIRECT where the file system allows);
 * where that cannot be, the pwrite path, with the reason in w->io. */
zoff_status zoff_ckpt_io_buffered(bool *buffered) {
    const char *env = getenv("ZOFF_CKPT_IO");
    if (env && env[0] && strcmp(env, "auto") && strcmp(env, "buffered"))
        return zoff_error(ZOFF_ERR_INVALID, "ZOFF_CKPT_IO='%s' is invalid; expected auto (io_uring, O_DIRECT where the "
                                            "file system allows) or buffered (pwrite, the writer's thread)", env);
    *buffered = env && !strcmp(env, "buffered");
    return ZOFF_OK;
}

static zoff_status w_open_io(zoff_ckpt_writer *w) {
    bool hooked = __atomic_load_n(&g_hook, __ATOMIC_ACQUIRE) != NULL, buffered;
    ZOFF_TRY(zoff_ckpt_io_buffered(&buffered));
    const char *why = hooked ? "an I/O hook is set (tests)" : buffered ? "ZOFF_CKPT_IO=buffered" : NULL;
    if (!why) {
        zoff_aio_options o;
        zoff_aio_options_default(&o);
        o.block_size = (int64_t)CK_PIECE_BYTES; /* one request per piece, as large as the bound's */
        o.queue_depth = CK_NPIECES + CK_NEXT; /* one chunk per piece or external write: all of them in flight */
        o.fault = no_aio_fault;
        for (int i = 0; i < CK_NPIECES; i++) /* the pieces' pages pinned once, not at every request */
            (void)zoff_aio_options_add_fixed(&o, w->piece[i].buf, CK_PIECE_BYTES);
        if (zoff_aio_create(&o, &w->aio) != ZOFF_OK) why = zoff_last_error();
        else if (zoff_aio_file_open(w->aio, w->file, 0, &w->af) != ZOFF_OK) why = zoff_last_error();
    }
    if (why) {
        snprintf(w->io, sizeof w->io, "pwrite from the caller's thread, buffered (%s)", why);
        zoff_aio_destroy(w->aio);
        w->aio = NULL;
        zoff_clear_error();
        return ZOFF_OK;
    }
    bool direct = zoff_aio_file_direct(w->af);
    snprintf(w->io, sizeof w->io, "%s; %s%s%s", zoff_aio_describe(w->aio), direct ? "O_DIRECT" : "buffered",
             direct ? "" : ": ", direct ? "" : zoff_aio_file_direct_note(w->af));
    static int told; /* once per process: why checkpoints go through the page cache */
    if (!direct && !__atomic_exchange_n(&told, 1, __ATOMIC_ACQ_REL))
        zoff_log(ZOFF_LOG_INFO, "checkpoint files are written buffered: %s", zoff_aio_file_direct_note(w->af));
    return ZOFF_OK;
}

const char *zoff_ckpt_writer_io(const zoff_ckpt_writer *w) { return w ? w->io : ""; }
int64_t zoff_ckpt_writer_in_place(const zoff_ckpt_writer *w) { return w ? w->in_place : 0; }
size_t zoff_ckpt_writer_buffer_bytes(void) { return CK_NPIECES * CK_PIECE_BYTES; }
int64_t zoff_ckpt_entry_span(int64_t bytes) { return bytes > 0 ? align_up(bytes) : 0; }
int64_t zoff_ckpt_file_bytes(size_t count, int64_t spans) {
    return ZOFF_CKPT_ALIGN + spans + (int64_t)count * CK_ENTRY_BYTES;
}

static void w_free(zoff_ckpt_writer *w) {
    if (w->aio) (void)w_drain(w);
    zoff_aio_file_close(w->af);
    zoff_aio_destroy(w->aio);
    if (w->fd >= 0) close(w->fd);
    for (int i = 0; i < CK_NPIECES; i++) zoff_aligned_free(w->piece[i].buf);
    free(w->ents);
    free(w);
}

/* The step's temp dir and this rank's file in it (fd: buffered). */
static zoff_status w_create_file(zoff_ckpt_writer *w, const char *dir, const zoff_ckpt_options *opts) {
    char tag[CK_MAX_TAG + 1], stepdir[CK_PATH], tmpdir[CK_PATH], file[CK_PATH];
    ZOFF_TRY(norm_dir(dir, w->dir, sizeof w->dir));
    ZOFF_TRY(tmp_tag(opts, tag, sizeof tag));
    ZOFF_TRY(step_dir_path(w->dir, w->step, "", "", stepdir, sizeof stepdir));
    ZOFF_TRY(zoff_ckpt_fault_from_env(&w->fault, "checkpoint"));
    if (has_marker(stepdir) && !(opts && opts->overwrite))
        return zoff_error(ZOFF_ERR_INVALID,
                          "checkpoint %s already exists and is complete; refusing to overwrite it: save to another "
                          "directory, or move it away first",
                          stepdir);
    ZOFF_TRY(mkdir_p(w->dir));
    ZOFF_TRY(step_dir_path(w->dir, w->step, ".tmp-", tag, tmpdir, sizeof tmpdir));
    if (mkdir(tmpdir, 0755) != 0 && !(errno == EEXIST && is_dir(tmpdir)))
        return zoff_error(ZOFF_ERR_IO, "cannot create checkpoint directory %s: %s", tmpdir, strerror(errno));
    memcpy(w->tmpdir, tmpdir, sizeof tmpdir);
    ZOFF_TRY(rank_file_path(w->tmpdir, w->rank, file, sizeof file));
    w->fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot create checkpoint file %s: %s", file, strerror(errno));
    memcpy(w->file, file, sizeof file);
    return ZOFF_OK;
}

zoff_status zoff_ckpt_writer_open(const char *dir, int64_t step, int rank, const zoff_ckpt_options *opts,
                                  zoff_ckpt_writer **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_writer_open: out is NULL");
    *out = NULL;
    if (step < 0) return zoff_error(ZOFF_ERR_INVALID, "checkpoint step must be >= 0 (got %" PRId64 ")", step);
    if (rank < 0) return zoff_error(ZOFF_ERR_INVALID, "checkpoint rank must be >= 0 (got %d)", rank);
    zoff_ckpt_writer *w = calloc(1, sizeof *w);
    if (!w) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory allocating a checkpoint writer");
    w->fd = -1;
    w->step = step;
    w->rank = rank;
    w->piece[0].off = ZOFF_CKPT_ALIGN; /* the header block is written last */
    zoff_status st = w_create_file(w, dir, opts);
    for (int i = 0; st == ZOFF_OK && i < CK_NPIECES; i++)
        if (!(w->piece[i].buf = zoff_aligned_alloc(ZOFF_CKPT_ALIGN, CK_PIECE_BYTES, "checkpoint piece buffer")))
            st = ZOFF_ERR_NOMEM;
    if (st == ZOFF_OK) st = w_open_io(w);
    if (st != ZOFF_OK) {
        char msg[1536];
        snprintf(msg, sizeof msg, "%s", zoff_last_error());
        w_cleanup(w);
        w_free(w);
        return zoff_error(st, "%s", msg);
    }
    *out = w;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_begin_entry(zoff_ckpt_writer *w, const char *name, zoff_dtype dtype, int ndim,
                                  const int64_t *shape) {
    ZOFF_TRY(w_usable(w));
    zoff_status st;
    int64_t expect = 0;
    if (w->in_entry)
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "cannot begin checkpoint entry '%s': entry '%s' is still open "
                                                      "(call zoff_ckpt_end_entry first)",
                                    name ? name : "(null)", w->cur_ent.name));
    if ((st = check_meta(name, dtype, ndim, shape, &expect)) != ZOFF_OK) return w_fail(w, st);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->ents[i].name, name) == 0)
            return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s' was added twice", name));
    if ((st = w_pad(w)) != ZOFF_OK) return w_fail(w, st);
    memset(&w->cur_ent, 0, sizeof w->cur_ent);
    snprintf(w->cur_ent.name, sizeof w->cur_ent.name, "%s", name);
    w->cur_ent.dtype = dtype;
    w->cur_ent.ndim = ndim;
    for (int i = 0; i < ndim; i++) w->cur_ent.shape[i] = shape[i];
    w->cur_ent.offset = w_pos(w);
    w->cur_expect = expect;
    w->in_entry = true;
    return ZOFF_OK;
}

/* `bytes` more for the open entry: within its shape? */
static zoff_status w_check_append(zoff_ckpt_writer *w, size_t bytes) {
    ZOFF_TRY(w_usable(w));
    if (!w->in_entry)
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_append without zoff_ckpt_begin_entry"));
    if (w->cur_expect >= 0 && (uint64_t)bytes > (uint64_t)(w->cur_expect - w->cur_ent.bytes)) {
        char s[256];
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID,
                                    "checkpoint entry '%s': %" PRId64 " + %zu bytes appended, more than its shape %s of "
                                    "%s holds (%" PRId64 " bytes)",
                                    w->cur_ent.name, w->cur_ent.bytes, bytes,
                                    zoff_ckpt_shape_str(w->cur_ent.ndim, w->cur_ent.shape, s, sizeof s),
                                    zoff_ckpt_dtype_str(w->cur_ent.dtype), w->cur_expect));
    }
    return ZOFF_OK;
}

zoff_status zoff_ckpt_append_space(zoff_ckpt_writer *w, void **dst, size_t *cap) {
    ZOFF_TRY(w_check_append(w, 0));
    ck_piece *p = &w->piece[w->cur];
    size_t c = CK_PIECE_BYTES - p->len;
    if (w->cur_expect >= 0 && (uint64_t)c > (uint64_t)(w->cur_expect - w->cur_ent.bytes))
        c = (size_t)(w->cur_expect - w->cur_ent.bytes);
    *dst = p->buf + p->len;
    *cap = c;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_append_done(zoff_ckpt_writer *w, size_t bytes) {
    ZOFF_TRY(w_check_append(w, bytes));
    ck_piece *p = &w->piece[w->cur];
    if (bytes > CK_PIECE_BYTES - p->len)
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': %zu bytes appended in place, more than "
                                                      "zoff_ckpt_append_space offered (%zu)",
                                    w->cur_ent.name, bytes, CK_PIECE_BYTES - p->len));
    w->cur_ent.crc32c = zoff_crc32c(w->cur_ent.crc32c, p->buf + p->len, bytes);
    p->len += bytes;
    w->cur_ent.bytes += (int64_t)bytes;
    zoff_status st = p->len == CK_PIECE_BYTES ? w_next(w) : ZOFF_OK;
    return st == ZOFF_OK ? ZOFF_OK : w_fail(w, st);
}

zoff_status zoff_ckpt_append(zoff_ckpt_writer *w, const void *data, size_t bytes) {
    ZOFF_TRY(w_check_append(w, bytes));
    if (bytes && !data)
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': data is NULL", w->cur_ent.name));
    const uint8_t *d = data;
    while (bytes > 0) {
        void *dst = NULL;
        size_t cap = 0;
        ZOFF_TRY(zoff_ckpt_append_space(w, &dst, &cap));
        size_t k = bytes < cap ? bytes : cap;
        if (k > CK_CRC_STEP) k = CK_CRC_STEP;
        memcpy(dst, d, k);
        ZOFF_TRY(zoff_ckpt_append_done(w, k));
        d += k;
        bytes -= k;
    }
    return ZOFF_OK;
}

zoff_status zoff_ckpt_append_external(zoff_ckpt_writer *w, const void *data, size_t bytes, zoff_ckpt_release_fn release,
                                      void *ctx) {
    zoff_status s = w_check_append(w, bytes);
    if (s == ZOFF_OK && bytes && !data)
        s = w_fail(w, zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s': data is NULL", w->cur_ent.name));
    const int64_t pos = s == ZOFF_OK ? w_pos(w) : 0;
    const bool direct = s == ZOFF_OK && w->aio && bytes > 0 && (uintptr_t)data % ZOFF_CKPT_ALIGN == 0 &&
                        bytes % ZOFF_CKPT_ALIGN == 0 && pos % ZOFF_CKPT_ALIGN == 0 &&
                        !(w->fault.at >= 0 && pos + (int64_t)bytes > w->fault.at);
    if (!direct) { /* copied through the pieces (pwrite path, an unaligned part, a fault to inject) */
        if (s == ZOFF_OK) s = zoff_ckpt_append(w, data, bytes);
        release(ctx, data);
        return s;
    }
    w->cur_ent.crc32c = zoff_crc32c(w->cur_ent.crc32c, data, bytes);
    s = w_reap(w);
    if (s == ZOFF_OK && w->piece[w->cur].len > 0) s = w_next(w); /* the bytes before pos go first */
    ck_ext *x = &w->ext[w->ext_next];
    if (s == ZOFF_OK) s = w_wait_ext(w, x);
    if (s == ZOFF_OK) w_reserve(w, pos + (int64_t)bytes);
    if (s == ZOFF_OK) {
        x->req = (zoff_aio_request){.op = ZOFF_AIO_WRITE, .file = w->af, .nseg = 1,
                                    .seg = {{.buf = (void *)data, .offset = pos, .bytes = bytes}}};
        x->release = release;
        x->ctx = ctx;
        s = zoff_aio_submit(w->aio, &x->req);
    }
    if (s != ZOFF_OK) {
        release(ctx, data);
        return w_fail(w, s);
    }
    x->busy = true;
    w->ext_next = (w->ext_next + 1) % CK_NEXT;
    w->piece[w->cur].off = pos + (int64_t)bytes; /* the current piece is empty: it goes on after them */
    w->cur_ent.bytes += (int64_t)bytes;
    w->in_place += (int64_t)bytes;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_reap_external(zoff_ckpt_writer *w) {
    ZOFF_TRY(w_usable(w));
    zoff_status s = w_reap(w);
    return s == ZOFF_OK ? ZOFF_OK : w_fail(w, s);
}

zoff_status zoff_ckpt_end_entry(zoff_ckpt_writer *w) {
    ZOFF_TRY(w_usable(w));
    if (!w->in_entry)
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_end_entry without zoff_ckpt_begin_entry"));
    if (w->cur_expect >= 0 && w->cur_ent.bytes != w->cur_expect) {
        char s[256];
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID,
                                    "checkpoint entry '%s': %" PRId64 " bytes were appended but its shape %s of %s "
                                    "needs %" PRId64,
                                    w->cur_ent.name, w->cur_ent.bytes,
                                    zoff_ckpt_shape_str(w->cur_ent.ndim, w->cur_ent.shape, s, sizeof s),
                                    zoff_ckpt_dtype_str(w->cur_ent.dtype), w->cur_expect));
    }
    if (!ZOFF_CKPT_GROW(w->ents, w->cap, w->n, 64))
        return w_fail(w, zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the checkpoint index"));
    w->ents[w->n++] = w->cur_ent;
    w->in_entry = false;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_add(zoff_ckpt_writer *w, const char *name, zoff_dtype dtype, int ndim, const int64_t *shape,
                          const void *data, size_t bytes) {
    ZOFF_TRY(w_usable(w));
    int64_t expect = 0;
    zoff_status st = check_meta(name, dtype, ndim, shape, &expect);
    if (st != ZOFF_OK) return w_fail(w, st);
    if (expect >= 0 && (uint64_t)expect != (uint64_t)bytes) {
        char s[256];
        return w_fail(w, zoff_error(ZOFF_ERR_INVALID,
                                    "checkpoint entry '%s': shape %s of %s is %" PRId64 " bytes but %zu bytes were given",
                                    name, zoff_ckpt_shape_str(ndim, shape, s, sizeof s), zoff_ckpt_dtype_str(dtype), expect, bytes));
    }
    ZOFF_TRY(zoff_ckpt_begin_entry(w, name, dtype, ndim, shape));
    ZOFF_TRY(zoff_ckpt_append(w, data, bytes));
    return zoff_ckpt_end_entry(w);
}

zoff_status zoff_ckpt_add_blob(zoff_ckpt_writer *w, const char *name, const void *data, size_t bytes) {
    return zoff_ckpt_add(w, name, ZOFF_CKPT_RAW, 0, NULL, data, bytes);
}

static void encode_entry(const zoff_ckpt_entry *e, uint8_t *b /* CK_ENTRY_BYTES */) {
    memset(b, 0, CK_ENTRY_BYTES);
    memcpy(b, e->name, strlen(e->name)); /* <= 127 bytes; the rest stays NUL */
    put_u32(b + 128, (uint32_t)e->dtype);
    put_u32(b + 132, (uint32_t)e->ndim);
    for (int i = 0; i < ZOFF_CKPT_MAX_DIMS; i++) put_u64(b + 136 + 8 * i, (uint64_t)(i < e->ndim ? e->shape[i] : 0));
    put_u64(b + 200, (uint64_t)e->offset);
    put_u64(b + 208, (uint64_t)e->bytes);
    put_u32(b + 216, e->crc32c);
}

/* The last piece out, every write done, and (aio: the last piece was padded to the alignment)
 * the file cut back to its size. */
static zoff_status w_flush_end(zoff_ckpt_writer *w, uint64_t file_bytes) {
    ck_piece *p = &w->piece[w->cur];
    if (p->len > 0) ZOFF_TRY(w_write_piece(w, p));
    if (w->aio) ZOFF_TRY(w_drain(w));
    if (w->aio && ftruncate(w->fd, (off_t)file_bytes) != 0)
        return zoff_error(ZOFF_ERR_IO, "cannot set the size of checkpoint file %s to %" PRIu64 " bytes: %s", w->file,
                          file_bytes, strerror(errno));
    return ZOFF_OK;
}

static zoff_status w_finish(zoff_ckpt_writer *w) {
    if (w->in_entry)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint entry '%s' was begun but never ended (zoff_ckpt_end_entry)",
                          w->cur_ent.name);
    ZOFF_TRY(w_pad(w));
    ck_header h = {.version = ZOFF_CKPT_VERSION,
                   .header_bytes = CK_HEADER_BYTES,
                   .alignment = ZOFF_CKPT_ALIGN,
                   .entry_bytes = CK_ENTRY_BYTES,
                   .step = w->step,
                   .rank = (uint32_t)w->rank,
                   .count = w->n,
                   .index_offset = (uint64_t)w_pos(w),
                   .index_bytes = (uint64_t)w->n * CK_ENTRY_BYTES};
    uint32_t crc = 0;
    for (size_t i = 0; i < w->n; i++) {
        uint8_t rec[CK_ENTRY_BYTES];
        encode_entry(&w->ents[i], rec);
        crc = zoff_crc32c(crc, rec, sizeof rec);
        ZOFF_TRY(w_put(w, rec, sizeof rec));
    }
    h.index_crc = crc;
    h.file_bytes = (uint64_t)zoff_ckpt_file_bytes(w->n, (int64_t)h.index_offset - ZOFF_CKPT_ALIGN); /* = index end */
    ZOFF_TRY(w_flush_end(w, h.file_bytes));
    uint8_t hb[ZOFF_CKPT_ALIGN];
    encode_header(&h, hb);
    ZOFF_TRY(io_write_all(w->file, w->fd, hb, sizeof hb, 0, &w->fault));
    ZOFF_TRY(io_fsync(w->file, w->fd));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) return zoff_error(ZOFF_ERR_IO, "cannot close checkpoint file %s: %s", w->file, strerror(errno));
    return ZOFF_OK;
}

zoff_status zoff_ckpt_commit(zoff_ckpt_writer *w) {
    zoff_status st = w_usable(w);
    if (st != ZOFF_OK) {
        if (w) w_free(w);
        return st;
    }
    st = w_finish(w);
    if (st != ZOFF_OK) st = w_fail(w, st);
    w_free(w);
    return st;
}

void zoff_ckpt_abort(zoff_ckpt_writer *w) {
    if (!w) return;
    if (!w->failed) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", zoff_last_error());
        w_cleanup(w);
        zoff_error(ZOFF_OK, "%s", msg); /* abort keeps the caller's error message */
    }
    w_free(w);
}

/* ------------------------------------------------------------------ COMPLETE marker */

static zoff_status read_marker(const char *stepdir, int64_t *step, int *nranks) {
    char p[CK_PATH], text[512];
    ZOFF_TRY(path_join(p, sizeof p, stepdir, CK_MARKER));
    FILE *f = fopen(p, "rb");
    if (!f) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", p, strerror(errno));
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    long long s = -1, r = -1;
    int version = 0;
    if (sscanf(text, "zoff-checkpoint %d\nstep %lld\nranks %lld", &version, &s, &r) != 3 || version != 1 || s < 0 ||
        r < 1 || r > 1000000)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "completion marker %s is malformed (expected \"zoff-checkpoint 1\\nstep N\\nranks N\\n\"): "
                          "the checkpoint is corrupt; use an earlier checkpoint",
                          p);
    *step = s;
    *nranks = (int)r;
    return ZOFF_OK;
}

static int marker_text(char *text, size_t cap, int64_t step, int nranks) {
    return snprintf(text, cap, "zoff-checkpoint 1\nstep %" PRId64 "\nranks %d\n", step, nranks);
}
size_t zoff_ckpt_marker_bytes(int64_t step, int nranks) {
    char text[128];
    return (size_t)marker_text(text, sizeof text, step, nranks);
}

static zoff_status write_marker(const char *stepdir, int64_t step, int nranks) {
    char p[CK_PATH], text[128];
    ZOFF_TRY(path_join(p, sizeof p, stepdir, CK_MARKER));
    int n = marker_text(text, sizeof text, step, nranks);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot create %s: %s", p, strerror(errno));
    zoff_status st = io_write_all(p, fd, text, (size_t)n, 0, NULL);
    if (st == ZOFF_OK) st = io_fsync(p, fd);
    if (close(fd) != 0 && st == ZOFF_OK) st = zoff_error(ZOFF_ERR_IO, "cannot close %s: %s", p, strerror(errno));
    if (st == ZOFF_OK) st = fsync_dir(stepdir);
    return st;
}

/* ------------------------------------------------------------------ finalize */

static zoff_status check_rank_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s (did this rank's zoff_ckpt_commit succeed?)", path,
                          strerror(errno));
    ck_header h;
    zoff_status st = read_header(path, fd, &h);
    close(fd);
    return st;
}

/* After a successful save: remove the temp dirs that other (dead) writers left in dir, i.e.
 * step_X.tmp-<tag> with a tag other than this save's (a crash or kill during a save, or during
 * a prune). Each holds up to a whole checkpoint, so without this every interrupted save would
 * leak that much disk. The ranks of one save share a tag and commit before finalize, so no
 * live writer of this job is touched. Best effort: failures are logged. */
static void remove_stale_tmp(const char *dir, const char *tag) {
    DIR *d = opendir(dir);
    if (!d) return;
    bool removed = false;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int64_t s;
        if (parse_step_name(de->d_name, &s) != NAME_TMP) continue;
        const char *t = strstr(de->d_name, ".tmp-") + 5;
        if (strcmp(t, tag) == 0) continue;
        char p[CK_PATH];
        if (path_join(p, sizeof p, dir, de->d_name) != ZOFF_OK) continue;
        if (rmtree(p) == 0) {
            zoff_log(ZOFF_LOG_INFO, "removed %s, left by an interrupted checkpoint save", p);
            removed = true;
        } else {
            zoff_log(ZOFF_LOG_WARN, "could not remove %s (left by an interrupted checkpoint save): %s", p,
                     strerror(errno));
        }
    }
    closedir(d);
    if (removed) (void)fsync_dir(dir);
}

zoff_status zoff_ckpt_finalize(const char *dir_in, int64_t step, int nranks, const zoff_ckpt_options *opts) {
    char dir[CK_PATH], tag[CK_MAX_TAG + 1], tmpdir[CK_PATH], stepdir[CK_PATH], olddir[CK_PATH], p[CK_PATH];
    if (step < 0) return zoff_error(ZOFF_ERR_INVALID, "checkpoint step must be >= 0 (got %" PRId64 ")", step);
    if (nranks < 1) return zoff_error(ZOFF_ERR_INVALID, "checkpoint nranks must be >= 1 (got %d)", nranks);
    ZOFF_TRY(norm_dir(dir_in, dir, sizeof dir));
    ZOFF_TRY(tmp_tag(opts, tag, sizeof tag));
    ZOFF_TRY(step_dir_path(dir, step, ".tmp-", tag, tmpdir, sizeof tmpdir));
    ZOFF_TRY(step_dir_path(dir, step, "", "", stepdir, sizeof stepdir));
    ZOFF_TRY(step_dir_path(dir, step, ".old-", tag, olddir, sizeof olddir));
    if (!is_dir(tmpdir))
        return zoff_error(ZOFF_ERR_IO,
                          "cannot finalize checkpoint step %" PRId64 ": %s does not exist (did every rank's "
                          "zoff_ckpt_commit succeed, with the same tmp_tag?)",
                          step, tmpdir);
    zoff_status st = ZOFF_OK;
    for (int r = 0; r < nranks && st == ZOFF_OK; r++) {
        st = rank_file_path(tmpdir, r, p, sizeof p);
        if (st == ZOFF_OK) st = check_rank_file(p);
    }
    if (st == ZOFF_OK && rank_file_path(tmpdir, nranks, p, sizeof p) == ZOFF_OK && access(p, F_OK) == 0)
        st = zoff_error(ZOFF_ERR_INVALID, "cannot finalize checkpoint %s for %d rank(s): it also holds %s", tmpdir, nranks,
                        p);
    /* COMPLETE goes into the temp dir (fsynced with it) before the rename, so the rename is the
     * commit point: a crash never leaves a DIR/step_X without its marker */
    if (st == ZOFF_OK) st = write_marker(tmpdir, step, nranks);
    bool moved_old = false;
    if (st == ZOFF_OK && is_dir(stepdir)) {
        if (has_marker(stepdir)) {
            if (!(opts && opts->overwrite))
                st = zoff_error(ZOFF_ERR_INVALID,
                                "checkpoint %s already exists and is complete; refusing to overwrite it: save to "
                                "another directory, or move it away first",
                                stepdir);
            else if (rmtree(olddir) != 0 || rename(stepdir, olddir) != 0)
                st = zoff_error(ZOFF_ERR_IO, "cannot move the old checkpoint %s aside to %s: %s", stepdir, olddir,
                                strerror(errno));
            else moved_old = true;
        } else {
            zoff_log(ZOFF_LOG_WARN, "replacing incomplete checkpoint directory %s (no " CK_MARKER " marker)", stepdir);
            if (rmtree(stepdir) != 0)
                st = zoff_error(ZOFF_ERR_IO, "cannot remove the incomplete checkpoint %s: %s", stepdir, strerror(errno));
        }
    }
    bool renamed = false;
    if (st == ZOFF_OK) {
        if (rename(tmpdir, stepdir) != 0)
            st = zoff_error(ZOFF_ERR_IO, "cannot rename %s to %s: %s", tmpdir, stepdir, strerror(errno));
        else renamed = true;
    }
    if (st == ZOFF_OK) st = fsync_dir(dir);
    if (st == ZOFF_OK) {
        if (moved_old) {
            if (rmtree(olddir) != 0)
                zoff_log(ZOFF_LOG_WARN, "could not remove the overwritten checkpoint %s: %s", olddir, strerror(errno));
            (void)fsync_dir(dir);
        }
        remove_stale_tmp(dir, tag);
        zoff_clear_error();
        return ZOFF_OK;
    }
    /* failure: remove what this call made, put an overwritten checkpoint back */
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", zoff_last_error());
    rmtree(renamed ? stepdir : tmpdir);
    if (moved_old && rename(olddir, stepdir) != 0)
        zoff_log(ZOFF_LOG_ERROR, "could not move the previous checkpoint %s back to %s: %s; rename it by hand", olddir,
                 stepdir, strerror(errno));
    (void)fsync_dir(dir);
    return zoff_error(st, "%s; checkpoint step %" PRId64 " was not saved and its temporary files were removed; "
                          "earlier checkpoints in %s are untouched",
                      msg, step, dir);
}

zoff_status zoff_ckpt_discard(const char *dir_in, int64_t step, const zoff_ckpt_options *opts) {
    char dir[CK_PATH], tag[CK_MAX_TAG + 1], tmpdir[CK_PATH];
    ZOFF_TRY(norm_dir(dir_in, dir, sizeof dir));
    ZOFF_TRY(tmp_tag(opts, tag, sizeof tag));
    ZOFF_TRY(step_dir_path(dir, step, ".tmp-", tag, tmpdir, sizeof tmpdir));
    if (rmtree(tmpdir) != 0) return zoff_error(ZOFF_ERR_IO, "cannot remove %s: %s", tmpdir, strerror(errno));
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ finding checkpoints */

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Whether a folder the listing passes over (path p) was already said in this process: each such
 * folder is said once, not at every listing of its directory (a run lists it several times: the
 * resume, --load, each save's pruning). Past CK_TOLD_MAX paths, they are said again. */
#define CK_TOLD_MAX 256
static bool told_before(const char *p) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char *told[CK_TOLD_MAX];
    static size_t n;
    bool found = false;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < n && !found; i++) found = !strcmp(told[i], p);
    if (!found && n < CK_TOLD_MAX && (told[n] = strdup(p)) != NULL) n++;
    pthread_mutex_unlock(&mu);
    return found;
}

/* Sorted (ascending) steps of the complete checkpoints under dir; with log, the folders passed over
 * are said (once per path and process, told_before). */
static zoff_status list_complete(const char *dir, bool log, int64_t **out, size_t *count) {
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return zoff_error(ZOFF_ERR_IO, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
    int64_t *v = NULL;
    size_t n = 0, cap = 0;
    zoff_status st = ZOFF_OK;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno) st = zoff_error(ZOFF_ERR_IO, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
            break;
        }
        int64_t step;
        int kind = parse_step_name(de->d_name, &step);
        char p[CK_PATH];
        if (kind == NAME_OTHER || snprintf(p, sizeof p, "%s/%s", dir, de->d_name) >= (int)sizeof p || !is_dir(p)) continue;
        if (kind == NAME_STEP && has_marker(p)) {
            if (!ZOFF_CKPT_GROW(v, cap, n, 16)) {
                st = zoff_error(ZOFF_ERR_NOMEM, "out of host memory listing checkpoints in %s", dir);
                break;
            }
            v[n++] = step;
            continue;
        }
        if (!log || told_before(p)) continue;
        if (kind == NAME_TMP)
            zoff_log(ZOFF_LOG_INFO, "ignoring %s: a checkpoint still being written, or left by an interrupted run", p);
        else if (kind == NAME_OLD)
            zoff_log(ZOFF_LOG_WARN, "ignoring %s: an overwritten checkpoint left by an interrupted save", p);
        else
            zoff_log(ZOFF_LOG_WARN, "ignoring incomplete checkpoint %s (no " CK_MARKER " marker: it was interrupted "
                                    "while being written)",
                     p);
    }
    closedir(d);
    if (st != ZOFF_OK) {
        free(v);
        return st;
    }
    if (n) qsort(v, n, sizeof *v, cmp_i64);
    *out = v;
    *count = n;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_count(const char *dir_in, size_t *count) {
    if (!count) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_count: count is NULL");
    *count = 0;
    char dir[CK_PATH];
    ZOFF_TRY(norm_dir(dir_in, dir, sizeof dir));
    int64_t *v;
    ZOFF_TRY(list_complete(dir, false, &v, count));
    free(v);
    return ZOFF_OK;
}

zoff_status zoff_ckpt_latest(const char *dir_in, int64_t *step) {
    if (!step) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_latest: step is NULL");
    *step = -1;
    char dir[CK_PATH];
    ZOFF_TRY(norm_dir(dir_in, dir, sizeof dir));
    int64_t *v;
    size_t n;
    ZOFF_TRY(list_complete(dir, true, &v, &n));
    if (n) *step = v[n - 1];
    free(v);
    return ZOFF_OK;
}

/* "step_<digits>" with any number of digits (step_3, step_003): the step a user means by it. */
static bool loose_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return false;
    int64_t v = 0;
    for (const char *q = name + 5; *q; q++) {
        if (*q < '0' || *q > '9' || v > (INT64_MAX - 9) / 10) return false;
        v = v * 10 + (*q - '0');
    }
    *step = v;
    return true;
}

/* For a step directory that is not there: "; its folder holds complete checkpoints at steps 5, 6,
 * 7" (the newest few), or "; its folder holds no complete checkpoint", into hint; empty when the
 * path is no step directory or its folder cannot be read. A name that is not the folder's spelling
 * (step_3 for step_00000003) gets the spelling, and the path to give when that step is there. */
static void missing_step_hint(const char *p, char *hint, size_t cap) {
    hint[0] = '\0';
    char parent[CK_PATH];
    snprintf(parent, sizeof parent, "%s", p);
    char *slash = strrchr(parent, '/');
    const char *base = slash ? slash + 1 : parent;
    int64_t step, *v = NULL;
    if (!loose_step_name(base, &step)) return;
    const bool canon = parse_step_name(base, &step) == NAME_STEP;
    if (slash == parent) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(parent, sizeof parent, ".");
    size_t n = 0;
    if (list_complete(parent, false, &v, &n) != ZOFF_OK) {
        zoff_clear_error();
        return;
    }
    bool there = false;
    for (size_t i = 0; i < n; i++) there = there || v[i] == step;
    char want[CK_PATH];
    if (!canon && there && step_dir_path(parent, step, "", "", want, sizeof want) == ZOFF_OK) {
        snprintf(hint, cap, "; step folders are named step_%08" PRId64 ": --load %s", step, want);
    } else if (n == 0) {
        snprintf(hint, cap, "; its folder holds no complete checkpoint");
    } else {
        enum { SHOWN = 8 };
        size_t first = n > SHOWN ? n - SHOWN : 0, used = 0;
        int m = snprintf(hint, cap, "; its folder holds complete checkpoints at step%s %s", n == 1 ? "" : "s",
                         first ? "..., " : "");
        used = m > 0 && (size_t)m < cap ? (size_t)m : cap - 1;
        for (size_t i = first; i < n && used < cap - 1; i++) {
            m = snprintf(hint + used, cap - used, "%s%" PRId64, i > first ? ", " : "", v[i]);
            used = m > 0 && (size_t)m < cap - used ? used + (size_t)m : cap - 1;
        }
        if (!canon && used < cap - 1)
            snprintf(hint + used, cap - used, " (folders named like step_%08" PRId64 ")", v[n - 1]);
    }
    free(v);
}

zoff_status zoff_ckpt_resolve(const char *path, char *out, size_t cap, int64_t *step_out) {
    char p[CK_PATH], stepdir[CK_PATH];
    ZOFF_TRY(norm_dir(path, p, sizeof p));
    struct stat st;
    if (stat(p, &st) != 0) {
        int e = errno;
        char have[CK_PATH + 160] = "";
        missing_step_hint(p, have, sizeof have);
        return zoff_error(zoff_status_of_path_errno(e), "cannot open checkpoint %s: %s%s", p, strerror(e), have);
    }
    if (!S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID,
                          "checkpoint %s is not a directory: give the output directory (e.g. out) or one step "
                          "directory (e.g. out/step_00000100)",
                          p);
    int64_t step = -1;
    int nranks = 0;
    if (has_marker(p)) {
        ZOFF_TRY(read_marker(p, &step, &nranks));
        memcpy(stepdir, p, sizeof stepdir);
    } else {
        const char *base = strrchr(p, '/');
        base = base ? base + 1 : p;
        int64_t s;
        if (parse_step_name(base, &s) != NAME_OTHER)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint %s is incomplete (no " CK_MARKER " marker: it was interrupted while being "
                              "written); use an earlier checkpoint, or give its parent directory to load the newest "
                              "complete one",
                              p);
        int64_t *v;
        size_t n;
        ZOFF_TRY(list_complete(p, true, &v, &n));
        if (n) step = v[n - 1];
        free(v);
        if (step < 0) {
            char wf[4200];
            struct stat sb;
            snprintf(wf, sizeof wf, "%s/model.safetensors", p);
            bool weights = stat(wf, &sb) == 0;
            snprintf(wf, sizeof wf, "%s/model.safetensors.index.json", p);
            weights = weights || stat(wf, &sb) == 0;
            return zoff_error(ZOFF_ERR_INVALID,
                              "no complete checkpoint in %s (looked for step_NNNNNNNN/" CK_MARKER "); %s", p,
                              weights ? "it holds safetensors weights (a model folder), not a training checkpoint: "
                                        "zoff train --init-from starts a new run from them (zoff sample and zoff eval "
                                        "read them with --load)"
                                      : "check the path");
        }
        ZOFF_TRY(step_dir_path(p, step, "", "", stepdir, sizeof stepdir));
    }
    if (out) {
        size_t len = strlen(stepdir);
        if (len >= cap) return zoff_error(ZOFF_ERR_INVALID, "checkpoint path %s does not fit in %zu bytes", stepdir, cap);
        memcpy(out, stepdir, len + 1);
    }
    if (step_out) *step_out = step;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_run_dir(const char *path, char *out, size_t cap) {
    char stepdir[CK_PATH];
    ZOFF_TRY(zoff_ckpt_resolve(path, stepdir, sizeof stepdir, NULL));
    char *slash = strrchr(stepdir, '/');
    if (slash == stepdir) slash[1] = '\0'; /* /step_X: the root */
    else if (slash) *slash = '\0';
    else snprintf(stepdir, sizeof stepdir, ".");
    if (strlen(stepdir) >= cap) return zoff_error(ZOFF_ERR_INVALID, "checkpoint path %s does not fit in %zu bytes", stepdir, cap);
    memcpy(out, stepdir, strlen(stepdir) + 1);
    return ZOFF_OK;
}

zoff_status zoff_ckpt_prune(const char *dir_in, int keep_last) {
    if (keep_last < 1)
        return zoff_error(ZOFF_ERR_INVALID, "keep_last must be >= 1 (got %d): the newest checkpoint is never removed",
                          keep_last);
    char dir[CK_PATH];
    ZOFF_TRY(norm_dir(dir_in, dir, sizeof dir));
    int64_t *v;
    size_t n;
    ZOFF_TRY(list_complete(dir, false, &v, &n));
    zoff_status st = ZOFF_OK;
    for (size_t i = 0; i + (size_t)keep_last < n && st == ZOFF_OK; i++) {
        char sd[CK_PATH], gone[CK_PATH], tag[CK_MAX_TAG + 1];
        snprintf(tag, sizeof tag, "prune-%ld", (long)getpid());
        st = step_dir_path(dir, v[i], "", "", sd, sizeof sd);
        if (st == ZOFF_OK) st = step_dir_path(dir, v[i], ".tmp-", tag, gone, sizeof gone);
        if (st != ZOFF_OK) break;
        /* renamed to a temp name first (durably), so an interrupted prune leaves an ignored temp
         * dir, never a step dir without its marker */
        if (rmtree(gone) != 0 || rename(sd, gone) != 0) {
            st = zoff_error(ZOFF_ERR_IO, "cannot remove old checkpoint %s: %s", sd, strerror(errno));
            break;
        }
        st = fsync_dir(dir);
        if (st == ZOFF_OK && rmtree(gone) != 0)
            st = zoff_error(ZOFF_ERR_IO, "cannot remove old checkpoint %s: %s", gone, strerror(errno));
        if (st == ZOFF_OK) zoff_log(ZOFF_LOG_INFO, "removed old checkpoint %s (keeping the newest %d)", sd, keep_last);
    }
    free(v);
    if (st == ZOFF_OK) st = fsync_dir(dir);
    return st;
}

/* ------------------------------------------------------------------ reader */

struct zoff_ckpt_reader {
    char path[CK_PATH];
    int fd;
    int dfd; /* the same file opened O_DIRECT (-1: the filesystem refused it): reader_read's aligned part */
    _Atomic bool direct_refused; /* a direct read failed with EINVAL: the page cache from then on (dfd stays open
                                    until close: zoff_ckpt_read_range_unchecked may run beside a checksum's read) */
    int64_t step;
    int rank, nranks;
    size_t n;
    zoff_ckpt_entry *ents;
    size_t *by_name; /* indices into ents, sorted by name */
    uint8_t *verified;
    /* zoff_ckpt_reader_verify_in_order: per entry, the bytes [0, vpos) checksummed so far (vcrc) */
    bool in_order;
    int64_t *vpos;
    uint32_t *vcrc;
    int64_t data_end; /* = index_offset */
};

/* Sort indices by name with a simple merge sort (no global state, so readers open concurrently). */
static void sort_by_name(const zoff_ckpt_entry *e, size_t *idx, size_t *tmp, size_t n) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_by_name(e, idx, tmp, h);
    sort_by_name(e, idx + h, tmp, n - h);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = strcmp(e[idx[i]].name, e[idx[j]].name) <= 0 ? idx[i++] : idx[j++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

static zoff_status decode_index(zoff_ckpt_reader *r, const uint8_t *b, const ck_header *h) {
    int64_t prev_end = ZOFF_CKPT_ALIGN;
    for (size_t i = 0; i < r->n; i++) {
        const uint8_t *rec = b + i * CK_ENTRY_BYTES;
        zoff_ckpt_entry *e = &r->ents[i];
        if (!memchr(rec, 0, ZOFF_CKPT_MAX_NAME + 1) || rec[0] == 0)
            return zoff_error(ZOFF_ERR_FORMAT, "entry %zu of %s has an empty or unterminated name: %s", i, r->path,
                              corrupt);
        memcpy(e->name, rec, ZOFF_CKPT_MAX_NAME + 1);
        uint32_t dt = get_u32(rec + 128), nd = get_u32(rec + 132);
        if (!(dt < (uint32_t)ZOFF_DTYPE_COUNT || dt == (uint32_t)ZOFF_CKPT_RAW))
            return zoff_error(ZOFF_ERR_FORMAT, "entry '%s' of %s has unknown dtype %u: %s", e->name, r->path, dt, corrupt);
        e->dtype = (zoff_dtype)dt;
        if (nd > ZOFF_CKPT_MAX_DIMS)
            return zoff_error(ZOFF_ERR_FORMAT, "entry '%s' of %s has %u dimensions (at most %d): %s", e->name, r->path, nd,
                              ZOFF_CKPT_MAX_DIMS, corrupt);
        e->ndim = (int)nd;
        for (int k = 0; k < ZOFF_CKPT_MAX_DIMS; k++) e->shape[k] = (int64_t)zoff_ckpt_get_u64(rec + 136 + 8 * k);
        e->offset = (int64_t)zoff_ckpt_get_u64(rec + 200);
        e->bytes = (int64_t)zoff_ckpt_get_u64(rec + 208);
        e->crc32c = get_u32(rec + 216);
        int64_t expect = 0;
        if (check_meta(e->name, e->dtype, e->ndim, e->shape, &expect) != ZOFF_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", zoff_last_error());
            return zoff_error(ZOFF_ERR_FORMAT, "%s in %s: %s", msg, r->path, corrupt);
        }
        char s[256];
        if (e->bytes < 0 || (expect >= 0 && e->bytes != expect))
            return zoff_error(ZOFF_ERR_FORMAT, "entry '%s' of %s: size %" PRId64 " does not match its shape %s of %s: %s",
                              e->name, r->path, e->bytes, zoff_ckpt_shape_str(e->ndim, e->shape, s, sizeof s), zoff_ckpt_dtype_str(e->dtype),
                              corrupt);
        if (e->offset % ZOFF_CKPT_ALIGN != 0 || e->offset < prev_end || e->offset > (int64_t)h->index_offset ||
            e->bytes > (int64_t)h->index_offset - e->offset)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "entry '%s' of %s: data at offset %" PRId64 " (%" PRId64
                              " bytes) is out of bounds (data region [%" PRId64 ", %" PRIu64 ")): %s",
                              e->name, r->path, e->offset, e->bytes, prev_end, h->index_offset, corrupt);
        prev_end = e->offset + e->bytes;
    }
    for (size_t i = 0; i < r->n; i++) r->by_name[i] = i;
    size_t *tmp = malloc((r->n ? r->n : 1) * sizeof *tmp);
    if (!tmp) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory reading the index of %s", r->path);
    sort_by_name(r->ents, r->by_name, tmp, r->n);
    free(tmp);
    for (size_t i = 1; i < r->n; i++)
        if (strcmp(r->ents[r->by_name[i - 1]].name, r->ents[r->by_name[i]].name) == 0)
            return zoff_error(ZOFF_ERR_FORMAT, "entry '%s' appears twice in %s: %s", r->ents[r->by_name[i]].name, r->path,
                              corrupt);
    return ZOFF_OK;
}

static zoff_status open_file(zoff_ckpt_reader *r, const char *stepdir, int rank, int64_t step) {
    ZOFF_TRY(rank_file_path(stepdir, rank, r->path, sizeof r->path));
    r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0)
        return zoff_error(errno == ENOENT ? ZOFF_ERR_FORMAT : ZOFF_ERR_IO, "cannot open checkpoint file %s: %s%s", r->path,
                          strerror(errno), errno == ENOENT ? " (the checkpoint is incomplete; use an earlier one)" : "");
    r->dfd = open(r->path, O_RDONLY | O_CLOEXEC | O_DIRECT); /* -1 where the filesystem has no O_DIRECT */
    ck_header h;
    ZOFF_TRY(read_header(r->path, r->fd, &h));
    if (h.rank != (uint32_t)rank || h.step != step)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s says it is rank %u of step %" PRId64 ", expected rank %d of step %" PRId64
                          ": files were mixed up between checkpoints; use an earlier checkpoint",
                          r->path, h.rank, h.step, rank, step);
    r->n = (size_t)h.count;
    r->data_end = (int64_t)h.index_offset;
    size_t nn = r->n ? r->n : 1;
    r->ents = calloc(nn, sizeof *r->ents);
    r->by_name = calloc(nn, sizeof *r->by_name);
    r->verified = calloc(nn, 1);
    r->vpos = calloc(nn, sizeof *r->vpos);
    r->vcrc = calloc(nn, sizeof *r->vcrc);
    uint8_t *idx = malloc(h.index_bytes ? (size_t)h.index_bytes : 1);
    if (!r->ents || !r->by_name || !r->verified || !r->vpos || !r->vcrc || !idx) {
        free(idx);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory reading the index of %s (%" PRIu64 " entries)", r->path,
                          h.count);
    }
    zoff_status st = io_read_all(r->path, r->fd, idx, (size_t)h.index_bytes, (int64_t)h.index_offset);
    if (st == ZOFF_OK) {
        uint32_t crc = zoff_crc32c(0, idx, (size_t)h.index_bytes);
        if (crc != h.index_crc)
            st = zoff_error(ZOFF_ERR_FORMAT, "index checksum mismatch in %s (stored 0x%08x, computed 0x%08x): %s", r->path,
                            h.index_crc, crc, corrupt);
    }
    if (st == ZOFF_OK) st = decode_index(r, idx, &h);
    free(idx);
    return st;
}

zoff_status zoff_ckpt_open(const char *path, int rank, zoff_ckpt_reader **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_open: out is NULL");
    *out = NULL;
    if (rank < 0) return zoff_error(ZOFF_ERR_INVALID, "checkpoint rank must be >= 0 (got %d)", rank);
    char stepdir[CK_PATH];
    int64_t step = -1, mstep = -1;
    int nranks = 0;
    ZOFF_TRY(zoff_ckpt_resolve(path, stepdir, sizeof stepdir, &step));
    ZOFF_TRY(read_marker(stepdir, &mstep, &nranks));
    if (rank >= nranks)
        return zoff_error(ZOFF_ERR_INVALID,
                          "checkpoint %s was saved by %d rank(s) and has no file for rank %d: resume with the same "
                          "number of ranks",
                          stepdir, nranks, rank);
    zoff_ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory allocating a checkpoint reader");
    r->fd = r->dfd = -1;
    r->step = step;
    r->rank = rank;
    r->nranks = nranks;
    zoff_status st = open_file(r, stepdir, rank, step);
    if (st == ZOFF_OK) *out = r;
    else zoff_ckpt_close(r);
    return st;
}

void zoff_ckpt_close(zoff_ckpt_reader *r) {
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    if (r->dfd >= 0) close(r->dfd);
    free(r->ents);
    free(r->by_name);
    free(r->verified);
    free(r->vpos);
    free(r->vcrc);
    free(r);
}

int64_t zoff_ckpt_reader_step(const zoff_ckpt_reader *r) { return r->step; }
int zoff_ckpt_reader_nranks(const zoff_ckpt_reader *r) { return r->nranks; }
const char *zoff_ckpt_reader_path(const zoff_ckpt_reader *r) { return r->path; }
size_t zoff_ckpt_num_entries(const zoff_ckpt_reader *r) { return r->n; }
const zoff_ckpt_entry *zoff_ckpt_entry_at(const zoff_ckpt_reader *r, size_t i) { return i < r->n ? &r->ents[i] : NULL; }

static const char *entry_name(const void *ents, size_t i) { return ((const zoff_ckpt_entry *)ents)[i].name; }

const zoff_ckpt_entry *zoff_ckpt_find(const zoff_ckpt_reader *r, const char *name) {
    if (!r || !name) return NULL;
    ptrdiff_t i = zoff_ckpt_find_sorted(r->ents, r->by_name, r->n, name, entry_name);
    return i < 0 ? NULL : &r->ents[i];
}

static zoff_status find_or_fail(zoff_ckpt_reader *r, const char *name, const zoff_ckpt_entry **e) {
    if (!r) return zoff_error(ZOFF_ERR_INVALID, "checkpoint reader is NULL");
    *e = zoff_ckpt_find(r, name);
    if (!*e)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s has no entry '%s' (it has %zu entries): was it saved by another model "
                          "configuration or zoff version?",
                          r->path, name ? name : "(null)", r->n);
    return ZOFF_OK;
}

static zoff_status crc_mismatch(const zoff_ckpt_reader *r, const zoff_ckpt_entry *e, uint32_t crc) {
    return zoff_error(ZOFF_ERR_FORMAT,
                      "checksum mismatch in entry '%s' of %s: the file is corrupt; use an earlier checkpoint "
                      "(stored CRC32C 0x%08x, computed 0x%08x)",
                      e->name, r->path, e->crc32c, crc);
}

/* Read a whole entry into dst (e->bytes bytes) and check its CRC. */
/* n bytes at off into dst. Where dst and off are ZOFF_CKPT_ALIGN-aligned (every entry starts at such an offset;
 * the load's piece buffers are aligned) the whole multiples of it are read with O_DIRECT: the disk's sequential
 * rate at large requests, no page-cache copy, no read-ahead guesswork (a 1.5 GB load, docs/performance.md). The
 * rest, and everything where the filesystem refuses O_DIRECT, through the page cache. (A bounce buffer for
 * unaligned destinations measured no faster than the page cache: its copy does not overlap the next read.) */
static zoff_status reader_read(zoff_ckpt_reader *r, void *dst, size_t n, int64_t off) {
    const size_t A = ZOFF_CKPT_ALIGN, body = n - n % A;
    uint8_t *p = dst;
    size_t done = 0;
    while (r->dfd >= 0 && !atomic_load_explicit(&r->direct_refused, memory_order_relaxed) &&
           ((uintptr_t)dst | (uint64_t)off) % A == 0 && done < body) {
        size_t chunk = body - done < CK_DIRECT_CHUNK ? body - done : CK_DIRECT_CHUNK;
        ssize_t got = pread(r->dfd, p + done, chunk, (off_t)(off + (int64_t)done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == EINVAL) { /* refused after all: the page cache from here on */
            atomic_store_explicit(&r->direct_refused, true, memory_order_relaxed);
            break;
        }
        if (got < 0)
            return zoff_error(ZOFF_ERR_IO, "cannot read checkpoint file %s at offset %" PRId64 " (%zu bytes): %s", r->path,
                              off + (int64_t)done, n - done, strerror(errno));
        size_t whole = (size_t)got - (size_t)got % A; /* a short read (the end of the file): the rest buffered */
        done += whole;
        if (whole < chunk) break;
    }
    return io_read_all(r->path, r->fd, p + done, n - done, off + (int64_t)done);
}

static zoff_status read_entry(zoff_ckpt_reader *r, const zoff_ckpt_entry *e, void *dst) {
    ZOFF_TRY(reader_read(r, dst, (size_t)e->bytes, e->offset));
    uint32_t crc = zoff_crc32c(0, dst, (size_t)e->bytes);
    if (crc != e->crc32c) return crc_mismatch(r, e, crc);
    r->verified[e - r->ents] = 1;
    return ZOFF_OK;
}

/* Entry e's checksummed prefix [0, vpos): once it is the whole entry, its CRC compared (and the entry
 * marked verified). */
static zoff_status verify_if_whole(zoff_ckpt_reader *r, const zoff_ckpt_entry *e) {
    const size_t k = (size_t)(e - r->ents);
    if (r->vpos[k] < e->bytes) return ZOFF_OK;
    if (r->vcrc[k] != e->crc32c) return crc_mismatch(r, e, r->vcrc[k]);
    r->verified[k] = 1;
    return ZOFF_OK;
}

/* The CRC of entry e carried on from its checksummed prefix [0, vpos) up to byte `to` (reading through a
 * bounce buffer); at the entry's end it is compared. */
static zoff_status verify_upto(zoff_ckpt_reader *r, const zoff_ckpt_entry *e, int64_t to) {
    const size_t k = (size_t)(e - r->ents);
    if (r->verified[k]) return ZOFF_OK;
    if (r->vpos[k] < to) {
        const int64_t left = to - r->vpos[k];
        size_t bn = left < (int64_t)CK_RBUF_BYTES ? (size_t)left : CK_RBUF_BYTES;
        uint8_t *b = zoff_aligned_alloc(ZOFF_CKPT_ALIGN, bn, "checkpoint verification buffer");
        if (!b) return ZOFF_ERR_NOMEM;
        zoff_status st = ZOFF_OK;
        while (r->vpos[k] < to && st == ZOFF_OK) {
            size_t n = to - r->vpos[k] < (int64_t)bn ? (size_t)(to - r->vpos[k]) : bn;
            st = reader_read(r, b, n, e->offset + r->vpos[k]);
            if (st != ZOFF_OK) break;
            r->vcrc[k] = zoff_crc32c(r->vcrc[k], b, n);
            r->vpos[k] += (int64_t)n;
        }
        zoff_aligned_free(b);
        ZOFF_TRY(st);
    }
    return verify_if_whole(r, e);
}

static zoff_status verify_entry(zoff_ckpt_reader *r, const zoff_ckpt_entry *e) { return verify_upto(r, e, e->bytes); }

zoff_status zoff_ckpt_read(zoff_ckpt_reader *r, const char *name, void *dst, size_t bytes) {
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_or_fail(r, name, &e));
    if ((uint64_t)e->bytes != (uint64_t)bytes)
        return zoff_error(ZOFF_ERR_INVALID,
                          "size mismatch for '%s': checkpoint %s has %" PRId64 " bytes but the caller expects %zu", name,
                          r->path, e->bytes, bytes);
    if (bytes && !dst) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_read('%s'): dst is NULL", name);
    return read_entry(r, e, dst);
}

zoff_status zoff_ckpt_check_tensor(zoff_ckpt_reader *r, const char *name, zoff_dtype dtype, int ndim,
                                   const int64_t *shape) {
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_or_fail(r, name, &e));
    if (e->dtype != dtype)
        return zoff_error(ZOFF_ERR_INVALID,
                          "dtype mismatch for '%s': checkpoint has %s but the model has %s: was this checkpoint made "
                          "with other fp16/bf16 settings? (%s)",
                          name, zoff_ckpt_dtype_str(e->dtype), zoff_ckpt_dtype_str(dtype), r->path);
    bool same = e->ndim == ndim && (ndim == 0 || shape);
    for (int i = 0; same && i < ndim; i++) same = e->shape[i] == shape[i];
    if (!same) {
        char a[256], b[256];
        return zoff_error(ZOFF_ERR_INVALID,
                          "shape mismatch for '%s': checkpoint has %s but the model has %s: was this checkpoint made "
                          "with other model flags (--num-layers, --hidden-size, --num-attention-heads, vocabulary or "
                          "sequence length)? (%s)",
                          name, zoff_ckpt_shape_str(e->ndim, e->shape, a, sizeof a),
                          shape ? zoff_ckpt_shape_str(ndim < 0 ? 0 : (ndim > ZOFF_CKPT_MAX_DIMS ? ZOFF_CKPT_MAX_DIMS : ndim), shape,
                                            b, sizeof b)
                                : "(no shape)",
                          r->path);
    }
    return ZOFF_OK;
}

zoff_status zoff_ckpt_read_tensor(zoff_ckpt_reader *r, const char *name, zoff_dtype dtype, int ndim,
                                  const int64_t *shape, void *dst, size_t bytes) {
    ZOFF_TRY(zoff_ckpt_check_tensor(r, name, dtype, ndim, shape));
    return zoff_ckpt_read(r, name, dst, bytes);
}

zoff_status zoff_ckpt_read_blob(zoff_ckpt_reader *r, const char *name, char **data, size_t *bytes) {
    if (!data) return zoff_error(ZOFF_ERR_INVALID, "zoff_ckpt_read_blob: data is NULL");
    *data = NULL;
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_or_fail(r, name, &e));
    char *b = malloc((size_t)e->bytes + 1);
    if (!b) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory reading '%s' (%" PRId64 " bytes) of %s", name, e->bytes, r->path);
    zoff_status st = read_entry(r, e, b);
    if (st != ZOFF_OK) {
        free(b);
        return st;
    }
    b[e->bytes] = '\0';
    *data = b;
    if (bytes) *bytes = (size_t)e->bytes;
    return ZOFF_OK;
}

/* Entry e's range [offset, offset + bytes), found and bounds-checked. */
static zoff_status find_range(zoff_ckpt_reader *r, const char *name, int64_t offset, const void *buf, size_t bytes,
                              const char *what, const zoff_ckpt_entry **e) {
    ZOFF_TRY(find_or_fail(r, name, e));
    if (offset < 0 || offset > (*e)->bytes || (uint64_t)bytes > (uint64_t)((*e)->bytes - offset))
        return zoff_error(ZOFF_ERR_INVALID,
                          "range [%" PRId64 ", %" PRId64 ") is outside entry '%s' (%" PRId64 " bytes) of %s", offset,
                          offset + (int64_t)bytes, name, (*e)->bytes, r->path);
    if (bytes && !buf) return zoff_error(ZOFF_ERR_INVALID, "%s('%s'): the buffer is NULL", what, name);
    return ZOFF_OK;
}

/* The CRC bookkeeping for bytes [offset, offset + bytes) of entry e, already read into data: in order, what lies
 * before them and was not checksummed is (through the bounce buffer), and their part past the checksummed prefix;
 * not in order (or not yet verified), the whole entry first. */
static zoff_status checksum_read(zoff_ckpt_reader *r, const zoff_ckpt_entry *e, int64_t offset, const void *data,
                                 size_t bytes) {
    const size_t k = (size_t)(e - r->ents);
    if (r->verified[k]) return ZOFF_OK;
    if (!r->in_order) return verify_entry(r, e);
    ZOFF_TRY(verify_upto(r, e, offset));
    const int64_t end = offset + (int64_t)bytes;
    if (end <= r->vpos[k]) return ZOFF_OK;
    r->vcrc[k] = zoff_crc32c(r->vcrc[k], (const uint8_t *)data + (r->vpos[k] - offset), (size_t)(end - r->vpos[k]));
    r->vpos[k] = end;
    return verify_if_whole(r, e);
}

zoff_status zoff_ckpt_read_range(zoff_ckpt_reader *r, const char *name, int64_t offset, void *dst, size_t bytes) {
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_range(r, name, offset, dst, bytes, "zoff_ckpt_read_range", &e));
    if (!r->in_order) ZOFF_TRY(verify_entry(r, e)); /* checked first, then read */
    ZOFF_TRY(reader_read(r, dst, bytes, e->offset + offset));
    return checksum_read(r, e, offset, dst, bytes);
}

zoff_status zoff_ckpt_read_range_unchecked(zoff_ckpt_reader *r, const char *name, int64_t offset, void *dst,
                                           size_t bytes) {
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_range(r, name, offset, dst, bytes, "zoff_ckpt_read_range_unchecked", &e));
    return reader_read(r, dst, bytes, e->offset + offset);
}

zoff_status zoff_ckpt_checksum_range(zoff_ckpt_reader *r, const char *name, int64_t offset, const void *data,
                                     size_t bytes) {
    const zoff_ckpt_entry *e;
    ZOFF_TRY(find_range(r, name, offset, data, bytes, "zoff_ckpt_checksum_range", &e));
    return checksum_read(r, e, offset, data, bytes);
}

bool zoff_ckpt_reader_verify_in_order(zoff_ckpt_reader *r, bool on) {
    if (!r) return false;
    bool was = r->in_order;
    r->in_order = on;
    return was;
}

zoff_status zoff_ckpt_verify(zoff_ckpt_reader *r, const char *name) {
    if (!r) return zoff_error(ZOFF_ERR_INVALID, "checkpoint reader is NULL");
    if (name) {
        const zoff_ckpt_entry *e;
        ZOFF_TRY(find_or_fail(r, name, &e));
        return verify_entry(r, e);
    }
    for (size_t i = 0; i < r->n; i++) ZOFF_TRY(verify_entry(r, &r->ents[i]));
    return ZOFF_OK;
}
