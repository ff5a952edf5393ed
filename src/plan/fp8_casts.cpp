// Bytes of the FP8 casts of one block (fp8_casts.hpp).
//
// Current scaling casts a tensor in two passes: one reads it for its amax, the next reads it
// again and writes one byte per element (E4M3 forward, E5M2 gradients): 2E + 1 bytes per
// element, E the bytes of the activations' type. A block's casts per micro-batch, with W its
// weights (every linear's), G its output gradients, X its linears' inputs — ln1 (q/k/v's), the
// attention output (o's), ln2 (gate/up's or c_fc's) and the activation (down's or c_proj's),
// each cast once however many linears read it:
//
//   tensorwise  forward   W (2E + 1) + X (2E + 1)
//               backward  W (2E + 1)              the weights again, in the input gradient's
//                                                 orientation (casts are redone every call);
//                                                 W (E + 1) where the forward's scale is kept
//                                                 (Fp8Recipe::keeps_weight_scale: no amax pass)
//                       + G (2E + 2)              both orientations from one pass: the input
//                                                 gradient's and the weight gradient's
//                       + X (2E + 1)              the inputs' transposes the weight gradients read
//     with wgrad_bf16: G (2E + 1), no input transposes (that GEMM reads the inputs as they are).
//     The output gradient of the MLP's first linear (c_fc's; gate's and up's) has its amax set
//     by the activation's backward (Fp8Recipe::fuses_grad_amax): E fewer.
//     Blocks that keep their inputs (Fp8Recipe::keeps_inputs: ln1, ln2, the activation unless
//     train.recompute_mlp_act shares it) write both orientations in the forward's pass, the
//     amax taken by the kernel that produced the input (the norms' only without SP): E + 2
//     (2E + 2 for an unfused amax); the backward reads the kept transposes and casts the
//     others' (the attention output's always).
//   rowwise     one scale per row along each GEMM's K: an operand read along its other
//               dimension is first transposed in the layer's type (2E more: read and write),
//               a column block of a packed buffer first copied out (2E more), and nothing is
//               cast in two orientations at once:
//               forward   W (2E + 1) + X (2E + 1)      + W 2E on GPT-2 (Conv1D's weight is
//                                                      read transposed by the forward)
//               backward  W (2E + 1)                   + W 2E on Llama (by the input gradient)
//                       + G (2E + 1) + Gp 2E           the input gradient's cast, Gp the
//                                                      column-block gradients (Llama's q/k/v,
//                                                      gate/up)
//                       + G (4E + 1) + Gp 2E           the weight gradient's: G^T
//                       + X (4E + 1)                   and X^T (none with wgrad_bf16)
//
// Left out: the amax agreement over tp/cp (a few floats), the scales (one kernel per cast).
#include "fp8_casts.hpp"

namespace meshtrain::plan::detail {

Fp8CastBytes fp8_cast_bytes(const Fp8BlockShape& s, const Fp8Casting& c) {
  const double E = s.E, N = s.N, C = s.C;
  const double qkv = s.QW + 2 * s.KW;
  const double W = C * qkv + s.QW * C + (s.mlp ? C * s.FW + s.I * C : 0.0);
  const double G = N * (qkv + C) + (s.mlp ? N * (s.FW + C) : 0.0);
  const double norms = N * C * (s.mlp ? 2 : 1);  // ln1, ln2
  const double act = s.mlp ? N * s.I : 0.0;
  const double atty = N * s.QW;                  // never kept (the attention's output)
  const double X = norms + act + atty;
  const double cast = 2 * E + 1;
  Fp8CastBytes b;
  if (!c.rowwise) {
    const double kept_norms = c.keeps_inputs ? norms : 0.0;
    const double kept_act = c.keeps_inputs && !c.mlp_act_shared ? act : 0.0;
    const double kept = kept_norms + kept_act;
    const double kept_bytes =
        kept_norms * (c.norm_amax_fused ? E + 2 : cast + 1) + kept_act * (E + 2);
    b.forward = W * cast + (X - kept) * cast + kept_bytes;
    const double fused_grad = c.grad_amax_fused && s.mlp ? N * s.FW : 0.0;
    const double weight_cast = c.weight_scale_kept ? E + 1 : cast;
    b.backward = W * weight_cast + G * (c.wgrad_bf16 ? cast : cast + 1) - fused_grad * E +
                 (c.wgrad_bf16 ? 0.0 : (X - kept) * cast);
    return b;
  }
  const double Gp = s.llama ? N * (qkv + (s.mlp ? s.FW : 0.0)) : 0.0;
  const double transpose = 2 * E;
  b.forward = W * cast + X * cast + (s.llama ? 0.0 : W * transpose);
  b.backward = W * cast + (s.llama ? W * transpose : 0.0) + G * cast + Gp * transpose;
  if (!c.wgrad_bf16) b.backward += (G + X) * (transpose + cast) + Gp * transpose;
  return b;
}

}  // namespace meshtrain::plan::detail
