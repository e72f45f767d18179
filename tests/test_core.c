/* src/core/util.c: zoff_format_count and zoff_format_params (the banners' counts); zoff_parse_size, the one reader of every size on the command line (--device-memory,
 * --host-memory, --size, ...): each unit in any case (80G as 80g, DeepSpeed's 80GB and 80GiB, 1e9),
 * binary and decimal as the header says, and the error lists exactly the units read. */
#include "test_util.h"

static size_t size_of(const char *text) {
    size_t v = 0;
    assert_ok(zoff_parse_size(text, &v));
    return v;
}

static void test_parse_size_units(void **state) {
    (void)state;
    const size_t Ki = 1024, Mi = Ki * Ki, Gi = Mi * Ki, Ti = Gi * Ki;
    assert_int_equal(size_of("4096"), 4096);
    assert_int_equal(size_of("1e9"), 1000000000);
    assert_int_equal(size_of("0"), 0);
    assert_int_equal(size_of("12B"), 12);
    assert_int_equal(size_of("12b"), 12);
    /* binary: the letter alone or with iB, any case */
    assert_int_equal(size_of("80G"), 80 * Gi);
    assert_int_equal(size_of("80g"), 80 * Gi);
    assert_int_equal(size_of("80GiB"), 80 * Gi);
    assert_int_equal(size_of("80gib"), 80 * Gi);
    assert_int_equal(size_of("80 GiB"), 80 * Gi);
    assert_int_equal(size_of("256MiB"), 256 * Mi);
    assert_int_equal(size_of("256m"), 256 * Mi);
    assert_int_equal(size_of("4k"), 4 * Ki);
    assert_int_equal(size_of("4KiB"), 4 * Ki);
    assert_int_equal(size_of("2T"), 2 * Ti);
    assert_int_equal(size_of("2tib"), 2 * Ti);
    assert_int_equal(size_of("1.5GiB"), 3 * Gi / 2);
    /* decimal: the letter with B, any case */
    assert_int_equal(size_of("80GB"), (size_t)80e9);
    assert_int_equal(size_of("80gb"), (size_t)80e9);
    assert_int_equal(size_of("80Gb"), (size_t)80e9);
    assert_int_equal(size_of("4kB"), 4000);
    assert_int_equal(size_of("4KB"), 4000);
    assert_int_equal(size_of("3MB"), 3000000);
    assert_int_equal(size_of("2TB"), (size_t)2e12);
}

static void test_parse_size_errors(void **state) {
    (void)state;
    size_t v = 7;
    /* the message lists the units read, G among them */
    const char *units = "binary K, M, G, T (= KiB, MiB, GiB, TiB); decimal kB, MB, GB, TB; any case";
    assert_err(zoff_parse_size("80X", &v), ZOFF_ERR_INVALID, "invalid size unit in '80X'");
    assert_err(zoff_parse_size("80X", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("80GiBs", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("80Gi", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("80iB", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("80P", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("", &v), ZOFF_ERR_INVALID, units);
    assert_err(zoff_parse_size("GiB", &v), ZOFF_ERR_INVALID, "invalid size 'GiB'");
    assert_err(zoff_parse_size("-1G", &v), ZOFF_ERR_INVALID, "invalid size '-1G'");
    assert_err(zoff_parse_size("1e30", &v), ZOFF_ERR_INVALID, "too large");
    assert_int_equal(v, 7); /* untouched on failure */
}

/* the banners' counts: "1 layer", "2 layers"; a model's size in millions from one million on, else exact */
static void test_format_counts(void **state) {
    (void)state;
    char b[48];
    assert_string_equal(zoff_format_count(1, "layer", b, sizeof b), "1 layer");
    assert_string_equal(zoff_format_count(0, "layer", b, sizeof b), "0 layers");
    assert_string_equal(zoff_format_count(12, "round", b, sizeof b), "12 rounds");
    assert_string_equal(zoff_format_params(18912, b, sizeof b), "18912 parameters");
    assert_string_equal(zoff_format_params(1, b, sizeof b), "1 parameter");
    assert_string_equal(zoff_format_params(999999, b, sizeof b), "999999 parameters");
    assert_string_equal(zoff_format_params(1000000, b, sizeof b), "1.00M parameters");
    assert_string_equal(zoff_format_params(124439808, b, sizeof b), "124.44M parameters");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_parse_size_units),
                                       cmocka_unit_test(test_parse_size_errors),
                                       cmocka_unit_test(test_format_counts)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
