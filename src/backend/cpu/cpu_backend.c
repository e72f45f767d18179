/* CPU backend runtime: zoff_cpu_backend_vtable.
 *
 * Device memory is 64-byte-aligned host memory; pinned memory is page-aligned
 * host memory (like cudaHostAlloc, and usable for O_DIRECT I/O).
 *
 * Each stream is a pthread with a FIFO of work items (kernel with a copy of
 * its args, memcpy, memset, host fn, event record, event wait) that it runs in
 * issue order. Every item gets a sequence number; the stream counts the items
 * it has finished, and stream_sync waits for that count to reach the number
 * issued at the time of the call.
 *
 * Events: a record enqueues a marker carrying the event's new generation; when
 * the marker runs, the event's completed generation advances and waiters are
 * woken. A wait enqueues an item that blocks the waiting stream's thread until
 * the event has completed the generation current when the wait was issued.
 * Events are reference-counted, so an event destroyed while a record or wait
 * is pending stays alive until that item has run. An event re-recorded on a
 * different stream completes a generation when any later generation does
 * (completion is a high-water mark); record-then-wait, the pattern zoff uses,
 * is exact.
 *
 * Memory: freeing device memory does not wait for streams (unlike cudaFree,
 * like cudaFreeAsync): synchronise the streams that use a buffer before
 * freeing it; AddressSanitizer reports the use-after-free otherwise.
 *
 * Errors: a kernel that fails makes its stream fail (sticky). The message is
 * kept and re-raised by every later stream_sync on that stream and by
 * event_sync on events recorded after the failure. A failed stream skips
 * later kernels, copies and memsets; host fns, records and waits still run so
 * that nobody waiting on them deadlocks. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_internal.h"
#include "backend/cpu/cpu_kernels.h"

#define CPU_DEVICE_ALIGN 64
#define CPU_PINNED_ALIGN 4096
#define CPU_ERRMSG_LEN 1024

typedef struct cpu_ctx {
    int threads; /* per kernel; 0 = all cores */
    char name[64];
} cpu_ctx;

/* ------------------------------------------------------------------ events */

typedef struct cpu_event {
    atomic_int refs;       /* the user's handle + one per pending record/wait item */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded;     /* generation of the latest record issued (under mu) */
    uint64_t completed;    /* highest generation whose marker has run (under mu) */
    zoff_status err;       /* sticky error of the recording stream when the marker ran */
    char errmsg[CPU_ERRMSG_LEN];
} cpu_event;

static void event_unref(cpu_event *e) {
    if (atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e);
    }
}

/* ------------------------------------------------------------------ streams */

typedef enum item_kind { ITEM_KERNEL, ITEM_MEMCPY, ITEM_MEMSET, ITEM_HOST_FN, ITEM_RECORD, ITEM_WAIT } item_kind;

typedef union item_payload {
    struct { void *dst; const void *src; size_t bytes; } copy;
    struct { void *dst; int value; size_t bytes; } set;
    struct { void (*fn)(void *); void *arg; } host;
    struct { cpu_event *ev; uint64_t gen; } event;
    struct { zoff_op op; } kernel;
} item_payload;

typedef struct work_item {
    struct work_item *next;
    item_kind kind;
    uint64_t seq;
    item_payload u;
    _Alignas(max_align_t) unsigned char args[]; /* kernel args copy */
} work_item;

typedef struct cpu_stream {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* worker: new item or shutdown */
    pthread_cond_t cv_done; /* waiters: `completed` advanced */
    work_item *head, *tail;
    uint64_t issued;        /* items enqueued so far (seq of the last one) */
    uint64_t completed;     /* items finished so far */
    bool shutdown;
    zoff_status err;        /* sticky; written by the worker under mu */
    char errmsg[CPU_ERRMSG_LEN];
    int threads;
    char name[64];
} cpu_stream;

