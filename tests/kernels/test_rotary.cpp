// Rotary embedding: the inverse frequencies against HF's formulas evaluated in double (plain
// and with Llama 3 scaling, every branch of the latter exercised), the cos/sin table, the
// rotation of the q and k parts of a packed GQA qkv buffer against a host implementation of
// HF's apply_rotary_pos_emb (rotate_half), v untouched, positions restarting per sequence;
// the backward (double) against central finite differences, and backward o forward = identity.
#include <cmath>
#include <cstdlib>

#include "kernel_test_util.hpp"
#include "meshtrain/io/safetensors.hpp"
#include "meshtrain/kernels/rotary.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

// HF's formulas, in double (transformers/modeling_rope_utils.py).
std::vector<double> inv_freq_double(int HS, const RopeConfig& c) {
  std::vector<double> inv(HS / 2);
  for (int i = 0; i < HS / 2; ++i) inv[i] = 1.0 / std::pow(c.theta, double(2 * i) / HS);
  if (!c.llama3_scaling) return inv;
  const double old_len = c.original_max_position_embeddings;
  const double low_wavelen = old_len / c.low_freq_factor;
  const double high_wavelen = old_len / c.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f /= c.factor;
      continue;
    }
    const double s =
        (old_len / wavelen - c.low_freq_factor) / (c.high_freq_factor - c.low_freq_factor);
    f = (1 - s) * f / c.factor + s * f;
  }
  return inv;
}

// HF: q_embed = q * cos + rotate_half(q) * sin, cos = cat(cos_half, cos_half), rotate_half(x) =
// cat(-x2, x1). One head of HS values at position pos.
void rotate_head_host(double* x, int HS, int pos, const std::vector<double>& inv) {
  const int half = HS / 2;
  std::vector<double> y(HS);
  for (int d = 0; d < HS; ++d) {
    const double angle = double(float(pos) * float(inv[d % half]));
    const double rot = d < half ? -x[d + half] : x[d - half];
    y[d] = x[d] * std::cos(angle) + rot * std::sin(angle);
  }
  for (int d = 0; d < HS; ++d) x[d] = y[d];
}

RopeConfig llama3_tiny() {
  // original_max_position_embeddings 64 makes the head size 8 frequencies (wavelengths 6.3,
  // 63, 628, 6283 at theta 1e4) fall into all three bands: kept (< 16), interpolated
  // ([16, 64]) and divided by the factor (> 64).
  RopeConfig c;
  c.llama3_scaling = true;
  c.factor = 8.0;
  c.low_freq_factor = 1.0;
  c.high_freq_factor = 4.0;
  c.original_max_position_embeddings = 64;
  return c;
}

}  // namespace

TEST_CASE("rope_inv_freq follows HF, with and without Llama 3 scaling", "[kernels][rotary]") {
  RopeConfig plain;
  const auto a = rope_inv_freq(8, plain);
  REQUIRE(a.size() == 4);
  kt::require_close(a, inv_freq_double(8, plain), 1e-6, 0.0, "inv_freq theta 1e4");
  REQUIRE(a[0] == 1.0f);

  const RopeConfig c = llama3_tiny();
  const auto b = rope_inv_freq(8, c);
  const auto want = inv_freq_double(8, c);
  kt::require_close(b, want, 1e-6, 0.0, "inv_freq llama3 (tiny)");
  // The three bands: kept, interpolated (strictly between kept and divided), divided.
  const auto base = inv_freq_double(8, plain);
  CHECK(b[0] == a[0]);
  CHECK(b[1] < a[1]);
  CHECK(b[1] > a[1] / 8);
  CHECK(std::fabs(b[2] - base[2] / 8) < 1e-9);
  CHECK(std::fabs(b[3] - base[3] / 8) < 1e-10);

  // Llama 3.1 8B's rope: head size 128, theta 5e5, factor 8, original 8192.
  RopeConfig l31;
  l31.theta = 500000.0;
  l31.llama3_scaling = true;
  l31.original_max_position_embeddings = 8192;
  kt::require_close(rope_inv_freq(128, l31), inv_freq_double(128, l31), 1e-5, 0.0,
                    "inv_freq llama 3.1");

  REQUIRE_THROWS_AS(rope_inv_freq(7, plain), meshtrain::ConfigError);
  RopeConfig bad = c;
  bad.high_freq_factor = 0.5;
  REQUIRE_THROWS_AS(rope_inv_freq(8, bad), meshtrain::ConfigError);
}

