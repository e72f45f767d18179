/* The rules of --load and --save: what a resume may change and what it may not, a --save
 * directory that holds another run's checkpoints, and restoring the training state. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/trainer_internal.h"

zoff_status trainer_open_load(zoff_trainer *t) {
    if (!t->o.load_dir) return ZOFF_OK;
    if (t->o.init_from)
        return zoff_error(ZOFF_ERR_INVALID, "--init-from and --load exclude each other: --load resumes a run "
                                            "(weights, optimizer state, data position), --init-from starts a new "
                                            "run from weights");
    if (t->o.overwrite)
        return zoff_error(ZOFF_ERR_INVALID, "--overwrite and --load exclude each other: --load continues a run, "
                                            "--overwrite deletes the checkpoints in --save to start a new one");
    zoff_status s = zoff_ckpt_open(t->o.load_dir, 0, &t->rd);
    char *config_text = NULL;
    if (s == ZOFF_OK) s = zoff_train_ckpt_read_meta(t->rd, &t->resume, &config_text);
    if (s == ZOFF_OK && !t->resume.settings.known && config_text) { /* written before "settings" existed */
        zoff_config old;
        if (zoff_config_load_string(config_text, "the checkpoint's config", &old) == ZOFF_OK &&
            zoff_config_resolve_batch(&old, zoff_ckpt_reader_nranks(t->rd)) == ZOFF_OK)
            t->resume.settings = trainer_settings_of(&old, zoff_ckpt_reader_nranks(t->rd));
        zoff_config_free(&old);
    }
    t->resume_config = config_text;
    return s != ZOFF_OK ? zoff_error_context(s, "--load") : ZOFF_OK;
}

static const char *shape_text(const zoff_trainer *t, char *buf, size_t cap) {
    const zoff_gpt2_shape *r = &t->resume.shape;
    char nl[40], nh[40];
    snprintf(buf, cap, "%s, width %lld, %s, %lld positions, vocab %lld, seq %lld",
             zoff_format_count(r->num_layers, "layer", nl, sizeof nl), (long long)r->hidden_size,
             zoff_format_count(r->num_heads, "head", nh, sizeof nh), (long long)r->max_seq_len,
             (long long)r->vocab_size, (long long)t->resume.seq_len);
    return buf;
}

#define FROM_INIT "start a new run from its weights (zoff export, then zoff train --init-from)"

/* The model shape and sequence length the flags or the config give (0 = not given) must be the
 * checkpoint's: its weights, optimizer state and data position are for that shape. */
static zoff_status check_shape(const zoff_trainer *t) {
    const zoff_trainer_options *a = &t->o;
    const zoff_model_config *m = &t->cfg.model;
    const zoff_gpt2_shape *r = &t->resume.shape;
    struct { const char *key; int64_t given, stored; } k[] = {
        {"num_layers", a->num_layers ? a->num_layers : m->num_layers, r->num_layers},
        {"hidden_size", a->hidden_size ? a->hidden_size : m->hidden_size, r->hidden_size},
        {"num_attention_heads", a->num_heads ? a->num_heads : m->num_attention_heads, r->num_heads},
        {"max_position_embeddings", a->max_pos ? a->max_pos : m->max_position_embeddings, r->max_seq_len},
        {"vocab_size", a->vocab_size ? a->vocab_size : m->vocab_size, r->vocab_size},
        {"seq_length", t->T_given, t->resume.seq_len},
    };
    char buf[256];
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].given && k[i].given != k[i].stored)
            return zoff_error(ZOFF_ERR_INVALID,
                              "--load %s holds a model with %s, which the flags or the config contradict: %s is "
                              "%lld in the checkpoint but %lld here. Resume without it, or " FROM_INIT,
                              a->load_dir, shape_text(t, buf, sizeof buf), k[i].key, (long long)k[i].stored,
                              (long long)k[i].given);
    return ZOFF_OK;
}

/* The update's settings the checkpoint's settings record leaves out, against its stored config
 * (a checkpoint without one: nothing to compare): a line for each change. */
