/* safetensors files, GPT-2 import/export in Hugging Face's layout, and consolidated reading of a
 * checkpoint's rank files. Formats and rules: include/zoff/safetensors.h. */
#define _GNU_SOURCE /* O_CLOEXEC */
#include "zoff/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this host is big-endian"
#endif

#define ST_IO_CHUNK ((size_t)1 << 30)   /* largest single pread/pwrite */
#define ST_WBUF_BYTES ((size_t)8 << 20) /* writer staging buffer */
#define ST_CONV_ELEMS ((size_t)1 << 20) /* conversion chunk of read_f32 */
#define ST_NAME_SHOWN 160               /* longest name shown in a message */

/* ------------------------------------------------------------------ dtypes */

static const struct {
    const char *name;
    size_t size;
} g_dtypes[ZOFF_ST_DTYPE_COUNT] = {
    [ZOFF_ST_BOOL] = {"BOOL", 1},   [ZOFF_ST_U8] = {"U8", 1},       [ZOFF_ST_I8] = {"I8", 1},
    [ZOFF_ST_F8_E4M3] = {"F8_E4M3", 1}, [ZOFF_ST_F8_E5M2] = {"F8_E5M2", 1}, [ZOFF_ST_I16] = {"I16", 2},
    [ZOFF_ST_U16] = {"U16", 2},     [ZOFF_ST_F16] = {"F16", 2},     [ZOFF_ST_BF16] = {"BF16", 2},
    [ZOFF_ST_I32] = {"I32", 4},     [ZOFF_ST_U32] = {"U32", 4},     [ZOFF_ST_F32] = {"F32", 4},
    [ZOFF_ST_I64] = {"I64", 8},     [ZOFF_ST_U64] = {"U64", 8},     [ZOFF_ST_F64] = {"F64", 8},
};

const char *zoff_st_dtype_name(zoff_st_dtype dt) {
    return (unsigned)dt < ZOFF_ST_DTYPE_COUNT ? g_dtypes[dt].name : "?";
}

size_t zoff_st_dtype_size(zoff_st_dtype dt) { return (unsigned)dt < ZOFF_ST_DTYPE_COUNT ? g_dtypes[dt].size : 0; }

zoff_status zoff_st_dtype_parse(const char *text, zoff_st_dtype *out) {
    for (int i = 0; i < ZOFF_ST_DTYPE_COUNT; i++)
        if (text && !strcmp(text, g_dtypes[i].name)) {
            *out = (zoff_st_dtype)i;
            return ZOFF_OK;
        }
    return zoff_error(ZOFF_ERR_INVALID,
                      "unknown safetensors dtype '%.40s' (known: BOOL U8 I8 F8_E4M3 F8_E5M2 I16 U16 F16 BF16 I32 U32 "
                      "F32 I64 U64 F64)",
                      text ? text : "(null)");
}

static bool is_float_dtype(zoff_st_dtype dt) {
    return dt == ZOFF_ST_F32 || dt == ZOFF_ST_F16 || dt == ZOFF_ST_BF16 || dt == ZOFF_ST_F64;
}

/* "[768, 2304]" */
static const char *shape_str(int ndim, const int64_t *shape, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ------------------------------------------------------------------ reader */

struct zoff_st_file {
    char *path;
    int fd;              /* -1 when reading from memory */
    const uint8_t *mem;  /* in-memory file, or NULL */
    int64_t file_bytes;
    int64_t data_start;  /* 8 + header length */
    zoff_st_tensor *t;   /* in data order */
    size_t n;
    size_t *by_name;     /* indices of t sorted by name */
    char **meta_key, **meta_val;
    size_t nmeta;
};

void zoff_st_close(zoff_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    for (size_t i = 0; i < f->nmeta; i++) {
        free(f->meta_key[i]);
        free(f->meta_val[i]);
    }
    free(f->meta_key);
    free(f->meta_val);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

const char *zoff_st_path(const zoff_st_file *f) { return f->path; }
int64_t zoff_st_file_bytes(const zoff_st_file *f) { return f->file_bytes; }
size_t zoff_st_num_tensors(const zoff_st_file *f) { return f->n; }
const zoff_st_tensor *zoff_st_tensor_at(const zoff_st_file *f, size_t i) { return i < f->n ? &f->t[i] : NULL; }
size_t zoff_st_num_metadata(const zoff_st_file *f) { return f->nmeta; }

void zoff_st_metadata_at(const zoff_st_file *f, size_t i, const char **key, const char **value) {
    *key = i < f->nmeta ? f->meta_key[i] : NULL;
    *value = i < f->nmeta ? f->meta_val[i] : NULL;
}

const char *zoff_st_metadata(const zoff_st_file *f, const char *key) {
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
    return NULL;
}

const zoff_st_tensor *zoff_st_find(const zoff_st_file *f, const char *name) {
    size_t lo = 0, hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t[f->by_name[mid]].name, name);
        if (c == 0) return &f->t[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* Read n bytes at file offset off (from the file or the memory image). */
static zoff_status st_pread(zoff_st_file *f, void *dst, size_t n, int64_t off) {
    if (off < 0 || (uint64_t)off > (uint64_t)f->file_bytes || n > (uint64_t)(f->file_bytes - off))
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: read of %zu bytes at offset %" PRId64
                          " runs past its end (%" PRId64 " bytes)", f->path, n, off, f->file_bytes);
    if (f->mem) {
        if (n) memcpy(dst, f->mem + off, n);
        return ZOFF_OK;
    }
    uint8_t *p = dst;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < ST_IO_CHUNK ? n - done : ST_IO_CHUNK;
        ssize_t r = pread(f->fd, p + done, chunk, (off_t)(off + (int64_t)done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return zoff_error(ZOFF_ERR_IO, "cannot read safetensors file %s at offset %" PRId64 ": %s", f->path,
                              off + (int64_t)done, strerror(errno));
        }
        if (r == 0)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "safetensors file %s ended at offset %" PRId64 " while reading: it is truncated (or "
                              "changed while being read)",
                              f->path, off + (int64_t)done);
        done += (size_t)r;
    }
    return ZOFF_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const zoff_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->bytes != y->bytes) return x->bytes < y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_by_name(const void *a, const void *b, void *arg) {
    const zoff_st_tensor *t = arg;
    return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

/* A non-negative JSON integer. */
static bool json_u63(json_t *v, int64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t x = json_integer_value(v);
    if (x < 0) return false;
    *out = (int64_t)x;
    return true;
}

/* One tensor entry of the header: {"dtype", "shape", "data_offsets"}. begin/end relative. */
static zoff_status parse_entry(const char *path, const char *name, json_t *v, int64_t data_bytes, zoff_st_tensor *t) {
    const char *shown = name;
    if (!json_is_object(v))
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: entry '%.*s' is not a JSON object", path,
                          ST_NAME_SHOWN, shown);
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "safetensors file %s: tensor '%.*s' has an unknown field '%.40s' (expected dtype, "
                              "shape, data_offsets)",
                              path, ST_NAME_SHOWN, shown, key);
    }
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd) || !json_is_array(js) || !json_is_array(jo))
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: tensor '%.*s' lacks a string dtype, a shape array or a data_offsets "
                          "array",
                          path, ST_NAME_SHOWN, shown);
    if (zoff_st_dtype_parse(json_string_value(jd), &t->dtype) != ZOFF_OK)
        return zoff_error_context(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s'", path, ST_NAME_SHOWN, shown);
    size_t nd = json_array_size(js);
    if (nd > ZOFF_ST_MAX_DIMS)
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s' has %zu dimensions; zoff reads at most %d",
                          path, ST_NAME_SHOWN, shown, nd, ZOFF_ST_MAX_DIMS);
    t->ndim = (int)nd;
    int64_t es = (int64_t)zoff_st_dtype_size(t->dtype), numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        if (!json_u63(json_array_get(js, i), &t->shape[i]))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "safetensors file %s: tensor '%.*s': dimension %zu of its shape is not a non-negative "
                              "integer",
                              path, ST_NAME_SHOWN, shown, i);
        if (t->shape[i] > 0 && numel > INT64_MAX / es / t->shape[i]) overflow = true;
        else numel *= t->shape[i];
    }
    if (overflow)
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s': its shape is too large (the byte size "
                          "overflows 64 bits)", path, ST_NAME_SHOWN, shown);
    t->numel = numel;
    int64_t begin, end;
    if (json_array_size(jo) != 2 || !json_u63(json_array_get(jo, 0), &begin) ||
        !json_u63(json_array_get(jo, 1), &end))
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: tensor '%.*s': data_offsets must be two non-negative integers "
                          "[begin, end]",
                          path, ST_NAME_SHOWN, shown);
    if (end < begin)
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s': data_offsets [%" PRId64 ", %" PRId64
                          "] end before they begin", path, ST_NAME_SHOWN, shown, begin, end);
    char sb[200];
    if (end - begin != numel * es)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: tensor '%.*s': data_offsets [%" PRId64 ", %" PRId64 "] hold %" PRId64
                          " bytes, but %s %s needs %" PRId64,
                          path, ST_NAME_SHOWN, shown, begin, end, end - begin, zoff_st_dtype_name(t->dtype),
                          shape_str(t->ndim, t->shape, sb, sizeof sb), numel * es);
    if (end > data_bytes)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: tensor '%.*s': data_offsets [%" PRId64 ", %" PRId64
                          "] run past the end of the data (%" PRId64 " bytes): the file is truncated",
                          path, ST_NAME_SHOWN, shown, begin, end, data_bytes);
    t->offset = begin; /* relative for now */
    t->bytes = end - begin;
    return ZOFF_OK;
}

