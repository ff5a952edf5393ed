// Causal attention: the flash forward against the materialising reference kernel and a double
// host implementation (out and lse); the backward (double instantiation) against central
// differences of the flash forward; float against double; bitwise run-to-run equality. Then the
// dispatched tiled paths (CUDA kernels on a GPU build, CBLAS on a host build) at training shapes
// against the portable flash kernels, in fp32 and (Kokkos 4) bf16.
#include <algorithm>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/attention/attention.hpp"

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

// ---------------------------------------------------------------------------------------------
// The tiled paths at training shapes. On a CUDA build attention_forward/backward run the CUDA
// kernels here (HS in {32, 64, 128}: fp32 FMA for float, tensor cores for bf16); on a host
// build the CBLAS path. Either way they must agree with the portable flash kernels (and the
// forward with the materialising reference), write every output element (all outputs start as
// NaN), and give the same bits on every run.
namespace {

// The shapes of the brief: GPT-2 124M heads at T = 1024, a ragged T (not a multiple of any
// tile), and the other two supported head sizes with ragged T. Host builds keep T and HS but
// take one sequence and two heads, so that the portable kernels stay quick on a CPU core.
std::vector<Shape> tiled_shapes() {
  std::vector<Shape> v{{2, 1024, 12, 64}, {2, 77, 12, 64}, {2, 200, 6, 32}, {2, 333, 4, 128}};
  if (kDeviceIsHost)
    for (Shape& s : v) s.B = 1, s.NH = 2;
  return v;
}

// ||got - want|| / ||want|| (infinite if got holds a NaN or inf: an unwritten element).
template <class A, class B>
double rel_l2(const std::vector<A>& got, const std::vector<B>& want) {
  REQUIRE(got.size() == want.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    num += (g - w) * (g - w);
    den += w * w;
  }
  return std::sqrt(num / den);
}

// Columns [part*C, (part+1)*C) of each [3C] row of a dqkv buffer: dq (0), dk (1), dv (2).
template <class E>
std::vector<double> qkv_part(const std::vector<E>& v, const Shape& s, int part) {
  const std::size_t C = s.C(), rows = std::size_t(s.B) * s.T;
  std::vector<double> r(rows * C);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < C; ++c) r[i * C + c] = static_cast<double>(v[i * 3 * C + part * C + c]);
  return r;
}

