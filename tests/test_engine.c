/* The engine (src/zero) with a real GPT-2 on the CPU backend: ZeRO-Offload
 * (optimizer state and update on the host) against the device optimizer,
 * gradient accumulation, fp16 loss scaling with an injected overflow, the
 * device memory budget, and the delayed parameter update.
 *
 * The reference for "offload" is the same training with the optimizer on the
 * device (the device's fused Adam op, an independent implementation of the
 * update in src/backend/cpu/cpu_kernels.c): the two must agree within a
 * stated tolerance (they use different fp32 operation orders). The reference
 * for the loss-scale schedule is a transcription of DeepSpeed's
 * DynamicLossScaler.update_scale written in this file. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h> /* mincore */
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "zoff/config.h"
#include "zoff/engine.h"
#include "zoff/model.h"
#include "zoff/core.h"
#include "zero/engine_impl.h" /* zoff_eng_snap_arena */

enum { L = 2, C = 32, NH = 2, T = 16, V = 97, B = 4, BMAX = 32 };

typedef struct run_result {
    float losses[32];
    double norms[32];
    double scales[32];
    bool skipped[32];
    float *weights; /* fp32 master after training */
    int64_t n;
    size_t device_peak;
    int64_t steps_taken;
    double host_ratio;
    size_t host_bytes; /* zoff_engine_memory_usage: pinned + pageable */
    size_t em_pinned, em_pageable; /* zoff_engine_memory_usage */
    size_t pinned_asked;           /* bytes zoff_host_alloc_pinned gave zoff_engine_create (the device's account) */
    int64_t rollbacks;
    bool rolled_back[32];
    char describe[1536]; /* zoff_engine_describe */
    int thp_arrays;      /* mappings of >= 64 MiB with MADV_HUGEPAGE that zoff_engine_create added (smaps) */
    size_t thp_bytes;    /* ... and the bytes of theirs the kernel backs with huge pages */
} run_result;

/* How train() drives the engine, and what it records of the step timeline
 * (zoff_now seconds; iteration i's step is optimizer step i + 1 when none is skipped). */
typedef struct train_mode {
    bool waits;               /* the model waits per parameter group (options.weight_waits) */
    bool range_init;          /* initial weights through options.init_range (no whole buffer) */
    int layers, hidden;       /* model shape (0: L, C) */
    int vocab, batch;         /* (0: V, B; batch <= BMAX) */
    long sub_group;           /* spec_cfg's sub_group_size (0: 3000) */
    int split[33];            /* optimizer step t: sub-groups its host update updated in two spans */
    bool rows_stall;          /* block 0's grad-ready drains the stream and pauses 100 ms, so the
                                 worker takes wte's early part before the embedding backward */
    bool no_rows;             /* no row-sparse report of wte's gradient (zoff_gpt2_set_grad_rows) */
    bool lr_falls;            /* the learning rate falls every step (speculation assumes the last one's) */
    bool buckets;             /* as zoff train: the engine's gradient buckets where zoff_placement_grad_buckets
                                 allows them (the model then holds no gradient buffer) */
    bool count_thp;           /* train() fills run_result.thp_arrays and thp_bytes */
    int64_t block0;           /* set by train(): block 0's offset */
    double block0_end[32];    /* iteration i: the boundary backward of block 0 ended on the device */
    double span_wte0[33];     /* optimizer step t: the first update of the sub-group at offset 0 began */
    zoff_engine *e;           /* set by train() */
    int iter;                 /* the iteration being run */
    double group0_ready[32];  /* forward of iteration i: the wait for the embeddings returned */
    double group0_device[32]; /* ... and the device reached that point */
    double host_t0[33], host_t1[33]; /* host update of optimizer step t */
    double bwd_end_device[32];       /* the boundary backward of iteration i ended on the device */
} train_mode;
static train_mode g_mode;

/* The copy-on-update snapshot (zoff_engine_snapshot_*) under test: begun after step `at` with
 * `budget`; a reader thread (the checkpoint writer's part) reads the three arrays through it
 * slowly (slices that do not divide a block, a pause after each) while the next steps update
 * the state; `ref` is the state at begin (zoff_engine_state_get: the reference). */
typedef struct snap_test {
    int at;
    size_t budget;
    int64_t n;
    zoff_engine *e;
    float *ref[3], *got[3];
    zoff_status s;
    zoff_engine_snapshot_stats stats;
    pthread_t th;
    bool started;
    bool prepare;             /* zoff_engine_snapshot_prepare(budget) after step 1 (at > 1), waited for */
    bool plus_min;            /* a device share: budget counts on top of zoff_engine_snapshot_min_bytes (its copy) */
    size_t min_bytes;         /* then: that least budget, which one byte less is refused */
    int64_t n_host, n_dev;    /* the engine's split at begin */
    size_t held, resident;    /* then: the arena held, and how many of its bytes the kernel says are resident */
    size_t borrowed;          /* bytes the reader took as staged copies (zoff_engine_snapshot_borrow) */
    size_t borrowed_i[3];     /* ... of each state array */
    size_t kept_size[3];      /* the element size each array is saved in (zoff_engine_state_dtype) */
    const zoff_tensor_info *ti; /* the model's tensors (the master's entries, as a save writes them) */
    int nt;
    int full_less;            /* >= 0: the budget is zoff_engine_snapshot_bytes less this many blocks (set at begin) */
    size_t full;              /* then: zoff_engine_snapshot_bytes */
    bool copy_first;          /* the reader takes the device share's copy first (zoff_engine_snapshot_device_copy), as
                                 the writer does */
    bool ahead;               /* the device share's copy begun before the flush and begin, as the trainer does at the
                                 boundary (zoff_engine_snapshot_device_ahead) */
    bool ahead_only;          /* that copy begun, and no begin: the engine is destroyed next (at: the last step) */
} snap_test;
static snap_test *g_snaptest;

/* The arena faulted in ahead of the save: prepare, then wait until the background thread has
 * gone through all of it (at most 60 s), and ask the kernel (mincore) which of its pages are
 * resident. */