/* Parse and validate the header (hdr: hlen bytes) of a file of file_bytes bytes. */
static zoff_status parse_header(zoff_st_file *f, const char *hdr, size_t hlen) {
    const char *path = f->path;
    if (hlen == 0 || hdr[0] != '{')
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: the header does not start with '{' (not a safetensors file?)", path);
    if (memchr(hdr, 0, hlen))
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: the header contains a NUL byte", path);
    json_error_t jerr;
    json_t *root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: the header is not valid JSON (%s at byte %d)", path,
                          jerr.text, jerr.position);
    zoff_status s = ZOFF_OK;
    if (!json_is_object(root)) {
        json_decref(root);
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: the header is not a JSON object", path);
    }
    int64_t data_bytes = f->file_bytes - f->data_start;
    size_t cap = json_object_size(root);
    f->t = calloc(cap ? cap : 1, sizeof *f->t);
    f->by_name = calloc(cap ? cap : 1, sizeof *f->by_name);
    if (!f->t || !f->by_name) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading the header of %s", path);
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (s != ZOFF_OK) break;
        if (!strcmp(key, "__metadata__")) {
            if (!json_is_object(v)) {
                s = zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: __metadata__ is not a JSON object", path);
                break;
            }
            size_t m = json_object_size(v);
            f->meta_key = calloc(m ? m : 1, sizeof *f->meta_key);
            f->meta_val = calloc(m ? m : 1, sizeof *f->meta_val);
            if (!f->meta_key || !f->meta_val) {
                s = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading the metadata of %s", path);
                break;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                if (!json_is_string(mv)) {
                    s = zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: __metadata__ value of '%.*s' is not a string",
                                   path, ST_NAME_SHOWN, mk);
                    break;
                }
                f->meta_key[f->nmeta] = strdup(mk);
                f->meta_val[f->nmeta] = strdup(json_string_value(mv));
                f->nmeta++;
                if (!f->meta_key[f->nmeta - 1] || !f->meta_val[f->nmeta - 1]) {
                    s = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading the metadata of %s", path);
                    break;
                }
            }
            continue;
        }
        zoff_st_tensor *t = &f->t[f->n];
        memset(t, 0, sizeof *t);
        s = parse_entry(path, key, v, data_bytes, t);
        if (s != ZOFF_OK) break;
        t->name = strdup(key);
        if (!t->name) {
            s = zoff_error(ZOFF_ERR_NOMEM, "out of memory reading the header of %s", path);
            break;
        }
        f->n++;
    }
    json_decref(root);
    if (s != ZOFF_OK) return s;
    /* data order: no overlap, no hole, ends exactly at the end of the file */
    qsort(f->t, f->n, sizeof *f->t, cmp_by_offset);
    int64_t pos = 0;
    for (size_t i = 0; i < f->n; i++) {
        zoff_st_tensor *t = &f->t[i];
        if (t->offset < pos)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "safetensors file %s: tensors '%.*s' and '%.*s' overlap (data bytes %" PRId64
                              " .. %" PRId64 ")",
                              path, ST_NAME_SHOWN, f->t[i - 1].name, ST_NAME_SHOWN, t->name, t->offset, pos);
        if (t->offset > pos)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "safetensors file %s: %" PRId64 " data bytes before tensor '%.*s' belong to no tensor "
                              "(a safetensors file must be entirely indexed)",
                              path, t->offset - pos, ST_NAME_SHOWN, t->name);
        pos = t->offset + t->bytes;
        t->offset += f->data_start;
    }
    if (pos != data_bytes)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: %" PRId64 " bytes after the last tensor belong to no tensor (a "
                          "safetensors file must be entirely indexed)",
                          path, data_bytes - pos);
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, f->n, sizeof *f->by_name, cmp_by_name, f->t);
    return ZOFF_OK;
}

/* Common part of open/open_memory once f->path, fd/mem and file_bytes are set. */
static zoff_status st_init(zoff_st_file *f) {
    if (f->file_bytes < 8)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s is %" PRId64 " bytes, too short for the 8-byte header length (truncated "
                          "or not a safetensors file)",
                          f->path, f->file_bytes);
    uint8_t len8[8];
    ZOFF_TRY(st_pread(f, len8, 8, 0));
    uint64_t hlen = get_u64(len8);
    if (hlen > ZOFF_ST_MAX_HEADER)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: header length %" PRIu64 " exceeds the limit of %" PRIu64
                          " bytes (not a safetensors file?)",
                          f->path, hlen, ZOFF_ST_MAX_HEADER);
    if (hlen > (uint64_t)(f->file_bytes - 8))
        return zoff_error(ZOFF_ERR_FORMAT,
                          "safetensors file %s: header length %" PRIu64 " runs past the end of the %" PRId64
                          "-byte file (truncated, or not a safetensors file)",
                          f->path, hlen, f->file_bytes);
    f->data_start = 8 + (int64_t)hlen;
    char *hdr = malloc(hlen ? (size_t)hlen : 1);
    if (!hdr) return zoff_error(ZOFF_ERR_NOMEM, "out of memory for the %" PRIu64 "-byte header of %s", hlen, f->path);
    zoff_status s = st_pread(f, hdr, (size_t)hlen, 8);
    if (s == ZOFF_OK) s = parse_header(f, hdr, (size_t)hlen);
    free(hdr);
    return s;
}

zoff_status zoff_st_open(const char *path, zoff_st_file **out) {
    *out = NULL;
    if (!path || !path[0]) return zoff_error(ZOFF_ERR_INVALID, "safetensors path is empty");
    zoff_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        zoff_st_close(f);
        return zoff_error(ZOFF_ERR_IO, "cannot open safetensors file %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        zoff_st_close(f);
        return zoff_error(ZOFF_ERR_IO, "safetensors file %s is not a regular file", path);
    }
    f->file_bytes = (int64_t)st.st_size;
    zoff_status s = st_init(f);
    if (s != ZOFF_OK) {
        zoff_st_close(f);
        return s;
    }
    *out = f;
    return ZOFF_OK;
}

zoff_status zoff_st_open_memory(const void *data, size_t size, const char *name, zoff_st_file **out) {
    *out = NULL;
    if (!data && size) return zoff_error(ZOFF_ERR_INVALID, "zoff_st_open_memory: data is NULL");
    zoff_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "(memory)"))) {
        free(f);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    f->fd = -1;
    static const uint8_t empty[1];
    f->mem = data ? data : empty;
    f->file_bytes = (int64_t)size;
    zoff_status s = st_init(f);
    if (s != ZOFF_OK) {
        zoff_st_close(f);
        return s;
    }
    *out = f;
    return ZOFF_OK;
}

