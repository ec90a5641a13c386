/* Generation routes: /v1/chat/completions, /v1/completions and llama-server's /completion,
 * streamed (SSE) or not.
 *
 * A job joins the scheduler's thread, which appends text and log-probabilities as tokens
 * come, with the connection's thread, which waits for them and writes the response. It is
 * freed by whichever of the two lets go last. A client that hangs up is noticed within a
 * poll period and its request cancelled, which frees its blocks.
 *
 * The response's status waits for the request's first token (or its end), so that a request
 * that fails or is refused before it produces anything gets its own status (500, 503) instead
 * of a 200 stream holding an error. A graceful stop (server_drain, server_abort) cancels what
 * it must; a cancelled request that had produced text ends as usual with finish_reason
 * "abort", one that had produced nothing gets a 503.
 *
 * A client that stops sending may have closed its socket, or only its sending side (legal
 * HTTP, and it still reads): only bytes written tell which, since a closed socket answers them
 * with a reset. So when an HTTP/1.1 client stops sending while its request waits, it is sent
 * an interim "100 Continue", which every HTTP/1.1 client must read past (RFC 9110, 15.2) and
 * which a closed socket answers with the reset that cancels the request. */
#include "server/server_internal.h"
#include "server/server_output.h"
#include "server/server_params.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SERVER_POLL_MS 50

typedef struct lp_entry {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS]; /* (n_top) */
    float top_lp[ENGINE_MAX_TOP_LOGPROBS];    /* (n_top) */
} lp_entry;

typedef struct job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the scheduler (until the final event) and the connection */
    server *srv;
    struct MHD_Connection *conn;
    uint64_t id;
    server_kind kind;
    bool stream, include_usage, logprobs, cancelled;
    char resp_id[48];
    long long created;
    server_output split; /* chat: how the text splits into reasoning, content and tool calls, and
                          (the connection's thread) how much of each has been sent */
    /* written by the scheduler's thread, under mu */
    char *text; /* (text_cap) everything generated so far */
    size_t text_len, text_cap;
    lp_entry *lps; /* (lps_cap) one per token when logprobs are asked for */
    int n_lps, lps_cap;
    engine_finish finish;
    char *error;
    int n_prompt, n_generated, n_cached;
    double ttft, t_submit, t_end;
    /* the connection's thread: how much has been sent, and bytes formatted but not sent */
    size_t text_sent;
    int lps_sent;
    bool head_sent, tail_sent;
    char *out; /* (out_cap) */
    size_t out_len, out_off, out_cap;
} job;

static void job_release(job *j) {
    pthread_mutex_lock(&j->mu);
    bool last = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (!last) return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->text);
    free(j->lps);
    free(j->error);
    free(j->out);
    json_decref(j->split.tool_defs);
    free(j);
}

static void text_append(job *j, const char *t, size_t n) {
    if (j->text_len + n + 1 > j->text_cap) {
        j->text_cap = (j->text_len + n + 1) * 2;
        j->text = base_xrealloc(j->text, j->text_cap);
    }
    memcpy(j->text + j->text_len, t, n);
    j->text_len += n;
    j->text[j->text_len] = 0;
}

/* The scheduler's callback: copies what the event says; formatting happens elsewhere so that
 * the step thread stays short. */
