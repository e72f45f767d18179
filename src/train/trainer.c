/* The trainer (include/zoff/train.h): create (validate everything, then build), one training
 * step, evaluation, checkpoints, and one cleanup path. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/trainer_internal.h"
#include "zoff/resources.h"
#include "zoff/schedule.h"

static int64_t samples_at(const zoff_trainer *t, int64_t step); /* the monitors' x axis */

void trainer_say(const zoff_trainer *t, const char *fmt, ...) {
    if (t->o.quiet || t->info.rank != 0) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    zoff_log(ZOFF_LOG_INFO, "%s", buf);
}

/* Join the background checkpoint in flight, if any: its error (naming the step and the file)
 * is this call's. The one place that waits for the writer. in_step: called inside a training
 * step, before its count goes up (the wait is that step's ckpt_wait). A metrics line says how many
 * steps ran (or began) while the save was in flight and how long the loop waited for it outside a
 * step (at the next save, or the final one) (bench/ckpt_overlap.sh). */
static zoff_status start_due_save(zoff_trainer *t);

static zoff_status wait_background_save(zoff_trainer *t, double *waited, bool in_step) {
    ZOFF_TRY(start_due_save(t)); /* a save due: started first (joining it is what the caller wants) */
    if (!t->bg) return ZOFF_OK;
    double t0 = zoff_now();
    zoff_train_ckpt_done d = {0};
    zoff_status s = zoff_train_ckpt_save_wait(t->bg, &d);
    t->bg = NULL;
    const double w = zoff_now() - t0;
    if (waited) *waited += w;
    if (s != ZOFF_OK) return zoff_error_context(s, "checkpoint");
    const zoff_engine_snapshot_stats *ss = &d.snapshot;
    char b[5][32], snap[448] = "", dev[160] = "";
    if (d.snapshot_used && ss->device)
        snprintf(dev, sizeof dev, "; the device's %s of the state copied in %.2f s, the training waited %.2f s for it",
                 zoff_format_bytes(ss->device, b[3], 32), ss->device_seconds, ss->device_wait);
    if (d.snapshot_used)
        snprintf(snap, sizeof snap, "; %s of the state staged for the updates (%.0f%% in their own pass, budget %s%s%s), "
                 "%s written from there in place, updates waited %.2f s%s", zoff_format_bytes(ss->staged, b[0], 32),
                 ss->staged ? 100.0 * (double)ss->staged_in_update / (double)ss->staged : 0.0,
                 zoff_format_bytes(ss->budget, b[1], 32), ss->prefaulted ? ", faulted in ahead " : "",
                 ss->prefaulted ? zoff_format_bytes(ss->prefaulted, b[2], 32) : "",
                 zoff_format_bytes(d.in_place, b[4], 32), ss->update_wait, dev);
    trainer_say(t, "checkpoint written in the background in %.2f s (writer thread CPU %.2f s%s)", d.seconds,
                d.cpu_seconds, snap);
    return trainer_metrics_line(t,
                                "{\"step\":%lld,\"ckpt_step\":%lld,\"ckpt_steps_overlapped\":%lld,\"ckpt_seconds\":%.6f,"
                                "\"ckpt_start\":%.6f,\"ckpt_staged\":%zu,\"ckpt_staged_in_update\":%zu,"
                                "\"ckpt_update_wait\":%.6f,\"ckpt_join_wait\":%.6f,\"ckpt_prefaulted\":%zu,"
                                "\"ckpt_device_copied\":%zu,\"ckpt_device_copy_s\":%.6f,\"ckpt_device_wait_s\":%.6f,\"ckpt_in_place\":%zu,"
                                "\"ckpt_start_in_step\":%s}\n",
                                (long long)t->info.step, (long long)t->bg_step,
                                (long long)(t->info.step + in_step - t->bg_step), d.seconds, t->bg_start_s, ss->staged,
                                ss->staged_in_update, ss->update_wait, in_step ? 0.0 : w, ss->prefaulted, ss->device,
                                ss->device_seconds, ss->device_wait, d.in_place, t->bg_start_in_step ? "true" : "false");
}

