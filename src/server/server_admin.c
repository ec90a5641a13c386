/* The routes that change the server while it runs: POST /props (the sampling defaults, with
 * --props) and POST /slots/{id}?action=erase (the prefix cache). */
#include "server/server_internal.h"
#include "server/server_params.h"

#include <stdlib.h>
#include <string.h>

server_options server_options_now(server *s) {
    pthread_mutex_lock(&s->props_mu);
    server_options o = s->o;
    pthread_mutex_unlock(&s->props_mu);
    return o;
}

enum MHD_Result server_route_props_change(server *s, struct MHD_Connection *c, json_t *body) {
    if (!s->o.props)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "this server does not change its properties (start it with "
                                  "--props)");
    pthread_mutex_lock(&s->props_mu);
    base_err err;
    int rc = server_body_props(body, &s->o.defaults, &s->o.n_predict, &s->o.seed_fixed, &err);
    pthread_mutex_unlock(&s->props_mu);
    if (rc) return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    return server_reply_json(s, c, 200, json_pack("{s:b}", "success", true));
}

/* Slots are not caches of their own here: sequences share one pool whose prefix cache any of
 * them adopts from, so erasing a slot empties that cache of what no sequence holds. */
enum MHD_Result server_route_slot_action(server *s, struct MHD_Connection *c, const char *url) {
    if (!s->o.slots)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "slots are off (the server was started with --no-slots)");
    const char *id_text = url + strlen("/slots/");
    char *end;
    long id = strtol(id_text, &end, 10);
    if (end == id_text || *end || id < 0 || id >= s->rt->kv_plan.n_parallel)
        return server_reply_error(s, c, 400, "invalid_request_error",
                                  "'%s' is not a slot id (0 to %d)", id_text,
                                  s->rt->kv_plan.n_parallel - 1);
    const char *action = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "action");
    if (!action || strcmp(action, "erase") != 0)
        return server_reply_error(s, c, 400, "invalid_request_error",
                                  "slot action '%s' is not supported (erase is; the KV is not "
                                  "saved to files here)",
                                  action ? action : "");
    int64_t blocks = engine_sched_erase_cache(s->sched);
    int64_t tokens = blocks * s->rt->kv_plan.geom.block_size;
    return server_reply_json(s, c, 200,
                             json_pack("{s:i,s:I}", "id_slot", (int)id, "n_erased", tokens));
}
