/* Emulator stand-in for <cuda_fp16.h> (see ../run.sh): __half and its conversions live in emu_device.hpp. */
#include "../emu_device.hpp"
