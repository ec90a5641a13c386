/* The HTTP side: libmicrohttpd with one thread per connection (a generating request blocks its
 * thread while it waits for tokens, which keeps each exchange straight-line code), request
 * bodies up to a limit, connection limits, bearer-key auth, CORS when asked for, routing and
 * OpenAI-shaped errors. */
#include "server/server_internal.h"
#include "server/server_responses.h"
#include "server/server_webui.h"

#include <arpa/inet.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum MHD_Result server_queue(const server *s, struct MHD_Connection *c, unsigned status,
                             struct MHD_Response *r) {
    if (s->cors) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cors);
        if (strcmp(s->cors, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
    }
    return MHD_queue_response(c, status, r);
}

/* The body of last resort, for when a response cannot be built (out of memory, or a value
 * jansson refuses): the client still gets a status and an OpenAI-shaped error. */
static const char g_unbuildable[] =
    "{\"error\":{\"message\":\"the response could not be built\",\"type\":\"server_error\","
    "\"code\":500}}";

/* Queues a JSON text (owned: freed here); "Connection: close" when close_after. */
static enum MHD_Result queue_json_text(const server *s, struct MHD_Connection *c, unsigned status,
                                       char *text, bool close_after) {
    struct MHD_Response *r =
        text ? MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE)
             : MHD_create_response_from_buffer(sizeof g_unbuildable - 1, (void *)g_unbuildable,
                                               MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    if (close_after) MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result rc = server_queue(s, c, text ? status : 500, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result server_reply_json(const server *s, struct MHD_Connection *c, unsigned status,
                                  json_t *body) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    return queue_json_text(s, c, status, text, false);
}

/* An OpenAI error object. The message may hold bytes from the request (a URL, a field) and may
 * have been cut at a byte limit: it is made valid UTF-8 first, or jansson would refuse it. */
static json_t *error_json(unsigned status, const char *type, const char *msg) {
    char clean[1024];
    base_utf8_clean(clean, sizeof clean, msg, strlen(msg));
    return json_pack("{s:{s:s,s:s,s:i}}", "error", "message", clean, "type", type, "code",
                     (int)status);
}

static enum MHD_Result reply_error_v(const server *s, struct MHD_Connection *c,
                                     server_error_shape *shape, unsigned status, const char *type,
                                     const char *fmt, va_list ap) {
    char msg[1024], clean[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (!shape) return server_reply_json(s, c, status, error_json(status, type, msg));
    base_utf8_clean(clean, sizeof clean, msg, strlen(msg));
    return server_reply_json(s, c, status, shape(status, type, clean));
}

enum MHD_Result server_reply_error(const server *s, struct MHD_Connection *c, unsigned status,
                                   const char *type, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result rc = reply_error_v(s, c, NULL, status, type, fmt, ap);
    va_end(ap);
    return rc;
}

enum MHD_Result server_reply_error_as(const server *s, struct MHD_Connection *c,
                                      server_error_shape *shape, unsigned status, const char *type,
                                      const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    enum MHD_Result rc = reply_error_v(s, c, shape, status, type, fmt, ap);
    va_end(ap);
    return rc;
}

/* An error after which the connection is closed: the request's framing is in doubt, or the
 * connection was one too many. */
static enum MHD_Result reply_error_close(const server *s, struct MHD_Connection *c, unsigned status,
                                         const char *type, const char *msg) {
    json_t *e = error_json(status, type, msg);
    char *text = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return queue_json_text(s, c, status, text, true);
}

static short poll_events(struct MHD_Connection *c, short events) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return POLLNVAL;
    struct pollfd p = {.fd = ci->connect_fd, .events = events};
    return poll(&p, 1, 0) > 0 ? p.revents : 0;
}

/* The end of the client's stream alone is not "gone": a client may shut down its sending side
 * after a whole request (legal HTTP) and still read the answer, and nothing tells that apart
 * from a client that closed its socket until bytes are written to it, which the latter answers
 * with a reset (see server_gen.c). */
bool server_client_gone(struct MHD_Connection *c) {
    return poll_events(c, 0) & (POLLHUP | POLLERR | POLLNVAL);
}

bool server_client_done_sending(struct MHD_Connection *c) {
    return poll_events(c, POLLRDHUP) & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL);
}

