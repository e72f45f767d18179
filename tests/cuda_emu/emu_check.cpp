// Extra checks of the CUDA backend against the CPU backend, through the public
// device API, for what tests/test_ops.c does not reach: flash attention at head
// sizes 32/64/128 across tile boundaries, matmuls on unaligned operands, the
// grid-stride / partial-sum caps of the reductions, overlapping casts, run-to-run
// determinism, the asynchronous error semantics of streams and events, and one GPT-2 step. Built and run by run.sh
// (on the emulator); on a GPU it can be built against the real library too:
//   g++ -std=c++17 -Iinclude -Isrc emu_check.cpp -Lbuild -lzoff ...
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <functional>
#include <string>
#include <vector>

#include "zoff/device.h"
#include "zoff/model.h"

namespace {

int g_fail = 0;

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            printf("emu_check: FAIL %s:%d: ", __FILE__, __LINE__);                                                   \
            printf(__VA_ARGS__);                                                                                     \
            printf("\n");                                                                                            \
            g_fail++;                                                                                                \
        }                                                                                                            \
    } while (0)

#define OK(call)                                                                                                     \
    do {                                                                                                             \
        zoff_status s_ = (call);                                                                                     \
        if (s_ != ZOFF_OK) {                                                                                         \
            printf("emu_check: FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, zoff_status_name(s_),        \
                   zoff_last_error());                                                                               \
            g_fail++;                                                                                                \
            return;                                                                                                  \
        }                                                                                                            \
    } while (0)

struct Buf {
    std::string name;
    zoff_dtype dt;
    int64_t n;
    bool out;                 // compare after the op
    std::vector<float> init;  // values (rounded to dt when stored)
    int64_t offset_elems = 0; // place the tensor this many elements into its allocation (misalignment)
};

size_t dsz(zoff_dtype dt) { return zoff_dtype_size(dt); }

void encode(void *dst, const std::vector<float> &v, zoff_dtype dt) {
    for (size_t i = 0; i < v.size(); i++) {
        if (dt == ZOFF_F32) ((float *)dst)[i] = v[i];
        else if (dt == ZOFF_BF16) ((uint16_t *)dst)[i] = zoff_f32_to_bf16(v[i]);
        else if (dt == ZOFF_F16) ((uint16_t *)dst)[i] = zoff_f32_to_f16(v[i]);
        else ((int32_t *)dst)[i] = (int32_t)v[i];
    }
}
std::vector<float> decode(const void *src, int64_t n, zoff_dtype dt) {
    std::vector<float> v((size_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (dt == ZOFF_F32) v[(size_t)i] = ((const float *)src)[i];
        else if (dt == ZOFF_BF16) v[(size_t)i] = zoff_bf16_to_f32(((const uint16_t *)src)[i]);
        else if (dt == ZOFF_F16) v[(size_t)i] = zoff_f16_to_f32(((const uint16_t *)src)[i]);
        else v[(size_t)i] = (float)((const int32_t *)src)[i];
    }
    return v;
}

typedef std::function<zoff_status(zoff_stream *, std::vector<void *> &)> Launch;

// Runs the op on dev; returns the outputs (empty on failure, with the status in *st).
std::vector<std::vector<float>> run(zoff_device *dev, std::vector<Buf> &bufs, const Launch &launch, zoff_status *st) {
    zoff_stream *s = zoff_device_stream(dev);
    std::vector<void *> base(bufs.size(), nullptr), p(bufs.size(), nullptr);
    std::vector<std::vector<float>> outs;
    *st = ZOFF_OK;
    for (size_t i = 0; i < bufs.size() && *st == ZOFF_OK; i++) {
        Buf &b = bufs[i];
        size_t bytes = (size_t)(b.n + b.offset_elems) * dsz(b.dt) + 64;
        *st = zoff_device_alloc(dev, bytes, b.name.c_str(), &base[i]);
        if (*st != ZOFF_OK) break;
        p[i] = (char *)base[i] + b.offset_elems * dsz(b.dt);
        std::vector<unsigned char> stage((size_t)b.n * dsz(b.dt) + 1);
        std::vector<float> v = b.init;
        v.resize((size_t)b.n, NAN);
        encode(stage.data(), v, b.dt);
        *st = zoff_memcpy_async(s, p[i], stage.data(), (size_t)b.n * dsz(b.dt), ZOFF_COPY_H2D);
        if (*st == ZOFF_OK) *st = zoff_stream_synchronize(s);
    }
    if (*st == ZOFF_OK) *st = launch(s, p);
    if (*st == ZOFF_OK) *st = zoff_stream_synchronize(s);
    for (size_t i = 0; i < bufs.size() && *st == ZOFF_OK; i++) {
        if (!bufs[i].out) continue;
        std::vector<unsigned char> stage((size_t)bufs[i].n * dsz(bufs[i].dt) + 1);
        *st = zoff_memcpy_async(s, stage.data(), p[i], (size_t)bufs[i].n * dsz(bufs[i].dt), ZOFF_COPY_D2H);
        if (*st == ZOFF_OK) *st = zoff_stream_synchronize(s);
        outs.push_back(decode(stage.data(), bufs[i].n, bufs[i].dt));
    }
    for (size_t i = 0; i < bufs.size(); i++)
        if (base[i]) zoff_device_free(dev, base[i]);
    return outs;
}

double norm_err(const std::vector<float> &a, const std::vector<float> &r) {
    double md = 0, mr = 0;
    for (size_t i = 0; i < a.size(); i++) {
        if (isnan(a[i]) && isnan(r[i])) continue;
        double d = fabs((double)a[i] - (double)r[i]);
        if (!(d <= md)) md = isnan(d) ? INFINITY : d;
        if (fabs(r[i]) > mr) mr = fabs(r[i]);
    }
    return md / (mr > 1e-30 ? mr : 1e-30);
}

uint64_t g_rng = 0x9e3779b97f4a7c15ull;
float frand() { // uniform in [-1, 1)
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) * 0x1.0p-52 - 1.0);
}
std::vector<float> randv(int64_t n, float scale) {
    std::vector<float> v((size_t)n);
    for (auto &x : v) x = frand() * scale;
    return v;
}

// Same op on both devices; compares every output with tolerance tol (per dtype of the first output).
void compare(const char *what, zoff_device *cpu, zoff_device *gpu, std::vector<Buf> bufs, const Launch &launch,
             double tol) {
    zoff_status s1, s2;
    std::vector<Buf> b1 = bufs, b2 = bufs;
    auto r1 = run(cpu, b1, launch, &s1);
    auto r2 = run(gpu, b2, launch, &s2);
    CHECK(s1 == ZOFF_OK, "%s on cpu: %s: %s", what, zoff_status_name(s1), zoff_last_error());
    CHECK(s2 == ZOFF_OK, "%s on cuda: %s: %s", what, zoff_status_name(s2), zoff_last_error());
    if (s1 != ZOFF_OK || s2 != ZOFF_OK) return;
    size_t k = 0;
    double worst = 0;
    for (auto &b : bufs) {
        if (!b.out) continue;
        double e = norm_err(r2[k], r1[k]);
        if (e > worst) worst = e;
        CHECK(e <= tol, "%s: %s differs from the CPU backend by %.3g (tolerance %.3g)", what, b.name.c_str(), e, tol);
        k++;
    }
    printf("emu_check: %-58s max normalised difference %.2e\n", what, worst);
}

double tol_for(zoff_dtype dt, double f32) { return dt == ZOFF_F32 ? f32 : dt == ZOFF_BF16 ? 2e-2 : 5e-3; }

void attention(zoff_device *cpu, zoff_device *gpu) {
    const int64_t shapes[][4] = {{2, 1, 64, 2},   {1, 63, 64, 1},  {2, 64, 128, 2}, {1, 65, 128, 2}, {2, 130, 64, 2},
                                 {1, 129, 256, 2}, {1, 97, 64, 1}, {1, 70, 160, 2}, {1, 33, 96, 1}};
    for (const auto &sh : shapes)
        for (zoff_dtype dt : {ZOFF_F32, ZOFF_BF16, ZOFF_F16}) {
            const int64_t B = sh[0], T = sh[1], C = sh[2], NH = sh[3];
            char what[128];
            snprintf(what, sizeof what, "attention B=%lld T=%lld C=%lld NH=%lld (HS %lld) %s", (long long)B,
                     (long long)T, (long long)C, (long long)NH, (long long)(C / NH), zoff_dtype_name(dt));
            std::vector<Buf> f = {{"out", dt, B * T * C, true, {}},
                                  {"lse", ZOFF_F32, B * NH * T, true, {}},
                                  {"qkv", dt, B * T * 3 * C, false, randv(B * T * 3 * C, 2.0f)}};
            compare(what, cpu, gpu, f, [&](zoff_stream *s, std::vector<void *> &p) {
                zoff_op_attention_fwd_args a = {p[0], (float *)p[1], p[2], B, T, C, NH, dt};
                return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, a);
            }, tol_for(dt, 2e-5));
            // backward with out/lse from the CPU forward (so both backends see the same inputs)
            std::vector<Buf> fb = f;
            zoff_status st;
            auto fo = run(cpu, fb, [&](zoff_stream *s, std::vector<void *> &p) {
                zoff_op_attention_fwd_args a = {p[0], (float *)p[1], p[2], B, T, C, NH, dt};
                return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, a);
            }, &st);
            if (st != ZOFF_OK) continue;
            std::vector<Buf> bw = {{"dqkv", dt, B * T * 3 * C, true, {}},
                                   {"dout", dt, B * T * C, false, randv(B * T * C, 1.0f)},
                                   {"qkv", dt, B * T * 3 * C, false, f[2].init},
                                   {"out", dt, B * T * C, false, fo[0]},
                                   {"lse", ZOFF_F32, B * NH * T, false, fo[1]}};
            snprintf(what, sizeof what, "attention bwd B=%lld T=%lld C=%lld NH=%lld (HS %lld) %s", (long long)B,
                     (long long)T, (long long)C, (long long)NH, (long long)(C / NH), zoff_dtype_name(dt));
            compare(what, cpu, gpu, bw, [&](zoff_stream *s, std::vector<void *> &p) {
                zoff_op_attention_bwd_args a = {p[0], p[1], p[2], p[3], (const float *)p[4], B, T, C, NH, dt};
                return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_BWD, a);
            }, tol_for(dt, 5e-5) * 1.5);
        }
    // qkv 2 bytes past 16-byte alignment: not for the tensor-core kernels (cp.async needs aligned rows);
    // the fp32 flash kernels take the call
    const int64_t B = 1, T = 65, C = 128, NH = 2;
    std::vector<Buf> f = {{"out", ZOFF_BF16, B * T * C, true, {}},
                          {"lse", ZOFF_F32, B * NH * T, true, {}},
                          {"qkv", ZOFF_BF16, B * T * 3 * C, false, randv(B * T * 3 * C, 2.0f)}};
    f[2].offset_elems = 1;
    compare("attention B=1 T=65 C=128 NH=2 (HS 64) bf16, qkv misaligned", cpu, gpu, f,
            [&](zoff_stream *s, std::vector<void *> &p) {
                zoff_op_attention_fwd_args a = {p[0], (float *)p[1], p[2], B, T, C, NH, ZOFF_BF16};
                return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_FWD, a);
            }, tol_for(ZOFF_BF16, 2e-5));
}

