# The CPU matmul benchmark (bench/bench_cpu_matmul.c) is built with the tests but not run by
# ctest.
add_executable(bench_cpu_matmul ${CMAKE_SOURCE_DIR}/bench/bench_cpu_matmul.c)
set_target_properties(bench_cpu_matmul PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
target_link_libraries(bench_cpu_matmul PRIVATE mlxcel_core)
target_compile_options(bench_cpu_matmul PRIVATE ${MLXCEL_WARN})
target_compile_definitions(bench_cpu_matmul PRIVATE MLXCEL_GIT_COMMIT="${MLXCEL_GIT_COMMIT}")