void zoff_trainer_destroy(zoff_trainer *t) {
    if (!t) return;
    if (wait_background_save(t, NULL, false) != ZOFF_OK) zoff_log(ZOFF_LOG_ERROR, "%s", zoff_last_error());
    if (t->metrics) fclose(t->metrics);
    if (t->timeline) fclose(t->timeline);
    trainer_monitor_close(t->monitor);
    if (t->dev) {
        zoff_device_free(t->dev, t->dx);
        zoff_device_free(t->dev, t->dy);
    }
    zoff_train_stack_destroy(&t->stack);
    free(t->hx);
    free(t->hy);
    zoff_gpt2_st_loader_close(t->init_ld);
    zoff_st_close(t->init_st);
    zoff_ckpt_close(t->rd);
    free(t->resume_config);
    if (t->lock_fd >= 0) close(t->lock_fd); /* lets go of the --save folder */
    zoff_loader_free(t->train_ld);
    zoff_loader_free(t->val_ld);
    zoff_dataset_free(t->train_ds);
    zoff_dataset_free(t->val_ds);
    zoff_tokenizer_free(t->tok);
    zoff_config_free(&t->cfg);
    free(t);
}

/* The safetensors file --init-from names: the file itself, or a folder's model.safetensors (what
 * zoff export --output DIR/ writes, and a Hugging Face model folder). A zoff checkpoint folder is
 * refused with the two ways to use it. */
static zoff_status init_from_file(const char *path, char *file, size_t cap) {
    int r = zoff_gpt2_st_resolve(path, file, cap);
    if (r == 1) zoff_log(ZOFF_LOG_INFO, "--init-from: reading %s", file);
    if (r >= 0) return ZOFF_OK; /* not a folder: zoff_st_open says what is wrong, if anything */
    char step_dir[4200];
    int64_t step = -1;
    bool checkpoint = zoff_ckpt_resolve(path, step_dir, sizeof step_dir, &step) == ZOFF_OK;
    zoff_clear_error();
    if (checkpoint)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--init-from %s is a zoff checkpoint (step %lld): --load %s resumes it; to start a new run "
                          "from its weights, zoff export --load %s --format fp32 --output weights.safetensors, then "
                          "--init-from weights.safetensors",
                          path, (long long)step, path, path);
    char hint[1024];
    zoff_gpt2_st_folder_hint(path, hint, sizeof hint);
    return zoff_error(ZOFF_ERR_INVALID,
                      "--init-from %s is a folder without model.safetensors%s", path,
                      hint[0] ? hint : ": give the .safetensors file (zoff export writes one)");
}

/* Everything that can be refused is checked here, before anything is written (the shards
 * are opened next: trainer_open_data). */
static zoff_status validate(zoff_trainer *t) {
    ZOFF_TRY(trainer_open_load(t)); /* first: without --config, the run takes the checkpoint's */
    ZOFF_TRY(trainer_load_config(t));
    zoff_status s = zoff_tokenizer_open(t->rd ? t->resume.tokenizer : t->o.tokenizer, &t->tok);
    if (s != ZOFF_OK) return zoff_error_context(s, "tokenizer");
    t->info.tokenizer = zoff_tokenizer_name(t->tok);
    if (t->o.init_from) { /* its model gives the sizes not given (trainer_resolve_shape) */
        char file[4200];
        ZOFF_TRY(init_from_file(t->o.init_from, file, sizeof file));
        s = zoff_st_open(file, &t->init_st);
        if (s != ZOFF_OK) return zoff_error_context(s, "--init-from");
    }
    ZOFF_TRY(trainer_resolve_shape(t));
    if (t->init_st) { /* checked against the model shape */
        s = zoff_gpt2_st_check(t->init_st, &t->info.shape);
        if (s != ZOFF_OK) return zoff_error_context(s, "--init-from");
    }
    ZOFF_TRY(trainer_check_host_memory(t));
    ZOFF_TRY(trainer_check_save_disk(t));
    ZOFF_TRY(trainer_lock_save_dir(t, false)); /* a run still training into --save: say that, not its checkpoints */
    return trainer_check_save_dir(t);
}

static const char *const startup_names[ZOFF_STARTUP_PHASES] = {
    "config", "data", "model", "initial_weights", "engine_alloc", "first_touch", "pinning", "other"};

