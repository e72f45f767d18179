/* Fuzz the safetensors reader (src/ckpt/safetensors.c): zoff_st_open_memory on the input, and
 * for input that opens, zoff_st_open on the same bytes in a file (both must agree), every
 * tensor read (raw and as fp32), the metadata, the GPT-2 checks behind `zoff train
 * --init-from` (layout, inferred shape, zoff_gpt2_st_check), and a rewrite through the writer
 * that must read back identical.
 *
 * Checks: no crash / UB / leak / unbounded allocation; every error has a message naming the
 * file; accepted tensors lie inside the data buffer, do not overlap, and have the size their
 * dtype and shape give. */
#include <sys/stat.h>

#include "fuzz_util.h"
#include "zoff/safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define ST_MAX_READ ((int64_t)1 << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    zoff_log_set_level(ZOFF_LOG_ERROR);
    unsetenv("ZOFF_CKPT_FAULT");
    return 0;
}

static void st_same(const zoff_st_file *a, const zoff_st_file *b) {
    FUZZ_CHECK(zoff_st_num_tensors(a) == zoff_st_num_tensors(b), "tensor count differs");
    for (size_t i = 0; i < zoff_st_num_tensors(a); i++) {
        const zoff_st_tensor *x = zoff_st_tensor_at(a, i), *y = zoff_st_tensor_at(b, i);
        FUZZ_CHECK(strcmp(x->name, y->name) == 0 && x->dtype == y->dtype && x->ndim == y->ndim &&
                       x->bytes == y->bytes && x->numel == y->numel,
                   "tensor %zu differs", i);
        for (int k = 0; k < x->ndim; k++) FUZZ_CHECK(x->shape[k] == y->shape[k], "shape of %s differs", x->name);
    }
    FUZZ_CHECK(zoff_st_num_metadata(a) == zoff_st_num_metadata(b), "metadata count differs");
}

