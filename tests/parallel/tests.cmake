# Tests of the parallel layer.
meshtrain_add_test(NAME test_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_schedule.cpp)
meshtrain_add_test(NAME test_partition SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_partition.cpp)
meshtrain_add_test(NAME test_pipeline_runner
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_runner.cpp RANKS 1 2 4 8)
