/* The background save's copy-on-update snapshot (include/zoff/engine.h, zoff_engine_snapshot_*).
 *
 * Each host state array in use (master, m, v over the host state offsets [0, n_host)) is cut
 * into blocks of zoff_engine_snapshot_block_data_bytes, each staged in a slot of
 * zoff_engine_snapshot_block_bytes at its shift (block_shifts: where the file has its longest run
 * aligned, so that the writer can borrow the copy for an in-place disk write). Per block: the elements the writer has read
 * (`taken`), its staging slot (-1: none) and its state: NONE (no slot, or a slot whose copy
 * protect is making), PENDING (a slot the update's own pass fills: each element is copied
 * there, by the optimizer thread that works on it, just before it is written; `copied` counts
 * them) or READY. The writer reads a READY block from its slot, waits for a PENDING one, and
 * reads any other live. Before a sub-group is updated, protect gives every block it touches
 * that the writer has not fully read a slot: blocks wholly inside the sub-group, when an
 * exact update follows and the free slots suffice, become PENDING (the update's pass copies
 * them: one read of the state, the copy's writes streamed past the cache); the others (a
 * block shared with the next sub-group, the speculative and restoring updates, a budget
 * about to run out) are copied at once, whole, on up to the optimizer's threads. Nothing of
 * a block changes before it is staged or taken. protect then waits while the writer is
 * reading live elements of its range (one slice, microseconds). Slots return to the free
 * list when the writer has taken their block. The updater waits for the writer only when no
 * slot is free. All under one mutex, except the copies and the PENDING fills (atomics).
 *
 * With a device share (Twin-Flow, offload_optimizer.ratio below 1) the device's state arrays are
 * copied whole into the front of the arena (the device image: fp32, at the device state offsets),
 * and the writer reads the device's sub-groups from there. The copy runs on a stream of its own
 * from an event on the compute stream after the last device update, on a thread that is not the
 * training's (with the CUDA runtime a copy into pageable memory holds the thread that issues it
 * until it is done): from the step boundary the save is taken at on a thread of its own
 * (zoff_engine_snapshot_device_ahead, where the arena is already there: the device's next update
 * comes a forward and a backward later), else from begin on the writer's thread as its first
 * work (zoff_engine_snapshot_device_copy). The next device update waits for it at
 * zoff_eng_snap_device_gate, or takes it itself when nobody has begun it: the device's state
 * changes only in that update, inside zoff_engine_step.
 *
 * The arena stays allocated from one save to the next (its pages faulted in once, not at
 * every save's first update) and is freed with the engine, or when a save needs more. Before
 * the first save zoff_engine_snapshot_prepare may allocate it and fault its pages in on a
 * background thread at the lowest priority, so that the first save's updates do not: begin
 * stops that thread where it got to (the updates fault in the rest) and joins it. */
#define _GNU_SOURCE /* MADV_POPULATE_WRITE, gettid */
#include <errno.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "zero/engine_impl.h"

#define SNAP_ARRAYS 3

enum { BLK_NONE = 0, BLK_READY = 1, BLK_PENDING = 2 };
enum { IMG_TODO = 0, IMG_COPYING = 1, IMG_DONE = 2 };

typedef struct zoff_snap {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool active;                  /* begin .. finish */
    int64_t blk[SNAP_ARRAYS], nb[SNAP_ARRAYS]; /* elements per block, blocks (0: the array is not in use) */
    int64_t *taken[SNAP_ARRAYS];  /* per block: elements the writer has read */
    int32_t *slot[SNAP_ARRAYS];   /* per block: staging slot, -1 none */
    _Atomic unsigned char *state[SNAP_ARRAYS]; /* per block: BLK_* */
    _Atomic int64_t *copied[SNAP_ARRAYS];       /* per PENDING block: elements copied into its slot */
    uint16_t *shift[SNAP_ARRAYS]; /* per block: where its copy starts in a slot (bytes; block_shifts) */
    uint16_t *lends[SNAP_ARRAYS]; /* per block: parts of its copy lent to the writer, not yet returned */
    _Atomic int npending;         /* PENDING blocks */
    bool failed;                  /* an update failed with blocks PENDING: the snapshot is not whole */
    char *arena;                  /* the device image (dimg_bytes), then arena_slots slots; kept from save to save */
    int arena_slots;
    size_t dimg_bytes;            /* the device image: n_dev fp32 per array in use (a whole number of slots) */
    size_t dimg_off[SNAP_ARRAYS]; /* array i's part of it */
    zoff_stream *img_stream;      /* the image's copy (with a device share) */
    zoff_event *img_src;          /* on the compute stream at begin: the device's state to copy */
    int img;                      /* IMG_*: the image's copy for this save (mu) */
    bool img_failed;              /* it failed: the writer's reads of the device's sub-groups fail */
    double img_seconds;           /* how long it took */
    bool ahead;                   /* zoff_engine_snapshot_device_ahead began it for the next begin */
    pthread_t ahead_th;           /* its thread, until joined (ahead_running) */
    bool ahead_running;
    pthread_t pf_th;              /* the arena's prefault (zoff_engine_snapshot_prepare), while pf_running */
    bool pf_running;
    _Atomic bool pf_stop;
    _Atomic size_t pf_done;       /* arena bytes faulted in by it */
    int32_t *free_slots;
    int lent;                     /* slots borrowed by the writer (zoff_engine_snapshot_borrow), not yet returned */
    int32_t *owner_i;             /* per slot: the block it stages (array, block), for zoff_engine_snapshot_return */
    int64_t *owner_b;
    int nslots, nfree;
    bool every;                   /* a slot for every block of the host state (no update ever waits) */
    int inside;                   /* updaters in zoff_eng_snap_protect (finish waits for them: their copies, their
                                     figures) */
    bool busy;                    /* the writer reads live elements [busy_lo, busy_hi) (host state offsets) */
    int64_t busy_lo, busy_hi;
    bool told;                    /* the budget-spent line was logged for this save */
    /* tests only (ZOFF_TEST_SNAPSHOT_HOLD=1): the writer reads nothing until an update has protected every
     * host sub-group or waits for the budget (at most 60 s), so that a test stages every block, or spends
     * the budget, whatever the timing */
    bool hold;
    int protected_sg, host_sg;
    zoff_engine_snapshot_stats st;
} zoff_snap;

