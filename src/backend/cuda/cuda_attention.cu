/* Paged attention: decode v1, decode v2 with its merge, and prefill rows, all through the
 * pages of a be_paged_batch.
 *
 * Batches of decode rows only whose rows times kv heads are few (batch 1 and 2 of the 8B shape)
 * run on the wide decode kernel (cuda_attention_wide.cu) whatever the plan, where it fits. Other
 * decode rows (q_len == 1) at head_dim 64, 128 or 256, groups of up to 16 query heads (8 at 256)
 * and blocks of a multiple of 16 tokens run on the tensor cores (paged_decode_mma_kernel,
 * described there), unless their grid is tiny (ATT_F32_DECODE_CTAS). Prefill rows run on the
 * tensor-core prefill kernel (cuda_attention_prefill.cu) where it fits. Everything else runs
 * on paged_attention_kernel, in F32:
 *
 * Design: one CTA per (token row, kv head, chunk) serves the whole GQA group of that kv head
 * (up to ATT_MAX_GROUP query heads; larger groups split into sub-groups), so each K/V byte is
 * read once per group. Pages stream through shared memory with cp.async (the backend's
 * att_stages deep, only the page's live tokens; two stages measured best on the H200, since
 * a smaller footprint keeps more CTAs resident, and L2 prefetching further ahead only slowed
 * it down: bench/RESULTS.md). Per page:
 *   scores: NP threads per token, each holding its share of q for every head of the group in
 *           registers (the K chunk is loaded once and used for all heads), summed by shuffles;
 *           K chunks are swizzled in shared memory so a warp's reads fall in distinct banks;
 *   softmax: online, one warp per head, in the log2 domain (q is pre-scaled by log2 e);
 *   values: each thread owns 8 dims of every head and a slice of the tokens, reads 16 bytes
 *           of V per token and the group's probabilities in one broadcast; slices are summed
 *           once at the end.
 * Pool offsets are 64-bit from the first multiply. A decode row follows the plan: v1 is one
 * chunk covering all pages; v2 writes each chunk's normalized output and log-sum-exp to the
 * workspace (layout in attn.h) and a merge kernel combines them, whichever kernel wrote them.
 * Prefill rows are v1 rows with a causal limit.
 *
 * Every kernel applies be_attn's logit soft-cap, sliding window and sinks: each caps a score
 * before any mask, a window's decode rows (one chunk each) start at their first visible key,
 * and a head's sink joins its denominator as the output is normalized (one chunk each too,
 * since the chunks' merge does not add it). In paged_attention_kernel a window's rows start
 * at the page of their first visible key, with the keys before it outside the page's live
 * range. */
#include "backend/cuda/cuda_mma.h"

extern "C" {
#include "attn/attn.h"
}

#include <cuda.h>
#include <cudaTypedefs.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

#define ATT_THREADS    128
#define ATT_MIN_STAGES 2
#define ATT_MAX_STAGES 5
#define ATT_SMEM_MAX   (227 * 1024)
#define ATT_MAX_GROUP  8
#define ATT_GRID_MAX   65535
#define ATT_LN2        0.6931471805599453f

typedef struct att_params {
    const void *q;
    base_dtype q_dt;
    void *out;
    base_dtype out_dt;
    const void *k_pool, *v_pool;
    int n_kv_heads, block_size, n_heads, group, n_sub;
    const int32_t *q_indptr, *kv_len, *page_indptr, *page_indices, *first_page_offset;
    int n_seqs, n_tokens;
    int decode;          /* 1: serve q_len == 1 rows; 0: the others */
    int all_decode;      /* every sequence has q_len == 1, so decode row == sequence */
    int pages_per_chunk; /* INT_MAX for one chunk */
    int split;           /* v2: write partial + lse instead of out */
    int max_chunks;
    float *partial; /* (n_decode, max_chunks, n_heads, head_dim) */
    float *lse;     /* (n_decode, max_chunks, n_heads) */
    float scale_log2;
    /* The soft-cap in the log2 domain, cap * log2 e (0 none), and the window (0 none): a row
     * that sees n_vis keys sees only the last `window` of them. */
    float softcap_log2;
    int window;
    /* One logit per query head (F32, natural log) in each head's softmax denominator alone,
     * or NULL; such rows take one chunk */
    const float *sinks;
    int stages; /* shared-memory pages in flight + 1, ATT_MIN_STAGES..ATT_MAX_STAGES */
} att_params;

/* Waits until at most n copy groups are pending (n is uniform and small). */
__device__ __forceinline__ void cp_async_wait_n(int n) {
    if (n <= 0)
        cuda_cp_async_wait<0>();
    else if (n == 1)
        cuda_cp_async_wait<1>();
    else if (n == 2)
        cuda_cp_async_wait<2>();
    else
        cuda_cp_async_wait<3>();
}

