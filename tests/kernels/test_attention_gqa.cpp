// Grouped-query attention (NKV key/value heads shared by NH / NKV query heads each): every
// attention path against a naive double host implementation (out, lse), the backward against
// central differences in double, and against an independent construction: the same attention
// with the kv heads replicated to NH heads (plain multi-head attention), whose dK/dV summed over
// each group must equal the GQA dK/dV. Then the dispatched tiled path (CBLAS on a host build,
// the CUDA kernels on a GPU build) against the portable flash kernels at larger shapes, and
// the NKV = NH call equal bit for bit to the default (NKV = 0) call.
#include <algorithm>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/attention/attention.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct Gqa {
  int B, T, NH, NKV, HS;
  int G() const { return NH / NKV; }
  std::size_t C() const { return std::size_t(NH) * HS; }
  std::size_t Ckv() const { return std::size_t(NKV) * HS; }
  std::size_t ld() const { return C() + 2 * Ckv(); }
  std::size_t qkv() const { return std::size_t(B) * T * ld(); }
  std::size_t out() const { return std::size_t(B) * T * C(); }
  std::size_t lse() const { return std::size_t(B) * NH * T; }
};

// Softmax(q k^T / sqrt(HS)) v, causal, query head h on kv head h / G, all in double.
void gqa_host(const Gqa& s, const std::vector<double>& qkv, std::vector<double>& out,
              std::vector<double>& lse) {
  const std::size_t C = s.C(), Ckv = s.Ckv(), ld = s.ld();
  out.assign(s.out(), 0.0);
  lse.assign(s.lse(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.HS));
  std::vector<double> p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h) {
      const int kvh = h / s.G();
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[(std::size_t(b) * s.T + i) * ld + h * s.HS];
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(std::size_t(b) * s.T + j) * ld + C + kvh * s.HS];
          double d = 0;
          for (int e = 0; e < s.HS; ++e) d += q[e] * k[e];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - mx);
        lse[(std::size_t(b) * s.NH + h) * s.T + i] = mx + std::log(sum);
        for (int j = 0; j <= i; ++j) {
          const double w = std::exp(p[j] - mx) / sum;
          const double* v = &qkv[(std::size_t(b) * s.T + j) * ld + C + Ckv + kvh * s.HS];
          double* o = &out[(std::size_t(b) * s.T + i) * C + h * s.HS];
          for (int e = 0; e < s.HS; ++e) o[e] += w * v[e];
        }
      }
    }
}

// The GQA buffer with every kv head copied to the G query heads that read it: an MHA buffer
// [B*T, 3*NH*HS] that must give the same attention.
std::vector<double> replicate_kv(const Gqa& s, const std::vector<double>& qkv) {
  const std::size_t C = s.C(), Ckv = s.Ckv(), ld = s.ld(), rows = std::size_t(s.B) * s.T;
  std::vector<double> r(rows * 3 * C);
  for (std::size_t i = 0; i < rows; ++i)
    for (int h = 0; h < s.NH; ++h)
      for (int e = 0; e < s.HS; ++e) {
        const std::size_t kvh = std::size_t(h / s.G());
        r[i * 3 * C + h * s.HS + e] = qkv[i * ld + h * s.HS + e];
        r[i * 3 * C + C + h * s.HS + e] = qkv[i * ld + C + kvh * s.HS + e];
        r[i * 3 * C + 2 * C + h * s.HS + e] = qkv[i * ld + C + Ckv + kvh * s.HS + e];
      }
  return r;
}

// The MHA gradient of replicate_kv's buffer folded back: dq as is, dk/dv summed over each group.
std::vector<double> fold_kv_grad(const Gqa& s, const std::vector<double>& dmha) {
  const std::size_t C = s.C(), Ckv = s.Ckv(), ld = s.ld(), rows = std::size_t(s.B) * s.T;
  std::vector<double> r(rows * ld, 0.0);
  for (std::size_t i = 0; i < rows; ++i)
    for (int h = 0; h < s.NH; ++h)
      for (int e = 0; e < s.HS; ++e) {
        const std::size_t kvh = std::size_t(h / s.G());
        r[i * ld + h * s.HS + e] = dmha[i * 3 * C + h * s.HS + e];
        r[i * ld + C + kvh * s.HS + e] += dmha[i * 3 * C + C + h * s.HS + e];
        r[i * ld + C + Ckv + kvh * s.HS + e] += dmha[i * 3 * C + 2 * C + h * s.HS + e];
      }
  return r;
}
}  // namespace

