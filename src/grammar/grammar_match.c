/* The matcher: parse states as canonical sets of parse stacks, interned, with cached
 * transitions and cached token masks.
 *
 * A parse stack is a list of offsets into the grammar's code, bottom first; its top is always
 * a terminal, a character class (the next code point it can take) or a token terminal (the
 * next token it can take, whole), or the stack is empty (the grammar is complete). Taking a code
 * point replaces the top by the offset after it and expands: a frame at an alternative's end is
 * popped, a call is replaced by its continuation and one copy of the stack per alternative of the
 * callee is pushed (a continuation that is an alternative's end is dropped, so right recursion does
 * not deepen the stack). The state is the sorted set of distinct stacks; it is interned, and its id
 * keys the transition cache (per code point: an array for ASCII, a hash table past it) and the mask
 * cache.
 *
 * Input is bytes: a character split across tokens is carried as a partial code point (its
 * length, bytes still to come, bits so far) beside the set. A byte that leaves a partial is
 * allowed when some stack's top class holds a valid character with that prefix.
 *
 * A mask is one pass over the vocabulary trie (grammar_vocab.c) carrying the state of every
 * prefix on the path: a dead prefix skips its subtree, so a state that allows little costs
 * little; a subtree made only of characters that move the state along its run of free text
 * is allowed whole (compute_mask), so a state inside a string walks only the tokens holding a
 * quote, a backslash or a control character. Masks are cached per state, the far links of a
 * bounded repetition sharing one (chain_canon).
 *
 * A token terminal takes no code point: a stack with one on top dies on any byte, and lives on
 * only through the token it names, at a character boundary. Its id is added to the state's
 * mask there (so the mask cache, keyed by the state, holds it), and accepting that token steps
 * those stacks past it (step_token, cached beside the code-point transitions). */
#include "grammar/grammar_internal.h"

#include <stdlib.h>
#include <string.h>

#define DEAD    UINT32_MAX
#define UNKNOWN (UINT32_MAX - 1)

/* Bounds that keep a pathological grammar from exhausting memory: stacks in one state, the
 * depth of one stack, and the cache's size before it is dropped and rebuilt. */
#define MAX_STACKS     4096
#define MAX_DEPTH      4096
#define MAX_SETS       (1u << 16)
#define MAX_MASK_BYTES ((size_t)128 << 20)

typedef struct gset {
    size_t off;       /* in pool: n_stacks, then per stack its length and its offsets */
    uint32_t n_words; /* of the blob at off */
    uint64_t hash;
    uint32_t key;     /* the set whose mask this one's is (chain_canon), UNKNOWN until asked */
    uint32_t hi_next; /* for HI_SAME: the set after any code point past ASCII, or UNKNOWN */
    uint8_t hi;       /* HI_*: how the set takes code points past ASCII */
} gset;

/* Open-addressed map from 64-bit keys to 32-bit values (key 0 is never used). */
typedef struct u64map {
    uint64_t *keys;
    uint32_t *vals;
    size_t cap, n; /* cap: a power of two */
} u64map;

struct gram_matcher {
    const gram_grammar *g;
    const gram_vocab *v;
    uint32_t *chain_map; /* (g->n_code) chain_canon's offset map, NULL when it changes nothing */
    uint32_t gen;        /* bumped when the cache is dropped; states re-intern their blob */
    /* interned sets */
    uint32_t *pool;
    size_t n_pool, cap_pool;
    gset *sets;
    uint32_t n_sets, cap_sets;
    uint32_t *ascii; /* (cap_sets, 128) transitions by ASCII code point, UNKNOWN until met */
    uint32_t *table; /* (cap_table) set id + 1, 0 empty */
    size_t cap_table;
    u64map trans; /* (set << 32 | code point, or | 1 << 31 | partial, or | 1 << 30 | token id)
                     -> set or DEAD (code points end below bit 21, a partial's bits below 31) */
    u64map masks; /* (set << 32 | partial) + 1 -> index into mask */
    uint32_t **mask;
    size_t n_mask, cap_mask;
    /* scratch */
    uint32_t *work; /* stacks being expanded */
    size_t n_work, cap_work;
    uint32_t *bld; /* stacks emitted: length then offsets, back to back */
    size_t n_bld, cap_bld;
    size_t *bld_at; /* (n_bld_stacks) where each emitted stack starts in bld */
    size_t n_bld_stacks, cap_bld_at;
    uint32_t *canon;
    size_t cap_canon;
    uint32_t *walk_set, *walk_part; /* (v->max_depth + 1) the trie walk's path states */
    int32_t *walk_k;                /* (v->max_depth + 1) their place on the run, or -1 */
    /* the run of the walk's start state (chain_run): (v->max_depth + 2) each */
    uint32_t *run_set;
    uint64_t (*run_loop)[2];
    bool *run_hi;
    uint64_t (*run_and)[2]; /* ((max_depth + 2)^2) [k][n] the AND of run_loop[k, k + n) */
    bool *run_and_hi;
    int depth;
    bool overflow; /* a bound was hit while building the current set */
    gram_stats st;
};

