// CUDA kernels of every zoff_op except matmul (cuda_matmul.cu) and attention
// (cuda_attention.cu), and the op dispatch zoff_cuda_run_op.
//
// Semantics are those of include/zoff/device.h; the CPU backend
// (src/backend/cpu/cpu_kernels.c) is the reference. All math is fp32 (fp64
// for GRAD_STATS); storage is f32, bf16 or f16 through the policies of
// cuda_common.cuh. Every reduction here is deterministic: a fixed grid that
// depends only on the shapes, fixed per-thread orders, partial sums combined
// in a fixed order (no floating-point atomics). The embedding backward sorts
// positions by token id (CUB radix sort, stable) and sums each token's rows in
// position order, like the CPU backend.
#include <cub/device/device_radix_sort.cuh>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_common.cuh"

using namespace zoff_cuda;

namespace {

constexpr int EW_THREADS = 256; // elementwise kernels

// Round up to a multiple of 256 bytes (carving scratch buffers).
inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

// ------------------------------------------------------------------ embedding

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) int32, wte (V,C), wpe (maxT,C).
// One block per (b,t) row (grid-stride); a row whose token is out of range is
// skipped and reported.
template <class S>
__global__ void embed_fwd_kernel(typename S::T *out, const int32_t *tokens, const typename S::T *wte,
                                 const typename S::T *wpe, int64_t BT, int64_t T, int64_t C, int64_t V, ErrRef err) {
    for (int64_t row = blockIdx.x; row < BT; row += gridDim.x) {
        const int32_t tok = tokens[row];
        if (tok < 0 || (int64_t)tok >= V) {
            if (threadIdx.x == 0) raise_error(err, ZOFF_CUDA_ERRK_TOKEN, tok, row, V, T);
            continue;
        }
        const int64_t t = row % T;
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
            S::store(out, row * C + c, S::load(wte, (int64_t)tok * C + c) + S::load(wpe, t * C + c));
    }
}

// dwpe (maxT,C) row t += sum_b dout[b,t] (b in order); dout (B,T,C). One thread per (t,c).
template <class S>
__global__ void embed_bwd_wpe_kernel(typename S::T *dwpe, const typename S::T *dout, int64_t B, int64_t T,
                                     int64_t C) {
    const int64_t n = T * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = i / C, c = i % C;
        float acc = 0.0f;
        for (int64_t b = 0; b < B; b++) acc += S::load(dout, (b * T + t) * C + c);
        S::store(dwpe, i, S::load(dwpe, i) + acc);
    }
}

// keys (BT) = token id, or V for an out-of-range id (sorted last, skipped, reported); vals (BT) = position.
__global__ void embed_bwd_keys_kernel(unsigned int *keys, unsigned int *vals, const int32_t *tokens, int64_t BT,
                                      int64_t T, int64_t V, ErrRef err) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < BT; i += (int64_t)gridDim.x * blockDim.x) {
        const int32_t tok = tokens[i];
        const bool ok = tok >= 0 && (int64_t)tok < V;
        if (!ok) raise_error(err, ZOFF_CUDA_ERRK_TOKEN, tok, i, V, T);
        keys[i] = ok ? (unsigned int)tok : (unsigned int)V;
        vals[i] = (unsigned int)i;
    }
}

// dwte (V,C): for each run of equal keys in the sorted (keys, vals) (BT), the block
// at the run's first index sums the dout (B*T,C) rows of its positions in order
// and adds the sum once.
template <class S>
__global__ void embed_bwd_wte_kernel(typename S::T *dwte, const typename S::T *dout, const unsigned int *keys,
                                     const unsigned int *vals, int64_t BT, int64_t C, int64_t V) {
    for (int64_t k = blockIdx.x; k < BT; k += gridDim.x) {
        const unsigned int tok = keys[k];
        if ((int64_t)tok >= V) continue;             // out-of-range ids (reported by the keys kernel)
        if (k > 0 && keys[k - 1] == tok) continue;   // not the head of its run
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float acc = 0.0f;
            for (int64_t r = k; r < BT && keys[r] == tok; r++) acc += S::load(dout, (int64_t)vals[r] * C + c);
            const int64_t o = (int64_t)tok * C + c;
            S::store(dwte, o, S::load(dwte, o) + acc);
        }
    }
}

template <class S> zoff_status embed_fwd(const zoff_cuda_launch *L, const zoff_op_embed_fwd_args *a) {
    typedef typename S::T T;
    const int64_t BT = a->B * a->T;
    if (BT == 0 || a->C == 0) return ZOFF_OK;
    const unsigned int grid = (unsigned int)(BT < 65535 ? BT : 65535);
    const int threads = a->C >= 256 ? 256 : a->C >= 64 ? 128 : 32;
    embed_fwd_kernel<S><<<grid, threads, 0, L->s>>>((T *)a->out, a->tokens, (const T *)a->wte, (const T *)a->wpe, BT,
                                                    a->T, a->C, a->V, err_ref(L));
    ZOFF_CUDA_CHECK_LAUNCH("embed_fwd_kernel");
    return ZOFF_OK;
}

template <class S> zoff_status embed_bwd(const zoff_cuda_launch *L, const zoff_op_embed_bwd_args *a) {
    typedef typename S::T T;
    const int64_t BT = a->B * a->T, C = a->C, V = a->V;
    if (BT == 0 || C == 0) return ZOFF_OK;
    if (a->dwpe) {
        const int64_t n = a->T * C;
        embed_bwd_wpe_kernel<S><<<flat_blocks(n, EW_THREADS), EW_THREADS, 0, L->s>>>((T *)a->dwpe, (const T *)a->dout,
                                                                                   a->B, a->T, C);
        ZOFF_CUDA_CHECK_LAUNCH("embed_bwd_wpe_kernel");
    }
    if (!a->dwte) return ZOFF_OK;
    if (BT > INT32_MAX || V >= (int64_t)UINT32_MAX)
        return zoff_error(ZOFF_ERR_UNSUPPORTED,
                          "embedding backward: B*T = %lld or V = %lld is too large for the CUDA radix sort (limit "
                          "2^31 - 1 positions, 2^32 - 1 tokens); use a smaller micro-batch",
                          (long long)BT, (long long)V);
    int end_bit = 1; // keys are in [0, V]: V < 2^end_bit
    while (end_bit < 32 && ((uint64_t)1 << end_bit) <= (uint64_t)V) end_bit++;
    const int num = (int)BT;
    size_t temp_bytes = 0;
    ZOFF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const unsigned int *)nullptr,
                                                    (unsigned int *)nullptr, (const unsigned int *)nullptr,
                                                    (unsigned int *)nullptr, num, 0, end_bit, L->s));
    const size_t vec = align256((size_t)BT * sizeof(unsigned int));
    void *scr = nullptr;
    ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, 4 * vec + align256(temp_bytes), &scr));
    char *base = (char *)scr;
    unsigned int *keys_in = (unsigned int *)base, *keys_out = (unsigned int *)(base + vec);
    unsigned int *vals_in = (unsigned int *)(base + 2 * vec), *vals_out = (unsigned int *)(base + 3 * vec);
    void *temp = base + 4 * vec;
    embed_bwd_keys_kernel<<<flat_blocks(BT, EW_THREADS), EW_THREADS, 0, L->s>>>(keys_in, vals_in, a->tokens, BT, a->T,
                                                                               V, err_ref(L));
    ZOFF_CUDA_CHECK_LAUNCH("embed_bwd_keys_kernel");
    ZOFF_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys_out, vals_in, vals_out, num, 0,
                                                    end_bit, L->s));
    const unsigned int grid = (unsigned int)(BT < 65535 ? BT : 65535);
    const int threads = C >= 256 ? 256 : C >= 64 ? 128 : 32;
    embed_bwd_wte_kernel<S><<<grid, threads, 0, L->s>>>((T *)a->dwte, (const T *)a->dout, keys_out, vals_out, BT, C,
                                                        V);
    ZOFF_CUDA_CHECK_LAUNCH("embed_bwd_wte_kernel");
    return ZOFF_OK;
}

