// Checkpoint and restore across layouts (issue 8), on 8 ranks: 5 steps under (dp, pp, tp, ZeRO)
// = (2, 2, 2, 1) save a checkpoint; restores under (8, 1, 1, 3), (1, 1, 1, 0) (one rank, on a
// sub-communicator, both through a ParallelContext and without one), (2, 1, 4, 2) and
// (1, 4, 2, 1) each train 5 more steps, which must be the uninterrupted single-rank run's steps
// 6-10 to fp32 rounding (losses to 1e-5 relative; layout invariance itself is test_layouts').
// Dynamic loss scaling is on, with a short window, so the restored scaler state shows in the
// scale each step uses; the LR schedule and the data order continue through the step index.
// A second case saves with the optimizer state offloaded to the host under ZeRO-3 and restores
// with offload at ZeRO 0 and without offload at ZeRO 1.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kSteps = 10, kSaveAt = 5;
const std::string kDir = "test_resume_ckpt", kOffloadDir = "test_resume_ckpt_offload";

train::TrainConfig config(int micro_batch, int accum, const std::string& dir = kDir) {
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
  tc.adamw.grad_clip = 0.5f;
  tc.loss_scaling = true;  // exact powers of two: the losses do not change, the scale does
  tc.loss_scale_init = 1024.0f;
  tc.loss_scale_window = 2;
  tc.config_text = "[test]\nname = test_resume\n";
  tc.ckpt.dir = dir;
  return tc;
}

struct Losses {
  std::vector<float> loss, scale;
};

struct Layout {
  int dp, pp, tp, zero, accum;
  bool offload = false;
  std::string name() const {
    return cat("(dp, pp, tp, zero) = (", dp, ", ", pp, ", ", tp, ", ", zero, "), accum ", accum,
               offload ? ", offload" : "");
  }
};

// A trainer under a layout on `comm` (null layout: one rank).
struct Setup {
  std::unique_ptr<io::TokenDataset> data;
  std::unique_ptr<parallel::Engine<float>> engine;
  std::unique_ptr<train::Trainer> trainer;

  // The saved run initialises as the reference (seed 11); restored runs differently (the restore
  // must replace all of it).
  Setup(const Layout* l, MPI_Comm comm, const std::string& shard, std::uint64_t init_seed,
        const std::string& dir = kDir,
        const model::GptConfig& model_cfg = mt_test::layout_tiny()) {
    data = std::make_unique<io::TokenDataset>(shard, kSeq);
    if (!l) {
      const auto tc = config(kGlobal, 1, dir);
      engine = std::make_unique<parallel::Engine<float>>(MPI_COMM_SELF, model_cfg,
                                                         train::engine_options(tc));
      engine->init_parameters(init_seed);
      trainer = std::make_unique<train::Trainer>(*engine, tc, *data, nullptr);
      return;
    }
    parallel::ParallelConfig pc;
    pc.shape = mesh::Shape{l->dp, l->pp, l->tp};
    pc.dp.zero_stage = l->zero;
    pc.dp.offload = l->offload;
    pc.dp.bucket_bytes = 4096;  // several buckets, so ZeRO shards have several pieces
    const int micro = kGlobal / (l->dp * l->accum);
    REQUIRE(micro * l->dp * l->accum == kGlobal);
    const auto tc = config(micro, l->accum, dir);
    engine = std::make_unique<parallel::Engine<float>>(comm, model_cfg,
                                                       train::engine_options(tc, pc));
    engine->init_parameters(init_seed);
    trainer = std::make_unique<train::Trainer>(*engine, tc, *data, nullptr);
  }
  ~Setup() {
    trainer.reset();
    engine.reset();
  }

  Losses steps(std::int64_t from, std::int64_t to) {
    Losses r;
    for (std::int64_t s = from; s < to; ++s) {
      const auto m = trainer->step(s, true);
      r.loss.push_back(m.loss);
      r.scale.push_back(m.loss_scale);
    }
    return r;
  }
};

// Steps [from, to) of `got` against the reference's.
void compare(const Losses& got, const Losses& ref, int from, const std::string& what) {
  INFO(what);
  double worst = 0;
  bool scales = true;
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    const std::size_t s = from + i;
    worst = std::max(worst, std::fabs(double(got.loss[i]) - ref.loss[s]) / ref.loss[s]);
    scales = scales && got.scale[i] == ref.scale[s];
    INFO("step " << s + 1 << ": loss " << got.loss[i] << " vs " << ref.loss[s] << ", scale "
                 << got.scale[i] << " vs " << ref.scale[s]);
    CHECK(std::fabs(double(got.loss[i]) - ref.loss[s]) <= 1e-5 * ref.loss[s]);
  }
  INFO("worst relative loss difference " << worst);
  REQUIRE(got.loss.size() == std::size_t(kSteps - from));
  REQUIRE(scales);
  REQUIRE(worst <= 1e-5);
}

}  // namespace

