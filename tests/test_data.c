/* Tests for src/data: shards, datasets, the loader, tokenizers, zoff tokenize. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/data.h"

static char g_dir[256];
static zoff_tokenizer *g_gpt2;

#include "test_util.h"
#define CHECK_OK(expr) assert_ok(expr)

static void expect_error(zoff_status got, zoff_status want, const char *const *needles) {
    if (got != want)
        fail_msg("expected %s, got %s: %s", zoff_status_name(want), zoff_status_name(got), zoff_last_error());
    for (; needles && *needles; needles++)
        if (!strstr(zoff_last_error(), *needles))
            fail_msg("error message lacks \"%s\": %s", *needles, zoff_last_error());
}

static char *path_in(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

static void make_subdir(const char *name) {
    char *p = path_in(name);
    nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    assert_int_equal(mkdir(p, 0755), 0);
}

static void write_text(const char *path, const char *text, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void write_raw_shard(const char *path, int32_t magic, int32_t version, int32_t count, size_t actual_tokens) {
    int32_t h[256] = {0};
    h[0] = magic;
    h[1] = version;
    h[2] = count;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(h, 4, 256, f);
    for (size_t i = 0; i < actual_tokens; i++) {
        uint16_t t = (uint16_t)(i % 1000);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

/* --------------------------------------------------------------------- shards */

static void test_shard_round_trip(void **state) {
    (void)state;
    enum { N = 100003 };
    uint16_t *tok = malloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)((i * 7919u) % 50257u);
    const char *p = path_in("rt.bin");
    CHECK_OK(zoff_shard_write(p, tok, N, 50257));
    zoff_shard *s;
    CHECK_OK(zoff_shard_open(p, 50257, &s));
    assert_int_equal(zoff_shard_num_tokens(s), N);
    assert_int_equal(zoff_shard_vocab_size(s), 50257);
    assert_memory_equal(zoff_shard_tokens(s), tok, N * sizeof *tok);
    assert_string_equal(zoff_shard_path(s), p);
    zoff_shard_close(s);

    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_int_equal(st.st_size, 1024 + 2 * N);

    /* empty shard is valid */
    CHECK_OK(zoff_shard_write(path_in("empty.bin"), NULL, 0, 256));
    CHECK_OK(zoff_shard_open(path_in("empty.bin"), 256, &s));
    assert_int_equal(zoff_shard_num_tokens(s), 0);
    zoff_shard_close(s);

    /* writer rejects ids outside the vocabulary and leaves nothing */
    for (int i = 0; i < 10; i++) tok[i] = (uint16_t)i;
    tok[5] = 300;
    const char *bad = path_in("badvocab.bin");
    expect_error(zoff_shard_write(bad, tok, 10, 256), ZOFF_ERR_INVALID, (const char *[]){"token 5 is 300", NULL});
    assert_int_not_equal(access(bad, F_OK), 0);
    free(tok);
}

static void test_shard_write_atomic(void **state) {
    (void)state;
    make_subdir("atomic");
    uint16_t tok[4] = {1, 2, 3, 4};
    const char *p = path_in("atomic/a.bin");
    CHECK_OK(zoff_shard_write(p, tok, 4, 0));
    assert_int_equal(count_files(path_in("atomic")), 1); /* no temporaries left */
    /* overwrite replaces whole */
    uint16_t tok2[2] = {9, 9};
    CHECK_OK(zoff_shard_write(p, tok2, 2, 0));
    zoff_shard *s;
    CHECK_OK(zoff_shard_open(p, 0, &s));
    assert_int_equal(zoff_shard_num_tokens(s), 2);
    zoff_shard_close(s);
    assert_int_equal(count_files(path_in("atomic")), 1);
    /* missing directory: clear error, nothing created */
    expect_error(zoff_shard_write(path_in("no/such/dir/x.bin"), tok, 4, 0), ZOFF_ERR_INVALID,
                 (const char *[]){"no/such/dir/x.bin", NULL});
    /* too many tokens for one header */
    expect_error(zoff_shard_write(p, tok, (int64_t)INT32_MAX + 1, 0), ZOFF_ERR_INVALID,
                 (const char *[]){"--shard-size", NULL});
}

static void test_shard_bad_files(void **state) {
    (void)state;
    zoff_shard *s = (zoff_shard *)(uintptr_t)1;
    const char *p = path_in("bad.bin");

    write_raw_shard(p, 12345, 1, 10, 10);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){p, "magic is 12345", "20240520", NULL});
    assert_null(s);

    write_raw_shard(p, ZOFF_SHARD_MAGIC, 7, 10, 10);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){p, "version 7", "expected 1", NULL});
    write_raw_shard(p, ZOFF_SHARD_MAGIC, 2, 10, 10);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){"uint32", NULL});

    write_raw_shard(p, ZOFF_SHARD_MAGIC, 1, 10, 9);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT,
                 (const char *[]){p, "truncated: header says 10 tokens (1044 bytes) but file has 1042 bytes",
                                  "re-run zoff tokenize", NULL});

    write_raw_shard(p, ZOFF_SHARD_MAGIC, 1, 10, 12);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT,
                 (const char *[]){p, "oversized: header says 10 tokens (1044 bytes) but file has 1048 bytes", NULL});

    write_raw_shard(p, ZOFF_SHARD_MAGIC, 1, -5, 0);
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){"negative", NULL});

    write_text(p, "\xb8\xd0\x34\x01\x01", 5); /* shorter than a header */
    expect_error(zoff_shard_open(p, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){p, "truncated", "header", NULL});

    /* text given as a shard (a corpus, short or long): the tokenize command that makes shards of it */
    const char *txt = path_in("corpus.txt");
    write_text(txt, "short", 5);
    expect_error(zoff_shard_open(txt, 0, &s), ZOFF_ERR_FORMAT,
                 (const char *[]){"corpus.txt is text, not a token shard", "zoff tokenize --output-prefix ",
                                  "/corpus.txt writes ", "/corpus_train.bin",
                                  "give those as --data-path (to zoff train or zoff eval)", NULL});
    char long_text[3000];
    const char line[] = "caf\xc3\xa9 au lait,\tdeux\r\n"; /* UTF-8, a tab, CRLF */
    for (size_t i = 0; i < sizeof long_text; i++) long_text[i] = line[i % (sizeof line - 1)];
    write_text(txt, long_text, sizeof long_text);
    expect_error(zoff_shard_open(txt, 0, &s), ZOFF_ERR_FORMAT, (const char *[]){"is text, not a token shard", NULL});
    assert_null(s);

    expect_error(zoff_shard_open(path_in("missing.bin"), 0, &s), ZOFF_ERR_INVALID,
                 (const char *[]){"missing.bin", "zoff tokenize", NULL});

    /* token id >= vocab: not scanned at open, refused when its range is checked,
     * naming file, position and vocabulary */
    uint16_t tok[8] = {1, 2, 3, 4, 255, 256, 7, 8};
    CHECK_OK(zoff_shard_write(p, tok, 8, 0));
    CHECK_OK(zoff_shard_open(p, 256, &s));
    CHECK_OK(zoff_shard_check_tokens(s, 0, 5));
    CHECK_OK(zoff_shard_check_tokens(s, 6, 8));
    expect_error(zoff_shard_check_tokens(s, 0, 8), ZOFF_ERR_FORMAT,
                 (const char *[]){p, "position 5", "is 256", "vocab size 256", NULL});
    expect_error(zoff_shard_check_tokens(s, 5, 6), ZOFF_ERR_FORMAT, (const char *[]){p, "position 5", NULL});
    expect_error(zoff_shard_check_tokens(s, 4, 9), ZOFF_ERR_INVALID, (const char *[]){p, "outside", NULL});
    zoff_shard_close(s);
    CHECK_OK(zoff_shard_open(p, 257, &s));
    CHECK_OK(zoff_shard_check_tokens(s, 0, 8));
    zoff_shard_close(s);
    CHECK_OK(zoff_shard_open(p, 0, &s)); /* no vocabulary: every uint16 is an id */
    CHECK_OK(zoff_shard_check_tokens(s, 0, 8));
    zoff_shard_close(s);
    /* header vocab larger than the run's vocab */
    CHECK_OK(zoff_shard_write(p, tok, 4, 50257));
    expect_error(zoff_shard_open(p, 256, &s), ZOFF_ERR_FORMAT, (const char *[]){"50257", NULL});
}

