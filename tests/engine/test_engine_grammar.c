/* Constrained generation through the scheduler on the demo model: every output is a sentence
 * of its grammar (greedy, sampled at temperature 1, preempted and recomputed, and batched next
 * to free requests, which are unchanged by their neighbours), EOS comes only where the grammar
 * may end (and at once there when it is favoured), a grammar that can take nothing more stops
 * the request, and a bad grammar is the caller's error. The outputs are checked by a matcher
 * of the test's own, token by token and over the text the client was shown. */
#include "engine/engine_test_collector.h"
#include "engine/engine_test_runtime.h"
#include "test.h"

#include <string.h>

static char g_model[4096];
static tok_tokenizer *g_tok;
static gram_vocab *g_vocab;     /* the test's own, for checking */
static const int32_t g_eos = 2; /* models/demo/config.json's eos_token_id */

/* A key-value object with a bounded free-text field: it ends within 40 tokens. */
static const char k_record[] =
    "root ::= \"{\\\"id\\\": \" [1-9] [0-9]{0,3} \", \\\"name\\\": \\\"\" "
    "[a-z ]{2,12} \"\\\"}\"\n";
/* Ends only past 16 characters (several tokens); anything after that may be followed by EOS. */
static const char k_word[] = "root ::= [a-z ]{16,}\n";
/* A choice that is over once made: nothing can follow it, not even EOS. */
static const char k_answer[] = "root ::= \"yes\" | \"no\" | \"maybe\"\n";

static engine_runtime *open_rt(int n_parallel, int ctx, int block_size) {
    engine_runtime *rt = test_open_runtime(g_model, ctx, n_parallel, block_size);
    const io_model_config *c = model_config(rt->model);
    CHECK(c->n_eos == 1 && c->eos_token_ids[0] == g_eos);
    return rt;
}

static engine_sched *start(engine_runtime *rt, int n_parallel, int ctx) {
    engine_sched_options so = {.n_parallel = n_parallel, .ctx_size = ctx, .tok = g_tok};
    engine_sched *s = NULL;
    base_err err;
    if (engine_sched_start(rt, &so, &s, &err)) {
        fprintf(stderr, "scheduler: %s\n", err.msg);
        exit(1);
    }
    return s;
}

static int encode(const char *text, int32_t *ids, int cap) {
    int32_t *out = NULL;
    size_t n = 0;
    base_err err;
    CHECK_MSG(tok_encode(g_tok, text, strlen(text), true, &out, &n, &err) == 0, "%s", err.msg);
    if ((int)n > cap) n = (size_t)cap;
    memcpy(ids, out, n * sizeof *ids);
    free(out);
    return (int)n;
}

static engine_request make_req(const int32_t *prompt, int n, const char *grammar, collector *c) {
    engine_request r = {.prompt = prompt, .n_prompt = n, .grammar = grammar};
    engine_sampling_defaults(&r.sampling);
    r.sampling.temperature = 0;
    r.on_event = collect_event;
    r.ctx = c;
    return r;
}

static void submit(engine_sched *s, const engine_request *r) {
    uint64_t id;
    engine_reject why;
    base_err err;
    CHECK_MSG(engine_submit(s, r, &id, &why, &err) == 0, "%s", err.msg);
}

/* Checks c's output against the grammar: its tokens (an EOS only last) and its text are a
 * whole sentence, and when `eos_at_first_end` no proper prefix of the tokens could end (the
 * request stopped at the first place EOS was allowed). Returns how many tokens it had. */
