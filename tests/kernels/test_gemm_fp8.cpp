// The emulated FP8 GEMM (kernels/gemm/gemm_fp8.hpp) against an fp64 GEMM of the dequantized
// operands (decode(q) * scale_inv in double): every transpose form tensorwise, the TN form
// rowwise, E4M3 x E4M3 and E5M2 x E4M3 (gradient x weight), beta = 0 (C poisoned) and beta != 0,
// a padded ldc. Also the quantization error against the unquantized product, as a sanity bound.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

struct Case {
  Trans ta, tb;
  int M, N, K;
  Fp8Format fa, fb;
  Fp8Scaling sa, sb;
  bool a_transposed;  // A quantized with a transposed cast (tensorwise only)
  float alpha, beta;
};

// A quantized operand whose stored matrix is [sr, sc]; x is the source [rows, cols] it came from.
struct Operand {
  std::vector<float> x;  // source, row-major
  Fp8Tensor q;
  std::vector<double> deq;  // stored matrix, dequantized in double
};

Operand make_operand(int rows, int cols, Fp8Format f, Fp8Scaling s, bool transposed,
                     std::uint32_t seed) {
  Operand o;
  o.x = kt::random_vector<float>(std::size_t(rows) * cols, seed, -3.0, 3.0);
  // A few rows of a different magnitude, so rowwise scales differ.
  for (int r = 0; r < rows; r += 3)
    for (int c = 0; c < cols; ++c) o.x[std::size_t(r) * cols + c] *= 0.01f;
  o.q = make_fp8_tensor("operand", rows, cols, f, s, transposed);
  fp8_quantize<float>(ExecSpace(), o.q, kt::to_device(o.x));
  const auto codes = kt::to_host(o.q.data);
  const auto sinv = kt::to_host(o.q.scale_inv);
  o.deq.resize(codes.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const std::size_t src = std::size_t(r) * cols + c;
      const std::size_t st = transposed ? std::size_t(c) * rows + r : src;
      o.deq[st] = double(fp8_decode(codes[st], f)) * double(sinv[s == Fp8Scaling::rowwise ? r : 0]);
    }
  return o;
}

double op_at(const std::vector<double>& X, Trans t, int ld, int r, int c) {
  return t == Trans::N ? X[std::size_t(r) * ld + c] : X[std::size_t(c) * ld + r];
}

