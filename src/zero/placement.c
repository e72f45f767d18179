/* Placement of the optimizer's partition (one home for it: the engine and
 * zoff plan both call these; see include/zoff/engine.h). Pure functions: no
 * device, no allocation besides the output list, no logging. */
#include <math.h>
#include <stdlib.h>

#include "zoff/aio.h"
#include "zoff/engine.h"

/* A fractional host ratio needs enough sub-groups to be honoured in whole ones. */
#define TWIN_FLOW_MIN_SUBGROUPS 32
/* "ratio": "auto" keeps this fraction of the device budget free. */
#define AUTO_MARGIN_FRACTION 0.05

zoff_dtype zoff_optimizer_state_dtype(const zoff_config *cfg) {
    return cfg->bf16_optimizer_states ? ZOFF_BF16 : ZOFF_F32;
}

int zoff_optimizer_state_arrays(const zoff_config *cfg) {
    return 1 + (cfg->optimizer.type != ZOFF_OPTIM_ADAGRAD) + (cfg->optimizer.type != ZOFF_OPTIM_LION);
}

zoff_dtype zoff_checkpoint_state_dtype(const zoff_config *cfg) {
    const zoff_offload_optimizer_config *oo = &cfg->zero.offload_optimizer;
    return !oo->ratio_auto && oo->ratio >= 1.0 ? zoff_optimizer_state_dtype(cfg) : ZOFF_F32;
}

size_t zoff_placement_state_bytes_per_param(int state_arrays, zoff_dtype state_dt) {
    return sizeof(float) + (size_t)(state_arrays - 1) * zoff_dtype_size(state_dt);
}

static size_t whole_blocks(size_t bytes) {
    const size_t bb = zoff_engine_snapshot_block_bytes();
    return (bytes + bb - 1) / bb * bb;
}

size_t zoff_placement_snapshot_image_bytes(int64_t n_dev, int state_arrays) {
    return n_dev > 0 ? whole_blocks((size_t)n_dev * sizeof(float) * (size_t)state_arrays) : 0;
}

/* Slots for n elements of es bytes in blocks of zoff_engine_snapshot_block_data_bytes. */
static size_t slots_for(int64_t n, size_t es) {
    const size_t per = zoff_engine_snapshot_block_data_bytes() / es;
    return ((size_t)n + per - 1) / per * zoff_engine_snapshot_block_bytes();
}

size_t zoff_placement_snapshot_bytes(int64_t n_host, int64_t n_dev, int state_arrays, zoff_dtype state_dt) {
    if (n_host <= 0) return 0;
    size_t host = slots_for(n_host, sizeof(float)); /* the master */
    for (int i = 1; i < state_arrays; i++) host += slots_for(n_host, zoff_dtype_size(state_dt));
    return host + zoff_placement_snapshot_image_bytes(n_dev, state_arrays);
}

size_t zoff_placement_snapshot_auto_budget(size_t full, size_t held, size_t left) {
    size_t half = left / 2 + held / 2 + (left % 2 + held % 2) / 2; /* (left + held) / 2 without overflow */
    if (half < held) half = held;
    return full < half ? full : half;
}

size_t zoff_placement_spec_backup_bytes(const zoff_config *cfg, int64_t host_params) {
    const zoff_offload_optimizer_config *o = &cfg->zero.offload_optimizer;
    if (!o->super_offload || o->device == ZOFF_OFFLOAD_NVME || host_params <= 0) return 0;
    return (size_t)host_params *
           zoff_placement_state_bytes_per_param(zoff_optimizer_state_arrays(cfg), zoff_optimizer_state_dtype(cfg));
}

bool zoff_placement_layer_cuts(int world, int stage, bool nvme) {
    /* stages 0-2, state in host memory, any number of ranks (a data-parallel partition is
     * cut where its pieces end as well; the NVMe swapper keeps one swap group per
     * sub_group_size piece) */
    (void)world;
    return stage < 3 && !nvme;
}

bool zoff_placement_pipelined(int world, int stage, bool nvme, bool delayed) {
    return zoff_placement_layer_cuts(world, stage, nvme) && !(world > 1 && (delayed || stage == 0));
}

/* Grid size: sub_group_size, or finer when a fractional ratio needs more pieces. */
static int64_t grid_size(int64_t n, int64_t sgs, double ratio) {
    if (sgs <= 0 || sgs > n) sgs = n;
    if (ratio > 0 && ratio < 1 && (n + sgs - 1) / sgs < TWIN_FLOW_MIN_SUBGROUPS) {
        sgs = (n + TWIN_FLOW_MIN_SUBGROUPS - 1) / TWIN_FLOW_MIN_SUBGROUPS;
        sgs = (sgs + 63) / 64 * 64;
    }
    return sgs;
}

