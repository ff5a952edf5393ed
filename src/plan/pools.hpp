#pragma once
// The pools whose size depends on the order of requests, predicted by replaying the runtime's
// own policies: DpPolicy (GradSync's bucket and gather pools at ZeRO 2/3) over the model's hook
// order (model::forward_hooks / backward_hooks) for one step of the schedule, and MessageFlow
// (the pipeline runner's message pool, PipelineRunner::pool_bytes).
#include <cstddef>
#include <vector>

#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::plan::detail {

// Elements of GradSync's pools on pipeline stage `stage` (holding `chunks`): gradient bucket
// buffers (ZeRO 2/3) and gathered-unit buffers (ZeRO 3). Collectives complete in launch order;
// with dp = 1 one completes when first tested, otherwise only when something waits for it (a
// full pool, the bucket's next launch, finish(), a later gather): the upper bound of the pool.
// A run whose reduce-scatters finish early (a test at a later hook found them done) holds at
// most one bucket buffer less; both happen on the CPU build (test_plan_memory,
// --plan.validate), so the planner keeps the bound.
struct ZeroPools {
  std::size_t grad_elems = 0, param_elems = 0;
};
ZeroPools replay_zero_pools(const model::ParameterRegistry& reg, const parallel::DpPlan& plan,
                            const parallel::ScheduleSpec& spec, int stage,
                            const std::vector<model::LayerRange>& chunks);

}  // namespace meshtrain::plan::detail
