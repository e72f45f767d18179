/* Text files -> token shards (the engine of `zoff tokenize`): all-or-nothing. */
#define _GNU_SOURCE
#include "zoff/data.h"

#include "core/file_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_max_threads(void) { return 1; }
static int omp_get_thread_num(void) { return 0; }
#endif

#define PIECE_BYTES ((size_t)512 << 10)
#define PIECES_PER_THREAD 4 /* a step's pieces, taken as threads come free: a slow piece holds no thread idle long */
#define REPORT_BYTES ((size_t)64 << 20)

#define SPOOL_TOKENS ((size_t)1 << 20)

/* Shard k of a split is named (and its temporary file) as below. */
static void shard_paths(const zoff_tokenize_options *opt, const char *split, int64_t k, char *final, size_t l,
                        char *tmp, size_t tl) {
    if (opt->shard_tokens > 0)
        snprintf(final, l, "%s_%s_%06lld.bin", opt->output_prefix, split, (long long)k);
    else
        snprintf(final, l, "%s_%s.bin", opt->output_prefix, split);
    snprintf(tmp, tl, "%s.incomplete-%ld", final, (long)getpid());
}

/* Where the tokens go as they come, so that no more than a buffer of them is held: spool file k,
 * the temporary file of train shard k, holds tokens [k * per, (k + 1) * per) of all (per: the
 * shard size, else no limit) after a shard header. The split into train and val is made at the
 * end (finish_split), when the number of tokens is known. */
typedef struct spool {
    const zoff_tokenize_options *opt;
    int32_t vocab;
    int64_t per, n; /* n: tokens so far, the buffered ones too */
    int64_t nfiles; /* spool files created (and registered for a Ctrl-C's removal) */
    int fd;         /* the last one's, or -1 */
    char path[4300];
    uint16_t *buf;
    size_t nbuf;
} spool;

static int64_t spool_in_last(const spool *sp) { return sp->n - (sp->nfiles - 1) * sp->per; }

/* Writes a shard header for `count` tokens at the start of the open file. */
static zoff_status put_header(int fd, const char *path, int64_t count, int32_t vocab) {
    int32_t h[ZOFF_SHARD_HEADER_INTS];
    zoff_shard_header(h, count, vocab);
    if (pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h)
        return zoff_error(ZOFF_ERR_IO, "writing the header of %s: %s", path, strerror(errno));
    return ZOFF_OK;
}

static zoff_status spool_flush(spool *sp) {
    zoff_status s = zoff_shard_write_bytes(sp->fd, sp->buf, sp->nbuf * sizeof *sp->buf, sp->path);
    sp->nbuf = 0;
    return s;
}

