// Mixed-precision Mixture of Experts (issue 20): a 16-bit MoE model (bf16 or fp16 parameters,
// activations, expert rows and gradients; the router in fp32, or fp64 with moe.router_fp64;
// fp32 master weights in the optimizer) against the same model in fp32 from the same initial
// weights (the 16-bit model's, so both start from identical values). Built where the 16-bit
// types exist (Kokkos 4: the CUDA build), like test_gpt_bf16.
//
// Both families: GPT-2 blocks with GELU experts and a shared expert; Llama blocks with SwiGLU
// experts (capacity factor 1). top_k = E = 4: every token goes to every expert, so no top-k
// choice can flip between the precisions (the fp64 router removes the router GEMM's rounding,
// not that of its 16-bit input, which differs from the fp32 model's by 16-bit rounding); the
// router, dispatch, grouped GEMMs, combine and their backward still do all their work. A top-2
// model compares the cross-entropy losses only: a rare flip of a near-tied choice moves one
// token's loss (1/32 of the mean) but a whole expert's gradient.
//
// Tolerances are test_gpt_bf16's (the model is as deep: 2 blocks): relative L2 error of each
// gradient tensor at the first step 6e-2; the losses of 5 AdamW steps 2e-2 relative, and so the
// router losses (aux + z). fp16 runs with a loss scale of 1024 (unscaled, its smallest gradients
// would be subnormal), which the comparison divides out and the optimizer removes.
#include <cmath>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/optim/adamw.hpp"

using namespace meshtrain;

