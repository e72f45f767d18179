/* Device layer (src/backend/device.c) and CPU backend runtime
 * (src/backend/cpu/cpu_backend.c): streams, events, copies, accounting,
 * sticky errors and launch validation. Run under ThreadSanitizer too: a
 * missing wait in the runtime is a data race here, not just a wrong value. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#include <cmocka.h>

#include "zoff/device.h"

#include "test_util.h"
#define OK(expr) assert_ok(expr)

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static zoff_device *make_cpu(size_t budget) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .memory_budget = budget, .threads = 1};
    zoff_device *dev = NULL;
    OK(zoff_device_create(&o, &dev));
    assert_non_null(dev);
    return dev;
}

/* ------------------------------------------------------------------ names, creation */

static void test_names(void **state) {
    (void)state;
    assert_int_equal(zoff_dtype_size(ZOFF_F32), 4);
    assert_int_equal(zoff_dtype_size(ZOFF_BF16), 2);
    assert_int_equal(zoff_dtype_size(ZOFF_F16), 2);
    assert_int_equal(zoff_dtype_size(ZOFF_I32), 4);
    assert_string_equal(zoff_dtype_name(ZOFF_BF16), "bf16");
    assert_string_equal(zoff_op_name(ZOFF_OP_LAYERNORM_BWD), "layernorm_bwd");
    assert_string_equal(zoff_op_name(ZOFF_OP_ADAM), "adam");
    for (int op = 0; op < ZOFF_OP_COUNT; op++) assert_string_not_equal(zoff_op_name((zoff_op)op), "invalid-op");
    assert_string_equal(zoff_op_name(ZOFF_OP_COUNT), "invalid-op");
}

static void test_create_cpu(void **state) {
    (void)state;
    assert_true(zoff_backend_available(ZOFF_BACKEND_CPU));
    zoff_device *dev = make_cpu(0);
    assert_int_equal(zoff_device_kind(dev), ZOFF_BACKEND_CPU);
    /* one of a thing is singular, as in every banner (before: "cpu (1 kernel threads)") */
    assert_string_equal(zoff_device_name(dev), "cpu (1 kernel thread)");
    assert_non_null(zoff_device_stream(dev));
    OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    zoff_device_destroy(dev);

    zoff_device_options bad = {.kind = (zoff_backend_kind)7};
    zoff_device *d2 = (zoff_device *)&bad;
    assert_int_equal(zoff_device_create(&bad, &d2), ZOFF_ERR_INVALID);
    assert_null(d2);
}

static void test_create_cuda_without_cuda(void **state) {
    (void)state;
#ifdef ZOFF_HAVE_CUDA
    skip();
#else
    assert_false(zoff_backend_available(ZOFF_BACKEND_CUDA));
    zoff_device_options o = {.kind = ZOFF_BACKEND_CUDA};
    zoff_device *dev = NULL;
    assert_int_equal(zoff_device_create(&o, &dev), ZOFF_ERR_UNSUPPORTED);
    assert_null(dev);
    assert_non_null(strstr(zoff_last_error(), "CUDA"));
    assert_non_null(strstr(zoff_last_error(), "not compiled"));
#endif
}

/* ------------------------------------------------------------------ stream ordering */

typedef struct order_log {
    int seen[256];
    int n;
} order_log;

typedef struct order_arg {
    order_log *log;
    int value;
} order_arg;

static void append_fn(void *p) {
    order_arg *a = p;
    a->log->seen[a->log->n++] = a->value;
}

static void slow_append_fn(void *p) {
    sleep_ms(2);
    append_fn(p);
}

