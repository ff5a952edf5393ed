// Tensor parallelism: per-rank memory and step time (issue 5).
//
//   mpirun -np P build/cpu/perf/bench/bench_tensor_parallel --mode memory [--preset gpt2-124m]
//          [--seq-len 1024] [--micro-batch 1] [--sp 0|1] [--n-head H]
//   mpirun -np P build/cpu/perf/bench/bench_tensor_parallel --mode time [--preset cpu-bench]
//          [--micro-batch 8] [--steps 10] [--sp 0|1]
//
// The world is the tp group. `memory` builds a model of one block (activations and block
// parameters scale with n_layer: the figures are scaled to the preset's depth) and reports, per
// rank, parameter elements from the registry, activation bytes measured from the model's
// allocations, and the same from the closed forms below; `time` runs training steps (forward,
// backward; no optimizer) and reports the median step time and the share of it spent in tp
// communication (host wall time around the MPI calls).
//
// Closed forms per block and micro-batch (s tokens x b sequences, hidden h, tp size t; elements):
//   ours, no SP:  s*b*h*(4 + 12/t)   (ln1, ln2, res2, block out replicated; qkv 3/t,
//                                     attention out 1/t, fc 4/t, gelu 4/t; the projections'
//                                     outputs are not kept: the residual add consumes them)
//   ours, SP:     s*b*h*(2 + 14/t)   (only the gathered LayerNorm outputs stay replicated)
//   Megatron (Korthikanti et al. 2022, bytes, 16-bit, with dropout masks and the a*s^2 softmax):
//       no SP: s*b*h*(10 + 24/t + 5*a*s/(h*t)),  SP: s*b*h*(34/t + 5*a*s/(h*t))
// Ours keeps no dropout masks and no s x s attention matrix (flash attention keeps only the
// row log-sum-exp, b*a*s/t floats).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/comm/flight_recorder.hpp"
#include "meshtrain/core/json.hpp"
#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/model/gpt.hpp"

using namespace meshtrain;

namespace {

struct Args {
  std::string mode = "memory", preset = "gpt2-124m";
  int micro_batch = 1, seq_len = 0, steps = 10, n_head = 0;
  bool sp = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--mode") a.mode = v;
    else if (k == "--preset") a.preset = v;
    else if (k == "--micro-batch") a.micro_batch = std::stoi(v);
    else if (k == "--seq-len") a.seq_len = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--sp") a.sp = std::stoi(v) != 0;
    else if (k == "--n-head") a.n_head = std::stoi(v);
    else {
      std::fprintf(stderr, "bench_tensor_parallel: unknown option %s\n", k.c_str());
      std::exit(2);
    }
  }
  return a;
}

void fill_tokens(View1<std::int32_t> v, int vocab, std::uint64_t offset) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < h.extent(0); ++i)
    h(i) = static_cast<std::int32_t>(rng::bits(1, rng::name_stream("bench.tokens"), offset + i) %
                                     static_cast<std::uint64_t>(vocab));
  Kokkos::deep_copy(v, h);
}

