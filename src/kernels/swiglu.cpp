// SwiGLU, element-wise over the I columns of each row of the packed [gate | up] buffer.
//   s = sigmoid(g) = 1 / (1 + exp(-g)),  silu(g) = g s,  silu'(g) = s + g s (1 - s)
// exp(-g) overflows to inf for g < ~-88: s is then 0 and so are silu and silu', as they should
// be (no inf * 0). Host fp32 runs a plain loop with the vectorisable exp of host_exp.hpp (as
// GELU's host path); everything else a flat Kokkos range, one thread per (row, column) pair,
// consecutive threads on consecutive columns of gate and of up.
#include "meshtrain/kernels/swiglu.hpp"

#include <type_traits>

#include "amax_fused.hpp"
#include "common.hpp"
#include "host_exp.hpp"
#include "pack8.hpp"
#include "sfu_math.hpp"

namespace meshtrain::kernels {

namespace {
void check_shape(const char* fn, int N, int I) {
  MESHTRAIN_CHECK(N >= 0 && I > 0, fn, ": bad shape N=", N, ", I=", I);
}

// sigmoid(g) for the packed 16-bit paths, on the GPU's special-function unit (sfu_math.hpp):
// with expf and an IEEE division the forward ran at ~3.2 TB/s, bound by its instructions rather
// than by memory. exp(-g) = inf (g < ~-88) gives 1/inf = 0, the same 0 as before.
KOKKOS_INLINE_FUNCTION float sigmoid_16bit(float g) {
  return detail::rcp_sfu(1.0f + detail::exp2_sfu(g * -1.4426950408889634f));
}

// The host fp32 loops, folding each stored value into `fold` (amax_fused.hpp's
// host_loop_amax, which says why they always fold). Templates: a GPU build compiles no call.
template <class Fold>
void forward_host(float* out, const float* gate_up, int N, int I, Fold& fold) {
  for (detail::Index n = 0; n < N; ++n) {
    const float* __restrict g = gate_up + 2 * n * I;
    const float* __restrict u = g + I;
    float* __restrict o = out + n * I;
    for (int j = 0; j < I; ++j) {
      o[j] = g[j] / (1.0f + detail::host_exp(-g[j])) * u[j];
      fold(o[j]);
    }
  }
}
template <class Fold>
void backward_host(float* dgate_up, const float* gate_up, const float* dout, int N, int I,
                   Fold& fold) {
  for (detail::Index n = 0; n < N; ++n) {
    const float* g = gate_up + 2 * n * I;  // may alias dg (in place)
    const float* u = g + I;
    const float* __restrict d = dout + n * I;
    float* dg = dgate_up + 2 * n * I;
    float* du = dg + I;
    for (int j = 0; j < I; ++j) {
      const float gj = g[j], uj = u[j];
      const float s = 1.0f / (1.0f + detail::host_exp(-gj));
      const float a = d[j] * uj * (s * (1.0f + gj * (1.0f - s))), b = d[j] * gj * s;
      dg[j] = a;
      du[j] = b;
      fold(0, a);
      fold(1, b);
    }
  }
}
}  // namespace

template <class T>
void swiglu_forward(const ExecSpace& exec, View1<T> out, View1<const T> gate_up, int N, int I,
                    View1<float> amax) {
  using Acc = detail::acc_t<T>;
  using detail::abs_bits;
  using detail::acc;
  using detail::Index;
  using detail::max_bits;
  check_shape("swiglu_forward", N, I);
  detail::check_extent(out, std::size_t(N) * I, "swiglu_forward", "out");
  detail::check_extent(gate_up, 2 * std::size_t(N) * I, "swiglu_forward", "gate_up");
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    kc::fence(exec, "meshtrain::swiglu_forward: host loop");
    Kokkos::Profiling::pushRegion("meshtrain::swiglu_forward");
    detail::host_loop_amax(
        amax, [&](auto& fold) { forward_host(out.data(), gate_up.data(), N, I, fold); });
    Kokkos::Profiling::popRegion();
    return;
  }
  // 16-bit on a GPU with I a multiple of 8: eight columns per access (pack8.hpp).
  if (I % 8 == 0 && detail::packable<T>(std::size_t(N) * I, {out.data(), gate_up.data()})) {
    const Index I8 = I / 8;
    detail::Pack8<T>* o = reinterpret_cast<detail::Pack8<T>*>(out.data());
    const detail::Pack8<T>* gu = reinterpret_cast<const detail::Pack8<T>*>(gate_up.data());
    detail::for_each_amax(
        "meshtrain::swiglu_forward", exec, Index(N) * I8, amax,
        KOKKOS_LAMBDA(Index k, std::uint32_t& m) {
          const Index n = k / I8, j = k % I8;
          const detail::Pack8<T> g = gu[2 * n * I8 + j], u = gu[2 * n * I8 + I8 + j];
          detail::Pack8<T> r;
          for (int e = 0; e < 8; ++e) {
            const Acc ge = acc(g.v[e]);
            const Acc silu = acc(static_cast<T>(ge * sigmoid_16bit(static_cast<float>(ge))));
            r.v[e] = static_cast<T>(silu * acc(u.v[e]));
            m = max_bits(m, abs_bits(r.v[e]));
          }
          o[k] = r;
        });
    return;
  }
  detail::for_each_amax(
      "meshtrain::swiglu_forward", exec, Index(N) * I, amax,
      KOKKOS_LAMBDA(Index k, std::uint32_t& m) {
        const Index n = k / I, j = k % I;
        const Acc g = acc(gate_up(2 * n * I + j)), u = acc(gate_up(2 * n * I + I + j));
        // HF's order: silu(gate) is a tensor of T before the product.
        const Acc silu = acc(static_cast<T>(g / (Acc(1) + kc::exp(-g))));
        const T v = static_cast<T>(silu * u);
        out(k) = v;
        m = max_bits(m, abs_bits(v));
      });
}

