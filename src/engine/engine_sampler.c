/* The sampler chain (llama-server order) and log-probabilities, on a full row of host logits
 * or on the candidates the backend chose from logits it keeps (the picker). */
#include "engine/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct engine_sampler {
    engine_sampling p;
    engine_logit_bias *bias; /* (p.n_logit_bias), owned copy */
    int vocab;
    uint64_t rng[4];       /* xoshiro256** state */
    int32_t *counts;       /* (vocab) occurrences in the penalty window; kept all-zero */
    int32_t *cand_id;      /* (vocab) candidates */
    float *cand_logit;     /* (vocab) */
    be_logit_adj *adj;     /* (cap_adj) the last engine_sampler_adjustments, sorted */
    be_logit_adj *adj_raw; /* (cap_adj) the same in chain order */
    uint64_t *adj_order;   /* (cap_adj) token << 32 | chain position: sorts stably */
    int cap_adj;
};

void engine_sampling_defaults(engine_sampling *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    *s = (engine_sampling){.temperature = 0.8f,
                           .top_k = 40,
                           .top_p = 0.95f,
                           .min_p = 0.05f,
                           .repeat_penalty = 1.0f,
                           .repeat_last_n = 64,
                           .seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
                                   ((uint64_t)getpid() << 40)};
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1). */
static double rng_uniform(uint64_t *s) {
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

void engine_sampler_set_logit_bias(engine_sampler *s, const engine_logit_bias *bias, int n) {
    free(s->bias);
    s->bias = NULL;
    if (n > 0) {
        s->bias = base_xmalloc((size_t)n * sizeof *s->bias);
        memcpy(s->bias, bias, (size_t)n * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    s->p.n_logit_bias = n;
}

int engine_sampler_new(const engine_sampling *p, int vocab, engine_sampler **out, base_err *err) {
    if (isnan(p->temperature)) return base_fail(err, "sampling: temperature is NaN");
    if (!(p->top_p >= 0) || !(p->min_p >= 0) || p->min_p > 1)
        return base_fail(err, "sampling: top_p must be >= 0 and min_p in [0, 1]");
    if (!(p->repeat_penalty > 0)) return base_fail(err, "sampling: repeat_penalty must be > 0");
    if (isnan(p->presence_penalty) || isnan(p->frequency_penalty))
        return base_fail(err, "sampling: penalties must be numbers");
    for (int i = 0; i < p->n_logit_bias; i++)
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab)
            return base_fail(err, "sampling: logit_bias token %d is outside the vocabulary (%d)",
                             p->logit_bias[i].token, vocab);
    engine_sampler *s = base_xcalloc(1, sizeof *s);
    s->p = *p;
    s->vocab = vocab;
    if (p->n_logit_bias > 0) {
        s->bias = base_xmalloc((size_t)p->n_logit_bias * sizeof *s->bias);
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof *s->bias);
    }
    s->p.logit_bias = s->bias;
    uint64_t x = p->seed;
    for (int i = 0; i < 4; i++) s->rng[i] = splitmix64(&x);
    s->counts = base_xcalloc((size_t)vocab, sizeof *s->counts);
    s->cand_id = base_xmalloc((size_t)vocab * sizeof *s->cand_id);
    s->cand_logit = base_xmalloc((size_t)vocab * sizeof *s->cand_logit);
    *out = s;
    return 0;
}

void engine_sampler_free(engine_sampler *s) {
    if (!s) return;
    free(s->bias);
    free(s->counts);
    free(s->cand_id);
    free(s->cand_logit);
    free(s->adj);
    free(s->adj_raw);
    free(s->adj_order);
    free(s);
}

static void apply_penalties(engine_sampler *s, float *logits, const int32_t *hist, int n_hist) {
    const engine_sampling *p = &s->p;
    if (p->repeat_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return;
    int start = p->repeat_last_n < 0 || p->repeat_last_n > n_hist ? 0 : n_hist - p->repeat_last_n;
    for (int i = start; i < n_hist; i++)
        if (hist[i] >= 0 && hist[i] < s->vocab) s->counts[hist[i]]++;
    for (int i = start; i < n_hist; i++) {
        int32_t t = hist[i];
        if (t < 0 || t >= s->vocab || s->counts[t] == 0) continue;
        float l = logits[t];
        l = l <= 0 ? l * p->repeat_penalty : l / p->repeat_penalty;
        l -= (float)s->counts[t] * p->frequency_penalty + p->presence_penalty;
        logits[t] = l;
        s->counts[t] = 0; /* each distinct token penalised once; leaves counts all-zero */
    }
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Leaves the k best candidates in cand_* sorted by logit descending; returns how many. */
static int select_top(engine_sampler *s, const float *logits, int k) {
    base_topk t = {s->cand_logit, s->cand_id, k, 0};
    for (int i = 0; i < s->vocab; i++)
        if (!(isinf(logits[i]) && logits[i] < 0)) base_topk_push(&t, logits[i], i); /* banned */
    return base_topk_finish(&t);
}

static int choose(engine_sampler *s, const float *l, int n);

int32_t engine_sampler_next(engine_sampler *s, float *logits, const int32_t *history,
                            int n_history) {
    const engine_sampling *p = &s->p;
    for (int i = 0; i < p->n_logit_bias; i++)
        logits[p->logit_bias[i].token] += p->logit_bias[i].bias;
    apply_penalties(s, logits, history, n_history);
    if (p->temperature <= 0) return argmax(logits, s->vocab);

    int k = p->top_k > 0 && p->top_k < s->vocab ? p->top_k : s->vocab;
    int n = select_top(s, logits, k);
    if (n == 0) return argmax(logits, s->vocab); /* everything banned: nothing better to do */
    return s->cand_id[choose(s, s->cand_logit, n)];
}

/* top-p, min-p, temperature and the draw over n >= 1 candidates l (logit descending, after
 * top-k); returns the chosen index. When the candidates are only the row's best (whole false),
 * `sum` is the whole row's sum of exp(l_i - l[0]); the choice is then made only when the
 * candidates decide it, and -1 (the generator untouched) says they do not. */
static int choose_from(engine_sampler *s, const float *l, int n, bool whole, double sum) {
    const engine_sampling *p = &s->p;
    /* probabilities before temperature, for top-p and min-p */
    if (whole) {
        sum = 0;
        for (int i = 0; i < n; i++) sum += exp((double)l[i] - l[0]);
    }
    bool inside = whole; /* whether every token kept is a candidate */
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int i = 0; i < n; i++) {
            cum += exp((double)l[i] - l[0]) / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                inside = true;
                break;
            }
        }
    }
    if (p->min_p > 0) {
        /* p_i >= min_p * p_max  <=>  l_i - l_0 >= log(min_p) */
        double floor_logit = l[0] + log(p->min_p);
        int keep = 1;
        while (keep < n && l[keep] >= floor_logit) keep++;
        /* a candidate below the floor puts every token after it below too */
        inside = inside || keep < n;
        n = keep;
    }
    /* Past the candidates, the draw's total is the row's sum only at temperature 1. */
    if (!inside && p->temperature != 1.0f) return -1;
    double total = 0;
    if (inside)
        for (int i = 0; i < n; i++) total += exp(((double)l[i] - l[0]) / p->temperature);
    else
        total = sum;
    uint64_t saved[4];
    memcpy(saved, s->rng, sizeof saved);
    double r = rng_uniform(s->rng) * total, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp(((double)l[i] - l[0]) / p->temperature);
        if (r < acc) return i;
    }
    if (inside) return n - 1;
    memcpy(s->rng, saved, sizeof saved);
    return -1;
}

