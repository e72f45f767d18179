// ATTENTION_FWD / ATTENTION_BWD on tensor cores (bf16 and f16 storage, head size 64 or
// 128): FlashAttention-2 style kernels on mma.sync.m16n8k16 with fp32 accumulation,
// ldmatrix fragment loads and cp.async double-buffered tiles (src/backend/cuda/cuda_ptx.cuh).
// Layout and semantics as cuda_attention.cu (qkv (B,T,3C), out (B,T,C), lse (B,NH,T)).
//
// Tiles: 64 query rows x 64 keys per block, 4 warps; warp w owns 16 rows of the block's
// tile (queries in the forward and dQ kernels, keys in the dK/dV kernel). Shared tiles are
// [64][D + 8] 16-bit elements: rows of D + 8 keep ldmatrix's 8 row reads on distinct banks
// and every row 16-byte aligned.
//
// Forward: one block per (b, h, query tile), longest tiles first; Q once, K/V tiles double-
// buffered with cp.async (tile kt + 1 loads while kt is used); only key tiles at or before
// the diagonal are visited (fully masked tiles are skipped); S = Q K^T and O += P V on
// tensor cores, the online softmax (running max and sum, O rescaled) in registers, P
// rounded to the storage type for the P V product (as FlashAttention-2); lse = m + log l.
//
// Backward, deterministic (no atomics): a pre-pass D_i = dout_i . out_i into scratch; a
// dK/dV kernel (one block per key tile, Q/dO tiles double-buffered over the query tiles at
// or after it: S^T = K Q^T, P^T = exp(S^T scale - lse), dV += P^T dO, dP^T = V dO^T,
// dS^T = P^T (dP^T - D), dK += dS^T Q); a dQ kernel (one block per query tile, K/V tiles
// double-buffered: S, P, dP = dO V^T, dS, dQ += dS K). The dQ kernel recomputes S and dP
// instead of accumulating dQ with float atomics in a run-dependent order.
//
// Needs: 16-byte aligned qkv and dout, C a multiple of 8 (every row 16-byte aligned), sm_80.
// zoff_cuda_attention_mma_applies() says whether a call qualifies; the caller falls back to
// the fp32 kernels otherwise.
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ptx.cuh"

using namespace zoff_cuda;