/* A shard over 2 GiB: a sparse file, checked without writing the bytes. */
static void test_shard_large(void **state) {
    (void)state;
    const char *p = path_in("large.bin");
    const int64_t n = 1200000001; /* 2.4 GB of tokens */
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    assert_true(fd >= 0);
    int32_t h[256] = {ZOFF_SHARD_MAGIC, ZOFF_SHARD_VERSION, (int32_t)n};
    assert_int_equal(pwrite(fd, h, sizeof h, 0), (ssize_t)sizeof h);
    if (ftruncate(fd, 1024 + 2 * n) != 0) {
        close(fd);
        unlink(p);
        skip(); /* file system without sparse files / space */
    }
    uint16_t tail[3] = {11, 22, 33};
    assert_int_equal(pwrite(fd, tail, sizeof tail, 1024 + 2 * (n - 3)), (ssize_t)sizeof tail);
    close(fd);
    zoff_shard *s;
    CHECK_OK(zoff_shard_open(p, 0, &s)); /* no vocab scan: header + size only */
    assert_int_equal(zoff_shard_num_tokens(s), n);
    assert_int_equal(zoff_shard_tokens(s)[n - 1], 33);
    assert_int_equal(zoff_shard_tokens(s)[n - 3], 11);
    assert_int_equal(zoff_shard_tokens(s)[(int64_t)1100000000], 0);
    /* a loader reaching past 2 GiB */
    zoff_dataset *ds;
    CHECK_OK(zoff_dataset_open(p, 0, &ds));
    zoff_loader_options o = zoff_loader_defaults(1, 2);
    o.shuffle = false;
    zoff_loader *l;
    CHECK_OK(zoff_loader_create(ds, &o, &l));
    zoff_loader_state st = zoff_loader_get_state(l);
    st.window = zoff_loader_num_windows(l) - 1; /* the last window: tokens n-3 .. n-1 */
    CHECK_OK(zoff_loader_set_state(l, &st));
    int32_t x[2], y[2];
    CHECK_OK(zoff_loader_next(l, x, y));
    assert_int_equal(x[0], 11);
    assert_int_equal(x[1], 22);
    assert_int_equal(y[1], 33);
    zoff_loader_free(l);
    zoff_dataset_free(ds);
    zoff_shard_close(s);
    unlink(p);
}

/* -------------------------------------------------------------------- datasets */

/* The shards too short for one window (seq_len + 1 tokens), train's and eval's one rule: by hand, for
 * shards of 16, 17, 5 and 100 tokens; the loader reads windows of the others only. */
static void test_dataset_short_shards(void **state) {
    (void)state;
    make_subdir("short");
    const int lens[4] = {16, 17, 5, 100};
    uint16_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint16_t)i;
    char pat[2600] = "";
    for (int k = 0; k < 4; k++) {
        char name[64];
        snprintf(name, sizeof name, "short/s%d.bin", k);
        CHECK_OK(zoff_shard_write(path_in(name), tok, lens[k], 0));
        size_t u = strlen(pat);
        snprintf(pat + u, sizeof pat - u, "%s%s", k ? "," : "", path_in(name));
    }
    zoff_dataset *ds;
    CHECK_OK(zoff_dataset_open(pat, 256, &ds));
    /* seq_len 16: windows of 17 tokens; 16 and 5 tokens are too short */
    assert_int_equal(zoff_dataset_next_short_shard(ds, 16, 0), 0);
    assert_int_equal(zoff_dataset_next_short_shard(ds, 16, 1), 2);
    assert_int_equal(zoff_dataset_next_short_shard(ds, 16, 3), -1);
    assert_int_equal(zoff_dataset_next_short_shard(ds, 16, 4), -1);
    /* seq_len 5: only the 5-token shard; seq_len 4: none (5 tokens are one window of 5) */
    assert_int_equal(zoff_dataset_next_short_shard(ds, 5, 0), 2);
    assert_int_equal(zoff_dataset_next_short_shard(ds, 5, 3), -1);
    assert_int_equal(zoff_dataset_next_short_shard(ds, 4, 0), -1);
    /* the loader reads the others' windows only: (17 - 1) / 16 + (100 - 1) / 16 = 1 + 6 */
    zoff_loader_options lo = zoff_loader_defaults(1, 16);
    zoff_loader *ld;
    CHECK_OK(zoff_loader_create(ds, &lo, &ld));
    assert_int_equal(zoff_loader_num_windows(ld), 7);
    zoff_loader_free(ld);
    zoff_dataset_free(ds);
}

static void test_dataset_patterns(void **state) {
    (void)state;
    make_subdir("ds");
    uint16_t tok[100];
    for (int i = 0; i < 100; i++) tok[i] = (uint16_t)i;
    CHECK_OK(zoff_shard_write(path_in("ds/train_000001.bin"), tok + 50, 50, 0));
    CHECK_OK(zoff_shard_write(path_in("ds/train_000000.bin"), tok, 50, 0));
    CHECK_OK(zoff_shard_write(path_in("ds/val_000000.bin"), tok, 10, 0));
    write_text(path_in("ds/notes.txt"), "x", 1);

    zoff_dataset *ds;
    char pat[600];
    snprintf(pat, sizeof pat, "%s/ds/train_*.bin", g_dir);
    CHECK_OK(zoff_dataset_open(pat, 256, &ds));
    assert_int_equal(zoff_dataset_num_shards(ds), 2);
    assert_int_equal(zoff_dataset_num_tokens(ds), 100);
    assert_non_null(strstr(zoff_shard_path(zoff_dataset_shard(ds, 0)), "train_000000"));
    assert_int_equal(zoff_shard_tokens(zoff_dataset_shard(ds, 1))[0], 50);
    zoff_dataset_free(ds);

    CHECK_OK(zoff_dataset_open(path_in("ds"), 256, &ds)); /* directory: all .bin, sorted */
    assert_int_equal(zoff_dataset_num_shards(ds), 3);
    assert_int_equal(zoff_dataset_num_tokens(ds), 110);
    zoff_dataset_free(ds);

    snprintf(pat, sizeof pat, "%s/ds/val_000000.bin,%s/ds/train_000000.bin", g_dir, g_dir);
    CHECK_OK(zoff_dataset_open(pat, 256, &ds));
    assert_int_equal(zoff_dataset_num_shards(ds), 2);
    assert_int_equal(zoff_dataset_num_tokens(ds), 60);
    /* one file in two datasets, or twice in one (another spelling of its path) */
    zoff_dataset *ds2;
    int ia = -1, ib = -1;
    snprintf(pat, sizeof pat, "%s/ds/train_000001.bin,%s/ds/../ds/train_000000.bin", g_dir, g_dir);
    CHECK_OK(zoff_dataset_open(pat, 256, &ds2));
    assert_false(zoff_dataset_same_file(ds, ds, &ia, &ib));
    assert_true(zoff_dataset_same_file(ds, ds2, &ia, &ib));
    assert_int_equal(ia, 1);
    assert_int_equal(ib, 1);
    zoff_dataset_free(ds2);
    snprintf(pat, sizeof pat, "%s/ds/train_000000.bin,%s/ds", g_dir, g_dir);
    CHECK_OK(zoff_dataset_open(pat, 256, &ds2));
    assert_true(zoff_dataset_same_file(ds2, ds2, &ia, &ib));
    assert_int_equal(ia, 0);
    assert_int_equal(ib, 1); /* the folder's first shard, train_000000.bin */
    zoff_dataset_free(ds2);
    zoff_dataset_free(ds);

    snprintf(pat, sizeof pat, "%s/ds/nothing_*.bin", g_dir);
    expect_error(zoff_dataset_open(pat, 256, &ds), ZOFF_ERR_INVALID,
                 (const char *[]){"no files match", "nothing_*", NULL});
    assert_null(ds);
    /* a bad id surfaces through the loader when a window holding it is read
     * (train_000001 holds 50..99: id 60 at its position 10), not before */
    CHECK_OK(zoff_dataset_open(path_in("ds"), 60, &ds));
    zoff_loader_options o = zoff_loader_defaults(1, 9);
    o.shuffle = false;
    zoff_loader *l = NULL;
    CHECK_OK(zoff_loader_create(ds, &o, &l));
    int32_t x[9], y[9];
    for (int i = 0; i < 6; i++) CHECK_OK(zoff_loader_next(l, x, y)); /* train_000000's 5 windows, then 50..59 */
    assert_int_equal(x[0], 50);
    assert_int_equal(y[8], 59);
    expect_error(zoff_loader_next(l, x, y), ZOFF_ERR_FORMAT,
                 (const char *[]){"train_000001.bin", "position 10", "is 60", "vocab size 60", NULL});
    zoff_loader_free(l);
    zoff_dataset_free(ds);
}

