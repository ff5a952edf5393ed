#pragma once
// GELU, tanh approximation (GPT-2's "gelu_new"):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//
// amax (optional, FP8 current scaling, kernels/fp8_cast.hpp): when given (extent >= 1), the
// call also sets amax(0) to max |v| over the elements v of its output as stored in T, the bits
// fp8_amax(exec, amax, output, n) would give, without reading the output again. Stream-ordered;
// the host does not wait. Without it the kernels are the unfused ones.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// out = gelu(inp); amax: of out.
template <class T>
void gelu_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp, std::size_t n,
                  View1<float> amax = {});

// dinp = gelu'(inp) * dout (overwrites); amax: of dinp.
template <class T>
void gelu_backward(const ExecSpace& exec, View1<T> dinp, View1<const T> inp, View1<const T> dout,
                   std::size_t n, View1<float> amax = {});

}  // namespace meshtrain::kernels
