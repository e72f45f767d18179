/* zoff plan: memory and step-time predictions per setting, the grid, the
 * recommendation, and the recommended config as DeepSpeed JSON.
 *
 * Every byte count here re-derives an allocation made elsewhere, from the
 * shape alone:
 *   model   src/model/gpt2.c   zoff_gpt2_create: parameters, gradients, one
 *                              activation allocation carved in 256-byte aligned
 *                              pieces (layout_activations), pinned losses
 *   engine  src/zero/engine.c  zoff_engine_create: sub-groups and "auto" from
 *                              src/zero/placement.c (called here too),
 *                              device master/m/v + 8 bytes of statistics per
 *                              layer group, with buckets the device gradients
 *                              (zoff_placement_grad_device), host
 *                              master/m/v + gradient partition(s) + staging
 *   loop    src/train          token buffers on the device, the checkpoint
 *                              save's piece buffer on the host
 * tests/test_plan.c compares them with what those functions really allocate (stage 3 and nvme
 * included, one rank; ranks > 1 within 10%: docs/plan.md). */
#define _GNU_SOURCE
#include "zoff/plan.h"
#include "zoff/aio.h"
#include "zoff/engine.h"
#include "zoff/swapper.h"
#include "zoff/train.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* Predicted times within this fraction of the fastest count as a tie. */
#define TIE_FRACTION 0.02

const char *zoff_plan_offload_name(zoff_offload_device d) {
    return d == ZOFF_OFFLOAD_CPU ? "cpu" : d == ZOFF_OFFLOAD_NVME ? "nvme" : "none";
}

const char *zoff_plan_source_name(zoff_plan_source s) {
    switch (s) {
    case ZOFF_PLAN_SRC_PROBE: return "probe";
    case ZOFF_PLAN_SRC_BENCH: return "bench";
    case ZOFF_PLAN_SRC_FLAG: return "flag";
    default: return "assumed";
    }
}

/* ------------------------------------------------------------------ the model's allocations */

typedef struct measure {
    size_t off;
    bool overflow;
} measure;

/* src/model/gpt2.c carve(): each piece starts at the next multiple of 256 bytes. */
static void carve(measure *c, int64_t count, size_t elem) {
    size_t bytes, start;
    if (count < 0 || __builtin_mul_overflow((size_t)count, elem, &bytes) ||
        __builtin_add_overflow(c->off, (size_t)255, &start)) {
        c->overflow = true;
        return;
    }
    start &= ~(size_t)255;
    if (__builtin_add_overflow(start, bytes, &c->off)) c->overflow = true;
}

