// Causal attention: the flash forward against the materialising reference kernel and a double
// host implementation (out and lse); the backward (double instantiation) against central
// differences of the flash forward; float against double; bitwise run-to-run equality.
#include "kernel_test_util.hpp"
#include "meshtrain/kernels/attention.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct Shape {
  int B, T, NH, HS;
  std::size_t C() const { return std::size_t(NH) * HS; }
  std::size_t qkv() const { return std::size_t(B) * T * 3 * C(); }
  std::size_t out() const { return std::size_t(B) * T * C(); }
  std::size_t lse() const { return std::size_t(B) * NH * T; }
};

void attention_host(const Shape& s, const std::vector<double>& qkv, std::vector<double>& out,
                    std::vector<double>& lse) {
  const std::size_t C = s.C();
  out.assign(s.out(), 0.0);
  lse.assign(s.lse(), 0.0);
  const double scale = 1.0 / std::sqrt(double(s.HS));
  std::vector<double> p(s.T);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const double* q = &qkv[(std::size_t(b) * s.T + i) * 3 * C + h * s.HS];
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          const double* k = &qkv[(std::size_t(b) * s.T + j) * 3 * C + C + h * s.HS];
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
          const double* v = &qkv[(std::size_t(b) * s.T + j) * 3 * C + 2 * C + h * s.HS];
          for (int e = 0; e < s.HS; ++e) out[(std::size_t(b) * s.T + i) * C + h * s.HS + e] += w * v[e];
        }
      }
}
}  // namespace

TEST_CASE("attention_forward (flash) matches the reference kernel and a double host version",
          "[kernels][attention]") {
  // HS = 20: not a power of two, not a multiple of a warp's lanes.
  for (const Shape s : {Shape{3, 7, 3, 4}, Shape{2, 33, 2, 20}}) {
    // Scores up to ~|q||k| / sqrt(HS): inputs in [-2, 2] give a peaked softmax as well.
    const auto qkv = kt::random_vector<double>(s.qkv(), 1, -2.0, 2.0);
    std::vector<double> want_out, want_lse;
    attention_host(s, qkv, want_out, want_lse);
    ExecSpace exec;
    auto dqkv = kt::to_device(kt::cast_vector<float>(qkv));
    auto out = kt::nan_view<float>(s.out());
    auto lse = kt::nan_view<float>(s.lse());
    attention_forward<float>(exec, out, lse, dqkv, s.B, s.T, s.NH, s.HS);
    auto ref = kt::nan_view<float>(s.out());
    attention_forward_reference<float>(exec, ref, dqkv, s.B, s.T, s.NH, s.HS);
    // fp32 dot products of length HS <= 20 with |score| up to ~18: ~1e-6 relative in the
    // probabilities; outputs are convex combinations of values in [-2, 2].
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS=" << s.HS);
    kt::require_close(kt::to_host(out), want_out, 1e-5, 1e-5, "flash out vs host");
    kt::require_close(kt::to_host(ref), want_out, 1e-5, 1e-5, "reference out vs host");
    kt::require_close(kt::to_host(lse), want_lse, 1e-5, 1e-5, "lse vs host");
  }
}

