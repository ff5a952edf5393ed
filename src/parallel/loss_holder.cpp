#include "meshtrain/parallel/loss_holder.hpp"

namespace meshtrain::parallel {

bool holds_loss(const mesh::Coord& c, int pp, LossBatches batches) {
  const bool one_per_replica = batches == LossBatches::per_dp_rank || c.dp == 0;
  return c.pp == pp - 1 && c.tp == 0 && one_per_replica;
}

}  // namespace meshtrain::parallel
