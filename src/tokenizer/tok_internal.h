/* The tokenizer module's private types, shared by its .c files only. */
#ifndef MLXCEL_TOK_INTERNAL_H
#define MLXCEL_TOK_INTERNAL_H

#include "tokenizer/tokenizer.h"

#include <pthread.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---- pieces: a list of byte strings in one buffer, the unit every pipeline stage maps ---- */

enum {
    TOK_PIECE_ADDED = 1,   /* the content of an added token (ByteLevel decodes it as is) */
    TOK_PIECE_GROUPED = 2, /* made by joining tokens (Fuse, ByteLevel, ByteFallback) */
    TOK_PIECE_EDGE_L = 4,  /* holds the window's first token, and the window is not at id 0 */
    TOK_PIECE_EDGE_R = 8,  /* holds the window's last token, and more ids may follow */
};

typedef struct tok_pieces {
    char *buf; /* (cap) the pieces' bytes back to back */
    size_t len, cap;
    size_t *off;    /* (ncap) start of each piece in buf */
    size_t *plen;   /* (ncap) length of each piece */
    uint8_t *flags; /* (ncap) TOK_PIECE_* bits */
    size_t n, ncap;
} tok_pieces;

void tok_pieces_clear(tok_pieces *p);
void tok_pieces_free(tok_pieces *p);
void tok_pieces_push(tok_pieces *p, const char *data, size_t len, uint8_t flags);
/* Appends bytes to the last piece (which must exist). */
void tok_pieces_extend(tok_pieces *p, const char *data, size_t len);
static inline const char *tok_piece(const tok_pieces *p, size_t i) {
    /* pieces can all be empty before any byte is stored; NULL + 0 is undefined in C */
    return p->buf ? p->buf + p->off[i] : "";
}

/* ---- a growable byte buffer and id vector ---- */

typedef struct tok_buf {
    char *data; /* (cap) */
    size_t len, cap;
} tok_buf;

void tok_buf_put(tok_buf *b, const char *data, size_t len);
void tok_buf_putc(tok_buf *b, char c);

typedef struct tok_ids {
    int32_t *data; /* (cap) */
    size_t len, cap;
} tok_ids;

void tok_ids_push(tok_ids *v, int32_t id);

/* ---- UTF-8 ---- */

/* Length of the UTF-8 character starting at s[0] (s must be valid UTF-8). */
static inline size_t tok_utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}
/* Decodes the valid UTF-8 character at s. */
int32_t tok_utf8_cp(const char *s, size_t *len);
size_t tok_utf8_put(char *out, int32_t cp);
/* Offset of the first byte that is not valid UTF-8, or n when all is valid. */
size_t tok_utf8_check(const char *s, size_t n);
/* Appends s to out replacing ill-formed sequences by U+FFFD the way the WHATWG decoder (and
 * Rust's from_utf8_lossy) does: one per maximal subpart. When `complete` is non-NULL, a valid
 * but unfinished sequence at the very end is left out instead, and *complete is set to the
 * number of input bytes consumed. */
void tok_utf8_lossy(tok_buf *out, const char *s, size_t n, size_t *complete);
bool tok_is_space_cp(int32_t cp);

/* ---- string -> id map over the token table ---- */

typedef struct tok_strmap {
    int32_t *slot;  /* (cap) id, or -1 when empty */
    uint32_t *hash; /* (cap) low bits of the key's hash */
    size_t cap, n;
} tok_strmap;

uint64_t tok_hash(const char *s, size_t n);

/* ---- patterns (Split, Replace) ---- */

typedef struct tok_pattern {
    char *str; /* (len) the literal, for a String pattern */
    size_t len;
    pcre2_code *re; /* the compiled Regex pattern, or NULL for a String pattern */
} tok_pattern;

