/* OpenAI's Responses API over the chat machinery: POST /v1/responses. A request is checked field
 * by field against what is implemented (any other field, and every built-in tool, is a 400
 * naming it, never ignored), then put as the chat request that means the same: instructions as
 * a system message, input items as messages (a developer message as a system one, function_call
 * items as an assistant's tool_calls, function_call_output items as tool messages, reasoning
 * items as reasoning_content), function tools and tool_choice as the chat API spells them,
 * text.format as response_format, reasoning.effort as the template's reasoning switches. The
 * chat code then renders, constrains and parses it as it does its own requests, so that both
 * APIs give the same answer to the same conversation; server_responses_out.c writes it in the
 * Responses shapes. previous_response_id puts the stored conversation (its input and output
 * items, not its instructions, as OpenAI's API does) before the new input. */
#include "server/server_responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_of(json_t *o) {
    return json_string_value(json_object_get(o, "type"));
}

/* The text parts of a message or a call's output as chat text parts. The annotations and
 * logprobs of an output_text part describe an earlier answer (a client resends its output
 * whole) and change nothing in the prompt: they are taken as they come. */
static int text_parts(json_t *content, const char *at, json_t **parts, base_err *err) {
    static const char *const in_keys[] = {"type", "text", NULL};
    static const char *const out_keys[] = {"type", "text", "annotations", "logprobs", NULL};
    *parts = json_array();
    size_t i;
    json_t *p;
    char where[160];
    json_array_foreach(content, i, p) {
        snprintf(where, sizeof where, "%s[%zu]", at, i);
        const char *type = type_of(p);
        bool in = type && strcmp(type, "input_text") == 0;
        if (!in && !(type && strcmp(type, "output_text") == 0))
            return base_fail(err,
                             "'%s': '%s' parts are not supported (input_text and output_text are; "
                             "this model takes text only)",
                             where, type ? type : "untyped");
        if (server_known_keys(p, where, in ? in_keys : out_keys, err)) return -1;
        json_t *text = json_object_get(p, "text");
        if (!json_is_string(text)) return base_fail(err, "'%s.text' must be a string", where);
        json_array_append_new(*parts, json_pack("{s:s,s:O}", "type", "text", "text", text));
    }
    return 0;
}

/* A string or an array of text parts, as chat content. */
static int content_of(json_t *content, const char *at, json_t **out, base_err *err) {
    if (json_is_string(content)) {
        *out = json_incref(content);
        return 0;
    }
    if (!json_is_array(content))
        return base_fail(err, "'%s' must be a string or an array of text parts", at);
    if (text_parts(content, at, out, err)) {
        json_decref(*out);
        return -1;
    }
    return 0;
}

/* The conversion of items to chat messages. An answer's reasoning, text and calls come as
 * separate items but are one assistant message in chat: `turn` is the assistant message that
 * the next of them joins, NULL after anything else. */
typedef struct convert {
    json_t *messages; /* the chat messages */
    json_t *turn;     /* borrowed from messages, or NULL */
    bool said;        /* the turn has its text or calls: only more calls join it */
} convert;

/* The open assistant turn, or a new one when there is none or `fresh` says it is taken. */
static json_t *turn(convert *cv, bool fresh) {
    if (cv->turn && !fresh) return cv->turn;
    cv->turn = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    cv->said = false;
    json_array_append_new(cv->messages, cv->turn);
    return cv->turn;
}

