// `meshtrain bench`: the calibration of the planner's cost model, measured here. Rank 0 times
// the kernels the model runs at the model's shapes (the other ranks wait, so the figures are
// those of one rank with the machine to itself; the cost model adds contention when ranks
// outnumber cores); then all ranks time collectives on the world and fit alpha and bus bandwidth.
//
//   mpirun -np 2 meshtrain bench --model.preset cpu-bench --bench.out calibration.json
#include "meshtrain/app/bench_cmd.hpp"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "meshtrain/app/options.hpp"
#include "meshtrain/app/plan_run.hpp"
#include "meshtrain/app/train_cmd.hpp"
#include "meshtrain/comm/factory.hpp"
#include "meshtrain/core/log.hpp"
#include "meshtrain/core/memory.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/adamw.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"
#include "meshtrain/plan/calibration.hpp"
#include "meshtrain/plan/cost.hpp"

namespace meshtrain::app {

std::vector<int> parse_int_list(const std::string& text, const std::string& option,
                                int min_value) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    MESHTRAIN_CONFIG_CHECK(!item.empty() && end && *end == '\0' && v >= min_value, option,
                           "='", text, "' must be a comma-separated list of integers >= ",
                           min_value);
    out.push_back(static_cast<int>(v));
  }
  MESHTRAIN_CONFIG_CHECK(!out.empty(), option, " is empty");
  return out;
}

po::options_description bench_options() {
  po::options_description d;
  d.add(config::generic_options()).add(model_options());
  po::options_description b("Benchmark [bench]");
  b.add_options()
      ("bench.out", po::value<std::string>()->default_value("calibration.json"),
       "calibration file to write (JSON; `meshtrain plan --plan.calibration`)")
      ("bench.machine", po::value<std::string>()->default_value(""),
       "name recorded in the file; default: the host name")
      ("bench.seq_len", po::value<int>()->default_value(0), "sequence length; 0 = block_size")
      ("bench.micro_batches", po::value<std::string>()->default_value("1,4,16"),
       "micro-batch sizes whose GEMM shapes are timed")
      ("bench.tp", po::value<std::string>()->default_value("1,2"),
       "tensor-parallel sizes whose GEMM shapes are timed")
      ("bench.reps", po::value<int>()->default_value(5), "timed repetitions (median)")
      ("bench.slowdown", po::value<bool>()->default_value(true)->implicit_value(true),
       "measure how ranks of this node slow each other down (CPU builds: 1, 2, 4 ... of this "
       "job's ranks computing at once); false or GPU builds: no slowdown")
      ("bench.peak_tflops", po::value<double>()->default_value(0),
       "peak FLOP/s of one device for MFU; 0 = the best GEMM measured")
      ("bench.link", po::value<std::string>()->default_value("intra"),
       "link class the world of this job measures: intra (one node) or inter");
  d.add(b).add(log_options());
  return d;
}

