#pragma once
// Replays of the buffer pools whose size depends on the order of requests: GradSync's bucket and
// gather pools (ZeRO 2/3) and the pipeline runner's message pool. Each replays the same
// acquire/release sequence as the code (best fit, grow on demand) over the hook or action order
// of one step, so the predicted pool is the one the run ends up with.
#include <cstddef>
#include <vector>

#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/schedule.hpp"
#include "meshtrain/parallel/zero_partition.hpp"

namespace meshtrain::plan::detail {

// Elements allocated by GradSync's pools on pipeline stage `stage` (its `chunks`): gradient
// bucket buffers (ZeRO 2/3) and gathered-unit buffers (ZeRO 3), over one step of the schedule
// (the model's hook order: parallel::build_schedule's forwards and backwards, or the plain
// micro-batch loop at pp = 1). With pp > 1 the bucket holding the tied wte on the first and last
// stage is reduced once, in finish(), after its sum over the embedding group. With dp = 1 a collective completes when first tested. Otherwise a reduce-scatter
// is taken to complete only when something waits for it (a full pool, the bucket's next launch,
// finish(), and at ZeRO-3 the wait for a later gather on the same communicator): the upper bound
// of the pool. A run whose reduce-scatters finish early (a test at a later hook found them done)
// holds at most one bucket buffer less; both happen on the CPU build (test_plan_memory,
// --plan.validate), so the planner keeps the bound.
struct ZeroPools {
  std::size_t grad_elems = 0, param_elems = 0;
};
ZeroPools replay_zero_pools(const model::ParameterRegistry& reg,
                            const std::vector<parallel::Bucket>& buckets,
                            const parallel::ZeroPartition& part, int dp, int zero_stage,
                            const parallel::ScheduleSpec& spec, int stage,
                            const std::vector<model::LayerRange>& chunks);

// Message buffers the pipeline runner of `stage` allocates (each activation_elems()), replaying
// its action list with receives posted `recv_ahead` ahead and sends completing when reaped.
int replay_pipeline_buffers(const parallel::ScheduleSpec& spec, int stage, int recv_ahead = 2);

}  // namespace meshtrain::plan::detail
