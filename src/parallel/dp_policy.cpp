#include "meshtrain/parallel/dp_policy.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

// ---- BufferPlan ----

BufferPlan::Taken BufferPlan::acquire(std::size_t elems) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(size_.size()); ++i)
    if (!busy_[i] && size_[i] >= elems && (best < 0 || size_[i] < size_[best])) best = i;
  bool grown = false;
  if (best < 0) {
    size_.push_back(elems);
    busy_.push_back(false);
    best = static_cast<int>(size_.size()) - 1;
    grown = true;
  }
  busy_[best] = true;
  return {best, grown};
}

bool BufferPlan::has_free(std::size_t elems) const {
  for (std::size_t i = 0; i < size_.size(); ++i)
    if (!busy_[i] && size_[i] >= elems) return true;
  return false;
}

std::size_t BufferPlan::total_elems() const {
  std::size_t s = 0;
  for (auto v : size_) s += v;
  return s;
}

// ---- the plan ----

DpLayout make_dp_layout(const model::ParameterRegistry& reg, std::size_t elem_bytes,
                        const DpOptions& opt, int dp, int ep) {
  MESHTRAIN_CONFIG_CHECK(opt.zero_stage >= 0 && opt.zero_stage <= 3, "zero.stage=",
                         opt.zero_stage, " must be 0, 1, 2 or 3");
  MESHTRAIN_CONFIG_CHECK(opt.bucket_bytes > 0, "dp.bucket_mb must be positive");
  DpLayout out;
  DpPlan& p = out.plan;
  p.zero_stage = opt.zero_stage;
  p.dp = dp;
  p.overlap = opt.overlap;
  // Only over the full gradient buffer: at ZeRO 2/3 a unit's gradients are pool buffers rebound
  // and zeroed per bucket and micro-batch (bind_grad_buffer), which the model cannot claim.
  p.first_write = opt.zero_stage <= 1 && !opt.zero_grads_always;
  const auto& units = reg.units();
  MESHTRAIN_CHECK(!units.empty(), "make_dp_layout: the model has no units");
  // Dense units reduce over dp; MoE expert units over the expert-data-parallel group (the dp
  // ranks holding the same experts: dp / ep of them, stride ep in dp).
  MESHTRAIN_CHECK(ep >= 1 && dp % ep == 0, "make_dp_layout: mesh.ep=", ep, " does not divide dp=",
                  dp);
  p.buckets = plan_buckets(units, elem_bytes, opt.bucket_bytes, opt.zero_stage == 3);
  p.unit_bucket.assign(units.size(), -1);
  p.partner.assign(units.size(), -1);
  std::vector<FlatRange> groups;
  std::vector<int> strides;
  for (int b = 0; b < static_cast<int>(p.buckets.size()); ++b) {
    for (int u = p.buckets[b].first_unit; u <= p.buckets[b].last_unit; ++u) p.unit_bucket[u] = b;
    groups.push_back(p.buckets[b].range);
    const bool expert = units[p.buckets[b].first_unit].group == model::ParamGroup::expert_dp;
    strides.push_back(expert ? ep : 1);
    p.bucket_expert.push_back(expert);
  }
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    if (units[u].group == model::ParamGroup::expert_dp) {
      const int d = reg.unit_of_layer(units[u].layer);
      p.partner[u] = d;
      p.partner[d] = u;
    }
  out.partition = ZeroPartition(groups, dp, strides);
  for (const auto& b : p.buckets) {
    const ZeroGroup& zg = out.partition.groups()[out.partition.group_of(b.range.begin)];
    p.bucket_piece.push_back(zg.piece);
    p.bucket_ranks.push_back(zg.ranks);
  }
  p.embedding_unit = reg.embedding_unit();
  p.head_unit = reg.head_unit();
  // The head reads wte (tied LM head): the unit holding wte stays gathered, and its gradient
  // storage bound, from its first use in a micro-batch to its after_backward.
  p.tied_unit = p.head_unit >= 0 && reg.tied_head() ? p.embedding_unit : -1;
  return out;
}

// ---- DpPolicy ----

DpPolicy::DpPolicy(DpPlan plan, GradEffects& grads, GatherEffects* gather)
    : plan_(std::move(plan)), grads_(grads), gather_(gather) {
  MESHTRAIN_CHECK(plan_.zero_stage < 3 || gather_, "DpPolicy: ZeRO-3 needs parameter gathers");
  const std::size_t B = plan_.buckets.size(), U = plan_.unit_bucket.size();
  pending_.assign(B, 0);
  done_.assign(B, 0);
  launched_.assign(B, false);
  grad_ops_.resize(B);
  grad_buf_.assign(B, -1);
  inflight_buf_.assign(B, -1);
  gather_ops_.resize(U);
  param_buf_.assign(U, -1);
  reset_counts();
}

