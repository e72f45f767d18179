/* Boundaries between layers, checked against references written from the specification:
 *   - GPT-2's layout (src/model/gpt2_layout.c): parameter counts against the published
 *     GPT-2 sizes and a table written out by hand; the bounds every command uses;
 *   - the device interface's capability query and native-handle accessors (device.h);
 *   - small public functions nothing else calls: zoff_comm_timeout, zoff_host_optimizer_type,
 *     zoff_host_optimizer_set_eps (against Adam's first step computed in double). */
#include <math.h>

#include "test_util.h"

#include "zoff/comm.h"
#include "zoff/device.h"
#include "zoff/model.h"
#include "zoff/optim.h"

/* ------------------------------------------------------------------ GPT-2 layout */

static void test_published_parameter_counts(void **state) {
    (void)state;
    /* GPT-2 small: 124,439,808 parameters in Hugging Face's model (V = 50257); llm.c's padded
     * vocabulary (Vp = 50304) gives 124,475,904 ("num_parameters: 124475904"). */
    zoff_gpt2_shape s = {.num_layers = 12, .hidden_size = 768, .num_heads = 12, .max_seq_len = 1024,
                         .vocab_size = 50257, .padded_vocab_size = 50257};
    assert_int_equal(zoff_gpt2_count_params(&s), 124439808);
    s.padded_vocab_size = 0; /* rounded up to a multiple of 128 */
    assert_int_equal(zoff_gpt2_padded_vocab(&s), 50304);
    assert_int_equal(zoff_gpt2_count_params(&s), 124475904);
    /* GPT-2 XL (L = 48, C = 1600): 1,557,611,200 with V = 50257 */
    zoff_gpt2_shape xl = {.num_layers = 48, .hidden_size = 1600, .num_heads = 25, .max_seq_len = 1024,
                          .vocab_size = 50257, .padded_vocab_size = 50257};
    assert_int_equal(zoff_gpt2_count_params(&xl), 1557611200);
    /* one block: ln_1 2C, c_attn 3C*C + 3C, c_proj C*C + C, ln_2 2C, c_fc 4C*C + 4C, c_proj 4C*C + C */
    for (int64_t C = 1; C <= 4096; C *= 4)
        assert_int_equal(zoff_gpt2_block_params(C), 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C +
                                                        4 * C * C + C);
}

