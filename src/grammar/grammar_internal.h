/* Shared by the grammar module's files only: the compiled grammar's element code and the
 * vocabulary trie. Other modules include grammar.h. */
#ifndef MLXCEL_GRAMMAR_INTERNAL_H
#define MLXCEL_GRAMMAR_INTERNAL_H

#include "grammar/grammar.h"

/* A compiled grammar is one flat array of 32-bit words. Each rule's alternatives are element
 * sequences that each end in GOP_END; a parse stack holds offsets into this array. Elements:
 *   GOP_END                       end of an alternative (return to the caller's frame)
 *   GOP_REF, rule                 call `rule`
 *   GOP_CLASS | n << 8, n pairs   one code point in one of n inclusive ranges [lo, hi]
 *   GOP_NCLASS | n << 8, n pairs  one code point in none of them (`.` is NCLASS with n = 0)
 *   GOP_TOKEN, id                 the one token id, whole (`<|end|>`, `<[id]>`): matched by id at
 *                                 a token boundary, never by its bytes (grammar_match.c)
 * A literal string is a run of one-range classes. */
enum { GOP_END = 0, GOP_REF = 1, GOP_CLASS = 2, GOP_NCLASS = 3, GOP_TOKEN = 4 };

#define GRAM_OP(w)     ((w)&0xffu)
#define GRAM_NRANGE(w) ((w) >> 8)

typedef struct gram_rule {
    char *name;         /* the user's rule this one is (or was generated for) */
    int line, col;      /* where it was defined, or the construct it was generated for */
    uint32_t first_alt; /* index into gram_grammar.alts */
    uint32_t n_alts;
    uint32_t min_len; /* fewest code points a match takes (UINT32_MAX: none is finite) */
    /* For a link of an x{m,n} chain (`r_k ::= x r_(k-1) |`), the chain's innermost link: the
     * links are consecutive rules, innermost first, so this link has index - chain_start
     * links after it. UINT32_MAX for other rules. */
    uint32_t chain_start;
} gram_rule;

struct gram_grammar {
    uint32_t *code; /* (n_code) elements of every rule's alternatives */
    size_t n_code;
    uint32_t *alts; /* (n_alts) offset in code of each alternative's first element */
    size_t n_alts;
    gram_rule *rules; /* (n_rules) */
    size_t n_rules;
    uint32_t root; /* rule index of `root` */
    bool tokens;   /* some element is a GOP_TOKEN: accepting a token then tries them too */
};

/* Words one element at code[at] takes. */
static inline uint32_t gram_elem_size(const uint32_t *code, uint32_t at) {
    uint32_t op = GRAM_OP(code[at]);
    if (op == GOP_END) return 1;
    if (op == GOP_REF || op == GOP_TOKEN) return 2;
    return 1 + 2 * GRAM_NRANGE(code[at]);
}

/* Whether the element at code[at] is a class (the matcher's code-point terminals). */
static inline bool gram_is_class(const uint32_t *code, uint32_t at) {
    uint32_t op = GRAM_OP(code[at]);
    return op == GOP_CLASS || op == GOP_NCLASS;
}

/* Whether code point cp matches the class element at code[at]. */
static inline bool gram_class_match(const uint32_t *code, uint32_t at, uint32_t cp) {
    uint32_t n = GRAM_NRANGE(code[at]);
    const uint32_t *r = code + at + 1;
    bool in = false;
    for (uint32_t i = 0; i < n && !in; i++) in = cp >= r[2 * i] && cp <= r[2 * i + 1];
    return in == (GRAM_OP(code[at]) == GOP_CLASS);
}

/* ---- UTF-8, byte by byte ---- */

/* A partial character: total length (2..4) << 28 | bytes still to come << 24 | bits so far.
 * 0 means none. */
#define PART(total, rem, val) ((uint32_t)(total) << 28 | (uint32_t)(rem) << 24 | (val))
#define PART_TOTAL(p)         ((p) >> 28)
#define PART_REM(p)           (((p) >> 24) & 0xF)
#define PART_VAL(p)           ((p)&0xFFFFFF)