namespace {

constexpr int MT = 128; // threads per block (4 warps)
constexpr int TR = 64;  // rows of a tile (queries or keys)

template <int D> constexpr int ld_of() { return D + 8; }
template <int D> constexpr int tile_elems() { return TR * ld_of<D>(); }

template <class S> struct IsBF16 { static constexpr bool v = false; };
template <> struct IsBF16<BF16> { static constexpr bool v = true; };

// Two fp32 values as one register of two 16-bit elements (lo in the low half), rounded as S stores.
template <class S> __device__ __forceinline__ uint32_t pack2(float lo, float hi) {
    uint16_t h[2];
    S::store(h, 0, lo);
    S::store(h, 1, hi);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// rows [r0, r0 + 64) of a (T, D) head slice whose row r starts at base + r * stride, into a shared
// tile via cp.async (16 bytes a piece); rows >= T are zero-filled. Every thread of the block calls it.
template <int D> __device__ __forceinline__ void load_tile(uint16_t *dst, const uint16_t *base, int r0, int T,
                                                           int64_t stride) {
    constexpr int PER_ROW = D / 8;
    for (int c = threadIdx.x; c < TR * PER_ROW; c += MT) {
        const int r = c / PER_ROW, k = (c % PER_ROW) * 8;
        const bool ok = r0 + r < T;
        cp_async16(dst + r * ld_of<D>() + k, base + (ok ? (int64_t)(r0 + r) * stride : 0) + k, ok ? 16 : 0);
    }
}

// Double buffering of two tiles X, Y (two buffers each, TE apart): while the tile pair in buffer
// `buf` is used, the pair of tile `next` (when next < n) loads into the other one. Waits until
// buffer `buf` has arrived and the block has synchronised.
template <int D> __device__ __forceinline__ void next_pair(uint16_t *X, const uint16_t *xb, int64_t xs, uint16_t *Y,
                                                           const uint16_t *yb, int64_t ys, int buf, int next, int n,
                                                           int T) {
    if (next < n) {
        load_tile<D>(X + (buf ^ 1) * tile_elems<D>(), xb, next * TR, T, xs);
        load_tile<D>(Y + (buf ^ 1) * tile_elems<D>(), yb, next * TR, T, ys);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// acc[nt] (16 x 8 n-tiles) += A B for this warp: A = 16 rows of a shared tile (row-major, lda),
// 16*KS columns; B (k x n) given as its n rows (B[k][n] = Bn[n * ldb + k]), 8*NT of them.
template <bool BF, int NT, int KS>
__device__ __forceinline__ void mma_rows_nk(float (&acc)[NT][4], const uint16_t *A, int lda, const uint16_t *Bn,
                                            int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        uint32_t a[4];
        ldmatrix<4, false>(a, A + (lane % 16) * lda + ks * 16 + (lane / 16) * 8);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            ldmatrix<4, false>(b, Bn + (nt * 8 + (lane % 8) + (lane / 16) * 8) * ldb + ks * 16 + ((lane / 8) % 2) * 8);
            mma_m16n8k16<BF>(acc[nt], a, b, acc[nt]);
            mma_m16n8k16<BF>(acc[nt + 1], a, b + 2, acc[nt + 1]);
        }
    }
}

// acc[nt] += P B for this warp: P = 16 x 16*KS from registers in the accumulator layout (p[2*KS][4],
// rounded to the storage type), B (k x n) stored row-major in a shared tile (B[k][n] = Bk[k * ldb + n]).
template <class S, int NT, int KS>
__device__ __forceinline__ void mma_regs_kn(float (&acc)[NT][4], const float (&p)[2 * KS][4], const uint16_t *Bk,
                                            int ldb) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < KS; ks++) {
        const uint32_t a[4] = {pack2<S>(p[2 * ks][0], p[2 * ks][1]), pack2<S>(p[2 * ks][2], p[2 * ks][3]),
                               pack2<S>(p[2 * ks + 1][0], p[2 * ks + 1][1]),
                               pack2<S>(p[2 * ks + 1][2], p[2 * ks + 1][3])};
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            uint32_t b[4];
            ldmatrix<4, true>(b, Bk + (ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * ldb + nt * 8 + (lane / 16) * 8);
            mma_m16n8k16<IsBF16<S>::v>(acc[nt], a, b, acc[nt]);
            mma_m16n8k16<IsBF16<S>::v>(acc[nt + 1], a, b + 2, acc[nt + 1]);
        }
    }
}

template <int NT> __device__ __forceinline__ void zero(float (&x)[NT][4]) {
#pragma unroll
    for (int i = 0; i < NT; i++) x[i][0] = x[i][1] = x[i][2] = x[i][3] = 0.0f;
}

// Store a warp's 16 x D accumulator (rows row0 + g and row0 + g + 8, times mul) to rows < T of dst
// (row r at dst + r * stride).
template <class S, int D>
__device__ __forceinline__ void store_rows(uint16_t *dst, int64_t stride, const float (&acc)[D / 8][4], int row0,
                                           int T, float mul0, float mul1) {
    const int lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = row0 + g + 8 * half;
        if (r >= T) continue;
        const float mul = half ? mul1 : mul0;
        uint16_t *row = dst + (int64_t)r * stride;
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            S::store(row, dt * 8 + 2 * t, acc[dt][2 * half] * mul);
            S::store(row, dt * 8 + 2 * t + 1, acc[dt][2 * half + 1] * mul);
        }
    }
}

// ------------------------------------------------------------------ forward