struct gram_state {
    gram_matcher *m;
    uint32_t gen, set, partial;
    uint32_t *blob; /* (n_blob) the set's own copy, to re-intern after the cache is dropped */
    uint32_t n_blob;
};

/* ---- small containers ---- */

static void reserve_u32(uint32_t **p, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    *p = base_xrealloc(*p, c * sizeof **p);
    *cap = c;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static bool map_get(const u64map *mp, uint64_t key, uint32_t *val) {
    if (!mp->cap) return false;
    for (size_t i = mix64(key) & (mp->cap - 1);; i = (i + 1) & (mp->cap - 1)) {
        if (mp->keys[i] == key) {
            *val = mp->vals[i];
            return true;
        }
        if (mp->keys[i] == 0) return false;
    }
}

static void map_put(u64map *mp, uint64_t key, uint32_t val) {
    if (2 * (mp->n + 1) > mp->cap) {
        u64map old = *mp;
        mp->cap = old.cap ? 2 * old.cap : 1024;
        mp->keys = base_xcalloc(mp->cap, sizeof *mp->keys);
        mp->vals = base_xmalloc(mp->cap * sizeof *mp->vals);
        mp->n = 0;
        for (size_t i = 0; i < old.cap; i++)
            if (old.keys[i]) map_put(mp, old.keys[i], old.vals[i]);
        free(old.keys);
        free(old.vals);
    }
    size_t i = mix64(key) & (mp->cap - 1);
    while (mp->keys[i] && mp->keys[i] != key) i = (i + 1) & (mp->cap - 1);
    if (!mp->keys[i]) mp->n++;
    mp->keys[i] = key;
    mp->vals[i] = val;
}

static void map_free(u64map *mp) {
    free(mp->keys);
    free(mp->vals);
    *mp = (u64map){0};
}

/* ---- building a set: expansion and canonical form ---- */

static void emit_stack(gram_matcher *m, size_t off, uint32_t len) {
    if (m->n_bld_stacks == MAX_STACKS) {
        m->overflow = true;
        return;
    }
    if (m->n_bld_stacks == m->cap_bld_at) {
        m->cap_bld_at = m->cap_bld_at ? 2 * m->cap_bld_at : 64;
        m->bld_at = base_xrealloc(m->bld_at, m->cap_bld_at * sizeof *m->bld_at);
    }
    reserve_u32(&m->bld, &m->cap_bld, m->n_bld + 1 + len);
    m->bld_at[m->n_bld_stacks++] = m->n_bld;
    m->bld[m->n_bld++] = len;
    memcpy(m->bld + m->n_bld, m->work + off, len * sizeof *m->work);
    m->n_bld += len;
}

/* Expands the stack work[off, off + len) until its top is a class (or it is empty) and emits
 * every stack that results. Never writes below work[off + len): a caller's stack stays. */
static void expand(gram_matcher *m, size_t off, uint32_t len) {
    const uint32_t *code = m->g->code;
    while (len > 0 && GRAM_OP(code[m->work[off + len - 1]]) == GOP_END) len--;
    if (len == 0 || GRAM_OP(code[m->work[off + len - 1]]) != GOP_REF) {
        emit_stack(m, off, len);
        return;
    }
    uint32_t top = m->work[off + len - 1], callee = code[top + 1], cont = top + 2;
    uint32_t keep = len - 1 + (GRAM_OP(code[cont]) != GOP_END);
    if (keep + 1 > MAX_DEPTH || m->depth > MAX_DEPTH) {
        m->overflow = true;
        return;
    }
    size_t child = m->n_work;
    reserve_u32(&m->work, &m->cap_work, child + keep + 1);
    memmove(m->work + child, m->work + off, (len - 1) * sizeof *m->work);
    if (keep == len) m->work[child + len - 1] = cont;
    m->n_work = child + keep + 1;
    m->depth++;
    const gram_rule *r = &m->g->rules[callee];
    for (uint32_t a = 0; a < r->n_alts && !m->overflow; a++) {
        m->work[child + keep] = m->g->alts[r->first_alt + a];
        expand(m, child, keep + 1);
    }
    m->depth--;
    m->n_work = child;
}

static int cmp_stacks(const uint32_t *a, const uint32_t *b) {
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (uint32_t i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* Shell sort of the emitted stacks (qsort has no context argument in C11). */
static void sort_emitted(gram_matcher *m) {
    size_t n = m->n_bld_stacks, *at = m->bld_at;
    for (size_t gap = n / 2; gap > 0; gap /= 2) {
        for (size_t i = gap; i < n; i++) {
            size_t x = at[i], j = i;
            while (j >= gap && cmp_stacks(m->bld + at[j - gap], m->bld + x) > 0) {
                at[j] = at[j - gap];
                j -= gap;
            }
            at[j] = x;
        }
    }
}

static uint64_t hash_words(const uint32_t *w, size_t n) {
    return base_hash64(BASE_HASH_SEED, w, n * sizeof *w);
}

/* The id of the set blob w (n words), interned when new. */
static uint32_t intern(gram_matcher *m, const uint32_t *w, uint32_t n) {
    uint64_t h = hash_words(w, n);
    if (2 * ((size_t)m->n_sets + 1) > m->cap_table) {
        free(m->table);
        m->cap_table = m->cap_table ? 2 * m->cap_table : 1024;
        m->table = base_xcalloc(m->cap_table, sizeof *m->table);
        for (uint32_t s = 0; s < m->n_sets; s++) {
            size_t i = m->sets[s].hash & (m->cap_table - 1);
            while (m->table[i]) i = (i + 1) & (m->cap_table - 1);
            m->table[i] = s + 1;
        }
    }
    size_t i = h & (m->cap_table - 1);
    for (; m->table[i]; i = (i + 1) & (m->cap_table - 1)) {
        const gset *s = &m->sets[m->table[i] - 1];
        if (s->hash == h && s->n_words == n && !memcmp(m->pool + s->off, w, n * sizeof *w))
            return m->table[i] - 1;
    }
    if (m->n_sets == m->cap_sets) {
        m->cap_sets = m->cap_sets ? 2 * m->cap_sets : 256;
        m->sets = base_xrealloc(m->sets, m->cap_sets * sizeof *m->sets);
        m->ascii = base_xrealloc(m->ascii, m->cap_sets * 128 * sizeof *m->ascii);
    }
    for (int c = 0; c < 128; c++) m->ascii[(size_t)m->n_sets * 128 + c] = UNKNOWN;
    reserve_u32(&m->pool, &m->cap_pool, m->n_pool + n);
    memcpy(m->pool + m->n_pool, w, n * sizeof *w);
    m->sets[m->n_sets] =
        (gset){.off = m->n_pool, .n_words = n, .hash = h, .key = UNKNOWN, .hi_next = UNKNOWN};
    m->n_pool += n;
    m->table[i] = m->n_sets + 1;
    m->st.states = m->n_sets + 1;
    return m->n_sets++;
}

/* The emitted stacks as an interned set (DEAD when none). */
static uint32_t finish_set(gram_matcher *m) {
    if (m->n_bld_stacks == 0) return DEAD;
    sort_emitted(m);
    size_t n = 1;
    reserve_u32(&m->canon, &m->cap_canon, m->n_bld + 1);
    m->canon[0] = 0;
    const uint32_t *prev = NULL;
    for (size_t i = 0; i < m->n_bld_stacks; i++) {
        const uint32_t *s = m->bld + m->bld_at[i];
        if (prev && !cmp_stacks(prev, s)) continue;
        memcpy(m->canon + n, s, (1 + s[0]) * sizeof *s);
        n += 1 + s[0];
        m->canon[0]++;
        prev = s;
    }
    return intern(m, m->canon, (uint32_t)n);
}

static void begin_set(gram_matcher *m) {
    m->n_bld = m->n_bld_stacks = m->n_work = 0;
    m->overflow = false;
}

static uint32_t initial_set(gram_matcher *m) {
    begin_set(m);
    const gram_rule *r = &m->g->rules[m->g->root];
    reserve_u32(&m->work, &m->cap_work, 1);
    m->n_work = 1;
    for (uint32_t a = 0; a < r->n_alts; a++) {
        m->work[0] = m->g->alts[r->first_alt + a];
        expand(m, 0, 1);
    }
    return m->overflow ? UNKNOWN : finish_set(m);
}

/* Whether the stack's top terminal at code[at] takes the input: code point v, or token id v
 * when `token` (a token terminal). */
static bool terminal_takes(const uint32_t *code, uint32_t at, bool token, uint32_t v) {
    if (token) return GRAM_OP(code[at]) == GOP_TOKEN && code[at + 1] == v;
    return gram_is_class(code, at) && gram_class_match(code, at, v);
}

/* The set after code point v, or token id v through its token terminals when `token` (DEAD,
 * or UNKNOWN when a bound was hit). */
static uint32_t advance_by(gram_matcher *m, uint32_t set, bool token, uint32_t v) {
    begin_set(m);
    const uint32_t *code = m->g->code;
    size_t at = m->sets[set].off;
    uint32_t n = m->pool[at++];
    for (uint32_t k = 0; k < n && !m->overflow; k++) {
        uint32_t len = m->pool[at];
        const uint32_t *stk = m->pool + at + 1;
        at += 1 + len;
        if (len == 0 || !terminal_takes(code, stk[len - 1], token, v)) continue;
        reserve_u32(&m->work, &m->cap_work, len);
        memcpy(m->work, stk, len * sizeof *stk);
        m->work[len - 1] += gram_elem_size(code, stk[len - 1]);
        m->n_work = len;
        expand(m, 0, len);
    }
    return m->overflow ? UNKNOWN : finish_set(m);
}

/* The same through the cache. */
static uint32_t step_token(gram_matcher *m, uint32_t set, uint32_t id) {
    uint64_t key = (uint64_t)set << 32 | 1u << 30 | id;
    uint32_t next;
    m->st.steps++;
    if (map_get(&m->trans, key, &next)) {
        m->st.step_hits++;
        return next;
    }
    next = advance_by(m, set, true, id);
    if (next != UNKNOWN) map_put(&m->trans, key, next);
    return next;
}

/* The union of two sets (the two readings of one token). */
static uint32_t union_sets(gram_matcher *m, uint32_t a, uint32_t b) {
    begin_set(m);
    for (int i = 0; i < 2; i++) {
        size_t at = m->sets[i ? b : a].off;
        uint32_t n = m->pool[at++];
        for (uint32_t k = 0; k < n; k++) {
            uint32_t len = m->pool[at];
            reserve_u32(&m->work, &m->cap_work, len);
            memcpy(m->work, m->pool + at + 1, len * sizeof *m->work);
            emit_stack(m, 0, len);
            at += 1 + len;
        }
    }
    return m->overflow ? UNKNOWN : finish_set(m);
}

/* ---- UTF-8 ---- */

/* Whether [lo, hi] and the class at code[at] share a code point. */
static bool class_meets(const uint32_t *code, uint32_t at, uint32_t lo, uint32_t hi) {
    uint32_t n = GRAM_NRANGE(code[at]);
    const uint32_t *r = code + at + 1;
    if (GRAM_OP(code[at]) == GOP_CLASS) {
        for (uint32_t i = 0; i < n; i++)
            if (r[2 * i] <= hi && r[2 * i + 1] >= lo) return true;
        return false;
    }
    /* negated: some code point of [lo, hi] is outside every range */
    uint32_t cur = lo;
    for (bool moved = true; moved && cur <= hi;) {
        moved = false;
        for (uint32_t i = 0; i < n; i++) {
            if (r[2 * i] <= cur && r[2 * i + 1] >= cur) {
                if (r[2 * i + 1] >= hi) return false;
                cur = r[2 * i + 1] + 1;
                moved = true;
            }
        }
    }
    return cur <= hi;
}

/* Whether some stack of set can take a valid character that starts with partial p. */
static bool partial_viable(const gram_matcher *m, uint32_t set, uint32_t p) {
    uint32_t lo, hi, lo2, hi2;
    if (!gram_partial_range(p, &lo, &hi, &lo2, &hi2)) return false;
    const uint32_t *code = m->g->code;
    size_t at = m->sets[set].off;
    uint32_t n = m->pool[at++];
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len = m->pool[at];
        uint32_t top = len ? m->pool[at + len] : 0;
        at += 1 + len;
        if (!len || !gram_is_class(code, top)) continue;
        if ((lo <= hi && class_meets(code, top, lo, hi)) ||
            (lo2 <= hi2 && class_meets(code, top, lo2, hi2)))
            return true;
    }
    return false;
}

/* How a set takes code points past ASCII. Most top classes (a string's [^"\\...], digits,
 * literals) treat them all alike, and then so does the set: every such code point leads to
 * one set, or to none, and neither it nor a partial character needs a hash lookup. */
enum { HI_UNKNOWN = 0, HI_SAME, HI_NONE, HI_MIXED };

/* 0: the class at code[at] takes no code point past ASCII, 1: all of them, 2: some. */
static int class_hi(const uint32_t *code, uint32_t at) {
    uint32_t n = GRAM_NRANGE(code[at]);
    const uint32_t *r = code + at + 1;
    bool reaches = false, covers = false;
    for (uint32_t i = 0; i < n; i++) {
        reaches = reaches || r[2 * i + 1] >= 0x80;
        covers = covers || (r[2 * i] <= 0x80 && r[2 * i + 1] >= 0x10FFFF);
    }
    bool pos = GRAM_OP(code[at]) == GOP_CLASS;
    if (!reaches) return pos ? 0 : 1;
    if (covers) return pos ? 1 : 0;
    return 2;
}

static uint8_t set_hi(gram_matcher *m, uint32_t set) {
    if (m->sets[set].hi) return m->sets[set].hi;
    size_t at = m->sets[set].off;
    uint32_t n = m->pool[at++];
    bool some = false, mixed = false;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len = m->pool[at];
        if (len && gram_is_class(m->g->code, m->pool[at + len])) {
            int h = class_hi(m->g->code, m->pool[at + len]);
            some = some || h == 1;
            mixed = mixed || h == 2;
        }
        at += 1 + len;
    }
    return m->sets[set].hi = mixed ? HI_MIXED : some ? HI_SAME : HI_NONE;
}

/* The set after code point cp from set, through the cache. */
static uint32_t step_cp(gram_matcher *m, uint32_t set, uint32_t cp) {
    m->st.steps++;
    uint32_t next;
    if (cp < 128 && (next = m->ascii[(size_t)set * 128 + cp]) != UNKNOWN) {
        m->st.step_hits++;
        return next;
    }
    uint64_t key = (uint64_t)set << 32 | cp;
    uint8_t hi = cp >= 128 ? set_hi(m, set) : HI_UNKNOWN;
    if (hi == HI_NONE || (hi == HI_SAME && m->sets[set].hi_next != UNKNOWN)) {
        m->st.step_hits++;
        return hi == HI_NONE ? DEAD : m->sets[set].hi_next;
    }
    if (hi == HI_MIXED && map_get(&m->trans, key, &next)) {
        m->st.step_hits++;
        return next;
    }
    next = advance_by(m, set, false, cp);
    if (next == UNKNOWN) return UNKNOWN;
    if (hi == HI_SAME) {
        m->sets[set].hi_next = next;
    } else if (cp < 128) {
        m->ascii[(size_t)set * 128 + cp] = next;
    } else {
        map_put(&m->trans, key, next);
    }
    return next;
}

/* Steps (set, partial) by one byte. Returns false when the input is dead there; UNKNOWN in
 * *set means a bound was hit. */
static bool step_byte(gram_matcher *m, uint32_t *set, uint32_t *part, uint8_t b) {
    uint32_t p = *part, cp;
    int r = gram_utf8_step(&p, b, &cp);
    if (r < 0) return false;
    if (r == 1) {
        *part = 0;
        *set = step_cp(m, *set, cp);
        return *set != DEAD && *set != UNKNOWN;
    }
    m->st.steps++;
    uint64_t key = (uint64_t)*set << 32 | 1u << 31 | p;
    uint32_t ok, lo, hi, lo2, hi2;
    uint8_t kind = set_hi(m, *set);
    if (kind != HI_MIXED) {
        m->st.step_hits++;
        ok = kind == HI_SAME && gram_partial_range(p, &lo, &hi, &lo2, &hi2);
    } else if (map_get(&m->trans, key, &ok)) {
        m->st.step_hits++;
    } else {
        ok = partial_viable(m, *set, p);
        map_put(&m->trans, key, ok);
    }
    *part = p;
    return ok;
}

/* ---- the cache's bounds ---- */

static void drop_cache(gram_matcher *m) {
    for (size_t i = 0; i < m->n_mask; i++) free(m->mask[i]);
    m->n_sets = 0;
    m->n_pool = 0;
    m->n_mask = 0;
    if (m->table) memset(m->table, 0, m->cap_table * sizeof *m->table);
    map_free(&m->trans);
    map_free(&m->masks);
    m->gen++;
    m->st.resets++;
    m->st.states = 0;
}

static void bound_cache(gram_matcher *m) {
    size_t mask_bytes = m->n_mask * (size_t)gram_mask_words(m->v) * sizeof(uint32_t);
    if (m->n_sets > MAX_SETS || mask_bytes > MAX_MASK_BYTES || m->trans.n > 8 * (size_t)MAX_SETS)
        drop_cache(m);
}

/* The state's set id in the current cache. */
static uint32_t state_set(gram_state *s) {
    if (s->gen != s->m->gen) {
        s->set = intern(s->m, s->blob, s->n_blob);
        s->gen = s->m->gen;
    }
    return s->set;
}

static void state_take(gram_state *s, uint32_t set, uint32_t part) {
    const gset *g = &s->m->sets[set];
    s->set = set;
    s->partial = part;
    s->gen = s->m->gen;
    s->blob = base_xrealloc(s->blob, g->n_words * sizeof *s->blob);
    memcpy(s->blob, s->m->pool + g->off, g->n_words * sizeof *s->blob);
    s->n_blob = g->n_words;
}

static int fail_bound(base_err *err) {
    return base_fail(err,
                     "grammar: a parse state exceeds %d stacks or a stack %d frames (the "
                     "grammar is too ambiguous or too deeply nested here)",
                     MAX_STACKS, MAX_DEPTH);
}

/* ---- states alike for every token ---- */

/* Fewest code points to finish the alternative from code[at] on. */
static uint64_t rest_len(const gram_grammar *g, uint32_t at) {
    uint64_t n = 0;
    for (; GRAM_OP(g->code[at]) != GOP_END; at += gram_elem_size(g->code, at))
        n += GRAM_OP(g->code[at]) == GOP_REF ? g->rules[g->code[at + 1]].min_len : 1;
    return n;
}

/* Bounded repetitions make every count its own state (a string of maxLength 80 has 80), so
 * without more the mask cache would hit little inside them. But a token of at most L bytes
 * takes at most L repetitions when each takes a code point or more: a link of an x{m,n}
 * chain more than L + 2 links from the end behaves, for any token, as the link L + 2 from the
 * end does. The map sends every offset in such a link to the same offset in that one (the
 * links' code is alike); a state's mask is then cached under the state with its offsets
 * mapped, which is exact. horizon: L + 2. */
static uint32_t *chain_canon(const gram_grammar *g, uint32_t horizon) {
    uint32_t *canon = NULL;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        const gram_rule *rule = &g->rules[r];
        if (rule->chain_start == UINT32_MAX || r - rule->chain_start + 1 <= horizon) continue;
        uint32_t from = g->alts[rule->first_alt];
        uint32_t to = g->alts[g->rules[rule->chain_start + horizon - 1].first_alt];
        uint32_t end =
            r + 1 < g->n_rules ? g->alts[g->rules[r + 1].first_alt] : (uint32_t)g->n_code;
        if (rest_len(g, from) < 1) continue; /* x can match empty: no bound on repetitions */
        if (!canon) {
            canon = base_xmalloc(g->n_code * sizeof *canon);
            for (uint32_t i = 0; i < g->n_code; i++) canon[i] = i;
        }
        for (uint32_t k = 0; k < end - from; k++) canon[from + k] = to + k;
    }
    return canon;
}