static int message_item(json_t *it, const char *at, convert *cv, base_err *err) {
    static const char *const keys[] = {"type", "role", "content", "id", "status", NULL};
    const char *role = json_string_value(json_object_get(it, "role"));
    if (server_known_keys(it, at, keys, err)) return -1;
    if (!role) return base_fail(err, "'%s.role' must be a string", at);
    bool assistant = strcmp(role, "assistant") == 0;
    if (!assistant && strcmp(role, "user") != 0 && strcmp(role, "system") != 0 &&
        strcmp(role, "developer") != 0)
        return base_fail(err, "'%s.role' must be user, assistant, system or developer (not '%s')",
                         at, role);
    char where[160];
    snprintf(where, sizeof where, "%s.content", at);
    json_t *content;
    if (content_of(json_object_get(it, "content"), where, &content, err)) return -1;
    if (assistant) {
        json_object_set_new(turn(cv, cv->said), "content", content);
        cv->said = true;
        return 0;
    }
    cv->turn = NULL;
    json_array_append_new(cv->messages, json_pack("{s:s,s:o}", "role",
                                                  strcmp(role, "user") == 0 ? "user" : "system",
                                                  "content", content));
    return 0;
}

static int call_item(json_t *it, const char *at, convert *cv, base_err *err) {
    static const char *const keys[] = {"type",      "id",     "call_id", "name",
                                       "arguments", "status", NULL};
    json_t *id = json_object_get(it, "call_id"), *name = json_object_get(it, "name");
    json_t *args = json_object_get(it, "arguments");
    if (server_known_keys(it, at, keys, err)) return -1;
    if (!json_is_string(id) || !json_is_string(name) || !json_is_string(args))
        return base_fail(err, "'%s' must have a string 'call_id', 'name' and 'arguments'", at);
    json_t *m = turn(cv, false);
    json_t *calls = json_object_get(m, "tool_calls");
    if (!calls) {
        calls = json_array();
        json_object_set_new(m, "tool_calls", calls);
    }
    /* a turn with calls takes no more text: the next text is the model's after the results */
    cv->said = true;
    json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function",
                                           "function", "name", name, "arguments", args));
    return 0;
}

static int call_output_item(json_t *it, const char *at, convert *cv, base_err *err) {
    static const char *const keys[] = {"type", "id", "call_id", "output", "status", NULL};
    json_t *id = json_object_get(it, "call_id"), *content;
    if (server_known_keys(it, at, keys, err)) return -1;
    if (!json_is_string(id)) return base_fail(err, "'%s.call_id' must be a string", at);
    char where[160];
    snprintf(where, sizeof where, "%s.output", at);
    if (content_of(json_object_get(it, "output"), where, &content, err)) return -1;
    cv->turn = NULL;
    json_array_append_new(cv->messages, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id",
                                                  id, "content", content));
    return 0;
}

/* A reasoning item's text as its turn's reasoning_content. Its summary is taken as it comes
 * (this server writes none); encrypted reasoning cannot be read here. */
static int reasoning_item(json_t *it, const char *at, convert *cv, base_err *err) {
    static const char *const keys[] = {"type",   "id", "summary", "content", "encrypted_content",
                                       "status", NULL};
    static const char *const part_keys[] = {"type", "text", NULL};
    if (server_known_keys(it, at, keys, err)) return -1;
    if (server_json_field(it, "encrypted_content"))
        return base_fail(err,
                         "'%s.encrypted_content' is not supported (this server encrypts "
                         "nothing; send the reasoning as content)",
                         at);
    json_t *content = server_json_field(it, "content"), *summary = server_json_field(it, "summary");
    if ((content && !json_is_array(content)) || (summary && !json_is_array(summary)))
        return base_fail(err, "'%s.content' and '%s.summary' must be arrays", at, at);
    size_t i, n = 0;
    json_t *p;
    char *joined = base_xstrdup("");
    int rc = 0;
    json_array_foreach(content, i, p) {
        char where[160];
        snprintf(where, sizeof where, "%s.content[%zu]", at, i);
        const char *type = type_of(p);
        json_t *text = json_object_get(p, "text");
        if (!type || strcmp(type, "reasoning_text") != 0 || !json_is_string(text)) {
            rc =
                base_fail(err, "'%s' must be {\"type\": \"reasoning_text\", \"text\": ...}", where);
            break;
        }
        if ((rc = server_known_keys(p, where, part_keys, err))) break;
        size_t k = json_string_length(text);
        joined = base_xrealloc(joined, n + k + 1);
        memcpy(joined + n, json_string_value(text), k + 1);
        n += k;
    }
    bool fresh = cv->said || (cv->turn && json_object_get(cv->turn, "reasoning_content"));
    if (!rc) json_object_set_new(turn(cv, fresh), "reasoning_content", json_stringn(joined, n));
    free(joined);
    return rc;
}

