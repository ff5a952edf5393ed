#include "meshtrain/parallel/grad_sync.hpp"

#include <algorithm>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

CommStats& CommStats::operator+=(const CommStats& o) {
  total_seconds += o.total_seconds;
  exposed_seconds += o.exposed_seconds;
  ops += o.ops;
  bytes += o.bytes;
  return *this;
}

namespace {

// dst(i) += src(i). A free function: CUDA lambdas cannot live in private member functions.
template <class T>
void accumulate(const ExecSpace& exec, View1<T> dst, View1<T> src) {
  Kokkos::parallel_for(
      "meshtrain::zero_grad_accumulate",
      Kokkos::RangePolicy<ExecSpace>(exec, 0, static_cast<std::int64_t>(dst.span())),
      KOKKOS_LAMBDA(const std::int64_t i) { dst(i) += src(i); });
}

}  // namespace

namespace detail {

template <class T>
int BufferPool<T>::acquire(std::size_t n) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(bufs_.size()); ++i)
    if (!busy_[i] && bufs_[i].span() >= n && (best < 0 || bufs_[i].span() < bufs_[best].span()))
      best = i;
  if (best < 0) {
    bufs_.push_back(alloc<T>(label_, n));
    busy_.push_back(false);
    best = static_cast<int>(bufs_.size()) - 1;
  }
  busy_[best] = true;
  return best;
}

template <class T>
bool BufferPool<T>::has_free(std::size_t n) const {
  for (std::size_t i = 0; i < bufs_.size(); ++i)
    if (!busy_[i] && bufs_[i].span() >= n) return true;
  return false;
}

template <class T>
std::size_t BufferPool<T>::bytes() const {
  std::size_t b = 0;
  for (const auto& v : bufs_) b += v.span() * sizeof(T);
  return b;
}

}  // namespace detail

template <class T>
GradSync<T>::GradSync(ModelBuffers<T> model, comm::Communicator& dp, const DpOptions& opt,
                      ExecSpace exec)
    : model_(std::move(model)),
      dp_(dp),
      opt_(opt),
      exec_(exec),
      part_(std::size_t{0}, 1),
      whole_(model_.registry ? model_.registry->size() : 0, 1),
      grad_pool_("zero.grad_bucket"),
      param_pool_("zero.param_gather") {
  const char* fn = "GradSync";
  MESHTRAIN_CHECK(model_.registry, fn, ": no parameter registry");
  MESHTRAIN_CONFIG_CHECK(opt_.zero_stage >= 0 && opt_.zero_stage <= 3, "zero.stage=",
                         opt_.zero_stage, " must be 0, 1, 2 or 3");
  MESHTRAIN_CONFIG_CHECK(opt_.bucket_bytes > 0, "zero.bucket_mb must be positive");
  const int U = n_units();
  MESHTRAIN_CHECK(U > 0, fn, ": the model has no units");
  const std::size_t n = model_.registry->size();
  const int stage = opt_.zero_stage;
  if (stage <= 1)
    MESHTRAIN_CHECK(model_.grads.span() >= n, fn, ": ZeRO-", stage,
                    " needs the model's full gradient buffer (", n, " elements), got ",
                    model_.grads.span());
  if (stage <= 2)
    MESHTRAIN_CHECK(model_.params.span() >= n, fn, ": ZeRO-", stage,
                    " needs the model's full parameter buffer (", n, " elements), got ",
                    model_.params.span());
  if (stage >= 2)
    MESHTRAIN_CHECK(static_cast<bool>(model_.bind_unit), fn, ": ZeRO-", stage,
                    " binds per-unit storage and needs the model's bind_unit");

  buckets_ = plan_buckets(units(), sizeof(T), opt_.bucket_bytes, stage == 3);
  const int B = static_cast<int>(buckets_.size());
  unit_bucket_.assign(U, -1);
  pending_.assign(B, 0);
  done_.assign(B, 0);
  std::vector<FlatRange> groups;
  for (int b = 0; b < B; ++b) {
    for (int u = buckets_[b].first_unit; u <= buckets_[b].last_unit; ++u) unit_bucket_[u] = b;
    pending_[b] = buckets_[b].last_unit - buckets_[b].first_unit + 1;
    groups.push_back(buckets_[b].range);
  }
  part_ = ZeroPartition(groups, dp_.size());
  for (int b = 0; b < B; ++b) bucket_group_.push_back(part_.group_of(buckets_[b].range.begin));

  // The head reads wte (tied LM head): the unit holding wte stays gathered, and its gradient
  // storage bound, from its first use in a micro-batch to its after_backward.
  head_unit_ = model_.registry->head_unit();
  tied_unit_ = head_unit_ >= 0 ? model_.registry->embedding_unit() : -1;

  grad_ops_.resize(B);
  launched_.assign(B, false);
  grad_buf_.assign(B, -1);
  inflight_buf_.assign(B, -1);
  unit_params_.resize(U);
  unit_grads_.resize(U);
  for (int u = 0; u < U; ++u) {
    const model::UnitInfo& r = units()[u];
    if (stage <= 2) unit_params_[u] = slice(model_.params, r.begin, r.size());
    if (stage <= 1) unit_grads_[u] = slice(model_.grads, r.begin, r.size());
  }
  if (stage >= 2) shard_grads_ = zeros<T>("zero.shard_grads", part_.shard_size());
  if (stage == 3) {
    shard_params_ = zeros<T>("zero.shard_params", part_.shard_size());
    param_buf_.assign(U, -1);
    param_ops_.resize(U);
  }
}

