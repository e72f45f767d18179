/* GPT-2 forward and backward on the zoff device interface.
 *
 * Every kernel goes through ZOFF_LAUNCH on the device's compute stream and
 * every byte moves through zoff_memcpy_async / zoff_memset_async, so the same
 * code runs on the CPU backend and on CUDA.
 *
 * Notation: B batch, T sequence length, N = B*T tokens, C hidden size,
 * NH heads, HS = C/NH, L layers, V vocabulary, Vp padded vocabulary (rows of
 * wte), maxT rows of wpe. "dt" is the storage dtype chosen at create;
 * LayerNorm statistics, attention log-sum-exp and losses are always fp32.
 *
 * Flat parameter layout (elements), see include/zoff/model.h:
 *   wte (Vp,C) | wpe (maxT,C) | h.0 | h.1 | ... | h.{L-1} | ln_f.weight (C) | ln_f.bias (C)
 * and each block h.l is, in this order (Hugging Face names under "h.l."):
 *   ln_1.weight (C), ln_1.bias (C),
 *   attn.c_attn.weight (3C,C), attn.c_attn.bias (3C),
 *   attn.c_proj.weight (C,C),  attn.c_proj.bias (C),
 *   ln_2.weight (C), ln_2.bias (C),
 *   mlp.c_fc.weight (4C,C),    mlp.c_fc.bias (4C),
 *   mlp.c_proj.weight (C,4C),  mlp.c_proj.bias (C)
 * Linear weights are (out, in), like torch.nn.Linear. Hugging Face GPT-2
 * stores them as Conv1D (in, out): a safetensors export/import must
 * transpose the four *.weight matrices of attn.c_attn, attn.c_proj,
 * mlp.c_fc and mlp.c_proj, and must drop/zero-fill rows V..Vp-1 of wte
 * (Hugging Face's wte is (V,C)). The gradient buffer has the same layout.
 *
 * Activations, per block l (forward saves them for backward):
 *   resid[l] (N,C) block input (residual stream); resid[0] = embeddings,
 *   resid[L] = input of ln_f
 *   ln1 (N,C) + ln1_mean, ln1_rstd (N) fp32
 *   qkv (N,3C); atty (N,C) attention output + lse (B,NH,T) fp32
 *   res2 (N,C) = resid[l] + attn.c_proj(atty)
 *   ln2 (N,C) + ln2_mean, ln2_rstd (N) fp32
 *   fch (N,4C) = mlp.c_fc(ln2); fch_gelu (N,4C) = GELU(fch)
 *   resid[l+1] = res2 + mlp.c_proj(fch_gelu)
 * Each residual add is fused with the LayerNorm that reads its sum (ZOFF_OP_RESIDUAL_LAYERNORM_FWD):
 * res2 with ln_2; resid[l+1] with block l+1's ln_1 (ln_f after the last block), so between
 * block l's mlp.c_proj and that op resid[l+1] holds mlp.c_proj's output alone.
 * With checkpoint_activations only resid[0..L] are kept per block and a
 * single set of block activations is shared: backward recomputes block l
 * from resid[l] with the very same ops, so gradients are bit-identical.
 * The last block's activations are still in the shared set when backward
 * starts, so it is not recomputed. */
#include "zoff/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensors of one block, in layout order. */
enum {
    P_LN1W = 0, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB,
    P_PER_BLOCK
};
/* Tensor table index of wte, wpe; blocks start at 2; ln_f.* follow the blocks. */
#define T_WTE 0
#define T_WPE 1
#define T_BLOCK(l, k) (2 + (l) * P_PER_BLOCK + (k))

_Static_assert(P_PER_BLOCK == ZOFF_GPT2_BLOCK_TENSORS, "the block enum follows zoff_gpt2_block_table");

/* Activations of one block (pointers into the activation allocation). */
typedef struct gpt2_block_acts {
    void *ln1; float *ln1_mean, *ln1_rstd; /* (N,C), (N), (N) */
    void *qkv;                             /* (N,3C) */
    void *atty; float *lse;                /* (N,C), (B,NH,T) */
    void *res2;                            /* (N,C) */
    void *ln2; float *ln2_mean, *ln2_rstd; /* (N,C), (N), (N) */
    void *fch, *fch_gelu;                  /* (N,4C), (N,4C) */
} gpt2_block_acts;

/* A parameter group (the embeddings, one block, the final layernorm): its range of the model's
 * parameters and, while in use, where its weights and gradients are. */
typedef struct param_group {
    int64_t off, count;
    void *p, *g;
} param_group;

struct zoff_gpt2 {
    zoff_device *dev;
    zoff_gpt2_shape shape; /* padded_vocab_size resolved */
    int64_t cap_B, cap_T;  /* activation capacity */
    zoff_dtype dt;
    size_t dts;            /* bytes per element of dt */
    bool checkpoint;

    zoff_tensor_info *tensors;
    int ntensors;
    int64_t num_params;
    int64_t block_numel;   /* elements of one block */

    void *params, *grads;  /* flat (num_params) of dt; NULL with external_params */
    /* parameter groups (zoff_param_hooks): 0 = [wte, wpe], 1 + l = block l, L + 1 = ln_f;
     * gp/gg: where each group's weights / gradients are now (flat buffers, or what acquire gave) */
    bool external;
    zoff_param_hooks hooks;
    bool have_hooks;
    bool external_grads;   /* no flat gradient buffer: grad_hooks give each group's in backward */
    zoff_grad_hooks grad_hooks;
    bool have_grad_hooks;
    zoff_weight_wait_fn wait_fn; /* flat buffers: forward waits for each group's weights (may be NULL) */
    void *wait_arg;
    int ngroups;
    param_group *groups; /* [ngroups] */
    void *acts_mem;        /* one allocation carved below */
    size_t params_bytes, grads_bytes, acts_bytes;

    void **resid;          /* L+1 pointers, each (N,C) */
    gpt2_block_acts *blocks; /* L sets, or 1 when checkpointing */
    int nblock_sets;
    void *lnf; float *lnf_mean, *lnf_rstd; /* (N,C), (N), (N) */
    void *logits;          /* (N,Vp); dlogits in their place after a training forward */
    float *losses;         /* (N) */
    int32_t *tokens, *targets; /* (N) copies of the caller's batch */
    /* backward scratch */
    void *dresid;          /* (N,C) gradient of the residual stream */
    void *dln;             /* (N,C) gradient of a LayerNorm output */
    void *datty;           /* (N,C) */
    void *dqkv;            /* (N,3C) */
    void *dfch;            /* (N,4C) */

    float *host_losses;    /* pinned (cap_B*cap_T): the last forward's losses, copied on the stream */
    zoff_event *losses_copied; /* recorded after that copy: zoff_gpt2_mean_loss waits for it only */

    /* the early row-sparse report of wte's gradient (zoff_gpt2_set_grad_rows) */
    zoff_grad_rows_fn rows_fn;
    void *rows_arg;
    int32_t *host_tokens;  /* pinned (cap_B*cap_T): the last forward's tokens, copied on the stream */
    zoff_event *ev_tokens; /* ... recorded after that copy */
    bool tokens_copied;    /* the last forward issued it */
    uint8_t *row_mark;     /* (Vp) scratch: which rows the batch uses */
    int64_t *rows;         /* (min(cap_B*cap_T, Vp)) their sorted ids */

