# Sources of the model layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/config.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_amax.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_recipe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_fp8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_first_write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_parameters.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_dispatch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_head.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_parallel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt2_block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tp_region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/llama_block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/moe_block.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gpt_footprint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hook_order.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_attention.cpp
)
