/* The steps of zoff_trainer_create: the config, the model shape, the host-memory check, the
 * output directory, and the device -> model -> initial weights -> engine wiring. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/trainer_internal.h"
#include "zoff/aio.h"
#include "zoff/resources.h"
#include "zoff/schedule.h"

/* The settings a checkpoint records for the resume comparison (see zoff_train_settings). */
zoff_train_settings trainer_settings_of(const zoff_config *cfg, int world) {
    zoff_train_settings s = {.known = true,
                             .lr = cfg->optimizer.lr,
                             .warmup_steps = cfg->scheduler.type ? cfg->scheduler.warmup_num_steps : 0,
                             .total_steps = cfg->scheduler.type ? cfg->scheduler.total_num_steps : 0,
                             .micro_batch = cfg->train_micro_batch_size_per_gpu,
                             .accumulation = cfg->gradient_accumulation_steps,
                             .world_size = world,
                             .gradient_clipping = cfg->gradient_clipping};
    const bool adamw = cfg->optimizer.type == ZOFF_OPTIM_ADAM && cfg->optimizer.adam_w_mode; /* the same update */
    snprintf(s.optimizer, sizeof s.optimizer, "%s", zoff_optimizer_name(adamw ? ZOFF_OPTIM_ADAMW : cfg->optimizer.type));
    snprintf(s.precision, sizeof s.precision, "%s", cfg->bf16_enabled ? "bf16" : cfg->fp16.enabled ? "fp16" : "fp32");
    snprintf(s.scheduler, sizeof s.scheduler, "%s", zoff_scheduler_name(cfg->scheduler.type));
    return s;
}

/* A resume without --config or --micro-batch-size: the stored run's batch. On another number of
 * ranks its global batch (train_batch_size) is kept, as DeepSpeed's elasticity does, when it divides
 * into the stored micro-batch x the ranks (zoff_config_resolve_batch derives the accumulation);
 * else the micro-batch and accumulation are kept and the global batch changes, said in a note. */
static void stored_batch(zoff_trainer *t) {
    const zoff_train_settings *was = &t->resume.settings;
    const int64_t mb = was->micro_batch, ga = was->accumulation, tb = mb * ga * was->world_size;
    t->cfg.train_micro_batch_size_per_gpu = mb;
    t->cfg.gradient_accumulation_steps = ga;
    t->cfg.train_batch_size = 0; /* micro x accumulation x ranks */
    if (was->world_size == t->info.world || was->world_size < 1 || mb < 1) return;
    t->ranks_change_said = true; /* one line: trainer_check_resume says neither again */
    if (tb % (mb * t->info.world) == 0) {
        t->cfg.train_batch_size = tb;
        t->cfg.gradient_accumulation_steps = 0; /* tb / (micro x ranks) */
        trainer_say(t, "resume: ranks %lld -> %d: train_batch_size %lld kept, gradient_accumulation_steps %lld -> %lld",
                    (long long)was->world_size, t->info.world, (long long)tb, (long long)ga,
                    (long long)(tb / (mb * t->info.world)));
    } else {
        trainer_say(t, "resume: ranks %lld -> %d: train_batch_size %lld is not divisible by "
                       "train_micro_batch_size_per_gpu %lld x %d ranks: micro-batch and gradient_accumulation_steps "
                       "are kept, so the global batch changes from %lld to %lld. To choose it, give "
                       "--micro-batch-size or a --config with the batch",
                    (long long)was->world_size, t->info.world, (long long)tb, (long long)mb, t->info.world, (long long)tb,
                    (long long)(mb * ga * t->info.world));
    }
}

/* The config (file or the default), the batch resolved for the ranks, and with several ranks
 * the command-line settings the engine's fingerprint cannot see checked to agree. */
