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

#define CHUNK_BYTES ((size_t)1 << 20)

typedef struct u16vec {
    uint16_t *p;
    int64_t n, cap;
} u16vec;

static zoff_status u16_append(u16vec *v, const int32_t *ids, size_t m) {
    if (v->n + (int64_t)m > v->cap) {
        int64_t nc = v->cap ? v->cap : ((int64_t)1 << 20);
        while (nc < v->n + (int64_t)m) nc *= 2;
        uint16_t *q = realloc(v->p, (size_t)nc * sizeof *q);
        if (!q)
            return zoff_error(ZOFF_ERR_NOMEM, "out of memory holding %lld tokens (%lld MiB); tokenize fewer files at a time",
                              (long long)nc, (long long)(nc * 2 >> 20));
        v->p = q;
        v->cap = nc;
    }
    for (size_t i = 0; i < m; i++) v->p[v->n + (int64_t)i] = (uint16_t)ids[i];
    v->n += (int64_t)m;
    return ZOFF_OK;
}

static bool is_ascii_space(uint8_t c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/* End of the next chunk of text[pos..len): at least CHUNK_BYTES when possible, and
 * at a place where GPT-2's pre-tokeniser must start a new piece whether or not the
 * text goes on, so encoding chunk by chunk equals encoding the whole: a lone '\n'
 * between ASCII non-spaces ("x\ny"). The '\n' is then a piece of its own either way
 * (regex alternative 6 mid-text, 5 at a chunk's end). After a longer whitespace run
 * the split would differ ("\n\n" at the end of a chunk vs "\n" "\n" mid-text). */
static size_t chunk_end(const char *text, size_t pos, size_t len) {
    if (len - pos <= CHUNK_BYTES) return len;
    for (size_t p = pos + CHUNK_BYTES; p < len; p++) {
        uint8_t c = (uint8_t)text[p], b = (uint8_t)text[p - 2];
        if (text[p - 1] == '\n' && c < 0x80 && !is_ascii_space(c) && b < 0x80 && !is_ascii_space(b)) return p;
    }
    return len;
}

static zoff_status tokenize_one(zoff_tokenizer *t, const char *path, bool quiet, zoff_tokens *scratch, u16vec *all,
                                int64_t *bytes_in) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return zoff_error(zoff_status_of_path_errno(errno), "cannot open input %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return zoff_error(ZOFF_ERR_INVALID, "input %s is not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    const char *text = NULL;
    if (len > 0) {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return zoff_error(ZOFF_ERR_IO, "cannot read %s (%zu bytes): %s", path, len, strerror(e));
        }
        (void)madvise(m, len, MADV_SEQUENTIAL);
        text = m;
    }
    close(fd);
    zoff_status s = ZOFF_OK;
    int32_t eot = zoff_tokenizer_eot(t);
    if (eot >= 0 && len > 0) s = u16_append(all, &eot, 1); /* an empty file is no document */
    size_t next_report = (size_t)64 << 20;
    for (size_t pos = 0; pos < len && s == ZOFF_OK;) {
        size_t end = chunk_end(text, pos, len);
        scratch->n = 0;
        s = zoff_tokenizer_encode(t, text + pos, end - pos, scratch);
        if (s == ZOFF_OK) s = u16_append(all, scratch->ids, scratch->n);
        pos = end;
        if (!quiet && pos >= next_report) {
            zoff_log(ZOFF_LOG_INFO, "%s: %zu of %zu MiB, %lld tokens so far", path, pos >> 20, len >> 20,
                     (long long)all->n);
            next_report += (size_t)64 << 20;
        }
    }
    if (text) munmap((void *)text, len);
    *bytes_in += (int64_t)len;
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
        if (opt->shard_tokens > 0)
            snprintf(f->final_path, l, "%s_%s_%06lld.bin", opt->output_prefix, split, (long long)i);
        else
            snprintf(f->final_path, l, "%s_%s.bin", opt->output_prefix, split);
        snprintf(f->tmp_path, l + 32, "%s.incomplete-%ld", f->final_path, (long)getpid());
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
    u16vec all = {0};
    zoff_tokens scratch = {0};
    zoff_status s = ZOFF_OK;
    for (int i = 0; i < nfiles && s == ZOFF_OK; i++)
        s = tokenize_one(t, files[i], opt->quiet, &scratch, &all, &res->bytes_in);
    zoff_tokens_free(&scratch);

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
    int32_t vocab = zoff_tokenizer_vocab_size(t);
    for (int i = 0; i < nplan && s == ZOFF_OK; i++) {
        zoff_temp_register(plan[i].tmp_path); /* before it exists: a Ctrl-C removes it (zoff_temp_forget below) */
        s = zoff_shard_write(plan[i].tmp_path, all.p + plan[i].begin, plan[i].count, vocab);
        if (s == ZOFF_OK) plan[i].written = true;
    }
    free(all.p);
    /* all complete: move into place */
    for (int i = 0; i < nplan && s == ZOFF_OK; i++) {
        if (rename(plan[i].tmp_path, plan[i].final_path) != 0) {
            s = zoff_error(ZOFF_ERR_IO, "renaming %s to %s: %s%s", plan[i].tmp_path, plan[i].final_path,
                           strerror(errno), i > 0 ? " (earlier output files were already replaced)" : "");
            break;
        }
        plan[i].written = false;
    }
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
