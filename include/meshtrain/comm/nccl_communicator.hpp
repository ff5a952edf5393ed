#pragma once
// NCCL backend (CUDA builds only): device memory, one ncclComm per sub-communicator, its unique
// id broadcast over the MPI group. Operations run on the communicator's own stream, ordered after
// the compute instance by events, so compute can continue while NCCL works. Every operation is
// recorded in the flight recorder; an event per ring slot, recorded after the operation, is
// what the watchdog thread polls for its completion (the host never waits for it), and the
// watchdog aborts the NCCL communicator (ncclCommAbort) before it aborts the job.
#include <mpi.h>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/comm/flight_recorder.hpp"

#if defined(MESHTRAIN_HAVE_NCCL)
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/mesh/mpi_comm.hpp"

namespace meshtrain::comm {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`. `name`: the flight recorder's (default: the MPI communicator's).
  NcclCommunicator(MPI_Comm comm, ExecSpace exec = ExecSpace{}, std::string name = {});
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  Backend backend() const override { return Backend::nccl; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool needs_host_memory() const override { return false; }
  cudaStream_t stream() const { return stream_; }
  const FlightRecorder& recorder() const { return recorder_; }

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
  void barrier() override;
  bool stream_ordered() const override { return true; }

 protected:
  void open_p2p(const std::vector<int>& new_peers) override;

 private:
  void order_after_compute();
  Request make_request(std::uint64_t seq);
  std::string label(OpKind op, std::size_t bytes) const;
  bool op_done(std::uint64_t seq);  // watchdog thread
  MPI_Comm mpi_comm_;
  ExecSpace exec_;
  cudaStream_t compute_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* probe_ = nullptr;  // 8 device bytes: the message that connects a pair (open_p2p)
  ncclComm_t comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  // Watchdog: one completion event per ring slot (slot = seq mod capacity), created up front.
  std::vector<cudaEvent_t> done_events_;
  std::vector<std::uint64_t> done_seq_;
  std::mutex done_mu_;
  std::atomic<bool> aborted_{false};
  FlightRecorder recorder_;
  // prepare_p2p: per peer, a communicator of the two ranks and one NCCL communicator (one
  // stream) per direction; sends to and receives from the peer go there.
  struct Pair {
    mesh::MpiComm mpi;
    std::unique_ptr<NcclCommunicator> up, down;  // lower rank -> higher, higher -> lower
  };
  std::map<int, Pair> pairs_;
  NcclCommunicator* channel(int from, int to);  // null: the main stream
};

}  // namespace meshtrain::comm
#endif