void zoff_startup_format(const double *phase_s, bool json, char *buf, size_t size) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < ZOFF_STARTUP_PHASES && used < size; i++) {
        int w = json ? snprintf(buf + used, size - used, ",\"startup_%s\":%.3f", startup_names[i], phase_s[i])
                     : snprintf(buf + used, size - used, "%s%s %.2f%s", i ? ", " : "", startup_names[i], phase_s[i],
                                i == ZOFF_STARTUP_PHASES - 1 ? " s" : "");
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* The engine's part of trainer_build's time into its phases; the rest of it is the model's. */
static void engine_phases(zoff_trainer *t, double build_s) {
    zoff_engine_startup es;
    zoff_engine_startup_times(t->eng, &es);
    double *p = t->info.startup_phase_s;
    p[ZOFF_STARTUP_MODEL] = build_s - es.total;
    p[ZOFF_STARTUP_INITIAL_WEIGHTS] = es.initial_weights;
    p[ZOFF_STARTUP_FIRST_TOUCH] = es.first_touch;
    p[ZOFF_STARTUP_PINNING] = es.pinning;
    p[ZOFF_STARTUP_ENGINE_ALLOC] = es.total - es.initial_weights - es.first_touch - es.pinning;
}

static zoff_status create(zoff_trainer *t) {
    double *p = t->info.startup_phase_s, t0 = zoff_now(), mark = t0;
    ZOFF_TRY(validate(t));
    p[ZOFF_STARTUP_CONFIG] = zoff_lap(&mark);
    ZOFF_TRY(trainer_open_data(t));
    p[ZOFF_STARTUP_DATA] = zoff_lap(&mark);
    ZOFF_TRY(trainer_make_output_dir(t));
    ZOFF_TRY(trainer_lock_save_dir(t, true));
    p[ZOFF_STARTUP_OTHER] = zoff_lap(&mark);
    ZOFF_TRY(trainer_build(t));
    engine_phases(t, zoff_lap(&mark));
    ZOFF_TRY(trainer_overwrite(t));
    ZOFF_TRY(trainer_restore(t));
    ZOFF_TRY(trainer_keep_last(t));
    ZOFF_TRY(trainer_open_metrics(t));
    if (t->info.rank == 0)
        ZOFF_TRY(trainer_monitor_open(&t->cfg, t->o.load_dir ? samples_at(t, t->info.step) + 1 : -1, &t->monitor));
    p[ZOFF_STARTUP_OTHER] += zoff_lap(&mark);
    t->made_dir[0] = 0; /* files exist from here on: the directory stays */
    t->info.startup_s = mark - t0;
    char fields[512];
    zoff_startup_format(p, true, fields, sizeof fields);
    return trainer_metrics_line(t, "{\"step\":%lld,\"startup_time\":%.3f%s}\n", (long long)t->info.step,
                                t->info.startup_s, fields);
}

zoff_status zoff_trainer_create(const zoff_trainer_options *opts, zoff_comm *comm, zoff_trainer **out) {
    *out = NULL;
    zoff_trainer *t = calloc(1, sizeof *t);
    if (!t) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the trainer");
    t->o = *opts;
    t->comm = comm;
    t->info.rank = zoff_comm_rank(comm);
    t->info.world = zoff_comm_size(comm);
    t->lock_fd = -1;
    if (t->info.rank > 0) t->o.quiet = true; /* progress from rank 0 only; errors from every rank */
    zoff_config_defaults(&t->cfg);
    zoff_status s = create(t);
    if (s != ZOFF_OK) {
        trainer_remove_made_dir(t);
        zoff_trainer_destroy(t);
        return s;
    }
    *out = t;
    return ZOFF_OK;
}

const zoff_trainer_info *zoff_trainer_info_get(const zoff_trainer *t) { return &t->info; }
zoff_device *zoff_trainer_device(zoff_trainer *t) { return t->dev; }
zoff_engine *zoff_trainer_engine(zoff_trainer *t) { return t->eng; }
zoff_gpt2 *zoff_trainer_model(zoff_trainer *t) { return t->model; }
const zoff_config *zoff_trainer_config(const zoff_trainer *t) { return &t->cfg; }

/* Mean over ranks (loss, validation loss); the identity with one rank. */
static zoff_status mean_over_ranks(zoff_trainer *t, double *v) {
    if (t->info.world == 1) return ZOFF_OK;
    ZOFF_TRY(zoff_comm_allreduce_f64(t->comm, v, 1, ZOFF_REDUCE_SUM));
    *v /= t->info.world;
    return ZOFF_OK;
}

zoff_status zoff_trainer_should_stop(zoff_trainer *t, bool *stop) {
    double sig = t->o.stop ? (double)*t->o.stop : 0;
    if (t->info.world > 1) ZOFF_TRY(zoff_comm_allreduce_f64(t->comm, &sig, 1, ZOFF_REDUCE_MAX));
    if (t->o.stop) *t->o.stop = (sig_atomic_t)sig; /* a signal seen by any rank stops every rank */
    *stop = sig != 0;
    return ZOFF_OK;
}

/* One micro-batch: tokens to the device, forward, backward (gradients stream to the engine). */
static zoff_status micro_batch(zoff_trainer *t, bool boundary, float *loss, double *t_fwd, double *t_bwd,
                               double *t_ckpt_wait) {
    const int64_t B = t->info.micro_batch, T = t->info.seq_len;
    const size_t bytes = (size_t)(B * T) * sizeof(int32_t);
    zoff_stream *st = zoff_device_stream(t->dev);
    double ta = zoff_now();
    zoff_status s = zoff_loader_next(t->train_ld, t->hx, t->hy);
    if (s != ZOFF_OK) return zoff_error_context(s, "data");
    s = zoff_memcpy_async(st, t->dx, t->hx, bytes, ZOFF_COPY_H2D);
    if (s == ZOFF_OK) s = zoff_memcpy_async(st, t->dy, t->hy, bytes, ZOFF_COPY_H2D);
    /* the loss gradient comes out of the forward's cross-entropy pass: its scale is known now (the
     * loss scale changes only in zoff_engine_step) */
    if (s == ZOFF_OK) s = zoff_gpt2_forward_train(t->model, t->dx, t->dy, B, T, zoff_engine_backward_scale(t->eng));
    double tb = zoff_now();
    if (boundary) { /* super_offload speculates this step's update during this backward */
        zoff_engine_set_lr(t->eng, zoff_lr_at(&t->cfg.scheduler, t->cfg.optimizer.lr, zoff_engine_steps_taken(t->eng)));
        /* a checkpoint still reading the state finishes before a speculative update starts */
        if (t->cfg.zero.offload_optimizer.super_offload) ZOFF_TRY(wait_background_save(t, t_ckpt_wait, true));
    }
    zoff_engine_begin_backward(t->eng, boundary);
    if (s == ZOFF_OK) s = zoff_gpt2_backward(t->model, zoff_engine_grad_ready, t->eng);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
    /* the losses were copied to the host during the step: no wait between forward and backward */
    if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(t->model, loss);
    if (s != ZOFF_OK) return zoff_error_context(s, "forward/backward");
    *t_fwd += tb - ta;
    *t_bwd += zoff_now() - tb;
    return ZOFF_OK;
}

/* Samples trained after `step` optimizer steps (all ranks): the monitors' x axis, as DeepSpeed's global_samples. */
static int64_t samples_at(const zoff_trainer *t, int64_t step) {
    return t->samples_base + (step - t->samples_base_step) * t->info.micro_batch * t->info.accumulation * t->info.world;
}

/* DeepSpeed's monitor events of a step: the loss at the samples before it (its backward logs it),
 * the lr the next step uses and the loss scale after it (its step() logs them, after the update). */
static zoff_status monitor_step(zoff_trainer *t, const zoff_train_step_result *r) {
    if (!t->monitor) return ZOFF_OK;
    const int64_t before = samples_at(t, r->step - 1), after = samples_at(t, r->step);
    ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/train_loss", r->loss, before));
    ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/lr",
                                   zoff_lr_at(&t->cfg.scheduler, t->cfg.optimizer.lr, zoff_engine_steps_taken(t->eng)),
                                   after));
    if (t->info.dtype == ZOFF_F16) {
        zoff_engine_scalars sc;
        zoff_engine_get_scalars(t->eng, &sc);
        ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/loss_scale", sc.loss_scale, after));
    }
    if (t->cfg.wall_clock_breakdown) { /* DeepSpeed's timers, in ms, at the samples after the step */
        ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/elapsed_time_ms_forward", 1e3 * r->t_forward, after));
        ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/elapsed_time_ms_backward", 1e3 * r->t_backward, after));
        ZOFF_TRY(trainer_monitor_event(t->monitor, "Train/Samples/elapsed_time_ms_step", 1e3 * r->info.t_step, after));
    }
    return ZOFF_OK; /* each event is in its files already (written whole, unbuffered: src/train/monitor.c) */
}

