/* CUDA backend runtime: zoff_cuda_backend_vtable (see backend_internal.h for
 * the contract and cuda_internal.h for the layout of the backend).
 *
 * Device memory: cudaMalloc / cudaFree (cudaFree waits for the device; the
 * common layer does the budget accounting). Pinned host memory: cudaHostAlloc
 * (portable). Streams: cudaStreamCreateWithFlags(cudaStreamNonBlocking), so no
 * implicit synchronisation with the legacy default stream. Events:
 * cudaEventCreateWithFlags(cudaEventDisableTiming). Copies use
 * cudaMemcpyDefault (unified addressing works out the direction). Host fns:
 * cudaLaunchHostFunc.
 *
 * Errors:
 *   - a failing CUDA call is returned at once as ZOFF_ERR_DEVICE naming file,
 *     line, call and CUDA's message;
 *   - errors found by kernels (token id out of range, target >= V) are written
 *     to the stream's error slot (cuda_internal.h) and surface as
 *     ZOFF_ERR_INVALID at the next stream_sync, or at event_sync of an event
 *     recorded after the failing launch; like a CUDA sticky error, the stream
 *     keeps reporting it. Work issued after the failing launch still runs
 *     (kernels never read or write out of bounds because of a bad id: rows
 *     with bad ids are skipped), but its results are meaningless;
 *   - an asynchronous CUDA fault (illegal address, ...) makes every later
 *     synchronisation fail with ZOFF_ERR_DEVICE: the CUDA context is lost.
 *
 * Threads: every entry point calls cudaSetDevice(ordinal) first, so streams
 * may be driven from any host thread. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "backend/cuda/cuda_internal.h"

/* Inside functions with a `st` status and a `fail:` label. */
#define CUDA_GOTO(call)                                                                                   \
    do {                                                                                                  \
        cudaError_t cuda_goto_e_ = (call);                                                                \
        if (cuda_goto_e_ != cudaSuccess) {                                                                \
            st = zoff_error(ZOFF_ERR_DEVICE, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #call,     \
                            cudaGetErrorString(cuda_goto_e_), cudaGetErrorName(cuda_goto_e_));            \
            goto fail;                                                                                    \
        }                                                                                                 \
    } while (0)

/* Log (do not return) a failing CUDA call in functions that return void. */
#define CUDA_LOG(call)                                                                                    \
    do {                                                                                                  \
        cudaError_t cuda_log_e_ = (call);                                                                 \
        if (cuda_log_e_ != cudaSuccess)                                                                   \
            zoff_log(ZOFF_LOG_ERROR, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #call,             \
                     cudaGetErrorString(cuda_log_e_), cudaGetErrorName(cuda_log_e_));                     \
    } while (0)

bool zoff_cuda_backend_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n); /* no driver / no GPU: an error code, never an abort */
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

/* ------------------------------------------------------------------ device */

static zoff_status parse_mode_env(const char *var, const char *const *names, int count, int *out) {
    const char *v = getenv(var);
    *out = 0;
    if (!v || !*v) return ZOFF_OK;
    for (int i = 0; i < count; i++)
        if (!strcmp(v, names[i])) {
            *out = i;
            return ZOFF_OK;
        }
    char list[128] = "";
    for (int i = 0; i < count; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < count) strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    return zoff_error(ZOFF_ERR_INVALID, "environment variable %s is '%s'; use one of: %s", var, v, list);
}