static int add_item(json_t *it, const char *at, convert *cv, base_err *err) {
    if (!json_is_object(it)) return base_fail(err, "'%s' must be an object", at);
    const char *type = type_of(it);
    /* a message may leave its type out (the SDKs' EasyInputMessage) */
    if (!type || strcmp(type, "message") == 0) return message_item(it, at, cv, err);
    if (strcmp(type, "function_call") == 0) return call_item(it, at, cv, err);
    if (strcmp(type, "function_call_output") == 0) return call_output_item(it, at, cv, err);
    if (strcmp(type, "reasoning") == 0) return reasoning_item(it, at, cv, err);
    return base_fail(err,
                     "'%s': '%s' items are not supported (message, function_call, "
                     "function_call_output and reasoning are)",
                     at, type);
}

/* The conversation's items: the stored ones of previous_response_id, then the input (a string
 * is one user message). */
static int gather_items(json_t *b, server_store *store, json_t **items, size_t *n_prev,
                        base_err *err) {
    json_t *prev = server_json_field(b, "previous_response_id"),
           *input = json_object_get(b, "input");
    *items = NULL;
    *n_prev = 0;
    if (prev && !json_is_string(prev))
        return base_fail(err, "'previous_response_id' must be a string");
    if (prev && !(*items = server_store_get(store, json_string_value(prev), false)))
        return base_fail(err,
                         "'previous_response_id': no stored response '%s' (unknown, stored with "
                         "store false, or gone: responses are kept %.0f s, %d at most)",
                         json_string_value(prev), SERVER_RESPONSES_TTL_S, SERVER_RESPONSES_MAX);
    if (!*items) *items = json_array();
    *n_prev = json_array_size(*items);
    if (json_is_string(input) && json_string_length(input)) {
        json_array_append_new(*items, json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user",
                                                "content", input));
        return 0;
    }
    if (!json_is_array(input) || !json_array_size(input))
        return base_fail(err, "'input' is required: a non-empty string or array of items");
    json_array_extend(*items, input);
    return 0;
}

/* The chat messages of the conversation, after the instructions. */
static int add_messages(json_t *b, json_t *items, size_t n_prev, json_t *messages, base_err *err) {
    json_t *ins = server_json_field(b, "instructions");
    if (ins && !json_is_string(ins)) return base_fail(err, "'instructions' must be a string");
    if (ins)
        json_array_append_new(messages, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    convert cv = {messages, NULL, false};
    size_t i;
    json_t *it;
    char at[64];
    json_array_foreach(items, i, it) {
        if (i < n_prev)
            snprintf(at, sizeof at, "previous_response_id's item[%zu]", i);
        else
            snprintf(at, sizeof at, "input[%zu]", i - n_prev);
        if (add_item(it, at, &cv, err)) return -1;
    }
    return 0;
}

/* A function tool as the chat API's; every built-in tool is refused by its type. */
static int add_tool(json_t *t, size_t i, json_t *out, base_err *err) {
    static const char *const keys[] = {"type", "name", "description", "parameters", "strict", NULL};
    char at[32];
    snprintf(at, sizeof at, "tools[%zu]", i);
    const char *type = type_of(t);
    if (!json_is_object(t) || !type)
        return base_fail(err, "'%s' must be an object with a type", at);
    if (strcmp(type, "function") != 0)
        return base_fail(err, "'%s': the built-in tool '%s' is not supported (function tools are)",
                         at, type);
    if (server_known_keys(t, at, keys, err)) return -1;
    json_t *fn = json_object();
    static const char *const copied[] = {"name", "description", "parameters", "strict"};
    for (size_t k = 0; k < sizeof copied / sizeof *copied; k++)
        if (server_json_field(t, copied[k]))
            json_object_set(fn, copied[k], server_json_field(t, copied[k]));
    json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    return 0;
}

/* tool_choice auto, none, required or {"type": "function", "name"}; the built-in tools' and
 * allowed_tools' forms are refused. */
static int add_tool_choice(json_t *b, json_t *chat, base_err *err) {
    static const char *const keys[] = {"type", "name", NULL};
    json_t *tc = server_json_field(b, "tool_choice");
    if (!tc) return 0;
    if (json_is_string(tc)) {
        json_object_set(chat, "tool_choice", tc);
        return 0;
    }
    const char *type = type_of(tc);
    json_t *name = json_object_get(tc, "name");
    if (!type || strcmp(type, "function") != 0)
        return base_fail(err,
                         "'tool_choice' must be auto, none, required or {\"type\": "
                         "\"function\", \"name\": ...} (not type '%s')",
                         type ? type : "none");
    if (server_known_keys(tc, "tool_choice", keys, err)) return -1;
    if (!json_is_string(name)) return base_fail(err, "'tool_choice.name' must be a string");
    json_object_set_new(chat, "tool_choice",
                        json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name));
    return 0;
}

