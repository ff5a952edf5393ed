// AdamW against a double host re-implementation over several steps (decay 0 and 1, a device
// grad scale < 1), sum_squares, clip_scale, and the three chained as the optimizer uses them.
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/adamw.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
void adamw_host(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                const std::vector<float>& g, const AdamWHyper& h, double decay, double scale) {
  const double b1 = h.beta1, b2 = h.beta2;
  const double bc1 = 1.0 - std::pow(b1, h.step), bc2 = 1.0 - std::pow(b2, h.step);
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double gi = double(g[i]) * scale;
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    const double mhat = m[i] / bc1, vhat = v[i] / bc2;
    p[i] -= double(h.lr) * (mhat / (std::sqrt(vhat) + double(h.eps)) +
                            double(h.weight_decay) * decay * p[i]);
  }
}
}  // namespace

TEST_CASE("adamw_update matches a double host implementation over several steps",
          "[kernels][adamw]") {
  const std::size_t n = 1003;
  ExecSpace exec;
  Scalar<float> scale("scale");
  Kokkos::deep_copy(scale, 0.5f);
  for (float decay : {0.0f, 1.0f}) {
    INFO("decay " << decay);
    AdamWHyper h;
    h.lr = 1e-2f;
    h.weight_decay = 0.1f;
    const auto p0 = kt::random_vector<float>(n, 1);
    std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
    auto dp = kt::to_device(p0);
    View1<float> dm("m", n), dv("v", n);
    for (int step = 1; step <= 5; ++step) {
      h.step = step;
      const auto g = kt::random_vector<float>(n, 100 + step);
      adamw_update<float>(exec, dp, kt::to_device(g), dm, dv, n, h, decay, scale);
      adamw_host(p, m, v, g, h, decay, 0.5);
    }
    // fp32 state over 5 steps of size lr ~ 1e-2 with O(1) update directions: the parameter
    // error is a few ulp of the parameter plus ~lr * 1e-6 per step.
    kt::require_close(kt::to_host(dp), p, 1e-6, 1e-6, "param");
    kt::require_close(kt::to_host(dm), m, 1e-5, 1e-7, "m");
    kt::require_close(kt::to_host(dv), v, 1e-5, 1e-8, "v");
    if (decay == 0.0f) {
      // Sanity of the test itself: decay changes the result.
      AdamWHyper h1 = h;
      std::vector<double> q(p0.begin(), p0.end()), m1(n, 0.0), v1(n, 0.0);
      for (int step = 1; step <= 5; ++step) {
        h1.step = step;
        adamw_host(q, m1, v1, kt::random_vector<float>(n, 100 + step), h1, 1.0, 0.5);
      }
      REQUIRE(std::fabs(q[0] - p[0]) > 1e-6);
    }
  }
  AdamWHyper bad;
  bad.step = 0;
  View1<float> x("x", 4);
  REQUIRE_THROWS_AS(adamw_update<float>(exec, x, x, x, x, 4, bad, 1.0f, scale), meshtrain::Error);
}

TEST_CASE("sum_squares overwrites or accumulates", "[kernels][adamw]") {
  const std::size_t n = 1003;
  const auto x = kt::random_vector<float>(n, 3);
  double want = 0;
  for (float a : x) want += double(a) * a;
  ExecSpace exec;
  Scalar<float> out("out");
  Kokkos::deep_copy(out, 7.0f);
  sum_squares<float>(exec, out, kt::to_device(x), n, false);
  // fp32 sum of 1003 positive terms: relative error < n u ~ 6e-5 worst case, ~1e-6 typical.
  REQUIRE(kt::scalar_value(out) == mt_test::Approx(want).epsilon(1e-5));
  sum_squares<float>(exec, out, kt::to_device(x), n, true);
  REQUIRE(kt::scalar_value(out) == mt_test::Approx(2 * want).epsilon(1e-5));
}