// ------------------------------------------------------------------ layernorm

constexpr int LN_WARPS = 8;   // warps per block (one row per warp at a time)
constexpr int LN_CHUNK = 32;  // rows per chunk in the backward
constexpr int LN_MAX_BLOCKS = 1024;

// 16 bytes of storage type S: one load or store of V elements.
template <class S> union Pack16 {
    static constexpr int V = 16 / (int)sizeof(typename S::T);
    uint4 u;
    typename S::T e[V];
};

// The elements of a row a lane owns: vec (the row and every vector 16-byte aligned, C a multiple of the
// pack): packs lane, lane + 32, ... (f gets 16-byte packs of up to 4 rows); else elements lane, lane + 32, ...
// f(c0, n, packs...): n elements from column c0, packs[i] holding row i's elements (S::load(packs[i].e, j)).
template <class S, class F>
__device__ __forceinline__ void ln_lane_cols(int64_t C, int lane, bool vec, const typename S::T *r0,
                                             const typename S::T *r1, const typename S::T *r2, F &&f) {
    constexpr int V = Pack16<S>::V;
    Pack16<S> a, b, c;
    if (vec) {
        for (int64_t p = lane; p < C / V; p += 32) {
            a.u = ((const uint4 *)r0)[p];
            if (r1) b.u = ((const uint4 *)r1)[p];
            if (r2) c.u = ((const uint4 *)r2)[p];
            f(p * V, V, a, b, c);
        }
    } else {
        for (int64_t col = lane; col < C; col += 32) {
            a.e[0] = r0[col];
            if (r1) b.e[0] = r1[col];
            if (r2) c.e[0] = r2[col];
            f(col, 1, a, b, c);
        }
    }
}

// out (N,C) = (x - mean) * rstd * weight + bias; weight, bias (C) (bias may be NULL); mean, rstd (N) fp32
// (may be NULL). x (N,C) is inp when rb is NULL; else the residual inp + rb, which the warp first stores
// into resid (rounded; resid may alias inp or rb) and then normalises from what it stored, exactly as
// this kernel without rb does from resid (the fused residual: bit for bit a LAYERNORM_FWD of resid).
// One warp per row, two passes for the variance (as the CPU); vec: 16-byte loads and stores of the
// normalisation (ln_lane_cols; the same rule as without rb, so the sums run in the same order);
// rvec: 16-byte loads and stores of the residual add.
template <class S>
__global__ void __launch_bounds__(LN_WARPS * 32)
    layernorm_fwd_kernel(typename S::T *out, float *mean, float *rstd, const typename S::T *inp,
                         const typename S::T *weight, const typename S::T *bias, int64_t N, int64_t C, int vec,
                         typename S::T *resid, const typename S::T *rb, int rvec) {
    typedef typename S::T T;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int64_t row = (int64_t)blockIdx.x * LN_WARPS + warp; row < N; row += (int64_t)gridDim.x * LN_WARPS) {
        const T *x = inp + row * C;
        if (rb) {
            T *xr = resid + row * C;
            ln_lane_cols<S>(C, lane, rvec, x, rb + row * C, nullptr, [&](int64_t c0, int n, const Pack16<S> &ap, const Pack16<S> &bp, const Pack16<S> &) {
                Pack16<S> rp;
                for (int j = 0; j < n; j++) S::store(rp.e, j, S::load(ap.e, j) + S::load(bp.e, j));
                if (n == Pack16<S>::V) ((uint4 *)xr)[c0 / n] = rp.u;
                else xr[c0] = rp.e[0];
            });
            __syncwarp(); // the lanes read elements of resid other lanes wrote when vec != rvec
            x = xr;
        }
        float s = 0.0f;
        ln_lane_cols<S>(C, lane, vec, x, nullptr, nullptr, [&](int64_t, int n, const Pack16<S> &xp, const Pack16<S> &, const Pack16<S> &) {
            for (int j = 0; j < n; j++) s += S::load(xp.e, j);
        });
        const float m = warp_sum(s) / (float)C;
        float v = 0.0f;
        ln_lane_cols<S>(C, lane, vec, x, nullptr, nullptr, [&](int64_t, int n, const Pack16<S> &xp, const Pack16<S> &, const Pack16<S> &) {
            for (int j = 0; j < n; j++) {
                const float d = S::load(xp.e, j) - m;
                v += d * d;
            }
        });
        const float r = 1.0f / sqrtf(warp_sum(v) / (float)C + 1e-5f);
        T *o = out + row * C;
        ln_lane_cols<S>(C, lane, vec, x, weight, bias, [&](int64_t c0, int n, const Pack16<S> &xp, const Pack16<S> &wp, const Pack16<S> &bp) {
            Pack16<S> op;
            for (int j = 0; j < n; j++)
                S::store(op.e, j, (S::load(xp.e, j) - m) * r * S::load(wp.e, j) + (bias ? S::load(bp.e, j) : 0.0f));
            if (n == Pack16<S>::V) ((uint4 *)o)[c0 / n] = op.u;
            else o[c0] = op.e[0];
        });
        if (lane == 0) {
            if (mean) mean[row] = m;
            if (rstd) rstd[row] = r;
        }
    }
}

