/* The routes that generate nothing: models, tokenize, detokenize, apply-template, slots and
 * props, and the dispatch to metrics (server_metrics.c) and the changing ones (server_admin.c). */
#include "server/server_internal.h"
#include "server/server_params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool has_prefix(const char *url, const char *prefix) {
    return strncmp(url, prefix, strlen(prefix)) == 0 && url[strlen(prefix)];
}

bool server_is_info_route(const char *method, const char *url) {
    static const char *get[] = {"/v1/models", "/models", "/metrics", "/slots", "/props"};
    static const char *post[] = {"/tokenize", "/detokenize", "/apply-template", "/props"};
    bool is_get = strcmp(method, "GET") == 0, is_post = strcmp(method, "POST") == 0;
    for (size_t i = 0; is_get && i < sizeof get / sizeof *get; i++)
        if (strcmp(url, get[i]) == 0) return true;
    for (size_t i = 0; is_post && i < sizeof post / sizeof *post; i++)
        if (strcmp(url, post[i]) == 0) return true;
    return (is_get && (has_prefix(url, "/v1/models/") || has_prefix(url, "/models/"))) ||
           (is_post && has_prefix(url, "/slots/"));
}

static json_t *model_json(const server *s) {
    const io_model_config *cfg = model_config(s->rt->model);
    return json_pack("{s:s,s:s,s:I,s:s,s:{s:i,s:i,s:i}}", "id", s->o.model_id, "object", "model",
                     "created", (json_int_t)s->created, "owned_by", "mlxcel", "meta", "vocab_size",
                     cfg->vocab_size, "n_ctx", s->rt->kv_plan.ctx_size, "n_ctx_train",
                     cfg->max_position_embeddings);
}

static enum MHD_Result models(server *s, struct MHD_Connection *c) {
    return server_reply_json(s, c, 200,
                             json_pack("{s:s,s:[o]}", "object", "list", "data", model_json(s)));
}

/* GET /v1/models/{id} (the SDKs' models.retrieve); the id may hold slashes (owner/name). */
static enum MHD_Result model_one(server *s, struct MHD_Connection *c, const char *id) {
    if (strcmp(id, s->o.model_id) != 0)
        return server_reply_error(s, c, 404, "invalid_request_error",
                                  "The model '%s' does not exist", id);
    return server_reply_json(s, c, 200, model_json(s));
}

/* The routes that only turn the body into a response; a body at fault gets a 400. */
static enum MHD_Result body_route(server *s, struct MHD_Connection *c, json_t *b,
                                  int (*handle)(const engine_prompter *, json_t *, json_t **,
                                                base_err *)) {
    json_t *o = NULL;
    base_err err;
    if (handle(s->pr, b, &o, &err))
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    return server_reply_json(s, c, 200, o);
}

static json_t *kv_json(const kv_pool_stats *p) {
    return json_pack("{s:I,s:I,s:I,s:I}", "capacity", (json_int_t)p->capacity, "free",
                     (json_int_t)p->free, "cached", (json_int_t)p->cached, "referenced",
                     (json_int_t)p->referenced);
}

static enum MHD_Result slots(server *s, struct MHD_Connection *c) {
    if (!s->o.slots)
        return server_reply_error(s, c, 501, "not_supported_error",
                                  "slots are off (the server was started with --no-slots)");
    engine_sched_stats st = engine_sched_get_stats(s->sched);
    json_t *arr = json_array();
    for (int i = 0; i < s->rt->kv_plan.n_parallel; i++)
        json_array_append_new(arr,
                              json_pack("{s:i,s:i,s:b}", "id", i, "n_ctx", s->rt->kv_plan.ctx_size,
                                        "is_processing", i < st.running));
    return server_reply_json(s, c, 200, arr);
}

static enum MHD_Result props(server *s, struct MHD_Connection *c) {
    engine_sched_stats st = engine_sched_get_stats(s->sched);
    server_options now = server_options_now(s);
    const engine_sampling *d = &now.defaults;
    json_t *params = json_pack("{s:f,s:i,s:f,s:f,s:f,s:i}", "temperature", d->temperature, "top_k",
                               d->top_k, "top_p", d->top_p, "min_p", d->min_p, "repeat_penalty",
                               d->repeat_penalty, "n_predict", now.n_predict);
    /* the seed only when it is the server's (--seed): else each request draws its own */
    json_object_set_new(params, "seed", json_integer(now.seed_fixed ? (json_int_t)d->seed : -1));
    json_t *o = json_pack("{s:{s:i,s:o},s:i,s:s,s:s,s:o,s:i,s:i}", "default_generation_settings",
                          "n_ctx", s->rt->kv_plan.ctx_size, "params", params, "total_slots",
                          s->rt->kv_plan.n_parallel, "model_alias", s->o.model_id, "backend",
                          s->rt->be->name, "kv_cache", kv_json(&st.pool), "requests_running",
                          st.running, "requests_waiting", st.waiting);
    if (st.local_pool.capacity) json_object_set_new(o, "kv_cache_local", kv_json(&st.local_pool));
    return server_reply_json(s, c, 200, o);
}

enum MHD_Result server_route_info(server *s, struct MHD_Connection *c, const char *url,
                                  json_t *body) {
    if (strcmp(url, "/v1/models") == 0 || strcmp(url, "/models") == 0) return models(s, c);
    if (has_prefix(url, "/v1/models/")) return model_one(s, c, url + strlen("/v1/models/"));
    if (has_prefix(url, "/models/")) return model_one(s, c, url + strlen("/models/"));
    if (has_prefix(url, "/slots/")) return server_route_slot_action(s, c, url);
    if (strcmp(url, "/props") == 0 && body) return server_route_props_change(s, c, body);
    if (strcmp(url, "/tokenize") == 0) return body_route(s, c, body, server_body_tokenize);
    if (strcmp(url, "/detokenize") == 0) return body_route(s, c, body, server_body_detokenize);
    if (strcmp(url, "/apply-template") == 0)
        return body_route(s, c, body, server_body_apply_template);
    if (strcmp(url, "/metrics") == 0) return server_route_metrics(s, c);
    if (strcmp(url, "/slots") == 0) return slots(s, c);
    return props(s, c);
}

void server_extra_eos(const char *model_dir, const engine_prompter *pr, int32_t **ids, int *n) {
    *ids = base_xmalloc(17 * sizeof **ids);
    *n = 0;
    if (tok_eos_id(pr->tok) >= 0) (*ids)[(*n)++] = tok_eos_id(pr->tok);
    char *path = base_path_join(model_dir, "generation_config.json");
    json_t *g = json_load_file(path, 0, NULL);
    free(path);
    json_t *e = json_object_get(g, "eos_token_id");
    if (json_is_integer(e)) (*ids)[(*n)++] = (int32_t)json_integer_value(e);
    size_t i;
    json_t *v;
    if (json_is_array(e)) json_array_foreach(e, i, v) {
            if (json_is_integer(v) && *n < 17) (*ids)[(*n)++] = (int32_t)json_integer_value(v);
        }
    json_decref(g);
    /* a Harmony turn ends with <|return|> or <|call|> (GPT-OSS's generation_config says so;
     * a checkpoint that lost that file must still stop at a call) */
    static const char *const harmony_ends[] = {"<|return|>", "<|call|>"};
    for (size_t k = 0; pr->tool_format == ENGINE_TOOLS_HARMONY && k < 2; k++) {
        int32_t id = tok_token_id(pr->tok, harmony_ends[k]);
        if (id >= 0 && *n < 17) (*ids)[(*n)++] = id;
    }
}
