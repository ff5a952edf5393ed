#pragma once
// Which MPI thread level a process asks for, and whether it got MPI_THREAD_MULTIPLE. The
// background checkpoint writer (io/checkpoint_async.hpp) calls MPI from its own thread, on its
// own communicator, at the same time as the training thread: that is only legal under
// MPI_THREAD_MULTIPLE. Open MPI 4.1 (Debian 12, the CI machine) provides it; an MPI that does
// not makes checkpoints synchronous again (app/train_cmd.cpp warns once).
#include <mpi.h>

namespace meshtrain {

// `wanted`, unless MESHTRAIN_MPI_THREAD_LEVEL says otherwise: `funneled` or `multiple` (tests
// use it to run the fallback of an MPI without MPI_THREAD_MULTIPLE, and the test harness to
// ask for MULTIPLE). ConfigError for another value.
int requested_thread_level(int wanted);
// After MPI_Init_thread: whether MPI_Query_thread reports MPI_THREAD_MULTIPLE.
bool mpi_thread_multiple();
// "MPI_THREAD_FUNNELED" for the provided level.
const char* thread_level_name(int level);

}  // namespace meshtrain
