// The FP8 linear layer (kernels/linear_fp8.hpp): each operand cast K-contiguous in the
// orientation its GEMM reads, then the FP8 GEMM contract of gemm/gemm_fp8.hpp.
#include "meshtrain/kernels/linear_fp8.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "common.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"
#include "meshtrain/kernels/gemm/gemm_fp8.hpp"

namespace meshtrain::kernels {

namespace {

using detail::Index;
using detail::Range;

void check_shape(const char* fn, int N, int IC, int OC) {
  MESHTRAIN_CHECK(N >= 0 && IC > 0 && OC > 0, fn, ": bad shape N=", N, ", IC=", IC, ", OC=", OC);
}

// The workspace's key of one buffer: what the buffer is ("fp8", "fp8_other", "pack",
// "pack_t"), the tensor, and for an output gradient the dimension its GEMM sums over and the
// caller's slot: dout's casts are held from linear_fp8_grad to the weight-gradient GEMM, both
// orientations at once and one per slot. A weight's or an input's cast is read only by the
// GEMMs of the call that made it (in stream order), and no call holds two of one tensor: one
// buffer each serves forward and backward, every orientation and every slot (at the 8B shape,
// two [N, I] buffers fewer).
std::string key(const char* what, const char* tensor, int k_dim, const Fp8LinearOptions& opt) {
  if (std::string(tensor) != "dout") return std::string(what) + "_" + tensor;
  return std::string(what) + "_" + tensor + "_k" + std::to_string(k_dim) + "_s" +
         std::to_string(opt.slot);
}

// Bytes of an Fp8Workspace::tensor: codes, then amax, scale and scale_inv, each 256-byte aligned
// (cuBLASLt refuses a scale pointer that is not 16-byte aligned: the H200 said "not supported"
// to every FP8 matmul while scale_inv lay 8 bytes after amax, and the emulation ran at 1/8 of
// bf16's speed).
struct TensorLayout {
  std::size_t codes_at, stride, total;
};
TensorLayout tensor_layout(int rows, int cols, Fp8Scaling scaling) {
  const auto round_up = [](std::size_t n) { return (n + 255) / 256 * 256; };
  const std::size_t codes = std::size_t(rows) * std::size_t(cols);
  const std::size_t s = scaling == Fp8Scaling::rowwise ? std::size_t(rows) : 1;
  const std::size_t at = round_up(codes), stride = round_up(s * sizeof(float));
  return {at, stride, at + 3 * stride};
}

// The row-major [rows, cols] block at x (row stride ld) copied contiguous, or its transpose
// [cols, rows]: the casts read contiguous tensors.
template <class T>
View1<const T> pack(const ExecSpace& exec, const T* x, int ld, int rows, int cols,
                    bool transpose, const std::string& buffer, const Fp8LinearOptions& opt) {
  const std::size_t n = std::size_t(rows) * cols;
  View1<T> out = opt.workspace != nullptr
                     ? opt.workspace->buffer<T>(buffer, n)
                     : View1<T>(Kokkos::view_alloc(Kokkos::WithoutInitializing,
                                                   "meshtrain::linear_fp8_pack"), n);
  const Index R = rows, C = cols, L = ld;
  if (transpose)
    Kokkos::parallel_for(
        "meshtrain::linear_fp8_pack_t", Range(exec, 0, R * C),
        KOKKOS_LAMBDA(Index i) { out(i) = x[(i % R) * L + i / R]; });
  else
    Kokkos::parallel_for(
        "meshtrain::linear_fp8_pack", Range(exec, 0, R * C),
        KOKKOS_LAMBDA(Index i) { out(i) = x[(i / C) * L + i % C]; });
  return out;
}

// The TN FP8 GEMM D[M, N] = A[M, K] B[N, K]^T + beta C: gemm_fp8, or gemm_fp8_varying where M
// (the rows) changes from call to call (Fp8LinearOptions::rows_vary).
template <class T>
void tn_gemm_fp8(const ExecSpace& exec, const Fp8LinearOptions& opt, int M, int N, int K,
                 const Fp8Tensor& A, const Fp8Tensor& B, float beta, const T* C, int ldc, T* D,
                 int ldd) {
  if (opt.rows_vary)
    gemm_fp8_varying<T>(exec, Trans::N, Trans::T, M, N, K, 1.0f, A, B, beta, C, ldc, D, ldd);
  else
    gemm_fp8<T>(exec, Trans::N, Trans::T, M, N, K, 1.0f, A, B, beta, C, ldc, D, ldd);
}

// What a tensorwise cast does with Fp8LinearOptions::weight_scale: nothing (not a weight's
// cast, or no slot), its scale made there (the forward's), or taken from there (the backward's).
enum class KeptScale { none, write, read };

// Tensorwise: x read in place (no packed copy) by fp8_amax_block and fp8_cast_block; with
// `both`, the other orientation too (data_other), from the same pass. amax_set (1 entry, or
// empty): x's amax, already set by the kernel that wrote x, which the cast takes as its own
// (agreed in place), so that only the cast reads x.
template <class T>
Fp8Tensor tensorwise_operand(const ExecSpace& exec, const char* tensor, const T* x, int ld,
                             int rows, int cols, int k_dim, Fp8Format format,
                             const Fp8LinearOptions& opt, const Fp8Tensor* reuse, bool both,
                             const View1<float>& amax_set = {},
                             KeptScale kept = KeptScale::none) {
  const std::size_t n = std::size_t(rows) * cols;
  const bool transpose = k_dim == 0;
  Fp8Tensor q = opt.workspace != nullptr
                    ? opt.workspace->tensor(key("fp8", tensor, k_dim, opt), rows, cols, format,
                                            Fp8Scaling::tensorwise, transpose)
                    : make_fp8_tensor(std::string("linear_fp8_") + tensor, rows, cols, format,
                                      Fp8Scaling::tensorwise, transpose);
  if (kept != KeptScale::none) {
    detail::check_extent(opt.weight_scale, kFp8WeightScaleFloats, "linear_fp8", "weight_scale");
    // The slot's floats stand in for the workspace's (the GEMM reads scale_inv from there).
    q.amax = slice(opt.weight_scale, 0, 1);
    q.scale = slice(opt.weight_scale, 4, 1);
    q.scale_inv = slice(opt.weight_scale, 8, 1);
  }
  if (kept == KeptScale::read) {
    // The forward's amax of the same weight, agreed and scaled there.
  } else if (reuse != nullptr) {
    Kokkos::deep_copy(exec, q.amax, reuse->amax);
    Kokkos::deep_copy(exec, q.scale, reuse->scale);
    Kokkos::deep_copy(exec, q.scale_inv, reuse->scale_inv);
  } else {
    if (detail::present(amax_set))
      q.amax = amax_set;
    else
      fp8_amax_block<T>(exec, q.amax, x, rows, cols, ld);
    if (opt.agree) opt.agree(Fp8Cast{tensor, k_dim, Fp8Scaling::tensorwise}, q.amax, 1);
  }
  if (both)
    q.data_other = opt.workspace != nullptr
                       ? opt.workspace->buffer<std::uint8_t>(key("fp8_other", tensor, k_dim, opt),
                                                             n)
                       : alloc<std::uint8_t>(std::string("linear_fp8_other_") + tensor, n);
  View1<std::uint8_t> rowmajor = transpose ? q.data_other : q.data;
  View1<std::uint8_t> transposed = transpose ? q.data : q.data_other;
  // A new amax's scale is made by the cast (one launch fewer); a scale taken over is used as is.
  if (kept == KeptScale::read || reuse != nullptr)
    fp8_cast_block<T>(exec, rowmajor, transposed, x, rows, cols, ld, q.scale, format);
  else
    fp8_scale_cast_block<T>(exec, rowmajor, transposed, x, rows, cols, ld, q.amax, q.scale,
                            q.scale_inv, format);
  return q;
}

// The tensor x (row-major [rows, cols], row stride ld) as the K-contiguous operand of a GEMM
// summing over its dimension k_dim: itself ([rows, cols]) for k_dim 1, its transpose
// ([cols, rows]) for k_dim 0. Tensorwise with `reuse`, reuse's scale (the same tensor cast
// before in the other orientation) instead of a new, agreed amax; tensorwise with `both`, the
// other orientation as well (Fp8Tensor::data_other).
template <class T>
Fp8Tensor operand(const ExecSpace& exec, const char* tensor, const T* x, int ld, int rows,
                  int cols, int k_dim, Fp8Format format, const Fp8LinearOptions& opt,
                  const Fp8Tensor* reuse = nullptr, bool both = false,
                  KeptScale kept = KeptScale::none) {
  if (opt.scaling == Fp8Scaling::tensorwise)
    return tensorwise_operand<T>(exec, tensor, x, ld, rows, cols, k_dim, format, opt, reuse,
                                 both, {}, detail::present(opt.weight_scale) ? kept
                                                                             : KeptScale::none);
  // Rowwise: a packed copy where x is a column block, the transpose materialised where K is
  // dimension 0, then fp8_quantize's row amaxes.
  const std::size_t n = std::size_t(rows) * cols;
  bool transpose = k_dim == 0;
  View1<const T> src = ld == cols ? View1<const T>(x, n)
                                  : pack<T>(exec, x, ld, rows, cols, false,
                                            key("pack", tensor, k_dim, opt), opt);
  int r = rows, c = cols;
  if (opt.scaling == Fp8Scaling::rowwise && transpose) {
    // Rowwise scales follow rows: the transpose is materialised first, then cast as is.
    src = pack<T>(exec, src.data(), cols, rows, cols, true, key("pack_t", tensor, k_dim, opt),
                  opt);
    r = cols;
    c = rows;
    transpose = false;
  }
  Fp8Tensor q = opt.workspace != nullptr
                    ? opt.workspace->tensor(key("fp8", tensor, k_dim, opt), r, c, format,
                                            opt.scaling, transpose)
                    : make_fp8_tensor(std::string("linear_fp8_") + tensor, r, c, format,
                                      opt.scaling, transpose);
  AmaxHook hook;
  if (opt.agree) {
    const Fp8Cast site{tensor, k_dim, opt.scaling};
    hook = [&opt, site](View1<float> amax, std::size_t count) { opt.agree(site, amax, count); };
  }
  fp8_quantize<T>(exec, q, src, hook);
  return q;
}

}  // namespace

View1<std::uint8_t> Fp8Workspace::bytes_for(const std::string& key, std::size_t n) {
  View1<std::uint8_t>& b = buffers_[key];
  // Growing frees the old buffer, which waits for the device: the first steps only.
  if (b.extent(0) < n) b = alloc<std::uint8_t>("meshtrain::fp8_workspace_" + key, n);
  return b;
}

namespace {
// The tensor over b (at least tensor_layout(...).total bytes).
Fp8Tensor tensor_over(const View1<std::uint8_t>& b, int rows, int cols, Fp8Format format,
                      Fp8Scaling scaling, bool transposed) {
  Fp8Tensor t{format, scaling, rows, cols, transposed, {}, {}, {}, {}, {}};
  const TensorLayout l = tensor_layout(rows, cols, scaling);
  const std::size_t codes = std::size_t(rows) * std::size_t(cols), s = t.scale_count();
  auto floats = [&](std::size_t i) {
    return View1<float>(reinterpret_cast<float*>(b.data() + l.codes_at + i * l.stride), s);
  };
  t.data = View1<std::uint8_t>(b.data(), codes);
  t.amax = floats(0);
  t.scale = floats(1);
  t.scale_inv = floats(2);
  return t;
}
}  // namespace

Fp8Tensor Fp8Workspace::tensor(const std::string& key, int rows, int cols, Fp8Format format,
                               Fp8Scaling scaling, bool transposed) {
  MESHTRAIN_CHECK(rows >= 0 && cols >= 0 && !(transposed && scaling == Fp8Scaling::rowwise),
                  "Fp8Workspace::tensor(", key, "): rows=", rows, " cols=", cols,
                  transposed ? ", transposed rowwise" : "");
  return tensor_over(bytes_for(key, tensor_layout(rows, cols, scaling).total), rows, cols,
                     format, scaling, transposed);
}

std::size_t fp8_kept_bytes(int rows, int cols) {
  MESHTRAIN_CHECK(rows >= 0 && cols >= 0, "fp8_kept_bytes: rows=", rows, " cols=", cols);
  return tensor_layout(rows, cols, Fp8Scaling::tensorwise).total;
}

Fp8Tensor fp8_kept_tensor(View1<std::uint8_t> bytes, int rows, int cols, Fp8Format format) {
  detail::check_extent(bytes, fp8_kept_bytes(rows, cols), "fp8_kept_tensor", "bytes");
  return tensor_over(bytes, rows, cols, format, Fp8Scaling::tensorwise, true);
}

// ---- Fp8WorkspaceSizes: operand()'s requests, key for key ----

void Fp8WorkspaceSizes::need(const std::string& key, std::size_t n) {
  std::size_t& b = bytes_[key];
  b = std::max(b, n);
}

void Fp8WorkspaceSizes::operand(const char* tensor, int ld, int rows, int cols, int k_dim,
                                const Fp8LinearOptions& opt, bool both) {
  const std::size_t n = std::size_t(rows) * cols;
  if (opt.scaling == Fp8Scaling::tensorwise) {
    need(key("fp8", tensor, k_dim, opt), tensor_layout(rows, cols, opt.scaling).total);
    if (both) need(key("fp8_other", tensor, k_dim, opt), n);
    return;
  }
  if (ld != cols) need(key("pack", tensor, k_dim, opt), n * elem_);
  int r = rows, c = cols;
  if (k_dim == 0) {
    need(key("pack_t", tensor, k_dim, opt), n * elem_);
    std::swap(r, c);
  }
  need(key("fp8", tensor, k_dim, opt), tensor_layout(r, c, opt.scaling).total);
}

void Fp8WorkspaceSizes::input(int N, int IC, const Fp8LinearOptions& opt) {
  operand("inp", IC, N, IC, 1, opt, false);
}
void Fp8WorkspaceSizes::input_t(int N, int IC, const Fp8LinearOptions& opt) {
  operand("inp", IC, N, IC, 0, opt, false);
}
void Fp8WorkspaceSizes::forward_weight(int IC, int OC, const Fp8LinearOptions& opt) {
  if (opt.layout == Fp8WeightLayout::out_in)
    operand("weight", IC, OC, IC, 1, opt, false);
  else
    operand("weight", OC, IC, OC, 0, opt, false);
}
void Fp8WorkspaceSizes::grad(int N, int OC, int ld, const Fp8LinearOptions& opt) {
  operand("dout", ld, N, OC, 1, opt,
          opt.scaling == Fp8Scaling::tensorwise && !opt.wgrad_high_precision);
}
void Fp8WorkspaceSizes::dinp_weight(int IC, int OC, const Fp8LinearOptions& opt) {
  if (opt.layout == Fp8WeightLayout::out_in)
    operand("weight", IC, OC, IC, 0, opt, false);
  else
    operand("weight", OC, IC, OC, 1, opt, false);
}
void Fp8WorkspaceSizes::dweight_grad_t(int N, int OC, int ld, const Fp8LinearOptions& opt) {
  if (opt.wgrad_high_precision || opt.scaling == Fp8Scaling::tensorwise) return;  // data_other
  operand("dout", ld, N, OC, 0, opt, false);
}

std::size_t Fp8WorkspaceSizes::bytes() const {
  std::size_t n = 0;
  for (const auto& [k, b] : bytes_) n += b;
  return n;
}

std::size_t Fp8Workspace::bytes() const {
  std::size_t n = 0;
  for (const auto& [k, b] : buffers_) n += b.extent(0);
  return n;
}

template <class T>
Fp8Tensor linear_fp8_input(const ExecSpace& exec, const T* inp, int N, int IC,
                           const Fp8LinearOptions& opt) {
  return operand<T>(exec, "inp", inp, IC, N, IC, 1, opt.forward, opt);
}

template <class T>
Fp8Tensor linear_fp8_input_keep(const ExecSpace& exec, const T* inp, int N, int IC,
                                const Fp8LinearOptions& opt, const Fp8Tensor& kept,
                                bool amax_set) {
  MESHTRAIN_CHECK(opt.scaling == Fp8Scaling::tensorwise && !opt.wgrad_high_precision,
                  "linear_fp8_input_keep: a kept transpose takes tensorwise scaling and an FP8 "
                  "weight gradient");
  MESHTRAIN_CHECK(kept.transposed && kept.rows == N && kept.cols == IC &&
                      kept.format == opt.forward && kept.scaling == Fp8Scaling::tensorwise,
                  "linear_fp8_input_keep: the kept cast is not the transposed cast of [N=", N,
                  ", IC=", IC, "]");
  check_shape("linear_fp8_input_keep", N, IC, 1);
  Fp8Tensor q = opt.workspace != nullptr
                    ? opt.workspace->tensor(key("fp8", "inp", 1, opt), N, IC, opt.forward,
                                            Fp8Scaling::tensorwise, false)
                    : make_fp8_tensor("linear_fp8_inp", N, IC, opt.forward,
                                      Fp8Scaling::tensorwise, false);
  // One scale for both orientations, held by the kept cast (it outlives the workspace's).
  q.amax = kept.amax;
  q.scale = kept.scale;
  q.scale_inv = kept.scale_inv;
  if (!amax_set) fp8_amax_block<T>(exec, kept.amax, inp, N, IC, IC);
  if (opt.agree) opt.agree(Fp8Cast{"inp", 1, Fp8Scaling::tensorwise}, kept.amax, 1);
  fp8_scale_cast_block<T>(exec, q.data, kept.data, inp, N, IC, IC, kept.amax, kept.scale,
                          kept.scale_inv, opt.forward);
  return q;
}

template <class T>
Fp8Tensor linear_fp8_input_t(const ExecSpace& exec, const T* inp, int N, int IC,
                             const Fp8LinearOptions& opt) {
  return operand<T>(exec, "inp", inp, IC, N, IC, 0, opt.forward, opt);
}

template <class T>
void linear_fp8_forward_gemm(const ExecSpace& exec, T* out, int ld_out, const T* bias,
                             const T* inp, const T* weight, int N, int IC, int OC,
                             const Fp8LinearOptions& opt) {
  check_shape("linear_fp8_forward_gemm", N, IC, OC);
  const Fp8Tensor a = linear_fp8_input<T>(exec, inp, N, IC, opt);
  linear_fp8_forward_gemm<T>(exec, out, ld_out, bias, a, weight, N, IC, OC, opt);
}

template <class T>
void linear_fp8_forward_gemm(const ExecSpace& exec, T* out, int ld_out, const T* bias,
                             const Fp8Tensor& a, const T* weight, int N, int IC, int OC,
                             const Fp8LinearOptions& opt, const T* residual) {
  check_shape("linear_fp8_forward_gemm", N, IC, OC);
  MESHTRAIN_CHECK(a.rows == N && a.cols == IC && !a.transposed,
                  "linear_fp8_forward_gemm: the input cast is [", a.rows, ", ", a.cols,
                  a.transposed ? "] transposed" : "]", ", not [N=", N, ", IC=", IC, "]");
  // The GEMM's C: none, the residual as it is, or (with a bias) the bias, plus the residual where
  // there is one, written into out first — in the layer's type as linear_forward adds it.
  const T* c_in = residual;
  if (bias != nullptr) {
    // A team per row: a 64-bit division and remainder per element made this fill 13.6 of
    // GPT-2 1.5B's 125.8 ms FP8 step on the H100 (2026-12-06 trace), ~6x its memory traffic.
    const Index L = ld_out;
    Kokkos::parallel_for(
        "meshtrain::linear_fp8_bias", detail::Team(exec, N, Kokkos::AUTO),
        KOKKOS_LAMBDA(const detail::Member& t) {
          const Index r = Index(t.league_rank()) * L;
          T* row = out + r;
          if (residual == nullptr)
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, OC), [&](int c) { row[c] = bias[c]; });
          else
            Kokkos::parallel_for(Kokkos::TeamThreadRange(t, OC), [&](int c) {
              row[c] = static_cast<T>(static_cast<float>(residual[r + c]) +
                                      static_cast<float>(bias[c]));
            });
        });
    c_in = out;
  }
  const bool out_in = opt.layout == Fp8WeightLayout::out_in;
  // W as [OC, IC]: nn.Linear's weight as stored, Conv1D's transposed.
  const KeptScale ks = KeptScale::write;
  const Fp8Tensor b = out_in ? operand<T>(exec, "weight", weight, IC, OC, IC, 1, opt.forward, opt,
                                          nullptr, false, ks)
                             : operand<T>(exec, "weight", weight, OC, IC, OC, 0, opt.forward, opt,
                                          nullptr, false, ks);
  tn_gemm_fp8<T>(exec, opt, N, OC, IC, a, b, c_in != nullptr ? 1.0f : 0.0f,
                 c_in != nullptr ? c_in : out, ld_out, out, ld_out);
}

