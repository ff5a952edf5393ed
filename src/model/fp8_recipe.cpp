// The FP8 recipe's pure policies (model/fp8_recipe.hpp).
#include "meshtrain/model/fp8_recipe.hpp"

#include <cstring>

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

double fp8_flops_share(const GptConfig& cfg, const Fp8Recipe& recipe, int seq_len) {
  if (!recipe.enabled) return 0.0;
  const double C = cfg.n_embd, I = cfg.mlp_width();
  const double Q = static_cast<double>(cfg.n_head) * cfg.head_size();
  const double KV = static_cast<double>(cfg.kv_heads()) * cfg.head_size();
  const double attn = C * (Q + 2 * KV) + Q * C;                      // q/k/v, o
  const double mlp = (cfg.mlp == Mlp::swiglu ? 3.0 : 2.0) * C * I;  // gate/up, down; fc, proj
  // A token's experts: top_k of them and the shared one, forward and input gradient in FP8
  // (their weight gradients stay in the model's type: moe/grouped_gemm.hpp's ExpertFp8).
  const double per_matrix = cfg.mlp == Mlp::swiglu ? 3.0 : 2.0;
  const double experts = per_matrix * C *
                         (double(cfg.moe.top_k) * cfg.expert_width() + cfg.moe.shared_ffn);
  double weights = 0, expert_weights = 0;
  for (int l = 0; l < cfg.n_layer; ++l) {
    if (!recipe.fp8_block(l, cfg.n_layer)) continue;
    weights += attn;
    if (cfg.moe.is_moe_layer(l))
      expert_weights += recipe.experts ? experts : 0.0;
    else
      weights += mlp;
  }
  const double per_weight = recipe.wgrad_bf16 ? 4.0 : 6.0;
  return (per_weight * weights + 4.0 * expert_weights) / cfg.flops_per_token(seq_len);
}

kernels::Fp8Scaling parse_fp8_recipe(const std::string& text, const char* option) {
  if (text == "tensorwise") return kernels::Fp8Scaling::tensorwise;
  if (text == "rowwise") return kernels::Fp8Scaling::rowwise;
  throw ConfigError(cat(option, "='", text, "' is not one of tensorwise, rowwise"));
}

int tp_split_dim(TpSplit split, kernels::Fp8WeightLayout layout, const char* tensor) {
  const bool out_in = layout == kernels::Fp8WeightLayout::out_in;
  const auto is = [&](const char* name) { return std::strcmp(tensor, name) == 0; };
  if (split == TpSplit::column) {  // output features split
    if (is("weight")) return out_in ? 0 : 1;
    if (is("dout")) return 1;
    return -1;  // inp: every column on every rank
  }
  // row parallel: input features split
  if (is("weight")) return out_in ? 1 : 0;
  if (is("inp")) return 1;
  return -1;  // dout: every column on every rank
}

bool agree_over_tp(TpSplit split, kernels::Fp8WeightLayout layout, const kernels::Fp8Cast& cast) {
  const int dim = tp_split_dim(split, layout, cast.tensor);
  return dim >= 0 && (cast.scaling == kernels::Fp8Scaling::tensorwise || dim == cast.k_dim);
}

bool agree_over_cp(const kernels::Fp8Cast& cast) {
  if (std::strcmp(cast.tensor, "weight") == 0) return false;
  return cast.scaling == kernels::Fp8Scaling::tensorwise || cast.k_dim == 0;
}

}  // namespace meshtrain::model
