# Command-line tests that run the mlxcel binary on committed models.
add_test(NAME cli/demo_perplexity COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/demo_perplexity.sh)
set_tests_properties(cli/demo_perplexity PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
add_test(NAME cli/run_reasoning COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/run_reasoning.sh)
set_tests_properties(cli/run_reasoning PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# make demo's story: a continuation of about the asked length, seeded, with no template markers.
add_test(NAME cli/demo_story COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/demo_story.sh)
set_tests_properties(cli/demo_story PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# bench --plot and --plot-from: the SVG's lines, points and escaping, and the refusals.
add_test(NAME cli/bench_plot COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/bench_plot.sh)
set_tests_properties(cli/bench_plot PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# mlxcel arch: every family with its summary, each named in the README's list.
add_test(NAME cli/arch_list COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/arch_list.sh)
set_tests_properties(cli/arch_list PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# -tp / --tensor-parallel: 1 unchanged, 0 a usage error, more refused here; llama.cpp's
# --split-mode and --tensor-split refused with a pointer to -tp.
add_test(NAME cli/tensor_parallel COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tensor_parallel.sh)
set_tests_properties(cli/tensor_parallel PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
# quantize --mode: mxfp4's config.json as mlx-lm writes it, and the refused modes and flags.
add_test(NAME cli/quantize_modes COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/quantize_modes.sh)
set_tests_properties(cli/quantize_modes PROPERTIES ENVIRONMENT
                     "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin")
