/* The batch loader: windows of T+1 tokens over a dataset's split, visited in a
 * per-epoch keyed permutation, with a position that saves and restores exactly. */
#include "zoff/data.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

typedef struct segment {
    const zoff_shard *shard;
    int64_t start;          /* position in the shard of this segment's first token */
    const uint16_t *tokens; /* first token of this segment's first window */
    int64_t first_window;   /* global window index of its first window */
    int64_t num_windows;
} segment;

struct zoff_loader {
    zoff_loader_options opt;
    segment *segs;
    int num_segs;
    int64_t num_windows;
    uint64_t fingerprint, contents;
    /* position */
    uint64_t seed;
    int64_t epoch;
    int64_t window;
    /* permutation of [0, num_windows) for the current epoch */
    int half_bits;
    uint64_t half_mask;
    uint64_t keys[4];
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 33)) * 0xFF51AFD7ED558CCDull;
    z = (z ^ (z >> 33)) * 0xC4CEB9FE1A85EC53ull;
    return z ^ (z >> 33);
}

static void epoch_keys(zoff_loader *l) {
    uint64_t st = l->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(l->epoch + 1));
    for (int i = 0; i < 4; i++) l->keys[i] = splitmix64(&st);
}

/* A 4-round balanced Feistel network on 2*half_bits bits, walked until the value
 * falls inside [0, num_windows): a bijection of [0, num_windows). */
static int64_t permute(const zoff_loader *l, int64_t i) {
    uint64_t x = (uint64_t)i, n = (uint64_t)l->num_windows;
    int h = l->half_bits;
    uint64_t m = l->half_mask;
    do {
        uint64_t left = x >> h, right = x & m;
        for (int r = 0; r < 4; r++) {
            uint64_t t = left ^ (mix64(right ^ l->keys[r]) & m);
            left = right;
            right = t;
        }
        x = (left << h) | right;
    } while (x >= n);
    return (int64_t)x;
}

static uint64_t fnv(uint64_t h, uint64_t v) {
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xFF;
        h *= 0x100000001B3ull;
    }
    return h;
}

zoff_loader_options zoff_loader_defaults(int64_t batch_size, int64_t seq_len) {
    zoff_loader_options o;
    memset(&o, 0, sizeof o);
    o.batch_size = batch_size;
    o.seq_len = seq_len;
    o.shuffle = true;
    o.split = ZOFF_SPLIT_ALL;
    o.rank = 0;
    o.world_size = 1;
    return o;
}

/* The loader's contents digest: CRC32C of 8 blocks of up to 512 tokens spread over each segment (its
 * first and last among them), so that opening a large dataset reads 8 KiB a shard, not the shards.
 * Never 0 (0: not recorded). */
static uint64_t contents_digest(const segment *segs, int n, int64_t T) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (int i = 0; i < n; i++) {
        const int64_t len = segs[i].num_windows * T + 1, blk = len < 512 ? len : 512;
        for (int64_t k = 0; k < 8; k++) {
            const int64_t off = (len - blk) * k / 7;
            h = fnv(h, zoff_crc32c(0, segs[i].tokens + off, (size_t)blk * sizeof(uint16_t)));
        }
    }
    return h ? h : 1;
}

static const char *split_name(zoff_data_split s) {
    return s == ZOFF_SPLIT_TRAIN ? "the train split" : s == ZOFF_SPLIT_VAL ? "the val split" : "the data";
}

