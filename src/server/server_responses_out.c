/* A chat answer in the Responses API's shapes: a response whose output is a list of items
 * (reasoning, message, function_call), streamed as the typed events the openai SDKs read
 * (response.created, response.in_progress, response.output_item.added, the content part, text,
 * reasoning text and call argument events, response.output_item.done, and response.completed,
 * response.incomplete or response.failed with the whole response), each with its
 * sequence_number, or whole. The whole response is the one the stream's last event carries,
 * so the two cannot disagree. A complete answer is put in the store with its conversation. */
#include "server/server_responses.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL } item_kind;

typedef struct resp_state {
    char id[40];
    long long created;
    char *model;         /* owned */
    json_t *echo;        /* owned: the request's fields the response repeats */
    json_t *input;       /* owned: the conversation's items before the answer */
    server_store *store; /* NULL: not kept */
    bool started, ended; /* response.created, and the last event, sent */
    int seq;             /* the next event's sequence_number */
    json_t *output;      /* owned: the items so far; the open one is the last */
    item_kind open;
    int n_calls;
    /* Blank text that has opened no message yet: a model often writes a newline before a call,
     * which would otherwise be a message of nothing. It opens one when text follows, or at the
     * end of an answer without calls. */
    char *held; /* (held_len) owned */
    size_t held_len;
} resp_state;

typedef struct out {
    server_emit_fn *emit;
    void *sink;
} out;

/* One event named by its type, which also leads its data, with its sequence number. */
static void event(resp_state *r, const out *o, const char *type, json_t *e) {
    json_t *x = json_pack("{s:s,s:i}", "type", type, "sequence_number", r->seq++);
    json_object_update(x, e);
    json_decref(e);
    o->emit(o->sink, type, x);
}

static json_t *usage(const server_seq *q) {
    return json_pack("{s:i,s:{s:i},s:i,s:i}", "input_tokens", q->n_prompt, "input_tokens_details",
                     "cached_tokens", q->n_cached, "output_tokens", q->n_generated, "total_tokens",
                     q->n_prompt + q->n_generated);
}

/* The response as it stands: status in_progress (no usage yet), completed or incomplete. */
static json_t *response(const resp_state *r, const server_seq *q, const char *status) {
    bool done = strcmp(status, "in_progress") != 0;
    bool cut = strcmp(status, "incomplete") == 0;
    json_t *o = json_pack(
        "{s:s,s:s,s:I,s:s,s:n,s:o,s:s,s:o,s:o}", "id", r->id, "object", "response", "created_at",
        (json_int_t)r->created, "status", status, "error", "incomplete_details",
        cut ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null(), "model", r->model,
        "output", done ? json_deep_copy(r->output) : json_array(), "usage",
        done ? usage(q) : json_null());
    json_object_update(o, r->echo);
    return o;
}

static json_t *open_item(const resp_state *r) {
    return json_array_get(r->output, json_array_size(r->output) - 1);
}

/* Where an event about the open item points: its id and place. */
static json_t *at_item(const resp_state *r, bool with_part) {
    json_t *o = json_pack("{s:O,s:i}", "item_id", json_object_get(open_item(r), "id"),
                          "output_index", (int)json_array_size(r->output) - 1);
    if (with_part) json_object_set_new(o, "content_index", json_integer(0));
    return o;
}

static void append_text(json_t *o, const char *key, const char *t, size_t nt) {
    const char *a = json_string_value(json_object_get(o, key));
    size_t na = a ? strlen(a) : 0;
    char *joined = base_xmalloc(na + nt + 1);
    memcpy(joined, a ? a : "", na);
    memcpy(joined + na, t, nt);
    json_object_set_new(o, key, json_stringn(joined, na + nt));
    free(joined);
}

/* Ends the open item: its part's and its own done events, with status (completed, or
 * incomplete when the answer was cut). */
