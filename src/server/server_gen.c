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

struct group;

/* One sequence of a request: one engine request, one choice (or a candidate of best_of). */
typedef struct job {
    struct group *g;
    uint64_t id;
    int prompt;          /* which of the request's prompts */
    int index;           /* the choice's index in the response */
    bool submitted;      /* given to the scheduler, which then owes it a final event */
    server_output split; /* chat: how the text splits into reasoning, content and tool calls, and
                            (the connection's thread) how much of each has been sent; its
                            tool_defs reference owned */
    /* written by the scheduler's thread, under g->mu */
    char *text; /* (text_cap) everything generated so far */
    size_t text_len, text_cap;
    lp_entry *lps; /* (lps_cap) one per token when logprobs are asked for */
    int n_lps, lps_cap;
    double sum_logprob; /* of the generated tokens, which best_of ranks by */
    engine_finish finish;
    int stop_index; /* the stop string that ended it, or -1 */
    char *error;
    int n_prompt, n_generated, n_cached;
    double ttft, t_end, t_token; /* t_token: when the last token came */
    /* the connection's thread: how much has been sent */
    size_t text_sent;
    int lps_sent;
    bool head_sent, tail_sent;
} job;

/* A request: its sequences (prompts times best_of), joining the scheduler's thread, which
 * appends text and log-probabilities as tokens come, with the connection's thread, which waits
 * for them and writes the response. Freed by whichever lets go last. */
typedef struct group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs; /* the submitted jobs until their final event, and the connection */
    server *srv;
    struct MHD_Connection *conn;
    server_exchange *x; /* the connection's thread: where the log line's figures go */
    server_kind kind;
    bool stream, include_usage, logprobs, cancelled;
    int n_choices, best_of; /* answered and generated per prompt */
    char resp_id[48];
    long long created;
    double t_submit;
    job *jobs; /* (n_jobs) prompt-major: best_of of each prompt */
    int n_jobs;
    char **echo; /* (n_prompts) owned: each prompt's text when echo asks, else NULL */
    size_t *echo_len;
    int n_prompts;
    char **stop; /* (n_stop) owned copies, for /completion's stopping_word */
    int n_stop;
    char *prompt;    /* owned: /completion's prompt with its special tokens written out, which its
                        answer reports as llama-server's does; NULL on the other routes */
    server_writer w; /* another API's shapes when w.stream is set; its state owned */
    /* the connection's thread: bytes formatted but not sent */
    bool done_sent;
    char *out; /* (out_cap) */
    size_t out_len, out_off, out_cap;
} group;

