// Tensor-core and asynchronous-copy instructions for the CUDA kernels: thin device
// wrappers around inline PTX under nvcc (sm_80 and newer), and around the CPU
// emulator's models of the same instructions (tests/cuda_emu/emu_ptx.cpp, written
// from the PTX ISA) when the emulator compiles the kernels (ZOFF_CUDA_EMU).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit floating-point inputs), with
// g = lane / 4 and t = lane % 4; a 32-bit register holds two 16-bit elements, the
// lower-indexed one in its low half:
//   A 16x16 row-major, a[0..3]: (g, 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..)
//   B 16x8 (k x n), b[0..1]:    (k = 2t..2t+1, n = g), (k = 2t+8..2t+9, n = g)
//   C/D 16x8 fp32, c[0..3]:     (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// ldmatrix .x4: lanes 8m..8m+7 give the 8 row addresses of matrix m (16 bytes each,
// 16-byte aligned); register m of a lane holds row lane/4, columns 2(lane%4), +1 of
// matrix m (.trans: of the transposed matrix).
#pragma once

#include <stdint.h>

namespace zoff_cuda {

#if defined(ZOFF_CUDA_EMU)
#define ZOFF_PTX_HAVE_MMA 1
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ZOFF_PTX_HAVE_MMA 1
#endif

// d = A B + c, fp32 accumulation; BF16: the inputs are bf16, else f16.
template <bool BF16>
static __device__ __forceinline__ void mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                    const float c[4]) {
#if defined(ZOFF_CUDA_EMU)
    emu_mma_m16n8k16_f32(d, a, b, c, BF16);
#elif defined(ZOFF_PTX_HAVE_MMA)
    if (BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%11,%12,%13};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                       "f"(c[2]), "f"(c[3]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%10,%11,%12,%13};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                       "f"(c[2]), "f"(c[3]));
#else
    __trap(); // never launched below sm_80 (the backend checks the compute capability)
#endif
}

#if !defined(ZOFF_CUDA_EMU)
static __device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
#endif

// ldmatrix.sync.aligned.m8n8.x{N}{.trans}.shared.b16; row: this lane's row address (see above).
template <int N, bool TRANS> static __device__ __forceinline__ void ldmatrix(uint32_t r[N], const void *row) {
    static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(ZOFF_CUDA_EMU)
    emu_ldmatrix(r, N, TRANS, row);
#elif defined(ZOFF_PTX_HAVE_MMA)
    const uint32_t a = smem_addr(row);
    if (N == 4 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else if (N == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else if (N == 2 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    else if (N == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(a));
    else if (!TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(a));
#else
    __trap();
#endif
}

// 16 bytes from global (16-byte aligned) to shared (16-byte aligned), asynchronously; only the first
// src_bytes (0 or 16) are read, the rest is zero-filled (rows past the end of a tensor).
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes) {
#if defined(ZOFF_CUDA_EMU)
    emu_cp_async(dst, src, 16, src_bytes);
#elif defined(ZOFF_PTX_HAVE_MMA)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
#else
    __trap();
#endif
}

static __device__ __forceinline__ void cp_async_commit() {
#if defined(ZOFF_CUDA_EMU)
    emu_cp_async_commit();
#elif defined(ZOFF_PTX_HAVE_MMA)
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most N of this thread's committed groups are pending.
template <int N> static __device__ __forceinline__ void cp_async_wait() {
#if defined(ZOFF_CUDA_EMU)
    emu_cp_async_wait(N);
#elif defined(ZOFF_PTX_HAVE_MMA)
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

} // namespace zoff_cuda