void DpPolicy::set_tied_sum(bool summed) {
  MESHTRAIN_CHECK(!summed || plan_.embedding_unit >= 0,
                  "DpPolicy: the tied wte is summed but this rank holds no wte");
  tied_summed_ = summed;
  deferred_ = summed && plan_.zero_stage >= 2
                  ? plan_.unit_bucket[static_cast<std::size_t>(plan_.embedding_unit)]
                  : -1;
}

// MPI progresses non-blocking collectives only inside MPI calls: testing them at every hook is
// what lets them advance while backward computes.
void DpPolicy::poll() {
  for (int b = 0; b < static_cast<int>(grad_ops_.size()); ++b)
    if (grad_ops_[b].active && grads_.test_grad(b)) {
      grad_ops_[b].active = false;
      complete_bucket(b);  // its pool buffer is free again
    }
  for (int u = 0; u < static_cast<int>(gather_ops_.size()); ++u)
    if (gather_ops_[u].active && gather_->test_gather(u)) gather_ops_[u].active = false;
}

void DpPolicy::wait_grad_op(int b) {
  if (!grad_ops_[b].active) return;
  grads_.wait_grad(b);
  grad_ops_[b].active = false;
}

void DpPolicy::wait_gather_op(int u) {
  if (!gather_ops_[u].active) return;
  gather_->wait_gather(u);
  gather_ops_[u].active = false;
}

void DpPolicy::complete_bucket(int b) {
  if (inflight_buf_[b] >= 0) {
    grad_pool_.release(inflight_buf_[b]);
    inflight_buf_[b] = -1;
  }
}