TEST_CASE("attention_backward matches finite differences (double)", "[kernels][attention]") {
  const Shape s{2, 7, 3, 4};
  auto qkv = kt::random_vector<double>(s.qkv(), 11, -1.5, 1.5);
  const auto R = kt::random_vector<double>(s.out(), 12);
  ExecSpace exec;
  View1<float> lse("lse", s.lse());
  View1<double> out("out", s.out());
  auto objective = [&]() {
    attention_forward<double>(exec, out, lse, kt::to_device(qkv), s.B, s.T, s.NH, s.HS);
    return kt::dot(kt::to_host(out), R);
  };
  const auto fd = kt::fd_gradient(qkv, objective, 1e-5);
  objective();  // out and lse of the unperturbed input
  auto dqkv = kt::nan_view<double>(s.qkv());
  attention_backward<double>(exec, dqkv, kt::to_device(R), kt::to_device(qkv), out, lse, s.B, s.T,
                             s.NH, s.HS);
  // lse is stored as fp32 (header contract) even in the double instantiation: the recomputed
  // probabilities carry ~|lse| * 6e-8 ~ 2e-7 relative error. FD truncation at eps = 1e-5 is
  // ~1e-10. Tolerance 1e-5 relative + 2e-6 absolute.
  kt::require_close(kt::to_host(dqkv), fd, 1e-5, 2e-6, "dqkv");

  // The float instantiation agrees with the double one.
  const auto qkvf = kt::cast_vector<float>(qkv);
  View1<float> outf("outf", s.out()), lsef("lsef", s.lse());
  attention_forward<float>(exec, outf, lsef, kt::to_device(qkvf), s.B, s.T, s.NH, s.HS);
  auto dqkvf = kt::nan_view<float>(s.qkv());
  attention_backward<float>(exec, dqkvf, kt::to_device(kt::cast_vector<float>(R)),
                            kt::to_device(qkvf), outf, lsef, s.B, s.T, s.NH, s.HS);
  kt::require_close(kt::to_host(dqkvf), kt::to_host(dqkv), 1e-4, 1e-5, "dqkv (float vs double)");
}

TEST_CASE("attention_backward is bitwise deterministic", "[kernels][attention][determinism]") {
  const Shape s{2, 33, 2, 20};
  const auto qkv = kt::random_vector<float>(s.qkv(), 21, -2.0, 2.0);
  const auto dout = kt::random_vector<float>(s.out(), 22);
  ExecSpace exec;
  auto dq = kt::to_device(qkv), ddout = kt::to_device(dout);
  View1<float> out("out", s.out()), lse("lse", s.lse());
  attention_forward<float>(exec, out, lse, dq, s.B, s.T, s.NH, s.HS);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    auto dqkv = kt::nan_view<float>(s.qkv());
    attention_backward<float>(exec, dqkv, ddout, dq, out, lse, s.B, s.T, s.NH, s.HS);
    if (run == 0)
      first = kt::to_host(dqkv);
    else
      REQUIRE(kt::bitwise_equal(kt::to_host(dqkv), first));
  }
}

TEST_CASE("attention_forward/backward agree with the portable flash kernels",
          "[kernels][attention]") {
  // On host memory attention_forward/backward take the blocked CBLAS path; the flash kernels
  // are the GPU path. T = 150 spans three query blocks of the host path, the last one partial.
  for (const Shape s : {Shape{2, 33, 2, 20}, Shape{1, 150, 2, 16}}) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS=" << s.HS);
    const auto qkv = kt::random_vector<double>(s.qkv(), 31, -2.0, 2.0);
    const auto dout = kt::random_vector<double>(s.out(), 32);
    ExecSpace exec;
    auto dq = kt::to_device(qkv), ddout = kt::to_device(dout);
    View1<double> out("out", s.out()), outf("outf", s.out());
    View1<float> lse("lse", s.lse()), lsef("lsef", s.lse());
    attention_forward<double>(exec, out, lse, dq, s.B, s.T, s.NH, s.HS);
    attention_forward_flash<double>(exec, outf, lsef, dq, s.B, s.T, s.NH, s.HS);
    kt::require_close(kt::to_host(out), kt::to_host(outf), 1e-10, 1e-12, "out");
    kt::require_close(kt::to_host(lse), kt::to_host(lsef), 1e-6, 1e-6, "lse");
    auto dqkv = kt::nan_view<double>(s.qkv()), dqkvf = kt::nan_view<double>(s.qkv());
    attention_backward<double>(exec, dqkv, ddout, dq, out, lse, s.B, s.T, s.NH, s.HS);
    attention_backward_flash<double>(exec, dqkvf, ddout, dq, out, lse, s.B, s.T, s.NH, s.HS);
    kt::require_close(kt::to_host(dqkv), kt::to_host(dqkvf), 1e-10, 1e-12, "dqkv");
  }
}
