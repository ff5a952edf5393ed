#pragma once
// Private to src/kernels/: CUDA kernels for the row-wise ops, LayerNorm (layernorm_cuda.cpp),
// RMSNorm (rmsnorm_cuda.cpp) and the fused softmax cross-entropy (cross_entropy_cuda.cpp), that
// layernorm_*, rmsnorm_* and cross_entropy_* run on a Kokkos::Cuda execution space. Same
// contracts as meshtrain/kernels/layernorm.hpp, rmsnorm.hpp and cross_entropy.hpp; the Kokkos
// kernels (*_portable) stay the path for every other case and the tests' oracle.
#include <cstdint>
#include <type_traits>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA)

// Element types with CUDA row kernels: float and bf16 (Kokkos' bhalf_t, the same bits as CUDA's
// __nv_bfloat16). Arithmetic is fp32 for both, as in the portable kernels.
template <class T>
inline constexpr bool kCudaRowwiseType =
    std::is_same_v<ExecSpace, Kokkos::Cuda> &&
    (std::is_same_v<T, float> || std::is_same_v<T, Kokkos::Experimental::bhalf_t>);

// Each returns false, launching nothing, when the shape or the buffers do not suit the kernels;
// the caller then runs the portable kernel. Shapes and extents are the caller's to check.
// Rows move as 16-byte vectors (4 floats or 8 bf16), so every path needs the row length to be
// a multiple of 16 / sizeof(T) and the row buffers 16-byte aligned:
//   layernorm_forward_cuda:  C % (16 / sizeof(T)) == 0 (any C; rows in registers up to
//                            C = 256 * 16 / sizeof(T), re-read from L1 beyond).
//   layernorm_backward_cuda: the same, and C <= 8192 (the per-warp dweight/dbias accumulators
//                            live in shared memory).
//   cross_entropy_*_cuda:    Vp % (16 / sizeof(T)) == 0 (any V <= Vp).
// A call that runs the CUDA kernels pushes the Kokkos Tools region "meshtrain::<op>_cuda".
// The forwards' amax is the headers' optional FP8 amax of out (empty: none), zeroed on the
// stream and folded by one atomic max per row (amax_fused.hpp).
template <class T>
bool layernorm_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> mean,
                            View1<float> rstd, View1<const T> inp, View1<const T> weight,
                            View1<const T> bias, int N, int C, float eps, View1<float> amax);
template <class T>
bool layernorm_backward_cuda(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                             View1<T> dbias, View1<const T> dout, View1<const T> inp,
                             View1<const T> weight, View1<const float> mean,
                             View1<const float> rstd, int N, int C);
// rmsnorm_*_cuda: the same rules as layernorm_*_cuda (rmsnorm_cuda.cpp).
template <class T>
bool rmsnorm_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> rstd,
                          View1<const T> inp, View1<const T> weight, int N, int C, float eps,
                          View1<float> amax);
template <class T>
bool rmsnorm_backward_cuda(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                           View1<const T> dout, View1<const T> inp, View1<const T> weight,
                           View1<const float> rstd, int N, int C);
template <class T>
bool cross_entropy_forward_backward_cuda(const ExecSpace& exec, View1<float> losses,
                                         View1<T> logits, View1<const std::int32_t> targets,
                                         int N, int Vp, int V, float grad_scale);
template <class T>
bool cross_entropy_forward_cuda(const ExecSpace& exec, View1<float> losses,
                                View1<const T> logits, View1<const std::int32_t> targets, int N,
                                int Vp, int V);

#endif  // KOKKOS_ENABLE_CUDA

}  // namespace meshtrain::kernels::detail
