// GELU (tanh approximation) forward against the host formula in double, backward (double
// instantiation) against central differences; residual add and accumulate.
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
