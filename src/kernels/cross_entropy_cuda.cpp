// Fused softmax cross-entropy on CUDA (rowwise_cuda.hpp): the contract of cross_entropy.hpp,
// one 1024-thread block per row, the row moved as 16-byte vectors (4 floats or 8 bf16), fp32
// arithmetic. Compiled in every build, empty without CUDA.
//
// Thread t owns the vectors v = t, t + 1024, ... of the row's real columns [0, V). When they
// fit (at most kMaxRegVectors per thread: V <= 65536 in bf16, 32768 in float) the thread keeps
// them in registers, templated on their count NV, and the row is read from memory exactly once
// and written once; longer rows take the NV = 0 instantiation, which re-reads them (mostly from
// L2) on each pass. Since the row is at hand, the statistics are the exact two-pass ones rather
// than an online (max, sum) merge: M = max_c x_c (a block max, exact in any order), then
// S = sum_c exp(x_c - M) (per-thread sums in a fixed order, warp butterflies, then the 32 warp
// totals added in warp order by every thread), loss = M + log(S) - x[target], and the gradient
// grad_scale * (exp(x_c - M) / S - onehot). The forward-only kernel is the same template without
// the gradient pass, so its losses are the same bits. Padding columns [V, Vp) are never read
// (a vector straddling V masks its tail) and are written as zeros.
//
// bf16 rows take a second form instead (MESHTRAIN_CE_KERNEL=regs keeps the register form);
// rows longer than the shared memory (Llama 3's 128256 columns: 250.5 KB) stage their first
// 226 KB in one 1024-thread block and re-read the rest. Up to 113 KB, 512 threads keep the row
// in shared memory
// (the GPT-2 vocabulary's row is 100.6 KB, so two blocks fit an SM's 228 KB), so that one block's
// reductions and exponentials overlap the other's loads and stores; with one 1024-thread block
// per SM (the register form's 64 registers a thread allow no second) the SM idles on each row's
// two barriers and its exponential passes. Each thread reads back only the vectors it stored, so
// the shared memory needs no barrier of its own. The row arrives by cp.async (every copy of a
// thread in flight at once) and the exponentials run on the special-function unit. The same
// statistics and formula as the register form; the sums group the threads' partial sums
// differently (512 threads) and the exponentials are ex2.approx, so the last bits of a loss may
// differ between the forms (the tests hold each to the portable kernels' tolerances). On an H200
// at GPT-2 124M's [16384, 50304] the fused forward and backward take 0.813 ms against the
// register form's 1.708 (4053 against 1929 GB/s) and 1.427 for the shared-memory form before it
// used cp.async (perf/archive/journal.md).
#include "rowwise_cuda.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <math_constants.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common.hpp"
#include "meshtrain/core/cuda_check.hpp"
#include "sfu_math.hpp"
#include "rowwise_cuda_device.hpp"