static void item_close(resp_state *r, const out *o, const char *status) {
    if (r->open == ITEM_NONE) return;
    json_t *item = open_item(r);
    int index = (int)json_array_size(r->output) - 1;
    if (r->open == ITEM_CALL) {
        json_t *e = at_item(r, false);
        json_object_set(e, "name", json_object_get(item, "name"));
        json_object_set(e, "arguments", json_object_get(item, "arguments"));
        event(r, o, "response.function_call_arguments.done", e);
    } else {
        bool text = r->open == ITEM_MESSAGE;
        json_t *part = json_array_get(json_object_get(item, "content"), 0);
        json_t *e = at_item(r, true);
        json_object_set(e, "text", json_object_get(part, "text"));
        if (text) json_object_set_new(e, "logprobs", json_array());
        event(r, o, text ? "response.output_text.done" : "response.reasoning_text.done", e);
        e = at_item(r, true);
        json_object_set_new(e, "part", json_deep_copy(part));
        event(r, o, "response.content_part.done", e);
    }
    if (r->open != ITEM_REASONING) json_object_set_new(item, "status", json_string(status));
    event(r, o, "response.output_item.done",
          json_pack("{s:i,s:o}", "output_index", index, "item", json_deep_copy(item)));
    r->open = ITEM_NONE;
}

/* Opens an item (stolen) of a kind, with its first content part when it has one (stolen). */
static void item_open(resp_state *r, const out *o, item_kind kind, json_t *item, json_t *part) {
    item_close(r, o, "completed");
    json_array_append_new(r->output, item);
    r->open = kind;
    event(r, o, "response.output_item.added",
          json_pack("{s:i,s:o}", "output_index", (int)json_array_size(r->output) - 1, "item",
                    json_deep_copy(item)));
    if (!part) return;
    json_array_append(json_object_get(item, "content"), part);
    json_t *e = at_item(r, true);
    json_object_set_new(e, "part", part);
    event(r, o, "response.content_part.added", e);
}

/* Text for the open item's part: its delta event, and the part's text grows. */
static void part_delta(resp_state *r, const out *o, const char *type, const char *t, size_t n) {
    append_text(json_array_get(json_object_get(open_item(r), "content"), 0), "text", t, n);
    json_t *e = at_item(r, true);
    json_object_set_new(e, "delta", json_stringn(t, n));
    if (r->open == ITEM_MESSAGE) json_object_set_new(e, "logprobs", json_array());
    event(r, o, type, e);
}

static void reasoning(resp_state *r, const out *o, const char *t, size_t n) {
    if (r->open != ITEM_REASONING) {
        char id[40];
        server_new_id(id, sizeof id, "rs_");
        item_open(
            r, o, ITEM_REASONING,
            json_pack("{s:s,s:s,s:[],s:[]}", "id", id, "type", "reasoning", "summary", "content"),
            json_pack("{s:s,s:s}", "type", "reasoning_text", "text", ""));
    }
    part_delta(r, o, "response.reasoning_text.delta", t, n);
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

static void drop_held(resp_state *r) {
    free(r->held);
    r->held = NULL;
    r->held_len = 0;
}

static void message_open(resp_state *r, const out *o) {
    char id[40];
    server_new_id(id, sizeof id, "msg_");
    item_open(r, o, ITEM_MESSAGE,
              json_pack("{s:s,s:s,s:s,s:s,s:[]}", "id", id, "type", "message", "status",
                        "in_progress", "role", "assistant", "content"),
              json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "", "annotations",
                        "logprobs"));
    if (r->held_len) part_delta(r, o, "response.output_text.delta", r->held, r->held_len);
    drop_held(r);
}

static void text(resp_state *r, const out *o, const char *t, size_t n) {
    if (r->open != ITEM_MESSAGE && blank(t, n)) {
        r->held = base_xrealloc(r->held, r->held_len + n);
        memcpy(r->held + r->held_len, t, n);
        r->held_len += n;
        return;
    }
    if (r->open != ITEM_MESSAGE) message_open(r, o);
    part_delta(r, o, "response.output_text.delta", t, n);
}

/* A call arrives whole: its item, then its arguments as one delta. */
static void call(resp_state *r, const out *o, const engine_tool_call *c) {
    char id[40], call_id[40];
    server_new_id(id, sizeof id, "fc_");
    server_new_id(call_id, sizeof call_id, "call_");
    drop_held(r);
    r->n_calls++;
    item_open(r, o, ITEM_CALL,
              json_pack("{s:s,s:s,s:s,s:s,s:s,s:s}", "id", id, "type", "function_call", "status",
                        "in_progress", "call_id", call_id, "name", c->name, "arguments", ""),
              NULL);
    json_object_set_new(open_item(r), "arguments", json_string(c->arguments));
    json_t *e = at_item(r, false);
    json_object_set_new(e, "delta", json_string(c->arguments));
    event(r, o, "response.function_call_arguments.delta", e);
}

