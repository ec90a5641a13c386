# The paged decode attention benchmark (CUDA only). Not part of `all`: the GPU checks build
# it by name (`cmake --build build --target bench_attention`).
add_executable(bench_attention EXCLUDE_FROM_ALL ${CMAKE_SOURCE_DIR}/bench/bench_attention.cu)
target_link_libraries(bench_attention PRIVATE mlxcel_core)
set_target_properties(bench_attention PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
