/* The safetensors format: reading (from a file or memory) and atomic writing. Format and rules:
 * include/zoff/safetensors.h. The GPT-2 name mapping is in safetensors_gpt2.c, the merge of a
 * checkpoint's rank files in gather.c. */
#define _GNU_SOURCE /* O_CLOEXEC */
#include "zoff/safetensors.h"
#include "ckpt_internal.h"
#include "zoff/aio.h"
#include "core/half_internal.h"
#include "core/file_internal.h"

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
#define ST_WBUF_BYTES ((size_t)8 << 20) /* writer staging buffer; each of the O_DIRECT ring's */
#define ST_RING 8                       /* O_DIRECT staging buffers: 64 MiB in flight while the caller computes */
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
    zoff_st_file **parts; /* a sharded model: its shard files (tensor.part indexes them); NULL: one file */
    size_t nparts;
};

void zoff_st_close(zoff_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    for (size_t i = 0; i < f->nparts; i++) zoff_st_close(f->parts[i]);
    free(f->parts);
    for (size_t i = 0; i < f->n; i++) free((char *)f->t[i].name);
    zoff_ckpt_free_pairs(f->meta_key, f->meta_val, f->nmeta);
    free(f->t);
    free(f->by_name);
    free(f->path);
    free(f);
}

const char *zoff_st_path(const zoff_st_file *f) { return f->path; }
int64_t zoff_st_file_bytes(const zoff_st_file *f) { return f->file_bytes; }
size_t zoff_st_num_tensors(const zoff_st_file *f) { return f->n; }
const zoff_st_tensor *zoff_st_tensor_at(const zoff_st_file *f, size_t i) { return i < f->n ? &f->t[i] : NULL; }
/* Whose metadata a handle shows: its own, or a sharded model's first shard's. */
static const zoff_st_file *meta_of(const zoff_st_file *f) { return f->nparts ? f->parts[0] : f; }

size_t zoff_st_num_metadata(const zoff_st_file *f) { return meta_of(f)->nmeta; }

void zoff_st_metadata_at(const zoff_st_file *f, size_t i, const char **key, const char **value) {
    f = meta_of(f);
    *key = i < f->nmeta ? f->meta_key[i] : NULL;
    *value = i < f->nmeta ? f->meta_val[i] : NULL;
}

const char *zoff_st_metadata(const zoff_st_file *f, const char *key) {
    f = meta_of(f);
    for (size_t i = 0; i < f->nmeta; i++)
        if (!strcmp(f->meta_key[i], key)) return f->meta_val[i];
    return NULL;
}

static const char *tensor_name(const void *t, size_t i) { return ((const zoff_st_tensor *)t)[i].name; }

const zoff_st_tensor *zoff_st_find(const zoff_st_file *f, const char *name) {
    ptrdiff_t i = zoff_ckpt_find_sorted(f->t, f->by_name, f->n, name, tensor_name);
    return i < 0 ? NULL : &f->t[i];
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
        if (!zoff_ckpt_json_u63(json_array_get(js, i), &t->shape[i]))
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
    if (json_array_size(jo) != 2 || !zoff_ckpt_json_u63(json_array_get(jo, 0), &begin) ||
        !zoff_ckpt_json_u63(json_array_get(jo, 1), &end))
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
                          zoff_ckpt_shape_str(t->ndim, t->shape, sb, sizeof sb), numel * es);
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
    uint64_t hlen = zoff_ckpt_get_u64(len8);
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

static bool is_index_path(const char *path) {
    size_t n = strlen(path), k = strlen(".index.json");
    return n > k && !strcmp(path + n - k, ".index.json");
}