    /* state of the last forward */
    int64_t fwd_B, fwd_T;
    bool have_logits;      /* logits of an evaluation forward (zoff_gpt2_logits) */
    bool have_dlogits;     /* a training forward's dlogits, for the next backward */
    bool have_losses;      /* the last forward had targets: host_losses will hold its losses */
};

/* ------------------------------------------------------------------ helpers */

static void *elem_ptr(void *base, int64_t elem, size_t dts) {
    return (char *)base + (size_t)elem * dts;
}

static int group_of(const zoff_gpt2 *m, int t) {
    if (t < T_BLOCK(0, 0)) return 0;
    if (t >= T_BLOCK(m->shape.num_layers, 0)) return m->ngroups - 1;
    return 1 + (t - T_BLOCK(0, 0)) / P_PER_BLOCK;
}

static void *param_ptr(const zoff_gpt2 *m, int t) {
    int g = group_of(m, t);
    return elem_ptr(m->groups[g].p, m->tensors[t].offset - m->groups[g].off, m->dts);
}

static void *grad_ptr(const zoff_gpt2 *m, int t) {
    int g = group_of(m, t);
    return elem_ptr(m->groups[g].g, m->tensors[t].offset - m->groups[g].off, m->dts);
}

/* Parameter group g is about to be used / is no longer used (hooks; nothing with flat buffers). */
static zoff_status group_use(zoff_gpt2 *m, int g, bool backward) {
    if (!m->external && backward && m->external_grads) {
        if (!m->have_grad_hooks)
            return zoff_error(ZOFF_ERR_INVALID, "GPT-2 without a gradient buffer (external_grads): no gradient hooks "
                                                "installed (zoff_gpt2_set_grad_hooks)");
        void *gr = NULL;
        zoff_status s = m->grad_hooks.acquire(m->grad_hooks.arg, zoff_device_stream(m->dev), m->groups[g].off,
                                              m->groups[g].count, &gr);
        if (s != ZOFF_OK) return zoff_error_context(s, "acquiring the gradient buffer of parameter group %d", g);
        m->groups[g].g = gr;
        return ZOFF_OK;
    }
    if (!m->external) { /* backward comes after a forward that waited, in stream order */
        if (!m->wait_fn || backward) return ZOFF_OK;
        zoff_status s = m->wait_fn(m->wait_arg, zoff_device_stream(m->dev), m->groups[g].off, m->groups[g].count);
        return s == ZOFF_OK ? s : zoff_error_context(s, "waiting for the weights of parameter group %d", g);
    }
    if (!m->have_hooks)
        return zoff_error(ZOFF_ERR_INVALID, "GPT-2 with external parameters: no parameter hooks installed "
                                            "(zoff_gpt2_set_param_hooks)");
    void *p = NULL, *gr = NULL;
    const param_group *pg = &m->groups[g];
    zoff_status s = m->hooks.acquire(m->hooks.arg, zoff_device_stream(m->dev), pg->off, pg->count, backward, &p,
                                     backward ? &gr : NULL);
    if (s != ZOFF_OK) return zoff_error_context(s, "acquiring the weights of parameter group %d", g);
    m->groups[g].p = p;
    if (backward) m->groups[g].g = gr;
    return ZOFF_OK;
}

static zoff_status group_done(zoff_gpt2 *m, int g, bool backward) {
    if (!m->external && backward && m->external_grads) {
        zoff_status s = m->grad_hooks.release(m->grad_hooks.arg, zoff_device_stream(m->dev), m->groups[g].off,
                                              m->groups[g].count);
        m->groups[g].g = NULL;
        return s == ZOFF_OK ? s : zoff_error_context(s, "releasing the gradient buffer of parameter group %d", g);
    }
    if (!m->external) return ZOFF_OK;
    zoff_status s = m->hooks.release(m->hooks.arg, zoff_device_stream(m->dev), m->groups[g].off, m->groups[g].count,
                                         backward);
    if (s != ZOFF_OK) return zoff_error_context(s, "releasing the weights of parameter group %d", g);
    return ZOFF_OK;
}

static zoff_status pass_begin(zoff_gpt2 *m, bool backward) {
    if (!m->external || !m->have_hooks || !m->hooks.begin_pass) return ZOFF_OK;
    return m->hooks.begin_pass(m->hooks.arg, zoff_device_stream(m->dev), backward);
}

zoff_status zoff_gpt2_set_weight_wait(zoff_gpt2 *m, zoff_weight_wait_fn fn, void *arg) {
    if (!m) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_weight_wait: model is NULL");
    if (m->external)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_weight_wait: the model has external parameters (stage 3): "
                                            "its zoff_param_hooks provide the weights");
    m->wait_fn = fn;
    m->wait_arg = arg;
    return ZOFF_OK;
}

zoff_status zoff_gpt2_set_grad_rows(zoff_gpt2 *m, zoff_grad_rows_fn fn, void *arg) {
    if (!m) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_grad_rows: model is NULL");
    if (m->external && fn)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_grad_rows: the model has external parameters (stage 3): "
                                            "its gradients are reported group by group only");
    if (fn) { /* what is missing (a failed call leaves the rest for the next one) */
        const int64_t N = m->cap_B * m->cap_T, Vp = m->shape.padded_vocab_size;
        if (!m->host_tokens)
            ZOFF_TRY(zoff_host_alloc_pinned(m->dev, (size_t)N * sizeof(int32_t), "gpt2 host tokens",
                                            (void **)&m->host_tokens));
        if (!m->ev_tokens) ZOFF_TRY(zoff_event_create(m->dev, &m->ev_tokens));
        if (!m->row_mark) m->row_mark = calloc((size_t)Vp, 1);
        if (!m->rows) m->rows = malloc((size_t)(N < Vp ? N : Vp) * sizeof(int64_t));
        if (!m->row_mark || !m->rows)
            return zoff_error(ZOFF_ERR_NOMEM, "zoff_gpt2_set_grad_rows: out of host memory for the row lists");
    }
    m->rows_fn = fn;
    m->rows_arg = arg;
    m->tokens_copied = false;
    return ZOFF_OK;
}

/* After the lm-head backward: wte's gradient is final except the rows of the batch's
 * token ids (the embedding backward adds into those only). Their sorted list from the
 * forward's host copy of the tokens; nothing when an id is out of range (the embedding
 * backward reports that). */
static zoff_status report_wte_rows(zoff_gpt2 *m, zoff_stream *s, int64_t N) {
    if (!m->rows_fn || !m->tokens_copied) return ZOFF_OK;
    ZOFF_TRY(zoff_event_synchronize(m->ev_tokens)); /* the forward's first copy: long done */
    const int64_t V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    for (int64_t i = 0; i < N; i++)
        if (m->host_tokens[i] < 0 || m->host_tokens[i] >= V) return ZOFF_OK;
    int64_t n = 0;
    for (int64_t i = 0; i < N; i++) m->row_mark[m->host_tokens[i]] = 1;
    for (int64_t r = 0; r < Vp; r++)
        if (m->row_mark[r]) {
            m->row_mark[r] = 0;
            m->rows[n++] = r;
        }
    const zoff_tensor_info *wte = &m->tensors[T_WTE];
    m->rows_fn(m->rows_arg, s, wte->offset, wte->numel, m->shape.hidden_size, m->rows, n);
    return ZOFF_OK;
}

