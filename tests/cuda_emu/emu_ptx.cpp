// Models of the warp-level PTX instructions the tensor-core kernels use, written from
// NVIDIA's PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "ldmatrix", "cp.async", "cp.async.commit_group", "cp.async.wait_group"), not from the
// kernels. tests/cuda_emu/emu_ptx_check.cpp checks them against a scalar reference.
//
// Notation of the ISA: groupID = laneid >> 2, threadID_in_group = laneid % 4.
// A 32-bit register holding two 16-bit elements keeps the lower-indexed one in its low half.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "emu_device.hpp"

[[noreturn]] static void ptx_fatal(const char *what) {
    fprintf(stderr, "cuda emulator: %s\n", what);
    abort();
}

static float bf16_to_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }
static float elem(uint32_t reg, int half, bool bf16) {
    const uint16_t h = (uint16_t)(half ? reg >> 16 : reg & 0xffffu);
    return bf16 ? bf16_to_f32(h) : __half2float(__ushort_as_half(h));
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32
//
// A (16x16, .row), four .b32 registers a0..a3 holding elements a_0..a_7 (two each):
//   row = groupID      for a_i, 0 <= i < 2 or 4 <= i < 6;  groupID + 8 otherwise
//   col = threadID_in_group * 2 + (i & 1)  for i < 4;  ... + 8  for i >= 4
// B (16x8, .col), two .b32 registers holding b_0..b_3:
//   row = threadID_in_group * 2 + (i & 1)  for i < 2;  ... + 8  for i >= 2
//   col = groupID
// C, D (16x8, f32), c_0..c_3:
//   row = groupID for i < 2, groupID + 8 otherwise;  col = threadID_in_group * 2 + (i & 1)
struct mma_lane {
    uint32_t a[4], b[2];
    float c[4];
};

void emu_mma_m16n8k16_f32(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4], bool bf16) {
    mma_lane mine, all[32];
    memcpy(mine.a, a, sizeof mine.a);
    memcpy(mine.b, b, sizeof mine.b);
    memcpy(mine.c, c, sizeof mine.c);
    emu_warp_allgather(&mine, all, sizeof mine);
    float A[16][16], B[16][8], C[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, t = lane % 4;
        for (int i = 0; i < 8; i++) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = t * 2 + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = elem(all[lane].a[i / 2], i & 1, bf16);
        }
        for (int i = 0; i < 4; i++) {
            const int row = t * 2 + (i & 1) + (i >= 2 ? 8 : 0);
            B[row][g] = elem(all[lane].b[i / 2], i & 1, bf16);
        }
        for (int i = 0; i < 4; i++) C[i < 2 ? g : g + 8][t * 2 + (i & 1)] = all[lane].c[i];
    }
    // products of 16-bit floats are exact in double; one rounding of the sum to f32
    const int lane = emu_thread_linear() % 32, g = lane >> 2, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = i < 2 ? g : g + 8, col = t * 2 + (i & 1);
        double s = C[row][col];
        for (int k = 0; k < 16; k++) s += (double)A[row][k] * (double)B[k][col];
        d[i] = (float)s;
    }
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16
//
// Each of num 8x8 matrices of 16-bit elements is given by 8 row addresses (16 bytes a row,
// 16-byte aligned): threads 8*m .. 8*m+7 hold the rows of matrix m (x1: threads 0-7, x2:
// 0-15, x4: all; the other threads' addresses are not used). Destination register m of
// thread lane holds, of matrix m, row lane/4, columns 2*(lane%4) and +1 (low half first);
// with .trans the matrix is transposed first: elements (2*(lane%4), lane/4) and
// (2*(lane%4)+1, lane/4) of the stored rows.
void emu_ldmatrix(uint32_t *r, int num, bool trans, const void *row) {
    if (num != 1 && num != 2 && num != 4) ptx_fatal("ldmatrix: .num must be x1, x2 or x4");
    const void *rows[32];
    emu_warp_allgather(&row, rows, sizeof row);
    const int lane = emu_thread_linear() % 32;
    for (int m = 0; m < num; m++) {
        for (int k = 0; k < 8; k++)
            if ((uintptr_t)rows[8 * m + k] % 16 != 0) ptx_fatal("ldmatrix: a row address is not 16-byte aligned");
        uint16_t e[2];
        for (int j = 0; j < 2; j++) {
            const int rr = trans ? 2 * (lane % 4) + j : lane / 4, cc = trans ? lane / 4 : 2 * (lane % 4) + j;
            memcpy(&e[j], (const unsigned char *)rows[8 * m + rr] + 2 * cc, 2);
        }
        r[m] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
    }
}

// ---- cp.async, cp.async.commit_group, cp.async.wait_group
//
// cp.async copies cp_size bytes (4, 8 or 16; dst and src aligned to it) from global to shared
// memory asynchronously: src_size bytes are read, the rest of the destination is zero-filled.
// commit_group puts the thread's uncommitted cp.async operations in a new group; wait_group n
// waits until at most the n most recent groups are pending. The model performs the copies at
// the wait (so a read of the destination before it sees the old bytes, as on a GPU where the
// copy has not landed yet); copies of a block left unwaited when the thread's next block starts
// are an error.
namespace {
struct cp_op {
    void *dst;
    const void *src;
    int cp_size, src_size;
};
struct cp_state {
    unsigned long long serial = 0;
    std::vector<cp_op> uncommitted;
    std::vector<std::vector<cp_op>> groups; // oldest first
};
cp_state g_cp[1024];

cp_state &cp_of_thread() {
    cp_state &s = g_cp[emu_thread_linear()];
    if (s.serial != emu_block_serial()) {
        if (!s.groups.empty()) ptx_fatal("cp.async: a thread ended with committed groups it never waited for");
        s.uncommitted.clear();
        s.serial = emu_block_serial();
    }
    return s;
}
void perform(const std::vector<cp_op> &ops) {
    for (const cp_op &o : ops) {
        memcpy(o.dst, o.src, (size_t)o.src_size);
        memset((unsigned char *)o.dst + o.src_size, 0, (size_t)(o.cp_size - o.src_size));
    }
}
} // namespace

void emu_cp_async(void *dst, const void *src, int cp_size, int src_size) {
    if (cp_size != 4 && cp_size != 8 && cp_size != 16) ptx_fatal("cp.async: cp-size must be 4, 8 or 16");
    if (src_size < 0 || src_size > cp_size) ptx_fatal("cp.async: src-size must be in [0, cp-size]");
    if ((uintptr_t)dst % (uintptr_t)cp_size || (src_size > 0 && (uintptr_t)src % (uintptr_t)cp_size))
        ptx_fatal("cp.async: an address is not aligned to cp-size");
    if (src_size > 0 && !emu_device_range(src, (size_t)src_size))
        ptx_fatal("cp.async: the source is not inside one device allocation");
    cp_of_thread().uncommitted.push_back(cp_op{dst, src, cp_size, src_size});
}

void emu_cp_async_commit() {
    cp_state &s = cp_of_thread();
    s.groups.push_back(std::move(s.uncommitted));
    s.uncommitted.clear();
}

void emu_cp_async_wait(int n) {
    if (n < 0) ptx_fatal("cp.async.wait_group: n must be >= 0");
    cp_state &s = cp_of_thread();
    while ((int)s.groups.size() > n) {
        perform(s.groups.front());
        s.groups.erase(s.groups.begin());
    }
}