/* ---------------------------------------------------------------------- loader */

/* tokens[i] = i % 50000 over 3 shards, so windows are recognisable */
static zoff_dataset *make_seq_dataset(const char *sub, int64_t n0, int64_t n1, int64_t n2) {
    make_subdir(sub);
    int64_t ns[3] = {n0, n1, n2}, off = 0;
    for (int k = 0; k < 3; k++) {
        uint16_t *t = malloc((size_t)ns[k] * 2 + 2);
        for (int64_t i = 0; i < ns[k]; i++) t[i] = (uint16_t)((off + i) % 50000);
        char name[64];
        snprintf(name, sizeof name, "%s/s%d.bin", sub, k);
        CHECK_OK(zoff_shard_write(path_in(name), t, ns[k], 0));
        free(t);
        off += ns[k];
    }
    zoff_dataset *ds;
    CHECK_OK(zoff_dataset_open(path_in(sub), 50000, &ds));
    return ds;
}

static void check_batch_contiguous(const int32_t *x, const int32_t *y, int64_t B, int64_t T) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            assert_int_equal(y[b * T + t], (x[b * T + t] + 1) % 50000);
            if (t + 1 < T) assert_int_equal(x[b * T + t + 1], y[b * T + t]);
        }
}

static void test_loader_sequential(void **state) {
    (void)state;
    zoff_dataset *ds = make_seq_dataset("seq", 1000, 333, 2001);
    zoff_loader_options o = zoff_loader_defaults(4, 16);
    o.shuffle = false;
    zoff_loader *l;
    CHECK_OK(zoff_loader_create(ds, &o, &l));
    /* windows: (999/16)=62 + (332/16)=20 + (2000/16)=125 */
    assert_int_equal(zoff_loader_num_windows(l), 62 + 20 + 125);
    assert_int_equal(zoff_loader_batches_per_epoch(l), (62 + 20 + 125) / 4);
    int32_t x[64], y[64];
    CHECK_OK(zoff_loader_next(l, x, y));
    for (int b = 0; b < 4; b++) assert_int_equal(x[b * 16], b * 16); /* llm.c layout: B*T+1 contiguous */
    assert_int_equal(y[63], 64);
    check_batch_contiguous(x, y, 4, 16);
    /* walk the epoch: window 62 is the first of shard 1, which starts at token 1000 */
    for (int i = 1; i < 15; i++) CHECK_OK(zoff_loader_next(l, x, y));
    CHECK_OK(zoff_loader_next(l, x, y)); /* batch 15: windows 60..63 */
    assert_int_equal(x[0], 60 * 16);
    assert_int_equal(x[2 * 16], 1000);
    assert_int_equal(x[3 * 16], 1016);
    for (int64_t i = 16; i < zoff_loader_batches_per_epoch(l); i++) CHECK_OK(zoff_loader_next(l, x, y));
    assert_int_equal(zoff_loader_epoch(l), 0);
    CHECK_OK(zoff_loader_next(l, x, y)); /* wraps */
    assert_int_equal(zoff_loader_epoch(l), 1);
    assert_int_equal(x[0], 0);
    zoff_loader_free(l);
    zoff_dataset_free(ds);
}

static void test_loader_shuffle_determinism(void **state) {
    (void)state;
    zoff_dataset *ds = make_seq_dataset("shuf", 5000, 4000, 3001);
    const int64_t B = 5, T = 10;
    zoff_loader_options o = zoff_loader_defaults(B, T);
    o.seed = 42;
    zoff_loader *a, *b, *c;
    CHECK_OK(zoff_loader_create(ds, &o, &a));
    CHECK_OK(zoff_loader_create(ds, &o, &b));
    o.seed = 43;
    CHECK_OK(zoff_loader_create(ds, &o, &c));
    int64_t W = zoff_loader_num_windows(a); /* 499 + 399 + 300 */
    assert_int_equal(W, 1198);
    int64_t nb = zoff_loader_batches_per_epoch(a);
    char *seen = calloc((size_t)W, 1);
    int32_t xa[50], ya[50], xb[50], yb[50], xc[50], yc[50];
    int differ = 0, sequential = 0;
    for (int64_t i = 0; i < nb; i++) {
        CHECK_OK(zoff_loader_next(a, xa, ya));
        CHECK_OK(zoff_loader_next(b, xb, yb));
        CHECK_OK(zoff_loader_next(c, xc, yc));
        assert_memory_equal(xa, xb, sizeof xa);
        assert_memory_equal(ya, yb, sizeof ya);
        differ += memcmp(xa, xc, sizeof xa) != 0;
        check_batch_contiguous(xa, ya, B, T);
        for (int64_t r = 0; r < B; r++) {
            int64_t start = xa[r * T]; /* < 50000, so the global token index */
            int64_t w = start < 5000 ? start / T : start < 9000 ? 499 + (start - 5000) / T : 898 + (start - 9000) / T;
            assert_int_equal(seen[w], 0); /* each window at most once per epoch */
            seen[w] = 1;
            sequential += (i * B + r) == w;
        }
    }
    assert_true(differ > nb / 2);
    assert_true(sequential < 20); /* it is shuffled */
    /* the next epoch is a different order */
    CHECK_OK(zoff_loader_next(a, xa, ya));
    assert_int_equal(zoff_loader_epoch(a), 1);
    zoff_loader_reset(b);
    CHECK_OK(zoff_loader_next(b, xb, yb));
    assert_memory_not_equal(xa, xb, sizeof xa);
    free(seen);
    zoff_loader_free(a);
    zoff_loader_free(b);
    zoff_loader_free(c);
    zoff_dataset_free(ds);
}

