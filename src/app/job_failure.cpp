// How a failed subcommand ends the job (DESIGN invariant 6: fail loudly, never hang).
//
// An agreed error (core/agree.hpp: every rank throws it at the same point with the same text)
// is printed once by rank 0 and every rank exits with its code. Any other exception may be this
// rank's alone while the others wait for it in a collective, or every rank's (the same bad
// option seen everywhere): the ranks meet on the error communicator within a grace period. If
// all of them arrive, rank 0 prints its message (and any rank whose message differs prints its
// own) and all exit normally; if not, this rank prints its message with its rank and
// MPI_Abort ends the job.
#include "meshtrain/app/job_failure.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/io/checkpoint.hpp"

namespace meshtrain::app {

namespace {

// Long enough for ranks that failed the same check at the same point to meet even on an
// oversubscribed machine, short enough that a rank's lone failure aborts the job in seconds.
constexpr double kGraceSeconds = 5.0;

void print(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

// Whether every rank of `comm` reaches this point within `seconds` (a non-blocking barrier,
// tested until the deadline; the request is left behind when it does not complete, since the
// job is about to be aborted).
bool all_ranks_arrive(MPI_Comm comm, double seconds) {
  MPI_Request req;
  if (MPI_Ibarrier(comm, &req) != MPI_SUCCESS) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int done = 0;
    if (MPI_Test(&req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (done) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    usleep(2000);
  }
}

// Every rank has failed and is here: the message and code of rank 0, and whether ours differs.
int settle_among_failed(MPI_Comm comm, int rank, const std::string& prefix, const std::string& msg,
                        int code) {
  unsigned long long n = msg.size();
  MPI_Bcast(&n, 1, MPI_UNSIGNED_LONG_LONG, 0, comm);
  std::string root = msg;
  root.resize(static_cast<std::size_t>(n));
  if (n > 0) MPI_Bcast(root.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
  int root_code = code;
  MPI_Bcast(&root_code, 1, MPI_INT, 0, comm);
  if (rank == 0) print(cat(prefix, ": error: ", msg));
  else if (root != msg) print(cat(prefix, ": error on rank ", rank, ": ", msg));
  return root_code;
}

// A rank that gave up an open parallel HDF5 file (a failed checkpoint write) cannot finalise
// HDF5 and MPI: the library would flush that file collectively at exit. Once the message is
// out, the job ends through MPI_Abort with the same code.
// The ranks meet first (bounded), so that rank 0's message is out before any rank aborts.
int finish(const Runtime& rt, int code) {
  if (!io::abandoned_hdf5_files()) return code;
  print(cat("meshtrain: an HDF5 file was left open by the failure: ending the job with MPI_Abort (",
            code, ")"));
  all_ranks_arrive(rt.error_comm(), kGraceSeconds);
  MPI_Abort(MPI_COMM_WORLD, code);
  return code;
}

}  // namespace

int fail_job(const Runtime& rt, const std::string& subcommand, const std::exception& e) {
  const bool config = dynamic_cast<const ConfigError*>(&e) != nullptr;
  const int code = config ? kExitConfig : kExitFailure;
  const std::string prefix = "meshtrain " + subcommand;
  if (is_agreed(e)) {
    if (rt.rank() == 0) print(cat(prefix, ": error: ", e.what()));
    return finish(rt, code);
  }
  if (all_ranks_arrive(rt.error_comm(), kGraceSeconds))
    return finish(rt, settle_among_failed(rt.error_comm(), rt.rank(), prefix, e.what(), code));
  print(cat(prefix, ": error on rank ", rt.rank(), ": ", e.what()));
  print(cat(prefix, ": rank ", rt.rank(), " failed alone (the other ranks did not reach the error "
            "handler within ", kGraceSeconds, " s): aborting the job with exit code ", code));
  MPI_Abort(MPI_COMM_WORLD, code);
  return code;
}

}  // namespace meshtrain::app