zoff_status zoff_st_read(zoff_st_file *f, const zoff_st_tensor *t, void *dst, size_t bytes) {
    if (!t) return zoff_error(ZOFF_ERR_INVALID, "zoff_st_read: tensor is NULL (%s)", f->path);
    if ((uint64_t)t->bytes != bytes)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors file %s: tensor '%.*s' is %" PRId64 " bytes; %zu requested",
                          f->path, ST_NAME_SHOWN, t->name, t->bytes, bytes);
    return st_pread(f, dst, bytes, t->offset);
}

static float f64_to_f32(const uint8_t *p) {
    double d;
    memcpy(&d, p, 8);
    return (float)d;
}

zoff_status zoff_st_read_f32(zoff_st_file *f, const zoff_st_tensor *t, float *dst, int64_t numel) {
    if (!t) return zoff_error(ZOFF_ERR_INVALID, "zoff_st_read_f32: tensor is NULL (%s)", f->path);
    if (t->numel != numel)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors file %s: tensor '%.*s' has %" PRId64 " elements; %" PRId64
                          " requested", f->path, ST_NAME_SHOWN, t->name, t->numel, numel);
    if (t->dtype == ZOFF_ST_F32) return st_pread(f, dst, (size_t)t->bytes, t->offset);
    if (!is_float_dtype(t->dtype))
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s' is %s; expected a float dtype (F32, "
                          "F16, BF16 or F64)", f->path, ST_NAME_SHOWN, t->name, zoff_st_dtype_name(t->dtype));
    size_t es = zoff_st_dtype_size(t->dtype);
    uint8_t *buf = malloc(ST_CONV_ELEMS * es);
    if (!buf) return zoff_error(ZOFF_ERR_NOMEM, "out of memory converting '%s'", t->name);
    zoff_status s = ZOFF_OK;
    for (int64_t i = 0; i < numel && s == ZOFF_OK;) {
        size_t k = (uint64_t)(numel - i) < ST_CONV_ELEMS ? (size_t)(numel - i) : ST_CONV_ELEMS;
        s = st_pread(f, buf, k * es, t->offset + i * (int64_t)es);
        for (size_t j = 0; s == ZOFF_OK && j < k; j++) {
            uint16_t h;
            switch (t->dtype) {
            case ZOFF_ST_F16: memcpy(&h, buf + 2 * j, 2); dst[i + (int64_t)j] = zoff_f16_to_f32(h); break;
            case ZOFF_ST_BF16: memcpy(&h, buf + 2 * j, 2); dst[i + (int64_t)j] = zoff_bf16_to_f32(h); break;
            default: dst[i + (int64_t)j] = f64_to_f32(buf + 8 * j); break;
            }
        }
        i += (int64_t)k;
    }
    free(buf);
    return s;
}

/* ------------------------------------------------------------------ writer */

typedef struct st_decl {
    char *name;
    zoff_st_dtype dtype;
    int ndim;
    int64_t shape[ZOFF_ST_MAX_DIMS];
    int64_t bytes;
} st_decl;

struct zoff_st_writer {
    char *path, *tmp, *dir;
    int fd;
    st_decl *d;
    size_t n, cap;
    char **mk, **mv;
    size_t nm, mcap;
    int64_t data_total, data_written;
    int64_t pos;          /* file offset of the next byte to write (after the buffer) */
    bool started, failed;
    uint8_t *buf;
    size_t blen;
    int64_t fault_at;     /* ZOFF_CKPT_FAULT: -1 none */
    int fault_err;
};

static zoff_status parse_fault(zoff_st_writer *w) {
    w->fault_at = -1;
    const char *s = getenv("ZOFF_CKPT_FAULT");
    if (!s || !s[0]) return ZOFF_OK;
    const char *at = strchr(s, '@');
    char *end = NULL;
    long long v = -1;
    if (at) {
        errno = 0;
        v = strtoll(at + 1, &end, 10);
        if (errno || end == at + 1 || *end || v < 0) at = NULL;
    }
    if (at && (size_t)(at - s) == 6 && !strncmp(s, "ENOSPC", 6)) w->fault_err = ENOSPC;
    else if (at && (size_t)(at - s) == 3 && !strncmp(s, "EIO", 3)) w->fault_err = EIO;
    else
        return zoff_error(ZOFF_ERR_INVALID, "ZOFF_CKPT_FAULT='%s' is invalid; expected ENOSPC@<offset> or EIO@<offset>",
                          s);
    w->fault_at = v;
    zoff_log(ZOFF_LOG_WARN, "ZOFF_CKPT_FAULT=%s: safetensors writes will fail from that offset on (fault-injection test)",
             s);
    return ZOFF_OK;
}

static void w_free(zoff_st_writer *w) {
    for (size_t i = 0; i < w->n; i++) free(w->d[i].name);
    for (size_t i = 0; i < w->nm; i++) {
        free(w->mk[i]);
        free(w->mv[i]);
    }
    free(w->d);
    free(w->mk);
    free(w->mv);
    free(w->buf);
    free(w->path);
    free(w->tmp);
    free(w->dir);
    free(w);
}

static void w_remove_tmp(zoff_st_writer *w) {
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
        unlink(w->tmp);
    }
}

void zoff_st_writer_abort(zoff_st_writer *w) {
    if (!w) return;
    w_remove_tmp(w);
    w_free(w);
}

zoff_status zoff_st_writer_open(const char *path, zoff_st_writer **out) {
    *out = NULL;
    if (!path || !path[0]) return zoff_error(ZOFF_ERR_INVALID, "safetensors output path is empty");
    size_t n = strlen(path);
    if (path[n - 1] == '/')
        return zoff_error(ZOFF_ERR_INVALID, "safetensors output %s names a directory; give a file name", path);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return zoff_error(ZOFF_ERR_INVALID, "safetensors output %s is a directory; give a file name", path);
    zoff_st_writer *w = calloc(1, sizeof *w);
    if (!w) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    w->fd = -1;
    w->path = strdup(path);
    w->tmp = malloc(n + 32);
    w->dir = strdup(path);
    if (!w->path || !w->tmp || !w->dir) {
        w_free(w);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    snprintf(w->tmp, n + 32, "%s.tmp-%ld", path, (long)getpid());
    char *slash = strrchr(w->dir, '/');
    if (!slash) strcpy(w->dir, ".");
    else if (slash == w->dir) slash[1] = '\0';
    else *slash = '\0';
    zoff_status s = parse_fault(w);
    if (s != ZOFF_OK) {
        w_free(w);
        return s;
    }
    *out = w;
    return ZOFF_OK;
}

static zoff_status w_usable(zoff_st_writer *w, const char *what) {
    if (!w) return zoff_error(ZOFF_ERR_INVALID, "%s: writer is NULL", what);
    if (w->failed)
        return zoff_error(ZOFF_ERR_INVALID, "%s: an earlier error stopped the writer of %s; abort it", what, w->path);
    return ZOFF_OK;
}

/* A UTF-8 string that JSON can hold (jansson checks the encoding). */
static bool valid_utf8(const char *s) {
    json_t *j = json_string(s);
    if (!j) return false;
    json_decref(j);
    return true;
}

zoff_status zoff_st_writer_metadata(zoff_st_writer *w, const char *key, const char *value) {
    ZOFF_TRY(w_usable(w, "zoff_st_writer_metadata"));
    if (w->started) return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: metadata after data was written", w->path);
    if (!key || !value || !valid_utf8(key) || !valid_utf8(value))
        return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: metadata key and value must be UTF-8 strings", w->path);
    for (size_t i = 0; i < w->nm; i++)
        if (!strcmp(w->mk[i], key))
            return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: metadata key '%.*s' given twice", w->path,
                              ST_NAME_SHOWN, key);
    if (w->nm == w->mcap) {
        size_t c = w->mcap ? 2 * w->mcap : 8;
        char **a = realloc(w->mk, c * sizeof *a);
        if (a) w->mk = a;
        char **b = a ? realloc(w->mv, c * sizeof *b) : NULL;
        if (b) w->mv = b;
        if (!a || !b) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        w->mcap = c;
    }
    w->mk[w->nm] = strdup(key);
    w->mv[w->nm] = strdup(value);
    if (!w->mk[w->nm] || !w->mv[w->nm]) {
        free(w->mk[w->nm]);
        free(w->mv[w->nm]);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    w->nm++;
    return ZOFF_OK;
}

zoff_status zoff_st_writer_declare(zoff_st_writer *w, const char *name, zoff_st_dtype dtype, int ndim,
                                   const int64_t *shape) {
    ZOFF_TRY(w_usable(w, "zoff_st_writer_declare"));
    if (w->started) return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor declared after data was written", w->path);
    if (!name || !name[0] || !valid_utf8(name) || !strcmp(name, "__metadata__"))
        return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor name '%.*s' is empty, not UTF-8 or reserved",
                          w->path, ST_NAME_SHOWN, name ? name : "(null)");
    if ((unsigned)dtype >= ZOFF_ST_DTYPE_COUNT)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor '%s': invalid dtype %d", w->path, name, (int)dtype);
    if (ndim < 0 || ndim > ZOFF_ST_MAX_DIMS || (ndim > 0 && !shape))
        return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor '%s': ndim %d is out of range 0..%d", w->path, name,
                          ndim, ZOFF_ST_MAX_DIMS);
    int64_t es = (int64_t)zoff_st_dtype_size(dtype), numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (shape[i] > 0 && numel > INT64_MAX / es / shape[i]))
            return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor '%s': dimension %d (%" PRId64
                              ") is negative or too large", w->path, name, i, shape[i]);
        numel *= shape[i];
    }
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->d[i].name, name))
            return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: tensor '%s' declared twice", w->path, name);
    if (numel * es > INT64_MAX - w->data_total)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors %s: total size overflows", w->path);
    if (w->n == w->cap) {
        size_t c = w->cap ? 2 * w->cap : 64;
        st_decl *d = realloc(w->d, c * sizeof *d);
        if (!d) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        w->d = d;
        w->cap = c;
    }
    st_decl *d = &w->d[w->n];
    memset(d, 0, sizeof *d);
    if (!(d->name = strdup(name))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    d->dtype = dtype;
    d->ndim = ndim;
    for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
    d->bytes = numel * es;
    w->data_total += d->bytes;
    w->n++;
    return ZOFF_OK;
}