template <class S, int D>
__global__ void __launch_bounds__(MT) mma_fwd_kernel(uint16_t *out, float *lse, const uint16_t *qkv, int T, int NH,
                                                     int nqb, float scale) {
    extern __shared__ __align__(16) uint16_t smem[];
    constexpr int LD = ld_of<D>(), TE = tile_elems<D>();
    uint16_t *Qs = smem, *Ks = smem + TE, *Vs = smem + 3 * TE; // K, V: two buffers each
    const int BH = (int)gridDim.x / nqb, qt = nqb - 1 - (int)blockIdx.x / BH, bh = (int)blockIdx.x % BH;
    const int b = bh / NH, h = bh % NH, i0 = qt * TR;
    const int64_t C = (int64_t)NH * D, C3 = 3 * C;
    const uint16_t *qb = qkv + (int64_t)b * T * C3 + (int64_t)h * D, *kb = qb + C, *vb = qb + 2 * C;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    const int r0 = i0 + warp * 16 + g; // this lane's rows: r0, r0 + 8

    load_tile<D>(Qs, qb, i0, T, C3);
    load_tile<D>(Ks, kb, 0, T, C3);
    load_tile<D>(Vs, vb, 0, T, C3);
    cp_async_commit();
    float o[D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    zero(o);
    const int nkt = qt + 1; // key tiles past the diagonal are fully masked: never visited
    for (int kt = 0; kt < nkt; kt++) {
        const int buf = kt & 1;
        next_pair<D>(Ks, kb, C3, Vs, vb, C3, buf, kt + 1, nkt, T); // the next K/V tile loads while this one is used
        float s[8][4];
        zero(s);
        mma_rows_nk<IsBF16<S>::v, 8, D / 16>(s, Qs + warp * 16 * LD, LD, Ks + buf * TE, LD);
        float mx[2] = {m[0], m[1]};
        const int j0 = kt * TR;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), i = r0 + (e >= 2 ? 8 : 0);
                const float v = (j <= i && j < T) ? s[nt][e] * scale : -INFINITY;
                s[nt][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float msafe = mx[r] == -INFINITY ? 0.0f : mx[r];
            alpha[r] = expf(m[r] - msafe);
            m[r] = mx[r];
            mx[r] = msafe;
        }
        float rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float p = expf(s[nt][e] - mx[e / 2]);
                s[nt][e] = p;
                rs[e / 2] += p;
            }
        l[0] = l[0] * alpha[0] + rs[0]; // this lane's part of the row sum (the 4 lanes of a row add up at the end)
        l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
        for (int dt = 0; dt < D / 8; dt++) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }
        mma_regs_kn<S, D / 8, 4>(o, s, Vs + buf * TE, LD);
        __syncthreads(); // every warp is done with this buffer before the next iteration refills it
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    store_rows<S, D>(out + (int64_t)b * T * C + (int64_t)h * D, C, o, i0 + warp * 16, T, 1.0f / l[0], 1.0f / l[1]);
    if (t == 0) {
        if (r0 < T) lse[(int64_t)bh * T + r0] = m[0] + logf(l[0]);
        if (r0 + 8 < T) lse[(int64_t)bh * T + r0 + 8] = m[1] + logf(l[1]);
    }
}

// ------------------------------------------------------------------ backward

// Dd (B,NH,T) = rowsum(dout * out) per head, fp32; one warp per row.
template <class S, int D>
__global__ void __launch_bounds__(MT) mma_bwd_dot_kernel(float *Dd, const uint16_t *dout, const uint16_t *out,
                                                        int64_t rows, int T, int NH) {
    const int lane = threadIdx.x & 31;
    const int64_t C = (int64_t)NH * D;
    for (int64_t row = (int64_t)blockIdx.x * (MT / 32) + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * (MT / 32)) {
        const int64_t i = row % T, bh = row / T, b = bh / NH, h = bh % NH, off = (b * T + i) * C + h * D;
        float acc = 0.0f;
        for (int d = lane; d < D; d += 32) acc += S::load(dout, off + d) * S::load(out, off + d);
        acc = warp_sum(acc);
        if (lane == 0) Dd[row] = acc;
    }
}

