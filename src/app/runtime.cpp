#include "meshtrain/app/runtime.hpp"

#include "meshtrain/comm/emulated_hosts.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/core/mpi_threads.hpp"

namespace meshtrain::app {

Runtime::Runtime(int& argc, char**& argv, int thread_level) {
  int provided = 0;
  // FUNNELED: only the main thread calls MPI; Kokkos host threads never do. `train` asks for
  // MULTIPLE: its background checkpoint writer calls MPI from its own thread (on its own
  // communicator); what MPI provided decides whether checkpoints may be asynchronous.
  MESHTRAIN_MPI_CHECK(MPI_Init_thread(&argc, &argv, requested_thread_level(thread_level),
                                      &provided));
  MESHTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  MESHTRAIN_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &error_comm_));
  MESHTRAIN_MPI_CHECK(MPI_Comm_set_errhandler(error_comm_, MPI_ERRORS_RETURN));
  // comm/ names processes by their ranks in the world it is handed (flight recorders, watchdog).
  comm::set_flight_world(MPI_COMM_WORLD);
  set_error_rank(rank_);
  logging::Context ctx;
  ctx.world_rank = rank_;
  logging::set_context(ctx);
  node_ = mesh::node_local_rank(MPI_COMM_WORLD);
  emulate_hosts();
  // Jobs launch with every GPU of the node visible (NCCL needs to see its peers); each rank takes
  // the one matching its node-local rank.
  device_ = mesh::select_device(node_.rank, kc::device_count());
  if (emulated_hosts_) blocking_sync_ = comm::prefer_blocking_sync(device_);
  kc::initialize(device_);
}

// Before any NCCL communicator exists (they are made after start-up).
void Runtime::emulate_hosts() {
  const comm::EmulatedHosts h = comm::claim_emulated_host(rank_, size_, node_.size);
  emulated_hosts_ = h.on;
  emulated_hosts_refusal_ = h.refusal;
}

Runtime::~Runtime() {
  if (Kokkos::is_initialized()) Kokkos::finalize();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (error_comm_ != MPI_COMM_NULL) MPI_Comm_free(&error_comm_);
    MPI_Finalize();
  }
}

}  // namespace meshtrain::app
