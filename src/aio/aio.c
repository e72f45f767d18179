/* Asynchronous aligned file I/O: requests, files, checksums, fault injection
 * and the thread-pool engine. The io_uring engine is in aio_uring.c; both take
 * chunks from the same request queue (zoff_aio__take_chunk). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "zoff/resources.h"
#include <unistd.h>

#include "aio/aio_internal.h"
/* snprintf for messages that may be cut (paths are long; the message stays readable). */
__attribute__((format(printf, 3, 4))) static void msgf(char *buf, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, n, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ checksums */

uint32_t zoff_aio_crc32c(uint32_t crc, const void *data, size_t n) { return zoff_crc32c(crc, data, n); }

/* ------------------------------------------------------------------ fault hook */

static pthread_mutex_t g_hook_mu = PTHREAD_MUTEX_INITIALIZER;
static zoff_aio_fault_fn g_hook_fn;
static void *g_hook_arg;

void zoff_aio_set_fault_hook(zoff_aio_fault_fn fn, void *arg) {
    pthread_mutex_lock(&g_hook_mu);
    g_hook_fn = fn;
    g_hook_arg = arg;
    pthread_mutex_unlock(&g_hook_mu);
}

/* ------------------------------------------------------------------ options */

void zoff_aio_options_default(zoff_aio_options *o) {
    memset(o, 0, sizeof *o);
    o->engine = ZOFF_AIO_AUTO;
    o->block_size = 1 << 20;
    o->queue_depth = 8;
    o->threads = 1;
    o->overlap_events = true;
    o->direct = 1;
}

bool zoff_aio_options_add_fixed(zoff_aio_options *o, void *buf, size_t bytes) {
    if (o->nfixed >= ZOFF_AIO_MAX_FIXED) return false;
    o->fixed_buf[o->nfixed] = buf;
    o->fixed_bytes[o->nfixed++] = bytes;
    return true;
}

void zoff_aio_options_from_config(const zoff_aio_config *c, zoff_aio_options *o) {
    zoff_aio_options_default(o);
    o->block_size = c->block_size;
    o->queue_depth = c->queue_depth;
    o->threads = c->intra_op_parallelism;
    o->single_submit = c->single_submit;
    o->overlap_events = c->overlap_events;
}

/* ------------------------------------------------------------------ request queue */

static const char *op_name(zoff_aio_op op) { return op == ZOFF_AIO_READ ? "reading" : "writing"; }

static void unlink_request(zoff_aio *a, zoff_aio_request *r) {
    zoff_aio_request *prev = NULL;
    for (zoff_aio_request *q = a->head; q; prev = q, q = q->priv.next) {
        if (q != r) continue;
        if (prev) prev->priv.next = q->priv.next;
        else a->head = q->priv.next;
        if (a->tail == q) a->tail = prev;
        q->priv.next = NULL;
        return;
    }
}

static void finish_request(zoff_aio *a, zoff_aio_request *r) {
    r->priv.state = 2;
    pthread_cond_broadcast(&a->cv_done);
    pthread_cond_broadcast(&a->cv_work); /* requests that follow it may start */
}

/* Stop issuing r's chunks; complete it when nothing is in flight. */
static void stop_issuing(zoff_aio *a, zoff_aio_request *r) {
    if (!r->priv.issuing_done) {
        unlink_request(a, r);
        r->priv.issuing_done = true;
    }
    if (r->priv.inflight == 0) finish_request(a, r);
}

bool zoff_aio__take_chunk(zoff_aio *a, aio_chunk *c) {
    zoff_aio_request *r = a->head;
    while (r) {
        zoff_aio_request *next = r->priv.next;
        bool ready = true;
        zoff_aio_request *failed = NULL;
        for (int d = 0; d < 2; d++) {
            zoff_aio_request *dep = r->after[d];
            if (!dep || dep->priv.state == 0 || dep->priv.gen != r->priv.after_gen[d]) continue;
            if (dep->priv.state != 2) {
                ready = false;
                break;
            }
            if (dep->priv.status != ZOFF_OK) {
                failed = dep;
                break;
            }
        }
        if (failed) {
            r->priv.status = failed->priv.status;
            msgf(r->priv.msg, sizeof r->priv.msg, "%s (so %s %s, which follows it, was not started)",
                     failed->priv.msg, op_name(r->op), r->file->path);
            stop_issuing(a, r);
            r = next;
            continue;
        }
        if (!ready) {
            r = next;
            continue;
        }
        while (r->priv.cur_seg < r->nseg && r->priv.cur_off >= r->seg[r->priv.cur_seg].bytes) {
            r->priv.cur_seg++;
            r->priv.cur_off = 0;
        }
        if (r->priv.cur_seg >= r->nseg) { /* nothing (more) to issue */
            stop_issuing(a, r);
            r = next;
            continue;
        }
        const zoff_aio_segment *sg = &r->seg[r->priv.cur_seg];
        size_t bs = (size_t)a->o.block_size, left = sg->bytes - r->priv.cur_off;
        memset(c, 0, sizeof *c);
        c->r = r;
        c->seg = r->priv.cur_seg;
        c->off = r->priv.cur_off;
        c->len = left < bs ? left : bs;
        c->index = r->priv.cur_off / bs;
        r->priv.cur_off += c->len;
        r->priv.inflight++;
        while (r->priv.cur_seg < r->nseg && r->priv.cur_off >= r->seg[r->priv.cur_seg].bytes) {
            r->priv.cur_seg++;
            r->priv.cur_off = 0;
        }
        if (r->priv.cur_seg >= r->nseg) {
            unlink_request(a, r);
            r->priv.issuing_done = true;
        }
        return true;
    }
    return false;
}

bool zoff_aio__prepare_chunk(zoff_aio *a, aio_chunk *c) {
    zoff_aio_request *r = c->r;
    if (a->o.fault) {
        zoff_aio_fault_site site = {.op = r->op, .path = r->file->path, .offset = zoff_aio__chunk_offset(c),
                                    .bytes = c->len};
        int64_t f = a->o.fault(a->o.fault_arg, &site);
        if (f < 0) {
            c->err = (int)-f;
            return false;
        }
        if (f > 0 && (size_t)f < c->len) c->limit = (size_t)f;
    }
    return true;
}

void zoff_aio__store_crc(aio_chunk *c) {
    zoff_aio_request *r = c->r;
    if (r->op == ZOFF_AIO_WRITE && (r->flags & ZOFF_AIO_CRC_STORE))
        r->seg[c->seg].crcs[c->index] = zoff_aio_crc32c(0, (const char *)r->seg[c->seg].buf + c->off, c->len);
}

void zoff_aio__finish_chunk(zoff_aio *a, aio_chunk *c) {
    (void)a;
    zoff_aio_request *r = c->r;
    if (r->op != ZOFF_AIO_READ || !(r->flags & ZOFF_AIO_CRC_VERIFY) || c->err || c->done < c->len) return;
    c->crc_got = zoff_aio_crc32c(0, (const char *)r->seg[c->seg].buf + c->off, c->len);
    c->crc_bad = c->crc_got != r->seg[c->seg].crcs[c->index];
}

static void format_free_space(const char *path, char *buf, size_t n) {
    char dir[4096];
    msgf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) *slash = '\0';
    else if (slash) slash[1] = '\0';
    else msgf(dir, sizeof dir, ".");
    size_t fb = 0;
    char b[32];
    if (zoff_disk_free(dir, &fb, NULL, 0))
        msgf(buf, n, "%s free in %s", zoff_format_bytes(fb, b, sizeof b), dir);
    else
        msgf(buf, n, "free space in %s unknown", dir);
}