static void group_release(group *g) {
    pthread_mutex_lock(&g->mu);
    bool last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    for (int i = 0; i < g->n_jobs; i++) {
        free(g->jobs[i].text);
        free(g->jobs[i].lps);
        free(g->jobs[i].error);
        json_decref(g->jobs[i].split.tool_defs);
    }
    for (int i = 0; i < g->n_prompts; i++) free(g->echo[i]);
    for (int i = 0; i < g->n_stop; i++) free(g->stop[i]);
    free(g->jobs);
    free(g->echo);
    free(g->echo_len);
    free(g->stop);
    free(g->prompt);
    free(g->out);
    if (g->w.free_state) g->w.free_state(g->w.state);
    free(g);
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

static void lp_append(job *j, const engine_event *ev) {
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

/* The scheduler's callback: copies what the event says; formatting happens elsewhere so that
 * the step thread stays short. */
static void on_event(void *ctx, const engine_event *ev) {
    job *j = ctx;
    group *g = j->g;
    pthread_mutex_lock(&g->mu);
    if (ev->text_len) text_append(j, ev->text, ev->text_len);
    double now = base_now();
    if (ev->token >= 0) {
        if (g->logprobs) lp_append(j, ev);
        j->sum_logprob += ev->logprob;
        if (j->n_generated > 0) server_hist_observe(&g->srv->metrics.inter_token, now - j->t_token);
        j->t_token = now;
    }
    j->n_prompt = ev->n_prompt;
    j->n_generated = ev->n_generated;
    j->n_cached = ev->n_cached;
    j->ttft = ev->seconds_to_first_token;
    bool last = false;
    if (ev->finish != ENGINE_FINISH_NONE) {
        j->finish = ev->finish;
        j->stop_index = ev->stop_index;
        j->t_end = now;
        server_metrics_request(&g->srv->metrics, j->n_prompt, j->n_generated, j->ttft,
                               j->t_end - g->t_submit);
        if (ev->error) j->error = base_xstrdup(ev->error);
        last = --g->refs == 0;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (last) {
        g->refs = 1;
        group_release(g);
    }
}

static bool all_done(const group *g) {
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].finish == ENGINE_FINISH_NONE) return false;
    return true;
}

static int total_generated(const group *g) {
    int n = 0;
    for (int i = 0; i < g->n_jobs; i++) n += g->jobs[i].n_generated;
    return n;
}

/* Waits (mu held) for news or a poll period; cancels what runs, once, if the client left or
 * the server is stopping. Returns true when the client is gone. */
static bool group_wait(group *g) {
    base_cond_wait_ms(&g->cv, &g->mu, SERVER_POLL_MS);
    bool gone = server_client_gone(g->conn);
    bool stop = __atomic_load_n(&g->srv->stopping, __ATOMIC_ACQUIRE) ||
                __atomic_load_n(&g->srv->aborting, __ATOMIC_ACQUIRE);
    if ((gone || stop) && !g->cancelled) {
        g->cancelled = true;
        for (int i = 0; i < g->n_jobs; i++)
            if (g->jobs[i].submitted && g->jobs[i].finish == ENGINE_FINISH_NONE)
                engine_cancel(g->srv->sched, g->jobs[i].id);
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

/* llama-server's completion_probabilities of entries [from, to): each token with its
 * alternatives, as log-probabilities. */
static json_t *llama_probs(server *s, const job *j, int from, int to) {
    json_t *arr = json_array();
    for (int i = from; i < to; i++) {
        const lp_entry *e = &j->lps[i];
        json_t *o = token_json(s, e->token, e->logprob, true);
        json_object_set_new(o, "id", json_integer(e->token));
        json_t *top = json_array();
        for (int k = 0; k < e->n_top; k++) {
            json_t *t = token_json(s, e->top_ids[k], e->top_lp[k], true);
            json_object_set_new(t, "id", json_integer(e->top_ids[k]));
            json_array_append_new(top, t);
        }
        json_object_set_new(o, "top_logprobs", top);
        json_array_append_new(arr, o);
    }
    return arr;
}

/* Usage over the request: each prompt counted once (as OpenAI counts it for n > 1), every
 * sequence's generated tokens (best_of's discarded ones too, which were computed). */
static json_t *usage_json(const group *g) {
    int prompt = 0, generated = 0, cached = 0;
    for (int i = 0; i < g->n_jobs; i++) {
        const job *j = &g->jobs[i];
        generated += j->n_generated;
        if (i % g->best_of == 0) prompt += j->n_prompt, cached += j->n_cached;
    }
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", prompt, "completion_tokens",
                     generated, "total_tokens", prompt + generated, "prompt_tokens_details",
                     "cached_tokens", cached);
}

static json_t *envelope(server *s, const group *g, const char *object, json_t *choices) {
    return json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", g->resp_id, "object", object, "created",
                     (json_int_t)g->created, "model", s->o.model_id, "choices", choices);
}

/* llama-server's stop_type: a stop string is a "word", an end id "eos". */
static const char *llama_stop_type(const job *j) {
    return j->finish == ENGINE_FINISH_LENGTH      ? "limit"
           : j->finish == ENGINE_FINISH_CANCELLED ? "abort"
           : j->stop_index >= 0                   ? "word"
                                                  : "eos";
}

static json_t *llama_body(server *s, const group *g, const job *j, const char *content, bool stop,
                          int lp_from, int lp_to) {
    json_t *o =
        json_pack("{s:s,s:b,s:s}", "content", content, "stop", stop, "model", s->o.model_id);
    if (g->logprobs && lp_to > lp_from)
        json_object_set_new(o, "completion_probabilities", llama_probs(s, j, lp_from, lp_to));
    if (stop) {
        double gen_s = j->t_end - g->t_submit - j->ttft;
        json_object_set_new(o, "stop_type", json_string(llama_stop_type(j)));
        json_object_set_new(o, "stopping_word",
                            json_string(j->stop_index >= 0 ? g->stop[j->stop_index] : ""));
        json_object_set_new(o, "tokens_predicted", json_integer(j->n_generated));
        json_object_set_new(o, "tokens_evaluated", json_integer(j->n_prompt));
        json_object_set_new(o, "tokens_cached", json_integer(j->n_cached));
        if (g->prompt) json_object_set_new(o, "prompt", json_string(g->prompt));
        json_object_set_new(o, "timings",
                            json_pack("{s:f,s:f,s:i}", "prompt_ms", j->ttft * 1e3, "predicted_ms",
                                      gen_s * 1e3, "predicted_n", j->n_generated));
    }
    return o;
}

/* The text a choice shows: its prompt's first, when echo asks. Caller frees. */
static char *choice_text(const group *g, const job *j, size_t *len) {
    size_t e = g->echo[j->prompt] ? g->echo_len[j->prompt] : 0;
    *len = e + j->text_len;
    char *t = base_xmalloc(*len + 1);
    if (e) memcpy(t, g->echo[j->prompt], e);
    if (j->text_len) memcpy(t + e, j->text, j->text_len);
    t[*len] = 0;
    return t;
}

static json_t *choice_json(server *s, const group *g, const job *j) {
    bool chat = g->kind == SERVER_CHAT;
    size_t len;
    char *text = choice_text(g, j, &len);
    bool called = false;
    json_t *choice = json_pack("{s:i}", "index", j->index);
    if (chat)
        json_object_set_new(choice, "message", chat_message(j, &called));
    else
        json_object_set_new(choice, "text", json_stringn(text, len));
    json_object_set_new(
        choice, "finish_reason",
        json_string(chat ? chat_finish_reason(j->finish, called) : finish_reason(j->finish)));
    free(text);
    json_object_set_new(choice, "logprobs",
                        !g->logprobs ? json_null()
                        : chat       ? chat_logprobs(s, j, 0, j->n_lps)
                                     : completion_logprobs(s, j, 0, j->n_lps));
    return choice;
}

static int by_logprob(const void *a, const void *b) {
    double x = (*(const job *const *)a)->sum_logprob, y = (*(const job *const *)b)->sum_logprob;
    return (x < y) - (x > y);
}

/* best_of: of each prompt's sequences, the n_choices most likely (by the sum of their tokens'
 * log-probabilities) are answered, in that order. */
static void rank_choices(group *g) {
    job **order = base_xmalloc((size_t)g->best_of * sizeof *order);
    for (int p = 0; p < g->n_prompts; p++) {
        for (int k = 0; k < g->best_of; k++) order[k] = &g->jobs[p * g->best_of + k];
        qsort(order, (size_t)g->best_of, sizeof *order, by_logprob);
        for (int k = 0; k < g->best_of; k++)
            order[k]->index = k < g->n_choices ? p * g->n_choices + k : -1;
    }
    free(order);
}

/* The whole response of a request that was not streamed. */
static json_t *final_body(server *s, group *g) {
    if (g->kind == SERVER_LLAMA_COMPLETION) {
        const job *j = &g->jobs[0];
        return llama_body(s, g, j, j->text ? j->text : "", true, 0, j->n_lps);
    }
    if (g->best_of > g->n_choices) rank_choices(g);
    json_t *choices = json_array();
    for (int index = 0; index < g->n_prompts * g->n_choices; index++)
        for (int i = 0; i < g->n_jobs; i++)
            if (g->jobs[i].index == index)
                json_array_append_new(choices, choice_json(s, g, &g->jobs[i]));
    json_t *o =
        envelope(s, g, g->kind == SERVER_CHAT ? "chat.completion" : "text_completion", choices);
    json_object_set_new(o, "usage", usage_json(g));
    return o;
}

/* ---- streaming ---- */

static void out_append(group *g, const char *data, size_t n) {
    if (g->out_len + n > g->out_cap) {
        g->out_cap = (g->out_len + n) * 2;
        g->out = base_xrealloc(g->out, g->out_cap);
    }
    memcpy(g->out + g->out_len, data, n);
    g->out_len += n;
}

/* One SSE event, named or not. A chunk that cannot be built (out of memory, or text jansson
 * refuses) is sent as an error event, so that the stream still says what happened. */
static void out_named(void *sink, const char *name, json_t *o) {
    static const char unbuildable[] = "{\"error\":{\"message\":\"a chunk of the response could "
                                      "not be built\",\"type\":\"server_error\",\"code\":500}}";
    group *g = sink;
    char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (name) {
        out_append(g, "event: ", 7);
        out_append(g, name, strlen(name));
        out_append(g, "\n", 1);
    }
    out_append(g, "data: ", 6);
    out_append(g, t ? t : unbuildable, t ? strlen(t) : sizeof unbuildable - 1);
    out_append(g, "\n\n", 2);
    free(t);
}

static void out_event(group *g, json_t *o) {
    out_named(g, NULL, o);
}

/* One chunk of a choice with the text (news, for chat) and log-probabilities that arrived since
 * the last one. */
static json_t *delta_chunk(server *s, group *g, job *j, const char *text, size_t n,
                           const server_news *news, int lp_to, const char *finish) {
    if (g->kind == SERVER_LLAMA_COMPLETION) {
        json_t *o = json_pack("{s:s%,s:b}", "content", text, n, "stop", false);
        if (g->logprobs && lp_to > j->lps_sent)
            json_object_set_new(o, "completion_probabilities",
                                llama_probs(s, j, j->lps_sent, lp_to));
        return o;
    }
    bool chat = g->kind == SERVER_CHAT;
    json_t *choice = json_pack("{s:i,s:o}", "index", j->index, "finish_reason",
                               finish ? json_string(finish) : json_null());
    json_t *lp = !g->logprobs ? json_null()
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
    return envelope(s, g, chat ? "chat.completion.chunk" : "text_completion",
                    json_pack("[o]", choice));
}

/* Formats (mu held) whatever is new in one choice; its first chunk carries the echo. */
static void format_job(server *s, group *g, job *j) {
    size_t n = j->text_len - j->text_sent;
    int lp_to = j->n_lps;
    const char *echo = j->head_sent ? NULL : g->echo[j->prompt];
    bool chat = g->kind == SERVER_CHAT;
    server_news news = {0};
    if (chat)
        server_output_news(&j->split, j->text ? j->text : "", j->text_len,
                           j->finish != ENGINE_FINISH_NONE, &news);
    bool fresh = chat
                     ? news.content_len || news.reasoning_len || news.scan.n_calls > news.first_call
                     : n > 0;
    if (fresh || lp_to > j->lps_sent || echo || (!j->head_sent && chat)) {
        size_t len = n;
        char *text = NULL;
        if (echo) {
            text = choice_text(g, j, &len);
        } else {
            text = base_xmalloc(n + 1);
            if (n) memcpy(text, j->text + j->text_sent, n);
        }
        out_event(g, delta_chunk(s, g, j, text, len, chat ? &news : NULL, lp_to, NULL));
        free(text);
        j->head_sent = true;
        j->text_sent = j->text_len;
        j->lps_sent = lp_to;
    }
    server_news_free(&news);
    if (j->finish == ENGINE_FINISH_NONE || j->tail_sent) return;
    j->tail_sent = true;
    if (j->finish == ENGINE_FINISH_ERROR)
        out_event(g, json_pack("{s:{s:s,s:s,s:i}}", "error", "message",
                               j->error ? j->error : "generation failed", "type", "server_error",
                               "code", 500));
    else if (g->kind == SERVER_LLAMA_COMPLETION)
        out_event(g, llama_body(s, g, j, "", true, 0, 0));
    else
        out_event(g, delta_chunk(s, g, j, "", 0, NULL, j->lps_sent,
                                 chat ? chat_finish_reason(j->finish, j->split.calls_sent > 0)
                                      : finish_reason(j->finish)));
}

/* What a writer sees of job j (mu held). */
static server_seq seq_view(const group *g, job *j) {
    return (server_seq){.text = j->text ? j->text : "",
                        .len = j->text_len,
                        .split = &j->split,
                        .finish = j->finish,
                        .stop = j->stop_index >= 0 ? g->stop[j->stop_index] : NULL,
                        .error = j->error,
                        .n_prompt = j->n_prompt,
                        .n_generated = j->n_generated,
                        .n_cached = j->n_cached};
}

/* Formats (mu held) whatever is new in every choice, then the usage and [DONE] once all have
 * ended; a writer's stream says all itself. */
static void format_news(server *s, group *g) {
    if (g->w.stream) {
        server_seq q = seq_view(g, &g->jobs[0]);
        g->w.stream(g->w.state, &q, out_named, g);
        g->done_sent = all_done(g);
        return;
    }
    for (int i = 0; i < g->n_jobs; i++) format_job(s, g, &g->jobs[i]);
    if (!all_done(g) || g->done_sent) return;
    g->done_sent = true;
    if (g->kind == SERVER_LLAMA_COMPLETION) return;
    if (g->include_usage) {
        json_t *o =
            envelope(s, g, g->kind == SERVER_CHAT ? "chat.completion.chunk" : "text_completion",
                     json_array());
        json_object_set_new(o, "usage", usage_json(g));
        out_event(g, o);
    }
    out_append(g, "data: [DONE]\n\n", 14);
}

/* The figures of the request's log line (mu held). */
static void note_exchange(const group *g) {
    g->x->n_in = g->x->n_out = 0;
    g->x->ttft = -1;
    for (int i = 0; i < g->n_jobs; i++) {
        const job *j = &g->jobs[i];
        if (i % g->best_of == 0) g->x->n_in += j->n_prompt;
        g->x->n_out += j->n_generated;
        if (j->n_generated && (g->x->ttft < 0 || j->ttft < g->x->ttft)) g->x->ttft = j->ttft;
    }
}

/* The connection's side lets go of the group (its response is done or abandoned). */
static void connection_done(group *g) {
    __atomic_sub_fetch(&g->srv->active, 1, __ATOMIC_ACQ_REL);
    group_release(g);
}

/* A request that a drain or an abort ended (mu held), not one whose client left. */
static bool cut_short(const group *g) {
    if (!__atomic_load_n(&g->srv->draining, __ATOMIC_ACQUIRE)) return false;
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].finish == ENGINE_FINISH_CANCELLED) return true;
    return false;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    group *g = cls;
    pthread_mutex_lock(&g->mu);
    while (g->out_off == g->out_len) {
        g->out_off = g->out_len = 0;
        if (g->done_sent) {
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        format_news(g->srv, g);
        if (g->done_sent) note_exchange(g);
        if (g->done_sent && cut_short(g)) __atomic_add_fetch(&g->srv->cut, 1, __ATOMIC_RELAXED);
        if (g->out_len) break;
        if (group_wait(g)) {
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = g->out_len - g->out_off < max ? g->out_len - g->out_off : max;
    memcpy(buf, g->out + g->out_off, n);
    g->out_off += n;
    pthread_mutex_unlock(&g->mu);
    return (ssize_t)n;
}

/* Cancels (mu held) the jobs still running, once. */
static void cancel_running(group *g) {
    if (g->cancelled) return;
    g->cancelled = true;
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].submitted && g->jobs[i].finish == ENGINE_FINISH_NONE)
            engine_cancel(g->srv->sched, g->jobs[i].id);
}

