/* zoff device interface: the one boundary between everything above the kernels
 * (model, engine, optimizer glue) and a backend (cpu/, cuda/).
 *
 * Shape of the interface (after ggml's backend): a plain C table of function
 * pointers plus a context. Work is issued on streams and ordered with events,
 * with CUDA semantics: operations on one stream run in issue order; events
 * recorded on one stream can be waited on by another; errors raised while a
 * stream executes are sticky and are returned by the next synchronising call
 * on that stream.
 *
 * Kernels are described by an op code plus an argument struct (zoff_op_*_args
 * below). zoff_launch() validates and hands both to the backend. The typed
 * wrappers (zoff_layernorm_forward, ...) only build the struct. Tests run the
 * same list of ops on every backend and compare with the CPU backend.
 *
 * Pointers in op args are device pointers (from zoff_device_alloc), except
 * where noted. All matrices are row-major. Unless noted, "accumulate" means
 * the op adds into its output (gradients), and the output is otherwise
 * overwritten. `dt` is the storage dtype of activations/parameters/gradients
 * of an op; math is always done in fp32 (or wider). */
#ifndef ZOFF_DEVICE_H
#define ZOFF_DEVICE_H

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* zoff_dtype, zoff_dtype_size and zoff_dtype_name are in core.h. */

typedef struct zoff_device zoff_device;
typedef struct zoff_stream zoff_stream;
typedef struct zoff_event zoff_event;

typedef enum zoff_backend_kind { ZOFF_BACKEND_CPU = 0, ZOFF_BACKEND_CUDA = 1 } zoff_backend_kind;

typedef struct zoff_device_options {
    zoff_backend_kind kind;
    size_t memory_budget; /* bytes of device memory allowed; 0 = no limit (CPU) / all (CUDA) */
    int ordinal;          /* GPU index (CUDA) */
    int threads;          /* CPU backend: threads per kernel; 0 = all cores */
} zoff_device_options;

/* Is the backend compiled in and is a device present? */
bool zoff_backend_available(zoff_backend_kind kind);
zoff_status zoff_device_create(const zoff_device_options *opts, zoff_device **out);
void zoff_device_destroy(zoff_device *dev);
const char *zoff_device_name(const zoff_device *dev);
zoff_backend_kind zoff_device_kind(const zoff_device *dev);

/* ---- memory ----
 * Device allocations are counted against the budget; past it the call fails
 * with ZOFF_ERR_DEVICE_OOM naming `what`, its size, what is in use and the budget.
 * Pinned host memory is host memory the device can copy to/from asynchronously
 * (cudaHostAlloc on CUDA; aligned host memory on CPU); it is counted separately. */
zoff_status zoff_device_alloc(zoff_device *dev, size_t bytes, const char *what, void **out);
void zoff_device_free(zoff_device *dev, void *ptr);
zoff_status zoff_host_alloc_pinned(zoff_device *dev, size_t bytes, const char *what, void **out);
void zoff_host_free_pinned(zoff_device *dev, void *ptr);

typedef struct zoff_memory_stats {
    size_t device_in_use, device_peak, device_budget; /* budget 0 = unlimited */
    size_t pinned_in_use, pinned_peak;
} zoff_memory_stats;
void zoff_device_memory_stats(const zoff_device *dev, zoff_memory_stats *out);

/* ---- streams and events ---- */
zoff_status zoff_stream_create(zoff_device *dev, const char *name, zoff_stream **out);
void zoff_stream_destroy(zoff_stream *s);
/* The device's compute stream (owned by the device; do not destroy). */
zoff_stream *zoff_device_stream(zoff_device *dev);
/* Wait until all work issued on s has run; returns the stream's sticky error, if any. */
zoff_status zoff_stream_synchronize(zoff_stream *s);

zoff_status zoff_event_create(zoff_device *dev, zoff_event **out);
void zoff_event_destroy(zoff_event *e);
/* Capture the work issued on s so far. */
zoff_status zoff_event_record(zoff_event *e, zoff_stream *s);
/* Work issued on s after this call waits until e's captured work has run. */
zoff_status zoff_stream_wait_event(zoff_stream *s, zoff_event *e);
/* Block the host until e's captured work has run (returns that stream's sticky error). */
zoff_status zoff_event_synchronize(zoff_event *e);
/* Non-blocking: has e's captured work run? (true for a never-recorded event) */
bool zoff_event_query(zoff_event *e);

