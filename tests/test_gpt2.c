/* GPT-2 forward/backward (src/model/gpt2.c) on the CPU backend, checked against
 * an independent PyTorch GPT-2 (tests/fixtures/gen_gpt2_fixture.py, computed in
 * float64 from the same float32 parameters), against central finite
 * differences, and for its contracts (checkpointing, grad-ready ranges,
 * errors, device budget).
 *
 * Tolerances (fp32 storage; the reference is fp64, so the error is zoff's):
 *   error of a tensor = max_i |got_i - want_i| / max_i |want_i|   ("normalised max error")
 *   logits            <= 1e-5   (measured 3.7e-7: a handful of fp32 roundings
 *                                 through 2 blocks; 1e-5 leaves ~30x headroom for
 *                                 other summation orders, yet any wrong op gives >= 1e-2)
 *   loss              |got - want| <= 2e-6 * want   (measured 0: fp32 ulp is 1.2e-7)
 *   every gradient    <= 3e-5 per tensor (measured worst 8.9e-7; gradients pass
 *                                 through more ops and sums of cancelling terms;
 *                                 a wrong or missing term gives >= 1e-2)
 *   AdamW losses      |got - want| <= 1e-5 * want at each of the 10 steps
 *                                 (measured worst 1.9e-7. Adam divides by sqrt(v), so
 *                                 fp32 noise in near-zero gradients moves those
 *                                 elements by up to ~lr and the trajectory drifts
 *                                 slowly; 1e-5 still catches a weight decay of
 *                                 half the right size, which is off by 2e-5 at step 4)
 * 16-bit storage (bf16 / f16) uses its own, looser bounds, stated in that test. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zoff/model.h"

/* ------------------------------------------------------------------ fixture */

#define FX_MAGIC 0x32464752
#define FX_VERSION 1
#define FX_HEADER_BYTES 96

typedef struct fixture {
    int L, C, NH, maxT, V, Vp, B, T, nsteps;
    int64_t num_params;
    float lr, beta1, beta2, eps, weight_decay;
    float *params;      /* (num_params) */
    int32_t *tokens;    /* (B*T) */
    int32_t *targets;   /* (B*T) */
    float *logits;      /* (B*T*Vp) */
    float loss;
    float *grads;       /* (num_params) */
    float *step_losses; /* (nsteps) */
    void *blob;
} fixture;

static fixture g_fx;

/* Load and check a fixture file: magic, version, sane header, exact size. */
static zoff_status fixture_load(const char *path, fixture *fx) {
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f) return zoff_error(ZOFF_ERR_IO, "cannot open fixture %s (regenerate with gen_gpt2_fixture.py)", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (size < FX_HEADER_BYTES) {
        fclose(f);
        return zoff_error(ZOFF_ERR_FORMAT, "fixture %s is %ld bytes, shorter than its %d-byte header", path, size,
                          FX_HEADER_BYTES);
    }
    char *blob = malloc((size_t)size);
    if (!blob || fread(blob, 1, (size_t)size, f) != (size_t)size) {
        free(blob);
        fclose(f);
        return zoff_error(ZOFF_ERR_IO, "cannot read fixture %s", path);
    }
    fclose(f);
    int32_t h[16];
    float hf[8];
    memcpy(h, blob, sizeof h);
    memcpy(hf, blob + 64, sizeof hf);
    if (h[0] != FX_MAGIC || h[1] != FX_VERSION) {
        free(blob);
        return zoff_error(ZOFF_ERR_FORMAT, "fixture %s: magic 0x%08x version %d, want 0x%08x version %d", path,
                          (unsigned)h[0], h[1], FX_MAGIC, FX_VERSION);
    }
    for (int i = 2; i <= 11; i++) {
        if (h[i] < 1 || h[i] > (1 << 20)) {
            free(blob);
            return zoff_error(ZOFF_ERR_FORMAT, "fixture %s: header field %d is %d, outside [1, 2^20]", path, i, h[i]);
        }
    }
    fx->L = h[2]; fx->C = h[3]; fx->NH = h[4]; fx->maxT = h[5]; fx->V = h[6]; fx->Vp = h[7];
    fx->B = h[8]; fx->T = h[9]; fx->nsteps = h[10]; fx->num_params = h[11];
    fx->lr = hf[0]; fx->beta1 = hf[1]; fx->beta2 = hf[2]; fx->eps = hf[3]; fx->weight_decay = hf[4];
    int64_t N = (int64_t)fx->B * fx->T;
    int64_t want = FX_HEADER_BYTES + 4 * (2 * fx->num_params + 2 * N + N * fx->Vp + 1 + fx->nsteps);
    if (want != size) {
        free(blob);
        return zoff_error(ZOFF_ERR_FORMAT, "fixture %s is %ld bytes; its header implies %lld", path, size,
                          (long long)want);
    }
    char *p = blob + FX_HEADER_BYTES;
    fx->params = (float *)p; p += 4 * fx->num_params;
    fx->tokens = (int32_t *)p; p += 4 * N;
    fx->targets = (int32_t *)p; p += 4 * N;
    fx->logits = (float *)p; p += 4 * N * fx->Vp;
    memcpy(&fx->loss, p, 4); p += 4;
    fx->grads = (float *)p; p += 4 * fx->num_params;
    fx->step_losses = (float *)p;
    fx->blob = blob;
    return ZOFF_OK;
}

static zoff_gpt2_shape fx_shape(const fixture *fx) {
    zoff_gpt2_shape s = {.num_layers = fx->L, .hidden_size = fx->C, .num_heads = fx->NH,
                         .max_seq_len = fx->maxT, .vocab_size = fx->V, .padded_vocab_size = fx->Vp};
    return s;
}

/* ------------------------------------------------------------------ helpers */

#include "test_util.h"
#define CHECK_OK(expr) assert_ok(expr)

static zoff_device *make_device(size_t budget) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .memory_budget = budget, .threads = 2};
    zoff_device *dev = NULL;
    CHECK_OK(zoff_device_create(&o, &dev));
    return dev;
}

/* A device int32 copy of host data (n). */
static int32_t *upload_i32(zoff_device *dev, const int32_t *host, int64_t n) {
    void *d = NULL;
    CHECK_OK(zoff_device_alloc(dev, (size_t)n * 4, "test tokens", &d));
    CHECK_OK(zoff_memcpy_async(zoff_device_stream(dev), d, host, (size_t)n * 4, ZOFF_COPY_H2D));
    CHECK_OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    return d;
}

/* Copy n fp32 host values into a device buffer of dtype dt at element offset off. */
static void upload_as(zoff_device *dev, void *dst, int64_t off, const float *src, int64_t n, zoff_dtype dt) {
    size_t es = zoff_dtype_size(dt);
    void *tmp = malloc((size_t)n * es);
    assert_non_null(tmp);
    for (int64_t i = 0; i < n; i++) {
        if (dt == ZOFF_F32) ((float *)tmp)[i] = src[i];
        else if (dt == ZOFF_BF16) ((uint16_t *)tmp)[i] = zoff_f32_to_bf16(src[i]);
        else ((uint16_t *)tmp)[i] = zoff_f32_to_f16(src[i]);
    }
    zoff_stream *s = zoff_device_stream(dev);
    CHECK_OK(zoff_memcpy_async(s, (char *)dst + (size_t)off * es, tmp, (size_t)n * es, ZOFF_COPY_H2D));
    CHECK_OK(zoff_stream_synchronize(s));
    free(tmp);
}

