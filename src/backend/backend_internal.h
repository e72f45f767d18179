/* Private to src/backend: the common layer's handles and the backend registry.
 *
 * src/backend/device.c implements include/zoff/device.h on top of a
 * zoff_backend_vtable. The public handles (zoff_device, zoff_stream,
 * zoff_event) are common-layer structs that wrap a backend's opaque objects
 * (`impl`): a backend never sees a zoff_stream, only its own stream object.
 *
 * What the common layer does for every backend (so a backend must not):
 *   - budget and pointer->size accounting of device and pinned memory;
 *   - argument validation of every call, including zoff_launch's per-op checks
 *     (op code, args_size, required pointers, non-negative sizes, dtypes);
 *   - the default compute stream, and destroying whatever the user left alive
 *     at zoff_device_destroy (streams drained first, then events, then memory).
 *
 * What a backend must do (contract for src/backend/cpu and src/backend/cuda):
 *   - launch(ctx, stream, op, args): `args` points to the op's struct and is
 *     only valid during the call: copy it if the work runs later;
 *     zoff_op_args_size(op) gives its size;
 *   - stream_sync / event_sync return the stream's sticky error with its
 *     message set (zoff_error) on the calling thread;
 *   - event_destroy may be called while a record or wait of the event is still
 *     pending on a stream: the pending work must still complete safely;
 *   - mem_alloc / pinned_alloc set a message on failure; a backend reports its
 *     own out-of-memory as ZOFF_ERR_DEVICE_OOM and the common layer adds the
 *     allocation's name, size and the accounting to the message. */
#ifndef ZOFF_BACKEND_INTERNAL_H
#define ZOFF_BACKEND_INTERNAL_H

#include <pthread.h>

#include "zoff/device.h"

/* ---- backend vtable (implemented by src/backend/cpu and src/backend/cuda) ----
 * Private to src/backend. The common layer (device.c) does budget accounting,
 * validation and error messages; a backend only does the work. */
typedef struct zoff_backend_vtable {
    const char *name;
    zoff_status (*init)(zoff_device *dev, const zoff_device_options *opts, void **ctx_out);
    void (*fini)(void *ctx);
    zoff_status (*mem_alloc)(void *ctx, size_t bytes, void **out);
    void (*mem_free)(void *ctx, void *ptr);
    zoff_status (*pinned_alloc)(void *ctx, size_t bytes, void **out);
    void (*pinned_free)(void *ctx, void *ptr);
    zoff_status (*stream_create)(void *ctx, const char *name, void **out);
    void (*stream_destroy)(void *ctx, void *stream);
    zoff_status (*stream_sync)(void *ctx, void *stream);
    zoff_status (*event_create)(void *ctx, void **out);
    void (*event_destroy)(void *ctx, void *event);
    zoff_status (*event_record)(void *ctx, void *event, void *stream);
    zoff_status (*stream_wait_event)(void *ctx, void *stream, void *event);
    zoff_status (*event_sync)(void *ctx, void *event);
    bool (*event_query)(void *ctx, void *event);
    zoff_status (*memcpy_async)(void *ctx, void *stream, void *dst, const void *src, size_t bytes, zoff_copy_kind kind);
    zoff_status (*memset_async)(void *ctx, void *stream, void *dst, int value, size_t bytes);
    zoff_status (*host_fn)(void *ctx, void *stream, void (*fn)(void *), void *arg);
    zoff_status (*launch)(void *ctx, void *stream, zoff_op op, const void *args);
    const char *(*device_name)(void *ctx);
    /* Optional (NULL: every op the common layer accepts). args, already validated by the
     * common layer, may be NULL (the op in general); false sets the reason (zoff_error). */
    bool (*supports_op)(void *ctx, zoff_op op, const void *args);
    /* Optional (NULL: none): the backend's native handle of a stream (cudaStream_t). */
    void *(*stream_native)(void *ctx, void *stream);
    /* Optional, all four or none (NULL: the op profiler takes host time stamps from host fns,
     * exact where a stream is a host thread, as on the CPU backend): timing marks on a stream
     * for the op profiler (profile.c). timer_elapsed: milliseconds from t0 to t1, both
     * recorded and reached by their streams (not yet reached: an error), may be negative. */
    zoff_status (*timer_create)(void *ctx, void **out);
    void (*timer_destroy)(void *ctx, void *timer);
    zoff_status (*timer_record)(void *ctx, void *timer, void *stream);
    zoff_status (*timer_elapsed)(void *ctx, void *t0, void *t1, double *ms);
} zoff_backend_vtable;

