// Layout invariance end to end (DESIGN invariant 1): the Trainer under a (dp, pp, tp) layout
// with ZeRO 0-3, offload, every pipeline schedule and sequence parallelism trains the same model
// as one rank with the same global batch: 10 steps of losses to 1e-5 relative, the gradient norm
// likewise, and the final parameters (gathered to rank 0) to Adam's rounding amplification.
// Every layout runs on the whole world; each rank also trains the single-rank reference.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kSteps = 10;  // global batch: 8 sequences

train::TrainConfig config(int micro_batch, int accum) {
  train::TrainConfig tc;
  tc.micro_batch = micro_batch;
  tc.grad_accum = accum;
  tc.seq_len = kSeq;
  tc.steps = kSteps;
  tc.seed = 5;
  tc.eval_every = 0;
  tc.log_every = 0;
  tc.adamw.lr = 1e-3f;
  tc.adamw.min_lr = 1e-4f;
  tc.adamw.warmup_steps = 2;
  tc.adamw.decay_steps = kSteps;
  tc.adamw.grad_clip = 0.5f;  // clipping active: the global norm must be right
  return tc;
}

struct Run {
  std::vector<float> loss, norm;
  std::vector<float> params;  // global flat buffer (tp = 1 registry), rank 0 only
};

Run reference(const std::string& data, const model::GptConfig& cfg) {
  io::TokenDataset ds(data, kSeq);
  const auto tc = config(kGlobal, 1);
  parallel::Engine<float> e(MPI_COMM_SELF, cfg, train::engine_options(tc));
  e.init_parameters(11);
  const model::Gpt& m = e.model();
  train::Trainer tr(e, tc, ds, nullptr);
  Run r;
  for (int s = 0; s < kSteps; ++s) {
    const auto met = tr.step(s, true);
    r.loss.push_back(met.loss);
    r.norm.push_back(met.grad_norm);
  }
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  r.params.assign(h.data(), h.data() + h.extent(0));
  return r;
}

struct Layout {
  int dp, pp, tp, zero, accum;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::one_f_one_b;
  int chunks = 1;
  bool sp = false, offload = false, recompute = false;
  std::string name() const {
    return cat("dp ", dp, " pp ", pp, " tp ", tp, " zero ", zero, " accum ", accum, " ",
               parallel::schedule_name(schedule), " v ", chunks, sp ? " sp" : "",
               offload ? " offload" : "", recompute ? " recompute" : "");
  }
};

Run run_layout(const Layout& l, const std::string& data, const model::GptConfig& cfg) {
  parallel::ParallelConfig pc;
  pc.shape = mesh::Shape{l.dp, l.pp, l.tp};
  pc.sequence_parallel = l.sp;
  pc.schedule = l.schedule;
  pc.virtual_chunks = l.chunks;
  pc.dp.zero_stage = l.zero;
  pc.dp.offload = l.offload;
  pc.dp.bucket_bytes = 4096;  // several buckets even for the tiny model
  const int micro = kGlobal / (l.dp * l.accum);
  REQUIRE(micro * l.dp * l.accum == kGlobal);
  io::TokenDataset ds(data, kSeq);
  const auto tc = config(micro, l.accum);
  parallel::Engine<float> e(mt_test::world(), cfg, train::engine_options(tc, pc, l.recompute));
  e.init_parameters(11);
  train::Trainer tr(e, tc, ds, nullptr);
  Run r;
  for (int s = 0; s < kSteps; ++s) {
    const auto met = tr.step(s, true);
    r.loss.push_back(met.loss);
    r.norm.push_back(met.grad_norm);
  }
  e.with_whole_model([&](const auto& whole) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
    r.params.assign(h.data(), h.data() + h.extent(0));
  });
  return r;
}