TEST_CASE("GQA forward: every path matches a naive double host version",
          "[kernels][attention][gqa]") {
  // NKV = 1 (multi-query), 2 of 4, 2 of 6; HS = 20 is no power of two.
  for (const Gqa s : {Gqa{2, 9, 4, 1, 8}, Gqa{2, 33, 4, 2, 20}, Gqa{1, 70, 6, 2, 16}}) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS);
    const auto qkv = kt::random_vector<double>(s.qkv(), 3, -2.0, 2.0);
    std::vector<double> want_out, want_lse;
    gqa_host(s, qkv, want_out, want_lse);
    ExecSpace exec;
    const auto dqkv = kt::to_device(qkv);
    auto out = kt::nan_view<double>(s.out()), out_f = kt::nan_view<double>(s.out());
    auto out_r = kt::nan_view<double>(s.out());
    auto lse = kt::nan_view<float>(s.lse()), lse_f = kt::nan_view<float>(s.lse());
    attention_forward<double>(exec, out, lse, dqkv, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_forward_flash<double>(exec, out_f, lse_f, dqkv, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_forward_reference<double>(exec, out_r, dqkv, s.B, s.T, s.NH, s.HS, s.NKV);
    kt::require_close(kt::to_host(out), want_out, 1e-12, 1e-12, "dispatched out vs host");
    kt::require_close(kt::to_host(out_f), want_out, 1e-12, 1e-12, "flash out vs host");
    kt::require_close(kt::to_host(out_r), want_out, 1e-12, 1e-12, "reference out vs host");
    // lse is fp32 by contract.
    kt::require_close(kt::to_host(lse), want_lse, 1e-6, 1e-6, "dispatched lse vs host");
    kt::require_close(kt::to_host(lse_f), want_lse, 1e-6, 1e-6, "flash lse vs host");
  }
}

TEST_CASE("GQA backward matches finite differences (double) on every path",
          "[kernels][attention][gqa]") {
  const Gqa s{2, 7, 4, 2, 4};
  auto qkv = kt::random_vector<double>(s.qkv(), 13, -1.5, 1.5);
  const auto R = kt::random_vector<double>(s.out(), 14);
  ExecSpace exec;
  View1<float> lse("lse", s.lse());
  View1<double> out("out", s.out());
  auto objective = [&]() {
    attention_forward<double>(exec, out, lse, kt::to_device(qkv), s.B, s.T, s.NH, s.HS, s.NKV);
    return kt::dot(kt::to_host(out), R);
  };
  const auto fd = kt::fd_gradient(qkv, objective, 1e-5);
  objective();
  const auto dR = kt::to_device(R), dq = kt::to_device(qkv);
  auto dqkv = kt::nan_view<double>(s.qkv()), dqkv_f = kt::nan_view<double>(s.qkv());
  attention_backward<double>(exec, dqkv, dR, dq, out, lse, s.B, s.T, s.NH, s.HS, s.NKV);
  attention_backward_flash<double>(exec, dqkv_f, dR, dq, out, lse, s.B, s.T, s.NH, s.HS, s.NKV);
  // As for MHA (test_attention.cpp): lse is fp32, ~2e-7 relative in the probabilities.
  kt::require_close(kt::to_host(dqkv), fd, 1e-5, 2e-6, "dispatched dqkv vs FD");
  kt::require_close(kt::to_host(dqkv_f), fd, 1e-5, 2e-6, "flash dqkv vs FD");
}

TEST_CASE("GQA equals multi-head attention on replicated kv heads, dK/dV summed per group",
          "[kernels][attention][gqa]") {
  for (const Gqa s : {Gqa{2, 33, 4, 2, 20}, Gqa{1, 150, 8, 2, 16}, Gqa{1, 40, 3, 1, 8}}) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS);
    const auto qkv = kt::random_vector<double>(s.qkv(), 23, -2.0, 2.0);
    const auto dout = kt::to_device(kt::random_vector<double>(s.out(), 24));
    const auto mha = replicate_kv(s, qkv);
    ExecSpace exec;
    const auto dg = kt::to_device(qkv), dm = kt::to_device(mha);
    View1<double> out("out", s.out()), out_m("out_m", s.out());
    View1<float> lse("lse", s.lse()), lse_m("lse_m", s.lse());
    attention_forward<double>(exec, out, lse, dg, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_forward<double>(exec, out_m, lse_m, dm, s.B, s.T, s.NH, s.HS);
    kt::require_close(kt::to_host(out), kt::to_host(out_m), 1e-12, 1e-12, "out");
    kt::require_close(kt::to_host(lse), kt::to_host(lse_m), 0.0, 0.0, "lse");
    auto dqkv = kt::nan_view<double>(s.qkv()), dmha = kt::nan_view<double>(mha.size());
    attention_backward<double>(exec, dqkv, dout, dg, out, lse, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_backward<double>(exec, dmha, dout, dm, out_m, lse_m, s.B, s.T, s.NH, s.HS);
    kt::require_close(kt::to_host(dqkv), fold_kv_grad(s, kt::to_host(dmha)), 1e-11, 1e-12,
                      "dqkv vs folded MHA gradient");
    // The portable kernels agree with the dispatched ones.
    auto dqkv_f = kt::nan_view<double>(s.qkv());
    attention_backward_flash<double>(exec, dqkv_f, dout, dg, out, lse, s.B, s.T, s.NH, s.HS,
                                     s.NKV);
    kt::require_close(kt::to_host(dqkv_f), kt::to_host(dqkv), 1e-11, 1e-12, "flash vs dispatched");
  }
}

