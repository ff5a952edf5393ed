# Tests of the io layer: meshtrain_add_test(...) lines.
set(MESHTRAIN_IO_TEST_DATA ${CMAKE_CURRENT_LIST_DIR}/data)
meshtrain_add_test(NAME test_io_token_shard SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_token_shard.cpp)
meshtrain_add_test(NAME test_io_dataset SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_dataset.cpp)
meshtrain_add_test(NAME test_io_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.cpp)
meshtrain_add_test(NAME test_io_hf_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_tokenizer.cpp)
meshtrain_add_test(NAME test_io_safetensors SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors.cpp)
meshtrain_add_test(NAME test_io_safetensors_sharded
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_safetensors_sharded.cpp)
meshtrain_add_test(NAME test_io_hf_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_hf_config.cpp)
meshtrain_add_test(NAME test_io_prep SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prep.cpp)
foreach(t test_io_tokenizer test_io_hf_tokenizer test_io_prep)
  target_compile_definitions(${t} PRIVATE MESHTRAIN_IO_TEST_DATA="${MESHTRAIN_IO_TEST_DATA}")
endforeach()
meshtrain_add_test(NAME test_io_checkpoint_layout
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint_layout.cpp)
meshtrain_add_test(NAME test_io_checkpoint SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.cpp
  RANKS 1 2 4)
