# Sources of the parallel layer: pipeline schedules and runner; data parallelism and ZeRO
# (zero_*, grad_sync).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_transfer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_memory.cpp
)
