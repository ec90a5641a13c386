/* base: status and error messages, logging, dtypes and f16/bf16 conversion, the thread pool,
 * hashing, and small helpers over jansson. Knows nothing about models.
 *
 * Error convention (every module): a function that can fail returns int, 0 on success and -1
 * on failure, and fills the caller's base_err with one line that names the file, tensor, flag
 * or field at fault. Nothing deep inside prints; the CLI prints "mlxcel: error: <msg>". */
#ifndef MLXCEL_BASE_H
#define MLXCEL_BASE_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- errors ---- */

typedef struct base_err {
    char msg[1024];
} base_err;

/* Formats the message into err (err may be NULL) and returns -1, so callers write
 * `return base_fail(err, "...")`. */
int base_fail(base_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to an existing message (for adding context on the way up). */
int base_fail_wrap(base_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- logging (the only global state) ---- */

typedef enum { BASE_LOG_ERROR = 0, BASE_LOG_WARN, BASE_LOG_INFO, BASE_LOG_DEBUG } base_log_level;
void base_log_set_level(base_log_level level);
void base_log(base_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- dtypes ---- */

typedef enum {
    BASE_DTYPE_F32 = 0,
    BASE_DTYPE_F16,
    BASE_DTYPE_BF16,
    BASE_DTYPE_F64,
    BASE_DTYPE_I8,
    BASE_DTYPE_U8,
    BASE_DTYPE_I16,
    BASE_DTYPE_U16,
    BASE_DTYPE_I32,
    BASE_DTYPE_U32,
    BASE_DTYPE_I64,
    BASE_DTYPE_U64,
    BASE_DTYPE_BOOL,
    BASE_DTYPE_COUNT
} base_dtype;

size_t base_dtype_size(base_dtype dt);
/* Safetensors spelling: "F32", "BF16", "U32", ... */
const char *base_dtype_name(base_dtype dt);
/* Parses a safetensors dtype name; returns -1 for an unknown one. */
int base_dtype_parse(const char *name, base_dtype *out);

/* ---- half precision ---- */

float base_f16_to_f32(uint16_t h);
uint16_t base_f32_to_f16(float f); /* round to nearest even */
float base_bf16_to_f32(uint16_t b);
uint16_t base_f32_to_bf16(float f); /* round to nearest even, NaN kept NaN */
/* Reads element i of a float array of dtype F32, F16 or BF16 as float. */
float base_load_float(const void *data, base_dtype dt, size_t i);
void base_store_float(void *data, base_dtype dt, size_t i, float v);

/* ---- saturating and checked arithmetic (sizes, budgets) ---- */

uint64_t base_sat_add_u64(uint64_t a, uint64_t b);
uint64_t base_sat_sub_u64(uint64_t a, uint64_t b);
uint64_t base_sat_mul_u64(uint64_t a, uint64_t b);
/* Returns false when a * b overflows. */
bool base_mul_ok_u64(uint64_t a, uint64_t b, uint64_t *out);

/* ---- hashing ---- */

/* 64-bit FNV-1a continued from `seed` (pass BASE_HASH_SEED to start). */
#define BASE_HASH_SEED 0xcbf29ce484222325ull
uint64_t base_hash64(uint64_t seed, const void *data, size_t len);

/* ---- the k best of a stream (sampling candidates) ---- */

/* Keeps the k largest (value, id) pairs pushed, in caller-owned arrays of k entries: a
 * min-heap whose root is the worst kept pair, "worse" meaning a lower value, or the same
 * value and a higher id (so that the lower id wins a tie, as a stable sort would). */
typedef struct base_topk {
    float *val;  /* (k) */
    int32_t *id; /* (k) */
    int k, n;    /* capacity, pairs kept */
} base_topk;

void base_topk_push(base_topk *t, float val, int32_t id);
/* Sorts the kept pairs best first (value descending, ties lower id first); returns n. */
int base_topk_finish(base_topk *t);

/* ---- thread pool ---- */

typedef struct base_pool base_pool;
/* fn(ctx, i) for every i in [0, n); the calling thread takes part; returns when all are done. */
typedef void (*base_pool_fn)(void *ctx, int64_t i);

/* n_threads <= 0 means the number of online cores. Returns NULL only when out of memory. */
base_pool *base_pool_create(int n_threads);
void base_pool_destroy(base_pool *pool);
int base_pool_threads(const base_pool *pool);
/* Runs fn over [0, n) split into contiguous ranges, one per worker. */
void base_pool_for(base_pool *pool, int64_t n, base_pool_fn fn, void *ctx);
int base_cpu_count(void);
/* Waits on cv (mu held by the caller) until signalled or ms milliseconds have passed. */
void base_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int ms);

/* ---- memory and files ---- */

/* Reads a whole file into a NUL-terminated heap buffer (caller frees). */
int base_read_file(const char *path, char **data, size_t *len, base_err *err);
/* Joins dir and name with one '/'; caller frees. */
char *base_path_join(const char *dir, const char *name);
bool base_file_exists(const char *path);
bool base_dir_exists(const char *path);
/* malloc that aborts with a message on failure: used for small host allocations only. */
void *base_xmalloc(size_t n);
void *base_xcalloc(size_t n, size_t size);
void *base_xrealloc(void *p, size_t n);
char *base_xstrdup(const char *s);

/* ---- UTF-8 ---- */

/* Copies src[0..n) into dst (cap bytes, always NUL-terminated when cap > 0) as well-formed
 * UTF-8: every byte that does not begin a well-formed sequence becomes U+FFFD, and when dst is
 * too small the copy ends at a character boundary. Returns the bytes written. */
size_t base_utf8_clean(char *dst, size_t cap, const char *src, size_t n);
/* base_utf8_clean of a whole string into a new buffer (caller frees). */
char *base_utf8_dup(const char *s);
bool base_utf8_valid(const char *s, size_t n);

/* Monotonic time in seconds. */
double base_now(void);

#endif
