/* Tokenizers: byte-level (256 tokens) and GPT-2 byte-pair encoding.
 *
 * GPT-2 BPE follows OpenAI's encoder.py exactly, on token ids instead of strings:
 *   - the tables (encoder.json keys, vocab.bpe merges) are strings in GPT-2's
 *     byte-to-unicode alphabet; they are mapped back to raw bytes on load;
 *   - text is split by the pre-tokeniser (pretokenize.c); each piece starts as one
 *     token per byte, then repeatedly the adjacent pair with the lowest merge rank is
 *     merged everywhere in the piece, left to right, until no pair has a rank;
 *   - merges are looked up in an open-addressing hash map keyed by the id pair;
 *   - a cache maps recently seen pieces to their ids (most pieces repeat). */
#define _GNU_SOURCE
#include "zoff/data.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum { KIND_BYTE, KIND_GPT2 } tok_kind;

typedef struct cache_entry {
    uint64_t hash; /* 0 = empty */
    uint32_t key_off, key_len;
    uint32_t val_off, val_len;
} cache_entry;

/* The cache of pieces seen: open addressing on the piece's hash; the pieces' bytes and ids are
 * appended to keys and vals. */
typedef struct piece_cache {
    cache_entry *slots; /* CACHE_SLOTS */
    size_t count;
    char *keys;
    size_t keys_len, keys_cap;
    int32_t *vals;
    size_t vals_len, vals_cap;
} piece_cache;

static void cache_free(piece_cache *c) {
    free(c->slots);
    free(c->keys);
    free(c->vals);
}

/* One slot of the merge table: key = (a << 32 | b) + 1 (0 = empty) merges into id, at rank. */
typedef struct pair_slot {
    uint64_t key;
    int32_t rank, id;
} pair_slot;

#define CACHE_SLOTS (1u << 18)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_MAX_PIECE 128

struct zoff_tokenizer {
    tok_kind kind;
    bool shared;       /* a clone: tok_bytes, tok_off and pairs belong to the original */
    int32_t vocab_size;
    int32_t eot;
    char *tok_bytes;   /* all token byte strings, concatenated */
    uint32_t *tok_off; /* token i is tok_bytes[tok_off[i] .. tok_off[i+1]) */
    /* gpt2 */
    int32_t byte_id[256];
    pair_slot *pairs; /* the merges, pair_mask + 1 slots */
    size_t pair_mask;
    piece_cache cache;
    /* scratch for one piece */
    int32_t *work;
    size_t work_cap;
};

/* ------------------------------------------------------------------ helpers */

static uint64_t hash_bytes(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001B3ull;
    }
    h ^= h >> 29;
    return h ? h : 1;
}

static uint64_t hash_u64(uint64_t z) {
    z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
    z = (z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53ull;
    return z ^ (z >> 33);
}

zoff_status zoff_tokens_push(zoff_tokens *v, int32_t id) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 1024;
        int32_t *p = realloc(v->ids, nc * sizeof *p);
        if (!p) return zoff_error(ZOFF_ERR_NOMEM, "out of memory growing a token list to %zu ids", nc);
        v->ids = p;
        v->cap = nc;
    }
    v->ids[v->n++] = id;
    return ZOFF_OK;
}

static zoff_status tokens_reserve(zoff_tokens *v, size_t extra) {
    if (v->n + extra <= v->cap) return ZOFF_OK;
    size_t nc = v->cap ? v->cap : 1024;
    while (nc < v->n + extra) nc *= 2;
    int32_t *p = realloc(v->ids, nc * sizeof *p);
    if (!p) return zoff_error(ZOFF_ERR_NOMEM, "out of memory growing a token list to %zu ids", nc);
    v->ids = p;
    v->cap = nc;
    return ZOFF_OK;
}