TEST_CASE("rope tables equal the fixture's, which torch computed as HF does",
          "[kernels][rotary]") {
  // tests/reference/llama_reference.py stores inv_freq and the [T, HS/2] cos/sin tables that
  // torch computes in fp32 with HF's operations, for the default rope and Llama 3 scaling
  // (factor 8, low 1, high 4, original 64). The host mirror may differ from torch's vectorised
  // pow by an ulp; the tables then by a few ulp of the angle.
  // The source tree is compiled in; MESHTRAIN_SOURCE_DIR in the environment overrides it (a
  // bundle run on another machine), as for the GPT-2 fixture.
  const char* env = std::getenv("MESHTRAIN_SOURCE_DIR");
  const meshtrain::io::SafetensorsReader fx(std::string(env ? env : MESHTRAIN_SOURCE_DIR) +
                                            "/tests/fixtures/llama_tiny_v1.safetensors");
  ExecSpace exec;
  for (const bool scaled : {false, true}) {
    INFO("llama3 scaling " << scaled);
    const RopeConfig c = scaled ? llama3_tiny() : RopeConfig{};
    const std::string p = scaled ? "llama3.rope." : "rope.";
    kt::require_close(rope_inv_freq(8, c), fx.read_f32(p + "inv_freq"), 2.5e-7, 0.0, "inv_freq");
    const RopeTable t = rope_table(exec, 16, 8, c);
    kt::require_close(kt::to_host(t.cos), fx.read_f32(p + "cos"), 0.0, 1e-6, "cos");
    kt::require_close(kt::to_host(t.sin), fx.read_f32(p + "sin"), 0.0, 1e-6, "sin");
  }
}

TEST_CASE("rope_table holds cos and sin of the fp32 angles", "[kernels][rotary]") {
  const RopeConfig c = llama3_tiny();
  const int T = 40, HS = 16;
  ExecSpace exec;
  const RopeTable t = rope_table(exec, T, HS, c);
  REQUIRE(t.matches(T, HS, c));
  REQUIRE(!t.matches(T, HS, RopeConfig{}));
  const auto inv = rope_inv_freq(HS, c);
  const auto cs = kt::to_host(t.cos), sn = kt::to_host(t.sin);
  REQUIRE(cs.size() == std::size_t(T) * HS / 2);
  std::vector<double> want_c(cs.size()), want_s(cs.size());
  for (int p = 0; p < T; ++p)
    for (int i = 0; i < HS / 2; ++i) {
      const double angle = float(p) * inv[i];
      want_c[p * HS / 2 + i] = std::cos(angle);
      want_s[p * HS / 2 + i] = std::sin(angle);
    }
  // Rounded once from double: within half an fp32 ulp.
  kt::require_close(cs, want_c, 0.0, 6e-8, "cos");
  kt::require_close(sn, want_s, 0.0, 6e-8, "sin");
}

