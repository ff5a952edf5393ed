// Linear layer on top of gemm: the bias is broadcast into `out` first so that one GEMM with
// beta = 1 adds the product to it (no second pass over out). dbias is a column sum.
#include "meshtrain/kernels/linear.hpp"

#include <type_traits>

#include "common.hpp"
#include "meshtrain/kernels/gemm.hpp"

namespace meshtrain::kernels {

template <class T>
void linear_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                    View1<const T> weight, View1<const T> bias, int N, int IC, int OC) {
  using detail::Index;
  const char* fn = "linear_forward";
  MESHTRAIN_CHECK(N >= 0 && IC > 0 && OC > 0, fn, ": bad shape N=", N, ", IC=", IC, ", OC=", OC);
  detail::check_extent(out, std::size_t(N) * OC, fn, "out");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  const bool has_bias = detail::present(bias);
  if (has_bias) {
    detail::check_extent(bias, OC, fn, "bias");
    // One team per row, threads over its columns: contiguous on a CPU core (a vectorised copy,
    // no 64-bit modulo per element) and coalesced on a GPU.
    Kokkos::parallel_for(
        "meshtrain::linear_forward_bias", detail::Team(exec, N, Kokkos::AUTO),
        KOKKOS_LAMBDA(const detail::Member& m) {
          const Index base = Index(m.league_rank()) * OC;
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, OC),
                               [&](int o) { out(base + o) = bias(o); });
        });
  }
  // out[N, OC] (+)= inp[N, IC] @ weight[IC, OC]
  gemm<T>(exec, Trans::N, Trans::N, N, OC, IC, 1.0f, inp.data(), IC, weight.data(), OC,
          has_bias ? 1.0f : 0.0f, out.data(), OC);
}

template <class T>
void linear_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                     View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                     int IC, int OC, bool accumulate_dinp) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  const char* fn = "linear_backward";
  MESHTRAIN_CHECK(N >= 0 && IC > 0 && OC > 0, fn, ": bad shape N=", N, ", IC=", IC, ", OC=", OC);
  detail::check_extent(dout, std::size_t(N) * OC, fn, "dout");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  detail::check_extent(dweight, std::size_t(IC) * OC, fn, "dweight");
  if (detail::present(dinp)) {
    detail::check_extent(dinp, std::size_t(N) * IC, fn, "dinp");
    // dinp[N, IC] (+)= dout[N, OC] @ weight[IC, OC]^T
    gemm<T>(exec, Trans::N, Trans::T, N, IC, OC, 1.0f, dout.data(), OC, weight.data(), OC,
            accumulate_dinp ? 1.0f : 0.0f, dinp.data(), IC);
  }
  // dweight[IC, OC] += inp[N, IC]^T @ dout[N, OC]
  gemm<T>(exec, Trans::T, Trans::N, IC, OC, N, 1.0f, inp.data(), IC, dout.data(), OC, 1.0f,
          dweight.data(), OC);
  if (detail::present(dbias)) {
    detail::check_extent(dbias, OC, fn, "dbias");
    if constexpr (!kDeviceIsHost) {
      // GPU: two-stage column sum (common.hpp), deterministic, enough threads to fill the GPU.
      using detail::Index;
      detail::column_sums<Acc, 1>(
          exec, "meshtrain::linear_backward_dbias", Index(N), Index(OC), 0,
          KOKKOS_LAMBDA(Index n, Index o, Acc* v) { v[0] += acc(dout(n * OC + o)); },
          KOKKOS_LAMBDA(Index o, const Acc* v) {
            dbias(o) = static_cast<T>(acc(dbias(o)) + v[0]);
          });
      return;
    }
    // Host: each column's rows summed in order by one thread per kCols columns, so the inner
    // loop runs over contiguous columns and vectorises instead of striding down one column.
    constexpr int kCols = 16;
    const int blocks = (OC + kCols - 1) / kCols;
    Kokkos::parallel_for(
        "meshtrain::linear_backward_dbias", detail::Range(exec, 0, blocks),
        KOKKOS_LAMBDA(detail::Index blk) {
          const detail::Index o0 = blk * kCols;
          const int w = OC - o0 < kCols ? int(OC - o0) : kCols;
          Acc s[kCols] = {};
          if (w == kCols) {  // full block: a fixed-width inner loop
            for (detail::Index n = 0; n < N; ++n)
              for (int u = 0; u < kCols; ++u) s[u] += acc(dout(n * OC + o0 + u));
          } else {
            for (detail::Index n = 0; n < N; ++n)
              for (int u = 0; u < w; ++u) s[u] += acc(dout(n * OC + o0 + u));
          }
          for (int u = 0; u < w; ++u) dbias(o0 + u) = static_cast<T>(acc(dbias(o0 + u)) + s[u]);
        });
  }
}

#define MESHTRAIN_INSTANTIATE_LINEAR(T)                                                       \
  template void linear_forward<T>(const ExecSpace&, View1<T>, View1<const T>, View1<const T>, \
                                  View1<const T>, int, int, int);                             \
  template void linear_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,            \
                                   View1<const T>, View1<const T>, View1<const T>, int, int,  \
                                   int, bool);
MESHTRAIN_INSTANTIATE_LINEAR(float)
MESHTRAIN_INSTANTIATE_LINEAR(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_LINEAR(bf16)
MESHTRAIN_INSTANTIATE_LINEAR(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_LINEAR

}  // namespace meshtrain::kernels
