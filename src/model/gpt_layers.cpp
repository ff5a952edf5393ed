// GptT's layers: embedding, transformer block and head, forward and backward, with the
// Megatron tensor-parallel communication points. Notation: N rows of the micro-batch, Nl local
// rows (N / tp under sequence parallelism), P = tp size. With P = 1 every function takes exactly
// the single-rank path (the same kernel calls in the same order), so tp = 1 stays bit-identical
// to the reference implementation that the PyTorch parity tests check.
//
// Without sequence parallelism the block input x is replicated over tp; column-parallel linears
// (QKV, fc) need no communication forward and an all-reduce of their input gradient backward;
// row-parallel linears (attention and MLP projections) all-reduce their output forward. With it
// x is sharded by rows: the LayerNorm output is all-gathered before the column-parallel linear,
// the row-parallel output is reduce-scattered, the column-parallel input gradient is
// reduce-scattered, and the residual-stream gradient is all-gathered before the row-parallel
// backward. Row-parallel biases are added by tp rank 0 only, before the reduction, and their
// gradients come from the full-row output gradient, so every rank has the whole of it.
#include <algorithm>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/timer.hpp"
#include "meshtrain/kernels/attention.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"
#include "meshtrain/kernels/embedding.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/gemm.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/linear.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/kernels/rmsnorm.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

namespace {
// Adds the wall time of a tensor-parallel communication call to a counter. Host time: exact for
// the MPI backend (calls return when done); launch time only for NCCL on a GPU.
struct TpTimer {
  explicit TpTimer(double& acc) : acc_(acc) {}
  ~TpTimer() { acc_ += t_.seconds(); }
  double& acc_;
  Timer t_;
};
}  // namespace

template <class T>
View1<const T> GptT<T>::gather_rows(View1<const T> local, View1<T> full) {
  if (!(layout_.sequence_parallel && tp_active())) return local;
  { TpTimer t(tp_comm_seconds_); layout_.tp->all_gather(local, full); }
  return full;
}

template <class T>
void GptT<T>::row_parallel_forward(View1<T> out, View1<const T> inp, View1<const T> w,
                                   View1<const T> b, int in_cols, View1<const T> residual) {
  const int C = cfg_.n_embd;
  if (!tp_active()) {
    k::linear_forward<T>(exec_, out, inp, w, b, residual, N_, in_cols, C);
    return;
  }
  // The residual must be added once, after the reduction: the partial sums go to proj_out_.
  k::linear_forward<T>(exec_, partial_, inp, w, tp_rank_ == 0 ? b : View1<const T>{}, N_,
                       in_cols, C);
  {
    TpTimer t(tp_comm_seconds_);
    if (layout_.sequence_parallel) layout_.tp->reduce_scatter(partial_, proj_out_);
    else layout_.tp->all_reduce(partial_, proj_out_);
  }
  k::residual_forward<T>(exec_, out, residual, proj_out_, static_cast<std::size_t>(Nl_) * C);
}

template <class T>
void GptT<T>::column_parallel_backward(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout,
                                       View1<const T> inp, View1<const T> w, int out_cols) {
  const int C = cfg_.n_embd;
  if (!tp_active()) {
    k::linear_backward<T>(exec_, dx, dw, db, dout, inp, w, N_, C, out_cols);
    return;
  }
  // Partial input gradient over all rows into dln_, reduced while the weight gradient runs.
  k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N_, C, out_cols, 1.0f, dout.data(), out_cols,
             w.data(), out_cols, 0.0f, dln_.data(), C);
  comm::Request r = layout_.sequence_parallel ? layout_.tp->ireduce_scatter(dln_, dx)
                                              : layout_.tp->iall_reduce(dln_, dx);
  k::linear_backward<T>(exec_, View1<T>{}, dw, db, dout, inp, w, N_, C, out_cols);
  { TpTimer t(tp_comm_seconds_); r.wait(); }
}

template <class T>
void GptT<T>::norm_forward(View1<T> out, View1<float> mean, View1<float> rstd, View1<const T> x,
                           View1<const T> w, View1<const T> b) {
  if (cfg_.norm == Norm::layernorm)
    k::layernorm_forward<T>(exec_, out, mean, rstd, x, w, b, Nl_, cfg_.n_embd);
  else
    k::rmsnorm_forward<T>(exec_, out, rstd, x, w, Nl_, cfg_.n_embd,
                          static_cast<float>(cfg_.norm_eps));
}

