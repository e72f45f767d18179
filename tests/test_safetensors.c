/* safetensors reader/writer, GPT-2 import/export in Hugging Face's and zoff's layouts, and the
 * consolidation of partitioned rank files (include/zoff/safetensors.h).
 *
 * The reference is tests/fixtures/safetensors_gpt2_small{,_expected}.safetensors, written by
 * tests/fixtures/gen_safetensors_fixture.py: a small GPT-2 in Hugging Face's layout (the original
 * gpt2 file's conventions: bare names, Conv1D weights, attn.bias buffers) and the logits of an
 * independent PyTorch model of it. zoff imports it, its forward must give those logits, and its
 * export must give back the same bytes. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "zoff/ckpt.h"
#include "zoff/device.h"
#include "zoff/model.h"
#include "zoff/safetensors.h"

#define FIXTURE ZOFF_TEST_DIR "/fixtures/safetensors_gpt2_small.safetensors"
#define EXPECTED ZOFF_TEST_DIR "/fixtures/safetensors_gpt2_small_expected.safetensors"

#include "test_util.h"

/* The fixture's model. */
static const zoff_gpt2_shape FX_SHAPE = {.num_layers = 2, .hidden_size = 32, .num_heads = 4, .max_seq_len = 16,
                                         .vocab_size = 67, .padded_vocab_size = 0};

/* ------------------------------------------------------------------ helpers */

static int rm_cb(const char *p, const struct stat *sb, int t, struct FTW *f) {
    (void)sb;
    (void)f;
    return (t == FTW_DP || t == FTW_D) ? rmdir(p) : unlink(p);
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int setup(void **state) {
    char *root = malloc(64);
    snprintf(root, 64, "/tmp/zoff_st_test_XXXXXX");
    if (!mkdtemp(root)) return -1;
    *state = root;
    return 0;
}
static int teardown(void **state) {
    unsetenv("ZOFF_CKPT_FAULT");
    unsetenv("ZOFF_CKPT_IO");
    rm_rf(*state);
    free(*state);
    return 0;
}

static char *pathf(const char *dir, const char *name) {
    static char buf[8][512];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

static uint8_t *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void write_all(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A file image: 8-byte length, header text, `data` zero bytes. hlen: UINT64_MAX = strlen(json). */
static uint8_t *make_image(const char *json, size_t data, uint64_t hlen, size_t *n) {
    size_t jl = strlen(json);
    *n = 8 + jl + data;
    uint8_t *b = calloc(1, *n + 1);
    assert_non_null(b);
    uint64_t h = hlen == UINT64_MAX ? jl : hlen;
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(h >> (8 * i));
    memcpy(b + 8, json, jl);
    return b;
}

static zoff_device *make_device(void) {
    zoff_device_options o = {.kind = ZOFF_BACKEND_CPU, .threads = 2};
    zoff_device *dev = NULL;
    assert_ok(zoff_device_create(&o, &dev));
    return dev;
}

/* Logits (B,T,Vp) of a model with the given fp32 parameters on tokens (B,T). */
static float *model_logits(zoff_device *dev, zoff_gpt2 *m, const float *params, const int32_t *tokens, int64_t B,
                           int64_t T) {
    zoff_stream *s = zoff_device_stream(dev);
    int64_t n = zoff_gpt2_num_params(m), Vp = zoff_gpt2_get_shape(m)->padded_vocab_size;
    void *dtok = NULL;
    assert_ok(zoff_memcpy_async(s, zoff_gpt2_params(m), params, (size_t)n * sizeof(float), ZOFF_COPY_H2D));
    assert_ok(zoff_device_alloc(dev, (size_t)(B * T) * 4, "tokens", &dtok));
    assert_ok(zoff_memcpy_async(s, dtok, tokens, (size_t)(B * T) * 4, ZOFF_COPY_H2D));
    assert_ok(zoff_gpt2_forward(m, dtok, NULL, B, T));
    float *out = malloc((size_t)(B * T * Vp) * sizeof(float));
    assert_non_null(out);
    assert_ok(zoff_memcpy_async(s, out, zoff_gpt2_logits(m), (size_t)(B * T * Vp) * sizeof(float), ZOFF_COPY_D2H));
    assert_ok(zoff_stream_synchronize(s));
    zoff_device_free(dev, dtok);
    return out;
}

static zoff_gpt2 *make_model(zoff_device *dev, const zoff_gpt2_shape *sh, int64_t B, int64_t T) {
    zoff_gpt2_options o = {.shape = *sh, .batch_size = B, .seq_len = T, .dtype = ZOFF_F32};
    zoff_gpt2 *m = NULL;
    assert_ok(zoff_gpt2_create(dev, &o, &m));
    return m;
}

/* fetch callback over a flat fp32 buffer */
static zoff_status fetch_flat(void *user, const zoff_tensor_info *t, float *dst) {
    memcpy(dst, (const float *)user + t->offset, (size_t)t->numel * sizeof(float));
    return ZOFF_OK;
}

static float *load_file_into(const char *path, zoff_gpt2 *m) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    int64_t n = zoff_gpt2_num_params(m);
    float *p = malloc((size_t)n * sizeof(float));
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) p[i] = NAN; /* every element must be written */
    zoff_st_file *f = NULL;
    assert_ok(zoff_st_open(path, &f));
    assert_ok(zoff_gpt2_st_load(f, zoff_gpt2_get_shape(m), t, nt, p));
    zoff_st_close(f);
    for (int64_t i = 0; i < n; i++)
        if (isnan(p[i])) fail_msg("element %" PRId64 " of the flat buffer was not loaded from %s", i, path);
    return p;
}

static void export_flat(const char *path, zoff_gpt2 *m, const float *p, zoff_gpt2_layout layout, zoff_st_dtype dt) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    zoff_gpt2_export_options o = {.layout = layout, .dtype = dt};
    assert_ok(zoff_gpt2_st_export(path, zoff_gpt2_get_shape(m), t, nt, fetch_flat, (void *)p, &o));
}

/* ------------------------------------------------------------------ reader: bad files */

typedef struct bad_case {
    const char *what;
    const char *json;
    size_t data;
    uint64_t hlen; /* UINT64_MAX: the JSON's length */
    const char *needle;
} bad_case;

