/* What the C benchmarks in bench/ share: the median of their rounds, and stopping at the first
 * zoff error with its message. Header only (each benchmark is one file built by one cc command). */
#ifndef ZOFF_BENCH_UTIL_H
#define ZOFF_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "zoff/core.h"

static int bench_cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of x[0..n) (sorts x). */
static double median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, bench_cmp);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#define CHECK(x)                                                       \
    do {                                                               \
        if ((x) != ZOFF_OK) {                                          \
            fprintf(stderr, "%s: %s\n", #x, zoff_last_error());        \
            exit(1);                                                   \
        }                                                              \
    } while (0)

#endif
