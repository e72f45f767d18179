/* The trainer's state and the functions its files share. Private to src/train. */
#ifndef ZOFF_TRAINER_INTERNAL_H
#define ZOFF_TRAINER_INTERNAL_H

#include <stdio.h>

#include "zoff/safetensors.h"
#include "zoff/train.h"

/* monitor.c: DeepSpeed's tensorboard and csv_monitor (rank 0) */
typedef struct trainer_monitor trainer_monitor;
/* NULL when neither is enabled. */
/* restart_samples >= 0: a resume, TensorBoard's SessionLog START at those samples (its reader drops the
 * earlier starts' events from there on, as torch's SummaryWriter(purge_step=) has it): the checkpoint's
 * samples + 1, keeping the events logged after its step (lr, loss scale, timers); -1: a new run */
zoff_status trainer_monitor_open(const zoff_config *cfg, int64_t restart_samples, trainer_monitor **out);
/* One event (DeepSpeed's name, e.g. "Train/Samples/train_loss"; x: samples trained); m may be NULL. */
zoff_status trainer_monitor_event(trainer_monitor *m, const char *name, double value, int64_t samples);
void trainer_monitor_close(trainer_monitor *m);

struct zoff_trainer {
    zoff_trainer_options o;
    zoff_trainer_info info;
    zoff_config cfg;
    zoff_tokenizer *tok;
    zoff_dataset *train_ds, *val_ds;
    zoff_loader *train_ld, *val_ld;
    zoff_train_stack stack;   /* device, model, engine */
    zoff_device *dev;         /* = stack.dev, .model, .eng */
    zoff_gpt2 *model;
    zoff_engine *eng;
    zoff_st_file *init_st;    /* --init-from, open during create only */
    zoff_gpt2_st_loader *init_ld; /* its weights, a range at a time (opened at the first range) */
    int64_t init_bad;         /* values of those ranges that are not finite, and the first tensor */
    int init_first;           /*   holding one (-1: none): zoff_gpt2_count_nonfinite */
    zoff_ckpt_reader *rd;     /* --load, open during create only */
    zoff_train_meta resume;   /* --load's meta */
    char *resume_config;      /* --load's stored config text (NULL: none); the run's config without --config */
    int64_t samples_base, samples_base_step; /* the monitors' x axis: samples trained at that step (a resume:
                                             * the checkpoint's consumed tokens / its seq_len, so another batch goes on from there) */
    bool ranks_change_said;   /* stored_batch said the ranks' change and the accumulation it took */
    int32_t *hx, *hy, *dx, *dy;
    FILE *metrics, *timeline;
    trainer_monitor *monitor; /* rank 0: tensorboard / csv_monitor (NULL: none) */
    char metrics_path[4200];
    char data_abs[1024], val_abs[1024]; /* the shards' paths made absolute, for the meta ("": none) */
    /* the shards in messages: "--data-path", or on a resume without it "--data-path (the checkpoint's,
     * PATH)"; the same for --val-path (trainer_open_data) */
    char data_flag[1100], val_flag[1100];
    char made_dir[4096];      /* the top-most --save directory create made ("" when none) */
    int lock_fd;              /* rank 0: the --save folder's lock (trainer_lock_save_dir), -1: none */
    zoff_comm *comm;          /* NULL with one rank */
    int64_t T_given;          /* sequence length given by a flag or the config (0 = not given) */
    zoff_train_ckpt_job *bg;  /* the background checkpoint in flight (NULL: none) */
    int64_t bg_step;          /* ... the step it saves */
    double bg_start_s;        /* ... the main thread's part of starting it (flush, device weights, snapshot) */
    bool bg_start_in_step;    /* ... started inside the step after bg_step (save_due) */
    int64_t bg_budget;        /* its snapshot budget (snapshot_budget), fixed when it was decided */
    bool save_due;            /* a periodic save of bg_step, with meta due_meta, starts just before the next
                                 zoff_engine_step (start_due_save) */
    zoff_train_meta due_meta;
    bool told_save_behind;    /* said once: a periodic save found the previous one still being written */
    bool told_sync_saves;     /* said once: periodic saves are synchronous, and why (zoff_train_ckpt_background_blocker) */
    bool snap_prepared;       /* the snapshot's arena was asked for ahead of the first periodic save (prepare_saves) */
};

/* Progress output of the trainer: rank 0, unless quiet. */
void trainer_say(const zoff_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* setup.c: the steps of zoff_trainer_create */
zoff_status trainer_load_config(zoff_trainer *t);
zoff_status trainer_resolve_shape(zoff_trainer *t);
zoff_status trainer_check_host_memory(const zoff_trainer *t);
zoff_status trainer_check_save_disk(const zoff_trainer *t);
zoff_status trainer_keep_last(zoff_trainer *t);
zoff_status trainer_open_data(zoff_trainer *t);
zoff_status trainer_make_output_dir(zoff_trainer *t);
void trainer_remove_made_dir(zoff_trainer *t);
zoff_status trainer_build(zoff_trainer *t);
zoff_train_settings trainer_settings_of(const zoff_config *cfg, int world);

/* resume.c: --load and --save rules */
zoff_status trainer_open_load(zoff_trainer *t);
zoff_status trainer_check_resume(zoff_trainer *t);
zoff_status trainer_check_save_dir(zoff_trainer *t);
zoff_status trainer_lock_save_dir(zoff_trainer *t, bool create);
#define ZOFF_TRAIN_SAVE_LOCK ".zoff-lock" /* in --save: held by the run training into it */
zoff_status trainer_restore(zoff_trainer *t);
zoff_status trainer_overwrite(zoff_trainer *t);

/* metrics.c: metrics.jsonl and the gradient timeline */
zoff_status trainer_open_metrics(zoff_trainer *t);
zoff_status trainer_metrics_line(zoff_trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void trainer_write_timeline(zoff_trainer *t, const zoff_step_info *si, double t_bwd);

#endif
