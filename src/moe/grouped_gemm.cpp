// A loop of GEMMs over the experts (grouped_gemm.hpp). Each is a kernels::gemm_varying: the
// rows per expert change every step, and on CUDA a new shape through plain cuBLAS costs more host
// time than the GEMM itself (kernels/gemm/gemm_varying.hpp has the figures).
#include "meshtrain/moe/grouped_gemm.hpp"

#include <type_traits>

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm_varying.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"

namespace meshtrain::moe {

namespace {

int checked_experts(const std::vector<std::int64_t>& offsets, const char* fn) {
  MESHTRAIN_CHECK(!offsets.empty() && offsets.front() == 0, fn,
                  ": offsets must start at 0 and have one entry per expert plus one");
  for (std::size_t e = 1; e < offsets.size(); ++e)
    MESHTRAIN_CHECK(offsets[e] >= offsets[e - 1], fn, ": offsets decrease at expert ", e - 1);
  return static_cast<int>(offsets.size()) - 1;
}

int rows(std::int64_t n, const char* fn) {
  MESHTRAIN_CHECK(n <= std::int64_t(1) << 31, fn, ": ", n, " rows for one expert exceed the ",
                  "GEMM's int range; split the batch");
  return static_cast<int>(n);
}

// Elements of the stacked weights for E experts `stride` apart.
std::size_t stacked(int E, std::size_t stride, std::size_t each) {
  return E == 0 ? 0 : std::size_t(E - 1) * stride + each;
}

// The FP8 GEMMs exist for float (host builds) and bf16 rows (kernels/linear_fp8.hpp).
template <class T>
constexpr bool kHasFp8 = std::is_same_v<T, float>
#if MESHTRAIN_HAVE_BF16
                         || std::is_same_v<T, bf16>
#endif
    ;

// ExpertFp8's options for kernels::linear_fp8_*: the expert weight [K, Nout] is the project's
// linear layout (out = inp @ weight).
template <class T>
kernels::Fp8LinearOptions fp8_options(const ExpertFp8& fp8, const char* fn) {
  kernels::Fp8LinearOptions o;
  if (!fp8.enabled) return o;
  if constexpr (!kHasFp8<T>)
    throw ConfigError(cat(fn, ": FP8 experts need float or bf16 rows (train.precision=fp8 keeps ",
                          "bf16 activations on GPU builds, fp32 on host builds)"));
  o.scaling = kernels::Fp8Scaling::rowwise;
  o.layout = kernels::Fp8WeightLayout::in_out;
  o.wgrad_high_precision = true;
  o.rows_vary = true;
  o.workspace = fp8.workspace;
  return o;
}

}  // namespace

template <class T>
void grouped_linear_forward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                            View1<const T> x, View1<const T> w, View1<T> y, int K, int Nout,
                            std::size_t w_stride, const ExpertFp8& fp8) {
  const char* fn = "moe::grouped_linear_forward";
  const kernels::Fp8LinearOptions opt = fp8_options<T>(fp8, fn);
  const int E = checked_experts(offsets, fn);
  const std::int64_t M = offsets[E];
  const std::size_t each = std::size_t(K) * Nout, stride = w_stride ? w_stride : each;
  MESHTRAIN_CHECK(stride >= each, fn, ": weight stride ", stride, " < ", each);
  detail::check_extent(x, std::size_t(M) * K, fn, "x");
  detail::check_extent(w, stacked(E, stride, each), fn, "w");
  detail::check_extent(y, std::size_t(M) * Nout, fn, "y");
  using kernels::Trans;
  using kernels::VaryingDim;
  for (int e = 0; e < E; ++e) {
    const int n = rows(offsets[e + 1] - offsets[e], fn);
    if (n == 0) continue;
    const T* x_e = x.data() + offsets[e] * K;
    const T* w_e = w.data() + std::size_t(e) * stride;
    T* y_e = y.data() + offsets[e] * Nout;
    if constexpr (kHasFp8<T>) {
      if (fp8.enabled) {
        kernels::linear_fp8_forward_gemm<T>(exec, y_e, Nout, nullptr, x_e, w_e, n, K, Nout, opt);
        continue;
      }
    }
    kernels::gemm_varying<T>(exec, VaryingDim::M, Trans::N, Trans::N, n, Nout, K, 1.0f, x_e, K,
                             w_e, Nout, 0.0f, y_e, Nout);
  }
}

