# Sources of the plan layer: memory model, cost model, calibration, layout search.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pools.cpp
)
