// gemm (BLAS dispatch and the Kokkos reference) against a double host product; linear layer
// forward against host loops and backward against finite differences of its double instantiation.
#include "kernel_test_util.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/gemm/gemm_varying.hpp"
#include "meshtrain/kernels/linear.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

struct GemmCase {
  Trans ta, tb;
  int M, N, K;
  float alpha, beta;
};

// Stored A is (ta == N ? M x K : K x M) with row stride lda; element op(A)[i][k].
double op_at(const std::vector<double>& X, Trans t, int ld, int r, int c) {
  return t == Trans::N ? X[std::size_t(r) * ld + c] : X[std::size_t(c) * ld + r];
}

// Which entry point check_gemm_case calls.
enum class Path { gemm, reference, varying_m, varying_k };

template <class T>
void check_gemm_case(const GemmCase& g, Path path) {
  const int a_rows = g.ta == Trans::N ? g.M : g.K, a_cols = g.ta == Trans::N ? g.K : g.M;
  const int b_rows = g.tb == Trans::N ? g.K : g.N, b_cols = g.tb == Trans::N ? g.N : g.K;
  // Leading dimensions wider than the rows: the padding must be neither read nor written.
  const int lda = a_cols + 3, ldb = b_cols + 2, ldc = g.N + 5;
  const auto A = kt::random_vector<double>(std::size_t(a_rows) * lda, 11);
  const auto B = kt::random_vector<double>(std::size_t(b_rows) * ldb, 12);
  auto C0 = kt::random_vector<double>(std::size_t(g.M) * ldc, 13);
  const double sentinel = 12345.0;
  for (int i = 0; i < g.M; ++i)
    for (int j = g.N; j < ldc; ++j) C0[std::size_t(i) * ldc + j] = sentinel;
  // beta == 0: C must not be read (BLAS semantics), so poison it.
  if (g.beta == 0.0f)
    for (int i = 0; i < g.M; ++i)
      for (int j = 0; j < g.N; ++j) C0[std::size_t(i) * ldc + j] = std::nan("");

  std::vector<double> want(C0.size()), tol(C0.size());
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const std::size_t ij = std::size_t(i) * ldc + j;
      if (j >= g.N) {
        want[ij] = sentinel;
        continue;
      }
      double s = 0, mag = 0;
      for (int k = 0; k < g.K; ++k) {
        const double p = op_at(A, g.ta, lda, i, k) * op_at(B, g.tb, ldb, k, j);
        s += p;
        mag += std::fabs(p);
      }
      want[ij] = g.alpha * s + (g.beta != 0.0f ? g.beta * C0[ij] : 0.0);
      tol[ij] = std::fabs(g.alpha) * mag + (g.beta != 0.0f ? std::fabs(g.beta * C0[ij]) : 0.0);
    }

  auto dA = kt::to_device(kt::cast_vector<T>(A));
  auto dB = kt::to_device(kt::cast_vector<T>(B));
  auto dC = kt::to_device(kt::cast_vector<T>(C0));
  ExecSpace exec;
  if (path == Path::reference)
    gemm_reference<T>(exec, g.ta, g.tb, g.M, g.N, g.K, g.alpha, dA.data(), lda, dB.data(), ldb,
                      g.beta, dC.data(), ldc);
  else if (path == Path::gemm)
    gemm<T>(exec, g.ta, g.tb, g.M, g.N, g.K, g.alpha, dA.data(), lda, dB.data(), ldb, g.beta,
            dC.data(), ldc);
  else
    gemm_varying<T>(exec, path == Path::varying_m ? VaryingDim::M : VaryingDim::K, g.ta, g.tb,
                    g.M, g.N, g.K, g.alpha, dA.data(), lda, dB.data(), ldb, g.beta, dC.data(),
                    ldc);
  const auto got = kt::to_host(dC);
  const bool reference = path == Path::reference;
  // Error bound of a K-term dot product: ~K u sum|a b|. u = 6e-8 (float) and K <= 40 give
  // ~2.4e-6 relative to the magnitude sum; 1e-5 leaves margin (2 K u beyond). double: 1e-13.
  const double rel = std::is_same_v<T, float> ? std::max(1e-5, 2.0 * g.K * 6e-8) : 1e-13;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(double(got[i]) - want[i]) <= rel * tol[i] + 1e-30) continue;
    INFO("ta=" << (g.ta == Trans::N ? "N" : "T") << " tb=" << (g.tb == Trans::N ? "N" : "T")
               << " M=" << g.M << " N=" << g.N << " K=" << g.K << " beta=" << g.beta
               << " reference=" << reference << " element " << i << " got " << got[i]
               << " want " << want[i]);
    REQUIRE(false);
  }
}

}  // namespace

