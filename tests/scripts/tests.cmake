# The scripts around the executable (label 'scripts', no MPI, a few seconds in all): Slurm jobs,
# Spack files, the scaling driver, the GPU timeline's summary. shellcheck and python3-yaml come
# from .ci/install-deps.
find_program(MESHTRAIN_SHELLCHECK shellcheck)
find_package(Python3 COMPONENTS Interpreter)

function(meshtrain_script_test name)
  add_test(NAME scripts_${name} COMMAND ${ARGN} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(scripts_${name} PROPERTIES LABELS scripts TIMEOUT 120)
endfunction()

# A missing tool fails its test with the reason, instead of skipping what CI must check.
set(_missing sh -c "echo \"$0 not found: run .ci/install-deps\" >&2; exit 1")

file(GLOB _shell_scripts CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/jobs/*.sh
  ${PROJECT_SOURCE_DIR}/jobs/lib/*.sh ${PROJECT_SOURCE_DIR}/tests/scripts/*.sh
  ${PROJECT_SOURCE_DIR}/tests/gpu/*.sh)
if(MESHTRAIN_SHELLCHECK)
  meshtrain_script_test(shellcheck ${MESHTRAIN_SHELLCHECK} ${_shell_scripts})
else()
  meshtrain_script_test(shellcheck ${_missing} shellcheck)
endif()

meshtrain_script_test(slurm_jobs bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_slurm_jobs.sh
  ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/scripts_slurm_jobs)
meshtrain_script_test(nsys_rank bash ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_nsys_rank.sh)

if(Python3_Interpreter_FOUND)
  meshtrain_script_test(spack ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_spack.py
    ${PROJECT_SOURCE_DIR})
  meshtrain_script_test(scaling ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_scaling.py
    ${PROJECT_SOURCE_DIR})
  # perf/tools/cupti_trace_summary.py: steps, categories, NCCL time hidden / exposed, gaps.
  meshtrain_script_test(cupti_summary ${Python3_EXECUTABLE}
    ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_cupti_summary.py ${PROJECT_SOURCE_DIR})
  # cmake/MeshtrainBlas.cmake with the BLAS given as the Spack recipe gives it (a few configures).
  meshtrain_script_test(spack_blas ${Python3_EXECUTABLE}
    ${CMAKE_CURRENT_SOURCE_DIR}/scripts/test_spack_blas.py
    --source ${PROJECT_SOURCE_DIR} --work ${CMAKE_CURRENT_BINARY_DIR}/scripts_spack_blas
    --cmake ${CMAKE_COMMAND} --cc ${CMAKE_C_COMPILER} --cxx ${CMAKE_CXX_COMPILER}
    --cblas-include ${MESHTRAIN_CBLAS_INCLUDE_DIR} --cblas-header ${MESHTRAIN_CBLAS_HEADER}
    --libs ${MESHTRAIN_BLAS_LINK_LIBRARIES})
  set_tests_properties(scripts_spack_blas PROPERTIES TIMEOUT 300)
else()
  meshtrain_script_test(spack ${_missing} python3)
  meshtrain_script_test(spack_blas ${_missing} python3)
  meshtrain_script_test(scaling ${_missing} python3)
  meshtrain_script_test(cupti_summary ${_missing} python3)
endif()
