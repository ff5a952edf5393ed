#include "meshtrain/model/registry.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

const char* split_name(Split s) {
  switch (s) {
    case Split::replicated: return "replicated";
    case Split::rows: return "rows";
    case Split::cols: return "cols";
    case Split::qkv_cols: return "qkv_cols";
  }
  return "?";
}

const char* param_group_name(ParamGroup g) {
  return g == ParamGroup::dp ? "dp" : "expert_dp";
}

std::int64_t ParamInfo::global_numel() const {
  std::int64_t n = 1;
  for (auto d : global_shape) n *= d;
  return n;
}

std::int64_t ParamInfo::global_index(std::int64_t i, int tp_rank, int /*tp_size*/) const {
  const bool matrix = local_shape.size() == 2;
  return split_global_index(static_cast<int>(split), i, matrix, local_shape[0],
                            matrix ? local_shape[1] : local_shape[0],
                            matrix ? global_shape[1] : global_shape[0], tp_rank);
}

ParameterRegistry::ParameterRegistry(const GptConfig& cfg, int tp_rank, int tp_size, int stage,
                                     int first_layer, int last_layer, bool has_embedding,
                                     bool has_head, int ep_rank, int ep_size)
    : ParameterRegistry(cfg, tp_rank, tp_size, stage, {LayerRange{first_layer, last_layer}},
                        has_embedding, has_head, ep_rank, ep_size) {}

ParameterRegistry::ParameterRegistry(const GptConfig& cfg, int tp_rank, int tp_size, int stage,
                                     const std::vector<LayerRange>& chunks, bool has_embedding,
                                     bool has_head, int ep_rank, int ep_size)
    : cfg_(cfg),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      stage_(stage),
      has_embedding_(has_embedding),
      has_head_(has_head),
      ep_rank_(ep_rank),
      ep_size_(ep_size) {
  MESHTRAIN_CONFIG_CHECK(ep_size_ >= 1 && ep_rank_ >= 0 && ep_rank_ < ep_size_, "mesh.ep=",
                         ep_size_, " (rank ", ep_rank_, ")");
  MESHTRAIN_CONFIG_CHECK(!cfg_.moe.enabled() || cfg_.moe.experts % ep_size_ == 0,
                         "moe.experts=", cfg_.moe.experts, " is not divisible by mesh.ep=",
                         ep_size_, " (each expert-parallel rank holds moe.experts / mesh.ep "
                         "whole experts)");
  build(chunks);
}

