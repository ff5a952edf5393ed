// RMSNorm: forward against a double host implementation, backward (double instantiation)
// against central finite differences, float backward against the double one, bf16's order of
// operations (HF's) bit for bit. Then the dispatched rmsnorm_forward/backward (the CUDA kernels
// on a CUDA build) against the portable kernels, in float and bf16, and their determinism. Last,
// the FP8 amax fused into the forward.
#include <cstdio>

#include "amax_check.hpp"
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/rmsnorm.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct RmsRef {
  std::vector<double> out, rstd;
};
RmsRef rmsnorm_host(const std::vector<double>& x, const std::vector<double>& w, int N, int C,
                    double eps) {
  RmsRef r{std::vector<double>(x.size()), std::vector<double>(N)};
  for (int n = 0; n < N; ++n) {
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += x[n * C + c] * x[n * C + c];
    const double rs = 1.0 / std::sqrt(sq / C + eps);
    for (int c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * rs * w[c];
    r.rstd[n] = rs;
  }
  return r;
}
}  // namespace

TEST_CASE("rmsnorm_forward matches a double host implementation", "[kernels][rmsnorm]") {
  const int N = 21, C = 12;
  // A non-zero mean (1): RMSNorm does not subtract it, a LayerNorm-like bug would show.
  auto x = kt::random_vector<float>(std::size_t(N) * C, 1, -1.0, 3.0);
  for (int c = 0; c < C; ++c) x[c] = 0.0f;  // an all-zero row: rstd = 1/sqrt(eps), out = 0
  const auto w = kt::random_vector<float>(C, 2, 0.5, 1.5);
  auto out = kt::nan_view<float>(x.size());
  auto rstd = kt::nan_view<float>(N);
  ExecSpace exec;
  rmsnorm_forward<float>(exec, out, rstd, kt::to_device(x), kt::to_device(w), N, C);
  const auto ref = rmsnorm_host(std::vector<double>(x.begin(), x.end()),
                                std::vector<double>(w.begin(), w.end()), N, C, 1e-5);
  // fp32 rounding of the sum of squares and two products: a few 1e-7 relative.
  kt::require_close(kt::to_host(out), ref.out, 1e-5, 1e-6, "out");
  kt::require_close(kt::to_host(rstd), ref.rstd, 1e-5, 0.0, "rstd");
  const auto eps_out = kt::to_host(rstd);
  REQUIRE(std::fabs(eps_out[0] - 1.0 / std::sqrt(1e-5)) < 1e-2);
}

