/* GPT-2 in safetensors: Hugging Face's names and layouts <-> zoff's tensor table (export,
 * shape inference, checks, import). Rules: include/zoff/safetensors.h, "GPT-2 in Hugging Face's
 * layout" and "GPT-2 in zoff's layout". */
#include "zoff/safetensors.h"
#include "ckpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>

#define ST_NAME_SHOWN 160 /* longest name shown in a message */

/* ------------------------------------------------------------------ GPT-2 names and shapes */

/* Names and zoff shapes of a block's tensors: the model's table (include/zoff/model.h). */
enum { P_PER_BLOCK = ZOFF_GPT2_BLOCK_TENSORS };
#define HF_PREFIX "transformer."

static int64_t nparams_of(int64_t L) { return zoff_gpt2_num_tensors(L); }

/* Parse "h.<l>.<rest>": the layer (decimal, no sign or leading zero, < 2^31) and rest. */
static bool parse_block_name(const char *name, int64_t *layer, const char **rest) {
    if (strncmp(name, "h.", 2) != 0) return false;
    const char *p = name + 2;
    if (*p < '0' || *p > '9' || (*p == '0' && p[1] != '.')) return false;
    int64_t l = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
        if (++digits > 9) return false;
        l = l * 10 + (*p++ - '0');
    }
    if (*p != '.') return false;
    *layer = l;
    *rest = p + 1;
    return true;
}

/* Canonical parameter index of a GPT-2 name (zoff's flat order): 0 wte, 1 wpe, 2 + 12 l + k, then
 * ln_f.weight, ln_f.bias. -1: not a GPT-2 parameter name; -2: a block beyond L (*layer set). */
static int64_t param_index(const char *name, int64_t L, int64_t *layer) {
    *layer = -1;
    if (!strcmp(name, "wte.weight")) return 0;
    if (!strcmp(name, "wpe.weight")) return 1;
    if (!strcmp(name, "ln_f.weight")) return 2 + P_PER_BLOCK * L;
    if (!strcmp(name, "ln_f.bias")) return 3 + P_PER_BLOCK * L;
    int64_t l;
    const char *rest;
    if (!parse_block_name(name, &l, &rest)) return -1;
    for (int k = 0; k < P_PER_BLOCK; k++)
        if (!strcmp(rest, zoff_gpt2_block_table[k].suffix)) {
            *layer = l;
            return l < L ? 2 + P_PER_BLOCK * l + k : -2;
        }
    return -1;
}

bool zoff_gpt2_st_is_param(const char *name, int64_t num_layers) {
    int64_t layer;
    return name && param_index(name, num_layers, &layer) >= 0;
}

/* Buffers of older Hugging Face files that are not parameters. */
static bool is_hf_buffer(const char *name) {
    int64_t l;
    const char *rest;
    return parse_block_name(name, &l, &rest) && (!strcmp(rest, "attn.bias") || !strcmp(rest, "attn.masked_bias"));
}

/* GPT2DoubleHeadsModel's multiple-choice head (SequenceSummary: summary.weight, summary.bias), not
 * part of the LM: transformers loads such a file into GPT2LMHeadModel without it (a warning). */
static bool is_mc_head(const char *name) {
    return !strcmp(name, "multiple_choice_head.summary.weight") || !strcmp(name, "multiple_choice_head.summary.bias");
}

static void param_name(int64_t idx, int64_t L, char *out, size_t cap) {
    if (idx == 0) snprintf(out, cap, "wte.weight");
    else if (idx == 1) snprintf(out, cap, "wpe.weight");
    else if (idx == 2 + P_PER_BLOCK * L) snprintf(out, cap, "ln_f.weight");
    else if (idx == 3 + P_PER_BLOCK * L) snprintf(out, cap, "ln_f.bias");
    else snprintf(out, cap, "h.%" PRId64 ".%s", (idx - 2) / P_PER_BLOCK, zoff_gpt2_block_table[(idx - 2) % P_PER_BLOCK].suffix);
}

/* Stored as Conv1D (in, out) in Hugging Face's layout. */
static bool is_conv1d(int64_t idx, int64_t L) {
    if (idx < 2 || idx >= 2 + P_PER_BLOCK * L) return false;
    return zoff_gpt2_block_table[(idx - 2) % P_PER_BLOCK].in_mult != 0;
}

/* Shape of parameter idx in the given layout. sh->padded_vocab_size must be resolved. */
static int param_shape(int64_t idx, const zoff_gpt2_shape *sh, zoff_gpt2_layout layout, int64_t *dims) {
    const int64_t C = sh->hidden_size, L = sh->num_layers;
    if (idx == 0) {
        dims[0] = layout == ZOFF_GPT2_LAYOUT_HF ? sh->vocab_size : sh->padded_vocab_size;
        dims[1] = C;
        return 2;
    }
    if (idx == 1) {
        dims[0] = sh->max_seq_len;
        dims[1] = C;
        return 2;
    }
    if (idx >= 2 + P_PER_BLOCK * L) {
        dims[0] = C;
        return 1;
    }
    int k = (int)((idx - 2) % P_PER_BLOCK);
    int64_t out = zoff_gpt2_block_table[k].out_mult * C, in = zoff_gpt2_block_table[k].in_mult * C;
    if (!in) {
        dims[0] = out;
        return 1;
    }
    if (layout == ZOFF_GPT2_LAYOUT_HF) {
        dims[0] = in;
        dims[1] = out;
    } else {
        dims[0] = out;
        dims[1] = in;
    }
    return 2;
}

/* A file's sizes inside the model's own bounds (zoff_gpt2_shape_in_bounds; the head count, which no
 * tensor's layout depends on, is not the file's to check here). */
static bool file_shape_in_bounds(const zoff_gpt2_shape *in) {
    zoff_gpt2_shape b = *in;
    b.num_heads = 1;
    b.padded_vocab_size = 0;
    return zoff_gpt2_shape_in_bounds(&b);
}

