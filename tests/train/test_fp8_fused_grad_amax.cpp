// train.precision=fp8, tensorwise (issue 35): two ways the recipe saves a read of a tensor, each
// checked to train the bits of the recipe without it.
//  - The MLP activation's backward — GPT-2's GELU, Llama's SwiGLU — sets the amaxes of the
//    output-gradient casts it feeds (c_fc's; gate_proj's and up_proj's, one per half of
//    SwiGLU's output: Fp8Recipe::fused_grad_amax), so those casts read their tensors once.
//  - Each FP8 weight's forward cast keeps its scale for the backward's cast of W^T
//    (Fp8Recipe::keep_weight_scale), so the backward does not reduce the weight's amax again.
// The amaxes are of the rank's shard and are still agreed over tp and cp, so training must give
// the same bits as with every cast reducing its own amax: the losses and gradient norms of
// every step and each rank's parameters after them, bit for bit, at one rank (also with
// fp8.first_last_bf16 and fp8.wgrad_bf16) and, on 2 and 4 ranks, under tp (with and without
// sequence parallelism), cp, and tp + sp with cp or with dp.
// And the saving ran: the run with it launches fewer fp8_amax_block reductions than the one
// without by exactly one per fused piece (GPT-2 1, Llama 2) or per FP8 weight (GPT-2 4, Llama
// 7) per FP8 block per micro-batch; rowwise scaling (a scale per row, and W^T's rows are not
// W's) launches as many.
#include <cstring>
#include <string>
#include <vector>

#include "harness.hpp"
#include "kernel_test_util.hpp"
#include "layout_fixture.hpp"
#include "meshtrain/io/token_shard.hpp"
#include "meshtrain/parallel/engine.hpp"
#include "meshtrain/train/trainer.hpp"

using namespace meshtrain;

