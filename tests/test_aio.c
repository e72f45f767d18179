/* src/aio: both engines (io_uring where available, the thread pool always)
 * write and read back data byte for byte, keep many requests in flight, honour
 * `after` ordering, compute the same checksums as the core's CRC32C, and turn
 * each injected or real fault into an error naming the file and the offset:
 * disk full, I/O error, short read, a file truncated or changed behind the
 * engine's back. References: the bytes written (memcmp), zoff_crc32c, pread
 * through an ordinary descriptor. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/aio.h"

static char g_dir[64];

static void fill_pattern(void *buf, size_t n, uint64_t seed) {
    uint64_t *p = buf;
    for (size_t i = 0; i < n / 8; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = seed ^ (seed >> 29);
    }
}

static void *abuf(size_t n) {
    void *p = zoff_aligned_alloc(ZOFF_AIO_ALIGN, n, "test buffer");
    assert_non_null(p);
    memset(p, 0, n);
    return p;
}

static int engines(zoff_aio_engine_kind out[2]) {
    int n = 0;
    out[n++] = ZOFF_AIO_THREADS;
    zoff_aio_options o;
    zoff_aio_options_default(&o);
    o.engine = ZOFF_AIO_URING;
    zoff_aio *a = NULL;
    if (zoff_aio_create(&o, &a) == ZOFF_OK) {
        out[n++] = ZOFF_AIO_URING;
        zoff_aio_destroy(a);
    } else {
        printf("io_uring not tested: %s\n", zoff_last_error());
    }
    return n;
}

static zoff_aio *make(zoff_aio_engine_kind k, int64_t bs, int64_t qd) {
    zoff_aio_options o;
    zoff_aio_options_default(&o);
    o.engine = k;
    o.block_size = bs;
    o.queue_depth = qd;
    zoff_aio *a = NULL;
    if (zoff_aio_create(&o, &a) != ZOFF_OK) fail_msg("zoff_aio_create: %s", zoff_last_error());
    return a;
}

static void path_in(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static zoff_aio_file *create_file(zoff_aio *a, const char *name, int64_t bytes) {
    char p[256];
    path_in(p, sizeof p, name);
    unlink(p);
    zoff_aio_file *f = NULL;
    if (zoff_aio_file_open(a, p, ZOFF_AIO_CREATE, &f) != ZOFF_OK) fail_msg("open: %s", zoff_last_error());
    if (bytes && zoff_aio_file_reserve(f, bytes) != ZOFF_OK) fail_msg("reserve: %s", zoff_last_error());
    return f;
}

static void close_file(zoff_aio_file *f) {
    char p[4096];
    snprintf(p, sizeof p, "%s", zoff_aio_file_path(f));
    zoff_aio_file_close(f);
    unlink(p);
}

static void assert_msg_has(const char *needle) {
    if (!strstr(zoff_last_error(), needle)) fail_msg("message lacks '%s': %s", needle, zoff_last_error());
}

/* Multi-segment write then read-back, several block sizes and depths, both engines. */
static void test_roundtrip(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    int64_t cfgs[3][2] = {{4096, 1}, {65536, 4}, {1 << 20, 8}};
    size_t sz[3] = {256 << 10, 4096, (3 << 20) + 4096};
    int64_t off[3] = {0, 1 << 20, 8 << 20};
    for (int k = 0; k < nk; k++)
        for (int c = 0; c < 3; c++) {
            zoff_aio *a = make(ks[k], cfgs[c][0], cfgs[c][1]);
            assert_int_equal(zoff_aio_engine(a), ks[k]);
            assert_non_null(strstr(zoff_aio_describe(a), ks[k] == ZOFF_AIO_URING ? "io_uring" : "thread pool"));
            zoff_aio_file *f = create_file(a, "rt.dat", 16 << 20);
            void *w[3], *r[3];
            zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 3};
            zoff_aio_request rd = {.op = ZOFF_AIO_READ, .file = f, .nseg = 3};
            for (int i = 0; i < 3; i++) {
                w[i] = abuf(sz[i]);
                r[i] = abuf(sz[i]);
                fill_pattern(w[i], sz[i], (uint64_t)(100 * c + i + 1));
                wr.seg[i] = (zoff_aio_segment){.buf = w[i], .offset = off[i], .bytes = sz[i]};
                rd.seg[i] = (zoff_aio_segment){.buf = r[i], .offset = off[i], .bytes = sz[i]};
            }
            assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
            assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
            assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
            assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_OK);
            for (int i = 0; i < 3; i++) assert_memory_equal(w[i], r[i], sz[i]);
            /* independent reference: an ordinary descriptor sees the same bytes */
            int fd = open(zoff_aio_file_path(f), O_RDONLY);
            char *chk = malloc(sz[2]);
            assert_int_equal(pread(fd, chk, sz[2], off[2]), (ssize_t)sz[2]);
            assert_memory_equal(chk, w[2], sz[2]);
            free(chk);
            close(fd);
            /* an empty request completes */
            zoff_aio_request e0 = {.op = ZOFF_AIO_READ, .file = f, .nseg = 0};
            assert_int_equal(zoff_aio_submit(a, &e0), ZOFF_OK);
            assert_int_equal(zoff_aio_wait(a, &e0), ZOFF_OK);
            for (int i = 0; i < 3; i++) {
                zoff_aligned_free(w[i]);
                zoff_aligned_free(r[i]);
            }
            close_file(f);
            zoff_aio_destroy(a);
        }
}

