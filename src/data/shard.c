/* Token shards (llm.c's .bin format): atomic writer, validating mmap reader,
 * and datasets of shards from a file, directory, glob or list. */
#define _GNU_SOURCE
#include "zoff/data.h"
#include "zoff/iofault.h"
#include "core/file_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct zoff_shard {
    char *path;
    int64_t num_tokens;
    int32_t vocab_size;
    int32_t check_vocab; /* ids must be below this (0: every uint16 is valid) */
    const uint16_t *tokens;
    void *map;
    size_t map_bytes;
    dev_t dev; /* the file's identity: one file named twice (a link, a list, a glob and a folder) */
    ino_t ino;
};

/* ------------------------------------------------------------------ writing */

zoff_status zoff_shard_write_bytes(int fd, const void *buf, size_t n, const char *path) {
    const char *p = buf;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = zoff_io_write(fd, p, chunk, path); /* write(2), or an injected fault (tests) */
        if (w < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            return zoff_error(ZOFF_ERR_IO, "writing %s: %s%s", path, strerror(e),
                              *zoff_write_hint(e) ? zoff_write_hint(e) : "; check free disk space and permissions");
        }
        p += w;
        n -= (size_t)w;
    }
    return ZOFF_OK;
}

void zoff_shard_header(int32_t header[ZOFF_SHARD_HEADER_INTS], int64_t n, int32_t vocab_size) {
    memset(header, 0, ZOFF_SHARD_HEADER_BYTES);
    header[0] = ZOFF_SHARD_MAGIC;
    header[1] = ZOFF_SHARD_VERSION;
    header[2] = (int32_t)n;
    header[3] = vocab_size;
}

zoff_status zoff_shard_write(const char *path, const uint16_t *tokens, int64_t n, int32_t vocab_size) {
    if (!path || !*path) return zoff_error(ZOFF_ERR_INVALID, "zoff_shard_write: empty output path");
    if (n < 0 || (n > 0 && !tokens))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_shard_write %s: invalid token count %lld", path, (long long)n);
    if (n > ZOFF_SHARD_MAX_TOKENS)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s: %lld tokens do not fit one shard (the header holds at most %lld); "
                          "split the data into several shards (zoff tokenize --shard-size)",
                          path, (long long)n, (long long)ZOFF_SHARD_MAX_TOKENS);
    if (vocab_size < 0 || vocab_size > 65536)
        return zoff_error(ZOFF_ERR_INVALID, "%s: vocab size %d cannot be stored as uint16 tokens (max 65536)", path,
                          (int)vocab_size);
    if (vocab_size > 0)
        for (int64_t i = 0; i < n; i++)
            if (tokens[i] >= vocab_size)
                return zoff_error(ZOFF_ERR_INVALID, "%s: token %lld is %u, not below the vocab size %d", path,
                                  (long long)i, (unsigned)tokens[i], (int)vocab_size);

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return zoff_error(ZOFF_ERR_NOMEM, "out of memory writing %s", path);
    /* same directory as the target, so the rename is atomic */
    snprintf(tmp, plen + 32, "%s.tmp.XXXXXX", path);
    int fd = zoff_temp_create(tmp, false); /* mkstemp, the file registered for a Ctrl-C's removal */
    if (fd < 0) {
        zoff_status s = zoff_error(zoff_status_of_path_errno(errno),
                                   "cannot create a temporary file next to %s: %s; check that the "
                                   "directory exists and is writable",
                                   path, strerror(errno));
        free(tmp);
        return s;
    }
    int32_t header[ZOFF_SHARD_HEADER_INTS];
    zoff_shard_header(header, n, vocab_size);
    (void)fchmod(fd, 0644); /* mkstemp makes 0600; shards are plain data files */
    zoff_status s = zoff_shard_write_bytes(fd, header, sizeof header, path);
    if (s == ZOFF_OK && n > 0) s = zoff_shard_write_bytes(fd, tokens, (size_t)n * sizeof(uint16_t), path);
    if (s == ZOFF_OK && fsync(fd) != 0)
        s = zoff_error(ZOFF_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "closing %s: %s", tmp, strerror(errno));
    if (s == ZOFF_OK) {
        if (rename(tmp, path) != 0)
            s = zoff_error(ZOFF_ERR_IO, "renaming %s to %s: %s", tmp, path, strerror(errno));
    }
    if (s != ZOFF_OK) unlink(tmp);
    else (void)zoff_fsync_dir_of(path);
    zoff_temp_forget(tmp);
    free(tmp);
    return s;
}

