/* Weights-arrived events per parameter group (private to src/zero): the
 * stage-1/2 counterpart of stage 3's gather on acquire. The model's flat space
 * is used in groups (the runs of equal `layer` in the tensor table: [wte, wpe],
 * each block, ln_f). When the host optimizer's new weights of a group are on
 * their way to the device, the engine records the group's event on the copy
 * stream; before the model's forward reads a group it makes its stream wait for
 * that event only, not for every group (zoff_engine_wait_weights).
 *
 * A round (one host update) marks the groups it will write as pending
 * (zoff_wready_open, caller thread, before the job starts); the job marks each
 * arrived as soon as its copy is issued (zoff_wready_arrive, worker thread);
 * zoff_wready_wait blocks the issuing thread only while the group is pending,
 * then orders the stream after the group's copy (stream-ordered, no host sync). */
#ifndef ZOFF_ZERO_WREADY_H
#define ZOFF_ZERO_WREADY_H

#include <stdbool.h>

#include "zoff/device.h"
#include "zoff/param_space.h"

typedef struct zoff_wready zoff_wready;

zoff_status zoff_wready_create(zoff_device *dev, const zoff_tensor_info *t, int nt, zoff_wready **out);
void zoff_wready_destroy(zoff_wready *w);
int zoff_wready_groups(const zoff_wready *w);
/* The last of n increasing group starts that is <= off (-1 if none). */
int zoff_group_find(const int64_t *start, int n, int64_t off);
/* The model offset where group g starts (g in [0, groups)). */
int64_t zoff_wready_group_start(const zoff_wready *w, int g);
/* The group holding model offset `off` (-1 if none). */
int zoff_wready_group_of(const zoff_wready *w, int64_t off);
/* A new round: the groups with need[g] are pending until they arrive. */
void zoff_wready_open(zoff_wready *w, const bool *need);
/* Group g's copy is issued on `copy`: record its event there, wake the waiters. */
zoff_status zoff_wready_arrive(zoff_wready *w, int g, zoff_stream *copy);
/* The round's job failed: no more arrivals; waiters return s with msg. */
void zoff_wready_fail(zoff_wready *w, zoff_status s, const char *msg);
/* Order stream s after group g's latest weights (blocks while g is pending). */
zoff_status zoff_wready_wait(zoff_wready *w, int g, zoff_stream *s);
/* Order s after every group's latest weights. */
zoff_status zoff_wready_wait_all(zoff_wready *w, zoff_stream *s);

#endif
