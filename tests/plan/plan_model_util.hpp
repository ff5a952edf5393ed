#pragma once
// Shared by the planner's model tests (test_plan_model, test_plan_fp8): the H200 calibration
// file and a node of 8 H200s. The including target defines MESHTRAIN_SOURCE_DIR.
#include "meshtrain/plan/calibration.hpp"
#include "meshtrain/plan/cost.hpp"

namespace plan_test {

inline meshtrain::plan::Calibration h200() {
  return meshtrain::plan::load_calibration(MESHTRAIN_SOURCE_DIR "/inputs/plan/h200.json");
}

inline meshtrain::plan::Cluster node(int world) {
  meshtrain::plan::Cluster c;
  c.world = world;
  c.gpus_per_node = 8;
  c.memory_bytes = 140.4 * (1u << 30);
  return c;
}

}  // namespace plan_test
