// MoE checkpoints across expert-parallel layouts (issue 20, phase 2), on 8 ranks: each expert is
// its own global dataset (<block>mlp.experts.<e>.w_in / w_out), written by the ranks holding it
// (at ZeRO-0 split over the expert-data-parallel group, at ZeRO >= 1 by the shard pieces) and
// read by name by whichever rank holds it in the new layout. 5 steps under (dp, ep, pp, tp, ZeRO)
// = (4, 4, 2, 1, 0) save; restores under ep = 2 with (2, 2, 2, 2, 1), ep = 1 with (8, 1, 1, 1, 3)
// and on one rank continue as the uninterrupted single-rank run's steps 6-10 (losses to 1e-5
// relative, aux and z losses likewise). A second save under (8, 4, 1, 1, 2) (the ZeRO shard
// pieces of the experts) restores under (4, 2, 2, 1, 0). The model: moe_fixture.hpp's GPT-2
// blocks with GELU experts and a shared expert (test_moe_layouts covers the Llama experts'
// layouts; their checkpoint names are the same per expert). Every restore also holds exactly the
// parameters the saving run had at step 5 (gathered to rank 0). The sigmoid router's expert
// biases (moe.expert_bias) saved under (4, 4, 2, 1, 0) continue under (4, 2, 1, 2, 1) and on one
// rank.
//
// bf16 (the CUDA build): the same saves and restores of a bf16 run (top_k = E, so that no top-k
// choice can flip: test_moe_layouts) on 2 or 8 ranks. The checkpoint holds the fp32 master
// weights and Adam state, so a restore holds exactly the saving run's parameters; the
// continuation equals the single-rank bf16 run to 16-bit tolerances (losses 1e-2, aux and z
// 2e-2: the layouts round differently).
#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "moe_fixture.hpp"
#include "meshtrain/io/checkpoint.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kSteps = 10, kSaveAt = 5;

train::TrainConfig config(int accum, const std::string& dir) {
  train::TrainConfig tc;
  tc.micro_batch = 1;
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
  tc.config_text = "[test]\nname = test_moe_resume\n";
  tc.ckpt.dir = dir;
  return tc;
}

struct Losses {
  std::vector<float> loss;
  std::vector<double> aux, z;
};

struct Layout {
  int dp, ep, pp, tp, zero;
  std::string name() const {
    return cat("(dp, ep, pp, tp, zero) = (", dp, ", ", ep, ", ", pp, ", ", tp, ", ", zero, ")");
  }
};

template <class T>
struct Setup {
  std::unique_ptr<io::TokenDataset> data;
  std::unique_ptr<parallel::Engine<T>> engine;
  std::unique_ptr<train::TrainerT<T>> trainer;

  // l null: one rank, no context.
  Setup(const Layout* l, MPI_Comm comm, const std::string& shard, std::uint64_t init_seed,
        const std::string& dir, const model::GptConfig& cfg) {
    data = std::make_unique<io::TokenDataset>(shard, kSeq);
    parallel::ParallelConfig pc;
    int dp = 1;
    if (l) {
      pc.shape = mesh::Shape{l->dp, l->pp, l->tp};
      pc.shape.ep = l->ep;
      pc.dp.zero_stage = l->zero;
      pc.dp.bucket_bytes = 4096;
      dp = l->dp;
    }
    const auto tc = config(kGlobal / dp, dir);
    engine = std::make_unique<parallel::Engine<T>>(
        l ? comm : MPI_COMM_SELF, cfg, l ? train::engine_options(tc, pc) : train::engine_options(tc));
    engine->init_parameters(init_seed);
    trainer = std::make_unique<train::TrainerT<T>>(*engine, tc, *data, nullptr);
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
      r.aux.push_back(m.moe_aux);
      r.z.push_back(m.moe_z);
    }
    return r;
  }
  // Every parameter of the whole model, as floats, on rank 0 (empty elsewhere). Collective.
  std::vector<float> parameters() {
    std::vector<float> out;
    engine->with_whole_model([&](const auto& whole) {  // this rank's model (T) or the gathered
      auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, whole.params());
      for (std::size_t i = 0; i < h.extent(0); ++i) out.push_back(static_cast<float>(h(i)));
    });
    return out;
  }
};

// Losses relative to the reference (aux and z: `router`).
struct Tolerance {
  double loss = 1e-5, router = 1e-5;
};

void compare(const Losses& got, const Losses& ref, int from, const std::string& what,
             const Tolerance& tol = {}) {
  INFO(what);
  REQUIRE(!got.loss.empty());
  REQUIRE(from + got.loss.size() <= ref.loss.size());
  double worst = 0, worst_aux = 0, worst_z = 0;
  for (std::size_t i = 0; i < got.loss.size(); ++i) {
    const std::size_t s = from + i;
    worst = std::max(worst, std::fabs(double(got.loss[i]) - ref.loss[s]) / ref.loss[s]);
    worst_aux = std::max(worst_aux, std::fabs(got.aux[i] - ref.aux[s]) / ref.aux[s]);
    worst_z = std::max(worst_z, std::fabs(got.z[i] - ref.z[s]) / ref.z[s]);
  }
  INFO("worst relative loss " << worst << ", aux " << worst_aux << ", z " << worst_z);
  REQUIRE(worst <= tol.loss);
  REQUIRE(worst_aux <= tol.router);
  REQUIRE(worst_z <= tol.router);
}

