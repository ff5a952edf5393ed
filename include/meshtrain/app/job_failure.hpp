#pragma once
// The error policy of the whole job (app/job_failure.cpp): how an exception that ended a
// subcommand on this rank becomes one message and one exit code for every rank, or an abort.
#include <exception>
#include <string>

#include "meshtrain/app/subcommands.hpp"

namespace meshtrain::app {

// Returns the exit code for this rank (kExitConfig for a ConfigError, kExitFailure otherwise),
// or does not return (MPI_Abort) when the other ranks cannot be agreed with.
int fail_job(const Runtime& rt, const std::string& subcommand, const std::exception& e);

}  // namespace meshtrain::app
