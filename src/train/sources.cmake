# Sources of the train layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generate.cpp
)
