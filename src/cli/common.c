/* Shared pieces of the zoff subcommands. */
#define _GNU_SOURCE
#include "cli/common.h"

#include <errno.h>
#include <jansson.h>
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

/* ------------------------------------------------------------------ default data */

static zoff_status mkdir_p(const char *dir) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return zoff_error(ZOFF_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return zoff_error(ZOFF_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
    return ZOFF_OK;
}

zoff_status cli_prepare_default_data(const char *dir, zoff_tokenizer *tok, char *train_path, size_t cap,
                                     char *val_path, size_t vcap) {
    const char *tn = zoff_tokenizer_name(tok);
    snprintf(train_path, cap, "%s/fortunes_%s_train.bin", dir, tn);
    snprintf(val_path, vcap, "%s/fortunes_%s_val.bin", dir, tn);
    struct stat st;
    if (stat(train_path, &st) == 0 && stat(val_path, &st) == 0) return ZOFF_OK;
    ZOFF_TRY(mkdir_p(dir));
    char text[4200], prefix[4200];
    snprintf(text, sizeof text, "%s/fortunes.txt", dir);
    snprintf(prefix, sizeof prefix, "%s/fortunes_%s", dir, tn);
    zoff_log(ZOFF_LOG_INFO, "preparing the default corpus (Debian's fortunes) in %s", dir);
    zoff_corpus_info ci;
    ZOFF_TRY(zoff_corpus_build_fortunes(NULL, text, &ci));
    const char *files[1] = {text};
    zoff_tokenize_options o = {.output_prefix = prefix, .val_fraction = 0.05, .quiet = true};
    zoff_tokenize_result res;
    memset(&res, 0, sizeof res);
    ZOFF_TRY(zoff_tokenize_files(tok, files, 1, &o, &res));
    zoff_log(ZOFF_LOG_INFO, "corpus: %lld bytes -> %lld train + %lld val tokens (%s) in %.1f s",
             (long long)res.bytes_in, (long long)res.tokens_train, (long long)res.tokens_val, tn, res.seconds);
    zoff_tokenize_result_free(&res);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ checkpoints */

static json_t *loader_to_json(const zoff_loader_state *l) {
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)l->fingerprint);
    json_t *o = json_object();
    json_object_set_new(o, "seed_lo", json_integer((json_int_t)(l->seed & 0xffffffffu)));
    json_object_set_new(o, "seed_hi", json_integer((json_int_t)(l->seed >> 32)));
    json_object_set_new(o, "epoch", json_integer((json_int_t)l->epoch));
    json_object_set_new(o, "window", json_integer((json_int_t)l->window));
    json_object_set_new(o, "seq_len", json_integer((json_int_t)l->seq_len));
    json_object_set_new(o, "num_windows", json_integer((json_int_t)l->num_windows));
    json_object_set_new(o, "fingerprint", json_string(fp));
    return o;
}

/* This rank's partition as the "partition" blob of its checkpoint file (see
 * include/zoff/ckpt.h, "Partitioned entries"). *runs / *nruns: the runs. */
static zoff_status partition_runs(zoff_engine *eng, int64_t **runs, int *nruns) {
    int nr = zoff_engine_partition(eng, NULL, NULL, 0);
    int64_t *off = malloc((size_t)(nr + 1) * sizeof *off), *cnt = malloc((size_t)(nr + 1) * sizeof *cnt);
    *runs = malloc((size_t)(2 * nr + 2) * sizeof **runs);
    if (!off || !cnt || !*runs) {
        free(off);
        free(cnt);
        free(*runs);
        *runs = NULL;
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition of a checkpoint");
    }
    zoff_engine_partition(eng, off, cnt, nr);
    for (int k = 0; k < nr; k++) { /* [off0, cnt0, off1, cnt1, ...] */
        (*runs)[2 * k] = off[k];
        (*runs)[2 * k + 1] = cnt[k];
    }
    free(off);
    free(cnt);
    *nruns = nr;
    return ZOFF_OK;
}

