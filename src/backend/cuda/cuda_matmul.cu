// MATMUL_FWD / MATMUL_BWD on the CUDA backend.
//
// Products go through cuBLASLt with fp32 accumulation and fp32 scale
// (CUBLAS_COMPUTE_32F: no TF32, so fp32 results match the CPU to ~1e-6);
// A/B/C/D are all of the op's storage dtype (f32, bf16 or f16). zoff's
// matrices are row-major; cuBLASLt is column-major, so a row-major X (r,c) is
// used as the column-major X^T (c,r):
//   fwd     out (N,OC) = inp (N,C) @ W (OC,C)^T + bias   ->  D(OC,N) = W^T(OC,C) . inp(C,N), epilogue BIAS
//   dinp    dinp (N,C) += dout (N,OC) @ W (OC,C)         ->  D(C,N)  = W(C,OC) . dout(OC,N), beta = 1
//   dweight dW (OC,C) += dout^T @ inp (N,C)              ->  D(C,OC) = inp(C,N) . dout^T(N,OC), beta = 1
//   dbias   dbias (OC) += column sums of dout            ->  two deterministic reduction kernels
// Accumulating outputs are C == D with beta = 1: the old value is read in the
// storage dtype, added in fp32 and rounded once (as the CPU backend does);
// dinp_overwrite = 1 makes dinp's GEMM beta = 0.
//
// Fused epilogues (cuBLASLt's, documented in cublasLt.h), where enabled (ZOFF_CUDA_EPILOGUE,
// start-up comparison: epilogue_init) and their conditions hold, else the unfused path:
//   fwd + gelu_out  D = gelu_out, epilogue GELU_AUX_BIAS: aux (ld OC) = out, the pre-activation
//   dinp + gelu_pre D = dinp (beta 0), epilogue DGELU_BGRAD: aux (ld C) = gelu_pre; its bias
//                   gradient (row sums of D, written in dt to the stream's scratch) is added to dbias_pre
//   dweight + dbias epilogue BGRADB: sums of dout over N, one per column of D (= OC), written in dt to
//                   the scratch and added to dbias (cuBLASLt writes the bias gradient; the op accumulates)
//
// One cuBLASLt handle per device; one workspace per stream (two streams must
// not share a workspace), allocated on the stream's first matmul. Heuristic
// results and the descriptors are cached per (shape, layout, dtype, pointer alignment). The
// pointer alignments are passed to the heuristic (weights live at arbitrary
// offsets of flat buffers; the default assumes 256-byte alignment). When
// cuBLASLt has no algorithm for a case (or ZOFF_CUDA_MATMUL=simple), a simple
// tiled fp32-accumulating kernel does the product instead.
#include <cublasLt.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_libs.h"

using namespace zoff_cuda;

// cuBLASLt's calls, resolved at the first device (backend/cuda/cuda_libs.h): LT(cublasLtMatmul)(...).
#ifdef ZOFF_CUDA_EMU
#define LT(f) ::f
extern "C" zoff_status zoff_cuda_blaslt_open(void) { return ZOFF_OK; }
extern "C" size_t zoff_cuda_blaslt_version(void) { return 0; }
#else
#include <dlfcn.h>

#define ZOFF_STR_(x) #x
#define ZOFF_STR(x) ZOFF_STR_(x)
// every cuBLASLt function this file calls
#define ZOFF_LT_CALLS(X)                                                                                   \
    X(cublasLtGetVersion) X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName)                   \
    X(cublasLtGetStatusString) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate) \
    X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)       \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) \
    X(cublasLtMatrixLayoutDestroy)

