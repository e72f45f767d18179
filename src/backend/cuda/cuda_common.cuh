// Device-side helpers shared by the CUDA kernels (C++, included by the .cu files only).
//
// Storage dtypes are policies with static load/store: tensors are passed as
// raw pointers of the policy's storage type (float or uint16_t bits) and all
// math is done in fp32. Rounding to 16-bit is round-to-nearest-even, bit-
// identical to the CPU backend (zoff_f32_to_bf16 / the IEEE f16 conversion).
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "backend/cuda/cuda_internal.h"

namespace zoff_cuda {

struct F32 {
    typedef float T;
    static constexpr zoff_dtype dt = ZOFF_F32;
    static __device__ __forceinline__ float load(const T *p, int64_t i) { return p[i]; }
    static __device__ __forceinline__ void store(T *p, int64_t i, float v) { p[i] = v; }
};

struct BF16 {
    typedef uint16_t T;
    static constexpr zoff_dtype dt = ZOFF_BF16;
    static __device__ __forceinline__ float load(const T *p, int64_t i) {
        return __uint_as_float((uint32_t)p[i] << 16);
    }
    static __device__ __forceinline__ void store(T *p, int64_t i, float v) {
        uint32_t u = __float_as_uint(v);
        // NaN: keep it quiet (as zoff_f32_to_bf16); else round to nearest even
        p[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                                 : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
};

struct F16 {
    typedef uint16_t T;
    static constexpr zoff_dtype dt = ZOFF_F16;
    static __device__ __forceinline__ float load(const T *p, int64_t i) {
        return __half2float(__ushort_as_half(p[i]));
    }
    static __device__ __forceinline__ void store(T *p, int64_t i, float v) {
        p[i] = __half_as_ushort(__float2half_rn(v));
    }
};

// Run `body` with the policy type of a storage dtype (f32, bf16, f16), e.g.
//   ZOFF_CUDA_DISPATCH(a->dt, S, return launch_gelu<S>(L, a));
#define ZOFF_CUDA_DISPATCH(dt_, S, ...)                                                                   \
    switch (dt_) {                                                                                        \
    case ZOFF_F32: {                                                                                      \
        typedef ::zoff_cuda::F32 S;                                                                       \
        __VA_ARGS__;                                                                                      \
    } break;                                                                                              \
    case ZOFF_BF16: {                                                                                     \
        typedef ::zoff_cuda::BF16 S;                                                                      \
        __VA_ARGS__;                                                                                      \
    } break;                                                                                              \
    case ZOFF_F16: {                                                                                      \
        typedef ::zoff_cuda::F16 S;                                                                       \
        __VA_ARGS__;                                                                                      \
    } break;                                                                                              \
    default: break;                                                                                       \
    }

// Where a kernel reports a bad value (see cuda_internal.h).
struct ErrRef {
    zoff_cuda_err_slot *slot; // mapped host memory
    unsigned int *claim;      // device memory
    unsigned long long seq;
    unsigned int op;
};

static inline ErrRef err_ref(const zoff_cuda_launch *L) {
    ErrRef e;
    e.slot = L->err;
    e.claim = L->claim;
    e.seq = L->seq;
    e.op = (unsigned int)L->op;
    return e;
}

// First error on the stream wins; the record's code is written last.
static __device__ __noinline__ void raise_error(const ErrRef &e, unsigned int kind, long long value, long long index,
                                                long long aux0, long long aux1) {
    if (atomicCAS(e.claim, 0u, 1u) != 0u) return;
    volatile zoff_cuda_err_slot *s = e.slot;
    s->kind = kind;
    s->value = value;
    s->index = index;
    s->aux0 = aux0;
    s->aux1 = aux1;
    s->seq = e.seq;
    __threadfence_system();
    s->code = e.op + 1u;
    __threadfence_system();
}

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Dynamic shared memory of a kernel: refused past the device's opt-in limit; the limit past the default
// 48 KiB is raised with cudaFuncSetAttribute once per device context and kernel (bit < 64 of
// ctx->smem_attr_set: each caller names its kernels' bits), not at every launch; bit < 0: every launch.
template <class K>
static inline zoff_status set_smem(const zoff_cuda_launch *L, K kernel, size_t bytes, int bit, const char *what) {
    if (bytes > L->ctx->smem_optin)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s needs %zu bytes of shared memory; %s allows %zu per block", what,
                          bytes, L->ctx->name, L->ctx->smem_optin);
    if (bytes <= 48 * 1024) return ZOFF_OK;
    unsigned long long *set = &L->ctx->smem_attr_set;
    const unsigned long long mask = bit >= 0 ? 1ull << bit : 0;
    if (mask && (__atomic_load_n(set, __ATOMIC_ACQUIRE) & mask)) return ZOFF_OK;
    ZOFF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (mask) __atomic_fetch_or(set, mask, __ATOMIC_RELEASE);
    return ZOFF_OK;
}

// Blocks for a grid-stride elementwise kernel of n elements (n > 0).
static inline unsigned int flat_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned int)(b < 65535 ? b : 65535);
}

} // namespace zoff_cuda