// Layernorm backward, part 1. Block g of G takes the LN_CHUNK-row chunks g, g+G, g+2G, ...
//   dinp (N,C) = dres + (w dy - mean(w dy) - xhat mean(w dy xhat)) * rstd   (one warp per row; dres may be
//   NULL (0) or dinp (accumulate: each element is read and written by the same lane); vec: 16-byte packs
//   (the same rule with or without dres, so the row sums run in the same order); dres16: dres when it is
//   16-byte aligned (read in packs), else NULL (a pointer of its own: the host compiler of the emulator must
//   not take dres for aligned on the element-wise path)
//   pw[g][c] = sum over the block's rows of dy * xhat, pb[g][c] = sum of dy   (one thread per column, or
//   per 16-byte pack of columns with vec, rows in order); xhat = (x - mean) * rstd. dout, inp (N,C);
//   weight (C); mean, rstd (N); pw, pb (G,C).
template <class S>
__global__ void __launch_bounds__(LN_WARPS * 32)
    layernorm_bwd_kernel(typename S::T *dinp, const typename S::T *dres, float *pw, float *pb, const typename S::T *dout,
                         const typename S::T *inp, const typename S::T *weight, const float *mean, const float *rstd,
                         int64_t N, int64_t C, int vec, const uint4 *dres16) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t nchunks = (N + LN_CHUNK - 1) / LN_CHUNK;
    if (dinp) {
        for (int64_t ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
            const int64_t r1 = (ch + 1) * LN_CHUNK < N ? (ch + 1) * LN_CHUNK : N;
            for (int64_t row = ch * LN_CHUNK + warp; row < r1; row += LN_WARPS) {
                const typename S::T *x = inp + row * C, *dy = dout + row * C;
                const float m = mean[row], r = rstd[row];
                float dm = 0.0f, dn = 0.0f;
                ln_lane_cols<S>(C, lane, vec, x, dy, weight, [&](int64_t, int n, const Pack16<S> &xp, const Pack16<S> &dyp, const Pack16<S> &wp) {
                    for (int j = 0; j < n; j++) {
                        // g rounded once (no fma with what follows), the same value as in the second
                        // pass: sum(g - dm) stays 0 and a row of one column gets exactly dres
                        const float g = __fmul_rn(S::load(wp.e, j), S::load(dyp.e, j));
                        dm += g;
                        dn += g * (S::load(xp.e, j) - m) * r;
                    }
                });
                dm = warp_sum(dm) / (float)C;
                dn = warp_sum(dn) / (float)C;
                typename S::T *dx = dinp + row * C;
                ln_lane_cols<S>(C, lane, vec, x, dy, weight, [&](int64_t c0, int n, const Pack16<S> &xp, const Pack16<S> &dyp, const Pack16<S> &wp) {
                    Pack16<S> dp;
                    if (!dres) dp.u.x = dp.u.y = dp.u.z = dp.u.w = 0u; // +0.0 in every dtype
                    else if (n == Pack16<S>::V && dres16) dp.u = dres16[(row * C + c0) / n];
                    else for (int j = 0; j < n; j++) dp.e[j] = dres[row * C + c0 + j];
                    for (int j = 0; j < n; j++) {
                        const float xh = (S::load(xp.e, j) - m) * r;
                        const float g = __fmul_rn(S::load(wp.e, j), S::load(dyp.e, j));
                        S::store(dp.e, j, S::load(dp.e, j) + (g - dm - xh * dn) * r);
                    }
                    if (n == Pack16<S>::V) ((uint4 *)dx)[c0 / n] = dp.u;
                    else dx[c0] = dp.e[0];
                });
            }
        }
    }
    if (pw && vec) { // as below, a thread per 16-byte pack of columns: the same sums in the same order
        constexpr int V = Pack16<S>::V;
        for (int64_t p = threadIdx.x; p < C / V; p += blockDim.x) {
            float aw[V], ab[V];
            for (int j = 0; j < V; j++) aw[j] = ab[j] = 0.0f;
            for (int64_t ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
                const int64_t r1 = (ch + 1) * LN_CHUNK < N ? (ch + 1) * LN_CHUNK : N;
                for (int64_t row = ch * LN_CHUNK; row < r1; row++) {
                    Pack16<S> dyp, xp;
                    dyp.u = ((const uint4 *)(dout + row * C))[p];
                    xp.u = ((const uint4 *)(inp + row * C))[p];
                    const float m = mean[row], r = rstd[row];
#pragma unroll
                    for (int j = 0; j < V; j++) {
                        const float dy = S::load(dyp.e, j);
                        aw[j] += dy * ((S::load(xp.e, j) - m) * r);
                        ab[j] += dy;
                    }
                }
            }
            for (int j = 0; j < V; j++) {
                pw[(int64_t)blockIdx.x * C + p * V + j] = aw[j];
                pb[(int64_t)blockIdx.x * C + p * V + j] = ab[j];
            }
        }
    } else if (pw) {
        for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
            float aw = 0.0f, ab = 0.0f;
            for (int64_t ch = blockIdx.x; ch < nchunks; ch += gridDim.x) {
                const int64_t r1 = (ch + 1) * LN_CHUNK < N ? (ch + 1) * LN_CHUNK : N;
                for (int64_t row = ch * LN_CHUNK; row < r1; row++) {
                    const float dy = S::load(dout, row * C + c);
                    aw += dy * ((S::load(inp, row * C + c) - mean[row]) * rstd[row]);
                    ab += dy;
                }
            }
            pw[(int64_t)blockIdx.x * C + c] = aw;
            pb[(int64_t)blockIdx.x * C + c] = ab;
        }
    }
}

// Layernorm backward, part 2: dweight (C) += sum_g pw[g] and dbias (C) += sum_g pb[g], g in order.
template <class S>
__global__ void layernorm_bwd_reduce_kernel(typename S::T *dweight, typename S::T *dbias, const float *pw,
                                            const float *pb, int64_t G, int64_t C) {
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float aw = 0.0f, ab = 0.0f;
        for (int64_t g = 0; g < G; g++) {
            aw += pw[g * C + c];
            ab += pb[g * C + c];
        }
        if (dweight) S::store(dweight, c, S::load(dweight, c) + aw);
        if (dbias) S::store(dbias, c, S::load(dbias, c) + ab);
    }
}

// 16-byte packs for the rows of C elements at these pointers (NULL pointers do not count)?
template <class S> int ln_vec(int64_t C, const void *p0, const void *p1, const void *p2, const void *p3) {
    return C % Pack16<S>::V == 0 && (((uintptr_t)p0 | (uintptr_t)p1 | (uintptr_t)p2 | (uintptr_t)p3) % 16) == 0;
}

// ZOFF_OP_LAYERNORM_FWD and ZOFF_OP_RESIDUAL_LAYERNORM_FWD (a->b != NULL): layernorm_fwd_kernel.
template <class S> zoff_status layernorm_fwd(const zoff_cuda_launch *L, const zoff_op_residual_layernorm_fwd_args *a) {
    typedef typename S::T T;
    if (a->N == 0 || a->C == 0) return ZOFF_OK;
    const int64_t nb = (a->N + LN_WARPS - 1) / LN_WARPS;
    const unsigned int grid = (unsigned int)(nb < 65535 ? nb : 65535);
    const void *x = a->b ? a->resid : a->a; // what is normalised
    const int vec = ln_vec<S>(a->C, a->out, x, a->weight, a->bias);
    const int rvec = a->b ? ln_vec<S>(a->C, a->resid, a->a, a->b, nullptr) : 0;
    layernorm_fwd_kernel<S><<<grid, LN_WARPS * 32, 0, L->s>>>((T *)a->out, a->mean, a->rstd, (const T *)a->a,
                                                              (const T *)a->weight, (const T *)a->bias, a->N, a->C,
                                                              vec, (T *)a->resid, (const T *)a->b, rvec);
    ZOFF_CUDA_CHECK_LAUNCH("layernorm_fwd_kernel");
    return ZOFF_OK;
}

