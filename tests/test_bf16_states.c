/* bf16 optimizer states through the engine (bf16.bf16_optimizer_states): the host optimizer
 * keeps m and v in bf16, the master in fp32.
 *
 * The reference is a double-precision AdamW written here from the update's definition
 * (decoupled weight decay, bias correction), applied to the state the engine held before
 * each step, with m and v rounded to the nearest bf16 (the engine runs with
 * zoff_engine_options.state_rounding nearest): m and v must be that rounding of the exact
 * values within fp32 arithmetic slack, the master the exact update (from the unrounded m
 * and v, as the fused update computes it) within fp32 slack. Also: the stored m and v are
 * bf16 values, the host bytes are 10 per parameter (bf16 weights: master 4 + m 2 + v 2 +
 * the one 16-bit gradient/weight buffer 2), the placement and the speculation copy count
 * them, state get/set round trips, and a Twin-Flow split keeps fp32 state on the device.
 *
 * With the state in the NVMe swap file (offload_optimizer nvme): the same reference holds, the
 * run is bit for bit the cpu-offload run (stochastic rounding: the same seeds), and the swap file
 * holds m and v in bf16: its size is computed here from the file layout (4 KiB header, each
 * array of each sub-group padded to 4 KiB) and checked on disk. */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/config.h"
#include "zoff/core.h"
#include "zoff/engine.h"

#define OK(x) assert_int_equal((x), ZOFF_OK)

enum { N0 = 2300, N1 = 1700, N = N0 + N1, STEPS = 6 };
static const double LR = 1e-2, B1 = 0.9, B2 = 0.999, EPS = 1e-8, WD = 0.05;

/* The NVMe rig: sub-groups of 2048 (2048 + 1952 elements), the swap files in g_dir. */
enum { NVME_SGS = 2048 };
static char g_dir[64];
static bool g_nvme; /* rig_open: offload_optimizer nvme instead of cpu */

static const char *cfg_json(char *buf, size_t n, bool bf16_states, double ratio) {
    char dev[160];
    if (g_nvme) snprintf(dev, sizeof dev, "\"nvme\", \"nvme_path\": \"%s\"", g_dir);
    else snprintf(dev, sizeof dev, "\"cpu\"");
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 0, \"bf16\": {\"enabled\": true, "
             "\"bf16_optimizer_states\": %s}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
             "\"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.05}}, \"zero_optimization\": {\"stage\": 2, "
             "\"sub_group_size\": %d, \"offload_optimizer\": {\"device\": %s, \"ratio\": %g}}}",
             bf16_states ? "true" : "false", g_nvme ? NVME_SGS : 1000, dev, ratio);
    return buf;
}

typedef struct rig {
    zoff_config cfg;
    zoff_device *dev;
    void *params, *grads; /* device, bf16 */
    zoff_tensor_info t[2];
    zoff_engine *e;
} rig;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static void rig_open(rig *r, bool bf16_states, double ratio, zoff_state_rounding sr) {
    memset(r, 0, sizeof *r);
    char js[1024];
    OK(zoff_config_load_string(cfg_json(js, sizeof js, bf16_states, ratio), "test config", &r->cfg));
    OK(zoff_config_resolve_batch(&r->cfg, 1));
    OK(zoff_config_check_supported(&r->cfg));
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU};
    OK(zoff_device_create(&dopt, &r->dev));
    OK(zoff_device_alloc(r->dev, (size_t)N * 2, "test params", &r->params));
    OK(zoff_device_alloc(r->dev, (size_t)N * 2, "test grads", &r->grads));
    r->t[0] = (zoff_tensor_info){.name = "w", .offset = 0, .numel = N0, .ndim = 1, .shape = {N0}, .decay = true,
                                 .layer = -1};
    r->t[1] = (zoff_tensor_info){.name = "b", .offset = N0, .numel = N1, .ndim = 1, .shape = {N1}, .decay = false,
                                 .layer = -1};
    float *init = malloc((size_t)N * sizeof(float));
    assert_non_null(init);
    for (int i = 0; i < N; i++) init[i] = (float)(urand() - 0.5);
    zoff_engine_options eo = {.dev = r->dev, .cfg = &r->cfg, .tensors = r->t, .num_tensors = 2, .num_params = N,
                              .params = r->params, .grads = r->grads, .dtype = ZOFF_BF16, .init_params = init,
                              .state_rounding = sr};
    OK(zoff_engine_create(&eo, &r->e));
    free(init);
}