size_t zoff_engine_snapshot_block_bytes(void) { return (size_t)1 << 20; }
size_t zoff_engine_snapshot_align(void) { return 4096; }
size_t zoff_engine_snapshot_block_data_bytes(void) {
    return zoff_engine_snapshot_block_bytes() - zoff_engine_snapshot_align();
}

static size_t state_esize(const zoff_engine *e, int i) { return i == 0 ? sizeof(float) : e->ssize; }

/* Elements of array i per block: a slot's bytes less the alignment, room for the block's shift. */
static int64_t block_elems(const zoff_engine *e, int i) {
    return (int64_t)(zoff_engine_snapshot_block_data_bytes() / state_esize(e, i));
}

static int64_t array_blocks(const zoff_engine *e, int i) {
    if (!zoff_eng_state_ptr(e, i, 0) || e->n_host == 0) return 0;
    return (e->n_host + block_elems(e, i) - 1) / block_elems(e, i);
}

/* The device's state in the image: n_dev fp32 per array in use (0 without a device share); *off: each array's
 * part (may be NULL). */
static size_t image_data_bytes(const zoff_engine *e, size_t off[SNAP_ARRAYS]) {
    size_t at = 0;
    for (int i = 0; i < SNAP_ARRAYS; i++) {
        if (off) off[i] = at;
        if (array_blocks(e, i) > 0) at += (size_t)e->n_dev * sizeof(float);
    }
    return at;
}

static int arrays_in_use(const zoff_engine *e) {
    int n = 0;
    for (int i = 0; i < SNAP_ARRAYS; i++) n += array_blocks(e, i) > 0;
    return n;
}

/* The device image's bytes in the arena: a whole number of blocks (zoff_placement_snapshot_image_bytes). */
static size_t image_bytes(const zoff_engine *e, size_t off[SNAP_ARRAYS]) {
    if (off) (void)image_data_bytes(e, off);
    return zoff_placement_snapshot_image_bytes(e->n_dev, arrays_in_use(e));
}

size_t zoff_engine_snapshot_bytes(const zoff_engine *e) {
    if (!e->h_master) return 0; /* no host state in memory */
    return zoff_placement_snapshot_bytes(e->n_host, e->n_dev, arrays_in_use(e), e->sdt);
}

size_t zoff_engine_snapshot_min_bytes(const zoff_engine *e) { return e->h_master ? image_bytes(e, NULL) : 0; }

/* The arena is mapped on its own (fresh pages, whole pages for madvise, given back to the system when freed). */
static size_t arena_total(const zoff_snap *p) {
    return p->dimg_bytes + (size_t)p->arena_slots * zoff_engine_snapshot_block_bytes();
}

static void arena_free(zoff_snap *p) {
    if (p->arena) munmap(p->arena, arena_total(p));
    p->arena = NULL;
    p->arena_slots = 0;
}

/* The prefault thread stops where it is (caller: no save active). Returns the bytes it faulted in. */
static size_t prefault_join(zoff_snap *p) {
    if (p->pf_running) {
        atomic_store(&p->pf_stop, true);
        pthread_join(p->pf_th, NULL);
        p->pf_running = false;
    }
    return atomic_load(&p->pf_done);
}

static void ahead_join(zoff_snap *p) {
    if (p->ahead_running) pthread_join(p->ahead_th, NULL);
    p->ahead_running = false;
}

static void snap_free(zoff_snap *p) {
    prefault_join(p);
    ahead_join(p);
    arena_free(p);
    zoff_stream_destroy(p->img_stream);
    zoff_event_destroy(p->img_src);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    for (int i = 0; i < SNAP_ARRAYS; i++)
        ZOFF_FREE_ALL(p->taken[i], p->slot[i], p->state[i], p->copied[i], p->shift[i], p->lends[i]);
    ZOFF_FREE_ALL(p->free_slots, p->owner_i, p->owner_b, p);
}

void zoff_eng_snap_destroy(zoff_engine *e) {
    if (e->snap) snap_free(e->snap);
    e->snap = NULL;
}

/* e->snap as the optimizer's threads see it: zoff_engine_snapshot_prepare may create it while an
 * update runs (published whole, inactive: such an update finds nothing to do). */
static zoff_snap *snap_of(const zoff_engine *e) { return __atomic_load_n(&e->snap, __ATOMIC_ACQUIRE); }

/* The host state offsets [s0, s1) of array i lie in the file as element so at (so + delta) x esize bytes
 * from an aligned start: each block they overlap most of all so far (best[b]) has its copy shifted to match. */
static void piece_shift(zoff_snap *p, int i, size_t es, int64_t s0, int64_t s1, int64_t delta, int64_t *best) {
    const int64_t A = (int64_t)zoff_engine_snapshot_align(), blk = p->blk[i];
    const uint16_t sh = (uint16_t)((((delta * (int64_t)es) % A) + A) % A);
    for (int64_t b = s0 / blk; b < p->nb[i] && b * blk < s1; b++) {
        const int64_t lo = s0 > b * blk ? s0 : b * blk, hi = s1 < (b + 1) * blk ? s1 : (b + 1) * blk;
        if (hi - lo > best[b]) {
            best[b] = hi - lo;
            p->shift[i][b] = sh;
        }
    }
}