/* Number of sub-groups, and (when out != NULL) their ranges in flat order. */
static int64_t cut_all(const zoff_placement_input *in, int64_t sgs, zoff_subgroup_place *out) {
    int64_t k = 0, n = in->n;
    int c = 0;
    for (int64_t lo = 0; lo < n;) {
        int64_t hi = (lo / sgs + 1) * sgs; /* next grid line */
        if (hi > n) hi = n;
        while (c < in->ncuts && in->cuts[c] <= lo) c++;
        if (c < in->ncuts && in->cuts[c] < hi) hi = in->cuts[c];
        if (out) out[k] = (zoff_subgroup_place){.offset = lo, .count = hi - lo};
        k++;
        lo = hi;
    }
    return k;
}

zoff_status zoff_placement_build(const zoff_placement_input *in, zoff_placement *out) {
    *out = (zoff_placement){0};
    if (in->n <= 0 || !(in->ratio >= 0.0 && in->ratio <= 1.0))
        return zoff_error(ZOFF_ERR_INVALID, "zoff_placement_build: %lld parameters, host ratio %g",
                          (long long)in->n, in->ratio);
    for (int i = 1; i < in->ncuts; i++)
        if (in->cuts[i] <= in->cuts[i - 1])
            return zoff_error(ZOFF_ERR_INVALID, "zoff_placement_build: layer cuts are not increasing at %d", i);
    int64_t sgs = grid_size(in->n, in->sub_group_size, in->ratio);
    int64_t nsg = cut_all(in, sgs, NULL);
    if (nsg > INT32_MAX) return zoff_error(ZOFF_ERR_INVALID, "%lld sub-groups: raise sub_group_size", (long long)nsg);
    out->sg = calloc((size_t)nsg, sizeof *out->sg);
    if (!out->sg) return zoff_error(ZOFF_ERR_NOMEM, "out of host memory for %lld sub-groups", (long long)nsg);
    cut_all(in, sgs, out->sg);
    out->nsg = (int)nsg;
    out->grid = sgs;
    /* host: whole sub-groups from the top (backward finishes them first) until >= ratio * n */
    int64_t want = (int64_t)ceil(in->ratio * (double)in->n);
    for (int64_t i = nsg - 1; i >= 0 && out->host < want; i--) {
        out->sg[i].on_host = true;
        out->host += out->sg[i].count;
        out->host_groups++;
        if (out->sg[i].count > out->largest_host) out->largest_host = out->sg[i].count;
    }
    out->device = in->n - out->host;
    return ZOFF_OK;
}

void zoff_placement_free(zoff_placement *p) {
    if (!p) return;
    free(p->sg);
    *p = (zoff_placement){0};
}

void zoff_placement_auto_ratio(size_t budget, size_t in_use, size_t engine_fixed, size_t grad_per_param, int64_t n,
                               zoff_dtype dtype, zoff_auto_ratio *out) {
    *out = (zoff_auto_ratio){.budget = budget, .in_use = in_use, .fits = true};
    if (budget == 0) return; /* no budget: everything fits on the device, ratio 0 */
    out->margin = (size_t)((double)budget * AUTO_MARGIN_FRACTION);
    size_t used = in_use + engine_fixed; /* + the statistics (and the gradient buckets) */
    if (used + out->margin >= budget) {
        out->fits = false;
        out->ratio = 1.0;
        return;
    }
    out->free_bytes = budget - used - out->margin;
    out->per_param = sizeof(float) * (dtype == ZOFF_F32 ? 2 : 3) + grad_per_param; /* (master,) m, v (, gradient) */
    out->max_device = (int64_t)(out->free_bytes / out->per_param);
    int64_t host = n - out->max_device;
    if (host < 0) host = 0;
    out->ratio = (double)host / (double)n;
}

