#pragma once
// `meshtrain bench`: measures the planner's calibration on this machine (plan/calibration.hpp)
// and writes it as JSON.
#include <string>
#include <vector>

#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {
boost::program_options::options_description bench_options();
int cmd_bench(Runtime& rt, const std::vector<std::string>& args);
// "1,4,16" -> {1, 4, 16}; ConfigError naming `option` for anything but integers >= min_value.
std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                int min_value = 1);
}  // namespace meshtrain::app
