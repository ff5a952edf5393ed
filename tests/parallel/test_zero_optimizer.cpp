// The ZeRO optimizer step equals the single-rank AdamW: every stage, with and without CPU
// offload, on 1-4 ranks. Gradients are exact dp-sums (integers times a power of two), so the only
// difference allowed is the summation order of the global norm (which clipping uses).
#include <cmath>

#include "meshtrain/parallel/zero_optimizer.hpp"
#include "zero_test_util.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {

constexpr float kGradUnit = 1.0f / 64;   // exact scaling of the integer gradients
constexpr float kParamUnit = 1.0f / 128;

optim::AdamWConfig adamw_config() {
  optim::AdamWConfig c;
  c.lr = 1e-2f;
  c.min_lr = 1e-3f;
  c.warmup_steps = 1;
  c.decay_steps = 4;
  c.weight_decay = 0.1f;
  c.grad_clip = 1.0f;  // the summed gradients have norm >> 1: clipping is active
  return c;
}

// tol: relative parameter difference (fp32: the norm's summation order; bf16: one last bit of
// the rounded copy where the clip factor differs in its last bit).
template <class T>
void check_optimizer(double tol) {
  zt::WorldDp w;
  const int rank = w.comm->rank(), P = w.comm->size();
  const auto cfg = zt::config(2, 32, 100, 16);
  const int steps = 3, micro = 2;
  auto grad_of = [&](int r, int m, int s) {
    return [=](std::size_t i) { return zt::grad_value(r, m + 3 * s, i) * kGradUnit; };
  };
  auto p0 = [](std::size_t i) { return zt::param_value(i) * kParamUnit; };

  // Reference: one rank, the summed gradients, optim::AdamW.
  zt::FakeModel<T> ref_model(cfg, 0);
  optim::AdamWT<T> ref(ref_model.reg.decay_ranges(), ref_model.reg.size(), adamw_config());
  auto ref_params = zt::to_device<T>(zt::on_params(ref_model.reg, p0));
  ref.init_master(ref_params);
  std::vector<float> ref_norms;
  for (int s = 0; s < steps; ++s) {
    auto g = zt::to_device<T>(zt::on_params(ref_model.reg, [&](std::size_t i) {
      float sum = 0;
      for (int r = 0; r < P; ++r)
        for (int m = 0; m < micro; ++m) sum += grad_of(r, m, s)(i);
      return sum;
    }));
    ref.step(ref_params, g, s);
    float nrm = 0;
    Kokkos::deep_copy(nrm, ref.grad_norm());
    ref_norms.push_back(nrm);
  }
  const auto want = zt::to_host(ref_params);

  for (int stage = 0; stage <= 3; ++stage) {
    for (bool offload : {false, true}) {
      INFO("ZeRO-" << stage << (offload ? " with offload" : "") << " on " << P << " ranks");
      zt::FakeModel<T> fm(cfg, stage);
      DpOptions opt;
      opt.zero_stage = stage;
      opt.offload = offload;
      opt.bucket_bytes = 30000;  // several buckets
      GradSync<T> sync(fm.buffers(), *w.comm, opt);
      sync.scatter_params(zt::to_device<T>(zt::on_params(fm.reg, p0)));
      ZeroOptimizer<T> zo(sync, adamw_config());
      zo.init_master();
      bool norms_ok = true;
      for (int s = 0; s < steps; ++s) {
        sync.begin_step();
        for (int m = 0; m < micro; ++m) {
          sync.set_last_micro(m == micro - 1);
          fm.micro_batch(sync, grad_of(rank, m, s));
        }
        sync.finish();
        REQUIRE(zo.step(s));
        float nrm = 0;
        Kokkos::deep_copy(nrm, zo.grad_norm());
        norms_ok = norms_ok && std::fabs(nrm - ref_norms[s]) <= 1e-6f * ref_norms[s];
      }
      REQUIRE(mt_test::all_ranks(norms_ok));
      auto full = zt::to_device<T>(std::vector<float>(fm.reg.size(), 0.0f));
      sync.gather_params(full);
      const auto got = zt::to_host(full);
      double worst = 0;
      for (const auto& p : fm.reg.params())
        for (std::size_t i = 0; i < p.numel; ++i) {
          const std::size_t f = p.offset + i;
          worst = std::max(worst, std::fabs(double(got[f]) - want[f]) /
                                      std::max(std::fabs(double(want[f])), 1e-3));
        }
      INFO("worst relative parameter difference " << worst);
      REQUIRE(mt_test::all_ranks(worst <= tol));
      const auto& b = zo.adamw().bytes();
      REQUIRE(mt_test::all_ranks(offload ? (b.device_state == 0 && b.host_state > 0)
                                         : (b.host_state == 0 && b.device_state > 0)));
    }
  }
}

}  // namespace

TEST_CASE("ZeRO optimizer step equals single-rank AdamW", "[parallel][zero][mpi]") {
  check_optimizer<float>(1e-6);
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("bf16: ZeRO optimizer step (fp32 master in the shard) equals AdamWT<bf16>",
          "[parallel][zero][mpi][bf16]") {
  check_optimizer<bf16>(1.0 / 128);
}
#endif
