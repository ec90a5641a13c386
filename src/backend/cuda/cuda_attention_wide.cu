/* Paged decode attention for tiny grids: a few decode rows of a few kv heads, where one CTA per
 * (row, kv head) leaves almost the whole device idle and each CTA's serial walk through its
 * pages, not the bytes, decides the time.
 *
 * Design: the context of each (row, kv head) is cut into `chunks` spans of equal token count,
 * one CTA each, so the grid is (kv heads, chunks, rows). A CTA issues the copies of its whole
 * span (K swizzled, V plain) into shared memory at once and waits once: its time is about one
 * DRAM latency plus its share of the bytes. Then, with the span in shared memory:
 *   scores: one thread per (token, head) of the group, the full dot product over q kept in
 *           shared memory (eight consecutive tokens of one head per quarter warp: q is a
 *           broadcast and the swizzle puts the eight K rows' chunks in distinct banks);
 *   softmax: one warp per head, the span's max and sum (log2 domain, q pre-scaled);
 *   values: one thread per (head, pair of dims) over the span's tokens.
 * The CTA writes its unnormalized output, max and sum to the scratch; the last CTA of the
 * (row, kv head) to arrive (a counter, reset to 0 by that CTA so recorded steps replay) merges
 * the spans in span order, so the result does not depend on which CTA comes last.
 *
 * With RoPE and the KV append folded in (rope_kv_attention), every CTA rotates q itself and the
 * CTA whose span holds the new token rotates its k, writes k and v to the pool and puts them
 * straight into its shared memory, so no kernel runs between the Q/K/V projection and this one.
 *
 * Pool offsets are 64-bit from the first multiply. Slots outside a row's tokens are never read,
 * so garbage (NaN) there cannot reach the output.
 *
 * be_attn: a window makes the row's tokens its last `window` ones (the spans cut those alone),
 * the soft-cap is applied to each score as it is stored, and a head's sink joins the
 * denominator of the spans' merge.
 *
 * Measured on the H200 in the decode step, batch 1 of the Llama-3.1-8B shape (tg128@dD tok/s;
 * figures compare within one run only, as runs land on different GPUs): d512, the F32 kernel on
 * 8 CTAs 357.7, this kernel after rope_kv_append 447.4 to 455.7, with RoPE and the append folded
 * in 462.3 to 466.2; d64 471.6 against 484.8; d1024 278.9 against 435.3; d2048 195.6 against
 * 413.8. Spans per kv head at d512: 4, 8, 12 and 16 within 1% of each other (454.6, 452.4 and
 * 455.7, 455.0, 452.0), 32 worse (419.2 against 447.4 at 16), hence at most WD_MAX_CHUNKS.
 * This code on another H200: d512 456.4 (49.0% of copy bandwidth), d64 476.3, d2048 430.7; under
 * ncu at a 560-token context, each kernel alone and cold, 12.9 us a layer (the F32 kernel 33.6,
 * plus 3.5 for rope_kv_append).
 * Tried and not kept: the spans of a kv head as one thread-block cluster merged through
 * distributed shared memory instead of the counter (d512 445.4 against 452.0 at 16 spans, 454.7
 * against 452.4 at 8; d2048 362.0 against 412.1), the older tokens copied before the PDL wait
 * (453.2 against 452.4), letting the o GEMV launch once a CTA's span has landed (450.0 against
 * 452.4), spans of at least 32 tokens rather than 16 (448.4 against 447.4). */
#include "backend/cuda/cuda_mma.h"

#define WD_THREADS    256
#define WD_MAX_GROUP  16
#define WD_MAX_CHUNKS 16
#define WD_MIN_TOKENS 16           /* fewest tokens a span takes, a row's last span aside */
#define WD_SMEM_MAX   (223 * 1024) /* dynamic shared memory: 227 KB less the static arrays */
#define WD_MAX_ITEMS  16           /* (row, kv head) pairs: the counters in front of the scratch */
#define WD_CARVEOUT   0            /* shared-memory carveout preference: the largest L1 */

