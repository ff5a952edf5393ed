// Context parallelism end to end (issue 34): the Trainer with each sequence split over mesh.cp
// ranks (ring attention, or the all-gather form), alone and combined with tp (and sequence
// parallelism), pp (1F1B, GPipe, interleaved), dp with ZeRO 1 and 3, recompute, and for an MoE
// model ep with the global balancing statistics, trains the single-rank model: 10 steps of
// losses to 1e-5 relative, gradient norms to 1e-4, final parameters to 1e-4 absolute — the
// layout tests' tolerances — for GPT-2 (learned positions) and Llama (rotary, grouped kv
// heads). A checkpoint saved at cp 2 continues at cp 1 and at cp 4 (and one saved at cp 4 at
// cp 2) as the uninterrupted run.
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "harness.hpp"
#include "moe_fixture.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kSteps = 10, kSaveAt = 5;

train::TrainConfig config(int micro_batch, int accum, const std::string& dir = "") {
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
  tc.config_text = "[test]\nname = test_cp_layouts\n";
  tc.ckpt.dir = dir;
  return tc;
}

struct Layout {
  int dp, cp, pp, tp, zero, accum;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::one_f_one_b;
  int chunks = 1;
  bool sp = false, recompute = false;
  model::CpComm how = model::CpComm::ring;
  int ep = 1;
  std::string name() const {
    return cat("dp ", dp, " cp ", cp, " (", model::cp_comm_name(how), ") pp ", pp, " tp ", tp,
               " ep ", ep, " zero ", zero, " accum ", accum, " ",
               parallel::schedule_name(schedule), " v ", chunks, sp ? " sp" : "",
               recompute ? " recompute" : "");
  }
};

struct Run {
  std::vector<float> loss, norm;
  std::vector<float> params;  // rank 0: the whole model
};

struct Setup {
  std::unique_ptr<io::TokenDataset> data;
  std::unique_ptr<parallel::Engine<float>> engine;
  std::unique_ptr<train::Trainer> trainer;
  Setup(const Layout& l, MPI_Comm comm, const std::string& shard, const model::GptConfig& cfg,
        std::uint64_t init_seed, const std::string& dir = "") {
    parallel::ParallelConfig pc;
    pc.shape = mesh::Shape{l.dp, l.pp, l.tp};
    pc.shape.cp = l.cp;
    pc.shape.ep = l.ep;
    pc.cp_comm = l.how;
    pc.sequence_parallel = l.sp;
    pc.schedule = l.schedule;
    pc.virtual_chunks = l.chunks;
    pc.dp.zero_stage = l.zero;
    pc.dp.bucket_bytes = 4096;  // several buckets even for the tiny model
    const int micro = kGlobal / (l.dp * l.accum);
    REQUIRE(micro * l.dp * l.accum == kGlobal);
    const auto tc = config(micro, l.accum, dir);
    data = std::make_unique<io::TokenDataset>(shard, kSeq);
    engine = std::make_unique<parallel::Engine<float>>(comm, cfg,
                                                       train::engine_options(tc, pc, l.recompute));
    engine->init_parameters(init_seed);
    // Each rank holds its two chunks of every sequence: kSeq / cp rows at their positions.
    REQUIRE(engine->model().seq_len() == kSeq / l.cp);
    REQUIRE(engine->model().layout().positions.size() == (l.cp > 1 ? std::size_t(kSeq / l.cp) : 0));
    trainer = std::make_unique<train::Trainer>(*engine, tc, *data, nullptr);
  }
  ~Setup() {
    trainer.reset();
    engine.reset();
  }
  void steps(Run& r, int from, int to) {
    for (int s = from; s < to; ++s) {
      const auto m = trainer->step(s, true);
      r.loss.push_back(m.loss);
      r.norm.push_back(m.grad_norm);
    }
  }
  void params(Run& r) {
    engine->with_whole_model([&](const auto& whole) {
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
      r.params.assign(h.data(), h.data() + h.extent(0));
    });
  }
};

Run reference(const std::string& shard, const model::GptConfig& cfg, int accum) {
  Setup s(Layout{1, 1, 1, 1, 0, accum}, MPI_COMM_SELF, shard, cfg, 11);
  Run r;
  s.steps(r, 0, kSteps);
  s.params(r);
  return r;
}

