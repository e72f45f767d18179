/* zoff plan (src/plan) against reality: for many shapes, dtypes and settings
 * the predicted per-rank bytes are compared with what the model, the engine and
 * the training loop really allocate on the CPU backend:
 *   device  zoff_device_memory_stats().device_peak
 *   pinned  zoff_device_memory_stats().pinned_peak
 *   pageable  the process heap's growth (mallinfo2, or the sanitizer's
 *           allocator under ASan/TSan) minus the device and pinned bytes (the CPU
 *           backend's device and pinned memory are heap memory too)
 *   disk    the size of the NVMe swap file(s) the engine creates (when this
 *           zoff runs nvme offload)
 * The model and engine are created as zoff train does (src/train: model, engine
 * with the random initial weights generated straight into it, token buffers);
 * the buffer a checkpoint save allocates (src/train/ckpt_save.c: one piece, or
 * one whole array when the state is in a swap file) is allocated too, at the same
 * size.
 * Device, pinned and disk bytes must match exactly (the plan re-derives each
 * allocation); pageable bytes, measured on the heap among other small
 * allocations, within 10% (the bar). The worst errors are printed. The grid test goes through the written config (zoff_plan_config_json
 * -> zoff_config_load_string), so the recommendation is checked as written. */
#define _GNU_SOURCE
#include <dirent.h>
#include <malloc.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "zoff/config.h"
#include "zoff/engine.h"
#include "zoff/model.h"
#include "zoff/plan.h"
#include "zoff/train.h"
#include "zero/partition.h" /* the engine's data-parallel partition plan (private to src/zero) */

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
/* <sanitizer/allocator_interface.h> is not installed everywhere: the one call we use */
size_t __sanitizer_get_current_allocated_bytes(void);
static size_t heap_in_use(void) { return __sanitizer_get_current_allocated_bytes(); }
#else
static size_t heap_in_use(void) {
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}
#endif

#define TOL 0.10

static int run_cmd(const char *cmd);
static void write_text(const char *path, const char *text);

typedef struct shape_case {
    const char *name;
    zoff_gpt2_shape shape;
    int64_t B, T;
} shape_case;

static const shape_case SHAPES[] = {
    {"tiny", {.num_layers = 2, .hidden_size = 64, .num_heads = 2, .max_seq_len = 32, .vocab_size = 1000}, 4, 32},
    {"default", {.num_layers = 4, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64, .vocab_size = 50257}, 8, 64},
    {"odd", {.num_layers = 3, .hidden_size = 96, .num_heads = 3, .max_seq_len = 64, .vocab_size = 5001}, 3, 48},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))

static const char *prec_json(zoff_dtype dt) {
    return dt == ZOFF_BF16 ? "\"bf16\": {\"enabled\": true}," : dt == ZOFF_F16 ? "\"fp16\": {\"enabled\": true}," : "";
}

/* What zoff really allocated for one configuration. */
typedef struct reality {
    zoff_status status;
    size_t device, pinned, pageable, disk;
    size_t snapshot, snapshot_copy; /* zoff_engine_snapshot_bytes, _min_bytes */
    double host_ratio;
} reality;

static size_t dir_bytes(const char *dir) {
    size_t total = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *de;
    char p[4400];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) total += (size_t)st.st_size;
    }
    closedir(d);
    /* the swap files have no name (unlinked at creation, ZOFF_AIO_TEMPORARY): the files this
     * process holds open whose former name is in dir, through /proc/self/fd */
    char target[4400];
    size_t dl = strlen(dir);
    if (!(d = opendir("/proc/self/fd"))) return total;
    while ((de = readdir(d))) {
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        ssize_t l = readlink(p, target, sizeof target - 1);
        if (l <= 0) continue;
        target[l] = '\0';
        struct stat st;
        if (!strncmp(target, dir, dl) && target[dl] == '/' && strstr(target, " (deleted)") && stat(p, &st) == 0 &&
            S_ISREG(st.st_mode))
            total += (size_t)st.st_size;
    }
    closedir(d);
    return total;
}

static zoff_status init_range_7(void *arg, int64_t lo, int64_t hi, float *dst) {
    zoff_gpt2_init_params_range(arg, 7, lo, hi, dst);
    return ZOFF_OK;
}

/* Create device (budget 0 = none), model, engine (initial weights straight into it) and
 * token buffers like zoff train, plus the checkpoint save's buffer; measure. */
static void measure_real(const zoff_config *cfg, const zoff_gpt2_options *mo, size_t budget, const char *nvme_dir,
                         reality *r) {
    memset(r, 0, sizeof *r);
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .memory_budget = budget, .threads = 1};
    assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    size_t heap0 = heap_in_use();
    zoff_gpt2 *m = NULL;
    zoff_engine *e = NULL;
    float *ckpt = NULL;
    int32_t *dx = NULL, *dy = NULL, *hx = NULL, *hy = NULL;
    /* as zoff train (src/train/stack.c): the engine's gradient buckets where the rule allows them */
    zoff_gpt2_options mob = *mo;
    mob.external_grads = zoff_placement_grad_buckets(cfg);
    zoff_status s = zoff_gpt2_create(dev, &mob, &m);
    if (s == ZOFF_OK) {
        int64_t n = zoff_gpt2_num_params(m);
        int nt;
        const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
        zoff_engine_options eo = {.dev = dev, .cfg = cfg, .tensors = ti, .num_tensors = nt, .num_params = n,
                                  .params = zoff_gpt2_params(m), .grads = zoff_gpt2_grads(m), .dtype = mo->dtype,
                                  .init_range = init_range_7, .init_arg = m,
                                  .weight_waits = cfg->zero.offload_optimizer.super_offload}; /* as zoff train */
        s = zoff_engine_create(&eo, &e);
        if (s == ZOFF_OK && zoff_engine_uses_grad_rows(e)) s = zoff_gpt2_set_grad_rows(m, zoff_engine_grad_rows, e);
        if (s == ZOFF_OK && zoff_engine_uses_grad_buckets(e)) {
            zoff_grad_hooks gh = {.arg = e, .acquire = zoff_engine_grad_acquire, .release = zoff_engine_grad_release};
            s = zoff_gpt2_set_grad_hooks(m, &gh);
        }
        if (s == ZOFF_OK) {
            zoff_engine_memory em;
            zoff_engine_memory_usage(e, &em);
            r->host_ratio = em.host_ratio;
            r->snapshot = zoff_engine_snapshot_bytes(e);
            r->snapshot_copy = zoff_engine_snapshot_min_bytes(e);
            size_t tb = (size_t)(mo->batch_size * mo->seq_len) * sizeof(int32_t);
            hx = malloc(tb);
            hy = malloc(tb);
            s = zoff_device_alloc(dev, tb, "input tokens", (void **)&dx);
            if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "target tokens", (void **)&dy);
            ckpt = zoff_aligned_alloc(64, zoff_train_ckpt_save_bytes(), "checkpoint piece buffer");
            assert_non_null(ckpt);
        }
    }
    size_t heap1 = heap_in_use();
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    r->status = s;
    r->device = ms.device_peak;
    r->pinned = ms.pinned_peak;
    size_t grown = heap1 > heap0 ? heap1 - heap0 : 0;
    r->pageable = grown > ms.device_in_use + ms.pinned_in_use ? grown - ms.device_in_use - ms.pinned_in_use : 0;
    if (nvme_dir) r->disk = dir_bytes(nvme_dir);
    zoff_aligned_free(ckpt);
    free(hx);
    free(hy);
    if (dx) zoff_device_free(dev, dx);
    if (dy) zoff_device_free(dev, dy);
    zoff_engine_destroy(e);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    if (s != ZOFF_OK) zoff_clear_error();
}

static void machine_for(zoff_plan_machine *M, size_t budget) {
    zoff_plan_machine_defaults(M, ZOFF_BACKEND_CPU);
    M->device_bytes = budget;
    M->device_budget = budget > 0;
    M->margin = 0.0;
}

/* The plan's row for the config's own setting on a machine with that device budget (0: none). */
static void config_row(const zoff_config *cfg, zoff_gpt2_options mo, size_t budget, zoff_plan_row *row) {
    zoff_plan_inputs in = {.cfg = cfg, .model = mo};
    machine_for(&in.machine, budget);
    zoff_plan_setting s;
    zoff_plan_setting_from_config(cfg, &s);
    assert_int_equal(zoff_plan_evaluate(&in, &s, row), ZOFF_OK);
}

/* |predicted - real| <= TOL * real; returns the relative error. */
static double check_close(const char *what, const char *label, size_t pred, size_t real) {
    double err = real ? fabs((double)pred - (double)real) / (double)real : (pred ? 1.0 : 0.0);
    if (err > TOL || (real == 0 && pred > 4096))
        fail_msg("%s: %s predicted %zu bytes, real %zu (error %.2f%%)", label, what, pred, real, 100 * err);
    return err;
}

static double g_max_err[4]; /* device, pinned, pageable, disk: worst relative error seen */
static int g_checked;

/* Device, pinned and disk bytes are re-derived allocation by allocation, so
 * they must match to the byte: a difference means src/plan/plan.c no longer
 * mirrors the model, the engine or the training loop (update it with them).
 * Pageable bytes are measured on the heap, with other small allocations: 10%. */
static void exact(const char *what, const char *label, size_t pred, size_t real) {
    if (pred != real)
        fail_msg("%s: %s predicted %zu bytes, real %zu (%+lld): src/plan/plan.c is out of step with the allocation",
                 label, what, pred, real, (long long)pred - (long long)real);
}

static void compare(const char *label, const zoff_plan_row *row, const reality *r, bool check_disk) {
    exact("device", label, row->mem.device, r->device);
    exact("pinned", label, row->mem.pinned, r->pinned);
    if (check_disk) exact("disk", label, row->mem.disk, r->disk);
    exact("snapshot", label, row->mem.snapshot, r->snapshot);
    exact("snapshot's device copy", label, row->mem.snapshot_copy, r->snapshot_copy);
    double e0 = check_close("device", label, row->mem.device, r->device);
    double e1 = check_close("pinned", label, row->mem.pinned, r->pinned);
    double e2 = check_close("pageable", label, row->mem.pageable, r->pageable);
    double e3 = check_disk ? check_close("disk", label, row->mem.disk, r->disk) : 0.0;
    double e[4] = {e0, e1, e2, e3};
    if (e0 > 1e-9 || e1 > 1e-9 || e2 > 0.02 || e3 > 1e-9)
        printf("  %s: errors device %.4f%% pinned %.4f%% pageable %.4f%% disk %.4f%%\n", label, 100 * e0, 100 * e1,
               100 * e2, 100 * e3);
    for (int i = 0; i < 4; i++)
        if (e[i] > g_max_err[i]) g_max_err[i] = e[i];
    g_checked++;
}

static void load_cfg(const char *json, zoff_config *cfg) {
    zoff_status s = zoff_config_load_string(json, "test config", cfg);
    if (s != ZOFF_OK) fail_msg("config %s: %s", json, zoff_last_error());
    assert_int_equal(zoff_config_resolve_batch(cfg, 1), ZOFF_OK);
}