static zoff_status snap_test_prepare(zoff_engine *e, snap_test *t) {
    ZOFF_TRY(zoff_engine_snapshot_prepare(e, t->budget));
    t->held = zoff_engine_snapshot_held(e);
    for (int k = 0; k < 6000 && zoff_engine_snapshot_prefaulted(e) < t->held; k++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = t->held / page;
    unsigned char *vec = malloc(pages + 1);
    if (!vec || mincore((void *)zoff_eng_snap_arena(e), t->held, vec) != 0) {
        free(vec);
        return zoff_error(ZOFF_ERR_IO, "mincore of the snapshot arena failed");
    }
    for (size_t k = 0; k < pages; k++) t->resident += (vec[k] & 1) ? page : 0;
    free(vec);
    return ZOFF_OK;
}

/* A borrowed staging block, held while the reader goes on (as a save's disk write is in flight). */
typedef struct held_block {
    const void *data;
    int i;
    int64_t o, c;
} held_block;

/* The held block, still what the state was at begin (nothing restaged it meanwhile), returned. */
static void release_held(snap_test *t, held_block *h) {
    if (!h->data) return;
    const bool b16 = zoff_engine_state_dtype(t->e, h->i) == ZOFF_BF16;
    for (int64_t k = 0; k < h->c && t->s == ZOFF_OK; k++) {
        float v = b16 ? zoff_bf16_to_f32(((const uint16_t *)h->data)[k]) : ((const float *)h->data)[k];
        if (memcmp(&v, &t->ref[h->i][h->o + k], sizeof v) != 0)
            t->s = zoff_error(ZOFF_ERR_INTERNAL, "borrowed block of array %d at %lld changed while held", h->i,
                              (long long)(h->o + k));
    }
    zoff_engine_snapshot_return(t->e, h->data);
    h->data = NULL;
}

/* The writer's reads as a save makes them (src/train/ckpt_save.c): the master one entry per model tensor, m and v
 * one entry over the partition, each entry from an aligned file position. Where the file position is aligned and
 * the snapshot lends its staged copy, the reader takes it (two held at a time): it must be 4096-aligned, whole
 * 4 KiB. Else it reads slices of 64Ki elements, no further than the snapshot says. */
static void *snap_reader_main(void *arg) {
    snap_test *t = arg;
    const int64_t slice = 65536;
    const size_t A = 4096;
    held_block held[2] = {{0}};
    int next = 0;
    if (t->copy_first) t->s = zoff_engine_snapshot_device_copy(t->e);
    for (int i = 0; i < 3 && t->s == ZOFF_OK; i++) {
        const zoff_dtype kept = zoff_engine_state_dtype(t->e, i);
        const int64_t es = (int64_t)zoff_dtype_size(kept);
        t->kept_size[i] = (size_t)es;
        for (int en = 0; en < (i == 0 ? t->nt : 1) && t->s == ZOFF_OK; en++) {
            const int64_t e0 = i == 0 ? t->ti[en].offset : 0, n = i == 0 ? t->ti[en].numel : t->n;
            int64_t ask = 0;
            for (int64_t q = 0; q < n && t->s == ZOFF_OK;) {
                if (q >= ask && (size_t)(q * es) % A != 0) {
                    ask = q + (int64_t)(A - (size_t)(q * es) % A) / es;
                } else if (q >= ask) {
                    const void *data = NULL;
                    int64_t got = 0, until = 0;
                    release_held(t, &held[next]); /* the older of two in flight is done (as the writer reaps) */
                    t->s = zoff_engine_snapshot_borrow(t->e, i, e0 + q, n - q, kept, &data, &got, &until);
                    if (t->s == ZOFF_OK && !data && held[1 - next].data) { /* the lending cap: the other done too */
                        release_held(t, &held[1 - next]);
                        t->s = zoff_engine_snapshot_borrow(t->e, i, e0 + q, n - q, kept, &data, &got, &until);
                    }
                    if (t->s == ZOFF_OK && data) {
                        if ((uintptr_t)data % A != 0 || (size_t)(got * es) % A != 0 || got > n - q)
                            t->s = zoff_error(ZOFF_ERR_INTERNAL, "array %d at %lld: lent %lld elements at %p", i,
                                              (long long)(e0 + q), (long long)got, data);
                        for (int64_t k = 0; k < got; k++)
                            t->got[i][e0 + q + k] = kept == ZOFF_BF16 ? zoff_bf16_to_f32(((const uint16_t *)data)[k])
                                                                      : ((const float *)data)[k];
                        held[next] = (held_block){data, i, e0 + q, got};
                        next = 1 - next;
                        t->borrowed += (size_t)(got * es);
                        t->borrowed_i[i] += (size_t)(got * es);
                        q += got;
                        ask = q;
                        continue;
                    }
                    if (t->s == ZOFF_OK && until < 1)
                        t->s = zoff_error(ZOFF_ERR_INTERNAL, "array %d at %lld: nothing lent, until %lld", i,
                                          (long long)(e0 + q), (long long)until);
                    ask = q + until;
                }
                int64_t c = n - q < slice - q % slice ? n - q : slice - q % slice;
                if (ask > q && c > ask - q) c = ask - q;
                if (t->s == ZOFF_OK) t->s = zoff_engine_snapshot_read(t->e, i, e0 + q, c, t->got[i] + e0 + q);
                q += c;
                struct timespec ts = {0, 2 * 1000 * 1000};
                nanosleep(&ts, NULL);
            }
        }
    }
    release_held(t, &held[0]);
    zoff_engine_snapshot_finish(t->e, &t->stats);
    release_held(t, &held[1]); /* after the end: nothing to give back, nothing breaks */
    return NULL;
}

static zoff_status snap_test_begin(zoff_engine *e, int64_t n, snap_test *t) {
    if (t->ahead) ZOFF_TRY(zoff_engine_snapshot_device_ahead(e));
    ZOFF_TRY(zoff_engine_flush_state(e)); /* as a save does */
    t->e = e;
    t->n = n;
    for (int i = 0; i < 3; i++) {
        t->ref[i] = malloc((size_t)n * sizeof(float));
        t->got[i] = malloc((size_t)n * sizeof(float));
        ZOFF_TRY(zoff_engine_state_get(e, i, t->ref[i]));
    }
    zoff_engine_memory m;
    zoff_engine_memory_usage(e, &m);
    t->n_host = m.host_params;
    t->n_dev = n - m.host_params;
    if (t->plus_min) {
        t->min_bytes = zoff_engine_snapshot_min_bytes(e);
        if (zoff_engine_snapshot_begin(e, t->min_bytes - 1) != ZOFF_ERR_INVALID ||
            !strstr(zoff_last_error(), "raise --save-snapshot-memory"))
            return zoff_error(ZOFF_ERR_INTERNAL, "a budget below the device share's copy was not refused");
        t->budget = t->budget == SIZE_MAX ? SIZE_MAX : t->budget + t->min_bytes;
    }
    if (t->full_less >= 0) {
        t->full = zoff_engine_snapshot_bytes(e);
        t->budget = t->full - (size_t)t->full_less * zoff_engine_snapshot_block_bytes();
    }
    ZOFF_TRY(zoff_engine_snapshot_begin(e, t->budget));
    t->started = pthread_create(&t->th, NULL, snap_reader_main, t) == 0;
    return t->started ? ZOFF_OK : ZOFF_ERR_INTERNAL;
}

/* The engine's side of a checkpoint after step `at` (the optimizer state, scalars, whether the
 * delayed update's weights were pending and the device's weights), taken by train() when
 * g_snap is set and restored into a fresh engine, which goes on from there, when g_resume is. */
typedef struct engine_snap {
    int at;
    float *state[3];
    zoff_engine_scalars sc;
    bool pending;
    void *dev_w;
} engine_snap;
static engine_snap *g_snap, *g_resume;

static zoff_status snap_take(zoff_engine *e, int64_t n, engine_snap *sn) {
    ZOFF_TRY(zoff_engine_flush_state(e)); /* what a checkpoint does: the run must not change */
    for (int i = 0; i < 3; i++) {
        sn->state[i] = malloc((size_t)n * sizeof(float));
        ZOFF_TRY(zoff_engine_state_get(e, i, sn->state[i]));
    }
    zoff_engine_get_scalars(e, &sn->sc);
    sn->pending = zoff_engine_weights_pending(e);
    sn->dev_w = malloc((size_t)n * zoff_dtype_size(zoff_engine_dtype(e)));
    return zoff_engine_device_weights(e, 0, n, sn->dev_w, true);
}

/* After the engine was created with the snapshot's master weights. */
static zoff_status snap_restore(zoff_engine *e, int64_t n, const engine_snap *sn) {
    for (int i = 1; i < 3; i++) ZOFF_TRY(zoff_engine_state_set(e, i, sn->state[i]));
    ZOFF_TRY(zoff_engine_set_scalars(e, &sn->sc));
    bool marked = false;
    if (sn->pending) ZOFF_TRY(zoff_engine_mark_weights_pending(e, &marked));
    assert_true(marked == sn->pending);
    return marked ? zoff_engine_device_weights(e, 0, n, sn->dev_w, false) : ZOFF_OK;
}

static void snap_free(engine_snap *sn) {
    for (int i = 0; i < 3; i++) free(sn->state[i]);
    free(sn->dev_w);
}

static void stamp_device(void *arg) { *(double *)arg = zoff_now(); }

/* The engine's last finished host update (its step t, its time span and its sub-groups' spans) into g_mode. The
 * train loop asks right after each zoff_engine_step (what it finds then stands: a speculated update the step rolled
 * back is redone by then) and, for a step not seen yet, right before it: a pipelined job may end on either side of
 * the next step's start, and the engine keeps only the newest. */
static void record_host_span(zoff_engine *e, bool after_step) {
    double h0, h1;
    const int64_t ht = zoff_engine_last_host_update(e, &h0, &h1);
    if (ht <= 0 || ht > 32 || (!after_step && g_mode.host_t0[ht] != 0)) return;
    g_mode.host_t0[ht] = h0;
    g_mode.host_t1[ht] = h1;
    g_mode.span_wte0[ht] = 0;
    g_mode.split[ht] = 0;
    const double *sp;
    const int64_t *so;
    const int nsp = zoff_engine_last_host_spans(e, &sp);
    if (nsp == zoff_engine_last_host_span_offsets(e, &so))
        for (int k = 0; k < nsp; k++) {
            if (so[k] == 0 && g_mode.span_wte0[ht] == 0) g_mode.span_wte0[ht] = sp[2 * k];
            for (int j = 0; j < k; j++) g_mode.split[ht] += so[j] == so[k];
        }
}

static zoff_status logged_wait(void *arg, zoff_stream *s, int64_t off, int64_t count) {
    train_mode *tm = arg;
    zoff_status st = zoff_engine_wait_weights(tm->e, s, off, count);
    if (st == ZOFF_OK && off == 0 && tm->iter < 32 && tm->group0_ready[tm->iter] == 0) {
        tm->group0_ready[tm->iter] = zoff_now();
        st = zoff_stream_host_fn(s, stamp_device, &tm->group0_device[tm->iter]);
    }
    return st;
}

/* The engine's grad-ready, and a device stamp when block 0's gradients are final
 * (its backward ended) in the boundary backward. */
static void logged_ready(void *arg, zoff_stream *s, int64_t off, int64_t count) {
    zoff_engine_grad_ready(arg, s, off, count);
    if (off == g_mode.block0 && g_mode.iter < 32)
        (void)zoff_stream_host_fn(s, stamp_device, &g_mode.block0_end[g_mode.iter]);
    if (off == g_mode.block0 && g_mode.rows_stall) {
        (void)zoff_stream_synchronize(s);
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static zoff_status init_range_42(void *arg, int64_t lo, int64_t hi, float *dst) {
    zoff_gpt2_init_params_range(arg, 42, lo, hi, dst);
    return ZOFF_OK;
}

static void tokens_for(int step, int mb, int32_t *x, int32_t *y) {
    uint64_t s = 0x9E3779B97F4A7C15ull * (uint64_t)(step * 131 + mb * 7 + 1);
    int n = (g_mode.batch ? g_mode.batch : B) * T, v = g_mode.vocab ? g_mode.vocab : V;
    for (int i = 0; i < n + 1; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t tok = (int32_t)((s >> 33) % (uint64_t)(v / 3)); /* a learnable, skewed distribution */
        if (i < n) x[i] = tok;
        if (i > 0) y[i - 1] = tok;
    }
}

/* Train nsteps with the given config JSON and dtype; accum micro-batches per step. */
/* The kernel's account (/proc/self/smaps) of this process's mappings of at least min_bytes whose
 * VmFlags carry "hg" (madvise MADV_HUGEPAGE): how many, and their AnonHugePages bytes. */
static int smaps_hugepage_mappings(size_t min_bytes, size_t *huge_bytes) {
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    unsigned long lo = 0, hi = 0;
    size_t anon_huge = 0;
    int count = 0;
    *huge_bytes = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        size_t kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            lo = a, hi = b, anon_huge = 0;
        } else if (sscanf(line, "AnonHugePages: %zu kB", &kb) == 1) {
            anon_huge = kb << 10;
        } else if (!strncmp(line, "VmFlags:", 8) && hi - lo >= min_bytes) {
            char *save = NULL;
            for (char *tok = strtok_r(line + 8, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save))
                if (!strcmp(tok, "hg")) {
                    count++;
                    *huge_bytes += anon_huge;
                }
        }
    }
    fclose(f);
    return count;
}

static zoff_status train(const char *json, zoff_dtype dt, int nsteps, size_t budget, run_result *r) {
    memset(r, 0, sizeof *r);
    zoff_config cfg;
    zoff_status s = zoff_config_load_string(json, "test config", &cfg);
    if (s != ZOFF_OK) return s;
    s = zoff_config_resolve_batch(&cfg, 1);
    if (s != ZOFF_OK) return s;
    int accum = (int)cfg.gradient_accumulation_steps;
    zoff_device *dev = NULL;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU, .memory_budget = budget};
    s = zoff_device_create(&dopt, &dev);
    assert_int_equal(s, ZOFF_OK);
    zoff_gpt2 *m = NULL;
    zoff_engine *e = NULL;
    int32_t *dx = NULL, *dy = NULL;
    float *init = NULL;
    int64_t mb_rows = cfg.train_micro_batch_size_per_gpu;
    zoff_gpt2_options mo = {.shape = {.num_layers = g_mode.layers ? g_mode.layers : L,
                                      .hidden_size = g_mode.hidden ? g_mode.hidden : C, .num_heads = NH,
                                      .max_seq_len = T, .vocab_size = g_mode.vocab ? g_mode.vocab : V},
                            .batch_size = mb_rows, .seq_len = T, .dtype = dt,
                            .external_grads = g_mode.buckets && zoff_placement_grad_buckets(&cfg)};
    s = zoff_gpt2_create(dev, &mo, &m);
    if (s == ZOFF_OK) {
        r->n = zoff_gpt2_num_params(m);
        if (!g_mode.range_init) {
            init = malloc((size_t)r->n * sizeof(float));
            if (g_resume) memcpy(init, g_resume->state[0], (size_t)r->n * sizeof(float));
            else zoff_gpt2_init_params(m, 42, init);
        }
        int nt;
        const zoff_tensor_info *ti = zoff_gpt2_tensors(m, &nt);
        zoff_engine_options eo = {.dev = dev, .cfg = &cfg, .tensors = ti, .num_tensors = nt, .num_params = r->n,
                                  .params = zoff_gpt2_params(m), .grads = zoff_gpt2_grads(m), .dtype = dt,
                                  .init_params = init, .init_range = init ? NULL : init_range_42, .init_arg = m,
                                  .weight_waits = g_mode.waits};
        zoff_memory_stats before, after;
        size_t thp0 = 0, thp1 = 0;
        int nthp0 = g_mode.count_thp ? smaps_hugepage_mappings((size_t)64 << 20, &thp0) : 0;
        zoff_device_memory_stats(dev, &before);
        s = zoff_engine_create(&eo, &e);
        zoff_device_memory_stats(dev, &after);
        if (g_mode.count_thp) {
            r->thp_arrays = smaps_hugepage_mappings((size_t)64 << 20, &thp1) - nthp0;
            r->thp_bytes = thp1 - thp0;
        }
        r->pinned_asked = after.pinned_in_use - before.pinned_in_use;
        g_mode.e = e;
        memset(g_mode.group0_ready, 0, sizeof g_mode.group0_ready);
        memset(g_mode.group0_device, 0, sizeof g_mode.group0_device);
        if (s == ZOFF_OK && g_mode.waits) s = zoff_gpt2_set_weight_wait(m, logged_wait, &g_mode);
        if (s == ZOFF_OK && !g_mode.no_rows && zoff_engine_uses_grad_rows(e))
            s = zoff_gpt2_set_grad_rows(m, zoff_engine_grad_rows, e);
        if (s == ZOFF_OK && zoff_engine_uses_grad_buckets(e)) {
            zoff_grad_hooks gh = {.arg = e, .acquire = zoff_engine_grad_acquire, .release = zoff_engine_grad_release};
            s = zoff_gpt2_set_grad_hooks(m, &gh);
        }
        g_mode.block0 = ti[2].offset; /* wte, wpe, then h.0 */
        memset(g_mode.block0_end, 0, sizeof g_mode.block0_end);
        memset(g_mode.span_wte0, 0, sizeof g_mode.span_wte0);
        memset(g_mode.split, 0, sizeof g_mode.split);
        memset(g_mode.host_t0, 0, sizeof g_mode.host_t0);
        memset(g_mode.host_t1, 0, sizeof g_mode.host_t1);
    }
    if (s == ZOFF_OK && g_resume) s = snap_restore(e, r->n, g_resume);
    if (s == ZOFF_OK) {
        zoff_engine_memory em;
        zoff_engine_memory_usage(e, &em);
        snprintf(r->describe, sizeof r->describe, "%s", zoff_engine_describe(e));
        r->host_ratio = em.host_ratio;
        r->host_bytes = em.pinned + em.pageable;
        r->em_pinned = em.pinned;
        r->em_pageable = em.pageable;
    }
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)mb_rows * T * 4, "x", (void **)&dx);
    if (s == ZOFF_OK) s = zoff_device_alloc(dev, (size_t)mb_rows * T * 4, "y", (void **)&dy);
    zoff_stream *st = zoff_device_stream(dev);
    /* Each step sees the same B*accum sequences whatever the split into micro-batches:
     * micro-batch k of a step takes rows [k*mb_rows, (k+1)*mb_rows) of the step's B x accum rows. */
    static int32_t hx[BMAX * T], hy[BMAX * T];
    assert_true(g_mode.batch <= BMAX);
    for (int step = g_resume ? g_resume->at : 0; s == ZOFF_OK && step < nsteps; step++) {
        g_mode.iter = step;
        tokens_for(step, 0, hx, hy);
        s = zoff_engine_zero_grad(e);
        double loss = 0;
        for (int k = 0; s == ZOFF_OK && k < accum; k++) {
            size_t off = (size_t)k * (size_t)mb_rows * T, bytes = (size_t)mb_rows * T * 4;
            s = zoff_memcpy_async(st, dx, hx + off, bytes, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_memcpy_async(st, dy, hy + off, bytes, ZOFF_COPY_H2D);
            if (s == ZOFF_OK) s = zoff_gpt2_forward_train(m, dx, dy, mb_rows, T, zoff_engine_backward_scale(e));
            float l = 0;
            if (s == ZOFF_OK) s = zoff_gpt2_mean_loss(m, &l);
            loss += l;
            zoff_engine_begin_backward(e, k == accum - 1);
            if (s == ZOFF_OK) s = zoff_gpt2_backward(m, logged_ready, e);
            if (s == ZOFF_OK && k == accum - 1) s = zoff_stream_host_fn(st, stamp_device, &g_mode.bwd_end_device[step]);
        }
        r->losses[step] = (float)(loss / accum);
        zoff_step_info si;
        if (s == ZOFF_OK) record_host_span(e, false); /* the pipelined job of the last step, where done by now */
        if (s == ZOFF_OK) s = zoff_engine_step(e, g_mode.lr_falls ? 1e-2 / (1 + step) : 1e-2, &si);
        if (s == ZOFF_OK) record_host_span(e, true);
        r->norms[step] = si.grad_norm;
        r->scales[step] = si.loss_scale;
        r->skipped[step] = si.skipped;
        r->rolled_back[step] = si.rolled_back;
        r->rollbacks = si.rollbacks;
        if (s == ZOFF_OK && g_snap && step + 1 == g_snap->at) s = snap_take(e, r->n, g_snap);
        if (s == ZOFF_OK && g_snaptest && g_snaptest->prepare && step + 1 == 1) s = snap_test_prepare(e, g_snaptest);
        if (s == ZOFF_OK && g_snaptest && step + 1 == g_snaptest->at && g_snaptest->ahead_only) {
            s = zoff_engine_snapshot_device_ahead(e);
        } else if (s == ZOFF_OK && g_snaptest && step + 1 == g_snaptest->at) {
            g_snaptest->ti = zoff_gpt2_tensors(m, &g_snaptest->nt);
            s = snap_test_begin(e, r->n, g_snaptest);
        }
    }
    if (g_snaptest && g_snaptest->started) pthread_join(g_snaptest->th, NULL);
    if (s == ZOFF_OK) {
        r->weights = malloc((size_t)r->n * sizeof(float));
        s = zoff_engine_flush(e);
        if (s == ZOFF_OK) s = zoff_engine_state_get(e, 0, r->weights);
        r->steps_taken = zoff_engine_steps_taken(e);
    }
    zoff_memory_stats ms;
    zoff_device_memory_stats(dev, &ms);
    r->device_peak = ms.device_peak;
    if (dx) zoff_device_free(dev, dx);
    if (dy) zoff_device_free(dev, dy);
    zoff_engine_destroy(e);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
    zoff_config_free(&cfg);
    free(init);
    return s;
}

