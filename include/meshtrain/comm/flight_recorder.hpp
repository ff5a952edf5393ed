#pragma once
// Flight recorder of a communicator (after PyTorch's NCCL flight recorder): the last N
// operations it issued, each with its sequence number, kind, size, peer, start time and state,
// in a ring. The backend records an operation when it issues it and completes it when its
// request is seen complete (MPI: wait/test; NCCL: the watchdog polls the operation's event).
// The watchdog (comm/watchdog.hpp) reads every recorder from its own thread, so entries are
// guarded by a mutex; the cost is one uncontended lock and one clock read per operation.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <mpi.h>

namespace meshtrain::comm {

enum class OpKind : std::uint8_t {
  all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier, all_to_all, all_to_allv
};
const char* op_name(OpKind k);

struct FlightEntry {
  std::uint64_t seq = 0;  // 1, 2, ... per communicator, in issue order
  OpKind op = OpKind::barrier;
  bool completed = false;
  std::size_t bytes = 0;
  int peer = -1;          // send/recv: the peer, broadcast: the root (communicator ranks)
  double start_s = 0;     // seconds on the process's steady clock (flight_clock())
  double end_s = 0;       // when it was seen complete
};

double flight_clock();

// A fault injected for the tests of the watchdog (MESHTRAIN_TEST_COLLECTIVE, set by `meshtrain
// train`): on world rank `world_rank`, operation number `seq` of the communicator named `comm`
// is stalled (the process stops itself with SIGSTOP, as a hung node would) or skipped (returns
// at once without communicating, as a rank that took another code path would).
struct CollectiveFault {
  enum Kind { none, stall, skip } kind = none;
  int world_rank = -1;
  std::string comm;
  std::uint64_t seq = 0;
};
void set_collective_fault(const CollectiveFault& f);

// Recording on or off for the whole process (comm.timeout 0 turns it off with the watchdog).
void set_flight_recording(bool on);
bool flight_recording();

// The communicator whose ranks name a recorder's members (its world ranks: the dumps, the fault
// hook, the watchdog's messages), for every recorder made after the call. app/ hands the world
// communicator down at start-up (so do the test and bench mains); nothing below app/ fetches
// MPI_COMM_WORLD. Until it is set, a recorder names members by its own communicator's ranks.
void set_flight_world(MPI_Comm world);

class FlightRecorder {
 public:
  static constexpr std::size_t kDefaultCapacity = 256;
  // `comm`: the MPI communicator the operations run over; its members are translated to world
  // ranks (the ranks of the communicator given to set_flight_world). The recorder is named `name`, or by default after the communicator
  // (MPI_Comm_get_name: "world", "tp", "dp", ... as ProcessMesh names them).
  explicit FlightRecorder(MPI_Comm comm, std::string name = {},
                          std::size_t capacity = kDefaultCapacity);
  ~FlightRecorder();  // unregisters from the watchdog's list
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Issuing thread. begin() returns the operation's sequence number, or 0 when recording is
  // off. Sets *skip when the test fault says to skip this operation (it may also stop the
  // process here).
  std::uint64_t begin(OpKind op, std::size_t bytes, int peer, bool* skip = nullptr);
  void complete(std::uint64_t seq);

  // Backends whose completion the issuing thread does not see (NCCL: Request::wait only orders
  // the compute stream) give a poll: done(seq) is asked by the watchdog thread for the oldest
  // outstanding operations in order; it must be safe to call from that thread.
  void set_completion_poll(std::function<bool(std::uint64_t)> done);
  // What the watchdog does before aborting the job (NCCL: ncclCommAbort, so the process is not
  // held by kernels waiting for peers), and an asynchronous error it should report (NCCL:
  // ncclCommGetAsyncError; empty when none).
  void set_abort(std::function<void()> abort);
  void set_async_error(std::function<std::string()> error);

  // Any thread.
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  int rank() const { return rank_; }
  std::uint64_t issued() const;
  // The oldest operation not seen complete (after polling), if any.
  bool oldest_outstanding(FlightEntry& out);
  std::vector<FlightEntry> entries() const;  // oldest first
  void abort() const;
  std::string async_error() const;

 private:
  mutable std::mutex mu_;
  std::string name_;
  std::vector<int> world_ranks_;
  int rank_ = 0, world_rank_ = 0;
  std::vector<FlightEntry> ring_;
  std::uint64_t next_ = 1;
  std::function<bool(std::uint64_t)> poll_;
  std::function<void()> abort_;
  std::function<std::string()> async_error_;
};

// The recorders that exist now (the watchdog's view). The callback runs under the list's lock.
void for_each_recorder(const std::function<void(FlightRecorder&)>& f);

}  // namespace meshtrain::comm
