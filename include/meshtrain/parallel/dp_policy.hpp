#pragma once
// The rules of data parallelism as a pure policy (no MPI, no Kokkos): when a gradient bucket is
// reduced, which pooled buffer a bucket's gradients or a unit's gathered parameters live in, and
// when a ZeRO-3 unit is gathered, prefetched and released. Like schedule.cpp for pipelines, the
// runtime executes it (GradSync drives it from the model's layer hooks; GradReducer and
// ParamGatherer carry out its effects with real collectives) and the planner replays the same
// code over the model's hook order with a model of when collectives complete
// (plan::replay_zero_pools), so the predicted pools are the ones the run allocates.
//
// The rules (PyTorch DDP's buckets, ZeRO and Megatron-Core's distributed optimizer):
//   ZeRO 0/1: bucket b is all-reduced in the model's gradient buffer once every unit in it has
//             completed the step's last micro-batch (or, with set_micro_batches(n), its n-th
//             backward pass: the pipeline runner interleaves micro-batches of different units).
//   ZeRO 2/3: a unit's gradient storage is a pool buffer bound at before_backward; the bucket is
//             reduce-scattered into the gradient shard after every micro-batch. At most two
//             buckets are in flight (three with the tied embedding, bound through the whole
//             backward); beyond that the oldest is waited for.
//   ZeRO 3:   before a unit's forward or backward it is gathered into a pool buffer, the next
//             unit in walk order is prefetched and every other unit is released; the tied
//             embedding stays gathered from its first use in a micro-batch to its
//             after_backward.
//   Tied wte with pp > 1: summed over the embedding group after the pipeline flush; at ZeRO 2/3
//             its bucket accumulates over the micro-batches and is reduced only in finish().
#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/dp_options.hpp"
#include "meshtrain/parallel/zero_partition.hpp"

namespace meshtrain::parallel {

// Reusable buffers chosen by size: a request takes the smallest free buffer that is large
// enough, or grows the pool by a buffer of exactly the size asked for.
class BufferPlan {
 public:
  struct Taken {
    int id = -1;
    bool grown = false;  // a new buffer of `elems` elements
  };
  Taken acquire(std::size_t elems);
  void release(int id) { busy_[static_cast<std::size_t>(id)] = false; }
  bool has_free(std::size_t elems) const;
  std::size_t count() const { return size_.size(); }
  std::size_t capacity(int id) const { return size_[static_cast<std::size_t>(id)]; }
  std::size_t total_elems() const;

