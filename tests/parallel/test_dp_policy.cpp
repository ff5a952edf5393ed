// DpPolicy by simulation (no MPI, no model): the policy is driven with the model's stated hook
// order (model::forward_hooks / backward_hooks) over the real registries of single ranks and
// pipeline stages, under every ZeRO stage, and a simulated communicator whose collectives
// complete at random tests (seeded) or when waited for. The effects it asks for are checked
// against the rules the runtime relies on:
//  - gradients: ZeRO 0/1 reduce each bucket exactly once per step, after its units' last
//    backward; ZeRO 2/3 once per micro-batch (the deferred tied bucket once, in finish), always
//    from the buffer its units wrote into, and every gradient write lands in a bound buffer;
//  - buffers: no pool buffer is bound to a bucket, or read by a reduction, while another uses it;
//  - ZeRO-3: a unit's parameters are gathered and bound at every use, from a completed gather,
//    and its buffer is not handed to another unit while bound;
//  - finish() leaves nothing in flight, and the pools stay small.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "harness.hpp"
#include "meshtrain/model/hook_order.hpp"
#include "meshtrain/model/registry.hpp"
#include "meshtrain/parallel/dp_policy.hpp"
#include "meshtrain/parallel/schedule.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;
using model::HookCall;
using model::HookEvent;

namespace {

model::GptConfig config() {
  model::GptConfig c;
  c.n_layer = 4;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 40;
  c.vocab_pad = 16;
  c.block_size = 8;
  return c;
}

// The simulated communicator and the checks on what the policy asks of it.
class Sim final : public GradEffects, public GatherEffects {
 public:
  Sim(const DpPlan& plan, std::uint64_t seed) : plan_(plan), rng_(seed) {
    grad_inflight_.assign(plan.buckets.size(), -1);
    gather_inflight_.assign(plan.unit_bucket.size(), -1);
    bound_grad_.assign(plan.unit_bucket.size(), -1);
    bound_param_.assign(plan.unit_bucket.size(), -1);
    launches_.assign(plan.buckets.size(), 0);
  }
  // ---- GradEffects ----
  void zero_grads() override {}
  bool test_grad(int b) override {
    if (!coin()) return false;
    complete_grad(b);
    return true;
  }
  void wait_grad(int b) override { complete_grad(b); }
  void launch_grad(int b, int buffer) override {
    REQUIRE(grad_inflight_[b] == -1);  // the policy waited for the previous launch
    ++launches_[b];
    if (plan_.zero_stage >= 2) {
      // The reduction reads the buffer the bucket's units wrote into.
      const Bucket& bk = plan_.buckets[b];
      for (int u = bk.first_unit; u <= bk.last_unit; ++u) REQUIRE(bound_grad_[u] == buffer);
      REQUIRE(busy_.count(buffer) == 1);
      for (int u = bk.first_unit; u <= bk.last_unit; ++u) bound_grad_[u] = -1;
      grad_inflight_[b] = buffer;
    } else {
      grad_inflight_[b] = -3;  // in flight, in the full buffer
    }
  }
  void bind_grad_buffer(int b, int buffer, std::size_t elems, bool grown) override {
    REQUIRE(busy_.count(buffer) == 0);  // not bound or in flight elsewhere
    busy_.insert(buffer);
    if (grown) REQUIRE(buffer == grad_buffers_++);
    REQUIRE(elems == plan_.bucket_piece[b] * static_cast<std::size_t>(plan_.dp));
    const Bucket& bk = plan_.buckets[b];
    for (int u = bk.first_unit; u <= bk.last_unit; ++u) bound_grad_[u] = buffer;
  }
  void sum_tied_in_buffer(int b, int buffer) override {
    REQUIRE(b == plan_.unit_bucket[plan_.embedding_unit]);
    REQUIRE(bound_grad_[plan_.embedding_unit] == buffer);
    ++tied_sums_;
  }
  void sum_tied_in_grads() override { ++tied_sums_; }
  // ---- GatherEffects ----
  bool test_gather(int u) override {
    if (!coin()) return false;
    gather_inflight_[u] = -1;
    return true;
  }
  void wait_gather(int u) override { gather_inflight_[u] = -1; }
  void start_gather(int u, int buffer, std::size_t, bool grown) override {
    REQUIRE(param_busy_.count(buffer) == 0);
    param_busy_.insert(buffer);
    if (grown) REQUIRE(buffer == param_buffers_++);
    gather_inflight_[u] = buffer;
    gather_buffer_[u] = buffer;
  }
  void bind_params(int u, int buffer) override {
    REQUIRE(gather_inflight_[u] == -1);  // the gather completed
    REQUIRE(gather_buffer_[u] == buffer);
    bound_param_[u] = buffer;
  }
  void unbind_params(int u) override {
    REQUIRE(gather_inflight_[u] == -1);
    param_busy_.erase(gather_buffer_[u]);
    gather_buffer_.erase(u);
    bound_param_[u] = -1;
  }

  // ---- the model's side: what a hook must find ----
  void after_hook(const HookCall& h) {
    if (h.event == HookEvent::after_backward) return;
    if (plan_.zero_stage == 3) REQUIRE(bound_param_[h.unit] >= 0);  // gathered for this use
    if (h.event == HookEvent::before_backward && plan_.zero_stage >= 2)
      REQUIRE(bound_grad_[h.unit] >= 0);  // the backward's gradients have storage
  }
  void check_idle() const {
    for (int v : grad_inflight_) REQUIRE(v == -1);
    for (int v : gather_inflight_) REQUIRE(v == -1);
    REQUIRE(param_busy_.empty());
  }
  std::vector<int> launches_;
  int tied_sums_ = 0, grad_buffers_ = 0, param_buffers_ = 0;

