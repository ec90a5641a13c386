/* The paged KV pool and its block allocator. Host-side bookkeeping only: the slabs live in
 * backend memory and are touched here only by copy-on-write copies through be->ops->copy.
 *
 * The pool has one or two groups (kv.h), each a block space of its own. In each group every
 * block is in exactly one state: referenced (refcount > 0), cached (refcount 0, in the
 * prefix cache and on the group's LRU list) or free (refcount 0, on the free list). A global
 * block is in the prefix cache ("published") once it is in the hash table; a local block
 * once it is attached to a published global block (peer). A referenced block may be in the
 * cache too; it joins the LRU list when its last reference goes. Cached blocks are never
 * written, which is what lets the cache trust their contents. */
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1)

struct kv_seq {
    int len;             /* tokens */
    int n_written;       /* tokens whose K/V are known written (kv_seq_commit) */
    int n_pages, cap;    /* pages in use, allocated */
    int32_t *pages;      /* (cap) global block ids; n_pages == ceil(len / block_size) */
    uint64_t *page_key;  /* (cap) prefix key of each full page */
    int local_first;     /* local group: index of the first page kept */
    int32_t *local;      /* (cap) local block ids of pages [local_first, n_pages), or NULL */
    kv_seq *prev, *next; /* the pool's list of live sequences */
};

/* One block space: its allocator state and, per block, its attachment to the other group. */
typedef struct kv_group {
    int64_t capacity;
    int32_t *refcount;  /* (capacity) */
    uint8_t *published; /* (capacity) in the prefix cache */
    int32_t *peer;      /* (capacity) global: the attached local block; local: its global one */
    int32_t *link_prev; /* (capacity) free list (next only) or LRU list neighbours */
    int32_t *link_next; /* (capacity) */
    int32_t free_head;
    int32_t lru_head, lru_tail; /* head = least recently released */
    int64_t n_free, n_cached, n_referenced;
} kv_group;

struct kv_pool {
    be_backend *be;
    kv_geometry geom;    /* layer_local NULL: is_local keeps it */
    bool *is_local;      /* (n_layers) */
    int n_local;         /* local layers */
    be_kv_layer *layers; /* (n_layers) slabs owned; NULL data for a slab-less global group */
    kv_group global, local;

    /* prefix cache, global group */
    uint64_t *key;      /* (capacity) prefix key, when published */
    int32_t *parent;    /* (capacity) previous block of the chain, NONE for the first */
    int32_t *tokens;    /* (capacity, block_size) token ids */
    int32_t *hash_next; /* (capacity) next block of the same bucket */
    int32_t *buckets;   /* (n_buckets) first block of each bucket */
    int64_t n_buckets;  /* power of two */
    uint64_t hash_mask;
    int64_t n_published;

    kv_seq *seqs; /* live sequences */
};

static uint64_t slab_block_bytes(const kv_geometry *g) {
    return (uint64_t)g->block_size * (uint64_t)g->n_kv_heads * (uint64_t)g->head_dim *
           base_dtype_size(g->dtype);
}

/* First block of a sequence that a query at position p (or any later one) can see in a
 * local layer. */
static int local_first_for(const kv_pool *p, int pos) {
    int lo = pos - p->geom.window + 1;
    return lo > 0 ? lo / p->geom.block_size : 0;
}

/* ---- lists ---- */

static void free_push(kv_group *g, int32_t b) {
    g->link_next[b] = g->free_head;
    g->free_head = b;
    g->n_free++;
}

static int32_t free_pop(kv_group *g) {
    int32_t b = g->free_head;
    g->free_head = g->link_next[b];
    g->n_free--;
    return b;
}

static void lru_push_tail(kv_group *g, int32_t b) {
    g->link_prev[b] = g->lru_tail;
    g->link_next[b] = NONE;
    if (g->lru_tail != NONE)
        g->link_next[g->lru_tail] = b;
    else
        g->lru_head = b;
    g->lru_tail = b;
    g->n_cached++;
}

static void lru_remove(kv_group *g, int32_t b) {
    int32_t pr = g->link_prev[b], nx = g->link_next[b];
    if (pr != NONE)
        g->link_next[pr] = nx;
    else
        g->lru_head = nx;
    if (nx != NONE)
        g->link_prev[nx] = pr;
    else
        g->lru_tail = pr;
    g->n_cached--;
}

/* ---- prefix cache ---- */

static int64_t bucket_of(const kv_pool *p, uint64_t key) {
    return (int64_t)(key & (uint64_t)(p->n_buckets - 1));
}

static uint64_t chain_key(const kv_pool *p, uint64_t parent_key, const int32_t *tokens) {
    uint64_t k = base_hash64(parent_key, tokens, (size_t)p->geom.block_size * sizeof(int32_t));
    return k & p->hash_mask;
}

static void publish(kv_pool *p, int32_t b, uint64_t key, int32_t parent) {
    p->global.published[b] = 1;
    p->key[b] = key;
    p->parent[b] = parent;
    int64_t h = bucket_of(p, key);
    p->hash_next[b] = p->buckets[h];
    p->buckets[h] = b;
    p->n_published++;
}

