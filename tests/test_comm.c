/* Collectives (src/comm) against values computed here.
 *
 * Run alone (ctest) it tests the one-rank implementation; run under
 * `mpirun -np N test_comm` (tests/cli_mpi.sh does N = 2) it tests MPI with N
 * ranks: every rank fills its buffers with values that depend on the rank and
 * the index, and checks the result against the sum / max / gather computed
 * locally for all ranks. bf16/fp16 sums must equal the fp32 sum rounded once.
 * `test_comm timeout` (under mpirun) checks that a collective one rank does not
 * join fails within the timeout instead of hanging; it leaves MPI unusable, so
 * it runs on its own and the shell test checks its message. */
#define _GNU_SOURCE
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/comm.h"
#include "zoff/device.h"

static zoff_comm *g_world;
static int R, N; /* rank, size */

static float val(int rank, int64_t i) { return (float)((i % 13) - 6) * 0.37f + (float)rank * 1.25f + 0.001f * (float)i; }

static void to_dt(const float *src, void *dst, zoff_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (dt == ZOFF_F32) ((float *)dst)[i] = src[i];
        else if (dt == ZOFF_BF16) ((uint16_t *)dst)[i] = zoff_f32_to_bf16(src[i]);
        else if (dt == ZOFF_F16) ((uint16_t *)dst)[i] = zoff_f32_to_f16(src[i]);
        else ((int32_t *)dst)[i] = (int32_t)lrintf(src[i] * 8.0f);
    }
}

static float from_dt(const void *src, zoff_dtype dt, int64_t i) {
    if (dt == ZOFF_F32) return ((const float *)src)[i];
    if (dt == ZOFF_BF16) return zoff_bf16_to_f32(((const uint16_t *)src)[i]);
    if (dt == ZOFF_F16) return zoff_f16_to_f32(((const uint16_t *)src)[i]);
    return (float)((const int32_t *)src)[i];
}

/* What rank r holds at i, as the dtype stores it, back in fp32 (i32: the integer). */
static float held(int r, int64_t i, zoff_dtype dt) {
    float v = val(r, i);
    unsigned char tmp[4];
    to_dt(&v, tmp, dt, 1);
    return from_dt(tmp, dt, 0);
}

/* Expected reduction as the implementation promises: fp32 (i32 exact) over ranks, rounded once. */
static float expect_reduce(int64_t i, zoff_dtype dt, zoff_reduce_op op) {
    float acc = held(0, i, dt);
    for (int r = 1; r < N; r++) acc = op == ZOFF_REDUCE_MAX ? fmaxf(acc, held(r, i, dt)) : acc + held(r, i, dt);
    unsigned char tmp[4];
    if (dt == ZOFF_I32) return acc;
    to_dt(&acc, tmp, dt, 1);
    return from_dt(tmp, dt, 0);
}

static const zoff_dtype DTS[] = {ZOFF_F32, ZOFF_BF16, ZOFF_F16, ZOFF_I32};

/* Host buffers (s == NULL) or device buffers of a CPU device on a stream. */
typedef struct ctx {
    zoff_device *dev;
    zoff_comm *chan; /* dup used for stream-ordered calls */
    zoff_stream *st;
} ctx;

static void ctx_open(ctx *c) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    assert_int_equal(zoff_device_create(&o, &c->dev), ZOFF_OK);
    assert_int_equal(zoff_comm_dup(g_world, &c->chan), ZOFF_OK);
    assert_int_equal(zoff_comm_bind_device(c->chan, c->dev), ZOFF_OK);
    assert_int_equal(zoff_stream_create(c->dev, "comm", &c->st), ZOFF_OK);
}

static void ctx_close(ctx *c) {
    zoff_stream_destroy(c->st);
    zoff_comm_destroy(c->chan);
    zoff_device_destroy(c->dev);
}

/* Run `fn` on a buffer either on the host (stream = false) or on the device stream. */
static void *dbuf(ctx *c, size_t bytes) {
    void *p = NULL;
    assert_int_equal(zoff_device_alloc(c->dev, bytes ? bytes : 1, "test", &p), ZOFF_OK);
    return p;
}

