// Training on a blend (issue 38) under layouts: the losses and the tokens each source supplied
// equal one rank's at dp 1, 2 and 4 (with gradient accumulation too); a checkpoint restored
// under another layout continues with the same data and counts; a restore under other weights
// continues each source after what it had supplied; each source's validation loss is that
// source's alone, and the blend's is their weighted mean.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/io/blend.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kSteps = 6, kSaveAt = 3;
const std::string kDir = "test_blend_train_ckpt";

// Two sources of different text (each rank writes its own copy), with validation shards.
struct Sources {
  std::string dir = "test_blend_train_data_" + std::to_string(mt_test::world_rank());
  std::vector<std::unique_ptr<io::TokenDataset>> train, val;
  Sources() {
    std::filesystem::create_directories(dir);
    for (int s = 0; s < 2; ++s) {
      std::vector<std::uint16_t> t;
      std::uint32_t x = 17 + 31 * s;
      for (int i = 0; i < 3000; ++i) {
        x = x * 1664525u + 1013904223u;
        t.push_back(static_cast<std::uint16_t>(((i % (11 + 6 * s)) * (5 + s) + ((x >> 20) % 3)) % 61));
      }
      const std::string p = dir + "/s" + std::to_string(s);
      io::write_shard(p + "_train_000000.bin", std::vector<std::uint16_t>(t.begin(), t.begin() + 2400));
      io::write_shard(p + "_val_000000.bin", std::vector<std::uint16_t>(t.begin() + 2400, t.end()));
      train.push_back(std::make_unique<io::TokenDataset>(p + "_train_000000.bin", kSeq));
      val.push_back(std::make_unique<io::TokenDataset>(p + "_val_000000.bin", kSeq));
    }
  }
  ~Sources() { std::filesystem::remove_all(dir); }
  io::BlendedDataset blend(double w0 = 0.7, double w1 = 0.3) const {
    return io::BlendedDataset({{"s0", w0, train[0].get(), val[0].get()},
                               {"s1", w1, train[1].get(), val[1].get()}},
                              true);
  }
};

train::TrainConfig config(int micro_batch, int accum) {
  train::TrainConfig tc;
  tc.micro_batch = micro_batch;
  tc.grad_accum = accum;
  tc.seq_len = kSeq;
  tc.steps = kSteps;
  tc.seed = 5;
  tc.eval_every = 0;
  tc.eval_batches = 2;
  tc.log_every = 0;
  tc.adamw.lr = 1e-3f;
  tc.adamw.warmup_steps = 2;
  tc.adamw.decay_steps = kSteps;
  tc.ckpt.dir = kDir;
  return tc;
}

struct Run {
  std::vector<float> loss;
  std::vector<std::vector<std::uint64_t>> tokens;  // per step, per source
};

struct Setup {
  std::unique_ptr<parallel::Engine<float>> engine;
  std::unique_ptr<train::Trainer> trainer;
  // dp = the communicator's size; the global batch split into `accum` micro-batches per rank.
  Setup(MPI_Comm comm, int accum, const io::BlendedDataset& data, std::uint64_t init_seed = 11) {
    int dp = 1;
    MPI_Comm_size(comm, &dp);
    parallel::ParallelConfig pc;
    pc.shape = mesh::Shape{dp, 1, 1};
    const int micro = kGlobal / (dp * accum);
    REQUIRE(micro * dp * accum == kGlobal);
    const auto tc = config(micro, accum);
    engine = std::make_unique<parallel::Engine<float>>(comm, mt_test::layout_tiny(),
                                                       train::engine_options(tc, pc));
    engine->init_parameters(init_seed);
    trainer = std::make_unique<train::Trainer>(*engine, tc, data);
  }
  ~Setup() {
    trainer.reset();
    engine.reset();
  }
  Run steps(std::int64_t from, std::int64_t to) {
    Run r;
    for (std::int64_t s = from; s < to; ++s) {
      const auto m = trainer->step(s, true);
      r.loss.push_back(m.loss);
      r.tokens.push_back(m.source_tokens);
    }
    return r;
  }
};

void compare(const Run& got, const Run& ref, int from, const std::string& what) {
  INFO(what);
  REQUIRE(got.loss.size() == ref.loss.size() - static_cast<std::size_t>(from));
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    const std::size_t s = from + i;
    INFO("step " << s + 1 << ": loss " << got.loss[i] << " vs " << ref.loss[s]);
    CHECK(std::fabs(double(got.loss[i]) - ref.loss[s]) <= 1e-5 * ref.loss[s]);
    CHECK(got.tokens[i] == ref.tokens[s]);
  }
}

}  // namespace