// dK, dV: one block per (b, h, key tile), longest first (key tile 0 sees every query tile).
template <class S, int D>
__global__ void __launch_bounds__(MT) mma_bwd_dkdv_kernel(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                                         const float *lse, const float *Dd, int T, int NH, int nb,
                                                         float scale) {
    extern __shared__ __align__(16) uint16_t smem[];
    constexpr int LD = ld_of<D>(), TE = tile_elems<D>();
    uint16_t *Ks = smem, *Vs = smem + TE, *Qs = smem + 2 * TE, *dOs = smem + 4 * TE; // Q, dO: two buffers each
    const int BH = (int)gridDim.x / nb, kt = (int)blockIdx.x / BH, bh = (int)blockIdx.x % BH;
    const int b = bh / NH, h = bh % NH, j0 = kt * TR;
    const int64_t C = (int64_t)NH * D, C3 = 3 * C;
    const uint16_t *qb = qkv + (int64_t)b * T * C3 + (int64_t)h * D, *kb = qb + C, *vb = qb + 2 * C;
    const uint16_t *ob = dout + (int64_t)b * T * C + (int64_t)h * D;
    const float *lse_h = lse + (int64_t)bh * T, *D_h = Dd + (int64_t)bh * T;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    const int r0 = j0 + warp * 16 + g; // this lane's keys: r0, r0 + 8

    load_tile<D>(Ks, kb, j0, T, C3);
    load_tile<D>(Vs, vb, j0, T, C3);
    load_tile<D>(Qs, qb, j0, T, C3);
    load_tile<D>(dOs, ob, j0, T, C);
    cp_async_commit();
    float dk[D / 8][4], dv[D / 8][4];
    zero(dk);
    zero(dv);
    for (int qt = kt, it = 0; qt < nb; qt++, it++) {
        const int buf = it & 1;
        next_pair<D>(Qs, qb, C3, dOs, ob, C, buf, qt + 1, nb, T);
        float s[8][4], dp[8][4];
        zero(s);
        zero(dp);
        mma_rows_nk<IsBF16<S>::v, 8, D / 16>(s, Ks + warp * 16 * LD, LD, Qs + buf * TE, LD);   // S^T = K Q^T
        mma_rows_nk<IsBF16<S>::v, 8, D / 16>(dp, Vs + warp * 16 * LD, LD, dOs + buf * TE, LD); // dP^T = V dO^T
        const int i0 = qt * TR;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = i0 + nt * 8 + 2 * t + (e & 1), j = r0 + (e >= 2 ? 8 : 0);
                const bool ok = j <= i && i < T && j < T;
                const float p = ok ? expf(s[nt][e] * scale - lse_h[i]) : 0.0f;
                s[nt][e] = p;
                dp[nt][e] = ok ? p * (dp[nt][e] - D_h[i]) : 0.0f;
            }
        mma_regs_kn<S, D / 8, 4>(dv, s, dOs + buf * TE, LD); // dV += P^T dO
        mma_regs_kn<S, D / 8, 4>(dk, dp, Qs + buf * TE, LD); // dK += dS^T Q
        __syncthreads();
    }
    uint16_t *dk_b = dqkv + (int64_t)b * T * C3 + C + (int64_t)h * D;
    store_rows<S, D>(dk_b, C3, dk, j0 + warp * 16, T, scale, scale);
    store_rows<S, D>(dk_b + C, C3, dv, j0 + warp * 16, T, 1.0f, 1.0f);
}