/* MHD is done with the stream (finished, or the client left): requests still running are
 * cancelled so that their blocks come back. */
static void stream_free(void *cls) {
    group *g = cls;
    pthread_mutex_lock(&g->mu);
    cancel_running(g);
    pthread_mutex_unlock(&g->mu);
    connection_done(g);
}

static enum MHD_Result reply_stream(server *s, struct MHD_Connection *c, group *g) {
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, g, stream_free);
    if (!r) {
        stream_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type",
                            g->stream ? "text/event-stream" : "application/json");
    if (g->stream) MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result rc = server_queue(s, c, 200, r);
    MHD_destroy_response(r);
    return rc;
}

static const job *failed_job(const group *g) {
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].finish == ENGINE_FINISH_ERROR) return &g->jobs[i];
    return NULL;
}

/* Whether the connection may stop waiting (mu held): a stream once a choice has a token (so
 * that a request failing before any gets its own status), a whole response at the end. */
static bool ready_to_answer(const group *g) {
    if (all_done(g)) return true;
    if (!g->stream) return false;
    for (int i = 0; i < g->n_jobs; i++)
        if (g->jobs[i].n_generated > 0) return true;
    return false;
}

/* Waits for the first token of a stream, or for the end; a stream then goes on in MHD's hands,
 * anything else is answered here. A client that left gets nothing, once its requests have
 * ended (so that their blocks are back before the connection closes). */