void check_case(const Case& g) {
  INFO("ta=" << (g.ta == Trans::N ? "N" : "T") << " tb=" << (g.tb == Trans::N ? "N" : "T")
             << " M=" << g.M << " N=" << g.N << " K=" << g.K << " A " << fp8_format_name(g.fa)
             << " " << fp8_scaling_name(g.sa) << (g.a_transposed ? " (transposed cast)" : "")
             << " B " << fp8_format_name(g.fb) << " " << fp8_scaling_name(g.sb) << " alpha "
             << g.alpha << " beta " << g.beta);
  // Stored shapes; with a transposed cast, A's source is the transpose of its stored matrix.
  const int a_sr = g.ta == Trans::N ? g.M : g.K, a_sc = g.ta == Trans::N ? g.K : g.M;
  const int b_sr = g.tb == Trans::N ? g.K : g.N, b_sc = g.tb == Trans::N ? g.N : g.K;
  const Operand A = g.a_transposed ? make_operand(a_sc, a_sr, g.fa, g.sa, true, 41)
                                   : make_operand(a_sr, a_sc, g.fa, g.sa, false, 41);
  const Operand B = make_operand(b_sr, b_sc, g.fb, g.sb, false, 42);
  // The unquantized stored matrices, for the quantization-error bound.
  std::vector<double> xa(A.deq.size()), xb(B.x.begin(), B.x.end());
  for (int r = 0; r < a_sr; ++r)
    for (int c = 0; c < a_sc; ++c)
      xa[std::size_t(r) * a_sc + c] =
          g.a_transposed ? A.x[std::size_t(c) * a_sr + r] : A.x[std::size_t(r) * a_sc + c];

  const int ldc = g.N + 3;
  const float sentinel = 777.0f;
  auto c0 = kt::random_vector<float>(std::size_t(g.M) * ldc, 43);
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < ldc; ++j)
      if (j >= g.N) c0[std::size_t(i) * ldc + j] = sentinel;
      else if (g.beta == 0.0f) c0[std::size_t(i) * ldc + j] = std::nanf("");  // must not be read
  View1<float> C = kt::to_device(c0);
  gemm_fp8_emulated<float>(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.q, B.q, g.beta,
                           C.data(), ldc);
  const auto got = kt::to_host(C);

  std::vector<double> want(got.size()), tol(got.size());
  double q_err = 0, q_mag = 0;  // quantization error against the unquantized product
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const std::size_t ij = std::size_t(i) * ldc + j;
      if (j >= g.N) {
        want[ij] = sentinel;
        continue;
      }
      double s = 0, mag = 0, exact = 0;
      for (int k = 0; k < g.K; ++k) {
        const double p = op_at(A.deq, g.ta, a_sc, i, k) * op_at(B.deq, g.tb, b_sc, k, j);
        s += p;
        mag += std::fabs(p);
        exact += op_at(xa, g.ta, a_sc, i, k) * op_at(xb, g.tb, b_sc, k, j);
      }
      const double c = g.beta != 0.0f ? double(c0[ij]) : 0.0;
      want[ij] = g.alpha * s + g.beta * c;
      // fp32 accumulation over K and the fp32 scale product: a few ulps of the magnitude.
      tol[ij] = 1e-5 * (std::fabs(g.alpha) * mag + std::fabs(g.beta * c)) + 1e-30;
      q_err = std::max(q_err, std::fabs(g.alpha * s - g.alpha * exact));
      q_mag = std::max(q_mag, std::fabs(g.alpha) * mag);
    }
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << " got " << got[i] << " want " << want[i] << " tol " << tol[i]);
    REQUIRE(std::fabs(double(got[i]) - want[i]) <= tol[i]);
  }
  // Each operand element is off by at most a relative 2^-(M+1) (plus subnormal steps):
  // E4M3 x E4M3 within ~2 * 2^-4, with E5M2 ~2^-3 + 2^-4, of the magnitude.
  const double bound = (g.fa == Fp8Format::e5m2 || g.fb == Fp8Format::e5m2) ? 0.2 : 0.14;
  REQUIRE(q_err <= bound * q_mag);
}

}  // namespace

TEST_CASE("gemm_fp8_emulated equals an fp64 GEMM of the dequantized operands", "[fp8][gemm]") {
  const auto tw = Fp8Scaling::tensorwise, rw = Fp8Scaling::rowwise;
  const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  for (Trans ta : {Trans::N, Trans::T})
    for (Trans tb : {Trans::N, Trans::T}) {
      check_case({ta, tb, 13, 17, 29, e4, e4, tw, tw, false, 1.0f, 0.0f});
      check_case({ta, tb, 8, 5, 64, e5, e4, tw, tw, false, 0.5f, 1.0f});
    }
  // Rowwise: the TN form (A [M, K], B [N, K]), as the forward linear y = x W^T.
  check_case({Trans::N, Trans::T, 19, 11, 48, e4, e4, rw, rw, false, 1.0f, 0.0f});
  check_case({Trans::N, Trans::T, 7, 9, 33, e5, e4, rw, tw, false, 2.0f, 0.5f});
  check_case({Trans::N, Trans::T, 7, 9, 33, e4, e4, tw, rw, false, 1.0f, 0.0f});
  // A from a transposed cast (the backward's K-contiguous copy): stored [M, K] read with ta = N,
  // and stored [K, M] read with ta = T.
  check_case({Trans::N, Trans::N, 12, 10, 20, e5, e4, tw, tw, true, 1.0f, 0.0f});
  check_case({Trans::T, Trans::N, 12, 10, 20, e5, e4, tw, tw, true, 1.0f, 0.0f});
}

