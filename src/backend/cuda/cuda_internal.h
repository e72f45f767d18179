/* Private to src/backend/cuda: what the runtime (cuda_backend.c, C) and the
 * kernels (*.cu, C++) share.
 *
 * Layout of the backend:
 *   cuda_backend.c    zoff_cuda_backend_vtable: device, memory, streams,
 *                     events, copies, asynchronous error reporting, and the
 *                     per-stream scratch buffers; launch() calls
 *                     zoff_cuda_run_op below.
 *   cuda_kernels.cu   zoff_cuda_run_op (dispatch) and every op except matmul
 *                     and attention.
 *   cuda_matmul.cu    MATMUL_FWD / MATMUL_BWD through cuBLASLt, its fused
 *                     epilogues (GELU, dGELU, bias gradients) and a simple
 *                     fallback GEMM kernel.
 *   cuda_attention.cu ATTENTION_FWD / ATTENTION_BWD: a fused flash-style
 *                     kernel pair for head sizes 16, 32, 64, 128 and a simple
 *                     warp-per-row version for any other head size.
 *
 * Asynchronous errors (token id out of range, cross-entropy target >= V) are
 * found by kernels. Each stream owns an error slot: a claim word in device
 * memory and a record in mapped pinned host memory. A kernel that finds a bad
 * value claims the slot (atomicCAS on the claim word, in device memory because
 * atomics on host memory over PCIe are not guaranteed; first error wins),
 * writes what it found plus the launch's sequence number into the record with
 * plain stores, then sets the record's `code` last. stream_sync / event_sync
 * read the record after the CUDA synchronisation (no copy needed) and turn it
 * into the stream's sticky error. */
#ifndef ZOFF_CUDA_INTERNAL_H
#define ZOFF_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "zoff/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Check a call into a CUDA library whose status type is TYPE (success: OK); on failure return
 * ZOFF_ERR_DEVICE with file, line, the call's text and the library's message and name for the status
 * (STR, NAME). The checks below are this for the runtime and cuBLAS. */
#define ZOFF_CUDA_LIB_CHECK(TYPE, OK, STR, NAME, text, call)                                                    \
    do {                                                                                                    \
        TYPE zoff_lib_s_ = (call);                                                                          \
        if (zoff_lib_s_ != (OK))                                                                            \
            return zoff_error(ZOFF_ERR_DEVICE, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, text,      \
                              STR(zoff_lib_s_), NAME(zoff_lib_s_));                                         \
    } while (0)

/* Check a CUDA runtime call; on failure return ZOFF_ERR_DEVICE with file, line, call and CUDA's message.
 * Usage inside a function returning zoff_status:  ZOFF_CUDA_CHECK(cudaMemsetAsync(p, 0, n, s)); */