/* Each block's shift: where its copy starts in a slot (bytes, below zoff_engine_snapshot_align, a whole number of
 * elements), chosen so that the longest run of the block that lies contiguously in one checkpoint entry lies in
 * the slot at the same offsets modulo the alignment as in the file: the disk writes that run from the slot
 * (zoff_engine_snapshot_borrow, zoff_ckpt_append_external). A save's entries (src/train/ckpt_save.c): m and v one
 * each over the partition (element x at x x esize), the master one per model tensor (element x at (x - the
 * tensor's offset) x 4). One rank only (background saves); with several every shift stays 0. False: out of
 * memory. */
static bool block_shifts(const zoff_engine *e, zoff_snap *p, int i) {
    if (p->nb[i] == 0 || e->world > 1) return true;
    int64_t *best = calloc((size_t)p->nb[i], sizeof *best);
    if (!best) return false;
    const size_t es = state_esize(e, i);
    int t = 0;
    for (int k = 0; k < e->nsg; k++) {
        const subgroup *g = &e->sg[k];
        if (!g->on_host || g->count == 0) continue;
        const int64_t s0 = g->state_off, s1 = g->state_off + g->count;
        if (i > 0 || !e->tensors) { /* the partition's order: element so is partition offset so - state_off + offset */
            piece_shift(p, i, es, s0, s1, g->offset - g->state_off, best);
            continue;
        }
        /* the master: the sub-group's model range [m0, m1) cut at the tensors (in model order) */
        const int64_t m0 = g->model, m1 = g->model + g->count;
        while (t > 0 && (t >= e->ntensors || e->tensors[t].offset > m0)) t--;
        for (; t < e->ntensors && e->tensors[t].offset < m1; t++) {
            const int64_t a = e->tensors[t].offset > m0 ? e->tensors[t].offset : m0;
            const int64_t z = e->tensors[t].offset + e->tensors[t].numel < m1 ? e->tensors[t].offset + e->tensors[t].numel
                                                                               : m1;
            if (a < z) piece_shift(p, i, es, s0 + (a - m0), s0 + (z - m0), m0 - s0 - e->tensors[t].offset, best);
            if (e->tensors[t].offset + e->tensors[t].numel > m1) break; /* goes on in the next sub-group */
        }
    }
    free(best);
    return true;
}

/* The per-block tables (once per engine: n_host does not change), then published. */
static zoff_status snap_create(zoff_engine *e) {
    zoff_snap *p = calloc(1, sizeof *p);
    if (!p) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the checkpoint snapshot");
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->dimg_bytes = image_bytes(e, p->dimg_off);
    zoff_status s = ZOFF_OK;
    if (p->dimg_bytes > 0) s = zoff_stream_create(e->dev, "snapshot copy", &p->img_stream);
    if (s == ZOFF_OK && p->dimg_bytes > 0) s = zoff_event_create(e->dev, &p->img_src);
    if (s != ZOFF_OK) {
        snap_free(p);
        return s;
    }
    for (int i = 0; i < SNAP_ARRAYS; i++) {
        p->nb[i] = array_blocks(e, i);
        p->blk[i] = block_elems(e, i);
        size_t nb = (size_t)p->nb[i] + 1;
        p->taken[i] = calloc(nb, sizeof *p->taken[i]);
        p->slot[i] = malloc(nb * sizeof *p->slot[i]);
        p->state[i] = calloc(nb, sizeof *p->state[i]);
        p->copied[i] = calloc(nb, sizeof *p->copied[i]);
        p->shift[i] = calloc(nb, sizeof *p->shift[i]);
        p->lends[i] = calloc(nb, sizeof *p->lends[i]);
        if (!p->taken[i] || !p->slot[i] || !p->state[i] || !p->copied[i] || !p->shift[i] || !p->lends[i] ||
            !block_shifts(e, p, i)) {
            snap_free(p);
            return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the checkpoint snapshot's tables");
        }
    }
    __atomic_store_n(&e->snap, p, __ATOMIC_RELEASE);
    return ZOFF_OK;
}

static bool snapshot_possible(const zoff_engine *e) { return !e->swap && e->h_master; }

/* The slots a budget buys after the device image (at most the whole host state's). */
static int budget_slots(const zoff_engine *e, size_t budget) {
    const size_t full = zoff_engine_snapshot_bytes(e), img = image_bytes(e, NULL), b = budget > full ? full : budget;
    return b > img ? (int)((b - img) / zoff_engine_snapshot_block_bytes()) : 0;
}

/* An arena of the device image and at least nslots slots (no save active, no update running, no prefault
 * thread). */
static zoff_status arena_reserve(zoff_snap *p, int nslots) {
    const size_t bytes = p->dimg_bytes + (size_t)nslots * zoff_engine_snapshot_block_bytes();
    if (bytes == 0 || (p->arena && nslots <= p->arena_slots)) return ZOFF_OK;
    arena_free(p);
    atomic_store(&p->pf_done, 0);
    void *a = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the checkpoint snapshot's staging (%zu bytes): %s; "
                                          "lower --save-snapshot-memory",
                          bytes, strerror(errno));
    p->arena = a;
    p->arena_slots = nslots;
    return ZOFF_OK;
}

/* The prefault thread: the arena's pages, in 64 MiB pieces, at the lowest priority; stops when asked. Populating
 * writes no byte (MADV_POPULATE_WRITE, Linux 5.14); where the kernel lacks it, one byte per page is written (zero:
 * nothing else uses the arena until begin has joined this thread). */
static void *prefault_main(void *arg) {
    zoff_snap *p = arg;
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19); /* best effort: this thread only */
    const size_t total = arena_total(p), piece = (size_t)64 << 20;
    bool populate = true;
    for (size_t o = 0; o < total && !atomic_load_explicit(&p->pf_stop, memory_order_relaxed); o += piece) {
        const size_t n = total - o < piece ? total - o : piece;
#ifdef MADV_POPULATE_WRITE
        if (populate && madvise(p->arena + o, n, MADV_POPULATE_WRITE) != 0) populate = false;
#else
        populate = false;
#endif
        if (!populate)
            for (size_t q = 0; q < n; q += 4096) ((volatile char *)p->arena)[o + q] = 0;
        atomic_fetch_add(&p->pf_done, n);
    }
    return NULL;
}

