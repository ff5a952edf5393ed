# Sources of the optim layer.
target_sources(meshtrain_lib PRIVATE ${CMAKE_CURRENT_LIST_DIR}/adamw.cpp)
