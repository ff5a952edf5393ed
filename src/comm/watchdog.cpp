#include "meshtrain/comm/watchdog.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "meshtrain/core/error.hpp"

namespace meshtrain::comm {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// How long the communicators' aborts and MPI_Abort get before the rank exits on its own.
constexpr double kAbortLimitSeconds = 10.0;

void say(const std::string& line) {
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

std::string rank_list(const std::vector<int>& v) {
  std::string s;
  for (int r : v) s += cat(s.empty() ? "" : ",", r);
  return s;
}

json entry_json(const FlightEntry& e) {
  return json{{"seq", e.seq},         {"op", op_name(e.op)},   {"bytes", e.bytes},
              {"peer", e.peer},       {"start_s", e.start_s},
              {"end_s", e.completed ? json(e.end_s) : json(nullptr)},
              {"state", e.completed ? "completed" : "outstanding"}};
}

std::string dump_path(const std::string& dir, int rank) {
  return (fs::path(dir) / cat("flight_", rank, ".json")).string();
}

// What a peer's dump says about communicator (name, members) at operation `seq`.
std::string peer_state(const json& dump, const FlightRecorder& r, std::uint64_t seq,
                       bool* arrived) {
  *arrived = false;
  for (const auto& c : dump.value("communicators", json::array())) {
    if (c.value("name", "") != r.name() || c.value("world_ranks", std::vector<int>{}) != r.world_ranks())
      continue;
    const std::uint64_t issued = c.value("issued", std::uint64_t{0});
    if (issued >= seq) {
      *arrived = true;
      return cat("has issued #", issued);
    }
    std::string last = "none";
    if (!c["entries"].empty()) {
      const json& e = c["entries"].back();
      last = cat("#", e.value("seq", 0), " ", e.value("op", "?"), " (",
                 e.value("state", "?"), ")");
    }
    return cat("its last operation on '", r.name(), "' is ", last);
  }
  return "its dump does not list this communicator";
}

}  // namespace

std::string write_flight_dump(const std::string& dir, int world_rank, const std::string& reason) {
  json comms = json::array();
  for_each_recorder([&](FlightRecorder& r) {
    json entries = json::array();
    for (const FlightEntry& e : r.entries()) entries.push_back(entry_json(e));
    comms.push_back(json{{"name", r.name()},
                         {"world_ranks", r.world_ranks()},
                         {"rank", r.rank()},
                         {"issued", r.issued()},
                         {"entries", std::move(entries)}});
  });
  const json dump{{"rank", world_rank},
                  {"time_s", flight_clock()},
                  {"reason", reason},
                  {"communicators", std::move(comms)}};
  const std::string path = dump_path(dir.empty() ? "." : dir, world_rank);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << dump.dump(1) << "\n";
    if (!out) return {};
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return ec ? std::string() : path;
}

Watchdog::Watchdog(const WatchdogConfig& cfg) : cfg_(cfg) {
  if (cfg_.timeout_s <= 0) return;
  if (cfg_.poll_s <= 0) cfg_.poll_s = std::min(1.0, cfg_.timeout_s / 4);
  if (cfg_.grace_s <= 0) cfg_.grace_s = std::clamp(cfg_.timeout_s / 2, 1.0, 10.0);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::duration<double>(cfg_.poll_s), [this] { return stop_; })) {
    FlightRecorder* stuck = nullptr;
    FlightEntry entry;
    double age = 0;
    std::string error;
    const double now = flight_clock();
    for_each_recorder([&](FlightRecorder& r) {
      if (stuck) return;
      FlightEntry e;
      const bool outstanding = r.oldest_outstanding(e);
      std::string err = r.async_error();
      if (!err.empty() || (outstanding && now - e.start_s > cfg_.timeout_s)) {
        stuck = &r;
        entry = e;
        age = outstanding ? now - e.start_s : 0;
        error = err;
      }
    });
    // A recorder lives as long as its communicator, which lives as long as the run: the one
    // found stays valid while the job is being aborted.
    if (stuck) {
      lock.unlock();
      fire(*stuck, entry, age, error);
    }
  }
}

