#pragma once
// AdamW (Loshchilov & Hutter, decoupled weight decay) over flat fp32 buffers, and the global
// gradient norm for clipping. The clip factor stays on the device (Scalar), so a step needs no
// host synchronisation.
#include <cstdint>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

struct AdamWHyper {
  float lr = 3e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  int step = 1;  // 1-based, for bias correction
};

// For i in [0, n): g = grad[i] * grad_scale();  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   param -= lr * (mhat / (sqrt(vhat) + eps) + wd * decay * param)
// `decay` is 1 for weights that decay and 0 for biases/LayerNorm (the caller splits ranges).
template <class G>
void adamw_update(const ExecSpace& exec, View1<float> param, View1<const G> grad, View1<float> m,
                  View1<float> v, std::size_t n, const AdamWHyper& h, float decay,
                  Scalar<const float> grad_scale);

// Mixed precision: the same update of the fp32 master `param`, then param_copy[i] = G(param[i]),
// the compute-precision copy the model reads (bf16 parameters, fp32 master weights).
template <class G>
void adamw_update(const ExecSpace& exec, View1<float> param, View1<const G> grad, View1<float> m,
                  View1<float> v, std::size_t n, const AdamWHyper& h, float decay,
                  Scalar<const float> grad_scale, View1<G> param_copy);

// Multi-tensor form: one launch over a whole flat buffer [0, n) whose parameters differ only in
// their decay factor. Ranges are given by their first element: range r covers
// [range_begin[r], range_begin[r + 1]) (the last one runs to n; elements before range_begin[0]
// belong to range 0) and uses decay range_decay[r]. Same arithmetic as adamw_update per element;
// param_copy may be empty (T = float: param is the model's buffer).
template <class G>
void adamw_update_ranges(const ExecSpace& exec, View1<float> param, View1<const G> grad,
                         View1<float> m, View1<float> v, std::size_t n, const AdamWHyper& h,
                         View1<const std::int64_t> range_begin, View1<const float> range_decay,
                         Scalar<const float> grad_scale, View1<G> param_copy);

// out (+)= sum_i x[i]^2 (fp32 accumulation; out is a device scalar).
template <class T>
void sum_squares(const ExecSpace& exec, Scalar<float> out, View1<const T> x, std::size_t n,
                 bool accumulate);

// scale = max_norm / max(norm, max_norm) with norm = sqrt(sumsq); writes norm too.
// max_norm <= 0 disables clipping (scale = 1). With loss scaling the gradients carry a factor S:
// pass inv_loss_scale = 1/S, the norm is then the true one and scale also removes S.
void clip_scale(const ExecSpace& exec, Scalar<float> scale, Scalar<float> norm,
                Scalar<const float> sumsq, float max_norm, float inv_loss_scale = 1.0f);

}  // namespace meshtrain::kernels
