// Emulator stand-in for CUB's DeviceRadixSort::SortPairs (see ../../../run.sh): a stable sort of
// (key, value) pairs by the key bits [begin_bit, end_bit), like CUB's LSD radix sort.
#pragma once
#include <algorithm>
#include <numeric>
#include <vector>

#include "../../../emu_runtime.h"

namespace cub {
struct DeviceRadixSort {
    template <class K, class V, class N>
    static cudaError_t SortPairs(void *temp, size_t &temp_bytes, const K *keys_in, K *keys_out, const V *vals_in,
                                 V *vals_out, N num_items, int begin_bit, int end_bit, cudaStream_t stream) {
        (void)stream;
        if (!temp) {
            temp_bytes = 4096; // a nonzero size, like CUB
            return cudaSuccess;
        }
        if (begin_bit < 0 || end_bit > (int)(8 * sizeof(K)) || begin_bit >= end_bit) return cudaErrorInvalidValue;
        const unsigned long long mask =
            (end_bit - begin_bit >= 64 ? ~0ull : ((1ull << (end_bit - begin_bit)) - 1)) << begin_bit;
        std::vector<long long> idx((size_t)num_items);
        std::iota(idx.begin(), idx.end(), 0LL);
        std::stable_sort(idx.begin(), idx.end(), [&](long long a, long long b) {
            return ((unsigned long long)keys_in[a] & mask) < ((unsigned long long)keys_in[b] & mask);
        });
        std::vector<K> k2((size_t)num_items);
        std::vector<V> v2((size_t)num_items);
        for (size_t i = 0; i < idx.size(); i++) {
            k2[i] = keys_in[idx[i]];
            v2[i] = vals_in[idx[i]];
        }
        std::copy(k2.begin(), k2.end(), keys_out);
        std::copy(v2.begin(), v2.end(), vals_out);
        return cudaSuccess;
    }
};
} // namespace cub
