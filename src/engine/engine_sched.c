/* The scheduler: a request queue and the step loop on its own thread (continuous batching with
 * chunked prefill, prefix adoption and preemption by recompute).
 *
 * Every request keeps its whole token history (prompt, then generated ids) and a count of how
 * many of them are in its KV sequence. What is not yet in the KV is "pending": the prompt
 * before prefill, one token (the last sampled) while decoding. A step gives every running
 * sequence a slice of its pending tokens; a sequence whose slice reaches the end of its
 * history gets a logits row and samples its next token. Prefill and decode are therefore the
 * same thing at different lengths, and a preempted request (KV dropped, pending = everything)
 * needs no special path to come back.
 *
 * A constrained request (a grammar) gets its matcher state at its first sample and keeps it
 * until it ends, preemption included: the state says where in the grammar the generated ids
 * have led, and the recomputed KV changes none of them. Matchers are keyed by grammar text and
 * shared; the ones no request uses are kept (a few, least recently used dropped first) so that
 * a client sending the same schema again finds the mask cache warm.
 *
 * Locking: `mu` guards the waiting queue, the cancel list, the step limit, the idle flag and
 * the stats snapshot; `vocab_mu` the grammar vocabulary while the first constrained request
 * builds it. The running set, the pool, the model and the matchers belong to the step
 * thread. */
#include "engine/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SCHED_DEFAULT_BATCH_TOKENS 2048
/* Matchers kept with no request using them: each holds a grammar's mask cache. */
#define SCHED_IDLE_MATCHERS 4

/* A grammar text, compiled, and its matcher over the scheduler's vocabulary. */
typedef struct sched_grammar {
    char *text;
    gram_grammar *g; /* owned */
    gram_matcher *m; /* owned; over engine_sched.gvocab */
    int refs;        /* requests holding a state of m */
    uint64_t used;   /* the clock when a request last took it: the LRU's order */
} sched_grammar;

typedef struct sreq {
    uint64_t id;
    uint64_t admit_order;    /* larger = admitted later; preemption takes the largest */
    engine_request r;        /* prompt and stop point into the owned copies below */
    engine_logit_bias *bias; /* (r.sampling.n_logit_bias) owned */
    char **stop;             /* (n_stop) owned */
    size_t *stop_len;        /* (n_stop) */
    int n_stop;
    int32_t *stop_ids; /* (r.n_stop_ids) owned */
    int32_t *tokens;   /* (cap) prompt then generated ids */
    int n_tokens, cap, n_prompt, n_generated, max_generated;
    int n_cached;  /* prompt tokens adopted at first admission */
    bool admitted; /* ever admitted (n_cached counted) */
    kv_seq *seq;   /* NULL while waiting */
    engine_sampler *sampler;
    char *grammar_text;    /* NULL: unconstrained; owned copy of r.grammar */
    gram_grammar *grammar; /* compiled at submission; owned until a matcher takes it */
    sched_grammar *gram;   /* the matcher shared with the requests of the same text */
    gram_state *gstate;    /* of gram's matcher, from the first sample on */
    char *gram_error;      /* this step's mask failed: the request ends with it */
    /* the thinking budget (engine_request.reasoning_budget) */
    int32_t *think_open, *think_close; /* (r.n_think_open), (r.n_think_close) owned */
    bool thinking, think_done;         /* inside the thinking; it has ended (or never began) */
    int think_tokens;                  /* generated while thinking */
    int forcing;                       /* think_close[forcing] is the next token; -1: none */
    tok_stream *stream;                /* NULL without a tokenizer */
    char *held; /* (held_cap) text not shown yet: it may still become a stop string */
    size_t held_len, held_cap;
    double t_submit, ttft;
} sreq;

/* A step's share for one running request. */
typedef struct step_entry {
    sreq *q;
    int q_len;
} step_entry;

struct engine_sched {
    engine_runtime *rt;
    engine_sched_options o;
    int32_t *eos; /* (n_eos) model config's ids and the caller's */
    int n_eos;
    int vocab;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* work arrived, a cancel, a stop, the step limit changed */
    pthread_cond_t idle_cv;
    /* under mu */
    sreq **waiting; /* (n_waiting) head first; capacity waiting_cap */
    int n_waiting, waiting_cap;
    uint64_t *cancels; /* (n_cancels) ids to cancel */
    int n_cancels, cancels_cap;
    int64_t step_limit;
    bool stopping, draining, idle;
    uint64_t erase_asked, erase_done; /* engine_sched_erase_cache's tickets */
    int64_t erased;                   /* blocks the last erase dropped */
    struct between *between;          /* engine_sched_run_between's jobs, newest first */
    uint64_t next_id;
    engine_sched_stats stats;
    pthread_mutex_t vocab_mu;
    gram_vocab *gvocab; /* the tokenizer's tokens for grammars; built by the first submission
                           with a grammar, read-only after (its requests reach the step thread
                           through the queue, under mu) */
    /* step thread only */
    sreq **running; /* (n_running) admission order; capacity o.n_parallel */
    int n_running;
    uint64_t admit_counter;
    step_entry *entries;  /* (o.n_parallel) this step's slices */
    kv_seq **seqs;        /* (o.n_parallel) the entries' sequences, for the batch */
    int *q_lens;          /* (o.n_parallel) */
    int32_t *out_rows;    /* (o.n_parallel) batch rows whose logits are wanted */
    int32_t *step_tokens; /* (o.max_batch_tokens) the step's new tokens, entry order */
    engine_picker *picker;
    engine_pick *picks;    /* (o.n_parallel) this step's rows to sample, logits row order */
    sched_grammar **grams; /* (n_grams) the matchers; capacity cap_grams */
    int n_grams, cap_grams;
    uint64_t gram_clock;
    uint32_t *masks; /* (o.n_parallel, gram_mask_words) this step's allowed sets; NULL until a
                        constrained request samples */
};

/* ---- requests ---- */