TEST_CASE("gemm_fp8_emulated refuses shapes and rowwise layouts it cannot scale", "[fp8][gemm]") {
  const Fp8Tensor a = make_fp8_tensor("a", 4, 8, Fp8Format::e4m3, Fp8Scaling::rowwise);
  const Fp8Tensor b = make_fp8_tensor("b", 8, 6, Fp8Format::e4m3, Fp8Scaling::rowwise);
  View1<float> c("c", 4 * 6);
  // B stored [K, N] rowwise: its scales run along K, not along op(B)'s columns.
  REQUIRE_THROWS_WITH(gemm_fp8_emulated<float>(ExecSpace(), Trans::N, Trans::N, 4, 6, 8, 1.0f,
                                               a, b, 0.0f, c.data(), 6),
                      mt_test::contains("rowwise B"));
  // A's stored shape does not fit M x K.
  REQUIRE_THROWS_WITH(gemm_fp8_emulated<float>(ExecSpace(), Trans::N, Trans::N, 5, 6, 8, 1.0f,
                                               a, b, 0.0f, c.data(), 6),
                      mt_test::contains("A is stored [4, 8]"));
}

// gemm_fp8, the dispatch, against gemm_fp8_emulated on the same quantized operands. Host builds
// run the emulation: the results must be bit-identical and cuBLASLt never counted. CUDA builds
// must run cuBLASLt's FP8 matmul for the tensorwise TN forms (gemm_fp8_cublaslt_calls counts it,
// so a silent fallback fails) and the forms it cannot serve must fall back; rowwise may go
// either way (outer-vector scaling needs cuBLAS >= 12.9 on Hopper), as may an N that is not a
// multiple of 16: those are checked on whichever path ran, and the path is reported.
namespace {

enum class Path { cublaslt, emulated, either };

struct DCase {
  int M, N, K;
  Fp8Format fa, fb;
  Fp8Scaling sa, sb;
  bool b_transposed;  // B stored [N, K] from a transposed cast of [K, N] (linear's weight)
  float alpha, beta;
  Path on_cuda;  // which path a CUDA build must take (host builds always emulate)
  Trans ta = Trans::N, tb = Trans::T;
  // gemm_fp8's C/D form: D (poisoned where written) from a C only read, against the emulation
  // in place; C must come back unchanged.
  bool separate_d = false;
  bool varying = false;  // through gemm_fp8_varying (in place): plans per size bucket of M
};

// The tolerance of a CUDA result, relative to S = |alpha| sum_k |a_k b_k| + |beta c| (operands
// dequantized). Both paths accumulate in fp32 but in different orders, and Hopper's FP8 tensor
// cores add a group of products with fewer bits than fp32 (around 14, DeepSeek-V3 report §3.3.2)
// before cuBLASLt promotes the partial sum into fp32 (FAST_ACCUM off): 2^-10 of S covers that
// with margin and still fails any wrong scale, format, layout or operand swap, which err by O(S).
// The largest ratio seen is printed, so a GPU run says how close to fp32 rounding it really is.
constexpr double kCudaRel = 1.0 / 1024;

double bf16_ulp(double v) {
  const double a = std::fabs(v);
  if (!(a > 0)) return 0x1p-133;  // smallest bf16 subnormal step
  return std::ldexp(1.0, std::ilogb(a) - 7);  // 8 significant bits
}

template <class T>
void check_dispatch(const DCase& g) {
  const bool is_f32 = std::is_same_v<T, float>;
  INFO((g.varying ? "gemm_fp8_varying " : "gemm_fp8 ") << (is_f32 ? "fp32" : "bf16") << " ta=" << (g.ta == Trans::N ? "N" : "T")
                   << " tb=" << (g.tb == Trans::N ? "N" : "T") << " M=" << g.M << " N=" << g.N
                   << " K=" << g.K << " A " << fp8_format_name(g.fa) << " "
                   << fp8_scaling_name(g.sa) << " B " << fp8_format_name(g.fb) << " "
                   << fp8_scaling_name(g.sb) << (g.b_transposed ? " (transposed cast)" : "")
                   << " alpha " << g.alpha << " beta " << g.beta);
  const int a_sr = g.ta == Trans::N ? g.M : g.K, a_sc = g.ta == Trans::N ? g.K : g.M;
  const int b_sr = g.tb == Trans::N ? g.K : g.N, b_sc = g.tb == Trans::N ? g.N : g.K;
  const Operand A = make_operand(a_sr, a_sc, g.fa, g.sa, false, 51);
  const Operand B = g.b_transposed ? make_operand(b_sc, b_sr, g.fb, g.sb, true, 52)
                                   : make_operand(b_sr, b_sc, g.fb, g.sb, false, 52);
  // Row padding of 16 bytes keeps ldc * sizeof(T) a multiple of 16; the pad holds a sentinel.
  const int ldc = g.N + int(16 / sizeof(T));
  const float sentinel = 777.0f;
  auto c0f = kt::random_vector<float>(std::size_t(g.M) * ldc, 53, -4.0, 4.0);
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < ldc; ++j)
      if (j >= g.N) c0f[std::size_t(i) * ldc + j] = sentinel;
      else if (g.beta == 0.0f) c0f[std::size_t(i) * ldc + j] = std::nanf("");  // must not be read
  const std::vector<T> c0 = kt::convert<T>(c0f);
  View1<T> c_emu = kt::to_device(c0), c_got = kt::to_device(c0);
  gemm_fp8_emulated<T>(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.q, B.q, g.beta,
                       c_emu.data(), ldc);
  const int calls = gemm_fp8_cublaslt_calls();
  if (g.separate_d) {
    std::vector<float> d0f = c0f;
    for (int i = 0; i < g.M; ++i)
      for (int j = 0; j < g.N; ++j) d0f[std::size_t(i) * ldc + j] = std::nanf("");
    c_got = kt::to_device(kt::convert<T>(d0f));
    const View1<T> c_in = kt::to_device(c0);
    gemm_fp8<T>(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.q, B.q, g.beta, c_in.data(),
                ldc, c_got.data(), ldc);
    const auto c_after = kt::convert<float>(kt::to_host(c_in));
    REQUIRE(std::memcmp(c_after.data(), kt::convert<float>(c0).data(),
                        c_after.size() * sizeof(float)) == 0);
  } else if (g.varying) {
    gemm_fp8_varying<T>(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.q, B.q, g.beta,
                        c_got.data(), ldc, c_got.data(), ldc);
  } else {
    gemm_fp8<T>(ExecSpace(), g.ta, g.tb, g.M, g.N, g.K, g.alpha, A.q, B.q, g.beta, c_got.data(),
                ldc);
  }
  const bool ran_lt = gemm_fp8_cublaslt_calls() == calls + 1;
  REQUIRE(gemm_fp8_cublaslt_calls() - calls <= 1);
  const auto emu = kt::convert<float>(kt::to_host(c_emu));
  const auto got = kt::convert<float>(kt::to_host(c_got));

#if defined(KOKKOS_ENABLE_CUDA)
  if (g.on_cuda == Path::cublaslt) REQUIRE(ran_lt);
  if (g.on_cuda == Path::emulated) REQUIRE_FALSE(ran_lt);
  if (g.on_cuda == Path::either)
    WARN("this case ran " << (ran_lt ? "cuBLASLt" : "the emulation"));
#else
  REQUIRE_FALSE(ran_lt);
#endif
  double worst = 0;  // max |got - emu| / S over the elements
  for (int i = 0; i < g.M; ++i)
    for (int j = 0; j < ldc; ++j) {
      const std::size_t ij = std::size_t(i) * ldc + j;
      INFO("element (" << i << ", " << j << ") got " << got[ij] << " emulated " << emu[ij]);
      if (j >= g.N || !ran_lt) {
        // The pad is untouched; and where both ran the emulation, they agree bit for bit.
        REQUIRE(std::memcmp(&got[ij], &emu[ij], sizeof(float)) == 0);
        continue;
      }
      double mag = 0;
      for (int k = 0; k < g.K; ++k)
        mag += std::fabs(op_at(A.deq, g.ta, a_sc, i, k) * op_at(B.deq, g.tb, b_sc, k, j));
      // beta = 0 never reads C (poisoned with NaN to prove it): 0 * NaN must not enter the bound.
      const double c_term = g.beta != 0.0f ? std::fabs(g.beta * double(c0f[ij])) : 0.0;
      const double s = std::fabs(g.alpha) * mag + c_term;
      const double err = std::fabs(double(got[ij]) - double(emu[ij]));
      // bf16: each result rounds once from values kCudaRel * s apart: one ulp of the larger.
      const double ulp =
          is_f32 ? 0.0 : bf16_ulp(std::max(std::fabs(double(got[ij])), std::fabs(double(emu[ij]))));
      REQUIRE(err <= kCudaRel * s + ulp + 1e-30);
      if (s > 0) worst = std::max(worst, std::max(0.0, err - ulp) / s);
    }
  if (ran_lt) WARN("cuBLASLt FP8: max |got - emulated| / sum|terms| = " << worst);
}

