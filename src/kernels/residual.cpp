// Residual add and gradient accumulation: element-wise, out/y may alias an input because each
// thread reads and writes only its own index.
#include "meshtrain/kernels/residual.hpp"

#include "common.hpp"

namespace meshtrain::kernels {

template <class T>
void residual_forward(const ExecSpace& exec, View1<T> out, View1<const T> a, View1<const T> b,
                      std::size_t n) {
  using detail::acc;
  detail::check_extent(out, n, "residual_forward", "out");
  detail::check_extent(a, n, "residual_forward", "a");
  detail::check_extent(b, n, "residual_forward", "b");
  Kokkos::parallel_for(
      "meshtrain::residual_forward", detail::Range(exec, 0, detail::Index(n)),
      KOKKOS_LAMBDA(detail::Index i) { out(i) = static_cast<T>(acc(a(i)) + acc(b(i))); });
}

template <class T>
void accumulate(const ExecSpace& exec, View1<T> y, View1<const T> x, std::size_t n) {
  using detail::acc;
  detail::check_extent(y, n, "accumulate", "y");
  detail::check_extent(x, n, "accumulate", "x");
  Kokkos::parallel_for(
      "meshtrain::accumulate", detail::Range(exec, 0, detail::Index(n)),
      KOKKOS_LAMBDA(detail::Index i) { y(i) = static_cast<T>(acc(y(i)) + acc(x(i))); });
}

#define MESHTRAIN_INSTANTIATE_RESIDUAL(T)                                                      \
  template void residual_forward<T>(const ExecSpace&, View1<T>, View1<const T>,                \
                                    View1<const T>, std::size_t);                              \
  template void accumulate<T>(const ExecSpace&, View1<T>, View1<const T>, std::size_t);
MESHTRAIN_INSTANTIATE_RESIDUAL(float)
MESHTRAIN_INSTANTIATE_RESIDUAL(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_RESIDUAL(bf16)
MESHTRAIN_INSTANTIATE_RESIDUAL(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_RESIDUAL

}  // namespace meshtrain::kernels
