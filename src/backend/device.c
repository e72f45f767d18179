/* The device layer's common code: include/zoff/device.h on top of a
 * zoff_backend_vtable. Accounting, validation and error messages live here;
 * the backends (cpu/, cuda/) only do the work. See backend_internal.h. */
#include "backend/backend_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ names */

static const char *const g_op_names[ZOFF_OP_COUNT] = {
    [ZOFF_OP_EMBED_FWD] = "embed_fwd",
    [ZOFF_OP_EMBED_BWD] = "embed_bwd",
    [ZOFF_OP_LAYERNORM_FWD] = "layernorm_fwd",
    [ZOFF_OP_LAYERNORM_BWD] = "layernorm_bwd",
    [ZOFF_OP_MATMUL_FWD] = "matmul_fwd",
    [ZOFF_OP_MATMUL_BWD] = "matmul_bwd",
    [ZOFF_OP_ATTENTION_FWD] = "attention_fwd",
    [ZOFF_OP_ATTENTION_BWD] = "attention_bwd",
    [ZOFF_OP_GELU_FWD] = "gelu_fwd",
    [ZOFF_OP_GELU_BWD] = "gelu_bwd",
    [ZOFF_OP_ADD] = "add",
    [ZOFF_OP_CROSS_ENTROPY] = "cross_entropy",
    [ZOFF_OP_CAST] = "cast",
    [ZOFF_OP_SCALE] = "scale",
    [ZOFF_OP_GRAD_STATS] = "grad_stats",
    [ZOFF_OP_ADAM] = "adam",
    [ZOFF_OP_RESIDUAL_LAYERNORM_FWD] = "residual_layernorm_fwd",
    [ZOFF_OP_RESIDUAL_LAYERNORM_BWD] = "residual_layernorm_bwd",
};

static const size_t g_op_args_size[ZOFF_OP_COUNT] = {
    [ZOFF_OP_EMBED_FWD] = sizeof(zoff_op_embed_fwd_args),
    [ZOFF_OP_EMBED_BWD] = sizeof(zoff_op_embed_bwd_args),
    [ZOFF_OP_LAYERNORM_FWD] = sizeof(zoff_op_layernorm_fwd_args),
    [ZOFF_OP_LAYERNORM_BWD] = sizeof(zoff_op_layernorm_bwd_args),
    [ZOFF_OP_MATMUL_FWD] = sizeof(zoff_op_matmul_fwd_args),
    [ZOFF_OP_MATMUL_BWD] = sizeof(zoff_op_matmul_bwd_args),
    [ZOFF_OP_ATTENTION_FWD] = sizeof(zoff_op_attention_fwd_args),
    [ZOFF_OP_ATTENTION_BWD] = sizeof(zoff_op_attention_bwd_args),
    [ZOFF_OP_GELU_FWD] = sizeof(zoff_op_gelu_fwd_args),
    [ZOFF_OP_GELU_BWD] = sizeof(zoff_op_gelu_bwd_args),
    [ZOFF_OP_ADD] = sizeof(zoff_op_add_args),
    [ZOFF_OP_CROSS_ENTROPY] = sizeof(zoff_op_cross_entropy_args),
    [ZOFF_OP_CAST] = sizeof(zoff_op_cast_args),
    [ZOFF_OP_SCALE] = sizeof(zoff_op_scale_args),
    [ZOFF_OP_GRAD_STATS] = sizeof(zoff_op_grad_stats_args),
    [ZOFF_OP_ADAM] = sizeof(zoff_op_adam_args),
    [ZOFF_OP_RESIDUAL_LAYERNORM_FWD] = sizeof(zoff_op_residual_layernorm_fwd_args),
    [ZOFF_OP_RESIDUAL_LAYERNORM_BWD] = sizeof(zoff_op_residual_layernorm_bwd_args),
};

const char *zoff_op_name(zoff_op op) {
    if ((int)op < 0 || op >= ZOFF_OP_COUNT) return "invalid-op";
    return g_op_names[op];
}

size_t zoff_op_args_size(zoff_op op) {
    if ((int)op < 0 || op >= ZOFF_OP_COUNT) return 0;
    return g_op_args_size[op];
}

/* ------------------------------------------------------------------ pointer map */

static size_t ptr_hash(uintptr_t k, size_t mask) {
    uint64_t x = (uint64_t)k;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x & mask;
}

static zoff_status ptr_map_grow(zoff_ptr_map *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    uintptr_t *nk = calloc(ncap, sizeof *nk);
    size_t *ns = calloc(ncap, sizeof *ns);
    if (!nk || !ns) {
        free(nk);
        free(ns);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory growing the device allocation table to %zu entries", ncap);
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        size_t j = ptr_hash(m->keys[i], ncap - 1);
        while (nk[j]) j = (j + 1) & (ncap - 1);
        nk[j] = m->keys[i];
        ns[j] = m->sizes[i];
    }
    free(m->keys);
    free(m->sizes);
    m->keys = nk;
    m->sizes = ns;
    m->cap = ncap;
    return ZOFF_OK;
}

