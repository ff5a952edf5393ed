#include "meshtrain/model/gpt.hpp"

#include <cmath>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/kernels/attention.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"
#include "meshtrain/kernels/embedding.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/gemm.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/linear.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

template <class T>
BlockActivations<T>::BlockActivations(int B, int Tl, int C, int NH) {
  const std::size_t N = static_cast<std::size_t>(B) * Tl;
  ln1 = alloc<T>("act.ln1", N * C);
  ln1_mean = alloc<float>("act.ln1_mean", N);
  ln1_rstd = alloc<float>("act.ln1_rstd", N);
  qkv = alloc<T>("act.qkv", N * 3 * C);
  atty = alloc<T>("act.atty", N * C);
  lse = alloc<float>("act.lse", static_cast<std::size_t>(B) * NH * Tl);
  attproj = alloc<T>("act.attproj", N * C);
  res2 = alloc<T>("act.res2", N * C);
  ln2 = alloc<T>("act.ln2", N * C);
  ln2_mean = alloc<float>("act.ln2_mean", N);
  ln2_rstd = alloc<float>("act.ln2_rstd", N);
  fch = alloc<T>("act.fch", N * 4 * C);
  fch_gelu = alloc<T>("act.fch_gelu", N * 4 * C);
  fcproj = alloc<T>("act.fcproj", N * C);
}

template <class T>
std::size_t BlockActivations<T>::bytes() const {
  std::size_t n = 0;
  for (const auto* v : {&ln1, &qkv, &atty, &attproj, &res2, &ln2, &fch, &fch_gelu, &fcproj})
    n += v->span() * sizeof(T);
  for (const auto* v : {&ln1_mean, &ln1_rstd, &lse, &ln2_mean, &ln2_rstd})
    n += v->span() * sizeof(float);
  return n;
}

template <class T>
GptT<T>::GptT(const GptConfig& cfg, int micro_batch, int seq_len, bool recompute, ExecSpace exec)
    : cfg_(cfg),
      B_(micro_batch),
      T_(seq_len),
      recompute_(recompute),
      exec_(exec),
      reg_(cfg, 0, 1, 0, 0, cfg.n_layer, true, true) {
  cfg_.validate();
  MESHTRAIN_CONFIG_CHECK(B_ > 0, "train.micro_batch=", B_, " must be positive");
  MESHTRAIN_CONFIG_CHECK(T_ > 0 && T_ <= cfg_.block_size, "train.seq_len=", T_,
                         " must be in [1, model.block_size=", cfg_.block_size, "]");
  const std::size_t N = static_cast<std::size_t>(B_) * T_, C = cfg_.n_embd;
  params_ = zeros<T>("params", reg_.size());
  grads_ = zeros<T>("grads", reg_.size());
  bind_block_tensors();
  encoded_ = alloc<T>("act.encoded", N * C);
  for (int l = 0; l < cfg_.n_layer; ++l) block_out_.push_back(alloc<T>("act.block_out", N * C));
  const int n_acts = recompute_ ? 1 : cfg_.n_layer;
  for (int i = 0; i < n_acts; ++i)
    acts_.push_back(std::make_unique<BlockActivations<T>>(B_, T_, cfg_.n_embd, cfg_.n_head));
  lnf_ = alloc<T>("act.lnf", N * C);
  lnf_mean_ = alloc<float>("act.lnf_mean", N);
  lnf_rstd_ = alloc<float>("act.lnf_rstd", N);
  logits_ = alloc<T>("act.logits", N * cfg_.padded_vocab());
  losses_ = alloc<float>("act.losses", N);
  inputs_ = alloc<std::int32_t>("act.inputs", N);
  targets_ = alloc<std::int32_t>("act.targets", N);
  dres_ = alloc<T>("grad.dres", N * C);
  dln_ = alloc<T>("grad.dln", N * C);
  dqkv_ = alloc<T>("grad.dqkv", N * 3 * C);
  datty_ = alloc<T>("grad.datty", N * C);
  dfch_ = alloc<T>("grad.dfch", N * 4 * C);
  dfch_gelu_ = alloc<T>("grad.dfch_gelu", N * 4 * C);
  loss_sum_ = Scalar<float>("meshtrain::loss_sum");
}

