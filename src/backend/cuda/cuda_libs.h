/* Private to src/backend/cuda: cuBLASLt, opened when the first CUDA device needs it.
 *
 * zoff does not link libcublasLt: a process that never makes a CUDA device (zoff plan, tokenize,
 * export, a CPU-backend run, a test) would map, relocate and initialise its 540 MB at start for
 * nothing (measured: 0.08-0.5 s and 210 MB resident per process). cuda_matmul.cu resolves the
 * calls it makes (LT(name)) with dlopen/dlsym instead, once, from zoff_cuda_matmul_init. The
 * library is looked for by its soname, libcublasLt.so.<major of the cublasLt.h zoff was built
 * with> (LD_LIBRARY_PATH, the loader's cache), then in the folder it was found in at build time
 * (ZOFF_CUBLASLT_DIR). Under the CUDA emulator (tests/cuda_emu) the calls are the emulator's. */
#ifndef ZOFF_CUDA_LIBS_H
#define ZOFF_CUDA_LIBS_H

#include <stddef.h>

#include "zoff/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Open cuBLASLt and resolve every call (thread-safe; the first call does the work, later
 * ones return its result). On failure ZOFF_ERR_DEVICE saying what was missing and what to do. */
zoff_status zoff_cuda_blaslt_open(void);
/* cublasLtGetVersion() of the opened library (e.g. 130100), 0 before it opened. */
size_t zoff_cuda_blaslt_version(void);

#ifdef __cplusplus
}
#endif

#endif