// ZOFF_OP_LAYERNORM_BWD (dresid == dinp) and ZOFF_OP_RESIDUAL_LAYERNORM_BWD.
template <class S> zoff_status layernorm_bwd(const zoff_cuda_launch *L, const zoff_op_residual_layernorm_bwd_args *a) {
    typedef typename S::T T;
    const int64_t N = a->N, C = a->C;
    if (N == 0 || C == 0) return ZOFF_OK;
    const int64_t nchunks = (N + LN_CHUNK - 1) / LN_CHUNK;
    const int64_t G = nchunks < LN_MAX_BLOCKS ? nchunks : LN_MAX_BLOCKS; // depends on N only: deterministic
    float *pw = nullptr, *pb = nullptr;
    const bool params = a->dweight || a->dbias;
    if (params) {
        void *scr = nullptr;
        ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, 2 * align256((size_t)(G * C) * sizeof(float)), &scr));
        pw = (float *)scr;
        pb = (float *)((char *)scr + align256((size_t)(G * C) * sizeof(float)));
    }
    if (!a->dinp && !params) return ZOFF_OK;
    const int vec = ln_vec<S>(C, a->dinp, a->dout, a->inp, a->weight);
    const uint4 *dres16 = ((uintptr_t)a->dresid % 16) == 0 ? (const uint4 *)a->dresid : nullptr;
    layernorm_bwd_kernel<S><<<(unsigned int)G, LN_WARPS * 32, 0, L->s>>>(
        (T *)a->dinp, (const T *)a->dresid, pw, pb, (const T *)a->dout, (const T *)a->inp, (const T *)a->weight,
        a->mean, a->rstd, N, C, vec, dres16);
    ZOFF_CUDA_CHECK_LAUNCH("layernorm_bwd_kernel");
    if (params) {
        layernorm_bwd_reduce_kernel<S><<<flat_blocks(C, EW_THREADS), EW_THREADS, 0, L->s>>>(
            (T *)a->dweight, (T *)a->dbias, pw, pb, G, C);
        ZOFF_CUDA_CHECK_LAUNCH("layernorm_bwd_reduce_kernel");
    }
    return ZOFF_OK;
}

// ------------------------------------------------------------------ elementwise

#define GELU_K 0.7978845608028654f // sqrt(2/pi)

// Elementwise ops as functors f(x, y) -> out (y is 0 for one-input ops), run by ew_kernel.
struct GeluFwdF { // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    __device__ __forceinline__ float operator()(float x, float) const {
        return 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
};
struct GeluBwdF { // GELU'(x) * dy
    __device__ __forceinline__ float operator()(float x, float dy) const {
        const float th = tanhf(GELU_K * (x + 0.044715f * x * x * x));
        const float sech2 = 1.0f - th * th;
        const float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        return g * dy;
    }
};
struct AddF {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct ScaleF {
    float alpha;
    __device__ __forceinline__ float operator()(float x, float) const { return x * alpha; }
};

// out (n) = f(x, y) elementwise (y may be NULL: f(x, 0)); out may alias x or y (each element is read
// before it is written, by the same thread). vec: out, x, y are 16-byte aligned, so whole 16-byte
// packs (16 / sizeof(T) elements) move with one load or store each; the tail n % pack goes one by one.
template <class S, class F>
__global__ void ew_kernel(typename S::T *out, const typename S::T *x, const typename S::T *y, int64_t n, F f,
                          int vec) {
    typedef typename S::T T;
    constexpr int V = 16 / (int)sizeof(T);
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t done = 0;
    if (vec) {
        const int64_t np = n / V;
        for (int64_t p = first; p < np; p += stride) {
            union { uint4 u; T e[V]; } xv, yv, ov;
            xv.u = ((const uint4 *)x)[p];
            if (y) yv.u = ((const uint4 *)y)[p];
#pragma unroll
            for (int v = 0; v < V; v++) S::store(ov.e, v, f(S::load(xv.e, v), y ? S::load(yv.e, v) : 0.0f));
            ((uint4 *)out)[p] = ov.u;
        }
        done = np * V;
    }
    for (int64_t i = done + first; i < n; i += stride) S::store(out, i, f(S::load(x, i), y ? S::load(y, i) : 0.0f));
}

template <class S, class F>
zoff_status ew_launch(const zoff_cuda_launch *L, void *out, const void *x, const void *y, int64_t n, F f,
                      const char *what) {
    typedef typename S::T T;
    if (n == 0) return ZOFF_OK;
    const int vec = (((uintptr_t)out | (uintptr_t)x | (uintptr_t)y) % 16) == 0;
    const int64_t items = vec ? (n + 16 / (int64_t)sizeof(T) - 1) / (16 / (int64_t)sizeof(T)) : n;
    ew_kernel<S, F><<<flat_blocks(items, EW_THREADS), EW_THREADS, 0, L->s>>>((T *)out, (const T *)x, (const T *)y,
                                                                            n, f, vec);
    ZOFF_CUDA_CHECK_LAUNCH(what);
    return ZOFF_OK;
}

// CAST_V elements of storage type T: 16 bytes of a 16-bit type, 32 of fp32 (CAST_V / (16 / sizeof(T)) uint4).
constexpr int CAST_V = 8;
template <class T> union CastPack {
    static constexpr int U = CAST_V * (int)sizeof(T) / 16;
    uint4 u[U];
    T e[CAST_V];
};

// dst (n) of D = src (n) of Sd, round to nearest even (exact through fp32: every
// bf16/f16 value is an fp32 value). dst == src is allowed (same index read, then written, by
// one thread). vec: dst and src 16-byte aligned, so CAST_V elements move with 16-byte loads and
// stores; the tail n % CAST_V goes one by one.
template <class D, class Sd>
__global__ void cast_kernel(typename D::T *dst, const typename Sd::T *src, int64_t n, int vec) {
    typedef CastPack<typename Sd::T> PS;
    typedef CastPack<typename D::T> PD;
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    int64_t done = 0;
    if (vec) {
        const int64_t np = n / CAST_V;
        for (int64_t p = first; p < np; p += stride) {
            PS sv;
            PD dv;
#pragma unroll
            for (int k = 0; k < PS::U; k++) sv.u[k] = ((const uint4 *)src)[p * PS::U + k];
#pragma unroll
            for (int v = 0; v < CAST_V; v++) D::store(dv.e, v, Sd::load(sv.e, v));
#pragma unroll
            for (int k = 0; k < PD::U; k++) ((uint4 *)dst)[p * PD::U + k] = dv.u[k];
        }
        done = np * CAST_V;
    }
    for (int64_t i = done + first; i < n; i += stride) D::store(dst, i, Sd::load(src, i));
}

template <class S> zoff_status gelu_fwd(const zoff_cuda_launch *L, const zoff_op_gelu_fwd_args *a) {
    return ew_launch<S>(L, a->out, a->inp, nullptr, a->n, GeluFwdF(), "ew_kernel (gelu_fwd)");
}

// dinp (n) = GELU'(inp) * dout; dinp may alias dout.
template <class S> zoff_status gelu_bwd(const zoff_cuda_launch *L, const zoff_op_gelu_bwd_args *a) {
    return ew_launch<S>(L, a->dinp, a->inp, a->dout, a->n, GeluBwdF(), "ew_kernel (gelu_bwd)");
}

// out (n) = a + b; out may alias a or b.
template <class S> zoff_status add_op(const zoff_cuda_launch *L, const zoff_op_add_args *a) {
    return ew_launch<S>(L, a->out, a->a, a->b, a->n, AddF(), "ew_kernel (add)");
}

// x (n) *= alpha.
template <class S> zoff_status scale_op(const zoff_cuda_launch *L, const zoff_op_scale_args *a) {
    ScaleF f;
    f.alpha = a->alpha;
    return ew_launch<S>(L, a->x, a->x, nullptr, a->n, f, "ew_kernel (scale)");
}

template <class D, class Sd> zoff_status cast_typed(const zoff_cuda_launch *L, void *dst, const void *src, int64_t n) {
    const int vec = (((uintptr_t)dst | (uintptr_t)src) % 16) == 0;
    const int64_t items = vec ? (n + CAST_V - 1) / CAST_V : n;
    cast_kernel<D, Sd><<<flat_blocks(items, EW_THREADS), EW_THREADS, 0, L->s>>>((typename D::T *)dst,
                                                                              (const typename Sd::T *)src, n, vec);
    ZOFF_CUDA_CHECK_LAUNCH("cast_kernel");
    return ZOFF_OK;
}

zoff_status cast_op(const zoff_cuda_launch *L, const zoff_op_cast_args *a) {
    const int64_t n = a->n;
    if (n == 0) return ZOFF_OK;
    const size_t ds = zoff_dtype_size(a->dst_dt), ss = zoff_dtype_size(a->src_dt);
    const char *d = (const char *)a->dst, *s = (const char *)a->src;
    const size_t db = (size_t)n * ds, sb = (size_t)n * ss;
    const bool overlap = d < s + sb && s < d + db;
    if (a->dst_dt == a->src_dt) {
        if (d == s) return ZOFF_OK;
        if (!overlap) {
            ZOFF_CUDA_CHECK(cudaMemcpyAsync(a->dst, a->src, db, cudaMemcpyDeviceToDevice, L->s));
            return ZOFF_OK;
        }
        void *tmp = nullptr; // overlapping copy (memmove): through the stream's scratch
        ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, db, &tmp));
        ZOFF_CUDA_CHECK(cudaMemcpyAsync(tmp, a->src, db, cudaMemcpyDeviceToDevice, L->s));
        ZOFF_CUDA_CHECK(cudaMemcpyAsync(a->dst, tmp, db, cudaMemcpyDeviceToDevice, L->s));
        return ZOFF_OK;
    }
    if (overlap && d != s)
        return zoff_error(ZOFF_ERR_INVALID,
                          "cast: source and destination overlap without being the same buffer (%s -> %s); use "
                          "separate buffers or cast in place",
                          zoff_dtype_name(a->src_dt), zoff_dtype_name(a->dst_dt));
    if (d == s && ds != ss)
        return zoff_error(ZOFF_ERR_INVALID, "cast: in-place cast with different element sizes (%s -> %s); use "
                                            "separate buffers", zoff_dtype_name(a->src_dt), zoff_dtype_name(a->dst_dt));
    ZOFF_CUDA_DISPATCH(a->dst_dt, D, ZOFF_CUDA_DISPATCH(a->src_dt, Sd, return cast_typed<D, Sd>(L, a->dst, a->src, n)));
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "cast: %s -> %s is not supported by the CUDA backend; use f32, bf16 or f16",
                      zoff_dtype_name(a->src_dt), zoff_dtype_name(a->dst_dt));
}

