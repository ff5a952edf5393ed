# Tests of the parallel layer (data parallelism and ZeRO).
meshtrain_add_test(NAME test_zero_partition SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_partition.cpp)
