// LayerNorm: forward against a double host implementation, backward (double instantiation)
// against central finite differences, float backward against the double one.
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/layernorm.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct LnRef {
  std::vector<double> out, mean, rstd;
};
LnRef layernorm_host(const std::vector<double>& x, const std::vector<double>& w,
                     const std::vector<double>& b, int N, int C, double eps) {
  LnRef r{std::vector<double>(x.size()), std::vector<double>(N), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double mu = 0, var = 0;
    for (int c = 0; c < C; ++c) mu += x[n * C + c];
    mu /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = (x[n * C + c] - mu) * rs * w[c] + b[c];
    r.mean[n] = mu;
    r.rstd[n] = rs;
  }
  return r;
}
}  // namespace

TEST_CASE("layernorm_forward matches a double host implementation", "[kernels][layernorm]") {
  const int N = 21, C = 12;
  // An offset mean (3) checks that the variance does not cancel.
  const auto x = kt::random_vector<float>(std::size_t(N) * C, 1, 2.0, 4.0);
  const auto w = kt::random_vector<float>(C, 2, 0.5, 1.5);
  const auto b = kt::random_vector<float>(C, 3);
  auto out = kt::nan_view<float>(x.size());
  auto mean = kt::nan_view<float>(N), rstd = kt::nan_view<float>(N);
  ExecSpace exec;
  layernorm_forward<float>(exec, out, mean, rstd, kt::to_device(x), kt::to_device(w),
                           kt::to_device(b), N, C);
  const auto ref = layernorm_host(std::vector<double>(x.begin(), x.end()),
                                  std::vector<double>(w.begin(), w.end()),
                                  std::vector<double>(b.begin(), b.end()), N, C, 1e-5);
  // fp32 rounding of x - mean (|x| ~ 3) times rstd (~2): a few 1e-7 absolute; 1e-5 for margin.
  kt::require_close(kt::to_host(out), ref.out, 1e-5, 1e-5, "out");
  kt::require_close(kt::to_host(mean), ref.mean, 1e-6, 1e-6, "mean");
  kt::require_close(kt::to_host(rstd), ref.rstd, 1e-5, 1e-6, "rstd");
}

TEST_CASE("layernorm_backward matches finite differences (double)", "[kernels][layernorm]") {
  const int N = 5, C = 12;
  auto x = kt::random_vector<double>(std::size_t(N) * C, 11, -2.0, 2.0);
  auto w = kt::random_vector<double>(C, 12, 0.5, 1.5);
  auto b = kt::random_vector<double>(C, 13);
  const auto R = kt::random_vector<double>(x.size(), 14);
  ExecSpace exec;
  View1<float> mean("mean", N), rstd("rstd", N);
  auto objective = [&]() {
    View1<double> out("out", x.size());
    layernorm_forward<double>(exec, out, mean, rstd, kt::to_device(x), kt::to_device(w),
                              kt::to_device(b), N, C);
    return kt::dot(kt::to_host(out), R);
  };
  const double eps = 1e-5;
  const auto fd_x = kt::fd_gradient(x, objective, eps);
  const auto fd_w = kt::fd_gradient(w, objective, eps);
  const auto fd_b = kt::fd_gradient(b, objective, eps);
  objective();  // leaves mean/rstd of the unperturbed input

  // All three gradients accumulate: start from non-zero values.
  const auto x0 = kt::random_vector<double>(x.size(), 15);
  const auto w0 = kt::random_vector<double>(w.size(), 16);
  const auto b0 = kt::random_vector<double>(b.size(), 17);
  auto dx = kt::to_device(x0), dw = kt::to_device(w0), db = kt::to_device(b0);
  layernorm_backward<double>(exec, dx, dw, db, kt::to_device(R), kt::to_device(x),
                             kt::to_device(w), mean, rstd, N, C);
  // mean and rstd are saved as fp32 even in the double instantiation (the header's contract):
  // that perturbs the gradient by ~1e-7 relative. FD truncation at eps = 1e-5 is ~1e-10.
  kt::require_close(kt::subtract(kt::to_host(dx), x0), fd_x, 1e-5, 2e-6, "dinp");
  kt::require_close(kt::subtract(kt::to_host(dw), w0), fd_w, 1e-5, 2e-6, "dweight");
  kt::require_close(kt::subtract(kt::to_host(db), b0), fd_b, 1e-9, 1e-9, "dbias");

  // The float instantiation agrees with the double one (fp32 rounding, values O(1)).
  View1<float> meanf("meanf", N), rstdf("rstdf", N), outf("outf", x.size());
  const auto xf = kt::cast_vector<float>(x), wf = kt::cast_vector<float>(w),
             bf = kt::cast_vector<float>(b), Rf = kt::cast_vector<float>(R);
  layernorm_forward<float>(exec, outf, meanf, rstdf, kt::to_device(xf), kt::to_device(wf),
                           kt::to_device(bf), N, C);
  auto dxf = kt::to_device(kt::cast_vector<float>(x0)), dwf = kt::to_device(kt::cast_vector<float>(w0)),
       dbf = kt::to_device(kt::cast_vector<float>(b0));
  layernorm_backward<float>(exec, dxf, dwf, dbf, kt::to_device(Rf), kt::to_device(xf),
                            kt::to_device(wf), meanf, rstdf, N, C);
  kt::require_close(kt::to_host(dxf), kt::to_host(dx), 1e-4, 1e-5, "dinp (float vs double)");
  kt::require_close(kt::to_host(dwf), kt::to_host(dw), 1e-4, 1e-5, "dweight (float vs double)");
  kt::require_close(kt::to_host(dbf), kt::to_host(db), 1e-4, 1e-5, "dbias (float vs double)");
}
