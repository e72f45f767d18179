/* NVMe offload (ZeRO-Infinity): the swapper on its own against an in-memory
 * reference, and the engine with offload_optimizer.device "nvme" training a
 * real GPT-2 on the CPU backend against the same training with "cpu" offload:
 * losses, gradient norms, weights and optimizer state must be bit-identical
 * (the same host Adam runs on the same numbers; only where the state rests
 * differs). Checkpoints through state get/set resume exactly. Every fault
 * (disk full, I/O error, short read, a swap file truncated or changed behind
 * zoff's back) is injected and must give an error naming the file and the
 * offset, leave the engine refusing to go on, and leave the last checkpoint
 * valid: resuming from it reproduces the uninterrupted run. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
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
#include "zoff/config.h"
#include "zoff/engine.h"
#include "zoff/model.h"
#include "zoff/swapper.h"

enum { L = 2, C = 32, NH = 2, T = 16, V = 97, B = 4, MAXSTEPS = 12 };

static char g_dir[256];

static void assert_msg_has(const char *needle) {
    if (!strstr(zoff_last_error(), needle)) fail_msg("message lacks '%s': %s", needle, zoff_last_error());
}

/* The swap files of the test directory this process holds open. They have no name on disk
 * (ZOFF_AIO_TEMPORARY: unlinked right after they are created, so that they go with the
 * process even after SIGKILL): found through /proc/self/fd, whose links read
 * "<dir>/zoff-...swp (deleted)". `first` gets the /proc/self/fd path of the first one (opening
 * or truncating it reaches the file), g_first_name its former name. Named swap files in the
 * directory fail the test. */
static char g_first_name[600];
static int swap_files(char *first, size_t n) {
    char tmp[600], target[600];
    DIR *d = opendir(g_dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, "zoff-", 5) && strstr(de->d_name, ".swp"))
            fail_msg("swap file %s/%s has a name on disk: it would outlive a killed process", g_dir, de->d_name);
    if (d) closedir(d);
    int count = 0;
    d = opendir("/proc/self/fd");
    while (d && (de = readdir(d))) {
        snprintf(tmp, sizeof tmp, "/proc/self/fd/%s", de->d_name);
        ssize_t l = readlink(tmp, target, sizeof target - 1);
        if (l <= 0) continue;
        target[l] = '\0';
        size_t dl = strlen(g_dir);
        if (strncmp(target, g_dir, dl) || strncmp(target + dl, "/zoff-", 6) || !strstr(target, ".swp (deleted)"))
            continue;
        if (count++ == 0 && first) {
            snprintf(first, n, "%.*s", (int)(n - 1), tmp);
            snprintf(g_first_name, sizeof g_first_name, "%s", target);
        }
    }
    if (d) closedir(d);
    return count;
}

/* ------------------------------------------------------------------ the swapper alone */

static void fill(float *x, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((int64_t)(seed >> 40) % 2001 - 1000) / 100.0f;
    }
}

typedef struct swap_case {
    bool pr, pw, fast;
    int64_t buffers, block;
    const char *engine;
    bool bf16; /* arrays 1 and 2 in bf16 (bf16_optimizer_states' m and v) */
} swap_case;

/* Random bytes over at least `bytes` of x (whole floats). */
static void fill_bytes(void *x, size_t bytes, uint64_t seed) { fill(x, (int64_t)((bytes + 3) / 4), seed); }

/* zoff_swapper_range's parts into or out of mem (raw bytes of the array's dtype), checked to come
 * in order and back to back. */
typedef struct range_io {
    unsigned char *mem;
    size_t es;
    bool write;
    int64_t next;
} range_io;
static void range_copy(void *arg, int64_t k, int64_t n, void *data) {
    range_io *r = arg;
    if (k != r->next || n <= 0) fail_msg("range part at %lld (+%lld), expected at %lld", (long long)k, (long long)n,
                                         (long long)r->next);
    if (r->write) memcpy(data, r->mem + (size_t)k * r->es, (size_t)n * r->es);
    else memcpy(r->mem + (size_t)k * r->es, data, (size_t)n * r->es);
    r->next += n;
}

/* Ranges between passes against the in-memory arrays: reads of random ranges (single elements,
 * whole arrays, across blocks) equal them; writes of random bytes over random ranges update them
 * (the passes that follow read them back, checksums checked). */
static void swapper_ranges(zoff_swapper *s, unsigned char *ref[][3], const int64_t *counts, int ng, const size_t *es,
                           uint64_t seed) {
    unsigned char *tmp = malloc(5000 * 4);
    for (int it = 0; it < 60; it++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int g = (int)((seed >> 33) % (uint64_t)ng), a = (int)((seed >> 20) % 3);
        int64_t first = (int64_t)((seed >> 40) % (uint64_t)counts[g]);
        int64_t count = it % 5 == 0 ? counts[g] - first : 1 + (int64_t)((seed >> 8) % (uint64_t)(counts[g] - first));
        if (it % 7 == 0) first = 0, count = counts[g];
        bool write = it % 3 == 1;
        if (write) fill_bytes(tmp, (size_t)count * es[a], seed);
        range_io r = {.mem = tmp, .es = es[a], .write = write};
        if (zoff_swapper_range(s, g, a, first, count, write, range_copy, &r) != ZOFF_OK)
            fail_msg("range %d (group %d array %d [%lld, +%lld) %s): %s", it, g, a, (long long)first,
                     (long long)count, write ? "write" : "read", zoff_last_error());
        assert_int_equal(r.next, count);
        if (write) memcpy(ref[g][a] + (size_t)first * es[a], tmp, (size_t)count * es[a]);
        else if (memcmp(tmp, ref[g][a] + (size_t)first * es[a], (size_t)count * es[a]))
            fail_msg("range %d: group %d array %d [%lld, +%lld) read back differs", it, g, a, (long long)first,
                     (long long)count);
    }
    /* a sequential read in small parts reads each block of the array once */
    zoff_swapper_stats s0, s1;
    zoff_swapper_get_stats(s, &s0);
    for (int64_t p = 0; p < counts[1]; p += 100) {
        range_io r = {.mem = tmp, .es = es[2]};
        int64_t c = counts[1] - p < 100 ? counts[1] - p : 100;
        assert_int_equal(zoff_swapper_range(s, 1, 2, p, c, false, range_copy, &r), ZOFF_OK);
        assert_memory_equal(tmp, ref[1][2] + (size_t)p * es[2], (size_t)c * es[2]);
    }
    zoff_swapper_get_stats(s, &s1);
    assert_true(s1.bytes_read - s0.bytes_read <= (int64_t)zoff_swapper_array_bytes(counts[1], es[2] == 2 ? ZOFF_BF16 : ZOFF_F32));
    /* misuse: outside the group */
    range_io r = {.mem = tmp, .es = es[0]};
    assert_int_equal(zoff_swapper_range(s, 0, 0, counts[0] - 1, 2, false, range_copy, &r), ZOFF_ERR_INVALID);
    assert_msg_has("outside");
    free(tmp);
}

/* Passes of every kind, in changing orders, against arrays kept in memory (raw bytes: each
 * array of its dtype), with ranges between them. */