/* 64 requests in flight at once, waited for in reverse order. */
static void test_many_in_flight(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    enum { N = 64, SZ = 192 << 10 };
    for (int k = 0; k < nk; k++) {
        zoff_aio *a = make(ks[k], 65536, 8);
        zoff_aio_file *f = create_file(a, "many.dat", (int64_t)N * SZ);
        char *w = abuf((size_t)N * SZ), *r = abuf((size_t)N * SZ);
        fill_pattern(w, (size_t)N * SZ, 7 + (uint64_t)k);
        static zoff_aio_request q[N];
        for (int i = 0; i < N; i++) {
            memset(&q[i], 0, sizeof q[i]);
            q[i] = (zoff_aio_request){.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1,
                                      .seg = {{.buf = w + (size_t)i * SZ, .offset = (int64_t)i * SZ, .bytes = SZ}}};
            assert_int_equal(zoff_aio_submit(a, &q[i]), ZOFF_OK);
        }
        for (int i = N - 1; i >= 0; i--) assert_int_equal(zoff_aio_wait(a, &q[i]), ZOFF_OK);
        for (int i = 0; i < N; i++) {
            q[i].op = ZOFF_AIO_READ;
            q[i].seg[0].buf = r + (size_t)i * SZ;
            assert_int_equal(zoff_aio_submit(a, &q[i]), ZOFF_OK);
        }
        for (int i = N - 1; i >= 0; i--) assert_int_equal(zoff_aio_wait(a, &q[i]), ZOFF_OK);
        assert_memory_equal(w, r, (size_t)N * SZ);
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        close_file(f);
        zoff_aio_destroy(a);
    }
}

/* A read that follows a write sees the written bytes, every time (many
 * workers could reorder them without `after`). */
static void test_after_orders(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    enum { SZ = 256 << 10 };
    for (int k = 0; k < nk; k++) {
        zoff_aio *a = make(ks[k], 16384, 8);
        zoff_aio_file *f = create_file(a, "after.dat", SZ);
        char *w = abuf(SZ), *r = abuf(SZ);
        for (int it = 0; it < 100; it++) {
            fill_pattern(w, SZ, (uint64_t)it + 1);
            zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1,
                                   .seg = {{.buf = w, .offset = 0, .bytes = SZ}}};
            zoff_aio_request rd = {.op = ZOFF_AIO_READ, .file = f, .nseg = 1,
                                   .seg = {{.buf = r, .offset = 0, .bytes = SZ}}, .after = {&wr, NULL}};
            assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
            assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
            assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_OK);
            assert_true(zoff_aio_done(a, &wr));
            if (memcmp(w, r, SZ) != 0) fail_msg("iteration %d: the read did not see the write it follows", it);
            assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
        }
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        close_file(f);
        zoff_aio_destroy(a);
    }
}