/* ---- copies (asynchronous on the stream) ---- */
typedef enum zoff_copy_kind { ZOFF_COPY_H2D, ZOFF_COPY_D2H, ZOFF_COPY_D2D, ZOFF_COPY_H2H } zoff_copy_kind;
zoff_status zoff_memcpy_async(zoff_stream *s, void *dst, const void *src, size_t bytes, zoff_copy_kind kind);
zoff_status zoff_memset_async(zoff_stream *s, void *dst, int value, size_t bytes);
/* Run fn(arg) on the host in stream order (like cudaLaunchHostFunc). fn must not call zoff device APIs. */
zoff_status zoff_stream_host_fn(zoff_stream *s, void (*fn)(void *arg), void *arg);

/* ---- kernels ---- */
typedef enum zoff_op {
    ZOFF_OP_EMBED_FWD = 0,
    ZOFF_OP_EMBED_BWD,
    ZOFF_OP_LAYERNORM_FWD,
    ZOFF_OP_LAYERNORM_BWD,
    ZOFF_OP_MATMUL_FWD,
    ZOFF_OP_MATMUL_BWD,
    ZOFF_OP_ATTENTION_FWD,
    ZOFF_OP_ATTENTION_BWD,
    ZOFF_OP_GELU_FWD,
    ZOFF_OP_GELU_BWD,
    ZOFF_OP_ADD,
    ZOFF_OP_CROSS_ENTROPY,
    ZOFF_OP_CAST,
    ZOFF_OP_SCALE,
    ZOFF_OP_GRAD_STATS,
    ZOFF_OP_ADAM,
    ZOFF_OP_RESIDUAL_LAYERNORM_FWD,
    ZOFF_OP_RESIDUAL_LAYERNORM_BWD,
    ZOFF_OP_COUNT
} zoff_op;
const char *zoff_op_name(zoff_op op);

/* out(B,T,C) = wte[tokens[b,t]] + wpe[t].  tokens (B,T) int32, wte (V,C), wpe (maxT,C).
 * Out-of-range token ids make the stream fail with ZOFF_ERR_INVALID. */
typedef struct zoff_op_embed_fwd_args {
    void *out; const int32_t *tokens; const void *wte; const void *wpe;
    int64_t B, T, C, V; zoff_dtype dt;
} zoff_op_embed_fwd_args;

/* Accumulate: dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += sum_b dout[b,t].  dout (B,T,C). */
typedef struct zoff_op_embed_bwd_args {
    void *dwte; void *dwpe; const void *dout; const int32_t *tokens;
    int64_t B, T, C, V; zoff_dtype dt;
} zoff_op_embed_bwd_args;

/* out(N,C) = (inp - mean) * rstd * weight + bias, eps = 1e-5.  mean, rstd (N) fp32 (saved for backward). */
typedef struct zoff_op_layernorm_fwd_args {
    void *out; float *mean; float *rstd; const void *inp; const void *weight; const void *bias;
    int64_t N, C; zoff_dtype dt;
} zoff_op_layernorm_fwd_args;

/* Accumulate: dinp(N,C) +=, dweight(C) +=, dbias(C) +=.  Uses the saved mean/rstd. */
typedef struct zoff_op_layernorm_bwd_args {
    void *dinp; void *dweight; void *dbias; const void *dout; const void *inp; const void *weight;
    const float *mean; const float *rstd;
    int64_t N, C; zoff_dtype dt;
} zoff_op_layernorm_bwd_args;

/* out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC).  bias may be NULL.
 * gelu_out (optional, NULL = none): gelu_out(N,OC) = GELU(out) as GELU_FWD computes it (tanh
 * approximation); out keeps the pre-activation that backward's gelu_pre needs. Whether GELU reads out's
 * fp32 value or the value rounded to dt is the backend's choice (one rounding of dt apart).
 * gelu_out must not overlap out. */
