/* zoff tokenize: text files -> token shards (llm.c .bin format). */
#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/file_internal.h"
#include "zoff/data.h"

static void tokenize_usage(FILE *f) {
    fprintf(f,
            "usage: zoff tokenize [options] --output-prefix DIR/name INPUT...\n"
            "\n"
            "Tokenize text files into token shards (llm.c's .bin format: 256 int32 header,\n"
            "then uint16 tokens). An INPUT is a file, a directory (its files in name order,\n"
            "not its subdirectories; hidden files and .bin shards skipped) or a quoted glob\n"
            "such as 'texts/*.txt' (.bin shards skipped). A token shard given by name, or an\n"
            "input that is one of the files written, is refused. Each file is one document (an\n"
            "empty file none); with gpt2 each document starts with <|endoftext|>. The last\n"
            "--val-fraction of all tokens becomes the validation split. Files are written\n"
            "completely or not at all; inputs with no text at all write nothing. Memory does not\n"
            "grow with the corpus: the text is read and the tokens written a few MiB at a time.\n"
            "\n"
            "options:\n"
            "  --tokenizer gpt2|byte   GPT-2 BPE (50257 tokens, default) or bytes (256 tokens)\n"
            "  --output-prefix P       write P_train.bin and P_val.bin: P is a folder that exists and a\n"
            "                          name, e.g. out/data/corpus (not a folder alone)\n"
            "  --val-fraction F        fraction of tokens for validation, 0 <= F < 1 (default 0.05;\n"
            "                          0 writes no val file)\n"
            "  --shard-size N          at most N tokens per file: P_train_000000.bin, ... (default:\n"
            "                          one file per split)\n"
            "  --threads N             encode with N threads (default: OMP_NUM_THREADS, else all cores); the\n"
            "                          shards are the same for any N\n"
            "  -q, --quiet             no progress lines and no summary (errors and warnings still print)\n"
            "  -h, --help              this help\n"
            "\n"
            "The GPT-2 tables are searched in $ZOFF_DATA_DIR/gpt2, PREFIX/share/zoff/gpt2 of an\n"
            "installed zoff (cmake --install --prefix PREFIX), the source tree's data/gpt2 and\n"
            "/usr/local/share/zoff/gpt2.\n"
            "\n"
            "example:\n"
            "  scripts/prepare_corpus.sh out/corpus\n"
            "  zoff tokenize --tokenizer gpt2 --output-prefix out/corpus/corpus out/corpus/corpus.txt\n");
}

/* Accepts "--name value" and "--name=value". Returns the value or NULL (and sets *bad). */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *bad) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != '\0') return NULL;
    if (*i + 1 >= argc) {
        fprintf(stderr, "zoff tokenize: %s needs a value (see zoff tokenize --help)\n", name);
        *bad = 1;
        return NULL;
    }
    return argv[++*i];
}

static bool is_text_name(const char *name) { return !zoff_ends_with(name, ".bin"); }

/* The files the inputs name (a file, a directory's files, a glob's matches), each checked
 * readable: 0, or 1 with the error printed. */
static int expand_inputs(const char **inputs, int ninputs, char ***files, size_t *nfiles) {
    size_t cap = 0;
    *files = NULL;
    *nfiles = 0;
    for (int i = 0; i < ninputs; i++) {
        const char *in = inputs[i];
        struct stat st;
        const char *why = NULL;
        bool oom = false;
        int stat_err = stat(in, &st) == 0 ? 0 : errno;
        if (!stat_err && S_ISDIR(st.st_mode)) {
            char **dir = NULL;
            size_t n = 0;
            if (zoff_dir_files(in, is_text_name, &dir, &n) != ZOFF_OK) {
                fprintf(stderr, "zoff tokenize: %s (nothing was written)\n", zoff_last_error());
                zoff_free_paths(*files, *nfiles);
                return 1;
            }
            if (n == 0)
                why = "the directory holds no files to read (hidden files, .bin shards and subdirectories are not "
                      "read)";
            for (size_t k = 0; k < n && !oom; k++) oom = !zoff_paths_add(files, nfiles, &cap, dir[k]);
            zoff_free_paths(dir, n);
        } else if (stat_err == ENOENT && strpbrk(in, "*?[")) {
            glob_t g;
            int rc = glob(in, GLOB_TILDE, NULL, &g); /* a quoted "~/corpus/x*.txt" as the shell would */
            size_t taken = 0;
            if (rc == GLOB_NOMATCH) why = "no files match this pattern";
            else if (rc != 0) why = "cannot expand this pattern";
            for (size_t k = 0; rc == 0 && k < g.gl_pathc && !oom; k++) {
                const char *slash = strrchr(g.gl_pathv[k], '/');
                if (!is_text_name(slash ? slash + 1 : g.gl_pathv[k])) continue; /* shards, as a directory's */
                oom = !zoff_paths_add(files, nfiles, &cap, g.gl_pathv[k]);
                taken++;
            }
            if (rc == 0 && taken == 0) why = "the pattern matches only .bin token shards, which are not read as text";
            globfree(&g);
        } else {
            oom = !zoff_paths_add(files, nfiles, &cap, in);
        }
        if (oom) why = "out of memory listing the inputs";
        if (why) {
            fprintf(stderr, "zoff tokenize: input %s: %s (nothing was written)\n", in, why);
            zoff_free_paths(*files, *nfiles);
            return 1;
        }
    }
    for (size_t i = 0; i < *nfiles; i++) {
        struct stat st;
        const char *why = NULL, *f = (*files)[i];
        if (stat(f, &st) != 0) why = strerror(errno);
        else if (!S_ISREG(st.st_mode)) why = "not a regular file";
        else if (access(f, R_OK) != 0) why = strerror(errno);
        if (why) {
            fprintf(stderr, "zoff tokenize: input %s: %s (nothing was written)\n", f, why);
            zoff_free_paths(*files, *nfiles);
            return 1;
        }
    }
    return 0;
}