/* Write every tensor and metadata pair of f (data in bufs) to path; read back; compare. */
static void st_rewrite(zoff_st_file *f, uint8_t **bufs, const char *path) {
    zoff_st_writer *w = NULL;
    zoff_status s = zoff_st_writer_open(path, &w);
    FUZZ_CHECK(s == ZOFF_OK, "writer_open: %s", zoff_last_error());
    for (size_t i = 0; i < zoff_st_num_metadata(f) && s == ZOFF_OK; i++) {
        const char *k, *v;
        zoff_st_metadata_at(f, i, &k, &v);
        s = zoff_st_writer_metadata(w, k, v);
    }
    for (size_t i = 0; i < zoff_st_num_tensors(f) && s == ZOFF_OK; i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        s = zoff_st_writer_declare(w, t->name, t->dtype, t->ndim, t->shape);
    }
    for (size_t i = 0; i < zoff_st_num_tensors(f) && s == ZOFF_OK; i++)
        s = zoff_st_writer_append(w, bufs[i], (size_t)zoff_st_tensor_at(f, i)->bytes);
    if (s != ZOFF_OK) {
        /* the reader accepted it, so the writer must too: same name, dtype and shape rules */
        FUZZ_CHECK(0, "rewriting an accepted file: %s", zoff_last_error());
    }
    s = zoff_st_writer_commit(w);
    FUZZ_CHECK(s == ZOFF_OK, "commit: %s", zoff_last_error());
    zoff_st_file *g = NULL;
    s = zoff_st_open(path, &g);
    FUZZ_CHECK(s == ZOFF_OK, "reopen of the rewritten file: %s", zoff_last_error());
    st_same(f, g);
    for (size_t i = 0; i < zoff_st_num_tensors(g); i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(g, i);
        uint8_t *x = malloc((size_t)t->bytes + 1);
        FUZZ_CHECK(zoff_st_read(g, t, x, (size_t)t->bytes) == ZOFF_OK, "read back: %s", zoff_last_error());
        FUZZ_CHECK(memcmp(x, bufs[i], (size_t)t->bytes) == 0, "data of %s differs after rewrite", t->name);
        free(x);
    }
    for (size_t i = 0; i < zoff_st_num_metadata(f); i++) {
        const char *k, *v;
        zoff_st_metadata_at(f, i, &k, &v);
        const char *v2 = zoff_st_metadata(g, k);
        FUZZ_CHECK(v2 && strcmp(v, v2) == 0, "metadata %s differs after rewrite", k);
    }
    zoff_st_close(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > (1 << 20)) return 0;
    zoff_st_file *f = NULL;
    zoff_status s = zoff_st_open_memory(data, size, "fuzz.safetensors", &f);
    if (s != ZOFF_OK) {
        fuzz_check_error(s, "fuzz.safetensors");
        FUZZ_CHECK(f == NULL, "failed open returned a file");
        return 0;
    }
    size_t n = zoff_st_num_tensors(f);
    int64_t prev_end = -1, data_start = -1;
    bool small = true;
    for (size_t i = 0; i < n; i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        FUZZ_CHECK(t && t->name && zoff_st_find(f, t->name) == t, "find(%s)", t && t->name ? t->name : "?");
        FUZZ_CHECK(t->ndim >= 0 && t->ndim <= ZOFF_ST_MAX_DIMS && (int)t->dtype >= 0 && t->dtype < ZOFF_ST_DTYPE_COUNT,
                   "tensor %s: ndim %d dtype %d", t->name, t->ndim, (int)t->dtype);
        int64_t numel = 1;
        for (int k = 0; k < t->ndim; k++) {
            FUZZ_CHECK(t->shape[k] >= 0, "negative dimension");
            numel *= t->shape[k]; /* bytes <= file size, so this does not overflow for accepted files */
        }
        FUZZ_CHECK(numel == t->numel && t->bytes == numel * (int64_t)zoff_st_dtype_size(t->dtype),
                   "tensor %s: %lld bytes for %lld elements of %s", t->name, (long long)t->bytes, (long long)numel,
                   zoff_st_dtype_name(t->dtype));
        FUZZ_CHECK(t->offset >= 8 && t->offset + t->bytes <= (int64_t)size, "tensor %s outside the file", t->name);
        if (data_start < 0) data_start = t->offset;
        FUZZ_CHECK(prev_end < 0 || t->offset == prev_end, "tensor %s: hole or overlap", t->name);
        prev_end = t->offset + t->bytes;
        if (t->bytes > ST_MAX_READ) small = false;
    }
    if (n) FUZZ_CHECK(prev_end == (int64_t)size, "the last tensor does not end the file");
    FUZZ_CHECK(zoff_st_find(f, "__metadata__") == NULL, "__metadata__ is not a tensor");
    for (size_t i = 0; i < zoff_st_num_metadata(f); i++) {
        const char *k = NULL, *v = NULL;
        zoff_st_metadata_at(f, i, &k, &v);
        FUZZ_CHECK(k && v && zoff_st_metadata(f, k) == v, "metadata %zu", i);
    }

    uint8_t **bufs = calloc(n ? n : 1, sizeof *bufs);
    for (size_t i = 0; i < n && small; i++) {
        const zoff_st_tensor *t = zoff_st_tensor_at(f, i);
        bufs[i] = malloc((size_t)t->bytes + 1);
        s = zoff_st_read(f, t, bufs[i], (size_t)t->bytes);
        FUZZ_CHECK(s == ZOFF_OK && memcmp(bufs[i], data + t->offset, (size_t)t->bytes) == 0, "read %s: %s", t->name,
                   zoff_last_error());
        if (t->numel <= ST_MAX_READ / 4) {
            float *x = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *x);
            s = zoff_st_read_f32(f, t, x, t->numel);
            bool fl = t->dtype == ZOFF_ST_F32 || t->dtype == ZOFF_ST_F16 || t->dtype == ZOFF_ST_BF16 ||
                      t->dtype == ZOFF_ST_F64;
            if (fl) FUZZ_CHECK(s == ZOFF_OK, "read_f32 of %s %s: %s", zoff_st_dtype_name(t->dtype), t->name,
                               zoff_last_error());
            else fuzz_check_error(s, t->name);
            free(x);
        }
    }
    /* GPT-2 checks (zoff train --init-from, zoff export) */
    (void)zoff_gpt2_st_layout(f);
    zoff_gpt2_shape sh;
    memset(&sh, 0, sizeof sh);
    s = zoff_gpt2_st_infer_shape(f, &sh);
    if (s != ZOFF_OK) fuzz_check_error(s, NULL);
    else {
        if (sh.num_heads <= 0) sh.num_heads = 1;
        s = zoff_gpt2_st_check(f, &sh);
        if (s != ZOFF_OK) fuzz_check_error(s, NULL);
    }

    /* the same bytes from a file: the same result */
    char path[512], path2[512];
    snprintf(path, sizeof path, "%s/in.safetensors", fuzz_dir());
    snprintf(path2, sizeof path2, "%s/out.safetensors", fuzz_dir());
    fuzz_write_file(path, data, size);
    zoff_st_file *g = NULL;
    s = zoff_st_open(path, &g);
    FUZZ_CHECK(s == ZOFF_OK, "the file does not open although the same bytes in memory did: %s", zoff_last_error());
    st_same(f, g);
    if (small) st_rewrite(g, bufs, path2);
    zoff_st_close(g);
    for (size_t i = 0; i < n; i++) free(bufs[i]);
    free(bufs);
    zoff_st_close(f);
    return 0;
}
