/* The block allocator: a long random run of create/adopt, append, fork, truncate and free
 * keeps the accounting exact (kv_pool_check after every operation) and every sequence's K/V
 * intact through its pages, with real, tiny and colliding prefix keys; plus the prefix cache
 * contract, LRU eviction order, all-or-nothing appends and the CSR batch. */
#include "test.h"
#include "kv/kv_test_backend.h"
#include "kv/kv_test_seq.h"

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint32_t rnd(void) {
    return (uint32_t)(test_rand_u64(&rng_state) >> 32);
}

enum { MAX_SEQS = 12 };

/* A few shared stems so that prefixes repeat and adoption happens often. */
static void random_tokens(int32_t *out, int n) {
    int stem = (int)(rnd() % 3);
    for (int i = 0; i < n; i++) out[i] = rnd() % 4 == 0 ? (int32_t)(rnd() % 3) : (stem + i) % 5;
}

static void property_run(uint64_t mask, int ops) {
    be_backend *be = tb_create(1);
    kv_geometry g = {2, 2, 4, 4, BASE_DTYPE_F32, 0, NULL};
    kv_pool *pool;
    base_err err;
    CHECK(kv_pool_create(be, &g, 40, 0, &pool, &err) == 0);
    kv_pool_set_hash_mask(pool, mask);
    live_seq live[MAX_SEQS];
    int n_live = 0;
    int64_t adopted = 0, cows = 0, failures = 0;
    for (int op = 0; op < ops; op++) {
        int kind = (int)(rnd() % 6);
        live_seq *s = n_live ? &live[rnd() % n_live] : NULL;
        if (kind == 0 || !s) {
            if (n_live == MAX_SEQS) continue;
            s = &live[n_live++];
            s->seq = kv_seq_create(pool);
            int n = 1 + (int)(rnd() % 40);
            random_tokens(s->toks, n);
            s->len = kv_seq_adopt_prefix(pool, s->seq, s->toks, n);
            adopted += s->len;
            CHECK(s->len % g.block_size == 0 && s->len < n);
            if (!pool_ok(pool, "adopt")) break;
            kv_pool_stats before = kv_pool_get_stats(pool);
            if (append_written(be, pool, s->seq, s->toks, s->len, n - s->len, &err) == 0) {
                s->len = n;
            } else {
                kv_pool_stats after = kv_pool_get_stats(pool);
                CHECK(memcmp(&before, &after, sizeof before) == 0);
                failures++;
            }
        } else if (kind == 1 || kind == 2) {
            int n = 1 + (int)(rnd() % 10);
            if (s->len + n > KV_TEST_MAX_LEN) continue;
            random_tokens(s->toks + s->len, n);
            kv_pool_stats before = kv_pool_get_stats(pool);
            bool shared_tail = s->len % g.block_size != 0;
            if (append_written(be, pool, s->seq, s->toks, s->len, n, &err) == 0) {
                s->len += n;
                cows += shared_tail;
            } else {
                kv_pool_stats after = kv_pool_get_stats(pool);
                CHECK_MSG(memcmp(&before, &after, sizeof before) == 0 &&
                              kv_seq_len(s->seq) == s->len,
                          "a failed append changed the pool: %s", err.msg);
                failures++;
            }
        } else if (kind == 3) {
            if (n_live == MAX_SEQS) continue;
            live_fork(pool, &live[n_live++], s);
        } else if (kind == 4) {
            s->len = s->len ? (int)(rnd() % (uint32_t)s->len) : 0;
            CHECK(kv_seq_truncate(pool, s->seq, s->len, &err) == 0);
        } else {
            kv_seq_free(pool, s->seq);
            *s = live[--n_live];
        }
        if (!live_check(pool, live, n_live, rnd() % 4 != 0, mask, op)) break;
    }
    /* the run must have exercised adoption, copy-on-write and a full pool */
    CHECK_MSG(adopted > 0 && cows > 0 && failures > 0, "adopted %lld, cows %lld, failures %lld",
              (long long)adopted, (long long)cows, (long long)failures);
    for (int i = 0; i < n_live; i++) kv_seq_free(pool, live[i].seq);
    kv_pool_stats st = kv_pool_get_stats(pool);
    CHECK(st.referenced == 0 && st.free + st.cached == st.capacity);
    pool_ok(pool, "freeing everything");
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* Attention output of the last token of `toks`, computed in `pool` after adopting what it
 * can; returns the tokens adopted. */
static int decode_output(be_backend *be, kv_pool *pool, const int32_t *toks, int n, float *out) {
    base_err err;
    kv_seq *seq = kv_seq_create(pool);
    int adopted = kv_seq_adopt_prefix(pool, seq, toks, n);
    CHECK(append_written(be, pool, seq, toks, adopted, n - adopted, &err) == 0);
    kv_seq_commit(pool, seq);
    kv_batch b;
    int one = 1;
    CHECK(kv_batch_build(pool, &seq, &one, 1, &b, &err) == 0);
    const kv_geometry *g = kv_pool_geometry(pool);
    int n_heads = g->n_kv_heads * 2;
    float q[2 * 2 * 4];
    for (int i = 0; i < n_heads * g->head_dim; i++) q[i] = 0.01f * (float)(i % 7) - 0.02f;
    be_tensor qt = {q, BASE_DTYPE_F32, 1, n_heads * g->head_dim};
    be_tensor ot = {out, BASE_DTYPE_F32, 1, n_heads * g->head_dim};
    for (int l = 0; l < g->n_layers; l++)
        CHECK(be->ops->attention(be, &qt, kv_pool_layer(pool, l), &b.view, NULL, n_heads,
                                 be_attn_plain(0.5f), &ot, &err) == 0);
    kv_batch_free(&b);
    kv_seq_free(pool, seq);
    return adopted;
}

/* Every prefix key collides; adoption must still take only blocks whose tokens match, so the
 * output equals a run with no cache at all. */
static void forced_collision(void) {
    be_backend *be = tb_create(2);
    kv_geometry g = {2, 2, 4, 4, BASE_DTYPE_F32, 0, NULL};
    base_err err;
    kv_pool *cached, *fresh;
    CHECK(kv_pool_create(be, &g, 32, 0, &cached, &err) == 0);
    CHECK(kv_pool_create(be, &g, 32, 0, &fresh, &err) == 0);
    kv_pool_set_hash_mask(cached, 0);
    int32_t first[17], second[17];
    for (int i = 0; i < 17; i++) first[i] = second[i] = i % 3;
    second[6] = 7; /* differs in block 1 only; blocks 2 and 3 hold the same tokens again */
    float out_first[16], out_cached[16], out_fresh[16];
    CHECK(decode_output(be, cached, first, 17, out_first) == 0);
    int adopted = decode_output(be, cached, second, 17, out_cached);
    CHECK_MSG(adopted == 4, "adopted %d tokens of a prefix that matches one block", adopted);
    CHECK(decode_output(be, fresh, second, 17, out_fresh) == 0);
    CHECK(memcmp(out_cached, out_fresh, sizeof out_fresh) == 0);
    /* and an exact repeat adopts every full block but the one holding the last token */
    CHECK(decode_output(be, cached, first, 17, out_cached) == 16);
    CHECK(decode_output(be, cached, first, 16, out_cached) == 12);
    /* a chain whose second block's tokens are cached only under another first block */
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 32, 0, &pool, &err) == 0);
    kv_pool_set_hash_mask(pool, 0);
    const int32_t x[9] = {1, 1, 1, 1, 2, 2, 2, 2, 9}, z[9] = {3, 3, 3, 3, 4, 4, 4, 4, 9};
    const int32_t y[9] = {1, 1, 1, 1, 4, 4, 4, 4, 9};
    CHECK(decode_output(be, pool, x, 9, out_first) == 0);
    CHECK(decode_output(be, pool, z, 9, out_first) == 0);
    CHECK(decode_output(be, pool, y, 9, out_cached) == 4);
    CHECK(decode_output(be, fresh, y, 9, out_fresh) == 0);
    CHECK(memcmp(out_cached, out_fresh, sizeof out_fresh) == 0);
    pool_ok(pool, "a foreign parent");
    kv_pool_destroy(pool);
    pool_ok(cached, "collisions");
    kv_pool_destroy(cached);
    kv_pool_destroy(fresh);
    tb_destroy(be);
}

