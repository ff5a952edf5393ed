// LayerNorm: forward against a double host implementation, backward (double instantiation)
// against central finite differences, float backward against the double one. Then the
// dispatched layernorm_forward/backward (the CUDA kernels on a CUDA build) against the portable
// kernels, in float and bf16, and their run-to-run determinism. Last, the FP8 amax fused into
// the forward.
#include <cstdio>

#include "amax_check.hpp"
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

// ---------------------------------------------------------------------------------------------
// The dispatched kernels against the portable ones. On a CUDA build layernorm_forward/backward
// run the CUDA kernels (src/kernels/layernorm_cuda.cpp) for float and bf16 when C is a multiple
// of 16 / sizeof(T), and C <= 8192 for the backward: each call records which path ran and
// requires the one the rules of layernorm.hpp name. Elsewhere (host builds, other shapes) the
// dispatcher runs the portable kernels and the comparison is exact; the tests above check the
// portable kernels against references.
namespace {

template <class T>
kt::Path expected_path(int C, bool backward) {
#if defined(KOKKOS_ENABLE_CUDA)
  bool cuda_type = std::is_same_v<T, float>;
#if MESHTRAIN_HAVE_BF16
  cuda_type = cuda_type || std::is_same_v<T, bf16>;
#endif
  if (cuda_type && C % int(16 / sizeof(T)) == 0 && (!backward || C <= 8192)) return kt::Path::cuda;
#else
  (void)C;
  (void)backward;
#endif
  return kt::Path::portable;
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : "bf16";
}

// Tolerances of a dispatched result against the portable one, element-wise: |got - want| <=
// rtol |want| + atol_floor + atol_scale max|want|.
struct Tol {
  double rtol, atol_floor, atol_scale;
};
// float: both sides are fp32 with sums in different orders: ~1e-7 relative on the row sums,
// ~1e-6 absolute on dweight/dbias (N-row sums): 1e-5 relative, 1e-5 (+1e-6 of the largest
// element) absolute for elements near zero. bf16: the outputs are rounded to bf16 from fp32
// values that agree to ~1e-6, so they are at most 1 bf16 ulp (2^-8..2^-7 relative) apart:
// 1e-2 relative, and the same absolute terms for results that cancel to ~0.
template <class T>
Tol tolerance() {
  return std::is_same_v<T, float> ? Tol{1e-5, 1e-5, 1e-6} : Tol{1e-2, 1e-5, 1e-6};
}

template <class T>
void require_near(const View1<T>& got, const View1<T>& want, const Tol& t, const char* what) {
  const auto g = kt::convert<float>(kt::to_host(got)), w = kt::convert<float>(kt::to_host(want));
  kt::require_close(g, w, t.rtol, t.atol_floor + t.atol_scale * kt::max_abs(w), what);
}

template <class T>
View1<T> random_device(std::size_t n, std::uint32_t seed, double lo, double hi) {
  return kt::to_device(kt::convert<T>(kt::random_vector<float>(n, seed, lo, hi)));
}

template <class T>
View1<T> copy_of(const View1<T>& v) {
  View1<T> c("copy", v.extent(0));
  Kokkos::deep_copy(c, v);
  return c;
}

template <class T>
void compare_with_portable(int N, int C, std::uint32_t seed) {
  INFO(type_name<T>() << " N=" << N << " C=" << C);
  const std::size_t NC = std::size_t(N) * C;
  // A mean of 0.5 and std ~1.2: the variance pass must not cancel.
  const auto x = random_device<T>(NC, seed, -1.5, 2.5);
  const auto w = random_device<T>(C, seed + 1, 0.5, 1.5);
  const auto b = random_device<T>(C, seed + 2, -0.5, 0.5);
  const auto dout = random_device<T>(NC, seed + 3, -1.0, 1.0);
  const Tol tol = tolerance<T>();
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  ExecSpace exec;

  View1<T> out("out", NC), out_p("out_p", NC);
  Kokkos::deep_copy(out, nan);
  Kokkos::deep_copy(out_p, nan);
  auto mean = kt::nan_view<float>(N), rstd = kt::nan_view<float>(N);
  auto mean_p = kt::nan_view<float>(N), rstd_p = kt::nan_view<float>(N);
  const kt::Path fwd = kt::run_logged("layernorm_forward", [&] {
    layernorm_forward<T>(exec, out, mean, rstd, x, w, b, N, C);
  });
  std::printf("layernorm_forward<%s> N=%d C=%d: %s path\n", type_name<T>(), N, C,
              kt::path_name(fwd));
  REQUIRE(fwd == expected_path<T>(C, false));
  layernorm_forward_portable<T>(exec, out_p, mean_p, rstd_p, x, w, b, N, C);
  require_near(out, out_p, tol, "out");
  // mean and rstd are fp32 on both paths: 1e-5 relative (and 1e-6 absolute for means near 0).
  kt::require_close(kt::to_host(mean), kt::to_host(mean_p), 1e-5, 1e-6, "mean");
  kt::require_close(kt::to_host(rstd), kt::to_host(rstd_p), 1e-5, 0.0, "rstd");

  // Backward on both sides from the portable forward's statistics. Every output accumulates, so
  // each starts from the same non-zero values; before the second call the dispatched outputs
  // are reset to the portable ones, so that bf16 rounding differences do not compound and the
  // second call is held to the same tolerance (it reuses the persistent scratch).
  auto dinp = random_device<T>(NC, seed + 4, -1.0, 1.0);
  auto dw = random_device<T>(C, seed + 5, -1.0, 1.0), db = random_device<T>(C, seed + 6, -1.0, 1.0);
  auto dinp_p = copy_of(dinp), dw_p = copy_of(dw), db_p = copy_of(db);
  for (int call = 0; call < 2; ++call) {
    INFO("backward call " << call);
    const kt::Path bwd = kt::run_logged("layernorm_backward", [&] {
      layernorm_backward<T>(exec, dinp, dw, db, dout, x, w, mean_p, rstd_p, N, C);
    });
    if (call == 0)
      std::printf("layernorm_backward<%s> N=%d C=%d: %s path\n", type_name<T>(), N, C,
                  kt::path_name(bwd));
    REQUIRE(bwd == expected_path<T>(C, true));
    layernorm_backward_portable<T>(exec, dinp_p, dw_p, db_p, dout, x, w, mean_p, rstd_p, N, C);
    require_near(dinp, dinp_p, tol, "dinp");
    require_near(dw, dw_p, tol, "dweight");
    require_near(db, db_p, tol, "dbias");
    Kokkos::deep_copy(dinp, dinp_p);
    Kokkos::deep_copy(dw, dw_p);
    Kokkos::deep_copy(db, db_p);
  }
}

// GPT-2 widths (768 at several N: one, a few and more than one row per backward warp; 1024;
// 1600, not a multiple of a warp's 256 bf16), small and awkward C (96, 200; 36 is not a
// multiple of 8 bf16; 13 of nothing), rows too long for registers (3072, 8192) and too long for
// the CUDA backward (8200).
const std::vector<std::pair<int, int>> kShapes = {
    {7, 768},  {300, 768}, {5000, 768}, {33, 1024}, {17, 1600}, {9, 96},
    {5, 200},  {6, 36},    {4, 13},     {3, 3072},  {1, 8192},  {2, 8200}};

}  // namespace