static void on_event(void *ctx, const engine_event *ev) {
    job *j = ctx;
    pthread_mutex_lock(&j->mu);
    if (ev->text_len) text_append(j, ev->text, ev->text_len);
    if (ev->token >= 0 && j->logprobs) {
        if (j->n_lps == j->lps_cap) {
            j->lps_cap = j->lps_cap ? 2 * j->lps_cap : 64;
            j->lps = base_xrealloc(j->lps, (size_t)j->lps_cap * sizeof *j->lps);
        }
        lp_entry *e = &j->lps[j->n_lps++];
        e->token = ev->token;
        e->logprob = ev->logprob;
        e->n_top = ev->n_top;
        memcpy(e->top_ids, ev->top_ids, sizeof e->top_ids);
        memcpy(e->top_lp, ev->top_logprobs, sizeof e->top_lp);
    }
    j->n_prompt = ev->n_prompt;
    j->n_generated = ev->n_generated;
    j->n_cached = ev->n_cached;
    j->ttft = ev->seconds_to_first_token;
    bool last = false;
    if (ev->finish != ENGINE_FINISH_NONE) {
        j->finish = ev->finish;
        j->t_end = base_now();
        if (ev->error) j->error = base_xstrdup(ev->error);
        last = --j->refs == 0;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (last) {
        j->refs = 1;
        job_release(j);
    }
}

/* Waits (mu held) for news or a poll period; cancels once if the client left or the server
 * is stopping. Returns true when the client is gone. */
static bool job_wait(job *j) {
    base_cond_wait_ms(&j->cv, &j->mu, SERVER_POLL_MS);
    bool gone = server_client_gone(j->conn);
    bool stop = __atomic_load_n(&j->srv->stopping, __ATOMIC_ACQUIRE) ||
                __atomic_load_n(&j->srv->aborting, __ATOMIC_ACQUIRE);
    if ((gone || stop) && !j->cancelled && j->finish == ENGINE_FINISH_NONE) {
        j->cancelled = true;
        engine_cancel(j->srv->sched, j->id);
    }
    return gone;
}

/* ---- JSON pieces ---- */

static const char *finish_reason(engine_finish f) {
    return f == ENGINE_FINISH_LENGTH ? "length" : f == ENGINE_FINISH_CANCELLED ? "abort" : "stop";
}

/* A chat answer that called tools ends with "tool_calls", unless it was cut short. */
static const char *chat_finish_reason(engine_finish f, bool called) {
    return called && f != ENGINE_FINISH_CANCELLED ? "tool_calls" : finish_reason(f);
}

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i])) return false;
    return true;
}

/* The parts of news as a chat message or delta: content (null beside calls when blank, in a
 * whole message), reasoning_content, tool_calls (with their index when streamed). */
static void news_fields(json_t *o, const server_news *n, bool streamed) {
    bool calls = n->scan.n_calls > n->first_call;
    if (!streamed || n->content_len)
        json_object_set_new(o, "content",
                            calls && blank(n->content, n->content_len)
                                ? json_null()
                                : json_stringn(n->content ? n->content : "", n->content_len));
    if (n->reasoning_len)
        json_object_set_new(o, "reasoning_content", json_stringn(n->reasoning, n->reasoning_len));
    if (!calls) return;
    json_t *arr = json_array();
    for (int i = n->first_call; i < n->scan.n_calls; i++)
        json_array_append_new(arr, server_tool_call_json(&n->scan.calls[i], streamed ? i : -1));
    json_object_set_new(o, "tool_calls", arr);
}

/* The whole answer as a chat message; *called: it holds tool calls. */
static json_t *chat_message(const job *j, bool *called) {
    server_output o = j->split;
    o.reasoning_sent = o.content_sent = 0;
    o.calls_sent = 0;
    server_news n;
    server_output_news(&o, j->text ? j->text : "", j->text_len, true, &n);
    json_t *msg = json_pack("{s:s}", "role", "assistant");
    news_fields(msg, &n, false);
    *called = n.scan.n_calls > 0;
    server_news_free(&n);
    return msg;
}

static json_t *token_json(server *s, int32_t id, float lp, bool with_bytes) {
    char *t = NULL;
    size_t n = 0;
    base_err err;
    if (tok_decode_continued(s->pr->tok, &id, 1, false, &t, &n, &err)) {
        t = base_xstrdup("");
        n = 0;
    }
    json_t *o = json_pack("{s:s%,s:f}", "token", t, n, "logprob", (double)lp);
    free(t);
    if (with_bytes) {
        /* The token's own bytes: a byte-fallback token is one byte, not U+FFFD. */
        if (tok_token_bytes(s->pr->tok, id, &t, &n, &err)) {
            t = NULL;
            n = 0;
        }
        json_t *bytes = json_array();
        for (size_t i = 0; i < n; i++)
            json_array_append_new(bytes, json_integer((unsigned char)t[i]));
        json_object_set_new(o, "bytes", bytes);
        free(t);
    }
    return o;
}

/* Chat logprobs of entries [from, to): {"content": [{token, logprob, bytes, top_logprobs}]}. */
static json_t *chat_logprobs(server *s, const job *j, int from, int to) {
    json_t *content = json_array();
    for (int i = from; i < to; i++) {
        const lp_entry *e = &j->lps[i];
        json_t *o = token_json(s, e->token, e->logprob, true);
        json_t *top = json_array();
        for (int k = 0; k < e->n_top; k++)
            json_array_append_new(top, token_json(s, e->top_ids[k], e->top_lp[k], true));
        json_object_set_new(o, "top_logprobs", top);
        json_array_append_new(content, o);
    }
    return json_pack("{s:o}", "content", content);
}