bool server_probe_client(struct MHD_Connection *c) {
    static const char interim[] = "HTTP/1.1 100 Continue\r\n\r\n";
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* libmicrohttpd writes nothing on this connection while its handler runs, which is where
     * this is called from: the interim response cannot interleave with the final one */
    return ci && send(ci->connect_fd, interim, sizeof interim - 1, MSG_NOSIGNAL | MSG_DONTWAIT) ==
                     (ssize_t)(sizeof interim - 1);
}

/* Compares the whole length whatever the content, so the time taken says nothing about how
 * much of the key was right. */
static bool key_equal(const char *given, const char *key) {
    size_t a = strlen(given), b = strlen(key);
    unsigned char diff = a != b;
    for (size_t i = 0; i < b; i++) diff |= (unsigned char)(given[i < a ? i : 0] ^ key[i]);
    return diff == 0;
}

/* The key comes as OpenAI's "Authorization: Bearer KEY" or Anthropic's "x-api-key: KEY". Every
 * key is compared, so the time taken does not say which one matched. */
static bool authorized(const server *s, struct MHD_Connection *c) {
    if (!s->o.n_api_keys) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *given = h && strncmp(h, "Bearer ", 7) == 0 ? h + 7 : NULL;
    if (!given) given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (!given) return false;
    bool ok = false;
    for (int i = 0; i < s->o.n_api_keys; i++) ok |= key_equal(given, s->api_keys[i]);
    return ok;
}

static enum MHD_Result health(server *s, struct MHD_Connection *c) {
    if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE))
        return server_reply_error(s, c, 503, "unavailable_error", "the server is shutting down");
    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
        return server_reply_error(s, c, 503, "unavailable_error", "Loading model");
    return server_reply_json(s, c, 200, json_pack("{s:s}", "status", "ok"));
}

/* A browser's CORS preflight: it carries no credentials, so it is answered before auth. The
 * headers the page asks for are allowed, whatever they are (SDKs add their own). */
static enum MHD_Result preflight(server *s, struct MHD_Connection *c) {
    const char *asked =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            asked && asked[0] ? asked : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result rc = server_queue(s, c, 204, r);
    MHD_destroy_response(r);
    return rc;
}

/* Checks that come before anything else: the connection, the Host and Origin headers. On a
 * refusal the response is queued and *rc says what to return. */
static bool refused(server *s, struct MHD_Connection *c, enum MHD_Result *rc) {
    char why[512];
    if (server_guard_refused(s, c)) {
        snprintf(why, sizeof why,
                 "too many connections (--max-connections %u, --max-connections-per-ip %u): "
                 "try again later",
                 s->o.max_connections, s->o.max_connections_ip);
        *rc = reply_error_close(s, c, 503, "unavailable_error", why);
        return true;
    }
    if (!server_host_allowed(s, c, why, sizeof why) ||
        !server_origin_allowed(s, c, why, sizeof why)) {
        *rc = server_reply_error(s, c, 403, "permission_error", "%s", why);
        return true;
    }
    return false;
}

