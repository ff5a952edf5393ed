// GptT's GPT-2 block, forward and backward: LayerNorm, c_attn (q, k, v; column-parallel),
// causal attention over this rank's heads, c_proj (row-parallel) plus the residual; LayerNorm,
// c_fc (column-parallel) with GELU, c_proj (row-parallel) plus the residual. Weights are HF's
// Conv1D [in, out]. The parallel parts (gpt_parallel.cpp) carry the tensor- and
// sequence-parallel communication; with sequence parallelism the block's input and output (the
// residual stream) are this rank's N / tp rows, everything between a norm and its row-parallel
// projection holds all N rows. Where fp8_block(l) (train.precision=fp8) the four linears are
// gpt_fp8.cpp's FP8 parts, GELU and the biases outside the GEMMs.
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/linear.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

namespace {
constexpr auto kConv1D = k::Fp8WeightLayout::in_out;
template <class V>
auto ptr(const V& v) {  // a bias's data, or null where the model has none
  return v.span() > 0 ? v.data() : nullptr;
}
}  // namespace

template <class T>
void GptT<T>::block_forward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> out) {
  if (!cfg_.is_gpt2()) {
    llama_block_forward(l, x, a, out);
    return;
  }
  const int N = N_, C = cfg_.n_embd, P = tp_size_, HS = HS_, I = Il_;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  // Attention: res2 = x + c_proj(attn(c_attn(ln1(x))))
  const bool f8 = fp8_block(l);
  // Where the block keeps its linears' inputs in FP8, the norm outputs and the GELU output are
  // written into backward scratch (dln_, dh_: idle until the backward) and only their
  // transposed casts are kept.
  // The norms and the activation also set the kept casts' amaxes (fused_amax: not under
  // sequence parallelism, where a rank's norm sees only its rows).
  const View1<T> ln1_out = a.ln1_kept() != nullptr ? dln_ : a.ln1;
  const View1<float> ln1_amax = fused_amax(a.ln1_kept());
  norm_enter(ln1_out, a.ln1_mean, a.ln1_rstd, x, w.ln_1_w, w.ln_1_b, ln1_amax);
  if (f8) {
    const LinearPiece<T> c_attn{w.c_attn_w.data(), nullptr, 0, 3 * C / P, ptr(w.c_attn_b), {},
                                fp8_weight_scale(l, kWq)};
    fp8_column_forward(&c_attn, 1, a.qkv.data(), 3 * C / P, ln1_out.data(), kConv1D,
                       a.ln1_kept(), ln1_amax.extent(0) > 0);
  } else {
    k::linear_forward<T>(exec_, a.qkv, a.ln1, w.c_attn_w, w.c_attn_b, N, C, 3 * C / P);
  }
  if (ring_)
    ring_->forward(a.atty, a.lse, a.qkv);
  else
    k::attention_forward<T>(exec_, a.atty, a.lse, a.qkv, B_, T_, NHl_, HS);
  if (f8)
    fp8_row_forward(a.res2, a.atty, w.attn_proj_w.data(), fp8_weight_scale(l, kWo),
                    ptr(w.attn_proj_b), C / P, x, kConv1D, nullptr);
  else
    row_parallel_forward(a.res2, a.atty, w.attn_proj_w, w.attn_proj_b, C / P, x);
  // MLP: out = res2 + c_proj(gelu(c_fc(ln2(res2))))
  const View1<T> ln2_out = a.ln2_kept() != nullptr ? dln_ : a.ln2;
  const View1<float> ln2_amax = fused_amax(a.ln2_kept());
  norm_enter(ln2_out, a.ln2_mean, a.ln2_rstd, a.res2, w.ln_2_w, w.ln_2_b, ln2_amax);
  if (a.moe && cfg_.moe.is_moe_layer(l)) {
    moe_mlp_forward(l, a, a.res2, out);
    return;
  }
  if (f8) {
    const LinearPiece<T> c_fc{w.c_fc_w.data(), nullptr, 0, I, ptr(w.c_fc_b), {},
                              fp8_weight_scale(l, kWup)};
    fp8_column_forward(&c_fc, 1, a.fch.data(), I, ln2_out.data(), kConv1D, a.ln2_kept(),
                       ln2_amax.extent(0) > 0);
    const k::Fp8Tensor* act_kept = a.fch_gelu_kept();
    const View1<T> act = act_kept != nullptr ? dh_ : a.fch_gelu;
    k::gelu_forward<T>(exec_, act, a.fch, std::size_t(N) * I,
                       act_kept != nullptr ? act_kept->amax : View1<float>{});
    fp8_row_forward(out, act, w.mlp_proj_w.data(), fp8_weight_scale(l, kWdown),
                    ptr(w.mlp_proj_b), I, a.res2, kConv1D, act_kept, act_kept != nullptr);
    return;
  }
  k::linear_gelu_forward<T>(exec_, a.fch_gelu, a.fch, a.ln2, w.c_fc_w, w.c_fc_b, N, C, I);
  row_parallel_forward(out, a.fch_gelu, w.mlp_proj_w, w.mlp_proj_b, I, a.res2);
}

