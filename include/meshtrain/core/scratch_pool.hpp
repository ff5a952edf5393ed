#pragma once
// Scratch that outlives the call that uses it: pooled<T>(key, n) is a view of exactly n elements
// of a process-wide buffer named `key`, which only grows (to the largest n asked for). A call
// that allocated and freed its scratch would cost, on a GPU, a cudaMalloc and a cudaFree, which
// synchronises the device, per call: per MoE block and micro-batch in the MoE layer, whose row
// counts change with the routing, so its scratch cannot be sized once at construction as the
// dense model's is. For scratch a function uses and drops before it returns: two live uses of
// one key would share memory. The buffers are released when Kokkos finalizes.
#include <map>
#include <string>

#include "meshtrain/core/view.hpp"

namespace meshtrain {

template <class T>
View1<T> pooled(const char* key, std::size_t n) {
  static std::map<std::string, View1<T>>* pool = [] {
    auto* p = new std::map<std::string, View1<T>>();
    Kokkos::push_finalize_hook([p] { p->clear(); });
    return p;
  }();
  View1<T>& buf = (*pool)[key];
  if (buf.extent(0) < n) {
    buf = View1<T>();  // free the smaller one first: the peak is the larger one alone
    buf = alloc<T>(key, n);
  }
  return slice(buf, 0, n);
}

}  // namespace meshtrain