static zoff_status ptr_map_insert(zoff_ptr_map *m, void *p, size_t size) {
    if ((m->count + 1) * 4 > m->cap * 3) ZOFF_TRY(ptr_map_grow(m));
    uintptr_t k = (uintptr_t)p;
    size_t mask = m->cap - 1, i = ptr_hash(k, mask);
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & mask;
    if (!m->keys[i]) m->count++;
    m->keys[i] = k;
    m->sizes[i] = size;
    return ZOFF_OK;
}

/* Removes p; returns true and its size when it was there. */
static bool ptr_map_remove(zoff_ptr_map *m, void *p, size_t *size) {
    if (!m->cap) return false;
    uintptr_t k = (uintptr_t)p;
    size_t mask = m->cap - 1, i = ptr_hash(k, mask);
    while (m->keys[i] != k) {
        if (!m->keys[i]) return false;
        i = (i + 1) & mask;
    }
    *size = m->sizes[i];
    /* backward-shift deletion: no tombstones */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!m->keys[j]) break;
        size_t h = ptr_hash(m->keys[j], mask);
        bool movable = (j > i) ? (h <= i || h > j) : (h <= i && h > j);
        if (movable) {
            m->keys[i] = m->keys[j];
            m->sizes[i] = m->sizes[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->sizes[i] = 0;
    m->count--;
    return true;
}

static void ptr_map_free(zoff_ptr_map *m) {
    free(m->keys);
    free(m->sizes);
    memset(m, 0, sizeof *m);
}

/* ------------------------------------------------------------------ devices */

static const zoff_backend_vtable *backend_vtable(zoff_backend_kind kind) {
    switch (kind) {
    case ZOFF_BACKEND_CPU: return &zoff_cpu_backend_vtable;
    case ZOFF_BACKEND_CUDA:
#ifdef ZOFF_HAVE_CUDA
        return &zoff_cuda_backend_vtable;
#else
        return NULL;
#endif
    }
    return NULL;
}

bool zoff_backend_available(zoff_backend_kind kind) {
    switch (kind) {
    case ZOFF_BACKEND_CPU: return true;
    case ZOFF_BACKEND_CUDA:
#ifdef ZOFF_HAVE_CUDA
        return zoff_cuda_backend_available();
#else
        return false;
#endif
    }
    return false;
}

/* The device's doubly linked lists of live streams and of live events (under dev->mu). */
#define LIVE_LIST(T, name)                                  \
    static void name##_list_add(T **head, T *x) {           \
        x->prev = NULL;                                     \
        x->next = *head;                                    \
        if (*head) (*head)->prev = x;                       \
        *head = x;                                          \
    }                                                       \
    static void name##_list_remove(T **head, T *x) {        \
        if (x->prev) x->prev->next = x->next;               \
        else *head = x->next;                               \
        if (x->next) x->next->prev = x->prev;               \
        x->prev = x->next = NULL;                           \
    }
LIVE_LIST(zoff_stream, stream)
LIVE_LIST(zoff_event, event)
#undef LIVE_LIST

static zoff_status stream_new(zoff_device *dev, const char *name, bool is_default, zoff_stream **out) {
    zoff_stream *s = calloc(1, sizeof *s);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating stream '%s'", name);
    s->dev = dev;
    s->is_default = is_default;
    snprintf(s->name, sizeof s->name, "%s", name);
    zoff_status st = dev->vt->stream_create(dev->ctx, s->name, &s->impl);
    if (st != ZOFF_OK) {
        free(s);
        return zoff_error_context(st, "creating stream '%s' on %s", name, zoff_device_name(dev));
    }
    *out = s;
    return ZOFF_OK;
}

zoff_status zoff_device_create(const zoff_device_options *opts, zoff_device **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_device_create: out is NULL");
    *out = NULL;
    zoff_device_options o = {0};
    if (opts) o = *opts;
    if (o.kind != ZOFF_BACKEND_CPU && o.kind != ZOFF_BACKEND_CUDA)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_device_create: unknown backend kind %d; use ZOFF_BACKEND_CPU or ZOFF_BACKEND_CUDA",
                          (int)o.kind);
    if (o.threads < 0)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_device_create: threads is %d; use 0 (all cores) or a positive count", o.threads);
    if (o.ordinal < 0)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_device_create: GPU ordinal is %d; use 0 or more", o.ordinal);
    const zoff_backend_vtable *vt = backend_vtable(o.kind);
    if (!vt)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "the CUDA backend is not compiled into this build of zoff; rebuild on a machine with nvcc "
                          "(cmake -DZOFF_CUDA=ON) or use the CPU backend");

    zoff_device *dev = calloc(1, sizeof *dev);
    if (!dev) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating a %s device", vt->name);
    dev->vt = vt;
    dev->opts = o;
    if (pthread_mutex_init(&dev->mu, NULL) != 0) {
        free(dev);
        return zoff_error(ZOFF_ERR_INTERNAL, "pthread_mutex_init failed creating a %s device", vt->name);
    }
    zoff_status st = vt->init(dev, &o, &dev->ctx);
    if (st != ZOFF_OK) {
        pthread_mutex_destroy(&dev->mu);
        free(dev);
        return zoff_error_context(st, "creating the %s device", vt->name);
    }
    st = stream_new(dev, "compute", true, &dev->default_stream);
    if (st != ZOFF_OK) {
        vt->fini(dev->ctx);
        pthread_mutex_destroy(&dev->mu);
        free(dev);
        return st;
    }
    *out = dev;
    return ZOFF_OK;
}