zoff_status trainer_load_config(zoff_trainer *t) {
    const zoff_trainer_options *o = &t->o;
    /* a resume without --config continues with the checkpoint's config and batch (its micro-batch
     * may have come from --micro-batch-size); without a stored config, the default */
    const bool stored = !o->config_path && t->resume_config;
    zoff_status s = o->config_path ? zoff_config_load_file(o->config_path, &t->cfg)
                    : stored       ? zoff_config_load_string(t->resume_config, "the checkpoint's config", &t->cfg)
                                   : zoff_config_load_string(o->config_text, "the default config", &t->cfg);
    if (s != ZOFF_OK) return zoff_error_context(s, "config");
    if (stored) trainer_say(t, "resume: no --config given: the run goes on with the config stored in %s", o->load_dir);
    if (stored && !o->micro_batch && t->resume.settings.known) stored_batch(t);
    int64_t gas_given = 0; /* the config's accumulation that --micro-batch-size re-derives */
    if (o->micro_batch) {
        t->cfg.train_micro_batch_size_per_gpu = o->micro_batch;
        if (t->cfg.train_batch_size && t->cfg.gradient_accumulation_steps) {
            gas_given = t->cfg.gradient_accumulation_steps;
            t->cfg.gradient_accumulation_steps = 0;
        }
    }
    if ((s = zoff_config_resolve_batch(&t->cfg, t->info.world)) != ZOFF_OK)
        return zoff_error_context(s, o->micro_batch ? "config with --micro-batch-size" : "config");
    if (gas_given && gas_given != t->cfg.gradient_accumulation_steps)
        trainer_say(t, "note: --micro-batch-size %lld keeps train_batch_size %lld: gradient_accumulation_steps %lld -> %lld",
                    (long long)o->micro_batch, (long long)t->cfg.train_batch_size, (long long)gas_given,
                    (long long)t->cfg.gradient_accumulation_steps);
    if (t->info.world > 1) {
        uint64_t h = ZOFF_FNV_INIT;
        const char *str[] = {o->data_path, o->val_path, o->tokenizer, o->save_dir, o->load_dir, o->init_from};
        for (size_t i = 0; i < sizeof str / sizeof str[0]; i++)
            h = str[i] ? zoff_fnv1a(h, str[i], strlen(str[i]) + 1) : zoff_fnv1a(h, "", 1);
        int64_t nums[] = {(int64_t)o->seed, o->train_iters, o->eval_iters, o->eval_interval, o->save_interval,
                          o->keep_last, o->no_checkpoint};
        h = zoff_fnv1a(h, nums, sizeof nums);
        s = zoff_comm_check_same(t->comm, h, "the command line (data, seed, iterations, save, load)");
        if (s != ZOFF_OK) return zoff_error_context(s, "data parallel");
    }
    if ((s = zoff_config_check_supported(&t->cfg)) != ZOFF_OK) return zoff_error_context(s, "config");
    t->info.dtype = t->cfg.bf16_enabled ? ZOFF_BF16 : t->cfg.fp16.enabled ? ZOFF_F16 : ZOFF_F32;
    t->info.micro_batch = t->cfg.train_micro_batch_size_per_gpu;
    t->info.accumulation = t->cfg.gradient_accumulation_steps;
    if (t->cfg.bf16_enabled && t->cfg.zero.stage == 0 && t->info.accumulation > 1 && !t->cfg.grad_accum_dtype_given)
        trainer_say(t, "note: bf16 at zero_optimization.stage 0 with gradient_accumulation_steps %lld: zoff sums the "
                       "micro-batches' gradients in bf16, the training dtype, where DeepSpeed (data_types."
                       "grad_accum_dtype null) sums them in fp32 (in stages 1-3 it sums in bf16 too); zoff does not "
                       "implement fp32 accumulation: give data_types.grad_accum_dtype \"bf16\" to take bf16 without "
                       "this note",
                    (long long)t->info.accumulation);
    /* OneCycle's momentum grows after the cycle with decay_mom_rate: refused now, not at the step
     * where it reaches 1 (it only grows, so the last step says) */
    double b1 = 0, b2 = 0;
    if (o->train_iters > 0 && zoff_schedule_cycles_betas(&t->cfg.scheduler, &t->cfg.optimizer))
        zoff_betas_at(&t->cfg.scheduler, &t->cfg.optimizer, o->train_iters - 1, &b1, &b2);
    if (b1 >= 1)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "config: scheduler.params.decay_mom_rate %g takes OneCycle's momentum (beta1) to %g by "
                          "optimizer step %lld of --train-iters %lld, and it must stay below 1: give a smaller "
                          "decay_mom_rate (0: the momentum stays at cycle_max_mom), or fewer steps",
                          t->cfg.scheduler.decay_mom_rate, b1, (long long)o->train_iters, (long long)o->train_iters);
    const zoff_optimizer_config *oc = &t->cfg.optimizer;
    if (!t->cfg.optimizer_given && !stored) /* DeepSpeed would take the script's optimizer: say which runs */
        trainer_say(t, "note: the config has no optimizer section: AdamW at DeepSpeed's defaults (lr %g, betas (%g, %g), "
                       "eps %g, weight_decay %g)",
                    oc->lr, oc->beta1, oc->beta2, oc->eps, oc->weight_decay);
    const zoff_scheduler_config *sc = &t->cfg.scheduler;
    if ((sc->type == ZOFF_SCHED_WARMUP_DECAY_LR || sc->type == ZOFF_SCHED_WARMUP_COSINE_LR) &&
        sc->total_num_steps > 0 && o->train_iters > sc->total_num_steps)
        trainer_say(t, "note: the %s schedule ends at scheduler.params.total_num_steps %lld, before --train-iters %lld: "
                       "the steps after it run at its final lr %g",
                    zoff_scheduler_name(sc->type), (long long)sc->total_num_steps, (long long)o->train_iters,
                    zoff_lr_at(sc, t->cfg.optimizer.lr, o->train_iters));
    return ZOFF_OK;
}

