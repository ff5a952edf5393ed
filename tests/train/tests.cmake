# Tests of the train layer.
meshtrain_add_test(NAME test_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trainer.cpp)
meshtrain_add_test(NAME test_layouts SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_layouts.cpp
  RANKS 1 2 4 8 TIMEOUT 600)
meshtrain_add_test(NAME test_resume SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_resume.cpp
  RANKS 8 TIMEOUT 600)
meshtrain_add_test(NAME test_blend_train SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_blend_train.cpp
  RANKS 1 2 4)
meshtrain_add_test(NAME test_divergence SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_divergence.cpp)
meshtrain_add_test(NAME test_hf_import SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_import.cpp
  RANKS 1 2 4)
target_compile_definitions(test_hf_import PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
meshtrain_add_test(NAME test_hf_export SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_export.cpp
  RANKS 1 2 4)
meshtrain_add_test(NAME test_moe_layouts SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_layouts.cpp
  RANKS 1 2 4 8 TIMEOUT 600)
meshtrain_add_test(NAME test_moe_resume SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_resume.cpp
  RANKS 2 8 TIMEOUT 600)  # 2: the bf16 case's small layouts (CUDA build)
meshtrain_add_test(NAME test_hf_mixtral SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_mixtral.cpp
  RANKS 1 2 4)
meshtrain_add_test(NAME test_cp_layouts SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cp_layouts.cpp
  RANKS 2 4 8 TIMEOUT 600)
# Issue 37: the profiler ranges (what NVTX shows) through a recording sink, at pp 2 and dp 2.
meshtrain_add_test(NAME test_profile_ranges SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_profile_ranges.cpp
  RANKS 2)
# Asynchronous checkpoints (issue 36): the background writer needs MPI_THREAD_MULTIPLE.
meshtrain_add_test(NAME test_ckpt_async SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ckpt_async.cpp
  RANKS 2)
if(TEST test_ckpt_async_np2)
  set_property(TEST test_ckpt_async_np2 APPEND PROPERTY ENVIRONMENT
    MESHTRAIN_MPI_THREAD_LEVEL=multiple)
endif()
# Issue 35: train.precision=fp8 against fp32 (1 rank) and its layouts against one rank (2, 4).
meshtrain_add_test(NAME test_fp8_layouts SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_layouts.cpp
  RANKS 1 2 4 TIMEOUT 600)
# Issue 35: the MLP backward's fused amaxes of the FP8 output-gradient casts, against unfused.
meshtrain_add_test(NAME test_fp8_fused_grad_amax
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_fused_grad_amax.cpp RANKS 1 2 4)
target_include_directories(test_fp8_fused_grad_amax PRIVATE ${PROJECT_SOURCE_DIR}/tests/kernels)
# First-write gradients: skipping the zeroing of gradients that their first GEMM overwrites
# changes no bit (1 rank: precisions and options; 2 and 4: dp, tp, sp, pp, cp layouts).
meshtrain_add_test(NAME test_grad_first_write
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grad_first_write.cpp RANKS 1 2 4 TIMEOUT 600)
