// One full training step of a preset on one rank, through the engine the trainer uses (the
// batch to the device, forward, backward, gradient reduction, AdamW, fence): median and mean step time and tokens/s, then where the time goes, kernel by kernel.
// The reference is PyTorch on the same shapes (perf/reference/torch_gpt2_step.py); perf/cpu/step_vs_torch.sh
// runs both interleaved and prints the ratio.
//
//   build/cpu/perf/bench/bench_train_step [--preset cpu-bench] [--micro-batch 8] [--seq-len T]
//          [--steps 10] [--warmup 2] [--profile-steps 3] [--seed 1234] [--precision fp32|bf16]
//          [--n-layer L] [--vocab-size V]   (a preset cut down: CPU smoke runs of the GPU shapes)
//          [--recompute-mlp-act 1]   (train.recompute_mlp_act: the MLP activation recomputed)
//          [--head-chunk-tokens R]   (train.head_chunk_tokens: LM-head rows at once, 0 auto)
//   e.g. --preset llama3.2-1b --seq-len 2048 --precision bf16 --micro-batch 4 on one H200
//   (perf/reference/torch_llama_gpu.py is the PyTorch side), --n-layer 1 --vocab-size 512 on a CPU.
//          [--moe-experts E --moe-top-k 2 --moe-ffn I --moe-layer-freq 1 --moe-shared S]
// (the --moe-* options make the preset a Mixture-of-Experts model, docs/moe.md; fp32 or bf16)
//
// Time shares come from Kokkos' profiling callbacks installed by this program (no tool library
// needed): every parallel_for/reduce/scan, deep_copy and region (kernels/gemm/gemm.cpp wraps each BLAS call
// in "meshtrain::gemm") is timed between its begin and end callback. In the Serial backend
// kernels are synchronous, so those intervals are exact. On a GPU, Kokkos fences the device
// before every callback while a tool is loaded (its default "global fencing"), so each interval
// is the kernel's run time plus one synchronisation (~10 us); cuBLAS calls and the CUDA
// attention kernels appear through the regions the kernels open (labelled by GEMM shape).
// Time is exclusive: a kernel inside a region is charged to the kernel, not twice.
// The timed steps run without callbacks; the profile runs separate steps after them.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/alloc_tracker.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"
#include "meshtrain/parallel/engine.hpp"

using namespace meshtrain;

namespace {

struct Args {
  std::string preset = "cpu-bench";
  int micro_batch = 8, seq_len = 0;  // 0: the preset's block size
  int n_layer = 0, vocab_size = 0;   // 0: the preset's (smaller: a CPU-sized smoke run)
  int steps = 10, warmup = 2, profile_steps = 3;
  std::uint64_t seed = 1234;
  std::string precision = "fp32";  // bf16: bf16 compute, fp32 master weights (GPU builds)
  std::string attn_impl = "auto";  // --attn.impl of meshtrain train
  bool attn_deterministic = false;
  bool recompute_mlp_act = false;  // --recompute-mlp-act 1: train.recompute_mlp_act
  int head_chunk_tokens = 0;       // --head-chunk-tokens R: train.head_chunk_tokens (0 auto)
  model::MoeConfig moe;  // --moe-*: experts = 0 keeps the preset dense
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--preset") a.preset = v;
    else if (k == "--micro-batch") a.micro_batch = std::stoi(v);
    else if (k == "--seq-len") a.seq_len = std::stoi(v);
    else if (k == "--n-layer") a.n_layer = std::stoi(v);
    else if (k == "--vocab-size") a.vocab_size = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--profile-steps") a.profile_steps = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--precision")
      a.precision = v;
    else if (k == "--attn-impl")
      a.attn_impl = v;
    else if (k == "--attn-deterministic")
      a.attn_deterministic = v == "1" || v == "true";
    else if (k == "--recompute-mlp-act")
      a.recompute_mlp_act = v == "1" || v == "true";
    else if (k == "--head-chunk-tokens")
      a.head_chunk_tokens = std::stoi(v);
    else if (k == "--moe-experts")
      a.moe.experts = std::stoi(v);
    else if (k == "--moe-top-k")
      a.moe.top_k = std::stoi(v);
    else if (k == "--moe-ffn")
      a.moe.ffn = std::stoi(v);
    else if (k == "--moe-layer-freq")
      a.moe.layer_freq = std::stoi(v);
    else if (k == "--moe-shared")
      a.moe.shared_ffn = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_train_step: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  if ((argc - 1) % 2 != 0) {
    std::fprintf(stderr, "bench_train_step: option %s has no value\n", argv[argc - 1]);
    std::exit(2);
  }
  return a;
}

