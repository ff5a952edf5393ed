#pragma once
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {

struct Subcommand {
  std::string name;
  std::string summary;
  std::function<boost::program_options::options_description()> options;
  std::function<int(Runtime&, const std::vector<std::string>&)> run;
};

const std::vector<Subcommand>& subcommand_table();
const Subcommand* find_subcommand(const std::string& name);

}  // namespace meshtrain::app
