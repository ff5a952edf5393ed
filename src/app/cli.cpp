// Subcommand dispatch. The error policy of the whole job is app/job_failure.cpp: an error every
// rank agrees on (ConfigError: exit 2; any other: exit 1) is printed once by rank 0; one that a
// rank meets alone is printed with its rank and ends the job with MPI_Abort, so no rank hangs in
// a collective.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "meshtrain/app/job_failure.hpp"
#include "meshtrain/app/subcommands.hpp"
#include "meshtrain/app/subcommand_table.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/version.hpp"

namespace meshtrain::app {

namespace {

void print_usage() {
  std::cout << "meshtrain " << kVersion
            << " - GPT training with data, pipeline and tensor parallelism and ZeRO\n\n"
               "usage: meshtrain <subcommand> [--config FILE] [--section.key value ...]\n"
               "       mpirun -np N meshtrain <subcommand> ...   (or srun under Slurm)\n\n"
               "subcommands:\n";
  for (const auto& s : subcommand_table())
    std::printf("  %-10s %s\n", s.name.c_str(), s.summary.c_str());
  std::cout << "\n`meshtrain <subcommand> --help` lists its options. Options come from the command\n"
               "line, then a --deepspeed ds_config.json (train, plan, config), then the --config\n"
               "INI file ([section] key = value), then defaults.\n\n"
               "exit codes: 0 success, 1 failure (a check failed or a rank hit an error),\n"
               "            2 bad configuration or input,\n"
               "            3 `train` saved a checkpoint after SIGUSR1/SIGTERM and stopped:\n"
               "              requeue the job with --train.resume latest to continue\n";
}

bool wants_help(const std::vector<std::string>& args) {
  return std::any_of(args.begin(), args.end(),
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

}  // namespace

int run_main(int argc, char** argv) {
  std::vector<std::string> all(argv + 1, argv + argc);
  if (all.empty() || all[0] == "--help" || all[0] == "-h" || all[0] == "help") {
    print_usage();
    return all.empty() ? kExitConfig : kExitOk;
  }
  if (all[0] == "--version" || all[0] == "-V") {
    std::cout << "meshtrain " << kVersion << " (" << kBuildInfo << ")\n";
    return kExitOk;
  }
  const Subcommand* sub = find_subcommand(all[0]);
  if (!sub) {
    std::cerr << "meshtrain: error: unknown subcommand '" << all[0]
              << "'; run `meshtrain --help` for the list\n";
    return kExitConfig;
  }
  std::vector<std::string> args(all.begin() + 1, all.end());
  if (wants_help(args)) {  // no MPI needed to print help
    std::cout << "usage: meshtrain " << sub->name << " [options]\n" << sub->summary << "\n\n"
              << sub->options() << "\n";
    return kExitOk;
  }

  // `train` saves and exits 3 on SIGTERM/SIGINT/SIGUSR1: the handlers go in before MPI and
  // Kokkos start (seconds on a GPU node), so a signal during start-up is not a plain kill.
  if (sub->name == "train") signals::install_stop_handlers();
  int rc = kExitOk;
  try {
    // `train` writes checkpoints from a background thread where MPI allows it.
    Runtime rt(argc, argv, sub->name == "train" ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED);
    try {
      // Every rank refuses alike (the job's shape and the build), so the error is agreed.
      if (!rt.emulated_hosts_refusal().empty()) throw ConfigError(rt.emulated_hosts_refusal());
      if (rt.emulated_hosts())
        logging::warn("emulated hosts (MESHTRAIN_EMULATE_HOSTS): ", rt.size(),
                      " ranks share this node's GPUs, each as a host of its own, through NCCL "
                      "over loopback sockets: results are exact, speeds mean nothing",
                      rt.blocking_sync() ? " (host waits for the GPU block instead of spinning)"
                                         : "");
      rc = sub->run(rt, args);
    } catch (const std::exception& e) {
      rc = fail_job(rt, sub->name, e);
    }
  } catch (const std::exception& e) {  // start-up failed (MPI or Kokkos)
    std::cerr << "meshtrain: error during start-up: " << e.what() << "\n";
    return kExitFailure;
  }
  return rc;
}

}  // namespace meshtrain::app