static int choose(engine_sampler *s, const float *l, int n) {
    return choose_from(s, l, n, true, 0);
}

int engine_sampler_candidates(const engine_sampler *s) {
    if (s->p.temperature <= 0) return 1;
    int k = s->p.top_k > 0 && s->p.top_k < s->vocab ? s->p.top_k : s->vocab;
    return k <= BE_TOPK_MAX ? k : 0;
}

bool engine_sampler_wide(const engine_sampler *s) {
    return s->p.temperature > 0 && (s->p.top_k <= 0 || s->p.top_k >= s->vocab) &&
           s->vocab > BE_TOPK_MAX;
}

int engine_sampler_pick_wide(engine_sampler *s, const float *cand_logit, int n_cand, double lse) {
    if (n_cand <= 0 || !isfinite(lse) || !isfinite(cand_logit[0])) return -1;
    return choose_from(s, cand_logit, n_cand, false, exp(lse - (double)cand_logit[0]));
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The same arithmetic as apply_penalties and the bias loop of engine_sampler_next, as data:
 * every bias entry in order, then one penalty per distinct token of the window. */
int engine_sampler_adjustments(engine_sampler *s, const int32_t *hist, int n_hist,
                               const be_logit_adj **out) {
    const engine_sampling *p = &s->p;
    bool pen =
        p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    int start = p->repeat_last_n < 0 || p->repeat_last_n > n_hist ? 0 : n_hist - p->repeat_last_n;
    int cap = p->n_logit_bias + (pen ? n_hist - start : 0);
    if (cap > s->cap_adj) {
        s->cap_adj = cap;
        s->adj = base_xrealloc(s->adj, (size_t)cap * sizeof *s->adj);
        s->adj_raw = base_xrealloc(s->adj_raw, (size_t)cap * sizeof *s->adj_raw);
        s->adj_order = base_xrealloc(s->adj_order, (size_t)cap * sizeof *s->adj_order);
    }
    be_logit_adj *tmp = s->adj_raw;
    int n = 0;
    for (int i = 0; i < p->n_logit_bias; i++)
        tmp[n++] = (be_logit_adj){p->logit_bias[i].token, BE_ADJ_ADD, p->logit_bias[i].bias, 0};
    if (pen) {
        for (int i = start; i < n_hist; i++)
            if (hist[i] >= 0 && hist[i] < s->vocab) s->counts[hist[i]]++;
        for (int i = start; i < n_hist; i++) {
            int32_t t = hist[i];
            if (t < 0 || t >= s->vocab || s->counts[t] == 0) continue;
            float sub = (float)s->counts[t] * p->frequency_penalty + p->presence_penalty;
            tmp[n++] = (be_logit_adj){t, BE_ADJ_PENALTY, p->repeat_penalty, sub};
            s->counts[t] = 0;
        }
    }
    for (int i = 0; i < n; i++) s->adj_order[i] = (uint64_t)tmp[i].token << 32 | (uint32_t)i;
    if (n > 1) qsort(s->adj_order, (size_t)n, sizeof *s->adj_order, cmp_u64);
    for (int i = 0; i < n; i++) s->adj[i] = tmp[(uint32_t)s->adj_order[i]];
    *out = s->adj;
    return n;
}

int engine_sampler_pick(engine_sampler *s, const float *cand_logit, int n_cand) {
    if (n_cand <= 0) return -1;
    if (s->p.temperature <= 0) return 0;
    return choose(s, cand_logit, n_cand);
}

float engine_logprobs(const float *logits, int vocab, int32_t chosen, int top_n, int32_t *top_ids,
                      float *top_logprobs) {
    float mx = logits[argmax(logits, vocab)];
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    for (int j = 0; j < top_n; j++) {
        int32_t best = -1;
        for (int i = 0; i < vocab; i++) {
            bool taken = false;
            for (int q = 0; q < j && !taken; q++) taken = top_ids[q] == i;
            if (!taken && (best < 0 || logits[i] > logits[best])) best = i;
        }
        top_ids[j] = best;
        top_logprobs[j] = best >= 0 ? (float)(logits[best] - lse) : -INFINITY;
    }
    return (float)(logits[chosen] - lse);
}

struct engine_picker {
    int vocab;
    be_backend *be; /* whose host memory `full` is: the first backend run with */
    float *full;    /* (cap_full, vocab) downloaded rows; the chain adjusts them in place */
    int cap_full;
    float *raw;        /* (vocab) a row's raw copy, for log-probabilities */
    be_topk_row *reqs; /* (cap_rows) the rows served by candidates */
    int *req_pick;     /* (cap_rows) the pick each request serves */
    int32_t *n_cand;   /* (cap_rows) */
    double *lse;       /* (cap_rows) */
    int *early;        /* (cap_rows) picks known to need their full row before the op */
    int *late;         /* (cap_rows) picks whose candidates fell short of their logprobs */
    int cap_rows;
    be_logit_adj *adj; /* (cap_adj) every request's adjustments, back to back */
    int cap_adj;
    int32_t *cand_id;  /* (cap_cand) */
    float *cand_logit; /* (cap_cand) */
    int cap_cand;
};

engine_picker *engine_picker_new(int vocab) {
    engine_picker *p = base_xcalloc(1, sizeof *p);
    p->vocab = vocab;
    p->raw = base_xmalloc((size_t)vocab * sizeof *p->raw);
    return p;
}

void engine_picker_free(engine_picker *p) {
    if (!p) return;
    if (p->full) p->be->ops->free_host(p->be, p->full);
    free(p->raw);
    free(p->reqs);
    free(p->req_pick);
    free(p->n_cand);
    free(p->lse);
    free(p->early);
    free(p->late);
    free(p->adj);
    free(p->cand_id);
    free(p->cand_logit);
    free(p);
}

static void picker_reserve(engine_picker *p, int rows, int adj, int cand) {
    if (rows > p->cap_rows) {
        p->cap_rows = rows;
        p->reqs = base_xrealloc(p->reqs, (size_t)rows * sizeof *p->reqs);
        p->req_pick = base_xrealloc(p->req_pick, (size_t)rows * sizeof *p->req_pick);
        p->n_cand = base_xrealloc(p->n_cand, (size_t)rows * sizeof *p->n_cand);
        p->lse = base_xrealloc(p->lse, (size_t)rows * sizeof *p->lse);
        p->early = base_xrealloc(p->early, (size_t)rows * sizeof *p->early);
        p->late = base_xrealloc(p->late, (size_t)rows * sizeof *p->late);
    }
    if (adj > p->cap_adj) {
        p->cap_adj = adj > 2 * p->cap_adj ? adj : 2 * p->cap_adj;
        p->adj = base_xrealloc(p->adj, (size_t)p->cap_adj * sizeof *p->adj);
    }
    if (cand > p->cap_cand) {
        p->cap_cand = cand;
        p->cand_id = base_xrealloc(p->cand_id, (size_t)cand * sizeof *p->cand_id);
        p->cand_logit = base_xrealloc(p->cand_logit, (size_t)cand * sizeof *p->cand_logit);
    }
}

/* Queues the download of the logits rows `rows` (n) into full[0 .. n); they have landed after
 * the backend's next wait. */
static int fetch_rows(engine_picker *p, be_backend *be, const be_tensor *logits, const int *rows,
                      int n, base_err *err) {
    size_t bytes = (size_t)p->vocab * sizeof(float);
    if (n > p->cap_full) {
        if (p->full) p->be->ops->free_host(p->be, p->full);
        p->full = NULL;
        p->cap_full = 0;
        if (be->ops->alloc_host(be, (size_t)n * bytes, (void **)&p->full, err)) return -1;
        p->be = be;
        p->cap_full = n;
    }
    for (int j = 0; j < n; j++)
        if (be->ops->download_async(be, (char *)p->full + (size_t)j * bytes,
                                    (const char *)logits->data + (size_t)rows[j] * bytes, bytes,
                                    err))
            return -1;
    return 0;
}

/* The full-row path for the fetched rows: the allowed set, the chain and engine_logprobs. */
static void chain_rows(engine_picker *p, engine_pick *picks, const int *rows, int n) {
    for (int j = 0; j < n; j++) {
        engine_pick *k = &picks[rows[j]];
        float *row = p->full + (size_t)j * p->vocab;
        if (k->top_logprobs >= 0) memcpy(p->raw, row, (size_t)p->vocab * sizeof *row);
        if (k->allowed) gram_mask_apply(k->allowed_vocab, k->allowed, row, p->vocab);
        k->token = engine_sampler_next(k->sampler, row, k->history, k->n_history);
        if (k->top_logprobs >= 0)
            k->logprob =
                engine_logprobs(p->raw, p->vocab, k->token, k->top_logprobs, k->top_ids, k->top_lp);
    }
}

/* Fills k from its n candidates (raw logits when k wants log-probabilities: it then has no
 * adjustments); false, touching nothing, when they are too few for its log-probabilities. */
static bool pick_from(engine_pick *k, const int32_t *id, const float *l, int n, double lse) {
    int lp = k->top_logprobs;
    if (lp >= 0 && n < (lp > 1 ? lp : 1)) return false;
    int ks = engine_sampler_candidates(k->sampler), i;
    if (ks > 0) {
        i = engine_sampler_pick(k->sampler, l, n < ks ? n : ks);
    } else {
        i = engine_sampler_pick_wide(k->sampler, l, n, lse);
        if (i < 0) return false;
    }
    k->token = i < 0 ? 0 : id[i];
    if (lp >= 0) {
        k->logprob = (float)((double)l[i] - lse);
        for (int j = 0; j < lp; j++) {
            k->top_ids[j] = id[j];
            k->top_lp[j] = (float)((double)l[j] - lse);
        }
    }
    return true;
}

/* Sorts the picks into candidate requests (with their adjustments) and rows that need the full
 * row; returns how many requests. A sampler with top-k off and no adjustments asks for the
 * BE_TOPK_MAX best tokens and the row's log-sum-exp, and takes the full row later only when
 * those do not decide its pick. */
static int plan_picks(engine_picker *p, be_backend *be, engine_pick *picks, int n, int *n_early) {
    bool op = be->ops->topk_candidates != NULL;
    int nr = 0, na = 0, nc = 0;
    *n_early = 0;
    for (int i = 0; i < n; i++) {
        engine_pick *k = &picks[i];
        /* The backend applies an allowed set before it selects; but the raw row's log-sum-exp
         * (a wide pick's) and its best tokens (log-probabilities' alternatives) are then not
         * those of the row the chain sees, so such rows take the full row. */
        int ks = op ? engine_sampler_candidates(k->sampler) : 0;
        bool wide = op && ks == 0 && !k->allowed && engine_sampler_wide(k->sampler);
        if (wide) ks = BE_TOPK_MAX;
        const be_logit_adj *a = NULL;
        int m = ks ? engine_sampler_adjustments(k->sampler, k->history, k->n_history, &a) : 0;
        /* log-probabilities, and a wide pick's log-sum-exp, are of the raw logits: adjusted
         * candidates cannot give them */
        if (ks == 0 || ((k->top_logprobs >= 0 || wide) && m > 0) ||
            (k->allowed && k->top_logprobs >= 0)) {
            p->early[(*n_early)++] = i;
            continue;
        }
        int want = ks > k->top_logprobs ? ks : k->top_logprobs;
        picker_reserve(p, n, na + m, nc + want);
        if (m) memcpy(p->adj + na, a, (size_t)m * sizeof *a);
        int n_allowed = k->allowed ? gram_vocab_size(k->allowed_vocab) : 0;
        p->reqs[nr] = (be_topk_row){i,
                                    want,
                                    na,
                                    na + m,
                                    k->top_logprobs >= 0 || wide,
                                    k->allowed,
                                    n_allowed < p->vocab ? n_allowed : p->vocab};
        p->req_pick[nr++] = i;
        na += m;
        nc += want;
    }
    return nr;
}

int engine_picker_run(engine_picker *p, be_backend *be, const be_tensor *logits, engine_pick *picks,
                      int n, base_err *err) {
    picker_reserve(p, n, 0, 0);
    int n_early, n_late = 0;
    int nr = plan_picks(p, be, picks, n, &n_early);
    /* the full rows' copies are queued ahead of the op, which waits for them and its own */
    if (fetch_rows(p, be, logits, p->early, n_early, err)) return -1;
    if (nr) {
        if (be->ops->topk_candidates(be, logits, p->reqs, nr, p->adj, p->cand_id, p->cand_logit,
                                     p->n_cand, p->lse, err))
            return -1;
    } else if (n_early && be->ops->sync(be, err)) {
        return -1;
    }
    chain_rows(p, picks, p->early, n_early);
    for (int r = 0, off = 0; r < nr; off += p->reqs[r].k, r++) {
        double lse = p->reqs[r].want_lse ? p->lse[r] : 0;
        int i = p->req_pick[r];
        if (!pick_from(&picks[i], p->cand_id + off, p->cand_logit + off, p->n_cand[r], lse))
            p->late[n_late++] = i;
    }
    if (n_late == 0) return 0;
    if (fetch_rows(p, be, logits, p->late, n_late, err) || be->ops->sync(be, err)) return -1;
    chain_rows(p, picks, p->late, n_late);
    return 0;
}
