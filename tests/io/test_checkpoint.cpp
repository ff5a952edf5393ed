// Parallel HDF5 checkpoints on 1, 2 and 4 ranks: save under one (dp, pp, tp) layout with ZeRO
// partitions, restore under every layout of the same world (whole slices and partitions), every
// element checked against its expected value; corruption, truncation, model mismatch, missing
// files, an uncommitted save, retention, h5ls, export to safetensors.
#include <hdf5.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "checkpoint_fixture.hpp"
#include "harness.hpp"
#include "io_test_util.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/mpi_threads.hpp"
#include "meshtrain/io/checkpoint_async.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/io/safetensors_sharded.hpp"
#include "meshtrain/io/hf_export.hpp"
#include "meshtrain/version.hpp"

using namespace meshtrain;
using namespace ckpt_test;
namespace fs = std::filesystem;

namespace {

const char* kPrefixes[] = {io::kModelPrefix, io::kExpAvgPrefix, io::kExpAvgSqPrefix};

// A clean scratch directory per test case and world size (the rank counts run concurrently).
std::string scratch(const std::string& name) {
  const std::string dir = "ckpt_scratch_np" + std::to_string(mt_test::world_size()) + "/" + name;
  if (mt_test::world_rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  MPI_Barrier(mt_test::world());
  return dir;
}

// The layout saving in each test: for 4 ranks dp 2 x tp 2, for 2 ranks pp 2, for 1 rank trivial.
Layout save_layout() {
  const int w = mt_test::world_size();
  return w == 4 ? Layout{2, 1, 2} : w == 2 ? Layout{1, 2, 1} : Layout{w, 1, 1};
}

// The three flat buffers of a rank and its ZeRO partition of them.
struct Holder {
  RankView view;
  std::vector<std::vector<float>> bufs;
  std::vector<io::TensorPiece> pieces;
};

Holder make_holder(Layout L) {
  Holder h{rank_view(tiny_config(), L, mt_test::world_rank()), {}, {}};
  for (const char* p : kPrefixes) h.bufs.push_back(filled_buffer(h.view, p));
  h.pieces = io::pieces_for_range(*h.view.reg, h.view.part_lo(), h.view.part_hi(), true);
  return h;
}

std::vector<io::SaveGroup> save_groups(const Holder& h) {
  std::vector<io::SaveGroup> gs;
  for (std::size_t g = 0; g < 3; ++g) {
    io::SaveGroup G{kPrefixes[g], h.pieces, {}};
    for (const auto& pc : h.pieces) G.data.push_back(h.bufs[g].data() + pc.flat_offset());
    gs.push_back(std::move(G));
  }
  return gs;
}

io::CheckpointState rank0_state() {
  return {{"transformer.h.0.mlp.router.expert_bias", {0.25f, -0.0f, 1e-30f, -3.5f}},
          {"transformer.h.1.mlp.router.expert_bias", {1.0f, 2.0f, 3.0f, 4.0f}}};
}

io::CheckpointAttributes attributes(Layout L) {
  io::CheckpointAttributes a;
  a.tokens_seen = 123456789012;
  a.seed = 0xFEEDFACECAFEBEEFull;
  a.loss_scale = 32768.0;
  a.loss_scale_good_steps = 17;
  a.loss_scale_skipped = 2;
  a.config_text = "[model]\nn_layer = 4\n[train]\nlr = 0.0006\n";
  a.model = tiny_config();
  a.layout = {L.dp, 1, L.tp, 1, "tp-dp-pp"};
  a.extra["data.epoch"] = "3";
  // Replicated state: rank 0's values are the file's (other ranks pass others on purpose).
  a.state = rank0_state();
  if (mt_test::world_rank() != 0) a.state["transformer.h.0.mlp.router.expert_bias"][1] = 99.0f;
  return a;
}

std::string save(const std::string& dir, std::int64_t step, int keep = 0,
                 io::Transfer transfer = io::Transfer::automatic) {
  const Layout L = save_layout();
  const Holder h = make_holder(L);
  return io::save_checkpoint(mt_test::world(), dir, step, attributes(L), save_groups(h), keep,
                             transfer);
}

// Loads `spec` into layout L (whole slices, or each dp rank's partition) and returns the number
// of wrong elements on this rank.
std::size_t load_and_count(const std::string& spec, Layout L, bool partition, bool verify,
                           io::CheckpointAttributes* attrs = nullptr,
                           io::Transfer transfer = io::Transfer::automatic) {
  const RankView v = rank_view(tiny_config(), L, mt_test::world_rank());
  const auto pieces = partition ? io::pieces_for_range(*v.reg, v.part_lo(), v.part_hi(), false)
                                : io::pieces_for_range(*v.reg, 0, v.reg->size(), false);
  std::vector<std::vector<float>> dst(3, std::vector<float>(v.reg->size(), -1e30f));
  std::vector<io::LoadGroup> gs;
  for (std::size_t g = 0; g < 3; ++g) {
    io::LoadGroup G{kPrefixes[g], pieces, {}};
    for (const auto& pc : pieces) G.data.push_back(dst[g].data() + pc.flat_offset());
    gs.push_back(std::move(G));
  }
  auto a = io::load_checkpoint(mt_test::world(), spec, tiny_config(), gs, verify, "", transfer);
  if (attrs) *attrs = a;
  std::size_t bad = 0;
  for (std::size_t g = 0; g < 3; ++g) bad += mismatches(pieces, dst[g], kPrefixes[g]);
  return bad;
}

unsigned long long total(std::size_t n) {
  unsigned long long in = n, out = 0;
  MPI_Allreduce(&in, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, mt_test::world());
  return out;
}

// The message of the exception of type E that f throws on this rank, or "<no error>".
template <class E, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "<no error>";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Byte offset of a dataset's raw data in the file (rank 0, serial HDF5).
haddr_t data_offset(const std::string& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const haddr_t off = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(off != HADDR_UNDEF);
  return off;
}

void flip_byte(const std::string& file, haddr_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("a checkpoint restores into every layout", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("layouts");
  const io::Transfer modes[] = {io::Transfer::collective, io::Transfer::independent,
                                io::Transfer::automatic};
  std::string path;
  for (const io::Transfer mode : modes) {
    const int m = static_cast<int>(mode);
    path = save(dir, 1000 + m, 0, mode);
    REQUIRE(path == dir + "/step_0000100" + std::to_string(m) + ".h5");
    REQUIRE(mt_test::all_ranks(fs::exists(path) && !fs::exists(path + ".tmp")));
    REQUIRE(mt_test::all_ranks(read_text(dir + "/latest") == fs::path(path).filename().string() + "\n"));
    for (const Layout L : layouts_of(mt_test::world_size()))
      for (bool partition : {false, true}) {
        INFO("transfer " << m << ", load as dp " << L.dp << " pp " << L.pp << " tp " << L.tp
                         << (partition ? " (partitions)" : " (whole slices)"));
        // Whole slices on several dp replicas cover elements more than once: verification
        // re-reads those tensors; partitions verify from what they read.
        const std::size_t bad = load_and_count(dir, L, partition, true, nullptr, mode);
        REQUIRE(mt_test::all_ranks(bad == 0));
      }
  }
  io::CheckpointAttributes a;
  const std::size_t bad = load_and_count(path, Layout{mt_test::world_size(), 1, 1}, true, true, &a);
  REQUIRE(mt_test::all_ranks(bad == 0));
  const io::CheckpointAttributes want = attributes(save_layout());
  REQUIRE(a.path == path);
  REQUIRE(a.format == io::kCheckpointFormat);
  REQUIRE(a.format_version == io::kCheckpointVersion);
  REQUIRE(a.step == 1000 + static_cast<int>(io::Transfer::automatic));
  REQUIRE(a.tokens_seen == want.tokens_seen);
  REQUIRE(a.seed == want.seed);
  REQUIRE(a.loss_scale == want.loss_scale);
  REQUIRE(a.loss_scale_good_steps == 17);
  REQUIRE(a.loss_scale_skipped == 2);
  REQUIRE(a.config_text == want.config_text);
  REQUIRE(a.model.n_embd == 32);
  REQUIRE(a.model.vocab_pad == 16);
  REQUIRE(a.model.name == "ckpt-tiny");
  REQUIRE(a.layout.dp == want.layout.dp);
  REQUIRE(a.layout.tp == want.layout.tp);
  REQUIRE(a.layout.zero == 1);
  REQUIRE(a.layout.order == "tp-dp-pp");
  REQUIRE(a.extra.at("data.epoch") == "3");
  REQUIRE(a.state == rank0_state());  // bit for bit (-0.0f == 0.0f: check the sign too)
  REQUIRE(std::signbit(a.state.at("transformer.h.0.mlp.router.expert_bias")[1]));
  REQUIRE(a.software_version.find(kVersion) != std::string::npos);
  REQUIRE(std::regex_match(a.created, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)")));
}

TEST_CASE("a flipped byte in a tensor is an error naming the tensor", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("corrupt");
  const std::string path = save(dir, 5);
  const Layout L{mt_test::world_size(), 1, 1};
  for (const std::string tensor : {"/model/transformer.h.1.mlp.c_fc.weight",
                                   "/optim/exp_avg_sq/transformer.ln_f.bias"}) {
    if (mt_test::world_rank() == 0) flip_byte(path, data_offset(path, tensor) + 6);
    MPI_Barrier(mt_test::world());
    const std::string msg = error_of<ConfigError>([&] { load_and_count(path, L, true, true); });
    INFO(msg);
    REQUIRE(mt_test::all_ranks(io_test::has(msg, tensor) && io_test::has(msg, path) &&
                               io_test::has(msg, "corrupt")));
    // Without verification the one flipped value is read as it is.
    REQUIRE(total(load_and_count(path, L, true, false)) == 1);
    if (mt_test::world_rank() == 0) flip_byte(path, data_offset(path, tensor) + 6);  // repair
    MPI_Barrier(mt_test::world());
  }
  REQUIRE(mt_test::all_ranks(load_and_count(path, L, true, true) == 0));
}

TEST_CASE("a flipped byte in a /state tensor is an error naming it", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("corrupt_state");
  const std::string path = save(dir, 6);
  const std::string tensor = "/state/transformer.h.1.mlp.router.expert_bias";
  const Layout L{mt_test::world_size(), 1, 1};
  if (mt_test::world_rank() == 0) flip_byte(path, data_offset(path, tensor) + 2);
  MPI_Barrier(mt_test::world());
  const std::string msg = error_of<ConfigError>([&] { load_and_count(path, L, true, true); });
  INFO(msg);
  REQUIRE(mt_test::all_ranks(io_test::has(msg, tensor) && io_test::has(msg, path) &&
                             io_test::has(msg, "corrupt")));
  // Without verification the flipped value is read as it is.
  io::CheckpointAttributes a;
  REQUIRE(mt_test::all_ranks(load_and_count(path, L, true, false, &a) == 0));
  REQUIRE(a.state.at("transformer.h.1.mlp.router.expert_bias") !=
          rank0_state().at("transformer.h.1.mlp.router.expert_bias"));
}

TEST_CASE("a truncated checkpoint is a clear error", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("truncated");
  const std::string path = save(dir, 7);
  if (mt_test::world_rank() == 0) fs::resize_file(path, fs::file_size(path) / 2);
  MPI_Barrier(mt_test::world());
  const std::string msg = error_of<ConfigError>([&] { load_and_count(dir, save_layout(), true, true); });
  INFO(msg);
  REQUIRE(mt_test::all_ranks(io_test::has(msg, path) && io_test::has(msg, "truncated")));
}

TEST_CASE("another model configuration is an error naming the key", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("mismatch");
  const std::string path = save(dir, 3);
  GptConfig other = tiny_config();
  other.n_layer = 2;
  std::string msg = error_of<ConfigError>(
      [&] { io::load_checkpoint(mt_test::world(), path, other, {}, true); });
  INFO(msg);
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "model.n_layer=4") &&
                             io_test::has(msg, "model.n_layer=2") && io_test::has(msg, path)));
  other = tiny_config();
  other.vocab_pad = 64;  // 64 rows either way: fine
  REQUIRE_NOTHROW(io::load_checkpoint(mt_test::world(), path, other, {}, false));
  other.vocab_pad = 32;  // 64 rows either way: fine
  REQUIRE_NOTHROW(io::load_checkpoint(mt_test::world(), path, other, {}, false));
  other.vocab_size = 70;  // 96 rows
  msg = error_of<ConfigError>([&] { io::load_checkpoint(mt_test::world(), path, other, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "model.vocab_size=50")));
}

TEST_CASE("missing checkpoints are clear errors", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("missing");
  const GptConfig cfg = tiny_config();
  std::string msg = error_of<ConfigError>(
      [&] { io::load_checkpoint(mt_test::world(), "latest", cfg, {}, true, dir); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, dir + "/latest") &&
                             io_test::has(msg, "does not exist")));
  msg = error_of<ConfigError>([&] { io::load_checkpoint(mt_test::world(), dir, cfg, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, dir + "/latest")));
  msg = error_of<ConfigError>([&] { io::load_checkpoint(mt_test::world(), "latest", cfg, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "ckpt.dir")));
  msg = error_of<ConfigError>(
      [&] { io::load_checkpoint(mt_test::world(), dir + "/step_00000009.h5", cfg, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, dir + "/step_00000009.h5")));
  // `latest` naming a deleted file.
  if (mt_test::world_rank() == 0) io_test::write_file(dir + "/latest", "step_00000009.h5\n");
  MPI_Barrier(mt_test::world());
  msg = error_of<ConfigError>([&] { io::load_checkpoint(mt_test::world(), dir, cfg, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "step_00000009.h5")));
  // A file that is not HDF5.
  if (mt_test::world_rank() == 0) io_test::write_file(dir + "/step_00000009.h5", "not hdf5");
  MPI_Barrier(mt_test::world());
  msg = error_of<ConfigError>([&] { io::load_checkpoint(mt_test::world(), dir, cfg, {}, true); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "cannot be read as an HDF5 file")));
}