static void free_leftover_allocs(zoff_device *dev, zoff_ptr_map *m, bool pinned) {
    if (!m->count) return;
    size_t bytes = 0, n = 0;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i]) continue;
        bytes += m->sizes[i];
        n++;
        if (pinned) dev->vt->pinned_free(dev->ctx, (void *)m->keys[i]);
        else dev->vt->mem_free(dev->ctx, (void *)m->keys[i]);
    }
    char b[32];
    zoff_log(ZOFF_LOG_WARN, "%s destroyed with %zu %s allocation%s (%s) still live; freed them",
             dev->vt->name, n, pinned ? "pinned host" : "device", n == 1 ? "" : "s", zoff_format_bytes(bytes, b, sizeof b));
}

void zoff_device_destroy(zoff_device *dev) {
    if (!dev) return;
    zoff_profile_stop(dev); /* its marks live on the streams */
    /* Streams first (each drains its work, which may still touch memory and events). */
    size_t nstreams = 0, nevents = 0;
    while (dev->streams) {
        zoff_stream *s = dev->streams;
        stream_list_remove(&dev->streams, s);
        dev->vt->stream_destroy(dev->ctx, s->impl);
        free(s);
        nstreams++;
    }
    if (dev->default_stream) {
        dev->vt->stream_destroy(dev->ctx, dev->default_stream->impl);
        free(dev->default_stream);
        dev->default_stream = NULL;
    }
    while (dev->events) {
        zoff_event *e = dev->events;
        event_list_remove(&dev->events, e);
        dev->vt->event_destroy(dev->ctx, e->impl);
        free(e);
        nevents++;
    }
    if (nstreams || nevents)
        zoff_log(ZOFF_LOG_WARN, "%s destroyed with %zu stream%s and %zu event%s still alive; destroyed them",
                 dev->vt->name, nstreams, nstreams == 1 ? "" : "s", nevents, nevents == 1 ? "" : "s");
    free_leftover_allocs(dev, &dev->device_allocs, false);
    free_leftover_allocs(dev, &dev->pinned_allocs, true);
    ptr_map_free(&dev->device_allocs);
    ptr_map_free(&dev->pinned_allocs);
    dev->vt->fini(dev->ctx);
    pthread_mutex_destroy(&dev->mu);
    free(dev);
}

const char *zoff_device_name(const zoff_device *dev) {
    if (!dev) return "(no device)";
    if (dev->vt->device_name) return dev->vt->device_name(dev->ctx);
    return dev->vt->name;
}

zoff_backend_kind zoff_device_kind(const zoff_device *dev) { return dev->opts.kind; }

/* ------------------------------------------------------------------ memory */

/* One kind of accounted memory (device or pinned): its map, counters and the backend's calls. */
typedef struct mem_kind {
    zoff_ptr_map *map;
    size_t *in_use, *peak;
    zoff_status (*alloc)(void *ctx, size_t bytes, void **out);
    void (*release)(void *ctx, void *ptr);
    const char *fn, *what; /* for the message about a bad free */
} mem_kind;

static mem_kind device_mem(zoff_device *dev) {
    return (mem_kind){&dev->device_allocs, &dev->device_in_use, &dev->device_peak, dev->vt->mem_alloc,
                      dev->vt->mem_free, "zoff_device_free", "device"};
}
static mem_kind pinned_mem(zoff_device *dev) {
    return (mem_kind){&dev->pinned_allocs, &dev->pinned_in_use, &dev->pinned_peak, dev->vt->pinned_alloc,
                      dev->vt->pinned_free, "zoff_host_free_pinned", "pinned"};
}

/* Under dev->mu: the backend's allocation, recorded in the map and counted. */
static zoff_status accounted_alloc(zoff_device *dev, mem_kind k, size_t bytes, void **out) {
    void *p = NULL;
    zoff_status st = k.alloc(dev->ctx, bytes, &p);
    if (st == ZOFF_OK && p) {
        st = ptr_map_insert(k.map, p, bytes);
        if (st != ZOFF_OK) k.release(dev->ctx, p);
    }
    if (st != ZOFF_OK) return st;
    if (p) {
        *k.in_use += bytes;
        if (*k.in_use > *k.peak) *k.peak = *k.in_use;
    }
    *out = p;
    return ZOFF_OK;
}

