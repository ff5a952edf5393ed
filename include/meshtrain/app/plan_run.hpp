#pragma once
// Runs a layout in-process for a few steps on the world of this job and measures what the
// planner predicts: step time (slowest rank, per step) and the bytes every Kokkos allocation of
// the run adds up to on each rank (AllocTracker), with the parts the objects report themselves.
// Used by `meshtrain plan --plan.validate` and by test_plan_memory / test_plan_cost.
#include <cstdint>
#include <vector>

#include <mpi.h>

#include "meshtrain/core/agree.hpp"
#include "meshtrain/io/dataset.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/plan/layout.hpp"

namespace meshtrain::app {

struct LayoutRun {
  int stage = 0;                     // this rank's pipeline stage
  std::vector<double> step_seconds;  // per step, the slowest rank's (every rank has them)
  double peak_bytes = 0;             // this rank: peak of live Kokkos allocations during the run
  // What the objects report (this rank): the model's flat buffers and GradSync's shards,
  // GptT::activation_bytes(), GradSync's pools and staging, the optimizer's state.
  double model_buffers = 0, activations = 0, sync_buffers = 0, optimizer = 0;
  double median_step(int skip = 1) const;  // median of the steps after the first `skip`
};

// How fast this machine computes right now: a fixed GEMM loop on rank 0 alone (the others wait
// without spinning), then on every rank at once. On a shared machine the load of other jobs
// moves both; the planner's CPU validation divides the drift of `alone` out (plan_validate.cpp).
// Collective.
struct MachineProbe {
  double alone_s = 0, together_s = 0;  // the slowest rank's time for `together`
};
MachineProbe probe_machine(MPI_Comm world);
// MPI_Barrier without busy-polling: core/agree.hpp's quiet_barrier.

// Collective over `world` (whose size must be l.world()). The dataset's windows must be
// seq_len long. Random initialisation from `seed`; every step is a real training step.
LayoutRun run_layout(MPI_Comm world, const model::GptConfig& cfg, int seq_len,
                     const plan::Layout& l, const io::TokenDataset& data, int steps,
                     std::uint64_t seed = 1);

}  // namespace meshtrain::app