static zoff_status check_model_shape(const zoff_gpt2_shape *in, zoff_gpt2_shape *out) {
    *out = *in;
    if (!file_shape_in_bounds(in))
        return zoff_error(ZOFF_ERR_INVALID,
                          "GPT-2 shape out of range: %" PRId64 " layers, width %" PRId64 ", %" PRId64
                          " positions, vocabulary %" PRId64,
                          in->num_layers, in->hidden_size, in->max_seq_len, in->vocab_size);
    out->padded_vocab_size = zoff_gpt2_padded_vocab(in);
    if (out->padded_vocab_size < in->vocab_size)
        return zoff_error(ZOFF_ERR_INVALID, "GPT-2 shape: padded vocabulary %" PRId64 " < vocabulary %" PRId64,
                          out->padded_vocab_size, in->vocab_size);
    return ZOFF_OK;
}

/* zoff (out, in) -> (in, out), blocked for the cache; bands of B rows on up to zoff_par_threads
 * threads (a copy: the same bytes whatever the thread count). */
static void transpose(const float *src, float *dst, int64_t rows, int64_t cols) {
    const int64_t B = 32, bands = (rows + B - 1) / B;
    const int nt = zoff_par_threads((size_t)(rows * cols) * sizeof(float));
    (void)nt; /* (a build without OpenMP: the harnesses' library) */
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t k = 0; k < bands; k++) {
        const int64_t r0 = k * B, r1 = r0 + B < rows ? r0 + B : rows;
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            const int64_t c1 = c0 + B < cols ? c0 + B : cols;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/* ------------------------------------------------------------------ GPT-2 export */

zoff_status zoff_gpt2_st_export(const char *path, const zoff_gpt2_shape *shape_in, const zoff_tensor_info *tensors,
                                int ntensors, zoff_gpt2_fetch_fn fetch, void *user,
                                const zoff_gpt2_export_options *opts) {
    zoff_gpt2_export_options def = {.layout = ZOFF_GPT2_LAYOUT_HF, .dtype = ZOFF_ST_F32};
    if (!opts) opts = &def;
    if (!shape_in || !tensors || !fetch) return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_st_export: NULL argument");
    if (opts->layout != ZOFF_GPT2_LAYOUT_HF && opts->layout != ZOFF_GPT2_LAYOUT_ZOFF)
        return zoff_error(ZOFF_ERR_INVALID, "zoff_gpt2_st_export: invalid layout %d", (int)opts->layout);
    if (opts->dtype != ZOFF_ST_F32 && (opts->layout == ZOFF_GPT2_LAYOUT_ZOFF ||
                                       (opts->dtype != ZOFF_ST_BF16 && opts->dtype != ZOFF_ST_F16)))
        return zoff_error(ZOFF_ERR_INVALID, "export dtype %s: the %s layout is written as %s",
                          zoff_st_dtype_name(opts->dtype), opts->layout == ZOFF_GPT2_LAYOUT_HF ? "Hugging Face" : "zoff",
                          opts->layout == ZOFF_GPT2_LAYOUT_HF ? "F32, BF16 or F16" : "F32 only");
    zoff_gpt2_shape sh;
    ZOFF_TRY(check_model_shape(shape_in, &sh));
    const int64_t L = sh.num_layers, np = nparams_of(L);
    if (ntensors != np)
        return zoff_error(ZOFF_ERR_INVALID,
                          "export: %d tensors given; a GPT-2 with %" PRId64 " layers has %" PRId64 " parameters",
                          ntensors, L, np);
    const zoff_tensor_info **slot = calloc((size_t)np, sizeof *slot);
    if (!slot) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = ZOFF_OK;
    int64_t maxel = 1;
    char sa[200], sb[200];
    for (int i = 0; i < ntensors && s == ZOFF_OK; i++) {
        const zoff_tensor_info *t = &tensors[i];
        int64_t layer, idx = param_index(t->name, L, &layer), dims[2];
        if (idx == -1) s = zoff_error(ZOFF_ERR_INVALID, "export: '%.*s' is not a GPT-2 parameter", ST_NAME_SHOWN, t->name);
        else if (idx == -2)
            s = zoff_error(ZOFF_ERR_INVALID, "export: '%s' is beyond the model's %" PRId64 " layers", t->name, L);
        else if (slot[idx]) s = zoff_error(ZOFF_ERR_INVALID, "export: tensor '%s' given twice", t->name);
        if (s != ZOFF_OK) break;
        int nd = param_shape(idx, &sh, ZOFF_GPT2_LAYOUT_ZOFF, dims);
        if (!zoff_ckpt_same_shape(t->ndim, t->shape, nd, dims) || t->numel != (nd == 2 ? dims[0] * dims[1] : dims[0]))
            s = zoff_error(ZOFF_ERR_INVALID, "export: tensor '%s' has shape %s; this GPT-2 has %s", t->name,
                           zoff_ckpt_shape_str(t->ndim, t->shape, sa, sizeof sa), zoff_ckpt_shape_str(nd, dims, sb, sizeof sb));
        slot[idx] = t;
        if (t->numel > maxel) maxel = t->numel;
    }
    zoff_st_writer *w = NULL;
    if (s == ZOFF_OK) s = zoff_st_writer_open(path, &w);
    char num[64];
    const char *layout_name = opts->layout == ZOFF_GPT2_LAYOUT_HF ? "hf" : "zoff";
    if (s == ZOFF_OK) s = zoff_st_writer_metadata(w, "format", "pt");
    if (s == ZOFF_OK) s = zoff_st_writer_metadata(w, "zoff.layout", layout_name);
#define META_I64(key, v)                                    \
    if (s == ZOFF_OK) {                                     \
        snprintf(num, sizeof num, "%" PRId64, (int64_t)(v)); \
        s = zoff_st_writer_metadata(w, key, num);           \
    }
    META_I64("zoff.num_layers", sh.num_layers);
    META_I64("zoff.hidden_size", sh.hidden_size);
    META_I64("zoff.num_heads", sh.num_heads);
    META_I64("zoff.max_seq_len", sh.max_seq_len);
    META_I64("zoff.vocab_size", sh.vocab_size);
    META_I64("zoff.padded_vocab_size", sh.padded_vocab_size);
#undef META_I64
    for (size_t i = 0; s == ZOFF_OK && i < opts->metadata_pairs; i++)
        s = zoff_st_writer_metadata(w, opts->metadata[2 * i], opts->metadata[2 * i + 1]);
    for (int64_t idx = 0; idx < np && s == ZOFF_OK; idx++) {
        int64_t dims[2];
        int nd = param_shape(idx, &sh, opts->layout, dims);
        s = zoff_st_writer_declare(w, slot[idx]->name, opts->dtype, nd, dims);
    }
    float *a = NULL, *b = NULL;
    uint16_t *h = NULL;
    if (s == ZOFF_OK) {
        a = malloc((size_t)maxel * sizeof(float));
        b = malloc((size_t)maxel * sizeof(float));
        h = opts->dtype != ZOFF_ST_F32 ? malloc((size_t)maxel * sizeof(uint16_t)) : NULL;
        if (!a || !b || (opts->dtype != ZOFF_ST_F32 && !h))
            s = zoff_error(ZOFF_ERR_NOMEM, "out of memory for export buffers (%" PRId64 " elements)", maxel);
    }
    for (int64_t idx = 0; idx < np && s == ZOFF_OK; idx++) {
        const zoff_tensor_info *t = slot[idx];
        s = fetch(user, t, a);
        if (s != ZOFF_OK) {
            s = zoff_error_context(s, "export: reading '%s'", t->name);
            break;
        }
        const float *src = a;
        int64_t count = t->numel;
        if (opts->layout == ZOFF_GPT2_LAYOUT_HF) {
            if (idx == 0) count = sh.vocab_size * sh.hidden_size; /* drop the padding rows */
            else if (is_conv1d(idx, L)) {
                transpose(a, b, t->shape[0], t->shape[1]);
                src = b;
            }
        }
        if (opts->dtype == ZOFF_ST_F32) {
            s = zoff_st_writer_append(w, src, (size_t)count * sizeof(float));
        } else {
            if (opts->dtype == ZOFF_ST_BF16) zoff_par_f32_to_bf16(h, src, (size_t)count);
            else zoff_par_f32_to_f16(h, src, (size_t)count);
            s = zoff_st_writer_append(w, h, (size_t)count * sizeof(uint16_t));
        }
    }
    free(a);
    free(b);
    free(h);
    free(slot);
    if (s != ZOFF_OK) {
        zoff_st_writer_abort(w);
        return s;
    }
    return zoff_st_writer_commit(w);
}

/* ------------------------------------------------------------------ GPT-2 import */

zoff_gpt2_layout zoff_gpt2_st_layout(const zoff_st_file *f) {
    const char *v = zoff_st_metadata(f, "zoff.layout");
    return v && !strcmp(v, "zoff") ? ZOFF_GPT2_LAYOUT_ZOFF : ZOFF_GPT2_LAYOUT_HF;
}

/* A tensor by its bare name or with the "transformer." prefix. */
static const zoff_st_tensor *find_either(const zoff_st_file *f, const char *name) {
    const zoff_st_tensor *t = zoff_st_find(f, name);
    if (t) return t;
    char buf[256];
    if ((size_t)snprintf(buf, sizeof buf, HF_PREFIX "%s", name) >= sizeof buf) return NULL;
    return zoff_st_find(f, buf);
}

static const char *strip_prefix(const char *name) {
    return strncmp(name, HF_PREFIX, strlen(HF_PREFIX)) == 0 ? name + strlen(HF_PREFIX) : name;
}

/* An integer member of a JSON object, 0 when absent or not a positive integer. */
static int64_t json_pos(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) > 0 ? (int64_t)json_integer_value(v) : 0;
}

