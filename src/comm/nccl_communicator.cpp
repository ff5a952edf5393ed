// Compiled only when MESHTRAIN_HAVE_NCCL (see src/CMakeLists.txt).
#include "meshtrain/core/profile.hpp"
#include "meshtrain/comm/nccl_communicator.hpp"

#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/mpi_check.hpp"

#include <algorithm>

namespace meshtrain::comm {

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// Completion = an event recorded on the NCCL stream after the operation. wait() makes the
// compute stream wait for it on the device; the host does not block.
class NcclRequest final : public RequestImpl {
 public:
  NcclRequest(cudaEvent_t ev, cudaStream_t compute) : ev_(ev), compute_(compute) {}
  ~NcclRequest() override {
    if (ev_) cudaEventDestroy(ev_);
  }
  void wait() override {
    MESHTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev_, 0));
  }
  bool test() override {
    cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaErrorNotReady) return false;
    MESHTRAIN_CUDA_CHECK(rc);
    return true;
  }

 private:
  cudaEvent_t ev_;
  cudaStream_t compute_;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, ExecSpace exec, std::string name)
    : mpi_comm_(comm), exec_(exec), recorder_(comm, std::move(name)) {
  MESHTRAIN_CHECK(comm != MPI_COMM_NULL, "NcclCommunicator needs a communicator this rank is in");
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(comm, &rank_));
  MESHTRAIN_MPI_CHECK(MPI_Comm_size(comm, &size_));
  compute_stream_ = exec_.cuda_stream();
  MESHTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MESHTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MESHTRAIN_CUDA_CHECK(cudaMalloc(&probe_, 8));
  ncclUniqueId id;
  if (rank_ == 0) MESHTRAIN_NCCL_CHECK(ncclGetUniqueId(&id));
  MESHTRAIN_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  MESHTRAIN_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  done_events_.resize(FlightRecorder::kDefaultCapacity, nullptr);
  done_seq_.assign(done_events_.size(), 0);
  for (auto& ev : done_events_)
    MESHTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  recorder_.set_completion_poll([this](std::uint64_t seq) { return op_done(seq); });
  // ncclCommAbort is the one NCCL call that may be made while another thread is blocked in
  // NCCL: it makes the kernels waiting for absent peers return, so the process can exit.
  recorder_.set_abort([this] {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  });
  recorder_.set_async_error([this]() -> std::string {
    if (aborted_) return {};
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || async == ncclSuccess) return {};
    return cat(ncclGetErrorString(async), " (ncclCommGetAsyncError)");
  });
}

// Watchdog thread: whether operation `seq` has finished on the NCCL stream. Its slot's event
// may since have been recorded for a later operation (more than the ring's capacity in
// flight); that one finishing implies `seq` has (one stream, in order), and it running only
// makes the watchdog see `seq` as older than it is.
bool NcclCommunicator::op_done(std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(done_mu_);
  const std::size_t slot = seq % done_events_.size();
  if (done_seq_[slot] < seq) return false;  // not recorded yet
  return cudaEventQuery(done_events_[slot]) == cudaSuccess;
}

NcclCommunicator::~NcclCommunicator() {
  pairs_.clear();  // their NCCL communicators before this one's
  recorder_.set_completion_poll({});
  recorder_.set_abort({});
  recorder_.set_async_error({});
  for (auto ev : done_events_)
    if (ev) cudaEventDestroy(ev);
  if (comm_ && !aborted_) ncclCommDestroy(comm_);
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  if (probe_) cudaFree(probe_);
}

// The NCCL stream must not read a buffer before the compute stream has written it.
void NcclCommunicator::order_after_compute() {
  MESHTRAIN_CUDA_CHECK(cudaEventRecord(ready_, compute_stream_));
  MESHTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
}

// "all_reduce dp 1.5 MiB": the profiler range of an operation's issue (core/profile.hpp); the
// kernel itself shows on the GPU rows of the timeline.
std::string NcclCommunicator::label(OpKind op, std::size_t bytes) const {
  return cat(op_name(op), " ", recorder_.name(), " ", prof::bytes_label(bytes));
}

Request NcclCommunicator::make_request(std::uint64_t seq) {
  if (seq != 0) {
    std::lock_guard<std::mutex> lock(done_mu_);
    const std::size_t slot = seq % done_events_.size();
    MESHTRAIN_CUDA_CHECK(cudaEventRecord(done_events_[slot], stream_));
    done_seq_[slot] = seq;
  }
  cudaEvent_t ev;
  MESHTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  MESHTRAIN_CUDA_CHECK(cudaEventRecord(ev, stream_));
  return Request(std::make_unique<NcclRequest>(ev, compute_stream_));
}

