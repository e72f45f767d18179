/* CRC32C (Castagnoli, reflected polynomial 0x82f63b78; crc is the previous
 * result, 0 to start: the state is ~crc in and ~state out).
 *
 * Two implementations give the same values:
 *  - slicing-by-8 tables, portable (the fallback: other architectures, x86
 *    CPUs without SSE4.2);
 *  - on x86-64 with SSE4.2, the crc32 instruction (chosen at run time). The
 *    instruction has a 3-cycle latency and issues one per cycle, so one chain
 *    runs at a third of its rate; three streams over the thirds of a block
 *    keep it busy. The 2nd and 3rd streams start from state 0 and the three
 *    states are joined by the linearity of CRCs over GF(2):
 *        R(s, A|B) = S_|B|(R(s, A)) ^ R(0, B)
 *    where R(s, D) is the raw state after D from state s and S_K(s) = R(s, K
 *    zero bytes) = s * x^(8K) mod P is linear in s, kept as four byte tables
 *    per block size (zlib's crc32_combine is the same algebra). */
#include "core/crc32c_internal.h"
#include "zoff/core.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82f63b78u

/* ------------------------------------------------------------------ tables */

static uint32_t g_table[8][256];
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        g_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) g_table[t][i] = (g_table[t - 1][i] >> 8) ^ g_table[0][g_table[t - 1][i] & 0xff];
}

uint32_t zoff_crc32c__table(uint32_t crc, const void *data, size_t n) {
    pthread_once(&g_table_once, table_init);
    const uint8_t *p = data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = g_table[7][lo & 0xff] ^ g_table[6][(lo >> 8) & 0xff] ^ g_table[5][(lo >> 16) & 0xff] ^
              g_table[4][lo >> 24] ^ g_table[3][hi & 0xff] ^ g_table[2][(hi >> 8) & 0xff] ^
              g_table[1][(hi >> 16) & 0xff] ^ g_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ g_table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

/* ------------------------------------------------------------------ SSE4.2 */

#if defined(__x86_64__)

/* g_shift[0]: S_LONG, g_shift[1]: S_SHORT; S(s) = T[0][s&255] ^ T[1][s>>8&255] ^ ... */
static uint32_t g_shift[2][4][256];
static pthread_once_t g_shift_once = PTHREAD_ONCE_INIT;

static void shift_table(uint32_t t[4][256], size_t k) {
    uint32_t basis[32]; /* S_k of each single-bit state, by the table path's raw byte step */
    for (int b = 0; b < 32; b++) {
        uint32_t c = 1u << b;
        for (size_t i = 0; i < k; i++) c = (c >> 8) ^ g_table[0][c & 0xff];
        basis[b] = c;
    }
    for (int j = 0; j < 4; j++)
        for (uint32_t v = 0; v < 256; v++) {
            uint32_t r = 0;
            for (int b = 0; b < 8; b++)
                if (v & (1u << b)) r ^= basis[8 * j + b];
            t[j][v] = r;
        }
}

static void shift_init(void) {
    pthread_once(&g_table_once, table_init);
    shift_table(g_shift[0], ZOFF_CRC32C_LONG);
    shift_table(g_shift[1], ZOFF_CRC32C_SHORT);
}

static inline uint32_t shift(const uint32_t t[4][256], uint32_t s) {
    return t[0][s & 0xff] ^ t[1][(s >> 8) & 0xff] ^ t[2][(s >> 16) & 0xff] ^ t[3][s >> 24];
}

/* Raw state after 3 x k bytes at p, three streams of k bytes joined (k a multiple of 8). */
__attribute__((target("sse4.2"), always_inline)) static inline uint64_t crc3(uint64_t c0, const unsigned char *p,
                                                                             size_t k, const uint32_t t[4][256]) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < k; i += 8) {
        uint64_t a, b, d;
        memcpy(&a, p + i, 8);
        memcpy(&b, p + k + i, 8);
        memcpy(&d, p + 2 * k + i, 8);
        c0 = _mm_crc32_u64(c0, a);
        c1 = _mm_crc32_u64(c1, b);
        c2 = _mm_crc32_u64(c2, d);
    }
    return shift(t, shift(t, (uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
}

__attribute__((target("sse4.2"))) uint32_t zoff_crc32c__sse42(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uint32_t c32 = ~crc;
    for (; n && ((uintptr_t)p & 7); n--) c32 = _mm_crc32_u8(c32, *p++); /* 8-byte loads aligned from here */
    uint64_t c = c32;
    if (n >= 3 * ZOFF_CRC32C_SHORT) pthread_once(&g_shift_once, shift_init);
    for (; n >= 3 * ZOFF_CRC32C_LONG; p += 3 * ZOFF_CRC32C_LONG, n -= 3 * ZOFF_CRC32C_LONG)
        c = crc3(c, p, ZOFF_CRC32C_LONG, g_shift[0]);
    for (; n >= 3 * ZOFF_CRC32C_SHORT; p += 3 * ZOFF_CRC32C_SHORT, n -= 3 * ZOFF_CRC32C_SHORT)
        c = crc3(c, p, ZOFF_CRC32C_SHORT, g_shift[1]);
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
    }
    c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}

bool zoff_crc32c__have_sse42(void) { return __builtin_cpu_supports("sse4.2"); }

#else

uint32_t zoff_crc32c__sse42(uint32_t crc, const void *data, size_t n) { return zoff_crc32c__table(crc, data, n); }
bool zoff_crc32c__have_sse42(void) { return false; }

#endif

/* ------------------------------------------------------------------ dispatch */

uint32_t zoff_crc32c(uint32_t crc, const void *data, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return zoff_crc32c__sse42(crc, data, n);
#endif
    return zoff_crc32c__table(crc, data, n);
}