zoff_status zoff_loader_create(const zoff_dataset *ds, const zoff_loader_options *opt, zoff_loader **out) {
    *out = NULL;
    const int64_t B = opt->batch_size, T = opt->seq_len;
    if (B < 1 || T < 1)
        return zoff_error(ZOFF_ERR_INVALID, "data loader: batch size %lld and sequence length %lld must be >= 1",
                          (long long)B, (long long)T);
    if (opt->world_size < 1 || opt->rank < 0 || opt->rank >= opt->world_size)
        return zoff_error(ZOFF_ERR_INVALID, "data loader: rank %d is not in [0, world size %d)", opt->rank,
                          opt->world_size);
    const int64_t N = zoff_dataset_num_tokens(ds);
    int64_t lo = 0, hi = N;
    if (opt->split != ZOFF_SPLIT_ALL) {
        const int64_t V = opt->val_tokens;
        if (V < 0 || V >= N || (opt->split == ZOFF_SPLIT_VAL && V == 0))
            return zoff_error(ZOFF_ERR_INVALID,
                              "data loader: validation size %lld tokens must be in [%d, %lld) for a dataset of "
                              "%lld tokens",
                              (long long)V, opt->split == ZOFF_SPLIT_VAL ? 1 : 0, (long long)N, (long long)N);
        if (opt->split == ZOFF_SPLIT_TRAIN) hi = N - V;
        else lo = N - V;
    }
    zoff_loader *l = calloc(1, sizeof *l);
    int nshards = zoff_dataset_num_shards(ds);
    if (!l || !(l->segs = calloc((size_t)nshards, sizeof *l->segs))) {
        free(l);
        return zoff_error(ZOFF_ERR_NOMEM, "out of memory creating the data loader");
    }
    l->opt = *opt;
    uint64_t fp = 0xCBF29CE484222325ull;
    fp = fnv(fp, (uint64_t)T);
    fp = fnv(fp, (uint64_t)lo);
    fp = fnv(fp, (uint64_t)hi);
    fp = fnv(fp, opt->shuffle ? 1 : 0);
    int64_t g0 = 0;
    for (int i = 0; i < nshards; i++) {
        const zoff_shard *s = zoff_dataset_shard(ds, i);
        int64_t n = zoff_shard_num_tokens(s), g1 = g0 + n;
        fp = fnv(fp, (uint64_t)n);
        int64_t a = g0 > lo ? g0 : lo, b = g1 < hi ? g1 : hi;
        if (b - a >= T + 1) {
            segment *sg = &l->segs[l->num_segs++];
            sg->shard = s;
            sg->start = a - g0;
            sg->tokens = zoff_shard_tokens(s) + (a - g0);
            sg->first_window = l->num_windows;
            sg->num_windows = (b - a - 1) / T;
            l->num_windows += sg->num_windows;
        }
        g0 = g1;
    }
    l->fingerprint = fp;
    l->contents = contents_digest(l->segs, l->num_segs, T);
    const int64_t need = B * (int64_t)opt->world_size;
    if (l->num_windows < need && opt->one_batch) {
        zoff_status st = zoff_error(ZOFF_ERR_INVALID,
                                    "data loader: %s has %lld tokens (%d shard(s)), which give %lld windows of "
                                    "seq_len+1 = %lld tokens, fewer than one %s of %lld%s",
                                    opt->what ? opt->what : split_name(opt->split), (long long)(hi - lo), nshards,
                                    (long long)l->num_windows, (long long)(T + 1),
                                    opt->batch_name ? opt->batch_name : "batch", (long long)need,
                                    opt->too_small_hint ? opt->too_small_hint : "");
        zoff_loader_free(l);
        return st;
    }
    if (l->num_windows < need) {
        zoff_status st = zoff_error(ZOFF_ERR_INVALID,
                                    "data loader: %s has %lld tokens (%d shard(s)), which give %lld "
                                    "windows of seq_len+1 = %lld tokens, but one step needs batch %lld x %d "
                                    "process(es) = %lld windows; use more data or a smaller batch/sequence length%s",
                                    opt->what ? opt->what : split_name(opt->split), (long long)(hi - lo),
                                    nshards, (long long)l->num_windows, (long long)(T + 1), (long long)B,
                                    opt->world_size, (long long)need, opt->too_small_hint ? opt->too_small_hint : "");
        zoff_loader_free(l);
        return st;
    }
    l->half_bits = 1;
    while (l->half_bits < 31 && ((int64_t)1 << (2 * l->half_bits)) < l->num_windows) l->half_bits++;
    l->half_mask = ((uint64_t)1 << l->half_bits) - 1;
    l->seed = opt->seed;
    zoff_loader_reset(l);
    *out = l;
    return ZOFF_OK;
}

void zoff_loader_free(zoff_loader *l) {
    if (!l) return;
    free(l->segs);
    free(l);
}

void zoff_loader_reset(zoff_loader *l) {
    l->epoch = 0;
    l->window = 0;
    epoch_keys(l);
}

/* Window w's T + 1 tokens, their ids checked against the vocabulary (shards are
 * not scanned at open: a bad id is refused here, naming the file and position). */
static zoff_status window_tokens(const zoff_loader *l, int64_t w, const uint16_t **out,
                                 const zoff_shard *volatile *shard) {
    int lo = 0, hi = l->num_segs - 1;
    while (lo < hi) { /* last segment with first_window <= w */
        int mid = (lo + hi + 1) / 2;
        if (l->segs[mid].first_window <= w) lo = mid;
        else hi = mid - 1;
    }
    const segment *s = &l->segs[lo];
    *shard = s->shard; /* before its tokens are read: the shard a fault names */
    const int64_t off = (w - s->first_window) * l->opt.seq_len;
    ZOFF_TRY(zoff_shard_check_tokens(s->shard, s->start + off, s->start + off + l->opt.seq_len + 1));
    *out = s->tokens + off;
    return ZOFF_OK;
}

/* The shards are mapped: a shard truncated in place while a loader reads it (a script writing its
 * file again, not zoff tokenize's new file renamed over it) faults with SIGBUS on the pages gone.
 * While this thread copies a batch, that fault returns to zoff_loader_next as an error naming the
 * shard; any other SIGBUS gets its previous disposition back and faults again as it would have. */
static _Thread_local sigjmp_buf *t_bus_jump;
static struct sigaction g_bus_prev;
static pthread_once_t g_bus_once = PTHREAD_ONCE_INIT;

static void on_bus(int sig) {
    if (t_bus_jump) siglongjmp(*t_bus_jump, 1);
    sigaction(sig, &g_bus_prev, NULL); /* not a loader's read: returning re-runs the fault under it */
}

