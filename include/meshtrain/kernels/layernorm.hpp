#pragma once
// LayerNorm over the last dimension C of N rows: out = (x - mean) * rstd * weight + bias.
// mean and rstd (fp32, N each) are saved for the backward pass.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

// amax (optional, FP8 current scaling, kernels/fp8_cast.hpp): when given (extent >= 1), the
// forward also sets amax(0) to max |v| over the N * C elements v of out as stored in T, the bits
// fp8_amax(exec, amax, out, N * C) would give, without reading out again. Stream-ordered; the
// host does not wait. Without it the kernels are the unfused ones.
template <class T>
void layernorm_forward(const ExecSpace& exec, View1<T> out, View1<float> mean, View1<float> rstd,
                       View1<const T> inp, View1<const T> weight, View1<const T> bias, int N,
                       int C, float eps = 1e-5f, View1<float> amax = {});

// dinp += ... (accumulates: the input is the residual stream, whose gradient has other terms);
// dweight += ..., dbias += ... (accumulate over micro-batches).
template <class T>
void layernorm_backward(const ExecSpace& exec, View1<T> dinp, View1<T> dweight, View1<T> dbias,
                        View1<const T> dout, View1<const T> inp, View1<const T> weight,
                        View1<const float> mean, View1<const float> rstd, int N, int C);

// layernorm_forward/backward dispatch: on a CUDA device, for float and bf16 with C a multiple of
// 16 / sizeof(T) (and C <= 8192 for the backward), to the CUDA kernels of
// src/kernels/layernorm_cuda.cpp (a warp per row, 16-byte vectors, rows up to 2048 bf16 / 1024
// float held in registers); in every other case to the portable Kokkos kernels below. Both are
// deterministic; their results agree to fp32 rounding, not bit for bit. The CUDA backward's
// bits depend on N and C only (a fixed grid), not on the GPU.
//
// Portable Kokkos kernels; the tests' oracle for the CUDA path.
template <class T>
void layernorm_forward_portable(const ExecSpace& exec, View1<T> out, View1<float> mean,
                                View1<float> rstd, View1<const T> inp, View1<const T> weight,
                                View1<const T> bias, int N, int C, float eps = 1e-5f,
                                View1<float> amax = {});
template <class T>
void layernorm_backward_portable(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                                 View1<T> dbias, View1<const T> dout, View1<const T> inp,
                                 View1<const T> weight, View1<const float> mean,
                                 View1<const float> rstd, int N, int C);

}  // namespace meshtrain::kernels