/* Pointer -> size map (open addressing, linear probing); guarded by the device mutex. */
typedef struct zoff_ptr_map {
    uintptr_t *keys; /* 0 = empty slot */
    size_t *sizes;
    size_t cap;      /* power of two, or 0 before the first insert */
    size_t count;
} zoff_ptr_map;

struct zoff_stream {
    zoff_device *dev;
    void *impl;              /* the backend's stream */
    char name[64];
    bool is_default;         /* the device's compute stream: destroyed with the device only */
    zoff_stream *prev, *next; /* device's list of live streams (under dev->mu) */
};

struct zoff_event {
    zoff_device *dev;
    void *impl;              /* the backend's event */
    zoff_event *prev, *next; /* device's list of live events (under dev->mu) */
};

struct zoff_device {
    const zoff_backend_vtable *vt;
    void *ctx;               /* the backend's context (from vt->init) */
    zoff_device_options opts;
    pthread_mutex_t mu;      /* guards the maps, the counters and the lists below */
    zoff_ptr_map device_allocs, pinned_allocs;
    size_t device_in_use, device_peak, pinned_in_use, pinned_peak;
    zoff_stream *default_stream;
    zoff_stream *streams;    /* user-created streams, not the default one */
    zoff_event *events;
    struct zoff_profiler *prof; /* the op profiler while on (profile.c); atomic loads and stores */
};

/* The vtable entries of a backend whose functions are named <prefix>_<entry> (cpu_init,
 * cuda_launch, ...): every backend registers itself with
 *   const zoff_backend_vtable zoff_X_backend_vtable = {.name = "X", ZOFF_BACKEND_ENTRIES(X), ...};
 * (optional entries such as supports_op and stream_native are added by name). */
#define ZOFF_BACKEND_ENTRIES(p)                                                                              \
    .init = p##_init, .fini = p##_fini, .mem_alloc = p##_mem_alloc, .mem_free = p##_mem_free,               \
    .pinned_alloc = p##_pinned_alloc, .pinned_free = p##_pinned_free, .stream_create = p##_stream_create,   \
    .stream_destroy = p##_stream_destroy, .stream_sync = p##_stream_sync, .event_create = p##_event_create, \
    .event_destroy = p##_event_destroy, .event_record = p##_event_record,                                    \
    .stream_wait_event = p##_stream_wait_event, .event_sync = p##_event_sync, .event_query = p##_event_query, \
    .memcpy_async = p##_memcpy_async, .memset_async = p##_memset_async, .host_fn = p##_host_fn,              \
    .launch = p##_launch, .device_name = p##_device_name

/* ---- the op profiler's hooks (profile.c) in device.c's launch, copy and memset paths ----
 * zoff_prof_on: one atomic load. zoff_prof_begin issues the start mark of one operation on s
 * (*out NULL when the profiler is off or its window is full); zoff_prof_end issues the end
 * mark and returns st (the operation's own status) unless the mark fails. */
typedef struct zoff_prof_rec zoff_prof_rec;
static inline bool zoff_prof_on(zoff_device *dev) { return __atomic_load_n(&dev->prof, __ATOMIC_ACQUIRE) != NULL; }
zoff_status zoff_prof_begin(zoff_stream *s, zoff_op_class cls, double flops, zoff_prof_rec **out);
zoff_status zoff_prof_end(zoff_stream *s, zoff_prof_rec *r, zoff_status st);

/* sizeof the op's args struct (0 for an op code out of range). */
size_t zoff_op_args_size(zoff_op op);

/* ---- backend registry ---- */
extern const zoff_backend_vtable zoff_cpu_backend_vtable;
#ifdef ZOFF_HAVE_CUDA
extern const zoff_backend_vtable zoff_cuda_backend_vtable;
/* Implemented by src/backend/cuda: is a usable CUDA device present (cudaGetDeviceCount > 0)?
 * Must not abort or print when the driver is missing. */
bool zoff_cuda_backend_available(void);
#endif

#endif