template <class T>
void GptT<T>::layernorm_backward_tp(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout,
                                    View1<const T> x, View1<const T> w, View1<const float> mean,
                                    View1<const float> rstd) {
  const int C = cfg_.n_embd;
  const bool ln = cfg_.norm == Norm::layernorm;
  auto backward = [&](View1<T> gw, View1<T> gb) {
    if (ln) k::layernorm_backward<T>(exec_, dx, gw, gb, dout, x, w, mean, rstd, Nl_, C);
    else k::rmsnorm_backward<T>(exec_, dx, gw, dout, x, w, rstd, Nl_, C);
  };
  if (!(layout_.sequence_parallel && tp_active())) {
    backward(dw, db);
    return;
  }
  // Each rank saw only its rows: the parameter gradients are partial sums over tp.
  Kokkos::deep_copy(exec_, ln_dw_, T(0.0f));
  if (ln) Kokkos::deep_copy(exec_, ln_db_, T(0.0f));
  backward(ln_dw_, ln_db_);
  { TpTimer t(tp_comm_seconds_); layout_.tp->all_reduce(ln_dw_); }
  if (ln) { TpTimer t(tp_comm_seconds_); layout_.tp->all_reduce(ln_db_); }
  k::accumulate<T>(exec_, dw, ln_dw_, static_cast<std::size_t>(C));
  if (ln) k::accumulate<T>(exec_, db, ln_db_, static_cast<std::size_t>(C));
}