/* A sharded model: its index (model.safetensors.index.json) and the shards it names. */
static zoff_status open_index(const char *path, zoff_st_file *f) {
    struct stat st;
    if (stat(path, &st) != 0)
        return zoff_error(zoff_status_of_path_errno(errno), "cannot open safetensors index %s: %s", path,
                          strerror(errno));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s: not valid JSON at line %d column %d: %s", path,
                          je.line, je.column, je.text);
    zoff_status s = ZOFF_OK;
    json_t *wm = json_object_get(root, "weight_map");
    const size_t nmap = json_is_object(wm) ? json_object_size(wm) : 0;
    if (nmap == 0)
        s = zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s: no \"weight_map\" of tensor names to shard files (not "
                                        "a Hugging Face model.safetensors.index.json?)", path);
    const char *shard[ZOFF_ST_MAX_SHARDS], *name;
    size_t nshard = 0;
    json_t *v;
    json_object_foreach(wm, name, v) {
        const char *file = json_string_value(v);
        if (s != ZOFF_OK) break;
        if (!file || !file[0] || strchr(file, '/') || is_index_path(file)) { /* not another index: no loops */
            s = zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s: tensor '%.*s' maps to %s; expected the name of a "
                                            "shard file beside the index", path, ST_NAME_SHOWN, name,
                           file ? file : "a value that is not a string");
            break;
        }
        size_t k = 0;
        while (k < nshard && strcmp(shard[k], file)) k++;
        if (k < nshard) continue;
        if (nshard == ZOFF_ST_MAX_SHARDS)
            s = zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s names more than %d shard files", path,
                           ZOFF_ST_MAX_SHARDS);
        else shard[nshard++] = file;
    }
    const char *slash = strrchr(path, '/');
    const int dirlen = slash ? (int)(slash - path) : 1;
    const char *dir = slash ? path : ".";
    if (s == ZOFF_OK && !(f->parts = calloc(nshard, sizeof *f->parts)))
        s = zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
    size_t total = 0;
    for (size_t k = 0; s == ZOFF_OK && k < nshard; k++) {
        char sp[4200];
        snprintf(sp, sizeof sp, "%.*s/%s", dirlen, dir, shard[k]);
        s = zoff_st_open(sp, &f->parts[k]);
        if (s != ZOFF_OK) s = zoff_error_context(s, "shard of %s", path);
        else f->nparts = k + 1, total += f->parts[k]->n, f->file_bytes += f->parts[k]->file_bytes;
    }
    if (s == ZOFF_OK && (!(f->t = calloc(total ? total : 1, sizeof *f->t)) ||
                         !(f->by_name = calloc(total ? total : 1, sizeof *f->by_name))))
        s = zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
    for (size_t k = 0; s == ZOFF_OK && k < f->nparts; k++) /* each tensor where the map says */
        for (size_t i = 0; s == ZOFF_OK && i < f->parts[k]->n; i++) {
            const zoff_st_tensor *t = &f->parts[k]->t[i];
            const char *mapped = json_string_value(json_object_get(wm, t->name));
            if (!mapped || strcmp(mapped, shard[k]))
                s = zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s: shard %s holds tensor '%.*s', which the index "
                                                "maps to %s", path, shard[k], ST_NAME_SHOWN, t->name,
                               mapped ? mapped : "no shard");
            else if (!(f->t[f->n].name = strdup(t->name)))
                s = zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
            else {
                const char *nm = f->t[f->n].name;
                f->t[f->n] = *t;
                f->t[f->n].name = nm;
                f->t[f->n++].part = (int)k;
            }
        }
    if (s == ZOFF_OK && f->n != nmap) /* a mapped tensor its shard does not hold (each is in at most one) */
        json_object_foreach(wm, name, v) {
            size_t k = 0;
            while (k < f->nparts && strcmp(shard[k], json_string_value(v))) k++;
            if (k < f->nparts && !zoff_st_find(f->parts[k], name)) {
                s = zoff_error(ZOFF_ERR_FORMAT, "safetensors index %s maps tensor '%.*s' to %s, which does not hold "
                                                "it", path, ST_NAME_SHOWN, name, json_string_value(v));
                break;
            }
        }
    json_decref(root);
    if (s != ZOFF_OK) return s;
    for (size_t i = 0; i < f->n; i++) f->by_name[i] = i;
    qsort_r(f->by_name, f->n, sizeof *f->by_name, cmp_by_name, f->t);
    return ZOFF_OK;
}

