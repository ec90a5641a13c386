/* Prompts: the model's tokenizer and chat template, loaded together. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

/* Normalizers can shrink text before it is split into tokens (NFKC maps some 4-byte
 * characters to one byte): the length bound allows for it. */
#define PROMPT_NORMALIZE_SHRINK 4

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

int engine_prompter_open(const char *dir, const char *template_file, engine_prompter **out,
                         base_err *err) {
    engine_prompter *p = base_xcalloc(1, sizeof *p);
    char *source = NULL;
    if (tok_load(dir, &p->tok, err) || chat_config_load(dir, &source, &p->special_vars, err)) {
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
    free(source);
    if (rc) {
        engine_prompter_close(p);
        return base_fail_wrap(err, "%s: chat template", template_file ? template_file : dir);
    }
    p->max_token_bytes = longest_token(p->tok);
    *out = p;
    return 0;
}

void engine_prompter_close(engine_prompter *p) {
    if (!p) return;
    tok_free(p->tok);
    chat_template_free(p->tmpl);
    json_decref(p->special_vars);
    free(p);
}

int engine_prompter_render(const engine_prompter *p, const json_t *messages,
                           bool add_generation_prompt, const json_t *extra, char **prompt,
                           base_err *err) {
    if (!p->tmpl) return base_fail(err, "the model has no chat template (--chat-template-file)");
    json_t *vars = json_deep_copy(p->special_vars);
    if (extra) json_object_update(vars, (json_t *)extra);
    json_object_set(vars, "messages", (json_t *)messages);
    json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    int rc = chat_template_render(p->tmpl, vars, prompt, NULL, err);
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
                                bool add_generation_prompt, const json_t *extra, int max_tokens,
                                int32_t **ids, int *n, base_err *err) {
    char *prompt;
    if (engine_prompter_render(p, messages, add_generation_prompt, extra, &prompt, err)) return -1;
    int rc = encode(p, prompt, false, max_tokens, ids, n, err);
    free(prompt);
    return rc;
}

int engine_prompter_encode_text(const engine_prompter *p, const char *text, int max_tokens,
                                int32_t **ids, int *n, base_err *err) {
    return encode(p, text, true, max_tokens, ids, n, err);
}