/* ------------------------------------------------------------------ the model's bytes */

/* zoff_plan_model_bytes_get vs zoff_gpt2_create + zoff_gpt2_device_bytes and the
 * pinned loss buffer, exactly, for shapes, dtypes and checkpointing. */
static void test_model_bytes_exact(void **st) {
    (void)st;
    for (int si = 0; si < NSHAPES; si++)
        for (int d = 0; d < 3; d++)
            for (int ck = 0; ck < 2; ck++) {
                zoff_dtype dt = d == 0 ? ZOFF_F32 : d == 1 ? ZOFF_BF16 : ZOFF_F16;
                zoff_gpt2_options mo = {.shape = SHAPES[si].shape, .batch_size = SHAPES[si].B,
                                        .seq_len = SHAPES[si].T, .dtype = dt, .checkpoint_activations = ck};
                zoff_plan_model_bytes mb;
                assert_int_equal(zoff_plan_model_bytes_get(&mo, &mb), ZOFF_OK);
                zoff_device *dev = NULL;
                zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
                assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
                zoff_gpt2 *m = NULL;
                assert_int_equal(zoff_gpt2_create(dev, &mo, &m), ZOFF_OK);
                zoff_memory_stats ms;
                zoff_device_memory_stats(dev, &ms);
                assert_int_equal(mb.num_params, zoff_gpt2_num_params(m));
                assert_int_equal(mb.padded_vocab_size, zoff_gpt2_get_shape(m)->padded_vocab_size);
                assert_int_equal(mb.params + mb.grads + mb.activations, zoff_gpt2_device_bytes(m));
                assert_int_equal(mb.params + mb.grads + mb.activations, ms.device_in_use);
                assert_int_equal(mb.host_losses, ms.pinned_in_use);
                zoff_gpt2_destroy(m);
                zoff_device_destroy(dev);
            }
    /* invalid shapes are refused with the field named */
    zoff_gpt2_options bad = {.shape = SHAPES[0].shape, .batch_size = 1, .seq_len = 64, .dtype = ZOFF_F32};
    zoff_plan_model_bytes mb;
    assert_int_equal(zoff_plan_model_bytes_get(&bad, &mb), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "seq_length"));
    bad.seq_len = 8;
    bad.shape.num_heads = 3;
    assert_int_equal(zoff_plan_model_bytes_get(&bad, &mb), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "num_attention_heads"));
}

/* ------------------------------------------------------------------ settings from configs */

/* shapes x dtypes x {stage 0, stage 2 none, stage 2 cpu ratio 0 / 0.5 / 1} x
 * checkpointing on/off, with pin_memory alternating and a sub_group_size that
 * makes ratio 0.5 a real split. */
static void test_configs_vs_real(void **st) {
    (void)st;
    static const char *zeros[] = {
        "{\"stage\": 0}",
        "{\"stage\": 2}",
        "{\"stage\": 2, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0, \"pin_memory\": %s}}",
        "{\"stage\": 2, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5, \"pin_memory\": %s}}",
        "{\"stage\": 2, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": %s}}",
        /* speculation: its rollback copy (12 B/param, pageable) and the model's host tokens (pinned) */
        "{\"stage\": 2, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": %s, "
        "\"super_offload\": true}}",
        /* gradient buckets: a ring of 2 (the first group's own bucket at ratio 1), and the full buffer */
        "{\"stage\": 2, \"reduce_bucket_size\": 1, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": "
        "\"cpu\", \"pin_memory\": %s}}",
        "{\"stage\": 1, \"reduce_bucket_size\": 1, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": "
        "\"cpu\", \"ratio\": 0.5, \"pin_memory\": %s}}",
        "{\"stage\": 2, \"zoff_grad_buckets\": false, \"sub_group_size\": %lld, \"offload_optimizer\": {\"device\": "
        "\"cpu\", \"ratio\": 0.5, \"pin_memory\": %s}}",
    };
    int k = 0;
    for (int si = 0; si < NSHAPES; si++)
        for (int d = 0; d < 3; d++)
            for (int z = 0; z < (int)(sizeof zeros / sizeof *zeros); z++)
                for (int ck = 0; ck < 2; ck++, k++) {
                    zoff_dtype dt = d == 0 ? ZOFF_F32 : d == 1 ? ZOFF_BF16 : ZOFF_F16;
                    zoff_gpt2_options mo = {.shape = SHAPES[si].shape, .batch_size = SHAPES[si].B,
                                            .seq_len = SHAPES[si].T, .dtype = dt, .checkpoint_activations = ck};
                    zoff_plan_model_bytes mb;
                    assert_int_equal(zoff_plan_model_bytes_get(&mo, &mb), ZOFF_OK);
                    char zero[512], json[1024], label[1024];
                    snprintf(zero, sizeof zero, zeros[z], (long long)(mb.num_params / 7 + 1), k % 2 ? "true" : "false");
                    snprintf(json, sizeof json,
                             "{\"train_micro_batch_size_per_gpu\": %lld, %s \"optimizer\": {\"type\": \"AdamW\"}, "
                             "\"zero_optimization\": %s}",
                             (long long)SHAPES[si].B, prec_json(dt), zero);
                    snprintf(label, sizeof label, "%s %s ckpt=%d %s", SHAPES[si].name, zoff_dtype_name(dt), ck, zero);
                    zoff_config cfg;
                    load_cfg(json, &cfg);
                    zoff_plan_row row;
                    config_row(&cfg, mo, 0, &row);
                    assert_true(row.runnable);
                    reality r;
                    measure_real(&cfg, &mo, 0, NULL, &r);
                    if (r.status != ZOFF_OK) fail_msg("%s: %s", label, zoff_last_error());
                    if (fabs(r.host_ratio - row.host_ratio) > 1e-12)
                        fail_msg("%s: host ratio predicted %.6f, engine %.6f", label, row.host_ratio, r.host_ratio);
                    compare(label, &row, &r, false);
                    zoff_config_free(&cfg);
                }
}

/* The delayed update (second gradient partition), Lion and Adagrad (fewer
 * state arrays), legacy cpu_offload, accumulation, fine sub-groups. */
static void test_variants_vs_real(void **st) {
    (void)st;
    static const char *cases[] = {
        "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2, "
        "\"zoff_delayed_param_update\": true, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
        "{\"train_micro_batch_size_per_gpu\": 4, \"fp16\": {\"enabled\": true}, \"optimizer\": {\"type\": \"Lion\"}, "
        "\"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": false}}}",
        "{\"train_micro_batch_size_per_gpu\": 4, \"optimizer\": {\"type\": \"Adagrad\"}, "
        "\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}",
        "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
        "\"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 1000, \"offload_optimizer\": {\"device\": \"cpu\", "
        "\"ratio\": 0.3}}}",
        /* bf16 optimizer states: m and v of 2 bytes (10 B/param), Twin-Flow's device part fp32, the
         * speculation copy of master 4 + m 2 + v 2, the delayed update's second buffer */
        "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}, "
        "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}",
        "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}, "
        "\"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 1000, \"offload_optimizer\": {\"device\": \"cpu\", "
        "\"ratio\": 0.4}}}",
        "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}, "
        "\"optimizer\": {\"type\": \"Lion\"}, \"zero_optimization\": {\"stage\": 1, \"zoff_delayed_param_update\": "
        "true, \"offload_optimizer\": {\"device\": \"cpu\"}}}",
        "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}, "
        "\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": true}}}",
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        zoff_config cfg;
        load_cfg(cases[c], &cfg);
        zoff_dtype dt = cfg.bf16_enabled ? ZOFF_BF16 : cfg.fp16.enabled ? ZOFF_F16 : ZOFF_F32;
        zoff_gpt2_options mo = {.shape = SHAPES[2].shape, .batch_size = cfg.train_micro_batch_size_per_gpu,
                                .seq_len = 48, .dtype = dt, .checkpoint_activations = c % 2};
        zoff_plan_row row;
        config_row(&cfg, mo, 0, &row);
        reality r;
        measure_real(&cfg, &mo, 0, NULL, &r);
        if (r.status != ZOFF_OK) fail_msg("case %zu: %s", c, zoff_last_error());
        assert_true(fabs(r.host_ratio - row.host_ratio) < 1e-12);
        compare(cases[c], &row, &r, false);
        if (cfg.bf16_optimizer_states) { /* host state: master 4 + (m, v) x 2 bytes per host parameter */
            int arrays = 1 + (cfg.optimizer.type != ZOFF_OPTIM_LION) + (cfg.optimizer.type != ZOFF_OPTIM_ADAGRAD);
            assert_int_equal(row.mem.host_optimizer, (size_t)row.host_params * (size_t)(4 + 2 * (arrays - 1)));
        }
        zoff_config_free(&cfg);
    }
}

/* ------------------------------------------------------------------ the grid, through the written config */

static void make_tmpdir(char *buf, size_t n) {
    snprintf(buf, n, "/tmp/zoff-plan-XXXXXX");
    assert_non_null(mkdtemp(buf));
}

static void clear_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *de;
    char p[4400];
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        unlink(p);
    }
    closedir(d);
}

/* Every runnable row of the grid under a device budget: the written config
 * loads; the engine makes the same placement (auto included); a row predicted
 * to fit the device is created, one predicted not to fit fails with
 * ZOFF_ERR_DEVICE_OOM; created rows match the predicted bytes. */
