/* Shared pieces of the zoff subcommands. */
#define _GNU_SOURCE
#include "cli/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool cli_parse_i64(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out) {
    char *end = NULL;
    errno = 0;
    double d = strtod(text, &end); /* accept 1e6 as well as 1000000 */
    long long v = strtoll(text, NULL, 10);
    if (end == text || *end || errno || d != (double)(int64_t)d) {
        fprintf(stderr, "zoff %s: %s: '%s' is not an integer\n", cmd, flag, text);
        return false;
    }
    if (d != (double)v) v = (long long)d;
    if (v < min || v > max) {
        fprintf(stderr, "zoff %s: %s: %lld is out of range [%lld, %lld]\n", cmd, flag, v, (long long)min,
                (long long)max);
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_f64(const char *cmd, const char *flag, const char *text, double min, double max, double *out) {
    char *end = NULL;
    errno = 0;
    double d = strtod(text, &end);
    if (end == text || *end || errno) {
        fprintf(stderr, "zoff %s: %s: '%s' is not a number\n", cmd, flag, text);
        return false;
    }
    if (!(d >= min && d <= max)) {
        fprintf(stderr, "zoff %s: %s: %g is out of range [%g, %g]\n", cmd, flag, d, min, max);
        return false;
    }
    *out = d;
    return true;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i) {
    const char *arg = argv[*i];
    const char *eq = strchr(arg, '=');
    if (eq && arg[0] == '-' && arg[1] == '-') return eq + 1; /* --flag=value */
    if (*i + 1 >= argc) {
        fprintf(stderr, "zoff %s: %s needs a value\n", cmd, arg);
        return NULL;
    }
    return argv[++*i];
}

int cli_string_flags(const char *cmd, const char *name, const cli_string_flag *flags, size_t n, int argc, char **argv,
                     int *i) {
    for (size_t k = 0; k < n; k++) {
        if (strcmp(name, flags[k].name)) continue;
        const char *v = cli_value(cmd, argc, argv, i);
        if (!v) return -1;
        *flags[k].value = v;
        return 1;
    }
    return 0;
}

int cli_int_flags(const char *cmd, const char *name, const cli_int_flag *flags, size_t n, int argc, char **argv, int *i) {
    for (size_t k = 0; k < n; k++) {
        if (strcmp(name, flags[k].name)) continue;
        const char *v = cli_value(cmd, argc, argv, i);
        if (!v || !cli_parse_i64(cmd, name, v, flags[k].min, flags[k].max, flags[k].value)) return -1;
        return 1;
    }
    return 0;
}

int cli_shape_flags(const char *cmd, const char *name, const cli_shape_fields *f, int argc, char **argv, int *i) {
    const cli_int_flag flags[] = {
        {"--num-layers", 1, ZOFF_GPT2_MAX_LAYERS, f->num_layers},
        {"--hidden-size", 1, ZOFF_GPT2_MAX_HIDDEN, f->hidden_size},
        {"--num-attention-heads", 1, ZOFF_GPT2_MAX_HIDDEN, f->num_heads},
        {"--seq-length", 1, ZOFF_GPT2_MAX_SEQ, f->seq_length},
        {"--max-position-embeddings", 1, ZOFF_GPT2_MAX_SEQ, f->max_pos},
        {"--vocab-size", 2, ZOFF_GPT2_MAX_TRAIN_VOCAB, f->vocab_size},
        {"--micro-batch-size", 1, ZOFF_GPT2_MAX_BATCH, f->micro_batch},
    };
    return cli_int_flags(cmd, name, flags, sizeof flags / sizeof flags[0], argc, argv, i);
}

