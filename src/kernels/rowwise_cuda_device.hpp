#pragma once
// Private to layernorm_cuda.cpp, rmsnorm_cuda.cpp and cross_entropy_cuda.cpp: 16-byte vector I/O
// of float and bf16 rows with fp32 arithmetic, warp/block reductions whose results are the same
// bits on every thread and every run, and the fused FP8 amax of a row kernel's output.
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels::detail::rowwise {

// The CUDA element type of a meshtrain storage type (bhalf_t and __nv_bfloat16 share bits).
template <class T>
struct Storage {
  using type = T;
};
template <>
struct Storage<Kokkos::Experimental::bhalf_t> {
  using type = __nv_bfloat16;
};
template <class T>
using storage_t = typename Storage<T>::type;

template <class T>
auto* raw(T* p) {
  return reinterpret_cast<storage_t<T>*>(p);
}
template <class T>
auto* raw(const T* p) {
  return reinterpret_cast<const storage_t<T>*>(p);
}

// Elements of E in one 16-byte vector.
template <class E>
inline constexpr int kVec = 16 / int(sizeof(E));

inline bool aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
  return true;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class E>
__device__ __forceinline__ E from_float(float x) {
  if constexpr (sizeof(E) == 2) return __float2bfloat16_rn(x);
  else return x;
}

__device__ __forceinline__ uint4 load16(const void* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(void* p, const uint4& v) {
  *reinterpret_cast<uint4*>(p) = v;
}

// 16 bytes of E <-> kVec<E> floats. A bf16 widens exactly by a shift (its bits are the top half
// of the float's); narrowing rounds to nearest even, like the portable kernels' static_cast.
template <class E>
__device__ __forceinline__ void unpack(const uint4& v, float (&f)[kVec<E>]) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
  if constexpr (sizeof(E) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(w[i]);
  }
}
template <class E>
__device__ __forceinline__ uint4 pack(const float (&f)[kVec<E>]) {
  std::uint32_t w[4];
  if constexpr (sizeof(E) == 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);  // .x: low half
      w[i] = *reinterpret_cast<const std::uint32_t*>(&h);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __float_as_uint(f[i]);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Element k (a compile-time constant once unrolled) of a 16-byte vector of E, as fp32, and its
// replacement by a value rounded to E. Working element by element on the packed vector keeps
// fewer registers live than unpacking whole vectors into float arrays.
__device__ __forceinline__ std::uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}
__device__ __forceinline__ void set_word(uint4& v, int i, std::uint32_t w) {
  if (i == 0) v.x = w;
  else if (i == 1) v.y = w;
  else if (i == 2) v.z = w;
  else v.w = w;
}
template <class E>
__device__ __forceinline__ float elem(const uint4& v, int k) {
  if constexpr (sizeof(E) == 2) {
    const std::uint32_t w = word(v, k / 2);
    return __uint_as_float(k % 2 == 0 ? w << 16 : w & 0xffff0000u);
  } else {
    return __uint_as_float(word(v, k));
  }
}
template <class E>
__device__ __forceinline__ void set_elem(uint4& v, int k, float x) {
  if constexpr (sizeof(E) == 2) {
    const std::uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(x));
    const std::uint32_t w = word(v, k / 2);
    set_word(v, k / 2, k % 2 == 0 ? (w & 0xffff0000u) | b : (w & 0xffffu) | (b << 16));
  } else {
    set_word(v, k, __float_as_uint(x));
  }
}

// Butterfly reductions over a warp. Every lane ends with the same bits: at each step lanes i and
// i ^ m add the same two values, and IEEE addition (like max) is commutative.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Block reductions for a block of kWarps full warps, through kWarps floats of shared memory
// that the caller does not reuse (no trailing barrier). Every thread adds the warp totals in
// warp order, so all threads get the same bits, and so does every run.
template <int kWarps>
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}
template <int kWarps>
__device__ __forceinline__ float block_max(float v, float* red) {
  v = warp_max(v);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = red[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red[w]);
  return m;
}

// The fused FP8 amax (amax_fused.hpp): max |x| over the elements of a 16-byte vector of E as
// stored, as the float bits of |x| with the sign cleared, the order fp8_amax compares in
// (fp8_cast.cpp). A bf16 widens to float by a 16-bit shift, so its bits need no conversion.
__device__ __forceinline__ std::uint32_t max_u32(std::uint32_t a, std::uint32_t b) {
  return a > b ? a : b;
}
template <class E>
__device__ __forceinline__ std::uint32_t abs_bits_max(const uint4& v) {
  const std::uint32_t w[4] = {v.x, v.y, v.z, v.w};
  std::uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (sizeof(E) == 2)
      m = max_u32(m, max_u32((w[i] << 16) & 0x7fffffffu, w[i] & 0x7fff0000u));
    else
      m = max_u32(m, w[i] & 0x7fffffffu);
  }
  return m;
}
// A warp's max of those bits, folded into *amax by lane 0: one atomic per warp (a row of the
// norms), where one per element would serialise on the one address.
__device__ __forceinline__ void warp_fold_amax(std::uint32_t m, unsigned* amax) {
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, s));
  if ((threadIdx.x & 31) == 0) atomicMax(amax, m);
}

// Calls f(i, v) for the vectors v = first + stride * i < nvec that one thread owns, in order of
// i. With NV > 0 the loop is unrolled NV times, so that f can keep those vectors in a register
// array indexed by i; NV == 0 is a plain loop for rows too long for registers.
template <int NV, class F>
__device__ __forceinline__ void owned_vectors(int first, int stride, int nvec, F&& f) {
  if constexpr (NV > 0) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = first + stride * i;
      if (v < nvec) f(i, v);
    }
  } else {
    int i = 0;
    for (int v = first; v < nvec; v += stride, ++i) f(i, v);
  }
}

// Row vectors cached in registers (NV > 0) or read from memory on every use (NV == 0).
template <int NV>
struct RowRegs {
  uint4 r[NV > 0 ? NV : 1];
  __device__ __forceinline__ void load(int i, const void* p) {
    if constexpr (NV > 0) r[i] = load16(p);
  }
  __device__ __forceinline__ uint4 get(int i, const void* p) const {
    if constexpr (NV > 0) return r[i];
    else return load16(p);
  }
};

}  // namespace meshtrain::kernels::detail::rowwise

#endif  // KOKKOS_ENABLE_CUDA