static void grid_vs_real(const char *json, const zoff_gpt2_options *mo, size_t budget) {
    zoff_config base;
    load_cfg(json, &base);
    zoff_plan_inputs in = {.cfg = &base, .model = *mo};
    machine_for(&in.machine, budget);
    zoff_plan plan;
    assert_int_equal(zoff_plan_build(&in, NULL, 0, &plan), ZOFF_OK);
    assert_true(plan.nrows >= 1 + 3 * 13);
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    int created = 0, refused = 0, skipped = 0;
    for (int i = 0; i < plan.nrows; i++) {
        const zoff_plan_row *row = &plan.rows[i];
        char *txt = NULL;
        assert_int_equal(zoff_plan_config_json(&base, row, dir, false, &txt), ZOFF_OK);
        zoff_config cfg;
        zoff_status ls = zoff_config_load_string(txt, "written config", &cfg);
        if (ls != ZOFF_OK) fail_msg("row %d: the written config does not load: %s\n%s", i, zoff_last_error(), txt);
        assert_int_equal(zoff_config_resolve_batch(&cfg, 1), ZOFF_OK);
        zoff_plan_setting again;
        zoff_plan_setting_from_config(&cfg, &again);
        /* the written config describes the row (auto is written as its resolved ratio) */
        assert_int_equal(again.stage, row->setting.stage);
        assert_int_equal(again.offload, row->setting.offload);
        assert_int_equal(again.param_offload, row->setting.param_offload);
        assert_int_equal(again.sub_group_size, row->setting.sub_group_size);
        if (row->setting.offload != ZOFF_OFFLOAD_NONE) assert_int_equal(again.pin_memory, row->setting.pin_memory);
        if (row->setting.param_offload == ZOFF_OFFLOAD_NVME)
            assert_int_equal(again.param_pin_memory, row->setting.param_pin_memory);
        bool supported = zoff_config_check_supported(&cfg) == ZOFF_OK;
        zoff_clear_error();
        /* stage 3 reaches its peak only after steps have gathered and pooled the
         * parameter groups: test_stage3_vs_real compares stage 3 after real steps */
        if (!row->runnable || !supported || row->setting.stage == 3) {
            assert_false(row->runnable && !supported); /* runnable implies supported */
            skipped++;
            zoff_config_free(&cfg);
            free(txt);
            continue;
        }
        char label[600];
        snprintf(label, sizeof label, "grid row %d (stage %d, %s, ratio %s%g, pin %d)", i, row->setting.stage,
                 zoff_plan_offload_name(row->setting.offload), row->setting.ratio_auto ? "auto=" : "",
                 row->setting.ratio_auto ? row->host_ratio : row->setting.ratio, row->setting.pin_memory);
        clear_dir(dir);
        reality r;
        /* the same setting as given (auto stays auto): the engine decides */
        zoff_config *run_cfg = &cfg;
        zoff_config cfg_auto;
        if (row->setting.ratio_auto) {
            load_cfg(txt, &cfg_auto);
            cfg_auto.zero.offload_optimizer.ratio_auto = true;
            run_cfg = &cfg_auto;
        }
        measure_real(run_cfg, mo, budget, dir, &r);
        bool fits_dev = row->fits_device && !row->auto_failed;
        if (fits_dev) {
            if (r.status != ZOFF_OK) fail_msg("%s: predicted to fit the device but: %s", label, zoff_last_error());
            if (fabs(r.host_ratio - row->host_ratio) > 1e-12)
                fail_msg("%s: host ratio predicted %.6f, engine %.6f", label, row->host_ratio, r.host_ratio);
            compare(label, row, &r, row->setting.offload == ZOFF_OFFLOAD_NVME);
            created++;
        } else {
            if (r.status != ZOFF_ERR_DEVICE_OOM)
                fail_msg("%s: predicted not to fit (device %zu > budget %zu) but creation returned %s", label,
                         row->mem.device, budget, zoff_status_name(r.status));
            refused++;
        }
        if (run_cfg == &cfg_auto) zoff_config_free(&cfg_auto);
        zoff_config_free(&cfg);
        free(txt);
    }
    clear_dir(dir);
    rmdir(dir);
    printf("grid (budget %zu): %d rows created and matched, %d refused as predicted, %d not runnable here\n", budget,
           created, refused, skipped);
    assert_true(created > 10);
    zoff_plan_free(&plan);
    zoff_config_free(&base);
}

static void test_grid_vs_real(void **st) {
    (void)st;
    zoff_gpt2_options mo = {.shape = SHAPES[1].shape, .batch_size = 4, .seq_len = 64, .dtype = ZOFF_BF16};
    zoff_plan_model_bytes mb;
    assert_int_equal(zoff_plan_model_bytes_get(&mo, &mb), ZOFF_OK);
    const char *json = "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}, "
                       "\"optimizer\": {\"type\": \"AdamW\"}, \"zero_optimization\": {\"stage\": 2}}";
    /* a budget between "model + all optimizer state on the host" and "everything on the device" */
    size_t model_dev = mb.params + mb.grads + mb.activations;
    size_t budget = model_dev + (size_t)mb.num_params * 6;
    grid_vs_real(json, &mo, budget);
    /* fp32 weights with checkpointing, no budget */
    zoff_gpt2_options mo2 = {.shape = SHAPES[2].shape, .batch_size = 3, .seq_len = 48, .dtype = ZOFF_F32,
                             .checkpoint_activations = true};
    grid_vs_real("{\"train_micro_batch_size_per_gpu\": 3, \"zero_optimization\": {\"stage\": 1, \"sub_group_size\": 5000}}",
                 &mo2, 0);
}

/* ------------------------------------------------------------------ ratio auto */

/* The plan's "auto" is the engine's: budgets from "the model barely fits" to
 * "everything fits"; the engine refusing exactly when the plan says it will. */
static void test_auto_ratio_matches_engine(void **st) {
    (void)st;
    zoff_gpt2_options mo = {.shape = SHAPES[1].shape, .batch_size = 2, .seq_len = 64, .dtype = ZOFF_F16};
    zoff_plan_model_bytes mb;
    assert_int_equal(zoff_plan_model_bytes_get(&mo, &mb), ZOFF_OK);
    /* with gradient buckets (a ring of 2), with the full gradient buffer, and with buckets that
     * carry an accumulation's sum ("always", accumulation 2: the same device bytes as the first) */
    for (int full = 0; full < 3; full++) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": %d, \"fp16\": {\"enabled\": "
             "true}, \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 1, \"zoff_grad_buckets\": %s, "
             "\"sub_group_size\": 100000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": \"auto\"}}}",
             full == 2 ? 2 : 1, full == 1 ? "false" : full == 2 ? "\"always\"" : "true");
    zoff_config cfg;
    load_cfg(json, &cfg);
    size_t model_dev = mb.params + mb.grads + mb.activations;
    const double extra[] = {-0.01, 0.02, 0.06, 0.2, 0.5, 1.0, 3.0};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
        size_t budget = (size_t)((double)model_dev * (1.0 + extra[k])) + (size_t)((double)mb.num_params * 12 * extra[k]);
        zoff_plan_row row;
        config_row(&cfg, mo, budget, &row);
        reality r;
        measure_real(&cfg, &mo, budget, NULL, &r);
        char label[128];
        snprintf(label, sizeof label, "auto%s, budget model x %.2f",
                 full == 1 ? " (full gradient buffer)" : full == 2 ? " (buckets, accumulation 2)" : "", 1.0 + extra[k]);
        if (row.auto_failed) {
            assert_int_equal(r.status, ZOFF_ERR_DEVICE_OOM);
            continue;
        }
        if (r.status != ZOFF_OK) {
            /* the engine's choice fits its budget, but the training loop's token buffers may not */
            assert_false(row.fits_device);
            assert_int_equal(r.status, ZOFF_ERR_DEVICE_OOM);
            continue;
        }
        printf("%s: host ratio %.4f (plan %.4f)\n", label, r.host_ratio, row.host_ratio);
        assert_true(fabs(r.host_ratio - row.host_ratio) < 1e-12);
        compare(label, &row, &r, false);
    }
    zoff_config_free(&cfg);
    }
}

/* ------------------------------------------------------------------ stage 3 (one rank) */

/* Stage 3 as train.c runs it: the model without flat buffers, its weights from
 * the engine's hooks; two training steps (the second follows the recorded
 * order and prefetches), then the peaks and (nvme_dir) the parameter swap file. */
static void measure_stage3(const zoff_config *cfg, const zoff_gpt2_options *mo0, const char *nvme_dir, reality *r) {
    memset(r, 0, sizeof *r);
    zoff_gpt2_options mo = *mo0;
    mo.external_params = true;
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    zoff_gpt2 *m = NULL;
    zoff_engine *e = NULL;
    assert_int_equal(zoff_gpt2_create(dev, &mo, &m), ZOFF_OK);
    int64_t n = zoff_gpt2_num_params(m);
    float *init = zoff_aligned_alloc(64, (size_t)n * sizeof(float), "initial weights");
    assert_non_null(init);
    zoff_gpt2_init_params(m, 7, init);
    int nt;
    const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
    zoff_engine_options eo = {.dev = dev, .cfg = cfg, .tensors = ti, .num_tensors = nt, .num_params = n,
                              .dtype = mo.dtype, .init_params = init};
    zoff_status s = zoff_engine_create(&eo, &e);
    if (s != ZOFF_OK) fail_msg("stage 3 engine: %s", zoff_last_error());
    zoff_param_hooks hk = {.arg = e, .begin_pass = zoff_engine_begin_pass, .acquire = zoff_engine_acquire,
                           .release = zoff_engine_release};
    assert_int_equal(zoff_gpt2_set_param_hooks(m, &hk), ZOFF_OK);
    size_t tb = (size_t)(mo.batch_size * mo.seq_len) * sizeof(int32_t);
    int32_t *dx = NULL, *dy = NULL, *hx = malloc(tb);
    assert_non_null(hx);
    for (int64_t i = 0; i < mo.batch_size * mo.seq_len; i++) hx[i] = (int32_t)((i * 31) % mo.shape.vocab_size);
    assert_int_equal(zoff_device_alloc(dev, tb, "input tokens", (void **)&dx), ZOFF_OK);
    assert_int_equal(zoff_device_alloc(dev, tb, "target tokens", (void **)&dy), ZOFF_OK);
    zoff_stream *st = zoff_device_stream(dev);
    for (int step = 0; s == ZOFF_OK && step < 2; step++) {
        s = zoff_engine_zero_grad(e);
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, dx, hx, tb, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, dy, hx, tb, ZOFF_COPY_H2D);
        if (s == ZOFF_OK)
            s = zoff_gpt2_forward_train(m, dx, dy, mo.batch_size, mo.seq_len, zoff_engine_backward_scale(e));
        zoff_engine_begin_backward(e, true);
        if (s == ZOFF_OK) s = zoff_gpt2_backward(m, zoff_engine_grad_ready, e);
        zoff_step_info si;
        if (s == ZOFF_OK) s = zoff_engine_step(e, 1e-3, &si);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
    }
    if (s != ZOFF_OK) fail_msg("stage 3 step: %s", zoff_last_error());
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    r->status = s;
    r->device = ms.device_peak;
    r->pinned = ms.pinned_peak;
    if (nvme_dir) r->disk = dir_bytes(nvme_dir);
    zoff_device_free(dev, dx);
    zoff_device_free(dev, dy);
    free(hx);
    zoff_engine_destroy(e);
    zoff_gpt2_destroy(m);
    zoff_aligned_free(init);
    zoff_device_destroy(dev);
}

/* Stage 3 is planned from the engine's buffers; its pool of gathered groups is
 * a dynamic peak (prefetching, gradient buffers in flight) that the plan
 * estimates: within 10% of the real peak after two steps, pinned exact. */
