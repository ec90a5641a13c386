/* server: the OpenAI-compatible HTTP server (libmicrohttpd): /v1/chat/completions,
 * /v1/completions and /v1/models, llama-server's /completion, /tokenize, /detokenize,
 * /apply-template, /health, /metrics, /slots and /props; SSE streaming, bearer-key auth,
 * header, body, connection and read-time limits, opt-in CORS, and OpenAI-shaped errors.
 * Touches no tensors: generation goes through the engine's scheduler. */
#ifndef MLXCEL_SERVER_H
#define MLXCEL_SERVER_H

#include "engine/engine.h"

typedef struct server_options {
    const char *host;    /* numeric IPv4 or IPv6 address to bind */
    int port;            /* 0: any free port (server_port says which) */
    const char *api_key; /* NULL: no auth */
    bool metrics;        /* serve GET /metrics */
    int timeout_s;       /* idle connection timeout; <= 0: none */
    /* a request's line, headers and body must all arrive within this many seconds of the
     * connection opening or of its previous response, however steadily the bytes trickle in;
     * slower connections are closed. <= 0: no limit */
    int read_timeout_s;
    size_t max_body;             /* bytes; larger requests get 413 */
    size_t max_header;           /* bytes of request line and headers; 0: the library's */
    unsigned max_connections;    /* open at once; 0: the library's default */
    unsigned max_connections_ip; /* open at once from one address; 0: no limit */
    const char *cors_origin;     /* Access-Control-Allow-Origin; NULL: no CORS headers */
    int n_predict;               /* default max_tokens; <= 0: up to the context */
    engine_sampling defaults;    /* sampling when a request leaves a field out */
    const char *model_id;        /* the name /v1/models reports */
} server_options;

typedef struct server server;

/* Starts listening; until server_attach every route but /health answers 503. The options'
 * strings are copied. */
int server_start(const server_options *o, server **out, base_err *err);
int server_port(const server *s);
/* Serves the loaded model. None of the three is owned; they must outlive server_stop. */
void server_attach(server *s, engine_runtime *rt, engine_prompter *pr, engine_sched *sched);
/* Stops listening and waits for the connection threads. Call before stopping the scheduler. */
void server_stop(server *s);

/* The tokenizer's EOS plus generation_config.json's eos_token_id, for the scheduler.
 * *ids: caller frees. */
void server_extra_eos(const char *model_dir, const engine_prompter *pr, int32_t **ids, int *n);

#endif
