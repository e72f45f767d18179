/* Element types: sizes and names (include/zoff/core.h). */
#include "zoff/core.h"

size_t zoff_dtype_size(zoff_dtype dt) {
    switch (dt) {
    case ZOFF_F32: return 4;
    case ZOFF_BF16: return 2;
    case ZOFF_F16: return 2;
    case ZOFF_I32: return 4;
    case ZOFF_DTYPE_COUNT: break;
    }
    return 0;
}

const char *zoff_dtype_name(zoff_dtype dt) {
    switch (dt) {
    case ZOFF_F32: return "f32";
    case ZOFF_BF16: return "bf16";
    case ZOFF_F16: return "f16";
    case ZOFF_I32: return "i32";
    case ZOFF_DTYPE_COUNT: break;
    }
    return "invalid-dtype";
}
