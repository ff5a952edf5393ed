#pragma once
// SwiGLU (Shazeer 2020; Llama's MLP): h = silu(gate) * up, silu(g) = g * sigmoid(g), from the
// packed output of one GEMM, gate_up [N, 2*I] with each row [gate (I) | up (I)]. Under tensor
// parallelism gate and up are column-split together, so a rank's local columns are
// [gate_local | up_local] and I is the local width.
//
// For 16-bit types silu(gate) is rounded to T before the product, HF's order
// (`act_fn(gate_proj(x)) * up_proj(x)`); the arithmetic is fp32.
//
// amax (optional, FP8 current scaling, kernels/fp8_cast.hpp): when given (extent >= 1), the
// call also sets amax(0) to max |v| over the elements v of its output as stored in T, the bits
// fp8_amax(exec, amax, output, size) would give, without reading the output again.
// Stream-ordered; the host does not wait. Without it the kernels are the unfused ones.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// out [N, I] = silu(gate) * up (overwrites); amax: of out.
template <class T>
void swiglu_forward(const ExecSpace& exec, View1<T> out, View1<const T> gate_up, int N, int I,
                    View1<float> amax = {});

// dgate_up [N, 2*I] (overwrites) from dout [N, I] and the saved forward input gate_up:
//   dgate = dout * up * silu'(gate),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
//   dup   = dout * silu(gate)
// dgate_up may be gate_up itself (in place: each thread reads its gate and up elements before
// it writes their gradients), which saves the [N, 2*I] buffer; it must not alias dout.
// amax: of the whole [N, 2*I] dgate_up, gate and up gradients together (one tensor, the one
// GEMM operand of the backward's gate|up linear).
template <class T>
void swiglu_backward(const ExecSpace& exec, View1<T> dgate_up, View1<const T> gate_up,
                     View1<const T> dout, int N, int I, View1<float> amax = {});

}  // namespace meshtrain::kernels
