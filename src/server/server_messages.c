/* Anthropic's Messages API over the chat machinery: POST /v1/messages and
 * /v1/messages/count_tokens. A request is checked field by field against what is implemented
 * (any other field is a 400 naming it, never ignored), then put as the OpenAI chat request that
 * means the same: system and text blocks as messages and content parts, tool_use blocks as an
 * assistant's tool_calls, tool_result blocks as tool messages, thinking blocks as
 * reasoning_content, tools as functions and tool_choice as OpenAI spells it. The chat code then
 * renders, constrains and parses it as it does its own requests, so that both APIs give the same
 * answer to the same conversation; server_messages_out.c writes it in Anthropic's shapes. */
#include "server/server_messages.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cache_control asks for the prompt up to here to be cached, which the prefix cache does for
 * every prompt: it is checked and taken as met. */
static int check_cache(json_t *o, const char *at, base_err *err) {
    static const char *const keys[] = {"type", "ttl", NULL};
    json_t *cc = server_json_field(o, "cache_control");
    if (!cc) return 0;
    const char *type = json_string_value(json_object_get(cc, "type"));
    json_t *ttl = server_json_field(cc, "ttl");
    char where[160];
    snprintf(where, sizeof where, "%s%scache_control", at, *at ? "." : "");
    if (!json_is_object(cc) || !type || strcmp(type, "ephemeral") != 0)
        return base_fail(err, "'%s' must be {\"type\": \"ephemeral\"}", where);
    if (server_known_keys(cc, where, keys, err)) return -1;
    if (ttl && !(json_is_string(ttl) && (strcmp(json_string_value(ttl), "5m") == 0 ||
                                         strcmp(json_string_value(ttl), "1h") == 0)))
        return base_fail(err, "'%s.ttl' must be 5m or 1h", where);
    return 0;
}

static const char *block_type(json_t *b) {
    return json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
}

/* A text block, appended to parts as an OpenAI text part. */
static int text_block(json_t *b, const char *at, json_t *parts, base_err *err) {
    static const char *const keys[] = {"type", "text", "cache_control", "citations", NULL};
    json_t *text = json_object_get(b, "text");
    if (server_known_keys(b, at, keys, err) || check_cache(b, at, err)) return -1;
    if (!json_is_string(text)) return base_fail(err, "'%s.text' must be a string", at);
    if (server_json_field(b, "citations"))
        return base_fail(err, "'%s.citations' is not supported", at);
    json_array_append_new(parts, json_pack("{s:s,s:O}", "type", "text", "text", text));
    return 0;
}

/* The blocks of a system prompt or a tool result that may only be text, as OpenAI parts. */
static int text_blocks(json_t *blocks, const char *at, json_t **parts, base_err *err) {
    *parts = json_array();
    size_t i;
    json_t *b;
    char where[160];
    json_array_foreach(blocks, i, b) {
        snprintf(where, sizeof where, "%s[%zu]", at, i);
        const char *type = block_type(b);
        if (!type || strcmp(type, "text") != 0)
            return base_fail(err, "'%s' must be a text block (type '%s' is not supported here)",
                             where, type ? type : "none");
        if (text_block(b, where, *parts, err)) return -1;
    }
    return 0;
}

static int add_system(json_t *sys, json_t *out, base_err *err) {
    if (!sys) return 0;
    json_t *parts = NULL;
    if (!json_is_string(sys) && !json_is_array(sys))
        return base_fail(err, "'system' must be a string or an array of text blocks");
    if (json_is_array(sys) && text_blocks(sys, "system", &parts, err)) {
        json_decref(parts);
        return -1;
    }
    json_array_append_new(
        out, json_pack("{s:s,s:o}", "role", "system", "content", parts ? parts : json_incref(sys)));
    return 0;
}

/* A tool result as a tool message. Its text is what the tool said; is_error is said in words,
 * since chat templates have no place for it. */