/* Blocks enter the cache only when full and committed; the least recently released go first,
 * and only once the free list is empty. */
static void cache_contract(void) {
    be_backend *be = tb_create(1);
    kv_geometry g = {1, 1, 4, 4, BASE_DTYPE_F32, 0, NULL};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 6, 0, &pool, &err) == 0);
    int32_t a[9] = {1, 1, 1, 1, 2, 2, 2, 2, 3}, c[9] = {5, 5, 5, 5, 6, 6, 6, 6, 7};
    kv_seq *s = kv_seq_create(pool);
    CHECK(append_written(be, pool, s, a, 0, 8, &err) == 0);
    kv_seq_free(pool, s); /* never committed: nothing cached */
    CHECK(kv_pool_get_stats(pool).cached == 0);
    s = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, s, a, 9) == 0);
    CHECK(append_written(be, pool, s, a, 0, 9, &err) == 0);
    kv_seq_commit(pool, s);
    kv_seq_free(pool, s); /* two full blocks cached, the partial one freed */
    kv_pool_stats st = kv_pool_get_stats(pool);
    CHECK(st.cached == 2 && st.free == 4);
    s = kv_seq_create(pool);
    CHECK(append_written(be, pool, s, c, 0, 9, &err) == 0);
    kv_seq_commit(pool, s);
    kv_seq_free(pool, s);
    st = kv_pool_get_stats(pool);
    CHECK(st.cached == 4 && st.free == 2); /* free blocks were used before evicting */
    s = kv_seq_create(pool);
    int32_t d[16] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};
    CHECK(append_written(be, pool, s, d, 0, 16, &err) == 0); /* 2 free + 2 evicted: a's */
    st = kv_pool_get_stats(pool);
    CHECK(st.cached == 2 && st.free == 0 && st.referenced == 4);
    kv_seq *probe = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, probe, a, 9) == 0);
    CHECK(kv_seq_adopt_prefix(pool, probe, c, 9) == 8);
    CHECK(kv_seq_append(pool, probe, d, 30, &err) == -1);
    CHECK(strstr(err.msg, "blocks") != NULL);
    pool_ok(pool, "the cache contract");
    kv_pool_destroy(pool); /* frees the live sequences too */
    tb_destroy(be);
}

