# The grammar's schema check: gram_gen prints random documents of each schema's grammar and a
# node script validates them with ajv (draft 2020-12, ajv-formats), installed by `npm ci` in
# tests/node.
add_executable(gram_gen ${CMAKE_SOURCE_DIR}/tests/grammar/gram_gen.c)
set_target_properties(gram_gen PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
target_include_directories(gram_gen PRIVATE ${CMAKE_SOURCE_DIR}/tests)
target_link_libraries(gram_gen PRIVATE mlxcel_core)
target_compile_options(gram_gen PRIVATE ${MLXCEL_WARN})

find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  set(gram_ajv_cmd ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/grammar/schema.test.mjs)
else()
  set(gram_ajv_cmd ${CMAKE_COMMAND} -E echo
      "node is missing: install Node.js, then run 'npm ci' in tests/node")
endif()
add_test(NAME grammar/schema_ajv COMMAND ${gram_ajv_cmd})
set_tests_properties(grammar/schema_ajv PROPERTIES
  ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_GRAM_GEN=$<TARGET_FILE:gram_gen>"
  FAIL_REGULAR_EXPRESSION "node is missing"
  TIMEOUT 300)

# The grammar benchmark (bench/bench_grammar.c) is built with the tests but not run by ctest.
add_executable(bench_grammar ${CMAKE_SOURCE_DIR}/bench/bench_grammar.c)
set_target_properties(bench_grammar PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bench)
target_link_libraries(bench_grammar PRIVATE mlxcel_core)
target_compile_definitions(bench_grammar PRIVATE MLXCEL_GIT_COMMIT="${MLXCEL_GIT_COMMIT}")
target_compile_options(bench_grammar PRIVATE ${MLXCEL_WARN})
