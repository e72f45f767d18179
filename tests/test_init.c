/* Start-up pieces (src/core/rng.c, src/core/parallel.c, the GPT-2
 * initialisation in src/model/gpt2.c) against independent references:
 *   - Philox4x32-10 against Random123's published known-answer vectors;
 *   - the normals against a double-precision Box-Muller over this file's own
 *     Philox (written from the paper), element by element;
 *   - the initial weights: the same bits for 1, 2 and 7 threads and for any
 *     split into ranges; every element against the double reference of the
 *     GPT-2 rule (N(0, 0.02), residual projections N(0, 0.02 / sqrt(2L)),
 *     biases 0, LayerNorm weights 1, padded wte rows 0); mean and standard
 *     deviation per tensor within sampling bounds;
 *   - the parallel fills, copies and casts against the scalar conversions;
 *   - the streaming copy, at every store width this CPU has, against the source bytes, for
 *     every alignment of source and destination and ragged lengths, nothing written outside. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/parallel_internal.h"
#include "zoff/core.h"
#include "zoff/device.h"
#include "zoff/model.h"

#define CHECK_OK(expr)                                                                          \
    do {                                                                                        \
        zoff_status s_ = (expr);                                                                \
        if (s_ != ZOFF_OK) fail_msg("%s -> %s: %s", #expr, zoff_status_name(s_), zoff_last_error()); \
    } while (0)

/* ------------------------------------------------------------------ reference generator */

/* Philox4x32 with 10 rounds, written from Salmon et al. (SC'11), table 2 and section 5. */
static void ref_philox(const uint32_t in[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t x[4] = {in[0], in[1], in[2], in[3]}, k[2] = {key[0], key[1]};
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k[0] += 0x9E3779B9u;
            k[1] += 0xBB67AE85u;
        }
        uint64_t a = (uint64_t)x[0] * 0xD2511F53u, b = (uint64_t)x[2] * 0xCD9E8D57u;
        uint32_t y0 = (uint32_t)(b >> 32) ^ x[1] ^ k[0], y1 = (uint32_t)b;
        uint32_t y2 = (uint32_t)(a >> 32) ^ x[3] ^ k[1], y3 = (uint32_t)a;
        x[0] = y0, x[1] = y1, x[2] = y2, x[3] = y3;
    }
    memcpy(out, x, sizeof x);
}

/* The normal number e of stream (seed, stream), in double (rng.c's definition). */
static double ref_normal(uint64_t seed, uint32_t stream, int64_t e) {
    uint64_t j = (uint64_t)e >> 2;
    uint32_t c[4] = {(uint32_t)j, (uint32_t)(j >> 32), stream, 0}, k[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, x[4];
    ref_philox(c, k, x);
    int p = (int)(e & 3) >> 1;
    double u1 = ((double)(x[2 * p] >> 9) + 0.5) / 8388608.0, u2 = (double)(x[2 * p + 1] >> 8) / 16777216.0;
    double r = sqrt(-2.0 * log(u1)), th = 2.0 * 3.14159265358979323846 * u2;
    return (e & 1) ? r * sin(th) : r * cos(th);
}

/* fp32 Box-Muller with its polynomials against the double formula */
static void assert_close(double got, double want, double scale, const char *what, int64_t e) {
    double tol = 2e-6 * scale * (1.0 + fabs(want / scale));
    if (!(fabs(got - want) <= tol))
        fail_msg("%s element %lld: %.9g, reference %.9g (|diff| %.3g > %.3g)", what, (long long)e, got, want,
                 fabs(got - want), tol);
}

/* ------------------------------------------------------------------ tests */

static void test_philox_known_answers(void **state) {
    (void)state;
    /* Random123 kat_vectors, philox4x32 with 10 rounds: counter, key, expected */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du, 0x41c83b0eu,
         0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u, 0x94fdccebu,
         0x5001e420u, 0x24126ea1u},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t got[4], ref[4];
        zoff_philox4x32(kat[i], kat[i] + 4, got);
        ref_philox(kat[i], kat[i] + 4, ref);
        for (int l = 0; l < 4; l++) {
            if (ref[l] != kat[i][6 + l]) fail_msg("reference philox, vector %d lane %d: %08x, want %08x", i, l, ref[l], kat[i][6 + l]);
            if (got[l] != kat[i][6 + l]) fail_msg("zoff_philox4x32, vector %d lane %d: %08x, want %08x", i, l, got[l], kat[i][6 + l]);
        }
    }
}

