// GptT's parameters and gradients: views of the flat buffers by name, the binding of each unit's
// storage to the per-block tensors (bind_unit, which ZeRO-3 and ZeRO-2 call with storage of their
// own), initialisation from the counter-based RNG, sharing and zeroing, and the first-write
// bookkeeping of the gradient buffer (grad_first_write.hpp).
#include <cmath>
#include <cstdint>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

template <class T>
View1<T> GptT<T>::param(const std::string& name) const {
  const auto& p = reg_.get(name);
  MESHTRAIN_CHECK(params_.span() > 0, "param(", name, "): the parameters are not allocated");
  return slice(params_, p.offset, p.numel);
}

template <class T>
View1<T> GptT<T>::grad(const std::string& name) const {
  const auto& p = reg_.get(name);
  MESHTRAIN_CHECK(grads_.span() > 0, "grad(", name, "): the gradients are not allocated");
  return slice(grads_, p.offset, p.numel);
}

template <class T>
void GptT<T>::bind_all() {
  const auto& units = reg_.units();
  for (std::size_t u = 0; u < units.size(); ++u) {
    View1<T> p, g;
    if (params_.span() > 0) p = slice(params_, units[u].begin, units[u].size());
    if (grads_.span() > 0) g = slice(grads_, units[u].begin, units[u].size());
    bind_unit(static_cast<int>(u), p, g);
  }
}

template <class T>
void GptT<T>::bind_unit(int u, View1<T> pstore, View1<T> gstore) {
  const auto& unit = reg_.units().at(static_cast<std::size_t>(u));
  auto view = [&](const View1<T>& store, const std::string& name) {
    const auto& info = reg_.get(name);
    return View1<T>(slice(store, info.offset - unit.begin, info.numel));
  };
  auto bind_block = [&](const View1<T>& store, BlockTensors<T>& t, MoeTensors<T>& m) {
    const std::string p = reg_.block_prefix(unit.layer);
    auto at = [&](const char* s) { return view(store, p + s); };
    const bool moe = cfg_.moe.is_moe_layer(unit.layer);
    t = BlockTensors<T>{};
    if (moe) {  // the router and the shared expert; the experts are in the next unit
      m.router = at("mlp.router.weight");
      if (cfg_.moe.shared_ffn > 0) {
        m.shared_in = at("mlp.shared_expert.w_in");
        m.shared_out = at("mlp.shared_expert.w_out");
      }
    }
    if (cfg_.is_gpt2()) {
      t.ln_1_w = at("ln_1.weight");
      t.ln_1_b = at("ln_1.bias");
      t.c_attn_w = at("attn.c_attn.weight");
      t.c_attn_b = at("attn.c_attn.bias");
      t.attn_proj_w = at("attn.c_proj.weight");
      t.attn_proj_b = at("attn.c_proj.bias");
      t.ln_2_w = at("ln_2.weight");
      t.ln_2_b = at("ln_2.bias");
      if (moe) return;
      t.c_fc_w = at("mlp.c_fc.weight");
      t.c_fc_b = at("mlp.c_fc.bias");
      t.mlp_proj_w = at("mlp.c_proj.weight");
      t.mlp_proj_b = at("mlp.c_proj.bias");
      return;
    }
    t.ln_1_w = at("input_layernorm.weight");
    t.ln_2_w = at("post_attention_layernorm.weight");
    t.q_w = at("self_attn.q_proj.weight");
    t.k_w = at("self_attn.k_proj.weight");
    t.v_w = at("self_attn.v_proj.weight");
    t.attn_proj_w = at("self_attn.o_proj.weight");
    if (cfg_.qkv_bias) {  // attention's, so MoE blocks have them too
      t.q_b = at("self_attn.q_proj.bias");
      t.k_b = at("self_attn.k_proj.bias");
      t.v_b = at("self_attn.v_proj.bias");
    }
    if (moe) return;
    t.gate_w = at("mlp.gate_proj.weight");
    t.up_w = at("mlp.up_proj.weight");
    t.mlp_proj_w = at("mlp.down_proj.weight");
  };
  // This rank's experts of block l: w_in of every local expert, then w_out, a stride apart.
  auto bind_experts = [&](const View1<T>& store, MoeTensors<T>& m) {
    const int l = unit.layer, n = reg_.local_experts(), e0 = reg_.first_expert();
    for (int which = 0; which < 2; ++which) {
      const bool in = which == 0;
      const auto& first = reg_.get(reg_.expert_prefix(l, e0) + (in ? "w_in" : "w_out"));
      const std::size_t stride = reg_.expert_stride(l, in);
      View1<T> v = slice(store, first.offset - unit.begin, std::size_t(n - 1) * stride + first.numel);
      (in ? m.w_in : m.w_out) = v;
      (in ? m.in_stride : m.out_stride) = stride;
    }
  };
  for (int which = 0; which < 2; ++which) {
    const View1<T>& store = which == 0 ? pstore : gstore;
    if (store.span() == 0) continue;
    MESHTRAIN_CHECK(store.span() >= unit.size(), "bind_unit(", unit.name, "): ", store.span(),
                    " elements, the unit needs ", unit.size());
    auto& moe = which == 0 ? moe_params_ : moe_grads_;
    if (unit.layer >= 0 && unit.group == ParamGroup::expert_dp) {
      bind_experts(store, moe[unit.layer]);
    } else if (unit.layer >= 0) {
      bind_block(store, which == 0 ? block_params_[unit.layer] : block_grads_[unit.layer],
                 moe[unit.layer]);
    } else if (u == reg_.embedding_unit()) {
      (which == 0 ? wte_ : dwte_) = view(store, reg_.embedding_name());
      if (layout_.has_embedding && cfg_.positions == Positions::learned)
        (which == 0 ? wpe_ : dwpe_) = view(store, "transformer.wpe.weight");
    } else if (cfg_.is_gpt2()) {
      (which == 0 ? lnf_w_ : dlnf_w_) = view(store, "transformer.ln_f.weight");
      (which == 0 ? lnf_b_ : dlnf_b_) = view(store, "transformer.ln_f.bias");
    } else {
      (which == 0 ? lnf_w_ : dlnf_w_) = view(store, "model.norm.weight");
      if (!cfg_.tied_head) (which == 0 ? lm_head_ : dlm_head_) = view(store, "lm_head.weight");
    }
  }
}

