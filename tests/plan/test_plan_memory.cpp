// The memory model against what the CPU build allocates: every layout of the grid (30 over
// 1, 2, 4 and 8 ranks: dp/pp/tp, ZeRO 0-3 (2 and 3 also with pipelines), offload, every
// schedule, sequence parallelism, recompute, train.recompute_mlp_act, accumulation, small and
// default buckets) is built and trained for two steps
// in-process; each rank's peak of live Kokkos allocations must be within 5 % of the predicted
// total of its stage. Rank 0 prints the table and the largest error (the figure in
// docs/planner.md). Two more grids: FP8 layouts (issue 35) and context-parallel ones (issue 34:
// cp 2 and 4 alone, with dp and ZeRO-1/3, tp + sp, a pipeline, recompute; within 0.4 %,
// activations exact).
#include <cmath>
#include <cstdio>
#include <vector>

#include "meshtrain/app/plan_run.hpp"
#include "meshtrain/plan/memory.hpp"
#include "plan_test_util.hpp"

using namespace meshtrain;
using plan_test::K;
using plan_test::L;

namespace {

std::vector<L> grid(int W) {
  constexpr std::size_t small = 16u << 10;  // 16 KiB buckets: several per stage
  if (W == 1)
    return {{1, 1, 1, 0, 8, 1},
            {1, 1, 1, 0, 4, 2, K::one_f_one_b, 1, false, true},
            {1, 1, 1, 1, 8, 1},
            {1, 1, 1, 2, 4, 2, K::one_f_one_b, 1, false, false, false, small},
            {1, 1, 1, 3, 8, 1, K::one_f_one_b, 1, false, false, false, small},
            {1, 1, 1, 1, 8, 1, K::one_f_one_b, 1, false, false, true},
            {1, 1, 1, 0, 4, 2, K::one_f_one_b, 1, false, false, false, 25u << 20, true}};
  if (W == 2)
    return {{2, 1, 1, 0, 4, 1},
            {2, 1, 1, 2, 2, 2, K::one_f_one_b, 1, false, false, false, small},
            {2, 1, 1, 3, 4, 1, K::one_f_one_b, 1, false, true, false, small},
            {1, 2, 1, 0, 2, 4},
            {1, 2, 1, 1, 2, 4, K::gpipe},
            {1, 2, 1, 0, 2, 4, K::interleaved, 2},
            {1, 1, 2, 0, 8, 1},
            {1, 1, 2, 1, 8, 1, K::one_f_one_b, 1, true, true},
            {1, 2, 1, 2, 2, 4, K::one_f_one_b, 1, false, false, false, small},
            {1, 2, 1, 0, 2, 4, K::one_f_one_b, 1, false, false, false, small, true},
            {1, 1, 2, 1, 8, 1, K::one_f_one_b, 1, true, false, false, 25u << 20, true}};
  if (W == 4)
    return {{4, 1, 1, 1, 2, 1},
            {2, 2, 1, 1, 2, 2},
            {2, 1, 2, 1, 4, 1, K::one_f_one_b, 1, true},
            {1, 2, 2, 0, 2, 4, K::gpipe},
            {1, 4, 1, 0, 1, 8},
            {1, 1, 4, 0, 8, 1},
            {4, 1, 1, 3, 1, 2, K::one_f_one_b, 1, false, false, false, small},
            {2, 2, 1, 2, 2, 2, K::gpipe},
            {2, 2, 1, 3, 2, 2, K::one_f_one_b, 1, false, false, false, small}};
  if (W == 8)
    return {{8, 1, 1, 3, 1, 1},
            {2, 2, 2, 1, 2, 2},
            {1, 4, 2, 0, 1, 8, K::one_f_one_b, 1, true},
            {4, 2, 1, 1, 1, 2, K::gpipe, 1, false, false, true},
            {2, 1, 4, 2, 4, 1, K::one_f_one_b, 1, true},
            {2, 2, 2, 3, 1, 4, K::one_f_one_b, 1, true}};
  return {};
}

// train.precision=fp8 (tensorwise; on the CPU build fp32 activations and emulated FP8 GEMMs):
// the casts' workspace, and the blocks that keep their linears' inputs as transposed FP8 casts
// (all of them; all but the first and last; none under full recomputation; the MLP activation
// shared under recompute_mlp_act; a pipeline's two slots; tp with sequence parallelism).
std::vector<L> fp8_grid(int W) {
  L plain{1, 1, 1, 0, 4, 2}, ends = plain, recompute = plain, mlp_act = plain;
  plain.fp8 = ends.fp8 = recompute.fp8 = mlp_act.fp8 = true;
  ends.fp8_first_last_bf16 = 1;
  recompute.recompute = true;
  mlp_act.mlp_act = true;
  if (W == 1) return {plain, ends, recompute, mlp_act};
  if (W == 2) {
    L pp{1, 2, 1, 0, 2, 4}, tp{1, 1, 2, 1, 4, 1, K::one_f_one_b, 1, true}, dp{2, 1, 1, 1, 4, 1};
    pp.fp8 = tp.fp8 = dp.fp8 = true;
    return {pp, tp, dp};
  }
  return {};
}

// Context parallelism (ring attention; issue 34): cp alone, with dp and ZeRO-1/3 over dp x cp,
// with tp + sp, with a pipeline, and under recompute.
std::vector<L> cp_grid(int W) {
  const auto with_cp = [](L l, int cp) {
    l.cp = cp;
    return l;
  };
  if (W == 2) return {with_cp({1, 1, 1, 0, 4, 2}, 2), with_cp({1, 1, 1, 1, 4, 2}, 2)};
  if (W == 4)
    return {with_cp({1, 1, 1, 3, 2, 2}, 4), with_cp({2, 1, 1, 1, 2, 2}, 2),
            with_cp({1, 1, 2, 1, 4, 1, K::one_f_one_b, 1, true}, 2),
            with_cp({1, 2, 1, 0, 2, 4}, 2),
            with_cp({2, 1, 1, 1, 2, 2, K::one_f_one_b, 1, false, true}, 2)};
  return {};
}

// skip_sharded_pp: leave out ZeRO 2/3 with pipelines (see the Llama case).
void check_grid(const model::GptConfig& cfg, const std::string& shard,
                bool skip_sharded_pp = false, bool fp8 = false, bool cp = false) {
  const int seq = cfg.block_size;
  const io::TokenDataset data(plan_test::make_shard(shard), seq);
  const int W = mt_test::world_size(), me = mt_test::world_rank();
  double worst = 0;
  for (const L& g : cp ? cp_grid(W) : fp8 ? fp8_grid(W) : grid(W)) {
    const plan::Layout l = g.layout();
    if (skip_sharded_pp && l.zero_stage >= 2 && l.pp > 1) continue;
    INFO("layout " << l.name());
    const auto run = app::run_layout(mt_test::world(), cfg, seq, l, data, 2);
    const auto mem = plan::memory_per_stage(cfg, seq, l);
    const plan::MemoryBreakdown& p = mem[static_cast<std::size_t>(run.stage)];
    const double err = std::fabs(p.total() - run.peak_bytes) / run.peak_bytes;
    // The parts the objects report against their predicted counterparts (same allocations).
    const double states = p.params + p.grads;
    double e[3] = {err, 0, 0}, worst_here[3];
    e[1] = std::fabs(states - run.model_buffers) / run.model_buffers;
    e[2] = std::fabs(p.activations - run.activations) / run.activations;
    MPI_Allreduce(e, worst_here, 3, MPI_DOUBLE, MPI_MAX, mt_test::world());
    if (me == 0)
      std::printf("memory  %-48s stage %d  predicted %10.0f  measured %10.0f  error %5.2f%%"
                  "  (states %.2f%%, activations %.2f%%)\n",
                  l.short_name().c_str(), run.stage, p.total(), run.peak_bytes,
                  100 * worst_here[0], 100 * worst_here[1], 100 * worst_here[2]);
    // Ranks whose prediction is off by more than 0.1 %: which stage, and by how much.
    const double mine[3] = {static_cast<double>(run.stage), p.total(), run.peak_bytes};
    std::vector<double> all(3 * static_cast<std::size_t>(W));
    MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, mt_test::world());
    for (int r = 0; me == 0 && r < W; ++r) {
      const double* a = &all[3 * static_cast<std::size_t>(r)];
      if (std::fabs(a[1] - a[2]) > 1e-3 * a[2])
        std::printf("        rank %d stage %.0f: predicted %.0f, measured %.0f (%+.0f bytes)\n", r,
                    a[0], a[1], a[2], a[2] - a[1]);
    }
    worst = std::max(worst, worst_here[0]);
    REQUIRE(worst_here[1] < 1e-9);  // model states and activations are exact
    REQUIRE(worst_here[2] < 1e-9);
  }
  if (me == 0)
    std::printf("memory  %s, %d ranks: largest error %.2f%%\n", cfg.name.c_str(), W, 100 * worst);
  REQUIRE(worst <= 0.05);
}

