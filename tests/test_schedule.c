/* zoff_lr_at and zoff_betas_at against DeepSpeed's schedules: the expected values come from
 * tests/fixtures/gen_schedule_fixture.py, which steps a re-implementation of
 * DeepSpeed's scheduler classes (checked equal to DeepSpeed 0.19.8's own
 * lr_schedules.py with --check-against). Each case is a DeepSpeed config parsed
 * by zoff, so the config defaults that feed the schedule are covered too. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "fixtures/schedule_fixture.h"
#include "zoff/config.h"
#include "zoff/schedule.h"

static bool close_enough(double got, double want) { return fabs(got - want) <= 1e-15 + 1e-12 * fabs(want); }

static void test_fixture_cases(void **state) {
    (void)state;
    size_t ncases = sizeof k_sched_fixtures / sizeof k_sched_fixtures[0];
    int checked = 0, betas = 0;
    for (size_t c = 0; c < ncases; c++) {
        const sched_fixture *f = &k_sched_fixtures[c];
        zoff_config cfg;
        zoff_status st = zoff_config_load_string(f->config, f->name, &cfg);
        if (st != ZOFF_OK) fail_msg("%s: config rejected: %s", f->name, zoff_last_error());
        for (int i = 0; i < f->n; i++) {
            double got = zoff_lr_at(&cfg.scheduler, cfg.optimizer.lr, f->step[i]);
            if (!close_enough(got, f->lr[i]))
                fail_msg("%s: step %lld: zoff_lr_at = %.17g, DeepSpeed = %.17g", f->name, (long long)f->step[i], got,
                         f->lr[i]);
            checked++;
            if (!f->beta1) continue; /* Adagrad: no betas */
            double b1, b2;
            zoff_betas_at(&cfg.scheduler, &cfg.optimizer, f->step[i], &b1, &b2);
            if (!close_enough(b1, f->beta1[i]) || !close_enough(b2, f->beta2[i]))
                fail_msg("%s: step %lld: zoff_betas_at = (%.17g, %.17g), DeepSpeed = (%.17g, %.17g)", f->name,
                         (long long)f->step[i], b1, b2, f->beta1[i], f->beta2[i]);
            betas++;
        }
        zoff_config_free(&cfg);
    }
    print_message("checked %d learning rates and %d pairs of betas in %zu cases\n", checked, betas, ncases);
    assert_true(checked >= 390 && betas >= 370);
}

static void test_none_returns_base(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_config_defaults(&cfg);
    assert_int_equal(cfg.scheduler.type, ZOFF_SCHED_NONE);
    for (int64_t k = 0; k < 5; k++) assert_true(zoff_lr_at(&cfg.scheduler, 3e-4, k) == 3e-4);
    assert_true(zoff_lr_at(NULL, 1e-3, 7) == 1e-3);
}

/* Properties that hold whatever the reference says. */
static void test_shapes(void **state) {
    (void)state;
    zoff_config cfg;
    zoff_config_defaults(&cfg);
    zoff_scheduler_config *s = &cfg.scheduler;

    s->type = ZOFF_SCHED_WARMUP_DECAY_LR;
    s->warmup_min_lr = 0.0;
    s->warmup_max_lr = 1e-3;
    s->warmup_max_lr_given = true;
    s->warmup_num_steps = 100;
    s->warmup_type = ZOFF_WARMUP_LINEAR;
    s->total_num_steps = 1000;
    double prev = -1.0;
    for (int64_t k = 0; k <= 101; k++) { /* non-decreasing through warmup */
        double lr = zoff_lr_at(s, 5.0, k);
        assert_true(lr >= prev);
        prev = lr;
    }
    assert_true(close_enough(zoff_lr_at(s, 5.0, 101), 1e-3)); /* i = 100: end of warmup, gamma 1 */
    for (int64_t k = 102; k <= 1001; k++) {                   /* non-increasing decay, 0 at total */
        double lr = zoff_lr_at(s, 5.0, k);
        assert_true(lr <= prev);
        prev = lr;
    }
    assert_true(zoff_lr_at(s, 5.0, 1001) == 0.0);
    assert_true(zoff_lr_at(s, 5.0, 5000) == 0.0);
    assert_true(zoff_lr_at(s, 5.0, -3) == zoff_lr_at(s, 5.0, 0)); /* negative step = step 0 */

    s->type = ZOFF_SCHED_WARMUP_COSINE_LR;
    s->warmup_min_ratio = 0.0;
    s->cos_min_ratio = 0.01;
    assert_true(zoff_lr_at(s, 2e-3, 0) == 0.0);
    /* DeepSpeed's cosine starts one step into the decay: the peak is just below base lr */
    assert_true(zoff_lr_at(s, 2e-3, 101) < 2e-3 && zoff_lr_at(s, 2e-3, 101) > 0.9999 * 2e-3);
    assert_true(close_enough(zoff_lr_at(s, 2e-3, 100), 2e-3 * 0.99)); /* last warmup step: 99/100 */
    assert_true(close_enough(zoff_lr_at(s, 2e-3, 1001), 2e-3 * 0.01)); /* floor = cos_min_ratio */
    assert_true(close_enough(zoff_lr_at(s, 2e-3, 1e7), 2e-3 * 0.01));  /* stays at the floor */

    s->type = ZOFF_SCHED_WARMUP_LR;
    s->warmup_max_lr_given = false; /* WarmupLR warms up to the optimizer's lr */
    assert_true(close_enough(zoff_lr_at(s, 7e-4, 500), 7e-4));
    s->warmup_max_lr_given = true;
    assert_true(close_enough(zoff_lr_at(s, 7e-4, 500), 1e-3));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_cases),
        cmocka_unit_test(test_none_returns_base),
        cmocka_unit_test(test_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
