// FP8 E4M3 / E5M2 encode and decode (core/fp8.hpp) against an independent host reference: the
// format's definition evaluated in double for decoding, and a brute-force nearest-value search
// over all codes (ties to the even code, overflow past max + half an ulp) for encoding.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/core/fp8.hpp"

using namespace meshtrain;

namespace {

struct Spec {
  Fp8Format f;
  int E, M, bias;
  bool fn;  // E4M3fn: no inf, only S.1111.111 is NaN
};
const Spec kE4M3{Fp8Format::e4m3, 4, 3, 7, true};
const Spec kE5M2{Fp8Format::e5m2, 5, 2, 15, false};

// The value of code c by the format's definition.
double ref_decode(const Spec& s, int c) {
  const int sign = c >> 7, e = (c >> s.M) & ((1 << s.E) - 1), m = c & ((1 << s.M) - 1);
  const int emax_field = (1 << s.E) - 1;
  if (s.fn && e == emax_field && m == (1 << s.M) - 1) return std::nan("");
  if (!s.fn && e == emax_field)
    return m ? std::nan("") : (sign ? -1.0 : 1.0) * std::numeric_limits<double>::infinity();
  const double v = e == 0 ? std::ldexp(m, 1 - s.bias - s.M)
                          : std::ldexp((1 << s.M) + m, e - s.bias - s.M);
  return sign ? -v : v;
}

// Non-negative finite codes in value order (codes 0..max are increasing), and one more: the
// value the next code would have if the format went on (480 for E4M3, 61440 for E5M2), which
// decides where rounding overflows.
struct Table {
  std::vector<double> v;  // v[c] for c = 0..max_code+1
  int max_code;
};
Table table(const Spec& s) {
  Table t;
  t.max_code = s.fn ? 0x7e : 0x7b;
  for (int c = 0; c <= t.max_code; ++c) t.v.push_back(ref_decode(s, c));
  const int emax = (t.max_code >> s.M) - s.bias;  // exponent of the top binade
  t.v.push_back(t.v.back() + std::ldexp(1.0, emax - s.M));
  return t;
}

// Expected code of fp8(x): NaN -> any NaN code (checked by the caller), else nearest by
// brute-force search, ties to the even code, overflow as the saturation mode says.
int ref_encode(const Spec& s, const Table& t, float x, bool saturate) {
  const int sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(double(x));
  int best = 0;
  for (int c = 1; c < int(t.v.size()); ++c) {
    const double d = std::fabs(t.v[c] - a), db = std::fabs(t.v[best] - a);
    if (d < db || (d == db && (c % 2 == 0))) best = c;
  }
  const bool overflow = std::isinf(a) || a > t.v.back() || best == t.max_code + 1;
  if (!overflow) return sign | best;
  if (saturate) return sign | t.max_code;
  return s.fn ? (sign | 0x7f) : (sign | 0x7c);
}

bool is_nan_code(const Spec& s, int c) { return std::isnan(ref_decode(s, c)); }

std::uint32_t bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

void check_encode(const Spec& s, const Table& t, float x) {
  for (bool sat : {true, false}) {
    const int got = fp8_encode(x, s.f, sat);
    INFO(fp8_format_name(s.f) << " x=" << x << " (bits 0x" << std::hex << bits(x) << std::dec
                              << ") saturate=" << sat << " got 0x" << std::hex << got);
    if (std::isnan(x)) {
      REQUIRE(got == 0x7f);
      continue;
    }
    REQUIRE(got == ref_encode(s, t, x, sat));
  }
}

}  // namespace