TEST_CASE("rotary_forward rotates q and k of a packed GQA buffer as HF does",
          "[kernels][rotary]") {
  const int B = 2, T = 5, NH = 4, NKV = 2, HS = 8;
  const int W = (NH + 2 * NKV) * HS;
  const RopeConfig c = llama3_tiny();
  ExecSpace exec;
  const RopeTable tab = rope_table(exec, 7, HS, c);  // longer than T: rows beyond T unused
  const auto x = kt::random_vector<float>(std::size_t(B) * T * W, 1, -2.0, 2.0);
  auto d = kt::to_device(x);
  rotary_forward<float>(exec, d, tab, B, T, NH, NKV);
  const auto got = kt::to_host(d);

  const auto invf = rope_inv_freq(HS, c);
  const std::vector<double> invd(invf.begin(), invf.end());
  std::vector<double> want(x.begin(), x.end());
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH + NKV; ++h)  // q heads, then k heads; v follows untouched
        rotate_head_host(&want[(std::size_t(b) * T + t) * W + h * HS], HS, t, invd);
  kt::require_close(got, want, 1e-6, 1e-6, "rotated qkv");
  for (int row = 0; row < B * T; ++row)
    for (int col = (NH + NKV) * HS; col < W; ++col) {
      INFO("v element row " << row << " col " << col);
      REQUIRE(got[std::size_t(row) * W + col] == x[std::size_t(row) * W + col]);
    }
  // Position 0 of the second sequence (row T) is not rotated at all.
  for (int col = 0; col < (NH + NKV) * HS; ++col)
    REQUIRE(got[std::size_t(T) * W + col] == x[std::size_t(T) * W + col]);

  REQUIRE_THROWS(rotary_forward<float>(exec, d, tab, 1, 8, NH, NKV));  // T beyond the table
}

TEST_CASE("rotary_backward matches finite differences (double) and inverts the forward",
          "[kernels][rotary]") {
  const int B = 2, T = 4, NH = 2, NKV = 1, HS = 8;
  const std::size_t n = std::size_t(B) * T * (NH + 2 * NKV) * HS;
  RopeConfig c;
  c.theta = 100.0;  // larger angles at small positions
  ExecSpace exec;
  const RopeTable tab = rope_table(exec, T, HS, c);
  auto x = kt::random_vector<double>(n, 5);
  const auto R = kt::random_vector<double>(n, 6);
  auto objective = [&]() {
    auto d = kt::to_device(x);
    rotary_forward<double>(exec, d, tab, B, T, NH, NKV);
    return kt::dot(kt::to_host(d), R);
  };
  const auto fd = kt::fd_gradient(x, objective, 1e-5);
  auto g = kt::to_device(R);
  rotary_backward<double>(exec, g, tab, B, T, NH, NKV);
  // Linear in x: the central difference is exact up to rounding (~1e-11).
  kt::require_close(kt::to_host(g), fd, 1e-8, 1e-9, "dqkv");

  // backward(forward(x)) = x: the table's cos^2 + sin^2 = 1 to fp32 rounding.
  auto y = kt::to_device(x);
  rotary_forward<double>(exec, y, tab, B, T, NH, NKV);
  rotary_backward<double>(exec, y, tab, B, T, NH, NKV);
  kt::require_close(kt::to_host(y), x, 0.0, 1e-6, "round trip");

  // The float instantiation agrees with the double one.
  auto yf = kt::to_device(kt::cast_vector<float>(x));
  rotary_forward<float>(exec, yf, tab, B, T, NH, NKV);
  auto yd = kt::to_device(x);
  rotary_forward<double>(exec, yd, tab, B, T, NH, NKV);
  kt::require_close(kt::to_host(yf), kt::to_host(yd), 1e-6, 1e-6, "float vs double");
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("rotary bf16 is the float rotation rounded once", "[kernels][rotary][bf16]") {
  const int B = 3, T = 64, NH = 8, NKV = 2, HS = 64;
  const std::size_t n = std::size_t(B) * T * (NH + 2 * NKV) * HS;
  RopeConfig c;
  c.theta = 500000.0;
  ExecSpace exec;
  const RopeTable tab = rope_table(exec, T, HS, c);
  const auto xb = kt::convert<bf16>(kt::random_vector<float>(n, 9, -3.0, 3.0));
  auto db = kt::to_device(xb);
  auto df = kt::to_device(kt::convert<float>(xb));
  rotary_forward<bf16>(exec, db, tab, B, T, NH, NKV);
  rotary_forward<float>(exec, df, tab, B, T, NH, NKV);
  // The same fp32 expression rounded to bf16 once: within half a bf16 ulp (<= 2^-8 relative) of
  // the float result, up to the FMA contraction the compiler may choose per instantiation.
  kt::require_close(kt::convert<float>(kt::to_host(db)), kt::to_host(df), 1.0 / 256 + 1e-6,
                    1e-6, "bf16 vs float");
}
#endif
