// train.precision=fp8, tensorwise (Fp8Recipe::keeps_inputs): a block keeps its linears' inputs —
// ln1, and in a dense block ln2 and the MLP activation — as the transposed FP8 casts its weight
// gradients read, cast in the forward's pass, instead of in the model's type. The weight
// gradients then read the same codes under the same scales that the backward cast before, so
// the model must give the same bits as one that keeps nothing between forward and backward
// (full recomputation, where no block keeps its inputs), with two micro-batches in flight (a
// later forward reuses the scratch the norms and the activation are written into), for GPT-2
// and Llama blocks, with an MoE block among them (which keeps ln1 only) and with the first and
// last blocks in the model's type. And the activations shrink by exactly the kept tensors'
// [N, width] in the model's type less their casts (kernels::fp8_kept_bytes).
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness.hpp"
#include "meshtrain/core/rng.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/model/config.hpp"
#include "meshtrain/model/gpt.hpp"

using namespace meshtrain;

namespace {

constexpr int kB = 2, kT = 16, kN = kB * kT, kLayers = 4;

model::GptConfig tiny(bool llama, bool moe) {
  model::GptConfig c = llama ? model::preset("llama-tiny") : model::GptConfig{};
  c.n_layer = kLayers;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 61;
  c.vocab_pad = 16;
  c.block_size = kT;
  if (llama) {
    c.n_kv_head = 2;
    c.intermediate_size = 48;
  }
  if (moe) {  // blocks 0 and 2 MoE, 1 and 3 dense
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

Result run(const model::GptConfig& cfg, bool fp8, bool recompute, int first_last_bf16) {
  model::ModelLayout l;
  l.n_slots = 2;
  l.recompute = recompute;
  l.fp8.enabled = fp8;
  l.fp8.first_last_bf16 = first_last_bf16;
  model::Gpt m(cfg, kB, kT, l);
  m.init_parameters(11);
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

TEST_CASE("fp8: blocks keep their linears' inputs as FP8 transposes, the same bits",
          "[model][fp8]") {
  for (bool llama : {false, true})
    for (bool moe : {false, true})
      for (int ends : {0, 1}) {
        INFO((llama ? "llama" : "gpt2") << (moe ? " with MoE blocks" : "")
                                        << ", first/last bf16 " << ends);
        const model::GptConfig cfg = tiny(llama, moe);
        const Result kept = run(cfg, true, false, ends), recomputed = run(cfg, true, true, ends);
        REQUIRE(kept.loss > 0);
        REQUIRE(kept.loss == recomputed.loss);
        REQUIRE(kept.grads.size() == recomputed.grads.size());
        REQUIRE(std::memcmp(kept.grads.data(), recomputed.grads.data(),
                            kept.grads.size() * sizeof(float)) == 0);
        // FP8 rounds: the gradients differ from the model's type (the comparison can fail).
        const Result plain = run(cfg, false, false, 0);
        REQUIRE(std::memcmp(kept.grads.data(), plain.grads.data(),
                            kept.grads.size() * sizeof(float)) != 0);
        // Per slot and kept block: ln1, and ln2 and the activation of a dense one, each
        // [N, width] floats replaced by its kept cast.
        const auto swap = [](int width) {
          return std::size_t(kN) * width * sizeof(float) - kernels::fp8_kept_bytes(kN, width);
        };
        std::size_t saved = 0;
        for (int l = ends; l < kLayers - ends; ++l) {
          saved += swap(cfg.n_embd);
          if (!cfg.moe.is_moe_layer(l)) saved += swap(cfg.n_embd) + swap(cfg.mlp_width());
        }
        REQUIRE(plain.activation_bytes - kept.activation_bytes == 2 * saved);
      }
}
