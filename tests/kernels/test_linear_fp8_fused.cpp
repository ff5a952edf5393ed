// Two passes the FP8 linear saves (kernels/linear_fp8.hpp), each against the plain call:
//  - Fp8LinearOptions::weight_scale: the forward keeps the weight's scale and the input
//    gradient's cast of W^T takes it instead of reducing and agreeing the amax again — the
//    same bits, one agreement fewer, and the slot holds the forward's amax, scale and
//    scale_inv;
//  - the residual as the forward GEMM's C (linear_fp8_forward_gemm's `residual`): out =
//    residual + x W^T (+ bias) from one GEMM, against the GEMM followed by the addition on the
//    host, to fp32 rounding; the residual is only read.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

TEST_CASE("linear_fp8: a weight scale kept from the forward gives the backward's own bits",
          "[fp8]") {
  const int N = 32, IC = 48, OC = 64;
  const auto inp = kt::random_vector<float>(std::size_t(N) * IC, 71, -2.0, 2.0);
  const auto w = kt::random_vector<float>(std::size_t(OC) * IC, 72, -0.3, 0.3);
  const auto dout = kt::random_vector<float>(std::size_t(N) * OC, 73, -1e-3, 1e-3);
  const auto d_inp = kt::to_device(inp), d_w = kt::to_device(w), d_g = kt::to_device(dout);
  for (const auto layout : {Fp8WeightLayout::out_in, Fp8WeightLayout::in_out}) {
    INFO((layout == Fp8WeightLayout::out_in ? "out_in" : "in_out"));
    // kept: the forward writes the slot, the backward reads it.
    auto run = [&](bool kept, int& weight_agreements, std::vector<float>& slot) {
      Fp8Workspace ws;
      Fp8LinearOptions o;
      o.layout = layout;
      o.workspace = &ws;
      weight_agreements = 0;
      o.agree = [&](const Fp8Cast& c, View1<float>, std::size_t) {
        if (std::string(c.tensor) == "weight") ++weight_agreements;
      };
      if (kept) o.weight_scale = kt::nan_view<float>(kFp8WeightScaleFloats);
      View1<float> out("out", std::size_t(N) * OC), dinp = kt::nan_view<float>(inp.size());
      linear_fp8_forward_gemm<float>(ExecSpace(), out.data(), OC, nullptr, d_inp.data(),
                                     d_w.data(), N, IC, OC, o);
      // Another weight's forward between: a workspace's scale would be overwritten, the
      // slot is not (it is this weight's).
      Fp8LinearOptions other = o;
      other.weight_scale = {};
      View1<float> scratch("scratch", std::size_t(N) * OC);
      const auto w2 = kt::to_device(kt::random_vector<float>(w.size(), 74, -3.0, 3.0));
      linear_fp8_forward_gemm<float>(ExecSpace(), scratch.data(), OC, nullptr, d_inp.data(),
                                     w2.data(), N, IC, OC, other);
      const Fp8Tensor g = linear_fp8_grad<float>(ExecSpace(), d_g.data(), OC, N, OC, o);
      linear_fp8_dinp_gemm<float>(ExecSpace(), dinp.data(), 0.0f, g, d_w.data(), N, IC, OC, o);
      if (kept) slot = kt::to_host(o.weight_scale);
      return std::vector<std::vector<float>>{kt::to_host(out), kt::to_host(dinp)};
    };
    int plain_agreements = 0, kept_agreements = 0;
    std::vector<float> slot;
    const auto plain = run(false, plain_agreements, slot);
    const auto kept = run(true, kept_agreements, slot);
    REQUIRE(kept.size() == plain.size());
    for (std::size_t i = 0; i < kept.size(); ++i)
      REQUIRE(std::memcmp(kept[i].data(), plain[i].data(), kept[i].size() * sizeof(float)) == 0);
    // Plain: the forward's, the other weight's and the backward's; kept: not the backward's.
    REQUIRE(plain_agreements == 3);
    REQUIRE(kept_agreements == 2);
    float amax = 0;
    for (float v : w) amax = std::max(amax, std::fabs(v));
    REQUIRE(slot[0] == amax);
    REQUIRE(slot[4] == fp8_scale_from_amax(amax, Fp8Format::e4m3));
    REQUIRE(slot[8] == 1.0f / slot[4]);
  }
}

TEST_CASE("linear_fp8: the residual as the forward GEMM's C", "[fp8]") {
  const int N = 24, IC = 48, OC = 32, LD = OC + 16;  // out and residual rows strided
  const auto inp = kt::random_vector<float>(std::size_t(N) * IC, 81, -2.0, 2.0);
  const auto w = kt::random_vector<float>(std::size_t(OC) * IC, 82, -0.3, 0.3);
  const auto bias = kt::random_vector<float>(OC, 83);
  const auto res = kt::random_vector<float>(std::size_t(N) * LD, 84, -4.0, 4.0);
  const auto d_inp = kt::to_device(inp), d_w = kt::to_device(w), d_b = kt::to_device(bias);
  for (const bool with_bias : {false, true}) {
    INFO((with_bias ? "with bias" : "no bias"));
    Fp8LinearOptions o;
    o.layout = Fp8WeightLayout::out_in;
    const float* b = with_bias ? d_b.data() : nullptr;
    View1<float> plain("plain", std::size_t(N) * LD);
    linear_fp8_forward_gemm<float>(ExecSpace(), plain.data(), LD, b, d_inp.data(), d_w.data(),
                                   N, IC, OC, o);
    const View1<float> d_res = kt::to_device(res);
    View1<float> fused = kt::nan_view<float>(std::size_t(N) * LD);
    const Fp8Tensor a = linear_fp8_input<float>(ExecSpace(), d_inp.data(), N, IC, o);
    linear_fp8_forward_gemm<float>(ExecSpace(), fused.data(), LD, b, a, d_w.data(), N, IC, OC, o,
                                   d_res.data());
    const auto p = kt::to_host(plain), f = kt::to_host(fused), r = kt::to_host(d_res);
    REQUIRE(std::memcmp(r.data(), res.data(), res.size() * sizeof(float)) == 0);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < OC; ++c) {
        const std::size_t i = std::size_t(n) * LD + c;
        const double want = double(p[i]) + double(res[i]);
        INFO("row " << n << " col " << c << " fused " << f[i] << " want " << want);
        // Two roundings against one: a few fp32 ulps of the operands' magnitude.
        REQUIRE(std::fabs(double(f[i]) - want) <=
                4e-7 * (std::fabs(double(p[i])) + std::fabs(double(res[i]))) + 1e-30);
      }
  }
}