void matmul(zoff_device *cpu, zoff_device *gpu) {
    const int64_t shapes[][3] = {{37, 24, 40}, {64, 64, 48}, {5, 3, 7}};
    for (const auto &sh : shapes)
        for (zoff_dtype dt : {ZOFF_F32, ZOFF_BF16, ZOFF_F16})
            for (int64_t off : {0, 1, 3}) {
                const int64_t N = sh[0], C = sh[1], OC = sh[2];
                char what[128];
                snprintf(what, sizeof what, "matmul fwd+bwd N=%lld C=%lld OC=%lld %s offset %lld", (long long)N,
                         (long long)C, (long long)OC, zoff_dtype_name(dt), (long long)off);
                std::vector<Buf> f = {{"out", dt, N * OC, true, {}, off},
                                      {"inp", dt, N * C, false, randv(N * C, 1.0f), off},
                                      {"weight", dt, OC * C, false, randv(OC * C, 0.3f), 2 * off},
                                      {"bias", dt, OC, false, randv(OC, 1.0f), off}};
                compare(what, cpu, gpu, f, [&](zoff_stream *s, std::vector<void *> &p) {
                    zoff_op_matmul_fwd_args a = {p[0], p[1], p[2], p[3], N, C, OC, dt, nullptr};
                    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, a);
                }, tol_for(dt, 2e-5));
                std::vector<Buf> b = {{"dinp", dt, N * C, true, randv(N * C, 1.0f), off},
                                      {"dweight", dt, OC * C, true, randv(OC * C, 1.0f), off},
                                      {"dbias", dt, OC, true, randv(OC, 1.0f), 2 * off},
                                      {"dout", dt, N * OC, false, randv(N * OC, 1.0f), off},
                                      {"inp", dt, N * C, false, randv(N * C, 1.0f), 0},
                                      {"weight", dt, OC * C, false, randv(OC * C, 0.3f), off}};
                compare(what, cpu, gpu, b, [&](zoff_stream *s, std::vector<void *> &p) {
                    zoff_op_matmul_bwd_args a = {p[0], p[1], p[2], p[3], p[4], p[5], N, C, OC, dt, 0, nullptr, nullptr};
                    return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, a);
                }, tol_for(dt, 2e-5));
            }
    // many rows: the dbias partial sums are capped at 256 parts
    const int64_t N = 20000, C = 3, OC = 5;
    std::vector<Buf> b = {{"dinp", ZOFF_F32, N * C, true, randv(N * C, 1.0f)},
                          {"dweight", ZOFF_F32, OC * C, true, randv(OC * C, 1.0f)},
                          {"dbias", ZOFF_F32, OC, true, randv(OC, 1.0f)},
                          {"dout", ZOFF_F32, N * OC, false, randv(N * OC, 1.0f)},
                          {"inp", ZOFF_F32, N * C, false, randv(N * C, 1.0f)},
                          {"weight", ZOFF_F32, OC * C, false, randv(OC * C, 0.3f)}};
    compare("matmul bwd N=20000 C=3 OC=5 f32", cpu, gpu, b, [&](zoff_stream *s, std::vector<void *> &p) {
        zoff_op_matmul_bwd_args a = {p[0], p[1], p[2], p[3], p[4], p[5], N, C, OC, ZOFF_F32, 0, nullptr, nullptr};
        return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, a);
    }, 1e-5);
}

