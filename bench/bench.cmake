# The CUDA benchmarks (bench/*.cu): built with everything on CUDA builds so that they keep
# compiling, never run by ctest; bench/run_gpu.sh runs them. They reach the CUDA backend's
# internals, so they link the core library and see src/.
foreach(name bench_attention bench_cuda_gemv bench_prefill_attention)
  add_executable(${name} ${CMAKE_SOURCE_DIR}/bench/${name}.cu)
  target_link_libraries(${name} PRIVATE mlxcel_core)
  target_compile_definitions(${name} PRIVATE MLXCEL_GIT_COMMIT="${MLXCEL_GIT_COMMIT}")
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
endforeach()
