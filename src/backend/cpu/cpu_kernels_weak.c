/* TEMPORARY: a weak zoff_cpu_run_op so the library links while cpu_kernels.c
 * is being written. The real definition overrides it; delete this file once
 * cpu_kernels.c is in the tree. */
#include "backend/cpu/cpu_kernels.h"

__attribute__((weak)) zoff_status zoff_cpu_run_op(zoff_op op, const void *args, int threads) {
    (void)args;
    (void)threads;
    return zoff_error(ZOFF_ERR_UNSUPPORTED, "CPU kernel %s is not built yet (cpu_kernels.c missing)", zoff_op_name(op));
}
