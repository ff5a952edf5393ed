// RMSNorm on CUDA (rowwise_cuda.hpp): the formulas of rmsnorm.cpp with LayerNorm's CUDA scheme
// (layernorm_cuda.cpp): one warp per row, rows moved as 16-byte vectors (4 floats or 8 bf16),
// fp32 arithmetic, rows up to 256 vectors per warp held in registers. Compiled in every build,
// empty without CUDA.
//
// Forward: one pass for sum(x^2) (no mean, so no second pass is needed for accuracy), then
// out = weight * round_T(x * rstd), HF's order. With an FP8 amax (kAmax), each lane folds the
// bits of the |out| vectors it stores, and each warp (row) one atomic max into the zeroed amax.
//
// Backward: dinp += rstd * (g - n * mean(g * n)), g = weight * dout, n = x * rstd, in one read
// of dout and inp. dweight = sum_rows dout * round_T(n): each warp adds its rows into its own
// [C] slice of shared memory (a lane owns the same columns in every row: no atomics), the block
// adds its warps' slices in warp order into a [block][C] partial in a persistent scratch
// buffer, and a second kernel adds the block partials in a fixed order. A constant number of
// blocks (at most kBwdBlocks): the bits depend on N and C only.
#include "rowwise_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <array>
#include <cmath>
#include <string>
#include <utility>

#include "amax_fused.hpp"
#include "common.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "rowwise_cuda_device.hpp"

namespace meshtrain::kernels::detail {

namespace {

using namespace rowwise;

constexpr int kMaxRegVectors = 8;  // up to C = 2048 in bf16, 1024 in float in registers
constexpr int kFwdWarps = 8;       // rows per forward block
constexpr int kBwdBlocks = 4 * 132;  // LayerNorm's choice: one wave on an H100/H200
constexpr int kBwdMaxC = 8192;
constexpr int kSumRows = 32;

template <class E>
int vectors_per_lane(int C) {
  const int nv = (C / kVec<E> + 31) / 32;
  return nv <= kMaxRegVectors ? nv : 0;
}

// C floats of shared memory per warp: 8 warps up to C = 6144 (192 KB), 4 beyond.
int backward_warps(int C) { return C <= 6144 ? 8 : 4; }
std::size_t backward_smem(int C) {
  return std::size_t(backward_warps(C)) * std::size_t(C) * sizeof(float);
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

// x rounded to E and widened again: the value HF multiplies by the weight.
template <class E>
__device__ __forceinline__ float round_to(float x) {
  if constexpr (sizeof(E) == 2) return __bfloat162float(__float2bfloat16_rn(x));
  else return x;
}

template <class E, int NV, bool kAmax>
__global__ void __launch_bounds__(32 * kFwdWarps)
    forward_kernel(E* __restrict__ out, float* __restrict__ rstd, const E* __restrict__ inp,
                   const E* __restrict__ weight, int N, int C, float eps,
                   unsigned* __restrict__ amax) {
  constexpr int kV = kVec<E>;
  const int lane = threadIdx.x & 31;
  const long row = long(blockIdx.x) * kFwdWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps leave: the shuffles below see full warps
  const int nvec = C / kV;
  const E* x = inp + row * C;
  RowRegs<NV> xr;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) { xr.load(i, x + v * kV); });
  float q = 0.f;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
    float f[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
    for (int k = 0; k < kV; ++k) q += f[k] * f[k];
  });
  const float rs = 1.0f / sqrtf(warp_sum(q) / C + eps);
  E* y = out + row * C;
  std::uint32_t mx = 0;
  owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
    float f[kV], w[kV], o[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
    unpack<E>(load16(weight + v * kV), w);
#pragma unroll
    for (int k = 0; k < kV; ++k) o[k] = w[k] * round_to<E>(f[k] * rs);
    const uint4 yv = pack<E>(o);
    store16(y + v * kV, yv);
    if constexpr (kAmax) mx = max_u32(mx, abs_bits_max<E>(yv));
  });
  if constexpr (kAmax) warp_fold_amax(mx, amax);
  if (lane == 0) rstd[row] = rs;
}

