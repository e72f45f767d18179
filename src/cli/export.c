/* zoff export: a training checkpoint -> safetensors (Hugging Face GPT-2, or zoff's fp32 layout).
 * Formats: include/zoff/safetensors.h. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file_internal.h"
#include "core/half_internal.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "zoff/safetensors.h"

static void export_usage(FILE *f) {
    fprintf(f,
            "usage: zoff export --load DIR --output PATH [options]\n"
            "\n"
            "Writes the weights of a training checkpoint (all of its rank files, consolidated) as one\n"
            "safetensors file. Nothing is written unless the whole export succeeds; an existing PATH is\n"
            "replaced atomically.\n"
            "\n"
            "  --load DIR            checkpoint root (its newest complete step) or a step directory\n"
            "                        (--checkpoint is the same flag)\n"
            "  --step N              export step N of the root DIR instead of the newest\n"
            "  --format FORMAT       safetensors (default): Hugging Face GPT-2 names and layout, loadable\n"
            "                          by transformers.GPT2LMHeadModel (Conv1D weights transposed, wte\n"
            "                          without padding rows, LM head tied and not stored)\n"
            "                        fp32: the fp32 master weights in zoff's own layout (the zero_to_fp32\n"
            "                          step); zoff train --init-from reads both\n"
            "  --output PATH         the file to write; with --format safetensors, a PATH that is a\n"
            "                        directory or ends in '/' gets PATH/model.safetensors and a GPT-2\n"
            "                        PATH/config.json (GPT2LMHeadModel.from_pretrained(PATH) loads it),\n"
            "                        and for the gpt2 tokenizer its vocab.json, merges.txt and\n"
            "                        tokenizer_config.json (AutoTokenizer.from_pretrained(PATH))\n"
            "  --dtype f32|bf16|f16  data type of --format safetensors (default f32)\n"
            "  -q, --quiet           no summary line\n");
}

static int fail(const char *what, zoff_status s) {
    fprintf(stderr, "zoff export: %s: %s\n", what, zoff_last_error());
    return cli_exit_code(s);
}

/* fetch callback: one tensor of the consolidated checkpoint as fp32 */
typedef struct fetch_ctx {
    zoff_ckpt_gather *g;
} fetch_ctx;

static zoff_status fetch_tensor(void *user, const zoff_tensor_info *t, float *dst) {
    fetch_ctx *c = user;
    const zoff_ckpt_gathered *e = zoff_ckpt_gather_find(c->g, t->name);
    if (!e) return zoff_error(ZOFF_ERR_FORMAT, "the checkpoint has no tensor '%s'", t->name);
    if (e->dtype == ZOFF_F32) return zoff_ckpt_gather_read(c->g, t->name, dst, (size_t)t->numel * sizeof(float));
    if (e->dtype != ZOFF_BF16 && e->dtype != ZOFF_F16)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint tensor '%s' is %s; expected f32, bf16 or f16", t->name,
                          zoff_dtype_name(e->dtype));
    uint16_t *h = malloc((size_t)t->numel * sizeof(uint16_t));
    if (!h) return zoff_error(ZOFF_ERR_NOMEM, "out of memory reading '%s'", t->name);
    zoff_status s = zoff_ckpt_gather_read(c->g, t->name, h, (size_t)t->numel * sizeof(uint16_t));
    for (int64_t i = 0; s == ZOFF_OK && i < t->numel; i++)
        dst[i] = e->dtype == ZOFF_BF16 ? zoff_half_bf16_to_f32(h[i]) : zoff_f16_to_f32(h[i]);
    free(h);
    return s;
}

/* A folder's small files (config.json, the tokenizer's), written complete under temp names before
 * the model file and renamed into place after it: a failure anywhere (a full disk, ulimit -f)
 * leaves the folder as it was, as for the single-file export. */
typedef struct staged_files {
    char *path[4], *tmp[4];
    int n;
} staged_files;