template <class T>
void check_dispatch_cases() {
  const auto tw = Fp8Scaling::tensorwise, rw = Fp8Scaling::rowwise;
  const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  const auto lt = Path::cublaslt, emu = Path::emulated, any = Path::either;
  // Tensorwise TN: M and N not multiples of 16 (37), K and the row strides multiples of 16.
  check_dispatch<T>({37, 48, 64, e4, e4, tw, tw, false, 1.0f, 0.0f, lt});
  check_dispatch<T>({37, 48, 64, e4, e4, tw, tw, false, 1.0f, 1.0f, lt});
  check_dispatch<T>({37, 48, 64, e5, e4, tw, tw, false, 1.0f, 0.0f, lt});  // gradient x weight
  // N = 40, not a multiple of 16 (cuBLASLt's m): the docs' 16-byte rule is on the leading
  // dimensions, PyTorch's scaled_mm still refuses such N; either path, checked and reported.
  check_dispatch<T>({37, 40, 64, e4, e4, tw, tw, false, 1.0f, 1.0f, any});
  check_dispatch<T>({256, 384, 512, e4, e4, tw, tw, false, 0.5f, 1.0f, lt});
  // B from a transposed cast, stored [N, K]: linear_fp8's weight; K-contiguous as stored.
  check_dispatch<T>({256, 384, 512, e5, e4, tw, tw, true, 1.0f, 0.0f, lt});
  // Rowwise A and B: outer-vector scaling where cuBLASLt has it.
  check_dispatch<T>({37, 48, 64, e4, e4, rw, rw, false, 1.0f, 0.0f, any});
  check_dispatch<T>({256, 384, 512, e5, e4, rw, rw, false, 1.0f, 1.0f, any});
  // What cuBLASLt does not serve, emulated: one operand rowwise and the other not (outer-vector
  // mode is for both), E5M2 x E5M2, K not a multiple of 16, and a form that is not TN.
  check_dispatch<T>({37, 48, 64, e4, e4, rw, tw, false, 1.0f, 1.0f, emu});
  check_dispatch<T>({37, 48, 64, e5, e5, tw, tw, false, 1.0f, 0.0f, emu});
  check_dispatch<T>({37, 48, 40, e4, e4, tw, tw, false, 1.0f, 0.0f, emu});
  check_dispatch<T>({37, 48, 64, e4, e4, tw, tw, false, 1.0f, 0.0f, emu, Trans::N, Trans::N});
  // D apart from C (the FP8 row-parallel linear's residual as C): served as in place.
  const Trans n = Trans::N, t = Trans::T;
  check_dispatch<T>({256, 384, 512, e4, e4, tw, tw, true, 1.0f, 1.0f, lt, n, t, true});
  check_dispatch<T>({37, 48, 64, e4, e4, rw, rw, false, 1.0f, 1.0f, any, n, t, true});
  check_dispatch<T>({37, 48, 64, e4, e4, tw, tw, false, 1.0f, 1.0f, emu, n, n, true});
}

