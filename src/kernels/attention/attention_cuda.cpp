// Entry points of the CUDA attention kernels (attention_cuda.hpp): which calls they take, the
// D_i = dO_i . O_i pre-pass of the backward, and the hand-off to the per-type launchers in
// attention_cuda_f32.cpp (fp32 FMA) and attention_cuda_bf16.cpp (tensor cores). Compiled in
// every build, empty without CUDA.
#include "attention_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>

#include "meshtrain/core/cuda_check.hpp"

namespace meshtrain::kernels::detail {

namespace {

bool supported(int HS, std::initializer_list<const void*> ptrs) {
  if (HS != 32 && HS != 64 && HS != 128) return false;
  // Tiles move as 16-byte cp.async chunks; every row offset is a multiple of 16 bytes once
  // HS is, so only the base pointers can break alignment (a View sliced at an odd offset).
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, const float*) {
  const float* x = reinterpret_cast<const float*>(&a);
  const float* y = reinterpret_cast<const float*>(&b);
  return x[0] * y[0] + x[1] * y[1] + x[2] * y[2] + x[3] * y[3];
}
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, const __nv_bfloat16*) {
  const auto* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const auto* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 u = __bfloat1622float2(x[i]), v = __bfloat1622float2(y[i]);
    s += u.x * v.x + u.y * v.y;
  }
  return s;
}

// D_i = dout[b, i, h, :] . out[b, i, h, :] in fp32, stored in dqkv's q slot of row (b, i) and
// head h (d_slot). A row of HS elements is HS * sizeof(E) / 16 lanes (a power of two <= 32)
// reading 16 bytes each, summed by shuffles.
template <class E>
__global__ void row_dot_kernel(const E* __restrict__ dout, const E* __restrict__ out, E* dqkv,
                               int NH, int HS, long ld, long nrows) {
  constexpr int kVec = 16 / int(sizeof(E));
  const int lanes = HS / kVec;
  const long gid = long(blockIdx.x) * blockDim.x + threadIdx.x;
  const long r = gid / lanes;  // (b*T + i)*NH + h: the row's offset in [B, T, C] is r*HS
  const int l = int(gid % lanes);
  float acc = 0.f;
  if (r < nrows) {
    const uint4 a = *reinterpret_cast<const uint4*>(dout + r * HS + l * kVec);
    const uint4 c = *reinterpret_cast<const uint4*>(out + r * HS + l * kVec);
    acc = dot8(a, c, static_cast<const E*>(nullptr));
  }
  for (int m = lanes / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (r < nrows && l == 0) {
    const long bi = r / NH;
    const int h = int(r % NH);
    *reinterpret_cast<float*>(dqkv + bi * ld + long(h) * HS) = acc;
  }
}

template <class E>
void row_dot(cudaStream_t st, const E* dout, const E* out, E* dqkv, int B, int T, int NH,
             int HS, int NKV) {
  const long ld = long(NH + 2 * NKV) * HS;  // dqkv's row stride
  const long nrows = long(B) * T * NH;
  const long threads = nrows * (HS * long(sizeof(E)) / 16);
  constexpr int kBlock = 256;
  row_dot_kernel<E><<<unsigned((threads + kBlock - 1) / kBlock), kBlock, 0, st>>>(dout, out, dqkv,
                                                                                 NH, HS, ld, nrows);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class T>
bool attention_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> lse,
                            View1<const T> qkv, int B, int Tlen, int NH, int HS, int NKV) {
  if (!supported(HS, {out.data(), qkv.data()})) return false;
  if (B == 0 || Tlen == 0) return true;
  cudaStream_t st = exec.cuda_stream();
  if constexpr (std::is_same_v<T, float>)
    cuda::forward_f32(st, qkv.data(), out.data(), lse.data(), B, Tlen, NH, HS, NKV);
  else
    cuda::forward_bf16(st, qkv.data(), out.data(), lse.data(), B, Tlen, NH, HS, NKV);
  return true;
}

template <class T>
bool attention_backward_cuda(const ExecSpace& exec, View1<T> dqkv, View1<const T> dout,
                             View1<const T> qkv, View1<const T> out, View1<const float> lse,
                             int B, int Tlen, int NH, int HS, int NKV) {
  if (!supported(HS, {dqkv.data(), dout.data(), qkv.data(), out.data()})) return false;
  if (B == 0 || Tlen == 0) return true;
  cudaStream_t st = exec.cuda_stream();
  if constexpr (std::is_same_v<T, float>) {
    row_dot<float>(st, dout.data(), out.data(), dqkv.data(), B, Tlen, NH, HS, NKV);
    cuda::backward_f32(st, qkv.data(), dout.data(), lse.data(), dqkv.data(), B, Tlen, NH, HS,
                       NKV);
  } else {
    using E = __nv_bfloat16;
    static_assert(sizeof(T) == sizeof(E), "bf16 storage must be CUDA's __nv_bfloat16 bits");
    row_dot<E>(st, reinterpret_cast<const E*>(dout.data()), reinterpret_cast<const E*>(out.data()),
               reinterpret_cast<E*>(dqkv.data()), B, Tlen, NH, HS, NKV);
    cuda::backward_bf16(st, qkv.data(), dout.data(), lse.data(), dqkv.data(), B, Tlen, NH, HS,
                        NKV);
  }
  return true;
}

#define MESHTRAIN_INSTANTIATE_ATTENTION_CUDA(T)                                                \
  template bool attention_forward_cuda<T>(const ExecSpace&, View1<T>, View1<float>,            \
                                          View1<const T>, int, int, int, int, int);            \
  template bool attention_backward_cuda<T>(const ExecSpace&, View1<T>, View1<const T>,         \
                                           View1<const T>, View1<const T>, View1<const float>, \
                                           int, int, int, int, int);
MESHTRAIN_INSTANTIATE_ATTENTION_CUDA(float)
MESHTRAIN_INSTANTIATE_ATTENTION_CUDA(Kokkos::Experimental::bhalf_t)
#undef MESHTRAIN_INSTANTIATE_ATTENTION_CUDA

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
