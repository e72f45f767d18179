// The emulator's PTX models (emu_ptx.cpp) against a scalar reference: each lane's registers
// are built (and read back) here from the fragment tables of the PTX ISA, independently of
// emu_ptx.cpp and of the kernels; the products are checked against double precision.
// Also the kernels' wrappers (src/backend/cuda/cuda_ptx.cuh) on the emulator: ldmatrix
// feeding mma as the attention kernels do; the emulated cuBLASLt's epilogues. Exit status 0 when every check passes, 1 with
// a message per failure otherwise.
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <vector>

#include "cublasLt.h"
#include "emu_device.hpp"
#include "backend/cuda/cuda_ptx.cuh"

namespace {

int g_fail = 0;
#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            printf("emu_ptx_check: FAIL line %d: ", __LINE__);                                                       \
            printf(__VA_ARGS__);                                                                                     \
            printf("\n");                                                                                            \
            g_fail++;                                                                                                \
        }                                                                                                            \
    } while (0)

uint64_t g_rng = 0x1234567ull;
double uniform() { // in [-1, 1)
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(g_rng >> 11) * 0x1.0p-52 - 1.0;
}

uint16_t to16(float f, bool bf16) {
    if (bf16) {
        uint32_t u = __float_as_uint(f);
        return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return __half_as_ushort(__float2half_rn(f));
}
double from16(uint16_t h, bool bf16) {
    return bf16 ? (double)__uint_as_float((uint32_t)h << 16) : (double)__half2float(__ushort_as_half(h));
}
uint32_t pair(uint16_t lo, uint16_t hi) { return (uint32_t)lo | ((uint32_t)hi << 16); }

// ---- mma: A 16x16, B 16x8 (k x n), C 16x8 in the ISA's per-lane layout
struct MmaIO {
    bool bf16;
    uint16_t A[16][16], B[16][8];
    float C[16][8];
    float D[32][4]; // per lane
};
MmaIO *g_io;

void mma_kernel() {
    MmaIO &io = *g_io;
    const int lane = (int)threadIdx.x, g = lane / 4, t = lane % 4;
    // A: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
    uint32_t a[4] = {pair(io.A[g][2 * t], io.A[g][2 * t + 1]), pair(io.A[g + 8][2 * t], io.A[g + 8][2 * t + 1]),
                     pair(io.A[g][2 * t + 8], io.A[g][2 * t + 9]), pair(io.A[g + 8][2 * t + 8], io.A[g + 8][2 * t + 9])};
    // B: b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8..2t+9, n = g)
    uint32_t b[2] = {pair(io.B[2 * t][g], io.B[2 * t + 1][g]), pair(io.B[2 * t + 8][g], io.B[2 * t + 9][g])};
    // C: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    float c[4] = {io.C[g][2 * t], io.C[g][2 * t + 1], io.C[g + 8][2 * t], io.C[g + 8][2 * t + 1]};
    if (io.bf16) zoff_cuda::mma_m16n8k16<true>(io.D[lane], a, b, c);
    else zoff_cuda::mma_m16n8k16<false>(io.D[lane], a, b, c);
}

void check_mma(cudaStream_t s, bool bf16, bool print) {
    MmaIO io;
    io.bf16 = bf16;
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) io.A[i][k] = to16((float)(4 * uniform()), bf16);
    for (int k = 0; k < 16; k++)
        for (int j = 0; j < 8; j++) io.B[k][j] = to16((float)(4 * uniform()), bf16);
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) io.C[i][j] = (float)(10 * uniform());
    g_io = &io;
    emu_launch(emu_cfg(dim3(1), dim3(32), 0, s), mma_kernel);
    double worst = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i & 1);
            double ref = io.C[row][col];
            for (int k = 0; k < 16; k++) ref += from16(io.A[row][k], bf16) * from16(io.B[k][col], bf16);
            const double err = fabs(io.D[lane][i] - ref) / (fabs(ref) + 1);
            worst = err > worst ? err : worst;
        }
    CHECK(worst < 1e-6, "mma m16n8k16 %s: max relative error %.3g", bf16 ? "bf16" : "f16", worst);
    if (print) printf("emu_ptx_check: mma.m16n8k16 %s: max error %.2e against double\n", bf16 ? "bf16" : "f16", worst);
}

// ---- ldmatrix: 4 matrices of 8x8 at scattered rows of a shared buffer (row stride 24 elements)
struct LdIO {
    uint16_t *smem;
    int num;
    bool trans;
    uint32_t r[32][4];
};
LdIO *g_ld;
constexpr int LD_STRIDE = 24;
int ld_row_of(int m, int r) { return (m * 8 + r) * 2 % 33; } // rows of matrix m: scattered, not in order

