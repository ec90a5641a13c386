# The server's end-to-end tests: node drives mlxcel-server on the demo model through the
# official openai package (installed by `npm ci` in tests/node) and plain fetch.
find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  add_test(NAME server/openai_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/server.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/openai_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()
