# The scheduler benchmark (bench/bench_server.c) is built with the tests but not run by ctest.
add_executable(bench_server ${CMAKE_SOURCE_DIR}/bench/bench_server.c)
set_target_properties(bench_server PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
target_link_libraries(bench_server PRIVATE mlxcel_core)
target_compile_options(bench_server PRIVATE ${MLXCEL_WARN})
