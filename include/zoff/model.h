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
#include "zoff/param_space.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct zoff_gpt2_shape {
    int64_t num_layers;       /* L */
    int64_t hidden_size;      /* C */
    int64_t num_heads;        /* NH, C % NH == 0 */
    int64_t max_seq_len;      /* maxT: rows of wpe */
    int64_t vocab_size;       /* V */
    int64_t padded_vocab_size;/* Vp >= V (rows of wte; 0 = round V up to a multiple of 128) */
} zoff_gpt2_shape;

typedef struct zoff_gpt2 zoff_gpt2;

/* ---- GPT-2's layout: a pure function of the shape (src/model/gpt2_layout.c) ----
 *
 * The one table of bounds of a GPT-2 shape and of a run's sizes: the model checks them, and
 * every command's flags (zoff train, zoff plan, zoff bench) accept exactly these ranges. They
 * keep every element count far inside int64 and every token id inside int32 (GPT-2 XL is
 * L=48, C=1600). num_heads is bounded by hidden_size (it must divide it). */
#define ZOFF_GPT2_MAX_LAYERS ((int64_t)1 << 16)
#define ZOFF_GPT2_MAX_HIDDEN ((int64_t)1 << 17)
#define ZOFF_GPT2_MAX_SEQ ((int64_t)1 << 24)        /* max_seq_len (rows of wpe) and seq_len */
#define ZOFF_GPT2_MAX_VOCAB ((int64_t)INT32_MAX)    /* the model: token ids are int32 on the device */
#define ZOFF_GPT2_MAX_TRAIN_VOCAB ((int64_t)65536)  /* training: token shards store uint16 ids */
#define ZOFF_GPT2_MAX_BATCH ((int64_t)1 << 24)      /* micro-batch size */

/* The tensors of one block in layout order: name after "h.<l>.", and zoff's shape
 * (out_mult*C, in_mult*C), or (out_mult*C) when in_mult == 0 (biases, LayerNorm). */
#define ZOFF_GPT2_BLOCK_TENSORS 12
typedef struct zoff_gpt2_block_tensor {
    const char *suffix;
    int out_mult, in_mult;
} zoff_gpt2_block_tensor;
extern const zoff_gpt2_block_tensor zoff_gpt2_block_table[ZOFF_GPT2_BLOCK_TENSORS];

/* padded_vocab_size, or vocab_size rounded up to a multiple of 128 when it is 0. */
int64_t zoff_gpt2_padded_vocab(const zoff_gpt2_shape *s);
/* Parameters of one block: 12 C^2 + 13 C. */
int64_t zoff_gpt2_block_params(int64_t hidden_size);
/* All parameters: Vp C + maxT C + L (12 C^2 + 13 C) + 2 C (the tied LM head is wte). */
int64_t zoff_gpt2_count_params(const zoff_gpt2_shape *s);
/* Model FLOPs of one training step (forward and backward) on B sequences of T tokens, as the
 * op profiler counts them (device.h, zoff_op_flops): every Linear of the blocks and the LM
 * head (Vp columns) 2 N in out forward, twice that backward (dinp and dweight); causal
 * attention forward and backward per layer. No recomputation, no optimizer. */
double zoff_gpt2_step_flops(const zoff_gpt2_shape *s, int64_t B, int64_t T);
/* Entries of the tensor table: wte, wpe, 12 per block, ln_f.weight, ln_f.bias. */
int zoff_gpt2_num_tensors(int64_t num_layers);
/* Is the shape inside the bounds above (and num_heads divides hidden_size)? No message. */
bool zoff_gpt2_shape_in_bounds(const zoff_gpt2_shape *s);
/* Same check with a message naming the field, its value and its range, prefixed by `who`;
 * *resolved (may be NULL) gets the shape with padded_vocab_size resolved. */
zoff_status zoff_gpt2_check_shape(const zoff_gpt2_shape *s, const char *who, zoff_gpt2_shape *resolved);
/* Fills the tensor table (zoff_gpt2_num_tensors entries; the flat layout of the file comment)
 * of a checked shape and returns the parameter count. */
int64_t zoff_gpt2_tensor_table(const zoff_gpt2_shape *s, zoff_tensor_info *tensors);

typedef struct zoff_gpt2_options {
    zoff_gpt2_shape shape;
    int64_t batch_size;        /* B: activations are allocated for B x seq_len tokens */
    int64_t seq_len;           /* T <= max_seq_len */
    zoff_dtype dtype;          /* storage dtype of weights/activations on the device */
    bool checkpoint_activations; /* recompute each block's activations during backward */
    /* No flat parameter/gradient buffers: the weights are provided, group by group,
     * through zoff_param_hooks (ZeRO stage 3). zoff_gpt2_params/grads return NULL. */
    bool external_params;
    /* No flat gradient buffer (the weights stay in the flat parameter buffer): backward
     * asks for each group's gradient buffer through zoff_grad_hooks (the engine's bounded
     * buckets under optimizer offload: zoff_placement_grad_buckets). zoff_gpt2_grads
     * returns NULL. */
    bool external_grads;
} zoff_gpt2_options;

/* Stages 1-2 (flat buffers): before forward issues the first op that reads a
 * parameter group (the groups of zoff_param_hooks, zoff/param_space.h) it calls fn(arg, s, offset, count),
 * which orders s after that group's newest weights (the engine's
 * zoff_engine_wait_weights: the host optimizer's copies arrive group by group).
 * NULL fn: none (the default). */
typedef zoff_status (*zoff_weight_wait_fn)(void *arg, zoff_stream *s, int64_t offset, int64_t count);
zoff_status zoff_gpt2_set_weight_wait(zoff_gpt2 *m, zoff_weight_wait_fn fn, void *arg);