template <int NV>
inline constexpr int kBwdMinBlocks = NV <= 3 ? 4 : 2;

// dinp is read and written (accumulated), so it carries no __restrict__; it must not alias the
// inputs (the header's contract).
template <class E, int NV>
__global__ void __launch_bounds__(256, kBwdMinBlocks<NV>)
    backward_kernel(E* dinp, float* __restrict__ part, const E* __restrict__ dout,
                    const E* __restrict__ inp, const E* __restrict__ weight,
                    const float* __restrict__ rstd, int N, int C) {
  constexpr int kV = kVec<E>;
  extern __shared__ float4 smem4[];  // [warps][C]: dweight partials of each warp
  float* smem = reinterpret_cast<float*>(smem4);
  const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int nvec = C / kV;
  float* dw = smem + long(C) * warp;
  owned_vectors<NV>(lane, 32, nvec, [&](int, int v) {
#pragma unroll
    for (int k = 0; k < kV; k += 4)
      *reinterpret_cast<float4*>(dw + v * kV + k) = make_float4(0.f, 0.f, 0.f, 0.f);
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
    const float rs = rstd[row];
    float sgn = 0.f;
    owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
      const uint4 xq = xr.get(i, x + v * kV), dq = dr.get(i, d + v * kV);
      const uint4 wq = load16(weight + v * kV);
#pragma unroll
      for (int k = 0; k < kV; ++k) sgn += elem<E>(wq, k) * elem<E>(dq, k) * (elem<E>(xq, k) * rs);
    });
    const float mean_gn = warp_sum(sgn) / C;
    owned_vectors<NV>(lane, 32, nvec, [&](int i, int v) {
      const uint4 xq = xr.get(i, x + v * kV), dq = dr.get(i, d + v * kV);
      const uint4 wq = load16(weight + v * kV);
      uint4 oq = load16(dx + v * kV);
#pragma unroll
      for (int h = 0; h < kV; h += 4) {  // 4 columns: one 16-byte access to the accumulator
        float4 acc4 = *reinterpret_cast<float4*>(dw + v * kV + h);
        float* a = reinterpret_cast<float*>(&acc4);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int k = h + j;
          const float n = elem<E>(xq, k) * rs;
          const float g = elem<E>(dq, k);
          set_elem<E>(oq, k, elem<E>(oq, k) + rs * (elem<E>(wq, k) * g - n * mean_gn));
          a[j] += g * round_to<E>(n);
        }
        *reinterpret_cast<float4*>(dw + v * kV + h) = acc4;
      }
      store16(dx + v * kV, oq);
    });
  }
  __syncthreads();
  float* p = part + long(C) * blockIdx.x;  // the block's partial: its warps' slices in order
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    float a = 0.f;
    for (int w = 0; w < warps; ++w) a += smem[long(C) * w + c];
    p[c] = a;
  }
}

// dweight[c] += sum_b part[b][c] in a fixed order: thread (x, y) sums blocks y, y + kSumRows,
// ... of column blockIdx.x * 32 + x, then thread (x, 0) adds the kSumRows sums in y order.
template <class E>
__global__ void __launch_bounds__(32 * kSumRows)
    param_grad_kernel(E* __restrict__ dweight, const float* __restrict__ part, int nblocks,
                      int C) {
  __shared__ float sw[kSumRows][32];
  const int tx = threadIdx.x, ty = threadIdx.y, c = blockIdx.x * 32 + tx;
  float a = 0.f;
  if (c < C)
    for (int k = ty; k < nblocks; k += kSumRows) a += part[long(C) * k + c];
  sw[ty][tx] = a;
  __syncthreads();
  if (ty == 0 && c < C) {
    float s = 0.f;
    for (int j = 0; j < kSumRows; ++j) s += sw[j][tx];
    dweight[c] = from_float<E>(to_float(dweight[c]) + s);
  }
}

template <class E, bool kAmax, std::size_t... I>
auto forward_table(std::index_sequence<I...>) {
  return std::array{&forward_kernel<E, int(I), kAmax>...};
}
template <class E, std::size_t... I>
auto backward_table(std::index_sequence<I...>) {
  return std::array{&backward_kernel<E, int(I)>...};
}
using Vectors = std::make_index_sequence<kMaxRegVectors + 1>;

}  // namespace

