// FP8 current-scaling passes on CUDA (fp8_cast_cuda.hpp): fp8_amax_block and fp8_cast_block for
// float and bf16 blocks, with 16-byte loads (8 bf16 or 4 floats a thread) and 8- or 4-byte
// stores. Compiled in every build, empty without CUDA.
//
// Why: the Kokkos kernels of fp8_cast.cpp move two bytes in and one out per thread. On the H100
// the step's casts took 24 ms at the Llama-8B shape, about 5x their memory traffic (2026-12-05
// trace), and every FP8 linear runs them on its input, weight and output gradient.
//
// amax: a grid-stride loop over the block's vectors, each thread's max of the |x| bits (the
//   order fp8_cast.cpp reduces in: NaN over inf over finite), a block max into a partial of its
//   own, and the last block to finish folds the partials into amax: one launch, no memset
//   before it. The max is order-free: the bits equal the portable kernel's.
// cast (q only): one vector a thread, encoded element by element with fp8_encode (the same
//   codes as the portable kernel: the same function on the same fp32 product), stored as 8 or 4
//   bytes. The scale is given, or made from the amax inside the cast (fp8_scale_cast_block):
//   the H100 trace of 2026-12-06 showed the FP8 step's host launching about 100 one-thread
//   fp8_scales kernels and 56 amax memsets a step while the GPU idled 1.9 ms more than bf16's.
// cast with the transpose (qt, and q with it): 64 x 64 tiles. A block of 256 threads reads its
//   tile's rows as vectors, encodes them once, writes q's rows directly and the codes into
//   shared memory; then each thread gathers 8 codes down a column of the tile and writes them as
//   8 consecutive bytes of qt's row (8 threads cover one 64-byte piece of it: whole sectors).
#include "fp8_cast_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <algorithm>
#include <climits>
#include <type_traits>

#include "amax_fused.hpp"
#include "common.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "meshtrain/core/fp8.hpp"
#include "meshtrain/kernels/fp8_cast.hpp"
#include "rowwise_cuda_device.hpp"

namespace meshtrain::kernels::detail {

namespace {

using namespace rowwise;

constexpr int kThreads = 256;
constexpr int kTile = 64;               // the transposed cast's tile: kTile x kTile elements
constexpr int kTileLd = kTile + 8;      // bytes per shared row: 8-byte aligned stores
constexpr int kAmaxBlocksMax = 8 * 132;  // a few waves of an H100/H200, then grid-stride

// Vector v of the block (vpr vectors per row, row stride ld elements) as an element offset.
__device__ __forceinline__ long long vector_offset(int v, int vpr, int vec, long long ld) {
  const int r = v / vpr;
  return r * ld + static_cast<long long>(v - r * vpr) * vec;
}

// The max of the block's threads' m, in the block's thread 0 (the others get their warp's).
__device__ __forceinline__ std::uint32_t block_max(std::uint32_t m) {
  __shared__ std::uint32_t warp_max[kThreads / 32];
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) m = max_u32(m, __shfl_xor_sync(0xffffffffu, m, s));
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kThreads / 32; ++w) m = max_u32(m, warp_max[w]);
  return m;
}

// Each block writes its max to partial[blockIdx.x] and counts itself done; the block that counts
// last (every other partial written and fenced by then) folds the partials into *amax and resets
// the count for the next launch. So nothing is zeroed before the kernel (no memset launch), and
// the result is the max of the same bits as an atomic max into a zeroed amax.
template <class E>
__global__ void __launch_bounds__(kThreads)
    fp8_amax_kernel(const E* __restrict__ x, int nvec, int vpr, long long ld,
                    unsigned* __restrict__ partial, unsigned* done, unsigned* amax) {
  __shared__ bool last;
  std::uint32_t m = 0;
  for (int v = blockIdx.x * kThreads + threadIdx.x; v < nvec; v += gridDim.x * kThreads)
    m = max_u32(m, abs_bits_max<E>(load16(x + vector_offset(v, vpr, kVec<E>, ld))));
  m = block_max(m);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = m;
    __threadfence();
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  std::uint32_t t = 0;
  for (int b = threadIdx.x; b < gridDim.x; b += kThreads) t = max_u32(t, __ldcg(partial + b));
  t = block_max(t);
  if (threadIdx.x == 0) {
    *amax = t;
    *done = 0;
  }
}

// The kVec<E> codes of one vector, in order, packed little-endian (element 0 in the low byte).
template <class E, Fp8Format F>
__device__ __forceinline__ unsigned long long encode_vector(const uint4& v, float s) {
  unsigned long long out = 0;
#pragma unroll
  for (int k = 0; k < kVec<E>; ++k)
    out |= static_cast<unsigned long long>(fp8_encode(elem<E>(v, k) * s, F)) << (8 * k);
  return out;
}

