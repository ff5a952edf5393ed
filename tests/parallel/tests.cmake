# Tests of the parallel layer (data parallelism and ZeRO).
meshtrain_add_test(NAME test_zero_partition SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_partition.cpp)
meshtrain_add_test(NAME test_grad_sync SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grad_sync.cpp RANKS 1 2 4)
meshtrain_add_test(NAME test_zero_optimizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_optimizer.cpp RANKS 1 2 4)
meshtrain_add_test(NAME test_zero_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_memory.cpp RANKS 1 2 4 8)
meshtrain_add_test(NAME test_dp_training SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp_training.cpp RANKS 1 2 4 8)