static char *partition_json(int rank, int world, int64_t n, const int64_t *runs, int nruns) {
    json_t *arr = json_array();
    for (int k = 0; k < nruns; k++)
        json_array_append_new(arr, json_pack("[I,I]", (json_int_t)runs[2 * k], (json_int_t)runs[2 * k + 1]));
    json_t *root = json_pack("{s:s,s:i,s:i,s:i,s:I,s:o}", "format", "zoff-partition", "version", 1, "rank", rank,
                             "world_size", world, "num_params", (json_int_t)n, "runs", arr);
    char *txt = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return txt;
}

zoff_status cli_save_checkpoint(const char *dir, zoff_engine *eng, const zoff_gpt2 *model, const cli_meta *meta,
                                const char *config_json) {
    return cli_save_checkpoint_dp(dir, eng, model, meta, config_json, NULL);
}

zoff_status cli_save_checkpoint_dp(const char *dir, zoff_engine *eng, const zoff_gpt2 *model, const cli_meta *meta,
                                   const char *config_json, zoff_comm *comm) {
    int rank = zoff_comm_rank(comm), world = zoff_comm_size(comm);
    int64_t n = zoff_gpt2_num_params(model), pn = zoff_engine_partition_numel(eng);
    /* all ranks write into one temp dir: its tag is rank 0's pid */
    long long pid = (long long)getpid();
    char tag[32];
    zoff_status s = world > 1 ? zoff_comm_broadcast_bytes(comm, &pid, sizeof pid, 0) : ZOFF_OK;
    if (s != ZOFF_OK) return zoff_error_context(s, "saving checkpoint step %lld", (long long)meta->step);
    snprintf(tag, sizeof tag, "%lld", pid);
    zoff_ckpt_options opts = {.tmp_tag = tag};
    int64_t *runs = NULL;
    int nruns = 0;
    float *buf = zoff_aligned_alloc(64, (size_t)n * sizeof(float), "checkpoint staging buffer");
    if (!buf) s = ZOFF_ERR_NOMEM;
    /* collective first (every rank, same order): the fp32 master of all ranks, in model order */
    if (s == ZOFF_OK) s = zoff_engine_state_gather(eng, 0, buf);
    if (s == ZOFF_OK) s = partition_runs(eng, &runs, &nruns);
    /* stage 0 replicates the state: rank 0 stores it, the other ranks an empty partition */
    bool replica = s == ZOFF_OK && rank > 0 && nruns == 1 && runs[0] == 0 && runs[1] == n;
    if (replica) nruns = 0;
    zoff_ckpt_writer *w = NULL;
    if (s == ZOFF_OK) s = zoff_ckpt_writer_open(dir, meta->step, rank, &opts, &w);
    /* weights: the fp32 master, one entry per tensor (Hugging Face names, zoff layout), in rank 0's file */
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(model, &nt);
    for (int i = 0; rank == 0 && s == ZOFF_OK && i < nt; i++)
        s = zoff_ckpt_add(w, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape, buf + t[i].offset,
                          (size_t)t[i].numel * sizeof(float));
    /* optimizer state: this rank's partition, described by the "partition" blob */
    for (int k = 1; s == ZOFF_OK && k < zoff_engine_state_count(eng); k++) {
        int64_t shape[1] = {replica ? 0 : pn};
        if (!replica) s = zoff_engine_state_get(eng, k, buf);
        if (s == ZOFF_OK)
            s = zoff_ckpt_add(w, zoff_engine_state_name(eng, k), ZOFF_F32, 1, shape, buf, (size_t)shape[0] * sizeof(float));
    }
    if (s == ZOFF_OK) {
        char *pj = partition_json(rank, world, n, runs, nruns);
        s = pj ? zoff_ckpt_add_blob(w, "partition", pj, strlen(pj))
               : zoff_error(ZOFF_ERR_INTERNAL, "cannot encode the checkpoint's partition");
        free(pj);
    }
    free(runs);
    if (s == ZOFF_OK && rank == 0) {
        const zoff_gpt2_shape *sh = &meta->shape;
        json_t *lj = loader_to_json(&meta->loader);
        json_t *root = json_pack(
            "{s:s,s:i,s:I,s:{s:I,s:I,s:I,s:I,s:I,s:I},s:I,s:s,s:I,s:I,s:o,s:{s:I,s:I,s:f,s:I,s:I,s:i},s:f}", "format",
            "zoff-train-state", "version", 1, "step", (json_int_t)meta->step, "model", "num_layers",
            (json_int_t)sh->num_layers, "hidden_size", (json_int_t)sh->hidden_size, "num_heads",
            (json_int_t)sh->num_heads, "max_seq_len", (json_int_t)sh->max_seq_len, "vocab_size",
            (json_int_t)sh->vocab_size, "padded_vocab_size", (json_int_t)sh->padded_vocab_size, "seq_len",
            (json_int_t)meta->seq_len, "tokenizer", meta->tokenizer, "seed_lo",
            (json_int_t)(meta->seed & 0xffffffffu), "seed_hi", (json_int_t)(meta->seed >> 32), "loader", lj,
            "engine", "steps_taken", (json_int_t)meta->engine.steps_taken, "steps_skipped",
            (json_int_t)meta->engine.steps_skipped, "loss_scale", meta->engine.loss_scale, "scaler_iter",
            (json_int_t)meta->engine.scaler_iter, "last_overflow_iter", (json_int_t)meta->engine.last_overflow_iter,
            "hysteresis_left", meta->engine.hysteresis_left,
            "consumed_tokens", meta->consumed_tokens);
        char *txt = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
        json_decref(root);
        if (!txt) s = zoff_error(ZOFF_ERR_INTERNAL, "cannot encode checkpoint metadata");
        if (s == ZOFF_OK) s = zoff_ckpt_add_blob(w, "meta", txt, strlen(txt));
        free(txt);
        if (s == ZOFF_OK && config_json) s = zoff_ckpt_add_blob(w, "config", config_json, strlen(config_json));
    }
    zoff_aligned_free(buf);
    if (s != ZOFF_OK) {
        zoff_ckpt_abort(w);
        zoff_error_context(s, "saving checkpoint step %lld under %s (rank %d of %d)", (long long)meta->step, dir,
                           rank, world);
    } else {
        s = zoff_ckpt_commit(w);
    }
    if (world == 1) return s == ZOFF_OK ? zoff_ckpt_finalize(dir, meta->step, 1, &opts) : s;
    /* every rank's file is committed (or failed) before rank 0 makes the checkpoint visible */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", s == ZOFF_OK ? "" : zoff_last_error());
    double failed = s != ZOFF_OK, fin = 0;
    zoff_status cs = zoff_comm_allreduce_f64(comm, &failed, 1, ZOFF_REDUCE_SUM);
    if (cs != ZOFF_OK) return cs;
    if (failed > 0) {
        if (rank == 0) (void)zoff_ckpt_discard(dir, meta->step, &opts);
        if (s != ZOFF_OK) return zoff_error(s, "%s", msg);
        return zoff_error(ZOFF_ERR_IO, "saving checkpoint step %lld under %s: %.0f rank(s) failed to write their "
                                       "part (see their messages); the checkpoint was discarded",
                          (long long)meta->step, dir, failed);
    }
    if (rank == 0) {
        s = zoff_ckpt_finalize(dir, meta->step, world, &opts);
        if (s != ZOFF_OK) snprintf(msg, sizeof msg, "%s", zoff_last_error());
        fin = s != ZOFF_OK;
    }
    if ((cs = zoff_comm_allreduce_f64(comm, &fin, 1, ZOFF_REDUCE_SUM)) != ZOFF_OK) return cs;
    if (fin > 0)
        return rank == 0 ? zoff_error(s, "%s", msg)
                         : zoff_error(ZOFF_ERR_IO, "saving checkpoint step %lld under %s: rank 0 could not finalize "
                                                   "it (see its message)",
                                      (long long)meta->step, dir);
    return ZOFF_OK;
}

