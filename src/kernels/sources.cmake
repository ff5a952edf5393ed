# Sources of the kernels layer (owned by that layer; keeps merges of parallel work apart).
# attention/: every attention path (portable flash kernels, host blocking, CUDA FlashAttention-2,
# cuDNN) and the blocks ring attention merges; gemm/: the GEMM dispatch (CBLAS, cuBLAS, cuBLASLt
# epilogues and their column sums, varying shapes, FP8 emulation). One op per file elsewhere.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention/attention_block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention/attention_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention/attention_options.cpp
  ${CMAKE_CURRENT_LIST_DIR}/common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cross_entropy_vp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/embedding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_ex.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_fp8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_varying.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layernorm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear_fp8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/residual.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rmsnorm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/rotary.cpp
  ${CMAKE_CURRENT_LIST_DIR}/swiglu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/workspace.cpp
)
# CUDA flash-attention, LayerNorm, RMSNorm, cross-entropy and FP8 cast kernels, the embedding
# backward's key sort and the cuBLASLt GEMM path: plain .cpp compiled by nvcc_wrapper (the project enables no CUDA language); each
# file is empty unless KOKKOS_ENABLE_CUDA.
if(MESHTRAIN_ENABLE_CUDA)
  target_sources(meshtrain_lib PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_lt.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_lt_fp8.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gemm/column_sums_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_cuda_bf16.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_cuda_f32.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cross_entropy_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/fp8_cast_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/layernorm_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/rmsnorm_cuda.cpp
    ${CMAKE_CURRENT_LIST_DIR}/sort_keys_cuda.cpp
  )
endif()
# cuDNN fused attention (empty unless MESHTRAIN_HAVE_CUDNN and KOKKOS_ENABLE_CUDA).
if(MESHTRAIN_ENABLE_CUDNN)
  target_sources(meshtrain_lib PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_block_cudnn.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_cudnn.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/cudnn_backend.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/cudnn_graph.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/cudnn_sdpa.cpp
  )
endif()
# The kernels never read errno. Without -fno-math-errno GCC must treat every exp/sqrt call as a
# write to errno, which keeps it from inlining sqrt and from scheduling the loops around libm
# calls; glibc's expf then costs ~4x more per element (PyTorch builds with this flag too).
# Results are unchanged: the flag only drops the errno side effect. Host compilers only.
if(NOT MESHTRAIN_ENABLE_CUDA AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set_property(SOURCE
    ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention.cpp
    ${CMAKE_CURRENT_LIST_DIR}/attention/attention_host.cpp
    ${CMAKE_CURRENT_LIST_DIR}/common.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_ex.cpp
    ${CMAKE_CURRENT_LIST_DIR}/layernorm.cpp
    ${CMAKE_CURRENT_LIST_DIR}/rmsnorm.cpp
    ${CMAKE_CURRENT_LIST_DIR}/swiglu.cpp
    APPEND PROPERTY COMPILE_OPTIONS -fno-math-errno)
  # The host loops of GELU and cross-entropy clamp and select with comparisons; -ftrapping-math
  # (the default) forbids evaluating them speculatively, which is what vectorising them needs.
  # Nothing here enables floating-point traps.
  set_property(SOURCE
    ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gemm/gemm_ex.cpp
    APPEND PROPERTY COMPILE_OPTIONS -fno-trapping-math)
endif()