static void run_item(cpu_stream *s, work_item *it, bool failed, zoff_status *err_out, char *msg_out) {
    switch (it->kind) {
    case ITEM_KERNEL: {
        if (failed) return;
        zoff_clear_error();
        zoff_status st = zoff_cpu_run_op(it->u.kernel.op, it->args, s->threads);
        if (st != ZOFF_OK) {
            *err_out = st;
            const char *m = zoff_last_error();
            snprintf(msg_out, CPU_ERRMSG_LEN, "%s failed on stream '%s': %s", zoff_op_name(it->u.kernel.op), s->name,
                     *m ? m : zoff_status_name(st));
        }
        return;
    }
    case ITEM_MEMCPY:
        if (!failed) memcpy(it->u.copy.dst, it->u.copy.src, it->u.copy.bytes);
        return;
    case ITEM_MEMSET:
        if (!failed) memset(it->u.set.dst, it->u.set.value, it->u.set.bytes);
        return;
    case ITEM_HOST_FN:
        it->u.host.fn(it->u.host.arg);
        return;
    case ITEM_RECORD: {
        cpu_event *e = it->u.event.ev;
        /* s->err / errmsg are only written by this thread, so reading them unlocked here is safe. */
        pthread_mutex_lock(&e->mu);
        if (it->u.event.gen > e->completed) {
            e->completed = it->u.event.gen;
            e->err = s->err;
            if (s->err != ZOFF_OK) memcpy(e->errmsg, s->errmsg, CPU_ERRMSG_LEN);
            else e->errmsg[0] = '\0';
        }
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
        event_unref(e);
        return;
    }
    case ITEM_WAIT: {
        cpu_event *e = it->u.event.ev;
        pthread_mutex_lock(&e->mu);
        while (e->completed < it->u.event.gen) pthread_cond_wait(&e->cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
        event_unref(e);
        return;
    }
    }
}

static void *stream_main(void *arg) {
    cpu_stream *s = arg;
    char msg[CPU_ERRMSG_LEN];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->shutdown) pthread_cond_wait(&s->cv_work, &s->mu);
        work_item *it = s->head;
        if (!it) break; /* shutdown with an empty queue: drained */
        s->head = it->next;
        if (!s->head) s->tail = NULL;
        bool failed = s->err != ZOFF_OK;
        pthread_mutex_unlock(&s->mu);

        zoff_status err = ZOFF_OK;
        msg[0] = '\0';
        run_item(s, it, failed, &err, msg);

        pthread_mutex_lock(&s->mu);
        if (err != ZOFF_OK && s->err == ZOFF_OK) {
            s->err = err;
            memcpy(s->errmsg, msg, sizeof msg);
        }
        s->completed = it->seq;
        pthread_cond_broadcast(&s->cv_done);
        free(it);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static zoff_status enqueue(cpu_stream *s, work_item *it) {
    pthread_mutex_lock(&s->mu);
    it->next = NULL;
    it->seq = ++s->issued;
    if (s->tail) s->tail->next = it;
    else s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return ZOFF_OK;
}

static work_item *item_new(item_kind kind, size_t extra, const char *stream_name) {
    work_item *it = calloc(1, sizeof(work_item) + extra);
    if (!it) {
        zoff_error(ZOFF_ERR_NOMEM, "out of host memory queueing work on stream '%s'", stream_name);
        return NULL;
    }
    it->kind = kind;
    return it;
}

/* Queue a new item of `kind` carrying payload u on stream s. */
static zoff_status enqueue_new(cpu_stream *s, item_kind kind, item_payload u) {
    work_item *it = item_new(kind, 0, s->name);
    if (!it) return ZOFF_ERR_NOMEM;
    it->u = u;
    return enqueue(s, it);
}

/* ------------------------------------------------------------------ vtable: device and memory */

static zoff_status cpu_init(zoff_device *dev, const zoff_device_options *opts, void **ctx_out) {
    (void)dev;
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!c) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating the CPU device");
    c->threads = opts->threads;
    int cores = zoff_cpu_features_get()->logical_cores;
    char nt[32];
    snprintf(c->name, sizeof c->name, "cpu (%s)",
             zoff_format_count(c->threads > 0 ? c->threads : cores > 0 ? cores : 1, "kernel thread", nt, sizeof nt));
    *ctx_out = c;
    return ZOFF_OK;
}

static void cpu_fini(void *ctx) { free(ctx); }

static const char *cpu_device_name(void *ctx) { return ((cpu_ctx *)ctx)->name; }

static zoff_status cpu_mem_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    void *p = zoff_aligned_alloc(CPU_DEVICE_ALIGN, bytes, "device memory");
    if (!p) return ZOFF_ERR_DEVICE_OOM; /* message set by zoff_aligned_alloc */
    *out = p;
    return ZOFF_OK;
}

static void cpu_mem_free(void *ctx, void *ptr) {
    (void)ctx;
    zoff_aligned_free(ptr);
}

static zoff_status cpu_pinned_alloc(void *ctx, size_t bytes, void **out) {
    (void)ctx;
    void *p = zoff_aligned_alloc(CPU_PINNED_ALIGN, bytes, "pinned host memory");
    if (!p) return ZOFF_ERR_NOMEM;
    *out = p;
    return ZOFF_OK;
}

static void cpu_pinned_free(void *ctx, void *ptr) {
    (void)ctx;
    zoff_aligned_free(ptr);
}

/* ------------------------------------------------------------------ vtable: streams */

static zoff_status cpu_stream_create(void *ctx, const char *name, void **out) {
    cpu_ctx *c = ctx;
    cpu_stream *s = calloc(1, sizeof *s);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating stream '%s'", name);
    s->threads = c->threads;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    int rc = pthread_create(&s->thread, NULL, stream_main, s);
    if (rc != 0) {
        pthread_cond_destroy(&s->cv_done);
        pthread_cond_destroy(&s->cv_work);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return zoff_error(ZOFF_ERR_DEVICE, "cannot start the thread of stream '%s': %s; too many streams or threads?",
                          name, strerror(rc));
    }
    char tname[16] = "zoff:"; /* the kernel limits thread names to 15 chars */
    size_t n = strlen(s->name), room = sizeof tname - 6;
    memcpy(tname + 5, s->name, n < room ? n : room);
    pthread_setname_np(s->thread, tname); /* best effort, for debuggers */
    *out = s;
    return ZOFF_OK;
}

