// Fused softmax cross-entropy, one team per row.
//
// Row statistics: the columns [0, V) are split into kParts fixed strided parts (c = p, p + kParts,
// ...). Each part keeps an online (max, sum exp(x - max)) pair (Milakov & Gimelshein 2018), the
// pairs go to team scratch and every thread merges them in part order. The partition does not
// depend on the team size or the backend, so the bits of the loss do not either, and strided
// parts keep neighbouring threads on neighbouring columns (coalesced on a GPU).
// Padding columns [V, Vp) are never read for the statistics: they may hold anything.
//
// These are the portable kernels. cross_entropy_forward_backward/forward (at the end) dispatch
// to the CUDA kernels of cross_entropy_cuda.cpp where they apply, and to these everywhere else.
#include "meshtrain/kernels/cross_entropy.hpp"

#include <limits>

#include <cmath>
#include <type_traits>

#include "common.hpp"
#include "host_exp.hpp"
#include "rowwise_cuda.hpp"

namespace meshtrain::kernels {

namespace detail {

// Host fp32 path: per row, a max pass and an exp-and-sum pass over 8 fixed lanes (lane k takes
// columns c = k mod 8; lanes merged in order), written as plain loops so that the compiler
// vectorises them with the vectorisable exp. With kStore the exponentials are written to `e`
// (which may be the row itself): the gradient pass then only scales them, one exp per logit.
// Returns (max, sum); forward-only and forward-backward share it, so their losses agree bit for
// bit.
template <bool kStore>
inline void host_row_stats(const float* x, int V, float* e, float& mx_out, float& sum_out) {
  constexpr int L = 8;
  float m[L];
  for (int k = 0; k < L; ++k) m[k] = kLowest<float>;
  int c = 0;
  for (; c + L <= V; c += L)
    for (int k = 0; k < L; ++k) m[k] = x[c + k] > m[k] ? x[c + k] : m[k];
  for (int k = 0; c + k < V; ++k) m[k] = x[c + k] > m[k] ? x[c + k] : m[k];
  float mx = m[0];
  for (int k = 1; k < L; ++k) mx = m[k] > mx ? m[k] : mx;
  float s[L] = {0, 0, 0, 0, 0, 0, 0, 0};
  c = 0;
  for (; c + L <= V; c += L)
    for (int k = 0; k < L; ++k) {
      const float v = host_exp(x[c + k] - mx);
      if constexpr (kStore) e[c + k] = v;
      s[k] += v;
    }
  for (int k = 0; c + k < V; ++k) {
    const float v = host_exp(x[c + k] - mx);
    if constexpr (kStore) e[c + k] = v;
    s[k] += v;
  }
  float sum = 0;
  for (int k = 0; k < L; ++k) sum += s[k];
  mx_out = mx;
  sum_out = sum;
}

inline constexpr int kCeParts = 64;

inline void check_cross_entropy(const char* fn, int N, int Vp, int V) {
  MESHTRAIN_CHECK(N >= 0 && V > 0 && Vp >= V, fn, ": bad shape N=", N, ", Vp=", Vp, ", V=", V);
}

template <class Logits>
void check_cross_entropy(const char* fn, View1<float> losses, const Logits& logits,
                         View1<const std::int32_t> targets, int N, int Vp, int V) {
  check_cross_entropy(fn, N, Vp, V);
  check_extent(losses, N, fn, "losses");
  check_extent(logits, std::size_t(N) * Vp, fn, "logits");
  check_extent(targets, N, fn, "targets");
}

// log(sum_{c<V} exp(x_c)) of one row, on every thread of the team. Ends with a team barrier,
// after which the row may be overwritten.
template <class T, class Logits>
KOKKOS_INLINE_FUNCTION acc_t<T> row_logsumexp(const Member& m, const Logits& logits, Index base,
                                              int V, acc_t<T> lowest) {
  using Acc = acc_t<T>;
  ScratchView<Acc> part(m.team_scratch(0), 2 * kCeParts);  // [max x kParts | sum x kParts]
  Kokkos::parallel_for(Kokkos::TeamThreadRange(m, kCeParts), [&](int p) {
    Acc mx = lowest, s = 0;
    for (int c = p; c < V; c += kCeParts) {
      const Acc x = acc(logits(base + c));
      if (x > mx) {
        s = s * kc::exp(mx - x) + Acc(1);
        mx = x;
      } else {
        s += kc::exp(x - mx);
      }
    }
    part(p) = mx;
    part(kCeParts + p) = s;
  });
  m.team_barrier();
  Acc mx = lowest;
  for (int p = 0; p < kCeParts; ++p) mx = part(p) > mx ? part(p) : mx;
  Acc s = 0;
  for (int p = 0; p < kCeParts; ++p) s += part(kCeParts + p) * kc::exp(part(p) - mx);
  return mx + kc::log(s);
}

template <class T>
Team ce_policy(const ExecSpace& exec, int N) {
  Team policy(exec, N, Kokkos::AUTO);
  policy.set_scratch_size(0, Kokkos::PerTeam(ScratchView<acc_t<T>>::shmem_size(2 * kCeParts)));
  return policy;
}

}  // namespace detail

template <class T>
void cross_entropy_forward_backward_portable(const ExecSpace& exec, View1<float> losses,
                                             View1<T> logits, View1<const std::int32_t> targets,
                                             int N, int Vp, int V, float grad_scale) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  detail::check_cross_entropy("cross_entropy_forward_backward", losses, logits, targets, N, Vp,
                              V);
  const Acc lowest = detail::kLowest<Acc>, gs = grad_scale;
  // A target outside [0, V) other than "ignore" is corrupt input: a NaN loss makes it loud.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    kc::fence(exec, "meshtrain::cross_entropy_forward_backward: host loop");
    // Not a Kokkos kernel: a region keeps it visible to Kokkos Tools (perf/bench/bench_train_step).
    Kokkos::Profiling::pushRegion("meshtrain::cross_entropy_forward_backward");
    for (Index row = 0; row < N; ++row) {
      float* x = logits.data() + row * Vp;
      const int tgt = targets(row);
      float loss = 0;
      if (tgt >= 0) {
        const float xt = tgt < V ? x[tgt] : nan;
        float mx, sum;
        detail::host_row_stats<true>(x, V, x, mx, sum);
        loss = mx + std::log(sum) - xt;
        const float scale = gs / sum;
        for (int c = 0; c < V; ++c) x[c] *= scale;
        if (tgt < V) x[tgt] -= gs;
        for (int c = V; c < Vp; ++c) x[c] = 0.0f;
      } else {
        for (int c = 0; c < Vp; ++c) x[c] = 0.0f;
      }
      losses(row) = loss;
    }
    Kokkos::Profiling::popRegion();
    return;
  }
  Kokkos::parallel_for(
      "meshtrain::cross_entropy_forward_backward", detail::ce_policy<T>(exec, N),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const Index row = m.league_rank();
        const Index base = row * Vp;
        const int tgt = targets(row);
        const bool counted = tgt >= 0;
        Acc lse = 0, loss = 0;
        if (counted) {
          lse = detail::row_logsumexp<T>(m, logits, base, V, lowest);
          loss = tgt < V ? lse - acc(logits(base + tgt)) : Acc(nan);
          m.team_barrier();  // everyone has read logits[tgt] before the row is overwritten
        }
        Kokkos::parallel_for(Kokkos::TeamThreadRange(m, Vp), [&](int c) {
          Acc g = 0;
          if (counted && c < V) g = gs * (kc::exp(acc(logits(base + c)) - lse) - (c == tgt ? 1 : 0));
          logits(base + c) = static_cast<T>(g);
        });
        Kokkos::single(Kokkos::PerTeam(m), [&]() { losses(row) = static_cast<float>(loss); });
      });
}

