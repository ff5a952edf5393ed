#pragma once
// One communicator interface over Kokkos Views with two backends: MPI (host memory) and NCCL
// (device memory). Every operation has a non-blocking form returning a Request, so later layers
// can overlap communication with compute, and a blocking form that waits on it.
//
// Ordering contract (DESIGN invariant 5): a communicator is bound to the execution-space
// instance that produces and consumes its buffers. Before an operation reads a buffer the
// backend orders itself after the work already queued on that instance (MPI: fence; NCCL: an
// event the communication stream waits on); Request::wait() orders later work on the instance
// after the operation (MPI: MPI_Wait; NCCL: an event the compute stream waits on, no host sync).
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/kokkos_compat.hpp"

namespace meshtrain::comm {

enum class ReduceOp { sum, max, min };
enum class Backend { mpi, nccl };

const char* backend_name(Backend b);
Backend parse_backend(const std::string& s);  // "mpi" | "nccl"; ConfigError otherwise

class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

// Handle to an operation in flight. Move-only; a default-constructed Request is complete.
// Destroying an unfinished Request waits for it (a dropped request must not leave a collective
// half-done).
class Request {
 public:
  Request() = default;
  explicit Request(std::unique_ptr<RequestImpl> impl) : impl_(std::move(impl)) {}
  Request(Request&&) noexcept = default;
  Request& operator=(Request&& o) noexcept {
    if (this != &o) {
      finish_quietly();
      impl_ = std::move(o.impl_);
    }
    return *this;
  }
  ~Request() { finish_quietly(); }

  void wait() {
    if (impl_) {
      impl_->wait();
      impl_.reset();
    }
  }
  bool test() {
    if (impl_ && impl_->test()) impl_.reset();
    return !impl_;
  }
  bool pending() const { return static_cast<bool>(impl_); }

 private:
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }
  std::unique_ptr<RequestImpl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual Backend backend() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether buffers must be host-accessible (MPI) or device-accessible (NCCL).
  virtual bool needs_host_memory() const = 0;

