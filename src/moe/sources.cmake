# Sources of the MoE building blocks (issue 20 phase 1; docs/moe.md): router, permutation,
# grouped expert GEMM and the expert-parallel layer. They use kernels, comm and core only.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/router.cpp
  ${CMAKE_CURRENT_LIST_DIR}/router_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/permute.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grouped_gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/moe_layer.cpp
)