 private:
  std::vector<std::size_t> size_;
  std::vector<bool> busy_;
};

// What the policy knows of a rank's model: its units, the buckets they form (launch order) and
// the ZeRO group (piece per dp rank) of each bucket.
struct DpPlan {
  int zero_stage = 0;
  int dp = 1;
  bool overlap = true;
  // ZeRO 0/1: begin_step zeroes only the gradients the model's GEMMs do not overwrite on their
  // first write (model/grad_first_write.hpp); ZeRO 2/3 zero their shard and bucket buffers.
  bool first_write = false;
  std::vector<Bucket> buckets;            // launch order (last units first)
  std::vector<std::size_t> bucket_piece;  // elements of each bucket's group per dp rank
  // Ranks that split each bucket (dp, or the expert-data-parallel group of MoE experts) and
  // whether it is an expert bucket (reduced over expert-dp instead of dp).
  std::vector<int> bucket_ranks;
  std::vector<bool> bucket_expert;
  // Per unit: the unit used together with it (an MoE block's unit and its experts' unit, each
  // the other's; -1: none). ZeRO-3 keeps a unit's partner gathered while the unit is.
  std::vector<int> partner;
  std::vector<int> unit_bucket;           // per unit
  int embedding_unit = -1;                // the unit holding wte (-1: none)
  int tied_unit = -1;                     // the embedding unit when the head reads it (tied head)
  int head_unit = -1;
  int n_units() const { return static_cast<int>(unit_bucket.size()); }
  int units_in(int b) const {
    return buckets[static_cast<std::size_t>(b)].last_unit -
           buckets[static_cast<std::size_t>(b)].first_unit + 1;
  }
};

// The plan GradSync uses for `reg` (buckets of `opt.bucket_bytes` in elements of `elem_bytes`,
// one per unit at ZeRO-3) and the ZeRO partition over dp that the buckets cut.
struct DpLayout {
  DpPlan plan;
  ZeroPartition partition{std::size_t{0}, 1};
};
// ep: mesh.ep; expert units (ParamGroup::expert_dp) are split over dp / ep ranks (stride ep).
DpLayout make_dp_layout(const model::ParameterRegistry& reg, std::size_t elem_bytes,
                        const DpOptions& opt, int dp, int ep = 1);

// The effects the policy asks for. Gradient effects are carried out by GradReducer, parameter
// effects by ParamGatherer; the planner's replay only records them.
class GradEffects {
 public:
  virtual ~GradEffects() = default;
  // begin_step: full buffer (less the first-written gradients, plan.first_write) or shard
  virtual void zero_grads() = 0;
  virtual bool test_grad(int bucket) = 0;        // bucket's reduction complete (progresses MPI)
  virtual void wait_grad(int bucket) = 0;
  // ZeRO 0/1: all-reduce the bucket in the full buffer (buffer = -1). ZeRO 2/3: reduce-scatter
  // pool buffer `buffer` into the shard, adding the running shard first (accumulation).
  virtual void launch_grad(int bucket, int buffer) = 0;
  // ZeRO 2/3: bind pool buffer `buffer` (zeroed) as the gradient storage of the bucket's units;
  // grown: the pool just grew by this buffer.
  virtual void bind_grad_buffer(int bucket, int buffer, std::size_t elems, bool grown) = 0;
  // The tied wte summed over the embedding group: in the bucket's pool buffer (ZeRO 2/3, before
  // its reduce-scatter) or in the full gradient buffer (ZeRO 0/1, after the all-reduces).
  virtual void sum_tied_in_buffer(int bucket, int buffer) = 0;
  virtual void sum_tied_in_grads() = 0;
};

class GatherEffects {
 public:
  virtual ~GatherEffects() = default;
  virtual bool test_gather(int unit) = 0;
  virtual void wait_gather(int unit) = 0;
  virtual void start_gather(int unit, int buffer, std::size_t elems, bool grown) = 0;
  virtual void bind_params(int unit, int buffer) = 0;  // use the gathered copy (if not already)
  virtual void unbind_params(int unit) = 0;            // the buffer went back to the pool
};

class DpPolicy {
 public:
  // `gather` may be null below ZeRO-3.
  DpPolicy(DpPlan plan, GradEffects& grads, GatherEffects* gather);

  // The tied wte is summed over an embedding group of more than one rank (pp > 1, first or last
  // stage): ZeRO 2/3 defer its bucket to finish(), ZeRO 0/1 sum after the all-reduces.
  void set_tied_sum(bool summed);
  void set_last_micro(bool last) { last_micro_ = last; }
  void set_micro_batches(int n) { n_micro_ = n; }

  void before_forward(int unit);
  void before_backward(int unit);
  void after_backward(int unit);
  void begin_step();
  // Launch what the hooks have not, then wait for every reduction; ZeRO-3 releases every unit.
  void finish();
  // ZeRO-3: drop every gathered copy (the parameters changed).
  void release_all_params();

  const DpPlan& plan() const { return plan_; }
  const BufferPlan& grad_pool() const { return grad_pool_; }
  const BufferPlan& param_pool() const { return param_pool_; }
  int deferred_bucket() const { return deferred_; }
  bool tied_summed() const { return tied_summed_; }

 private:
  struct OpState {
    bool active = false;  // launched, completion not yet observed
    std::int64_t seq = 0;  // launch order (the oldest is waited for first)
  };
  void poll();
  void wait_grad_op(int b);
  void wait_gather_op(int u);
  void complete_bucket(int b);
  void ensure_grad_buffer(int b);
  void launch(int b);
  void reset_counts();
  void start_gather(int u);
  void ensure_params(int u);
  void release_params(int u);
  void keep_only(int a, int b);

  DpPlan plan_;
  GradEffects& grads_;
  GatherEffects* gather_;
  bool last_micro_ = true;
  int n_micro_ = 0;
  int deferred_ = -1;
  bool tied_summed_ = false;
  std::int64_t seq_ = 0;
  std::vector<int> pending_, done_;
  std::vector<bool> launched_;
  std::vector<OpState> grad_ops_, gather_ops_;
  std::vector<int> grad_buf_, inflight_buf_, param_buf_;
  BufferPlan grad_pool_, param_pool_;
};

}  // namespace meshtrain::parallel