void ParameterRegistry::build(const std::vector<LayerRange>& chunks) {
  const std::int64_t C = cfg_.n_embd, Vp = cfg_.padded_vocab(), T = cfg_.block_size;
  const bool gpt2 = cfg_.is_gpt2();
  MESHTRAIN_CONFIG_CHECK(cfg_.n_head % tp_size_ == 0, "mesh.tp=", tp_size_,
                         " must divide model.n_head=", cfg_.n_head,
                         " (attention heads are split across tensor-parallel ranks)");
  // Key-value heads: split by heads when there are at least tp of them, else every rank holds
  // them all and uses the one its query heads read (which needs tp a multiple of n_kv_head, so
  // that no rank's query heads straddle two key-value heads).
  const int KV = cfg_.kv_heads();
  kv_replicated_ = KV < tp_size_;
  if (kv_replicated_) {
    MESHTRAIN_CONFIG_CHECK(tp_size_ % KV == 0, "mesh.tp=", tp_size_, " must be a multiple of "
                           "model.n_kv_head=", KV, " when it exceeds it (a rank's query heads "
                           "must share one key-value head)");
    kv_local_ = 1;
    kv_first_ = tp_rank_ / (tp_size_ / KV);
  } else {
    MESHTRAIN_CONFIG_CHECK(KV % tp_size_ == 0, "mesh.tp=", tp_size_,
                           " must divide model.n_kv_head=", KV,
                           " (key-value heads are split across tensor-parallel ranks)");
    kv_local_ = KV / tp_size_;
    kv_first_ = tp_rank_ * kv_local_;
  }
  wte_name_ = gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight";
  head_w_name_ = cfg_.tied_head ? wte_name_ : "lm_head.weight";
  layer_unit_.assign(static_cast<std::size_t>(cfg_.n_layer), -1);
  expert_unit_.assign(static_cast<std::size_t>(cfg_.n_layer), -1);
  auto open_unit = [&](std::string name, int layer) {
    UnitInfo u;
    u.name = std::move(name);
    u.layer = layer;
    u.begin = (total_ + kAlign - 1) / kAlign * kAlign;
    units_.push_back(u);
  };
  auto close_unit = [&]() { units_.back().end = total_; };
  // The first stage embeds; with a tied head the last stage holds a copy of the embedding.
  if (has_embedding_ || (has_head_ && cfg_.tied_head)) {
    embedding_unit_ = static_cast<int>(units_.size());
    open_unit("embedding", -1);
    add(wte_name_, {Vp, C}, Split::rows, -1, true, Init::normal);
    if (has_embedding_ && cfg_.positions == Positions::learned)
      add("transformer.wpe.weight", {T, C}, Split::replicated, -1, true, Init::normal);
    close_unit();
  }
  int prev_last = -1;
  for (const auto& ch : chunks) {
    MESHTRAIN_CHECK(ch.first >= 0 && ch.first <= ch.last && ch.last <= cfg_.n_layer &&
                        ch.first >= prev_last,
                    "registry: bad layer range [", ch.first, ", ", ch.last, ")");
    prev_last = ch.last;
    for (int l = ch.first; l < ch.last; ++l) {
      const std::string p = block_prefix(l);
      layer_unit_[static_cast<std::size_t>(l)] = static_cast<int>(units_.size());
      open_unit(p.substr(0, p.size() - 1), l);
      if (gpt2) add_gpt2_block(l);
      else add_llama_block(l);
      if (cfg_.moe.is_moe_layer(l)) add_moe(l);
      close_unit();
      if (cfg_.moe.is_moe_layer(l)) {
        expert_unit_[static_cast<std::size_t>(l)] = static_cast<int>(units_.size());
        open_unit(p + "mlp.experts", l);
        units_.back().group = ParamGroup::expert_dp;
        add_experts(l);
        close_unit();
      }
    }
  }
  if (has_head_) {
    head_unit_ = static_cast<int>(units_.size());
    open_unit("head", -1);
    if (gpt2) {
      add("transformer.ln_f.weight", {C}, Split::replicated, -1, false, Init::ones);
      add("transformer.ln_f.bias", {C}, Split::replicated, -1, false, Init::zeros);
    } else {
      add("model.norm.weight", {C}, Split::replicated, -1, false, Init::ones);
    }
    if (!cfg_.tied_head) add(head_w_name_, {Vp, C}, Split::rows, -1, true, Init::normal);
    close_unit();
  }
}

std::string ParameterRegistry::block_prefix(int layer) const {
  return (cfg_.is_gpt2() ? "transformer.h." : "model.layers.") + std::to_string(layer) + ".";
}

void ParameterRegistry::add_gpt2_block(int l) {
  const std::int64_t C = cfg_.n_embd, I = cfg_.mlp_width();
  const std::string p = block_prefix(l);
  // Within a block: weights that decay first, then biases and LayerNorm, so AdamW covers a
  // block in two contiguous ranges.
  add(p + "attn.c_attn.weight", {C, 3 * C}, Split::qkv_cols, l, true, Init::normal);
  add(p + "attn.c_proj.weight", {C, C}, Split::rows, l, true, Init::residual);
  const bool dense = !cfg_.moe.is_moe_layer(l);  // an MoE block's MLP is its experts
  if (dense) {
    add(p + "mlp.c_fc.weight", {C, I}, Split::cols, l, true, Init::normal);
    add(p + "mlp.c_proj.weight", {I, C}, Split::rows, l, true, Init::residual);
  }
  add(p + "ln_1.weight", {C}, Split::replicated, l, false, Init::ones);
  add(p + "ln_1.bias", {C}, Split::replicated, l, false, Init::zeros);
  add(p + "attn.c_attn.bias", {3 * C}, Split::qkv_cols, l, false, Init::zeros);
  add(p + "attn.c_proj.bias", {C}, Split::replicated, l, false, Init::zeros);
  add(p + "ln_2.weight", {C}, Split::replicated, l, false, Init::ones);
  add(p + "ln_2.bias", {C}, Split::replicated, l, false, Init::zeros);
  if (dense) {
    add(p + "mlp.c_fc.bias", {I}, Split::cols, l, false, Init::zeros);
    add(p + "mlp.c_proj.bias", {C}, Split::replicated, l, false, Init::zeros);
  }
}

