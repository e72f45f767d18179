/* The training-checkpoint schema (include/zoff/train.h): weights, optimizer state partitions,
 * the "meta" blob, the config; saving over ranks and loading onto another number of ranks. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/half_internal.h"
#include "train/ckpt_internal.h"

/* ------------------------------------------------------------------ meta as JSON */

static json_t *loader_to_json(const zoff_loader_state *l) {
    char fp[32];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)l->fingerprint);
    json_t *o = json_object();
    json_object_set_new(o, "seed_lo", json_integer((json_int_t)(l->seed & 0xffffffffu)));
    json_object_set_new(o, "seed_hi", json_integer((json_int_t)(l->seed >> 32)));
    json_object_set_new(o, "epoch", json_integer((json_int_t)l->epoch));
    json_object_set_new(o, "window", json_integer((json_int_t)l->window));
    json_object_set_new(o, "seq_len", json_integer((json_int_t)l->seq_len));
    json_object_set_new(o, "num_windows", json_integer((json_int_t)l->num_windows));
    json_object_set_new(o, "fingerprint", json_string(fp));
    return o;
}

static json_t *settings_to_json(const zoff_train_settings *s) {
    return json_pack("{s:s,s:s,s:f,s:s,s:I,s:I,s:I,s:I,s:I,s:f}", "optimizer", s->optimizer, "precision",
                     s->precision, "lr", s->lr, "scheduler", s->scheduler, "warmup_steps",
                     (json_int_t)s->warmup_steps, "total_steps", (json_int_t)s->total_steps, "micro_batch",
                     (json_int_t)s->micro_batch, "accumulation", (json_int_t)s->accumulation, "world_size",
                     (json_int_t)s->world_size, "gradient_clipping", s->gradient_clipping);
}

char *train_meta_to_text(const zoff_train_meta *meta) {
    const zoff_gpt2_shape *sh = &meta->shape;
    json_t *root = json_pack(
        "{s:s,s:i,s:I,s:{s:I,s:I,s:I,s:I,s:I,s:I},s:I,s:s,s:I,s:I,s:o,s:{s:I,s:I,s:f,s:I,s:I,s:i},s:f}", "format",
        "zoff-train-state", "version", 1, "step", (json_int_t)meta->step, "model", "num_layers",
        (json_int_t)sh->num_layers, "hidden_size", (json_int_t)sh->hidden_size, "num_heads", (json_int_t)sh->num_heads,
        "max_seq_len", (json_int_t)sh->max_seq_len, "vocab_size", (json_int_t)sh->vocab_size, "padded_vocab_size",
        (json_int_t)sh->padded_vocab_size, "seq_len", (json_int_t)meta->seq_len, "tokenizer", meta->tokenizer,
        "seed_lo", (json_int_t)(meta->seed & 0xffffffffu), "seed_hi", (json_int_t)(meta->seed >> 32), "loader",
        loader_to_json(&meta->loader), "engine", "steps_taken", (json_int_t)meta->engine.steps_taken,
        "steps_skipped", (json_int_t)meta->engine.steps_skipped, "loss_scale", meta->engine.loss_scale, "scaler_iter",
        (json_int_t)meta->engine.scaler_iter, "last_overflow_iter", (json_int_t)meta->engine.last_overflow_iter,
        "hysteresis_left", meta->engine.hysteresis_left, "consumed_tokens", meta->consumed_tokens);
    if (root && meta->settings.known) json_object_set_new(root, "settings", settings_to_json(&meta->settings));
    if (root) json_object_set_new(root, "weights_pending", json_boolean(meta->weights_pending > 0));
    if (root && meta->engine.rollbacks)
        json_object_set_new(json_object_get(root, "engine"), "rollbacks", json_integer((json_int_t)meta->engine.rollbacks));
    char *txt = root ? json_dumps(root, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    return txt;
}

/* ------------------------------------------------------------------ saving */

/* This rank's partition runs [off0, cnt0, ...] (see include/zoff/ckpt.h, "Partitioned entries"). */
zoff_status train_partition_runs(zoff_engine *eng, int64_t **runs, int *nruns) {
    int nr = zoff_engine_partition(eng, NULL, NULL, 0);
    int64_t *off = malloc((size_t)(nr + 1) * sizeof *off), *cnt = malloc((size_t)(nr + 1) * sizeof *cnt);
    *runs = malloc((size_t)(2 * nr + 2) * sizeof **runs);
    zoff_status s = ZOFF_OK;
    if (!off || !cnt || !*runs) {
        free(*runs);
        *runs = NULL;
        s = zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the partition of a checkpoint");
    } else {
        zoff_engine_partition(eng, off, cnt, nr);
        for (int k = 0; k < nr; k++) {
            (*runs)[2 * k] = off[k];
            (*runs)[2 * k + 1] = cnt[k];
        }
        *nruns = nr;
    }
    free(off);
    free(cnt);
    return s;
}

/* ------------------------------------------------------------------ loading */

static zoff_status get_int(json_t *o, const char *key, const char *path, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata field '%s' is missing or not an integer", path,
                          key);
    *out = (int64_t)json_integer_value(v);
    return ZOFF_OK;
}