TEST_CASE("a save that never commits leaves the previous checkpoint in place",
          "[io][checkpoint][mpi]") {
  const std::string dir = scratch("crash");
  save(dir, 1);
  {
    const Layout L = save_layout();
    const Holder h = make_holder(L);
    io::CheckpointWriter w(mt_test::world(), dir, 2);
    w.write(attributes(L), save_groups(h));  // ... and the job dies before commit()
    REQUIRE(mt_test::all_ranks(fs::exists(w.tmp_path()) && !fs::exists(w.path())));
  }
  REQUIRE(mt_test::all_ranks(read_text(dir + "/latest") == "step_00000001.h5\n"));
  io::CheckpointAttributes a;
  REQUIRE(mt_test::all_ranks(load_and_count(dir, save_layout(), true, true, &a) == 0));
  REQUIRE(a.step == 1);
  // The next successful save removes the leftover.
  save(dir, 3);
  REQUIRE(mt_test::all_ranks(!fs::exists(dir + "/step_00000002.h5.tmp")));
  REQUIRE(mt_test::all_ranks(read_text(dir + "/latest") == "step_00000003.h5\n"));
}

TEST_CASE("retention keeps the newest N checkpoints", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("keep");
  for (int step = 1; step <= 5; ++step) save(dir, step * 10, 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE(names == std::vector<std::string>{"latest", "step_00000040.h5", "step_00000050.h5"});
  io::CheckpointAttributes a;
  REQUIRE(mt_test::all_ranks(load_and_count(dir, save_layout(), false, true, &a) == 0));
  REQUIRE(a.step == 50);
}

TEST_CASE("save refuses pieces that write an element twice", "[io][checkpoint][mpi]") {
  if (mt_test::world_size() == 1) return;
  const std::string dir = scratch("twice");
  // Every rank passes its whole flat buffer as if it were its partition.
  const Layout L{mt_test::world_size(), 1, 1};
  Holder h = make_holder(L);
  h.pieces = io::pieces_for_range(*h.view.reg, 0, h.view.reg->size(), true);
  const std::string msg = error_of<Error>(
      [&] { io::save_checkpoint(mt_test::world(), dir, 1, attributes(L), save_groups(h)); });
  REQUIRE(mt_test::all_ranks(io_test::has(msg, "each element must be written once")));
  REQUIRE(mt_test::all_ranks(!fs::exists(dir + "/step_00000001.h5.tmp")));
}

TEST_CASE("h5ls and h5dump show the file", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("h5ls");
  const std::string path = save(dir, 42);
  bool ok = true;
  if (mt_test::world_rank() == 0 && std::system("command -v h5ls >/dev/null 2>&1") == 0) {
    auto run = [](const std::string& cmd) {
      std::string out;
      if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[4096];
        std::size_t n;
        while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
        pclose(p);
      }
      return out;
    };
    const std::string ls = run("h5ls -r " + path);
    INFO(ls);
    ok = io_test::has(ls, "/model/transformer.wte.weight Dataset {64, 32}") &&
         io_test::has(ls, "/optim/exp_avg_sq/transformer.h.3.attn.c_attn.weight Dataset {32, 96}") &&
         io_test::has(ls, "/model/transformer.ln_f.bias Dataset {32}");
    const std::string dump = run("h5dump -H -A " + path);
    ok = ok && io_test::has(dump, "\"meshtrain-checkpoint\"") && io_test::has(dump, "checksum") &&
         io_test::has(dump, "ATTRIBUTE \"layout.tp\"");
    CHECK(ok);
  }
  REQUIRE(mt_test::all_ranks(ok));
}

