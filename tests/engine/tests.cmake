# The scheduler benchmark (bench/bench_server.c) is built with the tests but not run by ctest.
add_executable(bench_server ${CMAKE_SOURCE_DIR}/bench/bench_server.c)
set_target_properties(bench_server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
target_link_libraries(bench_server PRIVATE mlxcel_core)
target_compile_options(bench_server PRIVATE ${MLXCEL_WARN})
# The constrained-decoding benchmark (bench/bench_constrained.c), likewise.
add_executable(bench_constrained ${CMAKE_SOURCE_DIR}/bench/bench_constrained.c)
set_target_properties(bench_constrained PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
target_link_libraries(bench_constrained PRIVATE mlxcel_core)
target_compile_definitions(bench_constrained PRIVATE MLXCEL_GIT_COMMIT="${MLXCEL_GIT_COMMIT}")
target_compile_options(bench_constrained PRIVATE ${MLXCEL_WARN})
