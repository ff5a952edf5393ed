// Write and read bandwidth of a parallel HDF5 checkpoint of GPT-2 124M (model + AdamW moments,
// 3 x 124.4M fp32 values = 1.49 GB), each rank holding its data-parallel (ZeRO) partition.
// perf/cpu/checkpoint_bandwidth.sh runs it at 1, 2, 4 ranks next to dd on the same disk.
//
//   mpirun -np N build/cpu/perf/bench/bench_checkpoint [--dir DIR] [--scale S] [--reps R] [--tp T]
//          [--io automatic|collective|independent]
//
// --scale S < 1 shrinks the model (n_layer and vocabulary times S) for quick runs.
// Write  = save_checkpoint from the call to the committed file: collective writes, checksums,
//          fsync of the file, rename, `latest` (slowest rank).
// Read   = load_checkpoint of each rank's partition with verification (checksums from the
//          pieces read). "cold" reads follow posix_fadvise(DONTNEED) on the file, which drops
//          its clean pages from the page cache (no root needed); "warm" reads repeat at once.
// Read cold without verification: the same, checksums not recomputed.
// Checksum: the time to checksum the local pieces alone (part of both figures).
// Bandwidth = file bytes / time. Median over --reps.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/io/checkpoint.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string dir = "/tmp/meshtrain_ckpt_bench";
  double scale = 1.0;
  int reps = 3, tp = 1;
  io::Transfer transfer = io::Transfer::automatic;
  std::string transfer_name = "automatic";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--dir") a.dir = v;
    else if (k == "--scale") a.scale = std::stod(v);
    else if (k == "--reps") a.reps = std::stoi(v);
    else if (k == "--tp") a.tp = std::stoi(v);
    else if (k == "--io" && (v == "automatic" || v == "collective" || v == "independent")) {
      a.transfer_name = v;
      a.transfer = v == "collective"    ? io::Transfer::collective
                   : v == "independent" ? io::Transfer::independent
                                        : io::Transfer::automatic;
    }
    else {
      std::fprintf(stderr, "bench_checkpoint: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double max_over(MPI_Comm c, double t) {
  double out = 0;
  MPI_Allreduce(&t, &out, 1, MPI_DOUBLE, MPI_MAX, c);
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void drop_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

const char* kPrefixes[] = {io::kModelPrefix, io::kExpAvgPrefix, io::kExpAvgSqPrefix};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  const MPI_Comm world = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  const Args a = parse(argc, argv);
  if (size % a.tp != 0) {
    if (rank == 0) std::fprintf(stderr, "bench_checkpoint: --tp %d does not divide %d ranks\n", a.tp, size);
    MPI_Abort(world, 2);
  }
  model::GptConfig cfg = model::preset("gpt2-124m");
  if (a.scale < 1.0) {
    cfg.name = "gpt2-124m x" + std::to_string(a.scale);
    cfg.n_layer = std::max(1, static_cast<int>(std::lround(cfg.n_layer * a.scale)));
    cfg.vocab_size = std::max(64, static_cast<int>(std::lround(cfg.vocab_size * a.scale)));
  }
  const int dp = size / a.tp, tp_rank = rank % a.tp, dp_rank = rank / a.tp;
  const model::ParameterRegistry reg(cfg, tp_rank, a.tp, 0, 0, cfg.n_layer, true, true);
  const std::size_t lo = reg.size() * dp_rank / dp, hi = reg.size() * (dp_rank + 1) / dp;
  // This rank's partition of the three flat buffers, and the pieces in it.
  const auto pieces = io::pieces_for_range(reg, lo, hi, false);
  std::vector<io::TensorPiece> primary;
  for (const auto& pc : pieces)
    if (pc.primary) primary.push_back(pc);
  // Values by (tensor, global index), so tensor-parallel replicas hold the same values.
  std::vector<std::vector<float>> bufs(3, std::vector<float>(hi - lo, 0.0f));
  for (std::size_t g = 0; g < 3; ++g)
    for (const auto& pc : pieces) {
      const std::uint64_t salt = std::hash<std::string>{}(pc.param->name) + g;
      float* d = bufs[g].data() + (pc.flat_offset() - lo);
      for (std::size_t j = 0; j < pc.count; ++j) {
        const auto gi = static_cast<std::uint64_t>(pc.param->global_index(
            static_cast<std::int64_t>(pc.local_begin + j), pc.tp_rank, pc.tp_size));
        d[j] = static_cast<float>((gi * 2654435761u + salt) % 100003) * 1e-5f;
      }
    }
  std::vector<io::SaveGroup> save;
  std::vector<io::LoadGroup> load;
  std::vector<std::vector<float>> dst(3, std::vector<float>(hi - lo));
  for (std::size_t g = 0; g < 3; ++g) {
    io::SaveGroup S{kPrefixes[g], primary, {}};
    for (const auto& pc : primary) S.data.push_back(bufs[g].data() + (pc.flat_offset() - lo));
    save.push_back(std::move(S));
    io::LoadGroup L{kPrefixes[g], pieces, {}};
    for (const auto& pc : pieces) L.data.push_back(dst[g].data() + (pc.flat_offset() - lo));
    load.push_back(std::move(L));
  }
  io::CheckpointAttributes attrs;
  attrs.model = cfg;
  attrs.layout = {dp, 1, a.tp, 1, "tp-dp-pp"};
  attrs.config_text = "[bench]\n";

  if (rank == 0) fs::remove_all(a.dir);
  MPI_Barrier(world);
  std::vector<double> tw, tcold, twarm, tnover, tsum;
  std::uintmax_t bytes = 0;
  for (int r = 0; r < a.reps; ++r) {
    MPI_Barrier(world);
    double t0 = now();
    // keep = 0: deleting the previous 1.5 GB file is not part of the figure (it is removed below).
    const std::string path = io::save_checkpoint(world, a.dir, r + 1, attrs, save, 0, a.transfer);
    tw.push_back(max_over(world, now() - t0));
    if (rank == 0) {
      bytes = fs::file_size(path);
      drop_from_page_cache(path);
    }
    MPI_Barrier(world);
    t0 = now();
    io::load_checkpoint(world, path, cfg, load, true, "", a.transfer);
    tcold.push_back(max_over(world, now() - t0));
    MPI_Barrier(world);
    t0 = now();
    io::load_checkpoint(world, path, cfg, load, true, "", a.transfer);
    twarm.push_back(max_over(world, now() - t0));
    if (rank == 0) drop_from_page_cache(path);
    MPI_Barrier(world);
    t0 = now();
    io::load_checkpoint(world, path, cfg, load, false, "", a.transfer);
    tnover.push_back(max_over(world, now() - t0));
    t0 = now();
    std::uint64_t s = 0;
    for (std::size_t g = 0; g < 3; ++g)
      for (std::size_t i = 0; i < primary.size(); ++i)
        s += io::piece_checksum(primary[i], save[g].data[i]);
    tsum.push_back(max_over(world, now() - t0 + (s == 42 ? 1e-9 : 0.0)));
    if (rank == 0) fs::remove(path);
  }
  bool same = true;
  for (std::size_t g = 0; g < 3; ++g) same = same && dst[g] == bufs[g];
  int ok = same ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, world);
  if (rank == 0) {
    const double gb = static_cast<double>(bytes) / 1e9;
    std::printf("bench_checkpoint: %s (%lld parameters), %d ranks (dp %d x tp %d), file %.3f GB, "
                "data transfer %s, median of %d, dir %s\n",
                cfg.name.c_str(), cfg.num_parameters(), size, dp, a.tp, gb,
                a.transfer_name.c_str(), a.reps, a.dir.c_str());
    std::printf("  write (checksums, fsync, commit):            %7.3f s  %6.2f GB/s\n",
                median(tw), gb / median(tw));
    std::printf("  read cold (page cache dropped, verify):      %7.3f s  %6.2f GB/s\n",
                median(tcold), gb / median(tcold));
    std::printf("  read warm (file cached, verify):             %7.3f s  %6.2f GB/s\n",
                median(twarm), gb / median(twarm));
    std::printf("  read cold without verification:              %7.3f s  %6.2f GB/s\n",
                median(tnover), gb / median(tnover));
    std::printf("  checksum of the local pieces alone:          %7.3f s\n", median(tsum));
    std::printf("  data read back equal to data written: %s\n", ok ? "yes" : "NO");
    std::printf("RESULT io=%s ranks=%d bytes=%ju write_s=%.4f read_cold_s=%.4f read_warm_s=%.4f "
                "read_cold_noverify_s=%.4f checksum_s=%.4f\n",
                a.transfer_name.c_str(), size, bytes, median(tw), median(tcold), median(twarm), median(tnover), median(tsum));
  }
  if (rank == 0) fs::remove_all(a.dir);
  MPI_Finalize();
  return ok ? 0 : 1;
}