// Saves under `save` after 5 steps into `dir`, then restores under each of `restores` (on the
// world) and, when `single`, on one rank; every continuation must be the reference's.
template <class T>
void save_and_restore(const model::GptConfig& cfg, const std::string& shard, const Losses& ref,
                      const std::string& dir, const Layout& save,
                      const std::vector<Layout>& restores, bool single,
                      const Tolerance& tol = {}) {
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(mt_test::world());
  std::vector<float> saved;  // rank 0: the parameters at the checkpoint
  {
    Setup<T> s(&save, mt_test::world(), shard, 11, dir, cfg);
    compare(s.steps(0, kSaveAt), ref, 0, "the saving run " + save.name(), tol);
    s.trainer->save_checkpoint(kSaveAt);
    saved = s.parameters();
  }
  if (mt_test::world_rank() == 0) REQUIRE(!saved.empty());
  for (const Layout& l : restores) {
    INFO("saved under " << save.name() << ", restored under " << l.name());
    Setup<T> s(&l, mt_test::world(), shard, 12345, dir, cfg);
    const io::CheckpointAttributes a = s.trainer->restore("latest");
    REQUIRE(a.step == kSaveAt);
    REQUIRE(a.model.moe.experts == cfg.moe.experts);
    REQUIRE(mt_test::all_ranks(s.parameters() == saved));  // exactly (empty off rank 0)
    const Losses got = s.steps(kSaveAt, kSteps);
    REQUIRE(got.loss.size() == std::size_t(kSteps - kSaveAt));
    compare(got, ref, kSaveAt, "saved under " + save.name() + ", restored under " + l.name(),
            tol);
  }
  if (single) {
    MPI_Comm one;
    MPI_Comm_split(mt_test::world(), mt_test::world_rank() == 0 ? 0 : MPI_UNDEFINED, 0, &one);
    if (mt_test::world_rank() == 0) {
      {
        Setup<T> s(nullptr, MPI_COMM_SELF, shard, 12345, dir, cfg);
        s.trainer->restore(dir);
        REQUIRE(s.parameters() == saved);
        compare(s.steps(kSaveAt, kSteps), ref, kSaveAt,
                "saved under " + save.name() + ", restored on one rank", tol);
      }
      MPI_Comm_free(&one);
    }
    MPI_Barrier(mt_test::world());
  }
}

}  // namespace

TEST_CASE("MoE: a checkpoint written at ep 4 continues at ep 2 and ep 1",
          "[train][checkpoint][moe][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_moe_resume needs 8 ranks");
    return;
  }
  const model::GptConfig cfg = mt_test::moe_tiny();
  const std::string shard = mt_test::layout_shard("test_moe_resume");
  Losses ref;  // the uninterrupted single-rank run (every rank computes it)
  {
    Setup<float> one(nullptr, MPI_COMM_SELF, shard, 11, "unused", cfg);
    ref = one.steps(0, kSteps);
  }
  // ZeRO-0: dense tensors split over dp, experts over expert-dp.
  save_and_restore<float>(cfg, shard, ref, "test_moe_resume_ckpt", {4, 4, 2, 1, 0},
                          {{2, 2, 2, 2, 1}, {8, 1, 1, 1, 3}}, true);
  // ZeRO-2: the experts' shard pieces over expert-dp.
  save_and_restore<float>(cfg, shard, ref, "test_moe_resume_ckpt_zero2", {8, 4, 1, 1, 2},
                          {{4, 2, 2, 1, 0}}, false);
}

TEST_CASE("MoE: the sigmoid router's expert biases continue from a checkpoint in any layout",
          "[train][checkpoint][moe][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_moe_resume needs 8 ranks");
    return;
  }
  // The biases after 5 steps are in the file (not in any parameter): a restore that dropped
  // them would route the continuation differently (test_moe_layouts checks they matter).
  const model::GptConfig cfg = mt_test::moe_tiny_bias();
  const std::string shard = mt_test::layout_shard("test_moe_resume_bias");
  Losses ref;
  {
    Setup<float> one(nullptr, MPI_COMM_SELF, shard, 11, "unused", cfg);
    ref = one.steps(0, kSteps);
  }
  save_and_restore<float>(cfg, shard, ref, "test_moe_resume_ckpt_bias", {4, 4, 2, 1, 0},
                          {{4, 2, 1, 2, 1}}, true);
}

