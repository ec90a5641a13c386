/* engine: the runtime (backend + model + paged pool loaded together), the sampler chain,
 * stop conditions, and generation. Parses no HTTP.
 *
 * Sampler order follows llama-server: logit bias, repetition / presence / frequency
 * penalties, top-k, top-p, min-p, temperature, then a draw from the seeded generator.
 * Temperature <= 0 is greedy (argmax after bias and penalties). */
#ifndef MLXCEL_ENGINE_H
#define MLXCEL_ENGINE_H

#include "chat/chat.h"
#include "grammar/grammar.h"
#include "kv/kv.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* ---- sampling ---- */

typedef struct engine_logit_bias {
    int32_t token;
    float bias; /* -INFINITY bans the token */
} engine_logit_bias;

typedef struct engine_sampling {
    float temperature;       /* <= 0: greedy */
    int top_k;               /* <= 0: off */
    float top_p;             /* >= 1: off */
    float min_p;             /* <= 0: off */
    float repeat_penalty;    /* 1: off */
    int repeat_last_n;       /* tokens of history the penalties look at; < 0: all */
    float presence_penalty;  /* 0: off */
    float frequency_penalty; /* 0: off */
    uint64_t seed;
    int n_logit_bias;
    const engine_logit_bias *logit_bias; /* (n_logit_bias), not owned */
} engine_sampling;

/* llama-server's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalties,
 * seed from the clock. */
void engine_sampling_defaults(engine_sampling *s);

typedef struct engine_sampler engine_sampler;

/* Checks the parameters (a clear error names the bad one) and seeds the generator. */
int engine_sampler_new(const engine_sampling *params, int vocab, engine_sampler **out,
                       base_err *err);
void engine_sampler_free(engine_sampler *s);
/* Replaces the logit bias (copied; tokens checked at engine_sampler_new's), keeping the
 * generator's state: the scheduler lifts min_tokens' ban on the end ids this way. */
void engine_sampler_set_logit_bias(engine_sampler *s, const engine_logit_bias *bias, int n);
/* Picks the next token from logits (vocab floats; modified in place), given the tokens so
 * far (prompt and generated) for the penalties. */
int32_t engine_sampler_next(engine_sampler *s, float *logits, const int32_t *history,
                            int n_history);

/* log-softmax of the raw logits: the chosen token's log-probability and the top_n most likely
 * tokens (ids and log-probabilities, most likely first). */
float engine_logprobs(const float *logits, int vocab, int32_t chosen, int top_n, int32_t *top_ids,
                      float *top_logprobs);

/* ---- sampling from logits left in backend memory ----
 *
 * The chain looks past the bias and penalties only at the top-k tokens, so the backend's
 * topk_candidates op (the row's k best after the bias and penalties, computed where the
 * logits are) gives the host all it needs: the pick from those candidates is the token
 * engine_sampler_next gives on the full row, for the same seed (rows holding a NaN aside: it
 * is never a candidate). With top-k off and no bias or penalties, the row's BE_TOPK_MAX best
 * tokens and its log-sum-exp decide most picks (top-p or min-p reached inside them, or a draw
 * at temperature 1 that lands inside them); the full row is fetched for the rest. Top-k above
 * BE_TOPK_MAX (below the vocabulary), top-k off with a bias or penalties,
 * log-probabilities that the candidates cannot give, and rows limited to an allowed set (a
 * grammar's) that want log-probabilities or a wide pick (the raw row's best tokens and sum are
 * not the masked row's) take the full row; other limited rows send their set with the request.
 * Log-probabilities from candidates match the full row's bit for bit on the CPU and to rounding on
 * CUDA, which sums the log-sum-exp in another order. */

/* Candidates the sampler needs (its top-k, capped by the vocabulary; 1 when greedy), or 0
 * when it needs the whole row. */
int engine_sampler_candidates(const engine_sampler *s);
/* The logit bias and the penalties over the history as the backend applies them, sorted by
 * token; returns how many. *out is owned by the sampler and valid until the next call. */
int engine_sampler_adjustments(engine_sampler *s, const int32_t *history, int n_history,
                               const be_logit_adj **out);
/* The index, among n_cand candidates sorted as topk_candidates writes them (n_cand at most
 * engine_sampler_candidates), of the token engine_sampler_next would pick, advancing the
 * generator the same way; -1 when n_cand is 0 (every token banned: token 0, as the full
 * row's argmax gives). */
int engine_sampler_pick(engine_sampler *s, const float *cand_logit, int n_cand);
/* Whether the sampler, having top-k off over a vocabulary larger than BE_TOPK_MAX, may still
 * pick from the row's BE_TOPK_MAX best raw logits (engine_sampler_pick_wide). */