template <class E>
__device__ __forceinline__ void store_codes(std::uint8_t* p, unsigned long long c) {
  if constexpr (kVec<E> == 8) *reinterpret_cast<unsigned long long*>(p) = c;
  else *reinterpret_cast<unsigned*>(p) = static_cast<unsigned>(c);
}

// The cast's scale (CastScale): given, or made from the amax by every thread, the first of the
// grid (first) writing it and its inverse out — fp8_scales' arithmetic, so the same bits.
template <Fp8Format F, bool kFromAmax>
__device__ __forceinline__ float cast_scale(const CastScale& cs, bool first) {
  if constexpr (!kFromAmax) {
    return *cs.scale;
  } else {
    const float s = fp8_scale_from_amax(*cs.amax, F);
    if (first) {
      *cs.scale_out = s;
      *cs.scale_inv_out = 1.0f / s;
    }
    return s;
  }
}

template <class E, Fp8Format F, bool kFromAmax>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_kernel(const E* __restrict__ x, int nvec, int vpr, long long ld, CastScale cs,
                    std::uint8_t* __restrict__ q) {
  const int v = blockIdx.x * kThreads + threadIdx.x;
  const float s = cast_scale<F, kFromAmax>(cs, v == 0);
  if (v >= nvec) return;
  const uint4 in = load16(x + vector_offset(v, vpr, kVec<E>, ld));
  store_codes<E>(q + static_cast<long long>(v) * kVec<E>, encode_vector<E, F>(in, s));
}

// Block (bx, by): rows [by * kTile, +kTile), columns [bx * kTile, +kTile) of the [rows, cols]
// source. q [rows, cols] (may be null), qt [cols, rows].
template <class E, Fp8Format F, bool kFromAmax>
__global__ void __launch_bounds__(kThreads)
    fp8_cast_transpose_kernel(const E* __restrict__ x, int rows, int cols, long long ld,
                              CastScale cs, std::uint8_t* __restrict__ q,
                              std::uint8_t* __restrict__ qt) {
  __shared__ __align__(16) std::uint8_t tile[kTile * kTileLd];
  constexpr int kRowVecs = kTile / kVec<E>;
  const long long r0 = static_cast<long long>(blockIdx.y) * kTile;
  const long long c0 = static_cast<long long>(blockIdx.x) * kTile;
  const float s =
      cast_scale<F, kFromAmax>(cs, blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0);
#pragma unroll
  for (int u = threadIdx.x; u < kTile * kRowVecs; u += kThreads) {
    const int i = u / kRowVecs, j = (u % kRowVecs) * kVec<E>;
    const unsigned long long codes =
        encode_vector<E, F>(load16(x + (r0 + i) * ld + c0 + j), s);
    store_codes<E>(tile + i * kTileLd + j, codes);
    if (q != nullptr) store_codes<E>(q + (r0 + i) * cols + c0 + j, codes);
  }
  __syncthreads();
  // Unit u: column c of the tile, its rows [8 g, 8 g + 8): 8 consecutive threads share a
  // column, so they write one contiguous 64-byte piece of qt's row c0 + c.
#pragma unroll
  for (int u = threadIdx.x; u < kTile * (kTile / 8); u += kThreads) {
    const int g = u % (kTile / 8), c = u / (kTile / 8);
    unsigned long long out = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k)
      out |= static_cast<unsigned long long>(tile[(8 * g + k) * kTileLd + c]) << (8 * k);
    *reinterpret_cast<unsigned long long*>(qt + (c0 + c) * rows + r0 + 8 * g) = out;
  }
}

bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// The block as vectors: rows x (cols / vec), every row's start 16-byte aligned.
template <class E>
bool vectorisable(const E* x, int rows, int cols, int ld) {
  constexpr int vec = kVec<E>;
  return rows > 0 && cols > 0 && cols % vec == 0 && ld % vec == 0 && aligned(x, 16) &&
         static_cast<long long>(rows) * (cols / vec) <= INT_MAX;
}

// k(format, from_amax) with both as compile-time constants.
template <class Kernel>
void launch_by_format(Fp8Format f, bool from_amax, Kernel&& k) {
  auto with_format = [&](auto fc) {
    if (from_amax)
      k(fc, std::true_type{});
    else
      k(fc, std::false_type{});
  };
  if (f == Fp8Format::e4m3)
    with_format(std::integral_constant<Fp8Format, Fp8Format::e4m3>{});
  else
    with_format(std::integral_constant<Fp8Format, Fp8Format::e5m2>{});
}

