#pragma once
// Where a pipeline stage posts each receive on a backend whose receives wait on the device
// (NCCL; MessageFlow's PostPolicy::at_use), as a pure function of the schedule. On NCCL the
// host may synchronise the whole device inside any compute (freeing memory does), and then
// waits for every message it has issued: a send it issued before the compute completes only
// once the peer has posted the matching receive. A receive is therefore posted at its use
// (right before the compute that consumes it), except where all stages replayed together show
// a stage's synchronisation waiting for a send whose receive its peer would post only later —
// the crossing gradients of interleaved schedules: that receive, and the peer's earlier ones
// from the same stage, are posted where the peer waits instead. The replay is repeated until
// every stage completes a step; every stage computes every stage's answer, so both ends agree.
#include <cstddef>
#include <vector>

#include "meshtrain/parallel/schedule.hpp"

namespace meshtrain::parallel {

// For each receive of build_schedule(spec, stage), in list order: the index of the action
// before which it is posted (its own index when at use). Error if no posting completes.
std::vector<std::size_t> receive_posting(const ScheduleSpec& spec, int stage);

}  // namespace meshtrain::parallel
