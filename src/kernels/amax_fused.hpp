#pragma once
// Private to src/kernels/: the amax of an FP8 current-scaling cast (kernels/fp8_cast.hpp),
// computed by the kernel that writes the tensor, so that no extra pass reads it (issue 35).
//
// The amax is the unsigned max of the bits of |v| with the sign cleared, as fp8_amax reduces it
// (fp8_cast.cpp says why): NaN patterns above +inf above every finite value, exact and
// independent of order. So a kernel that folds the values it stores — after rounding to T —
// in any order and any split gets the bits fp8_amax gets from a second read of the output.
//
// A fused kernel sets amax(0), never accumulates onto an old value, in one of two ways:
//   - team and warp kernels (the norms): reset_amax zeroes it on the stream (the bits of 0.0f
//     are 0, the identity of the unsigned max), then each team or warp folds its partial max
//     in with one atomic max (fold_amax);
//   - flat element-wise kernels (GELU, SwiGLU): for_each_amax runs them as a Kokkos Max
//     reduction into amax(0)'s bits, fp8_amax's own reduction: Kokkos combines thread and
//     block partials and writes the result, so nothing is zeroed first and no thread needs an
//     atomic on the one address (per element, those would serialise). A kernel whose output
//     is cast as several parts under their own scales (SwiGLU's backward: gate and up) sets
//     one amax per part the same way (for_each_amaxes).
// Neither allocates nor makes the host wait: the reset is a stream-ordered memset and a
// reduction into a device View does not block.
#include <cstdint>
#include <string>

#include "common.hpp"
#include "meshtrain/core/fp8.hpp"

namespace meshtrain::kernels::detail {

// The bits of |x| as a float: x as stored in T, widened exactly (float, bf16, fp16).
template <class T>
KOKKOS_INLINE_FUNCTION std::uint32_t abs_bits(const T& x) {
  return fp8_detail::float_bits(static_cast<float>(acc(x))) & 0x7fffffffu;
}

KOKKOS_INLINE_FUNCTION std::uint32_t max_bits(std::uint32_t a, std::uint32_t b) {
  return a > b ? a : b;
}

// amax(0) as the uint32 the atomic max and the reduction work on.
using AmaxBits = Kokkos::View<std::uint32_t, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
inline std::uint32_t* amax_bits(const View1<float>& amax) {
  return reinterpret_cast<std::uint32_t*>(amax.data());
}

// amax(0) = 0, ordered on exec's stream (a cudaMemsetAsync on a CUDA build).
inline void reset_amax(const ExecSpace& exec, const View1<float>& amax) {
  Kokkos::deep_copy(exec, slice(amax, 0, 1), 0.0f);
}

// amax(0) = max(amax(0), b) in the bits' order.
KOKKOS_INLINE_FUNCTION void fold_amax(std::uint32_t* bits, std::uint32_t b) {
  Kokkos::atomic_fetch_max(bits, b);
}

// Inside a team: store(c) for c in [0, n) over the team's threads, where store writes one
// output element and returns the value it stored. kAmax: the team's max of their abs_bits is
// folded into *bits by one atomic (one per row for the row kernels); otherwise this is the plain
// loop, the returned values unused.
template <bool kAmax, class Store>
KOKKOS_INLINE_FUNCTION void team_store_amax(const Member& m, int n, std::uint32_t* bits,
                                            const Store& store) {
  if constexpr (!kAmax) {
    (void)bits;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(m, n), [&](int c) { store(c); });
  } else {
    std::uint32_t mx = 0;
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(m, n),
        [&](int c, std::uint32_t& v) { v = max_bits(v, abs_bits(store(c))); },
        Kokkos::Max<std::uint32_t>(mx));
    Kokkos::single(Kokkos::PerTeam(m), [&]() { fold_amax(bits, mx); });
  }
}

// f(i, m) for i in [0, n) on exec, where f stores its outputs and folds the abs_bits of what it
// stored into m. Without amax, a parallel_for in which m is dead (the compiler drops the
// folding: the kernel is the unfused one); with amax, amax(0) = the max of m over all i. The
// two store the same bits: on a GPU arithmetic yields one canonical NaN, whatever the operands'
// order (host builds run their fp32 kernels through host_loop_amax below).
template <class F>
void for_each_amax(const std::string& label, const ExecSpace& exec, Index n,
                   const View1<float>& amax, const F& f) {
  if (!present(amax)) {
    Kokkos::parallel_for(
        label, Range(exec, 0, n), KOKKOS_LAMBDA(Index i) {
          std::uint32_t m = 0;
          f(i, m);
        });
    return;
  }
  Kokkos::parallel_reduce(
      label, Range(exec, 0, n), KOKKOS_LAMBDA(Index i, std::uint32_t& m) { f(i, m); },
      Kokkos::Max<std::uint32_t, MemSpace>(AmaxBits(amax_bits(amax))));
}

