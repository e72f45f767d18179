/* The training-checkpoint schema without an engine: the "partition" blob's one reader and
 * writer (include/zoff/ckpt.h) against hand-written blobs, and the "meta" blob as an older zoff
 * wrote it (no "settings") and as this one writes it. Saving, loading and resharding through
 * the engine are covered by tests/cli_train.sh and tests/cli_mpi.sh. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "zoff/train.h"

static int rm_cb(const char *p, const struct stat *sb, int t, struct FTW *f) {
    (void)sb;
    (void)f;
    return (t == FTW_DP || t == FTW_D) ? rmdir(p) : unlink(p);
}

static int setup(void **state) {
    char *root = malloc(64);
    snprintf(root, 64, "/tmp/zoff_train_test_XXXXXX");
    if (!mkdtemp(root)) return -1;
    *state = root;
    return 0;
}
static int teardown(void **state) {
    nftw(*state, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(*state);
    return 0;
}

/* A one-rank checkpoint at `step` holding the given blobs (NULL: absent); opened for reading. */
static zoff_ckpt_reader *write_blobs(const char *dir, int64_t step, const char *partition, const char *meta) {
    zoff_ckpt_writer *w = NULL;
    assert_ok(zoff_ckpt_writer_open(dir, step, 0, NULL, &w));
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    assert_ok(zoff_ckpt_add(w, "optimizer.exp_avg", ZOFF_F32, 1, shape, x, sizeof x));
    if (partition) assert_ok(zoff_ckpt_add_blob(w, "partition", partition, strlen(partition)));
    if (meta) assert_ok(zoff_ckpt_add_blob(w, "meta", meta, strlen(meta)));
    assert_ok(zoff_ckpt_commit(w));
    assert_ok(zoff_ckpt_finalize(dir, step, 1, NULL));
    zoff_ckpt_reader *r = NULL;
    assert_ok(zoff_ckpt_open(dir, 0, &r));
    return r;
}

static void test_partition_round_trip(void **state) {
    const int64_t runs[] = {0, 3, 10, 5, 20, 0};
    char *txt = zoff_ckpt_partition_json(0, 2, 30, runs, 3);
    assert_non_null(txt);
    /* the text is the documented format, key by key */
    assert_non_null(strstr(txt, "\"format\":\"zoff-partition\""));
    assert_non_null(strstr(txt, "\"runs\":[[0,3],[10,5],[20,0]]"));
    zoff_ckpt_reader *r = write_blobs(*state, 1, txt, NULL);
    free(txt);
    zoff_ckpt_partition p;
    assert_ok(zoff_ckpt_read_partition(r, 0, &p));
    assert_true(p.present);
    assert_int_equal(p.num_params, 30);
    assert_int_equal(p.nruns, 3);
    for (int i = 0; i < 6; i++) assert_int_equal(p.runs[i], runs[i]);
    zoff_ckpt_partition_free(&p);
    /* the blob names rank 0: read as rank 1's file it is refused */
    assert_int_equal(zoff_ckpt_read_partition(r, 1, &p), ZOFF_ERR_FORMAT);
    assert_non_null(strstr(zoff_last_error(), "rank_00000.zckpt"));
    assert_null(p.runs);
    zoff_ckpt_close(r);
}

static void test_partition_absent_and_bad(void **state) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/a", (char *)*state);
    zoff_ckpt_reader *r = write_blobs(dir, 1, NULL, NULL); /* an older one-rank file */
    zoff_ckpt_partition p;
    assert_ok(zoff_ckpt_read_partition(r, 0, &p));
    assert_false(p.present);
    assert_null(p.runs);
    zoff_ckpt_close(r);
    const char *bad[] = {
        "{\"format\":\"zoff-partition\",\"version\":1,\"rank\":0,\"num_params\":10,\"runs\":[[8,3]]}", /* past P */
        "{\"format\":\"zoff-partition\",\"version\":2,\"rank\":0,\"num_params\":10,\"runs\":[]}",     /* version */
        "{\"format\":\"other\",\"version\":1,\"num_params\":10,\"runs\":[]}",                          /* format */
        "{\"format\":\"zoff-partition\",\"version\":1,\"num_params\":10,\"runs\":[[-1,2]]}",           /* negative */
        "{\"format\":\"zoff-partition\",\"version\":1,\"num_params\":10,\"runs\":[[1,2,3]]}",          /* not a pair */
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(dir, sizeof dir, "%s/b%zu", (char *)*state, i);
        r = write_blobs(dir, 1, bad[i], NULL);
        assert_int_equal(zoff_ckpt_read_partition(r, 0, &p), ZOFF_ERR_FORMAT);
        assert_non_null(strstr(zoff_last_error(), "partition"));
        assert_false(p.present);
        zoff_ckpt_close(r);
    }
}