void ld_kernel() {
    LdIO &io = *g_ld;
    const int lane = (int)threadIdx.x, m = lane / 8, r = lane % 8;
    // the ISA: threads 8m..8m+7 give the row addresses of matrix m; the others are unused (x1, x2)
    const void *row = m < io.num ? (const void *)(io.smem + ld_row_of(m, r) * LD_STRIDE + 8 * (m % 2))
                                 : (const void *)(uintptr_t)0x10; // aligned garbage: must not be read
    uint32_t out[4] = {0, 0, 0, 0};
    if (io.num == 4 && io.trans) zoff_cuda::ldmatrix<4, true>(out, row);
    else if (io.num == 4) zoff_cuda::ldmatrix<4, false>(out, row);
    else if (io.num == 2 && io.trans) zoff_cuda::ldmatrix<2, true>(out, row);
    else if (io.num == 2) zoff_cuda::ldmatrix<2, false>(out, row);
    else if (io.trans) zoff_cuda::ldmatrix<1, true>(out, row);
    else zoff_cuda::ldmatrix<1, false>(out, row);
    memcpy(io.r[lane], out, sizeof out);
}

void check_ldmatrix(cudaStream_t s) {
    alignas(16) static uint16_t smem[40 * LD_STRIDE];
    for (int i = 0; i < 40 * LD_STRIDE; i++) smem[i] = (uint16_t)(i * 7 + 3);
    for (int num : {1, 2, 4})
        for (bool trans : {false, true}) {
            LdIO io;
            io.smem = smem;
            io.num = num;
            io.trans = trans;
            g_ld = &io;
            emu_launch(emu_cfg(dim3(1), dim3(32), 0, s), ld_kernel);
            int bad = 0;
            for (int lane = 0; lane < 32; lane++)
                for (int m = 0; m < num; m++) {
                    // matrix m element (i, j) = smem[row(m, i) * stride + 8 (m % 2) + j]
                    auto M = [&](int i, int j) { return smem[ld_row_of(m, i) * LD_STRIDE + 8 * (m % 2) + j]; };
                    const int g = lane / 4, t = lane % 4;
                    const uint32_t want = trans ? pair(M(2 * t, g), M(2 * t + 1, g)) : pair(M(g, 2 * t), M(g, 2 * t + 1));
                    if (io.r[lane][m] != want) bad++;
                }
            CHECK(bad == 0, "ldmatrix x%d%s: %d registers differ from the ISA's layout", num, trans ? ".trans" : "", bad);
        }
    printf("emu_ptx_check: ldmatrix x1/x2/x4 (.trans): checked against the ISA's layout\n");
}

// ---- ldmatrix feeding mma as the kernels do: A from a row-major 16x16 tile (x4), B = K^T from
// K rows (x2, n = key), and B from row-major (k x n) rows with .trans (x2)
struct ComposeIO {
    alignas(16) uint16_t A[16][16];
    alignas(16) uint16_t K[8][16];  // B[k][n] = K[n][k]
    alignas(16) uint16_t Bkn[16][8]; // B[k][n] row-major
    float D1[32][4], D2[32][4];
};
ComposeIO *g_cio;
void compose_kernel() {
    ComposeIO &io = *g_cio;
    const int lane = (int)threadIdx.x;
    uint32_t a[4], b1[2], b2[2];
    // A: lanes 0-15 give rows 0-15 at column 0, lanes 16-31 rows 0-15 at column 8
    zoff_cuda::ldmatrix<4, false>(a, &io.A[lane % 16][(lane / 16) * 8]);
    // B = K^T: matrix 0 = K[0..7][0..7], matrix 1 = K[0..7][8..15] (lanes 0-7, 8-15)
    zoff_cuda::ldmatrix<2, false>(b1, &io.K[lane % 8][((lane / 8) % 2) * 8]);
    // B row-major: matrix 0 = rows k 0-7, matrix 1 = rows k 8-15, transposed
    zoff_cuda::ldmatrix<2, true>(b2, &io.Bkn[lane % 16][0]);
    const float zero[4] = {0, 0, 0, 0};
    zoff_cuda::mma_m16n8k16<true>(io.D1[lane], a, b1, zero);
    zoff_cuda::mma_m16n8k16<true>(io.D2[lane], a, b2, zero);
}

