#pragma once
// Private to src/kernels/: eight 16-bit elements per 16-byte load and store for the element-wise
// kernels on a GPU (GELU, SwiGLU). Their scalar form reached ~0.8 TB/s on an H200 for the MoE
// experts' activations (12 x 16384 x 3072 elements a step, perf/archive/journal.md), passes that
// are all memory traffic; 16-byte accesses are what a GPU needs to approach its bandwidth.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "meshtrain/core/kokkos_compat.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail {

template <class T>
struct alignas(16) Pack8 {
  T v[8];
};

// Whether the packed form applies: a device build, 16-bit T, at least one pack, and every
// pointer on a 16-byte boundary (views into the middle of a buffer may not be).
template <class T>
bool packable(std::size_t n, std::initializer_list<const void*> ptrs) {
  if constexpr (kDeviceIsHost || sizeof(T) != 2) {
    return false;
  } else {
    if (n < 8) return false;
    for (const void* p : ptrs)
      if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return true;
  }
}

}  // namespace meshtrain::kernels::detail
