// cuDNN's fused flash attention (--attn.impl cudnn, kernels/attention/attention_cudnn.cpp) on a GPU,
// against a naive fp32 reference (the materialising attention_forward_reference and the
// portable fp32 flash backward, on the same bf16-rounded inputs) and against our bf16 CUDA
// kernels: out, the softmax statistics (lse) and dQ, dK, dV at head sizes 64 and 128, T from 64
// to 4096, with and without grouped key-value heads; bitwise repeatability of the deterministic
// backward; fp16 at one shape. Then the blocks of ring attention (attention_block.hpp) through
// cuDNN against our block kernels. CUDA builds with cuDNN only (the GPU test set); it fails,
// naming the reason, where libcudnn.so.9 cannot be loaded.
#include <algorithm>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/attention/attention.hpp"
#include "meshtrain/kernels/attention/attention_block.hpp"

using namespace meshtrain;
using namespace meshtrain::kernels;

namespace {
struct Shape {
  int B, T, NH, NKV, HS;
  std::size_t C() const { return std::size_t(NH) * HS; }
  std::size_t ld() const { return C() + 2 * std::size_t(NKV) * HS; }
  std::size_t qkv() const { return std::size_t(B) * T * ld(); }
  std::size_t out() const { return std::size_t(B) * T * C(); }
  std::size_t lse() const { return std::size_t(B) * NH * T; }
};

// T from 64 to 4096, HS 64 and 128, MHA and GQA (NKV = 1, 2 of 4 and 8), a ragged T. The last
// two have a B NH T^2 bf16 dP above 256 MiB, so the default backward takes the dQ-accumulator
// form (attention_cudnn.cpp, dq_accum_form); the others the dP-workspace form.
const Shape kShapes[] = {{2, 64, 4, 4, 64},    {2, 64, 4, 2, 128},   {2, 256, 4, 1, 64},
                         {2, 333, 4, 2, 64},   {2, 1024, 4, 4, 128}, {2, 1024, 8, 2, 64},
                         {1, 4096, 2, 2, 64},  {1, 4096, 4, 2, 128}, {4, 2048, 12, 12, 64},
                         {4, 2048, 16, 4, 128}};

std::string label(const Shape& s) {
  return cat("B=", s.B, " T=", s.T, " NH=", s.NH, " NKV=", s.NKV, " HS=", s.HS);
}

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

// The dq (0), dk (1) or dv (2) columns of a dqkv buffer.
template <class E>
std::vector<double> part(const std::vector<E>& v, const Shape& s, int which) {
  const std::size_t C = s.C(), Ckv = std::size_t(s.NKV) * s.HS, rows = std::size_t(s.B) * s.T;
  const std::size_t off = which == 0 ? 0 : which == 1 ? C : C + Ckv, w = which == 0 ? C : Ckv;
  std::vector<double> r;
  r.reserve(rows * w);
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < w; ++c) r.push_back(static_cast<double>(v[i * s.ld() + off + c]));
  return r;
}

template <class A, class B>
void require_parts_close(const std::vector<A>& got, const std::vector<B>& want, const Shape& s,
                         double tol, const char* what) {
  const char* names[3] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p) {
    const double e = rel_l2(part(got, s, p), part(want, s, p));
    INFO(what << " " << names[p] << ": ||got - want|| / ||want|| = " << e << " (tol " << tol << ")");
    REQUIRE(e <= tol);
  }
}

template <class E>
std::vector<E> round_to(const std::vector<float>& v) {
  std::vector<E> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = E(v[i]);
  return r;
}
template <class E>
std::vector<float> widen(const std::vector<E>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}
template <class E>
View1<E> nan_of(std::size_t n) {
  return kt::to_device(std::vector<E>(n, E(std::numeric_limits<float>::quiet_NaN())));
}

// Restores the default attention options when a test ends, passed or not.
struct ImplScope {
  explicit ImplScope(AttentionOptions o) { set_attention_options(o); }
  ~ImplScope() { set_attention_options({}); }
};

