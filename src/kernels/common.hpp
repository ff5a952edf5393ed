#pragma once
// Private to src/kernels/: accumulation types, policies and small helpers shared by the kernels.
//
// Every kernel loads with acc(x) and stores with static_cast<T>(...), so a narrow storage type
// (bf16 later) is a drop-in with fp32 arithmetic. double keeps double accumulation: the double
// instantiations exist so that the gradient-check tests can run the real kernels at ~1e-12.
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "meshtrain/core/error.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

template <class T>
struct Accum {
  using type = float;
};
template <>
struct Accum<double> {
  using type = double;
};
template <class T>
using acc_t = typename Accum<std::remove_cv_t<T>>::type;

template <class T>
KOKKOS_INLINE_FUNCTION acc_t<T> acc(const T& x) {
  return static_cast<acc_t<T>>(x);
}

// A Kokkos Tools region around work Kokkos does not launch itself (cuBLAS calls, raw CUDA
// kernels), so that a profiling tool (perf/bench/bench_train_step's, or any KokkosP library)
// sees it.
// The label is built only while a tool is loaded: without one this is one flag test.
class ToolRegion {
 public:
  template <class MakeLabel>
  explicit ToolRegion(const MakeLabel& make) : on_(Kokkos::Profiling::profileLibraryLoaded()) {
    if (on_) Kokkos::Profiling::pushRegion(make());
  }
  ~ToolRegion() {
    if (on_) Kokkos::Profiling::popRegion();
  }
  ToolRegion(const ToolRegion&) = delete;
  ToolRegion& operator=(const ToolRegion&) = delete;

 private:
  bool on_;
};

// 64-bit indices for flat element-wise kernels: B*T*Vp or a flat parameter buffer can pass 2^31.
using Index = std::int64_t;
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>;
using Team = Kokkos::TeamPolicy<ExecSpace>;
using Member = Team::member_type;
template <class A>
using ScratchView =
    Kokkos::View<A*, ExecSpace::scratch_memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// The most negative finite value: the identity of a running max. Finite (not -inf) so that a
// correction factor exp(m_old - m_new) never evaluates inf - inf.
template <class A>
inline constexpr A kLowest = std::numeric_limits<A>::lowest();

// Vector length for a team that works on one head-sized row: a power of two, at most what the
// backend allows (32 lanes on CUDA, 1 on host backends).
inline int vector_length_for(int width) {
  int v = 1;
  while (v < width && v < 32) v *= 2;
  const int vmax = Team::vector_length_max();
  return v < vmax ? v : vmax;
}

// A View that the caller may pass empty ("no bias", "no wpe") or with at least `need` elements.
template <class V>
bool present(const V& v) {
  return v.extent(0) > 0;
}

template <class V>
void check_extent(const V& v, std::size_t need, const char* fn, const char* what) {
  MESHTRAIN_CHECK(v.extent(0) >= need, fn, ": ", what, " has ", v.extent(0),
                  " elements, needs at least ", need);
}

// A device scalar kept for the whole run (allocated on first use, released by a Kokkos finalize
// hook): reductions must not allocate per call, since a cudaMalloc/cudaFree synchronises the
// device and the host.
Scalar<float> persistent_scalar(int slot);
// A device double for reductions that need double accumulation (one user at a time, in queue order).
Kokkos::View<double, MemSpace> persistent_double();
// A device buffer of at least n floats kept for the run (grown, never shrunk), for two-stage
// reductions. Slots are independent; uses of one slot are ordered by the instance's queue.
View1<float> persistent_buffer(int slot, std::size_t n);

// Rows per chunk of the two-stage column sums on a GPU: stage 1 has one thread per (chunk,
// column) summing its rows in order, stage 2 one thread per column adding the chunks in order.
// Deterministic (a fixed order) and parallel enough to fill the GPU: a one-thread-per-column
// sum over 16k rows ran 768 threads and was two thirds of a GPT-2 training step.
inline constexpr int kColumnChunkRows = 64;

// Device column sums of K quantities: for every column c, v[j] = sum over rows n (in order) of
// the terms that term(n, c, v) adds into v[0..K) (an Acc*), then store(c, v). Stage 1 sums 64-row chunks
// into partials (fp32 from the persistent scratch `slot`; a buffer of its own for double), stage
// 2 adds the chunks in order: deterministic, with chunks x C threads.
template <class Acc, int K, class Term, class Store>
void column_sums(const ExecSpace& exec, const std::string& label, Index N, Index C, int slot,
                 const Term& term, const Store& store) {
  const Index chunks = (N + kColumnChunkRows - 1) / kColumnChunkRows;
  const Index stride = chunks * C;  // partials of quantity j start at j * stride
  View1<Acc> part;
  if constexpr (std::is_same_v<Acc, float>) part = persistent_buffer(slot, K * std::size_t(stride));
  else part = View1<Acc>("meshtrain::column_sum_partials", K * std::size_t(stride));
  Kokkos::parallel_for(
      label + "_chunks", Range(exec, 0, stride), KOKKOS_LAMBDA(Index i) {
        const Index k = i / C, c = i % C;
        const Index n1 = (k + 1) * kColumnChunkRows < N ? (k + 1) * kColumnChunkRows : N;
        Acc v[K] = {};
        for (Index n = k * kColumnChunkRows; n < n1; ++n) term(n, c, v);
        for (int j = 0; j < K; ++j) part(j * stride + i) = v[j];
      });
  Kokkos::parallel_for(
      label, Range(exec, 0, C), KOKKOS_LAMBDA(Index c) {
        Acc v[K] = {};
        for (Index k = 0; k < chunks; ++k)
          for (int j = 0; j < K; ++j) v[j] += part(j * stride + k * C + c);
        store(c, v);
      });
}

// out = sum (or out += sum) where sum = sum_i f(i) over [0, n), reduced by Kokkos (a fixed tree
// per backend and launch shape: the same bits on every run). The result stays on the device;
// nothing is allocated and the host does not wait.
template <class F>
void reduce_to_scalar(const ExecSpace& exec, const std::string& label, Scalar<float> out,
                      std::size_t n, bool accumulate, const F& f) {
  if (!accumulate) {
    Kokkos::parallel_reduce(label, Range(exec, 0, static_cast<Index>(n)), f, out);
    return;
  }
  Scalar<float> partial = persistent_scalar(0);
  Kokkos::parallel_reduce(label, Range(exec, 0, static_cast<Index>(n)), f, partial);
  Kokkos::parallel_for(
      label + "_accumulate", Range(exec, 0, 1), KOKKOS_LAMBDA(Index) { out() += partial(); });
}

}  // namespace meshtrain::kernels::detail
