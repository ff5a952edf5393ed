#pragma once
// Private to src/io/: IEEE binary16 and bfloat16 <-> binary32 bit conversions on the host, for
// safetensors files (which store either).
#include <bit>
#include <cstdint>

namespace meshtrain::io::detail {

// IEEE 754 binary16 -> binary32, exact (every half is a float).
inline float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000) << 16;
  std::uint32_t exp = (h >> 10) & 0x1F;
  std::uint32_t mant = h & 0x3FF;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: normalise, it is a normal float
    exp = 127 - 15 + 1;
    while (!(mant & 0x400)) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
  }
  return std::bit_cast<float>(bits);
}

// bfloat16 is the top half of a float32: widening is exact.
inline float bf16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// float32 -> bfloat16, round to nearest even (as the GPU's __float2bfloat16_rn and Kokkos'
// bhalf_t); NaN stays a (quiet) NaN.
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

}  // namespace meshtrain::io::detail
