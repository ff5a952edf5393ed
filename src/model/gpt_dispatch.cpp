// GptT's forward and backward of a chunk for a micro-batch's activation slot: the embedding on
// the first chunk, the blocks in order (backward: reversed, recomputing each under activation
// checkpointing) with the unit hooks around them, the head on the last; and the single-chunk
// helpers (forward_train, backward, forward_eval, forward_logits).
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/profile.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

template <class T>
void GptT<T>::reset_loss_sum() { Kokkos::deep_copy(exec_, loss_sum_, 0.0f); }

template <class T>
BlockActivations<T>& GptT<T>::acts_for(ChunkActivations<T>& ca, SlotActivations<T>& s, int l) {
  if (layout_.recompute) return *shared_acts_;
  return *s.acts[static_cast<std::size_t>(l - ca.range.first)];
}

template <class T>
View1<const T> GptT<T>::run_forward(int c, int slot, View1<const std::int32_t> tokens,
                                    View1<const T> x_in, View1<const std::int32_t> targets,
                                    float grad_scale, Mode mode) {
  MESHTRAIN_CHECK(c >= 0 && c < n_chunks(), "forward: chunk ", c, " of ", n_chunks());
  MESHTRAIN_CHECK(slot >= 0 && slot < slots(c), "forward: slot ", slot, " of ", slots(c),
                  " in chunk ", c);
  ChunkActivations<T>& ca = *chunks_[static_cast<std::size_t>(c)];
  SlotActivations<T>& s = *ca.slots[static_cast<std::size_t>(slot)];
  if (ca.embed) {
    MESHTRAIN_CHECK(tokens.span() == static_cast<std::size_t>(N_), "model input has ",
                    tokens.span(), " tokens, expected micro_batch x seq_len = ", N_);
    s.tokens = tokens;  // not copied: the caller keeps them until this slot's backward
    embedding_forward(s);
  } else {
    MESHTRAIN_CHECK(x_in.span() == activation_elems(), "forward: chunk input has ", x_in.span(),
                    " elements, expected ", activation_elems());
    Kokkos::deep_copy(exec_, s.input, x_in);
  }
  // MoE router losses enter the objective with the weight of this micro-batch's tokens.
  s.grad_scale = mode == Mode::train ? grad_scale : 0.0f;
  moe_loss_weight_ = s.grad_scale * static_cast<float>(N_);
  for (int l = ca.range.first; l < ca.range.last; ++l) {
    const int i = l - ca.range.first;
    View1<const T> x = i == 0 ? s.input : s.block_out[static_cast<std::size_t>(i - 1)];
    const prof::Range r([&] { return cat("forward block ", l); });
    hook_before_forward(reg_.unit_of_layer(l));
    if (reg_.expert_unit_of_layer(l) >= 0) hook_before_forward(reg_.expert_unit_of_layer(l));
    block_forward(l, x, acts_for(ca, s, l), s.block_out[static_cast<std::size_t>(i)]);
  }
  View1<const T> out = s.block_out.back();
  if (!ca.head) return out;
  const prof::Range r("head and loss");
  head_forward(s, out, targets, grad_scale, mode);
  return {};
}

template <class T>
View1<const T> GptT<T>::forward(int c, int slot, View1<const std::int32_t> tokens,
                                View1<const T> x_in, View1<const std::int32_t> targets,
                                float grad_scale, bool train) {
  return run_forward(c, slot, tokens, x_in, targets, grad_scale, train ? Mode::train : Mode::eval);
}

