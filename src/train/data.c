/* The trainer's data: the default corpus (Debian's fortunes, tokenised once), the training and
 * validation shards, their loaders. Everything is opened and checked before any output. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/trainer_internal.h"

/* mkdir -p; *made (may be NULL) gets the top-most directory this call created ("" if none). */
zoff_status zoff_train_mkdir_p(const char *dir, char *made, size_t cap) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", dir);
    if (made && cap) made[0] = 0;
    for (char *p = buf + 1;; p++) {
        bool last = !*p;
        if (!last && *p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) == 0) {
            if (made && cap && !made[0]) snprintf(made, cap, "%s", buf);
        } else if (errno != EEXIST) {
            return zoff_error(zoff_status_of_path_errno(errno), "cannot create directory %s: %s", buf, strerror(errno));
        } else {
            struct stat st;
            if (stat(buf, &st) == 0 && !S_ISDIR(st.st_mode))
                return zoff_error(ZOFF_ERR_INVALID, "%s is a file, not a directory", buf);
        }
        if (last) break;
        *p = '/';
    }
    return ZOFF_OK;
}

zoff_status zoff_train_default_data(const char *dir, zoff_tokenizer *tok, char *train_path, size_t cap,
                                    char *val_path, size_t vcap) {
    const char *tn = zoff_tokenizer_name(tok);
    snprintf(train_path, cap, "%s/fortunes_%s_train.bin", dir, tn);
    snprintf(val_path, vcap, "%s/fortunes_%s_val.bin", dir, tn);
    struct stat st;
    if (stat(train_path, &st) == 0 && stat(val_path, &st) == 0) return ZOFF_OK;
    ZOFF_TRY(zoff_train_mkdir_p(dir, NULL, 0));
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

/* The shard paths: --data-path / --val-path, or the default corpus (several ranks: local rank 0
 * builds it, the others wait and find it). */
/* A --data-path / --val-path (a comma-separated list, as zoff_dataset_open reads it) with each of its
 * paths made absolute, into out[1024] ("" when it does not fit): what a checkpoint records, so that a
 * resume from another directory reads the same files. */
static void absolute(const char *path, char *out) {
    char cwd[4096];
    const bool have_cwd = getcwd(cwd, sizeof cwd) != NULL;
    size_t used = 0;
    out[0] = '\0';
    for (const char *p = path; *p;) {
        size_t len = strcspn(p, ",");
        int n = len == 0                  ? 0
                : p[0] == '/'             ? snprintf(out + used, 1024 - used, "%.*s", (int)len, p)
                : have_cwd                ? snprintf(out + used, 1024 - used, "%s/%.*s", cwd, (int)len, p)
                                          : -1;
        if (n < 0 || (size_t)n >= 1024 - used) {
            out[0] = '\0';
            return;
        }
        used += (size_t)n;
        p += len;
        if (*p == ',') p++;
        if (*p && len > 0) {
            if (used + 1 >= 1024) {
                out[0] = '\0';
                return;
            }
            out[used++] = ',';
            out[used] = '\0';
        }
    }
}

/* A resume without --data-path reads the run's shards (the checkpoint's record of them). */
static zoff_status data_paths(zoff_trainer *t, char *train_path, char *val_path, size_t cap) {
    const char *dp = t->o.data_path, *vp = t->o.val_path;
    snprintf(t->data_flag, sizeof t->data_flag, "--data-path");
    snprintf(t->val_flag, sizeof t->val_flag, "--val-path");
    if (!dp && t->resume.data_path[0]) {
        dp = t->resume.data_path;
        vp = t->resume.val_path[0] ? t->resume.val_path : NULL;
        trainer_say(t, "resume: no --data-path given: the run's %s%s%s", dp, vp ? ", --val-path " : "", vp ? vp : "");
        snprintf(t->data_flag, sizeof t->data_flag, "--data-path (the checkpoint's, %s)", dp);
        if (vp) snprintf(t->val_flag, sizeof t->val_flag, "--val-path (the checkpoint's, %s)", vp);
    }
    if (dp) {
        snprintf(train_path, cap, "%s", dp);
        snprintf(val_path, cap, "%s", vp ? vp : "");
        absolute(dp, t->data_abs);
        if (vp) absolute(vp, t->val_abs);
        if (!t->data_abs[0] || (vp && !t->val_abs[0]))
            trainer_say(t, "note: %s is too long for the checkpoint to record (1023 characters at most): give it "
                           "again when you resume this run, or name the shards with a glob or their folder",
                        !t->data_abs[0] ? "--data-path" : "--val-path");
        return ZOFF_OK;
    }
    bool first = t->info.world == 1 || zoff_comm_local_rank(t->comm) == 0;
    zoff_status s = first ? ZOFF_OK : zoff_comm_barrier(t->comm);
    const char *dir = t->o.default_data_dir ? t->o.default_data_dir : "out/data";
    if (s == ZOFF_OK) s = zoff_train_default_data(dir, t->tok, train_path, cap, val_path, cap);
    if (s == ZOFF_OK && first && t->info.world > 1) s = zoff_comm_barrier(t->comm);
    return s != ZOFF_OK ? zoff_error_context(s, "default corpus") : ZOFF_OK;
}

/* Validation: every rank reads the same sequence of batches as one rank would (world size 1);
 * zoff_trainer_evaluate shares the batches out, so the loss does not depend on the rank count. */
static zoff_status open_validation(zoff_trainer *t, bool split_val, int64_t val_tokens) {
    zoff_loader_options vo = zoff_loader_defaults(t->info.micro_batch, t->info.seq_len);
    char what[1200];
    snprintf(what, sizeof what, "the validation split (the last 5%% of %s's tokens)", t->data_flag);
    vo.shuffle = false;
    vo.what = split_val ? what : t->val_flag;
    vo.one_batch = true; /* one batch of micro_batch windows, whatever the ranks (they share it out) */
    vo.batch_name = "validation batch";
    vo.too_small_hint = split_val ? "; give --val-path shards of their own, more tokens, a smaller --micro-batch-size or "
                                    "--seq-length, or --eval-iters 0 for no validation"
                                  : "; give more tokens, a smaller --micro-batch-size or --seq-length, or --eval-iters 0 "
                                    "for no validation";
    if (split_val) {
        vo.split = ZOFF_SPLIT_VAL;
        vo.val_tokens = val_tokens;
    }
    zoff_status s = zoff_loader_create(split_val ? t->train_ds : t->val_ds, &vo, &t->val_ld);
    if (s != ZOFF_OK) return zoff_error_context(s, "validation data");
    int64_t nb = zoff_loader_batches_per_epoch(t->val_ld);
    t->info.eval_iters = t->o.eval_iters < nb ? t->o.eval_iters : nb;
    if (t->o.eval_iters > nb)
        trainer_say(t, "note: --eval-iters %lld is more than %s holds (%lld batches of %lld x %lld tokens): validating "
                       "on those %lld",
                    (long long)t->o.eval_iters, vo.what, (long long)nb, (long long)t->info.micro_batch,
                    (long long)t->info.seq_len, (long long)nb);
    return ZOFF_OK;
}

/* Every rank reads its rows of one global batch: the ranks' shards must be the same (the command
 * line check sees the paths, not the files behind them on each node). Collective. */
static zoff_status same_data(zoff_trainer *t) {
    if (t->info.world <= 1) return ZOFF_OK;
    int64_t mine[2] = {zoff_dataset_num_tokens(t->train_ds), t->val_ds ? zoff_dataset_num_tokens(t->val_ds) : 0};
    int64_t *all = calloc((size_t)t->info.world * 2, sizeof *all);
    if (!all) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = zoff_comm_allgather_bytes(t->comm, mine, all, sizeof mine);
    int r = 1;
    while (s == ZOFF_OK && r < t->info.world && all[2 * r] == all[0] && all[2 * r + 1] == all[1]) r++;
    if (s == ZOFF_OK && r < t->info.world)
        s = zoff_error(ZOFF_ERR_INVALID,
                       "%s / %s are other files on rank %d than on rank 0: %lld / %lld tokens there, "
                       "%lld / %lld on rank 0. Every rank must read the same shards (one shared file system, or "
                       "identical copies at the same paths)",
                       t->data_flag, t->val_flag, r, (long long)all[2 * r], (long long)all[2 * r + 1],
                       (long long)all[0], (long long)all[1]);
    free(all);
    return s;
}

/* One file twice in --data-path (its windows read twice an epoch) or in both --data-path and --val-path
 * (validation on training data): said, not refused (a repeat may be meant). Rank 0. */
static void warn_same_files(const zoff_trainer *t) {
    int i, j;
    if (t->info.rank != 0) return;
    if (zoff_dataset_same_file(t->train_ds, t->train_ds, &i, &j))
        zoff_log(ZOFF_LOG_WARN, "%s names one file twice, %s and %s: each epoch reads its windows twice", t->data_flag,
                 zoff_shard_path(zoff_dataset_shard(t->train_ds, i)), zoff_shard_path(zoff_dataset_shard(t->train_ds, j)));
    if (t->val_ds && zoff_dataset_same_file(t->train_ds, t->val_ds, &i, &j))
        zoff_log(ZOFF_LOG_WARN,
                 "%s's %s is also a training shard (%s's %s): the validation loss is measured on data the model "
                 "trains on; give --data-path the training shards only (e.g. 'DIR/NAME_train*.bin')",
                 t->val_flag, zoff_shard_path(zoff_dataset_shard(t->val_ds, j)), t->data_flag,
                 zoff_shard_path(zoff_dataset_shard(t->train_ds, i)));
}

/* Shards too short for one window (seq_len + 1 tokens; windows never cross shards) are not read: said,
 * naming the first, so that data left out is not a surprise. Rank 0. */
static void note_short_shards(const zoff_trainer *t, const zoff_dataset *ds, const char *flag) {
    const int64_t need = t->info.seq_len + 1;
    const int first = zoff_dataset_next_short_shard(ds, t->info.seq_len, 0);
    int n = 0;
    int64_t tokens = 0;
    for (int i = first; i >= 0; i = zoff_dataset_next_short_shard(ds, t->info.seq_len, i + 1)) {
        n++;
        tokens += zoff_shard_num_tokens(zoff_dataset_shard(ds, i));
    }
    if (n > 0)
        trainer_say(t, "note: %d of %s's %d shards (%lld tokens; the first: %s) hold fewer than seq_len + 1 = %lld "
                       "tokens, one window: they are not read",
                    n, flag, zoff_dataset_num_shards(ds), (long long)tokens,
                    zoff_shard_path(zoff_dataset_shard(ds, first)), (long long)need);
}

zoff_status trainer_open_data(zoff_trainer *t) {
    char train_path[4096], val_path[4096];
    ZOFF_TRY(data_paths(t, train_path, val_path, sizeof train_path));
    int32_t vocab = (int32_t)t->info.shape.vocab_size;
    /* a resumed run has its checkpoint's tokenizer; a new one chose it */
    const char *hint = t->o.load_dir ? " (the checkpoint's)" : ", or train with the shards' (--tokenizer)";
    zoff_status s = zoff_dataset_open(train_path, vocab, &t->train_ds);
    if (s == ZOFF_OK) s = zoff_dataset_check_tokenizer(t->train_ds, t->tok, hint);
    if (s != ZOFF_OK) return zoff_error_context(s, "%s", t->data_flag);
    zoff_loader_options lo = zoff_loader_defaults(t->info.micro_batch, t->info.seq_len);
    char split_what[1300];
    snprintf(split_what, sizeof split_what,
             "the training split (all but the last 5%% of %s's tokens, which validation reads unless --val-path is "
             "given)", t->data_flag);
    lo.seed = t->o.seed;
    lo.rank = t->info.rank; /* rank r takes rows [r*B, (r+1)*B) of each global batch of world*B */
    lo.world_size = t->info.world;
    bool split_val = !val_path[0];
    lo.what = t->data_flag;
    if (split_val) {
        lo.split = ZOFF_SPLIT_TRAIN;
        lo.val_tokens = zoff_dataset_num_tokens(t->train_ds) / 20;
        lo.what = split_what;
    } else if ((s = zoff_dataset_open(val_path, vocab, &t->val_ds)) != ZOFF_OK ||
               (s = zoff_dataset_check_tokenizer(t->val_ds, t->tok, hint)) != ZOFF_OK) {
        return zoff_error_context(s, "%s", t->val_flag);
    }
    if ((s = zoff_loader_create(t->train_ds, &lo, &t->train_ld)) != ZOFF_OK)
        return zoff_error_context(s, "training data");
    warn_same_files(t);
    note_short_shards(t, t->train_ds, t->data_flag);
    if (t->val_ds && t->o.eval_iters > 0) note_short_shards(t, t->val_ds, t->val_flag);
    ZOFF_TRY(same_data(t));
    return t->o.eval_iters > 0 ? open_validation(t, split_val, lo.val_tokens) : ZOFF_OK;
}