static void cpu_stream_destroy(void *ctx, void *stream) {
    (void)ctx;
    cpu_stream *s = stream;
    pthread_mutex_lock(&s->mu);
    s->shutdown = true;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* the worker drains the queue before it exits */
    pthread_cond_destroy(&s->cv_done);
    pthread_cond_destroy(&s->cv_work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Block until *completed reaches what *target is now (both guarded by mu, signalled on cv);
 * the sticky error *err, with its message set on this thread, is the result. */
static zoff_status wait_completed(pthread_mutex_t *mu, pthread_cond_t *cv, const uint64_t *completed,
                                  const uint64_t *target, const zoff_status *err, const char *errmsg) {
    pthread_mutex_lock(mu);
    uint64_t t = *target;
    while (*completed < t) pthread_cond_wait(cv, mu);
    zoff_status st = *err;
    if (st != ZOFF_OK) zoff_error(st, "%s", errmsg);
    pthread_mutex_unlock(mu);
    return st;
}

static zoff_status cpu_stream_sync(void *ctx, void *stream) {
    (void)ctx;
    cpu_stream *s = stream;
    return wait_completed(&s->mu, &s->cv_done, &s->completed, &s->issued, &s->err, s->errmsg);
}

/* ------------------------------------------------------------------ vtable: events */

static zoff_status cpu_event_create(void *ctx, void **out) {
    (void)ctx;
    cpu_event *e = calloc(1, sizeof *e);
    if (!e) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating an event");
    atomic_init(&e->refs, 1);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    *out = e;
    return ZOFF_OK;
}

static void cpu_event_destroy(void *ctx, void *event) {
    (void)ctx;
    event_unref(event);
}

static zoff_status cpu_event_record(void *ctx, void *event, void *stream) {
    (void)ctx;
    cpu_event *e = event;
    cpu_stream *s = stream;
    work_item *it = item_new(ITEM_RECORD, 0, s->name);
    if (!it) return ZOFF_ERR_NOMEM;
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    it->u.event.ev = e;
    /* Hold the event's lock while enqueueing so generations reach streams in order. */
    pthread_mutex_lock(&e->mu);
    it->u.event.gen = ++e->recorded;
    zoff_status st = enqueue(s, it);
    pthread_mutex_unlock(&e->mu);
    return st;
}

static zoff_status cpu_stream_wait_event(void *ctx, void *stream, void *event) {
    (void)ctx;
    cpu_event *e = event;
    cpu_stream *s = stream;
    pthread_mutex_lock(&e->mu);
    uint64_t gen = e->recorded;
    pthread_mutex_unlock(&e->mu);
    if (gen == 0) return ZOFF_OK; /* never recorded: nothing to wait for (as in CUDA) */
    work_item *it = item_new(ITEM_WAIT, 0, s->name);
    if (!it) return ZOFF_ERR_NOMEM;
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    it->u.event.ev = e;
    it->u.event.gen = gen;
    return enqueue(s, it);
}

static zoff_status cpu_event_sync(void *ctx, void *event) {
    (void)ctx;
    cpu_event *e = event;
    return wait_completed(&e->mu, &e->cv, &e->completed, &e->recorded, &e->err, e->errmsg);
}

static bool cpu_event_query(void *ctx, void *event) {
    (void)ctx;
    cpu_event *e = event;
    pthread_mutex_lock(&e->mu);
    bool done = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return done;
}

/* ------------------------------------------------------------------ vtable: work */

static zoff_status cpu_memcpy_async(void *ctx, void *stream, void *dst, const void *src, size_t bytes, zoff_copy_kind kind) {
    (void)ctx;
    (void)kind; /* all memory is host memory */
    return enqueue_new(stream, ITEM_MEMCPY, (item_payload){.copy = {dst, src, bytes}});
}

static zoff_status cpu_memset_async(void *ctx, void *stream, void *dst, int value, size_t bytes) {
    (void)ctx;
    return enqueue_new(stream, ITEM_MEMSET, (item_payload){.set = {dst, value, bytes}});
}

static zoff_status cpu_host_fn(void *ctx, void *stream, void (*fn)(void *), void *arg) {
    (void)ctx;
    return enqueue_new(stream, ITEM_HOST_FN, (item_payload){.host = {fn, arg}});
}

static zoff_status cpu_launch(void *ctx, void *stream, zoff_op op, const void *args) {
    (void)ctx;
    cpu_stream *s = stream;
    size_t n = zoff_op_args_size(op);
    if (n == 0) return zoff_error(ZOFF_ERR_INTERNAL, "cpu backend: launch of unknown op %d", (int)op);
    work_item *it = item_new(ITEM_KERNEL, n, s->name);
    if (!it) return ZOFF_ERR_NOMEM;
    it->u.kernel.op = op;
    memcpy(it->args, args, n);
    return enqueue(s, it);
}

const zoff_backend_vtable zoff_cpu_backend_vtable = {
    .name = "cpu",
    ZOFF_BACKEND_ENTRIES(cpu),
};
