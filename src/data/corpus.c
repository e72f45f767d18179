/* The default training corpus: Debian's `fortunes` package as one plain-text file.
 * Same rules, byte for byte, as scripts/prepare_corpus.sh (see there and data.h). */
#define _GNU_SOURCE
#include "zoff/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Clean one line in place (no '\n'): first each backspace erases the character
 * before it (a whole UTF-8 sequence, control characters included, as perl's
 * `1 while s/[^\x08]\x08//` does), then control bytes other than tab go, then
 * trailing spaces and tabs. Returns the new length. */
static size_t clean_line(char *l, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (l[i] == 0x08) {
            if (o > 0) {
                o--;
                while (o > 0 && ((unsigned char)l[o] & 0xC0) == 0x80) o--;
            }
            continue; /* a backspace with nothing before it is a control byte: dropped below anyway */
        }
        l[o++] = l[i];
    }
    size_t m = 0;
    for (size_t i = 0; i < o; i++) {
        unsigned char c = (unsigned char)l[i];
        if ((c < 0x20 && c != '\t') || c == 0x7F) continue;
        l[m++] = (char)c;
    }
    while (m > 0 && (l[m - 1] == ' ' || l[m - 1] == '\t')) m--;
    return m;
}

typedef struct entry_buf {
    char *text;     /* the entry's lines, each ending in '\n' */
    size_t len, cap;
    size_t leading; /* empty lines before the first non-empty line are not stored */
    size_t pending; /* empty lines seen since the last non-empty one */
} entry_buf;

static zoff_status entry_add(entry_buf *e, const char *l, size_t n) {
    if (n == 0) {
        if (e->len > 0) e->pending++;
        return ZOFF_OK;
    }
    size_t need = e->len + e->pending + n + 1;
    if (need > e->cap) {
        size_t nc = e->cap ? e->cap : 4096;
        while (nc < need) nc *= 2;
        char *q = realloc(e->text, nc);
        if (!q) return zoff_error(ZOFF_ERR_NOMEM, "out of memory building the corpus");
        e->text = q;
        e->cap = nc;
    }
    memset(e->text + e->len, '\n', e->pending);
    e->len += e->pending;
    e->pending = 0;
    memcpy(e->text + e->len, l, n);
    e->len += n;
    e->text[e->len++] = '\n';
    return ZOFF_OK;
}

static bool entry_flush(entry_buf *e, FILE *out, int64_t *entries) {
    bool ok = true;
    if (e->len > 0) {
        ok = fwrite(e->text, 1, e->len, out) == e->len && fputc('\n', out) != EOF;
        (*entries)++;
    }
    e->len = 0;
    e->pending = 0;
    return ok;
}

zoff_status zoff_corpus_build_fortunes(const char *src_dir, const char *out_path, zoff_corpus_info *info) {
    if (info) memset(info, 0, sizeof *info);
    if (!src_dir) {
        const char *env = getenv("ZOFF_FORTUNES_DIR");
        src_dir = env && *env ? env : ZOFF_FORTUNES_DIR;
    }
    if (!out_path || !*out_path) return zoff_error(ZOFF_ERR_INVALID, "zoff_corpus_build_fortunes: no output path");

    DIR *d = opendir(src_dir);
    char **names = NULL;
    size_t n = 0, cap = 0;
    zoff_status s = ZOFF_OK;
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) && s == ZOFF_OK) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            if (has_suffix(de->d_name, ".dat") || has_suffix(de->d_name, ".u8")) continue;
            size_t pl = strlen(src_dir) + strlen(de->d_name) + 2;
            char *p = malloc(pl);
            if (!p) { s = zoff_error(ZOFF_ERR_NOMEM, "out of memory listing %s", src_dir); break; }
            snprintf(p, pl, "%s/%s", src_dir, de->d_name);
            struct stat st;
            if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) { /* no symlinks, no off/ */
                free(p);
                continue;
            }
            if (n == cap) {
                cap = cap ? cap * 2 : 64;
                char **q = realloc(names, cap * sizeof *q);
                if (!q) { free(p); s = zoff_error(ZOFF_ERR_NOMEM, "out of memory listing %s", src_dir); break; }
                names = q;
            }
            names[n++] = p;
        }
        closedir(d);
    }
    if (s == ZOFF_OK && n == 0)
        s = zoff_error(ZOFF_ERR_IO, "no fortune files in %s%s%s; install the corpus with: apt-get install fortunes",
                       src_dir, d ? "" : ": ", d ? "" : strerror(errno));
    if (s != ZOFF_OK) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return s;
    }
    qsort(names, n, sizeof *names, cmp_name);

    size_t tl = strlen(out_path) + 32;
    char *tmp = malloc(tl);
    FILE *out = NULL;
    if (!tmp) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    else {
        snprintf(tmp, tl, "%s.tmp.XXXXXX", out_path);
        int fd = mkstemp(tmp);
        if (fd < 0 || !(out = fdopen(fd, "w"))) {
            s = zoff_error(zoff_status_of_path_errno(errno),
                           "cannot create a file next to %s: %s; check that the directory exists and is "
                           "writable",
                           out_path, strerror(errno));
            if (fd >= 0) { close(fd); unlink(tmp); }
        } else {
            (void)fchmod(fd, 0644);
        }
    }
    entry_buf e = {0};
    int64_t entries = 0;
    char *line = NULL;
    size_t lcap = 0;
    for (size_t i = 0; i < n && s == ZOFF_OK; i++) {
        FILE *f = fopen(names[i], "rb");
        if (!f) {
            s = zoff_error(ZOFF_ERR_IO, "cannot read %s: %s", names[i], strerror(errno));
            break;
        }
        ssize_t len;
        while (s == ZOFF_OK && (len = getline(&line, &lcap, f)) >= 0) {
            size_t l = (size_t)len;
            if (l > 0 && line[l - 1] == '\n') l--;
            if (l > 0 && line[l - 1] == '\r' && (size_t)len > l) l--; /* "\r\n" only, like s/\r?\n\z// */
            if (l == 1 && line[0] == '%') {
                if (!entry_flush(&e, out, &entries)) s = zoff_error(ZOFF_ERR_IO, "writing %s: %s", tmp, strerror(errno));
                continue;
            }
            s = entry_add(&e, line, clean_line(line, l));
        }
        if (s == ZOFF_OK && ferror(f)) s = zoff_error(ZOFF_ERR_IO, "reading %s: %s", names[i], strerror(errno));
        fclose(f);
        if (s == ZOFF_OK && !entry_flush(&e, out, &entries))
            s = zoff_error(ZOFF_ERR_IO, "writing %s: %s", tmp, strerror(errno));
    }
    free(line);
    free(e.text);
    int64_t bytes = 0;
    if (out) {
        if (s == ZOFF_OK) {
            if (fflush(out) != 0 || fsync(fileno(out)) != 0)
                s = zoff_error(ZOFF_ERR_IO, "writing %s: %s; check free disk space", tmp, strerror(errno));
            bytes = (int64_t)ftell(out);
        }
        if (fclose(out) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "closing %s: %s", tmp, strerror(errno));
        if (s == ZOFF_OK && rename(tmp, out_path) != 0)
            s = zoff_error(ZOFF_ERR_IO, "renaming %s to %s: %s", tmp, out_path, strerror(errno));
        if (s != ZOFF_OK) unlink(tmp);
    }
    free(tmp);
    if (s == ZOFF_OK && info) {
        info->bytes = bytes;
        info->entries = entries;
        info->files = (int)n;
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return s;
}