/* The engine's CRC32C equals the core's (table-driven, independent) on odd lengths and offsets. */
static void test_crc32c_matches_core(void **st) {
    (void)st;
    unsigned char *b = malloc(70000);
    fill_pattern(b, 70000 & ~7u, 99);
    for (size_t n = 0; n < 70000; n = n * 3 + 1)
        for (size_t o = 0; o < 9; o += 4) {
            if (o + n > 70000) continue;
            assert_int_equal(zoff_aio_crc32c(0, b + o, n), zoff_crc32c(0, b + o, n));
            assert_int_equal(zoff_aio_crc32c(0x12345678u, b + o, n), zoff_crc32c(0x12345678u, b + o, n));
        }
    assert_int_equal(zoff_aio_crc32c(0, "123456789", 9), 0xE3069283u); /* the CRC-32C check value */
    free(b);
}

/* Checksums: stored per chunk on write; a byte changed through another
 * descriptor makes the read fail, naming the file and the chunk's offset. */
static void test_checksum_detects_change(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    enum { SZ = 1 << 20, BS = 65536 };
    for (int k = 0; k < nk; k++) {
        zoff_aio *a = make(ks[k], BS, 4);
        zoff_aio_file *f = create_file(a, "crc.dat", 2 * SZ);
        char *w = abuf(SZ), *r = abuf(SZ);
        uint32_t crcs[SZ / BS];
        fill_pattern(w, SZ, 5);
        zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .flags = ZOFF_AIO_CRC_STORE,
                               .seg = {{.buf = w, .offset = SZ, .bytes = SZ, .crcs = crcs}}};
        assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
        for (int c = 0; c < SZ / BS; c++) assert_int_equal(crcs[c], zoff_crc32c(0, w + (size_t)c * BS, BS));
        zoff_aio_request rd = {.op = ZOFF_AIO_READ, .file = f, .nseg = 1, .flags = ZOFF_AIO_CRC_VERIFY,
                               .seg = {{.buf = r, .offset = SZ, .bytes = SZ, .crcs = crcs}}};
        assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_OK);
        assert_memory_equal(w, r, SZ);
        /* change one byte of chunk 5 behind the engine's back */
        int fd = open(zoff_aio_file_path(f), O_WRONLY);
        unsigned char x = (unsigned char)(w[5 * BS + 123] ^ 0x40);
        assert_int_equal(pwrite(fd, &x, 1, SZ + 5 * BS + 123), 1);
        fsync(fd);
        close(fd);
        posix_fadvise(zoff_aio_file_fd(f), 0, 0, POSIX_FADV_DONTNEED);
        assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_ERR_FORMAT);
        assert_msg_has(zoff_aio_file_path(f));
        char where[64];
        snprintf(where, sizeof where, "at offset %d", SZ + 5 * BS);
        assert_msg_has(where);
        assert_msg_has("changed behind zoff's back");
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        close_file(f);
        zoff_aio_destroy(a);
    }
}

/* ---- injected faults ---- */
typedef struct fault_plan {
    zoff_aio_op op;
    int64_t at;    /* chunks at or past this offset fail */
    int64_t ret;   /* what the hook returns for them */
    int hits;
} fault_plan;

static int64_t fault_hook(void *arg, const zoff_aio_fault_site *s) {
    fault_plan *p = arg;
    if (s->op != p->op || s->offset < p->at) return 0;
    __atomic_fetch_add(&p->hits, 1, __ATOMIC_RELAXED);
    return p->ret;
}

static void run_fault(zoff_aio_engine_kind kind, fault_plan *plan, zoff_status want, const char *needle,
                      const char *where) {
    zoff_aio_options o;
    zoff_aio_options_default(&o);
    o.engine = kind;
    o.block_size = 65536;
    o.fault = fault_hook;
    o.fault_arg = plan;
    zoff_aio *a = NULL;
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_OK);
    enum { SZ = 1 << 20 };
    zoff_aio_file *f = create_file(a, "fault.dat", SZ);
    char *w = abuf(SZ);
    fill_pattern(w, SZ, 11);
    zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .seg = {{.buf = w, .offset = 0, .bytes = SZ}}};
    zoff_aio_request rd = wr;
    rd.op = ZOFF_AIO_READ;
    zoff_status s = zoff_aio_submit(a, &wr);
    if (s == ZOFF_OK) s = zoff_aio_wait(a, &wr);
    if (s == ZOFF_OK && plan->op == ZOFF_AIO_READ) {
        assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
        s = zoff_aio_wait(a, &rd);
    }
    assert_int_equal(s, want);
    assert_true(plan->hits > 0);
    assert_msg_has(needle);
    assert_msg_has(zoff_aio_file_path(f));
    assert_msg_has(where);
    /* a request that follows the failed one fails without touching the file */
    zoff_aio_request *failed = plan->op == ZOFF_AIO_READ ? &rd : &wr;
    char *r2 = abuf(SZ);
    zoff_aio_request after = {.op = ZOFF_AIO_READ, .file = f, .nseg = 1, .seg = {{.buf = r2, .offset = 0, .bytes = SZ}},
                              .after = {failed, NULL}};
    assert_int_equal(zoff_aio_submit(a, &after), ZOFF_OK);
    assert_int_equal(zoff_aio_wait(a, &after), want);
    assert_msg_has("was not started");
    assert_msg_has(needle);
    zoff_aligned_free(r2);
    zoff_aligned_free(w);
    close_file(f);
    zoff_aio_destroy(a);
}

