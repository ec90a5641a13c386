# Downloads against a local stand-in for the Hub (tests/hub/fake_hub.mjs, plain Node.js, no
# packages). Without node the test fails and says so.
find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  add_test(NAME hub/download COMMAND bash ${CMAKE_SOURCE_DIR}/tests/hub/hub_download.sh)
else()
  add_test(NAME hub/download
           COMMAND sh -c "echo 'node not found: install Node.js to run the download test' >&2; exit 1")
endif()
set_tests_properties(hub/download PROPERTIES
                     ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                     TIMEOUT 120)
