#pragma once
// Configuration: Boost.Program_options with INI files. Precedence: command line > --config file
// > defaults. INI sections map to dotted names: "[train]\nlr = 3e-4" is "--train.lr 3e-4".
// Unknown keys and bad values are ConfigErrors that name the key and where it came from.
#include <boost/program_options.hpp>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace meshtrain::config {

namespace po = boost::program_options;

struct Parsed {
  po::variables_map vm;
  std::string config_file;  // empty when none was given
  bool help = false;
};

// Options every subcommand accepts: --help, --config.
po::options_description generic_options();

// A layer of options between the command line and the --config file (the DeepSpeed file of
// app/deepspeed_config.hpp). It sees the command line alone and the options without the layer
// (command line, file, defaults) and returns options as key = value texts, which the command
// line overrides and which override the file.
struct LayerInput {
  const po::variables_map& command_line;  // defaults filled in: test with given()
  const po::variables_map& base;
};
using Layer = std::function<std::vector<std::pair<std::string, std::string>>(const LayerInput&)>;

// Parse `args` (the arguments after the subcommand) against `desc` (which must include the
// generic options) and the INI file named by --config, if any, with an optional layer between
// them (`layer_name` names it in messages about its values).
Parsed parse(const std::vector<std::string>& args, const po::options_description& desc,
             const Layer& layer = {}, const std::string& layer_name = "");

// Whether `key` has a value that is not its default.
bool given(const po::variables_map& vm, const std::string& key);

// The resolved configuration as INI text ([section] key = value), every option of `desc` that has
// a value, defaults included unless `defaults` is false. Printed by rank 0 and stored in
// checkpoints.
std::string resolved_ini(const po::variables_map& vm, const po::options_description& desc,
                         bool defaults = true);

// Typed access with a clear error when the option is missing (a programming error).
template <class T>
T get(const po::variables_map& vm, const std::string& key) {
  auto it = vm.find(key);
  if (it == vm.end() || it->second.empty())
    throw po::error("option '" + key + "' has no value");
  return it->second.as<T>();
}

// Where a key's value came from, for messages: "inputs/x.ini" or "command line" or "default".
std::string origin(const Parsed& p, const std::string& key);

}  // namespace meshtrain::config