template <class T>
GradSync<T>::~GradSync() {
  // Collectives in flight still write pool buffers: finish them before the buffers go.
  for (auto& op : grad_ops_) op.req = comm::Request();
  for (auto& op : param_ops_) op.req = comm::Request();
}

// ---- bookkeeping of operations in flight ----

template <class T>
void GradSync<T>::poll() {
  // MPI progresses non-blocking collectives only inside MPI calls: testing them at every hook is
  // what lets them advance while backward computes.
  for (int b = 0; b < static_cast<int>(grad_ops_.size()); ++b) {
    Op& op = grad_ops_[b];
    if (op.active && op.req.test()) {
      op.active = false;
      grad_stats_.total_seconds += clock_.seconds() - op.t_launch;
      complete_bucket(b);
    }
  }
  for (auto& op : param_ops_) {
    if (op.active && op.req.test()) {
      op.active = false;
      param_stats_.total_seconds += clock_.seconds() - op.t_launch;
    }
  }
}

template <class T>
void GradSync<T>::wait_op(Op& op, CommStats& stats) {
  if (!op.active) return;
  const double t0 = clock_.seconds();
  op.req.wait();
  const double t1 = clock_.seconds();
  stats.exposed_seconds += t1 - t0;
  stats.total_seconds += t1 - op.t_launch;
  op.active = false;
}

template <class T>
void GradSync<T>::complete_bucket(int b) {
  if (inflight_buf_[b] >= 0) {
    grad_pool_.release(inflight_buf_[b]);
    inflight_buf_[b] = -1;
  }
}

template <class T>
void GradSync<T>::rebind(int unit) {
  if (model_.bind_unit) model_.bind_unit(unit, unit_params_[unit], unit_grads_[unit]);
}

// ---- gradients ----