template <class T>
void cross_entropy_forward_portable(const ExecSpace& exec, View1<float> losses,
                                    View1<const T> logits, View1<const std::int32_t> targets,
                                    int N, int Vp, int V) {
  using Acc = detail::acc_t<T>;
  using detail::acc;
  using detail::Index;
  detail::check_cross_entropy("cross_entropy_forward", losses, logits, targets, N, Vp, V);
  const Acc lowest = detail::kLowest<Acc>;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    kc::fence(exec, "meshtrain::cross_entropy_forward: host loop");
    // Not a Kokkos kernel: a region keeps it visible to Kokkos Tools (perf/bench/bench_train_step).
    Kokkos::Profiling::pushRegion("meshtrain::cross_entropy_forward");
    for (Index row = 0; row < N; ++row) {
      const float* x = logits.data() + row * Vp;
      const int tgt = targets(row);
      float loss = 0;
      if (tgt >= 0) {
        float mx, sum;
        detail::host_row_stats<false>(x, V, nullptr, mx, sum);
        loss = mx + std::log(sum) - (tgt < V ? x[tgt] : nan);
      }
      losses(row) = loss;
    }
    Kokkos::Profiling::popRegion();
    return;
  }
  Kokkos::parallel_for(
      "meshtrain::cross_entropy_forward", detail::ce_policy<T>(exec, N),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const Index row = m.league_rank();
        const int tgt = targets(row);
        if (tgt < 0) {
          Kokkos::single(Kokkos::PerTeam(m), [&]() { losses(row) = 0.0f; });
          return;
        }
        const Acc lse = detail::row_logsumexp<T>(m, logits, row * Vp, V, lowest);
        const Acc loss = tgt < V ? lse - acc(logits(row * Vp + tgt)) : Acc(nan);
        Kokkos::single(Kokkos::PerTeam(m), [&]() { losses(row) = static_cast<float>(loss); });
      });
}