/* The meta blob as zoff wrote it before "settings" existed: read, settings unknown. */
#define OLD_META                                                                                                  \
    "{\"consumed_tokens\": 256.0, \"engine\": {\"hysteresis_left\": 2, \"last_overflow_iter\": -1, "              \
    "\"loss_scale\": 1.0, \"scaler_iter\": 4, \"steps_skipped\": 0, \"steps_taken\": 4}, \"format\": "             \
    "\"zoff-train-state\", \"loader\": {\"epoch\": 0, \"fingerprint\": \"00000000000000ff\", \"num_windows\": 100, " \
    "\"seed_hi\": 0, \"seed_lo\": 1234, \"seq_len\": 16, \"window\": 16}, \"model\": {\"hidden_size\": 32, "       \
    "\"max_seq_len\": 16, \"num_heads\": 2, \"num_layers\": 2, \"padded_vocab_size\": 384, \"vocab_size\": 256}, " \
    "\"seed_hi\": 0, \"seed_lo\": 1234, \"seq_len\": 16, \"step\": 4, \"tokenizer\": \"byte\", \"version\": 1"

static void test_meta_old_and_new(void **state) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/old", (char *)*state);
    zoff_ckpt_reader *r = write_blobs(dir, 4, NULL, OLD_META "}");
    zoff_train_meta m;
    assert_ok(zoff_train_ckpt_read_meta(r, &m, NULL));
    assert_int_equal(m.step, 4);
    assert_int_equal(m.shape.hidden_size, 32);
    assert_int_equal(m.shape.padded_vocab_size, 384);
    assert_int_equal(m.seq_len, 16);
    assert_int_equal(m.seed, 1234);
    assert_int_equal(m.loader.fingerprint, 0xff);
    assert_int_equal(m.engine.steps_taken, 4);
    assert_string_equal(m.tokenizer, "byte");
    assert_false(m.settings.known);
    zoff_ckpt_close(r);

    snprintf(dir, sizeof dir, "%s/new", (char *)*state);
    r = write_blobs(dir, 4, NULL,
                    OLD_META ", \"settings\": {\"optimizer\": \"Lion\", \"precision\": \"bf16\", \"lr\": 0.0005, "
                             "\"scheduler\": \"WarmupLR\", \"warmup_steps\": 7, \"total_steps\": 0, \"micro_batch\": "
                             "4, \"accumulation\": 2, \"world_size\": 2, \"gradient_clipping\": 0.5}}");
    assert_ok(zoff_train_ckpt_read_meta(r, &m, NULL));
    assert_true(m.settings.known);
    assert_string_equal(m.settings.optimizer, "Lion");
    assert_string_equal(m.settings.precision, "bf16");
    assert_string_equal(m.settings.scheduler, "WarmupLR");
    assert_true(m.settings.lr == 0.0005);
    assert_int_equal(m.settings.warmup_steps, 7);
    assert_int_equal(m.settings.accumulation, 2);
    assert_int_equal(m.settings.world_size, 2);
    assert_true(m.settings.gradient_clipping == 0.5);
    zoff_ckpt_close(r);

    /* the step in the meta must be the checkpoint's */
    snprintf(dir, sizeof dir, "%s/wrong", (char *)*state);
    r = write_blobs(dir, 5, NULL, OLD_META "}");
    assert_int_equal(zoff_train_ckpt_read_meta(r, &m, NULL), ZOFF_ERR_FORMAT);
    assert_non_null(strstr(zoff_last_error(), "says step 4 but the file is step 5"));
    zoff_ckpt_close(r);
}

/* A CPU-backend model of the given width (2 layers, vocabulary 64, sequence 8). */
static zoff_gpt2 *tiny_model(zoff_device *dev, int64_t width) {
    zoff_gpt2_options mo = {.shape = {.num_layers = 2, .hidden_size = width, .num_heads = 2, .max_seq_len = 8,
                                      .vocab_size = 64},
                            .batch_size = 1, .seq_len = 8, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    assert_ok(zoff_gpt2_create(dev, &mo, &m));
    return m;
}

/* Bytes this process's read calls returned so far (/proc/self/io rchar). */
static int64_t rchar(void) {
    FILE *f = fopen("/proc/self/io", "r");
    char line[128];
    long long v = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "rchar: %lld", &v) == 1) break;
    if (f) fclose(f);
    return v;
}

/* --load's master weights piece by piece (zoff_train_ckpt_read_weights_range, what the engine
 * calls for each sub-group and device piece): any split gives the values written, whole
 * tensors, parts of tensors and runs across tensors alike; a part read of a tensor whose shape
 * differs fails with zoff_ckpt_read_tensor's message. */
