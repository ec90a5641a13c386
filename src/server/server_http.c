/* The HTTP side: libmicrohttpd with one thread per connection (a generating request blocks its
 * thread while it waits for tokens, which keeps each exchange straight-line code), request
 * bodies up to a limit, connection limits, bearer-key auth, CORS when asked for, routing and
 * OpenAI-shaped errors. */
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum MHD_Result server_queue(const server *s, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r) {
    if (s->cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cors);
        if (strcmp(s->cors, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
    }
    return MHD_queue_response(c, status, r);
}

enum MHD_Result server_reply_json(const server *s, struct MHD_Connection *c, unsigned status,
                                  json_t *body) {
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result rc = server_queue(s, c, status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result server_reply_error(const server *s, struct MHD_Connection *c, unsigned status,
                                   const char *type, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    json_t *e =
        json_pack("{s:{s:s,s:s,s:i}}", "error", "message", msg, "type", type, "code", (int)status);
    return server_reply_json(s, c, status, e);
}

bool server_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return true;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Compares the whole length whatever the content, so the time taken says nothing about how
 * much of the key was right. */
static bool key_equal(const char *given, const char *key) {
    size_t a = strlen(given), b = strlen(key);
    unsigned char diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(given[i < a ? i : 0] ^ key[i]);
    return diff == 0;
}

static bool authorized(const server *s, struct MHD_Connection *c) {
    if (!s->o.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    return key_equal(h + 7, s->o.api_key);
}

static enum MHD_Result health(server *s, struct MHD_Connection *c) {
    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
        return server_reply_error(s, c, 503, "unavailable_error", "Loading model");
    return server_reply_json(s, c, 200, json_pack("{s:s}", "status", "ok"));
}

/* A browser's CORS preflight: it carries no credentials, so it is answered before auth. */
static enum MHD_Result preflight(server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result rc = server_queue(s, c, 204, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result dispatch(server *s, struct MHD_Connection *c, const char *url,
                                const char *method, server_exchange *x) {
    __atomic_add_fetch(&s->n_requests, 1, __ATOMIC_RELAXED);
    server_guard_arm(s, c, false);
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    if (get && strcmp(url, "/health") == 0) return health(s, c);
    if (s->cors && strcmp(method, "OPTIONS") == 0) return preflight(s, c);
    if (!authorized(s, c))
        return server_reply_error(s, c, 401, "authentication_error", "Invalid API Key");
    bool gen = post && server_is_generate_route(url);
    if (!gen && !server_is_info_route(method, url))
        return server_reply_error(s, c, 404, "not_found_error", "File Not Found: %s %s", method,
                                  url);
    if (x->too_large)
        return server_reply_error(s, c, 413, "invalid_request_error",
                                  "the request body is larger than %zu bytes", s->o.max_body);
    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
        return server_reply_error(s, c, 503, "unavailable_error", "Loading model");
    json_t *body = NULL;
    if (post) {
        json_error_t je;
        body = json_loadb(x->body ? x->body : "", x->len, 0, &je);
        if (!body || !json_is_object(body)) {
            json_decref(body);
            return server_reply_error(s, c, 400, "invalid_request_error",
                                      "the body is not a JSON object: %s (line %d, column %d)",
                                      body ? "another JSON value" : je.text, je.line, je.column);
        }
    }
    enum MHD_Result rc =
        gen ? server_route_generate(s, c, url, body) : server_route_info(s, c, url, body);
    json_decref(body);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    server *s = cls;
    server_exchange *x = *con_cls;
    if (!x) {
        *con_cls = x = base_xcalloc(1, sizeof *x);
        /* a declared length over the limit is refused before the body is read */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (!cl || strtoull(cl, NULL, 10) <= s->o.max_body) return MHD_YES;
        x->too_large = true;
        return dispatch(s, c, url, method, x);
    }
    if (*upload_size) {
        if (x->len + *upload_size > s->o.max_body) x->too_large = true;
        if (!x->too_large) {
            if (x->len + *upload_size + 1 > x->cap) {
                x->cap = (x->len + *upload_size + 1) * 2;
                x->body = base_xrealloc(x->body, x->cap);
            }
            memcpy(x->body + x->len, upload_data, *upload_size);
            x->len += *upload_size;
            x->body[x->len] = 0;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    return dispatch(s, c, url, method, x);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    server_guard_arm(cls, c, true);
    server_exchange *x = *con_cls;
    if (!x) return;
    free(x->body);
    free(x);
    *con_cls = NULL;
}

static int bind_address(const char *host, int port, struct sockaddr_storage *ss, bool *v6,
                        base_err *err) {
    memset(ss, 0, sizeof *ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
    const char *h = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    if (inet_pton(AF_INET, h, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *v6 = false;
        return 0;
    }
    if (inet_pton(AF_INET6, h, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *v6 = true;
        return 0;
    }
    return base_fail(err, "--host: '%s' is not a numeric IPv4 or IPv6 address", host);
}

int server_start(const server_options *o, server **out, base_err *err) {
    server *s = base_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->guard_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    s->o = *o;
    s->host = base_xstrdup(o->host ? o->host : "127.0.0.1");
    s->cors = o->cors_origin && o->cors_origin[0] ? base_xstrdup(o->cors_origin) : NULL;
    s->o.cors_origin = s->cors;
    s->api_key = o->api_key && o->api_key[0] ? base_xstrdup(o->api_key) : NULL;
    s->model_id = base_xstrdup(o->model_id ? o->model_id : "model");
    s->o.host = s->host;
    s->o.api_key = s->api_key;
    s->o.model_id = s->model_id;
    s->created = (long long)time(NULL);
    struct sockaddr_storage ss;
    bool v6 = false;
    if (bind_address(s->host, o->port, &ss, &v6, err)) {
        server_stop(s);
        return -1;
    }
    if (server_guard_start(s, err)) {
        server_stop(s);
        return -1;
    }
    /* poll, not select, so that descriptors past FD_SETSIZE still work */
    unsigned flags =
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | (v6 ? MHD_USE_IPv6 : 0);
    struct MHD_OptionItem opts[8];
    int n = 0;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                        o->timeout_s > 0 ? o->timeout_s : 0, NULL};
    if (o->max_header)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                            (intptr_t)o->max_header, NULL};
    if (o->max_connections)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                            (intptr_t)o->max_connections, NULL};
    if (o->max_connections_ip)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                            (intptr_t)o->max_connections_ip, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    s->daemon = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
                                 MHD_OPTION_SOCK_ADDR, &ss, MHD_OPTION_NOTIFY_COMPLETED,
                                 on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, server_guard_notify,
                                 s, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!s->daemon) {
        base_fail(err, "cannot listen on %s:%d (in use, or not an address of this machine)",
                  s->host, o->port);
        server_stop(s);
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : o->port;
    *out = s;
    return 0;
}

int server_port(const server *s) {
    return s->port;
}

void server_attach(server *s, engine_runtime *rt, engine_prompter *pr, engine_sched *sched) {
    s->rt = rt;
    s->pr = pr;
    s->sched = sched;
    __atomic_store_n(&s->ready, 1, __ATOMIC_RELEASE);
}

void server_stop(server *s) {
    if (!s) return;
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    server_guard_stop(s);
    pthread_mutex_destroy(&s->guard_mu);
    pthread_cond_destroy(&s->guard_cv);
    free(s->cors);
    free(s->host);
    free(s->api_key);
    free(s->model_id);
    free(s);
}
