#pragma once
// Process-wide start-up and shut-down: MPI, Kokkos on the GPU chosen from the node-local rank,
// logging context. Only app/ touches MPI_COMM_WORLD.
#include <mpi.h>

#include "meshtrain/mesh/process_mesh.hpp"

namespace meshtrain::app {

class Runtime {
 public:
  Runtime(int& argc, char**& argv);
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

 private:
  int rank_ = 0, size_ = 1, device_ = -1;
  MPI_Comm error_comm_ = MPI_COMM_NULL;
  mesh::NodeRank node_;
};

}  // namespace meshtrain::app