// K amaxes from one flat kernel, each over its own part of the output (SwiGLU's backward: the
// gate and up halves of dgate_up are cast as two column blocks, each under its own scale).
// Kokkos::Max reduces one value; MaxBits<K> is its reducer over K, the same unsigned max entry
// by entry, so entry k is the bits fp8_amax_block gives on part k. f(i, m) stores its outputs
// and folds the abs_bits of each value it stored into m.v[k] of its part k; amax(0..K-1) are
// set (written as the reduction's result, as for_each_amax's one entry), or, without amax, a
// parallel_for in which m is dead.
template <int K>
struct AmaxBitsK {
  std::uint32_t v[K];
};

template <int K>
struct MaxBits {
  using reducer = MaxBits<K>;
  using value_type = AmaxBitsK<K>;
  using result_view_type =
      Kokkos::View<value_type, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  result_view_type result;

  KOKKOS_INLINE_FUNCTION explicit MaxBits(const result_view_type& r) : result(r) {}
  KOKKOS_INLINE_FUNCTION void join(value_type& dest, const value_type& src) const {
    for (int k = 0; k < K; ++k) dest.v[k] = max_bits(dest.v[k], src.v[k]);
  }
#if KOKKOS_VERSION < 40000  // Kokkos 3 joins through volatile references on some backends
  KOKKOS_INLINE_FUNCTION void join(volatile value_type& dest,
                                   const volatile value_type& src) const {
    for (int k = 0; k < K; ++k) dest.v[k] = max_bits(dest.v[k], src.v[k]);
  }
#endif
  KOKKOS_INLINE_FUNCTION void init(value_type& m) const {
    for (int k = 0; k < K; ++k) m.v[k] = 0;  // the bits of 0.0f: the unsigned max's identity
  }
  KOKKOS_INLINE_FUNCTION value_type& reference() const { return *result.data(); }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result; }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return false; }
};

template <int K, class F>
void for_each_amaxes(const std::string& label, const ExecSpace& exec, Index n,
                     const View1<float>& amax, const F& f) {
  if (!present(amax)) {
    Kokkos::parallel_for(
        label, Range(exec, 0, n), KOKKOS_LAMBDA(Index i) {
          AmaxBitsK<K> m{};
          f(i, m);
        });
    return;
  }
  check_extent(amax, K, label.c_str(), "amax");
  const typename MaxBits<K>::result_view_type result(
      reinterpret_cast<AmaxBitsK<K>*>(amax.data()));
  Kokkos::parallel_reduce(
      label, Range(exec, 0, n), KOKKOS_LAMBDA(Index i, AmaxBitsK<K>& m) { f(i, m); },
      MaxBits<K>(result));
}

// The plain host loops of the fp32 kernels on a host build (kDeviceIsHost, after a fence):
// loop(fold) stores its outputs and calls fold(v) on each value v it stored; amax(0) (host
// memory on such a build), when given, is set once at the end. The loop folds whether or not
// amax is given, so that its outputs come from the same instructions either way, NaN signs
// included: an unfused copy of the loop, compiled apart, may order a product's operands
// otherwise, and which of two NaN operands a CPU passes on is their order's choice. The cost is
// an integer max per element beside an exp.
// HostAmax<K> for K amaxes (as for_each_amaxes): the loop calls fold(k, v) for a value v of
// part k, and amax(0..K-1) are set.
template <int K = 1>
struct HostAmax {
  std::uint32_t m[K] = {};
  void operator()(float v) {
    static_assert(K == 1, "HostAmax<K>: fold(k, v) names the part");
    m[0] = max_bits(m[0], abs_bits(v));
  }
  void operator()(int k, float v) { m[k] = max_bits(m[k], abs_bits(v)); }
};
template <int K = 1, class Loop>
void host_loop_amax(const View1<float>& amax, const Loop& loop) {
  if (present(amax)) check_extent(amax, K, "host_loop_amax", "amax");
  HostAmax<K> fold;
  loop(fold);
  if (present(amax))
    for (int k = 0; k < K; ++k) amax(k) = fp8_detail::bits_float(fold.m[k]);
}

}  // namespace meshtrain::kernels::detail
