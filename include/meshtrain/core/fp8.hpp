#pragma once
// The two FP8 formats of Hopper's tensor cores (OCP "OFP8", as CUDA's __nv_fp8_e4m3 /
// __nv_fp8_e5m2 and torch.float8_e4m3fn / float8_e5m2), stored as one byte each:
//
//   E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No infinities; S.1111.111 (0x7f,
//                0xff) is NaN, so the largest finite value is S.1111.110 = 448. Smallest
//                subnormal 2^-9, smallest normal 2^-6. For weights and activations.
//   E5M2:        1 sign, 5 exponent (bias 15), 2 mantissa bits. IEEE-like: S.11111.00 is inf,
//                S.11111.{01,10,11} NaN; largest finite 57344 (0x7b). Smallest subnormal 2^-16,
//                smallest normal 2^-14. For gradients (range over precision).
//
// fp8_encode rounds to nearest, ties to even, from fp32. Scaled casts saturate (the default):
// a value beyond the largest finite one, infinities included, becomes ±max, as the scaled casts
// of TransformerEngine and of torch float8 recipes (clamp, then convert) do and as cuBLASLt's
// __NV_SATFINITE conversions do. Without saturation an overflow gives E4M3's NaN or E5M2's inf
// (what a plain `.to(float8_*)` gives). NaN always encodes as 0x7f (both formats' canonical
// NaN). Header-only, usable on the host and inside Kokkos kernels.
#include <cstdint>
#include <cstring>

#include "meshtrain/core/kokkos_compat.hpp"

#if defined(__CUDACC__)
#include <cuda_fp8.h>  // __nv_cvt_float_to_fp8 (fp8_encode on sm_89 and later)
#endif

namespace meshtrain {

enum class Fp8Format : std::uint8_t { e4m3, e5m2 };

inline const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

namespace fp8_detail {

KOKKOS_INLINE_FUNCTION std::uint32_t float_bits(float x) {
  std::uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
}
KOKKOS_INLINE_FUNCTION float bits_float(std::uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

// Round-to-nearest-even right shift of a 32-bit magnitude by s >= 1 bits.
KOKKOS_INLINE_FUNCTION std::uint32_t shift_rne(std::uint32_t m, int s) {
  if (s >= 32) return 0;  // m < 2^24 <= half of 2^s: rounds to zero
  const std::uint32_t q = m >> s, rem = m & ((std::uint32_t(1) << s) - 1),
                      half = std::uint32_t(1) << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
}

// Format parameters: mantissa bits, exponent bias, largest finite code (magnitude).
template <Fp8Format F> struct Fmt;
template <> struct Fmt<Fp8Format::e4m3> {
  static constexpr int M = 3, bias = 7;
  static constexpr std::uint32_t max_code = 0x7e;
};
template <> struct Fmt<Fp8Format::e5m2> {
  static constexpr int M = 2, bias = 15;
  static constexpr std::uint32_t max_code = 0x7b;
};

template <Fp8Format F>
KOKKOS_INLINE_FUNCTION std::uint8_t encode(float x, bool saturate) {
  using P = Fmt<F>;
  const std::uint32_t u = float_bits(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  std::uint32_t code;
  if (a == 0x7f800000u) {
    code = P::max_code + 1;  // infinity overflows
  } else {
    const int e = int(a >> 23) - 127;  // unbiased exponent of a normal float
    const std::uint32_t m24 = (a & 0x7fffffu) | 0x800000u;
    constexpr int emin = 1 - P::bias;  // exponent of the smallest normal FP8 value
    if (a < 0x00800000u) {
      code = 0;  // fp32 zero or subnormal: far below half of FP8's smallest subnormal
    } else if (e >= emin) {
      // Exponent and the top M mantissa bits side by side; a rounding carry out of the
      // mantissa steps the exponent, which is what RNE wants.
      const std::uint32_t head =
          (std::uint32_t(e + P::bias) << P::M) | ((a & 0x7fffffu) >> (23 - P::M));
      const std::uint32_t rem = a & ((1u << (23 - P::M)) - 1), half = 1u << (22 - P::M);
      code = head + ((rem > half || (rem == half && (head & 1))) ? 1 : 0);
    } else {
      // Subnormal in FP8: multiples of 2^(emin - M); m24 * 2^(e - 23) in those units. A carry
      // into 1 << M gives the smallest normal, again the right code.
      code = shift_rne(m24, 23 - P::M + emin - e);
    }
  }
  if (code > P::max_code) {
    if (saturate) code = P::max_code;
    else if (F == Fp8Format::e4m3) return std::uint8_t(sign | 0x7f);  // no inf in E4M3fn
    else code = 0x7c;                                                 // E5M2 inf
  }
  return std::uint8_t(sign | code);
}

template <Fp8Format F>
KOKKOS_INLINE_FUNCTION float decode(std::uint8_t c) {
  using P = Fmt<F>;
  const std::uint32_t mag = c & 0x7fu, sign = std::uint32_t(c & 0x80u) << 24;
  const std::uint32_t e = mag >> P::M, m = mag & ((1u << P::M) - 1);
  if (F == Fp8Format::e4m3 && mag == 0x7f) return bits_float(0x7fc00000u);
  if (F == Fp8Format::e5m2 && e == 31) return bits_float(sign | (m ? 0x7fc00000u : 0x7f800000u));
  if (e == 0) {  // zero or subnormal: m * 2^(1 - bias - M), exact in fp32
    const float v = float(m) * bits_float(std::uint32_t(127 + 1 - P::bias - P::M) << 23);
    return sign ? -v : v;
  }
  return bits_float(sign | ((e - P::bias + 127) << 23) | (m << (23 - P::M)));
}

}  // namespace fp8_detail

KOKKOS_INLINE_FUNCTION std::uint8_t fp8_encode(float x, Fp8Format f, bool saturate = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  // The casts' hot loop: the conversion instruction of Ada and Hopper instead of ~30 integer
  // operations and branches per element (on the H100 the software encode made the FP8 casts
  // several times slower than their memory traffic). Its codes are encode<F>(x, true)'s for
  // every finite and infinite x (round to nearest even, saturating to +-max); NaN (whose sign
  // it keeps) and fp32 subnormals (which it may flush to +0) take the software's codes here, so
  // device and host casts agree bit for bit.
  if (saturate) {
    const std::uint32_t u = fp8_detail::float_bits(x), a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7f;
    if (a < 0x00800000u) return std::uint8_t((u >> 24) & 0x80u);
    return __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
                                 f == Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  }
#endif
  return f == Fp8Format::e4m3 ? fp8_detail::encode<Fp8Format::e4m3>(x, saturate)
                              : fp8_detail::encode<Fp8Format::e5m2>(x, saturate);
}

KOKKOS_INLINE_FUNCTION float fp8_decode(std::uint8_t c, Fp8Format f) {
  return f == Fp8Format::e4m3 ? fp8_detail::decode<Fp8Format::e4m3>(c)
                              : fp8_detail::decode<Fp8Format::e5m2>(c);
}

// The largest finite value: 448 (E4M3) or 57344 (E5M2).
KOKKOS_INLINE_FUNCTION constexpr float fp8_max(Fp8Format f) {
  return f == Fp8Format::e4m3 ? 448.0f : 57344.0f;
}

}  // namespace meshtrain
