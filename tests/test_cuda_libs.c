/* cuBLASLt is opened when the CUDA backend first needs it, not when a process of a CUDA build
 * starts (src/backend/cuda/cuda_libs.h): before zoff_cuda_blaslt_open no libcublasLt is mapped
 * into this process (/proc/self/maps, the kernel's word); after it one is, and the version its
 * resolved cublasLtGetVersion reports has the major number of the file the loader mapped, so the
 * calls go to that library. Needs no GPU: the library loads and answers without one. Failed
 * before the change (zoff linked libcublasLt, mapped at start). Skipped in builds without CUDA. */
#include "test_util.h" /* and <cmocka.h> */

#ifdef ZOFF_HAVE_CUDA
#include <string.h>

#include "backend/cuda/cuda_libs.h"

/* The major version in the name of the libcublasLt file mapped into this process, -1 when none. */
static int mapped_major(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    int major = -1;
    const char *name = "libcublasLt.so.";
    while (major < 0 && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, name);
        if (p) major = atoi(p + strlen(name));
    }
    fclose(f);
    return major;
}

static void test_opened_on_demand(void **state) {
    (void)state;
    assert_int_equal(mapped_major(), -1); /* not at start */
    assert_int_equal(zoff_cuda_blaslt_version(), 0);
    assert_ok(zoff_cuda_blaslt_open());
    const int major = mapped_major();
    assert_true(major > 0);
    const size_t v = zoff_cuda_blaslt_version();
    printf("  libcublasLt.so.%d mapped; cublasLtGetVersion() = %zu\n", major, v);
    assert_int_equal(v / 10000, major);
    assert_ok(zoff_cuda_blaslt_open()); /* once: a second call returns the first's result */
    assert_int_equal(zoff_cuda_blaslt_version(), v);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_opened_on_demand)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void) {
    printf("test_cuda_libs: SKIPPED: built without CUDA\n");
    return ZOFF_TEST_SKIP;
}
#endif