/* Detaches local block lb from its global block. */
static void detach(kv_pool *p, int32_t lb) {
    p->global.peer[p->local.peer[lb]] = NONE;
    p->local.peer[lb] = NONE;
    p->local.published[lb] = 0;
}

/* Takes global block b out of the cache; its attached local block goes with it. That block
 * is cached (whoever holds a local block holds its global one, and b is unreferenced here)
 * and moves to the free list. */
static void unpublish(kv_pool *p, int32_t b) {
    int32_t *at = &p->buckets[bucket_of(p, p->key[b])];
    while (*at != b) at = &p->hash_next[*at];
    *at = p->hash_next[b];
    p->global.published[b] = 0;
    p->n_published--;
    int32_t lb = p->global.peer[b];
    if (lb == NONE) return;
    detach(p, lb);
    if (p->local.refcount[lb] == 0) {
        lru_remove(&p->local, lb);
        free_push(&p->local, lb);
    }
}

/* A published block whose parent and tokens are exactly these, or NONE. Matching the parent
 * block (not only its key) makes a chain exact by induction from the root. A parent is never
 * evicted before its children: a sequence holds a prefix of a chain and releases its pages
 * last first, so a child always sits nearer the LRU head than its parent (kv_pool_check
 * verifies it). */
static int32_t lookup(const kv_pool *p, uint64_t key, int32_t parent, const int32_t *tokens) {
    size_t bytes = (size_t)p->geom.block_size * sizeof(int32_t);
    for (int32_t b = p->buckets[bucket_of(p, key)]; b != NONE; b = p->hash_next[b]) {
        if (p->key[b] != key || p->parent[b] != parent) continue;
        if (memcmp(p->tokens + (size_t)b * p->geom.block_size, tokens, bytes) == 0) return b;
    }
    return NONE;
}

/* ---- block references ---- */

/* A block for writing: from the free list, else the least recently released cached block. The
 * caller has checked that one exists. */
static int32_t block_take(kv_pool *p, kv_group *g) {
    int32_t b;
    if (g->free_head != NONE) {
        b = free_pop(g);
    } else {
        b = g->lru_head;
        lru_remove(g, b);
        if (g == &p->global)
            unpublish(p, b);
        else
            detach(p, b);
    }
    g->refcount[b] = 1;
    g->n_referenced++;
    return b;
}

static void block_ref(kv_group *g, int32_t b) {
    if (g->refcount[b]++ > 0) return;
    lru_remove(g, b); /* only cached blocks have no references */
    g->n_referenced++;
}

static void block_unref(kv_group *g, int32_t b) {
    if (--g->refcount[b] > 0) return;
    g->n_referenced--;
    if (g->published[b])
        lru_push_tail(g, b);
    else
        free_push(g, b);
}

/* ---- pool ---- */

int kv_geometry_local_layers(const kv_geometry *g) {
    int n = 0;
    for (int l = 0; g->window > 0 && g->layer_local && l < g->n_layers; l++) n += g->layer_local[l];
    return n;
}

int64_t kv_local_blocks_per_step(const kv_geometry *g, int q_len) {
    if (g->window <= 0 || g->block_size <= 0 || q_len <= 0) return 0;
    /* the step's tokens and the window - 1 before its first; the span's start may sit
     * anywhere in its block */
    int64_t span = (int64_t)g->window - 1 + q_len;
    return (span + g->block_size - 1) / g->block_size + 1;
}

static int geometry_check(const be_backend *be, const kv_geometry *g, int64_t num_blocks,
                          int64_t num_local, base_err *err) {
    if (g->n_layers <= 0 || g->n_kv_heads <= 0 || g->head_dim <= 0 || g->block_size <= 0)
        return base_fail(err,
                         "kv pool: geometry n_layers %d, n_kv_heads %d, head_dim %d, block_size "
                         "%d must all be positive",
                         g->n_layers, g->n_kv_heads, g->head_dim, g->block_size);
    bool cpu = be->name && strcmp(be->name, "cpu") == 0;
    if (g->dtype != BASE_DTYPE_F16 && g->dtype != BASE_DTYPE_BF16 &&
        !(cpu && g->dtype == BASE_DTYPE_F32))
        return base_fail(err, "kv pool: dtype %s is not F16 or BF16 (F32 on the CPU only)",
                         base_dtype_name(g->dtype));
    if (g->window < 0) return base_fail(err, "kv pool: window %d is negative", g->window);
    int n_local = kv_geometry_local_layers(g);
    if ((g->window > 0) != (n_local > 0))
        return base_fail(err, "kv pool: window %d with %d local layers (both or neither)",
                         g->window, n_local);
    if (num_blocks < 1 || num_blocks > INT32_MAX)
        return base_fail(err, "kv pool: num_blocks %lld outside 1..%d", (long long)num_blocks,
                         INT32_MAX);
    if (n_local == 0 && num_local != 0)
        return base_fail(err, "kv pool: %lld local blocks but no local layers",
                         (long long)num_local);
    if (n_local > 0 && (num_local < 1 || num_local > INT32_MAX))
        return base_fail(err, "kv pool: num_local_blocks %lld outside 1..%d", (long long)num_local,
                         INT32_MAX);
    uint64_t bytes;
    int64_t most = num_blocks > num_local ? num_blocks : num_local;
    if (!base_mul_ok_u64(slab_block_bytes(g), (uint64_t)most, &bytes) || bytes > SIZE_MAX)
        return base_fail(err, "kv pool: %lld blocks overflow the address space", (long long)most);
    return 0;
}

