#pragma once
// The optimizer step of data parallelism with ZeRO: AdamW on this rank's shard (the whole buffer
// at stage 0), the global gradient norm summed over the groups that split the gradients, and the
// all-gather of updated parameters where ZeRO-1/2 shard the update.
//
// Global norm: this rank's sum of squares counts each parameter element once over the job:
// replicated tensor-parallel parameters on tp rank 0 only, the last stage's tied copy of wte
// not at all (parallel::counts_in_norm). It is summed over dp when the gradients are sharded
// (ZeRO >= 1: each rank holds a different part; at stage 0 every dp rank holds all of them) and
// over the model-parallel group (tp x pp) always. MoE experts under mesh.ep > 1 at ZeRO-0 (each
// ep rank holds other experts, replicated over expert-dp) are summed over the ep group apart.
#include <cstdint>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"
#include "meshtrain/parallel/grad_sync.hpp"

namespace meshtrain::parallel {

template <class T>
class ZeroOptimizer {
 public:
  // `model_parallel` may be null (tp = pp = 1). Call init_master() once the parameters are
  // initialised (and, at ZeRO-3, scattered into the shard).
  ZeroOptimizer(GradSync<T>& sync, const optim::AdamWConfig& cfg,
                comm::Communicator* model_parallel = nullptr, ExecSpace exec = ExecSpace{});

  void init_master();
  // After GradSync::finish(): norm, clip, update, all-gather (ZeRO 1/2). Same contract as
  // optim::AdamWT::step.
  bool step(std::int64_t step, float loss_scale = 1.0f, bool check_finite = false);

  Scalar<float> grad_norm() const { return opt_.grad_norm(); }
  const optim::ShardedAdamWT<T>& adamw() const { return opt_; }
  optim::ShardedAdamWT<T>& adamw() { return opt_; }  // restoring a checkpoint sets its state
  // Seconds in the norm all-reduces and in the parameter all-gather of the last step.
  double last_comm_seconds() const { return comm_seconds_; }

 private:
  GradSync<T>& sync_;
  comm::Communicator* mp_;
  ExecSpace exec_;
  optim::ShardedAdamWT<T> opt_;
  double comm_seconds_ = 0;
  std::vector<optim::ShardRange> expert_ranges_;  // ZeRO-0, mesh.ep > 1: counted expert ranges
  Scalar<float> expert_sumsq_;
};

}  // namespace meshtrain::parallel