Request NcclCommunicator::iall_reduce_raw(const void* send, void* recv, std::size_t count,
                                          DType t, ReduceOp op) {
  const prof::Range range([&] { return label(OpKind::all_reduce, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::all_reduce, count * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(
      ncclAllReduce(send, recv, count, nccl_type(t), nccl_op(op), comm_, stream_));
  return make_request(seq);
}

Request NcclCommunicator::ireduce_scatter_raw(const void* send, void* recv,
                                              std::size_t recv_count, DType t, ReduceOp op) {
  const prof::Range range([&] {
    return label(OpKind::reduce_scatter, recv_count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::reduce_scatter, recv_count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(
      ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, stream_));
  return make_request(seq);
}

Request NcclCommunicator::iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                                          DType t) {
  const prof::Range range([&] {
    return label(OpKind::all_gather, send_count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::all_gather, send_count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(t), comm_, stream_));
  return make_request(seq);
}

Request NcclCommunicator::ibroadcast_raw(void* buf, std::size_t count, DType t, int root) {
  const prof::Range range([&] { return label(OpKind::broadcast, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::broadcast, count * dtype_size(t), root, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_));
  return make_request(seq);
}

// NCCL has no all-to-all collective: one send and one receive per peer inside a group call,
// which NCCL runs as one operation (its documented all-to-all pattern). Zero-sized blocks are
// left out on both sides (the counts agree, so the pairs still match).
Request NcclCommunicator::iall_to_all_raw(const void* send, void* recv, std::size_t count,
                                          DType t) {
  std::vector<std::size_t> displs(size_);
  for (int q = 0; q < size_; ++q) displs[q] = q * count;
  const prof::Range range([&] {
    return label(OpKind::all_to_all, count * std::size_t(size_) * dtype_size(t));
  });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(
      OpKind::all_to_all, count * static_cast<std::size_t>(size_) * dtype_size(t), -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  const std::size_t b = dtype_size(t);
  MESHTRAIN_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < size_ && count > 0; ++q) {
    MESHTRAIN_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + displs[q] * b, count,
                                  nccl_type(t), q, comm_, stream_));
    MESHTRAIN_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + displs[q] * b, count, nccl_type(t),
                                  q, comm_, stream_));
  }
  MESHTRAIN_NCCL_CHECK(ncclGroupEnd());
  return make_request(seq);
}

Request NcclCommunicator::iall_to_allv_raw(const void* send, const std::size_t* send_counts,
                                           const std::size_t* send_displs, void* recv,
                                           const std::size_t* recv_counts,
                                           const std::size_t* recv_displs, DType t) {
  std::size_t bytes = 0;
  for (int q = 0; q < size_; ++q) bytes += send_counts[q] * dtype_size(t);
  const prof::Range range([&] { return label(OpKind::all_to_allv, bytes); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::all_to_allv, bytes, -1, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  const std::size_t b = dtype_size(t);
  MESHTRAIN_NCCL_CHECK(ncclGroupStart());
  for (int q = 0; q < size_; ++q) {
    if (send_counts[q] > 0)
      MESHTRAIN_NCCL_CHECK(ncclSend(static_cast<const char*>(send) + send_displs[q] * b,
                                    send_counts[q], nccl_type(t), q, comm_, stream_));
    if (recv_counts[q] > 0)
      MESHTRAIN_NCCL_CHECK(ncclRecv(static_cast<char*>(recv) + recv_displs[q] * b,
                                    recv_counts[q], nccl_type(t), q, comm_, stream_));
  }
  MESHTRAIN_NCCL_CHECK(ncclGroupEnd());
  return make_request(seq);
}

// Pairs are made lowest first (by lower rank, then higher), the same order on every rank, so
// each rank waits only for a partner that is making the same pair: MPI_Comm_create_group and
// ncclCommInitRank are collective over the two ranks alone. Each direction is connected here,
// by one message, in that same order: NCCL connects a pair at its first message, the host
// waiting in ncclSend/ncclRecv for the peer to connect too, so a ring whose ranks each send
// first (on their own pair) would otherwise wait on one another forever.
void NcclCommunicator::open_p2p(const std::vector<int>& todo) {
  // Ascending peers are ascending (min, max) keys among this rank's pairs: below it, the key's
  // minimum is the peer; above it, the minimum is this rank, and the maximum ascends.
  char parent[MPI_MAX_OBJECT_NAME] = {0};
  int len = 0;
  MESHTRAIN_MPI_CHECK(MPI_Comm_get_name(mpi_comm_, parent, &len));
  MPI_Group all;
  MESHTRAIN_MPI_CHECK(MPI_Comm_group(mpi_comm_, &all));
  for (int p : todo) {
    const int lo = std::min(p, rank_), hi = std::max(p, rank_);
    const int members[2] = {lo, hi};
    MPI_Group two;
    MESHTRAIN_MPI_CHECK(MPI_Group_incl(all, 2, members, &two));
    MPI_Comm pair_comm = MPI_COMM_NULL;
    MESHTRAIN_MPI_CHECK(MPI_Comm_create_group(mpi_comm_, two, 0, &pair_comm));
    MESHTRAIN_MPI_CHECK(MPI_Group_free(&two));
    Pair& pr = pairs_[p];
    pr.mpi = mesh::MpiComm(pair_comm);
    const std::string base = len > 0 ? std::string(parent, static_cast<std::size_t>(len)) : "p2p";
    pr.up = std::make_unique<NcclCommunicator>(pair_comm, exec_, cat(base, " ", lo, ">", hi));
    pr.down = std::make_unique<NcclCommunicator>(pair_comm, exec_, cat(base, " ", hi, ">", lo));
    const bool low = rank_ == lo;  // pair rank 0
    for (NcclCommunicator* c : {pr.up.get(), pr.down.get()}) {
      const bool sends = (c == pr.up.get()) == low;
      Request r = sends ? c->isend_raw(c->probe_, 1, DType::u8, low ? 1 : 0, 0)
                        : c->irecv_raw(c->probe_, 1, DType::u8, low ? 1 : 0, 0);
      r.wait();
      MESHTRAIN_CUDA_CHECK(cudaStreamSynchronize(c->stream_));
    }
  }
  MESHTRAIN_MPI_CHECK(MPI_Group_free(&all));
}

NcclCommunicator* NcclCommunicator::channel(int from, int to) {
  const auto it = pairs_.find(from == rank_ ? to : from);
  if (it == pairs_.end()) return nullptr;
  return from < to ? it->second.up.get() : it->second.down.get();
}

// NCCL has no tags: messages between one pair of ranks are matched in issue order. To a peer of
// prepare_p2p, the direction's own communicator (pair rank: 0 the lower rank, 1 the higher).
// NCCL runs a message to this rank itself only inside a group with its receive; sent alone it
// waits for a receive queued behind it on the same stream.
static void refuse_self_message(int rank, int peer) {
  MESHTRAIN_CHECK(peer != rank, "comm: rank ", rank, " sends a message to itself over NCCL, "
                  "which would hang (pp.schedule interleaved with mesh.pp 1 does: use mesh.pp 2 "
                  "or more, or pp.virtual_chunks 1)");
}

Request NcclCommunicator::isend_raw(const void* buf, std::size_t count, DType t, int peer,
                                    int tag) {
  refuse_self_message(rank_, peer);
  if (NcclCommunicator* c = channel(rank_, peer)) return c->isend_raw(buf, count, t, peer > rank_, tag);
  const prof::Range range([&] { return label(OpKind::send, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::send, count * dtype_size(t), peer, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(ncclSend(buf, count, nccl_type(t), peer, comm_, stream_));
  return make_request(seq);
}

Request NcclCommunicator::irecv_raw(void* buf, std::size_t count, DType t, int peer,
                                    int tag) {
  refuse_self_message(rank_, peer);
  if (NcclCommunicator* c = channel(peer, rank_)) return c->irecv_raw(buf, count, t, peer > rank_, tag);
  const prof::Range range([&] { return label(OpKind::recv, count * dtype_size(t)); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::recv, count * dtype_size(t), peer, &skip);
  if (skip) return Request();  // test fault: this rank leaves the operation out
  order_after_compute();
  MESHTRAIN_NCCL_CHECK(ncclRecv(buf, count, nccl_type(t), peer, comm_, stream_));
  return make_request(seq);
}

void NcclCommunicator::barrier() {
  const prof::Range range([&] { return label(OpKind::barrier, 0); });
  bool skip = false;
  const std::uint64_t seq = recorder_.begin(OpKind::barrier, 0, -1, &skip);
  if (skip) return;
  MESHTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_stream_));
  MESHTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MESHTRAIN_MPI_CHECK(MPI_Barrier(mpi_comm_));
  recorder_.complete(seq);
}

}  // namespace meshtrain::comm
