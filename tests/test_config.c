/* DeepSpeed JSON config -> zoff_config: defaults, real DeepSpeed files, the
 * batch relation, and every kind of error (each message names the key path). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/config.h"
#include "zoff/engine.h"

/* Test JSON is written with single quotes; this turns them into double quotes. */
static char *dq(const char *text) {
    char *s = strdup(text);
    assert_non_null(s);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    return s;
}

static zoff_status load(const char *text, zoff_config *cfg) {
    char *s = dq(text);
    zoff_status st = zoff_config_load_string(s, "test.json", cfg);
    free(s);
    return st;
}

static void load_ok(const char *text, zoff_config *cfg) {
    zoff_status st = load(text, cfg);
    if (st != ZOFF_OK) fail_msg("expected %s to load, got %s: %s", text, zoff_status_name(st), zoff_last_error());
}

static void assert_msg_has(const char *needle) {
    const char *msg = zoff_last_error();
    if (strstr(msg, needle) == NULL) fail_msg("message lacks \"%s\": %s", needle, msg);
}

/* Loading `text` fails with ZOFF_ERR_CONFIG and a message holding every string
 * in the NULL-terminated list. cfg is left at the defaults. */
static void expect_error_v(const char *text, ...) {
    zoff_config cfg;
    zoff_status st = load(text, &cfg);
    if (st != ZOFF_ERR_CONFIG)
        fail_msg("expected ZOFF_ERR_CONFIG for %s, got %s (%s)", text, zoff_status_name(st), zoff_last_error());
    va_list ap;
    va_start(ap, text);
    for (const char *needle = va_arg(ap, const char *); needle; needle = va_arg(ap, const char *))
        assert_msg_has(needle);
    va_end(ap);
    assert_null(cfg.source);
    assert_null(cfg.no_effect);
    assert_null(cfg.unsupported);
    assert_int_equal(cfg.zero.stage, 0);
    zoff_config_free(&cfg);
}
#define expect_error(...) expect_error_v(__VA_ARGS__, (const char *)NULL)

/* ------------------------------------------------------------------ defaults */

static void check_defaults(const zoff_config *c) {
    assert_int_equal(c->train_batch_size, 0);
    assert_int_equal(c->train_micro_batch_size_per_gpu, 0);
    assert_int_equal(c->gradient_accumulation_steps, 0);
    assert_false(c->optimizer_given);
    assert_int_equal(c->optimizer.type, ZOFF_OPTIM_ADAM);
    assert_true(c->optimizer.lr == 1e-3);
    assert_true(c->optimizer.beta1 == 0.9 && c->optimizer.beta2 == 0.999);
    assert_true(c->optimizer.eps == 1e-8);
    assert_true(c->optimizer.weight_decay == 0.0);
    assert_true(c->optimizer.adam_w_mode && c->optimizer.bias_correction && !c->optimizer.torch_adam);
    assert_int_equal(c->scheduler.type, ZOFF_SCHED_NONE);
    assert_true(c->scheduler.warmup_min_lr == 0.0 && c->scheduler.warmup_max_lr == 0.001);
    assert_false(c->scheduler.warmup_max_lr_given);
    assert_int_equal(c->scheduler.warmup_num_steps, 1000);
    assert_int_equal(c->scheduler.warmup_type, ZOFF_WARMUP_LOG);
    assert_int_equal(c->scheduler.total_num_steps, 0);
    assert_true(c->scheduler.warmup_min_ratio == 0.0 && c->scheduler.cos_min_ratio == 0.0001);
    assert_true(c->gradient_clipping == 1.0);
    assert_false(c->fp16.enabled);
    assert_true(c->fp16.loss_scale == 0.0);
    assert_int_equal(c->fp16.initial_scale_power, 16);
    assert_int_equal(c->fp16.loss_scale_window, 1000);
    assert_int_equal(c->fp16.hysteresis, 2);
    assert_false(c->fp16.consecutive_hysteresis);
    assert_true(c->fp16.min_loss_scale == 1.0);
    assert_false(c->bf16_enabled);
    assert_int_equal(c->steps_per_print, 10);
    assert_false(c->wall_clock_breakdown);
    assert_false(c->prescale_gradients);
    assert_true(c->gradient_predivide_factor == 1.0);
    const zoff_zero_config *z = &c->zero;
    assert_int_equal(z->stage, 0);
    assert_true(z->contiguous_gradients && !z->overlap_comm && z->reduce_scatter && z->allgather_partitions);
    assert_int_equal(z->reduce_bucket_size, 500000000);
    assert_int_equal(z->allgather_bucket_size, 500000000);
    assert_int_equal(z->sub_group_size, 1000000000);
    assert_false(z->round_robin_gradients);
    assert_false(z->cpu_offload);
    assert_int_equal(z->stage3_prefetch_bucket_size, 50000000);
    assert_int_equal(z->stage3_param_persistence_threshold, 100000);
    assert_int_equal(z->stage3_max_live_parameters, 1000000000);
    assert_int_equal(z->stage3_max_reuse_distance, 1000000000);
    assert_false(z->stage3_gather_16bit_weights_on_model_save);
    assert_false(z->elastic_checkpoint);
    assert_false(z->delayed_param_update);
    assert_int_equal(z->grad_buckets, ZOFF_GRAD_BUCKETS_ON);
    assert_int_equal(z->delayed_param_update_warmup, 10);
    assert_int_equal(z->offload_optimizer.device, ZOFF_OFFLOAD_NONE);
    assert_string_equal(z->offload_optimizer.nvme_path, "");
    assert_true(z->offload_optimizer.pin_memory);
    assert_int_equal(z->offload_optimizer.buffer_count, 4);
    assert_false(z->offload_optimizer.pipeline_read || z->offload_optimizer.pipeline_write);
    assert_false(z->offload_optimizer.fast_init);
    assert_true(z->offload_optimizer.ratio == 1.0);
    assert_false(z->offload_optimizer.ratio_auto);
    assert_int_equal(z->offload_param.device, ZOFF_OFFLOAD_NONE);
    assert_true(z->offload_param.pin_memory);
    assert_int_equal(z->offload_param.buffer_count, 5);
    assert_int_equal(z->offload_param.buffer_size, 100000000);
    assert_int_equal(z->offload_param.max_in_cpu, 1000000000);
    assert_int_equal(c->aio.block_size, 1048576);
    assert_int_equal(c->aio.queue_depth, 8);
    assert_int_equal(c->aio.intra_op_parallelism, 1);
    assert_false(c->aio.single_submit);
    assert_true(c->aio.overlap_events);
    assert_int_equal(c->model.num_layers, 0);
    assert_int_equal(c->model.hidden_size, 0);
    assert_null(c->no_effect);
    assert_null(c->unsupported);
}

static void test_defaults(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_config_defaults(&cfg);
    check_defaults(&cfg);
    assert_null(cfg.source);
    assert_null(cfg.source_name);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);

    /* An empty object is all defaults, and keeps its text. */
    load_ok("{}", &cfg);
    check_defaults(&cfg);
    assert_string_equal(cfg.source, "{}");
    assert_string_equal(cfg.source_name, "test.json");
    zoff_config_free(&cfg);
    assert_null(cfg.source);
    zoff_config_free(&cfg); /* free twice is harmless */
}

/* ------------------------------------------------------------------ real files */

static void test_zero_offload_file(void **state) {
    (void)state;
    zoff_config cfg;
    const char *path = ZOFF_TEST_DIR "/configs/zero_offload_gpt2_10b.json";
    zoff_status st = zoff_config_load_file(path, &cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(cfg.train_batch_size, 10);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 0);
    assert_int_equal(cfg.gradient_accumulation_steps, 1);
    assert_int_equal(cfg.steps_per_print, 1);
    assert_true(cfg.optimizer_given);
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAM);
    assert_true(cfg.optimizer.adam_w_mode); /* DeepSpeed: Adam means AdamW unless adam_w_mode false */
    assert_true(cfg.optimizer.lr == 0.00015);
    assert_true(cfg.optimizer.beta1 == 0.9 && cfg.optimizer.beta2 == 0.95);
    assert_true(cfg.optimizer.weight_decay == 1e-2);
    assert_int_equal(cfg.scheduler.type, ZOFF_SCHED_WARMUP_DECAY_LR);
    assert_true(cfg.scheduler.warmup_max_lr == 0.00015 && cfg.scheduler.warmup_max_lr_given);
    assert_int_equal(cfg.scheduler.warmup_num_steps, 100);
    assert_int_equal(cfg.scheduler.total_num_steps, 10000);
    assert_true(cfg.fp16.enabled);
    assert_int_equal(cfg.fp16.loss_scale_window, 1000);
    assert_int_equal(cfg.zero.stage, 2);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_CPU);
    assert_true(cfg.zero.offload_optimizer.pin_memory);
    assert_true(cfg.zero.overlap_comm && cfg.zero.contiguous_gradients);
    assert_int_equal(cfg.zero.offload_param.device, ZOFF_OFFLOAD_NONE);
    assert_int_equal(cfg.model.num_layers, 50);
    assert_int_equal(cfg.model.hidden_size, 4096);
    assert_int_equal(cfg.model.num_attention_heads, 32);
    assert_int_equal(cfg.model.vocab_size, 50257);
    assert_string_equal(cfg.source_name, path);
    assert_non_null(strstr(cfg.source, "\"offload_optimizer\""));

    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 10);
    assert_int_equal(cfg.gradient_accumulation_steps, 1);

    st = zoff_config_check_supported(&cfg); /* ZeRO-Offload stage 2, fp16: implemented */
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    zoff_config_free(&cfg);
}

