// GptT's two ends, both vocabulary-parallel under tensor parallelism (each tp rank holds
// padded_vocab / tp rows of the embedding and of the LM head): the embedding (tokens outside
// this rank's rows contribute zero, wpe is added by tp rank 0, and the partial sums leave the
// region like a row-parallel output) and the head (final norm, LM head over this rank's
// vocabulary rows, cross-entropy whose softmax statistics are reduced over tp, and the head's
// backward fused into its forward). The communication is the tp region's (tp_region.hpp).
#include <algorithm>

#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"
#include "meshtrain/kernels/embedding.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

template <class T>
void GptT<T>::embedding_forward(SlotActivations<T>& s) {
  const int C = cfg_.n_embd;
  hook_before_forward(reg_.embedding_unit());
  if (!tp_.active()) {
    k::embedding_forward<T>(exec_, s.input, s.tokens, wte_, wpe_, B_, T_, C, 0, Vl_, positions_);
    return;
  }
  // Vocabulary-parallel: tokens outside this rank's rows contribute 0; wpe added once.
  k::embedding_forward<T>(exec_, tp_.partial(), s.tokens, wte_,
                          tp_.rank() == 0 ? wpe_ : View1<T>{}, B_, T_, C, v0_, Vl_, positions_);
  tp_.exit(tp_.partial(), s.input);
}

template <class T>
void GptT<T>::embedding_backward(SlotActivations<T>& s, View1<const T> dres) {
  const int u = reg_.embedding_unit();
  hook_before_backward(u);
  View1<const T> dfull = tp_.exit_backward(dres);
  // The scatter-add needs its gradient to hold a value: a tied wte is first written by the
  // head's GEMM, which in every schedule runs earlier in the micro-batch (so this is a no-op),
  // but if it ever came first the gradient is zeroed here instead.
  before_accumulate(dwte_);
  k::embedding_backward<T>(exec_, dwte_, dwpe_, dfull, s.tokens, B_, T_, cfg_.n_embd, v0_, Vl_,
                          positions_);
  hook_after_backward(u);
}

template <class T>
void GptT<T>::cross_entropy(View1<const std::int32_t> targets, int r0, int n, float grad_scale,
                            bool train) {
  const int V = cfg_.vocab_size;
  const std::size_t row0 = static_cast<std::size_t>(r0);
  const View1<T> lg = slice(logits_, 0, static_cast<std::size_t>(n) * Vl_);
  const View1<float> ls = slice(losses_, row0, n);
  const View1<const std::int32_t> tg = slice(targets, row0, n);
  if (!tp_.active()) {
    if (train)
      k::cross_entropy_forward_backward<T>(exec_, ls, lg, tg, n, Vl_, V, grad_scale);
    else
      k::cross_entropy_forward<T>(exec_, ls, lg, tg, n, Vl_, V);
    return;
  }
  // Vocabulary-parallel (Megatron's): the row max over every rank's logits, then the sum of
  // exponentials and the target's logit, each reduced over tp.
  const View1<float> mx = slice(ce_max_, row0, n), sums = slice(ce_sums_, 2 * row0, 2 * n);
  k::vp_ce_max<T>(exec_, mx, lg, n, Vl_, v0_, V);
  tp_.vocab_max(mx);
  k::vp_ce_sums<T>(exec_, sums, lg, tg, mx, n, Vl_, v0_, V);
  tp_.vocab_sum(sums);
  k::vp_ce_finish<T>(exec_, ls, lg, tg, mx, sums, n, Vl_, v0_, V, grad_scale, train);
}

