/* Internal to src/optim: the kernel argument block shared by the dispatcher
 * (cpu_adam.c) and the SIMD kernel files (cpu_adam_{scalar,avx2,avx512,neon}.c). */
#ifndef ZOFF_CPU_OPTIM_INTERNAL_H
#define ZOFF_CPU_OPTIM_INTERNAL_H

#include <stdint.h>

/* kernel kinds */
enum { ZO_KIND_ADAM = 0, ZO_KIND_ADAGRAD = 1, ZO_KIND_LION = 2, ZO_KIND_PROBE = 3, ZO_KIND_COUNT };
/* element types inside the kernels (ZO_NONE: no params16) */
enum { ZO_F32 = 0, ZO_BF16 = 1, ZO_F16 = 2, ZO_NONE = 3 };
/* Adam weight decay */
enum { ZO_DECAY_NONE = 0, ZO_DECAY_L2 = 1, ZO_DECAY_DECOUPLED = 2 };

/* Everything one update needs; hyperparameters already rounded to fp32.
 * Meaning per kind (all fp32):
 *   Adam:    g = grad * gscale; [L2: g = fma(p, decay, g)]
 *            m = fma(g, omb1, m * b1); v = fma(g * g, omb2, v * b2)
 *            denom = fma(sqrt(v), bc2inv, eps); u = m / denom
 *            [decoupled: p = fma(p, decay, p)]  (decay = -lr * wd)
 *            p = fma(u, step, p)                 (step = -lr / bc1)
 *   Adagrad: g = grad * gscale; [L2: g = fma(p, decay, g)]; v = fma(g, g, v)
 *            u = g / (sqrt(v) + eps); p = fma(u, step, p)   (step = -lr; as torch's and
 *            DeepSpeed's CPU Adagrad, the decayed g in both the sum and the update)
 *   Lion:    g = grad * gscale; c = fma(g, omb1, m * b1)
 *            t = -copysign(lr, c) + (c - c)      (the second term propagates NaN)
 *            p = [fma(p, decay, t) | p + t]      (decay = 1 - lr * wd)
 *            m = fma(g, omb2, m * b2)
 *   Probe:   p = fma(g, gscale, p); m = m * b1; v = v * b1 (called with gscale = 0,
 *            b1 = 1: values unchanged); params16 = p. */
typedef struct zoff_optim_kargs {
    float *p;
    void *m, *v;       /* state; NULL when the kind does not use it */
    const void *g;
    void *p16;         /* NULL when pd == ZO_NONE */
    int64_t n;
    uint32_t idx0;     /* (uint32) global index of element 0 */
    uint32_t seed;     /* stochastic-rounding seed for this step (0 unused) */
    int decay_mode;    /* ZO_DECAY_* (Adagrad/Lion: NONE or non-NONE) */
    int sround;        /* bf16 state: 1 = stochastic rounding, 0 = nearest even */
    float gscale, b1, omb1, b2, omb2, eps, bc2inv, step, decay, lr;
    /* init_state only: v's initial value, whether p's pages are touched */
    float v_init;
    int touch_p;
    /* the backup (zoff_optim_backup; dispatcher only, the kernels never see it) */
    int bk_dir;        /* 0 none, 1 save, 2 restore */
    int ssize;         /* bytes per m / v element */
    float *pb;
    void *mb, *vb;
    /* zoff_optim_tensors' before_write hook (dispatcher only) */
    void (*before_write)(void *ctx, int64_t lo, int64_t hi);
    void *before_write_ctx;
} zoff_optim_kargs;

/* Processes elements [lo, hi) of the range described by a. */
typedef void (*zoff_optim_range_fn)(const zoff_optim_kargs *a, int64_t lo, int64_t hi);

/* Per path: the function for (kind, grad dtype, state dtype, params16 dtype). */
zoff_optim_range_fn zoff_optim_select_scalar(int kind, int gd, int sd, int pd);
#if defined(__x86_64__) || defined(__i386__)
zoff_optim_range_fn zoff_optim_select_avx2(int kind, int gd, int sd, int pd);
zoff_optim_range_fn zoff_optim_select_avx512(int kind, int gd, int sd, int pd);
zoff_optim_range_fn zoff_optim_select_avx512bf16(int kind, int gd, int sd, int pd);
#endif
#if defined(__aarch64__)
zoff_optim_range_fn zoff_optim_select_neon(int kind, int gd, int sd, int pd);
#endif

/* Stochastic rounding of bf16 state takes 16 random bits per value from
 *     x = (index * ZO_WEYL + seed) mod 2^32
 * (low half for m, high half for v), where seed is a hash of the step (and a
 * salt). For a given element and step, x is uniform because seed is, so the
 * rounding is unbiased; steps are independent; within a step, neighbouring
 * elements get well-spread (Weyl sequence) offsets. It costs one vector add
 * per vector, where a per-element hash cost two multiplies. */
#define ZO_WEYL 0x9e3779b9u

/* lowbias32: hashes the step number into the seed. */
static inline uint32_t zoff_optim_hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

#endif
