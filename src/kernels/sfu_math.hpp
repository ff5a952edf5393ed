#pragma once
// Private to src/kernels/: 2^x and 1/x on the GPU's special-function unit (ex2.approx,
// rcp.approx: ~2 ulp of fp32, results below 2^-126 flushed to 0), for kernels whose results are
// rounded far coarser than that (16-bit outputs, probabilities) and whose exact expf / IEEE
// division would make them bound by instructions instead of memory. On the host (and in a host
// pass of a Kokkos lambda) the exact functions.
#include <cmath>

#include <Kokkos_Macros.hpp>

namespace meshtrain::kernels::detail {

KOKKOS_INLINE_FUNCTION float exp2_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

KOKKOS_INLINE_FUNCTION float rcp_sfu(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.0f / x;
#endif
}

}  // namespace meshtrain::kernels::detail