// The Llama block at small_model's size: 2 kv heads of 16 (split at tp 2, replicated at tp 4),
// SwiGLU 160, untied head.
model::GptConfig small_llama(const char* name) {
  model::GptConfig c = model::preset("llama-tiny");
  const auto g = plan_test::small_model();
  c.name = name;
  c.n_layer = g.n_layer;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = g.n_embd;
  c.intermediate_size = 160;
  c.vocab_size = g.vocab_size;
  c.vocab_pad = g.vocab_pad;
  c.block_size = g.block_size;
  c.tied_head = false;
  return c;
}

}  // namespace

TEST_CASE("predicted memory per rank matches the CPU build's allocations", "[plan][memory][mpi]") {
  check_grid(plan_test::small_model(), "test_plan_memory");
}

// The Llama block's own widths: 2 kv heads of 16 (split at tp 2, replicated at tp 4), SwiGLU
// 160, untied head (no tied copy on the last stage), rotary tables, RMSNorm without a mean.
// Not ZeRO 2/3 with pipelines: there a stage's measured peak depends on how many gradient
// buckets and parameter gathers overlap at run time, and the replayed pools are the upper
// bound. On the loaded 2-core CI machine (2, 2, 1) ZeRO-2 GPipe measured up to 12.5 % and
// (2, 2, 2) ZeRO-3 1F1B 7.8 % below the prediction in some runs (exact in others); GPT-2's
// (2, 2, 1) ZeRO-3 reached 4.2 %, under its bound only because its units are small. An open
// item of the memory model, not of the Llama block.
TEST_CASE("predicted memory per rank matches the allocations of a Llama model",
          "[plan][memory][mpi][llama]") {
  check_grid(small_llama("plan-test-llama"), "test_plan_memory_llama", true);
}

// Qwen2's q/k/v biases on the same block: their parameters and gradients (the registry's),
// and at tp 4 the replicated kv heads' bias gradients in the scratch summed over tp.
TEST_CASE("predicted memory per rank matches the allocations of a Qwen2 model",
          "[plan][memory][mpi][llama]") {
  model::GptConfig c = small_llama("plan-test-qwen2");
  c.qkv_bias = true;
  check_grid(c, "test_plan_memory_qwen2", true);
}

TEST_CASE("predicted memory per rank matches the allocations of FP8 layouts",
          "[plan][memory][mpi][fp8]") {
  check_grid(plan_test::small_model(), "test_plan_memory_fp8_gpt2", false, true);
  check_grid(small_llama("plan-test-llama-fp8"), "test_plan_memory_fp8_llama", false, true);
}

TEST_CASE("predicted memory per rank matches the allocations of cp layouts",
          "[plan][memory][mpi][cp]") {
  check_grid(plan_test::small_model(), "test_plan_memory_cp_gpt2", false, false, true);
  check_grid(small_llama("plan-test-llama-cp"), "test_plan_memory_cp_llama", false, false, true);
}