template <typename KT> __device__ __forceinline__ void cvt8(uint4 raw, float *f) {
    float2 a = cuda_unpack2<KT>(raw.x), b = cuda_unpack2<KT>(raw.y), c = cuda_unpack2<KT>(raw.z),
           d = cuda_unpack2<KT>(raw.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

/* Sequence of a token row: the last s with q_indptr[s] <= row. */
__device__ int seq_of_row(const int32_t *q_indptr, int n_seqs, int row) {
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (q_indptr[mid] <= row)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* Decode rows before sequence s (the workspace numbering); block-wide, every thread gets it. */
__device__ int decode_rank(const att_params &p, int s) {
    if (p.all_decode) return s;
    __shared__ int count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    int c = 0;
    for (int i = threadIdx.x; i < s; i += blockDim.x) c += p.q_indptr[i + 1] - p.q_indptr[i] == 1;
    if (c) atomicAdd(&count, c);
    __syncthreads();
    int r = count;
    __syncthreads();
    return r;
}

/* The pages [*p_begin, *p_end) of sequence s that chunk `chunk` covers, when its row sees
 * n_vis tokens after *fpo skipped ones; false when the chunk lies past them. */
__device__ __forceinline__ bool chunk_pages(const att_params &p, int s, int n_vis, int chunk,
                                            int *fpo, int *p_begin, int *p_end) {
    *fpo = p.first_page_offset ? p.first_page_offset[s] : 0;
    const int n_pages = (*fpo + n_vis + p.block_size - 1) / p.block_size;
    const int64_t pb64 = (int64_t)chunk * p.pages_per_chunk;
    if (pb64 >= n_pages) return false;
    *p_begin = (int)pb64;
    *p_end = n_pages - *p_begin > p.pages_per_chunk ? *p_begin + p.pages_per_chunk : n_pages;
    return true;
}

/* Threads that share a token in the score phase, a power of two: the fewest whose shares of the
 * D dims are at most 64 / GB dims (8 at least), or the most that still cut D into whole 16-byte
 * chunks (head_dim 96: 2 threads of 48 dims at GB 1, 4 of 24 at GB 2). */
__host__ __device__ constexpr int att_np(int d, int gb) {
    int np = 1;
    while (np < 32 && d % (np * 16) == 0 && d / np > (64 / gb < 8 ? 8 : 64 / gb)) np *= 2;
    return np;
}

template <int D, int GB> struct att_geom {
    static constexpr int CH = D / 8;             /* 16-byte chunks per token row */
    static constexpr int NTG = ATT_THREADS / CH; /* token slices in the value phase */
    static constexpr int RED = NTG * GB * D;     /* floats of the final slice reduction */
    /* Score phase: NP threads share a token, each holding DPT dims of q for every head of the
     * group in registers (DPT * GB = 64 floats at most), CPT chunks of them. */
    static constexpr int NP = att_np(D, GB);
    static constexpr int DPT = D / NP;
    static_assert(DPT % 8 == 0 && DPT * NP == D && 32 % NP == 0, "score-phase split");
    static constexpr int CPT = DPT / 8;
    static constexpr int TPP = ATT_THREADS / NP; /* tokens per pass */
};

/* Where chunk c of K token t lies in shared memory: the chunk's index among a thread's CPT
 * chunks is XORed with the token (rotated by it where CPT is not a power of two, as at head_dim
 * 96), so the NP-thread groups of one warp, which read the same chunk of different tokens, hit
 * distinct banks. */
template <int NP, int CPT> __device__ __forceinline__ int k_swizzle(int t, int c) {
    if constexpr ((CPT & (CPT - 1)) == 0) return (((c / NP) ^ (t % CPT)) * NP) + c % NP;
    return (((c / NP + t) % CPT) * NP) + c % NP;
}

/* Registers, not shared memory, bound the resident CTAs (two stages at head_dim 128 take
 * 33 KB): q and the accumulators live in registers, so four CTAs per SM; a group of 8 holds
 * twice as many and settles for three rather than spill. */
template <int D, int GB, typename KT>
__global__ void __launch_bounds__(ATT_THREADS, GB >= 8 ? 3 : 4)
    paged_attention_kernel(att_params p) {
    using S = att_geom<D, GB>;
    constexpr int CH = S::CH, NTG = S::NTG, NP = S::NP, CPT = S::CPT, DPT = S::DPT;
    extern __shared__ __align__(16) unsigned char smem[];
    const int bs = p.block_size, tid = threadIdx.x, n_st = p.stages;
    const size_t stage_elems = (size_t)bs * D;
    KT *kbuf = (KT *)smem;
    KT *vbuf = kbuf + n_st * stage_elems;
    size_t stage_bytes = 2 * n_st * stage_elems * sizeof(KT);
    size_t red_bytes = (size_t)S::RED * sizeof(float);
    float *red = (float *)smem;
    float *q_s = (float *)(smem + (stage_bytes > red_bytes ? stage_bytes : red_bytes)); /* GB*D */
    float *sc_s = q_s + GB * D;  /* (bs, GB) scores, then probabilities */
    float *m_s = sc_s + bs * GB; /* (GB) running max, log2 domain */
    float *l_s = m_s + GB;       /* (GB) running sum */
    float *alpha_s = l_s + GB;   /* (GB) rescale of this page */

    const int kvh = blockIdx.x / p.n_sub, sub = blockIdx.x % p.n_sub;
    const int head0 = kvh * p.group + sub * GB;
    const int chunk = blockIdx.y;
    const uint64_t row_stride = (uint64_t)p.n_kv_heads * D;
    const KT *kp = (const KT *)p.k_pool + (uint64_t)kvh * D;
    const KT *vp = (const KT *)p.v_pool + (uint64_t)kvh * D;

    for (int row = blockIdx.z; row < p.n_tokens; row += gridDim.z) {
        const int s = seq_of_row(p.q_indptr, p.n_seqs, row);
        const int q_len = p.q_indptr[s + 1] - p.q_indptr[s];
        if ((q_len == 1) != (p.decode != 0)) continue;
        const int n_vis = p.kv_len[s] - q_len + (row - p.q_indptr[s]) + 1;
        int fpo, p_begin, p_end;
        if (!chunk_pages(p, s, n_vis, chunk, &fpo, &p_begin, &p_end)) continue;
        /* With a window (one chunk), slot `first` holds the row's first visible key: logical
         * key n_vis - window, counted from the first kept token at slot fpo. */
        const int first = p.window > 0 && n_vis > p.window ? fpo + n_vis - p.window : 0;
        if (first / bs > p_begin) p_begin = first / bs;
        const int32_t *pages = p.page_indices + p.page_indptr[s];
        const int drow = p.split ? decode_rank(p, s) : 0;
        cuda_pdl_wait();

        for (int i = tid; i < GB * D; i += ATT_THREADS)
            q_s[i] = cuda_load(p.q, p.q_dt, (size_t)row * p.n_heads * D + (size_t)head0 * D + i) *
                     p.scale_log2;
        if (tid < GB) {
            m_s[tid] = -INFINITY;
            l_s[tid] = 0.0f;
        }

        /* Live token slots [lo, hi) of page pg. */
        auto live = [&](int pg, int &lo, int &hi) {
            lo = pg == 0 ? fpo : 0;
            if (first - pg * bs > lo) lo = first - pg * bs;
            int end = fpo + n_vis - pg * bs;
            hi = end < bs ? end : bs;
        };
        auto issue = [&](int stage, int pg) {
            int lo, hi;
            live(pg, lo, hi);
            const uint64_t base = (uint64_t)pages[pg] * (uint64_t)bs * row_stride;
            KT *kd = kbuf + stage * stage_elems, *vd = vbuf + stage * stage_elems;
            for (int c = lo * CH + tid; c < hi * CH; c += ATT_THREADS) {
                int t = c / CH, cc = c % CH;
                uint64_t off = base + (uint64_t)t * row_stride + (uint64_t)cc * 8;
                cuda_cp_async16(kd + t * D + k_swizzle<NP, CPT>(t, cc) * 8, kp + off);
                cuda_cp_async16(vd + t * D + cc * 8, vp + off);
            }
        };
        __syncthreads();
        const int part = tid % NP;
        float qr[GB][DPT];
#pragma unroll
        for (int h = 0; h < GB; h++)
#pragma unroll
            for (int k = 0; k < CPT; k++)
#pragma unroll
                for (int e = 0; e < 8; e++) qr[h][k * 8 + e] = q_s[h * D + (k * NP + part) * 8 + e];

        float acc[GB][8];
#pragma unroll
        for (int h = 0; h < GB; h++)
#pragma unroll
            for (int k = 0; k < 8; k++) acc[h][k] = 0.0f;

        for (int st = 0; st < n_st - 1; st++) {
            if (p_begin + st < p_end) issue(st, p_begin + st);
            cuda_cp_async_commit();
        }
        for (int pg = p_begin, it = 0; pg < p_end; pg++, it++) {
            cp_async_wait_n(n_st - 2);
            __syncthreads();
            if (pg + n_st - 1 < p_end) issue((it + n_st - 1) % n_st, pg + n_st - 1);
            cuda_cp_async_commit();
            const KT *kt = kbuf + (it % n_st) * stage_elems;
            const KT *vt = vbuf + (it % n_st) * stage_elems;
            int lo, hi;
            live(pg, lo, hi);

            /* scores: NP threads per token, q in registers */
            for (int tb = 0; tb < bs; tb += S::TPP) {
                const int t = tb + tid / NP;
                const bool ok = t >= lo && t < hi;
                float dot[GB];
#pragma unroll
                for (int h = 0; h < GB; h++) dot[h] = 0.0f;
                if (ok) {
#pragma unroll
                    for (int k = 0; k < CPT; k++) {
                        float kf[8];
                        cvt8<KT>(
                            *(const uint4 *)(kt + t * D + k_swizzle<NP, CPT>(t, k * NP + part) * 8),
                            kf);
#pragma unroll
                        for (int h = 0; h < GB; h++)
#pragma unroll
                            for (int e = 0; e < 8; e++)
                                dot[h] = fmaf(qr[h][k * 8 + e], kf[e], dot[h]);
                    }
                }
#pragma unroll
                for (int h = 0; h < GB; h++)
#pragma unroll
                    for (int o = NP / 2; o > 0; o >>= 1)
                        dot[h] += __shfl_xor_sync(0xffffffffu, dot[h], o);
                /* cap * tanh(s / cap) in the log2 domain: there s and cap both carry log2 e. */
                if (p.softcap_log2 > 0.0f) {
#pragma unroll
                    for (int h = 0; h < GB; h++)
                        dot[h] = p.softcap_log2 * tanhf(dot[h] / p.softcap_log2);
                }
                if (part == 0 && t < bs) {
#pragma unroll
                    for (int h = 0; h < GB; h++) sc_s[t * GB + h] = ok ? dot[h] : -INFINITY;
                }
            }
            __syncthreads();

            /* online softmax: warp per head */
            const int warp = tid >> 5, lane = tid & 31;
            for (int h = warp; h < GB; h += ATT_THREADS / 32) {
                float mx = -INFINITY;
                for (int t = lo + lane; t < hi; t += 32) mx = fmaxf(mx, sc_s[t * GB + h]);
                for (int o = 16; o > 0; o >>= 1)
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
                const float m_old = m_s[h], m_new = fmaxf(m_old, mx);
                float sum = 0.0f;
                for (int t = lo + lane; t < hi; t += 32) {
                    float e = exp2f(sc_s[t * GB + h] - m_new);
                    sc_s[t * GB + h] = e;
                    sum += e;
                }
                sum = cuda_warp_sum(sum);
                if (lane == 0) {
                    const float a = exp2f(m_old - m_new);
                    alpha_s[h] = a;
                    l_s[h] = l_s[h] * a + sum;
                    m_s[h] = m_new;
                }
            }
            __syncthreads();

            /* values: thread = (8 dims, token slice); where CH does not divide the CTA (head_dim
             * 96), the threads past NTG slices sit this phase out */
            const int cv = tid % CH, tg = tid / CH;
#pragma unroll
            for (int h = 0; h < GB; h++) {
                const float a = alpha_s[h];
#pragma unroll
                for (int k = 0; k < 8; k++) acc[h][k] *= a;
            }
            for (int t = lo + tg; tg < NTG && t < hi; t += NTG) {
                float vf[8];
                cvt8<KT>(*(const uint4 *)(vt + t * D + cv * 8), vf);
                float pr[GB];
#pragma unroll
                for (int h = 0; h < GB; h++) pr[h] = sc_s[t * GB + h];
#pragma unroll
                for (int h = 0; h < GB; h++)
#pragma unroll
                    for (int k = 0; k < 8; k++) acc[h][k] = fmaf(pr[h], vf[k], acc[h][k]);
            }
        }
        cuda_cp_async_wait<0>();
        __syncthreads();

        /* Sum the token slices; the stage buffers are free now. */
        {
            const int cv = tid % CH, tg = tid / CH;
#pragma unroll
            for (int h = 0; h < GB; h++)
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (tg < NTG) red[(tg * GB + h) * D + cv * 8 + k] = acc[h][k];
        }
        __syncthreads();
        for (int i = tid; i < GB * D; i += ATT_THREADS) {
            const int h = i / D, d = i % D;
            float v = 0.0f;
            for (int g = 0; g < NTG; g++) v += red[(g * GB + h) * D + d];
            const int hg = head0 + h;
            float l = l_s[h], r = 1.0f;
            if (p.sinks) {
                /* Against the larger of the running max and the sink, so neither overflows. */
                const float sk = p.sinks[hg] * CUDA_LOG2E, m = fmaxf(m_s[h], sk);
                r = exp2f(m_s[h] - m);
                l = l * r + exp2f(sk - m);
            }
            v = l > 0.0f ? v * r / l : 0.0f;
            if (p.split) {
                const size_t cell = ((size_t)drow * p.max_chunks + chunk) * p.n_heads + hg;
                p.partial[cell * D + d] = v;
                if (d == 0) p.lse[cell] = l > 0.0f ? (m_s[h] + log2f(l)) * ATT_LN2 : -INFINITY;
            } else {
                cuda_store(p.out, p.out_dt, (size_t)row * p.n_heads * D + (size_t)hg * D + d, v);
            }
        }
        __syncthreads();
    }
    cuda_pdl_wait();
}

/* ---- Decode rows on the tensor cores ----
 *
 * One CTA per (decode row, kv head, chunk) serves the group's query heads. The chunk's tokens
 * are cut into tiles of ATT_TC_TILE (32); each of the ATT_TC_WARPS warps takes every
 * ATT_TC_WARPS-th tile and streams it through its own att_stages shared-memory stages, so the
 * main loop needs no block-wide barrier (split-K inside the CTA); the warps' softmax states
 * are combined once at the end, register to register: each warp hands the other, through a
 * 4 KB exchange beside the stages, the half of its O^T tiles that one finishes, with its max
 * and sum per head, and stores its own half of the dims.
 *
 * The products run transposed, with the tokens as mma.sync m16n8k16's M rows and the heads as
 * its 8 N columns (two n-tiles for groups past 8): S^T = K Q^T with K read by ldmatrix and
 * q's B fragments held in registers, then O^T += V^T P^T with V read by ldmatrix.trans and
 * P^T, the B operand, made from S^T's accumulators by movmatrix. A group of 4 so fills half
 * of each MMA rather than a quarter (with the q heads as the M rows), which halves the MMAs
 * per token, and a step's fixed work (waits, the max's shuffles, the rescale) is spread over
 * 32 tokens. Softmax runs online in F32 in the log2 domain; a head's maximum travels across
 * the 8 lanes that hold its tokens.
 *
 * Loads are bulk tensor copies (TMA): each pool is described to the hardware as a 5-D tensor
 * [page][kv head][half of D][token in page][64 dims] (att_tc_map), and one copy moves a box of
 * 16 tokens of one kv head into shared memory with the 128-byte swizzle (the 16-byte chunk
 * index XOR the row), which keeps ldmatrix's rows in distinct banks. A tile is two boxes, each
 * within one page (pages hold a multiple of 16 tokens), its K and V copies completing on
 * separate mbarriers: K's half of a stage is refilled once S is computed, V's after P V. Lane
 * 0 issues every copy of its warp; the page table is read 16 tiles ahead into a lane-held
 * window. The copies are evict-first in L2 (att_tma_load). Slots no live token of the chunk holds
 * (before the first-page offset, past the last token or the chunk) get a score of -inf, and their V
 * rows are zeroed, since the pool may hold NaN there and 0 * NaN would reach the output.
 *
 * MMA inputs are the pool's dtype. SPLIT > 1 carries q and P as that many terms (the value
 * rounded, then the rounded remainder, ...), each a separate MMA into the same F32
 * accumulator: the F32 activation path then keeps F32-level accuracy while K and V, exact in
 * the pool's dtype, are read once.
 *
 * Measured on the H200 (Llama-3.1-8B decode, f16 KV, F32 q and out, the planner's chunking;
 * tools/reference/sdpa_peer.py --ours, 7 trials in turns with cuDNN SDPA on contiguous K/V),
 * TB/s of K+V at 1x131072 / 4x16384 / 16x8192 / 64x4096 / 256x2048: 3.83 / 3.38 / 3.85 / 3.83
 * / 4.08, cuDNN 4.12 / 3.78 / 4.26 / 4.37 / 4.40, ratios 0.930 / 0.895 / 0.903 / 0.877 / 0.927.
 * The kernel before (16-token tiles, q heads as the M rows, 16-byte or per-row bulk copies)
 * stood at 0.858 / 0.809 / 0.824 / 0.763 / 0.818 of cuDNN. Three stages per warp (two CTAs per
 * SM) read 3.42 / 2.92 / 3.37 / 3.69 / 4.11 against two stages' 3.91 / 3.44 / 3.90 / 3.97 /
 * 4.23 in one run. With the boxes' loads near their ceiling (4.58 TB/s, att_tc_map), the rest
 * goes per call and per CTA: ncu at 4x16384 (one wave of 384 CTAs) times the kernel at 74.5
 * us, 75% of DRAM peak on average, and the merge after it at 6.7 us; at 64x4096 270.9 us at 83%
 * and 7.4 us, half of the warps' stall cycles on shared-memory results (the copies' barriers,
 * ldmatrix).
 * In turns with main's build and cuDNN on one H200 (5 trials; 64x4096 / 4x16384 / 16x8192 /
 * 256x2048 / 1x131072), the combine through the exchange and the merge's early partial loads
 * read 0.891 / 0.920 / 0.903 / 0.930 / 0.938 of cuDNN against main's 0.891 / 0.900 / 0.898 /
 * 0.934 / 0.926; on another H200 0.879 / 0.894 / 0.893 / 0.906 / 0.927 against 0.883 / 0.893 /
 * 0.893 / 0.931 / 0.927, and with evict-first copies 0.892 / 0.919 / 0.905 / 0.921 / 0.946.
 * This kernel (all three, 7 trials, a third H200): 0.915 / 0.941 / 0.926 / 0.955 / 0.963
 * against main's 0.886 / 0.887 / 0.896 / 0.932 / 0.928.
 * Tried there and not kept: resident CTAs (3 per SM) walking the (row, kv head, chunk) items,
 * each warp issuing the next item's first tiles before the combine, so that no launch or
 * combine leaves a slot's DRAM share idle: items taken statically 0.844 / 0.918 / 0.903 /
 * 0.874 / 0.937, from an atomic queue (the last CTA resetting it) 0.859 / 0.916 / 0.903 /
 * 0.928 / 0.938, the queue over 2x and 3x the planner's chunks down to 0.813 / 0.746 / 0.791
 * / 0.928 / 0.789; two and three items per CTA 0.846 / 0.800 / 0.822 / 0.897 / 0.862 and
 * 0.719 / 0.555 / 0.568 / 0.878 / 0.600; tiles prefetched into L2 (bulk tensor prefetch) one
 * and two past the stages 0.760 / 0.780 / 0.770 / 0.813 / 0.796 and 0.733 / 0.734 / 0.726 /
 * 0.784 / 0.746, with evict-first copies 0.758 / 0.774 / 0.767 / 0.815 / 0.793. */
#define ATT_TC_WARPS 2
#define ATT_TC_ROWS  16 /* query heads a CTA serves at most: two n-tiles */
#define ATT_TC_TILE  32 /* tokens per step of a warp */
#define ATT_TC_BOX   16 /* tokens per bulk tensor copy */
#define ATT_TC_CTAS  3  /* resident per SM: shared memory binds */

/* The SPLIT terms of the pair (x, y) in the pool's dtype, packed: term s holds what terms
 * 0..s-1 left over, rounded. */
template <typename KT, int SPLIT>
__device__ __forceinline__ void split2(float x, float y, uint32_t *terms) {
#pragma unroll
    for (int s = 0; s < SPLIT; s++) {
        terms[s] = cuda_pack2<KT>(x, y);
        float2 r = cuda_unpack2<KT>(terms[s]);
        x -= r.x;
        y -= r.y;
    }
}

/* Shared memory of the tensor-core decode kernel: 1 KB of slack to align the stages to the
 * swizzle's 1 KB period, every warp's stages of K and V tiles, every warp's (2, stages)
 * barriers, then the exchange through which the warps combine a row (att_tc_xch_floats). */
static __host__ __device__ size_t att_tc_work_bytes(int head_dim, int n_stages) {
    return (size_t)ATT_TC_WARPS * n_stages * 2 * ATT_TC_TILE * head_dim * 2;
}

/* Per warp: the half of its O^T accumulators that the other warp finishes, as
 * (D / 32 m-tiles, nt n-tiles, 4, 32 lanes) floats, then its max and sum of each head
 * (2 [max, sum], nt n-tiles, 2, 4) floats. */
static size_t att_tc_xch_floats(int head_dim, int nt) {
    return (size_t)(head_dim / 32) * nt * 4 * 32 + 2 * (size_t)nt * 2 * 4;
}

static size_t att_tc_smem_bytes(int head_dim, int n_stages, int nt) {
    return 1024 + att_tc_work_bytes(head_dim, n_stages) + (size_t)ATT_TC_WARPS * n_stages * 16 +
           ATT_TC_WARPS * att_tc_xch_floats(head_dim, nt) * sizeof(float);
}

__device__ __forceinline__ void att_mbar_init(uint64_t *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(cuda_smem_addr(bar)) : "memory");
}

/* The arrival of a phase that completes once `bytes` more have landed. */
__device__ __forceinline__ void att_mbar_expect(uint64_t *bar, uint32_t bytes) {
    asm volatile(
        "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(cuda_smem_addr(bar)),
        "r"(bytes)
        : "memory");
}

__device__ __forceinline__ void att_mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile("{\n"
                 ".reg .pred done;\n"
                 "wait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n"
                 "}\n" ::"r"(cuda_smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}

/* One box of `map` at (token in page, kv head, page) into shared memory, completing on bar,
 * evict-first in L2: each K/V byte is read once, and the lines it would keep would push out
 * what is read again (the page table, q, the partials the merge reads back). */
__device__ __forceinline__ void att_tma_load(void *smem, const CUtensorMap *map, int tok, int kvh,
                                             int page, uint64_t *bar) {
    asm volatile("{\n"
                 ".reg .b64 pol;\n"
                 "createpolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
                 "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".L2::cache_hint [%0], [%1, {%2, %3, %4, %5, %6}], [%7], pol;\n"
                 "}\n" ::"r"(cuda_smem_addr(smem)),
                 "l"(map), "r"(0), "r"(tok), "r"(0), "r"(kvh), "r"(page), "r"(cuda_smem_addr(bar))
                 : "memory");
}

/* The 8x8 b16 matrix of a fragment register, transposed across the warp. */
__device__ __forceinline__ uint32_t att_movtrans(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

/* Byte offset of 16-byte chunk c of token t in a box as the 128-byte swizzle lays it out:
 * [half of D][16 tokens][128 bytes], the chunk index within 128 bytes XORed with the row. */
__device__ __forceinline__ uint32_t att_box_off(int t, int c) {
    return (uint32_t)((c >> 3) * ATT_TC_BOX * 128 + t * 128 + (((c & 7) ^ (t & 7)) << 4));
}

/* Registers bound nothing at three CTAs of two warps per SM (255 each); two stages of
 * 32-token tiles take 64 KB per CTA at head_dim 128. NT: n-tiles of 8 query heads. */
template <int D, int SPLIT, typename KT, int NT>
__global__ void __launch_bounds__(ATT_TC_WARPS * 32, ATT_TC_CTAS)
    paged_decode_mma_kernel(att_params p, const __grid_constant__ CUtensorMap kmap,
                            const __grid_constant__ CUtensorMap vmap) {
    constexpr int KS = D / 16;                    /* k-steps of S^T, m-tiles of O^T */
    constexpr uint32_t BOXB = ATT_TC_BOX * D * 2; /* bytes of one box */
    constexpr uint32_t TILEB = 2 * BOXB;          /* bytes of a tile of K (or of V) */
    constexpr int NB = ATT_TC_TILE / ATT_TC_BOX;  /* boxes per tile, m-tiles of S^T */
    static_assert(D % 64 == 0 && NB == 2, "the swizzle and the window need these");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - (cuda_smem_addr(smem_raw) & 1023u)) & 1023u);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c4 = lane & 3;
    const int n_st = p.stages, bs = p.block_size;
    unsigned char *wbuf = smem + (size_t)warp * n_st * 2 * TILEB;
    uint64_t *wbar = (uint64_t *)(smem + att_tc_work_bytes(D, n_st)) + warp * n_st * 2;
    float *xch = (float *)(smem + att_tc_work_bytes(D, n_st) + (size_t)ATT_TC_WARPS * n_st * 16);
    constexpr int KH = KS / 2;           /* m-tiles each warp finishes */
    constexpr int XO = KH * NT * 4 * 32; /* floats of a warp's half of O^T in the exchange */
    constexpr int XW = XO + 2 * NT * 2 * 4;
    static_assert(ATT_TC_WARPS == 2, "the exchange pairs two warps");
    if (lane == 0)
        for (int i = 0; i < 2 * n_st; i++) att_mbar_init(wbar + i);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
    uint32_t used = 0; /* tiles this warp has streamed through its stages */
    const int kvh = blockIdx.x, chunk = blockIdx.y;
    const int head0 = kvh * p.group;

    /* A split's merge waits for this grid to finish, and starting it early costs nothing but
     * its launch: let it start once every CTA here has. */
    if (p.split) cuda_pdl_trigger();

    for (int row = blockIdx.z; row < p.n_tokens; row += gridDim.z) {
        /* A CTA's first copy waits on this chain of loads: with every sequence decoding, the
         * row is the sequence, without a search through q_indptr. */
        const int s = p.all_decode ? row : seq_of_row(p.q_indptr, p.n_seqs, row);
        if (!p.all_decode && p.q_indptr[s + 1] - p.q_indptr[s] != 1) continue;
        const int n_vis = p.kv_len[s];
        int fpo, p_begin, p_end;
        if (!chunk_pages(p, s, n_vis, chunk, &fpo, &p_begin, &p_end)) continue;
        const int32_t *pages = p.page_indices + p.page_indptr[s];
        const int drow = p.split ? decode_rank(p, s) : 0;
        /* Slot u of the sequence is live here when u_lo <= u < hi, lo past the keys a window
         * leaves out; the chunk's tiles start at u0 (16-aligned, so that each box lies within
         * one page). */
        const int u_lo = fpo + (p.window > 0 && n_vis > p.window ? n_vis - p.window : 0);
        const int hi = fpo + n_vis < p_end * bs ? fpo + n_vis : p_end * bs;
        const int u0 = max(p_begin * bs, u_lo / ATT_TC_BOX * ATT_TC_BOX);
        const int n_tiles = (hi - u0 + ATT_TC_TILE - 1) / ATT_TC_TILE;
        const int n_my = n_tiles > warp ? (n_tiles - warp + ATT_TC_WARPS - 1) / ATT_TC_WARPS : 0;

        /* Box b of this warp (box 2i + j of its tile i) starts at slot box_u(b); lane l holds
         * the page of box 32 w + l in window w, and window w + 1 is read as window w starts,
         * so that issuing a copy never waits on the page table. */
        auto box_u = [&](int b) {
            return u0 + (warp + (b >> 1) * ATT_TC_WARPS) * ATT_TC_TILE + (b & 1) * ATT_TC_BOX;
        };
        auto page_of = [&](int b) -> int {
            const int u = box_u(b);
            return b < 2 * n_my && u < hi ? pages[u / bs] : 0;
        };
        int win_cur = page_of(lane), win_nxt = page_of(32 + lane);
        cuda_pdl_wait();
        /* Tile i's K (part 0) or V (part 1) into stage stg: boxes past the live slots are
         * skipped; tiles are issued in order, K before V. */
        auto issue = [&](int i, int part, int stg) {
            if (part == 0 && i > 0 && (2 * i) % 32 == 0) {
                win_cur = win_nxt;
                win_nxt = page_of(2 * i + 32 + lane);
            }
            const int pg0 = __shfl_sync(0xffffffffu, win_cur, (2 * i) & 31);
            const int pg1 = __shfl_sync(0xffffffffu, win_cur, (2 * i + 1) & 31);
            if (lane == 0) {
                const int ua = box_u(2 * i), ub = ua + ATT_TC_BOX;
                uint64_t *bar = wbar + part * n_st + stg;
                unsigned char *dst = wbuf + (size_t)(stg * 2 + part) * TILEB;
                const CUtensorMap *map = part ? &vmap : &kmap;
                att_mbar_expect(bar, ub < hi ? TILEB : BOXB);
                att_tma_load(dst, map, ua % bs, kvh, pg0, bar);
                if (ub < hi) att_tma_load(dst + BOXB, map, ub % bs, kvh, pg1, bar);
            }
        };

        int stg = (int)(used % n_st);
        uint32_t par = (used / n_st) & 1;
        for (int i = 0, s2 = stg; i < n_st && i < n_my; i++) {
            issue(i, 0, s2);
            issue(i, 1, s2);
            s2 = s2 + 1 == n_st ? 0 : s2 + 1;
        }
        /* q's terms as B fragments: qb[sp][ks][nt] holds head 8 nt + g, dims 16 ks + 2 c4
         * (+1) and, in its second register, 8 dims further. */
        uint32_t qb[SPLIT][KS][NT][2];
        const size_t qbase = (size_t)row * p.n_heads * D + (size_t)head0 * D;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int h = nt * 8 + g, col = ks * 16 + r * 8 + c4 * 2;
                    float x = 0.0f, y = 0.0f;
                    if (h < p.group) {
                        x = cuda_load(p.q, p.q_dt, qbase + (size_t)h * D + col);
                        y = cuda_load(p.q, p.q_dt, qbase + (size_t)h * D + col + 1);
                    }
                    uint32_t t[SPLIT];
                    split2<KT, SPLIT>(x, y, t);
#pragma unroll
                    for (int sp = 0; sp < SPLIT; sp++) qb[sp][ks][nt][r] = t[sp];
                }

        /* O^T accumulators: o[m][nt] holds dims 16 m + g (+8 in elements 2, 3) of heads
         * 8 nt + 2 c4 (+1 in odd elements); m and l those two heads' running max and sum. */
        float o[KS][NT][4];
#pragma unroll
        for (int m = 0; m < KS; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                o[m][nt][0] = o[m][nt][1] = o[m][nt][2] = o[m][nt][3] = 0.0f;
        float mx[NT][2], l[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
            mx[nt][0] = mx[nt][1] = -INFINITY, l[nt][0] = l[nt][1] = 0.0f;

        for (int i = 0; i < n_my; i++) {
            const unsigned char *kt = wbuf + (size_t)(stg * 2) * TILEB;
            unsigned char *vt = wbuf + (size_t)(stg * 2 + 1) * TILEB;
            const int ut = box_u(2 * i);
            att_mbar_wait(wbar + stg, par);

            /* S^T, even and odd k-steps into separate accumulators, halving the chain of
             * dependent MMAs. x4: matrices are (tokens +0/+8) x (dims +0/+8) of a k-step. */
            float sc[NB][NT][4], sx[NB][NT][4];
#pragma unroll
            for (int mt = 0; mt < NB; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) sc[mt][nt][e] = sx[mt][nt][e] = 0.0f;
#pragma unroll
            for (int mt = 0; mt < NB; mt++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    uint32_t a[4];
                    const int t = ((lane >> 3) & 1) * 8 + (lane & 7), c = ks * 2 + (lane >> 4);
                    cuda_ldmatrix_x4(a, kt + mt * BOXB + att_box_off(t, c));
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int sp = 0; sp < SPLIT; sp++)
                            cuda_mma16816<KT>(ks & 1 ? sx[mt][nt] : sc[mt][nt], a,
                                              qb[sp][ks][nt][0], qb[sp][ks][nt][1]);
                }

            /* Online softmax per head column: a thread's 4 tokens, then the 8 lanes (g) that
             * share its heads, through shuffles; the sum stays per thread until the end. */
            const bool whole = ut >= u_lo && ut + ATT_TC_TILE <= hi;
            float alpha[NT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float tmx[2] = {mx[nt][0], mx[nt][1]};
#pragma unroll
                for (int mt = 0; mt < NB; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int u = ut + mt * ATT_TC_BOX + g + (e >> 1) * 8;
                        float v = (sc[mt][nt][e] + sx[mt][nt][e]) * p.scale_log2;
                        /* cap * tanh(s / cap) in the log2 domain, where both carry log2 e */
                        if (p.softcap_log2 > 0.0f) v = p.softcap_log2 * tanhf(v / p.softcap_log2);
                        if (!whole && (u < u_lo || u >= hi)) v = -INFINITY;
                        sc[mt][nt][e] = v;
                        tmx[e & 1] = fmaxf(tmx[e & 1], v);
                    }
#pragma unroll
                for (int r = 0; r < 2; r++) {
#pragma unroll
                    for (int o2 = 4; o2 < 32; o2 <<= 1)
                        tmx[r] = fmaxf(tmx[r], __shfl_xor_sync(0xffffffffu, tmx[r], o2));
                    const float base = tmx[r] == -INFINITY ? 0.0f : tmx[r];
                    alpha[nt][r] = exp2f(mx[nt][r] - base);
                    mx[nt][r] = tmx[r];
                    l[nt][r] *= alpha[nt][r];
                }
#pragma unroll
                for (int mt = 0; mt < NB; mt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const float base = mx[nt][e & 1] == -INFINITY ? 0.0f : mx[nt][e & 1];
                        const float pe = exp2f(sc[mt][nt][e] - base);
                        sc[mt][nt][e] = pe;
                        l[nt][e & 1] += pe;
                    }
            }
            /* Once the running max settles, tiles leave it alone: skip the rescale then. */
            bool moved = false;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) moved |= alpha[nt][0] != 1.0f || alpha[nt][1] != 1.0f;
            if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
                for (int m = 0; m < KS; m++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        o[m][nt][0] *= alpha[nt][0], o[m][nt][1] *= alpha[nt][1];
                        o[m][nt][2] *= alpha[nt][0], o[m][nt][3] *= alpha[nt][1];
                    }
            }
            /* P^T as B fragments: S^T's registers pair two heads of one token, an 8x8 matrix
             * of (token, head) that movmatrix turns into (head, token) pairs. */
            uint32_t pb[NB][NT][2][SPLIT];
#pragma unroll
            for (int mt = 0; mt < NB; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        uint32_t t[SPLIT];
                        split2<KT, SPLIT>(sc[mt][nt][2 * r], sc[mt][nt][2 * r + 1], t);
#pragma unroll
                        for (int sp = 0; sp < SPLIT; sp++) pb[mt][nt][r][sp] = att_movtrans(t[sp]);
                    }
            /* S, hence every ldmatrix of K, is spent: refill K's half of the stage */
            __syncwarp();
            if (i + n_st < n_my) issue(i + n_st, 0, stg);

            att_mbar_wait(wbar + n_st + stg, par);
            if (!whole) {
                /* lane t zeroes token t's V row when that slot is not live here */
                const int u = ut + lane;
                if (u < u_lo || u >= hi) {
                    unsigned char *r0 = vt + (lane >> 4) * BOXB + (lane & 15) * 128;
#pragma unroll
                    for (int h = 0; h < D / 64; h++)
#pragma unroll
                        for (int c = 0; c < 8; c++)
                            *(uint4 *)(r0 + h * ATT_TC_BOX * 128 + c * 16) = make_uint4(0, 0, 0, 0);
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
            }
            /* O^T += V^T P^T: x4.trans matrices are (dims +0/+8) x (tokens +0/+8). */
#pragma unroll
            for (int mt = 0; mt < NB; mt++)
#pragma unroll
                for (int m = 0; m < KS; m++) {
                    uint32_t a[4];
                    const int t = (lane >> 4) * 8 + (lane & 7), c = m * 2 + ((lane >> 3) & 1);
                    cuda_ldmatrix_x4_trans(a, vt + mt * BOXB + att_box_off(t, c));
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int sp = 0; sp < SPLIT; sp++)
                            cuda_mma16816<KT>(o[m][nt], a, pb[mt][nt][0][sp], pb[mt][nt][1][sp]);
                }
            __syncwarp();
            if (i + n_st < n_my) issue(i + n_st, 1, stg);
            if (++stg == n_st) stg = 0, par ^= 1;
        }
        used += n_my;
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int o2 = 4; o2 < 32; o2 <<= 1)
                    l[nt][r] += __shfl_xor_sync(0xffffffffu, l[nt][r], o2);
        /* Combine the warps: each hands the other the m-tiles that one finishes, with its
         * max and sum per head, then finishes its own half of the dims. */
        const int oth = warp ^ 1;
        float *mine = xch + warp * XW, *theirs = xch + oth * XW;
#pragma unroll
        for (int mm = 0; mm < KH; mm++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    mine[((mm * NT + nt) * 4 + e) * 32 + lane] =
                        warp ? o[mm][nt][e] : o[KH + mm][nt][e];
        if (g == 0) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    mine[XO + (nt * 2 + r) * 4 + c4] = mx[nt][r];
                    mine[XO + NT * 8 + (nt * 2 + r) * 4 + c4] = l[nt][r];
                }
        }
        __syncthreads();
        float fs[NT][2], fo[NT][2], den[NT][2], mmax[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const float mo = theirs[XO + (nt * 2 + r) * 4 + c4];
                const float lo = theirs[XO + NT * 8 + (nt * 2 + r) * 4 + c4];
                mmax[nt][r] = fmaxf(mx[nt][r], mo);
                fs[nt][r] = mx[nt][r] == -INFINITY ? 0.0f : exp2f(mx[nt][r] - mmax[nt][r]);
                fo[nt][r] = mo == -INFINITY ? 0.0f : exp2f(mo - mmax[nt][r]);
                den[nt][r] = fs[nt][r] * l[nt][r] + fo[nt][r] * lo;
                const int h = nt * 8 + c4 * 2 + r;
                if (p.sinks && h < p.group) {
                    /* the sink's logit joins the denominator, against the larger max */
                    const float sk = p.sinks[head0 + h] * CUDA_LOG2E;
                    const float m2 = fmaxf(mmax[nt][r], sk);
                    const float f = mmax[nt][r] == -INFINITY ? 0.0f : exp2f(mmax[nt][r] - m2);
                    fs[nt][r] *= f, fo[nt][r] *= f;
                    den[nt][r] = den[nt][r] * f + exp2f(sk - m2);
                    mmax[nt][r] = m2;
                }
            }
        float res[KH][NT][4];