static zoff_status write_step_metrics(zoff_trainer *t, const zoff_train_step_result *r) {
    const zoff_step_info *si = &r->info;
    double other = fmax(0.0, r->step_time - r->t_forward - r->t_backward - si->t_wait_grads - si->t_host -
                                 si->t_device - si->t_wait_weights - r->t_ckpt_wait);
    char mom[48] = "", loss[32], norm[32]; /* the momentum, where the schedule moves it */
    if (zoff_schedule_cycles_betas(&t->cfg.scheduler, &t->cfg.optimizer))
        snprintf(mom, sizeof mom, ",\"beta1\":%.6f", r->beta1);
    zoff_status s = trainer_metrics_line(
        t,
        "{\"step\":%lld,\"loss\":%s,\"lr\":%.6e%s,\"grad_norm\":%s,\"tokens_per_s\":%.1f,\"step_time\":%.6f,"
        "\"forward\":%.6f,\"backward\":%.6f,\"wait_grads\":%.6f,\"host_step\":%.6f,\"device_step\":%.6f,"
        "\"wait_weights\":%.6f,\"other\":%.6f,\"loss_scale\":%.17g,\"skipped\":%s,\"rollbacks\":%lld,\"ckpt_wait\":%.6f,"
        "\"clock\":%.6f}\n",
        (long long)r->step, zoff_format_fixed((float)r->loss, 6, loss, sizeof loss), r->lr, mom,
        zoff_format_fixed(si->grad_norm, 6, norm, sizeof norm), r->tokens_per_s, r->step_time, r->t_forward,
        r->t_backward, si->t_wait_grads, si->t_host, si->t_device, si->t_wait_weights, other, si->loss_scale,
        si->skipped ? "true" : "false", (long long)si->rollbacks, r->t_ckpt_wait, zoff_now());
    if (s == ZOFF_OK) s = monitor_step(t, r);
    return s != ZOFF_OK ? zoff_error_context(s, "metrics") : ZOFF_OK;
}

