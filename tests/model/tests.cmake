# Tests of the model layer.
meshtrain_add_test(NAME test_gpt_parity SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gpt_parity.cpp)
target_compile_definitions(test_gpt_parity PRIVATE MESHTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
