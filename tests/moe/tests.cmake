# Tests of the MoE building blocks.
meshtrain_add_test(NAME test_moe_router SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_router.cpp
  RANKS 1 2 4)
meshtrain_add_test(NAME test_moe_permute SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_permute.cpp)
meshtrain_add_test(NAME test_moe_grouped_gemm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grouped_gemm.cpp)
meshtrain_add_test(NAME test_moe_layer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_layer.cpp
  RANKS 1 2 4)
# Issue 35: the experts' FP8 GEMMs (rowwise per token) against a host reference.
meshtrain_add_test(NAME test_moe_grouped_gemm_fp8
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grouped_gemm_fp8.cpp)
