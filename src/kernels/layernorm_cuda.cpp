// LayerNorm on CUDA (rowwise_cuda.hpp): the formulas of layernorm.cpp, one warp per row, rows
// moved as 16-byte vectors (4 floats or 8 bf16), fp32 arithmetic. Compiled in every build,
// empty without CUDA.
//
// Lane l of a row's warp owns the vectors v = l, l + 32, ... (a warp-wide load is 512
// contiguous bytes). For C <= 256 * 16 / sizeof(T) (every GPT-2 width in bf16) the lane keeps
// its vectors in registers, templated on their count NV, so each row is read from memory once;
// longer rows take the NV = 0 instantiation, which re-reads them from L1 on each pass.
//
// Forward: mean, then the variance as a second pass sum((x - mean)^2), like the portable kernel
// (E[x^2] - mean^2 cancels when |mean| >> std); warp butterfly sums. With an FP8 amax (kAmax),
// each lane folds the bits of the |out| vectors it stores, and each warp (row) one atomic max
// into the zeroed amax.
//
// Backward: dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = weight * dout, as the
// portable kernel, in one read of dout and inp. dweight/dbias need column sums over all rows:
// each warp adds its rows' dout * xhat and dout into its own [2][C] slice of shared memory (a
// lane owns the same columns in every row: no atomics, no barriers), the block adds its warps'
// slices in warp order into a [block][2C] partial in a persistent scratch buffer, and a second
// kernel adds the block partials in a fixed order into dweight/dbias. The grid is a constant
// number of blocks (at most kBwdBlocks) with rows strided over its warps, so the bits depend on
// N and C only: the same on every run and on every GPU.
#include "rowwise_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "amax_fused.hpp"
#include "common.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/kernels/workspace.hpp"
#include "rowwise_cuda_device.hpp"

namespace meshtrain::kernels::detail {

namespace {

using namespace rowwise;

// Vectors per lane kept in registers: up to C = 8 * 32 * 8 = 2048 in bf16, 1024 in float.
constexpr int kMaxRegVectors = 8;
constexpr int kFwdWarps = 8;  // rows per forward block
// Backward blocks: 4 on each of an H100's or H200's 132 SMs (one wave at C = 768: 48 KB of
// shared memory and <= 64 registers per thread allow 4 blocks of 256 threads per SM). A
// constant rather than the device's SM count keeps the bits independent of the GPU.
constexpr int kBwdBlocks = kLayerNormBackwardBlocks;  // kernels/workspace.hpp
constexpr int kBwdMaxC = 8192;
constexpr int kSumRows = 32;  // threadIdx.y extent of the dweight/dbias kernel

// ceil(C / kVec / 32) vectors per lane, or 0 (the looping instantiation) beyond kMaxRegVectors.
template <class E>
int vectors_per_lane(int C) {
  const int nv = (C / kVec<E> + 31) / 32;
  return nv <= kMaxRegVectors ? nv : 0;
}

// Warps per backward block: each needs 2 * C floats of shared memory; 8 warps up to C = 3072
// (192 KB), fewer beyond, so the block stays within an H100's 227 KB.
int backward_warps(int C) { return C <= 3072 ? 8 : (C <= 6144 ? 4 : 2); }
std::size_t backward_smem(int C) {
  return std::size_t(backward_warps(C)) * 2 * std::size_t(C) * sizeof(float);
}

int max_smem_optin() {
  static int bytes = -1;  // one device per process (one GPU per rank)
  if (bytes < 0) {
    int dev = 0;
    MESHTRAIN_CUDA_CHECK(cudaGetDevice(&dev));
    MESHTRAIN_CUDA_CHECK(
        cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  }
  return bytes;
}

template <class E, int NV, bool kAmax>
__global__ void __launch_bounds__(32 * kFwdWarps)
    forward_kernel(E* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                   const E* __restrict__ inp, const E* __restrict__ weight,
                   const E* __restrict__ bias, int N, int C, float eps,
                   unsigned* __restrict__ amax) {
  constexpr int kV = kVec<E>;
  const int lane = threadIdx.x & 31;
  const long row = long(blockIdx.x) * kFwdWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps leave: the shuffles below see full warps
  const int nvec = C / kV;
  const E* x = inp + row * C;
  RowRegs<NV> xr;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) { xr.load(i, x + v * kV); });