static void test_stage3_vs_real(void **st) {
    (void)st;
    static const struct {
        int shape;
        zoff_dtype dt;
        const char *zero;
    } cases[] = {
        {1, ZOFF_BF16, "{\"stage\": 3}"},
        {1, ZOFF_F32, "{\"stage\": 3, \"stage3_prefetch_bucket_size\": 0}"},
        {2, ZOFF_F16, "{\"stage\": 3, \"stage3_prefetch_bucket_size\": 300000}"},
        {2, ZOFF_BF16, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}"},
        {2, ZOFF_BF16, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
                       "\"nvme\", \"nvme_path\": \"/tmp/zoff_test_plan_pnvme\", \"max_in_cpu\": 0}}"},
        /* fp32 (zoff plan's probe): each group's slot in the swap file is 4 KiB aligned */
        {2, ZOFF_F32, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
                      "\"nvme\", \"nvme_path\": \"/tmp/zoff_test_plan_pnvme\", \"max_in_cpu\": 0}}"},
        /* max_in_cpu keeps whole groups (block 0 and ln_f here, not the embeddings), pinned */
        {2, ZOFF_F32, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
                      "\"nvme\", \"nvme_path\": \"/tmp/zoff_test_plan_pnvme\", \"max_in_cpu\": 200000, \"buffer_count\": 1}}"},
        {0, ZOFF_BF16, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}"},
        {1, ZOFF_BF16, "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 500000}"},
        /* speculation: the speculative weights kept apart (a second staging half), pinned: counted exactly */
        {2, ZOFF_BF16, "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, \"super_offload\": "
                       "true}, \"offload_param\": {\"device\": \"cpu\"}}"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const shape_case *sc = &SHAPES[cases[c].shape];
        char json[1024];
        snprintf(json, sizeof json, "{\"train_micro_batch_size_per_gpu\": %lld, %s \"zero_optimization\": %s}",
                 (long long)sc->B, prec_json(cases[c].dt), cases[c].zero);
        zoff_config cfg;
        load_cfg(json, &cfg);
        zoff_gpt2_options mo = {.shape = sc->shape, .batch_size = sc->B, .seq_len = sc->T, .dtype = cases[c].dt};
        zoff_plan_row row;
        config_row(&cfg, mo, 0, &row);
        reality r;
        const bool pnvme = cfg.zero.offload_param.device == ZOFF_OFFLOAD_NVME;
        measure_stage3(&cfg, &mo, pnvme ? cfg.zero.offload_param.nvme_path : NULL, &r);
        double err = fabs((double)row.mem.device - (double)r.device) / (double)r.device;
        printf("stage 3 %s %s %s: device predicted %zu, real peak %zu (%+.2f%%; gathered pool estimate %zu)\n",
               sc->name, zoff_dtype_name(cases[c].dt), cases[c].zero, row.mem.device, r.device,
               100.0 * ((double)row.mem.device - (double)r.device) / (double)r.device, row.mem.gathered);
        if (err > TOL) fail_msg("stage 3 %s: device predicted %zu, real %zu", json, row.mem.device, r.device);
        exact("pinned", json, row.mem.pinned, r.pinned);
        if (pnvme) { /* the parameter swap file, as zoff train's memory line reports it */
            printf("  parameter swap file: predicted %zu, real %zu\n", row.mem.disk, r.disk);
            assert_true(r.disk > 0);
            exact("disk", json, row.mem.disk, r.disk);
        }
        if (err > g_max_err[0]) g_max_err[0] = err;
        g_checked++;
        zoff_config_free(&cfg);
    }
}

/* offload_param.pin_memory is the row's own (the config's; false in the grid's pageable variant),
 * counted and written alike: a config that pins the parameter swap buffers (the default) but not
 * offload_optimizer's buffers; the config --write-config writes for its row allocates the row's
 * pinned bytes and swap file. */
static void test_stage3_written_config(void **st) {
    (void)st;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const shape_case *sc = &SHAPES[2];
    char json[1024];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": %lld, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
             "{\"device\": \"cpu\", \"pin_memory\": false}, \"offload_param\": {\"device\": \"nvme\", "
             "\"nvme_path\": \"%s\", \"max_in_cpu\": 0}}}",
             (long long)sc->B, dir);
    zoff_config cfg;
    load_cfg(json, &cfg);
    zoff_gpt2_options mo = {.shape = sc->shape, .batch_size = sc->B, .seq_len = sc->T, .dtype = ZOFF_F32};
    zoff_plan_row row;
    config_row(&cfg, mo, 0, &row);
    assert_true(row.mem.param_buffers > 0);
    char *txt = NULL;
    assert_int_equal(zoff_plan_config_json(&cfg, &row, dir, false, &txt), ZOFF_OK);
    zoff_config written;
    load_cfg(txt, &written);
    reality r;
    measure_stage3(&written, &mo, dir, &r);
    exact("pinned (the written config)", txt, row.mem.pinned, r.pinned);
    exact("disk (the written config)", txt, row.mem.disk, r.disk);
    free(txt);
    zoff_config_free(&written);
    zoff_config_free(&cfg);
    clear_dir(dir);
    rmdir(dir);
}

/* The swap-file folders --write-config writes (zoff plan --nvme-path P: replace_nvme_path): P for both
 * files where the config names others (before: the config's kept, while the plan measured P's disk);
 * without it the config's own, and nvme_path where it names none. */
static void test_written_nvme_path(void **st) {
    (void)st;
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3, "
                       "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/cfg/opt\"}, "
                       "\"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/cfg/param\"}}}";
    const char *bare = "{\"train_micro_batch_size_per_gpu\": 2}"; /* its row set to nvme for both below */
    const struct {
        const char *base, *path;
        bool replace;
        const char *opt, *param;
    } cases[] = {
        {json, "/given", true, "/given", "/given"},
        {json, "/given", false, "/cfg/opt", "/cfg/param"},
        {bare, "/given", true, "/given", "/given"},
        {bare, "/given", false, "/given", "/given"},
        {bare, NULL, false, ".", "."},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        zoff_config base, written;
        load_cfg(cases[k].base, &base);
        zoff_plan_row row;
        memset(&row, 0, sizeof row);
        zoff_plan_setting_from_config(&base, &row.setting);
        row.setting.stage = 3;
        row.setting.offload = row.setting.param_offload = ZOFF_OFFLOAD_NVME;
        row.host_ratio = 1.0;
        char *txt = NULL;
        assert_int_equal(zoff_plan_config_json(&base, &row, cases[k].path, cases[k].replace, &txt), ZOFF_OK);
        load_cfg(txt, &written);
        if (strcmp(written.zero.offload_optimizer.nvme_path, cases[k].opt) ||
            strcmp(written.zero.offload_param.nvme_path, cases[k].param))
            fail_msg("case %zu: written nvme_path %s / %s, expected %s / %s\n%s", k,
                     written.zero.offload_optimizer.nvme_path, written.zero.offload_param.nvme_path, cases[k].opt,
                     cases[k].param, txt);
        free(txt);
        zoff_config_free(&written);
        zoff_config_free(&base);
    }
}

/* ------------------------------------------------------------------ two ranks (mpirun, when built with MPI) */

static double parse_bytes(const char *p) {
    double v = 0;
    char unit[8] = "";
    if (sscanf(p, "%lf %7s", &v, unit) != 2) return -1;
    if (!strncmp(unit, "KiB", 3)) v *= 1024.0;
    else if (!strncmp(unit, "MiB", 3)) v *= 1024.0 * 1024.0;
    else if (!strncmp(unit, "GiB", 3)) v *= 1024.0 * 1024.0 * 1024.0;
    return v;
}

/* mpirun -np 2 zoff train for one step (Open MPI's own allocations are not
 * freed at exit: leak detection off for it, as tests/cli_mpi.sh does): rank 0 prints the device and pinned
 * bytes it holds once model, engine and token buffers exist ("zoff: memory:
 * device X ..., pinned host Y"); they must be within 10% of the plan for 2 ranks
 * (which reports the largest partition, the last rank's; rank 0's is at most 64
 * elements per rank smaller) and of the printed precision (2 decimals). */
static void test_ranks_vs_real(void **st) {
    (void)st;
    char cmd[2048], dir[64], line[1024];
    snprintf(cmd, sizeof cmd, "command -v mpirun >/dev/null 2>&1 && %s version | grep -q '^mpi: built'", ZOFF_BINARY);
    if (run_cmd(cmd) != 0) {
        printf("zoff without MPI or no mpirun: the two-rank check is skipped\n");
        return;
    }
    make_tmpdir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd,
             "head -c 400000 %s/../src/model/gpt2.c %s/../src/zero/engine.c > %s/corpus.txt && %s tokenize --tokenizer "
             "byte --quiet --output-prefix %s/corpus %s/corpus.txt >/dev/null 2>&1",
             ZOFF_TEST_DIR, ZOFF_TEST_DIR, dir, ZOFF_BINARY, dir, dir);
    assert_int_equal(run_cmd(cmd), 0);
    static const char *zeros[] = {
        "{\"stage\": 0}",
        "{\"stage\": 1}",
        "{\"stage\": 2}",
        "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}",
        "{\"stage\": 2, \"round_robin_gradients\": true, \"reduce_bucket_size\": 50000, \"offload_optimizer\": "
        "{\"device\": \"cpu\", \"ratio\": 0.5, \"pin_memory\": false}}",
        /* accumulation 2 through the buckets with a device share: the compact buffer of the device pieces' sum */
        "{\"stage\": 1, \"zoff_grad_buckets\": \"always\", \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}",
    };
    static const int accum[] = {1, 1, 1, 1, 1, 2};
    zoff_gpt2_options mo = {.shape = {.num_layers = 2, .hidden_size = 128, .num_heads = 4, .max_seq_len = 64,
                                      .vocab_size = 512},
                            .batch_size = 4, .seq_len = 64, .dtype = ZOFF_BF16};
    for (size_t z = 0; z < sizeof zeros / sizeof zeros[0]; z++) {
        char json[1024], path[128];
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": %d, \"bf16\": {\"enabled\": "
                 "true}, \"zero_optimization\": %s}",
                 accum[z], zeros[z]);
        snprintf(path, sizeof path, "%s/c.json", dir);
        write_text(path, json);
        snprintf(cmd, sizeof cmd,
                 "ASAN_OPTIONS=detect_leaks=0 timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none "
                 "--mca btl self,vader --mca btl_vader_single_copy_mechanism none -x ZOFF_THREADS=1 -x "
                 "OMP_NUM_THREADS=1 -x ASAN_OPTIONS -np 2 %s train --config "
                 "%s --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --vocab-size 512 "
                 "--tokenizer byte --data-path %s/corpus_train.bin --val-path %s/corpus_val.bin --eval-iters 0 "
                 "--train-iters 1 --overwrite --save %s/out 2>&1",
                 ZOFF_BINARY, path, dir, dir, dir);
        FILE *f = popen(cmd, "r");
        assert_non_null(f);
        double dev = -1, pin = -1;
        while (fgets(line, sizeof line, f)) {
            const char *d = strstr(line, "zoff: memory: device "), *p = strstr(line, "pinned host ");
            if (d && p) {
                dev = parse_bytes(d + strlen("zoff: memory: device "));
                pin = parse_bytes(p + strlen("pinned host "));
            }
        }
        int rc = pclose(f);
        if (rc != 0 || dev < 0) fail_msg("mpirun -np 2 zoff train with %s failed (rc %d)", json, rc);
        zoff_config cfg;
        zoff_status ls = zoff_config_load_string(json, "two ranks", &cfg);
        assert_int_equal(ls, ZOFF_OK);
        assert_int_equal(zoff_config_resolve_batch(&cfg, 2), ZOFF_OK);
        zoff_plan_inputs in = {.cfg = &cfg, .model = mo};
        machine_for(&in.machine, 0);
        in.machine.ranks = in.machine.ranks_per_node = 2;
        zoff_plan_setting s;
        zoff_plan_setting_from_config(&cfg, &s);
        zoff_plan_row row;
        assert_int_equal(zoff_plan_evaluate(&in, &s, &row), ZOFF_OK);
        assert_true(row.runnable);
        double ed = fabs((double)row.mem.device - dev) / dev, ep = fabs((double)row.mem.pinned - pin) / pin;
        printf("2 ranks %s: device predicted %zu, rank 0 %.0f (%+.2f%%); pinned predicted %zu, rank 0 %.0f (%+.2f%%)\n",
               zeros[z], row.mem.device, dev, 100 * ((double)row.mem.device - dev) / dev, row.mem.pinned, pin,
               100 * ((double)row.mem.pinned - pin) / pin);
        if (ed > TOL || ep > TOL) fail_msg("2 ranks %s: device or pinned off by more than 10%%", json);
        zoff_config_free(&cfg);
    }
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run_cmd(cmd), 0);
}

