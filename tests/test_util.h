/* Shared helpers of the cmocka tests: one definition of "this call must succeed" and "this
 * call must fail with this status and a message that says this". Include after <cmocka.h>
 * (or let this header include it). */
#ifndef ZOFF_TEST_UTIL_H
#define ZOFF_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "zoff/core.h"

/* expr (a zoff_status) must be ZOFF_OK; otherwise the test fails with the status and message. */
#define assert_ok(expr)                                                                                      \
    do {                                                                                                     \
        zoff_status zt_s_ = (expr);                                                                          \
        if (zt_s_ != ZOFF_OK) fail_msg("%s -> %s: %s", #expr, zoff_status_name(zt_s_), zoff_last_error());  \
    } while (0)

/* expr must fail with `code` and a message containing `needle`. Set ZOFF_TEST_VERBOSE=1 to print
 * every expected error message. */
#define assert_err(expr, code, needle)                                                                       \
    do {                                                                                                     \
        zoff_status zt_s_ = (expr);                                                                          \
        if (zt_s_ != (code))                                                                                 \
            fail_msg("%s -> %s (expected %s): %s", #expr, zoff_status_name(zt_s_), zoff_status_name(code),   \
                     zoff_last_error());                                                                     \
        if (getenv("ZOFF_TEST_VERBOSE")) printf("  [%s] %s\n", zoff_status_name(zt_s_), zoff_last_error());  \
        if (!strstr(zoff_last_error(), (needle)))                                                            \
            fail_msg("%s: message \"%s\" lacks \"%s\"", #expr, zoff_last_error(), (needle));                  \
    } while (0)

/* Exit status of a test that did not run (a missing tool or device): CMake's SKIP_RETURN_CODE
 * for every test, so ctest reports it as skipped, not passed. */
#define ZOFF_TEST_SKIP 77

#endif