static int64_t snapshot_budget(const zoff_trainer *t);

bool zoff_trainer_eval_due(const zoff_trainer *t) {
    const int64_t ei = t->o.eval_interval, step = t->info.step;
    return ei > 0 && t->info.eval_iters > 0 && step > 0 && step % ei == 0 && step < t->o.train_iters;
}

int64_t zoff_trainer_next_save(const zoff_trainer *t) {
    const int64_t si = t->o.save_interval;
    if (si <= 0) return -1;
    const int64_t next = (t->info.step + si - 1) / si * si;
    return next < t->o.train_iters ? next : -1;
}

/* After this run's first step, when periodic saves will run in the background through the
 * snapshot: its arena, allocated and faulted in on a background thread now, so that the first
 * save's updates do not fault it (zoff_engine_snapshot_prepare). Not at start-up: that is
 * counted, and the host memory left is known only now. Best effort: a failure is said and the
 * first save allocates the arena as it would have. */
static void prepare_saves(zoff_trainer *t) {
    if (t->snap_prepared) return;
    t->snap_prepared = true;
    const int64_t budget = snapshot_budget(t);
    if (zoff_trainer_next_save(t) < 0 || t->o.sync_saves ||
        !zoff_train_ckpt_can_background(t->eng, t->info.world > 1 ? t->comm : NULL, budget))
        return;
    if (budget > 0 && zoff_engine_snapshot_prepare(t->eng, (size_t)budget) != ZOFF_OK)
        zoff_log(ZOFF_LOG_WARN, "checkpoint snapshot: %s; the first save allocates it", zoff_last_error());
}

