/* Picking the next token from a model's logits (zoff sample): temperature, top-k and top-p
 * (nucleus), in that order, as Hugging Face's generate applies them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zoff/model.h"

/* xorshift's state must not be 0 (it stays 0: every draw 0, the first kept token always): the one
 * seed that maps there takes another state */
uint64_t zoff_sample_rng_init(uint64_t seed) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    return s ? s : 0x9E3779B97F4A7C15ull;
}

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int desc_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* The k-th largest (k from 0) of scratch[0..n) by partial selection; reorders scratch. */
static float kth_largest(float *scratch, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pv = scratch[(lo + hi) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (scratch[i] > pv) i++;
            while (scratch[j] < pv) j--;
            if (i <= j) {
                float t = scratch[i];
                scratch[i] = scratch[j];
                scratch[j] = t;
                i++;
                j--;
            }
        }
        if (k <= j) hi = j;
        else if (k >= i) lo = i;
        else break;
    }
    return scratch[k];
}

int32_t zoff_sample_pick(const float *logits, int64_t V, const zoff_sample_options *o, uint64_t *rng,
                         float *scratch) {
    int64_t best = 0;
    for (int64_t i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (o->temperature <= 0) return (int32_t)best;
    const double temp = o->temperature, mx = logits[best];
    double thresh = -INFINITY; /* the tokens kept: logits[i] >= thresh */
    if (o->top_k > 0 && o->top_k < V) {
        memcpy(scratch, logits, (size_t)V * sizeof(float));
        thresh = kth_largest(scratch, V, o->top_k - 1);
    }
    if (o->top_p > 0 && o->top_p < 1) {
        /* Keep the most likely tokens, in order, until the ones before the next already hold
         * top_p of the (tempered, top-k) probability: the smallest such set, at least one token. */
        int64_t n = 0;
        double total = 0;
        for (int64_t i = 0; i < V; i++)
            if (logits[i] >= thresh) {
                scratch[n++] = logits[i];
                total += exp(((double)logits[i] - mx) / temp);
            }
        qsort(scratch, (size_t)n, sizeof(float), desc_float);
        double cum = 0;
        for (int64_t i = 0; i < n; i++) {
            if (i > 0 && cum >= o->top_p * total) {
                thresh = scratch[i - 1];
                break;
            }
            cum += exp(((double)scratch[i] - mx) / temp);
        }
    }
    double sum = 0;
    for (int64_t i = 0; i < V; i++)
        if (logits[i] >= thresh) sum += exp(((double)logits[i] - mx) / temp);
    double u = (double)(rng_next(rng) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int64_t i = 0; i < V; i++) {
        if (logits[i] < thresh) continue;
        acc += exp(((double)logits[i] - mx) / temp);
        if (acc >= u) return (int32_t)i;
    }
    return (int32_t)best;
}
