// FP8 current-scaling casts (kernels/fp8_cast.hpp) against host loops: amax (tensorwise,
// rowwise, accumulated; NaN and inf reported), scales (amax 0 -> 1), the cast (tensorwise,
// rowwise, transposed), dequantization, the whole quantize with its agreement hook, and the
// block forms (in place, the scale made in the cast).
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kFltMax = std::numeric_limits<float>::max();

// max |x| on the host, NaN if any NaN.
float host_amax(const std::vector<float>& x, std::size_t lo = 0, std::size_t hi = SIZE_MAX) {
  float m = 0;
  hi = std::min(hi, x.size());
  for (std::size_t i = lo; i < hi; ++i) {
    if (std::isnan(x[i])) return kNaN;
    m = std::max(m, std::fabs(x[i]));
  }
  return m;
}

float host_scale(float amax, Fp8Format f) {
  if (amax == 0.0f || !std::isfinite(amax)) return 1.0f;
  const float s = fp8_max(f) / amax;
  return std::isinf(s) ? kFltMax : s;
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

float device_amax(const std::vector<float>& x) {
  View1<float> a = kt::to_device(std::vector<float>{-5.0f});
  fp8_amax<float>(ExecSpace(), a, kt::to_device(x), x.size());
  return kt::to_host(a)[0];
}

// Data with a spread of magnitudes (so some elements fall into FP8's subnormals after scaling).
std::vector<float> spread(std::size_t n, std::uint32_t seed, double scale = 1.0) {
  auto u = kt::random_vector<double>(n, seed, -1.0, 1.0);
  auto e = kt::random_vector<double>(n, seed + 1, -14.0, 0.0);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = float(scale * u[i] * std::exp2(e[i]));
  return x;
}

}  // namespace

TEST_CASE("fp8_amax equals the host maximum magnitude and reports inf and NaN", "[fp8]") {
  for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(1000), std::size_t(100003)}) {
    const auto x = spread(n, 7 + std::uint32_t(n), 3.0);
    INFO("n=" << n);
    REQUIRE(device_amax(x) == host_amax(x));
  }
  auto x = spread(4097, 3);
  x[17] = -1234.5f;  // the largest magnitude is negative
  REQUIRE(device_amax(x) == 1234.5f);
  x[4000] = -kInf;
  REQUIRE(device_amax(x) == kInf);
  x[99] = kNaN;
  REQUIRE(std::isnan(device_amax(x)));
  x[4000] = 0.0f;
  REQUIRE(std::isnan(device_amax(x)));
  x[99] = -kNaN;  // a NaN with the sign bit set is NaN too
  REQUIRE(std::isnan(device_amax(x)));
  REQUIRE(device_amax(std::vector<float>(100, -0.0f)) == 0.0f);

  // Accumulated over several tensors: the running maximum, NaN kept once seen.
  View1<float> run = kt::to_device(std::vector<float>{0.0f});
  const auto a = spread(300, 11, 2.0), b = spread(500, 12, 9.0), c = spread(50, 13, 0.5);
  for (const auto* v : {&a, &b, &c})
    fp8_amax<float>(ExecSpace(), run, kt::to_device(*v), v->size(), true);
  REQUIRE(kt::to_host(run)[0] == std::max({host_amax(a), host_amax(b), host_amax(c)}));
  fp8_amax<float>(ExecSpace(), run, kt::to_device(std::vector<float>{1.0f, kNaN}), 2, true);
  fp8_amax<float>(ExecSpace(), run, kt::to_device(b), b.size(), true);
  REQUIRE(std::isnan(kt::to_host(run)[0]));
}