 private:
  bool coin() { return std::uniform_int_distribution<int>(0, 2)(rng_) == 0; }
  void complete_grad(int b) {
    if (grad_inflight_[b] >= 0) busy_.erase(grad_inflight_[b]);
    grad_inflight_[b] = -1;
  }
  const DpPlan& plan_;
  std::mt19937_64 rng_;
  std::vector<int> grad_inflight_, gather_inflight_, bound_grad_, bound_param_;
  std::set<int> busy_, param_busy_;
  std::map<int, int> gather_buffer_;
};

struct Case {
  int zero, dp, pp, stage, n_micro;
  std::size_t bucket_bytes;
};

void simulate(const Case& c, std::uint64_t seed) {
  INFO("zero " << c.zero << " dp " << c.dp << " pp " << c.pp << " stage " << c.stage
               << " micro " << c.n_micro << " bucket " << c.bucket_bytes << " seed " << seed);
  const auto cfg = config();
  ScheduleSpec spec;
  spec.pp = c.pp;
  spec.n_micro = c.n_micro;
  const int per = cfg.n_layer / c.pp;
  const std::vector<model::LayerRange> chunks{{c.stage * per, (c.stage + 1) * per}};
  const model::ParameterRegistry reg(cfg, 0, 1, c.stage, chunks, c.stage == 0,
                                     c.stage == c.pp - 1);
  DpOptions opt;
  opt.zero_stage = c.zero;
  opt.bucket_bytes = c.bucket_bytes;
  const DpLayout layout = make_dp_layout(reg, 4, opt, c.dp);
  Sim sim(layout.plan, seed);
  DpPolicy policy(layout.plan, sim, &sim);
  const bool tied = c.pp > 1 && (c.stage == 0 || c.stage == c.pp - 1);
  policy.set_tied_sum(tied);
  policy.set_micro_batches(c.n_micro);
  auto run = [&](const std::vector<HookCall>& calls) {
    for (const auto& h : calls) {
      if (h.event == HookEvent::before_forward) policy.before_forward(h.unit);
      else if (h.event == HookEvent::before_backward) policy.before_backward(h.unit);
      else policy.after_backward(h.unit);
      sim.after_hook(h);
    }
  };
  const int B = static_cast<int>(layout.plan.buckets.size());
  for (int step = 0; step < 3; ++step) {
    std::fill(sim.launches_.begin(), sim.launches_.end(), 0);
    sim.tied_sums_ = 0;
    policy.begin_step();
    if (c.pp == 1) {
      for (int m = 0; m < c.n_micro; ++m) {
        run(model::forward_hooks(reg, chunks, 0));
        run(model::backward_hooks(reg, chunks, 0));
      }
    } else {
      for (const auto& a : build_schedule(spec, c.stage)) {
        if (a.op == Op::forward) run(model::forward_hooks(reg, chunks, a.chunk));
        if (a.op == Op::backward) run(model::backward_hooks(reg, chunks, a.chunk));
      }
    }
    policy.finish();
    sim.check_idle();
    for (int b = 0; b < B; ++b) {
      const bool deferred = b == policy.deferred_bucket();
      REQUIRE(sim.launches_[b] == (c.zero <= 1 || deferred ? 1 : c.n_micro));
    }
    REQUIRE(sim.tied_sums_ == (tied ? 1 : 0));
  }
  // Small pools: two bucket buffers in flight plus the tied embedding's; ZeRO-3 holds the unit
  // in use, the prefetched one and the tied embedding.
  std::size_t largest = 0;
  for (std::size_t piece : layout.plan.bucket_piece)
    largest = std::max(largest, piece * static_cast<std::size_t>(c.dp));
  REQUIRE(policy.grad_pool().total_elems() <= (c.zero >= 2 ? 3 * largest : 0));
  REQUIRE(policy.param_pool().total_elems() <= (c.zero == 3 ? 3 * largest : 0));
}

}  // namespace

TEST_CASE("DpPolicy: single rank and pipeline stages under every ZeRO stage", "[parallel][policy]") {
  for (int zero = 0; zero <= 3; ++zero)
    for (int dp : {1, 4})
      for (std::size_t bucket : {std::size_t{1}, std::size_t{6000}, std::size_t{1} << 30})
        for (int micro : {1, 3}) {
          for (std::uint64_t seed = 0; seed < 4; ++seed) {
            simulate({zero, dp, 1, 0, micro, bucket}, seed);
            for (int stage = 0; stage < 2; ++stage)
              simulate({zero, dp, 2, stage, micro, bucket}, seed);
          }
        }
}

TEST_CASE("BufferPlan: best fit among free buffers, else grow by the size asked", "[parallel][policy]") {
  BufferPlan p;
  const auto a = p.acquire(100), b = p.acquire(50);
  REQUIRE((a.id == 0 && a.grown && b.id == 1 && b.grown));
  p.release(a.id);
  p.release(b.id);
  REQUIRE(p.acquire(40).id == 1);  // the smaller free buffer that fits
  REQUIRE(p.acquire(60).id == 0);
  const auto c = p.acquire(10);
  REQUIRE((c.id == 2 && c.grown));
  REQUIRE(p.total_elems() == 160);
  REQUIRE(!p.has_free(1));
}