/* A swap file's own advice for a full disk (zoff_disk_full_advice). */
#define SWAP_DISK_FULL_ADVICE "free space there or point its nvme_path (offload_optimizer or offload_param) at a larger disk"

static zoff_status chunk_error(aio_chunk *c, char *msg, size_t n) {
    zoff_aio_request *r = c->r;
    const char *path = r->file->path;
    long long off = (long long)(r->seg[c->seg].offset + (int64_t)c->off);
    if (c->err == ENOSPC || c->err == EDQUOT) {
        char fs[4200];
        format_free_space(path, fs, sizeof fs);
        msgf(msg, n,
                 "disk full %s %s at offset %lld (%zu bytes): %s (%s): %s", op_name(r->op), path, off, c->len,
                 strerror(c->err), fs, zoff_disk_full_advice(SWAP_DISK_FULL_ADVICE));
        return ZOFF_ERR_IO;
    }
    if (c->err) {
        msgf(msg, n,
                 "I/O error %s %s at offset %lld (%zu bytes): %s (errno %d); the disk or file system failed the "
                 "request: check the kernel log (dmesg) and the disk",
                 op_name(r->op), path, off, c->len, strerror(c->err), c->err);
        return ZOFF_ERR_IO;
    }
    if (c->crc_bad) {
        msgf(msg, n,
                 "%s changed behind zoff's back: the %zu bytes at offset %lld read back with CRC32C %08x, but zoff "
                 "wrote %08x; something else wrote to the file or the disk returned wrong data, so its contents "
                 "cannot be trusted",
                 path, c->len, off, c->crc_got, r->seg[c->seg].crcs[c->index]);
        return ZOFF_ERR_FORMAT;
    }
    /* short transfer */
    struct stat st;
    long long size = fstat(r->file->fd, &st) == 0 ? (long long)st.st_size : -1;
    if (r->op == ZOFF_AIO_READ)
        msgf(msg, n,
                 "short read of %s at offset %lld: got %zu of %zu bytes; the file is %lld bytes long (was it truncated "
                 "behind zoff's back?)",
                 path, off, c->done, c->len, size);
    else
        msgf(msg, n, "short write to %s at offset %lld: wrote %zu of %zu bytes (disk full?); the file is %lld bytes",
                 path, off, c->done, c->len, size);
    return ZOFF_ERR_IO;
}