static enum MHD_Result dispatch(server *s, struct MHD_Connection *c, const char *url,
                                const char *method, const char *version, server_exchange *x) {
    __atomic_add_fetch(&s->n_requests, 1, __ATOMIC_RELAXED);
    server_guard_arm(s, c, false);
    /* HEAD is GET without the body, which libmicrohttpd leaves out by itself */
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    bool post = strcmp(method, "POST") == 0;
    if (get && (strcmp(url, "/health") == 0 || strcmp(url, "/v1/health") == 0)) return health(s, c);
    if (s->cors && strcmp(method, "OPTIONS") == 0) return preflight(s, c);
    if (server_is_webui_route(s, method, url)) return server_route_webui(s, c);
    /* Anthropic's clients read errors in Anthropic's shape */
    bool messages = server_is_messages_route(url);
    server_error_shape *shape = messages ? server_messages_error : NULL;
    if (!authorized(s, c))
        return server_reply_error_as(s, c, shape, 401, "authentication_error", "Invalid API Key");
    bool embed = post && server_is_embed_route(url);
    bool rerank = post && server_is_rerank_route(url);
    bool infill = post && strcmp(url, "/infill") == 0;
    bool responses = post && server_is_responses_route(url);
    bool gen = post && (server_is_generate_route(url) || messages || embed || rerank || infill ||
                        responses);
    bool resp_id = server_is_response_id_route(get ? "GET" : method, url);
    if (!gen && !resp_id && !server_is_info_route(get ? "GET" : method, url))
        return server_reply_error_as(s, c, shape, 404, "not_found_error", "File Not Found: %s %s",
                                     method, url);
    if (x->too_large)
        return server_reply_error_as(s, c, shape, 413, "invalid_request_error",
                                     "the request body is larger than %zu bytes", s->o.max_body);
    if (__atomic_load_n(&s->draining, __ATOMIC_ACQUIRE))
        return server_reply_error_as(s, c, shape, 503, "unavailable_error",
                                     "the server is shutting down");
    if (!__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE))
        return server_reply_error_as(s, c, shape, 503, "unavailable_error", "Loading model");
    /* a sequence classifier scores and embeds, and has no LM head to generate with */
    if (gen && !embed && !rerank && !model_has_lm_head(s->rt->model))
        return server_reply_error_as(s, c, shape, 501, "not_supported_error",
                                     "this model is a sequence classifier (no LM head): it serves "
                                     "/v1/rerank and /v1/embeddings, not %s",
                                     url);
    enum MHD_Result rc;
    json_t *body = NULL;
    /* llama-server's slot actions take no body */
    if (post && x->len == 0 && strncmp(url, "/slots/", 7) == 0) {
        body = json_object();
    } else if (post) {
        json_error_t je;
        body = json_loadb(x->body ? x->body : "", x->len, 0, &je);
        if (!body || !json_is_object(body)) {
            json_decref(body);
            return server_reply_error_as(s, c, shape, 400, "invalid_request_error",
                                         "the body is not a JSON object: %s (line %d, column %d)",
                                         body ? "another JSON value" : je.text, je.line, je.column);
        }
    }
    rc = messages    ? server_route_messages(s, c, url, version, body, x)
         : responses ? server_route_responses(s, c, version, body, x)
         : embed     ? server_route_embed(s, c, url, body, x)
         : rerank    ? server_route_rerank(s, c, body, x)
         : infill    ? server_route_infill(s, c, version, body, x)
         : gen       ? server_route_generate(s, c, url, version, body, x)
         : resp_id   ? server_route_response_id(s, c, get ? "GET" : method, url)
                     : server_route_info(s, c, url, body);
    json_decref(body);
    return rc;
}

typedef struct length_headers {
    const char *first;
    bool differ;
} length_headers;

static enum MHD_Result on_length_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                        const char *value) {
    length_headers *l = cls;
    if (strcasecmp(key, "Content-Length") != 0 || !value) return MHD_YES;
    if (!l->first)
        l->first = value;
    else if (strcmp(l->first, value) != 0)
        l->differ = true;
    return MHD_YES;
}

/* The request's framing, checked before its body is read: where the length of the body is in
 * doubt, two parties can read two different requests out of the same bytes (request
 * smuggling), so the request is refused and the connection closed (RFC 9112, 6.1 and 6.3). */