  float s = 0.f;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
    float f[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
    for (int k = 0; k < kV; ++k) s += f[k];
  });
  const float mu = warp_sum(s) / C;
  float q = 0.f;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
    float f[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
    for (int k = 0; k < kV; ++k) {
      const float d = f[k] - mu;
      q += d * d;
    }
  });
  const float rs = 1.0f / sqrtf(warp_sum(q) / C + eps);

  E* y = out + row * C;
  std::uint32_t mx = 0;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
    float f[kV], w[kV], b[kV], o[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
    unpack<E>(load16(weight + v * kV), w);
    unpack<E>(load16(bias + v * kV), b);
#pragma unroll
    for (int k = 0; k < kV; ++k) o[k] = (f[k] - mu) * rs * w[k] + b[k];
    const uint4 yv = pack<E>(o);
    store16(y + v * kV, yv);
    if constexpr (kAmax) mx = max_u32(mx, abs_bits_max<E>(yv));
  });
  if constexpr (kAmax) warp_fold_amax(mx, amax);
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// p[0..4) += a[0..4) as one 16-byte shared-memory access.
__device__ __forceinline__ void add4(float* p, const float* a) {
  float4 t = *reinterpret_cast<float4*>(p);
  t.x += a[0];
  t.y += a[1];
  t.z += a[2];
  t.w += a[3];
  *reinterpret_cast<float4*>(p) = t;
}

// 4 resident blocks of 256 threads per SM (<= 64 registers, no spills up to NV = 3: C <= 768 in
// bf16) make kBwdBlocks one wave; longer rows need more registers and get 2 (two waves).
template <int NV>
inline constexpr int kBwdMinBlocks = NV <= 3 ? 4 : 2;

// dinp is read and written (accumulated), so it carries no __restrict__; it must not alias the
// inputs (the header's contract).
template <class E, int NV>
__global__ void __launch_bounds__(256, kBwdMinBlocks<NV>)
    backward_kernel(E* dinp, float* __restrict__ part, const E* __restrict__ dout,
                    const E* __restrict__ inp, const E* __restrict__ weight,
                    const float* __restrict__ mean, const float* __restrict__ rstd, int N,
                    int C) {
  constexpr int kV = kVec<E>;
  extern __shared__ float4 smem4[];  // [warps][2][C]: dweight, dbias partials of each warp
  float* smem = reinterpret_cast<float*>(smem4);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nvec = C / kV;
  float* dw = smem + 2 * long(C) * warp;
  float* db = dw + C;
  owned_vectors<NV>(lane, 32, nvec, [&](int, int v) {
#pragma unroll
    for (int k = 0; k < kV; k += 4) {
      *reinterpret_cast<float4*>(dw + v * kV + k) = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(db + v * kV + k) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  });

  const long row_stride = long(gridDim.x) * warps;
  for (long row = long(blockIdx.x) * warps + warp; row < N; row += row_stride) {
    const E* x = inp + row * C;
    const E* d = dout + row * C;
    E* dx = dinp + row * C;
    RowRegs<NV> xr, dr;
    owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
      xr.load(i, x + v * kV);
      dr.load(i, d + v * kV);
    });
    const float mu = mean[row], rs = rstd[row];
    float sg = 0.f, sgx = 0.f;
    owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
      const uint4 xq = xr.get(i, x + v * kV), dq = dr.get(i, d + v * kV);
      const uint4 wq = load16(weight + v * kV);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const float gk = elem<E>(wq, k) * elem<E>(dq, k);
        sg += gk;
        sgx += gk * ((elem<E>(xq, k) - mu) * rs);
      }
    });
    const float mean_g = warp_sum(sg) / C, mean_gx = warp_sum(sgx) / C;
    owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
      const uint4 xq = xr.get(i, x + v * kV), dq = dr.get(i, d + v * kV);
      const uint4 wq = load16(weight + v * kV);
      uint4 oq = load16(dx + v * kV);
