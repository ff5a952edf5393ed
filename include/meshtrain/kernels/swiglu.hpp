#pragma once
// SwiGLU (Shazeer 2020; Llama's MLP): h = silu(gate) * up, silu(g) = g * sigmoid(g), from the
// packed output of one GEMM, gate_up [N, 2*I] with each row [gate (I) | up (I)]. Under tensor
// parallelism gate and up are column-split together, so a rank's local columns are
// [gate_local | up_local] and I is the local width.
//
// For 16-bit types silu(gate) is rounded to T before the product, HF's order
// (`act_fn(gate_proj(x)) * up_proj(x)`); the arithmetic is fp32.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// out [N, I] = silu(gate) * up (overwrites).
template <class T>
void swiglu_forward(const ExecSpace& exec, View1<T> out, View1<const T> gate_up, int N, int I);

// dgate_up [N, 2*I] (overwrites) from dout [N, I] and the saved forward input gate_up:
//   dgate = dout * up * silu'(gate),  silu'(g) = s (1 + g (1 - s)), s = sigmoid(g)
//   dup   = dout * silu(gate)
// dgate_up may be gate_up itself (in place: each thread reads its gate and up elements before
// it writes their gradients), which saves the [N, 2*I] buffer; it must not alias dout.
template <class T>
void swiglu_backward(const ExecSpace& exec, View1<T> dgate_up, View1<const T> gate_up,
                     View1<const T> dout, int N, int I);

}  // namespace meshtrain::kernels
