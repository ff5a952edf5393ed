// GptT: construction, parameter storage and binding, initialisation, and the chunk/slot
// dispatch of forward and backward. The layers themselves are in gpt_layers.cpp.
#include "meshtrain/model/gpt.hpp"

#include <algorithm>

#include <cmath>

#include "meshtrain/core/profile.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

template <class T>
BlockActivations<T>::BlockActivations(const BlockShape& s) {
  const std::size_t N = s.N, Nl = s.Nl, C = s.C;
  ln1 = alloc<T>("act.ln1", N * C);
  if (s.norm_mean) ln1_mean = alloc<float>("act.ln1_mean", Nl);
  ln1_rstd = alloc<float>("act.ln1_rstd", Nl);
  qkv = alloc<T>("act.qkv", N * (s.QW + 2 * s.KW));
  atty = alloc<T>("act.atty", N * s.QW);
  lse = alloc<float>("act.lse", static_cast<std::size_t>(s.B) * s.NHl * s.T);
  res2 = alloc<T>("act.res2", Nl * C);
  ln2 = alloc<T>("act.ln2", N * C);
  if (s.norm_mean) ln2_mean = alloc<float>("act.ln2_mean", Nl);
  ln2_rstd = alloc<float>("act.ln2_rstd", Nl);
  if (s.dense) {
    fch = alloc<T>("act.fch", N * s.FW);
    if (s.own_mlp_act) fch_gelu = alloc<T>("act.fch_gelu", N * s.HW);
  }
  own_mlp_act = s.own_mlp_act;
  if (s.moe) moe = make_moe_activations<T>();
}

template <class T>
std::size_t BlockActivations<T>::bytes() const {
  std::size_t n = 0;
  for (const auto* v : {&ln1, &qkv, &atty, &res2, &ln2, &fch})
    n += v->span() * sizeof(T);
  if (own_mlp_act) n += fch_gelu.span() * sizeof(T);
  for (const auto* v : {&ln1_mean, &ln1_rstd, &lse, &ln2_mean, &ln2_rstd})
    n += v->span() * sizeof(float);
  return n;
}

namespace {
ModelLayout single_rank_layout(bool recompute) {
  ModelLayout l;
  l.recompute = recompute;
  return l;
}
std::vector<LayerRange> chunks_or_all(const ModelLayout& l, const GptConfig& cfg) {
  if (!l.chunks.empty()) return l.chunks;
  return {LayerRange{0, cfg.n_layer}};
}
int tp_rank_of(const ModelLayout& l) { return l.tp ? l.tp->rank() : 0; }
int tp_size_of(const ModelLayout& l) { return l.tp ? l.tp->size() : 1; }
int ep_rank_of(const ModelLayout& l) { return l.ep ? l.ep->rank() : 0; }
int ep_size_of(const ModelLayout& l) { return l.ep ? l.ep->size() : 1; }
}  // namespace

template <class T>
GptT<T>::GptT(const GptConfig& cfg, int micro_batch, int seq_len, bool recompute, ExecSpace exec)
    : GptT(cfg, micro_batch, seq_len, single_rank_layout(recompute), exec) {}