namespace {
struct LtCalls {
#define ZOFF_LT_MEMBER(f) decltype(&::f) f;
    ZOFF_LT_CALLS(ZOFF_LT_MEMBER)
#undef ZOFF_LT_MEMBER
};
LtCalls g_lt;
pthread_once_t g_lt_once = PTHREAD_ONCE_INIT;
bool g_lt_ok;
char g_lt_why[1024];

void lt_open_once() {
    const char *soname = "libcublasLt.so." ZOFF_STR(CUBLAS_VER_MAJOR);
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    char first[512] = "";
    if (!h) snprintf(first, sizeof first, "%s", dlerror());
#ifdef ZOFF_CUBLASLT_DIR
    if (!h) h = dlopen(ZOFF_CUBLASLT_DIR "/libcublasLt.so." ZOFF_STR(CUBLAS_VER_MAJOR), RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) {
        snprintf(g_lt_why, sizeof g_lt_why,
                 "cannot load cuBLASLt (%s): %s; install the CUDA %d toolkit's cuBLAS, or add the folder that holds "
                 "%s to LD_LIBRARY_PATH",
                 soname, first, CUBLAS_VER_MAJOR, soname);
        return;
    }
    const char *missing = nullptr;
#define ZOFF_LT_RESOLVE(f)                                                        \
    if (!missing && !(g_lt.f = reinterpret_cast<decltype(g_lt.f)>(dlsym(h, #f)))) \
        missing = #f;
    ZOFF_LT_CALLS(ZOFF_LT_RESOLVE)
#undef ZOFF_LT_RESOLVE
    if (missing) {
        snprintf(g_lt_why, sizeof g_lt_why,
                 "the cuBLASLt zoff loaded (%s) has no %s: it is older than the cublasLt.h zoff was built with "
                 "(%d.%d); install that version or newer",
                 soname, missing, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);
        return; // the library stays open: dlclose of cuBLASLt at this point gains nothing
    }
    g_lt_ok = true;
}
} // namespace

extern "C" zoff_status zoff_cuda_blaslt_open(void) {
    pthread_once(&g_lt_once, lt_open_once);
    return g_lt_ok ? ZOFF_OK : zoff_error(ZOFF_ERR_DEVICE, "%s", g_lt_why);
}

extern "C" size_t zoff_cuda_blaslt_version(void) { return g_lt_ok ? g_lt.cublasLtGetVersion() : 0; }

#define LT(f) g_lt.f
#endif

namespace {

constexpr size_t WORKSPACE_BYTES = (size_t)32 << 20; // cuBLAS recommends 32 MiB on Hopper
constexpr int CACHE_BUCKETS = 64, CACHE_WAYS = 4; // 256 cases; a full bucket: the case runs uncached

#define ZOFF_CUBLAS_CHECK(call)                                                                         \
    ZOFF_CUDA_LIB_CHECK(cublasStatus_t, CUBLAS_STATUS_SUCCESS, LT(cublasLtGetStatusString), LT(cublasLtGetStatusName), \
                        #call, call)

struct MMKey {
    int64_t m, n, k, lda, ldb, ldd, aux_ld;
    int ta, tb, dt, epi; // epi: the cublasLtEpilogue_t
    uint32_t align_a, align_b, align_d, align_bias, align_aux;
};

// The epilogue of one GEMM and its per-call pointers: CUBLASLT_EPILOGUE_DEFAULT, BIAS (bias added),
// GELU_AUX_BIAS (D = GELU(AB + bias), aux = AB + bias), DGELU_BGRAD (D = AB * GELU'(aux), bias = row
// sums of D) or BGRADB (bias = sums of op(B) over k: one per column of D). aux is (m,n) with ld aux_ld.
struct LtEpi {
    int epi;
    const void *bias, *aux;
    int64_t aux_ld;
};

bool epi_has_aux(int epi) { return epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_DGELU_BGRAD; }

// Descriptors of one cuBLASLt case (plain C style: no destructors, so the host code needs no C++
// exception runtime at link time); freed by lt_descs_free.
struct LtDescs {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulPreference_t pref;
};

// One cached case: written once under ctx->mu, then published (valid, release) and never changed or
// evicted until zoff_cuda_matmul_fini, so readers find it without the lock. The bias and aux pointers
// are the attributes set per call (under ctx->mu, around the cublasLtMatmul that reads them).
struct MMEntry {
    MMKey key;
    int valid;
    int has_algo; // 0: cuBLASLt has no algorithm for this case (use the simple kernel)
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    LtDescs dd; // pref destroyed after the heuristic
};

struct MMCache {
    MMEntry e[CACHE_BUCKETS][CACHE_WAYS];
};

bool key_eq(const MMKey &a, const MMKey &b) { return memcmp(&a, &b, sizeof a) == 0; }

uint32_t key_hash(const MMKey &k) { // FNV-1a over the key's bytes (padding zeroed by the caller)
    const unsigned char *p = (const unsigned char *)&k;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < sizeof k; i++) h = (h ^ p[i]) * 16777619u;
    return h;
}

MMEntry *cache_find(MMCache *c, const MMKey &key) {
    MMEntry *b = c->e[key_hash(key) % CACHE_BUCKETS];
    for (int w = 0; w < CACHE_WAYS; w++)
        if (__atomic_load_n(&b[w].valid, __ATOMIC_ACQUIRE) && key_eq(b[w].key, key)) return &b[w];
    return nullptr;
}

uint32_t ptr_align(const void *p) {
    const uintptr_t u = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && (u % a) != 0) a >>= 1;
    return a;
}

cudaDataType_t cuda_type(zoff_dtype dt) {
    return dt == ZOFF_BF16 ? CUDA_R_16BF : dt == ZOFF_F16 ? CUDA_R_16F : CUDA_R_32F;
}

// ------------------------------------------------------------------ simple kernels

constexpr int SG_TILE = 16;

// D (m,n) column-major with leading dimension ldd:
//   D = op(A) (m,k) . op(B) (k,n) + beta * D + bias (m, broadcast over columns; may be NULL).
// op(A) = A (stored m x k, lda) or A^T (A stored k x m); op(B) = B (k x n, ldb) or B^T (B stored n x k).
// 16x16 output tile per block, fp32 accumulation. Grid (ceil(n/16), ceil(m/16)).
template <class S>
__global__ void simple_gemm_kernel(int64_t m, int64_t n, int64_t k, int ta, int tb, const typename S::T *A,
                                   int64_t lda, const typename S::T *B, int64_t ldb, float beta, typename S::T *D,
                                   int64_t ldd, const typename S::T *bias) {
    __shared__ float As[SG_TILE][SG_TILE + 1], Bs[SG_TILE][SG_TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int64_t i = (int64_t)blockIdx.y * SG_TILE + ty; // row of D
    const int64_t j = (int64_t)blockIdx.x * SG_TILE + tx; // column of D
    float acc = 0.0f;
    for (int64_t k0 = 0; k0 < k; k0 += SG_TILE) {
        const int64_t ak = k0 + tx, bk = k0 + ty;
        As[ty][tx] = (i < m && ak < k) ? S::load(A, ta ? ak + i * lda : i + ak * lda) : 0.0f;
        Bs[ty][tx] = (bk < k && j < n) ? S::load(B, tb ? j + bk * ldb : bk + j * ldb) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < SG_TILE; kk++) acc += As[ty][kk] * Bs[kk][tx];
        __syncthreads();
    }
    if (i < m && j < n) {
        float v = acc;
        if (beta != 0.0f) v += beta * S::load(D, i + j * ldd);
        if (bias) v += S::load(bias, i);
        S::store(D, i + j * ldd, v);
    }
}

// out (N,OC) = bias (OC) broadcast over rows, or 0 when bias is NULL (matmul with C = 0).
template <class S>
__global__ void fill_rows_kernel(typename S::T *out, const typename S::T *bias, int64_t N, int64_t OC) {
    const int64_t n = N * OC;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        S::store(out, i, bias ? S::load(bias, i % OC) : 0.0f);
}

constexpr int DB_THREADS = 256;
constexpr int64_t DB_MAX_PARTS = 256;

// part (G,OC): part[g][oc] = sum over rows [g*rpb, min((g+1)*rpb, N)) of dout (N,OC), rows in order.
// Grid (ceil(OC/256), G).
template <class S>
__global__ void dbias_part_kernel(float *part, const typename S::T *dout, int64_t N, int64_t OC, int64_t rpb) {
    const int64_t oc = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, g = blockIdx.y;
    if (oc >= OC) return;
    const int64_t r0 = g * rpb, r1 = r0 + rpb < N ? r0 + rpb : N;
    float acc = 0.0f;
    for (int64_t r = r0; r < r1; r++) acc += S::load(dout, r * OC + oc);
    part[g * OC + oc] = acc;
}

// dbias (OC) += sum over g of part (G,OC), g in order.
template <class S> __global__ void dbias_final_kernel(typename S::T *dbias, const float *part, int64_t G, int64_t OC) {
    for (int64_t oc = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; oc < OC; oc += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int64_t g = 0; g < G; g++) acc += part[g * OC + oc];
        S::store(dbias, oc, S::load(dbias, oc) + acc);
    }
}

template <class S>
zoff_status simple_gemm(const zoff_cuda_launch *L, int ta, int tb, int64_t m, int64_t n, int64_t k, const void *A,
                        int64_t lda, const void *B, int64_t ldb, float beta, void *D, int64_t ldd, const void *bias) {
    typedef typename S::T T;
    const int64_t gy = (m + SG_TILE - 1) / SG_TILE, gx = (n + SG_TILE - 1) / SG_TILE;
    if (gy > 65535 || gx > INT32_MAX)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "simple GEMM: %lld x %lld output is too large for its grid",
                          (long long)m, (long long)n);
    simple_gemm_kernel<S><<<dim3((unsigned int)gx, (unsigned int)gy), dim3(SG_TILE, SG_TILE), 0, L->s>>>(
        m, n, k, ta, tb, (const T *)A, lda, (const T *)B, ldb, beta, (T *)D, ldd, (const T *)bias);
    ZOFF_CUDA_CHECK_LAUNCH("simple_gemm_kernel");
    return ZOFF_OK;
}

zoff_status simple_gemm_dt(const zoff_cuda_launch *L, zoff_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                           const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *D, int64_t ldd,
                           const void *bias) {
    ZOFF_CUDA_DISPATCH(dt, S, return simple_gemm<S>(L, ta, tb, m, n, k, A, lda, B, ldb, beta, D, ldd, bias));
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "matmul: dtype %s is not supported by the CUDA backend", zoff_dtype_name(dt));
}

// ------------------------------------------------------------------ cuBLASLt

void lt_descs_free(LtDescs *dd) {
    if (dd->pref) LT(cublasLtMatmulPreferenceDestroy)(dd->pref);
    if (dd->d) LT(cublasLtMatrixLayoutDestroy)(dd->d);
    if (dd->b) LT(cublasLtMatrixLayoutDestroy)(dd->b);
    if (dd->a) LT(cublasLtMatrixLayoutDestroy)(dd->a);
    if (dd->op) LT(cublasLtMatmulDescDestroy)(dd->op);
    memset(dd, 0, sizeof *dd);
}

// Descriptors and the heuristic's algorithm for the case key (ep's pointers: those the heuristic sees).
zoff_status lt_build(zoff_cuda_ctx *ctx, const MMKey &key, const LtEpi &ep, LtDescs &dd, MMEntry *out) {
    const cudaDataType_t ty = cuda_type((zoff_dtype)key.dt);
    const int64_t m = key.m, n = key.n, k = key.k;
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulDescCreate)(&dd.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t opa = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (ep.epi != CUBLASLT_EPILOGUE_DEFAULT) { // every other epilogue used here reads or writes the bias vector
        const cublasLtEpilogue_t epi = (cublasLtEpilogue_t)ep.epi;
        ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        ZOFF_CUBLAS_CHECK(
            LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof ep.bias));
    }
    if (epi_has_aux(ep.epi)) {
        ZOFF_CUBLAS_CHECK(
            LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux, sizeof ep.aux));
        ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulDescSetAttribute)(dd.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &key.aux_ld,
                                                         sizeof key.aux_ld));
    }
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatrixLayoutCreate)(&dd.a, ty, (uint64_t)(key.ta ? k : m), (uint64_t)(key.ta ? m : k), key.lda));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatrixLayoutCreate)(&dd.b, ty, (uint64_t)(key.tb ? n : k), (uint64_t)(key.tb ? k : n), key.ldb));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatrixLayoutCreate)(&dd.d, ty, (uint64_t)m, (uint64_t)n, key.ldd));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceCreate)(&dd.pref));
    const uint64_t wsmax = WORKSPACE_BYTES;
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceSetAttribute)(dd.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsmax,
                                                           sizeof wsmax));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceSetAttribute)(dd.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                           &key.align_a, sizeof key.align_a));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceSetAttribute)(dd.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                           &key.align_b, sizeof key.align_b));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceSetAttribute)(dd.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &key.align_d, sizeof key.align_d));
    ZOFF_CUBLAS_CHECK(LT(cublasLtMatmulPreferenceSetAttribute)(dd.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                           &key.align_d, sizeof key.align_d));
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int nres = 0;
    cublasStatus_t s = LT(cublasLtMatmulAlgoGetHeuristic)((cublasLtHandle_t)ctx->blaslt, dd.op, dd.a, dd.b, dd.d, dd.d,
                                                      dd.pref, 1, &res, &nres);
    if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
        return zoff_error(ZOFF_ERR_DEVICE, "%s:%d: cublasLtMatmulAlgoGetHeuristic failed: %s (%s)", __FILE__, __LINE__,
                          LT(cublasLtGetStatusString)(s), LT(cublasLtGetStatusName)(s));
    out->key = key;
    out->has_algo = s == CUBLAS_STATUS_SUCCESS && nres > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    out->algo = res.algo;
    out->workspace = out->has_algo ? res.workspaceSize : 0;
    LT(cublasLtMatmulPreferenceDestroy)(dd.pref);
    dd.pref = nullptr;
    return ZOFF_OK;
}