void zoff_placement_host_buffers(const zoff_host_buffers_in *in, zoff_host_buffers *out) {
    *out = (zoff_host_buffers){.grad_buffers = in->delayed ? 2 : 1};
    if (in->n_host <= 0) {
        out->grad_buffers = 0;
        return;
    }
    const size_t n = (size_t)in->n_host, es = zoff_dtype_size(in->dtype);
    const bool param_nvme = in->stage >= 3 && in->param_offload == ZOFF_OFFLOAD_NVME;
    const bool param_cpu = in->stage >= 3 && in->param_offload == ZOFF_OFFLOAD_CPU;
    out->state = in->nvme ? 0 : n * zoff_placement_state_bytes_per_param(in->state_arrays, in->state_dt);
    out->grad_buffer = n * es;
    if (param_nvme) out->staging = 0;                            /* straight to the parameter swap file */
    else if (in->dtype == ZOFF_F32) out->staging = in->nvme ? n * es : 0; /* fp32: the master, or staged */
    else if (in->speculate && param_cpu) out->staging = 2 * n * es; /* + the speculative weights, kept apart */
    else if (in->speculate || param_cpu) out->staging = n * es;  /* gradients or weights outlive the update */
    else out->weights_in_grads = true;
    out->total = out->state + (size_t)out->grad_buffers * out->grad_buffer + out->staging;
    /* fp32 weights and the master in host memory: pushed from it (or, offload_param cpu, the
     * partition the gathers read); offload_param nvme writes the swap file from it (CPU) */
    out->master_dma = in->dtype == ZOFF_F32 && !in->nvme && !param_nvme;
    if (in->pin)
        out->pinned = (size_t)out->grad_buffers * out->grad_buffer + out->staging + (out->master_dma ? n * sizeof(float) : 0);
    out->pageable = out->total - out->pinned;
}

bool zoff_placement_grad_rows(bool speculate, int world, int stage) { return speculate && world == 1 && stage < 3; }

bool zoff_placement_grad_buckets_for(zoff_grad_buckets_mode mode, int stage, zoff_offload_device optimizer,
                                     int64_t accumulation) {
    /* cpu or nvme (a bucket's copy goes to whichever host sub-groups its group meets);
     * accumulation: the micro-batches' sum goes through the host ("always" only: 2 + 2 bytes
     * per host parameter over the bus per later micro-batch, where the full buffer costs none;
     * with several ranks every micro-batch is reduced over the ranks, the host keeps this
     * rank's host pieces of the sum and the compact buffer its device pieces); several ranks:
     * each group's bucket is reduced over the ranks, this rank's host pieces of it go to the
     * host and its device pieces to a compact buffer (zoff_grad_device_in.spread) */
    return zoff_placement_grad_buckets_why_not(mode, stage, optimizer, accumulation) == NULL;
}

const char *zoff_placement_grad_buckets_why_not(zoff_grad_buckets_mode mode, int stage, zoff_offload_device optimizer,
                                                int64_t accumulation) {
    if (mode == ZOFF_GRAD_BUCKETS_OFF) return "zero_optimization.zoff_grad_buckets is false";
    if (!(stage == 1 || stage == 2)) return "gradient buckets are for zero_optimization.stage 1 and 2";
    if (optimizer != ZOFF_OFFLOAD_CPU && optimizer != ZOFF_OFFLOAD_NVME)
        return "gradient buckets need offload_optimizer.device \"cpu\" or \"nvme\"";
    if (accumulation > 1 && mode != ZOFF_GRAD_BUCKETS_ALWAYS)
        return "gradient_accumulation_steps > 1 keeps its sum there, without bus transfers; "
               "zero_optimization.zoff_grad_buckets \"always\" keeps the sum on the host and frees the buffer";
    return NULL;
}

bool zoff_placement_grad_buckets(const zoff_config *cfg) { return zoff_placement_grad_buckets_why(cfg) == NULL; }

const char *zoff_placement_grad_buckets_why(const zoff_config *cfg) {
    const zoff_zero_config *z = &cfg->zero;
    zoff_offload_device d = z->offload_optimizer.device;
    if (z->cpu_offload && d == ZOFF_OFFLOAD_NONE) d = ZOFF_OFFLOAD_CPU;
    return zoff_placement_grad_buckets_why_not(z->grad_buckets, z->stage, d, cfg->gradient_accumulation_steps);
}

