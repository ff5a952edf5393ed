# Sources of the optim layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharded_adamw.cpp
)
# The offload step is a host loop: without errno semantics sqrtf vectorises.
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" AND NOT MESHTRAIN_ENABLE_CUDA)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/sharded_adamw.cpp
                              PROPERTIES COMPILE_OPTIONS "-fno-math-errno")
endif()