/* ------------------------------------------------------------------ NVMe (when this zoff runs it) */

static void test_nvme_vs_real(void **st) {
    (void)st;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    char json[1024];
    int checked = 0;
    /* 1: Twin-Flow (AdamW at 0.6); 3, 4: bf16 m and v in the swap file (AdamW, Lion); Lion (2, 4) at ratio 1:
     * the device optimizer is Adam/AdamW only */
    for (int c = 0; c < 5; c++) {
        zoff_dtype dt = c == 0 || c >= 3 ? ZOFF_BF16 : c == 1 ? ZOFF_F32 : ZOFF_F16;
        const char *prec = c >= 3 ? "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true}," : prec_json(dt);
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 4, %s \"optimizer\": {\"type\": \"%s\"}, \"zero_optimization\": "
                 "{\"stage\": 2, \"sub_group_size\": %d, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": "
                 "\"%s\", \"ratio\": %s, \"pin_memory\": %s, \"buffer_count\": %d, \"pipeline_read\": %s}}}",
                 prec, c == 2 || c == 4 ? "Lion" : "AdamW", c == 1 ? 7000 : c == 3 ? 9001 : 30000, dir,
                 c == 1 ? "0.6" : "1", c == 1 ? "false" : "true", c == 2 ? 2 : c == 3 ? 3 : 4,
                 c == 2 || c == 3 ? "true" : "false");
        zoff_config cfg;
        load_cfg(json, &cfg);
        if (zoff_config_check_supported(&cfg) != ZOFF_OK) {
            zoff_clear_error();
            zoff_config_free(&cfg);
            printf("nvme offload is not runnable in this zoff: skipped\n");
            break;
        }
        zoff_gpt2_options mo = {.shape = SHAPES[2].shape, .batch_size = 4, .seq_len = 48, .dtype = dt};
        zoff_plan_row row;
        config_row(&cfg, mo, 0, &row);
        clear_dir(dir);
        reality r;
        measure_real(&cfg, &mo, 0, dir, &r);
        if (r.status != ZOFF_OK) fail_msg("nvme case %d: %s", c, zoff_last_error());
        assert_true(r.disk > 0);
        compare(json, &row, &r, true);
        checked++;
        zoff_config_free(&cfg);
    }
    clear_dir(dir);
    rmdir(dir);
    printf("nvme: %d configurations checked against the swap file and buffers\n", checked);
}

/* The probe's case (stage 2, offload_optimizer nvme at ratio 1, the default sub_group_size: one
 * sub-group): the grid keeps the config's own setting as a row, unmarked, whose bytes are those of
 * the real allocation of that config, beside the finer split it recommends (marked). */
static void test_grid_keeps_config_row(void **st) {
    (void)st;
    char dir[64], json[1024];
    make_tmpdir(dir, sizeof dir);
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
             "{\"device\": \"nvme\", \"nvme_path\": \"%s\", \"pin_memory\": true}}}", dir);
    zoff_config cfg;
    load_cfg(json, &cfg);
    zoff_gpt2_options mo = {.shape = SHAPES[0].shape, .batch_size = 4, .seq_len = 32, .dtype = ZOFF_F32};
    zoff_plan_inputs in = {.cfg = &cfg, .model = mo};
    machine_for(&in.machine, 0);
    const double one = 1.0;
    zoff_plan plan;
    assert_int_equal(zoff_plan_build(&in, &one, 1, &plan), ZOFF_OK);
    const zoff_plan_row *own = NULL;
    int finer = 0;
    for (int i = 0; i < plan.nrows; i++) {
        const zoff_plan_row *w = &plan.rows[i];
        if (w->setting.stage != 2 || w->setting.offload != ZOFF_OFFLOAD_NVME || w->setting.ratio_auto) continue;
        if (!zoff_plan_changes_sub_group_size(&cfg, &w->setting)) {
            assert_null(own);
            own = w;
        } else finer++;
    }
    if (!own) fail_msg("no grid row for the config's own setting (stage 2, nvme, ratio 1, its sub_group_size)");
    assert_int_equal(own->num_subgroups, 1);
    assert_int_equal(finer, 1);
    reality r;
    clear_dir(dir);
    measure_real(&cfg, &mo, 0, dir, &r);
    if (r.status != ZOFF_OK) fail_msg("the config's own setting: %s", zoff_last_error());
    assert_true(r.disk > 0);
    compare("the grid's row of the config's own nvme setting", own, &r, true);
    zoff_plan_free(&plan);
    zoff_config_free(&cfg);
    clear_dir(dir);
    rmdir(dir);
}

/* ------------------------------------------------------------------ recommendation, bench files, DeepSpeed */

/* With assumed rates the choice is arithmetic: a budget that the device
 * optimizer does not fit makes the plan offload; the recommendation fits and
 * runs, and nothing that fits and runs is predicted faster. */
static void test_recommendation(void **st) {
    (void)st;
    zoff_gpt2_options mo = {.shape = SHAPES[1].shape, .batch_size = 4, .seq_len = 64, .dtype = ZOFF_BF16};
    zoff_plan_model_bytes mb;
    assert_int_equal(zoff_plan_model_bytes_get(&mo, &mb), ZOFF_OK);
    zoff_config cfg;
    load_cfg("{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}, \"zero_optimization\": "
             "{\"stage\": 2}}",
             &cfg);
    zoff_plan_inputs in = {.cfg = &cfg, .model = mo};
    machine_for(&in.machine, mb.params + mb.grads + mb.activations + (size_t)mb.num_params * 4);
    in.machine.margin = 0.05;
    zoff_plan plan;
    assert_int_equal(zoff_plan_build(&in, NULL, 0, &plan), ZOFF_OK);
    assert_true(plan.best >= 0);
    const zoff_plan_row *b = &plan.rows[plan.best];
    assert_true(b->fits && b->runnable);
    assert_int_not_equal(b->setting.offload, ZOFF_OFFLOAD_NONE); /* 12 B/param of device state do not fit */
    /* (among rows with the config's state dtype: bf16 m and v, faster on the host, are a numerics change
     * recommended only when nothing fits with fp32 states) */
    for (int i = 0; i < plan.nrows; i++)
        if (plan.rows[i].fits && plan.rows[i].runnable && plan.rows[i].setting.bf16_states == b->setting.bf16_states)
            assert_true(plan.rows[i].time.step >= b->time.step * 0.98);
    /* the none rows do not fit the device */
    assert_false(plan.rows[0].fits_device);
    /* more ranks: runnable only in a build with MPI; the fastest that fits is found either way */
    in.machine.ranks = in.machine.ranks_per_node = 4;
    zoff_plan p4;
    assert_int_equal(zoff_plan_build(&in, NULL, 0, &p4), ZOFF_OK);
#ifdef ZOFF_HAVE_MPI
    assert_true(p4.best >= 0);
#else
    assert_int_equal(p4.best, -1);
#endif
    assert_true(p4.best_any >= 0);
    /* stage 1-3 partition the optimizer state: the largest partition of the engine's
     * own plan (src/zero/partition.c) for 2, 3, 4 and 7 ranks */
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    zoff_gpt2 *m = NULL;
    assert_int_equal(zoff_gpt2_create(dev, &mo, &m), ZOFF_OK);
    int nt;
    const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
    const int worlds[] = {2, 3, 4, 7};
    for (size_t w = 0; w < sizeof worlds / sizeof worlds[0]; w++) {
        zoff_dp_plan dp;
        assert_int_equal(zoff_dp_plan_build(&dp, ti, nt, mb.num_params, worlds[w], 0, false), ZOFF_OK);
        int64_t big = 0;
        for (int r = 0; r < worlds[w]; r++) big = dp.numel[r] > big ? dp.numel[r] : big;
        zoff_dp_plan_free(&dp);
        in.machine.ranks = in.machine.ranks_per_node = worlds[w];
        zoff_plan_setting s2 = {.stage = 2, .offload = ZOFF_OFFLOAD_CPU, .ratio = 1.0, .pin_memory = true,
                                .sub_group_size = 1000000000};
        zoff_plan_row row;
        assert_int_equal(zoff_plan_evaluate(&in, &s2, &row), ZOFF_OK);
        assert_int_equal(row.partition_params, big);
    }
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    zoff_plan_free(&p4);
    zoff_plan_free(&plan);
    zoff_config_free(&cfg);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_bench_files(void **st) {
    (void)st;
    char dir[64], p[128];
    make_tmpdir(dir, sizeof dir);
    zoff_plan_machine M;
    zoff_plan_machine_defaults(&M, ZOFF_BACKEND_CPU);
    /* zoff bench adam --json (one mode per dtype) */
    snprintf(p, sizeof p, "%s/adam.json", dir);
    write_text(p, "{\"bench\":\"adam\",\"optimizer\":\"adamw\",\"params\":100000000,\"threads\":2,\"simd\":\"avx2\","
                  "\"iters\":5,\"repeats\":5,\"modes\":[{\"mode\":\"fp32-grads\",\"bytes_per_param\":28,"
                  "\"bound_params_per_s\":4e8,\"bound_gb_per_s\":11.2,\"params_per_s\":3e8,\"gb_per_s\":8.4},"
                  "{\"mode\":\"bf16-grads+bf16-copy\",\"bytes_per_param\":28,\"bound_params_per_s\":5e8,"
                  "\"bound_gb_per_s\":14,\"params_per_s\":4.5e8,\"gb_per_s\":12.6}]}");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_OK);
    assert_true(fabs(M.rates.host_adam - 4.5e8) < 1);
    assert_true(fabs(M.rates.host_mem_bw - 14e9) < 1);
    assert_int_equal(M.rates.src_host_adam, ZOFF_PLAN_SRC_BENCH);
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_F16, &M), ZOFF_ERR_FORMAT); /* no fp16 mode in the file */
    assert_non_null(strstr(zoff_last_error(), "fp16-grads+fp16-copy"));
    /* zoff bench step --json */
    snprintf(p, sizeof p, "%s/step.json", dir);
    write_text(p, "{\"shape\":{\"layers\":4,\"hidden\":128,\"heads\":4,\"seq\":64,\"vocab\":50257},\"micro_batch\":8,"
                  "\"dtype\":\"bf16\",\"backend\":\"cpu\",\"rounds\":3,\"iters\":5,\"configs\":{\"device-optimizer\":"
                  "{\"step\":0.5,\"forward\":0.1,\"backward\":0.2,\"wait_grads\":0,\"host_step\":0,\"host_work\":0,"
                  "\"device_step\":0.01,\"wait_weights\":0,\"tokens_per_s\":1024,\"step_over_sum\":1,"
                  "\"step_over_max\":1,\"device_peak_bytes\":1}}}");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_OK);
    /* FLOPs of the bench's shape / (forward + backward) */
    double N = 8 * 64, C = 128, L = 4, T = 64, Vp = 50304;
    double fwd = 2 * N * L * 12 * C * C + 4 * 8 * T * T * C * L + 2 * N * Vp * C;
    assert_true(fabs(M.rates.device_flops - 3 * fwd / 0.3) < 1e-6 * M.rates.device_flops);
    assert_int_equal(M.rates.src_compute, ZOFF_PLAN_SRC_BENCH);
    assert_true(M.rates.device_adam > 0);
    /* zoff bench nvme --json */
    snprintf(p, sizeof p, "%s/nvme.json", dir);
    write_text(p, "{\"dir\":\"/mnt/nvme\",\"direct\":true,\"engine\":\"io_uring\",\"block_size\":1048576,"
                  "\"queue_depth\":8,\"buffer_count\":4,\"state_bytes\":1073741824,\"rounds\":3,\"io\":{\"write\":"
                  "{\"fio_bps\":2.2e9,\"swapper_bps\":2.1e9,\"ratio\":0.95},\"read\":{\"fio_bps\":3.3e9,\"swapper_bps\":"
                  "3.2e9,\"ratio\":0.97},\"mixed\":{\"fio_bps\":2e9,\"swapper_bps\":1.9e9,\"ratio\":0.95}}}");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_OK);
    assert_true(fabs(M.rates.disk_read - 3.2e9) < 1 && fabs(M.rates.disk_write - 2.1e9) < 1);
    assert_non_null(strstr(M.rates.bench_files, "nvme.json"));
    /* something else */
    snprintf(p, sizeof p, "%s/other.json", dir);
    write_text(p, "{\"hello\": 1}");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_ERR_FORMAT);
    write_text(p, "not json");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_ERR_FORMAT);
    /* a cuda bench for a cpu plan */
    write_text(p, "{\"shape\":{\"layers\":4,\"hidden\":128,\"heads\":4,\"seq\":64,\"vocab\":50257},\"micro_batch\":8,"
                  "\"dtype\":\"bf16\",\"backend\":\"cuda\",\"configs\":{\"device-optimizer\":{\"step\":0.5,"
                  "\"forward\":0.1,\"backward\":0.2}}}");
    assert_int_equal(zoff_plan_read_bench(p, ZOFF_BF16, &M), ZOFF_ERR_FORMAT);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* |a - b| <= rel * |b| (cmocka 1.1 has no double comparison) */
