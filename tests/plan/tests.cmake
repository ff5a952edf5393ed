# Tests of the plan layer: memory and cost models against real runs, search, calibration.
meshtrain_add_test(NAME test_plan_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_memory.cpp
  RANKS 1 2 4 8 TIMEOUT 600)
meshtrain_add_test(NAME test_plan_model SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_model.cpp)
target_compile_definitions(test_plan_model PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
meshtrain_add_test(NAME test_plan_moe SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_moe.cpp
  RANKS 8 TIMEOUT 600)
meshtrain_add_test(NAME test_plan_fp8 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_plan_fp8.cpp)
target_compile_definitions(test_plan_fp8 PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
