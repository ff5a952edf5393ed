// gemm_ex / gemm_dbias and the linear layer built on them.
//  * gemm_ex against gemm_ex_reference for every epilogue, all four (ta, tb), odd and larger
//    shapes, beta 0 and 1 with C separate from D and C == D: on CUDA that is cuBLASLt (or its
//    fallback) against the Kokkos reference; on a host build the GEMM + epilogue pass against it.
//  * gemm_ex_reference against plain double loops on the host (the oracle proven).
//  * gemm_dbias and the linear_* functions against compositions of the unfused kernels
//    (gemm, gelu_forward / gelu_backward, host column sums), accumulation included.
#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "kernel_test_util.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/kernels/gelu.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/linear.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();
// Row padding: must be neither read into nor written. Exact in bf16 and fp16 (1.5 * 2^13), so
// the value read back equals it in every type.
constexpr double kSentinel = 12288.0;

// Host values -> T and back. bf16/fp16 go through float; the tests compare paths that see the
// same rounded inputs.
template <class T>
std::vector<T> to_t(const std::vector<double>& v) {
  std::vector<T> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, double>) r[i] = v[i];
    else r[i] = T(float(v[i]));
  }
  return r;
}
template <class T>
std::vector<double> widen(const std::vector<T>& v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    std::vector<double> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = double(static_cast<float>(v[i]));
    return r;
  }
}
template <class T>
View1<T> dev(const std::vector<double>& v) {
  return kt::to_device(to_t<T>(v));
}

double gelu_host(double x) {
  const double s = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}
double gelu_grad_host(double x) {
  const double s = std::sqrt(2.0 / M_PI), t = std::tanh(s * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * s * (1.0 + 3.0 * 0.044715 * x * x);
}

const char* name(Epilogue e) {
  switch (e) {
    case Epilogue::bias: return "bias";
    case Epilogue::gelu_bias: return "gelu_bias";
    case Epilogue::dgelu: return "dgelu";
    default: return "none";
  }
}

enum class CMode { none, separate, same };  // beta = 0 (C null); beta = 1 with C != D; C == D

struct ExCase {
  Trans ta, tb;
  int M, N, K;
  bool padded;  // row strides wider than the rows (padding checked untouched)
  Epilogue kind;
  CMode c;
  float alpha;
  std::string str() const {
    std::ostringstream os;
    os << (ta == Trans::N ? "N" : "T") << (tb == Trans::N ? "N" : "T") << " " << M << "x" << N
       << "x" << K << (padded ? " padded" : "") << " " << name(kind) << " C="
       << (c == CMode::none ? "none" : c == CMode::separate ? "separate" : "same")
       << " alpha=" << alpha;
    return os.str();
  }
};

// One problem's host data: stored shapes with their row strides.
struct ExData {
  int lda, ldb, ldc, ldd, ldaux;
  std::vector<double> A, B, C, bias, aux, D0;
};

ExData make_data(const ExCase& g, std::uint32_t seed) {
  const int pad = g.padded ? 3 : 0;
  ExData d;
  const int a_rows = g.ta == Trans::N ? g.M : g.K, a_cols = g.ta == Trans::N ? g.K : g.M;
  const int b_rows = g.tb == Trans::N ? g.K : g.N, b_cols = g.tb == Trans::N ? g.N : g.K;
  d.lda = a_cols + pad;
  d.ldb = b_cols + 2 * pad;
  d.ldd = g.N + pad;
  d.ldc = g.c == CMode::same ? d.ldd : g.N + 5 * pad / 3;
  d.ldaux = g.N + (g.padded ? 5 : 0);
  d.A = kt::random_vector<double>(std::size_t(a_rows) * d.lda, seed + 1);
  d.B = kt::random_vector<double>(std::size_t(b_rows) * d.ldb, seed + 2);
  d.C = kt::random_vector<double>(std::size_t(g.M) * d.ldc, seed + 3);
  d.bias = kt::random_vector<double>(g.N, seed + 4);
  // dgelu reads aux (pre-GELU values, where gelu' varies most); gelu_bias writes it (poisoned).
  d.aux = kt::random_vector<double>(std::size_t(g.M) * d.ldaux, seed + 5, -3.0, 3.0);
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < d.ldaux; ++j)
      if (j >= g.N) d.aux[std::size_t(i) * d.ldaux + j] = kSentinel;
      else if (g.kind == Epilogue::gelu_bias) d.aux[std::size_t(i) * d.ldaux + j] = kNaN;
  // D: NaN where the call must write (or C's values when C == D), sentinel in the padding.
  d.D0.assign(std::size_t(g.M) * d.ldd, kNaN);
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < d.ldd; ++j)
      if (j >= g.N) d.D0[std::size_t(i) * d.ldd + j] = kSentinel;
      else if (g.c == CMode::same)
        d.D0[std::size_t(i) * d.ldd + j] = d.C[std::size_t(i) * d.ldc + j];
  return d;
}

