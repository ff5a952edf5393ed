#pragma once
// Private to src/kernels/: dbias[n] += sum_{k < K} B[k * ldb + n] on CUDA (column_sums_cuda.cpp),
// fp32 accumulation in a fixed order. Returns false, launching nothing, unless T is float or
// bf16, N and ldb are multiples of 16 / sizeof(T) and B is 16-byte aligned; the caller then
// sums another way. Pushes the Kokkos Tools region "meshtrain::column_sums_cuda".
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)
// Whether column_sums_add_cuda takes these operands (it returns false exactly when not).
template <class T>
bool column_sums_cuda_fits(int N, int ldb, const T* B);

// The launches go to `stream` when given, else to exec's stream.
template <class T>
bool column_sums_add_cuda(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias,
                          cudaStream_t stream = nullptr);

// A second stream of the current device, for memory-bound work that can run while a GEMM on
// exec's stream leaves SMs free (gemm_dbias' split form: the column sums of B beside the
// weight-gradient GEMM that reads the same B). Created on first use (high priority, so its
// blocks take SMs as the GEMM's free up), destroyed at Kokkos::finalize. One host thread per
// device drives it, as every other kernel of this library.
class SideStream {
 public:
  // Marks exec's work queued so far; the side stream's next work waits for it.
  static SideStream& fork(const ExecSpace& exec);
  cudaStream_t stream() const { return stream_; }
  // exec's stream waits for everything queued on the side stream.
  void join(const ExecSpace& exec);

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t forked_ = nullptr, done_ = nullptr;
  friend struct SideStreams;
};
#endif

}  // namespace meshtrain::kernels::detail
