# Sources of the kernels layer (owned by that layer; keeps merges of parallel work apart).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_host.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cross_entropy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/embedding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layernorm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear.cpp
  ${CMAKE_CURRENT_LIST_DIR}/residual.cpp
)