void zoff_placement_grad_device(const zoff_grad_device_in *in, zoff_grad_device *out) {
    if (in->spread) { /* every group in a bucket; the device's pieces copied out, unless flat */
        zoff_grad_device_in all = *in;
        all.spread = false;
        all.device = 0;
        zoff_placement_grad_device(&all, out);
        out->compact = out->flat && !in->accumulate ? 0 : in->device;
        out->bytes += (size_t)out->compact * zoff_dtype_size(in->dtype);
        return;
    }
    *out = (zoff_grad_device){.device = in->device};
    int64_t off = 0, biggest = 0;
    int64_t later_host = 0; /* host groups after the first */
    for (int g = 0; g < in->ngroups; g++) { /* a group the split cuts (fine Twin-Flow grid): all on the device */
        if (off < in->device && off + in->group_count[g] > in->device) out->device = off + in->group_count[g];
        off += in->group_count[g];
    }
    off = 0;
    for (int g = 0; g < in->ngroups; g++) {
        bool host = off >= out->device;
        if (g == 0 && host) out->held = in->group_count[0];
        if (g > 0 && host) {
            if (in->group_count[g] > biggest) biggest = in->group_count[g];
            later_host++;
        }
        off += in->group_count[g];
    }
    if (later_host > 0) {
        int64_t k = biggest > 0 ? in->reduce_bucket_size / biggest : 0;
        if (k < 2) k = 2;
        out->nslots = (int)(k < later_host ? k : later_host);
        if (k >= later_host) { /* a bucket for every group: their exact sizes, in flat order */
            out->flat = true;
            out->ring = off - (out->device + out->held);
        } else {
            out->slot = biggest;
            out->ring = k * biggest;
        }
    }
    out->bytes = (size_t)(out->device + out->held + out->ring) * zoff_dtype_size(in->dtype);
}

size_t zoff_placement_stats_bytes(int ngroups) { return 2 * sizeof(float) * (size_t)(ngroups > 1 ? ngroups : 1); }

void zoff_placement_auto_engine_bytes(const zoff_grad_device_in *in, int ngroups, size_t *fixed, size_t *per_param) {
    *fixed = zoff_placement_stats_bytes(ngroups);
    *per_param = 0;
    if (!in) return;
    zoff_grad_device_in all = *in;
    all.device = 0; /* every group on the host: the most the buckets take */
    zoff_grad_device gd;
    zoff_placement_grad_device(&all, &gd);
    *fixed += gd.bytes;
    /* flat: the groups' exact sizes wherever they are, the full buffer's bytes at any ratio (but the compact
     * buffer of several ranks' accumulation) */
    *per_param = gd.flat && !(in->spread && in->accumulate) ? 0 : zoff_dtype_size(in->dtype);
}

size_t zoff_placement_s3_gathered(int64_t first, int64_t mid, int64_t mid_count, int64_t last,
                                  int64_t persistence_threshold, int64_t prefetch_elems, size_t es) {
    int64_t elems = 2 * first + 2 * last + mid; /* weights and one gradient buffer of each size */
    if (mid <= persistence_threshold) {
        elems += mid_count * mid;
    } else {
        int64_t ahead = prefetch_elems > 0 ? prefetch_elems / mid : 0;
        elems += (1 + ahead < mid_count ? 1 + ahead : mid_count) * mid;
    }
    return (size_t)elems * es;
}

size_t zoff_placement_s3_auto_bytes(int64_t part, bool params_on_device, size_t gathered, size_t es) {
    return (size_t)part * es * (params_on_device ? 2 : 1) + gathered;
}

size_t zoff_placement_param_slot_bytes(int64_t count, size_t es) {
    size_t b = (size_t)count * es;
    return (b + ZOFF_AIO_ALIGN - 1) / ZOFF_AIO_ALIGN * ZOFF_AIO_ALIGN;
}

bool zoff_placement_param_padding_exceeds(const zoff_param_swap *sw, size_t es) {
    size_t data = (size_t)sw->file_elems * es;
    return sw->file_bytes - data > data;
}

void zoff_placement_param_swap(const zoff_param_swap_in *in, bool *resident, zoff_param_swap *out) {
    *out = (zoff_param_swap){.largest_group = -1};
    const int64_t *rc = in->run_count;
    for (int g = 0; g < in->ngroups; g++) {
        int64_t elems = 0;
        size_t bytes = 0;
        for (int k = 0; k < in->group_runs[g]; k++, rc++) {
            elems += *rc;
            bytes += zoff_placement_param_slot_bytes(*rc, in->es);
        }
        bool res = false;
        if (elems > 0 && out->resident_elems + elems <= in->max_in_cpu) { /* whole groups, in order, while they fit */
            res = true;
            out->resident_elems += elems;
            out->resident_bytes += bytes;
        } else if (elems > 0) {
            out->ondisk++;
            out->file_bytes += bytes;
            out->file_elems += elems;
            out->file_slots += in->group_runs[g];
            if (bytes > out->buffer_bytes) out->buffer_bytes = bytes;
            if (elems > out->largest_elems) out->largest_elems = elems, out->largest_group = g;
        }
        if (resident) resident[g] = res;
    }
}