static zoff_status write_text_staged(staged_files *st, const char *dir, const char *name, const char *text) {
    char path[4200];
    int pn = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (pn < 0 || (size_t)pn >= sizeof path) return zoff_error(ZOFF_ERR_INVALID, "output path %s is too long", dir);
    if (st->n == 4 || !(st->path[st->n] = strdup(path))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = zoff_write_file_staged(path, text, &st->tmp[st->n]);
    if (s != ZOFF_OK) free(st->path[st->n]);
    else st->n++;
    return s;
}

/* Rename the staged files into place (commit) or remove them, and free the list. */
static zoff_status staged_finish(staged_files *st, bool commit) {
    zoff_status s = ZOFF_OK;
    for (int i = 0; i < st->n; i++) {
        if (commit && s == ZOFF_OK && rename(st->tmp[i], st->path[i]) != 0)
            s = zoff_error(ZOFF_ERR_IO, "cannot rename %s to %s: %s", st->tmp[i], st->path[i], strerror(errno));
        if (!commit || s != ZOFF_OK) unlink(st->tmp[i]); /* gone already where renamed */
        zoff_temp_forget(st->tmp[i]);
    }
    if (commit && s == ZOFF_OK && st->n > 0) s = zoff_fsync_dir_of(st->path[0]);
    for (int i = 0; i < st->n; i++) {
        free(st->tmp[i]);
        free(st->path[i]);
    }
    st->n = 0;
    return s;
}

/* transformers' GPT2Config for the exported weights. */
static char *hf_config_json(const zoff_gpt2_shape *sh, const char *tokenizer, zoff_st_dtype dt) {
    bool gpt2_tok = !strcmp(tokenizer, "gpt2");
    const char *torch_dtype = dt == ZOFF_ST_BF16 ? "bfloat16" : dt == ZOFF_ST_F16 ? "float16" : "float32";
    json_t *o = json_pack("{s:[s],s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:n,s:s,s:f,s:f,s:f,s:f,s:f,s:b,s:b,s:b,s:s,s:s}",
                          "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size",
                          (json_int_t)sh->vocab_size, "n_positions", (json_int_t)sh->max_seq_len, "n_ctx",
                          (json_int_t)sh->max_seq_len, "n_embd", (json_int_t)sh->hidden_size, "n_layer",
                          (json_int_t)sh->num_layers, "n_head", (json_int_t)sh->num_heads, "n_inner",
                          "activation_function", "gelu_new", "layer_norm_epsilon", 1e-5, "initializer_range", 0.02,
                          "resid_pdrop", 0.1, "embd_pdrop", 0.1, "attn_pdrop", 0.1, "scale_attn_weights", 1,
                          "tie_word_embeddings", 1, "use_cache", 1, "torch_dtype", torch_dtype, "zoff_tokenizer",
                          tokenizer);
    if (!o) return NULL;
    if (gpt2_tok) {
        json_object_set_new(o, "bos_token_id", json_integer(50256));
        json_object_set_new(o, "eos_token_id", json_integer(50256));
    }
    char *txt = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(8));
    json_decref(o);
    if (!txt) return NULL;
    size_t n = strlen(txt);
    char *out = realloc(txt, n + 2);
    if (!out) {
        free(txt);
        return NULL;
    }
    out[n] = '\n';
    out[n + 1] = '\0';
    return out;
}

/* The GPT-2 tokenizer's tables as transformers' GPT2Tokenizer reads them from a model folder:
 * vocab.json is GPT-2's encoder.json and merges.txt its vocab.bpe (the same bytes, "#version"
 * line first), with a tokenizer_config.json naming the class and <|endoftext|>. */