static void rig_close(rig *r) {
    zoff_engine_destroy(r->e);
    zoff_device_free(r->dev, r->params);
    zoff_device_free(r->dev, r->grads);
    zoff_device_destroy(r->dev);
    zoff_config_free(&r->cfg);
}

/* One optimizer step with the bf16 gradients g16. */
static void rig_step(rig *r, const uint16_t *g16) {
    zoff_stream *s = zoff_device_stream(r->dev);
    OK(zoff_engine_zero_grad(r->e));
    zoff_engine_begin_backward(r->e, true);
    OK(zoff_memcpy_async(s, r->grads, g16, (size_t)N * 2, ZOFF_COPY_H2D));
    zoff_engine_grad_ready(r->e, s, 0, N);
    zoff_step_info info;
    OK(zoff_engine_step(r->e, LR, &info));
    assert_false(info.skipped);
    OK(zoff_engine_flush(r->e));
}

static void random_grads(uint16_t *g16, double scale) {
    for (int i = 0; i < N; i++) g16[i] = zoff_f32_to_bf16((float)((urand() - 0.5) * scale * (1 + 10 * (i % 7 == 0))));
}

static double ulp_bf16(double x) {
    x = fabs(x);
    if (x < 1.1754943508222875e-38) return ldexp(1.0, -133);
    int ex;
    frexp(x, &ex); /* x = f 2^ex, f in [0.5, 1) */
    return ldexp(1.0, ex - 8);
}

static bool is_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return (u & 0xffffu) == 0;
}