// The router [C, E] and the shared expert, replicated over tp (experts are not tensor-parallel,
// docs/moe.md), reduced over dp like every dense parameter.
void ParameterRegistry::add_moe(int l) {
  const std::int64_t C = cfg_.n_embd, E = cfg_.moe.experts, S = cfg_.moe.shared_ffn;
  const std::string p = block_prefix(l);
  const Init out_init = cfg_.is_gpt2() ? Init::residual : Init::normal;
  add(p + "mlp.router.weight", {C, E}, Split::replicated, l, true, Init::normal);
  if (S > 0) {
    const std::int64_t W = cfg_.mlp == Mlp::swiglu ? 2 * S : S;
    add(p + "mlp.shared_expert.w_in", {C, W}, Split::replicated, l, true, Init::normal);
    add(p + "mlp.shared_expert.w_out", {S, C}, Split::replicated, l, true, out_init);
  }
}

std::string ParameterRegistry::expert_prefix(int layer, int e) const {
  return block_prefix(layer) + "mlp.experts." + std::to_string(e) + ".";
}

// This rank's experts, whole (replicated over tp), each its own global tensor, so that any
// mesh.ep reads them back by name. Reduced and sharded over the expert-data-parallel group.
void ParameterRegistry::add_experts(int l) {
  const std::int64_t C = cfg_.n_embd, I = cfg_.expert_width();
  const std::int64_t W = cfg_.mlp == Mlp::swiglu ? 2 * I : I;
  const Init out_init = cfg_.is_gpt2() ? Init::residual : Init::normal;
  const int e0 = first_expert(), n = local_experts();
  for (int which = 0; which < 2; ++which)
    for (int e = e0; e < e0 + n; ++e) {
      const std::string q = expert_prefix(l, e);
      if (which == 0) add(q + "w_in", {C, W}, Split::replicated, l, true, Init::normal);
      else add(q + "w_out", {I, C}, Split::replicated, l, true, out_init);
      params_.back().grad_group = params_.back().state_group = ParamGroup::expert_dp;
    }
}

int ParameterRegistry::expert_unit_of_layer(int layer) const {
  if (layer < 0 || layer >= cfg_.n_layer) return -1;
  return expert_unit_[static_cast<std::size_t>(layer)];
}

std::size_t ParameterRegistry::expert_stride(int layer, bool w_in) const {
  const int n = local_experts(), e0 = first_expert();
  const char* w = w_in ? "w_in" : "w_out";
  const ParamInfo& a = get(expert_prefix(layer, e0) + w);
  if (n == 1) return a.numel;
  const std::size_t stride = get(expert_prefix(layer, e0 + 1) + w).offset - a.offset;
  for (int e = 2; e < n; ++e)
    MESHTRAIN_CHECK(get(expert_prefix(layer, e0 + e) + w).offset - a.offset == e * stride,
                    "registry: experts of block ", layer, " are not evenly spaced");
  return stride;
}

