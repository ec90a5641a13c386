/* Sampling candidates on the GPU: per request, the k best tokens of a row of logits after
 * its adjustments (bias, penalties), so that k ids and logits cross PCIe instead of the
 * vocabulary (513 KB a row at vocab 128256).
 *
 * Design. One CTA of 1024 threads per request; a row (vocab floats) stays in L2 between
 * passes. With few requests (decode at batch 1) one CTA would leave all SMs but one idle over
 * its passes, so each row is split into slices, one CTA each selecting the slice's k best, and
 * one CTA per request then selects the k best of those: the k best of the row are among them.
 * On the H200, one row of 128256 at k 40: 66 us in one CTA, 10 + 9 us split in 32 (ncu); the
 * op's host round trip 114 us before, 36 us after. Each token gets a 64-bit key: the
 * order-preserving bits of its adjusted logit
 * (-0 folded into +0, as float comparison ties them) above the complement of its id, so
 * keys are distinct, larger key = better candidate, and equal logits rank the lower id
 * first: exactly the host sampler's order. A radix select over the keys, 8 bits a pass from
 * the top, narrows to the prefix of the k-th best key; it stops as soon as the bucket it is
 * in holds exactly the tokens still needed, which for real logits is after the 4 passes of
 * the logit's bits (the id's bits are only read on exact ties across the k-th place). One
 * more pass gathers the k keys into shared memory and a bitonic sort orders them.
 *
 * Adjustments: a request's list is sorted by token, so the first entry of each token applies
 * that token's entries in order (F32, no fused multiply-add, as the host does) and stores the
 * adjusted key; a shared-memory bitmap of adjusted tokens makes the row passes skip them and
 * each pass visits the short adjusted list instead. The raw row is never written, so a later
 * full download or log-sum-exp sees the model's logits.
 *
 * Allowed sets (a grammar's masks, a bit a token) are uploaded with the requests, 16 KB a row
 * at vocab 128256 instead of the row's 513 KB down: a token they leave out is skipped like -inf
 * in every pass, adjusted or not.
 *
 * Why not a sort of the whole row or a per-thread heap: a sort costs O(vocab log vocab) work
 * for k <= 1024 results; per-thread heaps of k up to 1024 do not fit in registers. */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

#define TK_THREADS 1024
#define TK_WARPS   (TK_THREADS / 32)
#define TK_BINS    256
/* A split row's most slices, and its fewest tokens a slice. */
#define TK_SLICES_MAX 32
#define TK_SLICE_MIN  1024

typedef struct tk_req {
    int32_t row, k, adj_begin, adj_end, want_lse;
    int32_t out_off;  /* first output slot */
    int32_t key_off;  /* its adjusted keys' slots: requests may share adjustments, not keys */
    int32_t mask_off; /* its allowed set's first word in the uploaded masks, or -1: all allowed */
    int32_t mask_n;   /* tokens the allowed set covers (the rest are not allowed) */
} tk_req;