static void test_faults(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    for (int k = 0; k < nk; k++) {
        fault_plan full = {.op = ZOFF_AIO_WRITE, .at = 3 * 65536, .ret = -ENOSPC};
        run_fault(ks[k], &full, ZOFF_ERR_IO, "disk full", "at offset 196608");
        fault_plan eio = {.op = ZOFF_AIO_READ, .at = 5 * 65536, .ret = -EIO};
        run_fault(ks[k], &eio, ZOFF_ERR_IO, "I/O error reading", "at offset 327680");
        fault_plan shrt = {.op = ZOFF_AIO_READ, .at = 2 * 65536, .ret = 4096};
        run_fault(ks[k], &shrt, ZOFF_ERR_IO, "short read", "got 4096 of 65536 bytes");
    }
}

/* The process-wide hook reaches engines created without one (the engine inside zoff_engine). */
static void test_global_hook(void **st) {
    (void)st;
    fault_plan p = {.op = ZOFF_AIO_WRITE, .at = 0, .ret = -EIO};
    zoff_aio_set_fault_hook(fault_hook, &p);
    zoff_aio *a = make(ZOFF_AIO_THREADS, 65536, 2);
    zoff_aio_set_fault_hook(NULL, NULL);
    zoff_aio_file *f = create_file(a, "hook.dat", 65536);
    char *w = abuf(65536);
    zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .seg = {{.buf = w, .offset = 0, .bytes = 65536}}};
    assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
    assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_ERR_IO);
    assert_int_equal(p.hits, 1);
    zoff_aligned_free(w);
    close_file(f);
    zoff_aio_destroy(a);
}

/* A file truncated behind the engine's back: a short read naming the file, the offset and the new size. */
static void test_truncated_file(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    enum { SZ = 1 << 20 };
    for (int k = 0; k < nk; k++) {
        zoff_aio *a = make(ks[k], 65536, 4);
        zoff_aio_file *f = create_file(a, "trunc.dat", SZ);
        char *w = abuf(SZ);
        fill_pattern(w, SZ, 3);
        zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1,
                               .seg = {{.buf = w, .offset = 0, .bytes = SZ}}};
        assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
        assert_int_equal(truncate(zoff_aio_file_path(f), 600 * 1024), 0);
        wr.op = ZOFF_AIO_READ;
        assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_ERR_IO);
        assert_msg_has("short read");
        assert_msg_has(zoff_aio_file_path(f));
        assert_msg_has("at offset 589824");  /* the 64 KiB chunk that holds the new end */
        assert_msg_has("614400 bytes long"); /* the file's size now */
        zoff_aligned_free(w);
        close_file(f);
        zoff_aio_destroy(a);
    }
}

