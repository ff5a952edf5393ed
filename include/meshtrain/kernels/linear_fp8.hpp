#pragma once
// The linear layer with its three GEMMs in FP8 — the recipe of TorchTitan's float8 linears and
// TransformerEngine's current scaling: activations and weights E4M3, output gradients E5M2,
// fp32 accumulation, outputs and the bias in the layer's type. Two weight layouts:
//   in_out  HF Conv1D (GPT-2, linear.hpp): weight [IC, OC], out = inp @ weight + bias
//   out_in  nn.Linear (Llama, Qwen2):       weight [OC, IC], out = inp @ weight^T + bias
// Every GEMM takes the K-contiguous "TN" form Hopper's FP8 tensor cores need, so each operand is
// cast in the orientation its GEMM reads (K the last, contiguous dimension):
//
//   forward   out[N,OC]    = inp[N,IC] . (W as [OC,IC])^T            K = IC
//   dinp      dinp[N,IC]   = dout[N,OC] . (W^T as [IC,OC])^T         K = OC
//   dweight   out_in: dW[OC,IC] += (dout^T)[OC,N] . ((inp^T)[IC,N])^T   K = N
//             in_out: dW[IC,OC] += (inp^T)[IC,N] . ((dout^T)[OC,N])^T
//
// Scaling: tensorwise (one scale per tensor, serving both orientations: a transposed operand is
// cast straight from the source), or rowwise (one scale per row of each K-contiguous operand,
// torchao's "rowwise" recipe: every operand of every GEMM is scaled along its K; a tensor read
// along its other dimension is first transposed in the layer's type, then cast rowwise). With
// wgrad_high_precision the weight-gradient GEMM runs in the layer's type (linear.hpp's GEMM).
//
// The casts are requantized on every call (weights too: once per forward and once per
// backward); tensorwise casts read their tensor in place (a column block of a packed buffer
// included) and an output gradient's two orientations come from one pass. Their buffers come from an Fp8Workspace when the options name one (the model's),
// else they are allocated per call (tests, benches). A tensor split over a parallel group takes `agree` (model/fp8_amax.hpp) so its
// scales are the whole tensor's; the hook is told which tensor and along which of its
// dimensions the cast's scales run (Fp8Cast), so a rowwise hook can agree only where the split
// dimension is K.
#include <cstddef>
#include <functional>
#include <map>
#include <string>

#include "meshtrain/kernels/fp8_cast.hpp"

namespace meshtrain::kernels {

enum class Fp8WeightLayout { in_out, out_in };

// What an agree hook is called for.
struct Fp8Cast {
  const char* tensor;   // "inp" [N, IC], "weight" (as stored), "dout" [N, OC]
  int k_dim;            // the dimension of that tensor the GEMM sums over (0 or 1): a rowwise
                        // scale covers one index of the other dimension, all of this one
  Fp8Scaling scaling;   // tensorwise: count == 1; rowwise: count == the other dimension's size
};

// Device buffers of the casts, kept from call to call and grown when a call needs more: without
// them every cast allocates and frees device memory, and a free synchronises the device (on the
// H100 the FP8 step took 2x bf16's at the Llama-8B shape and 10x at GPT-2 124M, issue 35).
// A buffer is reused by the next request of its key, in stream order: one workspace per
// execution-space instance, and a tensor handed out lives until its key is asked for again.
class Fp8Workspace {
 public:
  Fp8Tensor tensor(const std::string& key, int rows, int cols, Fp8Format format,
                   Fp8Scaling scaling, bool transposed);
  template <class T>
  View1<T> buffer(const std::string& key, std::size_t n) {
    return View1<T>(reinterpret_cast<T*>(bytes_for(key, n * sizeof(T)).data()), n);
  }
  std::size_t bytes() const;  // held now