TEST_CASE("gemm and gemm_reference match a double host product", "[kernels][gemm]") {
  const Trans ops[] = {Trans::N, Trans::T};
  const int shapes[][3] = {{7, 5, 9}, {21, 37, 12}, {1, 13, 40}};
  const float ab[][2] = {{1.0f, 0.0f}, {0.7f, -1.3f}};
  for (Trans ta : ops)
    for (Trans tb : ops)
      for (const auto& s : shapes)
        for (const auto& c : ab) {
          const GemmCase g{ta, tb, s[0], s[1], s[2], c[0], c[1]};
          check_gemm_case<float>(g, Path::gemm);
          check_gemm_case<float>(g, Path::reference);
          check_gemm_case<double>(g, Path::gemm);
          check_gemm_case<double>(g, Path::reference);
        }
}

TEST_CASE("gemm_size_bucket: 64, then four buckets per octave", "[kernels][gemm]") {
  const int cases[][2] = {{0, 64},       {1, 64},       {64, 64},      {65, 80},
                          {100, 112},    {128, 128},    {129, 160},    {2048, 2048},
                          {2049, 2560},  {3299, 3584},  {3585, 4096},  {16384, 16384}};
  for (const auto& c : cases) {
    INFO("size " << c[0]);
    CHECK(gemm_size_bucket(c[0]) == c[1]);
  }
  for (int v = 1; v <= 5000; ++v) {
    const int b = gemm_size_bucket(v);
    REQUIRE(b >= v);
    REQUIRE(b <= std::max(64, v + v / 4));  // a bucket's end is within 25 % of its sizes
  }
}

// The MoE experts' GEMM (moe/grouped_gemm.cpp): the same products at sizes that share a bucket
// and sizes that do not, so that on CUDA a bucket's algorithm runs at sizes below its end.
TEST_CASE("gemm_varying matches a double host product across size buckets", "[kernels][gemm]") {
  const auto before = gemm_varying_counts();
  int calls = 0;
  const Trans ops[] = {Trans::N, Trans::T};
  for (Trans ta : ops)
    for (Trans tb : ops)
      for (int v : {1, 2, 3, 63, 65, 77, 80, 300, 513}) {
        // The rows vary (forward, input gradient) or the reduction does (weight gradient).
        check_gemm_case<float>(GemmCase{ta, tb, v, 24, 16, 1.0f, 0.0f}, Path::varying_m);
        check_gemm_case<float>(GemmCase{ta, tb, 32, 24, v, 1.0f, 1.0f}, Path::varying_k);
        check_gemm_case<double>(GemmCase{ta, tb, v, 8, 16, 0.7f, -1.3f}, Path::varying_m);
        calls += 3;
      }
  const auto after = gemm_varying_counts();
  CHECK(after.bucketed + after.plain - before.bucketed - before.plain == std::uint64_t(calls));
#if defined(KOKKOS_ENABLE_CUDA)
  // On CUDA the float calls with every dimension >= 2 take a bucket's cuBLASLt algorithm.
  CHECK(after.bucketed - before.bucketed >= 4 * 8 * 2);
#else
  CHECK(after.bucketed == before.bucketed);
#endif
}

TEST_CASE("gemm checks its extents", "[kernels][gemm]") {
  ExecSpace exec;
  auto A = kt::to_device(std::vector<float>(64, 1.0f));
  auto C = kt::to_device(std::vector<float>(64, 2.0f));
  float* a = A.data();
  float* c = C.data();
  REQUIRE_THROWS_AS(gemm<float>(exec, Trans::N, Trans::N, -1, 2, 2, 1, a, 2, a, 2, 0, c, 2),
                    meshtrain::Error);
  // A is 4 x 3 (N), lda must be >= 3.
  REQUIRE_THROWS_AS(gemm<float>(exec, Trans::N, Trans::N, 4, 2, 3, 1, a, 2, a, 2, 0, c, 2),
                    meshtrain::Error);
  // A transposed is stored 3 x 4: lda >= 4.
  REQUIRE_THROWS_AS(gemm<float>(exec, Trans::T, Trans::N, 4, 2, 3, 1, a, 3, a, 2, 0, c, 2),
                    meshtrain::Error);
  REQUIRE_THROWS_AS(gemm<float>(exec, Trans::N, Trans::N, 4, 2, 3, 1, a, 3, a, 2, 0, c, 1),
                    meshtrain::Error);
  REQUIRE_THROWS_AS(gemm<float>(exec, Trans::N, Trans::N, 4, 2, 3, 1, nullptr, 3, a, 2, 0, c, 2),
                    meshtrain::Error);
  REQUIRE_THROWS_AS(
      gemm_reference<float>(exec, Trans::N, Trans::T, 4, 2, 3, 1, a, 3, a, 2, 0, c, 2),
      meshtrain::Error);
  // Empty products are no-ops, null pointers allowed.
  gemm<float>(exec, Trans::N, Trans::N, 0, 2, 3, 1, nullptr, 3, nullptr, 2, 0, nullptr, 2);
  const auto h = kt::to_host(C);
  REQUIRE(h[0] == 2.0f);
}