static void sreq_free(sreq *q) {
    if (!q) return;
    free(q->bias);
    for (int i = 0; i < q->n_stop; i++) free(q->stop[i]);
    free(q->stop);
    free(q->stop_len);
    free(q->stop_ids);
    free(q->tokens);
    engine_sampler_free(q->sampler);
    if (q->stream) tok_stream_free(q->stream);
    free(q->held);
    free(q->grammar_text);
    gram_free(q->grammar);
    free(q->gram_error);
    free(q->think_open);
    free(q->think_close);
    free(q);
}

static int check_request(const engine_sched *s, const engine_request *r, base_err *err) {
    if (!r->on_event) return base_fail(err, "request: no event callback");
    if (r->n_prompt <= 0) return base_fail(err, "the prompt is empty");
    if (r->n_prompt >= s->o.ctx_size)
        return base_fail(err,
                         "the prompt has %d tokens; the context holds %d per sequence (-c) and "
                         "needs room for at least one generated token",
                         r->n_prompt, s->o.ctx_size);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= s->vocab)
            return base_fail(err, "prompt token %d at position %d is outside the vocabulary (%d)",
                             r->prompt[i], i, s->vocab);
    if (r->top_logprobs < 0 || r->top_logprobs > ENGINE_MAX_TOP_LOGPROBS)
        return base_fail(err, "top_logprobs must be in 0..%d, got %d", ENGINE_MAX_TOP_LOGPROBS,
                         r->top_logprobs);
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !r->stop[i][0]) return base_fail(err, "stop string %d is empty", i);
    for (int i = 0; i < r->n_stop_ids; i++)
        if (r->stop_ids[i] < 0 || r->stop_ids[i] >= s->vocab)
            return base_fail(err, "stop token id %d is outside the vocabulary (%d)", r->stop_ids[i],
                             s->vocab);
    if (r->min_tokens < 0) return base_fail(err, "min_tokens must be >= 0");
    if (r->n_think_close > 0 && r->reasoning_budget >= 0 && !s->o.tok)
        return base_fail(err, "a reasoning budget needs the tokenizer");
    if (r->n_think_end < 0 || r->n_think_end > r->n_think_close)
        return base_fail(err, "n_think_end must be in 0..n_think_close");
    for (int i = 0; i < r->n_think_close; i++)
        if (r->think_close[i] < 0 || r->think_close[i] >= s->vocab)
            return base_fail(err, "think_close token %d is outside the vocabulary", i);
    return 0;
}

/* The sampler, its bias banning the end ids while min_tokens holds them back. */
static int sampler_new(const engine_sched *s, sreq *q, base_err *err) {
    const engine_sampling *p = &q->r.sampling;
    if (q->r.min_tokens <= 0) return engine_sampler_new(p, s->vocab, &q->sampler, err);
    int n = p->n_logit_bias;
    engine_logit_bias *b = base_xmalloc((size_t)(n + s->n_eos + q->r.n_stop_ids + 1) * sizeof *b);
    if (n) memcpy(b, p->logit_bias, (size_t)n * sizeof *b);
    for (int i = 0; i < s->n_eos; i++) b[n++] = (engine_logit_bias){s->eos[i], -INFINITY};
    for (int i = 0; i < q->r.n_stop_ids; i++)
        b[n++] = (engine_logit_bias){q->stop_ids[i], -INFINITY};
    engine_sampling banned = *p;
    banned.logit_bias = b;
    banned.n_logit_bias = n;
    int rc = engine_sampler_new(&banned, s->vocab, &q->sampler, err);
    free(b);
    return rc;
}

static int32_t *copy_ids(const int32_t *ids, int n) {
    int32_t *c = base_xmalloc((size_t)(n + 1) * sizeof *c);
    if (n) memcpy(c, ids, (size_t)n * sizeof *c);
    return c;
}

/* The thinking budget's state at submission: the ids it watches for, copied. */
static void think_init(sreq *q, const engine_request *r) {
    q->forcing = -1;
    q->think_done = r->n_think_close <= 0 || r->reasoning_budget < 0;
    q->thinking = !q->think_done && r->thinking;
    q->think_open = copy_ids(r->think_open, r->n_think_open);
    q->think_close = copy_ids(r->think_close, r->n_think_close);
    q->r.think_open = q->r.think_close = NULL;
}

/* The grammar vocabulary, built from the tokenizer by the first caller that needs it. */
static int vocab_ensure(engine_sched *s, base_err *err) {
    pthread_mutex_lock(&s->vocab_mu);
    int rc = s->gvocab ? 0 : gram_vocab_from_tokenizer(s->o.tok, &s->gvocab, err);
    pthread_mutex_unlock(&s->vocab_mu);
    return rc;
}

/* Compiles the request's grammar on the submitting thread, so that a bad one is the caller's
 * error and the step thread never parses. */
static int grammar_compile(engine_sched *s, sreq *q, const char *text, base_err *err) {
    if (!s->o.tok) return base_fail(err, "grammar: the scheduler has no tokenizer to match with");
    if (vocab_ensure(s, err) || gram_parse_vocab(text, strlen(text), s->gvocab, &q->grammar, err))
        return -1;
    q->grammar_text = base_xstrdup(text);
    q->r.grammar = NULL;
    return 0;
}