static void test_zero_infinity_file(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_status st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/zero_infinity_nvme.json", &cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAMW);
    assert_true(cfg.optimizer.lr == 3e-4 && cfg.optimizer.weight_decay == 0.1);
    assert_int_equal(cfg.scheduler.type, ZOFF_SCHED_WARMUP_COSINE_LR);
    assert_int_equal(cfg.scheduler.total_num_steps, 100000); /* written 1e5 */
    assert_int_equal(cfg.scheduler.warmup_num_steps, 2000);
    assert_int_equal(cfg.scheduler.warmup_type, ZOFF_WARMUP_LINEAR);
    assert_true(cfg.scheduler.cos_min_ratio == 0.1);
    assert_true(cfg.bf16_enabled);
    assert_false(cfg.fp16.enabled);
    const zoff_zero_config *z = &cfg.zero;
    assert_int_equal(z->stage, 3);
    assert_true(z->overlap_comm); /* not given: stage 3 default */
    assert_int_equal(z->stage3_max_live_parameters, 1000000000);
    assert_int_equal(z->stage3_prefetch_bucket_size, 10000000);
    assert_int_equal(z->stage3_param_persistence_threshold, 100000);
    assert_int_equal(z->reduce_bucket_size, 10000000);
    assert_true(z->stage3_gather_16bit_weights_on_model_save);
    assert_int_equal(z->offload_optimizer.device, ZOFF_OFFLOAD_NVME);
    assert_string_equal(z->offload_optimizer.nvme_path, "/local_nvme");
    assert_true(z->offload_optimizer.pipeline_read && z->offload_optimizer.pipeline_write);
    assert_int_equal(z->offload_param.device, ZOFF_OFFLOAD_NVME);
    assert_string_equal(z->offload_param.nvme_path, "/local_nvme");
    assert_int_equal(z->offload_param.buffer_size, 100000000);
    assert_int_equal(z->offload_param.max_in_cpu, 1000000000);
    assert_int_equal(cfg.aio.intra_op_parallelism, 1); /* from "thread_count" */
    assert_int_equal(cfg.aio.queue_depth, 8);

    assert_int_equal(zoff_config_resolve_batch(&cfg, 2), ZOFF_OK);
    assert_int_equal(cfg.train_batch_size, 64);

    /* stage 3 with the optimizer and the parameters on NVMe (ZeRO-Infinity) is implemented */
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);
    zoff_config_free(&cfg);
}

static void test_legacy_keys_file(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_status st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/legacy_keys.json", &cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAMW); /* "adamw": case-insensitive */
    assert_true(cfg.bf16_enabled);                          /* "bfloat16" */
    assert_true(cfg.zero.cpu_offload);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_CPU);
    assert_true(cfg.zero.stage3_gather_16bit_weights_on_model_save); /* old "fp16" name */
    assert_int_equal(cfg.zero.allgather_bucket_size, 200000000);
    assert_true(cfg.zero.round_robin_gradients);
    assert_int_equal(cfg.aio.intra_op_parallelism, 2); /* "thread_count" */
    assert_int_equal(cfg.aio.queue_depth, 16);

    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.gradient_accumulation_steps, 8);
    st = zoff_config_check_supported(&cfg); /* legacy cpu_offload = offload_optimizer cpu: implemented */
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    zoff_config_free(&cfg);

    st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/legacy_keys.json", &cfg);
    assert_int_equal(st, ZOFF_OK);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 2), ZOFF_OK);
    assert_int_equal(cfg.gradient_accumulation_steps, 4);
    zoff_config_free(&cfg);

    st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/legacy_keys.json", &cfg);
    assert_int_equal(st, ZOFF_OK);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 3), ZOFF_ERR_CONFIG);
    assert_msg_has("train_batch_size 64");
    assert_msg_has("world size 3");
    assert_msg_has("legacy_keys.json");
    zoff_config_free(&cfg);
}

static void test_stage0_file_supported(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_status st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/stage0_fp32.json", &cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.gradient_accumulation_steps, 4);
    st = zoff_config_check_supported(&cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_int_equal(cfg.model.num_layers, 4);
    zoff_config_free(&cfg);
}

static void test_file_errors(void **state) {
    (void)state;
    zoff_config cfg;
    /* a --config that cannot be read is a config error like any other (zoff exits 2) */
    assert_int_equal(zoff_config_load_file(ZOFF_TEST_DIR "/configs/does_not_exist.json", &cfg), ZOFF_ERR_CONFIG);
    assert_msg_has("does_not_exist.json");
    assert_null(cfg.source);
    check_defaults(&cfg);
    assert_int_equal(zoff_config_load_file(ZOFF_TEST_DIR "/configs", &cfg), ZOFF_ERR_CONFIG); /* a directory */
    assert_msg_has("configs");
    assert_msg_has("is a directory");
}

/* ------------------------------------------------------------------ batch relation */

typedef struct batch_case {
    int64_t tb, mb, ga;
    int world;
    zoff_status want;
    int64_t want_tb, want_mb, want_ga;
    const char *msg; /* substring of the error */
} batch_case;

static void test_batch_relation(void **state) {
    (void)state;
    static const batch_case cases[] = {
        /* all three */
        {32, 4, 8, 1, ZOFF_OK, 32, 4, 8, NULL},
        {32, 4, 4, 2, ZOFF_OK, 32, 4, 4, NULL},
        {32, 4, 4, 1, ZOFF_ERR_CONFIG, 0, 0, 0,
         "train_batch_size 32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 4 * world size 1"},
        {32, 4, 8, 2, ZOFF_ERR_CONFIG, 0, 0, 0, "world size 2"},
        /* two of three */
        {32, 4, 0, 1, ZOFF_OK, 32, 4, 8, NULL},
        {32, 4, 0, 2, ZOFF_OK, 32, 4, 4, NULL},
        {30, 4, 0, 1, ZOFF_ERR_CONFIG, 0, 0, 0, "train_batch_size 30 is not divisible"},
        {32, 8, 0, 8, ZOFF_ERR_CONFIG, 0, 0, 0, "world size 8"},
        {32, 0, 8, 1, ZOFF_OK, 32, 4, 8, NULL},
        {32, 0, 8, 2, ZOFF_OK, 32, 2, 8, NULL},
        {32, 0, 3, 1, ZOFF_ERR_CONFIG, 0, 0, 0, "gradient_accumulation_steps 3"},
        {0, 4, 8, 1, ZOFF_OK, 32, 4, 8, NULL},
        {0, 4, 8, 2, ZOFF_OK, 64, 4, 8, NULL},
        /* one given */
        {32, 0, 0, 1, ZOFF_OK, 32, 32, 1, NULL},
        {32, 0, 0, 2, ZOFF_OK, 32, 16, 1, NULL},
        {33, 0, 0, 2, ZOFF_ERR_CONFIG, 0, 0, 0, "train_batch_size 33 is not divisible by world size 2"},
        {0, 4, 0, 1, ZOFF_OK, 4, 4, 1, NULL},
        {0, 4, 0, 2, ZOFF_OK, 8, 4, 1, NULL},
        {0, 0, 8, 1, ZOFF_ERR_CONFIG, 0, 0, 0,
         "set train_batch_size or train_micro_batch_size_per_gpu (gradient_accumulation_steps alone is not enough), "
         "or give --micro-batch-size"},
        /* none: the accumulation not named, the flag that gives it is */
        {0, 0, 0, 1, ZOFF_ERR_CONFIG, 0, 0, 0, "no batch size given: set train_batch_size or "
                                               "train_micro_batch_size_per_gpu, or give --micro-batch-size"},
        /* overflow */
        {0, INT64_MAX / 2, 4, 1, ZOFF_ERR_CONFIG, 0, 0, 0, "overflows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const batch_case *c = &cases[i];
        zoff_config cfg;
        zoff_config_defaults(&cfg);
        cfg.train_batch_size = c->tb;
        cfg.train_micro_batch_size_per_gpu = c->mb;
        cfg.gradient_accumulation_steps = c->ga;
        zoff_status st = zoff_config_resolve_batch(&cfg, c->world);
        if (st != c->want)
            fail_msg("case %zu (%lld, %lld, %lld, world %d): got %s: %s", i, (long long)c->tb, (long long)c->mb,
                     (long long)c->ga, c->world, zoff_status_name(st), zoff_last_error());
        if (st == ZOFF_OK) {
            assert_int_equal(cfg.train_batch_size, c->want_tb);
            assert_int_equal(cfg.train_micro_batch_size_per_gpu, c->want_mb);
            assert_int_equal(cfg.gradient_accumulation_steps, c->want_ga);
            /* resolving again is consistent */
            assert_int_equal(zoff_config_resolve_batch(&cfg, c->world), ZOFF_OK);
        } else {
            assert_msg_has(c->msg);
        }
    }
    zoff_config cfg;
    zoff_config_defaults(&cfg);
    cfg.train_batch_size = 8;
    assert_int_equal(zoff_config_resolve_batch(&cfg, 0), ZOFF_ERR_INVALID);

    /* From JSON: contradiction names all three values and the world size. */
    load_ok("{'train_batch_size': 48, 'train_micro_batch_size_per_gpu': 4, 'gradient_accumulation_steps': 4}", &cfg);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 2), ZOFF_ERR_CONFIG);
    assert_msg_has("test.json");
    assert_msg_has("48");
    assert_msg_has("micro_batch_size_per_gpu 4");
    assert_msg_has("gradient_accumulation_steps 4");
    assert_msg_has("world size 2");
    zoff_config_free(&cfg);
    expect_error("{'train_batch_size': 0}", "train_batch_size", "out of range", "an integer >= 1");
    /* null is DeepSpeed's "not given" for the three (get_scalar_param with a None default): the other
     * two give it. Worked by hand: 8 = 2 x 4 on one rank; 6 / 3 = 2 per micro-step. */
    load_ok("{'train_batch_size': null, 'train_micro_batch_size_per_gpu': 2, 'gradient_accumulation_steps': 4}", &cfg);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.train_batch_size, 8);
    zoff_config_free(&cfg);
    load_ok("{'train_batch_size': 6, 'train_micro_batch_size_per_gpu': null, 'gradient_accumulation_steps': 3}", &cfg);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 2);
    zoff_config_free(&cfg);
    load_ok("{'train_batch_size': 4, 'train_micro_batch_size_per_gpu': 4, 'gradient_accumulation_steps': null}", &cfg);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.gradient_accumulation_steps, 1);
    zoff_config_free(&cfg);
    expect_error("{'gradient_accumulation_steps': -2}", "gradient_accumulation_steps", "-2");
}