TEST_CASE("fp8 decode of all 256 codes matches the format definition", "[fp8]") {
  for (const Spec& s : {kE4M3, kE5M2}) {
    int nans = 0, infs = 0;
    for (int c = 0; c < 256; ++c) {
      const double want = ref_decode(s, c);
      const float got = fp8_decode(std::uint8_t(c), s.f);
      INFO(fp8_format_name(s.f) << " code 0x" << std::hex << c);
      if (std::isnan(want)) {
        REQUIRE(std::isnan(got));
        ++nans;
        continue;
      }
      REQUIRE(double(got) == want);
      REQUIRE(std::signbit(got) == bool(c & 0x80));  // -0 included
      infs += std::isinf(got) ? 1 : 0;
    }
    if (s.fn) {
      REQUIRE(nans == 2);  // 0x7f, 0xff
      REQUIRE(infs == 0);
    } else {
      REQUIRE(nans == 6);  // 0x7d-0x7f, 0xfd-0xff
      REQUIRE(infs == 2);
    }
  }
  REQUIRE(fp8_decode(0x7e, Fp8Format::e4m3) == 448.0f);
  REQUIRE(fp8_decode(0x01, Fp8Format::e4m3) == std::ldexp(1.0f, -9));
  REQUIRE(fp8_decode(0x08, Fp8Format::e4m3) == std::ldexp(1.0f, -6));
  REQUIRE(fp8_decode(0x7b, Fp8Format::e5m2) == 57344.0f);
  REQUIRE(fp8_decode(0x01, Fp8Format::e5m2) == std::ldexp(1.0f, -16));
  REQUIRE(fp8_decode(0x04, Fp8Format::e5m2) == std::ldexp(1.0f, -14));
  REQUIRE(fp8_max(Fp8Format::e4m3) == 448.0f);
  REQUIRE(fp8_max(Fp8Format::e5m2) == 57344.0f);
}

TEST_CASE("fp8 decode then encode returns every non-NaN code", "[fp8]") {
  for (const Spec& s : {kE4M3, kE5M2}) {
    for (int c = 0; c < 256; ++c) {
      if (is_nan_code(s, c)) continue;
      const float v = fp8_decode(std::uint8_t(c), s.f);
      INFO(fp8_format_name(s.f) << " code 0x" << std::hex << c);
      REQUIRE(int(fp8_encode(v, s.f, false)) == c);
      // Saturating: the same, except that E5M2's infinities become ±57344.
      const int sat = std::isinf(v) ? ((c & 0x80) | 0x7b) : c;
      REQUIRE(int(fp8_encode(v, s.f, true)) == sat);
    }
  }
}

TEST_CASE("fp8 encode saturates at ±max and keeps NaN", "[fp8]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  // E4M3: 448 is the last code; 464 is the tie between 448 (even code 0x7e) and 480 (0x7f,
  // NaN), so it rounds to 448 even without saturation; beyond it overflows.
  REQUIRE(fp8_encode(448.0f, Fp8Format::e4m3) == 0x7e);
  REQUIRE(fp8_encode(-448.0f, Fp8Format::e4m3) == 0xfe);
  REQUIRE(fp8_encode(464.0f, Fp8Format::e4m3, false) == 0x7e);
  REQUIRE(fp8_encode(std::nextafter(464.0f, 1e9f), Fp8Format::e4m3, false) == 0x7f);
  for (float x : {449.0f, 500.0f, 1e30f, 3.4e38f, inf}) {
    REQUIRE(fp8_encode(x, Fp8Format::e4m3) == 0x7e);
    REQUIRE(fp8_encode(-x, Fp8Format::e4m3) == 0xfe);
  }
  REQUIRE(fp8_encode(inf, Fp8Format::e4m3, false) == 0x7f);
  REQUIRE(fp8_encode(-inf, Fp8Format::e4m3, false) == 0xff);
  // E5M2: 57344 = 0x7b (odd); 61440 is the tie with 0x7c (inf, even): overflows.
  REQUIRE(fp8_encode(57344.0f, Fp8Format::e5m2) == 0x7b);
  REQUIRE(fp8_encode(60000.0f, Fp8Format::e5m2, false) == 0x7b);
  REQUIRE(fp8_encode(61440.0f, Fp8Format::e5m2, false) == 0x7c);
  REQUIRE(fp8_encode(-61440.0f, Fp8Format::e5m2, false) == 0xfc);
  for (float x : {61440.0f, 1e6f, 3.4e38f, inf}) {
    REQUIRE(fp8_encode(x, Fp8Format::e5m2) == 0x7b);
    REQUIRE(fp8_encode(-x, Fp8Format::e5m2) == 0xfb);
  }
  REQUIRE(fp8_encode(inf, Fp8Format::e5m2, false) == 0x7c);
  REQUIRE(fp8_encode(-inf, Fp8Format::e5m2, false) == 0xfc);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2})
    for (bool sat : {true, false}) {
      REQUIRE(std::isnan(fp8_decode(fp8_encode(nan, f, sat), f)));
      REQUIRE(std::isnan(fp8_decode(fp8_encode(-nan, f, sat), f)));
    }
}