// A figure rounded to the decimals it is good for (0: an integer), as a JSON number.
Json fixed(double v, int decimals) {
  if (decimals == 0) return std::llround(v);
  const double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  meshtrain::comm::set_flight_world(MPI_COMM_WORLD);  // world ranks in flight dumps
  {
    const Args a = parse(argc, argv);
    kc::initialize(-1);
    {
      int world = 1, rank = 0;
      MPI_Comm_size(MPI_COMM_WORLD, &world);
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      mesh::ProcessMesh pm(MPI_COMM_WORLD, mesh::Shape{1, 1, world});
      auto tp = comm::make_communicator(comm::default_backend(), pm.tp().get());
      model::GptConfig cfg = model::preset(a.preset);
      // GPT-2 1.5B has 25 heads, which no tp of 2 or 4 divides: --n-head 16 (head size 100)
      // keeps every parameter and activation tensor the same size.
      if (a.n_head > 0) cfg.n_head = a.n_head;
      const int L = cfg.n_layer, T = a.seq_len > 0 ? a.seq_len : cfg.block_size;
      const int B = a.micro_batch, t = world;
      model::ModelLayout layout;
      layout.tp = tp.get();
      layout.sequence_parallel = a.sp;
      if (a.mode == "memory") cfg.n_layer = 1;  // per-block figures, scaled below
      model::Gpt m(cfg, B, T, layout);
      const auto& reg = m.registry();
      if (a.mode == "memory") {
        // Parameters: embedding + ln_f as built, one block scaled to the preset's depth.
        std::size_t block = 0, other = 0;
        for (const auto& p : reg.params()) (p.layer >= 0 ? block : other) += p.numel;
        const double params = double(other) + double(block) * L;
        model::GptConfig full = model::preset(a.preset);
        full.n_head = cfg.n_head;
        double params_tp1 = 0;
        for (const auto& p : model::ParameterRegistry(full, 0, 1, 0, 0, L, true, true).params())
          params_tp1 += double(p.numel);
        const double sbh = double(B) * T * cfg.n_embd;
        // The model's activation bytes less the chunk input (the embedding output) and the head's
        // saved output gradient: one block's saved tensors and its output, plus small per-row
        // statistics (LayerNorm mean/rstd, attention log-sum-exp) and the tokens.
        const double act_block = double(m.activation_bytes()) / 4.0 - 2 * sbh / (a.sp ? t : 1);
        const double ours = a.sp ? sbh * (2 + 14.0 / t) : sbh * (4 + 12.0 / t);
        const double aoh = double(cfg.n_head) * T / cfg.n_embd;
        const double meg_bytes = a.sp ? sbh * (34.0 / t + 5 * aoh / t)
                                      : sbh * (10 + 24.0 / t + 5 * aoh / t);
        if (rank == 0)
          std::printf("%s\n", json::dump({{"bench", "tp_memory"}, {"preset", a.preset}, {"tp", t},
                                            {"sp", a.sp ? 1 : 0}, {"micro_batch", B}, {"seq_len", T},
                                            {"params_per_rank", fixed(params, 0)},
                                            {"param_fraction", fixed(params / params_tp1, 4)},
                                            {"act_elems_per_block_measured", fixed(act_block, 0)},
                                            {"act_elems_per_block_formula", fixed(ours, 0)},
                                            {"act_MiB_model_fp32", fixed(act_block * 4.0 * L / 1048576.0, 1)},
                                            {"megatron_act_MiB_model_16bit", fixed(meg_bytes * L / 1048576.0, 1)}})
                                   .c_str());
      } else {
        const int N = B * T;
        auto in = alloc<std::int32_t>("in", N), tg = alloc<std::int32_t>("tg", N);
        m.init_parameters(1);
        std::vector<double> step_s, comm_s;
        for (int s = 0; s < a.steps + 2; ++s) {
          fill_tokens(in, cfg.vocab_size, std::uint64_t(s) * 2 * N);
          fill_tokens(tg, cfg.vocab_size, std::uint64_t(s) * 2 * N + N);
          MPI_Barrier(MPI_COMM_WORLD);
          const double c0 = m.tp_comm_seconds();
          Timer timer;
          m.zero_grads();
          m.forward_train(in, tg, 1.0f / N);
          m.backward();
          m.exec().fence();
          if (s >= 2) {  // warm-up steps excluded
            step_s.push_back(timer.seconds());
            comm_s.push_back(m.tp_comm_seconds() - c0);
          }
        }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        const double st = median(step_s), ct = median(comm_s);
        if (rank == 0)
          std::printf("%s\n", json::dump({{"bench", "tp_time"}, {"preset", a.preset}, {"tp", t},
                                            {"sp", a.sp ? 1 : 0}, {"micro_batch", B}, {"seq_len", T},
                                            {"step_ms", fixed(st * 1e3, 1)},
                                            {"tp_comm_ms", fixed(ct * 1e3, 1)},
                                            {"tp_comm_share", fixed(ct / st, 3)},
                                            {"tokens_per_s", fixed(N / st, 0)}})
                                   .c_str());
      }
    }
    Kokkos::finalize();
  }
  MPI_Finalize();
  return 0;
}
