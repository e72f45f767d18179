/* Fuzz the DeepSpeed config parser: zoff_config_load_string on arbitrary bytes, then, for a
 * config that loads, everything the training CLI does with it (batch relation for several
 * world sizes, the unsupported-feature check, the learning-rate schedule over a range of
 * steps). Checks: no crash / UB / leak; a failure has a message; a config that loads
 * reloads from its own source text to the same result; learning rates are finite. */
#include <math.h>

#include "fuzz_util.h"
#include "zoff/config.h"
#include "zoff/schedule.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 16)) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    zoff_config cfg;
    zoff_status s = zoff_config_load_string(text, "fuzz.json", &cfg);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, NULL);
        FUZZ_CHECK(cfg.source == NULL && cfg.source_name == NULL, "failed load left owned strings behind");
        free(text);
        return 0;
    }
    FUZZ_CHECK(cfg.source && strcmp(cfg.source, text) == 0, "source text not kept");

    /* the same text loads again to the same values (the loader is a pure function of the text) */
    zoff_config again;
    s = zoff_config_load_string(cfg.source, "fuzz.json", &again);
    FUZZ_CHECK(s == ZOFF_OK, "reload of an accepted config failed: %s", zoff_last_error());
    FUZZ_CHECK(again.train_batch_size == cfg.train_batch_size &&
                   again.train_micro_batch_size_per_gpu == cfg.train_micro_batch_size_per_gpu &&
                   again.gradient_accumulation_steps == cfg.gradient_accumulation_steps &&
                   again.zero.stage == cfg.zero.stage && again.optimizer.type == cfg.optimizer.type,
               "reload differs");
    zoff_config_free(&again);

    (void)zoff_config_check_supported(&cfg);
    static const int worlds[] = {1, 2, 3, 8, 1024};
    for (size_t i = 0; i < sizeof worlds / sizeof worlds[0]; i++) {
        zoff_config c = cfg; /* resolve overwrites the batch fields only */
        s = zoff_config_resolve_batch(&c, worlds[i]);
        if (s != ZOFF_OK) {
            fuzz_check_error(s, NULL);
            continue;
        }
        FUZZ_CHECK(c.train_batch_size >= 1 && c.train_micro_batch_size_per_gpu >= 1 &&
                       c.gradient_accumulation_steps >= 1,
                   "resolved batch has a non-positive member: %lld %lld %lld", (long long)c.train_batch_size,
                   (long long)c.train_micro_batch_size_per_gpu, (long long)c.gradient_accumulation_steps);
        FUZZ_CHECK(c.train_batch_size ==
                       c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * (int64_t)worlds[i],
                   "resolved batch breaks the relation");
    }

    static const int64_t steps[] = {-5, 0, 1, 2, 3, 10, 1000, 1000000, INT64_MAX / 4, INT64_MAX};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        double lr = zoff_lr_at(&cfg.scheduler, cfg.optimizer.lr, steps[i]);
        FUZZ_CHECK(!isnan(lr), "lr is NaN at step %lld (scheduler type %d)", (long long)steps[i],
                   (int)cfg.scheduler.type);
    }
    zoff_config_free(&cfg);
    free(text);
    return 0;
}
