/* The NVMe state swapper (see include/zoff/swapper.h).
 *
 * File layout: a 4 KiB header (magic "ZOFFSWAP", version, array count, group
 * count, block size, then the element count of each group while it fits, then
 * the dtype of each array), followed by the groups in index order; group g
 * holds its arrays one after the other, array a of count(g) elements of
 * dtype[a] padded to ZOFF_AIO_ALIGN (zoff_swapper_array_bytes, the one size
 * rule). A buffer ("slot") has the same layout for the largest group. Ranges between passes
 * (zoff_swapper_range) move whole blocks of one array through slot 0.
 *
 * Visits (one group in one pass) are numbered globally; visit q uses slot
 * q % nslots. A read into a slot follows (aio `after`) the slot's last write,
 * which frees the buffer, and the last write of the same group, which makes
 * the data current; so reads never wait on the caller, only on the disk. */
#define _GNU_SOURCE
#include "zoff/swapper.h"
#include "zoff/device.h"
#include "zoff/resources.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SWAP_MAGIC "ZOFFSWAP"
#define SWAP_VERSION 2u /* 2: the arrays' dtypes in the header */
#define HEADER_BYTES ((int64_t)ZOFF_SWAP_HEADER_BYTES)

typedef struct slot {
    char *buf;   /* aligned */
    void *alloc; /* what was allocated (pinned: buf is inside it) */
    zoff_aio_request rd, wr;
    int read_group;  /* group of the last read issued into it (-1 none) */
    int write_group; /* group of the last write issued from it (-1 none) */
} slot;

/* Where a sub-group lives in the swap file. */
typedef struct group_info {
    int64_t count;                 /* elements of each of its arrays */
    int64_t off[ZOFF_SWAP_MAX_ARRAYS];     /* file offset of each array */
    size_t abytes[ZOFF_SWAP_MAX_ARRAYS];   /* padded bytes of each array (zoff_swapper_array_bytes) */
    size_t crc_base[ZOFF_SWAP_MAX_ARRAYS]; /* crcs of (g, a): crcs + crc_base[a] */
    zoff_aio_request *last_write;  /* the slot write request that last wrote it */
    bool fresh[ZOFF_SWAP_MAX_ARRAYS]; /* [a]: never written, reads as init_value[a] */
    int64_t written[ZOFF_SWAP_MAX_ARRAYS]; /* [a], while fresh: its first blocks written by ranges (the rest
                                              reads as init_value[a]; a pass writes the rest first) */
} group_info;

struct zoff_swapper {
    zoff_swapper_options o;
    group_info *grp; /* [ng] */
    int ng, na;
    zoff_aio *io;
    zoff_aio_file *f;
    char path[4096];
    int64_t file_bytes;
    size_t slot_off[ZOFF_SWAP_MAX_ARRAYS]; /* array a's offset in a slot: the largest group's layout */
    uint32_t *crcs;
    slot *slots;
    int nslots;
    size_t slot_bytes;
    size_t slot_alloc;  /* host bytes each buffer takes (slot_bytes, + zoff_swapper_pinned_padding when pinned) */
    void *hdr;          /* aligned copy of the header */
    /* the current pass */
    bool in_pass, handed_out;
    int *order;
    int n, pos, issued;
    unsigned mode, mask;
    int64_t q0, qnext;
    /* read-ahead of the next update pass */
    bool pf_valid;
    int *pf_order;
    int pf_n, pf_count;
    unsigned pf_mask;
    /* ranges between passes (zoff_swapper_range): slot 0 holds blocks [rc0, rc1) of array ra of
     * group rg from its start (rg < 0: nothing) */
    int rg, ra;
    int64_t rc0, rc1;
    /* after an error */
    zoff_status broken;
    char broken_msg[1024];
    zoff_swapper_stats stats;
    char describe[1024];
};

/* snprintf for text that may be cut (long paths). */
__attribute__((format(printf, 3, 4))) static void textf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

size_t zoff_swapper_array_bytes(int64_t count, zoff_dtype dt) {
    size_t x = (size_t)count * zoff_dtype_size(dt);
    return (x + ZOFF_AIO_ALIGN - 1) / ZOFF_AIO_ALIGN * ZOFF_AIO_ALIGN;
}
size_t zoff_swapper_group_bytes(int64_t count, int num_arrays, const zoff_dtype *dtype) {
    size_t b = 0;
    for (int a = 0; a < num_arrays; a++) b += zoff_swapper_array_bytes(count, dtype[a]);
    return b;
}
bool zoff_swapper_padding_exceeds(const int64_t *counts, int num_groups, int num_arrays, const zoff_dtype *dtype,
                                  size_t *padded, size_t *data, int64_t *min_count) {
    size_t smallest = 0;
    *padded = *data = 0;
    for (int a = 0; a < num_arrays; a++)
        if (!smallest || zoff_dtype_size(dtype[a]) < smallest) smallest = zoff_dtype_size(dtype[a]);
    for (int g = 0; g < num_groups; g++) {
        *padded += zoff_swapper_group_bytes(counts[g], num_arrays, dtype);
        for (int a = 0; a < num_arrays; a++) *data += (size_t)counts[g] * zoff_dtype_size(dtype[a]);
    }
    *min_count = smallest ? (int64_t)(ZOFF_AIO_ALIGN / smallest) : 0;
    return *padded - *data > *data;
}
size_t zoff_swapper_pinned_padding(void) { return ZOFF_AIO_ALIGN; }

