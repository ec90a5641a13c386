# The server's end-to-end tests: node drives mlxcel-server on the demo model through the
# official openai package (installed by `npm ci` in tests/node) and plain fetch.
find_program(MLXCEL_NODE node)
if(MLXCEL_NODE)
  add_test(NAME server/openai_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/server.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/openai_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
# Constrained output (response_format, grammar, json_schema) through the openai client, every
# answer validated with ajv against its schema.
math(EXPR MLXCEL_GRAMMAR_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
if(MLXCEL_NODE)
  add_test(NAME server/grammar_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/grammar.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/grammar_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TEST_TIME_SCALE=${MLXCEL_TEST_TIME_SCALE}"
                       TIMEOUT ${MLXCEL_GRAMMAR_TIMEOUT})
endif()
# The hardening test: the faults of a hostile-input campaign, each reproduced (plain sockets).
math(EXPR MLXCEL_HARDENING_TIMEOUT "160 * ${MLXCEL_TEST_TIME_SCALE}")
if(MLXCEL_NODE)
  add_test(NAME server/hardening
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/hardening.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/hardening PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TEST_TIME_SCALE=${MLXCEL_TEST_TIME_SCALE}"
                       TIMEOUT ${MLXCEL_HARDENING_TIMEOUT} RUN_SERIAL TRUE)
endif()
# The drop-in test: a llama-server launch line, the openai client through n, echo, prompt
# arrays and models.retrieve, /metrics through a strict Prometheus text parser, the operations
# flags (keys, seed, JSON request log, CORS, props, slot erase) and the flags' refusals.
if(MLXCEL_NODE)
  add_test(NAME server/dropin_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/dropin.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/dropin_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
math(EXPR MLXCEL_TOOLS_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
# Tool calls (forced by grammar), reasoning split and budget, content parts and prefill through
# the openai client.
if(MLXCEL_NODE)
  add_test(NAME server/tools_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/tools.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/tools_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT ${MLXCEL_TOOLS_TIMEOUT})
endif()
math(EXPR MLXCEL_WEBUI_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
# The chat page at / in headless Chromium: the key prompt, settings, a streamed chat turn, a
# reload; its screenshot is webui_chat.png here. Skipped (77) where Chromium is missing.
if(MLXCEL_NODE)
  add_test(NAME server/webui_browser
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/webui.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/webui_browser PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TEST_TIME_SCALE=${MLXCEL_TEST_TIME_SCALE}"
                       SKIP_RETURN_CODE 77 TIMEOUT ${MLXCEL_WEBUI_TIMEOUT})
endif()
math(EXPR MLXCEL_MESSAGES_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
# Anthropic's Messages API through the official @anthropic-ai/sdk: plain and streamed messages
# against the chat route's greedy answer, stop sequences, a tool round, thinking, count_tokens
# against @huggingface/tokenizers, refusals of what is not implemented, x-api-key.
if(MLXCEL_NODE)
  add_test(NAME server/messages_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/messages.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/messages_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT ${MLXCEL_MESSAGES_TIMEOUT})
endif()
# Embeddings through the official openai client: the demo model's vectors (same text, batch
# orders, token ids, base64), and the llama_f32 fixture's mean- and last-token-pooled vectors
# against transformers' logits.
if(MLXCEL_NODE)
  add_test(NAME server/embeddings_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/embeddings.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/embeddings_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
# Reranking (--reranking) on the demo model through its yes/no logits, each score against
# `mlxcel logits` of the pair the test joins itself; the Jina/Cohere and TEI shapes, refusals.
if(MLXCEL_NODE)
  add_test(NAME server/rerank_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/rerank.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/rerank_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
# Fill-in-the-middle (/infill and the completions' suffix) on a tiny random Qwen3 built around
# Qwen3's real tokenizer: the prompt the server built against the ids the test builds.
if(MLXCEL_NODE)
  add_test(NAME server/infill_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/infill.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/infill_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT 120)
endif()
math(EXPR MLXCEL_RESPONSES_TIMEOUT "120 * ${MLXCEL_TEST_TIME_SCALE}")
# OpenAI's Responses API through the official openai package's client.responses: plain and
# streamed responses against the chat route's greedy answer, a tool round, previous_response_id
# against the conversation sent whole, text.format validated with ajv, reasoning items, and the
# refusals of built-in tools and fields that are not implemented.
if(MLXCEL_NODE)
  add_test(NAME server/responses_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/responses.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/responses_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin"
                       TIMEOUT ${MLXCEL_RESPONSES_TIMEOUT})
endif()
# GPT-OSS Harmony answers through the openai client: channels to reasoning_content and content,
# calls to tool_calls (the markers spelled out by a grammar), the parser chosen from the template.
if(MLXCEL_NODE)
  add_test(NAME server/harmony_node
           COMMAND ${MLXCEL_NODE} ${CMAKE_SOURCE_DIR}/tests/server/harmony.test.mjs
           WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(server/harmony_node PROPERTIES
                       ENVIRONMENT "MLXCEL_SOURCE_DIR=${CMAKE_SOURCE_DIR};MLXCEL_BIN_DIR=${CMAKE_BINARY_DIR}/bin;MLXCEL_TEST_TIME_SCALE=${MLXCEL_TEST_TIME_SCALE}"
                       TIMEOUT ${MLXCEL_TOOLS_TIMEOUT})
endif()