/* n values of dtype dt from a device buffer, widened to fp32 on the host. */
static void download_as(zoff_device *dev, float *dst, const void *src, int64_t n, zoff_dtype dt) {
    size_t es = zoff_dtype_size(dt);
    void *tmp = malloc((size_t)n * es);
    assert_non_null(tmp);
    zoff_stream *s = zoff_device_stream(dev);
    CHECK_OK(zoff_memcpy_async(s, tmp, src, (size_t)n * es, ZOFF_COPY_D2H));
    CHECK_OK(zoff_stream_synchronize(s));
    for (int64_t i = 0; i < n; i++) {
        if (dt == ZOFF_F32) dst[i] = ((float *)tmp)[i];
        else if (dt == ZOFF_BF16) dst[i] = zoff_bf16_to_f32(((uint16_t *)tmp)[i]);
        else dst[i] = zoff_f16_to_f32(((uint16_t *)tmp)[i]);
    }
    free(tmp);
}

/* max_i |got-want| / max_i |want| (the normalised max error). */
static double norm_err(const float *got, const float *want, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (!(d <= num)) num = d; /* NaN propagates */
        if (fabs((double)want[i]) > den) den = fabs((double)want[i]);
    }
    return den > 0 ? num / den : num;
}

/* A model of the fixture's shape with the fixture's parameters. */
static zoff_gpt2 *fixture_model(zoff_device *dev, const fixture *fx, int64_t capB, int64_t capT, zoff_dtype dt,
                                bool checkpoint) {
    zoff_gpt2_options o = {.shape = fx_shape(fx), .batch_size = capB, .seq_len = capT, .dtype = dt,
                           .checkpoint_activations = checkpoint};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    assert_int_equal(zoff_gpt2_num_params(m), fx->num_params);
    upload_as(dev, zoff_gpt2_params(m), 0, fx->params, fx->num_params, dt);
    return m;
}

/* Forward + backward of the fixture batch; results to the host. */
typedef struct run_result {
    float loss;
    float *logits; /* (B*T*Vp) */
    float *grads;  /* (num_params) */
} run_result;

static void run_fixture(zoff_device *dev, zoff_gpt2 *m, const fixture *fx, zoff_dtype dt, run_result *r) {
    int64_t N = (int64_t)fx->B * fx->T;
    int32_t *tok = upload_i32(dev, fx->tokens, N), *tgt = upload_i32(dev, fx->targets, N);
    r->logits = malloc((size_t)(N * fx->Vp) * sizeof(float));
    r->grads = malloc((size_t)fx->num_params * sizeof(float));
    assert_non_null(r->logits);
    assert_non_null(r->grads);
    CHECK_OK(zoff_gpt2_forward(m, tok, tgt, fx->B, fx->T)); /* evaluation: the logits are kept */
    CHECK_OK(zoff_gpt2_mean_loss(m, &r->loss));
    download_as(dev, r->logits, zoff_gpt2_logits(m), N * fx->Vp, dt);
    /* training: the same losses, and dlogits in the same cross-entropy pass */
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, fx->B, fx->T, 1.0f));
    assert_null(zoff_gpt2_logits(m));
    float train_loss;
    CHECK_OK(zoff_gpt2_mean_loss(m, &train_loss));
    assert_true(train_loss == r->loss);
    CHECK_OK(zoff_gpt2_backward(m, NULL, NULL));
    download_as(dev, r->grads, zoff_gpt2_grads(m), fx->num_params, dt);
    zoff_device_free(dev, tok);
    zoff_device_free(dev, tgt);
}

static void run_result_free(run_result *r) {
    free(r->logits);
    free(r->grads);
}

/* ------------------------------------------------------------------ tests */

static void test_fixture_format(void **state) {
    (void)state;
    /* the committed fixture was checked by main(); a corrupt copy must be refused */
    const char *path = "gpt2_fixture_corrupt.bin";
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    size_t total = FX_HEADER_BYTES + 4 * (size_t)(2 * g_fx.num_params + 2 * g_fx.B * g_fx.T +
                                                  (int64_t)g_fx.B * g_fx.T * g_fx.Vp + 1 + g_fx.nsteps);
    char *copy = malloc(total);
    assert_non_null(copy);
    memcpy(copy, g_fx.blob, total);
    copy[0] ^= 0x5a; /* bad magic */
    assert_int_equal(fwrite(copy, 1, total, f), total);
    fclose(f);
    fixture bad;
    assert_int_equal(fixture_load(path, &bad), ZOFF_ERR_FORMAT);
    assert_non_null(strstr(zoff_last_error(), "magic"));
    copy[0] ^= 0x5a; /* good magic, truncated */
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(copy, 1, total - 4, f), total - 4);
    fclose(f);
    assert_int_equal(fixture_load(path, &bad), ZOFF_ERR_FORMAT);
    assert_non_null(strstr(zoff_last_error(), "bytes"));
    remove(path);
    free(copy);
}

