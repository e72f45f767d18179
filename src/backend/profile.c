/* The op profiler (include/zoff/device.h, "op profiler"): op classes, FLOP counts, and the
 * timing marks that device.c's launch, copy and memset paths issue around each operation
 * while the profiler is on.
 *
 * A record is one operation: its stream, class, FLOPs and two marks, issued on its stream
 * just before and just after it. A mark is a backend timer (CUDA: an event created with
 * timing; vtable timer_*) or, where the backend has none (CPU backend), a host time stamp
 * written by a host fn when the stream reaches it: exact there, as a CPU stream is a host
 * thread running its items in order. Records live in one array sized at zoff_profile_start
 * (never reallocated while marks may be pending); a window's records are read by
 * zoff_profile_collect after it synchronised the device's streams. Timers are created the
 * first time their slot is used and reused by later windows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"

/* ------------------------------------------------------------------ classes and FLOPs */

/* The one table of op -> class. An op left out (a new one) is ZOFF_CLASS_OTHER (0). */
static const zoff_op_class g_op_class[ZOFF_OP_COUNT] = {
    [ZOFF_OP_EMBED_FWD] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_EMBED_BWD] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_LAYERNORM_FWD] = ZOFF_CLASS_LAYERNORM,
    [ZOFF_OP_LAYERNORM_BWD] = ZOFF_CLASS_LAYERNORM,
    [ZOFF_OP_MATMUL_FWD] = ZOFF_CLASS_GEMM,
    [ZOFF_OP_MATMUL_BWD] = ZOFF_CLASS_GEMM,
    [ZOFF_OP_ATTENTION_FWD] = ZOFF_CLASS_ATTENTION_FWD,
    [ZOFF_OP_ATTENTION_BWD] = ZOFF_CLASS_ATTENTION_BWD,
    [ZOFF_OP_GELU_FWD] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_GELU_BWD] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_ADD] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_CROSS_ENTROPY] = ZOFF_CLASS_CROSS_ENTROPY,
    [ZOFF_OP_CAST] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_SCALE] = ZOFF_CLASS_ELEMENTWISE,
    [ZOFF_OP_GRAD_STATS] = ZOFF_CLASS_OPTIMIZER,
    [ZOFF_OP_ADAM] = ZOFF_CLASS_OPTIMIZER,
    [ZOFF_OP_RESIDUAL_LAYERNORM_FWD] = ZOFF_CLASS_LAYERNORM,
    [ZOFF_OP_RESIDUAL_LAYERNORM_BWD] = ZOFF_CLASS_LAYERNORM,
};

static const char *const g_class_names[ZOFF_CLASS_COUNT] = {
    [ZOFF_CLASS_OTHER] = "other",
    [ZOFF_CLASS_ATTENTION_FWD] = "attention_fwd",
    [ZOFF_CLASS_ATTENTION_BWD] = "attention_bwd",
    [ZOFF_CLASS_GEMM] = "gemm",
    [ZOFF_CLASS_LAYERNORM] = "layernorm",
    [ZOFF_CLASS_ELEMENTWISE] = "elementwise",
    [ZOFF_CLASS_CROSS_ENTROPY] = "cross_entropy",
    [ZOFF_CLASS_OPTIMIZER] = "optimizer",
    [ZOFF_CLASS_MEMSET] = "memset",
    [ZOFF_CLASS_COPY_H2D] = "copy_h2d",
    [ZOFF_CLASS_COPY_D2H] = "copy_d2h",
    [ZOFF_CLASS_COPY_D2D] = "copy_d2d",
};

const char *zoff_op_class_name(zoff_op_class c) {
    if ((int)c < 0 || c >= ZOFF_CLASS_COUNT) return "invalid-class";
    return g_class_names[c];
}

zoff_op_class zoff_op_class_of(zoff_op op) {
    if ((int)op < 0 || op >= ZOFF_OP_COUNT) return ZOFF_CLASS_OTHER;
    return g_op_class[op];
}

double zoff_op_flops(zoff_op op, const void *args) {
    if (!args) return 0.0;
    switch (op) {
    case ZOFF_OP_MATMUL_FWD: {
        const zoff_op_matmul_fwd_args *a = args;
        return zoff_matmul_flops(a->N, a->C, a->OC);
    }
    case ZOFF_OP_MATMUL_BWD: {
        const zoff_op_matmul_bwd_args *a = args;
        return zoff_matmul_flops(a->N, a->C, a->OC) * (a->dinp ? 2.0 : 1.0);
    }
    case ZOFF_OP_ATTENTION_FWD: {
        const zoff_op_attention_fwd_args *a = args;
        return zoff_attention_flops(a->B, a->T, a->C, false);
    }
    case ZOFF_OP_ATTENTION_BWD: {
        const zoff_op_attention_bwd_args *a = args;
        return zoff_attention_flops(a->B, a->T, a->C, true);
    }
    default: return 0.0;
    }
}