zoff_status zoff_gpt2_set_param_hooks(zoff_gpt2 *m, const zoff_param_hooks *hooks) {
    if (!m || !hooks || !hooks->acquire || !hooks->release)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_param_hooks: model, acquire or release is NULL");
    if (!m->external)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_param_hooks: the model was created with its own "
                                            "parameter buffers; create it with external_params");
    m->hooks = *hooks;
    m->have_hooks = true;
    return ZOFF_OK;
}

zoff_status zoff_gpt2_set_grad_hooks(zoff_gpt2 *m, const zoff_grad_hooks *hooks) {
    if (!m || !hooks || !hooks->acquire || !hooks->release)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_grad_hooks: model, acquire or release is NULL");
    if (!m->external_grads)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_set_grad_hooks: the model was created with its own "
                                            "gradient buffer; create it with external_grads");
    m->grad_hooks = *hooks;
    m->have_grad_hooks = true;
    return ZOFF_OK;
}

/* Bump allocator over one device allocation. With base == NULL it only
 * measures; overflow of size_t arithmetic is recorded, never wrapped. */
typedef struct carver {
    char *base;
    size_t off;
    bool overflow;
} carver;

static void *carve(carver *c, int64_t count, size_t elem_size) {
    size_t bytes, start;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elem_size, &bytes) ||
        __builtin_add_overflow(c->off, (size_t)255, &start)) {
        c->overflow = true;
        return NULL;
    }
    start &= ~(size_t)255;
    if (__builtin_add_overflow(start, bytes, &c->off)) {
        c->overflow = true;
        return NULL;
    }
    return c->base ? c->base + start : NULL;
}

/* Lay out all activations for N = cap_B*cap_T tokens (see the file comment). */
static void layout_activations(zoff_gpt2 *m, carver *c) {
    const int64_t L = m->shape.num_layers, C = m->shape.hidden_size;
    const int64_t NH = m->shape.num_heads, Vp = m->shape.padded_vocab_size;
    const int64_t N = m->cap_B * m->cap_T;
    const size_t d = m->dts;
    for (int64_t l = 0; l <= L; l++) m->resid[l] = carve(c, N * C, d);
    for (int i = 0; i < m->nblock_sets; i++) {
        gpt2_block_acts *a = &m->blocks[i];
        a->ln1 = carve(c, N * C, d);
        a->ln1_mean = carve(c, N, sizeof(float));
        a->ln1_rstd = carve(c, N, sizeof(float));
        a->qkv = carve(c, N * 3 * C, d);
        a->atty = carve(c, N * C, d);
        a->lse = carve(c, N * NH, sizeof(float));
        a->res2 = carve(c, N * C, d);
        a->ln2 = carve(c, N * C, d);
        a->ln2_mean = carve(c, N, sizeof(float));
        a->ln2_rstd = carve(c, N, sizeof(float));
        a->fch = carve(c, N * 4 * C, d);
        a->fch_gelu = carve(c, N * 4 * C, d);
    }
    m->lnf = carve(c, N * C, d);
    m->lnf_mean = carve(c, N, sizeof(float));
    m->lnf_rstd = carve(c, N, sizeof(float));
    /* N*Vp can exceed int64 only past the bounds checked in validate_options */
    m->logits = carve(c, N * Vp, d);
    m->losses = carve(c, N, sizeof(float));
    m->tokens = carve(c, N, sizeof(int32_t));
    m->targets = carve(c, N, sizeof(int32_t));
    m->dresid = carve(c, N * C, d);
    m->dln = carve(c, N * C, d);
    m->datty = carve(c, N * C, d);
    m->dqkv = carve(c, N * 3 * C, d);
    m->dfch = carve(c, N * 4 * C, d);
}

/* Fill the tensor table (the flat layout of the file comment, zoff_gpt2_tensor_table). */
static void build_tensor_table(zoff_gpt2 *m) {
    m->num_params = zoff_gpt2_tensor_table(&m->shape, m->tensors);
    /* T_BLOCK(1, 0) is ln_f.weight when L == 1 */
    m->block_numel = m->tensors[T_BLOCK(1, 0)].offset - m->tensors[T_BLOCK(0, 0)].offset;
}

/* Check the options; resolve the padded vocabulary into *shape. */
static zoff_status validate_options(const zoff_gpt2_options *o, zoff_gpt2_shape *shape) {
    const zoff_gpt2_shape *s = &o->shape;
    const char *w = "zoff_gpt2_create";
    ZOFF_TRY(zoff_gpt2_check_shape(s, w, shape));
    const int64_t Vp = shape->padded_vocab_size;
    if (o->batch_size < 1 || o->batch_size > ZOFF_GPT2_MAX_BATCH)
        return zoff_error(ZOFF_ERR_INVALID, "%s: batch_size is %lld; it must be in [1, %lld]",
                          w, (long long)o->batch_size, (long long)ZOFF_GPT2_MAX_BATCH);
    if (o->seq_len < 1 || o->seq_len > s->max_seq_len)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s: seq_len is %lld but shape.max_seq_len is %lld; seq_len must be in [1, max_seq_len] "
                          "(raise max_seq_len or shorten the sequences)",
                          w, (long long)o->seq_len, (long long)s->max_seq_len);
    if (o->dtype != ZOFF_F32 && o->dtype != ZOFF_BF16 && o->dtype != ZOFF_F16)
        return zoff_error(ZOFF_ERR_INVALID, "%s: dtype is %d (%s); use ZOFF_F32, ZOFF_BF16 or ZOFF_F16",
                          w, (int)o->dtype, (unsigned)o->dtype < ZOFF_DTYPE_COUNT ? zoff_dtype_name(o->dtype) : "?");
    /* N*Vp and N*4C must fit int64 (counts passed to the ops) */
    int64_t N = o->batch_size * o->seq_len, tmp;
    if (__builtin_mul_overflow(N, Vp, &tmp) || __builtin_mul_overflow(N, 4 * s->hidden_size, &tmp))
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s: batch_size*seq_len (%lld) is too large for vocabulary %lld and hidden size %lld",
                          w, (long long)N, (long long)Vp, (long long)s->hidden_size);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ create / destroy */

void zoff_gpt2_destroy(zoff_gpt2 *m) {
    if (!m) return;
    if (m->dev) {
        zoff_stream *s = zoff_device_stream(m->dev);
        /* no op may still use these buffers; a sticky stream error is not ours to report here */
        if (s) (void)zoff_stream_synchronize(s);
        if (m->params) zoff_device_free(m->dev, m->params);
        if (m->grads) zoff_device_free(m->dev, m->grads);
        if (m->acts_mem) zoff_device_free(m->dev, m->acts_mem);
        if (m->host_losses) zoff_host_free_pinned(m->dev, m->host_losses);
        zoff_event_destroy(m->losses_copied);
        if (m->host_tokens) zoff_host_free_pinned(m->dev, m->host_tokens);
        zoff_event_destroy(m->ev_tokens);
    }
    ZOFF_FREE_ALL(m->row_mark, m->rows, m->tensors, m->resid, m->blocks, m->groups, m);
}

