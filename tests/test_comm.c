/* Collectives (src/comm) against values computed here.
 *
 * Run alone (ctest) it tests the one-rank implementation; run under
 * `mpirun -np N test_comm` (tests/cli_mpi.sh does N = 2) it tests MPI with N
 * ranks: every rank fills its buffers with values that depend on the rank and
 * the index, and checks the result against the sum / max / gather computed
 * locally for all ranks. bf16/fp16 sums must equal the fp32 sum rounded once.
 * `test_comm timeout` (under mpirun) checks that a collective one rank does not
 * join fails within the timeout instead of hanging; it leaves MPI unusable, so
 * it runs on its own and the shell test checks its message.
 *
 * With the CUDA backend (a GPU, or the emulator: tests/cuda_emu/run.sh,
 * EMU_ONLY=nccl) the stream-ordered collectives also run on CUDA device buffers:
 * through NCCL (comm_nccl.c) with N > 1 ranks in a build with NCCL, the one-rank
 * path with N = 1; and one engine case trains on the CUDA device.
 * `test_comm nccl_timeout` checks NCCL's watchdog. Without a CUDA device these
 * tests are skipped. */
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

#include "zero/partition.h"
#include "zoff/comm.h"
#include "zoff/config.h"
#include "zoff/device.h"
#include "zoff/engine.h"
#include "zoff/model.h"

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

/* Host buffers (s == NULL) or device buffers of a CPU or CUDA device on a stream. */
typedef struct ctx {
    zoff_device *dev;
    zoff_comm *chan; /* dup used for stream-ordered calls */
    zoff_stream *st;
    bool cuda;       /* CUDA device: only the stream-ordered variants (the host ones are the CPU tests') */
} ctx;

/* The CUDA device of this rank: GPU (local rank), or GPU 0 where there is only one (the emulator). */
static zoff_status cuda_device(zoff_device **out) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CUDA, .ordinal = zoff_comm_local_rank(g_world)};
    if (zoff_device_create(&o, out) == ZOFF_OK) return ZOFF_OK;
    o.ordinal = 0;
    return zoff_device_create(&o, out);
}

static void ctx_open_kind(ctx *c, zoff_backend_kind kind) {
    memset(c, 0, sizeof *c);
    c->cuda = kind == ZOFF_BACKEND_CUDA;
    if (c->cuda) {
        if (cuda_device(&c->dev) != ZOFF_OK) fail_msg("CUDA device: %s", zoff_last_error());
    } else {
        zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
        assert_int_equal(zoff_device_create(&o, &c->dev), ZOFF_OK);
    }
    assert_int_equal(zoff_comm_dup(g_world, &c->chan), ZOFF_OK);
    if (zoff_comm_bind_device(c->chan, c->dev) != ZOFF_OK) fail_msg("bind: %s", zoff_last_error());
    if (c->cuda && N > 1) assert_string_equal(zoff_comm_backend_name(c->chan), "nccl");
    assert_int_equal(zoff_stream_create(c->dev, "comm", &c->st), ZOFF_OK);
}

/* The CUDA variants: skipped without a CUDA device (the CPU-only build, a machine without a GPU). */
#define NEED_CUDA()                                              \
    do {                                                         \
        if (!zoff_backend_available(ZOFF_BACKEND_CUDA)) skip();  \
    } while (0)

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

/* Sizes grow with k: on NCCL the fp32 scratch of 16-bit sums is reallocated. */
static void allreduce_all(zoff_backend_kind kind) {
    ctx c;
    ctx_open_kind(&c, kind);
    for (int k = 0; k < 4; k++)
        for (int st = c.cuda; st < 2; st++) {
            allreduce_case(&c, st, DTS[k], ZOFF_REDUCE_SUM, 1000 + 17 * k);
            allreduce_case(&c, st, DTS[k], ZOFF_REDUCE_MAX, 333);
        }
    allreduce_case(&c, c.cuda, ZOFF_F32, ZOFF_REDUCE_SUM, 0);
    if (c.cuda) allreduce_case(&c, true, ZOFF_BF16, ZOFF_REDUCE_SUM, 1); /* smaller again: scratch reused */
    ctx_close(&c);
}

static void test_allreduce(void **state) {
    (void)state;
    allreduce_all(ZOFF_BACKEND_CPU);
}

/* Uneven blocks, one of them empty when N > 1. */
static void counts_for(int64_t *counts, int64_t base) {
    for (int r = 0; r < N; r++) counts[r] = base + 7 * r;
    if (N > 1) counts[1] = 0;
}

/* Two layouts: uneven blocks (NCCL: grouped ncclReduce, one per root), equal ones (ncclReduceScatter). */
static void reduce_scatter_all(zoff_backend_kind kind) {
    ctx c;
    ctx_open_kind(&c, kind);
    for (int layout = 0; layout < 2; layout++) {
    int64_t counts[64];
    if (layout == 0) counts_for(counts, 101);
    else for (int r = 0; r < N; r++) counts[r] = 203;
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
        for (int st = c.cuda; st < 2; st++) {
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
                if (got != want) fail_msg("reduce_scatter %s (%s, %s): [%lld] = %.9g, want %.9g", zoff_dtype_name(dt),
                                          layout ? "equal" : "uneven", st ? "stream" : "host", (long long)i, got, want);
            }
        }
        free(f);
        free(h);
        free(out);
    }
    }
    if (c.cuda) {
        ctx_close(&c);
        return;
    }
    /* recv overlapping send is refused */
    float x[8] = {0};
    int64_t one[64];
    for (int r = 0; r < N; r++) one[r] = 1;
    assert_int_equal(zoff_comm_reduce_scatter(g_world, NULL, x, x + R, one, ZOFF_F32), ZOFF_ERR_INVALID);
    ctx_close(&c);
}

static void test_reduce_scatter(void **state) {
    (void)state;
    reduce_scatter_all(ZOFF_BACKEND_CPU);
}

/* Two layouts: uneven blocks in reverse rank order with gaps (NCCL: grouped ncclBroadcast, one per
 * root), equal blocks back to back after an offset (NCCL: in-place ncclAllGather). */
static void allgatherv_all(zoff_backend_kind kind) {
    ctx c;
    ctx_open_kind(&c, kind);
    for (int layout = 0; layout < 2; layout++) {
    int64_t counts[64], displs[64];
    int64_t total = 0;
    if (layout == 0) {
        counts_for(counts, 55);
        for (int r = N - 1; r >= 0; r--) { /* blocks in reverse rank order, with gaps */
            displs[r] = total + 3;
            total += counts[r] + 3;
        }
    } else {
        for (int r = 0; r < N; r++) {
            counts[r] = 61;
            displs[r] = 5 + 61 * r;
        }
        total = 5 + 61 * N + 3;
    }
    for (int k = 0; k < 4; k++) {
        zoff_dtype dt = DTS[k];
        size_t es = zoff_dtype_size(dt);
        float *f = malloc((size_t)total * sizeof *f);
        unsigned char *h = malloc((size_t)total * es);
        for (int st = c.cuda; st < 2; st++) {
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
                    if (got != want) fail_msg("allgatherv %s (layout %d, %s): rank %d [%lld] = %.9g, want %.9g",
                                              zoff_dtype_name(dt), layout, st ? "stream" : "host", r, (long long)i,
                                              got, want);
                }
            /* gaps untouched */
            float m99 = -99.0f;
            unsigned char g[4];
            to_dt(&m99, g, dt, 1);
            assert_true(from_dt(h, dt, displs[0] - 1) == from_dt(g, dt, 0));
            if (layout == 1) assert_true(from_dt(h, dt, total - 1) == from_dt(g, dt, 0)); /* tail gap */
        }
        free(f);
        free(h);
    }
    }
    ctx_close(&c);
}

