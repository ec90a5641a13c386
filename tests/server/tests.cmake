# The server's end-to-end tests: node drives mlxcel-server on the demo model through the
# official openai and @anthropic-ai/sdk packages (installed by `npm ci` in tests/node) and plain
# fetch (mlxcel_node_test: the environment, the time scale, a failing test without node).
mlxcel_node_test(server/openai_node tests/server/server.test.mjs 120)
# Constrained output (response_format, grammar, json_schema) through the openai client, every
# answer validated with ajv against its schema.
mlxcel_node_test(server/grammar_node tests/server/grammar.test.mjs 120)
# The hardening test: the faults of a hostile-input campaign, each reproduced (plain sockets).
mlxcel_node_test(server/hardening tests/server/hardening.test.mjs 160 RUN_SERIAL TRUE)
# The drop-in test: a llama-server launch line, the openai client through embeddings, the
# Responses API, n, echo, prompt arrays and models.retrieve, @anthropic-ai/sdk through the
# Messages API (tool rounds and streams in both), /metrics through a strict Prometheus text parser, the operations
# flags (keys, seed, JSON request log, CORS, props, slot erase) and the flags' refusals.
mlxcel_node_test(server/dropin_node tests/server/dropin.test.mjs 120)
# Tool calls (forced by grammar), reasoning split and budget, content parts and prefill through
# the openai client.
mlxcel_node_test(server/tools_node tests/server/tools.test.mjs 120)
# The chat page at / in headless Chromium: the key prompt, settings, a streamed chat turn, a
# reload; its screenshot is webui_chat.png here. Skipped (77) where Chromium is missing.
mlxcel_node_test(server/webui_browser tests/server/webui.test.mjs 120 SKIP_RETURN_CODE 77)
# Anthropic's Messages API through the official @anthropic-ai/sdk: plain and streamed messages
# against the chat route's greedy answer, stop sequences, a tool round, thinking, count_tokens
# against @huggingface/tokenizers, refusals of what is not implemented, x-api-key.
mlxcel_node_test(server/messages_node tests/server/messages.test.mjs 120)
# Embeddings through the official openai client: the demo model's vectors (same text, batch
# orders, token ids, base64), and the llama_f32 fixture's mean- and last-token-pooled vectors
# against transformers' logits.
mlxcel_node_test(server/embeddings_node tests/server/embeddings.test.mjs 120)
# Reranking (--reranking) on the demo model through its yes/no logits, each score against
# `mlxcel logits` of the pair the test puts in Qwen3-Reranker's judge prompt itself; the Jina/Cohere and TEI shapes, refusals.
mlxcel_node_test(server/rerank_node tests/server/rerank.test.mjs 120)
# Fill-in-the-middle (/infill and the completions' suffix) on a tiny random Qwen3 built around
# Qwen3's real tokenizer: the prompt the server built against the ids the test builds, whole
# and cut to llama-server's budget.
mlxcel_node_test(server/infill_node tests/server/infill.test.mjs 120)
# OpenAI's Responses API through the official openai package's client.responses: plain and
# streamed responses against the chat route's greedy answer, a tool round, previous_response_id
# against the conversation sent whole, text.format validated with ajv, reasoning items, and the
# refusals of built-in tools and fields that are not implemented.
mlxcel_node_test(server/responses_node tests/server/responses.test.mjs 120)
# GPT-OSS Harmony answers through the openai client: channels to reasoning_content and content,
# calls to tool_calls (the markers spelled out by a grammar), the parser chosen from the template.
mlxcel_node_test(server/harmony_node tests/server/harmony.test.mjs 120)
