// The experts' FP8 GEMMs (moe/grouped_gemm.hpp's ExpertFp8) against a host reference that
// quantizes as they do — each token's row of x (E4M3) and of dy (E5M2) under its own scale,
// each expert's weight under one scale per output column (forward) or per input row (input
// gradient) — with products summed in double; and the properties the layouts rely on: a token's
// output and input gradient are the same bits whatever other rows its expert holds (ep changes
// those), and the weight gradient is the model's type's GEMM, bit for bit. Host builds run the
// FP8 emulation; CUDA builds cuBLASLt through gemm_fp8_varying, bucket by bucket.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/kernel_test_util.hpp"
#include "meshtrain/core/error.hpp"
#include "meshtrain/core/fp8.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"
#include "meshtrain/moe/grouped_gemm.hpp"

using namespace meshtrain;
using namespace meshtrain::moe;
using meshtrain::Fp8Format;

namespace {

// decode(encode(v * s)) / s, the value an FP8 GEMM reads for v under scale s.
double quant(double v, float s, Fp8Format f) {
  return double(fp8_decode(fp8_encode(float(v) * s, f), f)) / double(s);
}

// Fake-quantizes `count` vectors of `len` elements, vector i at base + i * step, element j at
// + j * stride: one scale (fp8_max / amax) per vector.
void quant_vectors(const std::vector<float>& in, std::vector<double>& out, std::size_t base,
                   int count, std::size_t step, int len, std::size_t stride, Fp8Format f) {
  for (int i = 0; i < count; ++i) {
    float amax = 0;
    for (int j = 0; j < len; ++j)
      amax = std::max(amax, std::fabs(in[base + i * step + j * stride]));
    const float s = kernels::fp8_scale_from_amax(amax, f);
    for (int j = 0; j < len; ++j) {
      const std::size_t at = base + i * step + j * stride;
      out[at] = quant(in[at], s, f);
    }
  }
}

// The reference's tolerance, relative to sum |products|: the emulation (host builds) sums exact
// products in fp32; cuBLASLt's FP8 tensor cores add groups of products with fewer bits before
// promoting into fp32 (test_gemm_fp8's kCudaRel, which measured up to 4.7e-4 on the H100).
#if defined(KOKKOS_ENABLE_CUDA)
constexpr double kRel = 1.0 / 1024;
#else
constexpr double kRel = 1e-5;
#endif

struct Grouped {
  std::vector<float> y, dx, dw;
};

// One forward and backward through the grouped GEMMs, dw starting from dw0.
Grouped run(const std::vector<std::int64_t>& off, const std::vector<float>& x,
            const std::vector<float>& w, const std::vector<float>& dy,
            const std::vector<float>& dw0, int K, int Nout, std::size_t stride, bool fp8) {
  const std::int64_t M = off.back();
  const ExpertFp8 f{fp8, nullptr};
  auto y = kt::nan_view<float>(std::size_t(M) * Nout);
  auto dx = kt::nan_view<float>(std::size_t(M) * K);
  auto dw = kt::to_device(dw0);
  const auto xd = kt::to_device(x), wd = kt::to_device(w), dyd = kt::to_device(dy);
  grouped_linear_forward<float>(ExecSpace(), off, xd, wd, y, K, Nout, stride, f);
  grouped_linear_backward<float>(ExecSpace(), off, dyd, xd, wd, dx, dw, K, Nout, stride, f);
  return {kt::to_host(y), kt::to_host(dx), kt::to_host(dw)};
}

}  // namespace

