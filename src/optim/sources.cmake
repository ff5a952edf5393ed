# Sources of the optim layer.
target_sources(meshtrain_lib PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sharded_adamw.cpp
)
# The offload step is a host loop: without errno semantics sqrtf vectorises (nvcc_wrapper passes
# the flag on to the host compiler).
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR MESHTRAIN_ENABLE_CUDA)
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/sharded_adamw.cpp
                              PROPERTIES COMPILE_OPTIONS "-fno-math-errno")
endif()
