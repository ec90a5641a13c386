/* One line on stderr per request, when it is answered: method, route, client, status, prompt
 * and generated tokens, time to first token and in all; as text, or as one JSON object a line
 * for log collectors (--log-format json). Health probes are left out, as llama-server does:
 * they would drown the rest. */
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void client_address(struct MHD_Connection *c, char *buf, size_t size) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(buf, size, "-");
    if (!ci || !ci->client_addr) return;
    const struct sockaddr *sa = ci->client_addr;
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, buf, (socklen_t)size);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, buf, (socklen_t)size);
}

void server_log_request(const server *s, struct MHD_Connection *c, const server_exchange *x) {
    if (!s->o.log_requests || strcmp(x->route, "/health") == 0 ||
        strcmp(x->route, "/v1/health") == 0)
        return;
    const union MHD_ConnectionInfo *si =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    unsigned status = si ? si->http_status : 0;
    char addr[INET6_ADDRSTRLEN + 1];
    client_address(c, addr, sizeof addr);
    double total_ms = (base_now() - x->t_start) * 1e3;
    double ttft_ms = x->n_out > 0 ? x->ttft * 1e3 : -1;
    if (!s->o.log_json && x->n_in < 0) {
        fprintf(stderr, "mlxcel-server: request: %s %s %s %u total_ms=%.1f\n", x->method, x->route,
                addr, status, total_ms);
        return;
    }
    if (!s->o.log_json) {
        fprintf(stderr,
                "mlxcel-server: request: %s %s %s %u tokens_in=%d tokens_out=%d ttft_ms=%.1f "
                "total_ms=%.1f\n",
                x->method, x->route, addr, status, x->n_in, x->n_out, ttft_ms, total_ms);
        return;
    }
    /* the route is the client's bytes: made valid UTF-8, or jansson would refuse it */
    char route[sizeof x->route];
    base_utf8_clean(route, sizeof route, x->route, strlen(x->route));
    json_t *o =
        json_pack("{s:s,s:s,s:s,s:s,s:i,s:i,s:i,s:f,s:f}", "event", "request", "method", x->method,
                  "route", route, "remote", addr, "status", (int)status, "tokens_in", x->n_in,
                  "tokens_out", x->n_out, "ttft_ms", ttft_ms, "total_ms", total_ms);
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (line) fprintf(stderr, "%s\n", line);
    free(line);
}
