#pragma once
// Counter-based random numbers (DESIGN invariant 2): every value is a pure function of
// (seed, stream, counter), so any rank generates exactly its own slice of a tensor and no layout
// changes a single value. The bits are splitmix64 (core/splitmix64.hpp) applied to a combination
// of the three keys; normals come from Box-Muller on two uniforms drawn at counters 2i and 2i+1.
#include <cstdint>
#include <string_view>

#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/splitmix64.hpp"

namespace meshtrain::rng {

KOKKOS_INLINE_FUNCTION std::uint64_t bits(std::uint64_t seed, std::uint64_t stream,
                                          std::uint64_t counter) {
  return splitmix64(splitmix64(seed ^ splitmix64(stream)) + counter);
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller is finite.
KOKKOS_INLINE_FUNCTION double uniform(std::uint64_t seed, std::uint64_t stream,
                                      std::uint64_t counter) {
  return (static_cast<double>(bits(seed, stream, counter) >> 11) + 1.0) * 0x1.0p-53;
}

// Standard normal for element `index` of stream `stream`.
KOKKOS_INLINE_FUNCTION double normal(std::uint64_t seed, std::uint64_t stream,
                                     std::uint64_t index) {
  const double u1 = uniform(seed, stream, 2 * index);
  const double u2 = uniform(seed, stream, 2 * index + 1);
  constexpr double two_pi = 6.283185307179586476925286766559;
  return kc::sqrt(-2.0 * kc::log(u1)) * kc::cos(two_pi * u2);
}

// Stream id of a named tensor (FNV-1a 64 of the name): the same on every rank and layout.
constexpr std::uint64_t name_stream(std::string_view name) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace meshtrain::rng