 private:
  View1<std::uint8_t> bytes_for(const std::string& key, std::size_t n);
  std::map<std::string, View1<std::uint8_t>> buffers_;
};

struct Fp8LinearOptions;

// What the calls below ask of an Fp8Workspace, predicted without running them (the model's
// footprint, model_footprint): each buffer by key at its largest request, as the workspace
// grows them. One method per cast a call makes; elem_bytes is the layer's type (the size of
// the rowwise path's packed copies). test_fp8_layouts holds it to the model's workspace.
class Fp8WorkspaceSizes {
 public:
  explicit Fp8WorkspaceSizes(std::size_t elem_bytes) : elem_(elem_bytes) {}
  void input(int N, int IC, const Fp8LinearOptions& opt);            // linear_fp8_input
  void input_t(int N, int IC, const Fp8LinearOptions& opt);          // linear_fp8_input_t
  void forward_weight(int IC, int OC, const Fp8LinearOptions& opt);  // forward GEMM's weight
  void grad(int N, int OC, int ld, const Fp8LinearOptions& opt);     // linear_fp8_grad
  void dinp_weight(int IC, int OC, const Fp8LinearOptions& opt);     // dinp GEMM's weight
  // dweight GEMM's dout^T (none where linear_fp8_grad cast both orientations), given g's cast.
  void dweight_grad_t(int N, int OC, int ld, const Fp8LinearOptions& opt);
  std::size_t bytes() const;  // what Fp8Workspace::bytes() then holds

 private:
  void operand(const char* tensor, int ld, int rows, int cols, int k_dim,
               const Fp8LinearOptions& opt, bool both);
  void need(const std::string& key, std::size_t n);
  std::size_t elem_;
  std::map<std::string, std::size_t> bytes_;
};

struct Fp8LinearOptions {
  Fp8Format forward = Fp8Format::e4m3;   // inp and weight
  Fp8Format backward = Fp8Format::e5m2;  // dout
  Fp8Scaling scaling = Fp8Scaling::tensorwise;
  Fp8WeightLayout layout = Fp8WeightLayout::in_out;
  bool wgrad_high_precision = false;  // dweight GEMM in the layer's type (--fp8.wgrad_bf16)
  // Called between amax and scales (no-op when empty).
  std::function<void(const Fp8Cast& cast, View1<float> amax, std::size_t count)> agree;
  // Where the casts' buffers come from (null: allocated per call), and which of the caller's
  // linears this is: the casts of dout that linear_fp8_grad returns are kept apart per slot, so
  // a caller may hold one per slot at once (the pieces of a packed q|k|v).
  Fp8Workspace* workspace = nullptr;
  int slot = 0;
  // Tensorwise: where the weight's scale is kept from its forward cast for its backward's
  // (empty: none; kFp8WeightScaleFloats floats, 16-byte aligned). linear_fp8_forward_gemm
  // writes the weight's amax, scale and scale_inv there; linear_fp8_dinp_gemm casts W^T under
  // them instead of reading W once more for the same amax and agreeing it again. The caller's
  // contract: the weight has not changed since a forward wrote the slot (within one optimizer
  // step every backward follows a forward of the same weights).
  View1<float> weight_scale;
  // N (the rows) changes from call to call (an expert's tokens): the forward and input-gradient
  // GEMMs through gemm_fp8_varying (a plan per size bucket of N) instead of gemm_fp8.
  bool rows_vary = false;
};

// Floats of one kept weight scale: amax, scale and scale_inv at 0, 4 and 8, each on its own 16
// bytes (cuBLASLt refuses scale pointers that are not 16-byte aligned).
inline constexpr std::size_t kFp8WeightScaleFloats = 16;

// out[N, OC] = the layer's forward (+ bias when present).
template <class T>
void linear_fp8_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                        View1<const T> weight, View1<const T> bias, int N, int IC, int OC,
                        const Fp8LinearOptions& opt = {});

// dweight += the layer's weight gradient; dbias[OC] += sum_rows(dout) (of the unquantized
// gradient, as linear_backward's column sums; skipped when empty); dinp[N, IC] = dout . W
// (skipped when empty).
template <class T>
void linear_fp8_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                         View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                         int IC, int OC, const Fp8LinearOptions& opt = {});

// ---- The GEMMs one at a time ----
// For callers whose tensors are column blocks of wider row-major buffers (Llama's packed q|k|v
// and gate|up: leading dimensions ld_*), that accumulate several linears' input gradients into
// one buffer, or that overlap a reduction of dinp with the weight-gradient GEMM. inp and weight
// are contiguous; N may be 0.

// out[n, o] (row stride ld_out) = forward; bias (OC values, or null) enters as the GEMM's C.
template <class T>
void linear_fp8_forward_gemm(const ExecSpace& exec, T* out, int ld_out, const T* bias,
                             const T* inp, const T* weight, int N, int IC, int OC,
                             const Fp8LinearOptions& opt);

// The input [N, IC] cast once for the forward GEMMs of several linears that read it (q, k, v;
// gate, up: one tensor, one scale), and its transpose once for their weight-gradient GEMMs.
template <class T>
Fp8Tensor linear_fp8_input(const ExecSpace& exec, const T* inp, int N, int IC,
                           const Fp8LinearOptions& opt);