void DpPolicy::reset_counts() {
  for (int b = 0; b < static_cast<int>(plan_.buckets.size()); ++b) pending_[b] = plan_.units_in(b);
  std::fill(done_.begin(), done_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
}

// ---- gradients ----

void DpPolicy::ensure_grad_buffer(int b) {
  if (grad_buf_[b] >= 0) return;
  const std::size_t need = plan_.bucket_piece[b] * static_cast<std::size_t>(plan_.bucket_ranks[b]);
  // A small pool: at most two buckets in flight (three with the tied embedding's, which stays
  // bound through the whole backward); beyond that wait for the oldest.
  const std::size_t limit = plan_.tied_unit >= 0 ? 3 : 2;
  poll();
  while (!grad_pool_.has_free(need) && grad_pool_.count() >= limit) {
    int oldest = -1;
    for (int i = 0; i < static_cast<int>(grad_ops_.size()); ++i)
      if (grad_ops_[i].active && (oldest < 0 || grad_ops_[i].seq < grad_ops_[oldest].seq))
        oldest = i;
    if (oldest < 0) break;
    wait_grad_op(oldest);
    complete_bucket(oldest);
  }
  const BufferPlan::Taken t = grad_pool_.acquire(need);
  grad_buf_[b] = t.id;
  grads_.bind_grad_buffer(b, t.id, need, t.grown);
}

void DpPolicy::launch(int b) {
  launched_[b] = true;
  // The previous launch of this bucket (an earlier micro-batch's reduce-scatter, which writes the
  // shard slice this one adds) completes first.
  wait_grad_op(b);
  int buffer = -1;
  if (plan_.zero_stage >= 2) {
    complete_bucket(b);
    MESHTRAIN_CHECK(grad_buf_[b] >= 0, "DpPolicy: bucket ", b, " completed without storage");
    buffer = grad_buf_[b];
  }
  grads_.launch_grad(b, buffer);
  grad_ops_[b] = OpState{true, ++seq_};
  if (plan_.zero_stage >= 2) {
    inflight_buf_[b] = grad_buf_[b];
    grad_buf_[b] = -1;
  }
  if (!plan_.overlap) {
    wait_grad_op(b);
    complete_bucket(b);
  }
}

void DpPolicy::begin_step() {
  grads_.zero_grads();
  reset_counts();
}

void DpPolicy::finish() {
  poll();
  const int B = static_cast<int>(plan_.buckets.size());
  // What the hooks have not launched goes now: at ZeRO 0/1 buckets of a model run without hooks
  // (or without set_last_micro); at 2/3 a bucket spanning two chunks of an interleaved pipeline,
  // whose units completed passes of different micro-batches (still a correct sum: every pass
  // lands in exactly one launch).
  if (deferred_ >= 0 && grad_buf_[deferred_] >= 0)
    grads_.sum_tied_in_buffer(deferred_, grad_buf_[deferred_]);
  for (int b = 0; b < B; ++b)
    if (plan_.zero_stage <= 1 ? !launched_[b] : grad_buf_[b] >= 0) launch(b);
  for (int b = 0; b < B; ++b) {
    wait_grad_op(b);
    complete_bucket(b);
  }
  reset_counts();
  if (tied_summed_ && plan_.zero_stage <= 1) grads_.sum_tied_in_grads();
  if (plan_.zero_stage == 3) release_all_params();
}

// ---- ZeRO-3 parameters ----

void DpPolicy::start_gather(int u) {
  if (param_buf_[u] >= 0) return;  // gathered or in flight
  const int b = plan_.unit_bucket[u];
  const std::size_t need = plan_.bucket_piece[b] * static_cast<std::size_t>(plan_.bucket_ranks[b]);
  const BufferPlan::Taken t = param_pool_.acquire(need);
  param_buf_[u] = t.id;
  gather_->start_gather(u, t.id, need, t.grown);
  gather_ops_[u] = OpState{true, ++seq_};
  if (!plan_.overlap) wait_gather_op(u);
}

void DpPolicy::ensure_params(int u) {
  start_gather(u);
  wait_gather_op(u);
  gather_->bind_params(u, param_buf_[u]);
}

void DpPolicy::release_params(int u) {
  if (param_buf_[u] < 0) return;
  // Kernels queued on the instance may still read the buffer; the next collective that writes
  // it orders itself after them (the communicator's contract), so it can go back to the pool.
  wait_gather_op(u);
  param_pool_.release(param_buf_[u]);
  param_buf_[u] = -1;
  gather_->unbind_params(u);
}

void DpPolicy::release_all_params() {
  if (plan_.zero_stage < 3) return;
  for (int u = 0; u < plan_.n_units(); ++u) release_params(u);
}

void DpPolicy::keep_only(int a, int b) {
  // A unit's partner (an MoE block and its experts) is in use with it.
  const int pa = a >= 0 ? plan_.partner[a] : -1;
  for (int u = 0; u < plan_.n_units(); ++u)
    if (u != a && u != b && u != pa && u != plan_.tied_unit) release_params(u);
}

// ---- hooks ----

// The model calls before_forward/before_backward of the tied embedding unit from inside the head
// too (the head reads wte and writes its gradient): those calls only make the unit available and
// leave the walk's gathered set and prefetch alone.
void DpPolicy::before_forward(int u) {
  poll();
  if (plan_.zero_stage < 3) return;
  ensure_params(u);
  const int next = u + 1 < plan_.n_units() ? u + 1 : -1;
  if (u == plan_.tied_unit) {
    // The embedding's own forward (the head is not gathered yet): prefetch the first block.
    if (plan_.head_unit >= 0 && param_buf_[plan_.head_unit] < 0 && next >= 0 &&
        next != plan_.head_unit)
      start_gather(next);
    return;
  }
  keep_only(u, next);
  if (next >= 0) start_gather(next);  // prefetch while this unit computes
}

void DpPolicy::before_backward(int u) {
  poll();
  if (plan_.zero_stage == 3) {
    ensure_params(u);
    if (u != plan_.tied_unit) {
      const int next = u - 1 >= 0 && u - 1 != plan_.tied_unit ? u - 1 : -1;
      keep_only(u, next);
      if (next >= 0) start_gather(next);
    }
  }
  if (plan_.zero_stage >= 2) ensure_grad_buffer(plan_.unit_bucket[u]);
}

void DpPolicy::after_backward(int u) {
  poll();
  const int b = plan_.unit_bucket[u];
  const int units = plan_.units_in(b);
  ++done_[b];
  if (--pending_[b] == 0) {
    pending_[b] = units;
    if ((plan_.zero_stage >= 2 && b != deferred_) || (n_micro_ == 0 && last_micro_)) launch(b);
  }
  if (plan_.zero_stage <= 1 && n_micro_ > 0 && done_[b] == units * n_micro_) launch(b);
  if (plan_.zero_stage == 3) release_params(u);
}

}  // namespace meshtrain::parallel