/* ------------------------------------------------------------------ unknown keys */

static void test_unknown_keys(void **state) {
    (void)state;
    expect_error("{'train_batch_sise': 8}", "test.json", "train_batch_sise", "allowed keys at the top level",
                 "(did you mean \"train_batch_size\"?)", "zero_optimization");
    expect_error("{'optimizer': {'type': 'Adam', 'parms': {}}}", "optimizer.parms", "allowed keys at optimizer",
                 "type, params");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'max_grad_norm': 1.0}}}",
                 "optimizer.params.max_grad_norm", "allowed keys at optimizer.params", "bias_correction");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'warmup_steps': 5}}}",
                 "scheduler.params.warmup_steps", "warmup_num_steps");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'lr': 5}}", "scheduler.lr", "allowed keys at scheduler");
    expect_error("{'fp16': {'enabled': false, 'initial_scale': 12}}", "fp16.initial_scale", "initial_scale_power");
    expect_error("{'bf16': {'enabled': true, 'immediate_grad_updates': true}}", "bf16.immediate_grad_updates",
                 "did you mean \"immediate_grad_update\"", "allowed keys at bf16: enabled",
                 "bf16_optimizer_states");
    /* bf16 optimizer states: bf16 training with the host optimizer (state in host memory or NVMe) */
    expect_error("{'bf16': {'bf16_optimizer_states': true}}", "bf16.bf16_optimizer_states",
                 "needs bf16 training (bf16.enabled true)");
    expect_error("{'bf16': {'enabled': true, 'bf16_optimizer_states': true}, 'zero_optimization': {'stage': 2}}",
                 "bf16.bf16_optimizer_states", "offload_optimizer.device \"cpu\" or \"nvme\"", "is \"none\"",
                 "the device optimizer keeps fp32 state");
    {
        zoff_config c;
        load_ok("{'bf16': {'enabled': true, 'bf16_optimizer_states': true}, 'zero_optimization': {'stage': 2, "
                "'offload_optimizer': {'device': 'nvme', 'nvme_path': '/tmp'}}}",
                &c); /* the NVMe swap file keeps m and v in bf16 too */
        assert_int_equal(zoff_optimizer_state_dtype(&c), ZOFF_BF16);
        assert_null(c.unsupported);
        zoff_config_free(&c);
        load_ok("{'bf16': {'enabled': true, 'bf16_optimizer_states': true}, 'zero_optimization': {'stage': 2, "
                "'offload_optimizer': {'device': 'cpu'}}}",
                &c);
        assert_true(c.bf16_optimizer_states);
        assert_int_equal(zoff_optimizer_state_dtype(&c), ZOFF_BF16);
        assert_null(c.unsupported);
        zoff_config_free(&c);
        load_ok("{'bf16': {'enabled': true, 'bf16_optimizer_states': false}}", &c);
        assert_int_equal(zoff_optimizer_state_dtype(&c), ZOFF_F32);
        zoff_config_free(&c);
    }
    expect_error("{'zero_optimization': {'stage': 1, 'offload_optimiser': {}}}",
                 "zero_optimization.offload_optimiser", "did you mean \"offload_optimizer\"",
                 "allowed keys at zero_optimization: stage, ", "also accepted", "stage3_max_live_parameters");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 'cpu', 'pin': true}}}",
                 "zero_optimization.offload_optimizer.pin", "pin_memory", "ratio");
    expect_error("{'zero_optimization': {'offload_param': {'device': 'cpu', 'buffer': 5}}}",
                 "zero_optimization.offload_param.buffer", "buffer_count", "max_in_cpu");
    expect_error("{'aio': {'blocksize': 4096}}", "aio.blocksize", "block_size", "thread_count");
    expect_error("{'model': {'n_layer': 12}}", "model.n_layer", "num_layers", "max_position_embeddings");
    /* Not DeepSpeed keys: another tool's name (DeepSpeed's is data_types.grad_accum_dtype), typos. */
    expect_error("{'gradient_accumulation_dtype': 'fp32'}", "gradient_accumulation_dtype", "unknown key",
                 "data_types");
    expect_error("{'zero_allow_untested_optimiser': true}", "did you mean \"zero_allow_untested_optimizer\"");
    expect_error("{'tensorboard': {'enable': true}}", "tensorboard.enable", "did you mean \"enabled\"");
    /* no close match, but the start of a key: the shortest such key */
    expect_error("{'train_micro_batch_size': 4}", "did you mean \"train_micro_batch_size_per_gpu\"");
    expect_error("{'gradient_accumulation': 4}", "did you mean \"gradient_accumulation_steps\"");
    expect_error("{'train_batch': 4}", "did you mean \"train_batch_size\"");
    expect_error("{'gradient_clip': 1.0}", "did you mean \"gradient_clipping\"");
    expect_error("{'scheduler': {'type': null}}", "scheduler.type", "got a JSON null");
    expect_error("{'wandb': {'enabled': false, 'projet': 'x'}}", "wandb.projet", "did you mean \"project\"");
    expect_error("{'zero_optimization': {'stage3_prefetch_bucket_sise': 5}}",
                 "did you mean \"stage3_prefetch_bucket_size\"");
    expect_error("{'activation_checkpointing': {'partitioned_activations': true}}",
                 "activation_checkpointing.partitioned_activations", "did you mean \"partition_activations\"");
    /* a feature section zoff does not implement: a near miss of its switch is not "off" */
    expect_error("{'elasticity': {'enabeld': true, 'max_train_batch_size': 2000}}", "elasticity.enabeld",
                 "did you mean \"enabled\"", "accepted while \"enabled\" is false or absent");
    expect_error("{'compile': {'deep_compile': true}}", "compile.deep_compile", "did you mean \"deepcompile\"");
    /* zoff_grad_buckets: true, false or "always" */
    expect_error("{'zero_optimization': {'zoff_grad_buckets': 'sometimes'}}", "zero_optimization.zoff_grad_buckets",
                 "\"sometimes\" is not allowed", "true, false or \"always\"");
    expect_error("{'zero_optimization': {'zoff_grad_buckets': 1}}", "zero_optimization.zoff_grad_buckets",
                 "expected true, false or \"always\"");
    {
        zoff_config c;
        const char *vals[] = {"true", "false", "'always'"};
        const zoff_grad_buckets_mode want[] = {ZOFF_GRAD_BUCKETS_ON, ZOFF_GRAD_BUCKETS_OFF, ZOFF_GRAD_BUCKETS_ALWAYS};
        for (int i = 0; i < 3; i++) {
            char text[128];
            snprintf(text, sizeof text, "{'zero_optimization': {'zoff_grad_buckets': %s}}", vals[i]);
            load_ok(text, &c);
            assert_int_equal(c.zero.grad_buckets, want[i]);
            zoff_config_free(&c);
        }
    }
    /* A key that belongs to another type of optimizer or scheduler. */
    expect_error("{'optimizer': {'type': 'Lion', 'params': {'eps': 1e-8}}}", "optimizer.params.eps",
                 "not a parameter of Lion", "allowed keys at optimizer.params for Lion: lr, betas, weight_decay");
    expect_error("{'optimizer': {'type': 'Adagrad', 'params': {'betas': [0.9, 0.99]}}}", "optimizer.params.betas",
                 "not a parameter of Adagrad");
    expect_error("{'scheduler': {'type': 'WarmupCosineLR', 'params': {'total_num_steps': 10, 'warmup_max_lr': 1}}}",
                 "scheduler.params.warmup_max_lr", "not a parameter of WarmupCosineLR", "cos_min_ratio");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'total_num_steps': 100}}}",
                 "scheduler.params.total_num_steps", "not a parameter of WarmupLR");
}

/* ------------------------------------------------------------------ wrong JSON types */

static void test_wrong_types(void **state) {
    (void)state;
    expect_error("[1, 2]", "top level must be an object");
    expect_error("{'zero_optimization': {'stage': '2'}}", "zero_optimization.stage", "expected an integer in [0, 3]",
                 "\"2\"");
    expect_error("{'fp16': {'enabled': 1}}", "fp16.enabled", "JSON boolean", "got an integer 1");
    expect_error("{'fp16': {'enabled': 'true'}}", "fp16.enabled", "JSON boolean", "\"true\"");
    expect_error("{'wall_clock_breakdown': null}", "wall_clock_breakdown", "got a JSON null");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'lr': '1e-3'}}}", "optimizer.params.lr",
                 "expected a number >= 0", "\"1e-3\"");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'betas': 0.9}}}", "optimizer.params.betas",
                 "an array of two numbers");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9]}}}", "optimizer.params.betas", "[0.9]");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9, '0.99']}}}", "optimizer.params.betas[1]",
                 "expected a number");
    expect_error("{'optimizer': {'type': 3}}", "optimizer.type", "\"Adam\", \"AdamW\", \"Adagrad\", \"Lion\"");
    expect_error("{'optimizer': []}", "optimizer", "expected an object");
    expect_error("{'zero_optimization': true}", "zero_optimization", "expected an object", "got a boolean true");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 'nvme', 'nvme_path': 5}}}",
                 "zero_optimization.offload_optimizer.nvme_path", "expected a string");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 1}}}",
                 "zero_optimization.offload_optimizer.device", "\"none\", \"cpu\", \"nvme\"");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 'nvme', 'nvme_path': ''}}}",
                 "zero_optimization.offload_optimizer.nvme_path", "non-empty");
    expect_error("{'model': {'num_layers': 12.5}}", "model.num_layers", "12.5 is not an integer");
}

