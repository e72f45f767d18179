/* Shared pieces of the zoff subcommands: argument parsing, the default job's
 * data, and training-state checkpoints (save / load). Internal to src/cli. */
#ifndef ZOFF_CLI_COMMON_H
#define ZOFF_CLI_COMMON_H

#include <stdio.h>

#include "zoff/ckpt.h"
#include "zoff/comm.h"
#include "zoff/config.h"
#include "zoff/data.h"
#include "zoff/engine.h"
#include "zoff/model.h"

/* Parse helpers: on failure print "zoff <cmd>: <flag>: ..." to stderr and return false. */
bool cli_parse_i64(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);
bool cli_parse_f64(const char *cmd, const char *flag, const char *text, double min, double max, double *out);
/* Fetch the value after argv[*i] (advancing *i); prints an error if missing. */
const char *cli_value(const char *cmd, int argc, char **argv, int *i);

/* The default training corpus: Debian's `fortunes` package, tokenised once into
 * DIR/fortunes_{train,val}.bin. Returns the train and val paths. */
zoff_status cli_prepare_default_data(const char *dir, zoff_tokenizer *tok, char *train_path, size_t cap,
                                     char *val_path, size_t vcap);

/* What a training checkpoint records besides tensors (stored as the "meta" JSON blob). */
typedef struct cli_meta {
    int64_t step;              /* optimizer steps applied (iteration count) */
    zoff_gpt2_shape shape;
    int64_t seq_len;
    char tokenizer[16];
    uint64_t seed;
    zoff_loader_state loader;
    zoff_engine_scalars engine;
    double consumed_tokens;
} cli_meta;

/* Save weights (fp32 master, per tensor by name), optimizer state and meta into
 * DIR/step_X (atomic). config_json may be NULL. */
zoff_status cli_save_checkpoint(const char *dir, zoff_engine *eng, const zoff_gpt2 *model, const cli_meta *meta,
                                const char *config_json);
/* The same over the ranks of comm (collective; comm NULL = one rank): every rank
 * writes rank_%05d.zckpt with its partition of the optimizer state and a
 * "partition" blob; rank 0's file also holds the weights (gathered), meta and
 * config; after all committed, rank 0 finalizes. A failure on any rank discards
 * the checkpoint on all. */
zoff_status cli_save_checkpoint_dp(const char *dir, zoff_engine *eng, const zoff_gpt2 *model, const cli_meta *meta,
                                   const char *config_json, zoff_comm *comm);
/* Read meta from a checkpoint (root or step dir). *config_json (malloc'd, may be NULL). */
zoff_status cli_read_meta(zoff_ckpt_reader *r, cli_meta *meta, char **config_json);
/* Read the fp32 master weights of every tensor of `model` into host_params (num_params floats). */
zoff_status cli_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params);
/* Restore the engine's optimizer state (this rank's partition, read from whichever
 * rank files hold it: the checkpoint may have been written by another number of
 * ranks). r is rank 0's file. */
zoff_status cli_read_engine_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t num_params);

#endif