static void run_swapper_case(const swap_case *sc) {
    enum { NG = 7, NA = 3 };
    int64_t counts[NG] = {1000, 5000, 1, 4096, 3000, 777, 2048};
    const size_t es[NA] = {4, sc->bf16 ? 2 : 4, sc->bf16 ? 2 : 4};
    unsigned char *ref[NG][NA];
    for (int g = 0; g < NG; g++)
        for (int a = 0; a < NA; a++) {
            size_t nb = (size_t)counts[g] * es[a];
            ref[g][a] = malloc((size_t)counts[g] * sizeof(float));
            if (a == 0 || !sc->fast) fill_bytes(ref[g][a], nb, (uint64_t)(g * 10 + a + 1));
            else /* fast_init: the init value, rounded to the array's dtype (0.25 is exact in bf16: 0x3e80) */
                for (int64_t i = 0; i < counts[g]; i++) {
                    if (es[a] == 2) memcpy(ref[g][a] + 2 * i, &(uint16_t){a == 1 ? 0 : 0x3e80}, 2);
                    else memcpy(ref[g][a] + 4 * i, &(float){a == 1 ? 0.0f : 0.25f}, 4);
                }
        }
    if (sc->engine) setenv("ZOFF_AIO_ENGINE", sc->engine, 1);
    zoff_swapper_options o = {.dir = g_dir, .stem = "unit", .num_groups = NG, .counts = counts, .num_arrays = NA,
                              .buffer_count = sc->buffers, .pipeline_read = sc->pr, .pipeline_write = sc->pw,
                              .fast_init = sc->fast, .init_value = {0, 0.0f, 0.25f}};
    if (sc->bf16) o.dtype[1] = o.dtype[2] = ZOFF_BF16;
    zoff_aio_options_default(&o.aio);
    o.aio.block_size = sc->block;
    o.aio.queue_depth = 3;
    zoff_swapper *s = NULL;
    zoff_status st = zoff_swapper_create(&o, &s);
    unsetenv("ZOFF_AIO_ENGINE");
    if (st != ZOFF_OK) fail_msg("create: %s", zoff_last_error());
    assert_int_equal(zoff_swapper_buffers(s), sc->buffers < NG ? sc->buffers : NG);
    /* the file: a 4 KiB header, then each array of each group padded to 4 KiB */
    int64_t want = 4096;
    size_t big = 0;
    for (int g = 0; g < NG; g++) {
        size_t gb = 0;
        for (int a = 0; a < NA; a++) gb += ((size_t)counts[g] * es[a] + 4095) / 4096 * 4096;
        want += (int64_t)gb;
        if (gb > big) big = gb;
    }
    assert_int_equal(zoff_swapper_file_bytes(s), want);
    assert_int_equal(zoff_swapper_buffer_bytes(s), big * (size_t)zoff_swapper_buffers(s));
    char fdp[600];
    assert_int_equal(swap_files(fdp, sizeof fdp), 1);
    struct stat sb;
    assert_int_equal(stat(fdp, &sb), 0);
    assert_int_equal(sb.st_size, want);
    int order[NG];
    for (int g = 0; g < NG; g++) order[g] = g;
    /* initial write: all arrays, or the master only with fast_init */
    assert_int_equal(zoff_swapper_begin(s, order, NG, ZOFF_SWAP_WRITE, sc->fast ? 1u : 7u), ZOFF_OK);
    for (int k = 0; k < NG; k++) {
        int g;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        assert_int_equal(zoff_swapper_next(s, &g, arr), ZOFF_OK);
        assert_int_equal(g, order[k]);
        for (int a = 0; a < (sc->fast ? 1 : NA); a++) memcpy(arr[a], ref[g][a], (size_t)counts[g] * es[a]);
        assert_int_equal(zoff_swapper_release(s), ZOFF_OK);
    }
    assert_int_equal(zoff_swapper_end(s), ZOFF_OK);
    swapper_ranges(s, ref, counts, NG, es, 1); /* with fast_init: into arrays never written */
    for (int pass = 0; pass < 9; pass++) {
        /* update passes in one order (read-ahead across them), then other orders and kinds */
        int ord[NG];
        for (int k = 0; k < NG; k++) ord[k] = pass < 4 ? NG - 1 - k : (k * 3 + pass) % NG;
        unsigned mode = pass == 5 ? ZOFF_SWAP_READ : pass == 6 ? ZOFF_SWAP_WRITE : ZOFF_SWAP_UPDATE;
        unsigned mask = pass == 6 ? 2u : pass == 7 ? 5u : 7u;
        int n = pass == 8 ? 4 : NG; /* a partial pass */
        if (zoff_swapper_begin(s, ord, n, mode, mask) != ZOFF_OK) fail_msg("pass %d: %s", pass, zoff_last_error());
        for (int k = 0; k < n; k++) {
            int g;
            void *arr[ZOFF_SWAP_MAX_ARRAYS];
            if (zoff_swapper_next(s, &g, arr) != ZOFF_OK) fail_msg("pass %d next: %s", pass, zoff_last_error());
            assert_int_equal(g, ord[k]);
            for (int a = 0; a < NA; a++) {
                if (!(mask & (1u << a))) continue;
                size_t nb = (size_t)counts[g] * es[a];
                if (mode & ZOFF_SWAP_READ)
                    if (memcmp(arr[a], ref[g][a], nb)) fail_msg("pass %d group %d array %d: read back differs", pass, g, a);
                if (mode & ZOFF_SWAP_WRITE) {
                    fill_bytes(ref[g][a], nb, (uint64_t)(pass * 100 + g * 10 + a));
                    memcpy(arr[a], ref[g][a], nb);
                }
            }
            if (zoff_swapper_release(s) != ZOFF_OK) fail_msg("pass %d release: %s", pass, zoff_last_error());
        }
        assert_int_equal(zoff_swapper_end(s), ZOFF_OK);
        if (pass == 1 || pass == 7) swapper_ranges(s, ref, counts, NG, es, (uint64_t)pass + 2);
    }
    /* final read of everything */
    assert_int_equal(zoff_swapper_flush(s), ZOFF_OK);
    assert_int_equal(zoff_swapper_begin(s, order, NG, ZOFF_SWAP_READ, 7u), ZOFF_OK);
    for (int k = 0; k < NG; k++) {
        int g;
        void *arr[ZOFF_SWAP_MAX_ARRAYS];
        assert_int_equal(zoff_swapper_next(s, &g, arr), ZOFF_OK);
        for (int a = 0; a < NA; a++) assert_memory_equal(arr[a], ref[g][a], (size_t)counts[g] * es[a]);
        assert_int_equal(zoff_swapper_release(s), ZOFF_OK);
    }
    assert_int_equal(zoff_swapper_end(s), ZOFF_OK);
    zoff_swapper_stats stats;
    zoff_swapper_get_stats(s, &stats);
    assert_true(stats.bytes_read > 0 && stats.bytes_written > 0);
    /* misuse is an error, not a crash */
    int g;
    void *arr[ZOFF_SWAP_MAX_ARRAYS];
    assert_int_equal(zoff_swapper_next(s, &g, arr), ZOFF_ERR_INTERNAL);
    /* a pass abandoned midway leaves the state half updated: refused from then on, saying why */
    assert_int_equal(zoff_swapper_begin(s, order, NG, ZOFF_SWAP_UPDATE, 7u), ZOFF_OK);
    assert_int_equal(zoff_swapper_next(s, &g, arr), ZOFF_OK);
    assert_int_equal(zoff_swapper_begin(s, order, NG, ZOFF_SWAP_READ, 7u), ZOFF_ERR_INVALID);
    assert_msg_has("stopped after 0 of 7 sub-groups");
    assert_int_equal(zoff_swapper_begin(s, order, NG, ZOFF_SWAP_READ, 7u), ZOFF_ERR_INVALID);
    assert_msg_has("resume from the last checkpoint");
    assert_int_equal(swap_files(NULL, 0), 1);
    zoff_swapper_destroy(s);
    assert_int_equal(swap_files(NULL, 0), 0); /* the file is deleted */
    for (int gg = 0; gg < NG; gg++)
        for (int a = 0; a < NA; a++) free(ref[gg][a]);
}