#if MESHTRAIN_HAVE_BF16
// On a GPU, 16-bit gradients are read eight per load where the pointer is 16-byte aligned
// (adamw.cpp, pack8.hpp): lengths around a pack, aligned and one element off the boundary.
TEST_CASE("sum_squares of bf16, packed or not", "[kernels][adamw][bf16]") {
  ExecSpace exec;
  for (std::size_t n : {5, 8, 13, 1003})
    for (std::size_t shift : {0, 1}) {
      INFO("n " << n << " shift " << shift);
      const auto x = kt::convert<bf16>(kt::random_vector<float>(n, 8));
      std::vector<bf16> buf(n + shift, bf16(100.0f));  // the element before must not count
      std::copy(x.begin(), x.end(), buf.begin() + shift);
      auto all = kt::to_device(buf);
      const View1<const bf16> view(all.data() + shift, n);
      double want = 0;
      for (const bf16& a : x) want += double(float(a)) * double(float(a));
      Scalar<float> out("out");
      sum_squares<bf16>(exec, out, view, n, false);
      // Exact squares summed in double, rounded once to float.
      REQUIRE(kt::scalar_value(out) == mt_test::Approx(want).epsilon(1e-6));
    }
}
#endif

TEST_CASE("clip_scale above, below and without a max norm", "[kernels][adamw]") {
  ExecSpace exec;
  Scalar<float> sumsq("sumsq"), scale("scale"), norm("norm");
  Kokkos::deep_copy(sumsq, 16.0f);  // norm 4, exactly representable
  clip_scale(exec, scale, norm, sumsq, 1.0f);
  REQUIRE(kt::scalar_value(norm) == 4.0f);
  REQUIRE(kt::scalar_value(scale) == 0.25f);
  clip_scale(exec, scale, norm, sumsq, 10.0f);
  REQUIRE(kt::scalar_value(scale) == 1.0f);
  clip_scale(exec, scale, norm, sumsq, 4.0f);  // at the threshold: no clipping
  REQUIRE(kt::scalar_value(scale) == 1.0f);
  clip_scale(exec, scale, norm, sumsq, 0.0f);  // disabled
  REQUIRE(kt::scalar_value(scale) == 1.0f);
  REQUIRE(kt::scalar_value(norm) == 4.0f);
}

TEST_CASE("sum_squares -> clip_scale -> adamw_update stays on the device", "[kernels][adamw]") {
  const std::size_t n = 257;
  const auto g = kt::random_vector<float>(n, 5, -3.0, 3.0);
  const auto p0 = kt::random_vector<float>(n, 6);
  ExecSpace exec;
  Scalar<float> sumsq("sumsq"), scale("scale"), norm("norm");
  auto dg = kt::to_device(g);
  sum_squares<float>(exec, sumsq, dg, n, false);
  clip_scale(exec, scale, norm, sumsq, 1.0f);
  auto dp = kt::to_device(p0);
  View1<float> dm("m", n), dv("v", n);
  AdamWHyper h;
  adamw_update<float>(exec, dp, dg, dm, dv, n, h, 1.0f, scale);
  double ss = 0;
  for (float a : g) ss += double(a) * a;
  const double clip = 1.0 / std::sqrt(ss);
  REQUIRE(kt::scalar_value(scale) == mt_test::Approx(clip).epsilon(1e-5));
  std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
  adamw_host(p, m, v, g, h, 1.0, double(kt::scalar_value(scale)));
  kt::require_close(kt::to_host(dp), p, 1e-6, 1e-6, "param");
  kt::require_close(kt::to_host(dm), m, 1e-5, 1e-9, "m");
}

