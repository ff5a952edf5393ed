#include "meshtrain/core/mpi_threads.hpp"

#include <cstdlib>
#include <string>

#include "meshtrain/core/error.hpp"

namespace meshtrain {

int requested_thread_level(int wanted) {
  const char* v = std::getenv("MESHTRAIN_MPI_THREAD_LEVEL");
  if (!v || !*v) return wanted;
  const std::string s = v;
  if (s == "funneled") return MPI_THREAD_FUNNELED;
  if (s == "multiple") return MPI_THREAD_MULTIPLE;
  throw ConfigError(cat("MESHTRAIN_MPI_THREAD_LEVEL='", s, "' is not one of funneled, multiple"));
}

bool mpi_thread_multiple() {
  int provided = MPI_THREAD_SINGLE;
  if (MPI_Query_thread(&provided) != MPI_SUCCESS) return false;
  return provided == MPI_THREAD_MULTIPLE;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
  }
}

}  // namespace meshtrain
