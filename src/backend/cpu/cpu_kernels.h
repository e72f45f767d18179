/* CPU backend kernels: the math of every zoff_op, run synchronously on the
 * calling thread (the CPU backend calls this from a stream's thread).
 * Internal to src/backend/cpu. */
#ifndef ZOFF_CPU_KERNELS_H
#define ZOFF_CPU_KERNELS_H

#include "zoff/device.h"

/* Run op with its args struct (see include/zoff/device.h) using up to
 * `threads` OpenMP threads (0 = all). Returns ZOFF_ERR_INVALID (with message)
 * for data errors found while running (e.g. token id out of range),
 * ZOFF_ERR_UNSUPPORTED for a dtype combination not implemented. */
zoff_status zoff_cpu_run_op(zoff_op op, const void *args, int threads);

#endif
