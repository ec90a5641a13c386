/* Which web pages may drive the server. A page on any site can make its visitor's browser send
 * a "simple" POST (text/plain, no preflight) to 127.0.0.1, and with DNS rebinding (a name of
 * the attacker's that resolves to 127.0.0.1) even read the answers. Two checks close that, as
 * llama-server's and Ollama's do:
 *
 * - Host: a server bound to a loopback address answers only requests whose Host names this
 *   machine (localhost, *.localhost, 127.x.y.z, [::1], its own host name, *.local, *.internal):
 *   a rebinding attacker's page carries its own name there. A server bound to another address
 *   was meant to be reached by other names, and is not checked.
 * - Origin: browsers send it with every cross-site request (and with same-site POSTs). It must
 *   be this server's own origin (a page it served), the --cors origin, or anything with
 *   --cors '*'. Clients that are not browsers send none and pass. */
#include "server/server_internal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static bool ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n > k && strncasecmp(s + n - k, suffix, k) == 0;
}

/* The host part of "host[:port]" or "[v6]:port" into out (NUL-terminated); false when it
 * does not fit or is malformed. */
static bool host_part(const char *h, char *out, size_t size) {
    const char *end;
    if (h[0] == '[') {
        end = strchr(h, ']');
        if (!end) return false;
        h++;
    } else {
        end = strchr(h, ':');
        if (!end) end = h + strlen(h);
    }
    size_t n = (size_t)(end - h);
    if (n == 0 || n >= size) return false;
    memcpy(out, h, n);
    out[n] = 0;
    return true;
}

static bool names_this_machine(const server *s, const char *host) {
    size_t n = strlen(host);
    if (strcasecmp(host, "localhost") == 0 || ends_with(host, n, ".localhost") ||
        ends_with(host, n, ".local") || ends_with(host, n, ".internal"))
        return true;
    if (s->hostname[0] && strcasecmp(host, s->hostname) == 0) return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

bool server_host_allowed(const server *s, struct MHD_Connection *c, char *why, size_t why_size) {
    if (!s->loopback) return true;
    /* HTTP/1.0 may leave it out (libmicrohttpd refuses HTTP/1.1 without it) */
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!h) return true;
    char host[256];
    if (host_part(h, host, sizeof host) && names_this_machine(s, host)) return true;
    snprintf(why, why_size,
             "Host '%.200s' is not a name of this machine; a server bound to %s answers only "
             "requests for localhost (bind another address with --host to serve other names)",
             h, s->host);
    return false;
}

bool server_origin_allowed(const server *s, struct MHD_Connection *c, char *why, size_t why_size) {
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin) return true;
    if (s->cors && (strcmp(s->cors, "*") == 0 || strcmp(s->cors, origin) == 0)) return true;
    /* a page this server served itself: scheme://host[:port] naming the Host it asked for */
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    const char *sep = strstr(origin, "://");
    if (host && sep && strcasecmp(sep + 3, host) == 0) return true;
    snprintf(why, why_size,
             "cross-origin request from '%.200s' refused (start the server with --cors ORIGIN "
             "to allow a web page's origin)",
             origin);
    return false;
}