TEST_CASE("fp8_amax_rows equals per-row host maxima; a bad row spoils only itself", "[fp8]") {
  const int rows = 37, cols = 129;
  auto x = spread(std::size_t(rows) * cols, 21, 4.0);
  x[5 * cols + 3] = kInf;
  x[9 * cols + 100] = kNaN;
  x[11 * cols + 0] = -kInf;
  x[11 * cols + 1] = kNaN;
  View1<float> amax = kt::nan_view<float>(rows);
  fp8_amax_rows<float>(ExecSpace(), amax, kt::to_device(x), rows, cols);
  const auto got = kt::to_host(amax);
  for (int r = 0; r < rows; ++r) {
    INFO("row " << r);
    REQUIRE(same(got[r], host_amax(x, std::size_t(r) * cols, std::size_t(r + 1) * cols)));
  }
  REQUIRE(got[5] == kInf);
  REQUIRE(std::isnan(got[9]));
  REQUIRE(std::isnan(got[11]));
  // Empty rows have amax 0.
  View1<float> a0 = kt::nan_view<float>(3);
  fp8_amax_rows<float>(ExecSpace(), a0, View1<const float>(), 3, 0);
  REQUIRE(kt::to_host(a0) == std::vector<float>(3, 0.0f));
}

TEST_CASE("fp8_scales: fp8_max / amax, 1 for zero or non-finite amax", "[fp8]") {
  const std::vector<float> amax{0.0f, 1.0f, 2.0f, 3.0f, 448.0f, 1e-3f, 7e4f, 1e-38f, 1e-45f,
                                kInf, kNaN, 3e38f};
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    View1<float> s("s", amax.size()), si("si", amax.size());
    fp8_scales(ExecSpace(), kt::to_device(amax), s, si, amax.size(), f);
    const auto hs = kt::to_host(s), hsi = kt::to_host(si);
    for (std::size_t i = 0; i < amax.size(); ++i) {
      INFO(fp8_format_name(f) << " amax " << amax[i]);
      REQUIRE(hs[i] == host_scale(amax[i], f));
      REQUIRE(hs[i] == fp8_scale_from_amax(amax[i], f));
      REQUIRE(hsi[i] == 1.0f / hs[i]);
      REQUIRE(std::isfinite(hs[i]));
      REQUIRE(hsi[i] > 0.0f);
    }
    REQUIRE(hs[0] == 1.0f);
    REQUIRE(hsi[0] == 1.0f);
  }
  REQUIRE(fp8_scale_from_amax(2.0f, Fp8Format::e4m3) == 224.0f);
  REQUIRE(fp8_scale_from_amax(2.0f, Fp8Format::e5m2) == 28672.0f);
  REQUIRE(fp8_scale_from_amax(1e-45f, Fp8Format::e4m3) == kFltMax);
}

TEST_CASE("fp8_cast and fp8_dequantize match host loops, tensorwise, rowwise, transposed",
          "[fp8]") {
  // 23 x 67: every tile of the transposed cast partial; 70 x 100: full 32 x 32 tiles too.
  for (const auto& [rows, cols] : {std::pair{23, 67}, std::pair{70, 100}}) {
    const std::size_t n = std::size_t(rows) * cols;
    const auto x = spread(n, 31, 10.0);
    const auto dx = kt::to_device(x);
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
      for (Fp8Scaling sc : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise})
        for (bool tr : {false, true}) {
          if (tr && sc == Fp8Scaling::rowwise) continue;
          INFO(rows << " x " << cols << " " << fp8_format_name(f) << " " << fp8_scaling_name(sc)
                    << (tr ? " transposed" : ""));
          Fp8Tensor q = make_fp8_tensor("q", rows, cols, f, sc, tr);
          fp8_quantize<float>(ExecSpace(), q, dx);
          const std::size_t ns = q.scale_count();
          const auto amax = kt::to_host(q.amax), scale = kt::to_host(q.scale),
                     sinv = kt::to_host(q.scale_inv);
          const auto codes = kt::to_host(q.data);
          REQUIRE(amax.size() == ns);
          std::vector<float> want_scale(ns);
          for (std::size_t s = 0; s < ns; ++s) {
            const float a = ns == 1 ? host_amax(x) : host_amax(x, s * cols, (s + 1) * cols);
            REQUIRE(amax[s] == a);
            want_scale[s] = host_scale(a, f);
            REQUIRE(scale[s] == want_scale[s]);
            REQUIRE(sinv[s] == 1.0f / want_scale[s]);
          }
          float max_code_seen = 0;
          for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) {
              const std::size_t i = std::size_t(r) * cols + c;
              const std::size_t o = tr ? std::size_t(c) * rows + r : i;
              const float s = want_scale[ns == 1 ? 0 : r];
              REQUIRE(codes[o] == fp8_encode(x[i] * s, f));
              max_code_seen = std::max(max_code_seen, std::fabs(fp8_decode(codes[o], f)));
              // Quantization error: half an FP8 step (relative 2^-(M+1) for normals, half the
              // smallest subnormal below), in units of the input.
              const double fm = f == Fp8Format::e4m3 ? 3 : 2;
              const double emin = f == Fp8Format::e4m3 ? -6 : -14;
              const double deq = double(fp8_decode(codes[o], f)) / s;
              const double tol = std::max(std::fabs(double(x[i])) * std::exp2(-fm - 1),
                                          std::exp2(emin - fm - 1) / s);
              REQUIRE(std::fabs(deq - x[i]) <= tol * (1 + 1e-6));
            }
          // The largest magnitude lands on the format's maximum.
          REQUIRE(max_code_seen == fp8_max(f));
          if (tr) continue;
          View1<float> back = kt::nan_view<float>(n);
          fp8_dequantize<float>(ExecSpace(), back, q.data, rows, cols, q.scale_inv, sc, f);
          const auto hb = kt::to_host(back);
          for (std::size_t i = 0; i < n; ++i)
            REQUIRE(hb[i] == fp8_decode(codes[i], f) * sinv[ns == 1 ? 0 : i / cols]);
        }
  }
}