zoff_status zoff_gpt2_create(zoff_device *dev, const zoff_gpt2_options *opts, zoff_gpt2 **out) {
    if (!out) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_create: out is NULL");
    *out = NULL;
    if (!dev || !opts) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_create: dev or opts is NULL");
    zoff_gpt2_shape shape;
    ZOFF_TRY(validate_options(opts, &shape));

    zoff_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return zoff_error(ZOFF_ERR_NOMEM, "zoff_gpt2_create: out of host memory for the model struct");
    m->dev = dev;
    m->shape = shape;
    m->cap_B = opts->batch_size;
    m->cap_T = opts->seq_len;
    m->dt = opts->dtype;
    m->dts = zoff_dtype_size(opts->dtype);
    m->checkpoint = opts->checkpoint_activations;
    const int64_t L = shape.num_layers;
    m->ntensors = zoff_gpt2_num_tensors(L);
    m->nblock_sets = m->checkpoint ? 1 : (int)L;
    m->tensors = calloc((size_t)m->ntensors, sizeof *m->tensors);
    m->resid = calloc((size_t)L + 1, sizeof *m->resid);
    m->blocks = calloc((size_t)m->nblock_sets, sizeof *m->blocks);
    if (!m->tensors || !m->resid || !m->blocks) {
        zoff_gpt2_destroy(m);
        return zoff_error(ZOFF_ERR_NOMEM, "zoff_gpt2_create: out of host memory for the tensor table (%d tensors)",
                          2 + (int)L * P_PER_BLOCK + 2);
    }
    build_tensor_table(m);
    m->external = opts->external_params;
    m->external_grads = opts->external_grads && !m->external;
    m->ngroups = (int)L + 2;
    m->groups = calloc((size_t)m->ngroups, sizeof *m->groups);
    if (!m->groups) {
        zoff_gpt2_destroy(m);
        return zoff_error(ZOFF_ERR_NOMEM, "zoff_gpt2_create: out of host memory for the parameter groups");
    }
    for (int gi = 0; gi < m->ngroups; gi++) {
        int first = gi == 0 ? T_WTE : gi == m->ngroups - 1 ? T_BLOCK(L, 0) : T_BLOCK(gi - 1, 0);
        int last = gi == 0 ? T_WPE : gi == m->ngroups - 1 ? T_BLOCK(L, 0) + 1 : T_BLOCK(gi - 1, P_PER_BLOCK - 1);
        m->groups[gi].off = m->tensors[first].offset;
        m->groups[gi].count = m->tensors[last].offset + m->tensors[last].numel - m->groups[gi].off;
    }

    char b1[32], b2[32];
    zoff_status st;
    m->params_bytes = m->external ? 0 : (size_t)m->num_params * m->dts;
    m->grads_bytes = m->external_grads ? 0 : m->params_bytes;
    carver measure = {0};
    layout_activations(m, &measure);
    if (measure.overflow) {
        zoff_gpt2_destroy(m);
        return zoff_error(ZOFF_ERR_INVALID,
                          "zoff_gpt2_create: activation memory for batch_size %lld x seq_len %lld overflows size_t",
                          (long long)opts->batch_size, (long long)opts->seq_len);
    }
    m->acts_bytes = measure.off;

    const char *ctx = "creating GPT-2 (L=%lld, C=%lld, B=%lld, T=%lld, %s; parameters %s, activations %s)";
#define CREATE_TRY(expr)                                                                              \
    do {                                                                                              \
        st = (expr);                                                                                  \
        if (st != ZOFF_OK) {                                                                          \
            zoff_error_context(st, ctx, (long long)L, (long long)shape.hidden_size,                   \
                               (long long)m->cap_B, (long long)m->cap_T, zoff_dtype_name(m->dt),      \
                               zoff_format_bytes(m->params_bytes, b1, sizeof b1),                     \
                               zoff_format_bytes(m->acts_bytes, b2, sizeof b2));                      \
            zoff_gpt2_destroy(m);                                                                     \
            return st;                                                                                \
        }                                                                                             \
    } while (0)
    if (!m->external) {
        CREATE_TRY(zoff_device_alloc(dev, m->params_bytes, "gpt2 parameters", &m->params));
        if (!m->external_grads) CREATE_TRY(zoff_device_alloc(dev, m->grads_bytes, "gpt2 gradients", &m->grads));
        for (int gi = 0; gi < m->ngroups; gi++) {
            m->groups[gi].p = elem_ptr(m->params, m->groups[gi].off, m->dts);
            m->groups[gi].g = m->grads ? elem_ptr(m->grads, m->groups[gi].off, m->dts) : NULL;
        }
    }
    CREATE_TRY(zoff_device_alloc(dev, m->acts_bytes, "gpt2 activations", &m->acts_mem));
    CREATE_TRY(zoff_host_alloc_pinned(dev, (size_t)(m->cap_B * m->cap_T) * sizeof(float), "gpt2 host losses",
                                      (void **)&m->host_losses));
    CREATE_TRY(zoff_event_create(dev, &m->losses_copied));
    carver place = {.base = m->acts_mem};
    layout_activations(m, &place);
    /* gradients start at zero: backward accumulates */
    if (m->grads) CREATE_TRY(zoff_memset_async(zoff_device_stream(dev), m->grads, 0, m->grads_bytes));
#undef CREATE_TRY
    *out = m;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ accessors */

const zoff_tensor_info *zoff_gpt2_tensors(const zoff_gpt2 *m, int *count) {
    if (count) *count = m ? m->ntensors : 0;
    return m ? m->tensors : NULL;
}
int64_t zoff_gpt2_num_params(const zoff_gpt2 *m) { return m ? m->num_params : 0; }
const zoff_gpt2_shape *zoff_gpt2_get_shape(const zoff_gpt2 *m) { return m ? &m->shape : NULL; }
void *zoff_gpt2_params(zoff_gpt2 *m) { return m ? m->params : NULL; }
void *zoff_gpt2_grads(zoff_gpt2 *m) { return m ? m->grads : NULL; }
size_t zoff_gpt2_device_bytes(const zoff_gpt2 *m) {
    return m ? m->params_bytes + m->grads_bytes + m->acts_bytes : 0;
}
const void *zoff_gpt2_logits(zoff_gpt2 *m) { return m && m->have_logits ? m->logits : NULL; }

/* ------------------------------------------------------------------ init */

/* Tensor i's rule: 0 zeros (biases), 1 ones (LayerNorm weights), 2 normal with
 * *std; *nrand: the elements drawn (wte: the real vocabulary rows; the padded
 * rows stay 0). */
static int init_rule(const zoff_gpt2 *m, int i, double *std, int64_t *nrand) {
    const zoff_tensor_info *t = &m->tensors[i];
    const char *leaf = strrchr(t->name, '.'); /* ".weight" / ".bias" */
    *nrand = 0;
    if (leaf && strcmp(leaf, ".bias") == 0) return 0;
    if (strstr(t->name, "ln_")) return 1;
    *std = 0.02;
    if (strstr(t->name, "attn.c_proj.weight") || strstr(t->name, "mlp.c_proj.weight"))
        *std = 0.02 / sqrt(2.0 * (double)m->shape.num_layers);
    *nrand = i == T_WTE ? m->shape.vocab_size * m->shape.hidden_size : t->numel;
    return 2;
}

/* Elements [lo, hi) of the flat space into dst[0, hi - lo), one thread. */
static void init_piece(const zoff_gpt2 *m, uint64_t seed, int64_t lo, int64_t hi, float *dst) {
    int i = 0; /* the tensors are sorted by offset: first one ending after lo */
    for (int a = 0, b = m->ntensors; a < b;) {
        int mid = (a + b) / 2;
        if (m->tensors[mid].offset + m->tensors[mid].numel <= lo) a = i = mid + 1;
        else b = mid;
    }
    int64_t e = lo;
    for (; e < hi && i < m->ntensors; i++) {
        const zoff_tensor_info *t = &m->tensors[i];
        if (t->offset > e) { /* a gap between tensors (none today): zeros */
            int64_t g = t->offset < hi ? t->offset : hi;
            memset(dst + (e - lo), 0, (size_t)(g - e) * sizeof(float));
            e = g;
            if (e >= hi) break;
        }
        int64_t a = e - t->offset, b = (t->offset + t->numel < hi ? t->offset + t->numel : hi) - t->offset;
        float *d = dst + (e - lo);
        double std = 0;
        int64_t nrand;
        int rule = init_rule(m, i, &std, &nrand);
        int64_t r = b < nrand ? b : nrand; /* [a, r) drawn, [max(a, r), b) zero */
        if (rule == 1) {
            for (int64_t j = a; j < b; j++) d[j - a] = 1.0f;
        } else {
            if (rule == 2 && r > a) zoff_rng_normal(seed, (uint32_t)i, a, r - a, (float)std, d);
            int64_t z0 = rule == 2 && r > a ? r : a;
            if (b > z0) memset(d + (z0 - a), 0, (size_t)(b - z0) * sizeof(float));
        }
        e = t->offset + b;
    }
    if (e < hi) memset(dst + (e - lo), 0, (size_t)(hi - e) * sizeof(float));
}

#define INIT_PIECE ((int64_t)1 << 16) /* elements per work item */

void zoff_gpt2_init_params_range(const zoff_gpt2 *m, uint64_t seed, int64_t lo, int64_t hi, float *dst) {
    if (!m || !dst || lo < 0 || hi <= lo) return;
    const int64_t npieces = (hi - lo + INIT_PIECE - 1) / INIT_PIECE;
    int t = zoff_par_threads((size_t)(hi - lo) * sizeof(float));
#pragma omp parallel for num_threads(t) schedule(dynamic, 4)
    for (int64_t k = 0; k < npieces; k++) {
        int64_t a = lo + k * INIT_PIECE, b = a + INIT_PIECE < hi ? a + INIT_PIECE : hi;
        init_piece(m, seed, a, b, dst + (a - lo));
    }
}

void zoff_gpt2_init_params(const zoff_gpt2 *m, uint64_t seed, float *host_params) {
    if (m) zoff_gpt2_init_params_range(m, seed, 0, m->num_params, host_params);
}

/* ------------------------------------------------------------------ finite check */

void zoff_gpt2_count_nonfinite(const zoff_gpt2 *m, int64_t lo, int64_t hi, const float *w, int64_t *count,
                               int *first) {
    for (int k = 0; m && k < m->ntensors; k++) {
        const zoff_tensor_info *t = &m->tensors[k];
        int64_t a = t->offset > lo ? t->offset : lo, b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        const uint32_t *u = (const uint32_t *)(const void *)(w + (a - lo));
        int64_t here = 0;
        for (int64_t i = 0; i < b - a; i++) here += (u[i] & 0x7F800000u) == 0x7F800000u; /* exponent all ones */
        *count += here;
        if (here && (*first < 0 || k < *first)) *first = k;
    }
}

zoff_status zoff_gpt2_nonfinite_error(const zoff_gpt2 *m, int64_t count, int first) {
    if (count == 0) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_INVALID,
                      "the weights hold %lld value(s) that are not finite (NaN or Inf), the first in %s: they "
                      "would make every loss and logit NaN; they come from a run that diverged or a damaged "
                      "file (use an earlier checkpoint, or write or download the file again)",
                      (long long)count, m && first >= 0 && first < m->ntensors ? m->tensors[first].name : "?");
}