template <class T>
Fp8Tensor linear_fp8_grad(const ExecSpace& exec, const T* dout, int ld, int N, int OC,
                          const Fp8LinearOptions& opt, View1<float> amax_set) {
  // Tensorwise, both orientations from one read: the transpose is the weight gradient's.
  const bool both = opt.scaling == Fp8Scaling::tensorwise && !opt.wgrad_high_precision;
  if (!detail::present(amax_set))
    return operand<T>(exec, "dout", dout, ld, N, OC, 1, opt.backward, opt, nullptr, both);
  MESHTRAIN_CHECK(opt.scaling == Fp8Scaling::tensorwise,
                  "linear_fp8_grad: an amax already set is one scale's (tensorwise), not ",
                  fp8_scaling_name(opt.scaling), "'s");
  return tensorwise_operand<T>(exec, "dout", dout, ld, N, OC, 1, opt.backward, opt, nullptr,
                               both, slice(amax_set, 0, 1));
}

template <class T>
void linear_fp8_dinp_gemm(const ExecSpace& exec, T* dinp, float beta, const Fp8Tensor& g,
                          const T* weight, int N, int IC, int OC, const Fp8LinearOptions& opt) {
  check_shape("linear_fp8_dinp_gemm", N, IC, OC);
  const bool out_in = opt.layout == Fp8WeightLayout::out_in;
  // W^T as [IC, OC] (K = OC): Conv1D's weight as stored, nn.Linear's transposed.
  // The forward's scale where it was kept (Fp8LinearOptions::weight_scale): the cast alone.
  const KeptScale ks = KeptScale::read;
  const Fp8Tensor w = out_in ? operand<T>(exec, "weight", weight, IC, OC, IC, 0, opt.forward, opt,
                                          nullptr, false, ks)
                             : operand<T>(exec, "weight", weight, OC, IC, OC, 1, opt.forward, opt,
                                          nullptr, false, ks);
  tn_gemm_fp8<T>(exec, opt, N, IC, OC, g, w, beta, dinp, IC, dinp, IC);
}

