#pragma once
// Saved activations of the model: per transformer block and micro-batch, and per (chunk, slot).
#include <cstdint>
#include <memory>
#include <vector>

#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/model/registry.hpp"

namespace meshtrain::model {

// Views of one transformer block's parameters (or gradients) in the flat buffer, looked up in
// the registry once when a unit is bound, not by name on every forward and backward.
// GPT-2 fills ln_*, c_attn, attn_proj, c_fc and mlp_proj (Conv1D [in, out]); Llama fills ln_*_w
// (input_layernorm, post_attention_layernorm), q/k/v, attn_proj (o_proj), gate/up and
// mlp_proj (down_proj), all nn.Linear [out, in], and q/k/v biases where the block has them;
// what a family does not have stays empty.
template <class T>
struct BlockTensors {
  View1<T> ln_1_w, ln_1_b, c_attn_w, c_attn_b, attn_proj_w, attn_proj_b;
  View1<T> ln_2_w, ln_2_b, c_fc_w, c_fc_b, mlp_proj_w, mlp_proj_b;
  View1<T> q_w, k_w, v_w, gate_w, up_w;
  View1<T> q_b, k_b, v_b;  // Qwen2's q/k/v biases (model.qkv_bias)
};

// Shapes of one rank's share of a block: N rows of the micro-batch (B*T), Nl local rows (N / tp
// under sequence parallelism, else N), C channels, and the tp-local widths: QW = local query
// heads x head size, KW = local key-value heads x head size (the attention input qkv is
// QW + 2 KW wide; GPT-2: KW = QW), the MLP's first output FW (GELU: I / tp; SwiGLU: gate and up, 2 I / tp) and its
// activation HW = I / tp.
// Views of an MoE block's parameters (or gradients): the router [C, E] and the shared expert
// in the block's unit, this rank's experts' stacked w_in / w_out (expert_stride apart) in the
// expert unit.
template <class T>
struct MoeTensors {
  View1<T> router, shared_in, shared_out, w_in, w_out;
  std::size_t in_stride = 0, out_stride = 0;
};

template <class T>
struct MoeActivations;  // moe_block.cpp
template <class T>
std::shared_ptr<MoeActivations<T>> make_moe_activations();

struct BlockShape {
  int B = 0, T = 0, N = 0, Nl = 0, C = 0, NHl = 0, tp = 1;
  int QW = 0, KW = 0, FW = 0, HW = 0;
  bool norm_mean = true;  // LayerNorm keeps its mean; RMSNorm has none
  bool dense = true, moe = false;  // an MLP's activations / an MoE block's state
  bool own_mlp_act = true;  // false (recompute_mlp_act): fch_gelu is the model's shared buffer
  // An FP8 block (tensorwise, FP8 weight gradients, no full recompute): its linears' inputs
  // ln1, ln2 (dense blocks) and fch_gelu (dense, own_mlp_act) kept as their transposed FP8
  // casts instead of in T (GptT::fp8_keeps_inputs).
  bool fp8_keep = false;
};

template <class T>
struct BlockActivations {
  View1<T> ln1;                         // [N, C] (gathered under SP: the QKV GEMM input)
  View1<float> ln1_mean, ln1_rstd;      // [Nl]
  View1<T> qkv;                         // [N, QW + 2 KW] (rotated q and k under rotary)
  View1<T> atty;                        // [N, QW]
  View1<float> lse;                     // [B, NH/tp, T]
  View1<T> res2;                        // [Nl, C] x + attention projection
  View1<T> ln2;                         // [N, C]
  View1<float> ln2_mean, ln2_rstd;      // [Nl]
  View1<T> fch, fch_gelu;               // [N, FW] before and [N, HW] after the GELU / SwiGLU
  bool own_mlp_act = true;              // fch_gelu is this block's (counted in bytes())
  // BlockShape::fp8_keep: the transposed E4M3 casts the weight gradients read, each one
  // allocation (kernels::fp8_kept_bytes); ln1 / ln2 / fch_gelu are then empty (the forward
  // writes them into backward scratch that is idle until the backward) and *_t is present.
  kernels::Fp8Tensor ln1_t, ln2_t, fch_gelu_t;
  View1<std::uint8_t> ln1_t_bytes, ln2_t_bytes, fch_gelu_t_bytes;
  // The kept cast, or null where the tensor is kept in T.
  const kernels::Fp8Tensor* ln1_kept() const { return kept(ln1_t_bytes, ln1_t); }
  const kernels::Fp8Tensor* ln2_kept() const { return kept(ln2_t_bytes, ln2_t); }
  const kernels::Fp8Tensor* fch_gelu_kept() const { return kept(fch_gelu_t_bytes, fch_gelu_t); }
  // An MoE block's router and expert state (shared_ptr: the type is private to moe_block.cpp).
  std::shared_ptr<MoeActivations<T>> moe;
  // The projections' outputs are not kept: at tp = 1 the residual add is the projection GEMM's
  // epilogue (beta = 1 onto the residual), under tp the reduced sum lands in a model-wide
  // scratch and is added from there; backward needs neither.

  explicit BlockActivations(const BlockShape& s);
  std::size_t bytes() const;

 private:
  static const kernels::Fp8Tensor* kept(const View1<std::uint8_t>& b,
                                        const kernels::Fp8Tensor& t) {
    return b.extent(0) > 0 ? &t : nullptr;
  }
};

// One micro-batch in flight through one chunk.
template <class T>
struct SlotActivations {
  View1<const std::int32_t> tokens;     // embedding chunk: the caller's tokens, for the wte gradient
  View1<T> input;                       // [Nl, C]: embedding output, or a copy of x_in
  std::vector<View1<T>> block_out;      // [Nl, C] per block of the chunk
  std::vector<std::unique_ptr<BlockActivations<T>>> acts;  // per block; empty with recompute
  View1<T> dhead;                       // head chunk: d(loss)/d(last block output) [Nl, C]
  float grad_scale = 0;                 // the forward's, for the MoE router losses' backward
};

template <class T>
struct ChunkActivations {
  LayerRange range;
  bool embed = false, head = false;
  std::vector<std::unique_ptr<SlotActivations<T>>> slots;  // pointers: nothing gets copied
};

}  // namespace meshtrain::model