/* ------------------------------------------------------------------ forward */

#define LAUNCH(op, args, ...)                                                 \
    do {                                                                      \
        zoff_status launch_s_ = ZOFF_LAUNCH(s, op, args);                     \
        if (launch_s_ != ZOFF_OK) return zoff_error_context(launch_s_, __VA_ARGS__); \
    } while (0)

/* Row r of a (rows, width) buffer of the model's dtype. */
static void *row_of(const zoff_gpt2 *m, void *base, int64_t r, int64_t width) {
    return (char *)base + (size_t)(r * width) * m->dts;
}

/* Block l forward for B,T (N = B*T rows) into the activations a; x = resid[l] (N,C).
 * prev: NULL when x is complete (the embeddings, or recomputing for backward); else the previous
 * block's activations, whose mlp residual is still to be added: x holds block l-1's mlp.c_proj
 * output, and the block's first op (fused with ln_1) makes it resid[l] = x + prev->res2.
 * out: receives mlp.c_proj's output (resid[l+1] without its residual, which the next block's
 * ln_1 or ln_f adds); NULL when recomputing for backward, which needs only a. The fused
 * LayerNorm of a residual is bit for bit the LayerNorm of the stored sum, so a recomputation
 * from the complete resid[l] gives the forward's activations exactly.
 * r0 > 0 (generation, B = T = 1): the rows are row r0 of every buffer (x and out point at it);
 * attention reads the keys and values of rows 0..r0 of qkv, the earlier forwards' ones. */