static void test_stream_ordering(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = NULL;
    OK(zoff_stream_create(dev, "order", &s));
    order_log log = {.n = 0};
    order_arg args[200];
    for (int i = 0; i < 200; i++) {
        args[i] = (order_arg){&log, i};
        /* alternate slow and fast items: a pool or a reordering queue would shuffle them */
        OK(zoff_stream_host_fn(s, (i % 10 == 0) ? slow_append_fn : append_fn, &args[i]));
    }
    OK(zoff_stream_synchronize(s));
    assert_int_equal(log.n, 200);
    for (int i = 0; i < 200; i++) assert_int_equal(log.seen[i], i);

    /* copies and host fns interleave in order: the host fn sees the memset, not the later memcpy */
    uint8_t *buf = NULL;
    OK(zoff_device_alloc(dev, 64, "buf", (void **)&buf));
    static uint8_t src[64];
    memset(src, 7, sizeof src);
    uint8_t snapshot[64];
    memset(snapshot, 0, sizeof snapshot);
    OK(zoff_memset_async(s, buf, 3, 64));
    OK(zoff_memcpy_async(s, snapshot, buf, 64, ZOFF_COPY_D2H));
    OK(zoff_memcpy_async(s, buf, src, 64, ZOFF_COPY_H2D));
    OK(zoff_stream_synchronize(s));
    for (int i = 0; i < 64; i++) {
        assert_int_equal(snapshot[i], 3);
        assert_int_equal(buf[i], 7);
    }
    zoff_device_free(dev, buf);
    zoff_stream_destroy(s);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ cross-stream events */

typedef struct shared_val {
    int value;    /* plain int: only the event orders the write and the read */
    int observed;
} shared_val;

static void slow_writer(void *p) {
    shared_val *v = p;
    sleep_ms(100);
    v->value = 42;
}

static void reader(void *p) {
    shared_val *v = p;
    v->observed = v->value;
}

static void test_cross_stream_wait(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *a = NULL, *b = NULL;
    zoff_event *e = NULL;
    OK(zoff_stream_create(dev, "A", &a));
    OK(zoff_stream_create(dev, "B", &b));
    OK(zoff_event_create(dev, &e));
    for (int round = 0; round < 3; round++) {
        shared_val v = {0, -1};
        OK(zoff_stream_host_fn(a, slow_writer, &v));
        OK(zoff_event_record(e, a));
        OK(zoff_stream_wait_event(b, e));
        OK(zoff_stream_host_fn(b, reader, &v));
        OK(zoff_stream_synchronize(b)); /* only B: A's completion must come through the event */
        assert_int_equal(v.observed, 42);
        OK(zoff_stream_synchronize(a));
    }
    zoff_event_destroy(e);
    zoff_stream_destroy(b);
    zoff_stream_destroy(a);
    zoff_device_destroy(dev);
}

/* A wait captures the record current at the time of the wait: a later record does not delay it. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate;

static void gate_wait_fn(void *p) {
    gate *g = p;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void test_event_query_sync(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = zoff_device_stream(dev);
    zoff_event *e = NULL;
    OK(zoff_event_create(dev, &e));
    assert_true(zoff_event_query(e)); /* never recorded */
    OK(zoff_event_synchronize(e));

    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    OK(zoff_stream_host_fn(s, gate_wait_fn, &g));
    OK(zoff_event_record(e, s));
    sleep_ms(20);
    assert_false(zoff_event_query(e)); /* the stream is blocked before the record */
    gate_open(&g);
    OK(zoff_event_synchronize(e));
    assert_true(zoff_event_query(e));

    /* re-record: the event tracks the latest record */
    gate g2 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    OK(zoff_stream_host_fn(s, gate_wait_fn, &g2));
    OK(zoff_event_record(e, s));
    assert_false(zoff_event_query(e));
    gate_open(&g2);
    OK(zoff_stream_synchronize(s));
    assert_true(zoff_event_query(e));

    /* destroying an event with a record still pending is safe */
    gate g3 = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
    zoff_event *e2 = NULL;
    OK(zoff_event_create(dev, &e2));
    OK(zoff_stream_host_fn(s, gate_wait_fn, &g3));
    OK(zoff_event_record(e2, s));
    zoff_event_destroy(e2);
    gate_open(&g3);
    OK(zoff_stream_synchronize(s));

    zoff_event_destroy(e);
    zoff_device_destroy(dev);
}

/* Waiting on a never-recorded event does not block. */
static void test_wait_unrecorded_event(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_event *e = NULL;
    OK(zoff_event_create(dev, &e));
    OK(zoff_stream_wait_event(zoff_device_stream(dev), e));
    OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    zoff_event_destroy(e);
    zoff_device_destroy(dev);
}

/* Ping-pong between streams: each step reads what the other wrote. Under TSan
 * a missing happens-before edge in the runtime is reported here. */
typedef struct pingpong {
    int64_t counter;
    int64_t errors;
} pingpong;

static void pp_inc(void *p) {
    pingpong *pp = p;
    pp->counter++;
}

static void test_ping_pong(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *a = NULL, *b = NULL;
    zoff_event *ea = NULL, *eb = NULL;
    OK(zoff_stream_create(dev, "ping", &a));
    OK(zoff_stream_create(dev, "pong", &b));
    OK(zoff_event_create(dev, &ea));
    OK(zoff_event_create(dev, &eb));
    pingpong pp = {0, 0};
    for (int i = 0; i < 500; i++) {
        OK(zoff_stream_host_fn(a, pp_inc, &pp));
        OK(zoff_event_record(ea, a));
        OK(zoff_stream_wait_event(b, ea));
        OK(zoff_stream_host_fn(b, pp_inc, &pp));
        OK(zoff_event_record(eb, b));
        OK(zoff_stream_wait_event(a, eb));
    }
    OK(zoff_event_synchronize(eb));
    assert_int_equal(pp.counter, 1000);
    zoff_event_destroy(ea);
    zoff_event_destroy(eb);
    zoff_stream_destroy(a);
    zoff_stream_destroy(b);
    zoff_device_destroy(dev);
}

