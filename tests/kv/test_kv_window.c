/* The pool's local group (sliding-window layers): a long random run of create/adopt, append,
 * fork, truncate and free keeps both groups' accounting exact (kv_pool_check after every
 * operation) and every K/V a sequence still holds intact, in both groups, with real, tiny and
 * colliding prefix keys; plus blocks going back as a sequence grows, adoption only where the
 * window's local blocks are cached, truncation refused past the window, and an all-local
 * model whose global group has no slabs. */
#include "test.h"
#include "kv/kv_test_backend.h"
#include "kv/kv_test_seq.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void) {
    return (uint32_t)(test_rand_u64(&rng_state) >> 32);
}

/* The first position a sequence's local view holds (-1 on a failed build). */
static int local_start(kv_pool *pool, kv_seq *seq) {
    kv_batch b;
    int zero = 0;
    base_err err;
    if (kv_batch_build(pool, &seq, &zero, 1, &b, &err)) return -1;
    int start = kv_seq_len(seq) - b.local.kv_len[0];
    kv_batch_free(&b);
    return start;
}

static bool stats_equal(const kv_pool *pool, const kv_pool_stats *g, const kv_pool_stats *l) {
    kv_pool_stats g2 = kv_pool_get_stats(pool), l2 = kv_pool_get_local_stats(pool);
    return memcmp(g, &g2, sizeof g2) == 0 && memcmp(l, &l2, sizeof l2) == 0;
}

enum { MAX_SEQS = 10, WINDOW = 6, BS = 4 };

/* A few shared stems, rarely disturbed, so that long prefixes repeat and adoption reaches past
 * the window often. */
static void random_tokens(int32_t *out, int n) {
    int stem = (int)(rnd() % 3);
    for (int i = 0; i < n; i++) out[i] = rnd() % 16 == 0 ? (int32_t)(rnd() % 3) : (stem + i) % 5;
}

/* The window's first block for a query at pos. */
static int first_block(int pos) {
    int lo = pos - WINDOW + 1;
    return lo > 0 ? lo / BS : 0;
}

