// The parallel parts GptT's blocks are built from (Megatron's ColumnParallelLinear and
// RowParallelLinear): the norm in front of a column-parallel linear, the row-parallel linear that
// ends a column/row pair, the column-parallel input gradient and the norm backward whose
// parameters are replicated over tp. Their communication is the tp region's (tp_region.hpp);
// the blocks (gpt2_block.cpp, llama_block.cpp) compose these parts and read as the model.
//
// Notation: N rows of the micro-batch, Nl local rows (N / tp under sequence parallelism). With
// tp = 1 every part takes exactly the single-rank path (the same kernel calls in the same
// order), so tp = 1 stays bit-identical to the reference implementation that the PyTorch parity
// tests check. Row-parallel biases are added by tp rank 0 only, before the reduction, and their
// gradients come from the full-row output gradient, so every rank has the whole of it.
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/layernorm.hpp"
#include "meshtrain/kernels/linear.hpp"
#include "meshtrain/kernels/residual.hpp"
#include "meshtrain/kernels/rmsnorm.hpp"
#include "meshtrain/model/gpt.hpp"
#include "meshtrain/model/gpt_activations.hpp"

namespace meshtrain::model {

namespace k = meshtrain::kernels;

template <class T>
void GptT<T>::norm_forward(View1<T> out, View1<float> mean, View1<float> rstd, View1<const T> x,
                           View1<const T> w, View1<const T> b, View1<float> amax) {
  if (cfg_.norm == Norm::layernorm)
    k::layernorm_forward<T>(exec_, out, mean, rstd, x, w, b, Nl_, cfg_.n_embd, 1e-5f, amax);
  else
    k::rmsnorm_forward<T>(exec_, out, rstd, x, w, Nl_, cfg_.n_embd,
                          static_cast<float>(cfg_.norm_eps), amax);
}

template <class T>
void GptT<T>::norm_enter(View1<T> full, View1<float> mean, View1<float> rstd, View1<const T> x,
                         View1<const T> w, View1<const T> b, View1<float> amax) {
  MESHTRAIN_CHECK(amax.extent(0) == 0 || !tp_.sequence_parallel(),
                  "norm_enter: a fused amax covers this rank's rows only under sequence "
                  "parallelism, not the gathered tensor");
  const View1<T> local = tp_.local_rows(full);
  norm_forward(local, mean, rstd, x, w, b, amax);
  tp_.enter(local, full);
}

template <class T>
void GptT<T>::norm_backward(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout,
                            View1<const T> x, View1<const T> w, View1<const float> mean,
                            View1<const float> rstd) {
  const int C = cfg_.n_embd;
  const bool ln = cfg_.norm == Norm::layernorm;
  auto backward = [&](View1<T> gw, View1<T> gb) {
    if (ln) k::layernorm_backward<T>(exec_, dx, gw, gb, dout, x, w, mean, rstd, Nl_, C);
    else k::rmsnorm_backward<T>(exec_, dx, gw, dout, x, w, rstd, Nl_, C);
  };
  if (!tp_.sequence_parallel()) {
    backward(dw, db);
    return;
  }
  // Each rank saw only its rows: the parameter gradients are partial sums over tp.
  const View1<T> gw = tp_.norm_dw(), gb = tp_.norm_db();
  Kokkos::deep_copy(exec_, gw, T(0.0f));
  if (ln) Kokkos::deep_copy(exec_, gb, T(0.0f));
  backward(gw, gb);
  tp_.sum_replicated(gw);
  if (ln) tp_.sum_replicated(gb);
  k::accumulate<T>(exec_, dw, gw, static_cast<std::size_t>(C));
  if (ln) k::accumulate<T>(exec_, db, gb, static_cast<std::size_t>(C));
}

template <class T>
void GptT<T>::row_parallel_forward(View1<T> out, View1<const T> inp, View1<const T> w,
                                   View1<const T> b, int in_cols, View1<const T> residual) {
  const int C = cfg_.n_embd;
  if (!tp_.active()) {
    k::linear_forward<T>(exec_, out, inp, w, b, residual, N_, in_cols, C);
    return;
  }
  // The residual must be added once, after the reduction: the partial sums go to the region.
  k::linear_forward<T>(exec_, tp_.partial(), inp, w, tp_.rank() == 0 ? b : View1<const T>{}, N_,
                       in_cols, C);
  tp_.exit(tp_.partial(), tp_.reduced());
  k::residual_forward<T>(exec_, out, residual, tp_.reduced(), static_cast<std::size_t>(Nl_) * C);
}

template <class T>
void GptT<T>::row_parallel_forward_nt(View1<T> out, View1<const T> inp, View1<const T> w,
                                      int in_cols, View1<const T> residual) {
  const int C = cfg_.n_embd;
  if (!tp_.active()) {  // the residual is the GEMM's C operand
    k::gemm_ex<T>(exec_, k::Trans::N, k::Trans::T, N_, C, in_cols, 1.0f, inp.data(), in_cols,
                  w.data(), in_cols, 1.0f, residual.data(), C, out.data(), C,
                  k::GemmEpilogue<T>{});
    return;
  }
  // The residual must be added once, after the reduction.
  k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N_, C, in_cols, 1.0f, inp.data(), in_cols,
             w.data(), in_cols, 0.0f, tp_.partial().data(), C);
  tp_.exit(tp_.partial(), tp_.reduced());
  k::residual_forward<T>(exec_, out, residual, tp_.reduced(), static_cast<std::size_t>(Nl_) * C);
}