/* Destroying a stream drains it. */
static void test_stream_destroy_drains(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = NULL;
    OK(zoff_stream_create(dev, "drain", &s));
    order_log log = {.n = 0};
    order_arg args[50];
    for (int i = 0; i < 50; i++) {
        args[i] = (order_arg){&log, i};
        OK(zoff_stream_host_fn(s, slow_append_fn, &args[i]));
    }
    zoff_stream_destroy(s);
    assert_int_equal(log.n, 50);
    assert_int_equal(log.seen[49], 49);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ copies */

static void test_memcpy_memset(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = zoff_device_stream(dev);
    enum { N = 4096 + 3 };
    uint8_t *d1 = NULL, *d2 = NULL, *pin = NULL;
    OK(zoff_device_alloc(dev, N, "d1", (void **)&d1));
    OK(zoff_device_alloc(dev, N, "d2", (void **)&d2));
    OK(zoff_host_alloc_pinned(dev, N, "pin", (void **)&pin));
    assert_int_equal((uintptr_t)d1 % 64, 0);
    assert_int_equal((uintptr_t)pin % 64, 0);
    uint8_t *h = malloc(N), *h2 = malloc(N);
    assert_non_null(h);
    assert_non_null(h2);
    for (int i = 0; i < N; i++) h[i] = (uint8_t)(i * 31 + 1);
    memset(h2, 0, N);

    OK(zoff_memcpy_async(s, d1, h, N, ZOFF_COPY_H2D));
    OK(zoff_memcpy_async(s, d2, d1, N, ZOFF_COPY_D2D));
    OK(zoff_memcpy_async(s, pin, d2, N, ZOFF_COPY_D2H));
    OK(zoff_memcpy_async(s, h2, pin, N, ZOFF_COPY_H2H));
    OK(zoff_stream_synchronize(s));
    assert_memory_equal(h2, h, N);
    assert_memory_equal(pin, h, N);

    OK(zoff_memset_async(s, d1 + 5, 0xAB, 100));
    OK(zoff_memcpy_async(s, h2, d1, N, ZOFF_COPY_D2H));
    OK(zoff_stream_synchronize(s));
    for (int i = 0; i < N; i++) {
        uint8_t want = (i >= 5 && i < 105) ? 0xAB : h[i];
        if (h2[i] != want) fail_msg("byte %d: got %u want %u", i, h2[i], want);
    }

    /* zero bytes: no-op, NULL allowed; NULL with bytes: error */
    OK(zoff_memcpy_async(s, NULL, NULL, 0, ZOFF_COPY_H2D));
    assert_int_equal(zoff_memcpy_async(s, NULL, h, 8, ZOFF_COPY_H2D), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "destination"));
    assert_int_equal(zoff_memcpy_async(s, d1, h, 8, (zoff_copy_kind)9), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_memset_async(s, NULL, 0, 8), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_stream_host_fn(s, NULL, NULL), ZOFF_ERR_INVALID);
    OK(zoff_stream_synchronize(s));

    free(h);
    free(h2);
    zoff_device_free(dev, d1);
    zoff_device_free(dev, d2);
    zoff_host_free_pinned(dev, pin);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ memory accounting */

static void test_budget_oom(void **state) {
    (void)state;
    zoff_device *dev = make_cpu((size_t)256 << 20);
    void *a = NULL, *b = NULL;
    OK(zoff_device_alloc(dev, (size_t)250 << 20, "weights", &a));
    assert_int_equal(zoff_device_alloc(dev, (size_t)12 << 20, "activations", &b), ZOFF_ERR_DEVICE_OOM);
    assert_null(b);
    const char *m = zoff_last_error();
    assert_non_null(strstr(m, "device out of memory"));
    assert_non_null(strstr(m, "activations"));
    assert_non_null(strstr(m, "12.00 MiB"));
    assert_non_null(strstr(m, "250.00 MiB"));
    assert_non_null(strstr(m, "256.00 MiB"));
    assert_non_null(strstr(m, "budget"));
    assert_non_null(strstr(m, "--device-memory"));

    zoff_memory_stats st;
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, (size_t)250 << 20); /* the failed allocation is not counted */
    assert_int_equal(st.device_budget, (size_t)256 << 20);

    /* exactly up to the budget fits; one byte more does not */
    OK(zoff_device_alloc(dev, (size_t)6 << 20, "rest", &b));
    void *c = NULL;
    assert_int_equal(zoff_device_alloc(dev, 1, "one byte", &c), ZOFF_ERR_DEVICE_OOM);
    /* a single allocation larger than the budget (no overflow in the check) */
    zoff_device_free(dev, a);
    assert_int_equal(zoff_device_alloc(dev, SIZE_MAX - 8, "huge", &c), ZOFF_ERR_DEVICE_OOM);
    assert_null(c);
    OK(zoff_device_alloc(dev, (size_t)250 << 20, "weights again", &a));
    zoff_device_free(dev, a);
    zoff_device_free(dev, b);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, 0);
    zoff_device_destroy(dev);
}

