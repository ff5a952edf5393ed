// The MoE model on one rank (issue 20, phase 2), checked against its own objective rather than
// another layout: J = mean token cross-entropy + sum over MoE blocks of (aux + z) of the
// micro-batch (one micro-batch: weight 1).
//  - The gradient is J's: central differences of J along the normalised gradient equal its norm
//    (GPT-2 blocks with GELU experts and a shared expert; Llama blocks with SwiGLU experts and
//    capacity drops), to 1e-2 relative (fp32 objective; measured 5e-4 and 3e-3 at this step).
//  - The router losses' part is exact: with their coefficients on and off the gradients differ
//    by the gradient of J_r = sum of (aux + z), whose central differences (fp64 router, the
//    router weight of a 1-block model moved along that difference) match to 1e-4.
//  - The registry holds what num_parameters() counts, and the experts under their names.
#include <cmath>
#include <string>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

using namespace meshtrain;

namespace {

model::GptConfig tiny(bool llama) {
  model::GptConfig c = llama ? model::preset("llama-tiny") : model::GptConfig{};
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = 16;
  if (llama) {
    c.n_kv_head = 2;
    c.intermediate_size = 48;
    c.tied_head = false;
  }
  c.moe.experts = 4;
  c.moe.top_k = 2;
  c.moe.layer_freq = 1;
  c.moe.ffn = 16;
  c.moe.router_fp64 = true;
  c.moe.aux_loss_coeff = 0.5;  // large: their gradients must show
  c.moe.z_loss_coeff = 0.05;
  if (llama) c.moe.capacity_factor = 1.0;
  else c.moe.shared_ffn = 8;
  return c;
}

constexpr int kB = 2, kT = 16, kN = kB * kT;

struct Batch {
  View1<std::int32_t> in, tg;
};

Batch batch(int V) {
  auto hi = HostView1<std::int32_t>("in", kN), ht = HostView1<std::int32_t>("tg", kN);
  for (int i = 0; i < kN; ++i) {
    hi(i) = static_cast<std::int32_t>(rng::bits(3, 7, i) % V);
    ht(i) = static_cast<std::int32_t>(rng::bits(3, 8, i) % V);
  }
  Batch b{alloc<std::int32_t>("in", kN), alloc<std::int32_t>("tg", kN)};
  Kokkos::deep_copy(b.in, hi);
  Kokkos::deep_copy(b.tg, ht);
  return b;
}

// J (and J_r, the router losses alone) of the current parameters; leaves the gradient in grads().
double objective(model::Gpt& m, const Batch& b, double* router_losses = nullptr) {
  m.zero_grads();
  m.reset_loss_sum();
  m.reset_moe_stats();
  m.forward_train(b.in, b.tg, 1.0f / kN);
  m.backward();
  float ce = 0;
  Kokkos::deep_copy(ce, m.loss_sum());
  double r = 0;
  for (const auto& s : m.moe_stats())
    if (s.calls > 0) r += (s.aux + s.z) / s.calls;
  if (router_losses) *router_losses = r;
  return double(ce) / kN + r;
}

std::vector<double> host(View1<const float> v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  return std::vector<double>(h.data(), h.data() + h.extent(0));
}

void set(View1<float> v, const std::vector<double>& x) {
  auto h = Kokkos::create_mirror_view(v);
  for (std::size_t i = 0; i < x.size(); ++i) h(i) = static_cast<float>(x[i]);
  Kokkos::deep_copy(v, h);
}

}  // namespace

TEST_CASE("MoE model: the gradient is the objective's (CE + aux + z)", "[model][moe]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    const model::GptConfig cfg = tiny(llama);
    model::Gpt m(cfg, kB, kT);
    m.init_parameters(21);
    const Batch b = batch(cfg.vocab_size);
    objective(m, b);
    const std::vector<double> theta = host(m.params()), g = host(m.grads());
    double gn = 0;
    for (double x : g) gn += x * x;
    gn = std::sqrt(gn);
    REQUIRE(gn > 0);
    // Along d = g / |g|: dJ/dt = |g|. A small step: top-k choices are piecewise constant, and a
    // step of 1e-3 already flips some of them (J jumps); fp32 rounding of J is ~1e-6.
    const double eps = 2e-4;
    std::vector<double> p(theta.size());
    auto at = [&](double t) {
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = theta[i] + t * g[i] / gn;
      set(m.params(), p);
      return objective(m, b);
    };
    const double fd = (at(eps) - at(-eps)) / (2 * eps);
    INFO("finite difference " << fd << ", gradient norm " << gn);
    REQUIRE(std::fabs(fd - gn) <= 1e-2 * gn);
  }
}