static void ctx_free(zoff_cuda_ctx *c) {
    if (!c) return;
    if (c->blaslt || c->mm_cache) zoff_cuda_matmul_fini(c);
    if (c->claims_dev) CUDA_LOG(cudaFree(c->claims_dev));
    if (c->slots_host) CUDA_LOG(cudaFreeHost(c->slots_host));
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static zoff_status cuda_init(zoff_device *dev, const zoff_device_options *opts, void **ctx_out) {
    (void)dev;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "no usable CUDA device: cudaGetDeviceCount failed: %s (%s); check the NVIDIA driver "
                          "(nvidia-smi) and CUDA_VISIBLE_DEVICES, or use the CPU backend (--device cpu)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (n <= 0)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "no CUDA device is visible; use the CPU backend (--device cpu)");
    if (opts->ordinal >= n)
        return zoff_error(ZOFF_ERR_INVALID, "GPU ordinal %d does not exist: %d CUDA device%s visible (0..%d)",
                          opts->ordinal, n, n == 1 ? " is" : "s are", n - 1);

    zoff_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating the CUDA device context");
    zoff_status st = ZOFF_OK;
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        return zoff_error(ZOFF_ERR_INTERNAL, "pthread_mutex_init failed creating the CUDA device context");
    }
    c->ordinal = opts->ordinal;
    static const char *const attn_modes[] = {"auto", "flash", "simple", "mma"};
    static const char *const mm_modes[] = {"auto", "simple"};
    if ((st = parse_mode_env("ZOFF_CUDA_ATTENTION", attn_modes, 4, &c->attention_mode)) != ZOFF_OK) goto fail;
    if ((st = parse_mode_env("ZOFF_CUDA_MATMUL", mm_modes, 2, &c->matmul_mode)) != ZOFF_OK) goto fail;
    static const char *const fused_ln_modes[] = {"auto", "off"};
    if ((st = parse_mode_env("ZOFF_CUDA_FUSED_LN", fused_ln_modes, 2, &c->fused_ln_mode)) != ZOFF_OK) goto fail;
    static const char *const epi_modes[] = {"auto", "off", "on"};
    if ((st = parse_mode_env("ZOFF_CUDA_EPILOGUE", epi_modes, 3, &c->epilogue_mode)) != ZOFF_OK) goto fail;

    CUDA_GOTO(cudaSetDevice(c->ordinal));
    struct cudaDeviceProp prop;
    CUDA_GOTO(cudaGetDeviceProperties(&prop, c->ordinal));
    int optin = 0;
    CUDA_GOTO(cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, c->ordinal));
    CUDA_GOTO(cudaDeviceGetAttribute(&c->cc_minor, cudaDevAttrComputeCapabilityMinor, c->ordinal));
    CUDA_GOTO(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, c->ordinal));
    CUDA_GOTO(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, c->ordinal));
    c->smem_optin = (size_t)optin;
    if (c->cc_major < 8) {
        st = zoff_error(ZOFF_ERR_UNSUPPORTED,
                        "GPU %d (%s) has compute capability %d.%d; zoff's CUDA backend needs 8.0 or newer "
                        "(bf16 arithmetic; built for sm_90 and compute_80)",
                        c->ordinal, prop.name, c->cc_major, c->cc_minor);
        goto fail;
    }
    snprintf(c->name, sizeof c->name, "cuda:%d (%.80s, sm_%d%d, %d SMs, %.1f GiB)", c->ordinal, prop.name,
             c->cc_major, c->cc_minor, c->sm_count, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));

    /* error slots: records in mapped pinned host memory, claim words in device memory */
    CUDA_GOTO(cudaHostAlloc((void **)&c->slots_host, ZOFF_CUDA_MAX_SLOTS * sizeof(zoff_cuda_err_slot),
                            cudaHostAllocMapped | cudaHostAllocPortable));
    memset(c->slots_host, 0, ZOFF_CUDA_MAX_SLOTS * sizeof(zoff_cuda_err_slot));
    CUDA_GOTO(cudaHostGetDevicePointer((void **)&c->slots_dev, c->slots_host, 0));
    CUDA_GOTO(cudaMalloc((void **)&c->claims_dev, ZOFF_CUDA_MAX_SLOTS * sizeof(unsigned int)));
    CUDA_GOTO(cudaMemset(c->claims_dev, 0, ZOFF_CUDA_MAX_SLOTS * sizeof(unsigned int)));
    CUDA_GOTO(cudaDeviceSynchronize());

    if ((st = zoff_cuda_matmul_init(c)) != ZOFF_OK) goto fail;
    if ((st = zoff_cuda_attention_init(c)) != ZOFF_OK) goto fail;
    *ctx_out = c;
    return ZOFF_OK;
fail:
    ctx_free(c);
    return st;
}

static void cuda_fini(void *ctx) {
    zoff_cuda_ctx *c = ctx;
    CUDA_LOG(cudaSetDevice(c->ordinal));
    CUDA_LOG(cudaDeviceSynchronize());
    ctx_free(c);
}

