# Command-line tests that run the mlxcel binary on committed models.
add_test(NAME cli/demo_perplexity COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/demo_perplexity.sh)
set_tests_properties(cli/demo_perplexity PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
