// GptT's Llama block: RMSNorm, q/k/v projections (with Qwen2's biases where model.qkv_bias)
// with rotary q and k, grouped key-value heads,
// causal attention, output projection; RMSNorm, SwiGLU MLP (gate and up in one packed buffer),
// down projection. Weights are nn.Linear [out, in] (HF's layout, so import and export copy), so
// every product multiplies by a transposed weight: y[N, out] = x[N, in] @ W^T.
//
// Tensor parallelism as GPT-2's (gpt2_block.cpp), from the same parts (gpt_parallel.cpp) over the
// same tp region: q/k/v and gate/up column-parallel (rows of their weights split by heads / by
// MLP columns), o_proj and down_proj row-parallel (columns of their weights). Key-value
// heads split by heads when n_kv_head >= tp; when fewer, every rank holds all of k_proj and
// v_proj and projects the one head its query heads read (registry first_kv_head); their weight
// gradients are then partial on each rank and summed over tp here, so that after the block's
// backward they are complete on every rank like every other gradient. Where fp8_block(l)
// (train.precision=fp8) the linears are gpt_fp8.cpp's FP8 parts, one GEMM per projection.
#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/kernels/rotary.hpp"
#include "meshtrain/kernels/swiglu.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;
using k::Trans;
constexpr auto kLinear = k::Fp8WeightLayout::out_in;  // nn.Linear [out, in]

namespace {
// One column-parallel linear of a packed output: its weight [width, C] (rows of the local
// slice), its weight gradient, and its columns [col, col + width) of the packed buffer.
template <class T>
using Piece = LinearPiece<T>;  // b: the forward's bias (Qwen2's q/k/v), or none

// Pieces whose weights, weight gradients and output columns each follow the previous piece's
// in memory become one (the registry lays out q, k, v and gate, up one after another, each at a
// multiple of 64 elements, so they are adjacent unless the kv heads are replicated or a piece's
// size is not such a multiple): one GEMM of the summed width instead of several narrow ones,
// which at Llama 3.2 1B's k/v width (512) ran at ~70 % of a wide GEMM's rate. dw may be null
// (the forward), and so may b; a bias must then follow the previous piece's too. Pieces merge
// only with the same weight-gradient beta: one GEMM overwrites or adds, never both.
template <class T>
int merge_adjacent(const Piece<T>* p, int n, Piece<T>* out, int C) {
  auto follows = [](const T* last, const T* next, std::size_t len) {
    return last == nullptr ? next == nullptr : last + len == next;
  };
  int m = 0;
  for (int i = 0; i < n; ++i) {
    if (m > 0) {
      Piece<T>& last = out[m - 1];
      const std::size_t len = static_cast<std::size_t>(last.width) * C;
      if (last.w + len == p[i].w && follows(last.dw, p[i].dw, len) &&
          follows(last.b, p[i].b, std::size_t(last.width)) && last.col + last.width == p[i].col &&
          last.dw_beta == p[i].dw_beta) {
        last.width += p[i].width;
        continue;
      }
    }
    out[m++] = p[i];
  }
  return m;
}

// dx_partial[N, C] = sum over pieces of dout[:, piece] @ w (the input gradient before the tp
// reduction), and each piece's dw = dw_beta dw + dout[:, piece]^T @ inp.
template <class T>
void input_grad(const ExecSpace& exec, T* dx, const Piece<T>* p, int n, const T* dout, int ld,
                int N, int C) {
  for (int i = 0; i < n; ++i)
    k::gemm<T>(exec, Trans::N, Trans::N, N, C, p[i].width, 1.0f, dout + p[i].col, ld, p[i].w, C,
               i == 0 ? 0.0f : 1.0f, dx, C);
}
template <class T>
void weight_grads(const ExecSpace& exec, const Piece<T>* p, int n, const T* dout, int ld,
                  const T* inp, int N, int C) {
  for (int i = 0; i < n; ++i)
    k::gemm<T>(exec, Trans::T, Trans::N, p[i].width, C, N, 1.0f, dout + p[i].col, ld, inp, C,
               p[i].dw_beta, p[i].dw, C);
}
}  // namespace

