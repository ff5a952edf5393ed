#pragma once
// Private to src/kernels/: a stream-ordered radix sort of 64-bit keys on CUDA (sort_keys_cuda.cpp)
// for the embedding backward, in place of Kokkos::sort. That one went through Thrust, which
// allocates and frees its temporary storage on every call: cudaMalloc / cudaFree, each a wait
// for the whole device. On the H100 the step's GPU sat idle 0.4 ms (bf16) to 0.7 ms (fp8) a
// step around that sort at the Llama-8B shape (2026-12-06 trace). Here the storage is the
// caller's, sized once, and nothing waits.
#include <cstddef>
#include <cstdint>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)

// Bytes of temporary storage sort_keys_cuda needs for n keys sorted on bits [0, end_bit).
std::size_t sort_keys_cuda_temp_bytes(int n, int end_bit);

// out = in sorted ascending by bits [0, end_bit) of each key (the bits above must be equal in
// every key: then the order is the full keys'). temp: sort_keys_cuda_temp_bytes(n, end_bit)
// bytes at any address (CUB aligns inside them). in and out must not overlap; in is unchanged.
void sort_keys_cuda(const ExecSpace& exec, const std::uint64_t* in, std::uint64_t* out, int n,
                    int end_bit, void* temp, std::size_t temp_bytes);

#endif  // KOKKOS_ENABLE_CUDA

}  // namespace meshtrain::kernels::detail
