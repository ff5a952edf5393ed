// train.recompute_mlp_act (ModelLayout::recompute_mlp_act): the dense MLP's activation (GELU's
// output, SwiGLU's) lives in one buffer that every block shares and the backward recomputes.
// With two micro-batches in flight (two activation slots, as a pipeline keeps them: forward 0,
// forward 1, backward 0, backward 1), every later forward overwrites the buffer before the
// backward that needs it, so a missing recompute gives other gradients. On the host in fp32
// the recompute is the forward's arithmetic, so losses and every gradient must be the same bits
// (on a GPU the forward's GELU is cuBLASLt's epilogue: gradients within 1e-5 of the largest)
// as the model that keeps each block's activation, for GPT-2 (GELU) and Llama (SwiGLU) blocks,
// with an MoE block among them (which has no dense activation and keeps its own state); and
// the activations the model keeps shrink by the blocks' activations minus the shared one.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

using namespace meshtrain;

namespace {

constexpr int kB = 2, kT = 16, kN = kB * kT;

model::GptConfig tiny(bool llama, bool moe) {
  model::GptConfig c = llama ? model::preset("llama-tiny") : model::GptConfig{};
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = kT;
  if (llama) {
    c.n_kv_head = 2;
    c.intermediate_size = 48;
  }
  if (moe) {  // block 0 and 2 MoE, block 1 dense
    c.moe.experts = 4;
    c.moe.layer_freq = 2;
    c.moe.ffn = 16;
    c.moe.router_fp64 = true;
  }
  return c;
}

std::vector<float> host(View1<const float> v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

View1<std::int32_t> tokens(std::uint64_t stream, int V) {
  auto h = HostView1<std::int32_t>("tok", kN);
  for (int i = 0; i < kN; ++i) h(i) = static_cast<std::int32_t>(rng::bits(stream, 1, i) % V);
  auto d = alloc<std::int32_t>("tok", kN);
  Kokkos::deep_copy(d, h);
  return d;
}

struct Result {
  std::vector<float> grads;
  float loss = 0;
  std::size_t activation_bytes = 0;
};

Result run(const model::GptConfig& cfg, bool recompute_mlp_act) {
  model::ModelLayout l;
  l.n_slots = 2;
  l.recompute_mlp_act = recompute_mlp_act;
  model::Gpt m(cfg, kB, kT, l);
  m.init_parameters(7);
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

}  // namespace

TEST_CASE("recompute_mlp_act: the same bits with one shared MLP activation",
          "[model][recompute]") {
  for (bool llama : {false, true})
    for (bool moe : {false, true}) {
      INFO((llama ? "llama" : "gpt2") << (moe ? " with MoE blocks" : ""));
      const model::GptConfig cfg = tiny(llama, moe);
      const Result kept = run(cfg, false), shared = run(cfg, true);
      REQUIRE(kept.loss > 0);
      REQUIRE(shared.loss == kept.loss);  // the forward is the same either way
      REQUIRE(shared.grads.size() == kept.grads.size());
      if (kDeviceIsHost) {
        REQUIRE(std::memcmp(shared.grads.data(), kept.grads.data(),
                            kept.grads.size() * sizeof(float)) == 0);
      } else {
        // cuBLASLt's GELU epilogue against our GELU kernel in the backward: ulps apart.
        double d = 0, n = 0;
        for (std::size_t i = 0; i < kept.grads.size(); ++i) {
          d = std::max(d, std::fabs(double(shared.grads[i]) - kept.grads[i]));
          n = std::max(n, std::fabs(double(kept.grads[i])));
        }
        INFO("largest gradient difference " << d << " of " << n);
        REQUIRE(d <= 1e-5 * n);
      }
      // Kept: one [N, I] activation per dense block per slot; shared: one in all.
      const std::size_t act = std::size_t(kN) * cfg.mlp_width() * sizeof(float);
      const std::size_t dense_blocks = moe ? 1 : 3;
      REQUIRE(kept.activation_bytes - shared.activation_bytes == (2 * dense_blocks - 1) * act);
    }
}
