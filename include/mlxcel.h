/* mlxcel.h: the public C API of libmlxcel.
 *
 * Load a model directory (MLX affine-quantized or plain Hugging Face safetensors) into an
 * engine, submit requests, stream their text, cancel them. The engine batches every running
 * request on one thread of its own (continuous batching over a paged KV cache).
 *
 * Threading. Every function may be called from any thread, at the same time as others, but
 * mlxcel_close, which must be the last call on an engine. Callbacks run on the engine's
 * thread, one at a time; from a callback only mlxcel_cancel may be called (it returns at
 * once), and a callback must not block for long, as it holds back every other request.
 * mlxcel_close and mlxcel_generate must never be called from a callback.
 *
 * Memory. Strings passed in are copied before the call returns. Pointers handed to a callback
 * are valid during that call only. The one exception is mlxcel_generate's *text, which the
 * caller frees with mlxcel_free.
 *
 * Errors. Functions that can fail return 0 on success and -1 on failure, writing one line
 * that names the file, field or option at fault into err (err_len bytes, NUL-terminated,
 * truncated to fit; err may be NULL). */
#ifndef MLXCEL_PUBLIC_H
#define MLXCEL_PUBLIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MLXCEL_VERSION_MAJOR  0
#define MLXCEL_VERSION_MINOR  1
#define MLXCEL_VERSION_PATCH  0
#define MLXCEL_VERSION_STRING "0.1.0"

/* The library's version as it was built (compare with the macros above). */
const char *mlxcel_version(void);

typedef struct mlxcel_engine mlxcel_engine;

typedef struct mlxcel_options {
    const char *device;    /* "auto" (CUDA when a GPU is usable, else CPU), "cpu", "cuda" */
    int n_threads;         /* CPU threads; <= 0: one per core */
    int ctx_size;          /* tokens per sequence, prompt and generated; <= 0: the model's */
    int n_parallel;        /* requests generating at once; more wait in a queue */
    uint64_t kv_budget;    /* bytes for the KV cache; 0: enough for n_parallel x ctx_size */
    const char *chat_tmpl; /* NULL, or a Jinja file that replaces the model's chat template */
} mlxcel_options;

/* device "auto", n_threads 0, ctx_size 0, n_parallel 4, kv_budget 0, chat_tmpl NULL. */
mlxcel_options mlxcel_options_default(void);

/* Loads model_dir (config.json, *.safetensors, tokenizer.json, tokenizer_config.json) and
 * starts the engine's thread. opts NULL: mlxcel_options_default(). On success *out is the
 * caller's, to end with mlxcel_close; on failure it is set to NULL. */
int mlxcel_open(const char *model_dir, const mlxcel_options *opts, mlxcel_engine **out, char *err,
                size_t err_len);

/* Cancels every request (each still gets its final callback, before this returns), stops the
 * engine's thread and frees everything. NULL is ignored. */
void mlxcel_close(mlxcel_engine *engine);

/* One chat turn; content is plain text. */
typedef struct mlxcel_message {
    const char *role; /* "system", "user", "assistant", ... as the template knows them */
    const char *content;
} mlxcel_message;

typedef struct mlxcel_request {
    const char *prompt;             /* raw text (the tokenizer adds BOS etc.), or NULL when */
    const mlxcel_message *messages; /* (n_messages) the chat, rendered with the model's */
    int n_messages;                 /* chat template, generation prompt added */
    int max_tokens;                 /* <= 0: up to the context limit */
    float temperature;              /* <= 0: greedy */
    int top_k;                      /* <= 0: off */
    float top_p;                    /* >= 1: off */
    float min_p;                    /* <= 0: off */
    uint64_t seed;                  /* seeds the draw when temperature > 0 */
    const char *const *stop;        /* (n_stop) strings that end the text; never shown */
    int n_stop;
} mlxcel_request;

/* No prompt, no messages, max_tokens 0, temperature 0.8, top-k 40, top-p 0.95, min-p 0.05,
 * seed 0, no stop strings. */
mlxcel_request mlxcel_request_default(void);

typedef enum mlxcel_finish {
    MLXCEL_FINISH_NONE = 0,  /* more calls follow */
    MLXCEL_FINISH_STOP,      /* end-of-sequence token or a stop string */
    MLXCEL_FINISH_LENGTH,    /* max_tokens or the context limit */
    MLXCEL_FINISH_CANCELLED, /* mlxcel_cancel or mlxcel_close */
    MLXCEL_FINISH_ERROR,     /* see mlxcel_event.error */
} mlxcel_finish;

/* What a callback gets: a piece of text (finish NONE), or the end of the request (finish set;
 * it may carry a last piece too). */
typedef struct mlxcel_event {
    uint64_t id;          /* as mlxcel_submit gave it */
    const char *text;     /* (text_len) whole UTF-8 characters, not NUL-terminated */
    size_t text_len;      /* 0 when nothing new can be shown yet */
    mlxcel_finish finish; /* NONE on every call but the last */
    int n_prompt;         /* prompt tokens */
    int n_generated;      /* tokens generated so far */
    const char *error;    /* MLXCEL_FINISH_ERROR only: one line */
} mlxcel_event;

/* Every accepted request gets calls in order and then exactly one with finish != NONE, after
 * which ctx is never touched again. */
typedef void (*mlxcel_event_fn)(void *ctx, const mlxcel_event *ev);

/* Queues req (copied). On success *id (may be NULL) names it for mlxcel_cancel; on failure
 * the callback is never called. */
int mlxcel_submit(mlxcel_engine *engine, const mlxcel_request *req, mlxcel_event_fn callback,
                  void *ctx, uint64_t *id, char *err, size_t err_len);

/* Ends a request early; its final call says MLXCEL_FINISH_CANCELLED unless it had already
 * finished. Unknown ids are ignored. Any thread, callbacks included. */
void mlxcel_cancel(mlxcel_engine *engine, uint64_t id);

/* Submits req and waits for it to end (a stop or the length limit). On success *text
 * (NUL-terminated) is the whole text, freed by the caller with mlxcel_free. A request that
 * ends in an error, or is cancelled, returns -1 with the reason in err. */
int mlxcel_generate(mlxcel_engine *engine, const mlxcel_request *req, char **text, char *err,
                    size_t err_len);

/* Frees what the library allocated for the caller. NULL is ignored. */
void mlxcel_free(void *p);

#ifdef __cplusplus
}
#endif

#endif
