// Replays of the runtime's pool policies (pools.hpp).
#include "pools.hpp"

#include <algorithm>

#include "meshtrain/model/hook_order.hpp"

namespace meshtrain::plan::detail {

namespace {

// DpPolicy's effects with a model of completion: in launch order, at once with one rank,
// otherwise when waited for.
class Replay final : public parallel::GradEffects, public parallel::GatherEffects {
 public:
  Replay(int buckets, int units, int dp)
      : instant_(dp == 1), grad_seq_(static_cast<std::size_t>(buckets), 0),
        gather_seq_(static_cast<std::size_t>(units), 0) {}
  void zero_grads() override {}
  bool test_grad(int b) override { return done(grad_seq_[b]); }
  void wait_grad(int b) override { waited_ = std::max(waited_, grad_seq_[b]); }
  void launch_grad(int b, int) override { grad_seq_[b] = ++seq_; }
  void bind_grad_buffer(int, int, std::size_t, bool) override {}
  void sum_tied_in_buffer(int, int) override {}
  void sum_tied_in_grads() override {}
  bool test_gather(int u) override { return done(gather_seq_[u]); }
  void wait_gather(int u) override { waited_ = std::max(waited_, gather_seq_[u]); }
  void start_gather(int u, int, std::size_t, bool) override { gather_seq_[u] = ++seq_; }
  void bind_params(int, int) override {}
  void unbind_params(int) override {}

 private:
  bool done(long seq) const { return instant_ || seq <= waited_; }
  bool instant_;
  long seq_ = 0, waited_ = 0;
  std::vector<long> grad_seq_, gather_seq_;
};

}  // namespace

ZeroPools replay_zero_pools(const model::ParameterRegistry& reg, const parallel::DpPlan& plan,
                            const parallel::ScheduleSpec& spec, int stage,
                            const std::vector<model::LayerRange>& chunks) {
  if (plan.zero_stage < 2) return {};
  Replay effects(static_cast<int>(plan.buckets.size()), plan.n_units(), plan.dp);
  parallel::DpPolicy policy(plan, effects, &effects);
  // The engine sums the tied wte over the embedding group on the first and last stage (an
  // untied head has no copy to sum).
  policy.set_tied_sum(spec.pp > 1 && reg.tied_head() &&
                      (stage == 0 || stage == spec.pp - 1) && plan.embedding_unit >= 0);
  if (spec.pp > 1) policy.set_micro_batches(spec.n_micro);
  auto replay = [&](const std::vector<model::HookCall>& calls) {
    for (const auto& h : calls) {
      if (h.event == model::HookEvent::before_forward) policy.before_forward(h.unit);
      else if (h.event == model::HookEvent::before_backward) policy.before_backward(h.unit);
      else policy.after_backward(h.unit);
    }
  };
  const auto actions = spec.pp > 1 ? parallel::build_schedule(spec, stage)
                                   : std::vector<parallel::Action>{};
  for (int step = 0; step < 2; ++step) {  // the pools reach their size in the first step
    policy.begin_step();
    if (spec.pp == 1) {
      for (int m = 0; m < spec.n_micro; ++m) {
        policy.set_last_micro(m + 1 == spec.n_micro);
        replay(model::forward_hooks(reg, chunks, 0));
        replay(model::backward_hooks(reg, chunks, 0));
      }
    } else {
      for (const auto& a : actions) {
        if (a.op == parallel::Op::forward) replay(model::forward_hooks(reg, chunks, a.chunk));
        if (a.op == parallel::Op::backward) replay(model::backward_hooks(reg, chunks, a.chunk));
      }
    }
    policy.finish();
  }
  return {policy.grad_pool().total_elems(), policy.param_pool().total_elems()};
}

}  // namespace meshtrain::plan::detail