void Watchdog::fire(FlightRecorder& r, const FlightEntry& e, double age,
                    const std::string& async_error) {
  const int me = cfg_.world_rank;
  const std::string what =
      e.seq ? cat("operation #", e.seq, " ", op_name(e.op), " of ", e.bytes, " bytes",
                  e.peer >= 0 ? cat(e.op == OpKind::broadcast ? " from root " : " with peer ",
                                    e.peer)
                              : std::string(),
                  " on communicator '", r.name(), "' (world ranks ", rank_list(r.world_ranks()),
                  ")")
            : cat("communicator '", r.name(), "' (world ranks ", rank_list(r.world_ranks()), ")");
  const std::string reason =
      async_error.empty()
          ? cat(what, " has not completed after ", static_cast<long long>(age * 10 + 0.5) / 10.0,
                " s (comm.timeout ", cfg_.timeout_s, " s)")
          : cat(what, " reported an asynchronous error: ", async_error);
  const std::string dumped = write_flight_dump(cfg_.dump_dir, me, reason);
  say(cat("meshtrain: watchdog on rank ", me, ": ", reason, "; flight recorder: ",
          dumped.empty() ? "could not be written to " + cfg_.dump_dir : dumped));

  // Which members have not arrived: their dumps say how far they got. Members that are stuck
  // in the same operation dump at about the same time; a stopped or dead rank never does.
  const bool p2p = e.op == OpKind::send || e.op == OpKind::recv;
  std::vector<int> waiting;  // the members whose progress matters: all, or the peer
  for (std::size_t i = 0; i < r.world_ranks().size(); ++i) {
    const int w = r.world_ranks()[i];
    if (w != me && (!p2p || static_cast<int>(i) == e.peer)) waiting.push_back(w);
  }
  std::vector<std::string> missing, arrived;
  const double deadline = flight_clock() + cfg_.grace_s;
  std::vector<bool> seen(waiting.size(), false);
  std::vector<std::string> state(waiting.size());
  while (e.seq && flight_clock() < deadline) {
    bool all = true;
    for (std::size_t i = 0; i < waiting.size(); ++i) {
      if (seen[i]) continue;
      std::ifstream in(dump_path(cfg_.dump_dir, waiting[i]));
      json d = json::parse(in, nullptr, false);
      if (!in || d.is_discarded()) {
        all = false;
        continue;
      }
      seen[i] = true;
      bool here = false;
      state[i] = peer_state(d, r, p2p ? ~std::uint64_t{0} : e.seq, &here);
      if (here) state[i].clear();  // a collective it has issued too: it is waiting with us
    }
    if (all) break;
    usleep(100000);
  }
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    if (!seen[i])
      missing.push_back(cat("rank ", waiting[i], " (no flight dump within ", cfg_.grace_s,
                            " s: stopped, dead, or hung outside a collective)"));
    else if (!state[i].empty())
      missing.push_back(cat("rank ", waiting[i], " (", state[i], ")"));
    else
      arrived.push_back(cat(waiting[i]));
  }
  if (e.seq) {
    std::string line = cat("meshtrain: watchdog on rank ", me, ": not arrived at #", e.seq, " on '",
                           r.name(), "': ");
    if (missing.empty()) line += "none found (every member's dump shows it issued)";
    for (std::size_t i = 0; i < missing.size(); ++i) line += (i ? "; " : "") + missing[i];
    if (!arrived.empty()) {
      std::string a;
      for (const auto& x : arrived) a += (a.empty() ? "" : ",") + x;
      line += cat("; waiting there too: rank(s) ", a);
    }
    say(line);
  }
  say(cat("meshtrain: watchdog on rank ", me, ": aborting the job (exit 1)"));
  // If the aborts below do not return (seen on one GPU shared by emulated hosts: rank 0 printed
  // the line above and the job lived on, its peer stopped), this rank leaves anyway: the
  // launcher then ends the others, as it does for any rank that exits without MPI_Finalize.
  const double limit = kAbortLimitSeconds;
  std::thread([me, limit] {
    std::this_thread::sleep_for(std::chrono::duration<double>(limit));
    std::fprintf(stderr,
                 "meshtrain: watchdog on rank %d: the abort did not end the job within %.0f s; "
                 "exiting\n",
                 me, limit);
    std::_Exit(1);
  }).detach();
  // Test hook (tests/cli/test_failures.sh watchdog_abort_hangs): aborts that never return.
  if (const char* h = std::getenv("MESHTRAIN_TEST_ABORT_HANGS"); h && std::string(h) == "1")
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  for_each_recorder([](FlightRecorder& x) { x.abort(); });
  MPI_Abort(cfg_.world != MPI_COMM_NULL ? cfg_.world : MPI_COMM_SELF, 1);
  std::_Exit(1);
}

}  // namespace meshtrain::comm