TEST_CASE("MoE model: the router losses' gradient is exact", "[model][moe]") {
  for (bool llama : {false, true}) {
    INFO((llama ? "llama" : "gpt2"));
    model::GptConfig cfg = tiny(llama);
    cfg.n_layer = 1;  // the router's input does not depend on its weight
    model::GptConfig off = cfg;
    off.moe.aux_loss_coeff = 0;
    off.moe.z_loss_coeff = 0;
    model::Gpt m(cfg, kB, kT), m0(off, kB, kT);
    m.init_parameters(21);
    m0.share_parameters(m);
    const Batch b = batch(cfg.vocab_size);
    double r = 0;
    objective(m, b, &r);
    objective(m0, b);
    REQUIRE(r > 0);
    const auto& info = m.registry().get(m.registry().block_prefix(0) + "mlp.router.weight");
    const std::vector<double> g = host(m.grad(info.name)), g0 = host(m0.grad(info.name));
    std::vector<double> dg(g.size());
    double n = 0;
    for (std::size_t i = 0; i < g.size(); ++i) {
      dg[i] = g[i] - g0[i];
      n += dg[i] * dg[i];
    }
    n = std::sqrt(n);
    REQUIRE(n > 0);
    const std::vector<double> w = host(m.param(info.name));
    // Move the router weight (fp32) along dg and read back what was stored: the exact step.
    auto at = [&](double t, std::vector<double>& stored) {
      std::vector<double> p(w.size());
      for (std::size_t i = 0; i < p.size(); ++i) p[i] = w[i] + t * dg[i] / n;
      set(m.param(info.name), p);
      stored = host(m.param(info.name));
      double rr = 0;
      objective(m, b, &rr);
      return rr;
    };
    std::vector<double> plus, minus;
    const double eps = 1e-3;
    const double diff = at(eps, plus) - at(-eps, minus);
    double predicted = 0;
    for (std::size_t i = 0; i < dg.size(); ++i) predicted += dg[i] * (plus[i] - minus[i]);
    INFO("J_r difference " << diff << ", gradient . step " << predicted);
    REQUIRE(std::fabs(diff - predicted) <= 1e-4 * std::fabs(predicted));
  }
}

TEST_CASE("MoE model: the registry holds what num_parameters counts", "[model][moe]") {
  for (bool llama : {false, true}) {
    const model::GptConfig cfg = tiny(llama);
    const model::ParameterRegistry reg(cfg, 0, 1, 0, 0, cfg.n_layer, true, true);
    long long n = 0;
    for (const auto& p : reg.params()) n += p.global_numel();
    const long long pad = static_cast<long long>(cfg.padded_vocab() - cfg.vocab_size) *
                          cfg.n_embd * (cfg.tied_head ? 1 : 2);
    REQUIRE(n - pad == cfg.num_parameters());
    const std::string e3 = reg.expert_prefix(1, 3);
    REQUIRE(reg.find(e3 + "w_in") != nullptr);
    REQUIRE(reg.get(e3 + "w_in").grad_group == model::ParamGroup::expert_dp);
    REQUIRE(reg.find(reg.block_prefix(1) + "mlp.router.weight") != nullptr);
    // ep = 2, rank 1: experts 2 and 3 only, in the experts' unit of group expert_dp.
    const model::ParameterRegistry half(cfg, 0, 1, 0, 0, cfg.n_layer, true, true, 1, 2);
    REQUIRE(half.find(half.expert_prefix(0, 1) + "w_in") == nullptr);
    REQUIRE(half.find(half.expert_prefix(0, 2) + "w_out") != nullptr);
    REQUIRE(half.units()[half.expert_unit_of_layer(0)].group == model::ParamGroup::expert_dp);
    REQUIRE(half.expert_unit_of_layer(0) == half.unit_of_layer(0) + 1);
    REQUIRE(cfg.active_parameters() < cfg.num_parameters());
  }
}

