// Model-state bytes per rank, measured from the allocations, against the ZeRO paper's formulas
// within 5 %: fp32 (4Ψ parameters, 4Ψ gradients, 8Ψ Adam moments, no master copy; offload: 12Ψ
// on the host) and, where the build has bf16, mixed precision (2Ψ + 2Ψ + 12Ψ).
#include <cmath>
#include <cstdio>

#include "meshtrain/parallel/zero_memory.hpp"
#include "zero_test_util.hpp"

using namespace meshtrain;
using namespace meshtrain::parallel;

namespace {
bool within(double measured, double formula, double tol) {
  if (formula == 0) return measured == 0;
  return std::fabs(measured - formula) <= tol * formula;
}
template <class T>
void check_memory() {
  zt::WorldDp w;
  const int rank = w.comm->rank(), P = w.comm->size();
  const auto cfg = zt::config(2, 128, 512, 64);
  if (rank == 0)
    std::printf("%s model states per rank, dp=%d (MiB): stage offload | params grads optim host "
                "| formula | buffers\n", sizeof(T) == 4 ? "fp32" : "bf16", P);
  for (int stage = 0; stage <= 3; ++stage) {
    for (bool offload : {false, true}) {
      INFO("ZeRO-" << stage << (offload ? " offload" : "") << ", dp=" << P);
      zt::FakeModel<T> fm(cfg, stage);
      DpOptions opt;
      opt.zero_stage = stage;
      opt.offload = offload;
      GradSync<T> sync(fm.buffers(), *w.comm, opt);
      ZeroOptimizer<T> zo(sync, optim::AdamWConfig{});
      zo.init_master();
      sync.begin_step();
      fm.micro_batch(sync, [&](std::size_t i) { return zt::grad_value(rank, 0, i); });
      sync.finish();
      zo.step(0);
      const MemoryReport r = model_state_memory(sync, zo);
      const auto& m = r.measured;
      const auto& f = r.formula;
      if (rank == 0) {
        const double M = 1048576.0;
        std::printf("  %d %-3s | %.3f %.3f %.3f %.3f | %.3f %.3f %.3f %.3f  %s | %.3f\n", stage,
                    offload ? "cpu" : "-", m.params / M, m.grads / M, m.optimizer / M,
                    m.host_optimizer / M, f.params / M, f.grads / M, f.optimizer / M,
                    f.host_optimizer / M, r.formula_text.c_str(), r.buffers / M);
      }
      INFO("measured " << m.params << " " << m.grads << " " << m.optimizer << " "
                       << m.host_optimizer << ", formula " << f.params << " " << f.grads << " "
                       << f.optimizer << " " << f.host_optimizer);
      const bool ok = within(m.params, f.params, 0.05) && within(m.grads, f.grads, 0.05) &&
                      within(m.optimizer, f.optimizer, 0.05) &&
                      within(m.host_optimizer, f.host_optimizer, 0.05);
      REQUIRE(mt_test::all_ranks(ok));
      REQUIRE(mt_test::all_ranks(within(m.total(), f.total(), 0.05)));
    }
  }
}

}  // namespace

TEST_CASE("model-state memory per rank equals the ZeRO formulas (fp32)", "[parallel][zero][mpi]") {
  check_memory<float>();
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("model-state memory per rank equals the ZeRO formulas (mixed precision)",
          "[parallel][zero][mpi][bf16]") {
  check_memory<bf16>();
}
#endif
