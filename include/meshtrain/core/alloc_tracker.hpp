#pragma once
// Counts the bytes of every Kokkos allocation through Kokkos' profiling callbacks (no tool
// library needed): live bytes, their peak since the last reset, and live bytes by label. This is
// what "the memory a layout allocates" means in the planner's tests and `meshtrain plan
// --plan.validate`: the Views of the model, optimizer, gradient sync and kernels, whatever
// their memory space. MPI, BLAS and the CUDA context allocate outside Kokkos and are not seen.
//
// One tracker at a time (the callbacks are process-wide); allocations made before install() are
// ignored when they are freed. Labels starting with one of `ignore_prefixes` are not counted
// (e.g. a temporary the measuring code itself allocates).
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace meshtrain {

class AllocTracker {
 public:
  explicit AllocTracker(std::vector<std::string> ignore_prefixes = {});
  ~AllocTracker();  // uninstalls the callbacks
  AllocTracker(const AllocTracker&) = delete;
  AllocTracker& operator=(const AllocTracker&) = delete;

  std::size_t live() const;
  std::size_t peak() const;   // of live() since construction or reset_peak()
  void reset_peak();          // peak = live
  // Live bytes grouped by label with the "meshtrain::" prefix removed.
  std::map<std::string, std::size_t> live_by_label() const;
};

}  // namespace meshtrain