/* ------------------------------------------------------------------ records */

enum { REC_BAD = 0, REC_OPEN, REC_DONE }; /* BAD: a mark failed (or not issued yet) */

struct zoff_prof_rec {
    void *impl;       /* the stream's backend handle, for host fns and timers */
    void *timer[2];   /* backend timers (NULL: host stamps) */
    double stamp[2];  /* host stamps (seconds), written by the stream's thread */
    double flops;
    zoff_op_class cls;
    int state;        /* atomic */
};

typedef struct zoff_profiler {
    pthread_mutex_t mu; /* guards n, dropped */
    zoff_prof_rec *rec;
    int64_t cap, n, dropped;
    bool timers;        /* the backend's timers; else host stamps */
} zoff_profiler;

static void stamp_fn(void *arg) { *(double *)arg = zoff_now(); }

static zoff_status mark(zoff_device *dev, const zoff_profiler *p, zoff_prof_rec *r, int k) {
    if (!p->timers) {
        r->stamp[k] = NAN;
        return dev->vt->host_fn(dev->ctx, r->impl, stamp_fn, &r->stamp[k]);
    }
    if (!r->timer[k]) ZOFF_TRY(dev->vt->timer_create(dev->ctx, &r->timer[k]));
    return dev->vt->timer_record(dev->ctx, r->timer[k], r->impl);
}

zoff_status zoff_prof_begin(zoff_stream *s, zoff_op_class cls, double flops, zoff_prof_rec **out) {
    *out = NULL;
    zoff_profiler *p = __atomic_load_n(&s->dev->prof, __ATOMIC_ACQUIRE);
    if (!p) return ZOFF_OK;
    zoff_prof_rec *r = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->n < p->cap) r = &p->rec[p->n++];
    else p->dropped++;
    pthread_mutex_unlock(&p->mu);
    if (!r) return ZOFF_OK;
    r->impl = s->impl;
    r->cls = cls;
    r->flops = flops;
    ZOFF_TRY(mark(s->dev, p, r, 0)); /* the record stays REC_BAD: not counted */
    __atomic_store_n(&r->state, REC_OPEN, __ATOMIC_RELEASE);
    *out = r;
    return ZOFF_OK;
}

zoff_status zoff_prof_end(zoff_stream *s, zoff_prof_rec *r, zoff_status st) {
    zoff_profiler *p = __atomic_load_n(&s->dev->prof, __ATOMIC_ACQUIRE);
    if (!p) return st; /* stopped in between (against the contract): r is gone */
    zoff_status ms = mark(s->dev, p, r, 1);
    __atomic_store_n(&r->state, ms == ZOFF_OK ? REC_DONE : REC_BAD, __ATOMIC_RELEASE);
    return st != ZOFF_OK ? st : ms;
}

/* ------------------------------------------------------------------ start, collect, stop */