static void test_reader_rejects_bad_files(void **state) {
    const char *dir = *state;
    const uint64_t J = UINT64_MAX;
    const bad_case cases[] = {
        {"header length past the limit", "{}", 0, (uint64_t)200000000, "exceeds the limit"},
        {"header length past the end", "{}", 0, 9, "runs past the end"},
        {"not an object", "[1,2]", 0, J, "does not start with '{'"},
        {"not JSON", "{\"a\": }", 0, J, "not valid JSON"},
        {"trailing garbage", "{} x", 0, J, "not valid JSON"},
        {"duplicate keys", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                           "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, J, "not valid JSON"},
        {"entry not an object", "{\"a\": 3}", 0, J, "'a' is not a JSON object"},
        {"unknown field", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}", 1, J,
         "unknown field 'x'"},
        {"missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, J, "lacks a string dtype"},
        {"unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, J,
         "unknown safetensors dtype 'F33'"},
        {"too many dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, J,
         "9 dimensions"},
        {"negative dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0, J,
         "not a non-negative integer"},
        {"fractional dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,1]}}", 1, J,
         "not a non-negative integer"},
        {"huge dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1, J,
         "not valid JSON"},
        {"byte size overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}",
         8, J, "overflows"},
        {"offsets not a pair", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1, J,
         "two non-negative integers"},
        {"negative offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1, J,
         "two non-negative integers"},
        {"end before begin", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 4, J, "end before"},
        {"size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4, J, "F32 [2] needs 8"},
        {"data past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, J,
         "the file is truncated"},
        {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                    "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, J, "overlap"},
        {"hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, J, "belong to no tensor"},
        {"trailing data", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, J,
         "after the last tensor"},
        {"metadata not an object", "{\"__metadata__\": [1]}", 0, J, "__metadata__ is not a JSON object"},
        {"metadata value not a string", "{\"__metadata__\": {\"format\": 1}}", 0, J, "value of 'format'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        size_t n;
        uint8_t *img = make_image(c->json, c->data, c->hlen, &n);
        zoff_st_file *f = (zoff_st_file *)1;
        zoff_status s = zoff_st_open_memory(img, n, "case.safetensors", &f);
        if (s != ZOFF_ERR_FORMAT || !strstr(zoff_last_error(), c->needle) ||
            !strstr(zoff_last_error(), "case.safetensors"))
            fail_msg("case '%s': %s: \"%s\" (want ZOFF_ERR_FORMAT with \"%s\" and the file name)", c->what,
                     zoff_status_name(s), zoff_last_error(), c->needle);
        if (getenv("ZOFF_TEST_VERBOSE")) printf("  [%s] %s\n", c->what, zoff_last_error());
        assert_null(f);
        /* the same through a file on disk */
        const char *p = pathf(dir, "case.safetensors");
        write_all(p, img, n);
        s = zoff_st_open(p, &f);
        if (s != ZOFF_ERR_FORMAT || !strstr(zoff_last_error(), c->needle))
            fail_msg("case '%s' on disk: %s: %s", c->what, zoff_status_name(s), zoff_last_error());
        free(img);
    }
    /* too short, NUL in the header, a missing file, a directory */
    zoff_st_file *f = NULL;
    assert_err(zoff_st_open_memory("\x02\0\0\0", 4, "short.safetensors", &f), ZOFF_ERR_FORMAT, "too short");
    size_t n;
    uint8_t *img = make_image("{\"a\":1}", 0, J, &n);
    img[10] = 0;
    assert_err(zoff_st_open_memory(img, n, "nul.safetensors", &f), ZOFF_ERR_FORMAT, "NUL byte");
    free(img);
    assert_err(zoff_st_open(pathf(dir, "nope.safetensors"), &f), ZOFF_ERR_INVALID, "nope.safetensors");
    assert_err(zoff_st_open(dir, &f), ZOFF_ERR_INVALID, "not a regular file");

    /* the fixture cut short anywhere is refused (never read past the end, never accepted) */
    uint8_t *fx = read_all(FIXTURE, &n);
    const size_t cuts[] = {0, 7, 8, 100, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        zoff_status s = zoff_st_open_memory(fx, cuts[i], "cut.safetensors", &f);
        if (s != ZOFF_ERR_FORMAT) fail_msg("fixture cut to %zu bytes: %s", cuts[i], zoff_status_name(s));
    }
    /* a flipped header length */
    fx[0] ^= 0x40;
    assert_err(zoff_st_open_memory(fx, n, "flip.safetensors", &f), ZOFF_ERR_FORMAT, "flip.safetensors");
    free(fx);
}

static void test_reader_edge_cases(void **state) {
    (void)state;
    size_t n;
    zoff_st_file *f = NULL;
    /* empty file with an empty header; padding spaces; a zero-size tensor and a scalar */
    uint8_t *img = make_image("{}      ", 0, UINT64_MAX, &n);
    assert_ok(zoff_st_open_memory(img, n, "empty", &f));
    assert_int_equal(zoff_st_num_tensors(f), 0);
    assert_null(zoff_st_find(f, "x"));
    zoff_st_close(f);
    free(img);
    img = make_image("{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},"
                     "\"s\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},"
                     "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]}}",
                     12, UINT64_MAX, &n);
    double d = 2.5;
    size_t hl = n - 12;
    memcpy(img + hl, &d, 8);
    uint16_t bf[2] = {zoff_f32_to_bf16(1.5f), zoff_f32_to_bf16(-3.0f)};
    memcpy(img + hl + 8, bf, 4);
    assert_ok(zoff_st_open_memory(img, n, "edge", &f));
    assert_int_equal(zoff_st_num_tensors(f), 3);
    assert_string_equal(zoff_st_metadata(f, "format"), "pt");
    assert_null(zoff_st_metadata(f, "nope"));
    const zoff_st_tensor *z = zoff_st_find(f, "z"), *s = zoff_st_find(f, "s"), *b = zoff_st_find(f, "b");
    assert_non_null(z);
    assert_non_null(s);
    assert_non_null(b);
    assert_int_equal(z->numel, 0);
    assert_int_equal(s->ndim, 0);
    assert_int_equal(s->numel, 1);
    float v[2];
    assert_ok(zoff_st_read_f32(f, s, v, 1));
    assert_true(v[0] == 2.5f);
    assert_ok(zoff_st_read_f32(f, b, v, 2));
    assert_true(v[0] == 1.5f && v[1] == -3.0f);
    assert_err(zoff_st_read_f32(f, b, v, 1), ZOFF_ERR_INVALID, "'b' has 2 elements");
    assert_err(zoff_st_read(f, b, v, 8), ZOFF_ERR_INVALID, "'b' is 4 bytes");
    zoff_st_close(f);
    free(img);
    /* an integer tensor is not read as floats */
    img = make_image("{\"i\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, UINT64_MAX, &n);
    assert_ok(zoff_st_open_memory(img, n, "ints", &f));
    assert_err(zoff_st_read_f32(f, zoff_st_find(f, "i"), v, 1), ZOFF_ERR_FORMAT, "expected a float dtype");
    zoff_st_close(f);
    free(img);
}

/* ------------------------------------------------------------------ writer */

/* The writer's two paths (O_DIRECT through 8 MiB ring buffers, and pwrite with ZOFF_CKPT_IO=buffered)
 * against the format written out by hand: 8-byte little-endian header length, the header, then the
 * bytes appended, nothing more. Sizes put the end of the data on and around buffer and 4 KiB
 * boundaries and past the ring's 8 buffers (it wraps); appends come in pieces of odd sizes. Then a
 * full disk injected in the ring's third buffer: the error names the file and the failed write's
 * offset, nothing is left behind. */
static uint8_t pattern_byte(size_t i) { return (uint8_t)((i * 2654435761u) >> 13); }

static void test_writer_paths(void **state) {
    const char *dir = *state;
    const size_t MiB = (size_t)1 << 20;
    const size_t sizes[] = {0, 1, 4095, 8 * MiB - 91, 8 * MiB, 8 * MiB + 4096, 3 * 8 * MiB + 5, 70 * MiB + 123};
    const size_t nmax = 70 * MiB + 123;
    uint8_t *data = malloc(nmax);
    for (size_t i = 0; i < nmax; i++) data[i] = pattern_byte(i);
    bool direct_seen = false;
    for (int mode = 0; mode < 2; mode++) {
        if (mode) setenv("ZOFF_CKPT_IO", "buffered", 1);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            const size_t n = sizes[k];
            char *p = pathf(dir, "paths.safetensors");
            zoff_st_writer *w = NULL;
            assert_ok(zoff_st_writer_open(p, &w));
            assert_ok(zoff_st_writer_declare(w, "x", ZOFF_ST_U8, 1, (int64_t[]){(int64_t)n}));
            const size_t pieces[] = {1, 5 * MiB + 3, 4096, 11 * MiB};
            size_t done = 0;
            for (int j = 0; done < n; j++) {
                size_t m = pieces[j % 4] < n - done ? pieces[j % 4] : n - done;
                assert_ok(zoff_st_writer_append(w, data + done, m));
                done += m;
            }
            const char *io = zoff_st_writer_io(w);
            if (mode == 1 && n > 0 && !strstr(io, "pwrite, buffered (ZOFF_CKPT_IO=buffered)"))
                fail_msg("ZOFF_CKPT_IO=buffered: %s", io);
            if (mode == 0 && strstr(io, "O_DIRECT")) direct_seen = true;
            assert_ok(zoff_st_writer_commit(w));
            size_t got;
            uint8_t *f = read_all(p, &got);
            uint64_t hl = 0;
            for (int b = 0; b < 8; b++) hl |= (uint64_t)f[b] << (8 * b);
            if (hl % 8 || got != 8 + hl + n)
                fail_msg("%s, %zu bytes: header %" PRIu64 " bytes, file %zu bytes", mode ? "buffered" : "default", n, hl,
                         got);
            char want[160];
            snprintf(want, sizeof want, "\"x\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[0,%zu]}", n, n);
            if (!memmem(f + 8, hl, want, strlen(want))) fail_msg("header of %zu bytes lacks %s", n, want);
            if (memcmp(f + 8 + hl, data, n)) fail_msg("%s, %zu bytes: the data differs", mode ? "buffered" : "default", n);
            free(f);
        }
    }
    unsetenv("ZOFF_CKPT_IO");
    if (!direct_seen) printf("# note: %s refuses O_DIRECT: only the pwrite path was checked here\n", dir);
    /* a full disk in the ring's third buffer */
    char *p = pathf(dir, "full.safetensors");
    setenv("ZOFF_CKPT_FAULT", "ENOSPC@20000000", 1);
    zoff_st_writer *w = NULL;
    assert_ok(zoff_st_writer_open(p, &w));
    assert_ok(zoff_st_writer_declare(w, "x", ZOFF_ST_U8, 1, (int64_t[]){(int64_t)nmax}));
    zoff_status s = zoff_st_writer_append(w, data, nmax);
    bool direct = strstr(zoff_st_writer_io(w), "O_DIRECT") != NULL;
    if (s == ZOFF_OK) s = zoff_st_writer_commit(w);
    else zoff_st_writer_abort(w);
    unsetenv("ZOFF_CKPT_FAULT");
    if (s != ZOFF_ERR_IO || !strstr(zoff_last_error(), "cannot write") || !strstr(zoff_last_error(), "No space left") ||
        !strstr(zoff_last_error(), direct ? "at offset 16777216" : "at offset 20000000"))
        fail_msg("full disk: %s: %s", zoff_status_name(s), zoff_last_error());
    struct stat st;
    assert_int_not_equal(stat(p, &st), 0);
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp-")) fail_msg("temp file %s left behind", de->d_name);
    closedir(d);
    free(data);
}

/* One shard: tensors named names[i] (F32, n[i] elements, values base + i*100 + element), format pt. */
static void write_shard(const char *path, const char *const *names, const int64_t *n, int count, float base) {
    zoff_st_writer *w = NULL;
    assert_ok(zoff_st_writer_open(path, &w));
    assert_ok(zoff_st_writer_metadata(w, "format", "pt"));
    for (int i = 0; i < count; i++) assert_ok(zoff_st_writer_declare(w, names[i], ZOFF_ST_F32, 1, &n[i]));
    for (int i = 0; i < count; i++)
        for (int64_t e = 0; e < n[i]; e++) {
            float v = base + (float)(i * 100) + (float)e;
            assert_ok(zoff_st_writer_append(w, &v, sizeof v));
        }
    assert_ok(zoff_st_writer_commit(w));
}

/* A sharded model (Hugging Face's model.safetensors.index.json and its shards) reads like one
 * file; an index that disagrees with its shards is refused, naming the tensor and both files. */
static void test_sharded_index(void **state) {
    const char *dir = *state;
    const char *an[] = {"x", "y"}, *bn[] = {"z"};
    const int64_t a_n[] = {6, 5}, b_n[] = {4};
    write_shard(pathf(dir, "m-1.safetensors"), an, a_n, 2, 0);
    write_shard(pathf(dir, "m-2.safetensors"), bn, b_n, 1, 1000);
    const char *idx = pathf(dir, "model.safetensors.index.json");
    const char *good = "{\"metadata\": {\"total_size\": 60}, \"weight_map\": {\"x\": \"m-1.safetensors\", "
                       "\"z\": \"m-2.safetensors\", \"y\": \"m-1.safetensors\"}}";
    write_all(idx, good, strlen(good));
    zoff_st_file *f = NULL;
    assert_ok(zoff_st_open(idx, &f));
    assert_int_equal(zoff_st_num_tensors(f), 3);
    assert_string_equal(zoff_st_metadata(f, "format"), "pt");
    float y[5], z[4], part[2];
    assert_ok(zoff_st_read_f32(f, zoff_st_find(f, "y"), y, 5));
    assert_ok(zoff_st_read(f, zoff_st_find(f, "z"), z, sizeof z));
    assert_ok(zoff_st_read_f32_range(f, zoff_st_find(f, "x"), 3, 2, part));
    for (int e = 0; e < 5; e++) assert_true(y[e] == (float)(100 + e));
    for (int e = 0; e < 4; e++) assert_true(z[e] == (float)(1000 + e));
    assert_true(part[0] == 3.0f && part[1] == 4.0f);
    assert_int_equal(zoff_st_find(f, "z")->shape[0], 4);
    zoff_st_close(f);

    struct {
        const char *json, *want;
    } bad[] = {
        {"{\"x\": \"m-1.safetensors\"}", "no \"weight_map\""},
        {"{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-1.safetensors\", \"z\": \"m-1.safetensors\"}}",
         "maps tensor 'z' to m-1.safetensors, which does not hold it"}, /* m-2 is in no map: not opened */
        {"{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-2.safetensors\", \"z\": \"m-2.safetensors\"}}",
         "shard m-1.safetensors holds tensor 'y', which the index maps to m-2.safetensors"},
        {"{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-1.safetensors\", \"z\": \"m-3.safetensors\"}}",
         "m-3.safetensors"},
        {"{\"weight_map\": {\"x\": \"../m-1.safetensors\"}}", "expected the name of a shard file"},
        {"{\"weight_map\": {\"x\": \"model.safetensors.index.json\"}}", "expected the name of a shard file"},
        {"{\"weight_map\": ", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_all(idx, bad[i].json, strlen(bad[i].json));
        zoff_status st = zoff_st_open(idx, &f);
        assert_int_not_equal(st, ZOFF_OK);
        assert_null(f);
        if (!strstr(zoff_last_error(), bad[i].want))
            fail_msg("case %zu: '%s' lacks '%s'", i, zoff_last_error(), bad[i].want);
    }
    /* a tensor mapped to a shard that does not hold it */
    const char *extra = "{\"weight_map\": {\"x\": \"m-1.safetensors\", \"y\": \"m-1.safetensors\", \"z\": "
                        "\"m-2.safetensors\", \"w\": \"m-2.safetensors\"}}";
    write_all(idx, extra, strlen(extra));
    assert_int_not_equal(zoff_st_open(idx, &f), ZOFF_OK);
    assert_non_null(strstr(zoff_last_error(), "maps tensor 'w' to m-2.safetensors, which does not hold it"));
}

static void test_writer_roundtrip_and_errors(void **state) {
    const char *dir = *state;
    const char *p = pathf(dir, "w.safetensors");
    zoff_st_writer *w = NULL;
    float a[6] = {1, 2, 3, 4, 5, 6};
    int32_t b[3] = {-1, 0, 7};
    uint16_t h[5] = {1, 2, 3, 4, 5};
    int64_t sa[2] = {2, 3}, sb[1] = {3}, sh[1] = {5};
    assert_ok(zoff_st_writer_open(p, &w));
    assert_ok(zoff_st_writer_metadata(w, "format", "pt"));
    assert_ok(zoff_st_writer_metadata(w, "note", "hello \xc3\xa9"));
    assert_err(zoff_st_writer_metadata(w, "format", "x"), ZOFF_ERR_INVALID, "given twice");
    assert_ok(zoff_st_writer_declare(w, "a", ZOFF_ST_F32, 2, sa));
    assert_ok(zoff_st_writer_declare(w, "h", ZOFF_ST_F16, 1, sh)); /* 10 bytes: later data is misaligned, fine */
    assert_ok(zoff_st_writer_declare(w, "b", ZOFF_ST_I32, 1, sb));
    assert_err(zoff_st_writer_declare(w, "a", ZOFF_ST_F32, 1, sb), ZOFF_ERR_INVALID, "declared twice");
    assert_err(zoff_st_writer_declare(w, "__metadata__", ZOFF_ST_F32, 1, sb), ZOFF_ERR_INVALID, "reserved");
    assert_err(zoff_st_writer_declare(w, "bad\xff", ZOFF_ST_F32, 1, sb), ZOFF_ERR_INVALID, "not UTF-8");
    assert_ok(zoff_st_writer_append(w, a, 10)); /* any split */
    assert_ok(zoff_st_writer_append(w, (char *)a + 10, 14));
    assert_ok(zoff_st_writer_append(w, h, sizeof h));
    assert_ok(zoff_st_writer_append(w, b, sizeof b));
    assert_ok(zoff_st_writer_commit(w));
    zoff_st_file *f = NULL;
    assert_ok(zoff_st_open(p, &f));
    assert_int_equal((zoff_st_file_bytes(f) - (int64_t)(sizeof a + sizeof h + sizeof b)) % 8, 0); /* padded */
    assert_string_equal(zoff_st_metadata(f, "note"), "hello \xc3\xa9");
    assert_int_equal(zoff_st_num_metadata(f), 2);
    float ra[6];
    int32_t rb[3];
    uint16_t rh[5];
    assert_ok(zoff_st_read(f, zoff_st_find(f, "a"), ra, sizeof ra));
    assert_ok(zoff_st_read(f, zoff_st_find(f, "b"), rb, sizeof rb));
    assert_ok(zoff_st_read(f, zoff_st_find(f, "h"), rh, sizeof rh));
    assert_memory_equal(ra, a, sizeof a);
    assert_memory_equal(rb, b, sizeof b);
    assert_memory_equal(rh, h, sizeof h);
    assert_int_equal(zoff_st_find(f, "a")->shape[1], 3);
    assert_int_equal(zoff_st_tensor_at(f, 0)->dtype, ZOFF_ST_F32); /* data order = declaration order */
    zoff_st_close(f);
    size_t n0;
    uint8_t *before = read_all(p, &n0);

    /* too much / too little data: refused, the existing file untouched, no temp file left */
    assert_ok(zoff_st_writer_open(p, &w));
    assert_ok(zoff_st_writer_declare(w, "a", ZOFF_ST_F32, 2, sa));
    assert_err(zoff_st_writer_append(w, a, sizeof a + 4), ZOFF_ERR_INVALID, "more bytes appended");
    assert_err(zoff_st_writer_append(w, a, 4), ZOFF_ERR_INVALID, "earlier error");
    zoff_st_writer_abort(w);
    assert_ok(zoff_st_writer_open(p, &w));
    assert_ok(zoff_st_writer_declare(w, "a", ZOFF_ST_F32, 2, sa));
    assert_ok(zoff_st_writer_append(w, a, 8));
    assert_err(zoff_st_writer_commit(w), ZOFF_ERR_INVALID, "8 of the 24 declared");
    /* a full disk (injected) at several offsets */
    const char *faults[] = {"ENOSPC@0", "ENOSPC@20", "EIO@90", "ENOSPC@100000"};
    for (size_t i = 0; i < 4; i++) {
        setenv("ZOFF_CKPT_FAULT", faults[i], 1);
        assert_ok(zoff_st_writer_open(p, &w));
        assert_ok(zoff_st_writer_declare(w, "big", ZOFF_ST_U8, 1, (int64_t[]){200000}));
        uint8_t *big = calloc(1, 200000);
        zoff_status s = zoff_st_writer_append(w, big, 200000);
        if (s == ZOFF_OK) s = zoff_st_writer_commit(w);
        else zoff_st_writer_abort(w);
        free(big);
        if (s != ZOFF_ERR_IO || !strstr(zoff_last_error(), "cannot write"))
            fail_msg("fault %s: %s: %s", faults[i], zoff_status_name(s), zoff_last_error());
    }
    setenv("ZOFF_CKPT_FAULT", "garbage", 1);
    assert_err(zoff_st_writer_open(p, &w), ZOFF_ERR_INVALID, "ZOFF_CKPT_FAULT");
    unsetenv("ZOFF_CKPT_FAULT");
    size_t n1;
    uint8_t *after = read_all(p, &n1);
    assert_int_equal(n0, n1);
    assert_memory_equal(before, after, n0);
    free(before);
    free(after);
    DIR *d = opendir(dir);
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".tmp-")) fail_msg("temp file %s left behind", de->d_name);
    closedir(d);
    /* outputs that cannot be written */
    assert_err(zoff_st_writer_open(dir, &w), ZOFF_ERR_INVALID, "is a directory");
    assert_ok(zoff_st_writer_open(pathf(dir, "no/such/dir/x.safetensors"), &w));
    assert_err(zoff_st_writer_commit(w), ZOFF_ERR_INVALID, "cannot create"); /* exit 2 */
}

/* ------------------------------------------------------------------ GPT-2 fixture */

/* Import the Hugging Face fixture, run zoff's forward: the independent model's logits. */
static void test_fixture_logits(void **state) {
    (void)state;
    zoff_st_file *ef = NULL;
    assert_ok(zoff_st_open(EXPECTED, &ef));
    const zoff_st_tensor *tt = zoff_st_find(ef, "tokens"), *lt = zoff_st_find(ef, "logits");
    assert_non_null(tt);
    assert_non_null(lt);
    int64_t B = tt->shape[0], T = tt->shape[1], V = lt->shape[2];
    assert_int_equal(V, FX_SHAPE.vocab_size);
    assert_int_equal(strtol(zoff_st_metadata(ef, "num_heads"), NULL, 10), FX_SHAPE.num_heads);
    int32_t *tok = malloc((size_t)(B * T) * 4);
    float *want = malloc((size_t)lt->bytes);
    assert_ok(zoff_st_read(ef, tt, tok, (size_t)tt->bytes));
    assert_ok(zoff_st_read_f32(ef, lt, want, lt->numel));
    zoff_st_close(ef);

    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, B, T);
    int64_t Vp = zoff_gpt2_get_shape(m)->padded_vocab_size;
    assert_int_equal(Vp, 128);
    float *p = load_file_into(FIXTURE, m);
    /* padding rows of wte are zero */
    for (int64_t i = V * FX_SHAPE.hidden_size; i < Vp * FX_SHAPE.hidden_size; i++) assert_true(p[i] == 0.0f);
    float *got = model_logits(dev, m, p, tok, B, T);
    double err = 0, scale = 0;
    for (int64_t r = 0; r < B * T; r++) {
        for (int64_t v = 0; v < V; v++) {
            double d = fabs((double)got[r * Vp + v] - (double)want[r * V + v]);
            if (!(d <= err)) err = d;
            if (fabs(want[r * V + v]) > scale) scale = fabs(want[r * V + v]);
        }
        for (int64_t v = V; v < Vp; v++) assert_true(got[r * Vp + v] == 0.0f); /* padded columns */
    }
    printf("  zoff logits vs the independent PyTorch GPT-2 (Hugging Face layout): max |diff| %.3g (max |logit| %.3g)\n",
           err, scale);
    assert_true(scale > 0.5);
    assert_true(err <= 2e-5 * scale);
    free(got);
    free(p);
    free(tok);
    free(want);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* export -> the fixture's bytes; export -> import is the identity (both layouts); 16-bit exports */
static void test_export_import_roundtrip(void **state) {
    const char *dir = *state;
    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, 1, 4);
    const int64_t n = zoff_gpt2_num_params(m), C = FX_SHAPE.hidden_size, V = FX_SHAPE.vocab_size;
    float *p = load_file_into(FIXTURE, m);
    /* the HF export holds exactly the fixture's parameters (bytes), and no buffers */
    const char *hf = pathf(dir, "hf.safetensors");
    export_flat(hf, m, p, ZOFF_GPT2_LAYOUT_HF, ZOFF_ST_F32);
    zoff_st_file *a = NULL, *b = NULL;
    assert_ok(zoff_st_open(FIXTURE, &a));
    assert_ok(zoff_st_open(hf, &b));
    assert_string_equal(zoff_st_metadata(b, "format"), "pt");
    assert_string_equal(zoff_st_metadata(b, "zoff.layout"), "hf");
    assert_int_equal(zoff_st_num_tensors(b), 4 + 12 * FX_SHAPE.num_layers);
    for (size_t i = 0; i < zoff_st_num_tensors(b); i++) {
        const zoff_st_tensor *tb = zoff_st_tensor_at(b, i), *ta = zoff_st_find(a, tb->name);
        if (!ta) fail_msg("exported tensor '%s' is not in the fixture", tb->name);
        assert_int_equal(ta->ndim, tb->ndim);
        for (int k = 0; k < ta->ndim; k++) assert_int_equal(ta->shape[k], tb->shape[k]);
        void *da = malloc((size_t)ta->bytes), *db = malloc((size_t)tb->bytes);
        assert_ok(zoff_st_read(a, ta, da, (size_t)ta->bytes));
        assert_ok(zoff_st_read(b, tb, db, (size_t)tb->bytes));
        if (memcmp(da, db, (size_t)ta->bytes)) fail_msg("exported '%s' differs from the fixture", tb->name);
        free(da);
        free(db);
    }
    zoff_st_close(a);
    zoff_st_close(b);

    /* padding rows hold training values in zoff: the zoff layout keeps them, the HF layout drops them */
    for (int64_t i = V * C; i < 128 * C; i++) p[i] = (float)i * 1e-3f;
    export_flat(hf, m, p, ZOFF_GPT2_LAYOUT_HF, ZOFF_ST_F32);
    const char *zl = pathf(dir, "zoff.safetensors");
    export_flat(zl, m, p, ZOFF_GPT2_LAYOUT_ZOFF, ZOFF_ST_F32);
    float *q = load_file_into(zl, m);
    assert_memory_equal(p, q, (size_t)n * sizeof(float));
    free(q);
    q = load_file_into(hf, m);
    for (int64_t i = 0; i < n; i++) assert_true(q[i] == (i >= V * C && i < 128 * C ? 0.0f : p[i]));
    free(q);

    /* 16-bit exports: each value rounded to nearest even, padding dropped */
    for (int k = 0; k < 2; k++) {
        zoff_st_dtype dt = k ? ZOFF_ST_F16 : ZOFF_ST_BF16;
        const char *hp = pathf(dir, "half.safetensors");
        export_flat(hp, m, p, ZOFF_GPT2_LAYOUT_HF, dt);
        zoff_st_file *f = NULL;
        assert_ok(zoff_st_open(hp, &f));
        assert_int_equal(zoff_st_find(f, "h.1.mlp.c_fc.weight")->dtype, dt);
        zoff_st_close(f);
        q = load_file_into(hp, m);
        for (int64_t i = 0; i < n; i++) {
            float want = i >= V * C && i < 128 * C ? 0.0f
                         : k ? zoff_f16_to_f32(zoff_f32_to_f16(p[i]))
                             : zoff_bf16_to_f32(zoff_f32_to_bf16(p[i]));
            if (q[i] != want) fail_msg("%s element %" PRId64 ": %g, want %g", zoff_st_dtype_name(dt), i, q[i], want);
        }
        free(q);
    }
    /* invalid export requests */
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    zoff_gpt2_export_options o = {.layout = ZOFF_GPT2_LAYOUT_ZOFF, .dtype = ZOFF_ST_BF16};
    assert_err(zoff_gpt2_st_export(hf, zoff_gpt2_get_shape(m), t, nt, fetch_flat, p, &o), ZOFF_ERR_INVALID,
               "F32 only");
    o.layout = ZOFF_GPT2_LAYOUT_HF;
    o.dtype = ZOFF_ST_I32;
    assert_err(zoff_gpt2_st_export(hf, zoff_gpt2_get_shape(m), t, nt, fetch_flat, p, &o), ZOFF_ERR_INVALID,
               "F32, BF16 or F16");
    o.dtype = ZOFF_ST_F32;
    assert_err(zoff_gpt2_st_export(hf, zoff_gpt2_get_shape(m), t, nt - 1, fetch_flat, p, &o), ZOFF_ERR_INVALID,
               "has 28 parameters");
    zoff_gpt2_shape wide = *zoff_gpt2_get_shape(m);
    wide.hidden_size = 64;
    assert_err(zoff_gpt2_st_export(hf, &wide, t, nt, fetch_flat, p, &o), ZOFF_ERR_INVALID, "'wte.weight' has shape");
    zoff_tensor_info *t2 = malloc((size_t)nt * sizeof *t2);
    memcpy(t2, t, (size_t)nt * sizeof *t2);
    snprintf(t2[3].name, sizeof t2[3].name, "h.0.ln_1.weight");
    assert_err(zoff_gpt2_st_export(hf, zoff_gpt2_get_shape(m), t2, nt, fetch_flat, p, &o), ZOFF_ERR_INVALID,
               "given twice");
    snprintf(t2[3].name, sizeof t2[3].name, "h.0.attn.q_proj.weight");
    assert_err(zoff_gpt2_st_export(hf, zoff_gpt2_get_shape(m), t2, nt, fetch_flat, p, &o), ZOFF_ERR_INVALID,
               "not a GPT-2 parameter");
    free(t2);
    free(p);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* Rewrite the fixture's tensors into a new file: rename (prefix), drop, add, change dtype/shape. */
typedef struct variant {
    const char *prefix;       /* prepended to every name */
    const char *drop;         /* name to leave out */
    const char *extra;        /* an extra F32 [4] tensor */
    bool lm_head, lm_head_other, to_f16, wrong_shape_wpe;
    const char *heads;        /* zoff.num_heads metadata */
} variant;

static void write_variant(const char *out, const variant *v) {
    zoff_st_file *f = NULL;
    assert_ok(zoff_st_open(FIXTURE, &f));
    zoff_st_writer *w = NULL;
    assert_ok(zoff_st_writer_open(out, &w));
    assert_ok(zoff_st_writer_metadata(w, "format", "pt"));
    if (v->heads) assert_ok(zoff_st_writer_metadata(w, "zoff.num_heads", v->heads));
    char name[256];
    const zoff_st_tensor *wte = zoff_st_find(f, "wte.weight");
    for (size_t i = 0; i < zoff_st_num_tensors(f); i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        if (v->drop && !strcmp(t->name, v->drop)) continue;
        snprintf(name, sizeof name, "%s%s", v->prefix ? v->prefix : "", t->name);
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof shape);
        if (v->wrong_shape_wpe && !strcmp(t->name, "wpe.weight")) shape[0] = 8;
        assert_ok(zoff_st_writer_declare(w, name, v->to_f16 ? ZOFF_ST_F16 : t->dtype, t->ndim, shape));
    }
    if (v->lm_head) assert_ok(zoff_st_writer_declare(w, "lm_head.weight", ZOFF_ST_F32, 2, wte->shape));
    if (v->extra) assert_ok(zoff_st_writer_declare(w, v->extra, ZOFF_ST_F32, 1, (int64_t[]){4}));
    for (size_t i = 0; i < zoff_st_num_tensors(f); i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        if (v->drop && !strcmp(t->name, v->drop)) continue;
        float *d = malloc((size_t)t->numel * 4);
        assert_ok(zoff_st_read_f32(f, t, d, t->numel));
        int64_t cnt = v->wrong_shape_wpe && !strcmp(t->name, "wpe.weight") ? t->numel / 2 : t->numel;
        if (v->to_f16) {
            uint16_t *h = malloc((size_t)cnt * 2);
            for (int64_t k = 0; k < cnt; k++) h[k] = zoff_f32_to_f16(d[k]);
            assert_ok(zoff_st_writer_append(w, h, (size_t)cnt * 2));
            free(h);
        } else {
            assert_ok(zoff_st_writer_append(w, d, (size_t)cnt * 4));
        }
        free(d);
    }
    if (v->lm_head) {
        float *d = malloc((size_t)wte->bytes);
        assert_ok(zoff_st_read(f, wte, d, (size_t)wte->bytes));
        if (v->lm_head_other) d[5] += 1.0f;
        assert_ok(zoff_st_writer_append(w, d, (size_t)wte->bytes));
        free(d);
    }
    if (v->extra) assert_ok(zoff_st_writer_append(w, (float[]){1, 2, 3, 4}, 16));
    assert_ok(zoff_st_writer_commit(w));
    zoff_st_close(f);
}

static void check_variant(const char *path, const zoff_gpt2_shape *sh, zoff_status want, const char *needle) {
    zoff_st_file *f = NULL;
    assert_ok(zoff_st_open(path, &f));
    zoff_status s = zoff_gpt2_st_check(f, sh);
    if (s != want || (needle && !strstr(zoff_last_error(), needle)))
        fail_msg("%s: %s \"%s\" (want %s with \"%s\")", path, zoff_status_name(s), zoff_last_error(),
                 zoff_status_name(want), needle ? needle : "");
    if (getenv("ZOFF_TEST_VERBOSE") && s != ZOFF_OK) printf("  [%s] %s\n", zoff_status_name(s), zoff_last_error());
    zoff_st_close(f);
}

/* The forms real GPT-2 files come in, and files that do not match the model. */
static void test_import_variants_and_mismatches(void **state) {
    const char *dir = *state;
    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, 1, 4);
    const int64_t n = zoff_gpt2_num_params(m);
    float *ref = load_file_into(FIXTURE, m);
    const char *p = pathf(dir, "v.safetensors");

    /* save_pretrained's form: "transformer." prefix plus a tied lm_head.weight */
    write_variant(p, &(variant){.prefix = "transformer.", .lm_head = true});
    float *q = load_file_into(p, m);
    assert_memory_equal(q, ref, (size_t)n * 4);
    free(q);
    /* an lm_head that is not wte (element 5 differs): refused as it is read, naming the element
     * (zoff ties the head to wte: it would run another model than the file's) */
    write_variant(p, &(variant){.lm_head = true, .lm_head_other = true});
    {
        int nt = 0;
        const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
        q = malloc((size_t)n * sizeof(float));
        assert_non_null(q);
        zoff_st_file *f = NULL;
        assert_ok(zoff_st_open(p, &f));
        assert_int_equal(zoff_gpt2_st_load(f, zoff_gpt2_get_shape(m), t, nt, q), ZOFF_ERR_INVALID);
        assert_non_null(strstr(zoff_last_error(), "differs from its token embedding (wte.weight; first at element 5)"));
        zoff_st_close(f);
        free(q);
    }
    /* F16 data is converted */
    write_variant(p, &(variant){.to_f16 = true});
    q = load_file_into(p, m);
    for (int64_t i = 0; i < n; i++) assert_true(q[i] == zoff_f16_to_f32(zoff_f32_to_f16(ref[i])));
    free(q);

    write_variant(p, &(variant){.drop = "h.1.mlp.c_fc.bias"});
    check_variant(p, &FX_SHAPE, ZOFF_ERR_FORMAT, "'h.1.mlp.c_fc.bias' is missing");
    write_variant(p, &(variant){.extra = "h.0.attn.q_proj.weight"});
    check_variant(p, &FX_SHAPE, ZOFF_ERR_FORMAT, "'h.0.attn.q_proj.weight' is not a GPT-2 parameter");
    write_variant(p, &(variant){.extra = "transformer.wte.weight"});
    check_variant(p, &FX_SHAPE, ZOFF_ERR_FORMAT, "are the same parameter");
    write_variant(p, &(variant){.wrong_shape_wpe = true});
    check_variant(p, &FX_SHAPE, ZOFF_ERR_FORMAT, "'wpe.weight' has shape [8, 32], but the model needs [16, 32]");
    write_variant(p, &(variant){.heads = "2"});
    check_variant(p, &FX_SHAPE, ZOFF_ERR_FORMAT, "use --num-attention-heads 2");
    write_variant(p, &(variant){.heads = "4"});
    check_variant(p, &FX_SHAPE, ZOFF_OK, NULL);

    /* the fixture against models of other shapes: the error names the tensor, both shapes and the flags */
    zoff_gpt2_shape sh = FX_SHAPE;
    sh.hidden_size = 64;
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "--hidden-size 32");
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "has shape [67, 32], but the model needs [67, 64]");
    sh = FX_SHAPE;
    sh.num_layers = 1;
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "belongs to layer 1, but the model has 1 layers");
    sh.num_layers = 3;
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "'h.2.ln_1.weight' is missing");
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "--num-layers 2");
    sh = FX_SHAPE;
    sh.vocab_size = 50257;
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "--vocab-size 67");
    sh = FX_SHAPE;
    sh.max_seq_len = 1024;
    check_variant(FIXTURE, &sh, ZOFF_ERR_FORMAT, "--max-position-embeddings 16");
    /* a zoff-layout file needs the model's padded vocabulary and fp32 */
    const char *zl = pathf(dir, "z.safetensors");
    export_flat(zl, m, ref, ZOFF_GPT2_LAYOUT_ZOFF, ZOFF_ST_F32);
    sh = FX_SHAPE;
    sh.padded_vocab_size = 256;
    check_variant(zl, &sh, ZOFF_ERR_FORMAT, "(zoff layout)");
    sh = FX_SHAPE;
    sh.vocab_size = 68; /* same padded rows, other vocabulary */
    check_variant(zl, &sh, ZOFF_ERR_FORMAT, "the file's vocabulary is 67");

    /* what a file holds */
    zoff_st_file *f = NULL;
    zoff_gpt2_shape got;
    assert_ok(zoff_st_open(zl, &f));
    assert_ok(zoff_gpt2_st_infer_shape(f, &got));
    assert_int_equal(zoff_gpt2_st_layout(f), ZOFF_GPT2_LAYOUT_ZOFF);
    assert_int_equal(got.num_layers, 2);
    assert_int_equal(got.num_heads, 4);
    assert_int_equal(got.vocab_size, 67);
    assert_int_equal(got.padded_vocab_size, 128);
    zoff_st_close(f);
    size_t len;
    uint8_t *img = make_image("{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, UINT64_MAX, &len);
    assert_ok(zoff_st_open_memory(img, len, "other.safetensors", &f));
    assert_err(zoff_gpt2_st_infer_shape(f, &got), ZOFF_ERR_FORMAT, "does not hold GPT-2 weights");
    assert_err(zoff_gpt2_st_check(f, &FX_SHAPE), ZOFF_ERR_FORMAT, "'x' is not a GPT-2 parameter");
    zoff_st_close(f);
    free(img);
    assert_true(zoff_gpt2_st_is_param("h.1.mlp.c_proj.bias", 2));
    assert_false(zoff_gpt2_st_is_param("h.2.mlp.c_proj.bias", 2));
    assert_false(zoff_gpt2_st_is_param("h.01.ln_1.weight", 2));
    assert_false(zoff_gpt2_st_is_param("optimizer.exp_avg", 2));
    free(ref);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* ------------------------------------------------------------------ partitioned checkpoints */

static const char *META_JSON =
    "{\"format\":\"zoff-train-state\",\"version\":1,\"step\":5,\"model\":{\"num_layers\":2,\"hidden_size\":32,"
    "\"num_heads\":4,\"max_seq_len\":16,\"vocab_size\":67,\"padded_vocab_size\":128},\"seq_len\":12,"
    "\"tokenizer\":\"byte\",\"seed_lo\":1,\"seed_hi\":0,\"loader\":{\"seed_lo\":1,\"seed_hi\":0,\"epoch\":0,"
    "\"window\":0,\"seq_len\":12,\"num_windows\":1,\"fingerprint\":\"0\"},\"engine\":{\"steps_taken\":5,"
    "\"steps_skipped\":0,\"loss_scale\":1.0,\"scaler_iter\":0,\"last_overflow_iter\":0,\"hysteresis_left\":2},"
    "\"consumed_tokens\":0.0}";

/* Write the model's weights (and a flat optimizer array) as a ZeRO-style partitioned checkpoint:
 * rank r owns flat elements [r n / R, (r+1) n / R) and stores the pieces of the tensors there. */
static void write_partitioned(const char *dir, zoff_gpt2 *m, const float *p, int R) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    const int64_t n = zoff_gpt2_num_params(m);
    zoff_ckpt_options o = {.tmp_tag = "test"};
    for (int r = 0; r < R; r++) {
        int64_t lo = n * r / R, hi = n * (r + 1) / R;
        zoff_ckpt_writer *w = NULL;
        assert_ok(zoff_ckpt_writer_open(dir, 5, r, &o, &w));
        if (r == 0) assert_ok(zoff_ckpt_add_blob(w, "meta", META_JSON, strlen(META_JSON)));
        for (int i = nt - 1; i >= 0; i--) { /* any order */
            int64_t a = t[i].offset > lo ? t[i].offset : lo, b = t[i].offset + t[i].numel < hi ? t[i].offset + t[i].numel : hi;
            if (a >= b) continue;
            char name[128], shp[64];
            if (t[i].ndim == 2) snprintf(shp, sizeof shp, "%" PRId64 "x%" PRId64, t[i].shape[0], t[i].shape[1]);
            else snprintf(shp, sizeof shp, "%" PRId64, t[i].shape[0]);
            snprintf(name, sizeof name, "%s@%" PRId64 "/%s", t[i].name, a - t[i].offset, shp);
            int64_t cnt = b - a;
            assert_ok(zoff_ckpt_add(w, name, ZOFF_F32, 1, &cnt, p + a, (size_t)cnt * 4));
        }
        char name[128];
        snprintf(name, sizeof name, "optimizer.exp_avg@%" PRId64 "/%" PRId64, lo, n);
        int64_t cnt = hi - lo;
        assert_ok(zoff_ckpt_add(w, name, ZOFF_F32, 1, &cnt, p + lo, (size_t)cnt * 4));
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_ok(zoff_ckpt_finalize(dir, 5, R, &o));
}

static void test_gather_partitioned_checkpoint(void **state) {
    const char *dir = *state;
    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, 1, 4);
    const int64_t n = zoff_gpt2_num_params(m);
    float *p = load_file_into(FIXTURE, m);
    for (int64_t i = 67 * 32; i < 128 * 32; i++) p[i] = 0.5f; /* padding rows survive --format fp32 */
    const char *ck = pathf(dir, "ck");
    write_partitioned(ck, m, p, 3);

    zoff_ckpt_gather *g = NULL;
    assert_ok(zoff_ckpt_gather_open(ck, &g));
    assert_int_equal(zoff_ckpt_gather_nranks(g), 3);
    assert_int_equal(zoff_ckpt_gather_step(g), 5);
    assert_int_equal(zoff_ckpt_gather_num_tensors(g), 28 + 1);
    assert_string_equal(zoff_ckpt_gather_tensor_at(g, 0)->name, "h.0.mlp.c_fc.weight"); /* rank 0's first */
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    float *q = malloc((size_t)n * 4);
    for (int i = 0; i < nt; i++) {
        const zoff_ckpt_gathered *e = zoff_ckpt_gather_find(g, t[i].name);
        assert_non_null(e);
        assert_int_equal(e->ndim, t[i].ndim);
        assert_int_equal(e->shape[0], t[i].shape[0]);
        assert_ok(zoff_ckpt_gather_read(g, t[i].name, q + t[i].offset, (size_t)t[i].numel * 4));
    }
    assert_memory_equal(q, p, (size_t)n * 4);
    const zoff_ckpt_gathered *ea = zoff_ckpt_gather_find(g, "optimizer.exp_avg");
    assert_non_null(ea);
    assert_int_equal(ea->pieces, 3);
    assert_ok(zoff_ckpt_gather_read(g, "optimizer.exp_avg", q, (size_t)n * 4));
    assert_memory_equal(q, p, (size_t)n * 4);
    assert_err(zoff_ckpt_gather_read(g, "nope", q, 4), ZOFF_ERR_FORMAT, "no tensor 'nope'");
    assert_err(zoff_ckpt_gather_read(g, "ln_f.bias", q, 4), ZOFF_ERR_INVALID, "128 bytes; 4 requested");
    zoff_ckpt_gather_close(g);

    /* the command: zoff export consolidates the 3 rank files */
    char cmd[2048];
    const char *fp = pathf(dir, "fp32.safetensors"), *hf = pathf(dir, "hf.safetensors");
    snprintf(cmd, sizeof cmd, "%s export --load %s --format fp32 --output %s --quiet && %s export --load %s/step_00000005 "
             "--output %s --quiet", ZOFF_BINARY, ck, fp, ZOFF_BINARY, ck, hf);
    assert_int_equal(system(cmd), 0);
    float *a = load_file_into(fp, m), *b = load_file_into(hf, m);
    assert_memory_equal(a, p, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) assert_true(b[i] == (i >= 67 * 32 && i < 128 * 32 ? 0.0f : p[i]));
    free(a);
    free(b);
    free(q);
    free(p);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* The layout `zoff train` writes with several ranks (ckpt.h, "Partitioned entries"): weights whole
 * in rank 0's file, "optimizer.*" entries holding each rank's runs, a "partition" blob per file.
 * runs[r]: rank r's [offset, count] pairs (-1 terminated); stage 0 replicas have none. */
static void write_dp(const char *dir, zoff_gpt2 *m, const float *p, int R, const int64_t runs[][8]) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    const int64_t n = zoff_gpt2_num_params(m);
    zoff_ckpt_options o = {.tmp_tag = "dp", .overwrite = true};
    float *buf = malloc((size_t)n * 8); /* room for runs that (wrongly) hold more than n */
    for (int r = 0; r < R; r++) {
        zoff_ckpt_writer *w = NULL;
        assert_ok(zoff_ckpt_writer_open(dir, 5, r, &o, &w));
        for (int i = 0; r == 0 && i < nt; i++)
            assert_ok(zoff_ckpt_add(w, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape, p + t[i].offset,
                                    (size_t)t[i].numel * 4));
        char js[512];
        int k = snprintf(js, sizeof js, "{\"format\":\"zoff-partition\",\"version\":1,\"rank\":%d,\"world_size\":%d,"
                         "\"num_params\":%" PRId64 ",\"runs\":[", r, R, n);
        int64_t len = 0;
        for (int j = 0; runs[r][2 * j] >= 0; j++) {
            k += snprintf(js + k, sizeof js - (size_t)k, "%s[%" PRId64 ",%" PRId64 "]", j ? "," : "", runs[r][2 * j],
                          runs[r][2 * j + 1]);
            for (int64_t e = 0; e < runs[r][2 * j + 1]; e++) { /* exp_avg := -p (0 past the end: bad runs) */
                int64_t at = runs[r][2 * j] + e;
                buf[len + e] = at < n ? -p[at] : 0.0f;
            }
            len += runs[r][2 * j + 1];
        }
        snprintf(js + k, sizeof js - (size_t)k, "]}");
        assert_ok(zoff_ckpt_add(w, "optimizer.exp_avg", ZOFF_F32, 1, &len, buf, (size_t)len * 4));
        assert_ok(zoff_ckpt_add_blob(w, "partition", js, strlen(js)));
        if (r == 0) assert_ok(zoff_ckpt_add_blob(w, "meta", META_JSON, strlen(META_JSON)));
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_ok(zoff_ckpt_finalize(dir, 5, R, &o));
    free(buf);
}

static void test_gather_dp_checkpoint(void **state) {
    const char *dir = pathf(*state, "dp");
    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, 1, 4);
    const int64_t n = zoff_gpt2_num_params(m), h = n / 2, q = n / 4;
    float *p = load_file_into(FIXTURE, m), *got = malloc((size_t)n * 4);
    const int64_t stage2[2][8] = {{0, h, -1}, {h, n - h, -1}};
    const int64_t round_robin[3][8] = {{q, q, 3 * q, n - 3 * q, -1}, {0, 1, 2 * q, q, -1}, {1, q - 1, -1}};
    const int64_t stage0[2][8] = {{0, n, -1}, {-1}};
    const int64_t (*cases[3])[8] = {stage2, round_robin, stage0};
    const int ranks[3] = {2, 3, 2};
    char cmd[2048];
    const char *out = pathf(*state, "dp.safetensors");
    for (int c = 0; c < 3; c++) {
        write_dp(dir, m, p, ranks[c], cases[c]);
        zoff_ckpt_gather *g = NULL;
        assert_ok(zoff_ckpt_gather_open(dir, &g));
        assert_ok(zoff_ckpt_gather_read(g, "optimizer.exp_avg", got, (size_t)n * 4));
        for (int64_t i = 0; i < n; i++)
            if (got[i] != -p[i]) fail_msg("case %d: exp_avg[%" PRId64 "] = %g, want %g", c, i, got[i], -p[i]);
        assert_ok(zoff_ckpt_gather_read(g, "h.1.mlp.c_fc.weight", got, 128 * 32 * 4));
        zoff_ckpt_gather_close(g);
        snprintf(cmd, sizeof cmd, "%s export --load %s --format fp32 --output %s --quiet", ZOFF_BINARY, dir, out);
        assert_int_equal(system(cmd), 0);
        float *a = load_file_into(out, m);
        assert_memory_equal(a, p, (size_t)n * 4);
        free(a);
    }
    /* runs that leave a gap, or disagree with the entry's length, are refused */
    const int64_t gap[2][8] = {{0, h - 1, -1}, {h, n - h, -1}};
    write_dp(dir, m, p, 2, gap);
    zoff_ckpt_gather *g = NULL;
    assert_err(zoff_ckpt_gather_open(dir, &g), ZOFF_ERR_FORMAT, "of 'optimizer.exp_avg' are in no rank's file");
    const int64_t outside[2][8] = {{0, h, -1}, {h, n, -1}};
    write_dp(dir, m, p, 2, outside);
    assert_err(zoff_ckpt_gather_open(dir, &g), ZOFF_ERR_FORMAT, "partition run 0 is not [offset, count] inside");
    free(got);
    free(p);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* One rank file per case, made by hand; every inconsistency is refused by name. */
typedef struct piece {
    int rank;
    const char *name;
    int64_t count;
    uint8_t fill;
} piece;

static zoff_status gather_case(const char *dir, const piece *pc, int npc, int R, zoff_ckpt_gather **g) {
    zoff_ckpt_options o = {.tmp_tag = "t", .overwrite = true};
    for (int r = 0; r < R; r++) {
        zoff_ckpt_writer *w = NULL;
        assert_ok(zoff_ckpt_writer_open(dir, 1, r, &o, &w));
        for (int i = 0; i < npc; i++) {
            if (pc[i].rank != r) continue;
            float buf[64];
            memset(buf, pc[i].fill, sizeof buf);
            assert_ok(zoff_ckpt_add(w, pc[i].name, ZOFF_F32, 1, &pc[i].count, buf, (size_t)pc[i].count * 4));
        }
        assert_ok(zoff_ckpt_commit(w));
    }
    assert_ok(zoff_ckpt_finalize(dir, 1, R, &o));
    *g = NULL;
    zoff_status s = zoff_ckpt_gather_open(dir, g);
    if (s == ZOFF_OK) zoff_ckpt_gather_close(*g);
    return s;
}

static void test_gather_refuses_inconsistent_pieces(void **state) {
    const char *dir = pathf(*state, "g");
    zoff_ckpt_gather *g = NULL;
    /* good: whole tensors replicated with equal data, pieces in any rank, empty pieces */
    piece ok[] = {{0, "w", 4, 1}, {1, "w", 4, 1}, {1, "x@4/2x4", 4, 2}, {0, "x@0/2x4", 4, 2}, {1, "x@8/2x4", 0, 2}};
    assert_ok(gather_case(dir, ok, 5, 2, &g));
    piece gap[] = {{0, "x@0/10", 4, 0}, {1, "x@6/10", 4, 0}};
    assert_err(gather_case(dir, gap, 2, 2, &g), ZOFF_ERR_FORMAT, "elements [4, 6) of 'x' are in no rank's file");
    piece tail[] = {{0, "x@0/10", 4, 0}, {1, "x@4/10", 4, 0}};
    assert_err(gather_case(dir, tail, 2, 2, &g), ZOFF_ERR_FORMAT, "elements [8, 10) of 'x'");
    piece overlap[] = {{0, "x@0/8", 5, 0}, {1, "x@4/8", 4, 0}};
    assert_err(gather_case(dir, overlap, 2, 2, &g), ZOFF_ERR_FORMAT, "overlap");
    piece past[] = {{0, "x@6/8", 4, 0}};
    assert_err(gather_case(dir, past, 1, 1, &g), ZOFF_ERR_FORMAT, "elements [6, 10) of a tensor of 8");
    piece shapes[] = {{0, "x@0/8", 4, 0}, {1, "x@4/2x4", 4, 0}};
    assert_err(gather_case(dir, shapes, 2, 2, &g), ZOFF_ERR_FORMAT, "pieces of 'x' disagree");
    piece mixed[] = {{0, "x", 8, 0}, {1, "x@0/8", 8, 0}};
    assert_err(gather_case(dir, mixed, 2, 2, &g), ZOFF_ERR_FORMAT, "whole in rank 0's file but partitioned");
    piece mixed2[] = {{0, "x@0/8", 8, 0}, {1, "x", 8, 0}};
    assert_err(gather_case(dir, mixed2, 2, 2, &g), ZOFF_ERR_FORMAT, "whole in rank 1's file but partitioned");
    piece replicas[] = {{0, "w", 4, 1}, {1, "w", 4, 2}};
    assert_err(gather_case(dir, replicas, 2, 2, &g), ZOFF_ERR_FORMAT, "ranks 0 and 1 both hold 'w' but disagree");
    const char *bad_names[] = {"x@", "x@1", "x@a/4", "x@0/", "x@0/4x", "x@0/4y4", "@0/4", "x@0/1x1x1x1x1x1x1x1x1"};
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        piece bn[] = {{0, bad_names[i], 1, 0}};
        assert_err(gather_case(dir, bn, 1, 1, &g), ZOFF_ERR_FORMAT, "not a valid piece name");
    }
    /* a missing rank file is the checkpoint layer's error */
    assert_ok(gather_case(dir, ok, 5, 2, &g));
    char f1[512];
    snprintf(f1, sizeof f1, "%s/step_00000001/rank_00001.zckpt", dir);
    assert_int_equal(unlink(f1), 0);
    assert_err(zoff_ckpt_gather_open(dir, &g), ZOFF_ERR_FORMAT, "rank_00001");
}

