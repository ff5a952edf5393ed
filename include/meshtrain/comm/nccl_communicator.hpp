#pragma once
// NCCL backend (CUDA builds only): device memory, one ncclComm per sub-communicator, its unique
// id broadcast over the MPI group. Operations run on the communicator's own stream, ordered after
// the compute instance by events, so compute can continue while NCCL works.
#include <mpi.h>

#include "meshtrain/comm/communicator.hpp"

#if defined(MESHTRAIN_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <vector>

namespace meshtrain::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`.
  NcclCommunicator(MPI_Comm comm, ExecSpace exec = ExecSpace{});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  Backend backend() const override { return Backend::nccl; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool needs_host_memory() const override { return false; }
  cudaStream_t stream() const { return stream_; }

  Request iall_reduce_raw(const void* send, void* recv, std::size_t count, DType t,
                          ReduceOp op) override;
  Request ireduce_scatter_raw(const void* send, void* recv, std::size_t recv_count, DType t,
                              ReduceOp op) override;
  Request iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                          DType t) override;
  Request ibroadcast_raw(void* buf, std::size_t count, DType t, int root) override;
  Request isend_raw(const void* buf, std::size_t count, DType t, int peer, int tag) override;
  Request irecv_raw(void* buf, std::size_t count, DType t, int peer, int tag) override;
  void barrier() override;

 private:
  void order_after_compute();
  Request make_request();
  MPI_Comm mpi_comm_;
  ExecSpace exec_;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
};

}  // namespace meshtrain::comm
#endif