zoff_status zoff_trainer_step(zoff_trainer *t, zoff_train_step_result *r) {
    memset(r, 0, sizeof *r);
    const int64_t accum = t->info.accumulation, epoch = zoff_loader_epoch(t->train_ld);
    double t0 = zoff_now(), loss_sum = 0;
    zoff_status s = zoff_engine_zero_grad(t->eng);
    if (s != ZOFF_OK) return zoff_error_context(s, "step");
    for (int64_t mb = 0; mb < accum; mb++) {
        float l = 0;
        ZOFF_TRY(micro_batch(t, mb == accum - 1, &l, &r->t_forward, &r->t_backward, &r->t_ckpt_wait));
        loss_sum += l;
    }
    r->lr = zoff_lr_at(&t->cfg.scheduler, t->cfg.optimizer.lr, zoff_engine_steps_taken(t->eng));
    double beta2;
    zoff_betas_at(&t->cfg.scheduler, &t->cfg.optimizer, zoff_engine_steps_taken(t->eng), &r->beta1, &beta2);
    /* the update (and, with the delayed update, its background job) starts in zoff_engine_step
     * (with super_offload during the boundary backward, waited for there): a checkpoint still
     * reading the state finishes first, unless it reads through the engine's snapshot */
    ZOFF_TRY(start_due_save(t)); /* the last step's periodic save, now that its update is done */
    if (!zoff_train_ckpt_save_snapshots(t->bg)) ZOFF_TRY(wait_background_save(t, &r->t_ckpt_wait, true));
    if ((s = zoff_engine_step(t->eng, r->lr, &r->info)) != ZOFF_OK) return zoff_error_context(s, "optimizer step");
    if ((s = mean_over_ranks(t, &loss_sum)) != ZOFF_OK) return zoff_error_context(s, "step");
    r->step = ++t->info.step;
    if (zoff_loader_epoch(t->train_ld) != epoch) /* the loader wrapped during this step's micro-batches */
        trainer_say(t, "step %lld began epoch %lld of the training data: an epoch reads %lld of its %lld windows of "
                       "%lld tokens once (%lld micro-batches of %lld x %d rank(s)), each epoch in a new order",
                    (long long)r->step, (long long)zoff_loader_epoch(t->train_ld) + 1,
                    (long long)(zoff_loader_batches_per_epoch(t->train_ld) * t->info.micro_batch * t->info.world),
                    (long long)zoff_loader_num_windows(t->train_ld), (long long)t->info.seq_len + 1,
                    (long long)zoff_loader_batches_per_epoch(t->train_ld), (long long)t->info.micro_batch,
                    t->info.world);
    prepare_saves(t);
    trainer_write_timeline(t, &r->info, r->t_backward);
    double tokens = (double)(t->info.micro_batch * t->info.seq_len * accum * t->info.world); /* all ranks */
    t->info.consumed_tokens += tokens;
    r->step_time = zoff_now() - t0;
    r->loss = (float)(loss_sum / (double)accum);
    r->tokens_per_s = tokens / r->step_time;
    ZOFF_TRY(write_step_metrics(t, r));
    /* a save that finished meanwhile: joined now (no wait), its line and metrics written */
    return zoff_train_ckpt_save_done(t->bg) ? wait_background_save(t, NULL, false) : ZOFF_OK;
}

/* Validation batch k (of micro_batch sequences, in one rank's order) is evaluated by rank
 * k % world; the sum over ranks / n is then the loss one rank would compute. With stage 3 a
 * forward gathers its weights from every rank, so every rank must run as many forwards: the
 * last round is filled up with forwards of the last batch whose loss is not counted (before,
 * an --eval-iters that is not a multiple of the ranks left a gather unmatched: every rank
 * waited for the communication timeout). A signal then waits for the end of the evaluation
 * (one rank stopping early would leave the others' gathers unmatched the same way). */
