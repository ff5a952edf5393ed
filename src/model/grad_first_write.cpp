#include "meshtrain/model/grad_first_write.hpp"

#include <algorithm>
#include <string>

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

bool grad_first_written(const ParameterRegistry& reg, const ParamInfo& p) {
  // The LM head's weight (lm_head, or the tied embedding where this rank holds the head): one
  // GEMM per row chunk writes all of this rank's vocabulary rows (gpt_head.cpp).
  if (reg.has_head() && p.name == reg.head_weight_name()) return true;
  if (p.layer < 0) return false;  // embeddings (scatter-add), final norm
  const std::string prefix = reg.block_prefix(p.layer);
  if (p.name.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string local = p.name.substr(prefix.size());
  // The block linears' weights (gpt2_block.cpp, llama_block.cpp; FP8: gpt_fp8.cpp): one GEMM
  // each per micro-batch over the whole local weight. MoE blocks have these attention
  // linears too; their MLP parameters have other names and are not listed.
  if (reg.config().is_gpt2())
    return local == "attn.c_attn.weight" || local == "attn.c_proj.weight" ||
           local == "mlp.c_fc.weight" || local == "mlp.c_proj.weight";
  if (local == "self_attn.k_proj.weight" || local == "self_attn.v_proj.weight")
    return !reg.kv_replicated();  // replicated: added from a tp-summed scratch
  return local == "self_attn.q_proj.weight" || local == "self_attn.o_proj.weight" ||
         local == "mlp.gate_proj.weight" || local == "mlp.up_proj.weight" ||
         local == "mlp.down_proj.weight";
}

GradFirstWrite::GradFirstWrite(const ParameterRegistry& reg) {
  for (const auto& p : reg.params())
    if (p.numel > 0 && grad_first_written(reg, p))
      params_.push_back({p.offset, p.offset + p.numel});
  std::sort(params_.begin(), params_.end(),
            [](const GradRange& a, const GradRange& b) { return a.begin < b.begin; });
  fresh_.assign(params_.size(), 0);
  std::size_t at = 0;
  for (const auto& r : params_) {
    if (r.begin > at) zero_.push_back({at, r.begin});
    at = r.end;
  }
  if (reg.size() > at) zero_.push_back({at, reg.size()});
}

std::size_t GradFirstWrite::zero_elems() const {
  std::size_t n = 0;
  for (const auto& r : zero_) n += r.size();
  return n;
}

void GradFirstWrite::arm() {
  std::fill(fresh_.begin(), fresh_.end(), 1);
  unwritten_ = params_.size();
}

void GradFirstWrite::disarm() {
  std::fill(fresh_.begin(), fresh_.end(), 0);
  unwritten_ = 0;
}

float GradFirstWrite::claim(std::size_t offset, std::size_t n) {
  if (unwritten_ == 0 || n == 0) return 1.0f;
  const std::size_t end = offset + n;
  // The first parameter ending after offset, then every one that starts before end.
  auto it = std::upper_bound(params_.begin(), params_.end(), offset,
                             [](std::size_t o, const GradRange& r) { return o < r.end; });
  for (; it != params_.end() && it->begin < end; ++it) {
    const std::size_t i = static_cast<std::size_t>(it - params_.begin());
    if (!fresh_[i]) continue;
    MESHTRAIN_CHECK(it->begin == offset && it->end == end,
                    "GradFirstWrite::claim: a write of gradient elements [", offset, ", ", end,
                    ") overlaps [", it->begin, ", ", it->end,
                    "), a first-written gradient not yet written this step, without covering "
                    "exactly it");
    fresh_[i] = 0;
    --unwritten_;
    return 0.0f;
  }
  return 1.0f;
}

std::vector<GradRange> GradFirstWrite::take_unwritten(std::size_t begin, std::size_t end) {
  std::vector<GradRange> out;
  if (unwritten_ == 0) return out;
  auto it = std::upper_bound(params_.begin(), params_.end(), begin,
                             [](std::size_t o, const GradRange& r) { return o < r.end; });
  for (; it != params_.end() && it->begin < end; ++it) {
    const std::size_t i = static_cast<std::size_t>(it - params_.begin());
    if (!fresh_[i]) continue;
    MESHTRAIN_CHECK(it->begin >= begin && it->end <= end,
                    "GradFirstWrite::take_unwritten: [", begin, ", ", end, ") cuts the unwritten "
                    "gradient [", it->begin, ", ", it->end, ")");
    fresh_[i] = 0;
    --unwritten_;
    out.push_back(*it);
  }
  return out;
}

}  // namespace meshtrain::model