static bool bad_framing(server *s, struct MHD_Connection *c, enum MHD_Result *rc) {
    length_headers l = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, on_length_header, &l);
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    char why[256];
    if (l.differ) {
        *rc = reply_error_close(s, c, 400, "invalid_request_error",
                                "the request has Content-Length headers that disagree");
        return true;
    }
    if (te && strcasecmp(te, "chunked") != 0) {
        snprintf(why, sizeof why, "Transfer-Encoding '%.100s' is not supported (only chunked)", te);
        *rc = reply_error_close(s, c, 501, "not_supported_error", why);
        return true;
    }
    if (te && l.first) {
        *rc = reply_error_close(s, c, 400, "invalid_request_error",
                                "the request has both Content-Length and Transfer-Encoding");
        return true;
    }
    return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls) {
    server *s = cls;
    server_exchange *x = *con_cls;
    if (!x) {
        *con_cls = x = base_xcalloc(1, sizeof *x);
        x->t_start = base_now();
        x->n_in = x->n_out = -1;
        snprintf(x->method, sizeof x->method, "%s", method);
        snprintf(x->route, sizeof x->route, "%s", url);
        /* refused as soon as the headers are in, before any of the body is read */
        enum MHD_Result rc;
        if (bad_framing(s, c, &rc) || refused(s, c, &rc)) {
            __atomic_add_fetch(&s->n_requests, 1, __ATOMIC_RELAXED);
            server_guard_arm(s, c, false);
            return rc;
        }
        /* a declared length over the limit is refused before the body is read */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (!cl || strtoull(cl, NULL, 10) <= s->o.max_body) return MHD_YES;
        x->too_large = true;
        return dispatch(s, c, url, method, version, x);
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
    return dispatch(s, c, url, method, version, x);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode why) {
    server_guard_arm(cls, c, true);
    server_exchange *x = *con_cls;
    if (!x) return;
    server_log_request(cls, c, x);
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

static bool is_loopback(const struct sockaddr_storage *ss, bool v6) {
    if (v6) return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)ss)->sin6_addr);
    return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
}

#define SERVER_THREAD_STACK (8 << 20)

static unsigned backstop(unsigned max_connections) {
    return 2 * max_connections + 64;
}

/* One thread and one descriptor per connection: the descriptor limit is raised to fit the
 * connection limit (and libmicrohttpd's backstop above it), else the limit is lowered to fit
 * it, with a warning. */
static unsigned fit_descriptors(unsigned max_connections, unsigned connections) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return max_connections;
    rlim_t need = (rlim_t)connections + 64;
    if (rl.rlim_cur >= need) return max_connections;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur >= need) return max_connections;
    unsigned fit = rl.rlim_cur > 256 ? (unsigned)((rl.rlim_cur - 128) / 2 - 32) : 16;
    if (fit >= max_connections) return max_connections;
    base_log(BASE_LOG_WARN, "--max-connections %u lowered to %u: the descriptor limit is %llu",
             max_connections, fit, (unsigned long long)rl.rlim_cur);
    return fit;
}

/* The options' strings, copied; the model's name made valid UTF-8, since it goes into every
 * response (a directory's name is any bytes). */
