#pragma once
// The FP8 GEMM's contract, and its emulation in fp32: what Hopper's cuBLASLt FP8 matmul (FP8
// operands, fp32 accumulation, scale pointers) computes, row-major,
//
//   C[m,n] = alpha * sa(m) * sb(n) * sum_k qa(m,k) qb(k,n)  +  beta * C[m,n],
//
// where qa / qb are the decoded FP8 codes of op(A) / op(B) (exact in fp32, as are their
// products) and sa / sb the operands' scale_inv: one value each tensorwise; rowwise one per row
// of op(A) and one per column of op(B) (cuBLASLt's outer-vector scaling). gemm_fp8_emulated
// decodes both operands to fp32, runs the gemm dispatch (kernels/gemm/gemm.hpp) with fp32
// accumulation and applies the scales and beta in one epilogue kernel: the oracle a CUDA FP8
// GEMM must match within fp32 summation-order rounding, and the FP8 path of host builds.
//
// Operands as stored: A.data is the row-major [A.rows, A.cols] tensor (or its transpose when
// A.transposed), read as op(A) [M, K] through ta, as gemm reads a stored matrix; likewise B.
// Rowwise scales follow source rows, so a rowwise A needs ta == N (A is [M, K]) and a rowwise B
// needs tb == T (B is [N, K]): the K-contiguous "TN" form of Hopper's FP8 tensor cores, the
// forward linear y = x W^T. Temporaries are allocated per call (an emulation, not a hot path).
#include "meshtrain/kernels/fp8_cast.hpp"
#include "meshtrain/kernels/gemm/gemm.hpp"

namespace meshtrain::kernels {

// The FP8 GEMM the model calls: cuBLASLt's FP8 matmul on CUDA builds where it has an algorithm
// for the call, gemm_fp8_emulated otherwise (host builds, and the shapes or layouts cuBLASLt
// refuses). Same arguments and contract as gemm_fp8_emulated.
//
// cuBLASLt serves (CUDA builds, T = float or bf16): the TN form, ta = N and tb = T, so that both
// stored matrices are K-contiguous ([M, K] and [N, K]; a transposed cast stored that way counts:
// what matters is the stored layout); formats E4M3 x E4M3, E4M3 x E5M2, E5M2 x E4M3; both
// operands tensorwise, or both rowwise (outer-vector scaling, Hopper); K, the stored row
// strides (= K) and ldc * sizeof(T) multiples of 16 bytes, every pointer 16-byte aligned. The
// rest, and what cuBLASLt finds no algorithm for, is emulated. Results agree with the emulation
// to fp32 summation-order rounding of the tensor cores' accumulation (not bit for bit).
template <class T>
void gemm_fp8(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
              const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C, int ldc);
// The same with D (row stride ldd) written and C only read: D = alpha op(A) op(B) + beta C
// (C and D may be the same). A residual stream as C: one rounding to T, no pass of its own.
template <class T>
void gemm_fp8(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K, float alpha,
              const Fp8Tensor& A, const Fp8Tensor& B, float beta, const T* C, int ldc, T* D,
              int ldd);

// gemm_fp8 for an M that changes from call to call (an expert's rows: a MoE's FP8 experts).
// On CUDA, one cuBLASLt plan per size bucket of M (gemm_size_bucket, gemm_varying.hpp), the
// heuristic's algorithm for the bucket's upper end, untimed, as gemm_varying chooses for the
// 16-bit GEMMs: gemm_fp8 makes and times a plan for every new shape, which rows that change
// every step would pay on every call. Same arguments, contract and paths as gemm_fp8.
template <class T>
void gemm_fp8_varying(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                      float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta,
                      const T* C, int ldc, T* D, int ldd);

// How many gemm_fp8 (and gemm_fp8_varying) calls of this process cuBLASLt's FP8 matmul ran
// (always 0 on host builds): tests read it before and after a call to know which path served it.
int gemm_fp8_cublaslt_calls();

template <class T>
void gemm_fp8_emulated(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta, T* C,
                       int ldc);
template <class T>
void gemm_fp8_emulated(const ExecSpace& exec, Trans ta, Trans tb, int M, int N, int K,
                       float alpha, const Fp8Tensor& A, const Fp8Tensor& B, float beta,
                       const T* C, int ldc, T* D, int ldd);

}  // namespace meshtrain::kernels
