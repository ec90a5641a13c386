/* Paged attention: decode v1, decode v2 with its merge, and prefill rows, all through the
 * pages of a be_paged_batch.
 *
 * Batches of decode rows only whose rows times kv heads are few (batch 1 and 2 of the 8B shape)
 * run on the wide decode kernel (cuda_attention_wide.cu) whatever the plan, where it fits. Other
 * decode rows (q_len == 1) at head_dim 64 or 128, groups of up to 16 query heads and blocks of
 * a multiple of 16 tokens run on the tensor cores (paged_decode_mma_kernel, described there),
 * unless their grid is tiny (ATT_F32_DECODE_CTAS). Everything else runs on
 * paged_attention_kernel, in F32:
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
 * Prefill rows are v1 rows with a causal limit. */
#include "backend/cuda/cuda_mma.h"

extern "C" {
#include "attn/attn.h"
}

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
#define ATT_LOG2E      1.4426950408889634f
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

template <typename KT> __device__ __forceinline__ float2 to_float2(uint32_t w);
template <> __device__ __forceinline__ float2 to_float2<__half>(uint32_t w) {
    __half2 h;
    memcpy(&h, &w, sizeof h);
    return __half22float2(h);
}
template <> __device__ __forceinline__ float2 to_float2<__nv_bfloat16>(uint32_t w) {
    __nv_bfloat162 b;
    memcpy(&b, &w, sizeof b);
    return __bfloat1622float2(b);
}