// gemm_fp8_varying: one plan per size bucket of M (gemm_size_bucket: 64, 80, 96, 112, 128, 160,
// ... 320), made for the bucket's upper end and then used for every M in it, smaller ones first
// and last, the first call of a bucket with M below its end, and M = 1. Each must run cuBLASLt on
// CUDA (tensorwise; rowwise where outer-vector scaling exists) and equal the emulation as
// gemm_fp8 does; the expert GEMMs' forms: x [M, K] x W^T (E4M3 x E4M3) and dy [M, N] x W
// (E5M2 x E4M3, W a transposed cast), beta 0 and 1.
template <class T>
void check_varying_cases() {
  const auto tw = Fp8Scaling::tensorwise, rw = Fp8Scaling::rowwise;
  const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;
  const auto lt = Path::cublaslt, any = Path::either;
  const Trans n = Trans::N, t = Trans::T;
  for (const int M : {37, 64, 1, 65, 80, 70, 300, 257})
    check_dispatch<T>({M, 48, 64, e4, e4, tw, tw, false, 1.0f, 0.0f, lt, n, t, false, true});
  for (const int M : {70, 33, 96})
    check_dispatch<T>({M, 384, 512, e5, e4, tw, tw, true, 1.0f, 1.0f, lt, n, t, false, true});
  for (const int M : {37, 5, 64})
    check_dispatch<T>({M, 48, 64, e4, e4, rw, rw, false, 1.0f, 0.0f, any, n, t, false, true});
}

}  // namespace