static int tool_result(json_t *b, const char *at, json_t *out, base_err *err) {
    static const char *const keys[] = {"type",     "tool_use_id",   "content",
                                       "is_error", "cache_control", NULL};
    json_t *id = json_object_get(b, "tool_use_id"), *content = server_json_field(b, "content");
    json_t *is_error = server_json_field(b, "is_error"), *parts = NULL;
    if (server_known_keys(b, at, keys, err) || check_cache(b, at, err)) return -1;
    if (!json_is_string(id)) return base_fail(err, "'%s.tool_use_id' must be a string", at);
    if (is_error && !json_is_boolean(is_error))
        return base_fail(err, "'%s.is_error' must be true or false", at);
    char where[160];
    snprintf(where, sizeof where, "%s.content", at);
    if (content && !json_is_string(content) && !json_is_array(content))
        return base_fail(err, "'%s' must be a string or an array of text blocks", where);
    if (json_is_array(content) && text_blocks(content, where, &parts, err)) {
        json_decref(parts);
        return -1;
    }
    if (!parts)
        parts = json_pack("[{s:s,s:s}]", "type", "text", "text",
                          content ? json_string_value(content) : "");
    if (json_is_true(is_error))
        json_array_insert_new(parts, 0, json_pack("{s:s,s:s}", "type", "text", "text", "Error:"));
    json_array_append_new(
        out, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", parts));
    return 0;
}

/* A user message: its text blocks as a user message, each tool_result as a tool message, in
 * their order. */
static int user_message(json_t *content, size_t i, json_t *out, base_err *err) {
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "user", "content", content));
        return 0;
    }
    json_t *parts = json_array();
    size_t j;
    json_t *b;
    char at[96];
    json_array_foreach(content, j, b) {
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, j);
        const char *type = block_type(b);
        int rc;
        if (type && strcmp(type, "text") == 0) {
            rc = text_block(b, at, parts, err);
        } else if (type && strcmp(type, "tool_result") == 0) {
            if (json_array_size(parts)) {
                json_array_append_new(out,
                                      json_pack("{s:s,s:o}", "role", "user", "content", parts));
                parts = json_array();
            }
            rc = tool_result(b, at, out, err);
        } else {
            rc = base_fail(err,
                           "'%s': '%s' blocks are not supported in a user message (text and "
                           "tool_result are; this model takes text only)",
                           at, type ? type : "untyped");
        }
        if (rc) {
            json_decref(parts);
            return -1;
        }
    }
    if (json_array_size(parts))
        json_array_append_new(out, json_pack("{s:s,s:o}", "role", "user", "content", parts));
    else
        json_decref(parts);
    return 0;
}

static int tool_use(json_t *b, const char *at, json_t *calls, base_err *err) {
    static const char *const keys[] = {"type", "id", "name", "input", "cache_control", NULL};
    json_t *id = json_object_get(b, "id"), *name = json_object_get(b, "name");
    json_t *input = json_object_get(b, "input");
    if (server_known_keys(b, at, keys, err) || check_cache(b, at, err)) return -1;
    if (!json_is_string(id) || !json_is_string(name) || !json_is_object(input))
        return base_fail(err, "'%s' must have a string 'id' and 'name' and an object 'input'", at);
    json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function",
                                           "function", "name", name, "arguments", input));
    return 0;
}

/* The text of a thinking block, appended to *reasoning. Its signature is taken as it comes:
 * this server signs nothing, and the text alone is what the template shows. */
static int thinking_block(json_t *b, const char *at, json_t **reasoning, base_err *err) {
    static const char *const keys[] = {"type", "thinking", "signature", NULL};
    json_t *t = json_object_get(b, "thinking"), *sig = server_json_field(b, "signature");
    if (server_known_keys(b, at, keys, err)) return -1;
    if (!json_is_string(t) || (sig && !json_is_string(sig)))
        return base_fail(err, "'%s' must have a string 'thinking' and 'signature'", at);
    if (!*reasoning) {
        *reasoning = json_copy(t);
        return 0;
    }
    size_t a = json_string_length(*reasoning), n = json_string_length(t);
    char *joined = base_xmalloc(a + n + 1);
    memcpy(joined, json_string_value(*reasoning), a);
    memcpy(joined + a, json_string_value(t), n);
    json_decref(*reasoning);
    *reasoning = json_stringn(joined, a + n);
    free(joined);
    return 0;
}

/* An assistant message: text blocks as its content, tool_use blocks as its tool_calls, thinking
 * blocks as its reasoning_content. */
