// Causal self-attention through cuDNN's fused flash attention (attention_cudnn.hpp): the
// SDPA graphs of cudnn_sdpa.hpp over the packed buffers, as one causal square block.
//
// Layout: Q, K, V are read in place from the packed qkv buffer [B, T, (NH + 2 NKV) HS] through
// strides (row stride ld = (NH + 2 NKV) HS, K and V at column offsets NH HS and (NH + NKV) HS);
// O and dO are [B, T, NH HS]; dQ, dK, dV are written into dqkv at the same strides as Q, K, V.
// The softmax statistics are our lse: [B, NH, T] fp32, so either direction can pair with our
// kernels'.
#include "attention_cudnn.hpp"

#if defined(KOKKOS_ENABLE_CUDA) && defined(MESHTRAIN_HAVE_CUDNN)
#include <cstdint>
#include <string>

#include "cudnn_sdpa.hpp"
#include "meshtrain/kernels/attention/attention.hpp"

namespace meshtrain::kernels {

std::string cudnn_attention_unavailable_reason() {
  std::string why;
  return detail::cudnn::api(&why) ? std::string() : why;
}

namespace detail {

namespace {

// The causal square block whose operands are the packed buffers.
cudnn::SdpaShape packed_shape(int B, int T, int NH, int NKV, int HS) {
  cudnn::SdpaShape s{B, T, T, NH, NKV, HS, true};
  const int64_t C = int64_t(NH) * HS, ld = C + 2 * int64_t(NKV) * HS;
  const cudnn::Rows qkv{T * ld, ld}, o{T * C, C};
  s.q = s.k = s.v = s.dq = s.dk = s.dv = qkv;
  s.o = s.dout = o;
  s.stats_batch = int64_t(NH) * T;
  s.stats_head = T;
  return s;
}

}  // namespace

template <class T>
bool attention_forward_cudnn(const ExecSpace& exec, View1<T> out, View1<float> lse,
                             View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV) {
  if constexpr (!cudnn::kIoType<T>) {
    return false;
  } else {
    if (!cudnn::eligible(HS, {out.data(), qkv.data()})) return false;
    if (B == 0 || Tlen == 0) return true;
    const cudnn::SdpaShape shape = packed_shape(B, Tlen, NH, NKV, HS);
    cudnn::Sdpa call(exec);
    if (!call.plan(false, cudnn::io_type<T>(), shape)) return false;
    const T* base = qkv.data();
    const int64_t C = int64_t(NH) * HS, Ckv = int64_t(NKV) * HS;
    call.forward({base, base + C, base + C + Ckv, out.data(), lse.data()});
    return true;
  }
}

template <class T>
bool attention_backward_cudnn(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                              View1<const T> qkv, View1<const T> out, View1<const float> lse,
                              int B, int Tlen, int NH, int HS, int NKV) {
  if constexpr (!cudnn::kIoType<T>) {
    return false;
  } else {
    if (!cudnn::eligible(HS, {dqkv.data(), dout.data(), qkv.data(), out.data()})) return false;
    if (B == 0 || Tlen == 0) return true;
    const cudnn::SdpaShape shape = packed_shape(B, Tlen, NH, NKV, HS);
    cudnn::Sdpa call(exec);
    if (!call.plan(true, cudnn::io_type<T>(), shape)) return false;
    const T* q = qkv.data();
    T* dq = dqkv.data();
    const int64_t C = int64_t(NH) * HS, Ckv = int64_t(NKV) * HS;
    call.backward({q, q + C, q + C + Ckv, out.data(), dout.data(), lse.data(), dq, dq + C,
                   dq + C + Ckv});
    return true;
  }
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(T)                                                \
  template bool attention_forward_cudnn<T>(const ExecSpace&, View1<T>, View1<float>,            \
                                           View1<const T>, int, int, int, int, int);            \
  template bool attention_backward_cudnn<T>(const ExecSpace&, View1<T>, View1<const T>,         \
                                            View1<const T>, View1<const T>, View1<const float>, \
                                            int, int, int, int, int);
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(float)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(double)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(bf16)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN(fp16)
#undef MESHTRAIN_INSTANTIATE_ATTENTION_CUDNN

}  // namespace detail
}  // namespace meshtrain::kernels

#endif