static zoff_status write_gpt2_tokenizer(staged_files *st, const char *dir, int64_t max_len) {
    static const char *const files[][2] = {{"gpt2/encoder.json", "vocab.json"}, {"gpt2/vocab.bpe", "merges.txt"}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[4200];
        ZOFF_TRY(zoff_data_find(files[i][0], src, sizeof src));
        FILE *f = fopen(src, "rb");
        if (!f) return zoff_error(ZOFF_ERR_IO, "cannot read %s: %s", src, strerror(errno));
        char *text = NULL;
        long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (text = malloc((size_t)n + 1)) &&
            fread(text, 1, (size_t)n, f) == (size_t)n)
            text[n] = '\0';
        else {
            free(text);
            text = NULL;
        }
        fclose(f);
        if (!text) return zoff_error(ZOFF_ERR_IO, "cannot read %s", src);
        zoff_status s = write_text_staged(st, dir, files[i][1], text);
        free(text);
        ZOFF_TRY(s);
    }
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\n  \"add_prefix_space\": false,\n  \"bos_token\": \"<|endoftext|>\",\n  \"eos_token\": "
             "\"<|endoftext|>\",\n  \"model_max_length\": %lld,\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  "
             "\"unk_token\": \"<|endoftext|>\"\n}\n",
             (long long)max_len);
    return write_text_staged(st, dir, "tokenizer_config.json", cfg);
}

/* A folder's config.json and, for the gpt2 tokenizer, its files, staged. */
static zoff_status stage_folder_files(staged_files *st, const char *dir, const zoff_train_meta *meta, zoff_st_dtype dt) {
    char *cfg = hf_config_json(&meta->shape, meta->tokenizer, dt);
    zoff_status s =
        cfg ? write_text_staged(st, dir, "config.json", cfg) : zoff_error(ZOFF_ERR_NOMEM, "cannot encode config.json");
    free(cfg);
    if (s == ZOFF_OK && !strcmp(meta->tokenizer, "gpt2")) s = write_gpt2_tokenizer(st, dir, meta->shape.max_seq_len);
    return s;
}

/* A model without GPT-2's tokenizer exported into a folder that holds its files (an earlier export's):
 * they no longer describe the model; say so (they are not removed). ZOFF_OK. */
static zoff_status warn_tokenizer_left(const char *dir, const char *tokenizer) {
    static const char *const files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    char p[4300];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (access(p, F_OK) == 0) {
            zoff_log(ZOFF_LOG_WARN, "%s holds GPT-2 tokenizer files (%s, ...) from an earlier export; this model's "
                     "tokenizer is %s: remove them, or AutoTokenizer will load GPT-2's", dir, files[i], tokenizer);
            break;
        }
    }
    return ZOFF_OK;
}

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Where --output goes, checked before any reading: a folder it names is created (one level), so its
 * parent must exist; a file's folder must exist. A folder's files (model.safetensors, config.json, ...)
 * are replaced together (staged_files) unless one is a folder; an --output DIR/ that is a file is refused. */
static zoff_status check_output(const char *output, bool dir_mode) {
    size_t olen = strlen(output);
    char where[4200];
    snprintf(where, sizeof where, "%.*s", (int)(output[olen - 1] == '/' && olen > 1 ? olen - 1 : olen), output);
    struct stat st;
    if (!dir_mode || !is_dir(where)) {
        if (dir_mode && stat(where, &st) == 0)
            return zoff_error(ZOFF_ERR_INVALID, "%s names a folder, but %s is a file: remove it or give another --output",
                              output, where);
        return zoff_check_output_parent(where);
    }
    static const char *const files[] = {"model.safetensors", "config.json", "vocab.json", "merges.txt",
                                        "tokenizer_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char f[4300];
        snprintf(f, sizeof f, "%s/%s", where, files[i]);
        if (is_dir(f))
            return zoff_error(ZOFF_ERR_INVALID, "%s is a folder, where the export writes a file: remove it or give "
                              "another --output", f);
    }
    char f[4300];
    snprintf(f, sizeof f, "%s/model.safetensors", where);
    return zoff_check_output_parent(f);
}

