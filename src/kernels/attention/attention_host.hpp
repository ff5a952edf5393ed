#pragma once
// Private to src/kernels/: the host-memory path of attention (attention_host.cpp), which
// attention_forward/backward dispatch to when the default execution space runs on the host.
// Views must be host-accessible; extents are checked by the callers, NKV is >= 1 and divides NH.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

template <class T>
void attention_forward_host(const ExecSpace& exec, View1<T> out, View1<float> lse,
                            View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV);
template <class T>
void attention_backward_host(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                             View1<const T> qkv, View1<const T> out, View1<const float> lse,
                             int B, int Tlen, int NH, int HS, int NKV);

}  // namespace meshtrain::kernels::detail
