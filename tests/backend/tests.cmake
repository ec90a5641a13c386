# The prefill attention benchmark (bench/bench_prefill_attention.cu) is built with the tests on
# CUDA builds but not run by ctest; it reaches the CUDA backend's internals.
if(MLXCEL_HAVE_CUDA)
  add_executable(bench_prefill_attention ${CMAKE_SOURCE_DIR}/bench/bench_prefill_attention.cu)
  set_target_properties(bench_prefill_attention PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                                                           ${CMAKE_BINARY_DIR}/bench)
  target_include_directories(bench_prefill_attention PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(bench_prefill_attention PRIVATE mlxcel_core)
endif()