// ------------------------------------------------------------------ cross entropy

constexpr int CE_THREADS = 512;

// Combine two (max, sum of exp(x - max)) pairs. A side with max -inf is empty: it adds s * 0,
// nothing, or the NaN it holds (a NaN logit makes the loss and the gradient NaN).
__device__ __forceinline__ void lse_combine(float &m, float &s, float m2, float s2) {
    const float M = fmaxf(m, m2);
    const float a = m == -INFINITY ? s * 0.0f : s * expf(m - M);
    const float b = m2 == -INFINITY ? s2 * 0.0f : s2 * expf(m2 - M);
    s = a + b;
    m = M;
}

// Fold the first n of v into (m, s): the pack's max, then one rescale of s (online softmax).
template <int W> __device__ __forceinline__ void lse_fold(float &m, float &s, const float (&v)[W], int n) {
    float pm = -INFINITY, ps = 0.0f;
#pragma unroll
    for (int j = 0; j < W; j++)
        if (j < n) pm = fmaxf(pm, v[j]);
#pragma unroll
    for (int j = 0; j < W; j++)
        if (j < n && v[j] != -INFINITY) ps += expf(v[j] - pm); // NaN - pm is NaN: kept
    lse_combine(m, s, pm, ps);
}

// losses (N) fp32 = logsumexp(logits[i,:V]) - logits[i,target]; logits (N,Vp); targets (N) int32.
// dlogits (N,Vp) (may be NULL, may alias logits) = (softmax - onehot(target)) * dloss, padded
// columns 0. target < 0: loss 0, gradient row 0. target >= V: reported, row left as loss 0 / zeros.
// llm.c's fused classifier: one block per row (grid-stride); pass 1 reads the row once for an online
// (max, sum) per thread, combined over the block; pass 2 reads it again and writes the gradient (each
// element is read and written by the same thread); no softmax is stored. vec (logits and dlogits
// 16-byte aligned, Vp a multiple of the pack): 16-byte loads and stores of whole packs (pass 1 masks
// the columns >= V of the last pack holding real ones; pass 2 stores zero packs past it).
template <class S>
__global__ void __launch_bounds__(CE_THREADS)
    cross_entropy_kernel(float *losses, typename S::T *dlogits, const typename S::T *logits, const int32_t *targets,
                         int64_t N, int64_t V, int64_t Vp, float dloss, int vec, ErrRef err) {
    typedef typename S::T T;
    constexpr int W = Pack16<S>::V;
    __shared__ float sm[CE_THREADS / 32], ss[CE_THREADS / 32];
    __shared__ float s_lt, s_max, s_sum;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int64_t nreal = vec ? (V + W - 1) / W : V, nall = vec ? Vp / W : Vp; // packs (vec) or elements
    for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
        const int32_t tgt = targets[row]; // the same for the whole block: branches below are uniform
        const T *l = logits + row * Vp;
        T *d = dlogits ? dlogits + row * Vp : nullptr;
        if (tgt < 0 || (int64_t)tgt >= V) {
            if (threadIdx.x == 0) {
                if ((int64_t)tgt >= V) raise_error(err, ZOFF_CUDA_ERRK_TARGET, tgt, row, V, 0);
                if (losses) losses[row] = 0.0f;
            }
            if (d) {
                const Pack16<S> z = {}; // +0 in every dtype
                for (int64_t p = threadIdx.x; p < nall; p += blockDim.x)
                    if (vec) ((uint4 *)d)[p] = z.u;
                    else d[p] = z.e[0];
            }
            continue;
        }
        if (threadIdx.x == 0) s_lt = S::load(l, tgt); // read before any thread writes d (d may alias l)
        float m = -INFINITY, s = 0.0f;
        for (int64_t p = threadIdx.x; p < nreal; p += blockDim.x) {
            if (vec) {
                Pack16<S> x;
                x.u = ((const uint4 *)l)[p];
                float v[W];
#pragma unroll
                for (int j = 0; j < W; j++) v[j] = S::load(x.e, j);
                const int64_t rem = V - p * W; // >= 1
                lse_fold<W>(m, s, v, rem < W ? (int)rem : W);
            } else {
                const float v[1] = {S::load(l, p)};
                lse_fold<1>(m, s, v, 1);
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            lse_combine(m, s, m2, s2);
        }
        if (lane == 0) {
            sm[warp] = m;
            ss[warp] = s;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float M = sm[0], Ssum = ss[0];
            for (int w = 1; w < nwarps; w++) lse_combine(M, Ssum, sm[w], ss[w]);
            s_max = M;
            s_sum = Ssum;
            if (losses) losses[row] = M + logf(Ssum) - s_lt;
        }
        __syncthreads();
        if (d) {
            const float M = s_max, sc = dloss / s_sum;
            // (softmax - onehot) * dloss of column j < V holding logit x; 0 past V
            auto grad = [&](int64_t j, float x) {
                float g = 0.0f;
                if (j < V) {
                    g = expf(x - M) * sc;
                    if (j == tgt) g -= dloss;
                }
                return g;
            };
            for (int64_t p = threadIdx.x; p < nall; p += blockDim.x) {
                if (vec) {
                    Pack16<S> x = {}, o;
                    if (p < nreal) x.u = ((const uint4 *)l)[p];
#pragma unroll
                    for (int j = 0; j < W; j++) S::store(o.e, j, p < nreal ? grad(p * W + j, S::load(x.e, j)) : 0.0f);
                    ((uint4 *)d)[p] = o.u;
                } else {
                    S::store(d, p, grad(p, S::load(l, p)));
                }
            }
        }
        __syncthreads(); // shared values are rewritten for the next row
    }
}

