#pragma once
// Checks of the FP8 amax that kernels fuse into the pass that writes their output (issue 35,
// src/kernels/amax_fused.hpp): the amax a kernel sets must be the bits fp8_amax gives on the
// output it stored, and the bits of the definition computed here on the host (the two share
// their device helper, so the host loop is the independent oracle); the output must not change
// with the amax. A kernel may set several amaxes, one per column block of its output that is
// cast under its own scale (require_fused_block_amaxes).
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"

namespace kt {

inline constexpr std::uint32_t kInfBits = 0x7f800000u;  // |v| bits of +-inf; NaNs lie above
// What amax holds before a call: the largest NaN pattern, the top of the bits' order, which no
// kernel here produces. A kernel that folded into the old value instead of setting it would
// return it whatever its output.
inline constexpr std::uint32_t kStaleAmaxBits = 0x7fffffffu;

inline std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline std::uint32_t amax_bits_of(const View1<float>& amax) { return bits_of(to_host(amax)[0]); }

// The definition: max over v of the bits of float(v) with the sign cleared.
template <class T>
std::uint32_t host_amax_bits(const std::vector<T>& v, std::size_t n) {
  std::uint32_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t b = bits_of(static_cast<float>(v[i])) & 0x7fffffffu;
    if (b > m) m = b;
  }
  return m;
}

// What fp8_amax (the unfused pass) gives on the first n elements of out (no double: there are no
// double FP8 casts).
template <class T>
std::uint32_t fp8_amax_bits(const View1<T>& out, std::size_t n) {
  View1<float> a("fp8_amax", 1);
  meshtrain::kernels::fp8_amax<T>(ExecSpace(), a, View1<const T>(out), n);
  return amax_bits_of(a);
}

// run(out, amax) runs a kernel into out, with amax empty (unfused) or not. Runs it into `plain`
// without and into `fused` with an amax holding kStaleAmaxBits; requires the two outputs equal
// bit for bit (the caller gives both the same extent and, beyond the n elements the kernel
// writes, the same contents) and the fused amax equal to fp8_amax's (but for double) and to the
// host definition's over the first n elements. Returns the amax's bits for checks of its value.
// double is there for host builds: their float GELU and SwiGLU are plain host loops, and the
// double instantiations run the Kokkos kernels that GPU builds run for float and bf16.
template <class T, class Run>
std::uint32_t require_fused_amax(const View1<T>& plain, const View1<T>& fused, std::size_t n,
                                 const Run& run) {
  run(plain, View1<float>());
  float stale;
  std::memcpy(&stale, &kStaleAmaxBits, sizeof stale);
  View1<float> amax = to_device(std::vector<float>{stale}, "amax");
  run(fused, amax);
  const auto hp = to_host(plain), hf = to_host(fused);
  REQUIRE(bitwise_equal(hp, hf));
  const std::uint32_t got = amax_bits_of(amax), want = host_amax_bits(hf, n);
  INFO("fused amax bits 0x" << std::hex << got << ", the host definition's 0x" << want);
  if constexpr (!std::is_same_v<T, double>) REQUIRE(got == fp8_amax_bits(fused, n));
  REQUIRE(got == want);
  return got;
}

// What fp8_amax_block (the unfused pass) gives on the column block [rows, cols] at column c0 of
// out, whose rows are ld apart.
template <class T>
std::uint32_t fp8_amax_block_bits(const View1<T>& out, int c0, int rows, int cols, int ld) {
  View1<float> a("fp8_amax_block", 1);
  const T* x = rows == 0 ? out.data() : out.data() + c0;
  meshtrain::kernels::fp8_amax_block<T>(ExecSpace(), a, x, rows, cols, ld);
  return amax_bits_of(a);
}

// require_fused_amax for a kernel whose output, row-major [rows, parts * cols], is cast as
// `parts` column blocks [rows, cols] under scales of their own, and which sets one amax per
// block (swiglu_backward: gate and up). amax holds kStaleAmaxBits in every entry before the
// fused run; entry k must equal fp8_amax_block's bits on block k (but for double) and the host
// definition's over that block. Returns the entries' bits.
template <class T, class Run>
std::vector<std::uint32_t> require_fused_block_amaxes(const View1<T>& plain, const View1<T>& fused,
                                                      int rows, int cols, int parts,
                                                      const Run& run) {
  run(plain, View1<float>());
  float stale;
  std::memcpy(&stale, &kStaleAmaxBits, sizeof stale);
  View1<float> amax = to_device(std::vector<float>(std::size_t(parts), stale), "amax");
  run(fused, amax);
  const auto hp = to_host(plain), hf = to_host(fused);
  REQUIRE(bitwise_equal(hp, hf));
  const auto entries = to_host(amax);
  const int ld = parts * cols;
  std::vector<std::uint32_t> got(std::size_t(parts), 0);
  for (int k = 0; k < parts; ++k) {
    std::vector<T> block;
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) block.push_back(hf[std::size_t(r) * ld + k * cols + c]);
    got[k] = bits_of(entries[k]);
    const std::uint32_t want = host_amax_bits(block, block.size());
    INFO("block " << k << ": fused amax bits 0x" << std::hex << got[k]
                  << ", the host definition's 0x" << want);
    if constexpr (!std::is_same_v<T, double>)
      REQUIRE(got[k] == fp8_amax_block_bits(fused, k * cols, rows, cols, ld));
    REQUIRE(got[k] == want);
  }
  return got;
}

}  // namespace kt
