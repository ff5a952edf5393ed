# meshtrain_add_test(NAME <n> SOURCES <src...> [RANKS <r...>] [TIMEOUT s])
# Builds one Catch2 executable linked to the library and the harness main. Without RANKS it is a
# plain unit test; with RANKS it is registered once per rank count as
#   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} N ${MPIEXEC_PREFLAGS} <exe> ${MPIEXEC_POSTFLAGS}
# with PROCESSORS N and the label 'mpi'. Oversubscription and root flags belong in
# MPIEXEC_PREFLAGS (the presets set them), never in the test code.
# A rank count above MPIEXEC_MAX_NUMPROCS is not registered (Cabana's habit: a machine that
# cannot start N ranks reports no N-rank failures); configure prints what it left out. FindMPI's
# default is the number of physical cores; the presets set 8, so every count runs (oversubscribed
# on CI's two cores).
function(meshtrain_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;RANKS;ARGS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE meshtrain_test_harness)
  if(NOT T_RANKS)
    add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
    set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS unit)
    return()
  endif()
  foreach(n IN LISTS T_RANKS)
    set(tname ${T_NAME}_np${n})
    if(n GREATER MPIEXEC_MAX_NUMPROCS)
      set_property(GLOBAL APPEND PROPERTY MESHTRAIN_TESTS_OVER_MAX_NUMPROCS ${tname})
      continue()
    endif()
    add_test(NAME ${tname}
      COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
              $<TARGET_FILE:${T_NAME}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    set_tests_properties(${tname} PROPERTIES PROCESSORS ${n} TIMEOUT ${T_TIMEOUT} LABELS mpi
      ENVIRONMENT "${MESHTRAIN_TEST_MPI_ENV}")
  endforeach()
endfunction()

# Runs once the whole project is configured: one message for every test left out above.
function(_meshtrain_report_tests_over_max_numprocs)
  get_property(left_out GLOBAL PROPERTY MESHTRAIN_TESTS_OVER_MAX_NUMPROCS)
  if(left_out)
    list(LENGTH left_out n)
    list(JOIN left_out " " names)
    message(STATUS "MPIEXEC_MAX_NUMPROCS=${MPIEXEC_MAX_NUMPROCS}: ${n} MPI test(s) with more "
      "ranks not registered (raise MPIEXEC_MAX_NUMPROCS to run them, oversubscribed): ${names}")
  endif()
endfunction()
cmake_language(DEFER DIRECTORY ${PROJECT_SOURCE_DIR} CALL _meshtrain_report_tests_over_max_numprocs)

# Open MPI refuses to start as root unless told it is intended; CI and containers run as root.
set(MESHTRAIN_TEST_MPI_ENV
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