static void test_bad_requests_and_options(void **st) {
    (void)st;
    zoff_aio *a = make(ZOFF_AIO_THREADS, 65536, 2);
    zoff_aio_file *f = create_file(a, "bad.dat", 65536);
    char *w = abuf(3 * 4096);
    zoff_aio_request r = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .seg = {{.buf = w + 512, .offset = 0, .bytes = 4096}}};
    assert_int_equal(zoff_aio_submit(a, &r), ZOFF_ERR_INVALID);
    assert_msg_has("aligned");
    r.seg[0].buf = w;
    r.seg[0].offset = 100;
    assert_int_equal(zoff_aio_submit(a, &r), ZOFF_ERR_INVALID);
    r.seg[0].offset = 0;
    r.seg[0].bytes = 1000;
    assert_int_equal(zoff_aio_submit(a, &r), ZOFF_ERR_INVALID);
    r.seg[0].bytes = 4096;
    r.flags = ZOFF_AIO_CRC_STORE; /* no crcs array */
    assert_int_equal(zoff_aio_submit(a, &r), ZOFF_ERR_INVALID);
    zoff_aligned_free(w);
    close_file(f);
    zoff_aio_destroy(a);

    zoff_aio_options o;
    zoff_aio_options_default(&o);
    o.block_size = 1000000;
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_ERR_CONFIG);
    assert_msg_has("aio.block_size 1000000");
    zoff_aio_options_default(&o);
    o.queue_depth = 0;
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_ERR_CONFIG);
    assert_msg_has("aio.queue_depth");
    zoff_aio_options_default(&o);
    o.nfixed = ZOFF_AIO_MAX_FIXED + 1;
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_ERR_INVALID);
    assert_msg_has("nfixed");
    o.nfixed = 1; /* no buffer */
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_ERR_INVALID);
    assert_msg_has("fixed_buf[0]");
    zoff_aio_options_default(&o); /* offered one by one: up to the limit, then refused and not added */
    static char bufs[ZOFF_AIO_MAX_FIXED + 1][64];
    for (int i = 0; i < ZOFF_AIO_MAX_FIXED; i++) assert_true(zoff_aio_options_add_fixed(&o, bufs[i], sizeof bufs[i]));
    assert_false(zoff_aio_options_add_fixed(&o, bufs[ZOFF_AIO_MAX_FIXED], 64));
    assert_int_equal(o.nfixed, ZOFF_AIO_MAX_FIXED);
    assert_ptr_equal(o.fixed_buf[ZOFF_AIO_MAX_FIXED - 1], bufs[ZOFF_AIO_MAX_FIXED - 1]);
    assert_int_equal(o.fixed_bytes[0], 64);
    setenv("ZOFF_AIO_ENGINE", "threads", 1);
    zoff_aio_options_default(&o);
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_OK);
    assert_int_equal(zoff_aio_engine(a), ZOFF_AIO_THREADS);
    zoff_aio_destroy(a);
    setenv("ZOFF_AIO_ENGINE", "bogus", 1);
    assert_int_equal(zoff_aio_create(&o, &a), ZOFF_ERR_CONFIG);
    assert_msg_has("ZOFF_AIO_ENGINE");
    unsetenv("ZOFF_AIO_ENGINE");
    /* an existing file is not clobbered by CREATE */
    a = make(ZOFF_AIO_THREADS, 65536, 1);
    f = create_file(a, "exists.dat", 0);
    zoff_aio_file *f2 = NULL;
    assert_int_equal(zoff_aio_file_open(a, zoff_aio_file_path(f), ZOFF_AIO_CREATE, &f2), ZOFF_ERR_IO);
    assert_msg_has("File exists");
    close_file(f);
    zoff_aio_destroy(a);
}

/* Registered (fixed) buffers on io_uring: chunks wholly inside one go as fixed-buffer requests
 * (counted), others (outside it, or past its end) as ordinary ones; the bytes
 * on disk are what an ordinary descriptor reads back either way, for writes and reads. The
 * thread pool accepts the option and ignores it. */
