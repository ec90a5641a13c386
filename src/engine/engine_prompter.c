/* Prompts: the model's tokenizer and chat template, loaded together. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

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
    if (io_config_load(dir, &cfg, err)) return -1;
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
    free(source);
    if (rc) {
        engine_prompter_close(p);
        return base_fail_wrap(err, "%s: chat template", template_file ? template_file : dir);
    }
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

static int encode(const engine_prompter *p, const char *text, bool add_special, int32_t **ids,
                  int *n, base_err *err) {
    size_t count;
    if (tok_encode(p->tok, text, strlen(text), add_special, ids, &count, err)) return -1;
    *n = (int)count;
    return 0;
}

int engine_prompter_encode_chat(const engine_prompter *p, const json_t *messages,
                                bool add_generation_prompt, const json_t *extra, int32_t **ids,
                                int *n, base_err *err) {
    char *prompt;
    if (engine_prompter_render(p, messages, add_generation_prompt, extra, &prompt, err)) return -1;
    int rc = encode(p, prompt, false, ids, n, err);
    free(prompt);
    return rc;
}

int engine_prompter_encode_text(const engine_prompter *p, const char *text, int32_t **ids, int *n,
                                base_err *err) {
    return encode(p, text, true, ids, n, err);
}
