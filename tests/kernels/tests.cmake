# Tests of the kernels layer: meshtrain_add_test(...) lines.
meshtrain_add_test(NAME test_kernels_gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemm.cpp)
meshtrain_add_test(NAME test_kernels_layernorm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_layernorm.cpp)
meshtrain_add_test(NAME test_kernels_pointwise SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pointwise.cpp)
meshtrain_add_test(NAME test_kernels_embedding SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_embedding.cpp)
meshtrain_add_test(NAME test_kernels_attention SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_attention.cpp)
meshtrain_add_test(NAME test_kernels_cross_entropy SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cross_entropy.cpp)
meshtrain_add_test(NAME test_kernels_adamw SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_adamw.cpp)
meshtrain_add_test(NAME test_kernels_gemm_epilogue SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemm_epilogue.cpp)
meshtrain_add_test(NAME test_kernels_rmsnorm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rmsnorm.cpp)
meshtrain_add_test(NAME test_kernels_rotary SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rotary.cpp)
meshtrain_add_test(NAME test_kernels_swiglu SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_swiglu.cpp)
# The rotary table against the fp32 frequencies and angles of tests/fixtures/llama_tiny_v1.
target_compile_definitions(test_kernels_rotary PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
meshtrain_add_test(NAME test_kernels_attention_gqa SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_attention_gqa.cpp)
# cuDNN's fused attention against our kernels and fp32: CUDA builds with cuDNN (the GPU set).
if(MESHTRAIN_ENABLE_CUDNN)
  meshtrain_add_test(NAME test_kernels_attention_cudnn SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_attention_cudnn.cpp)
endif()
# Issue 35: FP8 formats, current-scaling casts and the emulated FP8 GEMM (the CUDA FP8 GEMM's oracle).
meshtrain_add_test(NAME test_kernels_fp8_format SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_format.cpp)
meshtrain_add_test(NAME test_kernels_fp8_cast SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_cast.cpp)
meshtrain_add_test(NAME test_kernels_gemm_fp8 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gemm_fp8.cpp)
meshtrain_add_test(NAME test_kernels_linear_fp8 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_linear_fp8.cpp)
meshtrain_add_test(NAME test_kernels_linear_fp8_fused
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_linear_fp8_fused.cpp)
