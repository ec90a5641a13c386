/* GPT-OSS Harmony messages in generated text, split into reasoning, content and tool calls.
 *
 * The spellings, checked against OpenAI's harmony format guide (openai/harmony docs/format.md)
 * and the o200k_harmony special tokens in GPT-OSS's tokenizer.json:
 *   <|start|> 200006   opens a message; its header follows (role, recipient, channel)
 *   <|channel|> 200005 the channel word follows: analysis, commentary or final
 *   <|constrain|> 200003 the content type of a call follows (json); read past, never needed
 *   <|message|> 200008 ends the header; the body follows
 *   <|end|> 200007     ends a message that more messages may follow
 *   <|return|> 200002, <|call|> 200012: end the turn (a final answer, a tool call); both are
 *                      stop tokens, so the text the scheduler gives has neither
 * A recipient is `to=functions.NAME`, in the header before or after <|channel|> ("the
 * recipient might be defined in the role or channel section of the header"). The first
 * message has no <|start|>assistant: the prompt ends with it.
 *
 * Split decisions rest on what is already in the text, never on what may follow, so each
 * part only grows from one split to the next and a stream of deltas adds up to the whole:
 * a header is held until its <|message|>, a call until its end, and a body's tail that may
 * still become a marker until it can tell. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#define H_START   "<|start|>"
#define H_CHANNEL "<|channel|>"
#define H_MESSAGE "<|message|>"
#define H_END     "<|end|>"
#define H_RETURN  "<|return|>"
#define H_CALL    "<|call|>"

/* What a message is, by its header. */
typedef enum msg_kind { MSG_BAD, MSG_REASONING, MSG_CONTENT, MSG_CALL } msg_kind;

typedef struct buf {
    char *p; /* (n) owned */
    size_t n, cap;
} buf;

static void put(buf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) b->p = base_xrealloc(b->p, b->cap = 2 * (b->n + n + 1));
    memcpy(b->p + b->n, s, n);
    b->p[b->n += n] = 0;
}

static bool starts(const char *s, size_t n, const char *lit) {
    size_t k = strlen(lit);
    return n >= k && memcmp(s, lit, k) == 0;
}

/* Whether s (n bytes) is a proper prefix of lit: more text may complete it. */
static bool prefix_of(const char *s, size_t n, const char *lit) {
    return n < strlen(lit) && memcmp(s, lit, n) == 0;
}

static const char *find(const char *s, size_t n, const char *lit) {
    return memmem(s, n, lit, strlen(lit));
}

/* The earliest of the literals (NULL-ended) in s, its length in *k; NULL when none is. */
static const char *find_first(const char *s, size_t n, const char *const *lits, size_t *k) {
    const char *best = NULL;
    for (; *lits; lits++) {
        const char *at = find(s, n, *lits);
        if (at && (!best || at < best)) best = at, *k = strlen(*lits);
    }
    return best;
}

/* Bytes at the end of s that are a proper prefix of a marker: held, since the next token may
 * complete it. */
static size_t held_tail(const char *s, size_t n) {
    static const char *const markers[] = {H_START, H_CHANNEL, H_MESSAGE, H_END, H_RETURN, H_CALL};
    const size_t longest = strlen(H_CHANNEL); /* and H_MESSAGE */
    for (size_t i = n > longest ? n - longest : 0; i < n; i++)
        for (size_t m = 0; m < sizeof markers / sizeof *markers; m++)
            if (n - i < strlen(markers[m]) && memcmp(s + i, markers[m], n - i) == 0) return n - i;
    return 0;
}

/* A header word: up to a blank, a marker or the end. */
static size_t word(const char *s, size_t n) {
    size_t i = 0;
    while (i < n && !strchr(" \t\r\n<", s[i])) i++;
    return i;
}

static bool valid_name(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", s[i]))
            return false;
    return n > 0;
}

/* The kind of the message whose header is h (n bytes, from its <|start|> or <|channel|> to
 * its <|message|>); a call's function name in *name. A role other than the assistant's, a
 * missing channel or a recipient other than a function is MSG_BAD. */