TEST_CASE("adamw_update_ranges: one launch equals the per-range updates", "[kernels][adamw]") {
  // Ranges of unequal lengths with alternating decay (like GPT-2's weights and biases), an
  // element before the first start (belongs to range 0), and a bf16-style copy when built.
  const std::size_t n = 2000;
  const std::vector<std::int64_t> begins = {3, 700, 701, 1500, 1999};
  const std::vector<float> decays = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f};
  ExecSpace exec;
  Scalar<float> scale("scale");
  Kokkos::deep_copy(scale, 0.75f);
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  const auto p0 = kt::random_vector<float>(n, 7);
  std::vector<double> p(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
  auto dp = kt::to_device(p0);
  View1<float> dm("m", n), dv("v", n);
  auto db = kt::to_device(begins);
  auto dd = kt::to_device(decays);
  for (int step = 1; step <= 3; ++step) {
    h.step = step;
    const auto g = kt::random_vector<float>(n, 300 + step);
    adamw_update_ranges<float>(exec, dp, kt::to_device(g), dm, dv, n, h, db, dd, scale,
                               View1<float>());
    // Reference: each range on its own through the double host implementation.
    for (std::size_t r = 0; r < begins.size(); ++r) {
      const std::size_t lo = r == 0 ? 0 : std::size_t(begins[r]);
      const std::size_t hi = r + 1 < begins.size() ? std::size_t(begins[r + 1]) : n;
      std::vector<double> pr(p.begin() + lo, p.begin() + hi), mr(m.begin() + lo, m.begin() + hi),
          vr(v.begin() + lo, v.begin() + hi);
      std::vector<float> gr(g.begin() + lo, g.begin() + hi);
      adamw_host(pr, mr, vr, gr, h, decays[r], 0.75);
      std::copy(pr.begin(), pr.end(), p.begin() + lo);
      std::copy(mr.begin(), mr.end(), m.begin() + lo);
      std::copy(vr.begin(), vr.end(), v.begin() + lo);
    }
  }
  kt::require_close(kt::to_host(dp), p, 1e-6, 1e-6, "param");
  kt::require_close(kt::to_host(dm), m, 1e-5, 1e-7, "m");
  kt::require_close(kt::to_host(dv), v, 1e-5, 1e-8, "v");
}

#if MESHTRAIN_HAVE_BF16
// On a GPU, adamw_update_ranges takes four elements per thread where every pointer is aligned
// (adamw.cpp): the same update on aligned views and on views one element into their buffers
// (the element-wise form) must give the same bits, with range starts inside a group of four,
// a tail of n % 4 elements and a bf16 copy.
TEST_CASE("adamw_update_ranges: four per thread equals element-wise, bit for bit",
          "[kernels][adamw][bf16]") {
  const std::size_t n = 2001;
  const std::vector<std::int64_t> begins = {0, 5, 701, 1998, 2000};
  const std::vector<float> decays = {1.0f, 0.0f, 1.0f, 0.0f, 1.0f};
  ExecSpace exec;
  Scalar<float> scale("scale");
  Kokkos::deep_copy(scale, 0.5f);
  AdamWHyper h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  auto db = kt::to_device(begins);
  auto dd = kt::to_device(decays);
  std::vector<std::vector<float>> params;
  std::vector<std::vector<bf16>> copies;
  for (std::size_t shift : {0, 1}) {
    const auto shifted = [&](const std::vector<float>& x) {
      std::vector<float> r(n + shift, 0.0f);
      std::copy(x.begin(), x.end(), r.begin() + shift);
      return kt::to_device(r);
    };
    auto p_all = shifted(kt::random_vector<float>(n, 21));
    auto m_all = shifted(std::vector<float>(n, 0.0f)), v_all = shifted(std::vector<float>(n, 0.0f));
    auto c_all = kt::to_device(std::vector<bf16>(n + shift, bf16(0.0f)));
    View1<float> p(p_all.data() + shift, n), m(m_all.data() + shift, n), v(v_all.data() + shift, n);
    View1<bf16> c(c_all.data() + shift, n);
    for (int step = 1; step <= 3; ++step) {
      h.step = step;
      auto g_all = kt::to_device([&] {
        std::vector<bf16> r(n + shift, bf16(0.0f));
        const auto g = kt::random_vector<float>(n, 400 + step, -2.0, 2.0);
        for (std::size_t i = 0; i < n; ++i) r[i + shift] = bf16(g[i]);
        return r;
      }());
      const View1<const bf16> g(g_all.data() + shift, n);
      adamw_update_ranges<bf16>(exec, p, g, m, v, n, h, db, dd, scale, c);
    }
    const auto ph = kt::to_host(p_all);
    const auto ch = kt::to_host(c_all);
    params.emplace_back(ph.begin() + shift, ph.end());
    copies.emplace_back(ch.begin() + shift, ch.end());
  }
  REQUIRE(kt::bitwise_equal(params[0], params[1]));
  REQUIRE(std::memcmp(copies[0].data(), copies[1].data(), n * sizeof(bf16)) == 0);
}
#endif
