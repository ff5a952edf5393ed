#pragma once
// MESHTRAIN_MPI_CHECK(MPI_Allreduce(...)): throws meshtrain::Error naming the call, the MPI error
// string, file:line and rank. Communicators are set to MPI_ERRORS_RETURN by app/ so that errors
// reach this macro instead of aborting silently.
#include <mpi.h>

#include <string>

#include "meshtrain/core/error.hpp"

namespace meshtrain {
inline std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len) + " (" + std::to_string(code) + ")";
}
}  // namespace meshtrain

#define MESHTRAIN_MPI_CHECK(call)                                                       \
  do {                                                                                  \
    int mt_mpi_rc_ = (call);                                                            \
    if (mt_mpi_rc_ != MPI_SUCCESS)                                                      \
      ::meshtrain::throw_call_error("MPI", #call, ::meshtrain::mpi_error_string(mt_mpi_rc_), \
                                    __FILE__, __LINE__);                                \
  } while (0)
