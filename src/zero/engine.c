/* The engine: optimizer state, gradient checks, clipping and the update.
 *
 * This version implements ZeRO stage 0 with the optimizer on the device (the
 * baseline): fp32 master weights, m and v live in device memory next to the
 * model's weights, and the update is the device's fused Adam op. The model's
 * flat buffers and tensor table are all the engine knows of the model. */
#include "zoff/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct range {
    int64_t offset, count;
    bool decay;
} range;

struct zoff_engine {
    zoff_device *dev;
    zoff_stream *stream;
    const zoff_config *cfg;
    zoff_dtype dtype;
    int64_t n;
    void *params, *grads;
    float *master; /* aliases params when dtype is F32 */
    float *m, *v;
    bool master_is_params;
    float *stats_dev; /* 2 floats */
    range *ranges;
    int nranges;
    zoff_engine_scalars sc;
};

static zoff_status build_ranges(zoff_engine *e, const zoff_tensor_info *t, int nt) {
    e->ranges = calloc((size_t)(nt > 0 ? nt : 1), sizeof *e->ranges);
    if (!e->ranges) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the engine's tensor ranges");
    /* sort-free: tensors come in layout order; merge neighbours with the same decay flag */
    int64_t covered = 0;
    for (int i = 0; i < nt; i++) {
        if (t[i].offset != covered)
            return zoff_error(ZOFF_ERR_INVALID,
                              "tensor table is not contiguous at '%s' (offset %lld, expected %lld)", t[i].name,
                              (long long)t[i].offset, (long long)covered);
        covered += t[i].numel;
        if (e->nranges > 0 && e->ranges[e->nranges - 1].decay == t[i].decay) {
            e->ranges[e->nranges - 1].count += t[i].numel;
        } else {
            e->ranges[e->nranges++] = (range){t[i].offset, t[i].numel, t[i].decay};
        }
    }
    if (covered != e->n)
        return zoff_error(ZOFF_ERR_INVALID, "tensor table covers %lld elements but num_params is %lld",
                          (long long)covered, (long long)e->n);
    return ZOFF_OK;
}

void zoff_engine_destroy(zoff_engine *e) {
    if (!e) return;
    if (e->stream) zoff_stream_synchronize(e->stream);
    if (!e->master_is_params) zoff_device_free(e->dev, e->master);
    zoff_device_free(e->dev, e->m);
    zoff_device_free(e->dev, e->v);
    zoff_device_free(e->dev, e->stats_dev);
    free(e->ranges);
    free(e);
}

