# Sources of the train layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_guard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/divergence.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_writer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generate.cpp
)