static int check_sentence(const char *gbnf, const collector *c, bool eos_at_first_end,
                          const char *what) {
    gram_grammar *g;
    base_err err;
    CHECK_MSG(gram_parse(gbnf, strlen(gbnf), &g, &err) == 0, "%s", err.msg);
    gram_matcher *m = gram_matcher_new(g, g_vocab);
    gram_state *st = gram_state_new(m);
    CHECK_MSG(c->n_final == 1 && c->finish == ENGINE_FINISH_STOP, "%s: finish %d (%s)", what,
              c->finish, c->error);
    int n = c->n_tokens;
    bool eos = n > 0 && c->tokens[n - 1] == g_eos;
    for (int i = 0; i < n - (eos ? 1 : 0); i++) {
        CHECK_MSG(c->tokens[i] != g_eos, "%s: EOS at %d of %d", what, i, n);
        if (eos_at_first_end)
            CHECK_MSG(!gram_state_can_end(st), "%s: EOS was allowed after %d tokens", what, i);
        int rc = gram_state_accept(st, c->tokens[i], &err);
        CHECK_MSG(rc == 0, "%s: token %d: %s", what, i, err.msg);
        if (rc) break;
    }
    CHECK_MSG(gram_state_can_end(st), "%s: the output is not a whole sentence: '%.*s'", what,
              (int)c->text_len, c->text);
    gram_state_free(st);
    st = gram_state_new(m);
    CHECK_MSG(gram_state_accept_bytes(st, c->text, c->text_len, &err) == 0 &&
                  gram_state_can_end(st),
              "%s: the text shown is not a sentence: '%.*s'", what, (int)c->text_len, c->text);
    gram_state_free(st);
    gram_matcher_free(m);
    gram_free(g);
    return n;
}

static void check_pool_idle(engine_runtime *rt, engine_sched *s) {
    engine_sched_stats st = engine_sched_get_stats(s);
    CHECK_MSG(st.pool.referenced == 0, "referenced %lld", (long long)st.pool.referenced);
    base_err err;
    CHECK_MSG(kv_pool_check(rt->pool, &err) == 0, "%s", err.msg);
}

/* Greedy and sampled (temperature 1, the whole vocabulary) outputs are sentences; the model
 * alone would write prose, so the grammar decides them. */