static void test_identity(void **state) {
    (void)state;
    zoff_launch_info li;
    zoff_comm_detect_launch(&li);
    assert_int_equal(li.size, N);
    assert_true(R >= 0 && R < N);
    assert_true(zoff_comm_local_rank(g_world) >= 0 && zoff_comm_local_rank(g_world) < zoff_comm_local_size(g_world));
    int rank_all[64];
    assert_true(N <= 64);
    assert_int_equal(zoff_comm_allgather_bytes(g_world, &R, rank_all, sizeof R), ZOFF_OK);
    for (int r = 0; r < N; r++) assert_int_equal(rank_all[r], r);
    assert_int_equal(zoff_comm_barrier(g_world), ZOFF_OK);
    double d[2] = {(double)R + 0.5, (double)R};
    assert_int_equal(zoff_comm_allreduce_f64(g_world, d, 1, ZOFF_REDUCE_SUM), ZOFF_OK);
    assert_true(fabs(d[0] - (N * (N - 1) / 2.0 + 0.5 * N)) < 1e-12);
    assert_int_equal(zoff_comm_allreduce_f64(g_world, d + 1, 1, ZOFF_REDUCE_MAX), ZOFF_OK);
    assert_true(d[1] == N - 1);
    char msg[32] = {0};
    if (R == N - 1) snprintf(msg, sizeof msg, "hello %d", R);
    assert_int_equal(zoff_comm_broadcast_bytes(g_world, msg, sizeof msg, N - 1), ZOFF_OK);
    char want[32];
    snprintf(want, sizeof want, "hello %d", N - 1);
    assert_string_equal(msg, want);
}

static void allreduce_case(ctx *c, bool on_stream, zoff_dtype dt, zoff_reduce_op op, int64_t n) {
    size_t es = zoff_dtype_size(dt);
    float *f = malloc((size_t)n * sizeof *f);
    unsigned char *h = malloc((size_t)n * es + 1);
    for (int64_t i = 0; i < n; i++) f[i] = val(R, i);
    to_dt(f, h, dt, n);
    if (on_stream) {
        void *d = dbuf(c, (size_t)n * es);
        assert_int_equal(zoff_memcpy_async(c->st, d, h, (size_t)n * es, ZOFF_COPY_H2D), ZOFF_OK);
        assert_int_equal(zoff_comm_allreduce(c->chan, c->st, d, n, dt, op), ZOFF_OK);
        assert_int_equal(zoff_stream_synchronize(c->st), ZOFF_OK); /* the H2D has read h */
        memset(h, 0xAB, (size_t)n * es);
        assert_int_equal(zoff_memcpy_async(c->st, h, d, (size_t)n * es, ZOFF_COPY_D2H), ZOFF_OK);
        assert_int_equal(zoff_stream_synchronize(c->st), ZOFF_OK);
        assert_int_equal(zoff_comm_error(c->chan), ZOFF_OK);
        zoff_device_free(c->dev, d);
    } else {
        assert_int_equal(zoff_comm_allreduce(g_world, NULL, h, n, dt, op), ZOFF_OK);
    }
    for (int64_t i = 0; i < n; i++) {
        float got = from_dt(h, dt, i), want = expect_reduce(i, dt, op);
        if (got != want) fail_msg("allreduce %s %s %s: [%lld] = %.9g, want %.9g", zoff_dtype_name(dt),
                                  op == ZOFF_REDUCE_SUM ? "sum" : "max", on_stream ? "stream" : "host", (long long)i,
                                  got, want);
    }
    free(f);
    free(h);
}

static void test_allreduce(void **state) {
    (void)state;
    ctx c;
    ctx_open(&c);
    for (int k = 0; k < 4; k++)
        for (int st = 0; st < 2; st++) {
            allreduce_case(&c, st, DTS[k], ZOFF_REDUCE_SUM, 1000 + 17 * k);
            allreduce_case(&c, st, DTS[k], ZOFF_REDUCE_MAX, 333);
        }
    allreduce_case(&c, false, ZOFF_F32, ZOFF_REDUCE_SUM, 0);
    ctx_close(&c);
}

/* Uneven blocks, one of them empty when N > 1. */
static void counts_for(int64_t *counts, int64_t base) {
    for (int r = 0; r < N; r++) counts[r] = base + 7 * r;
    if (N > 1) counts[1] = 0;
}