static void engine_matches_reference(void) {
    rig r;
    rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_NEAREST);
    assert_int_equal(zoff_engine_state_dtype(r.e, 0), ZOFF_F32);
    assert_int_equal(zoff_engine_state_dtype(r.e, 1), ZOFF_BF16);
    assert_int_equal(zoff_engine_state_dtype(r.e, 2), ZOFF_BF16);
    assert_non_null(strstr(zoff_engine_describe(r.e), "bf16 m and v"));
    float *p0 = malloc(N * 4), *m0 = malloc(N * 4), *v0 = malloc(N * 4), *p1 = malloc(N * 4), *m1 = malloc(N * 4),
          *v1 = malloc(N * 4);
    uint16_t *g16 = malloc(N * 2), *w16 = malloc(N * 2);
    const double U = ldexp(1.0, -24); /* fp32 unit roundoff */
    for (int t = 1; t <= STEPS; t++) {
        OK(zoff_engine_state_get(r.e, 0, p0));
        OK(zoff_engine_state_get(r.e, 1, m0));
        OK(zoff_engine_state_get(r.e, 2, v0));
        random_grads(g16, t == 3 ? 1e-3 : 1.0); /* a small-gradient step: v decays */
        rig_step(&r, g16);
        OK(zoff_engine_state_get(r.e, 0, p1));
        OK(zoff_engine_state_get(r.e, 1, m1));
        OK(zoff_engine_state_get(r.e, 2, v1));
        const double bc1 = 1 - pow(B1, t), bc2 = 1 - pow(B2, t);
        for (int i = 0; i < N; i++) {
            double g = zoff_bf16_to_f32(g16[i]), wd = i < N0 ? WD : 0.0;
            double m = B1 * m0[i] + (1 - B1) * g, Sm = fabs(B1 * m0[i]) + (1 - B1) * fabs(g);
            double v = B2 * v0[i] + (1 - B2) * g * g, Sv = fabs(B2 * v0[i]) + (1 - B2) * g * g;
            double denom = sqrt(v) / sqrt(bc2) + EPS, u = m / denom;
            double p = p0[i] * (1 - LR * wd) - LR / bc1 * u;
            /* m, v: the nearest bf16 of values computed in fp32 (a few roundings of slack) */
            double bm = 8 * U * Sm + 0.5 * ulp_bf16(fabs(m) + 8 * U * Sm);
            double bv = 8 * U * Sv + 0.5 * ulp_bf16(fabs(v) + 8 * U * Sv);
            if (!(fabs(m1[i] - m) <= bm)) fail_msg("step %d m[%d]: %.9g, reference %.9g (bound %.3g)", t, i, m1[i], m, bm);
            if (!(fabs(v1[i] - v) <= bv)) fail_msg("step %d v[%d]: %.9g, reference %.9g (bound %.3g)", t, i, v1[i], v, bv);
            if (!is_bf16(m1[i]) || !is_bf16(v1[i])) fail_msg("step %d [%d]: m or v is not a bf16 value", t, i);
            double bp = 16 * U * (fabs(p0[i]) + LR / bc1 * fabs(u)) + 1e-30;
            if (!(fabs(p1[i] - p) <= bp)) fail_msg("step %d p[%d]: %.9g, reference %.9g (bound %.3g)", t, i, p1[i], p, bp);
        }
        /* the device weights are the new master rounded to bf16 */
        OK(zoff_memcpy_async(zoff_device_stream(r.dev), w16, r.params, (size_t)N * 2, ZOFF_COPY_D2H));
        OK(zoff_stream_synchronize(zoff_device_stream(r.dev)));
        for (int i = 0; i < N; i++) assert_int_equal(w16[i], zoff_f32_to_bf16(p1[i]));
    }
    rig_close(&r);
    free(p0), free(m0), free(v0), free(p1), free(m1), free(v1), free(g16), free(w16);
}

static void test_engine_matches_reference(void **st) {
    (void)st;
    g_nvme = false;
    engine_matches_reference();
}

/* ------------------------------------------------------------------ NVMe */

/* Bytes of the swap files in g_dir this process holds open (unlinked: found through /proc/self/fd). */
static size_t swap_file_bytes(int *nfiles) {
    char p[300], target[600];
    size_t total = 0, dl = strlen(g_dir);
    *nfiles = 0;
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        ssize_t l = readlink(p, target, sizeof target - 1);
        if (l <= 0) continue;
        target[l] = '\0';
        struct stat sb;
        if (!strncmp(target, g_dir, dl) && strstr(target, ".swp (deleted)") && stat(p, &sb) == 0) {
            total += (size_t)sb.st_size;
            (*nfiles)++;
        }
    }
    if (d) closedir(d);
    return total;
}

static size_t pad4k(size_t x) { return (x + 4095) / 4096 * 4096; }

static void nvme_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/zoff-bf16nv-XXXXXX");
    assert_non_null(mkdtemp(g_dir));
    g_nvme = true;
}
static void nvme_teardown(void) {
    g_nvme = false;
    assert_int_equal(rmdir(g_dir), 0); /* empty: the swap files went with their engines */
}

/* The double-precision reference with the state in the swap file. */
static void test_nvme_matches_reference(void **st) {
    (void)st;
    nvme_setup();
    engine_matches_reference();
    nvme_teardown();
}

/* cpu and nvme offload, stochastic rounding, several steps: master, m, v and the device weights
 * bit for bit; the swap file holds m and v in bf16 (its size from the layout, on disk). */