static void accounted_free(zoff_device *dev, mem_kind k, void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&dev->mu);
    size_t size = 0;
    bool known = ptr_map_remove(k.map, ptr, &size);
    if (known) {
        *k.in_use -= size;
        k.release(dev->ctx, ptr);
    }
    pthread_mutex_unlock(&dev->mu);
    if (!known)
        zoff_log(ZOFF_LOG_ERROR, "%s: %p is not a live %s allocation of %s (double free, or a pointer from another "
                 "allocator); ignored", k.fn, ptr, k.what, dev->vt->name);
}

/* What a user can do when the device is full (both out-of-memory errors). */
#define DEVICE_OOM_WAYS                                                                                                \
    "lower the batch size, give --checkpoint-activations, or move more to the host (offload_optimizer, a lower "    \
    "offload_optimizer.ratio, stage 3 with offload_param; zoff plan with the same flags and config says what "       \
    "fits where)"

zoff_status zoff_device_alloc(zoff_device *dev, size_t bytes, const char *what, void **out) {
    if (!what) what = "device buffer";
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_device_alloc(%s): out is NULL", what);
    *out = NULL;
    if (!dev) return zoff_error(ZOFF_ERR_INVALID, "zoff_device_alloc(%s): device is NULL", what);
    char b1[32], b2[32], b3[32];
    pthread_mutex_lock(&dev->mu);
    size_t budget = dev->opts.memory_budget;
    if (budget && (bytes > budget || dev->device_in_use > budget - bytes)) {
        zoff_status st = zoff_error(
            ZOFF_ERR_DEVICE_OOM,
            "device out of memory allocating %s (%s): %s of %s budget in use; " DEVICE_OOM_WAYS
            ", or raise --device-memory",
            what, zoff_format_bytes(bytes, b1, sizeof b1), zoff_format_bytes(dev->device_in_use, b2, sizeof b2),
            zoff_format_bytes(budget, b3, sizeof b3));
        pthread_mutex_unlock(&dev->mu);
        return st;
    }
    zoff_status st = accounted_alloc(dev, device_mem(dev), bytes, out);
    size_t in_use = dev->device_in_use;
    pthread_mutex_unlock(&dev->mu);
    if (st == ZOFF_ERR_DEVICE_OOM)
        return zoff_error_context(st,
                                  "device out of memory allocating %s (%s) with %s in use; " DEVICE_OOM_WAYS,
                                  what, zoff_format_bytes(bytes, b1, sizeof b1), zoff_format_bytes(in_use, b2, sizeof b2));
    if (st != ZOFF_OK)
        return zoff_error_context(st, "allocating %s (%s) on %s", what, zoff_format_bytes(bytes, b1, sizeof b1),
                                  dev->vt->name);
    return ZOFF_OK;
}

void zoff_device_free(zoff_device *dev, void *ptr) {
    if (dev) accounted_free(dev, device_mem(dev), ptr);
}

zoff_status zoff_host_alloc_pinned(zoff_device *dev, size_t bytes, const char *what, void **out) {
    if (!what) what = "pinned buffer";
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_host_alloc_pinned(%s): out is NULL", what);
    *out = NULL;
    if (!dev) return zoff_error(ZOFF_ERR_INVALID, "zoff_host_alloc_pinned(%s): device is NULL", what);
    char b1[32], b2[32];
    pthread_mutex_lock(&dev->mu);
    zoff_status st = accounted_alloc(dev, pinned_mem(dev), bytes, out);
    size_t in_use = dev->pinned_in_use;
    pthread_mutex_unlock(&dev->mu);
    if (st != ZOFF_OK)
        return zoff_error_context(st, "allocating pinned host memory for %s (%s) with %s pinned already; reduce the "
                                  "offload buffer sizes or free host memory",
                                  what, zoff_format_bytes(bytes, b1, sizeof b1), zoff_format_bytes(in_use, b2, sizeof b2));
    return ZOFF_OK;
}

void zoff_host_free_pinned(zoff_device *dev, void *ptr) {
    if (dev) accounted_free(dev, pinned_mem(dev), ptr);
}

void zoff_device_memory_stats(const zoff_device *dev, zoff_memory_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!dev) return;
    zoff_device *d = (zoff_device *)dev; /* the mutex is not part of the logical state */
    pthread_mutex_lock(&d->mu);
    out->device_in_use = d->device_in_use;
    out->device_peak = d->device_peak;
    out->device_budget = d->opts.memory_budget;
    out->pinned_in_use = d->pinned_in_use;
    out->pinned_peak = d->pinned_peak;
    pthread_mutex_unlock(&d->mu);
}

/* ------------------------------------------------------------------ streams and events */

