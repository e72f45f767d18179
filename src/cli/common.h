/* Shared pieces of the zoff subcommands: argument parsing. Internal to src/cli. */
#ifndef ZOFF_CLI_COMMON_H
#define ZOFF_CLI_COMMON_H

#include <stdio.h>

#include "zoff/ckpt.h"
#include "zoff/comm.h"
#include "zoff/config.h"
#include "zoff/data.h"
#include "zoff/engine.h"
#include "zoff/model.h"
#include "zoff/safetensors.h"
#include "zoff/train.h"

/* Parse helpers: on failure print "zoff <cmd>: <flag>: ..." to stderr and return false. */
bool cli_parse_i64(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
bool cli_parse_f64(const char *cmd, const char *flag, const char *text, double min, double max, double *out);
/* The one reading of every command's --dtype: f32, bf16 or f16 (the spellings the helps show), and
 * DeepSpeed's fp32 and fp16 as the same, into *dt; otherwise prints "zoff <cmd>: <flag>: 'x' is not
 * one of f32, bf16, f16 (fp32 and fp16 also read)" and returns false. */
bool cli_parse_dtype(const char *cmd, const char *flag, const char *text, zoff_dtype *dt);
/* The name of dt in the --json output of bench step and nvme: f32, bf16, fp16 (zoff plan --bench
 * reads it back). */
const char *cli_bench_dtype_name(zoff_dtype dt);
/* A comma-separated list (--ratios 0,0.5,1): not empty, no empty item (leading, trailing or doubled
 * comma), shorter than `cap` characters; else prints "zoff <cmd>: <flag>: ..." and returns false. */
bool cli_check_list(const char *cmd, const char *flag, const char *text, size_t cap);
/* A path flag given as "" (--load ''): prints "zoff <cmd>: <flag> is empty: give <what>" and returns
 * false; true for any other path. */
bool cli_path_given(const char *cmd, const char *flag, const char *path, const char *what);
/* Fetch the value after argv[*i] (advancing *i); prints an error if missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);
/* The flag's name in `arg`: "--flag" of "--flag=value", "--quiet" of -q (the one short alias of a long
 * flag, for every command that takes --quiet), else arg itself (cut to size - 1 bytes). */
void cli_flag_name(const char *arg, char *name, size_t size);
/* --quiet for every command that takes it: from here on the library's notes (zoff_log INFO) are not
 * printed; its warnings and errors are. */
void cli_quiet_logs(void);
/* When arg is --quiet or -q (cli_flag_name's alias; not --quiet=VALUE): sets *quiet, quiets the
 * library's notes (cli_quiet_logs) and returns true; else false. Every command's --quiet but train's (a
 * table flag): eval, sample, plan and bench keep their result on stdout; export and tokenize drop their
 * summary too. */
bool cli_quiet_flag(const char *arg, bool *quiet);
/* Fetch argv[*i]'s value (as cli_value) and check that it is one of `choices` (NULL-terminated);
 * otherwise print "zoff <cmd>: <flag>: 'v' is not one of a, b" and return NULL. */
const char *cli_choice(const char *cmd, const char *flag, const char *const *choices, int argc, char **argv,
                       int *i);
/* Print "zoff <cmd>: unknown option 'arg' (did you mean --x? zoff <cmd> --help lists them)"
 * to stderr. The options are the "--name" words of the command's usage text (its one list);
 * the suggestion is the one option that begins with arg's name, else the one nearest to it
 * (edit distance at most 2), else none. */
void cli_unknown_option(const char *cmd, const char *arg, void (*usage)(FILE *));
/* The one name of names[n] that `typed` most likely meant: the only one it begins (when it has
 * min_prefix characters or more), else the only one within edit distance 2 at the least distance;
 * NULL: none, or a tie. Behind every "did you mean" of the command line. */
const char *cli_nearest_name(const char *typed, const char *const *names, size_t n, size_t min_prefix);
/* Exit code for a failing status: bad input or config -> 2, a runtime failure -> 1. */
int cli_exit_code(zoff_status s);
/* A benchmark's --dir: an existing, writable directory, never created (a mistyped mount point
 * would silently measure another disk). 0, or prints why, naming the command and the folder, and
 * returns 2. On 0 the process's advice for a full disk is the benchmark's (zoff_set_disk_full_advice:
 * free space in DIR, another --dir, or `smaller`, what makes the benchmark write less), not a
 * training run's (keep fewer checkpoints, another nvme_path). */
int cli_bench_dir(const char *cmd, const char *dir, const char *smaller);

/* ---- weights to run a model on (weights.c: zoff sample, zoff eval) ---- */
/* A training checkpoint or GPT-2 weights in safetensors, with the model's shape, its context
 * length (the checkpoint's sequence length, or all of a file's positions) and its tokenizer. */
typedef struct cli_weights {
    zoff_ckpt_reader *rd;
    zoff_st_file *st;
    zoff_gpt2_shape shape;
    int64_t seq_len;
    char tokenizer[16];
} cli_weights;
/* load: a checkpoint root or step folder, a safetensors file, or a folder holding
 * model.safetensors; tokenizer: --tokenizer for safetensors without zoff's metadata (or NULL).
 * Call cli_weights_close also after a failure. */
zoff_status cli_weights_open(const char *load, const char *tokenizer, cli_weights *w);
void cli_weights_close(cli_weights *w);
/* The weights' tokenizer, refused when it has more tokens than the model's vocabulary (a --tokenizer
 * that is not the model's: its ids would be out of the model's range). */
zoff_status cli_weights_tokenizer(const cli_weights *w, zoff_tokenizer **tok);
/* A device ("cuda", "cpu" or NULL: cuda when available) and an fp32 model of batch B and sequence
 * T holding the weights (no host copy kept). */
zoff_status cli_weights_model(cli_weights *w, const char *device, int64_t B, int64_t T, zoff_device **dev,
                              zoff_gpt2 **model);

/* Flags that take a value, as tables: a string, or an integer within [min, max]. */
typedef struct cli_string_flag {
    const char *name;
    const char **value;
} cli_string_flag;
typedef struct cli_int_flag {
    const char *name;
    int64_t min, max;
    int64_t *value;
} cli_int_flag;
/* When `name` (argv[*i]'s flag) is one of the n `flags`, fetch and store its value
 * (advancing *i) and return 1; return 0 when it is none of them; -1 (the error
 * printed) when the value is missing or out of range. */
int cli_string_flags(const char *cmd, const char *name, const cli_string_flag *flags, size_t n, int argc, char **argv,
                     int *i);
int cli_int_flags(const char *cmd, const char *name, const cli_int_flag *flags, size_t n, int argc, char **argv, int *i);
/* The model flags of the commands that train or plan a GPT-2: the shape (--num-layers,
 * --hidden-size, --num-attention-heads, --seq-length, --max-position-embeddings, --vocab-size,
 * --micro-batch-size), with the ranges of the model's one bounds table (zoff/model.h), and
 * --checkpoint-activations; returns as cli_int_flags. */
typedef struct cli_shape_fields {
    int64_t *num_layers, *hidden_size, *num_heads, *seq_length, *max_pos, *vocab_size, *micro_batch;
    bool *checkpoint_activations;
} cli_shape_fields;
int cli_shape_flags(const char *cmd, const char *name, const cli_shape_fields *f, int argc, char **argv, int *i);
/* A flag without a value: stores `set` into *value. */
typedef struct cli_bool_flag {
    const char *name;
    bool *value, set;
} cli_bool_flag;
/* A command's flags as tables (any part may be empty) and its usage text. */
typedef struct cli_flag_tables {
    const cli_shape_fields *shape;
    const cli_string_flag *strs;
    size_t nstrs;
    const cli_int_flag *ints;
    size_t nints;
    const cli_bool_flag *bools;
    size_t nbools;
    void (*usage)(FILE *);
} cli_flag_tables;
/* What cli_table_flags did with argv[*i]. */
enum { CLI_FLAG_NONE = 0, CLI_FLAG_TAKEN = 1, CLI_FLAG_HELP = 2, CLI_FLAG_ERROR = -1 };
/* Take argv[*i] when it is in the tables (shape flags, strings, integers, switches; a value is
 * fetched and checked, advancing *i): TAKEN, or ERROR with the message printed. -h and --help
 * print the usage to stdout: HELP. Otherwise NONE, with the flag's name (cli_flag_name) in name. */
int cli_table_flags(const char *cmd, const cli_flag_tables *t, char *name, size_t size, int argc, char **argv, int *i);

/* Training checkpoints live in src/train (include/zoff/train.h); these names remain for the
 * benchmarks that call them. */
typedef zoff_train_meta cli_meta;
static inline zoff_status cli_save_checkpoint(const char *dir, zoff_engine *eng, const zoff_gpt2 *model,
                                              const cli_meta *meta, const char *config_json) {
    return zoff_train_ckpt_save(dir, eng, model, meta, config_json, NULL);
}
static inline zoff_status cli_read_meta(zoff_ckpt_reader *r, cli_meta *meta, char **config_json) {
    return zoff_train_ckpt_read_meta(r, meta, config_json);
}
static inline zoff_status cli_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params) {
    return zoff_train_ckpt_read_weights(r, model, host_params);
}
static inline zoff_status cli_read_engine_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t num_params) {
    return zoff_train_ckpt_read_state(r, eng, num_params);
}

#endif