// The cached case of key, built on first use (*e); NULL with the case in *tmp when the bucket is full
// (tmp's descriptors are then the caller's to free).
zoff_status lt_case(zoff_cuda_ctx *ctx, const MMKey &key, const LtEpi &ep, MMEntry **e, MMEntry *tmp) {
    MMCache *cache = (MMCache *)ctx->mm_cache;
    *e = cache_find(cache, key);
    if (*e) return ZOFF_OK;
    memset(tmp, 0, sizeof *tmp);
    zoff_status st = lt_build(ctx, key, ep, tmp->dd, tmp); // outside the lock: the heuristic is slow
    if (st != ZOFF_OK) {
        lt_descs_free(&tmp->dd);
        return st;
    }
    pthread_mutex_lock(&ctx->mu);
    *e = cache_find(cache, key); // another thread may have added it meanwhile
    if (!*e) {
        MMEntry *b = cache->e[key_hash(key) % CACHE_BUCKETS];
        for (int w = 0; w < CACHE_WAYS && !*e; w++)
            if (!b[w].valid) {
                b[w] = *tmp;
                __atomic_store_n(&b[w].valid, 1, __ATOMIC_RELEASE);
                *e = &b[w];
                memset(&tmp->dd, 0, sizeof tmp->dd); // owned by the cache now
            }
    }
    pthread_mutex_unlock(&ctx->mu);
    if (*e) lt_descs_free(&tmp->dd); // another thread's entry won
    return ZOFF_OK;
}

