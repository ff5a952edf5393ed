#pragma once
// Streaming HuggingFace export: a folder as save_pretrained writes it (config.json,
// generation_config.json, model.safetensors or shards model-0000N-of-0000M.safetensors with
// model.safetensors.index.json) for GPT2LMHeadModel, LlamaForCausalLM (Qwen2, Mistral) or
// MixtralForCausalLM (io/hf_mixtral.hpp), written one tensor at a time. The writer never holds more than the tensor it is given, so whoever feeds it (the
// engine's gather from the ranks that own the slices, `convert` reading a checkpoint tensor by
// tensor) needs one tensor of host memory at a time, never the whole model.
//
// The names, layouts and shapes are the exact inverse of io/hf_import.hpp: the registry's names
// are HF's, its [out, in] (Llama, nn.Linear) or [in, out] (GPT-2, Conv1D) layouts and the
// rotate_half q/k layout are HF's, and the vocabulary-padding rows of the embedding and of an
// untied head are left out; Mixtral's router and experts are transposed (and each expert's
// packed [gate | up] split into w1 and w3) on their way out. A tied head writes no lm_head.weight (save_pretrained drops it).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/model/config.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::io {

class ShardedSafetensorsWriter;

struct HfExportOptions {
  // Tensor dtype in the files: "F32" (what the model holds, bit for bit at fp32) or "BF16"
  // (rounded to nearest even); config.json's torch_dtype follows.
  std::string dtype = "F32";
  // save_pretrained's max_shard_size: a tensor opens a new shard when it would push the current
  // one past this (a larger tensor gets a shard of its own). One shard: model.safetensors.
  std::uint64_t max_shard_bytes = 5'000'000'000ull;
  // Recorded as meshtrain_tokenizer (byte, gpt2, hf) so that `generate` decodes with it.
  std::string tokenizer = "byte";
  // tokenizer "hf": its tokenizer.json (or a folder with one), copied into the folder with the
  // tokenizer_config.json beside it, so that transformers and `generate` find it there.
  std::string tokenizer_json;
};

// "F32" / "BF16" from an option value (f32, fp32, float32, bf16, bfloat16; any case).
// ConfigError naming `option` otherwise.
std::string parse_hf_dtype(const std::string& value, const char* option);

// What an export moved through host memory on this rank: the largest single host buffer it
// allocated and the peak of its host buffers alive together (bytes), and the tensors written
// (rank 0) or pieces sent (other ranks). The streaming bound the tests hold it to.
struct HfExportStats {
  std::size_t largest_buffer_bytes = 0, peak_buffer_bytes = 0;
  std::size_t tensors = 0, pieces_sent = 0;
};

class HfFolderWriter {
 public:
  // Declares every tensor of `cfg`'s whole model (a tp 1, one-stage registry, in its order)
  // for `dir` (created). ConfigError for an option the format cannot take.
  HfFolderWriter(const model::GptConfig& cfg, const std::string& dir, const HfExportOptions& opt);
  ~HfFolderWriter();
  HfFolderWriter(const HfFolderWriter&) = delete;
  HfFolderWriter& operator=(const HfFolderWriter&) = delete;

  // The whole model's registry: append takes its parameters in its order.
  const model::ParameterRegistry& registry() const { return *reg_; }
  // fp32 bytes of the largest parameter of the registry (vocabulary padding included): the most
  // host memory a tensor-by-tensor feeder needs for one tensor.
  std::size_t largest_tensor_bytes() const;
  // `values`: the whole of parameter `p` of registry() (global shape, row-major, padding rows
  // included; only the real vocabulary rows are written). Error out of order.
  void append(const model::ParamInfo& p, const float* values);
  // After the last tensor: closes the shards, writes the index, config.json and
  // generation_config.json (and copies the tokenizer files). Error unless every tensor was
  // appended.
  void finish();
  std::size_t num_shards() const;

 private:
  model::GptConfig cfg_;
  std::string dir_;
  HfExportOptions opt_;
  std::unique_ptr<model::ParameterRegistry> reg_;
  std::unique_ptr<ShardedSafetensorsWriter> files_;
};

}  // namespace meshtrain::io
