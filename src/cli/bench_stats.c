/* The statistics of paired bench measurements (see bench_stats.h), and `zoff bench pairs`,
 * the same statistics for scripts. */
#include "cli/bench_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_median(const double *v, int n) {
    double t[CLI_BENCH_MAX_ROUNDS];
    if (n < 1) return NAN;
    if (n > CLI_BENCH_MAX_ROUNDS) n = CLI_BENCH_MAX_ROUNDS;
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : t[n / 2 - 1] + 0.5 * (t[n / 2] - t[n / 2 - 1]); /* no overflow near DBL_MAX */
}

void cli_paired_ratios(const double *a, const double *b, int n, cli_paired *out) {
    double r[CLI_BENCH_MAX_ROUNDS];
    memset(out, 0, sizeof *out);
    if (n > CLI_BENCH_MAX_ROUNDS) n = CLI_BENCH_MAX_ROUNDS;
    out->n = n;
    if (n < 1) {
        out->a_median = out->b_median = out->ratio_median = out->ratio_min = out->ratio_max = out->spread = NAN;
        return;
    }
    for (int i = 0; i < n; i++) r[i] = a[i] / b[i];
    out->a_median = cli_median(a, n);
    out->b_median = cli_median(b, n);
    out->ratio_median = cli_median(r, n);
    out->ratio_min = out->ratio_max = r[0];
    for (int i = 1; i < n; i++) {
        out->ratio_min = fmin(out->ratio_min, r[i]);
        out->ratio_max = fmax(out->ratio_max, r[i]);
    }
    out->spread = out->ratio_median > 0 ? (out->ratio_max - out->ratio_min) / out->ratio_median : INFINITY;
    out->steady = n >= CLI_BENCH_MIN_ROUNDS && out->spread <= CLI_BENCH_SPREAD_LIMIT + 1e-9;
}

/* "name":value (6 significant digits: a tiny ratio is not 0.0000); null where the value is not a
 * finite number (JSON has no inf or nan) */
static void json_num(FILE *f, const char *sep, const char *name, double v) {
    if (isfinite(v)) fprintf(f, "%s\"%s\":%.6g", sep, name, v);
    else fprintf(f, "%s\"%s\":null", sep, name);
}

void cli_paired_json(FILE *f, const cli_paired *p) {
    json_num(f, "", "ratio_median", p->ratio_median);
    json_num(f, ",", "ratio_min", p->ratio_min);
    json_num(f, ",", "ratio_max", p->ratio_max);
    json_num(f, ",", "spread", p->spread);
    fprintf(f, ",\"steady\":%s", p->steady ? "true" : "false");
}

const char *cli_paired_verdict(const cli_paired *p, char *buf, size_t n) {
    if (p->steady) snprintf(buf, n, "%s", "");
    else if (p->n == 1)
        snprintf(buf, n, "only 1 round: no spread measured, the ratio is one sample (use --rounds %d or more)",
                 CLI_BENCH_MIN_ROUNDS);
    else if (p->n < CLI_BENCH_MIN_ROUNDS)
        snprintf(buf, n,
                 "only %d rounds: their ratios go from %.4g to %.4g, too few to tell a steady machine from a noisy "
                 "one (use --rounds %d or more)",
                 p->n, p->ratio_min, p->ratio_max, CLI_BENCH_MIN_ROUNDS);
    else {
        char pct[32] = "beyond any multiple"; /* a spread past a double's range */
        if (isfinite(p->spread)) snprintf(pct, sizeof pct, "%.3g%%", 100.0 * p->spread);
        snprintf(buf, n,
                 "spread too wide: the rounds' ratios go from %.4g to %.4g (%s of the median, limit %.0f%%); "
                 "the machine was too noisy for the median to mean more than that range",
                 p->ratio_min, p->ratio_max, pct, 100.0 * CLI_BENCH_SPREAD_LIMIT);
    }
    return buf;
}

/* zoff bench pairs: read "A B" per line (one round each) from stdin; print the statistics
 * of the ratios A/B as one JSON object (for the bench/ scripts). */
int zoff_cmd_bench_pairs(int argc, char **argv) {
    if (argc > 1) {
        bool help = !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help");
        fprintf(help ? stdout : stderr,
                "usage: zoff bench pairs < FILE\n"
                "  FILE: one round per line, two positive numbers \"A B\" measured next to each other (in one\n"
                "  unit: A/B must be a finite positive double).\n"
                "  Prints {\"rounds\", \"a_median\", \"b_median\", \"ratio_median\", \"ratio_min\", \"ratio_max\",\n"
                "  \"spread\", \"steady\", \"verdict\"} for the ratios A/B: the statistics every zoff bench uses\n"
                "  (spread = (max - min) / median, null past a double's range; steady: >= %d rounds and spread\n"
                "  <= %.2f).\n",
                CLI_BENCH_MIN_ROUNDS, CLI_BENCH_SPREAD_LIMIT);
        return help ? 0 : 2;
    }
    static double a[CLI_BENCH_MAX_ROUNDS], b[CLI_BENCH_MAX_ROUNDS];
    int n = 0, line = 0;
    char buf[256];
    while (fgets(buf, sizeof buf, stdin)) {
        line++;
        char *p = buf;
        while (*p == ' ' || *p == '\t') p++;
        if (*p == '\n' || *p == '\0' || *p == '#') continue;
        double x, y;
        char extra;
        if (sscanf(p, "%lf %lf %c", &x, &y, &extra) != 2 || !(x > 0) || !(y > 0) || !isfinite(x) || !isfinite(y)) {
            fprintf(stderr, "zoff bench pairs: line %d: expected two positive numbers \"A B\", got: %s", line, buf);
            return 2;
        }
        if (!isfinite(x / y) || !(x / y > 0)) { /* 1e308 / 1e-308 overflows, 1e-308 / 1e308 underflows */
            fprintf(stderr,
                    "zoff bench pairs: line %d: the ratio A/B of %g and %g is %g, not a positive finite number; "
                    "give the two measurements in the same unit\n",
                    line, x, y, x / y);
            return 2;
        }
        if (n == CLI_BENCH_MAX_ROUNDS) {
            fprintf(stderr, "zoff bench pairs: more than %d rounds\n", CLI_BENCH_MAX_ROUNDS);
            return 2;
        }
        a[n] = x, b[n] = y, n++;
    }
    if (n == 0) {
        fprintf(stderr, "zoff bench pairs: no pairs on stdin (one \"A B\" per line)\n");
        return 2;
    }
    cli_paired p;
    cli_paired_ratios(a, b, n, &p);
    char v[400];
    printf("{\"rounds\":%d,\"a_median\":%.6g,\"b_median\":%.6g,", n, p.a_median, p.b_median);
    cli_paired_json(stdout, &p);
    printf(",\"verdict\":\"%s\"}\n", cli_paired_verdict(&p, v, sizeof v));
    return 0;
}
