#pragma once
// Process-wide start-up and shut-down: MPI, Kokkos on the GPU chosen from the node-local rank,
// logging context. Only app/ touches MPI_COMM_WORLD.
#include <mpi.h>

#include <string>

#include "meshtrain/mesh/process_mesh.hpp"

namespace meshtrain::app {

class Runtime {
 public:
  // `thread_level`: what MPI_Init_thread asks for (core/mpi_threads.hpp's override applies).
  Runtime(int& argc, char**& argv, int thread_level = MPI_THREAD_FUNNELED);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  MPI_Comm world() const { return MPI_COMM_WORLD; }
  // A duplicate of the world used only by the error handler (app/cli.cpp), so that its
  // agreement can never be matched with a collective another rank is still in.
  MPI_Comm error_comm() const { return error_comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  const mesh::NodeRank& node() const { return node_; }
  // Emulated hosts (MESHTRAIN_EMULATE_HOSTS=1, `jobs/local.sh --emulate-hosts`): whether this
  // rank claims a host of its own for NCCL, and why the request was refused where it cannot
  // work (empty: not refused). The subcommand raises the refusal, so it is agreed (exit 2).
  bool emulated_hosts() const { return emulated_hosts_; }
  const std::string& emulated_hosts_refusal() const { return emulated_hosts_refusal_; }
  // Whether host threads block while waiting for the GPU (comm::prefer_blocking_sync: emulated
  // hosts on a GPU build).
  bool blocking_sync() const { return blocking_sync_; }

 private:
  void emulate_hosts();
  int rank_ = 0, size_ = 1, device_ = -1;
  bool emulated_hosts_ = false, blocking_sync_ = false;
  std::string emulated_hosts_refusal_;
  MPI_Comm error_comm_ = MPI_COMM_NULL;
  mesh::NodeRank node_;
};

}  // namespace meshtrain::app