/* Compiles a tokenizer.json pattern object {"String": s} or {"Regex": r}. */
int tok_pattern_parse(const void *json, tok_pattern *pat, const char *where, base_err *err);
void tok_pattern_free(tok_pattern *pat);
/* Finds the next match at or after `from`; false when none. md: from the caller. */
bool tok_pattern_find(const tok_pattern *pat, const char *s, size_t n, size_t from,
                      pcre2_match_data *md, size_t *start, size_t *end);

/* ---- pipeline components ---- */

typedef enum {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_STRIP,
    TOK_NORM_STRIP_ACCENTS,
    TOK_NORM_REPLACE,
    TOK_NORM_PREPEND,
    TOK_NORM_SEQUENCE,
} tok_norm_type;

typedef struct tok_normalizer {
    tok_norm_type type;
    tok_pattern pattern; /* Replace */
    char *content;       /* Replace: the replacement; Prepend: the prefix */
    size_t content_len;
    bool left, right;             /* Strip */
    struct tok_normalizer *items; /* (n_items) Sequence */
    size_t n_items;
} tok_normalizer;

typedef enum {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_PREV,
    TOK_SPLIT_MERGED_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} tok_split_behavior;

typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_scheme;

typedef enum {
    TOK_PRE_SPLIT,
    TOK_PRE_BYTE_LEVEL,
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
    TOK_PRE_SEQUENCE,
} tok_pre_type;

typedef struct tok_pretok {
    tok_pre_type type;
    tok_pattern pattern; /* Split; ByteLevel with use_regex; Metaspace's split literal */
    tok_split_behavior behavior;
    bool invert;           /* Split */
    bool add_prefix_space; /* ByteLevel */
    bool use_regex;        /* ByteLevel */
    char replacement[8];   /* Metaspace, UTF-8, NUL-terminated */
    tok_prepend_scheme prepend;
    bool split;               /* Metaspace */
    bool individual_digits;   /* Digits */
    struct tok_pretok *items; /* (n_items) Sequence */
    size_t n_items;
} tok_pretok;

typedef enum {
    TOK_DEC_BYTE_LEVEL,
    TOK_DEC_METASPACE,
    TOK_DEC_BYTE_FALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_REPLACE,
    TOK_DEC_SEQUENCE,
} tok_dec_type;

typedef struct tok_decoder {
    tok_dec_type type;
    tok_pattern pattern; /* Replace */
    char *content;       /* Replace: replacement; Strip: the stripped string */
    size_t content_len;
    int start, stop;     /* Strip */
    char replacement[8]; /* Metaspace */
    tok_prepend_scheme prepend;
    struct tok_decoder *items; /* (n_items) Sequence */
    size_t n_items;
} tok_decoder;

