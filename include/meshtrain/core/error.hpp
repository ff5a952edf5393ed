#pragma once
// Errors and check macros. Every vendor call (MPI, NCCL, CUDA, cuBLAS, HDF5) goes through a
// check macro that names the call, file:line and this process's rank.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace meshtrain {

// Concatenate anything streamable: cat("tp=", tp, " does not divide ", n).
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// An error of the program or the machine on one rank: the job is aborted.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad configuration or input that every rank detects identically (same options, same files):
// rank 0 reports it once and every rank exits with the same non-zero code, no abort needed.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// World rank of this process for messages, -1 before MPI is up. Set once by app/.
void set_error_rank(int rank);
int error_rank();

[[noreturn]] void throw_error(const std::string& what, const char* file, int line);
[[noreturn]] void throw_call_error(const char* lib, const char* call, const std::string& status,
                                   const char* file, int line);

}  // namespace meshtrain

#define MESHTRAIN_CHECK(cond, ...)                                                 \
  do {                                                                             \
    if (!(cond))                                                                   \
      ::meshtrain::throw_error(::meshtrain::cat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define MESHTRAIN_CONFIG_CHECK(cond, ...)                                 \
  do {                                                                    \
    if (!(cond)) throw ::meshtrain::ConfigError(::meshtrain::cat(__VA_ARGS__)); \
  } while (0)
