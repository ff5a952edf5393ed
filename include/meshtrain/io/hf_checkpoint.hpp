#pragma once
// HuggingFace GPT-2 interop: a folder with model.safetensors (HF parameter names, float32, the
// real vocabulary rows of wte; the LM head is tied) and config.json (GPT2LMHeadModel), so
// `transformers` loads what we train and we start from their checkpoints. read_hf_config also
// reads LlamaForCausalLM's config.json; the streaming import of either family's weights, each
// rank its slices, is io/hf_import.hpp.
#include <string>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

namespace meshtrain::io {

// Reads <dir>/config.json (model_type gpt2, none, or llama). `vocab_pad` is ours (not in HF's
// file). ConfigError naming the file, also for another model_type.
model::GptConfig read_hf_config(const std::string& dir, int vocab_pad);
// The tokenizer recorded by export_hf ("byte", "gpt2"), or "gpt2" for a HuggingFace file.
std::string read_hf_tokenizer(const std::string& dir);

// Loads <dir>/model.safetensors into the model (single tensor-parallel rank holding whole
// tensors). Accepts names with or without the "transformer." prefix; ignores HF's attention-mask
// buffers and a separate lm_head.weight (tied). ConfigError naming the tensor on shape mismatch
// or a missing tensor.
template <class T>
void import_hf(model::GptT<T>& m, const std::string& dir);

// Writes <dir>/config.json (GPT2LMHeadModel, tied head) for model `c` (creating <dir>).
void write_hf_config(const model::GptConfig& c, const std::string& dir,
                     const std::string& tokenizer);

// Writes <dir>/model.safetensors and <dir>/config.json (creating <dir>).
template <class T>
void export_hf(const model::GptT<T>& m, const std::string& dir, const std::string& tokenizer);

}  // namespace meshtrain::io
