/* The paged KV pool and its block allocator. Host-side bookkeeping only: the slabs live in
 * backend memory and are touched here only by copy-on-write copies through be->ops->copy.
 *
 * Each block is in exactly one state: referenced (refcount > 0), cached (refcount 0, in the
 * prefix cache and on the LRU list) or free (refcount 0, on the free list). A referenced
 * block may also be in the prefix cache ("published"); it joins the LRU list when its last
 * reference goes. Published blocks are never written, which is what lets the cache trust
 * their contents. */
#include "kv/kv.h"

#include <stdlib.h>
#include <string.h>

#define NONE (-1)

struct kv_seq {
    int len;             /* tokens */
    int n_written;       /* tokens whose K/V are known written (kv_seq_commit) */
    int n_pages, cap;    /* pages in use, allocated */
    int32_t *pages;      /* (cap) block ids; n_pages == ceil(len / block_size) */
    uint64_t *page_key;  /* (cap) prefix key of each full page */
    kv_seq *prev, *next; /* the pool's list of live sequences */
};

struct kv_pool {
    be_backend *be;
    kv_geometry geom;
    int64_t capacity;
    be_kv_layer *layers; /* (n_layers) slabs owned */

    int32_t *refcount;  /* (capacity) */
    uint8_t *published; /* (capacity) in the prefix cache */
    uint64_t *key;      /* (capacity) prefix key, when published */
    int32_t *parent;    /* (capacity) previous block of the chain, NONE for the first */
    int32_t *tokens;    /* (capacity, block_size) token ids */
    int32_t *link_prev; /* (capacity) free list (next only) or LRU list neighbours */
    int32_t *link_next; /* (capacity) */
    int32_t *hash_next; /* (capacity) next block of the same bucket */
    int32_t *buckets;   /* (n_buckets) first block of each bucket */
    int64_t n_buckets;  /* power of two */
    uint64_t hash_mask;

    int32_t free_head;
    int32_t lru_head, lru_tail; /* head = least recently released */
    int64_t n_free, n_cached, n_referenced, n_published;
    kv_seq *seqs; /* live sequences */
};

static uint64_t slab_block_bytes(const kv_geometry *g) {
    return (uint64_t)g->block_size * (uint64_t)g->n_kv_heads * (uint64_t)g->head_dim *
           base_dtype_size(g->dtype);
}

/* ---- lists ---- */

static void free_push(kv_pool *p, int32_t b) {
    p->link_next[b] = p->free_head;
    p->free_head = b;
    p->n_free++;
}

static int32_t free_pop(kv_pool *p) {
    int32_t b = p->free_head;
    p->free_head = p->link_next[b];
    p->n_free--;
    return b;
}