static void get_str(json_t *o, const char *key, char *dst, size_t cap, const char *dflt) {
    const char *v = json_string_value(json_object_get(o, key));
    snprintf(dst, cap, "%s", v ? v : dflt);
}

/* The optional "settings" object (checkpoints before it existed have none: known stays false). */
static void settings_from_json(json_t *sj, zoff_train_settings *s) {
    if (!json_is_object(sj)) return;
    s->known = true;
    get_str(sj, "optimizer", s->optimizer, sizeof s->optimizer, "?");
    get_str(sj, "precision", s->precision, sizeof s->precision, "?");
    get_str(sj, "scheduler", s->scheduler, sizeof s->scheduler, "?");
    s->lr = json_number_value(json_object_get(sj, "lr"));
    s->gradient_clipping = json_number_value(json_object_get(sj, "gradient_clipping"));
    s->warmup_steps = (int64_t)json_integer_value(json_object_get(sj, "warmup_steps"));
    s->total_steps = (int64_t)json_integer_value(json_object_get(sj, "total_steps"));
    s->micro_batch = (int64_t)json_integer_value(json_object_get(sj, "micro_batch"));
    s->accumulation = (int64_t)json_integer_value(json_object_get(sj, "accumulation"));
    s->world_size = (int64_t)json_integer_value(json_object_get(sj, "world_size"));
}

static zoff_status read_model(json_t *mo, const char *path, zoff_gpt2_shape *sh) {
    ZOFF_TRY(get_int(mo, "num_layers", path, &sh->num_layers));
    ZOFF_TRY(get_int(mo, "hidden_size", path, &sh->hidden_size));
    ZOFF_TRY(get_int(mo, "num_heads", path, &sh->num_heads));
    ZOFF_TRY(get_int(mo, "max_seq_len", path, &sh->max_seq_len));
    ZOFF_TRY(get_int(mo, "vocab_size", path, &sh->vocab_size));
    return get_int(mo, "padded_vocab_size", path, &sh->padded_vocab_size);
}

static zoff_status read_loader(json_t *lj, const char *path, zoff_loader_state *l) {
    int64_t lo = 0, hi = 0;
    ZOFF_TRY(get_int(lj, "seed_lo", path, &lo));
    ZOFF_TRY(get_int(lj, "seed_hi", path, &hi));
    l->seed = (uint64_t)lo | ((uint64_t)hi << 32);
    ZOFF_TRY(get_int(lj, "epoch", path, &l->epoch));
    ZOFF_TRY(get_int(lj, "window", path, &l->window));
    ZOFF_TRY(get_int(lj, "seq_len", path, &l->seq_len));
    ZOFF_TRY(get_int(lj, "num_windows", path, &l->num_windows));
    const char *fp = json_string_value(json_object_get(lj, "fingerprint"));
    l->fingerprint = fp ? strtoull(fp, NULL, 16) : 0;
    return ZOFF_OK;
}