// dQ: one block per (b, h, query tile), longest first; K/V tiles at or before the diagonal.
template <class S, int D>
__global__ void __launch_bounds__(MT) mma_bwd_dq_kernel(uint16_t *dqkv, const uint16_t *dout, const uint16_t *qkv,
                                                       const float *lse, const float *Dd, int T, int NH, int nb,
                                                       float scale) {
    extern __shared__ __align__(16) uint16_t smem[];
    constexpr int LD = ld_of<D>(), TE = tile_elems<D>();
    uint16_t *Qs = smem, *dOs = smem + TE, *Ks = smem + 2 * TE, *Vs = smem + 4 * TE; // K, V: two buffers each
    const int BH = (int)gridDim.x / nb, qt = nb - 1 - (int)blockIdx.x / BH, bh = (int)blockIdx.x % BH;
    const int b = bh / NH, h = bh % NH, i0 = qt * TR;
    const int64_t C = (int64_t)NH * D, C3 = 3 * C;
    const uint16_t *qb = qkv + (int64_t)b * T * C3 + (int64_t)h * D, *kb = qb + C, *vb = qb + 2 * C;
    const uint16_t *ob = dout + (int64_t)b * T * C + (int64_t)h * D;
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane / 4, t = lane % 4;
    const int r0 = i0 + warp * 16 + g;
    float lse_r[2], D_r[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool ok = r0 + 8 * r < T;
        lse_r[r] = ok ? lse[(int64_t)bh * T + r0 + 8 * r] : 0.0f;
        D_r[r] = ok ? Dd[(int64_t)bh * T + r0 + 8 * r] : 0.0f;
    }

    load_tile<D>(Qs, qb, i0, T, C3);
    load_tile<D>(dOs, ob, i0, T, C);
    load_tile<D>(Ks, kb, 0, T, C3);
    load_tile<D>(Vs, vb, 0, T, C3);
    cp_async_commit();
    float dq[D / 8][4];
    zero(dq);
    const int nkt = qt + 1;
    for (int kt = 0; kt < nkt; kt++) {
        const int buf = kt & 1;
        next_pair<D>(Ks, kb, C3, Vs, vb, C3, buf, kt + 1, nkt, T);
        float s[8][4], dp[8][4];
        zero(s);
        zero(dp);
        mma_rows_nk<IsBF16<S>::v, 8, D / 16>(s, Qs + warp * 16 * LD, LD, Ks + buf * TE, LD);   // S = Q K^T
        mma_rows_nk<IsBF16<S>::v, 8, D / 16>(dp, dOs + warp * 16 * LD, LD, Vs + buf * TE, LD); // dP = dO V^T
        const int j0 = kt * TR;
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int j = j0 + nt * 8 + 2 * t + (e & 1), i = r0 + (e >= 2 ? 8 : 0);
                const bool ok = j <= i && i < T && j < T;
                const float p = ok ? expf(s[nt][e] * scale - lse_r[e / 2]) : 0.0f;
                s[nt][e] = ok ? p * (dp[nt][e] - D_r[e / 2]) : 0.0f; // dS
            }
        mma_regs_kn<S, D / 8, 4>(dq, s, Ks + buf * TE, LD); // dQ += dS K
        __syncthreads();
    }
    store_rows<S, D>(dqkv + (int64_t)b * T * C3 + (int64_t)h * D, C3, dq, i0 + warp * 16, T, scale, scale);
}

// ------------------------------------------------------------------ launchers

template <int D> constexpr size_t fwd_smem() { return 5 * (size_t)tile_elems<D>() * 2; }
template <int D> constexpr size_t bwd_smem() { return 6 * (size_t)tile_elems<D>() * 2; }

// set_smem bits of these kernels (cuda_common.cuh): 4 * kind (0 fwd, 1 dK/dV, 2 dQ) + 2 * (f16) + (D == 128)
template <class S, int D> constexpr int kbit(int kind) { return 4 * kind + (IsBF16<S>::v ? 0 : 2) + (D == 128 ? 1 : 0); }

template <class S, int D> zoff_status fwd(const zoff_cuda_launch *L, const zoff_op_attention_fwd_args *a) {
    const int nqb = (int)((a->T + TR - 1) / TR);
    const int64_t grid = a->B * a->NH * nqb;
    ZOFF_TRY(set_smem(L, mma_fwd_kernel<S, D>, fwd_smem<D>(), kbit<S, D>(0), "tensor-core attention forward"));
    mma_fwd_kernel<S, D><<<(unsigned int)grid, MT, fwd_smem<D>(), L->s>>>(
        (uint16_t *)a->out, a->lse, (const uint16_t *)a->qkv, (int)a->T, (int)a->NH, nqb, 1.0f / sqrtf((float)D));
    ZOFF_CUDA_CHECK_LAUNCH("mma_fwd_kernel");
    return ZOFF_OK;
}