TEST_CASE("export of the weights to a HuggingFace folder", "[io][checkpoint][mpi]") {
  const std::string dir = scratch("export");
  const std::string path = save(dir, 8);
  bool ok = true;
  if (mt_test::world_rank() == 0) {
    const std::string out = dir + "/hf";
    io::HfExportOptions opt;
    opt.max_shard_bytes = 40000;  // several shards and their index
    const GptConfig c = io::export_hf_from_checkpoint(path, out, opt);
    REQUIRE(c.n_layer == 4);
    REQUIRE(std::filesystem::exists(out + "/model.safetensors.index.json"));
    REQUIRE(std::filesystem::exists(out + "/config.json"));
    io::ShardedSafetensorsReader r(out);
    REQUIRE(r.names().size() == 4 * 12 + 4);
    REQUIRE(r.info("transformer.wte.weight").shape == std::vector<std::int64_t>{50, 32});
    REQUIRE(r.info("transformer.h.2.attn.c_attn.weight").shape == std::vector<std::int64_t>{32, 96});
    const model::ParameterRegistry full(c, 0, 1, 0, 0, c.n_layer, true, true);
    for (const auto& p : full.params()) {
      const auto& shape = r.info(p.name).shape;
      const auto v = r.read_rows_f32(p.name, 0, shape[0]);
      for (std::size_t i = 0; i < v.size(); ++i)
        if (v[i] != value("model", p.name, static_cast<std::int64_t>(i))) ok = false;
    }
    CHECK(ok);
    CHECK(io::read_checkpoint_attributes(path).model.key() == c.key());
  }
  REQUIRE(mt_test::all_ranks(ok));
}