int zoff_cmd_tokenize(int argc, char **argv) {
    const char *tokenizer = "gpt2", *prefix = NULL;
    double val_fraction = 0.05;
    int64_t shard_tokens = 0;
    int threads = 0;
    bool quiet = false;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int ninputs = 0, bad = 0;
    if (!inputs) {
        fprintf(stderr, "zoff tokenize: out of memory\n");
        return 1;
    }
    for (int i = 1; i < argc && !bad; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            free(inputs);
            return 0;
        } else if (cli_quiet_flag(a, &quiet)) {
        } else if ((v = opt_value(argc, argv, &i, "--tokenizer", &bad))) {
            tokenizer = v;
        } else if ((v = opt_value(argc, argv, &i, "--output-prefix", &bad))) {
            prefix = v;
        } else if ((v = opt_value(argc, argv, &i, "--val-fraction", &bad))) {
            char *end;
            errno = 0;
            val_fraction = strtod(v, &end);
            if (errno || end == v || *end || !(val_fraction >= 0 && val_fraction < 1)) {
                fprintf(stderr, "zoff tokenize: --val-fraction '%s' must be a number in [0, 1)\n", v);
                bad = 1;
            }
        } else if ((v = opt_value(argc, argv, &i, "--shard-size", &bad))) {
            char *end;
            errno = 0;
            double d = strtod(v, &end);
            if (errno || end == v || *end || !(d >= 1) || d > (double)ZOFF_SHARD_MAX_TOKENS || d != (double)(int64_t)d) {
                fprintf(stderr, "zoff tokenize: --shard-size '%s' must be a whole number of tokens in [1, %lld]\n", v,
                        (long long)ZOFF_SHARD_MAX_TOKENS);
                bad = 1;
            }
            shard_tokens = (int64_t)d;
        } else if ((v = opt_value(argc, argv, &i, "--threads", &bad))) {
            char *end;
            errno = 0;
            long n = strtol(v, &end, 10);
            if (errno || end == v || *end || n < 1 || n > 1024) {
                fprintf(stderr, "zoff tokenize: --threads '%s' must be a whole number in [1, 1024]\n", v);
                bad = 1;
            }
            threads = (int)n;
        } else if (bad) {
            break;
        } else if (a[0] == '-' && a[1] != '\0') {
            cli_unknown_option("tokenize", a, tokenize_usage);
            bad = 1;
        } else {
            inputs[ninputs++] = a;
        }
    }
    if (!bad && !prefix) {
        fprintf(stderr, "zoff tokenize: --output-prefix is required (e.g. --output-prefix out/data/corpus)\n");
        bad = 1;
    }
    if (!bad && ninputs == 0) {
        fprintf(stderr, "zoff tokenize: no input files (see zoff tokenize --help)\n");
        bad = 1;
    }
    if (!bad && strcmp(tokenizer, "gpt2") != 0 && strcmp(tokenizer, "byte") != 0) {
        fprintf(stderr, "zoff tokenize: unknown tokenizer '%s'; expected gpt2 or byte\n", tokenizer);
        bad = 1;
    }
    char **files = NULL;
    size_t nfiles = 0;
    if (!bad) bad = expand_inputs(inputs, ninputs, &files, &nfiles);
    free(inputs);
    if (bad) return 2;

    zoff_tokenizer *tok = NULL;
    zoff_status s = zoff_tokenizer_open(tokenizer, &tok);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff tokenize: %s\n", zoff_last_error());
        zoff_free_paths(files, nfiles);
        return 1;
    }
    zoff_tokenize_options o = {.output_prefix = prefix, .val_fraction = val_fraction, .shard_tokens = shard_tokens,
                               .quiet = quiet, .threads = threads};
    zoff_tokenize_result r;
    s = zoff_tokenize_files(tok, (const char **)files, (int)nfiles, &o, &r);
    zoff_free_paths(files, nfiles);
    zoff_tokenizer_free(tok);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff tokenize: %s (nothing was written)\n", zoff_last_error());
        return cli_exit_code(s);
    }
    if (quiet) {
        zoff_tokenize_result_free(&r);
        return 0;
    }
    int64_t total = r.tokens_train + r.tokens_val;
    printf("tokenizer %s: %d file(s), %lld bytes -> %lld tokens (%.2f bytes/token) in %.2f s (%.1f MB/s)\n", tokenizer,
           (int)nfiles, (long long)r.bytes_in, (long long)total, total ? (double)r.bytes_in / (double)total : 0.0,
           r.seconds, r.seconds > 0 ? (double)r.bytes_in / r.seconds / 1e6 : 0.0);
    printf("train: %lld tokens, val: %lld tokens\n", (long long)r.tokens_train, (long long)r.tokens_val);
    for (int i = 0; i < r.num_paths; i++) {
        zoff_shard *sh = NULL;
        if (zoff_shard_open(r.paths[i], 0, &sh) == ZOFF_OK) {
            printf("  %s  %lld tokens\n", r.paths[i], (long long)zoff_shard_num_tokens(sh));
            zoff_shard_close(sh);
        } else {
            printf("  %s\n", r.paths[i]);
        }
    }
    zoff_tokenize_result_free(&r);
    return 0;
}