/* text.format: text, json_object, or json_schema (enforced by its grammar). */
static int add_text(json_t *b, json_t *chat, base_err *err) {
    static const char *const keys[] = {"format", NULL};
    static const char *const schema_keys[] = {"type",        "name",   "schema",
                                              "description", "strict", NULL};
    static const char *const plain_keys[] = {"type", NULL};
    json_t *t = server_json_field(b, "text");
    if (!t) return 0;
    if (!json_is_object(t)) return base_fail(err, "'text' must be an object");
    if (server_known_keys(t, "text", keys, err)) return -1;
    json_t *f = server_json_field(t, "format");
    if (!f) return 0;
    const char *type = type_of(f);
    bool schema = type && strcmp(type, "json_schema") == 0;
    if (!schema && !(type && (strcmp(type, "text") == 0 || strcmp(type, "json_object") == 0)))
        return base_fail(err, "'text.format.type' must be text, json_object or json_schema");
    if (server_known_keys(f, "text.format", schema ? schema_keys : plain_keys, err)) return -1;
    if (!schema) {
        json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", type));
        return 0;
    }
    if (!json_is_object(server_json_field(f, "schema")))
        return base_fail(err, "'text.format.schema' must be a JSON Schema object");
    json_t *js = json_deep_copy(f);
    json_object_del(js, "type");
    json_object_set_new(chat, "response_format",
                        json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

/* reasoning.effort as the template's switches: none turns thinking off (enable_thinking, as
 * Qwen3's templates read it), another effort turns it on and is reasoning_effort (as gpt-oss's
 * read it). Summaries are not written. */
static int add_reasoning(json_t *b, json_t *chat, base_err *err) {
    static const char *const keys[] = {"effort", "summary", NULL};
    static const char *const efforts[] = {"none", "minimal", "low", "medium", "high"};
    json_t *r = server_json_field(b, "reasoning");
    if (!r) return 0;
    if (!json_is_object(r)) return base_fail(err, "'reasoning' must be an object");
    if (server_known_keys(r, "reasoning", keys, err)) return -1;
    if (server_json_field(r, "summary"))
        return base_fail(err, "'reasoning.summary' is not supported (no summaries are written: "
                              "the reasoning comes whole as reasoning_text)");
    const char *e = json_string_value(server_json_field(r, "effort"));
    bool known = false;
    for (size_t i = 0; e && i < sizeof efforts / sizeof *efforts; i++)
        known = known || strcmp(e, efforts[i]) == 0;
    if (server_json_field(r, "effort") && !known)
        return base_fail(err, "'reasoning.effort' must be none, minimal, low, medium or high");
    if (!e) return 0;
    bool on = strcmp(e, "none") != 0;
    json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", on));
    if (on) json_object_set_new(chat, "reasoning_effort", json_string(e));
    return 0;
}

/* max_output_tokens, temperature, top_p, parallel_tool_calls and stream, which the chat code
 * checks under its own names; store and metadata, which change no answer. */
static int add_plain(json_t *b, json_t *chat, base_err *err) {
    json_t *max = server_json_field(b, "max_output_tokens"), *store = server_json_field(b, "store");
    json_t *meta = server_json_field(b, "metadata");
    if (max && !(json_is_integer(max) && json_integer_value(max) > 0))
        return base_fail(err, "'max_output_tokens' must be a positive integer");
    if (max) json_object_set(chat, "max_tokens", max);
    if (store && !json_is_boolean(store)) return base_fail(err, "'store' must be true or false");
    const char *key;
    json_t *v;
    if (meta && !json_is_object(meta))
        return base_fail(err, "'metadata' must be an object of strings");
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v)) return base_fail(err, "'metadata.%s' must be a string", key);
    }
    static const char *const same[] = {"temperature", "top_p", "parallel_tool_calls", "stream"};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++)
        if (server_json_field(b, same[k]))
            json_object_set(chat, same[k], server_json_field(b, same[k]));
    return 0;
}