TEST_CASE("layernorm dispatched kernels match the portable ones (float)",
          "[kernels][layernorm][dispatch]") {
  std::uint32_t seed = 100;
  for (const auto& [N, C] : kShapes) compare_with_portable<float>(N, C, seed += 10);
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("layernorm dispatched kernels match the portable ones (bf16)",
          "[kernels][layernorm][dispatch][bf16]") {
  std::uint32_t seed = 200;
  for (const auto& [N, C] : kShapes) compare_with_portable<bf16>(N, C, seed += 10);
}
#endif

namespace {
template <class T>
void require_deterministic(int N, int C) {
  INFO(type_name<T>() << " N=" << N << " C=" << C);
  const std::size_t NC = std::size_t(N) * C;
  const auto x = random_device<T>(NC, 301, -1.5, 2.5);
  const auto w = random_device<T>(C, 302, 0.5, 1.5), b = random_device<T>(C, 303, -0.5, 0.5);
  const auto dout = random_device<T>(NC, 304, -1.0, 1.0);
  const auto dinp0 = random_device<T>(NC, 305, -1.0, 1.0);
  const auto dw0 = random_device<T>(C, 306, -1.0, 1.0), db0 = random_device<T>(C, 307, -1.0, 1.0);
  ExecSpace exec;
  std::vector<T> first[4];
  std::vector<float> first_stats[2];
  for (int run = 0; run < 2; ++run) {
    View1<T> out("out", NC);
    View1<float> mean("mean", N), rstd("rstd", N);
    layernorm_forward<T>(exec, out, mean, rstd, x, w, b, N, C);
    auto dinp = copy_of(dinp0), dw = copy_of(dw0), db = copy_of(db0);
    layernorm_backward<T>(exec, dinp, dw, db, dout, x, w, mean, rstd, N, C);
    const std::vector<T> got[4] = {kt::to_host(out), kt::to_host(dinp), kt::to_host(dw),
                                   kt::to_host(db)};
    const std::vector<float> stats[2] = {kt::to_host(mean), kt::to_host(rstd)};
    for (int k = 0; k < 4; ++k) {
      if (run == 0) first[k] = got[k];
      else REQUIRE(kt::bitwise_equal(got[k], first[k]));
    }
    for (int k = 0; k < 2; ++k) {
      if (run == 0) first_stats[k] = stats[k];
      else REQUIRE(kt::bitwise_equal(stats[k], first_stats[k]));
    }
  }
}
}  // namespace

TEST_CASE("layernorm dispatched kernels are bitwise deterministic",
          "[kernels][layernorm][dispatch][determinism]") {
  require_deterministic<float>(5000, 768);
#if MESHTRAIN_HAVE_BF16
  require_deterministic<bf16>(5000, 768);
#endif
}

// ---------------------------------------------------------------------------------------------
// The FP8 amax fused into the forward (issue 35): layernorm_forward(..., amax) sets amax(0) to
// fp8_amax of out, for the dispatched kernels (the CUDA ones where they apply: register rows,
// rows past the registers, shapes they refuse) and the portable ones; an inf in out, a NaN, an
// all-zero input with zero bias (out = 0) and no rows give inf, NaN, 0 and 0, over a stale amax.
namespace {

template <class T>
std::uint32_t layernorm_amax(int N, int C, const std::vector<T>& x, const std::vector<T>& w,
                             const std::vector<T>& b, bool portable) {
  const std::size_t NC = std::size_t(N) * C;
  const auto xd = kt::to_device(x), wd = kt::to_device(w), bd = kt::to_device(b);
  View1<T> plain("plain", NC), fused("fused", NC);
  View1<float> mean("mean", N), rstd("rstd", N);
  return kt::require_fused_amax<T>(plain, fused, NC, [&](View1<T> out, View1<float> amax) {
    if (portable)
      layernorm_forward_portable<T>(ExecSpace(), out, mean, rstd, xd, wd, bd, N, C, 1e-5f, amax);
    else
      layernorm_forward<T>(ExecSpace(), out, mean, rstd, xd, wd, bd, N, C, 1e-5f, amax);
  });
}

template <class T>
void layernorm_amax_cases() {
  const std::vector<std::pair<int, int>> shapes = {{7, 768}, {33, 4096}, {1, 8192}, {6, 36},
                                                   {4, 13},  {2, 8200},  {0, 768}};
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  for (const bool portable : {false, true})
    for (const auto& [N, C] : shapes) {
      INFO(type_name<T>() << " N=" << N << " C=" << C << (portable ? " portable" : " dispatched"));
      const std::size_t NC = std::size_t(N) * C;
      const auto x = kt::convert<T>(kt::random_vector<float>(NC, 500 + C, -1.5, 2.5));
      const auto w = kt::convert<T>(kt::random_vector<float>(C, 501 + C, 0.5, 1.5));
      const auto b = kt::convert<T>(kt::random_vector<float>(C, 502 + C, -1.0, 1.0));
      const std::uint32_t finite = layernorm_amax<T>(N, C, x, w, b, portable);
      if (N == 0) {
        REQUIRE(finite == 0);
        continue;
      }
      REQUIRE((finite > 0 && finite < kt::kInfBits));
      // x = 50 among values ~1 gives xhat of several times 1; times a weight of 3e38, that
      // overflows to inf, and a finite bias keeps it inf (finite inputs, no NaN anywhere).
      auto xi = x, wi = w;
      xi[0] = static_cast<T>(50.0f);
      wi[0] = static_cast<T>(3e38f);
      REQUIRE(layernorm_amax<T>(N, C, xi, wi, b, portable) == kt::kInfBits);
      auto xn = x;
      xn[NC - 1] = nan;  // the last row's statistics and outputs are NaN
      REQUIRE(layernorm_amax<T>(N, C, xn, w, b, portable) > kt::kInfBits);
      const std::vector<T> zeros(NC, static_cast<T>(0.0f)), zero_bias(C, static_cast<T>(0.0f));
      REQUIRE(layernorm_amax<T>(N, C, zeros, w, zero_bias, portable) == 0);
    }
}

}  // namespace

TEST_CASE("layernorm_forward's fused FP8 amax is fp8_amax of out (float)",
          "[kernels][layernorm][fp8][amax]") {
  layernorm_amax_cases<float>();
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("layernorm_forward's fused FP8 amax is fp8_amax of out (bf16)",
          "[kernels][layernorm][fp8][amax][bf16]") {
  layernorm_amax_cases<bf16>();
}
#endif