/* The model shape: flags override the config's model section, which overrides the defaults; a
 * resumed run takes the checkpoint's (trainer_check_resume refuses contradictions). */
zoff_status trainer_resolve_shape(zoff_trainer *t) {
    const zoff_trainer_options *a = &t->o;
    const zoff_model_config *m = &t->cfg.model;
    zoff_gpt2_shape *sh = &t->info.shape;
    int64_t tok_vocab = zoff_tokenizer_vocab_size(t->tok);
    /* --init-from: the file's model is the default where neither a flag nor the config gives a size
     * (its shape errors, if a size given differs, come from zoff_gpt2_st_check) */
    zoff_gpt2_shape fs = {0};
    if (t->init_st) {
        zoff_status s = zoff_gpt2_st_infer_shape(t->init_st, &fs);
        if (s != ZOFF_OK) return zoff_error_context(s, "--init-from");
    }
#define PICK(flag, cfgv, def) ((flag) ? (flag) : (cfgv) ? (cfgv) : (def))
#define FILE_OR(v, def) (t->init_st && (v) > 0 ? (v) : (def))
    sh->num_layers = PICK(a->num_layers, m->num_layers, FILE_OR(fs.num_layers, 4));
    sh->hidden_size = PICK(a->hidden_size, m->hidden_size, FILE_OR(fs.hidden_size, 128));
    sh->num_heads = PICK(a->num_heads, m->num_attention_heads, FILE_OR(fs.num_heads, t->init_st ? 0 : 4));
    t->T_given = PICK(a->seq_length, m->seq_length, 0);
    t->info.seq_len = t->T_given ? t->T_given : 64;
    sh->max_seq_len = PICK(a->max_pos, m->max_position_embeddings, FILE_OR(fs.max_seq_len, t->info.seq_len));
    const bool file_positions = t->init_st && !a->max_pos && !m->max_position_embeddings && fs.max_seq_len > 0;
    if (file_positions && !t->T_given && t->info.seq_len > sh->max_seq_len)
        t->info.seq_len = sh->max_seq_len; /* the default sequence fits the file's positions */
    sh->vocab_size = PICK(a->vocab_size, m->vocab_size, FILE_OR(fs.vocab_size, tok_vocab));
    const bool file_vocab = !a->vocab_size && !m->vocab_size && t->init_st && fs.vocab_size > 0;
#undef FILE_OR
#undef PICK
    if (sh->num_heads == 0) /* a file without the head count: the one size its tensors do not tell */
        return zoff_error(ZOFF_ERR_INVALID,
                          "--init-from %s does not say how many attention heads its model has (no zoff.num_heads in "
                          "its metadata, no config.json with n_head beside it): give --num-attention-heads (GPT-2's "
                          "own models have one head per 64 of width: %lld for width %lld)",
                          zoff_st_path(t->init_st), (long long)(sh->hidden_size >= 64 ? sh->hidden_size / 64 : 1),
                          (long long)sh->hidden_size);
    sh->padded_vocab_size = 0;
    if (t->rd) {
        ZOFF_TRY(trainer_check_resume(t));
        *sh = t->resume.shape;
        t->info.seq_len = t->resume.seq_len;
        char who[4200]; /* metadata written by another tool or by hand: its sizes are checked before use */
        snprintf(who, sizeof who, "--load %s: the checkpoint's model", t->o.load_dir);
        ZOFF_TRY(zoff_gpt2_check_shape(sh, who, NULL));
    }
    if (sh->vocab_size < tok_vocab && file_vocab)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--init-from %s: its model's vocabulary of %lld is smaller than the %lld tokens of tokenizer "
                          "%s: give the tokenizer it was trained with (--tokenizer byte for 256)",
                          zoff_st_path(t->init_st), (long long)sh->vocab_size, (long long)tok_vocab,
                          zoff_tokenizer_name(t->tok));
    if (sh->vocab_size < tok_vocab)
        return zoff_error(ZOFF_ERR_INVALID,
                          "vocab size %lld is smaller than the %lld tokens of the tokenizer; use --vocab-size >= %lld",
                          (long long)sh->vocab_size, (long long)tok_vocab, (long long)tok_vocab);
    if (t->info.seq_len > sh->max_seq_len && file_positions)
        return zoff_error(ZOFF_ERR_INVALID,
                          "--seq-length %lld exceeds the %lld positions of --init-from %s's model: give --seq-length "
                          "%lld or less",
                          (long long)t->info.seq_len, (long long)sh->max_seq_len, zoff_st_path(t->init_st),
                          (long long)sh->max_seq_len);
    if (t->info.seq_len > sh->max_seq_len)
        return zoff_error(ZOFF_ERR_INVALID, "--seq-length %lld exceeds --max-position-embeddings %lld",
                          (long long)t->info.seq_len, (long long)sh->max_seq_len);
    /* heads that do not divide the width included (zoff_gpt2_check_shape's one wording, as plan and
     * bench say it); every later check (memory, disk) sees sizes in bounds */
    return zoff_gpt2_check_shape(sh, "model", NULL);
}

