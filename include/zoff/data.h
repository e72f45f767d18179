/* zoff data: token shards (llm.c's .bin format), datasets of shards, the batch
 * loader, tokenizers (byte-level and GPT-2 BPE) and text -> shard conversion.
 *
 * Typical training use:
 *
 *     zoff_dataset *ds;  zoff_loader *train;
 *     ZOFF_TRY(zoff_dataset_open("out/data/corpus_train.bin", 50257, &ds));
 *     zoff_loader_options o = zoff_loader_defaults(B, T);
 *     o.seed = 1234;
 *     ZOFF_TRY(zoff_loader_create(ds, &o, &train));
 *     int32_t *x = ..., *y = ...;            // B*T each
 *     ZOFF_TRY(zoff_loader_next(train, x, y));
 *     zoff_loader_state pos = zoff_loader_get_state(train);   // into the checkpoint
 *     ...                                                      // on resume:
 *     ZOFF_TRY(zoff_loader_set_state(train, &pos));
 */
#ifndef ZOFF_DATA_H
#define ZOFF_DATA_H

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================== shards
 * A shard is llm.c's token file: a header of 256 little-endian int32
 *   [0] = 20240520 (magic), [1] = 1 (version: uint16 tokens), [2] = token count,
 *   [3] = vocabulary size of the tokenizer that wrote it (zoff extension; 0 = unknown,
 *         llm.c writes 0 and ignores it), the rest 0,
 * followed by `count` uint16 token ids. The file size must be exactly
 * 1024 + 2 * count bytes. Files larger than 2 GiB are fine (count < 2^31). */
#define ZOFF_SHARD_MAGIC 20240520
#define ZOFF_SHARD_VERSION 1
#define ZOFF_SHARD_HEADER_INTS 256
#define ZOFF_SHARD_HEADER_BYTES (ZOFF_SHARD_HEADER_INTS * 4)
#define ZOFF_SHARD_MAX_TOKENS ((int64_t)INT32_MAX)

/* Write `n` tokens to `path` atomically: a temporary file in the same directory,
 * fsync, rename over `path`, fsync of the directory. On failure nothing is left
 * behind and an existing `path` is untouched. `vocab_size` goes into header[3]
 * (0 = unknown); every token must be < vocab_size when it is > 0. */
zoff_status zoff_shard_write(const char *path, const uint16_t *tokens, int64_t n, int32_t vocab_size);
/* The header of a shard of n (<= ZOFF_SHARD_MAX_TOKENS) tokens, for writers that stream a shard. */
void zoff_shard_header(int32_t header[ZOFF_SHARD_HEADER_INTS], int64_t n, int32_t vocab_size);
/* write(2) all n bytes to fd (through zoff_io_write); an error names path, with a disk-space hint. */
zoff_status zoff_shard_write_bytes(int fd, const void *buf, size_t n, const char *path);

/* An open shard: the tokens are mapped read-only. */
typedef struct zoff_shard zoff_shard;

/* Open and validate a shard: magic, version, file size against the header's token
 * count, and (vocab_size > 0) the header's vocabulary against vocab_size. The token
 * ids are not scanned here (opening a large dataset costs no pass over it): they
 * are checked against vocab_size when read, by zoff_shard_check_tokens (the
 * loader checks every window it returns).
 * Errors (ZOFF_ERR_FORMAT / ZOFF_ERR_IO) name the file, what was expected and what was found. */
zoff_status zoff_shard_open(const char *path, int32_t vocab_size, zoff_shard **out);
/* Tokens [lo, hi) are below the vocab_size given to zoff_shard_open (always true
 * without one); else ZOFF_ERR_FORMAT naming the file, the first bad position and id. */
zoff_status zoff_shard_check_tokens(const zoff_shard *s, int64_t lo, int64_t hi);
void zoff_shard_close(zoff_shard *s);
int64_t zoff_shard_num_tokens(const zoff_shard *s);
const uint16_t *zoff_shard_tokens(const zoff_shard *s);
const char *zoff_shard_path(const zoff_shard *s);
int32_t zoff_shard_vocab_size(const zoff_shard *s); /* header[3]; 0 = unknown */

/* ======================================================================= dataset
 * An ordered list of open shards. `pattern` is one of
 *   - a file:        out/data/corpus_train.bin
 *   - a directory:   every *.bin directly inside it, sorted by name (a *.bin link to a file
 *                    that is gone is an error naming it, as it is in a glob or given alone)
 *   - a glob:        'out/data/train_*.bin' (sorted by name; quote it in the shell)
 *   - a comma-separated list of the above, taken in the order given.
 * No match is an error naming the pattern. */
