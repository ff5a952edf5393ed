#pragma once
#include <memory>
#include <vector>

#include <mpi.h>

#include "meshtrain/comm/communicator.hpp"

namespace meshtrain::comm {

// Backends compiled into this build: {mpi} on CPU builds, {mpi, nccl} with NCCL.
std::vector<Backend> available_backends();

// The backend for tensors in the default memory space: NCCL where the default execution space
// is a GPU and NCCL was built, MPI otherwise.
Backend default_backend();

// Collective over `comm` (NCCL creates its communicator here). `comm` must outlive the result.
std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm comm,
                                                ExecSpace exec = ExecSpace{});

// A parallel group's communicator: a SelfCommunicator standing in for `b` when the group has one
// rank (no library communicator, no collective calls), make_communicator otherwise.
std::unique_ptr<Communicator> make_group_communicator(Backend b, MPI_Comm comm,
                                                      ExecSpace exec = ExecSpace{});

}  // namespace meshtrain::comm
