#pragma once
// GEMM dispatch: row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C.
// Checks extents, then goes to CBLAS (host memory) or cuBLAS(Lt) (CUDA memory). `gemm_reference`
// is a plain Kokkos kernel with the same contract: the test oracle, and the fallback for types
// the vendor BLAS does not take.
//
// `gemm_ex` adds a fused epilogue (bias, GELU keeping its input, GELU gradient) and a separate
// output D; `gemm_dbias` fuses the bias gradient into a weight-gradient GEMM. On CUDA both run
// as one cuBLASLt matmul where cuBLASLt supports the case, else as the GEMM plus one Kokkos
// epilogue kernel (the path every host build takes); `gemm_ex_reference` is their oracle.
#include <cstdint>

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

// What gemm_ex applies to x = alpha op(A) op(B) + beta C (all in fp32, or double for double):
//   none:      D = x
//   bias:      D = x + bias
//   gelu_bias: aux = x + bias, D = gelu(aux)       (tanh GELU, as gelu.hpp; bias may be null)
//   dgelu:     D = x * gelu'(aux)                  (aux read; beta must be 0)
enum class Epilogue { none, bias, gelu_bias, dgelu };

template <class T>
struct GemmEpilogue {
  Epilogue kind = Epilogue::none;
  const T* bias = nullptr;  // [N], added to every row (bias, gelu_bias)
  T* aux = nullptr;         // [M, N] with row stride ldaux: written by gelu_bias, read by dgelu
  int ldaux = 0;
  // dgelu only, optional: dbias[n] += sum_i D[i][n], the bias gradient of the layer whose
  // output's gradient D is (the MLP's first layer), fused into this GEMM on CUDA.
  T* dbias = nullptr;
};

// D[M,N] = epilogue(alpha op(A) op(B) + beta C), row-major, lda..ldd as for gemm. C is not read
// when beta == 0 (it may then be null). C is either D itself (C == D, ldc == ldd) or does not
// overlap D; aux never overlaps D.
template <class T>
void gemm_ex(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
             const T* A, int lda, const T* B, int ldb, float beta, const T* C, int ldc, T* D,
             int ldd, const GemmEpilogue<T>& ep);

// The same contract as one plain Kokkos kernel (K-loop per element, epilogue in registers).
template <class T>
void gemm_ex_reference(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const T* A, int lda, const T* B, int ldb, float beta,
                       const T* C, int ldc, T* D, int ldd, const GemmEpilogue<T>& ep);

// A weight-gradient GEMM with the bias gradient fused in:
//   C[M,N] = alpha op(A)[M,K] B[K,N] + beta C   (B not transposed: its rows are the K dimension)
//   dbias[N] += sum over the K rows of B       (column sums; not scaled by alpha)
// dbias accumulates (micro-batches add into it). For a linear layer: A = inp (ta = T),
// B = dout, C = dweight, K = tokens.
// dbias[n] += sum over the K rows of B[k * ldb + n] (n < N): a bias gradient on its own (the
// column sums of gemm_dbias, deterministic on every backend).
template <class T>
void column_sums_add(const ExecSpace& exec, int K, int N, const T* B, int ldb, T* dbias);

template <class T>
void gemm_dbias(const ExecSpace& exec, Trans ta, int M, int N, int K, float alpha, const T* A,
                int lda, const T* B, int ldb, float beta, T* C, int ldc, T* dbias);

// gemm_dbias on CUDA has two forms: the bias-gradient epilogue fused into the GEMM, or a plain
// GEMM and a separate column sum. By default the first call of each shape times both and keeps
// the faster (`timed`); tests force one to check both.
enum class DbiasForm { timed, epilogue, split };
void set_gemm_dbias_form(DbiasForm form);

// How gemm_ex / gemm_dbias calls were served since the start of the process, per kind
// (index: Epilogue as int, then 4 for gemm_dbias): by one fused cuBLASLt matmul or by the
// GEMM + Kokkos epilogue fallback. Host builds only fall back. For tests and profiling notes.
struct GemmExCounts {
  std::uint64_t fused[5] = {};
  std::uint64_t fallback[5] = {};
};
GemmExCounts gemm_ex_counts();

}  // namespace meshtrain::kernels