  // ---- raw operations: counts in elements; send may equal recv (in place) for all_reduce ----
  virtual Request iall_reduce_raw(const void* send, void* recv, std::size_t count, DType t,
                                  ReduceOp op) = 0;
  // recv gets this rank's block of `recv_count` elements of the reduced send (size * recv_count).
  virtual Request ireduce_scatter_raw(const void* send, void* recv, std::size_t recv_count,
                                      DType t, ReduceOp op) = 0;
  // recv (size * send_count) gets every rank's send block in rank order.
  virtual Request iall_gather_raw(const void* send, void* recv, std::size_t send_count,
                                  DType t) = 0;
  virtual Request ibroadcast_raw(void* buf, std::size_t count, DType t, int root) = 0;
  // send and recv hold size() blocks of `count` elements; block q of send goes to rank q, and
  // recv's block q comes from rank q (MPI_Alltoall). send and recv must not overlap.
  virtual Request iall_to_all_raw(const void* send, void* recv, std::size_t count, DType t) = 0;
  // Blocks of their own sizes (MPI_Alltoallv): send block q is send_counts[q] elements at
  // send_displs[q], recv block q is recv_counts[q] elements at recv_displs[q]. The four host
  // arrays have size() entries and are copied before the call returns; recv_counts[q] on this
  // rank must equal send_counts[this rank] on rank q (exchange_counts gives them). Zero counts
  // are fine: such a rank still takes part.
  virtual Request iall_to_allv_raw(const void* send, const std::size_t* send_counts,
                                   const std::size_t* send_displs, void* recv,
                                   const std::size_t* recv_counts,
                                   const std::size_t* recv_displs, DType t) = 0;
  virtual Request isend_raw(const void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual Request irecv_raw(void* buf, std::size_t count, DType t, int peer, int tag) = 0;
  virtual void barrier() = 0;

  // Point-to-point messages to and from `peers` will not wait on one another: a receive waiting
  // for its message holds back no send, as MPI's matching promises. NCCL runs a communicator's
  // operations one after another on one stream, where a receive posted early holds back the
  // rank's own later sends (two pipeline neighbours that each post a receive before they send
  // wait for each other forever); there each direction of each pair gets a communicator and a
  // stream of its own, connected here (NCCL connects a pair at its first message, and two ranks
  // whose first messages go out on different communicators wait for each other's connection).
  // Collective over this rank and each of `peers` (each must name this rank); calls must come
  // in the same order on every rank (the pipeline runners of one pipeline, made together).
  // isend/irecv refuse a peer not prepared, on every backend, so a CPU test finds what would
  // hang on GPUs.
  void prepare_p2p(const std::vector<int>& peers);
  bool p2p_prepared(int peer) const;
  // Whether operations wait on the device rather than in the host (NCCL): a receive posted
  // early is a kernel that waits for its peer, and any device-wide synchronisation the host
  // makes meanwhile (a cudaFree, Kokkos freeing a View) waits for it too — so a rank must not
  // hold a receive whose peer's send depends on this rank's later progress. Pipelines post
  // receives only where they are consumed there (PostPolicy::at_use).
  virtual bool stream_ordered() const { return false; }

  // ---- View front ends: check extents and memory space, then call the raw operation ----
  template <class VS, class VR>
  Request iall_reduce(const VS& send, const VR& recv, ReduceOp op = ReduceOp::sum) {
    check_space<VS>("all_reduce");
    check_space<VR>("all_reduce");
    check_extent(send.span() == recv.span(), "all_reduce", send.span(), recv.span());
    return iall_reduce_raw(send.data(), recv.data(), send.span(), dtype_of_v<value_t<VS>>, op);
  }
  template <class V>
  Request iall_reduce(const V& buf, ReduceOp op = ReduceOp::sum) {
    return iall_reduce(buf, buf, op);
  }
  template <class VS, class VR>
  Request ireduce_scatter(const VS& send, const VR& recv, ReduceOp op = ReduceOp::sum) {
    check_space<VS>("reduce_scatter");
    check_space<VR>("reduce_scatter");
    check_extent(send.span() == recv.span() * static_cast<std::size_t>(size()), "reduce_scatter",
                 send.span(), recv.span() * size());
    return ireduce_scatter_raw(send.data(), recv.data(), recv.span(), dtype_of_v<value_t<VS>>, op);
  }
  template <class VS, class VR>
  Request iall_gather(const VS& send, const VR& recv) {
    check_space<VS>("all_gather");
    check_space<VR>("all_gather");
    check_extent(recv.span() == send.span() * static_cast<std::size_t>(size()), "all_gather",
                 send.span() * size(), recv.span());
    return iall_gather_raw(send.data(), recv.data(), send.span(), dtype_of_v<value_t<VS>>);
  }
  template <class V>
  Request ibroadcast(const V& buf, int root) {
    check_space<V>("broadcast");
    return ibroadcast_raw(buf.data(), buf.span(), dtype_of_v<value_t<V>>, root);
  }
  template <class VS, class VR>
  Request iall_to_all(const VS& send, const VR& recv) {
    check_space<VS>("all_to_all");
    check_space<VR>("all_to_all");
    const std::size_t n = static_cast<std::size_t>(size());
    check_extent(send.span() == recv.span() && send.span() % n == 0, "all_to_all", send.span(),
                 recv.span());
    return iall_to_all_raw(send.data(), recv.data(), send.span() / n, dtype_of_v<value_t<VS>>);
  }
  // Blocks stored back to back in rank order in both buffers; the counts (size() entries each,
  // in elements) must add up to the Views' extents.
  template <class VS, class VR>
  Request iall_to_allv(const VS& send, const std::vector<std::size_t>& send_counts,
                       const VR& recv, const std::vector<std::size_t>& recv_counts) {
    check_space<VS>("all_to_allv");
    check_space<VR>("all_to_allv");
    const auto sd = block_displacements(send_counts, send.span(), "all_to_allv (send)");
    const auto rd = block_displacements(recv_counts, recv.span(), "all_to_allv (recv)");
    return iall_to_allv_raw(send.data(), send_counts.data(), sd.data(), recv.data(),
                            recv_counts.data(), rd.data(), dtype_of_v<value_t<VS>>);
  }
  // "Counts first": what every rank will send to this one, from what this one sends to each
  // (size() entries). Blocking and collective: one all_to_all of one element per rank.
  std::vector<std::size_t> exchange_counts(const std::vector<std::size_t>& send_counts);

  template <class V>
  Request isend(const V& buf, int peer, int tag = 0) {
    check_space<V>("send");
    check_p2p_peer("send", peer);
    return isend_raw(buf.data(), buf.span(), dtype_of_v<value_t<V>>, peer, tag);
  }
  template <class V>
  Request irecv(const V& buf, int peer, int tag = 0) {
    check_space<V>("recv");
    check_p2p_peer("recv", peer);
    return irecv_raw(buf.data(), buf.span(), dtype_of_v<value_t<V>>, peer, tag);
  }

  template <class... A> void all_reduce(A&&... a) { iall_reduce(std::forward<A>(a)...).wait(); }
  template <class... A> void reduce_scatter(A&&... a) {
    ireduce_scatter(std::forward<A>(a)...).wait();
  }
  template <class... A> void all_gather(A&&... a) { iall_gather(std::forward<A>(a)...).wait(); }
  template <class... A> void broadcast(A&&... a) { ibroadcast(std::forward<A>(a)...).wait(); }
  template <class... A> void all_to_all(A&&... a) { iall_to_all(std::forward<A>(a)...).wait(); }
  template <class... A> void all_to_allv(A&&... a) {
    iall_to_allv(std::forward<A>(a)...).wait();
  }
  template <class... A> void send(A&&... a) { isend(std::forward<A>(a)...).wait(); }
  template <class... A> void recv(A&&... a) { irecv(std::forward<A>(a)...).wait(); }

 protected:
  // The backend's part of prepare_p2p, given the peers not prepared before (sorted, unique,
  // this rank left out).
  virtual void open_p2p(const std::vector<int>& new_peers) { (void)new_peers; }

 private:
  template <class V> using value_t = typename V::non_const_value_type;
  void check_p2p_peer(const char* op, int peer) const;
  std::vector<int> p2p_peers_;  // sorted

  template <class V>
  void check_space(const char* op) const {
    using M = typename V::memory_space;
    constexpr bool host_ok = Kokkos::SpaceAccessibility<Kokkos::HostSpace, M>::accessible;
    constexpr bool dev_ok = Kokkos::SpaceAccessibility<ExecSpace, M>::accessible;
    static_assert(V::rank == 1 || true);
    if (needs_host_memory() && !host_ok)
      throw_error(cat("comm::", op, ": the ", backend_name(backend()),
                      " backend needs host memory, got a View in ", M::name()),
                  __FILE__, __LINE__);
    if (!needs_host_memory() && !dev_ok)
      throw_error(cat("comm::", op, ": the ", backend_name(backend()),
                      " backend needs device memory, got a View in ", M::name()),
                  __FILE__, __LINE__);
  }
  // Exclusive prefix sums of `counts` (one per rank), checked against the buffer's extent.
  std::vector<std::size_t> block_displacements(const std::vector<std::size_t>& counts,
                                               std::size_t span, const char* op) const;
  static void check_extent(bool ok, const char* op, std::size_t a, std::size_t b) {
    if (!ok)
      throw_error(cat("comm::", op, ": buffer sizes do not match (", a, " vs ", b, " elements)"),
                  __FILE__, __LINE__);
  }
};

}  // namespace meshtrain::comm
