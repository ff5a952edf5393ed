// GELU (tanh approximation) forward against the host formula in double, backward (double
// instantiation) against central differences, and the FP8 amax fused into both; residual add
// and accumulate.
#include "amax_check.hpp"
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/residual.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
double gelu_host(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
// Inputs in [-6, 6] plus large magnitudes where cosh(u) would overflow in fp32.
std::vector<double> gelu_inputs(std::size_t n, std::uint32_t seed) {
  auto x = kt::random_vector<double>(n, seed, -6.0, 6.0);
  const double extremes[] = {-100.0, -12.0, 0.0, 12.0, 100.0};
  for (std::size_t k = 0; k < 5 && k < n; ++k) x[k] = extremes[k];
  return x;
}
}  // namespace

TEST_CASE("gelu_forward matches the tanh formula", "[kernels][gelu]") {
  const std::size_t n = 21 * 12;
  const auto x = gelu_inputs(n, 1);
  auto out = kt::nan_view<float>(n);
  gelu_forward<float>(ExecSpace(), out, kt::to_device(kt::cast_vector<float>(x)), n);
  std::vector<double> want(n);
  for (std::size_t i = 0; i < n; ++i) want[i] = gelu_host(double(float(x[i])));
  // fp32 tanh/exp: a few ulp of values up to 100.
  kt::require_close(kt::to_host(out), want, 1e-6, 1e-6, "gelu");
}

TEST_CASE("gelu_backward matches finite differences (double)", "[kernels][gelu]") {
  const std::size_t n = 7 * 13;
  auto x = gelu_inputs(n, 2);
  const auto R = kt::random_vector<double>(n, 3);
  ExecSpace exec;
  auto objective = [&]() {
    View1<double> out("out", n);
    gelu_forward<double>(exec, out, kt::to_device(x), n);
    return kt::dot(kt::to_host(out), R);
  };
  // Element-wise, so each central difference sees one smooth function: eps 1e-5 gives
  // truncation ~1e-10 times gelu''' (bounded), rounding ~1e-11.
  const auto fd = kt::fd_gradient(x, objective, 1e-5);
  auto dinp = kt::nan_view<double>(n);
  gelu_backward<double>(exec, dinp, kt::to_device(x), kt::to_device(R), n);
  kt::require_close(kt::to_host(dinp), fd, 1e-7, 1e-8, "dinp");

  // fp32 instantiation: finite (no cosh overflow at |x| = 100) and close to the double one.
  auto dinpf = kt::nan_view<float>(n);
  gelu_backward<float>(exec, dinpf, kt::to_device(kt::cast_vector<float>(x)),
                       kt::to_device(kt::cast_vector<float>(R)), n);
  kt::require_close(kt::to_host(dinpf), kt::to_host(dinp), 1e-5, 1e-6, "dinp (float)");
}

#if MESHTRAIN_HAVE_BF16
// On a GPU, 16-bit GELU runs eight elements per load where the pointers allow (gelu.cpp):
// lengths around the pack of 8, with and without a tail, and pointers one element off the
// 16-byte boundary (the element-wise form). The reference is the fp32 formula of the same
// bf16 inputs; the kernels round once to bf16 (2^-8 relative), exp may differ by an fp32 ulp.
TEST_CASE("gelu bf16 equals the fp32 formula of the same inputs, packed or not",
          "[kernels][gelu][bf16]") {
  using bhalf = Kokkos::Experimental::bhalf_t;
  const auto to_bf16 = [](const std::vector<double>& v, std::size_t shift) {
    std::vector<bhalf> r(v.size() + shift, bhalf(0.0f));
    for (std::size_t i = 0; i < v.size(); ++i) r[i + shift] = bhalf(float(v[i]));
    return r;
  };
  ExecSpace exec;
  for (std::size_t n : {5, 8, 13, 1003, 4096})
    for (std::size_t shift : {0, 1}) {
      INFO("n " << n << " shift " << shift);
      const auto xs = gelu_inputs(n, 4);
      const auto ds = kt::random_vector<double>(n, 5);
      auto x_all = kt::to_device(to_bf16(xs, shift));
      auto d_all = kt::to_device(to_bf16(ds, shift));
      auto o_all = kt::to_device(std::vector<bhalf>(n + shift, bhalf(0.0f)));
      auto g_all = kt::to_device(std::vector<bhalf>(n + shift, bhalf(0.0f)));
      // Unmanaged views `shift` elements into each allocation.
      View1<bhalf> x(x_all.data() + shift, n), d(d_all.data() + shift, n);
      View1<bhalf> o(o_all.data() + shift, n), g(g_all.data() + shift, n);
      gelu_forward<bhalf>(exec, o, x, n);
      gelu_backward<bhalf>(exec, g, x, d, n);
      const auto oh = kt::to_host(o_all), gh = kt::to_host(g_all);
      std::vector<double> got_o(n), got_g(n), want_o(n), want_g(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double xi = float(bhalf(float(xs[i]))), di = float(bhalf(float(ds[i])));
        want_o[i] = float(xi / (1.0 + std::exp(-2.0 * 0.7978845608028654 *
                                                (xi + 0.044715 * xi * xi * xi))));
        const double sig =
            1.0 / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (xi + 0.044715 * xi * xi * xi)));
        want_g[i] = (sig + 2.0 * xi * sig * (1.0 - sig) * 0.7978845608028654 *
                               (1.0 + 3.0 * 0.044715 * xi * xi)) *
                    di;
        got_o[i] = float(oh[i + shift]);
        got_g[i] = float(gh[i + shift]);
      }
      kt::require_close(got_o, want_o, 1.0 / 128, 1e-6, "gelu bf16");
      kt::require_close(got_g, want_g, 1.0 / 128, 1e-6, "gelu_backward bf16");
      if (shift == 1) CHECK(float(oh[0]) == 0.0f);  // the element before the view is untouched
    }
}
#endif