zoff_status zoff_st_open(const char *path, zoff_st_file **out) {
    *out = NULL;
    if (!path || !path[0]) return zoff_error(ZOFF_ERR_INVALID, "safetensors path is empty");
    if (is_index_path(path)) {
        zoff_st_file *f = calloc(1, sizeof *f);
        if (!f || !(f->path = strdup(path))) {
            free(f);
            return zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
        }
        f->fd = -1;
        zoff_status s = open_index(path, f);
        if (s != ZOFF_OK) {
            zoff_st_close(f);
            return s;
        }
        *out = f;
        return ZOFF_OK;
    }
    zoff_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory opening %s", path);
    }
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        int e = errno;
        zoff_st_close(f);
        return zoff_error(zoff_status_of_path_errno(e), "cannot open safetensors file %s: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        zoff_st_close(f);
        return zoff_error(ZOFF_ERR_INVALID, "safetensors file %s is not a regular file", path);
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

/* The file that holds tensor t: f, or the shard of a sharded model. */
static zoff_st_file *holder(zoff_st_file *f, const zoff_st_tensor *t) {
    return f->nparts && t->part >= 0 && (size_t)t->part < f->nparts ? f->parts[t->part] : f;
}

zoff_status zoff_st_read(zoff_st_file *f, const zoff_st_tensor *t, void *dst, size_t bytes) {
    if (!t) return zoff_error(ZOFF_ERR_INVALID, "zoff_st_read: tensor is NULL (%s)", f->path);
    if ((uint64_t)t->bytes != bytes)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors file %s: tensor '%.*s' is %" PRId64 " bytes; %zu requested",
                          f->path, ST_NAME_SHOWN, t->name, t->bytes, bytes);
    return st_pread(holder(f, t), dst, bytes, t->offset);
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
    return zoff_st_read_f32_range(f, t, 0, numel, dst);
}

