#pragma once
// A tiny GPT-2 or Llama model (optionally with MoE blocks) trained by hand with two micro-batches
// in flight, as a pipeline keeps them (forward 0, forward 1, backward 0, backward 1): the
// gradients, the loss and the activations kept, for tests that compare two ways of keeping the
// activations (test_recompute_mlp_act, test_fp8_kept_inputs).
#include <cstdint>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

namespace two_slot {

constexpr int kB = 2, kT = 16, kN = kB * kT;

// n_layer blocks; with moe, every other block from block 0 an MoE block (4 experts, fp64 router).
inline meshtrain::model::GptConfig tiny(bool llama, bool moe, int n_layer) {
  meshtrain::model::GptConfig c =
      llama ? meshtrain::model::preset("llama-tiny") : meshtrain::model::GptConfig{};
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = kT;
  if (llama) {
    c.n_kv_head = 2;
    c.intermediate_size = 48;
  }
  if (moe) {
    c.moe.experts = 4;
    c.moe.layer_freq = 2;
    c.moe.ffn = 16;
    c.moe.router_fp64 = true;
  }
  return c;
}

inline std::vector<float> host(meshtrain::View1<const float> v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

inline meshtrain::View1<std::int32_t> tokens(std::uint64_t stream, int V) {
  auto h = meshtrain::HostView1<std::int32_t>("tok", kN);
  for (int i = 0; i < kN; ++i)
    h(i) = static_cast<std::int32_t>(meshtrain::rng::bits(stream, 1, i) % V);
  auto d = meshtrain::alloc<std::int32_t>("tok", kN);
  Kokkos::deep_copy(d, h);
  return d;
}

struct Result {
  std::vector<float> grads;
  float loss = 0;
  std::size_t activation_bytes = 0;
};

// The model of cfg under layout l (n_slots 2), initialised with `seed`, after one step's
// forwards and backwards of two micro-batches.
inline Result run(const meshtrain::model::GptConfig& cfg, meshtrain::model::ModelLayout l,
                  std::uint64_t seed) {
  l.n_slots = 2;
  meshtrain::model::Gpt m(cfg, kB, kT, l);
  m.init_parameters(seed);
  m.zero_grads();
  m.reset_loss_sum();
  const auto in0 = tokens(1, cfg.vocab_size), tg0 = tokens(2, cfg.vocab_size);
  const auto in1 = tokens(3, cfg.vocab_size), tg1 = tokens(4, cfg.vocab_size);
  const float scale = 1.0f / (2 * kN);
  m.forward(0, 0, in0, {}, tg0, scale);
  m.forward(0, 1, in1, {}, tg1, scale);
  m.backward(0, 0, {});
  m.backward(0, 1, {});
  Result r;
  r.grads = host(m.grads());
  Kokkos::deep_copy(r.loss, m.loss_sum());
  r.activation_bytes = m.activation_bytes();
  return r;
}

}  // namespace two_slot