void reductions(zoff_device *cpu, zoff_device *gpu) {
    for (const int64_t C : {5, 8}) { // layernorm with more than 1024 chunks of 32 rows (C = 8: 16-byte packs)
        const int64_t N = 40000;
        std::vector<float> mean((size_t)N), rstd((size_t)N);
        std::vector<float> x = randv(N * C, 2.0f);
        for (int64_t i = 0; i < N; i++) {
            double m = 0, v = 0;
            for (int64_t c = 0; c < C; c++) m += x[(size_t)(i * C + c)];
            m /= C;
            for (int64_t c = 0; c < C; c++) v += (x[(size_t)(i * C + c)] - m) * (x[(size_t)(i * C + c)] - m);
            mean[(size_t)i] = (float)m;
            rstd[(size_t)i] = (float)(1.0 / sqrt(v / C + 1e-5));
        }
        std::vector<Buf> b = {{"dinp", ZOFF_F32, N * C, true, randv(N * C, 1.0f)},
                              {"dweight", ZOFF_F32, C, true, randv(C, 1.0f)},
                              {"dbias", ZOFF_F32, C, true, randv(C, 1.0f)},
                              {"dout", ZOFF_F32, N * C, false, randv(N * C, 1.0f)},
                              {"inp", ZOFF_F32, N * C, false, x},
                              {"weight", ZOFF_F32, C, false, randv(C, 1.0f)},
                              {"mean", ZOFF_F32, N, false, mean},
                              {"rstd", ZOFF_F32, N, false, rstd}};
        compare(C == 5 ? "layernorm bwd N=40000 C=5 f32" : "layernorm bwd N=40000 C=8 f32", cpu, gpu, b,
                [&](zoff_stream *s, std::vector<void *> &p) {
            zoff_op_layernorm_bwd_args a = {p[0], p[1], p[2], p[3], p[4], p[5], (const float *)p[6],
                                            (const float *)p[7], N, C, ZOFF_F32};
            return ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_BWD, a);
        }, 1e-4);
    }
    { // grad stats over more than 1024 blocks' worth
        const int64_t n = 4500000;
        std::vector<Buf> b = {{"stats", ZOFF_F32, 2, true, {0.25f, 0.0f}}, {"x", ZOFF_BF16, n, false, randv(n, 3.0f)}};
        compare("grad_stats n=4.5M bf16", cpu, gpu, b, [&](zoff_stream *s, std::vector<void *> &p) {
            zoff_op_grad_stats_args a = {(float *)p[0], p[1], n, ZOFF_BF16};
            return ZOFF_LAUNCH(s, ZOFF_OP_GRAD_STATS, a);
        }, 1e-6);
    }
    { // embedding backward: few distinct tokens, long runs
        const int64_t B = 3, T = 50, C = 40, V = 7;
        std::vector<float> tok((size_t)(B * T));
        for (auto &t : tok) t = (float)(int)((frand() + 1.0f) * 3.49f);
        for (zoff_dtype dt : {ZOFF_F32, ZOFF_BF16}) {
            std::vector<Buf> b = {{"dwte", dt, V * C, true, randv(V * C, 1.0f)},
                                  {"dwpe", dt, T * C, true, randv(T * C, 1.0f)},
                                  {"dout", dt, B * T * C, false, randv(B * T * C, 1.0f)},
                                  {"tokens", ZOFF_I32, B * T, false, tok}};
            compare(dt == ZOFF_F32 ? "embed bwd runs f32" : "embed bwd runs bf16", cpu, gpu, b,
                    [&](zoff_stream *s, std::vector<void *> &p) {
                        zoff_op_embed_bwd_args a = {p[0], p[1], p[2], (const int32_t *)p[3], B, T, C, V, dt};
                        return ZOFF_LAUNCH(s, ZOFF_OP_EMBED_BWD, a);
                    },
                    dt == ZOFF_F32 ? 0.0 : 1e-2);
        }
    }
    { // overlapping same-dtype cast (memmove), and in-place bf16 -> f16 is refused only for different sizes
        const int64_t n = 1000;
        std::vector<Buf> b = {{"buf", ZOFF_F32, n + 10, true, randv(n + 10, 1.0f)}};
        compare("cast f32 overlapping (memmove)", cpu, gpu, b, [&](zoff_stream *s, std::vector<void *> &p) {
            zoff_op_cast_args a = {(float *)p[0] + 7, p[0], n, ZOFF_F32, ZOFF_F32};
            return ZOFF_LAUNCH(s, ZOFF_OP_CAST, a);
        }, 0.0);
        std::vector<Buf> c = {{"buf", ZOFF_BF16, n, true, randv(n, 1.0f)}};
        compare("cast bf16 -> f16 in place", cpu, gpu, c, [&](zoff_stream *s, std::vector<void *> &p) {
            zoff_op_cast_args a = {p[0], p[0], n, ZOFF_F16, ZOFF_BF16};
            return ZOFF_LAUNCH(s, ZOFF_OP_CAST, a);
        }, 0.0);
    }
}