// dres holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit (local rows).
template <class T>
void GptT<T>::block_backward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> dres) {
  if (!cfg_.is_gpt2()) {
    llama_block_backward(l, x, a, dres);
    return;
  }
  const int N = N_, C = cfg_.n_embd, P = tp_size_, HS = HS_, I = Il_;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  const BlockTensors<T>& g = block_grads_[static_cast<std::size_t>(l)];
  const View1<T> dx = tp_.local_grad_rows(dln_);  // column-parallel input gradient, local rows
  const bool f8 = fp8_block(l);
  // MLP: res3 = res2 + proj(gelu(fc(ln2(res2))))
  View1<const T> dfull = tp_.exit_backward(dres);
  if (cfg_.moe.is_moe_layer(l)) {
    moe_mlp_backward(l, a, dfull, dx);
  } else {
    // train.recompute_mlp_act: GELU of the kept pre-activation into the shared buffer (on the
    // host in fp32 the forward epilogue's bits; elsewhere GELU of the pre-activation as stored,
    // where the epilogue took it from the unrounded accumulator; under FP8 the forward's own
    // kernel).
    if (!a.own_mlp_act) k::gelu_forward<T>(exec_, a.fch_gelu, a.fch, std::size_t(N) * I);
    if (f8) {
      // d(GELU output) from the FP8 GEMM, then GELU's derivative (with the amax of c_fc's
      // output-gradient cast, where fused) and c_fc's bias gradient.
      fp8_row_backward(dh_.data(), g.mlp_proj_w.data(), ptr(g.mlp_proj_b), dfull,
                       a.fch_gelu.data(), w.mlp_proj_w.data(), fp8_weight_scale(l, kWdown), I,
                       kConv1D, a.fch_gelu_kept());
      const View1<float> dfch_amax = fused_grad_amax(l, 1);
      k::gelu_backward<T>(exec_, dfch_, a.fch, dh_, std::size_t(N) * I, dfch_amax);
      if (ptr(g.c_fc_b)) k::column_sums_add<T>(exec_, N, I, dfch_.data(), I, g.c_fc_b.data());
      const LinearPiece<T> fc{w.c_fc_w.data(), g.c_fc_w.data(), 0, I, nullptr, dfch_amax,
                              fp8_weight_scale(l, kWup)};
      fp8_column_backward(dx, &fc, 1, dfch_.data(), I, a.ln2.data(), kConv1D, a.ln2_kept());
    } else {
      // d(pre-GELU) in one GEMM: the GELU derivative is the input-gradient GEMM's epilogue, and
      // so is c_fc's bias gradient (the column sums of d(pre-GELU)), which c_fc's backward skips.
      k::linear_backward_dgelu<T>(exec_, dfch_, g.mlp_proj_w, g.mlp_proj_b, dfull, a.fch_gelu,
                                  w.mlp_proj_w, a.fch, N, I, C, g.c_fc_b,
                                  grad_beta(g.mlp_proj_w));
      column_parallel_backward(dx, g.c_fc_w, View1<T>{}, dfch_, a.ln2, w.c_fc_w, I);
    }
  }
  norm_backward(dres, g.ln_2_w, g.ln_2_b, dx, a.res2, w.ln_2_w, a.ln2_mean, a.ln2_rstd);
  // Attention: res2 = x + proj(attn(c_attn(ln1(x))))
  dfull = tp_.exit_backward(dres);
  if (f8)
    fp8_row_backward(datty_.data(), g.attn_proj_w.data(), ptr(g.attn_proj_b), dfull,
                     a.atty.data(), w.attn_proj_w.data(), fp8_weight_scale(l, kWo), C / P,
                     kConv1D, nullptr);
  else
    k::linear_backward<T>(exec_, datty_, g.attn_proj_w, g.attn_proj_b, dfull, a.atty,
                          w.attn_proj_w, N, C / P, C, false, grad_beta(g.attn_proj_w));
  if (ring_)
    ring_->backward(dqkv_, datty_, a.qkv, a.atty, a.lse);
  else
    k::attention_backward<T>(exec_, dqkv_, datty_, a.qkv, a.atty, a.lse, B_, T_, NHl_, HS);
  if (f8) {
    if (ptr(g.c_attn_b))
      k::column_sums_add<T>(exec_, N, 3 * C / P, dqkv_.data(), 3 * C / P, g.c_attn_b.data());
    const LinearPiece<T> qkv{w.c_attn_w.data(), g.c_attn_w.data(), 0, 3 * C / P, nullptr, {},
                             fp8_weight_scale(l, kWq)};
    fp8_column_backward(dx, &qkv, 1, dqkv_.data(), 3 * C / P, a.ln1.data(), kConv1D,
                        a.ln1_kept());
  } else {
    column_parallel_backward(dx, g.c_attn_w, g.c_attn_b, dqkv_, a.ln1, w.c_attn_w, 3 * C / P);
  }
  norm_backward(dres, g.ln_1_w, g.ln_1_b, dx, x, w.ln_1_w, a.ln1_mean, a.ln1_rstd);
}

#define MESHTRAIN_INSTANTIATE_GPT2_BLOCK(T)                                                      \
  template void GptT<T>::block_forward(int, View1<const T>, BlockActivations<T>&, View1<T>);     \
  template void GptT<T>::block_backward(int, View1<const T>, BlockActivations<T>&, View1<T>);
MESHTRAIN_INSTANTIATE_GPT2_BLOCK(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT2_BLOCK(bf16)
MESHTRAIN_INSTANTIATE_GPT2_BLOCK(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT2_BLOCK

}  // namespace meshtrain::model