/* Copies everything the caller passed (the request outlives the caller's buffers). */
static int sreq_new(engine_sched *s, const engine_request *r, sreq **out, base_err *err) {
    if (check_request(s, r, err)) return -1;
    sreq *q = base_xcalloc(1, sizeof *q);
    q->r = *r;
    if (r->sampling.n_logit_bias > 0) {
        size_t nb = (size_t)r->sampling.n_logit_bias * sizeof *q->bias;
        q->bias = base_xmalloc(nb);
        memcpy(q->bias, r->sampling.logit_bias, nb);
    }
    q->r.sampling.logit_bias = q->bias;
    if (r->n_stop_ids > 0) {
        q->stop_ids = base_xmalloc((size_t)r->n_stop_ids * sizeof *q->stop_ids);
        memcpy(q->stop_ids, r->stop_ids, (size_t)r->n_stop_ids * sizeof *q->stop_ids);
    }
    q->r.stop_ids = q->stop_ids;
    think_init(q, r);
    if (sampler_new(s, q, err) || (r->grammar && grammar_compile(s, q, r->grammar, err)) ||
        (!q->think_done && vocab_ensure(s, err))) {
        sreq_free(q);
        return -1;
    }
    q->n_stop = s->o.tok ? r->n_stop : 0;
    q->stop = base_xcalloc((size_t)q->n_stop + 1, sizeof *q->stop);
    q->stop_len = base_xcalloc((size_t)q->n_stop + 1, sizeof *q->stop_len);
    for (int i = 0; i < q->n_stop; i++) {
        q->stop[i] = base_xstrdup(r->stop[i]);
        q->stop_len[i] = strlen(r->stop[i]);
    }
    q->r.stop = NULL;
    q->r.n_stop = q->n_stop;
    q->n_prompt = q->n_tokens = r->n_prompt;
    int room = s->o.ctx_size - r->n_prompt;
    q->max_generated = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
    q->cap = r->n_prompt + (q->max_generated < 256 ? q->max_generated : 256);
    q->tokens = base_xmalloc((size_t)q->cap * sizeof *q->tokens);
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    q->r.prompt = NULL;
    /* the text continues the prompt: a SentencePiece first token keeps its leading space */
    if (s->o.tok) {
        q->stream = tok_stream_new(s->o.tok, !r->keep_special);
        tok_stream_continue(q->stream);
    }
    q->t_submit = base_now();
    *out = q;
    return 0;
}

static void push_token(sreq *q, int32_t t) {
    if (q->n_tokens == q->cap) {
        q->cap *= 2;
        q->tokens = base_xrealloc(q->tokens, (size_t)q->cap * sizeof *q->tokens);
    }
    q->tokens[q->n_tokens++] = t;
}

static void held_append(sreq *q, const char *text, size_t len) {
    if (q->held_len + len + 1 > q->held_cap) {
        q->held_cap = (q->held_len + len + 1) * 2;
        q->held = base_xrealloc(q->held, q->held_cap);
    }
    memcpy(q->held + q->held_len, text, len);
    q->held_len += len;
    q->held[q->held_len] = 0;
}

/* How many bytes of the held text can be shown: up to the earliest stop string (*hit), else
 * all but the longest tail that is the start of a stop string (all of it when final). */
static size_t stop_scan(const sreq *q, bool final, int *hit) {
    size_t show = q->held_len;
    *hit = -1;
    /* before min_tokens, stop strings do not match: the text is shown as it comes */
    if (q->n_generated < q->r.min_tokens) return show;
    for (int i = 0; i < q->n_stop; i++) {
        const char *p = memmem(q->held, q->held_len, q->stop[i], q->stop_len[i]);
        if (p && (*hit < 0 || (size_t)(p - q->held) < show)) {
            show = (size_t)(p - q->held);
            *hit = i;
        }
    }
    if (*hit >= 0 || final) return show;
    size_t hold = 0;
    for (int i = 0; i < q->n_stop; i++) {
        size_t k = q->stop_len[i] - 1 < q->held_len ? q->stop_len[i] - 1 : q->held_len;
        for (; k > hold; k--)
            if (memcmp(q->held + q->held_len - k, q->stop[i], k) == 0) break;
        if (k > hold) hold = k;
    }
    return q->held_len - hold;
}

/* ---- grammars (step thread) ---- */

static void sched_grammar_free(sched_grammar *e) {
    gram_matcher_free(e->m);
    gram_free(e->g);
    free(e->text);
    free(e);
}

/* Gives q a state of the matcher for its grammar text, made from q's compiled grammar when no
 * matcher has that text yet. */
static void grammar_bind(engine_sched *s, sreq *q) {
    sched_grammar *e = NULL;
    for (int i = 0; i < s->n_grams && !e; i++)
        if (strcmp(s->grams[i]->text, q->grammar_text) == 0) e = s->grams[i];
    if (e) {
        gram_free(q->grammar);
        free(q->grammar_text);
    } else {
        e = base_xcalloc(1, sizeof *e);
        e->text = q->grammar_text;
        e->g = q->grammar;
        e->m = gram_matcher_new(e->g, s->gvocab);
        if (s->n_grams == s->cap_grams) {
            s->cap_grams = s->cap_grams ? 2 * s->cap_grams : 8;
            s->grams = base_xrealloc(s->grams, (size_t)s->cap_grams * sizeof *s->grams);
        }
        s->grams[s->n_grams++] = e;
    }
    q->grammar_text = NULL;
    q->grammar = NULL;
    e->refs++;
    e->used = ++s->gram_clock;
    q->gram = e;
    q->gstate = gram_state_new(e->m);
}

/* Drops q's state; past SCHED_IDLE_MATCHERS unused matchers, the least recently used goes. */
static void grammar_release(engine_sched *s, sreq *q) {
    if (!q->gstate) return;
    gram_state_free(q->gstate);
    q->gstate = NULL;
    q->gram->refs--;
    q->gram = NULL;
    int idle = 0, oldest = -1;
    for (int i = 0; i < s->n_grams; i++) {
        if (s->grams[i]->refs) continue;
        idle++;
        if (oldest < 0 || s->grams[i]->used < s->grams[oldest]->used) oldest = i;
    }
    if (idle <= SCHED_IDLE_MATCHERS) return;
    sched_grammar_free(s->grams[oldest]);
    s->grams[oldest] = s->grams[--s->n_grams];
}

static bool mask_empty(const uint32_t *mask, int words) {
    for (int w = 0; w < words; w++)
        if (mask[w]) return false;
    return true;
}

/* Points pk at q's allowed set for this step: what the grammar allows next, and the EOS ids
 * where it may end (the matcher's masks hold a special token only where a token terminal names
 * it, so the EOS ids are added here, which keeps the mask one pass over the row). */
static int constrain(engine_sched *s, sreq *q, engine_pick *pk, uint32_t *mask, base_err *err) {
    if (!q->gstate) grammar_bind(s, q);
    if (gram_state_mask(q->gstate, mask, err)) return -1;
    int n_tok = gram_vocab_size(s->gvocab);
    if (gram_state_can_end(q->gstate) && !q->r.ignore_eos)
        for (int i = 0; i < s->n_eos; i++)
            if (s->eos[i] < n_tok) mask[s->eos[i] / 32] |= 1u << (s->eos[i] % 32);
    if (mask_empty(mask, gram_mask_words(s->gvocab)))
        return base_fail(err, "grammar: no token of the vocabulary can continue the output here");
    pk->allowed = mask;
    pk->allowed_vocab = s->gvocab;
    return 0;
}