// The reductions have no floating-point atomics: two runs give the same bits.
void determinism(zoff_device *gpu) {
    struct Case {
        const char *what;
        std::vector<Buf> bufs;
        Launch launch;
    };
    const int64_t B = 2, T = 150, C = 128, NH = 2, N = B * T, V = 300, OC = 96;
    std::vector<float> tok((size_t)N), mean((size_t)N, 0.1f), rstd((size_t)N, 1.3f);
    for (auto &t : tok) t = (float)(int)((frand() + 1.0f) * 0.5f * (V - 1));
    std::vector<Case> cases;
    cases.push_back({"attention bwd (tensor cores, HS 64) bf16",
                     {{"dqkv", ZOFF_BF16, N * 3 * C, true, {}},
                      {"dout", ZOFF_BF16, N * C, false, randv(N * C, 1.0f)},
                      {"qkv", ZOFF_BF16, N * 3 * C, false, randv(N * 3 * C, 2.0f)},
                      {"out", ZOFF_BF16, N * C, false, randv(N * C, 1.0f)},
                      {"lse", ZOFF_F32, B * NH * T, false, randv(B * NH * T, 1.0f)}},
                     [&](zoff_stream *s, std::vector<void *> &p) {
                         zoff_op_attention_bwd_args a = {p[0], p[1], p[2], p[3], (const float *)p[4], B, T, C, NH,
                                                         ZOFF_BF16};
                         return ZOFF_LAUNCH(s, ZOFF_OP_ATTENTION_BWD, a);
                     }});
    cases.push_back({"layernorm bwd f32",
                     {{"dinp", ZOFF_F32, N * C, true, randv(N * C, 1.0f)},
                      {"dweight", ZOFF_F32, C, true, randv(C, 1.0f)},
                      {"dbias", ZOFF_F32, C, true, randv(C, 1.0f)},
                      {"dout", ZOFF_F32, N * C, false, randv(N * C, 1.0f)},
                      {"inp", ZOFF_F32, N * C, false, randv(N * C, 1.0f)},
                      {"weight", ZOFF_F32, C, false, randv(C, 1.0f)},
                      {"mean", ZOFF_F32, N, false, mean},
                      {"rstd", ZOFF_F32, N, false, rstd}},
                     [&](zoff_stream *s, std::vector<void *> &p) {
                         zoff_op_layernorm_bwd_args a = {p[0], p[1], p[2], p[3], p[4], p[5], (const float *)p[6],
                                                         (const float *)p[7], N, C, ZOFF_F32};
                         return ZOFF_LAUNCH(s, ZOFF_OP_LAYERNORM_BWD, a);
                     }});
    cases.push_back({"embed bwd f32",
                     {{"dwte", ZOFF_F32, V * C, true, randv(V * C, 1.0f)},
                      {"dwpe", ZOFF_F32, T * C, true, randv(T * C, 1.0f)},
                      {"dout", ZOFF_F32, N * C, false, randv(N * C, 1.0f)},
                      {"tokens", ZOFF_I32, N, false, tok}},
                     [&](zoff_stream *s, std::vector<void *> &p) {
                         zoff_op_embed_bwd_args a = {p[0], p[1], p[2], (const int32_t *)p[3], B, T, C, V, ZOFF_F32};
                         return ZOFF_LAUNCH(s, ZOFF_OP_EMBED_BWD, a);
                     }});
    cases.push_back({"matmul bwd bf16",
                     {{"dinp", ZOFF_BF16, N * C, true, randv(N * C, 1.0f)},
                      {"dweight", ZOFF_BF16, OC * C, true, randv(OC * C, 1.0f)},
                      {"dbias", ZOFF_BF16, OC, true, randv(OC, 1.0f)},
                      {"dout", ZOFF_BF16, N * OC, false, randv(N * OC, 1.0f)},
                      {"inp", ZOFF_BF16, N * C, false, randv(N * C, 1.0f)},
                      {"weight", ZOFF_BF16, OC * C, false, randv(OC * C, 0.3f)}},
                     [&](zoff_stream *s, std::vector<void *> &p) {
                         zoff_op_matmul_bwd_args a = {p[0], p[1], p[2], p[3], p[4], p[5], N, C, OC, ZOFF_BF16, 0, nullptr, nullptr};
                         return ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_BWD, a);
                     }});
    cases.push_back({"grad_stats f32",
                     {{"stats", ZOFF_F32, 2, true, {0.0f, 0.0f}}, {"x", ZOFF_F32, 3000001, false, randv(3000001, 1.0f)}},
                     [&](zoff_stream *s, std::vector<void *> &p) {
                         zoff_op_grad_stats_args a = {(float *)p[0], p[1], 3000001, ZOFF_F32};
                         return ZOFF_LAUNCH(s, ZOFF_OP_GRAD_STATS, a);
                     }});
    for (auto &c : cases) {
        zoff_status s1, s2;
        std::vector<Buf> b1 = c.bufs, b2 = c.bufs;
        auto r1 = run(gpu, b1, c.launch, &s1);
        auto r2 = run(gpu, b2, c.launch, &s2);
        CHECK(s1 == ZOFF_OK && s2 == ZOFF_OK, "%s: %s", c.what, zoff_last_error());
        if (s1 != ZOFF_OK || s2 != ZOFF_OK) continue;
        bool same = r1.size() == r2.size();
        for (size_t k = 0; same && k < r1.size(); k++)
            same = memcmp(r1[k].data(), r2[k].data(), r1[k].size() * sizeof(float)) == 0;
        CHECK(same, "%s: two runs differ", c.what);
        printf("emu_check: deterministic: %-40s %s\n", c.what, same ? "yes" : "NO");
    }
}