/* Flushes and closes the last spool file, its header counting what it holds, synced. */
static zoff_status spool_close(spool *sp) {
    if (sp->fd < 0) return ZOFF_OK;
    zoff_status s = spool_flush(sp);
    int64_t count = spool_in_last(sp);
    if (s == ZOFF_OK) s = put_header(sp->fd, sp->path, count < ZOFF_SHARD_MAX_TOKENS ? count : 0, sp->vocab);
    if (s == ZOFF_OK && fsync(sp->fd) != 0) s = zoff_error(ZOFF_ERR_IO, "fsync %s: %s", sp->path, strerror(errno));
    if (close(sp->fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "closing %s: %s", sp->path, strerror(errno));
    sp->fd = -1;
    return s;
}

static zoff_status spool_open_next(spool *sp) {
    char final[4200];
    shard_paths(sp->opt, "train", sp->nfiles, final, sizeof final, sp->path, sizeof sp->path);
    zoff_temp_register(sp->path); /* before it exists: a Ctrl-C removes it */
    sp->nfiles++;
    sp->fd = open(sp->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (sp->fd < 0)
        return zoff_error(zoff_status_of_path_errno(errno), "cannot create %s: %s", sp->path, strerror(errno));
    int32_t h[ZOFF_SHARD_HEADER_INTS] = {0}; /* the real one when it is closed */
    return zoff_shard_write_bytes(sp->fd, h, sizeof h, sp->path);
}

static zoff_status spool_add(spool *sp, const int32_t *ids, size_t m) {
    for (size_t i = 0; i < m;) {
        if (sp->fd < 0) ZOFF_TRY(spool_open_next(sp));
        int64_t room = sp->per - spool_in_last(sp);
        size_t take = m - i < SPOOL_TOKENS - sp->nbuf ? m - i : SPOOL_TOKENS - sp->nbuf;
        if ((int64_t)take > room) take = (size_t)room;
        for (size_t k = 0; k < take; k++) sp->buf[sp->nbuf + k] = (uint16_t)ids[i + k];
        sp->nbuf += take, sp->n += (int64_t)take, i += take;
        if ((int64_t)take == room) ZOFF_TRY(spool_close(sp));
        else if (sp->nbuf == SPOOL_TOKENS) ZOFF_TRY(spool_flush(sp));
    }
    return ZOFF_OK;
}

/* Removes the spool files (after a failure, or those past the train split). */
static void spool_remove(spool *sp, int64_t from) {
    char final[4200], tmp[4300];
    if (sp->fd >= 0) close(sp->fd);
    sp->fd = -1;
    for (int64_t k = from; k < sp->nfiles; k++) {
        shard_paths(sp->opt, "train", k, final, sizeof final, tmp, sizeof tmp);
        unlink(tmp);
        zoff_temp_forget(tmp);
    }
}

/* The encoders: one tokenizer per thread (tok[0] the caller's, the others clones); a step's pieces and their ids. */
typedef struct tok_pool {
    zoff_tokenizer **tok;
    zoff_tokens *out;
    zoff_status *status;
    char (*msg)[512];
    size_t *cut; /* piece i is buf[cut[i] .. cut[i+1]) */
    int threads, pieces; /* pieces: at most this many a step */
    size_t piece_bytes;
    bool bytes_only; /* the byte tokenizer: any place is a cut */
    char *buf;
    size_t cap;
} tok_pool;

static void pool_free(tok_pool *p) {
    for (int i = 1; i < p->threads && p->tok; i++) zoff_tokenizer_free(p->tok[i]);
    for (int i = 0; i < p->pieces && p->out; i++) zoff_tokens_free(&p->out[i]);
    free(p->tok);
    free(p->out);
    free(p->status);
    free(p->msg);
    free(p->cut);
    free(p->buf);
    memset(p, 0, sizeof *p);
}

static zoff_status pool_init(tok_pool *p, zoff_tokenizer *t, const zoff_tokenize_options *opt) {
    memset(p, 0, sizeof *p);
    p->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    if (p->threads < 1) p->threads = 1;
    p->piece_bytes = opt->piece_bytes > 0 ? opt->piece_bytes : PIECE_BYTES;
    p->bytes_only = !strcmp(zoff_tokenizer_name(t), "byte");
    p->pieces = p->threads > 1 ? p->threads * PIECES_PER_THREAD : 1;
    p->cap = p->piece_bytes * ((size_t)p->pieces + 1); /* each piece ends a little past piece_bytes */
    p->tok = calloc((size_t)p->threads, sizeof *p->tok);
    p->out = calloc((size_t)p->pieces, sizeof *p->out);
    p->status = calloc((size_t)p->pieces, sizeof *p->status);
    p->msg = calloc((size_t)p->pieces, sizeof *p->msg);
    p->cut = calloc((size_t)p->pieces + 1, sizeof *p->cut);
    p->buf = malloc(p->cap);
    if (!p->tok || !p->out || !p->status || !p->msg || !p->cut || !p->buf) {
        pool_free(p);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory setting up %d tokenizing threads; try --threads 1", p->threads);
    }
    p->tok[0] = t;
    for (int i = 1; i < p->threads; i++) {
        zoff_status s = zoff_tokenizer_clone(t, &p->tok[i]);
        if (s != ZOFF_OK) {
            pool_free(p);
            return s;
        }
    }
    return ZOFF_OK;
}

/* The first place p in [from, have) where text may be cut so that encoding the two sides apart
 * equals encoding the whole, or 0 if there is none. Both bytes around it are ASCII (no character
 * is cut) and either text[p-1] is a non-space and text[p] whitespace, or text[p-1] a letter or
 * digit and text[p] neither (punctuation: minified JSON, code). The piece of GPT-2's pre-tokeniser
 * holding text[p-1] (a contraction, or a run of one class after at most one space) ends at p
 * whatever follows, and the next one starts at p and looks only forward. (Punctuation then a
 * letter is no place: "'" "s" is a contraction.) */
static size_t safe_cut(const tok_pool *pool, size_t from, size_t have) {
    const uint8_t *t = (const uint8_t *)pool->buf;
    if (from < 1) from = 1;
    if (pool->bytes_only) return from < have ? from : 0;
    for (size_t p = from; p < have; p++) {
        if (t[p] >= 0x80 || t[p - 1] >= 0x80) continue;
        zoff_unicode_class a = zoff_unicode_class_of(t[p - 1]), b = zoff_unicode_class_of(t[p]);
        if ((a != ZOFF_UCLASS_SPACE && b == ZOFF_UCLASS_SPACE) ||
            ((a == ZOFF_UCLASS_LETTER || a == ZOFF_UCLASS_NUMBER) && b == ZOFF_UCLASS_OTHER))
            return p;
    }
    return 0;
}

/* Cuts buf[0 .. have) into at most `pieces` pieces of about piece_bytes (the last one ending at a
 * safe cut unless eof): the number of pieces; 0 when no safe cut is in the buffer before eof. */
static int cut_pieces(tok_pool *p, size_t have, bool eof) {
    int np = 0;
    size_t pos = 0;
    while (np < p->pieces && pos < have) {
        size_t end = have - pos <= p->piece_bytes && eof ? have : safe_cut(p, pos + p->piece_bytes, have);
        if (end == 0 && eof) end = have;
        if (end == 0) break;
        p->cut[np++] = pos;
        pos = end;
    }
    p->cut[np] = pos;
    return np;
}

static void encode_pieces(tok_pool *p, int np) {
    int nt = np < p->threads ? np : p->threads;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int i = 0; i < np; i++) {
        p->out[i].n = 0;
        p->status[i] = zoff_tokenizer_encode(p->tok[nt > 1 ? omp_get_thread_num() : 0], p->buf + p->cut[i], p->cut[i + 1] - p->cut[i], &p->out[i]);
        if (p->status[i] != ZOFF_OK) snprintf(p->msg[i], sizeof p->msg[i], "%s", zoff_last_error());
    }
}

/* Reads into the pool's buffer after its first *have bytes, up to its capacity (doubled when
 * full): the bytes read, 0 at the end of the file. */
static zoff_status fill(tok_pool *p, int fd, const char *path, int64_t *off, size_t *have, size_t *got) {
    *got = 0;
    if (*have == p->cap) {
        char *q = realloc(p->buf, p->cap * 2);
        if (!q)
            return zoff_error(ZOFF_ERR_NOMEM, "out of memory holding %zu MiB of %s without a space to cut it at",
                              p->cap * 2 >> 20, path);
        p->buf = q;
        p->cap *= 2;
    }
    while (*have < p->cap) {
        ssize_t r = pread(fd, p->buf + *have, p->cap - *have, (off_t)*off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return zoff_error(ZOFF_ERR_IO, "reading %s at byte %lld: %s", path, (long long)*off, strerror(errno));
        if (r == 0) break;
        *have += (size_t)r, *got += (size_t)r, *off += r;
    }
    return ZOFF_OK;
}

/* One file, read a buffer at a time and encoded in pieces by the pool's threads, appended in order. */
static zoff_status tokenize_one(tok_pool *pool, const char *path, bool quiet, spool *all, int64_t *bytes_in) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zoff_error(zoff_status_of_path_errno(errno), "cannot open input %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zoff_error(ZOFF_ERR_INVALID, "input %s is not a regular file", path);
    }
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    zoff_status s = ZOFF_OK;
    int32_t eot = zoff_tokenizer_eot(pool->tok[0]);
    int64_t off = 0;
    size_t have = 0, got = 0, next_report = REPORT_BYTES, len = (size_t)st.st_size;
    bool eof = false, started = false;
    while (s == ZOFF_OK && (!eof || have > 0)) {
        if (!eof) s = fill(pool, fd, path, &off, &have, &got);
        if (s != ZOFF_OK) break;
        eof = eof || got == 0 || have < pool->cap;
        if (!started && have > 0 && eot >= 0) s = spool_add(all, &eot, 1); /* an empty file is no document */
        started = started || have > 0;
        int np = s == ZOFF_OK ? cut_pieces(pool, have, eof) : 0;
        if (np == 0) continue; /* no place to cut yet: read more */
        encode_pieces(pool, np);
        for (int i = 0; i < np && s == ZOFF_OK; i++)
            s = pool->status[i] == ZOFF_OK ? spool_add(all, pool->out[i].ids, pool->out[i].n)
                                           : zoff_error(pool->status[i], "%s", pool->msg[i]);
        size_t used = pool->cut[np];
        memmove(pool->buf, pool->buf + used, have - used);
        have -= used;
        if (!quiet && (size_t)off - have >= next_report) {
            zoff_log(ZOFF_LOG_INFO, "%s: %zu of %zu MiB, %lld tokens so far", path, ((size_t)off - have) >> 20,
                     len >> 20, (long long)all->n);
            while (next_report <= (size_t)off - have) next_report += REPORT_BYTES;
        }
    }
    close(fd);
    *bytes_in += off;
    if (s != ZOFF_OK) return zoff_error_context(s, "tokenizing %s", path);
    return ZOFF_OK;
}

void zoff_tokenize_result_free(zoff_tokenize_result *res) {
    if (!res) return;
    for (int i = 0; i < res->num_paths; i++) free(res->paths[i]);
    free(res->paths);
    res->paths = NULL;
    res->num_paths = 0;
}

typedef struct plan_file {
    char *final_path;
    char *tmp_path;
    int64_t begin, count;
    bool written;
} plan_file;

static zoff_status plan_split(const zoff_tokenize_options *opt, const char *split, int64_t begin, int64_t count,
                              plan_file **files, int *nfiles, int *cap) {
    int64_t per = opt->shard_tokens > 0 ? opt->shard_tokens : count;
    if (per > ZOFF_SHARD_MAX_TOKENS)
        return zoff_error(ZOFF_ERR_INVALID,
                          "the %s split has %lld tokens, more than one shard holds (%lld); use --shard-size "
                          "(e.g. --shard-size 100000000)",
                          split, (long long)count, (long long)ZOFF_SHARD_MAX_TOKENS);
    int64_t nshards = per > 0 ? (count + per - 1) / per : 1;
    if (nshards < 1) nshards = 1;
    for (int64_t i = 0; i < nshards; i++) {
        if (*nfiles == *cap) {
            *cap = *cap ? *cap * 2 : 8;
            plan_file *q = realloc(*files, (size_t)*cap * sizeof *q);
            if (!q) return zoff_error(ZOFF_ERR_NOMEM, "out of memory planning output files");
            *files = q;
        }
        plan_file *f = &(*files)[(*nfiles)++];
        memset(f, 0, sizeof *f);
        size_t l = strlen(opt->output_prefix) + 64;
        f->final_path = malloc(l);
        f->tmp_path = malloc(l + 32);
        if (!f->final_path || !f->tmp_path) return zoff_error(ZOFF_ERR_NOMEM, "out of memory planning output files");
        shard_paths(opt, split, i, f->final_path, l, f->tmp_path, l + 32);
        f->begin = begin + i * per;
        f->count = (i == nshards - 1) ? count - i * per : per;
    }
    return ZOFF_OK;
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* Whether file name `name` is one of the shard names of prefix base `base` (any --shard-size, either
 * split): BASE_train.bin, BASE_val.bin, BASE_train_NNNNNN.bin or BASE_val_NNNNNN.bin; *split: its split. */
static bool is_prefix_shard(const char *name, const char *base, const char **split) {
    size_t b = strlen(base);
    if (strncmp(name, base, b) != 0 || name[b] != '_') return false;
    const char *r = name + b + 1;
    *split = !strncmp(r, "train", 5) ? "train" : !strncmp(r, "val", 3) ? "val" : NULL;
    if (!*split) return false;
    r += strlen(*split);
    if (r[0] == '_') {
        for (int k = 1; k <= 6; k++)
            if (r[k] < '0' || r[k] > '9') return false;
        r += 7;
    }
    return !strcmp(r, ".bin");
}

/* The files in the prefix's folder named as its shards (is_prefix_shard), sorted, as paths the way
 * the prefix is written (no "./" for a prefix without a folder); *n may be 0. */
static zoff_status prefix_shards(const char *prefix, char ***paths, size_t *n) {
    const char *slash = strrchr(prefix, '/');
    char dir[4200];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash == prefix ? 1 : slash - prefix) : 1, slash ? prefix : ".");
    char **all = NULL;
    size_t na = 0, cap = 0;
    *paths = NULL;
    *n = 0;
    ZOFF_TRY(zoff_dir_files(dir, NULL, &all, &na));
    const char *base = slash ? slash + 1 : prefix, *split;
    for (size_t i = 0; i < na; i++) {
        const char *name = base_name(all[i]); /* zoff_dir_files gives "dir/name" */
        if (!is_prefix_shard(name, base, &split)) continue;
        if (!zoff_paths_add(paths, n, &cap, slash ? all[i] : name)) {
            zoff_free_paths(all, na);
            zoff_free_paths(*paths, *n);
            *paths = NULL;
            *n = 0;
            return zoff_error(ZOFF_ERR_NOMEM, "out of memory listing %s", dir);
        }
    }
    zoff_free_paths(all, na);
    return ZOFF_OK;
}

