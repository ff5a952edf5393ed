# Tests of the parallel layer.
meshtrain_add_test(NAME test_schedule SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_schedule.cpp)
meshtrain_add_test(NAME test_partition SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_partition.cpp)
meshtrain_add_test(NAME test_pipeline_runner
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_pipeline_runner.cpp RANKS 1 2 4 8)
# Data parallelism and ZeRO.
meshtrain_add_test(NAME test_zero_partition SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_partition.cpp)
# Which rank writes which range (checkpoints, export, the whole-model gather).
meshtrain_add_test(NAME test_ownership SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_ownership.cpp)
meshtrain_add_test(NAME test_loss_holder SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_loss_holder.cpp)
# The step's data and the forward-only schedule of evaluation.
meshtrain_add_test(NAME test_step_batch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_step_batch.cpp)
meshtrain_add_test(NAME test_grad_sync SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grad_sync.cpp RANKS 1 2 4)
meshtrain_add_test(NAME test_zero_optimizer
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_optimizer.cpp RANKS 1 2 4)
meshtrain_add_test(NAME test_zero_memory SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_zero_memory.cpp RANKS 1 2 4 8)
meshtrain_add_test(NAME test_dp_training SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp_training.cpp RANKS 1 2 4 8)
meshtrain_add_test(NAME test_dp_pipeline SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp_pipeline.cpp RANKS 2 4 8)
# The pure policies of the runtime, by simulation.
meshtrain_add_test(NAME test_dp_policy SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dp_policy.cpp)
meshtrain_add_test(NAME test_message_flow SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_message_flow.cpp)
meshtrain_add_test(NAME test_message_flow_streams
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_message_flow_streams.cpp)
