#include "meshtrain/parallel/zero_optimizer.hpp"

#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/adamw.hpp"

namespace meshtrain::parallel {

namespace {
void add_scalar(const ExecSpace& exec, Scalar<float> dst, Scalar<float> src) {
  Kokkos::parallel_for(
      "meshtrain::zero_norm_add", Kokkos::RangePolicy<ExecSpace>(exec, 0, 1),
      KOKKOS_LAMBDA(const int) { dst() += src(); });
}
}  // namespace

template <class T>
ZeroOptimizer<T>::ZeroOptimizer(GradSync<T>& sync, const optim::AdamWConfig& cfg,
                                comm::Communicator* model_parallel, ExecSpace exec)
    : sync_(sync),
      mp_(model_parallel),
      exec_(exec),
      opt_(sync.optimizer_pieces(), sync.optimizer_ranges(),
           sync.optimizer_partition().shard_size(), cfg,
           sync.options().offload ? optim::StatePlacement::host : optim::StatePlacement::device,
           exec, sync.options().offload_threads) {
  comm::Communicator* ep = sync.ep();
  if (!sync.sharded() && ep && ep->size() > 1) {
    const auto& reg = sync.registry();
    for (const auto& p : reg.params())
      if (p.grad_group == model::ParamGroup::expert_dp && reg.counts_in_norm(p))
        expert_ranges_.push_back(optim::ShardRange{p.offset, p.offset, p.numel, p.decay, true});
    expert_sumsq_ = Scalar<float>("meshtrain::zero_expert_sumsq");
  }
}

template <class T>
void ZeroOptimizer<T>::init_master() {
  opt_.init_master(sync_.optimizer_params(), sync_.optimizer_params_index());
}

template <class T>
bool ZeroOptimizer<T>::step(std::int64_t step, float loss_scale, bool check_finite) {
  auto sumsq = opt_.local_sumsq(sync_.optimizer_grads(), sync_.optimizer_grads_index());
  const Timer t;
  if (!expert_ranges_.empty()) {  // ZeRO-0, mesh.ep > 1: every ep rank's own experts
    const View1<T> g = sync_.optimizer_grads();
    bool first = true;
    for (const auto& r : expert_ranges_) {
      kernels::sum_squares<T>(exec_, expert_sumsq_, slice(g, r.flat, r.length), r.length,
                              !first);
      first = false;
    }
    sync_.ep()->all_reduce(expert_sumsq_);
    add_scalar(exec_, sumsq, expert_sumsq_);
  }
  if (sync_.sharded() && sync_.replicas().size() > 1) sync_.replicas().all_reduce(sumsq);
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