namespace meshtrain::kernels::detail {

namespace {

using namespace rowwise;

constexpr int kThreads = 1024, kWarps = kThreads / 32;
// 8 vectors (32 registers) per thread: within the 64 registers a 1024-thread block allows.
constexpr int kMaxRegVectors = 8;

template <class E>
int vectors_per_thread(int V) {
  const int nv = ((V + kVec<E> - 1) / kVec<E> + kThreads - 1) / kThreads;
  return nv <= kMaxRegVectors ? nv : 0;
}

// in: the logits; out: the same row buffer, overwritten with the gradient when kGrad (the
// forward-only instantiation never writes it). Neither is __restrict__: they alias.
template <class E, int NV, bool kGrad>
__global__ void __launch_bounds__(kThreads)
    ce_kernel(float* __restrict__ losses, const E* in, E* out,
              const std::int32_t* __restrict__ targets, int Vp, int V, float grad_scale) {
  constexpr int kV = kVec<E>;
  __shared__ float red_max[kWarps], red_sum[kWarps];
  const long row = blockIdx.x;
  const int t = threadIdx.x;
  const int nvec = (V + kV - 1) / kV, nvec_all = Vp / kV;
  const E* x = in + row * Vp;
  E* g = kGrad ? out + row * Vp : nullptr;
  const int tgt = targets[row];
  if (tgt < 0) {  // an ignored position: loss 0, gradient 0, the row is not read
    if constexpr (kGrad)
      for (int v = t; v < nvec_all; v += kThreads) store16(g + v * kV, make_uint4(0, 0, 0, 0));
    if (t == 0) losses[row] = 0.f;
    return;
  }
  // Read before the row is overwritten: the barriers of the block reductions below separate it
  // from every gradient write. A target >= V is corrupt input: a NaN loss makes it loud.
  const float xt = (t == 0 && tgt < V) ? to_float(x[tgt]) : CUDART_NAN_F;

  RowRegs<NV> xr;
  owned_vectors<NV>(t, kThreads, nvec, [&](int i, int v) { xr.load(i, x + v * kV); });
  float m = -CUDART_INF_F;
  owned_vectors<NV>(t, kThreads, nvec, [&](int i, int v) {
    float f[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
    for (int k = 0; k < kV; ++k)
      if (v * kV + k < V) m = fmaxf(m, f[k]);
  });
  const float M = block_max<kWarps>(m, red_max);
  float s = 0.f;
  owned_vectors<NV>(t, kThreads, nvec, [&](int i, int v) {
    float f[kV];
    unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
    for (int k = 0; k < kV; ++k)
      if (v * kV + k < V) s += expf(f[k] - M);
  });
  const float S = block_sum<kWarps>(s, red_sum);
  if (t == 0) losses[row] = M + logf(S) - xt;

  if constexpr (kGrad) {
    const float scale = grad_scale / S;
    owned_vectors<NV>(t, kThreads, nvec, [&](int i, int v) {
      float f[kV], d[kV];
      unpack<E>(xr.get(i, x + v * kV), f);
#pragma unroll
      for (int k = 0; k < kV; ++k) {
        const int c = v * kV + k;
        d[k] = c < V ? expf(f[k] - M) * scale - (c == tgt ? grad_scale : 0.f) : 0.f;
      }
      store16(g + v * kV, pack<E>(d));
    });
    for (int v = nvec + t; v < nvec_all; v += kThreads) store16(g + v * kV, make_uint4(0, 0, 0, 0));
  }
}

constexpr int kSmemThreads = 512;

// 16 bytes from global to shared memory without passing through registers (sm_80's cp.async,
// cached in L2 only): all of a thread's copies are in flight at once. Plain loads, each followed
// by its shared store, went one at a time: the logits come through a generic pointer, which may
// alias shared memory, so the compiler cannot hoist the next load above the store before it.
__device__ __forceinline__ void copy16_async(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  store16(smem, load16(gmem));
#endif
}
// Waits for this thread's copies, which then are visible to it (and only to it: each thread
// reads back the vectors it copied, so no barrier is needed).
__device__ __forceinline__ void wait_async_copies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}
// Exponentials by exp2_sfu (sfu_math.hpp): results below 2^-126 flush to 0, a probability that
// no gradient notices; expf costs a range reduction on top of the same unit.

// The shared-memory form (bf16): the row's real vectors [0, nsmem) copied into dynamic shared
// memory by copy16_async, each by the thread that owns it (nsmem = nvec for rows that fit; a
// longer row, Llama 3's 128256 columns, stages its first ~226 KB and reads the rest from memory,
// mostly L2, on each pass), the exponentials 2^(x log2 e -
// M log2 e) on the special-function unit, and only the vector holding the target and the row's
// partial last vector on the masked, per-column path. Every exponential is 2^(x L - ML) with
// ML = fl(M L), so the sum is S = sum_c exp(x_c) / 2^ML and the loss ln 2 (ML + log2 S) -
// x[target] carries no error from rounding M L; the gradient exp(x - lse) is the ratio of two
// such terms, which cancels it too.
// kThr threads: 512 with two blocks per SM for rows up to half the shared memory, 1024 (one
// block) beyond.
template <class E, bool kGrad, int kThr>
__global__ void __launch_bounds__(kThr, kThr == kThr ? 2 : 1)
    ce_kernel_smem(float* __restrict__ losses, const E* in, E* out,
                   const std::int32_t* __restrict__ targets, int Vp, int V, float grad_scale,
                   int nsmem) {
  constexpr int kV = kVec<E>, kWarpsT = kThr / 32;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  extern __shared__ uint4 row_s[];
  __shared__ float red_max[kWarpsT], red_sum[kWarpsT];
  const long row = blockIdx.x;
  const int t = threadIdx.x;
  const int nvec = (V + kV - 1) / kV, nvec_all = Vp / kV, nfull = V / kV;
  const E* x = in + row * Vp;
  E* g = kGrad ? out + row * Vp : nullptr;
  const int tgt = targets[row];
  if (tgt < 0) {
    if constexpr (kGrad)
      for (int v = t; v < nvec_all; v += kThr) store16(g + v * kV, make_uint4(0, 0, 0, 0));
    if (t == 0) losses[row] = 0.f;
    return;
  }
  for (int v = t; v < nsmem; v += kThr) copy16_async(row_s + v, x + v * kV);
  const float xt = (t == 0 && tgt < V) ? to_float(x[tgt]) : CUDART_NAN_F;
  wait_async_copies();
  auto vec = [&](int v) { return v < nsmem ? row_s[v] : load16(x + v * kV); };

  float m = -CUDART_INF_F;
  for (int v = t; v < nvec; v += kThr) {
    float f[kV];
    unpack<E>(vec(v), f);
    if (v < nfull) {
#pragma unroll
      for (int k = 0; k < kV; ++k) m = fmaxf(m, f[k]);
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k)
        if (v * kV + k < V) m = fmaxf(m, f[k]);
    }
  }
  const float ML = block_max<kWarpsT>(m, red_max) * kLog2e;
  float s = 0.f;
  for (int v = t; v < nvec; v += kThr) {
    float f[kV];
    unpack<E>(vec(v), f);
    if (v < nfull) {
#pragma unroll
      for (int k = 0; k < kV; ++k) s += exp2_sfu(fmaf(f[k], kLog2e, -ML));
    } else {
#pragma unroll
      for (int k = 0; k < kV; ++k)
        if (v * kV + k < V) s += exp2_sfu(fmaf(f[k], kLog2e, -ML));
    }
  }
  const float S = block_sum<kWarpsT>(s, red_sum);
  if (t == 0) losses[row] = kLn2 * (ML + log2f(S)) - xt;
  if constexpr (kGrad) {
    const float scale = grad_scale / S;
    const int vt = tgt / kV;
    for (int v = t; v < nvec; v += kThr) {
      float f[kV], d[kV];
      unpack<E>(vec(v), f);
      if (v < nfull && v != vt) {
#pragma unroll
        for (int k = 0; k < kV; ++k) d[k] = exp2_sfu(fmaf(f[k], kLog2e, -ML)) * scale;
      } else {
#pragma unroll
        for (int k = 0; k < kV; ++k) {
          const int c = v * kV + k;
          d[k] = c < V ? exp2_sfu(fmaf(f[k], kLog2e, -ML)) * scale - (c == tgt ? grad_scale : 0.f)
                       : 0.f;
        }
      }
      store16(g + v * kV, pack<E>(d));
    }
    for (int v = nvec + t; v < nvec_all; v += kThr)
      store16(g + v * kV, make_uint4(0, 0, 0, 0));
  }
}

// The shared-memory form where it applies, unless MESHTRAIN_CE_KERNEL=regs (read once).
bool smem_form_requested() {
  static const bool on = [] {
    const char* e = std::getenv("MESHTRAIN_CE_KERNEL");
    return !(e && std::strcmp(e, "regs") == 0);
  }();
  return on;
}

// Raises a kernel's dynamic shared-memory limit to bytes on its first launch of that size (the
// attribute is per kernel, hence per instantiation; one size per vocabulary in practice).
template <class Kernel>
void allow_shared_bytes(Kernel kernel, std::size_t bytes, std::size_t& configured) {
  if (bytes <= configured) return;
  MESHTRAIN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  // All of the unified L1 as shared memory, or the second block does not fit.
  MESHTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            int(cudaSharedmemCarveoutMaxShared)));
  configured = bytes;
}

