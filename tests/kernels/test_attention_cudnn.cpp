// cuDNN's fused flash attention (--attn.impl cudnn, kernels/attention/attention_cudnn.cpp) on a GPU,
// against a naive fp32 reference (the materialising attention_forward_reference and the
// portable fp32 flash backward, on the same bf16-rounded inputs) and against our bf16 CUDA
// kernels: out, the softmax statistics (lse) and dQ, dK, dV at head sizes 64 and 128, T from 64
// to 4096, with and without grouped key-value heads; bitwise repeatability of the deterministic
// backward; fp16 at one shape. CUDA builds with cuDNN only (the GPU test set); it fails, naming
// the reason, where libcudnn.so.9 cannot be loaded.
#include <algorithm>

#include "kernel_test_util.hpp"
#include "meshtrain/kernels/attention/attention.hpp"

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