template <typename KT> __device__ __forceinline__ void cvt8(uint4 raw, float *f) {
    float2 a = to_float2<KT>(raw.x), b = to_float2<KT>(raw.y), c = to_float2<KT>(raw.z),
           d = to_float2<KT>(raw.w);
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

template <int D, int GB> struct att_geom {
    static constexpr int CH = D / 8;             /* 16-byte chunks per token row */
    static constexpr int NTG = ATT_THREADS / CH; /* token slices in the value phase */
    static constexpr int RED = NTG * GB * D;     /* floats of the final slice reduction */
    /* Score phase: NP threads share a token, each holding DPT dims of q for every head of the
     * group in registers (DPT * GB = 64 floats at most), CPT chunks of them. */
    static constexpr int DPT = (64 / GB < 8) ? 8 : (64 / GB > D ? D : 64 / GB);
    static constexpr int NP = D / DPT;
    static constexpr int CPT = DPT / 8;
    static constexpr int TPP = ATT_THREADS / NP; /* tokens per pass */
};

/* Where chunk c of K token t lies in shared memory: the chunk's index among a thread's CPT
 * chunks is XORed with the token, so the NP-thread groups of one warp, which read the same
 * chunk of different tokens, hit distinct banks. */
template <int NP, int CPT> __device__ __forceinline__ int k_swizzle(int t, int c) {
    return (((c / NP) ^ (t % CPT)) * NP) + c % NP;
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

            /* values: thread = (8 dims, token slice) */
            const int cv = tid % CH, tg = tid / CH;
#pragma unroll
            for (int h = 0; h < GB; h++) {
                const float a = alpha_s[h];
#pragma unroll
                for (int k = 0; k < 8; k++) acc[h][k] *= a;
            }
            for (int t = lo + tg; t < hi; t += NTG) {
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
                for (int k = 0; k < 8; k++) red[(tg * GB + h) * D + cv * 8 + k] = acc[h][k];
        }
        __syncthreads();
        for (int i = tid; i < GB * D; i += ATT_THREADS) {
            const int h = i / D, d = i % D;
            float v = 0.0f;
            for (int g = 0; g < NTG; g++) v += red[(g * GB + h) * D + d];
            const float l = l_s[h];
            v = l > 0.0f ? v / l : 0.0f;
            const int hg = head0 + h;
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
 * One CTA per (decode row, kv head, chunk) serves the group's query heads as the 16 M rows of
 * mma.sync m16n8k16 (rows past the group hold zeros). The chunk's pages are cut into tiles of
 * 16 tokens; each of the ATT_TC_WARPS warps takes every ATT_TC_WARPS-th tile and streams it
 * through its own att_stages shared-memory stages, so the main loop needs no block-wide
 * barrier (split-K inside the CTA); the warps' softmax states are combined once at the end.
 * Per tile: S = Q K^T with the tile's 16 tokens as N, K read by ldmatrix; softmax online in
 * F32 in the log2 domain on the accumulators; O += P V with P taken from the S accumulators
 * as the A operand in registers and V read by ldmatrix.trans. Tiles of 16 tokens rather than
 * pages keep a stage at 8.5 KB (head_dim 128), so three CTAs of 4 warps stay resident per SM
 * with every warp's next tiles in flight. Dead slots (before the first-page offset, past the
 * last token) are zeroed, since the pool may hold NaN there and 0 * NaN would reach the output.
 *
 * Two ways of loading the stages, chosen by the grid (BULK):
 *   16-byte cp.async, a tile's K and V in one group, its 16-byte chunks XOR-swizzled by the
 *   token, zero-filled when dead; the next tile is issued before this one's math.
 *   Bulk copies (cp.async.bulk, the copy engine), one per token row of K or V, completing on
 *   a per-stage mbarrier of the warp (K and V apart); rows padded by 16 bytes keep ldmatrix
 *   off bank conflicts, dead rows are zeroed by hand. K's half of a stage is refilled once S
 *   is computed, V's after P V, so a warp keeps one tile more in flight in the same shared
 *   memory; the page table is read 32 tiles ahead into a lane-held window.
 *
 * MMA inputs are the pool's dtype. SPLIT > 1 carries q and P as that many terms (the value
 * rounded, then the rounded remainder, ...), each a separate MMA into the same F32
 * accumulator: the F32 activation path then keeps F32-level accuracy while K and V, exact in
 * the pool's dtype, are read once.
 *
 * Measured on the H200 (132 SMs, 3 CTAs each: a wave of 396; Llama-3.1-8B decode, f16 KV,
 * F32 q and out, the planner's chunking; bench_attention serve, 20 calls per figure queued
 * behind a spin), TB/s of K+V, 16-byte copies -> bulk copies:
 *   1 x 131072 (392 CTAs): 3.31 -> 3.59; 4 x 16384 (384): 2.88 -> 3.06; 16 x 8192 (384): 3.31
 *   -> 3.58; 64 x 4096 (1536): 3.38 -> 3.40; 256 x 2048 (v1, 2048): 3.72 -> 3.52.
 * The bulk copies win in grids of about a wave and lose in five, hence ATT_TC_BULK_WAVES.
 * Taken in turns with cuDNN SDPA (tools/reference/sdpa_peer.py --ours, 5 trials), the default
 * choice stands at 0.84 / 0.79 / 0.81 / 0.76 / 0.82 of it at the five shapes (ours 3.57 / 3.06
 * / 3.55 / 3.39 / 3.71 TB/s, cuDNN 4.23 / 3.86 / 4.36 / 4.47 / 4.55). A third stage per warp (two
 * CTAs per SM) lost 5 to 40%. ncu at 64 x 4096: DRAM 72 to 78% of peak, L2 throughput 80 to 90%,
 * 0.4 instructions issued per scheduler and cycle over 2.9 warps, 7 cycles per issued instruction;
 * cuDNN's kernel there (one CTA per row and kv head, 128 tokens a step, 2 CTAs per SM) reads at 93%
 * of peak DRAM issuing a third of our instructions. Reading the page table ahead, counting
 * stages and skipping the masks of whole tiles changed nothing for the 16-byte copies, which
 * keep the plain loop. A kv head's token row is 256 bytes, the next one 2 KB away. The waves
 * are the plan's part (attn.h): 416 CTAs (4 rows of 16384 tokens in 13 chunks) ran at 2.16,
 * 384 (12 chunks) at 2.88. */
#define ATT_TC_WARPS      4
#define ATT_TC_ROWS       16
#define ATT_TC_TILE       16
#define ATT_TC_CTAS       3 /* resident per SM (registers and shared memory both bind) */
#define ATT_TC_BULK_WAVES 4 /* grids of at most this many waves of CTAs load by bulk copies */

/* The SPLIT terms of the pair (x, y) in the pool's dtype, packed: term s holds what terms
 * 0..s-1 left over, rounded. */
template <typename KT, int SPLIT>
__device__ __forceinline__ void split2(float x, float y, uint32_t *terms) {
#pragma unroll
    for (int s = 0; s < SPLIT; s++) {
        terms[s] = cuda_pack2<KT>(x, y);
        float2 r = to_float2<KT>(terms[s]);
        x -= r.x;
        y -= r.y;
    }
}

/* Shared memory of the tensor-core decode kernel: every warp's stages of K and V tiles (token
 * rows padded by 16 bytes, which the bulk copies need and the 16-byte copies leave unused),
 * which the final combine of (ATT_TC_WARPS, 16) rows of D floats plus their max and sum reuses,
 * then every warp's (2, stages) barriers of the bulk copies. */
static __host__ __device__ size_t att_tc_work_bytes(int head_dim, int n_stages) {
    size_t stages = (size_t)ATT_TC_WARPS * n_stages * 2 * ATT_TC_TILE * (head_dim + 8) * 2;
    size_t red = (size_t)ATT_TC_WARPS * ATT_TC_ROWS * (head_dim + 2) * sizeof(float);
    return (stages > red ? stages : red) + (size_t)ATT_TC_WARPS * n_stages * 16;
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

/* One bulk copy of `bytes` (a multiple of 16) that completes on bar's transaction count. */
__device__ __forceinline__ void att_bulk_copy(void *smem, const void *gmem, uint32_t bytes,
                                              uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];\n" ::"r"(cuda_smem_addr(smem)),
                 "l"(gmem), "r"(bytes), "r"(cuda_smem_addr(bar))
                 : "memory");
}

