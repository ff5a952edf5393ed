#pragma once
// Softmax cross-entropy fused with its gradient, over the logits of the LM head.
// logits: [N, Vp] (Vp = padded vocab). Columns >= V (the real vocab) are padding and are masked
// out of the softmax. targets[i] < 0 marks a position that does not count (loss 0, gradient 0).
//
// One call reads each row once for the online max/sum-exp, then overwrites the row in place with
// dlogits = grad_scale * (softmax - onehot(target)) (zero in the padding columns), so the logits
// are never read a second time by a separate backward kernel. losses[i] gets the per-row loss.
// grad_scale is 1 / (number of counted tokens in the global batch): averaging is exact.
#include <cstdint>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

template <class T>
void cross_entropy_forward_backward(const ExecSpace& exec, View1<float> losses, View1<T> logits,
                                    View1<const std::int32_t> targets, int N, int Vp, int V,
                                    float grad_scale);

// Forward only (evaluation): per-row loss, logits untouched.
template <class T>
void cross_entropy_forward(const ExecSpace& exec, View1<float> losses, View1<const T> logits,
                           View1<const std::int32_t> targets, int N, int Vp, int V);

// Sum of losses into a device scalar (out = sum, or += when accumulate).
void sum_losses(const ExecSpace& exec, Scalar<float> out, View1<const float> losses, int N,
                bool accumulate);

}  // namespace meshtrain::kernels
