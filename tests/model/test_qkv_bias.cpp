// Qwen2's q/k/v biases (model.qkv_bias) in the Llama block. No PyTorch fixture (torch is not
// on the CI machine): the biases' gradients against central finite differences of the loss,
// and a model whose biases are zero against the bias-free block on the fp64 Llama fixture's
// parameters (same logits, loss and weight gradients, bit for bit on the host). Tensor
// parallelism with biases is test_tensor_parallel's.
#include <cmath>
#include <random>

#include "fixture.hpp"

using namespace meshtrain;

namespace {

constexpr int kB = 2, kT = 8;

model::GptConfig qwen2_tiny() {
  model::GptConfig c = model::preset("llama-tiny");
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.intermediate_size = 48;
  c.vocab_size = 61, c.vocab_pad = 64, c.block_size = 16, c.tied_head = false;
  c.qkv_bias = true;
  return c;
}

void batch(View1<std::int32_t> in, View1<std::int32_t> tg) {
  auto hi = Kokkos::create_mirror_view(in), ht = Kokkos::create_mirror_view(tg);
  for (int i = 0; i < kB * kT; ++i) {
    hi(i) = (i * 17 + 5) % 61;
    ht(i) = (i * 29 + 3) % 61;
  }
  Kokkos::deep_copy(in, hi);
  Kokkos::deep_copy(tg, ht);
}

// The scaled loss (what the gradients are of) of one forward pass.
double loss(model::Gpt& m, View1<std::int32_t> in, View1<std::int32_t> tg) {
  m.reset_loss_sum();
  m.forward_train(in, tg, 1.0f / (kB * kT));
  float x = 0;
  Kokkos::deep_copy(x, m.loss_sum());
  return double(x) / (kB * kT);
}

}  // namespace

TEST_CASE("Qwen2's q/k/v bias gradients match finite differences", "[model][llama]") {
  const model::GptConfig cfg = qwen2_tiny();
  model::Gpt m(cfg, kB, kT);
  m.init_parameters(3);
  auto in = alloc<std::int32_t>("in", kB * kT), tg = alloc<std::int32_t>("tg", kB * kT);
  batch(in, tg);
  // Non-zero biases (HF initialises them to zero), large enough to matter in the softmax.
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.params());
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  for (const auto& p : m.registry().params())
    if (p.name.find("_proj.bias") != std::string::npos)
      for (std::size_t i = 0; i < p.numel; ++i) h(p.offset + i) = nd(rng);
  Kokkos::deep_copy(m.params(), h);
  m.zero_grads();
  m.reset_loss_sum();
  m.forward_train(in, tg, 1.0f / (kB * kT));
  m.backward();
  auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, m.grads());
  double worst = 0, largest = 0;
  int checked = 0;
  for (const auto& p : m.registry().params()) {
    if (p.name.find("_proj.bias") == std::string::npos) continue;
    for (std::size_t i : {std::size_t(0), p.numel / 3, p.numel - 1}) {
      const std::size_t at = p.offset + i;
      const float x0 = h(at);
      const float step = 1e-2f;
      double L[2];
      for (int s = 0; s < 2; ++s) {
        h(at) = x0 + (s == 0 ? step : -step);
        Kokkos::deep_copy(m.params(), h);
        L[s] = loss(m, in, tg);
      }
      h(at) = x0;
      Kokkos::deep_copy(m.params(), h);
      const double fd = (L[0] - L[1]) / (2.0 * double(step));
      INFO(p.name << "[" << i << "]: backward " << g(at) << ", finite difference " << fd);
      // fp32 losses (~4, summed over 16 tokens): rounding of ~1e-6 over 2h = 2e-2 is 5e-5;
      // the h^2 truncation is relative.
      CHECK(std::fabs(fd - g(at)) <= 1e-4 + 1e-2 * std::fabs(fd));
      worst = std::max(worst, std::fabs(fd - g(at)));
      largest = std::max(largest, std::fabs(fd));
      ++checked;
    }
  }
  INFO("worst |fd - backward| " << worst << " of the largest |gradient| " << largest);
  CHECK(checked == 2 * 3 * 3);
  CHECK(largest > 20 * worst);  // the biases matter to the loss, far above the FD error
}

TEST_CASE("zero q/k/v biases are the bias-free Llama block", "[model][llama]") {
  io::SafetensorsReader f(mt_test::llama_fixture_path());
  model::GptConfig plain = mt_test::llama_fixture_config();
  model::GptConfig biased = plain;
  biased.qkv_bias = true;
  model::Gpt a(plain, 2, 16), b(biased, 2, 16);
  mt_test::load_params(f, a, "param.");
  mt_test::load_params(f, b, "param.", /*missing_ok=*/true);  // the biases stay zero
  const auto inputs = f.read_i32("batch.inputs"), targets = f.read_i32("batch.targets");
  auto in = alloc<std::int32_t>("in", 32), tg = alloc<std::int32_t>("tg", 32);
  auto hi = Kokkos::create_mirror_view(in), ht = Kokkos::create_mirror_view(tg);
  for (int i = 0; i < 32; ++i) hi(i) = inputs[i], ht(i) = targets[i];
  Kokkos::deep_copy(in, hi);
  Kokkos::deep_copy(tg, ht);
  for (auto* m : {&a, &b}) {
    m->zero_grads();
    m->reset_loss_sum();
    m->forward_train(in, tg, 1.0f / 32);
    m->backward();
  }
  float la = 0, lb = 0;
  Kokkos::deep_copy(la, a.loss_sum());
  Kokkos::deep_copy(lb, b.loss_sum());
  CHECK(la == lb);
  auto ga = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, a.grads());
  auto gb = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b.grads());
  double worst = 0;
  for (const auto& p : a.registry().params()) {
    const auto& q = b.registry().get(p.name);
    for (std::size_t i = 0; i < p.numel; ++i)
      worst = std::max(worst, std::fabs(double(ga(p.offset + i)) - gb(q.offset + i)));
  }
  CHECK(worst == 0.0);
}
