/* Weights to run a model on (zoff sample, zoff eval): a training checkpoint, or GPT-2 weights in
 * safetensors (zoff export's file or folder, a Hugging Face model folder). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/common.h"
#include "zoff/safetensors.h"

/* A safetensors file's model: the shape its tensors and metadata (or config.json) give, all its
 * positions as the context, the tokenizer its zoff.tokenizer metadata names, else GPT-2's for
 * GPT-2's vocabulary. */
static zoff_status open_safetensors(const char *file, const char *tokenizer, cli_weights *src) {
    ZOFF_TRY(zoff_st_open(file, &src->st));
    ZOFF_TRY(zoff_gpt2_st_infer_shape(src->st, &src->shape));
    if (src->shape.num_heads <= 0)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s does not say how many attention heads its model has (no zoff.num_heads in its "
                          "metadata, no config.json with n_head beside it): put the model's config.json beside it",
                          file);
    src->seq_len = src->shape.max_seq_len;
    const char *tk = zoff_st_metadata(src->st, "zoff.tokenizer");
    if (tk && tokenizer && strcmp(tk, tokenizer) != 0)
        return zoff_error(ZOFF_ERR_INVALID, "%s was trained with tokenizer %s (its zoff.tokenizer), not --tokenizer %s",
                          file, tk, tokenizer);
    if (!tk) tk = tokenizer;
    if (!tk && src->shape.vocab_size >= 50257) tk = "gpt2";
    if (!tk)
        return zoff_error(ZOFF_ERR_INVALID,
                          "%s does not say its tokenizer (no zoff.tokenizer in its metadata) and its vocabulary of "
                          "%lld is not GPT-2's: give --tokenizer (byte for 256)",
                          file, (long long)src->shape.vocab_size);
    snprintf(src->tokenizer, sizeof src->tokenizer, "%s", tk);
    return zoff_gpt2_st_check(src->st, &src->shape); /* an untied head: refused as it is read */
}

zoff_status cli_weights_open(const char *load, const char *tokenizer, cli_weights *src) {
    memset(src, 0, sizeof *src);
    char file[4200];
    struct stat st;
    int r = zoff_gpt2_st_resolve(load, file, sizeof file);
    if (r == 1 || (r == 0 && stat(load, &st) == 0 && S_ISREG(st.st_mode)))
        return open_safetensors(file, tokenizer, src);
    zoff_status s = zoff_ckpt_open(load, 0, &src->rd);
    char hint[1024] = "";
    if (s != ZOFF_OK && r < 0) zoff_gpt2_st_folder_hint(load, hint, sizeof hint); /* a folder of other weights */
    if (hint[0])
        return zoff_error(ZOFF_ERR_INVALID, "%s is neither a checkpoint nor holds model.safetensors%s", load, hint);
    ZOFF_TRY(s); /* before --tokenizer: a path that holds no model is said to be so */
    zoff_train_meta meta;
    if (tokenizer)
        return zoff_error(ZOFF_ERR_INVALID, "--tokenizer is for safetensors weights; a checkpoint records its own");
    ZOFF_TRY(zoff_train_ckpt_read_meta(src->rd, &meta, NULL));
    src->shape = meta.shape;
    src->seq_len = meta.seq_len;
    snprintf(src->tokenizer, sizeof src->tokenizer, "%s", meta.tokenizer);
    return ZOFF_OK;
}

static zoff_status read_weights(cli_weights *src, const zoff_gpt2 *model, float *w) {
    int nt = 0;
    const zoff_tensor_info *tab = zoff_gpt2_tensors(model, &nt);
    if (src->rd) ZOFF_TRY(zoff_train_ckpt_read_weights(src->rd, model, w));
    else ZOFF_TRY(zoff_gpt2_st_load(src->st, zoff_gpt2_get_shape(model), tab, nt, w));
    /* NaN or Inf weights: eval printed "loss nan" and sample a string of token 0, both with exit 0 */
    int64_t bad = 0;
    int first = -1;
    zoff_gpt2_count_nonfinite(model, 0, zoff_gpt2_num_params(model), w, &bad, &first);
    return zoff_gpt2_nonfinite_error(model, bad, first);
}


zoff_status cli_weights_tokenizer(const cli_weights *src, zoff_tokenizer **tok) {
    ZOFF_TRY(zoff_tokenizer_open(src->tokenizer, tok));
    const int32_t n = zoff_tokenizer_vocab_size(*tok);
    if (n <= src->shape.vocab_size) return ZOFF_OK;
    zoff_tokenizer_free(*tok);
    *tok = NULL;
    return zoff_error(ZOFF_ERR_INVALID,
                      "the %s tokenizer has %d tokens, more than the model's vocabulary of %lld: its ids would "
                      "be out of the model's range; give the model's tokenizer (--tokenizer byte for 256 tokens, "
                      "gpt2 for 50257)",
                      src->tokenizer, (int)n, (long long)src->shape.vocab_size);
}

void cli_weights_close(cli_weights *src) {
    zoff_ckpt_close(src->rd);
    zoff_st_close(src->st);
    src->rd = NULL;
    src->st = NULL;
}

zoff_status cli_weights_model(cli_weights *src, const char *device, int64_t B, int64_t T, zoff_device **dev,
                              zoff_gpt2 **model) {
    *dev = NULL;
    *model = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU};
    if ((device && !strcmp(device, "cuda")) || (!device && zoff_backend_available(ZOFF_BACKEND_CUDA)))
        dopt.kind = ZOFF_BACKEND_CUDA;
    zoff_gpt2_options mo = {.shape = src->shape, .batch_size = B, .seq_len = T, .dtype = ZOFF_F32};
    zoff_status s = zoff_device_create(&dopt, dev);
    if (s == ZOFF_OK) s = zoff_gpt2_create(*dev, &mo, model);
    int64_t n = s == ZOFF_OK ? zoff_gpt2_num_params(*model) : 0;
    float *w = NULL;
    if (s == ZOFF_OK && !(w = zoff_aligned_alloc(64, (size_t)n * sizeof(float), "weights"))) s = ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) s = read_weights(src, *model, w);
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(*dev) : NULL;
    if (s == ZOFF_OK) s = zoff_memcpy_async(st, zoff_gpt2_params(*model), w, (size_t)n * sizeof(float), ZOFF_COPY_H2D);
    if (s == ZOFF_OK) s = zoff_stream_synchronize(st); /* the copy reads w: wait for it before w goes */
    zoff_aligned_free(w);
    if (s != ZOFF_OK) {
        zoff_gpt2_destroy(*model);
        zoff_device_destroy(*dev);
        *model = NULL;
        *dev = NULL;
    }
    return s;
}
