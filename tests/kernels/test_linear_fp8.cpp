// The FP8 linear layer (kernels/linear_fp8.hpp) against a host reference that quantizes the same
// tensors with the codec (E4M3 inputs and weights, E5M2 output gradients, tensorwise scales)
// and multiplies the dequantized values in double; and against the fp32 linear layer within the
// error FP8 rounding allows. The agreement hook sees each tensor by name.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"
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

namespace {

// Fake-quantizes the row-major [rows, K] operand m as the GEMM reads it (K contiguous): one
// scale for all of it (tensorwise), or one per row (rowwise).
std::vector<double> host_quant_rows(const std::vector<double>& m, int rows, int K, bool rowwise,
                                    Fp8Format f) {
  std::vector<double> q(m.size());
  std::vector<float> amax(rowwise ? rows : 1, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < K; ++k) {
      float& a = amax[rowwise ? r : 0];
      a = std::max(a, std::fabs(float(m[std::size_t(r) * K + k])));
    }
  for (int r = 0; r < rows; ++r) {
    const float s = fp8_scale_from_amax(amax[rowwise ? r : 0], f), sinv = 1.0f / s;
    for (int k = 0; k < K; ++k) {
      const std::size_t i = std::size_t(r) * K + k;
      q[i] = double(fp8_decode(fp8_encode(float(m[i]) * s, f), f)) * double(sinv);
    }
  }
  return q;
}

// C[M, N] = sum_k A[m, k] B[n, k] of two K-contiguous operands, with sum |A B| as magnitude.
void host_tn(const std::vector<double>& a, const std::vector<double>& b, int M, int N, int K,
             std::vector<double>& c, std::vector<double>& mag) {
  c.assign(std::size_t(M) * N, 0.0);
  mag.assign(c.size(), 0.0);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const double p = a[std::size_t(m) * K + k] * b[std::size_t(n) * K + k];
        c[std::size_t(m) * N + n] += p;
        mag[std::size_t(m) * N + n] += std::fabs(p);
      }
}

}  // namespace

