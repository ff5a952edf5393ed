#pragma once
// HuggingFace interop for GPT2LMHeadModel, LlamaForCausalLM (Qwen2, Mistral) and
// MixtralForCausalLM folders (config.json, the weights under HF's names; Mixtral's MoE tensors:
// io/hf_mixtral.hpp), so `transformers` loads what we train and we start from their checkpoints.
// The streaming import of either family's weights, each rank its slices, is io/hf_import.hpp;
// the streaming export, one tensor at a time, io/hf_export.hpp.
#include <string>

#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

namespace meshtrain::io {

// Reads <dir>/config.json (model_type gpt2, none, llama, qwen2, mistral or mixtral). `vocab_pad`
// is ours (not in HF's file). ConfigError naming the file, also for another model_type.
model::GptConfig read_hf_config(const std::string& dir, int vocab_pad);
// The tokenizer recorded by export_hf ("byte", "gpt2"), or "gpt2" for a HuggingFace file.
std::string read_hf_tokenizer(const std::string& dir);

// Loads a HuggingFace folder (model.safetensors, or shards with their index; GPT-2 or Llama)
// into a whole model (one rank: tensor parallelism 1, every stage): io::import_hf_slices of
// its registry. Accepts GPT-2 names with or without the "transformer." prefix; ignores HF's
// attention-mask buffers and a separate lm_head.weight of a tied model. ConfigError naming the
// file and the tensor on a shape mismatch or a missing tensor.
template <class T>
void import_hf(model::GptT<T>& m, const std::string& dir);

// The HuggingFace architecture a model is written as: GPT2LMHeadModel, LlamaForCausalLM,
// Qwen2ForCausalLM (q/k/v biases), MistralForCausalLM (hf_model_type mistral) or
// MixtralForCausalLM (moe.experts).
std::string hf_architecture(const model::GptConfig& c);

// Writes <dir>/config.json (hf_architecture's, with
// torch_dtype from the safetensors dtype "F32" / "BF16") and <dir>/generation_config.json for
// model `c` (creating <dir>). bos/eos token ids where the tokenizer kind fixes them (gpt2).
void write_hf_config(const model::GptConfig& c, const std::string& dir,
                     const std::string& tokenizer, const std::string& dtype = "F32");

// A whole model (one rank) as a HuggingFace folder (io/hf_export.hpp; one tensor of host
// memory at a time). The engine's export_hf streams a distributed model the same way.
template <class T>
void export_hf(const model::GptT<T>& m, const std::string& dir, const std::string& tokenizer,
               const HfExportOptions& options = {});

}  // namespace meshtrain::io