static void test_swapper_passes(void **st) {
    (void)st;
    swap_case cases[] = {
        {true, true, false, 3, 4096, NULL, false},       {true, true, false, 4, 65536, "threads", false},
        {true, true, true, 16, 1 << 20, NULL, false},    {false, false, false, 1, 8192, "threads", false},
        {true, false, false, 2, 4096, NULL, false},      {false, true, true, 2, 4096, NULL, false},
        {true, true, false, 5, 4096, "threads", false},
        /* bf16 m and v: the same passes with arrays of two sizes */
        {true, true, false, 3, 4096, NULL, true}, {true, true, true, 4, 8192, "threads", true},
        {false, false, true, 1, 4096, NULL, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_swapper_case(&cases[i]);
}

static void test_swapper_too_few_buffers(void **st) {
    (void)st;
    int64_t counts[5] = {10, 10, 10, 10, 10};
    zoff_swapper_options o = {.dir = g_dir, .num_groups = 5, .counts = counts, .num_arrays = 3, .buffer_count = 2,
                              .pipeline_read = true, .pipeline_write = true};
    zoff_aio_options_default(&o.aio);
    zoff_swapper *s = NULL;
    assert_int_equal(zoff_swapper_create(&o, &s), ZOFF_ERR_CONFIG);
    assert_msg_has("buffer_count 2 is too few");
    assert_msg_has("needs 3 buffers");
    o.num_groups = 2; /* two groups never need more than two buffers */
    assert_int_equal(zoff_swapper_create(&o, &s), ZOFF_OK);
    zoff_swapper_destroy(s);
    assert_int_equal(zoff_swapper_buffers_needed(false, false, 9), 1);
    assert_int_equal(zoff_swapper_buffers_needed(true, false, 9), 2);
    assert_int_equal(zoff_swapper_buffers_needed(true, true, 9), 3);
    /* host memory for the buffers is checked first: 2 buffers x 3 arrays x 4096-byte aligned groups */
    setenv("ZOFF_TEST_MEM_AVAILABLE", "20000", 1);
    assert_int_equal(zoff_swapper_create(&o, &s), ZOFF_ERR_NOMEM);
    assert_msg_has("NVMe swap buffers (2 x 12288 bytes)");
    assert_msg_has("buffer_count");
    setenv("ZOFF_TEST_MEM_AVAILABLE", "30000", 1);
    assert_int_equal(zoff_swapper_create(&o, &s), ZOFF_OK);
    zoff_swapper_destroy(s);
    unsetenv("ZOFF_TEST_MEM_AVAILABLE");
}

/* ------------------------------------------------------------------ training */

typedef struct snapshot { /* what a checkpoint holds */
    int steps;
    float *state[3];
    zoff_engine_scalars sc;
} snapshot;

typedef struct run_opts {
    int save_after;          /* > 0: snapshot after this many steps into *save */
    snapshot *save;
    const snapshot *resume;  /* start from this snapshot */
    int event_step;          /* before this step index: arm the fault or tamper with the file */
    void (*event)(void *arg);
    void *event_arg;
    bool ranges;             /* resume through zoff_engine_state_range; at save_after check it (below) */
    unsigned range_sets;     /* ... and set these arrays (bit i: state i) through it and back */
    bool range_bf16;         /* ... with values exact in bf16 (bf16_optimizer_states) */
} run_opts;

typedef struct run_result {
    float losses[MAXSTEPS];
    double norms[MAXSTEPS];
    float *state[3];         /* master, exp_avg, exp_avg_sq after training */
    int64_t n;
    zoff_engine_memory mem;
    char describe[1600];
    zoff_status failed;      /* the status of the first failing call (ZOFF_OK: none) */
    int failed_step;
    char msg[2048];
    zoff_status after_fail;  /* a further step after the failure */
    char after_msg[2048];
    zoff_status get_after_fail;
} run_result;

static void tokens_for(int step, int32_t *x, int32_t *y) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(step * 131 + 1);
    for (int i = 0; i < B * T + 1; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t tok = (int32_t)((s >> 33) % (V / 3));
        if (i < B * T) x[i] = tok;
        if (i > 0) y[i - 1] = tok;
    }
}

static void free_result(run_result *r) {
    for (int i = 0; i < 3; i++) free(r->state[i]);
}

/* ---- zoff_engine_state_range against zoff_engine_state_get (which reads the swap file in passes) */

static int64_t piece_len(uint64_t *seed, int64_t left, int64_t max) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    int64_t c = 1 + (int64_t)((*seed >> 33) % (uint64_t)max);
    return c < left ? c : left;
}

static void assert_floats_equal(const float *got, const float *want, int64_t n, const char *what, int i) {
    if (!memcmp(got, want, (size_t)n * sizeof(float))) return;
    int64_t j = 0;
    while (!memcmp(&got[j], &want[j], sizeof(float))) j++;
    fail_msg("%s: state %d differs first at element %lld of %lld: %.9g vs %.9g", what, i, (long long)j, (long long)n,
             got[j], want[j]);
}

/* Gets over [0, n) in pieces of 1..7000 elements (unaligned, across sub-groups and blocks) and over
 * random ranges equal the slices of state_get. */
static void check_range_gets(zoff_engine *e, int64_t n, uint64_t seed) {
    float *whole = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(zoff_engine_state_get(e, i, whole), ZOFF_OK);
        memset(got, 0xff, (size_t)n * sizeof(float));
        for (int64_t p = 0, c; p < n; p += c) {
            c = piece_len(&seed, n - p, 7000);
            if (zoff_engine_state_range(e, i, p, c, got + p, true) != ZOFF_OK) fail_msg("get: %s", zoff_last_error());
        }
        assert_floats_equal(got, whole, n, "state_range get in pieces", i);
        for (int k = 0; k < 40; k++) {
            int64_t off = (int64_t)(piece_len(&seed, n, n) - 1), c = piece_len(&seed, n - off, 9000);
            assert_int_equal(zoff_engine_state_range(e, i, off, c, got, true), ZOFF_OK);
            assert_floats_equal(got, whole + off, c, "state_range get of a random range", i);
        }
    }
    free(whole);
    free(got);
}

/* State i = x through sets of pieces of 1..9000 elements, odd pieces first, then the even ones
 * from the last back (gaps between them, written out of order). */
static void set_by_ranges(zoff_engine *e, int64_t n, int i, const float *x, uint64_t seed) {
    int64_t *at = malloc((size_t)(n + 1) * sizeof *at);
    int np = 0;
    for (int64_t p = 0; p < n; p += piece_len(&seed, n - p, 9000)) at[np++] = p;
    at[np] = n;
    for (int pass = 0; pass < 2; pass++)
        for (int k = pass ? (np - 1) & ~1 : 1; pass ? k >= 0 : k < np; k += pass ? -2 : 2)
            if (zoff_engine_state_range(e, i, at[k], at[k + 1] - at[k], (float *)x + at[k], false) != ZOFF_OK)
                fail_msg("set: %s", zoff_last_error());
    free(at);
}

/* Sets through state_range give what state_get reads back (values exact in bf16 where the state is
 * bf16), then the state is set back the same way, exactly. */
static void check_range_sets(zoff_engine *e, int64_t n, unsigned arrays, bool bf16_states) {
    float *saved[3] = {0}, *x = malloc((size_t)n * sizeof(float)), *back = malloc((size_t)n * sizeof(float));
    for (int i = 0; i < 3; i++) {
        if (!(arrays & (1u << i))) continue;
        saved[i] = malloc((size_t)n * sizeof(float));
        assert_int_equal(zoff_engine_state_get(e, i, saved[i]), ZOFF_OK);
        fill(x, n, (uint64_t)(1000 + i));
        for (int64_t k = 0; i > 0 && bf16_states && k < n; k++) { /* the top 16 bits: a bf16 value */
            uint32_t u;
            memcpy(&u, &x[k], 4);
            u &= 0xffff0000u;
            memcpy(&x[k], &u, 4);
        }
        set_by_ranges(e, n, i, x, (uint64_t)(7 + i));
        assert_int_equal(zoff_engine_state_get(e, i, back), ZOFF_OK);
        assert_floats_equal(back, x, n, "state_get after state_range sets", i);
    }
    for (int i = 0; i < 3; i++)
        if (saved[i]) {
            set_by_ranges(e, n, i, saved[i], (uint64_t)(70 + i));
            free(saved[i]);
        }
    assert_int_equal(zoff_engine_sync_params(e), ZOFF_OK); /* as after a load of the master in pieces */
    free(x);
    free(back);
}

/* Train until step nsteps (from the snapshot's step when resuming). Creation
 * errors are returned; training errors are recorded in r (failed, msg). */