// The GEMMs one at a time, as Llama's block calls them: nn.Linear's [OC, IC] weight (and
// Conv1D's), the output and its gradient column blocks of wider buffers (row stride > OC), the
// input gradient accumulated (beta = 1), tensorwise and rowwise; against an fp64 host reference
// of the dequantized operands each GEMM reads (K-contiguous, rowwise scales along K). 1e-5 of
// sum |a b|: the emulation is exact products in fp32 with fp32 sums and one scale multiply.
TEST_CASE("linear_fp8 GEMMs in both weight layouts, strided, tensorwise and rowwise", "[fp8]") {
  const int N = 20, IC = 24, OC = 40, LD = 56;  // dout and out: columns [8, 48) of LD
  const int col = 8;
  for (const auto layout : {Fp8WeightLayout::out_in, Fp8WeightLayout::in_out})
    for (const auto scaling : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise}) {
      const bool oi = layout == Fp8WeightLayout::out_in, rw = scaling == Fp8Scaling::rowwise;
      INFO((oi ? "out_in " : "in_out ") << fp8_scaling_name(scaling));
      // Row-dependent magnitudes so that rowwise scales differ from the tensor's.
      auto inp = kt::random_vector<float>(std::size_t(N) * IC, 61, -2.0, 2.0);
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < IC; ++i) inp[std::size_t(n) * IC + i] *= 1.0f + n;
      const auto w = kt::random_vector<float>(std::size_t(IC) * OC, 62, -0.2, 0.2);
      auto wide = kt::random_vector<float>(std::size_t(N) * LD, 63, -1e-3, 1e-3);
      const auto dinp0 = kt::random_vector<float>(std::size_t(N) * IC, 64);
      const auto dw0 = kt::random_vector<float>(std::size_t(IC) * OC, 65);
      auto W = [&](int o, int i) {  // the weight as [OC, IC] whatever its layout
        return double(oi ? w[std::size_t(o) * IC + i] : w[std::size_t(i) * OC + o]);
      };
      auto G = [&](int n, int o) { return double(wide[std::size_t(n) * LD + col + o]); };
      std::vector<double> x_nk(inp.begin(), inp.end()), x_kn(std::size_t(IC) * N),
          w_oi(std::size_t(OC) * IC), w_io(std::size_t(IC) * OC), g_no(std::size_t(N) * OC),
          g_on(std::size_t(OC) * N);
      for (int n = 0; n < N; ++n)
        for (int i = 0; i < IC; ++i) x_kn[std::size_t(i) * N + n] = inp[std::size_t(n) * IC + i];
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < IC; ++i) {
          w_oi[std::size_t(o) * IC + i] = W(o, i);
          w_io[std::size_t(i) * OC + o] = W(o, i);
        }
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
          g_no[std::size_t(n) * OC + o] = G(n, o);
          g_on[std::size_t(o) * N + n] = G(n, o);
        }
      const auto e4 = Fp8Format::e4m3, e5 = Fp8Format::e5m2;

      Fp8LinearOptions opt;
      opt.layout = layout;
      opt.scaling = scaling;
      std::vector<std::string> sites;
      opt.agree = [&](const Fp8Cast& c, View1<float>, std::size_t count) {
        REQUIRE(c.scaling == scaling);
        sites.push_back(cat(c.tensor, " k", c.k_dim));
        REQUIRE(count >= 1);
      };
      const auto d_inp = kt::to_device(inp), d_w = kt::to_device(w);
      View1<float> d_wide = kt::to_device(wide);
      // Forward into the column block: the other columns stay.
      linear_fp8_forward_gemm<float>(ExecSpace(), d_wide.data() + col, LD, nullptr, d_inp.data(),
                                     d_w.data(), N, IC, OC, opt);
      std::vector<double> want, mag;
      host_tn(host_quant_rows(x_nk, N, IC, rw, e4), host_quant_rows(w_oi, OC, IC, rw, e4), N, OC,
              IC, want, mag);
      const auto got = kt::to_host(d_wide);
      for (int n = 0; n < N; ++n)
        for (int c = 0; c < LD; ++c) {
          const float v = got[std::size_t(n) * LD + c];
          if (c < col || c >= col + OC) {
            REQUIRE(v == wide[std::size_t(n) * LD + c]);
            continue;
          }
          const std::size_t i = std::size_t(n) * OC + (c - col);
          INFO("out " << n << "," << c - col);
          REQUIRE(std::fabs(double(v) - want[i]) <= 1e-5 * mag[i] + 1e-30);
        }
      REQUIRE(sites == std::vector<std::string>{"inp k1", oi ? "weight k1" : "weight k0"});

      // Backward: dout from the wide buffer, dinp accumulated, dweight added.
      sites.clear();
      const auto d_g = kt::to_device(wide);
      View1<float> d_dinp = kt::to_device(dinp0), d_dw = kt::to_device(dw0);
      const Fp8Tensor g = linear_fp8_grad<float>(ExecSpace(), d_g.data() + col, LD, N, OC, opt);
      linear_fp8_dinp_gemm<float>(ExecSpace(), d_dinp.data(), 1.0f, g, d_w.data(), N, IC, OC, opt);
      linear_fp8_dweight_gemm<float>(ExecSpace(), d_dw.data(), g, d_g.data() + col, LD,
                                     d_inp.data(), N, IC, OC, opt);
      std::vector<std::string> want_sites{"dout k1", oi ? "weight k0" : "weight k1", "inp k0"};
      if (rw) want_sites.push_back("dout k0");  // tensorwise reuses dout's scale
      REQUIRE(sites == want_sites);
      host_tn(host_quant_rows(g_no, N, OC, rw, e5), host_quant_rows(w_io, IC, OC, rw, e4), N, IC,
              OC, want, mag);
      const auto got_dinp = kt::to_host(d_dinp);
      for (std::size_t i = 0; i < got_dinp.size(); ++i) {
        INFO("dinp " << i);
        REQUIRE(std::fabs(double(got_dinp[i]) - (dinp0[i] + want[i])) <=
                1e-5 * (mag[i] + std::fabs(dinp0[i])) + 1e-30);
      }
      // dW[o, i] = sum_n dout^T[o, n] inp^T[i, n]
      host_tn(host_quant_rows(g_on, OC, N, rw, e5), host_quant_rows(x_kn, IC, N, rw, e4), OC, IC,
              N, want, mag);
      const auto got_dw = kt::to_host(d_dw);
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < IC; ++i) {
          const std::size_t at = oi ? std::size_t(o) * IC + i : std::size_t(i) * OC + o;
          const std::size_t r = std::size_t(o) * IC + i;
          INFO("dweight " << o << "," << i);
          REQUIRE(std::fabs(double(got_dw[at]) - (dw0[at] + want[r])) <=
                  1e-5 * (mag[r] + std::fabs(dw0[at])) + 1e-30);
        }

      // --fp8.wgrad_bf16: the weight gradient in the layer's type, unquantized (fp32 here).
      opt.wgrad_high_precision = true;
      View1<float> d_dw2 = kt::to_device(dw0);
      linear_fp8_dweight_gemm<float>(ExecSpace(), d_dw2.data(), g, d_g.data() + col, LD,
                                     d_inp.data(), N, IC, OC, opt);
      host_tn(g_on, x_kn, OC, IC, N, want, mag);
      const auto got_dw2 = kt::to_host(d_dw2);
      for (int o = 0; o < OC; ++o)
        for (int i = 0; i < IC; ++i) {
          const std::size_t at = oi ? std::size_t(o) * IC + i : std::size_t(i) * OC + o;
          const std::size_t r = std::size_t(o) * IC + i;
          REQUIRE(std::fabs(double(got_dw2[at]) - (dw0[at] + want[r])) <=
                  1e-5 * (mag[r] + std::fabs(dw0[at])) + 1e-30);
        }
    }
}