static void property_run(const bool *layer_local, int n_layers, uint64_t mask, int ops) {
    be_backend *be = tb_create(1);
    kv_geometry g = {n_layers, 2, 4, BS, BASE_DTYPE_F32, WINDOW, layer_local};
    kv_pool *pool;
    base_err err;
    CHECK(kv_pool_create(be, &g, 60, 24, &pool, &err) == 0);
    kv_pool_set_hash_mask(pool, mask);
    live_seq live[MAX_SEQS];
    int n_live = 0;
    int64_t adopted_past_window = 0, cows = 0, failures = 0, refused = 0, truncated = 0;
    for (int op = 0; op < ops; op++) {
        int kind = (int)(rnd() % 6);
        live_seq *s = n_live ? &live[rnd() % n_live] : NULL;
        kv_pool_stats gb = kv_pool_get_stats(pool), lb = kv_pool_get_local_stats(pool);
        if (kind == 0 || !s) {
            if (n_live == MAX_SEQS) continue;
            s = &live[n_live++];
            s->seq = kv_seq_create(pool);
            int n = 1 + (int)(rnd() % 60);
            random_tokens(s->toks, n);
            s->len = kv_seq_adopt_prefix(pool, s->seq, s->toks, n);
            adopted_past_window += s->len > WINDOW + BS;
            CHECK(s->len % BS == 0 && s->len < n);
            if (!pool_ok(pool, "adopt")) break;
            CHECK(seq_content_ok(pool, s->seq, s->toks, s->len));
            gb = kv_pool_get_stats(pool);
            lb = kv_pool_get_local_stats(pool);
            if (append_written(be, pool, s->seq, s->toks, s->len, n - s->len, &err) == 0) {
                s->len = n;
            } else {
                CHECK(stats_equal(pool, &gb, &lb));
                failures++;
            }
        } else if (kind == 1 || kind == 2) {
            int n = 1 + (int)(rnd() % 10);
            if (s->len + n > KV_TEST_MAX_LEN) continue;
            random_tokens(s->toks + s->len, n);
            bool shared_tail = s->len % BS != 0;
            if (append_written(be, pool, s->seq, s->toks, s->len, n, &err) == 0) {
                s->len += n;
                cows += shared_tail;
            } else {
                CHECK_MSG(stats_equal(pool, &gb, &lb) && kv_seq_len(s->seq) == s->len,
                          "a failed append changed the pool: %s", err.msg);
                failures++;
            }
        } else if (kind == 3) {
            if (n_live == MAX_SEQS) continue;
            live_fork(pool, &live[n_live++], s);
        } else if (kind == 4) {
            /* mostly short steps back, as a rejected continuation would take */
            int back = rnd() % 2 ? 1 + (int)(rnd() % 3) : (int)(rnd() % (uint32_t)(s->len + 1));
            int new_len = s->len > back ? s->len - back : 0;
            int start = local_start(pool, s->seq);
            bool allowed = new_len >= s->len || new_len == 0 || first_block(new_len) >= start / BS;
            int rc = kv_seq_truncate(pool, s->seq, new_len, &err);
            CHECK_MSG((rc == 0) == allowed, "truncating %d tokens (local from %d) to %d: rc %d",
                      s->len, start, new_len, rc);
            if (rc == 0) {
                truncated += new_len < s->len;
                s->len = new_len;
            } else {
                CHECK(strstr(err.msg, "window") != NULL);
                CHECK(stats_equal(pool, &gb, &lb) && kv_seq_len(s->seq) == s->len);
                refused++;
            }
        } else {
            kv_seq_free(pool, s->seq);
            *s = live[--n_live];
        }
        if (!live_check(pool, live, n_live, rnd() % 4 != 0, mask, op)) break;
    }
    printf("  %d layers, mask %llx: adoptions past the window %lld, copy-on-write appends %lld, "
           "failed appends %lld, truncations %lld done and %lld refused\n",
           n_layers, (unsigned long long)mask, (long long)adopted_past_window, (long long)cows,
           (long long)failures, (long long)truncated, (long long)refused);
    CHECK_MSG(adopted_past_window > 0 && cows > 0 && failures > 0 && refused > 0 && truncated > 0,
              "adopted past the window %lld, cows %lld, failures %lld, truncations refused "
              "%lld, done %lld",
              (long long)adopted_past_window, (long long)cows, (long long)failures,
              (long long)refused, (long long)truncated);
    for (int i = 0; i < n_live; i++) kv_seq_free(pool, live[i].seq);
    kv_pool_stats gs = kv_pool_get_stats(pool), ls = kv_pool_get_local_stats(pool);
    CHECK(gs.referenced == 0 && gs.free + gs.cached == gs.capacity);
    CHECK(ls.referenced == 0 && ls.free + ls.cached == ls.capacity && ls.capacity == 24);
    pool_ok(pool, "freeing everything");
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* A sequence growing token by token holds every global block but only its window's local
 * ones; the rest go back to the pool (cached when committed, else free). */
static void blocks_return(void) {
    be_backend *be = tb_create(1);
    const bool locals[3] = {true, false, true};
    kv_geometry g = {3, 1, 4, BS, BASE_DTYPE_F32, WINDOW, locals};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 32, 4, &pool, &err) == 0);
    CHECK(kv_pool_has_local(pool) && kv_pool_layer_local(pool, 0) && !kv_pool_layer_local(pool, 1));
    CHECK(kv_pool_layer(pool, 0)->num_blocks == 4 && kv_pool_layer(pool, 1)->num_blocks == 32);
    int32_t t[60];
    for (int i = 0; i < 60; i++) t[i] = i;
    kv_seq *s = kv_seq_create(pool);
    for (int i = 0; i < 60; i++) {
        /* 60 tokens need 15 blocks: a 4-block local group serves them only if blocks return */
        CHECK_MSG(append_written(be, pool, s, t, i, 1, &err) == 0, "token %d: %s", i, err.msg);
        if (i % 3 == 0) kv_seq_commit(pool, s);
        kv_pool_stats gs = kv_pool_get_stats(pool), ls = kv_pool_get_local_stats(pool);
        int64_t want = (i + BS) / BS - first_block(i);
        CHECK_MSG(gs.referenced == (i + BS) / BS && ls.referenced == want,
                  "token %d: global %lld, local %lld held (want %lld)", i, (long long)gs.referenced,
                  (long long)ls.referenced, (long long)want);
        CHECK(ls.referenced + ls.cached + ls.free == 4);
        if (!pool_ok(pool, "a step") || !seq_content_ok(pool, s, t, i + 1)) break;
    }
    /* a 7-token step spans the window before it (6 - 1 tokens) and itself: 4 blocks; one
     * token, 3 */
    CHECK(kv_local_blocks_per_step(&g, 7) == 4 && kv_local_blocks_per_step(&g, 1) == 3);
    /* a fork shares the 2 blocks held; 12 more tokens need 3 new ones, and 2 are left */
    kv_seq *big = kv_seq_fork(pool, s);
    CHECK(kv_seq_append(pool, big, t, 12, &err) == -1);
    CHECK(strstr(err.msg, "local-layer blocks") != NULL);
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* Adoption takes a cached chain only as far as its window's local blocks are cached too; once
 * those are evicted it stops where they still are, and never takes a wrong block. */
