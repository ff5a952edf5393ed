# Sources of the train layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/trainer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_async.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_guard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trainer_data.cpp
  ${CMAKE_CURRENT_LIST_DIR}/divergence.cpp
  ${CMAKE_CURRENT_LIST_DIR}/metrics_writer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/generate.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensorboard.cpp
)
# TensorBoard's Event records, encoded by Debian's protobuf (the lite runtime suffices).
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/generated)
protobuf_generate(TARGET meshtrain_lib LANGUAGE cpp
  PROTOS ${CMAKE_CURRENT_LIST_DIR}/tensorboard_event.proto
  PROTOC_OUT_DIR ${CMAKE_CURRENT_BINARY_DIR}/generated)
target_include_directories(meshtrain_lib PRIVATE ${CMAKE_CURRENT_BINARY_DIR}/generated)
target_link_libraries(meshtrain_lib PRIVATE protobuf::libprotobuf-lite)