void zoff_tokens_free(zoff_tokens *v) {
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

/* An installed zoff's data folder: PREFIX/share/zoff beside the PREFIX/bin holding the running
 * program, whatever PREFIX was (cmake --install --prefix X), as a canonical path into out (PATH_MAX
 * bytes). Empty when there is no such folder or /proc/self/exe cannot be read. */
static void installed_data_dir(char *out) {
    out[0] = '\0';
#ifdef ZOFF_DATA_FROM_BIN
    char exe[PATH_MAX], dir[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = '\0';
    snprintf(dir, sizeof dir, "%s/%s", exe, ZOFF_DATA_FROM_BIN);
    if (!realpath(dir, out)) out[0] = '\0';
#else
    (void)out;
#endif
}

zoff_status zoff_data_find(const char *rel, char *out, size_t outlen) {
    if (!rel || !out || outlen == 0) return zoff_error(ZOFF_ERR_INVALID, "zoff_data_find: no path or output buffer");
    const char *dirs[4];
    int nd = 0;
    const char *env = getenv("ZOFF_DATA_DIR");
    if (env && *env) dirs[nd++] = env;
    char installed[PATH_MAX];
    installed_data_dir(installed);
    if (installed[0]) dirs[nd++] = installed;
#ifdef ZOFF_SOURCE_DIR
    dirs[nd++] = ZOFF_SOURCE_DIR "/data";
#endif
    dirs[nd++] = "/usr/local/share/zoff";
    char tried[1024] = "";
    size_t tl = 0;
    for (int i = 0; i < nd; i++) {
        int w = snprintf(out, outlen, "%s/%s", dirs[i], rel);
        if (w < 0 || (size_t)w >= outlen) continue;
        struct stat st;
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) return ZOFF_OK;
        if (tl < sizeof tried) tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s", i ? ", " : "", out);
    }
    out[0] = '\0';
    return zoff_error(ZOFF_ERR_IO,
                      "data file %s not found (tried %s); set ZOFF_DATA_DIR to the folder holding %s, or "
                      "install zoff (make install)",
                      rel, tried, rel);
}

/* ------------------------------------------------------------------ common API */

static zoff_tokenizer *tokenizer_new(tok_kind kind) {
    zoff_tokenizer *t = calloc(1, sizeof *t);
    if (t) t->kind = kind;
    return t;
}

void zoff_tokenizer_free(zoff_tokenizer *t) {
    if (!t) return;
    if (!t->shared) {
        free(t->tok_bytes);
        free(t->tok_off);
        free(t->pairs);
    }
    cache_free(&t->cache);
    free(t->work);
    free(t);
}

zoff_status zoff_tokenizer_clone(const zoff_tokenizer *t, zoff_tokenizer **out) {
    *out = NULL;
    zoff_tokenizer *c = tokenizer_new(t->kind);
    if (!c) return zoff_error(ZOFF_ERR_NOMEM, "out of memory creating a %s tokenizer for a thread", zoff_tokenizer_name(t));
    *c = *t; /* the read-only tables, shared; the cache and scratch of its own */
    c->shared = true;
    c->cache = (piece_cache){0};
    c->work = NULL;
    c->work_cap = 0;
    if (t->kind == KIND_GPT2 && !(c->cache.slots = calloc(CACHE_SLOTS, sizeof *c->cache.slots))) {
        zoff_tokenizer_free(c);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory creating a %s tokenizer for a thread", zoff_tokenizer_name(t));
    }
    *out = c;
    return ZOFF_OK;
}

const char *zoff_tokenizer_name(const zoff_tokenizer *t) { return t->kind == KIND_GPT2 ? "gpt2" : "byte"; }
int32_t zoff_tokenizer_vocab_size(const zoff_tokenizer *t) { return t->vocab_size; }
int32_t zoff_tokenizer_eot(const zoff_tokenizer *t) { return t->eot; }

const char *zoff_tokenizer_token_bytes(const zoff_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->vocab_size) {
        *len = 0;
        return NULL;
    }
    *len = t->tok_off[id + 1] - t->tok_off[id];
    return t->tok_bytes + t->tok_off[id];
}

