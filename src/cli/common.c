/* Shared pieces of the zoff subcommands. */
#define _GNU_SOURCE
#include "cli/common.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

bool cli_parse_dtype(const char *cmd, const char *flag, const char *text, zoff_dtype *dt) {
    static const struct {
        const char *name;
        zoff_dtype dt;
    } names[] = {{"f32", ZOFF_F32}, {"fp32", ZOFF_F32}, {"bf16", ZOFF_BF16}, {"f16", ZOFF_F16}, {"fp16", ZOFF_F16}};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (!strcmp(text, names[k].name)) {
            *dt = names[k].dt;
            return true;
        }
    fprintf(stderr, "zoff %s: %s: '%s' is not one of f32, bf16, f16 (fp32 and fp16 also read)\n", cmd, flag, text);
    return false;
}

const char *cli_bench_dtype_name(zoff_dtype dt) { return dt == ZOFF_F16 ? "fp16" : zoff_dtype_name(dt); }

bool cli_check_list(const char *cmd, const char *flag, const char *text, size_t cap) {
    size_t n = strlen(text);
    if (n >= cap) {
        fprintf(stderr, "zoff %s: %s: the list is %zu characters, at most %zu\n", cmd, flag, n, cap - 1);
        return false;
    }
    int item = 1;
    for (const char *p = text;; p++, item++) {
        const char *end = strchr(p, ',');
        if ((end ? end : text + n) == p) {
            fprintf(stderr, "zoff %s: %s: '%s' has an empty item (item %d); give values separated by single commas, "
                            "e.g. 0,0.5,1\n", cmd, flag, text, item);
            return false;
        }
        if (!end) return true;
        p = end;
    }
}

