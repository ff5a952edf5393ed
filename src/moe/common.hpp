#pragma once
// Private to src/moe/: policies and small helpers shared by the MoE building blocks.
#include <cstdint>
#include <string>

#include "meshtrain/comm/communicator.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/view.hpp"

namespace meshtrain::moe::detail {

using Index = std::int64_t;
using Range = Kokkos::RangePolicy<ExecSpace, Kokkos::IndexType<Index>>;
using Team = Kokkos::TeamPolicy<ExecSpace>;
using Member = Team::member_type;

template <class V>
void check_extent(const V& v, std::size_t need, const char* fn, const char* name) {
  MESHTRAIN_CHECK(v.extent(0) == need, fn, ": ", name, " has ", v.extent(0),
                  " elements, expected ", need);
}

// Scratch of a fixed size: reallocates `v` (labelled) when its size is not `n`; its contents are
// then undefined.
template <class T>
void ensure(View1<T>& v, const std::string& label, std::size_t n) {
  if (v.extent(0) != n) v = alloc<T>(label, n);
}

// All-reduce (sum) of a few doubles that live on the host, in whatever memory the backend of
// `group` takes; returns after the result is back in `h`.
void all_reduce_host_doubles(const ExecSpace& exec, comm::Communicator& group,
                             HostView1<double> h);

}  // namespace meshtrain::moe::detail