/* Shards of this prefix an earlier run with another --shard-size or --val-fraction left beside
 * ours would be picked up by a glob or a directory: say so, naming them (never delete them). */
static void warn_stale(const zoff_tokenize_options *opt, char *const *written, int nwritten) {
    char **have = NULL;
    size_t nh = 0;
    if (prefix_shards(opt->output_prefix, &have, &nh) != ZOFF_OK) {
        zoff_clear_error();
        return;
    }
    const char *base = base_name(opt->output_prefix);
    for (int v = 0; v < 2; v++) {
        const char *want = v ? "val" : "train", *split, *stale[3];
        size_t count = 0;
        for (size_t i = 0; i < nh; i++) {
            bool ours = false; /* the same folder: compared by name */
            const char *name = base_name(have[i]);
            for (int k = 0; k < nwritten && !ours; k++) ours = !strcmp(base_name(written[k]), name);
            if (ours || !is_prefix_shard(name, base, &split) || strcmp(split, want)) continue;
            if (count < 3) stale[count] = have[i];
            count++;
        }
        if (count == 1)
            zoff_log(ZOFF_LOG_WARN, "%s is left from an earlier run and is not part of this one; remove it before "
                                    "reading these shards with a glob or a directory", stale[0]);
        else if (count == 2 || count == 3)
            zoff_log(ZOFF_LOG_WARN, "%s%s%s and %s are left from an earlier run and are not part of this one; remove "
                                    "them before reading these shards with a glob or a directory",
                     stale[0], count == 3 ? ", " : "", count == 3 ? stale[1] : "", stale[count - 1]);
        else if (count > 3)
            zoff_log(ZOFF_LOG_WARN, "%s and %zu more shards of this prefix (%s_%s*.bin) are left from an earlier run "
                                    "and are not part of this one; remove them before reading these shards with a "
                                    "glob or a directory", stale[0], count - 1, opt->output_prefix, want);
    }
    zoff_free_paths(have, nh);
}