// Asynchronous errors: reported by stream sync (sticky) and by event sync for events
// recorded after the failing launch only; other streams are unaffected.
void async_errors(zoff_device *gpu) {
    zoff_stream *s1 = nullptr, *s2 = nullptr;
    zoff_event *before = nullptr, *after = nullptr, *other = nullptr;
    OK(zoff_stream_create(gpu, "s1", &s1));
    OK(zoff_stream_create(gpu, "s2", &s2));
    OK(zoff_event_create(gpu, &before));
    OK(zoff_event_create(gpu, &after));
    OK(zoff_event_create(gpu, &other));
    const int64_t B = 1, T = 4, C = 8, V = 10;
    void *out = nullptr, *tok = nullptr, *wte = nullptr, *wpe = nullptr;
    OK(zoff_device_alloc(gpu, (size_t)(B * T * C) * 4, "out", &out));
    OK(zoff_device_alloc(gpu, (size_t)(B * T) * 4, "tokens", &tok));
    OK(zoff_device_alloc(gpu, (size_t)(V * C) * 4, "wte", &wte));
    OK(zoff_device_alloc(gpu, (size_t)(T * C) * 4, "wpe", &wpe));
    int32_t toks[4] = {1, 2, 13, 3};
    OK(zoff_memcpy_async(s1, tok, toks, sizeof toks, ZOFF_COPY_H2D));
    OK(zoff_memset_async(s1, wte, 0, (size_t)(V * C) * 4));
    OK(zoff_memset_async(s1, wpe, 0, (size_t)(T * C) * 4));
    OK(zoff_stream_synchronize(s1));
    OK(zoff_event_record(before, s1));
    zoff_op_embed_fwd_args a = {out, (const int32_t *)tok, wte, wpe, B, T, C, V, ZOFF_F32};
    OK(ZOFF_LAUNCH(s1, ZOFF_OP_EMBED_FWD, a));
    OK(zoff_event_record(after, s1));
    OK(zoff_event_record(other, s2));
    CHECK(zoff_event_synchronize(before) == ZOFF_OK, "event recorded before the bad launch reports: %s",
          zoff_last_error());
    zoff_status st = zoff_event_synchronize(after);
    CHECK(st == ZOFF_ERR_INVALID && strstr(zoff_last_error(), "token id 13") &&
              strstr(zoff_last_error(), "position 2"),
          "event after the bad launch: %s: %s", zoff_status_name(st), zoff_last_error());
    st = zoff_stream_synchronize(s1);
    CHECK(st == ZOFF_ERR_INVALID && strstr(zoff_last_error(), "embed_fwd") && strstr(zoff_last_error(), "'s1'"),
          "stream sync: %s: %s", zoff_status_name(st), zoff_last_error());
    printf("emu_check: stream error message: %s\n", zoff_last_error());
    st = zoff_stream_synchronize(s1);
    CHECK(st == ZOFF_ERR_INVALID, "the error is sticky: %s", zoff_status_name(st));
    CHECK(zoff_event_synchronize(other) == ZOFF_OK, "another stream's event: %s", zoff_last_error());
    CHECK(zoff_stream_synchronize(s2) == ZOFF_OK, "another stream: %s", zoff_last_error());
    // a new stream reusing a slot starts clean
    zoff_stream_destroy(s1);
    zoff_stream *s3 = nullptr;
    OK(zoff_stream_create(gpu, "s3", &s3));
    CHECK(zoff_stream_synchronize(s3) == ZOFF_OK, "a new stream after a failed one: %s", zoff_last_error());
    // cross entropy target >= V on s3
    void *losses = nullptr, *logits = nullptr, *targets = nullptr;
    OK(zoff_device_alloc(gpu, 16, "losses", &losses));
    OK(zoff_device_alloc(gpu, 4 * 5 * 4, "logits", &logits));
    OK(zoff_device_alloc(gpu, 16, "targets", &targets));
    int32_t tg[4] = {0, -1, 5, 1};
    OK(zoff_memcpy_async(s3, targets, tg, sizeof tg, ZOFF_COPY_H2D));
    OK(zoff_memset_async(s3, logits, 0, 4 * 5 * 4));
    zoff_op_cross_entropy_args ce = {(float *)losses, logits, logits, (const int32_t *)targets, 4, 5, 5, 1.0f,
                                     ZOFF_F32};
    OK(ZOFF_LAUNCH(s3, ZOFF_OP_CROSS_ENTROPY, ce));
    st = zoff_stream_synchronize(s3);
    CHECK(st == ZOFF_ERR_INVALID && strstr(zoff_last_error(), "target 5") && strstr(zoff_last_error(), "row 2"),
          "cross entropy target: %s: %s", zoff_status_name(st), zoff_last_error());
    // host fn runs in order
    int flag = 0;
    OK(zoff_stream_host_fn(s2, [](void *p) { *(int *)p = 42; }, &flag));
    OK(zoff_stream_synchronize(s2));
    CHECK(flag == 42, "host fn did not run");
    for (void *p : {out, tok, wte, wpe, losses, logits, targets}) zoff_device_free(gpu, p);
    zoff_event_destroy(before);
    zoff_event_destroy(after);
    zoff_event_destroy(other);
    zoff_stream_destroy(s2);
    zoff_stream_destroy(s3);
    printf("emu_check: asynchronous error semantics checked\n");
}

