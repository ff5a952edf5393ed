#pragma once
// Private to src/kernels/, CUDA builds only: the FP8 GEMM of kernels/gemm/gemm_fp8.hpp as one
// cuBLASLt FP8 matmul (gemm_lt_fp8.cpp), for the K-contiguous "TN" form Hopper's FP8 tensor
// cores take: row-major D[M, N] = alpha * sa(m) * sb(n) * A[M, K] . B[N, K]^T + beta * C.
#include <cublasLt.h>

#include "gemm_detail.hpp"

namespace meshtrain::kernels::detail {

struct LtFp8Call {
  cudaDataType_t a_type, b_type;  // CUDA_R_8F_E4M3 or CUDA_R_8F_E5M2 (not both E5M2)
  cudaDataType_t out_type;        // C's and D's: CUDA_R_32F or CUDA_R_16BF
  bool rowwise;                   // a_scale has M entries and b_scale N; else one each
  int M, N, K;
  float alpha;
  const void* A;  // [M, K] codes, row stride lda
  int lda;
  const float* a_scale;  // device: A's scale_inv
  const void* B;  // [N, K] codes, row stride ldb
  int ldb;
  const float* b_scale;  // device: B's scale_inv
  float beta;
  const void* C;  // ignored when beta == 0
  int ldc;
  void* D;
  int ldd;
  // M changes from call to call (an expert's rows): one plan per size bucket of M
  // (gemm_size_bucket), the heuristic's algorithm for its upper end, untimed.
  bool vary_m = false;
};

// Enqueues the call on exec's stream as one cublasLtMatmul and returns true; or returns false,
// enqueueing nothing, where the documented FP8 restrictions exclude it or cuBLASLt has no
// algorithm (*why then says which): the caller runs the emulation. Host-side only, no
// synchronisation.
bool lt_matmul_fp8(const Kokkos::Cuda& exec, const LtFp8Call& call, const char** why);

}  // namespace meshtrain::kernels::detail