/* Host memory this job needs at least, checked before anything large is allocated: the buffer
 * --init-from's loader holds (one transposed matrix; the weights themselves, like random ones
 * and --load's, go straight into the engine) and the checkpoint save's buffers
 * (zoff_train_ckpt_save_bytes, + zoff_train_ckpt_gather_bytes with several ranks), the optimizer
 * state the engine keeps on the host (offload_optimizer.device cpu: fp32 master and the optimizer's moments, plus the
 * 16-bit buffer that carries the gradients in and the weights out), and on the CPU backend the
 * "device" memory too (weights, gradients, a lower bound for activations, optimizer state not
 * offloaded). A lower bound: the engine checks its own allocations exactly. */
zoff_status trainer_check_host_memory(const zoff_trainer *t) {
    const zoff_gpt2_shape *sh = &t->info.shape;
    const int64_t B = t->info.micro_batch, T = t->info.seq_len;
    /* the shape is in bounds (trainer_resolve_shape); a batch the model will refuse: leave the message
     * to the model's own check */
    if (B < 1 || T < 1 || B > ZOFF_GPT2_MAX_BATCH || T > ZOFF_GPT2_MAX_SEQ) return ZOFF_OK;
    const double L = (double)sh->num_layers, C = (double)sh->hidden_size;
    const double N = (double)zoff_gpt2_count_params(sh);
    const double d = t->info.dtype == ZOFF_F32 ? 4 : 2;
    const double moments = zoff_optimizer_state_arrays(&t->cfg) - 1;
    const zoff_offload_optimizer_config *oo = &t->cfg.zero.offload_optimizer;
    /* ratio "auto" is decided by the engine: count it as all on the device (a lower bound either way).
     * offloaded: the engine's host part (16-bit gradients and weight staging on the host); its
     * optimizer state is in host memory with device cpu, on disk with device nvme (not counted) */
    bool offloaded = oo->device == ZOFF_OFFLOAD_CPU || oo->device == ZOFF_OFFLOAD_NVME;
    double host_part = !offloaded ? 0 : oo->ratio_auto ? 0 : oo->ratio > 0 && oo->ratio < 1 ? oo->ratio : 1;
    /* --init-from's loader buffer + the save's buffers: the writer's pieces, with several ranks
     * the pieces of the master weights gathered */
    double staging = (double)zoff_train_ckpt_save_bytes() +
                     (double)zoff_train_ckpt_gather_bytes(t->info.world, t->cfg.zero.stage);
    double loader = t->o.init_from ? 4 * (double)zoff_gpt2_st_loader_floats(sh) : 0;
    double cli = loader + staging, pinned = host_part * d * N;
    /* the host's master (fp32) and moments (in the state dtype: bf16 with bf16_optimizer_states) */
    const double state_size = (double)zoff_dtype_size(zoff_optimizer_state_dtype(&t->cfg));
    double host_state = oo->device == ZOFF_OFFLOAD_CPU ? host_part * (4 + moments * state_size) * N : 0;
    double dev_on_host = 0;
    const char *dv = t->o.device;
    bool cuda = (dv && !strcmp(dv, "cuda")) || (!dv && zoff_backend_available(ZOFF_BACKEND_CUDA));
    if (!cuda) /* the CPU backend's device memory is host memory */
        dev_on_host = 2 * d * N + (1 - host_part) * 4 * (1 + moments) * N + d * (double)B * (double)T * C * (L + 1) * 4;
    double pageable = cli + host_state + dev_on_host;
    char what[256], nl[40], np[48];
    snprintf(what, sizeof what, "this training job (GPT-2 %s, width %lld: %s%s; at least this much)",
             zoff_format_count(sh->num_layers, "layer", nl, sizeof nl), (long long)sh->hidden_size,
             zoff_format_params((int64_t)N, np, sizeof np), cuda ? "" : ", CPU backend: device memory is host memory");
    zoff_host_request rq = {.what = what,
                            .pageable = pageable >= 0x1p63 ? SIZE_MAX / 2 : (size_t)pageable,
                            .pinned = pinned >= 0x1p62 ? SIZE_MAX / 4 : (size_t)pinned,
                            .hint = oo->device == ZOFF_OFFLOAD_NVME
                                        ? "use a smaller model (--num-layers, --hidden-size) or --micro-batch-size"
                                        : "use a smaller model (--num-layers, --hidden-size) or --micro-batch-size, or "
                                          "keep the optimizer state on NVMe (offload_optimizer.device nvme)"};
    zoff_status s = zoff_host_memory_check(&rq);
    return s != ZOFF_OK ? zoff_error_context(s, "host memory") : ZOFF_OK;
}