template <class S> zoff_status cross_entropy(const zoff_cuda_launch *L, const zoff_op_cross_entropy_args *a) {
    typedef typename S::T T;
    if (a->N == 0) return ZOFF_OK;
    const unsigned int grid = (unsigned int)(a->N < 65535 ? a->N : 65535);
    const int vec = ln_vec<S>(a->Vp, a->logits, a->dlogits, nullptr, nullptr);
    cross_entropy_kernel<S><<<grid, CE_THREADS, 0, L->s>>>(a->losses, (T *)a->dlogits, (const T *)a->logits,
                                                           a->targets, a->N, a->V, a->Vp, a->dloss, vec,
                                                           err_ref(L));
    ZOFF_CUDA_CHECK_LAUNCH("cross_entropy_kernel");
    return ZOFF_OK;
}

// ------------------------------------------------------------------ grad stats

constexpr int GS_THREADS = 256;
constexpr int GS_MAX_BLOCKS = 1024;

__device__ __forceinline__ double block_sum_double(double v, double *sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double t = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += sh[w];
    return t; // valid in thread 0
}

// part[blockIdx.x] = sum of x^2 over the block's grid-stride elements, in fp64; x (n).
template <class S> __global__ void __launch_bounds__(GS_THREADS)
    grad_stats_part_kernel(double *part, const typename S::T *x, int64_t n) {
    __shared__ double sh[GS_THREADS / 32];
    double acc = 0.0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const double v = (double)S::load(x, i);
        acc += v * v;
    }
    const double t = block_sum_double(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = t;
}

// stats[0] += sum of part (G) in a fixed order; stats[1] = 1 if the sum is not finite (inf/NaN input:
// squares of finite fp32 values cannot overflow fp64).
__global__ void __launch_bounds__(GS_THREADS) grad_stats_final_kernel(float *stats, const double *part, int64_t G) {
    __shared__ double sh[GS_THREADS / 32];
    double acc = 0.0;
    for (int64_t g = threadIdx.x; g < G; g += blockDim.x) acc += part[g];
    const double total = block_sum_double(acc, sh);
    if (threadIdx.x == 0) {
        if (!isfinite(total)) stats[1] = 1.0f;
        stats[0] = (float)((double)stats[0] + total);
    }
}

template <class S> zoff_status grad_stats(const zoff_cuda_launch *L, const zoff_op_grad_stats_args *a) {
    typedef typename S::T T;
    if (a->n == 0) return ZOFF_OK;
    const int64_t want = (a->n + GS_THREADS * 16 - 1) / (GS_THREADS * 16);
    const int64_t G = want < GS_MAX_BLOCKS ? want : GS_MAX_BLOCKS; // depends on n only: deterministic
    void *scr = nullptr;
    ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, (size_t)G * sizeof(double), &scr));
    grad_stats_part_kernel<S><<<(unsigned int)G, GS_THREADS, 0, L->s>>>((double *)scr, (const T *)a->x, a->n);
    ZOFF_CUDA_CHECK_LAUNCH("grad_stats_part_kernel");
    grad_stats_final_kernel<<<1, GS_THREADS, 0, L->s>>>(a->stats, (const double *)scr, G);
    ZOFF_CUDA_CHECK_LAUNCH("grad_stats_final_kernel");
    return ZOFF_OK;
}

// ------------------------------------------------------------------ adam

// Fused Adam/AdamW (device.h): params, m, v fp32 (n); grads (n) of G; params16 (n) of p16_dt or NULL.
template <class G>
__global__ void adam_kernel(float *p, float *m, float *v, const typename G::T *grads, void *params16, int p16_dt,
                            int64_t n, float lr, float b1, float b2, float eps, float wd, float ibc1, float ibc2,
                            float gs, int adamw) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float gi = G::load(grads, i) * gs, pi = p[i];
        if (!adamw) gi += wd * pi;
        const float mi = b1 * m[i] + (1.0f - b1) * gi;
        const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        if (adamw) pi -= lr * wd * pi;
        pi -= lr * (mi * ibc1) / (sqrtf(vi * ibc2) + eps);
        p[i] = pi;
        if (params16) {
            if (p16_dt == ZOFF_BF16) BF16::store((uint16_t *)params16, i, pi);
            else if (p16_dt == ZOFF_F16) F16::store((uint16_t *)params16, i, pi);
            else F32::store((float *)params16, i, pi);
        }
    }
}

