/* zoff sample: generate text from a training checkpoint or from GPT-2 weights in safetensors
 * (zoff export's file or folder, a Hugging Face model folder). */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

static void sample_usage(FILE *f) {
    fprintf(f,
            "usage: zoff sample --load DIR|FILE [options]\n"
            "\n"
            "  --load DIR|FILE         checkpoint root (newest complete step), a step directory, or GPT-2\n"
            "                          weights in safetensors: a file, or a folder holding model.safetensors\n"
            "                          (zoff export, a Hugging Face model folder with its config.json); an\n"
            "                          lm_head.weight other than wte is refused (zoff ties the head)\n"
            "  --tokenizer gpt2|byte   safetensors weights without zoff's metadata: their tokenizer (default\n"
            "                          gpt2 for GPT-2's vocabulary; a checkpoint and zoff export's files say theirs)\n"
            "  --prompt TEXT           text to continue (default: empty). gpt2 tokenizer: the model sees\n"
            "                          <|endoftext|> before it, as a document starts in zoff tokenize's shards\n"
            "                          (Hugging Face's generate and nanoGPT see the prompt's tokens alone: their\n"
            "                          text differs); \"<|endoftext|>\" in TEXT is plain text. byte tokenizer:\n"
            "                          an empty prompt is a newline\n"
            "  --max-new-tokens N      tokens to generate at most (default 200; <|endoftext|> ends the text)\n"
            "  --temperature X         softmax temperature, 0 = greedy (default 0.8)\n"
            "  --top-k N               sample among the N most likely tokens, 0 = all (default 40)\n"
            "  --top-p P               then among the fewest most likely tokens that hold P of the\n"
            "                          probability (nucleus sampling), 1 = all (default 1)\n"
            "  --seed N                sampling seed (default 1)\n"
            "  --device cpu|cuda       backend (default: cuda when available, else cpu)\n"
            "  -q, --quiet             no notes on stderr (a prompt cut to the context, the library's); the\n"
            "                          text on stdout, warnings and errors still print\n"
            "\n"
            "The model's context is its sequence length (a checkpoint's, or all a safetensors model's positions):\n"
            "a longer prompt is cut to its last tokens, with a note, and the text slides on past it, the\n"
            "model seeing its last tokens (as nanoGPT's sample.py; Hugging Face's generate refuses the prompt).\n"
            "gpt2 tokenizer: the text is printed as UTF-8 as it comes, a character split over tokens when it\n"
            "is whole; bytes that are no UTF-8, and a character the end cuts short, as U+FFFD (as Hugging\n"
            "Face's decode shows them). byte tokenizer: the bytes as they are (a token is a byte).\n"
            "A model with more vocabulary rows than its tokenizer has tokens (nanoGPT pads GPT-2's 50257 to\n"
            "50304) picks among the tokenizer's tokens only.\n");
}

/* Text out as it is generated, valid UTF-8 however the tokens split characters: a character's first
 * bytes wait for the token that completes it; bytes that are no UTF-8 (and a character the end cuts
 * short) are written as U+FFFD, as Hugging Face's decode (errors="replace") shows them. */
typedef struct utf8_out {
    bool raw; /* the byte tokenizer: its tokens are the bytes, as they are */
    char held[4];
    size_t n;
} utf8_out;

static void utf8_put(utf8_out *o, const char *p, size_t n, bool end) {
    if (o->raw) {
        if (n) fwrite(p, 1, n, stdout);
        return;
    }
    while (o->n > 0 || n > 0) {
        const bool from_held = o->n > 0;
        while (from_held && o->n < sizeof o->held && n > 0) {
            o->held[o->n++] = *p++;
            n--;
        }
        const char *s = from_held ? o->held : p;
        size_t avail = from_held ? o->n : n, len;
        uint32_t cp;
        int r = zoff_utf8_char(s, avail, &len, &cp);
        if (r == 0 && !end) { /* the rest of a character in the next token's bytes */
            if (!from_held) memcpy(o->held, p, n);
            o->n = avail;
            return;
        }
        if (r == 1) fwrite(s, 1, len, stdout);
        else fputs("\xEF\xBF\xBD", stdout);
        if (from_held) {
            memmove(o->held, o->held + len, o->n - len);
            o->n -= len;
        } else {
            p += len;
            n -= len;
        }
    }
}