struct ExResult {
  std::vector<double> D, aux;
};

template <class T>
ExResult run_ex(const ExCase& g, const ExData& d, bool reference) {
  auto A = dev<T>(d.A), B = dev<T>(d.B), C = dev<T>(d.C), bias = dev<T>(d.bias);
  auto aux = dev<T>(d.aux), D = dev<T>(d.D0);
  GemmEpilogue<T> ep;
  ep.kind = g.kind;
  if (g.kind == Epilogue::bias || g.kind == Epilogue::gelu_bias) ep.bias = bias.data();
  if (g.kind == Epilogue::gelu_bias || g.kind == Epilogue::dgelu) {
    ep.aux = aux.data();
    ep.ldaux = d.ldaux;
  }
  const float beta = g.c == CMode::none ? 0.0f : 1.0f;
  const T* c = g.c == CMode::none ? nullptr : g.c == CMode::same ? D.data() : C.data();
  const int ldc = g.c == CMode::same ? d.ldd : d.ldc;
  auto fn = reference ? &gemm_ex_reference<T> : &gemm_ex<T>;
  fn(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.data(), d.lda, B.data(), d.ldb, beta, c,
     ldc, D.data(), d.ldd, ep);
  return {widen(kt::to_host(D)), widen(kt::to_host(aux))};
}

// The rows x cols block of got (row stride ld) within rel * max|want| of want; every element of
// it finite (written); the padding columns equal the sentinel. Returns max|got - want| / max|want|.
double require_block(const std::vector<double>& got, const std::vector<double>& want, int rows,
                     int cols, int ld, double rel, const std::string& what) {
  std::vector<double> g, w;
  double mx = 0, err = 0;
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < ld; ++j) {
      const std::size_t k = std::size_t(i) * ld + j;
      if (j >= cols) {
        INFO(what << ": padding (" << i << ", " << j << ") = " << got[k]);
        REQUIRE(got[k] == kSentinel);
        continue;
      }
      g.push_back(got[k]);
      w.push_back(want[k]);
      mx = std::max(mx, std::fabs(want[k]));
      err = std::max(err, std::fabs(got[k] - want[k]));
    }
  kt::require_close(g, w, 0.0, rel * mx + 1e-30, what);
  return mx > 0 ? err / mx : err;
}

// Worst error / max|ref| seen per epilogue, split by fused (cuBLASLt) and fallback calls.
struct ErrorTable {
  double fused[4] = {}, fallback[4] = {};
  void print(const char* type) const {
    std::printf("gemm_ex<%s> vs reference, worst |error| / max|ref| (fused / fallback):", type);
    for (int k = 0; k < 4; ++k)
      std::printf(" %s %.1e/%.1e", name(Epilogue(k)), fused[k], fallback[k]);
    std::printf("\n");
  }
};

// rel: the tolerance of the exact paths. cuBLASLt's GELU is the same tanh form but its tanh is
// not bit-exact (PyTorch and SGLang note "close but not bit-exact"; a hardware tanh.approx has
// ~2^-11 relative error): its GELU and GELU-gradient epilogues get 2e-3 of the largest |D|.
template <class T>
void check_ex_against_reference(const ExCase& g, double rel, ErrorTable& table) {
  INFO(g.str());
  const ExData d = make_data(g, 100);
  const GemmExCounts before = gemm_ex_counts();
  const ExResult got = run_ex<T>(g, d, false);
  const int k = static_cast<int>(g.kind);
  const bool fused = gemm_ex_counts().fused[k] > before.fused[k];
  INFO((fused ? "fused (cuBLASLt)" : "fallback"));
  const ExResult want = run_ex<T>(g, d, true);
  const bool gelu = g.kind == Epilogue::gelu_bias || g.kind == Epilogue::dgelu;
  const double tol = fused && gelu ? std::max(rel, 2e-3) : rel;
  double err = require_block(got.D, want.D, g.M, g.N, d.ldd, tol, "D");
  if (g.kind == Epilogue::gelu_bias)
    err = std::max(err, require_block(got.aux, want.aux, g.M, g.N, d.ldaux, rel, "aux"));
  double& worst = fused ? table.fused[k] : table.fallback[k];
  worst = std::max(worst, err);
}