/* The set that keys set's mask: its stacks with their offsets mapped by chain_canon. */
static uint32_t mask_key(gram_matcher *m, uint32_t set) {
    if (!m->chain_map) return set;
    if (m->sets[set].key != UNKNOWN) return m->sets[set].key;
    begin_set(m);
    size_t at = m->sets[set].off;
    uint32_t n = m->pool[at++];
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len = m->pool[at];
        reserve_u32(&m->work, &m->cap_work, len);
        for (uint32_t f = 0; f < len; f++) m->work[f] = m->chain_map[m->pool[at + 1 + f]];
        emit_stack(m, 0, len);
        at += 1 + len;
    }
    uint32_t key = m->n_bld_stacks ? finish_set(m) : set;
    m->sets[set].key = key;
    m->sets[key].key = key;
    return key;
}

/* ---- the public API ---- */

gram_matcher *gram_matcher_new(const gram_grammar *g, const gram_vocab *v) {
    gram_matcher *m = base_xcalloc(1, sizeof *m);
    m->g = g;
    m->v = v;
    m->walk_set = base_xmalloc(((size_t)v->max_depth + 1) * sizeof *m->walk_set);
    m->walk_part = base_xmalloc(((size_t)v->max_depth + 1) * sizeof *m->walk_part);
    size_t w = (size_t)v->max_depth + 2;
    m->walk_k = base_xmalloc(w * sizeof *m->walk_k);
    m->run_set = base_xmalloc((w + 1) * sizeof *m->run_set);
    m->run_loop = base_xmalloc(w * sizeof *m->run_loop);
    m->run_hi = base_xmalloc(w * sizeof *m->run_hi);
    m->run_and = base_xmalloc(w * w * sizeof *m->run_and);
    m->run_and_hi = base_xmalloc(w * w * sizeof *m->run_and_hi);
    m->chain_map = chain_canon(g, (uint32_t)v->max_depth + 2);
    return m;
}