int zoff_swapper_buffer_count(int64_t buffer_count, int num_groups) {
    return (int)(buffer_count < num_groups ? buffer_count : num_groups);
}
static size_t nchunks(const zoff_swapper *s, int g, int a) {
    size_t bs = (size_t)s->o.aio.block_size;
    return (s->grp[g].abytes[a] + bs - 1) / bs;
}
static uint32_t *crcs_of(zoff_swapper *s, int g, int a) { return s->crcs + s->grp[g].crc_base[a]; }
static void *slot_array(const zoff_swapper *s, const slot *sl, int a) { return sl->buf + s->slot_off[a]; }

/* Record the first error: the swapper refuses everything afterwards. */
static zoff_status fail(zoff_swapper *s, zoff_status st) {
    if (s->broken == ZOFF_OK) {
        s->broken = st;
        textf(s->broken_msg, sizeof s->broken_msg, "%s", zoff_last_error());
    }
    return st;
}

static zoff_status check_broken(zoff_swapper *s) {
    if (s->broken == ZOFF_OK) return ZOFF_OK;
    return zoff_error(s->broken,
                      "the NVMe optimizer state in %s is unusable after an earlier error (%s); resume from the last "
                      "checkpoint",
                      s->path, s->broken_msg);
}

int zoff_swapper_buffers_needed(bool pipeline_read, bool pipeline_write, int num_groups) {
    int need = 1 + (int)pipeline_read + (int)pipeline_write;
    return num_groups < need ? (num_groups > 0 ? num_groups : 1) : need;
}

/* ------------------------------------------------------------------ create / destroy */

static void build_header(zoff_swapper *s) {
    unsigned char *h = s->hdr;
    memset(h, 0, HEADER_BYTES);
    memcpy(h, SWAP_MAGIC, 8);
    uint32_t u[4] = {SWAP_VERSION, (uint32_t)s->na, (uint32_t)s->ng, (uint32_t)s->o.aio.block_size};
    memcpy(h + 8, u, sizeof u);
    for (int a = 0; a < s->na; a++) h[32 + a] = (unsigned char)s->o.dtype[a];
    int fit = (int)((HEADER_BYTES - 40) / 8);
    for (int g = 0; g < s->ng && g < fit; g++) memcpy(h + 40 + 8 * g, &s->grp[g].count, 8);
}

static zoff_status write_header(zoff_swapper *s) {
    uint32_t crc[1];
    zoff_aio_request r = {.op = ZOFF_AIO_WRITE, .file = s->f, .nseg = 1,
                          .seg = {{.buf = s->hdr, .offset = 0, .bytes = HEADER_BYTES, .crcs = crc}}};
    ZOFF_TRY(zoff_aio_submit(s->io, &r));
    return zoff_aio_wait(s->io, &r);
}

/* The file is as zoff left it: size and header. */
static zoff_status check_file(zoff_swapper *s) {
    struct stat st;
    if (fstat(zoff_aio_file_fd(s->f), &st) != 0)
        return zoff_error(ZOFF_ERR_IO, "cannot stat the swap file %s: %s", s->path, strerror(errno));
    if ((int64_t)st.st_size != s->file_bytes)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "the swap file %s is %lld bytes but zoff wrote %lld: it was truncated or extended behind "
                          "zoff's back (at offset %lld)",
                          s->path, (long long)st.st_size, (long long)s->file_bytes,
                          (long long)(st.st_size < s->file_bytes ? st.st_size : s->file_bytes));
    unsigned char *chk = (unsigned char *)s->hdr + HEADER_BYTES; /* second half of the header allocation */
    uint32_t crc[1];
    zoff_aio_request r = {.op = ZOFF_AIO_READ, .file = s->f, .nseg = 1,
                          .seg = {{.buf = chk, .offset = 0, .bytes = HEADER_BYTES, .crcs = crc}}};
    ZOFF_TRY(zoff_aio_submit(s->io, &r));
    ZOFF_TRY(zoff_aio_wait(s->io, &r));
    if (memcmp(chk, SWAP_MAGIC, 8) != 0)
        return zoff_error(ZOFF_ERR_FORMAT, "the swap file %s has lost its magic number \"%s\" at offset 0: it was "
                                           "changed behind zoff's back", s->path, SWAP_MAGIC);
    uint32_t ver;
    memcpy(&ver, chk + 8, 4);
    if (ver != SWAP_VERSION)
        return zoff_error(ZOFF_ERR_FORMAT, "the swap file %s has version %u at offset 8, zoff wrote %u: it was "
                                           "changed behind zoff's back", s->path, ver, SWAP_VERSION);
    for (int64_t i = 0; i < HEADER_BYTES; i++)
        if (chk[i] != ((unsigned char *)s->hdr)[i])
            return zoff_error(ZOFF_ERR_FORMAT, "the header of the swap file %s differs at offset %lld from what zoff "
                                               "wrote: it was changed behind zoff's back", s->path, (long long)i);
    return ZOFF_OK;
}

static void wait_all(zoff_swapper *s) {
    for (int i = 0; i < s->nslots; i++) {
        (void)zoff_aio_wait(s->io, &s->slots[i].rd);
        (void)zoff_aio_wait(s->io, &s->slots[i].wr);
    }
}

void zoff_swapper_destroy(zoff_swapper *s) {
    if (!s) return;
    if (s->io && s->slots) wait_all(s);
    zoff_aio_file_close(s->f); /* the file has no name (ZOFF_AIO_TEMPORARY): closing frees it */
    zoff_aio_destroy(s->io);
    for (int i = 0; s->slots && i < s->nslots; i++) {
        if (s->o.pin_memory) zoff_host_free_pinned(s->o.dev, s->slots[i].alloc);
        else zoff_aligned_free(s->slots[i].alloc);
    }
    ZOFF_FREE_ALL(s->slots, s->hdr, s->grp, s->crcs, s->order, s->pf_order, s);
}