static void lru_push_tail(kv_pool *p, int32_t b) {
    p->link_prev[b] = p->lru_tail;
    p->link_next[b] = NONE;
    if (p->lru_tail != NONE)
        p->link_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void lru_remove(kv_pool *p, int32_t b) {
    int32_t pr = p->link_prev[b], nx = p->link_next[b];
    if (pr != NONE)
        p->link_next[pr] = nx;
    else
        p->lru_head = nx;
    if (nx != NONE)
        p->link_prev[nx] = pr;
    else
        p->lru_tail = pr;
    p->n_cached--;
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
    p->published[b] = 1;
    p->key[b] = key;
    p->parent[b] = parent;
    int64_t h = bucket_of(p, key);
    p->hash_next[b] = p->buckets[h];
    p->buckets[h] = b;
    p->n_published++;
}

static void unpublish(kv_pool *p, int32_t b) {
    int32_t *at = &p->buckets[bucket_of(p, p->key[b])];
    while (*at != b) at = &p->hash_next[*at];
    *at = p->hash_next[b];
    p->published[b] = 0;
    p->n_published--;
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
static int32_t block_take(kv_pool *p) {
    int32_t b;
    if (p->free_head != NONE) {
        b = free_pop(p);
    } else {
        b = p->lru_head;
        lru_remove(p, b);
        unpublish(p, b);
    }
    p->refcount[b] = 1;
    p->n_referenced++;
    return b;
}

static void block_ref(kv_pool *p, int32_t b) {
    if (p->refcount[b]++ > 0) return;
    lru_remove(p, b); /* only cached blocks have no references */
    p->n_referenced++;
}

static void block_unref(kv_pool *p, int32_t b) {
    if (--p->refcount[b] > 0) return;
    p->n_referenced--;
    if (p->published[b])
        lru_push_tail(p, b);
    else
        free_push(p, b);
}

/* ---- pool ---- */

static int geometry_check(const be_backend *be, const kv_geometry *g, int64_t num_blocks,
                          base_err *err) {
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
    if (num_blocks < 1 || num_blocks > INT32_MAX)
        return base_fail(err, "kv pool: num_blocks %lld outside 1..%d", (long long)num_blocks,
                         INT32_MAX);
    uint64_t bytes;
    if (!base_mul_ok_u64(slab_block_bytes(g), (uint64_t)num_blocks, &bytes) || bytes > SIZE_MAX)
        return base_fail(err, "kv pool: %lld blocks overflow the address space",
                         (long long)num_blocks);
    return 0;
}

int kv_pool_create(be_backend *be, const kv_geometry *geom, int64_t num_blocks, kv_pool **out,
                   base_err *err) {
    *out = NULL;
    if (geometry_check(be, geom, num_blocks, err)) return -1;
    kv_pool *p = base_xcalloc(1, sizeof *p);
    p->be = be;
    p->geom = *geom;
    p->capacity = num_blocks;
    p->hash_mask = UINT64_MAX;
    size_t n = (size_t)num_blocks;
    p->refcount = base_xcalloc(n, sizeof *p->refcount);
    p->published = base_xcalloc(n, sizeof *p->published);
    p->key = base_xcalloc(n, sizeof *p->key);
    p->parent = base_xcalloc(n, sizeof *p->parent);
    p->tokens = base_xcalloc(n * (size_t)geom->block_size, sizeof *p->tokens);
    p->link_prev = base_xcalloc(n, sizeof *p->link_prev);
    p->link_next = base_xcalloc(n, sizeof *p->link_next);
    p->hash_next = base_xcalloc(n, sizeof *p->hash_next);
    p->n_buckets = 1;
    while (p->n_buckets < num_blocks) p->n_buckets *= 2;
    p->buckets = base_xmalloc((size_t)p->n_buckets * sizeof *p->buckets);
    for (int64_t i = 0; i < p->n_buckets; i++) p->buckets[i] = NONE;
    p->free_head = NONE;
    p->lru_head = p->lru_tail = NONE;
    /* pushed in reverse so that blocks come out in ascending order */
    for (int64_t b = num_blocks - 1; b >= 0; b--) free_push(p, (int32_t)b);

    p->layers = base_xcalloc((size_t)geom->n_layers, sizeof *p->layers);
    size_t slab = (size_t)(slab_block_bytes(geom) * (uint64_t)num_blocks);
    for (int l = 0; l < geom->n_layers; l++) {
        be_kv_layer *L = &p->layers[l];
        *L = (be_kv_layer){.dtype = geom->dtype,
                           .num_blocks = num_blocks,
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
    free(p->refcount);
    free(p->published);
    free(p->key);
    free(p->parent);
    free(p->tokens);
    free(p->link_prev);
    free(p->link_next);
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

int64_t kv_pool_drop_cached(kv_pool *p) {
    int64_t n = 0;
    for (; p->lru_head != NONE; n++) {
        int32_t b = p->lru_head;
        lru_remove(p, b);
        unpublish(p, b);
        free_push(p, b);
    }
    return n;
}

void kv_pool_set_hash_mask(kv_pool *pool, uint64_t mask) {
    pool->hash_mask = mask;
}

kv_pool_stats kv_pool_get_stats(const kv_pool *p) {
    return (kv_pool_stats){p->capacity, p->n_free, p->n_cached, p->n_referenced};
}

/* Walks a list of at most capacity blocks, marking each in seen; -1 on a cycle, a repeat or a
 * block in the wrong state. */
static int check_list(const kv_pool *p, int32_t head, bool cached, uint8_t *seen, int64_t *count,
                      base_err *err) {
    const char *name = cached ? "LRU list" : "free list";
    *count = 0;
    int32_t prev = NONE;
    for (int32_t b = head; b != NONE; b = p->link_next[b]) {
        if (b < 0 || b >= p->capacity || seen[b])
            return base_fail(err, "kv pool: %s reaches block %d twice or out of range", name, b);
        seen[b] = 1;
        if (p->refcount[b] != 0 || (bool)p->published[b] != cached)
            return base_fail(err, "kv pool: block %d on the %s has refcount %d, published %d", b,
                             name, p->refcount[b], p->published[b]);
        if (cached && p->link_prev[b] != prev)
            return base_fail(err, "kv pool: LRU list back link broken at block %d", b);
        prev = b;
        (*count)++;
    }
    if (cached && p->lru_tail != prev) return base_fail(err, "kv pool: LRU tail is wrong");
    return 0;
}

static int check_seqs(const kv_pool *p, int32_t *refs, base_err *err) {
    int bs = p->geom.block_size;
    for (const kv_seq *s = p->seqs; s; s = s->next) {
        if (s->n_pages != (s->len + bs - 1) / bs || s->n_written > s->len || s->n_written < 0)
            return base_fail(err, "kv pool: sequence of %d tokens has %d pages, %d written", s->len,
                             s->n_pages, s->n_written);
        for (int i = 0; i < s->n_pages; i++) {
            if (s->pages[i] < 0 || s->pages[i] >= p->capacity)
                return base_fail(err, "kv pool: page %d is block %d, outside the pool", i,
                                 s->pages[i]);
            refs[s->pages[i]]++;
        }
    }
    return 0;
}

int kv_pool_check(const kv_pool *p, base_err *err) {
    size_t n = (size_t)p->capacity;
    uint8_t *seen = base_xcalloc(n, 1);
    int32_t *refs = base_xcalloc(n, sizeof *refs);
    int64_t n_free = 0, n_cached = 0, n_ref = 0, n_pub = 0, n_hashed = 0;
    int rc = check_list(p, p->free_head, false, seen, &n_free, err);
    if (!rc) rc = check_list(p, p->lru_head, true, seen, &n_cached, err);
    if (!rc) rc = check_seqs(p, refs, err);
    for (int64_t b = 0; !rc && b < p->capacity; b++) {
        if (refs[b] != p->refcount[b])
            rc = base_fail(err, "kv pool: block %lld has refcount %d but %d holders", (long long)b,
                           p->refcount[b], refs[b]);
        else if ((p->refcount[b] > 0) == (bool)seen[b])
            rc = base_fail(err, "kv pool: block %lld (refcount %d) is %s a list", (long long)b,
                           p->refcount[b], seen[b] ? "on" : "on no");
        n_ref += p->refcount[b] > 0;
        n_pub += p->published[b];
    }
    for (int64_t h = 0; !rc && h < p->n_buckets; h++) {
        for (int32_t b = p->buckets[h]; b != NONE && n_hashed <= p->capacity; b = p->hash_next[b]) {
            if (!p->published[b] || bucket_of(p, p->key[b]) != h)
                rc = base_fail(err, "kv pool: block %d is in the wrong hash bucket", b);
            else if (p->parent[b] != NONE && !p->published[p->parent[b]])
                rc = base_fail(err, "kv pool: cached block %d outlived its parent %d", b,
                               p->parent[b]);
            n_hashed++;
        }
    }
    if (!rc && (n_hashed != n_pub || n_pub != p->n_published))
        rc = base_fail(err, "kv pool: %lld published blocks, %lld in the hash table, %lld counted",
                       (long long)n_pub, (long long)n_hashed, (long long)p->n_published);
    if (!rc && (n_free != p->n_free || n_cached != p->n_cached || n_ref != p->n_referenced))
        rc = base_fail(err,
                       "kv pool: counters free %lld cached %lld referenced %lld, recount %lld "
                       "%lld %lld",
                       (long long)p->n_free, (long long)p->n_cached, (long long)p->n_referenced,
                       (long long)n_free, (long long)n_cached, (long long)n_ref);
    if (!rc && n_free + n_cached + n_ref != p->capacity)
        rc = base_fail(err, "kv pool: referenced %lld + cached %lld + free %lld != capacity %lld",
                       (long long)n_ref, (long long)n_cached, (long long)n_free,
                       (long long)p->capacity);
    free(seen);
    free(refs);
    return rc;
}

/* ---- sequences ---- */

static void seq_reserve(kv_seq *s, int pages) {
    if (pages <= s->cap) return;
    int cap = s->cap ? s->cap : 4;
    while (cap < pages) cap *= 2;
    s->pages = base_xrealloc(s->pages, (size_t)cap * sizeof *s->pages);
    s->page_key = base_xrealloc(s->page_key, (size_t)cap * sizeof *s->page_key);
    s->cap = cap;
}

kv_seq *kv_seq_create(kv_pool *pool) {
    kv_seq *s = base_xcalloc(1, sizeof *s);
    s->next = pool->seqs;
    if (pool->seqs) pool->seqs->prev = s;
    pool->seqs = s;
    return s;
}

void kv_seq_free(kv_pool *pool, kv_seq *seq) {
    if (!seq) return;
    kv_seq_truncate(pool, seq, 0);
    if (seq->prev)
        seq->prev->next = seq->next;
    else
        pool->seqs = seq->next;
    if (seq->next) seq->next->prev = seq->prev;
    free(seq->pages);
    free(seq->page_key);
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
        if (!pool->published[b]) publish(pool, b, seq->page_key[i], i ? seq->pages[i - 1] : NONE);
    }
}

int kv_seq_adopt_prefix(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n) {
    if (seq->len != 0 || n <= 1) return 0;
    int bs = pool->geom.block_size;
    int max_blocks = (n - 1) / bs;
    uint64_t key = BASE_HASH_SEED;
    int32_t parent = NONE;
    for (int i = 0; i < max_blocks; i++) {
        const int32_t *blk = tokens + (size_t)i * bs;
        key = chain_key(pool, key, blk);
        int32_t b = lookup(pool, key, parent, blk);
        if (b == NONE) break;
        block_ref(pool, b);
        seq_reserve(seq, i + 1);
        seq->pages[i] = b;
        seq->page_key[i] = key;
        seq->n_pages = i + 1;
        parent = b;
    }
    seq->len = seq->n_written = seq->n_pages * bs;
    return seq->len;
}

/* Copies the first `slots` slots of block src to dst in every layer, K and V, and their token
 * ids. */
static int copy_block(kv_pool *p, int32_t dst, int32_t src, int slots, base_err *err) {
    const kv_geometry *g = &p->geom;
    uint64_t bytes_per_slot = (uint64_t)g->n_kv_heads * g->head_dim * base_dtype_size(g->dtype);
    size_t bytes = (size_t)(bytes_per_slot * (uint64_t)slots);
    for (int l = 0; l < g->n_layers; l++) {
        const be_kv_layer *L = &p->layers[l];
        uint64_t so = kv_elem_offset(src, 0, 0, g->block_size, g->n_kv_heads, g->head_dim);
        uint64_t d0 = kv_elem_offset(dst, 0, 0, g->block_size, g->n_kv_heads, g->head_dim);
        size_t es = base_dtype_size(g->dtype);
        if (p->be->ops->copy(p->be, (char *)L->k + d0 * es, (const char *)L->k + so * es, bytes,
                             err) ||
            p->be->ops->copy(p->be, (char *)L->v + d0 * es, (const char *)L->v + so * es, bytes,
                             err))
            return base_fail_wrap(err, "kv pool: copy-on-write of block %d, layer %d", src, l);
    }
    memcpy(p->tokens + (size_t)dst * g->block_size, p->tokens + (size_t)src * g->block_size,
           (size_t)slots * sizeof(int32_t));
    return 0;
}

int kv_seq_append(kv_pool *pool, kv_seq *seq, const int32_t *tokens, int n, base_err *err) {
    if (n <= 0) return 0;
    if (!tokens) return base_fail(err, "kv_seq_append: tokens is NULL");
    int bs = pool->geom.block_size;
    if (n > INT32_MAX - seq->len)
        return base_fail(err, "kv_seq_append: %d + %d tokens overflow a sequence", seq->len, n);
    int used = seq->len % bs;
    int32_t last = seq->n_pages ? seq->pages[seq->n_pages - 1] : NONE;
    bool cow = used > 0 && (pool->refcount[last] > 1 || pool->published[last]);
    int new_pages = (int)(((int64_t)seq->len + n + bs - 1) / bs) - seq->n_pages;
    int64_t need = new_pages + (cow ? 1 : 0);
    int64_t have = pool->n_free + pool->n_cached;
    if (need > have)
        return base_fail(err, "kv cache full: %lld blocks needed, %lld free or evictable",
                         (long long)need, (long long)have);
    seq_reserve(seq, seq->n_pages + new_pages);
    if (cow) {
        int32_t fresh = block_take(pool);
        if (copy_block(pool, fresh, last, used, err)) {
            block_unref(pool, fresh);
            return -1;
        }
        block_unref(pool, last);
        seq->pages[seq->n_pages - 1] = fresh;
    }
    for (int i = 0; i < new_pages; i++) seq->pages[seq->n_pages++] = block_take(pool);
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

void kv_seq_truncate(kv_pool *pool, kv_seq *seq, int new_len) {
    if (new_len < 0) new_len = 0;
    if (new_len >= seq->len) return;
    int bs = pool->geom.block_size;
    int keep = (new_len + bs - 1) / bs;
    while (seq->n_pages > keep) block_unref(pool, seq->pages[--seq->n_pages]);
    seq->len = new_len;
    if (seq->n_written > new_len) seq->n_written = new_len;
}

kv_seq *kv_seq_fork(kv_pool *pool, const kv_seq *seq) {
    kv_seq *f = kv_seq_create(pool);
    seq_reserve(f, seq->n_pages);
    for (int i = 0; i < seq->n_pages; i++) {
        f->pages[i] = seq->pages[i];
        f->page_key[i] = seq->page_key[i];
        block_ref(pool, seq->pages[i]);
    }
    f->n_pages = seq->n_pages;
    f->len = seq->len;
    f->n_written = seq->n_written;
    return f;
}

/* ---- batches ---- */

int kv_batch_build(const kv_pool *pool, kv_seq *const *seqs, const int *q_lens, int n_seqs,
                   kv_batch *out, base_err *err) {
    memset(out, 0, sizeof *out);
    int64_t n_tokens = 0, n_pages = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (q_lens[s] < 0 || q_lens[s] > seqs[s]->len)
            return base_fail(err, "kv batch: sequence %d computes %d of its %d tokens", s,
                             q_lens[s], seqs[s]->len);
        n_tokens += q_lens[s];
        n_pages += seqs[s]->n_pages;
    }
    if (n_tokens > INT32_MAX || n_pages > INT32_MAX)
        return base_fail(err, "kv batch: %lld tokens, %lld pages exceed int32", (long long)n_tokens,
                         (long long)n_pages);
    size_t n = (size_t)n_seqs;
    size_t i32 = (n + 1) * 2 + n * 2 + (size_t)n_pages + (size_t)n_tokens;
    /* the int64 slots go first so that they are aligned */
    char *mem = base_xmalloc((size_t)n_tokens * sizeof(int64_t) + i32 * sizeof(int32_t) + 1);
    int64_t *slots = (int64_t *)mem;
    int32_t *q_indptr = (int32_t *)(slots + n_tokens);
    int32_t *page_indptr = q_indptr + n + 1;
    int32_t *kv_len = page_indptr + n + 1;
    int32_t *last_page_len = kv_len + n;
    int32_t *page_indices = last_page_len + n;
    int32_t *positions = page_indices + n_pages;
    int bs = pool->geom.block_size;
    q_indptr[0] = page_indptr[0] = 0;
    int t = 0, max_q_len = 0, max_kv_len = 0;
    for (int s = 0; s < n_seqs; s++) {
        const kv_seq *sq = seqs[s];
        q_indptr[s + 1] = q_indptr[s] + q_lens[s];
        page_indptr[s + 1] = page_indptr[s] + sq->n_pages;
        if (sq->n_pages)
            memcpy(page_indices + page_indptr[s], sq->pages, (size_t)sq->n_pages * sizeof(int32_t));
        kv_len[s] = sq->len;
        last_page_len[s] = sq->n_pages ? sq->len - (sq->n_pages - 1) * bs : 0;
        if (q_lens[s] > max_q_len) max_q_len = q_lens[s];
        if (sq->len > max_kv_len) max_kv_len = sq->len;
        for (int i = 0; i < q_lens[s]; i++, t++) {
            int pos = sq->len - q_lens[s] + i;
            positions[t] = pos;
            slots[t] = (int64_t)sq->pages[pos / bs] * bs + pos % bs;
        }
    }
    out->view = (be_paged_batch){.n_seqs = n_seqs,
                                 .n_tokens = (int)n_tokens,
                                 .max_q_len = max_q_len,
                                 .max_kv_len = max_kv_len,
                                 .q_indptr = q_indptr,
                                 .kv_len = kv_len,
                                 .page_indptr = page_indptr,
                                 .page_indices = page_indices,
                                 .last_page_len = last_page_len,
                                 /* pages start at their first slot (no sliding windows
                                  * yet); NULL tells the attention kernels so, which lets a
                                  * plan for exactly the batch's pages serve it */
                                 .first_page_offset = NULL,
                                 .slots = slots,
                                 .positions = positions};
    out->storage = mem;
    return 0;
}

void kv_batch_free(kv_batch *batch) {
    free(batch->storage);
    memset(batch, 0, sizeof *batch);
}
