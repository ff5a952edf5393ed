# Sources of the parallel layer: pipeline schedules and runner; data parallelism and ZeRO
# (dp_policy: the pure rules; grad_reducer, param_gatherer, tied_embedding, zero_shards: their
# effects; grad_sync: the model's hooks).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/engine_moe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/model_transfer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/message_flow.cpp
  ${CMAKE_CURRENT_LIST_DIR}/receive_posting.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_runner.cpp
  ${CMAKE_CURRENT_LIST_DIR}/step_batch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_partition.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ownership.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loss_holder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dp_policy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_shards.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_reducer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/param_gatherer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tied_embedding.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_optimizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/zero_memory.cpp
)