static void group_init(kv_group *g, int64_t capacity) {
    size_t n = (size_t)capacity;
    g->capacity = capacity;
    g->refcount = base_xcalloc(n ? n : 1, sizeof *g->refcount);
    g->published = base_xcalloc(n ? n : 1, sizeof *g->published);
    g->peer = base_xmalloc((n ? n : 1) * sizeof *g->peer);
    g->link_prev = base_xcalloc(n ? n : 1, sizeof *g->link_prev);
    g->link_next = base_xcalloc(n ? n : 1, sizeof *g->link_next);
    g->free_head = NONE;
    g->lru_head = g->lru_tail = NONE;
    /* pushed in reverse so that blocks come out in ascending order */
    for (int64_t b = capacity - 1; b >= 0; b--) {
        g->peer[b] = NONE;
        free_push(g, (int32_t)b);
    }
}

static void group_free(kv_group *g) {
    free(g->refcount);
    free(g->published);
    free(g->peer);
    free(g->link_prev);
    free(g->link_next);
}

int kv_pool_create(be_backend *be, const kv_geometry *geom, int64_t num_blocks,
                   int64_t num_local_blocks, kv_pool **out, base_err *err) {
    *out = NULL;
    if (geometry_check(be, geom, num_blocks, num_local_blocks, err)) return -1;
    kv_pool *p = base_xcalloc(1, sizeof *p);
    p->be = be;
    p->geom = *geom;
    p->geom.layer_local = NULL;
    p->n_local = kv_geometry_local_layers(geom);
    p->is_local = base_xcalloc((size_t)geom->n_layers, sizeof *p->is_local);
    for (int l = 0; p->n_local && l < geom->n_layers; l++) p->is_local[l] = geom->layer_local[l];
    p->hash_mask = UINT64_MAX;
    group_init(&p->global, num_blocks);
    group_init(&p->local, p->n_local ? num_local_blocks : 0);
    size_t n = (size_t)num_blocks;
    p->key = base_xcalloc(n, sizeof *p->key);
    p->parent = base_xcalloc(n, sizeof *p->parent);
    p->tokens = base_xcalloc(n * (size_t)geom->block_size, sizeof *p->tokens);
    p->hash_next = base_xcalloc(n, sizeof *p->hash_next);
    p->n_buckets = 1;
    while (p->n_buckets < num_blocks) p->n_buckets *= 2;
    p->buckets = base_xmalloc((size_t)p->n_buckets * sizeof *p->buckets);
    for (int64_t i = 0; i < p->n_buckets; i++) p->buckets[i] = NONE;

    p->layers = base_xcalloc((size_t)geom->n_layers, sizeof *p->layers);
    for (int l = 0; l < geom->n_layers; l++) {
        int64_t blocks = p->is_local[l] ? p->local.capacity : p->global.capacity;
        size_t slab = (size_t)(slab_block_bytes(geom) * (uint64_t)blocks);
        be_kv_layer *L = &p->layers[l];
        *L = (be_kv_layer){.dtype = geom->dtype,
                           .num_blocks = blocks,
                           .block_size = geom->block_size,
                           .n_kv_heads = geom->n_kv_heads,
                           .head_dim = geom->head_dim};
        if (be->ops->alloc(be, slab, &L->k, err) || be->ops->alloc(be, slab, &L->v, err)) {
            base_fail_wrap(err, "kv pool: layer %d slab of %zu bytes", l, slab);
            kv_pool_destroy(p);
            return -1;
        }
    }
    *out = p;
    return 0;
}

void kv_pool_destroy(kv_pool *p) {
    if (!p) return;
    while (p->seqs) kv_seq_free(p, p->seqs);
    for (int l = 0; p->layers && l < p->geom.n_layers; l++) {
        if (p->layers[l].k) p->be->ops->free(p->be, p->layers[l].k);
        if (p->layers[l].v) p->be->ops->free(p->be, p->layers[l].v);
    }
    free(p->layers);
    free(p->is_local);
    group_free(&p->global);
    group_free(&p->local);
    free(p->key);
    free(p->parent);
    free(p->tokens);
    free(p->hash_next);
    free(p->buckets);
    free(p);
}

const kv_geometry *kv_pool_geometry(const kv_pool *pool) {
    return &pool->geom;
}

const be_kv_layer *kv_pool_layer(const kv_pool *pool, int layer) {
    return &pool->layers[layer];
}