/* ---- events ---- */

static engine_event event_for(const sreq *q) {
    return (engine_event){.id = q->id,
                          .token = -1,
                          .stop_index = -1,
                          .n_prompt = q->n_prompt,
                          .n_generated = q->n_generated,
                          .n_cached = q->n_cached,
                          .seconds_to_first_token = q->ttft};
}

static void snapshot_stats(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->stats.pool = kv_pool_get_stats(s->rt->pool);
    s->stats.local_pool = kv_pool_get_local_stats(s->rt->pool);
    s->stats.running = s->n_running;
    s->stats.waiting = s->n_waiting;
    s->stats.matchers = s->n_grams;
    pthread_mutex_unlock(&s->mu);
}

/* Frees the request's KV (so that the pool shows it before the client hears of the end),
 * sends the final event and frees the request. `ev` may carry the last token. */
static void finish(engine_sched *s, sreq *q, engine_event *ev, engine_finish why,
                   const char *error) {
    if (q->seq) kv_seq_free(s->rt->pool, q->seq);
    q->seq = NULL;
    grammar_release(s, q);
    pthread_mutex_lock(&s->mu);
    if (why == ENGINE_FINISH_CANCELLED)
        s->stats.requests_cancelled++;
    else
        s->stats.requests_done++;
    pthread_mutex_unlock(&s->mu);
    snapshot_stats(s);
    ev->finish = why;
    ev->error = error;
    q->r.on_event(q->r.ctx, ev);
    sreq_free(q);
}

static void finish_plain(engine_sched *s, sreq *q, engine_finish why, const char *error) {
    engine_event ev = event_for(q);
    finish(s, q, &ev, why, error);
}

/* ---- queue and running set ---- */

static void waiting_insert(engine_sched *s, int at, sreq *q) {
    if (s->n_waiting == s->waiting_cap) {
        s->waiting_cap = s->waiting_cap ? 2 * s->waiting_cap : 16;
        s->waiting = base_xrealloc(s->waiting, (size_t)s->waiting_cap * sizeof *s->waiting);
    }
    memmove(s->waiting + at + 1, s->waiting + at, (size_t)(s->n_waiting - at) * sizeof(sreq *));
    s->waiting[at] = q;
    s->n_waiting++;
}

static sreq *waiting_remove(engine_sched *s, int at) {
    sreq *q = s->waiting[at];
    memmove(s->waiting + at, s->waiting + at + 1, (size_t)(s->n_waiting - at - 1) * sizeof(sreq *));
    s->n_waiting--;
    return q;
}

static void running_remove(engine_sched *s, sreq *q) {
    for (int i = 0; i < s->n_running; i++)
        if (s->running[i] == q) {
            memmove(s->running + i, s->running + i + 1,
                    (size_t)(s->n_running - i - 1) * sizeof(sreq *));
            s->n_running--;
            return;
        }
}

/* Drops the request's KV and puts it at the head of the queue, to be recomputed. */
static void preempt(engine_sched *s, sreq *q) {
    kv_seq_free(s->rt->pool, q->seq);
    q->seq = NULL;
    running_remove(s, q);
    pthread_mutex_lock(&s->mu);
    waiting_insert(s, 0, q);
    s->stats.preemptions++;
    pthread_mutex_unlock(&s->mu);
}

/* While draining (mu held): the waiting requests never admitted leave the queue for `out`
 * (capacity n_waiting); returns how many. */
static int take_unstarted(engine_sched *s, sreq **out) {
    int n = 0;
    for (int i = 0; s->draining && i < s->n_waiting;)
        if (!s->waiting[i]->admitted)
            out[n++] = waiting_remove(s, i);
        else
            i++;
    return n;
}

static void apply_cancels(engine_sched *s, const uint64_t *ids, int n) {
    for (int k = 0; k < n; k++) {
        sreq *q = NULL;
        pthread_mutex_lock(&s->mu);
        for (int i = 0; i < s->n_waiting && !q; i++)
            if (s->waiting[i]->id == ids[k]) q = waiting_remove(s, i);
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < s->n_running && !q; i++)
            if (s->running[i]->id == ids[k]) {
                q = s->running[i];
                running_remove(s, q);
            }
        if (q) finish_plain(s, q, ENGINE_FINISH_CANCELLED, NULL);
    }
}

/* ---- one step ---- */

static int pending(const sreq *q) {
    return q->n_tokens - kv_seq_len(q->seq);
}

/* Takes q out of the step's plan, giving its tokens back to the budget. */
static void entries_remove(step_entry *e, int *n, const sreq *q, int *budget) {
    for (int i = 0; i < *n; i++)
        if (e[i].q == q) {
            *budget += e[i].q_len;
            memmove(e + i, e + i + 1, (size_t)(*n - i - 1) * sizeof *e);
            (*n)--;
            return;
        }
}

/* Reserves q_len slots for q, preempting the newest running requests while blocks are short.
 * Returns false when q itself had to go (preempted, or failed when it runs alone). */
static bool reserve(engine_sched *s, sreq *q, int q_len, int *n_entries, int *budget,
                    bool *preempted) {
    base_err err;
    for (;;) {
        int have = kv_seq_len(q->seq);
        if (kv_seq_append(s->rt->pool, q->seq, q->tokens + have, q_len, &err) == 0) return true;
        /* the running set is in admission order: the newest is last */
        sreq *victim = s->running[s->n_running - 1];
        if (victim == q && s->n_running == 1) {
            running_remove(s, q);
            finish_plain(s, q, ENGINE_FINISH_ERROR, err.msg);
            return false;
        }
        entries_remove(s->entries, n_entries, victim, budget);
        preempt(s, victim);
        *preempted = true;
        if (victim == q) return false;
    }
}

/* Plans the step: decode rows first (every running request that has one token pending), then
 * prefill slices of running requests, oldest first. Returns the number of entries. */