static void test_tensor_table(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2_options o = {.shape = fx_shape(&g_fx), .batch_size = 1, .seq_len = 4, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    const int64_t L = g_fx.L, C = g_fx.C;
    assert_int_equal(n, 2 + 12 * L + 2);
    int64_t off = 0;
    for (int i = 0; i < n; i++) { /* contiguous, shapes multiply to numel */
        assert_int_equal(t[i].offset, off);
        int64_t prod = 1;
        for (int d = 0; d < t[i].ndim; d++) prod *= t[i].shape[d];
        assert_int_equal(prod, t[i].numel);
        assert_int_equal(t[i].decay, t[i].ndim == 2);
        off += t[i].numel;
    }
    assert_int_equal(off, zoff_gpt2_num_params(m));
    assert_int_equal(off, g_fx.num_params);
    assert_string_equal(t[0].name, "wte.weight");
    assert_int_equal(t[0].shape[0], g_fx.Vp);
    assert_int_equal(t[0].shape[1], C);
    assert_int_equal(t[0].layer, -1);
    assert_string_equal(t[1].name, "wpe.weight");
    assert_int_equal(t[1].shape[0], g_fx.maxT);
    static const char *suffix[12] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                     "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                     "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    char name[64];
    for (int64_t l = 0; l < L; l++) {
        for (int k = 0; k < 12; k++) {
            const zoff_tensor_info *ti = &t[2 + 12 * l + k];
            snprintf(name, sizeof name, "h.%d.%s", (int)l, suffix[k]);
            assert_string_equal(ti->name, name);
            assert_int_equal(ti->layer, l);
        }
        const zoff_tensor_info *qkv = &t[2 + 12 * l + 2], *fc = &t[2 + 12 * l + 8], *proj = &t[2 + 12 * l + 10];
        assert_int_equal(qkv->shape[0], 3 * C); /* (out, in) */
        assert_int_equal(qkv->shape[1], C);
        assert_int_equal(fc->shape[0], 4 * C);
        assert_int_equal(proj->shape[0], C);
        assert_int_equal(proj->shape[1], 4 * C);
    }
    assert_string_equal(t[n - 2].name, "ln_f.weight");
    assert_string_equal(t[n - 1].name, "ln_f.bias");
    const zoff_gpt2_shape *sh = zoff_gpt2_get_shape(m);
    assert_int_equal(sh->padded_vocab_size, g_fx.Vp);
    zoff_gpt2_destroy(m);

    /* padded_vocab_size 0 rounds V up to a multiple of 128 */
    o.shape.padded_vocab_size = 0;
    o.shape.vocab_size = 129;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    assert_int_equal(zoff_gpt2_get_shape(m)->padded_vocab_size, 256);
    zoff_gpt2_destroy(m);
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    assert_int_equal(ms.device_in_use, 0);
    zoff_device_destroy(dev);
}

static void test_matches_pytorch(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
    run_result r;
    run_fixture(dev, m, &g_fx, ZOFF_F32, &r);
    int64_t N = (int64_t)g_fx.B * g_fx.T;
    double e_logits = norm_err(r.logits, g_fx.logits, N * g_fx.Vp);
    double e_loss = fabs((double)r.loss - g_fx.loss) / g_fx.loss;
    print_message("fp32 vs torch(fp64): logits normalised max err %.3g (tol 1e-5), loss rel err %.3g (tol 2e-6), "
                  "loss %.7f vs %.7f\n", e_logits, e_loss, r.loss, g_fx.loss);
    assert_true(e_logits <= 1e-5);
    assert_true(e_loss <= 2e-6);
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        double e = norm_err(r.grads + t[i].offset, g_fx.grads + t[i].offset, t[i].numel);
        if (e > 3e-5) print_message("gradient %s: normalised max err %.3g > 3e-5\n", t[i].name, e);
        assert_true(e <= 3e-5);
        if (e > worst) { worst = e; worst_name = t[i].name; }
    }
    print_message("fp32 vs torch(fp64): worst gradient normalised max err %.3g (%s), tol 3e-5\n", worst, worst_name);
    /* padded wte rows: exactly zero gradient */
    for (int64_t i = (int64_t)g_fx.V * g_fx.C; i < (int64_t)g_fx.Vp * g_fx.C; i++) assert_true(r.grads[i] == 0.0f);
    run_result_free(&r);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Generation a token at a time (zoff_gpt2_forward_next) gives PyTorch's logits (float64, the
 * fixture's) at every position: each sequence of the batch as a prompt of k tokens (a full forward)
 * then the rest one position at a time, for every k; the cached prefix is the earlier forwards'
 * rows. A next-token step at the wrong position, or with checkpointed activations, is refused. */
static void test_forward_next_matches_pytorch(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, 1, g_fx.T, ZOFF_F32, false);
    const int64_t T = g_fx.T, Vp = g_fx.Vp;
    int32_t *tok = upload_i32(dev, g_fx.tokens, (int64_t)g_fx.B * T);
    float *row = malloc((size_t)Vp * sizeof(float));
    assert_non_null(row);
    double worst = 0;
    int rows = 0;
    for (int64_t b = 0; b < g_fx.B; b++)
        for (int64_t k = 1; k < T; k++) {
            CHECK_OK(zoff_gpt2_forward(m, tok + b * T, NULL, 1, k));
            for (int64_t pos = k; pos < T; pos++) {
                CHECK_OK(zoff_gpt2_forward_next(m, tok + b * T + pos, pos));
                download_as(dev, row, (const float *)zoff_gpt2_logits(m) + pos * Vp, Vp, ZOFF_F32);
                double e = norm_err(row, g_fx.logits + (b * T + pos) * Vp, Vp);
                if (e > worst) worst = e;
                if (e > 1e-5) fail_msg("sequence %lld, prompt %lld, position %lld: logits err %.3g > 1e-5", (long long)b,
                                       (long long)k, (long long)pos, e);
                rows++;
            }
        }
    print_message("next-token forward vs torch(fp64): %d rows, worst normalised max err %.3g (tol 1e-5)\n", rows, worst);
    CHECK_OK(zoff_gpt2_forward(m, tok, NULL, 1, 3));
    assert_int_equal(zoff_gpt2_forward_next(m, tok + 4, 4), ZOFF_ERR_INVALID); /* position 3 comes next */
    CHECK_OK(zoff_gpt2_forward_next(m, tok + 3, 3));
    zoff_gpt2 *ck = fixture_model(dev, &g_fx, 1, T, ZOFF_F32, true);
    CHECK_OK(zoff_gpt2_forward(ck, tok, NULL, 1, 3));
    assert_int_equal(zoff_gpt2_forward_next(ck, tok + 3, 3), ZOFF_ERR_INVALID); /* no per-block activations */
    zoff_gpt2_destroy(ck);
    free(row);
    zoff_device_free(dev, tok);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Activations for a larger capacity than the batch: only the first B*T rows are used. */
static void test_smaller_batch_than_capacity(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2 *exact = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
    zoff_gpt2 *big = fixture_model(dev, &g_fx, g_fx.B + 1, g_fx.maxT, ZOFF_F32, false);
    run_result a, b;
    run_fixture(dev, exact, &g_fx, ZOFF_F32, &a);
    run_fixture(dev, big, &g_fx, ZOFF_F32, &b);
    assert_true(a.loss == b.loss);
    assert_memory_equal(a.logits, b.logits, (size_t)(g_fx.B * g_fx.T * g_fx.Vp) * sizeof(float));
    assert_memory_equal(a.grads, b.grads, (size_t)g_fx.num_params * sizeof(float));
    run_result_free(&a);
    run_result_free(&b);
    zoff_gpt2_destroy(exact);
    zoff_gpt2_destroy(big);
    zoff_device_destroy(dev);
}

/* g_fx with 3 layers and zoff_gpt2_init_params weights: block 1 is neither first nor last, so with
 * checkpointing its recomputation normalises the stored residual (LAYERNORM_FWD) where the forward fused
 * the previous block's mlp residual with its ln_1 (RESIDUAL_LAYERNORM_FWD). */
static fixture deep_fixture(zoff_device *dev) {
    fixture fx = g_fx;
    fx.L = 3;
    zoff_gpt2_options o = {.shape = fx_shape(&fx), .batch_size = fx.B, .seq_len = fx.T, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    fx.num_params = zoff_gpt2_num_params(m);
    fx.params = malloc((size_t)fx.num_params * sizeof(float));
    assert_non_null(fx.params);
    zoff_gpt2_init_params(m, 7, fx.params);
    zoff_gpt2_destroy(m);
    return fx;
}

/* in every storage dtype, with 2 and 3 layers */
static void test_checkpoint_bit_identical(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    fixture deep = deep_fixture(dev);
    const fixture *fxs[2] = {&g_fx, &deep};
    const zoff_dtype dts[3] = {ZOFF_F32, ZOFF_BF16, ZOFF_F16};
    for (int fi = 0; fi < 2; fi++)
        for (int di = 0; di < 3; di++) {
            const fixture *fx = fxs[fi];
            const zoff_dtype dt = dts[di];
            zoff_gpt2 *plain = fixture_model(dev, fx, fx->B, fx->T, dt, false);
            zoff_gpt2 *ckpt = fixture_model(dev, fx, fx->B, fx->T, dt, true);
            assert_true(zoff_gpt2_device_bytes(ckpt) < zoff_gpt2_device_bytes(plain));
            run_result a, b;
            for (int rep = 0; rep < 2; rep++) { /* second pass accumulates on top of the first */
                run_fixture(dev, plain, fx, dt, &a);
                run_fixture(dev, ckpt, fx, dt, &b);
                assert_true(a.loss == b.loss);
                assert_memory_equal(a.logits, b.logits, (size_t)(fx->B * fx->T * fx->Vp) * sizeof(float));
                assert_memory_equal(a.grads, b.grads, (size_t)fx->num_params * sizeof(float));
                run_result_free(&a);
                run_result_free(&b);
            }
            print_message("checkpointed model (%d layers, %s): %zu device bytes vs %zu; gradients bit-identical\n",
                          fx->L, zoff_dtype_name(dt), zoff_gpt2_device_bytes(ckpt), zoff_gpt2_device_bytes(plain));
            zoff_gpt2_destroy(plain);
            zoff_gpt2_destroy(ckpt);
        }
    free(deep.params);
    zoff_device_destroy(dev);
}

/* The training forward's dloss_scale reaches every gradient: backward is linear in dlogits, so a
 * power-of-two scale (a loss scale over accumulation steps) multiplies each gradient exactly
 * (fp32 and bf16 storage alike), and the losses do not depend on it. */
static void test_train_forward_dloss_scale(void **state) {
    (void)state;
    static const zoff_dtype dts[2] = {ZOFF_F32, ZOFF_BF16};
    for (int k = 0; k < 2; k++) {
        zoff_device *dev = make_device(0);
        zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, dts[k], false);
        const int64_t N = (int64_t)g_fx.B * g_fx.T, P = g_fx.num_params;
        int32_t *tok = upload_i32(dev, g_fx.tokens, N), *tgt = upload_i32(dev, g_fx.targets, N);
        float *g[2], loss[2];
        const float scale[2] = {1.0f, 1024.0f / 8.0f};
        for (int r = 0; r < 2; r++) {
            g[r] = malloc((size_t)P * sizeof(float));
            assert_non_null(g[r]);
            CHECK_OK(zoff_memset_async(zoff_device_stream(dev), zoff_gpt2_grads(m), 0,
                                       (size_t)P * zoff_dtype_size(dts[k])));
            CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, g_fx.B, g_fx.T, scale[r]));
            CHECK_OK(zoff_gpt2_backward(m, NULL, NULL));
            CHECK_OK(zoff_gpt2_mean_loss(m, &loss[r]));
            download_as(dev, g[r], zoff_gpt2_grads(m), P, dts[k]);
        }
        assert_true(loss[0] == loss[1]);
        int64_t nonzero = 0;
        for (int64_t i = 0; i < P; i++) {
            if (g[1][i] != g[0][i] * scale[1])
                fail_msg("%s: gradient %lld is %.9g with dloss_scale %g, %.9g with 1", zoff_dtype_name(dts[k]),
                         (long long)i, (double)g[1][i], (double)scale[1], (double)g[0][i]);
            nonzero += g[0][i] != 0.0f;
        }
        assert_true(nonzero > P / 2); /* the comparison is not vacuous */
        free(g[0]);
        free(g[1]);
        zoff_device_free(dev, tok);
        zoff_device_free(dev, tgt);
        zoff_gpt2_destroy(m);
        zoff_device_destroy(dev);
    }
}