// The model's casts come from an Fp8Workspace (buffers kept from call to call, grown when a
// shape needs more, dout's cast kept apart per slot): every GEMM must give the bits of the
// per-call allocation, whatever ran before it in the workspace — shapes growing and shrinking,
// strided dout (the pack buffers), both scalings, and two slots' dout casts held at once as the
// pieces of a packed q|k|v are.
TEST_CASE("linear_fp8 with a workspace gives the bits of per-call buffers", "[fp8]") {
  struct Shape {
    int N, IC, OC;
  };
  Fp8Workspace ws;
  for (const auto scaling : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise})
    // Every K (IC, OC, N) a multiple of 16: cuBLASLt's FP8 matmul takes all of them on GPUs.
    for (const Shape s : {Shape{16, 32, 48}, Shape{32, 64, 48}, Shape{16, 16, 32}}) {
      INFO(fp8_scaling_name(scaling) << " N " << s.N << " IC " << s.IC << " OC " << s.OC);
      const int LD = 2 * s.OC;  // two pieces of dout side by side, as Llama's packed q|k|v
      const auto inp = kt::random_vector<float>(std::size_t(s.N) * s.IC, 81, -2.0, 2.0);
      const auto w = kt::random_vector<float>(std::size_t(s.IC) * s.OC, 82, -0.2, 0.2);
      auto dout = kt::random_vector<float>(std::size_t(s.N) * LD, 83, -1e-3, 1e-3);
      for (std::size_t i = 0; i < dout.size(); ++i)
        if (i % LD >= std::size_t(s.OC)) dout[i] *= 7.0f;  // piece 1's scale differs
      const auto d_inp = kt::to_device(inp), d_w = kt::to_device(w), d_g = kt::to_device(dout);
      auto run = [&](Fp8Workspace* workspace) {
        Fp8LinearOptions o;
        o.scaling = scaling;
        o.layout = Fp8WeightLayout::out_in;
        o.workspace = workspace;
        View1<float> out("out", std::size_t(s.N) * s.OC), dinp("dinp", std::size_t(s.N) * s.IC),
            dw0("dw0", std::size_t(s.IC) * s.OC), dw1("dw1", std::size_t(s.IC) * s.OC);
        linear_fp8_forward_gemm<float>(ExecSpace(), out.data(), s.OC, nullptr, d_inp.data(),
                                       d_w.data(), s.N, s.IC, s.OC, o);
        o.slot = 0;
        const Fp8Tensor g0 = linear_fp8_grad<float>(ExecSpace(), d_g.data(), LD, s.N, s.OC, o);
        o.slot = 1;
        const Fp8Tensor g1 =
            linear_fp8_grad<float>(ExecSpace(), d_g.data() + s.OC, LD, s.N, s.OC, o);
        o.slot = 0;
        linear_fp8_dinp_gemm<float>(ExecSpace(), dinp.data(), 0.0f, g0, d_w.data(), s.N, s.IC,
                                    s.OC, o);
        o.slot = 1;
        linear_fp8_dinp_gemm<float>(ExecSpace(), dinp.data(), 1.0f, g1, d_w.data(), s.N, s.IC,
                                    s.OC, o);
        o.slot = 0;
        linear_fp8_dweight_gemm<float>(ExecSpace(), dw0.data(), g0, d_g.data(), LD, d_inp.data(),
                                       s.N, s.IC, s.OC, o);
        o.slot = 1;
        linear_fp8_dweight_gemm<float>(ExecSpace(), dw1.data(), g1, d_g.data() + s.OC, LD,
                                       d_inp.data(), s.N, s.IC, s.OC, o);
        return std::vector<std::vector<float>>{kt::to_host(out), kt::to_host(dinp),
                                               kt::to_host(dw0), kt::to_host(dw1)};
      };
      const int before = gemm_fp8_cublaslt_calls();
      const auto fresh = run(nullptr);
      REQUIRE(run(&ws) == fresh);
      REQUIRE(run(&ws) == fresh);  // the same buffers again
      // On GPUs all 15 tensorwise GEMMs ran in cuBLASLt, not the emulation: the workspace's
      // pointers (the scales' alignment above all) are ones it takes. Rowwise (outer-vector
      // scales) depends on the cuBLASLt version: said, not required. Host builds emulate.
      const int lt = gemm_fp8_cublaslt_calls() - before;
      if constexpr (!kDeviceIsHost) {
        if (scaling == Fp8Scaling::tensorwise) REQUIRE(lt == 15);
        else WARN("rowwise: " << lt << " of 15 FP8 GEMMs in cuBLASLt");
      }
      REQUIRE(fresh[2] != fresh[3]);  // the two pieces are different gradients
    }
  REQUIRE(ws.bytes() > 0);
}