bool engine_sampler_wide(const engine_sampler *s);
/* The index among the n_cand best raw logits of a row (sorted as topk_candidates writes them)
 * whose raw log-sum-exp is lse, of the token engine_sampler_next would pick on the whole row
 * (up to the rounding of the row's sum), when those candidates decide it: top-p reached or
 * the min-p floor passed inside them, or at temperature 1 a draw that lands inside them.
 * Otherwise -1, with the generator untouched, and the pick needs the whole row. */
int engine_sampler_pick_wide(engine_sampler *s, const float *cand_logit, int n_cand, double lse);

#define ENGINE_MAX_TOP_LOGPROBS 20

/* One row to sample: what the picker reads and what it writes back. */
typedef struct engine_pick {
    engine_sampler *sampler; /* in */
    const int32_t *history;  /* in: (n_history) prompt then generated ids, for penalties */
    int n_history;           /* in */
    int top_logprobs;        /* in: < 0: no log-probabilities; else alternatives wanted */
    const uint32_t *allowed; /* in: NULL, or (gram_mask_words(allowed_vocab)) the only tokens
                                the pick may be (a bit per id, as gram_state_mask writes):
                                every other logit becomes -inf before the chain (the backend's
                                candidates, or the full row); log-probabilities stay the raw
                                row's */
    const gram_vocab *allowed_vocab; /* in: what `allowed` is over */
    int32_t token;                   /* out */
    float logprob;                   /* out when top_logprobs >= 0: of token, from the raw logits */
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS]; /* out: (top_logprobs) most likely first */
    float top_lp[ENGINE_MAX_TOP_LOGPROBS];    /* out: (top_logprobs) */
} engine_pick;

/* Buffers reused from step to step. A picker serves one backend: its download buffer is that
 * backend's host memory (page-locked on CUDA), so free the picker before the backend. */
typedef struct engine_picker engine_picker;

engine_picker *engine_picker_new(int vocab);
void engine_picker_free(engine_picker *p);
/* Samples row i of logits (backend memory, F32 [n, vocab], left unchanged) for picks[i]: one
 * topk_candidates call for every row it can serve; the rows it cannot (every row, on a backend
 * without the op) are downloaded into page-locked memory, queued ahead of that call. */
int engine_picker_run(engine_picker *p, be_backend *be, const be_tensor *logits, engine_pick *picks,
                      int n, base_err *err);

/* ---- runtime ---- */

typedef struct engine_options {
    const char *device;        /* "auto" (CUDA when present, else CPU), "cpu", "cuda" */
    int n_threads;             /* CPU threads; <= 0: core count */
    int ctx_size;              /* per-sequence context limit; <= 0: the model's maximum */
    int n_parallel;            /* sequences served at once (sizes the pool in "auto") */
    int kv_block_size;         /* <= 0: KV_DEFAULT_BLOCK_SIZE */
    base_dtype kv_dtype;       /* F16, BF16 or F32; BASE_DTYPE_COUNT = backend default */
    const char *kv_budget;     /* "auto", bytes ("8G", "512Mi"), or NULL = enough for
                                  n_parallel x ctx_size */
    int prefill_chunk;         /* prompt tokens of one sequence per step that the scheduler
                                  will run, when above the backend's (engine_prefill_chunk): the
                                  local layers' KV is sized for the larger; <= 0: the backend's */
    int tensor_parallel;       /* ranks one model is spread over (one GPU each); 1 = one device
                                  (engine_check_tensor_parallel says what more needs) */
    model_progress_fn on_load; /* NULL, or told as the model loads */
    void *on_load_ctx;
} engine_options;

void engine_options_defaults(engine_options *o);

/* How the KV pool is sized for a model on a backend: the breakdown `mlxcel inspect` prints. */
typedef struct engine_kv_plan {
    kv_geometry geom;
    int ctx_size; /* per-sequence context limit */
    int n_parallel;
    uint64_t weights_bytes;
    uint64_t kv_bytes_per_token; /* K and V, all layers */
    uint64_t kv_bytes_per_block; /* all layers */
    uint64_t reserve_bytes;      /* v2 decode workspace, from the real geometry */
    uint64_t budget_bytes;       /* what the pool may use, reserve included */
    int64_t kv_blocks;           /* global group: what the budget buys (not capped by the
                                    context); every layer's when there are no local layers */
    int64_t blocks_per_seq;      /* a full-context sequence */
    /* Local (sliding-window) layers, kept apart (kv.h): all zero without them. */
    int n_local_layers;
    uint64_t global_bytes_per_block, local_bytes_per_block;
    int64_t kv_local_blocks;      /* the local group's blocks */
    int64_t local_blocks_per_seq; /* a sequence's window and prefill step, at most */
    int prefill_step;             /* the step that sizing assumed (tokens) */
    int64_t kv_blocks_full;       /* what the budget would buy if every layer kept the whole
                                     context (== kv_blocks without local layers) */
} engine_kv_plan;