/* Appending after a truncation into a cached block copies it first, so the cached block
 * keeps the tokens and K/V it was cached with. */
static void cached_block_copied(void) {
    be_backend *be = tb_create(1);
    kv_geometry g = {1, 1, 4, 4, BASE_DTYPE_F32, 0, NULL};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 8, 0, &pool, &err) == 0);
    const int32_t t[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, other = 42;
    kv_seq *s = kv_seq_create(pool);
    CHECK(append_written(be, pool, s, t, 0, 8, &err) == 0);
    kv_seq_commit(pool, s);
    CHECK(kv_seq_truncate(pool, s, 6, &err) == 0);
    CHECK(kv_seq_append(pool, s, &other, 1, &err) == 0);
    kv_seq *probe = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, probe, t, 9) == 8);
    CHECK(seq_content_ok(pool, probe, t, 8));
    pool_ok(pool, "a truncated cached block");
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* The CSR batch of a forked pair after a copy-on-write append. */
static void batch_fields(void) {
    be_backend *be = tb_create(1);
    kv_geometry g = {1, 1, 2, 4, BASE_DTYPE_F32, 0, NULL};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 16, 0, &pool, &err) == 0);
    int32_t t[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    kv_seq *a = kv_seq_create(pool);
    CHECK(kv_seq_append(pool, a, t, 6, &err) == 0);
    kv_seq *b = kv_seq_fork(pool, a);
    CHECK(kv_seq_append(pool, b, t, 3, &err) == 0); /* copies the shared half-full block */
    kv_seq *seqs[2] = {a, b};
    int q[2] = {1, 4};
    kv_batch batch;
    CHECK(kv_batch_build(pool, seqs, q, 2, &batch, &err) == 0);
    const be_paged_batch *v = &batch.view;
    CHECK(v->n_seqs == 2 && v->n_tokens == 5 && v->max_kv_len == 9 && v->max_q_len == 4);
    CHECK(v->q_indptr[0] == 0 && v->q_indptr[1] == 1 && v->q_indptr[2] == 5);
    CHECK(v->kv_len[0] == 6 && v->kv_len[1] == 9);
    CHECK(v->page_indptr[1] == 2 && v->page_indptr[2] == 5);
    CHECK(v->last_page_len[0] == 2 && v->last_page_len[1] == 1);
    CHECK(v->first_page_offset == NULL);             /* every page starts at its first slot */
    CHECK(v->page_indices[0] == v->page_indices[2]); /* shared full block */
    CHECK(v->page_indices[1] != v->page_indices[3]); /* copied on write */
    CHECK(v->positions[0] == 5 && v->positions[1] == 5 && v->positions[4] == 8);
    CHECK(v->slots[0] == (int64_t)v->page_indices[1] * 4 + 1);
    CHECK(v->slots[4] == (int64_t)v->page_indices[4] * 4 + 0);
    base_err e2;
    CHECK(attn_batch_check(v, kv_pool_layer(pool, 0), &e2) == 0);
    kv_batch_free(&batch);
    kv_pool_destroy(pool);
    tb_destroy(be);
}

int main(void) {
    /* 131,073 blocks of [32, 8, 128]: the last block starts past 2^32 elements */
    CHECK(kv_elem_offset(131072, 0, 0, 32, 8, 128) == 4294967296ull);
    CHECK(kv_elem_offset(131072, 31, 7, 32, 8, 128) == 4294967296ull + 31 * 1024 + 7 * 128);
    property_run(UINT64_MAX, 3000);
    property_run(0, 3000);
    property_run(3, 3000);
    forced_collision();
    cache_contract();
    cached_block_copied();
    batch_fields();
    TEST_MAIN_END();
}
