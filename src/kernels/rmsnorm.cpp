// RMSNorm, one team per row, fp32 statistics (double for the double instantiation).
//
// Backward, with r = rstd = (S / C + eps)^(-1/2), S = sum_i x_i^2, n_i = x_i r, g_i = w_i dy_i:
//   dr/dx_j = -r^3 x_j / C, so
//   dL/dx_j = g_j r + sum_i g_i x_i (-r^3 x_j / C) = r (g_j - n_j mean_i(g_i n_i)).
// The row part and the column sum (dweight) are two kernels, so that neither needs atomics: the
// results are deterministic and identical on every backend, as LayerNorm's.
//
// These are the portable kernels. rmsnorm_forward/backward (at the end) dispatch to the CUDA
// kernels of rmsnorm_cuda.cpp where they apply, and to these everywhere else.
#include "meshtrain/kernels/rmsnorm.hpp"

#include "amax_fused.hpp"
#include "common.hpp"
#include "rowwise_cuda.hpp"

namespace meshtrain::kernels {

namespace {
void check_rmsnorm(const char* fn, int N, int C) {
  MESHTRAIN_CHECK(N >= 0 && C > 0, fn, ": bad shape N=", N, ", C=", C);
}

template <class T>
void check_forward(const char* fn, View1<T> out, View1<float> rstd, View1<const T> inp,
                   View1<const T> weight, int N, int C) {
  check_rmsnorm(fn, N, C);
  const std::size_t NC = std::size_t(N) * C;
  detail::check_extent(out, NC, fn, "out");
  detail::check_extent(inp, NC, fn, "inp");
  detail::check_extent(rstd, N, fn, "rstd");
  detail::check_extent(weight, C, fn, "weight");
}

template <class T>
void check_backward(const char* fn, View1<T> dinp, View1<T> dweight, View1<const T> dout,
                    View1<const T> inp, View1<const T> weight, View1<const float> rstd, int N,
                    int C) {
  check_rmsnorm(fn, N, C);
  const std::size_t NC = std::size_t(N) * C;
  detail::check_extent(dinp, NC, fn, "dinp");
  detail::check_extent(dout, NC, fn, "dout");
  detail::check_extent(inp, NC, fn, "inp");
  detail::check_extent(rstd, N, fn, "rstd");
  detail::check_extent(weight, C, fn, "weight");
  detail::check_extent(dweight, C, fn, "dweight");
}
}  // namespace

namespace {
// The forward's row kernel; kAmax: also fold max |out| of each row into amax(0) (bits), one
// atomic per team (amax_fused.hpp).
template <bool kAmax, class T>
void forward_rows(const ExecSpace& exec, View1<T> out, View1<float> rstd, View1<const T> inp,
                  View1<const T> weight, int N, int C, float eps, std::uint32_t* bits) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  const Acc e = eps;
  Kokkos::parallel_for(
      "meshtrain::rmsnorm_forward", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank();
        const detail::Index base = row * C;
        Acc sq = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C),
            [&](int c, Acc& s) {
              const Acc x = acc(inp(base + c));
              s += x * x;
            },
            sq);
        const Acc rs = Acc(1) / kc::sqrt(sq / C + e);
        // HF's order: round x * rstd to T, then multiply by the weight.
        const auto store = [&](int c) {
          const Acc n = acc(static_cast<T>(acc(inp(base + c)) * rs));
          const T v = static_cast<T>(acc(weight(c)) * n);
          out(base + c) = v;
          return v;
        };
        detail::team_store_amax<kAmax>(m, C, bits, store);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { rstd(row) = static_cast<float>(rs); });
      });
}
}  // namespace

template <class T>
void rmsnorm_forward_portable(const ExecSpace& exec, View1<T> out, View1<float> rstd,
                              View1<const T> inp, View1<const T> weight, int N, int C,
                              float eps, View1<float> amax) {
  check_forward("rmsnorm_forward", out, rstd, inp, weight, N, C);
  if (!detail::present(amax)) {
    forward_rows<false, T>(exec, out, rstd, inp, weight, N, C, eps, nullptr);
    return;
  }
  detail::reset_amax(exec, amax);
  forward_rows<true, T>(exec, out, rstd, inp, weight, N, C, eps, detail::amax_bits(amax));
}