void gram_matcher_free(gram_matcher *m) {
    if (!m) return;
    for (size_t i = 0; i < m->n_mask; i++) free(m->mask[i]);
    free(m->mask);
    free(m->ascii);
    free(m->pool);
    free(m->sets);
    free(m->table);
    map_free(&m->trans);
    map_free(&m->masks);
    free(m->work);
    free(m->bld);
    free(m->bld_at);
    free(m->canon);
    free(m->walk_set);
    free(m->walk_part);
    free(m->walk_k);
    free(m->run_set);
    free(m->run_loop);
    free(m->run_hi);
    free(m->run_and);
    free(m->run_and_hi);
    free(m->chain_map);
    free(m);
}

void gram_matcher_stats(const gram_matcher *m, gram_stats *out) {
    *out = m->st;
}

gram_state *gram_state_new(gram_matcher *m) {
    uint32_t set = initial_set(m);
    gram_state *s = base_xcalloc(1, sizeof *s);
    s->m = m;
    if (set == UNKNOWN || set == DEAD) {
        /* a root too ambiguous to start, or one that matches nothing: no input is allowed */
        uint32_t none = 0;
        s->set = intern(m, &none, 1);
        state_take(s, s->set, 0);
        return s;
    }
    state_take(s, set, 0);
    return s;
}

