# The tokenizer's conformance test: a driver that tokenizes many texts in one process, and a
# node script that compares it with the JavaScript reference (@huggingface/tokenizers).
add_executable(tok_driver ${CMAKE_SOURCE_DIR}/tests/tokenizer/tok_driver.c)
set_target_properties(tok_driver PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
target_link_libraries(tok_driver PRIVATE mlxcel_core)
target_compile_options(tok_driver PRIVATE ${MLXCEL_WARN})

find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  set(tok_conformance_cmd ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/tokenizer/conformance.mjs)
else()
  set(tok_conformance_cmd ${CMAKE_COMMAND} -E echo
      "node is missing: install Node.js, then run 'npm ci' in tests/node")
endif()
add_test(NAME tokenizer/conformance COMMAND ${tok_conformance_cmd})
set_tests_properties(tokenizer/conformance PROPERTIES
  ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TOK_DRIVER=$<TARGET_FILE:tok_driver>"
  FAIL_REGULAR_EXPRESSION "node is missing"
  TIMEOUT 120)
