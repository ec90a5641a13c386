/* Request bodies to work, without the HTTP around them: a generation request's JSON body
 * parsed into an engine request, and the bodies of /tokenize, /detokenize and /apply-template
 * turned into their responses. */
#ifndef MLXCEL_SERVER_PARAMS_H
#define MLXCEL_SERVER_PARAMS_H

#include "server/server.h"
#include "server/server_output.h"

#include <jansson.h>

#define SERVER_MAX_STOP     16
#define SERVER_MAX_STOP_IDS 64
/* sequences one request may start: prompts times best_of (or n) */
#define SERVER_MAX_CHOICES 128

typedef enum { SERVER_CHAT, SERVER_COMPLETIONS, SERVER_LLAMA_COMPLETION } server_kind;

/* One prompt of the request (a completions prompt array has several). */
typedef struct server_prompt {
    int32_t *ids; /* (n_ids) owned */
    int n_ids;
    char *echo; /* owned: the prompt's text when `echo` asks for it, else NULL */
    size_t echo_len;
} server_prompt;

typedef struct server_params {
    server_kind kind;
    engine_request req; /* stop, stop_ids and logit_bias point into this struct and the body;
                           the prompt is each of `prompts` in turn */
    bool stream, include_usage;
    const char *stop[SERVER_MAX_STOP]; /* (n_stop) strings of the JSON body */
    int n_stop;
    int32_t stop_ids[SERVER_MAX_STOP_IDS]; /* (req.n_stop_ids) */
    server_prompt *prompts;                /* (n_prompts) owned */
    int n_prompts;
    int n_choices; /* `n`: choices answered per prompt */
    int best_of;   /* sequences generated per prompt (>= n_choices); the n_choices of them with
                      the highest log-probability are answered */
    bool echo;     /* each choice's text starts with its prompt's */
    int n_probs;   /* /completion's completion_probabilities: alternatives per token, 0: none */
    engine_logit_bias *bias; /* owned */
    char *gbnf; /* owned: the grammar of response_format or json_schema; req.grammar is this or
                   the body's `grammar` */
    /* chat */
    json_t *vars;       /* owned: template variables (chat_template_kwargs, tools, ...) */
    server_output out;  /* how the answer splits; its tool_defs reference owned */
    char *tool_gbnf;    /* owned: the grammar of a forced tool call */
    int32_t *think_ids; /* owned: <think> then </think> as ids, for the thinking budget */
} server_params;

/* How the conversation is rendered (add_generation_prompt, continue_final_message), from the
 * body (server_params.c). */
int server_chat_options(json_t *b, const json_t *messages, engine_chat_options *o, base_err *err);
/* The template variables of a chat body into p->vars and o->extra: chat_template_kwargs,
 * then the tools (unless tool_choice is none) and reasoning_effort (server_chat.c). */
int server_chat_vars(json_t *b, server_params *p, engine_chat_options *o, base_err *err);
/* A chat body's prompt rendered and tokenized into *ids (n), and into p what the answer's
 * parsing and the engine need for tools and reasoning (server_chat.c). */
int server_chat_prompt(json_t *b, const server_options *o, const engine_prompter *pr, int ctx,
                       server_params *p, int32_t **ids, int *n, base_err *err);

/* Fills p from the body (which must outlive p). ctx: tokens a sequence holds, against which a
 * prompt is judged long before it is tokenized. On failure err names the field; call
 * server_params_free either way. */
int server_params_parse(json_t *body, server_kind kind, const server_options *o,
                        const engine_prompter *pr, int vocab, int ctx, server_params *p,
                        base_err *err);
void server_params_free(server_params *p);

/* Member key of o, or NULL where it is absent or JSON null (clients send null for "not
 * given"). */
json_t *server_json_field(json_t *o, const char *key);
/* Every key of object o is one of keys (NULL-ended), else err names the first other one as
 * "'<at>.<key>' is not supported" (at "" for the body itself). */
int server_known_keys(json_t *o, const char *at, const char *const *keys, base_err *err);

/* The body's "tools" array (absent or null: nothing) as the chat request's "tools": add turns
 * tool i of it into OpenAI's function form appended to out, or fails naming it. */
int server_map_tools(json_t *body, json_t *chat,
                     int (*add)(json_t *t, size_t i, json_t *out, base_err *err), base_err *err);

/* Fill-in-the-middle (server_infill.c): the tokenizer's PRE, SUF and MID ids, and its
 * repository and file separators (-1 where it has none); an error naming the tokens looked for
 * when it has no PRE, SUF and MID. */
typedef struct server_fim {
    int32_t ids[3];
    int32_t repo, sep;
} server_fim;
int server_fim_tokens(const tok_tokenizer *tok, server_fim *f, base_err *err);
/* What goes around the hole. */
typedef struct server_fim_parts {
    const char *prefix, *suffix;         /* the text before and after it */
    const char *prefix_key, *suffix_key; /* their fields, for errors */
    const int32_t *prompt;               /* (n_prompt) ids after the prefix (/infill's prompt) */
    int n_prompt;
    json_t *extra; /* input_extra, or NULL */
    /* /infill cuts its parts to llama-server's budget when n_batch > 0: the prefix's last
     * 3/4 n_batch tokens, the suffix's first n_batch/4 - 2 - n_prompt, and the end of the
     * extra context that fits in n_ctx - n_batch - 2 n_predict (n_predict <= 0 reserves
     * nothing). n_batch <= 0: nothing is cut. */
    int n_batch, n_ctx, n_predict;
} server_fim_parts;
/* The fill-in-the-middle prompt in prefix-suffix-middle order, as server_infill.c draws it.
 * *ids: caller frees. */
int server_fim_prompt(const engine_prompter *pr, const server_fim *f, const server_fim_parts *in,
                      int32_t **ids, int *n, base_err *err);

/* The response object of /tokenize ({"tokens"}), /detokenize ({"content"}) and /apply-template
 * ({"prompt"}) for a request body. *out: caller decrefs. On failure err says what is wrong
 * with the body (the client's fault: a 400). */
/* POST /props: {"default_generation_settings": {"params": {...}}} with sampling fields as GET
 * /props shows them, applied to d, n_predict and seed_fixed only when all of them are valid;
 * any other field is refused, naming it. */
int server_body_props(json_t *body, engine_sampling *d, int *n_predict, bool *seed_fixed,
                      base_err *err);
int server_body_tokenize(const engine_prompter *pr, json_t *body, json_t **out, base_err *err);
int server_body_detokenize(const engine_prompter *pr, json_t *body, json_t **out, base_err *err);
int server_body_apply_template(const engine_prompter *pr, json_t *body, json_t **out,
                               base_err *err);

#endif