zoff_status zoff_swapper_create(const zoff_swapper_options *o, zoff_swapper **out) {
    *out = NULL;
    if (!o || !o->dir || !o->dir[0] || o->num_groups < 1 || !o->counts || o->num_arrays < 1 ||
        o->num_arrays > ZOFF_SWAP_MAX_ARRAYS)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_create: missing directory, groups or arrays");
    for (int a = 0; a < o->num_arrays; a++)
        if (o->dtype[a] != ZOFF_F32 && o->dtype[a] != ZOFF_BF16)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_create: array %d has dtype %s (fp32 or bf16 only)", a,
                              zoff_dtype_name(o->dtype[a]));
    int need = zoff_swapper_buffers_needed(o->pipeline_read, o->pipeline_write, o->num_groups);
    if (o->buffer_count < need)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "zero_optimization.offload_optimizer.buffer_count %lld is too few: with pipeline_read %s and "
                          "pipeline_write %s and %d sub-groups the swapper needs %d buffers (read i+1 | update i | "
                          "write i-1); set buffer_count to %d or more",
                          (long long)o->buffer_count, o->pipeline_read ? "true" : "false",
                          o->pipeline_write ? "true" : "false", o->num_groups, need, need);
    if (o->pin_memory && !o->dev)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_create: pin_memory needs the device that pins host memory");
    zoff_swapper *s = calloc(1, sizeof *s);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the NVMe swapper");
    s->o = *o;
    s->ng = o->num_groups;
    s->rg = -1;
    s->na = o->num_arrays;
    s->nslots = zoff_swapper_buffer_count(o->buffer_count, o->num_groups);
    size_t ng = (size_t)s->ng;
    s->grp = calloc(ng, sizeof *s->grp);
    s->order = malloc(ng * sizeof *s->order);
    s->pf_order = malloc(ng * sizeof *s->pf_order);
    s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
    s->hdr = zoff_aligned_alloc(ZOFF_AIO_ALIGN, 2 * HEADER_BYTES, "swap file header");
    zoff_status st = ZOFF_OK;
    if (!s->grp || !s->order || !s->pf_order || !s->slots || !s->hdr)
        st = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the NVMe swapper's tables (%d sub-groups)", s->ng);
    size_t total_chunks = 0;
    int64_t largest = 0;
    if (st == ZOFF_OK) {
        int64_t off = HEADER_BYTES;
        for (int g = 0; g < s->ng; g++) {
            group_info *gi = &s->grp[g];
            if (o->counts[g] < 0) {
                st = zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_create: group %d has %lld elements", g,
                                (long long)o->counts[g]);
                break;
            }
            gi->count = o->counts[g];
            if (gi->count > largest) largest = gi->count;
            for (int a = 0; a < s->na; a++) {
                gi->abytes[a] = zoff_swapper_array_bytes(gi->count, o->dtype[a]);
                gi->off[a] = off;
                off += (int64_t)gi->abytes[a];
                gi->crc_base[a] = total_chunks;
                total_chunks += nchunks(s, g, a);
            }
        }
        s->file_bytes = off;
    }
    for (int a = 0; a < s->na; a++) { /* a slot: the largest group's layout */
        s->slot_off[a] = s->slot_bytes;
        s->slot_bytes += zoff_swapper_array_bytes(largest, o->dtype[a]);
    }
    if (st == ZOFF_OK && !(s->crcs = calloc(total_chunks ? total_chunks : 1, sizeof *s->crcs)))
        st = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %zu block checksums", total_chunks);
    s->slot_alloc = s->slot_bytes + (o->pin_memory ? zoff_swapper_pinned_padding() : 0);
    if (st == ZOFF_OK) { /* pinned with pin_memory (what O_DIRECT's DMA touches), else pageable */
        char what[160];
        snprintf(what, sizeof what, "the NVMe swap buffers (%d x %zu bytes%s)", s->nslots, s->slot_alloc,
                 o->pin_memory ? ", pinned: offload_optimizer.pin_memory" : "");
        const size_t bytes = (size_t)s->nslots * s->slot_alloc;
        zoff_host_request rq = {.what = what, .pinned = o->pin_memory ? bytes : 0, .pageable = o->pin_memory ? 0 : bytes,
                                .hint = "lower zero_optimization.offload_optimizer.buffer_count or "
                                        "sub_group_size"};
        st = zoff_host_memory_check(&rq);
    }
    for (int i = 0; st == ZOFF_OK && i < s->nslots; i++) {
        slot *b = &s->slots[i];
        b->read_group = b->write_group = -1;
        if (o->pin_memory) {
            st = zoff_host_alloc_pinned(o->dev, s->slot_alloc, "NVMe swap buffer", &b->alloc);
            b->buf = st == ZOFF_OK ? (char *)(((uintptr_t)b->alloc + ZOFF_AIO_ALIGN - 1) / ZOFF_AIO_ALIGN * ZOFF_AIO_ALIGN)
                                   : NULL;
        } else {
            b->buf = b->alloc = zoff_aligned_alloc(ZOFF_AIO_ALIGN, s->slot_bytes ? s->slot_bytes : ZOFF_AIO_ALIGN,
                                                   "NVMe swap buffer");
            if (!b->alloc) st = ZOFF_ERR_NOMEM;
        }
        if (st == ZOFF_OK) memset(b->buf, 0, s->slot_bytes); /* padding is written too: keep it defined */
    }
    if (st == ZOFF_OK) { /* the I/O engine, the pinned buffers registered with its rings */
        zoff_aio_options ao = o->aio;
        for (int i = 0; o->pin_memory && s->slot_bytes && i < s->nslots; i++)
            if (!zoff_aio_options_add_fixed(&ao, s->slots[i].buf, s->slot_bytes)) break;
        st = zoff_aio_create(&ao, &s->io);
    }
    /* the file */
    if (st == ZOFF_OK) st = zoff_make_work_dir(o->dir, "zero_optimization.offload_optimizer.nvme_path");
    static int counter;
    if (st == ZOFF_OK)
        st = zoff_swapper_open_file(s->io, o->dir, o->stem ? o->stem : "state",
                                    "zero_optimization.offload_optimizer.nvme_path", &counter, s->path, sizeof s->path,
                                    &s->f);
    if (st == ZOFF_OK) st = zoff_aio_file_reserve(s->f, s->file_bytes);
    if (st == ZOFF_OK) {
        build_header(s);
        st = write_header(s);
    }
    if (st != ZOFF_OK) {
        zoff_swapper_destroy(s);
        return st;
    }
    if (o->fast_init)
        for (int g = 0; g < s->ng; g++)
            for (int a = 1; a < s->na; a++) s->grp[g].fresh[a] = true;
    char fb[32], bb[32];
    textf(s->describe, sizeof s->describe,
             "%s (%s, %s, unlinked: freed when the process ends), %s; %d %sbuffer%s of %s; %s%s",
             s->path, zoff_format_bytes((size_t)s->file_bytes, fb, sizeof fb),
             zoff_aio_file_direct(s->f) ? "O_DIRECT" : zoff_aio_file_direct_note(s->f), zoff_aio_describe(s->io),
             s->nslots, o->pin_memory ? "pinned " : "", s->nslots == 1 ? "" : "s", zoff_format_bytes(s->slot_bytes, bb, sizeof bb),
             o->pipeline_read && o->pipeline_write ? "pipelined read+write"
             : o->pipeline_read                    ? "pipelined read, synchronous write"
             : o->pipeline_write                   ? "synchronous read, pipelined write"
                                                   : "synchronous read and write (pipeline_read/pipeline_write off)",
             o->fast_init ? ", fast_init" : "");
    for (int a = 1; a < s->na; a++)
        if (o->dtype[a] != ZOFF_F32) { /* say so when the state is not all fp32 */
            size_t u = strlen(s->describe);
            if (s->na > 2) textf(s->describe + u, sizeof s->describe - u, "; arrays 1-%d in %s", s->na - 1, zoff_dtype_name(o->dtype[a]));
            else textf(s->describe + u, sizeof s->describe - u, "; array 1 in %s", zoff_dtype_name(o->dtype[a]));
            break;
        }
    *out = s;
    return ZOFF_OK;
}

