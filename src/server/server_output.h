/* A chat answer's text split into what the API returns: reasoning_content (the thinking),
 * content, and tool_calls, whole or as deltas while it streams. */
#ifndef MLXCEL_SERVER_OUTPUT_H
#define MLXCEL_SERVER_OUTPUT_H

#include "engine/engine.h"

typedef struct server_output {
    /* what the request asks for */
    bool reasoning; /* split <think> off into reasoning_content */
    bool inside;    /* the prompt opened the thinking */
    bool tools;     /* parse tool calls */
    bool forced;    /* the output was constrained to calls */
    bool harmony;   /* the output is GPT-OSS Harmony messages: channels, not <think> */
    engine_tool_format format;
    int calls_max;     /* parallel_tool_calls false: 1 (later calls are dropped); 0: any */
    json_t *tool_defs; /* owned reference: the request's tools */
    /* what has been sent */
    size_t reasoning_sent, content_sent; /* bytes of each part */
    int calls_sent;
} server_output;

/* What is new since the last call. */
typedef struct server_news {
    char *reasoning; /* (reasoning_len) owned */
    size_t reasoning_len;
    char *content; /* (content_len) owned */
    size_t content_len;
    engine_tool_scan scan; /* calls [first_call, scan.n_calls) are new */
    int first_call;
} server_news;

/* Splits text (len bytes, all generated so far; final: complete) and says what is new,
 * advancing o's counters. Free n with server_news_free. */
void server_output_news(server_output *o, const char *text, size_t len, bool final, server_news *n);
void server_news_free(server_news *n);

/* A fresh id: prefix then SERVER_ID_DIGITS letters and digits, cut to fit size bytes with its
 * NUL. */
#define SERVER_ID_DIGITS 24
void server_new_id(char *out, size_t size, const char *prefix);

/* A call as the API gives it: {"id", "type": "function", "function": {"name", "arguments"}},
 * with "index" when streamed (index >= 0). */
json_t *server_tool_call_json(const engine_tool_call *c, int index);

#endif