template <class T>
void GptT<T>::llama_block_forward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> out) {
  const int N = N_, C = cfg_.n_embd, HS = HS_, QW = QW_, KW = KW_, I = Il_;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  // Attention: res2 = x + o_proj(attn(rope(q, k), v)), q/k/v = proj(norm1(x))
  // Where the block keeps its linears' inputs in FP8, the norm outputs and the MLP activation
  // are written into backward scratch (dln_, dh_: idle until the backward) and only their
  // transposed casts are kept.
  // The norms and the activation also set the kept casts' amaxes (fused_amax: not under
  // sequence parallelism, where a rank's norm sees only its rows).
  const View1<T> ln1_out = a.ln1_kept() != nullptr ? dln_ : a.ln1;
  const View1<float> ln1_amax = fused_amax(a.ln1_kept());
  norm_enter(ln1_out, a.ln1_mean, a.ln1_rstd, x, w.ln_1_w, {}, ln1_amax);
  // q, k, v side by side in one row, [q (QW) | k (KW) | v (KW)]: the attention kernels' grouped
  // layout (query head h reads kv head h / (NHl / NKVl)).
  View1<T> qkv = a.qkv;
  const int ld = QW + 2 * KW;
  const std::size_t kv_row = reg_.kv_replicated() ? static_cast<std::size_t>(kv0_) * HS * C : 0;
  const T* ln1 = ln1_out.data();
  // Qwen2's biases in the GEMM's epilogue (one rounding of x W^T + b, as nn.Linear's addmm).
  const std::size_t kv_col = reg_.kv_replicated() ? static_cast<std::size_t>(kv0_) * HS : 0;
  auto bias = [&](const View1<T>& b, std::size_t b0) -> const T* {
    return cfg_.qkv_bias ? b.data() + b0 : nullptr;
  };
  // q, k, v in one GEMM where their weights are adjacent. Biases the registry's alignment keeps
  // apart are first copied side by side (QW + 2 KW elements), so that the GEMM is the same with
  // and without them (zero biases give the bias-free block's bits).
  Piece<T> parts[3] = {
      {w.q_w.data(), nullptr, 0, QW, bias(w.q_b, 0), {}, fp8_weight_scale(l, kWq)},
      {w.k_w.data() + kv_row, nullptr, QW, KW, bias(w.k_b, kv_col), {}, fp8_weight_scale(l, kWk)},
      {w.v_w.data() + kv_row, nullptr, QW + KW, KW, bias(w.v_b, kv_col), {},
       fp8_weight_scale(l, kWv)}};
  const bool f8 = fp8_block(l);
  if (f8)  // one FP8 GEMM each, with its own weight scale (gpt_fp8.cpp: never merged)
    fp8_column_forward(parts, 3, qkv.data(), ld, ln1, kLinear, a.ln1_kept(),
                       ln1_amax.extent(0) > 0);
  if (!f8 && cfg_.qkv_bias && parts[0].w + std::size_t(QW) * C == parts[1].w &&
      parts[1].w + std::size_t(KW) * C == parts[2].w &&
      !(parts[0].b + QW == parts[1].b && parts[1].b + KW == parts[2].b)) {
    View1<T> cat = qkv_b_;
    Kokkos::deep_copy(exec_, slice(cat, 0, QW), slice(View1<T>(w.q_b), 0, QW));
    Kokkos::deep_copy(exec_, slice(cat, QW, KW), slice(View1<T>(w.k_b), kv_col, KW));
    Kokkos::deep_copy(exec_, slice(cat, QW + KW, KW), slice(View1<T>(w.v_b), kv_col, KW));
    for (int i = 0; i < 3; ++i) parts[i].b = cat.data() + parts[i].col;
  }
  Piece<T> merged[3];
  const int pieces = f8 ? 0 : merge_adjacent(parts, 3, merged, C);
  for (int i = 0; i < pieces; ++i) {
    const Piece<T>& p = merged[i];
    T* out = qkv.data() + p.col;
    if (p.b == nullptr) {
      k::gemm<T>(exec_, Trans::N, Trans::T, N, p.width, C, 1.0f, ln1, C, p.w, C, 0.0f, out, ld);
      continue;
    }
    const k::GemmEpilogue<T> ep{k::Epilogue::bias, p.b, nullptr, 0};
    k::gemm_ex<T>(exec_, Trans::N, Trans::T, N, p.width, C, 1.0f, ln1, C, p.w, C, 0.0f, nullptr,
                  ld, out, ld, ep);
  }
  k::rotary_forward<T>(exec_, qkv, rope_, B_, T_, NHl_, NKVl_);
  if (ring_)
    ring_->forward(a.atty, a.lse, a.qkv);
  else
    k::attention_forward<T>(exec_, a.atty, a.lse, a.qkv, B_, T_, NHl_, HS, NKVl_);
  if (f8)
    fp8_row_forward(a.res2, a.atty, w.attn_proj_w.data(), fp8_weight_scale(l, kWo), nullptr, QW,
                    x, kLinear, nullptr);
  else
    row_parallel_forward_nt(a.res2, a.atty, w.attn_proj_w, QW, x);
  // MLP: out = res2 + down(swiglu(gate_up(norm2(res2))))
  const View1<T> ln2_out = a.ln2_kept() != nullptr ? dln_ : a.ln2;
  const View1<float> ln2_amax = fused_amax(a.ln2_kept());
  norm_enter(ln2_out, a.ln2_mean, a.ln2_rstd, a.res2, w.ln_2_w, {}, ln2_amax);
  if (a.moe && cfg_.moe.is_moe_layer(l)) {
    moe_mlp_forward(l, a, a.res2, out);
    return;
  }
  // [gate | up] of this rank's MLP columns, one packed row each (one GEMM where adjacent)
  const Piece<T> mlp[2] = {
      {w.gate_w.data(), nullptr, 0, I, nullptr, {}, fp8_weight_scale(l, kWgate)},
      {w.up_w.data(), nullptr, I, I, nullptr, {}, fp8_weight_scale(l, kWup)}};
  Piece<T> gate_up[2];
  if (f8) {
    fp8_column_forward(mlp, 2, a.fch.data(), 2 * I, ln2_out.data(), kLinear, a.ln2_kept(),
                       ln2_amax.extent(0) > 0);
    const k::Fp8Tensor* act_kept = a.fch_gelu_kept();
    const View1<T> act = act_kept != nullptr ? dh_ : a.fch_gelu;
    k::swiglu_forward<T>(exec_, act, a.fch, N, I,
                         act_kept != nullptr ? act_kept->amax : View1<float>{});
    fp8_row_forward(out, act, w.mlp_proj_w.data(), fp8_weight_scale(l, kWdown), nullptr, I,
                    a.res2, kLinear, act_kept, act_kept != nullptr);
    return;
  }
  const int n = merge_adjacent(mlp, 2, gate_up, C);
  for (int i = 0; i < n; ++i)
    k::gemm<T>(exec_, Trans::N, Trans::T, N, gate_up[i].width, C, 1.0f, a.ln2.data(), C,
               gate_up[i].w, C, 0.0f, a.fch.data() + gate_up[i].col, 2 * I);
  k::swiglu_forward<T>(exec_, a.fch_gelu, a.fch, N, I);
  row_parallel_forward_nt(out, a.fch_gelu, w.mlp_proj_w, I, a.res2);
}

