/* GPT-2's pre-tokenisation regex, written out in C over UTF-8:
 *
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *
 * The alternatives are tried in order at each position, as the regex engine does:
 *  1. a contraction (case-sensitive, as in GPT-2);
 *  2-4. an optional U+0020 space and a maximal run of letters, of numbers, or of
 *     "other" characters (neither space, letter nor number);
 *  5. a whitespace run not followed by a non-space: the whole run at the end of the
 *     text, else (backtracking) the run minus its last character, if that leaves one;
 *  6. otherwise the whole whitespace run (a single character here).
 * Character classes come from zoff_unicode_class_of (a table generated from the
 * `regex` module). Invalid UTF-8 bytes are single OTHER characters, so any byte
 * string is split and encodes losslessly. */
#include "zoff/data.h"

int zoff_utf8_char(const char *text, size_t n, size_t *len, uint32_t *codepoint) {
    const uint8_t *s = (const uint8_t *)text;
    uint8_t c = s[0];
    *len = 1;
    *codepoint = c;
    if (c < 0x80) return 1;
    uint32_t cp;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) { need = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3; cp = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;      /* no overlong forms */
        else if (c == 0xED) hi = 0x9F; /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4; cp = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        else if (c == 0xF4) hi = 0x8F; /* <= U+10FFFF */
    } else
        return -1;
    for (size_t i = 1; i < need; i++) {
        *len = i;
        if (i >= n) return 0;
        if (s[i] < (i == 1 ? lo : 0x80) || s[i] > (i == 1 ? hi : 0xBF)) return -1;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *len = need;
    *codepoint = cp;
    return 1;
}

/* zoff_unicode_class_of of the ASCII characters, looked up here without a call (most text is ASCII). */
static uint8_t g_ascii_class[128];

__attribute__((constructor)) static void ascii_class_init(void) {
    for (uint32_t c = 0; c < 128; c++) g_ascii_class[c] = (uint8_t)zoff_unicode_class_of(c);
}

/* Class and byte length of the character at s[0] (n >= 1): an invalid or cut-short byte is one OTHER. */
static inline zoff_unicode_class char_at(const uint8_t *s, size_t n, size_t *len) {
    if (s[0] < 0x80) {
        *len = 1;
        return (zoff_unicode_class)g_ascii_class[s[0]];
    }
    uint32_t cp;
    if (zoff_utf8_char((const char *)s, n, len, &cp) != 1) {
        *len = 1;
        return ZOFF_UCLASS_OTHER;
    }
    return zoff_unicode_class_of(cp);
}

size_t zoff_gpt2_pretokenize_next(const char *text, size_t n) {
    const uint8_t *s = (const uint8_t *)text;
    if (n == 0) return 0;
    if (s[0] == '\'' && n >= 2) {
        uint8_t a = s[1];
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (n >= 3) {
            uint8_t b = s[2];
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        }
    }
    size_t len;
    zoff_unicode_class k = char_at(s, n, &len);
    size_t i = 0;
    if (s[0] == ' ' && n > 1) {
        size_t len1;
        zoff_unicode_class k1 = char_at(s + 1, n - 1, &len1);
        if (k1 != ZOFF_UCLASS_SPACE) {
            k = k1;
            i = 1;
        }
    }
    if (k != ZOFF_UCLASS_SPACE) { /* alternatives 2-4: maximal run of class k after i */
        while (i < n) {
            if (char_at(s + i, n - i, &len) != k) break;
            i += len;
        }
        return i;
    }
    size_t last = 0, count = 0; /* alternatives 5-6 */
    while (i < n) {
        if (char_at(s + i, n - i, &len) != ZOFF_UCLASS_SPACE) break;
        last = i;
        i += len;
        count++;
    }
    if (i == n) return i;
    return count >= 2 ? last : i;
}