static zoff_status train(const char *json, zoff_dtype dt, int nsteps, const run_opts *ro, run_result *r) {
    static const run_opts none;
    if (!ro) ro = &none;
    memset(r, 0, sizeof *r);
    zoff_config cfg;
    zoff_status s = zoff_config_load_string(json, "test config", &cfg);
    if (s != ZOFF_OK) return s;
    if ((s = zoff_config_resolve_batch(&cfg, 1)) != ZOFF_OK || (s = zoff_config_check_supported(&cfg)) != ZOFF_OK) {
        zoff_config_free(&cfg);
        return s;
    }
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU};
    assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    zoff_gpt2 *m = NULL;
    zoff_engine *e = NULL;
    int32_t *dx = NULL, *dy = NULL;
    float *init = NULL;
    zoff_gpt2_options mo = {.shape = {.num_layers = L, .hidden_size = C, .num_heads = NH, .max_seq_len = T,
                                      .vocab_size = V},
                            .batch_size = B, .seq_len = T, .dtype = dt, .external_params = cfg.zero.stage == 3};
    s = zoff_gpt2_create(dev, &mo, &m);
    if (s == ZOFF_OK) {
        r->n = zoff_gpt2_num_params(m);
        init = malloc((size_t)r->n * sizeof(float));
        if (ro->resume) memcpy(init, ro->resume->state[0], (size_t)r->n * sizeof(float));
        else zoff_gpt2_init_params(m, 42, init);
        int nt;
        const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
        zoff_engine_options eo = {.dev = dev, .cfg = &cfg, .tensors = ti, .num_tensors = nt, .num_params = r->n,
                                  .params = zoff_gpt2_params(m), .grads = zoff_gpt2_grads(m), .dtype = dt,
                                  .init_params = init};
        s = zoff_engine_create(&eo, &e);
        if (s == ZOFF_OK && cfg.zero.stage == 3) { /* stage 3: the model asks the engine for each group */
            zoff_param_hooks hk = {.arg = e, .begin_pass = zoff_engine_begin_pass, .acquire = zoff_engine_acquire,
                                   .release = zoff_engine_release};
            s = zoff_gpt2_set_param_hooks(m, &hk);
        }
    }
    int first = 0;
    if (s == ZOFF_OK && ro->resume) { /* as the CLI does: weights at create, then the state and the scalars */
        if (ro->ranges) check_range_gets(e, r->n, 77); /* with fast_init: arrays never written */
        for (int i = 0; s == ZOFF_OK && i < 3; i++)
            if (ro->ranges) set_by_ranges(e, r->n, i, ro->resume->state[i], (uint64_t)(5 + i));
            else s = zoff_engine_state_set(e, i, ro->resume->state[i]);
        if (s == ZOFF_OK && ro->ranges) s = zoff_engine_sync_params(e);
        if (s == ZOFF_OK) s = zoff_engine_set_scalars(e, &ro->resume->sc);
        first = ro->resume->steps;
    }
    if (s == ZOFF_OK) {
        zoff_engine_memory_usage(e, &r->mem);
        snprintf(r->describe, sizeof r->describe, "%s", zoff_engine_describe(e));
        s = zoff_device_alloc(dev, (size_t)B * T * 4, "x", (void **)&dx);
    }
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)B * T * 4, "y", (void **)&dy);
    if (s != ZOFF_OK) goto out;
    zoff_stream *st = zoff_device_stream(dev);
    int32_t hx[B * T], hy[B * T];
    zoff_status ts = ZOFF_OK;
    for (int step = first; ts == ZOFF_OK && step < nsteps; step++) {
        if (ro->event && step == ro->event_step) { /* the state is on disk (no write in flight), then the event */
            ts = zoff_engine_flush(e);
            ro->event(ro->event_arg);
        }
        if (ts != ZOFF_OK) break;
        tokens_for(step, hx, hy);
        ts = zoff_engine_zero_grad(e);
        if (ts == ZOFF_OK) ts = zoff_memcpy_async(st, dx, hx, sizeof hx, ZOFF_COPY_H2D);
        if (ts == ZOFF_OK) ts = zoff_memcpy_async(st, dy, hy, sizeof hy, ZOFF_COPY_H2D);
        if (ts == ZOFF_OK) ts = zoff_gpt2_forward_train(m, dx, dy, B, T, zoff_engine_backward_scale(e));
        float l = 0;
        if (ts == ZOFF_OK) ts = zoff_gpt2_mean_loss(m, &l);
        zoff_engine_begin_backward(e, true);
        if (ts == ZOFF_OK) ts = zoff_gpt2_backward(m, zoff_engine_grad_ready, e);
        zoff_step_info si = {0};
        if (ts == ZOFF_OK) ts = zoff_engine_step(e, 1e-2, &si);
        r->losses[step] = l;
        r->norms[step] = si.grad_norm;
        if (ts != ZOFF_OK) {
            r->failed = ts;
            r->failed_step = step;
            snprintf(r->msg, sizeof r->msg, "%s", zoff_last_error());
            /* the engine must refuse to go on, and must not hand out state for a checkpoint */
            r->after_fail = zoff_engine_step(e, 1e-2, &si);
            snprintf(r->after_msg, sizeof r->after_msg, "%s", zoff_last_error());
            float *tmp = malloc((size_t)r->n * sizeof(float));
            r->get_after_fail = zoff_engine_state_get(e, 1, tmp);
            free(tmp);
            break;
        }
        if (ro->save && step + 1 == ro->save_after) {
            if (ro->ranges) {
                assert_int_equal(zoff_engine_flush(e), ZOFF_OK);
                check_range_gets(e, r->n, 99);
                check_range_sets(e, r->n, ro->range_sets, ro->range_bf16);
            }
            ro->save->steps = step + 1;
            for (int i = 0; i < 3; i++) {
                ro->save->state[i] = malloc((size_t)r->n * sizeof(float));
                assert_int_equal(zoff_engine_state_get(e, i, ro->save->state[i]), ZOFF_OK);
            }
            zoff_engine_get_scalars(e, &ro->save->sc);
        }
    }
    if (ts == ZOFF_OK) {
        s = zoff_engine_flush(e);
        for (int i = 0; s == ZOFF_OK && i < 3; i++) {
            r->state[i] = malloc((size_t)r->n * sizeof(float));
            s = zoff_engine_state_get(e, i, r->state[i]);
        }
    }
out:
    if (dx) zoff_device_free(dev, dx);
    if (dy) zoff_device_free(dev, dy);
    zoff_engine_destroy(e);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    zoff_config_free(&cfg);
    free(init);
    return s;
}

#define NVME_DEFAULT "\"buffer_count\": 4, \"pipeline_read\": true, \"pipeline_write\": true"

static const char *cfg_json(char *buf, size_t n, const char *prec, const char *optim, const char *device,
                            const char *offload_extra, const char *zero_extra, const char *aio) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"optimizer\": %s, \"gradient_clipping\": 1.0, %s"
             " \"zero_optimization\": {\"stage\": 2 %s %s,"
             " \"offload_optimizer\": {\"device\": \"%s\", \"nvme_path\": \"%s\" %s}} %s}",
             B, optim, prec, strstr(zero_extra, "sub_group_size") ? "" : ", \"sub_group_size\": 3000", zero_extra, device,
             g_dir, offload_extra, aio);
    return buf;
}

#define ADAMW "{\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.1}}"

/* Bit-identical: losses, gradient norms, master weights, m and v. */
static void assert_identical(const run_result *a, const run_result *b, int nsteps, const char *what) {
    for (int i = 0; i < nsteps; i++) {
        if (memcmp(&a->losses[i], &b->losses[i], sizeof(float)))
            fail_msg("%s: step %d loss %.9g vs %.9g", what, i, a->losses[i], b->losses[i]);
        if (memcmp(&a->norms[i], &b->norms[i], sizeof(double)))
            fail_msg("%s: step %d grad norm %.17g vs %.17g", what, i, a->norms[i], b->norms[i]);
    }
    for (int k = 0; k < 3; k++)
        if (memcmp(a->state[k], b->state[k], (size_t)a->n * sizeof(float))) {
            int64_t j = 0;
            while (a->state[k][j] == b->state[k][j]) j++;
            fail_msg("%s: state %d differs first at element %lld: %.9g vs %.9g", what, k, (long long)j,
                     a->state[k][j], b->state[k][j]);
        }
}