static void test_reduce_scatter(void **state) {
    (void)state;
    ctx c;
    ctx_open(&c);
    int64_t counts[64];
    counts_for(counts, 101);
    int64_t total = 0, before = 0;
    for (int r = 0; r < N; r++) total += counts[r];
    for (int r = 0; r < R; r++) before += counts[r];
    for (int k = 0; k < 4; k++) {
        zoff_dtype dt = DTS[k];
        size_t es = zoff_dtype_size(dt);
        float *f = malloc((size_t)total * sizeof *f);
        unsigned char *h = malloc((size_t)total * es), *out = malloc((size_t)counts[R] * es + 1);
        for (int64_t i = 0; i < total; i++) f[i] = val(R, i);
        to_dt(f, h, dt, total);
        for (int st = 0; st < 2; st++) {
            memset(out, 0xCD, (size_t)counts[R] * es);
            if (st) {
                void *ds = dbuf(&c, (size_t)total * es), *dr = dbuf(&c, (size_t)counts[R] * es);
                assert_int_equal(zoff_memcpy_async(c.st, ds, h, (size_t)total * es, ZOFF_COPY_H2D), ZOFF_OK);
                assert_int_equal(zoff_comm_reduce_scatter(c.chan, c.st, ds, dr, counts, dt), ZOFF_OK);
                if (counts[R])
                    assert_int_equal(zoff_memcpy_async(c.st, out, dr, (size_t)counts[R] * es, ZOFF_COPY_D2H), ZOFF_OK);
                assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK);
                assert_int_equal(zoff_comm_error(c.chan), ZOFF_OK);
                zoff_device_free(c.dev, ds);
                zoff_device_free(c.dev, dr);
            } else {
                assert_int_equal(zoff_comm_reduce_scatter(g_world, NULL, h, out, counts, dt), ZOFF_OK);
            }
            for (int64_t i = 0; i < counts[R]; i++) {
                float got = from_dt(out, dt, i), want = expect_reduce(before + i, dt, ZOFF_REDUCE_SUM);
                if (got != want) fail_msg("reduce_scatter %s: [%lld] = %.9g, want %.9g", zoff_dtype_name(dt),
                                          (long long)i, got, want);
            }
        }
        free(f);
        free(h);
        free(out);
    }
    /* recv overlapping send is refused */
    float x[8] = {0};
    int64_t one[64];
    for (int r = 0; r < N; r++) one[r] = 1;
    assert_int_equal(zoff_comm_reduce_scatter(g_world, NULL, x, x + R, one, ZOFF_F32), ZOFF_ERR_INVALID);
    ctx_close(&c);
}

static void test_allgatherv(void **state) {
    (void)state;
    ctx c;
    ctx_open(&c);
    int64_t counts[64], displs[64];
    counts_for(counts, 55);
    int64_t total = 0;
    for (int r = N - 1; r >= 0; r--) { /* blocks in reverse rank order, with gaps */
        displs[r] = total + 3;
        total += counts[r] + 3;
    }
    for (int k = 0; k < 4; k++) {
        zoff_dtype dt = DTS[k];
        size_t es = zoff_dtype_size(dt);
        float *f = malloc((size_t)total * sizeof *f);
        unsigned char *h = malloc((size_t)total * es);
        for (int st = 0; st < 2; st++) {
            for (int64_t i = 0; i < total; i++) f[i] = -99.0f;
            for (int64_t i = 0; i < counts[R]; i++) f[displs[R] + i] = val(R, i);
            to_dt(f, h, dt, total);
            if (st) {
                void *d = dbuf(&c, (size_t)total * es);
                assert_int_equal(zoff_memcpy_async(c.st, d, h, (size_t)total * es, ZOFF_COPY_H2D), ZOFF_OK);
                assert_int_equal(zoff_comm_allgatherv(c.chan, c.st, d, counts, displs, dt), ZOFF_OK);
                assert_int_equal(zoff_memcpy_async(c.st, h, d, (size_t)total * es, ZOFF_COPY_D2H), ZOFF_OK);
                assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK);
                assert_int_equal(zoff_comm_error(c.chan), ZOFF_OK);
                zoff_device_free(c.dev, d);
            } else {
                assert_int_equal(zoff_comm_allgatherv(g_world, NULL, h, counts, displs, dt), ZOFF_OK);
            }
            for (int r = 0; r < N; r++)
                for (int64_t i = 0; i < counts[r]; i++) {
                    float got = from_dt(h, dt, displs[r] + i), want = held(r, i, dt);
                    if (got != want) fail_msg("allgatherv %s: rank %d [%lld] = %.9g, want %.9g", zoff_dtype_name(dt),
                                              r, (long long)i, got, want);
                }
            /* gaps untouched */
            float m99 = -99.0f;
            unsigned char g[4];
            to_dt(&m99, g, dt, 1);
            assert_true(from_dt(h, dt, displs[0] - 1) == from_dt(g, dt, 0));
        }
        free(f);
        free(h);
    }
    ctx_close(&c);
}