static enum MHD_Result reply(server *s, struct MHD_Connection *c, group *g, bool http11) {
    pthread_mutex_lock(&g->mu);
    bool gone = false, probed = !http11;
    while (!all_done(g) && (gone || !ready_to_answer(g))) {
        gone = group_wait(g) || gone;
        if (!probed && server_client_done_sending(c)) probed = server_probe_client(c);
    }
    bool nothing = total_generated(g) == 0;
    for (int i = 0; i < g->n_jobs; i++) nothing = nothing && g->jobs[i].text_len == 0;
    const job *bad = failed_job(g);
    note_exchange(g);
    enum MHD_Result rc;
    if (gone) {
        rc = MHD_NO;
    } else if (nothing && cut_short(g)) {
        __atomic_add_fetch(&s->cut, 1, __ATOMIC_RELAXED);
        rc = server_reply_error_as(s, c, g->w.error, 503, "unavailable_error",
                                   "the server is shutting down; the request was not started");
    } else if (bad && (nothing || !g->stream)) {
        rc = server_reply_error_as(s, c, g->w.error, 500, "server_error", "%s",
                                   bad->error ? bad->error : "failed");
    } else if (g->stream) {
        pthread_mutex_unlock(&g->mu);
        return reply_stream(s, c, g);
    } else if (!g->w.whole) {
        if (cut_short(g)) __atomic_add_fetch(&s->cut, 1, __ATOMIC_RELAXED);
        rc = server_reply_json(s, c, 200, final_body(s, g));
    } else {
        unsigned status = 200;
        server_seq q = seq_view(g, &g->jobs[0]);
        json_t *o = g->w.whole(g->w.state, &q, &status);
        if (cut_short(g)) __atomic_add_fetch(&s->cut, 1, __ATOMIC_RELAXED);
        rc = server_reply_json(s, c, status, o);
    }
    pthread_mutex_unlock(&g->mu);
    connection_done(g);
    return rc;
}

