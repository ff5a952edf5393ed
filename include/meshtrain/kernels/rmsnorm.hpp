#pragma once
// RMSNorm over the last dimension C of N rows (Zhang & Sennrich 2019; HuggingFace
// LlamaRMSNorm): out = weight * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps). rstd (fp32, N)
// is saved for the backward pass. No bias and no mean subtraction.
//
// The order of operations is HF's for 16-bit types: the statistics and x * rstd in fp32, that
// product rounded to T, then multiplied by the weight and rounded again
// (`weight * hidden_states.to(input_dtype)`). For float and double the inner rounding is exact.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// amax (optional, FP8 current scaling, kernels/fp8_cast.hpp): when given (extent >= 1), the
// forward also sets amax(0) to max |v| over the N * C elements v of out as stored in T, the bits
// fp8_amax(exec, amax, out, N * C) would give, without reading out again. Stream-ordered; the
// host does not wait. Without it the kernels are the unfused ones.
template <class T>
void rmsnorm_forward(const ExecSpace& exec, View1<T> out, View1<float> rstd, View1<const T> inp,
                     View1<const T> weight, int N, int C, float eps = 1e-5f,
                     View1<float> amax = {});

// With n = x * rstd and g = weight * dout:
//   dinp    += rstd * (g - n * mean(g * n))   (accumulates: the input is the residual stream)
//   dweight += sum_rows dout * round_T(n)     (accumulates over micro-batches; the rounded n is
//                                              the value the forward multiplied by the weight)
// dinp must not alias dout or inp.
template <class T>
void rmsnorm_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                      View1<const T> dout, View1<const T> inp, View1<const T> weight,
                      View1<const float> rstd, int N, int C);

// rmsnorm_forward/backward dispatch: on a CUDA device, for float and bf16 with C a multiple of
// 16 / sizeof(T) (and C <= 8192 for the backward), to the CUDA kernels of
// src/kernels/rmsnorm_cuda.cpp (a warp per row as LayerNorm's); in every other case to the
// portable Kokkos kernels below, which are the tests' oracle. Both are deterministic; they
// agree to fp32 rounding, not bit for bit.
template <class T>
void rmsnorm_forward_portable(const ExecSpace& exec, View1<T> out, View1<float> rstd,
                              View1<const T> inp, View1<const T> weight, int N, int C,
                              float eps = 1e-5f, View1<float> amax = {});
template <class T>
void rmsnorm_backward_portable(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                               View1<const T> dout, View1<const T> inp, View1<const T> weight,
                               View1<const float> rstd, int N, int C);

}  // namespace meshtrain::kernels