/* Whether a file given as a shard begins as text (a user's corpus, not zoff tokenize's output): its
 * first bytes (up to a shard header's worth) hold no NUL and no control byte but tab, newline,
 * carriage return and form feed. A shard's header is mostly zero bytes, its magic holds 0x01. */
static bool starts_as_text(int fd, int64_t fsize) {
    uint8_t b[ZOFF_SHARD_HEADER_BYTES];
    size_t n = fsize < (int64_t)sizeof b ? (size_t)fsize : sizeof b;
    if (n == 0 || pread(fd, b, n, 0) != (ssize_t)n) return false;
    for (size_t i = 0; i < n; i++)
        if (b[i] < 0x20 && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' && b[i] != '\f') return false;
    return true;
}
/* ------------------------------------------------------------------ reading */

zoff_status zoff_shard_open(const char *path, int32_t vocab_size, zoff_shard **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zoff_error(zoff_status_of_path_errno(errno), "cannot open token shard %s: %s; create it with zoff tokenize", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return zoff_error(ZOFF_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zoff_error(ZOFF_ERR_INVALID, "%s is not a regular file; expected a token shard (.bin)", path);
    }
    int64_t fsize = (int64_t)st.st_size;
    if (starts_as_text(fd, fsize)) {
        close(fd);
        char prefix[4096];
        const char *base = strrchr(path, '/'), *dot = strrchr(path, '.');
        int keep = dot && dot > (base ? base : path) ? (int)(dot - path) : (int)strlen(path);
        snprintf(prefix, sizeof prefix, "%.*s", keep, path);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s is text, not a token shard: zoff tokenize --output-prefix %s %s writes %s_train.bin and "
                          "%s_val.bin: give those as --data-path (to zoff train or zoff eval)",
                          path, prefix, path, prefix, prefix);
    }
    if (fsize < ZOFF_SHARD_HEADER_BYTES) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: truncated: %lld bytes, shorter than the %d-byte shard header; re-run zoff tokenize",
                          path, (long long)fsize, ZOFF_SHARD_HEADER_BYTES);
    }
    int32_t header[ZOFF_SHARD_HEADER_INTS];
    ssize_t r = pread(fd, header, sizeof header, 0);
    if (r != (ssize_t)sizeof header) {
        zoff_status s = zoff_error(ZOFF_ERR_IO, "reading the header of %s: %s", path,
                                   r < 0 ? strerror(errno) : "short read");
        close(fd);
        return s;
    }
    if (header[0] != ZOFF_SHARD_MAGIC) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: not a token shard: magic is %d (0x%08x), expected %d (llm.c .bin format); "
                          "create shards with zoff tokenize",
                          path, (int)header[0], (unsigned)header[0], ZOFF_SHARD_MAGIC);
    }
    if (header[1] != ZOFF_SHARD_VERSION) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: shard version %d, expected %d (uint16 tokens)%s; re-run zoff tokenize", path,
                          (int)header[1], ZOFF_SHARD_VERSION,
                          header[1] == 2 ? " -- version 2 is llm.c's uint32 LLaMA-3 format, not supported" : "");
    }
    int64_t n = header[2];
    if (n < 0) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT, "%s: header says %lld tokens (negative); the file is corrupt, re-run zoff tokenize",
                          path, (long long)n);
    }
    int64_t want = ZOFF_SHARD_HEADER_BYTES + 2 * n;
    if (fsize < want) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: truncated: header says %lld tokens (%lld bytes) but file has %lld bytes; "
                          "re-run zoff tokenize",
                          path, (long long)n, (long long)want, (long long)fsize);
    }
    if (fsize > want) {
        close(fd);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: oversized: header says %lld tokens (%lld bytes) but file has %lld bytes "
                          "(%lld unexpected trailing bytes); re-run zoff tokenize",
                          path, (long long)n, (long long)want, (long long)fsize, (long long)(fsize - want));
    }
    int32_t hv = header[3];
    if (hv < 0 || hv > 65536) hv = 0; /* not ours: foreign writers may leave garbage here */

    zoff_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        close(fd);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
    }
    s->num_tokens = n;
    s->vocab_size = hv;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->map_bytes = (size_t)fsize;
    s->map = mmap(NULL, s->map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        zoff_shard_close(s);
        return zoff_error(ZOFF_ERR_IO, "cannot map %s (%lld bytes): %s", path, (long long)fsize, strerror(err));
    }
    (void)madvise(s->map, s->map_bytes, MADV_WILLNEED);
    s->tokens = (const uint16_t *)((const char *)s->map + ZOFF_SHARD_HEADER_BYTES);

    if (vocab_size > 0) {
        if (hv > vocab_size) {
            zoff_status st2 = zoff_error(ZOFF_ERR_FORMAT,
                                         "%s was written by a tokenizer with %d tokens, more than the %d this run "
                                         "uses; tokenize with the model's tokenizer",
                                         path, (int)hv, (int)vocab_size);
            zoff_shard_close(s);
            return st2;
        }
        if (vocab_size < 65536) s->check_vocab = vocab_size; /* the ids are checked when read */
    }
    *out = s;
    return ZOFF_OK;
}

