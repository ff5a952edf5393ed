#pragma once
// The memory traffic of the FP8 casts of one transformer block (train.precision=fp8), which the
// cost model times at the calibration's elementwise bandwidth. Counted as kernels/linear_fp8.cpp
// and model/gpt_fp8.cpp run them: the casts are memory-bound passes, the traffic bound is what
// kernels that read and write each byte once reach.

namespace meshtrain::plan::detail {

// One block's FP8 linears on one tp rank: widths as cost.cpp's Shapes (local to the rank).
struct Fp8BlockShape {
  double N = 0;        // rows every cast reads (a micro-batch's tokens; gathered under SP)
  double C = 0;        // n_embd
  double QW = 0, KW = 0;  // query and key/value widths (q/k/v's output: QW + 2 KW)
  double FW = 0, I = 0;   // the MLP's first output (SwiGLU: gate | up, 2 I) and second input
  double E = 2;        // bytes per element of the activations' type
  bool mlp = true;     // the MLP's linears in FP8 too (a MoE block's experts: cost.cpp)
  bool llama = true;   // nn.Linear weights [OC, IC], q/k/v and gate/up as column blocks of
                       // packed outputs (GPT-2: Conv1D weights [IC, OC], one c_attn, one c_fc)
};

struct Fp8Casting {
  bool rowwise = false;        // fp8.recipe = rowwise
  bool wgrad_bf16 = false;     // fp8.wgrad_bf16: no casts for the weight gradients
  bool keeps_inputs = false;   // model::Fp8Recipe::keeps_inputs
  bool mlp_act_shared = false; // train.recompute_mlp_act: the MLP's activation is not kept
  bool grad_amax_fused = false; // Fp8Recipe::fuses_grad_amax: the MLP activation's backward
                                // sets the amax of the output gradient it writes
  bool norm_amax_fused = true; // the norms compute the kept inputs' amax (not under SP)
  bool weight_scale_kept = false; // Fp8Recipe::keeps_weight_scale: the backward's cast of a
                                  // weight takes the forward's scale (no second amax pass)
};

struct Fp8CastBytes {
  double forward = 0, backward = 0;  // bytes read plus written
};

// Bytes the casts of the block's forward and backward move in one micro-batch (fp8_casts.cpp
// derives the count).
Fp8CastBytes fp8_cast_bytes(const Fp8BlockShape& s, const Fp8Casting& c);

}  // namespace meshtrain::plan::detail
