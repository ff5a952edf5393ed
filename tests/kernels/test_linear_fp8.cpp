// The FP8 linear layer (kernels/linear_fp8.hpp) against a host reference that quantizes the same
// tensors with the codec (E4M3 inputs and weights, E5M2 output gradients, tensorwise scales)
// and multiplies the dequantized values in double; and against the fp32 linear layer within the
// error FP8 rounding allows. The agreement hook sees each tensor by name.
#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/linear.hpp"
#include "meshtrain/kernels/linear_fp8.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {

// decode(encode(x * scale)) / scale for every element, with the tensor's current scale.
std::vector<double> host_fake_quant(const std::vector<float>& x, Fp8Format f) {
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = fp8_scale_from_amax(amax, f), sinv = 1.0f / s;
  std::vector<double> q(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    q[i] = double(fp8_decode(fp8_encode(x[i] * s, f), f)) * double(sinv);
  return q;
}

void require_near(const std::vector<float>& got, const std::vector<double>& want,
                  const std::vector<double>& mag, double rtol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " element " << i << " got " << got[i] << " want " << want[i]);
    REQUIRE(std::fabs(double(got[i]) - want[i]) <= rtol * mag[i] + 1e-30);
  }
}

}  // namespace

TEST_CASE("linear_fp8 forward and backward match the quantized host reference", "[fp8]") {
  const int N = 24, IC = 40, OC = 56;
  const auto inp = kt::random_vector<float>(std::size_t(N) * IC, 51, -2.0, 2.0);
  const auto w = kt::random_vector<float>(std::size_t(IC) * OC, 52, -0.2, 0.2);
  const auto bias = kt::random_vector<float>(OC, 53);
  const auto dout = kt::random_vector<float>(std::size_t(N) * OC, 54, -1e-3, 1e-3);
  const auto dw0 = kt::random_vector<float>(std::size_t(IC) * OC, 55);
  const auto db0 = kt::random_vector<float>(OC, 56);

  std::vector<std::string> agreed;
  Fp8LinearOptions opt;
  opt.agree = [&](const Fp8Cast& cast, View1<float>, std::size_t count) {
    REQUIRE(count == 1);
    agreed.emplace_back(cast.tensor);
  };

  // Forward.
  View1<float> out = kt::nan_view<float>(std::size_t(N) * OC);
  linear_fp8_forward<float>(ExecSpace(), out, kt::to_device(inp), kt::to_device(w),
                            kt::to_device(bias), N, IC, OC, opt);
  REQUIRE(agreed == std::vector<std::string>{"inp", "weight"});
  const auto qx = host_fake_quant(inp, Fp8Format::e4m3), qw = host_fake_quant(w, Fp8Format::e4m3);
  const auto qg = host_fake_quant(dout, Fp8Format::e5m2);
  std::vector<double> want(std::size_t(N) * OC), mag(want.size()), exact(want.size());
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias[o], m = std::fabs(bias[o]), e = bias[o];
      for (int i = 0; i < IC; ++i) {
        s += qx[std::size_t(n) * IC + i] * qw[std::size_t(i) * OC + o];
        m += std::fabs(qx[std::size_t(n) * IC + i] * qw[std::size_t(i) * OC + o]);
        e += double(inp[std::size_t(n) * IC + i]) * w[std::size_t(i) * OC + o];
      }
      want[std::size_t(n) * OC + o] = s;
      mag[std::size_t(n) * OC + o] = m;
      exact[std::size_t(n) * OC + o] = e;
    }
  const auto got = kt::to_host(out);
  require_near(got, want, mag, 1e-5, "out");
  // Against the fp32 layer: FP8 rounding, E4M3 x E4M3 (relative 2^-4 each), and not exact.
  View1<float> out32("out32", want.size());
  linear_forward<float>(ExecSpace(), out32, kt::to_device(inp), kt::to_device(w),
                        kt::to_device(bias), N, IC, OC);
  const auto got32 = kt::to_host(out32);
  double max_diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    REQUIRE(std::fabs(double(got32[i]) - exact[i]) <= 1e-5 * mag[i]);
    REQUIRE(std::fabs(double(got[i]) - got32[i]) <= 0.14 * mag[i]);
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - got32[i]));
  }
  REQUIRE(max_diff > 0);

  // Backward.
  agreed.clear();
  View1<float> dinp = kt::nan_view<float>(std::size_t(N) * IC);
  View1<float> dw = kt::to_device(dw0), db = kt::to_device(db0);
  linear_fp8_backward<float>(ExecSpace(), dinp, dw, db, kt::to_device(dout), kt::to_device(inp),
                             kt::to_device(w), N, IC, OC, opt);
  REQUIRE(agreed == std::vector<std::string>{"dout", "weight", "inp"});
  std::vector<double> want_dinp(std::size_t(N) * IC), mag_dinp(want_dinp.size());
  for (int n = 0; n < N; ++n)
    for (int i = 0; i < IC; ++i) {
      double s = 0, m = 0;
      for (int o = 0; o < OC; ++o) {
        const double p = qg[std::size_t(n) * OC + o] * qw[std::size_t(i) * OC + o];
        s += p;
        m += std::fabs(p);
      }
      want_dinp[std::size_t(n) * IC + i] = s;
      mag_dinp[std::size_t(n) * IC + i] = m;
    }
  require_near(kt::to_host(dinp), want_dinp, mag_dinp, 1e-5, "dinp");
  std::vector<double> want_dw(dw0.size()), mag_dw(dw0.size());
  for (int i = 0; i < IC; ++i)
    for (int o = 0; o < OC; ++o) {
      double s = 0, m = 0;
      for (int n = 0; n < N; ++n) {
        const double p = qx[std::size_t(n) * IC + i] * qg[std::size_t(n) * OC + o];
        s += p;
        m += std::fabs(p);
      }
      const std::size_t io = std::size_t(i) * OC + o;
      want_dw[io] = dw0[io] + s;
      mag_dw[io] = m + std::fabs(dw0[io]);
    }
  require_near(kt::to_host(dw), want_dw, mag_dw, 1e-5, "dweight");
  std::vector<double> want_db(OC), mag_db(OC);
  for (int o = 0; o < OC; ++o) {
    double s = db0[o], m = std::fabs(db0[o]);
    for (int n = 0; n < N; ++n) {
      s += dout[std::size_t(n) * OC + o];
      m += std::fabs(dout[std::size_t(n) * OC + o]);
    }
    want_db[o] = s;
    mag_db[o] = m;
  }
  require_near(kt::to_host(db), want_db, mag_db, 1e-5, "dbias");

  // Without dinp and dbias: only dweight accumulates.
  View1<float> dw2 = kt::to_device(dw0);
  linear_fp8_backward<float>(ExecSpace(), View1<float>(), dw2, View1<float>(), kt::to_device(dout),
                             kt::to_device(inp), kt::to_device(w), N, IC, OC);
  require_near(kt::to_host(dw2), want_dw, mag_dw, 1e-5, "dweight (alone)");
}
