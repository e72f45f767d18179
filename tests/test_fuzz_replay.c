/* Replays the fuzz harnesses' committed inputs in the ordinary test build (gcc; and so under
 * the suite's ASan + UBSan and -Werror builds too): every seed in fuzz/corpus/<name>/ and
 * every past finding in fuzz/regressions/<name>/ goes through the same harness code and the
 * same checks as under libFuzzer. Plus explicit regression tests for the bugs the fuzzers
 * found, so that a release build without sanitizers also fails if one comes back. */
#define _GNU_SOURCE
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#define LLVMFuzzerInitialize fuzz_config_init
#define LLVMFuzzerTestOneInput fuzz_config_one
#include "../fuzz/fuzz_config.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_ckpt_init
#define LLVMFuzzerTestOneInput fuzz_ckpt_one
#include "../fuzz/fuzz_ckpt.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_shard_init
#define LLVMFuzzerTestOneInput fuzz_shard_one
#include "../fuzz/fuzz_shard.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_tables_init
#define LLVMFuzzerTestOneInput fuzz_tables_one
#include "../fuzz/fuzz_tokenizer_tables.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_text_init
#define LLVMFuzzerTestOneInput fuzz_text_one
#include "../fuzz/fuzz_tokenizer_text.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

#define LLVMFuzzerInitialize fuzz_st_init
#define LLVMFuzzerTestOneInput fuzz_st_one
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerInitialize
#undef LLVMFuzzerTestOneInput

typedef int (*one_fn)(const uint8_t *, size_t);

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Run every file of fuzz/<kind>/<name>/ through fn; returns how many. */
static int replay_dir(const char *kind, const char *name, one_fn fn) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/../fuzz/%s/%s", ZOFF_TEST_DIR, kind, name);
    DIR *d = opendir(dir);
    if (!d) return 0;
    char **files = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        files = realloc(files, (n + 1) * sizeof *files);
        assert_non_null(files);
        files[n] = malloc(strlen(dir) + strlen(e->d_name) + 2);
        sprintf(files[n], "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    if (n) qsort(files, n, sizeof *files, cmp_names);
    for (size_t i = 0; i < n; i++) {
        FILE *f = fopen(files[i], "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        assert_int_equal(fread(buf, 1, (size_t)len, f), (size_t)len);
        fclose(f);
        fprintf(stderr, "  %s\n", files[i]); /* the last line names the input if a check aborts */
        fn(buf, (size_t)len);
        free(buf);
        free(files[i]);
    }
    free(files);
    return (int)n;
}

static void replay(const char *name, one_fn fn, int min_seeds) {
    int seeds = replay_dir("corpus", name, fn);
    int regressions = replay_dir("regressions", name, fn);
    printf("fuzz_%s: %d seeds and %d regression inputs pass the harness checks\n", name, seeds, regressions);
    assert_true(seeds >= min_seeds); /* the corpus is in the repository */
}

static void test_config(void **state) {
    fuzz_config_init(NULL, NULL);
    replay("config", fuzz_config_one, 5);
}

static void test_ckpt(void **state) {
    fuzz_ckpt_init(NULL, NULL);
    replay("ckpt", fuzz_ckpt_one, 3);
    zoff_ckpt_set_io_hook(NULL, NULL);
}

static void test_shard(void **state) {
    fuzz_shard_init(NULL, NULL);
    replay("shard", fuzz_shard_one, 3);
}

static void test_tokenizer_tables(void **state) {
    fuzz_tables_init(NULL, NULL);
    replay("tokenizer_tables", fuzz_tables_one, 1);
}

static void test_tokenizer_text(void **state) {
    fuzz_text_init(NULL, NULL);
    replay("tokenizer_text", fuzz_text_one, 3);
    zoff_tokenizer_free(text_gpt2);
    zoff_tokenizer_free(text_byte);
    text_gpt2 = text_byte = NULL;
}

static void test_safetensors(void **state) {
    fuzz_st_init(NULL, NULL);
    replay("safetensors", fuzz_st_one, 3);
}

/* ---- explicit regressions for what the fuzzers found ---- */

/* fuzz_shard: a loader position with epoch near INT64_MAX (from a corrupt checkpoint) was
 * accepted, and the next batch overflowed the epoch counter (signed overflow, UB). */
static void test_regression_loader_epoch(void **state) {
    char path[600];
    snprintf(path, sizeof path, "%s/regress.bin", fuzz_dir());
    uint16_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint16_t)i;
    assert_int_equal(zoff_shard_write(path, tok, 64, 256), ZOFF_OK);
    zoff_dataset *ds = NULL;
    zoff_loader *l = NULL;
    assert_int_equal(zoff_dataset_open(path, 256, &ds), ZOFF_OK);
    zoff_loader_options o = zoff_loader_defaults(2, 4);
    assert_int_equal(zoff_loader_create(ds, &o, &l), ZOFF_OK);
    zoff_loader_state st = zoff_loader_get_state(l);
    st.epoch = INT64_MAX;
    assert_int_equal(zoff_loader_set_state(l, &st), ZOFF_ERR_INVALID);
    assert_non_null(strstr(zoff_last_error(), "corrupt"));
    st.epoch = 5; /* an ordinary position is still restored */
    assert_int_equal(zoff_loader_set_state(l, &st), ZOFF_OK);
    assert_int_equal(zoff_loader_epoch(l), 5);
    zoff_loader_free(l);
    zoff_dataset_free(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_ckpt),
        cmocka_unit_test(test_shard),
        cmocka_unit_test(test_tokenizer_tables),
        cmocka_unit_test(test_tokenizer_text),
        cmocka_unit_test(test_safetensors),
        cmocka_unit_test(test_regression_loader_epoch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
