// Dispatch and combine kernels (permute.hpp). Rows are found by scans over the choices in
// (token, choice) order, which is what makes the order deterministic.
#include <algorithm>

#include "meshtrain/core/scratch_pool.hpp"
#include "meshtrain/moe/permute.hpp"

#include "common.hpp"

namespace meshtrain::moe {

namespace {
using detail::Index;
using detail::Member;
using detail::Range;
using detail::Team;
}  // namespace

void plan_dispatch(const ExecSpace& exec, View1<const int> expert, int N, int k, int E,
                   DispatchPlan& plan) {
  MESHTRAIN_CHECK(N >= 0 && k >= 1 && E >= 1, "moe::plan_dispatch: bad shape N=", N, ", k=", k,
                  ", E=", E);
  detail::check_extent(expert, std::size_t(N) * k, "moe::plan_dispatch", "expert");
  const Index A = Index(N) * k;
  plan.tokens = N;
  plan.top_k = k;
  plan.experts = E;
  detail::ensure(plan.position, "moe::dispatch_position", std::size_t(A));
  // Choices are cut into segments of kSegment; (expert e, segment b) is a slot, and the slots
  // in (e, b) order are the rows in dispatch order. Counting every slot, one scan over the slots
  // and a scan inside each slot give every choice its row, with E x segments teams of work for
  // the GPU (one team per expert scanning all N k choices kept 8 of an H200's 132 SMs busy).
  constexpr Index kSegment = 256;
  const Index B = std::max<Index>(1, (A + kSegment - 1) / kSegment), slots = Index(E) * B;
  View1<std::int64_t> start = pooled<std::int64_t>("moe::dispatch_slot_start", std::size_t(slots) + 1);
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_count", Team(exec, slots, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const Index slot = team.league_rank(), e = slot / B, b = slot % B;
        const Index lo = b * kSegment, hi = lo + kSegment < A ? lo + kSegment : A;
        std::int64_t n = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(team, lo, hi),
            [&](Index a, std::int64_t& acc) { acc += expert(a) == e ? 1 : 0; }, n);
        Kokkos::single(Kokkos::PerTeam(team), [&] { start(slot) = n; });
      });
  Kokkos::parallel_scan(
      "meshtrain::moe::dispatch_slot_scan", Range(exec, 0, slots + 1),
      KOKKOS_LAMBDA(Index i, std::int64_t& before, bool final) {
        const std::int64_t n = i < slots ? start(i) : 0;
        if (final) start(i) = before;
        before += n;
      });
  View1<std::int64_t> offsets = pooled<std::int64_t>("moe::dispatch_offsets", std::size_t(E) + 1);
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_offsets", Range(exec, 0, Index(E) + 1),
      KOKKOS_LAMBDA(Index e) { offsets(e) = start(e * B); });
  auto hoffsets = Kokkos::create_mirror_view(offsets);
  Kokkos::deep_copy(exec, hoffsets, offsets);
  exec.fence();
  plan.offsets.assign(hoffsets.data(), hoffsets.data() + E + 1);
  plan.counts.assign(std::size_t(E), 0);
  for (int e = 0; e < E; ++e) plan.counts[e] = plan.offsets[e + 1] - plan.offsets[e];
  plan.rows = plan.offsets[E];
  detail::ensure(plan.choice_of_row, "moe::dispatch_choice_of_row", std::size_t(plan.rows));
  auto position = plan.position;
  auto choice_of_row = plan.choice_of_row;
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_drop", Range(exec, 0, A), KOKKOS_LAMBDA(Index a) {
        if (expert(a) < 0) position(a) = -1;
      });
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_rows", Team(exec, slots, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const Index slot = team.league_rank(), e = slot / B, b = slot % B;
        const Index lo = b * kSegment, hi = lo + kSegment < A ? lo + kSegment : A;
        const std::int64_t first = start(slot);
        Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, lo, hi),
                              [&](Index a, std::int64_t& before, bool final) {
                                if (expert(a) != e) return;
                                if (final) {
                                  position(a) = static_cast<int>(first + before);
                                  choice_of_row(first + before) = static_cast<int>(a);
                                }
                                before += 1;
                              });
      });
}

template <class T>
void dispatch_forward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> x,
                      View1<T> xp, int H) {
  detail::check_extent(x, std::size_t(plan.tokens) * H, "moe::dispatch_forward", "x");
  detail::check_extent(xp, std::size_t(plan.rows) * H, "moe::dispatch_forward", "xp");
  const int k = plan.top_k;
  auto choice_of_row = plan.choice_of_row;
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_forward", Range(exec, 0, plan.rows * H), KOKKOS_LAMBDA(Index i) {
        const Index p = i / H, h = i % H;
        xp(i) = x(Index(choice_of_row(p) / k) * H + h);
      });
}

