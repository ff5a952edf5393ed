// Data parallelism and ZeRO: step time with communication overlap, and model-state memory per
// rank next to the ZeRO paper's formulas (issue 7).
//
//   mpirun -np P build/cpu/perf/bench/bench_data_parallel --mode time [--preset cpu-bench]
//          [--micro-batch 8] [--seq-len 128] [--accum 1] [--steps 10] [--zero 0..3]
//          [--offload 0|1] [--overlap 0|1] [--bucket-mb 25]
//   build/cpu/perf/bench/bench_data_parallel --mode memory [--preset gpt2-1.5b] [--dp 8]
//
// `time`: the world is the dp group; each rank trains on its slice of synthetic global batches
// (tokens from the counter-based RNG) and rank 0 prints the median step time, global tokens/s,
// and the gradient communication: total (launch to observed completion), exposed (host time in
// launches and waits) and the hidden share. Run it at -np 1 and -np P for the speed-up.
//
// `memory`: one process measures rank 0 of a dp group of --dp ranks (a communicator that only
// reports its size: model states are allocated at construction, no collective runs). The model
// is built with 1 and 2 blocks and the per-block difference is scaled to the preset's depth:
// bytes(L) = bytes(1) + (L - 1) * (bytes(2) - bytes(1)). Printed next to the formula for the
// full model's Ψ, for ZeRO 0-3 with and without CPU offload, in the build's compute type.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/mesh/mpi_comm.hpp"
#include "meshtrain/parallel/zero_memory.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

