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

// cross_entropy_forward_backward/forward dispatch: on a CUDA device, for float and bf16 with Vp
// a multiple of 16 / sizeof(T), to the CUDA kernels of src/kernels/cross_entropy_cuda.cpp (a
// block per row, 16-byte vectors, rows of up to 65536 bf16 / 32768 float read once into
// registers); in every other case to the portable Kokkos kernels below. Both are deterministic;
// their results agree to fp32 rounding, not bit for bit. On either path the forward-only losses
// are the same bits as those of the fused call.
//
// Portable Kokkos kernels; the tests' oracle for the CUDA path.
template <class T>
void cross_entropy_forward_backward_portable(const ExecSpace& exec, View1<float> losses,
                                             View1<T> logits, View1<const std::int32_t> targets,
                                             int N, int Vp, int V, float grad_scale);
template <class T>
void cross_entropy_forward_portable(const ExecSpace& exec, View1<float> losses,
                                    View1<const T> logits, View1<const std::int32_t> targets,
                                    int N, int Vp, int V);

// Sum of losses into a device scalar (out = sum, or += when accumulate).
// Vocabulary-parallel cross-entropy (Megatron): each tensor-parallel rank holds the logits of
// its vocabulary slice [v0, v0 + Vl) for all N rows; the row statistics are combined by two
// all-reduces over the tp group that the caller runs between the three passes:
//   1. vp_ce_max:    rowmax[n] = max over local real columns (those < V - v0)
//      -> all-reduce max over tp
//   2. vp_ce_sums:   sums[2n] = sum exp(x - rowmax), sums[2n+1] = x[target] if the target is in
//                    this slice, else 0                         -> all-reduce sum over tp
//   3. vp_ce_finish: losses[n] = rowmax + log(sumexp) - x[target] (0 for ignored targets < 0);
//                    with write_grad the logits become grad_scale * (softmax - onehot) (0 on
//                    padding columns and ignored rows).
// The full logits are never gathered on one rank.
template <class T>
void vp_ce_max(const ExecSpace& exec, View1<float> rowmax, View1<const T> logits, int N, int Vl,
               int v0, int V);
template <class T>
void vp_ce_sums(const ExecSpace& exec, View1<float> sums, View1<const T> logits,
                View1<const std::int32_t> targets, View1<const float> rowmax, int N, int Vl,
                int v0, int V);
template <class T>
void vp_ce_finish(const ExecSpace& exec, View1<float> losses, View1<T> logits,
                  View1<const std::int32_t> targets, View1<const float> rowmax,
                  View1<const float> sums, int N, int Vl, int v0, int V, float grad_scale,
                  bool write_grad);

void sum_losses(const ExecSpace& exec, Scalar<float> out, View1<const float> losses, int N,
                bool accumulate);

}  // namespace meshtrain::kernels
