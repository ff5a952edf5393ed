// Fused cross-entropy: losses and gradients against a double host implementation (padding
// columns, ignored targets, a large logit offset), gradient of the double instantiation against
// central differences of the host loss, forward-only path, sum_losses. Then the dispatched
// kernels (the CUDA kernels on a CUDA build) against the portable ones, in float and bf16.
#include <cstdio>

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

// ---------------------------------------------------------------------------------------------
// The dispatched kernels against the portable ones. On a CUDA build cross_entropy_forward and
// cross_entropy_forward_backward run the CUDA kernels (src/kernels/cross_entropy_cuda.cpp) for
// float and bf16 when Vp is a multiple of 16 / sizeof(T): each call records which path ran and
// requires the one the rules of cross_entropy.hpp name. Elsewhere (host builds, other shapes)
// the dispatcher runs the portable kernels and the comparison is exact; the tests above check
// the portable kernels against references.
namespace {

template <class T>
kt::Path expected_path(int Vp) {
#if defined(KOKKOS_ENABLE_CUDA)
  bool cuda_type = std::is_same_v<T, float>;
#if MESHTRAIN_HAVE_BF16
  cuda_type = cuda_type || std::is_same_v<T, bf16>;
#endif
  if (cuda_type && Vp % int(16 / sizeof(T)) == 0) return kt::Path::cuda;
#else
  (void)Vp;
#endif
  return kt::Path::portable;
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "bf16";
}

template <class T>
View1<T> copy_of(const View1<T>& v) {
  View1<T> c("copy", v.extent(0));
  Kokkos::deep_copy(c, v);
  return c;
}

template <class T>
void compare_with_portable(const CeCase& c, std::uint32_t seed) {
  INFO(type_name<T>() << " N=" << c.N << " V=" << c.V << " Vp=" << c.Vp);
  // Logits in [-4, 4], row 1 offset by +30 (the log-sum-exp must not overflow), padding NaN (it
  // must be neither read nor left unwritten).
  auto xf = kt::random_vector<float>(std::size_t(c.N) * c.Vp, seed, -4.0, 4.0);
  for (int i = 0; i < c.N; ++i)
    for (int v = 0; v < c.Vp; ++v) {
      float& e = xf[std::size_t(i) * c.Vp + v];
      if (v >= c.V) e = std::numeric_limits<float>::quiet_NaN();
      else if (i == 1) e += 30.0f;
    }
  const std::vector<T> x = kt::convert<T>(xf);
  // Ignored rows (i % 7 == 3), the first and the last real column as targets, and (row 2 when
  // N >= 5) a corrupt target V, whose loss is NaN on both paths.
  std::mt19937 gen(seed + 1);
  std::uniform_int_distribution<int> dist(0, c.V - 1);
  std::vector<std::int32_t> t(c.N);
  for (int i = 0; i < c.N; ++i) t[i] = (i % 7 == 3) ? -1 : dist(gen);
  t[0] = 0;
  if (c.N >= 5) t[2] = c.V;
  t[c.N - 1] = c.V - 1;
  int counted = 0;
  for (auto v : t) counted += v >= 0;
  const float scale = 1.0f / float(counted);
  const auto targets = kt::to_device(t);
  ExecSpace exec;

  // Forward only.
  const auto logits = kt::to_device(x);
  auto loss_f = kt::nan_view<float>(c.N), loss_fp = kt::nan_view<float>(c.N);
  const kt::Path fwd = kt::run_logged("cross_entropy_forward", [&] {
    cross_entropy_forward<T>(exec, loss_f, logits, targets, c.N, c.Vp, c.V);
  });
  std::printf("cross_entropy_forward<%s> N=%d V=%d Vp=%d: %s path\n", type_name<T>(), c.N, c.V,
              c.Vp, kt::path_name(fwd));
  REQUIRE(fwd == expected_path<T>(c.Vp));
  cross_entropy_forward_portable<T>(exec, loss_fp, logits, targets, c.N, c.Vp, c.V);
  REQUIRE(kt::bitwise_equal(kt::to_host(logits), x));  // untouched (NaN padding: compare bits)

  // Forward and backward, each side on its own copy of the logits.
  auto grad = copy_of(logits), grad_p = copy_of(logits);
  auto loss = kt::nan_view<float>(c.N), loss_p = kt::nan_view<float>(c.N);
  const kt::Path fb = kt::run_logged("cross_entropy_forward_backward", [&] {
    cross_entropy_forward_backward<T>(exec, loss, grad, targets, c.N, c.Vp, c.V, scale);
  });
  std::printf("cross_entropy_forward_backward<%s> N=%d V=%d Vp=%d: %s path\n", type_name<T>(),
              c.N, c.V, c.Vp, kt::path_name(fb));
  REQUIRE(fb == expected_path<T>(c.Vp));
  cross_entropy_forward_backward_portable<T>(exec, loss_p, grad_p, targets, c.N, c.Vp, c.V,
                                             scale);

  // Losses: fp32 on both paths from the same inputs (sums in different orders): 1e-5 relative,
  // 1e-5 absolute. The corrupt row must be NaN on both, and the forward-only losses are the same
  // bits as the fused call's on each path.
  const auto l = kt::to_host(loss), lp = kt::to_host(loss_p);
  REQUIRE(kt::bitwise_equal(kt::to_host(loss_f), l));
  REQUIRE(kt::bitwise_equal(kt::to_host(loss_fp), lp));
  std::vector<float> lc, lpc;
  for (int i = 0; i < c.N; ++i) {
    INFO("row " << i << " target " << t[i]);
    if (t[i] >= c.V) {
      REQUIRE(std::isnan(l[i]));
      REQUIRE(std::isnan(lp[i]));
      continue;
    }
    if (t[i] < 0) REQUIRE(l[i] == 0.0f);
    lc.push_back(l[i]);
    lpc.push_back(lp[i]);
  }
  kt::require_close(lc, lpc, 1e-5, 1e-5, "losses");

  // Gradients: probabilities differ by ~1e-6 relative in fp32 (the portable kernel's
  // exp(x - lse) carries lse's rounding), so float: 1e-5 relative; bf16 outputs are rounded from
  // those: at most 1 bf16 ulp apart, 1e-2 relative. Absolute 1e-7 * grad_scale, below any
  // probability that matters (p - 1 cannot cancel: no p here is near 1 but for V = 1, where both
  // paths give exactly 0). Padding columns and ignored rows are exactly 0.
  const auto g = kt::convert<float>(kt::to_host(grad)), gp = kt::convert<float>(kt::to_host(grad_p));
  const double rtol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  kt::require_close(g, gp, rtol, 1e-7 * scale, "dlogits");
  std::size_t nonzero = 0, first = 0;
  for (int i = 0; i < c.N; ++i)
    for (int v = 0; v < c.Vp; ++v) {
      const std::size_t k = std::size_t(i) * c.Vp + v;
      if ((v >= c.V || t[i] < 0) && !(g[k] == 0.0f) && nonzero++ == 0) first = k;
    }
  INFO(nonzero << " padding or ignored-row gradients are not 0, the first at row "
               << first / c.Vp << " column " << first % c.Vp);
  REQUIRE(nonzero == 0);
}

// GPT-2's vocabulary (V = 50257 = 8 * 6282 + 1, padded to 50304), small vocabularies with and
// without a partial last vector, one longer than the CUDA kernels keep in registers (70000; as
// is 50257 in float) and in bf16 more than two blocks' shared memory, Llama 3's (128256) and one
// longer still with a partial last vector (130001), whose bf16 rows overflow the shared memory
// into global reads, V = 1, and Vp not a multiple of 8 (36: float only) or of anything (37).
const std::vector<CeCase> kCases = {{21, 37, 64},      {9, 200, 256},       {8, 1000, 1024},
                                    {5, 50257, 50304}, {3, 70000, 70016},   {3, 128256, 128256},
                                    {5, 130001, 130048}, {6, 8, 8},         {4, 1, 64},
                                    {4, 30, 36},       {4, 37, 37}};

}  // namespace