/* pwrite all of buf at the current position, honouring the injected fault. */
static zoff_status w_write_raw(zoff_st_writer *w, const void *buf, size_t n) {
    const uint8_t *p = buf;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < ST_IO_CHUNK ? n - done : ST_IO_CHUNK;
        int64_t at = w->pos + (int64_t)done;
        ssize_t r;
        if (w->fault_at >= 0 && at >= w->fault_at) {
            errno = w->fault_err;
            r = -1;
        } else {
            if (w->fault_at >= 0 && at + (int64_t)chunk > w->fault_at) chunk = (size_t)(w->fault_at - at);
            r = pwrite(w->fd, p + done, chunk, (off_t)at);
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            return zoff_error(ZOFF_ERR_IO, "cannot write %s at offset %" PRId64 ": %s%s", w->tmp, at, strerror(e),
                              e == ENOSPC || e == EDQUOT ? " (the disk is full: free space or write elsewhere)" : "");
        }
        if (r == 0)
            return zoff_error(ZOFF_ERR_IO, "short write to %s at offset %" PRId64 " (is the disk full?)", w->tmp, at);
        done += (size_t)r;
    }
    w->pos += (int64_t)n;
    return ZOFF_OK;
}

static zoff_status w_flush(zoff_st_writer *w) {
    if (!w->blen) return ZOFF_OK;
    zoff_status s = w_write_raw(w, w->buf, w->blen);
    w->blen = 0;
    return s;
}

static zoff_status w_put(zoff_st_writer *w, const void *data, size_t n) {
    if (n >= ST_WBUF_BYTES) {
        ZOFF_TRY(w_flush(w));
        return w_write_raw(w, data, n);
    }
    if (w->blen + n > ST_WBUF_BYTES) ZOFF_TRY(w_flush(w));
    memcpy(w->buf + w->blen, data, n);
    w->blen += n;
    return ZOFF_OK;
}

/* Build the header JSON, create the temp file and write length + header. */
static zoff_status w_start(zoff_st_writer *w) {
    json_t *root = json_object();
    zoff_status s = root ? ZOFF_OK : zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    if (s == ZOFF_OK && w->nm) {
        json_t *m = json_object();
        for (size_t i = 0; m && i < w->nm; i++) json_object_set_new(m, w->mk[i], json_string(w->mv[i]));
        if (!m || json_object_set_new(root, "__metadata__", m)) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    int64_t off = 0;
    for (size_t i = 0; s == ZOFF_OK && i < w->n; i++) {
        const st_decl *d = &w->d[i];
        json_t *shape = json_array();
        for (int k = 0; shape && k < d->ndim; k++) json_array_append_new(shape, json_integer((json_int_t)d->shape[k]));
        json_t *e = json_pack("{s:s,s:o,s:[I,I]}", "dtype", zoff_st_dtype_name(d->dtype), "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + d->bytes));
        if (!e || json_object_set_new(root, d->name, e)) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        off += d->bytes;
    }
    char *txt = s == ZOFF_OK ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (s == ZOFF_OK && !txt) s = zoff_error(ZOFF_ERR_NOMEM, "cannot encode the safetensors header of %s", w->path);
    if (s != ZOFF_OK) {
        free(txt);
        return s;
    }
    size_t hl = strlen(txt), padded = (hl + 7) / 8 * 8;
    w->buf = malloc(ST_WBUF_BYTES > padded + 8 ? ST_WBUF_BYTES : padded + 8);
    if (!w->buf) {
        free(txt);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(txt);
        return zoff_error(ZOFF_ERR_IO, "cannot create %s: %s (is the output directory there and writable?)", w->tmp,
                          strerror(e));
    }
    w->started = true;
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(w->buf, len8, 8);
    memcpy(w->buf + 8, txt, hl);
    memset(w->buf + 8 + hl, ' ', padded - hl);
    free(txt);
    if (padded + 8 > ST_WBUF_BYTES) { /* a huge header: write it out at once */
        s = w_write_raw(w, w->buf, padded + 8);
        w->blen = 0;
        return s;
    }
    w->blen = padded + 8;
    return ZOFF_OK;
}

zoff_status zoff_st_writer_append(zoff_st_writer *w, const void *data, size_t bytes) {
    ZOFF_TRY(w_usable(w, "zoff_st_writer_append"));
    zoff_status s = ZOFF_OK;
    if (!w->started) s = w_start(w);
    if (s == ZOFF_OK && (uint64_t)bytes > (uint64_t)(w->data_total - w->data_written))
        s = zoff_error(ZOFF_ERR_INVALID, "safetensors %s: %zu more bytes appended than the %" PRId64 " declared",
                       w->path, bytes - (size_t)(w->data_total - w->data_written), w->data_total);
    if (s == ZOFF_OK && bytes) s = w_put(w, data, bytes);
    if (s != ZOFF_OK) {
        w->failed = true;
        w_remove_tmp(w);
        return s;
    }
    w->data_written += (int64_t)bytes;
    return ZOFF_OK;
}

static zoff_status fsync_path_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return zoff_error(ZOFF_ERR_IO, "cannot open directory %s to fsync it: %s", dir, strerror(errno));
    int r;
    do r = fsync(fd);
    while (r != 0 && errno == EINTR);
    int e = errno;
    close(fd);
    if (r != 0) return zoff_error(ZOFF_ERR_IO, "cannot fsync directory %s: %s", dir, strerror(e));
    return ZOFF_OK;
}

zoff_status zoff_st_writer_commit(zoff_st_writer *w) {
    zoff_status s = w_usable(w, "zoff_st_writer_commit");
    if (s != ZOFF_OK) {
        zoff_st_writer_abort(w);
        return s;
    }
    if (!w->started) s = w_start(w);
    if (s == ZOFF_OK && w->data_written != w->data_total)
        s = zoff_error(ZOFF_ERR_INVALID, "safetensors %s: %" PRId64 " of the %" PRId64 " declared data bytes were written",
                       w->path, w->data_written, w->data_total);
    if (s == ZOFF_OK) s = w_flush(w);
    if (s == ZOFF_OK) {
        int r;
        do r = fsync(w->fd);
        while (r != 0 && errno == EINTR);
        if (r != 0) s = zoff_error(ZOFF_ERR_IO, "cannot fsync %s: %s", w->tmp, strerror(errno));
    }
    if (s == ZOFF_OK) {
        int r = close(w->fd);
        w->fd = -1;
        if (r != 0) s = zoff_error(ZOFF_ERR_IO, "cannot close %s: %s", w->tmp, strerror(errno));
        else if (rename(w->tmp, w->path) != 0)
            s = zoff_error(ZOFF_ERR_IO, "cannot rename %s to %s: %s", w->tmp, w->path, strerror(errno));
        if (s != ZOFF_OK) unlink(w->tmp);
        else s = fsync_path_dir(w->dir);
    }
    if (s != ZOFF_OK) w_remove_tmp(w);
    w_free(w);
    return s;
}

/* ------------------------------------------------------------------ GPT-2 names and shapes */

enum { P_PER_BLOCK = 12 };
static const char *const g_block[P_PER_BLOCK] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
/* zoff shape of block tensor k: (out_mult*C, in_mult*C) or (out_mult*C) when in_mult == 0 */
static const int g_out_mult[P_PER_BLOCK] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 1, 1};
static const int g_in_mult[P_PER_BLOCK] = {0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4, 0};
#define HF_PREFIX "transformer."