gram_state *gram_state_clone(const gram_state *s) {
    gram_state *c = base_xmalloc(sizeof *c);
    *c = *s;
    c->blob = base_xmalloc(s->n_blob * sizeof *c->blob);
    memcpy(c->blob, s->blob, s->n_blob * sizeof *c->blob);
    return c;
}

void gram_state_free(gram_state *s) {
    if (!s) return;
    free(s->blob);
    free(s);
}

/* Inside free text (a string, a key) the characters of a token move the state along a run
 * that does not depend on which characters they are: U_0 (the start), U_1, ... with every
 * "plain" character leading U_j to U_(j+1) (an unbounded string: U_j all one state; a
 * maxLength chain: one link a character). The run follows the letter 'e'; run_loop[j] holds
 * the ASCII bytes that lead U_j where 'e' does, run_hi[j] whether every character past ASCII
 * does too. Returns the run's length (0: no run), or -1 when a bound was hit. */
static int chain_run(gram_matcher *m, uint32_t set) {
    int n = 0, max = m->v->max_depth + 1;
    m->run_set[0] = set;
    while (n < max) {
        uint32_t u = m->run_set[n], next = step_cp(m, u, 'e');
        if (next == UNKNOWN) return -1;
        if (next == DEAD) break;
        m->run_loop[n][0] = m->run_loop[n][1] = 0;
        for (uint32_t c = 0; c < 128; c++) {
            uint32_t t = step_cp(m, u, c);
            if (t == UNKNOWN) return -1;
            if (t == next) m->run_loop[n][c >> 6] |= 1ull << (c & 63);
        }
        m->run_hi[n] = set_hi(m, u) == HI_SAME && step_cp(m, u, 0x100) == next;
        m->run_set[++n] = next;
        if (next == u) { /* a loop: the rest of the run is this step again */
            for (; n < max; n++) {
                m->run_loop[n][0] = m->run_loop[n - 1][0];
                m->run_loop[n][1] = m->run_loop[n - 1][1];
                m->run_hi[n] = m->run_hi[n - 1];
                m->run_set[n + 1] = next;
            }
        }
    }
    int w = max + 1;
    for (int k = 0; k <= n; k++) {
        uint64_t a0 = ~0ull, a1 = ~0ull;
        bool hi = true;
        for (int len = 0; k + len <= n; len++) {
            m->run_and[k * w + len][0] = a0;
            m->run_and[k * w + len][1] = a1;
            m->run_and_hi[k * w + len] = hi;
            if (k + len < n) {
                a0 &= m->run_loop[k + len][0];
                a1 &= m->run_loop[k + len][1];
                hi = hi && m->run_hi[k + len];
            }
        }
    }
    return n;
}

