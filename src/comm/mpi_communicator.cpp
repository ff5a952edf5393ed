#include "meshtrain/core/profile.hpp"
#include "meshtrain/comm/mpi_communicator.hpp"

#include <climits>

#include "meshtrain/core/mpi_check.hpp"

namespace meshtrain::comm {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::bf16:
    case DType::f16: break;
  }
  throw Error(cat("the MPI backend does not reduce ", dtype_name(t),
                  " buffers; use float32 host buffers or the NCCL backend"));
}

MPI_Datatype mpi_move_type(DType t) {
  // MPI has no 16-bit floating-point type; moving their bits needs none.
  if (t == DType::bf16 || t == DType::f16) return MPI_UINT16_T;
  return mpi_type(t);
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

namespace {

// Completion is seen here, on the issuing thread, and reported to the flight recorder. `keep`
// holds what MPI reads until completion (MPI_Ialltoallv's count and displacement arrays).
class MpiRequest final : public RequestImpl {
 public:
  MpiRequest(MPI_Request r, FlightRecorder* rec, std::uint64_t seq, std::vector<int> keep,
             OpKind op)
      : req_(r), rec_(rec), seq_(seq), keep_(std::move(keep)), op_(op) {}
  void wait() override {
    const prof::Range range([&] { return cat("wait ", op_name(op_), " ", rec_->name()); });
    MESHTRAIN_MPI_CHECK(MPI_Wait(&req_, MPI_STATUS_IGNORE));
    rec_->complete(seq_);
  }
  bool test() override {
    int flag = 0;
    MESHTRAIN_MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    if (flag) rec_->complete(seq_);
    return flag != 0;
  }

 private:
  MPI_Request req_;
  FlightRecorder* rec_;
  std::uint64_t seq_;
  std::vector<int> keep_;
  OpKind op_;
};

int as_count(std::size_t n) {
  MESHTRAIN_CHECK(n <= static_cast<std::size_t>(INT_MAX), "MPI count ", n,
                  " exceeds INT_MAX; split the buffer");
  return static_cast<int>(n);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, ExecSpace exec)
    : comm_(comm), exec_(exec), recorder_(checked(comm)) {
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MPI_Comm MpiCommunicator::checked(MPI_Comm comm) {
  MESHTRAIN_CHECK(comm != MPI_COMM_NULL, "MpiCommunicator needs a communicator this rank is in");
  return comm;
}

Request MpiCommunicator::wrap(MPI_Request r, std::uint64_t seq, std::vector<int> keep,
                              OpKind op) {
  return Request(std::make_unique<MpiRequest>(r, &recorder_, seq, std::move(keep), op));
}

// "all_reduce dp 1.5 MiB": the profiler range of an operation (core/profile.hpp).
std::string MpiCommunicator::label(OpKind op, std::size_t bytes) const {
  return cat(op_name(op), " ", recorder_.name(), " ", prof::bytes_label(bytes));
}

// MPI reads host memory directly: whatever the instance still has queued may be writing it.
void MpiCommunicator::order_after_compute() { kc::fence(exec_, "meshtrain::comm::mpi_order"); }

Request MpiCommunicator::iall_reduce_raw(const void* send, void* recv, std::size_t count,
                                         DType t, ReduceOp op) {
  const prof::Range range([&] { return label(OpKind::all_reduce, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::all_reduce, count * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  const void* s = send == recv ? MPI_IN_PLACE : send;
  MESHTRAIN_MPI_CHECK(
      MPI_Iallreduce(s, recv, as_count(count), mpi_type(t), mpi_op(op), comm_, &r));
  return wrap(r, seq, {}, OpKind::all_reduce);
}

Request MpiCommunicator::ireduce_scatter_raw(const void* send, void* recv,
                                             std::size_t recv_count, DType t, ReduceOp op) {
  const prof::Range range([&] {
    return label(OpKind::reduce_scatter, recv_count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::reduce_scatter, recv_count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  MESHTRAIN_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, as_count(recv_count), mpi_type(t),
                                                mpi_op(op), comm_, &r));
  return wrap(r, seq, {}, OpKind::reduce_scatter);
}

Request MpiCommunicator::iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                                         DType t) {
  const prof::Range range([&] {
    return label(OpKind::all_gather, send_count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::all_gather, send_count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  const int n = as_count(send_count);
  const MPI_Datatype mt = mpi_move_type(t);
  MESHTRAIN_MPI_CHECK(MPI_Iallgather(send, n, mt, recv, n, mt, comm_, &r));
  return wrap(r, seq, {}, OpKind::all_gather);
}

Request MpiCommunicator::ibroadcast_raw(void* buf, std::size_t count, DType t, int root) {
  const prof::Range range([&] { return label(OpKind::broadcast, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::broadcast, count * dtype_size(t), root, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  MESHTRAIN_MPI_CHECK(MPI_Ibcast(buf, as_count(count), mpi_move_type(t), root, comm_, &r));
  return wrap(r, seq, {}, OpKind::broadcast);
}

Request MpiCommunicator::iall_to_all_raw(const void* send, void* recv, std::size_t count,
                                         DType t) {
  const prof::Range range([&] {
    return label(OpKind::all_to_all, count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::all_to_all, count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  const int n = as_count(count);
  const MPI_Datatype mt = mpi_move_type(t);
  MESHTRAIN_MPI_CHECK(MPI_Ialltoall(send, n, mt, recv, n, mt, comm_, &r));
  return wrap(r, seq, {}, OpKind::all_to_all);
}

Request MpiCommunicator::iall_to_allv_raw(const void* send, const std::size_t* send_counts,
                                          const std::size_t* send_displs, void* recv,
                                          const std::size_t* recv_counts,
                                          const std::size_t* recv_displs, DType t) {
  // MPI takes int counts and displacements in four arrays that must live until completion.
  std::vector<int> a(4 * static_cast<std::size_t>(size_));
  int* sc = a.data();
  int* sd = sc + size_;
  int* rc = sd + size_;
  int* rd = rc + size_;
  std::size_t bytes = 0;
  for (int q = 0; q < size_; ++q) {
    sc[q] = as_count(send_counts[q]);
    sd[q] = as_count(send_displs[q]);
    rc[q] = as_count(recv_counts[q]);
    rd[q] = as_count(recv_displs[q]);
    bytes += send_counts[q] * dtype_size(t);
  }
  const prof::Range range([&] { return label(OpKind::all_to_allv, bytes); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::all_to_allv, bytes, -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  const MPI_Datatype mt = mpi_move_type(t);
  MESHTRAIN_MPI_CHECK(MPI_Ialltoallv(send, sc, sd, mt, recv, rc, rd, mt, comm_, &r));
  return wrap(r, seq, std::move(a), OpKind::all_to_allv);
}

Request MpiCommunicator::isend_raw(const void* buf, std::size_t count, DType t, int peer,
                                   int tag) {
  const prof::Range range([&] { return label(OpKind::send, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::send, count * dtype_size(t), peer, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  MESHTRAIN_MPI_CHECK(MPI_Isend(buf, as_count(count), mpi_move_type(t), peer, tag, comm_, &r));
  return wrap(r, seq, {}, OpKind::send);
}

Request MpiCommunicator::irecv_raw(void* buf, std::size_t count, DType t, int peer, int tag) {
  const prof::Range range([&] { return label(OpKind::recv, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::recv, count * dtype_size(t), peer, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MPI_Request r;
  MESHTRAIN_MPI_CHECK(MPI_Irecv(buf, as_count(count), mpi_move_type(t), peer, tag, comm_, &r));
  return wrap(r, seq, {}, OpKind::recv);
}

void MpiCommunicator::barrier() {
  const prof::Range range([&] { return label(OpKind::barrier, 0); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::barrier, 0, -1, &skip);
  if (skip) return;
  order_after_compute();
  MESHTRAIN_MPI_CHECK(MPI_Barrier(comm_));
  recorder_.complete(seq);
}

}  // namespace meshtrain::comm