TEST_CASE("fp8 encode rounds to nearest, ties to even", "[fp8]") {
  // E4M3 around 1 (0x38): steps of 1/8.
  REQUIRE(fp8_encode(1.0625f, Fp8Format::e4m3) == 0x38);  // tie 1 | 1.125 -> 1 (even)
  REQUIRE(fp8_encode(1.1875f, Fp8Format::e4m3) == 0x3a);  // tie 1.125 | 1.25 -> 1.25 (even)
  REQUIRE(fp8_encode(std::nextafter(1.0625f, 2.0f), Fp8Format::e4m3) == 0x39);
  // Subnormals (quantum 2^-9): 2^-10 ties 0 | 2^-9 -> 0; 3 * 2^-10 ties 2^-9 | 2^-8 -> 2^-8.
  REQUIRE(fp8_encode(std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x00);
  REQUIRE(fp8_encode(-std::ldexp(1.0f, -10), Fp8Format::e4m3) == 0x80);
  REQUIRE(fp8_encode(std::ldexp(3.0f, -10), Fp8Format::e4m3) == 0x02);
  REQUIRE(fp8_encode(std::ldexp(1.0f, -30), Fp8Format::e4m3) == 0x00);
  // The largest subnormal rounds up into the smallest normal (carry into the exponent).
  REQUIRE(fp8_encode(std::ldexp(15.0f, -10), Fp8Format::e4m3) == 0x08);
  // E5M2 around 1 (0x3c): steps of 1/4.
  REQUIRE(fp8_encode(1.125f, Fp8Format::e5m2) == 0x3c);
  REQUIRE(fp8_encode(1.375f, Fp8Format::e5m2) == 0x3e);
  REQUIRE(fp8_encode(std::ldexp(1.0f, -17), Fp8Format::e5m2) == 0x00);
  REQUIRE(fp8_encode(std::ldexp(3.0f, -17), Fp8Format::e5m2) == 0x02);

  // Every midpoint between neighbouring values, the floats either side of it, and both signs.
  for (const Spec& s : {kE4M3, kE5M2}) {
    const Table t = table(s);
    for (std::size_t c = 0; c + 1 < t.v.size(); ++c) {
      const float mid = float((t.v[c] + t.v[c + 1]) / 2);  // exact: few significant bits
      REQUIRE(double(mid) == (t.v[c] + t.v[c + 1]) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        check_encode(s, t, x);
        check_encode(s, t, -x);
      }
    }
  }
}

TEST_CASE("fp8 encode matches the brute-force reference on random and special floats", "[fp8]") {
  std::mt19937 gen(35);
  std::uniform_real_distribution<double> expo(-34.0, 20.0);
  std::uniform_int_distribution<std::uint32_t> any;
  for (const Spec& s : {kE4M3, kE5M2}) {
    const Table t = table(s);
    for (float x : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(),
                    std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                    std::numeric_limits<float>::infinity(), std::nanf("")}) {
      check_encode(s, t, x);
      check_encode(s, t, -x);
    }
    for (int i = 0; i < 20000; ++i) {
      const float x = float(std::exp2(expo(gen))) * (i % 2 ? -1.0f : 1.0f);
      check_encode(s, t, x);
      // Arbitrary bit patterns: subnormal and huge floats, infinities and NaNs.
      float y;
      const std::uint32_t u = any(gen);
      std::memcpy(&y, &u, 4);
      check_encode(s, t, y);
    }
  }
}

