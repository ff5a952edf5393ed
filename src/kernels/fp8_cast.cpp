// FP8 current-scaling casts (kernels/fp8_cast.hpp): amax reductions, scales, cast, dequantize.
//
// The amax is reduced as the bits of |x| (sign cleared) under an unsigned max: for non-negative
// IEEE floats the bit patterns order as the values do, and every NaN pattern lies above +inf.
// So one integer max reduction — exact, order-free, the same on every backend and for any
// split of the tensor — gives the largest magnitude, inf over finite values and NaN over all,
// which a floating-point max (NaN compares false) would not.
#include "meshtrain/kernels/fp8_cast.hpp"

#include <type_traits>
#include <utility>

#include "amax_fused.hpp"
#include "common.hpp"
#include "fp8_cast_cuda.hpp"

namespace meshtrain::kernels {

namespace {

using detail::abs_bits;  // amax_fused.hpp: shared with the kernels that fuse the amax
using detail::acc;
using detail::Index;
using detail::Member;
using detail::Range;
using detail::Team;
using UView = Kokkos::View<std::uint32_t, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

void check_shape(const char* fn, int rows, int cols) {
  MESHTRAIN_CHECK(rows >= 0 && cols >= 0, fn, ": rows=", rows, " cols=", cols,
                  " must not be negative");
}

std::size_t scale_entries(Fp8Scaling s, int rows) {
  return s == Fp8Scaling::rowwise ? static_cast<std::size_t>(rows) : 1;
}

}  // namespace

const char* fp8_scaling_name(Fp8Scaling s) {
  return s == Fp8Scaling::rowwise ? "rowwise" : "tensorwise";
}

template <class T>
void fp8_amax(const ExecSpace& exec, View1<float> amax, View1<const T> x, std::size_t n,
              bool accumulate) {
  detail::check_extent(amax, 1, "fp8_amax", "amax");
  detail::check_extent(x, n, "fp8_amax", "x");
  // Reduce straight into amax(0)'s bits, or into scratch slot 1 when it is to be combined.
  float* target = accumulate ? detail::persistent_scalar(1).data() : amax.data();
  UView bits(reinterpret_cast<std::uint32_t*>(target));
  Kokkos::parallel_reduce(
      "meshtrain::fp8_amax", Range(exec, 0, Index(n)),
      KOKKOS_LAMBDA(Index i, std::uint32_t& m) {
        const std::uint32_t b = abs_bits(x(i));
        if (b > m) m = b;
      },
      Kokkos::Max<std::uint32_t, MemSpace>(bits));
  if (!accumulate) return;
  auto out = amax;
  Kokkos::parallel_for(
      "meshtrain::fp8_amax_accumulate", Range(exec, 0, 1), KOKKOS_LAMBDA(Index) {
        const std::uint32_t a = fp8_detail::float_bits(out(0)) & 0x7fffffffu, b = bits();
        out(0) = fp8_detail::bits_float(a > b ? a : b);
      });
}

template <class T>
void fp8_amax_rows(const ExecSpace& exec, View1<float> amax, View1<const T> x, int rows,
                   int cols) {
  check_shape("fp8_amax_rows", rows, cols);
  detail::check_extent(amax, std::size_t(rows), "fp8_amax_rows", "amax");
  detail::check_extent(x, std::size_t(rows) * std::size_t(cols), "fp8_amax_rows", "x");
  // A team per row, its threads striding along the row (coalesced on a GPU).
  Kokkos::parallel_for(
      "meshtrain::fp8_amax_rows", Team(exec, rows, Kokkos::AUTO), KOKKOS_LAMBDA(const Member& t) {
        const Index r = t.league_rank();
        const T* row = x.data() + r * Index(cols);
        std::uint32_t m = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(t, cols),
            [&](int c, std::uint32_t& v) {
              const std::uint32_t b = abs_bits(row[c]);
              if (b > v) v = b;
            },
            Kokkos::Max<std::uint32_t>(m));
        Kokkos::single(Kokkos::PerTeam(t), [&] { amax(r) = fp8_detail::bits_float(m); });
      });
}

void fp8_scales(const ExecSpace& exec, View1<const float> amax, View1<float> scale,
                View1<float> scale_inv, std::size_t count, Fp8Format format) {
  detail::check_extent(amax, count, "fp8_scales", "amax");
  detail::check_extent(scale, count, "fp8_scales", "scale");
  detail::check_extent(scale_inv, count, "fp8_scales", "scale_inv");
  Kokkos::parallel_for(
      "meshtrain::fp8_scales", Range(exec, 0, Index(count)), KOKKOS_LAMBDA(Index i) {
        const float s = fp8_scale_from_amax(amax(i), format);
        scale(i) = s;
        scale_inv(i) = 1.0f / s;
      });
}