static void test_loader_save_restore(void **state) {
    (void)state;
    zoff_dataset *ds = make_seq_dataset("sr", 3000, 2000, 1000);
    const int64_t B = 4, T = 8;
    zoff_loader_options o = zoff_loader_defaults(B, T);
    o.seed = 7;
    zoff_loader *a, *b;
    CHECK_OK(zoff_loader_create(ds, &o, &a));
    int32_t x[32], y[32], x2[32], y2[32];
    int64_t nb = zoff_loader_batches_per_epoch(a);
    /* run into the second epoch, save, continue; a fresh loader restored must match */
    for (int64_t i = 0; i < nb + 3; i++) CHECK_OK(zoff_loader_next(a, x, y));
    zoff_loader_state st = zoff_loader_get_state(a);
    assert_int_equal(st.epoch, 1);
    assert_int_equal(st.window, 3 * B);
    o.seed = 999; /* restoring brings the saved seed back */
    CHECK_OK(zoff_loader_create(ds, &o, &b));
    assert_true(st.contents != 0); /* the same data: the same contents digest */
    assert_true(zoff_loader_get_state(b).contents == st.contents);
    CHECK_OK(zoff_loader_set_state(b, &st));
    for (int64_t i = 0; i < 2 * nb; i++) {
        CHECK_OK(zoff_loader_next(a, x, y));
        CHECK_OK(zoff_loader_next(b, x2, y2));
        assert_memory_equal(x, x2, sizeof x);
        assert_memory_equal(y, y2, sizeof y);
    }
    zoff_loader_free(b);

    /* another micro-batch on resume: the position counts windows, so two batches of B/2 restored
     * from it read exactly the B windows one batch of B restored from it reads (docs/reliability.md) */
    zoff_loader *full, *half;
    o.seed = 7;
    CHECK_OK(zoff_loader_create(ds, &o, &full));
    o.batch_size = B / 2;
    CHECK_OK(zoff_loader_create(ds, &o, &half));
    o.batch_size = B;
    CHECK_OK(zoff_loader_set_state(full, &st));
    CHECK_OK(zoff_loader_set_state(half, &st));
    CHECK_OK(zoff_loader_next(full, x, y));
    CHECK_OK(zoff_loader_next(half, x2, y2));
    CHECK_OK(zoff_loader_next(half, x2 + B / 2 * T, y2 + B / 2 * T));
    assert_memory_equal(x, x2, sizeof x);
    assert_memory_equal(y, y2, sizeof y);
    assert_int_equal(zoff_loader_get_state(half).window, zoff_loader_get_state(full).window);
    zoff_loader_free(full);
    zoff_loader_free(half);

    /* data parallel: ranks 0 and 1 with B together equal one process with 2B */
    o.seed = 7;
    o.batch_size = 2 * B;
    zoff_loader *one;
    CHECK_OK(zoff_loader_create(ds, &o, &one));
    o.batch_size = B;
    o.world_size = 2;
    zoff_loader *r0, *r1;
    o.rank = 0;
    CHECK_OK(zoff_loader_create(ds, &o, &r0));
    o.rank = 1;
    CHECK_OK(zoff_loader_create(ds, &o, &r1));
    int32_t X[64], Y[64];
    for (int i = 0; i < 10; i++) {
        CHECK_OK(zoff_loader_next(one, X, Y));
        CHECK_OK(zoff_loader_next(r0, x, y));
        CHECK_OK(zoff_loader_next(r1, x2, y2));
        assert_memory_equal(X, x, sizeof x);
        assert_memory_equal(X + 32, x2, sizeof x2);
    }
    /* the position moves between world sizes: restore rank-0 state into the 2B loader */
    st = zoff_loader_get_state(r0);
    zoff_loader_reset(one);
    CHECK_OK(zoff_loader_set_state(one, &st));
    CHECK_OK(zoff_loader_next(one, X, Y));
    CHECK_OK(zoff_loader_next(r0, x, y));
    assert_memory_equal(X, x, sizeof x);

    /* mismatches are refused with the reason */
    zoff_loader_options o2 = zoff_loader_defaults(B, T + 1);
    zoff_loader *other;
    CHECK_OK(zoff_loader_create(ds, &o2, &other));
    expect_error(zoff_loader_set_state(other, &st), ZOFF_ERR_INVALID, (const char *[]){"sequence length 8", NULL});
    zoff_loader_free(other);
    o2 = zoff_loader_defaults(B, T);
    o2.shuffle = false;
    CHECK_OK(zoff_loader_create(ds, &o2, &other));
    expect_error(zoff_loader_set_state(other, &st), ZOFF_ERR_INVALID, (const char *[]){"shuffle", NULL});
    zoff_loader_free(other);
    zoff_loader_state bad = st;
    bad.window = -1;
    expect_error(zoff_loader_set_state(one, &bad), ZOFF_ERR_INVALID, (const char *[]){"out of range", NULL});

    zoff_loader_free(a);
    zoff_loader_free(one);
    zoff_loader_free(r0);
    zoff_loader_free(r1);
    zoff_dataset_free(ds);
}

static void test_loader_split(void **state) {
    (void)state;
    zoff_dataset *ds = make_seq_dataset("split", 1000, 1000, 1000); /* N = 3000 */
    zoff_loader_options o = zoff_loader_defaults(2, 9);
    o.split = ZOFF_SPLIT_VAL;
    o.val_tokens = 1500; /* tokens 1500..2999: half of shard 1 and shard 2 */
    zoff_loader *v, *t;
    CHECK_OK(zoff_loader_create(ds, &o, &v));
    o.split = ZOFF_SPLIT_TRAIN;
    CHECK_OK(zoff_loader_create(ds, &o, &t));
    assert_int_equal(zoff_loader_num_windows(v), 499 / 9 + 999 / 9);
    assert_int_equal(zoff_loader_num_windows(t), 999 / 9 + 499 / 9);
    int32_t x[18], y[18];
    for (int64_t i = 0; i < zoff_loader_batches_per_epoch(v); i++) {
        CHECK_OK(zoff_loader_next(v, x, y));
        for (int k = 0; k < 18; k++) assert_true(x[k] >= 1500 && y[k] >= 1500);
    }
    for (int64_t i = 0; i < zoff_loader_batches_per_epoch(t); i++) {
        CHECK_OK(zoff_loader_next(t, x, y));
        for (int k = 0; k < 18; k++) assert_true(x[k] < 1500 && y[k] < 1500);
    }
    zoff_loader_free(v);
    zoff_loader_free(t);
    /* bad splits and too little data */
    o.val_tokens = 3000;
    expect_error(zoff_loader_create(ds, &o, &v), ZOFF_ERR_INVALID, (const char *[]){"validation size 3000", NULL});
    o = zoff_loader_defaults(400, 16);
    expect_error(zoff_loader_create(ds, &o, &v), ZOFF_ERR_INVALID,
                 (const char *[]){"186 windows", "batch 400", NULL});
    o = zoff_loader_defaults(1, 16);
    o.rank = 2;
    o.world_size = 2;
    expect_error(zoff_loader_create(ds, &o, &v), ZOFF_ERR_INVALID, (const char *[]){"rank 2", NULL});
    zoff_dataset_free(ds);
}

/* ------------------------------------------------------------------- tokenizers */

static void test_byte_tokenizer(void **state) {
    (void)state;
    zoff_tokenizer *t;
    CHECK_OK(zoff_tokenizer_open("byte", &t));
    assert_int_equal(zoff_tokenizer_vocab_size(t), 256);
    assert_int_equal(zoff_tokenizer_eot(t), -1);
    assert_string_equal(zoff_tokenizer_name(t), "byte");
    char buf[1024];
    for (int i = 0; i < 1024; i++) buf[i] = (char)((i * 131 + 7) & 0xFF);
    zoff_tokens v = {0};
    CHECK_OK(zoff_tokenizer_encode(t, buf, sizeof buf, &v));
    assert_int_equal(v.n, 1024);
    for (int i = 0; i < 1024; i++) assert_int_equal(v.ids[i], (uint8_t)buf[i]);
    char *out;
    size_t n;
    CHECK_OK(zoff_tokenizer_decode(t, v.ids, v.n, &out, &n));
    assert_int_equal(n, 1024);
    assert_memory_equal(out, buf, 1024);
    free(out);
    v.ids[3] = 256;
    expect_error(zoff_tokenizer_decode(t, v.ids, v.n, &out, &n), ZOFF_ERR_INVALID,
                 (const char *[]){"token 256 at index 3", NULL});
    zoff_tokens_free(&v);
    zoff_tokenizer_free(t);
    expect_error(zoff_tokenizer_open("sentencepiece", &t), ZOFF_ERR_INVALID,
                 (const char *[]){"sentencepiece", "gpt2 or byte", NULL});
}

static void test_pretokenizer(void **state) {
    (void)state;
    struct {
        const char *text;
        const char *pieces[16];
    } cases[] = {
        {"Hello  world\n\n", {"Hello", " ", " world", "\n\n"}},
        {"I'm don't", {"I", "'m", " don", "'t"}},
        {"a\n\nb", {"a", "\n", "\n", "b"}},
        {"x   \ty", {"x", "   ", "\t", "y"}},
        {"12abc ?!'s", {"12", "abc", " ?!'", "s"}},
        {" \xe4\xbd\xa0\xe5\xa5\xbd", {" \xe4\xbd\xa0\xe5\xa5\xbd"}},       /* CJK letters */
        {"e\xcc\x81", {"e", "\xcc\x81"}},                                   /* combining mark is OTHER */
        {"a\xff\xfe b", {"a", "\xff\xfe", " b"}},                            /* invalid bytes are OTHER */
        {"\xc2\xa0\xc2\xa0x", {"\xc2\xa0", "\xc2\xa0", "x"}},                /* NBSP is \s */
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *s = cases[c].text;
        size_t n = strlen(s), pos = 0;
        int k = 0;
        while (pos < n) {
            size_t l = zoff_gpt2_pretokenize_next(s + pos, n - pos);
            assert_true(l > 0);
            const char *want = cases[c].pieces[k++];
            if (!want || strlen(want) != l || memcmp(want, s + pos, l) != 0)
                fail_msg("case %zu piece %d: got \"%.*s\", want \"%s\"", c, k - 1, (int)l, s + pos, want ? want : "(end)");
            pos += l;
        }
        assert_null(cases[c].pieces[k]);
    }
    assert_int_equal(zoff_gpt2_pretokenize_next("", 0), 0);
    assert_int_equal(zoff_unicode_class_of('a'), ZOFF_UCLASS_LETTER);
    assert_int_equal(zoff_unicode_class_of(0x4E2D), ZOFF_UCLASS_LETTER);
    assert_int_equal(zoff_unicode_class_of(0x0663), ZOFF_UCLASS_NUMBER);
    assert_int_equal(zoff_unicode_class_of(0x3000), ZOFF_UCLASS_SPACE);
    assert_int_equal(zoff_unicode_class_of(0x1F600), ZOFF_UCLASS_OTHER);
}