static const char *cuda_device_name(void *ctx) { return ((zoff_cuda_ctx *)ctx)->name; }

/* ------------------------------------------------------------------ memory */

/* Device (cudaMalloc) or pinned host (cudaHostAlloc, portable) memory on c; at least one byte. */
static zoff_status cuda_alloc(zoff_cuda_ctx *c, size_t bytes, bool pinned, void **out) {
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    void *p = NULL;
    const size_t n = bytes ? bytes : 1;
    cudaError_t e = pinned ? cudaHostAlloc(&p, n, cudaHostAllocPortable) : cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        if (pinned)
            return zoff_error(ZOFF_ERR_NOMEM, "cudaHostAlloc on %s: cannot pin %zu bytes of host memory (check "
                                              "ulimit -l and free host memory)", c->name, bytes);
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        char b1[32], b2[32];
        return zoff_error(ZOFF_ERR_DEVICE_OOM, "cudaMalloc on %s: out of GPU memory (%s free of %s)", c->name,
                          zoff_format_bytes(free_b, b1, sizeof b1), zoff_format_bytes(total_b, b2, sizeof b2));
    }
    ZOFF_CUDA_CHECK(e);
    *out = p;
    return ZOFF_OK;
}

static void cuda_release(zoff_cuda_ctx *c, void *ptr, bool pinned) {
    CUDA_LOG(cudaSetDevice(c->ordinal));
    if (pinned) CUDA_LOG(cudaFreeHost(ptr));
    else CUDA_LOG(cudaFree(ptr));
}

static zoff_status cuda_mem_alloc(void *ctx, size_t bytes, void **out) { return cuda_alloc(ctx, bytes, false, out); }
static void cuda_mem_free(void *ctx, void *ptr) { cuda_release(ctx, ptr, false); }
static zoff_status cuda_pinned_alloc(void *ctx, size_t bytes, void **out) { return cuda_alloc(ctx, bytes, true, out); }
static void cuda_pinned_free(void *ctx, void *ptr) { cuda_release(ctx, ptr, true); }

/* ------------------------------------------------------------------ streams */

/* The host side of a stream's end (its CUDA stream is gone): its error slot is free again. */
static void stream_free(zoff_cuda_ctx *c, zoff_cuda_stream *s) {
    pthread_mutex_lock(&c->mu);
    c->slot_used[s->slot] = 0;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static zoff_status cuda_stream_create(void *ctx, const char *name, void **out) {
    zoff_cuda_ctx *c = ctx;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    zoff_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating stream '%s'", name);
    s->ctx = c;
    s->slot = -1;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "stream");
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        free(s);
        return zoff_error(ZOFF_ERR_INTERNAL, "pthread_mutex_init failed creating stream '%s'", name);
    }
    zoff_status st = ZOFF_OK;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < ZOFF_CUDA_MAX_SLOTS; i++)
        if (!c->slot_used[i]) {
            c->slot_used[i] = 1;
            c->slot_gen[i]++;
            s->slot = i;
            break;
        }
    pthread_mutex_unlock(&c->mu);
    if (s->slot < 0) {
        pthread_mutex_destroy(&s->mu);
        free(s);
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "more than %d streams alive on %s; destroy streams you no longer use",
                          ZOFF_CUDA_MAX_SLOTS, c->name);
    }
    memset(&c->slots_host[s->slot], 0, sizeof(zoff_cuda_err_slot));
    CUDA_GOTO(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking));
    /* the slot may have served a destroyed stream: reset its claim word before any kernel runs here */
    CUDA_GOTO(cudaMemsetAsync(&c->claims_dev[s->slot], 0, sizeof(unsigned int), s->s));
    *out = s;
    return ZOFF_OK;
fail:
    if (s->s) CUDA_LOG(cudaStreamDestroy(s->s));
    stream_free(c, s);
    return st;
}

static void cuda_stream_destroy(void *ctx, void *stream) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    CUDA_LOG(cudaSetDevice(c->ordinal));
    CUDA_LOG(cudaStreamSynchronize(s->s));
    if (s->scratch) CUDA_LOG(cudaFreeAsync(s->scratch, s->s));
    if (s->workspace) CUDA_LOG(cudaFreeAsync(s->workspace, s->s));
    CUDA_LOG(cudaStreamSynchronize(s->s));
    CUDA_LOG(cudaStreamDestroy(s->s));
    stream_free(c, s);
}

