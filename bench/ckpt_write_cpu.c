/* Where a checkpoint write's CPU goes: one entry of MIB MiB written through the .zckpt writer, either from the
 * caller's memory in 1 MiB runs (zoff_ckpt_append_external, as a background save writes the snapshot's staged
 * copies; extN: N MiB runs, to see what the request size does on a disk) or copied through the writer's pieces
 * (zoff_ckpt_append), then committed; per round the wall time and the CPU time of the whole process, of the
 * calling thread (the CRC, and the copy into the pieces) and of every other thread (the aio engine's ring
 * threads and the kernel's io_uring workers, iou-wrk, which count as this process's).
 * Each round's checkpoint is finalized (rename, COMPLETE; counted) and removed (not counted).
 * Rounds alternate nothing (link two builds and alternate the runs); medians printed.
 * Build and run (Release build in build/):
 *   cc -O2 -Iinclude bench/ckpt_write_cpu.c build/libzoff.a $(pkg-config --libs jansson liburing openblas) \
 *      -fopenmp -lm -lpthread -o /tmp/ckpt_write_cpu
 *   /tmp/ckpt_write_cpu DIR [MiB (default 1024)] [ext|extN|pieces (default ext)] [rounds (default 3)] */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "zoff/ckpt.h"
#include "zoff/core.h"
#include "bench_util.h"

static double cpu_of(int who) {
    struct rusage u;
    getrusage(who, &u);
    return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
           1e-6 * (double)u.ru_stime.tv_usec;
}

static void no_release(void *ctx, const void *data) {
    (void)ctx;
    (void)data;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [MiB] [ext|extN|pieces] [rounds]\n", argv[0]);
        return 2;
    }
    const size_t mib = (size_t)1 << 20, n = (size_t)(argc > 2 ? atoll(argv[2]) : 1024) * mib;
    const int ext = argc > 3 ? strcmp(argv[3], "pieces") != 0 : 1, rounds = argc > 4 ? atoi(argv[4]) : 3;
    const size_t run = (ext && argc > 3 && argv[3][3] ? (size_t)atoll(argv[3] + 3) : 1) * mib; /* extN: N MiB */
    if (n == 0 || rounds <= 0 || rounds > 100 || run == 0 || n % run) {
        fprintf(stderr, "usage: %s DIR [MiB > 0, a multiple of N] [ext|extN|pieces] [rounds 1..100]\n", argv[0]);
        return 2;
    }
    char *buf = zoff_aligned_alloc(4096, n, "bench data");
    if (!buf) return 1;
    for (size_t i = 0; i < n; i++) buf[i] = (char)(i * 131 + 7);
    double *wall = calloc((size_t)rounds, sizeof *wall), *proc = calloc((size_t)rounds, sizeof *proc),
           *self = calloc((size_t)rounds, sizeof *self);
    for (int r = 0; r < rounds; r++) {
        const double p0 = cpu_of(RUSAGE_SELF), s0 = cpu_of(RUSAGE_THREAD), t0 = zoff_now();
        zoff_ckpt_writer *w = NULL;
        int64_t shape[1] = {(int64_t)(n / 4)};
        CHECK(zoff_ckpt_writer_open(argv[1], r + 1, 0, NULL, &w));
        CHECK(zoff_ckpt_begin_entry(w, "e", ZOFF_F32, 1, shape));
        if (ext)
            for (size_t o = 0; o < n; o += run) CHECK(zoff_ckpt_append_external(w, buf + o, run, no_release, NULL));
        else
            CHECK(zoff_ckpt_append(w, buf, n));
        CHECK(zoff_ckpt_end_entry(w));
        CHECK(zoff_ckpt_commit(w));
        CHECK(zoff_ckpt_finalize(argv[1], r + 1, 1, NULL)); /* visible as DIR/step_X (then removed) */
        wall[r] = zoff_now() - t0;
        proc[r] = cpu_of(RUSAGE_SELF) - p0;
        self[r] = cpu_of(RUSAGE_THREAD) - s0;
        char d[4200];
        snprintf(d, sizeof d, "rm -rf '%s'/step_%08d", argv[1], r + 1);
        if (system(d) != 0) fprintf(stderr, "could not remove %s\n", d);
    }
    double other[100];
    for (int r = 0; r < rounds; r++) other[r] = proc[r] - self[r];
    char how[64] = "through the pieces";
    if (ext) snprintf(how, sizeof how, "from the caller's memory (%zu MiB runs)", run / mib);
    printf("%zu MiB %s, %d rounds, medians: write + commit %.3f s, CPU: process %.3f s, this thread %.3f s, other "
           "threads %.3f s\n",
           n / mib, how, rounds, median(wall, rounds),
           median(proc, rounds), median(self, rounds), median(other, rounds));
    zoff_aligned_free(buf);
    ZOFF_FREE_ALL(wall, proc, self);
    return 0;
}
