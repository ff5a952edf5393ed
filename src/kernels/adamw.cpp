// AdamW (Loshchilov & Hutter 2019): decoupled weight decay, bias-corrected moments. The gradient
// scale (1, or the clip factor) is read from a device scalar inside the kernel, so clipping never
// waits for the host.
#include "meshtrain/kernels/adamw.hpp"

#include <cmath>
#include <cstdint>

#include "common.hpp"
#include "pack8.hpp"

namespace meshtrain::kernels {

namespace {
// One element of the update, shared by the per-range and the one-launch kernels: the same
// arithmetic in the same order, so the two give the same bits. wd = weight_decay * decay.
struct AdamWStep {
  float lr, b1, b2, eps, bc1, bc2;
  KOKKOS_INLINE_FUNCTION float operator()(float g, float& m, float& v, float p,
                                          float wd) const {
    const float mi = b1 * m + (1.0f - b1) * g;
    const float vi = b2 * v + (1.0f - b2) * g * g;
    m = mi;
    v = vi;
    const float mhat = mi / bc1, vhat = vi / bc2;
    return p - lr * (mhat / (kc::sqrt(vhat) + eps) + wd * p);
  }
};

// Four consecutive elements, aligned as one access (16 bytes of float, 8 of a 16-bit type).
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

// Whether adamw_update_ranges takes its four-per-thread form: a device build and every pointer
// aligned to its Pack4 (ZeRO shards and ranks' slices may start anywhere). copy may be null.
template <class G>
bool adamw_packable(std::size_t n, const float* p, const G* g, const float* m, const float* v,
                    const G* copy) {
  if constexpr (kDeviceIsHost) {
    return false;
  } else {
    const auto aligned = [](const void* q, std::size_t a) {
      return reinterpret_cast<std::uintptr_t>(q) % a == 0;
    };
    return n >= 4 && aligned(p, 16) && aligned(m, 16) && aligned(v, 16) &&
           aligned(g, 4 * sizeof(G)) && (copy == nullptr || aligned(copy, 4 * sizeof(G)));
  }
}

// Bias corrections on the host in double: pow(0.95, step) for large step is where float loses.
AdamWStep adamw_step(const AdamWHyper& h) {
  return AdamWStep{h.lr,
                   h.beta1,
                   h.beta2,
                   h.eps,
                   static_cast<float>(1.0 - std::pow(double(h.beta1), h.step)),
                   static_cast<float>(1.0 - std::pow(double(h.beta2), h.step))};
}
}  // namespace

template <class G>
void adamw_update(const ExecSpace& exec, View1<float> param, View1<const G> grad, View1<float> m,
                  View1<float> v, std::size_t n, const AdamWHyper& h, float decay,
                  Scalar<const float> grad_scale) {
  adamw_update<G>(exec, param, grad, m, v, n, h, decay, grad_scale, View1<G>());
}

template <class G>
void adamw_update(const ExecSpace& exec, View1<float> param, View1<const G> grad, View1<float> m,
                  View1<float> v, std::size_t n, const AdamWHyper& h, float decay,
                  Scalar<const float> grad_scale, View1<G> param_copy) {
  using detail::acc;
  const char* fn = "adamw_update";
  MESHTRAIN_CHECK(h.step >= 1, fn, ": step=", h.step, " (1-based: the first update is step 1)");
  detail::check_extent(param, n, fn, "param");
  detail::check_extent(grad, n, fn, "grad");
  detail::check_extent(m, n, fn, "m");
  detail::check_extent(v, n, fn, "v");
  const bool copy = detail::present(param_copy);
  if (copy) detail::check_extent(param_copy, n, fn, "param_copy");
  const float wd = h.weight_decay * decay;
  const AdamWStep update = adamw_step(h);
  Kokkos::parallel_for(
      "meshtrain::adamw_update", detail::Range(exec, 0, detail::Index(n)),
      KOKKOS_LAMBDA(detail::Index i) {
        const float g = static_cast<float>(acc(grad(i))) * grad_scale();
        const float p = update(g, m(i), v(i), param(i), wd);
        param(i) = p;
        if (copy) param_copy(i) = static_cast<G>(p);
      });
}

template <class G>
void adamw_update_ranges(const ExecSpace& exec, View1<float> param, View1<const G> grad,
                         View1<float> m, View1<float> v, std::size_t n, const AdamWHyper& h,
                         View1<const std::int64_t> range_begin, View1<const float> range_decay,
                         Scalar<const float> grad_scale, View1<G> param_copy) {
  using detail::acc;
  const char* fn = "adamw_update_ranges";
  MESHTRAIN_CHECK(h.step >= 1, fn, ": step=", h.step, " (1-based: the first update is step 1)");
  detail::check_extent(param, n, fn, "param");
  detail::check_extent(grad, n, fn, "grad");
  detail::check_extent(m, n, fn, "m");
  detail::check_extent(v, n, fn, "v");
  const int n_ranges = static_cast<int>(range_begin.extent(0));
  MESHTRAIN_CHECK(n_ranges > 0 && range_decay.extent(0) == range_begin.extent(0), fn, ": ",
                  n_ranges, " range starts and ", range_decay.extent(0), " decay factors");
  const bool copy = detail::present(param_copy);
  if (copy) detail::check_extent(param_copy, n, fn, "param_copy");
  const float wd0 = h.weight_decay;
  const AdamWStep update = adamw_step(h);
  // One launch instead of one per range: GPT-2 alternates decayed weights and undecayed
  // biases/LayerNorms, ~100 ranges of which most are a few thousand elements (launch-bound).
  // The range of an element is a binary search over the starts (a few hundred bytes, cached).
  if (adamw_packable<G>(n, param.data(), grad.data(), m.data(), v.data(),
                        copy ? param_copy.data() : nullptr)) {
    // GPUs: four elements per thread, 16-byte accesses to param, m and v (the element-wise
    // form moved ~3.1 TB/s of a 1.2B-parameter model's state on an H200). One search per
    // thread; a range that starts inside the four is stepped into. Per element the same
    // arithmetic as below, so the same bits.
    const std::size_t quads = n / 4;
    Pack4<float>* p4 = reinterpret_cast<Pack4<float>*>(param.data());
    Pack4<float>* m4 = reinterpret_cast<Pack4<float>*>(m.data());
    Pack4<float>* v4 = reinterpret_cast<Pack4<float>*>(v.data());
    const Pack4<G>* g4 = reinterpret_cast<const Pack4<G>*>(grad.data());
    Pack4<G>* c4 = reinterpret_cast<Pack4<G>*>(param_copy.data());
    float* p1 = param.data();
    float* m1 = m.data();
    float* v1 = v.data();
    const G* g1 = grad.data();
    G* c1 = param_copy.data();
    Kokkos::parallel_for(
        "meshtrain::adamw_update_ranges", detail::Range(exec, 0, detail::Index(quads + n % 4)),
        KOKKOS_LAMBDA(detail::Index t) {
          const bool quad = std::size_t(t) < quads;
          const detail::Index i0 =
              quad ? 4 * t : detail::Index(4 * quads + (std::size_t(t) - quads));
          int lo = 0, hi = n_ranges - 1;
          while (lo < hi) {
            const int mid = (lo + hi + 1) / 2;
            if (range_begin(mid) <= i0) lo = mid;
            else hi = mid - 1;
          }
          const float gs = grad_scale();
          if (!quad) {
            const float g = static_cast<float>(acc(g1[i0])) * gs;
            const float pn = update(g, m1[i0], v1[i0], p1[i0], wd0 * range_decay(lo));
            p1[i0] = pn;
            if (copy) c1[i0] = static_cast<G>(pn);
            return;
          }
          Pack4<float> pp = p4[t], mm = m4[t], vv = v4[t];
          const Pack4<G> gg = g4[t];
          Pack4<G> cc;
          for (int e = 0; e < 4; ++e) {
            while (lo + 1 < n_ranges && range_begin(lo + 1) <= i0 + e) ++lo;
            const float g = static_cast<float>(acc(gg.v[e])) * gs;
            pp.v[e] = update(g, mm.v[e], vv.v[e], pp.v[e], wd0 * range_decay(lo));
            cc.v[e] = static_cast<G>(pp.v[e]);
          }
          p4[t] = pp;
          m4[t] = mm;
          v4[t] = vv;
          if (copy) c4[t] = cc;
        });
    return;
  }
  Kokkos::parallel_for(
      "meshtrain::adamw_update_ranges", detail::Range(exec, 0, detail::Index(n)),
      KOKKOS_LAMBDA(detail::Index i) {
        int lo = 0, hi = n_ranges - 1;  // last r with range_begin[r] <= i (0 if none)
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (range_begin(mid) <= i) lo = mid;
          else hi = mid - 1;
        }
        const float g = static_cast<float>(acc(grad(i))) * grad_scale();
        const float p = update(g, m(i), v(i), param(i), wd0 * range_decay(lo));
        param(i) = p;
        if (copy) param_copy(i) = static_cast<G>(p);
      });
}