// D (m,n) col-major = op(A) . op(B) + beta * D, then the epilogue ep (see LtEpi).
// *done = 0 when cuBLASLt has no algorithm for the case (nothing was issued).
zoff_status lt_gemm(const zoff_cuda_launch *L, zoff_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                    const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *D, int64_t ldd,
                    const LtEpi &ep, int *done) {
    *done = 0;
    zoff_cuda_ctx *ctx = L->ctx;
    MMKey key;
    memset(&key, 0, sizeof key); // padding bytes take part in the comparison and the hash
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldd = ldd;
    key.ta = ta, key.tb = tb, key.dt = (int)dt, key.epi = ep.epi;
    key.align_a = ptr_align(A), key.align_b = ptr_align(B), key.align_d = ptr_align(D);
    key.align_bias = ep.bias ? ptr_align(ep.bias) : 0;
    const bool aux = epi_has_aux(ep.epi), per_call = ep.epi != CUBLASLT_EPILOGUE_DEFAULT;
    if (aux) key.aux_ld = ep.aux_ld, key.align_aux = ptr_align(ep.aux);
    MMEntry *e = nullptr, tmp;
    ZOFF_TRY(lt_case(ctx, key, ep, &e, &tmp));
    const MMEntry *c = e ? e : &tmp;
    zoff_status st = ZOFF_OK;
    void *ws = nullptr;
    if (c->has_algo && c->workspace > 0) st = zoff_cuda_stream_buffer(L->st, 1, WORKSPACE_BYTES, &ws);
    if (c->has_algo && st == ZOFF_OK) {
        const float alpha = 1.0f;
        if (per_call) pthread_mutex_lock(&ctx->mu); // the bias and aux pointers live in the shared descriptor
        cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
        if (per_call)
            s = LT(cublasLtMatmulDescSetAttribute)(c->dd.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ep.bias, sizeof ep.bias);
        if (aux && s == CUBLAS_STATUS_SUCCESS)
            s = LT(cublasLtMatmulDescSetAttribute)(c->dd.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &ep.aux,
                                               sizeof ep.aux);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = LT(cublasLtMatmul)((cublasLtHandle_t)ctx->blaslt, c->dd.op, &alpha, A, c->dd.a, B, c->dd.b, &beta, D,
                               c->dd.d, D, c->dd.d, &c->algo, ws, ws ? WORKSPACE_BYTES : 0, L->s);
        if (per_call) pthread_mutex_unlock(&ctx->mu);
        if (s == CUBLAS_STATUS_SUCCESS) *done = 1;
        else if (s != CUBLAS_STATUS_NOT_SUPPORTED) // not supported: nothing issued, the caller falls back
            st = zoff_error(ZOFF_ERR_DEVICE, "%s:%d: cublasLtMatmul failed: %s (%s)", __FILE__, __LINE__,
                            LT(cublasLtGetStatusString)(s), LT(cublasLtGetStatusName)(s));
    }
    if (!e) lt_descs_free(&tmp.dd);
    return st;
}

template <class S> zoff_status fill_rows(const zoff_cuda_launch *L, void *out, const void *bias, int64_t N, int64_t OC) {
    typedef typename S::T T;
    fill_rows_kernel<S><<<flat_blocks(N * OC, 256), 256, 0, L->s>>>((T *)out, (const T *)bias, N, OC);
    ZOFF_CUDA_CHECK_LAUNCH("fill_rows_kernel");
    return ZOFF_OK;
}

zoff_status fill_rows_dt(const zoff_cuda_launch *L, zoff_dtype dt, void *out, const void *bias, int64_t N, int64_t OC) {
    ZOFF_CUDA_DISPATCH(dt, S, return fill_rows<S>(L, out, bias, N, OC));
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "matmul: dtype %s is not supported by the CUDA backend", zoff_dtype_name(dt));
}