template <class T>
void linear_fp8_dweight_gemm(const ExecSpace& exec, T* dweight, const Fp8Tensor& g,
                             const T* dout, int ld, const T* inp, int N, int IC, int OC,
                             const Fp8LinearOptions& opt, float beta) {
  check_shape("linear_fp8_dweight_gemm", N, IC, OC);
  const bool out_in = opt.layout == Fp8WeightLayout::out_in;
  if (opt.wgrad_high_precision) {  // linear_backward's / the Llama block's GEMM, unchanged
    if (out_in)
      gemm<T>(exec, Trans::T, Trans::N, OC, IC, N, 1.0f, dout, ld, inp, IC, beta, dweight, IC);
    else
      gemm<T>(exec, Trans::T, Trans::N, IC, OC, N, 1.0f, inp, IC, dout, ld, beta, dweight, OC);
    return;
  }
  linear_fp8_dweight_gemm<T>(exec, dweight, g, dout, ld,
                             linear_fp8_input_t<T>(exec, inp, N, IC, opt), N, IC, OC, opt, beta);
}

template <class T>
void linear_fp8_dweight_gemm(const ExecSpace& exec, T* dweight, const Fp8Tensor& g,
                             const T* dout, int ld, const Fp8Tensor& xt, int N, int IC, int OC,
                             const Fp8LinearOptions& opt, float beta) {
  check_shape("linear_fp8_dweight_gemm", N, IC, OC);
  MESHTRAIN_CHECK(!opt.wgrad_high_precision,
                  "linear_fp8_dweight_gemm: wgrad_high_precision takes the input unquantized");
  // inp^T: a transposed cast of [N, IC], or (rowwise) a cast of the materialised [IC, N].
  MESHTRAIN_CHECK(xt.transposed ? xt.rows == N && xt.cols == IC : xt.rows == IC && xt.cols == N,
                  "linear_fp8_dweight_gemm: the input cast is not inp^T [IC=", IC, ", N=", N,
                  "]");
  const bool out_in = opt.layout == Fp8WeightLayout::out_in;
  // Both operands transposed (K = N): inp^T [IC, N], dout^T [OC, N] — the other orientation
  // of g where linear_fp8_grad cast both, else cast again under g's scale.
  Fp8Tensor gt;
  if (detail::present(g.data_other)) {
    gt = g;
    gt.data = g.data_other;
    gt.data_other = g.data;
    gt.transposed = !g.transposed;
  } else {
    gt = operand<T>(exec, "dout", dout, ld, N, OC, 0, opt.backward, opt, &g);
  }
  if (out_in)
    gemm_fp8<T>(exec, Trans::N, Trans::T, OC, IC, N, 1.0f, gt, xt, beta, dweight, IC);
  else
    gemm_fp8<T>(exec, Trans::N, Trans::T, IC, OC, N, 1.0f, xt, gt, beta, dweight, OC);
}

