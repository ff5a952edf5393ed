#pragma once
// Data-parallel gradient synchronisation and ZeRO sharding, driven by the model's layer hooks.
//
// Gradients are reduced over the dp group in buckets of whole layer units, in reverse order, each
// launched (non-blocking) as soon as backward has completed every unit in it, so the reduction
// of late layers overlaps the backward of early ones (PyTorch DDP's bucketing, Li et al. 2020).
//   ZeRO 0/1: all-reduce of the bucket in the model's full gradient buffer, after the last
//             micro-batch of a step only (the model accumulates the others locally).
//   ZeRO 2/3: every micro-batch, the bucket (bound to the model from a small pool of bucket
//             buffers, so no full-size gradient buffer exists) is reduce-scattered into this
//             rank's shard of the gradients, accumulating over micro-batches.
//   ZeRO 3:   the parameters live only as shards; before a unit's forward or backward its
//             parameters are all-gathered into a pool buffer bound to the model, the next unit's
//             gather is started (prefetch) while the current one computes, and a unit's buffer
//             is released once the walk has moved past it.
// Averaging is exact: the caller scales the loss gradient by 1 / (global tokens), so every
// reduction is a plain sum.
#include <cstdint>
#include <functional>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/core/view.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/sharded_adamw.hpp"
#include "meshtrain/parallel/zero_partition.hpp"

namespace meshtrain::parallel {

struct DpOptions {
  int zero_stage = 0;                        // 0: DDP; 1: + optimizer state; 2: + grads; 3: + params
  std::size_t bucket_bytes = 25u << 20;      // gradient bucket size (bytes of the compute type)
  bool overlap = true;                       // false: wait for each collective when launched
  bool offload = false;                      // optimizer state and step on the host
  int offload_threads = 0;                   // threads of the host step (0: automatic)
};

// What data parallelism needs from the model: its registry (and so its units), its full flat
// buffers (empty where the model did not allocate them: params with ZeRO-3, grads with ZeRO 2/3)
// and a way to bind one unit's storage (an empty view keeps the current binding).
template <class T>
struct ModelBuffers {
  const model::ParameterRegistry* registry = nullptr;
  View1<T> params, grads;
  std::function<void(int unit, View1<T> params, View1<T> grads)> bind_unit;
};

// The buffers of a model built with allocate_params = (stage < 3), allocate_grads = (stage < 2).
template <class T>
ModelBuffers<T> model_buffers(model::GptT<T>& m) {
  ModelBuffers<T> b;
  b.registry = &m.registry();
  b.params = m.params();
  b.grads = m.grads();
  b.bind_unit = [&m](int u, View1<T> p, View1<T> g) { m.bind_unit(u, p, g); };
  return b;
}

// Communication time of one kind of collective. total: launch to observed completion (completion
// is observed at the next hook or wait, so total is an upper bound); exposed: time the host spent
// in the launch calls and blocked in waits (on the critical path).
struct CommStats {
  double total_seconds = 0, exposed_seconds = 0;
  std::size_t ops = 0, bytes = 0;
  double hidden_fraction() const {
    return total_seconds > 0 ? 1.0 - exposed_seconds / total_seconds : 0.0;
  }
  CommStats& operator+=(const CommStats& o);
};

namespace detail {
// Reusable device buffers: a request takes a free buffer of sufficient capacity (best fit) or
// allocates one. ZeRO uses it for bucket gradients and gathered unit parameters.
template <class T>
class BufferPool {
 public:
  explicit BufferPool(const char* label) : label_(label) {}
  int acquire(std::size_t n);  // id of a busy buffer of >= n elements
  void release(int id) { busy_[id] = false; }
  View1<T> view(int id, std::size_t n) const { return slice(bufs_[id], 0, n); }
  View1<T> full(int id) const { return bufs_[id]; }
  bool has_free(std::size_t n) const;
  std::size_t count() const { return bufs_.size(); }
  std::size_t bytes() const;

 private:
  const char* label_;
  std::vector<View1<T>> bufs_;
  std::vector<bool> busy_;
};
}  // namespace detail

// Set as the model's hooks (model.set_hooks(&sync)).
template <class T>
class GradSync : public model::LayerHooks {
 public:
  // Collective over `dp`. The model's buffers must match the stage: grads allocated for ZeRO 0/1,
  // params allocated for ZeRO 0-2.
  GradSync(ModelBuffers<T> model, comm::Communicator& dp, const DpOptions& opt,
           ExecSpace exec = ExecSpace{});
  ~GradSync() override;
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // ---- the model's layer hooks ----
  void before_forward(int unit) override;
  void before_backward(int unit) override;
  void after_backward(int unit) override;

  // Pipeline parallelism with the tied embedding: the first stage's wte and the last stage's copy
  // are one parameter, whose gradient is the sum over the embedding group (null or size 1: no
  // sum). It is summed in finish(), after the pipeline has flushed: summing per micro-batch
  // would deadlock 1F1B (the last stage would wait for a first stage that waits for it).
  //   ZeRO 0/1: after the DP all-reduce (sums commute), on the full gradient buffer.
  //   ZeRO 2/3: the two stages partition wte differently (the first stage's embedding unit also
  //   holds wpe), so the sum must precede the reduce-scatter: the bucket holding wte is not
  //   reduced per micro-batch but keeps accumulating in its buffer, and finish() sums wte over
  //   the embedding group and then reduce-scatters the bucket once. Both copies then take the
  //   same update from the same summed gradient, each in its own stage's shards.
  void set_embedding_group(comm::Communicator* embedding);