static void test_gpt2_fixture(void **state) {
    (void)state;
    zoff_tokenizer *t = g_gpt2;
    assert_int_equal(zoff_tokenizer_vocab_size(t), 50257);
    assert_int_equal(zoff_tokenizer_eot(t), 50256);
    size_t l;
    const char *b = zoff_tokenizer_token_bytes(t, 50256, &l);
    assert_int_equal(l, 13);
    assert_memory_equal(b, "<|endoftext|>", 13);
    assert_null(zoff_tokenizer_token_bytes(t, 50257, &l));

    json_error_t jerr;
    json_t *root = json_load_file(ZOFF_TEST_DIR "/fixtures/gpt2_bpe_cases.json", 0, &jerr);
    if (!root) fail_msg("cannot read the fixture: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) >= 40);
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *text = json_string_value(json_object_get(c, "text"));
        size_t tl = json_string_length(json_object_get(c, "text"));
        json_t *ids = json_object_get(c, "ids");
        zoff_tokens v = {0};
        CHECK_OK(zoff_tokenizer_encode(t, text, tl, &v));
        size_t want = json_array_size(ids), k;
        for (k = 0; k < v.n && k < want; k++)
            if (v.ids[k] != json_integer_value(json_array_get(ids, k))) break;
        if (k != v.n || k != want)
            fail_msg("case %zu \"%.60s\": ids differ at %zu (got %d of %zu, want %d of %zu)", i, text, k,
                     k < v.n ? (int)v.ids[k] : -1, v.n, k < want ? (int)json_integer_value(json_array_get(ids, k)) : -1,
                     want);
        char *out;
        size_t n;
        CHECK_OK(zoff_tokenizer_decode(t, v.ids, v.n, &out, &n));
        assert_int_equal(n, tl);
        assert_memory_equal(out, text, tl);
        free(out);
        zoff_tokens_free(&v);
    }
    json_decref(root);
}

static void test_gpt2_round_trip_bytes(void **state) {
    (void)state;
    /* arbitrary bytes (invalid UTF-8 included) survive encode/decode */
    uint64_t x = 88172645463325252ull;
    char buf[4096];
    for (int rep = 0; rep < 20; rep++) {
        for (size_t i = 0; i < sizeof buf; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = rep % 2 ? (char)(x & 0xFF) : " \n\tab'1\xc3\xa9\xe4\xb8\xad"[x % 13];
        }
        zoff_tokens v = {0};
        CHECK_OK(zoff_tokenizer_encode(g_gpt2, buf, sizeof buf, &v));
        char *out;
        size_t n;
        CHECK_OK(zoff_tokenizer_decode(g_gpt2, v.ids, v.n, &out, &n));
        assert_int_equal(n, sizeof buf);
        assert_memory_equal(out, buf, sizeof buf);
        for (size_t k = 0; k < v.n; k++) assert_true(v.ids[k] >= 0 && v.ids[k] < 50256);
        free(out);
        zoff_tokens_free(&v);
    }
    /* the literal special-token string is text, not token 50256 */
    zoff_tokens v = {0};
    CHECK_OK(zoff_tokenizer_encode(g_gpt2, "<|endoftext|>", 13, &v));
    assert_true(v.n > 1);
    zoff_tokens_free(&v);
}

static void test_data_find(void **state) {
    (void)state;
    char p[4096];
    make_subdir("datadir");
    make_subdir("datadir/gpt2");
    write_text(path_in("datadir/gpt2/encoder.json"), "{}", 2);
    setenv("ZOFF_DATA_DIR", path_in("datadir"), 1);
    CHECK_OK(zoff_data_find("gpt2/encoder.json", p, sizeof p));
    assert_string_equal(p, path_in("datadir/gpt2/encoder.json"));
    CHECK_OK(zoff_data_find("gpt2/vocab.bpe", p, sizeof p)); /* falls back to the source tree */
    assert_non_null(strstr(p, "/data/gpt2/vocab.bpe"));
    /* a bad table in ZOFF_DATA_DIR is reported, naming the file */
    zoff_tokenizer *t;
    expect_error(zoff_tokenizer_open("gpt2", &t), ZOFF_ERR_FORMAT, (const char *[]){"datadir/gpt2/encoder.json", NULL});
    expect_error(zoff_data_find("gpt2/nope.bin", p, sizeof p), ZOFF_ERR_IO,
                 (const char *[]){"datadir/gpt2/nope.bin", "/usr/local/share/zoff/gpt2/nope.bin", "ZOFF_DATA_DIR", NULL});
    unsetenv("ZOFF_DATA_DIR");
}

/* ------------------------------------------------------------ text -> shards */

static char *big_text(size_t *len) {
    /* ~2.5 MB mixing the fixture strings, long lines and blank lines */
    json_error_t jerr;
    json_t *root = json_load_file(ZOFF_TEST_DIR "/fixtures/gpt2_bpe_cases.json", 0, &jerr);
    assert_non_null(root);
    json_t *cases = json_object_get(root, "cases");
    size_t cap = 3 << 20, n = 0;
    char *s = malloc(cap);
    for (size_t rep = 0; n < (size_t)(2500 * 1000); rep++) {
        json_t *c = json_array_get(cases, rep % json_array_size(cases));
        json_t *tx = json_object_get(c, "text");
        size_t l = json_string_length(tx);
        if (n + l + 2 > cap) break;
        memcpy(s + n, json_string_value(tx), l);
        n += l;
        s[n++] = rep % 3 ? ' ' : '\n';
    }
    json_decref(root);
    *len = n;
    return s;
}