static const char *cfg_json(char *buf, size_t n, const char *zero, const char *prec, int accum) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.1}},"
             " \"gradient_clipping\": 1.0, %s \"zero_optimization\": %s}",
             B / accum, accum, prec, zero);
    return buf;
}

/* ||a - b|| / ||b|| (Adam's sign-like early updates make a max-based measure
 * meaningless: an element whose gradient is pure rounding noise moves by +-lr). */
static double max_rel_diff(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / den);
}

#define OFFLOAD "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}"
#define DEVICE "{\"stage\": 0}"

/* Offload vs device optimizer, fp32 / bf16 / fp16: 8 steps at lr 1e-2, same
 * losses and weights. The two Adams differ only in fp32 operation order; Adam's
 * sign-like early steps turn such 1-ulp differences into +-lr moves for
 * elements whose gradient is rounding noise, and with 16-bit weights a master
 * that straddles a rounding boundary changes the next forward. Tolerances
 * (measured in parentheses): losses relative at every step, fp32 1e-5 (3e-7),
 * bf16 and fp16 1e-4 (worst step 1.6e-5, 1.1e-5); weights, relative L2 distance: fp32 1e-4 (9.8e-6),
 * bf16 and fp16 3e-2 (1.1e-2, 4.6e-3). A sub-group left out of the update moves
 * the weights by ~0.3, a wrong weight decay the losses by > 1e-4. */
static void check_offload_equivalence(zoff_dtype dt, const char *prec, double tol) {
    char a[1024], b[1024];
    run_result off, dev;
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), dt, 8, 0, &off), ZOFF_OK);
    assert_int_equal(train(cfg_json(b, sizeof b, DEVICE, prec, 1), dt, 8, 0, &dev), ZOFF_OK);
    assert_true(off.losses[7] < off.losses[0] - 0.05); /* it trains */
    for (int i = 0; i < 8; i++) {
        double d = fabs(off.losses[i] - dev.losses[i]) / dev.losses[i];
        if (d > (dt == ZOFF_F32 ? 1e-5 : 1e-4)) fail_msg("%s step %d: offload loss %.7f vs device %.7f", prec, i, off.losses[i], dev.losses[i]);
    }
    double w = max_rel_diff(off.weights, dev.weights, off.n);
    printf("%s: losses step 8 %.7f vs %.7f, weights rel L2 diff %.3g\n", dt == ZOFF_F32 ? "f32" : prec, off.losses[7], dev.losses[7], w);
    if (w > tol) fail_msg("%s: weights differ by %.3g (max rel) > %.3g", prec, w, tol);
    free(off.weights);
    free(dev.weights);
}

static void test_offload_equals_device_f32(void **st) { (void)st; check_offload_equivalence(ZOFF_F32, "", 1e-4); }
static void test_offload_equals_device_bf16(void **st) {
    (void)st;
    check_offload_equivalence(ZOFF_BF16, "\"bf16\": {\"enabled\": true},", 3e-2);
}
static void test_offload_equals_device_fp16(void **st) {
    (void)st;
    check_offload_equivalence(ZOFF_F16, "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8},", 3e-2);
}

/* A config with the optimizer's betas and a scheduler section (may be empty). */
static const char *betas_cfg(char *buf, size_t n, const char *zero, const char *betas, const char *sched) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2,"
             " \"weight_decay\": 0.1, \"betas\": %s}}, %s \"gradient_clipping\": 1.0, \"zero_optimization\": %s}",
             B, betas, sched, zero);
    return buf;
}

/* OneCycle's momentum reaches both optimizers. (1) A cycle whose momentum stays at 0.9 gives the
 * betas (0.9, 0.99) at every step whatever the optimizer's own (here [0.5, 0.5]): bit for bit the
 * run with betas [0.9, 0.99] and no scheduler, on the host optimizer (offload) and the device's.
 * A schedule whose betas did not reach an optimizer, or a beta2 other than DeepSpeed's 0.99,
 * changes the weights by far more than a bit. (2) A momentum cycling over 0.8..0.95 every 3 steps:
 * the host and device optimizers still agree (the tolerance of check_offload_equivalence,
 * fp32), and the weights are not those of the constant betas. (The test's train() gives the
 * engine lr 1e-2 itself; the schedules' lr is zoff_lr_at's, checked in test_schedule.) */
static void test_one_cycle_momentum(void **st) {
    (void)st;
    const char *still = "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 1e-2, \"cycle_max_lr\": "
                        "1e-2, \"cycle_min_mom\": 0.9, \"cycle_max_mom\": 0.9, \"cycle_first_step_size\": 2}},";
    const char *cycling = "\"scheduler\": {\"type\": \"OneCycle\", \"params\": {\"cycle_min_lr\": 1e-2, \"cycle_max_lr\": "
                          "1e-2, \"cycle_min_mom\": 0.8, \"cycle_max_mom\": 0.95, \"cycle_first_step_size\": 3}},";
    const char *zeros[2] = {OFFLOAD, DEVICE};
    run_result plain[2], fixed[2], cyc[2];
    char buf[1024];
    for (int z = 0; z < 2; z++) {
        assert_int_equal(train(betas_cfg(buf, sizeof buf, zeros[z], "[0.9, 0.99]", ""), ZOFF_F32, 8, 0, &plain[z]), ZOFF_OK);
        assert_int_equal(train(betas_cfg(buf, sizeof buf, zeros[z], "[0.5, 0.5]", still), ZOFF_F32, 8, 0, &fixed[z]), ZOFF_OK);
        assert_int_equal(train(betas_cfg(buf, sizeof buf, zeros[z], "[0.5, 0.5]", cycling), ZOFF_F32, 8, 0, &cyc[z]), ZOFF_OK);
        const char *what = z ? "device" : "offload";
        if (memcmp(plain[z].losses, fixed[z].losses, sizeof plain[z].losses) != 0 ||
            memcmp(plain[z].weights, fixed[z].weights, (size_t)plain[z].n * sizeof(float)) != 0)
            fail_msg("%s: OneCycle at momentum 0.9 differs from betas [0.9, 0.99] (weights rel diff %.3g)", what,
                     max_rel_diff(fixed[z].weights, plain[z].weights, plain[z].n));
        double moved = max_rel_diff(cyc[z].weights, plain[z].weights, plain[z].n);
        printf("%s: a cycling momentum moves the weights by %.3g (rel L2) from the constant betas'\n", what, moved);
        if (moved < 1e-2) fail_msg("%s: a cycling momentum left the weights within %.3g of the constant betas'", what, moved);
    }
    for (int i = 0; i < 8; i++)
        if (fabs(cyc[0].losses[i] - cyc[1].losses[i]) / cyc[1].losses[i] > 1e-5)
            fail_msg("cycling momentum, step %d: offload loss %.7f vs device %.7f", i, cyc[0].losses[i], cyc[1].losses[i]);
    double w = max_rel_diff(cyc[0].weights, cyc[1].weights, cyc[0].n);
    printf("cycling momentum: offload vs device weights rel L2 diff %.3g\n", w);
    if (w > 1e-4) fail_msg("cycling momentum: offload and device weights differ by %.3g > 1e-4", w);
    for (int z = 0; z < 2; z++) {
        free(plain[z].weights);
        free(fixed[z].weights);
        free(cyc[z].weights);
    }
}

/* Accumulation is exact: 2 micro-batches of B/2 rows == 1 micro-batch of B rows
 * (fp32; same sequences; sums in another order): losses 1e-5, gradient norms
 * 1e-4, weights 1e-5 relative L2 (measured 5.3e-6). A micro-batch counted
 * twice or lost changes the gradient norm by ~30% and the weights by >= 1e-2. */
static void test_accumulation_exact(void **st) {
    (void)st;
    char a[1024], b[1024];
    run_result one, two;
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, "", 1), ZOFF_F32, 5, 0, &one), ZOFF_OK);
    assert_int_equal(train(cfg_json(b, sizeof b, OFFLOAD, "", 2), ZOFF_F32, 5, 0, &two), ZOFF_OK);
    for (int i = 0; i < 5; i++) {
        assert_true(fabs(one.losses[i] - two.losses[i]) <= 1e-5 * one.losses[i]);
        assert_true(fabs(one.norms[i] - two.norms[i]) <= 1e-4 * one.norms[i]);
    }
    double w = max_rel_diff(two.weights, one.weights, one.n);
    printf("accumulation: weights rel L2 diff %.3g\n", w);
    if (w > 1e-5) fail_msg("accumulated weights differ by %.3g", w);
    free(one.weights);
    free(two.weights);
}

/* Accumulation through the gradient buckets (zoff_grad_buckets "always": the sum of the earlier
 * micro-batches kept in the host's 16-bit gradient buffer, back to the device through the
 * buckets) gives what the full device buffer gives, bit for bit: the device adds each
 * micro-batch to the same bits. A ring of 2 buckets (reduce_bucket_size 1) and one per group;
 * bf16 and fp32; synchronous, pipelined (per-group weight waits) and delayed steps. The
 * reference is independent of the buckets: the full buffer, and for fp32 one micro-batch of
 * all the rows (test_accumulation_exact's bound). A lost upload (a bucket starting from zero)
 * drops a micro-batch: the norm moves by ~30%. */
static void check_bucket_accumulation(const char *prec, zoff_dtype dt, const char *extra, int accum, bool waits) {
    char zb[512], zf[512], a[1024], b[1024];
    snprintf(zb, sizeof zb,
             "{\"stage\": 2, \"sub_group_size\": 3000, %s \"zoff_grad_buckets\": \"always\", "
             "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}", extra);
    snprintf(zf, sizeof zf,
             "{\"stage\": 2, \"sub_group_size\": 3000, %s \"zoff_grad_buckets\": false, "
             "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}", extra);
    run_result bk, full;
    g_mode.waits = waits;
    g_mode.buckets = true;
    zoff_status s = train(cfg_json(a, sizeof a, zb, prec, accum), dt, 5, 0, &bk);
    g_mode.buckets = false;
    if (s == ZOFF_OK) s = train(cfg_json(b, sizeof b, zf, prec, accum), dt, 5, 0, &full);
    g_mode.waits = false;
    assert_int_equal(s, ZOFF_OK);
    if (!strstr(bk.describe, "the accumulation's sum on the host")) fail_msg("no bucket accumulation: %s", bk.describe);
    for (int i = 0; i < 5; i++)
        if (memcmp(&bk.losses[i], &full.losses[i], sizeof(float)) || bk.norms[i] != full.norms[i])
            fail_msg("%s %s step %d: buckets loss %.9g norm %.9g vs full buffer %.9g %.9g", extra, prec, i,
                     bk.losses[i], bk.norms[i], full.losses[i], full.norms[i]);
    assert_memory_equal(bk.weights, full.weights, (size_t)bk.n * sizeof(float));
    if (dt == ZOFF_F32) { /* against one micro-batch of all the rows */
        run_result one;
        g_mode.buckets = true;
        s = train(cfg_json(a, sizeof a, zb, prec, 1), dt, 5, 0, &one);
        g_mode.buckets = false;
        assert_int_equal(s, ZOFF_OK);
        for (int i = 0; i < 5; i++) assert_true(fabs(one.norms[i] - bk.norms[i]) <= 1e-4 * one.norms[i]);
        double w = max_rel_diff(bk.weights, one.weights, one.n);
        if (w > 1e-5) fail_msg("bucket-accumulated weights differ from one micro-batch's by %.3g", w);
        free(one.weights);
    }
    free(bk.weights);
    free(full.weights);
}

static void test_bucket_accumulation(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    const char *ring = "\"reduce_bucket_size\": 1,";
    check_bucket_accumulation("", ZOFF_F32, ring, 2, false);
    check_bucket_accumulation(bf, ZOFF_BF16, ring, 4, false);
    check_bucket_accumulation(bf, ZOFF_BF16, "", 4, false); /* one bucket per group */
    check_bucket_accumulation(bf, ZOFF_BF16, ring, 2, true);
    check_bucket_accumulation(bf, ZOFF_BF16,
                              "\"reduce_bucket_size\": 1, \"zoff_delayed_param_update\": true, "
                              "\"zoff_delayed_param_update_warmup\": 1,",
                              2, true);
}

/* DeepSpeed's DynamicLossScaler.update_scale, transcribed. */
typedef struct ref_scaler {
    double cur_scale, min_scale;
    int cur_iter, last_overflow_iter, scale_window, delayed_shift, cur_hysteresis;
} ref_scaler;
static void ref_update(ref_scaler *r, bool overflow) {
    if (overflow) {
        if (r->delayed_shift == 1 || r->cur_hysteresis == 1) r->cur_scale = fmax(r->cur_scale / 2, r->min_scale);
        else r->cur_hysteresis -= 1;
        r->last_overflow_iter = r->cur_iter;
    } else {
        if ((r->cur_iter - r->last_overflow_iter) % r->scale_window == 0) {
            r->cur_hysteresis = r->delayed_shift;
            r->cur_scale *= 2;
        }
    }
    r->cur_iter += 1;
}

