#include "meshtrain/parallel/grad_reducer.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

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

template <class T>
GradReducer<T>::GradReducer(const DpPlan& plan, ModelBuffers<T> model, ZeroShards<T>& shards,
                            comm::Communicator& replicas, ExecSpace exec)
    : plan_(plan), model_(std::move(model)), shards_(shards), replicas_(replicas), exec_(exec) {
  const std::size_t n = model_.registry->size();
  if (plan_.zero_stage <= 1)
    MESHTRAIN_CHECK(model_.grads.span() >= n, "GradReducer: ZeRO-", plan_.zero_stage,
                    " needs the model's full gradient buffer (", n, " elements), got ",
                    model_.grads.span());
  if (plan_.zero_stage >= 2)
    MESHTRAIN_CHECK(static_cast<bool>(model_.bind_unit), "GradReducer: ZeRO-", plan_.zero_stage,
                    " binds per-unit storage and needs the model's bind_unit");
  ops_.resize(plan_.buckets.size());
}

template <class T>
GradReducer<T>::~GradReducer() {
  // Collectives in flight still write pool buffers: finish them before the buffers go.
  for (auto& op : ops_) op.req = comm::Request();
}

template <class T>
void GradReducer<T>::zero_grads() {
  zeroed_ = GradZeroCounts{};
  if (plan_.zero_stage >= 2) {
    Kokkos::deep_copy(exec_, shards_.shard_grads(), T(0.0f));
    zeroed_.at_begin = shards_.shard_grads().span();
    return;
  }
  model::GradFirstWrite* fw = model_.first_write;
  if (!plan_.first_write || fw == nullptr) {
    if (fw != nullptr) fw->disarm();  // every gradient write adds to the zeros
    Kokkos::deep_copy(exec_, model_.grads, T(0.0f));
    zeroed_.at_begin = model_.grads.span();
    return;
  }
  // The first-written gradients are overwritten by their first GEMM of the step (beta = 0);
  // everything else, padding included, is zeroed.
  fw->arm();
  auto zero = [&](std::size_t begin, std::size_t n) {
    Kokkos::deep_copy(exec_, slice(model_.grads, begin, n), T(0.0f));
    zeroed_.at_begin += n;
  };
  for (const model::GradRange& r : fw->zero_ranges()) zero(r.begin, r.size());
  const std::size_t n = model_.registry->size();
  if (model_.grads.span() > n) zero(n, model_.grads.span() - n);
}

template <class T>
bool GradReducer<T>::test_grad(int b) {
  Op& op = ops_[b];
  if (!op.req.test()) return false;
  stats_.total_seconds += clock_.seconds() - op.t_launch;
  return true;
}

template <class T>
void GradReducer<T>::wait_grad(int b) {
  Op& op = ops_[b];
  const double t0 = clock_.seconds();
  op.req.wait();
  const double t1 = clock_.seconds();
  stats_.exposed_seconds += t1 - t0;
  stats_.total_seconds += t1 - op.t_launch;
}

template <class T>
void GradReducer<T>::bind_grad_buffer(int b, int buffer, std::size_t elems, bool grown) {
  if (grown) {
    MESHTRAIN_CHECK(buffer == static_cast<int>(pool_.size()), "GradReducer: pool grew to ",
                    buffer, " with ", pool_.size(), " buffers");
    pool_.push_back(alloc<T>("zero.grad_bucket", elems));
  }
  auto buf = slice(pool_[buffer], 0, elems);
  Kokkos::deep_copy(exec_, buf, T(0.0f));  // the model accumulates into its gradients
  const Bucket& bk = plan_.buckets[b];
  const auto& units = model_.registry->units();
  for (int u = bk.first_unit; u <= bk.last_unit; ++u) {
    const model::UnitInfo& r = units[u];
    model_.bind_unit(u, View1<T>(), slice(buf, r.begin - bk.range.begin, r.size()));
  }
}

template <class T>
void GradReducer<T>::launch_grad(int b, int buffer) {
  const Bucket& bk = plan_.buckets[b];
  Op& op = ops_[b];
  if (plan_.zero_stage <= 1) {
    // A first-written gradient that no GEMM wrote this step holds the previous step's values:
    // zero it before it is reduced.
    if (model_.first_write != nullptr)
      for (const model::GradRange& r :
           model_.first_write->take_unwritten(bk.range.begin, bk.range.end)) {
        Kokkos::deep_copy(exec_, slice(model_.grads, r.begin, r.size()), T(0.0f));
        zeroed_.unwritten += r.size();
      }
    auto g = slice(model_.grads, bk.range.begin, bk.range.size());
    op.t_launch = clock_.seconds();
    op.req = shards_.comm_of(shards_.partition().group_of(bk.range.begin)).iall_reduce(g);
    stats_.bytes += g.span() * sizeof(T);
  } else {
    const std::size_t piece = plan_.bucket_piece[b];
    const int g = shards_.partition().group_of(bk.range.begin);
    const ZeroGroup& zg = shards_.partition().groups()[g];
    comm::Communicator& c = shards_.comm_of(g);  // dp, or expert-dp for MoE experts
    const std::size_t mine = static_cast<std::size_t>(c.rank()) * piece;
    auto buf = slice(pool_[buffer], 0, piece * c.size());
    auto shard = slice(shards_.shard_grads(), zg.shard_offset, piece);
    accumulate<T>(exec_, slice(buf, mine, piece), shard);
    op.t_launch = clock_.seconds();
    op.req = c.ireduce_scatter(buf, shard);
    stats_.bytes += buf.span() * sizeof(T);
  }
  ++stats_.ops;
  stats_.exposed_seconds += clock_.seconds() - op.t_launch;
}

template <class T>
void GradReducer<T>::sum_tied_in_buffer(int b, int buffer) {
  const Bucket& bk = plan_.buckets[b];
  tied_->sum_in(pool_[buffer], bk.range.begin, stats_);
}

template <class T>
void GradReducer<T>::sum_tied_in_grads() {
  tied_->sum_in(model_.grads, 0, stats_);
}

template <class T>
std::size_t GradReducer<T>::pool_bytes() const {
  std::size_t b = 0;
  for (const auto& v : pool_) b += v.span() * sizeof(T);
  return b;
}

template class GradReducer<float>;
#if MESHTRAIN_HAVE_BF16
template class GradReducer<bf16>;
template class GradReducer<fp16>;
#endif

}  // namespace meshtrain::parallel
