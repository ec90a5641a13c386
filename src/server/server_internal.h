/* Shared between the server's files: the server, one HTTP exchange, and one generation job. */
#ifndef MLXCEL_SERVER_INTERNAL_H
#define MLXCEL_SERVER_INTERNAL_H

#include "server/server.h"
#include "server/server_metrics.h"
#include "server/server_params.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

/* One open connection, for the connection limits and the read deadline (server_guard.c). */
typedef struct server_conn {
    struct server_conn *prev, *next;
    int fd;
    unsigned char addr[17]; /* the client's address: family, then 4 or 16 bytes */
    bool reading;           /* its request has not fully arrived (false while it is answered) */
    bool refused;           /* opened past a limit with no slow connection to replace */
    bool evicted;           /* shut down to make room; gone once its thread sees it */
    double since;           /* base_now() when its current request began to arrive */
} server_conn;

/* The past responses of the Responses API (server_responses_store.c). */
typedef struct server_store server_store;

struct server {
    server_options o; /* strings point at the owned copies below */
    char *host, *model_id, *cors;
    char **api_keys; /* (o.n_api_keys) owned copies */
    struct MHD_Daemon *daemon;
    int port;
    long long created; /* wall-clock start, for /v1/models */
    /* set once by server_attach; read without a lock after `ready` is seen */
    engine_runtime *rt;
    engine_prompter *pr;
    engine_sched *sched;
    int ready;          /* atomic */
    int stopping;       /* atomic: waiting handlers cancel their jobs */
    int draining;       /* atomic: new requests get 503 (server_drain) */
    int aborting;       /* atomic: running requests are cancelled and end with "abort" */
    int active;         /* atomic: generation responses still being written */
    int cut;            /* atomic: requests a drain or an abort cut short */
    bool loopback;      /* bound to a loopback address: the Host header must name this machine */
    char hostname[256]; /* this machine's name, which a Host header may also give */
    /* the connection guard: its thread closes connections past their deadline */
    pthread_t guard;
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    bool guard_running, guard_stop; /* under guard_mu */
    server_conn *conns;             /* under guard_mu: open connections, a list */
    /* counters for /metrics, atomics */
    uint64_t n_requests, n_errors, n_dropped, n_replaced, n_refused;
    server_metrics metrics;
    pthread_mutex_t props_mu;        /* o.defaults, o.n_predict and o.seed_fixed: POST /props */
    bool embeddings;                 /* serve the embedding routes (server_serve_embeddings) */
    const engine_reranker *reranker; /* serve the rerank routes (server_serve_reranking); NULL */
    engine_pooling pooling;
    server_store *responses; /* owned: what previous_response_id may name */
};

/* One HTTP request while its body arrives. */
typedef struct server_exchange {
    char *body; /* (len + 1) NUL-terminated */
    size_t len, cap;
    bool too_large;
    /* for the request's log line (server_log.c) */
    double t_start;
    char method[16], route[160];
    int n_in, n_out; /* prompt and generated tokens; -1: not a generation */
    double ttft;     /* seconds to the first token, when there was one */
} server_exchange;

/* Writes the request's log line on stderr, text or JSON as --log-format says. */
void server_log_request(const server *s, struct MHD_Connection *c, const server_exchange *x);

/* Queues a response with the CORS headers when --cors asks for them; r stays the caller's. */
enum MHD_Result server_queue(const server *s, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r);
/* Sends a JSON body (stolen: decref'd here) with a status. */
enum MHD_Result server_reply_json(const server *s, struct MHD_Connection *c, unsigned status,
                                  json_t *body);
