// The memory model of Mixture-of-Experts layouts against the CPU build's allocations (issue 20),
// on 8 ranks: a model of 64 experts per block (the seeds' "with 64 experts, memory needs drop to
// about 1/8") under dp 8 with mesh.ep = 1, 2, 4, 8 at ZeRO-0 and ZeRO-1. The flat parameter and
// gradient buffers and shards (the registry of this ep rank's experts, sharded over expert-dp)
// must be predicted exactly; the total within 10 % (the expert path's rows depend on the
// routing; the planner assumes a balanced, dropless one). Rank 0 prints the table: predicted and
// measured per rank, and each ep's model states and total against ep = 1's (docs/moe.md).
#include <cmath>
#include <cstdio>
#include <vector>

#include "meshtrain/app/plan_run.hpp"
#include "meshtrain/plan/memory.hpp"
#include "plan_test_util.hpp"

using namespace meshtrain;

TEST_CASE("predicted memory of MoE layouts per ep rank matches the allocations",
          "[plan][memory][moe][mpi]") {
  if (mt_test::world_size() != 8) {
    WARN("test_plan_moe needs 8 ranks");
    return;
  }
  model::GptConfig cfg = plan_test::small_model();
  cfg.name = "plan-test-moe64";
  cfg.moe.experts = 64;
  cfg.moe.top_k = 2;
  cfg.moe.ffn = 64;
  const int seq = cfg.block_size, me = mt_test::world_rank();
  const io::TokenDataset data(plan_test::make_shard("test_plan_moe"), seq);
  for (int zero : {0, 1}) {
    double states1 = 0, total1 = 0;
    for (int ep : {1, 2, 4, 8}) {
      plan::Layout l;
      l.dp = 8;
      l.ep = ep;
      l.zero_stage = zero;
      l.micro_batch = 1;
      l.n_micro = 1;
      l.precision = plan::Precision::fp32;
      INFO("layout " << l.name());
      const auto run = app::run_layout(mt_test::world(), cfg, seq, l, data, 2);
      const plan::MemoryBreakdown p = plan::memory_per_stage(cfg, seq, l).front();
      const double states = p.params + p.grads + p.optimizer;
      const double measured_states = run.model_buffers + run.optimizer;
      // The flat buffers and shards exactly (the optimizer adds a few scalars of its own).
      const double buffers = p.params + p.grads;
      double e[2] = {std::fabs(buffers - run.model_buffers) / run.model_buffers,
                     std::fabs(p.total() - run.peak_bytes) / run.peak_bytes};
      double worst[2];
      MPI_Allreduce(e, worst, 2, MPI_DOUBLE, MPI_MAX, mt_test::world());
      if (ep == 1) {
        states1 = measured_states;
        total1 = run.peak_bytes;
      }
      if (me == 0)
        std::printf("moe memory  %-22s states predicted %9.0f measured %9.0f (%.3f of ep 1)  "
                    "total predicted %9.0f measured %9.0f (%.3f of ep 1, error %.1f%%)\n",
                    l.short_name().c_str(), states, measured_states, measured_states / states1,
                    p.total(), run.peak_bytes, run.peak_bytes / total1, 100 * worst[1]);
      REQUIRE(worst[0] < 1e-9);
      REQUIRE(worst[1] <= 0.10);
    }
  }
}