// D = op(A) op(B) + beta D (+ bias): cuBLASLt (bias through its epilogue when the bias pointer is
// 16-byte aligned, else written into D first and added with beta = 1), or the simple kernel.
zoff_status gemm(const zoff_cuda_launch *L, zoff_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                 const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *D, int64_t ldd,
                 const void *bias) {
    if (L->ctx->matmul_mode != ZOFF_CUDA_MM_SIMPLE) {
        int done = 0;
        const LtEpi plain = {CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, 0};
        if (bias && beta == 0.0f && ptr_align(bias) >= 16) {
            const LtEpi ep = {CUBLASLT_EPILOGUE_BIAS, bias, nullptr, 0};
            ZOFF_TRY(lt_gemm(L, dt, ta, tb, m, n, k, A, lda, B, ldb, 0.0f, D, ldd, ep, &done));
            if (done) return ZOFF_OK;
        }
        if (bias && beta == 0.0f) {
            if (ldd != m)
                return zoff_error(ZOFF_ERR_INTERNAL, "matmul: bias fill needs a contiguous output (ldd %lld != m %lld)",
                                  (long long)ldd, (long long)m);
            // D (m,n) col-major is out (n,m) row-major: fill each row with the bias, then accumulate
            ZOFF_TRY(fill_rows_dt(L, dt, D, bias, n, m));
            ZOFF_TRY(lt_gemm(L, dt, ta, tb, m, n, k, A, lda, B, ldb, 1.0f, D, ldd, plain, &done));
            if (done) return ZOFF_OK;
            return simple_gemm_dt(L, dt, ta, tb, m, n, k, A, lda, B, ldb, 1.0f, D, ldd, nullptr);
        }
        const LtEpi ep = {bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, nullptr, 0};
        ZOFF_TRY(lt_gemm(L, dt, ta, tb, m, n, k, A, lda, B, ldb, beta, D, ldd, ep, &done));
        if (done) return ZOFF_OK;
    }
    return simple_gemm_dt(L, dt, ta, tb, m, n, k, A, lda, B, ldb, beta, D, ldd, bias);
}

template <class S> zoff_status dbias(const zoff_cuda_launch *L, void *dbias_, const void *dout, int64_t N, int64_t OC) {
    typedef typename S::T T;
    const int64_t want = (N + 63) / 64;
    const int64_t G = want < DB_MAX_PARTS ? want : DB_MAX_PARTS; // depends on N only: deterministic
    const int64_t rpb = (N + G - 1) / G;
    void *scr = nullptr;
    ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, (size_t)(G * OC) * sizeof(float), &scr));
    const int64_t gx = (OC + DB_THREADS - 1) / DB_THREADS;
    if (gx > INT32_MAX) return zoff_error(ZOFF_ERR_UNSUPPORTED, "matmul dbias: OC = %lld is too large", (long long)OC);
    dbias_part_kernel<S><<<dim3((unsigned int)gx, (unsigned int)G), DB_THREADS, 0, L->s>>>((float *)scr,
                                                                                          (const T *)dout, N, OC, rpb);
    ZOFF_CUDA_CHECK_LAUNCH("dbias_part_kernel");
    dbias_final_kernel<S><<<flat_blocks(OC, DB_THREADS), DB_THREADS, 0, L->s>>>((T *)dbias_, (const float *)scr, G, OC);
    ZOFF_CUDA_CHECK_LAUNCH("dbias_final_kernel");
    return ZOFF_OK;
}

zoff_status dbias_dt(const zoff_cuda_launch *L, zoff_dtype dt, void *dbias_, const void *dout, int64_t N, int64_t OC) {
    ZOFF_CUDA_DISPATCH(dt, S, return dbias<S>(L, dbias_, dout, N, OC));
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "matmul: dtype %s is not supported by the CUDA backend", zoff_dtype_name(dt));
}

// ------------------------------------------------------------------ fused epilogues

// ctx->epilogue_ok's bit for dt: f32 and the 16-bit types are enabled apart (see epilogue_init).
int epi_bit(zoff_dtype dt) { return dt == ZOFF_F32 ? ZOFF_CUDA_EPI_F32 : ZOFF_CUDA_EPI_16; }

// Another op's kernels (GELU, ADD) on this launch's stream.
zoff_status run_sub(const zoff_cuda_launch *L, zoff_op op, const void *args) {
    zoff_cuda_launch l = *L;
    l.op = op;
    return zoff_cuda_run_op(&l, args);
}

// The GEMM with a fused epilogue (GELU_AUX_BIAS, DGELU_BGRAD, BGRADB), where allowed: enabled
// (ZOFF_CUDA_EPILOGUE, the start-up comparison), cuBLASLt in use, and what cuBLASLt documents holds: the
// aux leading dimension a multiple of 8 (and >= m, by construction here); the bias/aux vectors 16-byte
// aligned (as this file asks of the BIAS epilogue). *done = 0: nothing issued (no algorithm either).
zoff_status epi_gemm(const zoff_cuda_launch *L, zoff_dtype dt, int ta, int tb, int64_t m, int64_t n, int64_t k,
                     const void *A, int64_t lda, const void *B, int64_t ldb, float beta, void *D, int64_t ldd,
                     const LtEpi &ep, int *done) {
    *done = 0;
    if (!(L->ctx->epilogue_ok & epi_bit(dt)) || L->ctx->matmul_mode == ZOFF_CUDA_MM_SIMPLE) return ZOFF_OK;
    if (ptr_align(ep.bias) < 16) return ZOFF_OK;
    if (epi_has_aux(ep.epi) && (ptr_align(ep.aux) < 16 || ep.aux_ld % 8 != 0 || ep.aux_ld < m)) return ZOFF_OK;
    return lt_gemm(L, dt, ta, tb, m, n, k, A, lda, B, ldb, beta, D, ldd, ep, done);
}

// dst (n) += the bias gradient an epilogue wrote into the stream's scratch (in dt, as cuBLASLt writes it).
zoff_status add_bgrad(const zoff_cuda_launch *L, zoff_dtype dt, void *dst, const void *bgrad, int64_t n) {
    zoff_op_add_args add = {};
    add.out = dst, add.a = dst, add.b = bgrad, add.n = n, add.dt = dt;
    return run_sub(L, ZOFF_OP_ADD, &add);
}