TEST_CASE("gemm_fp8_varying serves every M of a size bucket with the bucket's plan",
          "[fp8][gemm]") {
  SECTION("fp32 output") { check_varying_cases<float>(); }
#if MESHTRAIN_HAVE_BF16
  SECTION("bf16 output") { check_varying_cases<bf16>(); }
#endif
}

TEST_CASE("gemm_fp8 checks the contract before choosing a path", "[fp8][gemm]") {
  const Fp8Tensor a = make_fp8_tensor("a", 4, 16, Fp8Format::e4m3, Fp8Scaling::tensorwise);
  const Fp8Tensor b = make_fp8_tensor("b", 16, 8, Fp8Format::e4m3, Fp8Scaling::rowwise);
  View1<float> c("c", 4 * 8);
  // B stored [K, N] rowwise: its scales run along K, not along op(B)'s columns.
  REQUIRE_THROWS_WITH(gemm_fp8<float>(ExecSpace(), Trans::N, Trans::N, 4, 8, 16, 1.0f, a, b,
                                      0.0f, c.data(), 8),
                      mt_test::contains("gemm_fp8: rowwise B"));
  // The TN form cuBLASLt would serve, with row strides of C shorter than N.
  const Fp8Tensor bt = make_fp8_tensor("bt", 8, 16, Fp8Format::e4m3, Fp8Scaling::tensorwise);
  REQUIRE_THROWS_WITH(gemm_fp8<float>(ExecSpace(), Trans::N, Trans::T, 4, 8, 16, 1.0f, a, bt,
                                      0.0f, c.data(), 7),
                      mt_test::contains("gemm_fp8: ldc=7 < N=8"));
}

TEST_CASE("gemm_fp8 equals gemm_fp8_emulated and runs cuBLASLt where it serves", "[fp8][gemm]") {
  SECTION("fp32 output") { check_dispatch_cases<float>(); }
#if MESHTRAIN_HAVE_BF16
  SECTION("bf16 output") { check_dispatch_cases<bf16>(); }
#endif
}