template <class T>
View1<const T> GptT<T>::backward(int c, int slot, View1<const T> dy) {
  MESHTRAIN_CHECK(c >= 0 && c < n_chunks(), "backward: chunk ", c, " of ", n_chunks());
  MESHTRAIN_CHECK(slot >= 0 && slot < slots(c), "backward: slot ", slot, " of ", slots(c),
                  " in chunk ", c);
  ChunkActivations<T>& ca = *chunks_[static_cast<std::size_t>(c)];
  SlotActivations<T>& s = *ca.slots[static_cast<std::size_t>(slot)];
  if (ca.head) {
    Kokkos::deep_copy(exec_, dres_, s.dhead);
  } else {
    MESHTRAIN_CHECK(dy.span() == activation_elems(), "backward: output gradient has ", dy.span(),
                    " elements, expected ", activation_elems());
    Kokkos::deep_copy(exec_, dres_, dy);
  }
  moe_loss_weight_ = s.grad_scale * static_cast<float>(N_);
  for (int l = ca.range.last - 1; l >= ca.range.first; --l) {
    const int i = l - ca.range.first;
    View1<const T> x = i == 0 ? s.input : s.block_out[static_cast<std::size_t>(i - 1)];
    const prof::Range r([&] { return cat("backward block ", l); });
    const int u = reg_.unit_of_layer(l), eu = reg_.expert_unit_of_layer(l);
    // An MoE block's experts (the later unit) first: backward walks the units downwards.
    if (eu >= 0) hook_before_backward(eu);
    hook_before_backward(u);
    auto& a = acts_for(ca, s, l);
    if (layout_.recompute) {
      const prof::Range rr([&] { return cat("recompute block ", l); });
      recomputing_ = true;
      block_forward(l, x, a, s.block_out[static_cast<std::size_t>(i)]);
      recomputing_ = false;
    }
    block_backward(l, x, a, dres_);
    if (eu >= 0) hook_after_backward(eu);
    hook_after_backward(u);
  }
  if (!ca.embed) return dres_;
  embedding_backward(s, dres_);
  return {};
}

template <class T>
void GptT<T>::forward_train(View1<const std::int32_t> inputs, View1<const std::int32_t> targets,
                            float grad_scale) {
  MESHTRAIN_CHECK(n_chunks() == 1 && layout_.has_embedding && layout_.has_head,
                  "forward_train needs the whole model in one chunk; use forward()");
  run_forward(0, 0, inputs, {}, targets, grad_scale, Mode::train);
}

template <class T>
void GptT<T>::backward() { backward(0, 0, {}); }

template <class T>
void GptT<T>::forward_eval(View1<const std::int32_t> inputs, View1<const std::int32_t> targets) {
  MESHTRAIN_CHECK(n_chunks() == 1 && layout_.has_embedding && layout_.has_head,
                  "forward_eval needs the whole model in one chunk; use forward()");
  run_forward(0, 0, inputs, {}, targets, 0.0f, Mode::eval);
}

template <class T>
View1<const T> GptT<T>::forward_logits(View1<const std::int32_t> inputs) {
  MESHTRAIN_CHECK(n_chunks() == 1 && layout_.has_embedding && layout_.has_head && tp_size_ == 1,
                  "forward_logits needs the whole model on one rank (tp = 1, one chunk)");
  // Generation and evaluation tools read every row's logits at once; training never allocates
  // them (its head runs in chunks of rows).
  if (logits_all_.span() == 0)
    logits_all_ = alloc<T>("act.logits_all", static_cast<std::size_t>(N_) * Vl_);
  run_forward(0, 0, inputs, {}, {}, 0.0f, Mode::logits);
  return logits_all_;
}

#define MESHTRAIN_INSTANTIATE_GPT_DISPATCH(T)                                                    \
  template void GptT<T>::reset_loss_sum();                                                       \
  template BlockActivations<T>& GptT<T>::acts_for(ChunkActivations<T>&, SlotActivations<T>&,     \
                                                  int);                                          \
  template View1<const T> GptT<T>::run_forward(int, int, View1<const std::int32_t>,              \
                                               View1<const T>, View1<const std::int32_t>, float, \
                                               Mode);                                            \
  template View1<const T> GptT<T>::forward(int, int, View1<const std::int32_t>, View1<const T>,  \
                                           View1<const std::int32_t>, float, bool);              \
  template View1<const T> GptT<T>::backward(int, int, View1<const T>);                           \
  template void GptT<T>::forward_train(View1<const std::int32_t>, View1<const std::int32_t>,     \
                                       float);                                                   \
  template void GptT<T>::backward();                                                             \
  template void GptT<T>::forward_eval(View1<const std::int32_t>, View1<const std::int32_t>);     \
  template View1<const T> GptT<T>::forward_logits(View1<const std::int32_t>);
MESHTRAIN_INSTANTIATE_GPT_DISPATCH(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_DISPATCH(bf16)
MESHTRAIN_INSTANTIATE_GPT_DISPATCH(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_DISPATCH

}  // namespace meshtrain::model