/* The message of an error a kernel left in a slot. */
static void format_slot_error(char *buf, size_t n, const zoff_cuda_err_slot *e, const char *stream_name) {
    const char *op = e->code >= 1 && e->code <= ZOFF_OP_COUNT ? zoff_op_name((zoff_op)(e->code - 1)) : "kernel";
    switch (e->kind) {
    case ZOFF_CUDA_ERRK_TOKEN: {
        long long T = e->aux1 > 0 ? e->aux1 : 1;
        snprintf(buf, n,
                 "%s failed on stream '%s': %s: token id %lld at position %lld (b=%lld, t=%lld) is out of range "
                 "[0, %lld); check that the data was tokenized with this model's vocabulary",
                 op, stream_name, e->code - 1 == ZOFF_OP_EMBED_BWD ? "embedding backward" : "embedding forward",
                 e->value, e->index, e->index / T, e->index % T, e->aux0);
        return;
    }
    case ZOFF_CUDA_ERRK_TARGET:
        snprintf(buf, n,
                 "%s failed on stream '%s': cross entropy: target %lld at row %lld is >= the vocabulary size V = "
                 "%lld; targets must be in [0, V), or negative to ignore a row",
                 op, stream_name, e->value, e->index, e->aux0);
        return;
    default:
        snprintf(buf, n, "%s failed on stream '%s': the kernel reported error kind %u (value %lld at %lld)", op,
                 stream_name, e->kind, e->value, e->index);
        return;
    }
}

/* Read the stream's slot (after a synchronisation). */
static bool slot_error(const zoff_cuda_ctx *c, int slot, zoff_cuda_err_slot *out) {
    const volatile zoff_cuda_err_slot *v = &c->slots_host[slot];
    if (v->code == 0) return false;
    out->code = v->code;
    out->kind = v->kind;
    out->value = v->value;
    out->index = v->index;
    out->aux0 = v->aux0;
    out->aux1 = v->aux1;
    out->seq = v->seq;
    return true;
}

static zoff_status cuda_stream_sync(void *ctx, void *stream) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    cudaError_t e = cudaStreamSynchronize(s->s);
    pthread_mutex_lock(&s->mu);
    if (s->sticky == ZOFF_OK) {
        zoff_cuda_err_slot se;
        if (e != cudaSuccess) {
            s->sticky = ZOFF_ERR_DEVICE;
            snprintf(s->errmsg, sizeof s->errmsg,
                     "stream '%s' on %s: cudaStreamSynchronize failed: %s (%s); work issued on this device failed "
                     "(a kernel fault makes the whole CUDA context unusable; run with compute-sanitizer to find it)",
                     s->name, c->name, cudaGetErrorString(e), cudaGetErrorName(e));
        } else if (slot_error(c, s->slot, &se)) {
            s->sticky = ZOFF_ERR_INVALID;
            format_slot_error(s->errmsg, sizeof s->errmsg, &se, s->name);
        }
    }
    zoff_status st = s->sticky;
    if (st != ZOFF_OK) zoff_error(st, "%s", s->errmsg);
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ------------------------------------------------------------------ events */

typedef struct cuda_event {
    cudaEvent_t ev;
    pthread_mutex_t mu;     /* guards the fields below */
    bool recorded;
    int slot;               /* the recording stream's slot ... */
    uint32_t gen;           /* ... while it belongs to that stream */
    uint64_t seq;           /* launches issued on that stream when the event was recorded */
    char stream_name[64];
} cuda_event;

static zoff_status cuda_event_create(void *ctx, void **out) {
    zoff_cuda_ctx *c = ctx;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    cuda_event *e = calloc(1, sizeof *e);
    if (!e) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory creating an event");
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        return zoff_error(ZOFF_ERR_INTERNAL, "pthread_mutex_init failed creating an event");
    }
    cudaError_t ce = cudaEventCreateWithFlags(&e->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        ZOFF_CUDA_CHECK(ce);
    }
    *out = e;
    return ZOFF_OK;
}

