/* Shared between the server's files: the server, one HTTP exchange, and one generation job. */
#ifndef MLXCEL_SERVER_INTERNAL_H
#define MLXCEL_SERVER_INTERNAL_H

#include "server/server.h"

#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>

/* One open connection, for the read deadline. */
typedef struct server_conn {
    struct server_conn *prev, *next;
    int fd;
    double deadline; /* base_now() seconds; 0: disarmed while a response is being made */
} server_conn;

struct server {
    server_options o; /* strings point at the owned copies below */
    char *host, *api_key, *model_id, *cors;
    struct MHD_Daemon *daemon;
    int port;
    long long created; /* wall-clock start, for /v1/models */
    /* set once by server_attach; read without a lock after `ready` is seen */
    engine_runtime *rt;
    engine_prompter *pr;
    engine_sched *sched;
    int ready;    /* atomic */
    int stopping; /* atomic: waiting handlers cancel their jobs */
    /* the read-deadline guard: its thread closes connections past their deadline */
    pthread_t guard;
    pthread_mutex_t guard_mu;
    pthread_cond_t guard_cv;
    bool guard_running, guard_stop; /* under guard_mu */
    server_conn *conns;             /* under guard_mu: open connections, a list */
    /* counters for /metrics, atomics */
    uint64_t n_requests, n_errors, n_dropped;
};

/* One HTTP request while its body arrives. */
typedef struct server_exchange {
    char *body; /* (len + 1) NUL-terminated */
    size_t len, cap;
    bool too_large;
} server_exchange;

/* Queues a response with the CORS headers when --cors asks for them; r stays the caller's. */
enum MHD_Result server_queue(const server *s, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r);
/* Sends a JSON body (stolen: decref'd here) with a status. */
enum MHD_Result server_reply_json(const server *s, struct MHD_Connection *c, unsigned status,
                                  json_t *body);
/* OpenAI error object {"error": {"message", "type", "code"}}. */
enum MHD_Result server_reply_error(const server *s, struct MHD_Connection *c, unsigned status,
                                   const char *type, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* True when the client has hung up (peer closed or socket error). */
bool server_client_gone(struct MHD_Connection *c);
/* The read-deadline guard (server_guard.c). start/stop bracket the daemon's life; notify is
 * libmicrohttpd's connection callback (cls: the server); arm restarts a connection's deadline
 * (armed) or lifts it while its request is being answered. */
int server_guard_start(server *s, base_err *err);
void server_guard_stop(server *s);
void server_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                         enum MHD_ConnectionNotificationCode code);
void server_guard_arm(server *s, struct MHD_Connection *c, bool armed);
/* Routes. `body` is the parsed JSON request (NULL for GET). */
enum MHD_Result server_route_generate(server *s, struct MHD_Connection *c, const char *url,
                                      json_t *body);
enum MHD_Result server_route_info(server *s, struct MHD_Connection *c, const char *url,
                                  json_t *body);
/* True for the routes server_route_generate / server_route_info serve. */
bool server_is_generate_route(const char *url);
bool server_is_info_route(const char *method, const char *url);

#endif