/* The work area, then q's terms past the first: (split - 1, 16, head_dim) swizzled. */
static size_t att_tc_smem_bytes(int head_dim, int n_stages, int split) {
    return att_tc_work_bytes(head_dim, n_stages) + (size_t)(split - 1) * ATT_TC_ROWS * head_dim * 2;
}

/* Three resident CTAs per SM: q's first term and the output accumulators live in registers
 * (at most 168, none spilled at head_dim 128), and two stages of 16-token tiles take 64 KB per
 * CTA, plus 4 KB per further term of q. */
template <int D, int SPLIT, typename KT, bool BULK>
__global__ void __launch_bounds__(ATT_TC_WARPS * 32, ATT_TC_CTAS)
    paged_decode_mma_kernel(att_params p) {
    constexpr int CH = D / 8;              /* 16-byte chunks per token row */
    constexpr int KS = D / 16;             /* k-steps of Q K^T */
    constexpr int NO = D / 8;              /* n-tiles of the output */
    constexpr int RS = D + 8;              /* elements a token row takes in shared memory */
    constexpr int TILE = ATT_TC_TILE * RS; /* elements of one tile of K (or of V) */
    static_assert(CH % 8 == 0 && ATT_TC_TILE == 16, "swizzle and the P V k-step need these");
    extern __shared__ __align__(16) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c4 = lane & 3;
    const int n_st = p.stages, bs = p.block_size, tpp = bs / ATT_TC_TILE;
    KT *wbuf = (KT *)smem + (size_t)warp * n_st * 2 * TILE;
    KT *qs = (KT *)(smem + att_tc_work_bytes(D, n_st)); /* (SPLIT - 1, 16, D) */
    uint64_t *bars = (uint64_t *)(smem + att_tc_work_bytes(D, n_st)) - ATT_TC_WARPS * n_st * 2;
    uint64_t *wbar = bars + warp * n_st * 2; /* (2, n_st) this warp's stages: K (or both), V */
    if (BULK) {
        if (lane == 0)
            for (int i = 0; i < 2 * n_st; i++) att_mbar_init(wbar + i);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        __syncwarp();
    }
    uint32_t used = 0; /* tiles this warp has streamed through its stages */
    /* Element of 16-byte chunk cc of token t in a stage: rows padded to RS keep ldmatrix's 8
     * rows in distinct banks for the bulk copies, whose rows land whole; the 16-byte copies
     * XOR the chunk with the token instead. */
    auto so = [](int t, int cc) { return BULK ? t * RS + cc * 8 : (t * CH + (cc ^ (t & 7))) * 8; };
    const int kvh = blockIdx.x, chunk = blockIdx.y;
    const int head0 = kvh * p.group;
    const uint64_t row_stride = (uint64_t)p.n_kv_heads * D;
    const KT *kp = (const KT *)p.k_pool + (uint64_t)kvh * D;
    const KT *vp = (const KT *)p.v_pool + (uint64_t)kvh * D;

    for (int row = blockIdx.z; row < p.n_tokens; row += gridDim.z) {
        const int s = seq_of_row(p.q_indptr, p.n_seqs, row);
        if (p.q_indptr[s + 1] - p.q_indptr[s] != 1) continue;
        const int n_vis = p.kv_len[s];
        int fpo, p_begin, p_end;
        if (!chunk_pages(p, s, n_vis, chunk, &fpo, &p_begin, &p_end)) continue;
        const int32_t *pages = p.page_indices + p.page_indptr[s];
        const int drow = p.split ? decode_rank(p, s) : 0;
        /* Tiles [t_begin, t_end) of the chunk that hold a live token; tile T covers the
         * sequence's slots [16T, 16T + 16), slot u live when fpo <= u < fpo + n_vis. */
        const int t_begin = p_begin == 0 ? fpo / ATT_TC_TILE : p_begin * tpp;
        const int t_live = (fpo + n_vis + ATT_TC_TILE - 1) / ATT_TC_TILE;
        const int t_end = p_end * tpp < t_live ? p_end * tpp : t_live;
        cuda_pdl_wait();

        /* q's first term as A fragments in registers: register r holds rows g (+8 for odd
         * r), columns 2 * c4 (+8 for r >= 2) of each k-step. Later terms go to shared memory
         * (read back by ldmatrix per tile), which keeps the registers of the split path
         * near the single one's. */
        uint32_t qa[KS][4];
        const size_t qbase = (size_t)row * p.n_heads * D + (size_t)head0 * D;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int h = g + (r & 1) * 8, col = ks * 16 + c4 * 2 + (r >> 1) * 8;
                float x = 0.0f, y = 0.0f;
                if (h < p.group) {
                    x = cuda_load(p.q, p.q_dt, qbase + (size_t)h * D + col);
                    y = cuda_load(p.q, p.q_dt, qbase + (size_t)h * D + col + 1);
                }
                uint32_t t[SPLIT];
                split2<KT, SPLIT>(x, y, t);
                qa[ks][r] = t[0];
#pragma unroll
                for (int sp = 1; sp < SPLIT; sp++)
                    *(uint32_t *)(qs + (sp - 1) * ATT_TC_ROWS * D +
                                  (h * CH + ((col >> 3) ^ (h & 7))) * 8 + (col & 7)) = t[sp];
            }
        if (SPLIT > 1) __syncthreads();

        float o[NO][4];
#pragma unroll
        for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

        const int span = t_end - t_begin;
        const int n_my = span > warp ? (span - warp + ATT_TC_WARPS - 1) / ATT_TC_WARPS : 0;
        /* The slot of each of the warp's tiles (page * tiles per page + tile in page), 32
         * tiles at a time: lane l holds that of tile 32w + l, and window w + 1 is loaded as
         * window w starts, so that issuing a tile's copies never waits on the page table. A
         * slot stays below 2^32 for any pool that fits in memory (2^36 tokens). */
        auto slot_of = [&](int i) -> uint32_t {
            if (i >= n_my) return 0;
            const int tile = t_begin + warp + i * ATT_TC_WARPS, q = tile / tpp;
            return (uint32_t)pages[q] * (uint32_t)tpp + (uint32_t)(tile - q * tpp);
        };
        uint32_t sl_cur = 0, sl_nxt = 0;
        if (BULK) sl_cur = slot_of(lane), sl_nxt = slot_of(32 + lane);
        /* Tile i into stage stg: the bulk copies take K (part 0) and V (part 1) apart, the
         * 16-byte copies both at once. */
        auto issue = [&](int i, int part, int stg) {
            const int tile = t_begin + warp + i * ATT_TC_WARPS;
            const int u0 = tile * ATT_TC_TILE;
            uint64_t base;
            if (BULK) {
                /* tiles are issued in order, K before V */
                if ((i & 31) == 0 && i > 0 && part == 0) {
                    sl_cur = sl_nxt;
                    sl_nxt = slot_of(i + 32 + lane);
                }
                base =
                    (uint64_t)__shfl_sync(0xffffffffu, sl_cur, i & 31) * ATT_TC_TILE * row_stride;
            } else {
                base =
                    ((uint64_t)pages[tile / tpp] * (uint64_t)bs + (uint64_t)(u0 % bs)) * row_stride;
            }
            KT *kd = wbuf + (size_t)stg * 2 * TILE, *vd = kd + TILE;
            if constexpr (BULK) {
                /* lanes 0-15 copy K rows, 16-31 V rows; dead rows are zeroed by hand */
                const int t = lane & 15;
                const bool ok = u0 + t >= fpo && u0 + t < fpo + n_vis;
                const int live = __popc(__ballot_sync(0xffffffffu, ok)) / 2;
                uint64_t *bar = wbar + part * n_st + stg;
                if (lane == 16 * part) att_mbar_expect(bar, (uint32_t)(live * D * 2));
                __syncwarp();
                KT *dst = (part ? vd : kd) + t * RS;
                const bool mine = lane >> 4 == part;
                if (mine && ok) {
                    att_bulk_copy(dst, (part ? vp : kp) + base + (uint64_t)t * row_stride, D * 2,
                                  bar);
                } else if (mine) {
#pragma unroll
                    for (int c = 0; c < CH; c++) *(uint4 *)(dst + c * 8) = make_uint4(0, 0, 0, 0);
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                }
            } else {
#pragma unroll
                for (int c = lane; c < ATT_TC_TILE * CH; c += 32) {
                    const int t = c / CH, cc = c % CH;
                    const bool ok = u0 + t >= fpo && u0 + t < fpo + n_vis;
                    const uint64_t off =
                        ok ? base + (uint64_t)t * row_stride + (uint64_t)cc * 8 : 0;
                    cuda_cp_async16_zfill(kd + so(t, cc), kp + off, ok);
                    cuda_cp_async16_zfill(vd + so(t, cc), vp + off, ok);
                }
            }
        };

        /* Stage of tile i and, for the bulk copies, the parity of its barriers' phase,
         * counted rather than divided. The bulk copies free a tile's K half once S is computed
         * and its V half after P V, each refilled at once for tile i + n_st: a tile more in
         * flight per warp than the 16-byte copies keep, in the same shared memory. */
        int stg = BULK ? (int)(used % n_st) : 0;
        uint32_t par = BULK ? (used / n_st) & 1 : 0;
        for (int i = 0, s2 = stg; i < n_st - !BULK; i++) {
            if (i < n_my) issue(i, 0, s2);
            if (BULK && i < n_my) issue(i, 1, s2);
            if (!BULK) cuda_cp_async_commit();
            s2 = s2 + 1 == n_st ? 0 : s2 + 1;
        }
        for (int i = 0; i < n_my; i++) {
            if (!BULK && i + n_st - 1 < n_my) issue(i + n_st - 1, 0, (i + n_st - 1) % n_st);
            if (!BULK) stg = i % n_st;
            if (BULK) {
                att_mbar_wait(wbar + stg, par);
            } else {
                cuda_cp_async_commit();
                cp_async_wait_n(n_st - 1);
            }
            __syncwarp();
            const KT *kt = wbuf + (size_t)stg * 2 * TILE, *vt = kt + TILE;
            const int u0 = (t_begin + warp + i * ATT_TC_WARPS) * ATT_TC_TILE;

            /* Even and odd k-steps go to separate accumulators, halving the chain of
             * dependent MMAs. x4: matrices 0..3 are chunks 4kk..4kk+3 of tokens 8n..8n+7, the
             * B fragments of k-steps 2kk and 2kk+1. */
            float sc[2][4], sx[2][4];
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[n][e] = sx[n][e] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS / 2; kk++) {
                /* x4 on q's rows: matrices are (rows +0/+8) x (dims +0/+8) of one k-step */
                uint32_t qt[SPLIT > 1 ? SPLIT - 1 : 1][2][4];
#pragma unroll
                for (int sp = 1; sp < SPLIT; sp++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int h = ((lane >> 3) & 1) * 8 + (lane & 7);
                        const int cc = (2 * kk + j) * 2 + (lane >> 4);
                        cuda_ldmatrix_x4(qt[sp - 1][j], qs + (sp - 1) * ATT_TC_ROWS * D +
                                                            (h * CH + (cc ^ (h & 7))) * 8);
                    }
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const int t = n * 8 + (lane & 7), cc = kk * 4 + (lane >> 3);
                    uint32_t b[4];
                    cuda_ldmatrix_x4(b, kt + so(t, cc));
                    cuda_mma16816<KT>(sc[n], qa[2 * kk], b[0], b[1]);
                    cuda_mma16816<KT>(sx[n], qa[2 * kk + 1], b[2], b[3]);
#pragma unroll
                    for (int sp = 1; sp < SPLIT; sp++) {
                        cuda_mma16816<KT>(sc[n], qt[sp - 1][0], b[0], b[1]);
                        cuda_mma16816<KT>(sx[n], qt[sp - 1][1], b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) sc[n][e] += sx[n][e];
            if (BULK) {
                __syncwarp();
                if (i + n_st < n_my) issue(i + n_st, 0, stg);
            }

            /* Online softmax: a row's 4 threads (same g) share its max through shuffles; the
             * row sum stays per thread until the end. */
            float mx[2] = {m[0], m[1]};
            const bool whole = BULK && u0 >= fpo && u0 + ATT_TC_TILE <= fpo + n_vis;
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int u = u0 + n * 8 + c4 * 2 + (e & 1);
                    const float v = whole || (u >= fpo && u < fpo + n_vis) ? sc[n][e] * p.scale_log2
                                                                           : -INFINITY;
                    sc[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            float alpha[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
                mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
                const float base = mx[r] == -INFINITY ? 0.0f : mx[r];
                alpha[r] = exp2f(m[r] - base);
                m[r] = mx[r];
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float base = m[e >> 1] == -INFINITY ? 0.0f : m[e >> 1];
                    const float pe = exp2f(sc[n][e] - base);
                    sc[n][e] = pe;
                    l[e >> 1] += pe;
                }
            /* Once the running max settles, tiles leave it alone: skip the rescale then. */
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[n][0] *= alpha[0], o[n][1] *= alpha[0];
                    o[n][2] *= alpha[1], o[n][3] *= alpha[1];
                }
            }

            if (BULK) att_mbar_wait(wbar + n_st + stg, par);
            /* O += P V: the tile's 16 tokens are n-tiles 0 and 1 of S, which is the A
             * fragment's layout; x4.trans matrices are (tokens +0/+8) x (dims 16dp +0/+8). */
            uint32_t pa[4][SPLIT];
            split2<KT, SPLIT>(sc[0][0], sc[0][1], pa[0]);
            split2<KT, SPLIT>(sc[0][2], sc[0][3], pa[1]);
            split2<KT, SPLIT>(sc[1][0], sc[1][1], pa[2]);
            split2<KT, SPLIT>(sc[1][2], sc[1][3], pa[3]);
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                const int t = ((lane >> 3) & 1) * 8 + (lane & 7), cc = dp * 2 + (lane >> 4);
                uint32_t b[4];
                cuda_ldmatrix_x4_trans(b, vt + so(t, cc));
#pragma unroll
                for (int sp = 0; sp < SPLIT; sp++) {
                    const uint32_t a[4] = {pa[0][sp], pa[1][sp], pa[2][sp], pa[3][sp]};
                    cuda_mma16816<KT>(o[2 * dp], a, b[0], b[1]);
                    cuda_mma16816<KT>(o[2 * dp + 1], a, b[2], b[3]);
                }
            }
            __syncwarp();
            if (BULK && i + n_st < n_my) issue(i + n_st, 1, stg);
            if (BULK && ++stg == n_st) stg = 0, par ^= 1;
        }
        used += n_my;
        cuda_cp_async_wait<0>();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        __syncthreads();

        /* Combine the warps: each writes its unnormalized rows, max and sum; the stage
         * buffers are free now. */
        float *red = (float *)smem;                       /* (ATT_TC_WARPS, 16, D) */
        float *mw = red + ATT_TC_WARPS * ATT_TC_ROWS * D; /* (ATT_TC_WARPS, 16) */
        float *lw = mw + ATT_TC_WARPS * ATT_TC_ROWS;      /* (ATT_TC_WARPS, 16) */
        if (c4 == 0) {
            mw[warp * ATT_TC_ROWS + g] = m[0], mw[warp * ATT_TC_ROWS + g + 8] = m[1];
            lw[warp * ATT_TC_ROWS + g] = l[0], lw[warp * ATT_TC_ROWS + g + 8] = l[1];
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            float *r0 = red + (size_t)(warp * ATT_TC_ROWS + g) * D + n * 8 + c4 * 2;
            r0[0] = o[n][0], r0[1] = o[n][1];
            r0[8 * D] = o[n][2], r0[8 * D + 1] = o[n][3];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < p.group * D; i += ATT_TC_WARPS * 32) {
            const int h = i / D, d = i % D;
            float mmax = -INFINITY;
#pragma unroll
            for (int w = 0; w < ATT_TC_WARPS; w++) mmax = fmaxf(mmax, mw[w * ATT_TC_ROWS + h]);
            float num = 0.0f, den = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_TC_WARPS; w++) {
                const float mv = mw[w * ATT_TC_ROWS + h];
                const float f = mv == -INFINITY ? 0.0f : exp2f(mv - mmax);
                num += f * red[(size_t)(w * ATT_TC_ROWS + h) * D + d];
                den += f * lw[w * ATT_TC_ROWS + h];
            }
            const float v = den > 0.0f ? num / den : 0.0f;
            const int hg = head0 + h;
            if (p.split) {
                const size_t cell = ((size_t)drow * p.max_chunks + chunk) * p.n_heads + hg;
                p.partial[cell * D + d] = v;
                if (d == 0) p.lse[cell] = den > 0.0f ? (mmax + log2f(den)) * ATT_LN2 : -INFINITY;
            } else {
                cuda_store(p.out, p.out_dt, (size_t)row * p.n_heads * D + (size_t)hg * D + d, v);
            }
        }
        __syncthreads();
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
 * few dependent loads. */
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
        x[0] = *src;
    }
}

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
        if (live) {
            s = seq_of_row(p.q_indptr, p.n_seqs, row);
            live = p.q_indptr[s + 1] - p.q_indptr[s] == 1;
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
            for (int k = lane; k < mine; k += 32) mx = fmaxf(mx, lse[k * step]);
            for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            if (mx != -INFINITY) {
                for (int kb = 0; kb < mine; kb += 32) {
                    const float w = kb + lane < mine ? __expf(lse[(kb + lane) * step] - mx) : 0.0f;
                    den += w;
                    const int nk = mine - kb < 32 ? mine - kb : 32;
#pragma unroll 8
                    for (int j = 0; j < nk; j++) {
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
 * and never triggers its dependents early, so the o GEMV after it starts when it ends. On the
 * H200, batch-1 decode of the 8B shape at contexts 512 to 640 (v1 on 8 CTAs; tok/s of the
 * decode step): plain launches 480.1, PDL 486.1, PDL with a trigger at each CTA's start 462.8
 * (the GEMV's early weight loads then slow the attention itself), PDL with the chunk's K and V
 * prefetched to L2 before the wait 483.0. */
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
    case 128:
        return dispatch_group<128, KT>(p, gb, grid, smem, c, err);
    default:
        return dispatch_group<256, KT>(p, gb, grid, smem, c, err);
    }
}

template <int D, int SPLIT, typename KT>
static int launch_decode_mma(const att_params &p, dim3 grid, size_t smem, cuda_backend *c,
                             base_err *err) {
    /* MLXCEL_ATT_BULK_WAVES moves the threshold (0: never bulk), for tests and other devices */
    const char *env = getenv("MLXCEL_ATT_BULK_WAVES");
    const long long waves = env && *env ? strtoll(env, NULL, 10) : ATT_TC_BULK_WAVES;
    const long long ctas = (long long)grid.x * grid.y * grid.z;
    if (ctas <= waves * ATT_TC_CTAS * c->sm_count)
        return att_launch(c, paged_decode_mma_kernel<D, SPLIT, KT, true>, grid, ATT_TC_WARPS * 32,
                          smem, p, "attention (tensor cores)", err);
    return att_launch(c, paged_decode_mma_kernel<D, SPLIT, KT, false>, grid, ATT_TC_WARPS * 32,
                      smem, p, "attention (tensor cores)", err);
}

template <int D, typename KT>
static int dispatch_mma_split(const att_params &p, bool exact, dim3 grid, size_t smem,
                              cuda_backend *c, base_err *err) {
    /* Two f16 terms carry 22 bits, three bf16 terms 24: an F32 float's worth either way
     * (run_decode_mma sizes shared memory for the same count). */
    constexpr int FULL = std::is_same<KT, __half>::value ? 2 : 3;
    if (exact) return launch_decode_mma<D, FULL, KT>(p, grid, smem, c, err);
    return launch_decode_mma<D, 1, KT>(p, grid, smem, c, err);
}

/* The tensor-core decode kernel takes head_dim 64 or 128, groups of up to 16 and blocks of a
 * multiple of 16 tokens; every other decode shape runs on paged_attention_kernel. */
static bool mma_decode_fits(const att_params &p, const be_kv_layer *layer) {
    return p.decode && (layer->head_dim == 64 || layer->head_dim == 128) &&
           p.group <= ATT_TC_ROWS && layer->block_size % ATT_TC_TILE == 0;
}

/* Decode rows on the tensor cores, each warp att_stages tiles of 16 tokens deep. An F32
 * output is owed F32 accuracy, so q and P then go in as split terms. */
static int run_decode_mma(const att_params &p0, const be_kv_layer *layer, int chunks,
                          cuda_backend *c, base_err *err) {
    att_params p = p0;
    const bool exact = p.out_dt == BASE_DTYPE_F32;
    const int split = !exact ? 1 : layer->dtype == BASE_DTYPE_F16 ? 2 : 3;
    while (p.stages > ATT_MIN_STAGES &&
           att_tc_smem_bytes(layer->head_dim, p.stages, split) > ATT_SMEM_MAX)
        p.stages--;
    const size_t smem = att_tc_smem_bytes(layer->head_dim, p.stages, split);
    dim3 grid((unsigned)p.n_kv_heads, (unsigned)chunks,
              (unsigned)(p.n_tokens < ATT_GRID_MAX ? p.n_tokens : ATT_GRID_MAX));
    if (layer->head_dim == 64)
        return layer->dtype == BASE_DTYPE_F16
                   ? dispatch_mma_split<64, __half>(p, exact, grid, smem, c, err)
                   : dispatch_mma_split<64, __nv_bfloat16>(p, exact, grid, smem, c, err);
    return layer->dtype == BASE_DTYPE_F16
               ? dispatch_mma_split<128, __half>(p, exact, grid, smem, c, err)
               : dispatch_mma_split<128, __nv_bfloat16>(p, exact, grid, smem, c, err);
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
                         int n_heads, const be_tensor *out, base_err *err) {
    const int hd = layer->head_dim, nkv = layer->n_kv_heads;
    if (hd != 32 && hd != 64 && hd != 128 && hd != 256)
        return base_fail(err, "cuda: attention: head_dim %d (32, 64, 128 or 256)", hd);
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
    return 0;
}

int cuda_attention(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                   const be_paged_batch *batch, const be_decode_plan *plan, int n_heads,
                   float scale, be_tensor *out, base_err *err) {
    if (cuda_attention_check(q, layer, batch, n_heads, out, err)) return -1;
    const int hd = layer->head_dim, nkv = layer->n_kv_heads;
    if (batch->n_tokens == 0 || batch->n_seqs == 0) return 0;
    if (cuda_attention_wide_fits(be, layer, batch, n_heads))
        return cuda_attention_wide(be, q, layer, batch, n_heads, scale, out, err);
    const int group = n_heads / nkv;
    int gb = ATT_MAX_GROUP;
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
    p.scale_log2 = scale * ATT_LOG2E;
    p.stages = stages;
    cuda_backend *c = cuda_impl(be);

    if (batch->max_q_len > 1 && cuda_prefill_supported(layer, batch)) {
        if (cuda_attention_prefill(be, q, layer, batch, n_heads, scale, out, err)) return -1;
    } else if (batch->max_q_len > 1) {
        p.decode = 0;
        if (run_pass(p, layer, 1, c, err)) return -1;
    }
    p.decode = 1;
    if (!v2_usable(plan, batch, n_heads, hd, layer->block_size))
        return run_pass(p, layer, 1, c, err);
    p.split = 1;
    p.pages_per_chunk = plan->pages_per_chunk;
    p.max_chunks = plan->max_chunks;
    p.partial = (float *)plan->workspace;
    p.lse = p.partial + (size_t)batch->n_seqs * plan->max_chunks * n_heads * hd;
    if (run_pass(p, layer, plan->max_chunks, c, err)) return -1;
    return run_merge(p, hd, c, err);
}