static void test_accounting(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_memory_stats st;
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, 0);
    assert_int_equal(st.device_budget, 0);

    enum { K = 300 }; /* enough to grow the pointer map several times */
    void *p[K];
    size_t total = 0;
    for (int i = 0; i < K; i++) {
        size_t sz = (size_t)(i + 1) * 100;
        OK(zoff_device_alloc(dev, sz, "block", &p[i]));
        total += sz;
    }
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, total);
    assert_int_equal(st.device_peak, total);
    /* free every other one, then the rest in reverse */
    size_t freed = 0;
    for (int i = 0; i < K; i += 2) {
        zoff_device_free(dev, p[i]);
        freed += (size_t)(i + 1) * 100;
    }
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, total - freed);
    for (int i = K - 1; i >= 0; i--)
        if (i % 2) zoff_device_free(dev, p[i]);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, 0);
    assert_int_equal(st.device_peak, total);

    /* double free is ignored (logged), accounting stays right */
    void *q = NULL;
    OK(zoff_device_alloc(dev, 1000, "q", &q));
    zoff_device_free(dev, q);
    zoff_log_level lv = zoff_log_get_level();
    zoff_log_set_level(ZOFF_LOG_ERROR + 1); /* silence the expected message */
    zoff_device_free(dev, q);
    zoff_log_set_level(lv);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, 0);

    /* pinned memory is counted separately and page-aligned */
    void *h1 = NULL, *h2 = NULL;
    OK(zoff_host_alloc_pinned(dev, 5000, "pinned1", &h1));
    OK(zoff_host_alloc_pinned(dev, 3000, "pinned2", &h2));
    assert_int_equal((uintptr_t)h1 % 4096, 0);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.pinned_in_use, 8000);
    assert_int_equal(st.pinned_peak, 8000);
    assert_int_equal(st.device_in_use, 0);
    zoff_host_free_pinned(dev, h1);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.pinned_in_use, 3000);
    zoff_host_free_pinned(dev, h2);
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.pinned_in_use, 0);
    assert_int_equal(st.pinned_peak, 8000);
    assert_int_equal(st.device_peak, total);
    zoff_device_destroy(dev);
}

/* Allocations from several threads at once keep exact accounting. */
typedef struct alloc_worker {
    zoff_device *dev;
    int failures;
} alloc_worker;

static void *alloc_thread(void *p) {
    alloc_worker *w = p;
    void *ptrs[64];
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 64; i++)
            if (zoff_device_alloc(w->dev, 128 + (size_t)i, "mt", &ptrs[i]) != ZOFF_OK) w->failures++, ptrs[i] = NULL;
        for (int i = 0; i < 64; i++) zoff_device_free(w->dev, ptrs[i]);
    }
    return NULL;
}

