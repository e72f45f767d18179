/* zoff schedule: DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR,
 * WarmupCosineLR, OneCycle, LRRangeTest) as a pure function of the step count.
 *
 * The value matches DeepSpeed exactly, step for step: DeepSpeed builds the
 * scheduler with last_batch_iteration = -1 and calls scheduler.step() after
 * every applied optimizer step, so the lr used by optimizer step k (k = 0, 1, ...)
 * is the scheduler's lr at last_batch_iteration = k - 1. Consequences users see:
 *   WarmupLR / WarmupDecayLR: steps 0 and 1 both use warmup_min_lr;
 *   WarmupCosineLR: step 0 uses lr 0 (DeepSpeed's ratio before the first
 *   scheduler.step()), step 1 uses warmup_min_ratio * base_lr.
 * A step skipped for fp16 overflow does not advance the schedule in DeepSpeed;
 * the caller passes the number of applied steps. */
#ifndef ZOFF_SCHEDULE_H
#define ZOFF_SCHEDULE_H

#include <stdint.h>

#include "zoff/config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The learning rate for the optimizer step taken after `step` optimizer steps
 * have been applied (step >= 0; negative is treated as 0).
 * base_lr is the optimizer's lr (optimizer.params.lr): returned unchanged for
 * ZOFF_SCHED_NONE (or s == NULL), scaled by the ratio for WarmupCosineLR, and the
 * warmup target of WarmupLR when warmup_max_lr was not given.
 *
 *   WarmupLR:       min + (max - min) * g, g = log(i+1)/log(W) ("log") or i/W
 *                   ("linear") while i < W, then 1 (constant max)
 *   WarmupDecayLR:  as WarmupLR during warmup, then
 *                   g = max(0, (T - i) / max(1, T - W)): linear to 0 at step T
 *   WarmupCosineLR: base_lr * r, r = wmin + (1 - wmin) * g during warmup, then
 *                   r = max(0, cmin + (1 - cmin) * (1 + cos(pi * p)) / 2),
 *                   p = min(1, (i - W + 1) / max(1, T - W))
 *   OneCycle:       cycle_min_lr at step 0; over the cycle of S = first + second step sizes,
 *                   min + (max - min) * scale, scale rising 0 -> 1 over the first part and
 *                   falling back over the second (x = frac((i + 1) / S)); after it min_lr, or
 *                   min_lr / (1 + decay_lr_rate * (i - S + 1) / decay_step_size) when both are > 0
 *   LRRangeTest:    min_lr * (1 + step_rate * (i + 1) / step_size) (floor()ed with staircase);
 *                   min_lr at step 0
 * with i = step - 1 (DeepSpeed's last_batch_iteration), W = max(2, warmup_num_steps),
 * T = total_num_steps, wmin = warmup_min_ratio, cmin = cos_min_ratio. */
double zoff_lr_at(const zoff_scheduler_config *s, double base_lr, int64_t step);

/* Whether the schedule sets the optimizer's betas step by step: OneCycle with cycle_momentum, for
 * an optimizer with betas (Adam, AdamW, Lion; DeepSpeed leaves Adagrad's alone). */
bool zoff_schedule_cycles_betas(const zoff_scheduler_config *s, const zoff_optimizer_config *o);
/* The betas for the optimizer step taken after `step` applied steps (as zoff_lr_at): the
 * optimizer's own, or under zoff_schedule_cycles_betas DeepSpeed's (momentum, 0.99):
 *   step 0: cycle_min_mom; in the cycle: max_mom - (max_mom - min_mom) * scale; after it: max_mom,
 *   or max_mom * (1 + decay_mom_rate * d / decay_step_size) when both are > 0.
 * With a decay_mom_rate > 0 beta1 grows past 1 in time: the optimizer refuses that step. */
void zoff_betas_at(const zoff_scheduler_config *s, const zoff_optimizer_config *o, int64_t step, double *beta1,
                   double *beta2);

#ifdef __cplusplus
}
#endif
#endif