static zoff_status read_engine(json_t *ej, const char *path, zoff_engine_scalars *e) {
    int64_t t = 0;
    ZOFF_TRY(get_int(ej, "steps_taken", path, &e->steps_taken));
    ZOFF_TRY(get_int(ej, "steps_skipped", path, &e->steps_skipped));
    ZOFF_TRY(get_int(ej, "scaler_iter", path, &e->scaler_iter));
    ZOFF_TRY(get_int(ej, "last_overflow_iter", path, &e->last_overflow_iter));
    ZOFF_TRY(get_int(ej, "hysteresis_left", path, &t));
    e->hysteresis_left = (int)t;
    e->loss_scale = json_number_value(json_object_get(ej, "loss_scale"));
    e->rollbacks = (int64_t)json_integer_value(json_object_get(ej, "rollbacks")); /* absent: none */
    return ZOFF_OK;
}

static zoff_status meta_from_json(json_t *root, zoff_ckpt_reader *r, zoff_train_meta *m) {
    const char *path = zoff_ckpt_reader_path(r);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    int64_t ver = 0, lo = 0, hi = 0;
    if (!fmt || strcmp(fmt, "zoff-train-state"))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: not a zoff training state", path);
    ZOFF_TRY(get_int(root, "version", path, &ver));
    if (ver != 1)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: training-state version %lld, this zoff reads version 1",
                          path, (long long)ver);
    json_t *mo = json_object_get(root, "model"), *lj = json_object_get(root, "loader"),
           *ej = json_object_get(root, "engine");
    if (!json_is_object(mo) || !json_is_object(lj) || !json_is_object(ej))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata lacks model/loader/engine sections", path);
    ZOFF_TRY(get_int(root, "step", path, &m->step));
    if (m->step != zoff_ckpt_reader_step(r))
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: its metadata says step %lld but the file is step %lld: %s",
                          path, (long long)m->step, (long long)zoff_ckpt_reader_step(r),
                          "the metadata does not belong to this checkpoint; use an earlier checkpoint");
    ZOFF_TRY(get_int(root, "seq_len", path, &m->seq_len));
    ZOFF_TRY(read_model(mo, path, &m->shape));
    ZOFF_TRY(get_int(root, "seed_lo", path, &lo));
    ZOFF_TRY(get_int(root, "seed_hi", path, &hi));
    m->seed = (uint64_t)lo | ((uint64_t)hi << 32);
    ZOFF_TRY(read_loader(lj, path, &m->loader));
    ZOFF_TRY(read_engine(ej, path, &m->engine));
    m->consumed_tokens = json_number_value(json_object_get(root, "consumed_tokens"));
    get_str(root, "tokenizer", m->tokenizer, sizeof m->tokenizer, "gpt2");
    settings_from_json(json_object_get(root, "settings"), &m->settings);
    json_t *wp = json_object_get(root, "weights_pending");
    m->weights_pending = json_is_boolean(wp) ? json_is_true(wp) : -1;
    return ZOFF_OK;
}

zoff_status zoff_train_ckpt_read_meta(zoff_ckpt_reader *r, zoff_train_meta *m, char **config_json) {
    memset(m, 0, sizeof *m);
    if (config_json) *config_json = NULL;
    char *txt = NULL;
    ZOFF_TRY(zoff_ckpt_read_blob(r, "meta", &txt, NULL));
    json_error_t jerr;
    json_t *root = json_loads(txt, 0, &jerr);
    free(txt);
    if (!root)
        return zoff_error(ZOFF_ERR_FORMAT, "checkpoint %s: metadata is not valid JSON (%s)", zoff_ckpt_reader_path(r),
                          jerr.text);
    zoff_status s = meta_from_json(root, r, m);
    json_decref(root);
    if (s == ZOFF_OK && config_json && zoff_ckpt_find(r, "config"))
        s = zoff_ckpt_read_blob(r, "config", config_json, NULL);
    return s;
}

zoff_status zoff_train_ckpt_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params) {
    return zoff_train_ckpt_read_weights_range(r, model, 0, zoff_gpt2_num_params(model), host_params);
}

