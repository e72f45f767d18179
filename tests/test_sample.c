/* zoff_sample_pick against the definition of temperature, top-k and top-p (nucleus) sampling
 * (Hugging Face generate's TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, in that
 * order): the expected distribution is computed here in double from the probabilities themselves,
 * by sorting, and the picks' frequencies over many draws must match it (within 5 standard
 * deviations), with no pick outside the kept set. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zoff/model.h"

enum { MAXV = 1000 };

/* The distribution the options define over softmax(logits): q[0..V). */
static void reference(const float *logits, int V, const zoff_sample_options *o, double *q) {
    int order[MAXV];
    double p[MAXV], s = 0, mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = fmax(mx, logits[i]);
    for (int i = 0; i < V; i++) s += p[i] = exp(((double)logits[i] - mx) / o->temperature);
    for (int i = 0; i < V; i++) p[i] /= s, order[i] = i;
    for (int i = 0; i < V; i++) /* selection sort, most likely first (the tests' logits are distinct) */
        for (int j = i + 1; j < V; j++)
            if (p[order[j]] > p[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int keep = o->top_k > 0 && o->top_k < V ? (int)o->top_k : V;
    double kept = 0;
    for (int r = 0; r < keep; r++) kept += p[order[r]];
    if (o->top_p < 1) { /* the shortest prefix whose renormalised mass reaches top_p */
        double cum = 0;
        int r = 0;
        while (r < keep && (r == 0 || cum < o->top_p)) cum += p[order[r++]] / kept;
        keep = r;
    }
    double z = 0;
    memset(q, 0, (size_t)V * sizeof *q);
    for (int r = 0; r < keep; r++) z += p[order[r]];
    for (int r = 0; r < keep; r++) q[order[r]] = p[order[r]] / z;
}

static void check_frequencies(const float *logits, int V, zoff_sample_options o, uint64_t seed, long N) {
    static long count[MAXV];
    static double q[MAXV];
    static float scratch[MAXV];
    memset(count, 0, sizeof count);
    reference(logits, V, &o, q);
    uint64_t rng = zoff_sample_rng_init(seed);
    for (long d = 0; d < N; d++) {
        int32_t id = zoff_sample_pick(logits, V, &o, &rng, scratch);
        assert_true(id >= 0 && id < V);
        count[id]++;
    }
    for (int i = 0; i < V; i++) {
        double want = N * q[i], sd = sqrt(N * q[i] * (1 - q[i]));
        if (q[i] == 0 && count[i] != 0)
            fail_msg("T %g k %lld p %g: token %d picked %ld times, outside the kept set", o.temperature,
                     (long long)o.top_k, o.top_p, i, count[i]);
        if (fabs((double)count[i] - want) > 5 * sd + 1)
            fail_msg("T %g k %lld p %g: token %d picked %ld times, expected %.1f (sd %.1f)", o.temperature,
                     (long long)o.top_k, o.top_p, i, count[i], want, sd);
    }
}

/* Six tokens at shuffled positions with probabilities 0.40 0.25 0.15 0.10 0.06 0.04. */
static const float k_small[6] = {-2.302585f /* 0.10 */, -0.916291f /* 0.40 */, -3.218876f /* 0.04 */,
                                 -1.897120f /* 0.15 */, -2.813411f /* 0.06 */, -1.386294f /* 0.25 */};

static void test_greedy(void **state) {
    (void)state;
    float scratch[6];
    uint64_t rng = zoff_sample_rng_init(7);
    zoff_sample_options o = {.temperature = 0, .top_k = 3, .top_p = 0.5};
    for (int d = 0; d < 10; d++) assert_int_equal(zoff_sample_pick(k_small, 6, &o, &rng, scratch), 1);
}

static void test_small_distribution(void **state) {
    (void)state;
    const zoff_sample_options cases[] = {
        {1, 0, 1},   {0.5, 0, 1}, {2, 3, 1},    {1, 0, 0.7}, /* 0.40 + 0.25 < 0.7: three tokens */
        {1, 0, 0.3}, /* one token */ {1, 2, 0.9}, {2, 0, 0.6}, {1, 4, 0.95},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) check_frequencies(k_small, 6, cases[c], 11 + c, 200000);
}

static void test_top_p_keeps_the_token_that_crosses(void **state) {
    (void)state;
    /* 0.40 + 0.25 = 0.65: top_p 0.64 needs the second token, 0.66 the third as well */
    double q[6];
    zoff_sample_options o = {1, 0, 0.64};
    reference(k_small, 6, &o, q);
    assert_true(q[1] > 0 && q[5] > 0 && q[3] == 0);
    check_frequencies(k_small, 6, o, 3, 200000);
    o.top_p = 0.66;
    reference(k_small, 6, &o, q);
    assert_true(q[3] > 0 && q[0] == 0);
    check_frequencies(k_small, 6, o, 4, 200000);
}

static void test_wide_vocabulary(void **state) {
    (void)state;
    static float logits[MAXV];
    uint64_t x = 12345;
    for (int i = 0; i < MAXV; i++) { /* distinct values, a spread like a trained model's */
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((double)(x >> 40) / (double)(1 << 24) * 12.0 - 6.0) + (float)i * 1e-6f;
    }
    check_frequencies(logits, MAXV, (zoff_sample_options){1, 40, 1}, 21, 30000);
    check_frequencies(logits, MAXV, (zoff_sample_options){0.8, 40, 0.8}, 22, 30000);
    check_frequencies(logits, MAXV, (zoff_sample_options){1.3, 0, 0.9}, 23, 30000);
}

/* The one seed whose state was 0 (seed x 0x9E3779B97F4A7C15 + 1 = 2^64): xorshift stays at 0, every
 * draw was 0 and every pick the first kept token ('sample --seed 1018231460777725123': "\0\0\0..." from a
 * byte model, "!!!!" from GPT-2). Its picks follow the distribution like any seed's. */
static void test_no_degenerate_seed(void **state) {
    (void)state;
    const uint64_t bad = 1018231460777725123ull; /* (2^64 - 1) / 0x9E3779B97F4A7C15 mod 2^64 */
    assert_true(bad * 0x9E3779B97F4A7C15ull + 1 == 0);
    check_frequencies(k_small, 6, (zoff_sample_options){1, 0, 1}, bad, 200000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_small_distribution),
        cmocka_unit_test(test_top_p_keeps_the_token_that_crosses),
        cmocka_unit_test(test_wide_vocabulary),
        cmocka_unit_test(test_no_degenerate_seed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