static void say_config_changes(const zoff_trainer *t) {
    zoff_config old;
    if (!t->resume_config || zoff_config_load_string(t->resume_config, "the checkpoint's config", &old) != ZOFF_OK) {
        zoff_clear_error();
        return;
    }
    const zoff_optimizer_config *a = &old.optimizer, *b = &t->cfg.optimizer;
    struct { const char *key; double was, now; } k[] = {
        {"optimizer.params.betas[0]", a->beta1, b->beta1},
        {"optimizer.params.betas[1]", a->beta2, b->beta2},
        {"optimizer.params.eps", a->eps, b->eps},
        {"optimizer.params.weight_decay", a->weight_decay, b->weight_decay},
        {"zero_optimization.stage", old.zero.stage, t->cfg.zero.stage},
        {"fp16.loss_scale", old.fp16.loss_scale, t->cfg.fp16.loss_scale},
        {"fp16.initial_scale_power", old.fp16.initial_scale_power, t->cfg.fp16.initial_scale_power},
        {"fp16.loss_scale_window", old.fp16.loss_scale_window, t->cfg.fp16.loss_scale_window},
        {"fp16.hysteresis", old.fp16.hysteresis, t->cfg.fp16.hysteresis},
        {"fp16.consecutive_hysteresis", old.fp16.consecutive_hysteresis, t->cfg.fp16.consecutive_hysteresis},
        {"fp16.min_loss_scale", old.fp16.min_loss_scale, t->cfg.fp16.min_loss_scale},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (k[i].was != k[i].now) trainer_say(t, "resume: %s %.15g -> %.15g", k[i].key, k[i].was, k[i].now);
    zoff_config_free(&old);
}

/* Settings that change the meaning of the stored optimizer state are refused; those a resume
 * may change are printed, one line each. */
zoff_status trainer_check_resume(zoff_trainer *t) {
    ZOFF_TRY(check_shape(t));
    if (t->o.seed != t->resume.seed) /* the data order goes on from the checkpoint's position */
        trainer_say(t, "resume: the run's seed %llu is kept, not %llu: --seed sets a new run's weights and data order",
                    (unsigned long long)t->resume.seed, (unsigned long long)t->o.seed);
    const zoff_train_settings *was = &t->resume.settings;
    if (!was->known) return ZOFF_OK; /* a checkpoint without settings or config: nothing to compare */
    zoff_train_settings now = trainer_settings_of(&t->cfg, t->info.world);
    /* Adam and AdamW keep the same state (step, m, v): a change between them is printed below */
    bool adam_was = !strcmp(was->optimizer, "Adam") || !strcmp(was->optimizer, "AdamW");
    bool adam_now = !strcmp(now.optimizer, "Adam") || !strcmp(now.optimizer, "AdamW");
    struct { const char *key, *was, *now; } fatal[] = {
        {"optimizer.type", adam_was && adam_now ? now.optimizer : was->optimizer, now.optimizer},
        {"precision (bf16 / fp16 / fp32)", was->precision, now.precision},
    };
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        if (strcmp(fatal[i].was, fatal[i].now))
            return zoff_error(ZOFF_ERR_CONFIG,
                              "--load %s: %s is %s in the checkpoint but %s in this config: the stored optimizer "
                              "state would be read as another's. Resume with %s, or " FROM_INIT,
                              t->o.load_dir, fatal[i].key, fatal[i].was, fatal[i].now, fatal[i].was);
    struct { const char *key; double was, now; } num[] = {
        {"optimizer.params.lr", was->lr, now.lr},
        {"scheduler.params.warmup_num_steps", (double)was->warmup_steps, (double)now.warmup_steps},
        {"scheduler.params.total_num_steps", (double)was->total_steps, (double)now.total_steps},
        {"train_micro_batch_size_per_gpu", (double)was->micro_batch, (double)now.micro_batch},
        {"gradient_accumulation_steps", (double)was->accumulation, (double)now.accumulation},
        {"gradient_clipping", was->gradient_clipping, now.gradient_clipping},
        {"ranks", (double)was->world_size, (double)now.world_size},
    };
    if (strcmp(was->optimizer, now.optimizer))
        trainer_say(t, "resume: optimizer.type %s -> %s (the same state: step, m, v)", was->optimizer, now.optimizer);
    if (strcmp(was->scheduler, now.scheduler))
        trainer_say(t, "resume: scheduler.type %s -> %s", was->scheduler, now.scheduler);
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        bool said = t->ranks_change_said && /* stored_batch's one line said these two */
                    (!strcmp(num[i].key, "ranks") || !strcmp(num[i].key, "gradient_accumulation_steps"));
        if (num[i].was != num[i].now && !said)
            trainer_say(t, "resume: %s %g -> %g", num[i].key, num[i].was, num[i].now);
    }
    say_config_changes(t);
    return ZOFF_OK;
}