zoff_status zoff_train_ckpt_read_weights_range(zoff_ckpt_reader *r, const zoff_gpt2 *model, int64_t lo, int64_t hi,
                                               float *dst) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(model, &nt);
    for (int i = 0; i < nt; i++) {
        int64_t a = t[i].offset > lo ? t[i].offset : lo, b = t[i].offset + t[i].numel < hi ? t[i].offset + t[i].numel : hi;
        if (a >= b) continue;
        float *d = dst + (a - lo);
        if (a == t[i].offset && b - a == t[i].numel) {
            ZOFF_TRY(zoff_ckpt_read_tensor(r, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape, d,
                                           (size_t)t[i].numel * sizeof(float)));
        } else {
            ZOFF_TRY(zoff_ckpt_check_tensor(r, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape));
            ZOFF_TRY(zoff_ckpt_read_range(r, t[i].name, (a - t[i].offset) * (int64_t)sizeof(float), d,
                                          (size_t)(b - a) * sizeof(float)));
        }
    }
    return ZOFF_OK;
}

/* The runs of rank file q: its "partition" blob, or [[0, n]] for a file without one (checkpoints
 * of one rank written before it existed). */
static zoff_status read_runs(zoff_ckpt_reader *r, int q, int64_t n, zoff_ckpt_partition *p) {
    ZOFF_TRY(zoff_ckpt_read_partition(r, q, p));
    if (!p->present) {
        if (!(p->runs = malloc(2 * sizeof *p->runs))) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
        p->runs[0] = 0;
        p->runs[1] = n;
        p->nruns = 1;
        p->num_params = n;
    }
    if (p->num_params != n) {
        zoff_status s = zoff_error(ZOFF_ERR_FORMAT,
                                   "checkpoint %s: the partition blob is for %lld parameters (the model has %lld)",
                                   zoff_ckpt_reader_path(r), (long long)p->num_params, (long long)n);
        zoff_ckpt_partition_free(p);
        return s;
    }
    return ZOFF_OK;
}

/* One rank file of the checkpoint being loaded: its reader and its runs. */
typedef struct rank_file {
    zoff_ckpt_reader *r;
    zoff_ckpt_partition p;
    int64_t total; /* elements of its runs */
    zoff_dtype dt; /* the array being read: fp32, or bf16 (m and v of bf16_optimizer_states) */
} rank_file;

/* Entry `name` of file f must hold its runs' values, fp32 or bf16 (checked once per array; sets f->dt). */
static zoff_status check_entry(rank_file *f, const char *name) {
    const zoff_ckpt_entry *en = zoff_ckpt_find(f->r, name);
    if (en && (en->dtype == ZOFF_F32 || en->dtype == ZOFF_BF16) &&
        en->bytes == f->total * (int64_t)zoff_dtype_size(en->dtype)) {
        f->dt = en->dtype;
        return ZOFF_OK;
    }
    return zoff_error(ZOFF_ERR_FORMAT,
                      "checkpoint %s: entry '%s' is missing or does not hold the %lld fp32 (or bf16) values its "
                      "partition describes",
                      zoff_ckpt_reader_path(f->r), name, (long long)f->total);
}

/* c bf16 values at p into c fp32 values at p (in place, back to front), exactly. */
static void widen_bf16(void *p, int64_t c) {
    for (int64_t k = c - 1; k >= 0; k--) {
        uint16_t h;
        memcpy(&h, (char *)p + 2 * k, sizeof h);
        float x = zoff_half_bf16_to_f32(h);
        memcpy((char *)p + 4 * k, &x, sizeof x);
    }
}

/* The part of entry `name` of file f that lies in the window [L, L + W) of this rank's partition
 * (its runs `mine` laid end to end) into buf (element L first), in dtype hdt: the file's (as
 * stored), or fp32 (bf16 widened); *covered += elements read. */
