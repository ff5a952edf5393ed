#pragma once
// Shared by the MoE layout tests (test_moe_layouts, test_moe_resume): the layout tests' tiny
// models with Mixture-of-Experts blocks. 8 experts (every mesh.ep of 1, 2, 4, 8 divides them),
// top-2, blocks 0 and 2 MoE (layer_freq 2: dense and MoE blocks mixed, as pipelines cut them),
// the router in fp64 so that top-k choices are a function of the (layout-independent to fp32
// rounding) router input, not of the router GEMM's own rounding; aux and z losses on, their
// statistics over each rank's micro-batch (moe.aux_loss_scope=local: the layouts these
// fixtures are run at keep train.micro_batch = 1; test_moe_layouts runs the global scope at a
// fixed train.grad_accum).
#include "layout_fixture.hpp"
#include "meshtrain/model/config.hpp"

namespace mt_test {

inline meshtrain::model::MoeConfig moe_tiny_moe() {
  meshtrain::model::MoeConfig m;
  m.experts = 8;
  m.top_k = 2;
  m.layer_freq = 2;
  m.ffn = 16;
  m.router_fp64 = true;
  m.aux_loss_coeff = 0.01;
  m.z_loss_coeff = 0.001;
  m.aux_loss_scope = "local";
  return m;
}

// GPT-2 block with GELU experts and a shared expert of width 16.
inline meshtrain::model::GptConfig moe_tiny() {
  meshtrain::model::GptConfig c = layout_tiny();
  c.name = "tiny-moe";
  c.moe = moe_tiny_moe();
  c.moe.shared_ffn = 16;
  return c;
}

// Llama block with SwiGLU experts, dropping by a capacity factor of 1 (every router call is one
// micro-batch, the same in every layout, so are the drops).
inline meshtrain::model::GptConfig moe_tiny_llama() {
  meshtrain::model::GptConfig c = layout_tiny_llama();
  c.name = "tiny-llama-moe";
  c.moe = moe_tiny_moe();
  c.moe.capacity_factor = 1.0;
  return c;
}

// The sigmoid router with DeepSeek-V3's auxiliary-loss-free expert bias, moved fast (0.01 a step
// against scores of order 0.1) so that within a few steps it changes which experts are chosen.
inline meshtrain::model::GptConfig moe_tiny_bias() {
  meshtrain::model::GptConfig c = moe_tiny();
  c.name = "tiny-moe-bias";
  c.moe.router_score = "sigmoid";
  c.moe.expert_bias = true;
  c.moe.expert_bias_rate = 0.01;
  return c;
}

}  // namespace mt_test