template <class T>
void sum_squares(const ExecSpace& exec, Scalar<float> out, View1<const T> x, std::size_t n,
                 bool accumulate) {
  using detail::acc;
  detail::check_extent(x, n, "sum_squares", "x");
  // Double accumulation: a float running sum over millions of squares drops the small ones
  // (measured: the 0.8M-parameter demo model's norm came out 5e-4 low), and then the norm
  // depends on how the buffer is split across ranks. The result stays a device scalar.
  auto partial = detail::persistent_double();
  if (detail::packable<T>(n, {x.data()})) {
    // 16-bit on a GPU: eight elements per 16-byte load (pack8.hpp); the element-wise reduce
    // read a 1.2B-parameter model's bf16 gradients at ~1.3 TB/s on an H200. A 16-bit value's
    // square is exact in double, as before; only the order of the double sum changes.
    const std::size_t packs = n / 8;
    const detail::Pack8<T>* xp = reinterpret_cast<const detail::Pack8<T>*>(x.data());
    const T* x1 = x.data();
    Kokkos::parallel_reduce(
        "meshtrain::sum_squares", detail::Range(exec, 0, detail::Index(packs + n % 8)),
        KOKKOS_LAMBDA(detail::Index i, double& s) {
          if (std::size_t(i) < packs) {
            const detail::Pack8<T> a = xp[i];
            double t = 0;
            for (int e = 0; e < 8; ++e) {
              const double xi = static_cast<double>(static_cast<float>(acc(a.v[e])));
              t += xi * xi;
            }
            s += t;
          } else {
            const double xi = static_cast<double>(
                static_cast<float>(acc(x1[packs * 8 + (std::size_t(i) - packs)])));
            s += xi * xi;
          }
        },
        partial);
  } else {
    Kokkos::parallel_reduce(
        "meshtrain::sum_squares", detail::Range(exec, 0, static_cast<detail::Index>(n)),
        KOKKOS_LAMBDA(detail::Index i, double& s) {
          const double xi = static_cast<double>(static_cast<float>(acc(x(i))));
          s += xi * xi;
        },
        partial);
  }
  Kokkos::parallel_for(
      "meshtrain::sum_squares_store", detail::Range(exec, 0, 1), KOKKOS_LAMBDA(detail::Index) {
        out() = static_cast<float>(accumulate ? out() + partial() : partial());
      });
}