static void install_bus_handler(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_bus;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_NODEFER;
    sigaction(SIGBUS, &sa, &g_bus_prev);
}

/* B windows from `base` of this epoch's order into inputs and targets; *cur: the shard being read. */
static zoff_status copy_batch(const zoff_loader *l, int64_t base, int32_t *inputs, int32_t *targets,
                              const zoff_shard *volatile *cur) {
    const int64_t B = l->opt.batch_size, T = l->opt.seq_len;
    for (int64_t b = 0; b < B; b++) {
        int64_t i = base + b;
        int64_t w = l->opt.shuffle ? permute(l, i) : i;
        const uint16_t *src = NULL;
        ZOFF_TRY(window_tokens(l, w, &src, cur));
        int32_t *x = inputs + b * T, *y = targets + b * T;
        for (int64_t t = 0; t < T; t++) {
            x[t] = src[t];
            y[t] = src[t + 1];
        }
    }
    return ZOFF_OK;
}

zoff_status zoff_loader_next(zoff_loader *l, int32_t *inputs, int32_t *targets) {
    const int64_t B = l->opt.batch_size;
    const int64_t need = B * (int64_t)l->opt.world_size;
    if (l->window + need > l->num_windows) {
        l->epoch++;
        l->window = 0;
        epoch_keys(l);
    }
    pthread_once(&g_bus_once, install_bus_handler);
    const zoff_shard *volatile cur = NULL;
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1)) {
        t_bus_jump = NULL;
        return zoff_error(ZOFF_ERR_IO,
                          "%s: the file became shorter while this run reads it (written again in place, or "
                          "truncated): its tokens are gone. Write shards anew with zoff tokenize (a new file renamed "
                          "over the old one, which a running job keeps reading), or stop the run first",
                          cur ? zoff_shard_path(cur) : "a token shard");
    }
    t_bus_jump = &jump;
    zoff_status s = copy_batch(l, l->window + (int64_t)l->opt.rank * B, inputs, targets, &cur);
    t_bus_jump = NULL;
    if (s == ZOFF_OK) l->window += need;
    return s;
}

int64_t zoff_loader_num_windows(const zoff_loader *l) { return l->num_windows; }
int64_t zoff_loader_batches_per_epoch(const zoff_loader *l) {
    return l->num_windows / (l->opt.batch_size * (int64_t)l->opt.world_size);
}
int64_t zoff_loader_epoch(const zoff_loader *l) { return l->epoch; }

zoff_loader_state zoff_loader_get_state(const zoff_loader *l) {
    zoff_loader_state s;
    memset(&s, 0, sizeof s);
    s.seed = l->seed;
    s.epoch = l->epoch;
    s.window = l->window;
    s.seq_len = l->opt.seq_len;
    s.num_windows = l->num_windows;
    s.fingerprint = l->fingerprint;
    s.contents = l->contents;
    return s;
}

zoff_status zoff_loader_set_state(zoff_loader *l, const zoff_loader_state *s) {
    if (s->seq_len != l->opt.seq_len)
        return zoff_error(ZOFF_ERR_INVALID,
                          "cannot restore the data position: it was saved with sequence length %lld, this run uses "
                          "%lld; resume with the same sequence length",
                          (long long)s->seq_len, (long long)l->opt.seq_len);
    if (s->num_windows != l->num_windows)
        return zoff_error(ZOFF_ERR_INVALID,
                          "cannot restore the data position: it was saved over %lld windows of %lld tokens, this "
                          "dataset split has %lld; resume with the same data files and split",
                          (long long)s->num_windows, (long long)(s->seq_len + 1), (long long)l->num_windows);
    if (s->fingerprint != l->fingerprint)
        return zoff_error(ZOFF_ERR_INVALID,
                          "cannot restore the data position: the data files, split or shuffle setting differ from "
                          "the saved run (fingerprint %016llx, now %016llx); resume with the same data and options",
                          (unsigned long long)s->fingerprint, (unsigned long long)l->fingerprint);
    /* epochs past 2^62 cannot be reached (each takes at least one batch) and would overflow the epoch counter */
    if (s->epoch < 0 || s->epoch > (INT64_C(1) << 62) || s->window < 0 || s->window > l->num_windows)
        return zoff_error(ZOFF_ERR_INVALID, "cannot restore the data position: epoch %lld window %lld is out of range "
                                            "(%lld windows); the saved state is corrupt",
                          (long long)s->epoch, (long long)s->window, (long long)l->num_windows);
    if (s->contents != 0 && s->contents != l->contents)
        zoff_log(ZOFF_LOG_WARN,
                 "the data position is restored, but %s holds other tokens than the saved run's (the same files "
                 "and sizes, other contents: written again since?): training goes on from the same position over "
                 "the new tokens; resume with the run's shards to continue it exactly",
                 l->opt.what ? l->opt.what : split_name(l->opt.split));
    l->seed = s->seed;
    l->epoch = s->epoch;
    l->window = s->window;
    epoch_keys(l);
    return ZOFF_OK;
}
