// 3D parallelism with ZeRO: (dp, pp, tp) = (W/2, 2, 1) on 2 and 4 ranks and (2, 2, 2) on 8, the
// 1F1B pipeline runner driving the model whose layer hooks are GradSync; ZeRO 0-3 (ZeRO-1 also
// with offload); the tied wte summed over the embedding group. 10 steps of losses and the final parameters (each rank's tp slice of its
// stage, the last stage's tied wte copy included) equal the single-rank run on the whole global
// batch.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "meshtrain/io/dataset.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/mesh/process_mesh.hpp"
#include "meshtrain/parallel/pipeline_runner.hpp"
#include "meshtrain/parallel/zero_optimizer.hpp"
#include "zero_test_util.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

constexpr int kB = 2, kT = 16, kSteps = 10, kMicro = 3;
constexpr std::uint64_t kSeed = 5, kInit = 7;

model::GptConfig tiny() { return zt::config(4, 32, 60, 16); }

optim::AdamWConfig adamw() {
  optim::AdamWConfig c;
  c.lr = 1e-3f;
  c.min_lr = 1e-4f;
  c.warmup_steps = 2;
  c.decay_steps = kSteps;
  c.grad_clip = 1.0f;  // the norm sums over dp (ZeRO-1), tp and pp
  return c;
}

std::string make_data() { return zt::recurrence_shard("test_dp_pipeline", 7, 3, 5, 5); }

struct Batch {
  View1<std::int32_t> in = alloc<std::int32_t>("test.in", kB * kT);
  View1<std::int32_t> tg = alloc<std::int32_t>("test.tg", kB * kT);
  void fill(const io::TokenDataset& ds, int step, int global, int first) {
    auto hi = Kokkos::create_mirror_view(in), ht = Kokkos::create_mirror_view(tg);
    ds.fill(kSeed, step, global, first, kB, hi.data(), ht.data());
    Kokkos::deep_copy(in, hi);
    Kokkos::deep_copy(tg, ht);
  }
};

struct Reference {
  std::vector<float> losses, params;
};

Reference reference(const io::TokenDataset& ds, int global) {
  model::Gpt m(tiny(), kB, kT);
  m.init_parameters(kInit);
  optim::AdamW opt(m.registry().decay_ranges(), m.registry().size(), adamw());
  const float scale = 1.0f / static_cast<float>(global * kT);
  Batch b;
  Reference r;
  for (int s = 0; s < kSteps; ++s) {
    m.zero_grads();
    m.reset_loss_sum();
    for (int first = 0; first < global; first += kB) {
      b.fill(ds, s, global, first);
      m.forward_train(b.in, b.tg, scale);
      m.backward();
    }
    opt.step(m.params(), m.grads(), s);
    float loss = 0;
    Kokkos::deep_copy(loss, m.loss_sum());
    r.losses.push_back(loss * scale);
  }
  r.params = zt::to_host(m.params());
  return r;
}

}  // namespace