namespace {

template <class F>
double median_seconds(int reps, const F& f) {
  f();  // warm-up (and lazy allocations)
  Kokkos::fence();
  std::vector<double> t;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    Timer clock;
    f();
    Kokkos::fence();
    t.push_back(clock.seconds());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

View1<float> filled(const char* label, std::size_t n, float v) {
  View1<float> x = alloc<float>(label, n);
  Kokkos::deep_copy(x, v);
  return x;
}

struct Settings {
  int T = 128, reps = 5;
  std::vector<int> mbs, tps;
};

// Rank 0: kernel throughput at the model's shapes.
void measure_kernels(const model::GptConfig& cfg, const Settings& st, plan::Calibration& c) {
  using KB = plan::KernelBytes;
  namespace k = kernels;
  const ExecSpace ex;
  const int C = cfg.n_embd, T = st.T, Vp = cfg.padded_vocab();
  // GEMMs: the four linears forward, input gradient and weight gradient, and the head.
  std::vector<std::array<int, 3>> shapes;
  for (int mb : st.mbs)
    for (int tp : st.tps) {
      if (cfg.n_head % tp) continue;
      const int N = mb * T;
      for (auto [ic, oc] : {std::pair{C, 3 * C / tp}, {C / tp, C}, {C, 4 * C / tp}, {4 * C / tp, C}})
        for (auto s : {std::array{N, oc, ic}, std::array{N, ic, oc}, std::array{ic, oc, N}})
          shapes.push_back(s);
      shapes.push_back({N, Vp / tp, C});
    }
  std::sort(shapes.begin(), shapes.end());
  shapes.erase(std::unique(shapes.begin(), shapes.end()), shapes.end());
  std::size_t biggest = 0;
  for (auto s : shapes)
    biggest = std::max({biggest, std::size_t(s[0]) * s[2], std::size_t(s[2]) * s[1],
                        std::size_t(s[0]) * s[1]});
  // Operands rotate through a working set larger than the caches: in a training step a GEMM's
  // inputs were written long before (by other layers), so timing warm operands overstates the
  // throughput the model sees (by ~1.5x for the small shapes of CPU models).
  const std::size_t sets = std::max<std::size_t>(2, (std::size_t(96) << 20) / (3 * 4 * biggest) + 1);
  auto pool = filled("bench.gemm_pool", 3 * biggest * sets, 0.01f);
  double best = 0;
  for (auto [m, n, kk] : shapes) {
    std::size_t which = 0;
    const double sec = median_seconds(st.reps, [&] {
      float* base = pool.data() + 3 * biggest * (which++ % sets);
      k::gemm<float>(ex, k::Trans::N, k::Trans::N, m, n, kk, 1.0f, base, kk, base + biggest, n,
                     0.0f, base + 2 * biggest, n);
    });
    plan::GemmPoint p{double(m), double(n), double(kk), 0};
    p.tflops = p.flops() / sec / 1e12;
    best = std::max(best, p.tflops);
    c.gemm.push_back(p);
  }
  if (c.peak_tflops <= 0) c.peak_tflops = best;
  // Attention at the largest micro-batch, tp = 1.
  const int Bm = st.mbs.back(), NH = cfg.n_head, HS = C / NH, N = Bm * T;
  auto qkv = filled("bench.qkv", std::size_t(N) * 3 * C, 0.01f);
  auto out = filled("bench.atty", std::size_t(N) * C, 0.0f), dout = filled("bench.datty", std::size_t(N) * C, 0.01f);
  auto dqkv = filled("bench.dqkv", std::size_t(N) * 3 * C, 0.0f);
  View1<float> lse("meshtrain::bench.lse", std::size_t(Bm) * NH * T);
  const double att = 2.0 * Bm * C * double(T) * T;
  c.attention_fwd_tflops = att / median_seconds(st.reps, [&] {
    k::attention_forward<float>(ex, out, lse, qkv, Bm, T, NH, HS);
  }) / 1e12;
  c.attention_bwd_tflops = 2.5 * att / median_seconds(st.reps, [&] {
    k::attention_backward<float>(ex, dqkv, dout, qkv, out, lse, Bm, T, NH, HS);
  }) / 1e12;
  // Memory-bound kernels on N x 4C (GELU), N x C (LayerNorm, residual), N x Vp (cross-entropy).
  const std::size_t n4 = std::size_t(N) * 4 * C, n1 = std::size_t(N) * C;
  auto x = filled("bench.x", n4, 0.5f), y = filled("bench.y", n4, 0.0f),
       dy = filled("bench.dy", n4, 0.1f);
  c.gelu_gbs = n4 * (KB::gelu_fwd(4) + KB::gelu_bwd(4)) / 1e9 / median_seconds(st.reps, [&] {
    k::gelu_forward<float>(ex, y, x, n4);
    k::gelu_backward<float>(ex, y, x, dy, n4);
  });
  auto w = filled("bench.w", C, 1.0f), bvec = filled("bench.b", C, 0.0f);
  auto dw = filled("bench.dw", C, 0.0f), db = filled("bench.db", C, 0.0f);
  View1<float> mean("meshtrain::bench.mean", N), rstd("meshtrain::bench.rstd", N);
  c.layernorm_gbs = n1 * (KB::layernorm_fwd(4) + KB::layernorm_bwd(4)) / 1e9 /
                    median_seconds(st.reps, [&] {
                      k::layernorm_forward<float>(ex, y, mean, rstd, x, w, bvec, N, C);
                      k::layernorm_backward<float>(ex, dy, dw, db, x, x, w, mean, rstd, N, C);
                    });
  c.elementwise_gbs = n4 * KB::residual(4) / 1e9 / median_seconds(st.reps, [&] {
    k::residual_forward<float>(ex, y, x, dy, n4);
  });
  const std::size_t nv = std::size_t(N) * Vp;
  auto logits = filled("bench.logits", nv, 0.01f);
  View1<float> losses("meshtrain::bench.losses", N);
  View1<std::int32_t> targets("meshtrain::bench.targets", N);
  c.cross_entropy_gbs = nv * KB::cross_entropy(4) / 1e9 / median_seconds(st.reps, [&] {
    k::cross_entropy_forward_backward<float>(ex, losses, logits, targets, N, Vp, cfg.vocab_size,
                                             1.0f);
  });
  // AdamW over the GELU-sized buffers (fp32: no master), and the host step of offload.
  Scalar<float> one("meshtrain::bench.one");
  Kokkos::deep_copy(one, 1.0f);
  auto m = filled("bench.m", n4, 0.0f), v = filled("bench.v", n4, 0.0f);
  kernels::AdamWHyper h;
  c.adamw_gbs = n4 * KB::adamw(4, false) / 1e9 / median_seconds(st.reps, [&] {
    k::adamw_update<float>(ex, x, dy, m, v, n4, h, 1.0f, one);
  });
  optim::ShardedAdamWT<float> host({{0, 0, n4}}, {{0, 0, n4, true, true}}, n4, optim::AdamWConfig{},
                                   optim::StatePlacement::host, ex);
  host.init_master(x, optim::Index::flat);
  c.host_adamw_gbs = n4 * KB::adamw(4, true) / 1e9 / median_seconds(st.reps, [&] {
    host.local_sumsq(dy, optim::Index::flat);
    host.apply(x, optim::Index::flat, dy, optim::Index::flat, 1);
  });
  // A large copy: the memory ceiling, and host <-> device on GPUs.
  const std::size_t big = std::max<std::size_t>(n4, std::size_t(32) << 20);
  auto src = filled("bench.src", big, 1.0f), dst = filled("bench.dst", big, 0.0f);
  c.memory_gbs = 2.0 * big * 4 / 1e9 / median_seconds(st.reps, [&] { Kokkos::deep_copy(dst, src); });
  if (kDeviceIsHost) {
    c.pcie_gbs = c.memory_gbs;
  } else {
    auto hv = Kokkos::create_mirror_view(Kokkos::HostSpace{}, src);
    c.pcie_gbs = 2.0 * big * 4 / 1e9 / median_seconds(st.reps, [&] {
      Kokkos::deep_copy(hv, src);
      Kokkos::deep_copy(src, hv);
    });
    c.kernel_overhead_us = 1e6 * median_seconds(st.reps, [&] {
      for (int i = 0; i < 100; ++i) Kokkos::deep_copy(ex, one, 1.0f);
    }) / 100;
  }
}

// All ranks: t = alpha + 2(n-1)/n x bytes / busbw on the world. alpha is what a one-element
// all-reduce adds after a short compute phase, as in a tensor-parallel block (on a shared CPU
// machine: the delay until every rank is scheduled again, milliseconds under load, not the
// transport's microseconds); busbw comes from 1 and 8 MiB with alpha taken off.
plan::LinkClass measure_link(comm::Communicator& world, MPI_Comm mpi, int reps) {
  plan::LinkClass l;
  const int n = world.size();
  if (n == 1) {
    l.note = "not measured: one rank";
    return l;
  }
  auto median_time = [&](View1<float> buf) {
    std::vector<double> t;
    world.all_reduce(buf);
    for (int i = 0; i < std::max(reps, 5); ++i) {
      MPI_Barrier(mpi);
      Timer clock;
      world.all_reduce(buf);
      Kokkos::fence();
      double s = clock.seconds(), slowest = 0;
      MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, mpi);
      t.push_back(slowest);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  double alpha = median_time(filled("bench.allreduce", 1, 1.0f));
  {
    // Synchronisation after compute, in a group of two (a tensor-parallel pair): what a
    // one-element all-reduce adds to a short GEMM, ranks 0 and 1 only.
    int me = 0;
    MPI_Comm_rank(mpi, &me);
    MPI_Comm pair;
    MPI_Comm_split(mpi, me < 2 ? 0 : 1, me, &pair);
    double added = 0;
    if (me < 2) {
      const int M = 128, reps_sync = 40;
      auto a = filled("bench.sync_a", M * M, 0.01f), c = filled("bench.sync_c", M * M, 0.0f);
      float one = 1.0f, sum = 0;
      auto phase = [&](bool sync) {
        MPI_Barrier(pair);
        Timer clock;
        for (int i = 0; i < reps_sync; ++i) {
          kernels::gemm<float>(ExecSpace{}, kernels::Trans::N, kernels::Trans::N, M, M, M, 1.0f,
                               a.data(), M, a.data(), M, 0.0f, c.data(), M);
          Kokkos::fence();
          if (sync) MPI_Allreduce(&one, &sum, 1, MPI_FLOAT, MPI_SUM, pair);
        }
        double s = clock.seconds(), slowest = 0;
        MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, pair);
        return slowest;
      };
      phase(true);
      const double with = phase(true), without = phase(false);
      added = (with - without) / reps_sync;
    }
    MPI_Comm_free(&pair);
    quiet_barrier(mpi);  // the others wait without taking a core
    MPI_Bcast(&added, 1, MPI_DOUBLE, 0, mpi);
    alpha = std::max(alpha, added);
  }
  double inv_bw = 0;
  int k = 0;
  for (std::size_t bytes : {std::size_t(1) << 20, std::size_t(8) << 20}) {
    const double t = median_time(filled("bench.allreduce", bytes / 4, 1.0f));
    inv_bw += std::max(t - alpha, 0.1 * t) / (2.0 * (n - 1) / n * bytes);
    ++k;
  }
  l.alpha_us = alpha * 1e6;
  l.busbw_gbs = k / inv_bw / 1e9;
  l.measured = true;
  l.note = cat("all-reduce of 4 B (and after compute, in a pair), 1 MiB, 8 MiB on ", n, " ranks (",
               comm::backend_name(world.backend()), ")");
  return l;
}

// The GEMM loop of probe_machine on the first k ranks at once (the others wait without
// spinning), k = 1, 2, 4, ... and the job's size: per-rank time over rank 0's alone.
std::vector<std::pair<double, double>> rank_slowdown(MPI_Comm comm) {
  int n = 1, rank = 0;
  MPI_Comm_size(comm, &n);
  MPI_Comm_rank(comm, &rank);
  const int M = 256, N = 1024, K = 256;
  auto a = filled("bench.sd_a", std::size_t(M) * K, 0.01f), b = filled("bench.sd_b", std::size_t(K) * N, 0.01f),
       cm = filled("bench.sd_c", std::size_t(M) * N, 0.0f);
  auto loop = [&] {
    Timer t;
    for (int i = 0; i < 40; ++i)
      kernels::gemm<float>(ExecSpace{}, kernels::Trans::N, kernels::Trans::N, M, N, K, 1.0f,
                           a.data(), K, b.data(), N, 0.0f, cm.data(), N);
    Kokkos::fence();
    return t.seconds();
  };
  std::vector<int> ks;
  for (int k = 1; k < n; k *= 2) ks.push_back(k);
  ks.push_back(n);
  std::vector<std::pair<double, double>> out;
  double base = 0;
  for (int k : ks) {
    std::vector<double> t;  // the slowest busy rank's time, three times
    for (int rep = 0; rep < 3; ++rep) {
      quiet_barrier(comm);
      double mine = rank < k ? loop() : 0.0, w = 0;
      MPI_Allreduce(&mine, &w, 1, MPI_DOUBLE, MPI_MAX, comm);
      t.push_back(w);
    }
    std::sort(t.begin(), t.end());
    if (k == 1) base = t[1];
    out.emplace_back(k, std::max(1.0, t[1] / base));
  }
  return out;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d", std::localtime(&t));
  return b;
}

}  // namespace

int cmd_bench(Runtime& rt, const std::vector<std::string>& args) {
  const auto desc = bench_options();
  const config::Parsed p = config::parse(args, desc);
  logging::set_context(log_context(p.vm, rt.rank()));
  const model::GptConfig cfg = model_config(p.vm);
  Settings st;
  st.T = p.vm["bench.seq_len"].as<int>();
  if (st.T == 0) st.T = cfg.block_size;
  st.reps = p.vm["bench.reps"].as<int>();
  st.mbs = parse_int_list(p.vm["bench.micro_batches"].as<std::string>(), "bench.micro_batches");
  st.tps = parse_int_list(p.vm["bench.tp"].as<std::string>(), "bench.tp");
  const std::string link = p.vm["bench.link"].as<std::string>();
  MESHTRAIN_CONFIG_CHECK(link == "intra" || link == "inter", "bench.link='", link,
                         "' is not intra or inter");
  plan::Calibration c;
  c.measured = true;
  c.device = kDeviceIsHost ? "cpu" : "gpu";
  c.precision = "fp32";
  c.date = today();
  c.machine = p.vm["bench.machine"].as<std::string>();
  if (c.machine.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    c.machine = host;
  }
  c.peak_tflops = p.vm["bench.peak_tflops"].as<double>();
  c.dp_overlap = kDeviceIsHost ? 0.5 : 1.0;
  c.runtime_bytes = static_cast<double>(device_used_bytes());
  c.source = cat("meshtrain bench, ", cfg.describe(), ", seq ", st.T, ", micro-batches ",
                 p.vm["bench.micro_batches"].as<std::string>(), ", tp ",
                 p.vm["bench.tp"].as<std::string>(), ", ", rt.size(), " ranks");
  logging::info("meshtrain bench: ", c.source);
  if (rt.rank() == 0) measure_kernels(cfg, st, c);
  quiet_barrier(rt.world());
  const MachineProbe probe = probe_machine(rt.world());
  c.probe_alone_s = probe.alone_s;
  if (kDeviceIsHost && p.vm["bench.slowdown"].as<bool>()) c.rank_slowdown = rank_slowdown(rt.world());
  auto world = comm::make_communicator(comm::default_backend(), rt.world());
  plan::LinkClass measured = measure_link(*world, rt.world(), st.reps);
  plan::LinkClass other = measured;
  other.measured = false;
  other.note = "copied from the measured class: " + measured.note;
  c.intra = link == "intra" ? measured : other;
  c.inter = link == "inter" ? measured : other;
  if (rt.rank() == 0) {
    plan::save_calibration(p.vm["bench.out"].as<std::string>(), c);
    std::string sl;
    for (auto [k, f] : c.rank_slowdown) sl += cat(sl.empty() ? "" : ", ", k, ": ", f);
    logging::info("GEMM ", c.gemm.size(), " shapes, best ", c.peak_tflops,
                  " TFLOP/s; slowdown by busy ranks {", sl, "}; attention ",
                  c.attention_fwd_tflops, " / ", c.attention_bwd_tflops,
                  " TFLOP/s; copy ", c.memory_gbs, " GB/s; all-reduce alpha ", c.intra.alpha_us,
                  " us, busbw ", measured.busbw_gbs, " GB/s");
    logging::info("wrote ", p.vm["bench.out"].as<std::string>());
  }
  return kExitOk;
}

}  // namespace meshtrain::app