static void test_tensor_table_by_hand(void **state) {
    (void)state;
    const int64_t C = 8;
    zoff_gpt2_shape s = {.num_layers = 2, .hidden_size = C, .num_heads = 2, .max_seq_len = 4, .vocab_size = 10};
    assert_int_equal(zoff_gpt2_num_tensors(2), 28);
    /* the layout of include/zoff/model.h, written out: name, rows, cols (0: 1-D), decay */
    static const struct {
        const char *name;
        int64_t d0, d1;
        bool decay;
    } want[] = {
        {"wte.weight", 128, 8, true},  {"wpe.weight", 4, 8, true},
#define BLOCK(l)                                                                                              \
    {"h." #l ".ln_1.weight", 8, 0, false}, {"h." #l ".ln_1.bias", 8, 0, false},                            \
        {"h." #l ".attn.c_attn.weight", 24, 8, true}, {"h." #l ".attn.c_attn.bias", 24, 0, false},           \
        {"h." #l ".attn.c_proj.weight", 8, 8, true}, {"h." #l ".attn.c_proj.bias", 8, 0, false},            \
        {"h." #l ".ln_2.weight", 8, 0, false}, {"h." #l ".ln_2.bias", 8, 0, false},                         \
        {"h." #l ".mlp.c_fc.weight", 32, 8, true}, {"h." #l ".mlp.c_fc.bias", 32, 0, false},               \
        {"h." #l ".mlp.c_proj.weight", 8, 32, true}, {"h." #l ".mlp.c_proj.bias", 8, 0, false}
        BLOCK(0),
        BLOCK(1),
#undef BLOCK
        {"ln_f.weight", 8, 0, false},  {"ln_f.bias", 8, 0, false},
    };
    zoff_tensor_info t[28];
    assert_ok(zoff_gpt2_check_shape(&s, "test", NULL));
    int64_t n = zoff_gpt2_tensor_table(&s, t);
    int64_t off = 0;
    for (int i = 0; i < 28; i++) {
        assert_string_equal(t[i].name, want[i].name);
        assert_int_equal(t[i].offset, off);
        assert_int_equal(t[i].ndim, want[i].d1 ? 2 : 1);
        assert_int_equal(t[i].shape[0], want[i].d0);
        assert_int_equal(t[i].shape[1], want[i].d1);
        assert_int_equal(t[i].numel, want[i].d0 * (want[i].d1 ? want[i].d1 : 1));
        assert_int_equal(t[i].decay, want[i].decay);
        assert_int_equal(t[i].layer, i < 2 || i >= 26 ? -1 : (i - 2) / 12);
        off += t[i].numel;
    }
    assert_int_equal(n, off);
    assert_int_equal(n, zoff_gpt2_count_params(&s));
}

static void test_shape_bounds(void **state) {
    (void)state;
    const zoff_gpt2_shape good = {.num_layers = 2, .hidden_size = 64, .num_heads = 4, .max_seq_len = 32,
                                  .vocab_size = 100};
    zoff_gpt2_shape r;
    assert_ok(zoff_gpt2_check_shape(&good, "t", &r));
    assert_int_equal(r.padded_vocab_size, 128);
    zoff_gpt2_shape s = good;
    s.num_layers = ZOFF_GPT2_MAX_LAYERS;
    assert_true(zoff_gpt2_shape_in_bounds(&s));
    s.num_layers = ZOFF_GPT2_MAX_LAYERS + 1;
    assert_false(zoff_gpt2_shape_in_bounds(&s));
    assert_err(zoff_gpt2_check_shape(&s, "who", NULL), ZOFF_ERR_INVALID, "who: shape.num_layers is 65537");
    s = good;
    s.hidden_size = ZOFF_GPT2_MAX_HIDDEN + 1;
    assert_err(zoff_gpt2_check_shape(&s, "w", NULL), ZOFF_ERR_INVALID, "--hidden-size");
    s = good;
    s.num_heads = 3;
    assert_err(zoff_gpt2_check_shape(&s, "w", NULL), ZOFF_ERR_INVALID, "--num-attention-heads");
    s = good;
    s.max_seq_len = 0;
    assert_err(zoff_gpt2_check_shape(&s, "w", NULL), ZOFF_ERR_INVALID, "--max-position-embeddings");
    s = good;
    s.vocab_size = ZOFF_GPT2_MAX_VOCAB + 1;
    assert_err(zoff_gpt2_check_shape(&s, "w", NULL), ZOFF_ERR_INVALID, "--vocab-size");
    s = good;
    s.padded_vocab_size = 99;
    assert_err(zoff_gpt2_check_shape(&s, "w", NULL), ZOFF_ERR_INVALID, "padded_vocab_size");
    /* training's vocabulary bound is the token shards' uint16 range */
    assert_int_equal(ZOFF_GPT2_MAX_TRAIN_VOCAB, 65536);
    /* the largest shape in bounds still counts its parameters inside int64 */
    zoff_gpt2_shape big = {.num_layers = ZOFF_GPT2_MAX_LAYERS, .hidden_size = ZOFF_GPT2_MAX_HIDDEN, .num_heads = 1,
                           .max_seq_len = ZOFF_GPT2_MAX_SEQ, .vocab_size = ZOFF_GPT2_MAX_VOCAB};
    assert_true(zoff_gpt2_shape_in_bounds(&big));
    double C = (double)ZOFF_GPT2_MAX_HIDDEN, L = (double)ZOFF_GPT2_MAX_LAYERS;
    double want = (double)zoff_gpt2_padded_vocab(&big) * C + (double)ZOFF_GPT2_MAX_SEQ * C + L * (12 * C * C + 13 * C) +
                  2 * C;
    assert_true(want < 9.2e18);
    assert_true(fabs((double)zoff_gpt2_count_params(&big) - want) <= want * 1e-15);
}

/* ------------------------------------------------------------------ device interface */

static void test_supports_op_and_native(void **state) {
    (void)state;
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    zoff_device *dev = NULL;
    assert_ok(zoff_device_create(&o, &dev));
    for (int op = 0; op < ZOFF_OP_COUNT; op++) assert_true(zoff_device_supports_op(dev, (zoff_op)op, NULL, 0));
    assert_false(zoff_device_supports_op(dev, ZOFF_OP_COUNT, NULL, 0));
    assert_non_null(strstr(zoff_last_error(), "unknown op code"));
    float *x = NULL;
    assert_ok(zoff_device_alloc(dev, 64, "x", (void **)&x));
    zoff_op_gelu_fwd_args g = {.out = x, .inp = x, .n = 16, .dt = ZOFF_F32};
    assert_true(zoff_device_supports_op(dev, ZOFF_OP_GELU_FWD, &g, sizeof g));
    g.dt = ZOFF_I32; /* the ops compute on float dtypes only */
    assert_false(zoff_device_supports_op(dev, ZOFF_OP_GELU_FWD, &g, sizeof g));
    assert_non_null(strstr(zoff_last_error(), "i32"));
    g.dt = ZOFF_F32;
    assert_false(zoff_device_supports_op(dev, ZOFF_OP_GELU_FWD, &g, sizeof g - 1));
    assert_non_null(strstr(zoff_last_error(), "args_size"));
    /* the CPU backend has no native stream handle; its ordinal is the option's */
    assert_null(zoff_stream_native(zoff_device_stream(dev)));
    assert_null(zoff_stream_native(NULL));
    assert_int_equal(zoff_device_ordinal(dev), 0);
    zoff_device_free(dev, x);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ small public functions */

static void test_comm_timeout(void **state) {
    (void)state;
    zoff_comm *c = NULL;
    assert_ok(zoff_comm_create_single(&c));
    assert_true(zoff_comm_timeout(c) > 0);
    zoff_comm_set_timeout(c, 12.5);
    assert_true(zoff_comm_timeout(c) == 12.5);
    zoff_comm_set_timeout(c, 0); /* not a timeout: ignored */
    assert_true(zoff_comm_timeout(c) == 12.5);
    zoff_comm_set_timeout(c, -1);
    assert_true(zoff_comm_timeout(c) == 12.5);
    zoff_comm_destroy(c);
}

/* One AdamW step on one element from m = v = 0, in double: bias-corrected m / (sqrt(v) + eps). */
static double adam_first_step(double p, double g, double lr, double b1, double b2, double eps) {
    double m = (1 - b1) * g, v = (1 - b2) * g * g;
    return p - (lr / (1 - b1)) * m / (sqrt(v) / sqrt(1 - b2) + eps);
}

static void test_optimizer_type_and_eps(void **state) {
    (void)state;
    zoff_optimizer_config cfg = {.type = ZOFF_OPTIM_ADAMW, .lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                 .adam_w_mode = true, .bias_correction = true};
    zoff_host_optimizer *opt = NULL;
    assert_ok(zoff_host_optimizer_create(&cfg, 1, &opt));
    assert_int_equal(zoff_host_optimizer_type(opt), ZOFF_OPTIM_ADAMW);
    assert_err(zoff_host_optimizer_set_eps(opt, -1.0), ZOFF_ERR_INVALID, "eps");
    assert_err(zoff_host_optimizer_set_eps(opt, NAN), ZOFF_ERR_INVALID, "eps");
    const double eps[2] = {1e-8, 0.5};
    for (int k = 0; k < 2; k++) {
        assert_ok(zoff_host_optimizer_set_eps(opt, eps[k]));
        float p[4] = {1.0f, -0.5f, 2.0f, 0.25f}, m[4] = {0}, v[4] = {0};
        const float g[4] = {0.5f, -2.0f, 1e-3f, 0.0f};
        zoff_optim_tensors t = {.params = p, .exp_avg = m, .exp_avg_sq = v, .state_dt = ZOFF_F32, .grads = g,
                                .grad_dt = ZOFF_F32, .n = 4};
        const float p0[4] = {p[0], p[1], p[2], p[3]};
        assert_ok(zoff_host_optimizer_begin_step(opt, 1, 0.1));
        assert_ok(zoff_host_optimizer_update(opt, &t, 0.0, 1.0));
        for (int i = 0; i < 4; i++) {
            double want = adam_first_step(p0[i], g[i], 0.1, 0.9, 0.999, eps[k]);
            if (fabs(p[i] - want) > 1e-6 * (1 + fabs(want)))
                fail_msg("eps %g element %d: %.9g, expected %.9g", eps[k], i, (double)p[i], want);
        }
        /* eps = 0.5 visibly damps the step of a small gradient: 2 - 0.1 * 1e-3/(1e-3 + 0.5) */
        if (k == 1) assert_true(fabs(p[2] - (2.0 - 0.1 * 1e-3 / (1e-3 + 0.5))) < 1e-6);
    }
    zoff_host_optimizer_destroy(opt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_parameter_counts),
        cmocka_unit_test(test_tensor_table_by_hand),
        cmocka_unit_test(test_shape_bounds),
        cmocka_unit_test(test_supports_op_and_native),
        cmocka_unit_test(test_comm_timeout),
        cmocka_unit_test(test_optimizer_type_and_eps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
