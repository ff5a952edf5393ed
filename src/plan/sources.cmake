# Sources of the plan layer: memory model, cost model, calibration, layout search.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/memory.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pools.cpp
  ${CMAKE_CURRENT_LIST_DIR}/calibration.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cost.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_casts.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/search.cpp
  ${CMAKE_CURRENT_LIST_DIR}/report.cpp
)