void check(const Layout& l, const Run& ref, const std::string& data,
           const model::GptConfig& cfg) {
  INFO(cfg.name << " layout " << l.name());
  const Run r = run_layout(l, data, cfg);
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  for (int s = 0; s < kSteps; ++s) {
    worst_loss = std::max(worst_loss, std::fabs(double(r.loss[s]) - ref.loss[s]) / ref.loss[s]);
    worst_norm = std::max(worst_norm, std::fabs(double(r.norm[s]) - ref.norm[s]) / ref.norm[s]);
  }
  if (mt_test::world_rank() == 0) {
    REQUIRE(r.params.size() == ref.params.size());
    for (std::size_t i = 0; i < r.params.size(); ++i)
      worst_param = std::max(worst_param, std::fabs(double(r.params[i]) - ref.params[i]));
  }
  INFO("worst relative loss " << worst_loss << ", norm " << worst_norm << ", parameter "
                              << worst_param << " absolute");
  REQUIRE(mt_test::all_ranks(worst_loss <= 1e-5));
  REQUIRE(mt_test::all_ranks(worst_norm <= 1e-4));
  REQUIRE(mt_test::all_ranks(worst_param <= 1e-4));
}

// The layouts of the matrix at this world size.
std::vector<Layout> matrix() {
  using K = parallel::ScheduleKind;
  const int W = mt_test::world_size();
  std::vector<Layout> layouts;
  if (W == 1) {
    layouts = {{1, 1, 1, 0, 2}, {1, 1, 1, 1, 2}, {1, 1, 1, 3, 1}, {1, 1, 1, 1, 2, K::one_f_one_b,
                                                                    1, false, true}};
  } else if (W == 2) {
    layouts = {{2, 1, 1, 0, 1}, {2, 1, 1, 1, 2}, {2, 1, 1, 2, 2}, {2, 1, 1, 3, 1},
               {2, 1, 1, 1, 1, K::one_f_one_b, 1, false, true},
               {1, 2, 1, 0, 4, K::gpipe}, {1, 2, 1, 1, 2, K::one_f_one_b},
               {1, 2, 1, 0, 4, K::interleaved, 2}, {1, 1, 2, 0, 2}, {1, 1, 2, 1, 1, K::one_f_one_b,
                                                                     1, true}};
  } else if (W == 4) {
    layouts = {{4, 1, 1, 0, 2}, {4, 1, 1, 2, 1}, {4, 1, 1, 3, 2},
               {2, 2, 1, 1, 2, K::one_f_one_b}, {2, 1, 2, 1, 2, K::one_f_one_b, 1, true},
               {1, 2, 2, 0, 4, K::gpipe, 1, true}, {1, 4, 1, 1, 4, K::one_f_one_b},
               {1, 2, 2, 1, 4, K::interleaved, 2, false, false, true}, {1, 1, 4, 0, 2},
               {2, 2, 1, 2, 2, K::gpipe}, {2, 2, 1, 3, 2, K::one_f_one_b}};
  } else if (W == 8) {
    layouts = {{8, 1, 1, 3, 1}, {8, 1, 1, 0, 1}, {2, 2, 2, 1, 2, K::one_f_one_b, 1, true},
               {2, 2, 2, 1, 4, K::interleaved, 2}, {1, 4, 2, 1, 8, K::one_f_one_b},
               {4, 2, 1, 1, 2, K::gpipe, 1, false, true}, {2, 1, 4, 2, 1, K::one_f_one_b, 1,
                                                             true}};
  }
  return layouts;
}

void check_matrix(const model::GptConfig& cfg, const std::string& prefix) {
  const std::string data = mt_test::layout_shard(prefix);
  const Run ref = reference(data, cfg);
  for (const auto& l : matrix()) check(l, ref, data, cfg);
}

}  // namespace

TEST_CASE("every layout trains the single-rank model", "[train][layout][mpi]") {
  check_matrix(mt_test::layout_tiny(), "test_layouts");
}

// tp 2 splits the 2 key-value heads, tp 4 and 8 replicate them (gradients summed over tp).
TEST_CASE("every layout trains the single-rank Llama model", "[train][layout][mpi][llama]") {
  check_matrix(mt_test::layout_tiny_llama(), "test_layouts_llama");
}
