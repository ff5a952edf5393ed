#pragma once
// Time and volume of one kind of collective over a step, for the metrics (dp comm, its hidden
// share) and the benchmarks.
#include <cstddef>

namespace meshtrain::parallel {

// total: launch to observed completion (completion is observed at the next hook or wait, so
// total is an upper bound); exposed: time the host spent in the launch calls and blocked in
// waits (on the critical path).
struct CommStats {
  double total_seconds = 0, exposed_seconds = 0;
  std::size_t ops = 0, bytes = 0;
  double hidden_fraction() const {
    return total_seconds > 0 ? 1.0 - exposed_seconds / total_seconds : 0.0;
  }
  CommStats& operator+=(const CommStats& o) {
    total_seconds += o.total_seconds;
    exposed_seconds += o.exposed_seconds;
    ops += o.ops;
    bytes += o.bytes;
    return *this;
  }
};

}  // namespace meshtrain::parallel