/* A boolean member of config.json as transformers reads it (Python truth: `if config.key:`): 1 true,
 * 0 false (false, null, 0, 0.0, "", [] or {}), -1 absent. *text: the value as written ("0", "false"). */
static int json_truth(const json_t *o, const char *key, char *text, size_t cap) {
    const json_t *v = json_object_get(o, key);
    if (!v) return -1;
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    snprintf(text, cap, "%.60s", d ? d : "?");
    free(d);
    if (json_is_boolean(v)) return json_is_true(v);
    if (json_is_integer(v)) return json_integer_value(v) != 0;
    if (json_is_real(v)) return json_real_value(v) != 0.0;
    if (json_is_string(v)) return json_string_length(v) != 0;
    if (json_is_array(v)) return json_array_size(v) != 0;
    if (json_is_object(v)) return json_object_size(v) != 0;
    return 0; /* null: None */
}

/* A config.json setting that changes GPT-2's math to something zoff does not compute: refused by
 * name (taking the weights would run, sample, evaluate or fine-tune another model than the file's). */
static zoff_status config_unsupported(const char *path, const char *key, const char *value, const char *zoff_does) {
    return zoff_error(ZOFF_ERR_UNSUPPORTED,
                      "%s says %s %s: zoff computes %s, so it would run another model than the file's and "
                      "cannot load it (if %s does not describe this model, correct or remove it)",
                      path, key, value, zoff_does, path);
}

/* The settings of a config.json (path) that change the model's math, against what zoff computes:
 * model_type gpt2 (architectures GPT2*), GELU with the tanh approximation, LayerNorm eps 1e-5,
 * attention scaled by 1/sqrt(head size) only, an MLP of 4 x the width. Absent keys are GPT-2's
 * defaults; reorder_and_upcast_attn only changes the precision of the same math. An untied head
 * (tie_word_embeddings false) is the file's lm_head.weight, which the loader compares with wte:
 * without one (has_head false) it is not in the file. */
