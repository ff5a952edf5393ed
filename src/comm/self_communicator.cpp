#include "meshtrain/comm/self_communicator.hpp"

namespace meshtrain::comm {

SelfCommunicator::SelfCommunicator(Backend stands_for, ExecSpace exec)
    : backend_(stands_for), exec_(exec) {}

// A sum, max or min over one rank is the value itself: a copy, ordered on the instance after the
// work that produced the source (no fence: the consumer runs on the same instance).
void SelfCommunicator::copy(const void* src, void* dst, std::size_t count, DType t) {
  if (src == dst || count == 0) return;
  const std::size_t bytes = count * dtype_size(t);
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (needs_host_memory()) {
    Kokkos::View<char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> dv(d, bytes);
    Kokkos::View<const char*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> sv(
        s, bytes);
    exec_.fence();  // host memory: the copy happens now, after the queued work
    Kokkos::deep_copy(dv, sv);
  } else {
    Kokkos::View<char*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> dv(d, bytes);
    Kokkos::View<const char*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> sv(s, bytes);
    Kokkos::deep_copy(exec_, dv, sv);
  }
}

Request SelfCommunicator::iall_reduce_raw(const void* send, void* recv, std::size_t count,
                                          DType t, ReduceOp) {
  copy(send, recv, count, t);
  return Request();
}

Request SelfCommunicator::ireduce_scatter_raw(const void* send, void* recv,
                                              std::size_t recv_count, DType t, ReduceOp) {
  copy(send, recv, recv_count, t);
  return Request();
}

Request SelfCommunicator::iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                                          DType t) {
  copy(send, recv, send_count, t);
  return Request();
}

Request SelfCommunicator::ibroadcast_raw(void*, std::size_t, DType, int root) {
  MESHTRAIN_CHECK(root == 0, "broadcast from rank ", root, " in a group of one rank");
  return Request();
}

Request SelfCommunicator::iall_to_all_raw(const void* send, void* recv, std::size_t count,
                                          DType t) {
  copy(send, recv, count, t);
  return Request();
}

Request SelfCommunicator::iall_to_allv_raw(const void* send, const std::size_t* send_counts,
                                           const std::size_t* send_displs, void* recv,
                                           const std::size_t* recv_counts,
                                           const std::size_t* recv_displs, DType t) {
  MESHTRAIN_CHECK(send_counts[0] == recv_counts[0], "all_to_allv in a group of one rank: ",
                  send_counts[0], " elements sent to itself but ", recv_counts[0], " expected");
  const std::size_t b = dtype_size(t);
  copy(static_cast<const char*>(send) + send_displs[0] * b,
       static_cast<char*>(recv) + recv_displs[0] * b, send_counts[0], t);
  return Request();
}

Request SelfCommunicator::isend_raw(const void*, std::size_t, DType, int peer, int) {
  throw Error(cat("send to rank ", peer, " in a group of one rank"));
}

Request SelfCommunicator::irecv_raw(void*, std::size_t, DType, int peer, int) {
  throw Error(cat("receive from rank ", peer, " in a group of one rank"));
}

}  // namespace meshtrain::comm