std::vector<ExCase> all_cases() {
  std::vector<ExCase> cases;
  const Trans ops[] = {Trans::N, Trans::T};
  // Odd and padded (the fallback on CUDA: aux strides are not multiples of 8), and a larger
  // shape with tight strides, multiples of 8 (cuBLASLt's epilogues on CUDA).
  struct Shape {
    int M, N, K;
    bool padded;
  };
  const Shape shapes[] = {{37, 45, 29, true}, {256, 384, 192, false}};
  const Epilogue kinds[] = {Epilogue::none, Epilogue::bias, Epilogue::gelu_bias, Epilogue::dgelu};
  for (const Shape& s : shapes)
    for (Trans ta : ops)
      for (Trans tb : ops)
        for (Epilogue k : kinds)
          for (CMode c : {CMode::none, CMode::separate, CMode::same}) {
            if (k == Epilogue::dgelu && c != CMode::none) continue;  // dgelu takes beta = 0
            const float alpha = ta == tb ? 1.0f : 0.75f;
            cases.push_back({ta, tb, s.M, s.N, s.K, s.padded, k, c, alpha});
          }
  return cases;
}

}  // namespace

// Tolerances: fp32 products of values in [-1, 1] over K <= 192 terms differ between summation
// orders by a few ulp of the partial sums, ~1e-6 of the largest |D|: 1e-5. 16-bit outputs are
// rounded to 2^-9 (bf16) or 2^-12 (fp16) relative, and the fallback rounds the GEMM result once
// before its epilogue: 1e-2 of the largest |D|.
TEST_CASE("gemm_ex matches gemm_ex_reference for every epilogue", "[kernels][gemm_ex]") {
  ErrorTable table;
  for (const ExCase& g : all_cases()) check_ex_against_reference<float>(g, 1e-5, table);
  table.print("float");
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("gemm_ex matches gemm_ex_reference in bf16 and fp16", "[kernels][gemm_ex][bf16]") {
  ErrorTable t16, th;
  for (const ExCase& g : all_cases()) {
    check_ex_against_reference<bf16>(g, 1e-2, t16);
    check_ex_against_reference<fp16>(g, 1e-2, th);
  }
  t16.print("bf16");
  th.print("fp16");
}
#endif

// The reference itself against double loops on the host, in double (1e-12: only summation
// order differs) and float (1e-5 of the largest |D|, as above).
template <class T>
void check_reference_against_host(const ExCase& g, double rel) {
  INFO(g.str());
  const ExData d = make_data(g, 200);
  const ExResult got = run_ex<T>(g, d, true);
  // The host sees exactly the values the device got.
  const auto A = widen(to_t<T>(d.A)), B = widen(to_t<T>(d.B)), C = widen(to_t<T>(d.C));
  const auto bias = widen(to_t<T>(d.bias)), aux = widen(to_t<T>(d.aux));
  const double beta = g.c == CMode::none ? 0.0 : 1.0;
  std::vector<double> want_d = d.D0, want_aux = d.aux;
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < g.N; ++j) {
      double s = 0;
      for (int k = 0; k < g.K; ++k) {
        const std::size_t pa = g.ta == Trans::N ? std::size_t(i) * d.lda + k
                                                : std::size_t(k) * d.lda + i;
        const std::size_t pb = g.tb == Trans::N ? std::size_t(k) * d.ldb + j
                                                : std::size_t(j) * d.ldb + k;
        s += A[pa] * B[pb];
      }
      const int ldc = g.c == CMode::same ? d.ldd : d.ldc;
      double x = g.alpha * s + (beta != 0 ? beta * C[std::size_t(i) * ldc + j] : 0.0);
      const std::size_t ia = std::size_t(i) * d.ldaux + j;
      double v = x;
      if (g.kind == Epilogue::bias) v = x + bias[j];
      if (g.kind == Epilogue::gelu_bias) {
        want_aux[ia] = x + bias[j];
        v = gelu_host(x + bias[j]);
      }
      if (g.kind == Epilogue::dgelu) v = x * gelu_grad_host(aux[ia]);
      want_d[std::size_t(i) * d.ldd + j] = v;
    }
  require_block(got.D, want_d, g.M, g.N, d.ldd, rel, "D");
  if (g.kind == Epilogue::gelu_bias)
    require_block(got.aux, want_aux, g.M, g.N, d.ldaux, rel, "aux");
}

