/* Messages as OpenAI's clients send them, put as chat templates take them. Templates are
 * written for transformers, whose callers pass plain strings; the SDKs send content as arrays
 * of parts and null content beside tool calls, which most templates cannot take (Qwen3's fails
 * on `'</think>' in None`). vLLM and llama-server normalize the same way before rendering. */
#include "engine/engine.h"

#include <string.h>

static const char *const g_media[] = {"image_url", "input_image", "image", "input_audio",
                                      "audio",     "file",        "video", "video_url"};

/* The text of a content array: its text parts joined with newlines, or the parts themselves
 * (text only) when the template walks them. */
static int content_parts(const json_t *parts, size_t at, bool as_list, json_t **out,
                         base_err *err) {
    json_t *list = json_array();
    size_t j;
    json_t *part;
    json_array_foreach(parts, j, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!json_is_object(part) || !type) {
            json_decref(list);
            return base_fail(err, "'messages[%zu].content[%zu]' must be an object with a 'type'",
                             at, j);
        }
        for (size_t k = 0; k < sizeof g_media / sizeof *g_media; k++)
            if (strcmp(type, g_media[k]) == 0) {
                json_decref(list);
                return base_fail(err,
                                 "'messages[%zu].content[%zu]': this model takes text only "
                                 "('%s' parts are not supported)",
                                 at, j, type);
            }
        json_t *text = json_object_get(part, "text");
        if (strcmp(type, "text") != 0 || !json_is_string(text)) {
            json_decref(list);
            return base_fail(err,
                             "'messages[%zu].content[%zu]' must be {\"type\": \"text\", \"text\": "
                             "a string} (type '%s')",
                             at, j, type);
        }
        json_array_append_new(list, json_pack("{s:s,s:O}", "type", "text", "text", text));
    }
    if (as_list) {
        *out = list;
        return 0;
    }
    size_t total = 0;
    json_array_foreach(list, j, part) total +=
        json_string_length(json_object_get(part, "text")) + 1;
    char *joined = base_xmalloc(total + 1), *w = joined;
    json_array_foreach(list, j, part) {
        const json_t *t = json_object_get(part, "text");
        if (j) *w++ = '\n';
        memcpy(w, json_string_value(t), json_string_length(t));
        w += json_string_length(t);
    }
    *w = 0;
    *out = json_stringn(joined, (size_t)(w - joined));
    free(joined);
    json_decref(list);
    return 0;
}

/* An assistant's tool_calls as templates take them: function.arguments a mapping, where the
 * SDKs send the JSON text of one (templates write `arguments | tojson` or walk its items). */
static int tool_calls(const json_t *calls, size_t at, json_t **out, base_err *err) {
    if (!json_is_array(calls))
        return base_fail(err, "'messages[%zu].tool_calls' must be an array", at);
    json_t *list = json_array();
    size_t j;
    json_t *c;
    json_array_foreach(calls, j, c) {
        json_t *fn = json_object_get(c, "function");
        json_t *args = json_object_get(fn, "arguments");
        json_t *parsed =
            json_is_string(args) ? json_loads(json_string_value(args), 0, NULL) : json_incref(args);
        if (!json_is_object(c) || !json_is_string(json_object_get(fn, "name")) ||
            !json_is_object(parsed)) {
            json_decref(parsed);
            json_decref(list);
            return base_fail(err,
                             "'messages[%zu].tool_calls[%zu]' must be {\"function\": {\"name\": a "
                             "string, \"arguments\": an object or its JSON text}}",
                             at, j);
        }
        json_t *copy = json_deep_copy(c);
        json_object_set_new(json_object_get(copy, "function"), "arguments", parsed);
        json_array_append_new(list, copy);
    }
    *out = list;
    return 0;
}

static int normalize_one(const json_t *m, size_t at, bool as_list, json_t **out, base_err *err) {
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role)
        return base_fail(err, "'messages[%zu]' must be an object with a string 'role'", at);
    if (strcmp(role, "developer") == 0) role = "system";
    if (strcmp(role, "system") != 0 && strcmp(role, "user") != 0 &&
        strcmp(role, "assistant") != 0 && strcmp(role, "tool") != 0)
        return base_fail(err,
                         "'messages[%zu].role' '%s' is not one of system, developer, user, "
                         "assistant and tool",
                         at, role);
    json_t *content = json_object_get(m, "content"), *c = NULL;
    if (!content || json_is_null(content))
        c = json_string("");
    else if (json_is_string(content))
        c = json_incref(content);
    else if (!json_is_array(content))
        return base_fail(err,
                         "'messages[%zu].content' must be a string, null or an array of content "
                         "parts",
                         at);
    else if (content_parts(content, at, as_list, &c, err))
        return -1;
    json_t *calls = json_object_get(m, "tool_calls"), *tc = NULL;
    if (calls && !json_is_null(calls) && tool_calls(calls, at, &tc, err)) {
        json_decref(c);
        return -1;
    }
    json_t *o = json_copy((json_t *)m);
    json_object_set_new(o, "role", json_string(role));
    json_object_set_new(o, "content", c);
    if (tc) json_object_set_new(o, "tool_calls", tc);
    *out = o;
    return 0;
}

int engine_messages_normalize(const json_t *messages, bool content_as_list, json_t **out,
                              base_err *err) {
    if (!json_is_array(messages)) return base_fail(err, "'messages' must be an array");
    json_t *list = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        json_t *o = NULL;
        if (normalize_one(m, i, content_as_list, &o, err)) {
            json_decref(list);
            return -1;
        }
        json_array_append_new(list, o);
    }
    *out = list;
    return 0;
}

engine_chat_options engine_chat_defaults(const json_t *messages) {
    size_t n = json_array_size(messages);
    const char *role =
        n ? json_string_value(json_object_get(json_array_get(messages, n - 1), "role")) : NULL;
    bool prefill = role && strcmp(role, "assistant") == 0;
    return (engine_chat_options){.add_generation_prompt = !prefill,
                                 .continue_final_message = prefill};
}
