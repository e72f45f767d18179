/* Fuzz the token-shard reader, datasets and the batch loader.
 *
 * Input: a 16-byte parameter block, then the bytes of a shard file.
 *   p[0]  batch size 1 + p[0] % 4        p[1]  seq_len 1 + p[1] % 32
 *   p[2]  bits 0-1: vocab size {0, 256, 50257, 65536} passed to the reader
 *         bit 2: set the header's token count to match the file size (reach the token checks)
 *         bit 3: split the shard bytes over two files (at p[3] * 2 tokens) and open the directory
 *         bit 4: shuffle        bits 5-6: split ALL / TRAIN / VAL
 *   p[3]  split point (tokens)  p[4]  val_tokens
 *   p[8..15]  a loader position to restore (epoch:32, window:32), as a corrupt checkpoint could hold
 *
 * Checks: no crash / UB / leak; every error has a message naming the file; an opened shard
 * has exactly 1024 + 2n bytes and (vocab > 0) only ids below the vocabulary; batches hold
 * tokens of the data with targets = inputs shifted by one; saving and restoring the loader
 * position continues with the same batch; a bad position is refused. */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "zoff/data.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    return 0;
}

static void shard_check_batch(const int32_t *x, const int32_t *y, int64_t B, int64_t T, int32_t vocab) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            int32_t a = x[b * T + t], c = y[b * T + t];
            FUZZ_CHECK(a >= 0 && a < 65536 && c >= 0 && c < 65536, "token out of uint16 range");
            if (vocab > 0) FUZZ_CHECK(a < vocab && c < vocab, "token %d/%d not below vocab %d", a, c, vocab);
            if (t + 1 < T) FUZZ_CHECK(y[b * T + t] == x[b * T + t + 1], "targets are not inputs shifted by one");
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 16 || size > (1 << 20)) return 0;
    const uint8_t *p = data;
    const int64_t B = 1 + p[0] % 4, T = 1 + p[1] % 32;
    static const int32_t vocabs[4] = {0, 256, 50257, 65536};
    const int32_t vocab = vocabs[p[2] & 3];
    const bool fix_count = p[2] & 4, two = p[2] & 8, shuffle = p[2] & 16;
    const int split = (p[2] >> 5) & 3;
    size_t n = size - 16;
    uint8_t *file = malloc(n ? n : 1);
    memcpy(file, data + 16, n);
    if (fix_count && n >= ZOFF_SHARD_HEADER_BYTES)
        fuzz_put_u32(file + 8, (uint32_t)((n - ZOFF_SHARD_HEADER_BYTES) / 2));

    char dir[512], a[600], b[600];
    snprintf(dir, sizeof dir, "%s/shards", fuzz_dir());
    fuzz_rmtree(dir);
    if (mkdir(dir, 0755)) abort();
    snprintf(a, sizeof a, "%s/a.bin", dir);
    snprintf(b, sizeof b, "%s/b.bin", dir);
    fuzz_write_file(a, file, n);

    zoff_shard *sh = NULL;
    zoff_status s = zoff_shard_open(a, vocab, &sh);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, a);
        FUZZ_CHECK(sh == NULL, "failed open returned a shard");
        free(file);
        return 0;
    }
    int64_t nt = zoff_shard_num_tokens(sh);
    FUZZ_CHECK(nt >= 0 && (size_t)(ZOFF_SHARD_HEADER_BYTES + 2 * nt) == n, "accepted a shard of the wrong size");
    s = zoff_shard_check_tokens(sh, 0, nt); /* ids are checked when read; here all of them */
    if (s != ZOFF_OK) {
        fuzz_check_error(s, a);
        zoff_shard_close(sh);
        free(file);
        return 0;
    }
    const uint16_t *tok = zoff_shard_tokens(sh);
    if (vocab > 0)
        for (int64_t i = 0; i < nt; i++) FUZZ_CHECK(tok[i] < vocab, "accepted token %u >= vocab %d", tok[i], vocab);
    FUZZ_CHECK(zoff_shard_vocab_size(sh) >= 0 && zoff_shard_vocab_size(sh) <= 65536, "header vocab");
    zoff_shard_close(sh);

    const char *pattern = a;
    if (two) { /* the same tokens as two valid shards written by zoff, opened as a directory */
        int64_t cut = (int64_t)p[3] * 2;
        if (cut > nt) cut = nt;
        const uint16_t *t = (const uint16_t *)(file + ZOFF_SHARD_HEADER_BYTES);
        unlink(a);
        s = zoff_shard_write(a, t, cut, vocab == 65536 ? 0 : vocab);
        if (s == ZOFF_OK) s = zoff_shard_write(b, t + cut, nt - cut, vocab == 65536 ? 0 : vocab);
        FUZZ_CHECK(s == ZOFF_OK, "writing shards of tokens that were accepted: %s", zoff_last_error());
        pattern = dir;
    }
    free(file);

    zoff_dataset *ds = NULL;
    s = zoff_dataset_open(pattern, vocab, &ds);
    FUZZ_CHECK(s == ZOFF_OK, "dataset of an accepted shard: %s", zoff_last_error());
    FUZZ_CHECK(zoff_dataset_num_tokens(ds) == nt, "dataset token count");
    zoff_loader_options o = zoff_loader_defaults(B, T);
    o.shuffle = shuffle;
    o.split = split == 1 ? ZOFF_SPLIT_TRAIN : split == 2 ? ZOFF_SPLIT_VAL : ZOFF_SPLIT_ALL;
    o.val_tokens = p[4];
    o.seed = fuzz_u32(p + 4);
    zoff_loader *l = NULL, *l2 = NULL;
    s = zoff_loader_create(ds, &o, &l);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, NULL);
        zoff_dataset_free(ds);
        return 0;
    }
    int32_t *x = malloc((size_t)(B * T) * sizeof *x), *y = malloc((size_t)(B * T) * sizeof *y);
    int32_t *x2 = malloc((size_t)(B * T) * sizeof *x2), *y2 = malloc((size_t)(B * T) * sizeof *y2);
    for (int i = 0; i < 3; i++) {
        FUZZ_CHECK(zoff_loader_next(l, x, y) == ZOFF_OK, "next");
        shard_check_batch(x, y, B, T, vocab);
    }
    zoff_loader_state st = zoff_loader_get_state(l);
    FUZZ_CHECK(zoff_loader_create(ds, &o, &l2) == ZOFF_OK, "second loader");
    FUZZ_CHECK(zoff_loader_set_state(l2, &st) == ZOFF_OK, "restore: %s", zoff_last_error());
    FUZZ_CHECK(zoff_loader_next(l, x, y) == ZOFF_OK && zoff_loader_next(l2, x2, y2) == ZOFF_OK, "next");
    FUZZ_CHECK(memcmp(x, x2, (size_t)(B * T) * sizeof *x) == 0 && memcmp(y, y2, (size_t)(B * T) * sizeof *y) == 0,
               "restored loader gives another batch");

    /* a position from a corrupt checkpoint: refused, or accepted and usable */
    zoff_loader_state bad = st;
    bad.epoch = (int64_t)(int32_t)fuzz_u32(p + 8) * (p[8] & 1 ? INT64_C(1) << 32 : 1);
    bad.window = (int32_t)fuzz_u32(p + 12);
    if (p[9] & 2) bad.epoch = INT64_MAX - (p[10] & 3);
    s = zoff_loader_set_state(l2, &bad);
    if (s != ZOFF_OK) fuzz_check_error(s, NULL);
    else {
        FUZZ_CHECK(zoff_loader_next(l2, x2, y2) == ZOFF_OK, "next after restoring an accepted position");
        shard_check_batch(x2, y2, B, T, vocab);
    }
    free(x);
    free(y);
    free(x2);
    free(y2);
    zoff_loader_free(l);
    zoff_loader_free(l2);
    zoff_dataset_free(ds);
    return 0;
}