static msg_kind header_kind(const char *h, size_t n, bool tools, const char **name,
                            size_t *name_len) {
    size_t i = starts(h, n, H_START) ? strlen(H_START) : 0;
    size_t role = starts(h + i, n - i, "to=") ? 0 : word(h + i, n - i);
    if (role && (role != strlen("assistant") || memcmp(h + i, "assistant", role) != 0))
        return MSG_BAD;
    const char *ch = find(h, n, H_CHANNEL), *to = find(h, n, " to=");
    if (!ch) return MSG_BAD;
    ch += strlen(H_CHANNEL);
    size_t ch_len = word(ch, (size_t)(h + n - ch));
    if (to)
        to += strlen(" to=");
    else if (starts(h, n, "to=")) /* the first header's, right after the prompt */
        to = h + strlen("to=");
    if (to) {
        size_t k = word(to, (size_t)(h + n - to)), f = strlen("functions.");
        if (!tools || k <= f || memcmp(to, "functions.", f) != 0 || !valid_name(to + f, k - f))
            return MSG_BAD;
        *name = to + f;
        *name_len = k - f;
        return MSG_CALL;
    }
    if (ch_len == strlen("analysis") && memcmp(ch, "analysis", ch_len) == 0) return MSG_REASONING;
    if ((ch_len == strlen("final") && memcmp(ch, "final", ch_len) == 0) ||
        (ch_len == strlen("commentary") && memcmp(ch, "commentary", ch_len) == 0))
        return MSG_CONTENT;
    return MSG_BAD;
}

/* Adds the call to name whose body holds its arguments; false when that is not a JSON object. */
static bool add_call(engine_harmony_split *out, const char *name, size_t name_len, const char *body,
                     size_t n) {
    json_t *args = json_loadb(body, n, 0, NULL);
    bool ok = json_is_object(args);
    if (ok) engine_tool_calls_add(&out->calls, &out->n_calls, name, name_len, args);
    json_decref(args);
    return ok;
}

/* Text that is not a message, up to the next one: content. Returns the bytes taken, or 0
 * when the split stops here. */
static size_t plain_text(const char *s, size_t n, bool final, buf *content) {
    static const char *const opens[] = {H_START, H_CHANNEL, NULL};
    size_t k;
    const char *at = find_first(s, n, opens, &k);
    size_t take = at ? (size_t)(at - s) : final ? n : n - held_tail(s, n);
    put(content, s, take);
    return at ? take : 0;
}

/* The message at s (n bytes, opening with <|start|>, <|channel|> or, first, its recipient). Returns
 * its length, or 0 when the split stops inside it. */
static size_t message(const char *s, size_t n, bool final, bool reasoning, bool tools,
                      engine_harmony_split *out, buf *r, buf *c) {
    static const char *const ends[] = {H_END, H_RETURN, H_CALL, H_START, NULL};
    const char *msg = find(s, n, H_MESSAGE);
    if (!msg) {
        if (final) put(c, s, n);
        return 0;
    }
    const char *name = NULL;
    size_t name_len = 0, head = (size_t)(msg - s) + strlen(H_MESSAGE), mlen = 0;
    msg_kind kind = header_kind(s, (size_t)(msg - s), tools, &name, &name_len);
    const char *e = find_first(s + head, n - head, ends, &mlen);
    /* <|start|> ends a body left unclosed but belongs to the next message */
    if (e && starts(e, mlen, H_START)) mlen = 0;
    size_t body = e ? (size_t)(e - s) - head : n - head, whole = e ? head + body + mlen : n;
    if (kind == MSG_REASONING && !reasoning) { /* as written, so that nothing is lost */
        put(c, s, head);
        put(c, s + head, e || final ? body : body - held_tail(s + head, body));
        put(c, s + head + body, whole - head - body);
    } else if (kind == MSG_REASONING || kind == MSG_CONTENT) {
        put(kind == MSG_REASONING ? r : c, s + head,
            e || final ? body : body - held_tail(s + head, body));
    } else {
        if (!e && !final) return 0;
        if (kind != MSG_CALL || !add_call(out, name, name_len, s + head, body)) put(c, s, whole);
    }
    return e ? whole : 0;
}

void engine_harmony_split_text(const char *text, size_t len, bool final, bool reasoning, bool tools,
                               engine_harmony_split *out) {
    memset(out, 0, sizeof *out);
    buf r = {0}, c = {0};
    put(&r, "", 0); /* both parts are strings, empty or not */
    put(&c, "", 0);
    for (size_t i = 0, used = 1; i < len && used; i += used) {
        const char *s = text + i;
        size_t n = len - i;
        /* the output opens inside the first header, whose recipient may come first */
        bool recipient = i == 0 && (starts(s, n, " to=") || starts(s, n, "to="));
        if (i == 0 && !final && !recipient && (prefix_of(s, n, " to=") || prefix_of(s, n, "to=")))
            break;
        used = recipient || starts(s, n, H_START) || starts(s, n, H_CHANNEL)
                   ? message(s, n, final, reasoning, tools, out, &r, &c)
                   : plain_text(s, n, final, &c);
    }
    out->reasoning = r.p;
    out->reasoning_len = r.n;
    out->content = c.p;
    out->content_len = c.n;
}

void engine_harmony_split_free(engine_harmony_split *h) {
    engine_tool_calls_free(h->calls, h->n_calls);
    free(h->reasoning);
    free(h->content);
    memset(h, 0, sizeof *h);
}