static void check_equivalence(zoff_dtype dt, const char *prec, const char *optim, const char *offload_extra,
                              const char *zero_extra, const char *aio, const char *engine, const char *what) {
    char a[2048], b[2048];
    run_result nv, cpu;
    if (engine) setenv("ZOFF_AIO_ENGINE", engine, 1);
    zoff_status s = train(cfg_json(a, sizeof a, prec, optim, "nvme", offload_extra, zero_extra, aio), dt, 8, NULL, &nv);
    unsetenv("ZOFF_AIO_ENGINE");
    if (s != ZOFF_OK) fail_msg("%s: nvme run: %s", what, zoff_last_error());
    if (nv.failed) fail_msg("%s: nvme step %d: %s", what, nv.failed_step, nv.msg);
    s = train(cfg_json(b, sizeof b, prec, optim, "cpu", offload_extra, zero_extra, aio), dt, 8, NULL, &cpu);
    if (s != ZOFF_OK || cpu.failed) fail_msg("%s: cpu run: %s", what, zoff_last_error());
    assert_true(nv.losses[7] < nv.losses[0]); /* it trains */
    assert_identical(&nv, &cpu, 8, what);
    assert_non_null(strstr(nv.describe, "NVMe state"));
    assert_true(nv.mem.nvme > 0 && cpu.mem.nvme == 0);
    printf("%-28s bit-identical to cpu offload (loss %.6f -> %.6f); %s\n", what, nv.losses[0], nv.losses[7],
           strstr(nv.describe, "NVMe state"));
    free_result(&nv);
    free_result(&cpu);
    assert_int_equal(swap_files(NULL, 0), 0);
}

static void test_nvme_equals_cpu_f32(void **st) {
    (void)st;
    check_equivalence(ZOFF_F32, "", ADAMW, "," NVME_DEFAULT, "", "", NULL, "f32");
}
static void test_nvme_equals_cpu_bf16(void **st) {
    (void)st;
    check_equivalence(ZOFF_BF16, "\"bf16\": {\"enabled\": true},", ADAMW, "," NVME_DEFAULT, "", "", NULL, "bf16");
}
static void test_nvme_equals_cpu_fp16(void **st) {
    (void)st;
    check_equivalence(ZOFF_F16, "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8},", ADAMW, "," NVME_DEFAULT,
                      "", "", NULL, "fp16");
}

/* bf16.bf16_optimizer_states: m and v bf16 in the swap file as in host memory (stochastic
 * rounding seeded by the parameter index and the step: the same bits either way), with
 * pipelines, one buffer, fast_init, Twin-Flow, the delayed update and Lion. */
#define BF16ST "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},"
static void test_nvme_equals_cpu_bf16_states(void **st) {
    (void)st;
    check_equivalence(ZOFF_BF16, BF16ST, ADAMW, "," NVME_DEFAULT, "", "", NULL, "bf16 states");
    check_equivalence(ZOFF_BF16, BF16ST, ADAMW, ", \"buffer_count\": 1", "", "", "threads", "bf16 states, 1 buffer");
    check_equivalence(ZOFF_BF16, BF16ST, ADAMW, "," NVME_DEFAULT ", \"fast_init\": true", "",
                      ", \"aio\": {\"block_size\": 4096}", NULL, "bf16 states, fast_init");
    check_equivalence(ZOFF_BF16, BF16ST, ADAMW, "," NVME_DEFAULT ", \"ratio\": 0.5", "", "", NULL,
                      "bf16 states, Twin-Flow 0.5");
    check_equivalence(ZOFF_BF16, BF16ST, ADAMW, "," NVME_DEFAULT,
                      ", \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 2", "", NULL,
                      "bf16 states, delayed update");
    check_equivalence(ZOFF_BF16, BF16ST, "{\"type\": \"Lion\", \"params\": {\"lr\": 1e-3}}", "," NVME_DEFAULT, "", "",
                      NULL, "bf16 states, Lion (m only)");
}

/* Pipelines, buffer counts, engines, block sizes, fast_init, one sub-group,
 * Twin-Flow, the delayed update and optimizers with one state array. */
static void test_nvme_variants(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    check_equivalence(ZOFF_BF16, bf, ADAMW, ", \"buffer_count\": 1", "", "", NULL, "no pipelines, 1 buffer");
    check_equivalence(ZOFF_BF16, bf, ADAMW, ", \"buffer_count\": 2, \"pipeline_read\": true", "", "", NULL,
                      "pipelined read, 2 buffers");
    check_equivalence(ZOFF_BF16, bf, ADAMW, ", \"buffer_count\": 2, \"pipeline_write\": true", "", "", NULL,
                      "pipelined write, 2 buffers");
    check_equivalence(ZOFF_BF16, bf, ADAMW, ", \"buffer_count\": 3, \"pipeline_read\": true, \"pipeline_write\": true",
                      "", "", "threads", "thread pool, 3 buffers");
    check_equivalence(ZOFF_BF16, bf, ADAMW, ", \"buffer_count\": 64, \"pipeline_read\": true, \"pipeline_write\": true",
                      "", ", \"aio\": {\"block_size\": 4096, \"queue_depth\": 2, \"single_submit\": true}", NULL,
                      "4 KiB blocks, all buffers");
    check_equivalence(ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT ", \"fast_init\": true", "",
                      ", \"aio\": {\"overlap_events\": false, \"intra_op_parallelism\": 2}", NULL,
                      "fast_init, 2 I/O threads");
    check_equivalence(ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT, ", \"sub_group_size\": 1000000000", "", NULL,
                      "one sub-group");
    check_equivalence(ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT ", \"ratio\": 0.5", "", "", NULL, "Twin-Flow ratio 0.5");
    check_equivalence(ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT,
                      ", \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 2", "", NULL,
                      "delayed parameter update");
    check_equivalence(ZOFF_F32, "", "{\"type\": \"Adagrad\", \"params\": {\"lr\": 1e-2, \"initial_accumulator_value\": 0.1}}",
                      "," NVME_DEFAULT ", \"fast_init\": true", "", "", NULL, "Adagrad (v only), fast_init");
    check_equivalence(ZOFF_F32, "", "{\"type\": \"Lion\", \"params\": {\"lr\": 1e-3}}", "," NVME_DEFAULT, "", "",
                      NULL, "Lion (m only)");
    /* (the others: pin_memory, the default: the swap buffers pinned and registered with io_uring, fixed-buffer
     * reads and writes) pageable swap buffers, ordinary requests */
    check_equivalence(ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT ", \"pin_memory\": false", "", "", NULL,
                      "pageable buffers");
}

static void test_nvme_too_few_buffers(void **st) {
    (void)st;
    char a[2048];
    run_result r;
    assert_int_equal(train(cfg_json(a, sizeof a, "", ADAMW, "nvme", ", \"buffer_count\": 2, \"pipeline_read\": true,"
                                                                    " \"pipeline_write\": true", "", ""),
                           ZOFF_F32, 1, NULL, &r),
                     ZOFF_ERR_CONFIG);
    assert_msg_has("buffer_count 2 is too few");
    assert_msg_has("needs 3 buffers");
    assert_int_equal(swap_files(NULL, 0), 0);
}

/* Host memory holds the one 16-bit buffer (gradients in, new weights out) and the swapper's
 * buffers, not the fp32 state. */
static void test_nvme_memory(void **st) {
    (void)st;
    char a[2048], b[2048];
    run_result nv, cpu;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    assert_int_equal(train(cfg_json(a, sizeof a, bf, ADAMW, "nvme", "," NVME_DEFAULT ", \"pin_memory\": false", "", ""),
                           ZOFF_BF16, 1, NULL, &nv),
                     ZOFF_OK);
    assert_int_equal(train(cfg_json(b, sizeof b, bf, ADAMW, "cpu", "", "", ""), ZOFF_BF16, 1, NULL, &cpu), ZOFF_OK);
    size_t host_nv = nv.mem.pinned + nv.mem.pageable, host_cpu = cpu.mem.pinned + cpu.mem.pageable;
    size_t n = (size_t)nv.n;
    assert_int_equal(host_cpu, n * (12 + 2));                             /* fp32 state + grads/weights */
    size_t bufs = 4 * 3 * 12288;                                          /* 4 buffers x 3 arrays x 3000 floats, 4 KiB pages */
    assert_int_equal(host_nv, n * 2 + bufs);
    assert_true(nv.mem.nvme >= n * 12 && nv.mem.nvme < n * 12 + 64 * 4096);
    printf("host memory: cpu offload %zu B, nvme %zu B (+ %zu B on disk) for %zu parameters\n", host_cpu, host_nv,
           nv.mem.nvme, n);
    free_result(&nv);
    /* pin_memory (the default): the same buffers pinned, each a page more (aligned by hand:
     * zoff_swapper_pinned_padding), and the 16-bit buffer pinned too (what device copies touch) */
    assert_int_equal(train(cfg_json(a, sizeof a, bf, ADAMW, "nvme", "," NVME_DEFAULT, "", ""), ZOFF_BF16, 1, NULL, &nv),
                     ZOFF_OK);
    assert_int_equal(nv.mem.pinned, n * 2 + bufs + 4 * 4096);
    assert_int_equal(nv.mem.pageable, 0);
    assert_non_null(strstr(nv.describe, "4 pinned buffers"));
    if (strstr(nv.describe, "io_uring")) /* registered as fixed buffers, or the kernel's reason why not */
        assert_true(strstr(nv.describe, "4 registered buffers") || strstr(nv.describe, "not registered"));
    free_result(&nv);
    free_result(&cpu);
}

