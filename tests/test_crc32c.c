/* CRC32C: zoff_crc32c (the dispatcher), the portable table path and the SSE4.2
 * path, each against an independent bitwise reference written here (one bit at
 * a time, reflected polynomial 0x82f63b78) and against published values (the
 * CRC catalogue's check value; RFC 3720 B.4, the iSCSI test vectors). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/crc32c_internal.h"
#include "zoff/core.h"

/* The reference: crc is the previous result (0 to start), state ~crc in and out. */
static uint32_t ref_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
    }
    return ~crc;
}

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);
typedef struct {
    const char *name;
    crc_fn fn;
} impl;

/* Every implementation this CPU runs: the dispatcher, the table path, and the SSE4.2 path if present. */
static int impls(impl out[3]) {
    int k = 0;
    out[k++] = (impl){"zoff_crc32c", zoff_crc32c};
    out[k++] = (impl){"table", zoff_crc32c__table};
    if (zoff_crc32c__have_sse42()) out[k++] = (impl){"sse42", zoff_crc32c__sse42};
    return k;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) { /* xorshift64*, fixed seed: reproducible */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 0x2545f4914f6cdd1dull;
}
static void fill(uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(rnd() >> 56);
}

static void expect(const impl *im, uint32_t seed, const uint8_t *p, size_t n, uint32_t want, size_t off) {
    uint32_t got = im->fn(seed, p, n);
    if (got != want)
        fail_msg("%s: length %zu, misalignment %zu, seed %08x: got %08x, want %08x", im->name, n, off, seed, got, want);
}

static void test_known_values(void **st) {
    (void)st;
    uint8_t z[32], ff[32], inc[32], dec[32];
    memset(z, 0, sizeof z);
    memset(ff, 0xff, sizeof ff);
    for (int i = 0; i < 32; i++) inc[i] = (uint8_t)i, dec[i] = (uint8_t)(31 - i);
    static const uint8_t read10[48] = {0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                       0x14, 0, 0, 0, 0, 0, 0x04, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18,
                                       0x28, 0, 0, 0, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0};
    const struct {
        const uint8_t *p;
        size_t n;
        uint32_t want;
    } v[] = {
        {(const uint8_t *)"123456789", 9, 0xe3069283u}, /* check value */
        {z, 32, 0x8a9136aau},                           /* RFC 3720 B.4: 32 bytes of zeros */
        {ff, 32, 0x62a8ab43u},                          /* 32 bytes of 0xff */
        {inc, 32, 0x46dd794eu},                         /* 0x00..0x1f */
        {dec, 32, 0x113fdb5cu},                         /* 0x1f..0x00 */
        {read10, 48, 0xd9963a56u},                      /* an iSCSI read command PDU */
        {z, 0, 0u},                                     /* nothing */
    };
    impl im[3];
    int ni = impls(im);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        assert_int_equal(ref_crc32c(0, v[i].p, v[i].n), v[i].want); /* the reference itself */
        for (int k = 0; k < ni; k++) expect(&im[k], 0, v[i].p, v[i].n, v[i].want, 0);
    }
    for (int k = 0; k < ni; k++) assert_int_equal(im[k].fn(0, NULL, 0), 0u);
    print_message("crc32c: SSE4.2 path %s\n", zoff_crc32c__have_sse42() ? "present (tested)" : "absent (table path only)");
}

/* Each length's bytes hashed at every misalignment 0..15 (the same bytes, so the same value). */
static void check_len(const impl *im, int ni, uint8_t *buf, const uint8_t *src, size_t n, uint32_t seed) {
    uint32_t want = ref_crc32c(seed, src, n);
    for (size_t off = 0; off < 16; off++) {
        memcpy(buf + off, src, n);
        for (int k = 0; k < ni; k++) expect(&im[k], seed, buf + off, n, want, off);
    }
}

static void test_random_lengths_misaligned(void **st) {
    (void)st;
    enum { MAXN = 5000 };
    uint8_t *src = malloc(MAXN), *raw = malloc(MAXN + 16 + 64);
    assert_non_null(src);
    assert_non_null(raw);
    uint8_t *buf = (uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63); /* 64-aligned, + off */
    impl im[3];
    int ni = impls(im);
    for (int iter = 0; iter < 400; iter++) {
        size_t n = iter <= 64 ? (size_t)iter : (size_t)(rnd() % (MAXN + 1));
        if (iter == 65) n = MAXN;
        uint32_t seed = iter % 3 == 0 ? 0u : (uint32_t)rnd();
        fill(src, n);
        check_len(im, ni, buf, src, n, seed);
    }
    free(src);
    free(raw);
}