/* The group for p's prompts, each best_of times; takes p's echo texts and w's state. */
static group *group_new(server *s, struct MHD_Connection *c, server_exchange *x, server_params *p,
                        const server_writer *w) {
    static uint64_t counter;
    group *g = base_xcalloc(1, sizeof *g);
    if (w) g->w = *w;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->refs = 1;
    g->srv = s;
    g->conn = c;
    g->x = x;
    g->kind = p->kind;
    g->stream = p->stream;
    g->include_usage = p->include_usage;
    g->logprobs = p->req.logprobs;
    g->n_choices = p->n_choices;
    g->best_of = p->best_of;
    g->n_prompts = p->n_prompts;
    g->n_jobs = p->n_prompts * p->best_of;
    g->jobs = base_xcalloc((size_t)g->n_jobs, sizeof *g->jobs);
    for (int i = 0; i < g->n_jobs; i++) {
        job *j = &g->jobs[i];
        j->g = g;
        j->prompt = i / p->best_of;
        j->index = j->prompt * p->n_choices + i % p->best_of;
        j->stop_index = -1;
        j->split = p->out;
        json_incref(j->split.tool_defs);
    }
    g->echo = base_xcalloc((size_t)p->n_prompts, sizeof *g->echo);
    g->echo_len = base_xcalloc((size_t)p->n_prompts, sizeof *g->echo_len);
    for (int i = 0; i < p->n_prompts; i++) {
        g->echo[i] = p->prompts[i].echo;
        g->echo_len[i] = p->prompts[i].echo_len;
        p->prompts[i].echo = NULL;
    }
    g->n_stop = p->n_stop;
    g->stop = base_xcalloc((size_t)p->n_stop + 1, sizeof *g->stop);
    for (int i = 0; i < p->n_stop; i++) g->stop[i] = base_xstrdup(p->stop[i]);
    size_t len;
    base_err err;
    /* undecodable ids make the request fail later, with their own error */
    if (p->kind == SERVER_LLAMA_COMPLETION &&
        tok_decode(s->pr->tok, p->prompts[0].ids, (size_t)p->prompts[0].n_ids, false, &g->prompt,
                   &len, &err))
        g->prompt = NULL;
    g->created = (long long)time(NULL);
    g->t_submit = base_now();
    uint64_t n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
    snprintf(g->resp_id, sizeof g->resp_id, "%s-%llx%06llx",
             p->kind == SERVER_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)g->created,
             (unsigned long long)n);
    return g;
}

