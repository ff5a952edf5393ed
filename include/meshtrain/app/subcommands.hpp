#pragma once
#include <string>
#include <vector>

#include "meshtrain/app/runtime.hpp"
#include "meshtrain/core/signals.hpp"

namespace meshtrain::app {

// Entry point of the executable: parses the subcommand, runs it, turns errors into exit codes.
int run_main(int argc, char** argv);

// Subcommands: each receives the arguments after its name. Return value = exit code.
int cmd_selfcheck(Runtime& rt, const std::vector<std::string>& args);

// Exit codes (documented in README and `meshtrain --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // a check failed or a rank hit an error
inline constexpr int kExitConfig = 2;       // bad option, config file or input
inline constexpr int kExitRequeue = signals::kExitRequeue;  // 3: checkpoint saved after
                                                            // SIGUSR1/SIGTERM, requeue me

}  // namespace meshtrain::app