TEST_CASE("fp8 all-zero tensors: scale 1, zero codes, zeros back", "[fp8]") {
  const int rows = 4, cols = 33;
  const std::size_t n = std::size_t(rows) * cols;
  for (Fp8Scaling sc : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise}) {
    Fp8Tensor q = make_fp8_tensor("zero", rows, cols, Fp8Format::e4m3, sc);
    fp8_quantize<float>(ExecSpace(), q, kt::to_device(std::vector<float>(n, 0.0f)));
    for (float v : kt::to_host(q.amax)) REQUIRE(v == 0.0f);
    for (float v : kt::to_host(q.scale)) REQUIRE(v == 1.0f);
    for (float v : kt::to_host(q.scale_inv)) REQUIRE(v == 1.0f);
    for (auto c : kt::to_host(q.data)) REQUIRE(c == 0);
    View1<float> back = kt::nan_view<float>(n);
    fp8_dequantize<float>(ExecSpace(), back, q.data, rows, cols, q.scale_inv, sc, q.format);
    REQUIRE(kt::to_host(back) == std::vector<float>(n, 0.0f));
  }
}

TEST_CASE("fp8 casts of non-finite tensors: the amax tells, inf saturates, NaN stays", "[fp8]") {
  std::vector<float> x{1.0f, -2.0f, kInf, 0.5f, -kInf, 3.0f};
  Fp8Tensor q = make_fp8_tensor("inf", 1, 6, Fp8Format::e4m3, Fp8Scaling::tensorwise);
  fp8_quantize<float>(ExecSpace(), q, kt::to_device(x));
  REQUIRE(kt::to_host(q.amax)[0] == kInf);
  REQUIRE(kt::to_host(q.scale)[0] == 1.0f);
  auto codes = kt::to_host(q.data);
  REQUIRE(codes[2] == 0x7e);  // +448
  REQUIRE(codes[4] == 0xfe);  // -448
  REQUIRE(codes[0] == fp8_encode(1.0f, Fp8Format::e4m3));
  x[3] = kNaN;
  fp8_quantize<float>(ExecSpace(), q, kt::to_device(x));
  REQUIRE(std::isnan(kt::to_host(q.amax)[0]));
  REQUIRE(kt::to_host(q.scale)[0] == 1.0f);
  codes = kt::to_host(q.data);
  REQUIRE(std::isnan(fp8_decode(codes[3], Fp8Format::e4m3)));
}