/* A shard name this run may write is not a folder (a rename over it would fail at the end). */
static zoff_status check_not_folder(const char *path) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID, "%s, where a shard goes, is a folder: remove it or give another "
                          "--output-prefix", path);
    return ZOFF_OK;
}

/* The output prefix, checked before any reading: a folder and a name (shards are PREFIX_train.bin,
 * ...), the folder there and writable, the first shard of each split not a folder. */
static zoff_status check_outputs(const zoff_tokenize_options *opt) {
    const char *p = opt->output_prefix;
    size_t n = strlen(p);
    struct stat st;
    if (p[n - 1] == '/')
        return zoff_error(ZOFF_ERR_INVALID,
                          "--output-prefix %s ends in '/': the shards are named PREFIX_train.bin, PREFIX_val.bin; "
                          "give a folder and a name, e.g. --output-prefix %sdata", p, p);
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID,
                          "--output-prefix %s is a folder: the shards would be %s_train.bin beside it, not in it; "
                          "give a folder and a name, e.g. --output-prefix %s/data", p, p, p);
    ZOFF_TRY(zoff_check_output_parent(p));
    char first[4200];
    for (int v = 0; v < (opt->val_fraction > 0 ? 2 : 1); v++) {
        snprintf(first, sizeof first, opt->shard_tokens > 0 ? "%s_%s_000000.bin" : "%s_%s.bin", p,
                 v ? "val" : "train");
        ZOFF_TRY(check_not_folder(first));
    }
    return ZOFF_OK;
}