/* The request's fields as the response repeats them, with the values that were used where the
 * request left one out. */
static json_t *echo_fields(json_t *b, const server_options *o) {
    json_t *e = json_object();
    static const char *const keys[] = {"instructions", "max_output_tokens", "previous_response_id"};
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++)
        json_object_set_new(e, keys[k],
                            server_json_field(b, keys[k])
                                ? json_deep_copy(server_json_field(b, keys[k]))
                                : json_null());
    json_object_set_new(e, "tools",
                        server_json_field(b, "tools")
                            ? json_deep_copy(server_json_field(b, "tools"))
                            : json_array());
    json_object_set_new(e, "tool_choice",
                        server_json_field(b, "tool_choice")
                            ? json_deep_copy(server_json_field(b, "tool_choice"))
                            : json_string("auto"));
    json_object_set_new(e, "parallel_tool_calls",
                        json_boolean(!json_is_false(server_json_field(b, "parallel_tool_calls"))));
    json_object_set_new(e, "temperature",
                        server_json_field(b, "temperature")
                            ? json_copy(server_json_field(b, "temperature"))
                            : json_real(o->defaults.temperature));
    json_object_set_new(e, "top_p",
                        server_json_field(b, "top_p") ? json_copy(server_json_field(b, "top_p"))
                                                      : json_real(o->defaults.top_p));
    json_t *text = server_json_field(json_object_get(b, "text"), "format");
    json_object_set_new(
        e, "text",
        json_pack("{s:o}", "format",
                  text ? json_deep_copy(text) : json_pack("{s:s}", "type", "text")));
    json_object_set_new(e, "reasoning",
                        json_pack("{s:O,s:n}", "effort",
                                  server_json_field(json_object_get(b, "reasoning"), "effort")
                                      ? server_json_field(json_object_get(b, "reasoning"), "effort")
                                      : json_null(),
                                  "summary"));
    json_object_set_new(e, "store", json_boolean(!json_is_false(server_json_field(b, "store"))));
    json_object_set_new(e, "metadata",
                        server_json_field(b, "metadata")
                            ? json_deep_copy(server_json_field(b, "metadata"))
                            : json_object());
    return e;
}

