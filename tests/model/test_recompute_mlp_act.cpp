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
#include <cstring>

#include "two_slot_run.hpp"

using namespace meshtrain;
using two_slot::kN;

namespace {

two_slot::Result run(const model::GptConfig& cfg, bool recompute_mlp_act) {
  model::ModelLayout l;
  l.recompute_mlp_act = recompute_mlp_act;
  return two_slot::run(cfg, l, 7);
}

}  // namespace

TEST_CASE("recompute_mlp_act: the same bits with one shared MLP activation",
          "[model][recompute]") {
  for (bool llama : {false, true})
    for (bool moe : {false, true}) {
      INFO((llama ? "llama" : "gpt2") << (moe ? " with MoE blocks" : ""));
      const model::GptConfig cfg = two_slot::tiny(llama, moe, 3);
      const two_slot::Result kept = run(cfg, false), shared = run(cfg, true);
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
