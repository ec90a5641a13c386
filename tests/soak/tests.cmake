# The server's fault and load test: node drives mlxcel-server on the demo model over loopback
# with plain sockets (no packages needed); it bounds its own run well under the timeout.
find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  add_test(NAME soak/server_soak
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/soak/soak.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(soak/server_soak PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