// The FP8 amax fused into GELU (issue 35): gelu_forward(..., amax) sets amax(0) to fp8_amax of
// out, gelu_backward(..., amax) to fp8_amax of dinp; an inf in the output, a NaN, all zeros and
// n = 0 give inf, NaN, 0 and 0, over a stale amax. In bf16 on a GPU the packed form (aligned
// views, n >= 8) and the element-wise one (views one element into their buffers), with and
// without a tail of n % 8, as above; in double the Kokkos kernel on any build.
namespace {

template <class T>
std::vector<T> to_t(const std::vector<double>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<T>(static_cast<float>(v[i]));
  return r;
}

// The amax bits of gelu_forward (backward = false) or gelu_backward on x (and d), each run on
// views `shift` elements into their allocations.
template <class T>
std::uint32_t gelu_amax(const std::vector<T>& x, const std::vector<T>& d, std::size_t shift,
                        bool backward) {
  const std::size_t n = x.size();
  const auto padded = [&](const std::vector<T>& v) {
    std::vector<T> r(n + shift, static_cast<T>(0.0f));
    std::copy(v.begin(), v.end(), r.begin() + shift);
    return kt::to_device(r);
  };
  auto x_all = padded(x), d_all = padded(d);
  auto plain_all = padded(std::vector<T>(n)), fused_all = padded(std::vector<T>(n));
  const View1<T> xv(x_all.data() + shift, n), dv(d_all.data() + shift, n);
  const View1<T> plain(plain_all.data() + shift, n), fused(fused_all.data() + shift, n);
  return kt::require_fused_amax<T>(plain, fused, n, [&](View1<T> out, View1<float> amax) {
    if (backward)
      gelu_backward<T>(ExecSpace(), out, xv, dv, n, amax);
    else
      gelu_forward<T>(ExecSpace(), out, xv, n, amax);
  });
}

template <class T>
void gelu_amax_cases(const std::vector<std::size_t>& sizes,
                     const std::vector<std::size_t>& shifts) {
  const T inf = static_cast<T>(std::numeric_limits<float>::infinity());
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  for (const std::size_t n : sizes)
    for (const std::size_t shift : shifts)
      for (const bool backward : {false, true}) {
        INFO("n " << n << " shift " << shift << (backward ? " backward" : " forward"));
        const auto x = to_t<T>(gelu_inputs(n, 7)), d = to_t<T>(kt::random_vector<double>(n, 8));
        const std::uint32_t finite = gelu_amax(x, d, shift, backward);
        if (n == 0) {
          REQUIRE(finite == 0);
          continue;
        }
        REQUIRE((finite > 0 && finite < kt::kInfBits));
        // gelu(inf) = inf; gelu'(1) * inf = inf. The last element: in the packed form, the tail.
        auto xi = x, di = d;
        xi[n - 1] = backward ? static_cast<T>(1.0f) : inf;
        di[n - 1] = inf;
        REQUIRE(gelu_amax(xi, di, shift, backward) == kt::kInfBits);
        auto xn = x;
        xn[n / 2] = nan;
        REQUIRE(gelu_amax(xn, d, shift, backward) > kt::kInfBits);
        const std::vector<T> zeros(n, static_cast<T>(0.0f));
        REQUIRE(gelu_amax(zeros, zeros, shift, backward) == 0);  // gelu(0) = 0, gelu'(0) * 0
      }
}

}  // namespace

TEST_CASE("gelu's fused FP8 amax is fp8_amax of the output (float)", "[kernels][gelu][fp8][amax]") {
  // n >= 4: gelu_inputs starts with -100, -12, 0 (outputs +-0, amax 0) and 12.
  gelu_amax_cases<float>({0, 4, 13, 1003}, {0});
}

TEST_CASE("gelu's fused FP8 amax through the Kokkos kernels (double)",
          "[kernels][gelu][fp8][amax]") {
  gelu_amax_cases<double>({0, 4, 13, 1003}, {0});
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("gelu's fused FP8 amax is fp8_amax of the output (bf16)",
          "[kernels][gelu][fp8][amax][bf16]") {
  gelu_amax_cases<bf16>({0, 5, 8, 13, 1003, 4096}, {0, 1});
}
#endif

TEST_CASE("residual_forward and accumulate, including aliasing", "[kernels][residual]") {
  const std::size_t n = 37;
  const auto a = kt::random_vector<float>(n, 4), b = kt::random_vector<float>(n, 5);
  ExecSpace exec;
  auto out = kt::nan_view<float>(n);
  residual_forward<float>(exec, out, kt::to_device(a), kt::to_device(b), n);
  auto h = kt::to_host(out);
  for (std::size_t i = 0; i < n; ++i) REQUIRE(h[i] == a[i] + b[i]);
  // out aliasing a
  auto da = kt::to_device(a);
  residual_forward<float>(exec, da, da, kt::to_device(b), n);
  REQUIRE(kt::bitwise_equal(kt::to_host(da), h));
  // y += x
  auto y = kt::to_device(a);
  accumulate<float>(exec, y, kt::to_device(b), n);
  REQUIRE(kt::bitwise_equal(kt::to_host(y), h));
}
