# Sources of the parallel layer: data parallelism and ZeRO (zero_*, grad_*, dp_*).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/zero_partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_memory.cpp
)
