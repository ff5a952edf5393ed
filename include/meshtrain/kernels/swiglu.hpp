#pragma once
// SwiGLU (Shazeer 2020; Llama's MLP): h = silu(gate) * up, silu(g) = g * sigmoid(g), from the
// packed output of one GEMM, gate_up [N, 2*I] with each row [gate (I) | up (I)]. Under tensor
// parallelism gate and up are column-split together, so a rank's local columns are
// [gate_local | up_local] and I is the local width.
//
// For 16-bit types silu(gate) is rounded to T before the product, HF's order
// (`act_fn(gate_proj(x)) * up_proj(x)`); the arithmetic is fp32.
//
// amax (optional, FP8 current scaling, kernels/fp8_cast.hpp): when given (non-empty), the
// forward also sets amax(0) to max |v| over the elements v of its output as stored in T, the
// bits fp8_amax(exec, amax, output, size) would give, without reading the output again; the
// backward sets one such amax per half of its output (below).
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
// amax (2 entries): amax(0) of the gate gradients, amax(1) of the up gradients — the bits of
// fp8_amax_block over each [N, I] column block of dgate_up (row stride 2*I): the FP8 backward
// casts them as the output gradients of two linears, gate_proj and up_proj, each under its
// own scale.
template <class T>
void swiglu_backward(const ExecSpace& exec, View1<T> dgate_up, View1<const T> gate_up,
                     View1<const T> dout, int N, int I, View1<float> amax = {});

}  // namespace meshtrain::kernels