zoff_status zoff_tokenizer_decode(const zoff_tokenizer *t, const int32_t *ids, size_t n, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size)
            return zoff_error(ZOFF_ERR_INVALID, "cannot decode token %d at index %zu: not in the %s vocabulary [0, %d)",
                              (int)ids[i], i, zoff_tokenizer_name(t), (int)t->vocab_size);
        total += t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
    }
    char *s = malloc(total + 1);
    if (!s) return zoff_error(ZOFF_ERR_NOMEM, "out of memory decoding %zu tokens (%zu bytes)", n, total);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = t->tok_off[ids[i] + 1] - t->tok_off[ids[i]];
        memcpy(s + o, t->tok_bytes + t->tok_off[ids[i]], l);
        o += l;
    }
    s[o] = '\0';
    *text = s;
    *len = o;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ byte-level */

zoff_status zoff_tokenizer_open_byte(zoff_tokenizer **out) {
    *out = NULL;
    zoff_tokenizer *t = tokenizer_new(KIND_BYTE);
    if (!t || !(t->tok_bytes = malloc(256)) || !(t->tok_off = malloc(257 * sizeof(uint32_t)))) {
        zoff_tokenizer_free(t);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory creating the byte tokenizer");
    }
    for (int i = 0; i < 256; i++) {
        t->tok_bytes[i] = (char)i;
        t->tok_off[i] = (uint32_t)i;
    }
    t->tok_off[256] = 256;
    t->vocab_size = 256;
    t->eot = -1;
    *out = t;
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ GPT-2 tables */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68 to
 * U+0100.. in byte order. Fills cp -> byte (-1 where none); cps are < 0x144. */
static void build_byte_decoder(int16_t dec[0x144]) {
    for (int i = 0; i < 0x144; i++) dec[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + extra++;
        dec[cp] = (int16_t)b;
    }
}

/* Map a table string (UTF-8 in the byte-to-unicode alphabet) to raw bytes in out
 * (at least strlen(s) bytes). Returns the byte count or -1 if a character is not
 * in the alphabet. */
static long table_string_to_bytes(const int16_t dec[0x144], const char *s, size_t n, char *out) {
    const uint8_t *u = (const uint8_t *)s;
    long o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        if (u[i] < 0x80) { cp = u[i]; i += 1; }
        else if ((u[i] & 0xE0) == 0xC0 && i + 1 < n) { cp = ((uint32_t)(u[i] & 0x1F) << 6) | (u[i + 1] & 0x3F); i += 2; }
        else return -1;
        if (cp >= 0x144 || dec[cp] < 0) return -1;
        out[o++] = (char)dec[cp];
    }
    return o;
}

/* bytes -> id map used while loading the merges */
typedef struct str_map {
    uint64_t *hash;
    int32_t *id;
    size_t mask;
} str_map;

static int32_t str_map_get(const str_map *m, const zoff_tokenizer *t, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        if (m->hash[i] == 0) return -1;
        if (m->hash[i] == h) {
            int32_t id = m->id[i];
            size_t l = t->tok_off[id + 1] - t->tok_off[id];
            if (l == n && memcmp(t->tok_bytes + t->tok_off[id], s, n) == 0) return id;
        }
    }
}

static void pair_put(zoff_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t i = hash_u64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        if (t->pairs[i].key == 0 || t->pairs[i].key == key) {
            /* a later duplicate overwrites, as Python's dict(zip(merges, range(...))) does */
            t->pairs[i] = (pair_slot){.key = key, .rank = rank, .id = id};
            return;
        }
    }
}

static inline int32_t pair_get(const zoff_tokenizer *t, int32_t a, int32_t b, int32_t *id) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    for (size_t i = hash_u64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const pair_slot *e = &t->pairs[i];
        if (e->key == key) {
            *id = e->id;
            return e->rank;
        }
        if (e->key == 0) return INT32_MAX;
    }
}

