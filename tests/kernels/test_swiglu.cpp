// SwiGLU on the packed [gate | up] buffer: forward against the formula in double (extreme gate
// values included), backward (double instantiation) against central finite differences, float
// against double, the in-place backward, and bf16's order of operations (HF's) bit for bit.
// Last, the FP8 amaxes fused into both (one of the output; the backward's, one per half).
#include <cmath>

#include "amax_check.hpp"
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/swiglu.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
double silu(double g) { return g / (1.0 + std::exp(-g)); }

// gate_up rows [gate | up]; gates in [-6, 6] plus magnitudes where exp(-g) overflows in fp32.
std::vector<double> packed_inputs(int N, int I, std::uint32_t seed) {
  auto v = kt::random_vector<double>(2 * std::size_t(N) * I, seed, -6.0, 6.0);
  const double extremes[] = {-100.0, -30.0, 0.0, 30.0, 100.0};
  for (int k = 0; k < 5 && k < I; ++k) v[k] = extremes[k];
  return v;
}
}  // namespace

TEST_CASE("swiglu_forward matches silu(gate) * up", "[kernels][swiglu]") {
  const int N = 7, I = 13;
  const auto gu = packed_inputs(N, I, 1);
  auto out = kt::nan_view<float>(std::size_t(N) * I);
  swiglu_forward<float>(ExecSpace(), out, kt::to_device(kt::cast_vector<float>(gu)), N, I);
  std::vector<double> want(std::size_t(N) * I);
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < I; ++j) {
      const double g = float(gu[2 * n * I + j]), u = float(gu[2 * n * I + I + j]);
      want[n * I + j] = silu(g) * u;
    }
  // fp32 exp (the host path's polynomial: 2e-7 relative) and two products.
  kt::require_close(kt::to_host(out), want, 2e-6, 1e-7, "out");
}

TEST_CASE("swiglu_backward matches finite differences (double)", "[kernels][swiglu]") {
  const int N = 5, I = 11;
  auto gu = packed_inputs(N, I, 2);
  const auto R = kt::random_vector<double>(std::size_t(N) * I, 3);
  ExecSpace exec;
  auto objective = [&]() {
    View1<double> out("out", std::size_t(N) * I);
    swiglu_forward<double>(exec, out, kt::to_device(gu), N, I);
    return kt::dot(kt::to_host(out), R);
  };
  // Element-wise and smooth: truncation ~1e-10 times the third derivative (bounded).
  const auto fd = kt::fd_gradient(gu, objective, 1e-5);
  auto dgu = kt::nan_view<double>(gu.size());
  swiglu_backward<double>(exec, dgu, kt::to_device(gu), kt::to_device(R), N, I);
  kt::require_close(kt::to_host(dgu), fd, 1e-7, 1e-8, "dgate_up");

  // float agrees with double, and is finite where exp(-g) overflows.
  auto dguf = kt::nan_view<float>(gu.size());
  swiglu_backward<float>(exec, dguf, kt::to_device(kt::cast_vector<float>(gu)),
                         kt::to_device(kt::cast_vector<float>(R)), N, I);
  kt::require_close(kt::to_host(dguf), kt::to_host(dgu), 1e-5, 1e-6, "dgate_up (float)");

  // In place: the gradient overwrites the saved input with the same values.
  auto inplace = kt::to_device(kt::cast_vector<float>(gu));
  swiglu_backward<float>(exec, inplace, inplace, kt::to_device(kt::cast_vector<float>(R)), N, I);
  REQUIRE(kt::bitwise_equal(kt::to_host(inplace), kt::to_host(dguf)));
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("swiglu bf16 rounds silu(gate) before the product, as HF", "[kernels][swiglu][bf16]") {
  // HF: act_fn(gate) is a bf16 tensor, then times up, rounded. The kernel's rounded silu is
  // its output for up = 1; the output for the real up must be that value times up, rounded.
  // The single-rounding order (fp32 silu times up, rounded once) gives other bits on this
  // data, which the test checks, so it tells the two orders apart.
  const int N = 64, I = 96;
  auto gu = kt::convert<bf16>(kt::random_vector<float>(2 * std::size_t(N) * I, 4, -4.0, 4.0));
  auto ones = gu;
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < I; ++j) ones[2 * n * I + I + j] = static_cast<bf16>(1.0f);
  ExecSpace exec;
  View1<bf16> out("out", std::size_t(N) * I), silu_b("silu_b", std::size_t(N) * I);
  View1<float> silu_f("silu_f", std::size_t(N) * I);
  swiglu_forward<bf16>(exec, out, kt::to_device(gu), N, I);
  swiglu_forward<bf16>(exec, silu_b, kt::to_device(ones), N, I);
  swiglu_forward<float>(exec, silu_f, kt::to_device(kt::convert<float>(ones)), N, I);
  const auto got = kt::to_host(out), sb = kt::to_host(silu_b);
  const auto sf = kt::to_host(silu_f);
  std::size_t other_order_differs = 0;
  for (int n = 0; n < N; ++n)
    for (int j = 0; j < I; ++j) {
      const float u = static_cast<float>(gu[2 * n * I + I + j]);
      const bf16 hf = static_cast<bf16>(static_cast<float>(sb[n * I + j]) * u);
      const bf16 once = static_cast<bf16>(sf[n * I + j] * u);
      INFO("row " << n << " col " << j);
      REQUIRE(std::memcmp(&got[n * I + j], &hf, sizeof(bf16)) == 0);
      other_order_differs += std::memcmp(&hf, &once, sizeof(bf16)) != 0;
    }
  REQUIRE(other_order_differs > 0);
}
#endif