/* The newest complete checkpoint in dir (-1: none, or no such directory); rank 0's view. */
static zoff_status latest_in(zoff_trainer *t, const char *dir, int64_t *latest) {
    struct stat st;
    *latest = -1;
    if (t->info.rank == 0 && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) ZOFF_TRY(zoff_ckpt_latest(dir, latest));
    if (t->info.world > 1) ZOFF_TRY(zoff_comm_broadcast_bytes(t->comm, latest, sizeof *latest, 0));
    return ZOFF_OK;
}

/* Rank 0: whether --save is the folder of the run --load resumes (the folder given, or the
 * one holding the step folder given). */
static bool save_is_load_run(const zoff_trainer *t) {
    char dir[4200], run[PATH_MAX], save[PATH_MAX];
    if (zoff_ckpt_run_dir(t->o.load_dir, dir, sizeof dir) != ZOFF_OK) {
        zoff_clear_error();
        return false;
    }
    return realpath(dir, run) && realpath(t->o.save_dir, save) && !strcmp(run, save);
}

/* Checkpoints already in --save would mix with this run's: the newest step of either shadows the
 * other's for --load, sample and export, and a step of both names collides at its save.
 * - a new run (no --load) into a folder with checkpoints: refused (--overwrite deletes them);
 * - a resume into another run's folder with checkpoints: refused;
 * - a resume of an earlier step of the run in --save (its newer steps still there): refused
 *   before training, not at the first save that meets one. */
zoff_status trainer_check_save_dir(zoff_trainer *t) {
    int64_t latest;
    ZOFF_TRY(latest_in(t, t->o.save_dir, &latest));
    if (latest < 0 || t->o.overwrite) return ZOFF_OK;
    if (!t->o.load_dir)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--save %s already holds checkpoints of a run (the newest: step %lld): continue it with "
                          "--load %s, start over with --overwrite (deletes its checkpoints), or choose another --save",
                          t->o.save_dir, (long long)latest, t->o.save_dir);
    int32_t same = t->info.rank == 0 && save_is_load_run(t);
    if (t->info.world > 1) ZOFF_TRY(zoff_comm_broadcast_bytes(t->comm, &same, sizeof same, 0));
    if (!same)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--save %s holds checkpoints of another run (the newest: step %lld) than the one --load %s "
                          "resumes: the two runs' steps and metrics.jsonl would mix, and the newest step of either "
                          "would be what --load, sample and export take. Choose an empty --save, or --save the "
                          "loaded run's own folder",
                          t->o.save_dir, (long long)latest, t->o.load_dir);
    if (latest > t->resume.step)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--load %s resumes step %lld, but --save %s also holds newer steps (up to %lld): this run's "
                          "checkpoints would collide with them or be shadowed by them. Move the step folders after "
                          "step %lld out of %s (to keep them), or choose another --save",
                          t->o.load_dir, (long long)t->resume.step, t->o.save_dir, (long long)latest,
                          (long long)t->resume.step, t->o.save_dir);
    return ZOFF_OK;
}