#define ZOFF_CUDA_CHECK(call) \
    ZOFF_CUDA_LIB_CHECK(cudaError_t, cudaSuccess, cudaGetErrorString, cudaGetErrorName, #call, call)

/* Check a kernel launch (<<<...>>> reports configuration errors through cudaGetLastError). */
#define ZOFF_CUDA_CHECK_LAUNCH(what)                                                                        \
    do {                                                                                                    \
        cudaError_t zoff_cuda_e_ = cudaGetLastError();                                                      \
        if (zoff_cuda_e_ != cudaSuccess)                                                                    \
            return zoff_error(ZOFF_ERR_DEVICE, "%s:%d: launch of %s failed: %s (%s)", __FILE__, __LINE__,   \
                              (what), cudaGetErrorString(zoff_cuda_e_), cudaGetErrorName(zoff_cuda_e_));    \
    } while (0)

/* ---- asynchronous error slots ---- */

/* What a kernel found (zoff_cuda_err_slot.kind). */
enum {
    ZOFF_CUDA_ERRK_NONE = 0,
    ZOFF_CUDA_ERRK_TOKEN = 1,  /* embedding: value = token id, index = position, aux0 = V, aux1 = T */
    ZOFF_CUDA_ERRK_TARGET = 2, /* cross entropy: value = target, index = row, aux0 = V */
};

/* One per stream, in mapped pinned host memory (written by kernels, read by the host after a sync). */
typedef struct zoff_cuda_err_slot {
    unsigned int code;  /* 0 = no error; else 1 + zoff_op of the failing launch (written last) */
    unsigned int kind;  /* ZOFF_CUDA_ERRK_* */
    long long value, index, aux0, aux1;
    unsigned long long seq; /* the failing launch's sequence number on its stream */
    unsigned long long pad[2];
} zoff_cuda_err_slot;

/* Slots per device (streams alive at the same time, the compute stream included). */
#define ZOFF_CUDA_MAX_SLOTS 1024

/* ---- device context and stream ---- */

typedef struct zoff_cuda_ctx zoff_cuda_ctx;

typedef struct zoff_cuda_stream {
    zoff_cuda_ctx *ctx;
    cudaStream_t s;
    char name[64];
    int slot;                  /* index into ctx->slots */
    uint64_t seq;              /* launches issued on this stream (atomic builtins) */
    pthread_mutex_t mu;        /* guards sticky/errmsg and the scratch buffers */
    zoff_status sticky;        /* the stream's sticky error, once seen */
    char errmsg[1024];
    void *scratch;             /* per-stream device scratch (stream-ordered cudaMallocAsync) */
    size_t scratch_cap;
    void *workspace;           /* cuBLASLt workspace of this stream (allocated on first matmul) */
    size_t workspace_cap;
} zoff_cuda_stream;

struct zoff_cuda_ctx {
    int ordinal;
    char name[160];
    int sm_count, cc_major, cc_minor;
    size_t smem_optin;                 /* max dynamic shared memory per block (opt-in) */
    zoff_cuda_err_slot *slots_host;    /* ZOFF_CUDA_MAX_SLOTS, mapped pinned */
    zoff_cuda_err_slot *slots_dev;     /* device view of the same memory */
    unsigned int *claims_dev;          /* ZOFF_CUDA_MAX_SLOTS claim words, device memory */
    uint32_t slot_gen[ZOFF_CUDA_MAX_SLOTS]; /* bumped when a slot is handed to a new stream */
    unsigned char slot_used[ZOFF_CUDA_MAX_SLOTS];
    pthread_mutex_t mu;                /* guards the slot tables and the matmul algorithm cache */
    void *blaslt;                      /* cublasLtHandle_t (cuda_matmul.cu) */
    void *mm_cache;                    /* matmul algorithm cache (cuda_matmul.cu) */
    int attention_mode;                /* ZOFF_CUDA_ATTN_* (env ZOFF_CUDA_ATTENTION) */
    int attention_mma_ok;              /* tensor-core attention: 1 yes, 0 no, -1 not compared yet (auto) */
    unsigned long long smem_attr_set;  /* bits: kernels whose shared-memory limit was raised (set_smem) */
    int matmul_mode;                   /* ZOFF_CUDA_MM_* (env ZOFF_CUDA_MATMUL) */
    int fused_ln_mode;                 /* ZOFF_CUDA_FUSED_LN_* (env ZOFF_CUDA_FUSED_LN) */
    int fused_ln_state;                /* auto mode: 0 not compared yet, 1 fused kernels agreed, 2 they did not */
    int epilogue_mode;                 /* ZOFF_CUDA_EPI_* (env ZOFF_CUDA_EPILOGUE) */
    int epilogue_ok;                   /* ZOFF_CUDA_EPI_F32 | _16: where the fused epilogues run (set at init) */
};

/* auto: the tensor-core kernels where they apply and agreed with the fp32 flash kernels at start-up,
 * else flash, else simple; flash: the fp32 flash kernels (never the tensor-core ones); simple: the
 * simple kernels; mma: the tensor-core kernels where they apply, without the start-up comparison. */
enum { ZOFF_CUDA_ATTN_AUTO = 0, ZOFF_CUDA_ATTN_FLASH = 1, ZOFF_CUDA_ATTN_SIMPLE = 2, ZOFF_CUDA_ATTN_MMA = 3 };
enum { ZOFF_CUDA_MM_AUTO = 0, ZOFF_CUDA_MM_SIMPLE = 1 };
/* RESIDUAL_LAYERNORM_FWD/BWD. auto: the fused kernels, once compared bit for bit with the unfused path at
 * their first use (a warning line and the unfused path if they disagree); off: the unfused path (the ADD
 * kernel, then LayerNorm; a copy or memset of dresid, then the accumulating LayerNorm backward). */
enum { ZOFF_CUDA_FUSED_LN_AUTO = 0, ZOFF_CUDA_FUSED_LN_OFF = 1 };
/* The matmul epilogues (bias+GELU forward, dGELU+bias gradient, bias gradient through BGRADB; cuda_matmul.cu):
 * auto: where they apply, once they agreed with the unfused path at start-up; off: never; on: without the check. */
enum { ZOFF_CUDA_EPI_AUTO = 0, ZOFF_CUDA_EPI_OFF = 1, ZOFF_CUDA_EPI_ON = 2 };
enum { ZOFF_CUDA_EPI_F32 = 1, ZOFF_CUDA_EPI_16 = 2 }; /* bits of epilogue_ok: f32; bf16 and f16 */

/* Everything a kernel launcher needs about the launch. */
typedef struct zoff_cuda_launch {
    zoff_cuda_ctx *ctx;
    zoff_cuda_stream *st;
    cudaStream_t s;
    zoff_cuda_err_slot *err;   /* device pointer of the stream's slot record (mapped host memory) */
    unsigned int *claim;       /* the slot's claim word (device memory) */
    unsigned long long seq;    /* this launch's sequence number */
    zoff_op op;
} zoff_cuda_launch;

/* ---- implemented by cuda_backend.c ---- */

/* A device buffer of at least `bytes` owned by the stream, valid for work issued
 * on it from now on (grown stream-ordered: earlier work keeps the old buffer
 * until it has run). which: 0 = scratch, 1 = cuBLASLt workspace. Not counted
 * against the device budget. */
zoff_status zoff_cuda_stream_buffer(zoff_cuda_stream *st, int which, size_t bytes, void **out);

/* ---- implemented by the .cu files ---- */

/* Issue op with args (see include/zoff/device.h) on L->s. Validated by the common layer. */
zoff_status zoff_cuda_run_op(const zoff_cuda_launch *L, const void *args);

zoff_status zoff_cuda_matmul_init(zoff_cuda_ctx *ctx);
void zoff_cuda_matmul_fini(zoff_cuda_ctx *ctx);
zoff_status zoff_cuda_matmul_fwd(const zoff_cuda_launch *L, const zoff_op_matmul_fwd_args *a);
zoff_status zoff_cuda_matmul_bwd(const zoff_cuda_launch *L, const zoff_op_matmul_bwd_args *a);

zoff_status zoff_cuda_attention_fwd(const zoff_cuda_launch *L, const zoff_op_attention_fwd_args *a);
zoff_status zoff_cuda_attention_bwd(const zoff_cuda_launch *L, const zoff_op_attention_bwd_args *a);
/* Once per device context: sets ctx->attention_mma_ok from the mode. In auto mode the first attention call
 * that would use the tensor-core kernels runs them against the fp32 flash kernels on a small case (under
 * ctx->mu) and falls back to flash, with one warning line on stderr, if they disagree. */
zoff_status zoff_cuda_attention_init(zoff_cuda_ctx *ctx);

/* cuda_attention_mma.cu: the tensor-core kernels (bf16/f16, head size 64 or 128). applies: whether a call
 * qualifies (dtype, head size, 16-byte aligned qkv and dout, compute capability, shared memory).
 * bwd needs Dd: zoff_cuda_attention_mma_scratch(B, T, NH) bytes of device memory. */
int zoff_cuda_attention_mma_applies(const zoff_cuda_ctx *ctx, zoff_dtype dt, int64_t B, int64_t T, int64_t C,
                                    int64_t NH, const void *qkv, const void *dout);
size_t zoff_cuda_attention_mma_scratch(int64_t B, int64_t T, int64_t NH);
zoff_status zoff_cuda_attention_mma_fwd(const zoff_cuda_launch *L, const zoff_op_attention_fwd_args *a);
zoff_status zoff_cuda_attention_mma_bwd(const zoff_cuda_launch *L, const zoff_op_attention_bwd_args *a, float *Dd);

#ifdef __cplusplus
}
#endif
#endif