/* fp16 with a loss scale far too large: the first steps overflow (inf in the
 * fp16 gradients), are skipped (weights unchanged, schedule not advanced), and
 * the scale follows DeepSpeed's schedule with hysteresis 2 and window 3. */
static void test_fp16_overflow_schedule(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    const char *prec = "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 40, \"hysteresis\": 2,"
                       " \"loss_scale_window\": 3, \"min_loss_scale\": 1},";
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), ZOFF_F16, 30, 0, &r), ZOFF_OK);
    ref_scaler ref = {.cur_scale = ldexp(1, 40), .min_scale = 1, .last_overflow_iter = -1, .scale_window = 3,
                      .delayed_shift = 2, .cur_hysteresis = 2};
    int nskipped = 0;
    for (int i = 0; i < 30; i++) {
        if (r.scales[i] != ref.cur_scale) fail_msg("step %d: scale %g, DeepSpeed's %g", i, r.scales[i], ref.cur_scale);
        ref_update(&ref, r.skipped[i]);
        nskipped += r.skipped[i];
    }
    assert_true(r.skipped[0] && r.skipped[1]); /* 2^40 overflows fp16 */
    assert_true(nskipped >= 10 && nskipped < 30); /* it found a working scale and trained */
    assert_int_equal(r.steps_taken, 30 - nskipped);
    free(r.weights);
    /* skipped steps leave the weights alone: all-overflow run == initial weights */
    const char *prec2 = "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 60, \"hysteresis\": 100},";
    run_result z;
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec2, 1), ZOFF_F16, 3, 0, &z), ZOFF_OK);
    assert_int_equal(z.steps_taken, 0);
    zoff_device *dev;
    zoff_device_options dopt = {.kind = ZOFF_BACKEND_CPU};
    assert_int_equal(zoff_device_create(&dopt, &dev), ZOFF_OK);
    zoff_gpt2 *m;
    zoff_gpt2_options mo = {.shape = {.num_layers = L, .hidden_size = C, .num_heads = NH, .max_seq_len = T,
                                      .vocab_size = V},
                            .batch_size = B, .seq_len = T, .dtype = ZOFF_F16};
    assert_int_equal(zoff_gpt2_create(dev, &mo, &m), ZOFF_OK);
    float *init = malloc((size_t)z.n * sizeof(float));
    zoff_gpt2_init_params(m, 42, init);
    assert_memory_equal(init, z.weights, (size_t)z.n * sizeof(float));
    free(init);
    free(z.weights);
    zoff_gpt2_destroy(m);
    zoff_device_destroy(dev);
}

/* A model that does not fit the device budget with the optimizer on the device
 * fits and trains with offload (state 12 B/param moves to the host). */
static void test_device_budget(void **st) {
    (void)st;
    char a[1024], b[1024];
    run_result r;
    /* measure what offload needs, then give the device 10% more than that */
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, "\"bf16\": {\"enabled\": true},", 1), ZOFF_BF16, 2, 0, &r),
                     ZOFF_OK);
    size_t budget = r.device_peak + r.device_peak / 10;
    free(r.weights);
    assert_int_equal(train(cfg_json(b, sizeof b, DEVICE, "\"bf16\": {\"enabled\": true},", 1), ZOFF_BF16, 2, budget, &r),
                     ZOFF_ERR_DEVICE_OOM);
    assert_non_null(strstr(zoff_last_error(), "device out of memory"));
    free(r.weights);
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, "\"bf16\": {\"enabled\": true},", 1), ZOFF_BF16, 4, budget, &r),
                     ZOFF_OK);
    assert_true(r.losses[3] < r.losses[0]);
    free(r.weights);
}

/* The snapshot: what the reader read is the state at begin byte for byte, whatever the budget
 * (the whole state: nothing waits; one 1 MiB slot: updates wait for the reader; none: every
 * update waits), the update mode (synchronous, pipelined, delayed), the state dtype and who
 * stages (the exact update's own pass, where the blocks lie wholly in a sub-group); and the
 * training is that of a run without it, bit for bit. With ZOFF_TEST_SNAPSHOT_HOLD the reader
 * starts only once an update has staged everything or waits, so that the figures are certain;
 * without it (the last run) the timing decides. */
static void check_snapshot(const char *zero, const char *prec, zoff_dtype dt, bool waits, size_t ssize, bool fused,
                           bool device_share) {
    const int hidden = fused ? 256 : 128; /* blocks of 1 MiB wholly inside a layer group's sub-group: a wider model */
    char cfg[1024];
    cfg_json(cfg, sizeof cfg, zero, prec, 1);
    g_mode = (train_mode){.hidden = hidden, .waits = waits};
    run_result plain;
    assert_int_equal(train(cfg, dt, 7, 0, &plain), ZOFF_OK);
    /* b 4 and 5: exactly zoff_engine_snapshot_bytes (the whole arena: no update waits), and one block less (one
     * must) */
    /* b 6 and 7 (a device share): the reader takes the device's copy first, as the writer does (6), or the copy is
     * begun at the boundary, before the flush and begin, on a thread of its own, the arena held since step 1 (7), as
     * the trainer does; each copy waits a second before it begins. The next device update must wait for it (else the
     * copy holds that update's values) */
    const size_t budgets[] = {SIZE_MAX, (size_t)1 << 20, 0, SIZE_MAX, 0, 0, SIZE_MAX, SIZE_MAX};
    for (int b = 0; b < (device_share ? 8 : 6); b++) {
        snap_test t = {.at = 2, .budget = budgets[b], .plus_min = device_share && (b < 4 || b >= 6),
                       .full_less = b == 4 || b == 5 ? b - 4 : -1, .copy_first = b == 6, .ahead = b == 7,
                       .prepare = b == 7};
        g_snaptest = &t;
        g_mode = (train_mode){.hidden = hidden, .waits = waits};
        if (b != 3 && b < 6) setenv("ZOFF_TEST_SNAPSHOT_HOLD", "1", 1);
        if (b >= 6) setenv("ZOFF_TEST_SNAPSHOT_DEVICE_DELAY_MS", "1000", 1);
        run_result r;
        assert_int_equal(train(cfg, dt, 7, 0, &r), ZOFF_OK);
        unsetenv("ZOFF_TEST_SNAPSHOT_HOLD");
        unsetenv("ZOFF_TEST_SNAPSHOT_DEVICE_DELAY_MS");
        g_snaptest = NULL;
        assert_true(t.started);
        assert_int_equal(t.s, ZOFF_OK);
        for (int i = 0; i < 3; i++) {
            if (memcmp(t.got[i], t.ref[i], (size_t)t.n * sizeof(float)) != 0)
                fail_msg("%s, budget %zu: state array %d read through the snapshot differs from the state at begin",
                         zero, budgets[b], i);
            free(t.got[i]);
            free(t.ref[i]);
        }
        assert_memory_equal(r.weights, plain.weights, (size_t)plain.n * sizeof(float));
        assert_memory_equal(r.losses, plain.losses, sizeof plain.losses);
        /* a device share: its master, m and v copied whole at begin (fp32), at least one 1 MiB block */
        assert_true(device_share ? t.n_dev > 0 && t.n_host > 0 : t.n_dev == 0);
        assert_int_equal(t.stats.device, (size_t)t.n_dev * 3 * sizeof(float));
        if (device_share && (b < 4 || b >= 6))
            assert_true(t.min_bytes >= t.stats.device && t.min_bytes < t.stats.device + ((size_t)1 << 20));
        /* the device's copy is taken once per save, by the reader or the next device update (which then spent it) */
        if (device_share) assert_true(t.stats.device_seconds > 0 && t.stats.device_wait <= t.stats.device_seconds + 1);
        if (b >= 6) {
            print_message("snapshot: the device's copy took %.3f s, the training waited %.3f s for it\n",
                          t.stats.device_seconds, t.stats.device_wait);
            assert_true(t.stats.device_seconds >= 0.9 && t.stats.device_wait > 0.5);
        }
        if (b == 4 || b == 5) { /* the whole arena: a 1 MiB slot per 1 MiB - 4 KiB of each host array (master, m, v), and the
                         device share's copy in whole MiB */
            const size_t mib = (size_t)1 << 20, per = mib - 4096, img = (t.stats.device + mib - 1) / mib * mib;
            const size_t host[3] = {(size_t)t.n_host * sizeof(float), (size_t)t.n_host * ssize, (size_t)t.n_host * ssize};
            size_t want = img;
            for (int a = 0; a < 3; a++) want += (host[a] + per - 1) / per * mib;
            if (t.full != want)
                fail_msg("%s: zoff_engine_snapshot_bytes %zu, expected %zu (host state %zu, %zu, %zu; device copy %zu)",
                         zero, t.full, want, host[0], host[1], host[2], img);
            assert_int_equal(t.stats.budget, t.budget);
        }
        if (b == 4) {
            assert_true(t.stats.update_wait == 0);
            assert_int_equal(t.stats.staged, (size_t)t.n_host * (sizeof(float) + 2 * ssize));
        }
        if (b == 5) assert_true(t.stats.update_wait > 0);
        if (b == 0) { /* every element of the host's master, m and v staged, no wait */
            assert_true(t.stats.update_wait == 0);
            assert_int_equal(t.stats.staged, (size_t)t.n_host * (sizeof(float) + 2 * ssize));
            /* the exact update's pass stages the blocks wholly inside a sub-group (none in sub-groups of 3000;
             * some in wider ones: not those across a boundary), protect the rest */
            if (!fused) assert_int_equal(t.stats.staged_in_update, 0);
            if (fused) print_message("snapshot: %zu of %zu bytes staged by the update's pass\n", t.stats.staged_in_update, t.stats.staged);
            if (fused) assert_true(t.stats.staged_in_update > 0 && t.stats.staged_in_update < t.stats.staged);
            /* staged copies are lent where they lie aligned as in the file: m and v, and with blocks inside the
             * layer groups' sub-groups the master's tensors too */
            print_message("snapshot: %zu bytes borrowed (master %zu, m %zu, v %zu)\n", t.borrowed, t.borrowed_i[0],
                          t.borrowed_i[1], t.borrowed_i[2]);
            if (t.kept_size[1] == ssize) assert_true(t.borrowed_i[1] > 0 && t.borrowed_i[2] > 0);
            else assert_true(t.borrowed_i[1] == 0 && t.borrowed_i[2] == 0); /* saved widened: read, not lent */
            /* the master: each block's copy shifted to its largest tensor run's file alignment, so that most of it
             * is lent (unshifted copies lend only tensors that start at a multiple of 1024 elements: 35% here) */
            if (fused && 4 * t.borrowed_i[0] < 3 * (size_t)t.n_host * sizeof(float))
                fail_msg("%s: %zu of the master's %zu bytes lent", zero, t.borrowed_i[0], (size_t)t.n_host * sizeof(float));
        }
        if (b == 1) assert_true(t.stats.staged > 0 && t.stats.update_wait > 0);
        if (b >= 1 && b <= 2) assert_int_equal(t.borrowed, 0); /* a budget of one slot or none is the updates' */
        if (b == 2) assert_true(t.stats.staged == 0 && t.stats.budget == t.min_bytes && t.stats.update_wait > 0);
        free(r.weights);
    }
    free(plain.weights);
}

/* An exact update that fails while a snapshot waits for it to stage its blocks
 * (ZOFF_TEST_UPDATE_FAIL_STEP: step 3's update fails at the first sub-group with blocks left to
 * its pass, the snapshot begun after step 2): the training gets the update's error and the reader an error too, at once (the save
 * is abandoned, never written from half-staged blocks, and nothing waits forever). */
static void test_snapshot_update_fails(void **st) {
    (void)st;
    char cfg[1024];
    cfg_json(cfg, sizeof cfg, "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", 1);
    snap_test t = {.at = 2, .budget = SIZE_MAX};
    g_snaptest = &t;
    g_mode = (train_mode){.hidden = 256};
    setenv("ZOFF_TEST_UPDATE_FAIL_STEP", "3", 1);
    run_result r = {0};
    zoff_status s = train(cfg, ZOFF_F32, 5, 0, &r);
    unsetenv("ZOFF_TEST_UPDATE_FAIL_STEP");
    g_snaptest = NULL;
    g_mode = (train_mode){0};
    assert_int_equal(s, ZOFF_ERR_INTERNAL);
    assert_true(t.started);
    assert_int_equal(t.s, ZOFF_ERR_INTERNAL);
    print_message("snapshot after a failed update: %s\n", zoff_last_error());
    for (int i = 0; i < 3; i++) {
        free(t.got[i]);
        free(t.ref[i]);
    }
    free(r.weights);
}

/* The arena asked for after step 1 (zoff_engine_snapshot_prepare, as the trainer does before
 * its first periodic save): it is the whole state's, the background thread faults every page
 * of it in (the resident set grows by at least that much: measured by the kernel, not by the
 * engine's count), the save begun after step 3 reuses it and says so, and what it reads and
 * the training are as without it. */
/* A device share's copy begun at a boundary whose save never begins (the run ends, or fails, first; the copy waits
 * 300 ms before it begins): the engine is destroyed with the copy in flight. It must be joined before the device's
 * state is freed (the ASan suite sees a read of freed memory otherwise), and nothing hangs. */