TEST_CASE("rmsnorm_backward matches finite differences (double)", "[kernels][rmsnorm]") {
  const int N = 5, C = 12;
  auto x = kt::random_vector<double>(std::size_t(N) * C, 11, -2.0, 2.5);
  auto w = kt::random_vector<double>(C, 12, 0.5, 1.5);
  const auto R = kt::random_vector<double>(x.size(), 14);
  ExecSpace exec;
  View1<float> rstd("rstd", N);
  auto objective = [&]() {
    View1<double> out("out", x.size());
    rmsnorm_forward<double>(exec, out, rstd, kt::to_device(x), kt::to_device(w), N, C);
    return kt::dot(kt::to_host(out), R);
  };
  const double eps = 1e-5;
  const auto fd_x = kt::fd_gradient(x, objective, eps);
  const auto fd_w = kt::fd_gradient(w, objective, eps);
  objective();  // leaves rstd of the unperturbed input

  // Both gradients accumulate: start from non-zero values.
  const auto x0 = kt::random_vector<double>(x.size(), 15);
  const auto w0 = kt::random_vector<double>(w.size(), 16);
  auto dx = kt::to_device(x0), dw = kt::to_device(w0);
  rmsnorm_backward<double>(exec, dx, dw, kt::to_device(R), kt::to_device(x), kt::to_device(w),
                           rstd, N, C);
  // rstd is saved as fp32 even in the double instantiation (the header's contract): that
  // perturbs the gradient by ~1e-7 relative. FD truncation at eps = 1e-5 is ~1e-10.
  kt::require_close(kt::subtract(kt::to_host(dx), x0), fd_x, 1e-5, 2e-6, "dinp");
  kt::require_close(kt::subtract(kt::to_host(dw), w0), fd_w, 1e-5, 2e-6, "dweight");

  // The float instantiation agrees with the double one (fp32 rounding, values O(1)).
  View1<float> rstdf("rstdf", N), outf("outf", x.size());
  const auto xf = kt::cast_vector<float>(x), wf = kt::cast_vector<float>(w),
             Rf = kt::cast_vector<float>(R);
  rmsnorm_forward<float>(exec, outf, rstdf, kt::to_device(xf), kt::to_device(wf), N, C);
  auto dxf = kt::to_device(kt::cast_vector<float>(x0)),
       dwf = kt::to_device(kt::cast_vector<float>(w0));
  rmsnorm_backward<float>(exec, dxf, dwf, kt::to_device(Rf), kt::to_device(xf),
                          kt::to_device(wf), rstdf, N, C);
  kt::require_close(kt::to_host(dxf), kt::to_host(dx), 1e-4, 1e-5, "dinp (float vs double)");
  kt::require_close(kt::to_host(dwf), kt::to_host(dw), 1e-4, 1e-5, "dweight (float vs double)");
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("rmsnorm bf16 follows HF's order of operations bit for bit",
          "[kernels][rmsnorm][bf16]") {
  // HF LlamaRMSNorm: n = (x * rstd) in fp32, rounded to bf16, times the weight, rounded. From
  // the kernel's own rstd the host recomputes exactly that: one fp32 product, one rounding, one
  // product of two bf16 values, one rounding. The other order (weight * x * rstd rounded once)
  // gives different bits on this data, which the test checks, so it can tell them apart.
  const int N = 64, C = 96;
  const auto x = kt::convert<bf16>(kt::random_vector<float>(std::size_t(N) * C, 21, -3.0, 3.0));
  const auto w = kt::convert<bf16>(kt::random_vector<float>(C, 22, 0.3, 2.0));
  View1<bf16> out("out", x.size());
  View1<float> rstd("rstd", N);
  rmsnorm_forward_portable<bf16>(ExecSpace(), out, rstd, kt::to_device(x), kt::to_device(w), N,
                                 C);
  const auto got = kt::to_host(out);
  const auto rs = kt::to_host(rstd);
  std::size_t other_order_differs = 0;
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) {
      const std::size_t i = std::size_t(n) * C + c;
      const float xr = static_cast<float>(x[i]) * rs[n];
      const bf16 hf = static_cast<bf16>(static_cast<float>(w[c]) *
                                        static_cast<float>(static_cast<bf16>(xr)));
      const bf16 once = static_cast<bf16>(static_cast<float>(w[c]) * xr);
      INFO("row " << n << " col " << c);
      REQUIRE(std::memcmp(&got[i], &hf, sizeof(bf16)) == 0);
      other_order_differs += std::memcmp(&hf, &once, sizeof(bf16)) != 0;
    }
  INFO("elements where the single-rounding order differs: " << other_order_differs);
  REQUIRE(other_order_differs > 0);
}
#endif

// ---------------------------------------------------------------------------------------------
// The dispatched kernels against the portable ones (the scheme of test_layernorm.cpp). On a
// CUDA build rmsnorm_forward/backward run the CUDA kernels for float and bf16 when C is a
// multiple of 16 / sizeof(T), and C <= 8192 for the backward; elsewhere the comparison is exact.
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