struct Args {
  std::string mode = "time", preset;
  int micro_batch = 8, seq_len = 128, accum = 1, steps = 10, zero = 0, dp = 8;
  bool offload = false, overlap = true;
  double bucket_mb = 25;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") a.mode = v;
    else if (k == "--preset") a.preset = v;
    else if (k == "--micro-batch") a.micro_batch = std::stoi(v);
    else if (k == "--seq-len") a.seq_len = std::stoi(v);
    else if (k == "--accum") a.accum = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--zero") a.zero = std::stoi(v);
    else if (k == "--dp") a.dp = std::stoi(v);
    else if (k == "--offload") a.offload = std::stoi(v) != 0;
    else if (k == "--overlap") a.overlap = std::stoi(v) != 0;
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else {
      std::fprintf(stderr, "bench_data_parallel: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if (a.preset.empty()) a.preset = a.mode == "memory" ? "gpt2-1.5b" : "cpu-bench";
  return a;
}

#if MESHTRAIN_HAVE_BF16
using Compute = bf16;  // the GPU build's training type: mixed precision
#else
using Compute = float;
#endif

// ---- time ----

void run_time(const Args& a) {
  mesh::MpiComm dup = mesh::MpiComm::duplicate(MPI_COMM_WORLD);
  auto dp = comm::make_communicator(comm::default_backend(), dup.get());
  const int P = dp->size(), rank = dp->rank();
  const auto cfg = model::preset(a.preset);
  model::ModelLayout layout;
  layout.allocate_params = a.zero < 3;
  layout.allocate_grads = a.zero < 2;
  model::GptT<Compute> m(cfg, a.micro_batch, a.seq_len, layout);
  DpOptions opt;
  opt.zero_stage = a.zero;
  opt.offload = a.offload;
  opt.overlap = a.overlap;
  opt.bucket_bytes = static_cast<std::size_t>(a.bucket_mb * 1048576.0);
  GradSync<Compute> sync(model_buffers(m), *dp, opt);
  m.set_hooks(&sync);
  {
    model::GptT<Compute> init(cfg, 1, a.seq_len);
    init.init_parameters(1);
    sync.scatter_params(init.params());
  }
  optim::AdamWConfig oc;
  oc.lr = 1e-4f;
  ZeroOptimizer<Compute> zo(sync, oc);
  zo.init_master();
  const std::size_t n = static_cast<std::size_t>(a.micro_batch) * a.seq_len;
  auto in = alloc<std::int32_t>("bench.in", n), tg = alloc<std::int32_t>("bench.tg", n);
  auto hin = Kokkos::create_mirror_view(in), htg = Kokkos::create_mirror_view(tg);
  const int global = P * a.micro_batch * a.accum;
  const float scale = 1.0f / static_cast<float>(global * a.seq_len);
  std::vector<double> times;
  CommStats grads, params;
  double opt_comm = 0, down = 0, update = 0, up = 0;
  for (int s = 0; s < a.steps; ++s) {
    MPI_Barrier(dup.get());
    sync.reset_stats();
    const Timer t;
    sync.begin_step();
    for (int mb = 0; mb < a.accum; ++mb) {
      // Synthetic tokens keyed by (step, global token index): the same global batch at any dp.
      const std::uint64_t first =
          (static_cast<std::uint64_t>(rank) * a.accum + mb) * static_cast<std::uint64_t>(n);
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t g = first + i;
        hin(i) = static_cast<std::int32_t>(rng::bits(s, 1, g) % cfg.vocab_size);
        htg(i) = static_cast<std::int32_t>(rng::bits(s, 2, g) % cfg.vocab_size);
      }
      Kokkos::deep_copy(in, hin);
      Kokkos::deep_copy(tg, htg);
      sync.set_last_micro(mb == a.accum - 1);
      m.forward_train(in, tg, scale);
      m.backward();
    }
    sync.finish();
    zo.step(s);
    m.exec().fence();
    const double dt = t.seconds();
    if (s > 0) {  // the first step pays for allocations and warm-up
      times.push_back(dt);
      grads += sync.grad_stats();
      params += sync.param_stats();
      opt_comm += zo.last_comm_seconds();
      down += zo.adamw().offload_seconds().down;
      update += zo.adamw().offload_seconds().update;
      up += zo.adamw().offload_seconds().up;
    }
  }
  std::sort(times.begin(), times.end());
  const double med = times.empty() ? 0 : times[times.size() / 2];
  const double k = times.empty() ? 1 : static_cast<double>(times.size());
  if (rank == 0)
    std::printf("dp %d zero %d offload %d overlap %d %s mb %d x %d accum, seq %d: step %.1f ms, "
                "%.0f tokens/s | grad comm %.2f ms/step, exposed %.2f, hidden %.0f %% | param "
                "gather %.2f ms/step | norm+gather %.2f ms/step\n",
                P, a.zero, a.offload ? 1 : 0, a.overlap ? 1 : 0, a.preset.c_str(), a.micro_batch,
                a.accum, a.seq_len, med * 1e3, global * a.seq_len / med,
                grads.total_seconds / k * 1e3, grads.exposed_seconds / k * 1e3,
                100 * grads.hidden_fraction(), params.total_seconds / k * 1e3, opt_comm / k * 1e3);
  if (rank == 0 && a.offload)
    std::printf("  offload per step: gradients down + host norm %.1f ms, host update %.1f ms "
                "(%d threads), parameters up %.1f ms\n",
                down / k * 1e3, update / k * 1e3, zo.adamw().host_threads(), up / k * 1e3);
}

// ---- memory ----

// A dp group seen from rank 0 that never communicates: enough to build every model state.
class SizeOnlyComm final : public comm::Communicator {
 public:
  explicit SizeOnlyComm(int size) : size_(size) {}
  comm::Backend backend() const override { return comm::default_backend(); }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  bool needs_host_memory() const override { return kDeviceIsHost; }
  comm::Request iall_reduce_raw(const void*, void*, std::size_t, DType, comm::ReduceOp) override {
    return none();
  }
  comm::Request ireduce_scatter_raw(const void*, void*, std::size_t, DType,
                                    comm::ReduceOp) override {
    return none();
  }
  comm::Request iall_gather_raw(const void*, void*, std::size_t, DType) override { return none(); }
  comm::Request ibroadcast_raw(void*, std::size_t, DType, int) override { return none(); }
  comm::Request iall_to_all_raw(const void*, void*, std::size_t, DType) override { return none(); }
  comm::Request iall_to_allv_raw(const void*, const std::size_t*, const std::size_t*, void*,
                                 const std::size_t*, const std::size_t*, DType) override {
    return none();
  }
  comm::Request isend_raw(const void*, std::size_t, DType, int, int) override { return none(); }
  comm::Request irecv_raw(void*, std::size_t, DType, int, int) override { return none(); }
  void barrier() override {}