void zoff_aio__complete_chunk(zoff_aio *a, aio_chunk *c) {
    zoff_aio_request *r = c->r;
    r->priv.inflight--;
    bool bad = c->err || c->crc_bad || c->done < c->len;
    /* chunks complete in any order: report the failure at the lowest offset */
    int64_t where = zoff_aio__chunk_offset(c) - (int64_t)c->done;
    if (bad && (r->priv.status == ZOFF_OK || where < r->priv.err_offset)) {
        bool first = r->priv.status == ZOFF_OK;
        r->priv.status = chunk_error(c, r->priv.msg, sizeof r->priv.msg);
        r->priv.err_offset = where;
        r->priv.err = c->err;
        if (first) {
            stop_issuing(a, r);
            return;
        }
    }
    if (r->priv.issuing_done && r->priv.inflight == 0) finish_request(a, r);
}

zoff_status zoff_aio_submit(zoff_aio *a, zoff_aio_request *r) {
    if (!a || !r || !r->file)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_submit: missing engine, request or file");
    if (r->nseg < 0 || r->nseg > ZOFF_AIO_MAX_SEGMENTS)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_submit: %d segments (at most %d)", r->nseg,
                          ZOFF_AIO_MAX_SEGMENTS);
    for (int i = 0; i < r->nseg; i++) {
        const zoff_aio_segment *s = &r->seg[i];
        if (((uintptr_t)s->buf % ZOFF_AIO_ALIGN) || (s->offset % ZOFF_AIO_ALIGN) || (s->bytes % ZOFF_AIO_ALIGN) ||
            s->offset < 0 || (!s->buf && s->bytes))
            return zoff_error(ZOFF_ERR_INVALID,
                              "zoff_aio_submit: %s segment %d of %s (buffer %p, offset %lld, %zu bytes) is not "
                              "aligned to %d bytes, as O_DIRECT requires",
                              op_name(r->op), i, r->file->path, s->buf, (long long)s->offset, s->bytes, ZOFF_AIO_ALIGN);
        if ((r->flags & (ZOFF_AIO_CRC_STORE | ZOFF_AIO_CRC_VERIFY)) && s->bytes && !s->crcs)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_submit: checksums requested but segment %d has no crcs", i);
    }
    if (r->after[0] == r || r->after[1] == r)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_submit: a request cannot follow itself");
    pthread_mutex_lock(&a->mu);
    if (r->priv.state == 1) {
        pthread_mutex_unlock(&a->mu);
        return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_submit: %s %s is already in flight", op_name(r->op),
                          r->file->path);
    }
    r->priv.state = 1;
    r->priv.gen = ++a->gen;
    for (int d = 0; d < 2; d++) r->priv.after_gen[d] = r->after[d] ? r->after[d]->priv.gen : 0;
    r->priv.cur_seg = 0;
    r->priv.cur_off = 0;
    r->priv.inflight = 0;
    r->priv.issuing_done = false;
    r->priv.status = ZOFF_OK;
    r->priv.err = 0;
    r->priv.msg[0] = '\0';
    r->priv.next = NULL;
    if (a->tail) a->tail->priv.next = r;
    else a->head = r;
    a->tail = r;
    pthread_cond_broadcast(&a->cv_work);
    pthread_mutex_unlock(&a->mu);
    return ZOFF_OK;
}

