// FP8 amax agreement over a parallel group (model/fp8_amax.hpp).
#include "meshtrain/model/fp8_amax.hpp"

#include <cstdint>

#include "meshtrain/core/error.hpp"

namespace meshtrain::model {

void agree_amax(comm::Communicator& group, const ExecSpace& exec, View1<float> amax,
                std::size_t count) {
  MESHTRAIN_CHECK(amax.extent(0) >= count, "agree_amax: amax has ", amax.extent(0),
                  " entries, needs ", count);
  if (group.size() == 1 || count == 0) return;
  static_assert(sizeof(float) == sizeof(std::int32_t));
  using Bits = Kokkos::View<std::int32_t*, MemSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const Bits bits(reinterpret_cast<std::int32_t*>(amax.data()), count);
  if (group.needs_host_memory() && !kDeviceIsHost) {
    HostView1<std::int32_t> h("meshtrain::fp8_amax_host", count);
    Kokkos::deep_copy(exec, h, bits);
    exec.fence();
    group.all_reduce(h, comm::ReduceOp::max);
    Kokkos::deep_copy(exec, bits, h);
    exec.fence();
    return;
  }
  group.all_reduce(bits, comm::ReduceOp::max);
}

}  // namespace meshtrain::model