static void test_accounting_threads(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    pthread_t t[4];
    alloc_worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (alloc_worker){dev, 0};
        assert_int_equal(pthread_create(&t[i], NULL, alloc_thread, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    zoff_memory_stats st;
    zoff_device_memory_stats(dev, &st);
    assert_int_equal(st.device_in_use, 0);
    assert_true(st.device_peak >= 64 * 128);
    assert_true(st.device_peak <= 4 * 64 * (128 + 64));
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ sticky errors */

typedef struct flag {
    int set;
} flag;

static void set_flag(void *p) { ((flag *)p)->set = 1; }

static void test_sticky_error(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = NULL, *other = NULL;
    OK(zoff_stream_create(dev, "failing", &s));
    OK(zoff_stream_create(dev, "healthy", &other));
    enum { B = 1, T = 4, C = 8, V = 16 };
    float *out = NULL, *wte = NULL, *wpe = NULL;
    int32_t *tok = NULL;
    OK(zoff_device_alloc(dev, sizeof(float) * B * T * C, "out", (void **)&out));
    OK(zoff_device_alloc(dev, sizeof(float) * V * C, "wte", (void **)&wte));
    OK(zoff_device_alloc(dev, sizeof(float) * T * C, "wpe", (void **)&wpe));
    OK(zoff_device_alloc(dev, sizeof(int32_t) * B * T, "tokens", (void **)&tok));
    memset(wte, 0, sizeof(float) * V * C);
    memset(wpe, 0, sizeof(float) * T * C);
    for (int i = 0; i < B * T; i++) tok[i] = i;

    zoff_op_embed_fwd_args ok_args = {.out = out, .tokens = tok, .wte = wte, .wpe = wpe, .B = B, .T = T, .C = C, .V = V,
                                      .dt = ZOFF_F32};
    OK(ZOFF_LAUNCH(other, ZOFF_OP_EMBED_FWD, ok_args));
    OK(zoff_stream_synchronize(other));

    tok[2] = V + 100; /* out of range */
    zoff_op_embed_fwd_args bad = ok_args;
    OK(ZOFF_LAUNCH(s, ZOFF_OP_EMBED_FWD, bad)); /* launch is asynchronous: the error comes at sync */
    zoff_status st = zoff_stream_synchronize(s);
    assert_int_equal(st, ZOFF_ERR_INVALID);
    const char *m = zoff_last_error();
    assert_non_null(strstr(m, "embed_fwd"));
    assert_non_null(strstr(m, "failing"));

    /* after the failure: a memset is skipped, a host fn still runs, records complete */
    memset(out, 0x11, sizeof(float) * B * T * C);
    zoff_event *e = NULL;
    OK(zoff_event_create(dev, &e));
    OK(zoff_memset_async(s, out, 0, sizeof(float) * B * T * C));
    flag f = {0};
    OK(zoff_stream_host_fn(s, set_flag, &f));
    OK(zoff_event_record(e, s));
    zoff_clear_error();
    assert_int_equal(zoff_stream_synchronize(s), st);
    assert_non_null(strstr(zoff_last_error(), "embed_fwd"));
    assert_int_equal(f.set, 1);
    assert_int_equal(((uint8_t *)out)[0], 0x11); /* memset skipped */

    /* sticky: the next sync fails again with the same message */
    zoff_clear_error();
    assert_int_equal(zoff_stream_synchronize(s), st);
    assert_non_null(strstr(zoff_last_error(), "embed_fwd"));
    /* the event recorded after the failure carries it too */
    zoff_clear_error();
    assert_int_equal(zoff_event_synchronize(e), st);
    assert_non_null(strstr(zoff_last_error(), "embed_fwd"));
    /* later kernels on the failed stream are skipped; other streams are unaffected */
    tok[2] = 2;
    OK(ZOFF_LAUNCH(s, ZOFF_OP_EMBED_FWD, ok_args));
    assert_int_equal(zoff_stream_synchronize(s), st);
    OK(zoff_stream_synchronize(other));
    assert_int_equal(((uint8_t *)out)[0], 0x11);
    wte[2 * C + 1] = 3.5f;
    OK(ZOFF_LAUNCH(other, ZOFF_OP_EMBED_FWD, ok_args));
    OK(zoff_stream_synchronize(other));
    assert_true(out[0] == 0.0f);
    assert_true(out[2 * C + 1] == 3.5f);

    zoff_event_destroy(e);
    zoff_stream_destroy(s);
    zoff_stream_destroy(other);
    zoff_device_free(dev, out);
    zoff_device_free(dev, wte);
    zoff_device_free(dev, wpe);
    zoff_device_free(dev, tok);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ launch validation */

static void test_launch_validation(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = zoff_device_stream(dev);
    float *x = NULL;
    OK(zoff_device_alloc(dev, 1024, "x", (void **)&x));

    zoff_op_gelu_fwd_args g = {.out = x, .inp = x, .n = 16, .dt = ZOFF_F32};
    assert_int_equal(zoff_launch(s, ZOFF_OP_GELU_FWD, &g, sizeof g - 1), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "args_size"));
    assert_non_null(strstr(zoff_last_error(), "gelu_fwd"));
    zoff_op_add_args add = {.out = x, .a = x, .b = x, .n = 4, .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, add), ZOFF_ERR_INVALID); /* wrong struct for the op */
    assert_int_equal(zoff_launch(s, ZOFF_OP_COUNT, &g, sizeof g), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "unknown op"));
    assert_int_equal(zoff_launch(s, (zoff_op)-1, &g, sizeof g), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_launch(s, ZOFF_OP_GELU_FWD, NULL, sizeof g), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_launch(NULL, ZOFF_OP_GELU_FWD, &g, sizeof g), ZOFF_ERR_INVALID);

    zoff_op_gelu_fwd_args g2 = g;
    g2.inp = NULL;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, g2), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "'inp'"));
    g2 = g;
    g2.n = -1;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, g2), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "-1"));
    g2 = g;
    g2.dt = ZOFF_I32;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, g2), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "i32"));
    g2.dt = (zoff_dtype)42;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_GELU_FWD, g2), ZOFF_ERR_INVALID);

    zoff_op_attention_fwd_args at = {.out = x, .lse = x, .qkv = x, .B = 1, .T = 2, .C = 10, .NH = 3, .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, at), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "NH = 3"));
    at.NH = 0;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, at), ZOFF_ERR_INVALID);
    zoff_op_attention_bwd_args ab = {.dqkv = x, .dout = x, .qkv = x, .out = x, .lse = NULL, .B = 1, .T = 2, .C = 4, .NH = 2,
                                     .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_BWD, ab), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "'lse'"));

    /* optional pointers may be NULL */
    zoff_op_matmul_bwd_args mb = {.dinp = NULL, .dweight = x, .dbias = NULL, .dout = x, .inp = x, .weight = NULL,
                                  .N = 2, .C = 2, .OC = 2, .dt = ZOFF_F32};
    zoff_op_matmul_fwd_args mf = {.out = x, .inp = x, .weight = x, .bias = NULL, .N = 2, .C = 2, .OC = 2, .dt = ZOFF_F32};
    zoff_op_adam_args ad = {.params = x, .m = x, .v = x, .grads = x, .params16 = NULL, .n = 4, .grad_dt = ZOFF_BF16,
                            .p16_dt = (zoff_dtype)99};
    zoff_op_cross_entropy_args ce = {.losses = x, .dlogits = NULL, .logits = x, .targets = (const int32_t *)x, .N = 1,
                                     .V = 5, .Vp = 4, .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_CROSS_ENTROPY, ce), ZOFF_ERR_INVALID); /* V > Vp */
    assert_non_null(strstr(zoff_last_error(), "Vp"));
    mb.dinp = x; /* needs weight now */
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mb), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "'weight'"));
    mb.dinp = NULL;
    /* the epilogue fields: gelu_pre needs an overwritten dinp, dbias_pre needs gelu_pre, gelu_out is not out */
    zoff_op_matmul_bwd_args mg = mb;
    mg.gelu_pre = x;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mg), ZOFF_ERR_INVALID); /* no dinp */
    assert_non_null(strstr(zoff_last_error(), "dinp_overwrite"));
    mg.dinp = x, mg.weight = x;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mg), ZOFF_ERR_INVALID); /* accumulating dinp */
    mg.gelu_pre = NULL, mg.dbias_pre = x, mg.dinp_overwrite = 1;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mg), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "dbias_pre needs gelu_pre"));
    zoff_op_matmul_fwd_args mfg = mf;
    mfg.gelu_out = mfg.out;
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, mfg), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "gelu_out"));
    zoff_op_embed_fwd_args ef = {.out = x, .tokens = (const int32_t *)x, .wte = x, .wpe = x, .B = INT64_MAX / 2, .T = 4,
                                 .C = 4, .V = 4, .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_EMBED_FWD, ef), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "overflow"));

    /* the fused residual LayerNorm: out must not alias an input; dresid equals dinp or does not overlap it */
    zoff_op_residual_layernorm_fwd_args rf = {.resid = x, .out = x, .mean = x, .rstd = x, .a = x, .b = x,
                                              .weight = x, .bias = x, .N = 2, .C = 4, .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_FWD, rf), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "out aliases resid"));
    zoff_op_residual_layernorm_bwd_args rb = {.dinp = x, .dresid = (float *)x + 1, .dweight = x, .dbias = x,
                                              .dout = x, .inp = x, .weight = x, .mean = x, .rstd = x, .N = 2, .C = 4,
                                              .dt = ZOFF_F32};
    assert_int_equal(ZOFF_LAUNCH(s, ZOFF_OP_RESIDUAL_LAYERNORM_BWD, rb), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "dresid overlaps dinp"));
    rb.dresid = NULL; /* valid: dinp is written */
    float *x8 = (float *)x + 8;
    rb.dweight = x8; rb.dbias = x8 + 4; rb.dout = x8 + 8; rb.inp = x8 + 16; rb.weight = x8 + 24; rb.mean = x8 + 28;
    rb.rstd = x8 + 30;

    /* Valid launches pass validation and run. */
    struct { zoff_op op; const void *args; size_t size; } valid[] = {
        {ZOFF_OP_RESIDUAL_LAYERNORM_BWD, &rb, sizeof rb},
        {ZOFF_OP_MATMUL_BWD, &mb, sizeof mb},
        {ZOFF_OP_MATMUL_FWD, &mf, sizeof mf},
        {ZOFF_OP_ADAM, &ad, sizeof ad},
    };
    memset(x, 0, 1024);
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        zoff_stream *t = NULL;
        OK(zoff_stream_create(dev, "valid", &t));
        zoff_status ls = zoff_launch(t, valid[i].op, valid[i].args, valid[i].size);
        if (ls != ZOFF_OK) fail_msg("%s rejected: %s", zoff_op_name(valid[i].op), zoff_last_error());
        zoff_status ss = zoff_stream_synchronize(t);
        if (ss != ZOFF_OK)
            fail_msg("%s: %s: %s", zoff_op_name(valid[i].op), zoff_status_name(ss), zoff_last_error());
        zoff_stream_destroy(t);
    }
    OK(zoff_stream_synchronize(s)); /* nothing rejected was queued */
    zoff_device_free(dev, x);
    zoff_device_destroy(dev);
}

