// Vocabulary-parallel cross-entropy: three row-wise passes around two all-reduces (see
// cross_entropy.hpp). One team per row; team reductions keep the result independent of how many
// tp ranks share the vocabulary only up to float rounding, which is what layout invariance asks.
#include <limits>

#include "common.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"

namespace meshtrain::kernels {

namespace {
int real_columns(int Vl, int v0, int V) {
  const int r = V - v0;
  return r < 0 ? 0 : (r < Vl ? r : Vl);
}
void check_vp(const char* fn, int N, int Vl, int v0, int V) {
  MESHTRAIN_CHECK(N >= 0 && Vl > 0 && v0 >= 0 && V > 0, fn, ": bad shape N=", N, ", Vl=", Vl,
                  ", v0=", v0, ", V=", V);
}
}  // namespace

template <class T>
void vp_ce_max(const ExecSpace& exec, View1<float> rowmax, View1<const T> logits, int N, int Vl,
               int v0, int V) {
  using detail::acc;
  using Acc = detail::acc_t<T>;
  const char* fn = "vp_ce_max";
  check_vp(fn, N, Vl, v0, V);
  detail::check_extent(rowmax, N, fn, "rowmax");
  detail::check_extent(logits, std::size_t(N) * Vl, fn, "logits");
  const int R = real_columns(Vl, v0, V);
  const float lowest = detail::kLowest<float>;
  Kokkos::parallel_for(
      "meshtrain::vp_ce_max", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index base = detail::Index(m.league_rank()) * Vl;
        Acc mx = lowest;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, R),
            [&](int c, Acc& v) {
              const Acc x = acc(logits(base + c));
              v = x > v ? x : v;
            },
            Kokkos::Max<Acc>(mx));
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          rowmax(m.league_rank()) = static_cast<float>(mx > Acc(lowest) ? mx : Acc(lowest));
        });
      });
}

template <class T>
void vp_ce_sums(const ExecSpace& exec, View1<float> sums, View1<const T> logits,
                View1<const std::int32_t> targets, View1<const float> rowmax, int N, int Vl,
                int v0, int V) {
  using detail::acc;
  using Acc = detail::acc_t<T>;
  const char* fn = "vp_ce_sums";
  check_vp(fn, N, Vl, v0, V);
  detail::check_extent(sums, 2 * std::size_t(N), fn, "sums");
  detail::check_extent(logits, std::size_t(N) * Vl, fn, "logits");
  detail::check_extent(targets, N, fn, "targets");
  const int R = real_columns(Vl, v0, V);
  Kokkos::parallel_for(
      "meshtrain::vp_ce_sums", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank(), base = row * Vl;
        const Acc mx = rowmax(row);
        Acc s = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(m, R),
            [&](int c, Acc& v) { v += kc::exp(acc(logits(base + c)) - mx); }, s);
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          const int t = targets(row) - v0;
          sums(2 * row) = static_cast<float>(s);
          sums(2 * row + 1) = (t >= 0 && t < R) ? static_cast<float>(acc(logits(base + t))) : 0.0f;
        });
      });
}

template <class T>
void vp_ce_finish(const ExecSpace& exec, View1<float> losses, View1<T> logits,
                  View1<const std::int32_t> targets, View1<const float> rowmax,
                  View1<const float> sums, int N, int Vl, int v0, int V, float grad_scale,
                  bool write_grad) {
  using detail::acc;
  using Acc = detail::acc_t<T>;
  const char* fn = "vp_ce_finish";
  check_vp(fn, N, Vl, v0, V);
  detail::check_extent(losses, N, fn, "losses");
  detail::check_extent(logits, std::size_t(N) * Vl, fn, "logits");
  const int R = real_columns(Vl, v0, V);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Acc gs = grad_scale;
  Kokkos::parallel_for(
      "meshtrain::vp_ce_finish", detail::Team(exec, N, Kokkos::AUTO),
      KOKKOS_LAMBDA(const detail::Member& m) {
        const detail::Index row = m.league_rank(), base = row * Vl;
        const int tgt = targets(row);
        const bool counted = tgt >= 0;
        const Acc mx = rowmax(row), sum = sums(2 * row);
        if (write_grad) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(m, Vl), [&](int c) {
            Acc g = 0;
            if (counted && c < R)
              g = gs * (kc::exp(acc(logits(base + c)) - mx) / sum - (c + v0 == tgt ? 1 : 0));
            logits(base + c) = static_cast<T>(g);
          });
        }
        Kokkos::single(Kokkos::PerTeam(m), [&]() {
          float loss = 0;
          if (counted)
            loss = tgt < V ? static_cast<float>(mx + kc::log(sum) - Acc(sums(2 * row + 1))) : nan;
          losses(row) = loss;
        });
      });
}

#define MESHTRAIN_INSTANTIATE_VP_CE(T)                                                          \
  template void vp_ce_max<T>(const ExecSpace&, View1<float>, View1<const T>, int, int, int, int); \
  template void vp_ce_sums<T>(const ExecSpace&, View1<float>, View1<const T>,                   \
                              View1<const std::int32_t>, View1<const float>, int, int, int, int); \
  template void vp_ce_finish<T>(const ExecSpace&, View1<float>, View1<T>,                       \
                                View1<const std::int32_t>, View1<const float>,                  \
                                View1<const float>, int, int, int, int, float, bool);
MESHTRAIN_INSTANTIATE_VP_CE(float)
MESHTRAIN_INSTANTIATE_VP_CE(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_VP_CE(bf16)
MESHTRAIN_INSTANTIATE_VP_CE(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_VP_CE

}  // namespace meshtrain::kernels