__device__ __forceinline__ uint32_t tk_fkey(float v) {
    uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float tk_fval(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/* Above -inf and not NaN. */
__device__ __forceinline__ bool tk_eligible(float v) {
    return v > __int_as_float((int)0xff800000u);
}

__device__ __forceinline__ uint64_t tk_key(float v, uint32_t id) {
    return ((uint64_t)tk_fkey(v) << 32) | (uint32_t)~id;
}

/* The adjusted logit of adj[j].token: its entries from j on, starting from the raw value. */
__device__ float tk_apply(const float *row, const be_logit_adj *adj, int j, int end) {
    int32_t t = adj[j].token;
    float l = row[t];
    for (; j < end && adj[j].token == t; j++) {
        if (adj[j].kind == BE_ADJ_ADD) {
            l = __fadd_rn(l, adj[j].a);
        } else {
            l = l <= 0.0f ? __fmul_rn(l, adj[j].a) : __fdiv_rn(l, adj[j].a);
            l = __fsub_rn(l, adj[j].b);
        }
    }
    return l;
}

__device__ float tk_block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = red[lane < TK_WARPS ? lane : 0];
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ double tk_block_sum(double v, double *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    v = lane < TK_WARPS ? red[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* max + log(sum exp(x - max)) over the raw row; every thread gets it. */
__device__ double tk_lse(const float *row, int vocab, float *redf, double *redd) {
    float mx = __int_as_float((int)0xff800000u);
    for (int i = threadIdx.x; i < vocab; i += TK_THREADS) mx = fmaxf(mx, row[i]);
    mx = tk_block_max(mx, redf);
    double sum = 0;
    for (int i = threadIdx.x; i < vocab; i += TK_THREADS) sum += exp((double)row[i] - mx);
    sum = tk_block_sum(sum, redd);
    return mx + log(sum);
}

/* Warp 0: the digit (counted from the top bin) holding the kk-th best key of hist; writes the
 * digit, the keys still needed inside it, and whether that bin holds exactly those. */
__device__ void tk_find_digit(const uint32_t *hist, uint32_t kk, uint32_t *digit, uint32_t *need,
                              uint32_t *exact) {
    int lane = threadIdx.x;
    uint32_t sum = 0;
    for (int m = 0; m < 8; m++) sum += hist[255 - 8 * lane - m];
    uint32_t incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t up = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += up;
    }
    unsigned hit = __ballot_sync(0xffffffffu, incl >= kk);
    if (lane != __ffs(hit) - 1) return;
    uint32_t cum = incl - sum;
    for (int m = 0; m < 8; m++) {
        int b = 255 - 8 * lane - m;
        if (cum + hist[b] >= kk) {
            *digit = (uint32_t)b;
            *need = kk - cum;
            *exact = hist[b] == kk - cum;
            return;
        }
        cum += hist[b];
    }
}

__device__ __forceinline__ bool tk_skip(const uint32_t *bitmap, bool has_adj, int i) {
    return has_adj && ((bitmap[i >> 5] >> (i & 31)) & 1u);
}

/* Whether token t is left out by the request's allowed set (mask: its words, or NULL). */
__device__ __forceinline__ bool tk_masked(const uint32_t *mask, int mask_n, int t) {
    return mask && (t >= mask_n || !((mask[t >> 5] >> (t & 31)) & 1u));
}

/* The select leaves exactly n <= BE_TOPK_MAX keys at or above the floor; the bound only keeps
 * a broken invariant from writing past the array. */
__device__ __forceinline__ void tk_push(uint64_t *keys, uint32_t *cnt, uint64_t key) {
    uint32_t slot = atomicAdd(cnt, 1u);
    if (slot < BE_TOPK_MAX) keys[slot] = key;
}

/* What one CTA of tk_kernel selects from. TK_ROW: a whole row (its request's k best, sorted,
 * to the outputs). TK_SLICE: the tokens [lo, hi) of a row, blockIdx.x naming the slice of
 * gridDim.x; its k best (or fewer), unsorted, go to the request's candidate slots, zeros after
 * them. TK_MERGE: a request's candidate slots from every slice, as TK_ROW outputs them. A row
 * split into slices is read by many SMs at once instead of one. */
enum { TK_ROW, TK_SLICE, TK_MERGE };

template <int MODE>
__global__ void __launch_bounds__(TK_THREADS)
    tk_kernel(const float *logits, int vocab, int slices, const tk_req *reqs,
              const be_logit_adj *adj, const uint32_t *masks, uint64_t *adj_key, uint64_t *cand,
              int32_t *out_id, float *out_logit, int32_t *out_n, double *out_lse) {
    /* ((hi - lo + 31) / 32) when the request has adjustments: the slice's adjusted tokens */
    extern __shared__ uint32_t tk_bitmap[];
    __shared__ uint32_t hist[TK_BINS];
    __shared__ uint64_t keys[BE_TOPK_MAX];
    __shared__ uint32_t s_total, s_digit, s_need, s_exact, s_cnt;
    __shared__ float redf[TK_WARPS];
    __shared__ double redd[TK_WARPS];
    /* The merge starts while the slices finish, waiting for them before it reads anything. */
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int req = MODE == TK_SLICE ? blockIdx.y : blockIdx.x;
    const tk_req r = reqs[req];
    const float *row = logits + (size_t)r.row * (size_t)vocab;
    const uint32_t *mask = MODE != TK_MERGE && r.mask_off >= 0 ? masks + r.mask_off : NULL;
    const int tid = threadIdx.x;
    int lo = 0, hi = MODE == TK_MERGE ? 0 : vocab;
    if (MODE == TK_SLICE) {
        const int per = (vocab + slices - 1) / slices;
        lo = min(vocab, (int)blockIdx.x * per);
        hi = min(vocab, lo + per);
    }
    /* The key list besides the row: the adjusted tokens' keys (those of [lo, hi) count), or
     * in a merge every slice's candidates. */
    const bool merge = MODE == TK_MERGE;
    const uint64_t *lk = merge ? cand + (size_t)r.out_off * slices : adj_key + r.key_off;
    const int nlk = merge ? r.k * slices : r.adj_end - r.adj_begin;
    auto listed = [&](int j) {
        if (MODE != TK_SLICE) return true;
        const int32_t t = adj[r.adj_begin + j].token;
        return t >= lo && t < hi;
    };
    if (MODE != TK_SLICE && r.want_lse) {
        double lse = tk_lse(row, vocab, redf, redd);
        if (tid == 0) out_lse[req] = lse;
    }
    const bool has_adj = !merge && r.adj_end > r.adj_begin;
    if (has_adj) {
        for (int w = tid; w < (hi - lo + 31) / 32; w += TK_THREADS) tk_bitmap[w] = 0;
        __syncthreads();
        uint64_t *keys_adj = adj_key + r.key_off; /* (adj_end - adj_begin) */
        for (int j = r.adj_begin + tid; j < r.adj_end; j += TK_THREADS) {
            int32_t t = adj[j].token;
            if (t < lo || t >= hi) continue;
            uint64_t key = 0; /* 0: not a candidate (a later entry of the token, or banned) */
            if (j == r.adj_begin || adj[j - 1].token != t) {
                atomicOr(&tk_bitmap[(t - lo) >> 5], 1u << ((t - lo) & 31));
                float v = tk_apply(row, adj, j, r.adj_end);
                if (tk_eligible(v) && !tk_masked(mask, r.mask_n, t)) key = tk_key(v, (uint32_t)t);
            }
            keys_adj[j - r.adj_begin] = key;
        }
    }
    uint64_t prefix = 0;
    uint32_t kk = (uint32_t)r.k;
    int used = 0, shift = 56;
    for (;;) {
        shift = 56 - used;
        for (int b = tid; b < TK_BINS; b += TK_THREADS) hist[b] = 0;
        __syncthreads();
        for (int i = lo + tid; i < hi; i += TK_THREADS) {
            float v = row[i];
            if (!tk_eligible(v) || tk_skip(tk_bitmap, has_adj, i - lo) ||
                tk_masked(mask, r.mask_n, i))
                continue;
            uint64_t key = tk_key(v, (uint32_t)i);
            if (used == 0 || (key >> (64 - used)) == (prefix >> (64 - used)))
                atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        for (int j = tid; j < nlk; j += TK_THREADS) {
            if (!listed(j)) continue;
            uint64_t key = lk[j];
            if (key && (used == 0 || (key >> (64 - used)) == (prefix >> (64 - used))))
                atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (used == 0 && tid == 0) {
            uint32_t total = 0;
            for (int b = 0; b < TK_BINS; b++) total += hist[b];
            s_total = total < kk ? total : kk;
        }
        __syncthreads();
        kk = used == 0 ? s_total : kk;
        if (kk == 0) break;
        if (tid < 32) tk_find_digit(hist, kk, &s_digit, &s_need, &s_exact);
        __syncthreads();
        prefix |= (uint64_t)s_digit << shift;
        kk = s_need;
        used += 8;
        bool exact = s_exact;
        __syncthreads();
        if (exact) break;
    }
    const uint32_t n = s_total;
    uint64_t *slot = MODE == TK_SLICE ? cand + (size_t)r.out_off * slices + (size_t)blockIdx.x * r.k
                                      : NULL; /* (k) */
    if (n == 0) {
        if (MODE == TK_SLICE)
            for (int i = tid; i < r.k; i += TK_THREADS) slot[i] = 0;
        else if (tid == 0)
            out_n[req] = 0;
        return;
    }
    /* every key whose top `used` bits are at least the prefix's is a candidate: n of them */
    if (tid == 0) s_cnt = 0;
    __syncthreads();
    uint64_t floor_top = prefix >> shift;
    for (int i = lo + tid; i < hi; i += TK_THREADS) {
        float v = row[i];
        if (!tk_eligible(v) || tk_skip(tk_bitmap, has_adj, i - lo) || tk_masked(mask, r.mask_n, i))
            continue;
        uint64_t key = tk_key(v, (uint32_t)i);
        if ((key >> shift) >= floor_top) tk_push(keys, &s_cnt, key);
    }
    for (int j = tid; j < nlk; j += TK_THREADS) {
        if (!listed(j)) continue;
        uint64_t key = lk[j];
        if (key && (key >> shift) >= floor_top) tk_push(keys, &s_cnt, key);
    }
    __syncthreads();
    if (MODE == TK_SLICE) {
        for (int i = tid; i < r.k; i += TK_THREADS) slot[i] = (uint32_t)i < n ? keys[i] : 0;
        return;
    }
    uint32_t p = 1;
    while (p < n) p <<= 1;
    for (uint32_t i = n + tid; i < p; i += TK_THREADS) keys[i] = 0;
    __syncthreads();
    /* bitonic sort, descending */
    for (uint32_t size = 2; size <= p; size <<= 1) {
        for (uint32_t stride = size / 2; stride > 0; stride >>= 1) {
            for (uint32_t i = tid; i < p; i += TK_THREADS) {
                uint32_t j = i ^ stride;
                if (j <= i) continue;
                uint64_t a = keys[i], b = keys[j];
                bool desc = (i & size) == 0;
                if (desc ? a < b : a > b) {
                    keys[i] = b;
                    keys[j] = a;
                }
            }
            __syncthreads();
        }
    }
    for (uint32_t i = tid; i < n; i += TK_THREADS) {
        uint64_t key = keys[i];
        out_id[r.out_off + i] = (int32_t) ~(uint32_t)key;
        out_logit[r.out_off + i] = tk_fval((uint32_t)(key >> 32));
    }
    if (tid == 0) out_n[req] = (int32_t)n;
}

static size_t tk_align(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Grows the backend's scratch for this op, on the device and its page-locked host mirror (the
 * copies then run without staging), to at least bytes. */
static int tk_scratch(cuda_backend *c, size_t bytes, base_err *err) {
    if (bytes <= c->tk_bytes) return 0;
    cudaFree(c->tk_buf);
    cudaFreeHost(c->tk_host);
    c->tk_buf = c->tk_host = NULL;
    c->tk_bytes = 0;
    cudaError_t e = cudaMalloc(&c->tk_buf, bytes);
    if (e == cudaSuccess) e = cudaMallocHost(&c->tk_host, bytes);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: topk_candidates: allocating %zu bytes: %s", bytes,
                         cudaGetErrorString(e));
    c->tk_bytes = bytes;
    return 0;
}

int cuda_topk_candidates(be_backend *be, const be_tensor *logits, const be_topk_row *reqs,
                         int n_req, const be_logit_adj *adj, int32_t *cand_id, float *cand_logit,
                         int32_t *n_cand, double *lse, base_err *err) {
    if (be_topk_check(logits, reqs, n_req, adj, err)) return -1;
    if (n_req <= 0) return 0;
    cuda_backend *c = cuda_impl(be);
    int vocab = (int)logits->cols, n_adj = 0, total_k = 0, n_keys = 0;
    size_t n_words = 0;
    for (int i = 0; i < n_req; i++) {
        if (reqs[i].allowed) n_words += (size_t)(reqs[i].allowed_n + 31) / 32;
        if (reqs[i].adj_end > n_adj) n_adj = reqs[i].adj_end;
        n_keys += reqs[i].adj_end - reqs[i].adj_begin;
        total_k += reqs[i].k;
    }
    /* Few rows leave most SMs idle with one CTA a row: each row is then split into slices
     * (of at least TK_SLICE_MIN tokens) that fill about twice the SMs, and a second kernel
     * merges their candidates. */
    int slices = 2 * c->sm_count / n_req;
    if (slices > TK_SLICES_MAX) slices = TK_SLICES_MAX;
    if (slices > vocab / TK_SLICE_MIN) slices = vocab / TK_SLICE_MIN;
    if (slices < 2) slices = 1;
    bool any_adj = n_keys > 0;
    int span = (vocab + slices - 1) / slices;
    size_t smem = any_adj ? (size_t)(span + 31) / 32 * 4 : 0;
    if (smem > 32768) {
        cudaError_t e =
            cudaFuncSetAttribute(slices > 1 ? tk_kernel<TK_SLICE> : tk_kernel<TK_ROW>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: topk_candidates: vocabulary of %d is too large: %s", vocab,
                             cudaGetErrorString(e));
    }
    /* one upload (requests, adjustments, allowed sets), one download (every output) */
    size_t o_req = 0, o_adj = tk_align((size_t)n_req * sizeof(tk_req));
    size_t o_mask = o_adj + tk_align((size_t)n_adj * sizeof(be_logit_adj));
    size_t o_key = o_mask + tk_align(n_words * sizeof(uint32_t));
    size_t o_lse = o_key + tk_align((size_t)n_keys * sizeof(uint64_t));
    size_t o_n = o_lse + tk_align((size_t)n_req * sizeof(double));
    size_t o_id = o_n + tk_align((size_t)n_req * sizeof(int32_t));
    size_t o_logit = o_id + tk_align((size_t)total_k * sizeof(int32_t));
    size_t o_cand = o_logit + tk_align((size_t)total_k * sizeof(float));
    size_t end = o_cand + (slices > 1 ? (size_t)slices * total_k * sizeof(uint64_t) : 0);
    if (tk_scratch(c, end, err)) return -1;
    unsigned char *host = (unsigned char *)c->tk_host;
    tk_req *hr = (tk_req *)(host + o_req);
    uint32_t *hm = (uint32_t *)(host + o_mask);
    for (int i = 0, off = 0, koff = 0, moff = 0; i < n_req; i++) {
        const be_topk_row *q = &reqs[i];
        int words = q->allowed ? (q->allowed_n + 31) / 32 : 0;
        tk_req t = {q->row, q->k, q->adj_begin,           q->adj_end,  q->want_lse,
                    off,    koff, q->allowed ? moff : -1, q->allowed_n};
        hr[i] = t;
        if (words) memcpy(hm + moff, q->allowed, (size_t)words * sizeof(uint32_t));
        off += q->k;
        koff += q->adj_end - q->adj_begin;
        moff += words;
    }
    if (n_adj) memcpy(host + o_adj, adj, (size_t)n_adj * sizeof(be_logit_adj));
    unsigned char *dev = (unsigned char *)c->tk_buf;
    cudaError_t e = cudaMemcpyAsync(dev, host, o_key, cudaMemcpyHostToDevice, c->stream);
    const float *lg = (const float *)logits->data;
    const tk_req *dr = (const tk_req *)(dev + o_req);
    const be_logit_adj *da = (const be_logit_adj *)(dev + o_adj);
    const uint32_t *dm = (const uint32_t *)(dev + o_mask);
    uint64_t *dk = (uint64_t *)(dev + o_key), *dc = (uint64_t *)(dev + o_cand);
    int32_t *di = (int32_t *)(dev + o_id), *dn = (int32_t *)(dev + o_n);
    float *dl = (float *)(dev + o_logit);
    double *ds = (double *)(dev + o_lse);
    if (e == cudaSuccess && slices > 1) {
        tk_kernel<TK_SLICE><<<dim3(slices, n_req), TK_THREADS, smem, c->stream>>>(
            lg, vocab, slices, dr, da, dm, dk, dc, di, dl, dn, ds);
        e = cudaGetLastError();
        if (e == cudaSuccess &&
            cuda_launch_pdl(c, tk_kernel<TK_MERGE>, n_req, TK_THREADS, 0, "topk_candidates", err,
                            lg, vocab, slices, dr, da, dm, dk, dc, di, dl, dn, ds))
            return -1;
    } else if (e == cudaSuccess) {
        tk_kernel<TK_ROW><<<n_req, TK_THREADS, smem, c->stream>>>(lg, vocab, 1, dr, da, dm, dk, dc,
                                                                  di, dl, dn, ds);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(host + o_lse, dev + o_lse, o_cand - o_lse, cudaMemcpyDeviceToHost,
                            c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) return base_fail(err, "cuda: topk_candidates: %s", cudaGetErrorString(e));
    const int32_t *hn = (const int32_t *)(host + o_n);
    for (int i = 0; i < n_req; i++) {
        n_cand[i] = hn[i];
        if (lse && reqs[i].want_lse) lse[i] = ((const double *)(host + o_lse))[i];
        size_t at = (size_t)hr[i].out_off;
        memcpy(cand_id + at, host + o_id + at * sizeof(int32_t), (size_t)hn[i] * sizeof(int32_t));
        memcpy(cand_logit + at, host + o_logit + at * sizeof(float), (size_t)hn[i] * sizeof(float));
    }
    return 0;
}