void check_compose(cudaStream_t s) {
    static ComposeIO io;
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 16; k++) io.A[i][k] = to16((float)uniform(), true);
    for (int n = 0; n < 8; n++)
        for (int k = 0; k < 16; k++) io.K[n][k] = io.Bkn[k][n] = to16((float)uniform(), true);
    g_cio = &io;
    emu_launch(emu_cfg(dim3(1), dim3(32), 0, s), compose_kernel);
    double worst = 0;
    for (int lane = 0; lane < 32; lane++)
        for (int i = 0; i < 4; i++) {
            const int row = lane / 4 + (i >= 2 ? 8 : 0), col = 2 * (lane % 4) + (i & 1);
            double ref = 0;
            for (int k = 0; k < 16; k++) ref += from16(io.A[row][k], true) * from16(io.K[col][k], true);
            worst = fmax(worst, fmax(fabs(io.D1[lane][i] - ref), fabs(io.D2[lane][i] - ref)));
        }
    CHECK(worst < 1e-5, "ldmatrix + mma: max error %.3g", worst);
    printf("emu_ptx_check: ldmatrix x4 / x2 / x2.trans feeding mma: max error %.2e\n", worst);
}

// ---- cp.async: nothing lands before the wait; wait_group n leaves the n newest groups pending;
// src-size 0 zero-fills
uint32_t *g_src;
int g_cp_fail;
void cp_kernel() {
    alignas(16) static uint32_t dst[3][4];
    if (threadIdx.x != 0) return;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) dst[i][j] = 0xdeadbeefu;
    zoff_cuda::cp_async16(dst[0], g_src, 16);
    zoff_cuda::cp_async_commit();
    zoff_cuda::cp_async16(dst[1], g_src + 4, 16);
    zoff_cuda::cp_async16(dst[2], g_src, 0); // zero fill
    zoff_cuda::cp_async_commit();
    if (dst[0][0] != 0xdeadbeefu) g_cp_fail++; // not landed before a wait
    zoff_cuda::cp_async_wait<1>();
    if (dst[0][0] != g_src[0] || dst[0][3] != g_src[3]) g_cp_fail++; // first group done
    if (dst[1][0] != 0xdeadbeefu) g_cp_fail++;                       // second still pending
    zoff_cuda::cp_async_wait<0>();
    if (dst[1][0] != g_src[4] || dst[1][3] != g_src[7]) g_cp_fail++;
    if (dst[2][0] != 0 || dst[2][3] != 0) g_cp_fail++;
}

void check_cp_async(cudaStream_t s) {
    void *p = nullptr;
    cudaMalloc(&p, 64);
    g_src = (uint32_t *)p;
    for (int i = 0; i < 16; i++) g_src[i] = 1000u + (uint32_t)i;
    g_cp_fail = 0;
    emu_launch(emu_cfg(dim3(1), dim3(32), 0, s), cp_kernel);
    CHECK(g_cp_fail == 0, "cp.async / commit_group / wait_group: %d checks failed", g_cp_fail);
    cudaFree(p);
    printf("emu_ptx_check: cp.async + commit_group + wait_group: checked\n");
}

// The emulated cuBLASLt's epilogues (emu.cpp) against a scalar double reference written here from
// cublasLt.h's descriptions, in fp32: GELU_AUX_BIAS (A^T B; aux ld 16 > m, its padding untouched),
// DGELU_BGRAD (A B; bias = row sums of D), BGRADB (A B^T; bias = sums of op(B) over k, one per column),
// and the heuristic's refusal of an aux leading dimension that is not a multiple of 8.
double ref_gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double ref_dgelu(double x) {
    const double h = 1e-5; // central difference of ref_gelu: independent of the emulator's closed form
    return (ref_gelu(x + h) - ref_gelu(x - h)) / (2 * h);
}

cublasStatus_t lt_run(cublasLtHandle_t h, cudaStream_t s, int epi, int ta, int tb, int64_t m, int64_t n, int64_t k,
                      const float *A, const float *B, float *D, const void *bias, const void *aux, int64_t aux_ld) {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasLtEpilogue_t e = (cublasLtEpilogue_t)epi;
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, ta ? k : m, ta ? m : k, ta ? k : m);
    cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, tb ? n : k, tb ? k : n, tb ? n : k);
    cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &res, &cnt);
    const float one = 1, zero = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(h, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &res.algo, nullptr, 0, s);
    cudaStreamSynchronize(s);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(ld), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(la);
    cublasLtMatmulDescDestroy(op);
    return st;
}