// dinp (N,C) of matmul backward: (+)= dout @ W, or with gelu_pre = (dout @ W) * GELU'(gelu_pre) and
// dbias_pre += its column sums (one DGELU_BGRAD GEMM, else GEMM + GELU_BWD + the dbias kernels).
zoff_status bwd_dinp(const zoff_cuda_launch *L, const zoff_op_matmul_bwd_args *a) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const zoff_dtype dt = a->dt;
    const float beta = a->dinp_overwrite ? 0.0f : 1.0f;
    if (!a->gelu_pre) return gemm(L, dt, 0, 0, C, N, OC, a->weight, C, a->dout, OC, beta, a->dinp, C, nullptr);
    void *bg = nullptr;
    ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, (size_t)C * zoff_dtype_size(dt), &bg));
    const LtEpi ep = {CUBLASLT_EPILOGUE_DGELU_BGRAD, bg, a->gelu_pre, C};
    int done = 0;
    ZOFF_TRY(epi_gemm(L, dt, 0, 0, C, N, OC, a->weight, C, a->dout, OC, 0.0f, a->dinp, C, ep, &done));
    if (done) return a->dbias_pre ? add_bgrad(L, dt, a->dbias_pre, bg, C) : ZOFF_OK;
    ZOFF_TRY(gemm(L, dt, 0, 0, C, N, OC, a->weight, C, a->dout, OC, 0.0f, a->dinp, C, nullptr));
    zoff_op_gelu_bwd_args g = {};
    g.dinp = a->dinp, g.inp = a->gelu_pre, g.dout = a->dinp, g.n = N * C, g.dt = dt;
    ZOFF_TRY(run_sub(L, ZOFF_OP_GELU_BWD, &g));
    return a->dbias_pre ? dbias_dt(L, dt, a->dbias_pre, a->dinp, N, C) : ZOFF_OK;
}

// dweight (OC,C) += dout^T @ inp and dbias (OC) += column sums of dout: one BGRADB GEMM, or the GEMM and
// the dbias kernels.
zoff_status bwd_dweight(const zoff_cuda_launch *L, const zoff_op_matmul_bwd_args *a) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    const zoff_dtype dt = a->dt;
    int done = 0;
    if (a->dbias && C > 0) {
        void *bg = nullptr;
        ZOFF_TRY(zoff_cuda_stream_buffer(L->st, 0, (size_t)OC * zoff_dtype_size(dt), &bg));
        const LtEpi ep = {CUBLASLT_EPILOGUE_BGRADB, bg, nullptr, 0};
        ZOFF_TRY(epi_gemm(L, dt, 0, 1, C, OC, N, a->inp, C, a->dout, OC, 1.0f, a->dweight, C, ep, &done));
        if (done) return add_bgrad(L, dt, a->dbias, bg, OC);
    }
    if (C > 0) ZOFF_TRY(gemm(L, dt, 0, 1, C, OC, N, a->inp, C, a->dout, OC, 1.0f, a->dweight, C, nullptr));
    return a->dbias ? dbias_dt(L, dt, a->dbias, a->dout, N, OC) : ZOFF_OK;
}

zoff_status check_dt(zoff_op op, zoff_dtype dt) {
    if (dt == ZOFF_F32 || dt == ZOFF_BF16 || dt == ZOFF_F16) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "%s: dtype %s is not supported by the CUDA backend", zoff_op_name(op),
                      zoff_dtype_name(dt));
}

zoff_status matmul_fwd(const zoff_cuda_launch *L, const zoff_op_matmul_fwd_args *a) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    ZOFF_TRY(check_dt(ZOFF_OP_MATMUL_FWD, a->dt));
    if (N == 0 || OC == 0) return ZOFF_OK;
    if (a->gelu_out && a->bias && C > 0) { // D = gelu_out, aux = out (the pre-activation)
        const LtEpi ep = {CUBLASLT_EPILOGUE_GELU_AUX_BIAS, a->bias, a->out, OC};
        int done = 0;
        ZOFF_TRY(epi_gemm(L, a->dt, 1, 0, OC, N, C, a->weight, C, a->inp, C, 0.0f, a->gelu_out, OC, ep, &done));
        if (done) return ZOFF_OK;
    }
    if (C == 0) ZOFF_TRY(fill_rows_dt(L, a->dt, a->out, a->bias, N, OC));
    else ZOFF_TRY(gemm(L, a->dt, 1, 0, OC, N, C, a->weight, C, a->inp, C, 0.0f, a->out, OC, a->bias));
    if (!a->gelu_out) return ZOFF_OK;
    zoff_op_gelu_fwd_args g = {};
    g.out = a->gelu_out, g.inp = a->out, g.n = N * OC, g.dt = a->dt;
    return run_sub(L, ZOFF_OP_GELU_FWD, &g);
}

zoff_status matmul_bwd(const zoff_cuda_launch *L, const zoff_op_matmul_bwd_args *a) {
    const int64_t N = a->N, C = a->C, OC = a->OC;
    ZOFF_TRY(check_dt(ZOFF_OP_MATMUL_BWD, a->dt));
    if (N == 0) return ZOFF_OK;
    if (OC == 0) { // an empty product: an overwritten dinp is 0 (and so is GELU' times it)
        if (a->dinp && a->dinp_overwrite && C > 0)
            ZOFF_CUDA_CHECK(cudaMemsetAsync(a->dinp, 0, (size_t)(N * C) * zoff_dtype_size(a->dt), L->s));
        return ZOFF_OK;
    }
    if (a->dinp && C > 0) ZOFF_TRY(bwd_dinp(L, a));
    return bwd_dweight(L, a);
}

// ------------------------------------------------------------------ start-up comparison

// One small case in dt, the fused epilogues (k = 1) against the unfused path (k = 0): forward with
// gelu_out (N 40, C 64, OC 96) and backward with gelu_pre, dbias_pre and dbias (N 40, C 96, OC 64; dinp
// starts as NaN: beta = 0 must not read it). *worst: max |fused - unfused| / max |unfused| over the outputs.
constexpr int64_t EC_N = 40, EC_C = 64, EC_OC = 96, EC_NIN = 7, EC_NOUT = 6;