int server_responses_to_chat(json_t *b, const server_options *o, server_store *store, json_t **chat,
                             json_t **echo, json_t **input, base_err *err) {
    static const char *const keys[] = {"model",
                                       "input",
                                       "instructions",
                                       "tools",
                                       "tool_choice",
                                       "parallel_tool_calls",
                                       "max_output_tokens",
                                       "temperature",
                                       "top_p",
                                       "text",
                                       "reasoning",
                                       "previous_response_id",
                                       "store",
                                       "metadata",
                                       "stream",
                                       NULL};
    *chat = json_pack("{s:[]}", "messages");
    *echo = *input = NULL;
    size_t n_prev;
    if (server_known_keys(b, "", keys, err)) return -1;
    if (!json_is_string(json_object_get(b, "model")))
        return base_fail(err, "'model' is required: a string");
    if (add_plain(b, *chat, err) || server_map_tools(b, *chat, add_tool, err) ||
        add_tool_choice(b, *chat, err) || add_text(b, *chat, err) || add_reasoning(b, *chat, err) ||
        gather_items(b, store, input, &n_prev, err) ||
        add_messages(b, *input, n_prev, json_object_get(*chat, "messages"), err))
        return -1;
    *echo = echo_fields(b, o);
    return 0;
}

bool server_is_responses_route(const char *url) {
    return strcmp(url, "/v1/responses") == 0 || strcmp(url, "/responses") == 0;
}

bool server_is_response_id_route(const char *method, const char *url) {
    bool ok = strcmp(method, "GET") == 0 || strcmp(method, "DELETE") == 0;
    const char *id = strncmp(url, "/v1/", 4) == 0 ? url + 3 : url;
    return ok && strncmp(id, "/responses/", 11) == 0 && id[11] && !strchr(id + 11, '/');
}

static enum MHD_Result on_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    (void)kind;
    (void)value;
    *(const char **)cls = key;
    return MHD_NO;
}

/* GET /v1/responses/{id}: the stored response as it was answered; DELETE forgets it, as
 * OpenAI's API answers it. Neither takes query parameters (retrieve's include, stream and
 * starting_after are not served). */
enum MHD_Result server_route_response_id(server *s, struct MHD_Connection *c, const char *method,
                                         const char *url) {
    const char *id = url + (strncmp(url, "/v1/", 4) == 0 ? 3 : 0) + strlen("/responses/");
    const char *arg = NULL;
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, on_query_arg, &arg);
    if (arg)
        return server_reply_error(s, c, 400, "invalid_request_error",
                                  "'%s' is not supported on /v1/responses/{id}", arg);
    bool del = strcmp(method, "DELETE") == 0;
    json_t *r = del ? NULL : server_store_get(s->responses, id, true);
    if (del ? !server_store_delete(s->responses, id) : !r)
        return server_reply_error(s, c, 404, "invalid_request_error",
                                  "No response found with id '%s' (unknown, stored with store "
                                  "false, deleted, or gone: responses are kept %.0f s, %d at most)",
                                  id, SERVER_RESPONSES_TTL_S, SERVER_RESPONSES_MAX);
    if (del) r = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", true);
    return server_reply_json(s, c, 200, r);
}

enum MHD_Result server_route_responses(server *s, struct MHD_Connection *c, const char *version,
                                       json_t *body, server_exchange *x) {
    server_options o = server_options_now(s);
    server_params p;
    memset(&p, 0, sizeof p);
    json_t *chat = NULL, *echo = NULL, *input = NULL;
    base_err err;
    int vocab = model_config(s->rt->model)->vocab_size;
    if (server_responses_to_chat(body, &o, s->responses, &chat, &echo, &input, &err) ||
        server_params_parse(chat, SERVER_CHAT, &o, s->pr, vocab, s->rt->kv_plan.ctx_size, &p,
                            &err)) {
        server_params_free(&p);
        json_decref(chat);
        json_decref(echo);
        json_decref(input);
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    }
    server_responses_req r = {
        .model_id = s->o.model_id,
        .echo = echo,
        .input = input,
        .store = json_is_false(server_json_field(body, "store")) ? NULL : s->responses};
    server_writer w = server_responses_writer(&r);
    json_decref(chat);
    return server_generate(s, c, version, &p, &w, x);
}