bool kv_pool_layer_local(const kv_pool *pool, int layer) {
    return pool->is_local[layer];
}

bool kv_pool_has_local(const kv_pool *pool) {
    return pool->n_local > 0;
}

int64_t kv_pool_drop_cached(kv_pool *p) {
    int64_t n = p->global.n_cached;
    while (p->global.lru_head != NONE) {
        int32_t b = p->global.lru_head;
        lru_remove(&p->global, b);
        unpublish(p, b); /* may move an attached local block to the free list */
        free_push(&p->global, b);
    }
    while (p->local.lru_head != NONE) {
        int32_t b = p->local.lru_head;
        lru_remove(&p->local, b);
        detach(p, b);
        free_push(&p->local, b);
    }
    return n;
}

void kv_pool_set_hash_mask(kv_pool *pool, uint64_t mask) {
    pool->hash_mask = mask;
}

static kv_pool_stats group_stats(const kv_group *g) {
    return (kv_pool_stats){g->capacity, g->n_free, g->n_cached, g->n_referenced};
}

kv_pool_stats kv_pool_get_stats(const kv_pool *p) {
    return group_stats(&p->global);
}

kv_pool_stats kv_pool_get_local_stats(const kv_pool *p) {
    return group_stats(&p->local);
}

/* Walks a list of at most capacity blocks, marking each in seen; -1 on a cycle, a repeat or a
 * block in the wrong state. */
static int check_list(const kv_group *g, const char *group, int32_t head, bool cached,
                      uint8_t *seen, int64_t *count, base_err *err) {
    const char *name = cached ? "LRU list" : "free list";
    *count = 0;
    int32_t prev = NONE;
    for (int32_t b = head; b != NONE; b = g->link_next[b]) {
        if (b < 0 || b >= g->capacity || seen[b])
            return base_fail(err, "kv pool: %s %s reaches block %d twice or out of range", group,
                             name, b);
        seen[b] = 1;
        if (g->refcount[b] != 0 || (bool)g->published[b] != cached)
            return base_fail(err, "kv pool: %s block %d on the %s has refcount %d, published %d",
                             group, b, name, g->refcount[b], g->published[b]);
        if (cached && g->link_prev[b] != prev)
            return base_fail(err, "kv pool: %s LRU list back link broken at block %d", group, b);
        prev = b;
        (*count)++;
    }
    if (cached && g->lru_tail != prev)
        return base_fail(err, "kv pool: %s LRU tail is wrong", group);
    return 0;
}

/* Counts the holders of each block of both groups; checks each sequence's page lists. */
static int check_seqs(const kv_pool *p, int32_t *refs, int32_t *local_refs, base_err *err) {
    int bs = p->geom.block_size;
    for (const kv_seq *s = p->seqs; s; s = s->next) {
        if (s->n_pages != (s->len + bs - 1) / bs || s->n_written > s->len || s->n_written < 0)
            return base_fail(err, "kv pool: sequence of %d tokens has %d pages, %d written", s->len,
                             s->n_pages, s->n_written);
        for (int i = 0; i < s->n_pages; i++) {
            if (s->pages[i] < 0 || s->pages[i] >= p->global.capacity)
                return base_fail(err, "kv pool: page %d is block %d, outside the pool", i,
                                 s->pages[i]);
            refs[s->pages[i]]++;
        }
        if (!p->n_local) continue;
        /* the window of the next token must be held: nothing needed is released */
        if (s->local_first < 0 || s->local_first > local_first_for(p, s->len) ||
            s->local_first > s->n_pages)
            return base_fail(err,
                             "kv pool: sequence of %d tokens keeps local pages from %d, its "
                             "window needs them from %d",
                             s->len, s->local_first, local_first_for(p, s->len));
        for (int i = s->local_first; i < s->n_pages; i++) {
            int32_t lb = s->local[i];
            if (lb < 0 || lb >= p->local.capacity)
                return base_fail(err, "kv pool: local page %d is block %d, outside the pool", i,
                                 lb);
            if (p->local.peer[lb] != NONE && p->local.peer[lb] != s->pages[i])
                return base_fail(err,
                                 "kv pool: local page %d (block %d) is attached to global block "
                                 "%d, the sequence holds %d there",
                                 i, lb, p->local.peer[lb], s->pages[i]);
            local_refs[lb]++;
        }
    }
    return 0;
}