void compare(const Run& r, const Run& ref, int from, const std::string& what) {
  INFO(what);
  double worst_loss = 0, worst_norm = 0, worst_param = 0;
  REQUIRE(r.loss.size() == std::size_t(kSteps - from));
  for (std::size_t i = 0; i < r.loss.size(); ++i) {
    const std::size_t s = from + i;
    worst_loss = std::max(worst_loss, std::fabs(double(r.loss[i]) - ref.loss[s]) / ref.loss[s]);
    worst_norm = std::max(worst_norm, std::fabs(double(r.norm[i]) - ref.norm[s]) / ref.norm[s]);
  }
  if (mt_test::world_rank() == 0 && !r.params.empty()) {
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

void check(const Layout& l, const Run& ref, const std::string& shard,
           const model::GptConfig& cfg) {
  Setup s(l, mt_test::world(), shard, cfg, 11);
  Run r;
  s.steps(r, 0, kSteps);
  s.params(r);
  compare(r, ref, 0, cfg.name + " layout " + l.name());
}

// {dp, cp, pp, tp, zero, accum, schedule, chunks, sp, recompute, how} at this world size.
std::vector<Layout> matrix() {
  using K = parallel::ScheduleKind;
  const auto AG = model::CpComm::all_gather;
  const auto R = model::CpComm::ring;
  switch (mt_test::world_size()) {
    case 2: return {{1, 2, 1, 1, 0, 2}, {1, 2, 1, 1, 1, 2, K::one_f_one_b, 1, false, true},
                    {1, 2, 1, 1, 0, 2, K::one_f_one_b, 1, false, false, AG}};
    case 4: return {{1, 4, 1, 1, 0, 2}, {1, 4, 1, 1, 1, 1, K::one_f_one_b, 1, false, false, AG},
                    {1, 2, 1, 2, 0, 2, K::one_f_one_b, 1, true}, {1, 2, 2, 1, 1, 4, K::gpipe},
                    {2, 2, 1, 1, 3, 2}, {1, 2, 2, 1, 0, 2, K::one_f_one_b, 1, false, false, R}};
    case 8: return {{2, 2, 2, 1, 1, 2, K::one_f_one_b}, {2, 2, 1, 2, 1, 1, K::one_f_one_b, 1, true},
                    {1, 4, 2, 1, 0, 4, K::interleaved, 2}, {1, 2, 2, 2, 3, 2, K::one_f_one_b, 1,
                                                            true, true}};
    default: return {};
  }
}

}  // namespace

TEST_CASE("context parallelism trains the single-rank GPT-2 model", "[train][layout][cp][mpi]") {
  const std::string shard = mt_test::layout_shard("test_cp_layouts");
  const model::GptConfig cfg = mt_test::layout_tiny();
  const Run ref = reference(shard, cfg, kGlobal);
  for (const Layout& l : matrix()) check(l, ref, shard, cfg);
}

TEST_CASE("context parallelism trains the single-rank Llama model", "[train][layout][cp][mpi][llama]") {
  const std::string shard = mt_test::layout_shard("test_cp_layouts_llama");
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  const Run ref = reference(shard, cfg, kGlobal);
  for (const Layout& l : matrix()) check(l, ref, shard, cfg);
}

TEST_CASE("context parallelism with expert parallelism trains the single-rank MoE model",
          "[train][layout][cp][moe][mpi]") {
  if (mt_test::world_size() != 4 && mt_test::world_size() != 8) return;
  model::GptConfig cfg = mt_test::moe_tiny();
  cfg.moe.aux_loss_scope = "global";  // the balancing statistics over dp x cp
  const std::string shard = mt_test::layout_shard("test_cp_layouts_moe");
  const Run ref = reference(shard, cfg, 2);  // 2 micro-batches: the global micro-batch of 4
  Layout l{2, 2, 1, 1, 1, 2};
  l.ep = 2;
  if (mt_test::world_size() == 8) l = Layout{2, 2, 2, 1, 0, 2};
  if (mt_test::world_size() == 8) l.ep = 2;
  check(l, ref, shard, cfg);
}

TEST_CASE("a checkpoint continues across context-parallel sizes", "[train][checkpoint][cp][mpi]") {
  if (mt_test::world_size() != 4) return;
  const std::string shard = mt_test::layout_shard("test_cp_resume");
  const model::GptConfig cfg = mt_test::layout_tiny_llama();
  const std::string dir = "test_cp_resume_ckpt";
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(mt_test::world());
  const Run ref = reference(shard, cfg, kGlobal);
  // Saved at cp 2 (x dp 2, ZeRO-1) after 5 steps; restored at cp 4 and at cp 1 (dp 4, ZeRO-3).
  {
    Setup s(Layout{2, 2, 1, 1, 1, 2}, mt_test::world(), shard, cfg, 11, dir);
    Run first;
    s.steps(first, 0, kSaveAt);
    REQUIRE(s.trainer->save_checkpoint(kSaveAt) == dir + "/step_00000005.h5");
  }
  for (const Layout& l : {Layout{1, 4, 1, 1, 0, 2}, Layout{4, 1, 1, 1, 3, 1}}) {
    Setup s(l, mt_test::world(), shard, cfg, 12345, dir);
    const io::CheckpointAttributes a = s.trainer->restore(dir + "/step_00000005.h5");
    REQUIRE(a.layout.cp == 2);
    Run r;
    s.steps(r, kSaveAt, kSteps);
    compare(r, ref, kSaveAt, "saved at cp 2, restored under " + l.name());
  }
}