zoff_status zoff_engine_snapshot_prepare(zoff_engine *e, size_t budget) {
    if (!snapshot_possible(e)) return ZOFF_OK; /* begin would refuse: the save waits instead */
    if (!e->snap) ZOFF_TRY(snap_create(e));
    zoff_snap *p = e->snap;
    /* only an engine without an arena yet: then no save has staged anything, and no update's pass can be
     * writing into it (an update may be running: it touches neither the arena nor its size) */
    const int nslots = budget_slots(e, budget);
    if (p->arena || budget < p->dimg_bytes || (nslots == 0 && p->dimg_bytes == 0)) return ZOFF_OK;
    ZOFF_TRY(arena_reserve(p, nslots));
    atomic_store(&p->pf_stop, false);
    p->pf_running = pthread_create(&p->pf_th, NULL, prefault_main, p) == 0; /* else the updates fault the pages */
    return ZOFF_OK;
}

const void *zoff_eng_snap_arena(const zoff_engine *e) { return e->snap ? e->snap->arena : NULL; }

size_t zoff_engine_snapshot_prefaulted(const zoff_engine *e) {
    return e->snap ? atomic_load(&e->snap->pf_done) : 0;
}

/* The device's state arrays into the device image (begin: nothing updates them until the next step). */
static float *image_of(const zoff_snap *p, int i) { return (float *)(p->arena + p->dimg_off[i]); }

static zoff_status image_fill(zoff_engine *e, zoff_snap *p) {
    const char *delay = getenv("ZOFF_TEST_SNAPSHOT_DEVICE_DELAY_MS"); /* tests: a copy that takes its time */
    if (delay) nanosleep(&(struct timespec){.tv_sec = atol(delay) / 1000, .tv_nsec = atol(delay) % 1000 * 1000000L}, NULL);
    ZOFF_TRY(zoff_stream_wait_event(p->img_stream, p->img_src));
    for (int k = 0; k < e->nsg; k++) {
        const subgroup *g = &e->sg[k];
        for (int i = 0; i < SNAP_ARRAYS && !g->on_host; i++)
            if (p->nb[i] > 0)
                ZOFF_TRY(zoff_memcpy_async(p->img_stream, image_of(p, i) + g->state_off, zoff_eng_device_state(e, i, g),
                                           (size_t)g->count * sizeof(float), ZOFF_COPY_D2H));
    }
    return zoff_stream_synchronize(p->img_stream);
}

/* The device image copied by this thread (img IMG_COPYING, claimed by it); then its waiters go on. *dt: how long it
 * took. */
static zoff_status image_copy(zoff_engine *e, zoff_snap *p, double *dt) {
    const double t0 = zoff_now();
    const zoff_status s = image_fill(e, p);
    *dt = zoff_now() - t0;
    pthread_mutex_lock(&p->mu);
    p->img = IMG_DONE;
    p->img_failed = s != ZOFF_OK;
    p->img_seconds = *dt;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return s;
}

/* The device image of this save taken (by this thread when no other has begun it; else waited for: *waited
 * seconds, may be NULL). Only the thread that copies gets its failure. */
static zoff_status image_ready(zoff_engine *e, zoff_snap *p, double *waited) {
    pthread_mutex_lock(&p->mu);
    if (p->img == IMG_COPYING) {
        const double t0 = zoff_now();
        while (p->img == IMG_COPYING) pthread_cond_wait(&p->cv, &p->mu);
        if (waited) *waited += zoff_now() - t0;
    }
    if (!p->active || p->img == IMG_DONE) {
        pthread_mutex_unlock(&p->mu);
        return ZOFF_OK;
    }
    p->img = IMG_COPYING;
    pthread_mutex_unlock(&p->mu);
    double dt;
    const zoff_status s = image_copy(e, p, &dt);
    if (waited) *waited += dt;
    return s;
}

static void *ahead_main(void *arg) {
    zoff_engine *e = arg;
    double dt;
    const zoff_status s = image_copy(e, e->snap, &dt);
    if (s != ZOFF_OK) zoff_log(ZOFF_LOG_WARN, "checkpoint snapshot: the copy of the device's share failed: %s",
                               zoff_last_error());
    return NULL;
}

zoff_status zoff_engine_snapshot_device_ahead(zoff_engine *e) {
    zoff_snap *p = e->snap;
    if (!p || !p->arena || p->dimg_bytes == 0) return ZOFF_OK; /* begin copies it */
    pthread_mutex_lock(&p->mu);
    const bool active = p->active;
    pthread_mutex_unlock(&p->mu);
    if (active) return ZOFF_OK;
    prefault_join(p); /* its fallback writes a byte per page */
    ahead_join(p);    /* the last one's, long done (also one whose begin never came) */
    ZOFF_TRY(zoff_event_record(p->img_src, e->compute)); /* the device's state as of this boundary */
    pthread_mutex_lock(&p->mu);
    p->img = IMG_COPYING;
    p->img_failed = false;
    pthread_mutex_unlock(&p->mu);
    p->ahead = p->ahead_running = pthread_create(&p->ahead_th, NULL, ahead_main, e) == 0;
    if (!p->ahead) { /* begin copies it */
        pthread_mutex_lock(&p->mu);
        p->img = IMG_TODO;
        pthread_mutex_unlock(&p->mu);
    }
    return ZOFF_OK;
}

zoff_status zoff_engine_snapshot_device_copy(zoff_engine *e) {
    zoff_snap *p = e->snap;
    return p && p->dimg_bytes > 0 ? image_ready(e, p, NULL) : ZOFF_OK;
}