// Linears that read one input (Llama's q, k, v; gate, up) share its cast: linear_fp8_input once
// for their forward GEMMs and linear_fp8_input_t once for their weight gradients must give the
// bits of each linear casting the input itself, in both scalings, and agree the input's amax
// once instead of once per linear.
TEST_CASE("linear_fp8: one input cast for several linears gives each linear's own bits",
          "[fp8]") {
  const int N = 32, IC = 48, OC = 32, LD = 2 * OC;
  const auto inp = kt::random_vector<float>(std::size_t(N) * IC, 91, -2.0, 2.0);
  const auto w0 = kt::random_vector<float>(std::size_t(OC) * IC, 92, -0.2, 0.2);
  const auto w1 = kt::random_vector<float>(std::size_t(OC) * IC, 93, -0.5, 0.5);
  const auto dout = kt::random_vector<float>(std::size_t(N) * LD, 94, -1e-3, 1e-3);
  const auto d_inp = kt::to_device(inp), d_g = kt::to_device(dout);
  const View1<float> d_w[2] = {kt::to_device(w0), kt::to_device(w1)};
  for (const auto scaling : {Fp8Scaling::tensorwise, Fp8Scaling::rowwise}) {
    INFO(fp8_scaling_name(scaling));
    Fp8Workspace ws;
    auto run = [&](bool shared, int& input_agreements) {
      Fp8LinearOptions o;
      o.scaling = scaling;
      o.layout = Fp8WeightLayout::out_in;
      o.workspace = &ws;
      input_agreements = 0;
      o.agree = [&](const Fp8Cast& c, View1<float>, std::size_t) {
        if (std::string(c.tensor) == "inp") ++input_agreements;
      };
      View1<float> out("out", std::size_t(N) * LD), dw[2] = {View1<float>("dw0", w0.size()),
                                                              View1<float>("dw1", w1.size())};
      Fp8Tensor a;
      if (shared) a = linear_fp8_input<float>(ExecSpace(), d_inp.data(), N, IC, o);
      for (int i = 0; i < 2; ++i) {
        if (shared)
          linear_fp8_forward_gemm<float>(ExecSpace(), out.data() + i * OC, LD, nullptr, a,
                                         d_w[i].data(), N, IC, OC, o);
        else
          linear_fp8_forward_gemm<float>(ExecSpace(), out.data() + i * OC, LD, nullptr,
                                         d_inp.data(), d_w[i].data(), N, IC, OC, o);
      }
      Fp8Tensor g[2];
      for (int i = 0; i < 2; ++i) {
        o.slot = i;
        g[i] = linear_fp8_grad<float>(ExecSpace(), d_g.data() + i * OC, LD, N, OC, o);
      }
      o.slot = 0;
      Fp8Tensor xt;
      if (shared) xt = linear_fp8_input_t<float>(ExecSpace(), d_inp.data(), N, IC, o);
      for (int i = 0; i < 2; ++i) {
        o.slot = i;
        if (shared)
          linear_fp8_dweight_gemm<float>(ExecSpace(), dw[i].data(), g[i], d_g.data() + i * OC,
                                         LD, xt, N, IC, OC, o);
        else
          linear_fp8_dweight_gemm<float>(ExecSpace(), dw[i].data(), g[i], d_g.data() + i * OC,
                                         LD, d_inp.data(), N, IC, OC, o);
      }
      return std::vector<std::vector<float>>{kt::to_host(out), kt::to_host(dw[0]),
                                             kt::to_host(dw[1])};
    };
    int separate_agreements = 0, shared_agreements = 0;
    const auto separate = run(false, separate_agreements);
    const auto shared = run(true, shared_agreements);
    REQUIRE(shared == separate);
    REQUIRE(separate_agreements == 4);  // forward and weight gradient, each linear
    REQUIRE(shared_agreements == 2);
    REQUIRE(separate[1] != separate[2]);
  }
}