// ---- per-kernel timing through Kokkos' profiling callbacks ----
// Kokkos 3.4 and 4.x declare the same setters and C callback types in
// Kokkos::Tools::Experimental (checked against both headers), so no version switch is needed.
namespace prof {
using Clock = std::chrono::steady_clock;
struct Frame {
  std::string label;
  Clock::time_point start;
  double child = 0;  // seconds spent in nested frames
};
struct Stat {
  double seconds = 0;  // exclusive
  long calls = 0;
};
std::vector<Frame> stack;
std::map<std::string, Stat> stats;

// Labels are used as given: meshtrain's are fixed strings, and Kokkos' own (ViewFill, deep_copy)
// carry the View's label, which is what one wants to see. Per-call suffixes would go here.
std::string group(const char* name) { return name ? name : "(unnamed)"; }

void push(std::string label) { stack.push_back(Frame{std::move(label), Clock::now(), 0}); }
void pop() {
  if (stack.empty()) return;
  const Frame f = stack.back();
  stack.pop_back();
  const double total = std::chrono::duration<double>(Clock::now() - f.start).count();
  Stat& s = stats[f.label];
  s.seconds += total - f.child;
  s.calls += 1;
  if (!stack.empty()) stack.back().child += total;
}

void begin_kernel(const char* name, const std::uint32_t, std::uint64_t* id) {
  *id = stack.size();
  push(group(name));
}
void end_kernel(std::uint64_t) { pop(); }
void push_region(const char* name) { push(group(name)); }
void pop_region() { pop(); }
void begin_copy(Kokkos_Profiling_SpaceHandle, const char* dst, const void*,
                Kokkos_Profiling_SpaceHandle, const char*, const void*, std::uint64_t) {
  push("Kokkos::deep_copy [" + group(dst) + "]");
}
void end_copy() { pop(); }

void install() {
  namespace E = Kokkos::Tools::Experimental;
  E::set_begin_parallel_for_callback(begin_kernel);
  E::set_end_parallel_for_callback(end_kernel);
  E::set_begin_parallel_reduce_callback(begin_kernel);
  E::set_end_parallel_reduce_callback(end_kernel);
  E::set_begin_parallel_scan_callback(begin_kernel);
  E::set_end_parallel_scan_callback(end_kernel);
  E::set_push_region_callback(push_region);
  E::set_pop_region_callback(pop_region);
  E::set_begin_deep_copy_callback(begin_copy);
  E::set_end_deep_copy_callback(end_copy);
}
void uninstall() {
  namespace E = Kokkos::Tools::Experimental;
  E::set_begin_parallel_for_callback(nullptr);
  E::set_end_parallel_for_callback(nullptr);
  E::set_begin_parallel_reduce_callback(nullptr);
  E::set_end_parallel_reduce_callback(nullptr);
  E::set_begin_parallel_scan_callback(nullptr);
  E::set_end_parallel_scan_callback(nullptr);
  E::set_push_region_callback(nullptr);
  E::set_pop_region_callback(nullptr);
  E::set_begin_deep_copy_callback(nullptr);
  E::set_end_deep_copy_callback(nullptr);
}
}  // namespace prof

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// GEMM throughput on the largest GEMM shape of a step (the MLP c_fc) in the compute type,
// measured now: the ceiling that the "gemm" lines of the profile are compared against.
template <class T>
double gemm_gflops(int M, int N, int K) {
  View1<T> A = alloc<T>("bench.A", std::size_t(M) * K);
  View1<T> B = alloc<T>("bench.B", std::size_t(K) * N);
  View1<T> C = alloc<T>("bench.C", std::size_t(M) * N);
  // Not constants: tensor-core GEMMs run measurably faster on uniform data.
  for (View1<T>* v : {&A, &B}) {
    auto h = Kokkos::create_mirror_view(*v);
    for (std::size_t i = 0; i < h.extent(0); ++i)
      h(i) = static_cast<T>(float((i * 2654435761u) % 1000) * 1e-3f - 0.5f);
    Kokkos::deep_copy(*v, h);
  }
  ExecSpace exec;
  auto once = [&] {
    kernels::gemm<T>(exec, kernels::Trans::N, kernels::Trans::N, M, N, K, 1.0f, A.data(), K,
                     B.data(), N, 0.0f, C.data(), N);
  };
  once();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    Timer tm;
    once();
    exec.fence();
    t.push_back(tm.seconds());
  }
  return 2.0 * M * N * K / median(t) / 1e9;
}