TEST_CASE("MoE model: Qwen2's q/k/v biases are used and trained in MoE blocks", "[model][moe]") {
  // The biases belong to attention, so an MoE block binds them like a dense one: a nonzero bias
  // changes the objective and receives a nonzero gradient.
  model::GptConfig cfg = tiny(true);
  cfg.qkv_bias = true;
  model::Gpt m(cfg, kB, kT);
  m.init_parameters(21);
  const Batch b = batch(cfg.vocab_size);
  const double j0 = objective(m, b);
  std::vector<double> theta = host(m.params());
  const auto& reg = m.registry();
  std::vector<std::size_t> bias_at;
  for (int l = 0; l < cfg.n_layer; ++l)
    for (const char* n : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) {
      const auto& p = reg.get(reg.block_prefix(l) + n);
      for (std::size_t i = 0; i < p.numel; ++i) bias_at.push_back(p.offset + i);
    }
  REQUIRE(!bias_at.empty());
  for (std::size_t k = 0; k < bias_at.size(); ++k)
    theta[bias_at[k]] = 0.5 * (rng::bits(5, 9, k) % 1000) / 1000.0 - 0.25;
  set(m.params(), theta);
  const double j1 = objective(m, b);
  INFO("objective without biases " << j0 << ", with " << j1);
  REQUIRE(std::fabs(j1 - j0) > 1e-4);
  const std::vector<double> g = host(m.grads());
  double gb = 0;
  for (std::size_t i : bias_at) gb += g[i] * g[i];
  REQUIRE(gb > 0);
}

TEST_CASE("MoE model: the sigmoid router chooses by score + expert bias, and the bias moves "
          "against the load", "[model][moe]") {
  for (bool fp64 : {true, false}) {
    INFO("router in " << (fp64 ? "fp64" : "fp32"));
    model::GptConfig cfg = tiny(false);
    cfg.moe.router_score = "sigmoid";
    cfg.moe.router_fp64 = fp64;
    cfg.moe.capacity_factor = 0;
    model::GptConfig plain = cfg;
    cfg.moe.expert_bias = true;
    {  // without moe.expert_bias there is no bias
      model::Gpt m(plain, kB, kT);
      REQUIRE(m.expert_bias(0).span() == 0);
    }
    model::Gpt m(cfg, kB, kT);
    m.init_parameters(21);
    const Batch b = batch(cfg.vocab_size);
    REQUIRE(host(m.expert_bias(0)) == std::vector<double>(4, 0.0));
    objective(m, b);
    const std::vector<double> load0 = m.moe_stats()[0].load;
    // The update: rate * sign(mean - load) per expert (mean = N k / E = 16 tokens here).
    m.update_expert_bias(0, {30, 16, 10, 8}, 0.25);
    REQUIRE(host(m.expert_bias(0)) == std::vector<double>{-0.25, 0.0, 0.25, 0.25});
    // A bias larger than any score difference makes an expert every token's choice: block 0's
    // expert 1 then gets all N tokens (each token's other choice goes elsewhere).
    set(m.expert_bias(0), {0, 5, 0, 0});
    objective(m, b);
    const std::vector<double> load1 = m.moe_stats()[0].load;
    INFO("load without the bias " << load0[0] << " " << load0[1] << " " << load0[2] << " "
                                  << load0[3] << ", with bias 5 on expert 1 " << load1[1]);
    REQUIRE(load1[1] == kN);
    REQUIRE(load0[1] < kN);
  }
  model::GptConfig bad = tiny(false);
  bad.moe.expert_bias = true;  // with the softmax router
  REQUIRE_THROWS_WITH(bad.validate(),
                      mt_test::contains("moe.expert_bias needs moe.router_score=sigmoid"));
}