/* Whether the file starts as a token shard (magic and version): not text to tokenize. */
static bool is_token_shard(const char *path) {
    int32_t h[2] = {0, 0};
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool shard = read(fd, h, sizeof h) == (ssize_t)sizeof h && h[0] == ZOFF_SHARD_MAGIC && h[1] == ZOFF_SHARD_VERSION;
    close(fd);
    return shard;
}

/* The inputs, checked before any reading against what this run writes: none is a file named as a
 * shard of the output prefix (a run replaces them), none is a token shard. */
static zoff_status check_inputs(const zoff_tokenize_options *opt, const char *const *files, int nfiles) {
    char **outs = NULL;
    size_t nout = 0;
    ZOFF_TRY(prefix_shards(opt->output_prefix, &outs, &nout));
    zoff_status s = ZOFF_OK;
    for (int i = 0; i < nfiles && s == ZOFF_OK; i++) {
        struct stat si, so;
        if (stat(files[i], &si) != 0) continue; /* checked before */
        for (size_t k = 0; k < nout && s == ZOFF_OK; k++)
            if (stat(outs[k], &so) == 0 && so.st_dev == si.st_dev && so.st_ino == si.st_ino)
                s = zoff_error(ZOFF_ERR_INVALID, "input %s is %s, one of the shards --output-prefix %s names (a run "
                               "replaces them): give another --output-prefix", files[i], outs[k], opt->output_prefix);
        if (s == ZOFF_OK && is_token_shard(files[i]))
            s = zoff_error(ZOFF_ERR_INVALID, "input %s is a token shard (llm.c .bin format), not text: give the text "
                           "files it was made from (directories and globs skip .bin files)", files[i]);
    }
    zoff_free_paths(outs, nout);
    return s;
}