/* One group's lists and counters against the holders counted. */
static int check_group(const kv_group *g, const char *group, const int32_t *refs, base_err *err) {
    size_t n = (size_t)g->capacity;
    uint8_t *seen = base_xcalloc(n ? n : 1, 1);
    int64_t n_free = 0, n_cached = 0, n_ref = 0;
    int rc = check_list(g, group, g->free_head, false, seen, &n_free, err);
    if (!rc) rc = check_list(g, group, g->lru_head, true, seen, &n_cached, err);
    for (int64_t b = 0; !rc && b < g->capacity; b++) {
        if (refs[b] != g->refcount[b])
            rc = base_fail(err, "kv pool: %s block %lld has refcount %d but %d holders", group,
                           (long long)b, g->refcount[b], refs[b]);
        else if ((g->refcount[b] > 0) == (bool)seen[b])
            rc = base_fail(err, "kv pool: %s block %lld (refcount %d) is %s a list", group,
                           (long long)b, g->refcount[b], seen[b] ? "on" : "on no");
        n_ref += g->refcount[b] > 0;
    }
    if (!rc && (n_free != g->n_free || n_cached != g->n_cached || n_ref != g->n_referenced))
        rc = base_fail(err,
                       "kv pool: %s counters free %lld cached %lld referenced %lld, recount %lld "
                       "%lld %lld",
                       group, (long long)g->n_free, (long long)g->n_cached,
                       (long long)g->n_referenced, (long long)n_free, (long long)n_cached,
                       (long long)n_ref);
    if (!rc && n_free + n_cached + n_ref != g->capacity)
        rc = base_fail(
            err, "kv pool: %s referenced %lld + cached %lld + free %lld != capacity %lld", group,
            (long long)n_ref, (long long)n_cached, (long long)n_free, (long long)g->capacity);
    free(seen);
    return rc;
}

/* The prefix cache's hash table, and the attachments: each attached local block and its
 * published global block name each other, and a cached local block is attached. */
static int check_cache(const kv_pool *p, base_err *err) {
    int64_t n_pub = 0, n_hashed = 0;
    for (int64_t b = 0; b < p->global.capacity; b++) {
        n_pub += p->global.published[b];
        int32_t lb = p->global.peer[b];
        if (lb == NONE) continue;
        if (!p->global.published[b] || lb < 0 || lb >= p->local.capacity ||
            p->local.peer[lb] != b || !p->local.published[lb])
            return base_fail(err,
                             "kv pool: global block %lld names local block %d, which does not "
                             "name it back (or it is not cached)",
                             (long long)b, lb);
    }
    for (int64_t b = 0; b < p->local.capacity; b++) {
        int32_t gb = p->local.peer[b];
        if ((gb != NONE) != (bool)p->local.published[b] ||
            (gb != NONE && (gb < 0 || gb >= p->global.capacity || p->global.peer[gb] != b)))
            return base_fail(err, "kv pool: local block %lld's attachment to %d is broken",
                             (long long)b, gb);
    }
    for (int64_t h = 0; h < p->n_buckets; h++) {
        for (int32_t b = p->buckets[h]; b != NONE && n_hashed <= p->global.capacity;
             b = p->hash_next[b]) {
            if (!p->global.published[b] || bucket_of(p, p->key[b]) != h)
                return base_fail(err, "kv pool: block %d is in the wrong hash bucket", b);
            if (p->parent[b] != NONE && !p->global.published[p->parent[b]])
                return base_fail(err, "kv pool: cached block %d outlived its parent %d", b,
                                 p->parent[b]);
            n_hashed++;
        }
    }
    if (n_hashed != n_pub || n_pub != p->n_published)
        return base_fail(err,
                         "kv pool: %lld published blocks, %lld in the hash table, %lld counted",
                         (long long)n_pub, (long long)n_hashed, (long long)p->n_published);
    return 0;
}

int kv_pool_check(const kv_pool *p, base_err *err) {
    int32_t *refs = base_xcalloc((size_t)p->global.capacity, sizeof *refs);
    int32_t *local_refs =
        base_xcalloc(p->local.capacity ? (size_t)p->local.capacity : 1, sizeof *local_refs);
    int rc = check_seqs(p, refs, local_refs, err);
    if (!rc) rc = check_group(&p->global, "global", refs, err);
    if (!rc) rc = check_group(&p->local, "local", local_refs, err);
    if (!rc) rc = check_cache(p, err);
    free(refs);
    free(local_refs);
    return rc;
}

/* ---- sequences ---- */

static void seq_reserve(const kv_pool *pool, kv_seq *s, int pages) {
    if (pages <= s->cap) return;
    int cap = s->cap ? s->cap : 4;
    while (cap < pages) cap *= 2;
    s->pages = base_xrealloc(s->pages, (size_t)cap * sizeof *s->pages);
    s->page_key = base_xrealloc(s->page_key, (size_t)cap * sizeof *s->page_key);
    if (pool->n_local) s->local = base_xrealloc(s->local, (size_t)cap * sizeof *s->local);
    s->cap = cap;
}

kv_seq *kv_seq_create(kv_pool *pool) {
    kv_seq *s = base_xcalloc(1, sizeof *s);
    s->next = pool->seqs;
    if (pool->seqs) pool->seqs->prev = s;
    pool->seqs = s;
    return s;
}

/* Releases the pages past new_len tokens in both groups. */
static void release_from(kv_pool *pool, kv_seq *seq, int new_len) {
    int bs = pool->geom.block_size;
    int keep = (new_len + bs - 1) / bs;
    while (seq->n_pages > keep) {
        int i = --seq->n_pages;
        block_unref(&pool->global, seq->pages[i]);
        if (pool->n_local && i >= seq->local_first) block_unref(&pool->local, seq->local[i]);
    }
    if (seq->local_first > seq->n_pages) seq->local_first = seq->n_pages;
    seq->len = new_len;
    if (seq->n_written > new_len) seq->n_written = new_len;
}