static void test_snapshot_ahead_unused(void **st) {
    (void)st;
    char cfg[1024];
    cfg_json(cfg, sizeof cfg, "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", "
             "\"ratio\": 0.5}}", "", 1);
    snap_test t = {.at = 4, .budget = SIZE_MAX, .prepare = true, .ahead_only = true};
    g_snaptest = &t;
    g_mode = (train_mode){.hidden = 128};
    setenv("ZOFF_TEST_SNAPSHOT_DEVICE_DELAY_MS", "300", 1);
    run_result r;
    const double t0 = zoff_now();
    assert_int_equal(train(cfg, ZOFF_F32, 4, 0, &r), ZOFF_OK);
    const double took = zoff_now() - t0;
    unsetenv("ZOFF_TEST_SNAPSHOT_DEVICE_DELAY_MS");
    g_snaptest = NULL;
    g_mode = (train_mode){0};
    assert_false(t.started);
    print_message("snapshot ahead, never begun: the run and the engine's end took %.3f s\n", took);
    free(r.weights);
}

static void test_snapshot_prepare(void **st) {
    (void)st;
    char cfg[1024];
    cfg_json(cfg, sizeof cfg, "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", 1);
    g_mode = (train_mode){.hidden = 256};
    run_result plain;
    assert_int_equal(train(cfg, ZOFF_F32, 6, 0, &plain), ZOFF_OK);
    snap_test t = {.at = 3, .budget = SIZE_MAX, .prepare = true};
    g_snaptest = &t;
    g_mode = (train_mode){.hidden = 256};
    setenv("ZOFF_TEST_SNAPSHOT_HOLD", "1", 1); /* every block staged, whatever the timing */
    run_result r;
    assert_int_equal(train(cfg, ZOFF_F32, 6, 0, &r), ZOFF_OK);
    unsetenv("ZOFF_TEST_SNAPSHOT_HOLD");
    g_snaptest = NULL;
    g_mode = (train_mode){0};
    assert_true(t.started);
    assert_int_equal(t.s, ZOFF_OK);
    const size_t state = (size_t)plain.n * 3 * sizeof(float), bb = zoff_engine_snapshot_block_bytes();
    print_message("snapshot prepare: arena %zu bytes (state %zu), %zu of them resident, the save says %zu "
                  "faulted in ahead\n", t.held, state, t.resident, t.stats.prefaulted);
    assert_true(t.held >= state && t.held < state + 3 * bb); /* the whole state's blocks */
    assert_int_equal(t.resident, t.held);                    /* every page of it */
    assert_int_equal(t.stats.prefaulted, t.held);
    assert_int_equal(t.stats.budget, t.held);
    assert_int_equal(t.stats.staged, state); /* the whole state staged into it, nothing waited */
    for (int i = 0; i < 3; i++) {
        assert_memory_equal(t.got[i], t.ref[i], (size_t)t.n * sizeof(float));
        free(t.got[i]);
        free(t.ref[i]);
    }
    assert_memory_equal(r.weights, plain.weights, (size_t)plain.n * sizeof(float));
    assert_memory_equal(r.losses, plain.losses, sizeof plain.losses);
    free(r.weights);
    free(plain.weights);
}

static void test_snapshot(void **st) {
    (void)st;
    check_snapshot(OFFLOAD, "", ZOFF_F32, false, 4, false, false);
    check_snapshot(OFFLOAD, "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},", ZOFF_BF16, true, 2, false, false);
    check_snapshot("{\"stage\": 2, \"sub_group_size\": 3000, \"zoff_delayed_param_update\": true, "
                   "\"zoff_delayed_param_update_warmup\": 1, \"offload_optimizer\": {\"device\": \"cpu\"}}",
                   "", ZOFF_F32, false, 4, false, false);
    const char *wide = "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"; /* sub-groups of layer groups */
    check_snapshot(wide, "", ZOFF_F32, false, 4, true, false);
    check_snapshot(wide, "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},", ZOFF_BF16, true, 2, true, false);
    /* Twin-Flow: half of the sub-groups' state on the device, copied at begin; the host half as above */
    const char *twin = "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}";
    check_snapshot(twin, "", ZOFF_F32, false, 4, false, true);
    check_snapshot(twin, "\"bf16\": {\"enabled\": true},", ZOFF_BF16, false, 4, false, true);
    /* bf16 m and v on the host, fp32 on the device: the writer reads both as fp32 */
    check_snapshot(twin, "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},", ZOFF_BF16, true, 2, false, true);
}

/* Delayed parameter update: one step stale after a warm-up of 3; the loss curve
 * stays within 5% of the undelayed one over 20 steps and still falls. */
static void test_delayed_update(void **st) {
    (void)st;
    char a[1024], b[1024];
    run_result d, u;
    const char *dz = "{\"stage\": 2, \"sub_group_size\": 3000, \"zoff_delayed_param_update\": true,"
                     " \"zoff_delayed_param_update_warmup\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}}";
    assert_int_equal(train(cfg_json(a, sizeof a, dz, "", 1), ZOFF_F32, 20, 0, &d), ZOFF_OK);
    assert_int_equal(train(cfg_json(b, sizeof b, OFFLOAD, "", 1), ZOFF_F32, 20, 0, &u), ZOFF_OK);
    for (int i = 0; i < 4; i++) assert_true(d.losses[i] == u.losses[i]); /* warm-up + first delayed forward */
    bool differs = false;
    for (int i = 0; i < 20; i++) {
        double rel = fabs(d.losses[i] - u.losses[i]) / u.losses[i];
        if (rel > 0.05) fail_msg("step %d: delayed loss %.4f vs %.4f", i, d.losses[i], u.losses[i]);
        differs |= d.losses[i] != u.losses[i];
    }
    assert_true(differs); /* the delay is real */
    assert_true(d.losses[19] < d.losses[0] - 0.1);
    free(d.weights);
    free(u.weights);
}

/* Resume of the delayed update through the engine's API, as a checkpoint does it: the state
 * after step k (zoff_engine_flush_state, which must not change the run), the device's weights
 * and the pending flag restored into a fresh engine (zoff_engine_mark_weights_pending, then
 * zoff_engine_device_weights) give the uninterrupted run's losses, norms and final master bit
 * for bit. k: the end of the warm-up (nothing pending) and after it; fp32 and bf16; with and
 * without the per-group weight waits (the pipelined pushes during backward); Twin-Flow. The
 * reference is the uninterrupted run; without the restored device weights the first resumed
 * forward would use the newest update's weights and differ (checked). */
static void check_delayed_resume(const char *zero, zoff_dtype dt, const char *prec, int accum, bool waits, int k) {
    char a[1024];
    cfg_json(a, sizeof a, zero, prec, accum);
    const int N = 7;
    run_result full, part, res;
    engine_snap sn = {.at = k};
    g_mode = (train_mode){.waits = waits};
    assert_int_equal(train(a, dt, N, 0, &full), ZOFF_OK);
    g_snap = &sn;
    assert_int_equal(train(a, dt, N, 0, &part), ZOFF_OK); /* the same run, snapshot after step k */
    g_snap = NULL;
    g_resume = &sn;
    assert_int_equal(train(a, dt, N, 0, &res), ZOFF_OK);
    g_resume = NULL;
    for (int i = 0; i < N; i++) {
        assert_true(part.losses[i] == full.losses[i] && part.norms[i] == full.norms[i]);
        if (i >= k && (res.losses[i] != full.losses[i] || res.norms[i] != full.norms[i]))
            fail_msg("resumed after step %d: step %d loss %.8f norm %.8f vs %.8f %.8f", k, i + 1, res.losses[i],
                     res.norms[i], full.losses[i], full.norms[i]);
    }
    assert_memory_equal(res.weights, full.weights, (size_t)full.n * sizeof(float));
    if (sn.pending) { /* the test can fail: the newest weights in the first resumed forward change its loss */
        sn.pending = false;
        run_result bad;
        g_resume = &sn;
        assert_int_equal(train(a, dt, N, 0, &bad), ZOFF_OK);
        g_resume = NULL;
        assert_true(bad.losses[k] != full.losses[k]);
        free(bad.weights);
    }
    g_mode = (train_mode){0};
    snap_free(&sn);
    free(full.weights);
    free(part.weights);
    free(res.weights);
}

static void test_delayed_resume(void **st) {
    (void)st;
    const char *dz = "{\"stage\": 2, \"sub_group_size\": 3000, \"zoff_delayed_param_update\": true,"
                     " \"zoff_delayed_param_update_warmup\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}";
    const char *tz = "{\"stage\": 2, \"sub_group_size\": 3000, \"zoff_delayed_param_update\": true,"
                     " \"zoff_delayed_param_update_warmup\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}";
    const char *bf = "\"bf16\": {\"enabled\": true},";
    check_delayed_resume(dz, ZOFF_F32, "", 1, false, 2);
    check_delayed_resume(dz, ZOFF_F32, "", 1, false, 4);
    check_delayed_resume(dz, ZOFF_BF16, bf, 2, true, 2);
    check_delayed_resume(dz, ZOFF_BF16, bf, 2, true, 3);
    check_delayed_resume(tz, ZOFF_BF16, bf, 1, true, 3);
}

/* Twin-Flow: ratios 0, 0.3 and 0.7 (part of the update on the device, on its
 * own stream, at the same time as the host part) give ratio 1's losses and
 * weights, with the tolerances of the offload-vs-device test. */
static void check_ratios(zoff_dtype dt, const char *prec, double loss_tol, double w_tol) {
    char a[1024], b[1024], z[512];
    run_result ref;
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), dt, 6, 0, &ref), ZOFF_OK);
    assert_true(ref.host_ratio == 1.0);
    const double ratios[] = {0.0, 0.3, 0.7};
    for (int k = 0; k < 3; k++) {
        snprintf(z, sizeof z,
                 "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": %g}}",
                 ratios[k]);
        run_result r;
        assert_int_equal(train(cfg_json(b, sizeof b, z, prec, 1), dt, 6, 0, &r), ZOFF_OK);
        /* whole sub-groups: at least the ratio, less than the ratio plus one sub-group */
        assert_true(r.host_ratio >= ratios[k] && r.host_ratio < ratios[k] + 3000.0 / (double)r.n + 1e-9);
        for (int i = 0; i < 6; i++)
            if (fabs(r.losses[i] - ref.losses[i]) > loss_tol * ref.losses[i])
                fail_msg("ratio %g step %d: loss %.7f vs ratio 1 %.7f", ratios[k], i, r.losses[i], ref.losses[i]);
        double w = max_rel_diff(r.weights, ref.weights, r.n);
        printf("ratio %g (%s): host fraction %.3f, weights rel L2 diff vs ratio 1: %.3g\n", ratios[k],
               dt == ZOFF_F32 ? "f32" : dt == ZOFF_BF16 ? "bf16" : "fp16", r.host_ratio, w);
        if (w > w_tol) fail_msg("ratio %g: weights differ by %.3g > %.3g", ratios[k], w, w_tol);
        free(r.weights);
    }
    free(ref.weights);
}
static void test_twin_flow_f32(void **st) { (void)st; check_ratios(ZOFF_F32, "", 1e-5, 1e-4); }
static void test_twin_flow_bf16(void **st) {
    (void)st;
    check_ratios(ZOFF_BF16, "\"bf16\": {\"enabled\": true},", 1e-4, 3e-2);
}
static void test_twin_flow_fp16(void **st) {
    (void)st;
    check_ratios(ZOFF_F16, "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 8},", 1e-4, 3e-2);
}

/* "ratio": "auto" under a device budget picks the smallest host fraction that
 * fits: it trains, and one sub-group less on the host does not fit. */
static void test_auto_ratio_minimal(void **st) {
    (void)st;
    char a[1024], b[1024], z[512];
    run_result full, r;
    const char *prec = "\"bf16\": {\"enabled\": true},";
    /* device peak with everything on the host, then room for about half the device state */
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), ZOFF_BF16, 1, 0, &full), ZOFF_OK);
    free(full.weights);
    size_t budget = (size_t)((double)(full.device_peak + (size_t)full.n * 6) / 0.95);
    const char *az = "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": \"auto\"}}";
    assert_int_equal(train(cfg_json(a, sizeof a, az, prec, 1), ZOFF_BF16, 3, budget, &r), ZOFF_OK);
    printf("auto ratio under a %zu-byte budget: host fraction %.3f\n", budget, r.host_ratio);
    assert_true(r.host_ratio > 0.2 && r.host_ratio < 0.9);
    assert_true(r.losses[2] < r.losses[0]);
    free(r.weights);
    double less = r.host_ratio - 3000.0 / (double)r.n - 1e-6;
    snprintf(z, sizeof z,
             "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": %.6f}}", less);
    assert_int_equal(train(cfg_json(b, sizeof b, z, prec, 1), ZOFF_BF16, 3, budget, &r), ZOFF_ERR_DEVICE_OOM);
    free(r.weights);
    /* no budget at all: auto keeps everything on the device */
    assert_int_equal(train(cfg_json(a, sizeof a, az, prec, 1), ZOFF_BF16, 1, 0, &r), ZOFF_OK);
    assert_true(r.host_ratio == 0.0);
    free(r.weights);
    /* a budget the model alone fills: a clear error with numbers */
    assert_int_equal(train(cfg_json(a, sizeof a, az, prec, 1), ZOFF_BF16, 1, full.device_peak, &r),
                     ZOFF_ERR_DEVICE_OOM);
    assert_non_null(strstr(zoff_last_error(), "even ratio 1"));
    free(r.weights);
}

/* The engine checks host memory for its host part before allocating it: with less available
 * than the optimizer state needs, offload is refused with the sizes and what to change; the
 * same job with the optimizer on the device (nothing on the host) runs. The state needs
 * n x (4 + 4 + 4 + 2) bytes here (bf16: master, m, v, one buffer for the gradients in and
 * the new weights out; zoff_engine_memory_usage says the same). */