zoff_status zoff_eng_snap_device_gate(zoff_engine *e) {
    zoff_snap *p = snap_of(e);
    if (!p || p->dimg_bytes == 0) return ZOFF_OK;
    double waited = 0;
    const zoff_status s = image_ready(e, p, &waited);
    if (waited > 0) {
        pthread_mutex_lock(&p->mu);
        p->st.device_wait += waited;
        pthread_mutex_unlock(&p->mu);
    }
    return s;
}

zoff_status zoff_engine_snapshot_begin(zoff_engine *e, size_t budget) {
    if (!snapshot_possible(e))
        return zoff_error(ZOFF_ERR_UNSUPPORTED, "a checkpoint snapshot needs the optimizer state in host memory (not "
                                                "in NVMe swap files)");
    const size_t need = zoff_engine_snapshot_min_bytes(e);
    if (budget < need) {
        char a[32], b[32];
        return zoff_error(ZOFF_ERR_INVALID,
                          "a checkpoint snapshot of this run needs at least %s of host memory (a copy of the optimizer "
                          "state on the device), %s allowed: raise --save-snapshot-memory",
                          zoff_format_bytes(need, a, sizeof a), zoff_format_bytes(budget, b, sizeof b));
    }
    ZOFF_TRY(zoff_hr_settle(e));
    if (!e->snap) ZOFF_TRY(snap_create(e));
    zoff_snap *p = e->snap;
    const size_t bb = zoff_engine_snapshot_block_bytes();
    const int nslots = budget_slots(e, budget);
    const size_t prefaulted = prefault_join(p);
    bool ahead = p->ahead; /* this save's copy begun at its boundary: used once, whatever happens here */
    p->ahead = false;
    if (!ahead || nslots > p->arena_slots) { /* none, or the arena grows: the copy is made anew */
        ahead_join(p);
        ahead = false;
    }
    ZOFF_TRY(arena_reserve(p, nslots)); /* (no update runs: settled) */
    if (p->dimg_bytes > 0 && !ahead)
        ZOFF_TRY(zoff_event_record(p->img_src, e->compute)); /* after the last device update */
    int32_t *fs = nslots > 0 ? malloc((size_t)nslots * sizeof *fs) : NULL;
    int32_t *oi = nslots > 0 ? malloc((size_t)nslots * sizeof *oi) : NULL;
    int64_t *ob = nslots > 0 ? malloc((size_t)nslots * sizeof *ob) : NULL;
    if (nslots > 0 && (!fs || !oi || !ob)) {
        ZOFF_FREE_ALL(fs, oi, ob);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for the checkpoint snapshot's tables");
    }
    for (int k = 0; k < nslots; k++) fs[k] = nslots - 1 - k; /* popped from the end: slot 0 first */
    pthread_mutex_lock(&p->mu); /* a finished save's updater may still be leaving protect */
    for (int i = 0; i < SNAP_ARRAYS; i++) {
        memset(p->taken[i], 0, (size_t)(p->nb[i] + 1) * sizeof *p->taken[i]);
        memset(p->slot[i], 0xff, (size_t)(p->nb[i] + 1) * sizeof *p->slot[i]);
        for (int64_t b = 0; b <= p->nb[i]; b++) {
            atomic_store_explicit(&p->state[i][b], BLK_NONE, memory_order_relaxed);
            atomic_store_explicit(&p->copied[i][b], 0, memory_order_relaxed);
        }
        memset(p->lends[i], 0, (size_t)(p->nb[i] + 1) * sizeof *p->lends[i]);
    }
    atomic_store(&p->npending, 0);
    p->failed = false;
    ZOFF_FREE_ALL(p->free_slots, p->owner_i, p->owner_b);
    p->free_slots = fs;
    p->owner_i = oi;
    p->owner_b = ob;
    p->nslots = p->nfree = nslots;
    int64_t blocks = 0;
    for (int i = 0; i < SNAP_ARRAYS; i++) blocks += p->nb[i];
    p->every = nslots >= blocks;
    p->busy = p->told = false;
    p->lent = 0;
    const char *hold = getenv("ZOFF_TEST_SNAPSHOT_HOLD");
    p->hold = hold && !strcmp(hold, "1");
    p->protected_sg = p->host_sg = 0;
    for (int k = 0; k < e->nsg; k++) p->host_sg += e->sg[k].on_host;
    p->st = (zoff_engine_snapshot_stats){.budget = (size_t)nslots * bb + p->dimg_bytes, .prefaulted = prefaulted,
                                         .device = image_data_bytes(e, NULL)};
    if (!ahead) { /* else its copy, made or being made, is this save's */
        p->img = p->dimg_bytes > 0 ? IMG_TODO : IMG_DONE;
        p->img_failed = false;
    }
    atomic_store(&p->pf_done, 0); /* said once */
    p->active = true;
    pthread_mutex_unlock(&p->mu);
    return ZOFF_OK;
}

static int64_t block_len(const zoff_snap *p, const zoff_engine *e, int i, int64_t b) {
    int64_t lo = b * p->blk[i], hi = lo + p->blk[i] < e->n_host ? lo + p->blk[i] : e->n_host;
    return hi - lo;
}

static void *slot_at(const zoff_snap *p, int32_t s) {
    return p->arena + p->dimg_bytes + (size_t)s * zoff_engine_snapshot_block_bytes();
}

/* Where block b of array i starts in its slot (it has one). */
static char *copy_at(const zoff_snap *p, int i, int64_t b) {
    return (char *)slot_at(p, p->slot[i][b]) + p->shift[i][b];
}

/* Block b of array i: the writer has taken all of it (mu held). */
static bool block_taken(const zoff_snap *p, const zoff_engine *e, int i, int64_t b) {
    return p->taken[i][b] == block_len(p, e, i, b);
}