template <class T>
void linear_fp8_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                        View1<const T> weight, View1<const T> bias, int N, int IC, int OC,
                        const Fp8LinearOptions& opt) {
  const char* fn = "linear_fp8_forward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(out, std::size_t(N) * OC, fn, "out");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  const bool has_bias = detail::present(bias);
  if (has_bias) detail::check_extent(bias, OC, fn, "bias");
  linear_fp8_forward_gemm<T>(exec, out.data(), OC, has_bias ? bias.data() : nullptr, inp.data(),
                             weight.data(), N, IC, OC, opt);
}

template <class T>
void linear_fp8_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                         View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                         int IC, int OC, const Fp8LinearOptions& opt) {
  const char* fn = "linear_fp8_backward";
  check_shape(fn, N, IC, OC);
  detail::check_extent(dout, std::size_t(N) * OC, fn, "dout");
  detail::check_extent(inp, std::size_t(N) * IC, fn, "inp");
  detail::check_extent(weight, std::size_t(IC) * OC, fn, "weight");
  detail::check_extent(dweight, std::size_t(IC) * OC, fn, "dweight");
  // One amax serves both orientations of dout (tensorwise).
  const Fp8Tensor g = linear_fp8_grad<T>(exec, dout.data(), OC, N, OC, opt);
  if (detail::present(dinp)) {
    detail::check_extent(dinp, std::size_t(N) * IC, fn, "dinp");
    linear_fp8_dinp_gemm<T>(exec, dinp.data(), 0.0f, g, weight.data(), N, IC, OC, opt);
  }
  linear_fp8_dweight_gemm<T>(exec, dweight.data(), g, dout.data(), OC, inp.data(), N, IC, OC,
                             opt);
  if (detail::present(dbias)) {
    detail::check_extent(dbias, OC, fn, "dbias");
    column_sums_add<T>(exec, N, OC, dout.data(), OC, dbias.data());
  }
}