namespace {

constexpr int kSeq = 16, kGlobal = 8, kMicro = 4, kSteps = 3;

struct Layout {
  int dp = 1, tp = 1, cp = 1, zero = 0;
  bool sp = false;
  std::string name() const {
    return cat("dp ", dp, " tp ", tp, " cp ", cp, " zero ", zero, sp ? " sp" : "");
  }
};

struct Run {
  std::vector<float> loss, norm, params;  // params: this rank's, after the last step
  std::size_t amax_passes = 0;            // fp8_amax_block reductions launched
};

Run train_run(const Layout& l, const model::Fp8Recipe& fp8, const std::string& data,
              const model::GptConfig& cfg) {
  parallel::ParallelConfig pc;
  pc.shape = mesh::Shape{l.dp, 1, l.tp};
  pc.shape.cp = l.cp;
  pc.sequence_parallel = l.sp;
  pc.dp.zero_stage = l.zero;
  pc.dp.bucket_bytes = 4096;
  io::TokenDataset ds(data, kSeq);
  train::TrainConfig tc;
  tc.micro_batch = kMicro;
  tc.grad_accum = kGlobal / (kMicro * l.dp);
  tc.seq_len = kSeq;
  tc.steps = kSteps;
  tc.seed = 5;
  tc.eval_every = 0;
  tc.log_every = 0;
  tc.adamw.lr = 1e-3f;
  tc.adamw.warmup_steps = 1;
  parallel::EngineOptions eo = train::engine_options(tc, pc, false);
  eo.fp8 = fp8;
  parallel::Engine<float> e(mt_test::world(), cfg, eo);
  e.init_parameters(11);
  train::Trainer tr(e, tc, ds, nullptr);
  Run r;
  {
    kt::KernelLog log;
    for (int s = 0; s < kSteps; ++s) {
      const auto met = tr.step(s, true);
      r.loss.push_back(met.loss);
      r.norm.push_back(met.grad_norm);
    }
    ExecSpace().fence();
    // The portable pass launches a Kokkos kernel of that label; the CUDA one (fp8_cast_cuda.cpp)
    // a raw kernel inside the region "meshtrain::fp8_amax_block_cuda".
    r.amax_passes = log.count_prefix("meshtrain::fp8_amax_block") +
                    log.count_region_prefix("meshtrain::fp8_amax_block_cuda");
  }
  auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, e.model().params());
  r.params.assign(p.data(), p.data() + p.extent(0));
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// What a check turns off in the recipe for its reference run.
enum class Saving { fused_grad_amax, keep_weight_scale };

// Trains cfg under l with the recipe's `saving` on and off: the same bits, and the run with it
// launches fewer amax passes: `per_block` per FP8 block per micro-batch of this rank.
void check(const model::GptConfig& cfg, const Layout& l, model::Fp8Recipe r,
           const std::string& data, Saving saving) {
  const int fp8_blocks = cfg.n_layer - 2 * r.first_last_bf16;
  const bool tensorwise = r.scaling == kernels::Fp8Scaling::tensorwise;
  const bool fused = saving == Saving::fused_grad_amax;
  const int per_block = !tensorwise ? 0 : fused ? (cfg.is_gpt2() ? 1 : 2)
                                                : (cfg.is_gpt2() ? 4 : 7);
  INFO(cfg.name << " " << l.name() << " " << kernels::fp8_scaling_name(r.scaling)
                << (r.wgrad_bf16 ? " wgrad_bf16" : "") << " first_last_bf16 "
                << r.first_last_bf16 << (fused ? " fused_grad_amax" : " keep_weight_scale"));
  r.enabled = true;
  bool& flag = fused ? r.fused_grad_amax : r.keep_weight_scale;
  flag = true;
  const Run with = train_run(l, r, data, cfg);
  flag = false;
  const Run without = train_run(l, r, data, cfg);
  REQUIRE(mt_test::all_ranks(with.loss == without.loss));
  REQUIRE(mt_test::all_ranks(with.norm == without.norm));
  REQUIRE(mt_test::all_ranks(!with.params.empty() && same_bits(with.params, without.params)));
  const std::size_t micro_batches = std::size_t(kSteps) * (kGlobal / (kMicro * l.dp));
  INFO("amax passes: with " << with.amax_passes << ", without " << without.amax_passes);
  REQUIRE(mt_test::all_ranks(without.amax_passes - with.amax_passes ==
                             micro_batches * fp8_blocks * per_block));
  // It trains, and under FP8 (the bits are not fp32's).
  REQUIRE(mt_test::all_ranks(with.loss.back() < with.loss.front()));
}

std::vector<Layout> layouts() {
  switch (mt_test::world_size()) {
    case 1:
      return {{}};
    case 2:
      return {{1, 2}, {1, 2, 1, 0, true}, {1, 1, 2}};
    case 4:
      return {{1, 2, 2, 0, true}, {2, 2, 1, 1, true}};
    default:
      return {};
  }
}

}  // namespace

TEST_CASE("fp8: the fused amaxes and the kept weight scales train the plain recipe's bits",
          "[fp8][train][amax][mpi]") {
  const auto tw = kernels::Fp8Scaling::tensorwise, rw = kernels::Fp8Scaling::rowwise;
  for (const bool llama : {false, true}) {
    const model::GptConfig cfg = llama ? mt_test::layout_tiny_llama() : mt_test::layout_tiny();
    const std::string data = mt_test::layout_shard(llama ? "test_fp8_fused_amax_llama"
                                                         : "test_fp8_fused_amax_gpt2");
    for (const Saving saving : {Saving::fused_grad_amax, Saving::keep_weight_scale}) {
      for (const Layout& l : layouts()) {
        model::Fp8Recipe r;
        r.scaling = tw;
        check(cfg, l, r, data, saving);
      }
      if (mt_test::world_size() != 1) continue;
      model::Fp8Recipe r;
      r.first_last_bf16 = 1;  // blocks 1 and 2 in FP8
      check(cfg, {}, r, data, saving);
      r = {};
      r.wgrad_bf16 = true;  // the cast of dout alone, no transpose beside it
      check(cfg, {}, r, data, saving);
      r = {};
      r.scaling = rw;
      check(cfg, {}, r, data, saving);
    }
  }
}
