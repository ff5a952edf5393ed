#pragma once
// Grouped expert GEMM (issue 20): the rows of expert e are rows [offsets[e], offsets[e+1]) of
// the input, and each expert has its own weight [K, Nout] in the project's linear layout
// (out = inp @ weight, kernels/linear.hpp), stacked as [E, K, Nout]. One GEMM per expert with
// rows (kernels::gemm_varying): CBLAS on the host; on CUDA cuBLASLt with one algorithm per size
// bucket of the row count. cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx, one call for all
// experts) measured 1.5-2.2x slower than this loop on an H200 for the 124M MoE's shapes
// (perf/bench/bench_expert_gemm_cublas.cu, docs/moe.md), hence the loop. An expert with no rows
// costs nothing (and its weight gradient is left as it was). 16-bit T accumulates in fp32, as the
// dense model's linears do.
#include <cstdint>
#include <vector>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {
class Fp8Workspace;
}

namespace meshtrain::moe {

// The experts' GEMMs in FP8 (train.precision=fp8, in the blocks the recipe puts in FP8; issue
// 35), through kernels/linear_fp8.hpp's GEMMs whatever fp8.recipe says for the dense linears:
//  - rowwise scales: each token's row of x (E4M3) and of dy (E5M2) has its own, and each
//    expert's weight one per output column (forward) or input row (input gradient). A token's
//    scale does not depend on which other tokens share its expert, so under every ep, dp and cp
//    layout an expert casts each row as one rank does, with no amax to agree; a tensorwise
//    scale over an expert's rows would change with the layout (at ep 2 an expert sees two
//    ranks' micro-batches at once). TorchTitan scales its MoE grouped GEMMs rowwise too;
//  - the weight gradient in the model's type (fp8.wgrad_bf16's form), the GEMM the 16-bit path
//    runs: it sums over the tokens, whose scales would again depend on the layout;
//  - the forward and input-gradient GEMMs through gemm_fp8_varying (a plan per size bucket of an
//    expert's row count, which changes every step).
// enabled = false: every GEMM in the model's type. FP8 needs float or bf16 rows (ConfigError).
struct ExpertFp8 {
  bool enabled = false;
  kernels::Fp8Workspace* workspace = nullptr;  // the casts' buffers; null: allocated per call
};

// y [M, Nout] (overwritten) = x_e [n_e, K] @ w_e [K, Nout] per expert; offsets has E + 1
// entries, offsets[E] = M. w_e starts at element e * w_stride of w (0: K * Nout, packed; the
// model's registry aligns each expert's tensor, so its experts may be further apart).
template <class T>
void grouped_linear_forward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                            View1<const T> x, View1<const T> w, View1<T> y, int K, int Nout,
                            std::size_t w_stride = 0, const ExpertFp8& fp8 = {});

// dx [M, K] = dy_e @ w_e^T per expert (overwritten; skipped when dx is empty) and
// dw [E, K, Nout] += x_e^T @ dy_e (accumulates, as every weight gradient does).
template <class T>
void grouped_linear_backward(const ExecSpace& exec, const std::vector<std::int64_t>& offsets,
                             View1<const T> dy, View1<const T> x, View1<const T> w, View1<T> dx,
                             View1<T> dw, int K, int Nout, std::size_t w_stride = 0,
                             const ExpertFp8& fp8 = {});

}  // namespace meshtrain::moe