static void test_nvme_equals_cpu(void **st) {
    (void)st;
    nvme_setup();
    float *s[2][3];
    uint16_t *w[2];
    for (int k = 0; k < 2; k++) {
        g_nvme = k == 1;
        g_rng = 777;
        rig r;
        rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
        if (k == 1) {
            assert_non_null(strstr(zoff_engine_describe(r.e), "arrays 1-2 in bf16"));
            /* header + per sub-group: fp32 master, bf16 m, bf16 v, each padded (fp32 m, v: 53248) */
            size_t want = 4096;
            for (int lo = 0; lo < N; lo += NVME_SGS) {
                size_t c = (size_t)(N - lo < NVME_SGS ? N - lo : NVME_SGS);
                want += pad4k(4 * c) + 2 * pad4k(2 * c);
            }
            assert_int_equal(want, 36864);
            zoff_engine_memory m;
            zoff_engine_memory_usage(r.e, &m);
            int nf;
            size_t disk = swap_file_bytes(&nf);
            if (m.nvme != want || disk != want || nf != 1)
                fail_msg("swap file: engine says %zu bytes, on disk %zu in %d files, layout %zu", m.nvme, disk, nf, want);
            assert_int_equal(m.host_params, N);
        }
        uint16_t *g16 = malloc(N * 2);
        for (int t = 0; t < STEPS; t++) {
            random_grads(g16, t == 2 ? 1e-3 : 1.0);
            rig_step(&r, g16);
        }
        for (int i = 0; i < 3; i++) {
            s[k][i] = malloc(N * 4);
            OK(zoff_engine_state_get(r.e, i, s[k][i]));
        }
        w[k] = malloc(N * 2);
        OK(zoff_memcpy_async(zoff_device_stream(r.dev), w[k], r.params, (size_t)N * 2, ZOFF_COPY_D2H));
        OK(zoff_stream_synchronize(zoff_device_stream(r.dev)));
        free(g16);
        rig_close(&r);
    }
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < N; j++)
            if (memcmp(&s[0][i][j], &s[1][i][j], 4))
                fail_msg("state %d [%d]: cpu %.9g, nvme %.9g", i, j, s[0][i][j], s[1][i][j]);
        if (i > 0)
            for (int j = 0; j < N; j++) assert_true(is_bf16(s[1][i][j]));
        free(s[0][i]), free(s[1][i]);
    }
    assert_memory_equal(w[0], w[1], N * 2);
    free(w[0]), free(w[1]);
    nvme_teardown();
}

/* state get/set through the swap file: a round trip of bf16 values is exact, others round to
 * nearest-even; the file stays the size of bf16 m and v. */
static void test_nvme_state_get_set(void **st) {
    (void)st;
    nvme_setup();
    rig r;
    rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
    float *x = malloc(N * 4), *y = malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = (float)((urand() - 0.5) * 3.0);
    for (int a = 0; a < 3; a++) {
        OK(zoff_engine_state_set(r.e, a, x));
        OK(zoff_engine_state_get(r.e, a, y));
        for (int i = 0; i < N; i++)
            assert_true(y[i] == (a == 0 ? x[i] : zoff_bf16_to_f32(zoff_f32_to_bf16(x[i]))));
    }
    int nf;
    assert_int_equal(swap_file_bytes(&nf), 36864);
    rig_close(&r);
    free(x), free(y);
    nvme_teardown();
}

/* The default stochastic rounding: the same update within one bf16 ulp of m and v, and the
 * same results for the same steps (the random bits hash the index and the step). */
static void test_stochastic_reproducible(void **st) {
    (void)st;
    float *a[2];
    for (int k = 0; k < 2; k++) {
        rig r;
        g_rng = 12345;
        rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
        uint16_t *g16 = malloc(N * 2);
        for (int t = 0; t < 3; t++) {
            random_grads(g16, 1.0);
            rig_step(&r, g16);
        }
        a[k] = malloc(N * 4);
        OK(zoff_engine_state_get(r.e, 2, a[k]));
        for (int i = 0; i < N; i++) assert_true(is_bf16(a[k][i]));
        free(g16);
        rig_close(&r);
    }
    assert_memory_equal(a[0], a[1], N * 4);
    free(a[0]), free(a[1]);
}