/* Leftovers at device destroy are cleaned up (ASan checks there is no leak). */
static void test_destroy_with_leftovers(void **state) {
    (void)state;
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = NULL;
    zoff_event *e = NULL;
    void *p = NULL, *h = NULL;
    OK(zoff_stream_create(dev, "left", &s));
    OK(zoff_event_create(dev, &e));
    OK(zoff_device_alloc(dev, 100, "left", &p));
    OK(zoff_host_alloc_pinned(dev, 100, "left", &h));
    order_log log = {.n = 0};
    order_arg arg = {&log, 5};
    OK(zoff_stream_host_fn(s, slow_append_fn, &arg));
    OK(zoff_event_record(e, s));
    zoff_log_level lv = zoff_log_get_level();
    zoff_log_set_level(ZOFF_LOG_ERROR); /* silence the expected warnings */
    zoff_device_destroy(dev);
    zoff_log_set_level(lv);
    assert_int_equal(log.n, 1);
}

/* ------------------------------------------------------------------ op profiler */

static void sleep_40ms(void *p) {
    (void)p;
    sleep_ms(40);
}

static void test_profiler(void **state) {
    (void)state;
    assert_int_equal(zoff_op_class_of(ZOFF_OP_MATMUL_BWD), ZOFF_CLASS_GEMM);
    assert_int_equal(zoff_op_class_of(ZOFF_OP_GRAD_STATS), ZOFF_CLASS_OPTIMIZER);
    assert_int_equal(zoff_op_class_of(ZOFF_OP_COUNT), ZOFF_CLASS_OTHER);
    assert_string_equal(zoff_op_class_name(ZOFF_CLASS_ATTENTION_BWD), "attention_bwd");
    assert_string_equal(zoff_op_class_name(ZOFF_CLASS_COUNT), "invalid-class");
    zoff_device *dev = make_cpu(0);
    zoff_stream *s = zoff_device_stream(dev);
    const int64_t N = 8, C = 16, OC = 4, B = 1, T = 4, AC = 8, NH = 2; /* a matmul, an attention */
    float *host = calloc(4096, sizeof(float));
    void *buf = NULL, *w = NULL, *o = NULL, *dx = NULL, *qkv = NULL, *att = NULL, *lse = NULL;
    assert_non_null(host);
    OK(zoff_device_alloc(dev, 4096 * 4, "buf", &buf));
    OK(zoff_device_alloc(dev, 4096 * 4, "w", &w));
    OK(zoff_device_alloc(dev, 4096 * 4, "o", &o));
    OK(zoff_device_alloc(dev, 4096 * 4, "dx", &dx));
    OK(zoff_device_alloc(dev, 4096 * 4, "qkv", &qkv));
    OK(zoff_device_alloc(dev, 4096 * 4, "att", &att));
    OK(zoff_device_alloc(dev, 4096 * 4, "lse", &lse));
    void *all[] = {buf, w, o, dx, qkv, att, lse};
    for (int i = 0; i < 7; i++) OK(zoff_memcpy_async(s, all[i], host, 4096 * 4, ZOFF_COPY_H2D));
    zoff_profile p;
    assert_int_equal(zoff_profile_collect(dev, &p), ZOFF_ERR_INVALID); /* off */
    OK(zoff_profile_start(dev, 0));
    assert_int_equal(zoff_profile_start(dev, 0), ZOFF_ERR_INVALID); /* already on */
    OK(zoff_memcpy_async(s, buf, host, 4096 * 4, ZOFF_COPY_H2D));
    OK(zoff_stream_host_fn(s, sleep_40ms, NULL)); /* a gap of 40 ms between two operations */
    OK(zoff_memset_async(s, o, 0, 4096 * 4));
    zoff_op_matmul_fwd_args mf = {.out = o, .inp = buf, .weight = w, .N = N, .C = C, .OC = OC, .dt = ZOFF_F32};
    zoff_op_matmul_bwd_args mb = {.dweight = dx, .dout = o, .inp = buf, .weight = w, .N = N, .C = C, .OC = OC,
                                  .dt = ZOFF_F32};
    OK(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, mf));
    OK(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mb)); /* dweight only */
    mb.dinp = att;
    OK(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, mb)); /* and dinp */
    zoff_op_attention_fwd_args af = {.out = att, .lse = lse, .qkv = qkv, .B = B, .T = T, .C = AC, .NH = NH,
                                     .dt = ZOFF_F32};
    OK(ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, af));
    OK(zoff_profile_collect(dev, &p));
    assert_int_equal(p.count[ZOFF_CLASS_COPY_H2D], 1);
    assert_int_equal(p.count[ZOFF_CLASS_MEMSET], 1);
    assert_int_equal(p.count[ZOFF_CLASS_GEMM], 3);
    assert_int_equal(p.count[ZOFF_CLASS_ATTENTION_FWD], 1);
    assert_int_equal(p.dropped, 0);
    /* one multiply-add = 2 FLOPs: 2NC*OC forward, backward 2NC*OC per product (dweight, dinp) */
    assert_true(p.flops[ZOFF_CLASS_GEMM] == (double)(2 * N * C * OC) * 4);
    /* causal attention, FlashAttention's count: 4 B NH T^2 HS / 2 */
    assert_true(p.flops[ZOFF_CLASS_ATTENTION_FWD] == (double)(4 * B * NH * T * T * (AC / NH)) / 2);
    double sum = 0;
    for (int c = 0; c < ZOFF_CLASS_COUNT; c++) {
        assert_true(p.ms[c] >= 0);
        sum += p.ms[c];
    }
    /* one stream: the operations do not overlap, so busy time is their sum; the gap is not busy */
    assert_true(p.span_ms >= 39.0);
    assert_true(fabs(p.busy_ms - sum) < 1e-6 * (1 + sum));
    assert_true(p.busy_ms <= p.span_ms - 39.0);
    OK(zoff_profile_collect(dev, &p)); /* a new, empty window */
    assert_int_equal(p.count[ZOFF_CLASS_GEMM], 0);
    assert_true(p.span_ms == 0 && p.busy_ms == 0);
    zoff_profile_stop(dev);
    zoff_profile_stop(dev); /* off: no-op */
    assert_int_equal(zoff_profile_collect(dev, &p), ZOFF_ERR_INVALID);
    /* a full window counts what it could not record */
    OK(zoff_profile_start(dev, 2));
    for (int i = 0; i < 3; i++) OK(zoff_memset_async(s, o, 0, 64));
    OK(zoff_profile_collect(dev, &p));
    assert_int_equal(p.count[ZOFF_CLASS_MEMSET], 2);
    assert_int_equal(p.dropped, 1);
    assert_int_equal(zoff_profile_start(NULL, 0), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_profile_start(dev, -1), ZOFF_ERR_INVALID);
    for (int i = 0; i < 7; i++) zoff_device_free(dev, all[i]);
    free(host);
    zoff_device_destroy(dev); /* with the profiler still on: destroy turns it off */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_create_cpu),
        cmocka_unit_test(test_create_cuda_without_cuda),
        cmocka_unit_test(test_stream_ordering),
        cmocka_unit_test(test_cross_stream_wait),
        cmocka_unit_test(test_event_query_sync),
        cmocka_unit_test(test_wait_unrecorded_event),
        cmocka_unit_test(test_ping_pong),
        cmocka_unit_test(test_stream_destroy_drains),
        cmocka_unit_test(test_memcpy_memset),
        cmocka_unit_test(test_budget_oom),
        cmocka_unit_test(test_accounting),
        cmocka_unit_test(test_accounting_threads),
        cmocka_unit_test(test_sticky_error),
        cmocka_unit_test(test_launch_validation),
        cmocka_unit_test(test_destroy_with_leftovers),
        cmocka_unit_test(test_profiler),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