/* Checkpoint after 3 steps (state_get from disk), resume in a new engine (state_set to disk): steps 4..8 and the
 * final state are bit-identical to the straight run, and the checkpoint equals cpu offload's. */
static void test_nvme_checkpoint_resume(void **st) {
    (void)st;
    char a[2048], b[2048];
    const char *bf = "\"bf16\": {\"enabled\": true},";
    cfg_json(a, sizeof a, bf, ADAMW, "nvme", "," NVME_DEFAULT, "", "");
    cfg_json(b, sizeof b, bf, ADAMW, "cpu", "", "", "");
    run_result straight, first, resumed, cpu;
    snapshot snap = {0}, snap_cpu = {0};
    run_opts save = {.save_after = 3, .save = &snap}, save_cpu = {.save_after = 3, .save = &snap_cpu};
    assert_int_equal(train(a, ZOFF_BF16, 8, NULL, &straight), ZOFF_OK);
    assert_int_equal(train(a, ZOFF_BF16, 3, &save, &first), ZOFF_OK);
    assert_int_equal(train(b, ZOFF_BF16, 3, &save_cpu, &cpu), ZOFF_OK);
    for (int k = 0; k < 3; k++) assert_memory_equal(snap.state[k], snap_cpu.state[k], (size_t)first.n * sizeof(float));
    run_opts res = {.resume = &snap};
    assert_int_equal(train(a, ZOFF_BF16, 8, &res, &resumed), ZOFF_OK);
    for (int i = 3; i < 8; i++) assert_memory_equal(&resumed.losses[i], &straight.losses[i], sizeof(float));
    for (int k = 0; k < 3; k++)
        assert_memory_equal(resumed.state[k], straight.state[k], (size_t)straight.n * sizeof(float));
    for (int k = 0; k < 3; k++) {
        free(snap.state[k]);
        free(snap_cpu.state[k]);
    }
    free_result(&straight);
    free_result(&first);
    free_result(&resumed);
    free_result(&cpu);
}

/* zoff_engine_state_range with the state in the swap file (fp32 and bf16 m and v, block sizes
 * from 4 KiB, one and many sub-groups, Twin-Flow's device part, fast_init's never-written
 * arrays): gets equal state_get's slices, sets read back through state_get, the state set back
 * through it trains on bit-identically, and a resume through it (pieces out of order) continues
 * the straight run bit for bit. */
static void test_nvme_state_range(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    struct {
        zoff_dtype dt;
        const char *prec, *optim, *offload, *zero, *aio;
        unsigned sets;
        bool bf16st;
        const char *what;
    } v[] = {
        {ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT, "", ", \"aio\": {\"block_size\": 4096}", 7, false,
         "fp32 states, 4 KiB blocks"},
        {ZOFF_BF16, BF16ST, ADAMW, ", \"buffer_count\": 1, \"fast_init\": true", "",
         ", \"aio\": {\"block_size\": 8192}", 7, true, "bf16 states, fast_init, 1 buffer, 8 KiB blocks"},
        {ZOFF_BF16, BF16ST, ADAMW, "," NVME_DEFAULT ", \"ratio\": 0.5", "", ", \"aio\": {\"block_size\": 4096}", 7,
         true, "bf16 states, Twin-Flow 0.5"},
        {ZOFF_F32, "", "{\"type\": \"Adagrad\", \"params\": {\"lr\": 1e-2, \"initial_accumulator_value\": 0.1}}",
         "," NVME_DEFAULT ", \"fast_init\": true", "", "", 1, false, "Adagrad (v only), fast_init, 1 MiB blocks"},
        {ZOFF_BF16, bf, ADAMW, "," NVME_DEFAULT, ", \"sub_group_size\": 1000000000",
         ", \"aio\": {\"block_size\": 4096}", 7, false, "one sub-group"},
    };
    for (size_t c = 0; c < sizeof v / sizeof v[0]; c++) {
        char a[2048];
        cfg_json(a, sizeof a, v[c].prec, v[c].optim, "nvme", v[c].offload, v[c].zero, v[c].aio);
        run_result straight, first, resumed;
        snapshot snap = {0};
        run_opts save = {.save_after = 3, .save = &snap, .ranges = true, .range_sets = v[c].sets,
                         .range_bf16 = v[c].bf16st};
        if (train(a, v[c].dt, 8, NULL, &straight) != ZOFF_OK) fail_msg("%s: %s", v[c].what, zoff_last_error());
        if (train(a, v[c].dt, 8, &save, &first) != ZOFF_OK) fail_msg("%s: %s", v[c].what, zoff_last_error());
        assert_identical(&first, &straight, 8, v[c].what);
        run_opts res = {.resume = &snap, .ranges = true};
        if (train(a, v[c].dt, 8, &res, &resumed) != ZOFF_OK) fail_msg("%s: %s", v[c].what, zoff_last_error());
        for (int i = 3; i < 8; i++) assert_memory_equal(&resumed.losses[i], &straight.losses[i], sizeof(float));
        for (int k = 0; k < 3; k++) assert_floats_equal(resumed.state[k], straight.state[k], straight.n, v[c].what, k);
        printf("state_range %-44s gets == state_get, sets read back, resume through it bit-identical\n", v[c].what);
        for (int k = 0; k < 3; k++) free(snap.state[k]);
        free_result(&straight);
        free_result(&first);
        free_result(&resumed);
        assert_int_equal(swap_files(NULL, 0), 0);
    }
}

/* ---- faults ---- */
typedef struct fault_ctl {
    int armed; /* atomic */
    zoff_aio_op op;
    int64_t ret;
    int hits;
} fault_ctl;

static int64_t fault_hook(void *arg, const zoff_aio_fault_site *s) {
    fault_ctl *f = arg;
    if (!__atomic_load_n(&f->armed, __ATOMIC_ACQUIRE) || s->op != f->op || s->offset < 4096) return 0;
    __atomic_fetch_add(&f->hits, 1, __ATOMIC_RELAXED);
    return f->ret;
}
static void arm(void *arg) { __atomic_store_n(&((fault_ctl *)arg)->armed, 1, __ATOMIC_RELEASE); }

typedef struct tamper { int kind; } tamper; /* 0 truncate, 1 overwrite bytes, 2 overwrite the header */
static void do_tamper(void *arg) {
    tamper *t = arg;
    char p[600];
    assert_int_equal(swap_files(p, sizeof p), 1);
    if (t->kind == 0) {
        struct stat sb;
        assert_int_equal(stat(p, &sb), 0);
        assert_int_equal(truncate(p, sb.st_size / 2), 0);
        return;
    }
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    char junk[100];
    memset(junk, 0x5a, sizeof junk);
    /* header, or sub-group 0's master (updated last: not read ahead) */
    assert_int_equal(pwrite(fd, junk, sizeof junk, t->kind == 2 ? 8 : 4096 + 5000), (ssize_t)sizeof junk);
    fsync(fd);
    close(fd);
}

/* One fault in step 4: an error naming the swap file and the offset; the
 * engine refuses to go on; the checkpoint of step 3 resumes to the same result
 * as a run without the fault. */
