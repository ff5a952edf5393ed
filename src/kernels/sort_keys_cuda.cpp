// Radix sort of 64-bit keys on the execution space's stream (sort_keys_cuda.hpp), through
// CUB's DeviceRadixSort with caller-owned temporary storage. Empty without CUDA.
#include "sort_keys_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cub/device/device_radix_sort.cuh>

#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/error.hpp"

namespace meshtrain::kernels::detail {

std::size_t sort_keys_cuda_temp_bytes(int n, int end_bit) {
  std::size_t bytes = 0;
  // A size query: no device work, no synchronisation.
  MESHTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(
      nullptr, bytes, static_cast<const std::uint64_t*>(nullptr),
      static_cast<std::uint64_t*>(nullptr), n, 0, end_bit));
  return bytes;
}

void sort_keys_cuda(const ExecSpace& exec, const std::uint64_t* in, std::uint64_t* out, int n,
                    int end_bit, void* temp, std::size_t temp_bytes) {
  MESHTRAIN_CHECK(end_bit > 0 && end_bit <= 64, "sort_keys_cuda: end_bit=", end_bit);
  if (n <= 0) return;
  Kokkos::Profiling::pushRegion("meshtrain::sort_keys_cuda");
  MESHTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, in, out, n, 0, end_bit,
                                                      exec.cuda_stream()));
  Kokkos::Profiling::popRegion();
}

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