TEST_CASE("fp8 encode and decode run inside Kokkos kernels", "[fp8]") {
  // Every code's value (NaN codes skipped) encoded and decoded on the default execution space.
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    View1<std::uint8_t> codes("codes", 256);
    View1<float> values("values", 256);
    Kokkos::parallel_for(
        "test_fp8_device", Kokkos::RangePolicy<ExecSpace>(0, 256), KOKKOS_LAMBDA(int c) {
          const float v = fp8_decode(std::uint8_t(c), f);
          values(c) = v;
          codes(c) = fp8_encode(v, f, false);
        });
    const auto hc = kt::to_host(codes);
    const auto hv = kt::to_host(values);
    for (int c = 0; c < 256; ++c) {
      INFO(fp8_format_name(f) << " code 0x" << std::hex << c);
      const float host = fp8_decode(std::uint8_t(c), f);
      if (std::isnan(host)) {
        REQUIRE(std::isnan(hv[c]));
        REQUIRE(hc[c] == 0x7f);
      } else {
        REQUIRE(hv[c] == host);
        REQUIRE(int(hc[c]) == c);
      }
    }
  }
}

TEST_CASE("fp8 saturating encode on the device equals the host's, bit for bit", "[fp8]") {
  // On sm_89 and later the device encodes with the conversion instruction (core/fp8.hpp); the
  // host with the software encoder this file checks above. Every fp32 exponent with the
  // mantissas that sit on, just beside and halfway between FP8 codes (the ties), both signs, the
  // specials, and random bit patterns: the same codes on both sides.
  std::vector<std::uint32_t> bits;
  for (std::uint32_t e = 0; e < 256; ++e)
    for (std::uint32_t m : {0u, 1u, 0x7fffffu, 0x400000u, 0x200000u, 0x100000u, 0x080000u,
                            0x0fffffu, 0x100001u, 0x300000u, 0x500000u, 0x600000u, 0x700000u,
                            0x0c0000u, 0x140000u, 0x1c0000u, 0x1fffffu, 0x200001u})
      for (std::uint32_t sign : {0u, 0x80000000u}) bits.push_back(sign | e << 23 | m);
  std::mt19937 gen(89);
  std::uniform_int_distribution<std::uint32_t> any;
  for (int i = 0; i < 100000; ++i) bits.push_back(any(gen));
  const std::size_t n = bits.size();
  std::vector<float> xs(n);
  std::memcpy(xs.data(), bits.data(), n * sizeof(float));
  const View1<float> dx = kt::to_device(xs);
  for (Fp8Format f : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    View1<std::uint8_t> codes("codes", n);
    Kokkos::parallel_for(
        "test_fp8_encode_sat", Kokkos::RangePolicy<ExecSpace>(0, n),
        KOKKOS_LAMBDA(std::size_t i) { codes(i) = fp8_encode(dx(i), f); });
    const auto hc = kt::to_host(codes);
    std::size_t bad = 0, first = n;
    for (std::size_t i = 0; i < n; ++i)
      if (hc[i] != fp8_encode(xs[i], f)) {
        ++bad;
        if (first == n) first = i;
      }
    INFO(fp8_format_name(f) << ": " << bad << " of " << n << " codes differ; the first for bits 0x"
                            << std::hex << (first < n ? bits[first] : 0u));
    REQUIRE(bad == 0);
  }
}
