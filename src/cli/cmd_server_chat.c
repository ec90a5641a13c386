/* mlxcel-server's flags for chat answers: vLLM's --tool-call-parser and llama-server's
 * --reasoning-format, --reasoning-budget and --chat-template-kwargs. */
#include "cli/cmd_server.h"

#include <stdlib.h>
#include <string.h>

const char cli_server_chat_help[] =
    "      --tool-call-parser NAME  how the model writes tool calls: hermes, qwen3_coder,\n"
    "                           llama3_json, mistral or harmony (GPT-OSS; also its channels)\n"
    "                           (default: judged from the chat template)\n"
    "      --reasoning-format F none (<think> stays in the content), deepseek or auto (default):\n"
    "                           the thinking goes to reasoning_content\n"
    "      --reasoning-budget N tokens of thinking before </think> is forced (-1: no limit, the\n"
    "                           default; 0: no thinking, and enable_thinking false for templates)\n"
    "      --chat-template-kwargs JSON  template variables for every chat, e.g.\n"
    "                           '{\"enable_thinking\": false}'; a request's own come on top\n";

bool cli_take_server_chat(cli_parser *p, server_options *o, json_t **kwargs) {
    const char *v;
    long n;
    base_err err;
    if (cli_take(p, NULL, "--tool-call-parser", &v)) {
        if (engine_tool_format_from_name(v, &o->tool_parser, &err))
            cli_usage(p, "%s: --tool-call-parser: %s", p->command, err.msg);
        o->has_tool_parser = true;
        return true;
    }
    if (cli_take(p, NULL, "--reasoning-format", &v)) {
        if (engine_reasoning_format_from_name(v, &o->reasoning_format, &err))
            cli_usage(p, "%s: --reasoning-format: %s", p->command, err.msg);
        return true;
    }
    if (cli_take_int(p, NULL, "--reasoning-budget", -1, 1 << 30, &n)) {
        o->has_reasoning_budget = n >= 0;
        o->reasoning_budget = (int)n;
        return true;
    }
    if (cli_take(p, NULL, "--chat-template-kwargs", &v)) {
        json_decref(*kwargs);
        *kwargs = json_loads(v, 0, NULL);
        if (!json_is_object(*kwargs))
            cli_usage(p, "%s: --chat-template-kwargs: '%s' is not a JSON object", p->command, v);
        return true;
    }
    return false;
}

void cli_server_chat_apply(const server_options *o, json_t *kwargs, engine_prompter *pr) {
    /* a budget of 0 means no thinking: templates that can leave it out are told to */
    if (o->has_reasoning_budget && o->reasoning_budget == 0)
        json_object_set_new(pr->special_vars, "enable_thinking", json_false());
    if (kwargs) json_object_update(pr->special_vars, kwargs);
}
