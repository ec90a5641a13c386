# Command-line tests that run the mlxcel binary on committed models.
add_test(NAME cli/demo_perplexity COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/demo_perplexity.sh)
set_tests_properties(cli/demo_perplexity PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
add_test(NAME cli/run_reasoning COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/run_reasoning.sh)
set_tests_properties(cli/run_reasoning PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
