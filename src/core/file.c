/* Whole-file writes that are atomic on disk. */
#define _GNU_SOURCE
#include "core/file_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *zoff_tmp_path(const char *path) {
    size_t n = strlen(path) + 32;
    char *tmp = malloc(n);
    if (tmp) snprintf(tmp, n, "%s.tmp-%ld", path, (long)getpid());
    return tmp;
}

zoff_status zoff_fsync_dir_of(const char *path) {
    char *copy = strdup(path);
    if (!copy) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory syncing the directory of %s", path);
    const char *dir = dirname(copy);
    zoff_status s = ZOFF_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        s = zoff_error(ZOFF_ERR_IO, "cannot open directory %s to fsync it: %s", dir, strerror(errno));
    } else {
        int r;
        do r = fsync(fd);
        while (r != 0 && errno == EINTR);
        if (r != 0) s = zoff_error(ZOFF_ERR_IO, "cannot fsync directory %s: %s", dir, strerror(errno));
        close(fd);
    }
    free(copy);
    return s;
}

/* Write `text` to PATH.tmp-PID, fsync, close, rename over `path`; on failure the
 * temp file is removed and `path` is as it was. Then fsync the directory. */
zoff_status zoff_write_file_atomic(const char *path, const char *text, bool dir_sync_required) {
    if (!path || !*path) return zoff_error(ZOFF_ERR_INVALID, "empty output path");
    char *tmp = zoff_tmp_path(path);
    if (!tmp) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory writing %s", path);
    zoff_status s = ZOFF_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = zoff_error(zoff_status_of_path_errno(errno), "cannot create %s: %s", tmp, strerror(errno));
        goto done;
    }
    size_t n = strlen(text), off = 0;
    while (off < n && s == ZOFF_OK) {
        ssize_t w = write(fd, text + off, n - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) s = zoff_error(ZOFF_ERR_IO, "cannot write %s: %s", tmp, w < 0 ? strerror(errno) : "short write");
        else off += (size_t)w;
    }
    if (s == ZOFF_OK && fsync(fd) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (s == ZOFF_OK && rename(tmp, path) != 0)
        s = zoff_error(ZOFF_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s != ZOFF_OK) unlink(tmp);
    else if (dir_sync_required) s = zoff_fsync_dir_of(path);
    else (void)zoff_fsync_dir_of(path); /* best effort */
done:
    free(tmp);
    return s;
}
