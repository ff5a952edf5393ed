#pragma once
// A branch-free float exp that compilers vectorise (SSE2 and up, no -march, no libmvec), for
// the host paths of the exp-bound kernels (GELU, cross-entropy). glibc's expf is a scalar call
// that blocks vectorisation; this one is a plain expression.
//
// Cody-Waite range reduction x = n ln2 + r with |r| <= ln2/2, a degree-6 polynomial for e^r
// (Cephes expf's coefficients: relative error below 2e-7 on the reduced range) and 2^n built in
// the exponent bits. Inputs are clamped to [-87.3, 88.7]: the result then stays a normal float
// (exp(-87.3) ~ 1.2e-38), so exp(-large) is tiny rather than 0, which no caller distinguishes.
#include <cstdint>
#include <cstring>

namespace meshtrain::kernels::detail {

inline float host_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  const float z = x * 1.44269504088896341f;
  // Round to nearest through truncation (cvttps2dq is SSE2); floorf would need SSE4.1.
  const std::int32_t n = static_cast<std::int32_t>(z + (z >= 0.0f ? 0.5f : -0.5f));
  const float fn = static_cast<float>(n);
  float r = x - fn * 0.693359375f;
  r = r + fn * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t bits = (n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace meshtrain::kernels::detail