static void test_broadcast(void **state) {
    (void)state;
    ctx c;
    ctx_open(&c);
    int root = N - 1;
    for (int k = 0; k < 4; k++) {
        zoff_dtype dt = DTS[k];
        size_t es = zoff_dtype_size(dt);
        int64_t n = 777;
        float *f = malloc((size_t)n * sizeof *f);
        unsigned char *h = malloc((size_t)n * es);
        for (int st = 0; st < 2; st++) {
            for (int64_t i = 0; i < n; i++) f[i] = val(R, i);
            to_dt(f, h, dt, n);
            if (st) {
                void *d = dbuf(&c, (size_t)n * es);
                assert_int_equal(zoff_memcpy_async(c.st, d, h, (size_t)n * es, ZOFF_COPY_H2D), ZOFF_OK);
                assert_int_equal(zoff_comm_broadcast(c.chan, c.st, d, n, dt, root), ZOFF_OK);
                assert_int_equal(zoff_memcpy_async(c.st, h, d, (size_t)n * es, ZOFF_COPY_D2H), ZOFF_OK);
                assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK);
                zoff_device_free(c.dev, d);
            } else {
                assert_int_equal(zoff_comm_broadcast(g_world, NULL, h, n, dt, root), ZOFF_OK);
            }
            for (int64_t i = 0; i < n; i++) assert_true(from_dt(h, dt, i) == held(root, i, dt));
        }
        free(f);
        free(h);
    }
    assert_int_equal(zoff_comm_broadcast(g_world, NULL, &root, 1, ZOFF_I32, N), ZOFF_ERR_INVALID);
    ctx_close(&c);
}

/* Stream-ordered collectives on a dup run on the stream's thread while the main
 * thread runs host collectives on the parent: both must complete and be right. */
static void test_concurrent_channels(void **state) {
    (void)state;
    ctx c;
    ctx_open(&c);
    const int64_t n = 1 << 16;
    float *h = malloc((size_t)n * sizeof *h), *d = dbuf(&c, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) h[i] = val(R, i);
    assert_int_equal(zoff_memcpy_async(c.st, d, h, (size_t)n * sizeof *h, ZOFF_COPY_H2D), ZOFF_OK);
    for (int k = 0; k < 8; k++) assert_int_equal(zoff_comm_allreduce(c.chan, c.st, d, n, ZOFF_F32, ZOFF_REDUCE_MAX), ZOFF_OK);
    for (int k = 0; k < 20; k++) {
        double x = (double)(R + k);
        assert_int_equal(zoff_comm_allreduce_f64(g_world, &x, 1, ZOFF_REDUCE_SUM), ZOFF_OK);
        assert_true(x == (double)(N * (N - 1) / 2 + N * k));
    }
    assert_int_equal(zoff_memcpy_async(c.st, h, d, (size_t)n * sizeof *h, ZOFF_COPY_D2H), ZOFF_OK);
    assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK);
    assert_int_equal(zoff_comm_error(c.chan), ZOFF_OK);
    for (int64_t i = 0; i < n; i++) assert_true(h[i] == expect_reduce(i, ZOFF_F32, ZOFF_REDUCE_MAX));
    zoff_device_free(c.dev, d);
    free(h);
    ctx_close(&c);
}

static void test_check_same(void **state) {
    (void)state;
    assert_int_equal(zoff_comm_check_same(g_world, 0x1234, "the config"), ZOFF_OK);
    zoff_status s = zoff_comm_check_same(g_world, R == N - 1 ? 0x99 : 0x1234, "the config");
    if (N == 1) {
        assert_int_equal(s, ZOFF_OK);
    } else {
        assert_int_equal(s, ZOFF_ERR_CONFIG);
        char want[64];
        snprintf(want, sizeof want, "rank %d has 0000000000000099", N - 1);
        assert_non_null(strstr(zoff_last_error(), want));
        assert_non_null(strstr(zoff_last_error(), "the config differs across ranks"));
    }
}