zoff_status zoff_stream_create(zoff_device *dev, const char *name, zoff_stream **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_create: out is NULL");
    *out = NULL;
    if (!dev) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_create: device is NULL");
    zoff_stream *s = NULL;
    ZOFF_TRY(stream_new(dev, name && *name ? name : "stream", false, &s));
    pthread_mutex_lock(&dev->mu);
    stream_list_add(&dev->streams, s);
    pthread_mutex_unlock(&dev->mu);
    *out = s;
    return ZOFF_OK;
}

void zoff_stream_destroy(zoff_stream *s) {
    if (!s) return;
    if (s->is_default) {
        zoff_log(ZOFF_LOG_ERROR, "zoff_stream_destroy: '%s' is the device's compute stream, owned by the device; ignored",
                 s->name);
        return;
    }
    zoff_device *dev = s->dev;
    pthread_mutex_lock(&dev->mu);
    stream_list_remove(&dev->streams, s);
    pthread_mutex_unlock(&dev->mu);
    dev->vt->stream_destroy(dev->ctx, s->impl);
    free(s);
}

zoff_stream *zoff_device_stream(zoff_device *dev) { return dev ? dev->default_stream : NULL; }

zoff_status zoff_stream_synchronize(zoff_stream *s) {
    if (!s) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_synchronize: stream is NULL");
    return s->dev->vt->stream_sync(s->dev->ctx, s->impl);
}

zoff_status zoff_event_create(zoff_device *dev, zoff_event **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_event_create: out is NULL");
    *out = NULL;
    if (!dev) return zoff_error(ZOFF_ERR_INVALID, "zoff_event_create: device is NULL");
    zoff_event *e = calloc(1, sizeof *e);
    if (!e) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating an event");
    e->dev = dev;
    zoff_status st = dev->vt->event_create(dev->ctx, &e->impl);
    if (st != ZOFF_OK) {
        free(e);
        return zoff_error_context(st, "creating an event on %s", zoff_device_name(dev));
    }
    pthread_mutex_lock(&dev->mu);
    event_list_add(&dev->events, e);
    pthread_mutex_unlock(&dev->mu);
    *out = e;
    return ZOFF_OK;
}

void zoff_event_destroy(zoff_event *e) {
    if (!e) return;
    zoff_device *dev = e->dev;
    pthread_mutex_lock(&dev->mu);
    event_list_remove(&dev->events, e);
    pthread_mutex_unlock(&dev->mu);
    dev->vt->event_destroy(dev->ctx, e->impl);
    free(e);
}

zoff_status zoff_event_record(zoff_event *e, zoff_stream *s) {
    if (!e || !s) return zoff_error(ZOFF_ERR_INVALID, "zoff_event_record: %s is NULL", !e ? "event" : "stream");
    if (e->dev != s->dev)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_event_record: event and stream '%s' belong to different devices", s->name);
    return s->dev->vt->event_record(s->dev->ctx, e->impl, s->impl);
}

zoff_status zoff_stream_wait_event(zoff_stream *s, zoff_event *e) {
    if (!e || !s) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_wait_event: %s is NULL", !e ? "event" : "stream");
    if (e->dev != s->dev)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_wait_event: event and stream '%s' belong to different devices",
                          s->name);
    return s->dev->vt->stream_wait_event(s->dev->ctx, s->impl, e->impl);
}

zoff_status zoff_event_synchronize(zoff_event *e) {
    if (!e) return zoff_error(ZOFF_ERR_INVALID, "zoff_event_synchronize: event is NULL");
    return e->dev->vt->event_sync(e->dev->ctx, e->impl);
}

bool zoff_event_query(zoff_event *e) {
    if (!e) return true;
    return e->dev->vt->event_query(e->dev->ctx, e->impl);
}

/* ------------------------------------------------------------------ copies */

static const char *copy_kind_name(zoff_copy_kind k) {
    switch (k) {
    case ZOFF_COPY_H2D: return "H2D";
    case ZOFF_COPY_D2H: return "D2H";
    case ZOFF_COPY_D2D: return "D2D";
    case ZOFF_COPY_H2H: return "H2H";
    }
    return "invalid";
}

zoff_status zoff_memcpy_async(zoff_stream *s, void *dst, const void *src, size_t bytes, zoff_copy_kind kind) {
    if (!s) return zoff_error(ZOFF_ERR_INVALID, "zoff_memcpy_async: stream is NULL");
    if (kind != ZOFF_COPY_H2D && kind != ZOFF_COPY_D2H && kind != ZOFF_COPY_D2D && kind != ZOFF_COPY_H2H)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_memcpy_async on stream '%s': unknown copy kind %d", s->name, (int)kind);
    if (bytes == 0) return ZOFF_OK;
    if (!dst || !src)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_memcpy_async(%s, %zu bytes) on stream '%s': %s pointer is NULL",
                          copy_kind_name(kind), bytes, s->name, !dst ? "destination" : "source");
    zoff_prof_rec *pr = NULL;
    if (zoff_prof_on(s->dev)) {
        static const zoff_op_class cls[] = {[ZOFF_COPY_H2D] = ZOFF_CLASS_COPY_H2D, [ZOFF_COPY_D2H] = ZOFF_CLASS_COPY_D2H,
                                            [ZOFF_COPY_D2D] = ZOFF_CLASS_COPY_D2D, [ZOFF_COPY_H2H] = ZOFF_CLASS_COPY_D2D};
        ZOFF_TRY(zoff_prof_begin(s, cls[kind], 0.0, &pr));
    }
    zoff_status st = s->dev->vt->memcpy_async(s->dev->ctx, s->impl, dst, src, bytes, kind);
    return pr ? zoff_prof_end(s, pr, st) : st;
}