template <class T>
GptT<T>::~GptT() = default;

template <class T>
View1<T> GptT<T>::param(const std::string& name) const {
  const auto& p = reg_.get(name);
  return slice(params_, p.offset, p.numel);
}

template <class T>
View1<T> GptT<T>::grad(const std::string& name) const {
  const auto& p = reg_.get(name);
  return slice(grads_, p.offset, p.numel);
}

template <class T>
void GptT<T>::init_parameters(std::uint64_t seed) {
  Kokkos::deep_copy(exec_, params_, T(0.0f));
  const double resid_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  const int tp_rank = reg_.tp_rank();
  for (const auto& p : reg_.params()) {
    auto v = slice(params_, p.offset, p.numel);
    const std::string& n = p.name;
    const bool is_bias = n.size() > 5 && n.compare(n.size() - 5, 5, ".bias") == 0;
    const bool is_ln = n.find(".ln_") != std::string::npos;
    if (is_ln && !is_bias) {
      Kokkos::deep_copy(exec_, v, T(1.0f));
      continue;
    }
    if (is_bias) continue;  // zeros
    const bool resid = n.find("c_proj.weight") != std::string::npos;
    const float std_dev = static_cast<float>(resid ? resid_std : 0.02);
    const std::uint64_t stream = rng::name_stream(n);
    // Global index per local element, so any tensor-parallel slice draws its own values.
    const bool is_wte = n == "transformer.wte.weight";
    const std::int64_t gcols = p.global_shape.size() == 2 ? p.global_shape[1] : 1;
    const std::int64_t real_rows = cfg_.vocab_size;
    const int split = static_cast<int>(p.split);
    const bool matrix = p.local_shape.size() == 2;
    const std::int64_t lrows = p.local_shape[0];
    const std::int64_t lcols = matrix ? p.local_shape[1] : p.local_shape[0];
    const std::int64_t gc = matrix ? gcols : p.global_shape[0];
    Kokkos::parallel_for(
        "meshtrain::init_normal",
        Kokkos::RangePolicy<ExecSpace>(exec_, 0, static_cast<std::int64_t>(p.numel)),
        KOKKOS_LAMBDA(const std::int64_t i) {
          const std::int64_t g = split_global_index(split, i, matrix, lrows, lcols, gc, tp_rank);
          const std::int64_t grow = matrix ? g / gc : 0;
          if (is_wte && grow >= real_rows) {
            v(i) = T(0.0f);  // vocabulary padding stays zero
            return;
          }
          v(i) = static_cast<T>(
              static_cast<float>(std_dev * rng::normal(seed, stream, static_cast<std::uint64_t>(g))));
        });
  }
  exec_.fence();
}

template <class T>
void GptT<T>::share_parameters(const GptT& other) {
  MESHTRAIN_CHECK(other.reg_.size() == reg_.size() && other.cfg_.n_layer == cfg_.n_layer &&
                      other.cfg_.n_embd == cfg_.n_embd && other.cfg_.vocab_size == cfg_.vocab_size,
                  "share_parameters: the two models have different configurations");
  params_ = other.params_;
  bind_block_tensors();
}

template <class T>
void GptT<T>::bind_block_tensors() {
  auto bind = [&](const View1<T>& flat, int l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    auto at = [&](const char* s) {
      const auto& info = reg_.get(p + s);
      return View1<T>(slice(flat, info.offset, info.numel));
    };
    return BlockTensors<T>{at("ln_1.weight"),        at("ln_1.bias"),
                           at("attn.c_attn.weight"), at("attn.c_attn.bias"),
                           at("attn.c_proj.weight"), at("attn.c_proj.bias"),
                           at("ln_2.weight"),        at("ln_2.bias"),
                           at("mlp.c_fc.weight"),    at("mlp.c_fc.bias"),
                           at("mlp.c_proj.weight"),  at("mlp.c_proj.bias")};
  };
  block_params_.clear();
  block_grads_.clear();
  for (int l = 0; l < cfg_.n_layer; ++l) {
    block_params_.push_back(bind(params_, l));
    block_grads_.push_back(bind(grads_, l));
  }
}

