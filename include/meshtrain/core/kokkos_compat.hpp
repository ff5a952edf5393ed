#pragma once
// The one place where Kokkos 3.4 (Debian 12's Trilinos package) and Kokkos 4.x differ for us.
// Everything else includes this header instead of Kokkos_Core.hpp.
#include <Kokkos_Core.hpp>

#include <cmath>
#include <string>

#if KOKKOS_VERSION >= 40000
#define MESHTRAIN_KOKKOS4 1
#else
#define MESHTRAIN_KOKKOS4 0
#endif

namespace meshtrain {

using ExecSpace = Kokkos::DefaultExecutionSpace;
using MemSpace = ExecSpace::memory_space;
using HostExecSpace = Kokkos::DefaultHostExecutionSpace;
using HostSpace = Kokkos::HostSpace;

// bf16 storage type for mixed precision: Kokkos 4 only (Debian's 3.4 has none; the CPU build
// trains in fp32). Same bits as CUDA's __nv_bfloat16. A Kokkos 4 without a GPU backend (Spack's
// kokkos +serial) makes half_t and bhalf_t plain float (KOKKOS_*HALF_T_IS_FLOAT true): no
// 16-bit types there, as with 3.4, or dtype_of<bf16> would redefine dtype_of<float>.
#if MESHTRAIN_KOKKOS4 && !KOKKOS_HALF_T_IS_FLOAT && !KOKKOS_BHALF_T_IS_FLOAT
#define MESHTRAIN_HAVE_BF16 1
using bf16 = Kokkos::Experimental::bhalf_t;
#else
#define MESHTRAIN_HAVE_BF16 0
#endif
// fp16 storage type (IEEE half) for mixed precision with dynamic loss scaling; Kokkos 4 only.
#define MESHTRAIN_HAVE_FP16 MESHTRAIN_HAVE_BF16
#if MESHTRAIN_HAVE_FP16
using fp16 = Kokkos::Experimental::half_t;
#endif

// True when the default execution space runs on a GPU (host and device memory differ).
inline constexpr bool kDeviceIsHost =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, MemSpace>::accessible;

namespace kc {

// Math functions: Kokkos 4 has Kokkos::exp etc.; 3.4 had them under Kokkos::Experimental.
#if MESHTRAIN_KOKKOS4
using Kokkos::exp;
using Kokkos::expm1;
using Kokkos::fabs;
using Kokkos::fmax;
using Kokkos::fmin;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::log1p;
using Kokkos::pow;
using Kokkos::sqrt;
using Kokkos::tanh;
using Kokkos::cosh;
using Kokkos::cos;
using Kokkos::sin;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::expm1;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::fmax;
using Kokkos::Experimental::fmin;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::log1p;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
using Kokkos::Experimental::cosh;
using Kokkos::Experimental::cos;
using Kokkos::Experimental::sin;
#endif

// Initialise Kokkos on a chosen device (-1: let Kokkos choose). Kokkos 4 replaced
// InitArguments by InitializationSettings.
void initialize(int device_id, int num_threads = -1);

// Fence one execution-space instance with a label (3.4's fence takes no label).
template <class Exec>
inline void fence(const Exec& exec, const std::string& label) {
#if MESHTRAIN_KOKKOS4
  exec.fence(label);
#else
  (void)label;
  exec.fence();
#endif
}

// Number of GPUs visible to this process (0 in host-only builds).
int device_count();

std::string configuration_summary();

}  // namespace kc
}  // namespace meshtrain
