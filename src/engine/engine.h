/* engine: the runtime (backend + model + paged pool loaded together), the sampler chain,
 * stop conditions, and generation. Parses no HTTP.
 *
 * Sampler order follows llama-server: logit bias, repetition / presence / frequency
 * penalties, top-k, top-p, min-p, temperature, then a draw from the seeded generator.
 * Temperature <= 0 is greedy (argmax after bias and penalties). */
#ifndef MLXCEL_ENGINE_H
#define MLXCEL_ENGINE_H

#include "chat/chat.h"
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
/* Picks the next token from logits (vocab floats; modified in place), given the tokens so
 * far (prompt and generated) for the penalties. */
int32_t engine_sampler_next(engine_sampler *s, float *logits, const int32_t *history,
                            int n_history);

/* log-softmax of the raw logits: the chosen token's log-probability and the top_n most likely
 * tokens (ids and log-probabilities, most likely first). */
float engine_logprobs(const float *logits, int vocab, int32_t chosen, int top_n, int32_t *top_ids,
                      float *top_logprobs);

/* ---- runtime ---- */

typedef struct engine_options {
    const char *device;    /* "auto" (CUDA when present, else CPU), "cpu", "cuda" */
    int n_threads;         /* CPU threads; <= 0: core count */
    int ctx_size;          /* per-sequence context limit; <= 0: the model's maximum */
    int n_parallel;        /* sequences served at once (sizes the pool in "auto") */
    int kv_block_size;     /* <= 0: KV_DEFAULT_BLOCK_SIZE */
    base_dtype kv_dtype;   /* F16, BF16 or F32; BASE_DTYPE_COUNT = backend default */
    const char *kv_budget; /* "auto", bytes ("8G", "512Mi"), or NULL = enough for
                              n_parallel x ctx_size */
} engine_options;

void engine_options_defaults(engine_options *o);

/* How the KV pool is sized for a model on a backend: the breakdown `mlxcel inspect` prints. */
typedef struct engine_kv_plan {
    kv_geometry geom;
    int ctx_size; /* per-sequence context limit */
    int n_parallel;
    uint64_t weights_bytes;
    uint64_t kv_bytes_per_token; /* K and V, all layers */
    uint64_t kv_bytes_per_block;
    uint64_t reserve_bytes; /* v2 decode workspace, from the real geometry */
    uint64_t budget_bytes;  /* what the pool may use, reserve included */
    int64_t kv_blocks;      /* what the budget buys (not capped by the context) */
    int64_t blocks_per_seq; /* a full-context sequence */
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

/* Creates the backend, loads the model, sizes (engine_plan_kv) and allocates the KV pool. */
int engine_runtime_open(const char *model_dir, const engine_options *opts, engine_runtime **out,
                        base_err *err);
void engine_runtime_close(engine_runtime *rt);

/* ---- one sequence, synchronously (CLI generate, logits, perplexity) ---- */

/* Runs the prompt through the model in one prefill step on a fresh sequence and returns the
 * logits of every position (all_logits: host float32 [n_prompt, vocab], caller frees) or of
 * the last one only (all_logits NULL, last_logits [vocab] caller-provided). */
int engine_prefill_logits(engine_runtime *rt, const int32_t *prompt, int n_prompt,
                          float **all_logits, float *last_logits, base_err *err);

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

/* ---- prompts: tokenizer + chat template of a model directory ---- */

typedef struct engine_prompter {
    tok_tokenizer *tok;   /* owned */
    chat_template *tmpl;  /* owned; NULL when the model has no chat template */
    json_t *special_vars; /* owned: bos_token, eos_token, ... as the template sees them */
} engine_prompter;

/* Loads dir's tokenizer and chat template; template_file (may be NULL) replaces the model's
 * template. */
int engine_prompter_open(const char *dir, const char *template_file, engine_prompter **out,
                         base_err *err);
void engine_prompter_close(engine_prompter *p);
/* Renders `messages` (a JSON array) with the chat template; `extra` (a JSON object or NULL)
 * adds variables such as tools or enable_thinking. *prompt: caller frees. */
int engine_prompter_render(const engine_prompter *p, const json_t *messages,
                           bool add_generation_prompt, const json_t *extra, char **prompt,
                           base_err *err);
/* Renders and tokenizes a conversation. Special tokens come from the template itself, so the
 * tokenizer adds none (as transformers' apply_chat_template(tokenize=True) does). */
int engine_prompter_encode_chat(const engine_prompter *p, const json_t *messages,
                                bool add_generation_prompt, const json_t *extra, int32_t **ids,
                                int *n, base_err *err);
/* Tokenizes plain text with the tokenizer's special tokens (e.g. BOS) added. */
int engine_prompter_encode_text(const engine_prompter *p, const char *text, int32_t **ids, int *n,
                                base_err *err);

#endif