static void test_host_memory_checked(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    const char *prec = "\"bf16\": {\"enabled\": true},";
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), ZOFF_BF16, 1, 0, &r), ZOFF_OK);
    free(r.weights);
    size_t need = (size_t)r.n * 14;
    assert_int_equal(r.host_bytes, need);
    char v[32];
    snprintf(v, sizeof v, "%zu", need - need / 10);
    setenv("ZOFF_TEST_MEM_AVAILABLE", v, 1);
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), ZOFF_BF16, 1, 0, &r), ZOFF_ERR_NOMEM);
    const char *msg = zoff_last_error();
    printf("%s\n", msg);
    assert_non_null(strstr(msg, "host part of the optimizer"));
    assert_non_null(strstr(msg, "offload_optimizer.ratio"));
    free(r.weights);
    assert_int_equal(train(cfg_json(a, sizeof a, DEVICE, prec, 1), ZOFF_BF16, 1, 0, &r), ZOFF_OK);
    free(r.weights);
    snprintf(v, sizeof v, "%zu", need + need / 10);
    setenv("ZOFF_TEST_MEM_AVAILABLE", v, 1);
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, prec, 1), ZOFF_BF16, 1, 0, &r), ZOFF_OK);
    free(r.weights);
    unsetenv("ZOFF_TEST_MEM_AVAILABLE");
}

/* pin_memory pins exactly what device copies read or write; the optimizer state, which
 * only the CPU touches, stays pageable. The expected bytes are written out here from the
 * rule, per parameter (all of them on the host: ratio 1, one rank): 16-bit weights, one
 * buffer that carries the gradient in and the new weight out (2 B, pinned); delayed update,
 * two of them; speculation, a separate staging buffer (pinned) and the rollback copy of
 * master, m, v (12 B, pageable); fp32 weights: the fp32 gradient buffer and the master, which
 * the new weights are pushed from (pinned), m and v pageable; bf16 m and v: 4 + 2 + 2 B of
 * state. The pinned figure is the device's own account of zoff_host_alloc_pinned's bytes
 * during zoff_engine_create. The results do not depend on what is pinned. */
static void test_pinned_only_dma(void **st) {
    (void)st;
    typedef struct {
        const char *zero, *prec;
        zoff_dtype dt;
        size_t pinned, pageable; /* per parameter, with pin_memory */
    } pcase;
    const char *bf16 = "\"bf16\": {\"enabled\": true},";
    const char *bf16s = "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},";
#define PZ(extra) "{\"stage\": 2, \"sub_group_size\": 3000, " extra "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": %s}}"
    const pcase cases[] = {
        {PZ(""), "bf16", ZOFF_BF16, 2, 12},
        {PZ(""), "bf16s", ZOFF_BF16, 2, 8},
        {PZ("\"zoff_delayed_param_update\": true, "), "bf16", ZOFF_BF16, 4, 12},
        {PZ(""), "", ZOFF_F32, 8, 8},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        run_result r[2];
        for (int pin = 1; pin >= 0; pin--) {
            char z[512], a[1024];
            snprintf(z, sizeof z, cases[k].zero, pin ? "true" : "false");
            const char *prec = !strcmp(cases[k].prec, "bf16") ? bf16 : !strcmp(cases[k].prec, "bf16s") ? bf16s : "";
            assert_int_equal(train(cfg_json(a, sizeof a, z, prec, 1), cases[k].dt, 3, 0, &r[pin]), ZOFF_OK);
            const size_t n = (size_t)r[pin].n, pinned = pin ? cases[k].pinned * n : 0;
            const size_t all = (cases[k].pinned + cases[k].pageable) * n;
            printf("case %zu pin %d: pinned %zu (asked %zu), pageable %zu; expected %zu, %zu\n", k, pin,
                   r[pin].em_pinned, r[pin].pinned_asked, r[pin].em_pageable, pinned, all - pinned);
            assert_int_equal(r[pin].pinned_asked, pinned);
            assert_int_equal(r[pin].em_pinned, pinned);
            assert_int_equal(r[pin].em_pageable, all - pinned);
        }
        for (int i = 0; i < 3; i++) assert_memory_equal(&r[0].losses[i], &r[1].losses[i], sizeof(float));
        assert_memory_equal(r[0].weights, r[1].weights, (size_t)r[0].n * sizeof(float));
        free(r[0].weights);
        free(r[1].weights);
    }
    /* speculation (fp16 here): + a 16-bit staging buffer (pinned), + the rollback copy (pageable) */
    char a[1024];
    run_result r;
    g_mode.waits = true;
    zoff_status s = train(cfg_json(a, sizeof a,
                                   "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": "
                                   "\"cpu\", \"super_offload\": true, \"pin_memory\": true}}",
                                   "\"fp16\": {\"enabled\": true},", 1),
                          ZOFF_F16, 2, 0, &r);
    g_mode.waits = false;
    assert_int_equal(s, ZOFF_OK);
    const size_t n = (size_t)r.n;
    printf("speculation: pinned %zu (asked %zu), pageable %zu; n %zu\n", r.em_pinned, r.pinned_asked, r.em_pageable, n);
    assert_int_equal(r.pinned_asked, n * (2 + 2));
    assert_int_equal(r.em_pinned, n * (2 + 2));
    assert_int_equal(r.em_pageable, n * (12 + 12));
    free(r.weights);
#undef PZ
}

/* The host state's large arrays (master, m, v: >= 64 MiB each here) ask for transparent huge
 * pages unless ZOFF_HUGEPAGES=0, as the kernel reports (smaps VmFlags "hg"); a value other than
 * 0 or 1 is an error naming the variable. Skipped where the kernel has no transparent huge pages. */
static void test_state_huge_pages(void **st) {
    (void)st;
    if (access("/sys/kernel/mm/transparent_hugepage/enabled", R_OK) != 0) {
        print_message("no transparent huge pages in this kernel (/sys/kernel/mm/transparent_hugepage): skipped\n");
        skip();
    }
    char a[1024];
    const char *cfg = cfg_json(a, sizeof a, OFFLOAD, "\"bf16\": {\"enabled\": true},", 1);
    g_mode.vocab = 65536, g_mode.hidden = 256, g_mode.layers = 1; /* 16.9M parameters: 64.5 MiB of fp32 */
    g_mode.count_thp = true;
    const char *envs[] = {NULL, "1", "0"};
    const int want[] = {3, 3, 0};
    run_result r;
    for (int k = 0; k < 3; k++) {
        if (envs[k]) setenv("ZOFF_HUGEPAGES", envs[k], 1);
        else unsetenv("ZOFF_HUGEPAGES");
        zoff_status s = train(cfg, ZOFF_BF16, 1, 0, &r);
        assert_int_equal(s, ZOFF_OK);
        print_message("ZOFF_HUGEPAGES %s: %d arrays advised, %zu MiB of them in huge pages; %lld parameters\n",
                      envs[k] ? envs[k] : "unset", r.thp_arrays, r.thp_bytes >> 20, (long long)r.n);
        assert_true((size_t)r.n * sizeof(float) >= (size_t)64 << 20);
        assert_int_equal(r.thp_arrays, want[k]);
        free(r.weights);
    }
    setenv("ZOFF_HUGEPAGES", "yes", 1);
    assert_int_equal(train(cfg, ZOFF_BF16, 1, 0, &r), ZOFF_ERR_CONFIG);
    assert_non_null(strstr(zoff_last_error(), "ZOFF_HUGEPAGES=yes"));
    unsetenv("ZOFF_HUGEPAGES");
    g_mode = (train_mode){0};
}

/* offload_optimizer.cpuadam_cores_perc (DeepSpeed SuperOffload's share of the cores for CPU
 * Adam): the host optimizer runs max(1, round(share x logical cores)) threads; not given,
 * the default rule ($ZOFF_THREADS here). */
static void test_cpuadam_cores_perc(void **st) {
    (void)st;
    int cores = zoff_cpu_features_get()->logical_cores;
    const double shares[] = {0.0, 0.5, 1.0};
    char a[1024], z[256], want[64];
    run_result r;
    for (size_t i = 0; i < sizeof shares / sizeof *shares; i++) {
        snprintf(z, sizeof z,
                 "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"cpuadam_cores_perc\": %g}}",
                 shares[i]);
        assert_int_equal(train(cfg_json(a, sizeof a, z, "", 1), ZOFF_F32, 1, 0, &r), ZOFF_OK);
        long t = lround(shares[i] * cores);
        if (t < 1) t = 1;
        snprintf(want, sizeof want, ", %ld thread%s,", t, t == 1 ? "" : "s");
        if (!strstr(r.describe, want)) fail_msg("share %g of %d cores: want \"%s\" in: %s", shares[i], cores, want, r.describe);
        free(r.weights);
    }
    setenv("ZOFF_THREADS", "3", 1);
    assert_int_equal(train(cfg_json(a, sizeof a, OFFLOAD, "", 1), ZOFF_F32, 1, 0, &r), ZOFF_OK);
    unsetenv("ZOFF_THREADS");
    if (!strstr(r.describe, ", 3 threads,")) fail_msg("not given: want ZOFF_THREADS' 3 threads in: %s", r.describe);
    free(r.weights);
}

/* zoff_placement_build against its specification, checked element by element:
 * the sub-groups tile [0, n) in order; none crosses a multiple of the grid size
 * (sub_group_size, or for a fractional ratio with fewer than 32 of them
 * ceil(n / 32) rounded up to 64) or a cut, and each ends at one of those or at n;
 * the host holds the shortest run of whole sub-groups from the top with at least
 * ceil(ratio * n) elements. */
static void test_placement_spec(void **st) {
    (void)st;
    const int64_t ns[] = {1, 63, 1000, 4097, 123457};
    const int64_t sgss[] = {0, 1, 64, 1000, 1000000000};
    const double ratios[] = {0.0, 0.3, 0.5, 1.0};
    int64_t cuts[8];
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < sizeof sgss / sizeof *sgss; b++)
            for (size_t c = 0; c < sizeof ratios / sizeof *ratios; c++)
                for (int nc = 0; nc <= 3; nc++) {
                    int64_t n = ns[a];
                    int k = 0;
                    for (int i = 1; i <= nc; i++) /* increasing cuts in (0, n) */
                        if (n * i / (nc + 1) > (k ? cuts[k - 1] : 0)) cuts[k++] = n * i / (nc + 1) + (i == 2);
                    while (k > 0 && cuts[k - 1] >= n) k--;
                    zoff_placement_input in = {.n = n, .sub_group_size = sgss[b], .ratio = ratios[c], .cuts = cuts,
                                               .ncuts = k};
                    zoff_placement p;
                    assert_int_equal(zoff_placement_build(&in, &p), ZOFF_OK);
                    int64_t grid = sgss[b] > 0 && sgss[b] < n ? sgss[b] : n;
                    if (ratios[c] > 0 && ratios[c] < 1 && (n + grid - 1) / grid < 32) grid = ((n + 31) / 32 + 63) / 64 * 64;
                    assert_int_equal(p.grid, grid);
                    int64_t at = 0, host = 0, want = (int64_t)ceil(ratios[c] * (double)n);
                    int ci = 0;
                    bool seen_host = false;
                    for (int i = 0; i < p.nsg; i++) {
                        const zoff_subgroup_place *g = &p.sg[i];
                        assert_int_equal(g->offset, at);
                        assert_true(g->count > 0);
                        int64_t end = at + g->count, next = (at / grid + 1) * grid;
                        while (ci < k && cuts[ci] <= at) ci++;
                        if (ci < k && cuts[ci] < next) next = cuts[ci];
                        if (next > n) next = n;
                        assert_int_equal(end, next); /* ends exactly at the first line after its start */
                        if (seen_host) assert_true(g->on_host); /* the host part is a suffix */
                        seen_host = seen_host || g->on_host;
                        if (g->on_host) host += g->count;
                        at = end;
                    }
                    assert_int_equal(at, n);
                    assert_int_equal(p.host, host);
                    assert_int_equal(p.device, n - host);
                    assert_true(host >= want);
                    /* shortest: without its lowest sub-group the host would hold too little */
                    if (host > 0) {
                        int lo = p.nsg - p.host_groups;
                        assert_true(host - p.sg[lo].count < want);
                    }
                    zoff_placement_free(&p);
                }
    /* "auto": 1000-byte budget, 500 in use, 100 parameters in bf16 (12 B each on the device) */
    zoff_auto_ratio ar;
    zoff_placement_auto_ratio(1000, 500, 64, 0, 100, ZOFF_BF16, &ar);
    assert_true(ar.fits);
    assert_int_equal(ar.margin, 50);
    assert_int_equal(ar.free_bytes, 1000 - 564 - 50);
    assert_int_equal(ar.max_device, (1000 - 564 - 50) / 12);
    assert_true(fabs(ar.ratio - (100.0 - (double)((1000 - 564 - 50) / 12)) / 100.0) < 1e-15);
    zoff_placement_auto_ratio(1000, 900, 64, 0, 100, ZOFF_F32, &ar);
    assert_false(ar.fits);
    zoff_placement_auto_ratio(0, 900, 64, 0, 100, ZOFF_F32, &ar);
    assert_true(ar.fits && ar.ratio == 0.0);
    /* with buckets: the device gradient too (bf16: 12 + 2 B per device parameter) */
    zoff_placement_auto_ratio(1000, 500, 64, 2, 100, ZOFF_BF16, &ar);
    assert_int_equal(ar.per_param, 14);
    assert_int_equal(ar.max_device, (1000 - 564 - 50) / 14);
}

/* The device gradient bytes with buckets (zoff_placement_grad_device), worked by hand:
 * groups 10 (the first, held), 100, 100, 100, 4 elements of bf16. */