#define MESHTRAIN_INSTANTIATE_LINEAR_FP8(T)                                                      \
  template void linear_fp8_forward<T>(const ExecSpace&, View1<T>, View1<const T>,                \
                                      View1<const T>, View1<const T>, int, int, int,             \
                                      const Fp8LinearOptions&);                                  \
  template void linear_fp8_backward<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,           \
                                       View1<const T>, View1<const T>, View1<const T>, int, int, \
                                       int, const Fp8LinearOptions&);                            \
  template void linear_fp8_forward_gemm<T>(const ExecSpace&, T*, int, const T*, const T*,        \
                                           const T*, int, int, int, const Fp8LinearOptions&);    \
  template Fp8Tensor linear_fp8_input<T>(const ExecSpace&, const T*, int, int,                  \
                                         const Fp8LinearOptions&);                               \
  template Fp8Tensor linear_fp8_input_t<T>(const ExecSpace&, const T*, int, int,                \
                                           const Fp8LinearOptions&);                             \
  template Fp8Tensor linear_fp8_input_keep<T>(const ExecSpace&, const T*, int, int,             \
                                              const Fp8LinearOptions&, const Fp8Tensor&, bool);  \
  template void linear_fp8_forward_gemm<T>(const ExecSpace&, T*, int, const T*,                 \
                                           const Fp8Tensor&, const T*, int, int, int,            \
                                           const Fp8LinearOptions&, const T*);                   \
  template void linear_fp8_dweight_gemm<T>(const ExecSpace&, T*, const Fp8Tensor&, const T*,    \
                                           int, const Fp8Tensor&, int, int, int,                 \
                                           const Fp8LinearOptions&, float);                      \
  template Fp8Tensor linear_fp8_grad<T>(const ExecSpace&, const T*, int, int, int,               \
                                        const Fp8LinearOptions&, View1<float>);                  \
  template void linear_fp8_dinp_gemm<T>(const ExecSpace&, T*, float, const Fp8Tensor&,           \
                                        const T*, int, int, int, const Fp8LinearOptions&);       \
  template void linear_fp8_dweight_gemm<T>(const ExecSpace&, T*, const Fp8Tensor&, const T*,     \
                                           int, const T*, int, int, int,                         \
                                           const Fp8LinearOptions&, float);
MESHTRAIN_INSTANTIATE_LINEAR_FP8(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_LINEAR_FP8(bf16)  // gemm_fp8 has no fp16 output: FP8 training is bf16's
#endif
#undef MESHTRAIN_INSTANTIATE_LINEAR_FP8

}  // namespace meshtrain::kernels