static void test_allgatherv(void **state) {
    (void)state;
    allgatherv_all(ZOFF_BACKEND_CPU);
}

static void broadcast_all(zoff_backend_kind kind) {
    ctx c;
    ctx_open_kind(&c, kind);
    for (int root = N - 1; root >= 0; root -= N > 1 ? N - 1 : 1)
    for (int k = 0; k < 4; k++) {
        zoff_dtype dt = DTS[k];
        size_t es = zoff_dtype_size(dt);
        int64_t n = 777;
        float *f = malloc((size_t)n * sizeof *f);
        unsigned char *h = malloc((size_t)n * es);
        for (int st = c.cuda; st < 2; st++) {
            for (int64_t i = 0; i < n; i++) f[i] = val(R, i);
            to_dt(f, h, dt, n);
            if (st) {
                void *d = dbuf(&c, (size_t)n * es);
                assert_int_equal(zoff_memcpy_async(c.st, d, h, (size_t)n * es, ZOFF_COPY_H2D), ZOFF_OK);
                assert_int_equal(zoff_comm_broadcast(c.chan, c.st, d, n, dt, root), ZOFF_OK);
                assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK); /* the H2D has read h */
                memset(h, 0xAB, (size_t)n * es);
                assert_int_equal(zoff_memcpy_async(c.st, h, d, (size_t)n * es, ZOFF_COPY_D2H), ZOFF_OK);
                assert_int_equal(zoff_stream_synchronize(c.st), ZOFF_OK);
                assert_int_equal(zoff_comm_error(c.chan), ZOFF_OK);
                zoff_device_free(c.dev, d);
            } else {
                assert_int_equal(zoff_comm_broadcast(g_world, NULL, h, n, dt, root), ZOFF_OK);
            }
            for (int64_t i = 0; i < n; i++) assert_true(from_dt(h, dt, i) == held(root, i, dt));
        }
        free(f);
        free(h);
    }
    int root = 0;
    assert_int_equal(zoff_comm_broadcast(c.chan, c.cuda ? c.st : NULL, &root, 1, ZOFF_I32, N), ZOFF_ERR_INVALID);
    ctx_close(&c);
}

static void test_broadcast(void **state) {
    (void)state;
    broadcast_all(ZOFF_BACKEND_CPU);
}

/* Stream-ordered collectives on a dup run on the stream's thread while the main
 * thread runs host collectives on the parent: both must complete and be right. */
static void concurrent_all(zoff_backend_kind kind) {
    ctx c;
    ctx_open_kind(&c, kind);
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

static void test_concurrent_channels(void **state) {
    (void)state;
    concurrent_all(ZOFF_BACKEND_CPU);
}

/* ------------------------------------------------------------------ CUDA device buffers (NCCL with N > 1) */

static void test_cuda_allreduce(void **state) {
    (void)state;
    NEED_CUDA();
    allreduce_all(ZOFF_BACKEND_CUDA);
}
static void test_cuda_reduce_scatter(void **state) {
    (void)state;
    NEED_CUDA();
    reduce_scatter_all(ZOFF_BACKEND_CUDA);
}
static void test_cuda_allgatherv(void **state) {
    (void)state;
    NEED_CUDA();
    allgatherv_all(ZOFF_BACKEND_CUDA);
}
static void test_cuda_broadcast(void **state) {
    (void)state;
    NEED_CUDA();
    broadcast_all(ZOFF_BACKEND_CUDA);
}
static void test_cuda_concurrent_channels(void **state) {
    (void)state;
    NEED_CUDA();
    concurrent_all(ZOFF_BACKEND_CUDA);
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


/* ------------------------------------------------------------------ the partition plan */

/* Contiguous and round-robin plans cover [0, n) exactly once, with balanced sizes;
 * round-robin deals tensors (last first) to the lightest bucket before the split,
 * so that both tensors of every "layer" (pair) have different owners. */
static void test_partition_plan(void **state) {
    (void)state;
    zoff_tensor_info t[10];
    int64_t off = 0;
    for (int i = 0; i < 10; i++) {
        t[i] = (zoff_tensor_info){.offset = off, .numel = 1000 + 300 * i, .layer = i / 2};
        off += t[i].numel;
    }
    for (int world = 1; world <= 4; world++)
        for (int rr = 0; rr < 2; rr++) {
            zoff_dp_plan p;
            assert_int_equal(zoff_dp_plan_build(&p, t, 10, off, world, world - 1, rr), ZOFF_OK);
            int64_t covered = 0, total = 0;
            for (int i = 0; i < p.npieces; i++) {
                assert_int_equal(p.pieces[i].model, covered); /* sorted, no gap, no overlap */
                covered += p.pieces[i].count;
            }
            assert_int_equal(covered, off);
            for (int r = 0; r < world; r++) {
                total += p.numel[r];
                int64_t loc = 0;
                for (int k = 0; k < p.nown[r]; k++) { /* local order is dense */
                    assert_int_equal(p.pieces[p.own[r][k]].local, loc);
                    loc += p.pieces[p.own[r][k]].count;
                }
                assert_int_equal(loc, p.numel[r]);
                assert_true(llabs(p.numel[r] - off / world) <= ZOFF_DP_ALIGN);
            }
            assert_int_equal(total, off);
            zoff_dp_layout l;
            assert_int_equal(zoff_dp_layout_alloc(&p, &l), ZOFF_OK);
            int shared = 0;
            for (int pair = 0; pair < 5; pair++) { /* a layer's gradients: one rank, or shared */
                zoff_dp_layout_of(&p, t[2 * pair].offset, t[2 * pair + 1].offset + t[2 * pair + 1].numel, &l);
                int owners = 0;
                for (int r = 0; r < world; r++) owners += l.counts[r] > 0;
                if (rr && world == 2) assert_int_equal(owners, 2); /* every layer spread */
                shared += owners > 1;
            }
            if (!rr && world == 2) assert_true(shared <= 1); /* only the layer holding the cut */
            zoff_dp_layout_free(&l);
            /* local <-> model round trip */
            float *full = malloc((size_t)off * sizeof *full), *loc = malloc((size_t)p.numel[p.rank] * sizeof *loc);
            for (int64_t i = 0; i < off; i++) full[i] = (float)i;
            zoff_dp_gather_local(&p, full, loc, 0, p.numel[p.rank]);
            for (int k = 0; k < p.nown[p.rank]; k++) {
                zoff_dp_piece q = p.pieces[p.own[p.rank][k]];
                assert_true(loc[q.local] == (float)q.model && loc[q.local + q.count - 1] == (float)(q.model + q.count - 1));
            }
            memset(full, 0, (size_t)off * sizeof *full);
            zoff_dp_scatter_local(&p, loc, full, 0, p.numel[p.rank]);
            for (int k = 0; k < p.nown[p.rank]; k++) assert_true(full[p.pieces[p.own[p.rank][k]].model] == (float)p.pieces[p.own[p.rank][k]].model);
            free(full);
            free(loc);
            zoff_dp_plan_free(&p);
        }
}

/* ------------------------------------------------------------------ data-parallel training
 *
 * N ranks at micro-batch b against one rank at micro-batch N*b on the same rows:
 * each rank trains with the data-parallel engine on rows [r*b, (r+1)*b) of every
 * global micro-batch, and also runs the one-rank reference (comm NULL) on all
 * N*b rows itself. Losses are the mean over ranks. */

enum { DL = 2, DC = 32, DNH = 2, DT = 16, DV = 97, DB = 2 /* rows per rank */ };
#define DP_STEPS 5

typedef struct dp_result {
    float loss[DP_STEPS];
    double norm[DP_STEPS], scale[DP_STEPS];
    bool skipped[DP_STEPS];
    float *w; /* fp32 master, model order */
    int64_t n;
    int64_t rollbacks; /* speculation (super_offload): failed validations */
} dp_result;

/* Row j of global micro-batch k of a step: its own token stream. */
static void dp_row(int step, int k, int j, int32_t *x, int32_t *y) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(step * 1009 + k * 131 + j * 7 + 1);
    for (int i = 0; i < DT + 1; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t tok = (int32_t)((s >> 33) % (DV / 3));
        if (i < DT) x[i] = tok;
        if (i > 0) y[i - 1] = tok;
    }
}

static void dp_json(char *buf, size_t n, int micro, int accum, const char *prec, const char *zero, double clip) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.1}},"
             " \"gradient_clipping\": %g, %s \"zero_optimization\": %s}",
             micro, accum, clip, prec, zero);
}