// An output gradient whose amax its producer already set (a fused amax: GELU's or SwiGLU's
// backward, one per piece of a packed gate|up): linear_fp8_grad takes that amax instead of
// reducing its own, and must give the bits of the cast that reduces its own — input and weight
// gradients of two pieces under their own scales, with and without fp8.wgrad_bf16 — and still
// agree it: the hook runs once per piece on the given amax, in place (here an agreement with a
// peer whose amax, 0.01, is larger than this rank's ~1e-3, so that it changes the scales).
// Rowwise (a scale per row) takes none.
TEST_CASE("linear_fp8_grad with its amax already set gives the bits of its own, agreed",
          "[fp8]") {
  const int N = 32, IC = 48, OC = 32, LD = 2 * OC;
  const auto inp = kt::random_vector<float>(std::size_t(N) * IC, 101, -2.0, 2.0);
  const auto w0 = kt::random_vector<float>(std::size_t(OC) * IC, 102, -0.2, 0.2);
  const auto w1 = kt::random_vector<float>(std::size_t(OC) * IC, 103, -0.5, 0.5);
  auto dout = kt::random_vector<float>(std::size_t(N) * LD, 104, -1e-3, 1e-3);
  for (std::size_t i = 0; i < dout.size(); ++i)
    if (i % LD >= std::size_t(OC)) dout[i] *= 30.0f;  // piece 1 above the peer's 0.01
  const auto d_inp = kt::to_device(inp), d_g = kt::to_device(dout);
  const View1<float> d_w[2] = {kt::to_device(w0), kt::to_device(w1)};
  for (const bool wgrad_bf16 : {false, true}) {
    INFO((wgrad_bf16 ? "wgrad_bf16" : "FP8 weight gradients"));
    auto run = [&](bool amax_set, int& agreements) {
      Fp8LinearOptions o;
      o.layout = Fp8WeightLayout::out_in;
      o.wgrad_high_precision = wgrad_bf16;
      agreements = 0;
      o.agree = [&](const Fp8Cast& c, View1<float> amax, std::size_t count) {
        if (std::string(c.tensor) != "dout") return;
        REQUIRE(count == 1);
        ++agreements;
        auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, amax);
        h(0) = std::max(h(0), 0.01f);
        Kokkos::deep_copy(amax, h);
      };
      // The producer's amaxes, one per piece.
      View1<float> set("set", 2);
      for (int i = 0; i < 2; ++i)
        fp8_amax_block<float>(ExecSpace(), slice(set, i, 1), d_g.data() + i * OC, N, OC, LD);
      View1<float> dinp("dinp", std::size_t(N) * IC),
          dw[2] = {View1<float>("dw0", w0.size()), View1<float>("dw1", w1.size())};
      Fp8Tensor g[2];
      for (int i = 0; i < 2; ++i) {
        o.slot = i;
        g[i] = linear_fp8_grad<float>(ExecSpace(), d_g.data() + i * OC, LD, N, OC, o,
                                      amax_set ? View1<float>(slice(set, i, 1)) : View1<float>{});
        if (amax_set) REQUIRE(g[i].amax.data() == set.data() + i);
        linear_fp8_dinp_gemm<float>(ExecSpace(), dinp.data(), i == 0 ? 0.0f : 1.0f, g[i],
                                    d_w[i].data(), N, IC, OC, o);
        linear_fp8_dweight_gemm<float>(ExecSpace(), dw[i].data(), g[i], d_g.data() + i * OC, LD,
                                       d_inp.data(), N, IC, OC, o);
      }
      std::vector<std::vector<float>> r{kt::to_host(dinp), kt::to_host(dw[0]),
                                        kt::to_host(dw[1])};
      if (amax_set) r.push_back(kt::to_host(set));  // the agreed amaxes, in place
      return r;
    };
    int own = 0, given = 0;
    const auto reduced = run(false, own);
    const auto fused = run(true, given);
    REQUIRE(own == 2);
    REQUIRE(given == 2);
    for (int k = 0; k < 3; ++k) REQUIRE(fused[k] == reduced[k]);
    REQUIRE(fused[3][0] == 0.01f);  // piece 0's amax was raised to the peer's
    REQUIRE(fused[3][1] > 0.01f);   // piece 1's is its own
  }
  Fp8LinearOptions rowwise;
  rowwise.scaling = Fp8Scaling::rowwise;
  View1<float> set("set", 1);
  REQUIRE_THROWS(linear_fp8_grad<float>(ExecSpace(), d_g.data(), LD, N, OC, rowwise, set));
}