int zoff_cmd_sample(int argc, char **argv) {
    const char *load = NULL, *prompt = "", *device = NULL, *tokenizer = NULL;
    int64_t max_new = 200, top_k = 40, seed = 1;
    double temp = 0.8, top_p = 1;
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            sample_usage(stdout);
            return 0;
        }
        if (cli_quiet_flag(a, &quiet)) continue;
        const cli_string_flag strs[] = {{"--load", &load}, {"--prompt", &prompt}, {"--device", &device},
                                          {"--tokenizer", &tokenizer}};
        const cli_int_flag ints[] = {{"--max-new-tokens", 0, 1 << 24, &max_new},
                                     {"--top-k", 0, 1 << 24, &top_k},
                                     {"--seed", 0, INT64_MAX, &seed}};
        int took = cli_string_flags("sample", a, strs, sizeof strs / sizeof *strs, argc, argv, &i);
        if (!took) took = cli_int_flags("sample", a, ints, sizeof ints / sizeof *ints, argc, argv, &i);
        if (took < 0) return 2;
        if (took) continue;
        if (!strcmp(a, "--temperature")) {
            if (!(v = cli_value("sample", argc, argv, &i)) || !cli_parse_f64("sample", a, v, 0, 100, &temp))
                return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (!(v = cli_value("sample", argc, argv, &i)) || !cli_parse_f64("sample", a, v, -DBL_MAX, DBL_MAX, &top_p))
                return 2;
            if (!(top_p > 0 && top_p <= 1)) { /* one range for every value outside it (0 keeps no token) */
                fprintf(stderr, "zoff sample: --top-p: %s is out of range (0, 1]: the share of probability kept "
                                "(1 = all tokens, 0 would keep none)\n", v);
                return 2;
            }
        } else {
            cli_unknown_option("sample", a, sample_usage);
            return 2;
        }
    }
    if (!load) {
        fprintf(stderr, "zoff sample: --load DIR is required (a folder written by zoff train --save, or a "
                        "safetensors file or model folder)\n");
        return 2;
    }
    if (!cli_path_given("sample", "--load", load, "a checkpoint folder (zoff train --save) or safetensors weights")) return 2;
    int rc = 1;
    cli_weights src;
    zoff_tokenizer *tok = NULL;
    zoff_device *dev = NULL;
    zoff_gpt2 *model = NULL;
    float *logits = NULL, *scratch = NULL;
    int32_t *dtok = NULL;
    zoff_tokens ctx = {0};
    utf8_out out = {.raw = false};
    zoff_status s = cli_weights_open(load, tokenizer, &src);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff sample: --load %s: %s\n", load, zoff_last_error());
        cli_weights_close(&src);
        return cli_exit_code(s);
    }
    const int64_t T = src.seq_len;
    out.raw = strcmp(src.tokenizer, "gpt2") != 0;
    s = cli_weights_tokenizer(&src, &tok);
    if (s == ZOFF_OK) s = cli_weights_model(&src, device, 1, T, &dev, &model);
    /* picked among the tokenizer's tokens: a model's rows past them (nanoGPT's padded 50304) print nothing */
    int64_t V = tok ? zoff_tokenizer_vocab_size(tok) : 0;
    int64_t Vp = s == ZOFF_OK ? zoff_gpt2_get_shape(model)->padded_vocab_size : 0;
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)T * sizeof(int32_t), "context tokens", (void **)&dtok);
    if (s == ZOFF_OK && (!(logits = malloc((size_t)Vp * sizeof(float))) || !(scratch = malloc((size_t)Vp * sizeof(float)))))
        s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    int32_t eot = tok ? zoff_tokenizer_eot(tok) : -1;
    if (s == ZOFF_OK && eot >= 0) s = zoff_tokens_push(&ctx, eot);
    if (s == ZOFF_OK) s = zoff_tokenizer_encode(tok, prompt, strlen(prompt), &ctx);
    if (s == ZOFF_OK && ctx.n == 0) s = zoff_tokens_push(&ctx, '\n'); /* byte tokenizer, empty prompt */
    if (s != ZOFF_OK) goto done;
    if ((int64_t)ctx.n > T && !quiet) /* nanoGPT crops so; Hugging Face's generate refuses such a prompt */
        fprintf(stderr, "zoff sample: note: the prompt is %zu tokens%s, longer than the model's context (its sequence "
                        "length, %lld): it sees the last %lld\n",
                ctx.n, eot >= 0 ? " with the <|endoftext|> before it" : "", (long long)T, (long long)T);
    utf8_put(&out, prompt, strlen(prompt), false);
    uint64_t rng = zoff_sample_rng_init((uint64_t)seed);
    const zoff_sample_options so = {.temperature = temp, .top_k = top_k, .top_p = top_p};
    /* the positions 0..cached-1 of the context whose activations the model holds: then each new token
     * is one position's forward (zoff_gpt2_forward_next); once the context outgrows T it slides, every
     * position moves, and each token takes a full forward of the last T */
    int64_t cached = 0;
    for (int64_t k = 0; k < max_new; k++) {
        int64_t len = (int64_t)ctx.n < T ? (int64_t)ctx.n : T;
        const int32_t *win = ctx.ids + ctx.n - (size_t)len;
        bool next = cached > 0 && (int64_t)ctx.n <= T && cached == (int64_t)ctx.n - 1;
        if (next) {
            s = zoff_memcpy_async(st, dtok + cached, ctx.ids + cached, sizeof(int32_t), ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward_next(model, dtok + cached, cached);
        } else {
            s = zoff_memcpy_async(st, dtok, win, (size_t)len * sizeof(int32_t), ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward(model, dtok, NULL, 1, len);
        }
        cached = (int64_t)ctx.n <= T ? len : 0;
        if (s == ZOFF_OK)
            s = zoff_memcpy_async(st, logits, (const float *)zoff_gpt2_logits(model) + (size_t)(len - 1) * (size_t)Vp,
                                  (size_t)Vp * sizeof(float), ZOFF_COPY_D2H);
        if (s == ZOFF_OK) s = zoff_stream_synchronize(st);
        if (s != ZOFF_OK) goto done;
        int32_t id = zoff_sample_pick(logits, V, &so, &rng, scratch);
        if (id == eot) break;
        if ((s = zoff_tokens_push(&ctx, id)) != ZOFF_OK) goto done;
        size_t nb = 0;
        const char *bytes = zoff_tokenizer_token_bytes(tok, id, &nb);
        if (bytes) utf8_put(&out, bytes, nb, false);
        fflush(stdout);
    }
    utf8_put(&out, NULL, 0, true);
    fputc('\n', stdout);
    rc = 0;
done:
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff sample: %s\n", zoff_last_error());
        rc = cli_exit_code(s);
    }
    if (st) zoff_stream_synchronize(st); /* no copy queued on it may outlive the buffers freed below */
    zoff_tokens_free(&ctx);
    free(logits);
    free(scratch);
    if (dev) zoff_device_free(dev, dtok);
    zoff_gpt2_destroy(model);
    zoff_device_destroy(dev);
    zoff_tokenizer_free(tok);
    cli_weights_close(&src);
    return rc;
}