// The op profiler on the CUDA backend's timers (timing events): classes, FLOPs, and a 30 ms
// gap made by a host fn that blocks the stream shows in the span but not in the busy time.
void profiler(zoff_device *gpu) {
    zoff_stream *s = zoff_device_stream(gpu);
    const int64_t N = 64, C = 96, OC = 32;
    void *x = nullptr, *w = nullptr, *y = nullptr;
    OK(zoff_device_alloc(gpu, (size_t)(N * C) * 4, "x", &x));
    OK(zoff_device_alloc(gpu, (size_t)(OC * C) * 4, "w", &w));
    OK(zoff_device_alloc(gpu, (size_t)(N * OC) * 4, "y", &y));
    OK(zoff_memset_async(s, w, 0, (size_t)(OC * C) * 4));
    OK(zoff_profile_start(gpu, 0));
    OK(zoff_memset_async(s, x, 0, (size_t)(N * C) * 4));
    OK(zoff_stream_host_fn(s, [](void *) { struct timespec t = {0, 30000000L}; nanosleep(&t, nullptr); }, nullptr));
    zoff_op_matmul_fwd_args m = {y, x, w, nullptr, N, C, OC, ZOFF_F32, nullptr};
    OK(ZOFF_LAUNCH(s, ZOFF_OP_MATMUL_FWD, m));
    zoff_profile p;
    OK(zoff_profile_collect(gpu, &p));
    CHECK(p.count[ZOFF_CLASS_MEMSET] == 1 && p.count[ZOFF_CLASS_GEMM] == 1, "profiler counts: memset %lld, gemm %lld",
          (long long)p.count[ZOFF_CLASS_MEMSET], (long long)p.count[ZOFF_CLASS_GEMM]);
    CHECK(p.flops[ZOFF_CLASS_GEMM] == 2.0 * N * C * OC, "profiler GEMM FLOPs %.17g", p.flops[ZOFF_CLASS_GEMM]);
    CHECK(p.span_ms >= 29.0 && p.busy_ms <= p.span_ms - 29.0 && p.ms[ZOFF_CLASS_GEMM] >= 0,
          "profiler times: span %.3f ms, busy %.3f ms, gemm %.3f ms", p.span_ms, p.busy_ms, p.ms[ZOFF_CLASS_GEMM]);
    zoff_profile_stop(gpu);
    for (void *q : {x, w, y}) zoff_device_free(gpu, q);
    printf("emu_check: op profiler on the backend's timers checked (span %.3f ms, busy %.3f ms)\n", p.span_ms,
           p.busy_ms);
}

