/* device -> model -> initial weights -> engine (include/zoff/train.h, zoff_train_stack). */
#include <string.h>

#include "zoff/train.h"

void zoff_train_stack_destroy(zoff_train_stack *s) {
    if (!s) return;
    zoff_engine_destroy(s->eng);
    zoff_gpt2_destroy(s->model);
    zoff_device_destroy(s->dev);
    memset(s, 0, sizeof *s);
}

/* The initial weights of the model range [lo, hi): the caller's init_range, or random
 * (counter-based: any split, the same values). */
typedef struct range_init {
    const zoff_train_stack_options *o;
    const zoff_gpt2 *model;
} range_init;
static zoff_status range_init_fn(void *arg, int64_t lo, int64_t hi, float *dst) {
    const range_init *ri = arg;
    if (ri->o->init_range) return ri->o->init_range(ri->o->init_arg, ri->model, lo, hi, dst);
    zoff_gpt2_init_params_range(ri->model, ri->o->seed, lo, hi, dst);
    return ZOFF_OK;
}

/* The engine from the model's buffers and its initial fp32 weights; stage 3's hooks. Random
 * weights and o->init_range's go straight into the engine's master (no whole-model buffer). */
static zoff_status create_engine(const zoff_train_stack_options *o, zoff_train_stack *s) {
    int64_t n = zoff_gpt2_num_params(s->model);
    int nt = 0;
    const zoff_tensor_info *tensors = zoff_gpt2_tensors(s->model, &nt);
    range_init ri = {.o = o, .model = s->model};
    zoff_status st = ZOFF_OK;
    zoff_engine_options eo = {.dev = s->dev, .cfg = o->cfg, .tensors = tensors, .num_tensors = nt,
                              .num_params = n, .params = zoff_gpt2_params(s->model),
                              .grads = zoff_gpt2_grads(s->model), .dtype = o->dtype,
                              .init_range = range_init_fn, .init_arg = &ri,
                              .comm = o->comm, .timeline = o->timeline,
                              .weight_waits = o->weight_waits && o->cfg->zero.stage < 3};
    if ((st = zoff_engine_create(&eo, &s->eng)) != ZOFF_OK) zoff_error_context(st, "engine");
    if (st == ZOFF_OK && eo.weight_waits &&
        (st = zoff_gpt2_set_weight_wait(s->model, zoff_engine_wait_weights, s->eng)) != ZOFF_OK)
        zoff_error_context(st, "engine");
    if (st == ZOFF_OK && zoff_engine_uses_grad_rows(s->eng) && /* wte's rows outside the batch: early */
        (st = zoff_gpt2_set_grad_rows(s->model, zoff_engine_grad_rows, s->eng)) != ZOFF_OK)
        zoff_error_context(st, "engine");
    if (st == ZOFF_OK && zoff_engine_uses_grad_buckets(s->eng)) { /* each group's gradients in a bucket */
        zoff_grad_hooks gh = {.arg = s->eng, .acquire = zoff_engine_grad_acquire, .release = zoff_engine_grad_release};
        if ((st = zoff_gpt2_set_grad_hooks(s->model, &gh)) != ZOFF_OK) zoff_error_context(st, "engine");
    }
    if (st == ZOFF_OK && o->cfg->zero.stage == 3) { /* the model asks the engine for each group's weights */
        zoff_param_hooks hk = {.arg = s->eng, .begin_pass = zoff_engine_begin_pass, .acquire = zoff_engine_acquire,
                               .release = zoff_engine_release};
        if ((st = zoff_gpt2_set_param_hooks(s->model, &hk)) != ZOFF_OK) zoff_error_context(st, "engine");
    }
    return st;
}

zoff_status zoff_train_stack_create(const zoff_train_stack_options *o, zoff_train_stack *out) {
    memset(out, 0, sizeof *out);
    zoff_status s = zoff_device_create(&o->device, &out->dev);
    if (s != ZOFF_OK) return zoff_error_context(s, "device");
    zoff_gpt2_options mo = {.shape = o->shape, .batch_size = o->batch_size, .seq_len = o->seq_len,
                            .dtype = o->dtype, .checkpoint_activations = o->checkpoint_activations,
                            .external_params = o->cfg->zero.stage == 3, /* stage 3: weights from the engine */
                            /* offload: the engine's bounded gradient buckets instead of a full buffer */
                            .external_grads = zoff_placement_grad_buckets(o->cfg)};
    if ((s = zoff_gpt2_create(out->dev, &mo, &out->model)) != ZOFF_OK) zoff_error_context(s, "model");
    if (s == ZOFF_OK) s = create_engine(o, out);
    if (s != ZOFF_OK) zoff_train_stack_destroy(out);
    return s;
}
