#include "meshtrain/parallel/param_gatherer.hpp"

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

template <class T>
ParamGatherer<T>::ParamGatherer(const DpPlan& plan, ModelBuffers<T> model, ZeroShards<T>& shards,
                                comm::Communicator& replicas)
    : plan_(plan), model_(std::move(model)), shards_(shards), replicas_(replicas) {
  MESHTRAIN_CHECK(static_cast<bool>(model_.bind_unit),
                  "ParamGatherer: ZeRO-3 binds per-unit storage and needs the model's bind_unit");
  ops_.resize(static_cast<std::size_t>(plan_.n_units()));
  bound_.resize(static_cast<std::size_t>(plan_.n_units()));
}

template <class T>
ParamGatherer<T>::~ParamGatherer() {
  for (auto& op : ops_) op.req = comm::Request();
}

template <class T>
bool ParamGatherer<T>::test_gather(int u) {
  Op& op = ops_[u];
  if (!op.req.test()) return false;
  stats_.total_seconds += clock_.seconds() - op.t_launch;
  return true;
}

template <class T>
void ParamGatherer<T>::wait_gather(int u) {
  Op& op = ops_[u];
  const double t0 = clock_.seconds();
  op.req.wait();
  const double t1 = clock_.seconds();
  stats_.exposed_seconds += t1 - t0;
  stats_.total_seconds += t1 - op.t_launch;
}

template <class T>
void ParamGatherer<T>::start_gather(int u, int buffer, std::size_t elems, bool grown) {
  if (grown) {
    MESHTRAIN_CHECK(buffer == static_cast<int>(pool_.size()), "ParamGatherer: pool grew to ",
                    buffer, " with ", pool_.size(), " buffers");
    pool_.push_back(alloc<T>("zero.param_gather", elems));
  }
  const ZeroPartition& part = shards_.partition();
  const int g = part.group_of(model_.registry->units()[u].begin);
  const ZeroGroup& zg = part.groups()[g];
  Op& op = ops_[u];
  op.t_launch = clock_.seconds();
  op.req = shards_.comm_of(g).iall_gather(slice(shards_.shard_params(), zg.shard_offset, zg.piece),
                           slice(pool_[buffer], 0, elems));
  stats_.exposed_seconds += clock_.seconds() - op.t_launch;
  stats_.bytes += elems * sizeof(T);
  ++stats_.ops;
}

template <class T>
void ParamGatherer<T>::bind_params(int u, int buffer) {
  const View1<T>& buf = pool_[buffer];
  if (bound_[u].data() == buf.data()) return;
  bound_[u] = slice(buf, 0, model_.registry->units()[u].size());
  model_.bind_unit(u, bound_[u], View1<T>());
}

template <class T>
void ParamGatherer<T>::unbind_params(int u) {
  bound_[u] = View1<T>();  // the model keeps its stale binding until the next gather
}

template <class T>
std::size_t ParamGatherer<T>::pool_bytes() const {
  std::size_t b = 0;
  for (const auto& v : pool_) b += v.span() * sizeof(T);
  return b;
}

template class ParamGatherer<float>;
#if MESHTRAIN_HAVE_BF16
template class ParamGatherer<bf16>;
template class ParamGatherer<fp16>;
#endif

}  // namespace meshtrain::parallel