TEST_CASE("linear_forward matches host loops, with and without bias", "[kernels][linear]") {
  const int N = 21, IC = 12, OC = 37;
  const auto x = kt::random_vector<float>(std::size_t(N) * IC, 1);
  const auto w = kt::random_vector<float>(std::size_t(IC) * OC, 2);
  const auto b = kt::random_vector<float>(OC, 3);
  ExecSpace exec;
  for (bool with_bias : {true, false}) {
    auto out = kt::nan_view<float>(std::size_t(N) * OC);
    linear_forward<float>(exec, out, kt::to_device(x), kt::to_device(w),
                          with_bias ? kt::to_device(b) : View1<float>(), N, IC, OC);
    std::vector<double> want(std::size_t(N) * OC);
    for (int n = 0; n < N; ++n)
      for (int o = 0; o < OC; ++o) {
        double s = with_bias ? b[o] : 0.0;
        for (int i = 0; i < IC; ++i) s += double(x[n * IC + i]) * w[i * OC + o];
        want[n * OC + o] = s;
      }
    // Entries are sums of 12 products of values in [-1, 1] (+ bias): 1e-5 absolute.
    kt::require_close(kt::to_host(out), want, 1e-5, 1e-5, with_bias ? "out (bias)" : "out");
  }
}

TEST_CASE("linear_backward matches finite differences (double)", "[kernels][linear]") {
  const int N = 7, IC = 5, OC = 6;
  auto x = kt::random_vector<double>(std::size_t(N) * IC, 21);
  auto w = kt::random_vector<double>(std::size_t(IC) * OC, 22);
  auto b = kt::random_vector<double>(OC, 23);
  const auto R = kt::random_vector<double>(std::size_t(N) * OC, 24);
  ExecSpace exec;
  auto objective = [&]() {
    View1<double> out("out", std::size_t(N) * OC);
    linear_forward<double>(exec, out, kt::to_device(x), kt::to_device(w), kt::to_device(b), N,
                           IC, OC);
    return kt::dot(kt::to_host(out), R);
  };
  // The layer is linear in each argument, so central differences are exact up to rounding
  // (~1e-16 |L| / eps): eps = 1e-3, tolerance 1e-9.
  const double eps = 1e-3;
  const auto fd_x = kt::fd_gradient(x, objective, eps);
  const auto fd_w = kt::fd_gradient(w, objective, eps);
  const auto fd_b = kt::fd_gradient(b, objective, eps);

  // dweight and dbias accumulate: start from non-zero values and check the increment.
  const auto w0 = kt::random_vector<double>(w.size(), 25);
  const auto b0 = kt::random_vector<double>(b.size(), 26);
  const auto x0 = kt::random_vector<double>(x.size(), 27);
  for (bool accumulate : {false, true}) {
    auto dinp = accumulate ? kt::to_device(x0) : kt::nan_view<double>(x.size());
    auto dw = kt::to_device(w0);
    auto db = kt::to_device(b0);
    linear_backward<double>(exec, dinp, dw, db, kt::to_device(R), kt::to_device(x),
                            kt::to_device(w), N, IC, OC, accumulate);
    const auto gx = kt::to_host(dinp);
    kt::require_close(accumulate ? kt::subtract(gx, x0) : gx, fd_x, 1e-9, 1e-9, "dinp");
    kt::require_close(kt::subtract(kt::to_host(dw), w0), fd_w, 1e-9, 1e-9, "dweight");
    kt::require_close(kt::subtract(kt::to_host(db), b0), fd_b, 1e-9, 1e-9, "dbias");
  }

  // Empty dinp and dbias are skipped; dweight still accumulates.
  auto dw = kt::to_device(w0);
  linear_backward<double>(exec, View1<double>(), dw, View1<double>(), kt::to_device(R),
                          kt::to_device(x), kt::to_device(w), N, IC, OC);
  kt::require_close(kt::subtract(kt::to_host(dw), w0), fd_w, 1e-9, 1e-9, "dweight (no bias)");
}
