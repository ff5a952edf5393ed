#include "meshtrain/io/hf_mixtral.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::io {

void check_mixtral_expressible(const model::GptConfig& c, const std::string& where) {
  const model::MoeConfig& m = c.moe;
  const std::string w = where.empty() ? "" : cat(" (", where, ")");
  auto refuse = [&](bool bad, const std::string& what) {
    MESHTRAIN_CONFIG_CHECK(!bad, "a HuggingFace folder of this Mixture-of-Experts model cannot "
                                 "be written", w, ": ", what);
  };
  refuse(c.is_gpt2(), cat("model.family=gpt2 has GELU experts; the one HuggingFace MoE family "
                          "meshtrain writes is Mixtral (model.family=llama, SwiGLU experts)"));
  refuse(c.qkv_bias, "model.qkv_bias: MixtralForCausalLM has no attention biases");
  refuse(m.layer_freq != 1, cat("moe.layer_freq=", m.layer_freq, ": every Mixtral block is an "
                                "MoE block (moe.layer_freq=1)"));
  refuse(m.shared_ffn > 0, cat("moe.shared_expert_size=", m.shared_ffn,
                               ": Mixtral has no shared expert"));
  refuse(m.router_score != "softmax", cat("moe.router_score=", m.router_score,
                                          ": Mixtral's router is softmax, top-k, renormalised"));
  refuse(m.top_k < 2, cat("moe.top_k=", m.top_k, ": Mixtral renormalises the chosen "
                          "probabilities, so its one choice weighs 1; meshtrain's top-1 weighs "
                          "it by its probability (Switch)"));
  refuse(m.capacity_factor > 0,
         cat("moe.capacity_factor=", m.capacity_factor, ": Mixtral is dropless, so the folder "
             "would compute another function than the model that was trained with drops "
             "(train without moe.capacity_factor)"));
}

namespace {

// Which MoE tensor a registry parameter is: the router (expert -1), an expert's w_in or w_out.
struct MoeSlot {
  bool moe = false, router = false, w_in = false;
  int expert = -1;
};

MoeSlot moe_slot(const model::ParameterRegistry& reg, const model::ParamInfo& p) {
  MoeSlot s;
  if (p.layer < 0 || !reg.config().moe.is_moe_layer(p.layer)) return s;
  const std::string b = reg.block_prefix(p.layer);
  if (p.name == b + "mlp.router.weight") {
    s.moe = s.router = true;
    return s;
  }
  const std::string e = b + "mlp.experts.";
  if (p.name.rfind(e, 0) != 0) return s;
  const std::size_t dot = p.name.find('.', e.size());
  MESHTRAIN_CHECK(dot != std::string::npos, "hf_parts: unexpected expert name ", p.name);
  s.expert = std::stoi(p.name.substr(e.size(), dot - e.size()));
  const std::string w = p.name.substr(dot + 1);
  MESHTRAIN_CHECK(w == "w_in" || w == "w_out", "hf_parts: unexpected expert tensor ", p.name);
  s.moe = true;
  s.w_in = w == "w_in";
  return s;
}

}  // namespace

std::vector<HfPart> hf_parts(const model::ParameterRegistry& reg, const model::ParamInfo& p) {
  const model::GptConfig& c = reg.config();
  const MoeSlot s = moe_slot(reg, p);
  if (!s.moe || c.is_gpt2()) {
    std::vector<std::int64_t> shape = p.global_shape;
    if (p.name == reg.embedding_name() || p.name == reg.head_weight_name())
      shape[0] = c.vocab_size;  // HF holds the real vocabulary rows only
    return {HfPart{p.name, shape, false, 0, -1}};
  }
  const std::int64_t C = c.n_embd, E = c.moe.experts, I = c.expert_width();
  const std::string b = reg.block_prefix(p.layer) + "block_sparse_moe.";
  if (s.router) return {HfPart{b + "gate.weight", {E, C}, true, 0, -1}};
  const std::string e = b + "experts." + std::to_string(s.expert) + ".";
  if (s.w_in)
    return {HfPart{e + "w1.weight", {I, C}, true, 0, -1},
            HfPart{e + "w3.weight", {I, C}, true, I, -1}};
  return {HfPart{e + "w2.weight", {C, I}, true, 0, -1}};
}

std::vector<HfPart> hf_fused_parts(const model::ParameterRegistry& reg,
                                   const model::ParamInfo& p) {
  const model::GptConfig& c = reg.config();
  const MoeSlot s = moe_slot(reg, p);
  if (!s.moe || c.is_gpt2()) return {};
  const std::int64_t C = c.n_embd, E = c.moe.experts, I = c.expert_width();
  const std::string b = reg.block_prefix(p.layer) + "mlp.";
  if (s.router) return {HfPart{b + "gate.weight", {E, C}, true, 0, -1}};
  if (s.w_in) return {HfPart{b + "experts.gate_up_proj", {E, 2 * I, C}, true, 0, s.expert}};
  return {HfPart{b + "experts.down_proj", {E, C, I}, true, 0, s.expert}};
}

namespace {
constexpr std::int64_t kTile = 64;
}

void registry_cols_to_hf(const float* src, std::int64_t R, std::int64_t C, std::int64_t col0,
                         std::int64_t n, float* dst) {
  for (std::int64_t r0 = 0; r0 < R; r0 += kTile)
    for (std::int64_t j0 = 0; j0 < n; j0 += kTile) {
      const std::int64_t r1 = std::min(R, r0 + kTile), j1 = std::min(n, j0 + kTile);
      for (std::int64_t j = j0; j < j1; ++j)
        for (std::int64_t r = r0; r < r1; ++r) dst[j * R + r] = src[r * C + col0 + j];
    }
}

void hf_to_registry_cols(const float* src, std::int64_t R, std::int64_t C, std::int64_t col0,
                         std::int64_t n, float* dst) {
  for (std::int64_t r0 = 0; r0 < R; r0 += kTile)
    for (std::int64_t j0 = 0; j0 < n; j0 += kTile) {
      const std::int64_t r1 = std::min(R, r0 + kTile), j1 = std::min(n, j0 + kTile);
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t j = j0; j < j1; ++j) dst[r * C + col0 + j] = src[j * R + r];
    }
}

}  // namespace meshtrain::io
