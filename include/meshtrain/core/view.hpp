#pragma once
// Tensor storage: flat Kokkos Views in the default execution space's memory (DESIGN invariant 5).
// Kernels take flat Views plus explicit dimensions (row-major, llm.c style), so a parameter can
// be an unmanaged slice of its stage's flat buffer without layout templates.
#include <cstdint>

#include "meshtrain/core/kokkos_compat.hpp"

namespace meshtrain {

template <class T>
using View1 = Kokkos::View<T*, MemSpace>;
template <class T>
using HostView1 = Kokkos::View<T*, Kokkos::HostSpace>;
// Host memory the device copies into at full speed (page-locked on CUDA builds: cudaMallocHost
// through Kokkos; plain host memory elsewhere). Host-accessible: an unmanaged HostView1 over its
// data() is how host code and deep_copy see it.
#if defined(KOKKOS_ENABLE_CUDA)
using PinnedHostSpace = Kokkos::CudaHostPinnedSpace;
#else
using PinnedHostSpace = Kokkos::HostSpace;
#endif
template <class T>
using PinnedView1 = Kokkos::View<T*, PinnedHostSpace>;
// A device scalar (rank-0 View): keeps values like the gradient norm on the device, so a step
// needs no host synchronisation.
template <class T>
using Scalar = Kokkos::View<T, MemSpace>;

// Allocate an uninitialised labelled View; labels read "meshtrain::<what>" in Kokkos Tools.
template <class T>
View1<T> alloc(const std::string& label, std::size_t n) {
  return View1<T>(Kokkos::view_alloc("meshtrain::" + label, Kokkos::WithoutInitializing), n);
}
// Zero-initialised.
template <class T>
View1<T> zeros(const std::string& label, std::size_t n) {
  return View1<T>("meshtrain::" + label, n);
}

// Contiguous slice [offset, offset + n) of a flat View.
template <class V>
auto slice(const V& v, std::size_t offset, std::size_t n) {
  return Kokkos::subview(v, Kokkos::make_pair(offset, offset + n));
}

}  // namespace meshtrain