#if MESHTRAIN_HAVE_BF16
// On a GPU, 16-bit SwiGLU runs eight columns per access where I % 8 == 0 and the pointers are
// 16-byte aligned (pack8.hpp): the backward against the formula of the same bf16 inputs, on
// aligned views (packed) and on views one element into their buffers (element-wise), with I a
// multiple of 8 and not.
TEST_CASE("swiglu_backward bf16, packed or not, matches the formula", "[kernels][swiglu][bf16]") {
  ExecSpace exec;
  for (int I : {96, 13})
    for (std::size_t shift : {0, 1}) {
      INFO("I " << I << " shift " << shift);
      const int N = 17;
      const std::size_t nin = 2 * std::size_t(N) * I, nout = std::size_t(N) * I;
      const auto gu = kt::convert<bf16>(kt::random_vector<float>(nin, 6, -4.0, 4.0));
      const auto dd = kt::convert<bf16>(kt::random_vector<float>(nout, 7));
      std::vector<bf16> gu_buf(nin + shift, bf16(0.0f)), d_buf(nout + shift, bf16(0.0f));
      std::copy(gu.begin(), gu.end(), gu_buf.begin() + shift);
      std::copy(dd.begin(), dd.end(), d_buf.begin() + shift);
      auto gu_all = kt::to_device(gu_buf), d_all = kt::to_device(d_buf);
      auto dg_all = kt::to_device(std::vector<bf16>(nin + shift, bf16(0.0f)));
      View1<bf16> guv(gu_all.data() + shift, nin), dv(d_all.data() + shift, nout);
      View1<bf16> dgv(dg_all.data() + shift, nin);
      swiglu_backward<bf16>(exec, dgv, guv, dv, N, I);
      const auto got_all = kt::to_host(dg_all);
      std::vector<double> got(nin), want(nin);
      for (int n = 0; n < N; ++n)
        for (int j = 0; j < I; ++j) {
          const std::size_t ig = 2 * std::size_t(n) * I + j, iu = ig + I;
          const double g = float(gu[ig]), u = float(gu[iu]), d = float(dd[n * I + j]);
          const double s = 1.0 / (1.0 + std::exp(-g));
          want[ig] = d * u * (s * (1.0 + g * (1.0 - s)));
          want[iu] = d * g * s;
        }
      for (std::size_t i = 0; i < nin; ++i) got[i] = float(got_all[i + shift]);
      kt::require_close(got, want, 1.0 / 128, 1e-6, "dgate_up bf16");
    }
}
#endif

