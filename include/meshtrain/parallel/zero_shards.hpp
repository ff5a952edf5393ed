#pragma once
// ZeRO shards of one rank: the partition of its flat buffer over the data-parallel group, the
// shard buffers that replace the model's full ones (gradients at ZeRO 2/3, parameters at ZeRO 3),
// and the view of them the optimizer works on (its pieces, ranges, gradients and parameters).
// Whole-buffer transfers (initialisation, restore, export) and the all-gather of updated
// parameters at ZeRO 1/2 live here too: they move shards.
#include <cstddef>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"
#include "meshtrain/parallel/comm_stats.hpp"
#include "meshtrain/parallel/dp_options.hpp"
#include "meshtrain/parallel/zero_partition.hpp"

namespace meshtrain::parallel {

// The optimizer's view of rank `rank`'s shard of `part` (pure: the planner reads it too): its
// pieces of the flat buffer, and its parameters as ranges of one decay and norm flag.
std::vector<optim::ShardPiece> shard_pieces(const ZeroPartition& part, int rank);
// count_experts = false: MoE expert parameters do not count in the norm here (ZeRO-0 with
// mesh.ep > 1, where the optimizer sums them over the ep group separately).
std::vector<optim::ShardRange> shard_ranges(const model::ParameterRegistry& reg,
                                            const ZeroPartition& part, int rank,
                                            bool count_experts = true);

// What ZeroShards allocates, predicted without building it (the planner), for elements of
// `elem_bytes`: the shard buffers of the stage, and the staging of the ZeRO 1/2 all-gather of
// updated parameters (dp > 1).
struct ShardBytes {
  std::size_t params = 0, grads = 0;
};
ShardBytes zero_shard_bytes(const ZeroPartition& part, int zero_stage, std::size_t elem_bytes);
std::size_t zero_staging_bytes(const ZeroPartition& part, int zero_stage, std::size_t elem_bytes);

template <class T>
class ZeroShards {
 public:
  // `params`: the model's full parameter buffer (empty at ZeRO-3). Allocates the shard buffers
  // the stage needs (zero.shard_grads at 2/3, zero.shard_params at 3).
  // `expert_dp` (null: dp) is the communicator of groups with stride > 1 (MoE experts).
  ZeroShards(const model::ParameterRegistry& reg, ZeroPartition part, int zero_stage,
             View1<T> params, comm::Communicator& replicas, ExecSpace exec,
             comm::Communicator* expert_replicas = nullptr);

  // The communicator that splits group g (dp, or expert-dp for expert groups) and this rank's
  // index in it.
  comm::Communicator& comm_of(int g) const {
    return part_.groups()[static_cast<std::size_t>(g)].stride > 1 ? *expert_replicas_ : replicas_;
  }

  int zero_stage() const { return stage_; }
  bool sharded() const { return stage_ >= 1; }
  const ZeroPartition& partition() const { return part_; }
  View1<T> shard_params() const { return shard_params_; }
  View1<T> shard_grads() const { return shard_grads_; }

  // The optimizer's partition: over dp when sharded, one shard = the whole buffer otherwise.
  const ZeroPartition& optimizer_partition() const { return sharded() ? part_ : whole_; }
  int optimizer_rank() const;
  std::vector<optim::ShardPiece> optimizer_pieces() const;
  // Consecutive parameters of one piece with the same decay and norm flags form one range.
  std::vector<optim::ShardRange> optimizer_ranges() const;
  // Where the reduced gradients and the parameters the step updates are, given the model's
  // full gradient buffer (ZeRO 0/1).
  View1<T> optimizer_grads(View1<T> model_grads) const;
  optim::Index optimizer_grads_index() const;
  View1<T> optimizer_params() const;
  optim::Index optimizer_params_index() const;

  // ZeRO-3: shard = this rank's pieces of a full flat buffer (below 3: copied into the model's).
  void scatter_params(View1<const T> full);
  // Collective: every rank's pieces into a full flat buffer.
  void gather_params(View1<T> full, CommStats& stats);
  // ZeRO 1/2 after the update of this rank's pieces: all-gather them into the full buffer.
  void gather_updated_params(CommStats& stats);

  // Device bytes: the shard buffers, and the staging of the whole-buffer gathers.
  std::size_t shard_bytes() const;
  std::size_t staging_bytes() const;

 private:
  void gather_groups(View1<const T> src, optim::Index where, View1<T> dst, CommStats& stats);

  const model::ParameterRegistry& reg_;
  ZeroPartition part_, whole_;
  int stage_;
  View1<T> params_;
  comm::Communicator& replicas_;
  ExecSpace exec_;
  comm::Communicator* expert_replicas_;
  View1<T> shard_params_, shard_grads_;
  View1<T> stage_send_, stage_recv_;
};

}  // namespace meshtrain::parallel