template <class T>
void GptT<T>::block_forward(int l, View1<const T> x, BlockActivations<T>& a, View1<T> out) {
  if (!cfg_.is_gpt2()) {
    llama_block_forward(l, x, a, out);
    return;
  }
  const int N = N_, Nl = Nl_, C = cfg_.n_embd, P = tp_size_, HS = HS_, I = Il_;
  const bool sp = layout_.sequence_parallel && P > 1;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  k::layernorm_forward<T>(exec_, sp ? ln_local_ : a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln_1_w,
                          w.ln_1_b, Nl, C);
  if (sp) { TpTimer t(tp_comm_seconds_); layout_.tp->all_gather(ln_local_, a.ln1); }
  k::linear_forward<T>(exec_, a.qkv, a.ln1, w.c_attn_w, w.c_attn_b, N, C, 3 * C / P);
  if (ring_)
    ring_->forward(a.atty, a.lse, a.qkv);
  else
    k::attention_forward<T>(exec_, a.atty, a.lse, a.qkv, B_, T_, NHl_, HS);
  row_parallel_forward(a.res2, a.atty, w.attn_proj_w, w.attn_proj_b, C / P, x);
  k::layernorm_forward<T>(exec_, sp ? ln_local_ : a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln_2_w,
                          w.ln_2_b, Nl, C);
  if (sp) { TpTimer t(tp_comm_seconds_); layout_.tp->all_gather(ln_local_, a.ln2); }
  if (a.moe && cfg_.moe.is_moe_layer(l)) {
    moe_mlp_forward(l, a, a.res2, out);
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
  const bool sp = layout_.sequence_parallel && P > 1;
  const BlockTensors<T>& w = block_params_[static_cast<std::size_t>(l)];
  const BlockTensors<T>& g = block_grads_[static_cast<std::size_t>(l)];
  View1<T> dx = sp ? dln_local_ : dln_;  // column-parallel input gradient, local rows
  // MLP: res3 = res2 + proj(gelu(fc(ln2(res2))))
  View1<const T> dfull = gather_rows(dres, dres_full_);
  if (cfg_.moe.is_moe_layer(l)) {
    moe_mlp_backward(l, a, dfull, dx);
  } else {
    // train.recompute_mlp_act: GELU of the kept pre-activation into the shared buffer (on the
    // host in fp32 the forward epilogue's bits; elsewhere GELU of the pre-activation as stored,
    // where the epilogue took it from the unrounded accumulator).
    if (!a.own_mlp_act) k::gelu_forward<T>(exec_, a.fch_gelu, a.fch, std::size_t(N) * I);
    // d(pre-GELU) in one GEMM: the GELU derivative is the input-gradient GEMM's epilogue, and
    // so is c_fc's bias gradient (the column sums of d(pre-GELU)), which c_fc's backward skips.
    k::linear_backward_dgelu<T>(exec_, dfch_, g.mlp_proj_w, g.mlp_proj_b, dfull, a.fch_gelu,
                                w.mlp_proj_w, a.fch, N, I, C, g.c_fc_b);
    column_parallel_backward(dx, g.c_fc_w, View1<T>{}, dfch_, a.ln2, w.c_fc_w, I);
  }
  layernorm_backward_tp(dres, g.ln_2_w, g.ln_2_b, dx, a.res2, w.ln_2_w, a.ln2_mean, a.ln2_rstd);
  // Attention: res2 = x + proj(attn(c_attn(ln1(x))))
  dfull = gather_rows(dres, dres_full_);
  k::linear_backward<T>(exec_, datty_, g.attn_proj_w, g.attn_proj_b, dfull, a.atty,
                        w.attn_proj_w, N, C / P, C);
  if (ring_)
    ring_->backward(dqkv_, datty_, a.qkv, a.atty, a.lse);
  else
    k::attention_backward<T>(exec_, dqkv_, datty_, a.qkv, a.atty, a.lse, B_, T_, NHl_, HS);
  column_parallel_backward(dx, g.c_attn_w, g.c_attn_b, dqkv_, a.ln1, w.c_attn_w, 3 * C / P);
  layernorm_backward_tp(dres, g.ln_1_w, g.ln_1_b, dx, x, w.ln_1_w, a.ln1_mean, a.ln1_rstd);
}

template <class T>
void GptT<T>::embedding_forward(SlotActivations<T>& s) {
  const int C = cfg_.n_embd;
  hook_before_forward(reg_.embedding_unit());
  if (!tp_active()) {
    k::embedding_forward<T>(exec_, s.input, s.tokens, wte_, wpe_, B_, T_, C, 0, Vl_, positions_);
    return;
  }
  // Vocabulary-parallel: tokens outside this rank's rows contribute 0; wpe added once.
  k::embedding_forward<T>(exec_, partial_, s.tokens, wte_, tp_rank_ == 0 ? wpe_ : View1<T>{}, B_,
                          T_, C, v0_, Vl_, positions_);
  TpTimer t(tp_comm_seconds_);
  if (layout_.sequence_parallel) layout_.tp->reduce_scatter(partial_, s.input);
  else layout_.tp->all_reduce(partial_, s.input);
}

template <class T>
void GptT<T>::embedding_backward(SlotActivations<T>& s, View1<const T> dres) {
  const int u = reg_.embedding_unit();
  hook_before_backward(u);
  View1<const T> dfull = gather_rows(dres, dres_full_);
  k::embedding_backward<T>(exec_, dwte_, dwpe_, dfull, s.tokens, B_, T_, cfg_.n_embd, v0_, Vl_,
                          positions_);
  hook_after_backward(u);
}

template <class T>
void GptT<T>::head_forward(SlotActivations<T>& s, View1<const T> x,
                           View1<const std::int32_t> targets, float grad_scale, Mode mode) {
  const int N = N_, C = cfg_.n_embd, V = cfg_.vocab_size;
  const bool sp = layout_.sequence_parallel && tp_active();
  // eu: the unit of the tied embedding the head reads (-1 for an untied head, whose weight is
  // in the head unit).
  const int hu = reg_.head_unit(), eu = cfg_.tied_head ? reg_.embedding_unit() : -1;
  hook_before_forward(hu);
  if (eu >= 0) hook_before_forward(eu);
  norm_forward(sp ? ln_local_ : lnf_, lnf_mean_, lnf_rstd_, x, lnf_w_, lnf_b_);
  if (sp) { TpTimer t(tp_comm_seconds_); layout_.tp->all_gather(ln_local_, lnf_); }
  // LM head [Vl, C] (the tied wte, or lm_head): logits[N, Vl] = lnf[N, C] @ head^T (this rank's
  // vocabulary rows). Its views are read after the hooks, which may bind their storage.
  const View1<T> hw = head_w();
  if (mode == Mode::logits) {
    k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N, Vl_, C, 1.0f, lnf_.data(), C, hw.data(), C,
               0.0f, logits_all_.data(), Vl_);
    return;
  }
  MESHTRAIN_CHECK(targets.span() == static_cast<std::size_t>(N), "model targets have ",
                  targets.span(), " tokens, expected ", N);
  const bool train = mode == Mode::train;
  // The rows in chunks of head_rows_ (train.head_chunk_tokens): each chunk's logits become its
  // dlogits in place and feed its two backward GEMMs before the next chunk overwrites them, so
  // the [N, Vl] logits never exist at once. The weight gradient accumulates over the chunks.
  View1<T> dhw;
  for (int r0 = 0; r0 < N; r0 += head_rows_) {
    const int n = std::min(head_rows_, N - r0);
    const std::size_t row0 = static_cast<std::size_t>(r0);
    k::gemm<T>(exec_, k::Trans::N, k::Trans::T, n, Vl_, C, 1.0f, lnf_.data() + row0 * C, C,
               hw.data(), C, 0.0f, logits_.data(), Vl_);
    const View1<T> lg = slice(logits_, 0, static_cast<std::size_t>(n) * Vl_);
    const View1<float> ls = slice(losses_, row0, n);
    const View1<const std::int32_t> tg = slice(targets, row0, n);
    if (!tp_active()) {
      if (train)
        k::cross_entropy_forward_backward<T>(exec_, ls, lg, tg, n, Vl_, V, grad_scale);
      else
        k::cross_entropy_forward<T>(exec_, ls, lg, tg, n, Vl_, V);
    } else {
      const View1<float> mx = slice(ce_max_, row0, n), sums = slice(ce_sums_, 2 * row0, 2 * n);
      k::vp_ce_max<T>(exec_, mx, lg, n, Vl_, v0_, V);
      { TpTimer t(tp_comm_seconds_); layout_.tp->all_reduce(mx, comm::ReduceOp::max); }
      k::vp_ce_sums<T>(exec_, sums, lg, tg, mx, n, Vl_, v0_, V);
      { TpTimer t(tp_comm_seconds_); layout_.tp->all_reduce(sums); }
      k::vp_ce_finish<T>(exec_, ls, lg, tg, mx, sums, n, Vl_, v0_, V, grad_scale, train);
    }
    if (!train) continue;
    // The head's backward, now: lg holds this chunk's dlogits.
    if (r0 == 0) {
      hook_before_backward(hu);
      if (eu >= 0) hook_before_backward(eu);
      dhw = dhead_w();
    }
    k::gemm<T>(exec_, k::Trans::N, k::Trans::N, n, C, Vl_, 1.0f, lg.data(), Vl_,
               head_w().data(), C, 0.0f, dln_.data() + row0 * C, C);
    // dln's tp reduction overlaps the last chunk's weight-gradient GEMM (the reduce-scatter of
    // sequence parallelism needs every row).
    comm::Request r;
    if (tp_active() && r0 + n == N)
      r = sp ? layout_.tp->ireduce_scatter(dln_, dln_local_) : layout_.tp->iall_reduce(dln_);
    k::gemm<T>(exec_, k::Trans::T, k::Trans::N, Vl_, C, n, 1.0f, lg.data(), Vl_,
               lnf_.data() + row0 * C, C, 1.0f, dhw.data(), C);
    { TpTimer t(tp_comm_seconds_); r.wait(); }
  }
  k::sum_losses(exec_, loss_sum_, losses_, N, true);
  if (!train) return;
  Kokkos::deep_copy(exec_, s.dhead, T(0.0f));
  layernorm_backward_tp(s.dhead, dlnf_w_, dlnf_b_, sp ? dln_local_ : dln_, x, lnf_w_, lnf_mean_,
                        lnf_rstd_);
  hook_after_backward(hu);
  if (eu >= 0 && !layout_.has_embedding) hook_after_backward(eu);  // the tied copy is complete
}