template <class T>
void GradSync<T>::ensure_grad_buffer(int b) {
  if (grad_buf_[b] >= 0) return;
  const std::size_t piece = part_.groups()[bucket_group_[b]].piece;
  const std::size_t need = piece * dp_.size();
  // A small pool: at most two buckets in flight (three with the tied embedding's, which stays
  // bound through the whole backward); beyond that wait for the oldest.
  const std::size_t limit = tied_unit_ >= 0 ? 3 : 2;
  poll();
  while (!grad_pool_.has_free(need) && grad_pool_.count() >= limit) {
    int oldest = -1;
    for (int i = 0; i < static_cast<int>(grad_ops_.size()); ++i)
      if (grad_ops_[i].active && (oldest < 0 || grad_ops_[i].t_launch < grad_ops_[oldest].t_launch))
        oldest = i;
    if (oldest < 0) break;
    wait_op(grad_ops_[oldest], grad_stats_);
    complete_bucket(oldest);
  }
  const int id = grad_pool_.acquire(need);
  grad_buf_[b] = id;
  auto buf = grad_pool_.view(id, need);
  Kokkos::deep_copy(exec_, buf, T(0.0f));  // the model accumulates into its gradients
  const Bucket& bk = buckets_[b];
  for (int u = bk.first_unit; u <= bk.last_unit; ++u) {
    const model::UnitInfo& r = units()[u];
    unit_grads_[u] = slice(buf, r.begin - bk.range.begin, r.size());
    rebind(u);
  }
}

template <class T>
void GradSync<T>::launch(int b) {
  const Bucket& bk = buckets_[b];
  Op& op = grad_ops_[b];
  launched_[b] = true;
  if (opt_.zero_stage <= 1) {
    wait_op(op, grad_stats_);
    auto g = slice(model_.grads, bk.range.begin, bk.range.size());
    op.t_launch = clock_.seconds();
    op.req = dp_.iall_reduce(g);
    grad_stats_.bytes += g.span() * sizeof(T);
  } else {
    // The previous micro-batch's reduce-scatter of this bucket writes the shard slice we add.
    wait_op(op, grad_stats_);
    complete_bucket(b);
    MESHTRAIN_CHECK(grad_buf_[b] >= 0, "GradSync: bucket ", b, " completed without storage");
    const ZeroGroup& zg = part_.groups()[bucket_group_[b]];
    const std::size_t piece = zg.piece, soff = zg.shard_offset;
    const std::size_t mine = static_cast<std::size_t>(dp_.rank()) * piece;
    auto buf = grad_pool_.view(grad_buf_[b], piece * dp_.size());
    auto shard = slice(shard_grads_, soff, piece);
    // Accumulation over micro-batches: this rank adds its running shard to its own block, so
    // the reduce-scatter's sum is the running total (no second buffer, no add afterwards).
    accumulate<T>(exec_, slice(buf, mine, piece), shard);
    op.t_launch = clock_.seconds();
    op.req = dp_.ireduce_scatter(buf, shard);
    grad_stats_.bytes += buf.span() * sizeof(T);
    inflight_buf_[b] = grad_buf_[b];
    grad_buf_[b] = -1;
  }
  op.active = true;
  ++grad_stats_.ops;
  grad_stats_.exposed_seconds += clock_.seconds() - op.t_launch;
  if (!opt_.overlap) {
    wait_op(op, grad_stats_);
    complete_bucket(b);
  }
}

template <class T>
void GradSync<T>::reset_counts() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    pending_[b] = buckets_[b].last_unit - buckets_[b].first_unit + 1;
  std::fill(done_.begin(), done_.end(), 0);
  std::fill(launched_.begin(), launched_.end(), false);
}

template <class T>
void GradSync<T>::begin_step() {
  if (opt_.zero_stage <= 1) Kokkos::deep_copy(exec_, model_.grads, T(0.0f));
  else Kokkos::deep_copy(exec_, shard_grads_, T(0.0f));
  reset_counts();
}

