// The FP8 linear layer (kernels/linear_fp8.hpp): casts in the orientation each GEMM reads, then
// the FP8 GEMM contract of gemm/gemm_fp8.hpp.
#include "meshtrain/kernels/linear_fp8.hpp"

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"

namespace meshtrain::kernels {

namespace {

using detail::Index;
using detail::Range;

void check_shape(const char* fn, int N, int IC, int OC) {
  MESHTRAIN_CHECK(N >= 0 && IC > 0 && OC > 0, fn, ": bad shape N=", N, ", IC=", IC, ", OC=", OC);
}

// x [rows, cols] quantized tensorwise in `format`, as is or transposed.
template <class T>
Fp8Tensor cast(const ExecSpace& exec, const char* name, View1<const T> x, int rows, int cols,
               Fp8Format format, bool transposed, const Fp8LinearOptions& opt) {
  Fp8Tensor q = make_fp8_tensor(std::string("linear_fp8_") + name, rows, cols, format,
                                Fp8Scaling::tensorwise, transposed);
  AmaxHook hook;
  if (opt.agree)
    hook = [&](View1<float> amax, std::size_t count) { opt.agree(name, amax, count); };
  fp8_quantize<T>(exec, q, x, hook);
  return q;
}

}  // namespace

template <class T>
void linear_fp8_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                        View1<const T> weight, View1<const T> bias, int N, int IC, int OC,
                        const Fp8LinearOptions& opt) {
  const char* fn = "linear_fp8_forward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(out, std::size_t(N) * OC, fn, "out");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  const bool has_bias = detail::present(bias);
  if (has_bias) {
    detail::check_extent(bias, OC, fn, "bias");
    // The bias enters as the GEMM's C (beta = 1): the layer's type, as linear_forward adds it.
    const Index C = OC;
    Kokkos::parallel_for(
        "meshtrain::linear_fp8_bias", Range(exec, 0, Index(N) * C),
        KOKKOS_LAMBDA(Index i) { out(i) = bias(i % C); });
  }
  const Fp8Tensor a = cast<T>(exec, "inp", inp, N, IC, opt.forward, false, opt);
  const Fp8Tensor b = cast<T>(exec, "weight", weight, IC, OC, opt.forward, true, opt);
  // b stores weight^T [OC, IC]: op(B) = its transpose, K = IC contiguous in both operands.
  gemm_fp8<T>(exec, Trans::N, Trans::T, N, OC, IC, 1.0f, a, b, has_bias ? 1.0f : 0.0f,
                       out.data(), OC);
}

template <class T>
void linear_fp8_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                         View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                         int IC, int OC, const Fp8LinearOptions& opt) {
  const char* fn = "linear_fp8_backward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(dout, std::size_t(N) * OC, fn, "dout");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  detail::check_extent(dweight, std::size_t(IC) * OC, fn, "dweight");
  // One amax serves both orientations of dout; the transposed copy is a second cast of it.
  const Fp8Tensor g = cast<T>(exec, "dout", dout, N, OC, opt.backward, false, opt);
  if (detail::present(dinp)) {
    detail::check_extent(dinp, std::size_t(N) * IC, fn, "dinp");
    const Fp8Tensor w = cast<T>(exec, "weight", weight, IC, OC, opt.forward, false, opt);
    // dinp[N, IC] = dout[N, OC] . weight[IC, OC]^T: K = OC contiguous in both.
    gemm_fp8<T>(exec, Trans::N, Trans::T, N, IC, OC, 1.0f, g, w, 0.0f, dinp.data(), IC);
  }
  Fp8Tensor gt = make_fp8_tensor("linear_fp8_dout_t", N, OC, opt.backward,
                                 Fp8Scaling::tensorwise, true);
  Kokkos::deep_copy(exec, gt.amax, g.amax);
  Kokkos::deep_copy(exec, gt.scale, g.scale);
  Kokkos::deep_copy(exec, gt.scale_inv, g.scale_inv);
  fp8_cast<T>(exec, gt.data, dout, N, OC, gt.scale, Fp8Scaling::tensorwise, opt.backward, true);
  const Fp8Tensor xt = cast<T>(exec, "inp", inp, N, IC, opt.forward, true, opt);
  // dweight[IC, OC] += (inp^T)[IC, N] . (dout^T)[OC, N]^T: K = N contiguous in both.
  gemm_fp8<T>(exec, Trans::N, Trans::T, IC, OC, N, 1.0f, xt, gt, 1.0f, dweight.data(),
                       OC);
  if (detail::present(dbias)) {
    detail::check_extent(dbias, OC, fn, "dbias");
    column_sums_add<T>(exec, N, OC, dout.data(), OC, dbias.data());
  }
}

template void linear_fp8_forward<float>(const ExecSpace&, View1<float>, View1<const float>,
                                        View1<const float>, View1<const float>, int, int, int,
                                        const Fp8LinearOptions&);
template void linear_fp8_backward<float>(const ExecSpace&, View1<float>, View1<float>,
                                         View1<float>, View1<const float>, View1<const float>,
                                         View1<const float>, int, int, int,
                                         const Fp8LinearOptions&);
#if MESHTRAIN_HAVE_BF16
template void linear_fp8_forward<bf16>(const ExecSpace&, View1<bf16>, View1<const bf16>,
                                       View1<const bf16>, View1<const bf16>, int, int, int,
                                       const Fp8LinearOptions&);
template void linear_fp8_backward<bf16>(const ExecSpace&, View1<bf16>, View1<bf16>, View1<bf16>,
                                        View1<const bf16>, View1<const bf16>, View1<const bf16>,
                                        int, int, int, const Fp8LinearOptions&);
#endif

}  // namespace meshtrain::kernels
