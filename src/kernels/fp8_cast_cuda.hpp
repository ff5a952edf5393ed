#pragma once
// Private to src/kernels/: the CUDA kernels (fp8_cast_cuda.cpp) that fp8_amax_block and
// fp8_cast_block (kernels/fp8_cast.hpp, same contracts) run on a Kokkos::Cuda execution space
// for float and bf16 blocks; the Kokkos kernels of fp8_cast.cpp stay the path for every other
// case and on every other backend.
#include <cstdint>
#include <type_traits>

#include "meshtrain/core/fp8.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)

template <class T>
inline constexpr bool kCudaCastType =
    std::is_same_v<ExecSpace, Kokkos::Cuda> &&
    (std::is_same_v<T, float> || std::is_same_v<T, Kokkos::Experimental::bhalf_t>);

// Each returns false, launching nothing, where the block does not suit the kernels: rows move
// as 16-byte vectors, so cols and ld must be multiples of 16 / sizeof(T) and x 16-byte aligned;
// q must be aligned to that many bytes; a cast with qt needs rows and cols multiples of 64 and
// qt 8-byte aligned. Shapes and extents are the caller's to check. A call that runs pushes the
// Kokkos Tools region "meshtrain::fp8_<op>_cuda".
template <class T>
bool fp8_amax_block_cuda(const ExecSpace& exec, View1<float> amax, const T* x, int rows,
                         int cols, int ld);
// The scale a cast multiplies by: *scale as given (amax null), or made from *amax as
// fp8_scales makes it, then written to *scale_out and *scale_inv_out by the cast's first thread
// (the GEMM after it reads scale_inv), so that no launch of its own makes it.
struct CastScale {
  const float* scale = nullptr;
  const float* amax = nullptr;
  float* scale_out = nullptr;
  float* scale_inv_out = nullptr;
};
template <class T>
bool fp8_cast_block_cuda(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                         const T* x, int rows, int cols, int ld, const CastScale& scale,
                         Fp8Format format);

#endif  // KOKKOS_ENABLE_CUDA

}  // namespace meshtrain::kernels::detail