void kv_seq_free(kv_pool *pool, kv_seq *seq) {
    if (!seq) return;
    release_from(pool, seq, 0);
    seq->local_first = 0;
    if (seq->prev)
        seq->prev->next = seq->next;
    else
        pool->seqs = seq->next;
    if (seq->next) seq->next->prev = seq->prev;
    free(seq->pages);
    free(seq->page_key);
    free(seq->local);
    free(seq);
}

int kv_seq_len(const kv_seq *seq) {
    return seq->len;
}

void kv_seq_commit(kv_pool *pool, kv_seq *seq) {
    seq->n_written = seq->len;
    int full = seq->len / pool->geom.block_size;
    for (int i = 0; i < full; i++) {
        int32_t b = seq->pages[i];
        if (!pool->global.published[b])
            publish(pool, b, seq->page_key[i], i ? seq->pages[i - 1] : NONE);
        if (!pool->n_local || i < seq->local_first) continue;
        int32_t lb = seq->local[i];
        /* a block's first writer attaches its local copy; the holders of a global block
         * that already has one share that one (adoption and forks take it) */
        if (pool->global.peer[b] == NONE && pool->local.peer[lb] == NONE) {
            pool->global.peer[b] = lb;
            pool->local.peer[lb] = b;
            pool->local.published[lb] = 1;
        }
    }
}

/* Whether the local blocks a query at position k * block_size needs are attached to the
 * chain's first k blocks. */
static bool local_window_cached(const kv_pool *pool, const int32_t *chain, int k) {
    for (int i = local_first_for(pool, k * pool->geom.block_size); i < k; i++)
        if (pool->global.peer[chain[i]] == NONE) return false;
    return true;
}

int kv_seq_adopt_prefix(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n) {
    if (seq->len != 0 || n <= 1) return 0;
    int bs = pool->geom.block_size;
    int max_blocks = (n - 1) / bs;
    seq_reserve(pool, seq, max_blocks);
    uint64_t key = BASE_HASH_SEED;
    int32_t parent = NONE;
    int found = 0;
    for (int i = 0; i < max_blocks; i++) {
        const int32_t *blk = tokens + (size_t)i * bs;
        key = chain_key(pool, key, blk);
        int32_t b = lookup(pool, key, parent, blk);
        if (b == NONE) break;
        seq->pages[i] = b;
        seq->page_key[i] = key;
        found = i + 1;
        parent = b;
    }
    int k = found;
    while (pool->n_local && k > 0 && !local_window_cached(pool, seq->pages, k)) k--;
    for (int i = 0; i < k; i++) block_ref(&pool->global, seq->pages[i]);
    seq->local_first = pool->n_local ? local_first_for(pool, k * bs) : 0;
    for (int i = seq->local_first; pool->n_local && i < k; i++) {
        seq->local[i] = pool->global.peer[seq->pages[i]];
        block_ref(&pool->local, seq->local[i]);
    }
    seq->n_pages = k;
    seq->len = seq->n_written = k * bs;
    return seq->len;
}

/* Copies the first `slots` slots of block src to dst in every layer of the group, K and V
 * (and, global, their token ids). */
static int copy_block(kv_pool *p, bool local, int32_t dst, int32_t src, int slots, base_err *err) {
    const kv_geometry *g = &p->geom;
    size_t es = base_dtype_size(g->dtype);
    size_t bytes = (size_t)((uint64_t)g->n_kv_heads * g->head_dim * es * (uint64_t)slots);
    uint64_t so = kv_elem_offset(src, 0, 0, g->block_size, g->n_kv_heads, g->head_dim);
    uint64_t d0 = kv_elem_offset(dst, 0, 0, g->block_size, g->n_kv_heads, g->head_dim);
    for (int l = 0; l < g->n_layers; l++) {
        if (p->is_local[l] != local) continue;
        const be_kv_layer *L = &p->layers[l];
        if (p->be->ops->copy(p->be, (char *)L->k + d0 * es, (const char *)L->k + so * es, bytes,
                             err) ||
            p->be->ops->copy(p->be, (char *)L->v + d0 * es, (const char *)L->v + so * es, bytes,
                             err))
            return base_fail_wrap(err, "kv pool: copy-on-write of block %d, layer %d", src, l);
    }
    if (!local)
        memcpy(p->tokens + (size_t)dst * g->block_size, p->tokens + (size_t)src * g->block_size,
               (size_t)slots * sizeof(int32_t));
    return 0;
}

/* Replaces the shared or cached block in *slot (a sequence's last page in one group) with a
 * private copy of its first `used` slots. */