void zoff_shard_close(zoff_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_bytes);
    free(s->path);
    free(s);
}

zoff_status zoff_shard_check_tokens(const zoff_shard *s, int64_t lo, int64_t hi) {
    if (lo < 0 || hi > s->num_tokens || lo > hi)
        return zoff_error(ZOFF_ERR_INVALID, "%s: token range [%lld, %lld) is outside the shard's %lld tokens", s->path,
                          (long long)lo, (long long)hi, (long long)s->num_tokens);
    if (s->check_vocab <= 0) return ZOFF_OK;
    const uint16_t *t = s->tokens;
    const uint16_t vmax = (uint16_t)s->check_vocab;
    /* max-reduced per block so the common case is branch-light */
    for (int64_t i = lo; i < hi;) {
        int64_t end = i + 4096 < hi ? i + 4096 : hi;
        uint16_t mx = 0;
        for (int64_t j = i; j < end; j++) mx = t[j] > mx ? t[j] : mx;
        if (mx >= vmax)
            for (int64_t j = i; j < end; j++)
                if (t[j] >= vmax)
                    return zoff_error(ZOFF_ERR_FORMAT,
                                      "%s: token at position %lld is %u, not below the vocab size %d; the shard was "
                                      "made with another tokenizer or is corrupt",
                                      s->path, (long long)j, (unsigned)t[j], (int)s->check_vocab);
        i = end;
    }
    return ZOFF_OK;
}

int64_t zoff_shard_num_tokens(const zoff_shard *s) { return s->num_tokens; }
const uint16_t *zoff_shard_tokens(const zoff_shard *s) { return s->tokens; }
const char *zoff_shard_path(const zoff_shard *s) { return s->path; }
int32_t zoff_shard_vocab_size(const zoff_shard *s) { return s->vocab_size; }

/* ------------------------------------------------------------------ datasets */

struct zoff_dataset {
    zoff_shard **shards;
    int num_shards, cap;
    int64_t num_tokens;
};

static zoff_status add_shard(zoff_dataset *ds, const char *path, int32_t vocab_size) {
    if (ds->num_shards == ds->cap) {
        int nc = ds->cap ? ds->cap * 2 : 8;
        zoff_shard **p = realloc(ds->shards, (size_t)nc * sizeof *p);
        if (!p) return zoff_error(ZOFF_ERR_NOMEM, "out of memory listing shards");
        ds->shards = p;
        ds->cap = nc;
    }
    zoff_shard *s;
    ZOFF_TRY(zoff_shard_open(path, vocab_size, &s));
    ds->shards[ds->num_shards++] = s;
    ds->num_tokens += s->num_tokens;
    return ZOFF_OK;
}

static bool is_shard_name(const char *name) { return zoff_ends_with(name, ".bin"); }

static zoff_status add_directory(zoff_dataset *ds, const char *dir, int32_t vocab_size) {
    char **names = NULL;
    size_t n = 0;
    ZOFF_TRY(zoff_dir_files(dir, is_shard_name, &names, &n));
    zoff_status s = ZOFF_OK;
    if (n == 0)
        s = zoff_error(ZOFF_ERR_INVALID, "directory %s holds no .bin token shards; create them with zoff tokenize",
                       dir);
    for (size_t i = 0; i < n && s == ZOFF_OK; i++) s = add_shard(ds, names[i], vocab_size);
    zoff_free_paths(names, n);
    return s;
}

static zoff_status add_pattern(zoff_dataset *ds, const char *given, int32_t vocab_size);

/* One path of the list, a leading ~ taken as $HOME (zoff_expand_home). */
static zoff_status add_path(zoff_dataset *ds, const char *given, int32_t vocab_size) {
    char *pat = zoff_expand_home(given);
    if (!pat) return zoff_error(ZOFF_ERR_NOMEM, "out of memory reading the shard list");
    zoff_status s = add_pattern(ds, pat, vocab_size);
    free(pat);
    return s;
}

