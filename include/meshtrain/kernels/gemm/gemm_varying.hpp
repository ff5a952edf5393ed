#pragma once
// A GEMM whose M or K changes from call to call at fixed operand layouts: the
// experts of an MoE layer, whose row counts follow the router and differ every
// step (moe/grouped_gemm.cpp).
//
// Why it is not kernels::gemm: cuBLAS chooses an algorithm for each new shape,
// and that costs ~0.1-0.2 ms of host time per call (measured on an H200,
// perf/bench/bench_expert_gemm_cublas.cu: 12 layers x 8 experts x 6 GEMMs with new
// row counts every step take 96 ms through cublasGemmEx, 10 ms when the counts
// repeat). Here, on CUDA, the varying dimension is rounded up to a size bucket
// (64, then four per octave: p, 1.25p, 1.5p, 1.75p), cuBLASLt's heuristic is
// asked once per bucket, and its algorithm runs every call of the bucket at the
// exact shape (layouts built on the stack, no allocation). A bucket cuBLASLt
// refuses falls back to kernels::gemm. Host builds and double go to
// kernels::gemm unchanged. Same contract as gemm.
#include "meshtrain/core/view.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"

namespace meshtrain::kernels {

enum class VaryingDim { M, K };

template <class T>
void gemm_varying(const ExecSpace& exec, VaryingDim varying, Trans ta, Trans tb, int M, int N,
                  int K, float alpha, const T* A, int lda, const T* B, int ldb, float beta, T* C,
                  int ldc);

// Calls served since the start of the process by a bucket's cuBLASLt algorithm
// (`bucketed`) and by kernels::gemm (`plain`: host builds, double, refused
// buckets). For tests.
struct GemmVaryingCounts {
  std::uint64_t bucketed = 0, plain = 0;
};
GemmVaryingCounts gemm_varying_counts();

// The bucket a varying size falls in (exposed for the tests): the smallest of
// 64 and p, 1.25p, 1.5p, 1.75p, 2p (p the largest power of two <= v) that is >=
// v.
int gemm_size_bucket(int v);

}  // namespace meshtrain::kernels
