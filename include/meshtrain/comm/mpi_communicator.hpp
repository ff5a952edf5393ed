#pragma once
#include <mpi.h>

#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/comm/flight_recorder.hpp"

namespace meshtrain::comm {

// MPI backend: host memory, non-blocking MPI collectives and point-to-point. Borrows the
// communicator (the ProcessMesh owns it) and the execution-space instance whose work it fences
// before reading a buffer. Every operation is recorded in its flight recorder (issued when
// called, completed when its request is seen complete) for the watchdog.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, ExecSpace exec = ExecSpace{});

  Backend backend() const override { return Backend::mpi; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool needs_host_memory() const override { return true; }
  MPI_Comm get() const { return comm_; }
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

 private:
  void order_after_compute();
  static MPI_Comm checked(MPI_Comm comm);
  Request wrap(MPI_Request r, std::uint64_t seq, std::vector<int> keep, OpKind op);
  std::string label(OpKind op, std::size_t bytes) const;
  MPI_Comm comm_;
  ExecSpace exec_;
  FlightRecorder recorder_;
  int rank_ = 0, size_ = 1;
};

// The MPI type of reductions (16-bit floating point refused with a message: MPI has none) and
// of data movement (gathers, broadcasts, all-to-alls, send / recv: 16-bit types travel as
// their bits, MPI_UINT16_T).
MPI_Datatype mpi_type(DType t);
MPI_Datatype mpi_move_type(DType t);
MPI_Op mpi_op(ReduceOp op);

}  // namespace meshtrain::comm