typedef struct zoff_op_matmul_fwd_args {
    void *out; const void *inp; const void *weight; const void *bias;
    int64_t N, C, OC; zoff_dtype dt;
    void *gelu_out;
} zoff_op_matmul_fwd_args;

/* dinp(N,C) += dout(N,OC) @ weight(OC,C)       (skipped when dinp is NULL; dinp_overwrite: =)
 * dweight(OC,C) += dout^T @ inp(N,C)
 * dbias(OC) += sum over N of dout               (skipped when dbias is NULL)
 * The fields after dt are optional (0 / NULL: the plain op above):
 * dinp_overwrite = 1: dinp is written, not accumulated (its old contents, even NaN, are never read).
 * gelu_pre (N,C) (needs dinp and dinp_overwrite): dinp = (dout @ weight) * GELU'(gelu_pre), the
 *   gradient through a GELU whose input was gelu_pre (inp is then GELU(gelu_pre), the layer's input).
 * dbias_pre (C) (needs gelu_pre): dbias_pre += sum over N of that dinp, i.e. the bias gradient of the
 *   layer that produced gelu_pre (that layer's backward then passes dbias = NULL). */
typedef struct zoff_op_matmul_bwd_args {
    void *dinp; void *dweight; void *dbias; const void *dout; const void *inp; const void *weight;
    int64_t N, C, OC; zoff_dtype dt;
    int dinp_overwrite; const void *gelu_pre; void *dbias_pre;
} zoff_op_matmul_bwd_args;

/* Causal multi-head self-attention.  qkv (B,T,3C) holds q,k,v each (B,T,NH,HS), HS = C/NH.
 * out(B,T,C) = softmax(q k^T / sqrt(HS), causal) v, heads concatenated.
 * lse (B,NH,T) fp32: log-sum-exp of each softmax row (saved for backward). */
typedef struct zoff_op_attention_fwd_args {
    void *out; float *lse; const void *qkv;
    int64_t B, T, C, NH; zoff_dtype dt;
} zoff_op_attention_fwd_args;

/* dqkv(B,T,3C) = gradient of out w.r.t. qkv (overwritten, not accumulated). */
typedef struct zoff_op_attention_bwd_args {
    void *dqkv; const void *dout; const void *qkv; const void *out; const float *lse;
    int64_t B, T, C, NH; zoff_dtype dt;
} zoff_op_attention_bwd_args;

/* out(n) = GELU(inp), tanh approximation (GPT-2). */
typedef struct zoff_op_gelu_fwd_args { void *out; const void *inp; int64_t n; zoff_dtype dt; } zoff_op_gelu_fwd_args;
/* dinp(n) = GELU'(inp) * dout (overwritten; dinp may alias dout). */
typedef struct zoff_op_gelu_bwd_args { void *dinp; const void *inp; const void *dout; int64_t n; zoff_dtype dt; } zoff_op_gelu_bwd_args;

/* out(n) = a + b; out may alias a or b. */
typedef struct zoff_op_add_args { void *out; const void *a; const void *b; int64_t n; zoff_dtype dt; } zoff_op_add_args;

/* Fused softmax + cross-entropy over logits (N,Vp) of which the first V columns are real.
 * losses(N) fp32 = -log softmax(logits[i,:V])[targets[i]].
 * If dlogits != NULL: dlogits(N,Vp) = (softmax - onehot(target)) * dloss, padded columns 0;
 * dlogits may alias logits.  targets < 0 means "ignore this row" (loss 0, gradient 0).
 * targets >= V make the stream fail with ZOFF_ERR_INVALID. */
typedef struct zoff_op_cross_entropy_args {
    float *losses; void *dlogits; const void *logits; const int32_t *targets;
    int64_t N, V, Vp; float dloss; zoff_dtype dt;
} zoff_op_cross_entropy_args;

/* dst(n) of dst_dt = src(n) of src_dt, round to nearest even. */
typedef struct zoff_op_cast_args {
    void *dst; const void *src; int64_t n; zoff_dtype dst_dt; zoff_dtype src_dt;
} zoff_op_cast_args;

/* x(n) *= alpha. */
typedef struct zoff_op_scale_args { void *x; float alpha; int64_t n; zoff_dtype dt; } zoff_op_scale_args;