static void cuda_event_destroy(void *ctx, void *event) {
    zoff_cuda_ctx *c = ctx;
    cuda_event *e = event;
    CUDA_LOG(cudaSetDevice(c->ordinal));
    CUDA_LOG(cudaEventDestroy(e->ev)); /* safe while a record or wait is pending: CUDA releases it later */
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static zoff_status cuda_event_record(void *ctx, void *event, void *stream) {
    zoff_cuda_ctx *c = ctx;
    cuda_event *e = event;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    pthread_mutex_lock(&e->mu);
    cudaError_t ce = cudaEventRecord(e->ev, s->s);
    if (ce == cudaSuccess) {
        e->recorded = true;
        e->slot = s->slot;
        pthread_mutex_lock(&c->mu);
        e->gen = c->slot_gen[s->slot];
        pthread_mutex_unlock(&c->mu);
        e->seq = __atomic_load_n(&s->seq, __ATOMIC_SEQ_CST);
        snprintf(e->stream_name, sizeof e->stream_name, "%s", s->name);
    }
    pthread_mutex_unlock(&e->mu);
    ZOFF_CUDA_CHECK(ce);
    return ZOFF_OK;
}

static zoff_status cuda_stream_wait_event(void *ctx, void *stream, void *event) {
    zoff_cuda_ctx *c = ctx;
    cuda_event *e = event;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaStreamWaitEvent(s->s, e->ev, 0));
    return ZOFF_OK;
}

static zoff_status cuda_event_sync(void *ctx, void *event) {
    zoff_cuda_ctx *c = ctx;
    cuda_event *e = event;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    cudaError_t ce = cudaEventSynchronize(e->ev);
    if (ce != cudaSuccess)
        return zoff_error(ZOFF_ERR_DEVICE,
                          "%s:%d: cudaEventSynchronize failed on %s: %s (%s); work issued on this device failed (a "
                          "kernel fault makes the whole CUDA context unusable)",
                          __FILE__, __LINE__, c->name, cudaGetErrorString(ce), cudaGetErrorName(ce));
    pthread_mutex_lock(&e->mu);
    zoff_status st = ZOFF_OK;
    if (e->recorded) {
        zoff_cuda_err_slot se;
        pthread_mutex_lock(&c->mu);
        /* the recording stream still exists (its slot was not handed to another stream) */
        bool same = c->slot_used[e->slot] && c->slot_gen[e->slot] == e->gen;
        pthread_mutex_unlock(&c->mu);
        if (same && slot_error(c, e->slot, &se) && se.seq <= e->seq) {
            char msg[1024];
            format_slot_error(msg, sizeof msg, &se, e->stream_name);
            st = zoff_error(ZOFF_ERR_INVALID, "%s", msg);
        }
    }
    pthread_mutex_unlock(&e->mu);
    return st;
}

static bool cuda_event_query(void *ctx, void *event) {
    zoff_cuda_ctx *c = ctx;
    cuda_event *e = event;
    if (cudaSetDevice(c->ordinal) != cudaSuccess) return true; /* the error surfaces at the next sync */
    cudaError_t ce = cudaEventQuery(e->ev);
    if (ce == cudaErrorNotReady) return false;
    return true; /* done, or failed: event_sync reports the failure */
}

/* ------------------------------------------------------------------ copies, host fns, kernels */

static zoff_status cuda_memcpy_async(void *ctx, void *stream, void *dst, const void *src, size_t bytes,
                                     zoff_copy_kind kind) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    (void)kind; /* unified addressing: cudaMemcpyDefault infers the direction from the pointers */
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->s));
    return ZOFF_OK;
}

static zoff_status cuda_memset_async(void *ctx, void *stream, void *dst, int value, size_t bytes) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, s->s));
    return ZOFF_OK;
}

static zoff_status cuda_host_fn(void *ctx, void *stream, void (*fn)(void *), void *arg) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaLaunchHostFunc(s->s, fn, arg));
    return ZOFF_OK;
}

