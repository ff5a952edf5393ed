// The FP8 recipe's pure policies (model/fp8_recipe.hpp).
#include "meshtrain/model/fp8_recipe.hpp"

#include <cstring>

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

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
