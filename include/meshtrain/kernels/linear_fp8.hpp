#pragma once
// The linear layer (linear.hpp's HF Conv1D layout: weight [IC, OC], out = inp @ weight + bias)
// with its three GEMMs in FP8, tensorwise current scaling — the recipe of TorchTitan's float8
// linears and TransformerEngine's current scaling: activations and weights E4M3, output
// gradients E5M2, fp32 accumulation, outputs and the bias in the layer's type. Every GEMM takes
// the K-contiguous "TN" form Hopper's FP8 tensor cores need, so each operand is cast in the
// orientation its GEMM reads (a tensorwise scale serves both orientations of a tensor):
//
//   forward   out[N,OC]    = inp[N,IC]      . (weight^T)[OC,IC]^T   inp as is, weight transposed
//   backward  dinp[N,IC]   = dout[N,OC]     . weight[IC,OC]^T       dout as is, weight as is
//             dweight[IC,OC] += (inp^T)[IC,N] . (dout^T)[OC,N]^T    both transposed
//
// The GEMMs are gemm_fp8 (gemm/gemm_fp8.hpp); the casts are requantized on every call and
// their temporaries allocated per call: the oracle and host path of an FP8 linear, not yet a fast
// one. A tensor split over tp/sp takes `agree` (model/fp8_amax.hpp) so its scale is the whole
// tensor's; the hooks get which tensor they agree ("inp", "weight", "dout").
#include <functional>

#include "meshtrain/kernels/fp8_cast.hpp"

namespace meshtrain::kernels {

struct Fp8LinearOptions {
  Fp8Format forward = Fp8Format::e4m3;   // inp and weight
  Fp8Format backward = Fp8Format::e5m2;  // dout
  // Called with the tensor's name and its amax between amax and scales (no-op when empty).
  std::function<void(const char* tensor, View1<float> amax, std::size_t count)> agree;
};

// out[N, OC] = inp @ weight + bias (bias may be empty).
template <class T>
void linear_fp8_forward(const ExecSpace& exec, View1<T> out, View1<const T> inp,
                        View1<const T> weight, View1<const T> bias, int N, int IC, int OC,
                        const Fp8LinearOptions& opt = {});

// dweight[IC, OC] += inp^T @ dout; dbias[OC] += sum_rows(dout) (of the unquantized gradient,
// as linear_backward's column sums; skipped when empty);
// dinp[N, IC] = dout @ weight^T (skipped when empty).
template <class T>
void linear_fp8_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                         View1<const T> dout, View1<const T> inp, View1<const T> weight, int N,
                         int IC, int OC, const Fp8LinearOptions& opt = {});

}  // namespace meshtrain::kernels