static zoff_status block_forward(zoff_gpt2 *m, int64_t l, gpt2_block_acts *a, const gpt2_block_acts *prev, void *x,
                                 void *out, int64_t B, int64_t T, int64_t r0) {
    zoff_stream *s = zoff_device_stream(m->dev);
    const int64_t C = m->shape.hidden_size, NH = m->shape.num_heads, N = B * T;
    const zoff_dtype dt = m->dt;
    const char *w = "GPT-2 forward, block %lld, %s";
#define P(k) param_ptr(m, T_BLOCK(l, k))
#define R(buf, width) row_of(m, (buf), r0, (width))
    if (prev) {
        zoff_op_residual_layernorm_fwd_args ln1 = {.resid = x, .out = R(a->ln1, C), .mean = a->ln1_mean + r0,
                                                   .rstd = a->ln1_rstd + r0, .a = x, .b = R(prev->res2, C),
                                                   .weight = P(P_LN1W), .bias = P(P_LN1B), .N = N, .C = C, .dt = dt};
        LAUNCH(ZOFF_OP_RESIDUAL_LAYERNORM_FWD, ln1, w, (long long)l, "previous mlp residual + ln_1");
    } else {
        zoff_op_layernorm_fwd_args ln1 = {.out = R(a->ln1, C), .mean = a->ln1_mean + r0, .rstd = a->ln1_rstd + r0,
                                          .inp = x, .weight = P(P_LN1W), .bias = P(P_LN1B), .N = N, .C = C, .dt = dt};
        LAUNCH(ZOFF_OP_LAYERNORM_FWD, ln1, w, (long long)l, "ln_1");
    }
    zoff_op_matmul_fwd_args qkv = {.out = R(a->qkv, 3 * C), .inp = R(a->ln1, C), .weight = P(P_QKVW),
                                   .bias = P(P_QKVB), .N = N, .C = C, .OC = 3 * C, .dt = dt};
    LAUNCH(ZOFF_OP_MATMUL_FWD, qkv, w, (long long)l, "attn.c_attn");
    /* (r0 > 0: over rows 0..r0, the earlier ones coming out as they were; only row r0 is read on) */
    zoff_op_attention_fwd_args att = {.out = a->atty, .lse = a->lse, .qkv = a->qkv,
                                      .B = B, .T = r0 + T, .C = C, .NH = NH, .dt = dt};
    LAUNCH(ZOFF_OP_ATTENTION_FWD, att, w, (long long)l, "attention");
    zoff_op_matmul_fwd_args proj = {.out = R(a->res2, C), .inp = R(a->atty, C), .weight = P(P_ATTPROJW),
                                    .bias = P(P_ATTPROJB), .N = N, .C = C, .OC = C, .dt = dt};
    LAUNCH(ZOFF_OP_MATMUL_FWD, proj, w, (long long)l, "attn.c_proj");
    zoff_op_residual_layernorm_fwd_args ln2 = {.resid = R(a->res2, C), .out = R(a->ln2, C), .mean = a->ln2_mean + r0,
                                               .rstd = a->ln2_rstd + r0, .a = R(a->res2, C), .b = x,
                                               .weight = P(P_LN2W), .bias = P(P_LN2B), .N = N, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_RESIDUAL_LAYERNORM_FWD, ln2, w, (long long)l, "attention residual + ln_2");
    zoff_op_matmul_fwd_args fc = {.out = R(a->fch, 4 * C), .inp = R(a->ln2, C), .weight = P(P_FCW), .bias = P(P_FCB),
                                  .N = N, .C = C, .OC = 4 * C, .dt = dt, .gelu_out = R(a->fch_gelu, 4 * C)};
    LAUNCH(ZOFF_OP_MATMUL_FWD, fc, w, (long long)l, "mlp.c_fc + gelu");
    if (out) {
        zoff_op_matmul_fwd_args fcproj = {.out = out, .inp = R(a->fch_gelu, 4 * C), .weight = P(P_FCPROJW),
                                          .bias = P(P_FCPROJB), .N = N, .C = 4 * C, .OC = C, .dt = dt};
        LAUNCH(ZOFF_OP_MATMUL_FWD, fcproj, w, (long long)l, "mlp.c_proj");
    }
#undef R
#undef P
    return ZOFF_OK;
}

static gpt2_block_acts *block_acts(zoff_gpt2 *m, int64_t l) {
    return &m->blocks[m->checkpoint ? 0 : l];
}

/* tokens, targets (B,T) int32 device -> resid[0..L], block activations, lnf (N,C), logits (N,Vp),
 * and when targets != NULL the losses (N), copied to host_losses on the stream. train: the same
 * cross-entropy op also writes dlogits = (softmax - onehot) * dloss_scale / N in place of the
 * logits, so the (N,Vp) logits are read once for both (llm.c's fused classifier). */
static zoff_status gpt2_forward(zoff_gpt2 *m, const char *who, const int32_t *tokens, const int32_t *targets,
                                int64_t B, int64_t T, bool train, float dloss_scale) {
    if (!m || !tokens) return zoff_error(ZOFF_ERR_INVALID, "%s: model or tokens is NULL", who);
    if (train && !targets)
        return zoff_error(ZOFF_ERR_INVALID, "%s: targets is NULL; a training forward needs the targets (use "
                          "zoff_gpt2_forward for logits only)", who);
    if (train && !isfinite(dloss_scale))
        return zoff_error(ZOFF_ERR_INVALID, "%s: dloss_scale is %g; it must be finite (the loss scale / "
                          "accumulation steps)", who, (double)dloss_scale);
    if (B < 1 || B > m->cap_B || T < 1 || T > m->cap_T)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s: batch %lld x %lld exceeds the activation capacity %lld x %lld "
                          "chosen at create (batch_size x seq_len); both must be >= 1 and within it",
                          who, (long long)B, (long long)T, (long long)m->cap_B, (long long)m->cap_T);
    zoff_stream *s = zoff_device_stream(m->dev);
    const int64_t L = m->shape.num_layers, C = m->shape.hidden_size, N = B * T;
    const int64_t V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    const zoff_dtype dt = m->dt;
    m->have_logits = false;
    m->have_dlogits = false;
    m->have_losses = false;

    /* own copies of the batch: backward needs them, the caller may reuse its buffers */
    ZOFF_TRY(zoff_memcpy_async(s, m->tokens, tokens, (size_t)N * sizeof(int32_t), ZOFF_COPY_D2D));
    if (targets)
        ZOFF_TRY(zoff_memcpy_async(s, m->targets, targets, (size_t)N * sizeof(int32_t), ZOFF_COPY_D2D));
    m->tokens_copied = false;
    if (m->rows_fn) { /* the token ids on the host, for backward's row report */
        ZOFF_TRY(zoff_memcpy_async(s, m->host_tokens, m->tokens, (size_t)N * sizeof(int32_t), ZOFF_COPY_D2H));
        ZOFF_TRY(zoff_event_record(m->ev_tokens, s));
        m->tokens_copied = true;
    }

    const int g_lnf = m->ngroups - 1;
    ZOFF_TRY(pass_begin(m, false));
    ZOFF_TRY(group_use(m, 0, false));
    zoff_op_embed_fwd_args emb = {.out = m->resid[0], .tokens = m->tokens, .wte = param_ptr(m, T_WTE),
                                  .wpe = param_ptr(m, T_WPE), .B = B, .T = T, .C = C, .V = V, .dt = dt};
    LAUNCH(ZOFF_OP_EMBED_FWD, emb, "GPT-2 forward, embeddings");
    ZOFF_TRY(group_done(m, 0, false));
    for (int64_t l = 0; l < L; l++) {
        ZOFF_TRY(group_use(m, 1 + (int)l, false));
        ZOFF_TRY(block_forward(m, l, block_acts(m, l), l ? block_acts(m, l - 1) : NULL, m->resid[l],
                               m->resid[l + 1], B, T, 0));
        ZOFF_TRY(group_done(m, 1 + (int)l, false));
    }

    ZOFF_TRY(group_use(m, g_lnf, false));
    ZOFF_TRY(group_use(m, 0, false)); /* the lm head is wte */
    const int t_lnf = T_BLOCK(L, 0);
    /* resid[L] = the last block's mlp.c_proj output + its mlp residual, fused with ln_f */
    zoff_op_residual_layernorm_fwd_args lnf = {.resid = m->resid[L], .out = m->lnf, .mean = m->lnf_mean,
                                               .rstd = m->lnf_rstd, .a = m->resid[L], .b = block_acts(m, L - 1)->res2,
                                               .weight = param_ptr(m, t_lnf), .bias = param_ptr(m, t_lnf + 1),
                                               .N = N, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_RESIDUAL_LAYERNORM_FWD, lnf, "GPT-2 forward, mlp residual + ln_f");
    zoff_op_matmul_fwd_args head = {.out = m->logits, .inp = m->lnf, .weight = param_ptr(m, T_WTE),
                                    .bias = NULL, .N = N, .C = C, .OC = Vp, .dt = dt};
    LAUNCH(ZOFF_OP_MATMUL_FWD, head, "GPT-2 forward, lm head (wte^T)");
    if (targets) {
        /* loss = sum(losses) / N, scaled: one pass over the logits for the losses and, training, dlogits */
        zoff_op_cross_entropy_args ce = {.losses = m->losses, .dlogits = train ? m->logits : NULL,
                                         .logits = m->logits, .targets = m->targets, .N = N, .V = V, .Vp = Vp,
                                         .dloss = train ? dloss_scale / (float)N : 1.0f, .dt = dt};
        LAUNCH(ZOFF_OP_CROSS_ENTROPY, ce, "GPT-2 forward, cross-entropy");
        /* the losses to the host now (N floats): reading them later waits for this copy, not the step */
        ZOFF_TRY(zoff_memcpy_async(s, m->host_losses, m->losses, (size_t)N * sizeof(float), ZOFF_COPY_D2H));
        ZOFF_TRY(zoff_event_record(m->losses_copied, s));
    }
    ZOFF_TRY(group_done(m, g_lnf, false));
    ZOFF_TRY(group_done(m, 0, false));
    m->fwd_B = B;
    m->fwd_T = T;
    m->have_logits = !train;
    m->have_dlogits = train;
    m->have_losses = targets != NULL;
    return ZOFF_OK;
}