// One GPT-2 step (1 layer, C 32, 2 heads, V 50, B 2, T 8) on dev: mean loss and the gradients.
void gpt2_step(zoff_device *dev, zoff_dtype dt, float *loss, std::vector<float> *grads) {
    const int64_t B = 2, T = 8;
    zoff_gpt2_options o = {};
    o.shape = {1, 32, 2, 16, 50, 0};
    o.batch_size = B, o.seq_len = T, o.dtype = dt;
    zoff_gpt2 *m = nullptr;
    OK(zoff_gpt2_create(dev, &o, &m));
    zoff_stream *s = zoff_device_stream(dev);
    const int64_t np = zoff_gpt2_num_params(m);
    std::vector<float> host((size_t)np);
    zoff_gpt2_init_params(m, 1234, host.data());
    std::vector<unsigned char> stage((size_t)np * dsz(dt));
    encode(stage.data(), host, dt);
    std::vector<int32_t> tok((size_t)(2 * B * T));
    for (size_t i = 0; i < tok.size(); i++) tok[i] = (int32_t)((i * 7 + 3) % 50);
    void *dtok = nullptr;
    zoff_status st = zoff_device_alloc(dev, tok.size() * 4, "tokens", &dtok);
    if (st == ZOFF_OK) st = zoff_memcpy_async(s, zoff_gpt2_params(m), stage.data(), stage.size(), ZOFF_COPY_H2D);
    if (st == ZOFF_OK) st = zoff_memcpy_async(s, dtok, tok.data(), tok.size() * 4, ZOFF_COPY_H2D);
    const int32_t *tk = (const int32_t *)dtok;
    if (st == ZOFF_OK) st = zoff_gpt2_forward_train(m, tk, tk + B * T, B, T, 1.0f);
    if (st == ZOFF_OK) st = zoff_gpt2_mean_loss(m, loss);
    if (st == ZOFF_OK) st = zoff_gpt2_backward(m, nullptr, nullptr);
    if (st == ZOFF_OK) st = zoff_memcpy_async(s, stage.data(), zoff_gpt2_grads(m), stage.size(), ZOFF_COPY_D2H);
    if (st == ZOFF_OK) st = zoff_stream_synchronize(s);
    if (st == ZOFF_OK) *grads = decode(stage.data(), np, dt);
    CHECK(st == ZOFF_OK, "GPT-2 step on %s: %s", zoff_device_name(dev), zoff_last_error());
    if (dtok) zoff_device_free(dev, dtok);
    zoff_gpt2_destroy(m);
}