static int assistant_message(json_t *content, size_t i, json_t *out, base_err *err) {
    if (json_is_string(content)) {
        json_array_append_new(out, json_pack("{s:s,s:O}", "role", "assistant", "content", content));
        return 0;
    }
    json_t *parts = json_array(), *calls = json_array(), *reasoning = NULL;
    size_t j;
    json_t *b;
    char at[96];
    int rc = 0;
    json_array_foreach(content, j, b) {
        snprintf(at, sizeof at, "messages[%zu].content[%zu]", i, j);
        const char *type = block_type(b);
        if (type && strcmp(type, "text") == 0)
            rc = text_block(b, at, parts, err);
        else if (type && strcmp(type, "tool_use") == 0)
            rc = tool_use(b, at, calls, err);
        else if (type && strcmp(type, "thinking") == 0)
            rc = thinking_block(b, at, &reasoning, err);
        else
            rc = base_fail(err,
                           "'%s': '%s' blocks are not supported in an assistant message (text, "
                           "tool_use and thinking are)",
                           at, type ? type : "untyped");
        if (rc) break;
    }
    if (rc) {
        json_decref(parts);
        json_decref(calls);
        json_decref(reasoning);
        return -1;
    }
    json_t *m = json_pack("{s:s,s:o}", "role", "assistant", "content", parts);
    if (json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    if (reasoning) json_object_set_new(m, "reasoning_content", reasoning);
    json_decref(calls);
    json_array_append_new(out, m);
    return 0;
}

static int add_messages(json_t *messages, json_t *out, base_err *err) {
    static const char *const keys[] = {"role", "content", NULL};
    if (!json_is_array(messages) || !json_array_size(messages))
        return base_fail(err, "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    char at[32];
    json_array_foreach(messages, i, m) {
        snprintf(at, sizeof at, "messages[%zu]", i);
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!json_is_object(m) || !role)
            return base_fail(err, "'%s' must be an object with a string 'role'", at);
        if (server_known_keys(m, at, keys, err)) return -1;
        if (!json_is_string(content) && !(json_is_array(content) && json_array_size(content)))
            return base_fail(err, "'%s.content' must be a string or a non-empty array of blocks",
                             at);
        bool user = strcmp(role, "user") == 0;
        if (!user && strcmp(role, "assistant") != 0)
            return base_fail(err, "'%s.role' must be user or assistant (not '%s')", at, role);
        if (user ? user_message(content, i, out, err) : assistant_message(content, i, out, err))
            return -1;
    }
    return 0;
}

/* A custom tool as an OpenAI function; Anthropic's server tools (a `type` other than custom)
 * are not implemented. */
static int add_tool(json_t *t, size_t i, json_t *out, base_err *err) {
    static const char *const keys[] = {"type",   "name",          "description", "input_schema",
                                       "strict", "cache_control", NULL};
    char at[32];
    snprintf(at, sizeof at, "tools[%zu]", i);
    const char *type = json_string_value(server_json_field(t, "type"));
    if (!json_is_object(t)) return base_fail(err, "'%s' must be an object", at);
    if (type && strcmp(type, "custom") != 0)
        return base_fail(err, "'%s': the server tool '%s' is not supported (custom tools are)", at,
                         type);
    if (server_known_keys(t, at, keys, err) || check_cache(t, at, err)) return -1;
    json_t *name = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
    json_t *desc = server_json_field(t, "description"), *strict = server_json_field(t, "strict");
    if (!json_is_string(name)) return base_fail(err, "'%s.name' must be a string", at);
    if (!json_is_object(schema))
        return base_fail(err, "'%s.input_schema' must be a JSON Schema object", at);
    if (desc && !json_is_string(desc))
        return base_fail(err, "'%s.description' must be a string", at);
    if (strict && !json_is_boolean(strict))
        return base_fail(err, "'%s.strict' must be true or false", at);
    /* in the order OpenAI's clients write, which templates that dump a tool whole show */
    json_t *fn = json_pack("{s:O}", "name", name);
    if (desc) json_object_set(fn, "description", desc);
    json_object_set(fn, "parameters", schema);
    if (strict) json_object_set(fn, "strict", strict);
    json_array_append_new(out, json_pack("{s:s,s:o}", "type", "function", "function", fn));
    return 0;
}

/* tool_choice auto, any, tool (by name) and none as OpenAI's auto, required, a named function
 * and none; disable_parallel_tool_use as parallel_tool_calls false. */
static int add_tool_choice(json_t *b, json_t *chat, base_err *err) {
    static const char *const keys[] = {"type", "name", "disable_parallel_tool_use", NULL};
    json_t *tc = server_json_field(b, "tool_choice");
    if (!tc) return 0;
    const char *type = json_string_value(json_object_get(tc, "type"));
    json_t *name = server_json_field(tc, "name"),
           *serial = server_json_field(tc, "disable_parallel_tool_use");
    if (!type) return base_fail(err, "'tool_choice' must be {\"type\": auto, any, tool or none}");
    if (server_known_keys(tc, "tool_choice", keys, err)) return -1;
    bool named = strcmp(type, "tool") == 0;
    if (named != (name != NULL) || (name && !json_is_string(name)))
        return base_fail(err, "'tool_choice.name' is the tool's name, with type tool only");
    if (serial && !json_is_boolean(serial))
        return base_fail(err, "'tool_choice.disable_parallel_tool_use' must be true or false");
    json_t *choice = named
                         ? json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name)
                     : strcmp(type, "auto") == 0 ? json_string("auto")
                     : strcmp(type, "any") == 0  ? json_string("required")
                     : strcmp(type, "none") == 0 ? json_string("none")
                                                 : NULL;
    if (!choice)
        return base_fail(err, "'tool_choice.type' must be auto, any, tool or none (not '%s')",
                         type);
    json_object_set_new(chat, "tool_choice", choice);
    if (json_is_true(serial)) json_object_set_new(chat, "parallel_tool_calls", json_false());
    return 0;
}