static int plan_running(engine_sched *s, int *budget, bool *preempted) {
    int n = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i<s->n_running && * budget> 0; i++) {
            sreq *q = s->running[i];
            int p = pending(q);
            if (p <= 0 || (pass == 0) != (p == 1)) continue;
            int len = p < s->o.prefill_chunk ? p : s->o.prefill_chunk;
            if (len > *budget) len = *budget;
            if (!reserve(s, q, len, &n, budget, preempted)) {
                i--; /* the running set shifted down under us */
                continue;
            }
            s->entries[n++] = (step_entry){q, len};
            *budget -= len;
        }
    }
    return n;
}

/* Admits waiting requests while there is room, budget and blocks; a request that does not fit
 * goes back to the head of the queue (admission never preempts). */
static int admit(engine_sched *s, int n, int *budget) {
    while (s->n_running<s->o.n_parallel && * budget> 0) {
        pthread_mutex_lock(&s->mu);
        sreq *q = s->n_waiting ? waiting_remove(s, 0) : NULL;
        pthread_mutex_unlock(&s->mu);
        if (!q) break;
        q->seq = kv_seq_create(s->rt->pool);
        int adopted = kv_seq_adopt_prefix(s->rt->pool, q->seq, q->tokens, q->n_tokens);
        if (!q->admitted) q->n_cached = adopted < q->n_prompt ? adopted : q->n_prompt;
        int p = pending(q);
        int len = p < s->o.prefill_chunk ? p : s->o.prefill_chunk;
        if (len > *budget) len = *budget;
        base_err err;
        if (kv_seq_append(s->rt->pool, q->seq, q->tokens + adopted, len, &err)) {
            kv_seq_free(s->rt->pool, q->seq);
            q->seq = NULL;
            pthread_mutex_lock(&s->mu);
            waiting_insert(s, 0, q);
            pthread_mutex_unlock(&s->mu);
            break;
        }
        if (!q->admitted) {
            pthread_mutex_lock(&s->mu);
            s->stats.cached_tokens += (uint64_t)q->n_cached;
            pthread_mutex_unlock(&s->mu);
        }
        q->admitted = true;
        q->admit_order = ++s->admit_counter;
        s->running[s->n_running++] = q;
        s->entries[n++] = (step_entry){q, len};
        *budget -= len;
    }
    return n;
}

/* Shows what the stop strings allow of the held text, then the final flush when done. */
static void emit_text(sreq *q, engine_event *ev, bool final, int *stop_hit) {
    size_t show = stop_scan(q, final, stop_hit);
    ev->text = q->held;
    ev->text_len = show;
}

/* After the event was delivered: drops the shown text from the held buffer. */
static void consume_text(sreq *q, size_t shown) {
    if (shown == 0) return;
    memmove(q->held, q->held + shown, q->held_len - shown);
    q->held_len -= shown;
    q->held[q->held_len] = 0;
}

static bool is_eos(const engine_sched *s, int32_t t) {
    for (int i = 0; i < s->n_eos; i++)
        if (s->eos[i] == t) return true;
    return false;
}

static bool is_stop_id(const sreq *q, int32_t t) {
    for (int i = 0; i < q->r.n_stop_ids; i++)
        if (q->stop_ids[i] == t) return true;
    return false;
}

/* Adds the detokenizer's piece for t (and its flush when final) to the held text. */
static int detok(sreq *q, int32_t t, bool final, base_err *err) {
    char *piece = NULL;
    size_t len = 0;
    if (t >= 0) {
        if (tok_stream_push(q->stream, t, &piece, &len, err)) return -1;
        held_append(q, piece, len);
        free(piece);
    }
    if (final) {
        if (tok_stream_flush(q->stream, &piece, &len, err)) return -1;
        held_append(q, piece, len);
        free(piece);
    }
    return 0;
}

/* Whether q's generated ids end with ids (n). */
static bool generated_ends_with(const sreq *q, const int32_t *ids, int n) {
    return n > 0 && q->n_tokens - q->n_prompt >= n &&
           memcmp(q->tokens + q->n_tokens - n, ids, (size_t)n * sizeof *ids) == 0;
}

/* Follows the thinking as tokens come: it opens with think_open among the first tokens (a few
 * blanks may come first), closes with think_close; the budget counts the tokens between. */
static void think_track(sreq *q) {
    if (q->think_done) return;
    if (q->forcing >= 0) {
        if (++q->forcing == q->r.n_think_close) q->forcing = -1, q->think_done = true;
        return;
    }
    if (!q->thinking) {
        q->thinking = generated_ends_with(q, q->think_open, q->r.n_think_open);
        q->think_done = !q->thinking && q->n_generated > q->r.n_think_open + 4;
        return;
    }
    if (generated_ends_with(q, q->think_close,
                            q->r.n_think_end ? q->r.n_think_end : q->r.n_think_close))
        q->think_done = true;
    else
        q->think_tokens++;
}

/* 1 when q's next token is forced to end its thinking, which is then the only one allowed; 0
 * when it is not; -1 when a grammar does not allow the forced token there. */
static int think_forced(engine_sched *s, sreq *q, engine_pick *pk, uint32_t *mask, base_err *err) {
    if (q->think_done || !q->thinking) return 0;
    if (q->forcing < 0 && q->think_tokens < q->r.reasoning_budget) return 0;
    if (q->forcing < 0) q->forcing = 0;
    int32_t t = q->think_close[q->forcing];
    if (q->gstate || q->grammar) { /* the forced ids go through the grammar like any other */
        if (!q->gstate) grammar_bind(s, q);
        if (gram_state_mask(q->gstate, mask, err)) return -1;
        if (!(mask[t / 32] >> (t % 32) & 1))
            return base_fail(err,
                             "the reasoning budget ends the thinking with token %d (closing id %d "
                             "of %d), which the grammar does not allow here",
                             t, q->forcing + 1, q->r.n_think_close);
    }
    memset(mask, 0, (size_t)gram_mask_words(s->gvocab) * sizeof *mask);
    mask[t / 32] |= 1u << (t % 32);
    pk->allowed = mask;
    pk->allowed_vocab = s->gvocab;
    return 1;
}

/* Takes q's sampled token (pk) and tells the client. Returns true when the request finished
 * (it is then out of the running set and freed). */
