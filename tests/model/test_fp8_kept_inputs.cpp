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
#include <cstring>

#include "meshtrain/kernels/linear_fp8.hpp"
#include "two_slot_run.hpp"

using namespace meshtrain;
using two_slot::kN;

namespace {

constexpr int kLayers = 4;

two_slot::Result run(const model::GptConfig& cfg, bool fp8, bool recompute,
                     int first_last_bf16) {
  model::ModelLayout l;
  l.recompute = recompute;
  l.fp8.enabled = fp8;
  l.fp8.first_last_bf16 = first_last_bf16;
  return two_slot::run(cfg, l, 11);
}

}  // namespace

TEST_CASE("fp8: blocks keep their linears' inputs as FP8 transposes, the same bits",
          "[model][fp8]") {
  for (bool llama : {false, true})
    for (bool moe : {false, true})
      for (int ends : {0, 1}) {
        INFO((llama ? "llama" : "gpt2") << (moe ? " with MoE blocks" : "")
                                        << ", first/last bf16 " << ends);
        const model::GptConfig cfg = two_slot::tiny(llama, moe, kLayers);
        const two_slot::Result kept = run(cfg, true, false, ends),
                                recomputed = run(cfg, true, true, ends);
        REQUIRE(kept.loss > 0);
        REQUIRE(kept.loss == recomputed.loss);
        REQUIRE(kept.grads.size() == recomputed.grads.size());
        REQUIRE(std::memcmp(kept.grads.data(), recomputed.grads.data(),
                            kept.grads.size() * sizeof(float)) == 0);
        // FP8 rounds: the gradients differ from the model's type (the comparison can fail).
        const two_slot::Result plain = run(cfg, false, false, 0);
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