/* Sizes the pool: with no budget, n_parallel full-context sequences; with BYTES, what they
 * buy after the reserve; with auto, a fraction of the backend's free memory minus weights
 * and activations. A budget that cannot hold one full-context sequence is an error naming
 * both numbers. */
int engine_plan_kv(const io_model_config *cfg, uint64_t weights_bytes, be_backend *be,
                   const engine_options *opts, engine_kv_plan *plan, base_err *err);

typedef struct engine_runtime {
    be_backend *be;         /* owned */
    model *model;           /* owned */
    kv_pool *pool;          /* owned */
    engine_kv_plan kv_plan; /* how the pool was sized: context, parallel sequences, blocks */
} engine_runtime;

/* The backend opts->device names: "cpu", "cuda", or "auto" (CUDA when a GPU is usable). */
int engine_backend_open(const engine_options *opts, be_backend **be, base_err *err);

/* Whether opts->tensor_parallel can run on `be` with this build: 1 always; more (issue 25)
 * needs the CUDA backend, as many visible GPUs and NCCL, and the engine does not run a sharded
 * step yet, so every N > 1 is refused, the message naming the first thing missing. */
int engine_check_tensor_parallel(const engine_options *opts, const be_backend *be, base_err *err);

/* Creates the backend, loads the model, sizes (engine_plan_kv) and allocates the KV pool. */
int engine_runtime_open(const char *model_dir, const engine_options *opts, engine_runtime **out,
                        base_err *err);
void engine_runtime_close(engine_runtime *rt);
/* Prompt tokens per forward step on this backend: its suggestion (be_backend.prefill_chunk),
 * else 512. */
int engine_prefill_chunk(const be_backend *be);
/* One line for startup messages: model, backend, threads, context, KV capacity. */
void engine_runtime_describe(const engine_runtime *rt, const char *model_dir, char *buf,
                             size_t size);

/* ---- one sequence, synchronously (CLI generate, logits, perplexity) ---- */

/* Runs the prompt through the model in one prefill step on a fresh sequence and returns the
 * logits of every position (all_logits: host float32 [n_prompt, vocab], caller frees) or of
 * the last one only (all_logits NULL, last_logits [vocab] caller-provided). */
int engine_prefill_logits(engine_runtime *rt, const int32_t *prompt, int n_prompt,
                          float **all_logits, float *last_logits, base_err *err);
/* Runs n tokens through the model into seq's cache (in prefill chunks), the last position's
 * logits left in backend memory (model_logits). */
int engine_prefill_seq(engine_runtime *rt, kv_seq *seq, const int32_t *tokens, int n,
                       base_err *err);

/* Called with each generated token; return false to stop early. */
typedef bool (*engine_token_fn)(void *ctx, int32_t token);

typedef struct engine_generate_result {
    int32_t *tokens; /* (n_tokens) generated ids, caller frees */
    int n_tokens;
    bool stopped_by_eos;
    double prefill_seconds, decode_seconds;
} engine_generate_result;

/* Prefill then decode up to max_new tokens, stopping at an EOS id of the model. */
int engine_generate(engine_runtime *rt, const int32_t *prompt, int n_prompt, int max_new,
                    const engine_sampling *sampling, engine_token_fn on_token, void *ctx,
                    engine_generate_result *res, base_err *err);

/* ---- measurements (mlxcel bench) ---- */

/* Seconds to run a prompt of n_tokens (fixed pseudo-random ids) through the model. */
int engine_bench_prefill(engine_runtime *rt, int n_tokens, double *seconds, base_err *err);
/* Seconds for n_steps decode steps of n_seqs sequences at once, each sequence holding n_depth
 * prompt tokens of its own (prefilled first, not timed) and a first decoded token. */
int engine_bench_decode(engine_runtime *rt, int n_seqs, int n_depth, int n_steps, double *seconds,
                        base_err *err);
/* The ceiling a decode step's reads are measured against, as be->ceiling names it, measured
 * now: the read bandwidth (bytes a second of a read-only stream over 512 MiB, each of the
 * backend's threads summing its own slice, best of 5 passes) or the copy bandwidth (bytes read
 * + written a second, best of 4 copies of 256 MiB). */