/* An added token (tokenizer.json "added_tokens"). */
typedef struct tok_added {
    int32_t id;
    char *content; /* (len) */
    size_t len;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* A byte trie over added-token contents, for leftmost-longest matching. */
typedef struct tok_trie {
    int32_t *node_token; /* (n_nodes) index into tok->added ending here, or -1 */
    uint64_t *edge_key;  /* (edge_cap) (node << 8 | byte) + 1, 0 when empty */
    int32_t *edge_child; /* (edge_cap) */
    size_t n_nodes, node_cap, edge_cap, n_edges;
    uint8_t first[32]; /* bitmap of bytes that start some token */
} tok_trie;

/* ---- BPE ---- */

typedef struct tok_merge {
    uint64_t key; /* (left id << 32 | right id), UINT64_MAX when the slot is empty */
    int32_t rank;
    int32_t id; /* the merged token */
} tok_merge;

typedef struct tok_cache_entry {
    char *key; /* (klen) the word; NULL when the slot is empty */
    uint32_t klen, n;
    uint64_t hash;
    int32_t *ids; /* (n) */
} tok_cache_entry;

enum { TOK_CACHE_SHARDS = 64, TOK_CACHE_SLOTS = 1024, TOK_CACHE_MAX_WORD = 256 };

typedef struct tok_cache_shard {
    pthread_mutex_t mu;
    tok_cache_entry slot[TOK_CACHE_SLOTS];
    size_t used;
} tok_cache_shard;

typedef struct tok_bpe {
    tok_merge *merges; /* (merge_cap) open addressing */
    size_t merge_cap, n_merges;
    int32_t unk_id;
    bool byte_fallback, fuse_unk, ignore_merges;
    int32_t byte_id[256];   /* id of "<0xHH>", or -1 */
    int32_t *bmp_id;        /* (0x10000) id of the token that is exactly this code point, or -1 */
    tok_cache_shard *cache; /* (TOK_CACHE_SHARDS) */
} tok_bpe;

/* ---- the tokenizer ---- */

struct tok_tokenizer {
    char *name;     /* the directory or label, for messages */
    char **text;    /* (n_ids) each id's string, NULL for an unused id */
    uint32_t *tlen; /* (n_ids) */
    uint8_t *kind;  /* (n_ids) TOK_KIND_* bits */
    int32_t n_ids;
    tok_strmap map;   /* string -> id, model vocabulary and added tokens */
    tok_added *added; /* (n_added) */
    size_t n_added;
    tok_trie trie_raw, trie_norm; /* added tokens matched before / after normalization */
    tok_normalizer *normalizer;   /* NULL: none */
    tok_pretok *pretok;           /* NULL: none */
    tok_decoder *decoder;         /* NULL: tokens joined by spaces */
    bool decoder_end_strip;       /* some Strip removes characters at the end */
    int32_t *prefix, *suffix;     /* (n_prefix), (n_suffix) ids the post-processor adds */
    size_t n_prefix, n_suffix;
    tok_bpe bpe;
    char *bos, *eos; /* "" when absent */
    int32_t bos_id, eos_id;
};

enum { TOK_KIND_ADDED = 1, TOK_KIND_SPECIAL = 2 };

int32_t tok_map_get(const tok_tokenizer *tok, const char *s, size_t n);
void tok_map_put(tok_tokenizer *tok, int32_t id);

/* BPE: builds the merge table and the lookup helpers once the vocabulary is in place. */
int tok_bpe_init(tok_tokenizer *tok, const void *model_json, base_err *err);
void tok_bpe_free(tok_bpe *bpe);

/* Scratch space one encode call reuses across words. */
typedef struct tok_scratch {
    int32_t *sym_id;      /* (cap) */
    int32_t *sym_off;     /* (cap) byte offset of each symbol in the word */
    int32_t *sym_len;     /* (cap) */
    int32_t *prev, *next; /* (cap) */
    void *heap;           /* (heap_cap) merge candidates */
    size_t cap, heap_cap;
    pcre2_match_data *md;
} tok_scratch;

void tok_scratch_free(tok_scratch *s);
/* Appends the ids of one pre-tokenized word. */
void tok_bpe_word(const tok_tokenizer *tok, tok_scratch *s, const char *w, size_t n, tok_ids *out);

/* Trie over added tokens. */
void tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t added_index);
/* Longest added token starting at s[i]; returns its length (0 when none), *added its index. */
size_t tok_trie_match(const tok_trie *t, const char *s, size_t n, size_t i, int32_t *added);
void tok_trie_free(tok_trie *t);

/* Components (tok_load.c). */
void tok_normalizer_free(tok_normalizer *nm);
void tok_pretok_free(tok_pretok *pt);
void tok_decoder_free(tok_decoder *d);

/* Normalizes text into out (tok_encode.c). */
int tok_normalize(const tok_normalizer *nm, const char *s, size_t n, tok_buf *out,
                  pcre2_match_data *md, base_err *err);

/* Decodes ids to raw bytes (ill-formed UTF-8 kept as is). at_start: ids[0] is the sequence's
 * first id; at_end: no id follows. Fails on an id outside the vocabulary. */
int tok_decode_raw(const tok_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                   bool at_start, bool at_end, tok_buf *out, base_err *err);

#endif