#pragma unroll
      for (int h = 0; h < kV; h += 4) {  // 4 columns: one 16-byte access per accumulator
        float gx[4], g[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int k = h + j;
          const float xhat = (elem<E>(xq, k) - mu) * rs;
          g[j] = elem<E>(dq, k);
          const float o = elem<E>(oq, k) + rs * (elem<E>(wq, k) * g[j] - mean_g - xhat * mean_gx);
          set_elem<E>(oq, k, o);
          gx[j] = g[j] * xhat;
        }
        add4(dw + v * kV + h, gx);
        add4(db + v * kV + h, g);
      }
      store16(dx + v * kV, oq);
    });
  }
  __syncthreads();
  // The block's partial: its warps' slices added in warp order.
  float* p = part + 2 * long(C) * blockIdx.x;
  for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < warps; ++w) a += smem[2 * long(C) * w + c];
    p[c] = a;
  }
}

// dweight[c] += sum_b part[b][c] and dbias[c] += sum_b part[b][C + c], in a fixed order: thread
// (x, y) sums blocks y, y + kSumRows, ... of column blockIdx.x * 32 + x, then thread (x, 0) adds
// the kSumRows sums in y order.
template <class E>
__global__ void __launch_bounds__(32 * kSumRows)
    param_grad_kernel(E* __restrict__ dweight, E* __restrict__ dbias,
                      const float* __restrict__ part, int nblocks, int C) {
  __shared__ float sw[kSumRows][32], sb[kSumRows][32];
  const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
  float a = 0.f, b = 0.f;
  if (c < C)
    for (int k = ty; k < nblocks; k += kSumRows) {
      a += part[2 * long(C) * k + c];
      b += part[2 * long(C) * k + C + c];
    }
  sw[ty][tx] = a;
  sb[ty][tx] = b;
  __syncthreads();
  if (ty == 0 && c < C) {
    float sa = 0.f, sbias = 0.f;
    for (int j = 0; j < kSumRows; ++j) {
      sa += sw[j][tx];
      sbias += sb[j][tx];
    }
    dweight[c] = from_float<E>(to_float(dweight[c]) + sa);
    dbias[c] = from_float<E>(to_float(dbias[c]) + sbias);
  }
}

// Kernel tables indexed by NV = 0 (looping), 1, ..., kMaxRegVectors.
template <class E, bool kAmax, std::size_t... I>
auto forward_table(std::index_sequence<I...>) {
  return std::array{&forward_kernel<E, int(I), kAmax>...};
}
template <class E, std::size_t... I>
auto backward_table(std::index_sequence<I...>) {
  return std::array{&backward_kernel<E, int(I)>...};
}
using Vectors = std::make_index_sequence<kMaxRegVectors + 1>;