namespace {

// Online CPUs, within the cgroup's cpuset where it is readable ("0-3,6").
int node_cpus() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  std::ifstream in("/sys/fs/cgroup/cpuset.cpus.effective");
  std::string list;
  if (!(in >> list) || list.empty()) return static_cast<int>(online);
  int n = 0;
  std::stringstream ss(list);
  std::string part;
  while (std::getline(ss, part, ',')) {
    const auto dash = part.find('-');
    const int lo = std::stoi(part.substr(0, dash));
    const int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
    for (int c = lo; c <= hi; ++c) n += c < online ? 1 : 0;
  }
  return n;
}

}  // namespace

TEST_CASE("the background writer runs on every CPU of the node, not only the rank's binding",
          "[io][checkpoint][async][mpi]") {
  if (!mpi_thread_multiple()) {
    WARN("the background writer needs MPI_THREAD_MULTIPLE (MESHTRAIN_MPI_THREAD_LEVEL)");
    return;
  }
  // As a launcher binds a rank to one core: the writer thread inherits this mask.
  cpu_set_t before, one;
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  const int allowed = CPU_COUNT(&before);
  CPU_ZERO(&one);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &before)) {
      CPU_SET(c, &one);
      break;
    }
  REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  const std::string dir = scratch("background_cpus");
  const Layout L = save_layout();
  const Holder h = make_holder(L);
  io::BackgroundWriter writer(mt_test::world());
  io::StagedCheckpoint staged;
  staged.dir = dir;
  staged.step = 9;
  staged.attrs = attributes(L);
  staged.groups = save_groups(h);
  writer.start(std::move(staged));
  const io::BackgroundWriter::Outcome o = writer.wait();
  REQUIRE(sched_setaffinity(0, sizeof before, &before) == 0);
  INFO("the process could run on " << allowed << " CPUs; the writer on " << o.cpus);
  REQUIRE(o.ok);
  // The writer is not confined to the training thread's core: every online CPU that the job's
  // cpuset allows is open to it.
  REQUIRE(o.cpus == node_cpus());
  REQUIRE(o.cpus >= allowed);
  REQUIRE(mt_test::all_ranks(load_and_count(dir, L, true, true) == 0));
}
