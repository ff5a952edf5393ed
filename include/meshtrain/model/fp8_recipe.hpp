#pragma once
// The FP8 recipe of train.precision=fp8 (issue 35): which linears run their GEMMs in FP8, with
// which scaling, and over which groups each cast's amax is agreed so that every layout computes
// what one rank does (DESIGN invariant 1).
//
// FP8 are the transformer blocks' linear layers (GPT-2's c_attn, attention c_proj, c_fc, MLP
// c_proj; Llama's q/k/v, o, gate/up, down; a MoE block's attention linears), forward E4M3 x E4M3,
// input gradient E5M2 x E4M3, weight gradient E5M2 x E4M3 or (wgrad_bf16) the model's type;
// kernels/linear_fp8.hpp has the GEMM forms. With fp8.experts a MoE block's experts and shared
// expert run their forward and input-gradient GEMMs in FP8 too, always rowwise (a scale per
// token: no layout changes an expert's casts) with the weight gradient in the model's type
// (moe/grouped_gemm.hpp's ExpertFp8); without, they stay in the model's type. Embeddings, the
// LM head, attention, norms and MoE routers stay in the model's type. The first and last first_last_bf16 blocks do too (Megatron's
// --first-last-layers-bf16).
//
// Agreement. Every cast's scales must be those of the whole tensor (tensorwise) or of the whole
// row (rowwise, the row running along the GEMM's K). A tensor split over a group gets its amax
// agreed over that group where its scale covers the split: tensorwise always, rowwise only where
// the split dimension is the cast's K (a split of the rows themselves leaves each row whole).
//  - tp: a column-parallel linear's weight (split by output features) and output gradient
//    (split by columns); a row-parallel linear's weight (split by input features) and input
//    (split by columns). Their other operands — the column-parallel input, all-gathered under
//    sequence parallelism, and the row-parallel output gradient, all-gathered likewise — are
//    whole on every tp rank: sequence parallelism adds nothing, since every cast reads all N rows.
//  - cp: inputs and output gradients are split by tokens (dimension 0); weights are whole.
//  - dp and pp: every rank holds whole tensors (its micro-batches, its blocks): nothing. A
//    dp layout equals one rank for the same micro-batch size (the scale is a micro-batch's).
// Where the kv heads are fewer than tp (replicated k/v weights), each rank's k/v output
// gradient is a partial sum over its query heads: its cast is not the whole tensor's, so such
// layouts match one rank only to FP8 rounding, not to reduction order.
#include <string>

#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/model/config.hpp"

namespace meshtrain::model {

struct Fp8Recipe {
  bool enabled = false;                                         // train.precision=fp8
  kernels::Fp8Scaling scaling = kernels::Fp8Scaling::tensorwise;  // fp8.recipe
  int first_last_bf16 = 0;                                      // fp8.first_last_bf16
  bool wgrad_bf16 = false;                                      // fp8.wgrad_bf16
  bool experts = false;  // fp8.experts: MoE experts' GEMMs in FP8 too (moe/grouped_gemm.hpp)
  // Tensorwise: the MLP activation's backward kernel (GELU's, SwiGLU's) also sets the amaxes of
  // the output-gradient casts it feeds (c_fc's; gate_proj's and up_proj's), so those casts
  // read their tensors once. Off, each cast reduces its own amax: the same bits, one more read
  // of [N, I] per piece (the comparison test_fp8_fused_grad_amax makes; no option sets it).
  bool fused_grad_amax = true;
  // Tensorwise: each FP8 weight's forward cast keeps its scale for the backward's cast of W^T
  // (Fp8LinearOptions::weight_scale), so the backward neither reads W for its amax nor agrees
  // it again. Off, the backward reduces the same amax anew: the same bits, one more read of
  // every FP8 weight per micro-batch (test_fp8_fused_grad_amax compares; no option sets it).
  bool keep_weight_scale = true;
  // Whether block l (global index) of n_layer runs its linears in FP8.
  bool fp8_block(int l, int n_layer) const {
    return enabled && l >= first_last_bf16 && l < n_layer - first_last_bf16;
  }
  // Whether block l's MoE experts (and shared expert) run their GEMMs in FP8.
  bool fp8_experts(int l, int n_layer) const { return experts && fp8_block(l, n_layer); }
  // Whether the MLP activation's backward of block l sets its output-gradient casts' amaxes.
  bool fuses_grad_amax(int l, int n_layer) const {
    return fp8_block(l, n_layer) && scaling == kernels::Fp8Scaling::tensorwise &&
           fused_grad_amax;
  }
  // Whether block l's FP8 weights keep their forward's scale for the backward.
  bool keeps_weight_scale(int l, int n_layer) const {
    return fp8_block(l, n_layer) && scaling == kernels::Fp8Scaling::tensorwise &&
           keep_weight_scale;
  }
  // Whether block l keeps its linears' inputs as their transposed FP8 casts instead of in the
  // model's type (BlockShape::fp8_keep; the weight gradients' operand, cast in the forward's
  // pass): tensorwise scaling and FP8 weight gradients, and activations kept between forward
  // and backward (not under full recomputation, whose one shared set is rewritten anyway).
  bool keeps_inputs(int l, int n_layer, bool recompute) const {
    return fp8_block(l, n_layer) && scaling == kernels::Fp8Scaling::tensorwise && !wgrad_bf16 &&
           !recompute;
  }
};

// A block's FP8 weights, each with a kept scale where Fp8Recipe::keeps_weight_scale (GptT::
// fp8_weight_scale): Llama's q, k, v, o, gate, up, down; GPT-2's c_attn, attention c_proj, c_fc
// and MLP c_proj in the slots of q, o, up and down.
enum Fp8WeightSlot : int { kWq, kWk, kWv, kWo, kWgate, kWup, kWdown, kFp8WeightSlots };

// The share of a token's model FLOPs (GptConfig::flops_per_token, what MFU counts) that FP8 GEMMs
// compute: 6 FLOPs per weight of an FP8 block's linears (forward 2, input gradient 2, weight
// gradient 2; 4 with wgrad_bf16) and, with fp8.experts, 4 per weight of a token's experts
// (top_k and the shared one: their weight gradients stay in the model's type). 0 when
// fp8 is off. MFU stays stated against the bf16 peak, as TorchTitan and Megatron report it; this
// share says how much of that work ran at the FP8 rate.
double fp8_flops_share(const GptConfig& cfg, const Fp8Recipe& recipe, int seq_len);

// "tensorwise" | "rowwise"; a ConfigError naming `option` otherwise.
kernels::Fp8Scaling parse_fp8_recipe(const std::string& text, const char* option);

// How tensor parallelism splits a linear (Megatron's column / row parallel).
enum class TpSplit { column, row };

// The dimension of the cast's tensor (inp [N, IC], dout [N, OC], weight as stored in `layout`)
// that tp splits, or -1.
int tp_split_dim(TpSplit split, kernels::Fp8WeightLayout layout, const char* tensor);
// Whether the cast's amax is agreed over tp (see above).
bool agree_over_tp(TpSplit split, kernels::Fp8WeightLayout layout, const kernels::Fp8Cast& cast);
// Whether it is agreed over cp (tokens: dimension 0 of inp and dout).
bool agree_over_cp(const kernels::Fp8Cast& cast);

}  // namespace meshtrain::model
