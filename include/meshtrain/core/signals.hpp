#pragma once
// Graceful stop on SIGUSR1 / SIGTERM / SIGINT (issues 8, 17). A batch system warns a job before
// its time limit (Slurm: `#SBATCH --signal=USR1@120`) or asks it to stop (scancel, pre-emption:
// SIGTERM); a user presses Ctrl-C (SIGINT). The
// handler only sets a flag; at each step boundary the trainer asks stop_requested_anywhere(),
// which all-reduces the flag so every rank takes the same decision, then saves a checkpoint and
// exits with kExitRequeue, which the job script answers with a requeue.
#include <mpi.h>

namespace meshtrain::signals {

// Exit status of a run that saved a checkpoint after a stop signal: "requeue me". Distinct from
// 0 (done), 1 (failure) and 2 (bad configuration or input).
inline constexpr int kExitRequeue = 3;

// Installs the handlers for SIGUSR1, SIGTERM and SIGINT (idempotent); `meshtrain train` does it
// before MPI starts. They set a flag and return; a second SIGTERM or SIGINT restores the default
// action and re-raises it, so an impatient operator can still stop the job at once.
void install_stop_handlers();

// Whether this process has received a stop signal; the signal number (0 if none).
bool stop_requested();
int stop_signal();

// Collective over `comm`: true on every rank iff any rank has received a stop signal.
bool stop_requested_anywhere(MPI_Comm comm);

// Clears the flag (tests; a trainer that decides to continue).
void clear_stop_request();

}  // namespace meshtrain::signals
