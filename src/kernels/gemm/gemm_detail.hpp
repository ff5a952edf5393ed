#pragma once
// Private to src/kernels/: what the GEMM files (gemm.cpp, gemm_ex.cpp, gemm_lt.cpp) share.
#include "meshtrain/kernels/gemm/gemm.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cublas_api.h>

#include "meshtrain/core/cuda_check.hpp"

#define MESHTRAIN_CUBLAS_CHECK(call)                                                        \
  do {                                                                                      \
    cublasStatus_t mt_cublas_rc_ = (call);                                                  \
    if (mt_cublas_rc_ != CUBLAS_STATUS_SUCCESS)                                             \
      ::meshtrain::throw_call_error("cuBLAS", #call, cublasGetStatusString(mt_cublas_rc_),  \
                                    __FILE__, __LINE__);                                    \
  } while (0)
#endif

namespace meshtrain::kernels::detail {

// Throws unless the row-major GEMM's dimensions, row strides and pointers are consistent
// (C stands for the output). `fn` names the caller in the message.
void check_gemm(const char* fn, Trans ta, Trans tb, int M, int N, int K, const void* A, int lda,
                const void* B, int ldb, const void* C, int ldc);

}  // namespace meshtrain::kernels::detail