/* The note for a swap file at path that no running zoff uses (pid: its process; ours: it has this
 * process's pid, so it is an older process's that had it). */
static void note_stale_file(const char *dir, const char *path, long pid, bool ours) {
    char b[32];
    struct stat st;
    const char *size = stat(path, &st) == 0 ? zoff_format_bytes((size_t)st.st_size, b, sizeof b) : "size unknown";
    if (ours)
        zoff_log(ZOFF_LOG_INFO,
                 "note: %s (%s) is a swap file left by an older zoff with this process's id %ld (a container where "
                 "zoff runs as the same pid each time, or another machine sharing %s): zoff removes its own swap "
                 "files as soon as they are open; it is not used, this run takes the next free name: remove it, "
                 "unless a zoff on another machine sharing %s runs",
                 path, size, pid, dir, dir);
    else
        zoff_log(ZOFF_LOG_INFO,
                 "note: %s (%s) is a swap file of a zoff that is no longer running (no process %ld here): zoff "
                 "removes its own swap files as soon as they are open, so it was left by an older zoff or a killed "
                 "one; it is not used: remove it, unless a zoff on another machine sharing %s runs",
                 path, size, pid, dir);
}

zoff_status zoff_swapper_open_file(zoff_aio *io, const char *dir, const char *stem, const char *key, int *counter,
                                   char *path, size_t cap, zoff_aio_file **out) {
    zoff_swapper_note_stale(dir); /* names every file left there, those of this pid too: a name taken below is one */
    for (int tries = 0;; tries++) {
        int n = __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
        int m = snprintf(path, cap, "%s/zoff-%s-%ld-%d.swp", dir, stem, (long)getpid(), n);
        if (m < 0 || (size_t)m >= cap) return zoff_error(ZOFF_ERR_INVALID, "%s is too long (%zu bytes)", key, strlen(dir));
        zoff_status st = zoff_aio_file_open(io, path, ZOFF_AIO_CREATE | ZOFF_AIO_TEMPORARY, out);
        if (st == ZOFF_OK || errno != EEXIST || tries >= 1000) return st; /* 1000 taken names: say the last */
        zoff_clear_error();
    }
}