/* Takes byte b after partial *part: -1 when the bytes cannot be UTF-8 (a stray continuation,
 * an invalid lead, an overlong form, a surrogate, past U+10FFFF), 0 when a character is still
 * pending (*part updated), 1 when *cp is complete (*part reset). */
static inline int gram_utf8_step(uint32_t *part, uint8_t b, uint32_t *cp) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t p = *part;
    if (!p) {
        if (b < 0x80) {
            *cp = b;
            return 1;
        }
        int total = b >= 0xC2 && b <= 0xDF   ? 2
                    : (b & 0xF0) == 0xE0     ? 3
                    : b >= 0xF0 && b <= 0xF4 ? 4
                                             : 0;
        if (!total) return -1;
        *part = PART(total, total - 1, b & (0x7F >> total));
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    p = PART(PART_TOTAL(p), PART_REM(p) - 1, PART_VAL(p) << 6 | (b & 0x3F));
    if (PART_REM(p)) {
        *part = p;
        return 0;
    }
    uint32_t v = PART_VAL(p);
    if (v < min_cp[PART_TOTAL(p)] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return -1;
    *part = 0;
    *cp = v;
    return 1;
}

/* The valid code points that start with partial p: [*lo, *hi] and [*lo2, *hi2] (the
 * surrogates split them); false when there are none (an overlong or out-of-range prefix). */
static inline bool gram_partial_range(uint32_t p, uint32_t *lo, uint32_t *hi, uint32_t *lo2,
                                      uint32_t *hi2) {
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t rem = PART_REM(p), total = PART_TOTAL(p), shift = 6 * rem;
    *lo = PART_VAL(p) << shift;
    *hi = *lo | ((1u << shift) - 1);
    if (*lo < min_cp[total]) *lo = min_cp[total];
    if (*hi > 0x10FFFF) *hi = 0x10FFFF;
    *lo2 = 1;
    *hi2 = 0;
    if (*lo > *hi) return false;
    if (*lo <= 0xDFFF && *hi >= 0xD800) {
        *lo2 = 0xE000 > *lo ? 0xE000 : *lo;
        *hi2 = *hi;
        *hi = 0xD7FF;
    }
    return *lo <= *hi || *lo2 <= *hi2;
}

/* ---- the vocabulary ---- */

/* The vocabulary as a trie in preorder: node i's subtree is [i, end); node 0 is the root (the
 * empty prefix). One struct a node, so a mask's pass over them reads one stream. The tokens
 * are numbered in the trie's order, so a subtree's tokens are one run of gram_vocab.tok:
 * [first, nodes[end].first) (a sentinel node closes the array). */
enum {
    GRAM_NODE_CLEAN = 1, /* every token below the node is valid UTF-8 (a final character may be
                            cut short), so from a character boundary none is refused for it */
    GRAM_NODE_HI = 2,    /* some byte below the node is past ASCII */
};

typedef struct gram_node {
    uint32_t end;   /* one past the node's subtree */
    uint32_t first; /* its subtree's tokens start at gram_vocab.tok[first], its own first */
    uint16_t depth; /* prefix length */
    uint16_t count; /* tokens whose bytes are exactly the node's prefix */
    uint16_t reach; /* the longest token below, in bytes past the node's prefix */
    uint8_t byte;   /* the edge byte into the node (root: 0) */
    uint8_t flags;  /* GRAM_NODE_* */
} gram_node;

struct gram_vocab {
    int n_tokens;
    char **bytes;         /* (n_tokens) each token's bytes, NULL when never allowed */
    char **special;       /* (n_tokens) a special token's text (its bytes are NULL), else NULL */
    size_t *lens;         /* (n_tokens) */
    gram_node *nodes;     /* (n_nodes + 1) the last a sentinel */
    uint64_t (*below)[2]; /* (n_nodes) the ASCII bytes below each node, as a 128-bit set */
    uint32_t n_nodes;
    int32_t *tok; /* (tokens in the trie) ids in trie order */
    uint16_t max_depth;
};

#endif
