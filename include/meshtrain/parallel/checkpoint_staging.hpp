#pragma once
// What a rank writes into a checkpoint, as flat ranges of its stage's buffer, and the host
// buffers a save copies them into before they are written (issue 36: a background writer
// writes them while training goes on). The partition is a pure function, which the planner
// reads to count the staging buffers (plan/memory.cpp); Engine::stage_checkpoint fills them.
#include <cstddef>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"

namespace meshtrain::parallel {

// The disjoint part of its (tp, pp) slice a data-parallel rank writes (no two ranks write an
// element): at ZeRO >= 1 exactly its optimizer shard's pieces; at ZeRO 0 the range
// [n d / D, n (d + 1) / D) of the flat buffer. At ZeRO 0 under expert parallelism dense
// parameters split over dp and the MoE experts (each ep rank's own, replicated over expert-dp)
// over expert-dp, so there are two ranges: dense pieces come from `dense`, experts from
// `expert`. Each range's `shard` is its offset in the staging buffers.
struct CheckpointPartition {
  std::vector<optim::ShardPiece> dense, expert;
  bool expert_split = false;
  bool whole_shard = false;  // ZeRO >= 1: staging holds the optimizer shard in shard order
  std::size_t staged = 0;    // elements of each staged family (parameters, m, v)
};

// n: the stage's flat buffer; shard_pieces / shard_size: the optimizer's shard (ZeRO >= 1);
// (dp_rank, dp): the rank's data-parallel group; (edp_rank, edp): its expert-data-parallel
// group, used when `expert_split` (ZeRO 0 with mesh.ep > 1).
CheckpointPartition checkpoint_partition(std::size_t n, int zero_stage,
                                         const std::vector<optim::ShardPiece>& shard_pieces,
                                         std::size_t shard_size, int dp_rank, int dp,
                                         bool expert_split, int edp_rank, int edp);

// Host bytes a staged checkpoint holds: parameters (or fp32 master), m and v, fp32.
inline std::size_t checkpoint_staging_bytes(const CheckpointPartition& p) {
  return 3 * p.staged * sizeof(float);
}

// The staging buffers themselves (page-locked on CUDA builds, so the copies from the device run
// at full speed and could overlap compute).
struct CheckpointStaging {
  CheckpointPartition part;
  PinnedView1<float> params, exp_avg, exp_avg_sq;
};

}  // namespace meshtrain::parallel