static int64_t nparams_of(int64_t L) { return 4 + P_PER_BLOCK * L; }

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
        if (!strcmp(rest, g_block[k])) {
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

static void param_name(int64_t idx, int64_t L, char *out, size_t cap) {
    if (idx == 0) snprintf(out, cap, "wte.weight");
    else if (idx == 1) snprintf(out, cap, "wpe.weight");
    else if (idx == 2 + P_PER_BLOCK * L) snprintf(out, cap, "ln_f.weight");
    else if (idx == 3 + P_PER_BLOCK * L) snprintf(out, cap, "ln_f.bias");
    else snprintf(out, cap, "h.%" PRId64 ".%s", (idx - 2) / P_PER_BLOCK, g_block[(idx - 2) % P_PER_BLOCK]);
}

/* Stored as Conv1D (in, out) in Hugging Face's layout. */
static bool is_conv1d(int64_t idx, int64_t L) {
    if (idx < 2 || idx >= 2 + P_PER_BLOCK * L) return false;
    return g_in_mult[(idx - 2) % P_PER_BLOCK] != 0;
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
    int64_t out = g_out_mult[k] * C, in = g_in_mult[k] * C;
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

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return false;
    return true;
}

static zoff_status check_model_shape(const zoff_gpt2_shape *in, zoff_gpt2_shape *out) {
    *out = *in;
    if (in->num_layers < 1 || in->num_layers > ((int64_t)1 << 24) || in->hidden_size < 1 ||
        in->hidden_size > ((int64_t)1 << 24) || in->max_seq_len < 1 || in->max_seq_len > ((int64_t)1 << 32) ||
        in->vocab_size < 1 || in->vocab_size > ((int64_t)1 << 32))
        return zoff_error(ZOFF_ERR_INVALID,
                          "GPT-2 shape out of range: %" PRId64 " layers, width %" PRId64 ", %" PRId64
                          " positions, vocabulary %" PRId64,
                          in->num_layers, in->hidden_size, in->max_seq_len, in->vocab_size);
    if (out->padded_vocab_size == 0) out->padded_vocab_size = (in->vocab_size + 127) / 128 * 128;
    if (out->padded_vocab_size < in->vocab_size)
        return zoff_error(ZOFF_ERR_INVALID, "GPT-2 shape: padded vocabulary %" PRId64 " < vocabulary %" PRId64,
                          out->padded_vocab_size, in->vocab_size);
    return ZOFF_OK;
}

/* zoff (out, in) -> (in, out), blocked for the cache. */
static void transpose(const float *src, float *dst, int64_t rows, int64_t cols) {
    const int64_t B = 32;
    for (int64_t r0 = 0; r0 < rows; r0 += B)
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            int64_t r1 = r0 + B < rows ? r0 + B : rows, c1 = c0 + B < cols ? c0 + B : cols;
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) dst[c * rows + r] = src[r * cols + c];
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
        if (!same_shape(t->ndim, t->shape, nd, dims) || t->numel != (nd == 2 ? dims[0] * dims[1] : dims[0]))
            s = zoff_error(ZOFF_ERR_INVALID, "export: tensor '%s' has shape %s; this GPT-2 has %s", t->name,
                           shape_str(t->ndim, t->shape, sa, sizeof sa), shape_str(nd, dims, sb, sizeof sb));
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
            bool bf = opts->dtype == ZOFF_ST_BF16;
            for (int64_t j = 0; j < count; j++) h[j] = bf ? zoff_f32_to_bf16(src[j]) : zoff_f32_to_f16(src[j]);
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
        const char *v = zoff_st_metadata(f, "zoff.vocab_size");
        if (v) out->vocab_size = strtoll(v, NULL, 10);
    }
    const char *nh = zoff_st_metadata(f, "zoff.num_heads");
    if (nh) out->num_heads = strtoll(nh, NULL, 10);
    return ZOFF_OK;
}

