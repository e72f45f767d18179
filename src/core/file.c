/* Whole-file writes that are atomic on disk. */
#define _GNU_SOURCE
#include "core/file_internal.h"
#include "zoff/iofault.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

/* The process's advice for a full disk (zoff_set_disk_full_advice), and zoff_write_hint's text with it. */
static char disk_full_advice[1024], disk_full_hint[1100];
static atomic_bool disk_full_set;

void zoff_set_disk_full_advice(const char *advice) {
    atomic_store(&disk_full_set, false);
    if (!advice) return;
    snprintf(disk_full_advice, sizeof disk_full_advice, "%s", advice);
    snprintf(disk_full_hint, sizeof disk_full_hint, "; the disk is full: %s", disk_full_advice);
    atomic_store(&disk_full_set, true);
}

const char *zoff_disk_full_advice(const char *own) { return atomic_load(&disk_full_set) ? disk_full_advice : own; }

const char *zoff_write_hint(int err) {
    if (err == ENOSPC || err == EDQUOT)
        return atomic_load(&disk_full_set) ? disk_full_hint : "; the disk is full: free space, or write elsewhere";
    if (err == EFBIG)
        return "; the file would pass this process's file size limit (ulimit -f): raise it (ulimit -f unlimited) "
               "or write less";
    return "";
}

/* Write `text` to PATH.tmp-PID, fsync, close; on failure the temp file is removed. */
zoff_status zoff_write_file_staged(const char *path, const char *text, char **tmp_out) {
    *tmp_out = NULL;
    if (!path || !*path) return zoff_error(ZOFF_ERR_INVALID, "empty output path");
    char *tmp = zoff_tmp_path(path);
    if (!tmp) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory writing %s", path);
    zoff_status s = ZOFF_OK;
    zoff_temp_register(tmp); /* before it exists, until renamed or removed: the caller forgets it */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = zoff_error(zoff_status_of_path_errno(errno), "cannot create %s: %s", tmp, strerror(errno));
        zoff_temp_forget(tmp);
        free(tmp);
        return s;
    }
    size_t n = strlen(text), off = 0;
    while (off < n && s == ZOFF_OK) {
        ssize_t w = zoff_io_write(fd, text + off, n - off, tmp); /* write(2), or an injected fault (tests) */
        if (w < 0 && errno == EINTR) continue;
        int e = w < 0 ? errno : ENOSPC; /* a write of 0 bytes: nothing more fits */
        if (w <= 0)
            s = zoff_error(ZOFF_ERR_IO, "cannot write %s (through its temp file %s, removed): %s%s", path, tmp,
                           strerror(e), zoff_write_hint(e));
        else off += (size_t)w;
    }
    if (s == ZOFF_OK && fsync(fd) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (s != ZOFF_OK) {
        unlink(tmp);
        zoff_temp_forget(tmp);
        free(tmp);
        return s;
    }
    *tmp_out = tmp;
    return ZOFF_OK;
}

/* zoff_write_file_staged, then the rename over `path`; on failure the temp file is removed and
 * `path` is as it was. Then fsync the directory. */
