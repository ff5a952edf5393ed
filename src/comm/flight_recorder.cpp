#include "meshtrain/comm/flight_recorder.hpp"

#include <atomic>
#include <algorithm>
#include <chrono>
#include <csignal>

namespace meshtrain::comm {

namespace {

std::atomic<bool> g_recording{true};

std::mutex g_fault_mu;
CollectiveFault g_fault;
std::atomic<bool> g_fault_armed{false};

std::mutex g_list_mu;
std::vector<FlightRecorder*> g_recorders;

const auto g_t0 = std::chrono::steady_clock::now();

// Set once by the main thread at start-up, before any recorder or the watchdog exists.
MPI_Comm g_world = MPI_COMM_NULL;

std::string comm_name(MPI_Comm comm) {
  char buf[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  MPI_Comm_get_name(comm, buf, &len);
  return len > 0 ? std::string(buf, static_cast<std::size_t>(len)) : std::string("comm");
}

}  // namespace

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::all_reduce: return "all_reduce";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::all_gather: return "all_gather";
    case OpKind::broadcast: return "broadcast";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::barrier: return "barrier";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::all_to_allv: return "all_to_allv";
  }
  return "?";
}

double flight_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - g_t0).count();
}

void set_collective_fault(const CollectiveFault& f) {
  std::lock_guard<std::mutex> lock(g_fault_mu);
  g_fault = f;
  g_fault_armed = f.kind != CollectiveFault::none;
}

void set_flight_recording(bool on) { g_recording = on; }
bool flight_recording() { return g_recording; }

void set_flight_world(MPI_Comm world) { g_world = world; }

FlightRecorder::FlightRecorder(MPI_Comm comm, std::string name, std::size_t capacity)
    : name_(name.empty() ? comm_name(comm) : std::move(name)), ring_(capacity > 0 ? capacity : 1) {
  const MPI_Comm world_comm = g_world != MPI_COMM_NULL ? g_world : comm;
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_rank(world_comm, &world_rank_);
  int size = 1;
  MPI_Comm_size(comm, &size);
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(world_comm, &world);
  std::vector<int> mine(static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) mine[static_cast<std::size_t>(i)] = i;
  world_ranks_.assign(static_cast<std::size_t>(size), -1);
  MPI_Group_translate_ranks(group, size, mine.data(), world, world_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  std::lock_guard<std::mutex> lock(g_list_mu);
  g_recorders.push_back(this);
}

FlightRecorder::~FlightRecorder() {
  std::lock_guard<std::mutex> lock(g_list_mu);
  for (auto it = g_recorders.begin(); it != g_recorders.end(); ++it)
    if (*it == this) {
      g_recorders.erase(it);
      break;
    }
}

std::uint64_t FlightRecorder::begin(OpKind op, std::size_t bytes, int peer, bool* skip) {
  if (!g_recording.load(std::memory_order_relaxed)) return 0;
  if (g_fault_armed.load(std::memory_order_relaxed)) {
    CollectiveFault f;
    {
      std::lock_guard<std::mutex> lock(g_fault_mu);
      f = g_fault;
    }
    if (f.world_rank == world_rank_ && f.comm == name_ && f.seq == issued() + 1) {
      g_fault_armed = false;  // once
      if (f.kind == CollectiveFault::stall) std::raise(SIGSTOP);  // until SIGCONT or SIGKILL
      // A skipped operation is never issued: it takes no sequence number, as on a rank whose
      // code path left it out.
      if (f.kind == CollectiveFault::skip && skip) {
        *skip = true;
        return 0;
      }
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::uint64_t seq = next_++;
  FlightEntry& e = ring_[seq % ring_.size()];
  e = FlightEntry{seq, op, false, bytes, peer, flight_clock(), 0.0};
  return seq;
}

void FlightRecorder::complete(std::uint64_t seq) {
  if (seq == 0) return;
  const double now = flight_clock();
  std::lock_guard<std::mutex> lock(mu_);
  FlightEntry& e = ring_[seq % ring_.size()];
  if (e.seq == seq && !e.completed) {
    e.completed = true;
    e.end_s = now;
  }
}

void FlightRecorder::set_completion_poll(std::function<bool(std::uint64_t)> done) {
  std::lock_guard<std::mutex> lock(mu_);
  poll_ = std::move(done);
}
void FlightRecorder::set_abort(std::function<void()> abort) {
  std::lock_guard<std::mutex> lock(mu_);
  abort_ = std::move(abort);
}
void FlightRecorder::set_async_error(std::function<std::string()> error) {
  std::lock_guard<std::mutex> lock(mu_);
  async_error_ = std::move(error);
}

std::uint64_t FlightRecorder::issued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_ - 1;
}

bool FlightRecorder::oldest_outstanding(FlightEntry& out) {
  std::lock_guard<std::mutex> lock(mu_);
  const FlightEntry* oldest = nullptr;
  for (;;) {
    oldest = nullptr;
    for (const FlightEntry& e : ring_)
      if (e.seq != 0 && !e.completed && (!oldest || e.seq < oldest->seq)) oldest = &e;
    // Operations complete in issue order on an NCCL stream: ask about the oldest until one is
    // still running.
    if (!oldest || !poll_ || !poll_(oldest->seq)) break;
    FlightEntry& e = ring_[oldest->seq % ring_.size()];
    e.completed = true;
    e.end_s = flight_clock();
  }
  if (!oldest) return false;
  out = *oldest;
  return true;
}

std::vector<FlightEntry> FlightRecorder::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<FlightEntry> out;
  for (const FlightEntry& e : ring_)
    if (e.seq != 0) out.push_back(e);
  std::sort(out.begin(), out.end(),
            [](const FlightEntry& a, const FlightEntry& b) { return a.seq < b.seq; });
  return out;
}

// Called under the lock, so that a communicator being destroyed (which clears its callbacks
// first) is never called into.
void FlightRecorder::abort() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (abort_) abort_();
}

std::string FlightRecorder::async_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return async_error_ ? async_error_() : std::string();
}

void for_each_recorder(const std::function<void(FlightRecorder&)>& f) {
  std::lock_guard<std::mutex> lock(g_list_mu);
  for (FlightRecorder* r : g_recorders) f(*r);
}

}  // namespace meshtrain::comm
