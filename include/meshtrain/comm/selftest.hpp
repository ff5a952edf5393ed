#pragma once
// A self-check of every communicator operation against values computed from rank numbers,
// used by `meshtrain selfcheck` to validate a machine and a layout before a long job.
#include <string>
#include <vector>

#include "meshtrain/comm/communicator.hpp"

namespace meshtrain::comm {

struct CheckResult {
  std::string op;
  std::size_t count = 0;
  bool ok = true;
  std::string detail;  // first mismatch, if any
};

// Collective over `c`. Runs all_reduce (sum, max), reduce_scatter, all_gather, broadcast and a
// send/recv ring for each element count in `counts`, blocking and non-blocking.
std::vector<CheckResult> self_test(Communicator& c, const std::vector<std::size_t>& counts);

}  // namespace meshtrain::comm
