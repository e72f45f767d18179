/* The host work of a rolled-back speculative step, in units of one plain update (the
 * exact / delayed step's host work), on one host sub-group of N parameters (fp32 master,
 * m and v, bf16 gradients and weight copy; or bf16 m and v), with the host optimizer's
 * threads. Rounds interleave, medians reported:
 *   update:  one zoff_host_optimizer_update (what offload+delayed does per step);
 *   before:  what super_offload did before 2026-11-26: a serial memcpy of master, m and v
 *            to the backup, the speculative update, a serial memcpy back at the rollback,
 *            the exact update;
 *   fused:   the speculative update with ZOFF_BACKUP_SAVE, the exact update with
 *            ZOFF_BACKUP_RESTORE (what the engine does now);
 *   restore: zoff_host_optimizer_copy_backup alone (an overflow's rollback).
 * Build and run (Release build in build/):
 *   cc -O2 -Iinclude bench/spec_rollback_cost.c build/libzoff.a -fopenmp -lm -lpthread -o /tmp/spec_rollback_cost
 *   /tmp/spec_rollback_cost [N (default 50000000)] [rounds (default 5)] [bf16-states: 1] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zoff/core.h"
#include "zoff/optim.h"
#include "bench_util.h"

int main(int argc, char **argv) {
    int64_t n = argc > 1 ? atoll(argv[1]) : 50000000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    bool bf16s = argc > 3 && atoi(argv[3]) == 1;
    if (n < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: spec_rollback_cost [N >= 1] [rounds 1..64] [bf16-states 0|1]\n");
        return 2;
    }
    size_t ss = bf16s ? 2 : 4;
    float *p = aligned_alloc(64, (size_t)n * 4), *pb = aligned_alloc(64, (size_t)n * 4);
    void *m = aligned_alloc(64, (size_t)n * ss), *v = aligned_alloc(64, (size_t)n * ss);
    void *mb = aligned_alloc(64, (size_t)n * ss), *vb = aligned_alloc(64, (size_t)n * ss);
    uint16_t *g = aligned_alloc(64, (size_t)n * 2), *p16 = aligned_alloc(64, (size_t)n * 2);
    if (!p || !pb || !m || !v || !mb || !vb || !g || !p16) return fprintf(stderr, "out of memory\n"), 1;
    zoff_par_fill_f32(p, 0.5f, (size_t)n);
    zoff_par_memset(m, 0, (size_t)n * ss);
    zoff_par_memset(v, 0, (size_t)n * ss);
    zoff_par_memset(pb, 0, (size_t)n * 4);
    zoff_par_memset(mb, 0, (size_t)n * ss);
    zoff_par_memset(vb, 0, (size_t)n * ss);
    zoff_par_fill_u16(g, 0x3c00, (size_t)n); /* bf16 1.0 */
    zoff_optimizer_config c = {.type = ZOFF_OPTIM_ADAMW, .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                               .weight_decay = 0.01, .bias_correction = true};
    zoff_host_optimizer *opt;
    CHECK(zoff_host_optimizer_create(&c, 0, &opt));
    zoff_optim_tensors t = {.params = p, .exp_avg = m, .exp_avg_sq = v, .state_dt = bf16s ? ZOFF_BF16 : ZOFF_F32,
                            .grads = g, .grad_dt = ZOFF_BF16, .params16 = p16, .p16_dt = ZOFF_BF16, .n = n,
                            .backup_params = pb, .backup_exp_avg = mb, .backup_exp_avg_sq = vb};
    zoff_optim_tensors ts = t, tr = t;
    ts.backup = ZOFF_BACKUP_SAVE;
    tr.backup = ZOFF_BACKUP_RESTORE;
    double tu[64], tb[64], tf[64], tc[64], tsv[64];
    int64_t step = 1;
    for (int r = 0; r < rounds; r++) {
        CHECK(zoff_host_optimizer_begin_step(opt, step++, 1e-3));
        double t0 = zoff_now();
        CHECK(zoff_host_optimizer_update(opt, &t, 0.01, 1.0));
        double t1 = zoff_now();
        memcpy(pb, p, (size_t)n * 4); /* before */
        memcpy(mb, m, (size_t)n * ss);
        memcpy(vb, v, (size_t)n * ss);
        CHECK(zoff_host_optimizer_update(opt, &t, 0.01, 1.0));
        memcpy(p, pb, (size_t)n * 4);
        memcpy(m, mb, (size_t)n * ss);
        memcpy(v, vb, (size_t)n * ss);
        CHECK(zoff_host_optimizer_update(opt, &t, 0.01, 0.5));
        double t2 = zoff_now();
        CHECK(zoff_host_optimizer_update(opt, &ts, 0.01, 1.0)); /* fused */
        double t25 = zoff_now();
        CHECK(zoff_host_optimizer_update(opt, &tr, 0.01, 0.5));
        double t3 = zoff_now();
        CHECK(zoff_host_optimizer_copy_backup(opt, &tr));
        double t4 = zoff_now();
        tu[r] = t1 - t0, tb[r] = t2 - t1, tf[r] = t3 - t2, tc[r] = t4 - t3, tsv[r] = t25 - t2;
    }
    double u = median(tu, rounds), b = median(tb, rounds), f = median(tf, rounds), cp = median(tc, rounds);
    double sv = median(tsv, rounds);
    printf("N %lld, %s states, %d threads, %d rounds (medians, s; x: per plain update)\n", (long long)n,
           bf16s ? "bf16" : "fp32", zoff_host_optimizer_threads(opt), rounds);
    printf("update %.4f | before (serial copies) %.4f = %.2fx | fused %.4f = %.2fx (its saving update %.2fx) | "
           "restore only %.4f = %.2fx\n",
           u, b, b / u, f, f / u, sv / u, cp, cp / u);
    zoff_host_optimizer_destroy(opt);
    free(p), free(pb), free(m), free(v), free(mb), free(vb), free(g), free(p16);
    return 0;
}
