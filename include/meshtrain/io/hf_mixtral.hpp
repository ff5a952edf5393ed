#pragma once
// HuggingFace MixtralForCausalLM (model_type mixtral): meshtrain's Llama family with MoE blocks
// in every layer, SwiGLU experts without biases and the softmax top-k router renormalised over
// the k chosen experts, which is Mixtral's routing (MixtralSparseMoeBlock / MixtralTopKRouter).
// Attention and norms keep Llama's names; the MoE parts are stored differently from the
// registry (docs/moe.md, "HuggingFace"):
//
//   registry (out = in @ w)                     hub folder (nn.Linear [out, in])
//   <b>mlp.router.weight            [C, E]      <b>block_sparse_moe.gate.weight          [E, C]
//   <b>mlp.experts.<e>.w_in         [C, 2I]     <b>block_sparse_moe.experts.<e>.w1.weight [I, C]
//        columns [0, I): gate, [I, 2I): up      <b>block_sparse_moe.experts.<e>.w3.weight [I, C]
//   <b>mlp.experts.<e>.w_out        [I, C]      <b>block_sparse_moe.experts.<e>.w2.weight [C, I]
//
// so every MoE tensor is a transpose (w1 and w3 of the columns of w_in they fill). That hub
// form is what we write and what transformers 5 writes too: its MixtralExperts hold fused
// parameters (mlp.gate.weight [E, C], mlp.experts.gate_up_proj [E, 2I, C] with gate rows first,
// mlp.experts.down_proj [E, C, I]), converted from the hub form on load
// (conversion_mapping.py: MergeModulelist(dim 0) + Concatenate(dim 1)) and back on save
// (revert_weight_conversion). A folder in the fused form (transformers 5 development versions
// saved that) is read too: w_in is the transpose of gate_up_proj[e], w_out of down_proj[e].
#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::io {

// Whether a model is written as MixtralForCausalLM (a Llama-family model with MoE blocks).
inline bool is_mixtral(const model::GptConfig& c) { return !c.is_gpt2() && c.moe.enabled(); }

// ConfigError naming the option (and `where`: the folder, the checkpoint) unless Mixtral's
// config.json and modeling describe the model: GELU experts (GPT-2 family), q/k/v biases,
// moe.layer_freq != 1, a shared expert, moe.router_score sigmoid, moe.top_k 1 (Mixtral weighs
// its one choice by 1, meshtrain by its probability) and moe.capacity_factor (Mixtral is
// dropless: the folder would compute another function than the model trained) are refused.
// Training-only settings that change no forward value are not: moe.z_loss_coeff and
// moe.router_fp64 are left out of the folder.
void check_mixtral_expressible(const model::GptConfig& c, const std::string& where);

// One tensor of a HuggingFace folder that holds (a part of) a registry tensor [R, C]: `name`
// of `shape` [n, R] is the transpose of the registry tensor's columns [col0, col0 + n); a 3-D
// fused tensor [E, n, R] holds it as slab `slab` (its index along dim 0). `transpose` false: the
// HF tensor is the registry tensor itself (shape as the registry's, vocabulary rows real only).
struct HfPart {
  std::string name;
  std::vector<std::int64_t> shape;  // the whole HF tensor's
  bool transpose = false;
  std::int64_t col0 = 0;
  std::int64_t slab = -1;  // -1: a 2-D tensor
};

// The hub-form tensors that hold registry parameter `p` (one for every non-MoE parameter).
std::vector<HfPart> hf_parts(const model::ParameterRegistry& reg, const model::ParamInfo& p);
// The transformers-5 fused form of an MoE parameter (router: mlp.gate.weight; experts: a slab
// of mlp.experts.gate_up_proj / down_proj), or an empty list for any other parameter.
std::vector<HfPart> hf_fused_parts(const model::ParameterRegistry& reg, const model::ParamInfo& p);

// Registry columns [col0, col0 + n) of `src` [R, C] (row-major) written transposed into `dst`
// [n, R], in tiles (a whole 14336 x 4096 expert stays cache-friendly), and the inverse.
void registry_cols_to_hf(const float* src, std::int64_t R, std::int64_t C, std::int64_t col0,
                         std::int64_t n, float* dst);
// `src` [n, R] (an HF tensor, or one slab of a fused one) into columns [col0, col0 + n) of
// `dst` [R, C].
void hf_to_registry_cols(const float* src, std::int64_t R, std::int64_t C, std::int64_t col0,
                         std::int64_t n, float* dst);

}  // namespace meshtrain::io
