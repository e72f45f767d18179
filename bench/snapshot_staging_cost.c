/* What a background save's staging costs the optimizer update that stages (the first update
 * after the save's start), on one host sub-group of N parameters (fp32 master, m and v, or bf16
 * m and v; bf16 gradients and weight copy), with the host optimizer's threads. Rounds
 * interleave, medians reported:
 *   plain:  one zoff_host_optimizer_update;
 *   staged: the same with a before_write hook that streams the old master, m and v of each block
 *           to a staging buffer just before the kernel updates it (what the snapshot's hook does
 *           for blocks wholly inside the sub-group, zoff_eng_snap_before_write);
 *   shifted: the same, each staging copy starting 4 bytes past a cache line and a page (as the snapshot's
 *           slots hold blocks shifted to lie aligned as in the checkpoint file: line-misaligned streams);
 *   bound:  the hook streams the master only: the least any scheme that keeps the old m and v in
 *           place can cost, were the kernel to write the new m and v elsewhere with streaming
 *           stores (as many bytes as writing them back in place).
 * Build and run (Release build in build/):
 *   cc -O2 -Iinclude bench/snapshot_staging_cost.c build/libzoff.a -fopenmp -lm -lpthread -o /tmp/staging_cost
 *   /tmp/staging_cost [N (default 33554432)] [rounds (default 15)] [threads (default: the optimizer's)] [bf16-states: 1] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zoff/core.h"
#include "zoff/optim.h"
#include "bench_util.h"

typedef struct staging {
    float *p;
    char *m, *v;
    float *sp;
    char *sm, *sv;
    size_t ss;
    int all;      /* 1: master, m and v; 0: the master only */
    size_t shift; /* bytes past the staging arrays' (aligned) starts */
} staging;

static void stage_hook(void *ctx, int64_t lo, int64_t hi) {
    const staging *s = ctx;
    const size_t n = (size_t)(hi - lo), o = (size_t)lo;
    zoff_copy_streaming((char *)s->sp + s->shift + o * sizeof(float), s->p + o, n * sizeof(float));
    if (s->all) {
        zoff_copy_streaming(s->sm + s->shift + o * s->ss, s->m + o * s->ss, n * s->ss);
        zoff_copy_streaming(s->sv + s->shift + o * s->ss, s->v + o * s->ss, n * s->ss);
    }
    zoff_store_fence(); /* as the snapshot's hook: the copy in memory before its count says so */
}

static void *filled(size_t bytes, int byte) {
    void *p = zoff_aligned_alloc(4096, bytes, "bench array");
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    memset(p, byte, bytes); /* faulted in before any timing */
    return p;
}

int main(int argc, char **argv) {
    const int64_t n = argc > 1 ? atoll(argv[1]) : (int64_t)1 << 25;
    const int rounds = argc > 2 ? atoi(argv[2]) : 15, threads = argc > 3 ? atoi(argv[3]) : 0;
    const bool bf16s = argc > 4 && atoi(argv[4]) == 1;
    if (n <= 0 || rounds <= 0 || rounds > 1000 || threads < 0) {
        fprintf(stderr, "usage: %s [N > 0] [rounds 1..1000] [threads >= 0] [bf16-states: 1]\n", argv[0]);
        return 2;
    }
    const zoff_dtype sdt = bf16s ? ZOFF_BF16 : ZOFF_F32;
    const size_t ss = zoff_dtype_size(sdt), f4 = sizeof(float);
    staging st = {.p = filled((size_t)n * f4, 0), .m = filled((size_t)n * ss, 0), .v = filled((size_t)n * ss, 0),
                  .sp = filled((size_t)n * f4 + 4096, 0), .sm = filled((size_t)n * ss + 4096, 0),
                  .sv = filled((size_t)n * ss + 4096, 0),
                  .ss = ss};
    uint16_t *g = filled((size_t)n * 2, 0x3c), *p16 = filled((size_t)n * 2, 0);
    for (int64_t i = 0; i < n; i++) st.p[i] = 0.01f * (float)(i % 101);
    zoff_optimizer_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.type = ZOFF_OPTIM_ADAMW;
    cfg.lr = 1e-3;
    cfg.beta1 = 0.9;
    cfg.beta2 = 0.999;
    cfg.eps = 1e-8;
    cfg.weight_decay = 0.01;
    cfg.bias_correction = true;
    cfg.adam_w_mode = true;
    zoff_host_optimizer_options o = {.threads = threads};
    zoff_host_optimizer *opt = NULL;
    CHECK(zoff_host_optimizer_create_ex(&cfg, &o, &opt));
    enum { MODES = 4 };
    static const char *name[MODES] = {"plain", "staged (master, m, v streamed)", "staged, copies shifted 4 B",
                                      "bound (master streamed only)"};
    double *t[MODES];
    for (int k = 0; k < MODES; k++) t[k] = calloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < MODES; k++) {
            CHECK(zoff_host_optimizer_begin_step(opt, r * MODES + k + 1, 1e-3));
            zoff_optim_tensors tt = {.params = st.p, .exp_avg = st.m, .exp_avg_sq = st.v, .state_dt = sdt,
                                     .grads = g, .grad_dt = ZOFF_BF16, .params16 = p16, .p16_dt = ZOFF_BF16, .n = n};
            st.all = k == 1 || k == 2;
            st.shift = k == 2 ? 4 : 0;
            if (k > 0) {
                tt.before_write = stage_hook;
                tt.before_write_ctx = &st;
            }
            const double t0 = zoff_now();
            CHECK(zoff_host_optimizer_update(opt, &tt, 0.01, 1.0));
            t[k][r] = zoff_now() - t0;
        }
    printf("N = %lld, %s states, %d threads (%s), %d rounds, medians:\n", (long long)n, bf16s ? "bf16" : "fp32",
           zoff_host_optimizer_threads(opt), zoff_host_optimizer_path(opt), rounds);
    double base = 0;
    for (int k = 0; k < MODES; k++) {
        const double m = median(t[k], rounds);
        if (k == 0) base = m;
        printf("  %-32s %8.2f ms  %.2fx plain\n", name[k], 1e3 * m, m / base);
        free(t[k]);
    }
    zoff_host_optimizer_destroy(opt);
    ZOFF_FREE_ALL(st.p, st.m, st.v, st.sp, st.sm, st.sv, g, p16);
    return 0;
}