/* The device dp_train trains on (the CUDA case sets it for one test). */
static zoff_backend_kind g_dp_kind = ZOFF_BACKEND_CPU;
/* The model waits per layer group for its weights (options.weight_waits, as zoff train):
 * stages 1-2 with offload take the pipelined step (per-group all-gathers). */
static bool g_dp_waits;
/* The pipelined timeline (g_dp_tl.on): a larger model; per step, when the forward's wait for
 * the embeddings returned and when the host update before it ran (zoff_now seconds). */
static struct {
    bool on;
    zoff_engine *e;
    int step;
    double group0_ready[DP_STEPS], host_t0[DP_STEPS], host_t1[DP_STEPS];
} g_dp_tl;
static zoff_status dp_logged_wait(void *arg, zoff_stream *s, int64_t off, int64_t count) {
    (void)arg;
    zoff_status st = zoff_engine_wait_weights(g_dp_tl.e, s, off, count);
    if (st == ZOFF_OK && off == 0 && g_dp_tl.group0_ready[g_dp_tl.step] == 0)
        g_dp_tl.group0_ready[g_dp_tl.step] = zoff_now();
    return st;
}

static zoff_status dp_init_range(void *arg, int64_t lo, int64_t hi, float *dst) {
    zoff_gpt2_init_params_range(arg, 42, lo, hi, dst);
    return ZOFF_OK;
}

