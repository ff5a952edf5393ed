#include "common.hpp"

#include <array>

namespace meshtrain::kernels::detail {

Scalar<float> persistent_scalar(int slot) {
  // All kernels of a run go to one execution-space instance, whose queue orders every use of a
  // slot after the previous one.
  static std::array<Scalar<float>, 4> slots;
  static bool hooked = false;
  MESHTRAIN_CHECK(slot >= 0 && slot < static_cast<int>(slots.size()), "scratch slot ", slot);
  if (!hooked) {
    Kokkos::push_finalize_hook([] {
      for (auto& s : slots) s = Scalar<float>();
      hooked = false;
    });
    hooked = true;
  }
  if (!slots[slot].data()) slots[slot] = Scalar<float>("meshtrain::scratch_scalar");
  return slots[slot];
}

Kokkos::View<double, MemSpace> persistent_double() {
  static Kokkos::View<double, MemSpace> d;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] {
      d = Kokkos::View<double, MemSpace>();
      hooked = false;
    });
    hooked = true;
  }
  if (!d.data()) d = Kokkos::View<double, MemSpace>("meshtrain::scratch_double");
  return d;
}

View1<float> persistent_buffer(int slot, std::size_t n) {
  static std::array<View1<float>, 4> slots;
  static bool hooked = false;
  MESHTRAIN_CHECK(slot >= 0 && slot < static_cast<int>(slots.size()), "scratch slot ", slot);
  if (!hooked) {
    Kokkos::push_finalize_hook([] {
      for (auto& s : slots) s = View1<float>();
      hooked = false;
    });
    hooked = true;
  }
  if (slots[slot].extent(0) < n) slots[slot] = View1<float>("meshtrain::scratch_buffer", n);
  return slots[slot];
}

}  // namespace meshtrain::kernels::detail