typedef struct zoff_dataset zoff_dataset;
zoff_status zoff_dataset_open(const char *pattern, int32_t vocab_size, zoff_dataset **out);
void zoff_dataset_free(zoff_dataset *ds);
int zoff_dataset_num_shards(const zoff_dataset *ds);
const zoff_shard *zoff_dataset_shard(const zoff_dataset *ds, int i);
int64_t zoff_dataset_num_tokens(const zoff_dataset *ds); /* over all shards */
/* The one rule for a shard too short for one window of seq_len + 1 tokens (windows never cross
 * shards: the loader reads none of its tokens): the index of the first such shard of ds at or after
 * `from`, -1 when none. zoff train's and zoff eval's notes about shards left out. */
int zoff_dataset_next_short_shard(const zoff_dataset *ds, int64_t seq_len, int from);
/* Whether a shard of `a` (index *ia) is the same file (device and inode: also through a link or
 * another spelling of its path) as one of `b` (*ib): the first such pair. With a == b, two
 * shards of one dataset (*ia < *ib): a file listed twice, read twice an epoch. */
bool zoff_dataset_same_file(const zoff_dataset *a, const zoff_dataset *b, int *ia, int *ib);
typedef struct zoff_tokenizer zoff_tokenizer;
/* Every shard that records its tokenizer's vocabulary (zoff tokenize's) records tok's: else
 * ZOFF_ERR_FORMAT naming the file, both tokenizers and what to do (hint appended). */
zoff_status zoff_dataset_check_tokenizer(const zoff_dataset *ds, const zoff_tokenizer *tok, const char *hint);

/* ======================================================================== loader
 * The loader cuts the dataset into windows of T+1 contiguous tokens, window k of a
 * shard starting at token k*T (consecutive windows share one token, as in llm.c);
 * windows never cross a shard boundary and the tail of a shard shorter than T+1
 * is not used. A batch is B windows: inputs[b][t] = w_b[t], targets[b][t] = w_b[t+1].
 *
 * Order: with shuffle, each epoch visits the windows of the split in a pseudo-random
 * permutation that depends only on (seed, epoch) (a keyed Feistel permutation, no
 * table in memory); without shuffle, in file order. Each call takes the next
 * B * world_size windows of the order and rank r uses the r-th group of B. An epoch
 * ends when fewer than B * world_size windows are left (those are skipped; with
 * shuffle a different set each epoch); the next epoch starts and is reshuffled.
 *
 * Split: the dataset's tokens are seen as one sequence of N tokens (shards in
 * order). ZOFF_SPLIT_VAL is the last `val_tokens` tokens, ZOFF_SPLIT_TRAIN the
 * N - val_tokens before them, ZOFF_SPLIT_ALL everything (val_tokens ignored). With
 * `zoff tokenize` output, open name_train.bin and name_val.bin as two datasets with
 * ZOFF_SPLIT_ALL instead. */
typedef enum zoff_data_split { ZOFF_SPLIT_ALL = 0, ZOFF_SPLIT_TRAIN, ZOFF_SPLIT_VAL } zoff_data_split;

typedef struct zoff_loader_options {
    int64_t batch_size;   /* B >= 1 */
    int64_t seq_len;      /* T >= 1 */
    uint64_t seed;        /* shuffle key */
    bool shuffle;         /* default true */
    zoff_data_split split;
    int64_t val_tokens;   /* size of the VAL split at the end of the dataset (TRAIN / VAL only) */
    int rank;             /* data parallel: this process, 0 <= rank < world_size */
    int world_size;       /* number of processes reading the same dataset in lockstep (default 1) */
    /* The error when the data gives less than a batch: what the data is (NULL: its split's name)
     * and advice appended to it (NULL: none). */
    const char *what, *too_small_hint;
    /* A reader of batches, not of training steps (zoff eval, validation): that error speaks of one
     * batch of batch_size windows ("one <batch_name> of B", batch_name NULL: "batch"), and
     * too_small_hint is all its advice. */
    bool one_batch;
    const char *batch_name;
} zoff_loader_options;

/* B and T set; seed 0, shuffle on, split ALL, rank 0 of 1. */
zoff_loader_options zoff_loader_defaults(int64_t batch_size, int64_t seq_len);

typedef struct zoff_loader zoff_loader;
/* The loader borrows `ds`, which must outlive it. Fails (ZOFF_ERR_INVALID) when the
 * split holds fewer than B * world_size windows, naming the numbers. */
zoff_status zoff_loader_create(const zoff_dataset *ds, const zoff_loader_options *opt, zoff_loader **out);
void zoff_loader_free(zoff_loader *l);