zoff_status zoff_st_read_f32_range(zoff_st_file *f, const zoff_st_tensor *t, int64_t first, int64_t count, float *dst) {
    if (!t) return zoff_error(ZOFF_ERR_INVALID, "zoff_st_read_f32_range: tensor is NULL (%s)", f->path);
    if (first < 0 || count < 0 || first > t->numel || count > t->numel - first)
        return zoff_error(ZOFF_ERR_INVALID, "safetensors file %s: elements [%" PRId64 ", %" PRId64 ") of tensor '%.*s' "
                          "requested; it has %" PRId64, f->path, first, first + count, ST_NAME_SHOWN, t->name, t->numel);
    if (!zoff_st_dtype_is_float(t->dtype))
        return zoff_error(ZOFF_ERR_FORMAT, "safetensors file %s: tensor '%.*s' is %s; expected a float dtype (F32, "
                          "F16, BF16 or F64)", f->path, ST_NAME_SHOWN, t->name, zoff_st_dtype_name(t->dtype));
    size_t es = zoff_st_dtype_size(t->dtype);
    f = holder(f, t);
    if (t->dtype == ZOFF_ST_F32) return st_pread(f, dst, (size_t)count * es, t->offset + first * (int64_t)es);
    uint8_t *buf = malloc(ST_CONV_ELEMS * es);
    if (!buf) return zoff_error(ZOFF_ERR_NOMEM, "out of memory converting '%s'", t->name);
    zoff_status s = ZOFF_OK;
    for (int64_t i = 0; i < count && s == ZOFF_OK;) {
        size_t k = (uint64_t)(count - i) < ST_CONV_ELEMS ? (size_t)(count - i) : ST_CONV_ELEMS;
        s = st_pread(f, buf, k * es, t->offset + (first + i) * (int64_t)es);
        for (size_t j = 0; s == ZOFF_OK && j < k; j++) {
            uint16_t h;
            switch (t->dtype) {
            case ZOFF_ST_F16: memcpy(&h, buf + 2 * j, 2); dst[i + (int64_t)j] = zoff_f16_to_f32(h); break;
            case ZOFF_ST_BF16: memcpy(&h, buf + 2 * j, 2); dst[i + (int64_t)j] = zoff_half_bf16_to_f32(h); break;
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
    char *path, *tmp; /* the file, and the name it is written under until the commit */
    int fd;
    st_decl *d;
    size_t n, cap;
    char **mk, **mv;
    size_t nm, mcap;
    int64_t data_total, data_written;
    int64_t pos;          /* file offset of the next byte to write (after the buffer) */
    bool started, failed;
    uint8_t *buf; /* the buffer being filled: the pwrite path's, or ring[cur] */
    size_t blen;
    zoff_ckpt_fault fault; /* ZOFF_CKPT_FAULT */
    /* O_DIRECT (st_direct_open): each full ring buffer is written at pos by src/aio (io_uring)
     * while the caller fills the next (ZOFF_CKPT_FAULT applied by st_aio_fault); aio NULL: pwrite
     * through the page cache from the caller's thread (ZOFF_CKPT_IO=buffered, a file system
     * without O_DIRECT, no aio engine) */
    zoff_aio *aio;
    zoff_aio_file *af;
    uint8_t *ring[ST_RING];
    zoff_aio_request req[ST_RING];
    int cur;
    char io[400]; /* how the file is written (zoff_st_writer_io) */
};

/* A failed write of the file at offset `at` (e: its errno; 0: a short write). */
static zoff_status st_write_failed(const zoff_st_writer *w, int64_t at, int e) {
    if (!e)
        return zoff_error(ZOFF_ERR_IO, "short write to %s at offset %" PRId64 " (is the disk full?)", w->tmp, at);
    return zoff_error(ZOFF_ERR_IO, "cannot write %s at offset %" PRId64 ": %s%s", w->tmp, at, strerror(e),
                      zoff_write_hint(e));
}

/* Waits for every ring write; a failure is reported at the lowest offset that failed, worded as
 * the pwrite path words it. */
static zoff_status st_drain(zoff_st_writer *w) {
    int64_t first_at = -1;
    int first_e = 0;
    for (int i = 0; w->aio && i < ST_RING; i++) {
        zoff_aio_request *r = &w->req[i];
        if (zoff_aio_wait(w->aio, r) == ZOFF_OK) continue;
        int64_t at = r->seg[0].offset;
        int e = zoff_aio_request_errno(r, &at);
        if (first_at < 0 || at < first_at) {
            first_at = at;
            first_e = e;
        }
    }
    return first_at < 0 ? ZOFF_OK : st_write_failed(w, first_at, first_e);
}

static void st_direct_close(zoff_st_writer *w) {
    if (w->aio) (void)st_drain(w);
    zoff_aio_file_close(w->af);
    zoff_aio_destroy(w->aio);
    for (int i = 0; i < ST_RING; i++) zoff_aligned_free(w->ring[i]);
    if (w->aio) w->buf = NULL; /* it was a ring buffer */
    w->aio = NULL;
    w->af = NULL;
    memset(w->ring, 0, sizeof w->ring);
}

static void w_free(zoff_st_writer *w) {
    st_direct_close(w);
    zoff_temp_forget(w->tmp); /* renamed or removed by now */
    for (size_t i = 0; i < w->n; i++) free(w->d[i].name);
    zoff_ckpt_free_pairs(w->mk, w->mv, w->nm);
    ZOFF_FREE_ALL(w->d, w->buf, w->path, w->tmp, w);
}

/* ZOFF_CKPT_FAULT on the ring's writes (not the process-wide aio hook of the NVMe swap tests): a
 * write that reaches the fault's offset fails whole with its errno. */
static int64_t st_aio_fault(void *arg, const zoff_aio_fault_site *site) {
    const zoff_ckpt_fault *f = arg;
    return f->at >= 0 && site->offset + (int64_t)site->bytes > f->at ? -(int64_t)f->err : 0;
}

/* The O_DIRECT ring, where it can be (else w->aio stays NULL: the pwrite path), and the file's
 * `bytes` allocated ahead (fallocate: unwritten blocks, the size set), as the checkpoint writer
 * does (w_reserve in ckpt.c): a write within the file's size into allocated blocks is issued by
 * io_uring at once instead of by a kernel worker, and the ring's eight writes in flight do not
 * allocate piecemeal (measured here, a 0.5 GB export: 13 extents without, 4 with, 5 buffered). A
 * failure to allocate is left to the writes (which report a full disk as before). Only an invalid
 * ZOFF_CKPT_IO is an error. */
static zoff_status st_direct_open(zoff_st_writer *w, int64_t bytes) {
    bool buffered;
    ZOFF_TRY(zoff_ckpt_io_buffered(&buffered));
    snprintf(w->io, sizeof w->io, "pwrite, buffered (ZOFF_CKPT_IO=buffered)");
    if (buffered) return ZOFF_OK;
    zoff_aio_options o;
    zoff_aio_options_default(&o);
    o.block_size = (int64_t)ST_WBUF_BYTES; /* one request per buffer */
    o.queue_depth = ST_RING;
    o.fault = st_aio_fault;
    o.fault_arg = &w->fault;
    bool ok = true;
    for (int i = 0; i < ST_RING && ok; i++) {
        w->ring[i] = zoff_aligned_alloc(ZOFF_AIO_ALIGN, ST_WBUF_BYTES, "safetensors writer");
        ok = w->ring[i] && (zoff_aio_options_add_fixed(&o, w->ring[i], ST_WBUF_BYTES), true);
    }
    ok = ok && zoff_aio_create(&o, &w->aio) == ZOFF_OK && zoff_aio_file_open(w->aio, w->tmp, 0, &w->af) == ZOFF_OK;
    if (ok && !zoff_aio_file_direct(w->af))
        snprintf(w->io, sizeof w->io, "pwrite, buffered (%s)", zoff_aio_file_direct_note(w->af));
    else if (!ok)
        snprintf(w->io, sizeof w->io, "pwrite, buffered (%s)", zoff_last_error());
    else
        snprintf(w->io, sizeof w->io, "O_DIRECT, %d x %zu MiB in flight; %s", ST_RING, ST_WBUF_BYTES >> 20,
                 zoff_aio_describe(w->aio));
    if (!ok || !zoff_aio_file_direct(w->af)) { /* no ring, no aio engine, no O_DIRECT here: the pwrite path */
        st_direct_close(w);
        zoff_clear_error();
        return ZOFF_OK;
    }
    if (bytes > 0) (void)fallocate(w->fd, 0, 0, (off_t)bytes);
    w->cur = 0;
    w->buf = w->ring[0];
    w->blen = 0;
    return ZOFF_OK;
}

/* Write the first `bytes` (aligned) of ring[cur] at pos. */
static zoff_status st_submit(zoff_st_writer *w, size_t bytes) {
    zoff_aio_request *r = &w->req[w->cur];
    *r = (zoff_aio_request){.op = ZOFF_AIO_WRITE, .file = w->af, .nseg = 1,
                            .seg = {{.buf = w->buf, .offset = w->pos, .bytes = bytes}}};
    return zoff_aio_submit(w->aio, r);
}

/* ring[cur] is full: write it and go on with the next (once its previous write is done). */
static zoff_status st_next(zoff_st_writer *w) {
    ZOFF_TRY(st_submit(w, ST_WBUF_BYTES));
    w->pos += (int64_t)ST_WBUF_BYTES;
    w->cur = (w->cur + 1) % ST_RING;
    w->buf = w->ring[w->cur];
    w->blen = 0;
    return zoff_aio_wait(w->aio, &w->req[w->cur]) == ZOFF_OK ? ZOFF_OK : st_drain(w);
}

static void w_remove_tmp(zoff_st_writer *w) {
    if (w->fd >= 0) {
        (void)st_drain(w); /* nothing of the ring lands in the file after its name is gone */
        close(w->fd);
        w->fd = -1;
        unlink(w->tmp);
    }
}

const char *zoff_st_writer_io(const zoff_st_writer *w) { return w ? w->io : ""; }

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
    w->tmp = zoff_tmp_path(path);
    if (!w->path || !w->tmp) {
        w_free(w);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    }
    zoff_status s = zoff_ckpt_fault_from_env(&w->fault, "safetensors");
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
    size_t vcap = w->mcap; /* the two arrays grow together */
    if (!ZOFF_CKPT_GROW(w->mv, vcap, w->nm, 8) ||
        !ZOFF_CKPT_GROW(w->mk, w->mcap, w->nm, 8))
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
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
    if (!ZOFF_CKPT_GROW(w->d, w->cap, w->n, 64))
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
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
        ssize_t r = zoff_ckpt_fault_allows(&w->fault, at, &chunk) ? pwrite(w->fd, p + done, chunk, (off_t)at) : -1;
        if (r < 0) {
            if (errno == EINTR) continue;
            return st_write_failed(w, at, errno);
        }
        if (r == 0) return st_write_failed(w, at, 0);
        done += (size_t)r;
    }
    w->pos += (int64_t)n;
    return ZOFF_OK;
}

/* The pwrite path's buffer out; the ring's last, partial buffer out (its aligned part O_DIRECT,
 * then the rest through the page cache) and every ring write waited for. */
static zoff_status w_flush(zoff_st_writer *w) {
    if (w->aio) {
        size_t a = w->blen / ZOFF_AIO_ALIGN * ZOFF_AIO_ALIGN, tail = w->blen - a;
        zoff_status s = a ? st_submit(w, a) : ZOFF_OK, d = st_drain(w);
        if (s == ZOFF_OK) s = d;
        w->pos += (int64_t)a;
        w->blen = 0;
        return s == ZOFF_OK && tail ? w_write_raw(w, w->buf + a, tail) : s;
    }
    if (!w->blen) return ZOFF_OK;
    zoff_status s = w_write_raw(w, w->buf, w->blen);
    w->blen = 0;
    return s;
}

static zoff_status w_put(zoff_st_writer *w, const void *data, size_t n) {
    if (w->aio) {
        const uint8_t *p = data;
        while (n)
            if (zoff_ckpt_fill(w->buf, &w->blen, ST_WBUF_BYTES, &p, &n)) ZOFF_TRY(st_next(w));
        return ZOFF_OK;
    }
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
    zoff_temp_register(w->tmp); /* before it exists: a Ctrl-C removes it (forgotten in w_free) */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(txt);
        return zoff_error(zoff_status_of_path_errno(e),
                          "cannot create %s: %s (is the output directory there and writable?)", w->tmp,
                          strerror(e));
    }
    w->started = true;
    s = st_direct_open(w, (int64_t)(8 + padded) + w->data_total);
    if (s == ZOFF_OK && !w->aio && !(w->buf = malloc(ST_WBUF_BYTES))) s = zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    if (s == ZOFF_OK) s = w_put(w, len8, 8);
    if (s == ZOFF_OK) s = w_put(w, txt, hl);
    if (s == ZOFF_OK) s = w_put(w, "       ", padded - hl); /* spaces up to a multiple of 8 */
    free(txt);
    return s;
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
        else s = zoff_fsync_dir_of(w->path);
    }
    if (s != ZOFF_OK) w_remove_tmp(w);
    w_free(w);
    return s;
}
