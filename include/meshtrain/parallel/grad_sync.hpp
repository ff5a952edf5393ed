#pragma once
// Data parallelism and ZeRO as the model's layer hooks: a thin adapter that owns the parts and
// feeds the hooks to the policy.
//   ZeroShards        the partition over the replicas, the shard buffers, what the optimizer works on;
//   DpPolicy          when buckets are reduced and units gathered or released (pure);
//   GradReducer       the bucket reductions (all-reduce at ZeRO 0/1, reduce-scatter at 2/3);
//   ParamGatherer     the ZeRO-3 unit gathers;
//   TiedEmbeddingSum  the tied wte of a pipeline, summed over the embedding group.
// Averaging is exact: the caller scales the loss gradient by 1 / (global tokens), so every
// reduction is a plain sum.
#include <memory>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/parallel/comm_stats.hpp"
#include "meshtrain/parallel/dp_options.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/grad_reducer.hpp"
#include "meshtrain/parallel/model_buffers.hpp"
#include "meshtrain/parallel/param_gatherer.hpp"
#include "meshtrain/parallel/tied_embedding.hpp"
#include "meshtrain/parallel/zero_shards.hpp"

namespace meshtrain::parallel {

// The buffers of a model built with allocate_params = (stage < 3), allocate_grads = (stage < 2).
template <class T>
ModelBuffers<T> model_buffers(model::GptT<T>& m) {
  ModelBuffers<T> b;
  b.registry = &m.registry();
  b.params = m.params();
  b.grads = m.grads();
  b.bind_unit = [&m](int u, View1<T> p, View1<T> g) { m.bind_unit(u, p, g); };
  b.first_write = &m.grad_first_write();
  return b;
}

// Set as the model's hooks (model.set_hooks(&sync)).
template <class T>
class GradSync : public model::LayerHooks {
 public:
  // Collective over `replicas`, the ranks holding the same parameters (dp x cp). The model's
  // buffers must match the stage: grads allocated for ZeRO 0/1, params allocated for ZeRO 0-2.
  // MoE experts (units of ParamGroup::expert_dp) reduce and shard over `expert_replicas` (null:
  // replicas, i.e. mesh.ep = 1), the ranks holding the same experts; `ep` (replicas.size() /
  // expert_replicas.size()) is then the expert-parallel group they sum over for the gradient
  // norm at ZeRO-0.
  GradSync(ModelBuffers<T> model, comm::Communicator& replicas, const DpOptions& opt,
           ExecSpace exec = ExecSpace{}, comm::Communicator* expert_replicas = nullptr,
           comm::Communicator* ep = nullptr);
  ~GradSync() override;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // ---- the model's layer hooks ----
  void before_forward(int unit) override { policy_->before_forward(unit); }
  void before_backward(int unit) override { policy_->before_backward(unit); }
  void after_backward(int unit) override { policy_->after_backward(unit); }

  // Pipelines with the tied embedding: sum wte's gradient over `embedding` (null or size 1: no
  // sum); see tied_embedding.hpp for when.
  void set_embedding_group(comm::Communicator* embedding);

  // ---- the step ----
  // Whether the coming backward is the step's last micro-batch (ZeRO 0/1 reduce only then).
  void set_last_micro(bool last) { policy_->set_last_micro(last); }
  // Micro-batches per step, for schedules that run them without a call in between (the pipeline
  // runner): ZeRO 0/1 then launch a bucket once its units have completed n backward passes, and
  // set_last_micro is not needed. 0 (default): set_last_micro decides.
  void set_micro_batches(int n) { policy_->set_micro_batches(n); }
  // Zero the gradients (full buffer or shard) before the first micro-batch of a step.
  void begin_step() { policy_->begin_step(); }
  // After the last backward: launch what the hooks have not, wait for every collective. The
  // reduced gradients are then in optimizer_grads().
  void finish() { policy_->finish(); }
  // ZeRO 1/2, after the optimizer updated this rank's pieces of the parameters: all-gather them
  // into the model's full parameter buffer. ZeRO 0/3: nothing.
  void gather_updated_params() { shards_->gather_updated_params(gatherer_stats()); }
  // The optimizer changed the parameters: ZeRO-3 drops every gathered copy (an evaluation pass
  // after finish() may have left some), so the next use gathers the new values.
  void params_updated() { policy_->release_all_params(); }

  // ---- ZeRO-3 parameter shards ----
  // shard = this rank's pieces of a full flat parameter buffer (initialisation, restore).
  void scatter_params(View1<const T> full);
  // Collective: every rank's pieces into a full flat buffer (export, tests).
  void gather_params(View1<T> full) { shards_->gather_params(full, gatherer_stats()); }
  View1<T> shard_params() const { return shards_->shard_params(); }

  // ---- what the optimizer works on ----
  int zero_stage() const { return opt_.zero_stage; }
  const DpOptions& options() const { return opt_; }
  bool sharded() const { return shards_->sharded(); }
  comm::Communicator& replicas() const { return replicas_; }
  comm::Communicator& expert_replicas() const { return expert_replicas_ ? *expert_replicas_ : replicas_; }
  comm::Communicator* ep() const { return ep_; }  // null or size 1: no expert parallelism
  const model::ParameterRegistry& registry() const { return *model_.registry; }
  const ZeroShards<T>& shards() const { return *shards_; }
  const ZeroPartition& optimizer_partition() const { return shards_->optimizer_partition(); }
  int optimizer_rank() const { return shards_->optimizer_rank(); }
  std::vector<optim::ShardPiece> optimizer_pieces() const { return shards_->optimizer_pieces(); }
  std::vector<optim::ShardRange> optimizer_ranges() const { return shards_->optimizer_ranges(); }
  View1<T> optimizer_grads() const { return shards_->optimizer_grads(model_.grads); }
  optim::Index optimizer_grads_index() const { return shards_->optimizer_grads_index(); }
  View1<T> optimizer_params() const { return shards_->optimizer_params(); }
  optim::Index optimizer_params_index() const { return shards_->optimizer_params_index(); }

  const ZeroPartition& partition() const { return shards_->partition(); }
  const std::vector<Bucket>& buckets() const { return plan_.buckets; }
  const ModelBuffers<T>& model() const { return model_; }
  const DpPolicy& policy() const { return *policy_; }

  // ---- measurements ----
  CommStats grad_stats() const { return reducer_->stats(); }
  // Gradient elements zeroed since the last begin_step (grad_reducer.hpp).
  GradZeroCounts grad_zero_counts() const { return reducer_->zero_counts(); }
  CommStats param_stats() const;
  void reset_stats();
  struct Bytes {
    std::size_t shard_params = 0, shard_grads = 0;        // model states owned here
    std::size_t grad_buffers = 0, param_buffers = 0;      // bucket / gather pools, staging
  };
  Bytes bytes() const;

 private:
  CommStats& gatherer_stats() { return gather_stats_; }

  ModelBuffers<T> model_;
  comm::Communicator& replicas_;
  comm::Communicator* expert_replicas_ = nullptr;
  comm::Communicator* ep_ = nullptr;
  DpOptions opt_;
  DpPlan plan_;  // the effects read it; the policy keeps its own copy
  std::unique_ptr<ZeroShards<T>> shards_;
  std::unique_ptr<GradReducer<T>> reducer_;
  std::unique_ptr<ParamGatherer<T>> gatherer_;
  std::unique_ptr<TiedEmbeddingSum<T>> tied_;
  std::unique_ptr<DpPolicy> policy_;
  CommStats gather_stats_;  // whole-buffer gathers (ZeRO 1/2 updates, exports)
};

}  // namespace meshtrain::parallel