template <class T>
void fp8_cast(const ExecSpace& exec, View1<std::uint8_t> q, View1<const T> x, int rows, int cols,
              View1<const float> scale, Fp8Scaling scaling, Fp8Format format, bool transpose) {
  check_shape("fp8_cast", rows, cols);
  const std::size_t n = std::size_t(rows) * std::size_t(cols);
  detail::check_extent(q, n, "fp8_cast", "q");
  detail::check_extent(x, n, "fp8_cast", "x");
  detail::check_extent(scale, scale_entries(scaling, rows), "fp8_cast", "scale");
  MESHTRAIN_CHECK(!(transpose && scaling == Fp8Scaling::rowwise),
                  "fp8_cast: a transposed cast takes tensorwise scaling (rowwise scales of the "
                  "transpose are the source's column scales)");
  const bool rowwise = scaling == Fp8Scaling::rowwise;
  const Index C = cols;
  if (transpose) {
    fp8_cast_block<T>(exec, View1<std::uint8_t>(), q, x.data(), rows, cols, cols, scale, format);
    return;
  }
  Kokkos::parallel_for(
      "meshtrain::fp8_cast", Range(exec, 0, Index(n)), KOKKOS_LAMBDA(Index i) {
        const float s = scale(rowwise ? i / C : 0);
        q(i) = fp8_encode(static_cast<float>(acc(x(i))) * s, format);
      });
}

template <class T>
void fp8_amax_block(const ExecSpace& exec, View1<float> amax, const T* x, int rows, int cols,
                    int ld) {
  check_shape("fp8_amax_block", rows, cols);
  MESHTRAIN_CHECK(ld >= cols, "fp8_amax_block: ld=", ld, " < cols=", cols);
  detail::check_extent(amax, 1, "fp8_amax_block", "amax");
#if defined(KOKKOS_ENABLE_CUDA)
  if (detail::fp8_amax_block_cuda<T>(exec, amax, x, rows, cols, ld)) return;
#endif
  UView bits(reinterpret_cast<std::uint32_t*>(amax.data()));
  if (rows == 0 || cols == 0) {
    Kokkos::deep_copy(exec, bits, std::uint32_t(0));
    return;
  }
  const Index C = cols, L = ld;
  // No per-element index division (64-bit: on the H100 it made this pass several times slower
  // than its memory traffic): a contiguous tensor read flat, a column block a team per row.
  if (ld == cols) {
    Kokkos::parallel_reduce(
        "meshtrain::fp8_amax_block", Range(exec, 0, Index(rows) * C),
        KOKKOS_LAMBDA(Index i, std::uint32_t& m) {
          const std::uint32_t b = abs_bits(x[i]);
          if (b > m) m = b;
        },
        Kokkos::Max<std::uint32_t, MemSpace>(bits));
    return;
  }
  Kokkos::parallel_reduce(
      "meshtrain::fp8_amax_block_rows", Team(exec, rows, Kokkos::AUTO),
      KOKKOS_LAMBDA(const Member& t, std::uint32_t& m) {
        const T* row = x + Index(t.league_rank()) * L;
        std::uint32_t v = 0;
        Kokkos::parallel_reduce(
            Kokkos::TeamThreadRange(t, cols),
            [&](int c, std::uint32_t& w) {
              const std::uint32_t b = abs_bits(row[c]);
              if (b > w) w = b;
            },
            Kokkos::Max<std::uint32_t>(v));
        Kokkos::single(Kokkos::PerTeam(t), [&] {
          if (v > m) m = v;
        });
      },
      Kokkos::Max<std::uint32_t, MemSpace>(bits));
}