static void check_fault(run_opts *ro, zoff_status want, const char *needle, const snapshot *ckpt,
                        const run_result *straight, const char *cfg) {
    run_result r;
    assert_int_equal(train(cfg, ZOFF_BF16, 8, ro, &r), ZOFF_OK);
    if (r.failed != want)
        fail_msg("%s: expected %s, got %s (%s)", needle, zoff_status_name(want), zoff_status_name(r.failed), r.msg);
    assert_int_equal(r.failed_step, 3);
    printf("fault \"%s\": %s\n", needle, r.msg);
    if (!strstr(r.msg, needle)) fail_msg("message lacks '%s': %s", needle, r.msg);
    if (!strstr(r.msg, g_dir) || !strstr(r.msg, "zoff-optimizer-")) fail_msg("message lacks the file: %s", r.msg);
    if (!strstr(r.msg, "offset")) fail_msg("message lacks the offset: %s", r.msg);
    assert_int_not_equal(r.after_fail, ZOFF_OK);
    if (!strstr(r.after_msg, "resume from the last checkpoint")) fail_msg("after the fault: %s", r.after_msg);
    assert_int_not_equal(r.get_after_fail, ZOFF_OK);
    free_result(&r);
    zoff_aio_set_fault_hook(NULL, NULL); /* the disk is healthy again */
    assert_int_equal(swap_files(NULL, 0), 0);
    run_opts res = {.resume = ckpt};
    run_result again;
    assert_int_equal(train(cfg, ZOFF_BF16, 8, &res, &again), ZOFF_OK);
    assert_int_equal(again.failed, ZOFF_OK);
    for (int i = 3; i < 8; i++) assert_memory_equal(&again.losses[i], &straight->losses[i], sizeof(float));
    for (int k = 0; k < 3; k++)
        assert_memory_equal(again.state[k], straight->state[k], (size_t)straight->n * sizeof(float));
    free_result(&again);
}

static void nvme_faults(const char *prec) {
    char a[2048];
    cfg_json(a, sizeof a, prec, ADAMW, "nvme", "," NVME_DEFAULT, "", ", \"aio\": {\"block_size\": 8192}");
    run_result straight, first;
    snapshot snap = {0};
    run_opts save = {.save_after = 3, .save = &snap};
    assert_int_equal(train(a, ZOFF_BF16, 8, NULL, &straight), ZOFF_OK);
    assert_int_equal(train(a, ZOFF_BF16, 3, &save, &first), ZOFF_OK);
    fault_ctl full = {.op = ZOFF_AIO_WRITE, .ret = -ENOSPC}, eio = {.op = ZOFF_AIO_READ, .ret = -EIO},
              shrt = {.op = ZOFF_AIO_READ, .ret = 4096};
    fault_ctl *faults[3] = {&full, &eio, &shrt};
    const char *needles[3] = {"disk full", "I/O error reading", "short read"};
    for (int i = 0; i < 3; i++) {
        zoff_aio_set_fault_hook(fault_hook, faults[i]);
        run_opts ro = {.event_step = 3, .event = arm, .event_arg = faults[i]};
        check_fault(&ro, ZOFF_ERR_IO, needles[i], &snap, &straight, a);
        assert_true(faults[i]->hits > 0);
    }
    tamper tr = {0}, ow = {1}, hd = {2};
    run_opts r1 = {.event_step = 3, .event = do_tamper, .event_arg = &tr};
    check_fault(&r1, ZOFF_ERR_FORMAT, "truncated", &snap, &straight, a);
    run_opts r2 = {.event_step = 3, .event = do_tamper, .event_arg = &ow};
    check_fault(&r2, ZOFF_ERR_FORMAT, "changed behind zoff's back", &snap, &straight, a);
    run_opts r3 = {.event_step = 3, .event = do_tamper, .event_arg = &hd};
    check_fault(&r3, ZOFF_ERR_FORMAT, "changed behind zoff's back", &snap, &straight, a);
    for (int k = 0; k < 3; k++) free(snap.state[k]);
    free_result(&straight);
    free_result(&first);
}

static void test_nvme_faults(void **st) {
    (void)st;
    nvme_faults("\"bf16\": {\"enabled\": true},");
}
/* the same faults with bf16 m and v in the swap file (arrays of two sizes: other offsets) */
static void test_nvme_faults_bf16_states(void **st) {
    (void)st;
    nvme_faults(BF16ST);
}

/* A nvme_path that cannot be created: a clear error naming it, at engine creation. */
static void test_nvme_bad_path(void **st) {
    (void)st;
    char a[2048], bad[300];
    snprintf(bad, sizeof bad, "%s/file", g_dir);
    FILE *f = fopen(bad, "w");
    fclose(f);
    char saved[256];
    memcpy(saved, g_dir, sizeof saved);
    snprintf(g_dir, sizeof g_dir, "%.200s/file/sub", saved);
    run_result r;
    zoff_status s = train(cfg_json(a, sizeof a, "", ADAMW, "nvme", "", "", ""), ZOFF_F32, 1, NULL, &r);
    memcpy(g_dir, saved, sizeof saved);
    assert_int_equal(s, ZOFF_ERR_INVALID); /* a path the user named is wrong: exit 2 */
    assert_msg_has("nvme_path");
    assert_msg_has("file/sub");
    unlink(bad);
}

static int setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/zoff-test-nvme-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    return rmdir(g_dir);
}


/* ------------------------------------------------------------------ stage 3, offload_param nvme (one rank) */

/* Stage 3 with the parameters offloaded to `pdev` ("cpu" or "nvme", with `pextra` in offload_param) and the
 * optimizer to `odev`. */
static const char *cfg3_json(char *buf, size_t n, const char *prec, const char *pdev, const char *pextra,
                             const char *odev, const char *zero_extra) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"optimizer\": " ADAMW ", \"gradient_clipping\": 1.0, %s"
             " \"zero_optimization\": {\"stage\": 3 %s,"
             " \"offload_optimizer\": {\"device\": \"%s\", \"nvme_path\": \"%s\", " NVME_DEFAULT "},"
             " \"offload_param\": {\"device\": \"%s\", \"nvme_path\": \"%s\" %s}}}",
             B, prec, zero_extra, odev, g_dir, pdev, g_dir, pextra);
    return buf;
}

#define BF16 "\"bf16\": {\"enabled\": true},"

/* The parameters on NVMe give the same arithmetic as on the host: losses, norms and state bit-identical,
 * whatever the buffers, max_in_cpu, prefetch and persistence. */
