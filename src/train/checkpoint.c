/* The training-checkpoint schema (include/zoff/train.h): weights, optimizer state partitions,
 * the "meta" blob, the config; saving over ranks and loading onto another number of ranks. */
#define _GNU_SOURCE
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
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
    if (l->contents) {
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)l->contents);
        json_object_set_new(o, "contents", json_string(fp));
    }
    return o;
}

/* A shard's path resolved (links, "..", relative to the working directory), else as opened. */
static void shard_real_path(const zoff_shard *sh, char *out, size_t cap) {
    char *rp = realpath(zoff_shard_path(sh), NULL);
    snprintf(out, cap, "%s", rp ? rp : zoff_shard_path(sh));
    free(rp);
}

/* [[path, tokens], ...] of the training shards (NULL: too many to record, or none given). */
static json_t *shards_to_json(const zoff_dataset *ds) {
    int n = ds ? zoff_dataset_num_shards(ds) : 0;
    if (n == 0 || n > ZOFF_TRAIN_SHARDS_MAX) return NULL;
    json_t *a = json_array();
    char path[4096];
    for (int i = 0; a && i < n; i++) {
        const zoff_shard *sh = zoff_dataset_shard(ds, i);
        shard_real_path(sh, path, sizeof path);
        json_array_append_new(a, json_pack("[s,I]", path, (json_int_t)zoff_shard_num_tokens(sh)));
    }
    return a;
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
    if (root && meta->data_path[0]) json_object_set_new(root, "data_path", json_string(meta->data_path));
    if (root && meta->val_path[0]) json_object_set_new(root, "val_path", json_string(meta->val_path));
    json_t *shards = root ? shards_to_json(meta->shards) : NULL;
    if (shards) json_object_set_new(root, "shards", shards);
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
    const char *ct = json_string_value(json_object_get(lj, "contents")); /* absent: an older checkpoint */
    l->contents = ct ? strtoull(ct, NULL, 16) : 0;
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
    get_str(root, "data_path", m->data_path, sizeof m->data_path, "");
    get_str(root, "val_path", m->val_path, sizeof m->val_path, "");
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

/* One change into out (", " between changes; "..." once the room is spent). */
static void add_change(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add_change(char *out, size_t cap, const char *fmt, ...) {
    char item[4200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(item, sizeof item, fmt, ap);
    va_end(ap);
    size_t len = strlen(out);
    if (len + strlen(item) + 8 >= cap) {
        if (len + 4 < cap && (len < 3 || strcmp(out + len - 3, "...") != 0)) snprintf(out + len, cap - len, "...");
        return;
    }
    snprintf(out + len, cap - len, "%s%s", len ? ", " : "", item);
}

void zoff_train_ckpt_shard_changes(zoff_ckpt_reader *r, const zoff_dataset *ds, char *out, size_t cap) {
    out[0] = '\0';
    char *txt = NULL;
    if (zoff_ckpt_read_blob(r, "meta", &txt, NULL) != ZOFF_OK) return;
    json_t *root = json_loads(txt, 0, NULL);
    free(txt);
    json_t *rec = json_object_get(root, "shards");
    const int n = zoff_dataset_num_shards(ds);
    char **now = json_is_array(rec) ? calloc((size_t)n + 1, sizeof *now) : NULL; /* resolved paths */
    bool *seen = now ? calloc((size_t)n + 1, sizeof *seen) : NULL;
    for (int i = 0; seen && i < n; i++) {
        const char *p = zoff_shard_path(zoff_dataset_shard(ds, i));
        if (!(now[i] = realpath(p, NULL)) && !(now[i] = strdup(p))) {
            free(seen);
            seen = NULL; /* out of memory: nothing said */
        }
    }
    for (size_t k = 0; seen && k < json_array_size(rec); k++) {
        json_t *e = json_array_get(rec, k);
        const char *p = json_string_value(json_array_get(e, 0));
        json_int_t was = json_integer_value(json_array_get(e, 1));
        int i = 0;
        while (p && i < n && (seen[i] || strcmp(now[i], p) != 0)) i++;
        if (!p) continue;
        if (i == n) {
            add_change(out, cap, "removed %s (%lld tokens)", p, (long long)was);
            continue;
        }
        seen[i] = true;
        int64_t has = zoff_shard_num_tokens(zoff_dataset_shard(ds, i));
        if (has != was) add_change(out, cap, "%s resized to %lld tokens from %lld", p, (long long)has, (long long)was);
    }
    for (int i = 0; seen && i < n; i++)
        if (!seen[i])
            add_change(out, cap, "added %s (%lld tokens)", now[i],
                       (long long)zoff_shard_num_tokens(zoff_dataset_shard(ds, i)));
    free(seen);
    for (int i = 0; now && i < n; i++) free(now[i]);
    free(now);
    json_decref(root);
}

/* ------------------------------------------------------------------ the load's pipeline */

/* A load streams each array through two piece buffers (zoff_train_ckpt_load_bytes): a helper thread
 * fills piece p (reads it, O_DIRECT where aligned: zoff_ckpt_read_range_unchecked) while the caller's
 * thread checks piece p - 1 (zoff_ckpt_checksum_range, in the order read) and hands it on (into the
 * model's weights, the engine's state, the device), so that the disk's reads overlap the CRC and the
 * copies instead of alternating with them (docs/performance.md). */
typedef zoff_status (*piece_fn)(void *ctx, int64_t p, void *buf);

typedef struct load_pipe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t np, filled, used; /* pieces [0, filled) read, [0, used) handed on */
    bool quit;                /* the caller's side failed: read no more */
    zoff_status fs;           /* the helper's failure and its message (thread-local there) */
    char msg[1024];
    piece_fn fill;
    void *ctx;
    void *buf[2];
} load_pipe;

static void *pipe_main(void *arg) {
    load_pipe *q = arg;
    for (int64_t p = 0; p < q->np; p++) {
        pthread_mutex_lock(&q->mu);
        while (!q->quit && p - q->used >= 2) pthread_cond_wait(&q->cv, &q->mu); /* its buffer is still in use */
        bool quit = q->quit;
        pthread_mutex_unlock(&q->mu);
        if (quit) break;
        zoff_status s = q->fill(q->ctx, p, q->buf[p % 2]);
        pthread_mutex_lock(&q->mu);
        if (s == ZOFF_OK) q->filled = p + 1;
        else {
            q->fs = s;
            snprintf(q->msg, sizeof q->msg, "%s", zoff_last_error());
        }
        pthread_cond_broadcast(&q->cv);
        pthread_mutex_unlock(&q->mu);
        if (s != ZOFF_OK) break;
    }
    return NULL;
}

/* Pieces 0 .. np - 1: fill(p) on the helper thread, then use(p) on this one, in order. One piece, or
 * no thread to be had: one after the other on this thread. The first failure stops both sides and is
 * returned with its message. */
static zoff_status pipe_run(int64_t np, void *const buf[2], piece_fn fill, piece_fn use, void *ctx) {
    load_pipe q = {.np = np, .fill = fill, .ctx = ctx, .buf = {buf[0], buf[1]}};
    pthread_t th;
    bool threaded = np > 1 && pthread_mutex_init(&q.mu, NULL) == 0;
    if (threaded && pthread_cond_init(&q.cv, NULL) != 0) {
        pthread_mutex_destroy(&q.mu);
        threaded = false;
    }
    if (threaded && pthread_create(&th, NULL, pipe_main, &q) != 0) {
        pthread_cond_destroy(&q.cv);
        pthread_mutex_destroy(&q.mu);
        threaded = false;
    }
    zoff_status s = ZOFF_OK;
    if (!threaded) {
        for (int64_t p = 0; p < np && s == ZOFF_OK; p++) {
            s = fill(ctx, p, buf[0]);
            if (s == ZOFF_OK) s = use(ctx, p, buf[0]);
        }
        return s;
    }
    for (int64_t p = 0; p < np && s == ZOFF_OK; p++) {
        pthread_mutex_lock(&q.mu);
        while (q.filled <= p && q.fs == ZOFF_OK) pthread_cond_wait(&q.cv, &q.mu);
        bool ready = q.filled > p;
        pthread_mutex_unlock(&q.mu);
        if (!ready) break; /* the helper failed */
        s = use(ctx, p, buf[p % 2]);
        pthread_mutex_lock(&q.mu);
        q.used = p + 1;
        if (s != ZOFF_OK) q.quit = true;
        pthread_cond_broadcast(&q.cv);
        pthread_mutex_unlock(&q.mu);
    }
    pthread_join(th, NULL);
    pthread_cond_destroy(&q.cv);
    pthread_mutex_destroy(&q.mu);
    if (s == ZOFF_OK && q.fs != ZOFF_OK) s = zoff_error(q.fs, "%s", q.msg);
    return s;
}

/* The pipeline's two buffers of `bytes` each, aligned for O_DIRECT (ZOFF_CKPT_ALIGN); NULL on failure. */
static bool pipe_buffers(void *buf[2], size_t bytes) {
    const size_t A = ZOFF_CKPT_ALIGN;
    bytes = (bytes + A - 1) / A * A; /* aligned_alloc: a multiple of the alignment */
    buf[0] = zoff_aligned_alloc(A, bytes, "checkpoint piece buffer");
    buf[1] = buf[0] ? zoff_aligned_alloc(A, bytes, "checkpoint piece buffer") : NULL;
    if (buf[1]) return true;
    zoff_aligned_free(buf[0]);
    buf[0] = NULL;
    return false;
}

/* Piece p of n elements cut into pieces of W: its element count. */
static int64_t piece_len(int64_t p, int64_t W, int64_t n) { return n - p * W < W ? n - p * W : W; }

/* The pipeline's buffer bytes for n elements of es bytes in pieces of W (at least one element). */
static size_t pieces_bytes(int64_t n, int64_t W, size_t es) { return (size_t)(n < W ? (n > 0 ? n : 1) : W) * es; }

static void pipe_buffers_free(void *buf[2]) {
    zoff_aligned_free(buf[0]);
    zoff_aligned_free(buf[1]);
}

/* ------------------------------------------------------------------ weights */

/* A part of a weights piece: model elements [a, b) of tensor i at byte `at` of the piece buffer (each
 * part starts ZOFF_CKPT_ALIGN-aligned there, and a tensor's parts at whole pieces of it, so that they
 * are read past the page cache). */
typedef struct wpart {
    int i;
    int64_t a, b;
    size_t at;
} wpart;

typedef struct weights_job {
    zoff_ckpt_reader *r;
    const zoff_tensor_info *t;
    wpart *part;
    int64_t *first; /* piece p: parts [first[p], first[p + 1]) */
    int64_t lo;
    float *dst;
} weights_job;

/* Piece p's parts: read (check false), or checked and copied into dst (check true). */
static zoff_status weights_piece(const weights_job *j, int64_t p, void *buf, bool check) {
    for (int64_t k = j->first[p]; k < j->first[p + 1]; k++) {
        const wpart *g = &j->part[k];
        const zoff_tensor_info *t = &j->t[g->i];
        const int64_t off = (g->a - t->offset) * (int64_t)sizeof(float);
        const size_t bytes = (size_t)(g->b - g->a) * sizeof(float);
        char *at = (char *)buf + g->at;
        if (!check) {
            ZOFF_TRY(zoff_ckpt_read_range_unchecked(j->r, t->name, off, at, bytes));
            continue;
        }
        ZOFF_TRY(zoff_ckpt_checksum_range(j->r, t->name, off, at, bytes));
        memcpy(j->dst + (g->a - j->lo), at, bytes);
    }
    return ZOFF_OK;
}

static zoff_status weights_fill(void *ctx, int64_t p, void *buf) { return weights_piece(ctx, p, buf, false); }
static zoff_status weights_use(void *ctx, int64_t p, void *buf) { return weights_piece(ctx, p, buf, true); }

zoff_status zoff_train_ckpt_read_weights(zoff_ckpt_reader *r, const zoff_gpt2 *model, float *host_params) {
    return zoff_train_ckpt_read_weights_range(r, model, 0, zoff_gpt2_num_params(model), host_params);
}

/* The tensors' parts in the model range [lo, hi), a piece at a time (tensors in model order, each cut into
 * pieces of at most one buffer; small ones share a piece), read in order: each tensor's CRC is carried
 * along as it is read and compared at its end, or, for a tensor the range cuts, over the rest of it at
 * the end (zoff_ckpt_verify), before this returns. */
zoff_status zoff_train_ckpt_read_weights_range(zoff_ckpt_reader *r, const zoff_gpt2 *model, int64_t lo, int64_t hi,
                                               float *dst) {
    int nt = 0;
    const zoff_tensor_info *t = zoff_gpt2_tensors(model, &nt);
    const size_t A = ZOFF_CKPT_ALIGN, PB = zoff_train_ckpt_piece_bytes(), f4 = sizeof(float);
    const int64_t W = (int64_t)(PB / f4);
    for (int i = 0; i < nt; i++)
        if (t[i].offset < hi && t[i].offset + t[i].numel > lo)
            ZOFF_TRY(zoff_ckpt_check_tensor(r, t[i].name, ZOFF_F32, t[i].ndim, t[i].shape));
    const int64_t cap = nt + (hi - lo) / W + 2;
    weights_job j = {.r = r, .t = t, .part = malloc((size_t)cap * sizeof(wpart)),
                     .first = malloc((size_t)(cap + 1) * sizeof(int64_t)), .lo = lo, .dst = dst};
    void *buf[2] = {NULL, NULL};
    if (!j.part || !j.first) {
        free(j.part);
        free(j.first);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory loading the weights of %s", zoff_ckpt_reader_path(r));
    }
    int64_t nparts = 0, np = 0;
    size_t at = PB, need = 0; /* the current piece's end; the most any piece holds */
    for (int i = 0; i < nt; i++) {
        int64_t a = t[i].offset > lo ? t[i].offset : lo, b = t[i].offset + t[i].numel < hi ? t[i].offset + t[i].numel : hi;
        for (; a < b; a += W) {
            int64_t c = b - a < W ? b - a : W;
            size_t from = (at + A - 1) / A * A;
            if (from + (size_t)c * f4 > PB) { /* a new piece */
                j.first[np++] = nparts;
                from = 0;
            }
            j.part[nparts++] = (wpart){.i = i, .a = a, .b = a + c, .at = from};
            at = from + (size_t)c * f4;
            need = at > need ? at : need;
        }
    }
    j.first[np] = nparts;
    zoff_status s = ZOFF_OK;
    if (np > 0 && !pipe_buffers(buf, need)) s = ZOFF_ERR_NOMEM;
    bool was = zoff_ckpt_reader_verify_in_order(r, true);
    if (s == ZOFF_OK) s = pipe_run(np, buf, weights_fill, weights_use, &j);
    for (int i = 0; s == ZOFF_OK && i < nt; i++) /* a tensor the range cuts: the rest of its CRC */
        if (t[i].offset < hi && t[i].offset + t[i].numel > lo) s = zoff_ckpt_verify(r, t[i].name);
    zoff_ckpt_reader_verify_in_order(r, was);
    pipe_buffers_free(buf);
    free(j.part);
    free(j.first);
    return s;
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
 * (its runs `mine` laid end to end) into buf (element L first), as stored, *covered += elements
 * read (check false); or the same ranges of buf checked (zoff_ckpt_checksum_range) and brought to
 * dtype hdt: the file's, or fp32 (bf16 widened) (check true). */
static zoff_status read_window(const rank_file *f, const char *name, const int64_t *mine, int nmine, int64_t L,
                               int64_t W, zoff_dtype hdt, void *buf, int64_t *covered, bool check) {
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
                if (!check) {
                    ZOFF_TRY(zoff_ckpt_read_range_unchecked(f->r, name, (eo + x - o) * es, to, (size_t)((ly - lx) * es)));
                    *covered += ly - lx;
                } else {
                    ZOFF_TRY(zoff_ckpt_checksum_range(f->r, name, (eo + x - o) * es, to, (size_t)((ly - lx) * es)));
                    if (f->dt != hdt) widen_bf16(to, ly - lx);
                }
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

/* One optimizer state array of this rank through the load's pipeline: window p (elements [pW, pW + W)
 * of this rank's partition) read from the rank files on the helper thread, then into the engine. */
typedef struct state_job {
    rank_file *files;
    int oldn;
    const char *name;
    const int64_t *mine;
    int nmine;
    int64_t pn, W;
    zoff_dtype hdt;
    zoff_engine *eng;
    int k;
    int64_t covered; /* the helper's: read once it is joined */
} state_job;

static zoff_status state_fill(void *ctx, int64_t p, void *buf) {
    state_job *j = ctx;
    const int64_t L = p * j->W, w = piece_len(p, j->W, j->pn);
    for (int q = 0; q < j->oldn; q++)
        ZOFF_TRY(read_window(&j->files[q], j->name, j->mine, j->nmine, L, w, j->hdt, buf, &j->covered, false));
    return ZOFF_OK;
}

static zoff_status state_use(void *ctx, int64_t p, void *buf) {
    const state_job *j = ctx;
    const int64_t L = p * j->W, w = piece_len(p, j->W, j->pn);
    for (int q = 0; q < j->oldn; q++)
        ZOFF_TRY(read_window(&j->files[q], j->name, j->mine, j->nmine, L, w, j->hdt, buf, NULL, true));
    return zoff_engine_state_range_as(j->eng, j->k, L, w, j->hdt, buf, false);
}

/* One optimizer state array k of this rank, window by window, from the rank files into the
 * engine (zoff_engine_state_range: in memory, on the device or in an NVMe swap file alike).
 * Where the file keeps the engine's dtype the values are copied as they are; else
 * (bf16.bf16_optimizer_states changed between the runs) bf16 widens to fp32 exactly, fp32 rounds
 * to nearest-even into bf16 state. */
static zoff_status read_state_array(rank_file *files, int oldn, zoff_engine *eng, int k, const int64_t *mine,
                                    int nmine, int64_t pn, void *const buf[2], int64_t W) {
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
    state_job j = {.files = files, .oldn = oldn, .name = name, .mine = mine, .nmine = nmine, .pn = pn, .W = W,
                   .hdt = hdt, .eng = eng, .k = k};
    ZOFF_TRY(pipe_run(pn > 0 ? (pn + W - 1) / W : 1, buf, state_fill, state_use, &j));
    /* the files are read in order (zoff_ckpt_reader_verify_in_order): each entry's CRC, over what this rank did
     * not read of it too, before anything trains on what was loaded */
    for (int q = 0; q < oldn; q++) ZOFF_TRY(zoff_ckpt_verify(files[q].r, name));
    if (j.covered != pn)
        return zoff_error(ZOFF_ERR_FORMAT,
                          "checkpoint %s: its %d rank file(s) hold %lld of the %lld values of '%s' this rank needs "
                          "(overlapping or missing partitions); the checkpoint is incomplete or corrupt",
                          zoff_ckpt_reader_path(files[0].r), oldn, (long long)j.covered, (long long)pn, name);
    return ZOFF_OK;
}

/* Resharding: this rank's partition of each optimizer state array is read from whichever rank
 * files of the checkpoint hold it, however many ranks wrote it, through the load's two pieces. */
zoff_status zoff_train_ckpt_read_state(zoff_ckpt_reader *r, zoff_engine *eng, int64_t n) {
    int64_t pn = zoff_engine_partition_numel(eng);
    int64_t *mine = NULL;
    int nmine = 0, oldn = zoff_ckpt_reader_nranks(r);
    ZOFF_TRY(train_partition_runs(eng, &mine, &nmine));
    int64_t W = (int64_t)(zoff_train_ckpt_piece_bytes() / sizeof(float));
    void *buf[2] = {NULL, NULL};
    rank_file *files = calloc((size_t)(oldn > 0 ? oldn : 1), sizeof *files);
    zoff_status s = files && pipe_buffers(buf, pieces_bytes(pn, W, sizeof(float))) ? ZOFF_OK : ZOFF_ERR_NOMEM;
    if (s == ZOFF_OK) s = open_rank_files(r, n, files, oldn);
    bool was = zoff_ckpt_reader_verify_in_order(r, true); /* one pass; the caller's setting back below */
    for (int q = 1; s == ZOFF_OK && q < oldn; q++) zoff_ckpt_reader_verify_in_order(files[q].r, true);
    for (int k = 1; s == ZOFF_OK && k < zoff_engine_state_count(eng); k++)
        s = read_state_array(files, oldn, eng, k, mine, nmine, pn, buf, W);
    zoff_ckpt_reader_verify_in_order(r, was);
    for (int q = 0; files && q < oldn; q++) {
        zoff_ckpt_partition_free(&files[q].p);
        if (q > 0) zoff_ckpt_close(files[q].r);
    }
    free(files);
    free(mine);
    pipe_buffers_free(buf);
    return s;
}

typedef struct dweights_job {
    zoff_ckpt_reader *r;
    zoff_engine *eng;
    int64_t n, W;
    size_t es;
} dweights_job;

static zoff_status dweights_fill(void *ctx, int64_t p, void *buf) {
    const dweights_job *j = ctx;
    const int64_t a = p * j->W, c = piece_len(p, j->W, j->n);
    return zoff_ckpt_read_range_unchecked(j->r, ZOFF_TRAIN_DEVICE_WEIGHTS, a * (int64_t)j->es, buf, (size_t)c * j->es);
}

static zoff_status dweights_use(void *ctx, int64_t p, void *buf) {
    const dweights_job *j = ctx;
    const int64_t a = p * j->W, c = piece_len(p, j->W, j->n);
    ZOFF_TRY(zoff_ckpt_checksum_range(j->r, ZOFF_TRAIN_DEVICE_WEIGHTS, a * (int64_t)j->es, buf, (size_t)c * j->es));
    return zoff_engine_device_weights(j->eng, a, c, buf, false);
}

zoff_status zoff_train_ckpt_read_device_weights(zoff_ckpt_reader *r, zoff_engine *eng, int64_t n, bool *restored) {
    ZOFF_TRY(zoff_engine_mark_weights_pending(eng, restored));
    if (!*restored) return ZOFF_OK;
    const int64_t shape[1] = {n};
    const size_t es = zoff_dtype_size(zoff_engine_dtype(eng));
    ZOFF_TRY(zoff_ckpt_check_tensor(r, ZOFF_TRAIN_DEVICE_WEIGHTS, zoff_engine_dtype(eng), 1, shape));
    dweights_job j = {.r = r, .eng = eng, .n = n, .W = (int64_t)(zoff_train_ckpt_piece_bytes() / es), .es = es};
    void *buf[2] = {NULL, NULL};
    zoff_status s = pipe_buffers(buf, pieces_bytes(n, j.W, es)) ? ZOFF_OK : ZOFF_ERR_NOMEM;
    bool was = zoff_ckpt_reader_verify_in_order(r, true); /* checked as read; all of it before this returns */
    if (s == ZOFF_OK && n > 0) s = pipe_run((n + j.W - 1) / j.W, buf, dweights_fill, dweights_use, &j);
    if (s == ZOFF_OK) s = zoff_ckpt_verify(r, ZOFF_TRAIN_DEVICE_WEIGHTS);
    zoff_ckpt_reader_verify_in_order(r, was);
    pipe_buffers_free(buf);
    return s;
}
