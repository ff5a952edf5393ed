#pragma once
// Configuration: Boost.Program_options with INI files. Precedence: command line > --config file
// > defaults. INI sections map to dotted names: "[train]\nlr = 3e-4" is "--train.lr 3e-4".
// Unknown keys and bad values are ConfigErrors that name the key and where it came from.
#include <boost/program_options.hpp>
#include <string>
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

// Parse `args` (the arguments after the subcommand) against `desc` (which must include the
// generic options) and the INI file named by --config, if any.
Parsed parse(const std::vector<std::string>& args, const po::options_description& desc);

// The resolved configuration as INI text ([section] key = value), every option of `desc` that has
// a value, defaults included. Printed by rank 0 and stored in checkpoints.
std::string resolved_ini(const po::variables_map& vm, const po::options_description& desc);

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