zoff_status zoff_engine_create(const zoff_engine_options *o, zoff_engine **out) {
    *out = NULL;
    if (!o || !o->dev || !o->cfg || !o->params || !o->grads || o->num_params <= 0)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_engine_create: missing device, config or buffers");
    if (o->dtype != ZOFF_F32 && o->dtype != ZOFF_BF16 && o->dtype != ZOFF_F16)
        return zoff_error(ZOFF_ERR_INVALID, "engine dtype must be f32, bf16 or f16 (got %s)", zoff_dtype_name(o->dtype));
    const zoff_config *cfg = o->cfg;
    if (cfg->zero.stage != 0 || cfg->zero.offload_optimizer.device != ZOFF_OFFLOAD_NONE)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "zero_optimization.stage %d with offload is not implemented yet",
                          cfg->zero.stage);
    if (cfg->optimizer.type != ZOFF_OPTIM_ADAM && cfg->optimizer.type != ZOFF_OPTIM_ADAMW)
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "optimizer.type: only Adam and AdamW run on the device optimizer");

    zoff_engine *e = calloc(1, sizeof *e);
    if (!e) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the engine");
    e->dev = o->dev;
    e->stream = zoff_device_stream(o->dev);
    e->cfg = cfg;
    e->dtype = o->dtype;
    e->n = o->num_params;
    e->params = o->params;
    e->grads = o->grads;
    e->sc.loss_scale = 1.0;
    zoff_status s = build_ranges(e, o->tensors, o->num_tensors);
    size_t bytes = (size_t)e->n * sizeof(float);
    if (s == ZOFF_OK && o->dtype == ZOFF_F32) {
        e->master = o->params;
        e->master_is_params = true;
    } else if (s == ZOFF_OK) {
        s = zoff_device_alloc(e->dev, bytes, "fp32 master weights", (void **)&e->master);
    }
    if (s == ZOFF_OK) s = zoff_device_alloc(e->dev, bytes, "Adam exp_avg (m)", (void **)&e->m);
    if (s == ZOFF_OK) s = zoff_device_alloc(e->dev, bytes, "Adam exp_avg_sq (v)", (void **)&e->v);
    if (s == ZOFF_OK) s = zoff_device_alloc(e->dev, 2 * sizeof(float), "gradient statistics", (void **)&e->stats_dev);
    if (s == ZOFF_OK) s = zoff_memset_async(e->stream, e->m, 0, bytes);
    if (s == ZOFF_OK) s = zoff_memset_async(e->stream, e->v, 0, bytes);
    if (s == ZOFF_OK && o->init_params) s = zoff_memcpy_async(e->stream, e->master, o->init_params, bytes, ZOFF_COPY_H2D);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(e->stream);
    if (s == ZOFF_OK) s = zoff_engine_sync_params(e);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(e->stream);
    if (s != ZOFF_OK) {
        zoff_engine_destroy(e);
        return s;
    }
    *out = e;
    return ZOFF_OK;
}

zoff_status zoff_engine_sync_params(zoff_engine *e) {
    if (e->master_is_params) return ZOFF_OK;
    zoff_op_cast_args a = {.dst = e->params, .src = e->master, .n = e->n, .dst_dt = e->dtype, .src_dt = ZOFF_F32};
    return ZOFF_LAUNCH(e->stream, ZOFF_OP_CAST, a);
}

float zoff_engine_backward_scale(const zoff_engine *e) {
    int64_t acc = e->cfg->gradient_accumulation_steps > 0 ? e->cfg->gradient_accumulation_steps : 1;
    return (float)(e->sc.loss_scale / (double)acc);
}

void zoff_engine_grad_ready(void *engine, zoff_stream *stream, int64_t offset, int64_t count) {
    /* Stage 0 keeps gradients on the device until the step: nothing to move. */
    (void)engine; (void)stream; (void)offset; (void)count;
}

zoff_status zoff_engine_zero_grad(zoff_engine *e) {
    return zoff_memset_async(e->stream, e->grads, 0, (size_t)e->n * zoff_dtype_size(e->dtype));
}

int64_t zoff_engine_steps_taken(const zoff_engine *e) { return e->sc.steps_taken; }