/* Lengths around the interleaved path's block sizes (3 x SHORT, 3 x LONG) and the 8-byte step. */
static void test_block_boundaries(void **st) {
    (void)st;
    const size_t S3 = 3 * ZOFF_CRC32C_SHORT, L3 = 3 * ZOFF_CRC32C_LONG;
    const size_t base[] = {8, S3, L3, L3 + S3, 2 * L3 + 2 * S3 + 8};
    size_t maxn = 3 * L3 + 16;
    uint8_t *src = malloc(maxn), *raw = malloc(maxn + 16 + 64);
    assert_non_null(src);
    assert_non_null(raw);
    uint8_t *buf = (uint8_t *)(((uintptr_t)raw + 63) & ~(uintptr_t)63);
    fill(src, maxn);
    impl im[3];
    int ni = impls(im);
    for (size_t b = 0; b < sizeof base / sizeof base[0]; b++)
        for (size_t mul = 1; mul <= 3; mul++)
            for (int d = -1; d <= 1; d++) {
                size_t n = base[b] * mul + (size_t)(ptrdiff_t)d;
                if (n > maxn) continue;
                check_len(im, ni, buf, src, n, 0);
                check_len(im, ni, buf, src, n, 0xdeadbeefu);
            }
    /* 3 x LONG + 3 x SHORT + k for every tail k < 8 and a few more, one seed */
    for (size_t k = 0; k < 24; k++) check_len(im, ni, buf, src, L3 + S3 + k, 0);
    free(src);
    free(raw);
}

/* crc(crc(a), b) == crc(a || b), for splits at 0, n, around the blocks, at random, and across paths. */
static void test_incremental(void **st) {
    (void)st;
    const size_t n = 3 * 3 * ZOFF_CRC32C_LONG + 3 * ZOFF_CRC32C_SHORT + 13;
    uint8_t *p = malloc(n);
    assert_non_null(p);
    fill(p, n);
    const uint32_t want = ref_crc32c(0, p, n);
    impl im[3];
    int ni = impls(im);
    size_t splits[64];
    int ns = 0;
    const size_t fixed[] = {0, 1, 7, 8, 9, 3 * ZOFF_CRC32C_SHORT - 1, 3 * ZOFF_CRC32C_SHORT,
                            3 * ZOFF_CRC32C_LONG - 1, 3 * ZOFF_CRC32C_LONG, 3 * ZOFF_CRC32C_LONG + 1, n - 1, n};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) splits[ns++] = fixed[i];
    while (ns < 64) splits[ns++] = (size_t)(rnd() % (n + 1));
    for (int s = 0; s < ns; s++) {
        size_t a = splits[s];
        for (int k1 = 0; k1 < ni; k1++)
            for (int k2 = 0; k2 < ni; k2++) {
                uint32_t c = im[k2].fn(im[k1].fn(0, p, a), p + a, n - a);
                if (c != want)
                    fail_msg("split at %zu of %zu (%s then %s): got %08x, want %08x", a, n, im[k1].name, im[k2].name,
                             c, want);
            }
    }
    /* many small pieces */
    for (int k = 0; k < ni; k++) {
        uint32_t c = 0;
        for (size_t at = 0; at < n;) {
            size_t len = (size_t)(rnd() % 2000);
            if (len > n - at) len = n - at;
            c = im[k].fn(c, p + at, len);
            at += len;
        }
        assert_int_equal(c, want);
    }
    free(p);
}

/* A buffer of a few MiB (many long blocks), unaligned start. */
static void test_large(void **st) {
    (void)st;
    const size_t n = ((size_t)3 << 20) + 13;
    uint8_t *raw = malloc(n + 3);
    assert_non_null(raw);
    uint8_t *p = raw + 3;
    fill(p, n);
    uint32_t want = ref_crc32c(0x12345678u, p, n);
    impl im[3];
    int ni = impls(im);
    for (int k = 0; k < ni; k++) expect(&im[k], 0x12345678u, p, n, want, 3);
    free(raw);
}

/* The dispatcher takes the SSE4.2 path when the CPU has it (what the checkpoint code gets). */
static void test_dispatch(void **st) {
    (void)st;
#if defined(__x86_64__)
    assert_int_equal(zoff_crc32c__have_sse42(), __builtin_cpu_supports("sse4.2") != 0);
#else
    assert_false(zoff_crc32c__have_sse42());
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_values),       cmocka_unit_test(test_random_lengths_misaligned),
        cmocka_unit_test(test_block_boundaries),   cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_large),              cmocka_unit_test(test_dispatch),
    };
    return cmocka_run_group_tests_name("crc32c", tests, NULL, NULL);
}