template <class T>
void GptT<T>::zero_grads() { Kokkos::deep_copy(exec_, grads_, T(0.0f)); }

template <class T>
void GptT<T>::reset_loss_sum() { Kokkos::deep_copy(exec_, loss_sum_, 0.0f); }

template <class T>
BlockActivations<T>& GptT<T>::acts_for(int l) { return *acts_[recompute_ ? 0 : l]; }

template <class T>
void GptT<T>::block_forward(int l, View1<const T> x, BlockActivations<T>& a) {
  const int N = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const BlockTensors<T>& w = block_params_[l];
  k::layernorm_forward<T>(exec_, a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln_1_w, w.ln_1_b, N, C);
  k::linear_forward<T>(exec_, a.qkv, a.ln1, w.c_attn_w, w.c_attn_b, N, C, 3 * C);
  k::attention_forward<T>(exec_, a.atty, a.lse, a.qkv, B_, T_, NH, C / NH);
  k::linear_forward<T>(exec_, a.attproj, a.atty, w.attn_proj_w, w.attn_proj_b, N, C, C);
  k::residual_forward<T>(exec_, a.res2, x, a.attproj, static_cast<std::size_t>(N) * C);
  k::layernorm_forward<T>(exec_, a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln_2_w, w.ln_2_b, N, C);
  k::linear_forward<T>(exec_, a.fch, a.ln2, w.c_fc_w, w.c_fc_b, N, C, 4 * C);
  k::gelu_forward<T>(exec_, a.fch_gelu, a.fch, static_cast<std::size_t>(N) * 4 * C);
  k::linear_forward<T>(exec_, a.fcproj, a.fch_gelu, w.mlp_proj_w, w.mlp_proj_b, N, 4 * C, C);
  k::residual_forward<T>(exec_, block_out_[l], a.res2, a.fcproj,
                         static_cast<std::size_t>(N) * C);
}

// dres holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit.
template <class T>
void GptT<T>::block_backward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> dres) {
  const int N = B_ * T_, C = cfg_.n_embd, NH = cfg_.n_head;
  const BlockTensors<T>& w = block_params_[l];
  const BlockTensors<T>& g = block_grads_[l];
  // MLP: res3 = res2 + proj(gelu(fc(ln2(res2))))
  k::linear_backward<T>(exec_, dfch_gelu_, g.mlp_proj_w, g.mlp_proj_b, dres, a.fch_gelu,
                        w.mlp_proj_w, N, 4 * C, C);
  k::gelu_backward<T>(exec_, dfch_, a.fch, dfch_gelu_, static_cast<std::size_t>(N) * 4 * C);
  k::linear_backward<T>(exec_, dln_, g.c_fc_w, g.c_fc_b, dfch_, a.ln2, w.c_fc_w, N, C, 4 * C);
  k::layernorm_backward<T>(exec_, dres, g.ln_2_w, g.ln_2_b, dln_, a.res2, w.ln_2_w, a.ln2_mean,
                           a.ln2_rstd, N, C);
  // Attention: res2 = x + proj(attn(c_attn(ln1(x))))
  k::linear_backward<T>(exec_, datty_, g.attn_proj_w, g.attn_proj_b, dres, a.atty, w.attn_proj_w,
                        N, C, C);
  k::attention_backward<T>(exec_, dqkv_, datty_, a.qkv, a.atty, a.lse, B_, T_, NH, C / NH);
  k::linear_backward<T>(exec_, dln_, g.c_attn_w, g.c_attn_b, dqkv_, a.ln1, w.c_attn_w, N, C,
                        3 * C);
  k::layernorm_backward<T>(exec_, dres, g.ln_1_w, g.ln_1_b, dln_, x, w.ln_1_w, a.ln1_mean,
                           a.ln1_rstd, N, C);
}