/* Block b of array i gets a free slot (mu held, nfree > 0). */
static void slot_take(zoff_snap *p, int i, int64_t b) {
    const int32_t sl = p->free_slots[--p->nfree];
    p->slot[i][b] = sl;
    p->owner_i[sl] = i;
    p->owner_b[sl] = b;
}

static void slot_release(zoff_snap *p, int i, int64_t b) {
    p->free_slots[p->nfree++] = p->slot[i][b];
    p->slot[i][b] = -1;
    atomic_store_explicit(&p->state[i][b], BLK_NONE, memory_order_relaxed);
}

static unsigned blk_state(const zoff_snap *p, int i, int64_t b) {
    return atomic_load_explicit(&p->state[i][b], memory_order_acquire);
}

/* The writer: mu taken once block b of array i is not being filled by an update's pass (mu not held on
 * failure: an update failed while staging). */
static zoff_status lock_settled(zoff_snap *p, int i, int64_t b) {
    pthread_mutex_lock(&p->mu);
    while (blk_state(p, i, b) == BLK_PENDING && p->active && !p->failed) pthread_cond_wait(&p->cv, &p->mu);
    if (!p->failed) return ZOFF_OK;
    pthread_mutex_unlock(&p->mu);
    return zoff_error(ZOFF_ERR_INTERNAL, "checkpoint snapshot: an optimizer update failed while it was staging the "
                                         "state; this save is abandoned");
}

/* The writer: host state elements [so, so + c) of array i, within one block, into h (of dtype hdt). */
static zoff_status read_chunk(zoff_engine *e, zoff_snap *p, int i, int64_t so, int64_t c, zoff_dtype hdt, void *h) {
    const int64_t b = so / p->blk[i];
    ZOFF_TRY(lock_settled(p, i, b));
    const void *src = zoff_eng_state_ptr(e, i, so);
    const bool staged = blk_state(p, i, b) == BLK_READY; /* stays until this thread releases it */
    if (staged) {
        src = copy_at(p, i, b) + (size_t)(so - b * p->blk[i]) * state_esize(e, i);
    } else {
        p->busy = true;
        p->busy_lo = so;
        p->busy_hi = so + c;
    }
    pthread_mutex_unlock(&p->mu);
    zoff_eng_state_to(e, i, src, c, hdt, h);
    pthread_mutex_lock(&p->mu);
    p->taken[i][b] += c;
    if (block_taken(p, e, i, b) && staged && p->lends[i][b] == 0) slot_release(p, i, b);
    p->busy = false;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return ZOFF_OK;
}