/* Fill inputs and targets, each (B,T) int32 row-major, and advance. A token id not
 * below the dataset's vocab_size in a window it reads: ZOFF_ERR_FORMAT naming the
 * shard file and the position. A shard whose file became shorter since it was opened
 * (the mapped pages gone: SIGBUS, caught while the batch is copied): ZOFF_ERR_IO
 * naming it, the position not advanced. */
zoff_status zoff_loader_next(zoff_loader *l, int32_t *inputs, int32_t *targets);
/* Back to the first batch of epoch 0. */
void zoff_loader_reset(zoff_loader *l);
int64_t zoff_loader_num_windows(const zoff_loader *l);       /* windows of T+1 in the split */
int64_t zoff_loader_batches_per_epoch(const zoff_loader *l); /* per process */
int64_t zoff_loader_epoch(const zoff_loader *l);

/* The loader's position: plain integers, save each field as-is (all ranks of a
 * data-parallel job hold the same state). Restoring continues with exactly the
 * batches an uninterrupted run would have seen. B and world_size may differ on
 * resume (the position counts windows); seq_len and the split's windows must match. */
typedef struct zoff_loader_state {
    uint64_t seed;        /* the shuffle key in force (restored too) */
    int64_t epoch;        /* completed epochs */
    int64_t window;       /* windows of this epoch's order already consumed by all ranks */
    int64_t seq_len;      /* T, checked on restore */
    int64_t num_windows;  /* windows in the split, checked on restore */
    uint64_t fingerprint; /* hash of the split's shard sizes and T, checked on restore */
    uint64_t contents;    /* hash of tokens sampled from each shard of the split (0: not recorded, as in
                           * older checkpoints): another value on restore, the same files and sizes holding
                           * other tokens (re-written since), is a warning, not an error */
} zoff_loader_state;
zoff_loader_state zoff_loader_get_state(const zoff_loader *l);
zoff_status zoff_loader_set_state(zoff_loader *l, const zoff_loader_state *s);

/* ===================================================================== tokenizers */

/* `name` is "gpt2" (GPT-2 BPE, 50257 tokens, tables found with zoff_data_find) or
 * "byte" (256 tokens, token = byte). */
zoff_status zoff_tokenizer_open(const char *name, zoff_tokenizer **out);
zoff_status zoff_tokenizer_open_byte(zoff_tokenizer **out);
/* GPT-2 BPE from explicit table files (encoder.json: token -> id; vocab.bpe: merges). */
zoff_status zoff_tokenizer_open_gpt2(const char *encoder_json, const char *vocab_bpe, zoff_tokenizer **out);
void zoff_tokenizer_free(zoff_tokenizer *t);
/* A tokenizer for another thread: t's tables, shared (read-only), with a cache of its own.
 * Encodes exactly as t does. Free it (zoff_tokenizer_free) before t. */
zoff_status zoff_tokenizer_clone(const zoff_tokenizer *t, zoff_tokenizer **out);

const char *zoff_tokenizer_name(const zoff_tokenizer *t);  /* "gpt2" or "byte" */
int32_t zoff_tokenizer_vocab_size(const zoff_tokenizer *t); /* 50257 or 256 */
int32_t zoff_tokenizer_eot(const zoff_tokenizer *t);        /* <|endoftext|> = 50256; -1 for byte */

/* A growable list of token ids. Zero-initialise; free with zoff_tokens_free. */
typedef struct zoff_tokens {
    int32_t *ids;
    size_t n, cap;
} zoff_tokens;
zoff_status zoff_tokens_push(zoff_tokens *v, int32_t id);
void zoff_tokens_free(zoff_tokens *v);

/* Encode `len` bytes of text (UTF-8; invalid bytes are kept and round-trip exactly),
 * appending ids to `out`. Special tokens in the text (the string "<|endoftext|>")
 * are encoded as ordinary text. Not thread-safe on one tokenizer (it keeps a cache):
 * give each thread its own. */
zoff_status zoff_tokenizer_encode(zoff_tokenizer *t, const char *text, size_t len, zoff_tokens *out);
/* Decode ids into a malloc'd, NUL-terminated string of *len bytes (free()).
 * An id outside the vocabulary is an error naming it and its index. */
zoff_status zoff_tokenizer_decode(const zoff_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len);
/* The bytes of one token (not NUL-terminated; may be part of a UTF-8 character),
 * or NULL for an id outside the vocabulary. For streaming output. */
const char *zoff_tokenizer_token_bytes(const zoff_tokenizer *t, int32_t id, size_t *len);

/* GPT-2 pre-tokenisation, the regex
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * written out in C over UTF-8: returns the byte length of the piece that starts at
 * text[0] (0 only when n == 0). Invalid UTF-8 bytes count as single OTHER characters. */
size_t zoff_gpt2_pretokenize_next(const char *text, size_t n);