/* How many checkpoints this run writes (every --save-interval steps before --train-iters, and
 * the final one), and how many of them the --save disk holds at once beyond the `kept` already
 * there: all of them, or with --keep-last K a save beside K (the start prunes to K). */
static int64_t saves_at_once(const zoff_trainer *t, int64_t kept, int64_t *saves) {
    const int64_t si = t->o.save_interval, T = t->o.train_iters, start = t->rd ? t->resume.step : 0;
    *saves = (si > 0 && T > 1 ? (T - 1) / si - (start < T ? start : T - 1) / si : 0) + 1;
    if (!t->o.keep_last) return *saves;
    const int64_t beside = t->o.keep_last + 1 - (kept < t->o.keep_last ? kept : t->o.keep_last);
    return beside < *saves ? beside : *saves;
}

/* The warning at start when the saves of this run will not all fit the free space of the --save
 * disk (not a refusal: free space changes; the first save that does not fit fails, keeping the
 * checkpoints before it). */
static void warn_saves_fit(const zoff_trainer *t, size_t one, size_t free_b, const char *where, int64_t kept) {
    int64_t saves = 0;
    const int64_t at_once = saves_at_once(t, kept, &saves), room = one ? (int64_t)(free_b / one) : at_once;
    if (room >= at_once) return;
    char b1[32], b2[32], b3[32], how[160], fix[160];
    if (t->o.keep_last)
        snprintf(how, sizeof how, "--keep-last %lld: each written beside the %lld kept", (long long)t->o.keep_last,
                 (long long)t->o.keep_last);
    else
        snprintf(how, sizeof how, "all kept");
    const int64_t k = room - 1 + (kept < t->o.keep_last || !t->o.keep_last ? kept : t->o.keep_last);
    if (k >= 1) snprintf(fix, sizeof fix, "keep fewer (--keep-last %lld)", (long long)k);
    else snprintf(fix, sizeof fix, "free space there (even --keep-last 1 writes each save beside the newest)");
    zoff_log(ZOFF_LOG_WARN,
             "--save %s: this run writes %lld checkpoint%s of %s (%s), %s at once, but the disk holding %s has %s free: "
             "room for %lld; %s, or choose a --save on a larger disk (the run starts: free space can change)",
             t->o.save_dir, (long long)saves, saves == 1 ? "" : "s", zoff_format_bytes(one, b1, sizeof b1), how,
             zoff_format_bytes(one * (size_t)at_once, b2, sizeof b2), where, zoff_format_bytes(free_b, b3, sizeof b3),
             (long long)room, fix);
}

