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
 * A literal string is a run of one-range classes. */
enum { GOP_END = 0, GOP_REF = 1, GOP_CLASS = 2, GOP_NCLASS = 3 };

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
};

/* Words one element at code[at] takes. */
static inline uint32_t gram_elem_size(const uint32_t *code, uint32_t at) {
    uint32_t op = GRAM_OP(code[at]);
    if (op == GOP_END) return 1;
    if (op == GOP_REF) return 2;
    return 1 + 2 * GRAM_NRANGE(code[at]);
}

/* Whether code point cp matches the class element at code[at]. */
static inline bool gram_class_match(const uint32_t *code, uint32_t at, uint32_t cp) {
    uint32_t n = GRAM_NRANGE(code[at]);
    const uint32_t *r = code + at + 1;
    bool in = false;
    for (uint32_t i = 0; i < n && !in; i++) in = cp >= r[2 * i] && cp <= r[2 * i + 1];
    return in == (GRAM_OP(code[at]) == GOP_CLASS);
}

/* The vocabulary as a trie in preorder: node i's subtree is [i, end); node 0 is the root (the
 * empty prefix). One struct a node, so a mask's pass over them reads one stream. */
typedef struct gram_node {
    uint32_t end;   /* one past the node's subtree */
    uint32_t first; /* its tokens are gram_vocab.tok[first, first + count) */
    uint16_t depth; /* prefix length */
    uint16_t count; /* tokens whose bytes are exactly the node's prefix */
    uint8_t byte;   /* the edge byte into the node (root: 0) */
} gram_node;

struct gram_vocab {
    int n_tokens;
    char **bytes;     /* (n_tokens) each token's bytes, NULL when never allowed */
    size_t *lens;     /* (n_tokens) */
    gram_node *nodes; /* (n_nodes) */
    uint32_t n_nodes;
    int32_t *tok; /* (tokens in the trie) ids grouped by node */
    uint16_t max_depth;
};

#endif