void ec_sizes(int64_t *cnt) { // inputs, then the outputs of k = 0 and k = 1
    const int64_t in[EC_NIN] = {EC_N * EC_C, EC_OC * EC_C, EC_OC, EC_N * EC_C, EC_C * EC_OC, EC_N * EC_OC, EC_N * EC_OC};
    const int64_t out[EC_NOUT] = {EC_N * EC_OC, EC_N * EC_OC, EC_N * EC_OC, EC_C * EC_OC, EC_C, EC_OC};
    for (int i = 0; i < EC_NIN; i++) cnt[i] = in[i];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < EC_NOUT; i++) cnt[EC_NIN + k * EC_NOUT + i] = out[i];
}

zoff_status ec_run(const zoff_cuda_launch *L, zoff_dtype dt, void *const *p, int k) {
    void *const *o = p + EC_NIN + k * EC_NOUT;
    zoff_op_matmul_fwd_args f = {};
    f.out = o[0], f.gelu_out = o[1], f.inp = p[0], f.weight = p[1], f.bias = p[2];
    f.N = EC_N, f.C = EC_C, f.OC = EC_OC, f.dt = dt;
    ZOFF_TRY(matmul_fwd(L, &f));
    zoff_op_matmul_bwd_args b = {};
    b.dinp = o[2], b.dweight = o[3], b.dbias = o[4], b.dbias_pre = o[5], b.dout = p[3], b.weight = p[4];
    b.inp = p[5], b.gelu_pre = p[6], b.dinp_overwrite = 1;
    b.N = EC_N, b.C = EC_OC, b.OC = EC_C, b.dt = dt;
    return matmul_bwd(L, &b);
}

zoff_status epi_compare(zoff_cuda_ctx *ctx, zoff_cuda_stream *st, zoff_dtype dt, double *worst) {
    const int nb = EC_NIN + 2 * EC_NOUT;
    const size_t es = zoff_dtype_size(dt);
    int64_t cnt[nb];
    size_t off[nb + 1];
    ec_sizes(cnt);
    off[0] = 0;
    for (int i = 0; i < nb; i++) off[i + 1] = off[i] + ((size_t)cnt[i] * es + 255) / 256 * 256;
    std::vector<unsigned char> raw(off[nb]);
    uint64_t r = 0x243f6a8885a308d3ull;
    auto uni = [&r]() { r = r * 6364136223846793005ull + 1442695040888963407ull; return (float)((r >> 40) * 0x1.0p-24) * 2.0f - 1.0f; };
    const float range[nb] = {1, 0.25f, 0.5f, 1, 0.25f, 1, 3, NAN, NAN, NAN, 0.1f, 0.1f, 0.1f, NAN, NAN, NAN, 0.1f, 0.1f, 0.1f};
    uint64_t keep = 0;
    for (int i = 0; i < nb; i++) {
        if (i == EC_NIN + EC_NOUT) r = keep; // both runs start from the same accumulators
        if (i == EC_NIN) keep = r;
        for (int64_t j = 0; j < cnt[i]; j++) {
            const float v = range[i] != range[i] ? NAN : uni() * range[i];
            unsigned char *d = raw.data() + off[i] + (size_t)j * es;
            if (dt == ZOFF_F32) memcpy(d, &v, 4);
            else { const uint16_t u = zoff_f32_to_bf16(v); memcpy(d, &u, 2); }
        }
    }
    unsigned char *dev = nullptr;
    ZOFF_CUDA_CHECK(cudaMalloc((void **)&dev, off[nb]));
    void *p[nb];
    for (int i = 0; i < nb; i++) p[i] = dev + off[i];
    zoff_cuda_launch L = {};
    L.ctx = ctx, L.st = st, L.s = st->s, L.op = ZOFF_OP_MATMUL_FWD;
    zoff_status s = ZOFF_OK;
    if (cudaMemcpyAsync(dev, raw.data(), off[nb], cudaMemcpyHostToDevice, st->s) != cudaSuccess)
        s = zoff_error(ZOFF_ERR_DEVICE, "matmul epilogue start-up check: the upload failed");
    for (int k = 0; k < 2 && s == ZOFF_OK; k++) {
        ctx->epilogue_ok = k ? ZOFF_CUDA_EPI_F32 | ZOFF_CUDA_EPI_16 : 0;
        s = ec_run(&L, dt, p, k);
    }
    if (s == ZOFF_OK && (cudaMemcpyAsync(raw.data(), dev, off[nb], cudaMemcpyDeviceToHost, st->s) != cudaSuccess ||
                         cudaStreamSynchronize(st->s) != cudaSuccess))
        s = zoff_error(ZOFF_ERR_DEVICE, "matmul epilogue start-up check: the download failed");
    cudaFree(dev);
    ctx->epilogue_ok = 0;
    if (s != ZOFF_OK) return s;
    auto val = [&](int i, int64_t j) {
        const unsigned char *d = raw.data() + off[i] + (size_t)j * es;
        float v;
        uint16_t u;
        if (dt == ZOFF_F32) memcpy(&v, d, 4);
        else memcpy(&u, d, 2), v = zoff_bf16_to_f32(u);
        return (double)v;
    };
    *worst = 0;
    for (int i = 0; i < EC_NOUT; i++) {
        double md = 0, mb = 1e-30;
        for (int64_t j = 0; j < cnt[EC_NIN + i]; j++) {
            const double u = val(EC_NIN + i, j), f = val(EC_NIN + EC_NOUT + i, j);
            md = fmax(md, fabs(f - u));
            mb = fmax(mb, fabs(u));
            if (f != f || u != u) md = INFINITY;
        }
        *worst = fmax(*worst, md / mb);
    }
    return ZOFF_OK;
}