template <class T>
void GptT<T>::forward_body(View1<const std::int32_t> inputs) {
  const int N = B_ * T_, C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  MESHTRAIN_CHECK(inputs.span() == static_cast<std::size_t>(N), "model input has ", inputs.span(),
                  " tokens, expected micro_batch x seq_len = ", N);
  Kokkos::deep_copy(exec_, inputs_, inputs);
  k::embedding_forward<T>(exec_, encoded_, inputs_, param("transformer.wte.weight"),
                              param("transformer.wpe.weight"), B_, T_, C, 0, Vp);
  for (int l = 0; l < cfg_.n_layer; ++l) {
    View1<const T> x = l == 0 ? encoded_ : block_out_[l - 1];
    block_forward(l, x, acts_for(l));
  }
  k::layernorm_forward<T>(exec_, lnf_, lnf_mean_, lnf_rstd_, block_out_[cfg_.n_layer - 1],
                              param("transformer.ln_f.weight"), param("transformer.ln_f.bias"), N,
                              C);
  // LM head tied to wte [Vp, C]: logits[N, Vp] = lnf[N, C] @ wte^T
  const auto wte = param("transformer.wte.weight");
  k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N, Vp, C, 1.0f, lnf_.data(), C, wte.data(), C,
                 0.0f, logits_.data(), Vp);
}

template <class T>
void GptT<T>::forward_train(View1<const std::int32_t> inputs, View1<const std::int32_t> targets,
                        float grad_scale) {
  const int N = B_ * T_;
  forward_body(inputs);
  Kokkos::deep_copy(exec_, targets_, targets);
  k::cross_entropy_forward_backward<T>(exec_, losses_, logits_, targets_, N,
                                           cfg_.padded_vocab(), cfg_.vocab_size, grad_scale);
  k::sum_losses(exec_, loss_sum_, losses_, N, true);
}

template <class T>
void GptT<T>::forward_eval(View1<const std::int32_t> inputs, View1<const std::int32_t> targets) {
  const int N = B_ * T_;
  forward_body(inputs);
  Kokkos::deep_copy(exec_, targets_, targets);
  k::cross_entropy_forward<T>(exec_, losses_, logits_, targets_, N, cfg_.padded_vocab(),
                                  cfg_.vocab_size);
  k::sum_losses(exec_, loss_sum_, losses_, N, true);
}

template <class T>
View1<const T> GptT<T>::forward_logits(View1<const std::int32_t> inputs) {
  forward_body(inputs);
  return logits_;
}

template <class T>
void GptT<T>::backward() {
  const int N = B_ * T_, C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  const auto wte = param("transformer.wte.weight");
  const auto dwte = grad("transformer.wte.weight");
  // LM head: logits_ now holds dlogits (written by the fused cross-entropy).
  k::gemm<T>(exec_, k::Trans::N, k::Trans::N, N, C, Vp, 1.0f, logits_.data(), Vp, wte.data(),
                 C, 0.0f, dln_.data(), C);
  k::gemm<T>(exec_, k::Trans::T, k::Trans::N, Vp, C, N, 1.0f, logits_.data(), Vp, lnf_.data(),
                 C, 1.0f, dwte.data(), C);
  Kokkos::deep_copy(exec_, dres_, T(0.0f));
  k::layernorm_backward<T>(exec_, dres_, grad("transformer.ln_f.weight"),
                               grad("transformer.ln_f.bias"), dln_, block_out_[cfg_.n_layer - 1],
                               param("transformer.ln_f.weight"), lnf_mean_, lnf_rstd_, N, C);
  for (int l = cfg_.n_layer - 1; l >= 0; --l) {
    View1<const T> x = l == 0 ? encoded_ : block_out_[l - 1];
    if (recompute_) block_forward(l, x, acts_for(l));  // rebuild the block's activations
    block_backward(l, x, acts_for(l), dres_);
  }
  k::embedding_backward<T>(exec_, dwte, grad("transformer.wpe.weight"), dres_, inputs_, B_,
                               T_, C, 0, Vp);
}

template struct BlockTensors<float>;
template struct BlockActivations<float>;
template class GptT<float>;
#if MESHTRAIN_HAVE_BF16
template struct BlockActivations<bf16>;
template class GptT<bf16>;
template struct BlockActivations<fp16>;
template class GptT<fp16>;
#endif

}  // namespace meshtrain::model