/* ------------------------------------------------------------------ out of range */

static void test_out_of_range(void **state) {
    (void)state;
    expect_error("{'zero_optimization': {'stage': 4}}", "test.json", "zero_optimization.stage", "4 is out of range",
                 "[0, 3]");
    expect_error("{'zero_optimization': {'stage': -1}}", "zero_optimization.stage", "-1");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 'cpu', 'ratio': 1.5}}}",
                 "zero_optimization.offload_optimizer.ratio", "1.5", "a number in [0, 1] or \"auto\"");
    expect_error("{'zero_optimization': {'offload_optimizer': {'ratio': -0.1}}}",
                 "zero_optimization.offload_optimizer.ratio", "-0.1");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'lr': -0.001}}}", "optimizer.params.lr", "-0.001",
                 "a number >= 0");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'betas': [0.9, 1.0]}}}", "optimizer.params.betas[1]",
                 "1.0 is out of range", "[0, 1)");
    expect_error("{'optimizer': {'type': 'AdamW', 'params': {'betas': [-0.1, 0.999]}}}", "optimizer.params.betas[0]",
                 "-0.1");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'eps': -1e-8}}}", "optimizer.params.eps");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'weight_decay': -0.1}}}", "optimizer.params.weight_decay");
    expect_error("{'optimizer': {'type': 'OneBitAdam'}}", "optimizer.type", "\"OneBitAdam\" is not supported",
                 "\"Adam\", \"AdamW\", \"Adagrad\", \"Lion\"");
    expect_error("{'optimizer': {'params': {'lr': 0.1}}}", "optimizer.type", "is required");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'amsgrad': true}}}", "optimizer.params.amsgrad",
                 "unsupported", "as in DeepSpeed's fused and CPU Adam");
    /* with torch_adam DeepSpeed builds torch.optim.AdamW, which has AMSGrad: the reason says so, in
     * either key order (torch_adam after amsgrad too) */
    expect_error("{'optimizer': {'type': 'AdamW', 'params': {'amsgrad': true, 'torch_adam': true}}}",
                 "optimizer.params.amsgrad", "true is unsupported", "torch.optim.AdamW", "which has it",
                 "allowed: false");
    {
        zoff_config c;
        assert_int_equal(load("{'optimizer': {'type': 'Adam', 'params': {'torch_adam': true, 'amsgrad': true}}}", &c),
                         ZOFF_ERR_CONFIG);
        assert_msg_has("torch.optim.AdamW");
        assert_null(strstr(zoff_last_error(), "as in DeepSpeed's fused"));
        zoff_config_free(&c);
    }
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'amsgrad': 1}}}", "optimizer.params.amsgrad",
                 "expected true or false");
    expect_error("{'optimizer': {'type': 'Adam', 'params': {'foreach': 'yes'}}}", "optimizer.params.foreach",
                 "expected true or false");
    expect_error("{'optimizer': {'type': 'Lion', 'params': {'foreach': true}}}", "optimizer.params.foreach",
                 "unknown key");
    expect_error("{'optimizer': {'type': 'Adagrad', 'params': {'set_grad_none': true}}}",
                 "optimizer.params.set_grad_none", "unknown key");
    expect_error("{'scheduler': {'type': 'CyclicLR'}}", "scheduler.type", "\"CyclicLR\" is not allowed",
                 "\"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", \"OneCycle\", \"LRRangeTest\"");
    expect_error("{'scheduler': {'type': 'OneCycle', 'params': {'cycle_max_lr': 0.1}}}",
                 "scheduler.params.cycle_min_lr", "is required by OneCycle");
    expect_error("{'scheduler': {'type': 'OneCycle', 'params': {'cycle_min_lr': 0.1}}}",
                 "scheduler.params.cycle_max_lr", "is required by OneCycle");
    expect_error("{'scheduler': {'type': 'OneCycle', 'params': {'cycle_min_lr': 0, 'cycle_max_lr': 1, "
                 "'cycle_max_mom': 1.0}}}", "scheduler.params.cycle_max_mom");
    expect_error("{'scheduler': {'type': 'OneCycle', 'params': {'cycle_min_lr': 0, 'cycle_max_lr': 1, "
                 "'cycle_first_step_size': 0}}}", "scheduler.params.cycle_first_step_size");
    expect_error("{'scheduler': {'type': 'LRRangeTest', 'params': {'cycle_min_lr': 0}}}",
                 "scheduler.params.cycle_min_lr"); /* OneCycle's, not LRRangeTest's */
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'lr_range_test_step_size': 5}}}",
                 "scheduler.params.lr_range_test_step_size");
    expect_error("{'scheduler': {'type': 'LRRangeTest', 'params': {'lr_range_test_step_size': 0}}}",
                 "scheduler.params.lr_range_test_step_size");
    expect_error("{'scheduler': {'type': 'warmuplr'}}", "scheduler.type"); /* class names are exact */
    expect_error("{'scheduler': {'params': {}}}", "scheduler.type", "is required");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'warmup_type': 'exp'}}}",
                 "scheduler.params.warmup_type", "\"exp\"", "\"log\", \"linear\"");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'warmup_num_steps': 0}}}",
                 "scheduler.params.warmup_num_steps", "an integer >= 1");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'last_batch_iteration': 100}}}",
                 "scheduler.params.last_batch_iteration", "100", "-1");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'warmup_min_lr': -1}}}",
                 "scheduler.params.warmup_min_lr");
    expect_error("{'scheduler': {'type': 'WarmupCosineLR', 'params': {'total_num_steps': 10, 'cos_min_ratio': 2}}}",
                 "scheduler.params.cos_min_ratio", "[0, 1]");
    expect_error("{'fp16': {'min_loss_scale': 0}}", "fp16.min_loss_scale", "a number in (0, 3.40282e+38]");
    /* the floor of the dynamic scale has loss_scale's bound, fp32's largest */
    expect_error("{'fp16': {'min_loss_scale': 1e39}}", "fp16.min_loss_scale", "1e+39 is out of range",
                 "a number in (0, 3.40282e+38]");
    expect_error("{'fp16': {'loss_scale': 1e39}}", "fp16.loss_scale", "1e+39 is out of range",
                 "a number in [0, 3.40282e+38]");
    expect_error("{'fp16': {'initial_scale_power': 200}}", "fp16.initial_scale_power", "[0, 127]");
    expect_error("{'fp16': {'loss_scale': -1}}", "fp16.loss_scale");
    expect_error("{'zero_optimization': {'reduce_bucket_size': 0}}", "zero_optimization.reduce_bucket_size");
    expect_error("{'steps_per_print': 0}", "steps_per_print");
    expect_error("{'gradient_clipping': -1.0}", "gradient_clipping");
    expect_error("{'gradient_predivide_factor': 0}", "gradient_predivide_factor", "a number > 0");
    expect_error("{'aio': {'queue_depth': 0}}", "aio.queue_depth");
    expect_error("{'model': {'hidden_size': 0}}", "model.hidden_size");
}

/* ------------------------------------------------------------------ special values */

static void test_ratio_auto(void **state) {
    (void)state;
    zoff_config cfg;
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'ratio': 'auto'}}}", &cfg);
    assert_true(cfg.zero.offload_optimizer.ratio_auto);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 1, 'offload_optimizer': {'device': 'cpu', 'ratio': 0.3}}}", &cfg);
    assert_false(cfg.zero.offload_optimizer.ratio_auto);
    assert_true(cfg.zero.offload_optimizer.ratio == 0.3);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'ratio': 0}}}", &cfg);
    assert_true(cfg.zero.offload_optimizer.ratio == 0.0);
    assert_true(cfg.zero.offload_optimizer.cpuadam_cores_perc == -1.0); /* not given */
    assert_null(cfg.no_effect);
    zoff_config_free(&cfg);
    /* cpuadam_cores_perc is used (the host optimizer's threads), not reported as without effect */
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'cpuadam_cores_perc': 0.25}}}",
            &cfg);
    assert_true(cfg.zero.offload_optimizer.cpuadam_cores_perc == 0.25);
    assert_null(cfg.no_effect);
    zoff_config_free(&cfg);
    /* a ratio below 1 or auto without an offload device: an error naming the key */
    expect_error("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'ratio': 0.5}}}",
                 "zero_optimization.offload_optimizer.ratio", "0.5", "needs an offload device");
    expect_error("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'ratio': 'auto'}}}",
                 "zero_optimization.offload_optimizer.ratio", "\"auto\"");
    expect_error("{'zero_optimization': {'offload_optimizer': {'device': 'cpu'}}}",
                 "zero_optimization.offload_optimizer.device", "stage is 0");
    expect_error("{'zero_optimization': {'offload_optimizer': {'ratio': -0.1}}}",
                 "zero_optimization.offload_optimizer.ratio", "out of range");
    expect_error("{'zero_optimization': {'offload_optimizer': {'ratio': 1.5}}}",
                 "zero_optimization.offload_optimizer.ratio", "out of range");
    expect_error("{'zero_optimization': {'offload_optimizer': {'ratio': 'half'}}}",
                 "zero_optimization.offload_optimizer.ratio", "\"half\"", "\"auto\"");
    expect_error("{'zero_optimization': {'offload_optimizer': {'ratio': true}}}",
                 "zero_optimization.offload_optimizer.ratio");
}