zoff_status zoff_memset_async(zoff_stream *s, void *dst, int value, size_t bytes) {
    if (!s) return zoff_error(ZOFF_ERR_INVALID, "zoff_memset_async: stream is NULL");
    if (bytes == 0) return ZOFF_OK;
    if (!dst)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_memset_async(%zu bytes) on stream '%s': destination is NULL", bytes,
                          s->name);
    zoff_prof_rec *pr = NULL;
    if (zoff_prof_on(s->dev)) ZOFF_TRY(zoff_prof_begin(s, ZOFF_CLASS_MEMSET, 0.0, &pr));
    zoff_status st = s->dev->vt->memset_async(s->dev->ctx, s->impl, dst, value, bytes);
    return pr ? zoff_prof_end(s, pr, st) : st;
}

zoff_status zoff_stream_host_fn(zoff_stream *s, void (*fn)(void *arg), void *arg) {
    if (!s) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_host_fn: stream is NULL");
    if (!fn) return zoff_error(ZOFF_ERR_INVALID, "zoff_stream_host_fn on stream '%s': fn is NULL", s->name);
    return s->dev->vt->host_fn(s->dev->ctx, s->impl, fn, arg);
}

/* ------------------------------------------------------------------ kernels: validation */

typedef struct launch_check {
    zoff_op op;
    const char *stream;
} launch_check;

static zoff_status need_ptr(const launch_check *c, const void *p, const char *field) {
    if (p) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': required pointer '%s' is NULL; pass a device buffer",
                      zoff_op_name(c->op), c->stream, field);
}

static zoff_status need_dim(const launch_check *c, int64_t v, const char *field) {
    if (v >= 0) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': %s is %" PRId64 "; sizes must be >= 0",
                      zoff_op_name(c->op), c->stream, field, v);
}

/* a*b*c must fit in int64 (element counts of the op's tensors). */
static zoff_status need_product(const launch_check *c, int64_t a, int64_t b, int64_t d, const char *what) {
    int64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, d, &r))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': %s = %" PRId64 "*%" PRId64 "*%" PRId64
                          " overflows int64; the shapes are corrupt",
                          zoff_op_name(c->op), c->stream, what, a, b, d);
    return ZOFF_OK;
}

/* Floating storage dtypes for activations, parameters and gradients. */
static zoff_status need_float_dt(const launch_check *c, zoff_dtype dt, const char *field) {
    if (dt == ZOFF_F32 || dt == ZOFF_BF16 || dt == ZOFF_F16) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': %s is %s (%d); use ZOFF_F32, ZOFF_BF16 or ZOFF_F16",
                      zoff_op_name(c->op), c->stream, field, zoff_dtype_name(dt), (int)dt);
}

#define P(field) ZOFF_TRY(need_ptr(&c, a->field, #field))
#define D(field) ZOFF_TRY(need_dim(&c, a->field, #field))
#define DT(field) ZOFF_TRY(need_float_dt(&c, a->field, #field))

/* RESIDUAL_LAYERNORM_FWD (out aliases no input) and _BWD (dresid is dinp or does not overlap it). */
static zoff_status validate_residual_layernorm(const launch_check *cp, const void *args) {
    const launch_check c = *cp;
    if (c.op == ZOFF_OP_RESIDUAL_LAYERNORM_FWD) {
        const zoff_op_residual_layernorm_fwd_args *a = args;
        P(resid); P(out); P(mean); P(rstd); P(a); P(b); P(weight); P(bias); D(N); D(C); DT(dt);
        if (a->out == a->resid || a->out == a->a || a->out == a->b)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': out aliases %s; the LayerNorm "
                              "output needs a buffer of its own", zoff_op_name(c.op), c.stream,
                              a->out == a->resid ? "resid" : a->out == a->a ? "a" : "b");
        return need_product(&c, a->N, a->C, 1, "N*C");
    }
    const zoff_op_residual_layernorm_bwd_args *a = args;
    P(dinp); P(dweight); P(dbias); P(dout); P(inp); P(weight); P(mean); P(rstd); D(N); D(C); DT(dt);
    ZOFF_TRY(need_product(&c, a->N, a->C, (int64_t)zoff_dtype_size(a->dt), "N*C*element size"));
    const char *d = a->dinp, *r = a->dresid;
    const size_t bytes = (size_t)(a->N * a->C) * zoff_dtype_size(a->dt);
    if (r && r != d && r < d + bytes && d < r + bytes)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': dresid overlaps dinp without being the "
                          "same buffer; pass dresid == dinp (accumulate in place) or separate buffers",
                          zoff_op_name(c.op), c.stream);
    return ZOFF_OK;
}