/* comm NULL: the reference with `rows` rows per micro-batch starting at row0. */
static zoff_status dp_train(const char *zero, const char *prec, zoff_dtype dt, int accum, double clip,
                            zoff_comm *comm, int rows, int row0, dp_result *r) {
    memset(r, 0, sizeof *r);
    char json[1024];
    dp_json(json, sizeof json, rows, accum, prec, zero, clip);
    zoff_config cfg;
    zoff_status s = zoff_config_load_string(json, "dp test config", &cfg);
    int world = comm ? zoff_comm_size(comm) : 1;
    if (s == ZOFF_OK) s = zoff_config_resolve_batch(&cfg, world);
    if (s != ZOFF_OK) return s;
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    if (g_dp_kind == ZOFF_BACKEND_CUDA) assert_int_equal(cuda_device(&dev), ZOFF_OK);
    else assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    zoff_gpt2 *m = NULL;
    zoff_engine *e = NULL;
    int32_t *dx = NULL, *dy = NULL;
    float *init = NULL;
    bool stage3 = cfg.zero.stage == 3;
    zoff_gpt2_options mo = {.shape = {.num_layers = g_dp_tl.on ? 8 : DL, .hidden_size = g_dp_tl.on ? 512 : DC,
                                      .num_heads = DNH, .max_seq_len = DT,
                                      .vocab_size = DV},
                            .batch_size = rows, .seq_len = DT, .dtype = dt, .external_params = stage3};
    s = zoff_gpt2_create(dev, &mo, &m);
    if (s == ZOFF_OK) {
        r->n = zoff_gpt2_num_params(m);
        /* odd ranks: the initial weights of their partition's model runs straight into the engine
         * (options.init_range); even ranks and one rank: a whole buffer. Both must give the
         * one-rank run's weights. */
        if (!comm || zoff_comm_rank(comm) % 2 == 0) {
            init = malloc((size_t)r->n * sizeof(float));
            zoff_gpt2_init_params(m, 42, init);
        }
        int nt;
        const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
        zoff_engine_options eo = {.dev = dev, .cfg = &cfg, .tensors = ti, .num_tensors = nt, .num_params = r->n,
                                  .params = zoff_gpt2_params(m), .grads = zoff_gpt2_grads(m), .dtype = dt,
                                  .init_params = init, .init_range = init ? NULL : dp_init_range, .init_arg = m,
                                  .comm = comm, .weight_waits = g_dp_waits && !stage3};
        s = zoff_engine_create(&eo, &e);
        if (s == ZOFF_OK && eo.weight_waits)
            s = zoff_gpt2_set_weight_wait(m, g_dp_tl.on ? dp_logged_wait : zoff_engine_wait_weights, e);
        g_dp_tl.e = e;
        if (s == ZOFF_OK && stage3) { /* the model asks the engine for each group's weights */
            assert_null(zoff_gpt2_params(m));
            zoff_param_hooks hk = {.arg = e, .begin_pass = zoff_engine_begin_pass, .acquire = zoff_engine_acquire,
                                   .release = zoff_engine_release};
            s = zoff_gpt2_set_param_hooks(m, &hk);
        }
    }
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)rows * DT * 4, "x", (void **)&dx);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)rows * DT * 4, "y", (void **)&dy);
    zoff_stream *st = zoff_device_stream(dev);
    int32_t *hx = malloc((size_t)rows * DT * 4), *hy = malloc((size_t)rows * DT * 4);
    for (int step = 0; s == ZOFF_OK && step < DP_STEPS; step++) {
        g_dp_tl.step = step;
        s = zoff_engine_zero_grad(e);
        double loss = 0;
        for (int k = 0; s == ZOFF_OK && k < accum; k++) {
            s = zoff_stream_synchronize(st); /* the previous copies have read hx, hy */
            for (int j = 0; j < rows; j++) dp_row(step, k, row0 + j, hx + j * DT, hy + j * DT);
            if (s == ZOFF_OK) s = zoff_memcpy_async(st, dx, hx, (size_t)rows * DT * 4, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_memcpy_async(st, dy, hy, (size_t)rows * DT * 4, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward_train(m, dx, dy, rows, DT, zoff_engine_backward_scale(e));
            float l = 0;
            if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(m, &l);
            loss += l;
            zoff_engine_begin_backward(e, k == accum - 1);
            if (s == ZOFF_OK) s = zoff_gpt2_backward(m, zoff_engine_grad_ready, e);
        }
        double h0 = 0, h1 = 0; /* the boundary backward began after the last host update (step `step`) ended */
        if (step > 0 && zoff_engine_last_host_update(e, &h0, &h1) == step) {
            g_dp_tl.host_t0[step] = h0;
            g_dp_tl.host_t1[step] = h1;
        }
        zoff_step_info si = {0};
        if (s == ZOFF_OK) s = zoff_engine_step(e, 1e-2, &si);
        if (s == ZOFF_OK && comm) s = zoff_comm_allreduce_f64(comm, &loss, 1, ZOFF_REDUCE_SUM);
        r->loss[step] = (float)(loss / accum / world);
        r->norm[step] = si.grad_norm;
        r->scale[step] = si.loss_scale;
        r->skipped[step] = si.skipped;
        r->rollbacks = si.rollbacks;
    }
    if (s == ZOFF_OK) {
        r->w = malloc((size_t)r->n * sizeof(float));
        s = zoff_engine_flush(e);
        if (s == ZOFF_OK) s = zoff_engine_state_gather(e, 0, r->w);
    }
    free(hx);
    free(hy);
    if (dx) zoff_device_free(dev, dx);
    if (dy) zoff_device_free(dev, dy);
    zoff_engine_destroy(e);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    zoff_config_free(&cfg);
    free(init);
    return s;
}

/* max |a-b| / max(|b|, floor) over losses; relative L2 distance of weights */
static double dp_loss_err(const dp_result *a, const dp_result *b) {
    double worst = 0;
    for (int i = 0; i < DP_STEPS; i++) worst = fmax(worst, fabs((double)a->loss[i] - b->loss[i]) / fmax(fabs(b->loss[i]), 1e-3));
    return worst;
}
static double dp_weight_err(const dp_result *a, const dp_result *b) {
    double d = 0, n = 0;
    for (int64_t i = 0; i < b->n; i++) {
        d += ((double)a->w[i] - b->w[i]) * ((double)a->w[i] - b->w[i]);
        n += (double)b->w[i] * b->w[i];
    }
    return sqrt(d / fmax(n, 1e-30));
}

/* The data-parallel run against the reference; returns through *le, *we. */
/* ref_zero: the reference's zero_optimization (NULL: the same as the run's) */
static void dp_case_ref(const char *name, const char *zero, const char *ref_zero, const char *prec, zoff_dtype dt,
                        int accum, double clip, double loss_tol, double weight_tol) {
    dp_result d, ref;
    zoff_comm *c = NULL;
    assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    zoff_status s = dp_train(zero, prec, dt, accum, clip, c, DB, R * DB, &d);
    if (s != ZOFF_OK) fail_msg("%s: data-parallel run failed: %s", name, zoff_last_error());
    s = dp_train(ref_zero ? ref_zero : zero, prec, dt, accum, clip, NULL, N * DB, 0, &ref);
    if (s != ZOFF_OK) fail_msg("%s: reference run failed: %s", name, zoff_last_error());
    double le = dp_loss_err(&d, &ref), we = dp_weight_err(&d, &ref);
    bool same_sched = true;
    for (int i = 0; i < DP_STEPS; i++) same_sched = same_sched && d.skipped[i] == ref.skipped[i] && d.scale[i] == ref.scale[i];
    if (R == 0 && getenv("ZOFF_TEST_VERBOSE"))
        for (int i = 0; i < DP_STEPS; i++)
            printf("    step %d: loss %.6f / %.6f, scale %g / %g, skipped %d / %d\n", i, d.loss[i], ref.loss[i], d.scale[i],
                   ref.scale[i], d.skipped[i], ref.skipped[i]);
    if (R == 0)
        printf("  dp %-44s %d ranks x %d rows vs 1 x %d: loss err %.2e (tol %.0e), weight err %.2e (tol %.0e)\n", name,
               N, DB, N * DB, le, loss_tol, we, weight_tol);
    if (!(le <= loss_tol) || !(we <= weight_tol) || !same_sched)
        fail_msg("%s: %d ranks differ from 1 rank: loss %.3e (tol %.0e), weights %.3e (tol %.0e), loss-scale "
                 "schedule %s",
                 name, N, le, loss_tol, we, weight_tol, same_sched ? "same" : "DIFFERENT");
    free(d.w);
    free(ref.w);
    zoff_comm_destroy(c);
}

static void dp_case(const char *name, const char *zero, const char *prec, zoff_dtype dt, int accum, double clip,
                    double loss_tol, double weight_tol) {
    dp_case_ref(name, zero, NULL, prec, dt, accum, clip, loss_tol, weight_tol);
}

/* Tolerances: max relative loss error over the steps, relative L2 distance of
 * the final fp32 weights. fp32 differs by summation order only (two half-batch
 * matmuls summed vs one): measured with 2 ranks, losses <= 1.2e-6, weights
 * 3e-6..5.2e-5 depending on the initial draw (seed 42 of the counter-based
 * init: 4.9e-5..5.2e-5; seed 43: 4.3e-6..1.9e-5; the earlier splitmix init:
 * 3e-6..6.2e-6), because Adam turns a sign change of a near-zero gradient into
 * a full lr step; the weight tolerance is 4x the largest draw seen (rank 0's
 * half of the data alone is 3e-1 away). 16-bit gradients are rounded per rank
 * before the (fp32) sum instead of once: bf16 losses 1.8e-4, weights 1.7e-2;
 * fp16 6.7e-6, 1.5e-3. Tolerances are 3-10x those. */
#define F32_LOSS 5e-6
#define F32_W 2e-4
static void test_dp_stage0(void **st) {
    (void)st;
    dp_case("stage 0", "{\"stage\": 0}", "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage1_offload(void **st) {
    (void)st;
    dp_case("stage 1, offload cpu", "{\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", ZOFF_F32, 1,
            1.0, F32_LOSS, F32_W);
}
static void test_dp_stage1_device(void **st) {
    (void)st;
    dp_case("stage 1", "{\"stage\": 1}", "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage2_offload_accum(void **st) {
    (void)st;
    dp_case("stage 2, offload cpu, accumulation 2", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "",
            ZOFF_F32, 2, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage2_device_rr(void **st) {
    (void)st;
    dp_case("stage 2, round robin", "{\"stage\": 2, \"round_robin_gradients\": true}", "", ZOFF_F32, 1, 1.0, F32_LOSS,
            F32_W);
}
static void test_dp_stage2_twinflow_rr(void **st) {
    (void)st;
    dp_case("stage 2, offload ratio 0.5, round robin",
            "{\"stage\": 2, \"round_robin_gradients\": true, \"sub_group_size\": 2000,"
            " \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}",
            "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage2_bf16_rr(void **st) {
    (void)st;
    dp_case("stage 2, bf16, offload cpu, round robin",
            "{\"stage\": 2, \"round_robin_gradients\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}",
            "\"bf16\": {\"enabled\": true},", ZOFF_BF16, 1, 1.0, 2e-3, 5e-2);
}
static void test_dp_fp16_overflow(void **st) {
    (void)st;
    /* 2^20 overflows the first 3 steps: skipped on every rank together (global overflow), then updates */
    dp_case("stage 2, fp16 loss scaling from 2^20", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}",
            "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 20, \"hysteresis\": 1},", ZOFF_F16, 1, 1.0, 1e-4,
            1e-2);
}
static void test_dp_stage2_nvme(void **st) {
    (void)st;
    dp_case("stage 2, offload nvme",
            "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp/zoff_test_comm_nvme\"}}",
            "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_delayed_update(void **st) {
    (void)st;
    dp_case("stage 2, offload cpu, delayed update",
            "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}, \"zoff_delayed_param_update\": true,"
            " \"zoff_delayed_param_update_warmup\": 2}",
            "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}

/* Stage 3 against one rank with stage 2 (a different path: flat buffers, no gathering). */
#define S2_REF "{\"stage\": 2}"
#define S2_REF_CPU "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"
/* The pipelined exact step with 2 ranks (the model waits per layer group; each group is
 * all-gathered as soon as every rank's part is pushed, in forward order): == 1 rank
 * within the same tolerances; with accumulation, with device sub-groups (Twin-Flow: the
 * gathers follow the device optimizer too) and round-robin partitions (updated in model
 * order), with fp16 steps skipped on overflow (no gather), with bf16. */
static void test_dp_pipelined(void **st) {
    (void)st;
    g_dp_waits = true;
    dp_case("pipelined, stage 2, offload cpu, accumulation 2",
            "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", ZOFF_F32, 2, 1.0, F32_LOSS, F32_W);
    dp_case("pipelined, stage 1, offload ratio 0.5, round robin",
            "{\"stage\": 1, \"round_robin_gradients\": true, \"sub_group_size\": 2000,"
            " \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}",
            "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
    dp_case("pipelined, stage 2, fp16 loss scaling from 2^20",
            "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}",
            "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 20, \"hysteresis\": 1},", ZOFF_F16, 1, 1.0, 1e-4,
            1e-2);
    dp_case("pipelined, stage 2, bf16, round robin",
            "{\"stage\": 2, \"round_robin_gradients\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}",
            "\"bf16\": {\"enabled\": true},", ZOFF_BF16, 1, 1.0, 2e-3, 5e-2);
    g_dp_waits = false;
}

/* The timeline of the pipelined step with 2 ranks: the next forward gets the embeddings
 * (updated first by rank 0, which owns them; all-gathered as soon as both ranks pushed their
 * part) while rank 0's host optimizer still updates the later groups. With the step's
 * all-gather (the serial path) the forward starts only after the whole update. 8 blocks,
 * width 512 (a host update of ~10 ms against a gather of ~2 ms). On a shared machine a busy
 * neighbour can stretch a gather past an update: an attempt passes with at least 2 of its 4
 * steps' forwards before their update ended, and up to 3 attempts are run (rank 0 judges and
 * broadcasts its verdict, so every rank runs the same collective attempts). The serial path
 * passes none. */
static int dp_timeline_attempt(void) {
    memset(&g_dp_tl, 0, sizeof g_dp_tl);
    g_dp_tl.on = true;
    g_dp_waits = true;
    dp_result d;
    zoff_comm *c = NULL;
    assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    zoff_status s = dp_train("{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", ZOFF_F32, 1, 1.0, c, DB,
                             R * DB, &d);
    g_dp_waits = false;
    g_dp_tl.on = false;
    zoff_comm_destroy(c);
    if (s != ZOFF_OK) fail_msg("pipelined timeline run failed: %s", zoff_last_error());
    free(d.w);
    if (R != 0) return 0; /* rank 0 owns the embeddings (contiguous partitions) */
    int early = 0;
    for (int i = 1; i < DP_STEPS; i++) { /* the forward of iteration i after optimizer step i */
        assert_true(g_dp_tl.host_t1[i] > g_dp_tl.host_t0[i] && g_dp_tl.group0_ready[i] > 0);
        printf("  dp pipelined timeline, step %d: host update %.3f ms, embeddings gathered %.3f ms after it began\n", i,
               1e3 * (g_dp_tl.host_t1[i] - g_dp_tl.host_t0[i]), 1e3 * (g_dp_tl.group0_ready[i] - g_dp_tl.host_t0[i]));
        early += g_dp_tl.group0_ready[i] < g_dp_tl.host_t1[i];
    }
    return early;
}

static void test_dp_pipelined_timeline(void **st) {
    (void)st;
    enum { ATTEMPTS = 3, NEED = 2 };
    int early = 0;
    for (int a = 1; a <= ATTEMPTS; a++) {
        early = dp_timeline_attempt();
        assert_int_equal(zoff_comm_broadcast_bytes(g_world, &early, sizeof early, 0), ZOFF_OK);
        if (R == 0) printf("  dp pipelined timeline, attempt %d: %d of %d steps early\n", a, early, DP_STEPS - 1);
        if (early >= NEED) return;
    }
    fail_msg("the forward got the gathered embeddings before the host update ended in only %d of %d steps"
             " (need %d; %d attempts)", early, DP_STEPS - 1, NEED, ATTEMPTS);
}

/* Speculation-then-validation (super_offload) with 2 ranks == the exact (pipelined) step
 * with 2 ranks, bit for bit (losses, norms, every fp32 master weight): kept (no clip),
 * rolled back by a tiny clip (every speculated step: all but the first, which has no
 * learning rate to speculate with), rolled back by fp16 overflows (the first steps at
 * loss scale 2^20; the global flag, so every rank rolls back together), round-robin. */
/* want_rollbacks < 0: one per step the exact run skipped after the first (fp16 overflow). */
static void spec_case_on(bool one_rank, const char *name, const char *zero_exact, const char *zero_spec,
                         const char *prec, zoff_dtype dt, int accum, double clip, int64_t want_rollbacks) {
    dp_result a, b;
    zoff_comm *c = NULL;
    if (!one_rank) assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    int rows = one_rank ? N * DB : DB, row0 = one_rank ? 0 : R * DB;
    g_dp_waits = true;
    zoff_status s = dp_train(zero_exact, prec, dt, accum, clip, c, rows, row0, &a);
    if (s != ZOFF_OK) fail_msg("%s: exact run failed: %s", name, zoff_last_error());
    s = dp_train(zero_spec, prec, dt, accum, clip, c, rows, row0, &b);
    if (s != ZOFF_OK) fail_msg("%s: speculative run failed: %s", name, zoff_last_error());
    g_dp_waits = false;
    if (want_rollbacks < 0) {
        want_rollbacks = 0;
        for (int i = 1; i < DP_STEPS; i++) want_rollbacks += a.skipped[i];
        if (want_rollbacks == 0) fail_msg("%s: the exact run skipped no speculated step: nothing to roll back", name);
    }
    bool same = memcmp(a.loss, b.loss, sizeof a.loss) == 0 && memcmp(a.norm, b.norm, sizeof a.norm) == 0 &&
                a.n == b.n && memcmp(a.w, b.w, (size_t)a.n * sizeof(float)) == 0;
    if (R == 0)
        printf("  dp %-44s %d ranks: speculative %s exact, %lld rollbacks (want %lld)\n", name, one_rank ? 1 : N,
               same ? "==" : "!=", (long long)b.rollbacks, (long long)want_rollbacks);
    if (!same || b.rollbacks != want_rollbacks || a.rollbacks != 0)
        fail_msg("%s: speculative vs exact on %d ranks: %s, %lld rollbacks (want %lld)", name, N,
                 same ? "bit-identical" : "DIFFERENT", (long long)b.rollbacks, (long long)want_rollbacks);
    free(a.w);
    free(b.w);
    zoff_comm_destroy(c);
}
static void spec_case(const char *name, const char *zero_exact, const char *zero_spec, const char *prec,
                      zoff_dtype dt, int accum, double clip, int64_t want_rollbacks) {
    spec_case_on(false, name, zero_exact, zero_spec, prec, dt, accum, clip, want_rollbacks);
}
static void test_dp_speculative(void **st) {
    (void)st;
#define SPEC_ZERO(rr, spec)                                                                                            \
    "{\"stage\": 2, \"round_robin_gradients\": " rr ", \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": " spec \
    "}}"
    spec_case("speculation kept", SPEC_ZERO("false", "false"), SPEC_ZERO("false", "true"), "", ZOFF_F32, 1, 0.0, 0);
    spec_case("speculation kept, accumulation 2, round robin", SPEC_ZERO("true", "false"), SPEC_ZERO("true", "true"),
              "", ZOFF_F32, 2, 0.0, 0);
    spec_case("speculation rolled back by clip 1e-6", SPEC_ZERO("true", "false"), SPEC_ZERO("true", "true"), "",
              ZOFF_F32, 1, 1e-6, DP_STEPS - 1);
    /* 2^20 overflows steps 1-3 (test_dp_fp16_overflow): 2 and 3 speculated and rolled back */
    spec_case("speculation rolled back by fp16 overflow", SPEC_ZERO("false", "false"), SPEC_ZERO("false", "true"),
              "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 20, \"hysteresis\": 1},", ZOFF_F16, 1, 0.0, 2);
#undef SPEC_ZERO
}

/* Stage 3 speculation: the new weights kept apart from the partition the gathers read (the host
 * staging buffer, offload_param none; a second one, offload_param cpu) until the step commits
 * them; == the exact stage-3 step bit for bit on N ranks and on one, kept and rolled back
 * (clip 1e-6: every speculated step; fp16 overflow: the skipped steps). Sub-groups of 3000:
 * several per rank, updated as their reduced gradients land. */
static void test_dp_stage3_speculative(void **st) {
    (void)st;
#define S3_SPEC(extra, param, spec)                                                                                    \
    "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"sub_group_size\": 3000" extra                        \
    ", \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": " spec "}, \"offload_param\": {\"device\": \"" \
    param "\"}}"
    const char *bf = "\"bf16\": {\"enabled\": true},";
    spec_case("stage 3 speculation kept", S3_SPEC("", "none", "false"), S3_SPEC("", "none", "true"), "", ZOFF_F32, 1,
              0.0, 0);
    spec_case("stage 3 param cpu, kept, round robin", S3_SPEC(", \"round_robin_gradients\": true", "cpu", "false"),
              S3_SPEC(", \"round_robin_gradients\": true", "cpu", "true"), bf, ZOFF_BF16, 1, 0.0, 0);
    spec_case("stage 3 param cpu, rolled back by clip 1e-6", S3_SPEC("", "cpu", "false"), S3_SPEC("", "cpu", "true"),
              bf, ZOFF_BF16, 1, 1e-6, DP_STEPS - 1);
    /* a skipped step runs no exact update: speculative weights written into the partition would stay */
    spec_case("stage 3 param cpu, rolled back by fp16 overflow", S3_SPEC("", "cpu", "false"), S3_SPEC("", "cpu", "true"),
              "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 20, \"hysteresis\": 1},", ZOFF_F16, 1, 0.0, -1);
    spec_case_on(true, "stage 3 one rank, param cpu, clip 1e-6", S3_SPEC("", "cpu", "false"), S3_SPEC("", "cpu", "true"),
                 bf, ZOFF_BF16, 1, 1e-6, DP_STEPS - 1);
    spec_case_on(true, "stage 3 one rank, kept, accumulation 2", S3_SPEC("", "none", "false"),
                 S3_SPEC("", "none", "true"), "", ZOFF_F32, 2, 0.0, 0);
    /* refused with the reason: the update would write what the gathers read */
    dp_result r;
    assert_int_equal(dp_train(S3_SPEC("", "cpu", "true"), "", ZOFF_F32, 1, 0.0, NULL, DB, 0, &r), ZOFF_ERR_UNSUPPORTED);
    assert_non_null(strstr(zoff_last_error(), "needs 16-bit weights"));
    assert_int_equal(dp_train("{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": true},"
                              " \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp/zoff_test_comm_pnvme\"}}",
                              "\"bf16\": {\"enabled\": true},", ZOFF_BF16, 1, 0.0, NULL, DB, 0, &r),
                     ZOFF_ERR_UNSUPPORTED);
    assert_non_null(strstr(zoff_last_error(), "offload_param.device \"nvme\" is not supported"));
#undef S3_SPEC
}

static void test_dp_stage3(void **st) {
    (void)st;
    dp_case_ref("stage 3, every group gathered", "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0}", S2_REF, "",
                ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage3_persistent_accum(void **st) {
    (void)st;
    /* embeddings (4608) and ln_f (64) stay whole, blocks (12704) are gathered; no prefetch */
    dp_case_ref("stage 3, persistent <= 5000, no prefetch, accum 2",
                "{\"stage\": 3, \"stage3_param_persistence_threshold\": 5000, \"stage3_prefetch_bucket_size\": 0}",
                S2_REF, "", ZOFF_F32, 2, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage3_offload_param_rr(void **st) {
    (void)st;
    dp_case_ref("stage 3, offload param+optimizer cpu, round robin",
                "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"round_robin_gradients\": true,"
                " \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}",
                S2_REF_CPU, "", ZOFF_F32, 1, 1.0, F32_LOSS, F32_W);
}
static void test_dp_stage3_bf16_offload(void **st) {
    (void)st;
    dp_case_ref("stage 3, bf16, offload optimizer cpu",
                "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0,"
                " \"offload_optimizer\": {\"device\": \"cpu\"}}",
                S2_REF_CPU, "\"bf16\": {\"enabled\": true},", ZOFF_BF16, 1, 1.0, 2e-3, 5e-2);
}
/* Prefetching changes when groups are gathered, never what: bit-identical to none. */
static void test_dp_stage3_prefetch_exact(void **st) {
    (void)st;
    zoff_comm *c = NULL;
    assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    dp_result a, b;
    assert_int_equal(dp_train("{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 0}",
                              "", ZOFF_F32, 1, 1.0, c, DB, R * DB, &a), ZOFF_OK);
    assert_int_equal(dp_train("{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 100000}",
                              "", ZOFF_F32, 1, 1.0, c, DB, R * DB, &b), ZOFF_OK);
    assert_int_equal(memcmp(a.w, b.w, (size_t)a.n * sizeof(float)), 0);
    assert_int_equal(memcmp(a.loss, b.loss, sizeof a.loss), 0);
    free(a.w);
    free(b.w);
    zoff_comm_destroy(c);
}

/* offload_param nvme (ZeRO-Infinity) against offload_param cpu: the same arithmetic, bit for bit, on N
 * ranks and on one rank (stage 3 over one rank), with the weights read from each rank's swap file
 * (max_in_cpu 0, small buffer pools, round-robin runs) or partly resident. */
static void test_dp_stage3_param_nvme_exact(void **st) {
    (void)st;
    static const char *pn[3] = {
        ", \"buffer_count\": 1, \"max_in_cpu\": 0",
        ", \"buffer_count\": 2, \"buffer_size\": 13000, \"max_in_cpu\": 3000, \"pin_memory\": false",
        ", \"buffer_count\": 3, \"max_in_cpu\": 0"};
    static const char *zx[3] = {", \"round_robin_gradients\": true",
                                ", \"stage3_prefetch_bucket_size\": 0", ", \"stage3_prefetch_bucket_size\": 13000"};
    zoff_comm *c = NULL;
    assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    for (int k = 0; k < 3; k++)
        for (int one = 0; one < 2; one++) { /* N ranks, then one rank */
            char a[700], b[700];
            const char *fmt = "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0 %s,"
                              " \"offload_optimizer\": {\"device\": \"%s\", \"nvme_path\": \"/tmp/zoff_test_comm_nvme\"},"
                              " \"offload_param\": {\"device\": \"%s\", \"nvme_path\": \"/tmp/zoff_test_comm_pnvme\" %s}}";
            const char *odev = k == 2 ? "nvme" : "cpu";
            snprintf(a, sizeof a, fmt, zx[k], odev, "nvme", pn[k]);
            snprintf(b, sizeof b, fmt, zx[k], odev, "cpu", "");
            dp_result x, y;
            const char *prec = "\"bf16\": {\"enabled\": true},";
            zoff_status s = dp_train(a, prec, ZOFF_BF16, 1 + k % 2, 1.0, one ? NULL : c, one ? N * DB : DB,
                                     one ? 0 : R * DB, &x);
            if (s != ZOFF_OK) fail_msg("param nvme case %d: %s", k, zoff_last_error());
            s = dp_train(b, prec, ZOFF_BF16, 1 + k % 2, 1.0, one ? NULL : c, one ? N * DB : DB, one ? 0 : R * DB, &y);
            if (s != ZOFF_OK) fail_msg("param cpu case %d: %s", k, zoff_last_error());
            assert_int_equal(memcmp(x.w, y.w, (size_t)x.n * sizeof(float)), 0);
            assert_int_equal(memcmp(x.loss, y.loss, sizeof x.loss), 0);
            assert_true(x.loss[DP_STEPS - 1] < x.loss[0]);
            if (R == 0)
                printf("  dp stage 3 param nvme case %d on %d rank%s: bit-identical to param cpu (loss %.6f -> %.6f)\n",
                       k, one ? 1 : N, one || N == 1 ? "" : "s", x.loss[0], x.loss[DP_STEPS - 1]);
            free(x.w);
            free(y.w);
        }
    zoff_comm_destroy(c);
}

/* Partitioning does not change the arithmetic of an element: without clipping
 * (the norm's summation order is the only difference), stage 1, stage 2 and
 * round-robin runs agree bit for bit. And the comparison can fail: one rank's
 * half of the data is not the full batch. */
static void test_dp_exact_and_discriminating(void **st) {
    (void)st;
    zoff_comm *c = NULL;
    assert_int_equal(zoff_comm_dup(g_world, &c), ZOFF_OK);
    const char *z[3] = {"{\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}",
                        "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}",
                        "{\"stage\": 2, \"round_robin_gradients\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}"};
    dp_result r[3];
    for (int k = 0; k < 3; k++) assert_int_equal(dp_train(z[k], "", ZOFF_F32, 1, 0.0, c, DB, R * DB, &r[k]), ZOFF_OK);
    for (int k = 1; k < 3; k++) {
        assert_int_equal(memcmp(r[k].w, r[0].w, (size_t)r[0].n * sizeof(float)), 0);
        assert_int_equal(memcmp(r[k].loss, r[0].loss, sizeof r[0].loss), 0);
    }
    if (N > 1) {
        dp_result half;
        assert_int_equal(dp_train(z[1], "", ZOFF_F32, 1, 0.0, NULL, DB, 0, &half), ZOFF_OK);
        double we = dp_weight_err(&r[1], &half);
        if (R == 0) printf("  dp: rank 0's half of the data alone is %.2e away (tolerance %.0e)\n", we, F32_W);
        assert_true(we > 100 * F32_W);
        free(half.w);
    }
    for (int k = 0; k < 3; k++) free(r[k].w);
    zoff_comm_destroy(c);
}

/* The engine on the CUDA device: its gradient channel goes through NCCL with N > 1 (grouped ncclReduce
 * for the uneven round-robin partitions, ncclAllGather of the weights, fp32 widening of bf16
 * gradients), against one rank on the same device. Tolerances as on the CPU (bf16). */
static void test_cuda_dp_stage2_bf16_rr(void **st) {
    (void)st;
    NEED_CUDA();
    g_dp_kind = ZOFF_BACKEND_CUDA;
    dp_case("cuda: stage 2, bf16, offload cpu, round robin",
            "{\"stage\": 2, \"round_robin_gradients\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}",
            "\"bf16\": {\"enabled\": true},", ZOFF_BF16, 1, 1.0, 2e-3, 5e-2);
    g_dp_kind = ZOFF_BACKEND_CPU;
}

/* `test_comm nccl_timeout` (under mpirun, with a CUDA device and NCCL): rank 0's stream-ordered
 * all-reduce on device memory waits for rank 1, which never joins; NCCL would wait forever, the
 * watchdog aborts the communicator after the 1 s timeout: the stream synchronises within [1, 3.5) s
 * and the comm reports the error, naming the collective; the next call fails at once; destroying the
 * communicator afterwards neither hangs nor aborts NCCL twice. */
static int run_nccl_timeout(void) {
    if (N < 2 || !zoff_comm_have_nccl() || !zoff_backend_available(ZOFF_BACKEND_CUDA)) {
        printf("rank %d: nccl timeout test SKIPPED (needs 2 ranks, NCCL and a CUDA device)\n", R);
        return 0;
    }
    zoff_comm_set_timeout(g_world, 1.0);
    zoff_device *dev = NULL;
    zoff_stream *st = NULL;
    void *d = NULL;
    const int64_t n = 4096;
    if (cuda_device(&dev) != ZOFF_OK || zoff_comm_bind_device(g_world, dev) != ZOFF_OK ||
        zoff_stream_create(dev, "comm", &st) != ZOFF_OK || zoff_device_alloc(dev, n * 4, "x", &d) != ZOFF_OK ||
        zoff_memset_async(st, d, 0, n * 4) != ZOFF_OK || zoff_stream_synchronize(st) != ZOFF_OK) {
        printf("rank %d: nccl timeout test FAILED in setup: %s\n", R, zoff_last_error());
        return 1;
    }
    if (R == 1) {
        sleep(4);
        printf("rank 1: never joined\n");
        fflush(stdout);
        return 0;
    }
    double t0 = zoff_now();
    zoff_status s = zoff_comm_allreduce(g_world, st, d, n, ZOFF_F32, ZOFF_REDUCE_SUM);
    double t_issue = zoff_now() - t0;
    zoff_status ss = zoff_stream_synchronize(st);
    double dt = zoff_now() - t0;
    zoff_status e = zoff_comm_error(g_world);
    printf("rank %d: issued (%s) in %.3f s; stream synchronised (%s) after %.2f s; comm error %s: %s\n", R,
           zoff_status_name(s), t_issue, zoff_status_name(ss), dt, zoff_status_name(e), zoff_last_error());
    fflush(stdout);
    bool ok = s == ZOFF_OK && t_issue < 0.5 && e == ZOFF_ERR_COMM && dt >= 0.99 && dt < 3.5 &&
              strstr(zoff_last_error(), "NCCL all-reduce did not finish within");
    t0 = zoff_now();
    ok = ok && zoff_comm_allreduce(g_world, st, d, n, ZOFF_F32, ZOFF_REDUCE_SUM) == ZOFF_ERR_COMM &&
         zoff_now() - t0 < 0.5;
    /* the aborted communicator is released without a second ncclCommAbort (a use after free in NCCL;
     * the stand-in stops the process), and without waiting for rank 1 */
    t0 = zoff_now();
    zoff_comm_destroy(g_world);
    ok = ok && zoff_now() - t0 < 0.5;
    zoff_stream_destroy(st);
    zoff_device_free(dev, d);
    zoff_device_destroy(dev);
    printf("rank %d: nccl timeout test %s\n", R, ok ? "PASSED" : "FAILED");
    fflush(stdout);
    return ok ? 0 : 1;
}

/* `test_comm timeout`: rank 0 enters an all-reduce that rank 1 joins only after
 * 6 s; with a 1 s timeout rank 0 must fail in [1, 5) s (a loaded machine may
 * deschedule it for a while) with a message. */
static int run_timeout(void) {
    zoff_comm_set_timeout(g_world, 1.0);
    double x = 1;
    if (R == 1) {
        sleep(6);
        printf("rank 1: joined late\n");
        fflush(stdout);
        return 0;
    }
    double t0 = zoff_now();
    zoff_status s = zoff_comm_allreduce_f64(g_world, &x, 1, ZOFF_REDUCE_SUM);
    double dt = zoff_now() - t0;
    printf("rank %d: status %s after %.2f s: %s\n", R, zoff_status_name(s), dt, zoff_last_error());
    fflush(stdout);
    bool ok = s == ZOFF_ERR_COMM && dt >= 0.99 && dt < 5.0 && strstr(zoff_last_error(), "timed out");
    /* a second call fails at once (sticky) */
    t0 = zoff_now();
    ok = ok && zoff_comm_barrier(g_world) == ZOFF_ERR_COMM && zoff_now() - t0 < 0.5;
    printf("rank %d: timeout test %s\n", R, ok ? "PASSED" : "FAILED");
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (getenv("ZOFF_TEST_VERBOSE")) zoff_log_set_level(ZOFF_LOG_DEBUG);
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
    if (argc > 1 && !strcmp(argv[1], "nccl_timeout")) _exit(run_nccl_timeout()); /* likewise */
    if (getenv("ZOFF_TEST_FILTER")) cmocka_set_test_filter(getenv("ZOFF_TEST_FILTER")); /* e.g. "test_cuda_*" */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),   cmocka_unit_test(test_allreduce),
        cmocka_unit_test(test_reduce_scatter), cmocka_unit_test(test_allgatherv),
        cmocka_unit_test(test_broadcast),  cmocka_unit_test(test_concurrent_channels),
        cmocka_unit_test(test_check_same), cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_launch_env), cmocka_unit_test(test_partition_plan),
        cmocka_unit_test(test_dp_stage0), cmocka_unit_test(test_dp_stage1_offload),
        cmocka_unit_test(test_dp_stage1_device), cmocka_unit_test(test_dp_stage2_offload_accum),
        cmocka_unit_test(test_dp_stage2_device_rr), cmocka_unit_test(test_dp_stage2_twinflow_rr),
        cmocka_unit_test(test_dp_stage2_bf16_rr), cmocka_unit_test(test_dp_fp16_overflow),
        cmocka_unit_test(test_dp_stage2_nvme), cmocka_unit_test(test_dp_delayed_update),
        cmocka_unit_test(test_dp_exact_and_discriminating), cmocka_unit_test(test_dp_pipelined),
        cmocka_unit_test(test_dp_pipelined_timeline),       cmocka_unit_test(test_dp_speculative),
        cmocka_unit_test(test_dp_stage3),
        cmocka_unit_test(test_dp_stage3_persistent_accum), cmocka_unit_test(test_dp_stage3_offload_param_rr),
        cmocka_unit_test(test_dp_stage3_bf16_offload), cmocka_unit_test(test_dp_stage3_prefetch_exact),
        cmocka_unit_test(test_dp_stage3_param_nvme_exact), cmocka_unit_test(test_dp_stage3_speculative),
        cmocka_unit_test(test_cuda_allreduce), cmocka_unit_test(test_cuda_reduce_scatter),
        cmocka_unit_test(test_cuda_allgatherv), cmocka_unit_test(test_cuda_broadcast),
        cmocka_unit_test(test_cuda_concurrent_channels), cmocka_unit_test(test_cuda_dp_stage2_bf16_rr),
    };
    char name[64];
    snprintf(name, sizeof name, "comm (rank %d of %d, %s)", R, N, zoff_comm_backend_name(g_world));
    int failed = _cmocka_run_group_tests(name, tests, sizeof tests / sizeof tests[0], NULL, NULL);
    zoff_comm_destroy(g_world);
    return failed ? 1 : 0;
}