// dres holds d(loss)/d(block output) on entry and d(loss)/d(block input) on exit (local rows).
template <class T>
void GptT<T>::llama_block_backward(int l, View1<const T> x, BlockActivations<T>& a,
                                   View1<T> dres) {
  const int N = N_, C = cfg_.n_embd, HS = HS_, QW = QW_, KW = KW_, I = Il_;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  const BlockTensors<T>& g = block_grads_[static_cast<std::size_t>(l)];
  const View1<T> dx = tp_.local_grad_rows(dln_);  // column-parallel input gradient, local rows
  const bool f8 = fp8_block(l);
  // The input gradient of a column-parallel group of pieces into dln_ (partial over tp; at
  // tp = 1 it is dx), reduced over tp while the weight gradients run (as
  // column_parallel_backward).
  auto column_parallel = [&](const Piece<T>* pieces, int count, const T* dout, int ld,
                             const T* inp, const k::Fp8Tensor* kept) {
    if (f8) {
      fp8_column_backward(dx, pieces, count, dout, ld, inp, kLinear, kept);
      return;
    }
    // Each piece's beta from its own gradient (a first write overwrites it) before merging.
    Piece<T> own[3], p[3];
    for (int i = 0; i < count; ++i) {
      own[i] = pieces[i];
      own[i].dw_beta = grad_beta(own[i].dw, std::size_t(own[i].width) * C);
    }
    const int n = merge_adjacent(own, count, p, C);
    input_grad<T>(exec_, dln_.data(), p, n, dout, ld, N, C);
    comm::Request r = tp_.enter_backward(dln_, dx);
    weight_grads<T>(exec_, p, n, dout, ld, inp, N, C);
    tp_.wait(r);
  };

  // MLP: out = res2 + down(swiglu(gate_up(norm2(res2))))
  View1<const T> dfull = tp_.exit_backward(dres);
  if (cfg_.moe.is_moe_layer(l)) {
    moe_mlp_backward(l, a, dfull, dx);
  } else {
    // train.recompute_mlp_act: the shared buffer holds a later block's activation; this one's
    // again (the same kernel as the forward: the same bits).
    if (!a.own_mlp_act) k::swiglu_forward<T>(exec_, a.fch_gelu, a.fch, N, I);
    if (f8) {
      fp8_row_backward(dh_.data(), g.mlp_proj_w.data(), nullptr, dfull, a.fch_gelu.data(),
                       w.mlp_proj_w.data(), fp8_weight_scale(l, kWdown), I, kLinear,
                       a.fch_gelu_kept());
    } else {
      k::gemm<T>(exec_, Trans::N, Trans::N, N, I, C, 1.0f, dfull.data(), C, w.mlp_proj_w.data(),
                 I, 0.0f, dh_.data(), I);
      k::gemm<T>(exec_, Trans::T, Trans::N, C, I, N, 1.0f, dfull.data(), C, a.fch_gelu.data(), I,
                 grad_beta(g.mlp_proj_w), g.mlp_proj_w.data(), I);
    }
    // Under FP8, SwiGLU's backward also sets the amaxes of the gate and up gradients' casts
    // (where fused): two pieces, two scales.
    const View1<float> dfch_amax = fused_grad_amax(l, 2);
    k::swiglu_backward<T>(exec_, dfch_, a.fch, dh_, N, I, dfch_amax);
    Piece<T> mlp[2] = {
        {w.gate_w.data(), g.gate_w.data(), 0, I, nullptr, {}, fp8_weight_scale(l, kWgate)},
        {w.up_w.data(), g.up_w.data(), I, I, nullptr, {}, fp8_weight_scale(l, kWup)}};
    if (dfch_amax.extent(0) > 0)
      for (int i = 0; i < 2; ++i) mlp[i].dout_amax = slice(dfch_amax, std::size_t(i), 1);
    column_parallel(mlp, 2, dfch_.data(), 2 * I, a.ln2.data(), a.ln2_kept());
  }
  norm_backward(dres, g.ln_2_w, {}, dx, a.res2, w.ln_2_w, a.ln2_mean, a.ln2_rstd);

  // Attention: res2 = x + o_proj(attn(rope(q, k), v)), q/k/v = proj(norm1(x))
  dfull = tp_.exit_backward(dres);
  if (f8) {
    fp8_row_backward(datty_.data(), g.attn_proj_w.data(), nullptr, dfull, a.atty.data(),
                     w.attn_proj_w.data(), fp8_weight_scale(l, kWo), QW, kLinear, nullptr);
  } else {
    k::gemm<T>(exec_, Trans::N, Trans::N, N, QW, C, 1.0f, dfull.data(), C, w.attn_proj_w.data(),
               QW, 0.0f, datty_.data(), QW);
    k::gemm<T>(exec_, Trans::T, Trans::N, C, QW, N, 1.0f, dfull.data(), C, a.atty.data(), QW,
               grad_beta(g.attn_proj_w), g.attn_proj_w.data(), QW);
  }
  // dK and dV of each kv head are summed over its query heads by the kernel.
  if (ring_)
    ring_->backward(dqkv_, datty_, a.qkv, a.atty, a.lse);
  else
    k::attention_backward<T>(exec_, dqkv_, datty_, a.qkv, a.atty, a.lse, B_, T_, NHl_, HS, NKVl_);
  View1<T> dqkv = dqkv_;
  k::rotary_backward<T>(exec_, dqkv, rope_, B_, T_, NHl_, NKVl_);
  // Replicated kv heads: this rank's rows of the k/v weight gradients land in a zeroed scratch
  // that is summed over tp before it is added.
  const bool kv_sum = kv_dw_.span() > 0;
  const std::size_t kv_row = reg_.kv_replicated() ? static_cast<std::size_t>(kv0_) * HS * C : 0;
  const std::size_t kv_numel = static_cast<std::size_t>(cfg_.kv_heads()) * HS * C;
  if (kv_sum) Kokkos::deep_copy(exec_, kv_dw_, T(0.0f));
  T* dk = (kv_sum ? kv_dw_.data() : g.k_w.data()) + kv_row;
  T* dv = (kv_sum ? kv_dw_.data() + kv_numel : g.v_w.data()) + kv_row;
  // Qwen2's bias gradients: column sums of dq, dk, dv over the rows (the replicated kv heads'
  // into the scratch after both weight gradients, summed over tp with them).
  const std::size_t kv_bias = static_cast<std::size_t>(cfg_.kv_heads()) * HS;
  if (cfg_.qkv_bias) {
    const std::size_t kv_col = reg_.kv_replicated() ? static_cast<std::size_t>(kv0_) * HS : 0;
    T* dkb = (kv_sum ? kv_dw_.data() + 2 * kv_numel : g.k_b.data()) + kv_col;
    T* dvb = (kv_sum ? kv_dw_.data() + 2 * kv_numel + kv_bias : g.v_b.data()) + kv_col;
    const int ld = QW + 2 * KW;
    k::column_sums_add<T>(exec_, N, QW, dqkv.data(), ld, g.q_b.data());
    k::column_sums_add<T>(exec_, N, KW, dqkv.data() + QW, ld, dkb);
    k::column_sums_add<T>(exec_, N, KW, dqkv.data() + QW + KW, ld, dvb);
  }
  const Piece<T> attn[3] = {
      {w.q_w.data(), g.q_w.data(), 0, QW, nullptr, {}, fp8_weight_scale(l, kWq)},
      {w.k_w.data() + kv_row, dk, QW, KW, nullptr, {}, fp8_weight_scale(l, kWk)},
      {w.v_w.data() + kv_row, dv, QW + KW, KW, nullptr, {}, fp8_weight_scale(l, kWv)}};
  column_parallel(attn, 3, dqkv.data(), QW + 2 * KW, a.ln1.data(), a.ln1_kept());
  if (kv_sum) {
    tp_.sum_replicated(kv_dw_);
    k::accumulate<T>(exec_, g.k_w, slice(View1<T>(kv_dw_), 0, kv_numel), kv_numel);
    k::accumulate<T>(exec_, g.v_w, slice(View1<T>(kv_dw_), kv_numel, kv_numel), kv_numel);
    if (cfg_.qkv_bias) {
      k::accumulate<T>(exec_, g.k_b, slice(View1<T>(kv_dw_), 2 * kv_numel, kv_bias), kv_bias);
      k::accumulate<T>(exec_, g.v_b, slice(View1<T>(kv_dw_), 2 * kv_numel + kv_bias, kv_bias),
                       kv_bias);
    }
  }
  norm_backward(dres, g.ln_1_w, {}, dx, x, w.ln_1_w, a.ln1_mean, a.ln1_rstd);
}

#define MESHTRAIN_INSTANTIATE_LLAMA_BLOCK(T)                                                     \
  template void GptT<T>::llama_block_forward(int, View1<const T>, BlockActivations<T>&,          \
                                             View1<T>);                                          \
  template void GptT<T>::llama_block_backward(int, View1<const T>, BlockActivations<T>&,         \
                                              View1<T>);
MESHTRAIN_INSTANTIATE_LLAMA_BLOCK(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_LLAMA_BLOCK(bf16)
MESHTRAIN_INSTANTIATE_LLAMA_BLOCK(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_LLAMA_BLOCK

}  // namespace meshtrain::model