/* Rank 0's part of trainer_lock_save_dir. */
static zoff_status lock_save(zoff_trainer *t, bool create) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" ZOFF_TRAIN_SAVE_LOCK, t->o.save_dir);
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
    if (fd < 0 && !create) return ZOFF_OK; /* no lock file yet (or no folder): nobody trains into it */
    if (fd < 0)
        return zoff_error(zoff_status_of_path_errno(errno), "--save %s: cannot create its lock file %s: %s",
                          t->o.save_dir, path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char who[200] = "";
        ssize_t n = pread(fd, who, sizeof who - 1, 0);
        close(fd);
        who[n > 0 ? n : 0] = '\0';
        who[strcspn(who, "\n")] = '\0';
        if (e == EWOULDBLOCK)
            return zoff_error(ZOFF_ERR_INVALID,
                              "--save %s is in use by another zoff train (%s): two runs in one folder would mix "
                              "their checkpoints and metrics.jsonl; wait for it to end, or choose another --save",
                              t->o.save_dir, who[0] ? who : "which one: unknown");
        zoff_log(ZOFF_LOG_WARN, "--save %s: its file system does not lock files (%s): nothing stops a second run "
                                "from training into it at the same time", t->o.save_dir, strerror(e));
        return ZOFF_OK;
    }
    char who[200], host[64] = "?", when[32] = "?";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    if (localtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    int n = snprintf(who, sizeof who, "pid %d on %s, started %s\n", (int)getpid(), host, when);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, who, (size_t)n, 0) != n) { /* the lock holds without the note */
    }
    t->lock_fd = fd;
    return ZOFF_OK;
}

/* One run at a time in a --save folder: rank 0 holds an flock on SAVE/.zoff-lock for the whole run
 * (the kernel lets go of it however the process ends, SIGKILL included; the file stays). Called
 * before the folder's checkpoints are looked at (create false: only if the file is there) and
 * once the folder exists (create true). */
zoff_status trainer_lock_save_dir(zoff_trainer *t, bool create) {
    zoff_status s = ZOFF_OK;
    if (t->info.rank == 0 && t->lock_fd < 0) s = lock_save(t, create);
    if (t->info.world > 1) {
        int32_t bad = s != ZOFF_OK;
        ZOFF_TRY(zoff_comm_broadcast_bytes(t->comm, &bad, sizeof bad, 0));
        if (bad && t->info.rank > 0)
            return zoff_error(ZOFF_ERR_INVALID, "--save %s: rank 0 could not take it (its message says why)",
                              t->o.save_dir);
    }
    return s;
}

/* Remove one step directory (its files, then itself), renamed out of the way first so that a
 * crash half-way leaves no half checkpoint under a step name. */
static zoff_status remove_step(const char *dir, int64_t step) {
    char sd[4200], gone[4300];
    ZOFF_TRY(zoff_ckpt_step_path(dir, step, sd, sizeof sd));
    snprintf(gone, sizeof gone, "%s/.zoff-overwritten-%lld-%d", dir, (long long)step, (int)getpid());
    if (rename(sd, gone) != 0) return zoff_error(ZOFF_ERR_IO, "--overwrite: cannot remove %s: %s", sd, strerror(errno));
    DIR *d = opendir(gone);
    if (!d) return zoff_error(ZOFF_ERR_IO, "--overwrite: cannot read %s: %s", gone, strerror(errno));
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        char f[4600];
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(f, sizeof f, "%s/%s", gone, de->d_name);
        unlink(f);
    }
    closedir(d);
    if (rmdir(gone) != 0) return zoff_error(ZOFF_ERR_IO, "--overwrite: cannot remove %s: %s", gone, strerror(errno));
    return ZOFF_OK;
}

/* --overwrite: delete the checkpoints in --save (rank 0; after every check passed). */
zoff_status trainer_overwrite(zoff_trainer *t) {
    if (!t->o.overwrite || t->info.rank != 0) return ZOFF_OK;
    int n = 0;
    for (int64_t latest;;) {
        ZOFF_TRY(zoff_ckpt_latest(t->o.save_dir, &latest));
        if (latest < 0) break;
        ZOFF_TRY(remove_step(t->o.save_dir, latest));
        n++;
    }
    if (n) trainer_say(t, "--overwrite: removed %d checkpoint(s) of an earlier run from %s", n, t->o.save_dir);
    return ZOFF_OK;
}

/* --keep-last applies from the start (rank 0, after the load succeeded): a folder holding more
 * checkpoints than kept (a run saved without --keep-last until its disk filled) keeps its newest
 * --keep-last now, the loaded one among them (an older step is loaded into its folder only when
 * none is newer), so that the first save has their room; before, they were pruned only after a
 * save, which the full disk refused. */