static void test_tokenize_files(void **state) {
    (void)state;
    make_subdir("tok");
    size_t len;
    char *text = big_text(&len);
    write_text(path_in("tok/a.txt"), text, len);
    write_text(path_in("tok/b.txt"), "short second document\n", 22);

    zoff_tokenize_options o = {.output_prefix = path_in("tok/out"), .val_fraction = 0.1, .quiet = true};
    char fa[512], fb[512], fm[512], ft[512];
    snprintf(fa, sizeof fa, "%s", path_in("tok/a.txt"));
    snprintf(fb, sizeof fb, "%s", path_in("tok/b.txt"));
    snprintf(fm, sizeof fm, "%s", path_in("tok/missing.txt"));
    snprintf(ft, sizeof ft, "%s", path_in("tok/tiny.txt"));
    const char *files[2] = {fa, fb};
    zoff_tokenize_result r;
    CHECK_OK(zoff_tokenize_files(g_gpt2, files, 2, &o, &r));
    assert_int_equal(r.num_paths, 2);
    assert_int_equal(r.num_train_files, 1);
    assert_string_equal(r.paths[0], path_in("tok/out_train.bin"));
    assert_string_equal(r.paths[1], path_in("tok/out_val.bin"));
    assert_int_equal(r.bytes_in, (int64_t)len + 22);
    double mbps = (double)r.bytes_in / r.seconds / 1e6;
    print_message("tokenized %.2f MB into %lld tokens in %.3f s (%.1f MB/s)\n", r.bytes_in / 1e6,
                  (long long)(r.tokens_train + r.tokens_val), r.seconds, mbps);
    assert_true(r.seconds < 10.0);

    /* shards = EOT + encode(a) + EOT + encode(b), chunked encoding equal to whole */
    zoff_tokens want = {0};
    CHECK_OK(zoff_tokens_push(&want, 50256));
    CHECK_OK(zoff_tokenizer_encode(g_gpt2, text, len, &want));
    CHECK_OK(zoff_tokens_push(&want, 50256));
    CHECK_OK(zoff_tokenizer_encode(g_gpt2, "short second document\n", 22, &want));
    assert_int_equal(r.tokens_train + r.tokens_val, (int64_t)want.n);
    assert_int_equal(r.tokens_val, (int64_t)((double)want.n * 0.1));
    zoff_dataset *ds;
    char pat[600];
    snprintf(pat, sizeof pat, "%s,%s", r.paths[0], r.paths[1]);
    CHECK_OK(zoff_dataset_open(pat, 50257, &ds));
    assert_int_equal(zoff_dataset_num_tokens(ds), (int64_t)want.n);
    const uint16_t *t0 = zoff_shard_tokens(zoff_dataset_shard(ds, 0)), *t1 = zoff_shard_tokens(zoff_dataset_shard(ds, 1));
    for (size_t i = 0; i < want.n; i++) {
        int64_t k = (int64_t)i;
        int got = k < r.tokens_train ? t0[k] : t1[k - r.tokens_train];
        if (got != want.ids[i]) fail_msg("token %zu: shard has %d, direct encode %d", i, got, want.ids[i]);
    }
    assert_int_equal(zoff_shard_vocab_size(zoff_dataset_shard(ds, 0)), 50257);
    zoff_dataset_free(ds);
    zoff_tokenize_result_free(&r);

    /* --shard-size: same tokens over several files */
    o.output_prefix = path_in("tok/sh");
    o.shard_tokens = 100000;
    CHECK_OK(zoff_tokenize_files(g_gpt2, files, 2, &o, &r));
    assert_true(r.num_train_files >= 5);
    assert_non_null(strstr(r.paths[0], "sh_train_000000.bin"));
    assert_non_null(strstr(r.paths[r.num_paths - 1], "sh_val_000002.bin")); /* 10% of ~2M tokens */
    snprintf(pat, sizeof pat, "%s/tok/sh_*.bin", g_dir); /* train_ sorts before val_ */
    CHECK_OK(zoff_dataset_open(pat, 50257, &ds));
    assert_int_equal(zoff_dataset_num_shards(ds), r.num_paths);
    int64_t k = 0;
    for (int s = 0; s < zoff_dataset_num_shards(ds); s++) {
        const zoff_shard *sh = zoff_dataset_shard(ds, s);
        if (s < zoff_dataset_num_shards(ds) - 1) assert_true(zoff_shard_num_tokens(sh) <= 100000);
        for (int64_t i = 0; i < zoff_shard_num_tokens(sh); i++, k++) assert_int_equal(zoff_shard_tokens(sh)[i], want.ids[k]);
    }
    assert_int_equal(k, (int64_t)want.n);
    zoff_dataset_free(ds);
    zoff_tokenize_result_free(&r);
    zoff_tokens_free(&want);

    /* chunked encoding at 1 MiB boundaries: texts whose only line breaks are "\n\n"
     * (must not be split there) and lone "\n" (split there) encode as a whole */
    for (int variant = 0; variant < 2; variant++) {
        size_t cl = 0, ccap = 3u << 20;
        char *ct = malloc(ccap);
        for (int line = 0; cl + 64 < ccap; line++)
            cl += (size_t)sprintf(ct + cl, "line %d of the text's body%s", line,
                                  variant == 0 ? "\n\n" : (line % 7 ? "\n" : "  \n\n\t"));
        write_text(path_in("tok/c.txt"), ct, cl);
        const char *cf[1] = {path_in("tok/c.txt")};
        o.output_prefix = path_in("tok/chunk");
        o.shard_tokens = 0;
        o.val_fraction = 0;
        CHECK_OK(zoff_tokenize_files(g_gpt2, cf, 1, &o, &r));
        zoff_tokens direct = {0};
        CHECK_OK(zoff_tokens_push(&direct, 50256));
        CHECK_OK(zoff_tokenizer_encode(g_gpt2, ct, cl, &direct));
        zoff_shard *sh;
        CHECK_OK(zoff_shard_open(r.paths[0], 50257, &sh));
        assert_int_equal(zoff_shard_num_tokens(sh), (int64_t)direct.n);
        for (size_t i = 0; i < direct.n; i++)
            if (zoff_shard_tokens(sh)[i] != direct.ids[i])
                fail_msg("variant %d token %zu: chunked %d, whole %d", variant, i, zoff_shard_tokens(sh)[i],
                         direct.ids[i]);
        zoff_shard_close(sh);
        zoff_tokens_free(&direct);
        zoff_tokenize_result_free(&r);
        unlink(path_in("tok/chunk_train.bin"));
        unlink(path_in("tok/c.txt"));
        free(ct);
    }
    o.val_fraction = 0.1;

    /* errors write nothing */
    int before = count_files(path_in("tok"));
    const char *missing[2] = {fa, fm};
    o.output_prefix = path_in("tok/err");
    o.shard_tokens = 0;
    expect_error(zoff_tokenize_files(g_gpt2, missing, 2, &o, &r), ZOFF_ERR_INVALID, (const char *[]){"missing.txt", NULL});
    o.output_prefix = path_in("tok/nodir/x");
    expect_error(zoff_tokenize_files(g_gpt2, files, 2, &o, &r), ZOFF_ERR_INVALID, (const char *[]){"nodir", "mkdir", NULL});
    o.output_prefix = path_in("tok/err");
    o.val_fraction = 1.5;
    expect_error(zoff_tokenize_files(g_gpt2, files, 2, &o, &r), ZOFF_ERR_INVALID, (const char *[]){"1.5", NULL});
    write_text(path_in("tok/tiny.txt"), "hi", 2);
    const char *tiny[1] = {ft};
    o.val_fraction = 0.05;
    expect_error(zoff_tokenize_files(g_gpt2, tiny, 1, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"--val-fraction 0", NULL});
    assert_int_equal(count_files(path_in("tok")), before + 1); /* only tiny.txt */
    /* byte tokenizer: no EOT, val fraction 0 -> train only */
    zoff_tokenizer *bt;
    CHECK_OK(zoff_tokenizer_open_byte(&bt));
    o.val_fraction = 0;
    o.output_prefix = path_in("tok/bytes");
    CHECK_OK(zoff_tokenize_files(bt, tiny, 1, &o, &r));
    assert_int_equal(r.num_paths, 1);
    assert_int_equal(r.tokens_train, 2);
    zoff_tokenize_result_free(&r);
    zoff_tokenizer_free(bt);
    free(text);
}

/* Output prefixes refused before any reading, nothing written: one ending in '/' (wrote DIR/_train.bin),
 * one that is a folder (wrote the shards beside it), one whose shard name is a folder (exit 1 at the
 * rename after all the work); a later shard that is a folder is refused before any shard is written. */
/* Threads and the places text is cut: every fixture case as a file of its own (its shard tokens must be
 * <|endoftext|> and the ids the Python reference gave), then a large mixed text, a long run with no
 * place to cut, a file of one character and one with no whitespace (contractions in it); for any thread count and piece size the shards hold the
 * same tokens, split and sharded the same way. */
