#pragma once
// The collective watchdog (after PyTorch's NCCL watchdog and Megatron's straggler detector): a
// thread that looks at every communicator's flight recorder and turns an operation outstanding
// longer than comm.timeout into a named error instead of a silent hang. It then, on every rank
// that can still run it:
//   1. dumps every recorder to <dump_dir>/flight_<world rank>.json,
//   2. prints which operation (communicator, sequence number, kind, bytes) is stuck,
//   3. waits briefly for the dumps of the communicator's other members and prints which ranks
//      have not arrived at that operation (no dump: stopped, dead or hung outside any
//      collective; a dump whose last operation on that communicator is older),
//   4. aborts the NCCL communicators and then the job (MPI_Abort, exit 1).
// MPI_Abort is called from the watchdog thread although MPI runs FUNNELED: the main thread is
// the one that is stuck, and MPI_Abort (which does not return) is the one call made.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "meshtrain/comm/flight_recorder.hpp"

namespace meshtrain::comm {

struct WatchdogConfig {
  double timeout_s = 300;   // comm.timeout; <= 0: no watchdog
  std::string dump_dir;     // where flight_<rank>.json goes (train.out_dir)
  int world_rank = 0;
  MPI_Comm world = MPI_COMM_NULL;  // the job MPI_Abort ends (app/ hands down the world)
  double poll_s = 0;        // 0: min(1 s, timeout / 4)
  double grace_s = 0;       // wait for the peers' dumps; 0: clamp(timeout / 2, 1 s, 10 s)
};

class Watchdog {
 public:
  explicit Watchdog(const WatchdogConfig& cfg);  // starts the thread when timeout_s > 0
  ~Watchdog();                                   // stops it
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void loop();
  [[noreturn]] void fire(FlightRecorder& r, const FlightEntry& e, double age,
                         const std::string& async_error);
  WatchdogConfig cfg_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The flight dump of this process: {"rank": r, "time_s": t, "reason": ..., "communicators":
// [{"name", "world_ranks", "rank", "issued", "entries": [{"seq", "op", "bytes", "peer",
// "start_s", "end_s", "state"}]}]}. Written to a temporary and renamed.
std::string write_flight_dump(const std::string& dir, int world_rank, const std::string& reason);

}  // namespace meshtrain::comm