/* grad-ready: record each range, and snapshot it on the stream at that moment;
 * the snapshot must equal the final gradients (the range really was final). */
typedef struct ready_log {
    zoff_stream *stream;
    int count;
    int64_t offset[64], numel[64];
    float *snapshot;       /* host (num_params) */
    const float *grads_dev;
    bool wrong_stream;
} ready_log;

static void on_ready(void *arg, zoff_stream *stream, int64_t offset, int64_t count) {
    ready_log *log = arg;
    if (stream != log->stream) log->wrong_stream = true;
    if (log->count < 64) {
        log->offset[log->count] = offset;
        log->numel[log->count] = count;
    }
    log->count++;
    (void)zoff_memcpy_async(stream, log->snapshot + offset, log->grads_dev + offset, (size_t)count * sizeof(float),
                            ZOFF_COPY_D2H);
}

static void check_ready_order(bool checkpoint) {
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, checkpoint);
    int64_t N = (int64_t)g_fx.B * g_fx.T, P = g_fx.num_params;
    int32_t *tok = upload_i32(dev, g_fx.tokens, N), *tgt = upload_i32(dev, g_fx.targets, N);
    ready_log log = {.stream = zoff_device_stream(dev), .snapshot = calloc((size_t)P, sizeof(float)),
                     .grads_dev = zoff_gpt2_grads(m)};
    assert_non_null(log.snapshot);
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, g_fx.B, g_fx.T, 1.0f));
    CHECK_OK(zoff_gpt2_backward(m, on_ready, &log));
    CHECK_OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    assert_false(log.wrong_stream);
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    const int L = g_fx.L;
    assert_int_equal(log.count, L + 2);
    /* ln_f first */
    assert_int_equal(log.offset[0], t[n - 2].offset);
    assert_int_equal(log.numel[0], 2 * g_fx.C);
    /* blocks, last to first */
    for (int i = 1; i <= L; i++) {
        int l = L - i;
        int64_t first = t[2 + 12 * l].offset, end = t[2 + 12 * l + 11].offset + t[2 + 12 * l + 11].numel;
        assert_int_equal(log.offset[i], first);
        assert_int_equal(log.numel[i], end - first);
    }
    /* wte + wpe last */
    assert_int_equal(log.offset[L + 1], 0);
    assert_int_equal(log.numel[L + 1], t[0].numel + t[1].numel);
    /* every element exactly once */
    unsigned char *seen = calloc((size_t)P, 1);
    assert_non_null(seen);
    for (int i = 0; i < log.count; i++)
        for (int64_t j = log.offset[i]; j < log.offset[i] + log.numel[i]; j++) seen[j]++;
    for (int64_t j = 0; j < P; j++) assert_int_equal(seen[j], 1);
    /* each range was final when reported */
    float *final = malloc((size_t)P * sizeof(float));
    assert_non_null(final);
    download_as(dev, final, zoff_gpt2_grads(m), P, ZOFF_F32);
    assert_memory_equal(final, log.snapshot, (size_t)P * sizeof(float));
    free(final);
    free(seen);
    free(log.snapshot);
    zoff_device_free(dev, tok);
    zoff_device_free(dev, tgt);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

static void test_grad_ready_ranges(void **state) {
    (void)state;
    check_ready_order(false);
    check_ready_order(true);
}

/* The row-sparse report (zoff_gpt2_set_grad_rows): once per backward, before any grad-ready
 * call, for wte (rows of C) listing the batch's distinct token ids ascending (computed here
 * from the fixture's tokens); snapshotted then, wte's gradient outside those rows is already
 * the final one, bit for bit, and inside them it is not yet (the embedding backward adds). */
typedef struct rows_log {
    ready_log *ready;
    int calls, ready_before; /* grad-ready calls seen before it */
    int64_t offset, count, row_len, nrows, rows[4096];
    float *snapshot;
} rows_log;

