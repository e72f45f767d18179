/* zoff plan: the machine's sizes and rates.
 *
 * Sizes: host memory from /proc/meminfo (MemAvailable), the pinned limit from
 * RLIMIT_MEMLOCK (`ulimit -l`), free disk at the nvme path (zoff_disk_free).
 * Rates, in order of preference: `zoff bench ... --json` files, the quick
 * built-in probes below (about a second), fixed assumed figures. Each rate
 * records where it came from; docs/plan.md lists the assumed figures. */
#define _GNU_SOURCE
#include "zoff/plan.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include "zoff/resources.h"

#include "zoff/engine.h"
#include "zoff/optim.h"

#define MiB ((size_t)1 << 20)

/* The assumed rates (docs/plan.md "Assumed figures"), all with source ZOFF_PLAN_SRC_ASSUMED. */
/* a PCIe Gen4/5 GPU server */
/* (host_adam: assumed, the host optimizer's rate is derived from host_mem_bw: zoff_plan_host_rate) */
static const zoff_plan_rates k_cuda_rates = {.device_flops = 150e12, .device_adam = 50e9, .host_adam = 0,
                                             .host_mem_bw = 100e9, .h2d = 20e9, .d2h = 20e9,
                                             .disk_read = 3e9, .disk_write = 2e9, .link = 100e9};
/* the CPU backend on a small machine (2 cores) */
static const zoff_plan_rates k_cpu_rates = {.device_flops = 20e9, .device_adam = 100e6, .host_adam = 0,
                                            .host_mem_bw = 10e9, .h2d = 5e9, .d2h = 5e9,
                                            .disk_read = 1e9, .disk_write = 0.5e9, .link = 10e9};

double zoff_plan_host_rate(const zoff_plan_rates *r, const zoff_config *cfg, zoff_dtype dt, bool bf16_states) {
    const int moments = zoff_optimizer_state_arrays(cfg) - 1;
    const bool p16 = dt != ZOFF_F32;
    const double mode = zoff_host_optimizer_traffic(moments, bf16_states ? ZOFF_BF16 : ZOFF_F32, dt, p16);
    if (r->src_host_adam == ZOFF_PLAN_SRC_ASSUMED) return r->host_mem_bw / mode;
    return r->host_adam * zoff_host_optimizer_traffic(moments, ZOFF_F32, dt, p16) / mode;
}

void zoff_plan_machine_defaults(zoff_plan_machine *m, zoff_backend_kind backend) {
    memset(m, 0, sizeof *m);
    m->backend = backend;
    m->ranks = 1;
    m->ranks_per_node = 1;
    m->margin = 0.10;
    m->pinned_limit = SIZE_MAX;
    /* the process itself: libraries, OpenMP/OpenBLAS threads and buffers, the
     * GPT-2 tokenizer tables (measured RSS of a tiny `zoff train`: docs/plan.md) */
    m->process_baseline = 256 * MiB;
    if (backend == ZOFF_BACKEND_CUDA) {
        m->runtime_reserve = 512 * MiB; /* CUDA context, cuBLASLt workspaces, per-stream scratch */
        m->rates = k_cuda_rates;
    } else {
        m->rates = k_cpu_rates;
    }
}

/* Free bytes at path (zoff_disk_free) and the device of the file system they are on; false, with a
 * warning, where they cannot be read. */
static bool disk_at(const char *path, size_t *bytes, dev_t *dev) {
    char where[4096];
    struct stat st;
    if (!zoff_disk_free(path, bytes, where, sizeof where) || stat(where, &st) != 0) {
        zoff_log(ZOFF_LOG_WARN, "zoff plan: cannot read free space at %s: %s", path, strerror(errno));
        return false;
    }
    *dev = st.st_dev;
    return true;
}

