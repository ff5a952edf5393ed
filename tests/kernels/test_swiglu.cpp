// SwiGLU on the packed [gate | up] buffer: forward against the formula in double (extreme gate
// values included), backward (double instantiation) against central finite differences, float
// against double, the in-place backward, and bf16's order of operations (HF's) bit for bit.
#include <cmath>

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
