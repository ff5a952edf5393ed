// GptT's FP8 linears (train.precision=fp8, model/fp8_recipe.hpp): the FP8 counterparts of the
// parallel parts in gpt_parallel.cpp, called by the blocks where fp8_block(l). The GEMMs are
// kernels/linear_fp8.hpp's; what differs from the bf16 parts:
//  - each cast's amax is agreed over tp (and cp) where the recipe says (fp8_options), before the
//    scales, so every layout casts with the scales of one rank;
//  - biases enter as the GEMM's C, and so does the residual at tp = 1 (at tp > 1 it is added
//    after the reduction, in the model's type): cuBLASLt's fused epilogues are not used for FP8;
//  - every linear of a packed output is its own GEMM with its own scales (q, k, v; gate, up),
//    never merged as the bf16 path merges adjacent pieces: adjacency depends on the layout
//    (replicated kv heads), the scales must not.
// The output gradient of a linear is cast once, for its input gradient (agreed there) and its
// weight gradient (both orientations in one pass), so the weight-gradient GEMMs that overlap the
// column-parallel reduction issue no collective of their own. Where the MLP activation's
// backward set a piece's amax (LinearPiece::dout_amax: GELU's, SwiGLU's fused amax of this
// rank's shard), that cast reads its tensor once; the amax is agreed all the same. An input
// read by several linears (q, k, v; gate, up) is cast once for their forward GEMMs and its
// transpose once for their weight gradients: the same tensor under the same scale, as before,
// without the repeats.
// Where the block keeps its inputs in FP8 (fp8_keeps_inputs), that transpose is written by the
// forward's cast into the block's activations and the backward reads it: the inputs in the
// model's type live only from their producer to the forward's cast.
#include <type_traits>
#include <vector>

#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/model/fp8_amax.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

namespace {
// The FP8 GEMM has no fp16 output: FP8 training keeps bf16 (or, on host builds, fp32) copies.
template <class T>
constexpr bool kFp8Type = std::is_same_v<T, float>
#if MESHTRAIN_HAVE_BF16
                          || std::is_same_v<T, bf16>
#endif
    ;
void no_fp8_type() {
  throw ConfigError("train.precision=fp8 keeps bf16 (GPU builds) or fp32 (host builds) "
                    "activations; this model's type has no FP8 GEMM");
}
}  // namespace

template <class T>
k::Fp8LinearOptions GptT<T>::fp8_options(TpSplit split, k::Fp8WeightLayout layout) {
  k::Fp8LinearOptions o;
  o.scaling = layout_.fp8.scaling;
  o.layout = layout;
  o.wgrad_high_precision = layout_.fp8.wgrad_bf16;
  o.workspace = &fp8_workspace_;
  comm::Communicator* cp = layout_.cp != nullptr && layout_.cp->size() > 1 ? layout_.cp : nullptr;
  if (!tp_.active() && cp == nullptr) return o;
  o.agree = [this, split, layout, cp](const k::Fp8Cast& c, View1<float> amax, std::size_t n) {
    if (agree_over_tp(split, layout, c)) tp_.agree_amax(exec_, amax, n);
    if (cp != nullptr && agree_over_cp(c)) agree_amax(*cp, exec_, amax, n);
  };
  return o;
}

template <class T>
void GptT<T>::fp8_column_forward(const LinearPiece<T>* pieces, int n, T* out, int ld,
                                 const T* inp, k::Fp8WeightLayout layout,
                                 const k::Fp8Tensor* kept, bool kept_amax_set) {
  if constexpr (!kFp8Type<T>) {
    no_fp8_type();
  } else {
    const int C = cfg_.n_embd;
    k::Fp8LinearOptions o = fp8_options(TpSplit::column, layout);
    const k::Fp8Tensor a =
        kept != nullptr ? k::linear_fp8_input_keep<T>(exec_, inp, N_, C, o, *kept, kept_amax_set)
                        : k::linear_fp8_input<T>(exec_, inp, N_, C, o);
    for (int i = 0; i < n; ++i) {
      const LinearPiece<T>& p = pieces[i];
      o.weight_scale = p.w_scale;
      k::linear_fp8_forward_gemm<T>(exec_, out + p.col, ld, p.b, a, p.w, N_, C, p.width, o);
    }
  }
}