template <class T>
void fp8_cast_block(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                    const T* x, int rows, int cols, int ld, View1<const float> scale,
                    Fp8Format format) {
  check_shape("fp8_cast_block", rows, cols);
  MESHTRAIN_CHECK(ld >= cols, "fp8_cast_block: ld=", ld, " < cols=", cols);
  const std::size_t n = std::size_t(rows) * std::size_t(cols);
  const bool want_q = detail::present(q), want_qt = detail::present(qt);
  if (want_q) detail::check_extent(q, n, "fp8_cast_block", "q");
  if (want_qt) detail::check_extent(qt, n, "fp8_cast_block", "qt");
  detail::check_extent(scale, 1, "fp8_cast_block", "scale");
#if defined(KOKKOS_ENABLE_CUDA)
  if (n > 0 && detail::fp8_cast_block_cuda<T>(exec, q, qt, x, rows, cols, ld,
                                              detail::CastScale{scale.data()}, format))
    return;
#endif
  const Index C = cols, R = rows, L = ld;
  if (!want_qt) {
    if (!want_q || n == 0) return;
    if (ld == cols) {
      Kokkos::parallel_for(
          "meshtrain::fp8_cast_block", Range(exec, 0, R * C), KOKKOS_LAMBDA(Index i) {
            q(i) = fp8_encode(static_cast<float>(acc(x[i])) * scale(0), format);
          });
      return;
    }
    // A team per row of the column block (no per-element index division).
    Kokkos::parallel_for(
        "meshtrain::fp8_cast_block_rows", Team(exec, rows, Kokkos::AUTO),
        KOKKOS_LAMBDA(const Member& t) {
          const Index r = t.league_rank();
          const T* row = x + r * L;
          const float s = scale(0);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, cols), [&](int c) {
            q(r * C + c) = fp8_encode(static_cast<float>(acc(row[c])) * s, format);
          });
        });
    return;
  }
  {
    // A team per kTile x kTile tile, staged through scratch (shared memory on a GPU): read
    // along the source's rows, written along the output's, so both sides are coalesced. One
    // thread per output element read the source a column at a time, each warp touching 32
    // rows' cache lines for 2 bytes apiece: the backward's transposed casts (x, dy and the
    // weight of every linear) cost more than the FP8 GEMMs saved. The +1 column of padding
    // keeps the column-wise scratch reads on distinct banks.
    using Acc = std::decay_t<decltype(acc(std::declval<T>()))>;
    using Scratch = detail::ScratchView<Acc>;
    constexpr int kTile = 32, kLd = kTile + 1;
    const Index tiles_c = (C + kTile - 1) / kTile, tiles = ((R + kTile - 1) / kTile) * tiles_c;
    Team policy(exec, tiles, Kokkos::AUTO);
    policy.set_scratch_size(0, Kokkos::PerTeam(Scratch::shmem_size(kTile * kLd)));
    Kokkos::parallel_for(
        "meshtrain::fp8_cast_transpose", policy, KOKKOS_LAMBDA(const Member& t) {
          const Index r0 = (t.league_rank() / tiles_c) * kTile;
          const Index c0 = (t.league_rank() % tiles_c) * kTile;
          Scratch tile(t.team_scratch(0), kTile * kLd);
          const float s = scale(0);
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, kTile * kTile), [&](int e) {
            const int i = e / kTile, j = e % kTile;
            if (r0 + i < R && c0 + j < C) {
              const Acc v = acc(x[(r0 + i) * L + c0 + j]);
              tile(i * kLd + j) = v;
              if (want_q) q((r0 + i) * C + c0 + j) = fp8_encode(static_cast<float>(v) * s, format);
            }
          });
          t.team_barrier();
          Kokkos::parallel_for(Kokkos::TeamThreadRange(t, kTile * kTile), [&](int e) {
            const int j = e / kTile, i = e % kTile;
            if (r0 + i < R && c0 + j < C)
              qt((c0 + j) * R + r0 + i) =
                  fp8_encode(static_cast<float>(tile(i * kLd + j)) * s, format);
          });
        });
  }
}

template <class T>
void fp8_dequantize(const ExecSpace& exec, View1<T> x, View1<const std::uint8_t> q, int rows,
                    int cols, View1<const float> scale_inv, Fp8Scaling scaling,
                    Fp8Format format) {
  check_shape("fp8_dequantize", rows, cols);
  const std::size_t n = std::size_t(rows) * std::size_t(cols);
  detail::check_extent(x, n, "fp8_dequantize", "x");
  detail::check_extent(q, n, "fp8_dequantize", "q");
  detail::check_extent(scale_inv, scale_entries(scaling, rows), "fp8_dequantize", "scale_inv");
  const bool rowwise = scaling == Fp8Scaling::rowwise;
  const Index C = cols;
  Kokkos::parallel_for(
      "meshtrain::fp8_dequantize", Range(exec, 0, Index(n)), KOKKOS_LAMBDA(Index i) {
        x(i) = static_cast<T>(fp8_decode(q(i), format) * scale_inv(rowwise ? i / C : 0));
      });
}

