/* The chat page at / (src/server/webui/index.html, embedded at build time by webui.cmake). */
#ifndef MLXCEL_SERVER_WEBUI_H
#define MLXCEL_SERVER_WEBUI_H

#include "server/server_internal.h"

#include <stddef.h>

/* (server_webui_page_len) the page's bytes, NUL-terminated past the end */
extern const unsigned char server_webui_page[];
extern const size_t server_webui_page_len;

/* True for a GET or HEAD of / or /index.html while the page is on (server_options.webui). */
bool server_is_webui_route(const server *s, const char *method, const char *url);
enum MHD_Result server_route_webui(server *s, struct MHD_Connection *c);

#endif