// HF LlamaDecoderLayer's names and nn.Linear shapes [out, in]; HF's init (_init_weights: every
// linear N(0, initializer_range = 0.02), RMSNorm weights 1). Weights first (decay), then norms.
void ParameterRegistry::add_llama_block(int l) {
  const std::int64_t C = cfg_.n_embd, I = cfg_.mlp_width(), HS = cfg_.head_size();
  const std::int64_t Q = cfg_.n_head * HS, KV = cfg_.kv_heads() * HS;
  const Split kv = kv_replicated_ ? Split::replicated : Split::rows;
  const std::string p = block_prefix(l);
  add(p + "self_attn.q_proj.weight", {Q, C}, Split::rows, l, true, Init::normal);
  add(p + "self_attn.k_proj.weight", {KV, C}, kv, l, true, Init::normal);
  add(p + "self_attn.v_proj.weight", {KV, C}, kv, l, true, Init::normal);
  add(p + "self_attn.o_proj.weight", {C, Q}, Split::cols, l, true, Init::normal);
  if (!cfg_.moe.is_moe_layer(l)) {  // an MoE block's MLP is its experts
    add(p + "mlp.gate_proj.weight", {I, C}, Split::rows, l, true, Init::normal);
    add(p + "mlp.up_proj.weight", {I, C}, Split::rows, l, true, Init::normal);
    add(p + "mlp.down_proj.weight", {C, I}, Split::cols, l, true, Init::normal);
  }
  add(p + "input_layernorm.weight", {C}, Split::replicated, l, false, Init::ones);
  add(p + "post_attention_layernorm.weight", {C}, Split::replicated, l, false, Init::ones);
  if (cfg_.qkv_bias) {
    // Qwen2: split as their weights' rows (heads). A vector's one dimension splits as
    // Split::cols, as GPT-2's c_fc.bias (split_global_index reads rows as a matrix's). HF
    // initialises biases to zero.
    const Split kv_b = kv_replicated_ ? Split::replicated : Split::cols;
    add(p + "self_attn.q_proj.bias", {Q}, Split::cols, l, false, Init::zeros);
    add(p + "self_attn.k_proj.bias", {KV}, kv_b, l, false, Init::zeros);
    add(p + "self_attn.v_proj.bias", {KV}, kv_b, l, false, Init::zeros);
  }
}

int ParameterRegistry::unit_of_layer(int layer) const {
  MESHTRAIN_CHECK(layer >= 0 && layer < cfg_.n_layer && layer_unit_[layer] >= 0, "block ", layer,
                  " is not held by this rank");
  return layer_unit_[static_cast<std::size_t>(layer)];
}

bool ParameterRegistry::counts_in_norm(const ParamInfo& p) const {
  if (p.split == Split::replicated && tp_rank_ != 0) return false;
  if (p.name == wte_name_ && !has_embedding_) return false;  // the last stage's tied copy
  return true;
}

void ParameterRegistry::add(std::string name, std::vector<std::int64_t> shape, Split split,
                            int layer, bool decay, Init init) {
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.local_shape = shape;
  p.split = split;
  p.layer = layer;
  p.stage = stage_;
  p.decay = decay;
  p.init = init;
  if (split != Split::replicated) {
    const std::size_t dim = (split == Split::rows || shape.size() == 1) ? 0 : 1;
    const std::int64_t extent = shape[dim];
    const std::int64_t unit = split == Split::qkv_cols ? 3 : 1;
    MESHTRAIN_CONFIG_CHECK(extent % (unit * tp_size_) == 0, "mesh.tp=", tp_size_,
                           " does not divide dimension ", dim, " (", extent, ") of ", p.name,
                           split == Split::rows && layer < 0 ? " (model.vocab_pad must make the "
                                                               "padded vocab divisible by tp)"
                                                             : "");
    p.local_shape[dim] = extent / tp_size_;
  }
  p.numel = 1;
  for (auto d : p.local_shape) p.numel *= static_cast<std::size_t>(d);
  p.offset = (total_ + kAlign - 1) / kAlign * kAlign;
  total_ = p.offset + p.numel;
  params_.push_back(std::move(p));
}

const ParamInfo* ParameterRegistry::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const ParamInfo& ParameterRegistry::get(const std::string& name) const {
  const ParamInfo* p = find(name);
  if (!p) throw Error(cat("parameter '", name, "' is not in this rank's registry"));
  return *p;
}

std::vector<DecayRange> ParameterRegistry::decay_ranges() const {
  std::vector<DecayRange> out;
  for (const auto& p : params_) out.push_back(DecayRange{p.offset, p.numel, p.decay});
  return out;
}

}  // namespace meshtrain::model
