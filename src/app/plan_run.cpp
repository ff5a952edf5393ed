#include "meshtrain/app/plan_run.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <memory>

#include "meshtrain/comm/factory.hpp"
#include "meshtrain/core/agree.hpp"
#include "meshtrain/core/alloc_tracker.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::app {

double LayoutRun::median_step(int skip) const {
  std::vector<double> t(step_seconds.begin() + std::min<std::size_t>(skip, step_seconds.size()),
                        step_seconds.end());
  if (t.empty()) return step_seconds.empty() ? 0.0 : step_seconds.back();
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

MachineProbe probe_machine(MPI_Comm comm) {
  const int M = 256, N = 1024, K = 256;
  View1<float> a("meshtrain::probe.a", std::size_t(M) * K), b("meshtrain::probe.b", std::size_t(K) * N),
      c("meshtrain::probe.c", std::size_t(M) * N);
  auto loop = [&] {
    Timer t;
    for (int i = 0; i < 40; ++i)
      kernels::gemm<float>(ExecSpace{}, kernels::Trans::N, kernels::Trans::N, M, N, K, 1.0f,
                           a.data(), K, b.data(), N, 0.0f, c.data(), N);
    Kokkos::fence();
    return t.seconds();
  };
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  MachineProbe p;
  if (rank == 0) {
    loop();
    p.alone_s = loop();
  }
  quiet_barrier(comm);
  MPI_Barrier(comm);
  const double mine = loop();
  MPI_Allreduce(&mine, &p.together_s, 1, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Bcast(&p.alone_s, 1, MPI_DOUBLE, 0, comm);
  return p;
}

namespace {

template <class T>
LayoutRun run_typed(MPI_Comm world, const model::GptConfig& cfg, int seq_len,
                    const plan::Layout& l, const io::TokenDataset& data, int steps,
                    std::uint64_t seed) {
  int wsize = 0;
  MPI_Comm_size(world, &wsize);
  MESHTRAIN_CONFIG_CHECK(wsize == l.world(), "layout ", l.name(), " needs ", l.world(),
                         " ranks, the job has ", wsize);
  LayoutRun r;
  // The initialisation buffer of ZeRO-3 is a temporary of this function, not of training;
  // Kokkos' own team scratch and the kernels' process-wide scalars (allocated once per process,
  // on first use) belong to the runtime overhead, not to the layout.
  AllocTracker tracker({"init.params", "Kokkos::", "scratch_"});
  parallel::EngineOptions eo;
  eo.parallel.shape = mesh::Shape{l.dp, l.pp, l.tp};
  eo.parallel.shape.ep = l.ep;
  eo.parallel.shape.cp = l.cp;
  eo.parallel.cp_comm = l.cp_all_gather ? model::CpComm::all_gather : model::CpComm::ring;
  eo.parallel.backend = comm::default_backend();
  eo.parallel.sequence_parallel = l.sequence_parallel;
  eo.parallel.schedule = l.schedule;
  eo.parallel.virtual_chunks = l.virtual_chunks;
  eo.parallel.dp.zero_stage = l.zero_stage;
  eo.parallel.dp.offload = l.offload;
  eo.parallel.dp.bucket_bytes = l.bucket_bytes;
  eo.micro_batch = l.micro_batch;
  eo.seq_len = seq_len;
  eo.n_micro = l.n_micro;
  eo.recompute = l.recompute;
  eo.recompute_mlp_act = l.recompute_mlp_act;
  eo.fp8.enabled = l.fp8;
  eo.fp8.scaling = l.fp8_rowwise ? kernels::Fp8Scaling::rowwise : kernels::Fp8Scaling::tensorwise;
  eo.fp8.wgrad_bf16 = l.fp8_wgrad_bf16;
  eo.fp8.first_last_bf16 = l.fp8_first_last_bf16;
  eo.fp8.experts = l.fp8_experts;
  eo.adamw.warmup_steps = 1;
  eo.adamw.decay_steps = steps;
  {
    parallel::Engine<T> engine(world, cfg, eo);
    r.stage = engine.context().stage();
    engine.init_parameters(seed);
    train::TrainConfig tc;
    tc.micro_batch = l.micro_batch;
    tc.grad_accum = l.n_micro;
    tc.seq_len = seq_len;
    tc.steps = steps;
    tc.seed = seed;
    tc.eval_every = 0;
    tc.log_every = 0;
    tc.adamw = eo.adamw;
    train::TrainerT<T> tr(engine, tc, data, nullptr);
    for (int s = 0; s < steps; ++s) {
      MPI_Barrier(world);
      const auto met = tr.step(s, false);
      double t = met.step_seconds, slowest = 0;
      MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, world);
      r.step_seconds.push_back(slowest);
    }
    const model::GptT<T>& m = engine.model();
    r.peak_bytes = static_cast<double>(tracker.peak());
    r.activations = static_cast<double>(m.activation_bytes());
    r.model_buffers = static_cast<double>((m.params().span() + m.grads().span()) * sizeof(T));
    const auto by = tracker.live_by_label();
    auto sum_of = [&](std::initializer_list<const char*> prefixes) {
      double s = 0;
      for (const auto& [label, bytes] : by)
        for (const char* p : prefixes)
          if (label.rfind(p, 0) == 0) s += static_cast<double>(bytes);
      return s;
    };
    r.model_buffers += sum_of({"zero.shard_"});
    r.sync_buffers = sum_of({"zero.grad_bucket", "zero.param_gather", "zero.gather_"});
    r.optimizer = sum_of({"optim."});
  }
  return r;
}

}  // namespace

LayoutRun run_layout(MPI_Comm world, const model::GptConfig& cfg, int seq_len,
                     const plan::Layout& l, const io::TokenDataset& data, int steps,
                     std::uint64_t seed) {
  if (l.precision == plan::Precision::fp32)
    return run_typed<float>(world, cfg, seq_len, l, data, steps, seed);
#if MESHTRAIN_HAVE_BF16
  if (!kDeviceIsHost) {
    if (l.precision == plan::Precision::bf16)
      return run_typed<bf16>(world, cfg, seq_len, l, data, steps, seed);
    return run_typed<fp16>(world, cfg, seq_len, l, data, steps, seed);
  }
#endif
  throw ConfigError(cat("train.precision=", plan::precision_name(l.precision),
                        " needs a GPU build (Kokkos 4 with CUDA); the CPU build runs fp32"));
}

}  // namespace meshtrain::app