  // ---- the step ----
  // Whether the coming backward is the step's last micro-batch (ZeRO 0/1 reduce only then).
  void set_last_micro(bool last) { last_micro_ = last; }
  // Micro-batches per step, for schedules that run them without a call in between (the pipeline
  // runner): ZeRO 0/1 then launch a bucket once its units have completed n backward passes, and
  // set_last_micro is not needed. 0 (default): set_last_micro decides.
  void set_micro_batches(int n) { n_micro_ = n; }
  // Zero the gradients (full buffer or shard) before the first micro-batch of a step.
  void begin_step();
  // After the last backward: launch what the hooks have not, wait for every collective. The
  // reduced gradients are then in optimizer_grads().
  void finish();
  // ZeRO 1/2, after the optimizer updated this rank's pieces of the parameters: all-gather them
  // into the model's full parameter buffer. ZeRO 0/3: nothing.
  void gather_updated_params();
  // The optimizer changed the parameters: ZeRO-3 drops every gathered copy (an evaluation pass
  // after finish() may have left some), so the next use gathers the new values.
  void params_updated();

  // ---- ZeRO-3 parameter shards ----
  // shard = this rank's pieces of a full flat parameter buffer (initialisation, restore).
  void scatter_params(View1<const T> full);
  // Collective: every rank's pieces into a full flat buffer (export, tests).
  void gather_params(View1<T> full);
  View1<T> shard_params() const { return shard_params_; }

  // ---- what the optimizer works on ----
  int zero_stage() const { return opt_.zero_stage; }
  const DpOptions& options() const { return opt_; }
  bool sharded() const { return opt_.zero_stage >= 1; }
  comm::Communicator& dp() const { return dp_; }
  const model::ParameterRegistry& registry() const { return *model_.registry; }
  // The optimizer's partition: over dp when sharded, one shard = the whole buffer otherwise.
  const ZeroPartition& optimizer_partition() const { return sharded() ? part_ : whole_; }
  int optimizer_rank() const { return sharded() ? dp_.rank() : 0; }
  std::vector<optim::ShardPiece> optimizer_pieces() const;
  std::vector<optim::ShardRange> optimizer_ranges() const;
  View1<T> optimizer_grads() const;
  optim::Index optimizer_grads_index() const;
  View1<T> optimizer_params() const;
  optim::Index optimizer_params_index() const;

  const ZeroPartition& partition() const { return part_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ModelBuffers<T>& model() const { return model_; }

  // ---- measurements ----
  CommStats grad_stats() const { return grad_stats_; }
  CommStats param_stats() const { return param_stats_; }
  void reset_stats() { grad_stats_ = param_stats_ = CommStats{}; }
  struct Bytes {
    std::size_t shard_params = 0, shard_grads = 0;        // model states owned here
    std::size_t grad_buffers = 0, param_buffers = 0;      // bucket / gather pools, staging
  };
  Bytes bytes() const;

 private:
  struct Op {
    comm::Request req;
    double t_launch = 0;
    bool active = false;  // launched, completion not yet observed
  };
  int bucket_of(int unit) const { return unit_bucket_[unit]; }
  const std::vector<model::UnitInfo>& units() const { return model_.registry->units(); }
  int n_units() const { return static_cast<int>(units().size()); }
  void poll();
  void reset_counts();
  void wait_op(Op& op, CommStats& stats);
  void rebind(int unit);
  void launch(int b);
  void complete_bucket(int b);
  void ensure_grad_buffer(int b);
  void start_gather(int unit);
  void ensure_params(int unit);
  void release_params(int unit);
  void keep_only(int a, int b);
  void gather_groups(View1<const T> src, optim::Index where, View1<T> dst);

  ModelBuffers<T> model_;
  comm::Communicator& dp_;
  DpOptions opt_;
  ExecSpace exec_;
  Timer clock_;
  std::vector<Bucket> buckets_;
  std::vector<int> unit_bucket_, bucket_group_;
  std::vector<int> pending_;  // units of the bucket still to complete before its next launch
  std::vector<int> done_;     // after_backward calls of the bucket's units this step
  ZeroPartition part_, whole_;
  bool last_micro_ = true;
  int n_micro_ = 0;
  int tied_unit_ = -1, head_unit_ = -1;  // the unit holding wte when the head reads it
  // gradients
  std::vector<Op> grad_ops_;            // one per bucket (in flight or idle)
  std::vector<bool> launched_;          // ZeRO 0/1: launched this step
  std::vector<int> grad_buf_;           // ZeRO 2/3: pool buffer the model writes, -1 none
  std::vector<int> inflight_buf_;       // ZeRO 2/3: pool buffer its reduce-scatter reads, -1 none
  std::vector<View1<T>> unit_params_, unit_grads_;
  detail::BufferPool<T> grad_pool_;
  View1<T> shard_grads_;
  // parameters (ZeRO-3)
  View1<T> shard_params_;
  detail::BufferPool<T> param_pool_;
  std::vector<int> param_buf_;          // pool buffer holding the unit's gathered params, -1 none
  std::vector<Op> param_ops_;           // gather in flight per unit
  View1<T> stage_send_, stage_recv_;    // ZeRO 1/2 parameter all-gather staging
  CommStats grad_stats_, param_stats_;
  comm::Communicator* embedding_ = nullptr;
  int deferred_bucket_ = -1;  // ZeRO 2/3 with pp: the bucket holding wte, reduced in finish()
};

}  // namespace meshtrain::parallel