static void test_grad_device(void **st) {
    (void)st;
    const int64_t gc[] = {10, 100, 100, 100, 4};
    zoff_grad_device d;
    zoff_grad_device_in in = {.group_count = gc, .ngroups = 5, .device = 0, .reduce_bucket_size = 250,
                              .dtype = ZOFF_BF16};
    zoff_placement_grad_device(&in, &d); /* all on the host: held 10, ring floor(250 / 100) = 2 x 100 */
    assert_true(d.device == 0 && d.held == 10 && d.slot == 100 && d.nslots == 2);
    assert_int_equal(d.bytes, (10 + 200) * 2);
    in.reduce_bucket_size = 1; /* at least 2 */
    zoff_placement_grad_device(&in, &d);
    assert_int_equal(d.nslots, 2);
    in.reduce_bucket_size = 400; /* as many as the 4 groups after the first: each its own, exact (flat) */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.nslots == 4 && d.flat && d.ring == 304 && d.bytes == 314 * 2);
    in.reduce_bucket_size = 399; /* 3 < 4: a ring */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.nslots == 3 && !d.flat && d.ring == 300);
    in.reduce_bucket_size = 250;
    in.device = 110; /* groups 0-1 on the device: no held bucket, 3 host groups */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.device == 110 && d.held == 0 && d.slot == 100 && d.nslots == 2);
    assert_int_equal(d.bytes, (110 + 200) * 2);
    in.device = 150; /* cuts group 2: all of it in the device buffer; host groups 3 and 4 */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.device == 210 && d.held == 0 && d.flat && d.nslots == 2 && d.ring == 104);
    in.device = 310; /* only ln_f-like group 4 on the host: one bucket of its size */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.device == 310 && d.nslots == 1 && d.ring == 4 && d.bytes == 314 * 2);
    in.device = 314; /* nothing on the host */
    zoff_placement_grad_device(&in, &d);
    assert_true(d.held == 0 && d.nslots == 0 && d.bytes == 314 * 2);
    /* "auto" reserves the all-host buckets plus the statistics, and 2 B per device parameter */
    size_t fixed, per;
    zoff_placement_auto_engine_bytes(&in, 5, &fixed, &per);
    assert_int_equal(fixed, zoff_placement_stats_bytes(5) + (10 + 200) * 2);
    assert_int_equal(per, 2);
    zoff_placement_auto_engine_bytes(NULL, 5, &fixed, &per);
    assert_true(fixed == 5 * 8 && per == 0);
    in.reduce_bucket_size = 100000; /* flat: the full buffer's bytes at any ratio, nothing per device parameter */
    zoff_placement_auto_engine_bytes(&in, 5, &fixed, &per);
    assert_true(fixed == 5 * 8 + 314 * 2 && per == 0);
    /* several ranks (spread): every group in a bucket whatever the device share; the device's 150
     * elements (this rank's pieces, anywhere) in a compact buffer, none when flat */
    in.spread = true;
    in.device = 150;
    in.reduce_bucket_size = 250;
    zoff_placement_grad_device(&in, &d);
    assert_true(d.device == 0 && d.held == 10 && d.slot == 100 && d.nslots == 2 && d.compact == 150);
    assert_int_equal(d.bytes, (10 + 200 + 150) * 2);
    in.reduce_bucket_size = 400;
    zoff_placement_grad_device(&in, &d);
    assert_true(d.flat && d.compact == 0 && d.bytes == 314 * 2);
    /* with accumulation the device pieces' sum stays in the compact buffer, flat too (a flat bucket starts the
     * next micro-batch from this rank's pieces and zeros); "auto" then pays 2 B per device parameter */
    in.accumulate = true;
    zoff_placement_grad_device(&in, &d);
    assert_true(d.flat && d.compact == 150 && d.bytes == (314 + 150) * 2);
    zoff_placement_auto_engine_bytes(&in, 5, &fixed, &per);
    assert_true(fixed == 5 * 8 + 314 * 2 && per == 2);
    in.reduce_bucket_size = 250;
    zoff_placement_grad_device(&in, &d);
    assert_true(!d.flat && d.compact == 150 && d.bytes == (10 + 200 + 150) * 2);
    in.accumulate = false;
    in.spread = false;
    /* the rule: stage 1-2, offload cpu or nvme; accumulation only with "always" (the same for any number of
     * ranks, any ratio) */
    static const struct {
        zoff_grad_buckets_mode mode;
        int stage;
        zoff_offload_device off;
        int64_t accum;
        bool want;
    } rule[] = {
        {ZOFF_GRAD_BUCKETS_ON, 2, ZOFF_OFFLOAD_CPU, 1, true},
        {ZOFF_GRAD_BUCKETS_ON, 1, ZOFF_OFFLOAD_CPU, 0, true},
        {ZOFF_GRAD_BUCKETS_OFF, 2, ZOFF_OFFLOAD_CPU, 1, false},
        {ZOFF_GRAD_BUCKETS_ON, 1, ZOFF_OFFLOAD_CPU, 1, true},
        {ZOFF_GRAD_BUCKETS_ON, 2, ZOFF_OFFLOAD_CPU, 2, false},
        {ZOFF_GRAD_BUCKETS_ON, 3, ZOFF_OFFLOAD_CPU, 1, false},
        {ZOFF_GRAD_BUCKETS_ON, 2, ZOFF_OFFLOAD_NVME, 1, true},
        {ZOFF_GRAD_BUCKETS_ON, 2, ZOFF_OFFLOAD_NONE, 1, false},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 2, ZOFF_OFFLOAD_CPU, 2, true},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 1, ZOFF_OFFLOAD_CPU, 1, true},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 1, ZOFF_OFFLOAD_NVME, 3, true},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 2, ZOFF_OFFLOAD_CPU, 1, true},
        {ZOFF_GRAD_BUCKETS_ON, 1, ZOFF_OFFLOAD_CPU, 3, false},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 3, ZOFF_OFFLOAD_CPU, 2, false},
        {ZOFF_GRAD_BUCKETS_ALWAYS, 2, ZOFF_OFFLOAD_NVME, 2, true},
    };
    for (size_t k = 0; k < sizeof rule / sizeof rule[0]; k++)
        if (zoff_placement_grad_buckets_for(rule[k].mode, rule[k].stage, rule[k].off, rule[k].accum) != rule[k].want)
            fail_msg("grad buckets rule, case %zu: expected %d", k, rule[k].want);
        else if ((zoff_placement_grad_buckets_why_not(rule[k].mode, rule[k].stage, rule[k].off, rule[k].accum) ==
                  NULL) != rule[k].want)
            fail_msg("grad buckets rule, case %zu: a reason is given exactly when the answer is no", k);
}

/* Initial weights straight into their place (options.init_range: each host sub-group's
 * master, the device's part through the bounded piece buffer, the NVMe swap file) equal
 * those of zoff_gpt2_init_params' whole buffer (options.init_params), and train the same,
 * bit for bit: offload, Twin-Flow, no offload, NVMe; bf16 and fp32; exact and pipelined. */
static void test_init_range_equals_whole(void **st) {
    (void)st;
    char dir[] = "/tmp/zoff_test_init_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char nvme[256], a[1024];
    snprintf(nvme, sizeof nvme,
             "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"nvme\", "
             "\"nvme_path\": \"%s\"}}", dir);
    const char *zeros[] = {OFFLOAD,
                           "{\"stage\": 2, \"sub_group_size\": 3000, \"offload_optimizer\": {\"device\": \"cpu\", "
                           "\"ratio\": 0.5}}",
                           DEVICE, nvme};
    for (int zi = 0; zi < 4; zi++)
        for (int d = 0; d < 2; d++)
            for (int steps = 0; steps <= 2; steps += 2) {
                zoff_dtype dt = d ? ZOFF_F32 : ZOFF_BF16;
                cfg_json(a, sizeof a, zeros[zi], d ? "" : "\"bf16\": {\"enabled\": true},", 1);
                run_result whole, ranged;
                g_mode.waits = steps > 0 && zi < 2;
                assert_int_equal(train(a, dt, steps, 0, &whole), ZOFF_OK);
                g_mode.range_init = true;
                zoff_status s = train(a, dt, steps, 0, &ranged);
                g_mode.range_init = false;
                g_mode.waits = false;
                assert_int_equal(s, ZOFF_OK);
                assert_memory_equal(ranged.weights, whole.weights, (size_t)whole.n * sizeof(float));
                for (int i = 0; i < steps; i++) assert_memory_equal(&ranged.losses[i], &whole.losses[i], sizeof(float));
                free(whole.weights);
                free(ranged.weights);
            }
    (void)rmdir(dir);
}

/* The pipelined step (options.weight_waits: the host update on the worker in forward
 * order, each group's weights pushed at once, the forward waiting per group) computes
 * exactly what the synchronous step computes: the same host Adam on the same
 * elements, only in another order and on another thread. Losses, gradient norms,
 * loss scales and final weights bit for bit, for fp32 / bf16 / fp16 (with skipped
 * overflow steps), Twin-Flow ratio 0.5 and 2 accumulation steps. */
static void check_pipelined(const char *zero, zoff_dtype dt, const char *prec, int accum, int nsteps) {
    char a[1024];
    run_result sy, pi;
    cfg_json(a, sizeof a, zero, prec, accum);
    assert_int_equal(train(a, dt, nsteps, 0, &sy), ZOFF_OK);
    g_mode.waits = true;
    zoff_status s = train(a, dt, nsteps, 0, &pi);
    g_mode.waits = false;
    assert_int_equal(s, ZOFF_OK);
    for (int i = 0; i < nsteps; i++) {
        if (memcmp(&sy.losses[i], &pi.losses[i], sizeof(float)) || sy.norms[i] != pi.norms[i] ||
            sy.scales[i] != pi.scales[i] || sy.skipped[i] != pi.skipped[i])
            fail_msg("%s %s step %d: pipelined loss %.9g norm %.9g vs synchronous %.9g %.9g", zero, prec, i,
                     pi.losses[i], pi.norms[i], sy.losses[i], sy.norms[i]);
    }
    assert_memory_equal(sy.weights, pi.weights, (size_t)sy.n * sizeof(float));
    assert_int_equal(sy.steps_taken, pi.steps_taken);
    free(sy.weights);
    free(pi.weights);
}

static void test_pipelined_equals_synchronous(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    check_pipelined(OFFLOAD, ZOFF_F32, "", 1, 6);
    check_pipelined(OFFLOAD, ZOFF_BF16, bf, 1, 6);
    check_pipelined(OFFLOAD, ZOFF_F16, "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 20, \"hysteresis\": 1,"
                                       " \"loss_scale_window\": 2},", 1, 10);
    check_pipelined(OFFLOAD, ZOFF_BF16, bf, 2, 5);
    check_pipelined("{\"stage\": 1, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}", ZOFF_BF16, bf, 1, 5);
    check_pipelined("{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", ZOFF_F32, "", 1, 5);
}

/* The timeline of the pipelined step: the next forward gets the embeddings (the
 * first group it reads, updated first) while the host optimizer still works on the
 * later groups. A larger model (8 blocks) so that the rest of the update takes
 * milliseconds; the machine is shared, so most steps (not every one) must show it. */
static void test_pipelined_timeline(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    g_mode.waits = true;
    g_mode.layers = 8;
    g_mode.hidden = 128;
    zoff_status s = train(cfg_json(a, sizeof a, "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}", "", 1),
                          ZOFF_F32, 8, 0, &r);
    g_mode.waits = false;
    g_mode.layers = g_mode.hidden = 0;
    assert_int_equal(s, ZOFF_OK);
    int early = 0;
    for (int i = 1; i < 8; i++) { /* forward of iteration i vs the host update of step i */
        assert_true(g_mode.group0_ready[i] > 0);
        if (g_mode.host_t0[i] == 0) { /* its span was replaced by the next one's before the loop asked (record_host_span) */
            printf("step %d: host update not seen\n", i);
            continue;
        }
        assert_true(g_mode.host_t1[i] > g_mode.host_t0[i]);
        printf("step %d: host update %.3f ms, embeddings ready %.3f ms after it started\n", i,
               1e3 * (g_mode.host_t1[i] - g_mode.host_t0[i]), 1e3 * (g_mode.group0_ready[i] - g_mode.host_t0[i]));
        early += g_mode.group0_ready[i] < g_mode.host_t1[i];
    }
    if (early < 4) fail_msg("the forward got the embeddings before the host update ended in %d of 7 steps", early);
    free(r.weights);
}

/* The delayed update with the pipeline (options.weight_waits): job t's new weights of
 * each group go to the device during backward t+1, right after that group's backward,
 * instead of all at step t+1; the next backward's gradients go to the host without
 * waiting for the job. The values are those of the delayed update pushed at the step
 * boundary (its definition: forward and backward t+1 see the weights of update t-1),
 * bit for bit: a push that landed while backward t+1 still read the old weights would
 * change its gradients. fp32 and bf16, accumulation 1 and 2. */
static void test_delayed_pipelined(void **st) {
    (void)st;
    const char *dz = "{\"stage\": 2, \"sub_group_size\": 3000, \"zoff_delayed_param_update\": true,"
                     " \"zoff_delayed_param_update_warmup\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}";
    check_pipelined(dz, ZOFF_F32, "", 1, 12);
    check_pipelined(dz, ZOFF_BF16, "\"bf16\": {\"enabled\": true},", 2, 8);
}

/* The timeline of the delayed update: the host update of step t is still running
 * after the forward of the next iteration has started on the device (it runs during
 * that forward and backward). 8 blocks; most steps must show it (shared machine). */