static void test_bad_args(void **state) {
    (void)state;
    float x = 0;
    assert_int_equal(zoff_comm_allreduce(g_world, NULL, NULL, 5, ZOFF_F32, ZOFF_REDUCE_SUM), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_comm_allreduce(g_world, NULL, &x, 1, (zoff_dtype)9, ZOFF_REDUCE_SUM), ZOFF_ERR_INVALID);
    int64_t bad[64];
    for (int r = 0; r < N; r++) bad[r] = -1;
    assert_int_equal(zoff_comm_allgatherv(g_world, NULL, &x, bad, bad, ZOFF_F32), ZOFF_ERR_INVALID);
    assert_string_equal(zoff_comm_backend_name(g_world), N > 1 ? "mpi" : zoff_comm_backend_name(g_world));
}

static void test_launch_env(void **state) {
    (void)state;
    if (N > 1) skip(); /* the launcher's own variables are set: leave them */
    setenv("PMI_SIZE", "4", 1);
    setenv("PMI_RANK", "2", 1);
    zoff_launch_info li;
    zoff_comm_detect_launch(&li);
    assert_int_equal(li.size, 4);
    assert_int_equal(li.rank, 2);
    assert_string_equal(li.launcher, "pmi");
    if (!zoff_comm_have_mpi()) {
        zoff_comm *c = NULL;
        assert_int_equal(zoff_comm_init(NULL, NULL, NULL, &c), ZOFF_ERR_UNSUPPORTED);
        assert_non_null(strstr(zoff_last_error(), "built without MPI"));
    }
    unsetenv("PMI_SIZE");
    unsetenv("PMI_RANK");
    zoff_comm *one = NULL;
    assert_int_equal(zoff_comm_create_single(&one), ZOFF_OK);
    assert_int_equal(zoff_comm_size(one), 1);
    zoff_comm_destroy(one);
}

/* `test_comm timeout`: rank 0 enters an all-reduce that rank 1 joins only after
 * 3 s; with a 1 s timeout rank 0 must fail in [1, 2.5) s with a message. */
static int run_timeout(void) {
    zoff_comm_set_timeout(g_world, 1.0);
    double x = 1;
    if (R == 1) {
        sleep(3);
        printf("rank 1: joined late\n");
        fflush(stdout);
        return 0;
    }
    double t0 = zoff_now();
    zoff_status s = zoff_comm_allreduce_f64(g_world, &x, 1, ZOFF_REDUCE_SUM);
    double dt = zoff_now() - t0;
    printf("rank %d: status %s after %.2f s: %s\n", R, zoff_status_name(s), dt, zoff_last_error());
    fflush(stdout);
    bool ok = s == ZOFF_ERR_COMM && dt >= 0.99 && dt < 2.5 && strstr(zoff_last_error(), "timed out");
    /* a second call fails at once (sticky) */
    t0 = zoff_now();
    ok = ok && zoff_comm_barrier(g_world) == ZOFF_ERR_COMM && zoff_now() - t0 < 0.5;
    printf("rank %d: timeout test %s\n", R, ok ? "PASSED" : "FAILED");
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    zoff_comm_options o = {.timeout_s = 120};
    if (zoff_comm_init(&argc, &argv, &o, &g_world) != ZOFF_OK) {
        fprintf(stderr, "test_comm: %s\n", zoff_last_error());
        return 1;
    }
    R = zoff_comm_rank(g_world);
    N = zoff_comm_size(g_world);
    if (argc > 1 && !strcmp(argv[1], "timeout")) {
        int rc = run_timeout();
        _exit(rc); /* MPI is left with a pending collective: no finalize */
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),   cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_broadcast),  cmocka_unit_test(test_concurrent_channels),
        cmocka_unit_test(test_check_same), cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_launch_env),
    };
    char name[64];
    snprintf(name, sizeof name, "comm (rank %d of %d, %s)", R, N, zoff_comm_backend_name(g_world));
    int failed = _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
    zoff_comm_destroy(g_world);
    return failed ? 1 : 0;
}