// ---------------------------------------------------------------------------------------------
// The FP8 amax fused into SwiGLU (issue 35): swiglu_forward(..., amax) sets amax(0) to fp8_amax
// of out [N, I]; swiglu_backward(..., amax) sets amax(0) and amax(1) to fp8_amax_block of the
// gate and the up gradients, the two [N, I] column blocks of dgate_up that the FP8 backward
// casts under scales of their own. An inf in the output, a NaN, all zeros and N = 0 give inf,
// NaN, 0 and 0, over a stale amax — in the backward in one half or in both, as the inputs
// make them; the in-place backward gives the same amaxes. In bf16 on a GPU the packed form
// (I % 8 == 0, aligned views) and the element-wise one, as above; in double the Kokkos kernel
// on any build.
namespace {

template <class T>
View1<T> shifted(const std::vector<T>& v, std::size_t shift, View1<T>& all) {
  std::vector<T> r(v.size() + shift, static_cast<T>(0.0f));
  std::copy(v.begin(), v.end(), r.begin() + shift);
  all = kt::to_device(r);
  return View1<T>(all.data() + shift, v.size());
}

// The amax bits of swiglu_forward on gate_up, every view `shift` elements into its allocation.
template <class T>
std::uint32_t forward_amax(int N, int I, const std::vector<T>& gu, std::size_t shift) {
  const std::size_t n_out = std::size_t(N) * I;
  View1<T> gu_all, plain_all, fused_all;
  const View1<T> guv = shifted(gu, shift, gu_all);
  const View1<T> plain = shifted(std::vector<T>(n_out), shift, plain_all);
  const View1<T> fused = shifted(std::vector<T>(n_out), shift, fused_all);
  return kt::require_fused_amax<T>(plain, fused, n_out, [&](View1<T> out, View1<float> amax) {
    swiglu_forward<T>(ExecSpace(), out, guv, N, I, amax);
  });
}

// The two amaxes' bits of swiglu_backward on gate_up and dout, {gate's, up's}, likewise.
template <class T>
std::vector<std::uint32_t> backward_amaxes(int N, int I, const std::vector<T>& gu,
                                           const std::vector<T>& d, std::size_t shift) {
  const std::size_t n_out = 2 * std::size_t(N) * I;
  View1<T> gu_all, d_all, plain_all, fused_all;
  const View1<T> guv = shifted(gu, shift, gu_all), dv = shifted(d, shift, d_all);
  const View1<T> plain = shifted(std::vector<T>(n_out), shift, plain_all);
  const View1<T> fused = shifted(std::vector<T>(n_out), shift, fused_all);
  return kt::require_fused_block_amaxes<T>(
      plain, fused, N, I, 2, [&](View1<T> out, View1<float> amax) {
        swiglu_backward<T>(ExecSpace(), out, guv, dv, N, I, amax);
      });
}

template <class T>
void swiglu_amax_cases(const std::vector<std::pair<int, int>>& shapes,
                       const std::vector<std::size_t>& shifts) {
  const T inf = static_cast<T>(std::numeric_limits<float>::infinity());
  const T nan = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  const T one = static_cast<T>(1.0f), two = static_cast<T>(2.0f);
  using Bits = std::vector<std::uint32_t>;
  const auto finite = [](std::uint32_t b) { return b > 0 && b < kt::kInfBits; };
  for (const auto& [N, I] : shapes)
    for (const std::size_t shift : shifts) {
      INFO("N " << N << " I " << I << " shift " << shift);
      const std::size_t NI = std::size_t(N) * I;
      // (packed_inputs writes its extremes into the first row: none for N = 0.)
      const auto gu = N == 0 ? std::vector<T>()
                             : kt::convert<T>(kt::cast_vector<float>(packed_inputs(N, I, 31)));
      const auto d = kt::convert<T>(kt::random_vector<float>(NI, 32));
      const std::uint32_t f = forward_amax(N, I, gu, shift);
      const Bits b = backward_amaxes(N, I, gu, d, shift);
      if (N == 0) {
        REQUIRE(f == 0);
        REQUIRE(b == Bits{0, 0});
        continue;
      }
      REQUIRE(finite(f));
      REQUIRE((finite(b[0]) && finite(b[1])));
      REQUIRE(b[0] != b[1]);  // so that entries swapped, or one amax of both, would show
      // The last row's last column: gate 2 and up inf. Forward: silu(2) * inf. Backward:
      // dgate = dout * inf * silu'(2) alone; and with up 1 and dout inf, both halves inf.
      const std::size_t g_last = (2 * std::size_t(N) - 1) * I - 1, u_last = g_last + I;
      auto gi = gu;
      gi[g_last] = two;
      gi[u_last] = inf;
      REQUIRE(forward_amax(N, I, gi, shift) == kt::kInfBits);
      const Bits up_inf = backward_amaxes(N, I, gi, d, shift);
      REQUIRE(up_inf[0] == kt::kInfBits);
      REQUIRE(finite(up_inf[1]));
      gi[u_last] = one;
      auto di = d;
      di[NI - 1] = inf;
      REQUIRE(backward_amaxes(N, I, gi, di, shift) == Bits{kt::kInfBits, kt::kInfBits});
      // A NaN gate of row 0: NaN everywhere it reaches. A NaN up: the gate gradient's alone.
      auto gn = gu;
      gn[I / 2] = nan;
      REQUIRE(forward_amax(N, I, gn, shift) > kt::kInfBits);
      const Bits gate_nan = backward_amaxes(N, I, gn, d, shift);
      REQUIRE((gate_nan[0] > kt::kInfBits && gate_nan[1] > kt::kInfBits));
      auto un = gu;
      un[I + I / 2] = nan;
      const Bits up_nan = backward_amaxes(N, I, un, d, shift);
      REQUIRE(up_nan[0] > kt::kInfBits);
      REQUIRE(finite(up_nan[1]));
      const std::vector<T> zeros_gu(2 * NI, static_cast<T>(0.0f)), zeros_d(NI, zeros_gu[0]);
      REQUIRE(forward_amax(N, I, zeros_gu, shift) == 0);
      REQUIRE(backward_amaxes(N, I, zeros_gu, zeros_d, shift) == Bits{0, 0});
    }
}

}  // namespace