 private:
  static comm::Request none() {
    throw Error("bench_data_parallel --mode memory: no collective may run");
  }
  int size_;
};

MemoryReport measure(model::GptConfig cfg, int layers, int dp, int zero, bool offload) {
  cfg.n_layer = layers;
  model::ModelLayout layout;
  layout.allocate_params = zero < 3;
  layout.allocate_grads = zero < 2;
  model::GptT<Compute> m(cfg, 1, 16, layout);
  SizeOnlyComm comm(dp);
  DpOptions opt;
  opt.zero_stage = zero;
  opt.offload = offload;
  GradSync<Compute> sync(model_buffers(m), comm, opt);
  ZeroOptimizer<Compute> zo(sync, optim::AdamWConfig{});
  return model_state_memory(sync, zo);
}

void run_memory(const Args& a) {
  const auto cfg = model::preset(a.preset);
  const double G = 1073741824.0;
  std::printf("%s, dp %d, %s: model-state GiB per rank (measured at 1 and 2 blocks, scaled to "
              "%d)\n",
              a.preset.c_str(), a.dp, sizeof(Compute) == 4 ? "fp32" : "mixed precision (bf16)",
              cfg.n_layer);
  std::printf("%-5s %-8s | %8s %8s %8s %8s %8s | %8s %8s %8s %8s %8s | %s\n", "zero", "offload",
              "params", "grads", "optim", "host", "total", "params", "grads", "optim", "host",
              "total", "formula");
  double psi = 0;
  for (int zero = 0; zero <= 3; ++zero) {
    for (bool offload : {false, true}) {
      const MemoryReport r1 = measure(cfg, 1, a.dp, zero, offload);
      const MemoryReport r2 = measure(cfg, 2, a.dp, zero, offload);
      auto scale = [&](double x1, double x2) { return x1 + (cfg.n_layer - 1) * (x2 - x1); };
      ModelStateBytes m;
      m.params = scale(r1.measured.params, r2.measured.params);
      m.grads = scale(r1.measured.grads, r2.measured.grads);
      m.optimizer = scale(r1.measured.optimizer, r2.measured.optimizer);
      m.host_optimizer = scale(r1.measured.host_optimizer, r2.measured.host_optimizer);
      psi = scale(r1.psi, r2.psi);
      const ModelStateBytes f = zero_formula(psi, zero, a.dp, sizeof(Compute), offload);
      std::printf("%-5d %-8s | %8.2f %8.2f %8.2f %8.2f %8.2f | %8.2f %8.2f %8.2f %8.2f %8.2f | %s\n",
                  zero, offload ? "cpu" : "-", m.params / G, m.grads / G, m.optimizer / G,
                  m.host_optimizer / G, m.total() / G, f.params / G, f.grads / G,
                  f.optimizer / G, f.host_optimizer / G, f.total() / G,
                  zero_formula_text(zero, sizeof(Compute), offload).c_str());
    }
  }
  std::printf("(Ψ = %.3g parameters: registry elements of the padded vocabulary, no alignment)\n",
              psi);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  kc::initialize(-1);
  int rc = 0;
  set_error_rank(rank);
  try {
    const Args a = parse(argc, argv);
    if (a.mode == "time") run_time(a);
    else if (a.mode == "memory") { if (rank == 0) run_memory(a); }
    else throw ConfigError("--mode must be time or memory");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data_parallel (rank %d): %s\n", rank, e.what());
    rc = 1;
  }
  Kokkos::finalize();
  MPI_Finalize();
  return rc;
}