template <class A>
double max_abs(const std::vector<A>& v) {
  double m = 0;
  for (A x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// dq, dk, dv each within rel_tol in the 2-norm and, when elem_rtol > 0, element by element
// (rtol elem_rtol, atol elem_rtol * max|want| for elements that cancel to ~0).
template <class A, class B>
void require_dqkv_close(const std::vector<A>& got, const std::vector<B>& want, const Shape& s,
                        double rel_tol, double elem_rtol) {
  const char* names[3] = {"dq", "dk", "dv"};
  for (int part = 0; part < 3; ++part) {
    const auto g = qkv_part(got, s, part), w = qkv_part(want, s, part);
    const double e = rel_l2(g, w);
    INFO(names[part] << ": ||got - want|| / ||want|| = " << e << " (tolerance " << rel_tol << ")");
    REQUIRE(e <= rel_tol);
    if (elem_rtol > 0) kt::require_close(g, w, elem_rtol, elem_rtol * max_abs(w), names[part]);
  }
}

}  // namespace

TEST_CASE("attention fp32 at training shapes matches the portable flash and reference kernels",
          "[kernels][attention]") {
  for (const Shape s : tiled_shapes()) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS=" << s.HS);
    const auto qkv = kt::to_device(kt::random_vector<float>(s.qkv(), 41, -2.0, 2.0));
    const auto dout = kt::to_device(kt::random_vector<float>(s.out(), 42));
    ExecSpace exec;
    auto out = kt::nan_view<float>(s.out()), lse = kt::nan_view<float>(s.lse());
    attention_forward<float>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS);
    auto out_f = kt::nan_view<float>(s.out()), lse_f = kt::nan_view<float>(s.lse());
    attention_forward_flash<float>(exec, out_f, lse_f, qkv, s.B, s.T, s.NH, s.HS);
    auto out_r = kt::nan_view<float>(s.out());
    attention_forward_reference<float>(exec, out_r, qkv, s.B, s.T, s.NH, s.HS);
    // Both sides are fp32 FMA arithmetic in different orders (blocked online softmax vs one
    // key at a time): ~1e-6 relative to the output's scale. Elements that average to ~0 carry
    // that absolute error (seen on an H200: 1.4e-6 at T=333, HS=128, on |out| <= ~0.4), so the
    // element-wise absolute tolerance is 1e-5 of max|want|, as for the gradients below; the
    // norm-wise checks stay at 1e-5.
    const auto got = kt::to_host(out), want = kt::to_host(out_f);
    CHECK(rel_l2(got, want) <= 1e-5);
    CHECK(rel_l2(got, kt::to_host(out_r)) <= 1e-5);
    kt::require_close(got, want, 1e-5, 1e-5 * max_abs(want), "out vs flash");
    kt::require_close(kt::to_host(lse), kt::to_host(lse_f), 1e-5, 1e-5, "lse vs flash");

    // Backward on identical inputs (the flash forward's out and lse) on both sides.
    auto dqkv = kt::nan_view<float>(s.qkv()), dqkv_f = kt::nan_view<float>(s.qkv());
    attention_backward<float>(exec, dqkv, dout, qkv, out_f, lse_f, s.B, s.T, s.NH, s.HS);
    attention_backward_flash<float>(exec, dqkv_f, dout, qkv, out_f, lse_f, s.B, s.T, s.NH, s.HS);
    // Sums of up to T fp32 terms in two orders: ~sqrt(T) eps ~ 2e-6 relative to the norm.
    require_dqkv_close(kt::to_host(dqkv), kt::to_host(dqkv_f), s, 1e-5, 1e-5);
  }
}

TEST_CASE("attention fp32 at training shapes is bitwise deterministic",
          "[kernels][attention][determinism]") {
  const Shape s = tiled_shapes()[0];
  const auto qkv = kt::to_device(kt::random_vector<float>(s.qkv(), 43, -2.0, 2.0));
  const auto dout = kt::to_device(kt::random_vector<float>(s.out(), 44));
  ExecSpace exec;
  std::vector<float> first_out, first_dqkv;
  for (int run = 0; run < 2; ++run) {
    auto out = kt::nan_view<float>(s.out()), lse = kt::nan_view<float>(s.lse());
    attention_forward<float>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS);
    auto dqkv = kt::nan_view<float>(s.qkv());
    attention_backward<float>(exec, dqkv, dout, qkv, out, lse, s.B, s.T, s.NH, s.HS);
    if (run == 0) {
      first_out = kt::to_host(out);
      first_dqkv = kt::to_host(dqkv);
    } else {
      REQUIRE(kt::bitwise_equal(kt::to_host(out), first_out));
      REQUIRE(kt::bitwise_equal(kt::to_host(dqkv), first_dqkv));
    }
  }
}

#if KOKKOS_VERSION >= 40000
namespace {
using bhalf = Kokkos::Experimental::bhalf_t;

std::vector<bhalf> round_bf16(const std::vector<float>& v) {
  std::vector<bhalf> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = bhalf(v[i]);
  return r;
}
std::vector<float> widen(const std::vector<bhalf>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}
View1<bhalf> nan_bf16(std::size_t n) {
  return kt::to_device(std::vector<bhalf>(n, bhalf(std::numeric_limits<float>::quiet_NaN())));
}
}  // namespace