TEST_CASE("a checkpoint of (2,2,2,1) continues under any layout", "[train][checkpoint][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_resume needs 8 ranks");
    return;
  }
  const std::string shard = mt_test::layout_shard("test_resume");
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(kDir);
  MPI_Barrier(mt_test::world());

  // The uninterrupted run (every rank computes it; the tiny model takes milliseconds).
  Losses ref;
  {
    Setup one(nullptr, MPI_COMM_SELF, shard, 11);
    ref = one.steps(0, kSteps);
  }
  REQUIRE(ref.scale.front() != ref.scale.back());  // the window is short enough to double S

  // 5 steps under (2, 2, 2, 1), then the checkpoint.
  {
    const Layout save{2, 2, 2, 1, 2};
    Setup s(&save, mt_test::world(), shard, 11);
    const Losses first = s.steps(0, kSaveAt);
    for (int i = 0; i < kSaveAt; ++i)
      REQUIRE(std::fabs(double(first.loss[i]) - ref.loss[i]) <= 1e-5 * ref.loss[i]);
    const std::string path = s.trainer->save_checkpoint(kSaveAt);
    REQUIRE(path == kDir + "/step_00000005.h5");
  }

  const Layout layouts[] = {{8, 1, 1, 3, 1}, {2, 1, 4, 2, 2}, {1, 4, 2, 1, 4}};
  for (const Layout& l : layouts) {
    Setup s(&l, mt_test::world(), shard, 12345);
    const io::CheckpointAttributes a = s.trainer->restore("latest");
    REQUIRE(a.step == kSaveAt);
    REQUIRE(s.trainer->start_step() == kSaveAt);
    REQUIRE(a.layout.dp == 2);
    REQUIRE(a.layout.pp == 2);
    REQUIRE(a.layout.tp == 2);
    REQUIRE(a.layout.zero == 1);
    REQUIRE(a.tokens_seen == std::int64_t(kSaveAt) * kGlobal * kSeq);
    REQUIRE(a.config_text == config(1, 1).config_text);
    compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "restored under " + l.name());
  }

  // One rank: rank 0 alone on a sub-communicator (the others wait), with and without a context.
  MPI_Comm one;
  MPI_Comm_split(mt_test::world(), mt_test::world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &one);
  if (mt_test::world_rank() == 0) {
    const Layout single{1, 1, 1, 0, 1};
    {
      Setup s(&single, one, shard, 12345);
      s.trainer->restore(kDir);  // the folder: its `latest`
      compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "restored under " + single.name());
    }
    {
      Setup s(nullptr, MPI_COMM_SELF, shard, 12345);
      s.trainer->restore(kDir + "/step_00000005.h5");
      compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "restored on one rank without a context");
    }
    MPI_Comm_free(&one);
  }
  MPI_Barrier(mt_test::world());
}

// A Llama checkpoint (untied head, 2 kv heads) saved under tp 2, where the kv heads are split,
// continues under tp 4, where they are replicated, under pp 4 and under ZeRO-3 on 8 dp ranks;
// a GPT-2 configuration cannot restore it.
TEST_CASE("a Llama checkpoint continues under any layout", "[train][checkpoint][mpi][llama]") {
  if (mt_test::world_size() != 8) {
    WARN("test_resume needs 8 ranks");
    return;
  }
  const std::string dir = kDir + "_llama";
  const auto cfg = mt_test::layout_tiny_llama();
  const std::string shard = mt_test::layout_shard("test_resume_llama");
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(mt_test::world());
  Losses ref;
  {
    Setup one(nullptr, MPI_COMM_SELF, shard, 11, dir, cfg);
    ref = one.steps(0, kSteps);
  }
  {
    const Layout save{2, 2, 2, 1, 2};
    Setup s(&save, mt_test::world(), shard, 11, dir, cfg);
    s.steps(0, kSaveAt);
    s.trainer->save_checkpoint(kSaveAt);
  }
  const Layout layouts[] = {{2, 1, 4, 2, 2}, {8, 1, 1, 3, 1}, {1, 4, 2, 1, 4}};
  for (const Layout& l : layouts) {
    Setup s(&l, mt_test::world(), shard, 12345, dir, cfg);
    REQUIRE(s.trainer->restore("latest").model.key() == cfg.key());
    compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "Llama restored under " + l.name());
  }
  const Layout gpt2{8, 1, 1, 0, 1};
  Setup s(&gpt2, mt_test::world(), shard, 12345, dir);
  REQUIRE_THROWS_WITH(s.trainer->restore("latest"),
                      mt_test::contains("was saved with model.family=llama"));
}

// The optimizer state in host memory (offload): its fp32 master is what the model group saves,
// and a restore fills it, with and without ZeRO-3, from a run with or without offload.
TEST_CASE("offloaded optimizer state saves and restores", "[train][checkpoint][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_resume needs 8 ranks");
    return;
  }
  const std::string shard = mt_test::layout_shard("test_resume");
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(kOffloadDir);
  MPI_Barrier(mt_test::world());
  Losses ref;
  {
    Setup one(nullptr, MPI_COMM_SELF, shard, 11, kOffloadDir);
    ref = one.steps(0, kSteps);
  }
  {
    const Layout save{2, 2, 2, 3, 2, true};
    Setup s(&save, mt_test::world(), shard, 11, kOffloadDir);
    const Losses first = s.steps(0, kSaveAt);
    for (int i = 0; i < kSaveAt; ++i)
      REQUIRE(std::fabs(double(first.loss[i]) - ref.loss[i]) <= 1e-5 * ref.loss[i]);
    s.trainer->save_checkpoint(kSaveAt);
  }
  const Layout layouts[] = {{4, 2, 1, 0, 1, true}, {8, 1, 1, 1, 1, false}};
  for (const Layout& l : layouts) {
    Setup s(&l, mt_test::world(), shard, 12345, kOffloadDir);
    REQUIRE(s.trainer->restore("latest").layout.zero == 3);
    compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "restored under " + l.name());
  }
}