template <class T>
void dispatch_backward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> dxp,
                       View1<T> dx, int H) {
  detail::check_extent(dx, std::size_t(plan.tokens) * H, "moe::dispatch_backward", "dx");
  detail::check_extent(dxp, std::size_t(plan.rows) * H, "moe::dispatch_backward", "dxp");
  using Acc = weight_t<T>;
  const int k = plan.top_k;
  auto position = plan.position;
  Kokkos::parallel_for(
      "meshtrain::moe::dispatch_backward", Range(exec, 0, Index(plan.tokens) * H),
      KOKKOS_LAMBDA(Index i) {
        const Index t = i / H, h = i % H;
        Acc acc = 0;
        for (int j = 0; j < k; ++j) {
          const int p = position(t * k + j);
          if (p >= 0) acc += static_cast<Acc>(dxp(Index(p) * H + h));
        }
        dx(i) = static_cast<T>(acc);
      });
}

template <class T>
void combine_forward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> ye,
                     View1<const weight_t<T>> weight, View1<T> y, int H) {
  using Acc = weight_t<T>;
  detail::check_extent(ye, std::size_t(plan.rows) * H, "moe::combine_forward", "ye");
  detail::check_extent(weight, std::size_t(plan.tokens) * plan.top_k, "moe::combine_forward",
                       "weight");
  detail::check_extent(y, std::size_t(plan.tokens) * H, "moe::combine_forward", "y");
  const int k = plan.top_k;
  auto position = plan.position;
  Kokkos::parallel_for(
      "meshtrain::moe::combine_forward", Range(exec, 0, Index(plan.tokens) * H),
      KOKKOS_LAMBDA(Index i) {
        const Index t = i / H, h = i % H;
        Acc acc = 0;
        for (int j = 0; j < k; ++j) {
          const int p = position(t * k + j);
          if (p >= 0) acc += weight(t * k + j) * static_cast<Acc>(ye(Index(p) * H + h));
        }
        y(i) = static_cast<T>(acc);
      });
}

template <class T>
void combine_backward(const ExecSpace& exec, const DispatchPlan& plan, View1<const T> dy,
                      View1<const T> ye, View1<const weight_t<T>> weight, View1<T> dye,
                      View1<weight_t<T>> dweight, int H) {
  using Acc = weight_t<T>;
  const std::size_t A = std::size_t(plan.tokens) * plan.top_k;
  detail::check_extent(dy, std::size_t(plan.tokens) * H, "moe::combine_backward", "dy");
  detail::check_extent(ye, std::size_t(plan.rows) * H, "moe::combine_backward", "ye");
  detail::check_extent(weight, A, "moe::combine_backward", "weight");
  detail::check_extent(dye, std::size_t(plan.rows) * H, "moe::combine_backward", "dye");
  detail::check_extent(dweight, A, "moe::combine_backward", "dweight");
  const int k = plan.top_k;
  auto position = plan.position;
  auto choice_of_row = plan.choice_of_row;
  Kokkos::parallel_for(
      "meshtrain::moe::combine_backward_rows", Range(exec, 0, plan.rows * H),
      KOKKOS_LAMBDA(Index i) {
        const Index p = i / H, h = i % H;
        const Index a = choice_of_row(p);
        dye(i) = static_cast<T>(weight(a) * static_cast<Acc>(dy((a / k) * H + h)));
      });
  // One team per choice: the dot product over H.
  Kokkos::parallel_for(
      "meshtrain::moe::combine_backward_weights", Team(exec, Index(A), Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& team) {
        const Index a = team.league_rank();
        const int p = position(a);
        Acc dot = 0;
        if (p >= 0)
          Kokkos::parallel_reduce(
              Kokkos::TeamThreadRange(team, H),
              [&](int h, Acc& acc) {
                acc += static_cast<Acc>(dy((a / k) * H + h)) *
                       static_cast<Acc>(ye(Index(p) * H + h));
              },
              dot);
        Kokkos::single(Kokkos::PerTeam(team), [&] { dweight(a) = dot; });
      });
}

#define MESHTRAIN_INSTANTIATE_PERMUTE(T)                                                        \
  template void dispatch_forward<T>(const ExecSpace&, const DispatchPlan&, View1<const T>,      \
                                    View1<T>, int);                                             \
  template void dispatch_backward<T>(const ExecSpace&, const DispatchPlan&, View1<const T>,     \
                                     View1<T>, int);                                            \
  template void combine_forward<T>(const ExecSpace&, const DispatchPlan&, View1<const T>,       \
                                   View1<const weight_t<T>>, View1<T>, int);                    \
  template void combine_backward<T>(const ExecSpace&, const DispatchPlan&, View1<const T>,      \
                                    View1<const T>, View1<const weight_t<T>>, View1<T>,         \
                                    View1<weight_t<T>>, int);
MESHTRAIN_INSTANTIATE_PERMUTE(float)
MESHTRAIN_INSTANTIATE_PERMUTE(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_PERMUTE(bf16)
MESHTRAIN_INSTANTIATE_PERMUTE(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_PERMUTE

}  // namespace meshtrain::moe