/* An error body in an API's shape, for a status, our error type and a message (valid UTF-8). */
typedef json_t *server_error_shape(unsigned status, const char *type, const char *msg);
/* OpenAI error object {"error": {"message", "type", "code"}}. */
enum MHD_Result server_reply_error(const server *s, struct MHD_Connection *c, unsigned status,
                                   const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The same in another shape; NULL: OpenAI's. */
enum MHD_Result server_reply_error_as(const server *s, struct MHD_Connection *c,
                                      server_error_shape *shape, unsigned status, const char *type,
                                      const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* True when the client has hung up (reset, or closed both ways). */
bool server_client_gone(struct MHD_Connection *c);
/* True when the client has sent all it will (it shut down its side, or closed the socket). */
bool server_client_done_sending(struct MHD_Connection *c);
/* Writes an interim "100 Continue" (HTTP/1.1 only, before the final response) so that a client
 * that closed its socket answers with a reset; true when written. */
bool server_probe_client(struct MHD_Connection *c);
/* The connection guard (server_guard.c): the connection limits and the read deadline.
 * start/stop bracket the daemon's life; notify is libmicrohttpd's connection callback (cls: the
 * server); arm marks a connection as reading its next request (armed) or being answered; refused
 * says whether the connection was opened past a limit, so that its request gets a 503. */
int server_guard_start(server *s, base_err *err);
void server_guard_stop(server *s);
void server_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);
void server_guard_arm(server *s, struct MHD_Connection *c, bool armed);
bool server_guard_refused(server *s, struct MHD_Connection *c);
/* Whether the request's Host and Origin headers may reach this server (server_origin.c); on
 * false, why[] says which header and value were refused. */
bool server_host_allowed(const server *s, struct MHD_Connection *c, char *why, size_t why_size);
bool server_origin_allowed(const server *s, struct MHD_Connection *c, char *why, size_t why_size);
/* Routes. `body` is the parsed JSON request (NULL for GET); version: the request's HTTP
 * version. */
enum MHD_Result server_route_generate(server *s, struct MHD_Connection *c, const char *url,
                                      const char *version, json_t *body, server_exchange *x);
enum MHD_Result server_route_info(server *s, struct MHD_Connection *c, const char *url,
                                  json_t *body);
enum MHD_Result server_route_metrics(server *s, struct MHD_Connection *c);
/* server_admin.c: POST /props, POST /slots/{id}?action=erase, and the options as POST /props
 * has left them, for a request to read. */
enum MHD_Result server_route_props_change(server *s, struct MHD_Connection *c, json_t *body);
enum MHD_Result server_route_slot_action(server *s, struct MHD_Connection *c, const char *url);
server_options server_options_now(server *s);
/* A chat answer in another API's shape than OpenAI's chat (server_messages_out.c: Anthropic's
 * Messages; server_responses_out.c: OpenAI's Responses), for a request of one sequence. What the
 * writer sees of the sequence, under the request's lock: */
typedef struct server_seq {
    const char *text; /* (len) everything generated so far */
    size_t len;
    server_output *split; /* how the text splits; its counters say what has been streamed */
    engine_finish finish; /* ENGINE_FINISH_NONE while it runs */
    const char *stop;     /* the stop string that ended it, or NULL */
    const char *error;    /* ENGINE_FINISH_ERROR only */
    int n_prompt, n_generated, n_cached; /* n_cached: prompt tokens the prefix cache held */
} server_seq;
/* Appends one SSE event to sink: "event: NAME" (when name is set), then "data: " and data
 * (stolen). */
typedef void server_emit_fn(void *sink, const char *name, json_t *data);
typedef struct server_writer {
    void *state; /* owned by the request once server_generate has it, freed by free_state */
    /* streamed: the events for what is new in q, and for its end once q->finish is set */
    void (*stream)(void *state, const server_seq *q, server_emit_fn *emit, void *sink);
    /* not streamed: the whole answer's body; *status comes as 200 */
    json_t *(*whole)(void *state, const server_seq *q, unsigned *status);
    server_error_shape *error; /* the shape of error bodies */
    void (*free_state)(void *state);
} server_writer;
/* Generates p's answer and writes it, in OpenAI's shapes (w NULL) or w's (p: one sequence);
 * frees p, and takes w's state. */
enum MHD_Result server_generate(server *s, struct MHD_Connection *c, const char *version,
                                server_params *p, const server_writer *w, server_exchange *x);
/* server_messages.c: POST /v1/messages and /v1/messages/count_tokens, and their error shape. */
bool server_is_messages_route(const char *url);
enum MHD_Result server_route_messages(server *s, struct MHD_Connection *c, const char *url,
                                      const char *version, json_t *body, server_exchange *x);
json_t *server_messages_error(unsigned status, const char *type, const char *msg);
/* server_responses.c: POST /v1/responses. */
bool server_is_responses_route(const char *url);
/* GET and DELETE /v1/responses/{id}: a stored response shown, or forgotten. */
bool server_is_response_id_route(const char *method, const char *url);
enum MHD_Result server_route_response_id(server *s, struct MHD_Connection *c, const char *method,
                                         const char *url);
enum MHD_Result server_route_responses(server *s, struct MHD_Connection *c, const char *version,
                                       json_t *body, server_exchange *x);
/* server_embed.c: POST /v1/embeddings, /embeddings and /embedding. */
bool server_is_embed_route(const char *url);
enum MHD_Result server_route_embed(server *s, struct MHD_Connection *c, const char *url,
                                   json_t *body, server_exchange *x);
/* server_rerank.c: POST /v1/rerank, /rerank, /v1/reranking and /reranking. */
bool server_is_rerank_route(const char *url);
enum MHD_Result server_route_rerank(server *s, struct MHD_Connection *c, json_t *body,
                                    server_exchange *x);
/* server_infill.c: llama-server's POST /infill, answered as /completion. */
enum MHD_Result server_route_infill(server *s, struct MHD_Connection *c, const char *version,
                                    json_t *body, server_exchange *x);
/* True for the routes server_route_generate / server_route_info serve. */
bool server_is_generate_route(const char *url);
bool server_is_info_route(const char *method, const char *url);

#endif