zoff_status zoff_plan_machine_detect(zoff_plan_machine *m, const char *disk_path, const char *param_disk_path) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb, avail = 0, total = 0;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb;
            else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = kb;
        }
        fclose(f);
        m->host_bytes = (size_t)(avail ? avail : total) * 1024;
    }
    /* ulimit -l binds pinned memory only where pinning locks pages: not on the CPU backend,
     * whose "pinned" memory is ordinary aligned memory (zoff train runs such settings fine) */
    struct rlimit rl;
    if (m->backend != ZOFF_BACKEND_CPU && getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
        m->pinned_limit = rl.rlim_cur == RLIM_INFINITY ? SIZE_MAX : (size_t)rl.rlim_cur;
    if (!disk_path || !*disk_path) return ZOFF_OK;
    size_t b = 0, pb = 0;
    dev_t dev = 0, pdev = 0;
    const bool ok = disk_at(disk_path, &b, &dev);
    m->disk_bytes = ok ? b : 0;
    snprintf(m->disk_path, sizeof m->disk_path, "%s", disk_path);
    if (param_disk_path && *param_disk_path && strcmp(param_disk_path, disk_path) != 0) {
        const bool pok = disk_at(param_disk_path, &pb, &pdev);
        m->param_disk_own = !ok || !pok || pdev != dev; /* unknown: checked on its own (and not said to fit) */
        m->param_disk_bytes = m->param_disk_own && pok ? pb : 0;
        if (m->param_disk_own) snprintf(m->param_disk_path, sizeof m->param_disk_path, "%s", param_disk_path);
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ probes */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double best_of(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[0];
}

/* FLOPs of forward + backward for one batch (the same formula as plan.c). */
static double probe_flops(int64_t L, int64_t C, int64_t B, int64_t T, int64_t Vp) {
    double N = (double)(B * T), blocks = 2.0 * N * (double)L * 12.0 * (double)C * (double)C +
                                         4.0 * (double)B * (double)T * (double)T * (double)C * (double)L;
    return 3.0 * (blocks + 2.0 * N * (double)Vp * (double)C);
}

/* A small GPT-2 on the device: forward + backward, effective FLOP/s. */
static zoff_status probe_compute(zoff_device *dev, const zoff_gpt2_options *model, double *flops) {
    const bool cuda = zoff_device_kind(dev) == ZOFF_BACKEND_CUDA;
    int64_t C = model->shape.hidden_size, NH = model->shape.num_heads, HS = C / NH;
    if (!cuda && C > 512) { /* keep it short on the CPU backend; same head size where it divides */
        C = 512;
        NH = HS <= 512 && 512 % HS == 0 ? 512 / HS : 8;
    }
    int64_t T = model->seq_len < (cuda ? 1024 : 256) ? model->seq_len : (cuda ? 1024 : 256);
    int64_t B = cuda ? model->batch_size : 1;
    if (!cuda && T < 128) B = (128 + T - 1) / T;
    int64_t V = model->shape.vocab_size < (cuda ? 65536 : 4096) ? model->shape.vocab_size : (cuda ? 65536 : 4096);
    zoff_gpt2_options o = {.shape = {.num_layers = cuda ? 2 : 1, .hidden_size = C, .num_heads = NH, .max_seq_len = T,
                                     .vocab_size = V},
                           .batch_size = B, .seq_len = T, .dtype = model->dtype};
    zoff_gpt2 *m = NULL;
    int32_t *tok = NULL;
    int32_t *host = NULL;
    zoff_status s = zoff_gpt2_create(dev, &o, &m);
    size_t tb = (size_t)(B * T) * sizeof(int32_t);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, tb, "plan probe tokens", (void **)&tok);
    if (s == ZOFF_OK && !(host = malloc(tb))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    zoff_stream *st = zoff_device_stream(dev);
    double t[4];
    for (int i = 0; s == ZOFF_OK && i < 5; i++) {
        if (i == 0) {
            for (int64_t k = 0; k < B * T; k++) host[k] = (int32_t)((k * 7919) % V);
            s = zoff_memcpy_async(st, tok, host, tb, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
            if (s != ZOFF_OK) break;
        }
        double t0 = zoff_now();
        s = zoff_gpt2_forward_train(m, tok, tok, B, T, 1.0f);
        if (s == ZOFF_OK) s = zoff_gpt2_backward(m, NULL, NULL);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        if (i > 0) t[i - 1] = zoff_now() - t0; /* the first is a warm-up */
    }
    if (s == ZOFF_OK) *flops = probe_flops(o.shape.num_layers, C, B, T, zoff_gpt2_get_shape(m)->padded_vocab_size) /
                               best_of(t, 4);
    free(host);
    if (tok) zoff_device_free(dev, tok);
    zoff_gpt2_destroy(m);
    return s;
}

/* The device's fused Adam (the stage-0 / Twin-Flow device optimizer). */
static zoff_status probe_device_adam(zoff_device *dev, zoff_dtype dt, double *rate) {
    const int64_t n = zoff_device_kind(dev) == ZOFF_BACKEND_CUDA ? (int64_t)64 << 20 : (int64_t)2 << 20;
    const size_t es = zoff_dtype_size(dt);
    float *p = NULL, *mm = NULL, *v = NULL;
    void *g = NULL, *p16 = NULL;
    zoff_status s = zoff_device_alloc(dev, (size_t)n * 4, "plan probe params", (void **)&p);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)n * 4, "plan probe m", (void **)&mm);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)n * 4, "plan probe v", (void **)&v);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)n * es, "plan probe grads", &g);
    if (s == ZOFF_OK && dt != ZOFF_F32) s = zoff_device_alloc(dev, (size_t)n * es, "plan probe params16", &p16);
    zoff_stream *st = zoff_device_stream(dev);
    if (s == ZOFF_OK) s = zoff_memset_async(st, p, 0, (size_t)n * 4);
    if (s == ZOFF_OK) s = zoff_memset_async(st, mm, 0, (size_t)n * 4);
    if (s == ZOFF_OK) s = zoff_memset_async(st, v, 0, (size_t)n * 4);
    if (s == ZOFF_OK) s = zoff_memset_async(st, g, 0, (size_t)n * es);
    double t[3];
    for (int i = 0; s == ZOFF_OK && i < 4; i++) {
        zoff_op_adam_args a = {.params = p, .m = mm, .v = v, .grads = g, .params16 = p16, .n = n, .grad_dt = dt,
                               .p16_dt = dt == ZOFF_F32 ? ZOFF_BF16 : dt, .lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.999f,
                               .eps = 1e-8f, .weight_decay = 0.0f, .bc1 = 0.1f, .bc2 = 0.001f, .grad_scale = 1.0f,
                               .adam_w_mode = 1};
        s = zoff_stream_synchronize(st);
        double t0 = zoff_now();
        if (s == ZOFF_OK) s = ZOFF_LAUNCH(st, ZOFF_OP_ADAM, a);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        if (i > 0) t[i - 1] = zoff_now() - t0;
    }
    if (s == ZOFF_OK) *rate = (double)n / best_of(t, 3);
    zoff_device_free(dev, p);
    zoff_device_free(dev, mm);
    zoff_device_free(dev, v);
    zoff_device_free(dev, g);
    zoff_device_free(dev, p16);
    return s;
}