/* ZOFF_TEST_SNAPSHOT_HOLD (see the struct), on the writer's first read. */
static void test_hold(zoff_snap *p) {
    pthread_mutex_lock(&p->mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    while (p->hold && p->active && p->protected_sg < p->host_sg && !p->told)
        if (pthread_cond_timedwait(&p->cv, &p->mu, &until) == ETIMEDOUT) break;
    p->hold = false;
    pthread_mutex_unlock(&p->mu);
}

zoff_status zoff_engine_snapshot_read(zoff_engine *e, int i, int64_t offset, int64_t count, float *host) {
    return zoff_engine_snapshot_read_as(e, i, offset, count, ZOFF_F32, host);
}

zoff_status zoff_engine_snapshot_read_as(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                         void *host) {
    zoff_snap *p = e->snap;
    if (!p || !p->active) return zoff_engine_state_range_as(e, i, offset, count, dt, host, true);
    if (p->hold) test_hold(p); /* only the writer clears it */
    ZOFF_TRY(zoff_eng_check_state_range(e, i, offset, count, dt));
    const size_t hs = zoff_dtype_size(dt);
    if (p->nb[i] == 0) { /* an array the optimizer does not use reads as zeros */
        memset(host, 0, (size_t)count * hs);
        return ZOFF_OK;
    }
    for (int k = 0; k < e->nsg; k++) {
        const subgroup *g = &e->sg[k];
        int64_t lo = g->offset > offset ? g->offset : offset;
        int64_t hi = g->offset + g->count < offset + count ? g->offset + g->count : offset + count;
        if (lo >= hi) continue;
        if (!g->on_host) { /* from the device image (fp32: the state dtype wherever a sub-group is on the device) */
            if (dt != ZOFF_F32)
                return zoff_error(ZOFF_ERR_INTERNAL, "checkpoint snapshot: sub-group %d is on the device, read as %s", k,
                                  zoff_dtype_name(dt));
            ZOFF_TRY(image_ready(e, p, NULL));
            if (p->img_failed)
                return zoff_error(ZOFF_ERR_IO, "checkpoint snapshot: the copy of the device's share of the optimizer "
                                               "state failed; this save is abandoned");
            memcpy((char *)host + (size_t)(lo - offset) * hs,
                   image_of(p, i) + g->state_off + (lo - g->offset),
                   (size_t)(hi - lo) * sizeof(float));
            continue;
        }
        for (int64_t so = g->state_off + (lo - g->offset), end = so + (hi - lo); so < end;) {
            int64_t bend = (so / p->blk[i] + 1) * p->blk[i], c = (bend < end ? bend : end) - so;
            ZOFF_TRY(read_chunk(e, p, i, so, c, dt,
                                (char *)host + (size_t)((lo - offset) + (so - g->state_off - (lo - g->offset))) * hs));
            so += c;
        }
    }
    return ZOFF_OK;
}

zoff_status zoff_engine_snapshot_borrow(zoff_engine *e, int i, int64_t offset, int64_t count, zoff_dtype dt,
                                        const void **data, int64_t *got, int64_t *until) {
    *data = NULL;
    *got = 0;
    *until = count;
    zoff_snap *p = e->snap;
    if (!p || !p->active || i < 0 || i >= SNAP_ARRAYS || p->nb[i] == 0 || count <= 0 ||
        zoff_dtype_size(dt) != state_esize(e, i))
        return ZOFF_OK;
    if (p->hold) test_hold(p); /* only the writer clears it */
    ZOFF_TRY(zoff_eng_check_state_range(e, i, offset, count, dt));
    const subgroup *g = NULL;
    for (int k = 0; k < e->nsg && !g; k++)
        if (e->sg[k].offset <= offset && offset < e->sg[k].offset + e->sg[k].count) g = &e->sg[k];
    if (!g) return ZOFF_OK;
    const int64_t in_sg = g->offset + g->count - offset;
    if (!g->on_host) { /* the device image: read */
        *until = in_sg < count ? in_sg : count;
        return ZOFF_OK;
    }
    const size_t es = state_esize(e, i), A = zoff_engine_snapshot_align();
    const int64_t so = g->state_off + (offset - g->offset), b = so / p->blk[i];
    int64_t end = (b + 1) * p->blk[i] - so; /* the rest of the block, the sub-group, the range */
    if (end > in_sg) end = in_sg;
    if (end > count) end = count;
    *until = end;
    ZOFF_TRY(lock_settled(p, i, b));
    const char *at = blk_state(p, i, b) == BLK_READY ? copy_at(p, i, b) + (size_t)(so - b * p->blk[i]) * es : NULL;
    const int64_t whole = (int64_t)((size_t)end * es / A * A / es); /* whole alignment units */
    /* at most a quarter of the slots lent out at a time, unless every block has one: a small budget stays the
     * updates' */
    if (p->active && at && (uintptr_t)at % A == 0 && whole > 0 && (p->every || 4 * (p->lent + 1) <= p->nslots)) {
        p->lent++;
        p->lends[i][b]++;
        p->taken[i][b] += whole; /* the writer's: its slot stays until returned */
        *data = at;
        *got = whole;
        *until = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return ZOFF_OK;
}

void zoff_engine_snapshot_return(zoff_engine *e, const void *data) {
    zoff_snap *p = e->snap;
    if (!p || !data) return;
    pthread_mutex_lock(&p->mu);
    if (p->active) { /* (after finish the slots are rebuilt by the next begin) */
        const int32_t sl = (int32_t)(((const char *)data - p->arena - p->dimg_bytes) /
                                     (ptrdiff_t)zoff_engine_snapshot_block_bytes());
        const int i = p->owner_i[sl];
        const int64_t b = p->owner_b[sl];
        p->lends[i][b]--;
        p->lent--;
        if (p->lends[i][b] == 0 && block_taken(p, e, i, b)) slot_release(p, i, b);
        pthread_cond_broadcast(&p->cv); /* an update may wait for a free slot */
    }
    pthread_mutex_unlock(&p->mu);
}

/* One copy into a slot. */
typedef struct snap_copy {
    int i;
    int64_t b;
} snap_copy;

/* The copies of batch[0..n) into their slots, on up to the optimizer's threads (mu held on
 * entry and exit, released while copying). */
static void copy_batch(zoff_engine *e, zoff_snap *p, const snap_copy *batch, int n) {
    if (n == 0) return;
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += (size_t)block_len(p, e, batch[k].i, batch[k].b) * state_esize(e, batch[k].i);
    pthread_mutex_unlock(&p->mu);
    int nt = zoff_par_threads(bytes), most = hopt_threads(e);
    if (nt > most) nt = most;
    if (nt > n) nt = n;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int k = 0; k < n; k++) {
        const int i = batch[k].i;
        const int64_t b = batch[k].b;
        /* streamed as the update's own pass stages (no read of the slot's lines first) */
        zoff_copy_streaming(copy_at(p, i, b), zoff_eng_state_ptr(e, i, b * p->blk[i]),
                            (size_t)block_len(p, e, i, b) * state_esize(e, i));
        zoff_store_fence(); /* this thread's copy in memory before the block is marked READY */
    }
    pthread_mutex_lock(&p->mu);
    for (int k = 0; k < n; k++) {
        const int i = batch[k].i;
        const int64_t b = batch[k].b;
        atomic_store_explicit(&p->state[i][b], BLK_READY, memory_order_relaxed);
        if (block_taken(p, e, i, b)) slot_release(p, i, b); /* the writer read it live meanwhile */
    }
    p->st.staged += bytes;
    pthread_cond_broadcast(&p->cv);
}

/* The budget is spent: wait for the writer (mu held). */
static void wait_writer(zoff_snap *p) {
    if (!p->told) {
        p->told = true;
        char b[32], d[32], dev[96] = "";
        if (p->dimg_bytes)
            snprintf(dev, sizeof dev, " beside the %s copy of the device's share",
                     zoff_format_bytes(p->dimg_bytes, d, sizeof d));
        zoff_log(ZOFF_LOG_INFO,
                 "checkpoint snapshot: its staging (%s%s, --save-snapshot-memory) is spent; the optimizer updates "
                 "wait for the background writer for the rest of this save",
                 zoff_format_bytes(p->st.budget - p->dimg_bytes, b, sizeof b), dev);
        pthread_cond_broadcast(&p->cv); /* test_hold */
    }
    pthread_cond_wait(&p->cv, &p->mu);
}

/* Block b of array i lies wholly inside host state offsets [a, z). */
static bool block_inside(const zoff_snap *p, const zoff_engine *e, int i, int64_t b, int64_t a, int64_t z) {
    return b * p->blk[i] >= a && b * p->blk[i] + block_len(p, e, i, b) <= z;
}

/* The blocks of [a, z) that still need a slot (mu held). */
static int64_t slots_needed(const zoff_snap *p, const zoff_engine *e, int64_t a, int64_t z) {
    int64_t need = 0;
    for (int i = 0; i < SNAP_ARRAYS; i++) {
        if (p->nb[i] == 0) continue; /* an array the optimizer does not use */
        for (int64_t b = a / p->blk[i]; b <= (z - 1) / p->blk[i]; b++)
            need += !block_taken(p, e, i, b) && p->slot[i][b] < 0;
    }
    return need;
}

zoff_status zoff_eng_snap_protect(zoff_engine *e, const subgroup *g, bool fuse) {
    zoff_snap *p = snap_of(e);
    if (!p) return ZOFF_OK;
    enum { BATCH = 256 };
    snap_copy batch[BATCH];
    int n = 0;
    double t0 = zoff_now();
    bool waited = false;
    const int64_t a = g->state_off, z = g->state_off + g->count;
    pthread_mutex_lock(&p->mu);
    p->inside++;
    /* the update's pass fills the blocks wholly inside [a, z) when every block gets its slot now */
    fuse = fuse && p->active && g->count > 0 && slots_needed(p, e, a, z) <= p->nfree;
    for (int i = 0; i < SNAP_ARRAYS && p->active; i++) {
        if (p->nb[i] == 0 || g->count == 0) continue;
        for (int64_t b = a / p->blk[i]; b <= (z - 1) / p->blk[i] && p->active;) {
            if (block_taken(p, e, i, b) || p->slot[i][b] >= 0) {
                b++;
            } else if (p->nfree > 0 && fuse && block_inside(p, e, i, b, a, z)) {
                slot_take(p, i, b);
                atomic_store_explicit(&p->copied[i][b], 0, memory_order_relaxed);
                atomic_store_explicit(&p->state[i][b], BLK_PENDING, memory_order_relaxed);
                atomic_fetch_add(&p->npending, 1);
                b++;
            } else if (p->nfree > 0 && n < BATCH) {
                slot_take(p, i, b);
                batch[n++] = (snap_copy){i, b++};
            } else if (n > 0) {
                copy_batch(e, p, batch, n);
                n = 0;
            } else {
                wait_writer(p);
                waited = true;
            }
        }
    }
    if (p->active) copy_batch(e, p, batch, n); /* else the save is over: its slots are gone */
    /* the live elements of [a, z) change from here on: not while the writer reads them */
    while (p->active && p->busy && p->busy_lo < z && p->busy_hi > a) pthread_cond_wait(&p->cv, &p->mu);
    if (waited) p->st.update_wait += zoff_now() - t0;
    p->protected_sg++;
    p->inside--;
    pthread_cond_broadcast(&p->cv); /* finish, test_hold */
    pthread_mutex_unlock(&p->mu);
    return ZOFF_OK;
}

bool zoff_eng_snap_pending(const zoff_engine *e) {
    const zoff_snap *p = snap_of(e);
    return p && atomic_load_explicit(&p->npending, memory_order_acquire) > 0;
}

/* A PENDING block's last element is in its slot. */
static void block_filled(zoff_engine *e, zoff_snap *p, int i, int64_t b) {
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->state[i][b], BLK_READY, memory_order_release);
    atomic_fetch_sub(&p->npending, 1);
    const size_t bytes = (size_t)block_len(p, e, i, b) * state_esize(e, i);
    p->st.staged += bytes;
    p->st.staged_in_update += bytes;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void zoff_eng_snap_before_write(void *ctx, int64_t lo, int64_t hi) {
    const zoff_snap_hook *h = ctx;
    zoff_engine *e = h->e;
    zoff_snap *p = snap_of(e);
    const int64_t a = h->state_off + lo, z = h->state_off + hi;
    for (int i = 0; i < SNAP_ARRAYS; i++) {
        if (p->nb[i] == 0) continue;
        const size_t es = state_esize(e, i);
        for (int64_t b = a / p->blk[i]; b <= (z - 1) / p->blk[i]; b++) {
            if (blk_state(p, i, b) != BLK_PENDING) continue;
            const int64_t b0 = b * p->blk[i], x = a > b0 ? a : b0, y = z < b0 + p->blk[i] ? z : b0 + p->blk[i];
            zoff_copy_streaming(copy_at(p, i, b) + (size_t)(x - b0) * es, zoff_eng_state_ptr(e, i, x),
                                (size_t)(y - x) * es);
            zoff_store_fence(); /* the copy in memory before the count says so */
            if (atomic_fetch_add_explicit(&p->copied[i][b], y - x, memory_order_acq_rel) + (y - x) ==
                block_len(p, e, i, b))
                block_filled(e, p, i, b);
        }
    }
}

zoff_status zoff_eng_snap_pass_done(zoff_engine *e, zoff_status s) {
    zoff_snap *p = snap_of(e);
    if (!p || atomic_load(&p->npending) == 0) return s;
    /* a failed update, or one that did not write every element it protected: the blocks it left PENDING hold
     * part of the old state only */
    pthread_mutex_lock(&p->mu);
    p->failed = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return s != ZOFF_OK ? s
                        : zoff_error(ZOFF_ERR_INTERNAL, "checkpoint snapshot: an update left %d blocks half staged",
                                     atomic_load(&p->npending));
}

void zoff_engine_snapshot_finish(zoff_engine *e, zoff_engine_snapshot_stats *stats) {
    zoff_snap *p = e->snap;
    if (!p) {
        if (stats) *stats = (zoff_engine_snapshot_stats){0};
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->active = false;
    pthread_cond_broadcast(&p->cv);
    /* woken above, updaters leave at once; a copy of the device image started by the training thread ends */
    while (p->inside > 0 || p->img == IMG_COPYING) pthread_cond_wait(&p->cv, &p->mu);
    p->nslots = p->nfree = 0; /* the arena and its tables stay for the next save (an update's pass may still be filling
                                 its PENDING blocks) */
    p->st.device_seconds = p->img == IMG_DONE && p->dimg_bytes > 0 ? p->img_seconds : 0;
    if (stats) *stats = p->st;
    pthread_mutex_unlock(&p->mu);
    ahead_join(p); /* done: its copy ended above */
}

size_t zoff_engine_snapshot_held(const zoff_engine *e) {
    return e->snap && e->snap->arena ? arena_total(e->snap) : 0;
}