void zoff_swapper_note_stale(const char *dir) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static char told[4096]; /* the last directory looked at (optimizer and parameters often share one) */
    pthread_mutex_lock(&mu);
    const bool seen = strcmp(told, dir) == 0;
    if (!seen) snprintf(told, sizeof told, "%s", dir);
    pthread_mutex_unlock(&mu);
    DIR *d = seen ? NULL : opendir(dir);
    for (struct dirent *e; d && (e = readdir(d));) {
        char stem[64];
        long pid;
        int n, end = 0;
        if (sscanf(e->d_name, "zoff-%63[a-z]-%ld-%d.swp%n", stem, &pid, &n, &end) != 3 || e->d_name[end] || pid <= 0)
            continue;
        /* this pid's: an older process's (this one's are unlinked once open, and it notes a folder before
         * it creates a file there), whatever its <n> */
        const bool ours = pid == (long)getpid();
        if (!ours && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;
        char path[4400];
        textf(path, sizeof path, "%s/%s", dir, e->d_name);
        note_stale_file(dir, path, pid, ours);
    }
    if (d) closedir(d);
}

const char *zoff_swapper_describe(const zoff_swapper *s) { return s->describe; }
const char *zoff_swapper_path(const zoff_swapper *s) { return s->path; }
int64_t zoff_swapper_file_bytes(const zoff_swapper *s) { return s->file_bytes; }
size_t zoff_swapper_buffer_bytes(const zoff_swapper *s) { return s->slot_alloc * (size_t)s->nslots; }
int zoff_swapper_buffers(const zoff_swapper *s) { return s->nslots; }
bool zoff_swapper_direct(const zoff_swapper *s) { return zoff_aio_file_direct(s->f); }
zoff_aio_engine_kind zoff_swapper_engine(const zoff_swapper *s) { return zoff_aio_engine(s->io); }
void zoff_swapper_get_stats(const zoff_swapper *s, zoff_swapper_stats *out) { *out = s->stats; }

/* n copies of init_value[a] in dtype[a] at dst (what a never-written array reads as). */
static void fill_init(const zoff_swapper *s, int a, void *dst, int64_t n) {
    float v = s->o.init_value[a];
    if (s->o.dtype[a] == ZOFF_BF16) {
        uint16_t b = zoff_f32_to_bf16(v), *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = b;
    } else {
        float *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = v;
    }
}

static zoff_status range_settle(zoff_swapper *s);

/* ------------------------------------------------------------------ passes */

static slot *slot_of(zoff_swapper *s, int j) { return &s->slots[(s->q0 + j) % s->nslots]; }

/* Set r to move group g's arrays in s->mask, but those with skip[a], between slot sl and the
 * swap file; returns the bytes. */
static int64_t group_request(zoff_swapper *s, zoff_aio_request *r, slot *sl, int g, zoff_aio_op op, unsigned flags,
                             const bool *skip) {
    const group_info *gi = &s->grp[g];
    int64_t bytes = 0;
    memset(r, 0, offsetof(zoff_aio_request, priv));
    r->op = op;
    r->file = s->f;
    r->flags = flags;
    for (int a = 0; a < s->na; a++) {
        if (!(s->mask & (1u << a)) || (skip && skip[a])) continue;
        r->seg[r->nseg++] = (zoff_aio_segment){.buf = slot_array(s, sl, a), .offset = gi->off[a],
                                               .bytes = gi->abytes[a], .crcs = crcs_of(s, g, a)};
        bytes += (int64_t)gi->abytes[a];
    }
    return bytes;
}

/* Queue the read of visit j of the current pass. */
static zoff_status issue_read(zoff_swapper *s, int j) {
    slot *sl = slot_of(s, j);
    int g = s->order[j];
    zoff_aio_request *r = &sl->rd, *last = s->grp[g].last_write;
    s->stats.bytes_read += group_request(s, r, sl, g, ZOFF_AIO_READ, ZOFF_AIO_CRC_VERIFY,
                                         s->grp[g].fresh); /* a fresh array is not read */
    r->after[0] = &sl->wr; /* the buffer is free */
    if (last && last != &sl->wr) r->after[1] = last; /* the data is current */
    sl->read_group = g;
    return zoff_aio_submit(s->io, r);
}

/* Wait for the read-ahead of visits [0, count) of the pass described by pf_*, then forget it. */
static zoff_status drop_prefetch(zoff_swapper *s) {
    zoff_status st = ZOFF_OK;
    if (!s->pf_valid) return ZOFF_OK;
    for (int j = 0; j < s->pf_count; j++) {
        zoff_status r = zoff_aio_wait(s->io, &s->slots[(s->qnext + j) % s->nslots].rd);
        if (r != ZOFF_OK && st == ZOFF_OK) st = fail(s, r);
    }
    s->pf_valid = false;
    return st;
}