static void test_param_nvme_equals_cpu(void **st) {
    (void)st;
    static const struct {
        const char *what, *prec, *pextra, *odev, *zextra;
        zoff_dtype dt;
        bool on_disk; /* and less host memory than cpu (the buffers can be larger than this tiny partition) */
    } v[] = {
        {"bf16, 1 buffer, all on disk", BF16, ", \"buffer_count\": 1, \"max_in_cpu\": 0", "cpu", "", ZOFF_BF16, true},
        {"bf16, 2 buffers, max_in_cpu 5000, optimizer nvme", BF16,
         ", \"buffer_count\": 2, \"buffer_size\": 20000, \"max_in_cpu\": 5000, \"pin_memory\": false", "nvme",
         ", \"sub_group_size\": 3000", ZOFF_BF16, true},
        {"bf16, persistent <= 5000, no prefetch", BF16, ", \"max_in_cpu\": 0",
         "cpu", ", \"stage3_param_persistence_threshold\": 5000, \"stage3_prefetch_bucket_size\": 0", ZOFF_BF16, true},
        {"f32, 3 buffers, small prefetch", "", ", \"buffer_count\": 3, \"max_in_cpu\": 0", "nvme",
         ", \"stage3_prefetch_bucket_size\": 13000, \"stage3_param_persistence_threshold\": 0", ZOFF_F32, true},
        {"bf16, everything in max_in_cpu", BF16, "", "cpu", "", ZOFF_BF16, false},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char a[2048], b[2048];
        run_result nv, cpu;
        cfg3_json(a, sizeof a, v[i].prec, "nvme", v[i].pextra, v[i].odev, v[i].zextra);
        cfg3_json(b, sizeof b, v[i].prec, "cpu", "", v[i].odev, v[i].zextra);
        zoff_status s = train(a, v[i].dt, 8, NULL, &nv);
        if (s != ZOFF_OK || nv.failed) fail_msg("%s: nvme run: %s", v[i].what, s ? zoff_last_error() : nv.msg);
        s = train(b, v[i].dt, 8, NULL, &cpu);
        if (s != ZOFF_OK || cpu.failed) fail_msg("%s: cpu run: %s", v[i].what, s ? zoff_last_error() : cpu.msg);
        assert_true(nv.losses[7] < nv.losses[0]);
        assert_identical(&nv, &cpu, 8, v[i].what);
        assert_non_null(strstr(nv.describe, "NVMe weights"));
        /* pinned weight buffers (pin_memory) on io_uring: registered as fixed buffers, or the kernel's reason */
        const char *nw = strstr(nv.describe, "NVMe weights");
        if (v[i].on_disk && strstr(nw, "io_uring") && strstr(nw, "pinned"))
            assert_true(strstr(nw, "registered buffers") || strstr(nw, "not registered"));
        size_t opt_nvme = strcmp(v[i].odev, "nvme") == 0 ? cpu.mem.nvme : 0;
        size_t h_nv = nv.mem.pinned + nv.mem.pageable, h_cpu = cpu.mem.pinned + cpu.mem.pageable;
        if (v[i].on_disk) {
            assert_true(nv.mem.nvme > opt_nvme); /* the weights are on disk */
            if (i == 0) assert_true(h_nv < h_cpu); /* and not in host memory: one buffer of one group instead of
                                                      the whole partition */
        } else {
            assert_int_equal(nv.mem.nvme, opt_nvme);
        }
        printf("param nvme %-48s bit-identical to offload_param cpu; host %zu B vs %zu B, disk %zu B\n",
               v[i].what, h_nv, h_cpu, nv.mem.nvme);
        free_result(&nv);
        free_result(&cpu);
        assert_int_equal(swap_files(NULL, 0), 0);
    }
}

static void test_param_nvme_config_errors(void **st) {
    (void)st;
    char a[2048];
    run_result r;
    cfg3_json(a, sizeof a, BF16, "nvme", ", \"buffer_size\": 1000, \"max_in_cpu\": 0", "cpu", "");
    assert_int_equal(train(a, ZOFF_BF16, 1, NULL, &r), ZOFF_ERR_CONFIG);
    printf("buffer_size too small: %s\n", zoff_last_error());
    assert_non_null(strstr(zoff_last_error(), "offload_param.buffer_size"));
    assert_non_null(strstr(zoff_last_error(), "at least"));
    cfg3_json(a, sizeof a, BF16, "nvme", ", \"buffer_count\": 0, \"max_in_cpu\": 0", "cpu", "");
    assert_int_equal(train(a, ZOFF_BF16, 1, NULL, &r), ZOFF_ERR_CONFIG);
    assert_non_null(strstr(zoff_last_error(), "offload_param.buffer_count"));
    assert_int_equal(swap_files(NULL, 0), 0);
}

/* Checkpoint after 3 steps, resume in a new engine: bit-identical to the straight run. */
static void test_param_nvme_checkpoint_resume(void **st) {
    (void)st;
    char a[2048];
    cfg3_json(a, sizeof a, BF16, "nvme", ", \"buffer_count\": 2, \"max_in_cpu\": 3000", "nvme", "");
    run_result straight, first, resumed;
    snapshot snap = {0};
    run_opts save = {.save_after = 3, .save = &snap};
    assert_int_equal(train(a, ZOFF_BF16, 8, NULL, &straight), ZOFF_OK);
    assert_int_equal(train(a, ZOFF_BF16, 3, &save, &first), ZOFF_OK);
    run_opts res = {.resume = &snap};
    assert_int_equal(train(a, ZOFF_BF16, 8, &res, &resumed), ZOFF_OK);
    assert_int_equal(resumed.failed, ZOFF_OK);
    for (int i = 3; i < 8; i++) assert_memory_equal(&resumed.losses[i], &straight.losses[i], sizeof(float));
    for (int k = 0; k < 3; k++)
        assert_memory_equal(resumed.state[k], straight.state[k], (size_t)straight.n * sizeof(float));
    for (int k = 0; k < 3; k++) free(snap.state[k]);
    free_result(&straight);
    free_result(&first);
    free_result(&resumed);
}

static int64_t param_fault_hook(void *arg, const zoff_aio_fault_site *s) {
    fault_ctl *f = arg;
    if (!__atomic_load_n(&f->armed, __ATOMIC_ACQUIRE) || s->op != f->op || !strstr(s->path, "zoff-param-")) return 0;
    __atomic_fetch_add(&f->hits, 1, __ATOMIC_RELAXED);
    return f->ret;
}

static void corrupt_param_file(void *arg) {
    (void)arg;
    char p[600];
    assert_int_equal(swap_files(p, sizeof p), 1);
    assert_non_null(strstr(g_first_name, "zoff-param-"));
    int fd = open(p, O_WRONLY);
    assert_true(fd >= 0);
    char junk[100];
    memset(junk, 0x5a, sizeof junk);
    assert_int_equal(pwrite(fd, junk, sizeof junk, 100), (ssize_t)sizeof junk);
    fsync(fd);
    close(fd);
}

/* Faults in the parameter swap file: an error naming the file in the step where it happens. */
static void test_param_nvme_faults(void **st) {
    (void)st;
    char a[2048];
    /* nothing persistent: forward reads every group from the file */
    cfg3_json(a, sizeof a, BF16, "nvme", ", \"buffer_count\": 2, \"max_in_cpu\": 0", "cpu",
              ", \"stage3_param_persistence_threshold\": 0");
    fault_ctl eio = {.op = ZOFF_AIO_READ, .ret = -EIO}, full = {.op = ZOFF_AIO_WRITE, .ret = -ENOSPC};
    fault_ctl *faults[2] = {&eio, &full};
    const char *needles[2] = {"I/O error reading", "disk full"};
    for (int i = 0; i < 3; i++) {
        run_result r;
        run_opts ro = {.event_step = 3};
        if (i < 2) {
            zoff_aio_set_fault_hook(param_fault_hook, faults[i]);
            ro.event = arm;
            ro.event_arg = faults[i];
        } else {
            ro.event = corrupt_param_file;
        }
        assert_int_equal(train(a, ZOFF_BF16, 8, &ro, &r), ZOFF_OK);
        zoff_aio_set_fault_hook(NULL, NULL);
        const char *needle = i < 2 ? needles[i] : "changed behind zoff's back";
        printf("param fault \"%s\": %s\n", needle, r.msg);
        if (r.failed == ZOFF_OK) fail_msg("%s: no error", needle);
        assert_int_equal(r.failed_step, 3);
        if (!strstr(r.msg, needle)) fail_msg("message lacks '%s': %s", needle, r.msg);
        if (!strstr(r.msg, g_dir) || !strstr(r.msg, "zoff-param-")) fail_msg("message lacks the file: %s", r.msg);
        if (i < 2) assert_true(faults[i]->hits > 0);
        free_result(&r);
        assert_int_equal(swap_files(NULL, 0), 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_swapper_passes),
        cmocka_unit_test(test_swapper_too_few_buffers),
        cmocka_unit_test(test_nvme_equals_cpu_f32),
        cmocka_unit_test(test_nvme_equals_cpu_bf16),
        cmocka_unit_test(test_nvme_equals_cpu_fp16),
        cmocka_unit_test(test_nvme_variants),
        cmocka_unit_test(test_nvme_too_few_buffers),
        cmocka_unit_test(test_nvme_memory),
        cmocka_unit_test(test_nvme_checkpoint_resume),
        cmocka_unit_test(test_nvme_state_range),
        cmocka_unit_test(test_nvme_faults),
        cmocka_unit_test(test_nvme_equals_cpu_bf16_states),
        cmocka_unit_test(test_nvme_faults_bf16_states),
        cmocka_unit_test(test_nvme_bad_path),
        cmocka_unit_test(test_param_nvme_equals_cpu),
        cmocka_unit_test(test_param_nvme_config_errors),
        cmocka_unit_test(test_param_nvme_checkpoint_resume),
        cmocka_unit_test(test_param_nvme_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