typedef struct wd_params {
    const void *q; /* (n_seqs, n_heads * D) */
    base_dtype q_dt;
    void *out; /* (n_seqs, n_heads * D) */
    base_dtype out_dt;
    void *k_pool, *v_pool;
    int n_kv_heads, block_size, n_heads, group;
    const int32_t *kv_len;            /* (n_seqs) */
    const int32_t *page_indptr;       /* (n_seqs + 1) */
    const int32_t *page_indices;      /* (page_indptr[n_seqs]) */
    const int32_t *first_page_offset; /* (n_seqs) or NULL */
    int chunks;                       /* spans per (row, kv head), gridDim.y */
    int max_tokens;                   /* tokens a CTA's shared memory holds */
    float scale_log2;
    float softcap_log2; /* cap * log2 e; 0 = none */
    int window;         /* 0 = the whole causal span */
    const float *sinks; /* (n_heads) natural-log logits, or NULL */
    /* With RoPE folded in (the ROPE kernels): q, k and v as the projections left them, the
     * rows' positions, the table, and the slots the new tokens go to. */
    const void *k_new; /* (n_seqs, n_kv_heads * D) */
    base_dtype k_dt;
    const void *v_new; /* (n_seqs, n_kv_heads * D) */
    base_dtype v_dt;
    const int32_t *pos;    /* (n_seqs) */
    const float *inv_freq; /* (D / 2) */
    float mscale;
    const int64_t *slots; /* (n_seqs) */
    unsigned *count;      /* (n_seqs, n_kv_heads) CTAs done, reset to 0 by the last */
    float *part;          /* (n_seqs, chunks, n_heads, D) unnormalized outputs */
    float *ml;            /* (n_seqs, chunks, n_heads, 2) max (log2 domain) and sum */
} wd_params;

template <typename KT> __device__ __forceinline__ KT wd_from(float x);
template <> __device__ __forceinline__ __half wd_from<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 wd_from<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

/* Tokens per span of a row of n tokens. */
__device__ __forceinline__ int wd_span(const wd_params &p, int n) {
    const int t = (n + p.chunks - 1) / p.chunks;
    return t > WD_MIN_TOKENS ? t : WD_MIN_TOKENS;
}

/* ROPE: q and the new token's k are rotated here as rope_kv_append does (the same F32 angle
 * and arithmetic, each value rounded to its tensor's dtype), and the CTA whose span holds the
 * new token writes its k and v to the pool and to its own shared memory. */