/* Pinned host <-> device copies. */
static zoff_status probe_copies(zoff_device *dev, double *h2d, double *d2h) {
    const size_t bytes = 64 * MiB;
    void *h = NULL, *d = NULL;
    zoff_status s = zoff_host_alloc_pinned(dev, bytes, "plan probe pinned", &h);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, bytes, "plan probe copy", &d);
    if (s == ZOFF_OK) memset(h, 1, bytes);
    zoff_stream *st = zoff_device_stream(dev);
    double th[3], td[3];
    for (int i = 0; s == ZOFF_OK && i < 4; i++) {
        double t0 = zoff_now();
        s = zoff_memcpy_async(st, d, h, bytes, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        double t1 = zoff_now();
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, h, d, bytes, ZOFF_COPY_D2H);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        if (i > 0) {
            th[i - 1] = t1 - t0;
            td[i - 1] = zoff_now() - t1;
        }
    }
    if (s == ZOFF_OK) {
        *h2d = (double)bytes / best_of(th, 3);
        *d2h = (double)bytes / best_of(td, 3);
    }
    zoff_device_free(dev, d);
    zoff_host_free_pinned(dev, h);
    return s;
}

/* The host optimizer on the engine's dtypes, and its STREAM-style bound. */
static zoff_status probe_host_adam(const zoff_config *cfg, zoff_dtype dt, double *rate, double *bw) {
    const int64_t n = (int64_t)4 << 20;
    const size_t es = zoff_dtype_size(dt);
    zoff_host_optimizer *opt = NULL;
    ZOFF_TRY(zoff_host_optimizer_create(&cfg->optimizer, 0, &opt));
    float *p = zoff_aligned_alloc(64, (size_t)n * 4, "plan probe master");
    float *m = zoff_aligned_alloc(64, (size_t)n * 4, "plan probe exp_avg");
    float *v = zoff_aligned_alloc(64, (size_t)n * 4, "plan probe exp_avg_sq");
    void *g = zoff_aligned_alloc(64, (size_t)n * es, "plan probe grads");
    void *p16 = dt != ZOFF_F32 ? zoff_aligned_alloc(64, (size_t)n * es, "plan probe params16") : NULL;
    zoff_status s = ZOFF_OK;
    if (!p || !m || !v || !g || (dt != ZOFF_F32 && !p16)) s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) {
        memset(p, 0, (size_t)n * 4);
        memset(g, 0, (size_t)n * es);
        if (p16) memset(p16, 0, (size_t)n * es);
    }
    zoff_optim_tensors t = {.params = p,
                            .exp_avg = zoff_host_optimizer_uses_exp_avg(opt) ? m : NULL,
                            .exp_avg_sq = zoff_host_optimizer_uses_exp_avg_sq(opt) ? v : NULL,
                            .state_dt = ZOFF_F32, .grads = g, .grad_dt = dt, .params16 = p16,
                            .p16_dt = dt == ZOFF_F32 ? ZOFF_BF16 : dt, .n = n};
    if (s == ZOFF_OK) s = zoff_host_optimizer_init_state(opt, &t);
    double tu[3], tb[3];
    for (int i = 0; s == ZOFF_OK && i < 4; i++) {
        double t0 = zoff_now();
        s = zoff_host_optimizer_bandwidth_probe(opt, &t);
        double t1 = zoff_now();
        if (s == ZOFF_OK) s = zoff_host_optimizer_begin_step(opt, i + 1, 1e-4);
        if (s == ZOFF_OK) s = zoff_host_optimizer_update(opt, &t, 0.0, 1.0);
        if (i > 0) {
            tb[i - 1] = t1 - t0;
            tu[i - 1] = zoff_now() - t1;
        }
    }
    if (s == ZOFF_OK) {
        *rate = (double)n / best_of(tu, 3);
        *bw = zoff_host_optimizer_bytes_per_param(opt, &t) * (double)n / best_of(tb, 3);
    }
    zoff_aligned_free(p);
    zoff_aligned_free(m);
    zoff_aligned_free(v);
    zoff_aligned_free(g);
    zoff_aligned_free(p16);
    zoff_host_optimizer_destroy(opt);
    return s;
}