#define MESHTRAIN_INSTANTIATE_GPT_LAYERS(T)                                                       \
  template View1<const T> GptT<T>::gather_rows(View1<const T>, View1<T>);                         \
  template void GptT<T>::row_parallel_forward(View1<T>, View1<const T>, View1<const T>,           \
                                              View1<const T>, int, View1<const T>);               \
  template void GptT<T>::column_parallel_backward(View1<T>, View1<T>, View1<T>, View1<const T>,   \
                                                  View1<const T>, View1<const T>, int);           \
  template void GptT<T>::layernorm_backward_tp(View1<T>, View1<T>, View1<T>, View1<const T>,      \
                                               View1<const T>, View1<const T>,                    \
                                               View1<const float>, View1<const float>);           \
  template void GptT<T>::norm_forward(View1<T>, View1<float>, View1<float>, View1<const T>,        \
                                      View1<const T>, View1<const T>);                            \
  template void GptT<T>::block_forward(int, View1<const T>, BlockActivations<T>&, View1<T>);      \
  template void GptT<T>::block_backward(int, View1<const T>, BlockActivations<T>&, View1<T>);     \
  template void GptT<T>::embedding_forward(SlotActivations<T>&);                                  \
  template void GptT<T>::embedding_backward(SlotActivations<T>&, View1<const T>);                 \
  template void GptT<T>::head_forward(SlotActivations<T>&, View1<const T>,                        \
                                      View1<const std::int32_t>, float, Mode);
MESHTRAIN_INSTANTIATE_GPT_LAYERS(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_LAYERS(bf16)
MESHTRAIN_INSTANTIATE_GPT_LAYERS(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_LAYERS

}  // namespace meshtrain::model