void clip_scale(const ExecSpace& exec, Scalar<float> scale, Scalar<float> norm,
                Scalar<const float> sumsq, float max_norm, float inv_loss_scale) {
  Kokkos::parallel_for(
      "meshtrain::clip_scale", detail::Range(exec, 0, 1), KOKKOS_LAMBDA(detail::Index) {
        const float nrm = kc::sqrt(sumsq()) * inv_loss_scale;
        norm() = nrm;
        scale() = inv_loss_scale *
                  (max_norm > 0.0f ? max_norm / (nrm > max_norm ? nrm : max_norm) : 1.0f);
      });
}

template void adamw_update<float>(const ExecSpace&, View1<float>, View1<const float>,
                                  View1<float>, View1<float>, std::size_t, const AdamWHyper&,
                                  float, Scalar<const float>);
template void sum_squares<float>(const ExecSpace&, Scalar<float>, View1<const float>, std::size_t,
                                 bool);
template void adamw_update<float>(const ExecSpace&, View1<float>, View1<const float>,
                                  View1<float>, View1<float>, std::size_t, const AdamWHyper&,
                                  float, Scalar<const float>, View1<float>);
#define MESHTRAIN_INSTANTIATE_ADAMW_RANGES(G)                                                \
  template void adamw_update_ranges<G>(const ExecSpace&, View1<float>, View1<const G>,      \
                                       View1<float>, View1<float>, std::size_t,             \
                                       const AdamWHyper&, View1<const std::int64_t>,        \
                                       View1<const float>, Scalar<const float>, View1<G>);
MESHTRAIN_INSTANTIATE_ADAMW_RANGES(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_ADAMW_RANGES(bf16)
MESHTRAIN_INSTANTIATE_ADAMW_RANGES(fp16)
#endif
#undef MESHTRAIN_INSTANTIATE_ADAMW_RANGES
#if MESHTRAIN_HAVE_BF16
template void adamw_update<bf16>(const ExecSpace&, View1<float>, View1<const bf16>, View1<float>,
                                 View1<float>, std::size_t, const AdamWHyper&, float,
                                 Scalar<const float>, View1<bf16>);
template void adamw_update<bf16>(const ExecSpace&, View1<float>, View1<const bf16>, View1<float>,
                                 View1<float>, std::size_t, const AdamWHyper&, float,
                                 Scalar<const float>);
template void sum_squares<bf16>(const ExecSpace&, Scalar<float>, View1<const bf16>, std::size_t,
                                bool);
template void adamw_update<fp16>(const ExecSpace&, View1<float>, View1<const fp16>, View1<float>,
                                 View1<float>, std::size_t, const AdamWHyper&, float,
                                 Scalar<const float>, View1<fp16>);
template void adamw_update<fp16>(const ExecSpace&, View1<float>, View1<const fp16>, View1<float>,
                                 View1<float>, std::size_t, const AdamWHyper&, float,
                                 Scalar<const float>);
template void sum_squares<fp16>(const ExecSpace&, Scalar<float>, View1<const fp16>, std::size_t,
                                bool);
#endif

}  // namespace meshtrain::kernels
