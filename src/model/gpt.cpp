// GptT: construction (the local shapes of this rank's share of the model, the tp region, the
// activations of every chunk and slot, the head's and the backward's scratch) and the size of
// what it keeps. Parameters are in gpt_parameters.cpp, the chunk/slot dispatch of forward and
// backward in gpt_dispatch.cpp, the embedding and head in gpt_head.cpp, the blocks in
// gpt2_block.cpp / llama_block.cpp / moe_block.cpp, built from the parallel parts of
// gpt_parallel.cpp over the tp region (tp_region.cpp).
#include "meshtrain/model/gpt.hpp"

#include <algorithm>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

template <class T>
BlockActivations<T>::BlockActivations(const BlockShape& s) {
  const std::size_t N = s.N, Nl = s.Nl, C = s.C;
  const auto kept = [&](View1<std::uint8_t>& bytes, kernels::Fp8Tensor& t, const char* label,
                        int cols) {
    bytes = alloc<std::uint8_t>(label, kernels::fp8_kept_bytes(s.N, cols));
    t = kernels::fp8_kept_tensor(bytes, s.N, cols, Fp8Format::e4m3);
  };
  const bool keep_mlp = s.fp8_keep && s.dense;
  if (s.fp8_keep)
    kept(ln1_t_bytes, ln1_t, "act.ln1_fp8t", s.C);
  else
    ln1 = alloc<T>("act.ln1", N * C);
  if (s.norm_mean) ln1_mean = alloc<float>("act.ln1_mean", Nl);
  ln1_rstd = alloc<float>("act.ln1_rstd", Nl);
  qkv = alloc<T>("act.qkv", N * (s.QW + 2 * s.KW));
  atty = alloc<T>("act.atty", N * s.QW);
  lse = alloc<float>("act.lse", static_cast<std::size_t>(s.B) * s.NHl * s.T);
  res2 = alloc<T>("act.res2", Nl * C);
  if (keep_mlp)
    kept(ln2_t_bytes, ln2_t, "act.ln2_fp8t", s.C);
  else
    ln2 = alloc<T>("act.ln2", N * C);
  if (s.norm_mean) ln2_mean = alloc<float>("act.ln2_mean", Nl);
  ln2_rstd = alloc<float>("act.ln2_rstd", Nl);
  if (s.dense) {
    fch = alloc<T>("act.fch", N * s.FW);
    if (s.own_mlp_act && keep_mlp)
      kept(fch_gelu_t_bytes, fch_gelu_t, "act.fch_gelu_fp8t", s.HW);
    else if (s.own_mlp_act)
      fch_gelu = alloc<T>("act.fch_gelu", N * s.HW);
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
  for (const auto* v : {&ln1_t_bytes, &ln2_t_bytes, &fch_gelu_t_bytes}) n += v->span();
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
           ep_size_of(layout)),
      first_write_(reg_) {
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
  tp_ = TpRegion<T>(layout_.tp, layout_.sequence_parallel, static_cast<std::size_t>(N_),
                    static_cast<std::size_t>(cfg_.n_embd), cfg_.norm == Norm::layernorm);
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
  bool any_moe = false, any_dense = false, fused_grad_amax = false, weight_scales = false;
  for (const auto& ch : layout_.chunks)
    for (int l = ch.first; l < ch.last; ++l) {
      (cfg_.moe.is_moe_layer(l) ? any_moe : any_dense) = true;
      weight_scales = weight_scales || layout_.fp8.keeps_weight_scale(l, cfg_.n_layer);
      if (!cfg_.moe.is_moe_layer(l)) {
        fused_grad_amax = fused_grad_amax || layout_.fp8.fuses_grad_amax(l, cfg_.n_layer);
        continue;
      }
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
    b.fp8_keep = l >= 0 && fp8_keeps_inputs(l);
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
    // The sequence's length, not this rank's last position: every cp rank names the same value
    // (rank 0 holds the last chunk; the others' rows end earlier).
    const int seq_len = T_ * layout_.cp->size();
    MESHTRAIN_CONFIG_CHECK(hi < cfg_.block_size, "train.seq_len=", seq_len,
                           " must be at most model.block_size=", cfg_.block_size, " (mesh.cp=",
                           layout_.cp->size(), " splits it, ", T_, " rows per rank)");
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
    if (tp_.active()) {
      ce_max_ = alloc<float>("act.ce_max", N);
      ce_sums_ = alloc<float>("act.ce_sums", 2 * N);
    }
  }
  dres_ = alloc<T>("grad.dres", Nl * C);
  dln_ = alloc<T>("grad.dln", N * C);
  dqkv_ = alloc<T>("grad.dqkv", N * (QW_ + 2 * KW_));
  datty_ = alloc<T>("grad.datty", N * QW_);
  if (any_dense) dfch_ = alloc<T>("grad.dfch", N * shape.FW);
  // The MLP's d(activation output): SwiGLU's; GPT-2's under FP8, whose GELU derivative is not an
  // epilogue of the FP8 GEMM.
  if ((swiglu || layout_.fp8.enabled) && any_dense) dh_ = alloc<T>("grad.dh", N * Il_);
  if (fused_grad_amax) fp8_grad_amax_ = alloc<float>("grad.fp8_amax", 2);
  if (weight_scales)
    fp8_weight_scales_ = alloc<float>("fp8.weight_scales", std::size_t(cfg_.n_layer) *
                                                               kFp8WeightSlots *
                                                               kernels::kFp8WeightScaleFloats);
  if (cfg_.qkv_bias) qkv_b_ = alloc<T>("act.qkv_bias", static_cast<std::size_t>(QW_ + 2 * KW_));
  if (reg_.kv_replicated() && P > 1)
    kv_dw_ = alloc<T>("tp.kv_dw", 2 * static_cast<std::size_t>(cfg_.kv_heads()) * HS_ *
                                      (C + (cfg_.qkv_bias ? 1 : 0)));
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
