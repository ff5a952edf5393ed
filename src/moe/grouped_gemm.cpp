// A loop of GEMMs over the experts (grouped_gemm.hpp). Each is a kernels::gemm_varying: the
// rows per expert change every step, and on CUDA a new shape through plain cuBLAS costs more host
// time than the GEMM itself (kernels/gemm/gemm_varying.hpp has the figures).
#include "meshtrain/moe/grouped_gemm.hpp"

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm_varying.hpp"

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

}  // namespace

template <class T>
void grouped_linear_forward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                            View1<const T> x, View1<const T> w, View1<T> y, int K, int Nout,
                            std::size_t w_stride) {
  const char* fn = "moe::grouped_linear_forward";
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
    kernels::gemm_varying<T>(exec, VaryingDim::M, Trans::N, Trans::N, n, Nout, K, 1.0f,
                             x.data() + offsets[e] * K, K, w.data() + std::size_t(e) * stride,
                             Nout, 0.0f, y.data() + offsets[e] * Nout, Nout);
  }
}

template <class T>
void grouped_linear_backward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                             View1<const T> dy, View1<const T> x, View1<const T> w, View1<T> dx,
                             View1<T> dw, int K, int Nout, std::size_t w_stride) {
  const char* fn = "moe::grouped_linear_backward";
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
    if (want_dx)
      kernels::gemm_varying<T>(exec, VaryingDim::M, Trans::N, Trans::T, n, K, Nout, 1.0f, dy_e,
                               Nout, w_e, Nout, 0.0f, dx.data() + offsets[e] * K, K);
    kernels::gemm_varying<T>(exec, VaryingDim::K, Trans::T, Trans::N, K, Nout, n, 1.0f,
                             x.data() + offsets[e] * K, K, dy_e, Nout, 1.0f,
                             dw.data() + std::size_t(e) * stride, Nout);
  }
}

#define MESHTRAIN_INSTANTIATE_GROUPED(T)                                                       \
  template void grouped_linear_forward<T>(const ExecSpace&, const std::vector<std::int64_t>&,  \
                                          View1<const T>, View1<const T>, View1<T>, int, int,  \
                                          std::size_t);                                        \
  template void grouped_linear_backward<T>(const ExecSpace&, const std::vector<std::int64_t>&, \
                                           View1<const T>, View1<const T>, View1<const T>,     \
                                           View1<T>, View1<T>, int, int, std::size_t);
MESHTRAIN_INSTANTIATE_GROUPED(float)
MESHTRAIN_INSTANTIATE_GROUPED(double)
#if MESHTRAIN_HAVE_BF16  // 16-bit operands, fp32 accumulation (kernels::gemm: cublasGemmEx)
MESHTRAIN_INSTANTIATE_GROUPED(bf16)
MESHTRAIN_INSTANTIATE_GROUPED(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GROUPED

}  // namespace meshtrain::moe