/* Sets the bits of the tokens that the token terminals on top of set's stacks name. */
static void add_token_terminals(const gram_matcher *m, uint32_t set, uint32_t *mask) {
    const uint32_t *code = m->g->code;
    size_t at = m->sets[set].off;
    uint32_t n = m->pool[at++];
    for (uint32_t k = 0; k < n; k++) {
        uint32_t len = m->pool[at];
        uint32_t top = len ? m->pool[at + len] : 0;
        at += 1 + len;
        if (!len || GRAM_OP(code[top]) != GOP_TOKEN) continue;
        uint32_t id = code[top + 1];
        if (id < (uint32_t)m->v->n_tokens) mask[id / 32] |= 1u << (id % 32);
    }
}

/* Walks the trie from (set, part), setting the bits of the tokens that stay alive. On a node
 * whose state is U_k of the start's run, with no character pending, when every byte below it
 * is plain for the next `reach` steps of the run and its tokens are valid UTF-8, every token
 * below is allowed without walking there: in a string that leaves only the tokens with a
 * quote, a backslash or a control character to walk. */
static int compute_mask(gram_matcher *m, uint32_t set, uint32_t part, uint32_t *mask,
                        base_err *err) {
    const gram_vocab *v = m->v;
    memset(mask, 0, (size_t)gram_mask_words(v) * sizeof *mask);
    int run = part ? 0 : chain_run(m, set), w = v->max_depth + 2;
    if (run < 0) return fail_bound(err);
    m->walk_set[0] = set;
    m->walk_part[0] = part;
    m->walk_k[0] = run > 0 ? 0 : -1;
    uint64_t fast = 0;
    const gram_node *nodes = v->nodes;
    for (uint32_t i = 1; i < v->n_nodes;) {
        const gram_node *x = &nodes[i];
        uint32_t d = x->depth, s = m->walk_set[d - 1], p = m->walk_part[d - 1], next;
        int32_t k = m->walk_k[d - 1];
        uint8_t b = x->byte;
        /* the common case inline: an ASCII byte with no partial character, cached */
        if (!p && b < 0x80 && (next = m->ascii[(size_t)s * 128 + b]) != UNKNOWN) {
            fast++;
            s = next;
        } else if (!step_byte(m, &s, &p, b)) {
            if (s == UNKNOWN) return fail_bound(err);
            i = x->end;
            continue;
        }
        if (s == DEAD) {
            i = x->end;
            continue;
        }
        /* a character completed: one step along the run, if it went where the run goes */
        if (k >= 0 && !p) k = k < run && s == m->run_set[k + 1] ? k + 1 : -1;
        if (k >= 0 && !p && k + x->reach <= run && (x->flags & GRAM_NODE_CLEAN) &&
            (!(x->flags & GRAM_NODE_HI) || m->run_and_hi[k * w + x->reach]) &&
            !(v->below[i][0] & ~m->run_and[k * w + x->reach][0]) &&
            !(v->below[i][1] & ~m->run_and[k * w + x->reach][1])) {
            for (uint32_t t = x->first; t < nodes[x->end].first; t++) {
                int32_t id = v->tok[t];
                mask[id / 32] |= 1u << (id % 32);
            }
            i = x->end;
            continue;
        }
        m->walk_set[d] = s;
        m->walk_part[d] = p;
        m->walk_k[d] = k;
        for (uint32_t t = 0; t < x->count; t++) {
            int32_t id = v->tok[x->first + t];
            mask[id / 32] |= 1u << (id % 32);
        }
        i++;
    }
    m->st.steps += fast;
    m->st.step_hits += fast;
    if (!part) add_token_terminals(m, set, mask);
    return 0;
}