/* The --save directory's disk holds one checkpoint (zoff_train_ckpt_bytes: a save writes the new
 * checkpoint before it prunes older ones), or the run is refused before it starts rather than at
 * its first save, hours in; when all of this run's saves will not fit, a warning (warn_saves_fit).
 * A resume whose --keep-last removes older checkpoints at start (trainer_keep_last) has their room.
 * Free space on one node (every rank's file goes there); not checked with several nodes (each
 * writes its own ranks' files, to a disk or a shared one zoff cannot tell), where the free space
 * is unknown, with --no-checkpoint, or with --overwrite (whose deletions free space after this check). */
zoff_status trainer_check_save_disk(const zoff_trainer *t) {
    bool buffered; /* how the saves will write: a bad ZOFF_CKPT_IO now, not after the training */
    if (!t->o.no_checkpoint && zoff_ckpt_io_buffered(&buffered) != ZOFF_OK)
        return zoff_error_context(ZOFF_ERR_INVALID, "--save %s", t->o.save_dir);
    if (t->o.no_checkpoint || t->o.overwrite) return ZOFF_OK; /* (--overwrite frees the old ones' space later) */
    if (t->info.world > 1 && zoff_comm_local_size(t->comm) < t->info.world) return ZOFF_OK;
    size_t held = 0;
    if (zoff_ckpt_count(t->o.save_dir, &held) != ZOFF_OK) held = 0; /* (a new --save) */
    zoff_clear_error();
    const zoff_train_ckpt_size cks = {.cfg = &t->cfg, .shape = &t->info.shape, .model_dtype = t->info.dtype,
                                      .world = t->info.world, .config_text = t->cfg.source, .step = t->o.train_iters};
    const char *bound = NULL;
    const size_t need = zoff_train_ckpt_bytes(&cks, &bound);
    size_t free_b = 0;
    char where[4096], b1[32], b2[32], np[48];
    if (!zoff_disk_free(t->o.save_dir, &free_b, where, sizeof where)) return ZOFF_OK;
    /* --keep-last removes the older ones at start (trainer_keep_last): each frees about `need` */
    const size_t pruned = t->o.keep_last && held > (size_t)t->o.keep_last ? held - (size_t)t->o.keep_last : 0;
    if (free_b >= need || pruned) {
        warn_saves_fit(t, need, pruned && SIZE_MAX - free_b > pruned * need ? free_b + pruned * need : free_b, where,
                       (int64_t)held);
        return ZOFF_OK;
    }
    return zoff_error(ZOFF_ERR_IO,
                      "--save %s: a checkpoint of this run holds %s%s%s (%zu bytes; %s: fp32 master weights, optimizer "
                      "state in %s, metadata), but the disk holding %s has %s (%zu bytes) free; free space there, "
                      "choose a --save on a larger disk, or train without checkpoints (--no-checkpoint)",
                      t->o.save_dir, bound ? bound : "", bound ? " " : "", zoff_format_bytes(need, b1, sizeof b1), need,
                      zoff_format_params(zoff_gpt2_count_params(&t->info.shape), np, sizeof np),
                      zoff_dtype_name(zoff_checkpoint_state_dtype(&t->cfg)), where,
                      zoff_format_bytes(free_b, b2, sizeof b2), free_b);
}

/* The output directory: created and proved writable before training starts. What create made
 * is remembered so that a failure before the first file leaves no empty directory behind. */
/* Several ranks write one checkpoint into --save (every rank its file, rank 0 the rest): all must
 * see one folder. Every rank looks for rank 0's write-test file (a name new to them, so a network
 * file system asks its server). Collective. */
