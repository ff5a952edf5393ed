// `meshtrain convert`: checkpoint -> HuggingFace folder. One process reads /model/* of the file
// tensor by tensor (verifying the checksums) and writes the shards, their index and config.json;
// under mpirun the other ranks wait for its outcome (core/agree's on_root), as `prep` does.
#include "meshtrain/app/convert.hpp"

#include <filesystem>
#include <sstream>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/hf_checkpoint.hpp"
#include "meshtrain/io/hf_export.hpp"

namespace meshtrain::app {

po::options_description convert_options() {
  po::options_description d;
  d.add(config::generic_options());
  po::options_description c("Conversion [convert]");
  c.add_options()
      ("convert.checkpoint", po::value<std::string>()->default_value("latest"),
       "a step_XXXXXXXX.h5 file, a checkpoint folder (its `latest`), or latest (in convert.dir)")
      ("convert.dir", po::value<std::string>()->default_value("out/checkpoints"),
       "checkpoint folder that `latest` refers to (train's ckpt.dir)")
      ("convert.out", po::value<std::string>()->default_value(""),
       "output folder, a HuggingFace folder (GPT2LMHeadModel, LlamaForCausalLM or, for an MoE "
       "checkpoint, MixtralForCausalLM: config.json, model.safetensors or shards with "
       "model.safetensors.index.json; required)")
      ("convert.dtype", po::value<std::string>()->default_value("f32"),
       "dtype of the tensors written: f32 (the checkpoint's fp32 values) or bf16")
      ("convert.max_shard_mb", po::value<double>()->default_value(5000.0),
       "largest safetensors shard in MB (10^6 bytes; save_pretrained's max_shard_size)")
      ("convert.tokenizer", po::value<std::string>()->default_value(""),
       "tokenizer recorded in config.json (byte, gpt2 or hf); default: the checkpoint's "
       "data.tokenizer");
  d.add(c).add(log_options());
  return d;
}

std::string ini_value(const std::string& text, const std::string& section,
                      const std::string& key) {
  std::istringstream in(text);
  std::string line, current;
  auto trim = [](std::string s) {
    const auto b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.size() > 1 && line.front() == '[' && line.back() == ']') {
      current = trim(line.substr(1, line.size() - 2));
    } else if (const auto eq = line.find('='); current == section && eq != std::string::npos) {
      if (trim(line.substr(0, eq)) == key) return trim(line.substr(eq + 1));
    }
  }
  return "";
}

int cmd_convert(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = convert_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const std::string spec = p.vm["convert.checkpoint"].as<std::string>();
  const std::string dir = p.vm["convert.dir"].as<std::string>();
  const std::string out = p.vm["convert.out"].as<std::string>();
  if (out.empty())
    throw ConfigError("convert.out is required: the folder for model.safetensors + config.json");

  io::HfExportOptions opt;
  opt.dtype = io::parse_hf_dtype(p.vm["convert.dtype"].as<std::string>(), "convert.dtype");
  const double shard_mb = p.vm["convert.max_shard_mb"].as<double>();
  MESHTRAIN_CONFIG_CHECK(shard_mb > 0, "convert.max_shard_mb=", shard_mb, " must be positive");
  opt.max_shard_bytes = static_cast<std::uint64_t>(shard_mb * 1e6);

  // Rank 0 converts, one tensor at a time; the others learn the outcome: when rank 0 fails,
  // every rank throws its error (a ConfigError: every rank exits 2 and rank 0 prints it once).
  agree_on_root(rt.world(), "", [&] {
    const std::string path = io::resolve_checkpoint(MPI_COMM_SELF, spec, dir);
    // The root attributes only (no tensors): the model, the step and the stored configuration.
    const io::CheckpointAttributes a = io::read_checkpoint_attributes(path);
    opt.tokenizer = p.vm["convert.tokenizer"].as<std::string>();
    if (opt.tokenizer.empty()) opt.tokenizer = ini_value(a.config_text, "data", "tokenizer");
    if (opt.tokenizer.empty()) opt.tokenizer = "byte";
    const model::GptConfig mc = io::export_hf_from_checkpoint(path, out, opt);
    logging::info("convert: ", path, " (step ", a.step, ", ", mc.describe(), ") -> ", out,
                  ", HuggingFace ", io::hf_architecture(mc), " in ",
                  opt.dtype, " (tokenizer ", opt.tokenizer, ")");
  });
  return kExitOk;
}

}  // namespace meshtrain::app