static zoff_status config_json_math(const char *path, const json_t *o, const zoff_gpt2_shape *fs, bool has_head) {
    char v[200];
    const json_t *mt = json_object_get(o, "model_type"), *ar = json_object_get(o, "architectures");
    const char *a0 = json_string_value(json_array_get(ar, 0));
    if (mt && (!json_is_string(mt) || strcmp(json_string_value(mt), "gpt2"))) {
        snprintf(v, sizeof v, "\"%.60s\" (architectures %.60s)", json_is_string(mt) ? json_string_value(mt) : "?",
                 a0 ? a0 : "not given");
        return config_unsupported(path, "model_type", v, "GPT-2 only (model_type gpt2, GPT2LMHeadModel)");
    }
    if (a0 && strncmp(a0, "GPT2", 4)) {
        snprintf(v, sizeof v, "[\"%.60s\"]", a0);
        return config_unsupported(path, "architectures", v, "GPT-2 only (model_type gpt2, GPT2LMHeadModel)");
    }
    const json_t *af = json_object_get(o, "activation_function");
    const char *act = json_string_value(af);
    if (af && (!act || (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh") && strcmp(act, "gelu_fast")))) {
        snprintf(v, sizeof v, "\"%.60s\"", act ? act : "(not a string)");
        return config_unsupported(path, "activation_function", v,
                                  "GELU with the tanh approximation only (gelu_new, also named "
                                  "gelu_pytorch_tanh, gelu_fast)");
    }
    const json_t *eps = json_object_get(o, "layer_norm_epsilon");
    if (eps && (!json_is_number(eps) || fabs(json_number_value(eps) - 1e-5) > 1e-11)) {
        snprintf(v, sizeof v, "%.6g", json_is_number(eps) ? json_number_value(eps) : NAN);
        return config_unsupported(path, "layer_norm_epsilon", v, "LayerNorm with epsilon 1e-5 only");
    }
    if (json_truth(o, "scale_attn_weights", v, sizeof v) == 0)
        return config_unsupported(path, "scale_attn_weights", v, "attention scores scaled by 1/sqrt(head size) only");
    if (json_truth(o, "scale_attn_by_inverse_layer_idx", v, sizeof v) == 1)
        return config_unsupported(path, "scale_attn_by_inverse_layer_idx", v,
                                  "attention scores scaled by 1/sqrt(head size) only, not also by 1/(layer + 1)");
    const json_t *ni = json_object_get(o, "n_inner");
    if (ni && !json_is_null(ni) && (!json_is_integer(ni) || json_integer_value(ni) != 4 * fs->hidden_size)) {
        snprintf(v, sizeof v, "%" PRId64, json_is_integer(ni) ? (int64_t)json_integer_value(ni) : (int64_t)-1);
        char does[80];
        snprintf(does, sizeof does, "an MLP of 4 x the width only (n_inner null or %" PRId64 ")", 4 * fs->hidden_size);
        return config_unsupported(path, "n_inner", v, does);
    }
    if (json_truth(o, "tie_word_embeddings", v, sizeof v) == 0 && !has_head) {
        strncat(v, ", and the file holds no lm_head.weight", sizeof v - strlen(v) - 1);
        return config_unsupported(path, "tie_word_embeddings", v, "the LM head tied to the token embedding (wte) only");
    }
    return ZOFF_OK;
}

/* config.json's vocabulary ("vocab_size") and positions ("n_positions", or its alias
 * "max_position_embeddings"), where it gives them, against the file's (fs; vocab_from says where the
 * file's vocabulary comes from): a folder whose config.json disagrees with its own tensors is refused
 * (transformers refuses it too, "size mismatch"), not run with the tensors' sizes. */
static zoff_status config_json_sizes(const char *path, const json_t *o, const char *st_path,
                                     const zoff_gpt2_shape *fs, const char *vocab_from) {
    const int64_t V = json_pos(o, "vocab_size");
    const bool alias = !json_pos(o, "n_positions") && json_pos(o, "max_position_embeddings");
    const int64_t T = alias ? json_pos(o, "max_position_embeddings") : json_pos(o, "n_positions");
    const char *key = "vocab_size", *what = vocab_from;
    int64_t cfg = V, rows = fs->vocab_size;
    if (!V || V == fs->vocab_size) {
        key = alias ? "max_position_embeddings" : "n_positions";
        what = "the rows of its wpe.weight";
        cfg = T;
        rows = fs->max_seq_len;
    }
    if (!cfg || cfg == rows) return ZOFF_OK;
    return zoff_error(ZOFF_ERR_FORMAT,
                      "%s says %s %" PRId64 " but %s has %" PRId64 " (%s): the model folder is inconsistent "
                      "(transformers refuses it too: size mismatch); download or write it again",
                      path, key, cfg, st_path, rows, what);
}

/* A Hugging Face model folder's config.json (beside the .safetensors file), when its layers and
 * width, where it gives them, are the file's (a config.json of another model is not taken): the head
 * count it gives ("n_head" or "num_attention_heads"; *heads 0: none), its vocabulary and positions
 * against the file's (config_json_sizes) and its settings that change the math checked
 * (config_json_math). No config.json: *heads 0; one that is not a JSON object: refused. */
static zoff_status config_json_read(const char *st_path, const zoff_gpt2_shape *fs, bool has_head,
                                    const char *vocab_from, int64_t *heads) {
    char path[4200];
    const char *slash = strrchr(st_path, '/');
    if (slash)
        snprintf(path, sizeof path, "%.*s/config.json", (int)(slash - st_path), st_path);
    else
        snprintf(path, sizeof path, "config.json");
    *heads = 0;
    struct stat sb;
    int sr = stat(path, &sb);
    if (sr != 0 && errno == ENOENT) return ZOFF_OK;
    json_error_t je;
    json_t *o = sr == 0 && S_ISDIR(sb.st_mode) ? NULL : json_load_file(path, 0, &je);
    if (!json_is_object(o)) { /* what the model is unread: nothing of it is guessed */
        char why[240];
        if (sr == 0 && S_ISDIR(sb.st_mode)) snprintf(why, sizeof why, "a folder");
        else if (o) snprintf(why, sizeof why, "not a JSON object");
        else snprintf(why, sizeof why, "not valid JSON (line %d: %.160s)", je.line, je.text);
        json_decref(o);
        return zoff_error(ZOFF_ERR_FORMAT, "%s (the model's Hugging Face config, beside %s) is %s: correct it or remove it",
                          path, st_path, why);
    }
    zoff_status s = ZOFF_OK;
    int64_t L = json_pos(o, "n_layer") ? json_pos(o, "n_layer") : json_pos(o, "num_hidden_layers");
    int64_t C = json_pos(o, "n_embd") ? json_pos(o, "n_embd") : json_pos(o, "hidden_size");
    if (!(L && L != fs->num_layers) && !(C && C != fs->hidden_size)) {
        *heads = json_pos(o, "n_head") ? json_pos(o, "n_head") : json_pos(o, "num_attention_heads");
        s = config_json_sizes(path, o, st_path, fs, vocab_from);
        if (s == ZOFF_OK) s = config_json_math(path, o, fs, has_head);
    } else {
        zoff_log(ZOFF_LOG_WARN,
                 "%s describes another model (%" PRId64 " layers, width %" PRId64 "; %s has %" PRId64 ", %" PRId64
                 "): not read",
                 path, L ? L : fs->num_layers, C ? C : fs->hidden_size, st_path, fs->num_layers, fs->hidden_size);
    }
    if (*heads) zoff_log(ZOFF_LOG_DEBUG, "%s: %" PRId64 " attention heads (n_head of %s)", st_path, *heads, path);
    json_decref(o);
    return s;
}

/* A size in the file's metadata (key): a positive decimal integer, else the file is refused. */
static zoff_status meta_count(const zoff_st_file *f, const char *key, int64_t *out) {
    const char *v = zoff_st_metadata(f, key);
    char *end = NULL;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x <= 0)
        return zoff_error(ZOFF_ERR_FORMAT, "%s: its metadata %s is \"%.40s\", not a positive integer: the file is "
                          "damaged or was edited; write it again",
                          zoff_st_path(f), key, v);
    *out = x;
    return ZOFF_OK;
}

zoff_status zoff_gpt2_st_infer_shape(const zoff_st_file *f, zoff_gpt2_shape *out) {
    memset(out, 0, sizeof *out);
    const zoff_st_tensor *wte = find_either(f, "wte.weight"), *wpe = find_either(f, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s does not hold GPT-2 weights: no 2-D wte.weight and wpe.weight (or "
                          "transformer.wte.weight, ...)",
                          zoff_st_path(f));
    int64_t L = 0;
    for (size_t i = 0; i < zoff_st_num_tensors(f); i++) {
        int64_t l;
        const char *rest;
        if (parse_block_name(strip_prefix(zoff_st_tensor_at(f, i)->name), &l, &rest) && l + 1 > L) L = l + 1;
    }
    out->num_layers = L;
    out->hidden_size = wte->shape[1];
    out->max_seq_len = wpe->shape[0];
    bool zl = zoff_gpt2_st_layout(f) == ZOFF_GPT2_LAYOUT_ZOFF;
    out->vocab_size = wte->shape[0];
    if (zl) {
        out->padded_vocab_size = wte->shape[0];
        if (zoff_st_metadata(f, "zoff.vocab_size")) ZOFF_TRY(meta_count(f, "zoff.vocab_size", &out->vocab_size));
    }
    int64_t cfg_heads;
    const char *vocab_from = zl && zoff_st_metadata(f, "zoff.vocab_size") ? "its metadata zoff.vocab_size"
                                                                            : "the rows of its wte.weight";
    ZOFF_TRY(config_json_read(zoff_st_path(f), out, zoff_st_find(f, "lm_head.weight") != NULL, vocab_from,
                              &cfg_heads));
    const bool meta_heads = zoff_st_metadata(f, "zoff.num_heads") != NULL;
    if (meta_heads) ZOFF_TRY(meta_count(f, "zoff.num_heads", &out->num_heads));
    else out->num_heads = cfg_heads;
    if (out->num_heads > 0 && out->hidden_size > 0 && out->hidden_size % out->num_heads)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s: %s gives %" PRId64 " attention heads, which do not divide the width %" PRId64
                          " of its tensors: %s",
                          zoff_st_path(f), meta_heads ? "its zoff.num_heads metadata" : "the n_head of config.json",
                          out->num_heads, out->hidden_size,
                          meta_heads ? "the file is damaged or was edited; write it again" : "correct config.json");
    return ZOFF_OK;
}

int zoff_gpt2_st_resolve(const char *path, char *file, size_t cap) {
    struct stat st;
    snprintf(file, cap, "%s", path);
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    const char *sep = path[0] && path[strlen(path) - 1] == '/' ? "" : "/"; /* gpt2/ + model...: one slash */
    snprintf(file, cap, "%s%smodel.safetensors", path, sep);
    if (stat(file, &st) == 0) return 1;
    snprintf(file, cap, "%s%smodel.safetensors.index.json", path, sep); /* a sharded model */
    if (stat(file, &st) == 0) return 1;
    snprintf(file, cap, "%s", path);
    return -1;
}

/* The first (by name) of a folder's *.safetensors files into first; how many there are. */
static int folder_safetensors(const char *dir, char *first, size_t cap) {
    DIR *d = opendir(dir);
    int n = 0;
    first[0] = '\0';
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        size_t len = strlen(e->d_name), k = strlen(".safetensors");
        if (len <= k || strcmp(e->d_name + len - k, ".safetensors") || e->d_name[0] == '.') continue;
        if (!n++ || strcmp(e->d_name, first) < 0) snprintf(first, cap, "%s", e->d_name);
    }
    closedir(d);
    return n;
}