template <class S, int D>
zoff_status bwd(const zoff_cuda_launch *L, const zoff_op_attention_bwd_args *a, float *Dd) {
    const int nb = (int)((a->T + TR - 1) / TR);
    const int64_t grid = a->B * a->NH * nb, rows = a->B * a->NH * a->T;
    const float scale = 1.0f / sqrtf((float)D);
    ZOFF_TRY(set_smem(L, mma_bwd_dkdv_kernel<S, D>, bwd_smem<D>(), kbit<S, D>(1), "tensor-core attention dK/dV"));
    ZOFF_TRY(set_smem(L, mma_bwd_dq_kernel<S, D>, bwd_smem<D>(), kbit<S, D>(2), "tensor-core attention dQ"));
    const int64_t dot_blocks = (rows + MT / 32 - 1) / (MT / 32);
    mma_bwd_dot_kernel<S, D><<<(unsigned int)(dot_blocks < 65535 ? dot_blocks : 65535), MT, 0, L->s>>>(
        Dd, (const uint16_t *)a->dout, (const uint16_t *)a->out, rows, (int)a->T, (int)a->NH);
    ZOFF_CUDA_CHECK_LAUNCH("mma_bwd_dot_kernel");
    mma_bwd_dkdv_kernel<S, D><<<(unsigned int)grid, MT, bwd_smem<D>(), L->s>>>(
        (uint16_t *)a->dqkv, (const uint16_t *)a->dout, (const uint16_t *)a->qkv, a->lse, Dd, (int)a->T, (int)a->NH,
        nb, scale);
    ZOFF_CUDA_CHECK_LAUNCH("mma_bwd_dkdv_kernel");
    mma_bwd_dq_kernel<S, D><<<(unsigned int)grid, MT, bwd_smem<D>(), L->s>>>(
        (uint16_t *)a->dqkv, (const uint16_t *)a->dout, (const uint16_t *)a->qkv, a->lse, Dd, (int)a->T, (int)a->NH,
        nb, scale);
    ZOFF_CUDA_CHECK_LAUNCH("mma_bwd_dq_kernel");
    return ZOFF_OK;
}

} // namespace

extern "C" int zoff_cuda_attention_mma_applies(const zoff_cuda_ctx *ctx, zoff_dtype dt, int64_t B, int64_t T,
                                               int64_t C, int64_t NH, const void *qkv, const void *dout) {
    if (dt != ZOFF_BF16 && dt != ZOFF_F16) return 0;
    if (ctx->cc_major < 8 || NH <= 0 || C % NH != 0 || C % 8 != 0) return 0;
    const int64_t HS = C / NH;
    if (HS != 64 && HS != 128) return 0;
    if (((uintptr_t)qkv | (uintptr_t)dout) % 16 != 0) return 0;
    const size_t need = HS == 64 ? bwd_smem<64>() : bwd_smem<128>();
    if (need > ctx->smem_optin) return 0;
    if (B * NH * ((T + TR - 1) / TR) > INT32_MAX || T > INT32_MAX / 2) return 0;
    return 1;
}

extern "C" size_t zoff_cuda_attention_mma_scratch(int64_t B, int64_t T, int64_t NH) {
    return (size_t)(B * NH * T) * sizeof(float);
}

extern "C" zoff_status zoff_cuda_attention_mma_fwd(const zoff_cuda_launch *L, const zoff_op_attention_fwd_args *a) {
    const int64_t HS = a->C / a->NH;
    if (a->dt == ZOFF_BF16) return HS == 64 ? fwd<BF16, 64>(L, a) : fwd<BF16, 128>(L, a);
    return HS == 64 ? fwd<F16, 64>(L, a) : fwd<F16, 128>(L, a);
}

extern "C" zoff_status zoff_cuda_attention_mma_bwd(const zoff_cuda_launch *L, const zoff_op_attention_bwd_args *a,
                                                   float *Dd) {
    const int64_t HS = a->C / a->NH;
    if (a->dt == ZOFF_BF16) return HS == 64 ? bwd<BF16, 64>(L, a, Dd) : bwd<BF16, 128>(L, a, Dd);
    return HS == 64 ? bwd<F16, 64>(L, a, Dd) : bwd<F16, 128>(L, a, Dd);
}
