#pragma once
// The host buffers a save copies what a rank writes into a checkpoint (parallel::ownership, a
// pure function the planner reads to count them: plan/memory.cpp) before they are written
// (issue 36: a background writer writes them while training goes on);
// Engine::stage_checkpoint fills them.
#include <cstddef>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/parallel/ownership.hpp"

namespace meshtrain::parallel {

// Host bytes a staged checkpoint holds: parameters (or fp32 master), m and v, fp32.
inline std::size_t checkpoint_staging_bytes(const Ownership& p) {
  return 3 * p.staged * sizeof(float);
}

// The staging buffers themselves (page-locked on CUDA builds, so the copies from the device run
// at full speed and could overlap compute).
struct CheckpointStaging {
  Ownership part;  // what the rank writes
  PinnedView1<float> params, exp_avg, exp_avg_sq;
};

}  // namespace meshtrain::parallel
