#pragma once
// Linear layer in HuggingFace GPT-2's Conv1D layout: weight is [IC, OC] (in x out), so
//   out[N, OC] = inp[N, IC] @ weight[IC, OC] + bias[OC].
// Keeping HF's layout makes import/export a plain copy and makes tensor-parallel splits simple:
// column-parallel splits dim 1 (OC), row-parallel splits dim 0 (IC).
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// bias may be an empty View (no bias).
template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, int N, int IC, int OC);

// dweight[IC, OC] += inp^T @ dout;  dbias[OC] += sum_rows(dout) (skipped when empty);
// dinp[N, IC] = dout @ weight^T, or += when accumulate_dinp (skipped when dinp is empty).
template <class T>
void linear_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                     View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                     int IC, int OC, bool accumulate_dinp = false);

}  // namespace meshtrain::kernels