static void test_fixed_buffers(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    const size_t fb = 1 << 20, bs = 65536;
    char *fixed = abuf(fb), *other = abuf(fb), *back = abuf(fb);
    fill_pattern(fixed, fb, 7);
    fill_pattern(other, fb, 8);
    for (int k = 0; k < nk; k++) {
        zoff_aio_options o;
        zoff_aio_options_default(&o);
        o.engine = ks[k];
        o.block_size = (int64_t)bs;
        o.queue_depth = 4;
        o.nfixed = 1;
        o.fixed_buf[0] = fixed + 4 * bs; /* the middle of `fixed`: the rest of it is outside */
        o.fixed_bytes[0] = 8 * bs;
        zoff_aio *a = NULL;
        assert_int_equal(zoff_aio_create(&o, &a), ZOFF_OK);
        const bool uring = ks[k] == ZOFF_AIO_URING;
        print_message("%s\n", zoff_aio_describe(a));
        if (uring && !strstr(zoff_aio_describe(a), "1 registered buffers")) {
            print_message("skipped: fixed buffers not registered here (%s)\n", zoff_aio_describe(a));
            zoff_aio_destroy(a);
            continue;
        }
        zoff_aio_file *f = create_file(a, "fixed.dat", (int64_t)(3 * fb));
        /* 6 chunks inside the registered buffer; a segment across its end: 1 chunk inside, 1 past it; 16 chunks
         * in another buffer */
        zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 3,
                               .seg = {{.buf = fixed + 4 * bs, .offset = 0, .bytes = 6 * bs},
                                       {.buf = fixed + 11 * bs, .offset = (int64_t)fb, .bytes = 2 * bs},
                                       {.buf = other, .offset = (int64_t)(2 * fb), .bytes = fb}}};
        assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_fixed_requests(a), uring ? 7 : 0);
        int fd = open(zoff_aio_file_path(f), O_RDONLY); /* the independent reader */
        assert_true(fd >= 0);
        assert_int_equal(pread(fd, back, 6 * bs, 0), (ssize_t)(6 * bs));
        assert_memory_equal(back, fixed + 4 * bs, 6 * bs);
        assert_int_equal(pread(fd, back, 2 * bs, (off_t)fb), (ssize_t)(2 * bs));
        assert_memory_equal(back, fixed + 11 * bs, 2 * bs);
        assert_int_equal(pread(fd, back, fb, (off_t)(2 * fb)), (ssize_t)fb);
        assert_memory_equal(back, other, fb);
        close(fd);
        /* a read into the registered buffer: the file's third MiB lands there, through 8 fixed chunks */
        zoff_aio_request rd = {.op = ZOFF_AIO_READ, .file = f, .nseg = 1,
                               .seg = {{.buf = fixed + 4 * bs, .offset = (int64_t)(2 * fb), .bytes = 8 * bs}}};
        assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_OK);
        assert_int_equal(zoff_aio_fixed_requests(a), uring ? 15 : 0);
        assert_memory_equal(fixed + 4 * bs, other, 8 * bs);
        fill_pattern(fixed, fb, 7); /* as before, for the next engine */
        close_file(f);
        zoff_aio_destroy(a);
    }
    zoff_aligned_free(fixed);
    zoff_aligned_free(other);
    zoff_aligned_free(back);
}

/* ZOFF_AIO_TEMPORARY: the file has no name once open (so it goes with the process even after
 * SIGKILL), yet reads and writes work on every engine; the name is free for a new file. */
static void test_temporary_file(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2] = {ZOFF_AIO_THREADS, ZOFF_AIO_AUTO};
    for (int k = 0; k < 2; k++) {
        zoff_aio *a = make(ks[k], 65536, 4);
        char p[256];
        path_in(p, sizeof p, "temporary.swp");
        zoff_aio_file *f = NULL;
        assert_int_equal(zoff_aio_file_open(a, p, ZOFF_AIO_CREATE | ZOFF_AIO_TEMPORARY, &f), ZOFF_OK);
        struct stat sb;
        assert_int_equal(stat(p, &sb), -1); /* no name on disk */
        assert_int_equal(errno, ENOENT);
        assert_int_equal(zoff_aio_file_reserve(f, 4 << 20), ZOFF_OK);
        uint8_t *w = zoff_aligned_alloc(ZOFF_AIO_ALIGN, 1 << 20, "w");
        uint8_t *r = zoff_aligned_alloc(ZOFF_AIO_ALIGN, 1 << 20, "r");
        for (int i = 0; i < (1 << 20); i++) w[i] = (uint8_t)(i * 7 + k);
        zoff_aio_request wr = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1,
                               .seg = {{.buf = w, .offset = 1 << 20, .bytes = 1 << 20}}};
        assert_int_equal(zoff_aio_submit(a, &wr), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &wr), ZOFF_OK);
        zoff_aio_request rd = {.op = ZOFF_AIO_READ, .file = f, .nseg = 1,
                               .seg = {{.buf = r, .offset = 1 << 20, .bytes = 1 << 20}}};
        assert_int_equal(zoff_aio_submit(a, &rd), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &rd), ZOFF_OK);
        assert_memory_equal(w, r, 1 << 20);
        zoff_aio_file *f2 = NULL; /* the name is free: another run may create it */
        assert_int_equal(zoff_aio_file_open(a, p, ZOFF_AIO_CREATE | ZOFF_AIO_TEMPORARY, &f2), ZOFF_OK);
        zoff_aio_file_close(f2);
        zoff_aio_file_close(f);
        assert_int_equal(stat(p, &sb), -1);
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        zoff_aio_destroy(a);
    }
}