static zoff_status get_int(json_t *o, const char *key, const char *path, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata field '%s' is missing or not an integer", path,
                          key);
    *out = (int64_t)json_integer_value(v);
    return ZOFF_OK;
}

zoff_status cli_read_meta(zoff_ckpt_reader *r, cli_meta *m, char **config_json) {
    const char *path = zoff_ckpt_reader_path(r);
    memset(m, 0, sizeof *m);
    char *txt = NULL;
    ZOFF_TRY(zoff_ckpt_read_blob(r, "meta", &txt, NULL));
    json_error_t jerr;
    json_t *root = json_loads(txt, 0, &jerr);
    free(txt);
    if (!root) return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata is not valid JSON (%s)", path, jerr.text);
    zoff_status s = ZOFF_OK;
    const char *fmt = json_string_value(json_object_get(root, "format"));
    int64_t ver = 0, lo = 0, hi = 0, t;
    if (!fmt || strcmp(fmt, "zoff-train-state"))
        s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: not a zoff training state", path);
    if (s == ZOFF_OK) s = get_int(root, "version", path, &ver);
    if (s == ZOFF_OK && ver != 1)
        s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: training-state version %lld, this zoff reads version 1", path,
                       (long long)ver);
    json_t *mo = json_object_get(root, "model"), *lj = json_object_get(root, "loader"),
           *ej = json_object_get(root, "engine");
    if (s == ZOFF_OK && (!json_is_object(mo) || !json_is_object(lj) || !json_is_object(ej)))
        s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata lacks model/loader/engine sections", path);
    if (s == ZOFF_OK) s = get_int(root, "step", path, &m->step);
    if (s == ZOFF_OK && m->step != zoff_ckpt_reader_step(r))
        s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: its metadata says step %lld but the file is step %lld: %s", path,
                       (long long)m->step, (long long)zoff_ckpt_reader_step(r),
                       "the metadata does not belong to this checkpoint; use an earlier checkpoint");
    if (s == ZOFF_OK) s = get_int(root, "seq_len", path, &m->seq_len);
    if (s == ZOFF_OK) s = get_int(mo, "num_layers", path, &m->shape.num_layers);
    if (s == ZOFF_OK) s = get_int(mo, "hidden_size", path, &m->shape.hidden_size);
    if (s == ZOFF_OK) s = get_int(mo, "num_heads", path, &m->shape.num_heads);
    if (s == ZOFF_OK) s = get_int(mo, "max_seq_len", path, &m->shape.max_seq_len);
    if (s == ZOFF_OK) s = get_int(mo, "vocab_size", path, &m->shape.vocab_size);
    if (s == ZOFF_OK) s = get_int(mo, "padded_vocab_size", path, &m->shape.padded_vocab_size);
    if (s == ZOFF_OK) s = get_int(root, "seed_lo", path, &lo);
    if (s == ZOFF_OK) s = get_int(root, "seed_hi", path, &hi);
    if (s == ZOFF_OK) m->seed = (uint64_t)lo | ((uint64_t)hi << 32);
    if (s == ZOFF_OK) s = get_int(lj, "seed_lo", path, &lo);
    if (s == ZOFF_OK) s = get_int(lj, "seed_hi", path, &hi);
    if (s == ZOFF_OK) m->loader.seed = (uint64_t)lo | ((uint64_t)hi << 32);
    if (s == ZOFF_OK) s = get_int(lj, "epoch", path, &m->loader.epoch);
    if (s == ZOFF_OK) s = get_int(lj, "window", path, &m->loader.window);
    if (s == ZOFF_OK) s = get_int(lj, "seq_len", path, &m->loader.seq_len);
    if (s == ZOFF_OK) s = get_int(lj, "num_windows", path, &m->loader.num_windows);
    if (s == ZOFF_OK) {
        const char *fp = json_string_value(json_object_get(lj, "fingerprint"));
        m->loader.fingerprint = fp ? strtoull(fp, NULL, 16) : 0;
    }
    if (s == ZOFF_OK) s = get_int(ej, "steps_taken", path, &m->engine.steps_taken);
    if (s == ZOFF_OK) s = get_int(ej, "steps_skipped", path, &m->engine.steps_skipped);
    if (s == ZOFF_OK) s = get_int(ej, "scaler_iter", path, &m->engine.scaler_iter);
    if (s == ZOFF_OK) s = get_int(ej, "last_overflow_iter", path, &m->engine.last_overflow_iter);
    if (s == ZOFF_OK) s = get_int(ej, "hysteresis_left", path, &t);
    if (s == ZOFF_OK) {
        m->engine.hysteresis_left = (int)t;
        m->engine.loss_scale = json_number_value(json_object_get(ej, "loss_scale"));
        m->consumed_tokens = json_number_value(json_object_get(root, "consumed_tokens"));
        const char *tk = json_string_value(json_object_get(root, "tokenizer"));
        snprintf(m->tokenizer, sizeof m->tokenizer, "%s", tk ? tk : "gpt2");
    }
    json_decref(root);
    if (s == ZOFF_OK && config_json) {
        *config_json = NULL;
        if (zoff_ckpt_find(r, "config")) s = zoff_ckpt_read_blob(r, "config", config_json, NULL);
    }
    return s;
}

