/* Fuzz encoding and decoding with the real GPT-2 tables (data/gpt2) and the byte tokenizer.
 *
 * Input: arbitrary bytes, used as text (any bytes, invalid UTF-8 included) and as a list of
 * little-endian int32 token ids for decode.
 *
 * Checks: no crash / UB / leak; the pre-tokeniser cuts the text into non-empty pieces that
 * cover it; decode(encode(x)) == x exactly; encoding the same text again (now from the piece
 * cache) gives the same ids; ids are inside the vocabulary; decoding ids outside it is an
 * error naming the id, inside it matches token_bytes. */
#include "fuzz_util.h"
#include "zoff/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static zoff_tokenizer *text_gpt2, *text_byte;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    char enc[4096], bpe[4096];
    if (zoff_data_find("gpt2/encoder.json", enc, sizeof enc) != ZOFF_OK ||
        zoff_data_find("gpt2/vocab.bpe", bpe, sizeof bpe) != ZOFF_OK ||
        zoff_tokenizer_open_gpt2(enc, bpe, &text_gpt2) != ZOFF_OK || zoff_tokenizer_open_byte(&text_byte) != ZOFF_OK) {
        fprintf(stderr, "fuzz_tokenizer_text: cannot load the GPT-2 tables: %s\n", zoff_last_error());
        abort();
    }
    return 0;
}

static void text_roundtrip(zoff_tokenizer *t, const char *text, size_t len) {
    zoff_tokens a = {0}, b = {0};
    FUZZ_CHECK(zoff_tokenizer_encode(t, text, len, &a) == ZOFF_OK, "encode: %s", zoff_last_error());
    FUZZ_CHECK(zoff_tokenizer_encode(t, text, len, &b) == ZOFF_OK, "encode again: %s", zoff_last_error());
    FUZZ_CHECK(a.n == b.n && (a.n == 0 || memcmp(a.ids, b.ids, a.n * sizeof *a.ids) == 0),
               "%s: the second encoding (piece cache) differs from the first", zoff_tokenizer_name(t));
    int32_t V = zoff_tokenizer_vocab_size(t);
    for (size_t i = 0; i < a.n; i++) FUZZ_CHECK(a.ids[i] >= 0 && a.ids[i] < V, "id %d outside [0, %d)", a.ids[i], V);
    char *back = NULL;
    size_t bl = 0;
    FUZZ_CHECK(zoff_tokenizer_decode(t, a.ids, a.n, &back, &bl) == ZOFF_OK, "decode: %s", zoff_last_error());
    FUZZ_CHECK(bl == len && memcmp(back, text, len) == 0 && back[bl] == 0, "%s: decode(encode(x)) != x",
               zoff_tokenizer_name(t));
    free(back);
    zoff_tokens_free(&a);
    zoff_tokens_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    const char *text = (const char *)data;

    for (size_t pos = 0; pos < size;) {
        size_t n = zoff_gpt2_pretokenize_next(text + pos, size - pos);
        FUZZ_CHECK(n > 0 && n <= size - pos, "pre-tokeniser piece of %zu bytes at %zu of %zu", n, pos, size);
        pos += n;
    }
    FUZZ_CHECK(zoff_gpt2_pretokenize_next(text, 0) == 0, "empty text");

    text_roundtrip(text_gpt2, text, size);
    text_roundtrip(text_byte, text, size);

    /* the bytes as token ids */
    size_t nid = size / 4;
    int32_t *ids = malloc((nid ? nid : 1) * sizeof *ids);
    for (size_t i = 0; i < nid; i++) ids[i] = (int32_t)fuzz_u32(data + 4 * i);
    zoff_tokenizer *ts[2] = {text_gpt2, text_byte};
    for (int k = 0; k < 2; k++) {
        int32_t V = zoff_tokenizer_vocab_size(ts[k]);
        size_t first_bad = nid;
        for (size_t i = 0; i < nid && first_bad == nid; i++)
            if (ids[i] < 0 || ids[i] >= V) first_bad = i;
        char *out = NULL;
        size_t ol = 0;
        zoff_status s = zoff_tokenizer_decode(ts[k], ids, nid, &out, &ol);
        if (first_bad < nid) {
            char want[32];
            snprintf(want, sizeof want, "token %d at index %zu", (int)ids[first_bad], first_bad);
            fuzz_check_error(s, want);
            FUZZ_CHECK(out == NULL, "failed decode returned text");
            continue;
        }
        FUZZ_CHECK(s == ZOFF_OK, "decode of valid ids: %s", zoff_last_error());
        size_t off = 0;
        for (size_t i = 0; i < nid; i++) {
            size_t l = 0;
            const char *tb = zoff_tokenizer_token_bytes(ts[k], ids[i], &l);
            FUZZ_CHECK(tb && off + l <= ol && memcmp(out + off, tb, l) == 0, "decode differs from token_bytes");
            off += l;
        }
        FUZZ_CHECK(off == ol, "decode length");
        free(out);
    }
    free(ids);
    return 0;
}