TEST_CASE("attention bf16 matches fp32 on the same rounded inputs", "[kernels][attention][bf16]") {
  // Our kernels (a CUDA build with cuDNN would otherwise run cuDNN's, whose non-deterministic
  // backward the bitwise check below does not hold for; test_attention_cudnn.cpp tests that).
  struct OursOnly {
    OursOnly() { set_attention_options({AttentionImpl::meshtrain, false}); }
    ~OursOnly() { set_attention_options({}); }
  } ours;
  for (const Shape s : tiled_shapes()) {
    INFO("B=" << s.B << " T=" << s.T << " NH=" << s.NH << " HS=" << s.HS);
    // bf16 inputs; the fp32 reference sees exactly the same (widened) values.
    const auto qkv_h = round_bf16(kt::random_vector<float>(s.qkv(), 51, -2.0, 2.0));
    const auto dout_h = round_bf16(kt::random_vector<float>(s.out(), 52));
    const auto qkv = kt::to_device(qkv_h), dout = kt::to_device(dout_h);
    const auto qkv_f = kt::to_device(widen(qkv_h)), dout_f = kt::to_device(widen(dout_h));
    ExecSpace exec;

    // fp32 reference: the portable flash kernel on the widened inputs.
    auto out_f = kt::nan_view<float>(s.out()), lse_f = kt::nan_view<float>(s.lse());
    attention_forward_flash<float>(exec, out_f, lse_f, qkv_f, s.B, s.T, s.NH, s.HS);
    const auto want = kt::to_host(out_f);

    auto out = nan_bf16(s.out());
    auto lse = kt::nan_view<float>(s.lse());
    attention_forward<bhalf>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS);
    // Tolerance: the output is rounded to bf16 (2^-9 relative) and P enters P.V as bf16, so
    // ~3e-3 in the 2-norm; 1e-2 allows that and fails any indexing or masking error. lse is
    // fp32 from exact bf16 products summed in fp32, with exp2/log2 in base 2: 1e-4.
    const auto got = widen(kt::to_host(out));
    CHECK(rel_l2(got, want) <= 1e-2);
    kt::require_close(kt::to_host(lse), kt::to_host(lse_f), 1e-4, 1e-4, "bf16 lse vs fp32");
    // The portable kernels in bf16 (fp32 arithmetic, bf16 output) agree likewise.
    auto out_p = nan_bf16(s.out());
    auto lse_p = kt::nan_view<float>(s.lse());
    attention_forward_flash<bhalf>(exec, out_p, lse_p, qkv, s.B, s.T, s.NH, s.HS);
    CHECK(rel_l2(got, widen(kt::to_host(out_p))) <= 1e-2);

    // Backward: both sides take the fp32 forward's lse and its out rounded to bf16.
    const auto out_h = round_bf16(want);
    const auto out_b = kt::to_device(out_h);
    const auto out_w = kt::to_device(widen(out_h));
    auto dqkv_f = kt::nan_view<float>(s.qkv());
    attention_backward_flash<float>(exec, dqkv_f, dout_f, qkv_f, out_w, lse_f, s.B, s.T, s.NH,
                                    s.HS);
    auto dqkv = nan_bf16(s.qkv());
    attention_backward<bhalf>(exec, dqkv, dout, qkv, out_b, lse_f, s.B, s.T, s.NH, s.HS);
    // P and dS enter their products as bf16 and dq/dk/dv are rounded to bf16: a few 1e-3 in
    // the 2-norm; 1e-2 for each of dq, dk, dv.
    require_dqkv_close(widen(kt::to_host(dqkv)), kt::to_host(dqkv_f), s, 1e-2, 0.0);

    // Bitwise run-to-run equality (no atomics anywhere in the backward).
    auto out2 = nan_bf16(s.out());
    attention_forward<bhalf>(exec, out2, lse, qkv, s.B, s.T, s.NH, s.HS);
    auto dqkv2 = nan_bf16(s.qkv());
    attention_backward<bhalf>(exec, dqkv2, dout, qkv, out_b, lse_f, s.B, s.T, s.NH, s.HS);
    CHECK(kt::bitwise_equal(kt::to_host(out2), kt::to_host(out)));
    CHECK(kt::bitwise_equal(kt::to_host(dqkv2), kt::to_host(dqkv)));
  }
}
#endif  // KOKKOS_VERSION >= 40000