typedef struct engine_ceiling {
    const char *name; /* "read" or "copy": "<name> bandwidth" in reports */
    const char *how;  /* what a byte counted is, for a report's header */
    double bytes_per_second;
} engine_ceiling;
int engine_bench_ceiling(be_backend *be, engine_ceiling *out, base_err *err);

/* ---- tool calls in generated text (engine_tools.c) ----
 *
 * How a model writes a call, by family, as vLLM's --tool-call-parser names them:
 * hermes (Hermes, Qwen 2.5 / 3): <tool_call>{"name": .., "arguments": {..}}</tool_call>;
 * qwen3_coder: <tool_call><function=NAME><parameter=P>VALUE</parameter></function></tool_call>;
 * llama3_json (Llama 3.1 - 3.3): the reply is {"name": .., "parameters": {..}} (several joined
 * by ';'), after <|python_tag|> or not; mistral: [TOOL_CALLS] then a JSON array of {"name",
 * "arguments"} or NAME[ARGS]{..}; harmony (GPT-OSS): a commentary message to=functions.NAME
 * whose body is the JSON arguments, parsed with the rest of its channels by engine_harmony.c.
 * Text before the first call is content; a call that does not parse leaves the text content. */
typedef enum engine_tool_format {
    ENGINE_TOOLS_HERMES,
    ENGINE_TOOLS_QWEN3_CODER,
    ENGINE_TOOLS_LLAMA3_JSON,
    ENGINE_TOOLS_MISTRAL,
    ENGINE_TOOLS_HARMONY,
} engine_tool_format;

/* vLLM's name of a format (its "openai" is taken as harmony); an unknown or unimplemented one
 * (pythonic, ...) is an error listing the names taken. */
int engine_tool_format_from_name(const char *name, engine_tool_format *out, base_err *err);
const char *engine_tool_format_name(engine_tool_format f);
/* The format a chat template writes calls in, judged by its text; hermes when it shows none. */
engine_tool_format engine_tool_format_detect(const char *template_source);
/* Whether the format's markers are special tokens, which the detokenizer must then keep. */
bool engine_tool_format_special(engine_tool_format f);

typedef struct engine_tool_call {
    char *name;      /* owned */
    char *arguments; /* owned: compact JSON text of an object */
} engine_tool_call;

/* Appends a call to name (name_len bytes) whose arguments, args, must be an object: the one
 * place a parsed call is stored, whichever format it came in. */
void engine_tool_calls_add(engine_tool_call **calls, int *n_calls, const char *name,
                           size_t name_len, const json_t *args);
/* Frees the calls and the array. */
void engine_tool_calls_free(engine_tool_call *calls, int n_calls);

typedef struct engine_tool_scan {
    size_t content_len;      /* text[0, content_len) is content */
    size_t rest_start;       /* and so is text[rest_start, len) (final scans only; else len) */
    engine_tool_call *calls; /* (n_calls) owned: the complete calls, in order */
    int n_calls;
    bool in_call; /* a call began at content_len: the text after it is held */
} engine_tool_scan;

/* Scans generated text for calls. final: the text is complete, and a call that does not parse
 * (or one cut short) leaves the text from it on as content; otherwise text that may still turn
 * into a call is held (out of content_len), so that streamed content never shows a marker.
 * forced: the output was constrained to calls (engine_tools_grammar), which then start at
 * once, marker or not. tools: the request's tools (NULL: none known), whose parameter types
 * say which qwen3_coder values are strings. Free *out with engine_tool_scan_free. */
void engine_tools_scan(engine_tool_format f, const char *text, size_t len, bool final, bool forced,
                       const json_t *tools, engine_tool_scan *out);
void engine_tool_scan_free(engine_tool_scan *s);

/* GBNF that makes the output one call (or, when parallel, one or more) in format f to one of
 * `tools` (OpenAI's [{"type": "function", "function": {"name", "parameters"}}], names checked by
 * the caller), or only to the tool named `only` (may be NULL), its arguments following the
 * tool's parameters schema. A schema the grammar cannot enforce is an error naming the tool and
 * the keyword. *gbnf: caller frees. */
int engine_tools_grammar(engine_tool_format f, const json_t *tools, const char *only, bool parallel,
                         char **gbnf, base_err *err);

/* ---- reasoning in generated text (engine_reasoning.c) ----
 *
 * <think>..</think> (Qwen3, DeepSeek-R1 and its distills, QwQ) as llama-server's
 * --reasoning-format names the handling: none leaves it in the content, deepseek and auto put
 * it in reasoning_content. */
typedef enum engine_reasoning_format {
    ENGINE_REASONING_NONE,
    ENGINE_REASONING_DEEPSEEK,
    ENGINE_REASONING_AUTO,
} engine_reasoning_format;

