// CPU emulation of CUDA device code (C++ part): execution spaces, built-in
// variables, barriers, warp shuffles, atomics, the fp16 helpers and kernel
// launches. Development tool, not part of the library: see run.sh.
//
// A launch runs its blocks one after another. Each CUDA thread of a block is a
// fiber (ucontext) on the calling host thread; a fiber runs until it reaches a
// barrier (__syncthreads: the block; __syncwarp and every shuffle: its warp) or
// returns. A barrier is released when every live thread of its scope waits at
// it; a block where no fiber can run and not all have returned is a deadlock
// (divergent barrier) and aborts with a message. A shuffle or __syncwarp whose
// warp has exited lanes aborts too (undefined in CUDA with a full mask).
// EMU_ORDER=reverse runs the fibers of each round in reverse order (shakes out
// missing barriers).
//
// Shared memory: `__shared__` is `static` (one copy per kernel instance,
// blocks run one at a time); `extern __shared__ T x[]` is rewritten by run.sh
// to `T *x = (T *)emu_dyn_smem()`.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <cmath>
#include <functional>

#include "emu_runtime.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

struct uint3 {
    unsigned int x, y, z;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct emu_fiber_state {
    uint3 tid;
};
extern emu_fiber_state *emu_cur;
extern uint3 emu_block_idx;
extern dim3 emu_block_dim, emu_grid_dim;

#define threadIdx (emu_cur->tid)
#define blockIdx (emu_block_idx)
#define blockDim (emu_block_dim)
#define gridDim (emu_grid_dim)

void __syncthreads();
void __syncwarp(unsigned int mask = 0xffffffffu);
void emu_warp_exchange(const void *in, void *out, int src_lane, size_t size);
void *emu_dyn_smem();

// ---- support for the PTX instruction models (emu_ptx.cpp)
#define ZOFF_CUDA_EMU 1 // src/backend/cuda/cuda_ptx.cuh: use the models below, not inline PTX
constexpr size_t EMU_GATHER_MAX = 64;
void emu_warp_allgather(const void *in, void *all, size_t size);
unsigned long long emu_block_serial(); // changes with every block a launch runs
int emu_thread_linear();               // the calling thread's linear index in its block

// PTX ISA models, written from the ISA's descriptions and fragment tables (emu_ptx.cpp):
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c
void emu_mma_m16n8k16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], bool bf16);
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16 r, [row]
void emu_ldmatrix(uint32_t *r, int num, bool trans, const void *row);
// cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_size; commit_group; wait_group n
void emu_cp_async(void *dst, const void *src, int cp_size, int src_size);
void emu_cp_async_commit();
void emu_cp_async_wait(int n);

template <class T> T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    (void)mask;
    T r;
    const int lane = (int)((threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y) & 31u);
    emu_warp_exchange(&v, &r, lane ^ lane_mask, sizeof(T));
    return r;
}

inline unsigned int atomicCAS(unsigned int *addr, unsigned int cmp, unsigned int val) {
    const unsigned int old = *addr; // fibers never preempt each other
    if (old == cmp) *addr = val;
    return old;
}
inline void __threadfence_system() {}
inline void __threadfence() {}

// __fmul_rn / __fadd_rn: one IEEE rounding that nvcc never contracts into an fma (the emulated
// kernels are built with contraction: emu.cmake); the empty asm keeps the host compiler from fusing too
inline float emu_uncontracted(float p) {
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(p));
#else
    __asm__("" : "+w"(p));
#endif
    return p;
}
inline float __fmul_rn(float a, float b) { return emu_uncontracted(a * b); }
inline float __fadd_rn(float a, float b) { return emu_uncontracted(a + b); }

inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

// fp16 (IEEE binary16), round to nearest even
struct __half {
    uint16_t x;
};
inline __half __ushort_as_half(uint16_t u) { return __half{u}; }
inline uint16_t __half_as_ushort(__half h) { return h.x; }
inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, exp = (h.x >> 10) & 0x1fu, man = h.x & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else {
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return __uint_as_float(u);
}
inline __half __float2half_rn(float f) {
    const uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, au = u & 0x7fffffffu;
    if (au > 0x7f800000u) return __half{(uint16_t)(sign | 0x7e00u)};
    if (au >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00u)};
    if (au < 0x38800000u) {
        const float a = __uint_as_float(au);
        return __half{(uint16_t)(sign | (uint32_t)nearbyintf(a * 16777216.0f))};
    }
    const uint32_t mr = au + 0xfffu + ((au >> 13) & 1u);
    return __half{(uint16_t)(sign | ((mr >> 13) - (112u << 10)))};
}

// ---- launches

struct emu_cfg_t {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
};
inline emu_cfg_t emu_cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = nullptr) { return emu_cfg_t{g, b, smem, s}; }

// Runs body for every thread of every block (see above); sets the last error on a bad configuration.
void emu_run_grid(const emu_cfg_t &cfg, const std::function<void()> &body);

template <class F, class... A> void emu_launch(const emu_cfg_t &cfg, F f, A... args) {
    emu_run_grid(cfg, [&]() { f(args...); });
}

template <class T> cudaError_t cudaFuncSetAttribute(T *entry, enum cudaFuncAttribute attr, int value) {
    (void)entry;
    (void)attr;
    return value > 227 * 1024 ? cudaErrorInvalidValue : cudaSuccess;
}