/* Copies tokens [begin, begin + count) of the spool into the open file fd (named path). */
static zoff_status copy_tokens(const spool *sp, int64_t begin, int64_t count, int fd, const char *path) {
    char final[4200], src[4300];
    zoff_status s = ZOFF_OK;
    uint16_t *buf = malloc(SPOOL_TOKENS * sizeof *buf);
    if (!buf) return zoff_error(ZOFF_ERR_NOMEM, "out of memory copying tokens into %s", path);
    for (int64_t pos = begin; pos < begin + count && s == ZOFF_OK;) {
        int64_t k = pos / sp->per, at = pos - k * sp->per, left = begin + count - pos;
        int64_t m = left < (int64_t)SPOOL_TOKENS ? left : (int64_t)SPOOL_TOKENS;
        if (m > sp->per - at) m = sp->per - at;
        shard_paths(sp->opt, "train", k, final, sizeof final, src, sizeof src);
        int in = open(src, O_RDONLY | O_CLOEXEC);
        ssize_t r = in < 0 ? -1 : pread(in, buf, (size_t)m * sizeof *buf, ZOFF_SHARD_HEADER_BYTES + at * 2);
        if (r != (ssize_t)((size_t)m * sizeof *buf))
            s = zoff_error(ZOFF_ERR_IO, "reading back %s: %s", src, r < 0 ? strerror(errno) : "the file is short");
        if (in >= 0) close(in);
        if (s == ZOFF_OK) s = zoff_shard_write_bytes(fd, buf, (size_t)m * sizeof *buf, path);
        pos += m;
    }
    free(buf);
    return s;
}