namespace {

constexpr int kB = 2, kT = 16, kN = kB * kT, kSteps = 5;

model::GptConfig tiny(bool llama, int top_k, bool router_fp64) {
  model::GptConfig c = llama ? model::preset("llama-tiny") : model::GptConfig{};
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = kT;
  if (llama) {
    c.n_kv_head = 2;
    c.intermediate_size = 48;
    c.tied_head = false;
  }
  c.moe.experts = 4;
  c.moe.top_k = top_k;
  c.moe.layer_freq = 1;
  c.moe.ffn = 16;
  c.moe.router_fp64 = router_fp64;
  c.moe.aux_loss_coeff = 0.01;
  c.moe.z_loss_coeff = 0.01;
  if (llama) c.moe.capacity_factor = 1.0;
  else c.moe.shared_ffn = 8;
  return c;
}

struct Batch {
  View1<std::int32_t> in, tg;
};

Batch batch(int V, int step) {
  auto hi = HostView1<std::int32_t>("in", kN), ht = HostView1<std::int32_t>("tg", kN);
  for (int i = 0; i < kN; ++i) {
    hi(i) = static_cast<std::int32_t>(rng::bits(3, 10 + 2 * step, i) % V);
    ht(i) = static_cast<std::int32_t>(rng::bits(3, 11 + 2 * step, i) % V);
  }
  Batch b{alloc<std::int32_t>("in", kN), alloc<std::int32_t>("tg", kN)};
  Kokkos::deep_copy(b.in, hi);
  Kokkos::deep_copy(b.tg, ht);
  return b;
}

template <class T>
std::vector<float> to_host(View1<const T> v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  std::vector<float> out(h.extent(0));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(h(i));
  return out;
}

// The 16-bit model's initial parameters, as floats, into the fp32 model.
template <class T>
void copy_parameters(const model::GptT<T>& from, model::Gpt& to) {
  for (const auto& p : from.registry().params()) {
    const std::vector<float> v = to_host<T>(from.param(p.name));
    auto dst = to.param(p.name);
    REQUIRE(dst.extent(0) == v.size());
    auto h = Kokkos::create_mirror_view(dst);
    for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
    Kokkos::deep_copy(dst, h);
  }
}

struct Trace {
  std::vector<double> loss, router;                  // per step: mean CE, sum of (aux + z)
  std::map<std::string, std::vector<float>> grads;   // the first step's, unscaled
};

template <class T>
Trace train(model::GptT<T>& m, float loss_scale) {
  optim::AdamWConfig oc;
  oc.lr = oc.min_lr = 1e-3f;
  oc.weight_decay = 0.1f;
  oc.grad_clip = 1.0f;
  optim::AdamWT<T> opt(m.registry().decay_ranges(), m.registry().size(), oc);
  if constexpr (!std::is_same_v<T, float>) opt.init_master(m.params());
  Trace tr;
  for (int s = 0; s < kSteps; ++s) {
    const Batch b = batch(m.config().vocab_size, s);
    m.zero_grads();
    m.reset_loss_sum();
    m.reset_moe_stats();
    m.forward_train(b.in, b.tg, loss_scale / kN);
    m.backward();
    if (s == 0)
      for (const auto& p : m.registry().params()) {
        std::vector<float> g = to_host<T>(m.grad(p.name));
        for (float& x : g) x /= loss_scale;
        tr.grads[p.name] = std::move(g);
      }
    REQUIRE(opt.step(m.params(), m.grads(), s, loss_scale, true));  // finite, applied
    float ce = 0;
    Kokkos::deep_copy(ce, m.loss_sum());
    tr.loss.push_back(double(ce) / kN);
    double r = 0;
    for (const auto& st : m.moe_stats())
      if (st.calls > 0) r += (st.aux + st.z) / st.calls;
    tr.router.push_back(r);
  }
  return tr;
}

double rel(double a, double b) { return std::fabs(a - b) / std::fabs(b); }

// The 16-bit model T against fp32 on configuration `cfg`; `grads`: compare the gradients and
// the router losses too (top-k choices that cannot flip).
template <class T>
void check(const model::GptConfig& cfg, float loss_scale, bool grads) {
  model::GptT<T> m16(cfg, kB, kT);
  m16.init_parameters(21);
  model::Gpt m32(cfg, kB, kT);
  copy_parameters<T>(m16, m32);
  const Trace a = train<T>(m16, loss_scale), r = train<float>(m32, 1.0f);
  for (int s = 0; s < kSteps; ++s) {
    INFO("step " << s << ": loss " << a.loss[s] << " fp32 " << r.loss[s] << ", router losses "
                 << a.router[s] << " fp32 " << r.router[s]);
    REQUIRE(std::isfinite(a.loss[s]));
    REQUIRE(rel(a.loss[s], r.loss[s]) <= 2e-2);
    if (grads) {
      REQUIRE(r.router[s] > 0);
      REQUIRE(rel(a.router[s], r.router[s]) <= 2e-2);
    }
  }
  if (!grads) return;
  int moe_tensors = 0;
  for (const auto& [name, g32] : r.grads) {
    const std::vector<float>& g16 = a.grads.at(name);
    double num = 0, den = 0;
    for (std::size_t i = 0; i < g32.size(); ++i) {
      REQUIRE(std::isfinite(g16[i]));
      num += (double(g16[i]) - g32[i]) * (double(g16[i]) - g32[i]);
      den += double(g32[i]) * g32[i];
    }
    INFO(name << ": relative L2 error " << std::sqrt(num / den));
    REQUIRE(den > 0);
    REQUIRE(std::sqrt(num / den) <= 6e-2);
    moe_tensors += name.find("mlp.router") != std::string::npos ||
                   name.find("mlp.experts.") != std::string::npos;
  }
  REQUIRE(moe_tensors == cfg.n_layer * (1 + 2 * cfg.moe.experts));
}

}  // namespace

TEST_CASE("bf16 MoE model tracks the fp32 model: losses, router losses, every gradient",
          "[model][moe][bf16]") {
  for (bool llama : {false, true})
    for (bool fp64 : {true, false}) {
      INFO((llama ? "llama, SwiGLU experts" : "gpt2, GELU experts, shared expert")
           << (fp64 ? ", fp64 router" : ", fp32 router"));
      check<bf16>(tiny(llama, 4, fp64), 1.0f, true);
    }
}

TEST_CASE("bf16 MoE model with top-2 routing: the losses track fp32", "[model][moe][bf16]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    check<bf16>(tiny(llama, 2, true), 1.0f, false);
  }
}

TEST_CASE("fp16 MoE model with a loss scale tracks the fp32 model", "[model][moe][fp16]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    check<fp16>(tiny(llama, 4, false), 1024.0f, true);
  }
}
