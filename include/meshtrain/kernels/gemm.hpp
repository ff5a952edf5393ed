#pragma once
// GEMM dispatch: row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// Checks extents, then goes to CBLAS (host memory) or cuBLAS(Lt) (CUDA memory). `gemm_reference`
// is a plain Kokkos kernel with the same contract: the test oracle, and the fallback for types
// the vendor BLAS does not take.
#include "meshtrain/core/view.hpp"

namespace meshtrain::kernels {

enum class Trans { N, T };

// lda/ldb/ldc are row strides (elements between consecutive rows) of A, B, C as stored.
// Stored A is M x K when ta == N and K x M when ta == T (likewise for B).
template <class T>
void gemm(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
          const T* A, int lda, const T* B, int ldb, float beta, T* C, int ldc);

template <class T>
void gemm_reference(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
                    const T* A, int lda, const T* B, int ldb, float beta, T* C, int ldc);

}  // namespace meshtrain::kernels