zoff_status zoff_aio_wait(zoff_aio *a, zoff_aio_request *r) {
    pthread_mutex_lock(&a->mu);
    while (r->priv.state == 1) pthread_cond_wait(&a->cv_done, &a->mu);
    zoff_status s = r->priv.state == 2 ? r->priv.status : ZOFF_OK;
    char msg[sizeof r->priv.msg];
    memcpy(msg, r->priv.msg, sizeof msg);
    pthread_mutex_unlock(&a->mu);
    if (s != ZOFF_OK) return zoff_error(s, "%s", msg);
    return ZOFF_OK;
}

int zoff_aio_request_errno(const zoff_aio_request *r, int64_t *offset) {
    if (offset) *offset = r->priv.err_offset;
    return r->priv.status == ZOFF_OK ? 0 : r->priv.err;
}

bool zoff_aio_done(zoff_aio *a, zoff_aio_request *r) {
    pthread_mutex_lock(&a->mu);
    bool d = r->priv.state != 1;
    pthread_mutex_unlock(&a->mu);
    return d;
}

/* ------------------------------------------------------------------ thread-pool engine */

static void pool_transfer(zoff_aio *a, aio_chunk *c) {
    (void)a;
    int fd = c->r->file->fd;
    while (c->done < c->len) {
        size_t want = c->len - c->done;
        if (c->limit) {
            if (c->done >= c->limit) break; /* injected short transfer */
            if (want > c->limit - c->done) want = c->limit - c->done;
        }
        ssize_t n = c->r->op == ZOFF_AIO_READ ? pread(fd, zoff_aio__chunk_buf(c), want, zoff_aio__chunk_offset(c))
                                              : pwrite(fd, zoff_aio__chunk_buf(c), want, zoff_aio__chunk_offset(c));
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            c->err = errno;
            return;
        }
        if (n == 0) return; /* end of file (read) or nothing written: reported as short */
        c->done += (size_t)n;
    }
}