static zoff_status load_encoder_json(zoff_tokenizer *t, const char *path, const int16_t dec[0x144]) {
    /* read whole, then parse: json_load_file reads with getc, several times slower */
    FILE *f = fopen(path, "rb");
    if (!f) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    zoff_status rs = ZOFF_OK;
    if (fseek(f, 0, SEEK_END) != 0 || (long)(len = (size_t)ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        rs = zoff_error(ZOFF_ERR_IO, "cannot size %s: %s", path, strerror(errno));
    else if (!(text = malloc(len ? len : 1)))
        rs = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading %s (%zu bytes)", path, len);
    else if (fread(text, 1, len, f) != len)
        rs = zoff_error(ZOFF_ERR_IO, "reading %s: %s", path, ferror(f) ? strerror(errno) : "file shrank");
    fclose(f);
    if (rs != ZOFF_OK) {
        free(text);
        return rs;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root)
        return zoff_error(ZOFF_ERR_FORMAT, "%s: not valid JSON at line %d column %d: %s; expected GPT-2's encoder.json",
                          path, jerr.line, jerr.column, jerr.text);
    zoff_status s = ZOFF_OK;
    if (!json_is_object(root)) {
        s = zoff_error(ZOFF_ERR_FORMAT, "%s: expected a JSON object of token -> id (GPT-2's encoder.json)", path);
        goto done;
    }
    size_t n = json_object_size(root);
    if (n < 256 || n > 65536) {
        s = zoff_error(ZOFF_ERR_FORMAT, "%s: %zu tokens; expected 256..65536 (GPT-2 has 50257)", path, n);
        goto done;
    }
    size_t total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) total += strlen(key);
    char **tmp_str = calloc(n, sizeof *tmp_str);
    t->tok_bytes = malloc(total + 1);
    t->tok_off = malloc((n + 1) * sizeof *t->tok_off);
    if (!tmp_str || !t->tok_bytes || !t->tok_off) {
        free(tmp_str);
        s = zoff_error(ZOFF_ERR_NOMEM, "out of memory loading %s", path);
        goto done;
    }
    /* first pass: validate ids, remember each id's key */
    json_object_foreach(root, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || (size_t)json_integer_value(val) >= n) {
            s = zoff_error(ZOFF_ERR_FORMAT, "%s: token \"%s\" has id %s; expected an integer in [0, %zu)", path, key,
                           json_is_integer(val) ? "out of range" : "that is not an integer", n);
            break;
        }
        size_t id = (size_t)json_integer_value(val);
        if (tmp_str[id]) {
            s = zoff_error(ZOFF_ERR_FORMAT, "%s: id %zu is used twice; the file is corrupt", path, id);
            break;
        }
        tmp_str[id] = (char *)key;
    }
    if (s == ZOFF_OK) {
        uint32_t off = 0;
        for (size_t id = 0; id < n; id++) {
            long l = table_string_to_bytes(dec, tmp_str[id], strlen(tmp_str[id]), t->tok_bytes + off);
            if (l < 0) {
                s = zoff_error(ZOFF_ERR_FORMAT,
                               "%s: token %zu \"%s\" has a character outside GPT-2's byte alphabet; the file is "
                               "not GPT-2's encoder.json",
                               path, id, tmp_str[id]);
                break;
            }
            t->tok_off[id] = off;
            off += (uint32_t)l;
        }
        t->tok_off[n] = off;
        t->vocab_size = (int32_t)n;
    }
    free(tmp_str);
done:
    json_decref(root);
    return s;
}