zoff_status zoff_swapper_begin(zoff_swapper *s, const int *order, int n, unsigned mode, unsigned mask) {
    ZOFF_TRY(check_broken(s));
    if (s->in_pass) { /* the caller stopped midway (an error of its own): part of the state is new, part old */
        wait_all(s);
        return fail(s, zoff_error(ZOFF_ERR_INVALID,
                                  "an earlier pass over the NVMe state in %s stopped after %d of %d sub-groups (after "
                                  "an error in the caller)", s->path, s->pos, s->n));
    }
    if (n < 0 || n > s->ng || !(mode & ZOFF_SWAP_UPDATE) || (mode & ~(unsigned)ZOFF_SWAP_UPDATE) || !mask ||
        (mask >> s->na))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_begin: %d groups (of %d), mode %u, mask %#x (%d arrays)", n,
                          s->ng, mode, mask, s->na);
    for (int j = 0; j < n; j++)
        if (order[j] < 0 || order[j] >= s->ng)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_begin: group %d out of range (%d groups)", order[j],
                              s->ng);
    ZOFF_TRY(range_settle(s)); /* slot 0 is the pass's again; arrays written in part by ranges are completed */
    bool adopt = s->pf_valid && mode == ZOFF_SWAP_UPDATE && n == s->pf_n && mask == s->pf_mask &&
                 memcmp(order, s->pf_order, (size_t)n * sizeof *order) == 0;
    s->issued = 0;
    if (adopt) {
        s->issued = s->pf_count;
        s->pf_valid = false;
    } else if (s->pf_valid) {
        ZOFF_TRY(drop_prefetch(s));
    }
    s->q0 = s->qnext;
    s->qnext += n;
    memcpy(s->order, order, (size_t)n * sizeof *order);
    s->n = n;
    s->pos = 0;
    s->mode = mode;
    s->mask = mask;
    s->handed_out = false;
    zoff_status st = ZOFF_OK;
    if (mode & ZOFF_SWAP_READ) st = check_file(s);
    while (st == ZOFF_OK && (mode & ZOFF_SWAP_READ) && s->o.pipeline_read && s->issued < n &&
           s->issued < s->nslots)
        st = issue_read(s, s->issued++);
    if (st != ZOFF_OK) return fail(s, st);
    s->in_pass = true;
    return ZOFF_OK;
}

zoff_status zoff_swapper_next(zoff_swapper *s, int *group, void *arrays[ZOFF_SWAP_MAX_ARRAYS]) {
    ZOFF_TRY(check_broken(s));
    if (!s->in_pass || s->handed_out || s->pos >= s->n)
        return zoff_error(ZOFF_ERR_INTERNAL, "zoff_swapper_next: no pass, or the previous group was not released");
    int j = s->pos, g = s->order[j];
    slot *sl = slot_of(s, j);
    double t0 = zoff_now();
    if (s->mode & ZOFF_SWAP_READ) {
        if (j >= s->issued) {
            zoff_status st = issue_read(s, j);
            if (st != ZOFF_OK) return fail(s, st);
            s->issued = j + 1;
        }
        zoff_status st = zoff_aio_wait(s->io, &sl->rd);
        s->stats.t_wait_read += zoff_now() - t0;
        if (st != ZOFF_OK) return fail(s, st);
    } else {
        zoff_status st = zoff_aio_wait(s->io, &sl->wr); /* the buffer's previous write */
        s->stats.t_wait_write += zoff_now() - t0;
        if (st != ZOFF_OK) return fail(s, st);
    }
    for (int a = 0; a < s->na; a++) {
        arrays[a] = slot_array(s, sl, a);
        if ((s->mode & ZOFF_SWAP_READ) && (s->mask & (1u << a)) && s->grp[g].fresh[a])
            fill_init(s, a, arrays[a], s->grp[g].count);
    }
    for (int a = s->na; a < ZOFF_SWAP_MAX_ARRAYS; a++) arrays[a] = NULL;
    *group = g;
    s->handed_out = true;
    return ZOFF_OK;
}

zoff_status zoff_swapper_release(zoff_swapper *s) {
    ZOFF_TRY(check_broken(s));
    if (!s->in_pass || !s->handed_out)
        return zoff_error(ZOFF_ERR_INTERNAL, "zoff_swapper_release: no group was handed out");
    int j = s->pos, g = s->order[j];
    slot *sl = slot_of(s, j);
    if (s->mode & ZOFF_SWAP_WRITE) {
        /* the slot's previous write is complete (its buffer was read into or waited for) */
        if (sl->write_group >= 0 && s->grp[sl->write_group].last_write == &sl->wr)
            s->grp[sl->write_group].last_write = NULL;
        zoff_aio_request *w = &sl->wr;
        s->stats.bytes_written += group_request(s, w, sl, g, ZOFF_AIO_WRITE, ZOFF_AIO_CRC_STORE, NULL);
        for (int a = 0; a < s->na; a++)
            if (s->mask & (1u << a)) s->grp[g].fresh[a] = false;
        zoff_status st = zoff_aio_submit(s->io, w);
        if (st != ZOFF_OK) return fail(s, st);
        s->grp[g].last_write = w;
        sl->write_group = g;
        if (!s->o.pipeline_write) {
            double t0 = zoff_now();
            st = zoff_aio_wait(s->io, w);
            s->stats.t_wait_write += zoff_now() - t0;
            if (st != ZOFF_OK) return fail(s, st);
        }
    }
    s->handed_out = false;
    s->pos++;
    while ((s->mode & ZOFF_SWAP_READ) && s->o.pipeline_read && s->issued < s->n && s->issued - s->pos < s->nslots) {
        zoff_status st = issue_read(s, s->issued++);
        if (st != ZOFF_OK) return fail(s, st);
    }
    return ZOFF_OK;
}

zoff_status zoff_swapper_end(zoff_swapper *s) {
    ZOFF_TRY(check_broken(s));
    if (!s->in_pass || s->handed_out || s->pos != s->n)
        return zoff_error(ZOFF_ERR_INTERNAL, "zoff_swapper_end: the pass visited %d of %d groups", s->pos, s->n);
    s->in_pass = false;
    if (s->mode == ZOFF_SWAP_UPDATE && s->o.pipeline_read && s->n > 0) {
        /* read ahead the first groups of the next, identical pass */
        memcpy(s->pf_order, s->order, (size_t)s->n * sizeof *s->order);
        s->pf_n = s->n;
        s->pf_mask = s->mask;
        s->pf_count = s->n < s->nslots ? s->n : s->nslots;
        s->q0 = s->qnext; /* visits of the next pass */
        s->mode = ZOFF_SWAP_READ;
        for (int j = 0; j < s->pf_count; j++) {
            zoff_status st = issue_read(s, j);
            if (st != ZOFF_OK) {
                /* what was queued must finish before the buffers can be reused */
                s->pf_count = j;
                s->pf_valid = true;
                (void)drop_prefetch(s);
                return fail(s, st);
            }
        }
        s->pf_valid = true;
    }
    return ZOFF_OK;
}