Fp8Tensor make_fp8_tensor(const std::string& label, int rows, int cols, Fp8Format format,
                          Fp8Scaling scaling, bool transposed) {
  check_shape("make_fp8_tensor", rows, cols);
  MESHTRAIN_CHECK(!(transposed && scaling == Fp8Scaling::rowwise), "make_fp8_tensor(", label,
                  "): a transposed FP8 tensor takes tensorwise scaling");
  Fp8Tensor t;
  t.format = format;
  t.scaling = scaling;
  t.rows = rows;
  t.cols = cols;
  t.transposed = transposed;
  const std::size_t s = t.scale_count();
  t.data = alloc<std::uint8_t>(label + "_fp8", std::size_t(rows) * std::size_t(cols));
  t.amax = zeros<float>(label + "_amax", s);
  t.scale = zeros<float>(label + "_scale", s);
  t.scale_inv = zeros<float>(label + "_scale_inv", s);
  return t;
}

template <class T>
void fp8_scale_cast_block(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                          const T* x, int rows, int cols, int ld, View1<const float> amax,
                          View1<float> scale, View1<float> scale_inv, Fp8Format format) {
  check_shape("fp8_scale_cast_block", rows, cols);
  MESHTRAIN_CHECK(ld >= cols, "fp8_scale_cast_block: ld=", ld, " < cols=", cols);
  const std::size_t n = std::size_t(rows) * std::size_t(cols);
  if (detail::present(q)) detail::check_extent(q, n, "fp8_scale_cast_block", "q");
  if (detail::present(qt)) detail::check_extent(qt, n, "fp8_scale_cast_block", "qt");
  detail::check_extent(amax, 1, "fp8_scale_cast_block", "amax");
  detail::check_extent(scale, 1, "fp8_scale_cast_block", "scale");
  detail::check_extent(scale_inv, 1, "fp8_scale_cast_block", "scale_inv");
#if defined(KOKKOS_ENABLE_CUDA)
  if (n > 0 &&
      detail::fp8_cast_block_cuda<T>(
          exec, q, qt, x, rows, cols, ld,
          detail::CastScale{nullptr, amax.data(), scale.data(), scale_inv.data()}, format))
    return;
#endif
  fp8_scales(exec, amax, scale, scale_inv, 1, format);
  fp8_cast_block<T>(exec, q, qt, x, rows, cols, ld, scale, format);
}

template <class T>
void fp8_quantize(const ExecSpace& exec, Fp8Tensor& q, View1<const T> x, const AmaxHook& agree) {
  const std::size_t count = q.scale_count();
  if (q.scaling == Fp8Scaling::rowwise)
    fp8_amax_rows<T>(exec, q.amax, x, q.rows, q.cols);
  else
    fp8_amax<T>(exec, q.amax, x, std::size_t(q.rows) * std::size_t(q.cols));
  if (agree) agree(q.amax, count);
  fp8_scales(exec, q.amax, q.scale, q.scale_inv, count, q.format);
  fp8_cast<T>(exec, q.data, x, q.rows, q.cols, q.scale, q.scaling, q.format, q.transposed);
}

#define MESHTRAIN_INSTANTIATE_FP8_CAST(T)                                                      \
  template void fp8_amax<T>(const ExecSpace&, View1<float>, View1<const T>, std::size_t,     \
                            bool);                                                          \
  template void fp8_amax_rows<T>(const ExecSpace&, View1<float>, View1<const T>, int, int);  \
  template void fp8_cast<T>(const ExecSpace&, View1<std::uint8_t>, View1<const T>, int, int, \
                            View1<const float>, Fp8Scaling, Fp8Format, bool);               \
  template void fp8_amax_block<T>(const ExecSpace&, View1<float>, const T*, int, int, int);   \
  template void fp8_cast_block<T>(const ExecSpace&, View1<std::uint8_t>, View1<std::uint8_t>, \
                                  const T*, int, int, int, View1<const float>, Fp8Format);   \
  template void fp8_scale_cast_block<T>(const ExecSpace&, View1<std::uint8_t>,               \
                                        View1<std::uint8_t>, const T*, int, int, int,        \
                                        View1<const float>, View1<float>, View1<float>,      \
                                        Fp8Format);                                          \
  template void fp8_dequantize<T>(const ExecSpace&, View1<T>, View1<const std::uint8_t>,     \
                                  int, int, View1<const float>, Fp8Scaling, Fp8Format);     \
  template void fp8_quantize<T>(const ExecSpace&, Fp8Tensor&, View1<const T>,                \
                                const AmaxHook&);
MESHTRAIN_INSTANTIATE_FP8_CAST(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_FP8_CAST(bf16)
MESHTRAIN_INSTANTIATE_FP8_CAST(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_FP8_CAST

}  // namespace meshtrain::kernels