/* Stages 1-2: right after the lm-head backward, backward reports wte's gradient final
 * except the rows of the micro-batch's token ids through fn (zoff_grad_rows_fn,
 * zoff/param_space.h; the engine's zoff_engine_grad_rows). The forward then copies
 * its tokens to the host on the stream (N int32) and backward waits for that copy
 * before the head. NULL fn: none (the default). Set it before a forward. */
zoff_status zoff_gpt2_set_grad_rows(zoff_gpt2 *m, zoff_grad_rows_fn fn, void *arg);

/* Validates the shape (clear error naming the field), allocates parameters,
 * gradients and activations on dev (failing with ZOFF_ERR_DEVICE_OOM if over budget). */
zoff_status zoff_gpt2_create(zoff_device *dev, const zoff_gpt2_options *opts, zoff_gpt2 **out);
void zoff_gpt2_destroy(zoff_gpt2 *m);
/* Install the hooks of a model created with external_params (copied). */
zoff_status zoff_gpt2_set_param_hooks(zoff_gpt2 *m, const zoff_param_hooks *hooks);
/* Install the gradient hooks of a model created with external_grads (copied). */
zoff_status zoff_gpt2_set_grad_hooks(zoff_gpt2 *m, const zoff_grad_hooks *hooks);

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

/* Weights that hold NaN or Inf make every loss and logit NaN. zoff_gpt2_count_nonfinite: the values
 * among w, the fp32 weights of the flat elements [lo, hi) (w[0] is element lo), that are not finite
 * are added to *count, and *first (-1: none yet) becomes the lowest index of a tensor holding one;
 * calls over disjoint ranges add up. zoff_gpt2_nonfinite_error: ZOFF_OK for a count of 0, else
 * ZOFF_ERR_INVALID naming the count and tensor `first` (eval, sample and train --init-from). */
void zoff_gpt2_count_nonfinite(const zoff_gpt2 *m, int64_t lo, int64_t hi, const float *w, int64_t *count,
                               int *first);
zoff_status zoff_gpt2_nonfinite_error(const zoff_gpt2 *m, int64_t count, int first);

/* Forward pass on the device's stream, for evaluation and sampling. tokens, targets: device int32
 * (B,T) with B <= batch_size, T <= seq_len. targets may be NULL (logits only). With targets the
 * per-token losses are copied to a pinned host buffer on the stream; zoff_gpt2_mean_loss waits for
 * that copy only (not for later work) and returns their mean. The model copies tokens and targets
 * on the stream (backward uses its copies), so the caller's buffers may be reused once the stream
 * has run past this call (synchronise, or record an event), not before. */
zoff_status zoff_gpt2_forward(zoff_gpt2 *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T);
/* Forward pass for training (targets required): as zoff_gpt2_forward, and the cross-entropy op
 * computes the losses and the loss gradient in one pass over the logits (llm.c's fused classifier):
 * dlogits = (softmax - onehot(target)) * dloss_scale / (B*T) per token replace the logits (so
 * zoff_gpt2_logits returns NULL after it). dloss_scale = loss scale / accumulation steps
 * (zoff_engine_backward_scale, known before the forward). Call zoff_gpt2_backward next. */
zoff_status zoff_gpt2_forward_train(zoff_gpt2 *m, const int32_t *tokens, const int32_t *targets, int64_t B,
                                    int64_t T, float dloss_scale);
/* Mean loss of the last forward (either kind, with targets; still valid after backward). */
zoff_status zoff_gpt2_mean_loss(zoff_gpt2 *m, float *loss);
/* Generation, one token at a time: the forward of `token` (device, 1 id) at position pos after an
 * inference forward of batch 1 over positions 0..pos-1 (zoff_gpt2_forward, or this function at
 * pos-1). The keys and values of the earlier positions are reused from their rows of the block
 * activations (a cache of the whole prefix; attention itself is recomputed over it): only row pos
 * is computed, which gives the logits the full forward over 0..pos would give at row pos (to fp32
 * rounding; test_gpt2). The logits of rows 0..pos stay readable (zoff_gpt2_logits). Needs
 * pos < seq_len of create, no activation checkpointing and no parameter hooks. */
zoff_status zoff_gpt2_forward_next(zoff_gpt2 *m, const int32_t *token, int64_t pos);
/* Device pointer to the logits (B,T,Vp) of the last zoff_gpt2_forward (NULL after a training forward). */
const void *zoff_gpt2_logits(zoff_gpt2 *m);

/* Backward for the last zoff_gpt2_forward_train (an error after none, after zoff_gpt2_forward, or a
 * second time). Gradients are ACCUMULATED into the flat gradient buffer (zero it with memset
 * between steps). ready (may be NULL) is called as each contiguous range of gradients becomes final. */
zoff_status zoff_gpt2_backward(zoff_gpt2 *m, zoff_grad_ready_fn ready, void *ready_arg);

/* ---- picking the next token (src/model/sample.c; zoff sample) ---- */
typedef struct zoff_sample_options {
    double temperature; /* softmax temperature; <= 0: greedy (the most likely token) */
    int64_t top_k;      /* keep the top_k most likely tokens; 0 = all */
    double top_p;       /* then the smallest most-likely set holding top_p of the probability; 1 = all */
} zoff_sample_options;
/* A generator state for zoff_sample_pick from a user's seed. */
uint64_t zoff_sample_rng_init(uint64_t seed);
/* A token drawn from softmax(logits[0..V) / temperature) restricted by top_k, then top_p (as
 * Hugging Face's generate applies them; ties at a cut are kept); scratch holds V floats. */
int32_t zoff_sample_pick(const float *logits, int64_t V, const zoff_sample_options *o, uint64_t *rng,
                         float *scratch);

#ifdef __cplusplus
}
#endif
#endif