static bool take_token(engine_sched *s, sreq *q, const engine_pick *pk) {
    int32_t t = pk->token;
    push_token(q, t);
    if (++q->n_generated == 1) q->ttft = base_now() - q->t_submit;
    think_track(q);
    engine_event ev = event_for(q);
    ev.token = t;
    if (q->r.logprobs) {
        ev.n_top = q->r.top_logprobs;
        ev.logprob = pk->logprob;
        memcpy(ev.top_ids, pk->top_ids, (size_t)ev.n_top * sizeof *ev.top_ids);
        memcpy(ev.top_logprobs, pk->top_lp, (size_t)ev.n_top * sizeof *ev.top_logprobs);
    }
    if (q->n_generated == q->r.min_tokens && q->r.min_tokens > 0)
        engine_sampler_set_logit_bias(q->sampler, q->bias, q->r.sampling.n_logit_bias);
    bool eos = (!q->r.ignore_eos && is_eos(s, t)) || is_stop_id(q, t), closed = false;
    if (q->gstate && !eos) {
        base_err err;
        if (gram_state_accept(q->gstate, t, &err)) {
            running_remove(s, q);
            finish(s, q, &ev, ENGINE_FINISH_ERROR, err.msg);
            return true;
        }
        closed = gram_state_done(q->gstate);
    }
    engine_finish why = eos || closed                        ? ENGINE_FINISH_STOP
                        : q->n_generated == q->max_generated ? ENGINE_FINISH_LENGTH
                        : q->n_tokens >= s->o.ctx_size       ? ENGINE_FINISH_LENGTH
                                                             : ENGINE_FINISH_NONE;
    if (q->stream) {
        base_err err;
        if (detok(q, eos ? -1 : t, why != ENGINE_FINISH_NONE, &err)) {
            running_remove(s, q);
            finish(s, q, &ev, ENGINE_FINISH_ERROR, err.msg);
            return true;
        }
        int hit;
        emit_text(q, &ev, why != ENGINE_FINISH_NONE, &hit);
        if (hit >= 0) why = ENGINE_FINISH_STOP;
        ev.stop_index = hit;
    }
    if (why == ENGINE_FINISH_NONE) {
        q->r.on_event(q->r.ctx, &ev);
        consume_text(q, ev.text_len);
        return false;
    }
    running_remove(s, q);
    finish(s, q, &ev, why, NULL);
    return true;
}

/* Builds the batch of the planned entries and queues the model's step (finish_forward ends it).
 * The logits rows are those of the entries whose slice reaches the end of their history, in
 * entry order. */
static int run_forward(engine_sched *s, int n, base_err *err) {
    int off = 0, n_out = 0;
    for (int i = 0; i < n; i++) {
        sreq *q = s->entries[i].q;
        int len = s->entries[i].q_len, start = kv_seq_len(q->seq) - len;
        s->seqs[i] = q->seq;
        s->q_lens[i] = len;
        memcpy(s->step_tokens + off, q->tokens + start, (size_t)len * sizeof *s->step_tokens);
        if (start + len == q->n_tokens) s->out_rows[n_out++] = off + len - 1;
        off += len;
    }
    kv_batch batch;
    if (kv_batch_build(s->rt->pool, s->seqs, s->q_lens, n, &batch, err)) return -1;
    int rc = model_forward_queue(s->rt->model, s->rt->pool, &batch, s->step_tokens, s->out_rows,
                                 n_out, err);
    kv_batch_free(&batch);
    return rc;
}

/* Waits for the queued step and commits the K/V it wrote (a failed step's blocks never reach
 * the prefix cache). */
static int finish_forward(engine_sched *s, int n, base_err *err) {
    if (s->rt->be->ops->sync(s->rt->be, err)) return -1;
    for (int i = 0; i < n; i++) kv_seq_commit(s->rt->pool, s->seqs[i]);
    return 0;
}

/* Sets up a pick for every entry whose slice reached the end of its history, with its allowed
 * set where it has one (on the host, while the backend runs the step); returns how many. */
static int plan_picks(engine_sched *s, int n) {
    int rows = 0;
    for (int i = 0; i < n; i++) {
        sreq *q = s->entries[i].q;
        if (pending(q) != 0) continue;
        engine_pick *pk = &s->picks[rows++];
        *pk = (engine_pick){.sampler = q->sampler,
                            .history = q->tokens,
                            .n_history = q->n_tokens,
                            .top_logprobs = q->r.logprobs ? q->r.top_logprobs : -1};
        if (!q->gstate && !q->grammar && q->think_done) continue;
        int words = gram_mask_words(s->gvocab);
        if (!s->masks)
            s->masks = base_xmalloc((size_t)s->o.n_parallel * (size_t)words * sizeof *s->masks);
        uint32_t *mask = s->masks + (size_t)(rows - 1) * (size_t)words;
        base_err err;
        int forced = think_forced(s, q, pk, mask, &err);
        /* on an error the row stays in the batch (rows follow the entries); its pick is
         * dropped */
        if (forced < 0) q->gram_error = base_xstrdup(err.msg);
        if (forced || (!q->gstate && !q->grammar)) continue;
        if (constrain(s, q, pk, mask, &err)) q->gram_error = base_xstrdup(err.msg);
    }
    return rows;
}

/* Samples the planned picks (their logits rows, in entry order, are in backend memory) and
 * tells the clients; returns how many tokens were sampled. */
static int sample_step(engine_sched *s, int n, int rows) {
    if (rows == 0) return 0;
    base_err err;
    be_tensor logits = model_logits(s->rt->model, rows);
    int rc = engine_picker_run(s->picker, s->rt->be, &logits, s->picks, rows, &err);
    int row = 0, sampled = 0;
    for (int i = 0; i < n; i++) {
        sreq *q = s->entries[i].q;
        if (pending(q) != 0) continue;
        const engine_pick *pk = &s->picks[row++];
        if (rc == 0 && !q->gram_error) {
            take_token(s, q, pk);
            sampled++;
        } else {
            running_remove(s, q);
            finish_plain(s, q, ENGINE_FINISH_ERROR, rc ? err.msg : q->gram_error);
        }
    }
    return sampled;
}

