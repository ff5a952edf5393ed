// Test main: MPI and Kokkos around a Catch2 session. Each rank runs the same test cases; only
// rank 0 reports unless a rank fails (its own output then names it).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "meshtrain/comm/emulated_hosts.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/comm/watchdog.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/mpi_threads.hpp"
#include "meshtrain/mesh/process_mesh.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  // MESHTRAIN_MPI_THREAD_LEVEL=multiple (set by the tests of background checkpoint writes)
  // asks for MPI_THREAD_MULTIPLE.
  MPI_Init_thread(&argc, &argv, meshtrain::requested_thread_level(MPI_THREAD_FUNNELED), &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  meshtrain::set_error_rank(rank);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // as app/'s Runtime does
  auto node = meshtrain::mesh::node_local_rank(MPI_COMM_WORLD);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // The GPU suite (tests/gpu) runs these tests with several ranks on one GPU.
  const auto hosts = meshtrain::comm::claim_emulated_host(rank, size, node.size);
  if (!hosts.refusal.empty()) {
    if (rank == 0) std::fprintf(stderr, "error: %s\n", hosts.refusal.c_str());
    MPI_Finalize();
    return 2;
  }
  const int device = meshtrain::mesh::select_device(node.rank, meshtrain::kc::device_count());
  if (hosts.on) meshtrain::comm::prefer_blocking_sync(device);
  meshtrain::kc::initialize(device);
  int result = 0;
  {
    // MESHTRAIN_TEST_COMM_TIMEOUT=S (the GPU suite sets it): the collective watchdog, as
    // meshtrain train runs it, so a test that hangs in a collective ends naming it (flight
    // dumps in MESHTRAIN_TEST_FLIGHT_DIR, default the working directory) instead of running
    // into the case's timeout silently.
    std::unique_ptr<meshtrain::comm::Watchdog> watchdog;
    if (const char* t = std::getenv("MESHTRAIN_TEST_COMM_TIMEOUT"); t && std::atof(t) > 0) {
      meshtrain::comm::WatchdogConfig wc;
      wc.timeout_s = std::atof(t);
      const char* dir = std::getenv("MESHTRAIN_TEST_FLIGHT_DIR");
      wc.dump_dir = dir && *dir ? dir : ".";
      wc.world = MPI_COMM_WORLD;
      wc.world_rank = rank;
      meshtrain::comm::set_flight_recording(true);
      watchdog = std::make_unique<meshtrain::comm::Watchdog>(wc);
    }
    Catch::Session session;
    result = session.run(argc, argv);
  }
  Kokkos::finalize();
  // A failure on any rank fails the test on every rank (the launcher sees a non-zero exit).
  int worst = 0;
  MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
