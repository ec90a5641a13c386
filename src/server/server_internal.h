/* Shared between the server's files: the server, one HTTP exchange, and one generation job. */
#ifndef MLXCEL_SERVER_INTERNAL_H
#define MLXCEL_SERVER_INTERNAL_H

#include "server/server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

struct server {
    server_options o; /* strings point at the owned copies below */
    char *host, *api_key, *model_id;
    struct MHD_Daemon *daemon;
    int port;
    long long created; /* wall-clock start, for /v1/models */
    /* set once by server_attach; read without a lock after `ready` is seen */
    engine_runtime *rt;
    engine_prompter *pr;
    engine_sched *sched;
    int ready;    /* atomic */
    int stopping; /* atomic: waiting handlers cancel their jobs */
    /* counters for /metrics, atomics */
    uint64_t n_requests, n_errors;
};

/* One HTTP request while its body arrives. */
typedef struct server_exchange {
    char *body; /* (len + 1) NUL-terminated */
    size_t len, cap;
    bool too_large;
} server_exchange;

/* Sends a JSON body (stolen: decref'd here) with a status. */
enum MHD_Result server_reply_json(struct MHD_Connection *c, unsigned status, json_t *body);
/* OpenAI error object {"error": {"message", "type", "code"}}. */
enum MHD_Result server_reply_error(struct MHD_Connection *c, unsigned status, const char *type,
                                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* True when the client has hung up (peer closed or socket error). */
bool server_client_gone(struct MHD_Connection *c);
/* Routes. `body` is the parsed JSON request (NULL for GET). */
enum MHD_Result server_route_generate(server *s, struct MHD_Connection *c, const char *url,
                                      json_t *body);
enum MHD_Result server_route_info(server *s, struct MHD_Connection *c, const char *url,
                                  json_t *body);
/* True for the routes server_route_generate / server_route_info serve. */
bool server_is_generate_route(const char *url);
bool server_is_info_route(const char *method, const char *url);

#endif