TEST_CASE("cross_entropy dispatched kernels match the portable ones (float)",
          "[kernels][cross_entropy][dispatch]") {
  std::uint32_t seed = 500;
  for (const CeCase& c : kCases) compare_with_portable<float>(c, seed += 10);
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("cross_entropy dispatched kernels match the portable ones (bf16)",
          "[kernels][cross_entropy][dispatch][bf16]") {
  std::uint32_t seed = 600;
  for (const CeCase& c : kCases) compare_with_portable<bf16>(c, seed += 10);
}
#endif

TEST_CASE("cross_entropy dispatched kernels are bitwise deterministic",
          "[kernels][cross_entropy][dispatch][determinism]") {
  const CeCase c{64, 50257, 50304};
  const auto x = kt::random_vector<float>(std::size_t(c.N) * c.Vp, 701, -4.0, 4.0);
  std::vector<std::int32_t> t(c.N);
  for (int i = 0; i < c.N; ++i) t[i] = (i * 7919) % c.V;
  const auto targets = kt::to_device(t);
  ExecSpace exec;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    auto logits = kt::to_device(kt::convert<T>(x));
    View1<float> losses("losses", c.N);
    cross_entropy_forward_backward<T>(exec, losses, logits, targets, c.N, c.Vp, c.V, 0.01f);
    return std::make_pair(kt::to_host(losses), kt::to_host(logits));
  };
  const auto a = run(float()), b = run(float());
  REQUIRE(kt::bitwise_equal(a.first, b.first));
  REQUIRE(kt::bitwise_equal(a.second, b.second));
#if MESHTRAIN_HAVE_BF16
  const auto p = run(bf16()), q = run(bf16());
  REQUIRE(kt::bitwise_equal(p.first, q.first));
  REQUIRE(kt::bitwise_equal(p.second, q.second));
#endif
}