static void test_tokenize_threads(void **state) {
    (void)state;
    make_subdir("thr");
    json_error_t jerr;
    json_t *root = json_load_file(ZOFF_TEST_DIR "/fixtures/gpt2_bpe_cases.json", 0, &jerr);
    if (!root) fail_msg("cannot read the fixture: %s", jerr.text);
    json_t *cases = json_object_get(root, "cases");
    size_t nc = json_array_size(cases), nfiles = 0, len;
    char **paths = calloc(nc + 4, sizeof *paths);
    zoff_tokens want = {0};
    for (size_t i = 0; i < nc; i++) {
        json_t *c = json_array_get(cases, i), *ids = json_object_get(c, "ids");
        size_t tl = json_string_length(json_object_get(c, "text"));
        char name[64];
        snprintf(name, sizeof name, "thr/case%03zu.txt", i);
        paths[nfiles++] = strdup(path_in(name));
        write_text(paths[nfiles - 1], json_string_value(json_object_get(c, "text")), tl);
        if (tl > 0) CHECK_OK(zoff_tokens_push(&want, 50256)); /* an empty file is no document */
        for (size_t k = 0; k < json_array_size(ids); k++)
            CHECK_OK(zoff_tokens_push(&want, (int32_t)json_integer_value(json_array_get(ids, k))));
    }
    json_decref(root);
    char *text = big_text(&len), *run = malloc(20000);
    if (len > 400000) len = 400000; /* pieces of 7 bytes: a parallel step each */
    for (int i = 0; i < 20000; i++) run[i] = i % 7 == 6 ? '.' : "ab\xc3\xa9"[i % 3 == 2 && i % 2 ? 2 : i % 2];
    /* no whitespace at all: cut only between a letter or digit and punctuation, never in "'s" */
    static const char unit[] = "{\"it's\":[12,3.5e-7],\"don't\":\"x'y\",\"we're\":'ll'd'm'v't,\"\xc3\xa9'\":0}";
    char *json = malloc(30000);
    for (size_t i = 0; i < 30000; i++) json[i] = unit[i % (sizeof unit - 1)];
    const char *extra[4][2] = {{"thr/big.txt", text}, {"thr/run.txt", run}, {"thr/one.txt", "x"}, {"thr/min.json", json}};
    size_t extra_len[4] = {len, 20000, 1, 30000};
    for (int e = 0; e < 4; e++) { /* the reference: one encode of the whole file, no cut */
        paths[nfiles++] = strdup(path_in(extra[e][0]));
        write_text(paths[nfiles - 1], extra[e][1], extra_len[e]);
        CHECK_OK(zoff_tokens_push(&want, 50256));
        CHECK_OK(zoff_tokenizer_encode(g_gpt2, extra[e][1], extra_len[e], &want));
    }
    free(text);
    free(run);
    free(json);
    const int64_t per = 99991, nval = (int64_t)((double)want.n * 0.1);
    const struct { int threads; size_t piece; } runs[] = {{1, 0}, {2, 7}, {3, 64}, {4, 4096}, {2, 0}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        zoff_tokenize_options o = {.output_prefix = path_in("thr/out"), .val_fraction = 0.1, .shard_tokens = per,
                                   .quiet = true, .threads = runs[r].threads, .piece_bytes = runs[r].piece};
        zoff_tokenize_result res;
        CHECK_OK(zoff_tokenize_files(g_gpt2, (const char *const *)paths, (int)nfiles, &o, &res));
        assert_int_equal(res.tokens_train + res.tokens_val, (int64_t)want.n);
        assert_int_equal(res.tokens_val, nval);
        int64_t at = 0;
        for (int f = 0; f < res.num_paths; f++) {
            bool train = f < res.num_train_files;
            int64_t begin = train ? 0 : (int64_t)want.n - nval, split = train ? (int64_t)want.n - nval : nval;
            int64_t k = train ? f : f - res.num_train_files, expect = split - k * per < per ? split - k * per : per;
            zoff_shard *sh;
            CHECK_OK(zoff_shard_open(res.paths[f], 50257, &sh));
            assert_int_equal(zoff_shard_num_tokens(sh), expect);
            assert_int_equal(at, begin + k * per);
            const uint16_t *tk = zoff_shard_tokens(sh);
            for (int64_t i = 0; i < expect; i++, at++)
                if (tk[i] != want.ids[at])
                    fail_msg("threads %d, pieces of %zu bytes: %s token %lld is %d, the reference %d", runs[r].threads,
                             runs[r].piece, res.paths[f], (long long)i, tk[i], want.ids[at]);
            zoff_shard_close(sh);
        }
        assert_int_equal(at, (int64_t)want.n);
        zoff_tokenize_result_free(&res);
    }
    for (size_t i = 0; i < nfiles; i++) free(paths[i]);
    free(paths);
    zoff_tokens_free(&want);
}

static void test_tokenize_outputs(void **state) {
    (void)state;
    make_subdir("tko");
    make_subdir("tko/sub");
    make_subdir("tko/dd_train.bin");
    make_subdir("tko/sh_train_000001.bin");
    write_text(path_in("tko/in.txt"), "some text to tokenize\n", 22);
    const char *in[1] = {path_in("tko/in.txt")};
    zoff_tokenizer *bt;
    CHECK_OK(zoff_tokenizer_open_byte(&bt));
    zoff_tokenize_options o = {.val_fraction = 0, .quiet = true};
    zoff_tokenize_result r;
    int before = count_files(path_in("tko")), before_sub = count_files(path_in("tko/sub"));
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", path_in("tko/sub"));
    o.output_prefix = slash;
    expect_error(zoff_tokenize_files(bt, in, 1, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"sub/ ends in '/'", "e.g. --output-prefix ", "sub/data", NULL});
    o.output_prefix = path_in("tko/sub");
    expect_error(zoff_tokenize_files(bt, in, 1, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"sub is a folder", "sub_train.bin beside it", "sub/data", NULL});
    o.output_prefix = path_in("tko/dd");
    o.val_fraction = 0.5;
    expect_error(zoff_tokenize_files(bt, in, 1, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"dd_train.bin, where a shard goes, is a folder", "--output-prefix", NULL});
    assert_int_equal(r.bytes_in, 0); /* refused before reading */
    o.output_prefix = path_in("tko/sh");
    o.val_fraction = 0;
    o.shard_tokens = 10; /* 22 tokens: sh_train_000000..2; _000001 is a folder */
    expect_error(zoff_tokenize_files(bt, in, 1, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"sh_train_000001.bin, where a shard goes, is a folder", NULL});
    assert_int_equal(count_files(path_in("tko")), before);
    assert_int_equal(count_files(path_in("tko/sub")), before_sub);
    zoff_tokenizer_free(bt);

    /* empty inputs hold no text with either tokenizer (before: gpt2 wrote a shard of one <|endoftext|>),
     * and an empty file among others adds no document (no lone <|endoftext|>) */
    write_text(path_in("tko/empty.txt"), "", 0);
    const char *empty[2] = {path_in("tko/empty.txt"), path_in("tko/empty.txt")};
    o.output_prefix = path_in("tko/e");
    o.shard_tokens = 0;
    expect_error(zoff_tokenize_files(g_gpt2, empty, 2, &o, &r), ZOFF_ERR_INVALID,
                 (const char *[]){"the input files hold no text", NULL});
    const char *mixed[3] = {path_in("tko/empty.txt"), path_in("tko/in.txt"), path_in("tko/empty.txt")};
    CHECK_OK(zoff_tokenize_files(g_gpt2, mixed, 3, &o, &r));
    zoff_tokens want = {0};
    CHECK_OK(zoff_tokens_push(&want, 50256));
    CHECK_OK(zoff_tokenizer_encode(g_gpt2, "some text to tokenize\n", 22, &want));
    assert_int_equal(r.tokens_train, (int64_t)want.n);
    zoff_tokens_free(&want);
    zoff_tokenize_result_free(&r);
    unlink(path_in("tko/e_train.bin"));
}

static int run_cmd(const char *cmd, char *out, size_t outlen);

/* -------------------------------------------------------------- default corpus */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    *len = fread(s, 1, (size_t)n, f);
    s[*len] = '\0';
    fclose(f);
    return s;
}

/* C and scripts/prepare_corpus.sh give the same bytes; returns the script's exit code */
static int compare_with_script(const char *src, const char *c_out, const char *sh_dir) {
    char cmd[2048], out[4096];
    snprintf(cmd, sizeof cmd, "ZOFF_FORTUNES_DIR='%s' bash '%s/../scripts/prepare_corpus.sh' '%s' 2>&1", src,
             ZOFF_TEST_DIR, sh_dir);
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0) return rc;
    char sh_out[600];
    snprintf(sh_out, sizeof sh_out, "%s/corpus.txt", sh_dir);
    size_t a = 0, b = 0;
    char *x = read_file(c_out, &a), *y = read_file(sh_out, &b);
    assert_non_null(x);
    assert_non_null(y);
    size_t i = 0;
    while (i < a && i < b && x[i] == y[i]) i++;
    if (a != b || i != a) fail_msg("C corpus (%zu bytes) and script corpus (%zu bytes) differ at byte %zu", a, b, i);
    free(x);
    free(y);
    return 0;
}

