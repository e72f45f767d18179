/* zoff parameter space: the contract between a model and an engine.
 *
 * A model keeps its parameters in one flat buffer described by a tensor table
 * (zoff_tensor_info), reports finished gradient ranges during backward
 * (zoff_grad_ready_fn), and, when the weights are partitioned (ZeRO stage 3),
 * asks for each group of them before use (zoff_param_hooks). An engine needs
 * only these types; it never includes a model's header (model.h includes this
 * one, and so does engine.h). */
#ifndef ZOFF_PARAM_SPACE_H
#define ZOFF_PARAM_SPACE_H

#include "zoff/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One tensor of a flat parameter buffer. Offsets and sizes count elements. */
typedef struct zoff_tensor_info {
    char name[64];     /* the model's name for it (GPT-2: Hugging Face's, e.g. "h.0.attn.c_attn.weight") */
    int64_t offset;    /* first element in the flat buffer */
    int64_t numel;
    int ndim;
    int64_t shape[4];  /* zoff's own layout: Linear weights are (out, in) */
    bool decay;        /* weight decay applies (matrices and embeddings: yes; biases, LayerNorm: no) */
    int layer;         /* transformer block index, -1 for embeddings / final LayerNorm */
} zoff_tensor_info;

/* Called during backward, in stream order, when the gradients of elements
 * [offset, offset + count) of the flat gradient buffer are final for this
 * micro-batch: all ops producing them have been issued on `stream`. The callee
 * may record an event on `stream` and copy them out on another stream. */
typedef void (*zoff_grad_ready_fn)(void *arg, zoff_stream *stream, int64_t offset, int64_t count);

/* Optional early, row-sparse report (a model may never make it; a callee may ignore it
 * and lose nothing). Called during backward, in stream order like zoff_grad_ready_fn,
 * when [offset, offset + count), made of rows of row_len elements, is final for this
 * micro-batch except the rows listed: rows[0..nrows), ascending and distinct, row r
 * being elements [offset + r row_len, offset + (r + 1) row_len). The array is the
 * caller's, valid during the call only. Later in the same backward the range's
 * ordinary grad-ready call reports it (the listed rows included) final, as without
 * this call. GPT-2: the tied wte after the lm-head backward, the rows being the
 * micro-batch's token ids (the embedding backward adds into those only). */
typedef void (*zoff_grad_rows_fn)(void *arg, zoff_stream *stream, int64_t offset, int64_t count, int64_t row_len,
                                  const int64_t *rows, int64_t nrows);

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

/* Gradient buffer provider (stages 1-2 with the weights in the model's flat buffer; the
 * engine's bounded gradient buckets under optimizer offload). A model created without a
 * flat gradient buffer calls acquire in backward before the first op that writes a
 * group's gradients (the groups of zoff_param_hooks, in the same order and with the same
 * holding: the embeddings from the lm head to the end of backward), gets a buffer of the
 * group's size that starts at zero (backward accumulates into it), valid in stream order
 * on `s`, and calls release after the group's grad-ready call, once it issued the last
 * op that writes it. The callee may reuse the buffer for a later group after release. */
typedef struct zoff_grad_hooks {
    void *arg;
    zoff_status (*acquire)(void *arg, zoff_stream *s, int64_t offset, int64_t count, void **grads);
    zoff_status (*release)(void *arg, zoff_stream *s, int64_t offset, int64_t count);
} zoff_grad_hooks;

#ifdef __cplusplus
}
#endif
#endif