zoff_status zoff_gpt2_forward(zoff_gpt2 *m, const int32_t *tokens, const int32_t *targets, int64_t B, int64_t T) {
    return gpt2_forward(m, "zoff_gpt2_forward", tokens, targets, B, T, false, 0.0f);
}

zoff_status zoff_gpt2_forward_train(zoff_gpt2 *m, const int32_t *tokens, const int32_t *targets, int64_t B,
                                    int64_t T, float dloss_scale) {
    return gpt2_forward(m, "zoff_gpt2_forward_train", tokens, targets, B, T, true, dloss_scale);
}

zoff_status zoff_gpt2_forward_next(zoff_gpt2 *m, const int32_t *token, int64_t pos) {
    const char *who = "zoff_gpt2_forward_next";
    if (!m || !token) return zoff_error(ZOFF_ERR_INVALID, "%s: model or token is NULL", who);
    if (m->checkpoint || m->have_hooks)
        return zoff_error(ZOFF_ERR_INVALID, "%s: needs every block's activations and the model's own weights (no "
                          "activation checkpointing, no parameter hooks)", who);
    if (!m->have_logits || m->fwd_B != 1 || m->fwd_T != pos || pos < 1 || pos >= m->cap_T)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s: position %lld must follow the last inference forward of batch 1 (its length %lld) and "
                          "stay below the capacity %lld",
                          who, (long long)pos, (long long)(m->have_logits ? m->fwd_T : -1), (long long)m->cap_T);
    zoff_stream *s = zoff_device_stream(m->dev);
    const int64_t L = m->shape.num_layers, C = m->shape.hidden_size;
    const int64_t V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    const zoff_dtype dt = m->dt;
    ZOFF_TRY(zoff_memcpy_async(s, m->tokens + pos, token, sizeof(int32_t), ZOFF_COPY_D2D));
    /* the embedding of position pos: one token against wpe from row pos */
    zoff_op_embed_fwd_args emb = {.out = row_of(m, m->resid[0], pos, C), .tokens = m->tokens + pos,
                                  .wte = param_ptr(m, T_WTE), .wpe = row_of(m, param_ptr(m, T_WPE), pos, C),
                                  .B = 1, .T = 1, .C = C, .V = V, .dt = dt};
    LAUNCH(ZOFF_OP_EMBED_FWD, emb, "GPT-2 next-token forward, embeddings");
    for (int64_t l = 0; l < L; l++)
        ZOFF_TRY(block_forward(m, l, &m->blocks[l], l ? &m->blocks[l - 1] : NULL, row_of(m, m->resid[l], pos, C),
                               row_of(m, m->resid[l + 1], pos, C), 1, 1, pos));
    const int t_lnf = T_BLOCK(L, 0);
    void *xl = row_of(m, m->resid[L], pos, C);
    zoff_op_residual_layernorm_fwd_args lnf = {.resid = xl, .out = row_of(m, m->lnf, pos, C), .mean = m->lnf_mean + pos,
                                               .rstd = m->lnf_rstd + pos, .a = xl,
                                               .b = row_of(m, m->blocks[L - 1].res2, pos, C),
                                               .weight = param_ptr(m, t_lnf), .bias = param_ptr(m, t_lnf + 1),
                                               .N = 1, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_RESIDUAL_LAYERNORM_FWD, lnf, "GPT-2 next-token forward, mlp residual + ln_f");
    zoff_op_matmul_fwd_args head = {.out = row_of(m, m->logits, pos, Vp), .inp = row_of(m, m->lnf, pos, C),
                                    .weight = param_ptr(m, T_WTE), .bias = NULL, .N = 1, .C = C, .OC = Vp, .dt = dt};
    LAUNCH(ZOFF_OP_MATMUL_FWD, head, "GPT-2 next-token forward, lm head (wte^T)");
    m->fwd_T = pos + 1;
    m->have_losses = false;
    return ZOFF_OK;
}

/* Mean of losses (N) of the last forward, summed in double on the host once their copy is done. */
zoff_status zoff_gpt2_mean_loss(zoff_gpt2 *m, float *loss) {
    if (!m || !loss) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_mean_loss: model or loss is NULL");
    if (!m->have_losses)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_mean_loss: the last forward had no targets (or none ran); "
                          "pass targets to zoff_gpt2_forward or zoff_gpt2_forward_train");
    ZOFF_TRY(zoff_event_synchronize(m->losses_copied));
    const int64_t N = m->fwd_B * m->fwd_T;
    double sum = 0.0;
    for (int64_t i = 0; i < N; i++) sum += (double)m->host_losses[i];
    *loss = (float)(sum / (double)N);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ backward */

/* Block l backward (N = B*T rows). On entry dresid (N,C) holds d resid[l+1];
 * on exit d resid[l]. Parameter gradients are accumulated into the block's
 * range of the flat gradient buffer. */
