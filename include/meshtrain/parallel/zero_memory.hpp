#pragma once
// Model-state memory per rank: measured from the allocations of the model, GradSync and the
// optimizer, next to the ZeRO paper's formulas (Rajbhandari et al. 2020, section 3 and figure 1).
//
// Mixed precision (16-bit T, fp32 master weights and Adam moments), Ψ parameters, N_d dp ranks:
//   stage 0: 2Ψ + 2Ψ + 12Ψ;  1: 2Ψ + 2Ψ + 12Ψ/N_d;  2: 2Ψ + (2Ψ + 12Ψ)/N_d;  3: 16Ψ/N_d.
// fp32 (the CPU build): the parameters are the master weights, so K = 8 (m and v) instead of 12:
//   stage 0: 4Ψ + 4Ψ + 8Ψ;   1: 4Ψ + 4Ψ + 8Ψ/N_d;   2: 4Ψ + (4Ψ + 8Ψ)/N_d;   3: 16Ψ/N_d.
// CPU offload moves the optimizer state to host memory; the host then needs its own fp32 master
// in both precisions (it cannot update device parameters in place): 12Ψ/N_d on the host (12Ψ at
// stage 0) and none on the device.
// Measured figures add the padding of the registry's 64-element alignment and of equal shards.
// Communication buffers (gradient buckets, gathered units, staging) are not model states and are
// reported apart, as the paper does (its "temporary buffers").
#include <cstddef>
#include <string>

#include "meshtrain/parallel/zero_optimizer.hpp"

namespace meshtrain::parallel {

struct ModelStateBytes {
  double params = 0, grads = 0, optimizer = 0;  // device memory
  double host_optimizer = 0;                    // host memory (offload)
  double device() const { return params + grads + optimizer; }
  double total() const { return device() + host_optimizer; }
};

// The formula for Ψ parameters of `compute_bytes` each (2: mixed precision, 4: fp32).
ModelStateBytes zero_formula(double psi, int stage, int dp, std::size_t compute_bytes,
                             bool offload);
std::string zero_formula_text(int stage, std::size_t compute_bytes, bool offload);

struct MemoryReport {
  ModelStateBytes measured, formula;
  double psi = 0;                 // parameters on this rank (registry elements, no padding)
  std::size_t buffers = 0;        // device communication buffers (buckets, gathers, staging)
  std::size_t host_staging = 0;   // offload: gradients down / parameters up
  std::string formula_text;
};

template <class T>
MemoryReport model_state_memory(const GradSync<T>& sync, const ZeroOptimizer<T>& opt);

}  // namespace meshtrain::parallel
