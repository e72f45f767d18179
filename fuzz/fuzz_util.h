/* Shared helpers of the libFuzzer harnesses: a private scratch directory per process,
 * writing fuzz bytes to files, and the checks every harness makes on a failing call. */
#ifndef ZOFF_FUZZ_UTIL_H
#define ZOFF_FUZZ_UTIL_H


#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zoff/core.h"

/* Abort (a finding) with a message: libFuzzer saves the input that got here. */
#define FUZZ_CHECK(cond, ...)                                                   \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "fuzz check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
            abort();                                                            \
        }                                                                       \
    } while (0)

/* rm -rf path (no shell: harnesses call it for every input). */
static int fuzz_rm_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return (type == FTW_DP ? rmdir(p) : unlink(p)) && errno != ENOENT ? -1 : 0;
}
__attribute__((unused)) static void fuzz_rmtree(const char *path) {
    if (access(path, F_OK) == 0 && nftw(path, fuzz_rm_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "fuzz: cannot remove %s: %s\n", path, strerror(errno));
        abort();
    }
}

/* A scratch directory of this process, removed at exit. */
static char g_fuzz_dir[256];
__attribute__((unused)) static void fuzz_rm_dir(void) {
    if (g_fuzz_dir[0]) fuzz_rmtree(g_fuzz_dir);
}

__attribute__((unused)) static const char *fuzz_dir(void) {
    if (!g_fuzz_dir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_fuzz_dir, sizeof g_fuzz_dir, "%s/zoff-fuzz-XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_fuzz_dir)) {
            perror("mkdtemp");
            abort();
        }
        atexit(fuzz_rm_dir);
    }
    return g_fuzz_dir;
}

/* Write n bytes to path (created or truncated). */
__attribute__((unused)) static void fuzz_write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "fuzz: cannot create %s: %s\n", path, strerror(errno));
        abort();
    }
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            fprintf(stderr, "fuzz: cannot write %s: %s\n", path, strerror(errno));
            abort();
        }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
}

/* Every failing call must leave a message; where a file is involved it must name it. */
__attribute__((unused)) static void fuzz_check_error(zoff_status s, const char *must_contain) {
    const char *m = zoff_last_error();
    FUZZ_CHECK(s != ZOFF_OK, "expected a failing status");
    FUZZ_CHECK(m && m[0], "status %s without an error message", zoff_status_name(s));
    FUZZ_CHECK(s != ZOFF_ERR_INTERNAL, "internal error on bad input: %s", m);
    if (must_contain) FUZZ_CHECK(strstr(m, must_contain) != NULL, "message does not name '%s': %s", must_contain, m);
}

/* Little-endian reads from the fuzz input. */
static inline uint32_t fuzz_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t fuzz_u64(const uint8_t *p) { return (uint64_t)fuzz_u32(p) | (uint64_t)fuzz_u32(p + 4) << 32; }
static inline void fuzz_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

#endif
