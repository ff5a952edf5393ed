#include "meshtrain/app/preflight.hpp"

#include <glob.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/mpi_check.hpp"
#include "meshtrain/core/fault_injection.hpp"
#include "meshtrain/core/log.hpp"

namespace meshtrain::app {

namespace fs = std::filesystem;

namespace {

// Creates `dir` where missing, then a file in it, writes a byte, closes (where a full disk or
// a quota shows) and removes it.
void probe_folder(const std::string& dir, const char* option, int rank) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError(cat(option, ": cannot create the folder '", dir, "': ", ec.message()));
  if (!fs::is_directory(dir, ec))
    throw ConfigError(cat(option, ": '", dir, "' exists and is not a folder"));
  const std::string probe = (fs::path(dir) / cat(".meshtrain-probe-", rank, "-", getpid())).string();
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f)
    throw ConfigError(cat(option, ": the folder '", dir, "' is not writable (", std::strerror(errno),
                          ")"));
  const bool wrote = std::fputc('x', f) != EOF;
  const bool closed = std::fclose(f) == 0;
  const int err = errno;
  std::remove(probe.c_str());
  if (!wrote || !closed)
    throw ConfigError(cat(option, ": cannot write to the folder '", dir, "' (", std::strerror(err),
                          ")"));
}

void probe_metrics(const std::string& file) {
  const fs::path parent = fs::path(file).parent_path();
  std::error_code ec;
  if (!parent.empty() && !fs::is_directory(parent, ec))
    throw ConfigError(cat("train.metrics: the folder of '", file, "' (", parent.string(),
                          ") does not exist; create it or choose another file"));
  std::FILE* f = std::fopen(file.c_str(), "a");
  if (!f)
    throw ConfigError(cat("train.metrics: cannot write '", file, "' (", std::strerror(errno), ")"));
  std::fclose(f);
}

std::int64_t parse_count(const std::string& text, const char* name) {
  MESHTRAIN_CONFIG_CHECK(!text.empty() && text.find_first_not_of("0123456789") == std::string::npos,
                         name, "='", text, "': expected a non-negative integer");
  return std::stoll(text);
}

}  // namespace

void preflight_outputs(MPI_Comm world, const OutputLocations& o) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  agree(world, "preflight", [&] {
    probe_folder(o.out_dir, "train.out_dir", rank);
    if (!o.ckpt_dir.empty()) probe_folder(o.ckpt_dir, "ckpt.dir", rank);
    if (rank == 0 && !o.metrics_file.empty()) probe_metrics(o.metrics_file);
  });
}

TrainData load_data(MPI_Comm world, const std::string& train_glob, const std::string& val_glob,
                    int seq_len, int vocab_size) {
  TrainData d;
  agree(world, "", [&] {
    d.train = std::make_unique<io::TokenDataset>(train_glob, seq_len);
    d.train->check_vocab(vocab_size);
    if (!val_glob.empty()) {
      d.val = std::make_unique<io::TokenDataset>(val_glob, seq_len);
      d.val->check_vocab(vocab_size);
    }
  });
  return d;
}

namespace {

bool matches_any(const std::string& pattern) {
  glob_t g{};
  const bool any = ::glob(pattern.c_str(), 0, nullptr, &g) == 0 && g.gl_pathc > 0;
  ::globfree(&g);
  return any;
}

}  // namespace

TrainData load_blend(MPI_Comm world, const std::vector<io::BlendSourceSpec>& blend, bool with_val,
                     int seq_len, int vocab_size) {
  TrainData d;
  d.blend = blend;
  std::vector<std::string> no_val;
  agree(world, "", [&] {
    for (const auto& s : blend) {
      try {
        d.blend_train.push_back(std::make_unique<io::TokenDataset>(s.train, seq_len));
      } catch (const ConfigError& e) {
        throw ConfigError(cat("data.blend: source '", s.name, "': ", e.what()));
      }
      d.blend_train.back()->check_vocab(vocab_size);
      d.blend_val.emplace_back();
      if (!with_val) continue;
      if (s.val.empty() || !matches_any(s.val)) {
        no_val.push_back(cat(s.name, s.val.empty() ? "" : cat(" (no ", s.val, ")")));
        continue;
      }
      d.blend_val.back() = std::make_unique<io::TokenDataset>(s.val, seq_len);
      d.blend_val.back()->check_vocab(vocab_size);
    }
  });
  if (!no_val.empty()) {
    std::string list;
    for (const auto& n : no_val) list += cat(list.empty() ? "" : ", ", n);
    logging::warn("data.blend: no validation shards for ", list,
                  ": no validation loss for ", no_val.size() == 1 ? "it" : "them");
  }
  return d;
}