zoff_status cli_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(model, &nt);
    for (int i = 0; i < nt; i++)
        ZOFF_TRY(zoff_ckpt_read_tensor(r, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape, host_params + t[i].offset,
                                       (size_t)t[i].numel * sizeof(float)));
    return ZOFF_OK;
}

/* The runs of a rank file's partitioned entries: its "partition" blob, or [[0, n]]
 * for a file without one (checkpoints of one rank written before it existed). */
static zoff_status read_runs(zoff_ckpt_reader *r, int64_t n, int64_t **runs, int *nruns) {
    *runs = NULL;
    *nruns = 0;
    const char *path = zoff_ckpt_reader_path(r);
    if (!zoff_ckpt_find(r, "partition")) {
        if (!(*runs = malloc(2 * sizeof **runs))) return ZOFF_ERR_NOMEM;
        (*runs)[0] = 0;
        (*runs)[1] = n;
        *nruns = 1;
        return ZOFF_OK;
    }
    char *txt = NULL;
    ZOFF_TRY(zoff_ckpt_read_blob(r, "partition", &txt, NULL));
    json_error_t jerr;
    json_t *root = json_loads(txt, 0, &jerr), *arr = json_object_get(root, "runs");
    free(txt);
    zoff_status s = ZOFF_OK;
    json_int_t np = json_integer_value(json_object_get(root, "num_params"));
    if (!root || !json_is_array(arr) || np != n)
        s = zoff_error(ZOFF_ERR_FORMAT,
                       "checkpoint %s: the partition blob is not valid or is for %lld parameters (the model has "
                       "%lld)",
                       path, (long long)np, (long long)n);
    size_t na = s == ZOFF_OK ? json_array_size(arr) : 0;
    if (s == ZOFF_OK && !(*runs = malloc((2 * na + 2) * sizeof **runs))) s = ZOFF_ERR_NOMEM;
    for (size_t k = 0; s == ZOFF_OK && k < na; k++) {
        json_t *e = json_array_get(arr, k);
        json_int_t o = json_integer_value(json_array_get(e, 0)), c = json_integer_value(json_array_get(e, 1));
        if (json_array_size(e) != 2 || o < 0 || c < 0 || o > n - c)
            s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: partition run %zu [%lld, +%lld) is outside [0, %lld)", path,
                           k, (long long)o, (long long)c, (long long)n);
        else {
            (*runs)[2 * k] = o;
            (*runs)[2 * k + 1] = c;
        }
    }
    if (s == ZOFF_OK) *nruns = (int)na;
    json_decref(root);
    if (s != ZOFF_OK) {
        free(*runs);
        *runs = NULL;
    }
    return s;
}