TEST_CASE("swiglu's fused FP8 amax is fp8_amax of the output (float)",
          "[kernels][swiglu][fp8][amax]") {
  swiglu_amax_cases<float>({{7, 13}, {5, 96}, {0, 8}}, {0});

  // In place (dgate_up = gate_up): the same gradient, so the same amax.
  const int N = 5, I = 11;
  const auto gu = kt::cast_vector<float>(packed_inputs(N, I, 33));
  const auto d = kt::to_device(kt::random_vector<float>(std::size_t(N) * I, 34));
  ExecSpace exec;
  View1<float> a_out("a_out", 2), a_in("a_in", 2);
  View1<float> dgu("dgu", gu.size());
  swiglu_backward<float>(exec, dgu, kt::to_device(gu), d, N, I, a_out);
  auto inplace = kt::to_device(gu);
  swiglu_backward<float>(exec, inplace, inplace, d, N, I, a_in);
  REQUIRE(kt::bitwise_equal(kt::to_host(inplace), kt::to_host(dgu)));
  REQUIRE(kt::bitwise_equal(kt::to_host(a_in), kt::to_host(a_out)));
  for (int half : {0, 1})
    REQUIRE(kt::bits_of(kt::to_host(a_out)[half]) ==
            kt::fp8_amax_block_bits(dgu, half * I, N, I, 2 * I));

  // One entry cannot hold both halves' amaxes.
  View1<float> one("one", 1);
  REQUIRE_THROWS(swiglu_backward<float>(exec, dgu, kt::to_device(gu), d, N, I, one));
}

TEST_CASE("swiglu's fused FP8 amax through the Kokkos kernels (double)",
          "[kernels][swiglu][fp8][amax]") {
  swiglu_amax_cases<double>({{7, 13}, {0, 8}}, {0});
}

#if MESHTRAIN_HAVE_BF16
TEST_CASE("swiglu's fused FP8 amax is fp8_amax of the output (bf16)",
          "[kernels][swiglu][fp8][amax][bf16]") {
  swiglu_amax_cases<bf16>({{17, 96}, {17, 13}, {0, 8}}, {0, 1});
}
#endif