template <class T>
void swiglu_backward(const ExecSpace& exec, View1<T> dgate_up, View1<const T> gate_up,
                     View1<const T> dout, int N, int I, View1<float> amax) {
  using Acc = detail::acc_t<T>;
  using detail::abs_bits;
  using detail::acc;
  using detail::Index;
  using detail::max_bits;
  check_shape("swiglu_backward", N, I);
  detail::check_extent(dgate_up, 2 * std::size_t(N) * I, "swiglu_backward", "dgate_up");
  detail::check_extent(gate_up, 2 * std::size_t(N) * I, "swiglu_backward", "gate_up");
  detail::check_extent(dout, std::size_t(N) * I, "swiglu_backward", "dout");
  if (detail::present(amax)) detail::check_extent(amax, 2, "swiglu_backward", "amax");
  if constexpr (kDeviceIsHost && std::is_same_v<T, float>) {
    kc::fence(exec, "meshtrain::swiglu_backward: host loop");
    Kokkos::Profiling::pushRegion("meshtrain::swiglu_backward");
    detail::host_loop_amax<2>(amax, [&](auto& fold) {
      backward_host(dgate_up.data(), gate_up.data(), dout.data(), N, I, fold);
    });
    Kokkos::Profiling::popRegion();
    return;
  }
  // As in the forward, with two amaxes (dgate's, dup's). In place (dgate_up == gate_up) stays
  // right: each thread reads its packs of gate and up before it writes them.
  if (I % 8 == 0 && detail::packable<T>(std::size_t(N) * I,
                                        {dgate_up.data(), gate_up.data(), dout.data()})) {
    const Index I8 = I / 8;
    detail::Pack8<T>* dgu = reinterpret_cast<detail::Pack8<T>*>(dgate_up.data());
    const detail::Pack8<T>* gu = reinterpret_cast<const detail::Pack8<T>*>(gate_up.data());
    const detail::Pack8<T>* dp = reinterpret_cast<const detail::Pack8<T>*>(dout.data());
    detail::for_each_amaxes<2>(
        "meshtrain::swiglu_backward", exec, Index(N) * I8, amax,
        KOKKOS_LAMBDA(Index k, detail::AmaxBitsK<2>& m) {
          const Index n = k / I8, j = k % I8;
          const Index ig = 2 * n * I8 + j, iu = ig + I8;
          const detail::Pack8<T> g = gu[ig], u = gu[iu], d = dp[k];
          detail::Pack8<T> rg, ru;
          for (int e = 0; e < 8; ++e) {
            const Acc ge = acc(g.v[e]), ue = acc(u.v[e]), de = acc(d.v[e]);
            const Acc s = sigmoid_16bit(static_cast<float>(ge));
            rg.v[e] = static_cast<T>(de * ue * (s * (Acc(1) + ge * (Acc(1) - s))));
            ru.v[e] = static_cast<T>(de * ge * s);
            m.v[0] = max_bits(m.v[0], abs_bits(rg.v[e]));
            m.v[1] = max_bits(m.v[1], abs_bits(ru.v[e]));
          }
          dgu[ig] = rg;
          dgu[iu] = ru;
        });
    return;
  }
  detail::for_each_amaxes<2>(
      "meshtrain::swiglu_backward", exec, Index(N) * I, amax,
      KOKKOS_LAMBDA(Index k, detail::AmaxBitsK<2>& m) {
        const Index n = k / I, j = k % I;
        const Index ig = 2 * n * I + j, iu = ig + I;
        const Acc g = acc(gate_up(ig)), u = acc(gate_up(iu)), d = acc(dout(k));
        const Acc s = Acc(1) / (Acc(1) + kc::exp(-g));
        const T vg = static_cast<T>(d * u * (s * (Acc(1) + g * (Acc(1) - s))));
        const T vu = static_cast<T>(d * g * s);
        dgate_up(ig) = vg;
        dgate_up(iu) = vu;
        m.v[0] = max_bits(m.v[0], abs_bits(vg));
        m.v[1] = max_bits(m.v[1], abs_bits(vu));
      });
}

#define MESHTRAIN_INSTANTIATE_SWIGLU(T)                                                        \
  template void swiglu_forward<T>(const ExecSpace&, View1<T>, View1<const T>, int, int,       \
                                  View1<float>);                                              \
  template void swiglu_backward<T>(const ExecSpace&, View1<T>, View1<const T>, View1<const T>, \
                                   int, int, View1<float>);
MESHTRAIN_INSTANTIATE_SWIGLU(float)
MESHTRAIN_INSTANTIATE_SWIGLU(double)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_SWIGLU(bf16)
MESHTRAIN_INSTANTIATE_SWIGLU(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_SWIGLU

}  // namespace meshtrain::kernels