static void test_integral_reals(void **state) {
    (void)state;
    zoff_config cfg;
    load_ok("{'zero_optimization': {'reduce_bucket_size': 5e8, 'allgather_bucket_size': 2.5e8, "
            "'sub_group_size': 1e9, 'stage': 2.0}, 'train_batch_size': 3.2e1, 'aio': {'block_size': 1048576.0}}",
            &cfg);
    assert_int_equal(cfg.zero.reduce_bucket_size, 500000000);
    assert_int_equal(cfg.zero.allgather_bucket_size, 250000000);
    assert_int_equal(cfg.zero.sub_group_size, 1000000000);
    assert_int_equal(cfg.zero.stage, 2);
    assert_int_equal(cfg.train_batch_size, 32);
    assert_int_equal(cfg.aio.block_size, 1048576);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage3_max_live_parameters': 1e18}}", &cfg);
    assert_int_equal(cfg.zero.stage3_max_live_parameters, 1000000000000000000LL);
    zoff_config_free(&cfg);
    expect_error("{'zero_optimization': {'reduce_bucket_size': 5.5}}", "zero_optimization.reduce_bucket_size",
                 "5.5 is not an integer", "an integer >= 1");
    expect_error("{'zero_optimization': {'reduce_bucket_size': 1e30}}", "zero_optimization.reduce_bucket_size",
                 "not an integer");
    expect_error("{'zero_optimization': {'stage': 2.5}}", "zero_optimization.stage", "2.5");
    /* numbers accept integers */
    load_ok("{'gradient_clipping': 2, 'optimizer': {'type': 'Adam', 'params': {'lr': 1, 'betas': [0, 0]}}}", &cfg);
    assert_true(cfg.gradient_clipping == 2.0 && cfg.optimizer.lr == 1.0 && cfg.optimizer.beta1 == 0.0);
    zoff_config_free(&cfg);
}

static void test_json_syntax_errors(void **state) {
    (void)state;
    /* The trailing comma on line 5 is the mistake; jansson reports where it notices. */
    expect_error("{\n  'zero_optimization': {\n    'stage': 2,\n    'offload_optimizer': {\n      'device': 'cpu',\n"
                 "    }\n  }\n}\n",
                 "test.json:6:", "JSON syntax error: ");
    assert_null(strstr(zoff_last_error(), "line")); /* the position once, as file:line:column */
    expect_error("{'a': 1 'b': 2}", "test.json:1:", "JSON syntax error: ");
    expect_error("", "test.json is empty", "one JSON object");
    expect_error(" \n\t\n", "test.json is empty");
    assert_null(strstr(zoff_last_error(), ":1:0"));
    expect_error("{'train_batch_size': 8, 'train_batch_size': 16}", "duplicate", "train_batch_size");
    expect_error("{'zero_optimization': {'stage': 1} } trailing", "JSON syntax error");
}

/* ------------------------------------------------------------------ cross-key checks */

static void test_cross_key(void **state) {
    (void)state;
    zoff_config cfg;
    expect_error("{'fp16': {'enabled': true}, 'bf16': {'enabled': true}}", "fp16.enabled", "bf16.enabled",
                 "at most one");
    load_ok("{'fp16': {'enabled': false}, 'bf16': {'enabled': true}}", &cfg);
    assert_true(cfg.bf16_enabled);
    zoff_config_free(&cfg);
    expect_error("{'bf16': {'enabled': true}, 'bfloat16': {'enabled': false}}", "bfloat16", "give only \"bf16\"");
    load_ok("{'bf16': {'enabled': true}, 'bfloat16': {'enabled': true}}", &cfg);
    zoff_config_free(&cfg);

    expect_error("{'zero_optimization': {'stage': 3, 'offload_optimizer': {'device': 'nvme'}}}",
                 "zero_optimization.offload_optimizer.nvme_path", "is required when device is \"nvme\"");
    expect_error("{'zero_optimization': {'stage': 3, 'offload_param': {'device': 'nvme'}}}",
                 "zero_optimization.offload_param.nvme_path", "required");
    expect_error("{'zero_optimization': {'stage': 2, 'offload_param': {'device': 'cpu'}}}",
                 "zero_optimization.offload_param.device", "stage 3", "stage is 2");
    expect_error("{'zero_optimization': {'stage': 2, 'cpu_offload': true, 'offload_optimizer': {'device': 'cpu'}}}",
                 "zero_optimization.cpu_offload", "give only offload_optimizer");
    expect_error("{'zero_optimization': {'cpu_offload': false, 'offload_optimizer': {'device': 'cpu'}}}",
                 "zero_optimization.cpu_offload");
    load_ok("{'zero_optimization': {'stage': 2, 'cpu_offload': false}}", &cfg);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_NONE);
    zoff_config_free(&cfg);
    expect_error("{'zero_optimization': {'zoff_delayed_param_update': true}}",
                 "zero_optimization.zoff_delayed_param_update", "offload_optimizer.device");

    expect_error("{'optimizer': {'type': 'AdamW', 'params': {'adam_w_mode': false}}}", "optimizer.params.adam_w_mode",
                 "AdamW");
    load_ok("{'optimizer': {'type': 'Adam', 'params': {'adam_w_mode': false}}}", &cfg);
    assert_false(cfg.optimizer.adam_w_mode);
    zoff_config_free(&cfg);

    expect_error("{'scheduler': {'type': 'WarmupDecayLR', 'params': {'warmup_num_steps': 10}}}",
                 "scheduler.params.total_num_steps", "is required by WarmupDecayLR");
    expect_error("{'scheduler': {'type': 'WarmupCosineLR'}}", "scheduler.params.total_num_steps",
                 "WarmupCosineLR");
    /* DeepSpeed only warns when total_num_steps < warmup_num_steps; so does zoff. */
    zoff_log_level old = zoff_log_get_level();
    zoff_log_set_level(ZOFF_LOG_ERROR);
    load_ok("{'scheduler': {'type': 'WarmupDecayLR', 'params': {'warmup_num_steps': 10, 'total_num_steps': 5}}}",
            &cfg);
    zoff_log_set_level(old);
    zoff_config_free(&cfg);

    /* aliases: the same value twice is fine, different values are an error */
    expect_error("{'aio': {'intra_op_parallelism': 2, 'thread_count': 4}}", "aio.thread_count",
                 "aio.intra_op_parallelism = 2", "give only \"intra_op_parallelism\"");
    load_ok("{'aio': {'intra_op_parallelism': 3, 'thread_count': 3}}", &cfg);
    assert_int_equal(cfg.aio.intra_op_parallelism, 3);
    zoff_config_free(&cfg);
    expect_error("{'zero_optimization': {'stage3_gather_16bit_weights_on_model_save': true, "
                 "'stage3_gather_fp16_weights_on_model_save': false}}",
                 "zero_optimization.stage3_gather_fp16_weights_on_model_save");
    load_ok("{'zero_optimization': {'prefetch_bucket_size': 1e6, 'param_persistence_threshold': 7, "
            "'max_live_parameters': 8, 'max_reuse_distance': 9, 'gather_16bit_weights_on_model_save': true}}",
            &cfg);
    assert_int_equal(cfg.zero.stage3_prefetch_bucket_size, 1000000);
    assert_int_equal(cfg.zero.stage3_param_persistence_threshold, 7);
    assert_int_equal(cfg.zero.stage3_max_live_parameters, 8);
    assert_int_equal(cfg.zero.stage3_max_reuse_distance, 9);
    assert_true(cfg.zero.stage3_gather_16bit_weights_on_model_save);
    zoff_config_free(&cfg);

    /* overlap_comm: DeepSpeed's default depends on the stage */
    load_ok("{'zero_optimization': {'stage': 3}}", &cfg);
    assert_true(cfg.zero.overlap_comm);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 3, 'overlap_comm': false}}", &cfg);
    assert_false(cfg.zero.overlap_comm);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 2}}", &cfg);
    assert_false(cfg.zero.overlap_comm);
    zoff_config_free(&cfg);

    /* null sections mean "not given", as in DeepSpeed */
    load_ok("{'zero_optimization': {'stage': 3, 'offload_param': null, 'offload_optimizer': null}, 'aio': null}",
            &cfg);
    assert_int_equal(cfg.zero.offload_param.device, ZOFF_OFFLOAD_NONE);
    zoff_config_free(&cfg);
    /* and so does null for a key DeepSpeed declares Optional[...] = None (before: "got a JSON null"
     * although the key table allows it): OneCycle's second half as long as the first */
    load_ok("{'scheduler': {'type': 'OneCycle', 'params': {'cycle_min_lr': 0.001, 'cycle_max_lr': 0.01, "
            "'cycle_first_step_size': 5, 'cycle_second_step_size': null}}}",
            &cfg);
    assert_int_equal(cfg.scheduler.cycle_second_step_size, -1);
    zoff_config_free(&cfg);
    /* nvme_path (Optional[Path] = None) and the deprecated cpu_offload (Optional[bool] = None) */
    load_ok("{'zero_optimization': {'stage': 3, 'offload_optimizer': {'device': 'cpu', 'nvme_path': null}, "
            "'offload_param': {'device': 'cpu', 'nvme_path': null}}}",
            &cfg);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_CPU);
    assert_string_equal(cfg.zero.offload_optimizer.nvme_path, "");
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 2, 'cpu_offload': null}}", &cfg);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_NONE);
    zoff_config_free(&cfg);
    /* beside its replacement even a null deprecated key is refused, as DeepSpeed's check of given fields does */
    expect_error("{'zero_optimization': {'stage': 2, 'cpu_offload': null, 'offload_optimizer': {'device': 'cpu'}}}",
                 "zero_optimization.cpu_offload", "given together with zero_optimization.offload_optimizer");
    expect_error("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'nvme', 'nvme_path': null}}}",
                 "zero_optimization.offload_optimizer.nvme_path", "is required");

    expect_error("{'model': {'hidden_size': 100, 'num_attention_heads': 12}}", "model.hidden_size",
                 "not divisible by model.num_attention_heads 12");
    expect_error("{'model': {'seq_length': 2048, 'max_position_embeddings': 1024}}", "model.seq_length", "1024");
}