namespace {

// Rewrites a checkpoint the way meshtrain wrote expert biases before the /state group: each
// block's biases as the root attribute extra.moe.expert_bias.<block> (hexadecimal floats), no
// /state group. One process.
void make_legacy(const std::string& file, const io::CheckpointState& state) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  for (const auto& [name, v] : state) {
    const std::size_t at = name.find_first_of("0123456789");
    REQUIRE(at != std::string::npos);
    const int block = std::stoi(name.substr(at));
    std::string text;
    char buf[32];
    for (std::size_t e = 0; e < v.size(); ++e) {
      std::snprintf(buf, sizeof buf, "%s%a", e ? " " : "", static_cast<double>(v[e]));
      text += buf;
    }
    const std::string attr = cat("extra.moe.expert_bias.", block);
    const hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, text.size());
    H5Tset_strpad(type, H5T_STR_NULLPAD);
    H5Tset_cset(type, H5T_CSET_UTF8);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(f, attr.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(a >= 0);
    REQUIRE(H5Awrite(a, type, text.data()) >= 0);
    H5Aclose(a);
    H5Sclose(space);
    H5Tclose(type);
  }
  REQUIRE(H5Ldelete(f, "/state", H5P_DEFAULT) >= 0);
  REQUIRE(H5Fclose(f) >= 0);
}

}  // namespace

TEST_CASE("MoE: expert biases are /state datasets, and files that kept them as attributes "
          "still restore", "[train][checkpoint][moe][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_moe_resume needs 8 ranks");
    return;
  }
  const model::GptConfig cfg = mt_test::moe_tiny_bias();
  const std::string shard = mt_test::layout_shard("test_moe_resume_legacy");
  const std::string dir = "test_moe_resume_ckpt_legacy";
  Losses ref;
  {
    Setup<float> one(nullptr, MPI_COMM_SELF, shard, 11, "unused", cfg);
    ref = one.steps(0, kSteps);
  }
  if (mt_test::world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(mt_test::world());
  const Layout save{4, 4, 2, 1, 0}, restore{4, 2, 1, 2, 1};
  {
    Setup<float> s(&save, mt_test::world(), shard, 11, dir, cfg);
    s.steps(0, kSaveAt);
    s.trainer->save_checkpoint(kSaveAt);
  }
  if (mt_test::world_rank() == 0) {
    const std::string file = dir + "/" + io::checkpoint_file_name(kSaveAt);
    const io::CheckpointAttributes a = io::read_checkpoint_attributes(file);
    int moe_blocks = 0;
    for (int l = 0; l < cfg.n_layer; ++l) moe_blocks += cfg.moe.is_moe_layer(l) ? 1 : 0;
    REQUIRE(static_cast<int>(a.state.size()) == moe_blocks);
    bool moved = false;
    for (const auto& [name, v] : a.state) {
      INFO(name);
      REQUIRE(name.find("mlp.router.expert_bias") != std::string::npos);
      REQUIRE(static_cast<int>(v.size()) == cfg.moe.experts);
      for (float x : v) moved = moved || x != 0.0f;
    }
    REQUIRE(moved);  // 5 steps moved the biases: the restore below has something to restore
    for (const auto& kv : a.extra) REQUIRE(kv.first.rfind("moe.expert_bias", 0) != 0);
    make_legacy(file, a.state);
    REQUIRE(io::read_checkpoint_attributes(file).state.empty());
  }
  MPI_Barrier(mt_test::world());
  Setup<float> s(&restore, mt_test::world(), shard, 12345, dir, cfg);
  REQUIRE(s.trainer->restore("latest").step == kSaveAt);
  compare(s.steps(kSaveAt, kSteps), ref, kSaveAt,
          "saved under " + save.name() + " with the biases as attributes, restored under " +
              restore.name());
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("bf16 MoE: a checkpoint continues under other ep layouts and on one rank",
          "[train][checkpoint][moe][mpi][bf16]") {
  const int W = mt_test::world_size();
  if (W != 2 && W != 8) {
    WARN("the bf16 case of test_moe_resume runs on 2 or 8 ranks");
    return;
  }
  model::GptConfig cfg = mt_test::moe_tiny();
  cfg.moe.top_k = cfg.moe.experts;  // no top-k choice to flip between layouts
  const std::string shard = mt_test::layout_shard("test_moe_resume_bf16");
  Losses ref;
  {
    Setup<bf16> one(nullptr, MPI_COMM_SELF, shard, 11, "unused", cfg);
    ref = one.steps(0, kSteps);
  }
  Tolerance tol;
  tol.loss = 1e-2;
  tol.router = 2e-2;
  if (W == 2) {
    save_and_restore<bf16>(cfg, shard, ref, "test_moe_resume_bf16_ckpt", {2, 2, 1, 1, 0},
                           {{2, 1, 1, 1, 3}, {1, 1, 2, 1, 1}}, true, tol);
    save_and_restore<bf16>(cfg, shard, ref, "test_moe_resume_bf16_ckpt_zero2", {2, 2, 1, 1, 2},
                           {{1, 1, 1, 2, 0}}, false, tol);
  } else {
    save_and_restore<bf16>(cfg, shard, ref, "test_moe_resume_bf16_ckpt", {4, 4, 2, 1, 0},
                           {{2, 2, 2, 2, 1}, {8, 1, 1, 1, 3}}, true, tol);
    save_and_restore<bf16>(cfg, shard, ref, "test_moe_resume_bf16_ckpt_zero2", {8, 4, 1, 1, 2},
                           {{4, 2, 2, 1, 0}}, false, tol);
  }
}
#endif
