#pragma once
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/core/config.hpp"

namespace meshtrain::app {
boost::program_options::options_description selfcheck_options();
}  // namespace meshtrain::app
