#include "meshtrain/parallel/zero_optimizer.hpp"

#include "meshtrain/core/timer.hpp"

namespace meshtrain::parallel {

template <class T>
ZeroOptimizer<T>::ZeroOptimizer(GradSync<T>& sync, const optim::AdamWConfig& cfg,
                                comm::Communicator* model_parallel, ExecSpace exec)
    : sync_(sync),
      mp_(model_parallel),
      opt_(sync.optimizer_pieces(), sync.optimizer_ranges(),
           sync.optimizer_partition().shard_size(), cfg,
           sync.options().offload ? optim::StatePlacement::host : optim::StatePlacement::device,
           exec, sync.options().offload_threads) {}

template <class T>
void ZeroOptimizer<T>::init_master() {
  opt_.init_master(sync_.optimizer_params(), sync_.optimizer_params_index());
}

template <class T>
bool ZeroOptimizer<T>::step(std::int64_t step, float loss_scale, bool check_finite) {
  auto sumsq = opt_.local_sumsq(sync_.optimizer_grads(), sync_.optimizer_grads_index());
  const Timer t;
  if (sync_.sharded() && sync_.dp().size() > 1) sync_.dp().all_reduce(sumsq);
  if (mp_ && mp_->size() > 1) mp_->all_reduce(sumsq);
  comm_seconds_ = t.seconds();
  const bool applied =
      opt_.apply(sync_.optimizer_params(), sync_.optimizer_params_index(),
                 sync_.optimizer_grads(), sync_.optimizer_grads_index(), step, loss_scale,
                 check_finite);
  // Every rank skips or applies alike (the norm is global), so the gather is collective-safe.
  if (applied) {
    sync_.params_updated();
    const Timer g;
    sync_.gather_updated_params();
    comm_seconds_ += g.seconds();
  }
  return applied;
}

template class ZeroOptimizer<float>;
#if MESHTRAIN_HAVE_BF16
template class ZeroOptimizer<bf16>;
template class ZeroOptimizer<fp16>;
#endif

}  // namespace meshtrain::parallel