static void assert_near(double a, double b, double rel) {
    if (!(fabs(a - b) <= rel * fabs(b))) fail_msg("%.9g is not within %g of %.9g", a, rel, b);
}

/* The host optimizer's rate per row. Its bytes per parameter, counted here from the update's
 * definition (include/zoff/optim.h): the fp32 master read and written (8), each moment read and
 * written in the state dtype, the gradient read in the model's dtype, the 16-bit copy written
 * (2, 16-bit models). Assumed rates: the bandwidth over those bytes; a measured rate (fp32
 * states) scaled by the ratio of the bytes; a row's host time is its host parameters at it. */
static void test_host_rates(void **st) {
    (void)st;
    static const struct {
        const char *opt_json;
        zoff_dtype dt;
        double fp32_states, bf16_states; /* bytes per parameter */
    } cases[] = {
        {"", ZOFF_BF16, 8 + 2 * 4 * 2 + 2 + 2, 8 + 2 * 2 * 2 + 2 + 2},
        {"", ZOFF_F32, 8 + 2 * 4 * 2 + 4, 8 + 2 * 2 * 2 + 4},
        {"\"optimizer\": {\"type\": \"Adagrad\"},", ZOFF_BF16, 8 + 2 * 4 + 2 + 2, 8 + 2 * 2 + 2 + 2},
        {"\"optimizer\": {\"type\": \"Lion\"},", ZOFF_F16, 8 + 2 * 4 + 2 + 2, 8 + 2 * 2 + 2 + 2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 4, %s %s \"zero_optimization\": {\"stage\": 2, "
                 "\"offload_optimizer\": {\"device\": \"cpu\"}}}",
                 cases[c].opt_json, prec_json(cases[c].dt));
        zoff_config cfg;
        load_cfg(json, &cfg);
        zoff_plan_rates r = {.host_mem_bw = 84e9, .src_host_adam = ZOFF_PLAN_SRC_ASSUMED};
        assert_near(zoff_plan_host_rate(&r, &cfg, cases[c].dt, false), 84e9 / cases[c].fp32_states, 1e-12);
        assert_near(zoff_plan_host_rate(&r, &cfg, cases[c].dt, true), 84e9 / cases[c].bf16_states, 1e-12);
        r = (zoff_plan_rates){.host_adam = 3e9, .host_mem_bw = 1, .src_host_adam = ZOFF_PLAN_SRC_PROBE};
        assert_near(zoff_plan_host_rate(&r, &cfg, cases[c].dt, false), 3e9, 1e-12);
        assert_near(zoff_plan_host_rate(&r, &cfg, cases[c].dt, true),
                            3e9 * cases[c].fp32_states / cases[c].bf16_states, 1e-12);
        /* a row: ratio 1 on the host, at the assumed rates of the machine */
        zoff_gpt2_options mo = {.shape = SHAPES[1].shape, .batch_size = 4, .seq_len = 64, .dtype = cases[c].dt};
        zoff_plan_inputs in = {.cfg = &cfg, .model = mo};
        machine_for(&in.machine, 0);
        for (int b16 = 0; b16 < 2; b16++) {
            zoff_plan_setting s = {.stage = 2, .offload = ZOFF_OFFLOAD_CPU, .ratio = 1.0, .bf16_states = b16,
                                   .sub_group_size = 1000000000};
            zoff_plan_row row;
            assert_int_equal(zoff_plan_evaluate(&in, &s, &row), ZOFF_OK);
            assert_true(row.host_params > 0);
            double bytes = b16 ? cases[c].bf16_states : cases[c].fp32_states;
            double want = (double)row.host_params * bytes / in.machine.rates.host_mem_bw;
            if (fabs(row.time.host_optim - want) > 1e-9 * want)
                fail_msg("case %zu bf16 states %d: host optimizer %.9g s, want %.9g s", c, b16, row.time.host_optim,
                         want);
        }
        zoff_config_free(&cfg);
    }
}

/* The pipelined exact step (CUDA, optimizer state in host memory, stages 1-2, not delayed): the next
 * forward runs while the host optimizer updates, layer group by layer group, so the step is
 * backward + gradients out + max(forward + device optimizer, host optimizer + weights in). The
 * forward's FLOPs counted here from GPT-2's shape (matmuls, attention, the tied head); the other
 * settings keep the forward before the optimizers. */
static void test_pipelined_step(void **st) {
    (void)st;
    zoff_gpt2_options mo = {.shape = SHAPES[1].shape, .batch_size = 4, .seq_len = 64, .dtype = ZOFF_BF16};
    const double N = 4 * 64, C = 128, L = 4, T = 64, Vp = 50304;
    const double fwd = 2 * N * L * 12 * C * C + 4 * 4 * T * T * C * L + 2 * N * Vp * C;
    static const struct {
        const char *zero;
        int stage;
        zoff_offload_device off;
        bool pipelined;
    } cases[] = {
        {"\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}", 2, ZOFF_OFFLOAD_CPU, true},
        {"\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}", 1, ZOFF_OFFLOAD_CPU, true},
        {"\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}, \"zoff_delayed_param_update\": true", 2,
         ZOFF_OFFLOAD_CPU, false},
        {"\"stage\": 2, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}", 2, ZOFF_OFFLOAD_NVME,
         false},
        {"\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}", 3, ZOFF_OFFLOAD_CPU, false},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {\"enabled\": true}, \"zero_optimization\": {%s}}",
                 cases[c].zero);
        zoff_config cfg;
        load_cfg(json, &cfg);
        for (int cuda = 0; cuda < 2; cuda++) {
            zoff_plan_inputs in = {.cfg = &cfg, .model = mo};
            zoff_plan_machine_defaults(&in.machine, cuda ? ZOFF_BACKEND_CUDA : ZOFF_BACKEND_CPU);
            in.machine.margin = 0;
            zoff_plan_setting s = {.stage = cases[c].stage, .offload = cases[c].off, .ratio = 0.5, .pin_memory = true,
                                   .sub_group_size = 1000000000};
            zoff_plan_row row;
            assert_int_equal(zoff_plan_evaluate(&in, &s, &row), ZOFF_OK);
            const zoff_plan_time *t = &row.time;
            if (!(cuda && cases[c].pipelined)) {
                if (t->forward_overlap != 0) fail_msg("case %zu cuda %d: forward overlap %g, want 0", c, cuda, t->forward_overlap);
                continue;
            }
            double F = fwd / in.machine.rates.device_flops;
            assert_near(t->forward_overlap, F, 1e-12);
            double want = t->compute - F + t->grads_out + t->comm + fmax(F + t->device_optim, t->host_optim + t->weights_in);
            assert_near(t->step, want, 1e-12);
            assert_true(t->step < t->compute + t->grads_out + t->comm + fmax(t->device_optim, t->host_optim + t->weights_in));
        }
        zoff_config_free(&cfg);
    }
}

/* Hugging Face GPT-2 (124M) has 124,439,808 parameters and a 50257 x 768
 * embedding: DeepSpeed's estimators start from those counts. */
static void test_deepspeed_estimates(void **st) {
    (void)st;
    zoff_gpt2_shape gpt2 = {.num_layers = 12, .hidden_size = 768, .num_heads = 12, .max_seq_len = 1024,
                            .vocab_size = 50257};
    zoff_plan_deepspeed d;
    zoff_plan_deepspeed_estimate(&gpt2, 1, 1, &d);
    assert_int_equal(d.total_params, 124439808);
    assert_int_equal(d.largest_layer_params, 50257 * 768);
    assert_true(d.z2_offload_gpu == 2.0 * 124439808);
    assert_true(d.z2_offload_cpu == 124439808.0 * 16 * 1.5);
    assert_true(d.z2_none_gpu == 20.0 * 124439808);
    assert_true(d.z3_both_gpu == 4.0 * 50257 * 768);
    zoff_plan_deepspeed_estimate(&gpt2, 8, 2, &d);
    assert_true(d.z2_offload_cpu == 124439808.0 * 64 * 1.5);
    assert_true(d.z3_both_cpu == 124439808.0 * 18 * 0.5 * 1.5);
}