#pragma unroll
        for (int mm = 0; mm < KH; mm++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float num = fs[nt][e & 1] * (warp ? o[KH + mm][nt][e] : o[mm][nt][e]) +
                                      fo[nt][e & 1] * theirs[((mm * NT + nt) * 4 + e) * 32 + lane];
                    res[mm][nt][e] = den[nt][e & 1] > 0.0f ? num / den[nt][e & 1] : 0.0f;
                }
        /* the exchange is read: the next row may write it */
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int h = nt * 8 + c4 * 2 + r;
                if (h >= p.group) continue;
                const int hg = head0 + h;
                const size_t cell = ((size_t)drow * p.max_chunks + chunk) * p.n_heads + hg;
                if (p.split && warp == 0 && g == 0)
                    p.lse[cell] =
                        den[nt][r] > 0.0f ? (mmax[nt][r] + log2f(den[nt][r])) * ATT_LN2 : -INFINITY;
#pragma unroll
                for (int mm = 0; mm < KH; mm++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const int d = (warp * KH + mm) * 16 + g + hf * 8;
                        const float v = res[mm][nt][hf * 2 + r];
                        if (p.split)
                            p.partial[cell * D + d] = v;
                        else
                            cuda_store(p.out, p.out_dt,
                                       (size_t)row * p.n_heads * D + (size_t)hg * D + d, v);
                    }
            }
    }
    cuda_pdl_wait();
}

