/* What the training-checkpoint files of src/train share (checkpoint.c, ckpt_save.c). */
#ifndef ZOFF_TRAIN_CKPT_INTERNAL_H
#define ZOFF_TRAIN_CKPT_INTERNAL_H

#include "zoff/train.h"

/* The "meta" blob's JSON text (malloc'd; NULL when out of memory). */
char *train_meta_to_text(const zoff_train_meta *meta);
/* This rank's partition runs [off0, cnt0, ...] (malloc'd; include/zoff/ckpt.h, "Partitioned entries"). */
zoff_status train_partition_runs(zoff_engine *eng, int64_t **runs, int *nruns);

#endif