static void test_normal_reference_and_ranges(void **state) {
    (void)state;
    const int64_t first = 1ll << 33 | 3, n = 200003; /* a counter above 32 bits, an odd start */
    const uint64_t seed = 0x0123456789abcdefull;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    zoff_rng_normal(seed, 7, first, n, 1.0f, a);
    double s1 = 0, s2 = 0, s4 = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_close(a[i], ref_normal(seed, 7, first + i), 1.0, "zoff_rng_normal", first + i);
        s1 += a[i], s2 += (double)a[i] * a[i], s4 += (double)a[i] * a[i] * a[i] * a[i];
    }
    /* moments of N(0, 1): 4.5 standard errors */
    double mean = s1 / (double)n, var = s2 / (double)n, kurt = s4 / (double)n;
    assert_true(fabs(mean) < 4.5 / sqrt((double)n));
    assert_true(fabs(var - 1.0) < 4.5 * sqrt(2.0 / (double)n));
    assert_true(fabs(kurt - 3.0) < 4.5 * sqrt(96.0 / (double)n));
    /* any split into pieces gives the same bits */
    for (int64_t lo = 0; lo < n;) {
        int64_t len = 1 + (lo * 7919 + 13) % 1031;
        if (lo + len > n) len = n - lo;
        zoff_rng_normal(seed, 7, first + lo, len, 1.0f, b + lo);
        lo += len;
    }
    assert_memory_equal(a, b, (size_t)n * sizeof(float));
    /* std scales; another stream or seed differs */
    zoff_rng_normal(seed, 7, first, n, 0.5f, b);
    for (int64_t i = 0; i < n; i++) assert_close(b[i], 0.5 * ref_normal(seed, 7, first + i), 0.5, "std 0.5", i);
    zoff_rng_normal(seed, 8, first, n, 1.0f, b);
    assert_memory_not_equal(a, b, (size_t)n * sizeof(float));
    zoff_rng_normal(seed + 1, 7, first, n, 1.0f, b);
    assert_memory_not_equal(a, b, (size_t)n * sizeof(float));
    free(a);
    free(b);
}

static zoff_gpt2 *make_model(zoff_device **dev, int L) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    CHECK_OK(zoff_device_create(&o, dev));
    zoff_gpt2_options mo = {.shape = {.num_layers = L, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64,
                                      .vocab_size = 1000, .padded_vocab_size = 0},
                            .batch_size = 1, .seq_len = 8, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(*dev, &mo, &m));
    return m;
}

/* every element against the rule, in double; moments per weight tensor */
static void check_against_rule(const zoff_gpt2 *m, uint64_t seed, const float *w, int L) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors((zoff_gpt2 *)m, &nt);
    int64_t covered = 0;
    for (int i = 0; i < nt; i++) {
        const float *x = w + t[i].offset;
        const char *name = t[i].name;
        size_t len = strlen(name);
        bool bias = len > 5 && !strcmp(name + len - 5, ".bias"), ln = strstr(name, "ln_") != NULL;
        covered += t[i].numel;
        if (bias || ln) {
            for (int64_t j = 0; j < t[i].numel; j++)
                if (x[j] != (bias ? 0.0f : 1.0f)) fail_msg("%s[%lld] = %g", name, (long long)j, (double)x[j]);
            continue;
        }
        double std = strstr(name, "attn.c_proj.weight") || strstr(name, "mlp.c_proj.weight") ? 0.02 / sqrt(2.0 * L) : 0.02;
        int64_t nr = i == 0 ? 1000 * 128 : t[i].numel; /* wte: the real vocabulary rows */
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < nr; j++) {
            assert_close(x[j], std * ref_normal(seed, (uint32_t)i, j), std, name, j);
            s1 += x[j], s2 += (double)x[j] * x[j];
        }
        for (int64_t j = nr; j < t[i].numel; j++)
            if (x[j] != 0.0f) fail_msg("%s padded element %lld = %g", name, (long long)j, (double)x[j]);
        double mean = s1 / (double)nr, sd = sqrt(s2 / (double)nr - mean * mean);
        if (fabs(mean) > 4.5 * std / sqrt((double)nr)) fail_msg("%s: mean %.3g (std %.3g, n %lld)", name, mean, std, (long long)nr);
        if (fabs(sd / std - 1.0) > 4.5 * sqrt(0.5 / (double)nr)) fail_msg("%s: std %.5g, want %.5g", name, sd, std);
    }
    assert_int_equal(covered, zoff_gpt2_num_params(m));
}