// amax: the FP8 amax's bits, already zeroed on st, or null for none.
template <class E>
void launch_forward(cudaStream_t st, E* out, float* mean, float* rstd, const E* inp,
                    const E* weight, const E* bias, int N, int C, float eps, unsigned* amax) {
  static const auto kernels = forward_table<E, false>(Vectors());
  static const auto kernels_amax = forward_table<E, true>(Vectors());
  const auto kernel = (amax ? kernels_amax : kernels)[vectors_per_lane<E>(C)];
  const unsigned grid = unsigned((long(N) + kFwdWarps - 1) / kFwdWarps);
  kernel<<<grid, 32 * kFwdWarps, 0, st>>>(out, mean, rstd, inp, weight, bias, N, C, eps, amax);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

template <class E>
void launch_backward(cudaStream_t st, E* dinp, E* dweight, E* dbias, float* part, int blocks,
                     const E* dout, const E* inp, const E* weight, const float* mean,
                     const float* rstd, int N, int C) {
  static const auto kernels = backward_table<E>(Vectors());
  const auto kernel = kernels[vectors_per_lane<E>(C)];
  const std::size_t smem = backward_smem(C);
  // Above 48 KB a kernel must opt in; the attribute is per kernel and cheap to set again.
  if (smem > 48 * 1024)
    MESHTRAIN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<blocks, 32 * backward_warps(C), smem, st>>>(dinp, part, dout, inp, weight, mean, rstd,
                                                       N, C);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
  param_grad_kernel<E><<<(C + 31) / 32, dim3(32, kSumRows), 0, st>>>(dweight, dbias, part, blocks,
                                                                     C);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class T>
bool layernorm_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> mean,
                            View1<float> rstd, View1<const T> inp, View1<const T> weight,
                            View1<const T> bias, int N, int C, float eps, View1<float> amax) {
  using E = storage_t<T>;
  if (C % kVec<E> != 0 || !aligned16({out.data(), inp.data(), weight.data(), bias.data()}))
    return false;
  const ToolRegion region([] { return std::string("meshtrain::layernorm_forward_cuda"); });
  const bool with_amax = present(amax);
  if (with_amax) reset_amax(exec, amax);  // whatever N: an empty tensor's amax is 0
  if (N > 0)
    launch_forward<E>(exec.cuda_stream(), raw(out.data()), mean.data(), rstd.data(),
                      raw(inp.data()), raw(weight.data()), raw(bias.data()), N, C, eps,
                      with_amax ? amax_bits(amax) : nullptr);
  return true;
}

template <class T>
bool layernorm_backward_cuda(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                             View1<T> dbias, View1<const T> dout, View1<const T> inp,
                             View1<const T> weight, View1<const float> mean,
                             View1<const float> rstd, int N, int C) {
  using E = storage_t<T>;
  if (C % kVec<E> != 0 || C > kBwdMaxC ||
      !aligned16({dinp.data(), dout.data(), inp.data(), weight.data()}) ||
      backward_smem(C) > std::size_t(max_smem_optin()))
    return false;
  const ToolRegion region([] { return std::string("meshtrain::layernorm_backward_cuda"); });
  if (N == 0) return true;  // dweight, dbias += 0
  const int warps = backward_warps(C);
  const long want = (long(N) + warps - 1) / warps;
  const int blocks = int(want < kBwdBlocks ? want : kBwdBlocks);
  // Slot 1, the portable kernel's column-sum scratch: uses of a slot are ordered by the queue.
  View1<float> part = persistent_buffer(1, std::size_t(blocks) * 2 * std::size_t(C));
  launch_backward<E>(exec.cuda_stream(), raw(dinp.data()), raw(dweight.data()), raw(dbias.data()),
                     part.data(), blocks, raw(dout.data()), raw(inp.data()), raw(weight.data()),
                     mean.data(), rstd.data(), N, C);
  return true;
}

#define MESHTRAIN_INSTANTIATE_LAYERNORM_CUDA(T)                                                 \
  template bool layernorm_forward_cuda<T>(const ExecSpace&, View1<T>, View1<float>,             \
                                          View1<float>, View1<const T>, View1<const T>,         \
                                          View1<const T>, int, int, float, View1<float>);       \
  template bool layernorm_backward_cuda<T>(const ExecSpace&, View1<T>, View1<T>, View1<T>,      \
                                           View1<const T>, View1<const T>, View1<const T>,      \
                                           View1<const float>, View1<const float>, int, int);
MESHTRAIN_INSTANTIATE_LAYERNORM_CUDA(float)
MESHTRAIN_INSTANTIATE_LAYERNORM_CUDA(Kokkos::Experimental::bhalf_t)
#undef MESHTRAIN_INSTANTIATE_LAYERNORM_CUDA

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