template <class T>
void GradSync<T>::finish() {
  poll();
  const int B = static_cast<int>(buckets_.size());
  // What the hooks have not launched goes now: at ZeRO 0/1 buckets of a model run without hooks
  // (or without set_last_micro); at 2/3 a bucket spanning two chunks of an interleaved pipeline,
  // whose units completed passes of different micro-batches (still a correct sum: every pass
  // lands in exactly one launch).
  if (deferred_bucket_ >= 0 && grad_buf_[deferred_bucket_] >= 0) {
    // The tied wte: summed over the embedding group in the bucket buffer, then reduce-scattered.
    const auto& wte = model_.registry->get("transformer.wte.weight");
    const Bucket& bk = buckets_[deferred_bucket_];
    auto buf = grad_pool_.full(grad_buf_[deferred_bucket_]);
    const Timer t;
    embedding_->all_reduce(slice(buf, wte.offset - bk.range.begin, wte.numel));
    grad_stats_.total_seconds += t.seconds();
    grad_stats_.exposed_seconds += t.seconds();
    grad_stats_.bytes += wte.numel * sizeof(T);
    ++grad_stats_.ops;
  }
  for (int b = 0; b < B; ++b) {
    if (opt_.zero_stage <= 1 ? !launched_[b] : grad_buf_[b] >= 0) launch(b);
  }
  for (int b = 0; b < B; ++b) {
    wait_op(grad_ops_[b], grad_stats_);
    complete_bucket(b);
  }
  reset_counts();
  if (embedding_ && embedding_->size() > 1 && opt_.zero_stage <= 1) {
    const auto& wte = model_.registry->get("transformer.wte.weight");
    const Timer t;
    embedding_->all_reduce(slice(model_.grads, wte.offset, wte.numel));
    grad_stats_.total_seconds += t.seconds();
    grad_stats_.exposed_seconds += t.seconds();
    grad_stats_.bytes += wte.numel * sizeof(T);
    ++grad_stats_.ops;
  }
  if (opt_.zero_stage == 3)
    for (int u = 0; u < n_units(); ++u) release_params(u);
}

template <class T>
void GradSync<T>::set_embedding_group(comm::Communicator* embedding) {
  deferred_bucket_ = -1;
  if (embedding && embedding->size() > 1) {
    MESHTRAIN_CHECK(model_.registry->find("transformer.wte.weight"),
                    "set_embedding_group: this rank holds no wte");
    if (opt_.zero_stage >= 2) deferred_bucket_ = bucket_of(model_.registry->embedding_unit());
  }
  embedding_ = embedding;
}

// ---- ZeRO-3 parameters ----

template <class T>
void GradSync<T>::start_gather(int unit) {
  if (param_buf_[unit] >= 0) return;  // gathered or in flight
  const ZeroGroup& zg = part_.groups()[bucket_group_[bucket_of(unit)]];
  const std::size_t need = zg.piece * dp_.size();
  const int id = param_pool_.acquire(need);
  param_buf_[unit] = id;
  Op& op = param_ops_[unit];
  op.t_launch = clock_.seconds();
  op.req = dp_.iall_gather(slice(shard_params_, zg.shard_offset, zg.piece),
                           param_pool_.view(id, need));
  op.active = true;
  param_stats_.exposed_seconds += clock_.seconds() - op.t_launch;
  param_stats_.bytes += need * sizeof(T);
  ++param_stats_.ops;
  if (!opt_.overlap) wait_op(op, param_stats_);
}

template <class T>
void GradSync<T>::ensure_params(int unit) {
  start_gather(unit);
  wait_op(param_ops_[unit], param_stats_);
  auto buf = param_pool_.full(param_buf_[unit]);
  if (unit_params_[unit].data() != buf.data()) {
    unit_params_[unit] = slice(buf, 0, units()[unit].size());
    rebind(unit);
  }
}

template <class T>
void GradSync<T>::release_params(int unit) {
  if (param_buf_[unit] < 0) return;
  // Kernels queued on the instance may still read the buffer; the next collective that writes
  // it orders itself after them (the communicator's contract), so it can go back to the pool.
  wait_op(param_ops_[unit], param_stats_);
  param_pool_.release(param_buf_[unit]);
  param_buf_[unit] = -1;
  unit_params_[unit] = View1<T>();  // the model keeps its stale binding until the next gather
}

template <class T>
void GradSync<T>::keep_only(int a, int b) {
  for (int u = 0; u < static_cast<int>(param_buf_.size()); ++u)
    if (u != a && u != b && u != tied_unit_) release_params(u);
}