static int copy_options(server *s, const server_options *o, base_err *err) {
    s->o = *o;
    s->o.n_api_keys = 0;
    for (int i = 0; i < o->n_api_keys; i++)
        if (!o->api_keys[i][0])
            return base_fail(err, "--api-key: a key is empty (leave the flag out to serve "
                                  "without a key)");
    if (o->max_connections == 0) return base_fail(err, "--max-connections must be at least 1");
    s->host = base_xstrdup(o->host ? o->host : "127.0.0.1");
    s->cors = o->cors_origin && o->cors_origin[0] ? base_xstrdup(o->cors_origin) : NULL;
    s->api_keys = base_xcalloc((size_t)o->n_api_keys + 1, sizeof *s->api_keys);
    for (int i = 0; i < o->n_api_keys; i++) s->api_keys[i] = base_xstrdup(o->api_keys[i]);
    s->o.n_api_keys = o->n_api_keys;
    s->model_id = base_utf8_dup(o->model_id ? o->model_id : "model");
    if (o->model_id && strcmp(s->model_id, o->model_id) != 0)
        base_log(BASE_LOG_WARN, "the model's name is not valid UTF-8; responses call it '%s'",
                 s->model_id);
    s->o.host = s->host;
    s->o.cors_origin = s->cors;
    s->o.api_keys = (const char *const *)s->api_keys;
    s->o.model_id = s->model_id;
    if (gethostname(s->hostname, sizeof s->hostname - 1) != 0) s->hostname[0] = 0;
    return 0;
}

int server_start(const server_options *o, server **out, base_err *err) {
    server *s = base_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->guard_mu, NULL);
    pthread_mutex_init(&s->props_mu, NULL);
    pthread_cond_init(&s->guard_cv, NULL);
    s->created = (long long)time(NULL);
    server_metrics_init(&s->metrics);
    s->responses = server_store_new(SERVER_RESPONSES_MAX, SERVER_RESPONSES_TTL_S);
    struct sockaddr_storage ss;
    bool v6 = false;
    if (copy_options(s, o, err) || bind_address(s->host, o->port, &ss, &v6, err) ||
        server_guard_start(s, err)) {
        server_stop(s);
        return -1;
    }
    s->loopback = is_loopback(&ss, v6);
    /* libmicrohttpd's limit is only a backstop: the guard applies the real ones, answering
     * what it refuses, which needs the connection accepted first (a burst of refused ones
     * holds its threads for a moment) */
    s->o.max_connections = fit_descriptors(s->o.max_connections, backstop(s->o.max_connections));
    /* poll, not select, so that descriptors past FD_SETSIZE still work; ITC, so that
     * server_drain can stop the listening thread */
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ITC |
                     (v6 ? MHD_USE_IPv6 : 0);
    struct MHD_OptionItem opts[8];
    int n = 0;
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                        o->timeout_s > 0 ? o->timeout_s : 0, NULL};
    if (o->max_header)
        opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                            (intptr_t)o->max_header, NULL};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                        (intptr_t)backstop(s->o.max_connections), NULL};
    /* chat templates render on connection threads: their depth limits are sized for glibc's
     * 8 MiB default stack, which other C libraries do not give (musl's is 128 KiB) */
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_STACK_SIZE, SERVER_THREAD_STACK, NULL};
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

void server_drain(server *s) {
    if (__atomic_exchange_n(&s->draining, 1, __ATOMIC_ACQ_REL)) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    if (__atomic_load_n(&s->ready, __ATOMIC_ACQUIRE)) engine_sched_drain(s->sched);
}

void server_abort(server *s) {
    server_drain(s);
    __atomic_store_n(&s->aborting, 1, __ATOMIC_RELEASE);
}

int server_active(const server *s) {
    return __atomic_load_n(&s->active, __ATOMIC_ACQUIRE);
}

int server_cut(const server *s) {
    return __atomic_load_n(&s->cut, __ATOMIC_ACQUIRE);
}

void server_stop(server *s) {
    if (!s) return;
    __atomic_store_n(&s->stopping, 1, __ATOMIC_RELEASE);
    if (s->daemon) MHD_stop_daemon(s->daemon);
    server_guard_stop(s);
    pthread_mutex_destroy(&s->guard_mu);
    pthread_mutex_destroy(&s->props_mu);
    pthread_cond_destroy(&s->guard_cv);
    free(s->cors);
    free(s->host);
    for (int i = 0; i < s->o.n_api_keys; i++) free(s->api_keys[i]);
    free(s->api_keys);
    free(s->model_id);
    server_store_free(s->responses);
    free(s);
}
