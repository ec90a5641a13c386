# The server's fault and load test: node drives mlxcel-server on the demo model over loopback
# with plain sockets (no packages needed); it bounds its own run well under the timeout.
find_program(MLXCEL_NODE node)
# Sanitizer builds give the load more time (MLXCEL_TEST_TIME_SCALE, see TIME_SCALE).
math(EXPR MLXCEL_SOAK_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
if(MLXCEL_NODE)
  add_test(NAME soak/server_soak
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/soak/soak.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(soak/server_soak PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TEST_TIME_SCALE=${MLXCEL_TEST_TIME_SCALE}"
                       TIMEOUT ${MLXCEL_SOAK_TIMEOUT} RUN_SERIAL TRUE)
endif()