template <class T>
void GptT<T>::fp8_row_forward(View1<T> out, View1<const T> inp, const T* w,
                              View1<float> w_scale, const T* b, int in_cols,
                              View1<const T> residual, k::Fp8WeightLayout layout,
                              const k::Fp8Tensor* kept, bool kept_amax_set) {
  if constexpr (!kFp8Type<T>) {
    no_fp8_type();
  } else {
    const int C = cfg_.n_embd;
    const std::size_t n = static_cast<std::size_t>(Nl_) * C;
    k::Fp8LinearOptions o = fp8_options(TpSplit::row, layout);
    o.weight_scale = w_scale;
    const k::Fp8Tensor a = kept != nullptr
                               ? k::linear_fp8_input_keep<T>(exec_, inp.data(), N_, in_cols, o,
                                                             *kept, kept_amax_set)
                               : k::linear_fp8_input<T>(exec_, inp.data(), N_, in_cols, o);
    if (!tp_.active()) {
      // The residual is the GEMM's C, as row_parallel_forward_nt's: no pass of its own (0.65 of
      // the 8B shape's 70.5 ms FP8 step on the H100 as a kernel after the GEMM).
      k::linear_fp8_forward_gemm<T>(exec_, out.data(), C, b, a, w, N_, in_cols, C, o,
                                    residual.data());
      return;
    }
    // The bias once (tp rank 0) and the residual once, after the reduction.
    k::linear_fp8_forward_gemm<T>(exec_, tp_.partial().data(), C, tp_.rank() == 0 ? b : nullptr,
                                  a, w, N_, in_cols, C, o);
    tp_.exit(tp_.partial(), tp_.reduced());
    k::residual_forward<T>(exec_, out, residual, tp_.reduced(), n);
  }
}

template <class T>
void GptT<T>::fp8_row_backward(T* dinp, T* dw, T* db, View1<const T> dfull, const T* inp,
                               const T* w, View1<float> w_scale, int in_cols,
                               k::Fp8WeightLayout layout, const k::Fp8Tensor* kept) {
  if constexpr (!kFp8Type<T>) {
    no_fp8_type();
  } else {
    const int C = cfg_.n_embd;
    k::Fp8LinearOptions o = fp8_options(TpSplit::row, layout);
    o.weight_scale = w_scale;
    const k::Fp8Tensor g = k::linear_fp8_grad<T>(exec_, dfull.data(), C, N_, C, o);
    k::linear_fp8_dinp_gemm<T>(exec_, dinp, 0.0f, g, w, N_, in_cols, C, o);
    const float beta = grad_beta(dw, std::size_t(in_cols) * C);
    if (kept != nullptr)
      k::linear_fp8_dweight_gemm<T>(exec_, dw, g, dfull.data(), C, *kept, N_, in_cols, C, o,
                                    beta);
    else
      k::linear_fp8_dweight_gemm<T>(exec_, dw, g, dfull.data(), C, inp, N_, in_cols, C, o, beta);
    if (db != nullptr) k::column_sums_add<T>(exec_, N_, C, dfull.data(), C, db);
  }
}