template <class T>
void GptT<T>::init_parameters(std::uint64_t seed) {
  MESHTRAIN_CHECK(params_.span() > 0, "init_parameters: the parameters are not allocated");
  init_parameters_into(seed, params_);
}

template <class T>
void GptT<T>::init_parameters_into(std::uint64_t seed, View1<T> flat) const {
  MESHTRAIN_CHECK(flat.span() >= reg_.size(), "init_parameters: buffer of ", flat.span(),
                  " elements, the registry needs ", reg_.size());
  Kokkos::deep_copy(exec_, flat, T(0.0f));
  const double resid_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  const int tp_rank = reg_.tp_rank();
  for (const auto& p : reg_.params()) {
    auto v = slice(flat, p.offset, p.numel);
    const std::string& n = p.name;
    if (p.init == Init::ones) {
      Kokkos::deep_copy(exec_, v, T(1.0f));
      continue;
    }
    if (p.init == Init::zeros) continue;
    const float std_dev = static_cast<float>(p.init == Init::residual ? resid_std : 0.02);
    const std::uint64_t stream = rng::name_stream(n);
    // Global index per local element, so any tensor-parallel slice draws its own values.
    // Vocabulary rows (the embedding, an untied head): the padding rows stay zero.
    const bool is_wte = n == reg_.embedding_name() || n == reg_.head_weight_name();
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
  bind_all();
}

template <class T>
void GptT<T>::zero_grads() {
  first_write_.disarm();
  if (grads_.span() > 0) Kokkos::deep_copy(exec_, grads_, T(0.0f));
}

namespace {
// Element offset of p in `flat`, or -1 where p is elsewhere (a scratch, a ZeRO-2 pool buffer).
template <class T>
std::int64_t offset_in(const View1<T>& flat, const T* p) {
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  const auto base = reinterpret_cast<std::uintptr_t>(flat.data());
  if (flat.span() == 0 || at < base || at >= base + flat.span() * sizeof(T)) return -1;
  return static_cast<std::int64_t>((at - base) / sizeof(T));
}
}  // namespace

template <class T>
float GptT<T>::grad_beta(const T* dw, std::size_t n) {
  if (!first_write_.armed()) return 1.0f;
  const std::int64_t at = offset_in(grads_, dw);
  return at < 0 ? 1.0f : first_write_.claim(static_cast<std::size_t>(at), n);
}

template <class T>
void GptT<T>::before_accumulate(const View1<T>& g) {
  if (!first_write_.armed() || g.span() == 0) return;
  const std::int64_t at = offset_in(grads_, g.data());
  if (at < 0) return;
  const auto begin = static_cast<std::size_t>(at);
  for (const GradRange& r : first_write_.take_unwritten(begin, begin + g.span()))
    Kokkos::deep_copy(exec_, slice(grads_, r.begin, r.size()), T(0.0f));
}

#define MESHTRAIN_INSTANTIATE_GPT_PARAMETERS(T)                                                  \
  template View1<T> GptT<T>::param(const std::string&) const;                                    \
  template View1<T> GptT<T>::grad(const std::string&) const;                                     \
  template void GptT<T>::bind_all();                                                             \
  template void GptT<T>::bind_unit(int, View1<T>, View1<T>);                                     \
  template void GptT<T>::init_parameters(std::uint64_t);                                         \
  template void GptT<T>::init_parameters_into(std::uint64_t, View1<T>) const;                    \
  template void GptT<T>::share_parameters(const GptT<T>&);                                       \
  template void GptT<T>::zero_grads();                                                          \
  template float GptT<T>::grad_beta(const T*, std::size_t);                                      \
  template void GptT<T>::before_accumulate(const View1<T>&);
MESHTRAIN_INSTANTIATE_GPT_PARAMETERS(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_PARAMETERS(bf16)
MESHTRAIN_INSTANTIATE_GPT_PARAMETERS(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_PARAMETERS

}  // namespace meshtrain::model