TEST_CASE("gemm_ex_reference matches double loops on the host", "[kernels][gemm_ex]") {
  for (const ExCase& g : all_cases()) {
    if (g.M > 64) continue;  // the odd, padded shape covers every branch; the large adds time
    check_reference_against_host<double>(g, 1e-12);
    check_reference_against_host<float>(g, 1e-5);
  }
}

TEST_CASE("gemm_ex checks its epilogue arguments", "[kernels][gemm_ex]") {
  ExecSpace exec;
  auto buf = kt::to_device(std::vector<float>(256, 1.0f));
  auto aux = kt::to_device(std::vector<float>(256, 1.0f));
  float* p = buf.data();
  const auto call = [&](float beta, const float* c, int ldc, const GemmEpilogue<float>& ep) {
    gemm_ex<float>(exec, Trans::N, Trans::N, 4, 4, 4, 1.0f, p, 4, p, 4, beta, c, ldc, p + 64, 4,
                   ep);
  };
  GemmEpilogue<float> ep;
  REQUIRE_THROWS_AS(call(1.0f, nullptr, 4, ep), meshtrain::Error);  // beta != 0 needs C
  REQUIRE_THROWS_AS(call(1.0f, p + 64, 8, ep), meshtrain::Error);   // C == D with ldc != ldd
  ep.kind = Epilogue::bias;
  REQUIRE_THROWS_AS(call(0.0f, nullptr, 4, ep), meshtrain::Error);  // bias without a pointer
  ep.kind = Epilogue::gelu_bias;
  REQUIRE_THROWS_AS(call(0.0f, nullptr, 4, ep), meshtrain::Error);  // no aux
  ep.aux = aux.data();
  ep.ldaux = 3;
  REQUIRE_THROWS_AS(call(0.0f, nullptr, 4, ep), meshtrain::Error);  // ldaux < N
  ep.ldaux = 4;
  ep.aux = p + 64;
  REQUIRE_THROWS_AS(call(0.0f, nullptr, 4, ep), meshtrain::Error);  // aux == D
  ep.aux = aux.data();
  call(0.0f, nullptr, 4, ep);
  ep.kind = Epilogue::dgelu;
  REQUIRE_THROWS_AS(call(1.0f, p, 4, ep), meshtrain::Error);  // dgelu with beta != 0
  call(0.0f, nullptr, 4, ep);
}

// gemm_dbias twice from a non-zero dbias: C follows C <- alpha A B + beta C each time and
// dbias gains the column sums of B each time (not scaled by alpha).
template <class T>
void check_dbias(Trans ta, int M, int N, int K, bool padded, float alpha, float beta,
                 double rel) {
  INFO((ta == Trans::N ? "N" : "T") << " " << M << "x" << N << "x" << K
                                    << (padded ? " padded" : "") << " alpha=" << alpha
                                    << " beta=" << beta);
  const int pad = padded ? 3 : 0;
  const int a_rows = ta == Trans::N ? M : K, lda = (ta == Trans::N ? K : M) + pad;
  const int ldb = N + 2 * pad, ldc = N + pad;
  const auto A = widen(to_t<T>(kt::random_vector<double>(std::size_t(a_rows) * lda, 31)));
  const auto B = widen(to_t<T>(kt::random_vector<double>(std::size_t(K) * ldb, 32)));
  const auto b0 = widen(to_t<T>(kt::random_vector<double>(N, 33)));
  auto C0 = widen(to_t<T>(kt::random_vector<double>(std::size_t(M) * ldc, 34)));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < ldc; ++j)
      if (j >= N) C0[std::size_t(i) * ldc + j] = kSentinel;
      else if (beta == 0.0f) C0[std::size_t(i) * ldc + j] = kNaN;  // not read
  auto dA = dev<T>(A), dB = dev<T>(B), dC = dev<T>(C0), db = dev<T>(b0);
  std::vector<double> want_c = C0, want_b = b0;
  for (int rep = 1; rep <= 2; ++rep) {
    gemm_dbias<T>(ExecSpace(), ta, M, N, K, alpha, dA.data(), lda, dB.data(), ldb, beta,
                  dC.data(), ldc, db.data());
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k)
          s += (ta == Trans::N ? A[std::size_t(i) * lda + k] : A[std::size_t(k) * lda + i]) *
               B[std::size_t(k) * ldb + j];
        double& c = want_c[std::size_t(i) * ldc + j];
        c = alpha * s + (beta != 0.0f ? beta * c : 0.0);
      }
    for (int j = 0; j < N; ++j)
      for (int k = 0; k < K; ++k) want_b[j] += B[std::size_t(k) * ldb + j];
    INFO("call " << rep);
    require_block(widen(kt::to_host(dC)), want_c, M, N, ldc, rel, "C");
    double mx = 0;
    for (double v : want_b) mx = std::max(mx, std::fabs(v));
    kt::require_close(widen(kt::to_host(db)), want_b, rel, rel * mx, "dbias");
  }
}