/* stats[0] += sum of x^2 (accumulated in fp64 internally, stored fp32);
 * stats[1] = 1.0f if any element of x is inf or NaN (never reset to 0 by the op).
 * stats points to 2 fp32 in device memory. */
typedef struct zoff_op_grad_stats_args { float *stats; const void *x; int64_t n; zoff_dtype dt; } zoff_op_grad_stats_args;

/* Fused Adam/AdamW on the device (stage 0 optimizer, Twin-Flow's device side).
 * For each i: g = grads[i] * grad_scale (+ weight_decay * p if !adam_w_mode);
 *   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps)  (+ lr * weight_decay * p first if adam_w_mode)
 * params, m, v fp32 (n). grads of grad_dt. If params16 != NULL it receives the new
 * weights as p16_dt. bc1 = 1 - b1^step, bc2 = 1 - b2^step (1 when bias correction is off).
 * weight_decay applies to all n elements: callers split decay / no-decay ranges. */
typedef struct zoff_op_adam_args {
    float *params; float *m; float *v; const void *grads; void *params16;
    int64_t n; zoff_dtype grad_dt; zoff_dtype p16_dt;
    float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
    int adam_w_mode;
} zoff_op_adam_args;

/* Residual add fused with LayerNorm (a pre-LN transformer's residual stream, llm.c's fused_residual_forward):
 * resid(N,C) = a + b (rounded to dt and stored), then out(N,C), mean, rstd (N) fp32 = ZOFF_OP_LAYERNORM_FWD of
 * the stored resid, bit for bit (a recomputation from resid with LAYERNORM_FWD gives the same out, mean, rstd).
 * resid may alias a or b; out must not alias resid, a or b. */
typedef struct zoff_op_residual_layernorm_fwd_args {
    void *resid; void *out; float *mean; float *rstd; const void *a; const void *b;
    const void *weight; const void *bias;
    int64_t N, C; zoff_dtype dt;
} zoff_op_residual_layernorm_fwd_args;

/* LayerNorm backward with the residual gradient in the same pass:
 * dinp(N,C) = dresid + LayerNorm'(dout) (overwritten: no memset needed); dweight(C) +=, dbias(C) +=.
 * dresid (N,C) may be NULL (taken as 0) or alias dinp (then this is ZOFF_OP_LAYERNORM_BWD); it must not
 * otherwise overlap dinp. Uses the saved mean/rstd of the forward over inp. */
typedef struct zoff_op_residual_layernorm_bwd_args {
    void *dinp; const void *dresid; void *dweight; void *dbias; const void *dout; const void *inp; const void *weight;
    const float *mean; const float *rstd;
    int64_t N, C; zoff_dtype dt;
} zoff_op_residual_layernorm_bwd_args;

/* Validate args and issue the op on stream s. Size of args must match the op's struct.
 * Usage:  zoff_op_gelu_fwd_args a = {.out = y, .inp = x, .n = n, .dt = ZOFF_F32};
 *         ZOFF_TRY(ZOFF_LAUNCH(stream, ZOFF_OP_GELU_FWD, a)); */
zoff_status zoff_launch(zoff_stream *s, zoff_op op, const void *args, size_t args_size);
#define ZOFF_LAUNCH(s, op, args) zoff_launch((s), (op), &(args), sizeof(args))

/* ---- capabilities and native handles ----
 * In the manner of ggml's backend interface (ggml_backend_supports_op): can this device run
 * op with these arguments? args (with args_size, as for zoff_launch) may be NULL to ask about
 * the op in general. false leaves the reason in zoff_last_error(). A caller with a choice
 * (another backend, another kernel) asks first instead of failing in zoff_launch. */
bool zoff_device_supports_op(zoff_device *dev, zoff_op op, const void *args, size_t args_size);

/* The backend's own handle of a stream, for a library that takes one (NCCL takes the
 * cudaStream_t): cudaStream_t on CUDA, NULL on the CPU backend. The one way code outside
 * src/backend reaches a backend object; the vtable and the handles' layout stay private. */
