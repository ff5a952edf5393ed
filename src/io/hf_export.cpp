#include "meshtrain/io/hf_export.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_mixtral.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"

namespace meshtrain::io {


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
  // Mixture of Experts: MixtralForCausalLM, the one HF MoE family mapped (io/hf_mixtral.hpp).
  if (cfg.moe.enabled()) check_mixtral_expressible(cfg, cat("HuggingFace export of '", dir, "'"));
  reg_ = std::make_unique<model::ParameterRegistry>(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
  std::vector<ShardedSafetensorsWriter::Tensor> tensors;
  for (const auto& p : reg_->params())
    for (const HfPart& h : hf_parts(*reg_, p)) tensors.push_back({h.name, opt.dtype, h.shape});
  files_ = std::make_unique<ShardedSafetensorsWriter>(dir, std::move(tensors), opt.max_shard_bytes);
}

HfFolderWriter::~HfFolderWriter() = default;

std::size_t HfFolderWriter::largest_tensor_bytes() const {
  std::size_t m = 0;
  for (const auto& p : reg_->params()) m = std::max(m, p.numel * sizeof(float));
  return m;
}

void HfFolderWriter::append(const model::ParamInfo& p, const float* values) {
  for (const HfPart& h : hf_parts(*reg_, p)) {
    std::size_t n = 1;
    for (auto d : h.shape) n *= static_cast<std::size_t>(d);
    if (!h.transpose) {  // padding rows are the last rows: the real ones are a prefix
      files_->append(h.name, values, n);
      continue;
    }
    // A Mixtral MoE tensor: the transpose of some of the registry tensor's columns, staged in
    // one buffer of that part (at most the tensor): the writer still holds one tensor's worth.
    const std::int64_t R = p.global_shape[0], C = p.global_shape[1];
    HostView1<float> t("meshtrain::export.transpose", n);
    registry_cols_to_hf(values, R, C, h.col0, h.shape[0], t.data());
    files_->append(h.name, t.data(), n);
  }
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
