#pragma once
// Data-parallel gradient reduction in buckets (PyTorch DDP's bucketing, Li et al. 2020): carries
// out DpPolicy's gradient effects with non-blocking collectives on the dp communicator.
//   ZeRO 0/1: all-reduce of a bucket in the model's full gradient buffer.
//   ZeRO 2/3: a bucket's gradients live in a pool buffer bound to the model; each micro-batch it
//             is reduce-scattered into this rank's gradient shard. Micro-batches accumulate: the
//             rank adds its running shard into its own block before the reduce-scatter, so the
//             sum is the running total (no second buffer, no add afterwards).
// Averaging is exact: the caller scales the loss gradient by 1 / (global tokens), so every
// reduction is a plain sum.
// First-write gradients (plan.first_write, ZeRO 0/1; model/grad_first_write.hpp): zero_grads
// arms the model's bookkeeping and zeroes only the gradients its GEMMs do not overwrite; before
// a bucket is all-reduced, whatever of it is still unwritten is zeroed (nothing, in a model
// whose every first-written gradient has its GEMM), so no reduction reads an unwritten value.
#include <cstddef>
#include <vector>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/parallel/comm_stats.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/model_buffers.hpp"
#include "meshtrain/parallel/tied_embedding.hpp"
#include "meshtrain/parallel/zero_shards.hpp"

namespace meshtrain::parallel {

// Gradient elements zeroed since the last begin_step: by begin_step itself (the buffer, less
// the first-written gradients; or the shard at ZeRO 2/3), and later, before a bucket's
// reduction, because no GEMM wrote them (first-written gradients left unwritten: 0 expected).
struct GradZeroCounts {
  std::size_t at_begin = 0, unwritten = 0;
};

template <class T>
class GradReducer final : public GradEffects {
 public:
  GradReducer(const DpPlan& plan, ModelBuffers<T> model, ZeroShards<T>& shards,
              comm::Communicator& replicas, ExecSpace exec);
  ~GradReducer() override;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void set_tied(TiedEmbeddingSum<T>* tied) { tied_ = tied; }

  void zero_grads() override;
  bool test_grad(int b) override;
  void wait_grad(int b) override;
  void launch_grad(int b, int buffer) override;
  void bind_grad_buffer(int b, int buffer, std::size_t elems, bool grown) override;
  void sum_tied_in_buffer(int b, int buffer) override;
  void sum_tied_in_grads() override;

  const CommStats& stats() const { return stats_; }
  const GradZeroCounts& zero_counts() const { return zeroed_; }
  void reset_stats() { stats_ = CommStats{}; }
  // The pool buffers allocated so far: DpPolicy's grad_pool() in bytes, which is what the
  // planner predicts by replaying the policy.
  std::size_t pool_bytes() const;

 private:
  struct Op {
    comm::Request req;
    double t_launch = 0;
  };
  const DpPlan& plan_;
  ModelBuffers<T> model_;
  ZeroShards<T>& shards_;
  comm::Communicator& replicas_;
  ExecSpace exec_;
  TiedEmbeddingSum<T>* tied_ = nullptr;
  Timer clock_;
  std::vector<Op> ops_;          // one per bucket
  std::vector<View1<T>> pool_;   // ZeRO 2/3 bucket buffers, by BufferPlan id
  CommStats stats_;
  GradZeroCounts zeroed_;
};

}  // namespace meshtrain::parallel
