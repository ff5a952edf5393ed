# cmake -DCMD="a@@b@@c" -DEXPECT_RC=N -DEXPECT_OUT=regex [-DREJECT_OUT=regex] -P expect.cmake
# Runs a command and checks its exit code and (combined) output: the executable's error policy
# (exit codes, messages that name the option or file) is part of its interface.
string(REPLACE "@@" ";" CMD "${CMD}")
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
  TIMEOUT 120)
set(all "${out}${err}")
if(NOT "${rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit code ${rc}, expected ${EXPECT_RC}\n--- output ---\n${all}")
endif()
if(DEFINED EXPECT_OUT AND NOT all MATCHES "${EXPECT_OUT}")
  message(FATAL_ERROR "output does not match '${EXPECT_OUT}'\n--- output ---\n${all}")
endif()
if(DEFINED REJECT_OUT AND all MATCHES "${REJECT_OUT}")
  message(FATAL_ERROR "output matches '${REJECT_OUT}', which it must not\n--- output ---\n${all}")
endif()
message(STATUS "ok: rc=${rc}")
