/* grammar: constrained decoding. GBNF grammars (as llama.cpp writes them) and a JSON Schema
 * compiler to GBNF; a pushdown matcher over Unicode code points whose state says which tokens
 * of a vocabulary may come next, advances by a chosen token, and says whether the grammar may
 * end (so that the sampler allows its end-of-sequence ids only then).
 *
 * Ownership: a grammar is immutable once built and may be shared; a vocabulary is built once
 * per tokenizer and shared by every matcher over it. A matcher binds one grammar to one
 * vocabulary and caches, per canonical parse state (the set of parse stacks plus a pending
 * partial UTF-8 character), the state's transitions and its token mask; its states share that
 * cache. The grammar and the vocabulary must outlive the matcher, the matcher its states. A
 * matcher and its states belong to one thread at a time.
 *
 * Special tokens (tokenizer_config's and the tokenizer's added special tokens) match only a
 * token terminal that names them (`<|end|>`, `<[200007]>`, as llama.cpp writes them): they are
 * in a mask only where the grammar expects that terminal, and their text never matches a
 * literal or a class. Tokens whose bytes are empty are never in a mask. End-of-sequence is the
 * sampler's policy, decided by gram_state_can_end. */
#ifndef MLXCEL_GRAMMAR_H
#define MLXCEL_GRAMMAR_H

#include "base/base.h"
#include "tokenizer/tokenizer.h"

/* ---- grammars ---- */

typedef struct gram_grammar gram_grammar;

typedef struct gram_vocab gram_vocab;

/* Parses GBNF text (len bytes of UTF-8): rules `name ::= alternatives`, `|`, grouping,
 * `*` `+` `?` `{m}` `{m,}` `{m,n}`, "literals" and [classes] with escapes, `.`, comments; the
 * start rule is `root`. Errors name the line and column; left recursion is refused. *out: free
 * with gram_free. Token terminals need a vocabulary: here they are refused. */
int gram_parse(const char *text, size_t len, gram_grammar **out, base_err *err);
/* The same, with token terminals resolved against v: `<[id]>` (an id of v) and `<text>`, the
 * token whose text is exactly `<text>` (a special token's, or an ordinary token's bytes). A
 * negated terminal (`!<...>`) is refused: special tokens never match text, so `.*` already
 * stops at them. The grammar may then be matched over v only. */
int gram_parse_vocab(const char *text, size_t len, const gram_vocab *v, gram_grammar **out,
                     base_err *err);
void gram_free(gram_grammar *g);

/* Compiles a JSON Schema (len bytes of JSON text; the draft 2020-12 subset described in
 * grammar_schema.c) to GBNF text whose language is a subset of the documents the schema
 * accepts. A keyword it cannot express exactly is refused with an error that names the keyword
 * and its JSON pointer. *gbnf: NUL-terminated, caller frees. */
int gram_schema_to_gbnf(const char *schema, size_t len, char **gbnf, base_err *err);
/* The same for n schemas in one grammar without a root: rule names[i] matches schemas[i], so
 * that a caller's own rules (`root` among them) can use them. Generated rules are named
 * "json-..." and "ws", or end in "-" and digits: the caller's names must be neither. */
int gram_schemas_to_gbnf(const char *const *schemas, const size_t *lens, const char *const *names,
                         int n, char **gbnf, base_err *err);
/* GBNF for `response_format: json_object`: any JSON object. *gbnf: caller frees. */
char *gram_json_object_gbnf(void);

/* ---- vocabularies ---- */

/* The tokenizer's tokens as byte strings (tok_token_bytes) in a trie, special tokens by their
 * text only (for token terminals). *out: free with gram_vocab_free; it does not refer to tok
 * afterwards. */
int gram_vocab_from_tokenizer(const tok_tokenizer *tok, gram_vocab **out, base_err *err);
/* Same from n byte strings: token i is bytes[i] (lens[i] bytes; NULL, 0 bytes or more than
 * 1024: never allowed). The strings are copied. */
