/* The answer's parts, kept consistent between streamed and whole responses: each part only
 * grows from one scan to the next (the splitters hold text that may still become a tag or a
 * call marker), so a delta is what a part holds past what was sent. */
#include "server/server_output.h"

#include <stdlib.h>
#include <string.h>

/* What of a part (n bytes at s) lies past the sent bytes: a copy in *out, counted as sent. */
static void part_news(const char *s, size_t n, size_t *sent, char **out, size_t *out_len) {
    if (n <= *sent) return;
    *out_len = n - *sent;
    *out = base_xmalloc(*out_len + 1);
    memcpy(*out, s + *sent, *out_len);
    (*out)[*out_len] = 0;
    *sent = n;
}

static void harmony_news(server_output *o, const char *text, size_t len, bool final,
                         server_news *n) {
    engine_harmony_split h;
    engine_harmony_split_text(text, len, final, o->reasoning, o->tools, &h);
    part_news(h.reasoning, h.reasoning_len, &o->reasoning_sent, &n->reasoning, &n->reasoning_len);
    part_news(h.content, h.content_len, &o->content_sent, &n->content, &n->content_len);
    /* calls past parallel_tool_calls' one are dropped, as the scan's are */
    int keep = o->calls_max && h.n_calls > o->calls_max ? o->calls_max : h.n_calls;
    for (int i = keep; i < h.n_calls; i++) {
        free(h.calls[i].name);
        free(h.calls[i].arguments);
    }
    n->scan.calls = h.calls;
    n->scan.n_calls = keep;
    h.calls = NULL;
    h.n_calls = 0;
    engine_harmony_split_free(&h);
    n->first_call = o->calls_sent;
    if (n->scan.n_calls > o->calls_sent) o->calls_sent = n->scan.n_calls;
}

void server_output_news(server_output *o, const char *text, size_t len, bool final,
                        server_news *n) {
    memset(n, 0, sizeof *n);
    if (o->harmony) {
        harmony_news(o, text, len, final, n);
        return;
    }
    engine_think_split t = {.content_start = 0};
    if (o->reasoning) engine_think_split_text(text, len, o->inside, final, &t);
    part_news(text + t.reasoning_start, t.reasoning_len, &o->reasoning_sent, &n->reasoning,
              &n->reasoning_len);
    const char *c = text + t.content_start;
    size_t clen = len - t.content_start, head = clen, rest = clen;
    if (o->tools) {
        engine_tools_scan(o->format, c, clen, final, o->forced, o->tool_defs, &n->scan);
        while (o->calls_max && n->scan.n_calls > o->calls_max) {
            engine_tool_call *x = &n->scan.calls[--n->scan.n_calls];
            free(x->name);
            free(x->arguments);
        }
        head = n->scan.content_len;
        rest = n->scan.rest_start;
    }
    /* the content is the text before the calls, then (final) what follows them */
    size_t total = head + (clen - rest);
    if (total > o->content_sent) {
        n->content = base_xmalloc(total - o->content_sent + 1);
        size_t w = 0;
        if (o->content_sent < head) {
            memcpy(n->content, c + o->content_sent, head - o->content_sent);
            w = head - o->content_sent;
        }
        size_t from = o->content_sent > head ? rest + (o->content_sent - head) : rest;
        memcpy(n->content + w, c + from, clen - from);
        n->content_len = w + clen - from;
        n->content[n->content_len] = 0;
        o->content_sent = total;
    }
    n->first_call = o->calls_sent;
    if (n->scan.n_calls > o->calls_sent) o->calls_sent = n->scan.n_calls;
}

void server_news_free(server_news *n) {
    free(n->reasoning);
    free(n->content);
    engine_tool_scan_free(&n->scan);
}

void server_new_id(char *out, size_t size, const char *prefix) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    static uint64_t counter;
    /* unique within the process and unguessable enough for a correlation id */
    uint64_t x = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull ^
                 (uint64_t)(base_now() * 1e9);
    size_t n = strlen(prefix), end = n + SERVER_ID_DIGITS < size ? n + SERVER_ID_DIGITS : size - 1;
    memcpy(out, prefix, n < end ? n : end);
    for (size_t i = n; i < end; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        out[i] = digits[x % (sizeof digits - 1)];
    }
    out[end] = 0;
}

json_t *server_tool_call_json(const engine_tool_call *c, int index) {
    char id[32];
    server_new_id(id, sizeof id, "call_");
    json_t *o = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name",
                          c->name, "arguments", c->arguments);
    if (o && index >= 0) json_object_set_new(o, "index", json_integer(index));
    return o;
}