static zoff_status validate_op(const launch_check *cp, const void *args) {
    const launch_check c = *cp;
    switch (c.op) {
    case ZOFF_OP_EMBED_FWD: {
        const zoff_op_embed_fwd_args *a = args;
        P(out); P(tokens); P(wte); P(wpe); D(B); D(T); D(C); D(V); DT(dt);
        return need_product(&c, a->B, a->T, a->C, "B*T*C");
    }
    case ZOFF_OP_EMBED_BWD: {
        const zoff_op_embed_bwd_args *a = args;
        P(dwte); P(dwpe); P(dout); P(tokens); D(B); D(T); D(C); D(V); DT(dt);
        return need_product(&c, a->B, a->T, a->C, "B*T*C");
    }
    case ZOFF_OP_LAYERNORM_FWD: {
        const zoff_op_layernorm_fwd_args *a = args;
        P(out); P(mean); P(rstd); P(inp); P(weight); P(bias); D(N); D(C); DT(dt);
        return need_product(&c, a->N, a->C, 1, "N*C");
    }
    case ZOFF_OP_LAYERNORM_BWD: {
        const zoff_op_layernorm_bwd_args *a = args;
        P(dinp); P(dweight); P(dbias); P(dout); P(inp); P(weight); P(mean); P(rstd); D(N); D(C); DT(dt);
        return need_product(&c, a->N, a->C, 1, "N*C");
    }
    case ZOFF_OP_MATMUL_FWD: {
        const zoff_op_matmul_fwd_args *a = args;
        P(out); P(inp); P(weight); D(N); D(C); D(OC); DT(dt);
        if (a->gelu_out && a->gelu_out == a->out)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(matmul_fwd) on stream '%s': gelu_out is out; the "
                              "pre-activation (out) and GELU's output (gelu_out) need two buffers", c.stream);
        ZOFF_TRY(need_product(&c, a->N, a->C, 1, "N*C"));
        ZOFF_TRY(need_product(&c, a->N, a->OC, 1, "N*OC"));
        return need_product(&c, a->OC, a->C, 1, "OC*C");
    }
    case ZOFF_OP_MATMUL_BWD: {
        const zoff_op_matmul_bwd_args *a = args;
        P(dweight); P(dout); P(inp);
        if (a->dinp) P(weight);
        if (a->gelu_pre && (!a->dinp || !a->dinp_overwrite))
            return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(matmul_bwd) on stream '%s': gelu_pre needs dinp with "
                              "dinp_overwrite = 1 (the GELU gradient is a product, not a sum)", c.stream);
        if (a->dbias_pre && !a->gelu_pre)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(matmul_bwd) on stream '%s': dbias_pre needs gelu_pre "
                              "(it is the bias gradient of the layer before the GELU)", c.stream);
        D(N); D(C); D(OC); DT(dt);
        ZOFF_TRY(need_product(&c, a->N, a->C, 1, "N*C"));
        ZOFF_TRY(need_product(&c, a->N, a->OC, 1, "N*OC"));
        return need_product(&c, a->OC, a->C, 1, "OC*C");
    }
    case ZOFF_OP_ATTENTION_FWD:
    case ZOFF_OP_ATTENTION_BWD: {
        int64_t B, T, C, NH;
        zoff_dtype dt;
        if (c.op == ZOFF_OP_ATTENTION_FWD) {
            const zoff_op_attention_fwd_args *a = args;
            P(out); P(lse); P(qkv);
            B = a->B; T = a->T; C = a->C; NH = a->NH; dt = a->dt;
        } else {
            const zoff_op_attention_bwd_args *a = args;
            P(dqkv); P(dout); P(qkv); P(out); P(lse);
            B = a->B; T = a->T; C = a->C; NH = a->NH; dt = a->dt;
        }
        ZOFF_TRY(need_dim(&c, B, "B"));
        ZOFF_TRY(need_dim(&c, T, "T"));
        ZOFF_TRY(need_dim(&c, C, "C"));
        ZOFF_TRY(need_float_dt(&c, dt, "dt"));
        if (NH <= 0 || C % NH != 0)
            return zoff_error(ZOFF_ERR_INVALID,
                              "zoff_launch(%s) on stream '%s': C = %" PRId64 " is not divisible into NH = %" PRId64
                              " heads; the hidden size must be a multiple of the number of attention heads",
                              zoff_op_name(c.op), c.stream, C, NH);
        ZOFF_TRY(need_product(&c, B, T, 3 * (C / NH) * NH, "B*T*3C"));
        return need_product(&c, B * NH, T, T, "B*NH*T*T");
    }
    case ZOFF_OP_GELU_FWD: {
        const zoff_op_gelu_fwd_args *a = args;
        P(out); P(inp); D(n); DT(dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_GELU_BWD: {
        const zoff_op_gelu_bwd_args *a = args;
        P(dinp); P(inp); P(dout); D(n); DT(dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_ADD: {
        const zoff_op_add_args *a = args;
        P(out); P(a); P(b); D(n); DT(dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_CROSS_ENTROPY: {
        const zoff_op_cross_entropy_args *a = args;
        P(losses); P(logits); P(targets); D(N); D(V); D(Vp); DT(dt);
        if (a->V > a->Vp)
            return zoff_error(ZOFF_ERR_INVALID,
                              "zoff_launch(cross_entropy) on stream '%s': V = %" PRId64 " exceeds the padded row width Vp = %" PRId64
                              "; Vp must be >= V",
                              c.stream, a->V, a->Vp);
        if (a->N > 0 && a->V == 0)
            return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(cross_entropy) on stream '%s': V is 0 with N = %" PRId64
                              " rows; the vocabulary must not be empty", c.stream, a->N);
        return need_product(&c, a->N, a->Vp, 1, "N*Vp");
    }
    case ZOFF_OP_CAST: {
        const zoff_op_cast_args *a = args;
        P(dst); P(src); D(n); DT(dst_dt); DT(src_dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_SCALE: {
        const zoff_op_scale_args *a = args;
        P(x); D(n); DT(dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_GRAD_STATS: {
        const zoff_op_grad_stats_args *a = args;
        P(stats); P(x); D(n); DT(dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_ADAM: {
        const zoff_op_adam_args *a = args;
        P(params); P(m); P(v); P(grads); D(n); DT(grad_dt);
        if (a->params16) DT(p16_dt);
        return ZOFF_OK;
    }
    case ZOFF_OP_RESIDUAL_LAYERNORM_FWD:
    case ZOFF_OP_RESIDUAL_LAYERNORM_BWD: return validate_residual_layernorm(cp, args);
    case ZOFF_OP_COUNT: break;
    }
    return zoff_error(ZOFF_ERR_INTERNAL, "zoff_launch: op %d has no validation", (int)c.op);
}

#undef P
#undef D
#undef DT

zoff_status zoff_launch(zoff_stream *s, zoff_op op, const void *args, size_t args_size) {
    if (!s) return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s): stream is NULL", zoff_op_name(op));
    if ((int)op < 0 || op >= ZOFF_OP_COUNT)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_launch on stream '%s': unknown op code %d (valid: 0..%d)", s->name, (int)op,
                          (int)ZOFF_OP_COUNT - 1);
    if (!args)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_launch(%s) on stream '%s': args is NULL", zoff_op_name(op), s->name);
    if (args_size != g_op_args_size[op])
        return zoff_error(ZOFF_ERR_INVALID,
                          "zoff_launch(%s) on stream '%s': args_size is %zu but the op's args struct is %zu bytes; pass "
                          "the op's own zoff_op_%s_args (use ZOFF_LAUNCH)",
                          zoff_op_name(op), s->name, args_size, g_op_args_size[op], zoff_op_name(op));
    launch_check c = {op, s->name};
    ZOFF_TRY(validate_op(&c, args));
    zoff_prof_rec *pr = NULL;
    if (zoff_prof_on(s->dev)) ZOFF_TRY(zoff_prof_begin(s, zoff_op_class_of(op), zoff_op_flops(op, args), &pr));
    zoff_status st = s->dev->vt->launch(s->dev->ctx, s->impl, op, args);
    return pr ? zoff_prof_end(s, pr, st) : st;
}

bool zoff_device_supports_op(zoff_device *dev, zoff_op op, const void *args, size_t args_size) {
    if (!dev) {
        zoff_error(ZOFF_ERR_INVALID, "zoff_device_supports_op: dev is NULL");
        return false;
    }
    if ((int)op < 0 || op >= ZOFF_OP_COUNT) {
        zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: unknown op code %d (valid: 0..%d)", zoff_device_name(dev), (int)op,
                   (int)ZOFF_OP_COUNT - 1);
        return false;
    }
    if (args && args_size != g_op_args_size[op]) {
        zoff_error(ZOFF_ERR_INVALID, "zoff_device_supports_op(%s): args_size is %zu but the op's args struct is %zu bytes",
                   zoff_op_name(op), args_size, g_op_args_size[op]);
        return false;
    }
    launch_check c = {op, "(supports_op query)"};
    if (args && validate_op(&c, args) != ZOFF_OK) return false;
    return !dev->vt->supports_op || dev->vt->supports_op(dev->ctx, op, args);
}

void *zoff_stream_native(zoff_stream *s) {
    if (!s || !s->dev->vt->stream_native) return NULL;
    return s->dev->vt->stream_native(s->dev->ctx, s->impl);
}

int zoff_device_ordinal(const zoff_device *dev) { return dev ? dev->opts.ordinal : 0; }
