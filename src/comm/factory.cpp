#include "meshtrain/comm/factory.hpp"

#include "meshtrain/comm/mpi_communicator.hpp"
#include "meshtrain/comm/nccl_communicator.hpp"
#include "meshtrain/comm/self_communicator.hpp"
#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain::comm {

const char* backend_name(Backend b) { return b == Backend::mpi ? "mpi" : "nccl"; }

Backend parse_backend(const std::string& s) {
  if (s == "mpi") return Backend::mpi;
  if (s == "nccl") {
#if defined(MESHTRAIN_HAVE_NCCL)
    return Backend::nccl;
#else
    throw ConfigError("comm.backend=nccl but this build has no NCCL (configure with the cuda preset)");
#endif
  }
  throw ConfigError(cat("comm.backend='", s, "' is not one of auto, mpi, nccl"));
}

std::vector<Backend> available_backends() {
#if defined(MESHTRAIN_HAVE_NCCL)
  return {Backend::mpi, Backend::nccl};
#else
  return {Backend::mpi};
#endif
}

Backend default_backend() {
#if defined(MESHTRAIN_HAVE_NCCL)
  return kDeviceIsHost ? Backend::mpi : Backend::nccl;
#else
  return Backend::mpi;
#endif
}

std::unique_ptr<Communicator> make_communicator(Backend b, MPI_Comm comm, ExecSpace exec) {
  switch (b) {
    case Backend::mpi: return std::make_unique<MpiCommunicator>(comm, exec);
    case Backend::nccl:
#if defined(MESHTRAIN_HAVE_NCCL)
      return std::make_unique<NcclCommunicator>(comm, exec);
#else
      break;
#endif
  }
  throw ConfigError("the NCCL backend is not part of this build (configure with the cuda preset)");
}

std::unique_ptr<Communicator> make_group_communicator(Backend b, MPI_Comm comm, ExecSpace exec) {
  int size = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size == 1) {
    if (b == Backend::nccl) parse_backend("nccl");  // the same error as make_communicator's
    return std::make_unique<SelfCommunicator>(b, exec);
  }
  return make_communicator(b, comm, exec);
}

}  // namespace meshtrain::comm