static void test_gpt2_init_threads_and_ranges(void **state) {
    (void)state;
    const int L = 3;
    zoff_device *dev = NULL;
    zoff_gpt2 *m = make_model(&dev, L);
    const int64_t P = zoff_gpt2_num_params(m);
    const size_t bytes = (size_t)P * sizeof(float);
    assert_true(zoff_par_threads(bytes) > 1 || omp_get_max_threads() == 1); /* big enough to be split */
    float *w1 = malloc(bytes), *w = malloc(bytes);
    assert_non_null(w1);
    assert_non_null(w);
    int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    zoff_gpt2_init_params(m, 1234, w1);
    check_against_rule(m, 1234, w1, L);
    static const int threads[] = {2, 7};
    for (int k = 0; k < 2; k++) {
        omp_set_num_threads(threads[k]);
        memset(w, 0xff, bytes);
        zoff_gpt2_init_params(m, 1234, w);
        if (memcmp(w, w1, bytes)) fail_msg("%d threads give other weights than 1 thread", threads[k]);
    }
    /* ranges cut anywhere (inside tensors, across tensor boundaries) */
    memset(w, 0xff, bytes);
    for (int64_t lo = 0; lo < P;) {
        int64_t len = 1 + (lo * 104729 + 17) % 150001;
        if (lo + len > P) len = P - lo;
        zoff_gpt2_init_params_range(m, 1234, lo, lo + len, w + lo);
        lo += len;
    }
    if (memcmp(w, w1, bytes)) fail_msg("pieces give other weights than the whole");
    zoff_gpt2_init_params(m, 1235, w);
    assert_memory_not_equal(w, w1, bytes);
    omp_set_num_threads(saved);
    free(w1);
    free(w);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

static void test_parallel_fill_copy_cast(void **state) {
    (void)state;
    const size_t n = (3u << 20) + 77; /* several threads' pieces and a ragged end */
    float *src = malloc(n * sizeof(float)), *dst = malloc(n * sizeof(float));
    uint16_t *h = malloc(n * sizeof(uint16_t));
    assert_non_null(src);
    assert_non_null(dst);
    assert_non_null(h);
    zoff_rng_normal(5, 0, 0, (int64_t)n, 1e3f, src);
    src[1] = NAN, src[2] = INFINITY, src[3] = -0.0f, src[4] = 1e-40f, src[5] = 70000.0f; /* specials */
    int saved = omp_get_max_threads();
    for (int t = 1; t <= 3; t += 2) {
        omp_set_num_threads(t);
        zoff_par_memcpy(dst, src, n * sizeof(float));
        assert_memory_equal(dst, src, n * sizeof(float));
        zoff_par_f32_to_bf16(h, src, n);
        for (size_t i = 0; i < n; i++)
            if (h[i] != zoff_f32_to_bf16(src[i])) fail_msg("bf16 cast of element %zu differs", i);
        zoff_par_f32_to_f16(h, src, n);
        for (size_t i = 0; i < n; i++)
            if (h[i] != zoff_f32_to_f16(src[i])) fail_msg("fp16 cast of element %zu differs", i);
        zoff_par_memset(dst, 0, n * sizeof(float));
        for (size_t i = 0; i < n; i++) assert_true(dst[i] == 0.0f);
        zoff_par_fill_f32(dst, 0.25f, n - 3);
        for (size_t i = 0; i < n; i++) assert_true(dst[i] == (i < n - 3 ? 0.25f : 0.0f));
        zoff_par_fill_u16(h, 0x3f80, n);
        for (size_t i = 0; i < n; i++) assert_true(h[i] == 0x3f80);
    }
    omp_set_num_threads(saved);
    free(src);
    free(dst);
    free(h);
}

static void test_streaming_copy_widths(void **state) {
    (void)state;
    enum { CAP = 70000, GUARD = 128 };
    static const size_t lens[] = {0, 1, 15, 16, 63, 64, 65, 127, 128, 255, 256, 257, 511, 1000, 4109, 65536 + 191};
    unsigned char *src = malloc(CAP + 2 * GUARD), *dst = malloc(CAP + 2 * GUARD);
    assert_non_null(src);
    assert_non_null(dst);
    for (size_t i = 0; i < CAP + 2 * GUARD; i++) src[i] = (unsigned char)(i * 131u + (i >> 8) * 7u + 1u);
    const int widest = zoff_copy_streaming__widest();
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    /* independent of zoff_cpu_features: the compiler's own CPU model */
    assert_int_equal(widest, __builtin_cpu_supports("avx512f") ? 64 : __builtin_cpu_supports("avx2") ? 32 : 16);
#endif
    int tested = 0;
    for (int w = 0; w <= 64; w = w ? 2 * w : 16) {
        if (w > widest) {
            print_message("streaming copy: %d-byte stores not on this CPU/build (skipped)\n", w);
            continue;
        }
        for (size_t so = 0; so < 64; so += 7)
            for (size_t dof = 0; dof < 64; dof++)
                for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
                    const size_t n = lens[k];
                    memset(dst + dof, 0xA5, n + 2 * GUARD); /* the range and a guard either side */
                    zoff_copy_streaming__width(dst + GUARD + dof, src + GUARD + so, n, w);
                    zoff_store_fence();
                    if (memcmp(dst + GUARD + dof, src + GUARD + so, n) != 0)
                        fail_msg("width %d, src +%zu, dst +%zu, %zu bytes: the copy differs", w, so, dof, n);
                    for (size_t i = dof; i < dof + n + 2 * GUARD; i++)
                        if ((i < GUARD + dof || i >= GUARD + dof + n) && dst[i] != 0xA5)
                            fail_msg("width %d, src +%zu, dst +%zu, %zu bytes: byte %zu outside written", w, so, dof, n,
                                     i);
                }
        tested++;
    }
    print_message("streaming copy: widest store %d bytes; %d widths tested\n", widest, tested);
    zoff_copy_streaming(dst + GUARD + 3, src + GUARD, CAP - 3); /* the dispatcher */
    zoff_store_fence();
    assert_memory_equal(dst + GUARD + 3, src + GUARD, CAP - 3);
    free(src);
    free(dst);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_normal_reference_and_ranges),
        cmocka_unit_test(test_gpt2_init_threads_and_ranges),
        cmocka_unit_test(test_parallel_fill_copy_cast),
        cmocka_unit_test(test_streaming_copy_widths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