void zoff_gpt2_st_folder_hint(const char *dir, char *buf, size_t cap) {
    char f[4200], first[256];
    struct stat st;
    buf[0] = '\0';
    const char *sep = dir[0] && dir[strlen(dir) - 1] == '/' ? "" : "/";
    int n = folder_safetensors(dir, first, sizeof first);
    if (n > 0 && strstr(first, "-of-")) { /* save_pretrained's shards: model-00001-of-00002.safetensors */
        snprintf(buf, cap,
                 "; it holds %d shard file%s (%s, ...) but not the model.safetensors.index.json that says which "
                 "tensor is in which: put the index (written with the shards) beside them",
                 n, n == 1 ? "" : "s", first);
        return;
    }
    if (n > 0) {
        snprintf(buf, cap, "; it holds %s%s: give that file (%s%s%s)", first,
                 n > 1 ? " and other .safetensors files" : "", dir, sep, first);
        return;
    }
    snprintf(f, sizeof f, "%s/pytorch_model.bin", dir);
    if (stat(f, &st) == 0)
        snprintf(buf, cap,
                 "; it holds pytorch_model.bin (PyTorch's pickle format), which zoff does not read: save it as "
                 "safetensors first, e.g. GPT2LMHeadModel.from_pretrained('%s').save_pretrained(OUT, "
                 "safe_serialization=True), then give OUT",
                 dir);
}

