/* zoff model: GPT-2 on any zoff_device.
 *
 * Parameters live in one flat device buffer described by a tensor table
 * (zoff_tensor_info); gradients in a second flat buffer of the same layout.
 * The layout is block-contiguous, in the order backward finalises gradients
 * last: [wte, wpe, h0.*, h1.*, ..., h{L-1}.*, ln_f.*], so each layer's
 * parameters (and gradients) form one contiguous range that backward reports
 * through the grad-ready callback as soon as that layer is done.
 *
 * The engine (src/zero) sees only the flat buffers, the tensor table and the
 * callback; it never knows it trains GPT-2. */
#ifndef ZOFF_MODEL_H
#define ZOFF_MODEL_H

#include "zoff/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a flat parameter buffer. Offsets and sizes count elements. */
typedef struct zoff_tensor_info {
    char name[64];     /* Hugging Face GPT-2 name, e.g. "h.0.attn.c_attn.weight" */
    int64_t offset;    /* first element in the flat buffer */
    int64_t numel;
    int ndim;
    int64_t shape[4];  /* zoff's own layout: Linear weights are (out, in) */
    bool decay;        /* weight decay applies (matrices and embeddings: yes; biases, LayerNorm: no) */
    int layer;         /* transformer block index, -1 for embeddings / final LayerNorm */
} zoff_tensor_info;

typedef struct zoff_gpt2_shape {
    int64_t num_layers;       /* L */
    int64_t hidden_size;      /* C */
    int64_t num_heads;        /* NH, C % NH == 0 */
    int64_t max_seq_len;      /* maxT: rows of wpe */
    int64_t vocab_size;       /* V */
    int64_t padded_vocab_size;/* Vp >= V (rows of wte; 0 = round V up to a multiple of 128) */
} zoff_gpt2_shape;

typedef struct zoff_gpt2 zoff_gpt2;

/* Called during backward, in stream order, when the gradients of elements
 * [offset, offset + count) of the flat gradient buffer are final for this
 * micro-batch: all ops producing them have been issued on `stream`. The callee
 * may record an event on `stream` and copy them out on another stream. */
typedef void (*zoff_grad_ready_fn)(void *arg, zoff_stream *stream, int64_t offset, int64_t count);

typedef struct zoff_gpt2_options {
    zoff_gpt2_shape shape;
    int64_t batch_size;        /* B: activations are allocated for B x seq_len tokens */
    int64_t seq_len;           /* T <= max_seq_len */
    zoff_dtype dtype;          /* storage dtype of weights/activations on the device */
    bool checkpoint_activations; /* recompute each block's activations during backward */
    /* No flat parameter/gradient buffers: the weights are provided, group by group,
     * through zoff_param_hooks (ZeRO stage 3). zoff_gpt2_params/grads return NULL. */
    bool external_params;
} zoff_gpt2_options;

/* Parameter residency hooks (ZeRO stage 3: weights partitioned over ranks and
 * gathered just before use). The model's flat space is used in groups: one
 * contiguous range per transformer block, the embeddings [wte, wpe] and the
 * final LayerNorm [ln_f.weight, ln_f.bias] (the runs of equal `layer` in the
 * tensor table). Before issuing the first op that reads a group the model calls
 * acquire, which returns where the group's weights are (and, in backward, a
 * gradient buffer of the group's size that starts at zero and into which
 * backward accumulates), valid in stream order on `s`; after issuing the last op
 * that uses them it calls release. A group may be acquired twice at once (the
 * tied wte at the start and the end of forward is released in between; in
 * backward the embeddings are held from the lm head to the end). In backward,
 * the grad-ready callback for a group's range comes before its release. Each
 * forward and each backward starts with begin_pass, so that the callee can
 * learn the order of acquisitions and prefetch. The generic shape (offset,
 * count of the flat space) lets any model use an engine that implements it. */
typedef struct zoff_param_hooks {
    void *arg;
    zoff_status (*begin_pass)(void *arg, zoff_stream *s, bool backward);
    zoff_status (*acquire)(void *arg, zoff_stream *s, int64_t offset, int64_t count, bool backward, void **params,
                           void **grads);
    zoff_status (*release)(void *arg, zoff_stream *s, int64_t offset, int64_t count, bool backward);
} zoff_param_hooks;

/* Validates the shape (clear error naming the field), allocates parameters,
 * gradients and activations on dev (failing with ZOFF_ERR_DEVICE_OOM if over budget). */
zoff_status zoff_gpt2_create(zoff_device *dev, const zoff_gpt2_options *opts, zoff_gpt2 **out);
void zoff_gpt2_destroy(zoff_gpt2 *m);
/* Install the hooks of a model created with external_params (copied). */
zoff_status zoff_gpt2_set_param_hooks(zoff_gpt2 *m, const zoff_param_hooks *hooks);

/* The tensor table and sizes (elements). */
const zoff_tensor_info *zoff_gpt2_tensors(const zoff_gpt2 *m, int *count);
int64_t zoff_gpt2_num_params(const zoff_gpt2 *m);
const zoff_gpt2_shape *zoff_gpt2_get_shape(const zoff_gpt2 *m);
/* Flat device buffers (dtype = opts.dtype). */
void *zoff_gpt2_params(zoff_gpt2 *m);
void *zoff_gpt2_grads(zoff_gpt2 *m);
/* Bytes of device memory this model holds (parameters, gradients, activations). */
size_t zoff_gpt2_device_bytes(const zoff_gpt2 *m);

/* GPT-2 initialisation into an fp32 host buffer of num_params elements:
 * weights ~ N(0, 0.02), residual projections (attn.c_proj, mlp.c_proj) ~ N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weight 1 / bias 0, padded vocabulary rows of wte 0.
 * Element j of tensor i is number j of the counter-based stream (seed, i)
 * (zoff_rng_normal): deterministic for a seed, the same for any thread count
 * or split into ranges. Runs on the OpenMP threads. */
void zoff_gpt2_init_params(const zoff_gpt2 *m, uint64_t seed, float *host_params);
/* The same values for the flat elements [lo, hi) only, into dst[0, hi - lo):
 * lets a caller generate each piece straight into its final place. */
void zoff_gpt2_init_params_range(const zoff_gpt2 *m, uint64_t seed, int64_t lo, int64_t hi, float *dst);

/* Forward pass on the device's stream. tokens, targets: device int32 (B,T) with B <= batch_size,
 * T <= seq_len. targets may be NULL (logits only). Losses per token stay on the device;
 * zoff_gpt2_mean_loss synchronises and returns their mean. The model copies tokens and targets
 * on the stream (backward uses its copies), so the caller's buffers may be reused once the stream
 * has run past this call (synchronise, or record an event), not before. */
zoff_status zoff_gpt2_forward(zoff_gpt2 *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T);
zoff_status zoff_gpt2_mean_loss(zoff_gpt2 *m, float *loss);
/* Device pointer to the logits (B,T,Vp) of the last forward (valid until backward). */
const void *zoff_gpt2_logits(zoff_gpt2 *m);

/* Backward for the last forward (which must have had targets). Gradients are
 * ACCUMULATED into the flat gradient buffer (zero it with memset between steps);
 * the loss gradient is dloss_scale / (B*T) per token (dloss_scale = loss scale / accumulation steps).
 * ready (may be NULL) is called as each contiguous range of gradients becomes final. */
zoff_status zoff_gpt2_backward(zoff_gpt2 *m, float dloss_scale, zoff_grad_ready_fn ready, void *ready_arg);

#ifdef __cplusplus
}
#endif
#endif