/* Combines a decode row's chunks: weights exp(lse_c - max) over its own chunk count. Warps
 * serve (row, head) pairs: MW = 1 gives each warp a pair of its own, four to a CTA, for many
 * rows of few chunks; MW = ATT_MERGE_WARPS gives a pair the CTA's warps, each summing every
 * MW-th chunk, then combined through shared memory, for few rows of many chunks. A lane holds
 * D / 32 dimensions and loads them as vectors; the weights of 32 chunks at a time travel by
 * shuffle, so a warp keeps many independent loads in flight. A CTA of 512 threads per pair
 * (H200) made v2 of one chunk at 256 x 2048 tokens 10% slower than v1 (3.33 against 3.71 TB/s)
 * and took 9 us after the 151 us attention of one 131072-token row in 49 chunks; this one
 * takes 7 us after the 154 us attention at 16 x 8192 in 3 chunks, bound by the latency of its
 * few dependent loads: a warp's first MERGE_PREFETCH partials are loaded beside the weights,
 * and with every sequence decoding the row is the sequence, without a search.
 * Tried and not kept: the merge folded into the tensor-core kernel, the last CTA of each
 * (decode row, kv head) to arrive at a counter merging the row's chunks in chunk order (the
 * wide decode kernel's scheme), with no merge launch and no early trigger. In turns with
 * cuDNN on one H200 (5 trials, fold on against off, planner's chunking), ratios at 1x131072 /
 * 4x16384 / 16x8192 / 64x4096: 0.887 against 0.926, 0.867 against 0.885, 0.894 against 0.892,
 * 0.870 against 0.881 (256x2048 runs v1 either way: 0.917 / 0.918). Every CTA then waits for
 * its fence and the counter's atomic before it frees its slot, which costs more than the merge
 * launch saves where CTAs run in several waves, and one CTA of 64 threads per kv head merges
 * 49 chunks (1x131072) far slower than the merge kernel's 4 warps per query head; ncu at 4x16384
 * timed the folded kernel at 79.2-80.1 us against 74.5 plus a 6.5-7.0 us merge here. */
