/* The merge of a checkpoint's rank files into whole tensors (zoff_ckpt_gather_*, the
 * zero_to_fp32 step). Rules:
 * include/zoff/safetensors.h, "Partitioned checkpoints", and include/zoff/ckpt.h. */
#include "zoff/safetensors.h"
#include "ckpt_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    if (!ZOFF_CKPT_GROW(g->t, g->cap, g->n, 64)) return NULL;
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
    if (!ZOFF_CKPT_GROW(t->p, t->pcap, t->np, 4))
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
    gather_piece *p = &t->p[t->np++];
    p->rank = rank;
    snprintf(p->entry, sizeof p->entry, "%s", entry);
    p->start = start;
    p->count = count;
    p->src = src;
    p->entry_numel = entry_numel;
    return ZOFF_OK;
}

/* The partition blob of rank file `rank` (zoff_ckpt_read_partition, src/ckpt/partition.c);
 * every rank's blob must give the same num_params. */
static zoff_status read_partition_blob(zoff_ckpt_gather *g, int rank, zoff_ckpt_partition *part) {
    ZOFF_TRY(zoff_ckpt_read_partition(g->r[rank], rank, part));
    if (!part->present) return ZOFF_OK;
    if (g->part_params >= 0 && g->part_params != part->num_params) {
        int64_t P = part->num_params;
        zoff_ckpt_partition_free(part);
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint %s: the partition blobs disagree on num_params (%" PRId64 " and %" PRId64
                          " in rank %d's file)",
                          g->stepdir, g->part_params, P, rank);
    }
    g->part_params = part->num_params;
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
                          file, e->name, zoff_ckpt_shape_str(e->ndim, e->shape, sa, sizeof sa), total);
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
        t->info.bytes = P * (int64_t)zoff_ckpt_dtype_bytes(e->dtype);
        t->info.pieces = 1;
        snprintf(t->shape_text, sizeof t->shape_text, "%s", shape_text);
    } else if (t->info.dtype != e->dtype || strcmp(t->shape_text, shape_text))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: the parts of '%s' disagree (%s [%s] and %s [%s] in rank %d's file)",
                          g->stepdir, e->name, zoff_ckpt_dtype_str(t->info.dtype), t->shape_text, zoff_ckpt_dtype_str(e->dtype),
                          shape_text, rank);
    int64_t src = 0;
    for (size_t i = 0; i < nruns; i++) {
        ZOFF_TRY(add_piece(t, rank, e->name, runs[2 * i], runs[2 * i + 1], src, total));
        src += runs[2 * i + 1];
    }
    return ZOFF_OK;
}

static zoff_status gather_index_rank(zoff_ckpt_gather *g, int rank) {
    zoff_ckpt_partition part;
    ZOFF_TRY(read_partition_blob(g, rank, &part));
    zoff_status s = ZOFF_OK;
    zoff_ckpt_reader *r = g->r[rank];
    for (size_t i = 0; part.present && s == ZOFF_OK && i < zoff_ckpt_num_entries(r); i++) {
        const zoff_ckpt_entry *e = zoff_ckpt_entry_at(r, i);
        if (e->dtype != ZOFF_CKPT_RAW && !strchr(e->name, '@') && !strncmp(e->name, "optimizer.", 10))
            s = index_run_entry(g, rank, e, part.runs, part.nruns, part.num_params);
    }
    zoff_ckpt_partition_free(&part);
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
                if (t->info.dtype != e->dtype || !zoff_ckpt_same_shape(t->info.ndim, t->info.shape, e->ndim, e->shape) ||
                    t->crc != e->crc32c)
                    return zoff_error(ZOFF_ERR_FORMAT,
                                      "checkpoint %s: ranks %d and %d both hold '%s' but disagree (%s %s vs %s %s, or "
                                      "different data)",
                                      g->stepdir, t->rank, rank, e->name, zoff_ckpt_dtype_str(t->info.dtype),
                                      zoff_ckpt_shape_str(t->info.ndim, t->info.shape, sa, sizeof sa), zoff_ckpt_dtype_str(e->dtype),
                                      zoff_ckpt_shape_str(e->ndim, e->shape, sb, sizeof sb));
                continue;
            }
            if (!(t = gadd(g, e->name))) return zoff_error(ZOFF_ERR_NOMEM, "out of memory");
            t->info.dtype = e->dtype;
            t->info.ndim = e->ndim;
            memcpy(t->info.shape, e->shape, sizeof t->info.shape);
            t->info.bytes = e->bytes;
            t->info.numel = e->bytes / (int64_t)zoff_ckpt_dtype_bytes(e->dtype);
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
                              zoff_ckpt_shape_str(e->ndim, e->shape, sa, sizeof sa));
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
            t->info.bytes = numel * (int64_t)zoff_ckpt_dtype_bytes(e->dtype);
            t->info.pieces = 1;
            snprintf(t->shape_text, sizeof t->shape_text, "%s", shape_text);
        } else if (t->info.dtype != e->dtype || strcmp(t->shape_text, shape_text))
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint %s: pieces of '%s' disagree: %s with shape %s, and %s with shape %s (rank %d)",
                              g->stepdir, name, zoff_ckpt_dtype_str(t->info.dtype), t->shape_text,
                              zoff_ckpt_dtype_str(e->dtype), shape_text, rank);
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
    size_t es = zoff_ckpt_dtype_bytes(t->info.dtype);
    for (size_t k = 0; k < t->np; k++) {
        const gather_piece *p = &t->p[k];
        uint8_t *d = (uint8_t *)dst + (size_t)p->start * es;
        if (p->src == 0 && p->count == p->entry_numel) ZOFF_TRY(zoff_ckpt_read(g->r[p->rank], p->entry, d, (size_t)p->count * es));
        else ZOFF_TRY(zoff_ckpt_read_range(g->r[p->rank], p->entry, p->src * (int64_t)es, d, (size_t)p->count * es));
    }
    return ZOFF_OK;
}