int gram_state_mask(gram_state *s, uint32_t *mask, base_err *err) {
    gram_matcher *m = s->m;
    bound_cache(m);
    uint32_t set = mask_key(m, state_set(s));
    size_t words = (size_t)gram_mask_words(m->v);
    uint64_t key = ((uint64_t)set << 32 | s->partial) + 1;
    uint32_t idx;
    m->st.masks++;
    if (map_get(&m->masks, key, &idx)) {
        m->st.mask_hits++;
        memcpy(mask, m->mask[idx], words * sizeof *mask);
        return 0;
    }
    double t0 = base_now();
    int rc = compute_mask(m, set, s->partial, mask, err);
    m->st.mask_seconds += base_now() - t0;
    if (rc) return rc;
    if (m->n_mask == m->cap_mask) {
        m->cap_mask = m->cap_mask ? 2 * m->cap_mask : 64;
        m->mask = base_xrealloc(m->mask, m->cap_mask * sizeof *m->mask);
    }
    m->mask[m->n_mask] = base_xmalloc(words * sizeof *mask);
    memcpy(m->mask[m->n_mask], mask, words * sizeof *mask);
    map_put(&m->masks, key, (uint32_t)m->n_mask++);
    return 0;
}

int gram_state_accept_bytes(gram_state *s, const char *bytes, size_t len, base_err *err) {
    gram_matcher *m = s->m;
    bound_cache(m);
    uint32_t set = state_set(s), part = s->partial;
    for (size_t i = 0; i < len; i++) {
        if (!step_byte(m, &set, &part, (uint8_t)bytes[i])) {
            if (set == UNKNOWN) return fail_bound(err);
            return base_fail(err, "grammar: input byte %zu (0x%02x) is not allowed here", i,
                             (unsigned char)bytes[i]);
        }
    }
    state_take(s, set, part);
    return 0;
}