#define PROBE_TRY(expr, what)                                              \
    do {                                                                   \
        zoff_status ps_ = (expr);                                          \
        if (ps_ != ZOFF_OK) return zoff_error_context(ps_, "%s probe", what); \
    } while (0)

zoff_status zoff_plan_probe(zoff_device *dev, const zoff_config *cfg, const zoff_gpt2_options *model,
                            zoff_plan_machine *m) {
    zoff_plan_rates *r = &m->rates;
    double a = 0, b = 0;
    if (r->src_compute < ZOFF_PLAN_SRC_BENCH) {
        PROBE_TRY(probe_compute(dev, model, &a), "compute");
        r->device_flops = a;
        r->src_compute = ZOFF_PLAN_SRC_PROBE;
    }
    if (r->src_device_adam < ZOFF_PLAN_SRC_BENCH) {
        PROBE_TRY(probe_device_adam(dev, model->dtype, &a), "device Adam");
        r->device_adam = a;
        r->src_device_adam = ZOFF_PLAN_SRC_PROBE;
    }
    if (r->src_copy < ZOFF_PLAN_SRC_BENCH) {
        PROBE_TRY(probe_copies(dev, &a, &b), "copy");
        r->h2d = a;
        r->d2h = b;
        r->src_copy = ZOFF_PLAN_SRC_PROBE;
    }
    if (r->src_host_adam < ZOFF_PLAN_SRC_BENCH) {
        PROBE_TRY(probe_host_adam(cfg, model->dtype, &a, &b), "host optimizer");
        r->host_adam = a;
        r->host_mem_bw = b;
        r->src_host_adam = ZOFF_PLAN_SRC_PROBE;
    }
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ bench files */

static zoff_status num_field(json_t *o, const char *key, const char *path, const char *where, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return zoff_error(ZOFF_ERR_FORMAT, "%s: %s has no positive number \"%s\"", path, where, key);
    *out = json_number_value(v);
    return ZOFF_OK;
}

static void note_file(zoff_plan_rates *r, const char *path) {
    size_t used = strlen(r->bench_files);
    snprintf(r->bench_files + used, sizeof r->bench_files - used, "%s%s", used ? ", " : "", path);
}

static zoff_status read_bench_adam(json_t *root, const char *path, zoff_dtype dt, zoff_plan_rates *r) {
    const char *want = dt == ZOFF_F32 ? "fp32-grads" : dt == ZOFF_BF16 ? "bf16-grads+bf16-copy" : "fp16-grads+fp16-copy";
    json_t *modes = json_object_get(root, "modes");
    size_t i;
    json_t *md;
    json_array_foreach(modes, i, md) {
        const char *name = json_string_value(json_object_get(md, "mode"));
        if (!name || strcmp(name, want) != 0) continue;
        double pps = 0, bw = 0;
        ZOFF_TRY(num_field(md, "params_per_s", path, want, &pps));
        ZOFF_TRY(num_field(md, "bound_gb_per_s", path, want, &bw));
        r->host_adam = pps;
        r->host_mem_bw = bw * 1e9;
        r->src_host_adam = ZOFF_PLAN_SRC_BENCH;
        return ZOFF_OK;
    }
    return zoff_error(ZOFF_ERR_FORMAT,
                      "%s: zoff bench adam output without mode \"%s\" (the mode of the planned dtype %s); run "
                      "zoff bench adam --json without --mode, or with --mode %s",
                      path, want, zoff_dtype_name(dt), want);
}

static zoff_status read_bench_step(json_t *root, const char *path, zoff_dtype dt, zoff_plan_machine *m) {
    zoff_plan_rates *r = &m->rates;
    json_t *sh = json_object_get(root, "shape"), *dev = json_object_get(json_object_get(root, "configs"), "device-optimizer");
    if (!json_is_object(sh) || !json_is_object(dev))
        return zoff_error(ZOFF_ERR_FORMAT, "%s: zoff bench step output without \"shape\" or configs.\"device-optimizer\"",
                          path);
    double L = 0, C = 0, T = 0, V = 0, B = 0, fwd = 0, bwd = 0, step = 0;
    ZOFF_TRY(num_field(sh, "layers", path, "shape", &L));
    ZOFF_TRY(num_field(sh, "hidden", path, "shape", &C));
    ZOFF_TRY(num_field(sh, "seq", path, "shape", &T));
    ZOFF_TRY(num_field(sh, "vocab", path, "shape", &V));
    ZOFF_TRY(num_field(root, "micro_batch", path, "the top level", &B));
    ZOFF_TRY(num_field(dev, "forward", path, "configs.device-optimizer", &fwd));
    ZOFF_TRY(num_field(dev, "backward", path, "configs.device-optimizer", &bwd));
    ZOFF_TRY(num_field(dev, "step", path, "configs.device-optimizer", &step));
    const char *bdt = json_string_value(json_object_get(root, "dtype"));
    const char *pdt = dt == ZOFF_F32 ? "f32" : dt == ZOFF_BF16 ? "bf16" : "fp16";
    if (bdt && strcmp(bdt, pdt) != 0)
        zoff_log(ZOFF_LOG_WARN, "zoff plan: %s was measured with %s weights, the plan is for %s: its compute rate may "
                 "not carry over (run zoff bench step --dtype %s --json)", path, bdt, pdt, pdt);
    const char *bk = json_string_value(json_object_get(root, "backend"));
    const char *pk = m->backend == ZOFF_BACKEND_CUDA ? "cuda" : "cpu";
    if (bk && strcmp(bk, pk) != 0)
        return zoff_error(ZOFF_ERR_FORMAT, "%s was measured on the %s backend, but the plan is for %s", path, bk, pk);
    int64_t Li = (int64_t)L, Ci = (int64_t)C, Ti = (int64_t)T, Vp = ((int64_t)V + 127) / 128 * 128, Bi = (int64_t)B;
    r->device_flops = probe_flops(Li, Ci, Bi, Ti, Vp) / (fwd + bwd);
    r->src_compute = ZOFF_PLAN_SRC_BENCH;
    /* the rest of the device-optimizer step is the device Adam over all parameters */
    const zoff_gpt2_shape probed = {.num_layers = Li, .hidden_size = Ci, .max_seq_len = Ti, .vocab_size = Vp};
    double n = (double)zoff_gpt2_count_params(&probed);
    if (step - fwd - bwd > 0 && r->src_device_adam < ZOFF_PLAN_SRC_BENCH) {
        r->device_adam = n / (step - fwd - bwd);
        r->src_device_adam = ZOFF_PLAN_SRC_BENCH;
    }
    return ZOFF_OK;
}

zoff_status zoff_plan_read_bench(const char *path, zoff_dtype dtype, zoff_plan_machine *m) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return zoff_error(ZOFF_ERR_FORMAT, "%s: not a JSON file (%s at line %d); pass the output of zoff bench adam|step|nvme --json",
                          path, je.text, je.line);
    zoff_status s;
    const char *kind = json_string_value(json_object_get(root, "bench"));
    zoff_plan_rates *r = &m->rates;
    if (kind && !strcmp(kind, "adam")) {
        s = read_bench_adam(root, path, dtype, r);
    } else if (json_is_object(json_object_get(root, "io"))) { /* zoff bench nvme: the swapper's own rates */
        json_t *io = json_object_get(root, "io");
        double rd = 0, wr = 0;
        s = num_field(json_object_get(io, "read"), "swapper_bps", path, "io.read", &rd);
        if (s == ZOFF_OK) s = num_field(json_object_get(io, "write"), "swapper_bps", path, "io.write", &wr);
        if (s == ZOFF_OK) {
            r->disk_read = rd;
            r->disk_write = wr;
            r->src_disk = ZOFF_PLAN_SRC_BENCH;
        }
    } else if (json_is_object(json_object_get(root, "configs"))) {
        s = read_bench_step(root, path, dtype, m);
    } else {
        s = zoff_error(ZOFF_ERR_FORMAT,
                       "%s: not the output of zoff bench adam|step|nvme --json (no \"bench\": \"adam\", no "
                       "\"configs\", no \"io\")",
                       path);
    }
    json_decref(root);
    if (s == ZOFF_OK) note_file(r, path);
    return s;
}
