/* Dynamic and static loss scaling (DeepSpeed's DynamicLossScaler). */
#include "zoff/loss_scale.h"

#include <math.h>

void zoff_loss_scaler_init(zoff_loss_scaler *ls, const zoff_fp16_config *c) {
    *ls = (zoff_loss_scaler){0};
    ls->factor = 2.0;
    ls->last_overflow_iter = -1;
    if (c->loss_scale > 0) {
        ls->dynamic = false;
        ls->scale = c->loss_scale;
        ls->min_scale = c->loss_scale;
        return;
    }
    ls->dynamic = true;
    ls->scale = ldexp(1.0, c->initial_scale_power);
    ls->min_scale = c->min_loss_scale > 0 ? c->min_loss_scale : 1.0;
    ls->window = c->loss_scale_window > 0 ? c->loss_scale_window : 1000;
    ls->hysteresis = c->hysteresis > 0 ? c->hysteresis : 1;
    ls->hysteresis_left = ls->hysteresis;
    ls->consecutive_hysteresis = c->consecutive_hysteresis;
}

void zoff_loss_scaler_init_fixed(zoff_loss_scaler *ls, double scale) {
    *ls = (zoff_loss_scaler){0};
    ls->scale = scale;
    ls->min_scale = scale;
    ls->factor = 2.0;
    ls->last_overflow_iter = -1;
}

void zoff_loss_scaler_restore(zoff_loss_scaler *ls, double scale, int64_t iter, int64_t last_overflow_iter,
                              int hysteresis_left) {
    ls->iter = iter;
    if (!ls->dynamic) return; /* the configured scale */
    if (hysteresis_left < 1) { /* a static run's state: as a new scaler, its window counted from here */
        ls->last_overflow_iter = iter - 1;
        return;
    }
    ls->scale = scale;
    ls->last_overflow_iter = last_overflow_iter;
    ls->hysteresis_left = hysteresis_left;
}

zoff_status zoff_loss_scaler_update(zoff_loss_scaler *ls, bool overflow) {
    if (!ls->dynamic) {
        ls->iter++;
        return ZOFF_OK;
    }
    if (overflow) {
        if (ls->hysteresis == 1 || ls->hysteresis_left == 1) {
            if (ls->scale == ls->min_scale) /* (below it, as DeepSpeed: up to it) */
                return zoff_error(ZOFF_ERR_INVALID,
                                  "fp16 gradients overflow at the minimum loss scale %.17g (step %lld): training "
                                  "cannot progress; lower the learning rate, use bf16, or lower fp16.min_loss_scale",
                                  ls->scale, (long long)ls->iter + 1);
            ls->scale = fmax(ls->scale / ls->factor, ls->min_scale);
        } else {
            ls->hysteresis_left--;
        }
        ls->last_overflow_iter = ls->iter;
    } else {
        if (ls->consecutive_hysteresis) ls->hysteresis_left = ls->hysteresis;
        if ((ls->iter - ls->last_overflow_iter) % ls->window == 0) {
            if (!ls->consecutive_hysteresis) ls->hysteresis_left = ls->hysteresis;
            ls->scale *= ls->factor;
        }
    }
    ls->iter++;
    return ZOFF_OK;
}