/* Legacy completions logprobs: parallel arrays of tokens, their logprobs and top maps. */
static json_t *completion_logprobs(server *s, const job *j, int from, int to) {
    json_t *tokens = json_array(), *lps = json_array(), *tops = json_array();
    for (int i = from; i < to; i++) {
        const lp_entry *e = &j->lps[i];
        json_t *t = token_json(s, e->token, e->logprob, false);
        json_array_append(tokens, json_object_get(t, "token"));
        json_array_append_new(lps, json_real(e->logprob));
        json_decref(t);
        json_t *m = json_object();
        for (int k = 0; k < e->n_top; k++) {
            json_t *tk = token_json(s, e->top_ids[k], e->top_lp[k], false);
            json_object_set_new(m, json_string_value(json_object_get(tk, "token")),
                                json_real(e->top_lp[k]));
            json_decref(tk);
        }
        json_array_append_new(tops, m);
    }
    return json_pack("{s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops);
}

static json_t *usage_json(const job *j) {
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", j->n_prompt, "completion_tokens",
                     j->n_generated, "total_tokens", j->n_prompt + j->n_generated,
                     "prompt_tokens_details", "cached_tokens", j->n_cached);
}

static json_t *envelope(server *s, const job *j, const char *object, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", j->resp_id, "object", object, "created",
                     (json_int_t)j->created, "model", s->o.model_id, "choices", choices);
}

static const char *llama_stop_type(engine_finish f) {
    return f == ENGINE_FINISH_LENGTH ? "limit" : f == ENGINE_FINISH_CANCELLED ? "abort" : "eos";
}

static json_t *llama_body(server *s, const job *j, const char *content, bool stop) {
    json_t *o =
        json_pack("{s:s,s:b,s:s}", "content", content, "stop", stop, "model", s->o.model_id);
    if (stop) {
        double gen_s = j->t_end - j->t_submit - j->ttft;
        json_object_set_new(o, "stop_type", json_string(llama_stop_type(j->finish)));
        json_object_set_new(o, "tokens_predicted", json_integer(j->n_generated));
        json_object_set_new(o, "tokens_evaluated", json_integer(j->n_prompt));
        json_object_set_new(o, "tokens_cached", json_integer(j->n_cached));
        json_object_set_new(o, "timings",
                            json_pack("{s:f,s:f,s:i}", "prompt_ms", j->ttft * 1e3, "predicted_ms",
                                      gen_s * 1e3, "predicted_n", j->n_generated));
    }
    return o;
}

/* The whole response of a request that was not streamed. */
static json_t *final_body(server *s, job *j) {
    if (j->kind == SERVER_LLAMA_COMPLETION) return llama_body(s, j, j->text ? j->text : "", true);
    bool chat = j->kind == SERVER_CHAT, called = false;
    json_t *choice = json_pack("{s:i}", "index", 0);
    if (chat)
        json_object_set_new(choice, "message", chat_message(j, &called));
    else
        json_object_set_new(choice, "text", json_string(j->text ? j->text : ""));
    json_object_set_new(
        choice, "finish_reason",
        json_string(chat ? chat_finish_reason(j->finish, called) : finish_reason(j->finish)));
    json_object_set_new(choice, "logprobs",
                        !j->logprobs ? json_null()
                        : chat       ? chat_logprobs(s, j, 0, j->n_lps)
                                     : completion_logprobs(s, j, 0, j->n_lps));
    json_t *o =
        envelope(s, j, chat ? "chat.completion" : "text_completion", json_pack("[o]", choice));
    json_object_set_new(o, "usage", usage_json(j));
    return o;
}

/* ---- streaming ---- */

static void out_append(job *j, const char *data, size_t n) {
    if (j->out_len + n > j->out_cap) {
        j->out_cap = (j->out_len + n) * 2;
        j->out = base_xrealloc(j->out, j->out_cap);
    }
    memcpy(j->out + j->out_len, data, n);
    j->out_len += n;
}

/* One SSE event. A chunk that cannot be built (out of memory, or text jansson refuses) is sent
 * as an error event, so that the stream still says what happened. */
static void out_event(job *j, json_t *o) {
    static const char unbuildable[] = "{\"error\":{\"message\":\"a chunk of the response could "
                                      "not be built\",\"type\":\"server_error\",\"code\":500}}";
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    out_append(j, "data: ", 6);
    out_append(j, t ? t : unbuildable, t ? strlen(t) : sizeof unbuildable - 1);
    out_append(j, "\n\n", 2);
    free(t);
}

/* One chunk with the text (news, for chat) and log-probabilities that arrived since the last
 * one. */