template <class T>
void rmsnorm_backward_portable(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                               View1<const T> dout, View1<const T> inp, View1<const T> weight,
                               View1<const float> rstd, int N, int C) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  check_backward("rmsnorm_backward", dinp, dweight, dout, inp, weight, rstd, N, C);

  Kokkos::parallel_for(
      "meshtrain::rmsnorm_backward_dinp", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank();
        const detail::Index base = row * C;
        const Acc rs = rstd(row);
        Acc sum_gn = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C),
            [&](int c, Acc& s) {
              s += acc(weight(c)) * acc(dout(base + c)) * (acc(inp(base + c)) * rs);
            },
            sum_gn);
        const Acc mean_gn = sum_gn / C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          const Acc n = acc(inp(base + c)) * rs;
          const Acc g = acc(weight(c)) * acc(dout(base + c));
          dinp(base + c) = static_cast<T>(acc(dinp(base + c)) + rs * (g - n * mean_gn));
        });
      });

  if constexpr (!kDeviceIsHost) {
    // GPU: two-stage column sums (common.hpp), deterministic, enough threads to fill the GPU.
    using detail::Index;
    detail::column_sums<Acc, 1>(
        exec, "meshtrain::rmsnorm_backward_dweight", Index(N), Index(C), 1,
        KOKKOS_LAMBDA(Index n, Index c, Acc* v) {
          v[0] += acc(dout(n * C + c)) * acc(static_cast<T>(acc(inp(n * C + c)) * Acc(rstd(n))));
        },
        KOKKOS_LAMBDA(Index c, const Acc* v) {
          dweight(c) = static_cast<T>(acc(dweight(c)) + v[0]);
        });
    return;
  }
  // Host: rows in order (deterministic), one thread per kCols channels so that the inner loop
  // is contiguous and vectorises (LayerNorm's scheme).
  constexpr int kCols = 16;
  const int blocks = (C + kCols - 1) / kCols;
  Kokkos::parallel_for(
      "meshtrain::rmsnorm_backward_dweight", detail::Range(exec, 0, blocks),
      KOKKOS_LAMBDA(detail::Index blk) {
        const detail::Index c0 = blk * kCols;
        const int w = C - c0 < kCols ? int(C - c0) : kCols;
        Acc dw[kCols] = {};
        for (detail::Index n = 0; n < N; ++n) {
          const Acc rs = rstd(n);
          const detail::Index base = n * C + c0;
          for (int u = 0; u < w; ++u)
            dw[u] += acc(dout(base + u)) * acc(static_cast<T>(acc(inp(base + u)) * rs));
        }
        for (int u = 0; u < w; ++u) dweight(c0 + u) = static_cast<T>(acc(dweight(c0 + u)) + dw[u]);
      });
}

// Dispatch: the CUDA kernels (rmsnorm_cuda.cpp) for float and bf16 on a CUDA device when the
// shape suits them (rowwise_cuda.hpp), the portable kernels otherwise.
template <class T>
void rmsnorm_forward(const ExecSpace& exec, View1<T> out, View1<float> rstd, View1<const T> inp,
                     View1<const T> weight, int N, int C, float eps, View1<float> amax) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    check_forward("rmsnorm_forward", out, rstd, inp, weight, N, C);
    if (detail::rmsnorm_forward_cuda<T>(exec, out, rstd, inp, weight, N, C, eps, amax)) return;
  }
#endif
  rmsnorm_forward_portable<T>(exec, out, rstd, inp, weight, N, C, eps, amax);
}

template <class T>
void rmsnorm_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                      View1<const T> dout, View1<const T> inp, View1<const T> weight,
                      View1<const float> rstd, int N, int C) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    check_backward("rmsnorm_backward", dinp, dweight, dout, inp, weight, rstd, N, C);
    if (detail::rmsnorm_backward_cuda<T>(exec, dinp, dweight, dout, inp, weight, rstd, N, C))
      return;
  }
#endif
  rmsnorm_backward_portable<T>(exec, dinp, dweight, dout, inp, weight, rstd, N, C);
}

#define MESHTRAIN_INSTANTIATE_RMSNORM(T)                                                        \
  template void rmsnorm_forward<T>(const ExecSpace&, View1<T>, View1<float>, View1<const T>,    \
                                   View1<const T>, int, int, float, View1<float>);              \
  template void rmsnorm_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<const T>,       \
                                    View1<const T>, View1<const T>, View1<const float>, int,    \
                                    int);                                                       \
  template void rmsnorm_forward_portable<T>(const ExecSpace&, View1<T>, View1<float>,           \
                                            View1<const T>, View1<const T>, int, int, float,    \
                                            View1<float>);                                      \
  template void rmsnorm_backward_portable<T>(const ExecSpace&, View1<T>, View1<T>,              \
                                             View1<const T>, View1<const T>, View1<const T>,    \
                                             View1<const float>, int, int);
MESHTRAIN_INSTANTIATE_RMSNORM(float)
MESHTRAIN_INSTANTIATE_RMSNORM(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_RMSNORM(bf16)
MESHTRAIN_INSTANTIATE_RMSNORM(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_RMSNORM

}  // namespace meshtrain::kernels
