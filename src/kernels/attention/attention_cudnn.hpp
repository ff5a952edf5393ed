#pragma once
// Private to src/kernels/: cuDNN's fused flash attention, which attention_forward/backward
// (attention_cudnn.cpp) and attention_block_forward/backward (attention_block_cudnn.cpp) try
// first on a CUDA device. Same contracts as meshtrain/kernels/attention/attention.hpp and
// attention_block.hpp; extents are checked by the callers and NKV (>= 1) divides NH.
#include <cstdint>

#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/attention/attention_block.hpp"

namespace meshtrain::kernels::detail {

// Counts a block that cuDNN ran (cudnn_attention_block_calls()).
void count_cudnn_attention_block_call();

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)

// All return false, launching nothing, when the call is not cuDNN's to run: --attn.impl
// meshtrain, libcudnn.so.9 not loadable (automatic only; cudnn makes it an error), an element
// type other than bf16/fp16 (for the blocks: an accumulation type other than float), HS not in
// {64, 128}, a pointer not 16-byte aligned, or no cuDNN engine for the shape (automatic only,
// after one warning). The caller then runs our kernels.
template <class T>
bool attention_forward_cudnn(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV);
template <class T>
bool attention_backward_cudnn(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV);

template <class T, class A>
bool attention_block_forward_cudnn(const ExecSpace& exec, const AttentionBlockShape& s,
                                   View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                                   View1<const T> v, RowSlice vs, View1<A> out, RowSlice os,
                                   View1<A> lse, StatSlice ls);
template <class T, class A>
bool attention_block_backward_cudnn(const ExecSpace& exec, const AttentionBlockShape& s,
                                    View1<const T> q, RowSlice qs, View1<const T> k, RowSlice ks,
                                    View1<const T> v, RowSlice vs, View1<const T> dout,
                                    RowSlice dos, View1<const T> out, RowSlice outs,
                                    View1<const A> lse, StatSlice ls, View1<A> dq, RowSlice dqs,
                                    View1<A> dk, RowSlice dks, View1<A> dv, RowSlice dvs);

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
template <class T, class A>
bool attention_block_forward_cudnn(const ExecSpace&, const AttentionBlockShape&, View1<const T>,
                                   RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice,
                                   View1<A>, RowSlice, View1<A>, StatSlice) {
  return false;
}
template <class T, class A>
bool attention_block_backward_cudnn(const ExecSpace&, const AttentionBlockShape&, View1<const T>,
                                    RowSlice, View1<const T>, RowSlice, View1<const T>, RowSlice,
                                    View1<const T>, RowSlice, View1<const T>, RowSlice,
                                    View1<const A>, StatSlice, View1<A>, RowSlice, View1<A>,
                                    RowSlice, View1<A>, RowSlice) {
  return false;
}

#endif

}  // namespace meshtrain::kernels::detail