template <class E>
void check_shape(const Shape& s, double out_tol, double grad_tol) {
  INFO(label(s));
  ExecSpace exec;
  const auto qkv_h = round_to<E>(kt::random_vector<float>(s.qkv(), 61, -2.0, 2.0));
  const auto dout_h = round_to<E>(kt::random_vector<float>(s.out(), 62));
  const auto qkv = kt::to_device(qkv_h), dout = kt::to_device(dout_h);
  const auto qkv_f = kt::to_device(widen(qkv_h)), dout_f = kt::to_device(widen(dout_h));

  // fp32 references on the same (widened) inputs.
  auto out_ref = kt::nan_view<float>(s.out());
  attention_forward_reference<float>(exec, out_ref, qkv_f, s.B, s.T, s.NH, s.HS, s.NKV);
  auto out_f = kt::nan_view<float>(s.out()), lse_f = kt::nan_view<float>(s.lse());
  attention_forward_flash<float>(exec, out_f, lse_f, qkv_f, s.B, s.T, s.NH, s.HS, s.NKV);
  const auto want_out = kt::to_host(out_ref), want_lse = kt::to_host(lse_f);

  // cuDNN forward.
  auto out_c = nan_of<E>(s.out());
  auto lse_c = kt::nan_view<float>(s.lse());
  {
    ImplScope scope({AttentionImpl::cudnn, false});
    attention_forward<E>(exec, out_c, lse_c, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
  }
  // The output is rounded to bf16/fp16 and P enters P.V rounded: ~3e-3 (bf16) in the 2-norm.
  CHECK(rel_l2(widen(kt::to_host(out_c)), want_out) <= out_tol);
  // Statistics: fp32 log-sum-exp of exact products of the rounded inputs, fp32 accumulation.
  kt::require_close(kt::to_host(lse_c), want_lse, 1e-4, 1e-4, "cuDNN lse vs fp32");

  // Backward: every side takes the fp32 forward's lse and its out rounded to E.
  const auto out_h = round_to<E>(kt::to_host(out_f));
  const auto out_e = kt::to_device(out_h);
  const auto out_w = kt::to_device(widen(out_h));
  auto dqkv_ref = kt::nan_view<float>(s.qkv());
  attention_backward_flash<float>(exec, dqkv_ref, dout_f, qkv_f, out_w, lse_f, s.B, s.T, s.NH,
                                  s.HS, s.NKV);
  const auto want_d = kt::to_host(dqkv_ref);
  auto dqkv_c = nan_of<E>(s.qkv());
  {
    ImplScope scope({AttentionImpl::cudnn, false});
    attention_backward<E>(exec, dqkv_c, dout, qkv, out_e, lse_f, s.B, s.T, s.NH, s.HS, s.NKV);
  }
  require_parts_close(widen(kt::to_host(dqkv_c)), want_d, s, grad_tol, "cuDNN vs fp32");

  // Our CUDA kernels (bf16) on the same inputs: both within the same distance of fp32, and of
  // each other.
  if constexpr (std::is_same_v<E, bf16>) {
    ImplScope scope({AttentionImpl::meshtrain, false});
    auto out_o = nan_of<E>(s.out());
    auto lse_o = kt::nan_view<float>(s.lse());
    attention_forward<E>(exec, out_o, lse_o, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
    CHECK(rel_l2(widen(kt::to_host(out_c)), widen(kt::to_host(out_o))) <= out_tol);
    kt::require_close(kt::to_host(lse_c), kt::to_host(lse_o), 1e-4, 1e-4, "cuDNN vs our lse");
    auto dqkv_o = nan_of<E>(s.qkv());
    attention_backward<E>(exec, dqkv_o, dout, qkv, out_e, lse_f, s.B, s.T, s.NH, s.HS, s.NKV);
    require_parts_close(widen(kt::to_host(dqkv_c)), widen(kt::to_host(dqkv_o)), s, 2 * grad_tol,
                        "cuDNN vs ours");
  }
}
}  // namespace

TEST_CASE("cuDNN attention loads", "[kernels][attention][cudnn]") {
  const std::string why = cudnn_attention_unavailable_reason();
  INFO(why);
  REQUIRE(why.empty());
}

TEST_CASE("cuDNN attention (bf16) matches fp32 and our kernels: out, lse, dQ, dK, dV",
          "[kernels][attention][cudnn]") {
  REQUIRE(cudnn_attention_unavailable_reason().empty());
  for (const Shape& s : kShapes) check_shape<bf16>(s, 1e-2, 1e-2);
}

TEST_CASE("cuDNN attention (fp16) matches fp32", "[kernels][attention][cudnn]") {
  REQUIRE(cudnn_attention_unavailable_reason().empty());
  // fp16 keeps 3 more mantissa bits than bf16: a few 1e-4 in the 2-norm.
  for (const Shape& s : {Shape{2, 256, 4, 2, 64}, Shape{1, 1024, 4, 4, 128}})
    check_shape<fp16>(s, 2e-3, 2e-3);
}

TEST_CASE("cuDNN attention's deterministic backward is bitwise repeatable",
          "[kernels][attention][cudnn][determinism]") {
  REQUIRE(cudnn_attention_unavailable_reason().empty());
  for (const Shape& s : {Shape{4, 1024, 12, 12, 64}, Shape{2, 2048, 8, 2, 128}}) {
    INFO(label(s));
    ExecSpace exec;
    const auto qkv = kt::to_device(round_to<bf16>(kt::random_vector<float>(s.qkv(), 71, -2, 2)));
    const auto dout = kt::to_device(round_to<bf16>(kt::random_vector<float>(s.out(), 72)));
    ImplScope scope({AttentionImpl::cudnn, true});
    std::vector<bf16> first_out, first_d;
    for (int run = 0; run < 3; ++run) {
      auto out = nan_of<bf16>(s.out());
      auto lse = kt::nan_view<float>(s.lse());
      attention_forward<bf16>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
      auto dqkv = nan_of<bf16>(s.qkv());
      attention_backward<bf16>(exec, dqkv, dout, qkv, out, lse, s.B, s.T, s.NH, s.HS, s.NKV);
      if (run == 0) {
        first_out = kt::to_host(out);
        first_d = kt::to_host(dqkv);
        for (bf16 x : first_d) REQUIRE(std::isfinite(float(x)));
      } else {
        REQUIRE(kt::bitwise_equal(kt::to_host(out), first_out));
        REQUIRE(kt::bitwise_equal(kt::to_host(dqkv), first_d));
      }
    }
  }
}

TEST_CASE("attention falls back to our kernels where cuDNN does not apply",
          "[kernels][attention][cudnn]") {
  // fp32 and HS = 32 run our kernels even under --attn.impl cudnn: the same bits as meshtrain.
  const Shape s{2, 128, 4, 2, 32};
  ExecSpace exec;
  const auto qkv = kt::to_device(round_to<bf16>(kt::random_vector<float>(s.qkv(), 81, -2, 2)));
  std::vector<bf16> want;
  {
    ImplScope scope({AttentionImpl::meshtrain, false});
    View1<bf16> out("out", s.out());
    View1<float> lse("lse", s.lse());
    attention_forward<bf16>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
    want = kt::to_host(out);
  }
  ImplScope scope({AttentionImpl::cudnn, false});
  View1<bf16> out("out", s.out());
  View1<float> lse("lse", s.lse());
  attention_forward<bf16>(exec, out, lse, qkv, s.B, s.T, s.NH, s.HS, s.NKV);
  REQUIRE(kt::bitwise_equal(kt::to_host(out), want));
}

// ---------------------------------------------------------------------------------------------
// Ring attention's blocks (model/ring_attention.cpp) through cuDNN, against our block kernels
// on the same bf16 inputs: the forward's partial output (fp32 slots, rounded to bf16 by the
// cuDNN path) and lse, the backward's dq, dk, dv added onto non-zero accumulators. Every
// operand is a slice of a bigger buffer laid out as ring attention's; whatever lies outside the
// slices is NaN, so a wrong stride or offset shows.

namespace {

struct BlockCase {
  int NH, NKV, HS;
  int Tl;          // rows of a rank's buffers per sequence
  int Tq, Tk;      // the block
  bool causal;     // the rank's own block: q and k/v rows are the same positions
  int q_row0;      // its first query row in the packed qkv buffer
  int sources;     // 0: k/v from the packed qkv (rows q_row0...); n: from the last of n ring
                   // buffers [B, Tl, 2 NKV HS] (k | v per row), its first Tk rows
};

std::string label(const BlockCase& c) {
  return cat("NH=", c.NH, " NKV=", c.NKV, " HS=", c.HS, " Tl=", c.Tl, " Tq=", c.Tq, " Tk=", c.Tk,
             c.causal ? " causal" : " full", " q_row0=", c.q_row0, " sources=", c.sources);
}

// max |got - want| over want's finite elements, relative to `scale`; NaN where want is NaN.
double max_rel_error(const std::vector<float>& got, const std::vector<double>& want, double scale) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      if (!std::isnan(got[i])) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(got[i])) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::fabs(double(got[i]) - want[i]));
  }
  return e / scale;
}
double max_finite(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}
template <class E>
std::vector<double> as_double(const std::vector<E>& v) {
  std::vector<double> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = double(static_cast<float>(v[i]));
  return r;
}

