/* Prompts: the model's tokenizer and chat template, loaded together. */
#include "model/arch/arch.h"
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* Normalizers can shrink text before it is split into tokens (NFKC maps some 4-byte
 * characters to one byte): the length bound allows for it. */
#define PROMPT_NORMALIZE_SHRINK 4

/* Whether the template loops over a message's content (Gemma 3's does, to place images): then
 * it gets content parts as a list, as transformers would pass them; others get one string. */
static bool walks_content(const char *source) {
    static const char *const loops[] = {"in message['content']", "in message[\"content\"]",
                                        "in message.content"};
    for (size_t i = 0; i < sizeof loops / sizeof *loops; i++)
        for (const char *at = strstr(source, loops[i]); at; at = strstr(at + 1, loops[i]))
            for (const char *b = at; b > source && at - b < 64; b--)
                if (strncmp(b, "for ", 4) == 0) return true;
    return false;
}

static size_t longest_token(const tok_tokenizer *tok) {
    size_t longest = 1;
    for (int32_t id = 0; id < tok_vocab_size(tok); id++) {
        char *bytes = NULL;
        size_t len = 0;
        base_err err;
        if (tok_token_bytes(tok, id, &bytes, &len, &err) == 0 && len > longest) longest = len;
        free(bytes);
    }
    return longest;
}

/* The model's vocab_size from dir/config.json, 0 for a folder without one: the tokenizer's
 * ids must have rows in the model's embedding, and a tokenizer.json must not make loading
 * allocate for ids past it. */
static int model_vocab_size(const char *dir, int *vocab_size, base_err *err) {
    *vocab_size = 0;
    char *path = base_path_join(dir, "config.json");
    bool exists = base_file_exists(path);
    free(path);
    io_model_config cfg;
    if (!exists) return 0;
    if (model_config_load(dir, &cfg, NULL, err)) return -1;
    *vocab_size = cfg.vocab_size;
    io_config_free(&cfg);
    return 0;
}

int engine_prompter_open(const char *dir, const char *template_file, engine_prompter **out,
                         base_err *err) {
    engine_prompter *p = base_xcalloc(1, sizeof *p);
    char *source = NULL;
    int vocab_size;
    if (model_vocab_size(dir, &vocab_size, err) || tok_load(dir, vocab_size, &p->tok, err) ||
        chat_config_load(dir, &source, &p->special_vars, err)) {
        engine_prompter_close(p);
        return -1;
    }
    if (template_file) {
        free(source);
        source = NULL;
        if (base_read_file(template_file, &source, NULL, err)) {
            engine_prompter_close(p);
            return base_fail_wrap(err, "--chat-template-file");
        }
    }
    int rc = source ? chat_template_parse(source, &p->tmpl, err) : 0;
    p->content_as_list = source && walks_content(source);
    p->tool_format = engine_tool_format_detect(source);
    free(source);
    if (rc) {
        engine_prompter_close(p);
        return base_fail_wrap(err, "%s: chat template", template_file ? template_file : dir);
    }
    p->max_token_bytes = longest_token(p->tok);
    *out = p;
    return 0;
}

int engine_prompter_set_template(engine_prompter *p, const char *source, base_err *err) {
    chat_template *t;
    if (chat_template_parse(source, &t, err)) return base_fail_wrap(err, "chat template");
    chat_template_free(p->tmpl);
    p->tmpl = t;
    p->content_as_list = walks_content(source);
    p->tool_format = engine_tool_format_detect(source);
    return 0;
}

void engine_prompter_close(engine_prompter *p) {
    if (!p) return;
    tok_free(p->tok);
    chat_template_free(p->tmpl);
    json_decref(p->special_vars);
    free(p);
}

/* The text continue_final_message must end the prompt with: the final message's content, or
 * its last text part. */
static const char *final_text(const json_t *messages) {
    const json_t *c =
        json_object_get(json_array_get(messages, json_array_size(messages) - 1), "content");
    for (size_t i = json_array_size(c); i > 0; i--) {
        const json_t *t = json_object_get(json_array_get(c, i - 1), "text");
        if (json_is_string(t)) return json_string_value(t);
    }
    return json_string_value(c);
}

static size_t span_trimmed(const char *s, size_t n, const char **start) {
    while (n && strchr(" \t\n\r", s[0])) s++, n--;
    while (n && strchr(" \t\n\r", s[n - 1])) n--;
    *start = s;
    return n;
}