/* The spool, closed, into the planned shards' temporary files: the val shards copied out of it,
 * then the last train shard cut to its size (the spool files past it are removed by the caller). */
static zoff_status finish_split(spool *sp, plan_file *plan, int nplan, int ntrain) {
    zoff_status s = ZOFF_OK;
    for (int i = ntrain; i < nplan && s == ZOFF_OK; i++) {
        zoff_temp_register(plan[i].tmp_path); /* before it exists: a Ctrl-C removes it */
        int fd = open(plan[i].tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
            zoff_temp_forget(plan[i].tmp_path);
            return zoff_error(zoff_status_of_path_errno(errno), "cannot create %s: %s", plan[i].tmp_path,
                              strerror(errno));
        }
        plan[i].written = true;
        int32_t h[ZOFF_SHARD_HEADER_INTS];
        zoff_shard_header(h, plan[i].count, sp->vocab);
        s = zoff_shard_write_bytes(fd, h, sizeof h, plan[i].tmp_path);
        if (s == ZOFF_OK) s = copy_tokens(sp, plan[i].begin, plan[i].count, fd, plan[i].tmp_path);
        if (s == ZOFF_OK && fsync(fd) != 0) s = zoff_error(ZOFF_ERR_IO, "fsync %s: %s", plan[i].tmp_path, strerror(errno));
        if (close(fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "closing %s: %s", plan[i].tmp_path, strerror(errno));
    }
    if (s != ZOFF_OK) return s;
    const plan_file *last = &plan[ntrain - 1]; /* the spool file it is holds val tokens too, or is exact */
    int fd = open(last->tmp_path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", last->tmp_path, strerror(errno));
    if (ftruncate(fd, ZOFF_SHARD_HEADER_BYTES + last->count * 2) != 0)
        s = zoff_error(ZOFF_ERR_IO, "cutting %s to its tokens: %s", last->tmp_path, strerror(errno));
    if (s == ZOFF_OK) s = put_header(fd, last->tmp_path, last->count, sp->vocab);
    if (s == ZOFF_OK && fsync(fd) != 0) s = zoff_error(ZOFF_ERR_IO, "fsync %s: %s", last->tmp_path, strerror(errno));
    if (close(fd) != 0 && s == ZOFF_OK) s = zoff_error(ZOFF_ERR_IO, "closing %s: %s", last->tmp_path, strerror(errno));
    return s;
}

zoff_status zoff_tokenize_files(zoff_tokenizer *t, const char *const *files, int nfiles,
                                const zoff_tokenize_options *opt, zoff_tokenize_result *res) {
    memset(res, 0, sizeof *res);
    if (!opt->output_prefix || !*opt->output_prefix)
        return zoff_error(ZOFF_ERR_INVALID, "no output prefix; give e.g. --output-prefix out/data/corpus");
    if (nfiles < 1) return zoff_error(ZOFF_ERR_INVALID, "no input files to tokenize");
    if (!(opt->val_fraction >= 0.0 && opt->val_fraction < 1.0))
        return zoff_error(ZOFF_ERR_INVALID, "validation fraction %g must be in [0, 1)", opt->val_fraction);
    if (opt->shard_tokens < 0)
        return zoff_error(ZOFF_ERR_INVALID, "shard size %lld tokens must be >= 0", (long long)opt->shard_tokens);
    if (zoff_tokenizer_vocab_size(t) > 65536)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "tokenizer vocabulary %d does not fit uint16 shards",
                          (int)zoff_tokenizer_vocab_size(t));

    /* check everything that can be checked before spending time */
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0)
            return zoff_error(zoff_status_of_path_errno(errno), "input %s: %s", files[i], strerror(errno));
        if (!S_ISREG(st.st_mode)) return zoff_error(ZOFF_ERR_INVALID, "input %s is not a regular file", files[i]);
        if (access(files[i], R_OK) != 0) return zoff_error(zoff_status_of_path_errno(errno), "input %s: %s", files[i], strerror(errno));
    }
    ZOFF_TRY(check_outputs(opt));
    ZOFF_TRY(check_inputs(opt, files, nfiles));

    double t0 = zoff_now();
    spool all = {.opt = opt, .vocab = zoff_tokenizer_vocab_size(t), .fd = -1,
                 .per = opt->shard_tokens > 0 ? opt->shard_tokens : INT64_MAX};
    tok_pool pool;
    if (!(all.buf = malloc(SPOOL_TOKENS * sizeof *all.buf)))
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory for a %zu-token write buffer", SPOOL_TOKENS);
    zoff_status s = pool_init(&pool, t, opt);
    for (int i = 0; i < nfiles && s == ZOFF_OK; i++) s = tokenize_one(&pool, files[i], opt->quiet, &all, &res->bytes_in);
    pool_free(&pool);
    if (s == ZOFF_OK) s = spool_close(&all);
    free(all.buf);

    int64_t n = all.n, nval = 0;
    if (s == ZOFF_OK && n == 0) s = zoff_error(ZOFF_ERR_INVALID, "the input files hold no text; nothing to write");
    if (s == ZOFF_OK && opt->val_fraction > 0) {
        nval = (int64_t)((double)n * opt->val_fraction);
        if (nval < 1 || nval >= n)
            s = zoff_error(ZOFF_ERR_INVALID,
                           "a validation fraction of %g of %lld tokens leaves %lld validation and %lld training "
                           "tokens; give more text or --val-fraction 0",
                           opt->val_fraction, (long long)n, (long long)nval, (long long)(n - nval));
    }

    plan_file *plan = NULL;
    int nplan = 0, cap = 0, ntrain = 0;
    if (s == ZOFF_OK) s = plan_split(opt, "train", 0, n - nval, &plan, &nplan, &cap);
    ntrain = nplan;
    if (s == ZOFF_OK && nval > 0) s = plan_split(opt, "val", n - nval, nval, &plan, &nplan, &cap);
    for (int i = 0; i < nplan && s == ZOFF_OK; i++) s = check_not_folder(plan[i].final_path); /* later shards */
    if (s == ZOFF_OK) s = finish_split(&all, plan, nplan, ntrain);
    spool_remove(&all, s == ZOFF_OK ? ntrain : 0); /* past the train split, or all after a failure */
    for (int i = 0; i < ntrain && s == ZOFF_OK; i++) plan[i].written = true;
    /* all complete: move into place */
    for (int i = 0; i < nplan && s == ZOFF_OK; i++) {
        if (rename(plan[i].tmp_path, plan[i].final_path) != 0) {
            s = zoff_error(ZOFF_ERR_IO, "renaming %s to %s: %s%s", plan[i].tmp_path, plan[i].final_path,
                           strerror(errno), i > 0 ? " (earlier output files were already replaced)" : "");
            break;
        }
        plan[i].written = false;
    }
    if (s == ZOFF_OK) (void)zoff_fsync_dir_of(opt->output_prefix);
    if (s == ZOFF_OK) {
        res->paths = calloc((size_t)nplan, sizeof *res->paths);
        if (!res->paths) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < nplan; i++) {
        if (plan[i].written) unlink(plan[i].tmp_path);
        zoff_temp_forget(plan[i].tmp_path);
        if (s == ZOFF_OK) {
            res->paths[i] = plan[i].final_path;
            plan[i].final_path = NULL;
        }
        free(plan[i].final_path);
        free(plan[i].tmp_path);
    }
    free(plan);
    if (s != ZOFF_OK) {
        int64_t b = res->bytes_in;
        zoff_tokenize_result_free(res);
        memset(res, 0, sizeof *res);
        res->bytes_in = b;
        return s;
    }
    res->num_paths = nplan;
    res->num_train_files = ntrain;
    warn_stale(opt, res->paths, nplan);
    res->tokens_train = n - nval;
    res->tokens_val = nval;
    res->seconds = zoff_now() - t0;
    return ZOFF_OK;
}
