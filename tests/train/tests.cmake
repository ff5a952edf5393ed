# Tests of the train layer.
meshtrain_add_test(NAME test_trainer SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_trainer.cpp)