gram_vocab *gram_vocab_new(const char *const *bytes, const size_t *lens, int n);
/* Same, where special[i] (special may be NULL) non-NULL makes token i a special token with
 * that text: bytes[i] is then ignored. */
gram_vocab *gram_vocab_new_special(const char *const *bytes, const size_t *lens,
                                   const char *const *special, int n);
/* The id of the token whose text is exactly text (n bytes): a special token's text first, then
 * an ordinary token's bytes (the lowest id); -1 when none. */
int32_t gram_vocab_find(const gram_vocab *v, const char *text, size_t n);
void gram_vocab_free(gram_vocab *v);
int gram_vocab_size(const gram_vocab *v);
/* Words of a mask over the vocabulary: (size + 31) / 32. */
int gram_mask_words(const gram_vocab *v);

/* ---- matching ---- */

typedef struct gram_matcher gram_matcher;
typedef struct gram_state gram_state;

/* Counters of a matcher's cache since its creation. */
typedef struct gram_stats {
    uint64_t masks;      /* gram_state_mask calls */
    uint64_t mask_hits;  /* of those, answered from the cache */
    uint64_t steps;      /* code points or partial bytes stepped through a state */
    uint64_t step_hits;  /* of those, answered from the transition cache */
    uint64_t states;     /* canonical states interned now */
    uint64_t resets;     /* times the cache was dropped for growing past its bounds */
    double mask_seconds; /* time spent computing masks that missed the cache */
} gram_stats;

/* g and v are borrowed (they must outlive the matcher). Free with gram_matcher_free after
 * every state made from it. */
gram_matcher *gram_matcher_new(const gram_grammar *g, const gram_vocab *v);
void gram_matcher_free(gram_matcher *m);
void gram_matcher_stats(const gram_matcher *m, gram_stats *out);

/* The state before any input (at the start of `root`). Free with gram_state_free. */
gram_state *gram_state_new(gram_matcher *m);
gram_state *gram_state_clone(const gram_state *s);
void gram_state_free(gram_state *s);

/* Fills mask (gram_mask_words words) with bit (id % 32) of word (id / 32) set for every token
 * that may come next: its bytes keep the input a prefix of the grammar's language (a token may
 * end inside a multi-byte character that some allowed character completes), or a token
 * terminal names it here (at a character boundary only). Fails only when
 * the grammar is so ambiguous that a state holds more parse stacks than the matcher's bound. */
int gram_state_mask(gram_state *s, uint32_t *mask, base_err *err);
/* Sets logits[id] to -INFINITY for every id in [0, n_logits) the mask leaves out (ids past
 * the vocabulary too: a model's row may be padded past its tokenizer). */
void gram_mask_apply(const gram_vocab *v, const uint32_t *mask, float *logits, int n_logits);
/* Advances by token id: by its bytes, and past every token terminal naming it where one is
 * next (both readings are kept; where the bytes leave a character cut short, the terminal's
 * alone, since a state holds one pending character). A token outside the mask is an error
 * naming it, and leaves s as is. */
int gram_state_accept(gram_state *s, int32_t token, base_err *err);
/* Advances by len bytes of input (text the grammar must match, such as a forced prefix); on
 * error (naming the byte offset) s is left as is. */
int gram_state_accept_bytes(gram_state *s, const char *bytes, size_t len, base_err *err);
/* Whether the input so far is a whole sentence of the grammar (no partial character pending):
 * end-of-sequence may be sampled. */
bool gram_state_can_end(const gram_state *s);
/* Whether no further input is possible (the grammar must end now). */
bool gram_state_done(const gram_state *s);
/* The fewest code points still to match before the grammar may end (0 when it may end now;
 * SIZE_MAX when it never can): what a caller steering output to a close reads. */
size_t gram_state_min_remaining(const gram_state *s);

#endif