int engine_reasoning_format_from_name(const char *name, engine_reasoning_format *out,
                                      base_err *err);

#define ENGINE_THINK_OPEN  "<think>"
#define ENGINE_THINK_CLOSE "</think>"

/* Where thinking and the answer lie in generated text. */
typedef struct engine_think_split {
    size_t reasoning_start, reasoning_len; /* text[reasoning_start, +reasoning_len) */
    size_t content_start; /* text[content_start, len) is the answer; len while thinking */
    bool thinking;        /* the thinking is not closed (yet) */
} engine_think_split;

/* Splits text: it starts inside the thinking when the prompt opened it (inside), else when it
 * begins with <think>. Not final: text that may still be the start of a tag is held out of
 * both parts; final: an unclosed thinking is all reasoning. The answer's leading newlines go. */
void engine_think_split_text(const char *text, size_t len, bool inside, bool final,
                             engine_think_split *out);
/* Whether a rendered prompt ends inside an opened thinking (a template that writes <think>
 * in its generation prompt). */
bool engine_prompt_opens_think(const char *prompt);

/* ---- GPT-OSS Harmony messages in generated text (engine_harmony.c) ----
 *
 * The output is a run of messages, each a header and a body: after the prompt's
 * <|start|>assistant, `<|channel|>analysis<|message|>...<|end|>`, then
 * `<|start|>assistant<|channel|>final<|message|>...<|return|>`; a call is
 * `<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}`
 * ended by <|call|> (the recipient may stand before <|channel|>). The analysis channel is the
 * reasoning, final and commentary without a recipient (a preamble) the content. */
typedef struct engine_harmony_split {
    char *reasoning; /* (reasoning_len) owned: the analysis messages' text */
    size_t reasoning_len;
    char *content; /* (content_len) owned: the final and preamble messages, and every message or
                      text that is not well formed, as written */
    size_t content_len;
    engine_tool_call *calls; /* (n_calls) owned: the complete calls, in order */
    int n_calls;
} engine_harmony_split;

/* Splits text (len bytes). final: the text is complete (the stop tokens <|return|> and <|call|>
 * are not in it, so its end ends the last message); otherwise what may still become a marker,
 * a header and a call are held, so that each part only grows from one split to the next.
 * reasoning: the analysis goes to reasoning (else, markers and all, to content); tools: calls
 * are parsed (else kept as content). Free *out with engine_harmony_split_free. */
void engine_harmony_split_text(const char *text, size_t len, bool final, bool reasoning, bool tools,
                               engine_harmony_split *out);
void engine_harmony_split_free(engine_harmony_split *h);

/* ---- prompts: tokenizer + chat template of a model directory ---- */

typedef struct engine_prompter {
    tok_tokenizer *tok;             /* owned */
    chat_template *tmpl;            /* owned; NULL when the model has no chat template */
    json_t *special_vars;           /* owned: bos_token, eos_token, ... as the template sees them */
    size_t max_token_bytes;         /* the longest token's text, for the encoders' length bound */
    bool content_as_list;           /* the template walks a message's content parts itself */
    engine_tool_format tool_format; /* how the template writes tool calls */
} engine_prompter;
/* Loads dir's tokenizer and chat template; template_file (may be NULL) replaces the model's
 * template. When dir has a config.json, the tokenizer's ids must be below its vocab_size. */
int engine_prompter_open(const char *dir, const char *template_file, engine_prompter **out,
                         base_err *err);
void engine_prompter_close(engine_prompter *p);
/* Replaces the chat template with Jinja source (the server's --chat-template text); what was
 * there stays when the source does not parse. */
int engine_prompter_set_template(engine_prompter *p, const char *source, base_err *err);
/* How a conversation is rendered: transformers' apply_chat_template arguments. */
typedef struct engine_chat_options {
    bool add_generation_prompt;  /* open the assistant's turn after the messages */
    bool continue_final_message; /* end the prompt inside the final message, which the model
                                    then continues (a "prefill"); excludes the above */
    const json_t *extra;         /* more template variables (tools, enable_thinking) or NULL */
} engine_chat_options;
/* What a conversation asks for when the request does not say: a final assistant message is
 * continued, as llama-server does; otherwise the assistant's turn is opened. */
engine_chat_options engine_chat_defaults(const json_t *messages);
/* Renders `messages` (a JSON array, as OpenAI's API sends them) with the chat template. The
 * messages are first put as templates take them (engine_messages_normalize). *prompt: caller
 * frees. */
int engine_prompter_render(const engine_prompter *p, const json_t *messages,
                           const engine_chat_options *o, char **prompt, base_err *err);