static void test_optimizer_types(void **state) {
    (void)state;
    zoff_config cfg;
    load_ok("{'optimizer': {'type': 'ADAM'}}", &cfg);
    assert_true(cfg.optimizer_given);
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAM);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'Adagrad', 'params': {'initial_accumulator_value': 0.1, 'weight_decay': 0.01}}}",
            &cfg);
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAGRAD);
    assert_true(cfg.optimizer.lr == 1e-2 && cfg.optimizer.eps == 1e-10); /* Adagrad's own defaults */
    assert_true(cfg.optimizer.initial_accumulator_value == 0.1);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'lion', 'params': {'lr': 1e-4, 'betas': [0.95, 0.98], 'weight_decay': 0.1}}}",
            &cfg);
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_LION);
    assert_true(cfg.optimizer.beta1 == 0.95 && cfg.optimizer.beta2 == 0.98);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'AdamW', 'params': {'torch_adam': true, 'bias_correction': false, "
            "'amsgrad': false}}}",
            &cfg);
    assert_true(cfg.optimizer.torch_adam);
    assert_false(cfg.optimizer.bias_correction);
    assert_true(cfg.optimizer.adam_w_mode);
    /* torch_adam: DeepSpeed builds torch.optim.AdamW(params, **given): its default weight_decay is
     * torch's 1e-2 (FusedAdam's and DeepSpeedCPUAdam's is 0); torch.optim.Adam's is 0 */
    assert_true(cfg.optimizer.weight_decay == 1e-2);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'Adam', 'params': {'torch_adam': true}}}", &cfg); /* adam_w_mode default true */
    assert_true(cfg.optimizer.weight_decay == 1e-2);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'Adam', 'params': {'torch_adam': true, 'adam_w_mode': false}}}", &cfg);
    assert_true(cfg.optimizer.weight_decay == 0.0);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'AdamW', 'params': {'torch_adam': true, 'weight_decay': 0}}}", &cfg);
    assert_true(cfg.optimizer.weight_decay == 0.0);
    zoff_config_free(&cfg);
    load_ok("{'optimizer': {'type': 'AdamW', 'params': {'torch_adam': false}}}", &cfg);
    assert_true(cfg.optimizer.weight_decay == 0.0);
    zoff_config_free(&cfg);
}

/* ------------------------------------------------------------------ not implemented yet */

static void expect_unsupported(const char *text, const char *needle) {
    zoff_config cfg;
    load_ok(text, &cfg);
    zoff_status st = zoff_config_check_supported(&cfg);
    if (st != ZOFF_ERR_UNSUPPORTED) fail_msg("expected ZOFF_ERR_UNSUPPORTED for %s, got %s", text, zoff_status_name(st));
    assert_msg_has(needle);
    assert_msg_has("not implemented yet");
    assert_msg_has("test.json");
    zoff_config_free(&cfg);
}

static void test_check_supported(void **state) {
    (void)state;
    zoff_config cfg;
    load_ok("{'optimizer': {'type': 'AdamW'}, 'zero_optimization': {'stage': 0}, 'fp16': {'enabled': false}}", &cfg);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'ratio': 0.5}}, "
            "'bf16': {'enabled': true}, 'optimizer': {'type': 'Lion'}}", &cfg);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);
    zoff_config_free(&cfg);
    load_ok("{'zero_optimization': {'stage': 3, 'offload_param': {'device': 'cpu'}, "
            "'offload_optimizer': {'device': 'cpu'}}}", &cfg);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK); /* ZeRO-3 with parameter offload to the host */
    zoff_config_free(&cfg);
    expect_unsupported("{'zero_optimization': {'stage': 3, 'zoff_delayed_param_update': true, "
                       "'offload_optimizer': {'device': 'cpu'}}}",
                       "zero_optimization.zoff_delayed_param_update with stage 3");
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'nvme', 'nvme_path': '/tmp'}}}", &cfg);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK); /* NVMe offload, stages 1 and 2: implemented */
    zoff_config_free(&cfg);
    /* everything at once is listed at once */
    load_ok("{'zero_optimization': {'stage': 3, 'offload_param': {'device': 'nvme', 'nvme_path': '/x'}, "
            "'offload_optimizer': {'device': 'nvme', 'nvme_path': '/x'}}}", &cfg);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK); /* ZeRO-Infinity: parameters on NVMe */
    zoff_config_free(&cfg);
    expect_unsupported("{'zero_optimization': {'stage': 3, 'zoff_delayed_param_update': true, "
                       "'offload_optimizer': {'device': 'cpu'}, 'offload_param': {'device': 'nvme', 'nvme_path': '/x'}}, "
                       "'wandb': {'enabled': true}}",
                       "zero_optimization.zoff_delayed_param_update with stage 3; wandb.enabled true");
}

/* ------------------------------------------------------------------ real DeepSpeed files from other tools */

/* Whole items of a ", "-separated list. */
static bool list_has(const char *list, const char *item) {
    if (list == NULL) return false;
    size_t n = strlen(item);
    for (const char *p = strstr(list, item); p != NULL; p = strstr(p + 1, item)) {
        bool starts = p == list || (p >= list + 2 && p[-2] == ',' && p[-1] == ' ');
        bool ends = p[n] == '\0' || p[n] == ',';
        if (starts && ends) return true;
    }
    return false;
}

/* Loads `text` with the log captured: returns what was written to stderr (caller frees). */
static char *load_logged(const char *text, zoff_config *cfg, zoff_status *st) {
    zoff_log_level old = zoff_log_get_level();
    zoff_log_set_level(ZOFF_LOG_INFO);
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_true(saved >= 0 && tmp != NULL);
    assert_true(dup2(fileno(tmp), 2) >= 0);
    *st = load(text, cfg);
    fflush(stderr);
    assert_true(dup2(saved, 2) >= 0);
    close(saved);
    zoff_log_set_level(old);
    long n = ftell(tmp);
    assert_true(n >= 0);
    char *out = calloc((size_t)n + 1, 1);
    assert_non_null(out);
    rewind(tmp);
    assert_int_equal(fread(out, 1, (size_t)n, tmp), (size_t)n);
    fclose(tmp);
    return out;
}

/* The ZeRO-2 offload config of the Hugging Face DeepSpeed integration docs, as the Trainer
 * hands it to DeepSpeed: every "auto" filled in with a number (bf16, lr 5e-5, micro batch 8,
 * accumulation 4, one rank). */
static void test_hf_trainer_file(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_status st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/hf_trainer_zero2.json", &cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_true(cfg.bf16_enabled && !cfg.fp16.enabled);
    assert_int_equal(cfg.fp16.loss_scale_window, 1000);
    assert_int_equal(cfg.optimizer.type, ZOFF_OPTIM_ADAMW);
    assert_true(cfg.optimizer.lr == 5e-05 && cfg.optimizer.eps == 1e-08 && cfg.optimizer.weight_decay == 0.0);
    assert_true(cfg.optimizer.beta1 == 0.9 && cfg.optimizer.beta2 == 0.999);
    assert_int_equal(cfg.scheduler.type, ZOFF_SCHED_WARMUP_DECAY_LR);
    assert_true(cfg.scheduler.warmup_min_lr == 0.0 && cfg.scheduler.warmup_max_lr == 5e-05);
    assert_int_equal(cfg.scheduler.warmup_num_steps, 30);
    assert_int_equal(cfg.scheduler.total_num_steps, 300);
    assert_int_equal(cfg.zero.stage, 2);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_CPU);
    assert_true(cfg.zero.offload_optimizer.pin_memory);
    assert_int_equal(cfg.zero.reduce_bucket_size, 589824);
    assert_int_equal(cfg.zero.allgather_bucket_size, 200000000);
    assert_true(cfg.zero.round_robin_gradients);
    assert_true(cfg.gradient_clipping == 1.0);
    assert_int_equal(cfg.steps_per_print, 2000);
    assert_false(cfg.wall_clock_breakdown);
    assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
    assert_int_equal(cfg.train_batch_size, 32);
    assert_int_equal(cfg.gradient_accumulation_steps, 4);
    /* the keys zoff does not use are named, the rest is honoured */
    assert_string_equal(cfg.no_effect, "zero_optimization.contiguous_gradients, zero_optimization.overlap_comm, "
                                       "zero_optimization.reduce_scatter, zero_optimization.allgather_partitions, "
                                       "zero_optimization.allgather_bucket_size");
    assert_null(cfg.unsupported);
    st = zoff_config_check_supported(&cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    zoff_config_free(&cfg);
    assert_null(cfg.no_effect);
}