/* The streaming loader (what zoff train --init-from uses): ranges of any split and order, a
 * transposed matrix entered part-way, give the whole load's values (which test_fixture_logits
 * checks against PyTorch), for the Hugging Face layout in f32 and bf16 and the zoff layout. */
static void test_loader_ranges(void **state) {
    const char *dir = *state;
    zoff_device *dev = make_device();
    zoff_gpt2 *m = make_model(dev, &FX_SHAPE, 1, 4);
    const int64_t n = zoff_gpt2_num_params(m);
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(m, &nt);
    float *p = load_file_into(FIXTURE, m);
    const char *files[3] = {FIXTURE, pathf(dir, "bf16.safetensors"), pathf(dir, "zoff.safetensors")};
    export_flat(files[1], m, p, ZOFF_GPT2_LAYOUT_HF, ZOFF_ST_BF16);
    export_flat(files[2], m, p, ZOFF_GPT2_LAYOUT_ZOFF, ZOFF_ST_F32);
    float *got = malloc((size_t)n * sizeof(float));
    assert_non_null(got);
    for (int k = 0; k < 3; k++) {
        float *want = load_file_into(files[k], m);
        zoff_st_file *f = NULL;
        zoff_gpt2_st_loader *l = NULL;
        assert_ok(zoff_st_open(files[k], &f));
        assert_ok(zoff_gpt2_st_loader_open(f, zoff_gpt2_get_shape(m), t, nt, &l));
        for (int split = 0; split < 3; split++) {
            for (int64_t i = 0; i < n; i++) got[i] = NAN;
            uint64_t r = 0x9e3779b97f4a7c15ull * (uint64_t)(split + 1);
            /* split 0: ragged pieces back to front; 1: front to back; 2: one range */
            for (int64_t hi = n; split != 1 && hi > 0;) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int64_t len = split == 2 ? n : 1 + (int64_t)((r >> 33) % 1500);
                int64_t lo = hi - len > 0 ? hi - len : 0;
                assert_ok(zoff_gpt2_st_loader_read(l, lo, hi, got + lo));
                hi = lo;
            }
            for (int64_t lo = 0; split == 1 && lo < n;) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                int64_t hi = lo + 1 + (int64_t)((r >> 33) % 1500);
                if (hi > n) hi = n;
                assert_ok(zoff_gpt2_st_loader_read(l, lo, hi, got + lo));
                lo = hi;
            }
            if (memcmp(got, want, (size_t)n * sizeof(float)) != 0)
                fail_msg("%s: split %d differs from the whole load", files[k], split);
        }
        zoff_gpt2_st_loader_close(l);
        zoff_st_close(f);
        free(want);
    }
    assert_true(zoff_gpt2_st_loader_floats(&FX_SHAPE) == 4 * FX_SHAPE.hidden_size * FX_SHAPE.hidden_size);
    free(got);
    free(p);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_reader_rejects_bad_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reader_edge_cases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_roundtrip_and_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fixture_logits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_export_import_roundtrip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_import_variants_and_mismatches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_partitioned_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_dp_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gather_refuses_inconsistent_pieces, setup, teardown),
    };
    zoff_log_set_level(ZOFF_LOG_ERROR);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
