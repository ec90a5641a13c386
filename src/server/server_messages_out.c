/* A chat answer in Anthropic's shapes: a message of content blocks (thinking, text, tool_use),
 * streamed as the events Anthropic's SDKs read (message_start, content_block_start,
 * content_block_delta with text_delta, thinking_delta or input_json_delta, content_block_stop,
 * message_delta with the stop_reason and usage, message_stop) or whole. The whole message is
 * the fold of the events its stream would have had, so the two cannot disagree. */
#include "server/server_messages.h"

#include <stdlib.h>
#include <string.h>

typedef enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL } block_kind;

typedef struct msg_state {
    char id[40];
    char *model; /* owned */
    int max_tokens;
    bool started, ended; /* message_start, and the last event (message_stop or error), sent */
    int n_blocks;        /* blocks started */
    block_kind open;     /* the kind of the open block, the last started */
    int n_calls;
    /* Blank text that has opened no block yet: a model often writes a newline before a call,
     * which would otherwise be a text block of nothing. It opens one when text follows, or at
     * the end of an answer without calls. */
    char *held; /* (held_len) owned */
    size_t held_len;
} msg_state;

typedef struct out {
    server_emit_fn *emit;
    void *sink;
} out;

/* One event named by its type, which also leads its data, as Anthropic writes them. */
static void event(const out *o, const char *type, json_t *e) {
    json_t *x = json_pack("{s:s}", "type", type);
    json_object_update(x, e);
    json_decref(e);
    o->emit(o->sink, type, x);
}

static void block_stop(msg_state *m, const out *o) {
    if (m->open == BLOCK_NONE) return;
    event(o, "content_block_stop", json_pack("{s:i}", "index", m->n_blocks - 1));
    m->open = BLOCK_NONE;
}

static void block_start(msg_state *m, const out *o, block_kind kind, json_t *block) {
    block_stop(m, o);
    event(o, "content_block_start",
          json_pack("{s:i,s:o}", "index", m->n_blocks++, "content_block", block));
    m->open = kind;
}

static void delta(msg_state *m, const out *o, json_t *d) {
    event(o, "content_block_delta", json_pack("{s:i,s:o}", "index", m->n_blocks - 1, "delta", d));
}

