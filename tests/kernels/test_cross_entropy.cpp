// Fused cross-entropy: losses and gradients against a double host implementation (padding
// columns, ignored targets, a large logit offset), gradient of the double instantiation against
// central differences of the host loss, forward-only path, sum_losses.
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/cross_entropy.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct CeCase {
  int N, V, Vp;
};

struct CeData {
  std::vector<double> logits;  // [N, Vp]; padding columns NaN
  std::vector<std::int32_t> targets;
  int counted = 0;
};

CeData make_data(const CeCase& c, std::uint32_t seed) {
  CeData d;
  d.logits = kt::random_vector<double>(std::size_t(c.N) * c.Vp, seed, -3.0, 3.0);
  std::mt19937 gen(seed + 1);
  std::uniform_int_distribution<int> dist(0, c.V - 1);
  d.targets.resize(c.N);
  for (int i = 0; i < c.N; ++i) {
    // Rows 3, 10, 17, ... are ignored positions.
    d.targets[i] = (i % 7 == 3) ? -1 : dist(gen);
    d.counted += d.targets[i] >= 0;
    // Padding columns hold NaN: they must be masked out of the softmax and zeroed.
    for (int v = c.V; v < c.Vp; ++v) d.logits[std::size_t(i) * c.Vp + v] = std::nan("");
  }
  // One row with a large offset: the log-sum-exp must not overflow.
  for (int v = 0; v < c.V; ++v) d.logits[std::size_t(1) * c.Vp + v] += 500.0;
  d.targets[c.N - 1] = c.V - 1;  // the last real column is a valid target
  d.counted = 0;
  for (auto t : d.targets) d.counted += t >= 0;
  return d;
}

double row_loss(const CeCase& c, const std::vector<double>& x, int i, int t) {
  const double* r = &x[std::size_t(i) * c.Vp];
  double mx = r[0];
  for (int v = 1; v < c.V; ++v) mx = std::max(mx, r[v]);
  double s = 0;
  for (int v = 0; v < c.V; ++v) s += std::exp(r[v] - mx);
  return mx + std::log(s) - r[t];
}
}  // namespace

TEST_CASE("cross_entropy_forward_backward: losses, gradients, padding, ignored rows",
          "[kernels][cross_entropy]") {
  // V = 37 < 64 parts (some parts empty); V = 200 spans several columns per part.
  for (const CeCase c : {CeCase{21, 37, 64}, CeCase{9, 200, 256}}) {
    INFO("N=" << c.N << " V=" << c.V << " Vp=" << c.Vp);
    const CeData d = make_data(c, 7);
    const float scale = 1.0f / d.counted;
    ExecSpace exec;
    auto logits = kt::to_device(kt::cast_vector<float>(d.logits));
    auto targets = kt::to_device(d.targets);
    auto losses = kt::nan_view<float>(c.N);
    auto losses_fwd = kt::nan_view<float>(c.N);
    cross_entropy_forward<float>(exec, losses_fwd, logits, targets, c.N, c.Vp, c.V);
    // Forward-only leaves the logits alone (NaN padding compares unequal: compare bits).
    REQUIRE(kt::bitwise_equal(kt::to_host(logits), kt::cast_vector<float>(d.logits)));
    cross_entropy_forward_backward<float>(exec, losses, logits, targets, c.N, c.Vp, c.V, scale);

    const auto xf = kt::cast_vector<float>(d.logits);
    const std::vector<double> x(xf.begin(), xf.end());  // the fp32 inputs, in double
    std::vector<double> want_loss(c.N, 0.0), want_grad(x.size(), 0.0);
    for (int i = 0; i < c.N; ++i) {
      const int t = d.targets[i];
      if (t < 0) continue;
      want_loss[i] = row_loss(c, x, i, t);
      const double lse = want_loss[i] + x[std::size_t(i) * c.Vp + t];
      for (int v = 0; v < c.V; ++v)
        want_grad[std::size_t(i) * c.Vp + v] =
            scale * (std::exp(x[std::size_t(i) * c.Vp + v] - lse) - (v == t ? 1.0 : 0.0));
    }
    const auto got_loss = kt::to_host(losses);
    const auto got_grad = kt::to_host(logits);
    // fp32 log-sum-exp of values up to ~500: absolute error ~ulp(500) ~ 3e-5.
    kt::require_close(got_loss, want_loss, 1e-6, 1e-4, "losses");
    // The forward-only path computes the same statistics the same way: same bits.
    REQUIRE(kt::bitwise_equal(kt::to_host(losses_fwd), got_loss));
    // Probabilities are in [0, 1], scaled by 1/counted; fp32 exp: 1e-6 absolute.
    kt::require_close(got_grad, want_grad, 1e-5, 1e-7, "dlogits");
    for (int i = 0; i < c.N; ++i) {
      double row_sum = 0;
      for (int v = 0; v < c.Vp; ++v) {
        const float g = got_grad[std::size_t(i) * c.Vp + v];
        if (v >= c.V || d.targets[i] < 0) {
          INFO("row " << i << " column " << v);
          REQUIRE(g == 0.0f);  // exactly zero (and not NaN)
        }
        row_sum += g;
      }
      if (d.targets[i] < 0) REQUIRE(got_loss[i] == 0.0f);
      // softmax sums to 1 and the one-hot to 1: the row sums to 0 up to fp32 rounding.
      INFO("row " << i);
      REQUIRE(std::fabs(row_sum) <= 1e-6);
    }
  }
}

TEST_CASE("cross_entropy gradient matches finite differences of the loss (double)",
          "[kernels][cross_entropy]") {
  const CeCase c{7, 37, 64};
  CeData d = make_data(c, 17);
  const double scale = 1.0 / d.counted;
  // Objective: the mean loss over counted rows, L = scale * sum_i loss_i (a double host
  // implementation: the kernel's losses are fp32 by contract). Padding stays NaN and is never
  // perturbed (its gradient is exactly 0).
  std::vector<double> x = d.logits;
  for (int i = 0; i < c.N; ++i)
    for (int v = c.V; v < c.Vp; ++v) x[std::size_t(i) * c.Vp + v] = 0.0;
  auto objective = [&]() {
    double L = 0;
    for (int i = 0; i < c.N; ++i)
      if (d.targets[i] >= 0) L += scale * row_loss(c, x, i, d.targets[i]);
    return L;
  };
  const auto fd = kt::fd_gradient(x, objective, 1e-5);
  ExecSpace exec;
  auto logits = kt::to_device(d.logits);  // with NaN padding
  View1<float> losses("losses", c.N);
  cross_entropy_forward_backward<double>(exec, losses, logits, kt::to_device(d.targets), c.N, c.Vp,
                                         c.V, float(scale));
  // The kernel takes grad_scale as fp32 (relative 3e-8 off 1/counted): tolerance 1e-7 relative.
  kt::require_close(kt::to_host(logits), fd, 1e-7, 1e-9, "dlogits");
}

TEST_CASE("sum_losses sums into a device scalar", "[kernels][cross_entropy]") {
  const int N = 21;
  const auto l = kt::random_vector<float>(N, 31, 0.0, 5.0);
  double want = 0;
  for (float x : l) want += x;
  ExecSpace exec;
  Scalar<float> out("out");
  Kokkos::deep_copy(out, 100.0f);
  sum_losses(exec, out, kt::to_device(l), N, false);
  REQUIRE(kt::scalar_value(out) == mt_test::Approx(want).epsilon(1e-6));
  sum_losses(exec, out, kt::to_device(l), N, true);
  REQUIRE(kt::scalar_value(out) == mt_test::Approx(2 * want).epsilon(1e-6));
}