#define ATT_MERGE_WARPS 4

/* Decode rows before sequence s (the workspace numbering), counted by one warp. */
__device__ int warp_decode_rank(const att_params &p, int s, int lane) {
    if (p.all_decode) return s;
    int c = 0;
    for (int i = lane; i < s; i += 32) c += p.q_indptr[i + 1] - p.q_indptr[i] == 1;
    for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
    return c;
}

/* VEC consecutive floats from a 4 * VEC-byte aligned address. */
template <int VEC> __device__ __forceinline__ void load_vec(const float *src, float *x) {
    if constexpr (VEC % 4 == 0) {
#pragma unroll
        for (int i = 0; i < VEC; i += 4) {
            const float4 v = *(const float4 *)(src + i);
            x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
        }
    } else if constexpr (VEC == 2) {
        const float2 v = *(const float2 *)src;
        x[0] = v.x, x[1] = v.y;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++) x[i] = src[i];
    }
}

/* Chunks of a warp whose partials are loaded before their weights are known. */
#define MERGE_PREFETCH 4

template <int D, int MW>
__global__ void __launch_bounds__(ATT_MERGE_WARPS * 32) merge_kernel(att_params p) {
    constexpr int VEC = D / 32;                 /* dimensions per lane */
    constexpr int PAIRS = ATT_MERGE_WARPS / MW; /* (row, head) pairs per CTA */
    __shared__ float num_s[MW > 1 ? MW : 1][D]; /* each warp's weighted sum */
    __shared__ float mx_s[MW], den_s[MW];       /* each warp's max and weight sum */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % MW;
    const int64_t n_pairs = (int64_t)p.n_tokens * p.n_heads;
    for (int64_t base = (int64_t)blockIdx.x * PAIRS; base < n_pairs;
         base += (int64_t)gridDim.x * PAIRS) {
        const int64_t pair = base + warp / MW;
        const int row = (int)(pair / p.n_heads), hg = (int)(pair % p.n_heads);
        bool live = pair < n_pairs;
        int s = 0;
        if (live && !p.all_decode) {
            s = seq_of_row(p.q_indptr, p.n_seqs, row);
            live = p.q_indptr[s + 1] - p.q_indptr[s] == 1;
        } else {
            s = row;
        }
        float num[VEC], mx = -INFINITY, den = 0.0f;
#pragma unroll
        for (int v = 0; v < VEC; v++) num[v] = 0.0f;
        if (live) {
            const int drow = warp_decode_rank(p, s, lane);
            const int fpo = p.first_page_offset ? p.first_page_offset[s] : 0;
            const int n_pages = (fpo + p.kv_len[s] + p.block_size - 1) / p.block_size;
            const int n_chunks = (n_pages + p.pages_per_chunk - 1) / p.pages_per_chunk;
            const int mine = n_chunks > slice ? (n_chunks - slice + MW - 1) / MW : 0;
            const size_t cell0 = (size_t)drow * p.max_chunks * p.n_heads + hg;
            const float *lse = p.lse + cell0 + (size_t)slice * p.n_heads;
            const float *part = p.partial + (cell0 + (size_t)slice * p.n_heads) * D + lane * VEC;
            const size_t step = (size_t)MW * p.n_heads; /* cells between this warp's chunks */
            cuda_pdl_wait();
            /* The first chunks' partials load beside the weights rather than after them: the
             * merge is a short chain of dependent loads, each an L2 round trip. */
            float xp[MERGE_PREFETCH][VEC];
#pragma unroll
            for (int j = 0; j < MERGE_PREFETCH; j++)
                if (j < mine) load_vec<VEC>(part + (size_t)j * step * D, xp[j]);
            const float lse0 = lane < mine ? lse[lane * step] : -INFINITY;
            mx = lse0;
            for (int k = lane + 32; k < mine; k += 32) mx = fmaxf(mx, lse[k * step]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (mx != -INFINITY) {
                for (int kb = 0; kb < mine; kb += 32) {
                    const float lk = kb == 0            ? lse0
                                     : kb + lane < mine ? lse[(kb + lane) * step]
                                                        : 0.0f;
                    const float w = kb + lane < mine ? __expf(lk - mx) : 0.0f;
                    den += w;
                    const int nk = mine - kb < 32 ? mine - kb : 32;
                    if (kb == 0) {
#pragma unroll
                        for (int j = 0; j < MERGE_PREFETCH; j++) {
                            const float wj = __shfl_sync(0xffffffffu, w, j);
                            if (j < nk)
#pragma unroll
                                for (int v = 0; v < VEC; v++) num[v] = fmaf(wj, xp[j][v], num[v]);
                        }
                    }
#pragma unroll 8
                    for (int j = kb == 0 ? MERGE_PREFETCH : 0; j < nk; j++) {
                        const float wj = __shfl_sync(0xffffffffu, w, j);
                        float x[VEC];
                        load_vec<VEC>(part + (size_t)(kb + j) * step * D, x);
#pragma unroll
                        for (int v = 0; v < VEC; v++) num[v] = fmaf(wj, x[v], num[v]);
                    }
                }
                den = cuda_warp_sum(den);
            }
        }
        const size_t out0 = (size_t)row * p.n_heads * D + (size_t)hg * D + lane * VEC;
        if (MW == 1) {
            if (live) {
#pragma unroll
                for (int v = 0; v < VEC; v++)
                    cuda_store(p.out, p.out_dt, out0 + v, den > 0.0f ? num[v] / den : 0.0f);
            }
            continue;
        }
        /* The CTA's warps share one pair: rescale each warp's sums to the common max. */
        if (lane == 0) mx_s[slice] = mx, den_s[slice] = den;
#pragma unroll
        for (int v = 0; v < VEC; v++) num_s[slice][lane * VEC + v] = num[v];
        __syncthreads();
        if (warp == 0 && live) {
            float m = -INFINITY;
#pragma unroll
            for (int w = 0; w < MW; w++) m = fmaxf(m, mx_s[w]);
            float a[VEC], b = 0.0f;
#pragma unroll
            for (int v = 0; v < VEC; v++) a[v] = 0.0f;
#pragma unroll
            for (int w = 0; w < MW; w++) {
                const float f = mx_s[w] == -INFINITY ? 0.0f : __expf(mx_s[w] - m);
                b += f * den_s[w];
#pragma unroll
                for (int v = 0; v < VEC; v++) a[v] += f * num_s[w][lane * VEC + v];
            }
#pragma unroll
            for (int v = 0; v < VEC; v++)
                cuda_store(p.out, p.out_dt, out0 + v, b > 0.0f ? a[v] / b : 0.0f);
        }
        __syncthreads();
    }
    cuda_pdl_wait();
}

/* Every kernel here launches with PDL (cuda_launch_pdl): it may start while the kernel before
 * it ends, reads the batch's arrays before its wait and q, the pool and the workspace after it,
 * and never triggers its dependents early (but the tensor-core kernel of a split, followed by
 * the merge), so the o GEMV after it starts when it ends. On the H200, batch-1 decode of the 8B
 * shape at contexts 512 to 640 (v1 on 8 CTAs; tok/s of the decode step): plain launches 480.1,
 * PDL 486.1, PDL with a trigger at each CTA's start 462.8 (the GEMV's early weight loads then
 * slow the attention itself), PDL with the chunk's K and V prefetched to L2 before the wait
 * 483.0. */
template <typename K>
static int att_launch(cuda_backend *c, K kern, dim3 grid, int threads, size_t smem,
                      const att_params &p, const char *what, base_err *err) {
    if (cuda_smem_limit(kern, smem, what, err)) return -1;
    return cuda_launch_pdl(c, kern, grid, dim3(threads), smem, what, err, p);
}

static size_t att_smem_bytes(int head_dim, int gb, int block_size, int n_stages, size_t kv_size) {
    size_t stages = 2 * (size_t)n_stages * block_size * head_dim * kv_size;
    size_t red = (size_t)(ATT_THREADS / (head_dim / 8)) * gb * head_dim * sizeof(float);
    return (stages > red ? stages : red) +
           ((size_t)gb * head_dim + (size_t)block_size * gb + 3 * gb) * sizeof(float);
}

template <int D, int GB, typename KT>
static int launch_attention(const att_params &p, dim3 grid, size_t smem, cuda_backend *c,
                            base_err *err) {
    return att_launch(c, paged_attention_kernel<D, GB, KT>, grid, ATT_THREADS, smem, p, "attention",
                      err);
}

template <int D, typename KT>
static int dispatch_group(const att_params &p, int gb, dim3 grid, size_t smem, cuda_backend *c,
                          base_err *err) {
    switch (gb) {
    case 8:
        return launch_attention<D, 8, KT>(p, grid, smem, c, err);
    case 4:
        return launch_attention<D, 4, KT>(p, grid, smem, c, err);
    case 2:
        return launch_attention<D, 2, KT>(p, grid, smem, c, err);
    default:
        return launch_attention<D, 1, KT>(p, grid, smem, c, err);
    }
}

template <typename KT>
static int dispatch(const att_params &p, int head_dim, int gb, dim3 grid, size_t smem,
                    cuda_backend *c, base_err *err) {
    switch (head_dim) {
    case 32:
        return dispatch_group<32, KT>(p, gb, grid, smem, c, err);
    case 64:
        return dispatch_group<64, KT>(p, gb, grid, smem, c, err);
    case 96:
        return gb == 2 ? launch_attention<96, 2, KT>(p, grid, smem, c, err)
                       : launch_attention<96, 1, KT>(p, grid, smem, c, err);
    case 128:
        return dispatch_group<128, KT>(p, gb, grid, smem, c, err);
    default:
        return dispatch_group<256, KT>(p, gb, grid, smem, c, err);
    }
}

/* A pool's tensor map (the 5-D view of paged_decode_mma_kernel's loads), by pool pointer and
 * geometry: encoded once per pool, since a pool lives as long as its model. */
struct cuda_tmap {
    const void *pool;
    base_dtype dtype;
    int64_t num_blocks;
    int block_size, n_kv_heads, head_dim;
    CUtensorMap map;
};

/* Pools cached at most; past it the cache starts over (a model has two per layer). */
#define ATT_TMAP_CACHE 512

/* The tensor map of `pool` (layer->k or layer->v): dims, innermost first, 64 dims (128 bytes,
 * the swizzle's span), token in page, half of head_dim, kv head, page. Sizes are 32-bit and
 * strides 64-bit, and a page index is an int32, so any pool the page table can address fits.
 * No L2 promotion: each 128-byte row of a box is its own request. On the H200, copies of such
 * boxes alone (16 tokens of one kv head, pages in random order, 192 KB in flight per SM) read
 * 4.58 TB/s without promotion or with 64- or 128-byte promotion, 4.28 with 256-byte promotion,
 * which also fetches each row's other half. */
static int att_tc_map(cuda_backend *c, const void *pool, const be_kv_layer *layer, CUtensorMap *map,
                      base_err *err) {
    for (int i = 0; i < c->n_tmaps; i++) {
        const cuda_tmap *t = &c->tmaps[i];
        if (t->pool == pool && t->dtype == layer->dtype && t->num_blocks == layer->num_blocks &&
            t->block_size == layer->block_size && t->n_kv_heads == layer->n_kv_heads &&
            t->head_dim == layer->head_dim) {
            *map = t->map;
            return 0;
        }
    }
    if (!c->tmap_encode) {
        void *fn = NULL;
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                             cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess || !fn)
            return base_fail(err, "cuda: attention: the driver has no cuTensorMapEncodeTiled");
        c->tmap_encode = fn;
    }
    if (!c->tmaps) {
        c->tmaps = (cuda_tmap *)malloc(ATT_TMAP_CACHE * sizeof *c->tmaps);
        if (!c->tmaps) return base_fail(err, "cuda: attention: out of host memory");
    }
    const int D = layer->head_dim, bs = layer->block_size;
    const cuuint64_t row = (cuuint64_t)layer->n_kv_heads * D * 2;
    const int64_t blocks = layer->num_blocks < INT32_MAX ? layer->num_blocks : INT32_MAX;
    const cuuint64_t dims[5] = {64, (cuuint64_t)bs, (cuuint64_t)D / 64,
                                (cuuint64_t)layer->n_kv_heads, (cuuint64_t)blocks};
    const cuuint64_t strides[4] = {row, 128, (cuuint64_t)D * 2, (cuuint64_t)bs * row};
    const cuuint32_t box[5] = {64, ATT_TC_BOX, (cuuint32_t)D / 64, 1, 1};
    const cuuint32_t step[5] = {1, 1, 1, 1, 1};
    CUresult r = ((PFN_cuTensorMapEncodeTiled_v12000)c->tmap_encode)(
        map,
        layer->dtype == BASE_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        5, (void *)pool, dims, strides, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return base_fail(err,
                         "cuda: attention: tensor map of a pool of %lld blocks of %d: error %d",
                         (long long)layer->num_blocks, bs, (int)r);
    if (c->n_tmaps == ATT_TMAP_CACHE) c->n_tmaps = 0;
    c->tmaps[c->n_tmaps++] = {pool, layer->dtype, layer->num_blocks, bs, layer->n_kv_heads,
                              D,    *map};
    return 0;
}

template <int D, int SPLIT, typename KT, int NT>
static int launch_decode_mma(const att_params &p, const CUtensorMap &km, const CUtensorMap &vm,
                             dim3 grid, size_t smem, cuda_backend *c, base_err *err) {
    auto kern = paged_decode_mma_kernel<D, SPLIT, KT, NT>;
    const char *what = "attention (tensor cores)";
    if (cuda_smem_limit(kern, smem, what, err)) return -1;
    return cuda_launch_pdl(c, kern, grid, dim3(ATT_TC_WARPS * 32), smem, what, err, p, km, vm);
}

template <int D, typename KT, int NT>
static int dispatch_mma_split(const att_params &p, bool exact, const CUtensorMap &km,
                              const CUtensorMap &vm, dim3 grid, size_t smem, cuda_backend *c,
                              base_err *err) {
    /* Two f16 terms carry 22 bits, three bf16 terms 24: an F32 float's worth either way. */
    constexpr int FULL = std::is_same<KT, __half>::value ? 2 : 3;
    if (exact) return launch_decode_mma<D, FULL, KT, NT>(p, km, vm, grid, smem, c, err);
    return launch_decode_mma<D, 1, KT, NT>(p, km, vm, grid, smem, c, err);
}

/* The tensor-core decode kernel takes head_dim 64 or 128 with groups of up to 16, head_dim 256
 * with groups of up to 8 (a second n-tile's q fragments and O^T accumulators would not fit in
 * the registers), and blocks of a multiple of 16 tokens; every other decode shape runs on
 * paged_attention_kernel. */
static bool mma_decode_fits(const att_params &p, const be_kv_layer *layer) {
    const int hd = layer->head_dim;
    return p.decode && (hd == 64 || hd == 128 || hd == 256) &&
           p.group <= (hd == 256 ? 8 : ATT_TC_ROWS) && layer->block_size % ATT_TC_BOX == 0;
}

/* Decode rows on the tensor cores, each warp att_stages tiles of 32 tokens deep. An F32
 * output is owed F32 accuracy, so q and P then go in as split terms. */
static int run_decode_mma(const att_params &p0, const be_kv_layer *layer, int chunks,
                          cuda_backend *c, base_err *err) {
    att_params p = p0;
    const bool exact = p.out_dt == BASE_DTYPE_F32;
    const int D = layer->head_dim, nt = p.group > 8 ? 2 : 1;
    while (p.stages > ATT_MIN_STAGES && att_tc_smem_bytes(D, p.stages, nt) > ATT_SMEM_MAX)
        p.stages--;
    const size_t smem = att_tc_smem_bytes(D, p.stages, nt);
    CUtensorMap km, vm;
    if (att_tc_map(c, layer->k, layer, &km, err) || att_tc_map(c, layer->v, layer, &vm, err))
        return -1;
    dim3 grid((unsigned)p.n_kv_heads, (unsigned)chunks,
              (unsigned)(p.n_tokens < ATT_GRID_MAX ? p.n_tokens : ATT_GRID_MAX));
    const bool f16 = layer->dtype == BASE_DTYPE_F16, wide = nt == 2;
    if (D == 256)
        return f16 ? dispatch_mma_split<256, __half, 1>(p, exact, km, vm, grid, smem, c, err)
                   : dispatch_mma_split<256, __nv_bfloat16, 1>(p, exact, km, vm, grid, smem, c,
                                                               err);
    if (D == 64) {
        if (wide)
            return f16 ? dispatch_mma_split<64, __half, 2>(p, exact, km, vm, grid, smem, c, err)
                       : dispatch_mma_split<64, __nv_bfloat16, 2>(p, exact, km, vm, grid, smem, c,
                                                                  err);
        return f16 ? dispatch_mma_split<64, __half, 1>(p, exact, km, vm, grid, smem, c, err)
                   : dispatch_mma_split<64, __nv_bfloat16, 1>(p, exact, km, vm, grid, smem, c, err);
    }
    if (wide)
        return f16 ? dispatch_mma_split<128, __half, 2>(p, exact, km, vm, grid, smem, c, err)
                   : dispatch_mma_split<128, __nv_bfloat16, 2>(p, exact, km, vm, grid, smem, c,
                                                               err);
    return f16 ? dispatch_mma_split<128, __half, 1>(p, exact, km, vm, grid, smem, c, err)
               : dispatch_mma_split<128, __nv_bfloat16, 1>(p, exact, km, vm, grid, smem, c, err);
}

/* Decode grids of at most this many CTAs run on paged_attention_kernel even where the
 * tensor-core kernel fits: with so few CTAs each one's serial work per token decides, and the
 * tensor-core kernel's split q and P terms (F32 activations) and per-warp tiles cost more there.
 * H200, batch-1 decode of the 8B shape (8 kv heads), tok/s of the decode step from an empty
 * cache (contexts 1 to 129, v1 on 8 CTAs), two runs: 495.3 against 482.8, 497.7 against
 * 476.9. Such grids now reach here only where the wide decode kernel declines: decode
 * rows beside prompt rows, and rows too long for its shared memory. */
#define ATT_F32_DECODE_CTAS 16

static int run_pass(const att_params &p, const be_kv_layer *layer, int chunks, cuda_backend *c,
                    base_err *err) {
    const int64_t ctas = (int64_t)p.n_tokens * p.n_kv_heads * chunks;
    if (mma_decode_fits(p, layer) && ctas > ATT_F32_DECODE_CTAS)
        return run_decode_mma(p, layer, chunks, c, err);
    int gb = p.group / p.n_sub;
    dim3 grid((unsigned)(p.n_kv_heads * p.n_sub), (unsigned)chunks,
              (unsigned)(p.n_tokens < ATT_GRID_MAX ? p.n_tokens : ATT_GRID_MAX));
    size_t smem = att_smem_bytes(layer->head_dim, gb, layer->block_size, p.stages, 2);
    if (layer->dtype == BASE_DTYPE_F16)
        return dispatch<__half>(p, layer->head_dim, gb, grid, smem, c, err);
    return dispatch<__nv_bfloat16>(p, layer->head_dim, gb, grid, smem, c, err);
}

template <int D>
static int launch_merge(const att_params &p, bool wide, int64_t n_pairs, cuda_backend *c,
                        base_err *err) {
    const int64_t per_cta = wide ? 1 : ATT_MERGE_WARPS;
    const int64_t ctas = (n_pairs + per_cta - 1) / per_cta;
    const unsigned grid = (unsigned)(ctas < (1 << 30) ? ctas : (1 << 30));
    if (wide)
        return att_launch(c, merge_kernel<D, ATT_MERGE_WARPS>, dim3(grid), ATT_MERGE_WARPS * 32, 0,
                          p, "attention merge", err);
    return att_launch(c, merge_kernel<D, 1>, dim3(grid), ATT_MERGE_WARPS * 32, 0, p,
                      "attention merge", err);
}

/* Rows of many chunks get a CTA per (row, head); the others a warp. */
static int run_merge(const att_params &p, int head_dim, cuda_backend *c, base_err *err) {
    const bool wide = p.max_chunks >= 2 * ATT_MERGE_WARPS;
    const int64_t n_pairs = (int64_t)p.n_tokens * p.n_heads;
    switch (head_dim) {
    case 32:
        return launch_merge<32>(p, wide, n_pairs, c, err);
    case 64:
        return launch_merge<64>(p, wide, n_pairs, c, err);
    case 96:
        return launch_merge<96>(p, wide, n_pairs, c, err);
    case 128:
        return launch_merge<128>(p, wide, n_pairs, c, err);
    default:
        return launch_merge<256>(p, wide, n_pairs, c, err);
    }
}

/* A v2 plan this launch can serve: chunks within the grid and covering the longest sequence,
 * and a workspace that holds every possible decode row (n_seqs bounds them, exact when all
 * rows decode; the lse array starts after n_seqs rows of partials). Anything else runs as
 * v1, which computes the same function; so does a gather plan. */
static bool v2_usable(const be_decode_plan *plan, const be_paged_batch *batch, int n_heads,
                      int head_dim, int block_size) {
    if (!plan || plan->kind != BE_DECODE_V2 || !plan->workspace) return false;
    if (plan->max_chunks > ATT_GRID_MAX || !attn_plan_covers(plan, batch, block_size)) return false;
    uint64_t cells = (uint64_t)batch->n_seqs * (uint64_t)plan->max_chunks * (uint64_t)n_heads;
    return cells * (uint64_t)(head_dim + 1) * sizeof(float) <= plan->workspace_bytes;
}

int cuda_attention_check(const be_tensor *q, const be_kv_layer *layer, const be_paged_batch *batch,
                         int n_heads, be_attn attn, const be_tensor *out, base_err *err) {
    const int hd = layer->head_dim, nkv = layer->n_kv_heads;
    if (hd != 32 && hd != 64 && hd != 96 && hd != 128 && hd != 256)
        return base_fail(err, "cuda: attention: head_dim %d (32, 64, 96, 128 or 256)", hd);
    if (nkv < 1 || n_heads % nkv)
        return base_fail(err, "cuda: attention: %d query heads over %d kv heads", n_heads, nkv);
    if (layer->dtype != BASE_DTYPE_F16 && layer->dtype != BASE_DTYPE_BF16)
        return base_fail(err, "cuda: attention: pool dtype %s (F16 or BF16 on CUDA)",
                         base_dtype_name(layer->dtype));
    if (!cuda_float_dtype(q->dtype) || !cuda_float_dtype(out->dtype) ||
        q->cols != (int64_t)n_heads * hd || out->cols != q->cols || q->rows != batch->n_tokens ||
        out->rows != q->rows)
        return base_fail(err,
                         "cuda: attention: q [%lld, %lld] / out [%lld, %lld] for %d tokens "
                         "of %d heads x %d",
                         (long long)q->rows, (long long)q->cols, (long long)out->rows,
                         (long long)out->cols, batch->n_tokens, n_heads, hd);
    if (!(attn.softcap >= 0.0f) || attn.window < 0)
        return base_fail(err, "cuda: attention: soft-cap %g, window %d", (double)attn.softcap,
                         attn.window);
    return 0;
}

int cuda_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                   const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                   be_attn attn, be_tensor *out, base_err *err) {
    if (cuda_attention_check(q, layer, batch, n_heads, attn, out, err)) return -1;
    const int hd = layer->head_dim, nkv = layer->n_kv_heads;
    if (batch->n_tokens == 0 || batch->n_seqs == 0) return 0;
    if (cuda_attention_wide_fits(be, layer, batch, n_heads, attn))
        return cuda_attention_wide(be, q, layer, batch, n_heads, attn, out, err);
    const int group = n_heads / nkv;
    /* head_dim 96 keeps sub-groups of 2 at most: a larger one's share of q would not fit in
     * registers as whole chunks (att_np). */
    int gb = hd == 96 ? 2 : ATT_MAX_GROUP;
    while (group % gb) gb >>= 1;
    /* Fewer stages when a large block would not fit. */
    int stages = cuda_impl(be)->att_stages;
    while (stages > ATT_MIN_STAGES &&
           att_smem_bytes(hd, gb, layer->block_size, stages, 2) > ATT_SMEM_MAX)
        stages--;
    if (att_smem_bytes(hd, gb, layer->block_size, stages, 2) > ATT_SMEM_MAX)
        return base_fail(err, "cuda: attention: block size %d too large for shared memory",
                         layer->block_size);

    att_params p = {};
    p.q = q->data;
    p.q_dt = q->dtype;
    p.out = out->data;
    p.out_dt = out->dtype;
    p.k_pool = layer->k;
    p.v_pool = layer->v;
    p.n_kv_heads = nkv;
    p.block_size = layer->block_size;
    p.n_heads = n_heads;
    p.group = group;
    p.n_sub = group / gb;
    p.q_indptr = batch->q_indptr;
    p.kv_len = batch->kv_len;
    p.page_indptr = batch->page_indptr;
    p.page_indices = batch->page_indices;
    p.first_page_offset = batch->first_page_offset;
    p.n_seqs = batch->n_seqs;
    p.n_tokens = batch->n_tokens;
    p.all_decode = batch->max_q_len == 1;
    p.pages_per_chunk = INT_MAX;
    p.scale_log2 = attn.scale * CUDA_LOG2E;
    p.softcap_log2 = attn.softcap * CUDA_LOG2E;
    p.window = attn.window;
    p.sinks = attn.sinks;
    p.stages = stages;
    cuda_backend *c = cuda_impl(be);

    if (batch->max_q_len > 1 && cuda_attention_prefill_fits(layer, batch)) {
        if (cuda_attention_prefill(be, q, layer, batch, n_heads, attn, out, err)) return -1;
    } else if (batch->max_q_len > 1) {
        p.decode = 0;
        if (run_pass(p, layer, 1, c, err)) return -1;
    }
    p.decode = 1;
    /* A window's rows take one chunk: their page range starts at the window. So do rows with
     * sinks, which the chunks' merge does not add. */
    if (attn.window > 0 || attn.sinks || !v2_usable(plan, batch, n_heads, hd, layer->block_size))
        return run_pass(p, layer, 1, c, err);
    p.split = 1;
    p.pages_per_chunk = plan->pages_per_chunk;
    p.max_chunks = plan->max_chunks;
    p.partial = (float *)plan->workspace;
    p.lse = p.partial + (size_t)batch->n_seqs * plan->max_chunks * n_heads * hd;
    if (run_pass(p, layer, plan->max_chunks, c, err)) return -1;
    return run_merge(p, hd, c, err);
}