// ---- hooks ----

// The model calls before_forward/before_backward of the tied embedding unit from inside the head
// too (the head reads wte and writes its gradient): those calls only make the unit available and
// leave the walk's gathered set and prefetch alone. The unit stays gathered from its first use
// in a micro-batch to its after_backward.
template <class T>
void GradSync<T>::before_forward(int unit) {
  poll();
  if (opt_.zero_stage < 3) return;
  ensure_params(unit);
  const int next = unit + 1 < n_units() ? unit + 1 : -1;
  if (unit == tied_unit_) {
    // The embedding's own forward (the head is not gathered yet): prefetch the first block.
    if (head_unit_ >= 0 && param_buf_[head_unit_] < 0 && next >= 0 && next != head_unit_)
      start_gather(next);
    return;
  }
  keep_only(unit, next);
  if (next >= 0) start_gather(next);  // prefetch while this unit computes
}

template <class T>
void GradSync<T>::before_backward(int unit) {
  poll();
  if (opt_.zero_stage == 3) {
    ensure_params(unit);
    if (unit != tied_unit_) {
      const int next = unit - 1 >= 0 && unit - 1 != tied_unit_ ? unit - 1 : -1;
      keep_only(unit, next);
      if (next >= 0) start_gather(next);
    }
  }
  if (opt_.zero_stage >= 2) ensure_grad_buffer(bucket_of(unit));
}

template <class T>
void GradSync<T>::after_backward(int unit) {
  poll();
  const int b = bucket_of(unit);
  const int units = buckets_[b].last_unit - buckets_[b].first_unit + 1;
  ++done_[b];
  if (--pending_[b] == 0) {
    pending_[b] = units;
    if ((opt_.zero_stage >= 2 && b != deferred_bucket_) || (n_micro_ == 0 && last_micro_))
      launch(b);
  }
  if (opt_.zero_stage <= 1 && n_micro_ > 0 && done_[b] == units * n_micro_) launch(b);
  if (opt_.zero_stage == 3) release_params(unit);
}

// ---- parameters after the step, and whole-buffer transfers ----

template <class T>
void GradSync<T>::gather_groups(View1<const T> src, optim::Index where, View1<T> dst) {
  const int P = dp_.size(), me = dp_.rank();
  std::size_t max_piece = 0;
  for (const auto& g : part_.groups()) max_piece = std::max(max_piece, g.piece);
  if (stage_send_.span() < max_piece) {
    stage_send_ = alloc<T>("zero.gather_send", max_piece);
    stage_recv_ = alloc<T>("zero.gather_recv", max_piece * P);
  }
  const Timer t;
  for (int g = 0; g < static_cast<int>(part_.groups().size()); ++g) {
    const ZeroGroup& zg = part_.groups()[g];
    const FlatRange pc = part_.piece(g, me);
    auto send = slice(stage_send_, 0, zg.piece);
    auto recv = slice(stage_recv_, 0, zg.piece * P);
    Kokkos::deep_copy(exec_, send, T(0.0f));
    if (pc.size()) {
      const std::size_t from = where == optim::Index::flat ? pc.begin : zg.shard_offset;
      Kokkos::deep_copy(exec_, slice(send, 0, pc.size()), slice(src, from, pc.size()));
    }
    dp_.all_gather(send, recv);
    Kokkos::deep_copy(exec_, slice(dst, zg.range.begin, zg.range.size()),
                      slice(recv, 0, zg.range.size()));
    param_stats_.bytes += recv.span() * sizeof(T);
    ++param_stats_.ops;
  }
  exec_.fence();
  param_stats_.total_seconds += t.seconds();
  param_stats_.exposed_seconds += t.seconds();
}

template <class T>
void GradSync<T>::gather_updated_params() {
  // With one rank the update already is the whole buffer.
  if ((opt_.zero_stage == 1 || opt_.zero_stage == 2) && dp_.size() > 1)
    gather_groups(model_.params, optim::Index::flat, model_.params);
}

