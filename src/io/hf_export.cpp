#include "meshtrain/io/hf_export.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "meshtrain/core/error.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"

namespace meshtrain::io {

namespace {

bool vocab_rows(const model::ParameterRegistry& reg, const model::ParamInfo& p) {
  return p.name == reg.embedding_name() || p.name == reg.head_weight_name();
}

// HF's shape of a registry tensor: the real vocabulary rows only.
std::vector<std::int64_t> hf_shape(const model::ParameterRegistry& reg, const model::ParamInfo& p) {
  std::vector<std::int64_t> s = p.global_shape;
  if (vocab_rows(reg, p)) s[0] = reg.config().vocab_size;
  return s;
}

}  // namespace

std::string parse_hf_dtype(const std::string& value, const char* option) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "f32" || v == "fp32" || v == "float32") return "F32";
  if (v == "bf16" || v == "bfloat16") return "BF16";
  throw ConfigError(cat(option, "='", value, "' is not one of f32, bf16"));
}

HfFolderWriter::HfFolderWriter(const model::GptConfig& cfg, const std::string& dir,
                               const HfExportOptions& opt)
    : cfg_(cfg), dir_(dir), opt_(opt) {
  MESHTRAIN_CONFIG_CHECK(opt.dtype == "F32" || opt.dtype == "BF16", "HuggingFace export of '",
                         dir, "': dtype '", opt.dtype, "' is not F32 or BF16");
  MESHTRAIN_CONFIG_CHECK(opt.max_shard_bytes > 0, "HuggingFace export of '", dir,
                         "': the maximum shard size must be positive");
  // No HuggingFace MoE family (Mixtral, OLMoE) is mapped yet: its experts would have no names.
  MESHTRAIN_CONFIG_CHECK(!cfg.moe.enabled(), "HuggingFace export of '", dir,
                         "': the model has moe.experts=", cfg.moe.experts,
                         "; Mixture-of-Experts folders cannot be written yet (checkpoints hold "
                         "the model)");
  reg_ = std::make_unique<model::ParameterRegistry>(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::vector<ShardedSafetensorsWriter::Tensor> tensors;
  for (const auto& p : reg_->params()) tensors.push_back({p.name, opt.dtype, hf_shape(*reg_, p)});
  files_ = std::make_unique<ShardedSafetensorsWriter>(dir, std::move(tensors), opt.max_shard_bytes);
}

HfFolderWriter::~HfFolderWriter() = default;

std::size_t HfFolderWriter::largest_tensor_bytes() const {
  std::size_t m = 0;
  for (const auto& p : reg_->params()) m = std::max(m, p.numel * sizeof(float));
  return m;
}

void HfFolderWriter::append(const model::ParamInfo& p, const float* values) {
  // Padding rows are the last rows: the real ones are a prefix of the row-major tensor.
  std::size_t n = 1;
  for (auto d : hf_shape(*reg_, p)) n *= static_cast<std::size_t>(d);
  files_->append(p.name, values, n);
}

void HfFolderWriter::finish() {
  files_->finish();
  if (!opt_.tokenizer_json.empty()) {
    namespace fs = std::filesystem;
    fs::path src = opt_.tokenizer_json;
    if (fs::is_directory(src)) src /= "tokenizer.json";
    const fs::path side = src.parent_path() / "tokenizer_config.json";
    std::error_code ec;
    for (const fs::path& f : {src, side}) {
      if (f == side && !fs::exists(side)) continue;
      const fs::path to = fs::path(dir_) / f.filename();
      if (fs::exists(to) && fs::equivalent(f, to, ec)) continue;
      fs::copy_file(f, to, fs::copy_options::overwrite_existing, ec);
      MESHTRAIN_CONFIG_CHECK(!ec, "copying the tokenizer '", f.string(), "' into '", dir_,
                             "': ", ec.message());
    }
  }
  // config.json last: a folder with a config.json is a complete one.
  write_hf_config(cfg_, dir_, opt_.tokenizer, opt_.dtype);
}

std::size_t HfFolderWriter::num_shards() const { return files_->num_shards(); }

}  // namespace meshtrain::io
