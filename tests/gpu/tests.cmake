# The GPU suite (label 'gpu', CUDA builds with NCCL only; never in the CPU workflow): every
# parallel layout through NCCL at 2-8 ranks, each rank an emulated host, so one GPU suffices.
# `ctest --test-dir build/cuda -L gpu` runs tests/gpu/run_suite.sh over this build; on a GPU
# machine without the build tree, run the script on a jobs/bundle-gpu.sh bundle
# (tests/gpu/README.md).
if(MESHTRAIN_ENABLE_NCCL)
  add_test(NAME gpu_suite
    COMMAND ${PROJECT_SOURCE_DIR}/tests/gpu/run_suite.sh ${CMAKE_BINARY_DIR}
            ${CMAKE_BINARY_DIR}/gpu_suite
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(gpu_suite PROPERTIES LABELS gpu TIMEOUT 900 RUN_SERIAL TRUE)
endif()