template <class T>
bool rmsnorm_forward_cuda(const ExecSpace& exec, View1<T> out, View1<float> rstd,
                          View1<const T> inp, View1<const T> weight, int N, int C, float eps,
                          View1<float> amax) {
  using E = storage_t<T>;
  if (C % kVec<E> != 0 || !aligned16({out.data(), inp.data(), weight.data()})) return false;
  const ToolRegion region([] { return std::string("meshtrain::rmsnorm_forward_cuda"); });
  const bool with_amax = present(amax);
  if (with_amax) reset_amax(exec, amax);  // before the N == 0 return: an empty tensor's is 0
  if (N == 0) return true;
  static const auto kernels = forward_table<E, false>(Vectors());
  static const auto kernels_amax = forward_table<E, true>(Vectors());
  const auto kernel = (with_amax ? kernels_amax : kernels)[vectors_per_lane<E>(C)];
  const unsigned grid = unsigned((long(N) + kFwdWarps - 1) / kFwdWarps);
  kernel<<<grid, 32 * kFwdWarps, 0, exec.cuda_stream()>>>(
      raw(out.data()), rstd.data(), raw(inp.data()), raw(weight.data()), N, C, eps,
      with_amax ? amax_bits(amax) : nullptr);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
  return true;
}

template <class T>
bool rmsnorm_backward_cuda(const ExecSpace& exec, View1<T> dinp, View1<T> dweight,
                           View1<const T> dout, View1<const T> inp, View1<const T> weight,
                           View1<const float> rstd, int N, int C) {
  using E = storage_t<T>;
  if (C % kVec<E> != 0 || C > kBwdMaxC ||
      !aligned16({dinp.data(), dout.data(), inp.data(), weight.data()}) ||
      backward_smem(C) > std::size_t(max_smem_optin()))
    return false;
  const ToolRegion region([] { return std::string("meshtrain::rmsnorm_backward_cuda"); });
  if (N == 0) return true;  // dweight += 0
  const int warps = backward_warps(C);
  const long want = (long(N) + warps - 1) / warps;
  const int blocks = int(want < kBwdBlocks ? want : kBwdBlocks);
  // Slot 1, shared with LayerNorm and the portable column sums: uses are ordered by the queue.
  View1<float> part = persistent_buffer(1, std::size_t(blocks) * std::size_t(C));
  static const auto kernels = backward_table<E>(Vectors());
  const auto kernel = kernels[vectors_per_lane<E>(C)];
  const std::size_t smem = backward_smem(C);
  if (smem > 48 * 1024)  // above 48 KB a kernel must opt in
    MESHTRAIN_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  const cudaStream_t st = exec.cuda_stream();
  kernel<<<blocks, 32 * warps, smem, st>>>(raw(dinp.data()), part.data(), raw(dout.data()),
                                           raw(inp.data()), raw(weight.data()), rstd.data(), N,
                                           C);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
  param_grad_kernel<E><<<(C + 31) / 32, dim3(32, kSumRows), 0, st>>>(raw(dweight.data()),
                                                                     part.data(), blocks, C);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
  return true;
}

#define MESHTRAIN_INSTANTIATE_RMSNORM_CUDA(T)                                                  \
  template bool rmsnorm_forward_cuda<T>(const ExecSpace&, View1<T>, View1<float>,              \
                                        View1<const T>, View1<const T>, int, int, float,       \
                                        View1<float>);                                         \
  template bool rmsnorm_backward_cuda<T>(const ExecSpace&, View1<T>, View1<T>, View1<const T>, \
                                         View1<const T>, View1<const T>, View1<const float>,   \
                                         int, int);
MESHTRAIN_INSTANTIATE_RMSNORM_CUDA(float)
MESHTRAIN_INSTANTIATE_RMSNORM_CUDA(Kokkos::Experimental::bhalf_t)
#undef MESHTRAIN_INSTANTIATE_RMSNORM_CUDA

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