// The amax kernel's scratch: a partial max per block and the count of blocks done (0 between
// launches: the last block resets it). One set serves every launch, as persistent_scalar's
// slots do (kernels/common.cpp): all kernels of a run go to one execution-space instance, whose
// queue orders each launch after the previous one.
struct AmaxScratch {
  unsigned* partial;
  unsigned* done;
};
AmaxScratch amax_scratch() {
  static Kokkos::View<unsigned*, MemSpace> buf;
  static bool hooked = false;
  if (!hooked) {
    Kokkos::push_finalize_hook([] {
      buf = Kokkos::View<unsigned*, MemSpace>();
      hooked = false;
    });
    hooked = true;
  }
  if (buf.data() == nullptr)  // zero-initialised: the count starts at 0
    buf = Kokkos::View<unsigned*, MemSpace>("meshtrain::fp8_amax_scratch", kAmaxBlocksMax + 1);
  return {buf.data(), buf.data() + kAmaxBlocksMax};
}

}  // namespace

template <class T>
bool fp8_amax_block_cuda(const ExecSpace& exec, View1<float> amax, const T* x, int rows,
                         int cols, int ld) {
  if constexpr (!kCudaCastType<T>) {
    return false;
  } else {
    using E = storage_t<T>;
    const E* xr = raw(x);
    if (!vectorisable(xr, rows, cols, ld)) return false;
    // A contiguous block is one long row: no division per vector beyond the first.
    const int vpr = ld == cols ? INT_MAX : cols / kVec<E>;
    const int nvec = static_cast<int>(static_cast<long long>(rows) * (cols / kVec<E>));
    const int blocks = std::min((nvec + kThreads - 1) / kThreads, kAmaxBlocksMax);
    const AmaxScratch scratch = amax_scratch();
    Kokkos::Profiling::pushRegion("meshtrain::fp8_amax_block_cuda");
    fp8_amax_kernel<E><<<blocks, kThreads, 0, exec.cuda_stream()>>>(
        xr, nvec, vpr, ld, scratch.partial, scratch.done,
        reinterpret_cast<unsigned*>(amax_bits(amax)));
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    Kokkos::Profiling::popRegion();
    return true;
  }
}

template <class T>
bool fp8_cast_block_cuda(const ExecSpace& exec, View1<std::uint8_t> q, View1<std::uint8_t> qt,
                         const T* x, int rows, int cols, int ld, const CastScale& scale,
                         Fp8Format format) {
  if constexpr (!kCudaCastType<T>) {
    return false;
  } else {
    using E = storage_t<T>;
    constexpr int vec = kVec<E>;
    const E* xr = raw(x);
    std::uint8_t* qp = present(q) ? q.data() : nullptr;
    std::uint8_t* qtp = present(qt) ? qt.data() : nullptr;
    if (!vectorisable(xr, rows, cols, ld) || (qp == nullptr && qtp == nullptr)) return false;
    if (qp != nullptr && !aligned(qp, vec)) return false;
    const cudaStream_t st = exec.cuda_stream();
    const bool from_amax = scale.amax != nullptr;
    if (qtp == nullptr) {
      const int vpr = ld == cols ? INT_MAX : cols / vec;
      const int nvec = static_cast<int>(static_cast<long long>(rows) * (cols / vec));
      Kokkos::Profiling::pushRegion("meshtrain::fp8_cast_block_cuda");
      launch_by_format(format, from_amax, [&](auto f, auto a) {
        fp8_cast_kernel<E, decltype(f)::value, decltype(a)::value>
            <<<(nvec + kThreads - 1) / kThreads, kThreads, 0, st>>>(xr, nvec, vpr, ld, scale, qp);
      });
      MESHTRAIN_CUDA_CHECK(cudaGetLastError());
      Kokkos::Profiling::popRegion();
      return true;
    }
    if (rows % kTile != 0 || cols % kTile != 0 || !aligned(qtp, 8) || rows / kTile > 65535)
      return false;
    Kokkos::Profiling::pushRegion("meshtrain::fp8_cast_transpose_cuda");
    const dim3 grid(cols / kTile, rows / kTile);
    launch_by_format(format, from_amax, [&](auto f, auto a) {
      fp8_cast_transpose_kernel<E, decltype(f)::value, decltype(a)::value>
          <<<grid, kThreads, 0, st>>>(xr, rows, cols, ld, scale, qp, qtp);
    });
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    Kokkos::Profiling::popRegion();
    return true;
  }
}

#define MESHTRAIN_INSTANTIATE_FP8_CAST_CUDA(T)                                                  \
  template bool fp8_amax_block_cuda<T>(const ExecSpace&, View1<float>, const T*, int, int, int); \
  template bool fp8_cast_block_cuda<T>(const ExecSpace&, View1<std::uint8_t>,                    \
                                       View1<std::uint8_t>, const T*, int, int, int,             \
                                       const CastScale&, Fp8Format);
MESHTRAIN_INSTANTIATE_FP8_CAST_CUDA(float)
#if MESHTRAIN_HAVE_BF16
MESHTRAIN_INSTANTIATE_FP8_CAST_CUDA(bf16)
MESHTRAIN_INSTANTIATE_FP8_CAST_CUDA(fp16)  // no CUDA path: returns false
#endif
#undef MESHTRAIN_INSTANTIATE_FP8_CAST_CUDA

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