template <class T>
void GptT<T>::head_forward(SlotActivations<T>& s, View1<const T> x,
                           View1<const std::int32_t> targets, float grad_scale, Mode mode) {
  const int N = N_, C = cfg_.n_embd;
  // eu: the unit of the tied embedding the head reads (-1 for an untied head, whose weight is
  // in the head unit).
  const int hu = reg_.head_unit(), eu = cfg_.tied_head ? reg_.embedding_unit() : -1;
  hook_before_forward(hu);
  if (eu >= 0) hook_before_forward(eu);
  norm_enter(lnf_, lnf_mean_, lnf_rstd_, x, lnf_w_, lnf_b_);
  // LM head [Vl, C] (the tied wte, or lm_head): logits[N, Vl] = lnf[N, C] @ head^T (this rank's
  // vocabulary rows). Its views are read after the hooks, which may bind their storage.
  const View1<T> hw = head_w();
  if (mode == Mode::logits) {
    k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N, Vl_, C, 1.0f, lnf_.data(), C, hw.data(), C,
               0.0f, logits_all_.data(), Vl_);
    return;
  }
  MESHTRAIN_CHECK(targets.span() == static_cast<std::size_t>(N), "model targets have ",
                  targets.span(), " tokens, expected ", N);
  const bool train = mode == Mode::train;
  const View1<T> dx = tp_.local_grad_rows(dln_);  // d(lnf), this rank's rows
  // The rows in chunks of head_rows_ (train.head_chunk_tokens): each chunk's logits become its
  // dlogits in place and feed its two backward GEMMs before the next chunk overwrites them, so
  // the [N, Vl] logits never exist at once. The weight gradient accumulates over the chunks.
  View1<T> dhw;
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int n = std::min(head_rows_, N - r0);
    const std::size_t row0 = static_cast<std::size_t>(r0);
    k::gemm<T>(exec_, k::Trans::N, k::Trans::T, n, Vl_, C, 1.0f, lnf_.data() + row0 * C, C,
               hw.data(), C, 0.0f, logits_.data(), Vl_);
    cross_entropy(targets, r0, n, grad_scale, train);
    if (!train) continue;
    // The head's backward, now: logits_ holds this chunk's dlogits.
    if (r0 == 0) {
      hook_before_backward(hu);
      if (eu >= 0) hook_before_backward(eu);
      dhw = dhead_w();
    }
    k::gemm<T>(exec_, k::Trans::N, k::Trans::N, n, C, Vl_, 1.0f, logits_.data(), Vl_,
               head_w().data(), C, 0.0f, dln_.data() + row0 * C, C);
    // dln leaves the column-parallel head (its tp reduction) while the last chunk's
    // weight-gradient GEMM runs (the reduce-scatter of sequence parallelism needs every row).
    comm::Request r;
    if (r0 + n == N) r = tp_.enter_backward(dln_, dx);
    // The first chunk of the step's first micro-batch overwrites the gradient (beta 0), the
    // others add to it.
    k::gemm<T>(exec_, k::Trans::T, k::Trans::N, Vl_, C, n, 1.0f, logits_.data(), Vl_,
               lnf_.data() + row0 * C, C, grad_beta(dhw), dhw.data(), C);
    tp_.wait(r);
  }
  k::sum_losses(exec_, loss_sum_, losses_, N, true);
  if (!train) return;
  Kokkos::deep_copy(exec_, s.dhead, T(0.0f));
  norm_backward(s.dhead, dlnf_w_, dlnf_b_, dx, x, lnf_w_, lnf_mean_, lnf_rstd_);
  hook_after_backward(hu);
  if (eu >= 0 && !layout_.has_embedding) hook_after_backward(eu);  // the tied copy is complete
}

#define MESHTRAIN_INSTANTIATE_GPT_HEAD(T)                                                        \
  template void GptT<T>::embedding_forward(SlotActivations<T>&);                                 \
  template void GptT<T>::embedding_backward(SlotActivations<T>&, View1<const T>);                \
  template void GptT<T>::cross_entropy(View1<const std::int32_t>, int, int, float, bool);       \
  template void GptT<T>::head_forward(SlotActivations<T>&, View1<const T>,                       \
                                      View1<const std::int32_t>, float, Mode);
MESHTRAIN_INSTANTIATE_GPT_HEAD(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_HEAD(bf16)
MESHTRAIN_INSTANTIATE_GPT_HEAD(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_HEAD

}  // namespace meshtrain::model