static void on_rows(void *arg, zoff_stream *stream, int64_t offset, int64_t count, int64_t row_len,
                    const int64_t *rows, int64_t nrows) {
    rows_log *r = arg;
    r->calls++;
    r->ready_before = r->ready->count;
    r->offset = offset, r->count = count, r->row_len = row_len, r->nrows = nrows;
    memcpy(r->rows, rows, (size_t)(nrows < 4096 ? nrows : 4096) * sizeof *rows);
    (void)zoff_memcpy_async(stream, r->snapshot, r->ready->grads_dev + offset, (size_t)count * sizeof(float),
                            ZOFF_COPY_D2H);
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void test_grad_rows_report(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
    int64_t N = (int64_t)g_fx.B * g_fx.T, P = g_fx.num_params;
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    int32_t *tok = upload_i32(dev, g_fx.tokens, N), *tgt = upload_i32(dev, g_fx.targets, N);
    ready_log ready = {.stream = zoff_device_stream(dev), .snapshot = calloc((size_t)P, sizeof(float)),
                       .grads_dev = zoff_gpt2_grads(m)};
    rows_log rl = {.ready = &ready, .snapshot = calloc((size_t)t[0].numel, sizeof(float))};
    assert_non_null(ready.snapshot);
    assert_non_null(rl.snapshot);
    CHECK_OK(zoff_gpt2_set_grad_rows(m, on_rows, &rl));
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, g_fx.B, g_fx.T, 1.0f));
    CHECK_OK(zoff_gpt2_backward(m, on_ready, &ready));
    CHECK_OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    assert_int_equal(rl.calls, 1);
    assert_int_equal(rl.ready_before, 0);
    assert_int_equal(rl.offset, t[0].offset);
    assert_int_equal(rl.count, t[0].numel);
    assert_int_equal(rl.row_len, g_fx.C);
    int32_t *want = malloc((size_t)N * sizeof *want);
    assert_non_null(want);
    memcpy(want, g_fx.tokens, (size_t)N * sizeof *want);
    qsort(want, (size_t)N, sizeof *want, cmp_i32);
    int64_t nw = 0;
    for (int64_t i = 0; i < N; i++)
        if (i == 0 || want[i] != want[i - 1]) want[nw++] = want[i];
    assert_int_equal(rl.nrows, nw);
    for (int64_t i = 0; i < nw; i++) assert_int_equal(rl.rows[i], want[i]);
    float *final = malloc((size_t)P * sizeof(float));
    assert_non_null(final);
    download_as(dev, final, zoff_gpt2_grads(m), P, ZOFF_F32);
    int64_t k = 0, differ = 0;
    for (int64_t r = 0; r < t[0].numel / g_fx.C; r++) {
        bool listed = k < nw && want[k] == r;
        k += listed;
        const float *a = rl.snapshot + r * g_fx.C, *b = final + t[0].offset + r * g_fx.C;
        if (!listed) assert_memory_equal(a, b, (size_t)g_fx.C * sizeof(float));
        else differ += memcmp(a, b, (size_t)g_fx.C * sizeof(float)) != 0;
    }
    assert_int_equal(differ, nw);
    /* unset: no report, and the forward no longer copies the tokens */
    CHECK_OK(zoff_gpt2_set_grad_rows(m, NULL, NULL));
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, g_fx.B, g_fx.T, 1.0f));
    ready.count = 0;
    CHECK_OK(zoff_gpt2_backward(m, on_ready, &ready));
    CHECK_OK(zoff_stream_synchronize(zoff_device_stream(dev)));
    assert_int_equal(rl.calls, 1);
    free(final);
    free(want);
    free(rl.snapshot);
    free(ready.snapshot);
    zoff_device_free(dev, tok);
    zoff_device_free(dev, tgt);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Mean cross-entropy over (N,Vp) fp32 logits (first V columns real), in double. */