struct Tol {
  double rtol, atol_floor, atol_scale;
};
// float: sums in different orders, ~1e-7 relative; bf16: outputs rounded from fp32 values that
// agree to ~1e-6, at most 1 bf16 ulp (2^-8..2^-7 relative) apart; dweight sums N rows.
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
  const auto x = random_device<T>(NC, seed, -1.5, 2.5);
  const auto w = random_device<T>(C, seed + 1, 0.5, 1.5);
  const auto dout = random_device<T>(NC, seed + 3, -1.0, 1.0);
  const Tol tol = tolerance<T>();
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  ExecSpace exec;

  View1<T> out("out", NC), out_p("out_p", NC);
  Kokkos::deep_copy(out, nan);
  Kokkos::deep_copy(out_p, nan);
  auto rstd = kt::nan_view<float>(N), rstd_p = kt::nan_view<float>(N);
  const kt::Path fwd =
      kt::run_logged("rmsnorm_forward", [&] { rmsnorm_forward<T>(exec, out, rstd, x, w, N, C); });
  std::printf("rmsnorm_forward<%s> N=%d C=%d: %s path\n", type_name<T>(), N, C,
              kt::path_name(fwd));
  REQUIRE(fwd == expected_path<T>(C, false));
  rmsnorm_forward_portable<T>(exec, out_p, rstd_p, x, w, N, C);
  require_near(out, out_p, tol, "out");
  kt::require_close(kt::to_host(rstd), kt::to_host(rstd_p), 1e-5, 0.0, "rstd");

  // Backward twice from the portable forward's statistics, the dispatched outputs reset to the
  // portable ones between calls (the second call reuses the persistent scratch).
  auto dinp = random_device<T>(NC, seed + 4, -1.0, 1.0);
  auto dw = random_device<T>(C, seed + 5, -1.0, 1.0);
  auto dinp_p = copy_of(dinp), dw_p = copy_of(dw);
  for (int call = 0; call < 2; ++call) {
    INFO("backward call " << call);
    const kt::Path bwd = kt::run_logged("rmsnorm_backward", [&] {
      rmsnorm_backward<T>(exec, dinp, dw, dout, x, w, rstd_p, N, C);
    });
    if (call == 0)
      std::printf("rmsnorm_backward<%s> N=%d C=%d: %s path\n", type_name<T>(), N, C,
                  kt::path_name(bwd));
    REQUIRE(bwd == expected_path<T>(C, true));
    rmsnorm_backward_portable<T>(exec, dinp_p, dw_p, dout, x, w, rstd_p, N, C);
    require_near(dinp, dinp_p, tol, "dinp");
    require_near(dw, dw_p, tol, "dweight");
    Kokkos::deep_copy(dinp, dinp_p);
    Kokkos::deep_copy(dw, dw_p);
  }
}

// Llama widths (2048, 4096: 4096 float is past the register rows; 8192 at the backward's
// limit), one and several rows per backward warp, awkward C (96, 200, 36 not a multiple of 8
// bf16, 13 of nothing) and a row too long for the CUDA backward (8200).
const std::vector<std::pair<int, int>> kShapes = {
    {7, 768},  {300, 2048}, {3000, 768}, {33, 4096}, {9, 96}, {5, 200},
    {6, 36},   {4, 13},     {1, 8192},   {2, 8200}};

}  // namespace

TEST_CASE("rmsnorm dispatched kernels match the portable ones (float)",
          "[kernels][rmsnorm][dispatch]") {
  std::uint32_t seed = 100;
  for (const auto& [N, C] : kShapes) compare_with_portable<float>(N, C, seed += 10);
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("rmsnorm dispatched kernels match the portable ones (bf16)",
          "[kernels][rmsnorm][dispatch][bf16]") {
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
  const auto w = random_device<T>(C, 302, 0.5, 1.5);
  const auto dout = random_device<T>(NC, 304, -1.0, 1.0);
  const auto dinp0 = random_device<T>(NC, 305, -1.0, 1.0);
  const auto dw0 = random_device<T>(C, 306, -1.0, 1.0);
  ExecSpace exec;
  std::vector<T> first[3];
  std::vector<float> first_rstd;
  for (int run = 0; run < 2; ++run) {
    View1<T> out("out", NC);
    View1<float> rstd("rstd", N);
    rmsnorm_forward<T>(exec, out, rstd, x, w, N, C);
    auto dinp = copy_of(dinp0), dw = copy_of(dw0);
    rmsnorm_backward<T>(exec, dinp, dw, dout, x, w, rstd, N, C);
    const std::vector<T> got[3] = {kt::to_host(out), kt::to_host(dinp), kt::to_host(dw)};
    for (int k = 0; k < 3; ++k) {
      if (run == 0) first[k] = got[k];
      else REQUIRE(kt::bitwise_equal(got[k], first[k]));
    }
    if (run == 0) first_rstd = kt::to_host(rstd);
    else REQUIRE(kt::bitwise_equal(kt::to_host(rstd), first_rstd));
  }
}
}  // namespace

