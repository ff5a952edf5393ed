#pragma once
// A group of one rank: every collective is a local copy (or nothing) on the execution-space
// instance, so the groups of size 1 that any layout has (dp = 1, pp = 1, a single rank's
// everything) cost no library call, no NCCL communicator and no device memory. It accepts the
// memory of the backend it stands in for, so code that works on it works on the real one.
#include "meshtrain/comm/communicator.hpp"

namespace meshtrain::comm {

class SelfCommunicator final : public Communicator {
 public:
  explicit SelfCommunicator(Backend stands_for, ExecSpace exec = ExecSpace{});

  Backend backend() const override { return backend_; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool needs_host_memory() const override { return backend_ == Backend::mpi; }

  Request iall_reduce_raw(const void* send, void* recv, std::size_t count, DType t,
                          ReduceOp op) override;
  Request ireduce_scatter_raw(const void* send, void* recv, std::size_t recv_count, DType t,
                              ReduceOp op) override;
  Request iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                          DType t) override;
  Request ibroadcast_raw(void* buf, std::size_t count, DType t, int root) override;
  Request iall_to_all_raw(const void* send, void* recv, std::size_t count, DType t) override;
  Request iall_to_allv_raw(const void* send, const std::size_t* send_counts,
                           const std::size_t* send_displs, void* recv,
                           const std::size_t* recv_counts, const std::size_t* recv_displs,
                           DType t) override;
  Request isend_raw(const void* buf, std::size_t count, DType t, int peer, int tag) override;
  Request irecv_raw(void* buf, std::size_t count, DType t, int peer, int tag) override;
  void barrier() override {}

 private:
  void copy(const void* src, void* dst, std::size_t count, DType t);
  Backend backend_;
  ExecSpace exec_;
};

}  // namespace meshtrain::comm
