/* zoff_write_file_atomic (src/core/file.c): the file holds exactly the text, a
 * rewrite replaces it whole, no temp file is left, and a failed write leaves the
 * old file as it was. Checked by reading the directory and the bytes back. And
 * zoff_check_output_file: the paths an output file can and cannot have. */
#define _GNU_SOURCE
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[256];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static int count_entries(const char *dir, const char *needle) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, needle)) n++;
    closedir(d);
    return n;
}

static void test_write_file_atomic(void **state) {
    (void)state;
    char dir[] = "/tmp/zoff-file-XXXXXX", path[128], sub[160];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/out.json", dir);

    assert_ok(zoff_write_file_atomic(path, "{\"a\": 1}\n", true));
    assert_string_equal(slurp(path), "{\"a\": 1}\n");
    assert_ok(zoff_write_file_atomic(path, "x", false)); /* a shorter rewrite: no old bytes remain */
    assert_string_equal(slurp(path), "x");
    assert_ok(zoff_write_file_atomic(path, "", true));
    assert_string_equal(slurp(path), "");
    assert_int_equal(count_entries(dir, ".tmp-"), 0);
    assert_int_equal(count_entries(dir, "out.json"), 1);

    /* a target that cannot be renamed over (a directory): error, temp removed */
    assert_ok(zoff_write_file_atomic(path, "kept", true));
    snprintf(sub, sizeof sub, "%s/adir", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_err(zoff_write_file_atomic(sub, "lost", true), ZOFF_ERR_IO, "cannot rename");
    assert_int_equal(count_entries(dir, ".tmp-"), 0);
    assert_string_equal(slurp(path), "kept");

    /* a folder that does not exist, and no path at all */
    snprintf(sub, sizeof sub, "%s/missing/out.json", dir);
    assert_err(zoff_write_file_atomic(sub, "x", true), ZOFF_ERR_INVALID, "cannot create"); /* exit 2 */
    assert_err(zoff_write_file_atomic("", "x", true), ZOFF_ERR_INVALID, "empty output path");

    unlink(path);
    snprintf(sub, sizeof sub, "%s/adir", dir);
    rmdir(sub);
    assert_int_equal(rmdir(dir), 0);
}

/* zoff_check_output_file: what can be written as a file, refused before any work with what to give */
static void test_check_output_file(void **state) {
    (void)state;
    char dir[] = "/tmp/zoff-file-XXXXXX", path[128], slash[160];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/out.json", dir);
    assert_ok(zoff_check_output_file(path)); /* not there yet */
    assert_ok(zoff_write_file_atomic(path, "x", true));
    assert_ok(zoff_check_output_file(path)); /* a file there is replaced */
    assert_err(zoff_check_output_file(dir), ZOFF_ERR_INVALID, "is a folder; give the path of a file");
    snprintf(slash, sizeof slash, "%s/", dir);
    assert_err(zoff_check_output_file(slash), ZOFF_ERR_INVALID, "ends in '/'");
    snprintf(slash, sizeof slash, "%s/new/", dir); /* a folder not there, named with '/': still not a file */
    assert_err(zoff_check_output_file(slash), ZOFF_ERR_INVALID, "ends in '/'");
    assert_err(zoff_check_output_file(""), ZOFF_ERR_INVALID, "empty");
    snprintf(slash, sizeof slash, "%s/missing/out.json", dir);
    assert_err(zoff_check_output_file(slash), ZOFF_ERR_INVALID, "does not exist");
    assert_string_equal(slurp(path), "x");
    unlink(path);
    assert_int_equal(rmdir(dir), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_write_file_atomic),
                                       cmocka_unit_test(test_check_output_file)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