/* Submits job i: its prompt, and a seed of its own (the request's plus its place among its
 * prompt's sequences, so that a seeded request is reproducible and its choices differ). */
static int submit(server *s, group *g, int i, const server_params *p, engine_reject *why,
                  base_err *err) {
    job *j = &g->jobs[i];
    engine_request r = p->req;
    r.prompt = p->prompts[j->prompt].ids;
    r.n_prompt = p->prompts[j->prompt].n_ids;
    r.sampling.seed += (uint64_t)(i % p->best_of);
    /* best_of ranks by log-probability, which the engine then reports */
    if (p->best_of > p->n_choices) r.logprobs = true;
    r.on_event = on_event;
    r.ctx = j;
    pthread_mutex_lock(&g->mu);
    g->refs++;
    j->submitted = true;
    pthread_mutex_unlock(&g->mu);
    if (engine_submit(s->sched, &r, &j->id, why, err) == 0) return 0;
    pthread_mutex_lock(&g->mu);
    g->refs--;
    j->submitted = false;
    pthread_mutex_unlock(&g->mu);
    return -1;
}

/* Whether (mu held) every submitted job has its prompt in the KV: a first token, or an end. */
static bool leaders_prefilled(const group *g) {
    for (int i = 0; i < g->n_jobs; i++) {
        const job *j = &g->jobs[i];
        if (j->submitted && j->n_generated == 0 && j->finish == ENGINE_FINISH_NONE) return false;
    }
    return true;
}