zoff_status zoff_engine_step(zoff_engine *e, double lr, zoff_step_info *info) {
    double t0 = zoff_now();
    float stats[2] = {0, 0};
    ZOFF_TRY(zoff_memset_async(e->stream, e->stats_dev, 0, sizeof stats));
    zoff_op_grad_stats_args ga = {.stats = e->stats_dev, .x = e->grads, .n = e->n, .dt = e->dtype};
    ZOFF_TRY(ZOFF_LAUNCH(e->stream, ZOFF_OP_GRAD_STATS, ga));
    ZOFF_TRY(zoff_memcpy_async(e->stream, stats, e->stats_dev, sizeof stats, ZOFF_COPY_D2H));
    ZOFF_TRY(zoff_stream_synchronize(e->stream));

    double scale = e->sc.loss_scale;
    double norm = sqrt((double)stats[0]) / scale;
    bool overflow = stats[1] != 0.0f || !isfinite(norm);
    zoff_step_info si = {.grad_norm = norm, .loss_scale = scale, .skipped = overflow};
    if (overflow) {
        e->sc.steps_skipped++;
        zoff_log(ZOFF_LOG_WARN, "gradient has inf/NaN at optimizer step %lld: update skipped",
                 (long long)e->sc.steps_taken + 1);
    } else {
        const zoff_optimizer_config *oc = &e->cfg->optimizer;
        double clip = e->cfg->gradient_clipping, coef = 1.0;
        if (clip > 0 && norm > clip) coef = clip / (norm + 1e-6);
        int64_t t = ++e->sc.steps_taken;
        bool w_mode = oc->type == ZOFF_OPTIM_ADAMW || oc->adam_w_mode;
        double bc1 = oc->bias_correction ? 1.0 - pow(oc->beta1, (double)t) : 1.0;
        double bc2 = oc->bias_correction ? 1.0 - pow(oc->beta2, (double)t) : 1.0;
        for (int i = 0; i < e->nranges; i++) {
            const range *r = &e->ranges[i];
            size_t es = zoff_dtype_size(e->dtype);
            zoff_op_adam_args a = {
                .params = e->master + r->offset, .m = e->m + r->offset, .v = e->v + r->offset,
                .grads = (const char *)e->grads + (size_t)r->offset * es,
                .params16 = e->master_is_params ? NULL : (char *)e->params + (size_t)r->offset * es,
                .n = r->count, .grad_dt = e->dtype, .p16_dt = e->dtype,
                .lr = (float)lr, .beta1 = (float)oc->beta1, .beta2 = (float)oc->beta2, .eps = (float)oc->eps,
                .weight_decay = r->decay ? (float)oc->weight_decay : 0.0f,
                .bc1 = (float)bc1, .bc2 = (float)bc2, .grad_scale = (float)(coef / scale),
                .adam_w_mode = w_mode};
            ZOFF_TRY(ZOFF_LAUNCH(e->stream, ZOFF_OP_ADAM, a));
        }
    }
    ZOFF_TRY(zoff_stream_synchronize(e->stream));
    si.t_step = zoff_now() - t0;
    if (info) *info = si;
    return ZOFF_OK;
}

int zoff_engine_state_count(const zoff_engine *e) { (void)e; return 3; }

const char *zoff_engine_state_name(const zoff_engine *e, int i) {
    (void)e;
    static const char *names[] = {"optimizer.master", "optimizer.exp_avg", "optimizer.exp_avg_sq"};
    return i >= 0 && i < 3 ? names[i] : NULL;
}

static float *state_ptr(zoff_engine *e, int i) {
    return i == 0 ? e->master : i == 1 ? e->m : i == 2 ? e->v : NULL;
}

zoff_status zoff_engine_state_get(zoff_engine *e, int i, float *host_dst) {
    float *p = state_ptr(e, i);
    if (!p) return zoff_error(ZOFF_ERR_INVALID, "engine state index %d out of range", i);
    ZOFF_TRY(zoff_memcpy_async(e->stream, host_dst, p, (size_t)e->n * sizeof(float), ZOFF_COPY_D2H));
    return zoff_stream_synchronize(e->stream);
}

zoff_status zoff_engine_state_set(zoff_engine *e, int i, const float *host_src) {
    float *p = state_ptr(e, i);
    if (!p) return zoff_error(ZOFF_ERR_INVALID, "engine state index %d out of range", i);
    ZOFF_TRY(zoff_memcpy_async(e->stream, p, host_src, (size_t)e->n * sizeof(float), ZOFF_COPY_H2D));
    if (i == 0) ZOFF_TRY(zoff_engine_sync_params(e));
    return zoff_stream_synchronize(e->stream);
}

void zoff_engine_get_scalars(const zoff_engine *e, zoff_engine_scalars *out) { *out = e->sc; }

zoff_status zoff_engine_set_scalars(zoff_engine *e, const zoff_engine_scalars *in) {
    if (in->steps_taken < 0 || !(in->loss_scale > 0))
        return zoff_error(ZOFF_ERR_FORMAT, "engine state has steps_taken %lld and loss_scale %g: corrupt checkpoint?",
                          (long long)in->steps_taken, in->loss_scale);
    e->sc = *in;
    return ZOFF_OK;
}
