/* server: the OpenAI-compatible HTTP server (libmicrohttpd): /v1/chat/completions,
 * /v1/completions, OpenAI's /v1/responses (and GET, DELETE /v1/responses/{id}), Anthropic's
 * /v1/messages and /v1/messages/count_tokens, /v1/embeddings (with --embeddings), /v1/rerank (with
 * --reranking), /v1/models and /v1/models/{id}, llama-server's /completion, /infill, /tokenize,
 * /detokenize, /apply-template, /health, /metrics, /slots (and its erase action) and /props (GET
 * and POST), a chat page at /; SSE streaming, key auth (Bearer or x-api-key), one log line per
 * request, header, body, connection and read-time limits, Host and Origin checks, opt-in CORS,
 * OpenAI-shaped errors (Anthropic's shape on its routes), and a graceful stop. Touches no tensors:
 * generation goes through the engine's scheduler. */
#ifndef MLXCEL_SERVER_H
#define MLXCEL_SERVER_H

#include "engine/engine.h"

typedef struct server_options {
    const char *host; /* numeric IPv4 or IPv6 address to bind */
    int port;         /* 0: any free port (server_port says which) */
    /* (n_api_keys) keys a request may give as "Authorization: Bearer KEY" or "x-api-key: KEY";
     * none: no auth. An empty key is refused by server_start */
    const char *const *api_keys;
    int n_api_keys;
    bool metrics;  /* serve GET /metrics */
    bool slots;    /* serve GET /slots and its erase action */
    bool props;    /* accept POST /props */
    bool webui;    /* serve the chat page at / (off: --no-webui) */
    int timeout_s; /* idle connection timeout; <= 0: none */
    /* a request's line, headers and body must all arrive within this many seconds of the
     * connection opening or of its previous response, however steadily the bytes trickle in;
     * slower connections are closed. <= 0: no limit */
    int read_timeout_s;
    size_t max_body;   /* bytes; larger requests get 413 */
    size_t max_header; /* bytes of request line and headers; 0: the library's */
    /* Connections open at once, in all and from one address (0: no per-address limit). A
     * connection past either limit takes the place of the oldest one of that address (or of
     * any address, past the global limit) that has spent a second or more sending a request
     * that has not arrived yet; when there is none, its request gets a 503. So a client that
     * holds connections by trickling bytes cannot lock out others, nor its own next request. */
    unsigned max_connections; /* must be > 0 */
    unsigned max_connections_ip;
    /* Access-Control-Allow-Origin; NULL: no CORS headers. Requests whose Origin header names
     * another site than this one or this origin get a 403, so that a web page cannot drive the
     * server behind its user's back. */
    const char *cors_origin;
    int n_predict;            /* default max_tokens; <= 0: up to the context */
    engine_sampling defaults; /* sampling when a request leaves a field out */
    bool seed_fixed;          /* --seed: defaults.seed is every unseeded request's seed, so that
                                 equal requests give equal output; else each gets a fresh one */
    bool log_requests;        /* one line on stderr per request */
    bool log_json;            /* ... as a JSON object rather than text */
    const char *model_id;     /* the name /v1/models reports */
    /* chat answers: how tool calls are written (when set; else as the chat template shows),
     * where <think> goes, and the thinking budget in tokens (when set; 0 ends it at once) */
    bool has_tool_parser, has_reasoning_budget;
    engine_tool_format tool_parser;
    engine_reasoning_format reasoning_format;
    int reasoning_budget;
} server_options;

typedef struct server server;

/* Starts listening; until server_attach every route but /health answers 503. The options'
 * strings are copied. */
int server_start(const server_options *o, server **out, base_err *err);
int server_port(const server *s);
/* Serves the loaded model. None of the three is owned; they must outlive server_stop. */
void server_attach(server *s, engine_runtime *rt, engine_prompter *pr, engine_sched *sched);
/* Serves the embedding routes (--embeddings), pooling as the checkpoint says; call before
 * server_attach. */
void server_serve_embeddings(server *s, engine_pooling pooling);
/* Serves the rerank routes (--reranking) with r (not owned; it must outlive server_stop);
 * call before server_attach. */
void server_serve_reranking(server *s, const engine_reranker *r);
/* A graceful stop in two steps. server_drain closes the listening socket, answers new requests
 * on open connections and the queued requests that have not started with 503, and lets
 * running ones go on; server_abort ends those still running: a stream gets its last chunk with
 * finish_reason "abort" and [DONE], a whole response what was generated, with the same reason
 * (or a 503 when nothing was). Both return at once; server_active says how many responses are
 * still being written. */
void server_drain(server *s);
void server_abort(server *s);
int server_active(const server *s);
/* Requests that a drain or an abort cut short (503s and aborted outputs). */
int server_cut(const server *s);
/* Stops listening and waits for the connection threads. Call before stopping the scheduler. */
void server_stop(server *s);

/* The tokenizer's EOS plus generation_config.json's eos_token_id, and a Harmony template's
 * <|return|> and <|call|>, for the scheduler. *ids: caller frees. */
void server_extra_eos(const char *model_dir, const engine_prompter *pr, int32_t **ids, int *n);

#endif