/* Which directories allow O_DIRECT (printed for the record; the engine works either way). */
static void test_direct_io_report(void **st) {
    (void)st;
    const char *dirs[] = {"/tmp", "/work", "/dev/shm", "/var/tmp"};
    zoff_aio *a = make(ZOFF_AIO_AUTO, 1 << 20, 8);
    printf("aio engine: %s\n", zoff_aio_describe(a));
    for (int i = 0; i < 4; i++) {
        struct stat sb;
        if (stat(dirs[i], &sb) != 0 || !S_ISDIR(sb.st_mode) || access(dirs[i], W_OK) != 0) continue;
        char p[256];
        snprintf(p, sizeof p, "%s/zoff-aio-direct-%ld.tmp", dirs[i], (long)getpid());
        zoff_aio_file *f = NULL;
        if (zoff_aio_file_open(a, p, ZOFF_AIO_CREATE, &f) != ZOFF_OK) continue;
        printf("%-9s O_DIRECT: %s%s%s\n", dirs[i], zoff_aio_file_direct(f) ? "yes" : "no",
               zoff_aio_file_direct(f) ? "" : " -- ", zoff_aio_file_direct_note(f));
        if (!zoff_aio_file_direct(f)) assert_true(zoff_aio_file_direct_note(f)[0] != '\0');
        /* either way the file works */
        char *w = abuf(65536), *r = abuf(65536);
        fill_pattern(w, 65536, 1);
        zoff_aio_request q = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .seg = {{.buf = w, .offset = 0, .bytes = 65536}}};
        assert_int_equal(zoff_aio_submit(a, &q), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &q), ZOFF_OK);
        q.op = ZOFF_AIO_READ;
        q.seg[0].buf = r;
        assert_int_equal(zoff_aio_submit(a, &q), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &q), ZOFF_OK);
        assert_memory_equal(w, r, 65536);
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        zoff_aio_file_close(f);
        unlink(p);
    }
    zoff_aio_destroy(a);
}

/* direct = 0: buffered files, said so, and the same bytes. */
static void test_buffered(void **st) {
    (void)st;
    zoff_aio_engine_kind ks[2];
    int nk = engines(ks);
    for (int k = 0; k < nk; k++) {
        zoff_aio_options o;
        zoff_aio_options_default(&o);
        o.engine = ks[k];
        o.direct = 0;
        zoff_aio *a = NULL;
        assert_int_equal(zoff_aio_create(&o, &a), ZOFF_OK);
        zoff_aio_file *f = create_file(a, "buffered.dat", 1 << 20);
        assert_false(zoff_aio_file_direct(f));
        assert_non_null(strstr(zoff_aio_file_direct_note(f), "buffered"));
        char *w = abuf(1 << 20), *r = abuf(1 << 20);
        uint32_t crcs[1];
        fill_pattern(w, 1 << 20, 77);
        zoff_aio_request q = {.op = ZOFF_AIO_WRITE, .file = f, .nseg = 1, .flags = ZOFF_AIO_CRC_STORE,
                              .seg = {{.buf = w, .offset = 0, .bytes = 1 << 20, .crcs = crcs}}};
        assert_int_equal(zoff_aio_submit(a, &q), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &q), ZOFF_OK);
        q.op = ZOFF_AIO_READ;
        q.flags = ZOFF_AIO_CRC_VERIFY;
        q.seg[0].buf = r;
        assert_int_equal(zoff_aio_submit(a, &q), ZOFF_OK);
        assert_int_equal(zoff_aio_wait(a, &q), ZOFF_OK);
        assert_memory_equal(w, r, 1 << 20);
        zoff_aligned_free(w);
        zoff_aligned_free(r);
        close_file(f);
        zoff_aio_destroy(a);
    }
}

static int setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/zoff-test-aio-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    rmdir(g_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_after_orders),
        cmocka_unit_test(test_crc32c_matches_core),
        cmocka_unit_test(test_checksum_detects_change),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_global_hook),
        cmocka_unit_test(test_truncated_file),
        cmocka_unit_test(test_bad_requests_and_options),
        cmocka_unit_test(test_temporary_file),
        cmocka_unit_test(test_fixed_buffers),
        cmocka_unit_test(test_direct_io_report),
        cmocka_unit_test(test_buffered),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