template <class T>
GptT<T>::GptT(const GptConfig& cfg, int micro_batch, int seq_len, const ModelLayout& layout,
              ExecSpace exec)
    : cfg_((cfg.validate(), cfg)),
      B_(micro_batch),
      T_(seq_len),
      layout_(layout),
      tp_rank_(tp_rank_of(layout)),
      tp_size_(tp_size_of(layout)),
      exec_(exec),
      reg_(cfg, tp_rank_of(layout), tp_size_of(layout), layout.pp_stage,
           chunks_or_all(layout, cfg), layout.has_embedding, layout.has_head, ep_rank_of(layout),
           ep_size_of(layout)) {
  layout_.chunks = chunks_or_all(layout, cfg);
  MESHTRAIN_CONFIG_CHECK(B_ > 0, "train.micro_batch=", B_, " must be positive");
  MESHTRAIN_CONFIG_CHECK(T_ > 0 && T_ <= cfg_.block_size, "train.seq_len=", T_,
                         " must be in [1, model.block_size=", cfg_.block_size, "]");
  MESHTRAIN_CONFIG_CHECK(cfg_.sliding_window == 0 || T_ <= cfg_.sliding_window,
                         "model.sliding_window=", cfg_.sliding_window, " (Mistral's attention "
                         "window) is shorter than train.seq_len=", T_, "; meshtrain attends "
                         "over the whole causal context, which equals the window only up to its "
                         "length: use train.seq_len <= ", cfg_.sliding_window);
  MESHTRAIN_CONFIG_CHECK(layout_.n_slots > 0, "model: n_slots=", layout_.n_slots,
                         " must be positive");
  MESHTRAIN_CHECK(layout_.chunk_slots.empty() ||
                      layout_.chunk_slots.size() == layout_.chunks.size(),
                  "model: ", layout_.chunk_slots.size(), " chunk slot counts for ",
                  layout_.chunks.size(), " chunks");
  for (int k : layout_.chunk_slots)
    MESHTRAIN_CHECK(k > 0 && k <= layout_.n_slots, "model: chunk slot count ", k,
                    " outside [1, n_slots=", layout_.n_slots, "]");
  const int P = tp_size_;
  N_ = B_ * T_;
  MESHTRAIN_CONFIG_CHECK(!layout_.sequence_parallel || N_ % P == 0,
                         "tp.sequence_parallel: micro_batch x seq_len = ", N_,
                         " tokens must be divisible by mesh.tp=", P);
  Nl_ = layout_.sequence_parallel ? N_ / P : N_;
  NHl_ = cfg_.n_head / P;
  Vl_ = cfg_.padded_vocab() / P;
  v0_ = tp_rank_ * Vl_;
  HS_ = cfg_.head_size();
  QW_ = NHl_ * HS_;
  NKVl_ = reg_.local_kv_heads();
  kv0_ = reg_.first_kv_head();
  KW_ = NKVl_ * HS_;
  MESHTRAIN_CONFIG_CHECK(cfg_.mlp_width() % P == 0, "mesh.tp=", P, " must divide the MLP width ",
                         cfg_.mlp_width(), " (model.intermediate_size)");
  Il_ = cfg_.mlp_width() / P;
  const bool swiglu = cfg_.mlp == Mlp::swiglu;
  const std::size_t N = N_, Nl = Nl_, C = cfg_.n_embd;
  if (layout_.allocate_params) params_ = zeros<T>("params", reg_.size());
  if (layout_.allocate_grads) grads_ = zeros<T>("grads", reg_.size());
  block_params_.resize(static_cast<std::size_t>(cfg_.n_layer));
  block_grads_.resize(static_cast<std::size_t>(cfg_.n_layer));
  moe_params_.resize(static_cast<std::size_t>(cfg_.n_layer));
  moe_grads_.resize(static_cast<std::size_t>(cfg_.n_layer));
  moe_stats_.resize(static_cast<std::size_t>(cfg_.n_layer));
  moe_bias_.resize(static_cast<std::size_t>(cfg_.n_layer));
  bind_all();

  BlockShape shape{B_,  T_,   N_,  Nl_, cfg_.n_embd, NHl_, P,
                   QW_, KW_, swiglu ? 2 * Il_ : Il_, Il_, cfg_.norm == Norm::layernorm};
  // Which blocks this rank holds are MoE blocks and which dense (per block below; both for the
  // one set recomputation shares).
  bool any_moe = false, any_dense = false;
  for (const auto& ch : layout_.chunks)
    for (int l = ch.first; l < ch.last; ++l) {
      (cfg_.moe.is_moe_layer(l) ? any_moe : any_dense) = true;
      if (!cfg_.moe.is_moe_layer(l)) continue;
      moe_stats_[static_cast<std::size_t>(l)].load.assign(std::size_t(cfg_.moe.experts), 0.0);
      if (cfg_.moe.expert_bias)
        moe_bias_[static_cast<std::size_t>(l)] =
            zeros<float>("moe.expert_bias", std::size_t(cfg_.moe.experts));
    }
  // Full recomputation keeps no block's activations between forward and backward: nothing to
  // share then.
  const bool share_mlp_act = layout_.recompute_mlp_act && !layout_.recompute && any_dense;
  if (share_mlp_act) shared_mlp_act_ = alloc<T>("act.mlp_act_shared", N * shape.HW);
  shape.own_mlp_act = !share_mlp_act;
  auto shape_of = [&](int l) {
    BlockShape b = shape;
    b.moe = l < 0 ? any_moe : cfg_.moe.is_moe_layer(l);
    b.dense = l < 0 ? any_dense : !b.moe;
    return b;
  };
  if (any_moe) {
    MESHTRAIN_CONFIG_CHECK(!layout_.ep || layout_.ep->size() == reg_.ep_size(), "model: ep");
    self_ = std::make_unique<comm::SelfCommunicator>(
        layout_.ep ? layout_.ep->backend() : comm::default_backend(), exec_);
    moe_y_ = alloc<T>("moe.y", N * C);
    if (cfg_.moe.shared_ffn > 0) moe_dx_ = alloc<T>("moe.shared_dx", N * C);
  }
  if (layout_.cp && layout_.cp->size() > 1) {
    // Context parallelism: this rank's T_ rows sit at layout_.positions of each sequence.
    const auto& pos = layout_.positions;
    MESHTRAIN_CHECK(pos.size() == static_cast<std::size_t>(T_), "model: ", pos.size(),
                    " positions for ", T_, " rows per sequence");
    int hi = 0;
    for (int p : pos) hi = std::max(hi, p);
    MESHTRAIN_CONFIG_CHECK(hi < cfg_.block_size, "train.seq_len=", hi + 1,
                           " must be at most model.block_size=", cfg_.block_size);
    positions_ = alloc<std::int32_t>("model.positions", pos.size());
    auto h = Kokkos::create_mirror_view(positions_);
    for (std::size_t t = 0; t < pos.size(); ++t) h(t) = pos[t];
    Kokkos::deep_copy(positions_, h);
    ring_ = std::make_unique<RingAttention<T>>(*layout_.cp, layout_.cp_comm, B_, T_, NHl_, NKVl_,
                                               HS_, exec_);
  }
  if (cfg_.positions == Positions::rotary)
    rope_ = ring_ ? kernels::rope_table(exec_, layout_.positions, HS_, cfg_.rope)
                  : kernels::rope_table(exec_, T_, HS_, cfg_.rope);
  if (layout_.recompute) shared_acts_ = std::make_unique<BlockActivations<T>>(shape_of(-1));
  const int n_chunks = static_cast<int>(layout_.chunks.size());
  for (int c = 0; c < n_chunks; ++c) {
    auto ca = std::make_unique<ChunkActivations<T>>();
    ca->range = layout_.chunks[static_cast<std::size_t>(c)];
    MESHTRAIN_CONFIG_CHECK(ca->range.last > ca->range.first, "model chunk ", c,
                           " holds no transformer block");
    ca->embed = c == 0 && layout_.has_embedding;
    ca->head = c == n_chunks - 1 && layout_.has_head;
    for (int s = 0; s < slots(c); ++s) {
      auto owned = std::make_unique<SlotActivations<T>>();
      SlotActivations<T>& sa = *owned;
      sa.input = alloc<T>("act.chunk_input", Nl * C);
      for (int l = ca->range.first; l < ca->range.last; ++l) {
        sa.block_out.push_back(alloc<T>("act.block_out", Nl * C));
        if (!layout_.recompute) {
          sa.acts.push_back(std::make_unique<BlockActivations<T>>(shape_of(l)));
          if (share_mlp_act && !cfg_.moe.is_moe_layer(l)) sa.acts.back()->fch_gelu = shared_mlp_act_;
        }
      }
      if (ca->head) sa.dhead = alloc<T>("act.dhead", Nl * C);
      ca->slots.push_back(std::move(owned));
    }
    chunks_.push_back(std::move(ca));
  }
  if (layout_.has_head) {
    lnf_ = alloc<T>("act.lnf", N * C);
    lnf_mean_ = alloc<float>("act.lnf_mean", Nl);
    lnf_rstd_ = alloc<float>("act.lnf_rstd", Nl);
    head_rows_ = head_chunk_rows(layout_.head_chunk_rows, N_, Vl_, sizeof(T));
    logits_ = alloc<T>("act.logits", static_cast<std::size_t>(head_rows_) * Vl_);
    losses_ = alloc<float>("act.losses", N);
    if (tp_active()) {
      ce_max_ = alloc<float>("act.ce_max", N);
      ce_sums_ = alloc<float>("act.ce_sums", 2 * N);
    }
  }
  dres_ = alloc<T>("grad.dres", Nl * C);
  dln_ = alloc<T>("grad.dln", N * C);
  dqkv_ = alloc<T>("grad.dqkv", N * (QW_ + 2 * KW_));
  datty_ = alloc<T>("grad.datty", N * QW_);
  if (any_dense) dfch_ = alloc<T>("grad.dfch", N * shape.FW);
  if (swiglu && any_dense) dh_ = alloc<T>("grad.dh", N * Il_);
  if (cfg_.qkv_bias) qkv_b_ = alloc<T>("act.qkv_bias", static_cast<std::size_t>(QW_ + 2 * KW_));
  if (reg_.kv_replicated() && P > 1)
    kv_dw_ = alloc<T>("tp.kv_dw", 2 * static_cast<std::size_t>(cfg_.kv_heads()) * HS_ *
                                      (C + (cfg_.qkv_bias ? 1 : 0)));
  if (tp_active()) {
    partial_ = alloc<T>("tp.partial", N * C);
    proj_out_ = alloc<T>("tp.proj_out", Nl * C);
  }
  if (layout_.sequence_parallel && P > 1) {
    dln_local_ = alloc<T>("sp.dln_local", Nl * C);
    dres_full_ = alloc<T>("sp.dres_full", N * C);
    ln_local_ = alloc<T>("sp.ln_local", Nl * C);
    ln_dw_ = alloc<T>("sp.ln_dw", C);
    if (cfg_.norm == Norm::layernorm) ln_db_ = alloc<T>("sp.ln_db", C);
  }
  loss_sum_ = Scalar<float>("meshtrain::loss_sum");
}

template <class T>
GptT<T>::~GptT() = default;

template <class T>
int GptT<T>::slots(int c) const {
  return layout_.chunk_slots.empty() ? layout_.n_slots
                                     : layout_.chunk_slots[static_cast<std::size_t>(c)];
}

template <class T>
std::size_t GptT<T>::activation_elems() const {
  return static_cast<std::size_t>(Nl_) * cfg_.n_embd;
}

template <class T>
std::size_t GptT<T>::activation_bytes() const {
  std::size_t n = shared_acts_ ? shared_acts_->bytes() : 0;
  n += shared_mlp_act_.span() * sizeof(T);
  for (const auto& ca : chunks_)
    for (const auto& sp : ca->slots) {
      const SlotActivations<T>& s = *sp;
      n += (s.input.span() + s.dhead.span()) * sizeof(T) + s.tokens.span() * 4;
      for (const auto& v : s.block_out) n += v.span() * sizeof(T);
      for (const auto& a : s.acts) n += a->bytes();
    }
  return n;
}

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
  if (grads_.span() > 0) Kokkos::deep_copy(exec_, grads_, T(0.0f));
}

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