static zoff_status read_window(const rank_file *f, const char *name, const int64_t *mine, int nmine, int64_t L,
                               int64_t W, zoff_dtype hdt, void *buf, int64_t *covered) {
    const int64_t es = (int64_t)zoff_dtype_size(f->dt), hs = (int64_t)zoff_dtype_size(hdt);
    int64_t eo = 0; /* intersect each of their runs with each of mine, clipped to the window */
    for (size_t a = 0; a < f->p.nruns; a++) {
        int64_t o = f->p.runs[2 * a], c = f->p.runs[2 * a + 1], lo = 0;
        for (int b = 0; b < nmine; b++) {
            int64_t m = mine[2 * b], mc = mine[2 * b + 1];
            int64_t x = o > m ? o : m, y = o + c < m + mc ? o + c : m + mc;
            int64_t lx = lo + x - m, ly = lo + y - m; /* local positions of model [x, y) */
            if (lx < L) x += L - lx, lx = L;
            if (ly > L + W) ly = L + W;
            if (x < y && lx < ly) {
                char *to = (char *)buf + (lx - L) * hs;
                ZOFF_TRY(zoff_ckpt_read_range(f->r, name, (eo + x - o) * es, to, (size_t)((ly - lx) * es)));
                if (f->dt != hdt) widen_bf16(to, ly - lx);
                *covered += ly - lx;
            }
            lo += mc;
        }
        eo += c;
    }
    return ZOFF_OK;
}

/* Open the oldn rank files of the checkpoint r belongs to (files[0].r = r) and read their runs. */
static zoff_status open_rank_files(zoff_ckpt_reader *r, int64_t n, rank_file *files, int oldn) {
    char stepdir[4096];
    snprintf(stepdir, sizeof stepdir, "%s", zoff_ckpt_reader_path(r));
    char *slash = strrchr(stepdir, '/');
    if (slash) *slash = 0;
    for (int q = 0; q < oldn; q++) {
        if (q == 0) files[q].r = r;
        else ZOFF_TRY(zoff_ckpt_open(stepdir, q, &files[q].r));
        ZOFF_TRY(read_runs(files[q].r, q, n, &files[q].p));
        for (size_t a = 0; a < files[q].p.nruns; a++) files[q].total += files[q].p.runs[2 * a + 1];
    }
    return ZOFF_OK;
}

/* One optimizer state array k of this rank, window by window, from the rank files into the
 * engine (zoff_engine_state_range: in memory, on the device or in an NVMe swap file alike).
 * Where the file keeps the engine's dtype the values are copied as they are; else
 * (bf16.bf16_optimizer_states changed between the runs) bf16 widens to fp32 exactly, fp32 rounds
 * to nearest-even into bf16 state. */
static zoff_status read_state_array(rank_file *files, int oldn, zoff_engine *eng, int k, const int64_t *mine,
                                    int nmine, int64_t pn, float *buf, int64_t W) {
    const char *name = zoff_engine_state_name(eng, k);
    for (int q = 0; q < oldn; q++) ZOFF_TRY(check_entry(&files[q], name));
    if (oldn > 0 && files[0].dt != zoff_engine_state_dtype(eng, k))
        zoff_log(ZOFF_LOG_INFO,
                 "checkpoint %s: '%s' is stored in %s, this run keeps it in %s (bf16.bf16_optimizer_states, "
                 "offload_optimizer.ratio): %s",
                 zoff_ckpt_reader_path(files[0].r), name, zoff_dtype_name(files[0].dt),
                 zoff_dtype_name(zoff_engine_state_dtype(eng, k)),
                 files[0].dt == ZOFF_BF16 ? "widened exactly" : "rounded to nearest bf16");
    /* the rank files agree on the dtype (each rank's file is written with zoff_engine_state_dtype of the same
     * config); a file that does not is read through fp32 */
    zoff_dtype hdt = oldn > 0 ? files[0].dt : ZOFF_F32;
    for (int q = 0; q < oldn; q++)
        if (files[q].dt != hdt) hdt = ZOFF_F32;
    if (hdt != zoff_engine_state_dtype(eng, k)) hdt = ZOFF_F32;
    int64_t covered = 0, L = 0;
    do {
        int64_t w = pn - L < W ? pn - L : W;
        for (int q = 0; q < oldn; q++) ZOFF_TRY(read_window(&files[q], name, mine, nmine, L, w, hdt, buf, &covered));
        ZOFF_TRY(zoff_engine_state_range_as(eng, k, L, w, hdt, buf, false));
        L += w;
    } while (L < pn);
    /* the files are read in order (zoff_ckpt_reader_verify_in_order): each entry's CRC, over what this rank did
     * not read of it too, before anything trains on what was loaded */
    for (int q = 0; q < oldn; q++) ZOFF_TRY(zoff_ckpt_verify(files[q].r, name));
    if (covered != pn)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint %s: its %d rank file(s) hold %lld of the %lld values of '%s' this rank needs "
                          "(overlapping or missing partitions); the checkpoint is incomplete or corrupt",
                          zoff_ckpt_reader_path(files[0].r), oldn, (long long)covered, (long long)pn, name);
    return ZOFF_OK;
}

