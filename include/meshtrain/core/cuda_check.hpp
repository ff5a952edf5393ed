#pragma once
// MESHTRAIN_CUDA_CHECK(cudaMemcpyAsync(...)) and MESHTRAIN_NCCL_CHECK(ncclAllReduce(...)):
// throw meshtrain::Error naming the call, the library's error string, file:line and rank.
#include "meshtrain/core/error.hpp"

#if defined(KOKKOS_ENABLE_CUDA) || defined(__CUDACC__) || defined(MESHTRAIN_HAVE_CUDA)
#include <cuda_runtime.h>
#define MESHTRAIN_CUDA_CHECK(call)                                                         \
  do {                                                                                     \
    cudaError_t mt_cuda_rc_ = (call);                                                      \
    if (mt_cuda_rc_ != cudaSuccess)                                                        \
      ::meshtrain::throw_call_error("CUDA", #call, cudaGetErrorString(mt_cuda_rc_), __FILE__, \
                                    __LINE__);                                             \
  } while (0)
#endif

#if defined(MESHTRAIN_HAVE_NCCL)
#include <nccl.h>
#define MESHTRAIN_NCCL_CHECK(call)                                                        \
  do {                                                                                    \
    ncclResult_t mt_nccl_rc_ = (call);                                                    \
    if (mt_nccl_rc_ != ncclSuccess)                                                       \
      ::meshtrain::throw_call_error("NCCL", #call, ncclGetErrorString(mt_nccl_rc_), __FILE__, \
                                    __LINE__);                                            \
  } while (0)
#endif
