/* CPU feature detection (x86 cpuid + xgetbv; NEON on aarch64). */
#include "zoff/core.h"

#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
static uint64_t xgetbv0(void) {
    uint32_t a, d;
    __asm__ volatile("xgetbv" : "=a"(a), "=d"(d) : "c"(0));
    return ((uint64_t)d << 32) | a;
}
#endif

static zoff_cpu_features g_feat;
static int g_feat_init;

static void detect(zoff_cpu_features *f) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    f->logical_cores = n > 0 ? (int)n : 1;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    bool osxsave = (c >> 27) & 1;
    uint64_t xcr0 = osxsave ? xgetbv0() : 0;
    bool ymm = (xcr0 & 0x6) == 0x6, zmm = (xcr0 & 0xe6) == 0xe6;
    f->fma = ymm && ((c >> 12) & 1);
    f->f16c = ymm && ((c >> 29) & 1);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->avx2 = ymm && ((b >> 5) & 1);
        f->avx512f = zmm && ((b >> 16) & 1);
        f->avx512dq = zmm && ((b >> 17) & 1);
        f->avx512bw = zmm && ((b >> 30) & 1);
        f->avx512vl = zmm && ((b >> 31) & 1);
        f->avx512_fp16 = zmm && ((d >> 23) & 1);
        unsigned a1, b1, c1, d1;
        if (__get_cpuid_count(7, 1, &a1, &b1, &c1, &d1)) f->avx512_bf16 = zmm && ((a1 >> 5) & 1);
    }
#elif defined(__aarch64__)
    f->neon = true;
#endif
}

const zoff_cpu_features *zoff_cpu_features_get(void) {
    if (!__atomic_load_n(&g_feat_init, __ATOMIC_ACQUIRE)) {
        zoff_cpu_features f = {0};
        detect(&f);
        g_feat = f;
        __atomic_store_n(&g_feat_init, 1, __ATOMIC_RELEASE);
    }
    return &g_feat;
}