/* "the file holds ...: use --num-layers ... " (for shape errors). */
static void shape_hint(const zoff_st_file *f, const zoff_gpt2_shape *model, char *buf, size_t cap) {
    zoff_gpt2_shape fs;
    buf[0] = '\0';
    zoff_status s = zoff_gpt2_st_infer_shape(f, &fs);
    zoff_clear_error();
    if (s != ZOFF_OK) return;
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
        if (layout == ZOFF_GPT2_LAYOUT_HF && is_hf_buffer(name)) continue;
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
        if (!is_float_dtype(t->dtype) || (layout == ZOFF_GPT2_LAYOUT_ZOFF && t->dtype != ZOFF_ST_F32))
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' is %s; expected %s", path, t->name,
                              zoff_st_dtype_name(t->dtype),
                              layout == ZOFF_GPT2_LAYOUT_ZOFF ? "F32 (a zoff-layout file)" : "F32, F16, BF16 or F64");
        int64_t dims[2];
        int nd = param_shape(idx, sh, layout, dims);
        if (!same_shape(t->ndim, t->shape, nd, dims)) {
            shape_hint(f, sh, hint, sizeof hint);
            return zoff_error(ZOFF_ERR_FORMAT, "%s: tensor '%s' has shape %s, but the model needs %s%s%s", path,
                              t->name, shape_str(t->ndim, t->shape, sa, sizeof sa), shape_str(nd, dims, sb, sizeof sb),
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
        if (!same_shape((*lm_head)->ndim, (*lm_head)->shape, w->ndim, w->shape) || !is_float_dtype((*lm_head)->dtype))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "%s: lm_head.weight is %s %s but wte is %s: zoff ties the LM head to wte and cannot load "
                              "a separate head",
                              path, zoff_st_dtype_name((*lm_head)->dtype),
                              shape_str((*lm_head)->ndim, (*lm_head)->shape, sa, sizeof sa),
                              shape_str(w->ndim, w->shape, sb, sizeof sb));
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

zoff_status zoff_gpt2_st_load(zoff_st_file *f, const zoff_gpt2_shape *shape, const zoff_tensor_info *tensors,
                              int ntensors, float *host_params) {
    zoff_gpt2_shape sh;
    ZOFF_TRY(check_model_shape(shape, &sh));
    const int64_t L = sh.num_layers, np = nparams_of(L);
    const zoff_gpt2_layout layout = zoff_gpt2_st_layout(f);
    if (ntensors != np)
        return zoff_error(ZOFF_ERR_INVALID, "load: %d model tensors; a GPT-2 with %" PRId64 " layers has %" PRId64,
                          ntensors, L, np);
    const zoff_st_tensor **slot = calloc((size_t)np, sizeof *slot), *lm = NULL;
    if (!slot) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    zoff_status s = match_tensors(f, &sh, layout, slot, &lm);
    int64_t maxel = 1;
    char sa[200], sb[200];
    for (int i = 0; i < ntensors && s == ZOFF_OK; i++) {
        const zoff_tensor_info *t = &tensors[i];
        int64_t layer, idx = param_index(t->name, L, &layer), dims[2];
        int nd = idx >= 0 ? param_shape(idx, &sh, ZOFF_GPT2_LAYOUT_ZOFF, dims) : 0;
        if (idx < 0 || !same_shape(t->ndim, t->shape, nd, dims))
            s = zoff_error(ZOFF_ERR_INVALID, "load: model tensor '%.*s' %s is not a parameter of GPT-2 shape %s",
                           ST_NAME_SHOWN, t->name, shape_str(t->ndim, t->shape, sa, sizeof sa),
                           idx >= 0 ? shape_str(nd, dims, sb, sizeof sb) : "");
        if (t->numel > maxel) maxel = t->numel;
    }
    float *tmp = s == ZOFF_OK ? malloc((size_t)maxel * sizeof(float)) : NULL;
    if (s == ZOFF_OK && !tmp) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory (%" PRId64 " floats)", maxel);
    for (int i = 0; i < ntensors && s == ZOFF_OK; i++) {
        const zoff_tensor_info *t = &tensors[i];
        int64_t layer, idx = param_index(t->name, L, &layer);
        const zoff_st_tensor *ft = slot[idx];
        float *dst = host_params + t->offset;
        if (layout == ZOFF_GPT2_LAYOUT_HF && idx == 0) {
            s = zoff_st_read_f32(f, ft, dst, ft->numel);
            memset(dst + ft->numel, 0, (size_t)(t->numel - ft->numel) * sizeof(float));
        } else if (layout == ZOFF_GPT2_LAYOUT_HF && is_conv1d(idx, L)) {
            s = zoff_st_read_f32(f, ft, tmp, ft->numel);
            if (s == ZOFF_OK) transpose(tmp, dst, ft->shape[0], ft->shape[1]);
        } else {
            s = zoff_st_read_f32(f, ft, dst, t->numel);
        }
    }
    if (s == ZOFF_OK && lm) { /* tied: say so when the file's head is not wte */
        s = zoff_st_read_f32(f, lm, tmp, lm->numel);
        const float *wte = NULL;
        for (int i = 0; i < ntensors; i++)
            if (!strcmp(tensors[i].name, "wte.weight")) wte = host_params + tensors[i].offset;
        if (s == ZOFF_OK && wte && memcmp(tmp, wte, (size_t)lm->numel * sizeof(float)) != 0)
            zoff_log(ZOFF_LOG_WARN, "%s: lm_head.weight differs from wte.weight; zoff ties the LM head to wte and "
                     "uses wte (the file's separate head is ignored)", zoff_st_path(f));
        else if (s == ZOFF_OK)
            zoff_log(ZOFF_LOG_DEBUG, "%s: lm_head.weight equals wte.weight (tied)", zoff_st_path(f));
    }
    free(tmp);
    free(slot);
    return s;
}

/* ------------------------------------------------------------------ consolidation of rank files */

typedef struct gather_piece {
    int rank;
    char entry[ZOFF_CKPT_MAX_NAME + 1];
    int64_t start, count; /* elements [start, start + count) of the tensor */
    int64_t src;          /* ... are elements [src, src + count) of the entry */
    int64_t entry_numel;
} gather_piece;

typedef struct gather_tensor {
    zoff_ckpt_gathered info;
    int rank;                 /* whole: the lowest rank holding it */
    uint32_t crc;             /* whole: its data CRC (replicas must match) */
    gather_piece *p;
    size_t np, pcap;
    char shape_text[ZOFF_CKPT_MAX_NAME + 1]; /* pieces: the shape string */
} gather_tensor;

struct zoff_ckpt_gather {
    char stepdir[4096];
    int64_t step;
    int nranks;
    int64_t part_params; /* num_params of the "partition" blobs (-1: none seen) */
    zoff_ckpt_reader **r;
    gather_tensor *t;
    size_t n, cap;
};

void zoff_ckpt_gather_close(zoff_ckpt_gather *g) {
    if (!g) return;
    for (int i = 0; i < g->nranks; i++) zoff_ckpt_close(g->r ? g->r[i] : NULL);
    for (size_t i = 0; i < g->n; i++) free(g->t[i].p);
    free(g->t);
    free(g->r);
    free(g);
}

int64_t zoff_ckpt_gather_step(const zoff_ckpt_gather *g) { return g->step; }
int zoff_ckpt_gather_nranks(const zoff_ckpt_gather *g) { return g->nranks; }
zoff_ckpt_reader *zoff_ckpt_gather_reader(zoff_ckpt_gather *g, int rank) {
    return rank >= 0 && rank < g->nranks ? g->r[rank] : NULL;
}
size_t zoff_ckpt_gather_num_tensors(const zoff_ckpt_gather *g) { return g->n; }
const zoff_ckpt_gathered *zoff_ckpt_gather_tensor_at(const zoff_ckpt_gather *g, size_t i) {
    return i < g->n ? &g->t[i].info : NULL;
}

static gather_tensor *gfind(const zoff_ckpt_gather *g, const char *name) {
    for (size_t i = 0; i < g->n; i++)
        if (!strcmp(g->t[i].info.name, name)) return &g->t[i];
    return NULL;
}

const zoff_ckpt_gathered *zoff_ckpt_gather_find(const zoff_ckpt_gather *g, const char *name) {
    gather_tensor *t = gfind(g, name);
    return t ? &t->info : NULL;
}

/* Local, so that src/ckpt needs only src/core (the fuzzing build links just those). */
static size_t ck_dtype_size(zoff_dtype dt) {
    switch ((int)dt) {
    case ZOFF_F32:
    case ZOFF_I32: return 4;
    case ZOFF_BF16:
    case ZOFF_F16: return 2;
    default: return 1; /* ZOFF_CKPT_RAW */
    }
}

static const char *ck_dtype_name(zoff_dtype dt) {
    switch ((int)dt) {
    case ZOFF_F32: return "f32";
    case ZOFF_BF16: return "bf16";
    case ZOFF_F16: return "f16";
    case ZOFF_I32: return "i32";
    default: return "raw bytes";
    }
}

/* Decimal int64 without sign; advances *p. */
static bool parse_dec(const char **p, int64_t *out) {
    const char *s = *p;
    int64_t v = 0;
    if (*s < '0' || *s > '9') return false;
    while (*s >= '0' && *s <= '9') {
        if (v > (INT64_MAX - 9) / 10) return false;
        v = v * 10 + (*s++ - '0');
    }
    *p = s;
    *out = v;
    return true;
}

/* "NAME@START/D0xD1..." -> name, start, ndim, shape. */
static zoff_status parse_piece_name(const char *file, const char *entry, char *name, int64_t *start, int *ndim,
                                    int64_t *shape, const char **shape_text) {
    const char *at = strrchr(entry, '@');
    const char *p = at + 1;
    size_t nl = (size_t)(at - entry);
    int64_t numel = 1;
    bool ok = nl > 0 && parse_dec(&p, start) && *p == '/';
    if (ok) {
        *shape_text = ++p;
        *ndim = 0;
        while (ok) {
            if (*ndim == ZOFF_CKPT_MAX_DIMS || !parse_dec(&p, &shape[*ndim])) {
                ok = false;
                break;
            }
            if (shape[*ndim] > 0 && numel > INT64_MAX / 8 / shape[*ndim]) ok = false;
            numel *= shape[*ndim];
            (*ndim)++;
            if (*p == '\0') break;
            if (*p != 'x') ok = false;
            else p++;
        }
    }
    if (!ok)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s: entry '%s' is not a valid piece name (expected NAME@START/D0xD1..., "
                          "see safetensors.h)",
                          file, entry);
    memcpy(name, entry, nl);
    name[nl] = '\0';
    return ZOFF_OK;
}

static gather_tensor *gadd(zoff_ckpt_gather *g, const char *name) {
    if (g->n == g->cap) {
        size_t c = g->cap ? 2 * g->cap : 64;
        gather_tensor *t = realloc(g->t, c * sizeof *t);
        if (!t) return NULL;
        g->t = t;
        g->cap = c;
    }
    gather_tensor *t = &g->t[g->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->info.name, sizeof t->info.name, "%s", name);
    return t;
}

static int cmp_piece(const void *a, const void *b) {
    const gather_piece *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    return x->count < y->count ? -1 : x->count > y->count;
}

static zoff_status gather_index_entries(zoff_ckpt_gather *g, int rank, bool skip_optimizer);

static zoff_status add_piece(gather_tensor *t, int rank, const char *entry, int64_t start, int64_t count,
                             int64_t src, int64_t entry_numel) {
    if (count == 0) return ZOFF_OK;
    if (t->np == t->pcap) {
        size_t c = t->pcap ? 2 * t->pcap : 4;
        gather_piece *p = realloc(t->p, c * sizeof *p);
        if (!p) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        t->p = p;
        t->pcap = c;
    }
    gather_piece *p = &t->p[t->np++];
    p->rank = rank;
    snprintf(p->entry, sizeof p->entry, "%s", entry);
    p->start = start;
    p->count = count;
    p->src = src;
    p->entry_numel = entry_numel;
    return ZOFF_OK;
}

/* A rank file's "partition" blob (ckpt.h, "Partitioned entries"): runs [offset, count] of a flat
 * space of *P elements. *runs is NULL (and *nruns 0) when the file has no such blob. */
static zoff_status read_partition_blob(zoff_ckpt_gather *g, int rank, int64_t **runs, size_t *nruns, int64_t *P) {
    zoff_ckpt_reader *r = g->r[rank];
    const char *file = zoff_ckpt_reader_path(r);
    *runs = NULL;
    *nruns = 0;
    *P = 0;
    if (!zoff_ckpt_find(r, "partition")) return ZOFF_OK;
    char *txt = NULL;
    ZOFF_TRY(zoff_ckpt_read_blob(r, "partition", &txt, NULL));
    json_error_t jerr;
    json_t *root = json_loads(txt, JSON_REJECT_DUPLICATES, &jerr);
    free(txt);
    zoff_status s = ZOFF_OK;
    json_t *jr = json_object_get(root, "runs"), *jrank = json_object_get(root, "rank");
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!root || !fmt || strcmp(fmt, "zoff-partition") || json_integer_value(json_object_get(root, "version")) != 1 ||
        !json_u63(json_object_get(root, "num_params"), P) || !json_is_array(jr) ||
        (jrank && (!json_is_integer(jrank) || json_integer_value(jrank) != rank)))
        s = zoff_error(ZOFF_ERR_FORMAT,
                       "checkpoint file %s: the \"partition\" blob is not a zoff-partition version 1 object for rank "
                       "%d with num_params and runs",
                       file, rank);
    size_t n = s == ZOFF_OK ? json_array_size(jr) : 0;
    if (s == ZOFF_OK && !(*runs = malloc((2 * n + 1) * sizeof **runs)))
        s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    for (size_t i = 0; s == ZOFF_OK && i < n; i++) {
        json_t *run = json_array_get(jr, i);
        int64_t off, cnt;
        if (!json_is_array(run) || json_array_size(run) != 2 || !json_u63(json_array_get(run, 0), &off) ||
            !json_u63(json_array_get(run, 1), &cnt) || off > *P || cnt > *P - off)
            s = zoff_error(ZOFF_ERR_FORMAT,
                           "checkpoint file %s: partition run %zu is not [offset, count] inside [0, %" PRId64 ")", file,
                           i, *P);
        else {
            (*runs)[2 * i] = off;
            (*runs)[2 * i + 1] = cnt;
        }
    }
    if (s == ZOFF_OK && g->part_params >= 0 && g->part_params != *P)
        s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: the partition blobs disagree on num_params (%" PRId64 " and %" PRId64
                       " in rank %d's file)", g->stepdir, g->part_params, *P, rank);
    json_decref(root);
    if (s != ZOFF_OK) {
        free(*runs);
        *runs = NULL;
        return s;
    }
    g->part_params = *P;
    *nruns = n;
    return ZOFF_OK;
}