/* The same file before the Trainer fills it in: one error naming every "auto". */
static void test_hf_auto(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_status st = zoff_config_load_file(ZOFF_TEST_DIR "/configs/hf_trainer_zero2_auto.json", &cfg);
    assert_int_equal(st, ZOFF_ERR_CONFIG);
    static const char *const named[] = {
        "hf_trainer_zero2_auto.json",
        "\"auto\" at train_batch_size (an integer >= 1)",
        "; train_micro_batch_size_per_gpu (an integer >= 1)",
        "; gradient_accumulation_steps (an integer >= 1)",
        "; optimizer.params.lr (a number >= 0)",
        "; optimizer.params.betas (an array of two numbers, each in [0, 1))",
        "; optimizer.params.eps (",
        "; optimizer.params.weight_decay (",
        "; scheduler.params.warmup_min_lr (",
        "; scheduler.params.warmup_max_lr (",
        "; scheduler.params.warmup_num_steps (an integer >= 1)",
        "; scheduler.params.total_num_steps (",
        "; gradient_clipping (a number >= 0)",
        "; fp16.enabled (true or false)",
        "; bf16.enabled (true or false)",
        "; zero_optimization.reduce_bucket_size (an integer >= 1)",
        "filled in by the Hugging Face Trainer",
        "DeepSpeed does not compute it",
        "give a value for each",
    };
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) assert_msg_has(named[i]);
    assert_null(cfg.source);
    assert_null(cfg.no_effect);

    /* one key; through an alias; an enum; a not-implemented key: all the same error */
    expect_error("{'gradient_clipping': 'auto'}", "test.json: \"auto\" at gradient_clipping (a number >= 0)",
                 "Hugging Face Trainer");
    expect_error("{'aio': {'thread_count': 'auto'}}", "aio.thread_count (an integer >= 1)");
    expect_error("{'scheduler': {'type': 'WarmupLR', 'params': {'warmup_type': 'auto'}}}",
                 "scheduler.params.warmup_type (one of \"log\", \"linear\")");
    expect_error("{'communication_data_type': 'auto'}", "communication_data_type (one of");
    expect_error("{'zero_optimization': {'stage3_max_live_parameters': 'auto'}}",
                 "zero_optimization.stage3_max_live_parameters");
    /* "auto" is a string like any other where the key takes any string */
    zoff_config c;
    load_ok("{'tensorboard': {'enabled': false, 'job_name': 'auto'}}", &c);
    zoff_config_free(&c);
    /* and zoff implements it for the Twin-Flow ratio */
    load_ok("{'zero_optimization': {'stage': 2, 'offload_optimizer': {'device': 'cpu', 'ratio': 'auto'}}}", &c);
    assert_true(c.zero.offload_optimizer.ratio_auto);
    zoff_config_free(&c);
    /* a wrong type elsewhere still wins over the list of "auto"s (walk order) */
    expect_error("{'train_batch_size': 'auto', 'zero_optimization': {'stage': '2'}}", "zero_optimization.stage",
                 "expected an integer");
}

/* ------------------------------------------------------------------ accepted, no effect */

typedef struct key_list {
    const char *paths[512];
    zoff_config_key_class cls[512];
    int n;
} key_list;

static void collect_key(const zoff_config_key *k, void *ctx) {
    key_list *l = ctx;
    assert_true(l->n < 512);
    if (k->alias_of != NULL) return; /* another name: the file uses the canonical one */
    l->paths[l->n] = strdup(k->path);
    l->cls[l->n] = k->cls;
    l->n++;
}

static void free_keys(key_list *l) {
    for (int i = 0; i < l->n; i++) free((char *)l->paths[i]);
}

/* A config with every key zoff accepts without effect (and every not-implemented key at
 * DeepSpeed's default or off): it loads, is supported, each key is named once in the log. */
static void test_no_effect_keys(void **state) {
    (void)state;
    FILE *f = fopen(ZOFF_TEST_DIR "/configs/no_effect_keys.json", "rb");
    assert_non_null(f);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';

    zoff_config cfg;
    zoff_status st;
    char *log = load_logged(text, &cfg, &st);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    st = zoff_config_check_supported(&cfg);
    if (st != ZOFF_OK) fail_msg("%s", zoff_last_error());
    assert_null(cfg.unsupported);
    assert_non_null(cfg.no_effect);
    /* once, at info level, naming the keys */
    if (strstr(log, "test.json: accepted, no effect in zoff (see docs/config.md): managed_gradient_accumulation, "
                    "optimizer.params.fp32_optimizer_states") == NULL)
        fail_msg("log: %s", log);
    const char *second = strstr(log, "accepted, no effect");
    assert_null(strstr(second + 1, "accepted, no effect"));
    free(log);

    key_list keys = {0};
    zoff_config_foreach_key(collect_key, &keys);
    int no_effect = 0, not_impl = 0;
    for (int i = 0; i < keys.n; i++) {
        if (keys.cls[i] == ZOFF_KEY_IMPLEMENTED) {
            assert_false(list_has(cfg.no_effect, keys.paths[i]));
            continue;
        }
        if (!list_has(cfg.no_effect, keys.paths[i]))
            fail_msg("%s (%s) is not in no_effect_keys.json or not reported: %s", keys.paths[i],
                     keys.cls[i] == ZOFF_KEY_NO_EFFECT ? "no effect" : "not implemented", cfg.no_effect);
        if (keys.cls[i] == ZOFF_KEY_NO_EFFECT) no_effect++;
        else not_impl++;
    }
    assert_true(no_effect >= 60 && not_impl >= 30);
    /* the values of the keys zoff does use are unchanged */
    assert_true(cfg.bf16_enabled);
    assert_int_equal(cfg.zero.stage, 2);
    assert_int_equal(cfg.zero.offload_optimizer.device, ZOFF_OFFLOAD_CPU);
    assert_true(cfg.optimizer.lr == 1e-4);
    free_keys(&keys);
    zoff_config_free(&cfg);

    /* nothing to say, nothing logged */
    log = load_logged("{'train_batch_size': 8}", &cfg, &st);
    assert_int_equal(st, ZOFF_OK);
    assert_string_equal(log, "");
    assert_null(cfg.no_effect);
    free(log);
    zoff_config_free(&cfg);
}

/* Accepted keys are still type-checked, and a refused key leaves nothing behind. */
static void test_no_effect_values_checked(void **state) {
    (void)state;
    expect_error("{'zero_allow_untested_optimizer': 1}", "zero_allow_untested_optimizer", "JSON boolean");
    expect_error("{'tensorboard': {'enabled': 'yes'}}", "tensorboard.enabled", "JSON boolean", "\"yes\"");
    expect_error("{'tensorboard': {'enabled': false, 'output_path': 5}}", "tensorboard.output_path",
                 "expected a string");
    expect_error("{'flops_profiler': {'profile_step': 1.5}}", "flops_profiler.profile_step", "1.5 is not an integer");
    expect_error("{'checkpoint': {'tag_validation': 'maybe'}}", "checkpoint.tag_validation", "\"maybe\"",
                 "\"Ignore\", \"Warn\", \"Fail\" (any case)");
    expect_error("{'communication_data_type': 'int8'}", "communication_data_type", "\"fp16\", \"bf16\", \"fp32\"");
    expect_error("{'gradient_allreduce_op': 'max'}", "gradient_allreduce_op", "\"mean\", \"sum\"");
    expect_error("{'zero_optimization': {'offload_optimizer': {'cpuadam_cores_perc': 1.5}}}",
                 "zero_optimization.offload_optimizer.cpuadam_cores_perc", "[0, 1]");
    expect_error("{'elasticity': true}", "elasticity", "expected an object");
    expect_error("{'amp': {'enabled': 'true'}}", "amp.enabled", "JSON boolean");
    expect_error("{'data_types': {'grad_accum_dtype': 'fp64'}}", "data_types.grad_accum_dtype", "\"fp64\"",
                 "\"bf16\"");
    /* a valid key recorded before a later error does not leak or survive (ASan) */
    expect_error("{'memory_breakdown': false, 'tensorboard': {'enabled': true}, 'train_batch_size': 0}",
                 "train_batch_size");
    expect_error("{'memory_breakdown': false, 'zero_optimization': {'stage': 1, 'offload_optimizer': "
                 "{'ratio': 0.5}}}",
                 "zero_optimization.offload_optimizer.ratio"); /* a cross-key error after the walk */

    zoff_config cfg;
    load_ok("{'checkpoint': {'tag_validation': 'warn'}, 'communication_data_type': null, 'amp': null}", &cfg);
    assert_string_equal(cfg.no_effect, "communication_data_type, checkpoint.tag_validation");
    zoff_config_free(&cfg);
    /* the gradient accumulation dtype zoff uses is the training dtype: that value is implemented */
    load_ok("{'bf16': {'enabled': true}, 'data_types': {'grad_accum_dtype': 'bf16'}}", &cfg);
    assert_null(cfg.unsupported);
    assert_null(cfg.no_effect);
    zoff_config_free(&cfg);
    load_ok("{'data_types': {'grad_accum_dtype': 'torch.float32'}}", &cfg);
    assert_null(cfg.unsupported);
    zoff_config_free(&cfg);
}

/* ------------------------------------------------------------------ valid DeepSpeed, not implemented */