int zoff_cmd_export(int argc, char **argv) {
    const char *load = NULL, *output = NULL, *format = "safetensors", *dtype_s = "f32";
    int64_t step = -1;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char name[64];
        cli_flag_name(a, name, sizeof name);
        const cli_string_flag strs[] = {{"--load", &load},     {"--checkpoint", &load}, {"--output", &output},
                                        {"--format", &format}, {"--dtype", &dtype_s}};
        const cli_int_flag ints[] = {{"--step", 0, INT64_MAX / 2, &step}};
        int took = cli_string_flags("export", name, strs, sizeof strs / sizeof *strs, argc, argv, &i);
        if (!took) took = cli_int_flags("export", name, ints, sizeof ints / sizeof *ints, argc, argv, &i);
        if (took < 0) return 2;
        if (took) continue;
        if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
            export_usage(stdout);
            return 0;
        } else if (!cli_quiet_flag(a, &quiet)) {
            cli_unknown_option("export", a, export_usage);
            return 2;
        }
    }
    if (!load || !output) {
        fprintf(stderr, "zoff export: --load DIR and --output PATH are required (zoff export --help)\n");
        return 2;
    }
    if (!cli_path_given("export", "--load", load, "a checkpoint folder (zoff train --save)") ||
        !cli_path_given("export", "--output", output, "a file (e.g. model.safetensors) or a folder (e.g. hf/)"))
        return 2; /* --output checked before its last character is read */
    zoff_gpt2_export_options eo = {.layout = ZOFF_GPT2_LAYOUT_HF, .dtype = ZOFF_ST_F32};
    if (!strcmp(format, "fp32")) eo.layout = ZOFF_GPT2_LAYOUT_ZOFF;
    else if (strcmp(format, "safetensors")) {
        fprintf(stderr, "zoff export: --format: '%s' is not one of safetensors, fp32\n", format);
        return 2;
    }
    zoff_dtype wdt;
    if (!cli_parse_dtype("export", "--dtype", dtype_s, &wdt)) return 2;
    eo.dtype = wdt == ZOFF_BF16 ? ZOFF_ST_BF16 : wdt == ZOFF_F16 ? ZOFF_ST_F16 : ZOFF_ST_F32;
    if (eo.layout == ZOFF_GPT2_LAYOUT_ZOFF && eo.dtype != ZOFF_ST_F32) {
        fprintf(stderr, "zoff export: --format fp32 is always f32; --dtype %s applies to --format safetensors\n",
                dtype_s);
        return 2;
    }
    size_t olen = strlen(output);
    bool dir_mode = olen > 0 && (output[olen - 1] == '/' || is_dir(output));
    if (dir_mode && eo.layout == ZOFF_GPT2_LAYOUT_ZOFF) {
        fprintf(stderr, "zoff export: --format fp32 writes one file; %s is a directory: give a file name\n", output);
        return 2;
    }

    zoff_status cs = check_output(output, dir_mode);
    if (cs != ZOFF_OK) return fail("--output", cs);
    /* the checkpoint: a root, a step directory, or root + --step */
    char stepdir[4096];
    if (step >= 0) {
        zoff_status s = zoff_ckpt_step_path(load, step, stepdir, sizeof stepdir);
        if (s != ZOFF_OK) return fail("--step", s);
    } else {
        snprintf(stepdir, sizeof stepdir, "%s", load);
    }
    zoff_ckpt_gather *g = NULL;
    zoff_status s = zoff_ckpt_gather_open(stepdir, &g);
    if (s != ZOFF_OK) return fail("--load", s);
    zoff_train_meta meta;
    s = zoff_train_ckpt_read_meta(zoff_ckpt_gather_reader(g, 0), &meta, NULL);
    if (s != ZOFF_OK) {
        zoff_ckpt_gather_close(g);
        return fail("--load", s);
    }
    /* the weights: every GPT-2 parameter of the checkpoint (optimizer state and blobs are not exported) */
    size_t nt = zoff_ckpt_gather_num_tensors(g);
    zoff_tensor_info *tab = calloc(nt ? nt : 1, sizeof *tab);
    if (!tab) {
        zoff_ckpt_gather_close(g);
        return fail("export", zoff_error(ZOFF_ERR_NOMEM, "out of memory"));
    }
    int n = 0;
    for (size_t i = 0; i < nt; i++) {
        const zoff_ckpt_gathered *e = zoff_ckpt_gather_tensor_at(g, i);
        if (!zoff_gpt2_st_is_param(e->name, meta.shape.num_layers)) continue;
        if (strlen(e->name) >= sizeof tab[n].name || e->ndim < 1 || e->ndim > 2) {
            s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint tensor '%s' has %d dimensions; GPT-2 parameters have 1 or 2",
                           e->name, e->ndim);
            break;
        }
        zoff_tensor_info *t = &tab[n++];
        snprintf(t->name, sizeof t->name, "%s", e->name);
        t->ndim = e->ndim;
        t->shape[0] = e->shape[0];
        t->shape[1] = e->ndim > 1 ? e->shape[1] : 0;
        t->numel = e->numel;
        t->layer = -1;
    }
    char out_file[4200], dir[4200];
    bool made_dir = false;
    if (dir_mode) {
        snprintf(dir, sizeof dir, "%.*s", (int)(output[olen - 1] == '/' && olen > 1 ? olen - 1 : olen), output);
        int on = snprintf(out_file, sizeof out_file, "%s/model.safetensors", dir);
        if (on < 0 || (size_t)on >= sizeof out_file) s = zoff_error(ZOFF_ERR_INVALID, "--output %s is too long", dir);
        made_dir = s == ZOFF_OK && !is_dir(dir);
        if (made_dir && mkdir(dir, 0755) != 0) {
            made_dir = false;
            s = zoff_error(zoff_status_of_path_errno(errno), "cannot create directory %s: %s", dir, strerror(errno));
        }
    } else {
        snprintf(out_file, sizeof out_file, "%s", output);
    }
    char step_txt[32];
    snprintf(step_txt, sizeof step_txt, "%" PRId64, zoff_ckpt_gather_step(g));
    const char *extra[] = {"zoff.step", step_txt, "zoff.tokenizer", meta.tokenizer};
    eo.metadata = extra;
    eo.metadata_pairs = 2;
    fetch_ctx fc = {.g = g};
    staged_files small = {.n = 0}; /* a folder's small files: in place only once the model file is */
    if (s == ZOFF_OK && dir_mode) s = stage_folder_files(&small, dir, &meta, eo.dtype);
    double t0 = zoff_now();
    if (s == ZOFF_OK) s = zoff_gpt2_st_export(out_file, &meta.shape, tab, n, fetch_tensor, &fc, &eo);
    double dt = zoff_now() - t0;
    zoff_status fs = staged_finish(&small, s == ZOFF_OK);
    if (s == ZOFF_OK) s = fs;
    if (s == ZOFF_OK && dir_mode && strcmp(meta.tokenizer, "gpt2") != 0) s = warn_tokenizer_left(dir, meta.tokenizer);
    int nranks = zoff_ckpt_gather_nranks(g);
    zoff_ckpt_gather_close(g);
    free(tab);
    if (s != ZOFF_OK && made_dir) rmdir(dir); /* the folder it made, empty again */
    if (s != ZOFF_OK) return fail(dir_mode ? dir : out_file, s);
    if (!quiet) {
        struct stat st;
        char b[32], nl[32];
        stat(out_file, &st);
        fprintf(stderr,
                "zoff: exported step %s (%d rank file%s) to %s%s: GPT-2 %s, width %" PRId64
                ", vocabulary %" PRId64 ", %s %s, %s in %.2f s\n",
                step_txt, nranks, nranks == 1 ? "" : "s", out_file,
                !dir_mode                        ? ""
                : !strcmp(meta.tokenizer, "gpt2") ? " (+ config.json and the tokenizer's files)"
                                                  : " (+ config.json)",
                zoff_format_count(meta.shape.num_layers, "layer", nl, sizeof nl), meta.shape.hidden_size,
                meta.shape.vocab_size,
                eo.layout == ZOFF_GPT2_LAYOUT_HF ? "Hugging Face layout" : "zoff layout",
                zoff_st_dtype_name(eo.dtype), zoff_format_bytes((size_t)st.st_size, b, sizeof b), dt);
    }
    return 0;
}