static zoff_status load_merges(zoff_tokenizer *t, const char *path, const int16_t dec[0x144], const str_map *m) {
    FILE *f = fopen(path, "rb");
    if (!f) return zoff_error(ZOFF_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    zoff_status s = ZOFF_OK;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int32_t rank = 0;
    char *buf = NULL;
    size_t bufcap = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (lineno == 1 && strncmp(line, "#version", 8) == 0) continue;
        if (len == 0) continue;
        char *sp = memchr(line, ' ', (size_t)len);
        if (!sp || sp == line || sp == line + len - 1 || memchr(sp + 1, ' ', (size_t)(line + len - sp - 1))) {
            s = zoff_error(ZOFF_ERR_FORMAT, "%s:%ld: expected two tokens separated by one space, got \"%s\"", path,
                           lineno, line);
            break;
        }
        if ((size_t)len + 1 > bufcap) {
            bufcap = (size_t)len * 2 + 16;
            char *nb = realloc(buf, bufcap);
            if (!nb) { s = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading %s", path); break; }
            buf = nb;
        }
        long la = table_string_to_bytes(dec, line, (size_t)(sp - line), buf);
        long lb = la < 0 ? -1 : table_string_to_bytes(dec, sp + 1, (size_t)(line + len - sp - 1), buf + la);
        int32_t a = -1, b = -1, ab = -1;
        if (la >= 0 && lb >= 0) {
            a = str_map_get(m, t, buf, (size_t)la);
            b = str_map_get(m, t, buf + la, (size_t)lb);
            ab = str_map_get(m, t, buf, (size_t)(la + lb));
        }
        if (a < 0 || b < 0 || ab < 0) {
            s = zoff_error(ZOFF_ERR_FORMAT,
                           "%s:%ld: merge \"%s\" uses or makes a token missing from encoder.json; the two files "
                           "do not belong together",
                           path, lineno, line);
            break;
        }
        if ((size_t)rank >= t->pair_mask / 2) {
            s = zoff_error(ZOFF_ERR_FORMAT, "%s: more than %zu merges for a vocabulary of %d tokens; not a GPT-2 table",
                           path, t->pair_mask / 2, (int)t->vocab_size);
            break;
        }
        pair_put(t, a, b, rank++, ab);
    }
    if (s == ZOFF_OK && ferror(f)) s = zoff_error(ZOFF_ERR_IO, "reading %s: %s", path, strerror(errno));
    if (s == ZOFF_OK && rank == 0) s = zoff_error(ZOFF_ERR_FORMAT, "%s holds no merges; expected GPT-2's vocab.bpe", path);
    free(line);
    free(buf);
    fclose(f);
    return s;
}

zoff_status zoff_tokenizer_open_gpt2(const char *encoder_json, const char *vocab_bpe, zoff_tokenizer **out) {
    *out = NULL;
    zoff_tokenizer *t = tokenizer_new(KIND_GPT2);
    if (!t) return zoff_error(ZOFF_ERR_NOMEM, "out of memory creating the GPT-2 tokenizer");
    int16_t dec[0x144];
    build_byte_decoder(dec);
    str_map m = {0};
    zoff_status s = load_encoder_json(t, encoder_json, dec);
    if (s == ZOFF_OK) {
        size_t slots = 1;
        while (slots < (size_t)t->vocab_size * 2) slots <<= 1;
        m.mask = slots - 1;
        m.hash = calloc(slots, sizeof *m.hash);
        m.id = calloc(slots, sizeof *m.id);
        /* merges: at most 2x vocab_size allowed (GPT-2: 50000), so the table stays <= half full */
        size_t pslots = 1;
        while (pslots < (size_t)t->vocab_size * 4) pslots <<= 1;
        t->pair_mask = pslots - 1;
        t->pairs = calloc(pslots, sizeof *t->pairs);
        t->cache.slots = calloc(CACHE_SLOTS, sizeof *t->cache.slots);
        if (!m.hash || !m.id || !t->pairs || !t->cache.slots)
            s = zoff_error(ZOFF_ERR_NOMEM, "out of memory building the GPT-2 tables");
    }
    if (s == ZOFF_OK) {
        for (int32_t id = 0; id < t->vocab_size; id++) {
            const char *p = t->tok_bytes + t->tok_off[id];
            size_t l = t->tok_off[id + 1] - t->tok_off[id];
            if (str_map_get(&m, t, p, l) >= 0) {
                s = zoff_error(ZOFF_ERR_FORMAT, "%s: token %d duplicates another token's bytes", encoder_json, (int)id);
                break;
            }
            uint64_t h = hash_bytes(p, l);
            size_t i = h & m.mask;
            while (m.hash[i]) i = (i + 1) & m.mask;
            m.hash[i] = h;
            m.id[i] = id;
        }
    }
    if (s == ZOFF_OK) {
        for (int b = 0; b < 256 && s == ZOFF_OK; b++) {
            char c = (char)b;
            t->byte_id[b] = str_map_get(&m, t, &c, 1);
            if (t->byte_id[b] < 0)
                s = zoff_error(ZOFF_ERR_FORMAT, "%s: no token for byte 0x%02x; expected GPT-2's encoder.json",
                               encoder_json, b);
        }
    }
    if (s == ZOFF_OK) s = load_merges(t, vocab_bpe, dec, &m);
    if (s == ZOFF_OK) {
        static const char eot[] = "<|endoftext|>";
        t->eot = str_map_get(&m, t, eot, sizeof eot - 1);
    }
    free(m.hash);
    free(m.id);
    if (s != ZOFF_OK) {
        zoff_tokenizer_free(t);
        return s;
    }
    *out = t;
    return ZOFF_OK;
}

zoff_status zoff_tokenizer_open(const char *name, zoff_tokenizer **out) {
    *out = NULL;
    if (name && strcmp(name, "byte") == 0) return zoff_tokenizer_open_byte(out);
    if (!name || strcmp(name, "gpt2") != 0)
        return zoff_error(ZOFF_ERR_INVALID, "unknown tokenizer '%s'; expected gpt2 or byte", name ? name : "(null)");
    char enc[4096], bpe[4096];
    ZOFF_TRY(zoff_data_find("gpt2/encoder.json", enc, sizeof enc));
    ZOFF_TRY(zoff_data_find("gpt2/vocab.bpe", bpe, sizeof bpe));
    zoff_status s = zoff_tokenizer_open_gpt2(enc, bpe, out);
    if (s != ZOFF_OK) return zoff_error_context(s, "loading the GPT-2 tokenizer");
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ GPT-2 encode */

static void cache_clear(piece_cache *c) {
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->count = 0;
    c->keys_len = 0;
    c->vals_len = 0;
}

static const cache_entry *cache_get(const piece_cache *c, const char *p, size_t n, uint64_t h) {
    for (size_t i = h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        const cache_entry *e = &c->slots[i];
        if (e->hash == 0) return NULL;
        if (e->hash == h && e->key_len == n && memcmp(c->keys + e->key_off, p, n) == 0) return e;
    }
}

static void cache_put(piece_cache *c, const char *p, size_t n, uint64_t h, const int32_t *ids, size_t m) {
    if (c->count >= CACHE_MAX_ENTRIES) cache_clear(c);
    if (c->keys_len + n > c->keys_cap) {
        size_t nc = c->keys_cap ? c->keys_cap * 2 : (1 << 20);
        while (nc < c->keys_len + n) nc *= 2;
        char *q = realloc(c->keys, nc);
        if (!q) return; /* the cache is an optimisation: skip on failure */
        c->keys = q;
        c->keys_cap = nc;
    }
    if (c->vals_len + m > c->vals_cap) {
        size_t nc = c->vals_cap ? c->vals_cap * 2 : (1 << 18);
        while (nc < c->vals_len + m) nc *= 2;
        int32_t *q = realloc(c->vals, nc * sizeof *q);
        if (!q) return;
        c->vals = q;
        c->vals_cap = nc;
    }
    size_t i = h & (CACHE_SLOTS - 1);
    while (c->slots[i].hash) i = (i + 1) & (CACHE_SLOTS - 1);
    cache_entry *e = &c->slots[i];
    e->hash = h;
    e->key_off = (uint32_t)c->keys_len;
    e->key_len = (uint32_t)n;
    e->val_off = (uint32_t)c->vals_len;
    e->val_len = (uint32_t)m;
    memcpy(c->keys + c->keys_len, p, n);
    c->keys_len += n;
    memcpy(c->vals + c->vals_len, ids, m * sizeof *ids);
    c->vals_len += m;
    c->count++;
}

/* BPE of one piece into t->work; returns the number of ids. */
static size_t bpe_piece(zoff_tokenizer *t, const uint8_t *p, size_t n) {
    int32_t *w = t->work;
    for (size_t i = 0; i < n; i++) w[i] = t->byte_id[p[i]];
    size_t len = n;
    while (len > 1) {
        int32_t best = INT32_MAX, best_a = 0, best_b = 0, merged = 0;
        for (size_t i = 0; i + 1 < len; i++) {
            int32_t id;
            int32_t r = pair_get(t, w[i], w[i + 1], &id);
            if (r < best) {
                best = r;
                best_a = w[i];
                best_b = w[i + 1];
                merged = id;
            }
        }
        if (best == INT32_MAX) break;
        size_t j = 0;
        for (size_t i = 0; i < len;) {
            if (i + 1 < len && w[i] == best_a && w[i + 1] == best_b) {
                w[j++] = merged;
                i += 2;
            } else {
                w[j++] = w[i++];
            }
        }
        len = j;
    }
    return len;
}

static zoff_status encode_gpt2(zoff_tokenizer *t, const char *text, size_t len, zoff_tokens *out) {
    size_t pos = 0;
    while (pos < len) {
        size_t n = zoff_gpt2_pretokenize_next(text + pos, len - pos);
        const char *p = text + pos;
        pos += n;
        if (n == 1) {
            ZOFF_TRY(zoff_tokens_push(out, t->byte_id[(uint8_t)p[0]]));
            continue;
        }
        uint64_t h = 0;
        if (n <= CACHE_MAX_PIECE) {
            h = hash_bytes(p, n);
            const cache_entry *e = cache_get(&t->cache, p, n, h);
            if (e) {
                ZOFF_TRY(tokens_reserve(out, e->val_len));
                memcpy(out->ids + out->n, t->cache.vals + e->val_off, e->val_len * sizeof(int32_t));
                out->n += e->val_len;
                continue;
            }
        }
        if (n > t->work_cap) {
            size_t nc = n < 256 ? 256 : n;
            int32_t *q = realloc(t->work, nc * sizeof *q);
            if (!q) return zoff_error(ZOFF_ERR_NOMEM, "out of memory encoding a %zu-byte piece of text", n);
            t->work = q;
            t->work_cap = nc;
        }
        size_t m = bpe_piece(t, (const uint8_t *)p, n);
        ZOFF_TRY(tokens_reserve(out, m));
        memcpy(out->ids + out->n, t->work, m * sizeof(int32_t));
        out->n += m;
        if (n <= CACHE_MAX_PIECE) cache_put(&t->cache, p, n, h, t->work, m);
    }
    return ZOFF_OK;
}

zoff_status zoff_tokenizer_encode(zoff_tokenizer *t, const char *text, size_t len, zoff_tokens *out) {
    if (len > 0 && !text) return zoff_error(ZOFF_ERR_INVALID, "zoff_tokenizer_encode: NULL text of %zu bytes", len);
    if (t->kind == KIND_BYTE) {
        ZOFF_TRY(tokens_reserve(out, len));
        for (size_t i = 0; i < len; i++) out->ids[out->n + i] = (uint8_t)text[i];
        out->n += len;
        return ZOFF_OK;
    }
    return encode_gpt2(t, text, len, out);
}