static int copy_on_write(kv_pool *p, bool local, int32_t *slot, int used, base_err *err) {
    kv_group *g = local ? &p->local : &p->global;
    int32_t fresh = block_take(p, g);
    if (copy_block(p, local, fresh, *slot, used, err)) {
        block_unref(g, fresh);
        return -1;
    }
    block_unref(g, *slot);
    *slot = fresh;
    return 0;
}

int kv_seq_append(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n, base_err *err) {
    if (n <= 0) return 0;
    if (!tokens) return base_fail(err, "kv_seq_append: tokens is NULL");
    int bs = pool->geom.block_size;
    if (n > INT32_MAX - seq->len)
        return base_fail(err, "kv_seq_append: %d + %d tokens overflow a sequence", seq->len, n);
    int used = seq->len % bs;
    int last = seq->n_pages - 1;
    kv_group *G = &pool->global, *Lg = &pool->local;
    bool cow = used > 0 && (G->refcount[seq->pages[last]] > 1 || G->published[seq->pages[last]]);
    int new_pages = (int)(((int64_t)seq->len + n + bs - 1) / bs) - seq->n_pages;
    int64_t need = new_pages + (cow ? 1 : 0);
    int64_t have = G->n_free + G->n_cached;
    if (need > have)
        return base_fail(err, "kv cache full: %lld blocks needed, %lld free or evictable",
                         (long long)need, (long long)have);
    /* local: the pages before the first new token's window go back first, and count */
    int drop_to = pool->n_local ? local_first_for(pool, seq->len) : 0;
    bool lcow = false;
    if (pool->n_local) {
        /* used > 0 keeps the last page: drop_to <= len / bs == last */
        lcow = used > 0 && (Lg->refcount[seq->local[last]] > 1 || Lg->published[seq->local[last]]);
        int64_t lneed = new_pages + (lcow ? 1 : 0), lhave = Lg->n_free + Lg->n_cached;
        for (int i = seq->local_first; i < drop_to; i++) lhave += Lg->refcount[seq->local[i]] == 1;
        if (lneed > lhave)
            return base_fail(err,
                             "kv cache full: %lld local-layer blocks needed, %lld free or "
                             "evictable",
                             (long long)lneed, (long long)lhave);
    }
    seq_reserve(pool, seq, seq->n_pages + new_pages);
    if (cow && copy_on_write(pool, false, &seq->pages[last], used, err)) return -1;
    for (; pool->n_local && seq->local_first < drop_to; seq->local_first++)
        block_unref(Lg, seq->local[seq->local_first]);
    if (lcow && copy_on_write(pool, true, &seq->local[last], used, err)) return -1;
    for (int i = 0; i < new_pages; i++) {
        seq->pages[seq->n_pages] = block_take(pool, G);
        if (pool->n_local) seq->local[seq->n_pages] = block_take(pool, Lg);
        seq->n_pages++;
    }
    for (int i = 0; i < n; i++) {
        int pos = seq->len + i;
        int page = pos / bs;
        pool->tokens[(size_t)seq->pages[page] * bs + pos % bs] = tokens[i];
        if (pos % bs == bs - 1) {
            uint64_t parent_key = page ? seq->page_key[page - 1] : BASE_HASH_SEED;
            seq->page_key[page] =
                chain_key(pool, parent_key, pool->tokens + (size_t)seq->pages[page] * bs);
        }
    }
    seq->len += n;
    return 0;
}

int kv_seq_truncate(kv_pool *pool, kv_seq *seq, int new_len, base_err *err) {
    if (new_len < 0) return base_fail(err, "kv_seq_truncate: length %d is negative", new_len);
    if (new_len >= seq->len) return 0;
    if (pool->n_local && new_len > 0 && local_first_for(pool, new_len) < seq->local_first)
        return base_fail(err,
                         "kv_seq_truncate: the local layers released the tokens before %d, which "
                         "the window of token %d needs (truncate to %d or more)",
                         seq->local_first * pool->geom.block_size, new_len,
                         seq->local_first * pool->geom.block_size + pool->geom.window - 1);
    release_from(pool, seq, new_len);
    if (new_len == 0) seq->local_first = 0;
    return 0;
}

kv_seq *kv_seq_fork(kv_pool *pool, const kv_seq *seq) {
    kv_seq *f = kv_seq_create(pool);
    seq_reserve(pool, f, seq->n_pages);
    for (int i = 0; i < seq->n_pages; i++) {
        f->pages[i] = seq->pages[i];
        f->page_key[i] = seq->page_key[i];
        block_ref(&pool->global, seq->pages[i]);
    }
    for (int i = seq->local_first; pool->n_local && i < seq->n_pages; i++) {
        f->local[i] = seq->local[i];
        block_ref(&pool->local, seq->local[i]);
    }
    f->local_first = seq->local_first;
    f->n_pages = seq->n_pages;
    f->len = seq->len;
    f->n_written = seq->n_written;
    return f;
}

/* ---- batches ---- */

/* One group's arrays of a batch, filled by fill_view. */
typedef struct view_arrays {
    int32_t *page_indptr, *kv_len, *last_page_len, *page_indices;
    int64_t *slots;
} view_arrays;