static zoff_status add_pattern(zoff_dataset *ds, const char *pat, int32_t vocab_size) {
    struct stat st;
    if (stat(pat, &st) == 0) {
        if (S_ISDIR(st.st_mode)) return add_directory(ds, pat, vocab_size);
        return add_shard(ds, pat, vocab_size);
    }
    if (!strpbrk(pat, "*?["))
        return zoff_error(zoff_status_of_path_errno(errno), "token shard %s: %s; create it with zoff tokenize", pat,
                          strerror(errno));
    glob_t g;
    int rc = glob(pat, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return zoff_error(ZOFF_ERR_INVALID, "no files match '%s'; check the path or create shards with zoff tokenize",
                          pat);
    }
    if (rc != 0) {
        globfree(&g);
        return zoff_error(ZOFF_ERR_IO, "cannot expand '%s' (glob error %d)", pat, rc);
    }
    zoff_status s = ZOFF_OK;
    for (size_t i = 0; i < g.gl_pathc && s == ZOFF_OK; i++) s = add_shard(ds, g.gl_pathv[i], vocab_size);
    globfree(&g);
    return s;
}

zoff_status zoff_dataset_open(const char *pattern, int32_t vocab_size, zoff_dataset **out) {
    *out = NULL;
    if (!pattern || !*pattern)
        return zoff_error(ZOFF_ERR_INVALID, "empty data path; give a shard file, a directory or a glob");
    zoff_dataset *ds = calloc(1, sizeof *ds);
    char *copy = strdup(pattern);
    if (!ds || !copy) {
        free(ds);
        free(copy);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", pattern);
    }
    zoff_status s = ZOFF_OK;
    char *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && s == ZOFF_OK; tok = strtok_r(NULL, ",", &save))
        if (*tok) s = add_path(ds, tok, vocab_size);
    free(copy);
    if (s == ZOFF_OK && ds->num_shards == 0)
        s = zoff_error(ZOFF_ERR_INVALID, "data path '%s' names no shards", pattern);
    if (s == ZOFF_OK) *out = ds;
    else zoff_dataset_free(ds);
    return s;
}

void zoff_dataset_free(zoff_dataset *ds) {
    if (!ds) return;
    for (int i = 0; i < ds->num_shards; i++) zoff_shard_close(ds->shards[i]);
    free(ds->shards);
    free(ds);
}

int zoff_dataset_num_shards(const zoff_dataset *ds) { return ds->num_shards; }
const zoff_shard *zoff_dataset_shard(const zoff_dataset *ds, int i) {
    return (i >= 0 && i < ds->num_shards) ? ds->shards[i] : NULL;
}
int64_t zoff_dataset_num_tokens(const zoff_dataset *ds) { return ds->num_tokens; }

int zoff_dataset_next_short_shard(const zoff_dataset *ds, int64_t seq_len, int from) {
    for (int i = from < 0 ? 0 : from; i < ds->num_shards; i++)
        if (zoff_shard_num_tokens(zoff_dataset_shard(ds, i)) < seq_len + 1) return i;
    return -1;
}

bool zoff_dataset_same_file(const zoff_dataset *a, const zoff_dataset *b, int *ia, int *ib) {
    for (int i = 0; i < a->num_shards; i++)
        for (int j = a == b ? i + 1 : 0; j < b->num_shards; j++)
            if (a->shards[i]->dev == b->shards[j]->dev && a->shards[i]->ino == b->shards[j]->ino) {
                *ia = i;
                *ib = j;
                return true;
            }
    return false;
}

static const char *tokenizer_by_vocab(int32_t v) { return v == 256 ? "byte" : v == 50257 ? "gpt2" : NULL; }

zoff_status zoff_dataset_check_tokenizer(const zoff_dataset *ds, const zoff_tokenizer *tok, const char *hint) {
    const int32_t tv = zoff_tokenizer_vocab_size(tok);
    for (int i = 0; i < ds->num_shards; i++) {
        const zoff_shard *s = ds->shards[i];
        if (s->vocab_size <= 0 || s->vocab_size == tv) continue; /* not recorded (llm.c's shards), or the same */
        const char *was = tokenizer_by_vocab(s->vocab_size);
        char by[64];
        if (was) snprintf(by, sizeof by, "the %s tokenizer (%d tokens)", was, (int)s->vocab_size);
        else snprintf(by, sizeof by, "a tokenizer of %d tokens", (int)s->vocab_size);
        return zoff_error(ZOFF_ERR_FORMAT, "%s was written by %s, not this model's %s (%d): its ids would be read as "
                                           "other tokens; tokenize it with --tokenizer %s%s",
                          s->path, by, zoff_tokenizer_name(tok), (int)tv, zoff_tokenizer_name(tok), hint ? hint : "");
    }
    return ZOFF_OK;
}