// The shared-memory form for a bf16 row of V columns: true when launched. Rows up to 113 KB
// run two 512-thread blocks per SM; longer ones one 1024-thread block with up to 226 KB staged.
template <class E, bool kGrad>
bool launch_smem(cudaStream_t st, float* losses, const E* in, E* out, const std::int32_t* targets,
                 int N, int Vp, int V, float grad_scale) {
  if constexpr (sizeof(E) != 2) {
    return false;
  } else {
    if (!smem_form_requested()) return false;
    const int nvec = (V + kVec<E> - 1) / kVec<E>;
    // The opt-in limit of one block (227 KB on Hopper) less the kernel's static reduction
    // arrays, and half of it for two blocks on an SM.
    constexpr std::size_t kOneBlock = 227 * 1024 - 1024, kTwoBlocks = kOneBlock / 2;
    const std::size_t bytes = std::size_t(nvec) * 16;
    if (bytes <= kTwoBlocks) {
      static std::size_t configured = 0;
      allow_shared_bytes(ce_kernel_smem<E, kGrad, kSmemThreads>, bytes, configured);
      ce_kernel_smem<E, kGrad, kSmemThreads><<<unsigned(N), kSmemThreads, bytes, st>>>(
          losses, in, out, targets, Vp, V, grad_scale, nvec);
    } else {
      const int nsmem = int(std::min<std::size_t>(bytes, kOneBlock) / 16);
      static std::size_t configured = 0;
      allow_shared_bytes(ce_kernel_smem<E, kGrad, kThreads>, std::size_t(nsmem) * 16, configured);
      ce_kernel_smem<E, kGrad, kThreads><<<unsigned(N), kThreads, std::size_t(nsmem) * 16, st>>>(
          losses, in, out, targets, Vp, V, grad_scale, nsmem);
    }
    MESHTRAIN_CUDA_CHECK(cudaGetLastError());
    return true;
  }
}