zoff_status zoff_trainer_evaluate(zoff_trainer *t, double *out) {
    *out = NAN;
    const int64_t n = t->info.eval_iters, B = t->info.micro_batch, T = t->info.seq_len, w = t->info.world;
    if (!t->val_ld || n <= 0) return ZOFF_OK;
    const bool lockstep = w > 1 && t->cfg.zero.stage == 3; /* a forward is a collective */
    const int64_t rounds = lockstep ? (n + w - 1) / w * w : n;
    const size_t bytes = (size_t)(B * T) * sizeof(int32_t);
    zoff_stream *st = zoff_device_stream(t->dev);
    zoff_status s = ZOFF_OK;
    double sum = 0;
    zoff_loader_reset(t->val_ld);
    for (int64_t k = 0; s == ZOFF_OK && k < rounds; k++) {
        if (!lockstep && t->o.stop && *t->o.stop) break; /* a signal: the ranks stop together below */
        if (k < n) s = zoff_loader_next(t->val_ld, t->hx, t->hy);
        if (s != ZOFF_OK || k % w != t->info.rank) continue;
        s = zoff_memcpy_async(st, t->dx, t->hx, bytes, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, t->dy, t->hy, bytes, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_gpt2_forward(t->model, t->dx, t->dy, B, T);
        float l = 0;
        if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(t->model, &l);
        if (k < n) sum += l;
    }
    if (s == ZOFF_OK && t->info.world > 1) s = zoff_comm_allreduce_f64(t->comm, &sum, 1, ZOFF_REDUCE_SUM);
    if (s != ZOFF_OK) return zoff_error_context(s, "evaluation");
    bool stopped = false;
    if (t->o.stop) ZOFF_TRY(zoff_trainer_should_stop(t, &stopped));
    if (stopped) return ZOFF_OK; /* interrupted: no figure (NAN) */
    *out = sum / (double)n;
    char v[32];
    ZOFF_TRY(trainer_metrics_line(t, "{\"step\":%lld,\"val_loss\":%s}\n", (long long)t->info.step,
                                  zoff_format_fixed(*out, 6, v, sizeof v)));
    return trainer_monitor_event(t->monitor, "Eval/Samples/val_loss", *out, samples_at(t, t->info.step));
}

/* What a checkpoint records besides tensors, as of now. */
static zoff_train_meta current_meta(const zoff_trainer *t) {
    zoff_train_meta m = {.step = t->info.step, .shape = t->info.shape, .seq_len = t->info.seq_len,
                         .seed = t->o.seed, .consumed_tokens = t->info.consumed_tokens,
                         .settings = trainer_settings_of(&t->cfg, t->info.world)};
    snprintf(m.tokenizer, sizeof m.tokenizer, "%s", zoff_tokenizer_name(t->tok));
    snprintf(m.data_path, sizeof m.data_path, "%s", t->data_abs);
    snprintf(m.val_path, sizeof m.val_path, "%s", t->val_abs);
    m.loader = zoff_loader_get_state(t->train_ld);
    m.shards = t->train_ds;
    zoff_engine_get_scalars(t->eng, &m.engine);
    m.weights_pending = zoff_engine_weights_pending(t->eng);
    return m;
}

zoff_status zoff_trainer_save(zoff_trainer *t, bool only_if_new) {
    ZOFF_TRY(wait_background_save(t, NULL, false));
    zoff_status s = zoff_engine_flush_state(t->eng); /* saving does not change the run */
    if (s != ZOFF_OK) return zoff_error_context(s, "optimizer step");
    const char *dir = t->o.save_dir;
    if (only_if_new) {
        int64_t latest = -1;
        if (t->info.rank == 0) (void)zoff_ckpt_latest(dir, &latest);
        if (t->info.world > 1 && (s = zoff_comm_broadcast_bytes(t->comm, &latest, sizeof latest, 0)) != ZOFF_OK)
            return zoff_error_context(s, "checkpoint"); /* rank 0's view decides, for all */
        if (latest == t->info.step) return ZOFF_OK;
    }
    zoff_train_meta m = current_meta(t);
    s = zoff_train_ckpt_save(dir, t->eng, t->model, &m, t->cfg.source, t->info.world > 1 ? t->comm : NULL);
    if (s == ZOFF_OK && t->o.keep_last && t->info.rank == 0) s = zoff_ckpt_prune(dir, (int)t->o.keep_last);
    return s != ZOFF_OK ? zoff_error_context(s, "checkpoint") : ZOFF_OK;
}

/* A background save's snapshot budget (zoff_trainer_options.save_snapshot_bytes; < 0: none). super_offload's
 * speculative update waits for the save before it begins (micro_batch): no snapshot. */
static bool snapshots_used(const zoff_trainer *t) {
    return !t->cfg.zero.offload_optimizer.super_offload && t->o.save_snapshot_bytes >= 0;
}

static int64_t snapshot_budget(const zoff_trainer *t) {
    if (!snapshots_used(t)) return -1;
    if (t->o.save_snapshot_bytes > 0) return t->o.save_snapshot_bytes;
    zoff_host_memory hm;
    const size_t left = zoff_host_memory_query(&hm) == ZOFF_OK ? zoff_host_memory_left(&hm) : 0;
    return (int64_t)zoff_placement_snapshot_auto_budget(zoff_engine_snapshot_bytes(t->eng),
                                                        zoff_engine_snapshot_held(t->eng), left);
}

/* Starts the background save of step bg_step; due: its meta, taken at that step's boundary (NULL:
 * taken now). */
static zoff_status start_save(zoff_trainer *t, const zoff_train_meta *due) {
    double t0 = zoff_now();
    zoff_status s = zoff_engine_flush_state(t->eng); /* the state is final: no update runs until the next step */
    if (s != ZOFF_OK) return zoff_error_context(s, "optimizer step");
    zoff_train_meta now = due ? *due : current_meta(t);
    s = zoff_train_ckpt_save_start(t->o.save_dir, t->eng, t->model, &now, t->cfg.source, (int)t->o.keep_last,
                                   t->bg_budget, &t->bg);
    t->bg_start_s = zoff_now() - t0;
    return s != ZOFF_OK ? zoff_error_context(s, "checkpoint") : ZOFF_OK;
}

/* The periodic save left due at the last step boundary (zoff_trainer_save_periodic), started now:
 * before the next zoff_engine_step, or before anything joins a save. Nothing has changed the
 * state since that boundary (zoff_engine_state_fixed_until_step); the pipelined update the start
 * waits for has run alongside this step's forward instead of before it. */
static zoff_status start_due_save(zoff_trainer *t) {
    if (!t->save_due) return ZOFF_OK;
    t->save_due = false;
    t->bg_start_in_step = true;
    return start_save(t, &t->due_meta);
}

zoff_status zoff_trainer_save_periodic(zoff_trainer *t) {
    char why[320];
    const int64_t budget = snapshot_budget(t); /* decided here, used when the save starts */
    const char *blocker = zoff_train_ckpt_background_blocker(t->eng, t->info.world > 1 ? t->comm : NULL, budget, why,
                                                             sizeof why);
    if (blocker && !t->o.sync_saves && !t->told_sync_saves) {
        t->told_sync_saves = true;
        zoff_log(ZOFF_LOG_INFO,
                 "checkpoint: periodic saves are written synchronously, training waits for each (said once): %s; a "
                 "background save needs one rank and the optimizer state in host memory (a device share is copied there first)",
                 blocker);
    }
    if (t->o.sync_saves || blocker) return zoff_trainer_save(t, false);
    double behind = 0;
    ZOFF_TRY(wait_background_save(t, &behind, false)); /* one save in flight at a time */
    if (behind > 0.01 && !t->told_save_behind) {
        t->told_save_behind = true;
        zoff_log(ZOFF_LOG_WARN,
                 "checkpoint: at step %lld the previous background save was still being written; training waited "
                 "%.2f s for it (said once). The saves outrun the disk: raise --save-interval",
                 (long long)t->info.step, behind);
    }
    t->bg_step = t->info.step;
    t->bg_start_in_step = false;
    t->bg_budget = budget;
    if (snapshots_used(t) && zoff_engine_state_fixed_until_step(t->eng)) {
        /* what the checkpoint records besides tensors is the main thread's, final now; the snapshot
         * starts just before the next update (start_due_save) */
        t->due_meta = current_meta(t);
        t->save_due = true;
        /* a device share's copy, though, begins now: the device's next update is a forward and a backward away */
        ZOFF_TRY(zoff_engine_snapshot_device_ahead(t->eng));
        return ZOFF_OK;
    }
    return start_save(t, NULL);
}