zoff_status zoff_write_file_atomic(const char *path, const char *text, bool dir_sync_required) {
    char *tmp = NULL;
    zoff_status s = zoff_write_file_staged(path, text, &tmp);
    if (s != ZOFF_OK) return s;
    if (rename(tmp, path) != 0) s = zoff_error(ZOFF_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (s != ZOFF_OK) unlink(tmp);
    zoff_temp_forget(tmp);
    if (s == ZOFF_OK && dir_sync_required) s = zoff_fsync_dir_of(path);
    else if (s == ZOFF_OK) (void)zoff_fsync_dir_of(path); /* best effort */
    free(tmp);
    return s;
}

bool zoff_ends_with(const char *name, const char *suffix) {
    size_t a = strlen(name), b = strlen(suffix);
    return a >= b && strcmp(name + a - b, suffix) == 0;
}

char *zoff_expand_home(const char *path) {
    const char *home = getenv("HOME");
    if (path[0] != '~' || (path[1] != '\0' && path[1] != '/') || !home || !*home) return strdup(path);
    size_t a = strlen(home), b = strlen(path + 1);
    char *out = malloc(a + b + 1);
    if (!out) return NULL;
    memcpy(out, home, a);
    memcpy(out + a, path + 1, b + 1);
    return out;
}

void zoff_free_paths(char **paths, size_t n) {
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

bool zoff_paths_add(char ***paths, size_t *n, size_t *cap, const char *path) {
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        char **p = realloc(*paths, nc * sizeof *p);
        if (!p) return false;
        *paths = p;
        *cap = nc;
    }
    if (!((*paths)[*n] = strdup(path))) return false;
    ++*n;
    return true;
}

static int cmp_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

zoff_status zoff_dir_files(const char *dir, bool (*keep)(const char *name), char ***paths, size_t *n) {
    *paths = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return zoff_error(zoff_status_of_path_errno(errno), "cannot read directory %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t cnt = 0, cap = 0;
    zoff_status s = ZOFF_OK;
    struct dirent *e;
    while (s == ZOFF_OK && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || (keep != NULL && !keep(e->d_name))) continue;
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            s = zoff_error(ZOFF_ERR_NOMEM, "out of memory listing %s", dir);
            break;
        }
        snprintf(path, len, "%s/%s", dir, e->d_name);
        struct stat st;
        const int src = stat(path, &st);
        if (src != 0 && keep != NULL) { /* a file of the kind asked for that cannot be read: */
            int err = errno;                         /* a link to a file gone, ... (not skipped unsaid) */
            char target[1024];
            ssize_t tl = readlink(path, target, sizeof target - 1);
            target[tl > 0 ? tl : 0] = '\0';
            s = zoff_error(ZOFF_ERR_INVALID, "%s%s%s%s: %s; restore %s or remove it from %s", path,
                           tl > 0 ? " (a link to " : "", tl > 0 ? target : "", tl > 0 ? ")" : "", strerror(err),
                           tl > 0 ? "the link's target" : "it", dir);
            free(path);
            break;
        }
        if (src != 0 || !S_ISREG(st.st_mode)) { /* a subdirectory, a dangling link (keep NULL), ... */
            free(path);
            continue;
        }
        bool added = zoff_paths_add(&names, &cnt, &cap, path);
        free(path);
        if (!added) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory listing %s", dir);
    }
    closedir(d);
    if (s != ZOFF_OK) {
        zoff_free_paths(names, cnt);
        return s;
    }
    if (cnt > 1) qsort(names, cnt, sizeof *names, cmp_path);
    *paths = names;
    *n = cnt;
    return ZOFF_OK;
}

zoff_status zoff_check_output_parent(const char *path) {
    char *copy = strdup(path);
    if (!copy) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    const char *dir = dirname(copy);
    struct stat st;
    zoff_status s = ZOFF_OK;
    if (stat(dir, &st) != 0)
        s = zoff_error(ZOFF_ERR_INVALID, "output directory %s does not exist; create it (mkdir -p %s)", dir, dir);
    else if (!S_ISDIR(st.st_mode))
        s = zoff_error(ZOFF_ERR_INVALID, "%s, where the output %s would go, is not a directory", dir, path);
    else if (access(dir, W_OK | X_OK) != 0)
        s = zoff_error(zoff_status_of_path_errno(errno), "output directory %s is not writable: %s", dir,
                       strerror(errno));
    free(copy);
    return s;
}

zoff_status zoff_make_work_dir(const char *dir, const char *what) {
    struct stat st;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        const int err = errno;
        if (err == ENOENT) { /* only the last folder is created: a typo in the path makes no tree */
            char *copy = strdup(dir);
            const char *parent = copy ? dirname(copy) : "its parent";
            zoff_status s = zoff_error(zoff_status_of_path_errno(err),
                                       "cannot create %s %s: its parent folder %s does not exist (zoff creates "
                                       "only the last folder of the path): create it (mkdir -p %s) or correct the path",
                                       what, dir, parent, dir);
            free(copy);
            return s;
        }
        return zoff_error(zoff_status_of_path_errno(err), "cannot create %s %s: %s", what, dir, strerror(err));
    }
    if (stat(dir, &st) != 0)
        return zoff_error(zoff_status_of_path_errno(errno), "%s %s: %s", what, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID, "%s %s is a file, not a directory: give a directory", what, dir);
    if (access(dir, W_OK | X_OK) != 0)
        return zoff_error(zoff_status_of_path_errno(errno), "%s %s is not writable: %s", what, dir, strerror(errno));
    return ZOFF_OK;
}

zoff_status zoff_check_output_file(const char *path) {
    size_t n = path ? strlen(path) : 0;
    struct stat st;
    if (n == 0) return zoff_error(ZOFF_ERR_INVALID, "the output path is empty; give the path of a file");
    if (path[n - 1] == '/')
        return zoff_error(ZOFF_ERR_INVALID, "%s ends in '/', which names a folder; give the path of a file", path);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID, "%s is a folder; give the path of a file (in it or elsewhere)", path);
    return zoff_check_output_parent(path);
}