template <class T>
void GradSync<T>::params_updated() {
  if (opt_.zero_stage == 3)
    for (int u = 0; u < n_units(); ++u) release_params(u);
}

template <class T>
void GradSync<T>::scatter_params(View1<const T> full) {
  if (opt_.zero_stage < 3) {
    if (full.data() != model_.params.data()) Kokkos::deep_copy(exec_, model_.params, full);
    return;
  }
  const int me = dp_.rank();
  for (int g = 0; g < static_cast<int>(part_.groups().size()); ++g) {
    const FlatRange pc = part_.piece(g, me);
    if (pc.size())
      Kokkos::deep_copy(exec_, slice(shard_params_, part_.groups()[g].shard_offset, pc.size()),
                        slice(full, pc.begin, pc.size()));
  }
  exec_.fence();
  params_updated();
}

template <class T>
void GradSync<T>::gather_params(View1<T> full) {
  if (opt_.zero_stage < 3) {
    Kokkos::deep_copy(exec_, full, model_.params);
    return;
  }
  gather_groups(shard_params_, optim::Index::shard, full);
}

// ---- the optimizer's view ----

template <class T>
std::vector<optim::ShardPiece> GradSync<T>::optimizer_pieces() const {
  const ZeroPartition& p = optimizer_partition();
  std::vector<optim::ShardPiece> out;
  for (int g = 0; g < static_cast<int>(p.groups().size()); ++g) {
    const FlatRange pc = p.piece(g, optimizer_rank());
    out.push_back(optim::ShardPiece{pc.begin, p.groups()[g].shard_offset, pc.size()});
  }
  return out;
}

template <class T>
std::vector<optim::ShardRange> GradSync<T>::optimizer_ranges() const {
  // Consecutive parameters of one piece with the same decay and norm flags form one range; the
  // alignment gaps between them hold zeros in parameters and gradients, which AdamW keeps zero.
  std::vector<optim::ShardRange> out;
  int last_group = -1;
  for (const auto& s : optimizer_partition().segments(*model_.registry, optimizer_rank())) {
    const bool counted = model_.registry->counts_in_norm(*s.param);
    if (!out.empty() && last_group == s.group && out.back().decay == s.param->decay &&
        out.back().counted == counted) {
      out.back().length = s.flat_begin + s.size() - out.back().flat;
    } else {
      out.push_back(optim::ShardRange{s.flat_begin, s.shard_offset, s.size(), s.param->decay,
                                      counted});
    }
    last_group = s.group;
  }
  return out;
}

template <class T>
View1<T> GradSync<T>::optimizer_grads() const {
  return opt_.zero_stage <= 1 ? model_.grads : shard_grads_;
}
template <class T>
optim::Index GradSync<T>::optimizer_grads_index() const {
  return opt_.zero_stage <= 1 ? optim::Index::flat : optim::Index::shard;
}
template <class T>
View1<T> GradSync<T>::optimizer_params() const {
  return opt_.zero_stage <= 2 ? model_.params : shard_params_;
}
template <class T>
optim::Index GradSync<T>::optimizer_params_index() const {
  return opt_.zero_stage <= 2 ? optim::Index::flat : optim::Index::shard;
}

template <class T>
typename GradSync<T>::Bytes GradSync<T>::bytes() const {
  Bytes b;
  b.shard_params = shard_params_.span() * sizeof(T);
  b.shard_grads = shard_grads_.span() * sizeof(T);
  b.grad_buffers = grad_pool_.bytes();
  b.param_buffers = param_pool_.bytes() + (stage_send_.span() + stage_recv_.span()) * sizeof(T);
  return b;
}

template class detail::BufferPool<float>;
template class GradSync<float>;
#if MESHTRAIN_HAVE_BF16
template class detail::BufferPool<bf16>;
template class GradSync<bf16>;
template class detail::BufferPool<fp16>;
template class GradSync<fp16>;
#endif

}  // namespace meshtrain::parallel
