/* The HTTP request line and headers, shared by fuzz/fuzz_http_request.c and the regression
 * test (tests/fuzz_regress): the input is sent as it is to a real mlxcel-server listening on
 * loopback (no model attached, so every route that passes the checks answers 503), then the
 * client shuts down its sending side and reads the answer. What comes back must be an HTTP
 * response, a JSON body must parse, and the server must stay up for the next input. This
 * covers libmicrohttpd's parsing as the server configures it and everything the server does
 * before a route: framing, connection limits, Host and Origin, auth, CORS, errors. */
#ifndef MLXCEL_FUZZ_HTTP_REQUEST_H
#define MLXCEL_FUZZ_HTTP_REQUEST_H

#include "fuzz_targets.h"
#include "server/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#define FUZZ_HTTP_REPLY_MAX (64u << 10)

/* Starts the server once; exits when it cannot, since every input would then test nothing. */
static inline int fuzz_http_port(void) {
    static int port;
    if (port) return port;
    signal(SIGPIPE, SIG_IGN);
    static const char *const keys[] = {"fuzz-key"};
    server_options o = {.host = "127.0.0.1",
                        .api_keys = keys,
                        .n_api_keys = 1,
                        .timeout_s = 5,
                        .read_timeout_s = 5,
                        .max_body = 4096,
                        .max_header = 8192,
                        .max_connections = 64,
                        .max_connections_ip = 16,
                        .cors_origin = "https://app.example",
                        .model_id = "fuzz"};
    engine_sampling_defaults(&o.defaults);
    server *s = NULL;
    base_err err = {{0}};
    if (server_start(&o, &s, &err)) {
        fprintf(stderr, "fuzz: cannot start the server: %s\n", err.msg);
        exit(1);
    }
    port = server_port(s);
    return port;
}

/* Reads until the server closes, the buffer is full or 5 s pass; returns the bytes read. */
static inline size_t fuzz_http_read_all(int fd, char *buf, size_t cap) {
    size_t n = 0;
    while (n < cap) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0) break;
        ssize_t r = recv(fd, buf + n, cap - n, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    return n;
}

/* The first response of a reply: a status line; a JSON body (by Content-Length) parses, unless
 * the request was HEAD, whose reply has the headers alone. */
static inline void fuzz_http_check_reply(char *reply, size_t n, bool head) {
    if (n == 0) return; /* closed without an answer: allowed for input that is not HTTP */
    fuzz_require(n >= 12 && memcmp(reply, "HTTP/1.", 7) == 0 && reply[8] == ' ',
                 "the reply does not start with a status line");
    reply[n < FUZZ_HTTP_REPLY_MAX ? n : FUZZ_HTTP_REPLY_MAX - 1] = 0;
    char *end = strstr(reply, "\r\n\r\n");
    if (!end) return; /* cut short by the size limit */
    *end = 0;
    const char *cl = strcasestr(reply, "\r\nContent-Length: ");
    if (head || !strcasestr(reply, "\r\nContent-Type: application/json") || !cl) return;
    size_t len = strtoul(cl + 18, NULL, 10), have = n - (size_t)(end + 4 - reply);
    if (len > have) return;
    json_error_t je;
    json_t *body = json_loadb(end + 4, len, 0, &je);
    fuzz_require(body != NULL, "a JSON reply does not parse");
    json_decref(body);
}

static inline int fuzz_http_request(const uint8_t *data, size_t size) {
    int port = fuzz_http_port();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    fuzz_require(fd >= 0, "no socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fuzz_require(connect(fd, (struct sockaddr *)&a, sizeof a) == 0,
                 "the server no longer accepts connections");
    size_t sent = 0;
    while (sent < size) {
        ssize_t w = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server answered and closed before reading it all */
        sent += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    static char reply[FUZZ_HTTP_REPLY_MAX];
    size_t n = fuzz_http_read_all(fd, reply, sizeof reply);
    /* An abortive close (RST): the client spoke first, so an orderly close would park each
     * connection's ephemeral port in TIME_WAIT for a minute, and at a few hundred inputs a
     * second the 28,000 loopback ports run out long before the run does. */
    struct linger hard = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    close(fd);
    fuzz_http_check_reply(reply, n, size >= 5 && memcmp(data, "HEAD ", 5) == 0);
    return 0;
}

#endif
