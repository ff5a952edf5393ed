// GELU, tanh approximation (GPT-2 "gelu_new"), element-wise.
//   u = sqrt(2/pi) (x + 0.044715 x^3),  gelu = 0.5 x (1 + tanh u)
//   gelu' = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// Both are evaluated through 0.5 (1 + tanh u) = sigmoid(2u) = 1 / (1 + exp(-2u)), the same
// function: one exp is several times cheaper than tanh in libm (glibc's tanhf is not
// vectorised and costs ~5x expf), and GELU was a fifth of a cpu-bench training step.
//   gelu = x sig,  gelu' = sig + 2 x sig (1 - sig) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// (1 - tanh^2 u = 4 sig (1 - sig); no cosh, which overflows for |u| > ~89.) exp(-2u) may
// overflow to inf for very negative x: sig is then 0, as it should be.
#include "meshtrain/kernels/gelu.hpp"

#include <type_traits>

#include "amax_fused.hpp"
#include "common.hpp"
#include "gelu_math.hpp"
#include "pack8.hpp"

namespace meshtrain::kernels {

namespace {
// The host fp32 loops, folding each stored value into `fold` (amax_fused.hpp's
// host_loop_amax, which says why they always fold). Templates: a GPU build compiles no call.
template <class Fold>
void gelu_forward_host(float* __restrict o, const float* __restrict x, std::size_t n,
                       Fold& fold) {
  for (std::size_t i = 0; i < n; ++i) {
    o[i] = detail::gelu_value_host(x[i]);
    fold(o[i]);
  }
}
template <class Fold>
void gelu_backward_host(float* __restrict di, const float* __restrict x,
                        const float* __restrict d, std::size_t n, Fold& fold) {
  for (std::size_t i = 0; i < n; ++i) {
    di[i] = detail::gelu_grad_host(x[i]) * d[i];
    fold(di[i]);
  }
}
}  // namespace

template <class T>
void gelu_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp, std::size_t n,
                  View1<float> amax) {
  using detail::abs_bits;
  using detail::acc;
  using detail::max_bits;
  detail::check_extent(out, n, "gelu_forward", "out");
  detail::check_extent(inp, n, "gelu_forward", "inp");
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    // Host fp32: a plain loop with the vectorisable exp (glibc's expf call is what blocks
    // vectorisation); the same formula as the kernel below.
    kc::fence(exec, "meshtrain::gelu_forward: host loop");
    // Not a Kokkos kernel: a region keeps it visible to Kokkos Tools (perf/bench/bench_train_step).
    Kokkos::Profiling::pushRegion("meshtrain::gelu_forward");
    detail::host_loop_amax(
        amax, [&](auto& fold) { gelu_forward_host(out.data(), inp.data(), n, fold); });
    Kokkos::Profiling::popRegion();
    return;
  }
  // 16-bit on a GPU: eight elements per access (pack8.hpp), the n % 8 tail one by one.
  if (detail::packable<T>(n, {out.data(), inp.data()})) {
    const std::size_t packs = n / 8;
    detail::Pack8<T>* o = reinterpret_cast<detail::Pack8<T>*>(out.data());
    const detail::Pack8<T>* x = reinterpret_cast<const detail::Pack8<T>*>(inp.data());
    T* o1 = out.data();
    const T* x1 = inp.data();
    detail::for_each_amax(
        "meshtrain::gelu_forward", exec, detail::Index(packs + n % 8), amax,
        KOKKOS_LAMBDA(detail::Index i, std::uint32_t& m) {
          if (std::size_t(i) < packs) {
            const detail::Pack8<T> a = x[i];
            detail::Pack8<T> r;
            for (int j = 0; j < 8; ++j) {
              r.v[j] = static_cast<T>(detail::gelu_value(acc(a.v[j])));
              m = max_bits(m, abs_bits(r.v[j]));
            }
            o[i] = r;
          } else {
            const std::size_t k = packs * 8 + (std::size_t(i) - packs);
            const T v = static_cast<T>(detail::gelu_value(acc(x1[k])));
            o1[k] = v;
            m = max_bits(m, abs_bits(v));
          }
        });
    return;
  }
  detail::for_each_amax(
      "meshtrain::gelu_forward", exec, detail::Index(n), amax,
      KOKKOS_LAMBDA(detail::Index i, std::uint32_t& m) {
        const T v = static_cast<T>(detail::gelu_value(acc(inp(i))));
        out(i) = v;
        m = max_bits(m, abs_bits(v));
      });
}