static void test_read_weights_range(void **state) {
    const char *dir = *state;
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .threads = 1};
    assert_ok(zoff_device_create(&dopt, &dev));
    zoff_gpt2 *m = tiny_model(dev, 16);
    int64_t n = zoff_gpt2_num_params(m);
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    float *w = malloc((size_t)n * sizeof(float)), *got = malloc((size_t)n * sizeof(float));
    assert_non_null(w);
    assert_non_null(got);
    for (int64_t i = 0; i < n; i++) w[i] = 0.25f * (float)i - 7.0f;
    zoff_ckpt_writer *wr = NULL;
    assert_ok(zoff_ckpt_writer_open(dir, 1, 0, NULL, &wr));
    for (int i = 0; i < nt; i++)
        assert_ok(zoff_ckpt_add(wr, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape, w + t[i].offset,
                                (size_t)t[i].numel * sizeof(float)));
    assert_ok(zoff_ckpt_commit(wr));
    assert_ok(zoff_ckpt_finalize(dir, 1, 1, NULL));
    static const int64_t pieces[] = {1, 7, 100, 1000, 4097};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        zoff_ckpt_reader *r = NULL;
        assert_ok(zoff_ckpt_open(dir, 0, &r));
        memset(got, 0xff, (size_t)n * sizeof(float));
        for (int64_t lo = 0; lo < n; lo += pieces[k]) {
            int64_t hi = lo + pieces[k] < n ? lo + pieces[k] : n;
            assert_ok(zoff_train_ckpt_read_weights_range(r, m, lo, hi, got + lo));
        }
        assert_memory_equal(got, w, (size_t)n * sizeof(float));
        zoff_ckpt_close(r);
    }
    /* pieces of 4096 bytes: the load's pipeline (a helper thread reads piece p while p - 1 is copied) over
     * dozens of pieces, whole model and ranges alike */
    setenv("ZOFF_TEST_CKPT_PIECE_BYTES", "4096", 1);
    assert_int_equal(zoff_train_ckpt_piece_bytes(), 4096);
    assert_true(n * (int64_t)sizeof(float) > 8 * 4096);
    for (size_t k = 0; k < 2; k++) {
        const int64_t step = k == 0 ? n : 3001; /* the whole model; ranges that cut tensors */
        zoff_ckpt_reader *r = NULL;
        assert_ok(zoff_ckpt_open(dir, 0, &r));
        memset(got, 0xff, (size_t)n * sizeof(float));
        const int64_t r0 = rchar();
        for (int64_t lo = 0; lo < n; lo += step) {
            int64_t hi = lo + step < n ? lo + step : n;
            assert_ok(zoff_train_ckpt_read_weights_range(r, m, lo, hi, got + lo));
        }
        assert_memory_equal(got, w, (size_t)n * sizeof(float));
        /* the whole model in one call: each tensor read once, checked as the caller's thread takes it (rchar: what
         * the read calls returned; a CRC pass of its own would read it all again) */
        const int64_t read = rchar() - r0;
        print_message("weights through 4 KiB pieces (%s): %lld bytes read for %lld\n", k == 0 ? "whole" : "ranges",
                      (long long)read, (long long)(n * (int64_t)sizeof(float)));
        if (k == 0) assert_true(read >= n * (int64_t)sizeof(float) && read < n * (int64_t)sizeof(float) * 5 / 4);
        zoff_ckpt_close(r);
    }
    /* a byte flipped in the middle of the largest tensor: found on the helper thread (at the tensor's
     * end), and its message, not an empty one, is what the caller gets */
    int big = 0;
    for (int i = 1; i < nt; i++)
        if (t[i].numel > t[big].numel) big = i;
    char path[4200];
    zoff_ckpt_reader *cr = NULL;
    assert_ok(zoff_ckpt_open(dir, 0, &cr));
    snprintf(path, sizeof path, "%s", zoff_ckpt_reader_path(cr));
    const zoff_ckpt_entry *ce = zoff_ckpt_find(cr, t[big].name);
    assert_non_null(ce);
    const int64_t at = ce->offset + ce->bytes / 2;
    zoff_ckpt_close(cr);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, (long)at, SEEK_SET), 0);
    fputc(c ^ 0x5a, f);
    fclose(f);
    assert_ok(zoff_ckpt_open(dir, 0, &cr));
    assert_int_equal(zoff_train_ckpt_read_weights(cr, m, got), ZOFF_ERR_FORMAT);
    char want[256];
    snprintf(want, sizeof want, "checksum mismatch in entry '%s'", t[big].name);
    assert_non_null(strstr(zoff_last_error(), want));
    zoff_ckpt_close(cr);
    unsetenv("ZOFF_TEST_CKPT_PIECE_BYTES");
    zoff_ckpt_reader *r = NULL;
    assert_ok(zoff_ckpt_open(dir, 0, &r));
    zoff_gpt2 *wide = tiny_model(dev, 32);
    assert_int_equal(zoff_train_ckpt_read_weights_range(r, wide, 3, 40, got), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "shape mismatch for 'wte.weight'"));
    zoff_ckpt_close(r);
    zoff_gpt2_destroy(wide);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    free(w);
    free(got);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_partition_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_partition_absent_and_bad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_meta_old_and_new, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_weights_range, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