template <int D, typename KT, bool ROPE>
__global__ void __launch_bounds__(WD_THREADS) wide_decode_kernel(wd_params p) {
    constexpr int CH = D / 8;   /* 16-byte chunks per token row */
    constexpr int HALF = D / 2; /* rotated pairs per head */
    static_assert(WD_THREADS % HALF == 0, "a thread rotates one pair index throughout");
    static_assert(CH >= 8, "the swizzle spreads eight tokens over eight chunks");
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ float w_s[WD_MAX_CHUNKS * WD_MAX_GROUP]; /* (chunks, group) spans' max, weight */
    __shared__ float l_s[WD_MAX_CHUNKS * WD_MAX_GROUP]; /* (chunks, group) spans' sums */
    __shared__ bool last;
    const int tid = threadIdx.x, G = p.group, TM = p.max_tokens;
    KT *ks = (KT *)smem;                        /* (TM, D), chunks XOR-swizzled by the token */
    KT *vs = ks + (size_t)TM * D;               /* (TM, D) */
    float *qs = (float *)(vs + (size_t)TM * D); /* (G, D) q * scale * log2 e */
    float *ps = qs + G * D;                     /* (G, TM) scores, then exp2(score - max) */
    float *ms = ps + G * TM;                    /* (G) the span's max */
    float *ls = ms + G;                         /* (G) the span's sum */
    const int kvh = blockIdx.x, chunk = blockIdx.y, s = blockIdx.z;
    /* The row's tokens: its last `window` when a window cuts it, from slot fpo. */
    const int n_all = p.kv_len[s];
    const int n = p.window > 0 && n_all > p.window ? p.window : n_all;
    const int fpo = (p.first_page_offset ? p.first_page_offset[s] : 0) + n_all - n;
    const int T = wd_span(p, n), t0 = chunk * T;
    const int nt = t0 < n ? (n - t0 < T ? n - t0 : T) : 0;
    const int32_t *pages = p.page_indices + p.page_indptr[s];
    const uint64_t row_stride = (uint64_t)p.n_kv_heads * D;
    const KT *kp = (const KT *)p.k_pool + (uint64_t)kvh * D;
    const KT *vp = (const KT *)p.v_pool + (uint64_t)kvh * D;
    const int bs = p.block_size;
    /* Positions and the table are copied in before the step's first kernel. */
    const int pair = tid % HALF;
    float sn = 0.0f, cs = 0.0f;
    const int64_t slot = ROPE ? p.slots[s] : -1;
    if (ROPE) cuda_rope_sincos(p.pos[s], p.inv_freq[pair], p.mscale, &sn, &cs);
    const bool fresh = slot >= 0; /* the new token comes from k and v, not the pool */

    cuda_pdl_wait();
    for (int i = tid; i < nt * CH; i += WD_THREADS) {
        const int t = i / CH, cc = i % CH;
        if (fresh && t0 + t == n - 1) continue;
        const int u = fpo + t0 + t;
        const uint64_t off =
            ((uint64_t)pages[u / bs] * (uint64_t)bs + (uint64_t)(u % bs)) * row_stride +
            (uint64_t)cc * 8;
        cuda_cp_async16(ks + (t * CH + (cc ^ (t & 7))) * 8, kp + off);
        cuda_cp_async16(vs + (t * CH + cc) * 8, vp + off);
    }
    cuda_cp_async_commit();
    const size_t cell0 = ((size_t)s * p.chunks + chunk) * p.n_heads + (size_t)kvh * G;
    if (nt > 0) {
        const size_t qbase = ((size_t)s * p.n_heads + (size_t)kvh * G) * D;
        if (ROPE) {
            /* The new token's k and v are loaded before q, so that both loads are in flight
             * at once. */
            const int tn = n - 1 - t0;
            const bool mine = fresh && tn < nt;
            const uint64_t width = (uint64_t)p.n_kv_heads * D;
            const size_t src = (size_t)s * width + (size_t)kvh * D;
            float k1 = 0.0f, k2 = 0.0f, vx = 0.0f;
            if (mine && tid < HALF) {
                k1 = cuda_load(p.k_new, p.k_dt, src + pair);
                k2 = cuda_load(p.k_new, p.k_dt, src + pair + HALF);
            }
            static_assert(D <= WD_THREADS, "a thread appends one value of v");
            if (mine && tid < D) vx = cuda_load(p.v_new, p.v_dt, src + tid);
            for (int i = tid; i < G * HALF; i += WD_THREADS) {
                const size_t o = qbase + (size_t)(i / HALF) * D + pair;
                const float2 r = cuda_rope_rotate(cuda_load(p.q, p.q_dt, o),
                                                  cuda_load(p.q, p.q_dt, o + HALF), sn, cs);
                qs[o - qbase] = cuda_round(p.q_dt, r.x) * p.scale_log2;
                qs[o - qbase + HALF] = cuda_round(p.q_dt, r.y) * p.scale_log2;
            }
            if (mine) {
                const uint64_t dst = (uint64_t)slot * width + (uint64_t)kvh * D;
                if (tid < HALF) {
                    const float2 r = cuda_rope_rotate(k1, k2, sn, cs);
                    const KT r1 = wd_from<KT>(cuda_round(p.k_dt, r.x));
                    const KT r2 = wd_from<KT>(cuda_round(p.k_dt, r.y));
                    ((KT *)p.k_pool)[dst + pair] = r1;
                    ((KT *)p.k_pool)[dst + pair + HALF] = r2;
                    const int j1 = pair, j2 = pair + HALF;
                    KT *kd = ks + tn * D;
                    kd[((j1 >> 3) ^ (tn & 7)) * 8 + (j1 & 7)] = r1;
                    kd[((j2 >> 3) ^ (tn & 7)) * 8 + (j2 & 7)] = r2;
                }
                if (tid < D) {
                    const KT x = wd_from<KT>(vx);
                    ((KT *)p.v_pool)[dst + tid] = x;
                    vs[tn * D + tid] = x;
                }
            }
        } else {
            for (int i = tid; i < G * D; i += WD_THREADS)
                qs[i] = cuda_load(p.q, p.q_dt, qbase + i) * p.scale_log2;
        }
        cuda_cp_async_wait<0>();
        __syncthreads();

        const int nt8 = (nt + 7) & ~7;
        for (int i = tid; i < nt8 * G; i += WD_THREADS) {
            const int h = (i >> 3) % G, t = (i & 7) + 8 * (i / (8 * G));
            if (t >= nt) continue;
            const KT *kr = ks + t * D;
            const float *qr = qs + h * D;
            float a0 = 0.0f, a1 = 0.0f;
#pragma unroll
            for (int cc = 0; cc < CH; cc++) {
                const uint4 raw = *(const uint4 *)(kr + (cc ^ (t & 7)) * 8);
                const float4 x = *(const float4 *)(qr + cc * 8);
                const float4 y = *(const float4 *)(qr + cc * 8 + 4);
                const float2 k0 = cuda_unpack2<KT>(raw.x), k1 = cuda_unpack2<KT>(raw.y),
                             k2 = cuda_unpack2<KT>(raw.z), k3 = cuda_unpack2<KT>(raw.w);
                a0 = fmaf(x.x, k0.x, a0), a1 = fmaf(x.y, k0.y, a1);
                a0 = fmaf(x.z, k1.x, a0), a1 = fmaf(x.w, k1.y, a1);
                a0 = fmaf(y.x, k2.x, a0), a1 = fmaf(y.y, k2.y, a1);
                a0 = fmaf(y.z, k3.x, a0), a1 = fmaf(y.w, k3.y, a1);
            }
            /* cap * tanh(s / cap) in the log2 domain: there s and cap both carry log2 e. */
            const float sc = a0 + a1;
            ps[h * TM + t] =
                p.softcap_log2 > 0.0f ? p.softcap_log2 * tanhf(sc / p.softcap_log2) : sc;
        }
        __syncthreads();

        const int warp = tid >> 5, lane = tid & 31;
        for (int h = warp; h < G; h += WD_THREADS / 32) {
            float mx = -INFINITY;
            for (int t = lane; t < nt; t += 32) mx = fmaxf(mx, ps[h * TM + t]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            float sum = 0.0f;
            for (int t = lane; t < nt; t += 32) {
                const float e = exp2f(ps[h * TM + t] - mx);
                ps[h * TM + t] = e;
                sum += e;
            }
            sum = cuda_warp_sum(sum);
            if (lane == 0) ms[h] = mx, ls[h] = sum;
        }
        __syncthreads();

        for (int i = tid; i < G * (D / 2); i += WD_THREADS) {
            const int h = i / (D / 2), d2 = i % (D / 2);
            const float *pr = ps + h * TM;
            const KT *vc = vs + 2 * d2;
            float ax = 0.0f, ay = 0.0f, bx = 0.0f, by = 0.0f;
            int t = 0;
            for (; t + 1 < nt; t += 2) {
                const float2 v0 = cuda_unpack2<KT>(*(const uint32_t *)(vc + t * D));
                const float2 v1 = cuda_unpack2<KT>(*(const uint32_t *)(vc + (t + 1) * D));
                const float p0 = pr[t], p1 = pr[t + 1];
                ax = fmaf(p0, v0.x, ax), ay = fmaf(p0, v0.y, ay);
                bx = fmaf(p1, v1.x, bx), by = fmaf(p1, v1.y, by);
            }
            if (t < nt) {
                const float2 v0 = cuda_unpack2<KT>(*(const uint32_t *)(vc + t * D));
                ax = fmaf(pr[t], v0.x, ax), ay = fmaf(pr[t], v0.y, ay);
            }
            *(float2 *)(p.part + (cell0 + h) * D + 2 * d2) = make_float2(ax + bx, ay + by);
        }
        if (tid < G) *(float2 *)(p.ml + (cell0 + tid) * 2) = make_float2(ms[tid], ls[tid]);
    } else {
        cuda_cp_async_wait<0>();
    }

    /* Arrive; the last CTA of the (row, kv head) merges the live spans in span order. */
    __threadfence();
    __syncthreads();
    unsigned *count = p.count + (size_t)s * p.n_kv_heads + kvh;
    if (tid == 0) {
        last = atomicAdd(count, 1u) == (unsigned)p.chunks - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();

    const int live = (n + T - 1) / T;
    const size_t base0 = (size_t)s * p.chunks * p.n_heads + (size_t)kvh * G;
    for (int i = tid; i < live * G; i += WD_THREADS) {
        const int c = i / G, h = i % G;
        const float2 v = __ldcg((const float2 *)(p.ml + (base0 + (size_t)c * p.n_heads + h) * 2));
        w_s[i] = v.x;
        l_s[i] = v.y;
    }
    __syncthreads();
    if (tid < G) {
        /* A sink is one more logit in the denominator alone. */
        const float sk = p.sinks ? p.sinks[kvh * G + tid] * CUDA_LOG2E : -INFINITY;
        float mx = sk;
        for (int c = 0; c < live; c++) mx = fmaxf(mx, w_s[c * G + tid]);
        float den = p.sinks ? exp2f(sk - mx) : 0.0f;
        for (int c = 0; c < live; c++) {
            const float f = exp2f(w_s[c * G + tid] - mx);
            w_s[c * G + tid] = f;
            den += f * l_s[c * G + tid];
        }
        const float inv = 1.0f / den;
        for (int c = 0; c < live; c++) w_s[c * G + tid] *= inv;
    }
    __syncthreads();
    for (int i = tid; i < G * D; i += WD_THREADS) {
        const float *src = p.part + base0 * D + i;
        float acc = 0.0f;
#pragma unroll 4
        for (int c = 0; c < live; c++)
            acc = fmaf(w_s[c * G + i / D], __ldcg(src + (size_t)c * p.n_heads * D), acc);
        cuda_store(p.out, p.out_dt, ((size_t)s * p.n_heads + (size_t)kvh * G) * D + i, acc);
    }
}

/* Spans per (row, kv head): as many as fill the SMs once, at most WD_MAX_CHUNKS. */
static int wd_chunks(const cuda_backend *c, int items) {
    const int w = c->sm_count / items;
    return w > WD_MAX_CHUNKS ? WD_MAX_CHUNKS : (w < 1 ? 1 : w);
}

/* Tokens a CTA's shared memory must hold for rows of at most max_kv_len tokens. */
static int wd_max_tokens(int max_kv_len, int chunks) {
    int64_t t = ((int64_t)max_kv_len + chunks - 1) / chunks;
    if (t < WD_MIN_TOKENS) t = WD_MIN_TOKENS;
    if (t > (1 << 20)) t = 1 << 20; /* past any shared memory: the kernel declines */
    return (int)((t + 7) & ~(int64_t)7);
}

static size_t wd_smem(int head_dim, int group, int max_tokens) {
    return (size_t)2 * max_tokens * head_dim * 2 +
           ((size_t)group * head_dim + (size_t)group * max_tokens + 2 * (size_t)group) *
               sizeof(float);
}

/* The most tokens a row attends over. */
static int wd_row_tokens(const be_paged_batch *batch, be_attn attn) {
    return attn.window > 0 && batch->max_kv_len > attn.window ? attn.window : batch->max_kv_len;
}

bool cuda_attention_wide_fits(be_backend *be, const be_kv_layer *layer, const be_paged_batch *batch,
                              int n_heads, be_attn attn) {
    const int nkv = layer->n_kv_heads, items = batch->n_seqs * nkv, hd = layer->head_dim;
    if (batch->max_q_len != 1 || batch->n_tokens != batch->n_seqs || items > WD_MAX_ITEMS)
        return false;
    if ((hd != 64 && hd != 128 && hd != 256) || n_heads / nkv > WD_MAX_GROUP) return false;
    const int chunks = wd_chunks(cuda_impl(be), items);
    return wd_smem(hd, n_heads / nkv, wd_max_tokens(wd_row_tokens(batch, attn), chunks)) <=
           WD_SMEM_MAX;
}

template <int D, typename KT, bool ROPE>
static int wd_launch(cuda_backend *c, const wd_params &p, int n_seqs, size_t smem, base_err *err) {
    auto kern = wide_decode_kernel<D, KT, ROPE>;
    if (cuda_smem_limit(kern, smem, "attention (wide decode)", err)) return -1;
    /* The grid is one wave at most, and it starts while the kernel before it still holds the
     * SMs. With the driver's carveout (room for several of these CTAs an SM) the SMs freed
     * first can take two or more while others stay idle: a measurement build of a kernel on
     * this one's body (attention with the o projection, not kept) recorded each CTA's SM and
     * found 63 of its 64 pairs sharing one. The largest L1 leaves room for one, so the CTAs
     * spread. On the H200 in turns with the driver's carveout, batch 1 (tok/s): d512 476.0,
     * 476.1, 473.8 against 465.9, 465.6, 463.5; d64 495.8, 498.2 against 492.7, 491.6; d2048
     * 439.1, 435.9 against 436.4, 437.8; batch 2 at d512 708.2, 716.0 against 692.2, 691.5.
     * Every PDL kernel at carveout 0 did no better at batch 1 and cost the tensor-core decode
     * attention a quarter to a third of its bandwidth (fewer CTAs an SM), so only this launch
     * asks. */
    return cuda_launch_pdl_carveout(
        c, kern, dim3((unsigned)p.n_kv_heads, (unsigned)p.chunks, (unsigned)n_seqs),
        dim3(WD_THREADS), smem, WD_CARVEOUT, "attention (wide decode)", err, p);
}

template <bool ROPE>
static int wd_dispatch(cuda_backend *c, const wd_params &p, int head_dim, base_dtype pool_dt,
                       int n_seqs, size_t smem, base_err *err) {
    const bool f16 = pool_dt == BASE_DTYPE_F16;
    switch (head_dim) {
    case 64:
        return f16 ? wd_launch<64, __half, ROPE>(c, p, n_seqs, smem, err)
                   : wd_launch<64, __nv_bfloat16, ROPE>(c, p, n_seqs, smem, err);
    case 128:
        return f16 ? wd_launch<128, __half, ROPE>(c, p, n_seqs, smem, err)
                   : wd_launch<128, __nv_bfloat16, ROPE>(c, p, n_seqs, smem, err);
    default:
        return f16 ? wd_launch<256, __half, ROPE>(c, p, n_seqs, smem, err)
                   : wd_launch<256, __nv_bfloat16, ROPE>(c, p, n_seqs, smem, err);
    }
}

/* The launch's parameters but the RoPE inputs, and its scratch. */
static int wd_setup(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                    const be_paged_batch *batch, int n_heads, be_attn attn, be_tensor *out,
                    wd_params *p, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    const int nkv = layer->n_kv_heads, D = layer->head_dim, ns = batch->n_seqs;
    *p = wd_params{};
    p->q = q->data;
    p->q_dt = q->dtype;
    p->out = out->data;
    p->out_dt = out->dtype;
    p->k_pool = layer->k;
    p->v_pool = layer->v;
    p->n_kv_heads = nkv;
    p->block_size = layer->block_size;
    p->n_heads = n_heads;
    p->group = n_heads / nkv;
    p->kv_len = batch->kv_len;
    p->page_indptr = batch->page_indptr;
    p->page_indices = batch->page_indices;
    p->first_page_offset = batch->first_page_offset;
    p->chunks = wd_chunks(c, ns * nkv);
    p->max_tokens = wd_max_tokens(wd_row_tokens(batch, attn), p->chunks);
    p->scale_log2 = attn.scale * CUDA_LOG2E;
    p->softcap_log2 = attn.softcap * CUDA_LOG2E;
    p->window = attn.window;
    p->sinks = attn.sinks;

    const size_t counters = (WD_MAX_ITEMS * sizeof(unsigned) + 255) & ~(size_t)255;
    const size_t cells = (size_t)ns * p->chunks * n_heads;
    const size_t bytes = counters + cells * ((size_t)D + 2) * sizeof(float);
    const size_t cap = c->wide_bytes;
    if (cuda_scratch(be, &c->wide_buf, &c->wide_bytes, bytes, "attention (wide decode)", err))
        return -1;
    /* The counters start at zero once and every launch leaves them there. */
    if (c->wide_bytes != cap) {
        cudaError_t e = cudaMemsetAsync(c->wide_buf, 0, counters, c->stream);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: attention (wide decode) scratch: %s",
                             cudaGetErrorString(e));
    }
    p->count = (unsigned *)c->wide_buf;
    p->part = (float *)((char *)c->wide_buf + counters);
    p->ml = p->part + cells * D;
    return 0;
}

int cuda_attention_wide(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                        const be_paged_batch *batch, int n_heads, be_attn attn, be_tensor *out,
                        base_err *err) {
    wd_params p;
    if (wd_setup(be, q, layer, batch, n_heads, attn, out, &p, err)) return -1;
    return wd_dispatch<false>(cuda_impl(be), p, layer->head_dim, layer->dtype, batch->n_seqs,
                              wd_smem(layer->head_dim, p.group, p.max_tokens), err);
}

int cuda_rope_kv_attention(be_backend *be, be_tensor *q, be_tensor *k, const be_tensor *v,
                           const be_tensor *positions, const be_tensor *inv_freq, float mscale,
                           const be_kv_layer *layer, const be_paged_batch *batch,
                           const be_decode_plan *plan, int n_heads, be_attn attn, be_tensor *out,
                           base_err *err) {
    if (cuda_rope_kv_check(q, k, v, positions, inv_freq, layer, batch, err) ||
        cuda_attention_check(q, layer, batch, n_heads, attn, out, err))
        return -1;
    /* The wide kernel rotates whole heads; partial RoPE takes the separate append. */
    if (!batch->slots || batch->n_tokens == 0 || 2 * inv_freq->cols != layer->head_dim ||
        !cuda_attention_wide_fits(be, layer, batch, n_heads, attn)) {
        if (cuda_rope_kv_append(be, q, k, v, positions, inv_freq, mscale, layer, batch, err))
            return -1;
        return cuda_attention(be, q, layer, batch, plan, n_heads, attn, out, err);
    }
    wd_params p;
    if (wd_setup(be, q, layer, batch, n_heads, attn, out, &p, err)) return -1;
    p.k_new = k->data;
    p.k_dt = k->dtype;
    p.v_new = v->data;
    p.v_dt = v->dtype;
    p.pos = (const int32_t *)positions->data;
    p.inv_freq = (const float *)inv_freq->data;
    p.mscale = mscale;
    p.slots = batch->slots;
    return wd_dispatch<true>(cuda_impl(be), p, layer->head_dim, layer->dtype, batch->n_seqs,
                             wd_smem(layer->head_dim, p.group, p.max_tokens), err);
}