/* thinking enabled (with a budget of thinking tokens), adaptive (no budget) or disabled, as the
 * template's enable_thinking and the request's reasoning budget. */
static int add_thinking(json_t *b, json_t *kwargs, server_options *o, base_err *err) {
    static const char *const with_budget[] = {"type", "budget_tokens", NULL};
    static const char *const plain[] = {"type", NULL};
    json_t *t = server_json_field(b, "thinking");
    if (!t) return 0;
    const char *type = json_string_value(json_object_get(t, "type"));
    if (!type)
        return base_fail(err, "'thinking' must be {\"type\": enabled, adaptive or disabled}");
    bool enabled = strcmp(type, "enabled") == 0;
    if (!enabled && strcmp(type, "adaptive") != 0 && strcmp(type, "disabled") != 0)
        return base_fail(err, "'thinking.type' must be enabled, adaptive or disabled (not '%s')",
                         type);
    if (server_known_keys(t, "thinking", enabled ? with_budget : plain, err)) return -1;
    json_object_set_new(kwargs, "enable_thinking", json_boolean(strcmp(type, "disabled") != 0));
    if (!enabled) return 0;
    json_t *budget = json_object_get(t, "budget_tokens"), *max = server_json_field(b, "max_tokens");
    json_int_t n = json_integer_value(budget);
    if (!json_is_integer(budget) || n < 1 || n > INT32_MAX)
        return base_fail(err, "'thinking.budget_tokens' must be a positive integer");
    if (json_is_integer(max) && n >= json_integer_value(max))
        return base_fail(err, "'thinking.budget_tokens' must be less than 'max_tokens'");
    o->has_reasoning_budget = true;
    o->reasoning_budget = (int)n;
    return 0;
}

/* output_config: effort as reasoning_effort, format (a JSON Schema) as response_format. */
static int add_output_config(json_t *b, json_t *chat, base_err *err) {
    static const char *const keys[] = {"effort", "format", NULL};
    static const char *const format_keys[] = {"type", "schema", NULL};
    json_t *oc = server_json_field(b, "output_config");
    if (!oc) return 0;
    if (!json_is_object(oc)) return base_fail(err, "'output_config' must be an object");
    if (server_known_keys(oc, "output_config", keys, err)) return -1;
    json_t *effort = server_json_field(oc, "effort"), *format = server_json_field(oc, "format");
    const char *e = json_string_value(effort);
    if (effort &&
        !(e && (strcmp(e, "low") == 0 || strcmp(e, "medium") == 0 || strcmp(e, "high") == 0)))
        return base_fail(err, "'output_config.effort' must be low, medium or high here");
    if (effort) json_object_set(chat, "reasoning_effort", effort);
    if (!format) return 0;
    const char *type = json_string_value(json_object_get(format, "type"));
    json_t *schema = json_object_get(format, "schema");
    if (!type || strcmp(type, "json_schema") != 0 || !json_is_object(schema))
        return base_fail(err, "'output_config.format' must be {\"type\": \"json_schema\", "
                              "\"schema\": {...}}");
    if (server_known_keys(format, "output_config.format", format_keys, err)) return -1;
    json_object_set_new(chat, "response_format",
                        json_pack("{s:s,s:{s:s,s:O}}", "type", "json_schema", "json_schema", "name",
                                  "output", "schema", schema));
    return 0;
}

/* metadata.user_id is for Anthropic's abuse tracking and changes no answer: it is checked and
 * taken. */
static int check_metadata(json_t *b, base_err *err) {
    static const char *const keys[] = {"user_id", NULL};
    json_t *m = server_json_field(b, "metadata");
    if (!m) return 0;
    json_t *user = server_json_field(m, "user_id");
    if (!json_is_object(m) || (user && !json_is_string(user)))
        return base_fail(err, "'metadata' must be {\"user_id\": a string}");
    return server_known_keys(m, "metadata", keys, err);
}