static void test_sentences(void) {
    engine_runtime *rt = open_rt(4, 256, 16);
    engine_sched *s = start(rt, 4, 256);
    int32_t prompt[32];
    int n = encode("The king said unto them,", prompt, 32);
    collector c[6];
    const char *grammars[6] = {k_record, k_record, k_answer, k_record, k_record, k_answer};
    for (int i = 0; i < 6; i++) {
        collector_init(&c[i]);
        engine_request r = make_req(prompt, n, grammars[i], &c[i]);
        r.max_tokens = COLLECT_MAX_TOKENS;
        if (i >= 3) {
            r.sampling.temperature = 1;
            r.sampling.top_k = 0;
            r.sampling.top_p = 1;
            r.sampling.min_p = 0;
            r.sampling.seed = 1000 + (uint64_t)i;
        }
        submit(s, &r);
    }
    for (int i = 0; i < 6; i++) {
        collector_wait(&c[i]);
        char what[32];
        snprintf(what, sizeof what, "request %d", i);
        check_sentence(grammars[i], &c[i], false, what);
    }
    /* the answer grammar is over once a word is written: no EOS is needed or given */
    CHECK(c[2].n_tokens > 0 && c[2].tokens[c[2].n_tokens - 1] != g_eos);
    CHECK_MSG(strcmp(c[2].text, "yes") == 0 || strcmp(c[2].text, "no") == 0 ||
                  strcmp(c[2].text, "maybe") == 0,
              "'%s'", c[2].text);
    /* greedy twice over one grammar (one shared matcher) gives one output */
    CHECK(c[0].n_tokens == c[1].n_tokens &&
          memcmp(c[0].tokens, c[1].tokens, (size_t)c[0].n_tokens * sizeof(int32_t)) == 0);
    engine_sched_wait_idle(s);
    CHECK_MSG(engine_sched_get_stats(s).matchers == 2, "%d matchers for two grammar texts",
              engine_sched_get_stats(s).matchers);
    /* distinct texts, one after another: past the few kept idle, the oldest go */
    for (int i = 0; i < 6; i++) {
        char gbnf[64];
        snprintf(gbnf, sizeof gbnf, "root ::= \"%c\" [a-z]{0,3} \".\"\n", 'a' + i);
        collector d;
        collector_init(&d);
        engine_request r = make_req(prompt, n, gbnf, &d);
        submit(s, &r);
        collector_wait(&d);
        check_sentence(gbnf, &d, false, "one of many grammars");
    }
    engine_sched_wait_idle(s);
    CHECK_MSG(engine_sched_get_stats(s).matchers == 4, "%d matchers kept (4 expected)",
              engine_sched_get_stats(s).matchers);
    check_pool_idle(rt, s);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* EOS favoured by a large bias: it must still wait for the grammar's first possible end, and
 * come there. Without a grammar the same bias ends the request at once. */
static void test_eos(void) {
    engine_runtime *rt = open_rt(2, 256, 16);
    engine_sched *s = start(rt, 2, 256);
    int32_t prompt[32];
    int n = encode("Once upon a time", prompt, 32);
    engine_logit_bias bias = {g_eos, 50};
    collector c[2];
    for (int i = 0; i < 2; i++) {
        collector_init(&c[i]);
        engine_request r = make_req(prompt, n, i == 0 ? k_word : NULL, &c[i]);
        r.max_tokens = 40;
        r.sampling.n_logit_bias = 1;
        r.sampling.logit_bias = &bias;
        submit(s, &r);
    }
    collector_wait(&c[0]);
    collector_wait(&c[1]);
    int got = check_sentence(k_word, &c[0], true, "EOS favoured");
    CHECK_MSG(got >= 2 && c[0].tokens[got - 1] == g_eos, "%d tokens, last %d", got,
              got ? c[0].tokens[got - 1] : -1);
    CHECK(c[1].finish == ENGINE_FINISH_STOP && c[1].n_tokens == 1 && c[1].tokens[0] == g_eos);
    /* ignore_eos: EOS is never allowed, so the open-ended grammar runs to max_tokens */
    collector d;
    collector_init(&d);
    engine_request r = make_req(prompt, n, k_word, &d);
    r.max_tokens = 12;
    r.ignore_eos = true;
    r.sampling.n_logit_bias = 1;
    r.sampling.logit_bias = &bias;
    submit(s, &r);
    collector_wait(&d);
    CHECK(d.finish == ENGINE_FINISH_LENGTH && d.n_tokens == 12);
    for (int i = 0; i < d.n_tokens; i++) CHECK(d.tokens[i] != g_eos);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* A pool that holds one sequence and three constrained requests: the newest are preempted and
 * recomputed, keeping their matcher state, and give what each gives alone. */
static void test_preemption(void) {
    enum { N = 3 };
    engine_runtime *rt = open_rt(1, 64, 16);
    int32_t prompt[N][16];
    int n[N];
    const char *texts[N] = {"The king", "And the Lord said", "In the beginning"};
    collector alone[N], c[N];
    engine_sched *s = start(rt, 1, 64);
    for (int i = 0; i < N; i++) {
        n[i] = encode(texts[i], prompt[i], 16);
        collector_init(&alone[i]);
        engine_request r = make_req(prompt[i], n[i], k_record, &alone[i]);
        submit(s, &r);
        collector_wait(&alone[i]);
    }
    engine_sched_stop(s);
    s = start(rt, N, 64);
    for (int i = 0; i < N; i++) {
        collector_init(&c[i]);
        engine_request r = make_req(prompt[i], n[i], k_record, &c[i]);
        submit(s, &r);
    }
    for (int i = 0; i < N; i++) {
        collector_wait(&c[i]);
        check_sentence(k_record, &c[i], false, "preempted");
        CHECK_MSG(
            c[i].n_tokens == alone[i].n_tokens &&
                memcmp(c[i].tokens, alone[i].tokens, (size_t)c[i].n_tokens * sizeof(int32_t)) == 0,
            "request %d: '%s' alone, '%s' preempted", i, alone[i].text, c[i].text);
    }
    engine_sched_wait_idle(s);
    CHECK_MSG(engine_sched_get_stats(s).preemptions > 0, "no preemption happened");
    check_pool_idle(rt, s);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* Constrained and free requests in one batch: the free ones give what they give alone, token
 * for token, and the constrained ones are sentences. */
static void test_mixed(void) {
    enum { N = 6, GEN = 24 };
    engine_runtime *rt = open_rt(N, 256, 16);
    int32_t prompt[N][16];
    int n[N];
    const char *grammars[N] = {k_record, NULL, k_answer, NULL, k_record, k_answer};
    int32_t ref[N][GEN];
    for (int i = 0; i < N; i++) {
        char text[64];
        snprintf(text, sizeof text, "Chapter %d. The king", i + 1);
        n[i] = encode(text, prompt[i], 16);
        if (grammars[i]) continue;
        engine_sampling sp;
        engine_sampling_defaults(&sp);
        sp.temperature = 0;
        engine_generate_result res;
        base_err err;
        CHECK_MSG(engine_generate(rt, prompt[i], n[i], GEN, &sp, NULL, NULL, &res, &err) == 0, "%s",
                  err.msg);
        CHECK(res.n_tokens == GEN);
        memcpy(ref[i], res.tokens, GEN * sizeof(int32_t));
        free(res.tokens);
    }
    engine_sched *s = start(rt, N, 256);
    collector c[N];
    for (int i = 0; i < N; i++) {
        collector_init(&c[i]);
        engine_request r = make_req(prompt[i], n[i], grammars[i], &c[i]);
        r.max_tokens = grammars[i] ? 60 : GEN;
        r.ignore_eos = !grammars[i];
        submit(s, &r);
    }
    for (int i = 0; i < N; i++) {
        collector_wait(&c[i]);
        if (grammars[i]) {
            check_sentence(grammars[i], &c[i], false, "mixed");
            continue;
        }
        CHECK(c[i].finish == ENGINE_FINISH_LENGTH && c[i].n_tokens == GEN);
        CHECK_MSG(memcmp(c[i].tokens, ref[i], sizeof ref[i]) == 0, "free request %d differs", i);
    }
    engine_sched_wait_idle(s);
    check_pool_idle(rt, s);
    engine_sched_stop(s);
    engine_runtime_close(rt);
}

/* A grammar that does not parse is refused at submission, naming where; so is one given to a
 * scheduler with no tokenizer to match with. */
static void test_refused(void) {
    engine_runtime *rt = open_rt(1, 64, 16);
    engine_sched *s = start(rt, 1, 64);
    int32_t prompt[4] = {1, 450, 9939, 28705};
    collector c;
    collector_init(&c);
    engine_request r = make_req(prompt, 4, "root ::= (\"a\"\n", &c);
    uint64_t id;
    engine_reject why;
    base_err err;
    CHECK(engine_submit(s, &r, &id, &why, &err) == -1 && why == ENGINE_REJECT_INVALID);
    CHECK_MSG(strstr(err.msg, "line 1") != NULL, "%s", err.msg);
    engine_sched_stop(s);
    engine_sched_options so = {.n_parallel = 1, .ctx_size = 64};
    CHECK(engine_sched_start(rt, &so, &s, &err) == 0);
    r.grammar = k_answer;
    CHECK(engine_submit(s, &r, &id, &why, &err) == -1 && why == ENGINE_REJECT_INVALID);
    CHECK_MSG(strstr(err.msg, "tokenizer") != NULL, "%s", err.msg);
    engine_sched_stop(s);
    CHECK(c.n_final == 0);
    engine_runtime_close(rt);
}

int main(void) {
    snprintf(g_model, sizeof g_model, "%s/models/demo", test_source_dir());
    base_err err;
    if (tok_load(g_model, 0, &g_tok, &err) || gram_vocab_from_tokenizer(g_tok, &g_vocab, &err)) {
        fprintf(stderr, "demo tokenizer: %s\n", err.msg);
        return 1;
    }
    test_sentences();
    test_eos();
    test_preemption();
    test_mixed();
    test_refused();
    gram_vocab_free(g_vocab);
    tok_free(g_tok);
    TEST_MAIN_END();
}
