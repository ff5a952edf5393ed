// The backend-independent parts of the all-to-all front ends (communicator.hpp).
#include <cstdint>

#include "meshtrain/comm/communicator.hpp"

namespace meshtrain::comm {

std::vector<std::size_t> Communicator::block_displacements(const std::vector<std::size_t>& counts,
                                                           std::size_t span,
                                                           const char* op) const {
  if (counts.size() != static_cast<std::size_t>(size()))
    throw_error(cat("comm::", op, ": ", counts.size(), " counts for a group of ", size(),
                    " ranks"),
                __FILE__, __LINE__);
  std::vector<std::size_t> displs(counts.size());
  std::size_t sum = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    displs[q] = sum;
    sum += counts[q];
  }
  check_extent(sum == span, op, sum, span);
  return displs;
}

std::vector<std::size_t> Communicator::exchange_counts(const std::vector<std::size_t>& send_counts) {
  const std::size_t n = static_cast<std::size_t>(size());
  if (send_counts.size() != n)
    throw_error(cat("comm::exchange_counts: ", send_counts.size(), " counts for a group of ", n,
                    " ranks"),
                __FILE__, __LINE__);
  std::vector<std::size_t> recv(n);
  auto copy_out = [&](const auto& h) {
    for (std::size_t q = 0; q < n; ++q) recv[q] = static_cast<std::size_t>(h(q));
  };
  Kokkos::View<std::int64_t*, Kokkos::HostSpace> hs("meshtrain::comm::counts_send", n),
      hr("meshtrain::comm::counts_recv", n);
  for (std::size_t q = 0; q < n; ++q) hs(q) = static_cast<std::int64_t>(send_counts[q]);
  if (needs_host_memory()) {
    all_to_all(hs, hr);
  } else {
    Kokkos::View<std::int64_t*, MemSpace> ds("meshtrain::comm::counts_send", n),
        dr("meshtrain::comm::counts_recv", n);
    Kokkos::deep_copy(ds, hs);
    all_to_all(ds, dr);
    Kokkos::fence();  // the receive ran on the communicator's own stream
    Kokkos::deep_copy(hr, dr);
  }
  copy_out(hr);
  return recv;
}

}  // namespace meshtrain::comm