// The model end to end on both backends: the matmul epilogues it uses (bias+GELU, dGELU + the bias
// gradient of c_fc, BGRADB, overwritten dinp without memsets) against the CPU backend's step.
void gpt2(zoff_device *cpu, zoff_device *gpu) {
    const zoff_dtype dts[2] = {ZOFF_F32, ZOFF_BF16};
    const double tol[2] = {1e-4, 3e-2};
    for (int i = 0; i < 2; i++) {
        float lc = 0, lg = 0;
        std::vector<float> gc, gg;
        gpt2_step(cpu, dts[i], &lc, &gc);
        gpt2_step(gpu, dts[i], &lg, &gg);
        if (gc.empty() || gg.size() != gc.size()) continue; // reported by gpt2_step
        const double el = fabs((double)lg - lc) / fabs((double)lc), eg = norm_err(gg, gc);
        CHECK(el <= tol[i] && eg <= tol[i], "GPT-2 %s: loss %.7g vs CPU %.7g (rel %.3g), gradients %.3g (limit %.2g)",
              zoff_dtype_name(dts[i]), lg, lc, el, eg, tol[i]);
        printf("emu_check: GPT-2 step %s: loss rel diff %.2e, gradients %.2e (limit %.2g)\n", zoff_dtype_name(dts[i]),
               el, eg, tol[i]);
    }
}

} // namespace

int main() {
    if (!zoff_backend_available(ZOFF_BACKEND_CUDA)) {
        printf("emu_check: no CUDA device\n");
        return 1;
    }
    zoff_device_options oc = {ZOFF_BACKEND_CPU, 0, 0, 0}, og = {ZOFF_BACKEND_CUDA, 0, 0, 0};
    zoff_device *cpu = nullptr, *gpu = nullptr;
    if (zoff_device_create(&oc, &cpu) != ZOFF_OK || zoff_device_create(&og, &gpu) != ZOFF_OK) {
        printf("emu_check: device creation failed: %s\n", zoff_last_error());
        return 1;
    }
    printf("emu_check: %s vs %s\n", zoff_device_name(gpu), zoff_device_name(cpu));
    attention(cpu, gpu);
    matmul(cpu, gpu);
    reductions(cpu, gpu);
    determinism(gpu);
    async_errors(gpu);
    profiler(gpu);
    gpt2(cpu, gpu);
    zoff_device_destroy(gpu);
    zoff_device_destroy(cpu);
    printf("emu_check: %s (%d failure%s)\n", g_fail ? "FAILED" : "passed", g_fail, g_fail == 1 ? "" : "s");
    return g_fail ? 1 : 0;
}