TEST_CASE("gemm_dbias: GEMM plus accumulated column sums of B", "[kernels][gemm_ex]") {
  // Each CUDA form forced in turn (the default times them and keeps the faster): the fused
  // bias-gradient epilogue, and GEMM + column sums (our kernel when N and ldb suit its 16-byte
  // loads, several 128-row chunks at K = 300, and at K = 1500 more chunks (12) than the second
  // stage's 8 warps, which then add unequal numbers of chunks; cuBLAS's GEMV for the padded odd
  // shape).
  for (DbiasForm form : {DbiasForm::epilogue, DbiasForm::split, DbiasForm::timed}) {
    set_gemm_dbias_form(form);
    INFO("form " << int(form));
    for (Trans ta : {Trans::N, Trans::T})
      for (float alpha : {1.0f, 0.5f})
        for (float beta : {0.0f, 1.0f}) {
          check_dbias<float>(ta, 37, 45, 29, true, alpha, beta, 1e-5);
          check_dbias<float>(ta, 64, 96, 128, false, alpha, beta, 1e-5);
          check_dbias<float>(ta, 24, 264, 300, false, alpha, beta, 1e-5);
          check_dbias<float>(ta, 16, 264, 1500, false, alpha, beta, 1e-5);
#if MESHTRAIN_HAVE_BF16
          check_dbias<bf16>(ta, 64, 96, 128, false, alpha, beta, 1e-2);
          check_dbias<bf16>(ta, 24, 264, 300, false, alpha, beta, 1e-2);
          check_dbias<bf16>(ta, 16, 264, 1500, false, alpha, beta, 1e-2);
#endif
        }
  }
  set_gemm_dbias_form(DbiasForm::timed);
}

// ---- linear layer, against the unfused kernels ----

namespace {

struct LinShape {
  int N, IC, OC;
};
// Multiples of 8 (cuBLASLt on CUDA) and odd sizes (the fallback there).
const LinShape kLinShapes[] = {{64, 48, 40}, {37, 29, 45}};

// GELU values and gradients (float) against gelu_forward / gelu_backward: every float path
// evaluates the same expressions (gelu_math.hpp; cuBLASLt's inexact GELU is never used for
// float), a few ulp: 1e-5.
constexpr double kGeluTol = 1e-5;

// Column sums of a [rows, cols] row-major host matrix.
std::vector<double> col_sums(const std::vector<double>& m, int rows, int cols) {
  std::vector<double> s(cols, 0.0);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < cols; ++j) s[j] += m[std::size_t(i) * cols + j];
  return s;
}

// out = x @ w by the plain gemm (the unfused building block).
View1<float> plain_matmul(View1<float> x, View1<float> w, int N, int IC, int OC) {
  auto out = kt::nan_view<float>(std::size_t(N) * OC);
  gemm<float>(ExecSpace(), Trans::N, Trans::N, N, OC, IC, 1.0f, x.data(), IC, w.data(), OC, 0.0f,
              out.data(), OC);
  return out;
}

}  // namespace