static zoff_status block_backward(zoff_gpt2 *m, int64_t l, const gpt2_block_acts *a, int64_t B, int64_t T) {
    zoff_stream *s = zoff_device_stream(m->dev);
    const int64_t C = m->shape.hidden_size, NH = m->shape.num_heads, N = B * T;
    const zoff_dtype dt = m->dt;
    const char *w = "GPT-2 backward, block %lld, %s";
#define P(k) param_ptr(m, T_BLOCK(l, k))
#define G(k) grad_ptr(m, T_BLOCK(l, k))
    /* MLP: resid[l+1] = res2 + GELU(fch) @ Wproj^T + bproj; dfch = (dresid @ Wproj) * GELU'(fch), and
     * c_fc's bias gradient with it (dbias_pre). The dinp outputs below are overwritten: no memsets. */
    zoff_op_matmul_bwd_args fcproj = {.dinp = m->dfch, .dweight = G(P_FCPROJW), .dbias = G(P_FCPROJB),
                                      .dout = m->dresid, .inp = a->fch_gelu, .weight = P(P_FCPROJW),
                                      .N = N, .C = 4 * C, .OC = C, .dt = dt,
                                      .dinp_overwrite = 1, .gelu_pre = a->fch, .dbias_pre = G(P_FCB)};
    LAUNCH(ZOFF_OP_MATMUL_BWD, fcproj, w, (long long)l, "mlp.c_proj + gelu");
    zoff_op_matmul_bwd_args fc = {.dinp = m->dln, .dweight = G(P_FCW), .dbias = NULL, .dout = m->dfch,
                                  .inp = a->ln2, .weight = P(P_FCW), .N = N, .C = C, .OC = 4 * C, .dt = dt,
                                  .dinp_overwrite = 1};
    LAUNCH(ZOFF_OP_MATMUL_BWD, fc, w, (long long)l, "mlp.c_fc");
    /* d res2 = d resid[l+1] + ln_2 backward */
    zoff_op_layernorm_bwd_args ln2 = {.dinp = m->dresid, .dweight = G(P_LN2W), .dbias = G(P_LN2B),
                                      .dout = m->dln, .inp = a->res2, .weight = P(P_LN2W),
                                      .mean = a->ln2_mean, .rstd = a->ln2_rstd, .N = N, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_LAYERNORM_BWD, ln2, w, (long long)l, "ln_2");
    /* attention: res2 = resid[l] + atty @ Wproj^T + bproj */
    zoff_op_matmul_bwd_args proj = {.dinp = m->datty, .dweight = G(P_ATTPROJW), .dbias = G(P_ATTPROJB),
                                    .dout = m->dresid, .inp = a->atty, .weight = P(P_ATTPROJW),
                                    .N = N, .C = C, .OC = C, .dt = dt, .dinp_overwrite = 1};
    LAUNCH(ZOFF_OP_MATMUL_BWD, proj, w, (long long)l, "attn.c_proj");
    zoff_op_attention_bwd_args att = {.dqkv = m->dqkv, .dout = m->datty, .qkv = a->qkv, .out = a->atty,
                                      .lse = a->lse, .B = B, .T = T, .C = C, .NH = NH, .dt = dt};
    LAUNCH(ZOFF_OP_ATTENTION_BWD, att, w, (long long)l, "attention");
    zoff_op_matmul_bwd_args qkv = {.dinp = m->dln, .dweight = G(P_QKVW), .dbias = G(P_QKVB), .dout = m->dqkv,
                                   .inp = a->ln1, .weight = P(P_QKVW), .N = N, .C = C, .OC = 3 * C, .dt = dt,
                                   .dinp_overwrite = 1};
    LAUNCH(ZOFF_OP_MATMUL_BWD, qkv, w, (long long)l, "attn.c_attn");
    /* d resid[l] = d res2 + ln_1 backward */
    zoff_op_layernorm_bwd_args ln1 = {.dinp = m->dresid, .dweight = G(P_LN1W), .dbias = G(P_LN1B),
                                      .dout = m->dln, .inp = m->resid[l], .weight = P(P_LN1W),
                                      .mean = a->ln1_mean, .rstd = a->ln1_rstd, .N = N, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_LAYERNORM_BWD, ln1, w, (long long)l, "ln_1");
#undef P
#undef G
    return ZOFF_OK;
}

/* From the dlogits (N,Vp) the training forward left in place of the logits: lm head, ln_f,
 * blocks L-1..0, embeddings; parameter gradients accumulate into the flat buffer (num_params). */
zoff_status zoff_gpt2_backward(zoff_gpt2 *m, zoff_grad_ready_fn ready, void *ready_arg) {
    if (!m) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_backward: model is NULL");
    if (!m->have_dlogits)
        return zoff_error(ZOFF_ERR_INVALID,
                          "zoff_gpt2_backward: no training forward to differentiate (%s); call "
                          "zoff_gpt2_forward_train before each backward",
                          m->have_logits ? "the last forward was zoff_gpt2_forward, which keeps the logits"
                                         : "none since create or the last backward");
    zoff_stream *s = zoff_device_stream(m->dev);
    const int64_t L = m->shape.num_layers, C = m->shape.hidden_size;
    const int64_t V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    const int64_t B = m->fwd_B, T = m->fwd_T, N = B * T;
    const zoff_dtype dt = m->dt;
    /* the dlogits are consumed below: whatever happens next, another backward needs another forward */
    m->have_dlogits = false;

    const int g_lnf = m->ngroups - 1;
    ZOFF_TRY(pass_begin(m, true));
    ZOFF_TRY(group_use(m, g_lnf, true));
    ZOFF_TRY(group_use(m, 0, true)); /* held to the end: wte's gradient comes from the head and the embedding */
    zoff_op_matmul_bwd_args head = {.dinp = m->dln, .dweight = grad_ptr(m, T_WTE), .dbias = NULL,
                                    .dout = m->logits, .inp = m->lnf, .weight = param_ptr(m, T_WTE),
                                    .N = N, .C = C, .OC = Vp, .dt = dt, .dinp_overwrite = 1};
    LAUNCH(ZOFF_OP_MATMUL_BWD, head, "GPT-2 backward, lm head (wte^T)");
    ZOFF_TRY(report_wte_rows(m, s, N));
    const int t_lnf = T_BLOCK(L, 0);
    /* d resid[L] = ln_f backward, written (dresid NULL: no memset first) */
    zoff_op_residual_layernorm_bwd_args lnf = {.dinp = m->dresid, .dresid = NULL, .dweight = grad_ptr(m, t_lnf),
                                               .dbias = grad_ptr(m, t_lnf + 1), .dout = m->dln, .inp = m->resid[L],
                                               .weight = param_ptr(m, t_lnf), .mean = m->lnf_mean,
                                               .rstd = m->lnf_rstd, .N = N, .C = C, .dt = dt};
    LAUNCH(ZOFF_OP_RESIDUAL_LAYERNORM_BWD, lnf, "GPT-2 backward, ln_f");
    if (ready) ready(ready_arg, s, m->tensors[t_lnf].offset, 2 * C);
    ZOFF_TRY(group_done(m, g_lnf, true));

    for (int64_t l = L - 1; l >= 0; l--) {
        gpt2_block_acts *a = block_acts(m, l);
        ZOFF_TRY(group_use(m, 1 + (int)l, true));
        /* checkpointing: the shared set still holds block L-1 from forward */
        if (m->checkpoint && l != L - 1) ZOFF_TRY(block_forward(m, l, a, NULL, m->resid[l], NULL, B, T, 0));
        ZOFF_TRY(block_backward(m, l, a, B, T));
        if (ready) ready(ready_arg, s, m->tensors[T_BLOCK(l, 0)].offset, m->block_numel);
        ZOFF_TRY(group_done(m, 1 + (int)l, true));
    }

    zoff_op_embed_bwd_args emb = {.dwte = grad_ptr(m, T_WTE), .dwpe = grad_ptr(m, T_WPE), .dout = m->dresid,
                                  .tokens = m->tokens, .B = B, .T = T, .C = C, .V = V, .dt = dt};
    LAUNCH(ZOFF_OP_EMBED_BWD, emb, "GPT-2 backward, embeddings");
    if (ready) ready(ready_arg, s, 0, m->tensors[T_WTE].numel + m->tensors[T_WPE].numel);
    ZOFF_TRY(group_done(m, 0, true));
    return ZOFF_OK;
}