zoff_status zoff_plan_model_bytes_get(const zoff_gpt2_options *o, zoff_plan_model_bytes *out) {
    memset(out, 0, sizeof *out);
    const zoff_gpt2_shape *s = &o->shape;
    const char *w = "model shape";
    ZOFF_TRY(zoff_gpt2_check_shape(s, w, NULL));
    const int64_t Vp = zoff_gpt2_padded_vocab(s);
    if (o->batch_size < 1 || o->batch_size > ZOFF_GPT2_MAX_BATCH)
        return zoff_error(ZOFF_ERR_INVALID, "%s: micro-batch size is %lld; it must be in [1, %lld]", w,
                          (long long)o->batch_size, (long long)ZOFF_GPT2_MAX_BATCH);
    if (o->seq_len < 1 || o->seq_len > s->max_seq_len)
        return zoff_error(ZOFF_ERR_INVALID, "%s: seq_length %lld must be in [1, max_position_embeddings=%lld]", w,
                          (long long)o->seq_len, (long long)s->max_seq_len);
    if (o->dtype != ZOFF_F32 && o->dtype != ZOFF_BF16 && o->dtype != ZOFF_F16)
        return zoff_error(ZOFF_ERR_INVALID, "%s: dtype must be f32, bf16 or fp16", w);
    const int64_t L = s->num_layers, C = s->hidden_size, NH = s->num_heads;
    const int64_t N = o->batch_size * o->seq_len;
    int64_t tmp;
    if (__builtin_mul_overflow(N, Vp, &tmp) || __builtin_mul_overflow(N, 4 * C, &tmp))
        return zoff_error(ZOFF_ERR_INVALID, "%s: micro-batch x seq_length (%lld) is too large", w, (long long)N);
    const size_t d = zoff_dtype_size(o->dtype), f = sizeof(float);
    out->padded_vocab_size = Vp;
    out->block_params = zoff_gpt2_block_params(C);
    out->num_params = zoff_gpt2_count_params(s);
    out->params = (size_t)out->num_params * d;
    out->grads = out->params;
    /* layout_activations(), in its order */
    measure c = {0};
    for (int64_t l = 0; l <= L; l++) carve(&c, N * C, d); /* resid[0..L] */
    int64_t sets = o->checkpoint_activations ? 1 : L;
    for (int64_t i = 0; i < sets; i++) {
        carve(&c, N * C, d);     /* ln1 */
        carve(&c, N, f);         /* ln1_mean */
        carve(&c, N, f);         /* ln1_rstd */
        carve(&c, N * 3 * C, d); /* qkv */
        carve(&c, N * C, d);     /* atty */
        carve(&c, N * NH, f);    /* lse */
        carve(&c, N * C, d);     /* res2 */
        carve(&c, N * C, d);     /* ln2 */
        carve(&c, N, f);         /* ln2_mean */
        carve(&c, N, f);         /* ln2_rstd */
        carve(&c, N * 4 * C, d); /* fch */
        carve(&c, N * 4 * C, d); /* fch_gelu */
    }
    carve(&c, N * C, d);           /* lnf */
    carve(&c, N, f);               /* lnf_mean */
    carve(&c, N, f);               /* lnf_rstd */
    carve(&c, N * Vp, d);          /* logits */
    carve(&c, N, f);               /* losses */
    carve(&c, N, sizeof(int32_t)); /* tokens */
    carve(&c, N, sizeof(int32_t)); /* targets */
    carve(&c, N * C, d);           /* dresid */
    carve(&c, N * C, d);           /* dln */
    carve(&c, N * C, d);           /* datty */
    carve(&c, N * 3 * C, d);       /* dqkv */
    carve(&c, N * 4 * C, d);       /* dfch */
    if (c.overflow)
        return zoff_error(ZOFF_ERR_INVALID, "%s: activation memory for %lld tokens overflows size_t", w, (long long)N);
    out->activations = c.off;
    out->host_losses = (size_t)N * f;
    out->host_tokens = (size_t)N * sizeof(int32_t);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ settings */

void zoff_plan_setting_from_config(const zoff_config *cfg, zoff_plan_setting *s) {
    const zoff_zero_config *z = &cfg->zero;
    memset(s, 0, sizeof *s);
    s->stage = z->stage;
    s->offload = z->cpu_offload && z->offload_optimizer.device == ZOFF_OFFLOAD_NONE ? ZOFF_OFFLOAD_CPU
                                                                                    : z->offload_optimizer.device;
    s->param_offload = z->offload_param.device;
    s->ratio = s->offload == ZOFF_OFFLOAD_NONE ? 0.0 : z->offload_optimizer.ratio;
    s->ratio_auto = s->offload != ZOFF_OFFLOAD_NONE && z->offload_optimizer.ratio_auto;
    s->pin_memory = z->offload_optimizer.pin_memory || z->cpu_offload;
    s->param_pin_memory = z->offload_param.pin_memory;
    s->sub_group_size = z->sub_group_size;
    s->bf16_states = cfg->bf16_optimizer_states;
}

bool zoff_plan_changes_sub_group_size(const zoff_config *base, const zoff_plan_setting *s) {
    return s->sub_group_size != base->zero.sub_group_size;
}

/* The NVMe swap file's arrays (src/zero/engine.c nvme_create): the fp32 master, then m and v
 * as the optimizer uses them, in the state dtype (zoff_optimizer_state_dtype); their count. */
typedef struct swap_arrays {
    int n;
    zoff_dtype dt[ZOFF_SWAP_MAX_ARRAYS];
} swap_arrays;
static swap_arrays swap_arrays_of(const zoff_config *cfg) {
    zoff_dtype sdt = zoff_optimizer_state_dtype(cfg);
    swap_arrays a = {.n = zoff_optimizer_state_arrays(cfg), .dt = {ZOFF_F32, sdt, sdt}};
    return a;
}

static size_t mul_sat(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}
static size_t add_sat(size_t a, size_t b) { return a > SIZE_MAX - b ? SIZE_MAX : a + b; }
/* The engine's placement (zoff_placement_build, src/zero/placement.c) of a
 * partition of `part` elements, with the model's layer groups as cuts where the
 * engine cuts there too. */
typedef struct plan_placement {
    int64_t host;          /* elements on the host */
    int nsg, host_groups;  /* sub-groups, of them on the host */
    int64_t largest_host;  /* elements of the largest host sub-group */
    size_t host_swap_bytes;/* the swap file's groups: one per host sub-group (zoff_swapper_group_bytes) */
} plan_placement;
static zoff_status place(int64_t part, const zoff_plan_setting *s, double ratio, int64_t R, int64_t emb, int64_t blk,
                         int64_t L, const swap_arrays *sw, plan_placement *out) {
    int64_t *cuts = NULL;
    int ncuts = 0;
    if (zoff_placement_layer_cuts((int)R, s->stage, s->offload == ZOFF_OFFLOAD_NVME)) {
        if (!(cuts = malloc((size_t)(L + 1) * sizeof *cuts))) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
        for (int64_t l = 0; l <= L; l++) cuts[ncuts++] = emb + l * blk; /* [wte, wpe] | h.0 | ... | ln_f */
    }
    zoff_placement p;
    zoff_placement_input in = {.n = part, .sub_group_size = s->sub_group_size, .ratio = ratio, .cuts = cuts,
                               .ncuts = ncuts};
    zoff_status st = zoff_placement_build(&in, &p);
    free(cuts);
    if (st != ZOFF_OK) return st;
    *out = (plan_placement){.host = p.host, .nsg = p.nsg, .host_groups = p.host_groups,
                            .largest_host = p.largest_host};
    for (int i = 0; i < p.nsg; i++)
        if (p.sg[i].on_host)
            out->host_swap_bytes = add_sat(out->host_swap_bytes, zoff_swapper_group_bytes(p.sg[i].count, sw->n, sw->dt));
    zoff_placement_free(&p);
    return ZOFF_OK;
}

static size_t frac_of(size_t cap, double keep) { return (size_t)((double)cap * keep); }

/* FLOPs of one micro-batch: forward, backward (2x forward) and the forward
 * recomputation of activation checkpointing (every block but the last). */
static double micro_batch_flops(const zoff_gpt2_options *o, int64_t Vp, double *bwd_out) {
    const double L = (double)o->shape.num_layers, C = (double)o->shape.hidden_size;
    const double B = (double)o->batch_size, T = (double)o->seq_len, N = B * T;
    double blocks = 2.0 * N * L * 12.0 * C * C + 4.0 * B * T * T * C * L; /* matmuls + attention scores/values */
    double fwd = blocks + 2.0 * N * (double)Vp * C;                       /* + the tied lm head */
    double recompute = o->checkpoint_activations ? blocks * (L - 1.0) / L : 0.0;
    if (bwd_out) *bwd_out = 2.0 * fwd + recompute;
    return 3.0 * fwd + recompute;
}

/* src/zero/partition.c zoff_dp_plan_build: rank r ends at
 * floor(n (r+1) / N) rounded down to ZOFF_DP_ALIGN (64) elements when n >= 256 N,
 * the last rank at n. Returns the largest partition (the rank the plan reports). */
static int64_t largest_partition_at(int64_t n, int64_t world, int64_t *start) {
    *start = 0;
    if (world <= 1) return n;
    int64_t align = n >= 64 * world * 4 ? 64 : 1, prev = 0, big = 0;
    for (int64_t r = 0; r < world; r++) {
        int64_t end = r == world - 1 ? n : (int64_t)((double)n * (double)(r + 1) / (double)world) / align * align;
        if (end < prev) end = prev;
        if (end - prev > big) big = end - prev, *start = prev;
        prev = end;
    }
    return big;
}
static int64_t largest_partition(int64_t n, int64_t world) {
    int64_t start;
    return largest_partition_at(n, world, &start);
}
/* Where that partition starts (the first rank with the largest, as the loop above finds it). */
static int64_t largest_partition_start(int64_t n, int64_t world) {
    int64_t start;
    largest_partition_at(n, world, &start);
    return start;
}


static const char *short_unsupported(const zoff_plan_setting *s) {
    if (s->stage >= 3) return "stage 3 is not implemented yet";
    if (s->offload == ZOFF_OFFLOAD_NVME) return "nvme optimizer offload is not implemented yet";
    if (s->param_offload != ZOFF_OFFLOAD_NONE) return "parameter offload is not implemented yet";
    return NULL;
}

static void append_why(zoff_plan_row *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void append_why(zoff_plan_row *r, const char *fmt, ...) {
    size_t used = strlen(r->why);
    if (used + 3 >= sizeof r->why) return;
    if (used) {
        memcpy(r->why + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + used, sizeof r->why - used, fmt, ap);
    va_end(ap);
}

/* The setting's own rules, and the machine's rank counts. */
static zoff_status check_setting(const zoff_plan_setting *s, const zoff_plan_machine *M) {
    if (s->stage < 0 || s->stage > 3)
        return zoff_error(ZOFF_ERR_CONFIG, "zero_optimization.stage is %d; allowed: 0, 1, 2, 3", s->stage);
    if (s->offload != ZOFF_OFFLOAD_NONE && s->stage == 0)
        return zoff_error(ZOFF_ERR_CONFIG,
                          "zero_optimization.offload_optimizer.device \"%s\" needs stage 1, 2 or 3 (got 0)",
                          zoff_plan_offload_name(s->offload));
    if (s->param_offload != ZOFF_OFFLOAD_NONE && s->stage != 3)
        return zoff_error(ZOFF_ERR_CONFIG, "zero_optimization.offload_param.device \"%s\" needs stage 3 (got %d)",
                          zoff_plan_offload_name(s->param_offload), s->stage);
    if (!s->ratio_auto && !(s->ratio >= 0.0 && s->ratio <= 1.0))
        return zoff_error(ZOFF_ERR_CONFIG, "zero_optimization.offload_optimizer.ratio is %g; allowed: [0, 1] or \"auto\"",
                          s->ratio);
    if (M->ranks < 1 || M->ranks_per_node < 1 || M->ranks_per_node > M->ranks)
        return zoff_error(ZOFF_ERR_INVALID, "ranks %d and ranks per node %d: need 1 <= per node <= ranks",
                          M->ranks, M->ranks_per_node);
    return ZOFF_OK;
}

/* The model's device buffers and the engine's data-parallel (or stage-3)
 * buffers, for a partition of `part` elements; `maxgrp` is the largest layer
 * group (wte + wpe, a block, ln_f). Returns whether the engine uses gradient
 * buckets (zoff_placement_grad_buckets_for): then the model holds no gradient
 * buffer (grads16 0 here; the engine's device gradients are counted after the
 * placement). */
static bool device_buffers(const zoff_plan_inputs *in, const zoff_plan_setting *s, const zoff_plan_model_bytes *mb,
                           int64_t part, int64_t emb, int64_t blk, int64_t lnf, int64_t maxgrp, zoff_plan_memory *m) {
    const zoff_config *cfg = in->cfg;
    const zoff_gpt2_options *mo = &in->model;
    const size_t es = zoff_dtype_size(mo->dtype);
    const int64_t R = in->machine.ranks, L = mo->shape.num_layers, B = mo->batch_size, T = mo->seq_len;
    const bool rr = cfg->zero.round_robin_gradients && R > 1;
    m->activations = mb->activations;
    m->tokens = 2 * (size_t)(B * T) * sizeof(int32_t);
    const int64_t accum = cfg->gradient_accumulation_steps > 0 ? cfg->gradient_accumulation_steps : 1;
    const bool buckets = s->offload != ZOFF_OFFLOAD_NONE &&
                         zoff_placement_grad_buckets_for(cfg->zero.grad_buckets, s->stage, s->offload, accum);
    if (s->stage < 3) {
        m->params16 = mb->params;
        m->grads16 = buckets ? 0 : mb->grads;
        if (R > 1) { /* engine.c dp_setup: one layer's gradients, at most a reduce bucket */
            int64_t el = maxgrp;
            if (cfg->zero.reduce_bucket_size > 0 && el > cfg->zero.reduce_bucket_size) el = cfg->zero.reduce_bucket_size;
            m->comm_buffers = (size_t)el * es * ((s->stage >= 2 ? 1 : 0) + (rr ? 1 : 0));
        }
    } else {
        /* engine.c s3_setup: this rank's weights (on the host with offload_param
         * cpu: the host optimizer's output) and gradients; a whole group for
         * reduce-scatter (and round-robin packing) */
        m->params16 = s->param_offload == ZOFF_OFFLOAD_NONE ? (size_t)part * es : 0;
        m->grads16 = (size_t)part * es;
        m->comm_buffers = (size_t)maxgrp * es * (1 + (rr ? 1 : 0));
        m->gathered = zoff_placement_s3_gathered(emb, blk, L, lnf, cfg->zero.stage3_param_persistence_threshold,
                                                 cfg->zero.stage3_prefetch_bucket_size, es);
    }
    return buckets;
}

/* Device gradient bytes (one home: zoff_placement_grad_device, zoff_placement_auto_engine_bytes)
 * over GPT-2's layer groups [wte + wpe, blocks, ln_f]. device >= 0: with buckets, the device
 * buffer and the buckets for `device` device parameters (*a). device < 0: what "auto" adds
 * (*a fixed: the statistics and, with buckets, the buckets; *b per device parameter). */
static zoff_status plan_grad_bytes(const zoff_plan_inputs *in, bool buckets, int64_t emb, int64_t blk, int64_t device,
                                   size_t *a, size_t *b) {
    const int ng = (int)in->model.shape.num_layers + 2;
    int64_t *gc = malloc((size_t)ng * sizeof *gc);
    if (!gc) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %d layer groups", ng);
    for (int g = 0; g < ng; g++) gc[g] = g == 0 ? emb : g == ng - 1 ? 2 * in->model.shape.hidden_size : blk;
    zoff_grad_device_in gi = {.group_count = gc, .ngroups = ng, .device = device > 0 ? device : 0,
                              .reduce_bucket_size = in->cfg->zero.reduce_bucket_size, .dtype = in->model.dtype,
                              .spread = in->machine.ranks > 1, .accumulate = in->cfg->gradient_accumulation_steps > 1};
    if (device < 0) {
        zoff_placement_auto_engine_bytes(buckets ? &gi : NULL, ng, a, b);
    } else {
        zoff_grad_device gd;
        zoff_placement_grad_device(&gi, &gd);
        *a = gd.bytes;
    }
    free(gc);
    return ZOFF_OK;
}

/* Stage 3 with offload_param nvme: the weights on disk and the buffers that read them, from the
 * engine's own sizes (zoff_placement_param_swap, which src/zero/stage3.c lays the file out with):
 * this rank's runs are its partition [lo, lo + part) cut at the groups (wte + wpe, each block,
 * ln_f; the contiguous partition, one run per group); whole groups up to max_in_cpu elements stay
 * in host memory; the rest is in the file, read through min(buffer_count, groups on disk) buffers
 * of the largest on-disk group's slots, each allocated with ZOFF_AIO_ALIGN more (aligned by hand). */
static zoff_status param_swap_memory(const zoff_config *cfg, int64_t lo, int64_t part, int64_t emb, int64_t blk,
                                     int64_t lnf, int64_t L, size_t es, zoff_plan_memory *m) {
    const zoff_offload_param_config *op = &cfg->zero.offload_param;
    const int ng = (int)L + 2;
    int *gruns = calloc((size_t)ng, sizeof *gruns);
    int64_t *rc = calloc((size_t)ng, sizeof *rc);
    if (!gruns || !rc) {
        free(gruns), free(rc);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    }
    int nr = 0;
    for (int g = 0; g < ng; g++) {
        int64_t g0 = g == 0 ? 0 : emb + (int64_t)(g - 1) * blk, gn = g == 0 ? emb : g <= L ? blk : lnf;
        int64_t a = g0 > lo ? g0 : lo, b = g0 + gn < lo + part ? g0 + gn : lo + part;
        if (b > a) gruns[g] = 1, rc[nr++] = b - a;
    }
    zoff_param_swap sw;
    zoff_placement_param_swap(&(zoff_param_swap_in){.ngroups = ng, .group_runs = gruns, .run_count = rc, .es = es,
                                                    .max_in_cpu = op->max_in_cpu},
                              NULL, &sw);
    free(gruns), free(rc);
    m->disk_params = sw.file_bytes;
    /* a part above buffer_size is refused by the engine (a config error); counted here at buffer_size */
    size_t buf = sw.largest_elems > op->buffer_size ? zoff_placement_param_slot_bytes(op->buffer_size, es)
                                                      : sw.buffer_bytes;
    int64_t cnt = op->buffer_count < sw.ondisk ? op->buffer_count : sw.ondisk;
    if (sw.ondisk > 0 && cnt < 1) cnt = 1;
    m->param_buffers = mul_sat((size_t)cnt, buf + ZOFF_AIO_ALIGN);
    if (sw.resident_bytes) m->param_buffers = add_sat(m->param_buffers, sw.resident_bytes + ZOFF_AIO_ALIGN);
    return ZOFF_OK;
}

/* The totals of r->mem, and whether they fit the machine with its margin;
 * `model_dev_before_engine` is what the engine saw in use when "auto" failed. */
/* Whether ranks_per_node x bytes fit within keep of the free bytes of a file system (0: unknown, not
 * said to fit); why it does not goes to r->why, what (e.g. "disk") first. */
static bool disk_fits(zoff_plan_row *r, const char *what, size_t bytes, size_t free_bytes, size_t rpn, double keep) {
    char b1[32], b2[32];
    const size_t use = mul_sat(bytes, rpn);
    if (bytes == 0 || (free_bytes > 0 && use <= frac_of(free_bytes, keep))) return true;
    if (free_bytes == 0) append_why(r, "%s %s, free space unknown", what, zoff_format_bytes(use, b1, sizeof b1));
    else
        append_why(r, "%s %s > %s", what, zoff_format_bytes(use, b1, sizeof b1),
                   zoff_format_bytes(frac_of(free_bytes, keep), b2, sizeof b2));
    return false;
}

static void memory_fit(const zoff_plan_machine *M, const zoff_config *cfg, bool pinned, size_t model_dev_before_engine,
                       zoff_plan_row *r) {
    zoff_plan_memory *m = &r->mem;
    m->device = m->params16 + m->grads16 + m->activations + m->tokens + m->comm_buffers + m->gathered +
                m->device_optimizer + m->runtime_reserve;
    size_t engine_host = add_sat(add_sat(m->host_optimizer, m->host_grads), m->host_staging);
    bool pin_params = r->setting.param_pin_memory; /* offload_param.pin_memory, as the row writes it */
    m->pinned = add_sat(add_sat(m->model_pinned, pin_params ? m->param_buffers : 0), m->swap_pinned);
    m->pageable = add_sat(add_sat(m->loop_pageable, m->swap_buffers - m->swap_pinned), pin_params ? 0 : m->param_buffers);
    m->pageable = add_sat(m->pageable, m->host_spec_backup);
    size_t engine_pinned = add_sat(m->host_pinned, pinned ? m->host_params : 0);
    m->pinned = add_sat(m->pinned, engine_pinned);
    m->pageable = add_sat(m->pageable, add_sat(engine_host, m->host_params) - engine_pinned);
    m->disk = add_sat(m->disk_optimizer, m->disk_params);

    /* ---- fit, with the margin */
    const double keep = 1.0 - M->margin;
    const size_t rpn = (size_t)M->ranks_per_node;
    char b1[32], b2[32];
    r->fits_device = M->device_bytes == 0 || m->device <= frac_of(M->device_bytes, keep);
    if (!r->fits_device)
        append_why(r, "device %s > %s", zoff_format_bytes(m->device, b1, sizeof b1),
                   zoff_format_bytes(frac_of(M->device_bytes, keep), b2, sizeof b2));
    r->fits_pinned = M->pinned_limit == SIZE_MAX || m->pinned <= frac_of(M->pinned_limit, keep);
    if (!r->fits_pinned)
        append_why(r, "pinned %s > %s (ulimit -l)", zoff_format_bytes(m->pinned, b1, sizeof b1),
                   zoff_format_bytes(frac_of(M->pinned_limit, keep), b2, sizeof b2));
    size_t per_rank_host = add_sat(add_sat(m->pinned, m->pageable), M->process_baseline);
    if (M->backend == ZOFF_BACKEND_CPU) per_rank_host = add_sat(per_rank_host, m->device); /* device memory is host memory */
    r->host_use = mul_sat(per_rank_host, rpn);
    r->fits_host = M->host_bytes == 0 || r->host_use <= frac_of(M->host_bytes, keep);
    if (!r->fits_host)
        append_why(r, "host %s > %s", zoff_format_bytes(r->host_use, b1, sizeof b1),
                   zoff_format_bytes(frac_of(M->host_bytes, keep), b2, sizeof b2));
    /* per file system: offload_param.nvme_path on one of its own holds the parameter swap file alone */
    const bool own = M->param_disk_own;
    r->fits_disk = disk_fits(r, own ? "optimizer disk" : "disk", own ? m->disk_optimizer : m->disk, M->disk_bytes, rpn, keep);
    if (own) r->fits_disk = disk_fits(r, "parameter disk", m->disk_params, M->param_disk_bytes, rpn, keep) && r->fits_disk;
    if (r->auto_failed)
        append_why(r, "ratio auto: the model alone (%s) leaves less than the engine's 5%% margin of the budget",
                   zoff_format_bytes(model_dev_before_engine, b1, sizeof b1));
    r->fits = r->fits_device && r->fits_pinned && r->fits_host && r->fits_disk && !r->auto_failed && !r->bad_config;
}

/* The host optimizer's seconds for nh parameters: the update at the mode's rate; with NVMe the read | update |
 * write pipeline over state_b bytes per parameter, plus filling and draining it (one sub-group of sg params). */
static double host_optim_time(const zoff_plan_rates *rt, const zoff_config *cfg, zoff_dtype dt,
                              const zoff_plan_setting *s, double nh, double state_b, double sg) {
    double t = nh / zoff_plan_host_rate(rt, cfg, dt, s->bf16_states);
    if (s->offload != ZOFF_OFFLOAD_NVME || nh == 0) return t;
    const double rd = nh * state_b / rt->disk_read, wr = nh * state_b / rt->disk_write;
    return fmax(t, fmax(rd, wr)) + sg * state_b / rt->disk_read + sg * state_b / rt->disk_write;
}

/* How zoff train's periodic saves would run with --save-snapshot-memory auto (src/train/trainer.c): the
 * snapshot's arena (src/zero/snapshot.c; none with the state in NVMe swap files) takes half of what this
 * setting leaves of the host memory, none with super_offload. */
static void periodic_saves(const zoff_plan_machine *M, const zoff_config *cfg, zoff_offload_device offload, int64_t R,
                           zoff_plan_row *r) {
    zoff_plan_memory *m = &r->mem;
    const int arrays = zoff_optimizer_state_arrays(cfg);
    if (offload != ZOFF_OFFLOAD_NVME) {
        m->snapshot = zoff_placement_snapshot_bytes(r->host_params, r->device_params, arrays, zoff_optimizer_state_dtype(cfg));
        m->snapshot_copy = r->host_params > 0 ? zoff_placement_snapshot_image_bytes(r->device_params, arrays) : 0;
    }
    const size_t left = M->host_bytes == 0 ? SIZE_MAX : M->host_bytes > r->host_use ? M->host_bytes - r->host_use : 0;
    r->snapshot_budget = cfg->zero.offload_optimizer.super_offload
                             ? -1
                             : (int64_t)zoff_placement_snapshot_auto_budget(m->snapshot, 0, left);
    const zoff_train_save_facts f = {.world = (int)R, .nvme = m->disk > 0, .host_params = r->host_params,
                                     .partition_params = r->partition_params, .snapshot_budget = r->snapshot_budget,
                                     .device_copy = m->snapshot_copy};
    r->background_saves = !zoff_train_ckpt_background_rule(&f, r->saves_why, sizeof r->saves_why);
    if (r->background_saves) r->saves_why[0] = 0;
}

/* Whether this version runs the setting: the config's checks and the engine's own rules. */
static void check_runnable(const zoff_config *cfg, const zoff_plan_setting *s, int64_t R, bool dpu, zoff_plan_row *r) {
    (void)R; /* read only in builds without MPI */
    const bool offload = s->offload != ZOFF_OFFLOAD_NONE;
    zoff_config c2 = *cfg; /* shallow: only read by check_supported */
    c2.zero.stage = s->stage;
    c2.zero.cpu_offload = false;
    c2.zero.offload_optimizer.device = s->offload;
    c2.zero.offload_param.device = s->param_offload;
    if (s->offload == ZOFF_OFFLOAD_NVME && !c2.zero.offload_optimizer.nvme_path[0])
        snprintf(c2.zero.offload_optimizer.nvme_path, sizeof c2.zero.offload_optimizer.nvme_path, ".");
    zoff_status cs = zoff_config_check_supported(&c2);
    r->runnable = cs == ZOFF_OK;
    if (cs != ZOFF_OK) {
        const char *why = short_unsupported(s);
        append_why(r, "not runnable: %s", why ? why : zoff_last_error());
        zoff_clear_error();
    }
#if !defined(ZOFF_HAVE_MPI)
    if (r->runnable && R > 1) {
        r->runnable = false;
        append_why(r, "not runnable: %lld ranks need a build with MPI (this one has none)", (long long)R);
    }
#endif
    /* the engine's own rules (engine.c check_supported) */
    if (r->runnable && s->param_offload != ZOFF_OFFLOAD_NONE && (!offload || s->ratio_auto || s->ratio < 1.0)) {
        r->runnable = false;
        append_why(r, "not runnable: offload_param %s needs the whole optimizer on the host (ratio 1)",
                   s->param_offload == ZOFF_OFFLOAD_NVME ? "nvme" : "cpu");
    }
    if (r->runnable && s->stage >= 3 && dpu) {
        r->runnable = false;
        append_why(r, "not runnable: the delayed parameter update is not implemented with stage 3");
    }
    if (r->runnable && (!offload || s->ratio_auto || s->ratio < 1.0) && cfg->optimizer.type != ZOFF_OPTIM_ADAM &&
        cfg->optimizer.type != ZOFF_OPTIM_ADAMW) {
        r->runnable = false;
        append_why(r, "not runnable: the device optimizer is Adam/AdamW only (use offload cpu, ratio 1)");
    }
}

/* Stage 3: the time to fetch this rank's `part` weights from the host or the
 * disk, and the others' (`n` in all) over the link, twice per micro-batch
 * (forward and backward). */
static double stage3_fetch_time(const zoff_plan_setting *s, const zoff_plan_rates *rt, double h2d, int64_t part,
                                int64_t n, size_t es, int64_t R) {
    double fetch = 0;
    if (s->param_offload == ZOFF_OFFLOAD_CPU) fetch += 2.0 * (double)part * (double)es / h2d;
    if (s->param_offload == ZOFF_OFFLOAD_NVME) fetch += 2.0 * (double)part * (double)es / rt->disk_read;
    if (R > 1) fetch += 2.0 * (double)(R - 1) / (double)R * (double)n * (double)es / rt->link;
    return fetch;
}

/* The step from its phases: `before_opt` (compute, gradients out, comm), then
 * the host and device optimizers, overlapped as the backend and the delayed
 * parameter update allow. */
static double step_overlap(zoff_backend_kind backend, bool dpu, double before_opt, const zoff_plan_time *t) {
    if (backend == ZOFF_BACKEND_CPU) /* "device" and host share the same cores: nothing overlaps */
        return before_opt + t->host_optim + t->weights_in + t->device_optim;
    if (dpu) return fmax(before_opt + t->device_optim, t->host_optim + t->weights_in);
    return before_opt - t->forward_overlap +
           fmax(t->forward_overlap + t->device_optim, t->host_optim + t->weights_in);
}

/* src/zero/swapper.c (its size functions, include/zoff/swapper.h): one swap group per host
 * sub-group (swap_arrays_of); a header; min(buffer_count, groups) buffers of the largest group. */
static void nvme_swap_memory(const zoff_config *cfg, bool pin, const plan_placement *pl, const swap_arrays *sw,
                             zoff_plan_row *r) {
    const zoff_offload_optimizer_config *oo = &cfg->zero.offload_optimizer;
    int64_t bc = oo->buffer_count;
    int need = zoff_swapper_buffers_needed(oo->pipeline_read, oo->pipeline_write, pl->host_groups);
    if (bc < need) {
        r->bad_config = true;
        snprintf(r->why, sizeof r->why,
                 "zero_optimization.offload_optimizer.buffer_count %lld is too few for the pipeline flags (needs %d)",
                 (long long)bc, need);
    }
    int slots = zoff_swapper_buffer_count(bc, pl->host_groups);
    if (slots < 1) slots = 1;
    /* pin_memory: each buffer pinned, aligned by hand (zoff_swapper_pinned_padding) */
    const size_t each = zoff_swapper_group_bytes(pl->largest_host, sw->n, sw->dt) + (pin ? zoff_swapper_pinned_padding() : 0);
    r->mem.swap_pinned = pin ? mul_sat((size_t)slots, each) : 0;
    r->mem.swap_buffers = add_sat(mul_sat((size_t)slots, each), 2 * (size_t)ZOFF_SWAP_HEADER_BYTES);
    r->mem.disk_optimizer = add_sat(ZOFF_SWAP_HEADER_BYTES, pl->host_swap_bytes);
}

/* zoff train's checkpoint of the setting (zoff_train_ckpt_bytes): m and v by the setting's ratio, the
 * state shared from stage 1 on with several ranks, the delayed update's device weights with an offload. */
static void checkpoint_bytes(const zoff_plan_inputs *in, const zoff_config *cfg, const zoff_plan_setting *s,
                             zoff_plan_memory *m) {
    zoff_config ck = *cfg;
    ck.zero.offload_optimizer.ratio = s->ratio;
    ck.zero.offload_optimizer.ratio_auto = s->ratio_auto;
    ck.zero.stage = s->stage;
    ck.zero.offload_optimizer.device = s->offload;
    ck.zero.cpu_offload = false;
    const zoff_train_ckpt_size cks = {.cfg = &ck, .shape = &in->model.shape, .model_dtype = in->model.dtype,
                                      .world = (int)in->machine.ranks, .config_text = in->cfg->source, .step = -1};
    m->checkpoint = zoff_train_ckpt_bytes(&cks, &m->checkpoint_bound);
}

zoff_status zoff_plan_evaluate(const zoff_plan_inputs *in, const zoff_plan_setting *s, zoff_plan_row *r) {
    memset(r, 0, sizeof *r);
    if (!in || !in->cfg || !s) return zoff_error(ZOFF_ERR_INVALID, "zoff_plan_evaluate: missing inputs");
    zoff_config with_states = *in->cfg; /* the setting's optimizer state dtype (the rest as configured) */
    with_states.bf16_optimizer_states = s->bf16_states;
    const zoff_config *cfg = &with_states;
    const zoff_plan_machine *M = &in->machine;
    const zoff_gpt2_options *mo = &in->model;
    ZOFF_TRY(check_setting(s, M));
    r->setting = *s;
    zoff_plan_model_bytes mb;
    ZOFF_TRY(zoff_plan_model_bytes_get(mo, &mb));
    const zoff_dtype dt = mo->dtype;
    const size_t es = zoff_dtype_size(dt), f4 = sizeof(float);
    const int64_t n = mb.num_params, R = M->ranks;
    const bool offload = s->offload != ZOFF_OFFLOAD_NONE;
    const bool pinned = s->pin_memory;
    const bool dpu = cfg->zero.delayed_param_update && offload;
    const swap_arrays sw = swap_arrays_of(cfg); /* host: master (+m) (+v) */
    const size_t state_b = zoff_placement_state_bytes_per_param(sw.n, zoff_optimizer_state_dtype(cfg));
    const int64_t B = mo->batch_size, T = mo->seq_len;
    const int64_t accum = cfg->gradient_accumulation_steps > 0 ? cfg->gradient_accumulation_steps : 1;
    zoff_plan_memory *m = &r->mem;

    /* ---- partition of the optimizer state (stages 1-3 partition it over the ranks;
     * stage 0 with several ranks replicates it) */
    const int64_t part = s->stage >= 1 ? largest_partition(n, R) : n;
    r->partition_params = part;

    /* ---- the model's device buffers and the engine's data-parallel buffers */
    const int64_t C = mo->shape.hidden_size, L = mo->shape.num_layers;
    const int64_t emb = (mb.padded_vocab_size + mo->shape.max_seq_len) * C; /* group: wte + wpe */
    const int64_t blk = mb.block_params, lnf = 2 * C;
    const int64_t maxgrp = emb > blk ? (emb > lnf ? emb : lnf) : (blk > lnf ? blk : lnf);
    const bool buckets = device_buffers(in, s, &mb, part, emb, blk, lnf, maxgrp, m);
    m->runtime_reserve = M->runtime_reserve;

    /* ---- placement of the optimizer's partition: host (cpu/nvme) or device */
    double ratio = offload ? s->ratio : 0.0;
    size_t model_dev_before_engine = 0; /* what the engine sees in use when it chooses "auto" */
    if (offload && s->ratio_auto) {
        /* allocated before the engine chooses: the model, the data-parallel buffers */
        model_dev_before_engine = (s->stage < 3 ? m->params16 + m->grads16 : 0) + m->activations + m->comm_buffers;
        zoff_auto_ratio ar;
        size_t fixed, per_param;
        ZOFF_TRY(plan_grad_bytes(in, buckets, emb, blk, -1, &fixed, &per_param));
        if (s->stage >= 3) /* the partitions and the gathered groups, allocated after the choice */
            fixed += zoff_placement_s3_auto_bytes(part, s->param_offload == ZOFF_OFFLOAD_NONE, m->gathered,
                                                  zoff_dtype_size(dt));
        zoff_placement_auto_ratio(M->device_budget ? M->device_bytes : 0, model_dev_before_engine, fixed, per_param,
                                  part, dt, &ar);
        r->auto_failed = !ar.fits;
        ratio = ar.ratio;
    }
    plan_placement pl = {0};
    ZOFF_TRY(place(part, s, offload ? ratio : 0.0, R, emb, blk, L, &sw, &pl));
    if (buckets) ZOFF_TRY(plan_grad_bytes(in, true, emb, blk, part - pl.host, &m->grads16, NULL));
    r->host_params = pl.host;
    r->num_subgroups = pl.nsg;
    r->device_params = part - r->host_params;
    r->host_ratio = part > 0 ? (double)r->host_params / (double)part : 0.0;
    const size_t nh = (size_t)r->host_params, nd = (size_t)r->device_params;
    const bool nvme = s->offload == ZOFF_OFFLOAD_NVME;

    /* ---- the engine */
    m->device_optimizer = nd * f4 * ((dt != ZOFF_F32 ? 1 : 0) + 2) + zoff_placement_stats_bytes((int)L + 2);
    if (nh > 0) {
        /* the engine's host buffers (one home: zoff_placement_host_buffers) */
        zoff_host_buffers hb;
        zoff_host_buffers_in hi = {.n_host = (int64_t)nh, .dtype = dt, .state_arrays = sw.n,
                                   .state_dt = zoff_optimizer_state_dtype(cfg),
                                   .nvme = nvme, .delayed = dpu,
                                   .speculate = cfg->zero.offload_optimizer.super_offload, .stage = s->stage,
                                   .param_offload = s->param_offload, .pin = pinned};
        zoff_placement_host_buffers(&hi, &hb);
        m->host_pinned = hb.pinned;
        m->host_optimizer = hb.state;
        m->host_grads = mul_sat(hb.grad_buffer, (size_t)hb.grad_buffers);
        m->host_staging = hb.staging;
    }
    if (nvme && nh > 0) nvme_swap_memory(cfg, pinned, &pl, &sw, r);
    /* stage 3, offload_param cpu: the weights are the host optimizer's output
     * buffer (16-bit staging, fp32: the master), already counted above */
    if (s->stage == 3 && s->param_offload == ZOFF_OFFLOAD_NVME) {
        ZOFF_TRY(param_swap_memory(cfg, R > 1 ? largest_partition_start(n, R) : 0, part, emb, blk, lnf, L, es, m));
    }
    /* super_offload, one rank: the model reports wte's rows (zoff_engine_uses_grad_rows) from a host copy of the tokens */
    m->host_spec_backup = zoff_placement_spec_backup_bytes(cfg, (int64_t)nh);
    bool rows = zoff_placement_grad_rows(m->host_spec_backup > 0, (int)R, s->stage);
    m->model_pinned = mb.host_losses + (rows ? mb.host_tokens : 0);
    /* zoff train (src/train): the checkpoint save's buffer (the writer's pieces or the load's piece, zoff_train_ckpt_save_bytes,
     * also with the state in an NVMe swap file: it streams through the swapper's buffer; with several ranks
     * also the master weights gathered, zoff_train_ckpt_gather_bytes), input and target tokens. The initial weights go straight
     * into the engine, random, --load's and --init-from's alike (no buffer; --init-from's one
     * transposed matrix, zoff_gpt2_st_loader_floats, is not planned) */
    size_t save = add_sat(zoff_train_ckpt_save_bytes(), zoff_train_ckpt_gather_bytes(R, s->stage));
    m->loop_pageable = save + 2 * (size_t)(B * T) * sizeof(int32_t);
    checkpoint_bytes(in, cfg, s, m);

    /* ---- totals, fit with the margin, runnable by this version */
    memory_fit(M, cfg, pinned, model_dev_before_engine, r);
    check_runnable(cfg, s, R, dpu, r);
    periodic_saves(M, cfg, s->offload, R, r);

    /* ---- step time */
    const zoff_plan_rates *rt = &M->rates;
    zoff_plan_time *t = &r->time;
    double bwd_flops = 0;
    double mb_flops = micro_batch_flops(mo, mb.padded_vocab_size, &bwd_flops);
    double t_mb = mb_flops / rt->device_flops, t_bwd = bwd_flops / rt->device_flops;
    double copy_scale = (!pinned && M->backend == ZOFF_BACKEND_CUDA) ? 0.5 : 1.0; /* pageable copies */
    double h2d = rt->h2d * copy_scale, d2h = rt->d2h * copy_scale;
    if (s->stage == 3) { /* parameter fetches per micro-batch (forward and backward), prefetched */
        double fetch = stage3_fetch_time(s, rt, h2d, part, n, es, R);
        t_mb = fmax(t_mb, fetch);
        t_bwd = fmax(t_bwd, fetch / 2);
    }
    t->compute = (double)accum * t_mb;
    t->grads_out = fmax(0.0, (double)nh * (double)es / d2h - t_bwd);
    if (buckets && accum > 1) /* zoff_grad_buckets "always": every micro-batch's host part out, the sum back in */
        t->grads_out = (double)accum * fmax(0.0, (double)nh * (double)es / fmin(d2h, h2d) - t_bwd);
    if (R > 1) {
        double frac = (double)(R - 1) / (double)R, bytes = (double)n * (double)es;
        double c = s->stage == 3 ? frac * bytes : 2.0 * frac * bytes; /* allreduce = reduce-scatter + all-gather */
        if (buckets && accum > 1) c += (double)(accum - 1) * frac * bytes; /* "always": every micro-batch reduced */
        c /= rt->link;
        t->comm = cfg->zero.overlap_comm ? fmax(0.0, c - t_bwd) : c;
    }
    const size_t sg_now = nh > 0 ? (size_t)pl.largest_host : 0;
    const double host_phase = host_optim_time(rt, cfg, dt, s, (double)nh, (double)state_b, (double)sg_now);
    t->host_optim = host_phase;
    t->weights_in = nh > 0 ? fmax(0.0, (double)nh * (double)es / h2d - host_phase) + (double)sg_now * (double)es / h2d
                           : 0.0;
    t->device_optim = (double)nd / rt->device_adam;
    /* the pipelined exact step (zoff_placement_pipelined, not delayed; not modelled with super_offload's
     * speculation): the next forward runs layer group by layer group as the host update finishes them, so its
     * first micro-batch's forward overlaps the host */
    if (M->backend == ZOFF_BACKEND_CUDA && offload && !dpu && nh > 0 &&
        zoff_placement_pipelined((int)R, s->stage, s->offload == ZOFF_OFFLOAD_NVME, dpu) &&
        !cfg->zero.offload_optimizer.super_offload)
        t->forward_overlap = t_mb - t_bwd;
    double before_opt = t->compute + t->grads_out + t->comm;
    t->step = step_overlap(M->backend, dpu, before_opt, t);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ the grid */

static size_t row_footprint(const zoff_plan_row *r) {
    return add_sat(add_sat(r->mem.device, r->mem.pinned), add_sat(r->mem.pageable, r->mem.disk));
}

/* The fastest row that fits (and runs, need_runnable) among those with bf16 states == bf16. */
static int pick_best(const zoff_plan *p, int cfg_stage, bool need_runnable, bool bf16) {
    double tmin = INFINITY;
    for (int i = 0; i < p->nrows; i++) {
        const zoff_plan_row *r = &p->rows[i];
        if (r->fits && (r->runnable || !need_runnable) && r->setting.bf16_states == bf16 && r->time.step < tmin)
            tmin = r->time.step;
    }
    if (!isfinite(tmin)) return -1;
    int best = -1;
    for (int i = 0; i < p->nrows; i++) {
        const zoff_plan_row *r = &p->rows[i];
        if (!r->fits || (need_runnable && !r->runnable) || r->setting.bf16_states != bf16 ||
            r->time.step > tmin * (1.0 + TIE_FRACTION))
            continue;
        if (best < 0) {
            best = i;
            continue;
        }
        const zoff_plan_row *b = &p->rows[best];
        bool rs = r->setting.stage == cfg_stage, bs = b->setting.stage == cfg_stage;
        if (rs != bs) {
            if (rs) best = i;
            continue;
        }
        size_t fr = row_footprint(r), fb = row_footprint(b);
        if (fr != fb) {
            if (fr < fb) best = i;
            continue;
        }
        /* equal memory (stages 1 and 2 on one rank): the usual ZeRO-Offload stage 2, then 0, 1, 3 */
        static const int pref[4] = {1, 2, 0, 3};
        if (pref[r->setting.stage] < pref[b->setting.stage]) best = i;
    }
    return best;
}

/* Evaluate s and append it; when its pinned bytes exceed the pinned limit,
 * append the same setting with pageable host memory too. */
static zoff_status add_row(const zoff_plan_inputs *in, const zoff_plan_setting *s, bool fitted, zoff_plan *out) {
    zoff_plan_row *r = &out->rows[out->nrows];
    ZOFF_TRY(zoff_plan_evaluate(in, s, r));
    r->ratio_fitted = fitted;
    out->nrows++;
    const bool pins = (s->pin_memory && (s->offload != ZOFF_OFFLOAD_NONE || s->param_offload != ZOFF_OFFLOAD_NONE)) ||
                      (s->param_pin_memory && s->param_offload == ZOFF_OFFLOAD_NVME);
    if (!r->fits_pinned && pins) {
        zoff_plan_setting s2 = *s;
        s2.pin_memory = false;
        s2.param_pin_memory = false;
        zoff_plan_row *r2 = &out->rows[out->nrows];
        ZOFF_TRY(zoff_plan_evaluate(in, &s2, r2));
        r2->ratio_fitted = fitted;
        out->nrows++;
    }
    return ZOFF_OK;
}

/* The smallest host ratio whose device bytes fit the device with the plan's
 * margin ("as low as possible without causing OOM"): every device-side
 * parameter costs the engine's fp32 master (16-bit models), m and v (stage 3
 * and gradient buckets: and its gradient); whole sub-groups only raise the host part. Adds a row
 * when that ratio lies strictly between 0 and 1. */
static zoff_status add_fitted_row(const zoff_plan_inputs *in, const zoff_plan_setting *base, zoff_plan *out) {
    const zoff_plan_machine *M = &in->machine;
    if (M->device_bytes == 0) return ZOFF_OK;
    zoff_plan_setting s = *base;
    s.ratio_auto = false;
    s.ratio = 1.0;
    zoff_plan_row all_host;
    ZOFF_TRY(zoff_plan_evaluate(in, &s, &all_host));
    size_t cap = frac_of(M->device_bytes, 1.0 - M->margin);
    if (all_host.mem.device > cap) return ZOFF_OK; /* not even everything on the host fits */
    const int64_t accum = in->cfg->gradient_accumulation_steps > 0 ? in->cfg->gradient_accumulation_steps : 1;
    /* (the ratio found is below 1) */
    const bool buckets = zoff_placement_grad_buckets_for(in->cfg->zero.grad_buckets, s.stage, s.offload, accum);
    size_t per = sizeof(float) * (in->model.dtype != ZOFF_F32 ? 3 : 2) +
                 (s.stage == 3 || buckets ? zoff_dtype_size(in->model.dtype) : 0);
    int64_t part = all_host.partition_params;
    int64_t nd_max = (int64_t)((cap - all_host.mem.device) / per);
    if (nd_max >= part) return ZOFF_OK; /* ratio 0 fits */
    double ratio = 1.0 - (double)nd_max / (double)part;
    ratio = ceil(ratio * 1e4) / 1e4; /* a ratio that reads well in a config; rounds towards the host */
    if (!(ratio > 0.0 && ratio < 1.0)) return ZOFF_OK;
    s.ratio = ratio;
    return add_row(in, &s, true, out);
}

void zoff_plan_free(zoff_plan *p) {
    if (!p) return;
    free(p->rows);
    memset(p, 0, sizeof *p);
}

/* The rows of one stage and offload device: each ratio (none: one row), "auto", stage 3's
 * parameter offload at ratio 1, and the smallest ratio that fits. */
/* Whether two settings are the same (the same row of the grid). */
static bool same_setting(const zoff_plan_setting *a, const zoff_plan_setting *b) {
    return a->stage == b->stage && a->offload == b->offload && a->param_offload == b->param_offload &&
           a->ratio_auto == b->ratio_auto && (a->ratio_auto || a->ratio == b->ratio) && a->pin_memory == b->pin_memory &&
           a->param_pin_memory == b->param_pin_memory && a->sub_group_size == b->sub_group_size && a->bf16_states == b->bf16_states;
}

static zoff_status add_device_rows(const zoff_plan_inputs *in, const zoff_plan_setting *base, int stage,
                                   zoff_offload_device dev, const double *ratios, int nratios, zoff_plan *out) {
    zoff_plan_setting own; /* the config's own setting */
    zoff_plan_setting_from_config(in->cfg, &own);
    int nr = dev == ZOFF_OFFLOAD_NONE ? 1 : nratios + 1;
    for (int k = 0; k < nr; k++) {
        zoff_plan_setting s = *base;
        s.stage = stage;
        s.offload = dev;
        s.param_offload = stage == 3 ? base->param_offload : ZOFF_OFFLOAD_NONE;
        s.ratio_auto = dev != ZOFF_OFFLOAD_NONE && k == nratios;
        s.ratio = dev == ZOFF_OFFLOAD_NONE ? 0.0 : s.ratio_auto ? 1.0 : ratios[k];
        /* nvme streams whole sub-groups through its buffers: with one huge
         * sub-group the buffers would hold all the state (the engine itself
         * splits finer only for fractional ratios) */
        bool fine = dev == ZOFF_OFFLOAD_NVME && !s.ratio_auto && (s.ratio == 0.0 || s.ratio == 1.0);
        if (fine) {
            int64_t R = in->machine.ranks, n = out->model.num_params;
            int64_t part = stage >= 1 ? (n + R - 1) / R : n;
            int64_t sgs = s.sub_group_size > 0 ? s.sub_group_size : part;
            if ((part + sgs - 1) / sgs < ZOFF_PLAN_MIN_SUBGROUPS) {
                /* the config's own setting stays in the grid as it is (what a run of it allocates),
                 * the finer split after it */
                if (same_setting(&s, &own)) ZOFF_TRY(add_row(in, &s, false, out));
                s.sub_group_size = (part + ZOFF_PLAN_MIN_SUBGROUPS - 1) / ZOFF_PLAN_MIN_SUBGROUPS;
            }
        }
        ZOFF_TRY(add_row(in, &s, false, out));
        /* stage 3 with the whole optimizer offloaded: the weights can follow (ZeRO-Infinity) */
        if (stage == 3 && base->param_offload == ZOFF_OFFLOAD_NONE && dev != ZOFF_OFFLOAD_NONE && !s.ratio_auto &&
            s.ratio == 1.0) {
            zoff_plan_setting sp = s;
            sp.param_offload = dev;
            ZOFF_TRY(add_row(in, &sp, false, out));
        }
        if (k == nratios - 1 && dev != ZOFF_OFFLOAD_NONE)
            ZOFF_TRY(add_fitted_row(in, &s, out)); /* after the last ratio: the smallest that fits */
    }
    return ZOFF_OK;
}

/* Whether the plan adds bf16-optimizer-state rows for a config that keeps fp32 state: bf16
 * training (the key needs it) with the host optimizer ("cpu" and "nvme" rows). */
static bool try_bf16_states(const zoff_plan_inputs *in, const zoff_plan_setting *base) {
    return !base->bf16_states && in->model.dtype == ZOFF_BF16;
}

zoff_status zoff_plan_build(const zoff_plan_inputs *in, const double *ratios, int nratios, zoff_plan *out) {
    memset(out, 0, sizeof *out);
    static const double default_ratios[] = {0.0, 0.25, 0.5, 0.75, 1.0};
    if (!ratios) {
        ratios = default_ratios;
        nratios = (int)(sizeof default_ratios / sizeof default_ratios[0]);
    }
    if (nratios < 0 || nratios > 64) return zoff_error(ZOFF_ERR_INVALID, "%d ratios (at most 64)", nratios);
    ZOFF_TRY(zoff_plan_model_bytes_get(&in->model, &out->model));
    zoff_plan_setting base;
    zoff_plan_setting_from_config(in->cfg, &base);
    /* stage 0: 1; stages 1-3: none + (cpu, nvme) x (ratios + fitted + auto + stage 3's parameter offload),
     * each maybe with a pageable variant */
    int cap = (1 + 3 * (1 + 2 * (nratios + 3)) + 3 * 2 * (nratios + 3)) * 2; /* + bf16-state cpu and nvme rows */
    cap += 2; /* the config's own nvme setting beside its finer split (and its pageable variant) */
    out->rows = calloc((size_t)cap, sizeof *out->rows);
    if (!out->rows) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %d rows", cap);
    zoff_status st = ZOFF_OK;
    static const zoff_offload_device devs[3] = {ZOFF_OFFLOAD_NONE, ZOFF_OFFLOAD_CPU, ZOFF_OFFLOAD_NVME};
    for (int stage = 0; stage <= 3 && st == ZOFF_OK; stage++)
        for (int d = 0; d < (stage == 0 ? 1 : 3) && st == ZOFF_OK; d++)
            st = add_device_rows(in, &base, stage, devs[d], ratios, nratios, out);
    /* bf16 m and v (a numerics change the config did not ask for): offload "cpu" and "nvme", stages 1-3 */
    zoff_plan_setting b16 = base;
    b16.bf16_states = true;
    for (int stage = 1; stage <= 3 && st == ZOFF_OK && try_bf16_states(in, &base); stage++)
        for (int d = 1; d < 3 && st == ZOFF_OK; d++) st = add_device_rows(in, &b16, stage, devs[d], ratios, nratios, out);
    if (st != ZOFF_OK) {
        zoff_plan_free(out);
        return st;
    }
    /* the config's state dtype first; bf16 states (a numerics change) only when nothing else fits */
    out->best = pick_best(out, base.stage, true, base.bf16_states);
    if (out->best < 0 && try_bf16_states(in, &base)) out->best = pick_best(out, base.stage, true, true);
    out->best_any = pick_best(out, base.stage, false, base.bf16_states);
    if (out->best_any < 0 && try_bf16_states(in, &base)) out->best_any = pick_best(out, base.stage, false, true);
    return ZOFF_OK;
}

/* ------------------------------------------------------------------ the recommended config */

static json_t *obj_child(json_t *parent, const char *key) {
    json_t *o = json_object_get(parent, key);
    if (!json_is_object(o)) {
        o = json_object();
        json_object_set_new(parent, key, o);
    }
    return o;
}

zoff_status zoff_plan_config_json(const zoff_config *base, const zoff_plan_row *row, const char *nvme_path,
                                  bool replace_nvme_path, char **out) {
    *out = NULL;
    json_t *root;
    if (base->source) {
        json_error_t je;
        root = json_loads(base->source, 0, &je);
        if (!json_is_object(root)) {
            json_decref(root);
            return zoff_error(ZOFF_ERR_CONFIG, "%s: the config is not a JSON object (%s)",
                              base->source_name ? base->source_name : "config", je.text);
        }
    } else {
        root = json_object();
        json_object_set_new(root, "train_micro_batch_size_per_gpu",
                            json_integer((json_int_t)base->train_micro_batch_size_per_gpu));
    }
    const zoff_plan_setting *s = &row->setting;
    if (!nvme_path || !*nvme_path) nvme_path = ".";
    json_t *zo = obj_child(root, "zero_optimization");
    json_object_set_new(zo, "stage", json_integer(s->stage));
    json_object_del(zo, "cpu_offload"); /* legacy form of offload_optimizer */
    json_t *oo = json_object_get(zo, "offload_optimizer");
    if (s->offload == ZOFF_OFFLOAD_NONE) {
        if (json_is_object(oo)) {
            json_object_set_new(oo, "device", json_string("none"));
            json_object_del(oo, "ratio");
        }
        json_object_del(zo, "zoff_delayed_param_update"); /* needs the optimizer on the host */
    } else {
        oo = obj_child(zo, "offload_optimizer");
        json_object_set_new(oo, "device", json_string(zoff_plan_offload_name(s->offload)));
        json_object_set_new(oo, "pin_memory", json_boolean(s->pin_memory));
        /* the concrete ratio the plan predicted (auto resolved), unless it is all on the host */
        if (s->ratio_auto && row->host_ratio >= 1.0) json_object_del(oo, "ratio");
        else if (s->ratio_auto) json_object_set_new(oo, "ratio", json_real(row->host_ratio));
        else if (s->ratio >= 1.0) json_object_del(oo, "ratio");
        else json_object_set_new(oo, "ratio", json_real(s->ratio));
        if (s->offload == ZOFF_OFFLOAD_NVME && (replace_nvme_path || !json_is_string(json_object_get(oo, "nvme_path"))))
            json_object_set_new(oo, "nvme_path", json_string(nvme_path));
    }
    json_t *op = json_object_get(zo, "offload_param");
    if (s->param_offload != ZOFF_OFFLOAD_NONE) {
        op = obj_child(zo, "offload_param");
        json_object_set_new(op, "device", json_string(zoff_plan_offload_name(s->param_offload)));
        json_object_set_new(op, "pin_memory", json_boolean(s->param_pin_memory));
        if (s->param_offload == ZOFF_OFFLOAD_NVME && (replace_nvme_path || !json_is_string(json_object_get(op, "nvme_path"))))
            json_object_set_new(op, "nvme_path", json_string(nvme_path));
    } else if (json_is_object(op)) {
        json_object_set_new(op, "device", json_string("none"));
    }
    if (zoff_plan_changes_sub_group_size(base, s))
        json_object_set_new(zo, "sub_group_size", json_integer((json_int_t)s->sub_group_size));
    if (s->bf16_states != base->bf16_optimizer_states) /* the numerics change the row assumes */
        json_object_set_new(obj_child(root, "bf16"), "bf16_optimizer_states", json_boolean(s->bf16_states));
    char *txt = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(root);
    if (!txt) return zoff_error(ZOFF_ERR_NOMEM, "cannot encode the recommended config");
    size_t len = strlen(txt);
    char *withnl = realloc(txt, len + 2);
    if (!withnl) {
        free(txt);
        return zoff_error(ZOFF_ERR_NOMEM, "out of host memory");
    }
    withnl[len] = '\n';
    withnl[len + 1] = '\0';
    *out = withnl;
    return ZOFF_OK;
}

zoff_status zoff_plan_write_file_atomic(const char *path, const char *text) {
    if (!path || !*path) return zoff_error(ZOFF_ERR_INVALID, "empty output path");
    return zoff_write_file_atomic(path, text, false); /* the directory's fsync is best effort */
}

/* ------------------------------------------------------------------ DeepSpeed's estimators */

void zoff_plan_deepspeed_estimate(const zoff_gpt2_shape *sh, int gpus_per_node, int nodes, zoff_plan_deepspeed *o) {
    memset(o, 0, sizeof *o);
    const int64_t C = sh->hidden_size, V = sh->vocab_size;
    /* Hugging Face GPT2LMHeadModel: wte (V,C), wpe (P,C), blocks, ln_f; lm_head tied to wte (one data_ptr) */
    zoff_gpt2_shape unpadded = *sh;
    unpadded.padded_vocab_size = V;
    o->total_params = zoff_gpt2_count_params(&unpadded);
    /* model.modules() with recurse=False: wte / lm_head (V*C), c_fc (4C^2 + 4C), c_attn (3C^2 + 3C), ... */
    int64_t fc = 4 * C * C + 4 * C;
    o->largest_layer_params = V * C > fc ? V * C : fc;
    const double tp = (double)o->total_params, ll = (double)o->largest_layer_params, abf = 1.5;
    const double G = (double)gpus_per_node * (double)nodes, gpn = (double)gpus_per_node, gf = 1.0 / (double)nodes;
    /* estimate_zero2_model_states_mem_needs (DeepSpeed 0.16+: 2 + 18/G without offload) */
    o->z2_offload_gpu = 2.0 * tp;
    o->z2_offload_cpu = tp * fmax(4.0 * G, 16.0) * abf;
    o->z2_none_gpu = 2.0 * tp + floor(18.0 * tp / G);
    o->z2_none_cpu = tp * 4.0 * gpn * abf;
    /* estimate_zero3_model_states_mem_needs, zero_init = 1 */
    double llm = 4.0 * ll;
    o->z3_both_gpu = llm;
    o->z3_both_cpu = tp * 18.0 * gf * abf;
    o->z3_opt_gpu = llm + floor(2.0 * tp / G);
    o->z3_opt_cpu = tp * 16.0 * gf * abf;
    o->z3_none_gpu = llm + floor(18.0 * tp / G);
    o->z3_none_cpu = ll * 4.0 * gpn * abf;
}