static json_t *delta_chunk(server *s, job *j, const char *text, size_t n, const server_news *news,
                           int lp_to, const char *finish) {
    if (j->kind == SERVER_LLAMA_COMPLETION) {
        json_t *o = json_pack("{s:s%,s:b}", "content", text, n, "stop", false);
        return o;
    }
    bool chat = j->kind == SERVER_CHAT;
    json_t *choice = json_pack("{s:i,s:o}", "index", 0, "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_t *lp = !j->logprobs ? json_null()
                 : chat       ? chat_logprobs(s, j, j->lps_sent, lp_to)
                              : completion_logprobs(s, j, j->lps_sent, lp_to);
    json_object_set_new(choice, "logprobs", lp);
    if (chat) {
        json_t *delta = json_object();
        if (!j->head_sent) json_object_set_new(delta, "role", json_string("assistant"));
        if (news) news_fields(delta, news, true);
        /* a chunk that only carries log-probabilities (or the role) still has its content */
        if (!finish && json_object_size(delta) == (j->head_sent ? 0u : 1u))
            json_object_set_new(delta, "content", json_string(""));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", json_stringn(text, n));
    }
    return envelope(s, j, chat ? "chat.completion.chunk" : "text_completion",
                    json_pack("[o]", choice));
}

/* Formats (mu held) whatever is new into the out buffer. */
static void format_news(server *s, job *j) {
    size_t n = j->text_len - j->text_sent;
    int lp_to = j->n_lps;
    bool done = j->finish != ENGINE_FINISH_NONE, chat = j->kind == SERVER_CHAT;
    server_news news = {0};
    if (chat) server_output_news(&j->split, j->text ? j->text : "", j->text_len, done, &news);
    bool fresh = chat
                     ? news.content_len || news.reasoning_len || news.scan.n_calls > news.first_call
                     : n > 0;
    if (fresh || lp_to > j->lps_sent || (!j->head_sent && chat)) {
        out_event(j, delta_chunk(s, j, j->text ? j->text + j->text_sent : "", n,
                                 chat ? &news : NULL, lp_to, NULL));
        j->head_sent = true;
        j->text_sent = j->text_len;
        j->lps_sent = lp_to;
    }
    server_news_free(&news);
    if (!done || j->tail_sent) return;
    j->tail_sent = true;
    if (j->finish == ENGINE_FINISH_ERROR) {
        out_event(j, json_pack("{s:{s:s,s:s,s:i}}", "error", "message",
                               j->error ? j->error : "generation failed", "type", "server_error",
                               "code", 500));
        return;
    }
    if (j->kind == SERVER_LLAMA_COMPLETION) {
        out_event(j, llama_body(s, j, "", true));
        return;
    }
    out_event(j, delta_chunk(s, j, "", 0, NULL, j->lps_sent,
                             chat ? chat_finish_reason(j->finish, j->split.calls_sent > 0)
                                  : finish_reason(j->finish)));
    if (j->include_usage) {
        json_t *o =
            envelope(s, j, j->kind == SERVER_CHAT ? "chat.completion.chunk" : "text_completion",
                     json_array());
        json_object_set_new(o, "usage", usage_json(j));
        out_event(j, o);
    }
    out_append(j, "data: [DONE]\n\n", 14);
}

/* The connection's side lets go of the job (its response is done or abandoned). */
static void connection_done(job *j) {
    __atomic_sub_fetch(&j->srv->active, 1, __ATOMIC_ACQ_REL);
    job_release(j);
}

/* A request that a drain or an abort ended (mu held), not one whose client left. */
static bool cut_short(const job *j) {
    return j->finish == ENGINE_FINISH_CANCELLED &&
           __atomic_load_n(&j->srv->draining, __ATOMIC_ACQUIRE);
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    while (j->out_off == j->out_len) {
        j->out_off = j->out_len = 0;
        if (j->tail_sent) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        format_news(j->srv, j);
        if (j->tail_sent && cut_short(j)) __atomic_add_fetch(&j->srv->cut, 1, __ATOMIC_RELAXED);
        if (j->out_len) break;
        if (job_wait(j)) {
            pthread_mutex_unlock(&j->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = j->out_len - j->out_off < max ? j->out_len - j->out_off : max;
    memcpy(buf, j->out + j->out_off, n);
    j->out_off += n;
    pthread_mutex_unlock(&j->mu);
    return (ssize_t)n;
}

/* MHD is done with the stream (finished, or the client left): a request still running is
 * cancelled so that its blocks come back. */
static void stream_free(void *cls) {
    job *j = cls;
    pthread_mutex_lock(&j->mu);
    bool running = j->finish == ENGINE_FINISH_NONE && !j->cancelled;
    j->cancelled = true;
    pthread_mutex_unlock(&j->mu);
    if (running) engine_cancel(j->srv->sched, j->id);
    connection_done(j);
}

static enum MHD_Result reply_stream(server *s, struct MHD_Connection *c, job *j) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!r) {
        stream_free(j);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type",
                            j->stream ? "text/event-stream" : "application/json");
    if (j->stream) MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = server_queue(s, c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

/* Waits for the first token of a stream, or for the end; a stream then goes on in MHD's hands,
 * anything else is answered here. A client that left gets nothing, once its request has ended
 * (so that its blocks are back before the connection closes). */
static enum MHD_Result reply(server *s, struct MHD_Connection *c, job *j, bool http11) {
    pthread_mutex_lock(&j->mu);
    bool gone = false, probed = !http11;
    while (j->finish == ENGINE_FINISH_NONE && (gone || !j->stream || j->n_generated == 0)) {
        gone = job_wait(j) || gone;
        if (!probed && server_client_done_sending(c)) probed = server_probe_client(c);
    }
    bool nothing = j->n_generated == 0 && j->text_len == 0;
    enum MHD_Result rc;
    if (gone) {
        rc = MHD_NO;
    } else if (nothing && cut_short(j)) {
        __atomic_add_fetch(&s->cut, 1, __ATOMIC_RELAXED);
        rc = server_reply_error(s, c, 503, "unavailable_error",
                                "the server is shutting down; the request was not started");
    } else if (j->finish == ENGINE_FINISH_ERROR && (nothing || !j->stream)) {
        rc = server_reply_error(s, c, 500, "server_error", "%s", j->error ? j->error : "failed");
    } else if (j->stream) {
        pthread_mutex_unlock(&j->mu);
        return reply_stream(s, c, j);
    } else {
        if (cut_short(j)) __atomic_add_fetch(&s->cut, 1, __ATOMIC_RELAXED);
        rc = server_reply_json(s, c, 200, final_body(s, j));
    }
    pthread_mutex_unlock(&j->mu);
    connection_done(j);
    return rc;
}

static job *job_new(server *s, struct MHD_Connection *c, const server_params *p) {
    static uint64_t counter;
    job *j = base_xcalloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->srv = s;
    j->conn = c;
    j->kind = p->kind;
    j->stream = p->stream;
    j->include_usage = p->include_usage;
    j->logprobs = p->req.logprobs;
    j->split = p->out;
    json_incref(j->split.tool_defs);
    j->created = (long long)time(NULL);
    j->t_submit = base_now();
    uint64_t n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(j->resp_id, sizeof j->resp_id, "%s-%llx%06llx",
             p->kind == SERVER_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)j->created,
             (unsigned long long)n);
    return j;
}

bool server_is_generate_route(const char *url) {
    return strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/chat/completions") == 0 ||
           strcmp(url, "/v1/completions") == 0 || strcmp(url, "/completions") == 0 ||
           strcmp(url, "/completion") == 0;
}

static server_kind route_kind(const char *url) {
    if (strstr(url, "chat/completions")) return SERVER_CHAT;
    if (strcmp(url, "/completion") == 0) return SERVER_LLAMA_COMPLETION;
    return SERVER_COMPLETIONS;
}

enum MHD_Result server_route_generate(server *s, struct MHD_Connection *c, const char *url,
                                      const char *version, json_t *body) {
    server_params p;
    base_err err;
    int vocab = model_config(s->rt->model)->vocab_size;
    if (server_params_parse(body, route_kind(url), &s->o, s->pr, vocab, s->rt->kv_plan.ctx_size, &p,
                            &err)) {
        server_params_free(&p);
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    }
    job *j = job_new(s, c, &p);
    p.req.on_event = on_event;
    p.req.ctx = j;
    engine_reject why;
    int rc = engine_submit(s->sched, &p.req, &j->id, &why, &err);
    server_params_free(&p);
    if (rc) {
        j->refs = 1;
        job_release(j);
        if (why == ENGINE_REJECT_INVALID)
            return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
        return server_reply_error(s, c, 503, "unavailable_error", "%s", err.msg);
    }
    __atomic_add_fetch(&s->active, 1, __ATOMIC_ACQ_REL);
    return reply(s, c, j, strcmp(version, MHD_HTTP_VERSION_1_1) == 0);
}
