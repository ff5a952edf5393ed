# Tests of the model layer.
meshtrain_add_test(NAME test_gpt_parity SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_parity.cpp)
target_compile_definitions(test_gpt_parity PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
if(MESHTRAIN_ENABLE_CUDA)  # bf16 needs Kokkos 4 (the CUDA build)
  meshtrain_add_test(NAME test_gpt_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_bf16.cpp)
  target_compile_definitions(test_gpt_bf16 PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  meshtrain_add_test(NAME test_moe_bf16 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_bf16.cpp)
endif()
meshtrain_add_test(NAME test_registry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_registry.cpp)
meshtrain_add_test(NAME test_tensor_parallel
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tensor_parallel.cpp RANKS 1 2 3 4)
meshtrain_add_test(NAME test_hook_order SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hook_order.cpp)
meshtrain_add_test(NAME test_llama_parity SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_llama_parity.cpp)
target_compile_definitions(test_llama_parity PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
meshtrain_add_test(NAME test_qkv_bias SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_qkv_bias.cpp)
target_compile_definitions(test_qkv_bias PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
meshtrain_add_test(NAME test_moe_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_moe_model.cpp)
meshtrain_add_test(NAME test_recompute_mlp_act
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_recompute_mlp_act.cpp)
meshtrain_add_test(NAME test_ring_attention
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ring_attention.cpp RANKS 1 2 3 4)
target_include_directories(test_ring_attention PRIVATE ${PROJECT_SOURCE_DIR}/tests/kernels)
# Issue 35: FP8 amaxes agreed over the group that splits a tensor.
meshtrain_add_test(NAME test_fp8_amax SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_amax.cpp RANKS 1 2)
target_include_directories(test_fp8_amax PRIVATE ${PROJECT_SOURCE_DIR}/tests/kernels)
# Issue 35: the FP8 recipe's tp agreement on one column- or row-parallel linear.
meshtrain_add_test(NAME test_fp8_linears SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_linears.cpp
  RANKS 1 2 4)
target_include_directories(test_fp8_linears PRIVATE ${PROJECT_SOURCE_DIR}/tests/kernels)
# Issue 35: FP8 blocks keep their linears' inputs as transposed FP8 casts.
meshtrain_add_test(NAME test_fp8_kept_inputs
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_fp8_kept_inputs.cpp)