static void *pool_main(void *arg) {
    zoff_aio *a = arg;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        aio_chunk c;
        if (zoff_aio__take_chunk(a, &c)) {
            pthread_mutex_unlock(&a->mu);
            if (zoff_aio__prepare_chunk(a, &c)) {
                zoff_aio__store_crc(&c);
                pool_transfer(a, &c);
                zoff_aio__finish_chunk(a, &c);
            }
            pthread_mutex_lock(&a->mu);
            zoff_aio__complete_chunk(a, &c);
            continue;
        }
        if (a->quit) break;
        pthread_cond_wait(&a->cv_work, &a->mu);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static zoff_status pool_start(zoff_aio *a) {
    int64_t n = a->o.threads * a->o.queue_depth;
    if (n > 256) n = 256;
    a->threads = calloc((size_t)n, sizeof *a->threads);
    if (!a->threads) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %lld I/O threads", (long long)n);
    for (int64_t i = 0; i < n; i++) {
        if (pthread_create(&a->threads[i], NULL, pool_main, a) != 0)
            return zoff_error(ZOFF_ERR_INTERNAL, "cannot start I/O thread %lld of %lld: %s", (long long)i,
                              (long long)n, strerror(errno));
        a->nthreads++;
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ create / destroy */

zoff_aio_engine_kind zoff_aio_engine(const zoff_aio *a) { return a->kind; }
const char *zoff_aio_describe(const zoff_aio *a) { return a->describe; }

int64_t zoff_aio_fixed_requests(const zoff_aio *a) { return __atomic_load_n(&a->fixed_requests, __ATOMIC_RELAXED); }

void zoff_aio_destroy(zoff_aio *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->quit = true;
    pthread_cond_broadcast(&a->cv_work);
    pthread_mutex_unlock(&a->mu);
#ifdef ZOFF_HAVE_URING
    if (a->kind == ZOFF_AIO_URING) zoff_aio__uring_stop(a);
#endif
    if (a->kind == ZOFF_AIO_THREADS)
        for (int i = 0; i < a->nthreads; i++) pthread_join(a->threads[i], NULL);
    free(a->threads);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv_work);
    pthread_cond_destroy(&a->cv_done);
    free(a);
}

zoff_status zoff_aio_create(const zoff_aio_options *opts, zoff_aio **out) {
    *out = NULL;
    zoff_aio_options o;
    if (opts) o = *opts;
    else zoff_aio_options_default(&o);
    if (o.block_size <= 0 || o.block_size % ZOFF_AIO_ALIGN)
        return zoff_error(ZOFF_ERR_CONFIG, "aio.block_size %lld is not a positive multiple of %d bytes (O_DIRECT "
                                           "alignment); use e.g. 1048576", (long long)o.block_size, ZOFF_AIO_ALIGN);
    if (o.queue_depth < 1 || o.queue_depth > 4096)
        return zoff_error(ZOFF_ERR_CONFIG, "aio.queue_depth %lld is out of range; allowed: 1 to 4096",
                          (long long)o.queue_depth);
    if (o.threads < 1 || o.threads > 64)
        return zoff_error(ZOFF_ERR_CONFIG, "aio.intra_op_parallelism %lld is out of range; allowed: 1 to 64",
                          (long long)o.threads);
    if (o.nfixed < 0 || o.nfixed > ZOFF_AIO_MAX_FIXED)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_options.nfixed %d: allowed 0 to %d", o.nfixed, ZOFF_AIO_MAX_FIXED);
    for (int i = 0; i < o.nfixed; i++)
        if (!o.fixed_buf[i] || o.fixed_bytes[i] == 0)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_aio_options.fixed_buf[%d]: no buffer or no bytes", i);
    if (!o.fault) {
        pthread_mutex_lock(&g_hook_mu);
        o.fault = g_hook_fn;
        o.fault_arg = g_hook_arg;
        pthread_mutex_unlock(&g_hook_mu);
    }
    zoff_aio_engine_kind want = o.engine;
    const char *env = getenv("ZOFF_AIO_ENGINE");
    if (want == ZOFF_AIO_AUTO && env && *env) {
        if (!strcmp(env, "uring")) want = ZOFF_AIO_URING;
        else if (!strcmp(env, "threads")) want = ZOFF_AIO_THREADS;
        else if (strcmp(env, "auto"))
            return zoff_error(ZOFF_ERR_CONFIG, "$ZOFF_AIO_ENGINE is '%s'; allowed: auto, uring, threads", env);
    }
    zoff_aio *a = calloc(1, sizeof *a);
    if (!a) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the I/O engine");
    a->o = o;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv_work, NULL);
    pthread_cond_init(&a->cv_done, NULL);
    a->kind = ZOFF_AIO_THREADS;
    char why[256] = "", bs[32];
    zoff_format_bytes((size_t)o.block_size, bs, sizeof bs);
#ifdef ZOFF_HAVE_URING
    if (want != ZOFF_AIO_THREADS) {
        if (zoff_aio__uring_start(a, why, sizeof why) == ZOFF_OK) {
            a->kind = ZOFF_AIO_URING;
        } else if (want == ZOFF_AIO_URING) {
            zoff_aio_destroy(a);
            return zoff_error(ZOFF_ERR_UNSUPPORTED, "io_uring was asked for but is unavailable: %s; use the thread "
                                                    "pool (ZOFF_AIO_ENGINE=threads)", why);
        }
    }
#else
    if (want == ZOFF_AIO_URING) {
        zoff_aio_destroy(a);
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "io_uring was asked for but this build has no liburing "
                                                "(apt-get install liburing-dev and rebuild)");
    }
    if (want == ZOFF_AIO_AUTO) snprintf(why, sizeof why, "built without liburing");
#endif
    if (a->kind == ZOFF_AIO_URING) {
        snprintf(a->describe, sizeof a->describe, "io_uring, %lld thread%s x queue depth %lld, %s blocks%s%s%s",
                 (long long)o.threads, o.threads == 1 ? "" : "s", (long long)o.queue_depth, bs,
                 o.single_submit ? ", single submit" : "", a->fixed_note[0] ? ", " : "", a->fixed_note);
    } else {
        zoff_status s = pool_start(a);
        if (s != ZOFF_OK) {
            zoff_aio_destroy(a);
            return s;
        }
        snprintf(a->describe, sizeof a->describe, "thread pool, %d pread/pwrite workers, %s blocks%s%s%s", a->nthreads,
                 bs, why[0] ? " (io_uring unavailable: " : "", why, why[0] ? ")" : "");
    }
    *out = a;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ files */

zoff_status zoff_aio_file_open(zoff_aio *a, const char *path, int flags, zoff_aio_file **out) {
    *out = NULL;
    if (strlen(path) >= sizeof((zoff_aio_file *)0)->path)
        return zoff_error(ZOFF_ERR_INVALID, "file name too long (%zu bytes): %s", strlen(path), path);
    zoff_aio_file *f = calloc(1, sizeof *f);
    if (!f) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory opening %s", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fl = O_RDWR | O_CLOEXEC;
    /* create buffered first: an O_DIRECT open that fails may still have created the file */
    int fd = open(path, fl | ((flags & ZOFF_AIO_CREATE) ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0) {
        int err = errno;
        free(f);
        zoff_status st = zoff_error(ZOFF_ERR_IO, "cannot %s %s: %s%s", (flags & ZOFF_AIO_CREATE) ? "create" : "open",
                                    path, strerror(err),
                                    err == EEXIST ? " (remove it, or another zoff process is using it)"
                                    : err == ENOENT ? " (does the directory exist?)"
                                                    : "");
        errno = err; /* the caller may take another name on EEXIST (zoff_swapper_open_file) */
        return st;
    }
    f->fd = fd;
    if (a->o.direct) {
        int dfd = open(path, fl | O_DIRECT);
        if (dfd >= 0) {
            close(fd);
            f->fd = dfd;
            f->direct = true;
        } else {
            msgf(f->note, sizeof f->note, "O_DIRECT not supported by the file system of %s: %s", path,
                     strerror(errno));
        }
    } else {
        snprintf(f->note, sizeof f->note, "buffered I/O was asked for");
    }
    /* the name is needed above (the O_DIRECT reopen); from here the open descriptor is the file */
    if ((flags & ZOFF_AIO_CREATE) && (flags & ZOFF_AIO_TEMPORARY) && unlink(path) != 0) {
        int err = errno;
        close(f->fd);
        free(f);
        return zoff_error(ZOFF_ERR_IO, "cannot unlink the temporary file %s after creating it: %s", path,
                          strerror(err));
    }
    *out = f;
    return ZOFF_OK;
}

/* The files this process has reserved space for and not closed: a full disk's message counts what
 * the process's other swap files already hold on the same file system (stage 3 with both
 * offload_optimizer and offload_param on one disk), which is free again once it has exited. */
static pthread_mutex_t g_reserved_mu = PTHREAD_MUTEX_INITIALIZER;
static zoff_aio_file *g_reserved;

static void reserved_forget(zoff_aio_file *f) {
    pthread_mutex_lock(&g_reserved_mu);
    for (zoff_aio_file **p = &g_reserved; *p; p = &(*p)->next_reserved)
        if (*p == f) {
            *p = f->next_reserved;
            break;
        }
    pthread_mutex_unlock(&g_reserved_mu);
}

/* The ranks of the job on this host (zoff_aio_set_host_ranks): each reserves its own swap files. */
static _Atomic int g_host_ranks = 1;

void zoff_aio_set_host_ranks(int n) { g_host_ranks = n > 1 ? n : 1; }

/* Bytes this process's other reserved files hold on dev, and how many they are. */
static int64_t reserved_elsewhere(const zoff_aio_file *f, dev_t dev, int *count) {
    int64_t sum = 0;
    *count = 0;
    pthread_mutex_lock(&g_reserved_mu);
    for (const zoff_aio_file *o = g_reserved; o; o = o->next_reserved)
        if (o != f && o->dev == dev) {
            sum += o->reserved;
            ++*count;
        }
    pthread_mutex_unlock(&g_reserved_mu);
    return sum;
}

void zoff_aio_file_close(zoff_aio_file *f) {
    if (!f) return;
    if (f->reserved) reserved_forget(f);
    close(f->fd);
    free(f);
}

bool zoff_aio_file_direct(const zoff_aio_file *f) { return f->direct; }
const char *zoff_aio_file_direct_note(const zoff_aio_file *f) { return f->note; }
const char *zoff_aio_file_path(const zoff_aio_file *f) { return f->path; }
int zoff_aio_file_fd(const zoff_aio_file *f) { return f->fd; }

/* Remember that f now holds `bytes` (for reserved_elsewhere). */
static void reserved_add(zoff_aio_file *f, int64_t bytes) {
    struct stat st;
    if (f->reserved || fstat(f->fd, &st) != 0) return;
    f->dev = st.st_dev;
    f->reserved = bytes;
    pthread_mutex_lock(&g_reserved_mu);
    f->next_reserved = g_reserved;
    g_reserved = f;
    pthread_mutex_unlock(&g_reserved_mu);
}

zoff_status zoff_aio_file_reserve(zoff_aio_file *f, int64_t bytes) {
    char need[32], fs[4200];
    if (fallocate(f->fd, 0, 0, bytes) == 0) {
        reserved_add(f, bytes);
        return ZOFF_OK;
    }
    int err = errno;
    if (err == ENOSPC || err == EDQUOT) {
        /* ext4 and xfs keep the part a failed fallocate got ("0 B free" said while the disk has room):
         * give it back first, the file is dropped anyway; the free space said is then the disk's */
        const bool released = ftruncate(f->fd, 0) == 0;
        format_free_space(f->path, fs, sizeof fs);
        if (!released) msgf(fs + strlen(fs), sizeof fs - strlen(fs), ", less what the failed reservation took");
        struct stat st;
        int others = 0;
        const int64_t held = fstat(f->fd, &st) == 0 ? reserved_elsewhere(f, st.st_dev, &others) : 0;
        char also[256] = "", ranks[256] = "", hb[32], tb[32], rb[32];
        if (held > 0) /* freed when this process exits: the free space seen then is more than said here */
            msgf(also, sizeof also, "; this process's other swap file%s there already hold%s %s: %s needed in all",
                 others == 1 ? "" : "s", others == 1 ? "s" : "", zoff_format_bytes((size_t)held, hb, sizeof hb),
                 zoff_format_bytes((size_t)(held + bytes), tb, sizeof tb));
        const int nr = g_host_ranks;
        if (nr > 1) /* the other ranks' files, freed when they exit, may hold what is missing */
            msgf(ranks, sizeof ranks, "; each of the %d ranks on this host reserves its own: about %d x %s = %s there",
                 nr, nr, zoff_format_bytes((size_t)(held + bytes), tb, sizeof tb),
                 zoff_format_bytes((size_t)(held + bytes) * (size_t)nr, rb, sizeof rb));
        return zoff_error(ZOFF_ERR_IO,
                          "disk full: swap file %s needs %s (%s%s%s): %s", f->path,
                          zoff_format_bytes((size_t)bytes, need, sizeof need), fs, also, ranks,
                          zoff_disk_full_advice(SWAP_DISK_FULL_ADVICE));
    }
    if (err != EOPNOTSUPP && err != ENOSYS && err != EINVAL)
        return zoff_error(ZOFF_ERR_IO, "cannot reserve %s for %s: %s%s",
                          zoff_format_bytes((size_t)bytes, need, sizeof need), f->path, strerror(err),
                          zoff_write_hint(err));
    if (ftruncate(f->fd, bytes) != 0)
        return zoff_error(ZOFF_ERR_IO, "cannot extend %s to %s: %s", f->path,
                          zoff_format_bytes((size_t)bytes, need, sizeof need), strerror(errno));
    reserved_add(f, bytes);
    return ZOFF_OK;
}