void *zoff_stream_native(zoff_stream *s);
/* The device's index among the machine's GPUs (zoff_device_options.ordinal; 0 on CPU). */
int zoff_device_ordinal(const zoff_device *dev);

/* ---- op profiler (src/backend/profile.c) ----
 * Opt-in, per device: while it is on, every zoff_launch, zoff_memcpy_async and
 * zoff_memset_async on any stream of the device is bracketed on that stream by two timing
 * marks (CUDA: events created with timing; CPU backend: time stamps taken by the stream's
 * thread when it reaches them) and tagged with its class and FLOPs. Nothing synchronises
 * while work is issued; zoff_profile_collect reads the marks afterwards. Off (the default)
 * it costs one atomic load per call.
 *
 * Classes: every op belongs to one (one table in profile.c; an op missing there is
 * ZOFF_CLASS_OTHER). Copies are classed by direction (D2D and H2H together), memsets apart. */
typedef enum zoff_op_class {
    ZOFF_CLASS_OTHER = 0, /* ops not in the table (new ops land here until classed) */
    ZOFF_CLASS_ATTENTION_FWD,
    ZOFF_CLASS_ATTENTION_BWD,
    ZOFF_CLASS_GEMM,
    ZOFF_CLASS_LAYERNORM,
    ZOFF_CLASS_ELEMENTWISE, /* embedding, GELU, add, cast, scale */
    ZOFF_CLASS_CROSS_ENTROPY,
    ZOFF_CLASS_OPTIMIZER,   /* Adam, gradient statistics */
    ZOFF_CLASS_MEMSET,
    ZOFF_CLASS_COPY_H2D,
    ZOFF_CLASS_COPY_D2H,
    ZOFF_CLASS_COPY_D2D,    /* device to device, and host to host */
    ZOFF_CLASS_COUNT
} zoff_op_class;
/* "attention_fwd", "gemm", "copy_h2d", ... (identifiers: the bench's JSON keys) */
const char *zoff_op_class_name(zoff_op_class c);
zoff_op_class zoff_op_class_of(zoff_op op);

/* FLOP counts (one multiply-add = 2 FLOPs; the matrix products only, no bias, softmax or
 * scaling). Matrix multiply (N,C) x (C,OC): 2*N*C*OC. Causal attention, counted as
 * FlashAttention counts it (half of the full T x T products): forward QK^T and PV,
 * 2 * (2*B*NH*T*T*HS) / 2 = 2*B*T*T*C; backward 2.5 times the forward (five products
 * against two): 5*B*T*T*C. */
double zoff_matmul_flops(int64_t N, int64_t C, int64_t OC);
double zoff_attention_flops(int64_t B, int64_t T, int64_t C, bool backward);
/* The FLOPs of one launch of op with args (validated as zoff_launch does; 0 for ops that
 * are not matrix products): matmul_fwd 2NC*OC, matmul_bwd 2NC*OC (dweight) plus 2NC*OC
 * when dinp is computed, attention as above. */
double zoff_op_flops(zoff_op op, const void *args);

typedef struct zoff_profile {
    double ms[ZOFF_CLASS_COUNT];    /* device time of the class's work, summed over its ops */
    double flops[ZOFF_CLASS_COUNT]; /* zoff_op_flops summed over the class's ops */
    int64_t count[ZOFF_CLASS_COUNT];
    double busy_ms;  /* union of all recorded intervals, over all streams */
    double span_ms;  /* first recorded start to last recorded end */
    int64_t dropped; /* operations not recorded: more than the capacity in one window */
} zoff_profile;

/* Turn the profiler on for dev (a new, empty window). capacity: operations recorded per
 * window (0: 65536); more are counted in `dropped`. Already on: ZOFF_ERR_INVALID. */
zoff_status zoff_profile_start(zoff_device *dev, int64_t capacity);
/* Synchronise every stream of dev, sum the window's operations into *out and start a new
 * window. Call it where no other thread issues work on dev. */
zoff_status zoff_profile_collect(zoff_device *dev, zoff_profile *out);
/* Synchronise dev's streams, turn the profiler off and free its marks (no-op when off). */
void zoff_profile_stop(zoff_device *dev);

#ifdef __cplusplus
}
#endif
#endif