/* max_tokens (required), stop_sequences, temperature, top_p, top_k and stream. */
static int add_sampling(json_t *b, json_t *chat, base_err *err) {
    json_t *max = server_json_field(b, "max_tokens"),
           *stop = server_json_field(b, "stop_sequences");
    if (!json_is_integer(max) || json_integer_value(max) < 1)
        return base_fail(err, "'max_tokens' is required: a positive integer");
    json_object_set(chat, "max_tokens", max);
    if (stop && !json_is_array(stop))
        return base_fail(err, "'stop_sequences' must be an array of strings");
    if (json_array_size(stop) > SERVER_MAX_STOP)
        return base_fail(err, "'stop_sequences' holds more than %d strings", SERVER_MAX_STOP);
    size_t i;
    json_t *s;
    json_array_foreach(stop, i, s) {
        if (!json_is_string(s) || !json_string_length(s))
            return base_fail(err, "'stop_sequences[%zu]' must be a non-empty string", i);
    }
    if (json_array_size(stop)) json_object_set(chat, "stop", stop);
    /* Anthropic's range for temperature; the others the chat code checks by the same name */
    json_t *temp = server_json_field(b, "temperature");
    if (temp &&
        !(json_is_number(temp) && json_number_value(temp) >= 0 && json_number_value(temp) <= 1))
        return base_fail(err, "'temperature' must be a number in [0, 1]");
    static const char *const same[] = {"temperature", "top_p", "top_k", "stream"};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++)
        if (server_json_field(b, same[k]))
            json_object_set(chat, same[k], server_json_field(b, same[k]));
    return 0;
}

int server_messages_to_chat(json_t *b, bool counting, server_options *o, json_t **chat,
                            base_err *err) {
    static const char *const create_keys[] = {
        "model",       "max_tokens",    "messages",      "system", "stop_sequences", "stream",
        "temperature", "top_p",         "top_k",         "tools",  "tool_choice",    "thinking",
        "metadata",    "cache_control", "output_config", NULL};
    static const char *const count_keys[] = {"model",         "messages",      "system",
                                             "tools",         "tool_choice",   "thinking",
                                             "cache_control", "output_config", NULL};
    *chat = json_pack("{s:[],s:{}}", "messages", "chat_template_kwargs");
    json_t *messages = json_object_get(*chat, "messages");
    json_t *kwargs = json_object_get(*chat, "chat_template_kwargs");
    if (server_known_keys(b, "", counting ? count_keys : create_keys, err)) return -1;
    if (!json_is_string(json_object_get(b, "model")))
        return base_fail(err, "'model' is required: a string");
    if ((!counting && add_sampling(b, *chat, err)) || check_metadata(b, err) ||
        check_cache(b, "", err) || add_system(server_json_field(b, "system"), messages, err) ||
        add_messages(json_object_get(b, "messages"), messages, err) ||
        server_map_tools(b, *chat, add_tool, err) || add_tool_choice(b, *chat, err) ||
        add_thinking(b, kwargs, o, err) || add_output_config(b, *chat, err))
        return -1;
    return 0;
}

bool server_is_messages_route(const char *url) {
    return strcmp(url, "/v1/messages") == 0 || strcmp(url, "/v1/messages/count_tokens") == 0;
}

enum MHD_Result server_route_messages(server *s, struct MHD_Connection *c, const char *url,
                                      const char *version, json_t *body, server_exchange *x) {
    bool counting = strcmp(url, "/v1/messages/count_tokens") == 0;
    server_options o = server_options_now(s);
    server_params p;
    memset(&p, 0, sizeof p);
    json_t *chat = NULL;
    base_err err;
    int vocab = model_config(s->rt->model)->vocab_size;
    if (server_messages_to_chat(body, counting, &o, &chat, &err) ||
        server_params_parse(chat, SERVER_CHAT, &o, s->pr, vocab, s->rt->kv_plan.ctx_size, &p,
                            &err)) {
        server_params_free(&p);
        json_decref(chat);
        return server_reply_error_as(s, c, server_messages_error, 400, "invalid_request_error",
                                     "%s", err.msg);
    }
    enum MHD_Result rc;
    if (counting) {
        rc = server_reply_json(s, c, 200, json_pack("{s:i}", "input_tokens", p.prompts[0].n_ids));
        server_params_free(&p);
    } else {
        server_writer w = server_messages_writer(s->o.model_id, p.req.max_tokens);
        rc = server_generate(s, c, version, &p, &w, x);
    }
    json_decref(chat);
    return rc;
}
