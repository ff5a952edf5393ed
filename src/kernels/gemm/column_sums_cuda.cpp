// dbias[n] += sum over k of B[k][n] on CUDA, for gemm_dbias' split form (gemm_ex.cpp): the
// bias gradient of a linear layer, a column sum over all token rows of its output gradient.
// A cuBLAS GEMV (ones^T B) does this at a fraction of the bandwidth for bf16 (about 1 ms of a
// GPT-2 124M step for 48 sums that move 226 MB), and the portable two-stage Kokkos column sums
// read one 2-byte element per thread.
//
// Stage 1: a block of 8 warps per (tile of 32 x kVec columns, chunk of kRows rows); lane l of
// every warp reads the 16 bytes of columns [tile + l kVec, + kVec) of the rows w, w + 8, ... of
// the chunk, the 8 warps' sums are added in warp order in shared memory and the chunk's partial
// goes to scratch. Stage 2: 8 warps per 32 columns, each adding every 8th chunk, then the 8 in
// warp order, into dbias.
// Deterministic (a fixed order for a given K, N), fp32 accumulation.
#include "../common.hpp"  // first: Kokkos defines KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA)
#include <string>

#include "column_sums_cuda.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "../rowwise_cuda.hpp"
#include "../rowwise_cuda_device.hpp"

namespace meshtrain::kernels::detail {

namespace {

using namespace rowwise;

constexpr int kWarps = 8, kRows = 128;

template <class E>
__global__ void __launch_bounds__(32 * kWarps)
    column_chunk_sums(const E* __restrict__ B, int ldb, int K, int N, float* __restrict__ part) {
  constexpr int V = kVec<E>;
  __shared__ float sums[kWarps][32 * V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n0 = blockIdx.x * 32 * V + lane * V;
  const int k0 = blockIdx.y * kRows, k1 = min(k0 + kRows, K);
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0f;
  if (n0 < N) {
    for (int k = k0 + warp; k < k1; k += kWarps) {
      float f[V];
      unpack<E>(load16(B + long(k) * ldb + n0), f);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] += f[i];
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) sums[warp][lane * V + i] = acc[i];
  __syncthreads();
  for (int c = threadIdx.x; c < 32 * V; c += 32 * kWarps) {
    const int n = blockIdx.x * 32 * V + c;
    if (n >= N) continue;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += sums[w][c];
    part[long(blockIdx.y) * N + n] = s;
  }
}

// Stage 2: a block of kWarps warps per 32 columns; lane l takes column n0 + l (so each warp
// reads 128 contiguous bytes per chunk), warp w adds the chunks w, w + kWarps, ... in order, and
// the kWarps sums are added in warp order. With one thread per column and all chunks in one
// loop, a 768-column sum over 256 chunks ran on 3 blocks, one dependent L2 round trip per chunk.
template <class E>
__global__ void __launch_bounds__(32 * kWarps)
    add_chunks(const float* __restrict__ part, int chunks, int N, E* dbias) {
  __shared__ float sums[kWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.x * 32 + lane;
  float s = 0.0f;
  if (n < N)
    for (int c = warp; c < chunks; c += kWarps) s += part[long(c) * N + n];
  sums[warp][lane] = s;
  __syncthreads();
  if (warp != 0 || n >= N) return;
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += sums[w][lane];
  dbias[n] = from_float<E>(to_float(dbias[n]) + total);
}

}  // namespace

template <class T>
bool column_sums_add_cuda(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias) {
  if constexpr (!kCudaRowwiseType<T>) {
    return false;
  } else {
    using E = storage_t<T>;
    constexpr int V = kVec<E>;
    if (N % V != 0 || ldb % V != 0 || !aligned16({B})) return false;
    const ToolRegion region([] { return std::string("meshtrain::column_sums_cuda"); });
    if (K == 0 || N == 0) return true;
    const int tiles = (N + 32 * V - 1) / (32 * V), chunks = (K + kRows - 1) / kRows;
    View1<float> part = persistent_buffer(0, std::size_t(chunks) * N);
    column_chunk_sums<E><<<dim3(tiles, chunks), 32 * kWarps, 0, exec.cuda_stream()>>>(
        raw(B), ldb, K, N, part.data());
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    add_chunks<E><<<(N + 31) / 32, 32 * kWarps, 0, exec.cuda_stream()>>>(part.data(), chunks, N,
                                                                        raw(dbias));
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    return true;
  }
}

template bool column_sums_add_cuda<float>(const ExecSpace&, int, int, const float*, int, float*);
#if MESHTRAIN_HAVE_BF16
template bool column_sums_add_cuda<bf16>(const ExecSpace&, int, int, const bf16*, int, bf16*);
template bool column_sums_add_cuda<fp16>(const ExecSpace&, int, int, const fp16*, int, fp16*);
#endif

}  // namespace meshtrain::kernels::detail
#endif
