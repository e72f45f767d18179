/* Emulator stand-in for <cuda_runtime_api.h> (see ../run.sh). */
#include "../emu_runtime.h"