TEST_CASE("a blend trains alike under dp 1, 2, 4 and after a restore elsewhere", "[train][blend][mpi]") {
  const Sources src;
  const io::BlendedDataset data = src.blend();
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(kDir);
  MPI_Barrier(mt_test::world());
  Run ref;
  {
    Setup one(MPI_COMM_SELF, 1, data);
    ref = one.steps(0, kSteps);
  }
  // The tokens of each source add up to the steps' tokens, in the blend's proportions.
  REQUIRE(ref.tokens.back().size() == 2);
  CHECK(ref.tokens.back()[0] + ref.tokens.back()[1] == std::uint64_t(kSteps) * kGlobal * kSeq);
  CHECK(ref.tokens.back()[0] == data.schedule().count_before(0, kSteps * kGlobal) * kSeq);
  CHECK(std::abs(double(ref.tokens.back()[0]) / kSeq - 0.7 * kSteps * kGlobal) <= 1.0);
  const int world = mt_test::world_size();
  for (int accum : {1, 2}) {
    if (kGlobal % (world * accum) != 0) continue;
    Setup s(mt_test::world(), accum, data);
    compare(s.steps(0, kSteps), ref, 0, cat("dp ", world, " accum ", accum));
  }
  // Saved at dp = world after 3 steps; restored at dp = world with accumulation, and on rank 0
  // alone: the uninterrupted run's steps 4-6, the same tokens per source.
  {
    Setup s(mt_test::world(), 1, data);
    s.steps(0, kSaveAt);
    s.trainer->save_checkpoint(kSaveAt);
  }
  if (kGlobal % (world * 2) == 0) {
    Setup s(mt_test::world(), 2, data, 999);
    s.trainer->restore("latest");
    compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, cat("restored at dp ", world, " accum 2"));
  }
  if (mt_test::world_rank() == 0) {
    Setup s(MPI_COMM_SELF, 1, data, 999);
    const io::CheckpointAttributes a = s.trainer->restore("latest");
    REQUIRE(a.extra.count("data.sources") == 1);
    INFO(a.extra.at("data.sources"));
    CHECK(a.extra.at("data.sources").find("\"name\": \"s0\"") != std::string::npos);
    compare(s.steps(kSaveAt, kSteps), ref, kSaveAt, "restored on one rank");
  }
  MPI_Barrier(mt_test::world());
}

TEST_CASE("a restore under other weights continues each source", "[train][blend][mpi]") {
  const Sources src;
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(kDir);
  MPI_Barrier(mt_test::world());
  std::vector<std::uint64_t> saved;
  {
    Setup s(mt_test::world(), 1, src.blend());
    saved = s.steps(0, kSaveAt).tokens.back();
    s.trainer->save_checkpoint(kSaveAt);
  }
  const io::BlendedDataset other = src.blend(0.25, 0.75);
  Setup s(mt_test::world(), 1, other, 999);
  s.trainer->restore("latest");
  const Run after = s.steps(kSaveAt, kSteps);
  // Each step adds the new blend's share of batch 3, 4, 5 to the checkpoint's counts.
  for (std::size_t i = 0; i < after.tokens.size(); ++i)
    for (int k = 0; k < 2; ++k) {
      const auto& sch = other.schedule();
      const std::uint64_t added =
          sch.count_before(k, (kSaveAt + i + 1) * kGlobal) - sch.count_before(k, kSaveAt * kGlobal);
      CHECK(after.tokens[i][static_cast<std::size_t>(k)] ==
            saved[static_cast<std::size_t>(k)] + added * kSeq);
    }
  MPI_Barrier(mt_test::world());
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(kDir);
}

TEST_CASE("each source is validated on its own shards", "[train][blend][mpi]") {
  const Sources src;
  Setup s(mt_test::world(), 1, src.blend());
  s.steps(0, 2);
  const train::EvalLosses e = s.trainer->evaluate_sources();
  REQUIRE(e.by_source.size() == 2);
  auto tc = config(s.engine->micro_batch(), 1);
  for (int k = 0; k < 2; ++k) {
    // The same engine, trained on one source alone: its validation loss is this source's.
    train::Trainer alone(*s.engine, tc, *src.train[static_cast<std::size_t>(k)],
                         src.val[static_cast<std::size_t>(k)].get());
    CHECK(alone.evaluate() == e.by_source[static_cast<std::size_t>(k)]);
  }
  CHECK(e.by_source[0] != e.by_source[1]);
  CHECK(e.loss == mt_test::Approx(0.7 * e.by_source[0] + 0.3 * e.by_source[1]).epsilon(1e-6));
  CHECK(s.trainer->evaluate() == e.loss);
}