/* Resharding: this rank's partition of each optimizer state array is read from
 * whichever rank files of the checkpoint hold it, however many ranks wrote it. */
zoff_status cli_read_engine_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t n) {
    int oldn = zoff_ckpt_reader_nranks(r);
    int64_t pn = zoff_engine_partition_numel(eng);
    int64_t *mine = NULL, *theirs = NULL;
    int nmine = 0, ntheirs = 0;
    zoff_status s = partition_runs(eng, &mine, &nmine);
    if (s != ZOFF_OK) return s;
    float *buf = zoff_aligned_alloc(64, (size_t)(pn > 0 ? pn : 1) * sizeof(float), "checkpoint staging buffer");
    if (!buf) {
        free(mine);
        return ZOFF_ERR_NOMEM;
    }
    char stepdir[4096];
    snprintf(stepdir, sizeof stepdir, "%s", zoff_ckpt_reader_path(r));
    char *slash = strrchr(stepdir, '/');
    if (slash) *slash = 0;
    for (int k = 1; s == ZOFF_OK && k < zoff_engine_state_count(eng); k++) {
        const char *name = zoff_engine_state_name(eng, k);
        int64_t covered = 0;
        for (int q = 0; s == ZOFF_OK && q < oldn; q++) {
            zoff_ckpt_reader *rq = r;
            if (q > 0) s = zoff_ckpt_open(stepdir, q, &rq);
            if (s == ZOFF_OK) s = read_runs(rq, n, &theirs, &ntheirs);
            const zoff_ckpt_entry *en = s == ZOFF_OK ? zoff_ckpt_find(rq, name) : NULL;
            int64_t total = 0;
            for (int a = 0; a < ntheirs; a++) total += theirs[2 * a + 1];
            if (s == ZOFF_OK && (!en || en->dtype != ZOFF_F32 || en->bytes != total * (int64_t)sizeof(float)))
                s = zoff_error(ZOFF_ERR_FORMAT,
                               "checkpoint %s: entry '%s' is missing or does not hold the %lld fp32 values its "
                               "partition describes",
                               zoff_ckpt_reader_path(rq), name, (long long)total);
            /* intersect each of their runs with each of mine */
            int64_t eo = 0;
            for (int a = 0; s == ZOFF_OK && a < ntheirs; a++) {
                int64_t o = theirs[2 * a], c = theirs[2 * a + 1], lo = 0;
                for (int b = 0; s == ZOFF_OK && b < nmine; b++) {
                    int64_t m = mine[2 * b], mc = mine[2 * b + 1];
                    int64_t x = o > m ? o : m, y = o + c < m + mc ? o + c : m + mc;
                    if (x < y) {
                        s = zoff_ckpt_read_range(rq, name, (eo + x - o) * (int64_t)sizeof(float), buf + lo + (x - m),
                                                 (size_t)(y - x) * sizeof(float));
                        covered += y - x;
                    }
                    lo += mc;
                }
                eo += c;
            }
            free(theirs);
            theirs = NULL;
            if (q > 0) zoff_ckpt_close(rq);
        }
        if (s == ZOFF_OK && covered != pn)
            s = zoff_error(ZOFF_ERR_FORMAT,
                           "checkpoint %s: its %d rank file(s) hold %lld of the %lld values of '%s' this rank needs "
                           "(overlapping or missing partitions); the checkpoint is incomplete or corrupt",
                           stepdir, oldn, (long long)covered, (long long)pn, name);
        if (s == ZOFF_OK) s = zoff_engine_state_set(eng, k, buf);
    }
    free(mine);
    zoff_aligned_free(buf);
    return s;
}