/* Renders and tokenizes a conversation. Special tokens come from the template itself, so the
 * tokenizer adds none (as transformers' apply_chat_template(tokenize=True) does).
 * max_tokens > 0: a text too long to fit in that many tokens is refused before it is
 * tokenized (which costs seconds for megabytes), judged by its length against the longest
 * token's, with room for normalization; the caller still checks the count it gets. */
int engine_prompter_encode_chat(const engine_prompter *p, const json_t *messages,
                                const engine_chat_options *o, int max_tokens, int32_t **ids, int *n,
                                base_err *err);
/* Messages as OpenAI's API sends them to messages as chat templates take them (a new array,
 * caller decrefs): the roles system, user, assistant and tool, with developer taken as
 * system, anything else refused; content a string (null or absent: empty), or an array of text
 * parts, joined with newlines unless content_as_list keeps them as parts; image, audio and
 * file parts refused (these models take text only); an assistant's tool_calls with each
 * function.arguments an object (the JSON text the SDKs send is parsed). err names the message
 * and part. */
int engine_messages_normalize(const json_t *messages, bool content_as_list, json_t **out,
                              base_err *err);
/* Tokenizes a rendered prompt (engine_prompter_render) as engine_prompter_encode_chat does. */
int engine_prompter_encode_rendered(const engine_prompter *p, const char *prompt, int max_tokens,
                                    int32_t **ids, int *n, base_err *err);
/* Tokenizes plain text with the tokenizer's special tokens (e.g. BOS) added; max_tokens as for
 * engine_prompter_encode_chat. */
int engine_prompter_encode_text(const engine_prompter *p, const char *text, int max_tokens,
                                int32_t **ids, int *n, base_err *err);

/* ---- embeddings (engine_embed.c) ---- */

/* How a text's hidden states become one vector: their mean, the last token's (decoder
 * embedding models such as Qwen3-Embedding) or the first's (CLS). */
typedef enum engine_pooling {
    ENGINE_POOL_MEAN,
    ENGINE_POOL_LAST,
    ENGINE_POOL_CLS,
} engine_pooling;

/* The pooling the checkpoint's sentence-transformers config names (modules.json and its
 * Pooling module's config.json); mean when it has none. A mode not implemented (max,
 * weighted mean, several at once) is an error naming it. */
int engine_pooling_read(const char *model_dir, engine_pooling *out, base_err *err);
/* The embedding of tokens (n, at most the context size): the hidden states after the final
 * norm (model_forward_hidden), pooled, then L2-normalized, into out (hidden_size floats). Runs
 * a sequence of its own through rt in prefill chunks, its blocks freed at the end: rt must be
 * the caller's alone (engine_sched_run_between, under a scheduler). */
int engine_embed(engine_runtime *rt, engine_pooling pooling, const int32_t *tokens, int n,
                 float *out, base_err *err);

/* ---- reranking (engine_rerank.c) ---- */

/* How a (query, document) pair gets its relevance score, a logit: a sequence classifier's
 * score head (transformers' *ForSequenceClassification, one label) applied to the last
 * token's hidden state after the final norm, as transformers pools it; or, for a causal LM
 * that judges relevance (Qwen3-Reranker), the logit of "yes" minus that of "no" after the
 * last token, whose sigmoid is that model's softmax([no, yes])[yes]. */
typedef struct engine_reranker {
    float *head;     /* (hidden_size) the score head's row, owned; NULL: the yes/no logits */
    int32_t yes, no; /* the tokens, without a head */
} engine_reranker;

/* The model's score head when it has one, else the tokenizer's "yes" and "no" tokens (each a
 * vocabulary entry, as transformers' convert_tokens_to_ids finds them; tok may be NULL for a
 * model with a head); a head of more than one label, or neither, is an error saying so. Close
 * it with engine_reranker_close. */
int engine_reranker_open(const model *m, const tok_tokenizer *tok, engine_reranker *out,
                         base_err *err);
void engine_reranker_close(engine_reranker *r);
/* The tokens of a pair for r. With a score head, as llama-server joins them for a rank
 * model: the query with the tokenizer's special tokens (BOS or CLS before, EOS or SEP after,
 * as its post-processor adds them), then the document (its first max_doc tokens when
 * max_doc > 0) and what the post-processor puts after a sequence. With the yes/no logits, in
 * Qwen3-Reranker's judge prompt (engine_rerank.c), max_doc counting the tokens after
 * "<Document>:". *ids: caller frees. */
int engine_rerank_pair(const tok_tokenizer *tok, const engine_reranker *r, const char *query,
                       const char *doc, int max_doc, int32_t **ids, int *n, base_err *err);
/* The score of tokens (n, at most the context size), on a sequence of its own in prefill
 * chunks, as engine_embed: rt must be the caller's alone. */