static void test_delayed_timeline(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    const char *dz = "{\"stage\": 2, \"zoff_delayed_param_update\": true, \"zoff_delayed_param_update_warmup\": 1,"
                     " \"offload_optimizer\": {\"device\": \"cpu\"}}";
    g_mode.waits = true;
    g_mode.layers = 8;
    g_mode.hidden = 256; /* an update of milliseconds: at 128 (1.5 ms, about the time to the next forward) a
                            loaded CI box saw it end first in 4 of 6 steps */
    zoff_status s = train(cfg_json(a, sizeof a, dz, "", 1), ZOFF_F32, 8, 0, &r);
    g_mode.waits = false;
    g_mode.layers = g_mode.hidden = 0;
    assert_int_equal(s, ZOFF_OK);
    int during = 0;
    for (int i = 2; i < 8; i++) { /* step i (delayed: i > warm-up 1) runs during iteration i */
        assert_true(g_mode.group0_device[i] > 0);
        if (g_mode.host_t0[i] == 0) { /* its span was replaced by the next one's before the loop asked (record_host_span) */
            printf("step %d: host update not seen\n", i);
            continue;
        }
        assert_true(g_mode.host_t1[i] > g_mode.host_t0[i]);
        printf("step %d: host update %.3f ms; the next forward started on the device %.3f ms before it ended\n", i,
               1e3 * (g_mode.host_t1[i] - g_mode.host_t0[i]), 1e3 * (g_mode.host_t1[i] - g_mode.group0_device[i]));
        during += g_mode.group0_device[i] < g_mode.host_t1[i];
    }
    if (during < 3) fail_msg("the host update ran past the start of the next forward in %d of 6 steps", during);
    free(r.weights);
}

/* Speculation-then-validation (offload_optimizer.super_offload): the host updates each
 * group during the boundary backward as soon as its gradients land, assuming no
 * clipping and no overflow; the step keeps it or restores the saved master, m and v
 * and updates again. The reference is the pipelined exact step (itself bit-identical to
 * the synchronous one above). Kept speculation: bit for bit, no rollback. Rolled back
 * (a tiny clip: every speculated step; fp16 with too large a loss scale: the overflow
 * steps): also bit for bit (the saved state is restored exactly and the host
 * optimizer's bias-correction chain replayed; the issue allows 2 ulp per rollback), and
 * the rollbacks are counted. */
static const char *spec_cfg(char *buf, size_t n, bool spec, const char *prec, int accum, double clip) {
    snprintf(buf, n,
             "{\"train_micro_batch_size_per_gpu\": %d, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-2, \"weight_decay\": 0.1}},"
             " \"gradient_clipping\": %g, %s \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": %ld,"
             " \"offload_optimizer\": {\"device\": \"cpu\", \"super_offload\": %s}}}",
             (g_mode.batch ? g_mode.batch : B) / accum, accum, clip, prec, g_mode.sub_group ? g_mode.sub_group : 3000L,
             spec ? "true" : "false");
    return buf;
}

static void check_spec(zoff_dtype dt, const char *prec, int accum, double clip, int nsteps, int want_rollbacks) {
    char a[1024], b[1024];
    run_result ex, sp;
    g_mode.waits = true;
    zoff_status s1 = train(spec_cfg(a, sizeof a, false, prec, accum, clip), dt, nsteps, 0, &ex);
    zoff_status s2 = train(spec_cfg(b, sizeof b, true, prec, accum, clip), dt, nsteps, 0, &sp);
    g_mode.waits = false;
    assert_int_equal(s1, ZOFF_OK);
    assert_int_equal(s2, ZOFF_OK);
    for (int i = 0; i < nsteps; i++)
        if (memcmp(&ex.losses[i], &sp.losses[i], sizeof(float)) ||
            !(ex.norms[i] == sp.norms[i] || (isnan(ex.norms[i]) && isnan(sp.norms[i]))) || ex.skipped[i] != sp.skipped[i])
            fail_msg("%s clip %g step %d: speculative loss %.9g norm %.9g vs exact %.9g %.9g", prec, clip, i,
                     sp.losses[i], sp.norms[i], ex.losses[i], ex.norms[i]);
    assert_memory_equal(ex.weights, sp.weights, (size_t)ex.n * sizeof(float));
    printf("%s accum %d clip %g: %lld rollbacks in %d steps\n", prec, accum, clip, (long long)sp.rollbacks, nsteps);
    if (want_rollbacks >= 0) assert_int_equal(sp.rollbacks, want_rollbacks);
    assert_int_equal(ex.rollbacks, 0);
    free(ex.weights);
    free(sp.weights);
}

static void test_speculative_equals_exact(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    check_spec(ZOFF_F32, "", 1, 0.0, 8, 0);    /* nothing to undo: step 1 has no learning rate to assume */
    check_spec(ZOFF_BF16, bf, 1, 0.0, 8, 0);
    check_spec(ZOFF_BF16, bf, 2, 0.0, 6, 0);   /* speculation in the boundary micro-batch only */
    check_spec(ZOFF_F32, "", 1, 1e-6, 6, 5);   /* a tiny clip: every speculated step is clipped */
    check_spec(ZOFF_BF16, bf, 1, 1e-6, 6, 5);
    /* bf16 m and v: the rollback copy holds them in bf16 (zoff_placement_spec_backup_bytes) */
    const char *bs = "\"bf16\": {\"enabled\": true, \"bf16_optimizer_states\": true},";
    check_spec(ZOFF_BF16, bs, 1, 1e-6, 6, 5);
    /* another learning rate than assumed (clip off): every speculated step rolled back, the
     * exact update starting from the backup (kept and rolled-back steps mixed: the fp16 test) */
    g_mode.lr_falls = true;
    check_spec(ZOFF_BF16, bs, 1, 0.0, 5, 4);
    check_spec(ZOFF_F32, "", 1, 0.0, 4, 3);
    g_mode.lr_falls = false;
}

/* fp16 with a loss scale that overflows: each speculated overflow step is rolled back
 * (the step is then skipped, as without speculation). */
static void test_speculative_overflow(void **st) {
    (void)st;
    const char *prec = "\"fp16\": {\"enabled\": true, \"initial_scale_power\": 40, \"hysteresis\": 1,"
                       " \"loss_scale_window\": 1000, \"min_loss_scale\": 1},";
    char a[1024];
    run_result r;
    g_mode.waits = true;
    assert_int_equal(train(spec_cfg(a, sizeof a, true, prec, 1, 0.0), ZOFF_F16, 30, 0, &r), ZOFF_OK);
    g_mode.waits = false;
    int skipped_spec = 0; /* overflow steps after the first (which has no learning rate to speculate with) */
    for (int i = 1; i < 30; i++) {
        skipped_spec += r.skipped[i];
        assert_true(r.rolled_back[i] == r.skipped[i]);
    }
    assert_true(skipped_spec >= 5);
    assert_int_equal(r.rollbacks, skipped_spec);
    free(r.weights);
    check_spec(ZOFF_F16, prec, 1, 0.0, 30, skipped_spec);
}

/* The timeline of speculation: the update of the last group (the first whose gradients
 * land) starts before the backward of the first block ends. 8 blocks; most steps. */
static void test_speculative_timeline(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    g_mode.waits = true;
    g_mode.layers = 8;
    g_mode.hidden = 128;
    zoff_status s = train(spec_cfg(a, sizeof a, true, "", 1, 0.0), ZOFF_F32, 8, 0, &r);
    g_mode.waits = false;
    g_mode.layers = g_mode.hidden = 0;
    assert_int_equal(s, ZOFF_OK);
    assert_int_equal(r.rollbacks, 0);
    int early = 0;
    for (int i = 1; i < 8; i++) { /* iteration i's backward, step i + 1 */
        assert_true(g_mode.host_t1[i + 1] > g_mode.host_t0[i + 1] && g_mode.bwd_end_device[i] > 0);
        printf("step %d: host update %.3f ms, began %.3f ms before the backward ended\n", i + 1,
               1e3 * (g_mode.host_t1[i + 1] - g_mode.host_t0[i + 1]),
               1e3 * (g_mode.bwd_end_device[i] - g_mode.host_t0[i + 1]));
        early += g_mode.host_t0[i + 1] < g_mode.bwd_end_device[i];
    }
    if (early < 4) fail_msg("the speculative update began before the backward ended in %d of 7 steps", early);
    free(r.weights);
}

/* Speculation with the row-sparse report of wte's gradient (zoff_gpt2_set_grad_rows): wte
 * most of the parameters (vocabulary 50257), 512 tokens (~500 runs of rows; with sub-groups
 * of 3000, at most 64 kept apart: the closest merged), sub-groups cut inside rows (sub_group_size 3000) or one
 * per layer group. In a speculated step some sub-group is updated in two parts (the rows
 * outside the batch's tokens early, then the rest), and the result is the exact step's bit
 * for bit, kept or rolled back (a tiny clip), with accumulation too. */
static void check_spec_rows(zoff_dtype dt, const char *prec, int accum, double clip, int nsteps, int want_rollbacks) {
    g_mode.rows_stall = true; /* else, on a loaded machine, the worker may come after everything landed */
    check_spec(dt, prec, accum, clip, nsteps, want_rollbacks);
    g_mode.rows_stall = false;
    int split = 0;
    for (int t = 2; t <= nsteps; t++) split += g_mode.split[t] > 0; /* step 1: no learning rate to speculate with */
    if (split == 0) fail_msg("no sub-group was updated in two parts (early, then its rows) in %d steps", nsteps - 1);
}

static void test_speculative_rows_equals_exact(void **st) {
    (void)st;
    const char *bf = "\"bf16\": {\"enabled\": true},";
    g_mode.layers = 4;
    g_mode.vocab = 50257;
    g_mode.batch = 32;
    setenv("ZOFF_TEST_SPEC_MAX_RUNS", "64", 1);
    check_spec_rows(ZOFF_F32, "", 1, 0.0, 4, 0);
    check_spec_rows(ZOFF_BF16, bf, 1, 1e-6, 3, 2); /* every speculated step rolled back */
    unsetenv("ZOFF_TEST_SPEC_MAX_RUNS");
    g_mode.sub_group = 1000000000L;                /* one sub-group per layer group */
    check_spec_rows(ZOFF_BF16, bf, 1, 0.0, 4, 0);
    check_spec_rows(ZOFF_BF16, bf, 2, 0.0, 3, 0);  /* the boundary micro-batch's rows */
    check_spec_rows(ZOFF_F32, "", 1, 1e-6, 3, 2);
    g_mode.layers = g_mode.vocab = g_mode.batch = 0;
    g_mode.sub_group = 0;
}

/* The timeline of the row-sparse speculation: wte's update (the sub-group at offset 0, one
 * per layer group) begins before the backward of block 0 ends on the device, although the
 * embedding backward that finishes wte's gradient comes after it. Most steps. */
static void test_speculative_rows_timeline(void **st) {
    (void)st;
    char a[1024];
    run_result r;
    g_mode.waits = true;
    g_mode.layers = 4;
    g_mode.hidden = 128;
    g_mode.vocab = 8192;
    g_mode.batch = 32;
    g_mode.sub_group = 1000000000L;
    zoff_status s = train(spec_cfg(a, sizeof a, true, "", 1, 0.0), ZOFF_F32, 8, 0, &r);
    train_mode tm = g_mode;
    g_mode = (train_mode){0};
    assert_int_equal(s, ZOFF_OK);
    assert_int_equal(r.rollbacks, 0);
    int early = 0;
    for (int i = 1; i < 8; i++) { /* iteration i's backward, step i + 1 */
        assert_true(tm.span_wte0[i + 1] > 0 && tm.block0_end[i] > 0);
        printf("step %d: wte's update began %.3f ms before block 0's backward ended\n", i + 1,
               1e3 * (tm.block0_end[i] - tm.span_wte0[i + 1]));
        early += tm.span_wte0[i + 1] < tm.block0_end[i];
    }
    if (early < 4) fail_msg("wte's update began before block 0's backward ended in %d of 7 steps", early);
    free(r.weights);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_equals_device_f32),  cmocka_unit_test(test_offload_equals_device_bf16),
        cmocka_unit_test(test_offload_equals_device_fp16), cmocka_unit_test(test_accumulation_exact),
        cmocka_unit_test(test_one_cycle_momentum),
        cmocka_unit_test(test_bucket_accumulation),
        cmocka_unit_test(test_fp16_overflow_schedule),     cmocka_unit_test(test_device_budget),
        cmocka_unit_test(test_delayed_update), cmocka_unit_test(test_grad_device),
        cmocka_unit_test(test_twin_flow_f32),              cmocka_unit_test(test_twin_flow_bf16),
        cmocka_unit_test(test_twin_flow_fp16),             cmocka_unit_test(test_auto_ratio_minimal),
        cmocka_unit_test(test_host_memory_checked),        cmocka_unit_test(test_placement_spec),
        cmocka_unit_test(test_pinned_only_dma),            cmocka_unit_test(test_state_huge_pages),
        cmocka_unit_test(test_init_range_equals_whole),
        cmocka_unit_test(test_pipelined_equals_synchronous), cmocka_unit_test(test_pipelined_timeline),
        cmocka_unit_test(test_delayed_pipelined),            cmocka_unit_test(test_delayed_timeline),
        cmocka_unit_test(test_delayed_resume),               cmocka_unit_test(test_snapshot),
        cmocka_unit_test(test_snapshot_prepare),         cmocka_unit_test(test_snapshot_ahead_unused),
        cmocka_unit_test(test_snapshot_update_fails),
        cmocka_unit_test(test_speculative_equals_exact),     cmocka_unit_test(test_speculative_overflow),
        cmocka_unit_test(test_speculative_timeline),        cmocka_unit_test(test_speculative_rows_equals_exact),
        cmocka_unit_test(test_speculative_rows_timeline),    cmocka_unit_test(test_cpuadam_cores_perc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