/* "the file holds ...: use --num-layers ... " (for shape errors). */
static void shape_hint(const zoff_st_file *f, const zoff_gpt2_shape *model, char *buf, size_t cap) {
    zoff_gpt2_shape fs;
    buf[0] = '\0';
    zoff_status s = zoff_gpt2_st_infer_shape(f, &fs);
    zoff_clear_error();
    if (s != ZOFF_OK) return;
    if (!file_shape_in_bounds(&fs)) { /* no flags would make a model of it */
        snprintf(buf, cap,
                 "; the file's tensors give no GPT-2 zoff can build (%" PRId64 " layers, width %" PRId64 ", %" PRId64
                 " positions, vocabulary %" PRId64 ")",
                 fs.num_layers, fs.hidden_size, fs.max_seq_len, fs.vocab_size);
        return;
    }
    if (fs.num_layers == model->num_layers && fs.hidden_size == model->hidden_size &&
        fs.max_seq_len == model->max_seq_len && fs.vocab_size == model->vocab_size) { /* no flags would help */
        snprintf(buf, cap,
                 "; the file's other tensors are this model's (%" PRId64 " layers, width %" PRId64 ", %" PRId64
                 " positions, vocabulary %" PRId64 "), so the file itself is inconsistent (damaged, cut short or "
                 "edited): write or download it again",
                 fs.num_layers, fs.hidden_size, fs.max_seq_len, fs.vocab_size);
        return;
    }
    int n = snprintf(buf, cap,
                     "; the file holds a GPT-2 with %" PRId64 " layers, width %" PRId64 ", %" PRId64
                     " positions, vocabulary %" PRId64 ", the model has %" PRId64 ", %" PRId64 ", %" PRId64
                     ", %" PRId64 ": train with --num-layers %" PRId64 " --hidden-size %" PRId64
                     " --max-position-embeddings %" PRId64 " --vocab-size %" PRId64,
                     fs.num_layers, fs.hidden_size, fs.max_seq_len, fs.vocab_size, model->num_layers,
                     model->hidden_size, model->max_seq_len, model->vocab_size, fs.num_layers, fs.hidden_size,
                     fs.max_seq_len, fs.vocab_size);
    if (n > 0 && (size_t)n < cap && fs.num_heads > 0)
        snprintf(buf + n, cap - (size_t)n, " --num-attention-heads %" PRId64, fs.num_heads);
}

/* Map every tensor of the file to its parameter (slot[np]); *lm_head: the optional tied head. */
static zoff_status match_tensors(const zoff_st_file *f, const zoff_gpt2_shape *sh, zoff_gpt2_layout layout,
                                 const zoff_st_tensor **slot, const zoff_st_tensor **lm_head) {
    const char *path = zoff_st_path(f);
    const int64_t L = sh->num_layers, np = nparams_of(L);
    char hint[600], sa[200], sb[200], nm[160];
    *lm_head = NULL;
    for (size_t i = 0; i < zoff_st_num_tensors(f); i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        const char *name = strip_prefix(t->name);
        if (layout == ZOFF_GPT2_LAYOUT_HF && (is_hf_buffer(name) || is_mc_head(t->name))) continue;
        if (layout == ZOFF_GPT2_LAYOUT_HF && !strcmp(t->name, "lm_head.weight")) {
            *lm_head = t;
            continue;
        }
        int64_t layer, idx = param_index(name, L, &layer);
        if (idx == -1)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "%s: tensor '%.*s' is not a GPT-2 parameter (is this a file of another model?)", path,
                              ST_NAME_SHOWN, t->name);
        if (idx == -2) {
            shape_hint(f, sh, hint, sizeof hint);
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' belongs to layer %" PRId64
                              ", but the model has %" PRId64 " layers%s", path, t->name, layer, L, hint);
        }
        if (slot[idx])
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensors '%s' and '%s' are the same parameter", path,
                              slot[idx]->name, t->name);
        if (!zoff_st_dtype_is_float(t->dtype) || (layout == ZOFF_GPT2_LAYOUT_ZOFF && t->dtype != ZOFF_ST_F32))
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' is %s; expected %s", path, t->name,
                              zoff_st_dtype_name(t->dtype),
                              layout == ZOFF_GPT2_LAYOUT_ZOFF ? "F32 (a zoff-layout file)" : "F32, F16, BF16 or F64");
        int64_t dims[2];
        int nd = param_shape(idx, sh, layout, dims);
        if (!zoff_ckpt_same_shape(t->ndim, t->shape, nd, dims)) {
            shape_hint(f, sh, hint, sizeof hint);
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' has shape %s, but the model needs %s%s%s", path,
                              t->name, zoff_ckpt_shape_str(t->ndim, t->shape, sa, sizeof sa), zoff_ckpt_shape_str(nd, dims, sb, sizeof sb),
                              layout == ZOFF_GPT2_LAYOUT_ZOFF ? " (zoff layout)" : " (Hugging Face layout)", hint);
        }
        slot[idx] = t;
    }
    for (int64_t idx = 0; idx < np; idx++)
        if (!slot[idx]) {
            param_name(idx, L, nm, sizeof nm);
            shape_hint(f, sh, hint, sizeof hint);
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' is missing%s", path, nm, hint);
        }
    if (*lm_head) {
        const zoff_st_tensor *w = slot[0];
        if (!zoff_ckpt_same_shape((*lm_head)->ndim, (*lm_head)->shape, w->ndim, w->shape) || !zoff_st_dtype_is_float((*lm_head)->dtype))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "%s: lm_head.weight is %s %s but wte is %s: zoff ties the LM head to wte and cannot load "
                              "a separate head",
                              path, zoff_st_dtype_name((*lm_head)->dtype),
                              zoff_ckpt_shape_str((*lm_head)->ndim, (*lm_head)->shape, sa, sizeof sa),
                              zoff_ckpt_shape_str(w->ndim, w->shape, sb, sizeof sb));
    }
    const char *nh = zoff_st_metadata(f, "zoff.num_heads");
    if (nh && sh->num_heads > 0 && strtoll(nh, NULL, 10) != sh->num_heads)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "%s was written from a model with %.20s attention heads, the model has %" PRId64
                          ": use --num-attention-heads %.20s",
                          path, nh, sh->num_heads, nh);
    if (layout == ZOFF_GPT2_LAYOUT_ZOFF) {
        const char *v = zoff_st_metadata(f, "zoff.vocab_size");
        if (v && strtoll(v, NULL, 10) != sh->vocab_size) {
            shape_hint(f, sh, hint, sizeof hint);
            return zoff_error(ZOFF_ERR_FORMAT, "%s: the file's vocabulary is %s, the model's %" PRId64 "%s", path, v,
                              sh->vocab_size, hint);
        }
    }
    return ZOFF_OK;
}

