# Tests of the io layer: meshtrain_add_test(...) lines.
set(MESHTRAIN_IO_TEST_DATA ${CMAKE_CURRENT_LIST_DIR}/data)
meshtrain_add_test(NAME test_io_token_shard SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_token_shard.cpp)
meshtrain_add_test(NAME test_io_dataset SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dataset.cpp)
meshtrain_add_test(NAME test_io_blend SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_blend.cpp)
meshtrain_add_test(NAME test_io_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cpp)
meshtrain_add_test(NAME test_io_hf_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_tokenizer.cpp)
meshtrain_add_test(NAME test_io_safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp)
meshtrain_add_test(NAME test_io_safetensors_sharded
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors_sharded.cpp)
meshtrain_add_test(NAME test_io_hf_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_config.cpp)
meshtrain_add_test(NAME test_io_prep SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prep.cpp)
meshtrain_add_test(NAME test_io_prep_jsonl SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prep_jsonl.cpp)
target_link_libraries(test_io_prep_jsonl PRIVATE ZLIB::ZLIB PkgConfig::ZSTD)
meshtrain_add_test(NAME test_io_prep_parallel
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prep_parallel.cpp RANKS 1 2 4)
target_link_libraries(test_io_prep_parallel PRIVATE ZLIB::ZLIB PkgConfig::ZSTD)
foreach(t test_io_tokenizer test_io_hf_tokenizer test_io_prep test_io_prep_jsonl)
  target_compile_definitions(${t} PRIVATE MESHTRAIN_IO_TEST_DATA="${MESHTRAIN_IO_TEST_DATA}")
endforeach()
meshtrain_add_test(NAME test_io_json_lines SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_json_lines.cpp)
meshtrain_add_test(NAME test_io_text_input SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_text_input.cpp)
target_link_libraries(test_io_text_input PRIVATE ZLIB::ZLIB PkgConfig::ZSTD)
meshtrain_add_test(NAME test_io_checkpoint_layout
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_layout.cpp)
meshtrain_add_test(NAME test_io_checkpoint SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp
  RANKS 1 2 4)
# The background writer's case needs MPI_THREAD_MULTIPLE (the other counts skip it).
if(TEST test_io_checkpoint_np2)
  set_property(TEST test_io_checkpoint_np2 APPEND PROPERTY ENVIRONMENT
    MESHTRAIN_MPI_THREAD_LEVEL=multiple)
endif()