io::BlendedDataset TrainData::dataset() const {
  if (blend.empty()) return io::BlendedDataset({{"train", 1.0, train.get(), val.get()}}, false);
  std::vector<io::DataSource> sources;
  for (std::size_t i = 0; i < blend.size(); ++i)
    sources.push_back({blend[i].name, blend[i].weight, blend_train[i].get(), blend_val[i].get()});
  return io::BlendedDataset(std::move(sources), true);
}

comm::WatchdogConfig watchdog_config(const po::variables_map& vm, const std::string& out_dir,
                                     MPI_Comm world) {
  comm::WatchdogConfig c;
  c.timeout_s = vm["comm.timeout"].as<double>();
  MESHTRAIN_CONFIG_CHECK(c.timeout_s >= 0, "comm.timeout=", c.timeout_s,
                         " must be 0 (no watchdog) or a number of seconds");
  c.dump_dir = out_dir;
  c.world = world;
  MESHTRAIN_MPI_CHECK(MPI_Comm_rank(world, &c.world_rank));
  comm::set_flight_recording(c.timeout_s > 0);
  return c;
}

void collective_fault_from_env() {
  const char* v = std::getenv("MESHTRAIN_TEST_COLLECTIVE");
  if (!v || !*v) return;
  std::vector<std::string> f;
  std::stringstream ss(v);
  for (std::string x; std::getline(ss, x, ':');) f.push_back(x);
  MESHTRAIN_CONFIG_CHECK(f.size() == 4 && (f[0] == "stall" || f[0] == "skip"),
                         "MESHTRAIN_TEST_COLLECTIVE='", v,
                         "' is not of the form stall|skip:<world rank>:<communicator>:<seq>");
  comm::CollectiveFault fault;
  fault.kind = f[0] == "stall" ? comm::CollectiveFault::stall : comm::CollectiveFault::skip;
  fault.world_rank = static_cast<int>(parse_count(f[1], "MESHTRAIN_TEST_COLLECTIVE rank"));
  fault.comm = f[2];
  fault.seq = static_cast<std::uint64_t>(parse_count(f[3], "MESHTRAIN_TEST_COLLECTIVE seq"));
  comm::set_collective_fault(fault);
  logging::info("test hook: rank ", fault.world_rank, " will ", f[0], " operation #", fault.seq,
                " on '", fault.comm, "'");
}

namespace {

// A MESHTRAIN_TEST_* step: -1 when unset.
std::int64_t env_step(const char* name, const char* prefix = "") {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  const std::string text = v, pre = prefix;
  MESHTRAIN_CONFIG_CHECK(text.rfind(pre, 0) == 0 && text.size() > pre.size() &&
                             text.find_first_not_of("0123456789", pre.size()) == std::string::npos,
                         name, "='", text, "' is not of the form ", pre, "<step>");
  return std::stoll(text.substr(pre.size()));
}

}  // namespace

void set_fault_hooks() {
  fault::Hooks& h = fault::hooks();
  h.crash_at_checkpoint = env_step("MESHTRAIN_TEST_CRASH_AT", "checkpoint:");
  h.signal_at_step = env_step("MESHTRAIN_TEST_SIGNAL_AT_STEP");
  if (const char* r = std::getenv("MESHTRAIN_TEST_SIGNAL_RANK")) h.signal_rank = std::atoi(r);
  h.wait_signal_at_step = env_step("MESHTRAIN_TEST_WAIT_SIGNAL_AT_STEP");
  h.hold_ckpt_write = env_step("MESHTRAIN_TEST_HOLD_CKPT_WRITE");
  if (const char* v = std::getenv("MESHTRAIN_TEST_HOLD_AFTER_STOP")) h.hold_after_stop = *v == '1';
  h.nan_batch = nan_batch_from_env();
  h.throw_at_step = env_step("MESHTRAIN_TEST_THROW_AT_STEP");
  if (const char* r = std::getenv("MESHTRAIN_TEST_THROW_RANK")) h.throw_rank = std::atoi(r);
  collective_fault_from_env();
}

std::int64_t nan_batch_from_env() {
  const char* v = std::getenv("MESHTRAIN_TEST_NAN_BATCH");
  if (!v || !*v) return -1;
  return parse_count(v, "MESHTRAIN_TEST_NAN_BATCH");
}

}  // namespace meshtrain::app
