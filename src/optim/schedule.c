/* DeepSpeed's learning-rate schedules as a function of the step count.
 * Each formula is written the way deepspeed/runtime/lr_schedules.py computes it
 * (same operations in the same order), so values agree to the last bit or two. */
#include "zoff/schedule.h"

#include <math.h>

/* DeepSpeed's _get_gamma warmup part; `it` is last_batch_iteration, 0 <= it < w. */
static double warmup_gamma(zoff_warmup_type type, int64_t it, int64_t w) {
    if (type == ZOFF_WARMUP_LINEAR) return (double)it / (double)w;
    double inverse_log_warm_up = 1.0 / log((double)w);
    return inverse_log_warm_up * log((double)(it + 1));
}

/* OneCycle's cycle length (its total_size) and its _get_scale_factor at last_batch_iteration it. */
static double one_cycle_total(const zoff_scheduler_config *s) {
    double first = (double)s->cycle_first_step_size;
    double second = s->cycle_second_step_size >= 0 ? (double)s->cycle_second_step_size : first;
    return first + second;
}

static double one_cycle_scale(const zoff_scheduler_config *s, int64_t it) {
    const double first = (double)s->cycle_first_step_size, total = one_cycle_total(s), step_ratio = first / total;
    double batch_iteration = (double)(it + 1);
    double cycle = floor(1.0 + batch_iteration / total);
    double x = 1.0 + batch_iteration / total - cycle;
    bool up = x <= step_ratio;
    double scale_factor = up ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
    /* stairs (DeepSpeed 0.19.8): flat over each of stair_count pieces of the half cycle, counted
     * from the integer batch offset in the cycle */
    int64_t stair_count =
        up || s->cycle_second_stair_count < 0 ? s->cycle_first_stair_count : s->cycle_second_stair_count;
    if (stair_count > 0) {
        double cycle_iteration = fmod(batch_iteration, total), stair_position;
        if (cycle_iteration <= first) stair_position = cycle_iteration * (double)stair_count / first;
        else stair_position = (total - cycle_iteration) * (double)stair_count / (total - first);
        scale_factor = floor(stair_position) / (double)stair_count;
    }
    return scale_factor;
}

double zoff_lr_at(const zoff_scheduler_config *s, double base_lr, int64_t step) {
    if (s == NULL || s->type == ZOFF_SCHED_NONE) return base_lr;
    if (step < 0) step = 0;
    int64_t it = step - 1; /* DeepSpeed's last_batch_iteration */
    int64_t w = s->warmup_num_steps > 2 ? s->warmup_num_steps : 2;
    int64_t total = s->total_num_steps;

    switch (s->type) {
    case ZOFF_SCHED_WARMUP_LR:
    case ZOFF_SCHED_WARMUP_DECAY_LR: {
        double min_lr = s->warmup_min_lr;
        double max_lr = s->warmup_max_lr;
        if (s->type == ZOFF_SCHED_WARMUP_LR && !s->warmup_max_lr_given) max_lr = base_lr;
        if (it < 0) return min_lr; /* before the first scheduler.step() */
        double delta = max_lr - min_lr;
        double gamma;
        if (it < w) {
            gamma = warmup_gamma(s->warmup_type, it, w);
        } else if (s->type == ZOFF_SCHED_WARMUP_LR) {
            gamma = 1.0;
        } else {
            double den = (double)(total - w);
            if (den < 1.0) den = 1.0;
            gamma = (double)(total - it) / den;
            if (gamma < 0.0) gamma = 0.0;
        }
        return min_lr + delta * gamma;
    }
    case ZOFF_SCHED_WARMUP_COSINE_LR: {
        if (it < 0) return 0.0; /* DeepSpeed: ratio 0 before the first scheduler.step() */
        double ratio;
        if (it < w) {
            ratio = warmup_gamma(s->warmup_type, it, w);
            double ratio_delta = 1.0 - s->warmup_min_ratio;
            ratio = s->warmup_min_ratio + ratio * ratio_delta;
        } else {
            int64_t real_last_step = it - w + 1;
            int64_t real_total_steps = total - w > 1 ? total - w : 1;
            double progress = (double)real_last_step / (double)real_total_steps;
            if (progress > 1.0) progress = 1.0;
            double ratio_delta = 1.0 - s->cos_min_ratio;
            ratio = (1.0 + cos(M_PI * progress)) / 2.0;
            ratio = s->cos_min_ratio + ratio_delta * ratio;
            if (ratio < 0.0) ratio = 0.0;
        }
        return base_lr * ratio;
    }
    case ZOFF_SCHED_ONE_CYCLE: {
        if (it < 0) return s->cycle_min_lr;
        const double cyc = one_cycle_total(s);
        if ((double)it < cyc)
            return s->cycle_min_lr + (s->cycle_max_lr - s->cycle_min_lr) * one_cycle_scale(s, it);
        if (s->decay_step_size == 0 || s->decay_lr_rate == 0) return s->cycle_min_lr;
        double interval = ((double)it - cyc + 1.0) / (double)s->decay_step_size;
        return s->cycle_min_lr / (1.0 + s->decay_lr_rate * interval);
    }
    case ZOFF_SCHED_LR_RANGE_TEST: {
        if (it < 0) return s->lr_range_test_min_lr;
        double interval = (double)(it + 1) / (double)s->lr_range_test_step_size;
        if (s->lr_range_test_staircase) interval = floor(interval);
        return s->lr_range_test_min_lr * (1.0 + s->lr_range_test_step_rate * interval);
    }
    case ZOFF_SCHED_NONE:
        break;
    }
    return base_lr;
}

bool zoff_schedule_cycles_betas(const zoff_scheduler_config *s, const zoff_optimizer_config *o) {
    return s && s->type == ZOFF_SCHED_ONE_CYCLE && s->cycle_momentum && o->type != ZOFF_OPTIM_ADAGRAD;
}

void zoff_betas_at(const zoff_scheduler_config *s, const zoff_optimizer_config *o, int64_t step, double *beta1,
                   double *beta2) {
    *beta1 = o->beta1;
    *beta2 = o->beta2;
    if (!zoff_schedule_cycles_betas(s, o)) return;
    *beta2 = 0.99; /* DeepSpeed's OneCycle sets the betas to (momentum, 0.99) */
    int64_t it = (step < 0 ? 0 : step) - 1;
    const double total = one_cycle_total(s);
    if (it < 0) *beta1 = s->cycle_min_mom;
    else if ((double)it < total)
        *beta1 = s->cycle_max_mom - (s->cycle_max_mom - s->cycle_min_mom) * one_cycle_scale(s, it);
    else if (s->decay_step_size == 0 || s->decay_mom_rate == 0) *beta1 = s->cycle_max_mom;
    else *beta1 = s->cycle_max_mom * (1.0 + s->decay_mom_rate * (((double)it - total + 1.0) / (double)s->decay_step_size));
}