/* An entry "optimizer.*" of a file with a partition blob: its elements are the runs' model
 * elements laid end to end. */
static zoff_status index_run_entry(zoff_ckpt_gather *g, int rank, const zoff_ckpt_entry *e, const int64_t *runs,
                                   size_t nruns, int64_t P) {
    const char *file = zoff_ckpt_reader_path(g->r[rank]);
    char sa[200];
    int64_t total = 0;
    for (size_t i = 0; i < nruns; i++) total += runs[2 * i + 1];
    if (e->ndim != 1 || e->shape[0] != total)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint file %s: partitioned entry '%s' is %s, but the partition blob's runs hold %" PRId64
                          " elements",
                          file, e->name, shape_str(e->ndim, e->shape, sa, sizeof sa), total);
    char shape_text[32];
    snprintf(shape_text, sizeof shape_text, "%" PRId64, P);
    gather_tensor *t = gfind(g, e->name);
    if (t && !t->info.pieces)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: '%s' is whole in rank %d's file but partitioned in rank %d's",
                          g->stepdir, e->name, t->rank, rank);
    if (!t) {
        if (!(t = gadd(g, e->name))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        t->info.dtype = e->dtype;
        t->info.ndim = 1;
        t->info.shape[0] = P;
        t->info.numel = P;
        t->info.bytes = P * (int64_t)ck_dtype_size(e->dtype);
        t->info.pieces = 1;
        snprintf(t->shape_text, sizeof t->shape_text, "%s", shape_text);
    } else if (t->info.dtype != e->dtype || strcmp(t->shape_text, shape_text))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: the parts of '%s' disagree (%s [%s] and %s [%s] in rank %d's file)",
                          g->stepdir, e->name, ck_dtype_name(t->info.dtype), t->shape_text, ck_dtype_name(e->dtype),
                          shape_text, rank);
    int64_t src = 0;
    for (size_t i = 0; i < nruns; i++) {
        ZOFF_TRY(add_piece(t, rank, e->name, runs[2 * i], runs[2 * i + 1], src, total));
        src += runs[2 * i + 1];
    }
    return ZOFF_OK;
}

static zoff_status gather_index_rank(zoff_ckpt_gather *g, int rank) {
    int64_t *runs = NULL, P = 0;
    size_t nruns = 0;
    ZOFF_TRY(read_partition_blob(g, rank, &runs, &nruns, &P));
    zoff_status s = ZOFF_OK;
    zoff_ckpt_reader *r = g->r[rank];
    for (size_t i = 0; runs && s == ZOFF_OK && i < zoff_ckpt_num_entries(r); i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        if (e->dtype != ZOFF_CKPT_RAW && !strchr(e->name, '@') && !strncmp(e->name, "optimizer.", 10))
            s = index_run_entry(g, rank, e, runs, nruns, P);
    }
    free(runs);
    if (s != ZOFF_OK) return s;
    return gather_index_entries(g, rank, zoff_ckpt_find(r, "partition") != NULL);
}

/* Whole tensors and NAME@START/SHAPE pieces of one rank file (skip_optimizer: its "optimizer.*"
 * entries were indexed through the partition blob). */