static zoff_status cuda_launch(void *ctx, void *stream, zoff_op op, const void *args) {
    zoff_cuda_ctx *c = ctx;
    zoff_cuda_stream *s = stream;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    (void)cudaGetLastError(); /* so that launch checks report this op's launches only */
    zoff_cuda_launch L = {
        .ctx = c,
        .st = s,
        .s = s->s,
        .err = &c->slots_dev[s->slot],
        .claim = &c->claims_dev[s->slot],
        .seq = __atomic_add_fetch(&s->seq, 1, __ATOMIC_SEQ_CST),
        .op = op,
    };
    zoff_status st = zoff_cuda_run_op(&L, args);
    if (st != ZOFF_OK) return zoff_error_context(st, "%s on stream '%s' (%s)", zoff_op_name(op), s->name, c->name);
    return ZOFF_OK;
}

zoff_status zoff_cuda_stream_buffer(zoff_cuda_stream *s, int which, size_t bytes, void **out) {
    void **p = which ? &s->workspace : &s->scratch;
    size_t *cap = which ? &s->workspace_cap : &s->scratch_cap;
    zoff_status st = ZOFF_OK;
    pthread_mutex_lock(&s->mu);
    if (*cap < bytes || !*p) {
        const size_t MiB = (size_t)1 << 20;
        size_t ncap = bytes > 2 * *cap ? bytes : 2 * *cap;
        ncap = (ncap + MiB - 1) / MiB * MiB;
        if (ncap == 0) ncap = MiB;
        if (*p) {
            /* stream-ordered: work issued earlier on this stream still uses the old buffer */
            cudaError_t e = cudaFreeAsync(*p, s->s);
            *p = NULL;
            *cap = 0;
            if (e != cudaSuccess) {
                st = zoff_error(ZOFF_ERR_DEVICE, "%s:%d: cudaFreeAsync of the %s of stream '%s' failed: %s", __FILE__,
                                __LINE__, which ? "cuBLASLt workspace" : "scratch buffer", s->name,
                                cudaGetErrorString(e));
                goto done;
            }
        }
        void *np = NULL;
        cudaError_t e = cudaMallocAsync(&np, ncap, s->s);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = zoff_error(e == cudaErrorMemoryAllocation ? ZOFF_ERR_DEVICE_OOM : ZOFF_ERR_DEVICE,
                            "%s:%d: cudaMallocAsync of %zu bytes for the %s of stream '%s' failed: %s", __FILE__,
                            __LINE__, ncap, which ? "cuBLASLt workspace" : "scratch buffer", s->name,
                            cudaGetErrorString(e));
            goto done;
        }
        *p = np;
        *cap = ncap;
    }
    *out = *p;
done:
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void *cuda_stream_native(void *ctx, void *stream) {
    (void)ctx;
    return (void *)((zoff_cuda_stream *)stream)->s;
}

/* ------------------------------------------------------------------ timers (the op profiler) */

static zoff_status cuda_timer_create(void *ctx, void **out) {
    zoff_cuda_ctx *c = ctx;
    cudaEvent_t ev;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDefault)); /* timing on */
    *out = (void *)ev;
    return ZOFF_OK;
}

static void cuda_timer_destroy(void *ctx, void *timer) {
    zoff_cuda_ctx *c = ctx;
    CUDA_LOG(cudaSetDevice(c->ordinal));
    CUDA_LOG(cudaEventDestroy((cudaEvent_t)timer));
}

static zoff_status cuda_timer_record(void *ctx, void *timer, void *stream) {
    zoff_cuda_ctx *c = ctx;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaEventRecord((cudaEvent_t)timer, ((zoff_cuda_stream *)stream)->s));
    return ZOFF_OK;
}

static zoff_status cuda_timer_elapsed(void *ctx, void *t0, void *t1, double *ms) {
    zoff_cuda_ctx *c = ctx;
    float f = 0;
    ZOFF_CUDA_CHECK(cudaSetDevice(c->ordinal));
    ZOFF_CUDA_CHECK(cudaEventElapsedTime(&f, (cudaEvent_t)t0, (cudaEvent_t)t1));
    *ms = f;
    return ZOFF_OK;
}

const zoff_backend_vtable zoff_cuda_backend_vtable = {
    .name = "cuda",
    ZOFF_BACKEND_ENTRIES(cuda),
    .stream_native = cuda_stream_native,
    .timer_create = cuda_timer_create,
    .timer_destroy = cuda_timer_destroy,
    .timer_record = cuda_timer_record,
    .timer_elapsed = cuda_timer_elapsed,
};
