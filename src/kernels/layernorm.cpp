// LayerNorm, one team per row. The variance is a second pass over the row, sum((x - mean)^2),
// rather than E[x^2] - mean^2, which cancels badly when |mean| >> std.
//
// Backward (llm.c layernorm_backward), with xhat = (x - mean) * rstd and g = weight * dout:
//   dinp    += rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight += sum_rows dout * xhat,   dbias += sum_rows dout
// The row part and the column sums are two kernels, so that neither needs atomics: the results
// are deterministic and identical on every backend.
//
// These are the portable kernels. layernorm_forward/backward (at the end) dispatch to the CUDA
// kernels of layernorm_cuda.cpp where they apply, and to these everywhere else.
#include "meshtrain/kernels/layernorm.hpp"

#include <type_traits>

#include "amax_fused.hpp"
#include "common.hpp"
#include "rowwise_cuda.hpp"

namespace meshtrain::kernels {

namespace {
void check_layernorm(const char* fn, int N, int C) {
  MESHTRAIN_CHECK(N >= 0 && C > 0, fn, ": bad shape N=", N, ", C=", C);
}

template <class T>
void check_forward(const char* fn, View1<T> out, View1<float> mean, View1<float> rstd,
                   View1<const T> inp, View1<const T> weight, View1<const T> bias, int N, int C) {
  check_layernorm(fn, N, C);
  const std::size_t NC = std::size_t(N) * C;
  detail::check_extent(out, NC, fn, "out");
  detail::check_extent(inp, NC, fn, "inp");
  detail::check_extent(mean, N, fn, "mean");
  detail::check_extent(rstd, N, fn, "rstd");
  detail::check_extent(weight, C, fn, "weight");
  detail::check_extent(bias, C, fn, "bias");
}

template <class T>
void check_backward(const char* fn, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                    View1<const T> dout, View1<const T> inp, View1<const T> weight,
                    View1<const float> mean, View1<const float> rstd, int N, int C) {
  check_layernorm(fn, N, C);
  const std::size_t NC = std::size_t(N) * C;
  detail::check_extent(dinp, NC, fn, "dinp");
  detail::check_extent(dout, NC, fn, "dout");
  detail::check_extent(inp, NC, fn, "inp");
  detail::check_extent(mean, N, fn, "mean");
  detail::check_extent(rstd, N, fn, "rstd");
  detail::check_extent(weight, C, fn, "weight");
  detail::check_extent(dweight, C, fn, "dweight");
  detail::check_extent(dbias, C, fn, "dbias");
}
}  // namespace

namespace {
// The forward's row kernel; kAmax: also fold max |out| of each row into amax(0) (bits), one
// atomic per team (amax_fused.hpp).
template <bool kAmax, class T>
void forward_rows(const ExecSpace& exec, View1<T> out, View1<float> mean, View1<float> rstd,
                  View1<const T> inp, View1<const T> weight, View1<const T> bias, int N, int C,
                  float eps, std::uint32_t* bits) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  const Acc e = eps;
  Kokkos::parallel_for(
      "meshtrain::layernorm_forward", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank();
        const detail::Index base = row * C;
        Acc sum = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C), [&](int c, Acc& s) { s += acc(inp(base + c)); }, sum);
        const Acc mu = sum / C;
        Acc sq = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C),
            [&](int c, Acc& s) {
              const Acc d = acc(inp(base + c)) - mu;
              s += d * d;
            },
            sq);
        const Acc rs = Acc(1) / kc::sqrt(sq / C + e);
        const auto store = [&](int c) {
          const Acc xhat = (acc(inp(base + c)) - mu) * rs;
          const T v = static_cast<T>(xhat * acc(weight(c)) + acc(bias(c)));
          out(base + c) = v;
          return v;
        };
        detail::team_store_amax<kAmax>(m, C, bits, store);
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          mean(row) = static_cast<float>(mu);
          rstd(row) = static_cast<float>(rs);
        });
      });
}
}  // namespace

template <class T>
void layernorm_forward_portable(const ExecSpace& exec, View1<T> out, View1<float> mean,
                                View1<float> rstd, View1<const T> inp, View1<const T> weight,
                                View1<const T> bias, int N, int C, float eps,
                                View1<float> amax) {
  check_forward("layernorm_forward", out, mean, rstd, inp, weight, bias, N, C);
  if (!detail::present(amax)) {
    forward_rows<false, T>(exec, out, mean, rstd, inp, weight, bias, N, C, eps, nullptr);
    return;
  }
  detail::reset_amax(exec, amax);
  forward_rows<true, T>(exec, out, mean, rstd, inp, weight, bias, N, C, eps,
                        detail::amax_bits(amax));
}

