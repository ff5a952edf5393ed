#pragma once
// Linear layer in HuggingFace GPT-2's Conv1D layout: weight is [IC, OC] (in x out), so
//   out[N, OC] = inp[N, IC] @ weight[IC, OC] + bias[OC].
// Keeping HF's layout makes import/export a plain copy and makes tensor-parallel splits simple:
// column-parallel splits dim 1 (OC), row-parallel splits dim 0 (IC).
// Each function is one GEMM with its epilogue fused where the backend can (gemm/gemm.hpp: gemm_ex,
// gemm_dbias), so bias, GELU and residual cost no extra pass over the activations on CUDA.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// out = inp @ weight + bias (+ residual). bias and residual may be empty Views; residual
// [N, OC] may be out itself (out += inp @ weight + bias).
template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, View1<const T> residual, int N,
                    int IC, int OC);
template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, int N, int IC, int OC);

// pre_gelu = inp @ weight + bias, out_gelu = gelu(pre_gelu) (tanh GELU, gelu.hpp); bias may be
// empty. The MLP's first layer: pre_gelu is kept for the backward pass.
template <class T>
void linear_gelu_forward(const ExecSpace& exec, View1<T> out_gelu, View1<T> pre_gelu,
                         View1<const T> inp, View1<const T> weight, View1<const T> bias, int N,
                         int IC, int OC);

// dweight[IC, OC] = dweight_beta * dweight + inp^T @ dout (beta 1: accumulate; 0: the first
// write of the gradient this step, dweight not read); dbias[OC] += sum_rows(dout) (always
// accumulates; skipped when empty); dinp[N, IC] = dout @ weight^T, or += when accumulate_dinp
// (skipped when dinp is empty).
template <class T>
void linear_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                     View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                     int IC, int OC, bool accumulate_dinp = false, float dweight_beta = 1.0f);

// The MLP's second layer, whose input inp = gelu(pre_gelu) [N, IC]: dweight and dbias as in
// linear_backward, and the gradient with respect to pre_gelu (the previous layer's output)
//   dpre[N, IC] = (dout @ weight^T) * gelu'(pre_gelu)     (overwritten; skipped when empty)
// which folds gelu_backward into the input-gradient GEMM; and, when dbias_pre is given, the
// previous layer's bias gradient dbias_pre[IC] += sum_rows(dpre) in the same GEMM (cuBLASLt's
// DGELU_BGRAD on CUDA), so that layer's backward skips its own column sums. dweight_beta as
// linear_backward's.
template <class T>
void linear_backward_dgelu(const ExecSpace& exec, View1<T> dpre, View1<T> dweight,
                           View1<T> dbias, View1<const T> dout, View1<const T> inp,
                           View1<const T> weight, View1<const T> pre_gelu, int N, int IC, int OC,
                           View1<T> dbias_pre = {}, float dweight_beta = 1.0f);

}  // namespace meshtrain::kernels
