#pragma once
// Private to src/kernels/: cuDNN's fused flash attention (attention_cudnn*.cpp), which
// attention_forward/backward try first on a CUDA device. Same contract as
// meshtrain/kernels/attention/attention.hpp; extents are checked by the callers and NKV (>= 1) divides NH.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)

// Both return false, launching nothing, when the call is not cuDNN's to run: --attn.impl
// meshtrain, libcudnn.so.9 not loadable (automatic only; cudnn makes it an error), an element
// type other than bf16/fp16, HS not in {64, 128}, or a pointer not 16-byte aligned. The caller
// then runs our kernels.
template <class T>
bool attention_forward_cudnn(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV);
template <class T>
bool attention_backward_cudnn(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV);

#else

template <class T>
bool attention_forward_cudnn(const ExecSpace&, View1<T>, View1<float>, View1<const T>, int, int,
                             int, int, int) {
  return false;
}
template <class T>
bool attention_backward_cudnn(const ExecSpace&, View1<T>, View1<const T>, View1<const T>,
                              View1<const T>, View1<const float>, int, int, int, int, int) {
  return false;
}

#endif

}  // namespace meshtrain::kernels::detail