/* ------------------------------------------------------------------ the command */

static int run_cmd(const char *cmd) {
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* A fresh temporary directory (name into dir) holding json as ds.json. */
static void tmp_with_config(char *dir, size_t n, const char *json) {
    char p[160];
    make_tmpdir(dir, n);
    snprintf(p, sizeof p, "%s/ds.json", dir);
    write_text(p, json);
}

/* Run a zoff plan command that writes its --json output to DIR/plan.json; the parsed output. */
static json_t *plan_json_of(const char *cmd, const char *dir) {
    char p[160];
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(p, sizeof p, "%s/plan.json", dir);
    json_error_t je;
    json_t *root = json_load_file(p, 0, &je);
    if (!root) fail_msg("zoff plan --json output is not JSON: %s", je.text);
    return root;
}

/* bytes in whole MiB blocks (the snapshot's unit) */
static size_t mib_blocks(double bytes) {
    const double mib = 1048576.0;
    return (size_t)(ceil(bytes / mib) * mib);
}

/* The 13B shape on the H100 box (bf16, stage 2, offload cpu, pinned): nothing fits with
 * fp32 optimizer states (14 B/param at ratio 1 > 125 GiB); the plan recommends a setting with bf16
 * states, labels it a numerics change, and --write-config sets the key. */
static void test_13b_recommendation(void **st) {
    (void)st;
    char dir[64], cmd[2048], p[160];
    tmp_with_config(dir, sizeof dir,
                    "{\"train_micro_batch_size_per_gpu\": 1, \"bf16\": {\"enabled\": true}, \"zero_optimization\": "
                    "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}}");
    snprintf(p, sizeof p, "%s/ds.json", dir);
    const char *args = "--device cuda --device-memory 79GiB --host-memory 125GiB --pinned-limit unlimited --disk-free "
                       "60GiB --num-layers 40 --hidden-size 5120 --num-attention-heads 40 --seq-length 1024 "
                       "--checkpoint-activations --no-probe";
    snprintf(cmd, sizeof cmd, "%s plan --config %s %s --json --write-config %s/out.json > %s/plan.json", ZOFF_BINARY, p,
             args, dir, dir);
    json_t *root = plan_json_of(cmd, dir);
    json_t *rows = json_object_get(root, "rows");
    json_int_t best = json_integer_value(json_object_get(root, "best"));
    assert_true(best >= 0);
    const double host = 125.0 * 1073741824.0;
    for (size_t i = 0; i < json_array_size(rows); i++) { /* with fp32 states nothing fits */
        json_t *w = json_array_get(rows, i);
        if (!json_is_true(json_object_get(w, "bf16_optimizer_states"))) assert_false(json_is_true(json_object_get(w, "fits")));
    }
    /* candidates with bf16 m and v in the NVMe swap file, runnable: its file is 8 bytes per host
     * parameter (4 + 2 + 2, and 4 KiB paddings: at most 3 per sub-group, and the header) */
    int nvme_b16 = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *w = json_array_get(rows, i);
        if (strcmp(json_string_value(json_object_get(w, "offload")), "nvme") ||
            !json_is_true(json_object_get(w, "bf16_optimizer_states")) ||
            json_integer_value(json_object_get(w, "host_params")) == 0)
            continue;
        nvme_b16++;
        assert_true(json_is_true(json_object_get(w, "runnable")));
        json_int_t hp = json_integer_value(json_object_get(w, "host_params"));
        json_int_t ns = json_integer_value(json_object_get(w, "num_subgroups"));
        json_int_t disk = json_integer_value(json_object_get(json_object_get(w, "breakdown"), "disk_optimizer"));
        if (disk < 8 * hp || disk > 8 * hp + 4096 * (3 * ns + 1))
            fail_msg("row %zu: nvme bf16-state file %lld bytes for %lld host parameters", i, (long long)disk, (long long)hp);
    }
    assert_true(nvme_b16 > 0);
    json_t *b = json_array_get(rows, (size_t)best);
    assert_true(json_is_true(json_object_get(b, "fits")) && json_is_true(json_object_get(b, "runnable")));
    assert_true(json_is_true(json_object_get(b, "bf16_optimizer_states")));
    json_t *pr = json_object_get(b, "per_rank");
    double used = (double)json_integer_value(json_object_get(pr, "pinned")) +
                  (double)json_integer_value(json_object_get(pr, "pageable"));
    assert_true(used <= host);
    assert_true((double)json_integer_value(json_object_get(pr, "device")) <= 79.0 * 1073741824.0);
    /* host optimizer state: 8 bytes per host parameter (master 4 + bf16 m 2 + bf16 v 2) */
    json_t *bd = json_object_get(b, "breakdown");
    assert_int_equal(json_integer_value(json_object_get(bd, "host_optimizer")),
                     8 * json_integer_value(json_object_get(b, "host_params")));
    /* its periodic saves are synchronous: the device share's fp32 master, m and v (41 GB) are more than half of
     * what the setting leaves of the 125 GiB */
    json_t *sv = json_object_get(b, "periodic_saves");
    const double dev_copy = (double)mib_blocks((double)json_integer_value(json_object_get(b, "device_params")) * 12.0);
    const double left = host - (double)json_integer_value(json_object_get(b, "host_use_per_node"));
    assert_false(json_is_true(json_object_get(sv, "background")));
    assert_non_null(strstr(json_string_value(json_object_get(sv, "why")), "the copy of the device's"));
    assert_true((double)json_integer_value(json_object_get(sv, "snapshot_copy")) == dev_copy);
    assert_true(fabs((double)json_integer_value(json_object_get(sv, "snapshot_budget")) - left / 2) <= 1.0);
    assert_true(dev_copy > left / 2);
    json_decref(root);
    /* the written config asks for the bf16 states and is runnable */
    snprintf(p, sizeof p, "%s/out.json", dir);
    zoff_config cfg;
    if (zoff_config_load_file(p, &cfg) != ZOFF_OK) fail_msg("written config: %s", zoff_last_error());
    assert_true(cfg.bf16_optimizer_states);
    assert_int_equal(cfg.zero.stage, 2);
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);
    zoff_config_free(&cfg);
    /* the text names the numerics change and the key */
    snprintf(cmd, sizeof cmd,
             "%s plan --config %s/ds.json %s | grep -q 'a numerics change the config did not ask for'", ZOFF_BINARY,
             dir, args);
    assert_int_equal(run_cmd(cmd), 0);
    /* a config that fits with fp32 states keeps them (no bf16 recommendation) */
    snprintf(cmd, sizeof cmd,
             "%s plan --config %s/ds.json --device cuda --device-memory 79GiB --host-memory 125GiB --pinned-limit "
             "unlimited --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 1024 --no-probe "
             "| grep '^recommended' | grep -vq bf16st",
             ZOFF_BINARY, dir);
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run_cmd(cmd), 0);
}

/* Slots of 1 MiB for a host state array of `bytes`, each holding 1 MiB - 4 KiB of it. */
static size_t slot_bytes(double bytes) {
    const double per = 1048576.0 - 4096.0;
    return (size_t)(ceil(bytes / per) * 1048576.0);
}

/* How periodic saves would run (the row's snapshot budget and zoff_train_ckpt_background_rule), with the sizes
 * counted here from the definition: each host state array in 1 MiB slots of 1 MiB - 4 KiB, the device share's fp32
 * master, m and v in whole MiB, the budget half the host memory the setting leaves. */

static void test_periodic_saves(void **st) {
    (void)st;
    assert_int_equal(zoff_placement_snapshot_auto_budget(100, 4, 10), 7);  /* (10 + 4) / 2 */
    assert_int_equal(zoff_placement_snapshot_auto_budget(100, 40, 10), 40); /* at least what is held */
    assert_int_equal(zoff_placement_snapshot_auto_budget(5, 4, 10), 5);     /* at most the whole arena */
    assert_int_equal(zoff_placement_snapshot_auto_budget(SIZE_MAX, 0, SIZE_MAX), SIZE_MAX / 2);
    static const struct {
        const char *zero, *prec;
        int ranks;
        double host_gib, ratio;  /* ratio < 0: the row of the config's setting, whatever its ratio */
        bool background;
        const char *why;         /* in saves_why when not */
        int state_bytes;         /* of m and v on the host */
    } cases[] = {
        {"\"offload_optimizer\": {\"device\": \"cpu\"}", "", 1, 64, 1, true, NULL, 4},
        /* host 0: what the setting uses + its whole arena (a budget of half the arena) */
        {"\"offload_optimizer\": {\"device\": \"cpu\"}", "", 1, 0, 1, true, NULL, 4},
        {"\"offload_optimizer\": {\"device\": \"cpu\"}", "\"bf16_optimizer_states\": true,", 1, 64, 1, true, NULL, 2},
        {"\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}", "", 1, 64, 0.5, true, NULL, 4},
        {"\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}", "", 1, 0.02, 0.5, false, "the copy of the device's", 4},
        {"\"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5, \"super_offload\": true}", "", 1, 64, -1, false,
         "takes no snapshot", 4},
        {"\"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": true}", "", 1, 64, -1, true, NULL, 4},
        {"\"offload_optimizer\": {\"device\": \"cpu\"}", "", 2, 64, 1, false, "this run has 2 ranks", 4},
        {"\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \".\"}", "", 1, 64, 1, false, "NVMe swap files", 4},
        {"", "", 1, 64, -1, false, "all of the optimizer state is on the device", 4},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char json[1024];
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 4, \"bf16\": {%s \"enabled\": true}, \"optimizer\": {\"type\": "
                 "\"AdamW\"}, \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 100000 %s %s}}",
                 cases[c].prec, cases[c].zero[0] ? "," : "", cases[c].zero);
        zoff_config cfg;
        zoff_status ls = zoff_config_load_string(json, "test config", &cfg);
        if (ls != ZOFF_OK) fail_msg("case %zu: %s", c, zoff_last_error());
        assert_int_equal(zoff_config_resolve_batch(&cfg, cases[c].ranks), ZOFF_OK);
        zoff_plan_inputs in = {.cfg = &cfg, .model = {.shape = SHAPES[1].shape, .batch_size = 4, .seq_len = 64,
                                                      .dtype = ZOFF_BF16}};
        zoff_plan_machine_defaults(&in.machine, ZOFF_BACKEND_CUDA);
        in.machine.ranks = in.machine.ranks_per_node = cases[c].ranks;
        in.machine.device_bytes = (size_t)8 << 30;
        in.machine.host_bytes = (size_t)(cases[c].host_gib * 1073741824.0);
        in.machine.disk_bytes = (size_t)64 << 30;
        zoff_plan_setting s;
        zoff_plan_setting_from_config(&cfg, &s);
        if (cases[c].ratio >= 0) s.ratio = cases[c].ratio;
        zoff_plan_row r;
        assert_int_equal(zoff_plan_evaluate(&in, &s, &r), ZOFF_OK);
        if (cases[c].host_gib == 0) {
            in.machine.host_bytes = r.host_use + r.mem.snapshot;
            assert_int_equal(zoff_plan_evaluate(&in, &s, &r), ZOFF_OK);
        }
        if (r.background_saves != cases[c].background)
            fail_msg("case %zu (%s, %d ranks, %.2f GiB): background %d, expected %d (%s)", c, cases[c].zero,
                     cases[c].ranks, cases[c].host_gib, r.background_saves, cases[c].background, r.saves_why);
        if (cases[c].why && !strstr(r.saves_why, cases[c].why))
            fail_msg("case %zu: why '%s', expected '%s'", c, r.saves_why, cases[c].why);
        if (cases[c].background) assert_string_equal(r.saves_why, "");
        const bool nvme = strstr(cases[c].zero, "nvme") != NULL;
        const double nh = (double)r.host_params, nd = (double)r.device_params;
        assert_int_equal(r.host_params + r.device_params, r.partition_params);
        const size_t copy = nh > 0 && !nvme ? mib_blocks(nd * 3 * 4) : 0;
        const size_t whole = nh > 0 && !nvme ? slot_bytes(nh * 4) + 2 * slot_bytes(nh * cases[c].state_bytes) + copy : 0;
        assert_int_equal(r.mem.snapshot_copy, copy);
        assert_int_equal(r.mem.snapshot, whole);
        if (strstr(cases[c].zero, "super_offload")) {
            assert_int_equal(r.snapshot_budget, -1);
        } else {
            const size_t left = in.machine.host_bytes > r.host_use ? in.machine.host_bytes - r.host_use : 0;
            assert_int_equal(r.snapshot_budget, (int64_t)(left / 2 < whole ? left / 2 : whole));
        }
        if (c == 1) assert_true(r.snapshot_budget > 0 && (size_t)r.snapshot_budget < whole);
        zoff_config_free(&cfg);
    }
}

