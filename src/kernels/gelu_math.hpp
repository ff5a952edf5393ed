#pragma once
// Private to src/kernels/: the tanh GELU and its derivative (the formulas and their derivation
// are at the top of gelu.cpp), for Kokkos kernels and for the host fp32 loops. The GELU kernels
// and the GEMM epilogues share them, so that fused and unfused paths evaluate the same
// expression.
#include "host_exp.hpp"
#include "meshtrain/core/kokkos_compat.hpp"

namespace meshtrain::kernels::detail {

// gelu(x) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc gelu_value(Acc x) {
  const Acc s = Acc(0.7978845608028654);  // sqrt(2/pi)
  const Acc u = s * (x + Acc(0.044715) * x * x * x);
  return x / (Acc(1) + kc::exp(Acc(-2) * u));
}

// gelu'(x) = sig + 2 x sig (1 - sig) sqrt(2/pi) (1 + 3 * 0.044715 x^2), sig = sigmoid(2u)
template <class Acc>
KOKKOS_INLINE_FUNCTION Acc gelu_grad(Acc x) {
  const Acc s = Acc(0.7978845608028654);
  const Acc sig = Acc(1) / (Acc(1) + kc::exp(Acc(-2) * s * (x + Acc(0.044715) * x * x * x)));
  return sig + Acc(2) * x * sig * (Acc(1) - sig) * s * (Acc(1) + Acc(3 * 0.044715) * x * x);
}

// Host fp32 loops: the same formulas with the vectorisable exp (host_exp.hpp).
inline float gelu_value_host(float x) {
  const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.0f + host_exp(-2.0f * u));
}
inline float gelu_grad_host(float x) {
  const float s = 0.7978845608028654f;
  const float sig = 1.0f / (1.0f + host_exp(-2.0f * s * (x + 0.044715f * x * x * x)));
  return sig + 2.0f * x * sig * (1.0f - sig) * s * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace meshtrain::kernels::detail
