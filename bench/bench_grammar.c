/* Constrained decoding's cost on the CPU: R requests, each a fresh matcher over one JSON
 * Schema's grammar (the cache starts empty per request, as it will in the server), each
 * generating a document token by token over the demo tokenizer. Per token the sampler's share
 * is timed: the mask, applying it to a row of logits, and the advance by the chosen token. The
 * chooser stands in for the model (a random allowed token, steered to the end past a length
 * budget; untimed). The ceiling is the demo model's own decode step (one sequence, CPU),
 * measured in the same run: the figure is the grammar's time per token as a fraction of it.
 * The machine may be shared: both are the best of three rounds.
 *
 *   build/bench/bench_grammar [SCHEMA] [REQUESTS] [THREADS]
 *       (defaults tests/grammar/schemas/26-issue.json, 8, 2) */
#include "engine/engine.h"
#include "grammar/grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BUDGET = 48, ROUNDS = 3 }; /* tokens before the chooser steers to the end */

typedef struct timing {
    double mask, apply, accept; /* seconds */
    long tokens;
    double worst_token; /* the slowest token's grammar time */
} timing;

static uint32_t rand_u32(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (uint32_t)(*s >> 16);
}

static void cpu_name(char *out, size_t n) {
    snprintf(out, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            snprintf(out, n, "%s", c + 2);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

/* The model's stand-in: a random allowed token, or past the budget the one that leaves the
 * fewest characters to match; len counts the tokens so far. Returns -1 when the grammar may
 * end and the walk stops. */
static int32_t choose(gram_state *s, const uint32_t *mask, int vocab, size_t len, int32_t *allowed,
                      uint64_t *rng) {
    int n = 0;
    for (int t = 0; t < vocab; t++)
        if (mask[t / 32] >> (t % 32) & 1) allowed[n++] = t;
    if (n == 0 || (gram_state_can_end(s) && (len > BUDGET || rand_u32(rng) % 4 == 0))) return -1;
    if (len <= BUDGET) return allowed[rand_u32(rng) % (uint32_t)n];
    size_t best = SIZE_MAX;
    int32_t pick = allowed[0];
    for (int i = 0; i < n; i++) {
        gram_state *c = gram_state_clone(s);
        if (gram_state_accept(c, allowed[i], NULL) == 0 && gram_state_min_remaining(c) < best) {
            best = gram_state_min_remaining(c);
            pick = allowed[i];
        }
        gram_state_free(c);
    }
    return pick;
}

/* One document through matcher m; st gets the cache counters it moved. */
static int one_request(gram_matcher *m, const gram_vocab *v, uint64_t seed, timing *t,
                       gram_stats *st, base_err *err) {
    gram_stats before;
    gram_matcher_stats(m, &before);
    int vocab = gram_vocab_size(v), words = gram_mask_words(v);
    uint32_t *mask = malloc((size_t)words * sizeof *mask);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    int32_t *allowed = malloc((size_t)vocab * sizeof *allowed);
    for (int i = 0; i < vocab; i++) logits[i] = (float)(i % 97) * 0.01f;
    gram_state *s = gram_state_new(m);
    size_t len = 0;
    int rc = 0;
    for (;;) {
        double t0 = base_now();
        if ((rc = gram_state_mask(s, mask, err))) break;
        double t1 = base_now();
        gram_mask_apply(v, mask, logits, vocab); /* what the sampler does with it */
        double t2 = base_now();
        int32_t tok = choose(s, mask, vocab, len, allowed, &seed);
        for (int i = 0; i < vocab; i++) logits[i] = (float)(i % 97) * 0.01f;
        if (tok < 0) break;
        double t3 = base_now();
        if ((rc = gram_state_accept(s, tok, err))) break;
        double t4 = base_now();
        len++;
        double tok_time = (t1 - t0) + (t2 - t1) + (t4 - t3);
        t->mask += t1 - t0;
        t->apply += t2 - t1;
        t->accept += t4 - t3;
        t->tokens++;
        if (tok_time > t->worst_token) t->worst_token = tok_time;
    }
    gram_matcher_stats(m, st);
    st->masks -= before.masks;
    st->mask_hits -= before.mask_hits;
    st->steps -= before.steps;
    st->step_hits -= before.step_hits;
    st->mask_seconds -= before.mask_seconds;
    gram_state_free(s);
    free(mask);
    free(logits);
    free(allowed);
    return rc;
}

/* The requests, best of ROUNDS, each with a fresh matcher or all through one (shared: a
 * server that keeps the matcher of a schema it sees again); prints the figures. */
static int run_case(const gram_grammar *g, const gram_vocab *v, int requests, bool shared,
                    double step, base_err *err) {
    timing t = {0};
    gram_stats sum = {0};
    for (int round = 0; round < ROUNDS; round++) {
        timing rt = {0};
        gram_stats rs = {0};
        gram_matcher *m = shared ? gram_matcher_new(g, v) : NULL;
        for (int r = 0; r < requests; r++) {
            gram_stats st;
            gram_matcher *use = m ? m : gram_matcher_new(g, v);
            int rc = one_request(use, v, 0x9e3779b97f4a7c15ull * (uint64_t)(r + 1), &rt, &st, err);
            if (!m) gram_matcher_free(use);
            if (rc) {
                gram_matcher_free(m);
                return -1;
            }
            rs.masks += st.masks;
            rs.mask_hits += st.mask_hits;
            rs.steps += st.steps;
            rs.step_hits += st.step_hits;
            rs.mask_seconds += st.mask_seconds;
        }
        gram_matcher_free(m);
        /* the same requests each round: keep the fastest */
        if (round == 0 || rt.mask + rt.apply + rt.accept < t.mask + t.apply + t.accept) {
            t = rt;
            sum = rs;
        }
    }
    double per_tok = (t.mask + t.apply + t.accept) / (double)t.tokens;
    uint64_t misses = sum.masks - sum.mask_hits;
    printf("%d requests, %ld tokens, %s\n", requests, t.tokens,
           shared ? "one matcher for all (its cache kept)" : "a fresh matcher each request");
    printf("  masks/s: %.0f overall, %.0f computed (cache misses), %.0f from the cache\n",
           (double)sum.masks / t.mask, misses ? (double)misses / sum.mask_seconds : 0.0,
           sum.mask_hits ? (double)sum.mask_hits / (t.mask - sum.mask_seconds) : 0.0);
    printf("  cache hit rate: masks %.1f%%, transitions %.1f%%\n",
           100.0 * (double)sum.mask_hits / (double)sum.masks,
           100.0 * (double)sum.step_hits / (double)sum.steps);
    printf("  per token: mask %.1f us, apply %.1f us, accept %.1f us; worst token %.3f ms\n",
           t.mask / t.tokens * 1e6, t.apply / t.tokens * 1e6, t.accept / t.tokens * 1e6,
           t.worst_token * 1e3);
    printf("  grammar cost per token: %.1f us = %.2f%% of a decode step (target <= 10%%)\n",
           per_tok * 1e6, 100.0 * per_tok / step);
    return 0;
}

int main(int argc, char **argv) {
    const char *src = getenv("MLXCEL_SOURCE_DIR") ? getenv("MLXCEL_SOURCE_DIR") : ".";
    char schema_default[4096], model_dir[4096];
    snprintf(schema_default, sizeof schema_default, "%s/tests/grammar/schemas/26-issue.json", src);
    snprintf(model_dir, sizeof model_dir, "%s/models/demo", src);
    const char *schema_path = argc > 1 ? argv[1] : schema_default;
    int requests = argc > 2 ? atoi(argv[2]) : 8, threads = argc > 3 ? atoi(argv[3]) : 2;
    base_err err;
    char cpu[256];
    cpu_name(cpu, sizeof cpu);
    printf("device: %s (CPU, %d threads for the model)\ncommit: %s\nschema: %s\n", cpu, threads,
           MLXCEL_GIT_COMMIT, schema_path);

    tok_tokenizer *tok;
    if (tok_load(model_dir, 0, &tok, &err)) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    double t0 = base_now();
    gram_vocab *v;
    if (gram_vocab_from_tokenizer(tok, &v, &err)) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    double t_vocab = base_now() - t0;
    char *text, *gbnf;
    size_t len;
    gram_grammar *g;
    t0 = base_now();
    if (base_read_file(schema_path, &text, &len, &err) ||
        gram_schema_to_gbnf(text, len, &gbnf, &err) || gram_parse(gbnf, strlen(gbnf), &g, &err)) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    double t_compile = base_now() - t0;
    printf("vocabulary: %d tokens, trie built in %.1f ms (once per tokenizer)\n",
           gram_vocab_size(v), t_vocab * 1e3);
    printf("schema -> grammar: %zu bytes of GBNF, compiled in %.2f ms (once per request)\n\n",
           strlen(gbnf), t_compile * 1e3);

    /* the ceiling: the demo model's decode step, one sequence */
    engine_options o;
    engine_options_defaults(&o);
    o.device = "cpu";
    o.n_threads = threads;
    o.ctx_size = 256;
    o.n_parallel = 1;
    engine_runtime *rt;
    double step = INFINITY;
    enum { STEPS = 64 };
    if (engine_runtime_open(model_dir, &o, &rt, &err)) {
        fprintf(stderr, "bench_grammar: %s\n", err.msg);
        return 1;
    }
    for (int r = 0; r < ROUNDS; r++) {
        double decode_s;
        if (engine_bench_decode(rt, 1, 64, STEPS, &decode_s, &err)) {
            fprintf(stderr, "bench_grammar: %s\n", err.msg);
            return 1;
        }
        if (decode_s / STEPS < step) step = decode_s / STEPS;
    }
    engine_runtime_close(rt);
    printf("demo model decode step (1 sequence, depth 64): %.3f ms\n\n", step * 1e3);

    int rc = run_case(g, v, requests, false, step, &err);
    if (!rc) rc = run_case(g, v, requests, true, step, &err);
    if (rc) fprintf(stderr, "bench_grammar: %s\n", err.msg);
    free(text);
    free(gbnf);
    gram_free(g);
    gram_vocab_free(v);
    tok_free(tok);
    return rc ? 1 : 0;
}