static void step(engine_sched *s) {
    double t0 = base_now();
    int budget = s->o.max_batch_tokens;
    bool preempted = false;
    int n = plan_running(s, &budget, &preempted);
    if (!preempted) n = admit(s, n, &budget);
    double fwd = 0, t_fwd = base_now();
    base_err err;
    bool failed = n > 0 && run_forward(s, n, &err);
    int rows = failed ? 0 : plan_picks(s, n);
    if (!failed && n > 0) failed = finish_forward(s, n, &err);
    if (failed) {
        for (int i = 0; i < n; i++) {
            running_remove(s, s->entries[i].q);
            finish_plain(s, s->entries[i].q, ENGINE_FINISH_ERROR, err.msg);
        }
        n = rows = 0;
    }
    if (n > 0) fwd = base_now() - t_fwd;
    uint64_t computed = 0;
    for (int i = 0; i < n; i++) computed += (uint64_t)s->entries[i].q_len;
    int row = sample_step(s, n, rows);
    pthread_mutex_lock(&s->mu);
    s->stats.steps++;
    s->stats.generated_tokens += (uint64_t)row;
    s->stats.computed_tokens += computed;
    s->stats.step_seconds += base_now() - t0;
    s->stats.forward_seconds += fwd;
    pthread_mutex_unlock(&s->mu);
    snapshot_stats(s);
}

/* ---- the thread ---- */

/* A job for the step thread between two steps, on its caller's stack until done. */
typedef struct between {
    struct between *next;
    engine_between_fn fn;
    void *ctx;
    bool taken, done; /* under mu */
    int rc;
    base_err err;
} between;

/* Runs the jobs taken off the list, oldest first, and says each is done. */
static void run_between(engine_sched *s, between *jobs) {
    between *order = NULL;
    while (jobs) {
        between *next = jobs->next;
        jobs->next = order;
        order = jobs;
        jobs = next;
    }
    for (between *j = order, *next; j; j = next) {
        next = j->next;
        int rc = j->fn(j->ctx, s->rt, &j->err);
        pthread_mutex_lock(&s->mu);
        j->rc = rc;
        j->done = true;
        pthread_cond_broadcast(&s->idle_cv);
        pthread_mutex_unlock(&s->mu);
    }
    snapshot_stats(s);
}

/* Between steps, the pool is the step thread's to change: answers the erases asked so far. */
static void erase_cache(engine_sched *s, uint64_t ticket) {
    int64_t n = kv_pool_drop_cached(s->rt->pool);
    snapshot_stats(s);
    pthread_mutex_lock(&s->mu);
    s->erased = n;
    s->erase_done = ticket;
    pthread_cond_broadcast(&s->idle_cv);
    pthread_mutex_unlock(&s->mu);
}

static bool runnable(const engine_sched *s) {
    return (s->n_waiting > 0 || s->n_running > 0) && s->step_limit != 0;
}

static void *sched_main(void *arg) {
    engine_sched *s = arg;
    uint64_t *cancels = NULL;
    int cap = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        int n_unstarted = s->draining ? s->n_waiting : 0;
        sreq **unstarted =
            n_unstarted ? base_xmalloc((size_t)n_unstarted * sizeof *unstarted) : NULL;
        n_unstarted = unstarted ? take_unstarted(s, unstarted) : 0;
        if (n_unstarted) {
            pthread_mutex_unlock(&s->mu);
            for (int i = 0; i < n_unstarted; i++)
                finish_plain(s, unstarted[i], ENGINE_FINISH_CANCELLED, NULL);
            pthread_mutex_lock(&s->mu);
        }
        free(unstarted);
        while (!s->stopping && s->n_cancels == 0 && !runnable(s) &&
               s->erase_done == s->erase_asked && !s->between) {
            s->idle = true;
            pthread_cond_broadcast(&s->idle_cv);
            pthread_cond_wait(&s->wake, &s->mu);
        }
        s->idle = false;
        if (s->stopping) break;
        int n = s->n_cancels;
        if (n > cap) {
            cap = s->cancels_cap;
            cancels = base_xrealloc(cancels, (size_t)cap * sizeof *cancels);
        }
        if (n) memcpy(cancels, s->cancels, (size_t)n * sizeof *cancels);
        s->n_cancels = 0;
        bool go = runnable(s);
        if (go && s->step_limit > 0) s->step_limit--;
        uint64_t erase = s->erase_asked;
        between *jobs = s->between;
        s->between = NULL;
        for (between *j = jobs; j; j = j->next) j->taken = true;
        pthread_mutex_unlock(&s->mu);
        apply_cancels(s, cancels, n);
        if (erase != s->erase_done) erase_cache(s, erase);
        if (jobs) run_between(s, jobs);
        if (go) step(s);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    free(cancels);
    while (s->n_running > 0) {
        sreq *q = s->running[s->n_running - 1];
        s->n_running--;
        finish_plain(s, q, ENGINE_FINISH_CANCELLED, NULL);
    }
    for (;;) {
        pthread_mutex_lock(&s->mu);
        sreq *q = s->n_waiting ? waiting_remove(s, 0) : NULL;
        pthread_mutex_unlock(&s->mu);
        if (!q) break;
        finish_plain(s, q, ENGINE_FINISH_CANCELLED, NULL);
    }
    return NULL;
}

static void resolve_options(const engine_runtime *rt, const engine_sched_options *in,
                            engine_sched_options *o) {
    *o = *in;
    if (o->n_parallel <= 0) o->n_parallel = rt->kv_plan.n_parallel > 0 ? rt->kv_plan.n_parallel : 1;
    if (o->max_batch_tokens <= 0) o->max_batch_tokens = SCHED_DEFAULT_BATCH_TOKENS;
    /* every running sequence must get its decode row in every step */
    if (o->max_batch_tokens < o->n_parallel) o->max_batch_tokens = o->n_parallel;
    if (o->prefill_chunk <= 0) o->prefill_chunk = engine_prefill_chunk(rt->be);
    if (o->ctx_size <= 0 || o->ctx_size > rt->kv_plan.ctx_size) o->ctx_size = rt->kv_plan.ctx_size;
}