zoff_status zoff_profile_start(zoff_device *dev, int64_t capacity) {
    if (!dev) return zoff_error(ZOFF_ERR_INVALID, "zoff_profile_start: device is NULL");
    if (capacity < 0 || capacity > ((int64_t)1 << 26))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_profile_start: capacity %lld is out of range; use 0 (the default, "
                          "65536) or up to %lld operations per window", (long long)capacity, (long long)1 << 26);
    if (capacity == 0) capacity = 65536;
    const zoff_backend_vtable *vt = dev->vt;
    zoff_profiler *p = calloc(1, sizeof *p);
    if (p) p->rec = calloc((size_t)capacity, sizeof *p->rec);
    if (!p || !p->rec) {
        if (p) free(p->rec);
        free(p);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the op profiler's %lld records", (long long)capacity);
    }
    pthread_mutex_init(&p->mu, NULL);
    p->cap = capacity;
    p->timers = vt->timer_create && vt->timer_destroy && vt->timer_record && vt->timer_elapsed;
    zoff_profiler *none = NULL;
    if (!__atomic_compare_exchange_n(&dev->prof, &none, p, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        pthread_mutex_destroy(&p->mu);
        free(p->rec);
        free(p);
        return zoff_error(ZOFF_ERR_INVALID, "zoff_profile_start: the op profiler is already on for %s; "
                          "zoff_profile_stop it first", zoff_device_name(dev));
    }
    return ZOFF_OK;
}

/* Every stream of dev has run what was issued on it (the first sticky error, if any). */
static zoff_status sync_all(zoff_device *dev) {
    zoff_status st = dev->vt->stream_sync(dev->ctx, dev->default_stream->impl);
    pthread_mutex_lock(&dev->mu);
    for (zoff_stream *s = dev->streams; s; s = s->next) {
        zoff_status x = dev->vt->stream_sync(dev->ctx, s->impl);
        if (st == ZOFF_OK) st = x;
    }
    pthread_mutex_unlock(&dev->mu);
    return st;
}

/* Milliseconds from ref's start mark to r's mark k. */
static zoff_status mark_ms(zoff_device *dev, const zoff_profiler *p, const zoff_prof_rec *ref, const zoff_prof_rec *r,
                           int k, double *ms) {
    if (p->timers) return dev->vt->timer_elapsed(dev->ctx, ref->timer[0], r->timer[k], ms);
    if (isnan(r->stamp[k]))
        return zoff_error(ZOFF_ERR_INTERNAL, "op profiler: a time stamp was not taken although its stream was synchronised");
    *ms = (r->stamp[k] - ref->stamp[0]) * 1e3;
    return ZOFF_OK;
}

static int cmp_interval(const void *a, const void *b) {
    double x = ((const double *)a)[0], y = ((const double *)b)[0];
    return (x > y) - (x < y);
}

/* Sums of the window's complete records into *out (under p->mu). */
static zoff_status summarise(zoff_device *dev, zoff_profiler *p, zoff_profile *out) {
    const zoff_prof_rec *ref = NULL;
    for (int64_t i = 0; i < p->n && !ref; i++)
        if (__atomic_load_n(&p->rec[i].state, __ATOMIC_ACQUIRE) == REC_DONE) ref = &p->rec[i];
    if (!ref) return ZOFF_OK;
    double *iv = malloc(2 * (size_t)p->n * sizeof *iv); /* (start, end) pairs */
    if (!iv) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory reading the op profiler's %lld records", (long long)p->n);
    int64_t m = 0;
    zoff_status st = ZOFF_OK;
    for (int64_t i = 0; i < p->n && st == ZOFF_OK; i++) {
        const zoff_prof_rec *r = &p->rec[i];
        if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != REC_DONE) continue;
        double t0 = 0, t1 = 0;
        st = mark_ms(dev, p, ref, r, 0, &t0);
        if (st == ZOFF_OK) st = mark_ms(dev, p, ref, r, 1, &t1);
        if (st != ZOFF_OK) break;
        if (t1 < t0) t1 = t0;
        out->ms[r->cls] += t1 - t0;
        out->flops[r->cls] += r->flops;
        out->count[r->cls]++;
        iv[2 * m] = t0;
        iv[2 * m + 1] = t1;
        m++;
    }
    if (st == ZOFF_OK && m > 0) {
        qsort(iv, (size_t)m, 2 * sizeof *iv, cmp_interval);
        double lo = iv[0], hi = iv[1], first = iv[0], last = iv[1];
        for (int64_t i = 1; i < m; i++) {
            if (iv[2 * i + 1] > last) last = iv[2 * i + 1];
            if (iv[2 * i] > hi) { /* a gap: close the busy run */
                out->busy_ms += hi - lo;
                lo = iv[2 * i];
                hi = iv[2 * i + 1];
            } else if (iv[2 * i + 1] > hi) hi = iv[2 * i + 1];
        }
        out->busy_ms += hi - lo;
        out->span_ms = last - first;
    }
    free(iv);
    return st;
}

zoff_status zoff_profile_collect(zoff_device *dev, zoff_profile *out) {
    if (!dev || !out) return zoff_error(ZOFF_ERR_INVALID, "zoff_profile_collect: %s is NULL", !dev ? "device" : "out");
    memset(out, 0, sizeof *out);
    zoff_profiler *p = __atomic_load_n(&dev->prof, __ATOMIC_ACQUIRE);
    if (!p)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_profile_collect: the op profiler is off for %s; zoff_profile_start "
                          "it first", zoff_device_name(dev));
    ZOFF_TRY(sync_all(dev));
    pthread_mutex_lock(&p->mu);
    zoff_status st = summarise(dev, p, out);
    out->dropped = p->dropped;
    for (int64_t i = 0; i < p->n; i++) __atomic_store_n(&p->rec[i].state, REC_BAD, __ATOMIC_RELAXED);
    p->n = 0;
    p->dropped = 0;
    pthread_mutex_unlock(&p->mu);
    return st;
}

void zoff_profile_stop(zoff_device *dev) {
    if (!dev) return;
    zoff_profiler *p = __atomic_exchange_n(&dev->prof, NULL, __ATOMIC_ACQ_REL);
    if (!p) return;
    (void)sync_all(dev); /* marks still pending write into the records; a sticky error stays with its stream */
    for (int64_t i = 0; p->timers && i < p->cap; i++)
        for (int k = 0; k < 2; k++)
            if (p->rec[i].timer[k]) dev->vt->timer_destroy(dev->ctx, p->rec[i].timer[k]);
    pthread_mutex_destroy(&p->mu);
    free(p->rec);
    free(p);
}