template <class T>
void GptT<T>::column_parallel_backward(View1<T> dx, View1<T> dw, View1<T> db, View1<const T> dout,
                                       View1<const T> inp, View1<const T> w, int out_cols) {
  const int C = cfg_.n_embd;
  // The input gradient of every row into dln_ (partial over tp; at tp = 1 it is dx, and these
  // are linear_backward's two GEMMs in its order), reduced while the weight gradient runs.
  k::gemm<T>(exec_, k::Trans::N, k::Trans::T, N_, C, out_cols, 1.0f, dout.data(), out_cols,
             w.data(), out_cols, 0.0f, dln_.data(), C);
  comm::Request r = tp_.enter_backward(dln_, dx);
  k::linear_backward<T>(exec_, View1<T>{}, dw, db, dout, inp, w, N_, C, out_cols, false,
                        grad_beta(dw));
  tp_.wait(r);
}

#define MESHTRAIN_INSTANTIATE_GPT_PARALLEL(T)                                                    \
  template void GptT<T>::norm_forward(View1<T>, View1<float>, View1<float>, View1<const T>,      \
                                      View1<const T>, View1<const T>, View1<float>);             \
  template void GptT<T>::norm_enter(View1<T>, View1<float>, View1<float>, View1<const T>,        \
                                    View1<const T>, View1<const T>, View1<float>);               \
  template void GptT<T>::norm_backward(View1<T>, View1<T>, View1<T>, View1<const T>,             \
                                       View1<const T>, View1<const T>, View1<const float>,       \
                                       View1<const float>);                                      \
  template void GptT<T>::row_parallel_forward(View1<T>, View1<const T>, View1<const T>,          \
                                              View1<const T>, int, View1<const T>);              \
  template void GptT<T>::row_parallel_forward_nt(View1<T>, View1<const T>, View1<const T>, int,  \
                                                 View1<const T>);                                \
  template void GptT<T>::column_parallel_backward(View1<T>, View1<T>, View1<T>, View1<const T>,  \
                                                  View1<const T>, View1<const T>, int);
MESHTRAIN_INSTANTIATE_GPT_PARALLEL(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GPT_PARALLEL(bf16)
MESHTRAIN_INSTANTIATE_GPT_PARALLEL(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GPT_PARALLEL

}  // namespace meshtrain::model