int engine_rerank(engine_runtime *rt, const engine_reranker *r, const int32_t *tokens, int n,
                  double *score, base_err *err);

/* ---- the scheduler ---- */

/* Continuous batching on a thread of its own. Each step packs, under a token budget, one
 * decode row for every running sequence and then prefill chunks of the running sequences
 * still reading their prompt, oldest first, then admits waiting requests (oldest first) while
 * fewer than n_parallel run. A request's KV is its prompt plus everything generated; when
 * the pool runs out of blocks the newest running sequence is preempted: its blocks are freed
 * and it goes back to the head of the queue, to be recomputed (reusing whatever prefix the
 * cache still holds) with its sampler state kept. Prompts adopt cached prefixes through the
 * pool. Cancellation frees the sequence's blocks before the next step.
 *
 * Constrained requests (engine_request.grammar): the first one submitted builds the grammar
 * vocabulary from the tokenizer (once, on the submitting thread). The step thread keeps one
 * matcher per distinct grammar text, shared by the requests that use it (its mask cache
 * serves them all) and kept a while after the last one ends for the next request with the
 * same text; each request holds a matcher state, kept across preemption like its sampler. */

typedef struct engine_sched_options {
    int n_parallel;           /* running sequences at most */
    int max_batch_tokens;     /* tokens per step; <= 0: 2048 (raised to n_parallel when below) */
    int prefill_chunk;        /* prompt tokens of one sequence per step; <= 0: the backend's
                                 (engine_prefill_chunk) */
    int max_queue;            /* requests waiting to start, at most; <= 0: no limit */
    int ctx_size;             /* per-sequence limit on prompt + generated tokens */
    const tok_tokenizer *tok; /* detokenizes and matches stop strings; NULL: token ids only
                                 (not owned, must outlive the scheduler) */
    int n_eos;
    const int32_t *eos_ids; /* (n_eos) ids that end generation, besides the model config's;
                               copied */
} engine_sched_options;

typedef enum {
    ENGINE_FINISH_NONE = 0, /* more events follow */
    ENGINE_FINISH_STOP,     /* an EOS id or a stop string */
    ENGINE_FINISH_LENGTH,   /* max_tokens or the context limit */
    ENGINE_FINISH_CANCELLED,
    ENGINE_FINISH_ERROR, /* message in engine_event.error */
} engine_finish;

/* One generated token (token >= 0) and/or the end of the request (finish != NONE). The text
 * is what may be shown now: the detokenizer's output minus anything that could still turn
 * into a stop string; a matched stop string is never shown. Pointers are valid during the
 * callback only. */
typedef struct engine_event {
    uint64_t id;
    int32_t token; /* -1 on a final event that carries no token */
    const char *text;
    size_t text_len;
    float logprob;  /* of token, from the raw logits */
    int stop_index; /* on a final STOP event: the stop string that ended it, else -1 */
    int n_top;      /* top alternatives, when asked */
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];    /* (n_top) most likely first */
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS]; /* (n_top) */
    engine_finish finish;
    int n_prompt, n_generated, n_cached; /* n_cached: prompt tokens adopted from the cache */
    double seconds_to_first_token;       /* from submission; set once a token exists */
    const char *error;                   /* ENGINE_FINISH_ERROR only */
} engine_event;

/* Called on the scheduler's thread; it must not block for long and must not call back into
 * the scheduler but for engine_cancel. Every submitted request gets exactly one final event
 * (finish != NONE), after which its ctx is never touched again. */
typedef void (*engine_event_fn)(void *ctx, const engine_event *ev);

