#pragma once
// GELU, tanh approximation (GPT-2's "gelu_new"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

template <class T>
void gelu_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp, std::size_t n);

// dinp = gelu'(inp) * dout (overwrites).
template <class T>
void gelu_backward(const ExecSpace& exec, View1<T> dinp, View1<const T> inp, View1<const T> dout,
                   std::size_t n);

}  // namespace meshtrain::kernels