template <class T>
void layernorm_backward_portable(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                                 View1<T> dbias, View1<const T> dout, View1<const T> inp,
                                 View1<const T> weight, View1<const float> mean,
                                 View1<const float> rstd, int N, int C) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  check_backward("layernorm_backward", dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);

  Kokkos::parallel_for(
      "meshtrain::layernorm_backward_dinp", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank();
        const detail::Index base = row * C;
        const Acc mu = mean(row), rs = rstd(row);
        Acc sum_g = 0, sum_gx = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C),
            [&](int c, Acc& s) { s += acc(weight(c)) * acc(dout(base + c)); }, sum_g);
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, C),
            [&](int c, Acc& s) {
              const Acc xhat = (acc(inp(base + c)) - mu) * rs;
              s += acc(weight(c)) * acc(dout(base + c)) * xhat;
            },
            sum_gx);
        const Acc mean_g = sum_g / C, mean_gx = sum_gx / C;
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, C), [&](int c) {
          const Acc xhat = (acc(inp(base + c)) - mu) * rs;
          const Acc g = acc(weight(c)) * acc(dout(base + c));
          dinp(base + c) = static_cast<T>(acc(dinp(base + c)) + rs * (g - mean_g - xhat * mean_gx));
        });
      });

  if constexpr (!kDeviceIsHost) {
    // GPU: two-stage column sums (common.hpp), deterministic, enough threads to fill the GPU.
    using detail::Index;
    detail::column_sums<Acc, 2>(
        exec, "meshtrain::layernorm_backward_dweight_dbias", Index(N), Index(C), 1,
        KOKKOS_LAMBDA(Index n, Index c, Acc* v) {
          const Acc d = acc(dout(n * C + c));
          v[0] += d * ((acc(inp(n * C + c)) - Acc(mean(n))) * Acc(rstd(n)));
          v[1] += d;
        },
        KOKKOS_LAMBDA(Index c, const Acc* v) {
          dweight(c) = static_cast<T>(acc(dweight(c)) + v[0]);
          dbias(c) = static_cast<T>(acc(dbias(c)) + v[1]);
        });
    return;
  }
  // Host: column sums, rows in order (deterministic), one thread per kCols channels, so the inner
  // loop is contiguous and vectorises instead of striding down a column.
  constexpr int kCols = 16;
  const int blocks = (C + kCols - 1) / kCols;
  Kokkos::parallel_for(
      "meshtrain::layernorm_backward_dweight_dbias", detail::Range(exec, 0, blocks),
      KOKKOS_LAMBDA(detail::Index blk) {
        const detail::Index c0 = blk * kCols;
        const int w = C - c0 < kCols ? int(C - c0) : kCols;
        Acc dw[kCols] = {}, db[kCols] = {};
        for (detail::Index n = 0; n < N; ++n) {
          const Acc mu = mean(n), rs = rstd(n);
          const detail::Index base = n * C + c0;
          for (int u = 0; u < w; ++u) {
            const Acc d = acc(dout(base + u));
            const Acc xhat = (acc(inp(base + u)) - mu) * rs;
            dw[u] += d * xhat;
            db[u] += d;
          }
        }
        for (int u = 0; u < w; ++u) {
          dweight(c0 + u) = static_cast<T>(acc(dweight(c0 + u)) + dw[u]);
          dbias(c0 + u) = static_cast<T>(acc(dbias(c0 + u)) + db[u]);
        }
      });
}

// Dispatch: the CUDA kernels (layernorm_cuda.cpp) for float and bf16 on a CUDA device when the
// shape suits them (rowwise_cuda.hpp), the portable kernels otherwise. Host builds compile only
// the portable call.
template <class T>
void layernorm_forward(const ExecSpace& exec, View1<T> out, View1<float> mean, View1<float> rstd,
                       View1<const T> inp, View1<const T> weight, View1<const T> bias, int N,
                       int C, float eps, View1<float> amax) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    check_forward("layernorm_forward", out, mean, rstd, inp, weight, bias, N, C);
    if (detail::layernorm_forward_cuda<T>(exec, out, mean, rstd, inp, weight, bias, N, C, eps,
                                          amax))
      return;
  }
#endif
  layernorm_forward_portable<T>(exec, out, mean, rstd, inp, weight, bias, N, C, eps, amax);
}

template <class T>
void layernorm_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                        View1<const T> dout, View1<const T> inp, View1<const T> weight,
                        View1<const float> mean, View1<const float> rstd, int N, int C) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    check_backward("layernorm_backward", dinp, dweight, dbias, dout, inp, weight, mean, rstd, N,
                   C);
    if (detail::layernorm_backward_cuda<T>(exec, dinp, dweight, dbias, dout, inp, weight, mean,
                                           rstd, N, C))
      return;
  }
#endif
  layernorm_backward_portable<T>(exec, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

#define MESHTRAIN_INSTANTIATE_LAYERNORM(T)                                                      \
  template void layernorm_forward<T>(const ExecSpace&, View1<T>, View1<float>, View1<float>,    \
                                     View1<const T>, View1<const T>, View1<const T>, int, int,  \
                                     float, View1<float>);                                      \
  template void layernorm_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,           \
                                      View1<const T>, View1<const T>, View1<const T>,           \
                                      View1<const float>, View1<const float>, int, int);        \
  template void layernorm_forward_portable<T>(const ExecSpace&, View1<T>, View1<float>,         \
                                              View1<float>, View1<const T>, View1<const T>,     \
                                              View1<const T>, int, int, float, View1<float>);   \
  template void layernorm_backward_portable<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,  \
                                               View1<const T>, View1<const T>, View1<const T>,  \
                                               View1<const float>, View1<const float>, int, int);
MESHTRAIN_INSTANTIATE_LAYERNORM(float)
MESHTRAIN_INSTANTIATE_LAYERNORM(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_LAYERNORM(bf16)
MESHTRAIN_INSTANTIATE_LAYERNORM(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_LAYERNORM

}  // namespace meshtrain::kernels