TEST_CASE("FP8 experts: rowwise casts per token, the weight gradient in the model's type",
          "[moe][gemm][fp8]") {
  // Four experts: 5 rows, none, 70 (a size bucket of its own on CUDA), 3; weights 48 floats
  // apart beyond their K x Nout (the registry's alignment).
  const int K = 32, Nout = 48;
  const std::vector<std::int64_t> off{0, 5, 5, 75, 78};
  const int E = 4;
  const std::int64_t M = off.back();
  const std::size_t each = std::size_t(K) * Nout, stride = each + 48;
  const auto x = kt::random_vector<float>(std::size_t(M) * K, 11, -2.0, 2.0);
  auto w = kt::random_vector<float>(std::size_t(E - 1) * stride + each, 12, -0.5, 0.5);
  const auto dy = kt::random_vector<float>(std::size_t(M) * Nout, 13, -1e-3, 1e-3);
  const auto dw0 = kt::random_vector<float>(w.size(), 14);
  // One large entry per expert weight, so that per-column and per-tensor scales differ.
  for (int e = 0; e < E; ++e) w[std::size_t(e) * stride + 7] = 40.0f;

  const Grouped f8 = run(off, x, w, dy, dw0, K, Nout, stride, true);
  const Grouped ref = run(off, x, w, dy, dw0, K, Nout, stride, false);

  // The host reference: y = Q_row(x) . Q_col(W) and dx = Q_row(dy) . Q_row(W)^T, per expert.
  std::vector<double> xq(x.size()), dyq(dy.size()), wq_fwd(w.size()), wq_bwd(w.size());
  quant_vectors(x, xq, 0, int(M), K, K, 1, Fp8Format::e4m3);
  quant_vectors(dy, dyq, 0, int(M), Nout, Nout, 1, Fp8Format::e5m2);
  for (int e = 0; e < E; ++e) {
    const std::size_t b = std::size_t(e) * stride;
    quant_vectors(w, wq_fwd, b, Nout, 1, K, Nout, Fp8Format::e4m3);  // column o over i
    quant_vectors(w, wq_bwd, b, K, Nout, Nout, 1, Fp8Format::e4m3);  // row i over o
  }
  for (int e = 0; e < E; ++e)
    for (std::int64_t r = off[e]; r < off[e + 1]; ++r) {
      const std::size_t b = std::size_t(e) * stride;
      for (int o = 0; o < Nout; ++o) {
        double want = 0, mag = 0;
        for (int i = 0; i < K; ++i) {
          const double p = xq[r * K + i] * wq_fwd[b + std::size_t(i) * Nout + o];
          want += p;
          mag += std::fabs(p);
        }
        INFO("y expert " << e << " row " << r << " column " << o);
        REQUIRE(std::fabs(f8.y[r * Nout + o] - want) <= kRel * mag + 1e-30);
      }
      for (int i = 0; i < K; ++i) {
        double want = 0, mag = 0;
        for (int o = 0; o < Nout; ++o) {
          const double p = dyq[r * Nout + o] * wq_bwd[b + std::size_t(i) * Nout + o];
          want += p;
          mag += std::fabs(p);
        }
        INFO("dx expert " << e << " row " << r << " input " << i);
        REQUIRE(std::fabs(f8.dx[r * K + i] - want) <= kRel * mag + 1e-30);
      }
    }
  // The FP8 path ran (it differs from the model's type) ...
  REQUIRE(f8.y != ref.y);
  REQUIRE(f8.dx != ref.dx);
  // ... and the weight gradient is the model's type's GEMM: the same bits, the padding between
  // experts and the expert without rows left as they were.
  REQUIRE(f8.dw == ref.dw);
  for (std::size_t i = each; i < stride; ++i) REQUIRE(f8.dw[i] == dw0[i]);
  for (std::size_t i = 0; i < each; ++i) REQUIRE(f8.dw[stride + i] == dw0[stride + i]);
}

TEST_CASE("FP8 experts: a token's results do not depend on the other rows of its expert",
          "[moe][gemm][fp8]") {
  // Expert 0 holding rows 0-69 (as at ep 2, two ranks' tokens at once) and holding rows 0-29
  // only (one rank's): rows 0-29 of y and dx are the same values but for the GEMM's fp32
  // summation, which a BLAS may order differently at another M (1e-6 of the row's magnitude).
  // A tensorwise scale over the expert's rows would move them by FP8 steps (2^-4 relative): the
  // largest |x| and |dy| are placed in rows 30-69.
  const int K = 32, Nout = 48;
  const std::size_t each = std::size_t(K) * Nout;
  auto x = kt::random_vector<float>(70 * std::size_t(K), 21, -1.0, 1.0);
  auto dy = kt::random_vector<float>(70 * std::size_t(Nout), 22, -1.0, 1.0);
  x[50 * K + 3] = 100.0f;
  dy[60 * Nout + 5] = 100.0f;
  const auto w = kt::random_vector<float>(2 * each, 23, -0.5, 0.5);
  const auto dw0 = kt::random_vector<float>(2 * each, 24);
  const Grouped all = run({0, 70, 70}, x, w, dy, dw0, K, Nout, 0, true);
  const std::vector<float> x30(x.begin(), x.begin() + 30 * K);
  const std::vector<float> dy30(dy.begin(), dy.begin() + 30 * Nout);
  const Grouped part = run({0, 30, 30}, x30, w, dy30, dw0, K, Nout, 0, true);
  const auto same_rows = [](const std::vector<float>& a, const std::vector<float>& b, int rows,
                            int cols) {
    for (int r = 0; r < rows; ++r) {
      double mag = 0;
      for (int c = 0; c < cols; ++c) mag = std::max(mag, std::fabs(double(b[r * cols + c])));
      for (int c = 0; c < cols; ++c) {
        INFO("row " << r << " column " << c << ": " << a[r * cols + c] << " against "
                    << b[r * cols + c]);
        REQUIRE(std::fabs(double(a[r * cols + c]) - b[r * cols + c]) <= 1e-6 * mag);
      }
    }
  };
  same_rows(part.y, all.y, 30, Nout);
  same_rows(part.dx, all.dx, 30, K);
}

TEST_CASE("FP8 experts need float or bf16 rows", "[moe][gemm][fp8]") {
  const std::vector<std::int64_t> off{0, 2};
  View1<double> x("x", 2 * 16), w("w", 16 * 16), y("y", 2 * 16);
  REQUIRE_THROWS_AS(grouped_linear_forward<double>(ExecSpace(), off, x, w, y, 16, 16, 0,
                                                   ExpertFp8{true, nullptr}),
                    ConfigError);
}