static zoff_status gather_index_entries(zoff_ckpt_gather *g, int rank, bool skip_optimizer) {
    zoff_ckpt_reader *r = g->r[rank];
    const char *file = zoff_ckpt_reader_path(r);
    char sa[200], sb[200];
    for (size_t i = 0; i < zoff_ckpt_num_entries(r); i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        if (e->dtype == ZOFF_CKPT_RAW) continue;
        if (skip_optimizer && !strchr(e->name, '@') && !strncmp(e->name, "optimizer.", 10)) continue;
        if (!strchr(e->name, '@')) { /* a whole tensor */
            gather_tensor *t = gfind(g, e->name);
            if (t && t->info.pieces)
                return zoff_error(ZOFF_ERR_FORMAT,
                                  "checkpoint %s: '%s' is whole in rank %d's file but partitioned in another", g->stepdir,
                                  e->name, rank);
            if (t) {
                if (t->info.dtype != e->dtype || !same_shape(t->info.ndim, t->info.shape, e->ndim, e->shape) ||
                    t->crc != e->crc32c)
                    return zoff_error(ZOFF_ERR_FORMAT,
                                      "checkpoint %s: ranks %d and %d both hold '%s' but disagree (%s %s vs %s %s, or "
                                      "different data)",
                                      g->stepdir, t->rank, rank, e->name, ck_dtype_name(t->info.dtype),
                                      shape_str(t->info.ndim, t->info.shape, sa, sizeof sa), ck_dtype_name(e->dtype),
                                      shape_str(e->ndim, e->shape, sb, sizeof sb));
                continue;
            }
            if (!(t = gadd(g, e->name))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
            t->info.dtype = e->dtype;
            t->info.ndim = e->ndim;
            memcpy(t->info.shape, e->shape, sizeof t->info.shape);
            t->info.bytes = e->bytes;
            t->info.numel = e->bytes / (int64_t)ck_dtype_size(e->dtype);
            t->rank = rank;
            t->crc = e->crc32c;
            continue;
        }
        char name[ZOFF_CKPT_MAX_NAME + 1];
        int64_t start = 0, shape[ZOFF_CKPT_MAX_DIMS] = {0};
        int ndim = 0;
        const char *shape_text = "";
        ZOFF_TRY(parse_piece_name(file, e->name, name, &start, &ndim, shape, &shape_text));
        if (e->ndim != 1)
            return zoff_error(ZOFF_ERR_FORMAT, "checkpoint file %s: piece '%s' must be 1-D, it is %s", file, e->name,
                              shape_str(e->ndim, e->shape, sa, sizeof sa));
        gather_tensor *t = gfind(g, name);
        if (t && !t->info.pieces && !t->np)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint %s: '%s' is whole in rank %d's file but partitioned in rank %d's", g->stepdir,
                              name, t->rank, rank);
        if (!t) {
            if (!(t = gadd(g, name))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
            t->info.dtype = e->dtype;
            t->info.ndim = ndim;
            memcpy(t->info.shape, shape, sizeof t->info.shape);
            int64_t numel = 1;
            for (int d = 0; d < ndim; d++) numel *= shape[d];
            t->info.numel = numel;
            t->info.bytes = numel * (int64_t)ck_dtype_size(e->dtype);
            t->info.pieces = 1;
            snprintf(t->shape_text, sizeof t->shape_text, "%s", shape_text);
        } else if (t->info.dtype != e->dtype || strcmp(t->shape_text, shape_text))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint %s: pieces of '%s' disagree: %s with shape %s, and %s with shape %s (rank %d)",
                              g->stepdir, name, ck_dtype_name(t->info.dtype), t->shape_text,
                              ck_dtype_name(e->dtype), shape_text, rank);
        if (start > t->info.numel || e->shape[0] > t->info.numel - start)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint file %s: piece '%s' holds elements [%" PRId64 ", %" PRId64
                              ") of a tensor of %" PRId64,
                              file, e->name, start, start + e->shape[0], t->info.numel);
        ZOFF_TRY(add_piece(t, rank, e->name, start, e->shape[0], 0, e->shape[0]));
    }
    return ZOFF_OK;
}

zoff_status zoff_ckpt_gather_open(const char *path, zoff_ckpt_gather **out) {
    *out = NULL;
    zoff_ckpt_gather *g = calloc(1, sizeof *g);
    if (!g) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    g->part_params = -1;
    zoff_status s = zoff_ckpt_resolve(path, g->stepdir, sizeof g->stepdir, &g->step);
    zoff_ckpt_reader *r0 = NULL;
    if (s == ZOFF_OK) s = zoff_ckpt_open(g->stepdir, 0, &r0);
    if (s == ZOFF_OK) {
        g->nranks = zoff_ckpt_reader_nranks(r0);
        g->r = calloc((size_t)(g->nranks > 0 ? g->nranks : 1), sizeof *g->r);
        if (!g->r) {
            zoff_ckpt_close(r0);
            g->nranks = 0;
            s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
        } else {
            g->r[0] = r0;
        }
    }
    for (int k = 1; s == ZOFF_OK && k < g->nranks; k++) {
        s = zoff_ckpt_open(g->stepdir, k, &g->r[k]);
        if (s == ZOFF_OK && zoff_ckpt_reader_step(g->r[k]) != g->step)
            s = zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: rank %d's file is of step %" PRId64 ", not %" PRId64,
                           g->stepdir, k, zoff_ckpt_reader_step(g->r[k]), g->step);
    }
    for (int k = 0; s == ZOFF_OK && k < g->nranks; k++) s = gather_index_rank(g, k);
    for (size_t i = 0; s == ZOFF_OK && i < g->n; i++) { /* pieces cover [0, numel) exactly once */
        gather_tensor *t = &g->t[i];
        if (!t->info.pieces) continue;
        qsort(t->p, t->np, sizeof *t->p, cmp_piece);
        int64_t pos = 0;
        for (size_t k = 0; k < t->np && s == ZOFF_OK; k++) {
            if (t->p[k].start < pos)
                s = zoff_error(ZOFF_ERR_FORMAT,
                               "checkpoint %s: pieces of '%s' overlap: '%s' (rank %d) starts at element %" PRId64
                               " but the one before ends at %" PRId64,
                               g->stepdir, t->info.name, t->p[k].entry, t->p[k].rank, t->p[k].start, pos);
            else if (t->p[k].start > pos)
                s = zoff_error(ZOFF_ERR_FORMAT,
                               "checkpoint %s: elements [%" PRId64 ", %" PRId64 ") of '%s' are in no rank's file (a rank "
                               "file is missing pieces)",
                               g->stepdir, pos, t->p[k].start, t->info.name);
            pos = t->p[k].start + t->p[k].count;
        }
        if (s == ZOFF_OK && pos != t->info.numel)
            s = zoff_error(ZOFF_ERR_FORMAT,
                           "checkpoint %s: elements [%" PRId64 ", %" PRId64 ") of '%s' are in no rank's file", g->stepdir,
                           pos, t->info.numel, t->info.name);
        t->info.pieces = (int)(t->np > 0 ? t->np : 1);
    }
    if (s != ZOFF_OK) {
        zoff_ckpt_gather_close(g);
        return s;
    }
    *out = g;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_gather_read(zoff_ckpt_gather *g, const char *name, void *dst, size_t bytes) {
    gather_tensor *t = gfind(g, name);
    if (!t) return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s has no tensor '%s'", g->stepdir, name);
    if ((uint64_t)t->info.bytes != bytes)
        return zoff_error(ZOFF_ERR_INVALID, "checkpoint %s: '%s' is %" PRId64 " bytes; %zu requested", g->stepdir, name,
                          t->info.bytes, bytes);
    if (!t->info.pieces) return zoff_ckpt_read(g->r[t->rank], name, dst, bytes);
    size_t es = ck_dtype_size(t->info.dtype);
    for (size_t k = 0; k < t->np; k++) {
        const gather_piece *p = &t->p[k];
        uint8_t *d = (uint8_t *)dst + (size_t)p->start * es;
        if (p->src == 0 && p->count == p->entry_numel) ZOFF_TRY(zoff_ckpt_read(g->r[p->rank], p->entry, d, (size_t)p->count * es));
        else ZOFF_TRY(zoff_ckpt_read_range(g->r[p->rank], p->entry, p->src * (int64_t)es, d, (size_t)p->count * es));
    }
    return ZOFF_OK;
}