zoff_status zoff_gpt2_st_check(const zoff_st_file *f, const zoff_gpt2_shape *shape) {
    zoff_gpt2_shape sh;
    ZOFF_TRY(check_model_shape(shape, &sh));
    const zoff_st_tensor **slot = calloc((size_t)nparams_of(sh.num_layers), sizeof *slot), *lm;
    if (!slot) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = match_tensors(f, &sh, zoff_gpt2_st_layout(f), slot, &lm);
    free(slot);
    return s;
}

/* Streaming import: any range of the flat zoff-layout weights, straight into the caller's memory.
 * What it holds: the file-tensor of each model tensor, and one tensor's worth of floats for the
 * Hugging Face layout's transposed matrices (the last one read, kept for the next range). */
struct zoff_gpt2_st_loader {
    zoff_st_file *f;
    zoff_gpt2_shape sh;
    zoff_gpt2_layout layout;
    const zoff_tensor_info *tensors;
    int ntensors;
    const zoff_st_tensor **slot; /* model tensor i -> its file tensor */
    const zoff_st_tensor *lm;    /* HF: the optional tied head, compared with wte as wte is read */
    float *tmp;                  /* one transposed matrix as the file stores it */
    int tmp_of;                  /* the model tensor in tmp, -1: none */
    int64_t tmp_cap;
};

/* The largest tensor the HF layout stores transposed (c_fc / c_proj: 4 C x C), the loader's buffer. */
int64_t zoff_gpt2_st_loader_floats(const zoff_gpt2_shape *shape) { return 4 * shape->hidden_size * shape->hidden_size; }

void zoff_gpt2_st_loader_close(zoff_gpt2_st_loader *l) {
    if (!l) return;
    free(l->tmp);
    free(l->slot);
    free(l);
}

