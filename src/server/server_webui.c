/* GET / and /index.html: the chat page, unless --no-webui. It is served without the API key
 * (a browser cannot send one with a navigation; the page asks for it and sends it with its
 * own requests) and while the model loads. Its headers confine it: it may load nothing from
 * elsewhere, talk only to this server, and not be framed by another site's page. */
#include "server/server_internal.h"
#include "server/server_webui.h"

#include <string.h>

bool server_is_webui_route(const server *s, const char *method, const char *url) {
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    return s->o.webui && get && (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0);
}

enum MHD_Result server_route_webui(server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(
        server_webui_page_len, (void *)server_webui_page, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; style-src "
                            "'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                            "base-uri 'none'; frame-ancestors 'none'");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = server_queue(s, c, 200, r);
    MHD_destroy_response(r);
    return rc;
}