TEST_CASE("linear_forward: bias and residual fused, residual may be out", "[kernels][linear]") {
  for (const LinShape s : kLinShapes) {
    INFO("N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const std::size_t no = std::size_t(s.N) * s.OC;
    const auto x = kt::random_vector<float>(std::size_t(s.N) * s.IC, 1);
    const auto w = kt::random_vector<float>(std::size_t(s.IC) * s.OC, 2);
    const auto b = kt::random_vector<float>(s.OC, 3);
    const auto r = kt::random_vector<float>(no, 4);
    const auto xw = kt::to_host(plain_matmul(kt::to_device(x), kt::to_device(w), s.N, s.IC, s.OC));
    ExecSpace exec;
    std::vector<double> want(no);
    for (int mode = 0; mode < 4; ++mode) {  // bias x residual (mode 3: residual is out)
      const bool has_b = mode % 2 == 1, has_r = mode >= 2;
      auto out = has_r && mode == 3 ? kt::to_device(r) : kt::nan_view<float>(no);
      const View1<const float> res =
          mode == 2 ? kt::to_device(r) : mode == 3 ? out : View1<float>();
      linear_forward<float>(exec, out, kt::to_device(x), kt::to_device(w),
                            has_b ? kt::to_device(b) : View1<float>(), res, s.N, s.IC, s.OC);
      for (std::size_t i = 0; i < no; ++i)
        want[i] = double(xw[i]) + (has_b ? b[i % s.OC] : 0.0) + (has_r ? r[i] : 0.0);
      INFO("bias=" << has_b << " residual=" << has_r << (mode == 3 ? " (in place)" : ""));
      // Sums of <= 48 products of values in [-1, 1]: 1e-5 absolute.
      kt::require_close(kt::to_host(out), want, 1e-5, 1e-5, "out");
    }
  }
}

TEST_CASE("linear_gelu_forward equals linear_forward then gelu_forward", "[kernels][linear]") {
  for (const LinShape s : kLinShapes) {
    INFO("N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const std::size_t no = std::size_t(s.N) * s.OC;
    const auto x = kt::to_device(kt::random_vector<float>(std::size_t(s.N) * s.IC, 5, -2, 2));
    const auto w = kt::to_device(kt::random_vector<float>(std::size_t(s.IC) * s.OC, 6));
    const auto b = kt::to_device(kt::random_vector<float>(s.OC, 7));
    ExecSpace exec;
    auto pre_ref = kt::nan_view<float>(no), gelu_ref = kt::nan_view<float>(no);
    linear_forward<float>(exec, pre_ref, x, w, b, s.N, s.IC, s.OC);
    gelu_forward<float>(exec, gelu_ref, pre_ref, no);
    auto pre = kt::nan_view<float>(no), out = kt::nan_view<float>(no);
    linear_gelu_forward<float>(exec, out, pre, x, w, b, s.N, s.IC, s.OC);
    kt::require_close(kt::to_host(pre), kt::to_host(pre_ref), 1e-5, 1e-5, "pre_gelu");
    kt::require_close(kt::to_host(out), kt::to_host(gelu_ref), kGeluTol, kGeluTol, "gelu");
  }
}

// dweight and dbias accumulate: two calls from non-zero starting values add twice.
TEST_CASE("linear_backward and linear_backward_dgelu against the unfused kernels",
          "[kernels][linear]") {
  for (const LinShape s : kLinShapes) {
    INFO("N=" << s.N << " IC=" << s.IC << " OC=" << s.OC);
    const int N = s.N, IC = s.IC, OC = s.OC;
    const auto dout_h = kt::random_vector<float>(std::size_t(N) * OC, 11);
    const auto pre_h = kt::random_vector<float>(std::size_t(N) * IC, 12, -3, 3);
    const auto w_h = kt::random_vector<float>(std::size_t(IC) * OC, 13);
    const auto w0 = kt::random_vector<float>(std::size_t(IC) * OC, 14);
    const auto b0 = kt::random_vector<float>(OC, 15);
    ExecSpace exec;
    const auto dout = kt::to_device(dout_h), pre = kt::to_device(pre_h), w = kt::to_device(w_h);
    auto inp = kt::nan_view<float>(std::size_t(N) * IC);  // inp = gelu(pre), as in the MLP
    gelu_forward<float>(exec, inp, pre, std::size_t(N) * IC);

    // Unfused: dx = dout @ w^T (gemm), dpre = gelu_backward(pre, dx); dW = inp^T dout (gemm).
    auto dx = kt::nan_view<float>(std::size_t(N) * IC), dpre_ref = kt::nan_view<float>(dx.size());
    gemm<float>(exec, Trans::N, Trans::T, N, IC, OC, 1.0f, dout.data(), OC, w.data(), OC, 0.0f,
                dx.data(), IC);
    gelu_backward<float>(exec, dpre_ref, pre, dx, std::size_t(N) * IC);
    auto dw_inc = kt::to_device(std::vector<float>(std::size_t(IC) * OC, 0.0f));
    gemm<float>(exec, Trans::T, Trans::N, IC, OC, N, 1.0f, inp.data(), IC, dout.data(), OC, 0.0f,
                dw_inc.data(), OC);
    const auto dw1 = kt::to_host(dw_inc);
    const auto db1 = col_sums(std::vector<double>(dout_h.begin(), dout_h.end()), N, OC);
    std::vector<double> want_w(w0.size()), want_b(OC);

    for (bool dgelu : {false, true}) {
      INFO((dgelu ? "linear_backward_dgelu" : "linear_backward"));
      auto dw = kt::to_device(w0), db = kt::to_device(b0);
      for (int rep = 1; rep <= 2; ++rep) {
        INFO("call " << rep);
        auto d = kt::nan_view<float>(std::size_t(N) * IC);
        if (dgelu)
          linear_backward_dgelu<float>(exec, d, dw, db, dout, inp, w, pre, N, IC, OC);
        else
          linear_backward<float>(exec, d, dw, db, dout, inp, w, N, IC, OC);
        const double tol = dgelu ? kGeluTol : 1e-5;
        kt::require_close(kt::to_host(d), kt::to_host(dgelu ? dpre_ref : dx), tol, tol,
                          dgelu ? "dpre" : "dinp");
        for (std::size_t i = 0; i < w0.size(); ++i) want_w[i] = w0[i] + rep * double(dw1[i]);
        for (int o = 0; o < OC; ++o) want_b[o] = b0[o] + rep * db1[o];
        // Sums of N <= 64 products / terms of values in [-1.2, 1.2]: 1e-5 relative.
        kt::require_close(kt::to_host(dw), want_w, 1e-5, 1e-5, "dweight");
        kt::require_close(kt::to_host(db), want_b, 1e-5, 1e-5, "dbias");
      }
    }

    // The previous layer's bias gradient fused into the dgelu GEMM: dbias_pre accumulates the
    // column sums of d(pre-GELU), call after call, and nothing else changes.
    const auto dpre_h = kt::to_host(dpre_ref);
    const auto dbp = col_sums(std::vector<double>(dpre_h.begin(), dpre_h.end()), N, IC);
    const auto bp0 = kt::random_vector<float>(IC, 16);
    auto dw = kt::to_device(w0), db = kt::to_device(b0), dbias_pre = kt::to_device(bp0);
    std::vector<double> want_bp(IC);
    for (int rep = 1; rep <= 2; ++rep) {
      INFO("linear_backward_dgelu with dbias_pre, call " << rep);
      auto d = kt::nan_view<float>(std::size_t(N) * IC);
      linear_backward_dgelu<float>(exec, d, dw, db, dout, inp, w, pre, N, IC, OC, dbias_pre);
      kt::require_close(kt::to_host(d), dpre_h, kGeluTol, kGeluTol, "dpre");
      for (int i = 0; i < IC; ++i) want_bp[i] = bp0[i] + rep * dbp[i];
      // Column sums of N <= 64 values of d(pre-GELU), each within kGeluTol of the reference's.
      kt::require_close(kt::to_host(dbias_pre), want_bp, 64 * kGeluTol, 64 * kGeluTol,
                        "dbias_pre");
    }
    // dbias_pre without dpre has nothing to sum: refused, not ignored.
    REQUIRE_THROWS_AS(linear_backward_dgelu<float>(exec, View1<float>{}, dw, db, dout, inp, w,
                                                   pre, N, IC, OC, dbias_pre),
                      meshtrain::Error);
  }
}

// On CUDA the point of gemm_ex is that the linear layer's epilogues run inside cuBLASLt: this
// fails, naming the epilogue, if one of them fell back for the layer's own layouts (a GPT-2
// shape with strides that are multiples of 8). Host builds have no fused path at all. float
// keeps GELU and its gradient out of cuBLASLt on purpose (its tanh is not exact to fp32, and
// fp32 mode must match the PyTorch fixtures tightly): those two fall back for float only.
template <class T>
void check_linear_layer_fusion() {
  const int N = 128, IC = 64, OC = 256;
  ExecSpace exec;
  const auto x = kt::to_device(kt::random_vector<T>(std::size_t(N) * IC, 41));
  const auto w1 = kt::to_device(kt::random_vector<T>(std::size_t(IC) * OC, 42));
  const auto b1 = kt::to_device(kt::random_vector<T>(OC, 43));
  const auto w2 = kt::to_device(kt::random_vector<T>(std::size_t(OC) * IC, 44));
  const auto b2 = kt::to_device(kt::random_vector<T>(IC, 45));
  auto pre = kt::nan_view<T>(std::size_t(N) * OC), h = kt::nan_view<T>(pre.size());
  auto y = kt::nan_view<T>(std::size_t(N) * IC);
  auto dy = kt::to_device(kt::random_vector<T>(y.size(), 46));
  auto dh = kt::nan_view<T>(pre.size()), dx = kt::nan_view<T>(x.size());
  const auto zeros = [](std::size_t n) { return kt::to_device(std::vector<T>(n, T(0.0f))); };
  auto dw1 = zeros(w1.size()), db1 = zeros(OC), dw2 = zeros(w2.size()), db2 = zeros(IC);

  const GemmExCounts before = gemm_ex_counts();
  linear_gelu_forward<T>(exec, h, pre, x, w1, b1, N, IC, OC);          // gelu_bias
  linear_forward<T>(exec, y, h, w2, b2, View1<T>(x), N, OC, IC);   // bias + residual
  linear_backward_dgelu<T>(exec, dh, dw2, db2, dy, h, w2, pre, N, OC, IC);  // dgelu, dbias
  linear_backward<T>(exec, dx, dw1, db1, dh, x, w1, N, IC, OC);        // dbias
  exec.fence();
  const GemmExCounts after = gemm_ex_counts();
  // The dgelu GEMM with the previous layer's bias gradient (GPT-2's MLP backward) is fused too.
  linear_backward_dgelu<T>(exec, dh, dw2, db2, dy, h, w2, pre, N, OC, IC, db1);
  exec.fence();
  const GemmExCounts after_dbias_pre = gemm_ex_counts();
  {
    const bool exact_gelu = std::is_same_v<T, float>;
    const auto fused = after_dbias_pre.fused[3] - after.fused[3];
    const auto fallback = after_dbias_pre.fallback[3] - after.fallback[3];
    INFO("dgelu with dbias_pre: fused " << fused << ", fallback " << fallback);
    REQUIRE(fused + fallback == 1);
    REQUIRE(fused == (kDeviceIsHost || exact_gelu ? 0u : 1u));
  }
  const char* kinds[] = {"none", "bias", "gelu_bias", "dgelu", "dbias"};
  std::printf("gemm_ex calls of the linear layer (fused / fallback):");
  for (int k = 0; k < 5; ++k)
    std::printf(" %s %llu/%llu", kinds[k],
                static_cast<unsigned long long>(after.fused[k] - before.fused[k]),
                static_cast<unsigned long long>(after.fallback[k] - before.fallback[k]));
  std::printf("\n");
  for (int k : {1, 2, 3, 4}) {
    INFO("epilogue " << kinds[k] << ": fused " << after.fused[k] - before.fused[k]
                     << ", fallback " << after.fallback[k] - before.fallback[k]);
    const bool exact_gelu = std::is_same_v<T, float> && (k == 2 || k == 3);
    if (kDeviceIsHost || exact_gelu) {
      REQUIRE(after.fused[k] == before.fused[k]);
      REQUIRE(after.fallback[k] > before.fallback[k]);
    } else {
      REQUIRE(after.fallback[k] == before.fallback[k]);
      REQUIRE(after.fused[k] > before.fused[k]);
    }
  }
}

TEST_CASE("the linear layer's epilogues run fused on CUDA", "[kernels][gemm_ex]") {
  check_linear_layer_fusion<float>();
#if MESHTRAIN_HAVE_BF16
  check_linear_layer_fusion<bf16>();
#endif
}
