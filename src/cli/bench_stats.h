/* One home for the statistics of every `zoff bench` that compares zoff with a bound or a
 * peer (bench adam, nvme, ckpt, and the the bench/ scripts scripts through `zoff bench pairs`).
 *
 * The machine is noisy: the two sides of a comparison are measured next to each other,
 * round after round (a, b, a, b, ...), and the ratio is taken of each round's pair, never
 * of two medians taken minutes apart. Reported: the median of the paired ratios, their
 * minimum and maximum, and each side's median. When the ratios of the rounds spread more
 * than CLI_BENCH_SPREAD_LIMIT of their median, the comparison is marked unsteady and the
 * benches say so instead of printing a number that looks precise. Internal to src/cli. */
#ifndef ZOFF_CLI_BENCH_STATS_H
#define ZOFF_CLI_BENCH_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define CLI_BENCH_MAX_ROUNDS 1000
/* (ratio_max - ratio_min) / ratio_median above which a comparison is "spread too wide":
 * 0.2 is +-10% around the median, i.e. +-0.1 for a ratio near 1 */
#define CLI_BENCH_SPREAD_LIMIT 0.2
/* fewer rounds than this give no spread worth the name (1: none; 2: the range of two samples) */
#define CLI_BENCH_MIN_ROUNDS 3

typedef struct cli_paired {
    int n;                                         /* rounds (pairs) */
    double a_median, b_median;                     /* each side's median */
    double ratio_median, ratio_min, ratio_max;     /* of a[i] / b[i] */
    double spread;                                 /* (ratio_max - ratio_min) / ratio_median */
    bool steady;                                   /* n >= CLI_BENCH_MIN_ROUNDS and spread <= the limit */
} cli_paired;

/* The median of n values (n >= 1; v is not reordered; n <= CLI_BENCH_MAX_ROUNDS). */
double cli_median(const double *v, int n);
/* Statistics of the pairs (a[i], b[i]), i < n (1 <= n <= CLI_BENCH_MAX_ROUNDS, b[i] > 0). */
void cli_paired_ratios(const double *a, const double *b, int n, cli_paired *out);
/* `"ratio_median":..,"ratio_min":..,"ratio_max":..,"spread":..,"steady":true|false` (no braces);
 * a value that is not a finite number (no rounds; a spread beyond a double) is null. */
void cli_paired_json(FILE *f, const cli_paired *p);
/* "" when steady, else why the median is not a measurement: "spread too wide: ..." or
 * "only N rounds: ...". */
const char *cli_paired_verdict(const cli_paired *p, char *buf, size_t n);

#endif