/* Resharding: this rank's partition of each optimizer state array is read from whichever rank
 * files of the checkpoint hold it, however many ranks wrote it, through one piece buffer. */
zoff_status zoff_train_ckpt_read_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t n) {
    int64_t pn = zoff_engine_partition_numel(eng);
    int64_t *mine = NULL;
    int nmine = 0, oldn = zoff_ckpt_reader_nranks(r);
    ZOFF_TRY(train_partition_runs(eng, &mine, &nmine));
    int64_t W = (int64_t)(zoff_train_ckpt_piece_bytes() / sizeof(float));
    float *buf = zoff_aligned_alloc(ZOFF_CKPT_ALIGN, (size_t)W * sizeof(float), "checkpoint piece buffer"); /* O_DIRECT */
    rank_file *files = calloc((size_t)(oldn > 0 ? oldn : 1), sizeof *files);
    zoff_status s = buf && files ? ZOFF_OK : ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) s = open_rank_files(r, n, files, oldn);
    for (int q = 0; s == ZOFF_OK && q < oldn; q++) zoff_ckpt_reader_verify_in_order(files[q].r, true); /* one pass */
    for (int k = 1; s == ZOFF_OK && k < zoff_engine_state_count(eng); k++)
        s = read_state_array(files, oldn, eng, k, mine, nmine, pn, buf, W);
    zoff_ckpt_reader_verify_in_order(r, false); /* the caller's, as it was */
    for (int q = 0; files && q < oldn; q++) {
        zoff_ckpt_partition_free(&files[q].p);
        if (q > 0) zoff_ckpt_close(files[q].r);
    }
    free(files);
    free(mine);
    zoff_aligned_free(buf);
    return s;
}

zoff_status zoff_train_ckpt_read_device_weights(zoff_ckpt_reader *r, zoff_engine *eng, int64_t n, bool *restored) {
    ZOFF_TRY(zoff_engine_mark_weights_pending(eng, restored));
    if (!*restored) return ZOFF_OK;
    const int64_t shape[1] = {n};
    const size_t es = zoff_dtype_size(zoff_engine_dtype(eng));
    ZOFF_TRY(zoff_ckpt_check_tensor(r, ZOFF_TRAIN_DEVICE_WEIGHTS, zoff_engine_dtype(eng), 1, shape));
    const int64_t W = (int64_t)(zoff_train_ckpt_piece_bytes() / es);
    void *buf = zoff_aligned_alloc(ZOFF_CKPT_ALIGN, (size_t)(n < W ? n : W) * es, "checkpoint piece buffer");
    zoff_status s = buf ? ZOFF_OK : ZOFF_ERR_NOMEM;
    for (int64_t a = 0; s == ZOFF_OK && a < n; a += W) {
        int64_t c = n - a < W ? n - a : W;
        s = zoff_ckpt_read_range(r, ZOFF_TRAIN_DEVICE_WEIGHTS, a * (int64_t)es, buf, (size_t)c * es);
        if (s == ZOFF_OK) s = zoff_engine_device_weights(eng, a, c, buf, false);
    }
    zoff_aligned_free(buf);
    return s;
}
