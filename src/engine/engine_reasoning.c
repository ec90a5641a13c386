/* Reasoning in generated text: the thinking between <think> and </think>, split from the
 * answer. A template that opens <think> in its generation prompt (Qwen3's with thinking on,
 * DeepSeek-R1's) makes the output start inside the thinking, with no opening tag to see. */
#include "engine/engine.h"

#include <string.h>

int engine_reasoning_format_from_name(const char *name, engine_reasoning_format *out,
                                      base_err *err) {
    static const char *const names[] = {"none", "deepseek", "auto"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (engine_reasoning_format)i;
            return 0;
        }
    return base_fail(err, "reasoning format '%s' is not implemented (none, deepseek or auto)",
                     name);
}

/* Bytes at the end of s (n) that are a proper prefix of lit: held, since more text may make
 * them the tag. */
static size_t partial_tail(const char *s, size_t n, const char *lit) {
    size_t k = strlen(lit);
    for (size_t i = n > k ? n - k + 1 : 0; i < n; i++)
        if (memcmp(s + i, lit, n - i) == 0) return n - i;
    return 0;
}

static size_t skip_newlines(const char *s, size_t n, size_t i) {
    while (i < n && (s[i] == '\n' || s[i] == '\r')) i++;
    return i;
}

void engine_think_split_text(const char *text, size_t len, bool inside, bool final,
                             engine_think_split *out) {
    const size_t open = strlen(ENGINE_THINK_OPEN), close = strlen(ENGINE_THINK_CLOSE);
    size_t start = 0;
    while (start < len && strchr(" \t\r\n", text[start])) start++;
    memset(out, 0, sizeof *out);
    if (!inside) {
        bool opens = len - start >= open && memcmp(text + start, ENGINE_THINK_OPEN, open) == 0;
        bool maybe =
            len - start < open && memcmp(text + start, ENGINE_THINK_OPEN, len - start) == 0;
        if (!opens && (!maybe || final)) {
            out->content_start = 0;
            return;
        }
        if (!opens) { /* too little text to tell: hold it */
            out->content_start = len;
            out->thinking = true;
            return;
        }
        start += open;
    }
    out->reasoning_start = start;
    out->thinking = true;
    const char *end = memmem(text + start, len - start, ENGINE_THINK_CLOSE, close);
    if (end) {
        out->reasoning_len = (size_t)(end - text) - start;
        out->content_start = skip_newlines(text, len, (size_t)(end - text) + close);
        out->thinking = false;
        return;
    }
    out->reasoning_len =
        len - start - (final ? 0 : partial_tail(text + start, len - start, ENGINE_THINK_CLOSE));
    out->content_start = len;
}

bool engine_prompt_opens_think(const char *prompt) {
    size_t n = strlen(prompt), k = strlen(ENGINE_THINK_OPEN);
    while (n && strchr(" \t\r\n", prompt[n - 1])) n--;
    return n >= k && memcmp(prompt + n - k, ENGINE_THINK_OPEN, k) == 0;
}