int gram_state_accept(gram_state *s, int32_t token, base_err *err) {
    gram_matcher *m = s->m;
    const gram_vocab *v = m->v;
    if (token < 0 || token >= v->n_tokens)
        return base_fail(err, "grammar: token %d is outside the vocabulary (%d)", token,
                         v->n_tokens);
    bound_cache(m);
    uint32_t set = state_set(s), part = s->partial;
    /* by its bytes: the set and pending character they lead to, or DEAD */
    uint32_t by_bytes = v->bytes[token] ? set : DEAD, by_bytes_part = part;
    for (size_t i = 0; by_bytes != DEAD && i < v->lens[token]; i++) {
        if (!step_byte(m, &by_bytes, &by_bytes_part, (uint8_t)v->bytes[token][i])) {
            if (by_bytes == UNKNOWN) return fail_bound(err);
            by_bytes = DEAD;
        }
    }
    /* by the token terminals that name it (a grammar without any skips the lookup) */
    uint32_t by_id = part || !m->g->tokens ? DEAD : step_token(m, set, (uint32_t)token);
    if (by_id == UNKNOWN) return fail_bound(err);
    if (by_bytes == DEAD && by_id == DEAD) {
        if (v->special[token])
            return base_fail(err, "grammar: special token %d (%s) is not allowed here", token,
                             v->special[token]);
        if (!v->bytes[token])
            return base_fail(err, "grammar: token %d (empty) is not allowed here", token);
        return base_fail(err, "grammar: token %d is not allowed here", token);
    }
    if (by_id == DEAD) {
        state_take(s, by_bytes, by_bytes_part);
    } else if (by_bytes == DEAD || by_bytes_part) {
        state_take(s, by_id, 0);
    } else {
        uint32_t both = union_sets(m, by_bytes, by_id);
        if (both == UNKNOWN) return fail_bound(err);
        state_take(s, both, 0);
    }
    return 0;
}

bool gram_state_can_end(const gram_state *s) {
    return !s->partial && s->n_blob > 1 && s->blob[1] == 0;
}

bool gram_state_done(const gram_state *s) {
    return s->blob[0] == 0 || (s->blob[0] == 1 && s->blob[1] == 0);
}

size_t gram_state_min_remaining(const gram_state *s) {
    const gram_grammar *g = s->m->g;
    uint64_t best = UINT64_MAX;
    size_t at = 1;
    for (uint32_t k = 0; k < s->blob[0]; k++) {
        uint32_t len = s->blob[at];
        uint64_t sum = 0;
        for (uint32_t f = 0; f < len; f++) sum += rest_len(g, s->blob[at + 1 + f]);
        if (sum < best) best = sum;
        at += 1 + len;
    }
    return best >= UINT32_MAX ? SIZE_MAX : (size_t)best;
}
