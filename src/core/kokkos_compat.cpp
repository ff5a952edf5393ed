#include "meshtrain/core/kokkos_compat.hpp"

#include <sstream>

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace meshtrain::kc {

void initialize(int device_id, int num_threads) {
#if MESHTRAIN_KOKKOS4
  Kokkos::InitializationSettings s;
  if (device_id >= 0) s.set_device_id(device_id);
  if (num_threads > 0) s.set_num_threads(num_threads);
  Kokkos::initialize(s);
#else
  Kokkos::InitArguments a;
  a.device_id = device_id;
  a.num_threads = num_threads;
  Kokkos::initialize(a);
#endif
}

int device_count() {
#if defined(KOKKOS_ENABLE_CUDA)
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string configuration_summary() {
  std::ostringstream os;
  os << "Kokkos " << KOKKOS_VERSION / 10000 << "." << (KOKKOS_VERSION / 100) % 100 << "."
     << KOKKOS_VERSION % 100 << ", execution space " << ExecSpace::name()
     << ", host space " << HostExecSpace::name();
  return os.str();
}

}  // namespace meshtrain::kc