// Kernel tables indexed by NV = 0 (looping), 1, ..., kMaxRegVectors.
template <class E, bool kGrad, std::size_t... I>
auto ce_table(std::index_sequence<I...>) {
  return std::array{&ce_kernel<E, int(I), kGrad>...};
}

template <class E, bool kGrad>
void launch(cudaStream_t st, float* losses, const E* in, E* out, const std::int32_t* targets,
            int N, int Vp, int V, float grad_scale) {
  if (launch_smem<E, kGrad>(st, losses, in, out, targets, N, Vp, V, grad_scale)) return;
  static const auto kernels =
      ce_table<E, kGrad>(std::make_index_sequence<kMaxRegVectors + 1>());
  kernels[vectors_per_thread<E>(V)]<<<unsigned(N), kThreads, 0, st>>>(losses, in, out, targets, Vp,
                                                                      V, grad_scale);
  MESHTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <class T>
bool cross_entropy_forward_backward_cuda(const ExecSpace& exec, View1<float> losses,
                                         View1<T> logits, View1<const std::int32_t> targets,
                                         int N, int Vp, int V, float grad_scale) {
  using E = storage_t<T>;
  if (Vp % kVec<E> != 0 || !aligned16({logits.data()})) return false;
  const ToolRegion region(
      [] { return std::string("meshtrain::cross_entropy_forward_backward_cuda"); });
  if (N > 0)
    launch<E, true>(exec.cuda_stream(), losses.data(), raw(logits.data()), raw(logits.data()),
                    targets.data(), N, Vp, V, grad_scale);
  return true;
}

template <class T>
bool cross_entropy_forward_cuda(const ExecSpace& exec, View1<float> losses,
                                View1<const T> logits, View1<const std::int32_t> targets, int N,
                                int Vp, int V) {
  using E = storage_t<T>;
  if (Vp % kVec<E> != 0 || !aligned16({logits.data()})) return false;
  const ToolRegion region([] { return std::string("meshtrain::cross_entropy_forward_cuda"); });
  if (N > 0)
    launch<E, false>(exec.cuda_stream(), losses.data(), raw(logits.data()), nullptr,
                     targets.data(), N, Vp, V, 0.f);
  return true;
}

#define MESHTRAIN_INSTANTIATE_CROSS_ENTROPY_CUDA(T)                                          \
  template bool cross_entropy_forward_backward_cuda<T>(const ExecSpace&, View1<float>,       \
                                                       View1<T>, View1<const std::int32_t>,  \
                                                       int, int, int, float);                \
  template bool cross_entropy_forward_cuda<T>(const ExecSpace&, View1<float>, View1<const T>, \
                                              View1<const std::int32_t>, int, int, int);
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY_CUDA(float)
MESHTRAIN_INSTANTIATE_CROSS_ENTROPY_CUDA(Kokkos::Experimental::bhalf_t)
#undef MESHTRAIN_INSTANTIATE_CROSS_ENTROPY_CUDA

}  // namespace meshtrain::kernels::detail

#endif  // KOKKOS_ENABLE_CUDA