TEST_CASE("rmsnorm dispatched kernels are bitwise deterministic",
          "[kernels][rmsnorm][dispatch][determinism]") {
  require_deterministic<float>(5000, 768);
#if MESHTRAIN_HAVE_BF16
  require_deterministic<bf16>(5000, 768);
#endif
}

// ---------------------------------------------------------------------------------------------
// The FP8 amax fused into the forward (issue 35): rmsnorm_forward(..., amax) sets amax(0) to
// fp8_amax of out, for the dispatched kernels (the CUDA ones where they apply: register rows,
// rows past the registers, shapes they refuse) and the portable ones; an inf in out, a NaN, an
// all-zero input (out = 0) and no rows give inf, NaN, 0 and 0, over a stale amax.
namespace {

template <class T>
std::uint32_t rmsnorm_amax(int N, int C, const std::vector<T>& x, const std::vector<T>& w,
                           bool portable) {
  const std::size_t NC = std::size_t(N) * C;
  const auto xd = kt::to_device(x), wd = kt::to_device(w);
  View1<T> plain("plain", NC), fused("fused", NC);
  View1<float> rstd("rstd", N);
  return kt::require_fused_amax<T>(plain, fused, NC, [&](View1<T> out, View1<float> amax) {
    if (portable)
      rmsnorm_forward_portable<T>(ExecSpace(), out, rstd, xd, wd, N, C, 1e-5f, amax);
    else
      rmsnorm_forward<T>(ExecSpace(), out, rstd, xd, wd, N, C, 1e-5f, amax);
  });
}

template <class T>
void rmsnorm_amax_cases() {
  const std::vector<std::pair<int, int>> shapes = {{7, 768}, {33, 4096}, {1, 8192}, {6, 36},
                                                   {4, 13},  {2, 8200},  {0, 768}};
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  for (const bool portable : {false, true})
    for (const auto& [N, C] : shapes) {
      INFO(type_name<T>() << " N=" << N << " C=" << C << (portable ? " portable" : " dispatched"));
      const std::size_t NC = std::size_t(N) * C;
      const auto x = kt::convert<T>(kt::random_vector<float>(NC, 400 + C, -1.5, 2.5));
      const auto w = kt::convert<T>(kt::random_vector<float>(C, 401 + C, 0.5, 1.5));
      const std::uint32_t finite = rmsnorm_amax<T>(N, C, x, w, portable);
      if (N == 0) {
        REQUIRE(finite == 0);
        continue;
      }
      REQUIRE((finite > 0 && finite < kt::kInfBits));
      // x = 50 among values ~1 normalises to several times 1; times a weight of 3e38, that
      // overflows to inf (finite inputs, no NaN anywhere).
      auto xi = x, wi = w;
      xi[0] = static_cast<T>(50.0f);
      wi[0] = static_cast<T>(3e38f);
      REQUIRE(rmsnorm_amax<T>(N, C, xi, wi, portable) == kt::kInfBits);
      auto xn = x;
      xn[NC - 1] = nan;  // the last row's rstd and outputs are NaN
      REQUIRE(rmsnorm_amax<T>(N, C, xn, w, portable) > kt::kInfBits);
      REQUIRE(rmsnorm_amax<T>(N, C, std::vector<T>(NC, static_cast<T>(0.0f)), w, portable) == 0);
    }
}

}  // namespace

TEST_CASE("rmsnorm_forward's fused FP8 amax is fp8_amax of out (float)",
          "[kernels][rmsnorm][fp8][amax]") {
  rmsnorm_amax_cases<float>();
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("rmsnorm_forward's fused FP8 amax is fp8_amax of out (bf16)",
          "[kernels][rmsnorm][fp8][amax][bf16]") {
  rmsnorm_amax_cases<bf16>();
}
#endif
