// Linear layer on top of gemm_ex / gemm_dbias: the bias, the residual, the GELU and its
// gradient, and the bias gradient ride in the GEMM's epilogue (one cuBLASLt call on CUDA)
// instead of separate passes over the activations.
#include "meshtrain/kernels/linear.hpp"

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"

namespace meshtrain::kernels {

namespace {

void check_shape(const char* fn, int N, int IC, int OC) {
  MESHTRAIN_CHECK(N >= 0 && IC > 0 && OC > 0, fn, ": bad shape N=", N, ", IC=", IC, ", OC=", OC);
}

// dweight[IC, OC] = beta dweight + inp[N, IC]^T @ dout[N, OC], and dbias[OC] += sum_rows(dout)
// fused in (gemm_dbias adds into dbias whatever beta is).
template <class T>
void weight_and_bias_grad(const ExecSpace& exec, const char* fn, View1<T> dweight, View1<T> dbias,
                          View1<const T> dout, View1<const T> inp, int N, int IC, int OC,
                          float beta) {
  detail::check_extent(dweight, std::size_t(IC) * OC, fn, "dweight");
  if (detail::present(dbias)) {
    detail::check_extent(dbias, OC, fn, "dbias");
    gemm_dbias<T>(exec, Trans::T, IC, OC, N, 1.0f, inp.data(), IC, dout.data(), OC, beta,
                  dweight.data(), OC, dbias.data());
  } else {
    gemm<T>(exec, Trans::T, Trans::N, IC, OC, N, 1.0f, inp.data(), IC, dout.data(), OC, beta,
            dweight.data(), OC);
  }
}

}  // namespace

template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, View1<const T> residual, int N,
                    int IC, int OC) {
  const char* fn = "linear_forward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(out, std::size_t(N) * OC, fn, "out");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  GemmEpilogue<T> ep;
  if (detail::present(bias)) {
    detail::check_extent(bias, OC, fn, "bias");
    ep.kind = Epilogue::bias;
    ep.bias = bias.data();
  }
  const bool has_res = detail::present(residual);
  if (has_res) detail::check_extent(residual, std::size_t(N) * OC, fn, "residual");
  // out[N, OC] = inp[N, IC] @ weight[IC, OC] (+ residual as C, beta = 1) (+ bias)
  gemm_ex<T>(exec, Trans::N, Trans::N, N, OC, IC, 1.0f, inp.data(), IC, weight.data(), OC,
             has_res ? 1.0f : 0.0f, has_res ? residual.data() : nullptr, OC, out.data(), OC, ep);
}

template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, int N, int IC, int OC) {
  linear_forward<T>(exec, out, inp, weight, bias, View1<const T>(), N, IC, OC);
}

template <class T>
void linear_gelu_forward(const ExecSpace& exec, View1<T> out_gelu, View1<T> pre_gelu,
                         View1<const T> inp, View1<const T> weight, View1<const T> bias, int N,
                         int IC, int OC) {
  const char* fn = "linear_gelu_forward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(out_gelu, std::size_t(N) * OC, fn, "out_gelu");
  detail::check_extent(pre_gelu, std::size_t(N) * OC, fn, "pre_gelu");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  GemmEpilogue<T> ep;
  ep.kind = Epilogue::gelu_bias;
  ep.aux = pre_gelu.data();
  ep.ldaux = OC;
  if (detail::present(bias)) {
    detail::check_extent(bias, OC, fn, "bias");
    ep.bias = bias.data();
  }
  gemm_ex<T>(exec, Trans::N, Trans::N, N, OC, IC, 1.0f, inp.data(), IC, weight.data(), OC, 0.0f,
             nullptr, OC, out_gelu.data(), OC, ep);
}

template <class T>
void linear_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                     View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                     int IC, int OC, bool accumulate_dinp, float dweight_beta) {
  const char* fn = "linear_backward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(dout, std::size_t(N) * OC, fn, "dout");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  if (detail::present(dinp)) {
    detail::check_extent(dinp, std::size_t(N) * IC, fn, "dinp");
    // dinp[N, IC] (+)= dout[N, OC] @ weight[IC, OC]^T
    gemm<T>(exec, Trans::N, Trans::T, N, IC, OC, 1.0f, dout.data(), OC, weight.data(), OC,
            accumulate_dinp ? 1.0f : 0.0f, dinp.data(), IC);
  }
  weight_and_bias_grad<T>(exec, fn, dweight, dbias, dout, inp, N, IC, OC, dweight_beta);
}

template <class T>
void linear_backward_dgelu(const ExecSpace& exec, View1<T> dpre, View1<T> dweight,
                           View1<T> dbias, View1<const T> dout, View1<const T> inp,
                           View1<const T> weight, View1<const T> pre_gelu, int N, int IC,
                           int OC, View1<T> dbias_pre, float dweight_beta) {
  const char* fn = "linear_backward_dgelu";
  check_shape(fn, N, IC, OC);
  detail::check_extent(dout, std::size_t(N) * OC, fn, "dout");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  MESHTRAIN_CHECK(detail::present(dpre) || !detail::present(dbias_pre), fn,
                  ": dbias_pre is the column sums of dpre, which is not asked for");
  if (detail::present(dpre)) {
    detail::check_extent(dpre, std::size_t(N) * IC, fn, "dpre");
    detail::check_extent(pre_gelu, std::size_t(N) * IC, fn, "pre_gelu");
    // dpre[N, IC] = (dout[N, OC] @ weight[IC, OC]^T) * gelu'(pre_gelu[N, IC]); aux is only read,
    // the const_cast does not write through it.
    GemmEpilogue<T> ep;
    ep.kind = Epilogue::dgelu;
    ep.aux = const_cast<T*>(pre_gelu.data());
    ep.ldaux = IC;
    if (detail::present(dbias_pre)) {
      detail::check_extent(dbias_pre, IC, fn, "dbias_pre");
      ep.dbias = dbias_pre.data();
    }
    gemm_ex<T>(exec, Trans::N, Trans::T, N, IC, OC, 1.0f, dout.data(), OC, weight.data(), OC,
               0.0f, nullptr, IC, dpre.data(), IC, ep);
  }
  weight_and_bias_grad<T>(exec, fn, dweight, dbias, dout, inp, N, IC, OC, dweight_beta);
}

#define MESHTRAIN_INSTANTIATE_LINEAR(T)                                                         \
  template void linear_forward<T>(const ExecSpace&, View1<T>, View1<const T>, View1<const T>,   \
                                  View1<const T>, View1<const T>, int, int, int);               \
  template void linear_forward<T>(const ExecSpace&, View1<T>, View1<const T>, View1<const T>,   \
                                  View1<const T>, int, int, int);                               \
  template void linear_gelu_forward<T>(const ExecSpace&, View1<T>, View1<T>, View1<const T>,    \
                                       View1<const T>, View1<const T>, int, int, int);          \
  template void linear_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,              \
                                   View1<const T>, View1<const T>, View1<const T>, int, int,    \
                                   int, bool, float);                                           \
  template void linear_backward_dgelu<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,        \
                                         View1<const T>, View1<const T>, View1<const T>,        \
                                         View1<const T>, int, int, int, View1<T>, float);
MESHTRAIN_INSTANTIATE_LINEAR(float)
MESHTRAIN_INSTANTIATE_LINEAR(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_LINEAR(bf16)
MESHTRAIN_INSTANTIATE_LINEAR(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_LINEAR

}  // namespace meshtrain::kernels