template <class T>
void gelu_backward(const ExecSpace& exec, View1<T> dinp, View1<const T> inp, View1<const T> dout,
                   std::size_t n, View1<float> amax) {
  using detail::abs_bits;
  using detail::acc;
  using detail::max_bits;
  detail::check_extent(dinp, n, "gelu_backward", "dinp");
  detail::check_extent(inp, n, "gelu_backward", "inp");
  detail::check_extent(dout, n, "gelu_backward", "dout");
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    kc::fence(exec, "meshtrain::gelu_backward: host loop");
    // Not a Kokkos kernel: a region keeps it visible to Kokkos Tools (perf/bench/bench_train_step).
    Kokkos::Profiling::pushRegion("meshtrain::gelu_backward");
    detail::host_loop_amax(amax, [&](auto& fold) {
      gelu_backward_host(dinp.data(), inp.data(), dout.data(), n, fold);
    });
    Kokkos::Profiling::popRegion();
    return;
  }
  // As in the forward.
  if (detail::packable<T>(n, {dinp.data(), inp.data(), dout.data()})) {
    const std::size_t packs = n / 8;
    detail::Pack8<T>* di = reinterpret_cast<detail::Pack8<T>*>(dinp.data());
    const detail::Pack8<T>* x = reinterpret_cast<const detail::Pack8<T>*>(inp.data());
    const detail::Pack8<T>* d = reinterpret_cast<const detail::Pack8<T>*>(dout.data());
    T* di1 = dinp.data();
    const T* x1 = inp.data();
    const T* d1 = dout.data();
    detail::for_each_amax(
        "meshtrain::gelu_backward", exec, detail::Index(packs + n % 8), amax,
        KOKKOS_LAMBDA(detail::Index i, std::uint32_t& m) {
          if (std::size_t(i) < packs) {
            const detail::Pack8<T> a = x[i], g = d[i];
            detail::Pack8<T> r;
            for (int j = 0; j < 8; ++j) {
              r.v[j] = static_cast<T>(detail::gelu_grad(acc(a.v[j])) * acc(g.v[j]));
              m = max_bits(m, abs_bits(r.v[j]));
            }
            di[i] = r;
          } else {
            const std::size_t k = packs * 8 + (std::size_t(i) - packs);
            const T v = static_cast<T>(detail::gelu_grad(acc(x1[k])) * acc(d1[k]));
            di1[k] = v;
            m = max_bits(m, abs_bits(v));
          }
        });
    return;
  }
  detail::for_each_amax(
      "meshtrain::gelu_backward", exec, detail::Index(n), amax,
      KOKKOS_LAMBDA(detail::Index i, std::uint32_t& m) {
        const T v = static_cast<T>(detail::gelu_grad(acc(inp(i))) * acc(dout(i)));
        dinp(i) = v;
        m = max_bits(m, abs_bits(v));
      });
}

#define MESHTRAIN_INSTANTIATE_GELU(T)                                                          \
  template void gelu_forward<T>(const ExecSpace&, View1<T>, View1<const T>, std::size_t,       \
                                View1<float>);                                                \
  template void gelu_backward<T>(const ExecSpace&, View1<T>, View1<const T>, View1<const T>,  \
                                 std::size_t, View1<float>);
MESHTRAIN_INSTANTIATE_GELU(float)
MESHTRAIN_INSTANTIATE_GELU(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_GELU(bf16)
MESHTRAIN_INSTANTIATE_GELU(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_GELU

}  // namespace meshtrain::kernels
