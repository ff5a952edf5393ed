#pragma once
// Shared by the MoE tests that compare per-rank host results over a communicator.
#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"

namespace mt_test {

// Sum a host vector over `c` (NCCL reduces device memory only: staged through the device).
inline void all_reduce_host(meshtrain::comm::Communicator& c, meshtrain::HostView1<double> h) {
  if (c.needs_host_memory()) {
    c.all_reduce(h);
    return;
  }
  auto d = meshtrain::alloc<double>("test.sum", h.extent(0));
  Kokkos::deep_copy(d, h);
  c.all_reduce(d);
  Kokkos::deep_copy(h, d);
}

}  // namespace mt_test
