/* zoff loss scaling for fp16 training, with DeepSpeed's semantics.
 *
 * Static (fp16.loss_scale > 0): the scale never changes; a step whose gradients
 * overflow is still skipped.
 * Dynamic (fp16.loss_scale == 0): start at 2^initial_scale_power. On overflow
 * the step is skipped; if the hysteresis budget is spent the scale is divided
 * by 2 (not below min_loss_scale), otherwise the budget shrinks by one. After
 * loss_scale_window consecutive steps without overflow (counted from the last
 * overflow) the scale doubles and the hysteresis budget is restored; with
 * consecutive_hysteresis the budget is restored after every good step.
 * An overflow at the minimum scale is an error (DeepSpeed raises too): the
 * run cannot make progress.
 * bf16 and fp32 training use a fixed scale of 1 (zoff_loss_scaler_init_fixed). */
#ifndef ZOFF_LOSS_SCALE_H
#define ZOFF_LOSS_SCALE_H

#include "zoff/config.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zoff_loss_scaler {
    bool dynamic;
    double scale, min_scale, factor;
    int64_t window;
    int hysteresis;          /* configured delayed shift */
    int hysteresis_left;     /* current budget */
    bool consecutive_hysteresis;
    int64_t iter;            /* steps seen (applied + skipped) */
    int64_t last_overflow_iter;
} zoff_loss_scaler;

void zoff_loss_scaler_init(zoff_loss_scaler *ls, const zoff_fp16_config *fp16);
void zoff_loss_scaler_init_fixed(zoff_loss_scaler *ls, double scale);
/* Continue from a checkpoint's scaler state (zoff_engine_scalars). A static scaler keeps its
 * configured fp16.loss_scale (the stored scale may be a dynamic run's). A dynamic one takes the
 * stored scale, last overflow and hysteresis budget, unless the state is
 * a static scaler's (hysteresis_left 0: a dynamic budget is never below 1), when it starts afresh
 * at 2^initial_scale_power, its first window counted from the resumed step. The step count (iter)
 * is always taken. */
void zoff_loss_scaler_restore(zoff_loss_scaler *ls, double scale, int64_t iter, int64_t last_overflow_iter,
                              int hysteresis_left);
/* Record the outcome of a step. Returns ZOFF_ERR_INVALID (with DeepSpeed's
 * advice) when a dynamic scaler overflows at its minimum scale. */
zoff_status zoff_loss_scaler_update(zoff_loss_scaler *ls, bool overflow);

#ifdef __cplusplus
}
#endif
#endif
