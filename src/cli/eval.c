/* zoff eval: the loss and perplexity of a model (a training checkpoint or GPT-2 weights in
 * safetensors) on token shards: every window of T+1 tokens in file order (llm.c's windows, window k
 * of a shard starting at token k*T), each of its T next-token predictions counted once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "cli/common.h"

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: zoff eval --load DIR|FILE --data-path PATTERN [options]\n"
            "\n"
            "The mean next-token loss (cross-entropy, nats) and the perplexity exp(loss) of a model on\n"
            "token shards (zoff tokenize), over every window of T+1 tokens in file order: window k of\n"
            "a shard is its tokens k*T .. k*T+T, so one window's last token is the next one's first\n"
            "(a shard of N tokens gives (N-1)/T windows, rounded down; the tokens after the last are\n"
            "not read; a shard of fewer than T+1 tokens gives none, and a note names it). Each of a\n"
            "window's T predictions is counted once, with no context from the window before it (no\n"
            "sliding context).\n"
            "\n"
            "  --load DIR|FILE         checkpoint root (newest complete step), a step directory, or GPT-2\n"
            "                          weights in safetensors: a file, or a folder holding model.safetensors\n"
            "                          (an lm_head.weight other than wte is refused: zoff ties the head)\n"
            "  --data-path PATTERN     the shards: a .bin file, a directory (its .bin files), a quoted glob,\n"
            "                          or a comma-separated list of these, read in that order\n"
            "  --tokenizer gpt2|byte   safetensors weights without zoff's metadata: their tokenizer\n"
            "  --seq-length N          T, tokens of context per window (default: the checkpoint's sequence\n"
            "                          length; all of a safetensors model's positions)\n"
            "  --micro-batch-size N    windows per forward (default 1: every window; a larger batch leaves\n"
            "                          out the last windows that do not fill one, and says how many)\n"
            "  --max-batches N         stop after N batches (default 0: all)\n"
            "  --device cpu|cuda       backend (default: cuda when available, else cpu)\n"
            "  --json                  one JSON object on stdout instead of the summary line (perplexity\n"
            "                          null where exp(loss) is past a double's range)\n"
            "  -q, --quiet             no notes on stderr (a shard too short, the library's); the result\n"
            "                          on stdout, warnings and errors still print\n");
}

int zoff_cmd_eval(int argc, char **argv) {
    const char *load = NULL, *data = NULL, *device = NULL, *tokenizer = NULL;
    int64_t T = 0, B = 1, max_batches = 0;
    bool json = false, quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            eval_usage(stdout);
            return 0;
        }
        if (cli_quiet_flag(a, &quiet)) continue;
        if (!strcmp(a, "--json")) {
            json = true;
            continue;
        }
        const cli_string_flag strs[] = {{"--load", &load}, {"--data-path", &data}, {"--device", &device},
                                        {"--tokenizer", &tokenizer}};
        const cli_int_flag ints[] = {{"--seq-length", 1, ZOFF_GPT2_MAX_SEQ, &T},
                                     {"--micro-batch-size", 1, 1 << 20, &B},
                                     {"--max-batches", 0, INT64_MAX, &max_batches}};
        int took = cli_string_flags("eval", a, strs, sizeof strs / sizeof *strs, argc, argv, &i);
        if (!took) took = cli_int_flags("eval", a, ints, sizeof ints / sizeof *ints, argc, argv, &i);
        if (took < 0) return 2;
        if (took) continue;
        cli_unknown_option("eval", a, eval_usage);
        return 2;
    }
    if (!load || !data) {
        fprintf(stderr, "zoff eval: --load and --data-path are required (zoff eval --help)\n");
        return 2;
    }
    if (!cli_path_given("eval", "--load", load, "a checkpoint folder (zoff train --save) or safetensors weights") ||
        !cli_path_given("eval", "--data-path", data, "token shards (a .bin file, a folder or a glob)"))
        return 2;
    if (device && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0) {
        fprintf(stderr, "zoff eval: --device: '%s' is not cpu or cuda\n", device);
        return 2;
    }
    cli_weights src;
    zoff_status s = cli_weights_open(load, tokenizer, &src);
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff eval: --load %s: %s\n", load, zoff_last_error());
        cli_weights_close(&src);
        return cli_exit_code(s);
    }
    if (T == 0) T = src.seq_len;
    if (T > src.shape.max_seq_len) {
        fprintf(stderr, "zoff eval: --seq-length %lld exceeds the %lld positions of --load %s's model: give %lld or less\n",
                (long long)T, (long long)src.shape.max_seq_len, load, (long long)src.shape.max_seq_len);
        cli_weights_close(&src);
        return 2;
    }
    const char *where = "--data-path";
    zoff_dataset *ds = NULL;
    zoff_loader *ld = NULL;
    zoff_device *dev = NULL;
    zoff_gpt2 *model = NULL;
    int32_t *hx = NULL, *hy = NULL, *dx = NULL, *dy = NULL;
    const size_t bytes = (size_t)(B * T) * sizeof(int32_t);
    zoff_tokenizer *tok = NULL;
    where = "--load";
    s = cli_weights_tokenizer(&src, &tok);
    if (s == ZOFF_OK) {
        where = "--data-path";
        s = zoff_dataset_open(data, (int32_t)src.shape.vocab_size, &ds);
    }
    if (s == ZOFF_OK) s = zoff_dataset_check_tokenizer(ds, tok, " (the model's)");
    zoff_tokenizer_free(tok);
    zoff_loader_options lo = zoff_loader_defaults(B, T);
    lo.shuffle = false;
    lo.what = data; /* the error's prefix names --data-path: the data by its path */
    lo.one_batch = true;
    lo.too_small_hint = "; give more tokens or a smaller --seq-length / --micro-batch-size";
    if (s == ZOFF_OK) s = zoff_loader_create(ds, &lo, &ld);
    for (int i = s == ZOFF_OK && !quiet ? zoff_dataset_next_short_shard(ds, T, 0) : -1; i >= 0;
         i = zoff_dataset_next_short_shard(ds, T, i + 1)) { /* a shard that adds nothing */
        const zoff_shard *sh = zoff_dataset_shard(ds, i);
        fprintf(stderr, "zoff eval: note: %s has %lld tokens, fewer than a window's %lld (--seq-length + 1): "
                        "not evaluated\n",
                zoff_shard_path(sh), (long long)zoff_shard_num_tokens(sh), (long long)(T + 1));
    }
    if (s == ZOFF_OK) {
        where = "--load";
        s = cli_weights_model(&src, device, B, T, &dev, &model);
    }
    if (s == ZOFF_OK && (!(hx = malloc(bytes)) || !(hy = malloc(bytes)))) s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, bytes, "eval inputs", (void **)&dx);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, bytes, "eval targets", (void **)&dy);
    int64_t nb = s == ZOFF_OK ? zoff_loader_batches_per_epoch(ld) : 0, windows = s == ZOFF_OK ? zoff_loader_num_windows(ld) : 0;
    if (max_batches > 0 && max_batches < nb) nb = max_batches;
    double sum = 0, t0 = zoff_now();
    zoff_stream *st = s == ZOFF_OK ? zoff_device_stream(dev) : NULL;
    for (int64_t k = 0; s == ZOFF_OK && k < nb; k++) {
        where = "--data-path";
        s = zoff_loader_next(ld, hx, hy);
        if (s == ZOFF_OK) where = "evaluation";
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, dx, hx, bytes, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_memcpy_async(st, dy, hy, bytes, ZOFF_COPY_H2D);
        if (s == ZOFF_OK) s = zoff_gpt2_forward(model, dx, dy, B, T);
        float l = 0;
        if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(model, &l); /* waits for the forward: the inputs stay until then */
        sum += (double)l;
    }
    double secs = zoff_now() - t0;
    int rc = 0;
    if (s != ZOFF_OK) {
        fprintf(stderr, "zoff eval: %s: %s\n", where, zoff_last_error());
        rc = cli_exit_code(s);
    } else {
        const double loss = sum / (double)nb, tokens = (double)(nb * B * T);
        const int64_t left = windows - nb * B;
        char ppl[40] = "null"; /* exp(loss) past a double (a loss over 709): JSON has no inf */
        if (isfinite(exp(loss))) snprintf(ppl, sizeof ppl, "%.6f", exp(loss));
        char lj[40], lt[40]; /* a small loss keeps its digits: never 0.000001 / 0.0000 */
        zoff_format_fixed(loss, 6, lj, sizeof lj);
        zoff_format_fixed(loss, 4, lt, sizeof lt);
        if (json)
            printf("{\"loss\":%s,\"perplexity\":%s,\"tokens\":%.0f,\"windows\":%lld,\"windows_left_out\":%lld,"
                   "\"seq_len\":%lld,\"batch\":%lld,\"seconds\":%.3f}\n",
                   lj, ppl, tokens, (long long)(nb * B), (long long)left, (long long)T, (long long)B, secs);
        else {
            char nw[32];
            printf("zoff eval: loss %s, perplexity %.3f over %.0f tokens (%s of %lld + 1 tokens%s%s) in %.1f s\n",
                   lt, exp(loss), tokens, zoff_format_count(nb * B, "window", nw, sizeof nw), (long long)T,
                   left > 0 ? "; the last windows left out: " : "", left > 0 ? (max_batches ? "--max-batches" : "fewer than a batch") : "",
                   secs);
        }
    }
    if (dev) {
        zoff_device_free(dev, dx);
        zoff_device_free(dev, dy);
    }
    free(hx);
    free(hy);
    zoff_gpt2_destroy(model);
    zoff_device_destroy(dev);
    zoff_loader_free(ld);
    zoff_dataset_free(ds);
    cli_weights_close(&src);
    return rc;
}
