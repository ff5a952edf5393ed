#include "meshtrain/parallel/ownership.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

namespace {

void check(const Replicas& r, const char* what) {
  MESHTRAIN_CHECK(r.size >= 1 && r.rank >= 0 && r.rank < r.size, "ownership: ", what, " rank ",
                  r.rank, " of ", r.size);
}

// Appends [lo, hi) to `out`, placed after what `own` already stages.
void add(Ownership& own, std::vector<optim::ShardPiece>& out, std::size_t lo, std::size_t hi) {
  out.push_back(optim::ShardPiece{lo, own.staged, hi - lo});
  own.staged += hi - lo;
}

}  // namespace

Ownership ownership(const OwnershipInputs& in) {
  Ownership own;
  if (in.zero_stage >= 1) {
    // The shard as the optimizer stores it: one copy of each state buffer, padding included.
    own.dense = in.shard_pieces;
    own.whole_shard = true;
    own.staged = in.shard_size;
    return own;
  }
  check(in.replicas, "replica");
  const std::size_t n = in.n;
  auto split = [&](const Replicas& r, std::vector<optim::ShardPiece>& out) {
    const auto d = static_cast<std::size_t>(r.rank), D = static_cast<std::size_t>(r.size);
    add(own, out, n * d / D, n * (d + 1) / D);
  };
  split(in.replicas, own.dense);
  if (in.ep > 1) {
    check(in.expert_replicas, "expert replica");
    own.expert_split = true;
    split(in.expert_replicas, own.expert);
  }
  return own;
}

Ownership first_copy(std::size_t n, Replicas replicas, int ep, Replicas expert_replicas) {
  check(replicas, "replica");
  Ownership own;
  if (replicas.rank == 0) add(own, own.dense, 0, n);
  if (ep > 1) {
    check(expert_replicas, "expert replica");
    own.expert_split = true;
    if (expert_replicas.rank == 0) add(own, own.expert, 0, n);
  }
  return own;
}

std::vector<OwnedPiece> owned_pieces(const model::ParameterRegistry& reg, const Ownership& own,
                                     bool dedup) {
  std::vector<OwnedPiece> out;
  auto take = [&](const std::vector<optim::ShardPiece>& ranges, bool experts) {
    for (const auto& r : ranges) {
      if (r.length == 0) continue;
      for (const auto& pc : io::pieces_for_range(reg, r.flat, r.flat + r.length, dedup)) {
        const bool expert = pc.param->grad_group == model::ParamGroup::expert_dp;
        if (own.expert_split && expert != experts) continue;
        out.push_back(OwnedPiece{pc, r});
      }
    }
  };
  take(own.dense, false);
  take(own.expert, true);
  return out;
}

}  // namespace meshtrain::parallel