/* Host bytes: 10 per parameter with bf16 states (14 with fp32), as the placement says. */
static void test_host_bytes(void **st) {
    (void)st;
    for (int b = 0; b < 2; b++) {
        rig r;
        rig_open(&r, b == 1, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
        zoff_engine_memory m;
        zoff_engine_memory_usage(r.e, &m);
        assert_int_equal(m.host_params, N);
        assert_int_equal(m.pinned + m.pageable, (size_t)N * (b ? 10 : 14));
        zoff_host_buffers hb;
        zoff_host_buffers_in in = {.n_host = N, .dtype = ZOFF_BF16, .state_arrays = 3,
                                   .state_dt = zoff_optimizer_state_dtype(&r.cfg), .stage = 2};
        zoff_placement_host_buffers(&in, &hb);
        assert_int_equal(hb.total, m.pinned + m.pageable);
        assert_int_equal(hb.state, (size_t)N * (b ? 8 : 12));
        /* speculation's rollback copy: master 4 + m, v of the state dtype */
        r.cfg.zero.offload_optimizer.super_offload = true;
        assert_int_equal(zoff_placement_spec_backup_bytes(&r.cfg, 1000), 1000u * (b ? 8 : 12));
        r.cfg.zero.offload_optimizer.super_offload = false;
        rig_close(&r);
    }
}

/* get widens bf16 exactly, set rounds to nearest-even: a round trip of bf16 values is exact. */
static void test_state_get_set(void **st) {
    (void)st;
    rig r;
    rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
    float *x = malloc(N * 4), *y = malloc(N * 4);
    for (int i = 0; i < N; i++) x[i] = (float)((urand() - 0.5) * 3.0);
    OK(zoff_engine_state_set(r.e, 1, x));
    OK(zoff_engine_state_get(r.e, 1, y));
    for (int i = 0; i < N; i++) assert_true(y[i] == zoff_bf16_to_f32(zoff_f32_to_bf16(x[i])));
    OK(zoff_engine_state_range(r.e, 1, 100, 50, x, false)); /* pieces too */
    OK(zoff_engine_state_get(r.e, 1, y));
    for (int i = 100; i < 150; i++) assert_true(y[i] == zoff_bf16_to_f32(zoff_f32_to_bf16(x[i - 100])));
    rig_close(&r);
    free(x), free(y);
}

/* The state in the dtype the engine keeps it (zoff_engine_state_range_as, zoff_engine_snapshot_read_as: what a
 * checkpoint of bf16 m and v stores and loads, copied as they are): each bf16 value is the high half of the fp32
 * the fp32 range gives (bf16's definition: widening appends 16 zero bits), in memory, in the NVMe swap file and
 * through a save's snapshot; a bf16 range set reads back widened, exactly; any other dtype is refused. */
static void check_range_as(bool nvme) {
    if (nvme) nvme_setup();
    rig r;
    rig_open(&r, true, 1.0, ZOFF_STATE_ROUND_STOCHASTIC);
    uint16_t *g16 = malloc(N * 2), *h = malloc(N * 2);
    float *f = malloc(N * 4);
    for (int t = 0; t < 2; t++) {
        random_grads(g16, 1.0);
        rig_step(&r, g16);
    }
    for (int a = 1; a < 3; a++) {
        OK(zoff_engine_state_range(r.e, a, 0, N, f, true));
        memset(h, 0xa5, N * 2);
        OK(zoff_engine_state_range_as(r.e, a, 0, 1234, ZOFF_BF16, h, true)); /* in two pieces, across sub-groups */
        OK(zoff_engine_state_range_as(r.e, a, 1234, N - 1234, ZOFF_BF16, h + 1234, true));
        for (int i = 0; i < N; i++) {
            uint32_t u;
            memcpy(&u, &f[i], 4);
            if (h[i] != (uint16_t)(u >> 16) || (u & 0xffffu) != 0)
                fail_msg("state %d element %d: bf16 0x%04x, fp32 0x%08x", a, i, h[i], u);
        }
        if (!nvme) { /* the snapshot of a background save reads the same */
            OK(zoff_engine_snapshot_begin(r.e, (size_t)-1));
            memset(h, 0x5a, N * 2);
            OK(zoff_engine_snapshot_read_as(r.e, a, 0, N, ZOFF_BF16, h));
            zoff_engine_snapshot_finish(r.e, NULL);
            for (int i = 0; i < N; i++) {
                uint32_t u;
                memcpy(&u, &f[i], 4);
                assert_int_equal(h[i], u >> 16);
            }
        }
    }
    for (int i = 0; i < 300; i++) h[i] = (uint16_t)(0x3c00 + 37 * i); /* bf16 values 2^-7 .. */
    OK(zoff_engine_state_range_as(r.e, 2, 1900, 300, ZOFF_BF16, h, false));
    OK(zoff_engine_state_range(r.e, 2, 1900, 300, f, true));
    for (int i = 0; i < 300; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float x;
        memcpy(&x, &u, 4);
        assert_true(f[i] == x);
    }
    assert_int_equal(zoff_engine_state_range_as(r.e, 0, 0, 10, ZOFF_BF16, h, true), ZOFF_ERR_INVALID); /* master: fp32 */
    assert_non_null(strstr(zoff_last_error(), "ask for f32"));
    assert_int_equal(zoff_engine_state_range_as(r.e, 1, 0, 10, ZOFF_F16, h, true), ZOFF_ERR_INVALID);
    assert_int_equal(zoff_engine_state_range_as(r.e, 1, N - 5, 10, ZOFF_BF16, h, true), ZOFF_ERR_INVALID);
    rig_close(&r);
    if (nvme) nvme_teardown();
    if (!nvme) { /* Twin-Flow: the engine keeps fp32 state on the device, so m and v are fp32 here */
        rig_open(&r, true, 0.5, ZOFF_STATE_ROUND_STOCHASTIC);
        assert_int_equal(zoff_engine_state_range_as(r.e, 1, 0, 10, ZOFF_BF16, h, true), ZOFF_ERR_INVALID);
        OK(zoff_engine_state_range_as(r.e, 1, 0, 10, ZOFF_F32, f, true));
        rig_close(&r);
    }
    free(g16), free(h), free(f);
}

static void test_state_range_as(void **st) {
    (void)st;
    check_range_as(false);
    check_range_as(true);
}

/* Twin-Flow (ratio < 1): the device part keeps fp32 state; the host part bf16 (10 B/param);
 * a checkpoint of such a run stores fp32 m and v (every rank agrees). */
static void test_twin_flow(void **st) {
    (void)st;
    rig r;
    rig_open(&r, true, 0.5, ZOFF_STATE_ROUND_STOCHASTIC);
    zoff_engine_memory m;
    zoff_engine_memory_usage(r.e, &m);
    assert_true(m.host_params > 0 && m.host_params < N);
    assert_int_equal(m.pinned + m.pageable, (size_t)m.host_params * 10);
    assert_int_equal(zoff_engine_state_dtype(r.e, 1), ZOFF_F32);
    uint16_t *g16 = malloc(N * 2);
    random_grads(g16, 1.0);
    rig_step(&r, g16);
    float *v = malloc(N * 4);
    OK(zoff_engine_state_get(r.e, 2, v));
    int nonbf16 = 0;
    for (int i = 0; i < N; i++) nonbf16 += !is_bf16(v[i]);
    assert_true(nonbf16 > 0); /* the device's fp32 part */
    rig_close(&r);
    free(g16), free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_matches_reference), cmocka_unit_test(test_stochastic_reproducible),
        cmocka_unit_test(test_host_bytes),               cmocka_unit_test(test_state_get_set),
        cmocka_unit_test(test_twin_flow),                cmocka_unit_test(test_nvme_matches_reference),
        cmocka_unit_test(test_nvme_equals_cpu),          cmocka_unit_test(test_nvme_state_get_set),
        cmocka_unit_test(test_state_range_as),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
