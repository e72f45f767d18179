/* GPT-2's layout as a pure function of its shape: bounds, padded vocabulary, parameter
 * counts and the tensor table (include/zoff/model.h). No device, no allocation: the model,
 * zoff plan, the commands' flag parsers and the safetensors name mapping all call it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "zoff/model.h"

/* zoff shape of block tensor k: (out_mult*C, in_mult*C), or (out_mult*C) when in_mult == 0. */
const zoff_gpt2_block_tensor zoff_gpt2_block_table[ZOFF_GPT2_BLOCK_TENSORS] = {
    {"ln_1.weight", 1, 0},        {"ln_1.bias", 1, 0},       {"attn.c_attn.weight", 3, 1},
    {"attn.c_attn.bias", 3, 0},   {"attn.c_proj.weight", 1, 1}, {"attn.c_proj.bias", 1, 0},
    {"ln_2.weight", 1, 0},        {"ln_2.bias", 1, 0},       {"mlp.c_fc.weight", 4, 1},
    {"mlp.c_fc.bias", 4, 0},      {"mlp.c_proj.weight", 1, 4}, {"mlp.c_proj.bias", 1, 0},
};

int64_t zoff_gpt2_padded_vocab(const zoff_gpt2_shape *s) {
    return s->padded_vocab_size ? s->padded_vocab_size : (s->vocab_size + 127) / 128 * 128;
}

int64_t zoff_gpt2_block_params(int64_t C) {
    int64_t n = 0;
    for (int k = 0; k < ZOFF_GPT2_BLOCK_TENSORS; k++) {
        const zoff_gpt2_block_tensor *b = &zoff_gpt2_block_table[k];
        n += b->in_mult ? b->out_mult * C * b->in_mult * C : b->out_mult * C; /* = 12 C^2 + 13 C */
    }
    return n;
}

int64_t zoff_gpt2_count_params(const zoff_gpt2_shape *s) {
    const int64_t C = s->hidden_size;
    return zoff_gpt2_padded_vocab(s) * C + s->max_seq_len * C + s->num_layers * zoff_gpt2_block_params(C) + 2 * C;
}

double zoff_gpt2_step_flops(const zoff_gpt2_shape *s, int64_t B, int64_t T) {
    const int64_t C = s->hidden_size, N = B * T;
    double fwd = zoff_matmul_flops(N, C, zoff_gpt2_padded_vocab(s)), block = 0; /* the LM head */
    for (int k = 0; k < ZOFF_GPT2_BLOCK_TENSORS; k++) {
        const zoff_gpt2_block_tensor *b = &zoff_gpt2_block_table[k];
        if (b->in_mult) block += zoff_matmul_flops(N, b->in_mult * C, b->out_mult * C);
    }
    fwd += (double)s->num_layers * block;
    double attn = zoff_attention_flops(B, T, C, false) + zoff_attention_flops(B, T, C, true);
    return 3.0 * fwd + (double)s->num_layers * attn;
}

int zoff_gpt2_num_tensors(int64_t num_layers) { return (int)(2 + num_layers * ZOFF_GPT2_BLOCK_TENSORS + 2); }

/* The first bound s breaks (a message prefixed by who; none when who is NULL), or ZOFF_OK. */
static zoff_status shape_problem(const zoff_gpt2_shape *s, const char *who) {
    const struct {
        const char *field, *flag;
        int64_t v, hi;
    } b[] = {
        {"num_layers", "--num-layers", s->num_layers, ZOFF_GPT2_MAX_LAYERS},
        {"hidden_size", "--hidden-size", s->hidden_size, ZOFF_GPT2_MAX_HIDDEN},
        {"num_heads", "num_attention_heads, --num-attention-heads", s->num_heads, s->hidden_size},
        {"max_seq_len", "--max-position-embeddings", s->max_seq_len, ZOFF_GPT2_MAX_SEQ},
        {"vocab_size", "--vocab-size", s->vocab_size, ZOFF_GPT2_MAX_VOCAB},
    };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
        if (b[i].v < 1 || b[i].v > b[i].hi)
            return !who ? ZOFF_ERR_INVALID
                        : zoff_error(ZOFF_ERR_INVALID, "%s: shape.%s is %lld; it must be in [1, %lld] (%s)", who,
                                     b[i].field, (long long)b[i].v, (long long)b[i].hi, b[i].flag);
    if (s->hidden_size % s->num_heads != 0)
        return !who ? ZOFF_ERR_INVALID
                    : zoff_error(ZOFF_ERR_INVALID,
                                 "%s: shape.hidden_size (%lld) is not divisible by shape.num_heads (%lld); choose a "
                                 "head count that divides the hidden size (num_attention_heads, --num-attention-heads)",
                                 who, (long long)s->hidden_size, (long long)s->num_heads);
    int64_t Vp = zoff_gpt2_padded_vocab(s);
    if (Vp < s->vocab_size || Vp > ZOFF_GPT2_MAX_VOCAB + 128)
        return !who ? ZOFF_ERR_INVALID
                    : zoff_error(ZOFF_ERR_INVALID,
                                 "%s: shape.padded_vocab_size is %lld but vocab_size is %lld; it must be >= vocab_size "
                                 "(or 0 to round vocab_size up to a multiple of 128)",
                                 who, (long long)s->padded_vocab_size, (long long)s->vocab_size);
    return ZOFF_OK;
}

bool zoff_gpt2_shape_in_bounds(const zoff_gpt2_shape *s) { return shape_problem(s, NULL) == ZOFF_OK; }

zoff_status zoff_gpt2_check_shape(const zoff_gpt2_shape *s, const char *who, zoff_gpt2_shape *resolved) {
    ZOFF_TRY(shape_problem(s, who ? who : "GPT-2 shape"));
    if (resolved) {
        *resolved = *s;
        resolved->padded_vocab_size = zoff_gpt2_padded_vocab(s);
    }
    return ZOFF_OK;
}

static void set_tensor(zoff_tensor_info *t, int64_t *offset, const char *name, int ndim, int64_t d0, int64_t d1,
                       bool decay, int layer) {
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = *offset;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = ndim > 1 ? d0 * d1 : d0;
    t->decay = decay;
    t->layer = layer;
    *offset += t->numel;
}

int64_t zoff_gpt2_tensor_table(const zoff_gpt2_shape *s, zoff_tensor_info *t) {
    const int64_t L = s->num_layers, C = s->hidden_size;
    int64_t off = 0;
    char name[64];
    set_tensor(&t[0], &off, "wte.weight", 2, zoff_gpt2_padded_vocab(s), C, true, -1);
    set_tensor(&t[1], &off, "wpe.weight", 2, s->max_seq_len, C, true, -1);
    for (int64_t l = 0; l < L; l++) {
        for (int k = 0; k < ZOFF_GPT2_BLOCK_TENSORS; k++) {
            const zoff_gpt2_block_tensor *b = &zoff_gpt2_block_table[k];
            snprintf(name, sizeof name, "h.%lld.%s", (long long)l, b->suffix);
            int nd = b->in_mult ? 2 : 1;
            set_tensor(&t[2 + l * ZOFF_GPT2_BLOCK_TENSORS + k], &off, name, nd, b->out_mult * C, b->in_mult * C,
                       nd == 2, (int)l);
        }
    }
    zoff_tensor_info *lnf = &t[2 + L * ZOFF_GPT2_BLOCK_TENSORS];
    set_tensor(&lnf[0], &off, "ln_f.weight", 1, C, 0, false, -1);
    set_tensor(&lnf[1], &off, "ln_f.bias", 1, C, 0, false, -1);
    return off;
}