void check_block(const BlockCase& c) {
  INFO(label(c));
  const int B = 2;
  const int C = c.NH * c.HS, Ckv = c.NKV * c.HS, ld = C + 2 * Ckv, W = 2 * Ckv;
  const AttentionBlockShape s{B, c.Tq, c.Tk, c.NH, c.NKV, c.HS, c.causal};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t per = std::size_t(B) * c.Tl * W;
  const int kv_row0 = c.sources == 0 ? c.q_row0 : 0;

  // Inputs: bf16, NaN outside what the block reads.
  std::vector<float> qkv_h(std::size_t(B) * c.Tl * ld, nan);
  std::vector<float> ring_h(per * std::max(c.sources, 1), nan);
  std::vector<float> dout_h(std::size_t(B) * c.Tl * C, nan);
  {
    const auto rq = kt::random_vector<float>(qkv_h.size(), 91, -2, 2);
    const auto rr = kt::random_vector<float>(ring_h.size(), 92, -2, 2);
    const auto rd = kt::random_vector<float>(dout_h.size(), 93);
    for (int b = 0; b < B; ++b) {
      for (int i = c.q_row0; i < c.q_row0 + c.Tq; ++i) {
        const std::size_t r = std::size_t(b) * c.Tl + i;
        for (int e = 0; e < C; ++e) qkv_h[r * ld + e] = rq[r * ld + e];
        for (int e = 0; e < C; ++e) dout_h[r * C + e] = rd[r * C + e];
      }
      for (int j = kv_row0; j < kv_row0 + c.Tk; ++j) {
        const std::size_t r = std::size_t(b) * c.Tl + j;
        if (c.sources == 0)
          for (int e = C; e < ld; ++e) qkv_h[r * ld + e] = rq[r * ld + e];
        else
          for (int e = 0; e < W; ++e) {
            const std::size_t x = per * (c.sources - 1) + r * W + e;
            ring_h[x] = rr[x];
          }
      }
    }
  }
  ExecSpace exec;
  const View1<const bf16> qkv = kt::to_device(round_to<bf16>(qkv_h));
  const View1<const bf16> ring = kt::to_device(round_to<bf16>(ring_h));
  const View1<const bf16> dout = kt::to_device(round_to<bf16>(dout_h));

  // The slices, as ring_attention.cpp's block_forward/block_backward form them.
  const RowSlice qs{std::int64_t(c.q_row0) * ld, ld, std::int64_t(c.Tl) * ld};
  const std::int64_t base = std::int64_t(per) * (c.sources - 1);
  const View1<const bf16> kv = c.sources == 0 ? qkv : ring;
  const RowSlice ks = c.sources == 0
                          ? RowSlice{std::int64_t(c.q_row0) * ld + C, ld, std::int64_t(c.Tl) * ld}
                          : RowSlice{base, W, std::int64_t(c.Tl) * W};
  const RowSlice vs{ks.offset + Ckv, ks.row, ks.batch};
  const RowSlice os = rows_of(c.Tl, C, c.q_row0);
  const StatSlice ls = stats_of(c.Tl, c.NH, c.q_row0);
  const RowSlice dks = rows_of(c.Tl, W, kv_row0, 0), dvs = rows_of(c.Tl, W, kv_row0, Ckv);

  // Forward: ours, then cuDNN's, into NaN-filled buffers.
  auto forward = [&](AttentionImpl impl) {
    ImplScope scope({impl, false});
    auto out = kt::nan_view<float>(std::size_t(B) * c.Tl * C);
    auto lse = kt::nan_view<float>(std::size_t(B) * c.NH * c.Tl);
    attention_block_forward<bf16, float>(exec, s, qkv, qs, kv, ks, kv, vs, out, os, lse, ls);
    return std::make_pair(kt::to_host(out), kt::to_host(lse));
  };
  const auto [out_o, lse_o] = forward(AttentionImpl::meshtrain);
  const std::int64_t calls0 = cudnn_attention_block_calls();
  const auto [out_c, lse_c] = forward(AttentionImpl::cudnn);
  REQUIRE(cudnn_attention_block_calls() == calls0 + 1);  // cuDNN ran the block
  const auto want_out = as_double(out_o), want_lse = as_double(lse_o);
  // The partial is rounded to bf16, and P enters P.V rounded: a few 1e-3 of the largest output.
  const double out_err = max_rel_error(out_c, want_out, max_finite(want_out));
  INFO("out: max |cuDNN - ours| / max |ours| = " << out_err << " (tol 2e-2)");
  CHECK(out_err <= 2e-2);
  // lse: fp32 on both sides from exact products of the bf16 inputs.
  const double lse_err = max_rel_error(lse_c, want_lse, max_finite(want_lse));
  INFO("lse: max |cuDNN - ours| / max |ours| = " << lse_err << " (tol 1e-4)");
  CHECK(lse_err <= 1e-4);

  // Backward with the merged output and lse of the query rows: this block's output (in bf16)
  // and its lse raised by 0.25, as if other blocks had been merged in; D from them.
  std::vector<float> lse_m = lse_o;
  for (float& x : lse_m) x += 0.25f;  // NaN stays NaN
  const View1<const bf16> out_m = kt::to_device(round_to<bf16>(out_o));
  const View1<const float> lse_d = kt::to_device(lse_m);
  auto D = kt::nan_view<float>(lse_m.size());
  attention_rowdot<bf16, float>(exec, B, c.Tq, c.NH, c.HS, dout, os, out_m, os, D, ls);
  auto backward = [&](AttentionImpl impl, const std::vector<float>& dq0,
                      const std::vector<float>& dkv0) {
    ImplScope scope({impl, false});
    auto dq = kt::to_device(dq0), dkv = kt::to_device(dkv0);
    attention_block_backward<bf16, float>(exec, s, qkv, qs, kv, ks, kv, vs, dout, os, out_m, os,
                                          lse_d, ls, View1<const float>(D), ls, dq, os, dkv, dks,
                                          dkv, dvs);
    return std::make_pair(as_double(kt::to_host(dq)), as_double(kt::to_host(dkv)));
  };
  // Our increments from zero (NaN outside the slices), then both sides from non-zero starts S
  // of the increments' size: cuDNN's result must be S + our increment (its share is added).
  std::vector<float> dq_zero(std::size_t(B) * c.Tl * C, nan), dkv_zero(per, nan);
  for (int b = 0; b < B; ++b) {
    for (int i = c.q_row0; i < c.q_row0 + c.Tq; ++i)
      for (int e = 0; e < C; ++e) dq_zero[(std::size_t(b) * c.Tl + i) * C + e] = 0;
    for (int j = kv_row0; j < kv_row0 + c.Tk; ++j)
      for (int e = 0; e < W; ++e) dkv_zero[(std::size_t(b) * c.Tl + j) * W + e] = 0;
  }
  const auto [inc_dq, inc_dkv] = backward(AttentionImpl::meshtrain, dq_zero, dkv_zero);
  auto start = [](const std::vector<float>& zero, const std::vector<double>& inc, unsigned seed) {
    const auto r = kt::random_vector<float>(zero.size(), seed);
    const double m = max_finite(inc);
    std::vector<float> s0(zero.size());
    for (std::size_t i = 0; i < s0.size(); ++i) s0[i] = zero[i] + float(r[i] * m);
    return s0;
  };
  const auto dq_start = start(dq_zero, inc_dq, 94), dkv_start = start(dkv_zero, inc_dkv, 95);
  const std::int64_t calls1 = cudnn_attention_block_calls();
  const auto [got_dq, got_dkv] = backward(AttentionImpl::cudnn, dq_start, dkv_start);
  REQUIRE(cudnn_attention_block_calls() == calls1 + 1);
  // dS and P enter their matmuls rounded to bf16 and dQ, dK, dV leave in bf16.
  const double tol = 3e-2;
  auto compare = [&](const char* what, const std::vector<double>& got,
                     const std::vector<float>& s0, const std::vector<double>& inc,
                     int col0, int width, int ld_, int row0, int rows) {
    std::vector<float> g;
    std::vector<double> w, i_;
    for (int b = 0; b < B; ++b)
      for (int i = row0; i < row0 + rows; ++i)
        for (int e = col0; e < col0 + width; ++e) {
          const std::size_t x = (std::size_t(b) * c.Tl + i) * ld_ + e;
          g.push_back(float(got[x]));
          w.push_back(double(s0[x]) + inc[x]);
          i_.push_back(inc[x]);
        }
    const double err = max_rel_error(g, w, max_finite(i_));
    INFO(what << ": max |cuDNN - (start + ours)| / max |our increment| = " << err << " (tol "
              << tol << ")");
    CHECK(err <= tol);
  };
  compare("dq", got_dq, dq_start, inc_dq, 0, C, C, c.q_row0, c.Tq);
  compare("dk", got_dkv, dkv_start, inc_dkv, 0, Ckv, W, kv_row0, c.Tk);
  compare("dv", got_dkv, dkv_start, inc_dkv, Ckv, Ckv, W, kv_row0, c.Tk);
  // Nothing outside the slices was written: NaN there on both sides.
  for (std::size_t x = 0; x < got_dq.size(); ++x)
    REQUIRE(std::isnan(got_dq[x]) == std::isnan(inc_dq[x]));
  for (std::size_t x = 0; x < got_dkv.size(); ++x)
    REQUIRE(std::isnan(got_dkv[x]) == std::isnan(inc_dkv[x]));
}

}  // namespace