int engine_sched_start(engine_runtime *rt, const engine_sched_options *opts, engine_sched **out,
                       base_err *err) {
    engine_sched *s = base_xcalloc(1, sizeof *s);
    s->rt = rt;
    resolve_options(rt, opts, &s->o);
    /* a longer step than the pool's local group was sized for could need more of its blocks
     * than one sequence may ever get */
    if (kv_pool_has_local(rt->pool) && s->o.prefill_chunk > rt->kv_plan.prefill_step) {
        int chunk = s->o.prefill_chunk;
        free(s);
        return base_fail(err,
                         "prefill chunk %d is longer than the %d-token step the KV pool's "
                         "local layers were sized for (engine_options.prefill_chunk)",
                         chunk, rt->kv_plan.prefill_step);
    }
    const io_model_config *c = model_config(rt->model);
    s->vocab = c->vocab_size;
    s->eos = base_xmalloc((size_t)(c->n_eos + opts->n_eos + 1) * sizeof *s->eos);
    for (int i = 0; i < c->n_eos; i++) s->eos[s->n_eos++] = c->eos_token_ids[i];
    for (int i = 0; i < opts->n_eos; i++)
        if (opts->eos_ids[i] >= 0) s->eos[s->n_eos++] = opts->eos_ids[i];
    s->o.eos_ids = s->eos;
    s->o.n_eos = s->n_eos;
    int np = s->o.n_parallel;
    s->running = base_xcalloc((size_t)np, sizeof *s->running);
    s->entries = base_xcalloc((size_t)np, sizeof *s->entries);
    s->seqs = base_xcalloc((size_t)np, sizeof *s->seqs);
    s->q_lens = base_xcalloc((size_t)np, sizeof *s->q_lens);
    s->out_rows = base_xcalloc((size_t)np, sizeof *s->out_rows);
    s->step_tokens = base_xmalloc((size_t)s->o.max_batch_tokens * sizeof *s->step_tokens);
    s->picker = engine_picker_new(s->vocab);
    s->picks = base_xcalloc((size_t)np, sizeof *s->picks);
    s->step_limit = -1;
    s->next_id = 1;
    s->stats.pool = kv_pool_get_stats(rt->pool);
    s->stats.local_pool = kv_pool_get_local_stats(rt->pool);
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->vocab_mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    pthread_cond_init(&s->idle_cv, NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s)) {
        s->thread = 0;
        engine_sched_stop(s);
        return base_fail(err, "scheduler: cannot start its thread");
    }
    *out = s;
    return 0;
}

void engine_sched_stop(engine_sched *s) {
    if (!s) return;
    if (s->thread) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_signal(&s->wake);
        pthread_cond_broadcast(&s->idle_cv); /* erases waiting for the thread give up */
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->vocab_mu);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->idle_cv);
    free(s->eos);
    free(s->waiting);
    free(s->cancels);
    free(s->running);
    free(s->entries);
    free(s->seqs);
    free(s->q_lens);
    free(s->out_rows);
    free(s->step_tokens);
    engine_picker_free(s->picker);
    free(s->picks);
    /* every request has ended on the step thread, which released its state */
    for (int i = 0; i < s->n_grams; i++) sched_grammar_free(s->grams[i]);
    free(s->grams);
    free(s->masks);
    gram_vocab_free(s->gvocab);
    free(s);
}

int engine_submit(engine_sched *s, const engine_request *r, uint64_t *id, engine_reject *why,
                  base_err *err) {
    sreq *q;
    *why = ENGINE_REJECT_INVALID;
    if (sreq_new(s, r, &q, err)) return -1;
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->draining)
        *why = ENGINE_REJECT_STOPPED;
    else if (s->o.max_queue > 0 && s->n_waiting >= s->o.max_queue)
        *why = ENGINE_REJECT_BUSY;
    else
        *why = ENGINE_REJECT_NONE;
    if (*why == ENGINE_REJECT_NONE) {
        q->id = *id = s->next_id++;
        waiting_insert(s, s->n_waiting, q);
        s->stats.waiting = s->n_waiting;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    if (*why == ENGINE_REJECT_NONE) return 0;
    sreq_free(q);
    if (*why == ENGINE_REJECT_BUSY)
        return base_fail(err, "the queue is full (%d waiting; --max-queue)", s->o.max_queue);
    return base_fail(err, "the server is shutting down");
}

void engine_sched_drain(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
    s->draining = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void engine_cancel(engine_sched *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    if (s->n_cancels == s->cancels_cap) {
        s->cancels_cap = s->cancels_cap ? 2 * s->cancels_cap : 16;
        s->cancels = base_xrealloc(s->cancels, (size_t)s->cancels_cap * sizeof *s->cancels);
    }
    s->cancels[s->n_cancels++] = id;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

int64_t engine_sched_erase_cache(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t ticket = ++s->erase_asked;
    pthread_cond_signal(&s->wake);
    while (!s->stopping && s->erase_done < ticket) pthread_cond_wait(&s->idle_cv, &s->mu);
    int64_t n = s->erase_done >= ticket ? s->erased : 0;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int engine_sched_batch_tokens(const engine_sched *s) {
    return s->o.max_batch_tokens;
}

int engine_sched_run_between(engine_sched *s, engine_between_fn fn, void *ctx, base_err *err) {
    between j = {.fn = fn, .ctx = ctx};
    pthread_mutex_lock(&s->mu);
    j.next = s->between;
    s->between = &j;
    pthread_cond_signal(&s->wake);
    /* a job the thread has taken runs to its end, even past a stop: it is on this stack */
    while (!j.done && !(s->stopping && !j.taken)) pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    if (!j.done) return base_fail(err, "the scheduler is stopping");
    if (j.rc) *err = j.err;
    return j.rc;
}

engine_sched_stats engine_sched_get_stats(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
    engine_sched_stats st = s->stats;
    pthread_mutex_unlock(&s->mu);
    return st;
}

void engine_sched_set_step_limit(engine_sched *s, int64_t steps) {
    pthread_mutex_lock(&s->mu);
    s->step_limit = steps;
    s->idle = false;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void engine_sched_wait_idle(engine_sched *s) {
    pthread_mutex_lock(&s->mu);
    while (!s->idle) pthread_cond_wait(&s->idle_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}