TEST_CASE("attention with NKV = NH is the default multi-head call, bit for bit",
          "[kernels][attention][gqa]") {
  const Gqa s{2, 40, 3, 3, 16};
  const auto qkv = kt::to_device(kt::random_vector<float>(s.qkv(), 33, -2.0, 2.0));
  const auto dout = kt::to_device(kt::random_vector<float>(s.out(), 34));
  ExecSpace exec;
  View1<float> out("out", s.out()), out0("out0", s.out()), lse("lse", s.lse()),
      lse0("lse0", s.lse());
  attention_forward<float>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
  attention_forward<float>(exec, out0, lse0, qkv, s.B, s.T, s.NH, s.HS);
  REQUIRE(kt::bitwise_equal(kt::to_host(out), kt::to_host(out0)));
  REQUIRE(kt::bitwise_equal(kt::to_host(lse), kt::to_host(lse0)));
  View1<float> dqkv("dqkv", s.qkv()), dqkv0("dqkv0", s.qkv());
  attention_backward<float>(exec, dqkv, dout, qkv, out, lse, s.B, s.T, s.NH, s.HS, s.NKV);
  attention_backward<float>(exec, dqkv0, dout, qkv, out, lse, s.B, s.T, s.NH, s.HS);
  REQUIRE(kt::bitwise_equal(kt::to_host(dqkv), kt::to_host(dqkv0)));
}

TEST_CASE("attention rejects NKV that does not divide NH", "[kernels][attention][gqa]") {
  const Gqa s{1, 4, 6, 4, 8};
  ExecSpace exec;
  View1<float> qkv("qkv", std::size_t(s.B) * s.T * (s.NH + 2 * s.NKV) * s.HS);
  View1<float> out("out", s.out()), lse("lse", s.lse());
  REQUIRE_THROWS_WITH(attention_forward<float>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV),
                      mt_test::contains("NKV=4 key/value heads do not divide NH=6"));
}

// The dispatched tiled path (CBLAS on a host build; the CUDA kernels, fp32 FMA, on a GPU build:
// HS in {32, 64, 128}) with GQA at larger shapes, against the portable flash kernels.
TEST_CASE("GQA fp32 at training shapes: dispatched path vs portable flash kernels",
          "[kernels][attention][gqa]") {
  std::vector<Gqa> shapes{{2, 256, 8, 2, 64}, {2, 77, 12, 4, 64}, {1, 333, 4, 1, 128},
                          {2, 200, 6, 3, 32}};
  if (kDeviceIsHost)
    for (Gqa& s : shapes) s.B = 1;
  for (const Gqa s : shapes) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HS=" << s.HS);
    const auto qkv = kt::to_device(kt::random_vector<float>(s.qkv(), 43, -2.0, 2.0));
    const auto dout = kt::to_device(kt::random_vector<float>(s.out(), 44));
    ExecSpace exec;
    auto out = kt::nan_view<float>(s.out()), lse = kt::nan_view<float>(s.lse());
    auto out_f = kt::nan_view<float>(s.out()), lse_f = kt::nan_view<float>(s.lse());
    attention_forward<float>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_forward_flash<float>(exec, out_f, lse_f, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
    const auto want = kt::to_host(out_f);
    double scale = 0;
    for (float x : want) scale = std::max(scale, double(std::fabs(x)));
    // fp32 in two summation orders (test_attention.cpp states the same bounds for MHA).
    kt::require_close(kt::to_host(out), want, 1e-5, 1e-5 * scale, "out vs flash");
    kt::require_close(kt::to_host(lse), kt::to_host(lse_f), 1e-5, 1e-5, "lse vs flash");
    auto dqkv = kt::nan_view<float>(s.qkv()), dqkv_f = kt::nan_view<float>(s.qkv());
    attention_backward<float>(exec, dqkv, dout, qkv, out_f, lse_f, s.B, s.T, s.NH, s.HS, s.NKV);
    attention_backward_flash<float>(exec, dqkv_f, dout, qkv, out_f, lse_f, s.B, s.T, s.NH, s.HS,
                                    s.NKV);
    const auto g = kt::to_host(dqkv), w = kt::to_host(dqkv_f);
    double gs = 0;
    for (float x : w) gs = std::max(gs, double(std::fabs(x)));
    // dK/dV sum G times more terms than MHA's: still ~sqrt(G T) eps relative.
    kt::require_close(g, w, 1e-4, 2e-5 * gs, "dqkv vs flash");
  }
}
