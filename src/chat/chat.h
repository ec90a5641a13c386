/* chat: the chat-template engine, the subset of Jinja that Hugging Face chat templates use,
 * rendered the way transformers renders them (trim_blocks and lstrip_blocks on, undefined
 * variables print empty, `tojson` spaced like Python's json.dumps, loop controls on).
 *
 * Where Python Jinja and @huggingface/jinja disagree on a corner (how True or None print,
 * `capitalize` lowering the rest), this engine follows Python Jinja: that is what the models
 * saw in training. The conformance test checks byte equality with @huggingface/jinja on real
 * templates, where the two agree.
 *
 * A compiled template is immutable: any number of threads may render it at once. Each render
 * allocates from its own arena and is bounded (CHAT_MAX_OUTPUT bytes of output,
 * CHAT_MAX_MEMORY bytes of working memory, CHAT_MAX_DEPTH nested evaluations and as many
 * levels of nesting in the values it compares, CHAT_MAX_STEPS evaluated expressions and
 * statements, so nested loops cannot hold a server thread for hours). The deepest render
 * these allow takes about 0.5 MiB of stack under AddressSanitizer: any thread with the
 * default stack (8 MiB on glibc) can render. */
#ifndef MLXCEL_CHAT_H
#define MLXCEL_CHAT_H

#include "base/base.h"

#include <jansson.h>

#define CHAT_MAX_OUTPUT (64u << 20)
#define CHAT_MAX_MEMORY (512u << 20)
#define CHAT_MAX_DEPTH  400
/* Real templates take a few thousand steps per message; this is a second or so of work. */
#define CHAT_MAX_STEPS (20u * 1000u * 1000u)

typedef struct chat_template chat_template;

/* Compiles a template; a syntax error names the line and column ("template line 3, column
 * 7: ..."), unknown filters and tests included, and so does nesting deeper than the parser
 * allows (100 blocks, about 100 parentheses), since the source may come from a download.
 * *out: free with chat_template_free. */
int chat_template_parse(const char *source, chat_template **out, base_err *err);
void chat_template_free(chat_template *t);

/* Renders with the variables of the JSON object `vars` (`messages`, `add_generation_prompt`,
 * `bos_token` and the other special tokens, `tools`, extra kwargs such as `enable_thinking`).
 * *out: NUL-terminated, caller frees; *len (may be NULL) its length. Runtime errors
 * (raise_exception, type errors, the limits above) name the template line. */
int chat_template_render(const chat_template *t, const json_t *vars, char **out, size_t *len,
                         base_err *err);

/* Loads dir/tokenizer_config.json: the template source (a string, or the list of {name,
 * template} where "default" is taken) and the special tokens (bos_token, eos_token,
 * unk_token, pad_token, sep_token, cls_token, mask_token; a string or an object with
 * `content`; null ones are left out) as a JSON object of strings. When the config has no
 * template, dir/chat_template.jinja or dir/chat_template.json is read; with none of them
 * *source is NULL and the call still succeeds. Caller frees *source and
 * json_decref(*special_vars). */
int chat_config_load(const char *dir, char **source, json_t **special_vars, base_err *err);

#endif