template <class T>
void GptT<T>::fp8_column_backward(View1<T> dx, const LinearPiece<T>* pieces, int n,
                                  const T* dout, int ld, const T* inp,
                                  k::Fp8WeightLayout layout, const k::Fp8Tensor* kept) {
  if constexpr (!kFp8Type<T>) {
    no_fp8_type();
  } else {
    const int C = cfg_.n_embd;
    k::Fp8LinearOptions o = fp8_options(TpSplit::column, layout);
    const auto dweight = [&](const LinearPiece<T>& p, const k::Fp8Tensor& gp,
                             const k::Fp8Tensor& xt) {
      const float beta = grad_beta(p.dw, std::size_t(p.width) * C);
      if (o.wgrad_high_precision)
        k::linear_fp8_dweight_gemm<T>(exec_, p.dw, gp, dout + p.col, ld, inp, N_, C, p.width, o,
                                      beta);
      else
        k::linear_fp8_dweight_gemm<T>(exec_, p.dw, gp, dout + p.col, ld, xt, N_, C, p.width, o,
                                      beta);
    };
    // The input's transpose for every piece's weight gradient: the block's kept cast, or cast
    // here once (none where the weight gradients read the input unquantized).
    const auto input_t = [&] {
      o.slot = 0;
      if (kept != nullptr) return *kept;
      return o.wgrad_high_precision ? k::Fp8Tensor{}
                                    : k::linear_fp8_input_t<T>(exec_, inp, N_, C, o);
    };
    if (!tp_.active()) {
      // No reduction to hide: each piece's weight gradient right after its input gradient, so
      // one workspace slot holds every piece's output-gradient cast in turn (at the 8B shape,
      // gate and up: 117 MB less than a slot each).
      const k::Fp8Tensor xt = input_t();
      for (int i = 0; i < n; ++i) {
        const LinearPiece<T>& p = pieces[i];
        const k::Fp8Tensor gp =
            k::linear_fp8_grad<T>(exec_, dout + p.col, ld, N_, p.width, o, p.dout_amax);
        o.weight_scale = p.w_scale;
        k::linear_fp8_dinp_gemm<T>(exec_, dln_.data(), i == 0 ? 0.0f : 1.0f, gp, p.w, N_, C,
                                   p.width, o);
        dweight(p, gp, xt);
      }
      comm::Request r = tp_.enter_backward(dln_, dx);
      tp_.wait(r);
      return;
    }
    // Input gradients summed into dln_ (partial over tp), each piece's gradient cast once, in
    // a workspace slot of its own (all are held until the weight gradients, which run while the
    // input gradient's reduction is under way).
    std::vector<k::Fp8Tensor> g;
    for (int i = 0; i < n; ++i) {
      const LinearPiece<T>& p = pieces[i];
      o.slot = i;
      g.push_back(k::linear_fp8_grad<T>(exec_, dout + p.col, ld, N_, p.width, o, p.dout_amax));
      o.weight_scale = p.w_scale;
      k::linear_fp8_dinp_gemm<T>(exec_, dln_.data(), i == 0 ? 0.0f : 1.0f, g.back(), p.w, N_, C,
                                 p.width, o);
    }
    comm::Request r = tp_.enter_backward(dln_, dx);
    const k::Fp8Tensor xt = input_t();
    for (int i = 0; i < n; ++i) {
      o.slot = i;
      dweight(pieces[i], g[static_cast<std::size_t>(i)], xt);
    }
    tp_.wait(r);
  }
}

#define MESHTRAIN_INSTANTIATE_GPT_FP8(T)                                                         \
  template k::Fp8LinearOptions GptT<T>::fp8_options(TpSplit, k::Fp8WeightLayout);                \
  template void GptT<T>::fp8_column_forward(const LinearPiece<T>*, int, T*, int, const T*,      \
                                            k::Fp8WeightLayout, const k::Fp8Tensor*, bool);      \
  template void GptT<T>::fp8_row_forward(View1<T>, View1<const T>, const T*, View1<float>,       \
                                         const T*, int, View1<const T>, k::Fp8WeightLayout,      \
                                         const k::Fp8Tensor*, bool);                             \
  template void GptT<T>::fp8_row_backward(T*, T*, T*, View1<const T>, const T*, const T*,        \
                                          View1<float>, int, k::Fp8WeightLayout,                 \
                                          const k::Fp8Tensor*);                                  \
  template void GptT<T>::fp8_column_backward(View1<T>, const LinearPiece<T>*, int, const T*,     \
                                             int, const T*, k::Fp8WeightLayout,                  \
                                             const k::Fp8Tensor*);
MESHTRAIN_INSTANTIATE_GPT_FP8(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_FP8(bf16)
MESHTRAIN_INSTANTIATE_GPT_FP8(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_FP8

}  // namespace meshtrain::model