template <class T>
void grouped_linear_backward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                             View1<const T> dy, View1<const T> x, View1<const T> w, View1<T> dx,
                             View1<T> dw, int K, int Nout, std::size_t w_stride,
                             const ExpertFp8& fp8) {
  const char* fn = "moe::grouped_linear_backward";
  const kernels::Fp8LinearOptions opt = fp8_options<T>(fp8, fn);
  const int E = checked_experts(offsets, fn);
  const std::int64_t M = offsets[E];
  const std::size_t each = std::size_t(K) * Nout, stride = w_stride ? w_stride : each;
  MESHTRAIN_CHECK(stride >= each, fn, ": weight stride ", stride, " < ", each);
  detail::check_extent(dy, std::size_t(M) * Nout, fn, "dy");
  detail::check_extent(x, std::size_t(M) * K, fn, "x");
  detail::check_extent(w, stacked(E, stride, each), fn, "w");
  detail::check_extent(dw, stacked(E, stride, each), fn, "dw");
  const bool want_dx = dx.extent(0) > 0;
  if (want_dx) detail::check_extent(dx, std::size_t(M) * K, fn, "dx");
  using kernels::Trans;
  using kernels::VaryingDim;
  for (int e = 0; e < E; ++e) {
    const int n = rows(offsets[e + 1] - offsets[e], fn);
    if (n == 0) continue;
    const T* dy_e = dy.data() + offsets[e] * Nout;
    const T* w_e = w.data() + std::size_t(e) * stride;
    bool dx_done = !want_dx;
    if constexpr (kHasFp8<T>) {
      if (fp8.enabled && want_dx) {
        // dy_e cast once, rowwise (E5M2), for the input gradient's FP8 GEMM.
        const kernels::Fp8Tensor g = kernels::linear_fp8_grad<T>(exec, dy_e, Nout, n, Nout, opt);
        kernels::linear_fp8_dinp_gemm<T>(exec, dx.data() + offsets[e] * K, 0.0f, g, w_e, n, K,
                                         Nout, opt);
        dx_done = true;
      }
    }
    if (!dx_done)
      kernels::gemm_varying<T>(exec, VaryingDim::M, Trans::N, Trans::T, n, K, Nout, 1.0f, dy_e,
                               Nout, w_e, Nout, 0.0f, dx.data() + offsets[e] * K, K);
    // The weight gradient in the model's type in both precisions (ExpertFp8).
    kernels::gemm_varying<T>(exec, VaryingDim::K, Trans::T, Trans::N, K, Nout, n, 1.0f,
                             x.data() + offsets[e] * K, K, dy_e, Nout, 1.0f,
                             dw.data() + std::size_t(e) * stride, Nout);
  }
}

#define MESHTRAIN_INSTANTIATE_GROUPED(T)                                                       \
  template void grouped_linear_forward<T>(const ExecSpace&, const std::vector<std::int64_t>&,  \
                                          View1<const T>, View1<const T>, View1<T>, int, int,  \
                                          std::size_t, const ExpertFp8&);                      \
  template void grouped_linear_backward<T>(const ExecSpace&, const std::vector<std::int64_t>&, \
                                           View1<const T>, View1<const T>, View1<const T>,     \
                                           View1<T>, View1<T>, int, int, std::size_t,          \
                                           const ExpertFp8&);
MESHTRAIN_INSTANTIATE_GROUPED(float)
MESHTRAIN_INSTANTIATE_GROUPED(double)
#if MESHTRAIN_HAVE_BF16  // 16-bit operands, fp32 accumulation (kernels::gemm: cublasGemmEx)
MESHTRAIN_INSTANTIATE_GROUPED(bf16)
MESHTRAIN_INSTANTIATE_GROUPED(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GROUPED

}  // namespace meshtrain::moe