/* The answer's end. A length limit, of max_output_tokens or of the context (which bounds the
 * output the same way), makes the response incomplete; a complete one is kept. */
static void finish(resp_state *r, const out *o, const server_seq *q) {
    r->ended = true;
    if (q->finish == ENGINE_FINISH_ERROR || q->finish == ENGINE_FINISH_CANCELLED) {
        const char *msg = q->finish == ENGINE_FINISH_CANCELLED
                              ? "the server is stopping: the answer was cut short"
                          : q->error ? q->error
                                     : "generation failed";
        json_t *failed = response(r, q, "failed");
        json_object_set_new(failed, "error",
                            json_pack("{s:s,s:s}", "code", "server_error", "message", msg));
        event(r, o, "response.failed", json_pack("{s:o}", "response", failed));
        return;
    }
    bool cut = q->finish == ENGINE_FINISH_LENGTH;
    if (r->held_len && !r->n_calls) message_open(r, o);
    item_close(r, o, cut ? "incomplete" : "completed");
    json_t *whole = response(r, q, cut ? "incomplete" : "completed");
    if (r->store) {
        json_t *items = json_deep_copy(r->input);
        json_array_extend(items, r->output);
        server_store_put(r->store, r->id, items, json_incref(whole));
    }
    event(r, o, cut ? "response.incomplete" : "response.completed",
          json_pack("{s:o}", "response", whole));
}

static void stream(void *state, const server_seq *q, server_emit_fn *emit, void *sink) {
    resp_state *r = state;
    out o = {emit, sink};
    if (r->ended) return;
    if (!r->started) {
        r->started = true;
        event(r, &o, "response.created",
              json_pack("{s:o}", "response", response(r, q, "in_progress")));
        event(r, &o, "response.in_progress",
              json_pack("{s:o}", "response", response(r, q, "in_progress")));
    }
    server_news n;
    server_output_news(q->split, q->text, q->len, q->finish != ENGINE_FINISH_NONE, &n);
    if (n.reasoning_len) reasoning(r, &o, n.reasoning, n.reasoning_len);
    if (n.content_len) text(r, &o, n.content, n.content_len);
    for (int i = n.first_call; i < n.scan.n_calls; i++) call(r, &o, &n.scan.calls[i]);
    server_news_free(&n);
    if (q->finish != ENGINE_FINISH_NONE) finish(r, &o, q);
}

/* The sink of the whole response: it keeps the last event. */
static void keep_last(void *sink, const char *name, json_t *e) {
    json_t **last = sink;
    (void)name;
    json_decref(*last);
    *last = e;
}

static json_t *whole(void *state, const server_seq *q, unsigned *status) {
    const resp_state *r = state;
    resp_state fresh = {.created = r->created,
                        .model = r->model,
                        .echo = r->echo,
                        .input = r->input,
                        .store = r->store,
                        .output = json_array()};
    memcpy(fresh.id, r->id, sizeof fresh.id);
    server_output split = *q->split;
    split.reasoning_sent = split.content_sent = 0;
    split.calls_sent = 0;
    server_seq all = *q;
    all.split = &split;
    json_t *last = NULL;
    stream(&fresh, &all, keep_last, &last);
    free(fresh.held);
    json_decref(fresh.output);
    json_t *resp = json_incref(json_object_get(last, "response"));
    bool failed = strcmp(json_string_value(json_object_get(last, "type")), "response.failed") == 0;
    json_decref(last);
    if (!failed) return resp;
    json_t *err = json_object_get(resp, "error");
    *status = q->finish == ENGINE_FINISH_CANCELLED ? 503 : 500;
    json_t *body = json_pack("{s:{s:O,s:s,s:n}}", "error", "message",
                             json_object_get(err, "message"), "type", "server_error", "code");
    json_decref(resp);
    return body;
}

static void free_state(void *state) {
    resp_state *r = state;
    free(r->model);
    free(r->held);
    json_decref(r->echo);
    json_decref(r->input);
    json_decref(r->output);
    free(r);
}

server_writer server_responses_writer(const server_responses_req *req) {
    resp_state *r = base_xcalloc(1, sizeof *r);
    server_new_id(r->id, sizeof r->id, "resp_");
    r->created = (long long)time(NULL);
    r->model = base_xstrdup(req->model_id);
    r->echo = req->echo;
    r->input = req->input;
    r->store = req->store;
    r->output = json_array();
    return (server_writer){.state = r, .stream = stream, .whole = whole, .free_state = free_state};
}