static void thinking(msg_state *m, const out *o, const char *t, size_t n) {
    /* this server signs nothing: the signature is empty, and taken back as it comes */
    if (m->open != BLOCK_THINKING)
        block_start(
            m, o, BLOCK_THINKING,
            json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", ""));
    delta(m, o, json_pack("{s:s,s:s%}", "type", "thinking_delta", "thinking", t, n));
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

static void text_open(msg_state *m, const out *o) {
    block_start(m, o, BLOCK_TEXT, json_pack("{s:s,s:s}", "type", "text", "text", ""));
    if (m->held_len)
        delta(m, o, json_pack("{s:s,s:s%}", "type", "text_delta", "text", m->held, m->held_len));
    free(m->held);
    m->held = NULL;
    m->held_len = 0;
}

static void text(msg_state *m, const out *o, const char *t, size_t n) {
    if (m->open != BLOCK_TEXT && blank(t, n)) {
        m->held = base_xrealloc(m->held, m->held_len + n);
        memcpy(m->held + m->held_len, t, n);
        m->held_len += n;
        return;
    }
    if (m->open != BLOCK_TEXT) text_open(m, o);
    delta(m, o, json_pack("{s:s,s:s%}", "type", "text_delta", "text", t, n));
}

static void tool_use(msg_state *m, const out *o, const engine_tool_call *c) {
    char id[40];
    server_new_id(id, sizeof id, "toolu_");
    free(m->held);
    m->held = NULL;
    m->held_len = 0;
    m->n_calls++;
    block_start(
        m, o, BLOCK_TOOL,
        json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id", id, "name", c->name, "input"));
    delta(m, o, json_pack("{s:s,s:s}", "type", "input_json_delta", "partial_json", c->arguments));
}

static const char *stop_reason(const msg_state *m, const server_seq *q) {
    if (m->n_calls) return "tool_use";
    if (q->finish == ENGINE_FINISH_LENGTH)
        return q->n_generated >= m->max_tokens ? "max_tokens" : "model_context_window_exceeded";
    return q->stop ? "stop_sequence" : "end_turn";
}

static void finish(msg_state *m, const out *o, const server_seq *q) {
    m->ended = true;
    if (q->finish == ENGINE_FINISH_ERROR || q->finish == ENGINE_FINISH_CANCELLED) {
        bool cut = q->finish == ENGINE_FINISH_CANCELLED;
        const char *msg = cut        ? "the server is stopping: the answer was cut short"
                          : q->error ? q->error
                                     : "generation failed";
        event(o, "error", server_messages_error(cut ? 503 : 500, NULL, msg));
        return;
    }
    if (m->held_len && !m->n_calls) text_open(m, o);
    block_stop(m, o);
    event(o, "message_delta",
          json_pack("{s:{s:s,s:o},s:{s:i}}", "delta", "stop_reason", stop_reason(m, q),
                    "stop_sequence", q->stop ? json_string(q->stop) : json_null(), "usage",
                    "output_tokens", q->n_generated));
    event(o, "message_stop", json_object());
}

static void stream(void *state, const server_seq *q, server_emit_fn *emit, void *sink) {
    msg_state *m = state;
    out o = {emit, sink};
    if (m->ended) return;
    if (!m->started) {
        m->started = true;
        event(&o, "message_start",
              json_pack("{s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:{s:i,s:i}}}", "message", "id", m->id,
                        "type", "message", "role", "assistant", "model", m->model, "content",
                        "stop_reason", "stop_sequence", "usage", "input_tokens", q->n_prompt,
                        "output_tokens", q->n_generated));
    }
    server_news n;
    server_output_news(q->split, q->text, q->len, q->finish != ENGINE_FINISH_NONE, &n);
    if (n.reasoning_len) thinking(m, &o, n.reasoning, n.reasoning_len);
    if (n.content_len) text(m, &o, n.content, n.content_len);
    for (int i = n.first_call; i < n.scan.n_calls; i++) tool_use(m, &o, &n.scan.calls[i]);
    server_news_free(&n);
    if (q->finish != ENGINE_FINISH_NONE) finish(m, &o, q);
}

/* ---- the whole message, folded from the events ---- */

typedef struct fold {
    json_t *msg;   /* the message so far */
    json_t *error; /* an error event */
    json_t *json;  /* (n_blocks) the input_json_delta text of each block, as strings */
} fold;

static void append_text(json_t *o, const char *key, const char *t) {
    const char *a = json_string_value(json_object_get(o, key));
    size_t na = a ? strlen(a) : 0, nt = strlen(t);
    char *joined = base_xmalloc(na + nt + 1);
    memcpy(joined, a ? a : "", na);
    memcpy(joined + na, t, nt + 1);
    json_object_set_new(o, key, json_stringn(joined, na + nt));
    free(joined);
}

static void fold_delta(fold *f, json_t *e) {
    size_t index = (size_t)json_integer_value(json_object_get(e, "index"));
    json_t *block = json_array_get(json_object_get(f->msg, "content"), index);
    json_t *d = json_object_get(e, "delta");
    const char *type = json_string_value(json_object_get(d, "type"));
    if (strcmp(type, "text_delta") == 0)
        append_text(block, "text", json_string_value(json_object_get(d, "text")));
    else if (strcmp(type, "thinking_delta") == 0)
        append_text(block, "thinking", json_string_value(json_object_get(d, "thinking")));
    else
        append_text(json_array_get(f->json, index), "json",
                    json_string_value(json_object_get(d, "partial_json")));
}

static void fold_event(void *sink, const char *name, json_t *e) {
    fold *f = sink;
    json_t *content = json_object_get(f->msg, "content");
    if (strcmp(name, "message_start") == 0) {
        f->msg = json_incref(json_object_get(e, "message"));
    } else if (strcmp(name, "content_block_start") == 0) {
        json_array_append(content, json_object_get(e, "content_block"));
        json_array_append_new(f->json, json_object());
    } else if (strcmp(name, "content_block_delta") == 0) {
        fold_delta(f, e);
    } else if (strcmp(name, "content_block_stop") == 0) {
        /* a tool_use block's input is the JSON its deltas spelled */
        size_t index = (size_t)json_integer_value(json_object_get(e, "index"));
        const char *j = json_string_value(json_object_get(json_array_get(f->json, index), "json"));
        json_t *input = j ? json_loads(j, 0, NULL) : NULL;
        if (input) json_object_set_new(json_array_get(content, index), "input", input);
    } else if (strcmp(name, "message_delta") == 0) {
        json_object_update(f->msg, json_object_get(e, "delta"));
        json_object_update(json_object_get(f->msg, "usage"), json_object_get(e, "usage"));
    } else if (strcmp(name, "error") == 0) {
        f->error = json_incref(e);
    }
    json_decref(e);
}

static json_t *whole(void *state, const server_seq *q, unsigned *status) {
    const msg_state *m = state;
    msg_state fresh = {.model = m->model, .max_tokens = m->max_tokens};
    memcpy(fresh.id, m->id, sizeof fresh.id);
    server_output split = *q->split;
    split.reasoning_sent = split.content_sent = 0;
    split.calls_sent = 0;
    server_seq all = *q;
    all.split = &split;
    fold f = {.json = json_array()};
    stream(&fresh, &all, fold_event, &f);
    free(fresh.held);
    json_decref(f.json);
    if (!f.error) return f.msg;
    json_decref(f.msg);
    *status = q->finish == ENGINE_FINISH_CANCELLED ? 503 : 500;
    return f.error;
}

/* Anthropic's error types, by status (our own types name the same failures in OpenAI's
 * words, and are not needed). */
json_t *server_messages_error(unsigned status, const char *type, const char *msg) {
    static const struct {
        unsigned status;
        const char *type;
    } types[] = {{400, "invalid_request_error"}, {401, "authentication_error"},
                 {403, "permission_error"},      {404, "not_found_error"},
                 {413, "request_too_large"},     {429, "rate_limit_error"},
                 {503, "overloaded_error"}};
    const char *t = "api_error";
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        if (types[i].status == status) t = types[i].type;
    return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type", t, "message", msg);
}

static void free_state(void *state) {
    msg_state *m = state;
    free(m->model);
    free(m->held);
    free(m);
}

server_writer server_messages_writer(const char *model_id, int max_tokens) {
    msg_state *m = base_xcalloc(1, sizeof *m);
    server_new_id(m->id, sizeof m->id, "msg_");
    m->model = base_xstrdup(model_id);
    m->max_tokens = max_tokens;
    return (server_writer){.state = m,
                           .stream = stream,
                           .whole = whole,
                           .error = server_messages_error,
                           .free_state = free_state};
}