zoff_status trainer_keep_last(zoff_trainer *t) {
    if (!t->o.keep_last || t->o.no_checkpoint || t->info.rank != 0) return ZOFF_OK;
    zoff_status s = zoff_ckpt_prune(t->o.save_dir, (int)t->o.keep_last);
    return s != ZOFF_OK ? zoff_error_context(s, "--keep-last") : ZOFF_OK;
}

/* --load: the optimizer state (resharded), the engine's scalars, the data position. */
/* The delayed update's weights pending at the save: the next forward uses the device weights
 * the checkpoint holds, as the uninterrupted run's does. */
static zoff_status restore_device_weights(zoff_trainer *t) {
    const zoff_zero_config *z = &t->cfg.zero;
    const zoff_train_meta *m = &t->resume;
    bool delayed = z->delayed_param_update && m->engine.steps_taken > z->delayed_param_update_warmup;
    if (m->weights_pending < 0 && delayed)
        zoff_log(ZOFF_LOG_WARN,
                 "resume: the checkpoint of step %lld was written by an earlier zoff that did not store the delayed "
                 "update's device weights: the next forward uses the newest master weights, so this delayed run is "
                 "not bit-identical to an uninterrupted one",
                 (long long)m->step);
    if (m->weights_pending <= 0) return ZOFF_OK;
    bool restored = false;
    ZOFF_TRY(zoff_train_ckpt_read_device_weights(t->rd, t->eng, t->info.num_params, &restored));
    if (!restored)
        trainer_say(t, "resume: the checkpoint's delayed-update weights were pending; without the delayed update "
                       "the device takes the newest master weights");
    return ZOFF_OK;
}

/* A data position refused (other shards than the saved run's): which shard was removed, added or
 * resized since the save, where the checkpoint records its shards. */
static zoff_status with_shard_changes(zoff_trainer *t, zoff_status s) {
    char changes[2048], msg[2048];
    zoff_train_ckpt_shard_changes(t->rd, t->train_ds, changes, sizeof changes);
    if (!changes[0]) return s;
    snprintf(msg, sizeof msg, "%s", zoff_last_error());
    return zoff_error(s, "%s; since the save: %s", msg, changes);
}

zoff_status trainer_restore(zoff_trainer *t) {
    if (!t->rd) return ZOFF_OK;
    zoff_status s = zoff_train_ckpt_read_state(t->rd, t->eng, t->info.num_params);
    if (s == ZOFF_OK) s = zoff_engine_set_scalars(t->eng, &t->resume.engine);
    zoff_engine_scalars sc;
    zoff_engine_get_scalars(t->eng, &sc);
    if (s == ZOFF_OK && sc.loss_scale != t->resume.engine.loss_scale) /* zoff_loss_scaler_restore's rule */
        trainer_say(t, "resume: loss scale %.17g (this config's fp16 settings), not the checkpoint's %.17g",
                    sc.loss_scale, t->resume.engine.loss_scale);
    if (s == ZOFF_OK) s = restore_device_weights(t);
    if (s == ZOFF_OK && (s = zoff_loader_set_state(t->train_ld, &t->resume.loader)) != ZOFF_OK)
        s = with_shard_changes(t, s);
    zoff_ckpt_close(t->rd);
    t->rd = NULL;
    if (s != ZOFF_OK) return zoff_error_context(s, "--load");
    t->info.start_step = t->info.step = t->resume.step;
    t->o.seed = t->resume.seed; /* the run's, as its data order (the loader's restored key): the next save records it */
    t->info.consumed_tokens = t->resume.consumed_tokens;
    /* the samples trained so far, also when this resume takes another global batch (DeepSpeed's global_samples) */
    t->samples_base_step = t->resume.step;
    t->samples_base = t->resume.consumed_tokens > 0 && t->resume.seq_len > 0
                          ? (int64_t)llround(t->resume.consumed_tokens / (double)t->resume.seq_len)
                          : t->resume.step * t->info.micro_batch * t->info.accumulation * t->info.world;
    trainer_say(t, "resumed from %s at step %lld", t->o.load_dir, (long long)t->info.step);
    return ZOFF_OK;
}