static double host_loss(const float *logits, const int32_t *targets, int64_t N, int64_t V, int64_t Vp) {
    double total = 0.0;
    for (int64_t i = 0; i < N; i++) {
        const float *row = logits + i * Vp;
        double mx = row[0];
        for (int64_t v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
        double se = 0.0;
        for (int64_t v = 0; v < V; v++) se += exp((double)row[v] - mx);
        total += log(se) + mx - (double)row[targets[i]];
    }
    return total / (double)N;
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Central differences on a tiny model (L=2, C=8, NH=2, V=13, B=2, T=5).
 *
 * The loss is evaluated from the fp32 logits in double on the host, so the
 * only noise in f(p +- h) is the fp32 rounding of the forward, delta: the
 * logits carry a few ulp (~1e-7 relative) of error each, and the mean over
 * N*V terms averages it down to delta ~ 3e-8 (measured: the rounding part of
 * the error, delta/h, is 2.8e-5 at h = 1e-3 and 1.4e-5 at h = 3e-3). The
 * central difference has error  delta/h (rounding) + h^2 |f'''| / 6
 * (truncation; measured 6.4e-5 at h = 3e-2, i.e. ~7e-6 at h = 1e-2). Their
 * sum is smallest near h = 1e-2 (parameters are ~0.3, so f is smooth on that
 * scale), where the worst measured |fd - g| is 6.5e-6 over 168 parameters.
 * We require |fd - g| <= 3e-5 + 1e-3 |g|: ~5x the measured worst, and
 * ~3x the rounding bound delta/h + truncation at the chosen h. The backward
 * gradient's own fp32 error (~1e-7 relative) is negligible. A wrong gradient
 * term (missing bias, wrong transpose, missing residual, wrong scale) is off
 * by O(|g|) ~ 1e-3 .. 1e-1 here, far outside. */
static void test_finite_differences(void **state) {
    (void)state;
    const int64_t L = 2, C = 8, NH = 2, V = 13, Vp = 16, maxT = 6, B = 2, T = 5, N = B * T;
    zoff_device *dev = make_device(0);
    zoff_gpt2_options o = {.shape = {.num_layers = L, .hidden_size = C, .num_heads = NH, .max_seq_len = maxT,
                                     .vocab_size = V, .padded_vocab_size = Vp},
                           .batch_size = B, .seq_len = T, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    const int64_t P = zoff_gpt2_num_params(m);
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    float *p = malloc((size_t)P * sizeof(float));
    float *logits = malloc((size_t)(N * Vp) * sizeof(float));
    float *g = malloc((size_t)P * sizeof(float));
    assert_non_null(p);
    assert_non_null(logits);
    assert_non_null(g);
    uint64_t rs = 12345;
    for (int i = 0; i < n; i++) {
        bool ln_w = strstr(t[i].name, "ln_") && strstr(t[i].name, ".weight");
        for (int64_t j = 0; j < t[i].numel; j++) {
            double u = (double)lcg(&rs) / 2147483648.0 * 2.0 - 1.0; /* [-1,1) */
            p[t[i].offset + j] = (float)(ln_w ? 1.0 + 0.2 * u : 0.3 * u);
        }
    }
    int32_t tok_h[10], tgt_h[10];
    for (int64_t i = 0; i < N; i++) {
        tok_h[i] = (int32_t)(lcg(&rs) % (uint64_t)V);
        tgt_h[i] = (int32_t)(lcg(&rs) % (uint64_t)V);
    }
    int32_t *tok = upload_i32(dev, tok_h, N), *tgt = upload_i32(dev, tgt_h, N);
    upload_as(dev, zoff_gpt2_params(m), 0, p, P, ZOFF_F32);
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, B, T, 1.0f));
    CHECK_OK(zoff_gpt2_backward(m, NULL, NULL));
    download_as(dev, g, zoff_gpt2_grads(m), P, ZOFF_F32);

    const float h = 1e-2f;
    double worst_ratio = 0.0, worst_abs = 0.0;
    int checked = 0;
    for (int i = 0; i < n; i++) {
        /* 6 elements per tensor, spread over it; for wte only real rows (padded rows are checked elsewhere) */
        int64_t span = i == 0 ? V * C : t[i].numel;
        for (int k = 0; k < 6; k++) {
            int64_t j = t[i].offset + (int64_t)((lcg(&rs) % (uint64_t)span));
            double f[2];
            for (int side = 0; side < 2; side++) {
                float v = p[j] + (side ? -h : h);
                upload_as(dev, zoff_gpt2_params(m), j, &v, 1, ZOFF_F32);
                CHECK_OK(zoff_gpt2_forward(m, tok, tgt, B, T));
                download_as(dev, logits, zoff_gpt2_logits(m), N * Vp, ZOFF_F32);
                f[side] = host_loss(logits, tgt_h, N, V, Vp);
            }
            upload_as(dev, zoff_gpt2_params(m), j, &p[j], 1, ZOFF_F32);
            /* the actual step is (p+h) - (p-h) as rounded to fp32 */
            double step = (double)(p[j] + h) - (double)(p[j] - h);
            double fd = (f[0] - f[1]) / step;
            double err = fabs(fd - (double)g[j]), tol = 3e-5 + 1e-3 * fabs((double)g[j]);
            if (err > tol)
                print_message("FD mismatch %s[%lld]: backward %.8g, central difference %.8g, |diff| %.3g > tol %.3g\n",
                              t[i].name, (long long)(j - t[i].offset), g[j], fd, err, tol);
            assert_true(err <= tol);
            if (err / tol > worst_ratio) worst_ratio = err / tol;
            if (err > worst_abs) worst_abs = err;
            checked++;
        }
    }
    print_message("finite differences: %d parameters, worst |fd - g| %.3g, worst err/tol %.3f\n", checked, worst_abs,
                  worst_ratio);
    free(p);
    free(logits);
    free(g);
    zoff_device_free(dev, tok);
    zoff_device_free(dev, tgt);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Ten AdamW steps with the device Adam op, one launch per run of tensors that
 * share a decay flag, against torch.optim.AdamW's losses. */
static void test_adamw_ten_steps(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
    zoff_stream *s = zoff_device_stream(dev);
    const int64_t P = g_fx.num_params, N = (int64_t)g_fx.B * g_fx.T;
    float *mom = NULL, *var = NULL;
    CHECK_OK(zoff_device_alloc(dev, (size_t)P * sizeof(float), "adam m", (void **)&mom));
    CHECK_OK(zoff_device_alloc(dev, (size_t)P * sizeof(float), "adam v", (void **)&var));
    CHECK_OK(zoff_memset_async(s, mom, 0, (size_t)P * sizeof(float)));
    CHECK_OK(zoff_memset_async(s, var, 0, (size_t)P * sizeof(float)));
    int32_t *tok = upload_i32(dev, g_fx.tokens, N), *tgt = upload_i32(dev, g_fx.targets, N);
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    float *params = zoff_gpt2_params(m), *grads = zoff_gpt2_grads(m);
    double worst = 0.0;
    for (int step = 1; step <= g_fx.nsteps; step++) {
        CHECK_OK(zoff_memset_async(s, grads, 0, (size_t)P * sizeof(float)));
        CHECK_OK(zoff_gpt2_forward_train(m, tok, tgt, g_fx.B, g_fx.T, 1.0f));
        float loss;
        CHECK_OK(zoff_gpt2_mean_loss(m, &loss));
        double want = g_fx.step_losses[step - 1], rel = fabs((double)loss - want) / want;
        print_message("AdamW step %2d: loss %.7f, torch %.7f, rel err %.3g (tol 1e-5)\n", step, loss, want, rel);
        assert_true(rel <= 1e-5);
        if (rel > worst) worst = rel;
        CHECK_OK(zoff_gpt2_backward(m, NULL, NULL));
        float bc1 = (float)(1.0 - pow((double)g_fx.beta1, step));
        float bc2 = (float)(1.0 - pow((double)g_fx.beta2, step));
        for (int i = 0; i < n;) {
            int j = i;
            while (j + 1 < n && t[j + 1].decay == t[i].decay) j++;
            int64_t off = t[i].offset, cnt = t[j].offset + t[j].numel - off;
            zoff_op_adam_args a = {.params = params + off, .m = mom + off, .v = var + off, .grads = grads + off,
                                   .params16 = NULL, .n = cnt, .grad_dt = ZOFF_F32, .p16_dt = ZOFF_F32,
                                   .lr = g_fx.lr, .beta1 = g_fx.beta1, .beta2 = g_fx.beta2, .eps = g_fx.eps,
                                   .weight_decay = t[i].decay ? g_fx.weight_decay : 0.0f, .bc1 = bc1, .bc2 = bc2,
                                   .grad_scale = 1.0f, .adam_w_mode = 1};
            CHECK_OK(ZOFF_LAUNCH(s, ZOFF_OP_ADAM, a));
            i = j + 1;
        }
    }
    CHECK_OK(zoff_stream_synchronize(s));
    print_message("AdamW: worst loss rel err over %d steps %.3g (tol 1e-5)\n", g_fx.nsteps, worst);
    zoff_device_free(dev, tok);
    zoff_device_free(dev, tgt);
    zoff_device_free(dev, mom);
    zoff_device_free(dev, var);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* 16-bit storage: the same fixture within bounds set by the storage precision.
 * Parameters, activations and gradients are rounded to 8 (bf16) or 11 (f16)
 * significant bits at every op boundary (math stays fp32 inside each op);
 * with ~30 ops between input and loss the logits keep a few 16-bit ulps
 * (bf16 2^-8 ~ 4e-3, f16 2^-11 ~ 5e-4 relative) of error, and the gradients,
 * which also accumulate in 16 bits, more. Bounds (normalised max error) are
 * ~2-3x the measured values (in parentheses):
 *   bf16: logits 3e-2 (1.3e-2), loss 2e-3 rel (2.4e-4), gradients 6e-2 (2.3e-2)
 *   f16:  logits 5e-3 (1.4e-3), loss 3e-4 rel (2.5e-5), gradients 1e-2 (2.8e-3)
 * They catch a wrong op (O(1)) and a lost dtype (garbage), not last-bit changes. */
static void check_16bit(zoff_dtype dt, double tol_logits, double tol_loss, double tol_grad) {
    zoff_device *dev = make_device(0);
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, dt, false);
    run_result r;
    run_fixture(dev, m, &g_fx, dt, &r);
    int64_t N = (int64_t)g_fx.B * g_fx.T;
    double e_logits = norm_err(r.logits, g_fx.logits, N * g_fx.Vp);
    double e_loss = fabs((double)r.loss - g_fx.loss) / g_fx.loss;
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    double worst = 0.0;
    const char *worst_name = "";
    for (int i = 0; i < n; i++) {
        double e = norm_err(r.grads + t[i].offset, g_fx.grads + t[i].offset, t[i].numel);
        if (e > worst) { worst = e; worst_name = t[i].name; }
    }
    print_message("%s vs torch(fp64): logits err %.3g (tol %.3g), loss rel err %.3g (tol %.3g), worst gradient err "
                  "%.3g in %s (tol %.3g)\n", zoff_dtype_name(dt), e_logits, tol_logits, e_loss, tol_loss, worst,
                  worst_name, tol_grad);
    assert_true(e_logits <= tol_logits);
    assert_true(e_loss <= tol_loss);
    assert_true(worst <= tol_grad);
    /* checkpointing stays bit-identical in 16-bit storage */
    zoff_gpt2 *ck = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, dt, true);
    run_result rc;
    run_fixture(dev, ck, &g_fx, dt, &rc);
    assert_memory_equal(r.grads, rc.grads, (size_t)g_fx.num_params * sizeof(float));
    run_result_free(&rc);
    run_result_free(&r);
    zoff_gpt2_destroy(ck);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

static void test_bf16_storage(void **state) {
    (void)state;
    check_16bit(ZOFF_BF16, 3e-2, 2e-3, 6e-2);
}

static void test_f16_storage(void **state) {
    (void)state;
    check_16bit(ZOFF_F16, 5e-3, 3e-4, 1e-2);
}

static void expect_refused(zoff_device *dev, const zoff_gpt2_options *o, const char *needle) {
    zoff_gpt2 *m = (zoff_gpt2 *)0x1;
    zoff_status st = zoff_gpt2_create(dev, o, &m);
    assert_int_equal(st, ZOFF_ERR_INVALID);
    assert_null(m);
    if (!strstr(zoff_last_error(), needle)) fail_msg("error '%s' does not mention '%s'", zoff_last_error(), needle);
}

static void test_bad_shapes(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    const zoff_gpt2_options good = {.shape = fx_shape(&g_fx), .batch_size = 2, .seq_len = 8, .dtype = ZOFF_F32};
    zoff_gpt2_options o = good;
    o.shape.num_heads = 5; /* 32 % 5 != 0 */
    expect_refused(dev, &o, "not divisible by shape.num_heads");
    o = good;
    o.seq_len = g_fx.maxT + 1;
    expect_refused(dev, &o, "seq_len is 17 but shape.max_seq_len is 16");
    o = good;
    o.shape.num_layers = 0;
    expect_refused(dev, &o, "shape.num_layers is 0");
    o = good;
    o.shape.padded_vocab_size = g_fx.V - 1;
    expect_refused(dev, &o, "padded_vocab_size");
    o = good;
    o.batch_size = 0;
    expect_refused(dev, &o, "batch_size is 0");
    o = good;
    o.dtype = ZOFF_I32;
    expect_refused(dev, &o, "dtype");
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    assert_int_equal(ms.device_in_use, 0);

    /* forward/backward misuse */
    zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
    int32_t *tok = upload_i32(dev, g_fx.tokens, (int64_t)g_fx.B * g_fx.T);
    assert_int_equal(zoff_gpt2_forward(m, tok, tok, g_fx.B + 1, g_fx.T), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "capacity"));
    assert_int_equal(zoff_gpt2_backward(m, NULL, NULL), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "zoff_gpt2_forward_train"));
    CHECK_OK(zoff_gpt2_forward(m, tok, NULL, g_fx.B, g_fx.T)); /* logits only */
    assert_non_null(zoff_gpt2_logits(m));
    float loss;
    assert_int_equal(zoff_gpt2_mean_loss(m, &loss), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "no targets"));
    assert_int_equal(zoff_gpt2_backward(m, NULL, NULL), ZOFF_ERR_INVALID); /* an evaluation forward */
    assert_non_null(strstr(zoff_last_error(), "the last forward was zoff_gpt2_forward"));
    CHECK_OK(zoff_gpt2_forward(m, tok, tok, g_fx.B, g_fx.T)); /* with targets: still evaluation */
    assert_int_equal(zoff_gpt2_backward(m, NULL, NULL), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_gpt2_forward_train(m, tok, NULL, g_fx.B, g_fx.T, 1.0f), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "targets is NULL"));
    assert_int_equal(zoff_gpt2_forward_train(m, tok, tok, g_fx.B, g_fx.T, NAN), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "dloss_scale"));
    CHECK_OK(zoff_gpt2_forward_train(m, tok, tok, g_fx.B, g_fx.T, 1.0f));
    assert_null(zoff_gpt2_logits(m)); /* dlogits took their place */
    CHECK_OK(zoff_gpt2_backward(m, NULL, NULL));
    CHECK_OK(zoff_gpt2_mean_loss(m, &loss)); /* the losses outlive the backward */
    assert_int_equal(zoff_gpt2_backward(m, NULL, NULL), ZOFF_ERR_INVALID); /* once per training forward */
    assert_non_null(strstr(zoff_last_error(), "none since create or the last backward"));
    CHECK_OK(zoff_stream_synchronize(zoff_device_stream(dev))); /* forward still reads tok */
    zoff_device_free(dev, tok);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Token ids in [V, Vp) address padded wte rows: they must fail the stream
 * (the model passes the real V to the ops, not Vp). Same for targets. */
static void test_out_of_range_ids(void **state) {
    (void)state;
    const int64_t N = (int64_t)g_fx.B * g_fx.T;
    int32_t *bad = malloc((size_t)N * sizeof(int32_t));
    assert_non_null(bad);
    for (int which = 0; which < 2; which++) {
        zoff_device *dev = make_device(0); /* a failed stream stays failed: one device each */
        zoff_gpt2 *m = fixture_model(dev, &g_fx, g_fx.B, g_fx.T, ZOFF_F32, false);
        memcpy(bad, which == 0 ? g_fx.tokens : g_fx.targets, (size_t)N * sizeof(int32_t));
        bad[3] = g_fx.V; /* first padded id */
        int32_t *dbad = upload_i32(dev, bad, N);
        int32_t *dgood = upload_i32(dev, which == 0 ? g_fx.targets : g_fx.tokens, N);
        const int32_t *tok = which == 0 ? dbad : dgood, *tgt = which == 0 ? dgood : dbad;
        float loss;
        zoff_status st = zoff_gpt2_forward(m, tok, tgt, g_fx.B, g_fx.T);
        if (st == ZOFF_OK) st = zoff_gpt2_mean_loss(m, &loss);
        assert_int_equal(st, ZOFF_ERR_INVALID);
        print_message("%s id %d refused: %s\n", which == 0 ? "token" : "target", g_fx.V, zoff_last_error());
        (void)zoff_stream_synchronize(zoff_device_stream(dev)); /* failed: sticky error, but drained */
        zoff_device_free(dev, dbad);
        zoff_device_free(dev, dgood);
        zoff_gpt2_destroy(m);
        zoff_device_destroy(dev);
    }
    free(bad);
}

static void test_device_oom(void **state) {
    (void)state;
    const zoff_gpt2_options o = {.shape = fx_shape(&g_fx), .batch_size = g_fx.B, .seq_len = g_fx.T,
                                 .dtype = ZOFF_F32};
    /* tiny budget: the parameters do not fit */
    zoff_device *dev = make_device(4096);
    zoff_gpt2 *m = NULL;
    assert_int_equal(zoff_gpt2_create(dev, &o, &m), ZOFF_ERR_DEVICE_OOM);
    assert_null(m);
    assert_non_null(strstr(zoff_last_error(), "gpt2 parameters"));
    print_message("OOM message: %s\n", zoff_last_error());
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    assert_int_equal(ms.device_in_use, 0);
    zoff_device_destroy(dev);
    /* parameters and gradients fit, activations do not: nothing is leaked */
    dev = make_device((size_t)(2 * g_fx.num_params * 4 + 1024));
    assert_int_equal(zoff_gpt2_create(dev, &o, &m), ZOFF_ERR_DEVICE_OOM);
    assert_non_null(strstr(zoff_last_error(), "gpt2 activations"));
    zoff_device_memory_stats(dev, &ms);
    assert_int_equal(ms.device_in_use, 0);
    zoff_device_destroy(dev);
    /* the exact size fits; device_bytes reports it */
    dev = make_device(0);
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    size_t need = zoff_gpt2_device_bytes(m);
    zoff_device_memory_stats(dev, &ms);
    assert_int_equal(ms.device_in_use, need);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    dev = make_device(need);
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

static void test_init_params(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2_options o = {.shape = {.num_layers = 4, .hidden_size = 64, .num_heads = 4, .max_seq_len = 32,
                                     .vocab_size = 100, .padded_vocab_size = 0},
                           .batch_size = 1, .seq_len = 8, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    int64_t P = zoff_gpt2_num_params(m);
    float *a = malloc((size_t)P * sizeof(float)), *b = malloc((size_t)P * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    zoff_gpt2_init_params(m, 42, a);
    zoff_gpt2_init_params(m, 42, b);
    assert_memory_equal(a, b, (size_t)P * sizeof(float));
    zoff_gpt2_init_params(m, 43, b);
    assert_memory_not_equal(a, b, (size_t)P * sizeof(float));
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    for (int i = 0; i < n; i++) {
        const float *x = a + t[i].offset;
        int64_t cnt = i == 0 ? 100 * 64 : t[i].numel;
        double s1 = 0, s2 = 0;
        for (int64_t j = 0; j < cnt; j++) { s1 += x[j]; s2 += (double)x[j] * x[j]; }
        double mean = s1 / (double)cnt, sd = sqrt(s2 / (double)cnt - mean * mean);
        if (strstr(t[i].name, ".bias")) {
            assert_true(s2 == 0.0);
        } else if (strstr(t[i].name, "ln_")) {
            assert_true(mean == 1.0 && sd < 1e-6);
        } else {
            double want = strstr(t[i].name, "c_proj.weight") ? 0.02 / sqrt(8.0) : 0.02;
            if (fabs(sd - want) > 0.1 * want) fail_msg("%s: std %.5f, want %.5f", t[i].name, sd, want);
            assert_true(fabs(mean) < 0.1 * want);
        }
    }
    for (int64_t j = 100 * 64; j < t[0].numel; j++) assert_true(a[j] == 0.0f); /* padded rows */
    free(a);
    free(b);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* zoff_gpt2_count_nonfinite against isfinite(), over the whole model and over small ranges in
 * reverse order (train --init-from reads the weights a range at a time); the error names the count
 * and the lowest tensor holding one. */
static void test_count_nonfinite(void **state) {
    (void)state;
    zoff_device *dev = make_device(0);
    zoff_gpt2_options o = {.shape = {.num_layers = 2, .hidden_size = 32, .num_heads = 2, .max_seq_len = 16,
                                     .vocab_size = 50, .padded_vocab_size = 0},
                           .batch_size = 1, .seq_len = 8, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    CHECK_OK(zoff_gpt2_create(dev, &o, &m));
    int64_t P = zoff_gpt2_num_params(m);
    int n = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &n);
    float *w = malloc((size_t)P * sizeof(float));
    assert_non_null(w);
    zoff_gpt2_init_params(m, 7, w);
    int64_t bad = 0;
    int first = -1;
    zoff_gpt2_count_nonfinite(m, 0, P, w, &bad, &first);
    assert_int_equal(bad, 0);
    assert_int_equal(first, -1);
    assert_int_equal(zoff_gpt2_nonfinite_error(m, bad, first), ZOFF_OK);
    w[t[5].offset + 3] = NAN;
    w[t[5].offset] = -INFINITY;
    w[t[2].offset + t[2].numel - 1] = INFINITY;
    w[t[3].offset] = FLT_MAX;      /* large but finite */
    w[t[3].offset + 1] = 1e-45f;   /* subnormal: finite */
    int64_t want = 0;
    int want_first = -1;
    for (int k = 0; k < n; k++)
        for (int64_t i = 0; i < t[k].numel; i++)
            if (!isfinite(w[t[k].offset + i])) {
                want++;
                if (want_first < 0) want_first = k;
            }
    assert_int_equal(want, 3);
    zoff_gpt2_count_nonfinite(m, 0, P, w, &bad, &first);
    assert_int_equal(bad, want);
    assert_int_equal(first, want_first);
    bad = 0;
    first = -1;
    for (int64_t hi = P; hi > 0; hi -= 7) {
        int64_t lo = hi > 7 ? hi - 7 : 0;
        zoff_gpt2_count_nonfinite(m, lo, hi, w + lo, &bad, &first);
    }
    assert_int_equal(bad, want);
    assert_int_equal(first, want_first);
    assert_int_equal(zoff_gpt2_nonfinite_error(m, bad, first), ZOFF_ERR_INVALID);
    char msg[128];
    snprintf(msg, sizeof msg, "hold 3 value(s) that are not finite (NaN or Inf), the first in %s:", t[2].name);
    if (!strstr(zoff_last_error(), msg)) fail_msg("%s", zoff_last_error());
    free(w);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

int main(void) {
    zoff_status st = fixture_load(ZOFF_TEST_DIR "/fixtures/gpt2_small.bin", &g_fx);
    if (st != ZOFF_OK) {
        fprintf(stderr, "test_gpt2: %s: %s\n", zoff_status_name(st), zoff_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_format),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_matches_pytorch),
        cmocka_unit_test(test_forward_next_matches_pytorch),
        cmocka_unit_test(test_smaller_batch_than_capacity),
        cmocka_unit_test(test_checkpoint_bit_identical),
        cmocka_unit_test(test_train_forward_dloss_scale),
        cmocka_unit_test(test_grad_ready_ranges), cmocka_unit_test(test_grad_rows_report),
        cmocka_unit_test(test_finite_differences),
        cmocka_unit_test(test_adamw_ten_steps),
        cmocka_unit_test(test_bf16_storage),
        cmocka_unit_test(test_f16_storage),
        cmocka_unit_test(test_count_nonfinite),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_out_of_range_ids),
        cmocka_unit_test(test_device_oom),
        cmocka_unit_test(test_init_params),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    free(g_fx.blob);
    return failed ? 1 : 0;
}
