/* Private to src/ckpt: what the .zckpt container (ckpt.c), the safetensors format
 * (safetensors.c), the GPT-2 name mapping (safetensors_gpt2.c) and the rank merge (gather.c)
 * share. src/ckpt needs only src/core, src/aio (the .zckpt writer) and jansson (the fuzzing
 * build links just those). */
#ifndef ZOFF_CKPT_INTERNAL_H
#define ZOFF_CKPT_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "zoff/ckpt.h"
#include "zoff/safetensors.h"

/* ---- the fault-injection seam of every file src/ckpt writes ----
 *
 * ZOFF_CKPT_FAULT=<ENOSPC|EIO>@<offset> (ckpt.h): a write that reaches byte <offset> of a
 * checkpoint or safetensors file writes the bytes before it (a short write, as a filling disk
 * does) and the next write fails with that errno. */
typedef struct zoff_ckpt_fault {
    int64_t at; /* -1: no fault */
    int err;
} zoff_ckpt_fault;

/* Reads ZOFF_CKPT_FAULT into *f (at = -1 when unset). `files` names what will fail in the
 * warning that is logged ("checkpoint", "safetensors"). A malformed value is ZOFF_ERR_INVALID. */
zoff_status zoff_ckpt_fault_from_env(zoff_ckpt_fault *f, const char *files);

/* Applies f to a write of *chunk bytes at file offset pos: false (errno set to the fault's)
 * when the write must fail now; otherwise true, with *chunk cut to end at the fault offset. */
bool zoff_ckpt_fault_allows(const zoff_ckpt_fault *f, int64_t pos, size_t *chunk);

/* ---- small shared helpers ---- */

/* The writers' staging step: copies what fits of the n bytes at *src into buf after its *len bytes
 * (cap in all), advancing *src, *n and *len; true when buf is then full. */
static inline bool zoff_ckpt_fill(uint8_t *buf, size_t *len, size_t cap, const uint8_t **src, size_t *n) {
    size_t k = cap - *len < *n ? cap - *len : *n;
    memcpy(buf + *len, *src, k);
    *len += k;
    *src += k;
    *n -= k;
    return *len == cap;
}

/* Little-endian 64-bit load. */
static inline uint64_t zoff_ckpt_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline bool zoff_ckpt_same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
    if (na != nb) return false;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return false;
    return true;
}

/* Room for one more item in a growing array of `size`-byte items: when n == *cap, doubles *cap
 * (first: `first`) and returns the reallocated array; NULL when out of memory (the array and
 * *cap are kept). ZOFF_CKPT_GROW(arr, cap, n, first) does it in place and says whether it could. */
void *zoff_ckpt_grow(void *items, size_t *cap, size_t n, size_t size, size_t first);
#define ZOFF_CKPT_GROW(arr, cap, n, first)                                                \
    __extension__({                                                                       \
        void *zoff_grown_ = zoff_ckpt_grow((arr), &(cap), (n), sizeof *(arr), (first));   \
        if (zoff_grown_) (arr) = zoff_grown_;                                             \
        zoff_grown_ != NULL;                                                              \
    })

/* The item called `name` among n items whose indices `order` lists sorted by name (name_of(items,
 * i) is item i's name): its index, or -1. */
ptrdiff_t zoff_ckpt_find_sorted(const void *items, const size_t *order, size_t n, const char *name,
                                const char *(*name_of)(const void *items, size_t i));

/* Frees n key/value string pairs and both arrays. */
void zoff_ckpt_free_pairs(char **keys, char **values, size_t n);

/* "[50304, 768]" into buf; returns buf. */
const char *zoff_ckpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

/* Bytes per element of a checkpoint entry's dtype (1 for ZOFF_CKPT_RAW) and its name. */
int64_t zoff_ckpt_dtype_bytes(zoff_dtype dt);
const char *zoff_ckpt_dtype_str(zoff_dtype dt);

/* F32, F16, BF16 or F64: what GPT-2 import converts to fp32. */
static inline bool zoff_st_dtype_is_float(zoff_st_dtype dt) {
    return dt == ZOFF_ST_F32 || dt == ZOFF_ST_F16 || dt == ZOFF_ST_BF16 || dt == ZOFF_ST_F64;
}

/* A non-negative JSON integer. */
bool zoff_ckpt_json_u63(json_t *v, int64_t *out);

#endif
