/* Fuzz the GPT-2 tokenizer's table loader: zoff_tokenizer_open_gpt2 on a fuzzed encoder.json
 * and vocab.bpe. Input: the encoder.json bytes, a NUL byte, the vocab.bpe bytes (JSON
 * cannot hold a raw NUL, so the split is unambiguous).
 *
 * Checks: no crash / UB / leak; every error has a message naming one of the two files; with
 * tables that load, every token decodes, and encode then decode gives back the text exactly
 * (for a fixed sample and for the input bytes themselves) with ids inside the vocabulary. */
#include "fuzz_util.h"
#include "zoff/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    return 0;
}

static void tables_roundtrip(zoff_tokenizer *t, const char *text, size_t len) {
    zoff_tokens ids = {0};
    zoff_status s = zoff_tokenizer_encode(t, text, len, &ids);
    FUZZ_CHECK(s == ZOFF_OK, "encode: %s", zoff_last_error());
    int32_t V = zoff_tokenizer_vocab_size(t);
    for (size_t i = 0; i < ids.n; i++) FUZZ_CHECK(ids.ids[i] >= 0 && ids.ids[i] < V, "id %d outside [0, %d)", ids.ids[i], V);
    FUZZ_CHECK(ids.n <= len, "%zu ids for %zu bytes", ids.n, len);
    char *back = NULL;
    size_t bl = 0;
    s = zoff_tokenizer_decode(t, ids.ids, ids.n, &back, &bl);
    FUZZ_CHECK(s == ZOFF_OK, "decode: %s", zoff_last_error());
    FUZZ_CHECK(bl == len && memcmp(back, text, len) == 0, "decode(encode(x)) != x (%zu vs %zu bytes)", bl, len);
    free(back);
    zoff_tokens_free(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t ej = nul ? (size_t)(nul - data) : size;
    const uint8_t *bpe = nul ? nul + 1 : data + size;
    size_t bn = nul ? size - ej - 1 : 0;

    char enc_path[512], bpe_path[512];
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", fuzz_dir());
    snprintf(bpe_path, sizeof bpe_path, "%s/vocab.bpe", fuzz_dir());
    fuzz_write_file(enc_path, data, ej);
    fuzz_write_file(bpe_path, bpe, bn);

    zoff_tokenizer *t = NULL;
    zoff_status s = zoff_tokenizer_open_gpt2(enc_path, bpe_path, &t);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, NULL);
        const char *m = zoff_last_error();
        FUZZ_CHECK(strstr(m, enc_path) || strstr(m, bpe_path), "message names neither table file: %s", m);
        FUZZ_CHECK(t == NULL, "failed open returned a tokenizer");
        return 0;
    }
    int32_t V = zoff_tokenizer_vocab_size(t);
    FUZZ_CHECK(V >= 256 && V <= 65536, "vocab size %d", V);
    int32_t eot = zoff_tokenizer_eot(t);
    FUZZ_CHECK(eot >= -1 && eot < V, "eot %d", eot);
    for (int32_t id = 0; id < V; id++) {
        size_t l = 0;
        FUZZ_CHECK(zoff_tokenizer_token_bytes(t, id, &l) != NULL, "token %d has no bytes", id);
    }
    size_t l = 1;
    FUZZ_CHECK(zoff_tokenizer_token_bytes(t, V, &l) == NULL && l == 0, "token V");
    static const char sample[] = "Hello world! It's 2024: don't  stop\n\n\tnow -- caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac "
                                 "<|endoftext|> 12345 \xff\xfe ok";
    tables_roundtrip(t, sample, sizeof sample - 1);
    tables_roundtrip(t, (const char *)bpe, bn);
    tables_roundtrip(t, (const char *)data, ej);
    zoff_tokenizer_free(t);
    return 0;
}