/* Marks (mu held) the jobs never submitted as ended with nothing, so that waits see them done:
 * with an error (why), or cancelled (why NULL) when the others were. */
static void abandon_unsubmitted(group *g, const char *why) {
    for (int i = 0; i < g->n_jobs; i++) {
        job *j = &g->jobs[i];
        if (j->submitted || j->finish != ENGINE_FINISH_NONE) continue;
        j->finish = why ? ENGINE_FINISH_ERROR : ENGINE_FINISH_CANCELLED;
        if (why) j->error = base_xstrdup(why);
    }
}

/* Starts every sequence, the prompt prefilled once: the first sequence of each prompt goes
 * alone, and once its prompt is in the KV (its first token) the others follow, adopting the
 * prompt's full blocks from the prefix cache (only the last partial block is computed again).
 * Returns 0, or the status of an error answered here. */
static unsigned start_all(server *s, group *g, const server_params *p, base_err *err) {
    engine_reject why;
    for (int i = 0; i < g->n_jobs; i += p->best_of)
        if (submit(s, g, i, p, &why, err)) break;
    pthread_mutex_lock(&g->mu);
    bool started = g->jobs[g->n_jobs - p->best_of].submitted, gone = false;
    while (started && p->best_of > 1 && !gone && !g->cancelled && !leaders_prefilled(g))
        gone = group_wait(g);
    bool leaders_ok = started && !gone && !g->cancelled && !failed_job(g);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; leaders_ok && i < g->n_jobs; i++)
        if (i % p->best_of && submit(s, g, i, p, &why, err)) {
            started = false;
            break;
        }
    pthread_mutex_lock(&g->mu);
    if (!started) cancel_running(g);
    /* the client left, the server stops, or a first sequence failed: the rest never start */
    abandon_unsubmitted(g, started ? NULL : err->msg);
    pthread_mutex_unlock(&g->mu);
    if (started) return 0;
    return why == ENGINE_REJECT_INVALID ? 400 : 503;
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

