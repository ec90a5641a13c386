/* `mlxcel template`: renders a model's chat template over a conversation file and prints the
 * prompt byte for byte, as transformers' apply_chat_template(tokenize=False) would. */
#include "chat/chat.h"
#include "cli/cli.h"
#include "cli/cmd_models.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static void print_help(FILE *f) {
    fprintf(f, "usage: mlxcel template -m MODEL_DIR --messages FILE.json [options]\n"
               "\n"
               "Prints the prompt that MODEL_DIR's chat template makes of a conversation, with\n"
               "nothing added (no trailing newline). MODEL_DIR needs tokenizer_config.json.\n"
               "\n"
               "  -m, --model M                model or tokenizer directory, or a Hugging\n"
               "                               Face repo id owner/name, or a name\n"
               "                               (mlx-community/name)\n"
               "  --offline                    never download (also HF_HUB_OFFLINE=1)\n"
               "  --messages FILE.json         a JSON array of messages, or an object\n"
               "                               {\"messages\": [...], \"tools\": [...], ...kwargs}\n"
               "  --no-generation-prompt       add_generation_prompt=false (default true)\n"
               "  --chat-template-file F       use the template in F instead of the model's\n"
               "  --kwargs JSON                extra template variables, e.g.\n"
               "                               '{\"enable_thinking\": false}'\n"
               "\n"
               "example:\n"
               "  echo '[{\"role\": \"user\", \"content\": \"Hi\"}]' > chat.json\n"
               "  mlxcel template -m models/Qwen3-0.6B --messages chat.json \\\n"
               "      --kwargs '{\"enable_thinking\": false}'\n");
}

/* The template variables the way transformers passes them: special tokens, then messages,
 * tools (None when absent), documents, add_generation_prompt, then the extra kwargs. */
static int build_vars(json_t *special, json_t *file, json_t *kwargs, bool gen_prompt,
                      const char *path, json_t **out, base_err *err) {
    json_t *vars = json_deep_copy(special);
    json_t *messages = json_is_array(file) ? file : json_object_get(file, "messages");
    if (!json_is_array(messages)) {
        json_decref(vars);
        return base_fail(err,
                         "%s: expected a JSON array of messages or an object with "
                         "\"messages\"",
                         path);
    }
    json_object_set(vars, "messages", messages);
    json_object_set_new(vars, "tools", json_null());
    json_object_set_new(vars, "documents", json_null());
    json_object_set_new(vars, "add_generation_prompt", json_boolean(gen_prompt));
    if (json_is_object(file)) json_object_update(vars, file);
    if (kwargs) json_object_update(vars, kwargs);
    *out = vars;
    return 0;
}

static int render(const char *model, const char *messages_path, const char *template_path,
                  json_t *kwargs, bool gen_prompt, base_err *err) {
    char *source = NULL, *text = NULL;
    json_t *special = NULL, *file = NULL, *vars = NULL;
    chat_template *t = NULL;
    size_t len = 0;
    int rc = chat_config_load(model, &source, &special, err);
    if (!rc && template_path) {
        free(source);
        source = NULL;
        rc = base_read_file(template_path, &source, NULL, err);
    }
    if (!rc && !source)
        rc = base_fail(err,
                       "%s: no chat_template in tokenizer_config.json (pass "
                       "--chat-template-file)",
                       model);
    if (!rc) {
        json_error_t je;
        file = json_load_file(messages_path, 0, &je);
        if (!file) rc = base_fail(err, "%s: line %d: %s", messages_path, je.line, je.text);
    }
    if (!rc) rc = build_vars(special, file, kwargs, gen_prompt, messages_path, &vars, err);
    if (!rc && chat_template_parse(source, &t, err))
        rc = base_fail_wrap(err, "%s", template_path ? template_path : model);
    if (!rc) rc = chat_template_render(t, vars, &text, &len, err);
    if (!rc && fwrite(text, 1, len, stdout) != len) rc = base_fail(err, "stdout: write failed");
    free(text);
    chat_template_free(t);
    json_decref(vars);
    json_decref(file);
    json_decref(special);
    free(source);
    return rc;
}

int cli_cmd_template(int argc, char **argv) {
    const char *model = NULL, *messages = NULL, *template_path = NULL, *kwargs_text = NULL;
    bool gen_prompt = true, offline = false;
    char dir[PATH_MAX];
    cli_parser p;
    cli_parser_init(&p, "template", argc, argv);
    while (cli_next(&p)) {
        if (cli_flag(&p, "-h", "--help")) {
            print_help(stdout);
            return CLI_OK;
        }
        if (cli_take_model(&p, &model, &offline)) continue;
        if (cli_take(&p, NULL, "--messages", &messages)) continue;
        if (cli_take(&p, NULL, "--chat-template-file", &template_path)) continue;
        if (cli_take(&p, NULL, "--kwargs", &kwargs_text)) continue;
        if (cli_flag(&p, NULL, "--no-generation-prompt")) {
            gen_prompt = false;
            continue;
        }
        cli_unknown(&p);
    }
    if (cli_done(&p)) return CLI_USAGE;
    if (!model) return cli_usage_fail("template: -m MODEL_DIR is required");
    if (!messages) return cli_usage_fail("template: --messages FILE.json is required");
    json_t *kwargs = NULL;
    if (kwargs_text) {
        json_error_t je;
        kwargs = json_loads(kwargs_text, 0, &je);
        if (!json_is_object(kwargs)) {
            json_decref(kwargs);
            return cli_usage_fail("template: --kwargs wants a JSON object, got '%s'", kwargs_text);
        }
    }
    base_err err;
    int rc = cli_model_resolve(&model, offline, dir, sizeof dir, &err);
    if (rc == 0) rc = render(model, messages, template_path, kwargs, gen_prompt, &err);
    json_decref(kwargs);
    return rc ? cli_fail(&err) : CLI_OK;
}