template <class G> zoff_status adam(const zoff_cuda_launch *L, const zoff_op_adam_args *a) {
    if (a->n == 0) return ZOFF_OK;
    adam_kernel<G><<<flat_blocks(a->n, EW_THREADS), EW_THREADS, 0, L->s>>>(
        a->params, a->m, a->v, (const typename G::T *)a->grads, a->params16, (int)a->p16_dt, a->n, a->lr, a->beta1,
        a->beta2, a->eps, a->weight_decay, 1.0f / a->bc1, 1.0f / a->bc2, a->grad_scale, a->adam_w_mode);
    ZOFF_CUDA_CHECK_LAUNCH("adam_kernel");
    return ZOFF_OK;
}

// ------------------------------------------------------------------ residual + layernorm

// RESIDUAL_LAYERNORM_FWD; fused: one layernorm_fwd_kernel, else the unfused path (ADD, then LayerNorm of resid).
template <class S>
zoff_status resid_ln_fwd(const zoff_cuda_launch *L, const zoff_op_residual_layernorm_fwd_args *a, bool fused) {
    if (fused) return layernorm_fwd<S>(L, a);
    ZOFF_TRY(ew_launch<S>(L, a->resid, a->a, a->b, a->N * a->C, AddF(), "ew_kernel (add)"));
    zoff_op_residual_layernorm_fwd_args r = *a;
    r.a = a->resid;
    r.b = nullptr;
    return layernorm_fwd<S>(L, &r);
}

// RESIDUAL_LAYERNORM_BWD; fused: one pass from dresid, else a copy (memset) of dresid into dinp, then
// the accumulating LayerNorm backward (LAYERNORM_BWD).
template <class S>
zoff_status resid_ln_bwd(const zoff_cuda_launch *L, const zoff_op_residual_layernorm_bwd_args *a, bool fused) {
    if (fused || a->dresid == a->dinp) return layernorm_bwd<S>(L, a);
    const size_t bytes = (size_t)(a->N * a->C) * sizeof(typename S::T);
    if (a->dresid) ZOFF_CUDA_CHECK(cudaMemcpyAsync(a->dinp, a->dresid, bytes, cudaMemcpyDeviceToDevice, L->s));
    else ZOFF_CUDA_CHECK(cudaMemsetAsync(a->dinp, 0, bytes, L->s));
    zoff_op_residual_layernorm_bwd_args r = *a;
    r.dresid = a->dinp;
    return layernorm_bwd<S>(L, &r);
}

// The start-up comparison: on L's stream, bf16, N = 37 rows of C = 200 (16-byte packs) and C = 100
// (element-wise), the fused kernels (k = 0) and the unfused path (k = 1) must give the same bits:
// forward (resid, out, mean, rstd), backward from a dresid and from none (dinp, dweight, dbias).
zoff_status fused_ln_compare(const zoff_cuda_launch *L, bool *same) {
    *same = true;
    for (int64_t C = 200; C >= 100; C -= 100) {
        const int64_t N = 37, n = N * C;
        enum { A, B, W, BI, DY, DR, RES0, RES1, OUT0, OUT1, DX0, DX1, DN0, DN1, DW0, DW1, DB0, DB1, NBUF };
        std::vector<uint16_t> h((size_t)(NBUF * n)), g((size_t)(NBUF * n));
        uint64_t r = 0x2545f4914f6cdd1dull + (uint64_t)C;
        for (int64_t i = 0; i < (DR + 1) * n; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            h[(size_t)i] = zoff_f32_to_bf16((float)((r >> 40) * 0x1.0p-24) * 4.0f - 1.5f);
        }
        uint16_t *d = nullptr;
        float *st = nullptr; // mean, rstd per k
        ZOFF_CUDA_CHECK(cudaMalloc((void **)&d, h.size() * 2));
        zoff_status s = ZOFF_OK;
        if (cudaMalloc((void **)&st, (size_t)(4 * N) * 4) != cudaSuccess) s = zoff_error(ZOFF_ERR_DEVICE, "cudaMalloc");
        auto at = [&](int i) { return d + (size_t)i * (size_t)n; };
        if (s == ZOFF_OK && (cudaMemcpyAsync(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice, L->s) != cudaSuccess ||
                             cudaMemsetAsync(at(DW0), 0, (size_t)(4 * n) * 2, L->s) != cudaSuccess))
            s = zoff_error(ZOFF_ERR_DEVICE, "fused LayerNorm start-up check: copy failed");
        for (int k = 0; k < 2 && s == ZOFF_OK; k++) {
            zoff_op_residual_layernorm_fwd_args f = {};
            f.resid = at(RES0 + k), f.out = at(OUT0 + k), f.mean = st + 2 * k * N, f.rstd = st + (2 * k + 1) * N;
            f.a = at(A), f.b = at(B), f.weight = at(W), f.bias = at(BI), f.N = N, f.C = C, f.dt = ZOFF_BF16;
            s = resid_ln_fwd<BF16>(L, &f, k == 0);
            for (int dn = 0; dn < 2 && s == ZOFF_OK; dn++) {
                zoff_op_residual_layernorm_bwd_args b = {};
                b.dinp = at((dn ? DN0 : DX0) + k), b.dresid = dn ? nullptr : at(DR), b.dweight = at(DW0 + k);
                b.dbias = at(DB0 + k), b.dout = at(DY), b.inp = at(RES0 + k), b.weight = at(W), b.mean = f.mean;
                b.rstd = f.rstd, b.N = N, b.C = C, b.dt = ZOFF_BF16;
                s = resid_ln_bwd<BF16>(L, &b, k == 0);
            }
        }
        std::vector<float> hs((size_t)(4 * N));
        if (s == ZOFF_OK && (cudaMemcpyAsync(g.data(), d, g.size() * 2, cudaMemcpyDeviceToHost, L->s) != cudaSuccess ||
                             cudaMemcpyAsync(hs.data(), st, hs.size() * 4, cudaMemcpyDeviceToHost, L->s) != cudaSuccess ||
                             cudaStreamSynchronize(L->s) != cudaSuccess))
            s = zoff_error(ZOFF_ERR_DEVICE, "fused LayerNorm start-up check: copy back failed");
        cudaFree(d);
        cudaFree(st);
        ZOFF_TRY(s);
        for (int i = RES0; i < NBUF; i += 2) // the pairs (k = 0, k = 1); dweight and dbias hold C values
            if (memcmp(&g[(size_t)i * n], &g[(size_t)(i + 1) * n], (size_t)(i >= DW0 ? C : n) * 2)) *same = false;
        if (memcmp(&hs[0], &hs[(size_t)(2 * N)], (size_t)(2 * N) * 4)) *same = false;
    }
    return ZOFF_OK;
}

