/* Plain file writes with test fault injection (include/zoff/iofault.h). */
#define _GNU_SOURCE
#include "zoff/iofault.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parse ZOFF_IO_FAULT; false when unset or malformed (malformed: logged once). */
static bool parse_fault(int *err, int64_t *at, const char **needle, size_t *needle_len) {
    const char *s = getenv("ZOFF_IO_FAULT");
    if (!s || !s[0]) return false;
    const char *a = strchr(s, '@');
    if (a && (size_t)(a - s) == 6 && strncmp(s, "ENOSPC", 6) == 0) *err = ENOSPC;
    else if (a && (size_t)(a - s) == 3 && strncmp(s, "EIO", 3) == 0) *err = EIO;
    else a = NULL;
    char *end = NULL;
    long long v = a ? strtoll(a + 1, &end, 10) : -1;
    if (!a || end == a + 1 || v < 0 || (*end && *end != ':')) {
        static bool warned;
        if (!warned) zoff_log(ZOFF_LOG_WARN, "ZOFF_IO_FAULT='%s' is malformed (expected ENOSPC@<offset>[:<path part>] "
                                             "or EIO@...); ignored", s);
        warned = true;
        return false;
    }
    *at = v;
    *needle = *end == ':' ? end + 1 : "";
    *needle_len = strlen(*needle);
    return true;
}

ssize_t zoff_io_write(int fd, const void *buf, size_t n, const char *path) {
    int err;
    int64_t at;
    const char *needle;
    size_t nl;
    if (!parse_fault(&err, &at, &needle, &nl) || (nl && (!path || !strstr(path, needle)))) return write(fd, buf, n);
    /* where this write lands: the end of the file for O_APPEND, else the file offset */
    int64_t pos = -1;
    int fl = fcntl(fd, F_GETFL);
    struct stat st;
    if (fl >= 0 && (fl & O_APPEND) && fstat(fd, &st) == 0) pos = (int64_t)st.st_size;
    else pos = (int64_t)lseek(fd, 0, SEEK_CUR);
    if (pos < 0) return write(fd, buf, n); /* not seekable: no fault */
    if (pos >= at) {
        errno = err;
        return -1;
    }
    if ((uint64_t)(at - pos) < (uint64_t)n) n = (size_t)(at - pos); /* short write up to the fault */
    return write(fd, buf, n);
}