static zoff_status check_shared_save(zoff_trainer *t, const char *mine) {
    char name[4200];
    snprintf(name, sizeof name, "%s", mine);
    ZOFF_TRY(zoff_comm_broadcast_bytes(t->comm, name, sizeof name, 0));
    int32_t seen = t->info.rank == 0 || access(name, F_OK) == 0, *all = calloc((size_t)t->info.world, sizeof *all);
    if (!all) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = zoff_comm_allgather_bytes(t->comm, &seen, all, sizeof seen);
    char ranks[256] = "";
    size_t used = 0;
    for (int r = 0; s == ZOFF_OK && r < t->info.world && used < sizeof ranks - 16; r++)
        if (!all[r]) used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d", used ? ", " : "", r);
    free(all);
    if (s == ZOFF_OK && used)
        s = zoff_error(ZOFF_ERR_INVALID,
                       "--save %s is not one folder for all ranks: rank %s cannot see the file rank 0 wrote there "
                       "(%s). Every rank writes its part of a checkpoint into --save and rank 0 completes it: give "
                       "a folder on a file system all nodes share, or --no-checkpoint",
                       t->o.save_dir, ranks, name);
    return s;
}

zoff_status trainer_make_output_dir(zoff_trainer *t) {
    const char *dir = t->o.save_dir;
    zoff_status s = zoff_train_mkdir_p(dir, t->made_dir, sizeof t->made_dir);
    if (s != ZOFF_OK) return zoff_error_context(s, "--save: cannot create the output directory (choose another --save)");
    char buf[4200];
    snprintf(buf, sizeof buf, "%s/.zoff-write-test-%d-%d", dir, t->info.rank, (int)getpid());
    FILE *f = fopen(buf, "w");
    if (!f)
        return zoff_error(zoff_status_of_path_errno(errno),
                          "--save: output directory %s is not writable: %s (choose another --save)", dir,
                          strerror(errno));
    fclose(f);
    s = t->info.world > 1 && !t->o.no_checkpoint ? check_shared_save(t, buf) : ZOFF_OK;
    unlink(buf);
    return s;
}

/* After a failed create: remove the directories create made, if they are still empty. */
void trainer_remove_made_dir(zoff_trainer *t) {
    if (!t->made_dir[0]) return;
    char buf[4200];
    snprintf(buf, sizeof buf, "%s/" ZOFF_TRAIN_SAVE_LOCK, t->o.save_dir);
    if (t->lock_fd >= 0) unlink(buf); /* this run's, in a folder it made */
    snprintf(buf, sizeof buf, "%s", t->o.save_dir);
    size_t top = strlen(t->made_dir);
    while (strlen(buf) >= top && rmdir(buf) == 0) { /* rmdir fails on a directory with files */
        char *slash = strrchr(buf, '/');
        if (!slash || (size_t)(slash - buf) < top) break;
        *slash = 0;
    }
}

/* The device: GPU by local rank with several ranks; on the CPU backend the host's cores are
 * shared out among the ranks of a host. */