template <class T>
Fp8Tensor linear_fp8_input_t(const ExecSpace& exec, const T* inp, int N, int IC,
                             const Fp8LinearOptions& opt);

// ---- An input's transpose kept from the forward for the weight gradient ----
// A block may keep, instead of a linear's input in the layer's type, the input's transposed
// cast (half the bytes of bf16): the forward casts both orientations in one pass, and the
// weight gradient reads the kept one, so the backward neither reads the input nor casts it
// again (same scale, same codes: the same bits as linear_fp8_input_t). Tensorwise only (a
// rowwise transpose has other scales) and not with wgrad_high_precision (whose GEMM reads the
// input unquantized).

// Bytes of one kept cast of a [rows, cols] tensor: one allocation holding the codes, then amax,
// scale and scale_inv, each 256-byte aligned (the workspace's layout).
std::size_t fp8_kept_bytes(int rows, int cols);
// The kept cast over `bytes` (at least fp8_kept_bytes): the transposed cast of [rows, cols].
Fp8Tensor fp8_kept_tensor(View1<std::uint8_t> bytes, int rows, int cols, Fp8Format format);

// The input [N, IC] cast for the forward GEMMs (as linear_fp8_input) and, from the same pass,
// its transpose into `kept` (fp8_kept_tensor of [N, IC], opt.forward's format), whose amax,
// scale and scale_inv the returned cast shares. amax_set: kept.amax already holds inp's amax
// (set by the kernel that wrote inp: the norms', GELU's, SwiGLU's fused amax), so inp is read
// once, by the cast; it is still agreed (opt.agree) before the scales.
template <class T>
Fp8Tensor linear_fp8_input_keep(const ExecSpace& exec, const T* inp, int N, int IC,
                                const Fp8LinearOptions& opt, const Fp8Tensor& kept,
                                bool amax_set = false);

// The forward with the input cast by linear_fp8_input; with a residual (null: none; [N, OC],
// row stride ld_out), out = residual + forward, the residual as the GEMM's C: one rounding,
// no pass of its own (with a bias, residual + bias is written into out first).
template <class T>
void linear_fp8_forward_gemm(const ExecSpace& exec, T* out, int ld_out, const T* bias,
                             const Fp8Tensor& inp, const T* weight, int N, int IC, int OC,
                             const Fp8LinearOptions& opt, const T* residual = nullptr);

// dout [N, OC] (row stride ld) cast once for the dinp GEMM (K = OC); tensorwise, its scale is
// also the dweight GEMM's, and (unless wgrad_high_precision) the same pass writes the transpose
// the dweight GEMM reads (Fp8Tensor::data_other), read from the workspace slot's own buffer.
// amax_set (tensorwise only; empty: none): dout's amax, already set by the kernel that wrote
// dout (a fused amax: GELU's or SwiGLU's backward), so that dout is read once, by the cast.
// The returned cast's amax is this View, agreed in place (opt.agree) before the scales; what
// the caller writes into it later, in stream order, does not change the cast.
template <class T>
Fp8Tensor linear_fp8_grad(const ExecSpace& exec, const T* dout, int ld, int N, int OC,
                          const Fp8LinearOptions& opt, View1<float> amax_set = {});

// dinp[N, IC] = beta * dinp + g . W (g from linear_fp8_grad).
template <class T>
void linear_fp8_dinp_gemm(const ExecSpace& exec, T* dinp, float beta, const Fp8Tensor& g,
                          const T* weight, int N, int IC, int OC, const Fp8LinearOptions& opt);

// dweight = beta dweight + the weight gradient of dout (row stride ld) and inp (beta 1:
// accumulate; 0: the first write of the gradient this step, dweight not read); g is dout's cast
// from linear_fp8_grad (its tensorwise scale is reused, not agreed again).
template <class T>
void linear_fp8_dweight_gemm(const ExecSpace& exec, T* dweight, const Fp8Tensor& g,
                             const T* dout, int ld, const T* inp, int N, int IC, int OC,
                             const Fp8LinearOptions& opt, float beta = 1.0f);
// The same with the input cast by linear_fp8_input_t (not with wgrad_high_precision).
template <class T>
void linear_fp8_dweight_gemm(const ExecSpace& exec, T* dweight, const Fp8Tensor& g,
                             const T* dout, int ld, const Fp8Tensor& inp_t, int N, int IC,
                             int OC, const Fp8LinearOptions& opt, float beta = 1.0f);

}  // namespace meshtrain::kernels
