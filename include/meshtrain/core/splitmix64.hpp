#pragma once
// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014;
// Vigna's reference splitmix64.c): the state advances by the golden gamma, and each output is the
// state passed through a mixer, a bijection of 64-bit words with full avalanche. The one copy in
// the code: parameter initialisation, sampling, the data order and the checkpoint checksums are
// functions of its bits, so a change here changes saved files and training runs.
#include <cstdint>

#include <Kokkos_Macros.hpp>

namespace meshtrain {

// 2^64 / golden ratio, rounded to odd: the state increment, a Weyl sequence that visits every
// 64-bit value.
inline constexpr std::uint64_t kSplitmix64Gamma = 0x9e3779b97f4a7c15ULL;

// The mixer (Stafford's variant 13 of MurmurHash3's finaliser).
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// What splitmix64 returns from state x (which it advances to x + gamma): as a counter-based
// hash, splitmix64(i) for i = seed, seed + gamma, ... is the generator's sequence.
KOKKOS_INLINE_FUNCTION constexpr std::uint64_t splitmix64(std::uint64_t x) {
  return splitmix64_mix(x + kSplitmix64Gamma);
}

}  // namespace meshtrain