static zoff_device_options device_options(const zoff_trainer *t) {
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .memory_budget = t->o.device_memory};
    if (t->info.world > 1) {
        int local = zoff_comm_local_rank(t->comm), nlocal = zoff_comm_local_size(t->comm);
        dopt.ordinal = local;
        if (!getenv("ZOFF_THREADS")) {
            int per = zoff_cpu_features_get()->logical_cores / (nlocal > 0 ? nlocal : 1);
            char buf[16];
            snprintf(buf, sizeof buf, "%d", per > 0 ? per : 1);
            setenv("ZOFF_THREADS", buf, 1); /* the host optimizer's threads */
            dopt.threads = per > 0 ? per : 1;
        }
    }
    const char *dv = t->o.device;
    if ((dv && !strcmp(dv, "cuda")) || (!dv && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        dopt.kind = ZOFF_BACKEND_CUDA;
    return dopt;
}

/* --load: the checkpoint's fp32 master weights of the model range [lo, hi), straight into the
 * engine's master piece by piece (as random ones, --seed: no whole-model buffer). */
static zoff_status checkpoint_weights(void *arg, const zoff_gpt2 *model, int64_t lo, int64_t hi, float *dst) {
    zoff_trainer *t = arg;
    zoff_status s = zoff_train_ckpt_read_weights_range(t->rd, model, lo, hi, dst);
    return s == ZOFF_OK ? s : zoff_error_context(s, "--load");
}

/* --init-from: the safetensors file's weights of the model range [lo, hi), straight into the
 * engine piece by piece (zoff_gpt2_st_loader: no whole-model buffer; Hugging Face's transposed
 * matrices pass through one tensor-sized buffer). */
static zoff_status file_weights(void *arg, const zoff_gpt2 *model, int64_t lo, int64_t hi, float *dst) {
    zoff_trainer *t = arg;
    zoff_status s = ZOFF_OK;
    if (!t->init_ld) {
        int nt = 0;
        const zoff_tensor_info *tensors = zoff_gpt2_tensors(model, &nt);
        s = zoff_gpt2_st_loader_open(t->init_st, zoff_gpt2_get_shape(model), tensors, nt, &t->init_ld);
    }
    if (s == ZOFF_OK) s = zoff_gpt2_st_loader_read(t->init_ld, lo, hi, dst);
    if (s == ZOFF_OK) zoff_gpt2_count_nonfinite(model, lo, hi, dst, &t->init_bad, &t->init_first);
    return s == ZOFF_OK ? s : zoff_error_context(s, "--init-from");
}

/* --init-from's weights, read: NaN or Inf in them (counted by file_weights) is refused as eval and
 * sample refuse it, on every rank alike (the largest count and the first tensor any rank saw). */
static zoff_status init_weights_finite(zoff_trainer *t) {
    if (t->info.world > 1) {
        double v[2] = {(double)t->init_bad, t->init_first < 0 ? -1e18 : -(double)t->init_first};
        ZOFF_TRY(zoff_comm_allreduce_f64(t->comm, v, 2, ZOFF_REDUCE_MAX));
        t->init_bad = (int64_t)v[0];
        t->init_first = v[1] < -1e17 ? -1 : (int)-v[1];
    }
    zoff_status s = zoff_gpt2_nonfinite_error(t->stack.model, t->init_bad, t->init_first);
    return s == ZOFF_OK ? s : zoff_error_context(s, "--init-from %s", t->o.init_from);
}

/* Device, model, initial weights, engine (zoff_train_stack), token buffers. */
zoff_status trainer_build(zoff_trainer *t) {
    if (t->info.world > 1) zoff_aio_set_host_ranks(zoff_comm_local_size(t->comm)); /* for a full disk's message */
    zoff_train_stack_options so = {.device = device_options(t), .cfg = &t->cfg, .shape = t->info.shape,
                                   .batch_size = t->info.micro_batch, .seq_len = t->info.seq_len,
                                   .dtype = t->info.dtype, .checkpoint_activations = t->o.checkpoint_activations,
                                   .seed = t->o.seed,
                                   .init_range = t->rd ? checkpoint_weights : t->init_st ? file_weights : NULL,
                                   .init_arg = t,
                                   .comm = t->info.world > 1 ? t->comm : NULL, .timeline = t->info.world > 1,
                                   .weight_waits = true};
    t->init_bad = 0;
    t->init_first = -1;
    zoff_status s = zoff_train_stack_create(&so, &t->stack);
    if (t->init_st && s == ZOFF_OK) s = init_weights_finite(t);
    if (t->init_st && s == ZOFF_OK)
        trainer_say(t, "initialised the weights from %s (%s layout)", t->o.init_from,
                    zoff_gpt2_st_layout(t->init_st) == ZOFF_GPT2_LAYOUT_ZOFF ? "zoff" : "Hugging Face");
    zoff_gpt2_st_loader_close(t->init_ld);
    zoff_st_close(t->init_st);
    t->init_ld = NULL;
    t->init_st = NULL;
    if (s != ZOFF_OK) return s;
    t->dev = t->stack.dev;
    t->model = t->stack.model;
    t->eng = t->stack.eng;
    t->info.shape = *zoff_gpt2_get_shape(t->model);
    t->info.num_params = zoff_gpt2_num_params(t->model);
    size_t tok_bytes = (size_t)(t->info.micro_batch * t->info.seq_len) * sizeof(int32_t);
    t->hx = malloc(tok_bytes);
    t->hy = malloc(tok_bytes);
    if (!t->hx || !t->hy) return zoff_error(ZOFF_ERR_NOMEM, "buffers: out of host memory");
    if ((s = zoff_device_alloc(t->dev, tok_bytes, "input tokens", (void **)&t->dx)) != ZOFF_OK ||
        (s = zoff_device_alloc(t->dev, tok_bytes, "target tokens", (void **)&t->dy)) != ZOFF_OK)
        return zoff_error_context(s, "device");
    return ZOFF_OK;
}