static void test_not_implemented_refused(void **state) {
    (void)state;
    static const struct {
        const char *json, *needle;
    } cases[] = {
        {"{'wandb': {'enabled': true, 'project': 'p'}}", "wandb.enabled true (Weights & Biases"},
        {"{'comet': {'enabled': true}}", "comet.enabled true"},
        {"{'trackio': {'enabled': true}}", "trackio.enabled true"},
        {"{'wandb': {'enabled': true}}", "DIR/metrics.jsonl"},
        {"{'comet': {'enabled': true}}", "tensorboard and csv_monitor"},
        {"{'flops_profiler': {'enabled': true, 'profile_step': 5}}", "flops_profiler.enabled true"},
        {"{'comms_logger': {'enabled': true}}", "comms_logger.enabled true"},
        {"{'activation_checkpointing': {'partition_activations': true}}",
         "activation_checkpointing.partition_activations true"},
        {"{'activation_checkpointing': {'partition_activations': true}}", "--checkpoint-activations"},
        {"{'activation_checkpointing': {'cpu_checkpointing': true}}", "activation_checkpointing.cpu_checkpointing"},
        {"{'communication_data_type': 'bf16'}", "communication_data_type \"bf16\" (zoff communicates gradients in fp32"},
        {"{'gradient_allreduce_op': 'sum'}", "gradient_allreduce_op \"sum\""},
        {"{'managed_gradient_accumulation': false}", "managed_gradient_accumulation false"},
        {"{'fp16': {'enabled': true, 'fp16_master_weights_and_grads': true}}", "fp16.fp16_master_weights_and_grads"},
        {"{'bf16': {'enabled': true, 'bf16_master_weights_and_grads': true}}",
         "bf16.bf16_master_weights_and_grads true (16-bit master weights are not implemented: zoff keeps fp32 ones)"},
        {"{'bf16': {'enabled': true}, 'data_types': {'grad_accum_dtype': 'fp32'}}",
         "data_types.grad_accum_dtype \"fp32\" (zoff accumulates gradients in the training dtype, here bf16)"},
        {"{'zero_optimization': {'stage': 2, 'zero_quantized_gradients': true}}",
         "zero_optimization.zero_quantized_gradients true"},
        {"{'zero_optimization': {'zero_hpz_partition_size': 8}}", "zero_optimization.zero_hpz_partition_size 8"},
        {"{'zero_optimization': {'mics_shard_size': 8}}", "zero_optimization.mics_shard_size 8 (MiCS"},
        {"{'zero_optimization': {'load_from_fp32_weights': false}}", "zero_optimization.load_from_fp32_weights"},
        {"{'zero_optimization': {'cpu_offload_param': true}}", "zero_optimization.cpu_offload_param true"},
        {"{'zero_optimization': {'zenflow': {'topk_ratio': 0.1}}}", "zero_optimization.zenflow {\"topk_ratio\""},
        {"{'aio': {'use_gds': true}}", "aio.use_gds true (GPUDirect Storage"},
        {"{'checkpoint': {'load_universal': true}}", "checkpoint.load_universal true"},
        {"{'amp': {'enabled': true, 'opt_level': 'O1'}}", "amp.enabled true (NVIDIA Apex AMP is not implemented"},
        {"{'torch_autocast': {'enabled': true}}", "torch_autocast.enabled true"},
        {"{'elasticity': {'enabled': true, 'max_train_batch_size': 2000}}", "elasticity.enabled true"},
        {"{'autotuning': {'enabled': true}}", "autotuning.enabled true"},
        {"{'compile': {'deepcompile': true}}", "compile.deepcompile true"},
        {"{'pipeline': {'stages': 2}}", "pipeline {\"stages\":2} (pipeline parallelism is not implemented"},
        {"{'sparse_attention': {'mode': 'fixed'}}", "sparse_attention {\"mode\":\"fixed\"}"},
        {"{'tensor_parallel': {'autotp_size': 2}}", "tensor_parallel"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) expect_unsupported(cases[i].json, cases[i].needle);
    /* the engine's own refusals and the config's come in one list, and only the former add the stage summary */
    expect_unsupported("{'zero_optimization': {'stage': 3, 'zoff_delayed_param_update': true, "
                       "'offload_optimizer': {'device': 'cpu'}}, 'wandb': {'enabled': true}, 'amp': {'enabled': true}}",
                       "zero_optimization.zoff_delayed_param_update with stage 3; wandb.enabled true");
    assert_msg_has("; amp.enabled true");
    assert_msg_has("this version trains with zero_optimization.stage 0-3");
    expect_unsupported("{'wandb': {'enabled': true}}", "wandb.enabled true");
    if (strstr(zoff_last_error(), "this version trains with") != NULL) fail_msg("%s", zoff_last_error());

    /* off, or at DeepSpeed's default: accepted */
    static const char *const ok[] = {
        "{'wandb': {'enabled': false, 'project': 'p'}}",
        "{'tensorboard': {'enabled': true, 'output_path': '', 'job_name': 'j'}}", /* implemented (cli_monitor.sh) */
        "{'csv_monitor': {'enabled': true}}",
        "{'flops_profiler': {'enabled': false, 'profile_step': 5, 'output_file': null}}",
        "{'activation_checkpointing': {'partition_activations': false, 'cpu_checkpointing': false, "
        "'number_checkpoints': 4}}",
        "{'amp': {'enabled': false, 'opt_level': 'O2'}}",
        "{'elasticity': {'max_train_batch_size': 2000}}", /* no switch: DeepSpeed's default, off */
        "{'pipeline': {}, 'sparse_attention': null}",
        "{'zero_optimization': {'zero_hpz_partition_size': 1.0, 'mics_shard_size': -1}}",
        "{'gradient_allreduce_op': 'mean', 'communication_data_type': null, 'managed_gradient_accumulation': true}",
        /* zoff's gradient collectives run in fp32 (16-bit gradients widened, comm.h): that value is implemented */
        "{'bf16': {'enabled': true}, 'communication_data_type': 'fp32'}",
        "{'fp16': {'enabled': true}, 'communication_data_type': 'FP32'}",
        "{'fp16': {'enabled': true}, 'data_types': {'grad_accum_dtype': 'half'}}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        zoff_config cfg;
        load_ok(ok[i], &cfg);
        if (cfg.unsupported != NULL || zoff_config_check_supported(&cfg) != ZOFF_OK)
            fail_msg("%s: %s", ok[i], zoff_last_error());
        zoff_config_free(&cfg);
    }
}

/* ------------------------------------------------------------------ docs/config.md lists every key */

typedef struct doc_row {
    char key[160];
    int cls; /* the section it is listed in: 0 implemented, 1 no effect, 2 not implemented, 3 unknown */
} doc_row;

typedef struct doc_check {
    doc_row rows[512];
    int n;
    int missing;
} doc_check;

static void check_documented(const zoff_config_key *k, void *ctx) {
    doc_check *d = ctx;
    for (int i = 0; i < d->n; i++) {
        if (strcmp(d->rows[i].key, k->path) != 0) continue;
        if (d->rows[i].cls != (int)k->cls) {
            print_message("docs/config.md lists %s in the wrong section (%d, the tables say %d)\n", k->path,
                          d->rows[i].cls, (int)k->cls);
            d->missing++;
        }
        d->rows[i].cls = -1; /* seen */
        return;
    }
    print_message("docs/config.md does not list %s\n", k->path);
    d->missing++;
}

static void test_docs_list_every_key(void **state) {
    (void)state;
    FILE *f = fopen(ZOFF_TEST_DIR "/../docs/config.md", "r");
    assert_non_null(f);
    static doc_check d;
    memset(&d, 0, sizeof d);
    char line[4096];
    int cls = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "## ", 3) == 0) {
            cls = strncmp(line, "## Implemented", 14) == 0                   ? 0
                  : strncmp(line, "## Accepted, no effect", 22) == 0         ? 1
                  : strncmp(line, "## Valid DeepSpeed, not implemented", 35) == 0 ? 2
                  : strncmp(line, "## Unknown", 10) == 0                     ? 3
                                                                               : -1;
            continue;
        }
        if (cls < 0 || strncmp(line, "| `", 3) != 0) continue;
        const char *end = strchr(line + 3, '`');
        assert_non_null(end);
        assert_true(d.n < 512);
        snprintf(d.rows[d.n].key, sizeof d.rows[d.n].key, "%.*s", (int)(end - line - 3), line + 3);
        d.rows[d.n].cls = cls;
        d.n++;
    }
    fclose(f);
    assert_true(d.n > 100);
    zoff_config_foreach_key(check_documented, &d);
    /* and every documented key is one zoff accepts (except the unknown-key examples) */
    for (int i = 0; i < d.n; i++) {
        if (d.rows[i].cls == -1 || d.rows[i].cls == 3) continue;
        print_message("docs/config.md lists %s, which zoff does not accept\n", d.rows[i].key);
        d.missing++;
    }
    /* the unknown-key examples really are unknown */
    for (int i = 0; i < d.n; i++) {
        if (d.rows[i].cls != 3) continue;
        char json[400];
        const char *dot = strrchr(d.rows[i].key, '.');
        if (dot == NULL) snprintf(json, sizeof json, "{\"%s\": 1}", d.rows[i].key);
        else snprintf(json, sizeof json, "{\"%.*s\": {\"%s\": 1}}", (int)(dot - d.rows[i].key), d.rows[i].key, dot + 1);
        zoff_config cfg;
        zoff_status st = zoff_config_load_string(json, "docs", &cfg);
        if (st != ZOFF_ERR_CONFIG || strstr(zoff_last_error(), "unknown key") == NULL) {
            print_message("docs/config.md: %s is listed as unknown but %s\n", d.rows[i].key,
                          st == ZOFF_OK ? "loads" : zoff_last_error());
            d.missing++;
        }
        zoff_config_free(&cfg);
    }
    assert_int_equal(d.missing, 0);
}

/* Every key that is not implemented says why (no effect) or what to do (not implemented). */
static void check_note(const zoff_config_key *k, void *ctx) {
    int *bad = ctx;
    if (k->cls != ZOFF_KEY_IMPLEMENTED && k->alias_of == NULL && (k->note == NULL || strlen(k->note) < 10)) {
        print_message("%s has no reason / hint\n", k->path);
        (*bad)++;
    }
}

static void test_keys_have_reasons(void **state) {
    (void)state;
    int bad = 0;
    zoff_config_foreach_key(check_note, &bad);
    assert_int_equal(bad, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_zero_offload_file),
        cmocka_unit_test(test_zero_infinity_file),
        cmocka_unit_test(test_legacy_keys_file),
        cmocka_unit_test(test_stage0_file_supported),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_batch_relation),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_ratio_auto),
        cmocka_unit_test(test_integral_reals),
        cmocka_unit_test(test_json_syntax_errors),
        cmocka_unit_test(test_cross_key),
        cmocka_unit_test(test_optimizer_types),
        cmocka_unit_test(test_check_supported),
        cmocka_unit_test(test_hf_trainer_file),
        cmocka_unit_test(test_hf_auto),
        cmocka_unit_test(test_no_effect_keys),
        cmocka_unit_test(test_no_effect_values_checked),
        cmocka_unit_test(test_not_implemented_refused),
        cmocka_unit_test(test_docs_list_every_key),
        cmocka_unit_test(test_keys_have_reasons),
    };
    /* keep the output to failures: tests that look at the log raise the level themselves */
    zoff_log_set_level(ZOFF_LOG_WARN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
