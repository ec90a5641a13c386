# Conformance: mlxcel template against @huggingface/jinja (pinned in tests/node) on the Llama 3,
# Qwen3 and Gemma 3 templates and our feature templates. Needs Node.js and `npm ci` in
# tests/node; without them the test fails and says so.
find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  add_test(NAME chat/conformance COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/chat/conformance.mjs)
else()
  add_test(NAME chat/conformance
           COMMAND sh -c "echo 'node not found: install Node.js, then run npm ci in tests/node' >&2; exit 1")
endif()
set_tests_properties(chat/conformance PROPERTIES
                     ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                     TIMEOUT 120)
