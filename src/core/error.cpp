#include "meshtrain/core/error.hpp"

namespace meshtrain {

namespace {
int g_error_rank = -1;
}

void set_error_rank(int rank) { g_error_rank = rank; }
int error_rank() { return g_error_rank; }

void throw_error(const std::string& what, const char* file, int line) {
  throw Error(cat(what, " [rank ", g_error_rank, ", ", file, ":", line, "]"));
}

void throw_call_error(const char* lib, const char* call, const std::string& status,
                      const char* file, int line) {
  throw Error(cat(lib, " call failed: ", call, " returned ", status, " [rank ", g_error_rank,
                  ", ", file, ":", line, "]"));
}

}  // namespace meshtrain
