// --deepspeed FILE as a layer of the subcommands' options, and `meshtrain config`, which prints
// the INI that the options given amount to.
#include <cctype>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "meshtrain/app/deepspeed_config.hpp"
#include "meshtrain/app/option_checks.hpp"
#include "meshtrain/app/options.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/version.hpp"

namespace meshtrain::app {

po::options_description deepspeed_options() {
  po::options_description d("DeepSpeed configuration");
  d.add_options()
      ("deepspeed", po::value<std::string>(),
       "a DeepSpeed ds_config.json read into these options (batch sizes by DeepSpeed's rule, "
       "optimizer, scheduler, fp16/bf16 and loss scaling, ZeRO, gradient clipping, activation "
       "checkpointing, steps_per_print, tensorboard); the command line overrides it, it "
       "overrides --config; `meshtrain config --deepspeed FILE` prints the equivalent INI");
  return d;
}

DsMapping read_deepspeed(const std::string& file, const DsContext& ctx) {
  std::ifstream in(file);
  if (!in) throw ConfigError(cat("DeepSpeed configuration '", file, "' (--deepspeed) cannot be "
                                 "opened: no such file or not readable"));
  std::stringstream text;
  text << in.rdbuf();
  return map_deepspeed(json::parse(text.str(), cat("'", file, "' (--deepspeed)")), file, ctx);
}

DsParsed parse_with_deepspeed(const std::vector<std::string>& args,
                              const po::options_description& desc, const DsWorld& world,
                              const DsLayer& layer) {
  DsParsed r;
  std::string name;
  auto on_layer = [&](const config::LayerInput& in) {
    std::vector<std::pair<std::string, std::string>> kv;
    if (!in.base.count("deepspeed")) return kv;
    name = in.base["deepspeed"].as<std::string>();
    DsContext ctx = world(in.base);
    // The train options a subcommand without them (plan) reads are resolved against their own
    // defaults by `world`; the command line's are this one's.
    const po::variables_map& cmd = in.command_line;
    ctx.on_command_line = [&cmd](const std::string& key) { return config::given(cmd, key); };
    r.mapping = read_deepspeed(name, ctx);
    return layer(r.mapping, in.base);
  };
  r.parsed = config::parse(args, desc, on_layer, "the --deepspeed file");
  return r;
}

std::string DsParsed::annotate(const std::string& message) const {
  // Where the message first names the option as a whole word (train.lr is not
  // train.lr_schedule); the option named first is the one the message is about.
  auto first = [&](const std::string& key) {
    for (auto at = message.find(key); at != std::string::npos; at = message.find(key, at + 1)) {
      const std::size_t end = at + key.size();
      if (end == message.size() || !(std::isalnum(static_cast<unsigned char>(message[end])) ||
                                     message[end] == '_'))
        return at;
    }
    return std::string::npos;
  };
  const DsOption* best = nullptr;
  std::size_t best_at = std::string::npos;
  for (const auto& o : mapping.options)
    if (const std::size_t at = first(o.key); at < best_at) best = &o, best_at = at;
  if (!best) return message;
  return cat(message, " (set by ", best->from, " in ", mapping.file, ", --deepspeed)");
}

void with_deepspeed_origin(const DsParsed& p, const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    if (!p.used()) throw;
    throw ConfigError(p.annotate(e.what()));
  }
}

DsContext train_context(const po::variables_map& base, int world_size) {
  DsContext c;
  c.base = &base;
  const mesh::Shape s = mesh_shape(base, world_size);
  c.dp = s.dp;
  c.dp_from = base["mesh.dp"].as<int>() > 0
                  ? cat("mesh.dp")
                  : cat(world_size, " ranks / (mesh.pp ", s.pp, " x mesh.tp ", s.tp, ")");
  c.n_embd = model_config(base).n_embd;
  c.grad_bytes = base["train.precision"].as<std::string>() == "fp32" ? 4 : 2;
  return c;
}

std::vector<std::pair<std::string, std::string>> train_layer(const DsMapping& m,
                                                             const po::variables_map& base) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& o : m.options) kv.emplace_back(o.key, o.value);
  // A global batch from the file holds for this dp only: record it, so an INI printed from
  // these options (meshtrain config) refuses another world instead of training another batch.
  if (m.global_batch > 0 && base["mesh.dp"].as<int>() == 0)
    kv.emplace_back("mesh.dp", std::to_string(m.global_batch / (m.micro_batch * m.grad_accum)));
  return kv;
}

po::options_description config_cmd_options() {
  po::options_description d = train_options();
  po::options_description c("Printing [config]");
  c.add_options()
      ("config.world", po::value<int>()->default_value(0),
       "ranks the printed configuration is for (DeepSpeed's batch rule divides by the "
       "data-parallel ranks); 0 = the ranks of this job");
  d.add(c);
  return d;
}

int cmd_config(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = config_cmd_options();
  int world = rt.size();
  const DsParsed p = parse_with_deepspeed(
      args, desc,
      [&](const po::variables_map& base) {
        if (base["config.world"].as<int>() > 0) world = base["config.world"].as<int>();
        return train_context(base, world);
      },
      train_layer);
  logging::set_context(log_context(p.parsed.vm, rt.rank()));
  if (p.used()) {
    if (!p.mapping.warning().empty()) logging::warn(p.mapping.warning());
    if (!p.mapping.note().empty()) logging::info(p.mapping.note());
  }
  // The options are checked as train checks them, so what is printed is what train accepts.
  with_deepspeed_origin(p, [&] {
    check_train_options(p.parsed.vm);
    mesh_shape(p.parsed.vm, world);
    model_config(p.parsed.vm);
  });
  if (rt.rank() != 0) return kExitOk;
  std::string ini = config::resolved_ini(p.parsed.vm, desc, /*defaults=*/false);
  // [config] world is this printer's own option, not train's.
  const auto at = ini.find("[config]\n");
  if (at != std::string::npos) {
    const auto end = ini.find("\n[", at + 1);
    ini.erase(at, end == std::string::npos ? std::string::npos : end + 1 - at);
  }
  std::string head = cat("# meshtrain ", kVersion, " config");
  for (const auto& a : args) head += " " + a;
  head += cat("\n# for ", world, " ranks; `meshtrain train --config FILE` trains the same run\n");
  std::cout << head << ini << std::flush;
  return kExitOk;
}

}  // namespace meshtrain::app
