# Sources of the io layer (owned by that layer; keeps merges of parallel work apart).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/token_shard.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dataset.cpp
  ${CMAKE_CURRENT_LIST_DIR}/blend.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe_model.cpp
  ${CMAKE_CURRENT_LIST_DIR}/bpe_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_tokenizer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pcre2_regex.cpp
  ${CMAKE_CURRENT_LIST_DIR}/json_lines.cpp
  ${CMAKE_CURRENT_LIST_DIR}/text_input.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors.cpp
  ${CMAKE_CURRENT_LIST_DIR}/safetensors_sharded.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_import.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_export.cpp
  ${CMAKE_CURRENT_LIST_DIR}/hf_mixtral.cpp
)
# Parallel HDF5 checkpoints (issue 8), written in the background (issue 36).
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/hdf5_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_write.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_read.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_state.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint_async.cpp
)