// Fused kernels for this call? In auto mode the first call compares them (once per context, under ctx->mu).
zoff_status use_fused_ln(const zoff_cuda_launch *L, bool *fused) {
    zoff_cuda_ctx *ctx = L->ctx;
    *fused = false;
    if (ctx->fused_ln_mode == ZOFF_CUDA_FUSED_LN_OFF) return ZOFF_OK;
    if (__atomic_load_n(&ctx->fused_ln_state, __ATOMIC_ACQUIRE) == 0) {
        pthread_mutex_lock(&ctx->mu);
        zoff_status st = ZOFF_OK;
        if (ctx->fused_ln_state == 0) {
            bool same = false;
            st = fused_ln_compare(L, &same);
            if (st == ZOFF_OK) {
                if (!same)
                    fprintf(stderr, "zoff: WARNING: %s: the fused residual + LayerNorm kernels disagree with the unfused "
                                    "path on the start-up case; using the unfused path (slower); please report this "
                                    "(ZOFF_CUDA_FUSED_LN=off silences it)\n", ctx->name);
                __atomic_store_n(&ctx->fused_ln_state, same ? 1 : 2, __ATOMIC_RELEASE);
            }
        }
        pthread_mutex_unlock(&ctx->mu);
        ZOFF_TRY(st);
    }
    *fused = __atomic_load_n(&ctx->fused_ln_state, __ATOMIC_ACQUIRE) == 1;
    return ZOFF_OK;
}

zoff_status unsupported_dt(zoff_op op, const char *role, zoff_dtype dt) {
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: %s dtype %s (%d) is not supported by the CUDA backend; use f32, bf16 or f16",
                      zoff_op_name(op), role, (unsigned)dt < ZOFF_DTYPE_COUNT ? zoff_dtype_name(dt) : "invalid",
                      (int)dt);
}

} // namespace

extern "C" zoff_status zoff_cuda_run_op(const zoff_cuda_launch *L, const void *args) {
    const zoff_op op = L->op;
    switch (op) {
    case ZOFF_OP_EMBED_FWD: {
        const zoff_op_embed_fwd_args *a = (const zoff_op_embed_fwd_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return embed_fwd<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_EMBED_BWD: {
        const zoff_op_embed_bwd_args *a = (const zoff_op_embed_bwd_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return embed_bwd<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_LAYERNORM_FWD: {
        const zoff_op_layernorm_fwd_args *a = (const zoff_op_layernorm_fwd_args *)args;
        zoff_op_residual_layernorm_fwd_args r = {};
        r.out = a->out; r.mean = a->mean; r.rstd = a->rstd; r.a = a->inp; r.weight = a->weight; r.bias = a->bias;
        r.N = a->N; r.C = a->C; r.dt = a->dt;
        ZOFF_CUDA_DISPATCH(a->dt, S, return layernorm_fwd<S>(L, &r));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_LAYERNORM_BWD: {
        const zoff_op_layernorm_bwd_args *a = (const zoff_op_layernorm_bwd_args *)args;
        zoff_op_residual_layernorm_bwd_args r = {};
        r.dinp = a->dinp; r.dresid = a->dinp; r.dweight = a->dweight; r.dbias = a->dbias; r.dout = a->dout;
        r.inp = a->inp; r.weight = a->weight; r.mean = a->mean; r.rstd = a->rstd; r.N = a->N; r.C = a->C;
        r.dt = a->dt;
        ZOFF_CUDA_DISPATCH(a->dt, S, return layernorm_bwd<S>(L, &r));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_MATMUL_FWD:
        return zoff_cuda_matmul_fwd(L, (const zoff_op_matmul_fwd_args *)args);
    case ZOFF_OP_MATMUL_BWD:
        return zoff_cuda_matmul_bwd(L, (const zoff_op_matmul_bwd_args *)args);
    case ZOFF_OP_ATTENTION_FWD:
        return zoff_cuda_attention_fwd(L, (const zoff_op_attention_fwd_args *)args);
    case ZOFF_OP_ATTENTION_BWD:
        return zoff_cuda_attention_bwd(L, (const zoff_op_attention_bwd_args *)args);
    case ZOFF_OP_GELU_FWD: {
        const zoff_op_gelu_fwd_args *a = (const zoff_op_gelu_fwd_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return gelu_fwd<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_GELU_BWD: {
        const zoff_op_gelu_bwd_args *a = (const zoff_op_gelu_bwd_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return gelu_bwd<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_ADD: {
        const zoff_op_add_args *a = (const zoff_op_add_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return add_op<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_CROSS_ENTROPY: {
        const zoff_op_cross_entropy_args *a = (const zoff_op_cross_entropy_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return cross_entropy<S>(L, a));
        return unsupported_dt(op, "logits", a->dt);
    }
    case ZOFF_OP_CAST:
        return cast_op(L, (const zoff_op_cast_args *)args);
    case ZOFF_OP_SCALE: {
        const zoff_op_scale_args *a = (const zoff_op_scale_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return scale_op<S>(L, a));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_GRAD_STATS: {
        const zoff_op_grad_stats_args *a = (const zoff_op_grad_stats_args *)args;
        ZOFF_CUDA_DISPATCH(a->dt, S, return grad_stats<S>(L, a));
        return unsupported_dt(op, "gradient", a->dt);
    }
    case ZOFF_OP_ADAM: {
        const zoff_op_adam_args *a = (const zoff_op_adam_args *)args;
        if (a->params16 && a->p16_dt != ZOFF_F32 && a->p16_dt != ZOFF_BF16 && a->p16_dt != ZOFF_F16)
            return unsupported_dt(op, "params16", a->p16_dt);
        ZOFF_CUDA_DISPATCH(a->grad_dt, G, return adam<G>(L, a));
        return unsupported_dt(op, "gradient", a->grad_dt);
    }
    case ZOFF_OP_RESIDUAL_LAYERNORM_FWD: {
        const zoff_op_residual_layernorm_fwd_args *a = (const zoff_op_residual_layernorm_fwd_args *)args;
        bool fused = false;
        if (a->N > 0 && a->C > 0) ZOFF_TRY(use_fused_ln(L, &fused));
        ZOFF_CUDA_DISPATCH(a->dt, S, return resid_ln_fwd<S>(L, a, fused));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_RESIDUAL_LAYERNORM_BWD: {
        const zoff_op_residual_layernorm_bwd_args *a = (const zoff_op_residual_layernorm_bwd_args *)args;
        bool fused = false;
        if (a->N > 0 && a->C > 0) ZOFF_TRY(use_fused_ln(L, &fused));
        ZOFF_CUDA_DISPATCH(a->dt, S, return resid_ln_bwd<S>(L, a, fused));
        return unsupported_dt(op, "storage", a->dt);
    }
    case ZOFF_OP_COUNT:
        break;
    }
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "CUDA backend: unknown op code %d; valid ops are 0..%d", (int)op,
                      (int)ZOFF_OP_COUNT - 1);
}