/* A start that failed: the sequences that did start are waited for (their blocks come back
 * before the answer), then the error goes out. */
static enum MHD_Result reply_refused(server *s, struct MHD_Connection *c, group *g, unsigned status,
                                     const char *msg) {
    pthread_mutex_lock(&g->mu);
    while (!all_done(g)) base_cond_wait_ms(&g->cv, &g->mu, SERVER_POLL_MS);
    note_exchange(g);
    pthread_mutex_unlock(&g->mu);
    enum MHD_Result rc = server_reply_error_as(
        s, c, g->w.error, status, status == 400 ? "invalid_request_error" : "unavailable_error",
        "%s", msg);
    connection_done(g);
    return rc;
}

enum MHD_Result server_route_generate(server *s, struct MHD_Connection *c, const char *url,
                                      const char *version, json_t *body, server_exchange *x) {
    server_params p;
    base_err err;
    int vocab = model_config(s->rt->model)->vocab_size;
    server_options o = server_options_now(s);
    if (server_params_parse(body, route_kind(url), &o, s->pr, vocab, s->rt->kv_plan.ctx_size, &p,
                            &err)) {
        server_params_free(&p);
        return server_reply_error(s, c, 400, "invalid_request_error", "%s", err.msg);
    }
    return server_generate(s, c, version, &p, NULL, x);
}

enum MHD_Result server_generate(server *s, struct MHD_Connection *c, const char *version,
                                server_params *p, const server_writer *w, server_exchange *x) {
    base_err err;
    group *g = group_new(s, c, x, p, w);
    __atomic_add_fetch(&s->active, 1, __ATOMIC_ACQ_REL);
    unsigned status = start_all(s, g, p, &err);
    server_params_free(p);
    if (status) return reply_refused(s, c, g, status, err.msg);
    return reply(s, c, g, strcmp(version, MHD_HTTP_VERSION_1_1) == 0);
}
