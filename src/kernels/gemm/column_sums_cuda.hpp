#pragma once
// Private to src/kernels/: dbias[n] += sum_{k < K} B[k * ldb + n] on CUDA (column_sums_cuda.cpp),
// fp32 accumulation in a fixed order. Returns false, launching nothing, unless T is float or
// bf16, N and ldb are multiples of 16 / sizeof(T) and B is 16-byte aligned; the caller then
// sums another way. Pushes the Kokkos Tools region "meshtrain::column_sums_cuda".
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)
template <class T>
bool column_sums_add_cuda(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias);
#endif

}  // namespace meshtrain::kernels::detail