// One model of compute type CT: timed steps, then the profile.
template <class CT>
void run(const Args& a) {
  {
    model::GptConfig cfg = model::preset(a.preset);
    if (a.n_layer > 0) cfg.n_layer = a.n_layer;
    if (a.vocab_size > 0) cfg.vocab_size = a.vocab_size;
    cfg.moe = a.moe;
    cfg.validate();
    const int B = a.micro_batch, T = a.seq_len > 0 ? a.seq_len : cfg.block_size;
    const int N = B * T, C = cfg.n_embd, L = cfg.n_layer, Vp = cfg.padded_vocab();
    // Peak of live Kokkos allocations over construction and the first step (model, optimizer,
    // kernel scratch): what PyTorch's max_memory_allocated counts. Removed before the timed
    // steps: a loaded tool makes Kokkos fence around every kernel.
    auto tracker = std::make_unique<AllocTracker>(std::vector<std::string>{"bench."});
    optim::AdamWConfig ocfg;  // GPT-2 defaults: betas (0.9, 0.95), eps 1e-8, wd 0.1, clip 1.0
    parallel::EngineOptions eo;  // one rank: the trainer's engine over a 1 x 1 x 1 mesh
    eo.micro_batch = B;
    eo.seq_len = T;
    eo.adamw = ocfg;
    eo.attention.impl = kernels::parse_attention_impl(a.attn_impl, "--attn-impl");
    eo.attention.deterministic = a.attn_deterministic;
    eo.recompute_mlp_act = a.recompute_mlp_act;
    eo.head_chunk_tokens = a.head_chunk_tokens;
    parallel::Engine<CT> engine(MPI_COMM_SELF, cfg, eo);
    engine.init_parameters(a.seed);

    // Random tokens in [0, vocab) from the counter-based RNG: no dataset needed. The engine
    // copies each step's batch to the device, as in training.
    HostView1<std::int32_t> h_tok("meshtrain::bench.tokens", N + 1);
    for (int i = 0; i <= N; ++i)
      h_tok(i) = static_cast<std::int32_t>(rng::bits(a.seed, rng::name_stream("bench.tokens"), i) %
                                           static_cast<std::uint64_t>(cfg.vocab_size));
    const auto batch = [&](int, int, std::int32_t* in, std::int32_t* tg) {
      for (int i = 0; i < N; ++i) {
        in[i] = h_tok(i);
        tg[i] = h_tok(i + 1);
      }
    };
    const float grad_scale = 1.0f / static_cast<float>(N);

    std::int64_t step = 0;
    auto train_step = [&] {
      engine.forward_backward(batch, grad_scale);
      engine.optimizer_step(step++);
      engine.fence();
    };

    std::printf(
        "# bench_train_step: %s, micro-batch %d x seq %d = %d tokens/step, 1 rank, %s, "
        "%s, attention %s%s\n",
        cfg.describe().c_str(), B, T, N, ExecSpace::name(), a.precision.c_str(),
        a.attn_impl.c_str(), a.attn_deterministic ? " (deterministic)" : "");
    train_step();
    const double peak_gib = double(tracker->peak()) / double(1 << 30);
    tracker.reset();
    std::printf("peak allocated: %.2f GiB (Kokkos allocations; CUDA context excluded)\n",
                peak_gib);
    for (int i = 1; i < a.warmup; ++i) train_step();
    std::vector<double> ms;
    for (int i = 0; i < a.steps; ++i) {
      Timer t;
      train_step();
      ms.push_back(t.seconds() * 1e3);
    }
    const float loss = engine.global_loss_sum();
    const double med = median(ms);
    const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
    const double mn = *std::min_element(ms.begin(), ms.end());
    std::printf("step_ms: median %.2f  mean %.2f  min %.2f  (%d steps after %d warmup)\n", med,
                mean, mn, a.steps, a.warmup);
    std::printf("tokens/s: %.0f (median step)   loss of the last step %.4f\n", N / med * 1e3,
                loss / N);
    // Model FLOPs utilisation against an H200's dense bf16 peak (PyTorch's perf scripts use the
    // same figure and GptConfig::flops_per_token's count).
    const double mfu = N / med * 1e3 * cfg.flops_per_token(T) / 989e12;
    std::printf("mfu: %.3f (%.3g FLOPs/token, against 989 TFLOP/s)\n", mfu, cfg.flops_per_token(T));
    std::printf("RESULT meshtrain median_ms=%.3f mean_ms=%.3f tokens_per_s=%.1f mfu=%.4f\n", med,
                mean, N / med * 1e3, mfu);

    if (a.profile_steps > 0) {
      prof::install();
      Timer t;
      for (int i = 0; i < a.profile_steps; ++i) train_step();
      const double total = t.seconds();
      prof::uninstall();
      const double steps = a.profile_steps;
      std::vector<std::pair<std::string, prof::Stat>> rows(prof::stats.begin(), prof::stats.end());
      std::sort(rows.begin(), rows.end(),
                [](const auto& x, const auto& y) { return x.second.seconds > y.second.seconds; });
      double tracked = 0;
      for (const auto& r : rows) tracked += r.second.seconds;
      std::printf(
          "\n# per-kernel time, %d profiled steps of %.2f ms (exclusive; share of the "
          "step)\n",
          a.profile_steps, total / steps * 1e3);
      std::printf("%-52s %10s %10s %8s\n", "label", "calls/step", "ms/step", "share");
      for (const auto& [label, s] : rows)
        std::printf("%-52s %10.1f %10.3f %7.1f%%\n", label.c_str(), s.calls / steps,
                    s.seconds / steps * 1e3, 100.0 * s.seconds / total);
      std::printf("%-52s %10s %10.3f %7.1f%%\n", "(host code between kernels)", "",
                  (total - tracked) / steps * 1e3, 100.0 * (total - tracked) / total);

      // GEMM work of a step: per block 12 C^2 MACs per token forward (qkv 3, proj 1, fc 4,
      // fc-proj 4), the tied head C Vp; backward twice the forward (dinp and dweight).
      const double gemm_flop = 3.0 * 2.0 * N * (12.0 * L * C * C + double(C) * Vp);
      // GPU builds label each GEMM by its shape ("meshtrain::gemm NN MxNxK"): sum them all.
      double gemm_s = 0;
      for (const auto& [label, s] : prof::stats)
        if (label.rfind("meshtrain::gemm", 0) == 0) gemm_s += s.seconds;
      if (gemm_s > 0) {
        const double achieved = gemm_flop * steps / gemm_s / 1e9;
        const double ceiling = gemm_gflops<CT>(N, 4 * C, C);
        std::printf(
            "\n# gemm: %.2f GFLOP/step in %.3f ms at %.1f GFLOP/s; one gemm %dx%dx%d "
            "now: %.1f GFLOP/s (ratio %.2f)\n",
            gemm_flop / 1e9, gemm_s / steps * 1e3, achieved, N, 4 * C, C, ceiling,
            achieved / ceiling);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  {
    const Args a = parse(argc, argv);
    kc::initialize(-1);
    if (a.precision == "fp32") {
      run<float>(a);
#if MESHTRAIN_HAVE_BF16
    } else if (a.precision == "bf16") {
      run<bf16>(a);
#endif
    } else {
      std::fprintf(stderr, "bench_train_step: --precision %s is not built here (fp32%s)\n",
                   a.precision.c_str(), MESHTRAIN_HAVE_BF16 ? ", bf16" : "");
      std::exit(2);
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return 0;
}