bool cli_path_given(const char *cmd, const char *flag, const char *path, const char *what) {
    if (*path) return true;
    fprintf(stderr, "zoff %s: %s is empty: give %s\n", cmd, flag, what);
    return false;
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

const char *cli_nearest_name(const char *typed, const char *const *names, size_t n, size_t min_prefix) {
    size_t tlen = strlen(typed), prefix_hits = 0, best_d = 3, at_best = 0;
    const char *prefix = NULL, *near = NULL;
    for (size_t k = 0; k < n; k++) {
        if (tlen >= min_prefix && strlen(names[k]) > tlen && !strncmp(names[k], typed, tlen)) {
            prefix_hits++;
            prefix = names[k];
        }
        size_t d = zoff_edit_distance(typed, names[k]);
        if (d < best_d) best_d = d, at_best = 1, near = names[k];
        else if (d == best_d && near != NULL) at_best++;
    }
    return prefix_hits == 1 ? prefix : at_best == 1 ? near : NULL;
}

/* The option of the usage text that `name` most likely meant, into best (empty when none). */
static void nearest_option(const char *name, const char *text, char *best, size_t size) {
    enum { MAX_OPTS = 160, OPT_LEN = 48 };
    char opts[MAX_OPTS][OPT_LEN]; /* the usage text's options, each once */
    size_t nopts = 0;
    for (const char *p = text; (p = strstr(p, "--")) != NULL;) {
        bool word_start = p == text || strchr(" \t\n([,|'\"", p[-1]) != NULL;
        size_t n = 2;
        while (p[n] == '-' || (p[n] >= 'a' && p[n] <= 'z') || (p[n] >= '0' && p[n] <= '9')) n++;
        if (word_start && n > 2 && n < OPT_LEN && nopts < MAX_OPTS) {
            size_t k = 0;
            while (k < nopts && (strlen(opts[k]) != n || strncmp(opts[k], p, n) != 0)) k++;
            if (k == nopts) snprintf(opts[nopts++], OPT_LEN, "%.*s", (int)n, p);
        }
        p += n;
    }
    const char *ptr[MAX_OPTS];
    for (size_t k = 0; k < nopts; k++) ptr[k] = opts[k];
    const char *pick = cli_nearest_name(name, ptr, nopts, 4); /* "--" and 2 letters at least */
    snprintf(best, size, "%s", pick ? pick : "");
}

/* Flags of DeepSpeed launch scripts, Megatron-DeepSpeed and the Hugging Face Trainer that a
 * command taking --config may be given, and those of Hugging Face's generate / evaluate and nanoGPT's
 * sample.py that eval and sample may be given: where each setting is in zoff. An entry applies to
 * a command whose usage text holds its `needs`; names are compared with '_' read as '-'; NULL: none. */
static const char *elsewhere_hint(const char *name, const char *usage) {
#define CFG "--config FILE"
#define EVAL "--max-batches N"
#define SAMPLE "--max-new-tokens N"
    static const struct {
        const char *needs, *names, *hint; /* names: " --a --b " */
    } hints[] = {
        {CFG, " --deepspeed --deepspeed-config --ds-config ", "the DeepSpeed JSON config is --config FILE"},
        {CFG, " --lr --learning-rate ", "the learning rate is optimizer.params.lr in the --config file"},
        {CFG, " --batch-size --per-device-train-batch-size --micro-batch ",
         "the batch per rank is --micro-batch-size, or the config's train_micro_batch_size_per_gpu"},
        {CFG, " --global-batch-size --train-batch-size ", "the global batch is the config's train_batch_size"},
        {CFG, " --gradient-accumulation-steps ", "accumulation is the config's gradient_accumulation_steps"},
        {CFG, " --max-steps --train-steps --steps --iters ", "the number of optimizer steps is --train-iters"},
        {CFG, " --epochs --num-train-epochs ", "zoff counts optimizer steps: --train-iters"},
        {CFG, " --bf16 --fp16 ", "precision is the config's \"bf16\": {\"enabled\": true} or \"fp16\": {...}"},
        {CFG, " --zero-stage --zero ", "the ZeRO stage is the config's zero_optimization.stage"},
        {CFG, " --warmup --warmup-steps --lr-warmup-iters ", "warm-up is the config's scheduler.params.warmup_num_steps"},
        {CFG, " --weight-decay ", "weight decay is the config's optimizer.params.weight_decay"},
        {CFG, " --clip-grad --max-grad-norm ", "clipping is the config's gradient_clipping"},
        {CFG, " --output-dir --save-dir ", "the output folder is --save"},
        {CFG, " --save-steps ", "the checkpoint interval is --save-interval"},
        {CFG, " --offload ", "offload is the config's zero_optimization.offload_optimizer.device (cpu or nvme)"},
        {EVAL, " --eval-iters --eval-steps --max-eval-steps --eval-batches ",
         "eval reads every window; --max-batches N stops after N batches"},
        {EVAL, " --batch-size --eval-batch-size --per-device-eval-batch-size ",
         "the windows per forward are --micro-batch-size"},
        {SAMPLE, " --max-tokens --max-length --max-new-token --num-tokens --length ",
         "the tokens to generate are --max-new-tokens"},
        {SAMPLE, " --num-samples --num-return-sequences ",
         "zoff sample writes one text: run it again with another --seed"},
        {SAMPLE, " --do-sample --greedy ", "--temperature 0 is greedy, above 0 it samples (default 0.8)"},
    };
    char key[72] = " ";
    size_t k = 1;
    for (const char *p = name; *p && k < sizeof key - 2; p++) key[k++] = *p == '_' ? '-' : *p;
    key[k++] = ' ';
    key[k] = '\0';
    for (size_t i = 0; i < sizeof hints / sizeof *hints; i++)
        if (strstr(hints[i].names, key) && strstr(usage, hints[i].needs)) return hints[i].hint;
    return NULL;
#undef CFG
#undef EVAL
#undef SAMPLE
}

void cli_unknown_option(const char *cmd, const char *arg, void (*usage)(FILE *)) {
    char name[64], best[64] = "";
    cli_flag_name(arg, name, sizeof name);
    char *text = NULL;
    size_t len = 0;
    const char *hint = NULL;
    FILE *ms = usage != NULL ? open_memstream(&text, &len) : NULL;
    if (ms != NULL) {
        usage(ms);
        if (fclose(ms) == 0 && text != NULL) {
            nearest_option(name, text, best, sizeof best);
            hint = elsewhere_hint(name, text);
        }
    }
    free(text);
    if (hint)
        fprintf(stderr, "zoff %s: unknown option '%s': %s (zoff %s --help lists the options)\n", cmd, arg, hint, cmd);
    else if (best[0])
        fprintf(stderr, "zoff %s: unknown option '%s' (did you mean %s? zoff %s --help lists them)\n", cmd, arg, best,
                cmd);
    else
        fprintf(stderr, "zoff %s: unknown option '%s' (zoff %s --help lists them)\n", cmd, arg, cmd);
}

void cli_flag_name(const char *arg, char *name, size_t size) {
    if (!strcmp(arg, "-q")) arg = "--quiet"; /* the short forms, each command's: -h is --help, tested as -h */
    const char *eq = strchr(arg, '=');
    size_t n = eq && arg[0] == '-' && arg[1] == '-' ? (size_t)(eq - arg) : strlen(arg);
    snprintf(name, size, "%.*s", (int)(n < size - 1 ? n : size - 1), arg);
}

void cli_quiet_logs(void) {
    if (zoff_log_get_level() < ZOFF_LOG_WARN) zoff_log_set_level(ZOFF_LOG_WARN);
}

bool cli_quiet_flag(const char *arg, bool *quiet) {
    char name[16];
    cli_flag_name(arg, name, sizeof name);
    if (strcmp(name, "--quiet") != 0 || strchr(arg, '=') != NULL) return false;
    *quiet = true;
    cli_quiet_logs();
    return true;
}

const char *cli_choice(const char *cmd, const char *flag, const char *const *choices, int argc, char **argv,
                       int *i) {
    const char *v = cli_value(cmd, argc, argv, i);
    if (!v) return NULL;
    for (const char *const *c = choices; *c; c++)
        if (!strcmp(v, *c)) return v;
    fprintf(stderr, "zoff %s: %s: '%s' is not one of", cmd, flag, v);
    for (const char *const *c = choices; *c; c++) fprintf(stderr, "%s %s", c == choices ? "" : ",", *c);
    fprintf(stderr, "\n");
    return NULL;
}

int cli_exit_code(zoff_status s) {
    return (s == ZOFF_ERR_CONFIG || s == ZOFF_ERR_INVALID || s == ZOFF_ERR_FORMAT || s == ZOFF_ERR_UNSUPPORTED) ? 2 : 1;
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
    if (!strcmp(name, "--checkpoint-activations")) {
        *f->checkpoint_activations = true;
        return 1;
    }
    return cli_int_flags(cmd, name, flags, sizeof flags / sizeof flags[0], argc, argv, i);
}

int cli_table_flags(const char *cmd, const cli_flag_tables *t, char *name, size_t size, int argc, char **argv, int *i) {
    cli_flag_name(argv[*i], name, size);
    if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
        t->usage(stdout);
        return CLI_FLAG_HELP;
    }
    int took = t->shape ? cli_shape_flags(cmd, name, t->shape, argc, argv, i) : 0;
    if (!took) took = cli_string_flags(cmd, name, t->strs, t->nstrs, argc, argv, i);
    if (!took) took = cli_int_flags(cmd, name, t->ints, t->nints, argc, argv, i);
    for (size_t k = 0; !took && k < t->nbools; k++)
        if (!strcmp(name, t->bools[k].name)) {
            *t->bools[k].value = t->bools[k].set;
            took = 1;
        }
    return took;
}

int cli_bench_dir(const char *cmd, const char *dir, const char *smaller) {
    struct stat st;
    const char *why = NULL;
    if (stat(dir, &st) != 0) why = errno == ENOENT ? "no such directory" : strerror(errno);
    else if (!S_ISDIR(st.st_mode)) why = "not a directory";
    else if (access(dir, W_OK | X_OK) != 0) why = "not writable";
    if (!why) {
        char advice[4400];
        snprintf(advice, sizeof advice, "free space in %s, give another --dir, or %s", dir, smaller);
        zoff_set_disk_full_advice(advice);
        return 0;
    }
    fprintf(stderr,
            "zoff %s: --dir %s: %s; give an existing folder on the disk to measure (it is not created, so that a "
            "mistyped mount point does not measure another disk)\n",
            cmd, dir, why);
    return 2;
}
