#include "meshtrain/parallel/checkpoint_staging.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

CheckpointPartition checkpoint_partition(std::size_t n, int zero_stage,
                                         const std::vector<optim::ShardPiece>& shard_pieces,
                                         std::size_t shard_size, int dp_rank, int dp,
                                         bool expert_split, int edp_rank, int edp) {
  CheckpointPartition p;
  if (zero_stage >= 1) {
    // The shard as the optimizer stores it: one copy of each state buffer, padding included.
    p.dense = shard_pieces;
    p.whole_shard = true;
    p.staged = shard_size;
    return p;
  }
  MESHTRAIN_CHECK(dp >= 1 && dp_rank >= 0 && dp_rank < dp, "checkpoint_partition: dp rank ",
                  dp_rank, " of ", dp);
  auto range = [&](std::size_t d, std::size_t D) {
    const std::size_t lo = n * d / D, hi = n * (d + 1) / D;
    const optim::ShardPiece r{lo, p.staged, hi - lo};
    p.staged += r.length;
    return r;
  };
  p.dense.push_back(range(static_cast<std::size_t>(dp_rank), static_cast<std::size_t>(dp)));
  if (expert_split) {
    MESHTRAIN_CHECK(edp >= 1 && edp_rank >= 0 && edp_rank < edp, "checkpoint_partition: "
                    "expert-dp rank ", edp_rank, " of ", edp);
    p.expert_split = true;
    p.expert.push_back(range(static_cast<std::size_t>(edp_rank), static_cast<std::size_t>(edp)));
  }
  return p;
}

}  // namespace meshtrain::parallel
