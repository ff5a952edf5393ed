#pragma once
// Streaming HuggingFace import: each rank reads exactly the slices of a HF folder (one
// model.safetensors, or shards model-0000N-of-0000M.safetensors with their index) that its
// registry holds (its pipeline stage's tensors, its tensor-parallel slice of each) with the
// sharded reader's pread slices, so no rank reads or holds the whole model. GPT-2
// (GPT2LMHeadModel, names with or without "transformer.") and Llama (LlamaForCausalLM: HF's
// names, nn.Linear layout and rotate_half q/k layout are the registry's, so a slice is a copy);
// Mixtral's router and experts (io/hf_mixtral.hpp) are read whole, only this ep rank's experts,
// and transposed into their registry slots.
#include <string>

#include "meshtrain/core/view.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::io {

// Writes every parameter of `reg` into `out` (reg.size() elements, the registry's layout);
// vocabulary padding rows are zero. ConfigError naming the folder or file and the tensor for a
// missing tensor, a missing shard, a tensor of the wrong shape or dtype. Not collective: the
// caller agrees on failures (ranks read different tensors).
template <class T>
void import_hf_slices(const model::ParameterRegistry& reg, const std::string& dir, View1<T> out);

}  // namespace meshtrain::io