TEST_CASE("cuDNN attention blocks (bf16) match our block kernels: causal, Tq > Tk, Tq < Tk",
          "[kernels][attention][cudnn][cp]") {
  REQUIRE(cudnn_attention_unavailable_reason().empty());
  for (int HS : {64, 128})
    for (auto [NH, NKV] : {std::pair{8, 2}, std::pair{8, 8}}) {
      // The rank's own block, rows 64..191 of 192 (q and k/v from the packed qkv buffer).
      check_block({NH, NKV, HS, 192, 128, 128, true, 64, 0});
      // An earlier source's first chunk for all query rows (k/v from a ring buffer).
      check_block({NH, NKV, HS, 256, 256, 128, false, 0, 1});
      // The second query chunk against all of a later source's rows (the all-gather buffer of
      // two sources, the second).
      check_block({NH, NKV, HS, 256, 128, 256, false, 128, 2});
    }
}

TEST_CASE("attention blocks run our kernels under --attn.impl meshtrain",
          "[kernels][attention][cudnn][cp]") {
  // The counter moves only when cuDNN ran: meshtrain never uses it.
  const int B = 1, Tl = 64, NH = 2, HS = 64, C = NH * HS, ld = 3 * C;
  const View1<const bf16> qkv =
      kt::to_device(round_to<bf16>(kt::random_vector<float>(std::size_t(B) * Tl * ld, 96)));
  auto out = kt::nan_view<float>(std::size_t(B) * Tl * C);
  auto lse = kt::nan_view<float>(std::size_t(B) * NH * Tl);
  const RowSlice qs{0, ld, std::int64_t(Tl) * ld}, ks{C, ld, std::int64_t(Tl) * ld},
      vs{2 * C, ld, std::int64_t(Tl) * ld};
  ImplScope scope({AttentionImpl::meshtrain, false});
  const std::int64_t calls = cudnn_attention_block_calls();
  attention_block_forward<bf16, float>(ExecSpace(), {B, Tl, Tl, NH, NH, HS, true}, qkv,
                                       qs, qkv, ks, qkv, vs, out, rows_of(Tl, C),
                                       lse, stats_of(Tl, NH));
  REQUIRE(cudnn_attention_block_calls() == calls);
  for (float x : kt::to_host(out)) REQUIRE(std::isfinite(x));
}