TEST_CASE("fp8_quantize calls the agreement hook between amax and scales", "[fp8]") {
  const std::vector<float> x{0.25f, -0.5f, 1.0f, 0.125f};
  Fp8Tensor q = make_fp8_tensor("hook", 2, 2, Fp8Format::e4m3, Fp8Scaling::rowwise);
  std::size_t seen = 0;
  // Stands in for the group's maximum: a peer whose rows reach 4.
  fp8_quantize<float>(ExecSpace(), q, kt::to_device(x), [&](View1<float> amax, std::size_t count) {
    seen = count;
    Kokkos::deep_copy(amax, 4.0f);
  });
  REQUIRE(seen == 2);
  REQUIRE(kt::to_host(q.scale) == std::vector<float>{112.0f, 112.0f});
  const auto codes = kt::to_host(q.data);
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(codes[i] == fp8_encode(x[i] * 112.0f, Fp8Format::e4m3));
  REQUIRE_THROWS_WITH(make_fp8_tensor("bad", 2, 2, Fp8Format::e4m3, Fp8Scaling::rowwise, true),
                      mt_test::contains("tensorwise"));
}

// The block forms read a column block of a wider buffer in place (Llama's packed q|k|v and
// gate|up gradients): the amax is the block's alone (a larger value outside it must not count,
// a NaN inside it must), and one pass writes the codes in both orientations, each equal to the
// host's encoding under the block's scale.
TEST_CASE("fp8_amax_block and fp8_cast_block: a column block in place, both orientations",
          "[fp8]") {
  // A column block of a wider buffer (a team per row), and a whole contiguous tensor (flat).
  for (const auto& [rows, cols, whole] :
       {std::tuple{23, 67, false}, std::tuple{70, 96, false}, std::tuple{23, 67, true},
        std::tuple{70, 96, true}}) {
    const int col = whole ? 0 : 5, ld = whole ? cols : cols + 13;
    auto wide = spread(std::size_t(rows) * ld, 41, 3.0);
    if (!whole)
      for (int r = 0; r < rows; ++r) wide[std::size_t(r) * ld + col + cols] = 1e6f;  // outside
    const auto dwide = kt::to_device(wide);
    std::vector<float> block(std::size_t(rows) * cols);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c)
        block[std::size_t(r) * cols + c] = wide[std::size_t(r) * ld + col + c];
    INFO(rows << " x " << cols << " at column " << col << " of " << ld);
    View1<float> amax = kt::to_device(std::vector<float>{-5.0f});
    fp8_amax_block<float>(ExecSpace(), amax, dwide.data() + col, rows, cols, ld);
    const float a = host_amax(block);
    REQUIRE(kt::to_host(amax)[0] == a);
    REQUIRE(a < 1e6f);
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      const float s = host_scale(a, f);
      const auto scale = kt::to_device(std::vector<float>{s});
      const std::size_t n = block.size();
      View1<std::uint8_t> q("q", n), qt("qt", n), q_only("q_only", n), qt_only("qt_only", n);
      fp8_cast_block<float>(ExecSpace(), q, qt, dwide.data() + col, rows, cols, ld, scale, f);
      fp8_cast_block<float>(ExecSpace(), q_only, View1<std::uint8_t>(), dwide.data() + col, rows,
                            cols, ld, scale, f);
      fp8_cast_block<float>(ExecSpace(), View1<std::uint8_t>(), qt_only, dwide.data() + col,
                            rows, cols, ld, scale, f);
      const auto hq = kt::to_host(q), hqt = kt::to_host(qt);
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const std::uint8_t want = fp8_encode(block[std::size_t(r) * cols + c] * s, f);
          REQUIRE(hq[std::size_t(r) * cols + c] == want);
          REQUIRE(hqt[std::size_t(c) * rows + r] == want);
        }
      REQUIRE(kt::to_host(q_only) == hq);
      REQUIRE(kt::to_host(qt_only) == hqt);
    }
  }
  // A NaN inside the block is its amax; the amax of zero rows is 0.
  std::vector<float> x(4 * 8, 1.0f);
  x[2 * 8 + 3] = kNaN;
  View1<float> amax = kt::to_device(std::vector<float>{-5.0f});
  const auto dx = kt::to_device(x);
  fp8_amax_block<float>(ExecSpace(), amax, dx.data() + 2, 4, 4, 8);
  REQUIRE(std::isnan(kt::to_host(amax)[0]));
  fp8_amax_block<float>(ExecSpace(), amax, dx.data(), 0, 4, 8);
  REQUIRE(kt::to_host(amax)[0] == 0.0f);
}