TEST_CASE("dp x pp x tp with ZeRO 0-3 equals the single-rank run", "[parallel][zero][mpi][pp]") {
  const int W = mt_test::world_size();
  if (W < 2 || W % 2) return;
  const int pp = 2, tp = W == 8 ? 2 : 1, dpn = W / (pp * tp);
  mesh::ProcessMesh pm(mt_test::world(), mesh::Shape{dpn, pp, tp});
  auto be = comm::default_backend();
  auto dpc = comm::make_communicator(be, pm.dp().get());
  auto ppc = comm::make_communicator(be, pm.pp().get());
  auto tpc = comm::make_communicator(be, pm.tp().get());
  auto mpc = comm::make_communicator(be, pm.model_parallel().get());
  std::unique_ptr<comm::Communicator> emb;
  if (pm.embedding().get() != MPI_COMM_NULL) emb = comm::make_communicator(be, pm.embedding().get());
  const int stage = pm.coord().pp, dp_rank = pm.coord().dp;
  const std::string data = make_data();
  io::TokenDataset ds(data, kT);
  const int global = dpn * kMicro * kB;
  const Reference ref = reference(ds, global);
  const model::ParameterRegistry ref_reg(tiny(), 0, 1, 0, 0, tiny().n_layer, true, true);
  const ScheduleSpec spec{ScheduleKind::one_f_one_b, pp, kMicro, 1};
  const auto pieces = partition(spec, tiny(), kT);
  const float scale = 1.0f / static_cast<float>(global * kT);
  struct Config {
    int zero;
    bool offload;
  };
  for (const Config c : {Config{0, false}, Config{1, false}, Config{1, true}, Config{2, false},
                         Config{3, false}, Config{3, true}}) {
    INFO("(dp, pp, tp) = (" << dpn << ", " << pp << ", " << tp << "), ZeRO-" << c.zero
                            << (c.offload ? " offload" : "") << ", stage " << stage);
    model::ModelLayout base;
    base.tp = tpc.get();
    const model::ModelLayout layout = pipeline_layout(spec, pieces, stage, base);
    model::ModelLayout sharded = layout;
    sharded.allocate_params = c.zero < 3;
    sharded.allocate_grads = c.zero < 2;
    model::Gpt m(tiny(), kB, kT, sharded);
    DpOptions opt;
    opt.zero_stage = c.zero;
    opt.offload = c.offload;
    opt.bucket_bytes = 16384;
    GradSync<float> sync(model_buffers(m), *dpc, opt);
    m.set_hooks(&sync);
    {
      model::Gpt init(tiny(), kB, kT, layout);  // ZeRO-3 keeps this rank's pieces of it
      init.init_parameters(kInit);
      sync.scatter_params(init.params());
    }
    sync.set_micro_batches(kMicro);
    sync.set_embedding_group(emb.get());
    ZeroOptimizer<float> zo(sync, adamw(), mpc.get());
    zo.init_master();
    PipelineRunner<float> runner(m, *ppc, spec, stage);
    std::vector<Batch> batches(kMicro);
    Scalar<float> loss("test.loss");
    double worst_loss = 0;
    for (int s = 0; s < kSteps; ++s) {
      for (int k = 0; k < kMicro; ++k) batches[k].fill(ds, s, global, (dp_rank * kMicro + k) * kB);
      sync.begin_step();
      m.reset_loss_sum();
      runner.step([&](int k) { return MicroBatch{batches[k].in, batches[k].tg}; }, scale);
      sync.finish();
      zo.step(s);
      Kokkos::deep_copy(loss, m.loss_sum());
      dpc->all_reduce(loss);  // the last stage holds the loss
      float l = 0;
      Kokkos::deep_copy(l, loss);
      if (stage == pp - 1)
        worst_loss = std::max(worst_loss, std::fabs(double(l) * scale - ref.losses[s]) /
                                              std::fabs(double(ref.losses[s])));
    }
    auto full = zeros<float>("test.full", m.registry().size());
    sync.gather_params(full);
    const auto got = zt::to_host(full);
    double d2 = 0, b2 = 0, mx = 0;
    for (const auto& p : m.registry().params()) {
      const auto& r = ref_reg.get(p.name);
      for (std::size_t i = 0; i < p.numel; ++i) {
        const auto g = p.global_index(static_cast<std::int64_t>(i), m.tp_rank(), m.tp_size());
        const double want = ref.params[r.offset + g], d = got[p.offset + i] - want;
        d2 += d * d;
        b2 += want * want;
        mx = std::max(mx, std::fabs(d));
      }
    }
    const double rel = std::sqrt(d2 / b2);
    if (mt_test::world_rank() == 0 || mt_test::world_rank() == W - 1)
      std::printf("(%d, %d, %d) ZeRO-%d%s stage %d: worst loss rel %.1e, params rel %.1e max abs "
                  "%.1e\n", dpn, pp, tp, c.zero, c.offload ? " offload" : "", stage, worst_loss,
                  rel, mx);
    REQUIRE(mt_test::all_ranks(worst_loss <= 1e-5));
    REQUIRE(mt_test::all_ranks(rel <= 1e-5 && mx <= 1e-5));
  }
  std::filesystem::remove_all("test_dp_pipeline_" + std::to_string(mt_test::world_rank()));
}