zoff_status zoff_gpt2_st_loader_open(zoff_st_file *f, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                                     int ntensors, zoff_gpt2_st_loader **out) {
    *out = NULL;
    zoff_gpt2_shape sh;
    ZOFF_TRY(check_model_shape(shape, &sh));
    const int64_t L = sh.num_layers, np = nparams_of(L);
    if (ntensors != np)
        return zoff_error(ZOFF_ERR_INVALID, "load: %d model tensors; a GPT-2 with %" PRId64 " layers has %" PRId64,
                          ntensors, L, np);
    zoff_gpt2_st_loader *l = calloc(1, sizeof *l);
    const zoff_st_tensor **byidx = calloc((size_t)np, sizeof *byidx);
    if (l) l->slot = calloc((size_t)np, sizeof *l->slot);
    if (!l || !byidx || !l->slot) {
        free(byidx);
        zoff_gpt2_st_loader_close(l);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    *l = (zoff_gpt2_st_loader){.f = f, .sh = sh, .layout = zoff_gpt2_st_layout(f), .tensors = tensors,
                               .ntensors = ntensors, .slot = l->slot, .tmp_of = -1};
    zoff_status s = match_tensors(f, &sh, l->layout, byidx, &l->lm);
    char sa[200], sb[200], mc[200] = "";
    for (size_t i = 0; s == ZOFF_OK && l->layout == ZOFF_GPT2_LAYOUT_HF && i < zoff_st_num_tensors(f); i++)
        if (is_mc_head(zoff_st_tensor_at(f, i)->name))
            snprintf(mc + strlen(mc), sizeof mc - strlen(mc), "%s%s", *mc ? ", " : "", zoff_st_tensor_at(f, i)->name);
    if (*mc)
        zoff_log(ZOFF_LOG_INFO, "note: %s: not loaded: %s (GPT2DoubleHeadsModel's multiple-choice head; zoff's "
                 "GPT-2 is the language model only, as transformers' GPT2LMHeadModel)", zoff_st_path(f), mc);
    for (int i = 0; i < ntensors && s == ZOFF_OK; i++) {
        const zoff_tensor_info *t = &tensors[i];
        int64_t layer, idx = param_index(t->name, L, &layer), dims[2];
        int nd = idx >= 0 ? param_shape(idx, &sh, ZOFF_GPT2_LAYOUT_ZOFF, dims) : 0;
        if (idx < 0 || !zoff_ckpt_same_shape(t->ndim, t->shape, nd, dims))
            s = zoff_error(ZOFF_ERR_INVALID, "load: model tensor '%.*s' %s is not a parameter of GPT-2 shape %s",
                           ST_NAME_SHOWN, t->name, zoff_ckpt_shape_str(t->ndim, t->shape, sa, sizeof sa),
                           idx >= 0 ? zoff_ckpt_shape_str(nd, dims, sb, sizeof sb) : "");
        else
            l->slot[i] = byidx[idx];
    }
    free(byidx);
    if (s != ZOFF_OK) {
        zoff_gpt2_st_loader_close(l);
        return s;
    }
    *out = l;
    return ZOFF_OK;
}

/* The tied head against elements [k0, k0 + n) of wte as read (dst): a head that differs is refused
 * (zoff ties the head to wte, so it would run, sample, evaluate or fine-tune another model than the
 * file's), for every reader (train --init-from, sample, eval). */
static zoff_status check_lm_head(zoff_gpt2_st_loader *l, int64_t k0, int64_t n, const float *dst) {
    float chunk[4096];
    for (int64_t a = 0; a < n; a += 4096) {
        int64_t c = n - a < 4096 ? n - a : 4096;
        ZOFF_TRY(zoff_st_read_f32_range(l->f, l->lm, k0 + a, c, chunk));
        int64_t j = 0;
        while (j < c && !memcmp(chunk + j, dst + a + j, sizeof(float))) j++;
        if (j < c)
            return zoff_error(ZOFF_ERR_INVALID,
                              "%s holds an LM head (lm_head.weight) that differs from its token embedding "
                              "(wte.weight; first at element %lld): zoff ties the head to the embedding, as GPT-2 "
                              "does, so it would run another model than the file's; give weights whose head is tied "
                              "(GPT-2's own, zoff export's)",
                              zoff_st_path(l->f), (long long)(k0 + a + j));
    }
    return ZOFF_OK;
}

/* Elements [k0, k1) of model tensor i (zoff layout) into dst. */
static zoff_status read_tensor_part(zoff_gpt2_st_loader *l, int i, int64_t k0, int64_t k1, float *dst) {
    const int64_t L = l->sh.num_layers;
    int64_t layer, idx = param_index(l->tensors[i].name, L, &layer);
    const zoff_st_tensor *ft = l->slot[i];
    if (l->layout == ZOFF_GPT2_LAYOUT_HF && idx == 0) { /* wte: the file's rows, then the padding rows at zero */
        int64_t fe = k1 < ft->numel ? k1 : ft->numel;
        if (k0 < fe) {
            ZOFF_TRY(zoff_st_read_f32_range(l->f, ft, k0, fe - k0, dst));
            if (l->lm) ZOFF_TRY(check_lm_head(l, k0, fe - k0, dst));
        }
        int64_t z0 = k0 > ft->numel ? k0 : ft->numel;
        if (z0 < k1) memset(dst + (z0 - k0), 0, (size_t)(k1 - z0) * sizeof(float));
        return ZOFF_OK;
    }
    if (l->layout != ZOFF_GPT2_LAYOUT_HF || !is_conv1d(idx, L)) return zoff_st_read_f32_range(l->f, ft, k0, k1 - k0, dst);
    /* Conv1D: the file holds (R, C) = (in, out); zoff's element k = (j, r) of (out, in) is the file's (r, j) */
    if (l->tmp_of != i) {
        if (ft->numel > l->tmp_cap) {
            free(l->tmp);
            l->tmp_cap = 0;
            if (!(l->tmp = malloc((size_t)ft->numel * sizeof(float))))
                return zoff_error(ZOFF_ERR_NOMEM, "out of memory (%" PRId64 " floats)", ft->numel);
            l->tmp_cap = ft->numel;
        }
        l->tmp_of = -1;
        ZOFF_TRY(zoff_st_read_f32(l->f, ft, l->tmp, ft->numel));
        l->tmp_of = i;
    }
    const int64_t R = ft->shape[0], C = ft->shape[1];
    if (k0 == 0 && k1 == ft->numel) { /* whole: the cache-blocked transpose */
        transpose(l->tmp, dst, R, C);
        return ZOFF_OK;
    }
    for (int64_t k = k0; k < k1;) { /* zoff's row j = the file's column j */
        int64_t j = k / R, r = k % R, e = (j + 1) * R < k1 ? (j + 1) * R : k1;
        for (; k < e; k++, r++) dst[k - k0] = l->tmp[r * C + j];
    }
    return ZOFF_OK;
}

zoff_status zoff_gpt2_st_loader_read(zoff_gpt2_st_loader *l, int64_t lo, int64_t hi, float *dst) {
    for (int i = 0; i < l->ntensors; i++) {
        const zoff_tensor_info *t = &l->tensors[i];
        int64_t a = lo > t->offset ? lo : t->offset, b = hi < t->offset + t->numel ? hi : t->offset + t->numel;
        if (a < b) ZOFF_TRY(read_tensor_part(l, i, a - t->offset, b - t->offset, dst + (a - lo)));
    }
    return ZOFF_OK;
}

zoff_status zoff_gpt2_st_load(zoff_st_file *f, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                              int ntensors, float *host_params) {
    zoff_gpt2_st_loader *l = NULL;
    ZOFF_TRY(zoff_gpt2_st_loader_open(f, shape, tensors, ntensors, &l));
    int64_t end = 0;
    for (int i = 0; i < ntensors; i++)
        if (tensors[i].offset + tensors[i].numel > end) end = tensors[i].offset + tensors[i].numel;
    zoff_status s = zoff_gpt2_st_loader_read(l, 0, end, host_params);
    zoff_gpt2_st_loader_close(l);
    return s;
}
