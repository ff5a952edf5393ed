#include "meshtrain/parallel/zero_memory.hpp"

#include <type_traits>

#include "meshtrain/core/error.hpp"

namespace meshtrain::parallel {

ModelStateBytes zero_formula(double psi, int stage, int dp, std::size_t compute_bytes,
                             bool offload) {
  const double k = static_cast<double>(compute_bytes);
  const double K = compute_bytes >= 4 ? 8.0 : 12.0;  // fp32: no separate master copy
  const double n = static_cast<double>(dp);
  ModelStateBytes f;
  f.params = k * psi / (stage >= 3 ? n : 1.0);
  f.grads = k * psi / (stage >= 2 ? n : 1.0);
  const double opt_div = stage >= 1 ? n : 1.0;
  if (offload) f.host_optimizer = 12.0 * psi / opt_div;
  else f.optimizer = K * psi / opt_div;
  return f;
}

std::string zero_formula_text(int stage, std::size_t compute_bytes, bool offload) {
  const bool fp32 = compute_bytes >= 4;
  const std::string k = fp32 ? "4" : "2", K = fp32 ? "8" : "12";
  const std::string p = k + "Ψ", g = k + "Ψ", o = offload ? "" : K + "Ψ";
  auto sum = [](const std::string& a, const std::string& b) {
    return b.empty() ? a : a + " + " + b;
  };
  std::string s;
  switch (stage) {
    case 0: s = sum(sum(p, g), o); break;
    case 1: s = sum(sum(p, g), o.empty() ? "" : o + "/N_d"); break;
    case 2: s = p + " + " + (o.empty() ? g + "/N_d" : "(" + g + " + " + o + ")/N_d"); break;
    default: s = "(" + sum(sum(p, g), o) + ")/N_d"; break;
  }
  s += fp32 ? " (fp32)" : " (mixed precision)";
  if (offload) s += std::string("; host: 12Ψ") + (stage >= 1 ? "/N_d" : "");
  return s;
}

template <class T>
MemoryReport model_state_memory(const GradSync<T>& sync, const ZeroOptimizer<T>& opt) {
  MemoryReport r;
  for (const auto& p : sync.registry().params()) r.psi += static_cast<double>(p.numel);
  const auto gb = sync.bytes();
  const auto ob = opt.adamw().bytes();
  const auto& m = sync.model();
  r.measured.params = static_cast<double>(m.params.span() * sizeof(T) + gb.shard_params);
  r.measured.grads = static_cast<double>(m.grads.span() * sizeof(T) + gb.shard_grads);
  r.measured.optimizer = static_cast<double>(ob.device_state);
  r.measured.host_optimizer = static_cast<double>(ob.host_state);
  r.buffers = gb.grad_buffers + gb.param_buffers;
  r.host_staging = ob.host_staging;
  const int stage = sync.zero_stage();
  const bool offload = sync.options().offload;
  r.formula = zero_formula(r.psi, stage, sync.replicas().size(), sizeof(T), offload);
  r.formula_text = zero_formula_text(stage, sizeof(T), offload);
  return r;
}

template MemoryReport model_state_memory<float>(const GradSync<float>&,
                                                const ZeroOptimizer<float>&);
#if MESHTRAIN_HAVE_BF16
template MemoryReport model_state_memory<bf16>(const GradSync<bf16>&, const ZeroOptimizer<bf16>&);
template MemoryReport model_state_memory<fp16>(const GradSync<fp16>&, const ZeroOptimizer<fp16>&);
#endif

}  // namespace meshtrain::parallel
