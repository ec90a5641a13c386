/* The k best of a stream: a bounded min-heap, heapified once it is full, then heap-sorted.
 * O(n log k) for n pushes, no allocation; the sampler and the CPU candidates op share it so
 * that both order ties the same way. */
#include "base/base.h"

static bool topk_worse(const base_topk *t, int a, int b) {
    return t->val[a] < t->val[b] || (t->val[a] == t->val[b] && t->id[a] > t->id[b]);
}

static void topk_swap(base_topk *t, int a, int b) {
    float v = t->val[a];
    t->val[a] = t->val[b];
    t->val[b] = v;
    int32_t i = t->id[a];
    t->id[a] = t->id[b];
    t->id[b] = i;
}

/* Sift-down of entry i within the first n entries. */
static void topk_sift(base_topk *t, int n, int i) {
    for (;;) {
        int m = i, a = 2 * i + 1, b = a + 1;
        if (a < n && topk_worse(t, a, m)) m = a;
        if (b < n && topk_worse(t, b, m)) m = b;
        if (m == i) return;
        topk_swap(t, i, m);
        i = m;
    }
}

static void topk_heapify(base_topk *t) {
    for (int i = t->n / 2 - 1; i >= 0; i--) topk_sift(t, t->n, i);
}

void base_topk_push(base_topk *t, float val, int32_t id) {
    if (t->k <= 0) return;
    if (t->n < t->k) {
        t->val[t->n] = val;
        t->id[t->n] = id;
        if (++t->n == t->k) topk_heapify(t);
        return;
    }
    if (val < t->val[0] || (val == t->val[0] && id >= t->id[0])) return;
    t->val[0] = val;
    t->id[0] = id;
    topk_sift(t, t->k, 0);
}

int base_topk_finish(base_topk *t) {
    if (t->n < t->k) topk_heapify(t);
    /* Repeatedly move the worst to the end: best first. */
    for (int end = t->n - 1; end > 0; end--) {
        topk_swap(t, 0, end);
        topk_sift(t, end, 0);
    }
    return t->n;
}