typedef struct engine_request {
    const int32_t *prompt; /* (n_prompt) copied */
    int n_prompt;
    int max_tokens;           /* <= 0: up to the context limit */
    engine_sampling sampling; /* logit_bias copied */
    int n_stop;
    const char *const *stop; /* (n_stop) stop strings, copied */
    bool logprobs;           /* report each token's log-probability */
    int top_logprobs;        /* alternatives per token, 0 .. ENGINE_MAX_TOP_LOGPROBS */
    bool ignore_eos;
    /* (n_stop_ids) more ids that end generation as EOS does (ignore_eos aside), copied */
    const int32_t *stop_ids;
    int n_stop_ids;
    /* generated tokens before the request may end: until then EOS and stop_ids are banned (a
     * bias of -inf) and stop strings do not match; max_tokens and the context still end it */
    int min_tokens;
    /* NULL, or GBNF text (NUL-terminated, copied) that the generated text must match:
     * engine_submit compiles it (a bad grammar is ENGINE_REJECT_INVALID, err naming its line
     * and column), each step allows only the tokens that keep the text a prefix of the
     * grammar's language and an EOS id only where the grammar may end, and the request stops
     * (ENGINE_FINISH_STOP) once the grammar can take nothing more. Needs the tokenizer
     * (engine_sched_options.tok). */
    const char *grammar;
    bool keep_special; /* the text keeps special tokens (tool-call markers that are special) */
    /* A thinking budget, llama-server's --reasoning-budget: once the output has thought for
     * reasoning_budget tokens (0: at once), the think_close ids are forced, one a step, ending
     * the thinking. Thinking is the output from the start when the prompt opened it
     * (`thinking`), else from think_open ids among the first tokens to the first
     * n_think_end ids of think_close (0: all of them; Harmony's analysis ends at its <|end|>,
     * but the budget forces the final channel's header too). Off when n_think_close is 0 or
     * the budget < 0. With a grammar the forced ids must be what it allows there: the request
     * ends with an error where they are not. Ids copied. */
    int reasoning_budget;
    bool thinking;
    const int32_t *think_open, *think_close;
    int n_think_open, n_think_close, n_think_end;
    engine_event_fn on_event;
    void *ctx;
} engine_request;

typedef enum {
    ENGINE_REJECT_NONE = 0,
    ENGINE_REJECT_INVALID, /* bad prompt or parameters: the client's fault */
    ENGINE_REJECT_BUSY,    /* the queue is full: try later */
    ENGINE_REJECT_STOPPED, /* the scheduler is shutting down */
} engine_reject;

typedef struct engine_sched_stats {
    int running, waiting;
    int matchers; /* grammar matchers held: in use, or kept for the next request of their text */
    uint64_t requests_done, requests_cancelled, preemptions, steps;
    uint64_t computed_tokens, cached_tokens,
        generated_tokens; /* through the model, adopted from the prefix cache, sampled */
    /* summed over steps. forward: from the step's launch until the backend has run it (the
     * grammar masks are computed meanwhile, and count only where they take longer); the rest
     * is scheduling, sampling and detokenizing */
    double step_seconds, forward_seconds;
    kv_pool_stats pool;       /* as of the end of the last step */
    kv_pool_stats local_pool; /* the local layers' group, likewise (zero without) */
} engine_sched_stats;

typedef struct engine_sched engine_sched;

/* Starts the step thread over rt (not owned; it must outlive the scheduler, and nothing
 * else may use its pool meanwhile). */
int engine_sched_start(engine_runtime *rt, const engine_sched_options *o, engine_sched **out,
                       base_err *err);
/* Cancels everything (each request gets its final event), joins the thread and frees. */
void engine_sched_stop(engine_sched *s);
/* The first step of a graceful stop: from now on engine_submit refuses (ENGINE_REJECT_STOPPED),
 * and the waiting requests that have not started get their final event, CANCELLED with nothing
 * generated; running ones (and preempted ones, which have output) go on. Any thread. */
void engine_sched_drain(engine_sched *s);
/* Queues a request. On failure *why says whose fault it is and err says what. */
int engine_submit(engine_sched *s, const engine_request *r, uint64_t *id, engine_reject *why,
                  base_err *err);
/* Ends a request early: its blocks are freed before the next step and its final event says
 * CANCELLED (unless it had already finished). Unknown ids are ignored. Any thread. */
void engine_cancel(engine_sched *s, uint64_t id);
engine_sched_stats engine_sched_get_stats(engine_sched *s);
/* The tokens one step packs at most (max_batch_tokens as the scheduler settled it). */
int engine_sched_batch_tokens(const engine_sched *s);
/* Work that needs the runtime to itself (its pool and model), run on the step thread. */
typedef int (*engine_between_fn)(void *ctx, engine_runtime *rt, base_err *err);
/* Runs fn between two steps and waits for it: returns what fn returns (err as fn set it), or
 * fails when the scheduler stops first. Any thread but the step thread. */
int engine_sched_run_between(engine_sched *s, engine_between_fn fn, void *ctx, base_err *err);
/* Empties the prefix cache between two steps (llama-server's slot erase): the blocks no
 * sequence holds go back to the free list. Waits for the step thread; returns the blocks
 * dropped (0 when the scheduler is stopping). Any thread but the step thread. */
int64_t engine_sched_erase_cache(engine_sched *s);
/* Test hook: the next steps run only while `steps` > 0 (each step decrements it); < 0: free
 * running. Lets a test stage requests and inspect the pool between steps. */
void engine_sched_set_step_limit(engine_sched *s, int64_t steps);
/* Blocks until the step thread is idle (nothing runnable or the step limit reached). */
void engine_sched_wait_idle(engine_sched *s);

#endif