static void adopt_needs_window(void) {
    be_backend *be = tb_create(1);
    const bool locals[2] = {false, true};
    kv_geometry g = {2, 1, 4, BS, BASE_DTYPE_F32, WINDOW, locals};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 32, 8, &pool, &err) == 0);
    int32_t a[25], other[24];
    for (int i = 0; i < 25; i++) a[i] = i % 7;
    for (int i = 0; i < 24; i++) other[i] = 100 + i;
    /* token by token, committed each step: every local block is attached while held, then
     * goes back cached as the window passes it (blocks 0-3), and 4-5 at the free */
    kv_seq *s = kv_seq_create(pool);
    for (int i = 0; i < 24; i++) {
        CHECK(append_written(be, pool, s, a, i, 1, &err) == 0);
        kv_seq_commit(pool, s);
    }
    kv_seq_free(pool, s);
    kv_pool_stats ls = kv_pool_get_local_stats(pool);
    CHECK_MSG(ls.cached == 6 && ls.free == 2, "local cached %lld", (long long)ls.cached);
    /* all 24 tokens: the window of token 24 needs blocks 4 and 5 */
    s = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, s, a, 25) == 24);
    CHECK(local_start(pool, s) == 16);
    CHECK(seq_content_ok(pool, s, a, 24));
    CHECK(append_written(be, pool, s, a, 24, 1, &err) == 0);
    CHECK(seq_content_ok(pool, s, a, 25));
    kv_seq_free(pool, s);
    /* 24 unrelated tokens in one step take the 2 free local blocks and evict the 4 released
     * first (blocks 0-3), keeping 4 and 5 */
    kv_seq *fill = kv_seq_create(pool);
    CHECK(append_written(be, pool, fill, other, 0, 24, &err) == 0);
    ls = kv_pool_get_local_stats(pool);
    CHECK(ls.cached == 2 && ls.free == 0 && ls.referenced == 6);
    /* a prefix of 16 would need blocks 2 and 3 for token 16's window; no shorter chain has
     * its window either: nothing is adopted, though the global blocks are all cached */
    s = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, s, a, 17) == 0);
    kv_seq_free(pool, s);
    s = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, s, a, 25) == 24);
    CHECK(seq_content_ok(pool, s, a, 24));
    /* and the local group is full now: the next token fails, changing nothing */
    kv_pool_stats gb = kv_pool_get_stats(pool), lb = kv_pool_get_local_stats(pool);
    CHECK(kv_seq_append(pool, s, a + 24, 1, &err) == -1);
    CHECK(strstr(err.msg, "local-layer blocks") != NULL);
    CHECK(stats_equal(pool, &gb, &lb) && kv_seq_len(s) == 24);
    pool_ok(pool, "evicted local blocks");
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* Every layer local: the global group keeps only tokens and prefix keys (no slabs), and still
 * drives adoption. */
static void all_local(void) {
    be_backend *be = tb_create(1);
    const bool locals[2] = {true, true};
    kv_geometry g = {2, 1, 4, BS, BASE_DTYPE_F32, WINDOW, locals};
    base_err err;
    kv_pool *pool;
    CHECK(kv_pool_create(be, &g, 32, 6, &pool, &err) == 0);
    CHECK(kv_group_bytes_per_block(&g, false) == 0 && kv_group_bytes_per_block(&g, true) > 0);
    int32_t a[41];
    for (int i = 0; i < 41; i++) a[i] = i % 5;
    kv_seq *s = kv_seq_create(pool);
    for (int i = 0; i < 40; i += 5) {
        CHECK(append_written(be, pool, s, a, i, 5, &err) == 0);
        kv_seq_commit(pool, s);
    }
    CHECK(seq_content_ok(pool, s, a, 40));
    kv_seq_free(pool, s);
    s = kv_seq_create(pool);
    CHECK(kv_seq_adopt_prefix(pool, s, a, 41) == 40);
    CHECK(append_written(be, pool, s, a, 40, 1, &err) == 0);
    CHECK(seq_content_ok(pool, s, a, 41));
    pool_ok(pool, "all local");
    kv_pool_destroy(pool);
    tb_destroy(be);
}

/* Geometry errors name the mismatch. */
static void bad_geometry(void) {
    be_backend *be = tb_create(1);
    const bool locals[2] = {false, true}, none[2] = {false, false};
    base_err err;
    kv_pool *pool;
    kv_geometry g = {2, 1, 4, BS, BASE_DTYPE_F32, WINDOW, locals};
    CHECK(kv_pool_create(be, &g, 8, 0, &pool, &err) == -1 && strstr(err.msg, "local") != NULL);
    g.layer_local = none;
    CHECK(kv_pool_create(be, &g, 8, 0, &pool, &err) == -1 && strstr(err.msg, "window") != NULL);
    g.window = 0;
    g.layer_local = locals;
    CHECK(kv_pool_create(be, &g, 8, 4, &pool, &err) == -1 && strstr(err.msg, "local") != NULL);
    g.window = -1;
    CHECK(kv_pool_create(be, &g, 8, 4, &pool, &err) == -1 && strstr(err.msg, "negative") != NULL);
    tb_destroy(be);
}

int main(void) {
    const bool alternate[3] = {true, false, true}, every[2] = {true, true};
    property_run(alternate, 3, UINT64_MAX, 2500);
    property_run(alternate, 3, 0, 2500);
    property_run(alternate, 3, 3, 2500);
    property_run(every, 2, 0, 1500);
    blocks_return();
    adopt_needs_window();
    all_local();
    bad_geometry();
    TEST_MAIN_END();
}