// The shapes the CUDA kernels of a GPU build take (fp8_cast_cuda.cpp: 16-byte vectors, 64 x 64
// tiles for the transpose) and the ones just outside them, in float and bf16, with inf, NaN,
// saturating and subnormal values: the codes equal the host encoder's on every path. On a CPU
// build the same cases run the portable kernels.
template <class T>
void check_block_paths() {
  struct Shape {
    int rows, cols, col, ld;
  };
  // Whole tensors, 64-aligned column blocks (the gate / up pieces' form), a block whose start
  // is not 16-byte aligned, and rows / columns that are not multiples of 64 or of a vector.
  for (const Shape& sh : {Shape{128, 192, 0, 192}, Shape{64, 64, 64, 256}, Shape{192, 128, 0, 384},
                          Shape{64, 128, 3, 256}, Shape{96, 64, 0, 64}, Shape{64, 72, 0, 72},
                          Shape{128, 60, 0, 60}}) {
    const std::size_t n = std::size_t(sh.rows) * sh.cols;
    auto wide = kt::convert<T>(spread(std::size_t(sh.rows) * sh.ld, 77, 4.0));
    wide[std::size_t(sh.rows / 2) * sh.ld + sh.col + 1] = static_cast<T>(3e4f);
    wide[std::size_t(sh.rows - 1) * sh.ld + sh.col + sh.cols - 1] = static_cast<T>(-kInf);
    std::vector<float> block(n);
    for (int r = 0; r < sh.rows; ++r)
      for (int c = 0; c < sh.cols; ++c)
        block[std::size_t(r) * sh.cols + c] =
            static_cast<float>(wide[std::size_t(r) * sh.ld + sh.col + c]);
    const auto dwide = kt::to_device(wide);
    const T* x = dwide.data() + sh.col;
    INFO(sh.rows << " x " << sh.cols << " at column " << sh.col << " of " << sh.ld);
    View1<float> amax = kt::to_device(std::vector<float>{-5.0f});
    fp8_amax_block<T>(ExecSpace(), amax, x, sh.rows, sh.cols, sh.ld);
    REQUIRE(same(kt::to_host(amax)[0], host_amax(block)));  // inf
    for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
      // A finite scale that pushes the large values past the format's maximum (saturation)
      // and the small ones into its subnormals.
      const float s = fp8_max(f) / 1000.0f;
      const auto scale = kt::to_device(std::vector<float>{s});
      View1<std::uint8_t> q("q", n), qt("qt", n), q_only("q_only", n), qt_only("qt_only", n);
      fp8_cast_block<T>(ExecSpace(), q, qt, x, sh.rows, sh.cols, sh.ld, scale, f);
      fp8_cast_block<T>(ExecSpace(), q_only, View1<std::uint8_t>(), x, sh.rows, sh.cols, sh.ld,
                        scale, f);
      fp8_cast_block<T>(ExecSpace(), View1<std::uint8_t>(), qt_only, x, sh.rows, sh.cols, sh.ld,
                        scale, f);
      const auto hq = kt::to_host(q), hqt = kt::to_host(qt);
      for (int r = 0; r < sh.rows; ++r)
        for (int c = 0; c < sh.cols; ++c) {
          const std::uint8_t want = fp8_encode(block[std::size_t(r) * sh.cols + c] * s, f);
          REQUIRE(int(hq[std::size_t(r) * sh.cols + c]) == int(want));
          REQUIRE(int(hqt[std::size_t(c) * sh.rows + r]) == int(want));
        }
      REQUIRE(kt::to_host(q_only) == hq);
      REQUIRE(kt::to_host(qt_only) == hqt);
    }
    // The scale made inside the cast (fp8_scale_cast_block) against fp8_scales then
    // fp8_cast_block: the same scale, inverse and codes, bit for bit, in both orientations and
    // each alone — for the block's own amax (inf: scale 1), an ordinary one, zero, NaN, and one
    // so small that fp8_max / amax overflows (the scale clamps to FLT_MAX).
    for (float a : {host_amax(block), 1000.0f, 0.0f, kNaN, 1e-44f, 3.5f})
      for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
        INFO("amax " << a << ", " << fp8_format_name(f));
        const auto damax = kt::to_device(std::vector<float>{a});
        View1<float> s_ref("s_ref", 1), si_ref("si_ref", 1);
        fp8_scales(ExecSpace(), damax, s_ref, si_ref, 1, f);
        REQUIRE(same(kt::to_host(s_ref)[0], host_scale(a, f)));
        View1<std::uint8_t> q_ref("q_ref", n), qt_ref("qt_ref", n);
        fp8_cast_block<T>(ExecSpace(), q_ref, qt_ref, x, sh.rows, sh.cols, sh.ld, s_ref, f);
        const auto hq_ref = kt::to_host(q_ref), hqt_ref = kt::to_host(qt_ref);
        for (int form = 0; form < 3; ++form) {  // both, q alone, qt alone
          View1<float> s = kt::to_device(std::vector<float>{-7.0f});
          View1<float> si = kt::to_device(std::vector<float>{-7.0f});
          View1<std::uint8_t> q = form != 2 ? View1<std::uint8_t>("q", n) : View1<std::uint8_t>();
          View1<std::uint8_t> qt = form != 1 ? View1<std::uint8_t>("qt", n) : View1<std::uint8_t>();
          fp8_scale_cast_block<T>(ExecSpace(), q, qt, x, sh.rows, sh.cols, sh.ld, damax, s, si, f);
          REQUIRE(kt::to_host(s)[0] == kt::to_host(s_ref)[0]);
          REQUIRE(kt::to_host(si)[0] == kt::to_host(si_ref)[0]);
          if (form != 2) REQUIRE(kt::to_host(q) == hq_ref);
          if (form != 1) REQUIRE(kt::to_host(qt) == hqt_ref);
        }
      }
    // A NaN anywhere in the block is its amax.
    wide[std::size_t(sh.rows / 3) * sh.ld + sh.col + sh.cols / 2] = static_cast<T>(kNaN);
    const auto dnan = kt::to_device(wide);
    fp8_amax_block<T>(ExecSpace(), amax, dnan.data() + sh.col, sh.rows, sh.cols, sh.ld);
    REQUIRE(std::isnan(kt::to_host(amax)[0]));
  }
}

