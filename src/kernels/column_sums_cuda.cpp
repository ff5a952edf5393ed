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
#include "common.hpp"  // first: Kokkos defines KOKKOS_ENABLE_CUDA

#if defined(KOKKOS_ENABLE_CUDA)
#include <map>
#include <mutex>
#include <string>

#include "column_sums_cuda.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "rowwise_cuda.hpp"
#include "rowwise_cuda_device.hpp"

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
  // The kRows / kWarps rows of a lane fully unrolled, so that all its 16-byte loads are in
  // flight at once (a loop over a runtime bound kept about one at a time: 2.4 TB/s at GPT-2's
  // shapes). The additions keep the row order, so the sums are the loop's bits.
  if (n0 < N) {
    const E* p = B + long(k0 + warp) * ldb + n0;
    uint4 v[kRows / kWarps];
#pragma unroll
    for (int r = 0; r < kRows / kWarps; ++r)
      if (k0 + warp + r * kWarps < k1)
        v[r] = __ldg(reinterpret_cast<const uint4*>(p + long(r) * kWarps * ldb));
#pragma unroll
    for (int r = 0; r < kRows / kWarps; ++r) {
      if (k0 + warp + r * kWarps >= k1) break;
      float f[V];
      unpack<E>(v[r], f);
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
bool column_sums_cuda_fits(int N, int ldb, const T* B) {
  if constexpr (!kCudaRowwiseType<T>) {
    return false;
  } else {
    constexpr int V = kVec<storage_t<T>>;
    return N % V == 0 && ldb % V == 0 && aligned16({B});
  }
}

template <class T>
bool column_sums_add_cuda(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias,
                          cudaStream_t stream) {
  if constexpr (!kCudaRowwiseType<T>) {
    return false;
  } else {
    using E = storage_t<T>;
    constexpr int V = kVec<E>;
    if (!column_sums_cuda_fits<T>(N, ldb, B)) return false;
    const ToolRegion region([] { return std::string("meshtrain::column_sums_cuda"); });
    if (K == 0 || N == 0) return true;
    if (stream == nullptr) stream = exec.cuda_stream();
    const int tiles = (N + 32 * V - 1) / (32 * V), chunks = (K + kRows - 1) / kRows;
    View1<float> part = persistent_buffer(0, std::size_t(chunks) * N);
    column_chunk_sums<E><<<dim3(tiles, chunks), 32 * kWarps, 0, stream>>>(raw(B), ldb, K, N,
                                                                          part.data());
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    add_chunks<E><<<(N + 31) / 32, 32 * kWarps, 0, stream>>>(part.data(), chunks, N, raw(dbias));
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    return true;
  }
}

struct SideStreams {
  std::mutex mutex;
  std::map<int, SideStream> by_device;
  bool hooked = false;

  SideStream& get() {
    int device = 0;
    MESHTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex);
    auto it = by_device.find(device);
    if (it != by_device.end()) return it->second;
    SideStream s;
    int lowest = 0, highest = 0;
    MESHTRAIN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    MESHTRAIN_CUDA_CHECK(
        cudaStreamCreateWithPriority(&s.stream_, cudaStreamNonBlocking, highest));
    MESHTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&s.forked_, cudaEventDisableTiming));
    MESHTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&s.done_, cudaEventDisableTiming));
    if (!hooked) {
      hooked = true;
      Kokkos::push_finalize_hook([this] {
        std::lock_guard<std::mutex> lk(mutex);
        for (auto& kv : by_device) {
          cudaEventDestroy(kv.second.forked_);
          cudaEventDestroy(kv.second.done_);
          cudaStreamDestroy(kv.second.stream_);
        }
        by_device.clear();
        hooked = false;
      });
    }
    return by_device.emplace(device, s).first->second;
  }
};

SideStream& SideStream::fork(const ExecSpace& exec) {
  static SideStreams streams;
  SideStream& s = streams.get();
  MESHTRAIN_CUDA_CHECK(cudaEventRecord(s.forked_, exec.cuda_stream()));
  MESHTRAIN_CUDA_CHECK(cudaStreamWaitEvent(s.stream_, s.forked_, 0));
  return s;
}

void SideStream::join(const ExecSpace& exec) {
  MESHTRAIN_CUDA_CHECK(cudaEventRecord(done_, stream_));
  MESHTRAIN_CUDA_CHECK(cudaStreamWaitEvent(exec.cuda_stream(), done_, 0));
}

#define MESHTRAIN_INSTANTIATE_COLUMN_SUMS(T)                                            \
  template bool column_sums_cuda_fits<T>(int, int, const T*);                           \
  template bool column_sums_add_cuda<T>(const ExecSpace&, int, int, const T*, int, T*, \
                                        cudaStream_t);
MESHTRAIN_INSTANTIATE_COLUMN_SUMS(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_COLUMN_SUMS(bf16)
MESHTRAIN_INSTANTIATE_COLUMN_SUMS(fp16)
#endif

}  // namespace meshtrain::kernels::detail
#endif