zoff_status zoff_swapper_flush(zoff_swapper *s) {
    ZOFF_TRY(check_broken(s));
    double t0 = zoff_now();
    for (int i = 0; i < s->nslots; i++) {
        zoff_status st = zoff_aio_wait(s->io, &s->slots[i].wr);
        if (st != ZOFF_OK) {
            s->stats.t_wait_write += zoff_now() - t0;
            return fail(s, st);
        }
    }
    s->stats.t_wait_write += zoff_now() - t0;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ ranges between passes */

/* Blocks a range moves at a time: ZOFF_SWAP_RANGE_BYTES, or what fits in slot 0 if less (one block
 * of any array always does: the slot holds each array of the largest group). */
static int64_t range_blocks(const zoff_swapper *s) {
    size_t bs = (size_t)s->o.aio.block_size;
    size_t cap = s->slot_bytes < ZOFF_SWAP_RANGE_BYTES ? s->slot_bytes : ZOFF_SWAP_RANGE_BYTES;
    return cap / bs > 0 ? (int64_t)(cap / bs) : 1;
}

/* Bytes of blocks [c0, c1) of array a of group g (an array's last block may be short). */
static size_t blocks_bytes(const zoff_swapper *s, int g, int a, int64_t c0, int64_t c1) {
    size_t bs = (size_t)s->o.aio.block_size, end = (size_t)c1 * bs;
    return (end < s->grp[g].abytes[a] ? end : s->grp[g].abytes[a]) - (size_t)c0 * bs;
}

/* Blocks [c0, c1) of array a of group g between buf and the file, synchronously: a write stores
 * their checksums, a read checks them. */
static zoff_status blocks_io(zoff_swapper *s, int g, int a, int64_t c0, int64_t c1, void *buf, zoff_aio_op op) {
    size_t bytes = blocks_bytes(s, g, a, c0, c1);
    zoff_aio_request r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.file = s->f;
    r.flags = op == ZOFF_AIO_READ ? ZOFF_AIO_CRC_VERIFY : ZOFF_AIO_CRC_STORE;
    r.nseg = 1;
    r.seg[0] = (zoff_aio_segment){.buf = buf, .offset = s->grp[g].off[a] + c0 * s->o.aio.block_size,
                                  .bytes = bytes, .crcs = crcs_of(s, g, a) + c0};
    zoff_status st = op == ZOFF_AIO_READ ? check_file(s) : ZOFF_OK;
    if (st == ZOFF_OK) st = zoff_aio_submit(s->io, &r);
    if (st == ZOFF_OK) st = zoff_aio_wait(s->io, &r);
    if (st != ZOFF_OK) return fail(s, st);
    if (op == ZOFF_AIO_READ) s->stats.bytes_read += (int64_t)bytes;
    else s->stats.bytes_written += (int64_t)bytes;
    return ZOFF_OK;
}

/* The contents of blocks [c0, c1) of array a of group g into dst: from the file, or for the
 * blocks of a never-written array that no range has written either, init_value[a]. */
static zoff_status blocks_load(zoff_swapper *s, int g, int a, int64_t c0, int64_t c1, char *dst) {
    const group_info *gi = &s->grp[g];
    int64_t d1 = !gi->fresh[a] || gi->written[a] >= c1 ? c1 : gi->written[a] > c0 ? gi->written[a] : c0;
    if (d1 > c0) ZOFF_TRY(blocks_io(s, g, a, c0, d1, dst, ZOFF_AIO_READ));
    if (d1 < c1) {
        size_t es = zoff_dtype_size(s->o.dtype[a]), bs = (size_t)s->o.aio.block_size;
        int64_t e0 = (int64_t)((size_t)d1 * bs / es), e1 = (int64_t)((size_t)c1 * bs / es);
        if (e1 > gi->count) e1 = gi->count;
        if (e1 > e0) fill_init(s, a, dst + (size_t)(d1 - c0) * bs, e1 - e0);
    }
    return ZOFF_OK;
}

/* A never-written array a of group g: blocks [c0, c1) get init_value[a] on disk (through slot 0). */
static zoff_status blocks_init(zoff_swapper *s, int g, int a, int64_t c0, int64_t c1) {
    group_info *gi = &s->grp[g];
    s->rg = -1;
    for (int64_t k = range_blocks(s), c = c0; c < c1; c += k) {
        int64_t e = c + k < c1 ? c + k : c1;
        gi->written[a] = c; /* blocks_load gives init_value for all of [c, e) */
        ZOFF_TRY(blocks_load(s, g, a, c, e, s->slots[0].buf));
        ZOFF_TRY(blocks_io(s, g, a, c, e, s->slots[0].buf, ZOFF_AIO_WRITE));
        gi->written[a] = e;
    }
    return ZOFF_OK;
}

/* An array that ranges wrote in part while it was never written: the rest gets init_value on disk
 * (the passes read an array whole). Slot 0 becomes the passes' again. */
static zoff_status range_settle(zoff_swapper *s) {
    s->rg = -1;
    for (int g = 0; g < s->ng; g++)
        for (int a = 0; a < s->na; a++) {
            group_info *gi = &s->grp[g];
            if (!gi->fresh[a] || gi->written[a] == 0) continue;
            ZOFF_TRY(drop_prefetch(s));
            ZOFF_TRY(zoff_swapper_flush(s));
            ZOFF_TRY(blocks_init(s, g, a, gi->written[a], (int64_t)nchunks(s, g, a)));
            gi->fresh[a] = false;
        }
    return ZOFF_OK;
}

/* Elements [first, first + count) of array a of group g to fn, from the blocks in slot 0 when they
 * are there, else reading range_blocks() blocks from the one holding `first` on (kept for the next
 * read: sequential reads read each block once). */
static zoff_status range_read(zoff_swapper *s, int g, int a, int64_t first, int64_t count, zoff_swapper_range_fn fn,
                              void *arg) {
    const size_t es = zoff_dtype_size(s->o.dtype[a]), bs = (size_t)s->o.aio.block_size;
    const int64_t nb = (int64_t)nchunks(s, g, a);
    char *buf = s->slots[0].buf;
    for (int64_t p = first; p < first + count;) {
        int64_t c = (int64_t)((size_t)p * es / bs);
        if (s->rg != g || s->ra != a || c < s->rc0 || c >= s->rc1) {
            int64_t c1 = c + range_blocks(s) < nb ? c + range_blocks(s) : nb;
            s->rg = -1;
            ZOFF_TRY(blocks_load(s, g, a, c, c1, buf));
            s->rg = g, s->ra = a, s->rc0 = c, s->rc1 = c1;
        }
        int64_t end = (int64_t)((size_t)s->rc1 * bs / es);
        if (end > first + count) end = first + count;
        fn(arg, p - first, end - p, buf + (size_t)p * es - (size_t)s->rc0 * bs);
        p = end;
    }
    return ZOFF_OK;
}

/* Elements [first, first + count) of array a of group g from fn, range_blocks() blocks at a time:
 * a block the range covers in part is read first (its other bytes stay), then the blocks are
 * written whole with their checksums. A never-written array is written up to the range first. */
static zoff_status range_write(zoff_swapper *s, int g, int a, int64_t first, int64_t count, zoff_swapper_range_fn fn,
                               void *arg) {
    group_info *gi = &s->grp[g];
    const int64_t es = (int64_t)zoff_dtype_size(s->o.dtype[a]), bs = s->o.aio.block_size;
    const int64_t b1 = (first + count) * es, data_end = gi->count * es, cend = (b1 - 1) / bs + 1;
    char *buf = s->slots[0].buf;
    for (int64_t p = first * es; p < b1;) { /* bytes [p, q) of the array, blocks [c0, c1) */
        int64_t c0 = p / bs, c1 = c0 + range_blocks(s) < cend ? c0 + range_blocks(s) : cend;
        int64_t q = c1 * bs < b1 ? c1 * bs : b1, abytes = (int64_t)gi->abytes[a];
        int64_t last_end = c1 * bs < abytes ? c1 * bs : abytes; /* of block c1 - 1 */
        if (gi->fresh[a] && gi->written[a] < c0) ZOFF_TRY(blocks_init(s, g, a, gi->written[a], c0));
        s->rg = -1;
        if (p > c0 * bs) ZOFF_TRY(blocks_load(s, g, a, c0, c0 + 1, buf));
        if (q < last_end && q < data_end && (c1 - 1 > c0 || p == c0 * bs))
            ZOFF_TRY(blocks_load(s, g, a, c1 - 1, c1, buf + (c1 - 1 - c0) * bs));
        fn(arg, p / es - first, (q - p) / es, buf + (p - c0 * bs));
        ZOFF_TRY(blocks_io(s, g, a, c0, c1, buf, ZOFF_AIO_WRITE));
        if (gi->fresh[a] && gi->written[a] < c1) gi->written[a] = c1;
        if (gi->fresh[a] && gi->written[a] >= (int64_t)nchunks(s, g, a)) gi->fresh[a] = false;
        s->rg = g, s->ra = a, s->rc0 = c0, s->rc1 = c1;
        p = q;
    }
    return ZOFF_OK;
}

zoff_status zoff_swapper_range(zoff_swapper *s, int group, int array, int64_t first, int64_t count, bool write,
                               zoff_swapper_range_fn fn, void *arg) {
    ZOFF_TRY(check_broken(s));
    if (s->in_pass)
        return zoff_error(ZOFF_ERR_INTERNAL, "zoff_swapper_range: a pass over the NVMe state in %s is in progress (%d "
                                             "of %d sub-groups)", s->path, s->pos, s->n);
    if (group < 0 || group >= s->ng || array < 0 || array >= s->na || first < 0 || count < 0 ||
        first > s->grp[group].count - count)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_swapper_range: group %d array %d elements [%lld, +%lld) outside %d "
                                            "groups x %d arrays (the group has %lld elements)", group, array,
                          (long long)first, (long long)count, s->ng, s->na,
                          (long long)(group >= 0 && group < s->ng ? s->grp[group].count : 0));
    /* slot 0 is the ranges' from now on: the read-ahead goes, the last pass's writes complete */
    ZOFF_TRY(drop_prefetch(s));
    ZOFF_TRY(zoff_swapper_flush(s));
    if (count == 0) return ZOFF_OK;
    return write ? range_write(s, group, array, first, count, fn, arg)
                 : range_read(s, group, array, first, count, fn, arg);
}
