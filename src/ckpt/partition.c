/* The "partition" blob of a rank file (include/zoff/ckpt.h, "Partitioned entries"): one writer
 * and one reader, used by the training checkpoints (src/train) and by the rank merge. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "zoff/ckpt.h"

char *zoff_ckpt_partition_json(int rank, int world, int64_t num_params, const int64_t *runs, size_t nruns) {
    json_t *arr = json_array();
    for (size_t k = 0; arr && k < nruns; k++)
        json_array_append_new(arr, json_pack("[I,I]", (json_int_t)runs[2 * k], (json_int_t)runs[2 * k + 1]));
    json_t *root = arr ? json_pack("{s:s,s:i,s:i,s:i,s:I,s:o}", "format", "zoff-partition", "version", 1, "rank",
                                   rank, "world_size", world, "num_params", (json_int_t)num_params, "runs", arr)
                       : NULL;
    char *txt = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return txt;
}

void zoff_ckpt_partition_free(zoff_ckpt_partition *p) {
    if (!p) return;
    free(p->runs);
    memset(p, 0, sizeof *p);
}

static bool u63(json_t *v, int64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (int64_t)json_integer_value(v);
    return true;
}

/* The runs of the parsed blob into out (num_params already set). */
static zoff_status parse_runs(json_t *jr, const char *file, zoff_ckpt_partition *out) {
    size_t n = json_array_size(jr);
    if (!(out->runs = malloc((2 * n + 2) * sizeof *out->runs)))
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition of %s", file);
    const int64_t P = out->num_params;
    for (size_t i = 0; i < n; i++) {
        json_t *run = json_array_get(jr, i);
        int64_t off, cnt;
        if (!json_is_array(run) || json_array_size(run) != 2 || !u63(json_array_get(run, 0), &off) ||
            !u63(json_array_get(run, 1), &cnt) || off > P || cnt > P - off)
            return zoff_error(ZOFF_ERR_FORMAT,
                              "checkpoint file %s: partition run %zu is not [offset, count] inside [0, %lld)", file, i,
                              (long long)P);
        out->runs[2 * i] = off;
        out->runs[2 * i + 1] = cnt;
    }
    out->nruns = n;
    return ZOFF_OK;
}

zoff_status zoff_ckpt_read_partition(zoff_ckpt_reader *r, int rank, zoff_ckpt_partition *out) {
    memset(out, 0, sizeof *out);
    const char *file = zoff_ckpt_reader_path(r);
    if (!zoff_ckpt_find(r, "partition")) return ZOFF_OK;
    char *txt = NULL;
    ZOFF_TRY(zoff_ckpt_read_blob(r, "partition", &txt, NULL));
    json_error_t jerr;
    json_t *root = json_loads(txt, JSON_REJECT_DUPLICATES, &jerr);
    free(txt);
    json_t *jr = json_object_get(root, "runs"), *jrank = json_object_get(root, "rank");
    const char *fmt = json_string_value(json_object_get(root, "format"));
    zoff_status s = ZOFF_OK;
    if (!root || !fmt || strcmp(fmt, "zoff-partition") || json_integer_value(json_object_get(root, "version")) != 1 ||
        !u63(json_object_get(root, "num_params"), &out->num_params) || !json_is_array(jr) ||
        (jrank && (!json_is_integer(jrank) || json_integer_value(jrank) != rank)))
        s = zoff_error(ZOFF_ERR_FORMAT,
                       "checkpoint file %s: the \"partition\" blob is not a zoff-partition version 1 object for rank "
                       "%d with num_params and runs",
                       file, rank);
    if (s == ZOFF_OK) s = parse_runs(jr, file, out);
    json_decref(root);
    if (s != ZOFF_OK) zoff_ckpt_partition_free(out);
    else out->present = true;
    return s;
}
