/* Aligned allocation, timers, name distance, sizes, half-precision conversion (CRC32C: crc32c.c). */
#define _POSIX_C_SOURCE 200809L
#include "zoff/core.h"
#include "core/half_internal.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

void *zoff_aligned_alloc(size_t alignment, size_t bytes, const char *what) {
    void *p = NULL;
    if (alignment < sizeof(void *)) alignment = sizeof(void *);
    int rc = posix_memalign(&p, alignment, bytes ? bytes : alignment);
    if (rc != 0) {
        char b[32];
        zoff_error(ZOFF_ERR_NOMEM, "out of host memory allocating %s (%s): %s; free memory or use a smaller model/batch",
                   what ? what : "buffer", zoff_format_bytes(bytes, b, sizeof b), strerror(rc));
        return NULL;
    }
    return p;
}

void zoff_aligned_free(void *p) { free(p); }

void zoff_free_all(void *const *p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i]);
}

double zoff_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double zoff_lap(double *mark) {
    double now = zoff_now(), d = now - *mark;
    *mark = now;
    return d;
}

size_t zoff_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return SIZE_MAX;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* What every size error says: the units and their meaning (one list, as zoff_parse_size reads them). */
#define SIZE_UNITS "B; binary K, M, G, T (= KiB, MiB, GiB, TiB); decimal kB, MB, GB, TB; any case, e.g. 80G, 80GB, 1e9"

zoff_status zoff_parse_size(const char *text, size_t *out) {
    if (!text || !*text) return zoff_error(ZOFF_ERR_INVALID, "empty size; give bytes or a number with a unit: " SIZE_UNITS);
    errno = 0;
    char *end = NULL;
    double v = strtod(text, &end);
    if (end == text || errno || !(v >= 0) || !isfinite(v))
        return zoff_error(ZOFF_ERR_INVALID, "invalid size '%s'; give bytes or a number with a unit: " SIZE_UNITS, text);
    while (*end == ' ') end++;
    /* the unit, any case: "", B; K, KiB (binary); KB (decimal); the same for M, G, T */
    static const char prefixes[] = "kmgt";
    double mul = 0;
    char u0 = (char)tolower((unsigned char)end[0]);
    const char *pre = u0 ? strchr(prefixes, u0) : NULL;
    if (!*end || !strcasecmp(end, "b")) mul = 1;
    else if (pre) {
        double bin = 1, dec = 1;
        for (const char *q = prefixes; q <= pre; q++) bin *= 1024.0, dec *= 1000.0;
        const char *rest = end + 1;
        if (!*rest || !strcasecmp(rest, "ib")) mul = bin;
        else if (!strcasecmp(rest, "b")) mul = dec;
    }
    if (mul == 0) return zoff_error(ZOFF_ERR_INVALID, "invalid size unit in '%s'; the units: " SIZE_UNITS, text);
    double bytes = v * mul;
    if (bytes > 1.8e19) return zoff_error(ZOFF_ERR_INVALID, "size '%s' is too large", text);
    *out = (size_t)bytes;
    return ZOFF_OK;
}

const char *zoff_format_bytes(size_t bytes, char *buf, size_t buflen) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) { v /= 1024.0; i++; }
    if (i == 0) snprintf(buf, buflen, "%zu B", bytes);
    else snprintf(buf, buflen, "%.2f %s", v, u[i]);
    return buf;
}

const char *zoff_format_count(int64_t n, const char *word, char *buf, size_t buflen) {
    snprintf(buf, buflen, "%lld %s%s", (long long)n, word, n == 1 ? "" : "s");
    return buf;
}

const char *zoff_format_params(int64_t n, char *buf, size_t buflen) {
    if (n >= 1000000) snprintf(buf, buflen, "%.2fM parameters", (double)n / 1e6);
    else zoff_format_count(n, "parameter", buf, buflen);
    return buf;
}

const char *zoff_format_fixed(double v, int digits, char *buf, size_t buflen) {
    if (v == 0 || !isfinite(v) || fabs(v) >= 0.1) snprintf(buf, buflen, "%.*f", digits, v);
    else snprintf(buf, buflen, "%.*e", digits - 1, v);
    return buf;
}

float zoff_bf16_to_f32(uint16_t h) { return zoff_half_bf16_to_f32(h); }

uint16_t zoff_f32_to_bf16(float f) { return zoff_half_f32_to_bf16(f); }

float zoff_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0) {
        if (man == 0) u = sign;
        else { /* subnormal */
            u = zoff_f32_bits((float)man * 5.9604644775390625e-8f) | sign; /* man * 2^-24 */
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    return zoff_bits_f32(u);
}

uint16_t zoff_f32_to_f16(float f) { return zoff_half_f32_to_f16(f); }
