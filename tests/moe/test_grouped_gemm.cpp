// The grouped expert GEMM against plain loops, with experts that have no rows (first, in the
// middle, last), in float and double.
#include "kernels/kernel_test_util.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"

using namespace meshtrain;
using namespace meshtrain::moe;

namespace {

template <class T>
void check(const std::vector<std::int64_t>& counts, int K, int Nout, double tol) {
  const int E = static_cast<int>(counts.size());
  std::vector<std::int64_t> off(E + 1, 0);
  for (int e = 0; e < E; ++e) off[e + 1] = off[e] + counts[e];
  const std::int64_t M = off[E];
  const auto x = kt::random_vector<double>(std::size_t(M) * K, 1);
  const auto w = kt::random_vector<double>(std::size_t(E) * K * Nout, 2);
  const auto dy = kt::random_vector<double>(std::size_t(M) * Nout, 3);
  const auto dw0 = kt::random_vector<double>(std::size_t(E) * K * Nout, 4);
  std::vector<double> y(M * Nout, 0.0), dx(M * K, 0.0), dw(dw0);
  for (int e = 0; e < E; ++e)
    for (std::int64_t r = off[e]; r < off[e + 1]; ++r)
      for (int o = 0; o < Nout; ++o)
        for (int i = 0; i < K; ++i) {
          const double we = w[(std::size_t(e) * K + i) * Nout + o];
          y[r * Nout + o] += x[r * K + i] * we;
          dx[r * K + i] += dy[r * Nout + o] * we;
          dw[(std::size_t(e) * K + i) * Nout + o] += x[r * K + i] * dy[r * Nout + o];
        }
  auto dy_d = kt::to_device(kt::cast_vector<T>(dy));
  auto x_d = kt::to_device(kt::cast_vector<T>(x));
  auto w_d = kt::to_device(kt::cast_vector<T>(w));
  auto y_d = kt::nan_view<T>(y.size());
  grouped_linear_forward<T>(ExecSpace(), off, x_d, w_d, y_d, K, Nout);
  kt::require_close(kt::to_host(y_d), y, tol, tol, "y");
  auto dx_d = kt::nan_view<T>(dx.size());
  auto dw_d = kt::to_device(kt::cast_vector<T>(dw0));
  grouped_linear_backward<T>(ExecSpace(), off, dy_d, x_d, w_d, dx_d, dw_d, K, Nout);
  kt::require_close(kt::to_host(dx_d), dx, tol, tol, "dx");
  kt::require_close(kt::to_host(dw_d), dw, tol, tol, "dw");  // untouched where no rows
  // dx may be left out.
  grouped_linear_backward<T>(ExecSpace(), off, dy_d, x_d, w_d, View1<T>(), dw_d, K, Nout);
}

}  // namespace

TEST_CASE("grouped expert GEMM: forward and backward against loops", "[moe][gemm]") {
  for (auto counts : {std::vector<std::int64_t>{0, 5, 0, 3, 1, 0}, std::vector<std::int64_t>{7},
                      std::vector<std::int64_t>{0, 0}}) {
    check<double>(counts, 6, 4, 1e-13);
    check<float>(counts, 6, 4, 2e-5);
  }
}

TEST_CASE("grouped expert GEMM: offsets must be well formed", "[moe][gemm]") {
  auto v = kt::to_device(std::vector<float>(12, 1.f));
  REQUIRE_THROWS_WITH(grouped_linear_forward<float>(ExecSpace(), {0, 3, 2}, v, v, v, 2, 2),
                      mt_test::contains("offsets decrease"));
  REQUIRE_THROWS_WITH(grouped_linear_forward<float>(ExecSpace(), {0, 3}, v, v, v, 2, 2),
                      mt_test::contains("has 12 elements, expected 6"));
}