static void test_cli(void **st) {
    (void)st;
    char dir[64], cmd[1024], p[160];
    tmp_with_config(dir, sizeof dir,
                    "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"bf16\": "
                    "{\"enabled\": true}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4}}, "
                    "\"zero_optimization\": {\"stage\": 2, \"zoff_delayed_param_update\": true, "
                    "\"offload_optimizer\": {\"device\": \"cpu\"}}, \"steps_per_print\": 7}");
    /* --json and --write-config */
    snprintf(cmd, sizeof cmd,
             "%s plan --config %s/ds.json --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 "
             "--vocab-size 1000 --device cpu --device-memory 3MiB --pinned-limit unlimited --no-probe --json "
             "--deepspeed --write-config %s/out.json > %s/plan.json",
             ZOFF_BINARY, dir, dir, dir);
    json_t *root = plan_json_of(cmd, dir);
    json_t *rows = json_object_get(root, "rows");
    assert_true(json_array_size(rows) >= 40);
    json_int_t best = json_integer_value(json_object_get(root, "best"));
    assert_true(best >= 0);
    json_t *brow = json_array_get(rows, (size_t)best);
    assert_true(json_is_true(json_object_get(brow, "fits")));
    assert_true(json_is_true(json_object_get(brow, "runnable")));
    assert_non_null(json_object_get(root, "deepspeed"));
    assert_non_null(json_object_get(root, "recommended_config"));
    json_decref(root);
    /* the written config loads, runs and keeps the user's other keys */
    snprintf(p, sizeof p, "%s/out.json", dir);
    zoff_config cfg;
    if (zoff_config_load_file(p, &cfg) != ZOFF_OK) fail_msg("written config: %s", zoff_last_error());
    assert_int_equal(zoff_config_check_supported(&cfg), ZOFF_OK);
    assert_int_equal(cfg.steps_per_print, 7);
    assert_true(fabs(cfg.optimizer.lr - 3e-4) < 1e-12);
    assert_int_equal(cfg.gradient_accumulation_steps, 2);
    assert_true(cfg.bf16_enabled);
    zoff_config_free(&cfg);
    /* no temporary file is left behind */
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", dir);
    assert_int_not_equal(run_cmd(cmd), 0);
    /* the text output names the recommendation */
    snprintf(cmd, sizeof cmd,
             "%s plan --num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --vocab-size 1000 "
             "--device cpu --no-probe --checkpoint-activations | grep -q '^recommended: stage'",
             ZOFF_BINARY);
    assert_int_equal(run_cmd(cmd), 0);
    /* bad usage and bad config: exit 2, the key named */
    snprintf(cmd, sizeof cmd, "%s plan --no-such-flag 2>/dev/null", ZOFF_BINARY);
    assert_int_equal(run_cmd(cmd), 2);
    snprintf(cmd, sizeof cmd, "%s plan --ratios 0,2 --no-probe 2>/dev/null", ZOFF_BINARY);
    assert_int_equal(run_cmd(cmd), 2);
    snprintf(p, sizeof p, "%s/bad.json", dir);
    write_text(p, "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, \"bogus\": 1}}");
    snprintf(cmd, sizeof cmd, "%s plan --config %s --no-probe 2>&1 | grep -q 'zero_optimization.bogus'", ZOFF_BINARY, p);
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s plan --config %s --no-probe >/dev/null 2>&1", ZOFF_BINARY, p);
    assert_int_equal(run_cmd(cmd), 2);
    /* nothing fits: --write-config writes nothing and exits 1 */
    snprintf(cmd, sizeof cmd,
             "%s plan --device cpu --device-memory 64KiB --no-probe --write-config %s/none.json >/dev/null 2>&1",
             ZOFF_BINARY, dir);
    assert_int_equal(run_cmd(cmd), 1);
    snprintf(p, sizeof p, "%s/none.json", dir);
    struct stat sb;
    assert_int_not_equal(stat(p, &sb), 0);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run_cmd(cmd), 0);
}

/* The grid's nvme rows at ratio 0 or 1 use at least ZOFF_PLAN_MIN_SUBGROUPS sub-groups, a
 * sub_group_size the config does not have: the text table marks those rows ('*' after the
 * offload) with a footnote naming both sizes, the JSON row says "sub_group_size_changed", and no
 * other row is marked (their figures are for the config as it is; test_nvme_vs_real and
 * test_grid_vs_real hold both kinds against the real allocation). */
static void test_cli_marks_changed_settings(void **st) {
    (void)st;
    char dir[64], cmd[1024];
    tmp_with_config(dir, sizeof dir,
                    "{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, "
                    "\"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\", \"pin_memory\": true}}}");
    const char *shape = "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 32 --vocab-size 256 "
                        "--device cpu --no-probe --ratios 1";
    snprintf(cmd, sizeof cmd, "%s plan --config %s/ds.json %s > %s/plan.txt", ZOFF_BINARY, dir, shape, dir);
    assert_int_equal(run_cmd(cmd), 0);
    snprintf(cmd, sizeof cmd, "grep -Eq '^ +2 nvme\\* +1 ' %s/plan.txt", dir);
    if (run_cmd(cmd) != 0) fail_msg("the stage 2 nvme ratio 1 row is not marked as changing sub_group_size");
    snprintf(cmd, sizeof cmd, "grep -Eq '^  \\* sub_group_size [0-9]+, not the config.s 1000000000' %s/plan.txt", dir);
    if (run_cmd(cmd) != 0) fail_msg("no footnote naming the row's sub_group_size and the config's");
    snprintf(cmd, sizeof cmd, "grep -Eq '^ +[0-3] (none|cpu)[^ ]*\\* ' %s/plan.txt", dir);
    if (run_cmd(cmd) == 0) fail_msg("a cpu or none row is marked, yet it keeps the config's sub_group_size");
    snprintf(cmd, sizeof cmd, "%s plan --config %s/ds.json %s --json > %s/plan.json", ZOFF_BINARY, dir, shape, dir);
    json_t *root = plan_json_of(cmd, dir);
    json_t *rows = json_object_get(root, "rows");
    int changed = 0;
    for (size_t i = 0; i < json_array_size(rows); i++) {
        json_t *w = json_array_get(rows, i);
        bool ch = json_is_true(json_object_get(w, "sub_group_size_changed"));
        assert_non_null(json_object_get(w, "sub_group_size_changed"));
        assert_int_equal(ch, json_integer_value(json_object_get(w, "sub_group_size")) != 1000000000);
        if (ch) {
            assert_string_equal(json_string_value(json_object_get(w, "offload")), "nvme");
            changed++;
        }
    }
    assert_true(changed > 0);
    json_decref(root);
    /* a sub_group_size that already gives enough sub-groups: nothing marked */
    snprintf(cmd, sizeof cmd,
             "printf '%%s' '{\"train_micro_batch_size_per_gpu\": 4, \"zero_optimization\": {\"stage\": 2, "
             "\"sub_group_size\": 1000, \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}}}' > "
             "%s/fine.json && %s plan --config %s/fine.json %s > %s/fine.txt && ! grep -q '\\*' %s/fine.txt",
             dir, ZOFF_BINARY, dir, shape, dir, dir);
    if (run_cmd(cmd) != 0) fail_msg("a row is marked although the config's sub_group_size gives enough sub-groups");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(run_cmd(cmd), 0);
}

static int report(void **st) {
    (void)st;
    printf("plan vs real over %d configurations: worst relative error device %.4f%%, pinned %.4f%%, pageable %.4f%%, "
           "disk %.4f%%\n",
           g_checked, 100 * g_max_err[0], 100 * g_max_err[1], 100 * g_max_err[2], 100 * g_max_err[3]);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_bytes_exact),  cmocka_unit_test(test_configs_vs_real),
        cmocka_unit_test(test_variants_vs_real),   cmocka_unit_test(test_grid_vs_real),
        cmocka_unit_test(test_auto_ratio_matches_engine), cmocka_unit_test(test_stage3_vs_real),
        cmocka_unit_test(test_stage3_written_config), cmocka_unit_test(test_written_nvme_path),
        cmocka_unit_test(test_nvme_vs_real),        cmocka_unit_test(test_grid_keeps_config_row),
        cmocka_unit_test(test_ranks_vs_real),
        cmocka_unit_test(test_recommendation),     cmocka_unit_test(test_bench_files), cmocka_unit_test(test_host_rates), cmocka_unit_test(test_pipelined_step),
        cmocka_unit_test(test_periodic_saves),
        cmocka_unit_test(test_deepspeed_estimates), cmocka_unit_test(test_cli), cmocka_unit_test(test_cli_marks_changed_settings),
        cmocka_unit_test(test_13b_recommendation),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