void sum_losses(const ExecSpace& exec, Scalar<float> out, View1<const float> losses, int N,
                bool accumulate) {
  MESHTRAIN_CHECK(N >= 0, "sum_losses: N=", N);
  detail::check_extent(losses, N, "sum_losses", "losses");
  detail::reduce_to_scalar(
      exec, "meshtrain::sum_losses", out, N, accumulate,
      KOKKOS_LAMBDA(detail::Index i, float& s) { s += losses(i); });
}

// Dispatch: the CUDA kernels (cross_entropy_cuda.cpp) for float and bf16 on a CUDA device when
// the shape suits them (rowwise_cuda.hpp), the portable kernels otherwise. Host builds compile
// only the portable call.
template <class T>
void cross_entropy_forward_backward(const ExecSpace& exec, View1<float> losses, View1<T> logits,
                                    View1<const std::int32_t> targets, int N, int Vp, int V,
                                    float grad_scale) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    detail::check_cross_entropy("cross_entropy_forward_backward", losses, logits, targets, N, Vp,
                                V);
    if (detail::cross_entropy_forward_backward_cuda<T>(exec, losses, logits, targets, N, Vp, V,
                                                       grad_scale))
      return;
  }
#endif
  cross_entropy_forward_backward_portable<T>(exec, losses, logits, targets, N, Vp, V, grad_scale);
}

template <class T>
void cross_entropy_forward(const ExecSpace& exec, View1<float> losses, View1<const T> logits,
                           View1<const std::int32_t> targets, int N, int Vp, int V) {
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (detail::kCudaRowwiseType<T>) {
    detail::check_cross_entropy("cross_entropy_forward", losses, logits, targets, N, Vp, V);
    if (detail::cross_entropy_forward_cuda<T>(exec, losses, logits, targets, N, Vp, V)) return;
  }
#endif
  cross_entropy_forward_portable<T>(exec, losses, logits, targets, N, Vp, V);
}

#define MESHTRAIN_INSTANTIATE_CROSS_ENTROPY(T)                                                  \
  template void cross_entropy_forward_backward<T>(const ExecSpace&, View1<float>, View1<T>,     \
                                                  View1<const std::int32_t>, int, int, int,     \
                                                  float);                                       \
  template void cross_entropy_forward<T>(const ExecSpace&, View1<float>, View1<const T>,        \
                                         View1<const std::int32_t>, int, int, int);             \
  template void cross_entropy_forward_backward_portable<T>(                                     \
      const ExecSpace&, View1<float>, View1<T>, View1<const std::int32_t>, int, int, int, float); \
  template void cross_entropy_forward_portable<T>(const ExecSpace&, View1<float>,               \
                                                  View1<const T>, View1<const std::int32_t>,    \
                                                  int, int, int);
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY(float)
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY(bf16)
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_CROSS_ENTROPY

}  // namespace meshtrain::kernels
