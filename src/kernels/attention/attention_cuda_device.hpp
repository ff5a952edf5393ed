#pragma once
// Private to the CUDA attention kernels (attention_cuda_*.cpp): Ampere/Hopper PTX wrappers
// (cp.async, ldmatrix, mma.sync) and the shared-memory tile loader they all use.
//
// Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A 16x16 (row-major): a0 (row g, cols 2t, 2t+1), a1 (row g+8, same cols),
//                        a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9)
//   B 16x8  ("col"):     b0 (k rows 2t, 2t+1, col g), b1 (k rows 2t+8, 2t+9, col g)
//   C 16x8  (fp32):      c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, same cols)
// Two adjacent C tiles of a 16 x 16 block, rounded to bf16 pairs, are exactly an A fragment:
// that is how FlashAttention-2 feeds P (and dS) back into the next product from registers.
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "meshtrain/core/cuda_check.hpp"

namespace meshtrain::kernels::detail::cuda {

using bf16_t = __nv_bfloat16;

// log2(e): the bf16 kernels work in base 2 (exp2f is one MUFU.EX2 instruction).
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy global -> shared (bypassing L1). With valid == false nothing is read
// and the 16 bytes are zero-filled: rows past the sequence end become zero rows.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)),
               "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Copy rows [0, ROWS) x cols [0, D) of a row-major global matrix (row stride ld elements) into
// shared memory with row stride SD elements, zero-filling rows >= nvalid. One commit group is
// left to the caller. SD = D + 16 bytes of padding keeps ldmatrix and the fp32 float4 reads
// free of bank conflicts: consecutive rows start 4 banks apart.
template <class E, int ROWS, int D, int SD, int NTHREADS>
__device__ __forceinline__ void load_tile_async(E* s, const E* g, long ld, int nvalid) {
  constexpr int kVec = 16 / int(sizeof(E));
  constexpr int kPerRow = D / kVec, kChunks = ROWS * kPerRow;
  static_assert(D % kVec == 0 && (SD * sizeof(E)) % 16 == 0, "rows must be 16-byte chunks");
#pragma unroll
  for (int it = 0; it < (kChunks + NTHREADS - 1) / NTHREADS; ++it) {
    const int c = it * NTHREADS + int(threadIdx.x);
    if (kChunks % NTHREADS != 0 && c >= kChunks) break;
    const int r = c / kPerRow, col = (c % kPerRow) * kVec;
    const bool ok = r < nvalid;
    cp_async16(s + r * SD + col, ok ? g + r * ld + col : g, ok);
  }
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i returns
// this lane's pair of it (row lane/4, cols 2(lane%4), +1). .trans returns the transpose.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += a b: bf16 inputs, fp32 accumulation (one HMMA.16816.F32.BF16 on sm_80+).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> a bf16x2 register, lo in the low half (the lower column index), round to
// nearest even.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// The A fragment of a 16 x 16 block held as two C tiles (cols 0-7 and 8-15), rounded to bf16.
__device__ __forceinline__ void c_to_a(unsigned (&a)[4], const float (&lo)[4],
                                       const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

// Address of this lane's row for an ldmatrix_x4 of the 16 x 16 A block at (r0, c0) of a
// row-major smem tile with stride SD: matrices (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in a0..a3
// order.
template <int SD>
__device__ __forceinline__ const bf16_t* a_addr(const bf16_t* s, int r0, int c0, int lane) {
  return s + (r0 + (lane & 15)) * SD + c0 + (lane >> 4) * 8;
}
// ldmatrix_x4 (no .trans) of a [n][k] tile: B fragments of two n8 tiles (n0, n0 + 8) for the
// k16 step at k0; registers {0, 1} belong to n-tile n0, {2, 3} to n0 + 8.
template <int SD>
__device__ __forceinline__ const bf16_t* bn_addr(const bf16_t* s, int n0, int k0, int lane) {
  return s + (n0 + (lane & 7) + (lane >> 4) * 8) * SD + k0 + ((lane >> 3) & 1) * 8;
}
// ldmatrix_x4_trans of a [k][n] tile: same register assignment as bn_addr.
template <int SD>
__device__ __forceinline__ const bf16_t* bk_addr(const bf16_t* s, int k0, int n0, int lane) {
  return s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * SD + n0 + (lane >> 4) * 8;
}

// Max and sum over the four lanes of a quad (the lanes that share a row of a C tile).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Where the backward keeps D_i = dO_i . O_i (fp32) between its pre-pass and the dq kernel: the
// first 4 bytes of row i's dq slot for head h in dqkv (columns h*HS.. of the q part). dqkv is
// overwritten anyway, the dkdv kernel writes only the k and v parts, and the one writer of those
// bytes is the dq block that owns row i of head h, which reads its D before it stores dq. So no
// scratch buffer: no cudaMalloc/cudaFree (a device synchronisation) per call. Returns row 0's
// slot; row i's is i * ld * sizeof(E) / 4 floats further.
template <class E>
__device__ __forceinline__ float* d_slot(E* dqkv, int b, int h, int T, long ld, int D) {
  return reinterpret_cast<float*>(dqkv + long(b) * T * ld + long(h) * D);
}

// Opt in to more than the default 48 KiB of dynamic shared memory (per kernel, idempotent).
template <class Kernel>
inline void set_smem(Kernel* kernel, int bytes) {
  MESHTRAIN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

}  // namespace meshtrain::kernels::detail::cuda

#endif  // KOKKOS_ENABLE_CUDA