static const char *find_last(const char *hay, const char *needle, size_t n) {
    const char *last = NULL;
    for (const char *at = hay; (at = memmem(at, strlen(at), needle, n)); at++) last = at;
    return last;
}

/* Cuts the rendered prompt after the final message's text, as transformers does for
 * continue_final_message: the end-of-turn the template wrote after it goes, so the model
 * continues the message. A template that changed the text beyond its outer white space cannot
 * be continued. */
static int cut_after_final(char *prompt, const char *final, base_err *err) {
    if (!final)
        return base_fail(err, "continue_final_message: the final message has no text to continue");
    const char *core;
    size_t n = span_trimmed(final, strlen(final), &core);
    const char *at = n ? find_last(prompt, core, n) : NULL;
    if (!at && n)
        return base_fail(err, "continue_final_message: the chat template does not reproduce the "
                              "final message, so it cannot be continued");
    if (!n) return 0;
    /* the message's own trailing white space stays when the template kept it (and the
     * message has no leading white space, as transformers compares it) */
    size_t keep = strlen(core);
    if (strlen(final) == keep && strncmp(at, final, keep) == 0) n = keep;
    prompt[at - prompt + (ptrdiff_t)n] = 0;
    return 0;
}

/* GPT-OSS's template reads an assistant's analysis from `thinking` (sent back between a call
 * and its result, as the Harmony guide asks), which OpenAI's clients send as
 * reasoning_content. */
static void harmony_thinking(json_t *msgs) {
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        json_t *r = json_object_get(m, "reasoning_content");
        if (role && strcmp(role, "assistant") == 0 && json_is_string(r) &&
            !json_object_get(m, "thinking"))
            json_object_set(m, "thinking", r);
    }
}

int engine_prompter_render(const engine_prompter *p, const json_t *messages,
                           const engine_chat_options *o, char **prompt, base_err *err) {
    if (!p->tmpl) return base_fail(err, "the model has no chat template (--chat-template-file)");
    if (o->add_generation_prompt && o->continue_final_message)
        return base_fail(err, "'add_generation_prompt' and 'continue_final_message' cannot both "
                              "be true");
    json_t *msgs;
    if (engine_messages_normalize(messages, p->content_as_list, &msgs, err)) return -1;
    if (p->tool_format == ENGINE_TOOLS_HARMONY) harmony_thinking(msgs);
    if (o->continue_final_message && !json_array_size(msgs)) {
        json_decref(msgs);
        return base_fail(err, "continue_final_message: there is no message to continue");
    }
    json_t *vars = json_deep_copy(p->special_vars);
    if (o->extra) json_object_update(vars, (json_t *)o->extra);
    json_object_set_new(vars, "messages", msgs);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(o->add_generation_prompt));
    int rc = chat_template_render(p->tmpl, vars, prompt, NULL, err);
    if (rc == 0 && o->continue_final_message && cut_after_final(*prompt, final_text(msgs), err)) {
        free(*prompt);
        *prompt = NULL;
        rc = -1;
    }
    json_decref(vars);
    return rc;
}

static int encode(const engine_prompter *p, const char *text, bool add_special, int max_tokens,
                  int32_t **ids, int *n, base_err *err) {
    size_t len = strlen(text), count;
    if (max_tokens > 0 && len / PROMPT_NORMALIZE_SHRINK / p->max_token_bytes >= (size_t)max_tokens)
        return base_fail(err,
                         "the prompt is %zu bytes, more than %d tokens can hold (this tokenizer's "
                         "longest token is %zu bytes)",
                         len, max_tokens, p->max_token_bytes);
    if (tok_encode(p->tok, text, len, add_special, ids, &count, err)) return -1;
    *n = (int)count;
    return 0;
}

int engine_prompter_encode_chat(const engine_prompter *p, const json_t *messages,
                                const engine_chat_options *o, int max_tokens, int32_t **ids, int *n,
                                base_err *err) {
    char *prompt;
    if (engine_prompter_render(p, messages, o, &prompt, err)) return -1;
    int rc = engine_prompter_encode_rendered(p, prompt, max_tokens, ids, n, err);
    free(prompt);
    return rc;
}

int engine_prompter_encode_rendered(const engine_prompter *p, const char *prompt, int max_tokens,
                                    int32_t **ids, int *n, base_err *err) {
    return encode(p, prompt, false, max_tokens, ids, n, err);
}

int engine_prompter_encode_text(const engine_prompter *p, const char *text, int max_tokens,
                                int32_t **ids, int *n, base_err *err) {
    return encode(p, text, true, max_tokens, ids, n, err);
}