/* The UTF-8 character at text[0] (n >= 1): 1, its byte length and code point; 0 when text[0..n) is
 * the valid start of a character that n cuts short (*len = n); -1 when invalid, *len the bytes one
 * U+FFFD replaces (Unicode's substitution of maximal subparts, as Python's errors="replace"). */
int zoff_utf8_char(const char *text, size_t n, size_t *len, uint32_t *codepoint);

/* Character classes of that regex: SPACE = \s, LETTER = \p{L}, NUMBER = \p{N}.
 * The table (src/data/unicode_class.c) is generated from Python's `regex` module
 * (Unicode 15) by tests/fixtures/gen_bpe_fixture.py. */
typedef enum zoff_unicode_class {
    ZOFF_UCLASS_OTHER = 0,
    ZOFF_UCLASS_SPACE = 1,
    ZOFF_UCLASS_LETTER = 2,
    ZOFF_UCLASS_NUMBER = 3
} zoff_unicode_class;
zoff_unicode_class zoff_unicode_class_of(uint32_t codepoint);

/* Find a data file by relative path (e.g. "gpt2/encoder.json"), trying in order
 *   $ZOFF_DATA_DIR/<rel>, PREFIX/share/zoff/<rel> (an installed zoff: PREFIX/bin holds the running
 *   program), ZOFF_SOURCE_DIR/data/<rel>, /usr/local/share/zoff/<rel>
 * and writing the first that exists into out. The error lists every place tried. */
zoff_status zoff_data_find(const char *rel, char *out, size_t outlen);

/* ============================================================ text -> shards */
typedef struct zoff_tokenize_options {
    const char *output_prefix; /* "DIR/name": DIR/name_train.bin, DIR/name_val.bin */
    double val_fraction;       /* the last fraction of all tokens goes to val, 0 <= f < 1; 0: no val file */
    int64_t shard_tokens;      /* 0: one file per split; else at most this many tokens per file,
                                  named DIR/name_train_000000.bin, ... */
    bool quiet;                /* no progress lines on stderr */
    int threads;               /* encoding threads; 0: OpenMP's default (OMP_NUM_THREADS or all cores).
                                  The shards are the same for any count */
    size_t piece_bytes;        /* text per thread and step; 0: 512 KiB (smaller only to test the cuts) */
} zoff_tokenize_options;

typedef struct zoff_tokenize_result {
    int64_t bytes_in;          /* text bytes read */
    int64_t tokens_train, tokens_val;
    double seconds;            /* tokenisation + writing */
    char **paths;              /* files written, train first */
    int num_paths;
    int num_train_files;
} zoff_tokenize_result;

/* Tokenize `nfiles` text files into shards. Each file is one document (an empty file none);
 * with the gpt2 tokenizer every document is preceded by <|endoftext|> (as llm.c does), the
 * byte tokenizer has no such token. Inputs that hold no text at all are refused. All shards are written to temporary files first and
 * renamed only when every one is complete: on any error nothing new is left behind.
 * Reads a few MiB of text at a time and writes the tokens as they come (the val split is copied
 * out at the end), so memory does not grow with the corpus. Free `res` with zoff_tokenize_result_free. */
zoff_status zoff_tokenize_files(zoff_tokenizer *t, const char *const *files, int nfiles,
                                const zoff_tokenize_options *opt, zoff_tokenize_result *res);
void zoff_tokenize_result_free(zoff_tokenize_result *res);

/* ============================================================ default corpus */
#define ZOFF_FORTUNES_DIR "/usr/share/games/fortunes"

typedef struct zoff_corpus_info {
    int64_t bytes;   /* size of the text written */
    int64_t entries; /* fortunes in it */
    int files;       /* fortune files read */
} zoff_corpus_info;

/* Build the default training text from Debian's `fortunes` package (apt-get install
 * fortunes) into out_path, atomically: exactly what scripts/prepare_corpus.sh writes
 * (see the rules there: every regular file in src_dir except *.dat / *.u8 and
 * subfolders, in name order; '%' lines removed, each entry followed by one empty
 * line; overstriking resolved, control characters dropped, trailing blanks cut).
 * src_dir NULL means $ZOFF_FORTUNES_DIR, else ZOFF_FORTUNES_DIR. With
 * fortunes 1:1.99.1-7.3 (Debian 12): 2,560,755 bytes, 15,217 entries, 715,429
 * GPT-2 tokens. A missing package is ZOFF_ERR_IO saying "apt-get install fortunes". */
zoff_status zoff_corpus_build_fortunes(const char *src_dir, const char *out_path, zoff_corpus_info *info);

#ifdef __cplusplus
}
#endif
#endif