/* Fills one group's view: its pages from `first` (a function of the sequence) on. */
static void fill_view(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                      bool local, const view_arrays *a, be_paged_batch *v) {
    int bs = pool->geom.block_size;
    a->page_indptr[0] = 0;
    int t = 0, max_kv_len = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kv_seq *sq = seqs[s];
        int first = local ? sq->local_first : 0;
        const int32_t *pages = local ? sq->local : sq->pages;
        int n_pages = sq->n_pages - first;
        a->page_indptr[s + 1] = a->page_indptr[s] + n_pages;
        if (n_pages > 0)
            memcpy(a->page_indices + a->page_indptr[s], pages + first,
                   (size_t)n_pages * sizeof(int32_t));
        a->kv_len[s] = sq->len - first * bs;
        a->last_page_len[s] = sq->n_pages ? sq->len - (sq->n_pages - 1) * bs : 0;
        if (a->kv_len[s] > max_kv_len) max_kv_len = a->kv_len[s];
        for (int i = 0; i < q_lens[s]; i++, t++) {
            int pos = sq->len - q_lens[s] + i;
            a->slots[t] = (int64_t)pages[pos / bs] * bs + pos % bs;
        }
    }
    v->max_kv_len = max_kv_len;
    v->page_indptr = a->page_indptr;
    v->kv_len = a->kv_len;
    v->last_page_len = a->last_page_len;
    v->page_indices = a->page_indices;
    v->slots = a->slots;
    /* a view's pages start at their first slot; NULL tells the attention kernels so, which
     * lets a plan for exactly the batch's pages serve it */
    v->first_page_offset = NULL;
}

int kv_batch_build(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                   kv_batch *out, base_err *err) {
    memset(out, 0, sizeof *out);
    int64_t n_tokens = 0, n_pages = 0, n_local_pages = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (q_lens[s] < 0 || q_lens[s] > seqs[s]->len)
            return base_fail(err, "kv batch: sequence %d computes %d of its %d tokens", s,
                             q_lens[s], seqs[s]->len);
        if (pool->n_local && q_lens[s] > 0 &&
            local_first_for(pool, seqs[s]->len - q_lens[s]) < seqs[s]->local_first)
            return base_fail(err,
                             "kv batch: sequence %d computes its last %d tokens, but its local "
                             "layers released the window of the first (append them in this "
                             "step)",
                             s, q_lens[s]);
        n_tokens += q_lens[s];
        n_pages += seqs[s]->n_pages;
        if (pool->n_local) n_local_pages += seqs[s]->n_pages - seqs[s]->local_first;
    }
    if (n_tokens > INT32_MAX || n_pages > INT32_MAX)
        return base_fail(err, "kv batch: %lld tokens, %lld pages exceed int32", (long long)n_tokens,
                         (long long)n_pages);
    size_t n = (size_t)n_seqs, nt = (size_t)n_tokens;
    int views = pool->n_local ? 2 : 1;
    size_t i32 = (n + 1) + nt + views * ((n + 1) + 2 * n) + (size_t)n_pages + (size_t)n_local_pages;
    /* the int64 slots go first so that they are aligned */
    char *mem = base_xmalloc((size_t)views * nt * sizeof(int64_t) + i32 * sizeof(int32_t) + 1);
    view_arrays g, l;
    g.slots = (int64_t *)mem;
    l.slots = g.slots + nt;
    int32_t *q_indptr = (int32_t *)(g.slots + (size_t)views * nt);
    int32_t *positions = q_indptr + n + 1;
    int32_t *next = positions + nt;
    view_arrays *arrays[2] = {&g, &l};
    for (int v = 0; v < views; v++) {
        view_arrays *a = arrays[v];
        a->page_indptr = next;
        a->kv_len = a->page_indptr + n + 1;
        a->last_page_len = a->kv_len + n;
        next = a->last_page_len + n;
    }
    g.page_indices = next;
    l.page_indices = next + n_pages;
    q_indptr[0] = 0;
    int t = 0, max_q_len = 0;
    for (int s = 0; s < n_seqs; s++) {
        q_indptr[s + 1] = q_indptr[s] + q_lens[s];
        if (q_lens[s] > max_q_len) max_q_len = q_lens[s];
        for (int i = 0; i < q_lens[s]; i++) positions[t++] = seqs[s]->len - q_lens[s] + i;
    }
    be_paged_batch common = {.n_seqs = n_seqs,
                             .n_tokens = (int)n_tokens,
                             .max_q_len = max_q_len,
                             .q_indptr = q_indptr,
                             .positions = positions};
    out->view = common;
    fill_view(pool, seqs, q_lens, n_seqs, false, &g, &out->view);
    if (pool->n_local) {
        out->local = common;
        fill_view(pool, seqs, q_lens, n_seqs, true, &l, &out->local);
    }
    out->storage = mem;
    return 0;
}

void kv_batch_free(kv_batch *batch) {
    free(batch->storage);
    memset(batch, 0, sizeof *batch);
}