static void test_default_corpus(void **state) {
    (void)state;
    make_subdir("fort");
    make_subdir("fort/off");
    make_subdir("fort_c");
    make_subdir("fort_sh");
    const char alpha[] = "First line\n"
                         "  second, with trailing blanks \t \n"
                         "%\n"
                         "\n"
                         "\n"
                         "caf\xc3\xa9 ____\b\b\b\bBODY and X\bX bold, \xc3\xa9\bE accent\a\n"
                         "\n"
                         "\ttabbed line\r\n"
                         "\n"
                         "%\n"
                         "%\n"
                         "\b\bleading backspaces, bell\a\b erases the bell\n"
                         "% not a separator\n"
                         "%";
    write_text(path_in("fort/alpha"), alpha, sizeof alpha - 1);
    write_text(path_in("fort/beta"), "no final newline", 16);
    write_text(path_in("fort/alpha.dat"), "\x00\x01\x02binary", 9);
    write_text(path_in("fort/off/rude"), "skipped\n", 8);
    char target[600];
    snprintf(target, sizeof target, "%s", path_in("fort/alpha"));
    assert_int_equal(symlink(target, path_in("fort/alpha.u8")), 0);
    assert_int_equal(symlink(target, path_in("fort/zeta")), 0); /* symlinks are skipped */

    const char want[] = "First line\n"
                        "  second, with trailing blanks\n"
                        "\n"
                        "caf\xc3\xa9 BODY and X bold, E accent\n"
                        "\n"
                        "\ttabbed line\n"
                        "\n"
                        "leading backspaces, bell erases the bell\n"
                        "% not a separator\n"
                        "\n"
                        "no final newline\n"
                        "\n";
    zoff_corpus_info info;
    char c_out[600];
    snprintf(c_out, sizeof c_out, "%s", path_in("fort_c/corpus.txt"));
    CHECK_OK(zoff_corpus_build_fortunes(path_in("fort"), c_out, &info));
    size_t n = 0;
    char *got = read_file(c_out, &n);
    assert_non_null(got);
    if (n != sizeof want - 1 || memcmp(got, want, n) != 0) fail_msg("corpus text:\n%s\n--- want:\n%s", got, want);
    free(got);
    assert_int_equal(info.bytes, (int64_t)(sizeof want - 1));
    assert_int_equal(info.entries, 4);
    assert_int_equal(info.files, 2);
    assert_int_equal(count_files(path_in("fort_c")), 1);
    int rc = compare_with_script(path_in("fort"), c_out, path_in("fort_sh"));
    if (rc != 0) fail_msg("scripts/prepare_corpus.sh exited %d", rc);

    /* missing package: the message says how to install it, nothing is written */
    setenv("ZOFF_FORTUNES_DIR", path_in("no_fortunes_here"), 1);
    expect_error(zoff_corpus_build_fortunes(NULL, path_in("fort_c/other.txt"), &info), ZOFF_ERR_IO,
                 (const char *[]){"no_fortunes_here", "apt-get install fortunes", NULL});
    unsetenv("ZOFF_FORTUNES_DIR");
    assert_int_equal(count_files(path_in("fort_c")), 1);
    char cmd[1024], out[4096];
    snprintf(cmd, sizeof cmd, "ZOFF_FORTUNES_DIR=/nonexistent bash '%s/../scripts/prepare_corpus.sh' '%s' 2>&1",
             ZOFF_TEST_DIR, path_in("fort_none"));
    assert_int_equal(run_cmd(cmd, out, sizeof out), 1);
    assert_non_null(strstr(out, "apt-get install fortunes"));

    /* the real package, when installed: C and script agree on all of it */
    struct stat st;
    if (stat(ZOFF_FORTUNES_DIR, &st) == 0) {
        CHECK_OK(zoff_corpus_build_fortunes(NULL, c_out, &info));
        print_message("fortunes corpus: %lld bytes, %lld entries, %d files\n", (long long)info.bytes,
                      (long long)info.entries, info.files);
        assert_true(info.bytes > 1000000);
        rc = compare_with_script(ZOFF_FORTUNES_DIR, c_out, path_in("fort_sh"));
        if (rc != 0) fail_msg("scripts/prepare_corpus.sh exited %d on the installed package", rc);
    } else {
        print_message("fortunes package not installed: real-corpus comparison not run\n");
    }
}

/* ------------------------------------------------------------------ the command */

static int run_cmd(const char *cmd, char *out, size_t outlen) {
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli_tokenize(void **state) {
    (void)state;
    make_subdir("cli");
    write_text(path_in("cli/in.txt"), "The quick brown fox jumps over the lazy dog.\n", 45);
    char cmd[2048], out[8192];
    snprintf(cmd, sizeof cmd, "%s tokenize --help 2>&1", ZOFF_BINARY);
    assert_int_equal(run_cmd(cmd, out, sizeof out), 0);
    assert_non_null(strstr(out, "--output-prefix"));

    snprintf(cmd, sizeof cmd, "%s tokenize --tokenizer gpt2 --val-fraction 0.2 --output-prefix %s %s 2>&1", ZOFF_BINARY,
             path_in("cli/o"), path_in("cli/in.txt"));
    int rc = run_cmd(cmd, out, sizeof out);
    if (rc != 0) fail_msg("zoff tokenize failed (%d): %s", rc, out);
    assert_non_null(strstr(out, "-> 12 tokens")); /* EOT + 11 */
    assert_non_null(strstr(out, "train: 10 tokens, val: 2 tokens"));
    assert_int_equal(access(path_in("cli/o_train.bin"), F_OK), 0);
    assert_int_equal(access(path_in("cli/o_val.bin"), F_OK), 0);

    int before = count_files(path_in("cli"));
    snprintf(cmd, sizeof cmd, "%s tokenize --output-prefix %s %s %s 2>&1", ZOFF_BINARY, path_in("cli/p"),
             path_in("cli/in.txt"), path_in("cli/missing.txt"));
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "missing.txt"));
    snprintf(cmd, sizeof cmd, "%s tokenize --output-prefix %s %s 2>&1", ZOFF_BINARY, path_in("cli/nodir/p"),
             path_in("cli/in.txt"));
    rc = run_cmd(cmd, out, sizeof out);
    assert_true(rc != 0);
    assert_non_null(strstr(out, "nodir"));
    snprintf(cmd, sizeof cmd, "%s tokenize --bogus %s 2>&1", ZOFF_BINARY, path_in("cli/in.txt"));
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2);
    assert_non_null(strstr(out, "--bogus"));
    snprintf(cmd, sizeof cmd, "%s tokenize --output-prefix %s %s 2>&1", ZOFF_BINARY, path_in("cli/q"),
             path_in("cli/in.txt"));
    assert_int_equal(run_cmd(cmd, out, sizeof out), 2); /* default val fraction 0.05 of 12 tokens is 0 */
    assert_int_equal(count_files(path_in("cli")), before);
}

/* ------------------------------------------------------------------------ main */

static int setup(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/zoff_test_data_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    double t0 = zoff_now();
    if (zoff_tokenizer_open("gpt2", &g_gpt2) != ZOFF_OK) {
        fprintf(stderr, "loading gpt2: %s\n", zoff_last_error());
        return -1;
    }
    printf("# GPT-2 tables loaded in %.3f s\n", zoff_now() - t0);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    zoff_tokenizer_free(g_gpt2);
    nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_round_trip),
        cmocka_unit_test(test_shard_write_atomic),
        cmocka_unit_test(test_shard_bad_files),
        cmocka_unit_test(test_shard_large),
        cmocka_unit_test(test_dataset_patterns), cmocka_unit_test(test_dataset_short_shards),
        cmocka_unit_test(test_loader_sequential),
        cmocka_unit_test(test_loader_shuffle_determinism),
        cmocka_unit_test(test_loader_save_restore),
        cmocka_unit_test(test_loader_split),
        cmocka_unit_test(test_byte_tokenizer),
        cmocka_unit_test(test_pretokenizer),
        cmocka_unit_test(test_gpt2_fixture),
        cmocka_unit_test(test_gpt2_round_trip_bytes),
        cmocka_unit_test(test_data_find),
        cmocka_unit_test(test_tokenize_files),
        cmocka_unit_test(test_tokenize_threads),
        cmocka_unit_test(test_tokenize_outputs),
        cmocka_unit_test(test_default_corpus),
        cmocka_unit_test(test_cli_tokenize),
    };
    return cmocka_run_group_tests_name("data", tests, setup, teardown);
}
