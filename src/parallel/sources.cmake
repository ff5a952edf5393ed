# Sources of the parallel layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
)
