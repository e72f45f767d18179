/* Emulator stand-in for <cuda_runtime.h> (see ../run.sh). */
#include "../emu_runtime.h"
#ifdef __cplusplus
#include "../emu_device.hpp"
#endif