TEST_CASE("fp8_amax_block and fp8_cast_block: the vector and tile shapes, float", "[fp8]") {
  check_block_paths<float>();
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("fp8_amax_block and fp8_cast_block: the vector and tile shapes, bf16", "[fp8]") {
  check_block_paths<bf16>();
}
#endif

// Tensors of more vectors than the CUDA amax kernel has blocks (it strides then, and its last
// block folds the others' partials), called back to back with grids of every size between, the
// maximum in the first, a middle and the last vector: each amax is its own block's, so no
// partial or count leaks from one launch into the next.
TEST_CASE("fp8_amax_block: large grids and small ones back to back", "[fp8]") {
  const int rows = 1024, cols = 2048;  // 2 M floats: 512 K vectors of 4
  const std::size_t n = std::size_t(rows) * cols;
  std::vector<float> x = spread(n, 5, 2.0);
  const auto dx = kt::to_device(x);
  View1<float> amax = kt::to_device(std::vector<float>{-5.0f});
  for (std::size_t at : {std::size_t(0), n / 2 + 12, n - 1}) {
    const float big = 100.0f + float(at % 7);
    std::vector<float> y = x;
    y[at] = -big;
    const auto dy = kt::to_device(y);
    for (int r : {rows, 1, 7, rows / 2, 64, rows}) {
      INFO("maximum at " << at << ", " << r << " rows");
      fp8_amax_block<float>(ExecSpace(), amax, dy.data(), r, cols, cols);
      REQUIRE(kt::to_host(amax)[0] == host_amax(y, 0, std::size_t(r) * cols));
      fp8_amax_block<float>(ExecSpace(), amax, dx.data(), r, cols, cols);
      REQUIRE(kt::to_host(amax)[0] == host_amax(x, 0, std::size_t(r) * cols));
    }
  }
}