// ZOFF_CUDA_EPILOGUE (ctx->epilogue_mode): auto (default): the fused epilogues where they apply, once they
// agreed with the unfused path at start-up, else the unfused path with one warning line; off: never; on:
// without the comparison. f32 uses them when its case agrees within 2e-5 (an erf GELU in place of GPT-2's
// tanh one, or a coarse tanh, does not); bf16/f16 when the bf16 case agrees within 2e-2 (its rounding) and
// the f32 case within 5e-3 (the epilogue computes a GELU at all: layout, bias or formula errors are O(1)).
// Measured on the emulator: f32 1.7e-7, bf16 7.3e-3; with its erf GELU (EMU_LT_GELU=erf) f32 8.0e-4.
zoff_status epilogue_init(zoff_cuda_ctx *ctx) {
    ctx->epilogue_ok = ctx->epilogue_mode == ZOFF_CUDA_EPI_ON ? ZOFF_CUDA_EPI_F32 | ZOFF_CUDA_EPI_16 : 0;
    if (ctx->epilogue_mode != ZOFF_CUDA_EPI_AUTO || ctx->matmul_mode == ZOFF_CUDA_MM_SIMPLE) return ZOFF_OK;
    zoff_cuda_stream st;
    memset(&st, 0, sizeof st);
    snprintf(st.name, sizeof st.name, "matmul epilogue start-up check");
    if (pthread_mutex_init(&st.mu, NULL) != 0)
        return zoff_error(ZOFF_ERR_INTERNAL, "pthread_mutex_init failed for the matmul epilogue start-up check");
    double w32 = 0, w16 = 0;
    zoff_status s = ZOFF_OK;
    if (cudaStreamCreateWithFlags(&st.s, cudaStreamNonBlocking) != cudaSuccess)
        s = zoff_error(ZOFF_ERR_DEVICE, "matmul epilogue start-up check: cudaStreamCreateWithFlags failed");
    if (s == ZOFF_OK) s = epi_compare(ctx, &st, ZOFF_F32, &w32);
    if (s == ZOFF_OK) s = epi_compare(ctx, &st, ZOFF_BF16, &w16);
    if (st.s) {
        if (st.scratch) cudaFreeAsync(st.scratch, st.s);
        if (st.workspace) cudaFreeAsync(st.workspace, st.s);
        cudaStreamSynchronize(st.s);
        cudaStreamDestroy(st.s);
    }
    pthread_mutex_destroy(&st.mu);
    const double lim32 = 2e-5, lim16 = 2e-2, lim16_32 = 5e-3;
    if (s == ZOFF_OK)
        ctx->epilogue_ok = (w32 <= lim32 ? ZOFF_CUDA_EPI_F32 : 0) | (w16 <= lim16 && w32 <= lim16_32 ? ZOFF_CUDA_EPI_16 : 0);
    if (ctx->epilogue_ok == (ZOFF_CUDA_EPI_F32 | ZOFF_CUDA_EPI_16)) {
        zoff_log(ZOFF_LOG_DEBUG, "%s: the cuBLASLt epilogues agree with the unfused matmul path (%.2g, %.2g)",
                 ctx->name, w32, w16);
        return ZOFF_OK;
    }
    (void)cudaGetLastError();
    if (cudaDeviceSynchronize() != cudaSuccess) // a sticky error: the context cannot be used
        return s != ZOFF_OK ? s : zoff_error(ZOFF_ERR_DEVICE, "%s: the matmul epilogue start-up check broke the CUDA context", ctx->name);
    fprintf(stderr,
            "zoff: WARNING: %s: the cuBLASLt epilogue GEMMs (bias+GELU, dGELU+bias gradient, bias gradient) %s%s "
            "(f32: %.3g, limit %.2g; bf16: %.3g, limit %.2g); using the unfused path %s (slower); please report "
            "this (ZOFF_CUDA_EPILOGUE=off silences it)\n",
            ctx->name, s != ZOFF_OK ? "failed: " : "disagree with the unfused path",
            s != ZOFF_OK ? zoff_last_error() : "", w32, lim32, w16, lim16,
            !ctx->epilogue_ok ? "for every dtype" : ctx->epilogue_ok == ZOFF_CUDA_EPI_F32 ? "for bf16 and f16" : "for f32");
    return ZOFF_OK;
}

} // namespace

extern "C" zoff_status zoff_cuda_matmul_init(zoff_cuda_ctx *ctx) {
    ZOFF_TRY(zoff_cuda_blaslt_open());
    MMCache *cache = (MMCache *)calloc(1, sizeof(MMCache));
    if (!cache) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the matmul algorithm cache");
    ctx->mm_cache = cache;
    cublasLtHandle_t h = nullptr;
    ZOFF_CUBLAS_CHECK(LT(cublasLtCreate)(&h));
    ctx->blaslt = h;
    return epilogue_init(ctx);
}

extern "C" void zoff_cuda_matmul_fini(zoff_cuda_ctx *ctx) {
    if (ctx->blaslt) {
        cublasStatus_t s = LT(cublasLtDestroy)((cublasLtHandle_t)ctx->blaslt);
        if (s != CUBLAS_STATUS_SUCCESS)
            zoff_log(ZOFF_LOG_ERROR, "%s:%d: cublasLtDestroy failed: %s", __FILE__, __LINE__, LT(cublasLtGetStatusString)(s));
        ctx->blaslt = nullptr;
    }
    MMCache *cache = (MMCache *)ctx->mm_cache;
    if (cache)
        for (int b = 0; b < CACHE_BUCKETS; b++)
            for (int w = 0; w < CACHE_WAYS; w++)
                if (cache->e[b][w].valid) lt_descs_free(&cache->e[b][w].dd);
    free(ctx->mm_cache);
    ctx->mm_cache = nullptr;
}

// out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC) (bias may be NULL); gelu_out = GELU(out) when set.
extern "C" zoff_status zoff_cuda_matmul_fwd(const zoff_cuda_launch *L, const zoff_op_matmul_fwd_args *a) {
    return matmul_fwd(L, a);
}

// dinp (N,C) (+)= dout (N,OC) @ weight (OC,C) (skipped when dinp is NULL; the GELU epilogue with gelu_pre);
// dweight (OC,C) += dout^T @ inp (N,C); dbias (OC) += column sums of dout (skipped when dbias is NULL).
extern "C" zoff_status zoff_cuda_matmul_bwd(const zoff_cuda_launch *L, const zoff_op_matmul_bwd_args *a) {
    return matmul_bwd(L, a);
}
