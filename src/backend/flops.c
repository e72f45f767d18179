/* The FLOP conventions of the op profiler and of the model's FLOPs per step (one home; pure
 * functions, no device state, so the parsers' fuzz library links them without the backend). */
#include "zoff/device.h"

double zoff_matmul_flops(int64_t N, int64_t C, int64_t OC) { return 2.0 * (double)N * (double)C * (double)OC; }

double zoff_attention_flops(int64_t B, int64_t T, int64_t C, bool backward) {
    double fwd = 2.0 * (double)B * (double)T * (double)T * (double)C;
    return backward ? 2.5 * fwd : fwd;
}
