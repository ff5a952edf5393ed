#pragma once
// `--deepspeed FILE`: a DeepSpeed configuration (ds_config.json) read into meshtrain's options,
// for `train`, `plan` and `config` (which prints the equivalent INI).
//
// Precedence: the command line > the DeepSpeed file > the --config INI file > defaults. The
// file's batch sizes follow DeepSpeed's rule train_batch_size = micro x accumulation x dp, with
// the command line's train.micro_batch / train.grad_accum standing in for the file's (then the
// rule is checked over the merged values, as HF Trainer checks its arguments against the file).
// "auto" (HF Trainer's placeholder) means meshtrain's own value: the command line's, the INI
// file's or the default; keys whose "auto" cannot be resolved are errors. Keys with no effect in
// meshtrain are listed in one warning; contradictory or impossible values are ConfigErrors
// naming the key and the file.
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"
#include "meshtrain/core/json.hpp"

namespace meshtrain::app {

namespace po = boost::program_options;

po::options_description deepspeed_options();  // --deepspeed FILE

// What the mapping reads besides the file.
struct DsContext {
  // The command line, the --config file and the defaults (without the DeepSpeed file).
  const po::variables_map* base = nullptr;
  std::function<bool(const std::string&)> on_command_line;  // was this option given there?
  int dp = 1;            // data-parallel ranks in DeepSpeed's batch rule; 0: no rule (plan:
                         // the file's batch values are taken as they are)
  std::string dp_from;   // how dp was found, for messages ("8 ranks / (pp 4 x tp 2)")
  int n_embd = 0;        // the model's width: "auto" bucket sizes are n_embd^2 (HF Trainer's)
  int grad_bytes = 4;    // bytes of a gradient element (bucket sizes count elements)
};

struct DsOption {
  std::string key, value;  // meshtrain option and its value as text
  std::string from;        // the DeepSpeed key it comes from ("fp16.enabled")
};

struct DsMapping {
  std::string file;
  std::vector<DsOption> options;       // in a fixed order: batch, optimizer, schedule, ...
  std::vector<std::string> no_effect;  // DeepSpeed keys meshtrain has no use for (with why)
  std::vector<std::string> unknown;    // keys DeepSpeed does not know (with a suggestion)
  std::vector<std::string> overridden; // the command line's values that replaced the file's
  // What the batch rule resolved (0: the file says nothing about batches).
  long global_batch = 0, micro_batch = 0, grad_accum = 0;

  const DsOption* find(const std::string& key) const;
  // The one warning (empty when nothing is ignored) and the one note about the command line.
  std::string warning() const;
  std::string note() const;
};

// Maps a parsed DeepSpeed document. ConfigError naming the key and `file` for wrong types,
// contradictions, impossible values and "auto" that cannot be resolved.
DsMapping map_deepspeed(const Json& doc, const std::string& file, const DsContext& ctx);
// Reads and maps `file` (ConfigError naming the file when it cannot be read or parsed).
DsMapping read_deepspeed(const std::string& file, const DsContext& ctx);

// The subcommands' side: parse `args` against `desc` (which holds deepspeed_options()) with the
// file named by --deepspeed, if any, as a layer between the command line and the INI file.
// `layer` turns the mapping into the subcommand's options (train's are the mapping's own;
// plan's are plan.*); `dp` gives DeepSpeed's data-parallel size from the base options.
struct DsParsed {
  config::Parsed parsed;
  DsMapping mapping;      // file empty: no --deepspeed
  bool used() const { return !mapping.file.empty(); }
  // A ConfigError's message with the DeepSpeed key that set the option it names, if any.
  std::string annotate(const std::string& message) const;
};
using DsLayer = std::function<std::vector<std::pair<std::string, std::string>>(
    const DsMapping&, const po::variables_map& base)>;
using DsWorld = std::function<DsContext(const po::variables_map& base)>;
DsParsed parse_with_deepspeed(const std::vector<std::string>& args,
                              const po::options_description& desc, const DsWorld& world,
                              const DsLayer& layer);

// train's context: dp from mesh.* and the job's ranks, the model's width and gradient bytes.
DsContext train_context(const po::variables_map& base, int world_size);
// train's layer: the mapping's options as they are.
std::vector<std::pair<std::string, std::string>> train_layer(const DsMapping& m,
                                                             const po::variables_map& base);
// Runs f; a ConfigError from it gets the DeepSpeed key of the option it names (exit 2 either way).
void with_deepspeed_origin(const DsParsed& p, const std::function<void()>& f);

// `meshtrain config`: prints the INI equivalent of the options given (--deepspeed FILE, the
// command line, --config FILE), which `train --config` reads back into the same run.
po::options_description config_cmd_options();
int cmd_config(Runtime& rt, const std::vector<std::string>& args);
}  // namespace meshtrain::app