void check_lt_epilogues(cudaStream_t s) {
    const int64_t m = 12, n = 5, k = 7, ALD = 16;
    float *A, *B, *D, *bias, *aux;
    cudaMalloc((void **)&A, m * k * 4), cudaMalloc((void **)&B, k * n * 4), cudaMalloc((void **)&D, m * n * 4);
    cudaMalloc((void **)&bias, 64 * 4), cudaMalloc((void **)&aux, ALD * n * 4);
    for (int64_t i = 0; i < m * k; i++) A[i] = (float)uniform();
    for (int64_t i = 0; i < k * n; i++) B[i] = (float)uniform();
    cublasLtHandle_t h;
    cublasLtCreate(&h);
    // op(A)[i][kk] and op(B)[kk][j] for the transposes used below
    auto a = [&](int ta, int64_t i, int64_t kk) { return (double)(ta ? A[kk + i * k] : A[i + kk * m]); };
    auto b = [&](int tb, int64_t kk, int64_t j) { return (double)(tb ? B[j + kk * n] : B[kk + j * k]); };
    auto ab = [&](int ta, int tb, int64_t i, int64_t j) {
        double s_ = 0;
        for (int64_t kk = 0; kk < k; kk++) s_ += a(ta, i, kk) * b(tb, kk, j);
        return s_;
    };
    auto close = [](double got, double want) { return fabs(got - want) <= 2e-6 * (1 + fabs(want)); };
    // GELU_AUX_BIAS, op(A) = A^T
    for (int64_t i = 0; i < m; i++) bias[i] = (float)uniform();
    for (int64_t i = 0; i < ALD * n; i++) aux[i] = 777.0f;
    CHECK(lt_run(h, s, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1, 0, m, n, k, A, B, D, bias, aux, ALD) == 0, "GELU_AUX_BIAS ran");
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < ALD; i++) {
            const double x = i < m ? ab(1, 0, i, j) + bias[i] : 777.0;
            CHECK(close(aux[i + j * ALD], x), "GELU_AUX_BIAS aux (%lld,%lld) %g want %g", (long long)i, (long long)j,
                  aux[i + j * ALD], x);
            if (i < m) CHECK(close(D[i + j * m], ref_gelu(x)), "GELU_AUX_BIAS D (%lld,%lld)", (long long)i, (long long)j);
        }
    // DGELU_BGRAD, aux = the GELU input from above
    CHECK(lt_run(h, s, CUBLASLT_EPILOGUE_DGELU_BGRAD, 0, 0, m, n, k, A, B, D, bias, aux, ALD) == 0, "DGELU_BGRAD ran");
    for (int64_t i = 0; i < m; i++) {
        double sum = 0;
        for (int64_t j = 0; j < n; j++) {
            const double want = ab(0, 0, i, j) * ref_dgelu(aux[i + j * ALD]);
            sum += want;
            CHECK(fabs(D[i + j * m] - want) <= 1e-5 * (1 + fabs(want)), "DGELU_BGRAD D (%lld,%lld)", (long long)i,
                  (long long)j);
        }
        CHECK(fabs(bias[i] - sum) <= 1e-5 * (1 + fabs(sum)), "DGELU_BGRAD bias %lld: %g want %g", (long long)i, bias[i], sum);
    }
    // BGRADB, op(B) = B^T (B stored n x k)
    CHECK(lt_run(h, s, CUBLASLT_EPILOGUE_BGRADB, 0, 1, m, n, k, A, B, D, bias, nullptr, 0) == 0, "BGRADB ran");
    for (int64_t j = 0; j < n; j++) {
        double sum = 0;
        for (int64_t kk = 0; kk < k; kk++) sum += b(1, kk, j);
        CHECK(close(bias[j], sum), "BGRADB bias %lld: %g want %g", (long long)j, bias[j], sum);
        for (int64_t i = 0; i < m; i++) CHECK(close(D[i + j * m], ab(0, 1, i, j)), "BGRADB D (%lld,%lld)", (long long)i, (long long)j);
    }
    // an aux ld that is not a multiple of 8: refused ("must be divisible by 8")
    CHECK(lt_run(h, s, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 1, 0, m, n, k, A, B, D, bias, aux, m) == CUBLAS_STATUS_INVALID_VALUE,
          "aux ld %lld accepted", (long long)m);
    cublasLtDestroy(h);
    for (float *p : {A, B, D, bias, aux}) cudaFree(p);
    printf("emu_ptx_check: cuBLASLt epilogues GELU_AUX_BIAS, DGELU_BGRAD, BGRADB: checked against double\n");
}
} // namespace

int main() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int rep = 0; rep < 20; rep++) {
        check_mma(s, true, rep == 0);
        check_mma(s, false, rep == 0);
    }
    check_ldmatrix(s);
    check_compose(s);
    check_cp_async(s);
    check_lt_epilogues(s);
    cudaStreamDestroy(s);
    if (g_fail) {
        printf("emu_ptx_check: %d check(s) FAILED\n", g_fail);
        return 1;
    }
    printf("emu_ptx_check: all checks passed\n");
    return 0;
}
