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
                                     bool has_head)
    : ParameterRegistry(cfg, tp_rank, tp_size, stage, {LayerRange{first_layer, last_layer}},
                        has_embedding, has_head) {}

ParameterRegistry::ParameterRegistry(const GptConfig& cfg, int tp_rank, int tp_size, int stage,
                                     const std::vector<LayerRange>& chunks, bool has_embedding,
                                     bool has_head)
    : cfg_(cfg),
      tp_rank_(tp_rank),
      tp_size_(tp_size),
      stage_(stage),
      has_embedding_(has_embedding),
      has_head_(has_head) {
  build(chunks);
}

void ParameterRegistry::build(const std::vector<LayerRange>& chunks) {
  const std::int64_t C = cfg_.n_embd, Vp = cfg_.padded_vocab(), T = cfg_.block_size;
  MESHTRAIN_CONFIG_CHECK(cfg_.n_head % tp_size_ == 0, "mesh.tp=", tp_size_,
                         " must divide model.n_head=", cfg_.n_head,
                         " (attention heads are split across tensor-parallel ranks)");
  layer_unit_.assign(static_cast<std::size_t>(cfg_.n_layer), -1);
  auto open_unit = [&](std::string name, int layer) {
    UnitInfo u;
    u.name = std::move(name);
    u.layer = layer;
    u.begin = (total_ + kAlign - 1) / kAlign * kAlign;
    units_.push_back(u);
  };
  auto close_unit = [&]() { units_.back().end = total_; };
  // The first stage embeds; the last stage holds a copy of wte for the tied LM head.
  if (has_embedding_ || has_head_) {
    embedding_unit_ = static_cast<int>(units_.size());
    open_unit("embedding", -1);
    add("transformer.wte.weight", {Vp, C}, Split::rows, -1, true);
    if (has_embedding_) add("transformer.wpe.weight", {T, C}, Split::replicated, -1, true);
    close_unit();
  }
  int prev_last = -1;
  for (const auto& ch : chunks) {
    MESHTRAIN_CHECK(ch.first >= 0 && ch.first <= ch.last && ch.last <= cfg_.n_layer &&
                        ch.first >= prev_last,
                    "registry: bad layer range [", ch.first, ", ", ch.last, ")");
    prev_last = ch.last;
    for (int l = ch.first; l < ch.last; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      layer_unit_[static_cast<std::size_t>(l)] = static_cast<int>(units_.size());
      open_unit("transformer.h." + std::to_string(l), l);
      // Within a block: weights that decay first, then biases and LayerNorm, so AdamW covers a
      // block in two contiguous ranges.
      add(p + "attn.c_attn.weight", {C, 3 * C}, Split::qkv_cols, l, true);
      add(p + "attn.c_proj.weight", {C, C}, Split::rows, l, true);
      add(p + "mlp.c_fc.weight", {C, 4 * C}, Split::cols, l, true);
      add(p + "mlp.c_proj.weight", {4 * C, C}, Split::rows, l, true);
      add(p + "ln_1.weight", {C}, Split::replicated, l, false);
      add(p + "ln_1.bias", {C}, Split::replicated, l, false);
      add(p + "attn.c_attn.bias", {3 * C}, Split::qkv_cols, l, false);
      add(p + "attn.c_proj.bias", {C}, Split::replicated, l, false);
      add(p + "ln_2.weight", {C}, Split::replicated, l, false);
      add(p + "ln_2.bias", {C}, Split::replicated, l, false);
      add(p + "mlp.c_fc.bias", {4 * C}, Split::cols, l, false);
      add(p + "mlp.c_proj.bias", {C}, Split::replicated, l, false);
      close_unit();
    }
  }
  if (has_head_) {
    head_unit_ = static_cast<int>(units_.size());
    open_unit("head", -1);
    add("transformer.ln_f.weight", {C}, Split::replicated, -1, false);
    add("transformer.ln_f.bias", {C}, Split::replicated, -1, false);
    close_unit();
  }
}

int ParameterRegistry::unit_of_layer(int layer) const {
  MESHTRAIN_CHECK(layer >= 0 && layer < cfg_.n_layer && layer_unit_[layer] >= 0, "block ", layer,
                  " is not held by this rank");
  return layer_unit_[static_cast<std::size_t>(layer)];
}

bool ParameterRegistry::counts_in_norm(const ParamInfo& p) const {
  if (p.split == Split::replicated && tp_rank_ != 0) return false;
  if (p.name == "transformer.wte.weight" && !has_embedding_) return false;
  return true;
}

void ParameterRegistry::add(std::string name, std::vector<std::int64_t> shape, Split split,
                            int layer, bool decay) {
  ParamInfo p;
  p.name = std::move(name);
  p.global_shape = shape;
  p.local_shape = shape;
  p.split = split;
  p.layer = layer;
  p.stage = stage_;
  p.decay = decay;
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
