/* Paged prefill attention on the tensor cores: the rows of sequences with q_len > 1.
 *
 * Design, flash-attention style: one CTA per (query head, tile of 16 x NW query rows,
 * sequence), NW warps of 16 query rows each. The Q tile is loaded once (F32 activations scaled by
 * scale * log2 e, then rounded to the pool's dtype, since mma.sync takes both operands in
 * one type) and kept in registers as A fragments. K and V stream through shared memory in
 * tiles of PF_BN tokens, double-buffered with cp.async; each token is addressed through the
 * page table on its own, so any block size and any first-page offset work. Per tile:
 *   S = Q K^T  mma.sync m16n8k16 (ldmatrix for K), F32 accumulators;
 *   softmax    online, in the log2 domain, F32; the causal mask (and the kv_len edge) only on
 *              the tiles that reach past the first row's limit;
 *   O += P V   P re-packed from the S accumulators as A fragments, V through ldmatrix.trans.
 * Shared-memory rows are 16-byte chunks XOR-swizzled by the row index, so the eight row
 * addresses of an ldmatrix fall in distinct banks. Tokens past kv_len are zero-filled: the
 * pool slots there may hold anything, and 0 * NaN would poison the rows that mask them.
 * GQA maps each query head to its kv head; the heads of a group are adjacent in the grid, so
 * their K/V reads meet in L2. Tiles are launched last-first: the tiles at the end of a
 * sequence see the most keys.
 *
 * be_attn in the score loop: the soft-cap (cap * tanh(s / cap), in the log2 domain where s
 * and cap both carry log2 e) is applied to the S accumulators before any mask; a window
 * starts the tile loop at the tile of the first row's first visible key and masks the keys
 * before each row's window on the tiles that reach below the last row's; a head's sink joins
 * its denominator as the output is normalized. A row's first tiles may then be all masked,
 * so the running max is taken as 0 while it is -inf (exp2(-inf - -inf) would be NaN).
 *
 * Head_dim 256: the Q tile's fragments (64 registers of a thread) would crowd out the O
 * accumulators (128), so Q stays in shared memory past the K/V buffers and each k-step
 * reloads its fragment with ldmatrix (QS); up to 128 they live in registers. */
#include "backend/cuda/cuda_mma.h"

#define PF_BN      64 /* keys per shared-memory tile */
#define PF_GRID_YZ 65535
/* The launch shape cuda_attention uses (pf_dispatch_variant): 8 warps measured best or level
 * on the H200 at 8B geometry (bench/RESULTS.md). */
#define PF_VARIANT 2

typedef struct pf_params {
    const void *q;
    base_dtype q_dt;
    void *out;
    base_dtype out_dt;
    const void *k_pool, *v_pool;
    int n_kv_heads, block_size, n_heads, group;
    int block_shift; /* log2(block_size) when it is a power of two, else -1 */
    const int32_t *q_indptr, *kv_len, *page_indptr, *page_indices, *first_page_offset;
    float scale_log2;
    float softcap_log2; /* cap * log2 e; 0 = none */
    int window;         /* 0 = the whole causal span */
    const float *sinks; /* (n_heads) natural-log logits, or NULL */
} pf_params;

/* 2^x by the SFU: relative error about 2^-22, within what the tests' bound allows; 2^-inf is
 * 0 as the masked scores need. */
__device__ __forceinline__ float pf_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Element offset of 16-byte chunk c of row r in a [rows, D] tile: chunks XORed with r % 8. */
template <int D> __device__ __forceinline__ int pf_swz(int r, int c) {
    return r * D + ((c ^ (r & 7)) << 3);
}

/* Whether the Q tile stays in shared memory rather than in registers (head_dim 256). */
template <int D> __host__ __device__ constexpr bool pf_q_shared() {
    return D > 128;
}

template <int D, int NW, int MINB, typename KT>
__global__ void __launch_bounds__(NW * 32, MINB) prefill_attention_kernel(pf_params p) {
    constexpr int BM = NW * 16, CH = D / 8, NT = NW * 32, KS = D / 16, NB = PF_BN / 8;
    constexpr bool QS = pf_q_shared<D>();
    extern __shared__ __align__(16) unsigned char smem[];
    static_assert(QS || BM <= 2 * PF_BN, "the Q tile overlays one K/V buffer");
    /* Two buffers of (K (PF_BN, D), V (PF_BN, D)); the Q tile (BM, D) follows them (QS) or
     * borrows buffer 1 until its fragments are in registers, before the loop's second tile is
     * issued there. */
    KT *k_s = (KT *)smem, *v_s = k_s + PF_BN * D, *q_s = k_s + (QS ? 4 : 2) * PF_BN * D;
    const int h = blockIdx.x, s = blockIdx.z, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, tig = lane & 3;
    const int q0 = p.q_indptr[s], q_len = p.q_indptr[s + 1] - q0;
    const int n_tiles = (q_len + BM - 1) / BM;
    const int tile = n_tiles - 1 - (int)blockIdx.y;
    if (q_len < 2 || tile < 0) return;
    const int m0 = tile * BM, kv_len = p.kv_len[s], past = kv_len - q_len;
    const int kv_end = min(kv_len, past + m0 + BM); /* keys any row of the tile sees */
    const int n_kv = (kv_end + PF_BN - 1) / PF_BN;
    /* The first tile holding a key the tile's first row sees (its window's start). */
    const int w_lo = p.window > 0 ? past + m0 - p.window + 1 : 0;
    const int n_first = w_lo > 0 ? w_lo / PF_BN : 0;
    const int fpo = p.first_page_offset ? p.first_page_offset[s] : 0, bs = p.block_size;
    const int shift = p.block_shift;
    const int32_t *pages = p.page_indices + p.page_indptr[s];
    const uint64_t row_stride = (uint64_t)p.n_kv_heads * D;
    const int kvh = h / p.group;
    const KT *kp = (const KT *)p.k_pool + (uint64_t)kvh * D;
    const KT *vp = (const KT *)p.v_pool + (uint64_t)kvh * D;

    auto issue = [&](int buf, int n) {
        KT *kd = k_s + buf * 2 * PF_BN * D, *vd = v_s + buf * 2 * PF_BN * D;
        for (int c = tid; c < PF_BN * CH; c += NT) {
            const int t = c / CH, cc = c % CH, j = n * PF_BN + t;
            if (j < kv_len) {
                const int pos = fpo + j;
                const int pg = shift >= 0 ? pos >> shift : pos / bs;
                const int slot = shift >= 0 ? pos & (bs - 1) : pos % bs;
                const uint64_t off =
                    ((uint64_t)pages[pg] * bs + slot) * row_stride + (uint64_t)cc * 8;
                cuda_cp_async16(kd + pf_swz<D>(t, cc), kp + off);
                cuda_cp_async16(vd + pf_swz<D>(t, cc), vp + off);
            } else {
                *(uint4 *)(kd + pf_swz<D>(t, cc)) = make_uint4(0, 0, 0, 0);
                *(uint4 *)(vd + pf_swz<D>(t, cc)) = make_uint4(0, 0, 0, 0);
            }
        }
        cuda_cp_async_commit();
    };
    issue(0, n_first);

    /* Q: 8 dims per thread and pass, rows past q_len as zeros. */
    for (int c = tid; c < BM * CH; c += NT) {
        const int r = c / CH, cc = c % CH;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (m0 + r < q_len) {
            const size_t base = (size_t)(q0 + m0 + r) * p.n_heads * D + (size_t)h * D + cc * 8;
            if (p.q_dt == BASE_DTYPE_F32) {
                const float4 a = *(const float4 *)((const float *)p.q + base);
                const float4 b = *(const float4 *)((const float *)p.q + base + 4);
                f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
                f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) f[e] = cuda_load(p.q, p.q_dt, base + e);
            }
        }
        uint4 w;
        w.x = cuda_pack2<KT>(f[0] * p.scale_log2, f[1] * p.scale_log2);
        w.y = cuda_pack2<KT>(f[2] * p.scale_log2, f[3] * p.scale_log2);
        w.z = cuda_pack2<KT>(f[4] * p.scale_log2, f[5] * p.scale_log2);
        w.w = cuda_pack2<KT>(f[6] * p.scale_log2, f[7] * p.scale_log2);
        *(uint4 *)(q_s + pf_swz<D>(r, cc)) = w;
    }
    __syncthreads();
    const int q_row = warp * 16 + (lane & 15);
    uint32_t qa[QS ? 1 : KS][4];
    if constexpr (!QS) {
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            cuda_ldmatrix_x4(qa[ks], q_s + pf_swz<D>(q_row, ks * 2 + (lane >> 4)));
    }

    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
    /* Last visible key of this thread's two rows (g and g + 8 of the warp's 16), capped at
     * kv_len - 1 for the padding rows past q_len. */
    const int row_a = m0 + warp * 16 + g;
    const int lim[2] = {min(past + row_a, kv_len - 1), min(past + row_a + 8, kv_len - 1)};
    const int first_masked = past + m0 + 1; /* the first row sees keys [0, first_masked) */
    /* First visible key of the two rows, and the last row's: tiles below it need the window's
     * mask. */
    const int lo[2] = {p.window > 0 ? past + row_a - p.window + 1 : 0,
                       p.window > 0 ? past + row_a + 8 - p.window + 1 : 0};
    const int w_masked = p.window > 0 ? past + m0 + BM - p.window : 0;

    for (int n = n_first; n < n_kv; n++) {
        const int buf = (n - n_first) & 1;
        cuda_cp_async_wait<0>();
        __syncthreads();
        if (n + 1 < n_kv) issue(buf ^ 1, n + 1);
        const KT *kt = k_s + buf * 2 * PF_BN * D, *vt = v_s + buf * 2 * PF_BN * D;

        float sc[NB][4];
#pragma unroll
        for (int i = 0; i < NB; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const uint32_t *a = qa[QS ? 0 : ks];
            if constexpr (QS) cuda_ldmatrix_x4(qa[0], q_s + pf_swz<D>(q_row, ks * 2 + (lane >> 4)));
#pragma unroll
            for (int pb = 0; pb < NB / 2; pb++) {
                uint32_t b[4];
                const int t = pb * 16 + (lane & 7) + ((lane >> 4) << 3);
                cuda_ldmatrix_x4(b, kt + pf_swz<D>(t, ks * 2 + ((lane >> 3) & 1)));
                cuda_mma16816<KT>(sc[2 * pb], a, b[0], b[1]);
                cuda_mma16816<KT>(sc[2 * pb + 1], a, b[2], b[3]);
            }
        }
        if (p.softcap_log2 > 0.0f) {
#pragma unroll
            for (int i = 0; i < NB; i++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sc[i][e] = p.softcap_log2 * tanhf(sc[i][e] / p.softcap_log2);
        }

        if ((n + 1) * PF_BN > first_masked || n * PF_BN < w_masked) {
#pragma unroll
            for (int i = 0; i < NB; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int j = n * PF_BN + i * 8 + tig * 2 + (e & 1);
                    if (j > lim[e >> 1] || j < lo[e >> 1]) sc[i][e] = -INFINITY;
                }
        }

        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m_run[r];
#pragma unroll
            for (int i = 0; i < NB; i++) mx = fmaxf(mx, fmaxf(sc[i][2 * r], sc[i][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float base = mx == -INFINITY ? 0.0f : mx;
            alpha[r] = pf_exp2(m_run[r] - base);
            m_run[r] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int i = 0; i < NB; i++) {
                sc[i][2 * r] = pf_exp2(sc[i][2 * r] - base);
                sc[i][2 * r + 1] = pf_exp2(sc[i][2 * r + 1] - base);
                sum += sc[i][2 * r] + sc[i][2 * r + 1];
            }
            l_run[r] = l_run[r] * alpha[r] + sum;
        }
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            o[i][0] *= alpha[0], o[i][1] *= alpha[0];
            o[i][2] *= alpha[1], o[i][3] *= alpha[1];
        }

#pragma unroll
        for (int ks = 0; ks < PF_BN / 16; ks++) {
            const uint32_t pa[4] = {cuda_pack2<KT>(sc[2 * ks][0], sc[2 * ks][1]),
                                    cuda_pack2<KT>(sc[2 * ks][2], sc[2 * ks][3]),
                                    cuda_pack2<KT>(sc[2 * ks + 1][0], sc[2 * ks + 1][1]),
                                    cuda_pack2<KT>(sc[2 * ks + 1][2], sc[2 * ks + 1][3])};
            const int t = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
            for (int db = 0; db < D / 16; db++) {
                uint32_t b[4];
                cuda_ldmatrix_x4_trans(b, vt + pf_swz<D>(t, db * 2 + (lane >> 4)));
                cuda_mma16816<KT>(o[2 * db], pa, b[0], b[1]);
                cuda_mma16816<KT>(o[2 * db + 1], pa, b[2], b[3]);
            }
        }
    }

    /* Each quad holds a row's partial sums; rows past q_len are not written. */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const int row = row_a + 8 * r;
        if (row >= q_len) continue;
        float inv = 1.0f / l;
        if (p.sinks) {
            /* Against the larger of the running max and the sink, so neither overflows. */
            const float sk = p.sinks[h] * CUDA_LOG2E, m = fmaxf(m_run[r], sk);
            const float f = pf_exp2(m_run[r] - m);
            inv = f / (l * f + pf_exp2(sk - m));
        }
        const size_t base = (size_t)(q0 + row) * p.n_heads * D + (size_t)h * D + tig * 2;
#pragma unroll
        for (int i = 0; i < D / 8; i++) {
            if (p.out_dt == BASE_DTYPE_F32) {
                *(float2 *)((float *)p.out + base + i * 8) =
                    make_float2(o[i][2 * r] * inv, o[i][2 * r + 1] * inv);
            } else {
                cuda_store(p.out, p.out_dt, base + i * 8, o[i][2 * r] * inv);
                cuda_store(p.out, p.out_dt, base + i * 8 + 1, o[i][2 * r + 1] * inv);
            }
        }
    }
}

template <int D, int NW, int MINB, typename KT>
static int pf_launch(const pf_params &p, const be_paged_batch *batch, cudaStream_t st,
                     base_err *err) {
    const int bm = NW * 16;
    const size_t smem = ((size_t)4 * PF_BN + (pf_q_shared<D>() ? bm : 0)) * D * sizeof(KT);
    dim3 grid((unsigned)p.n_heads, (unsigned)((batch->max_q_len + bm - 1) / bm),
              (unsigned)batch->n_seqs);
    return cuda_launch_smem(prefill_attention_kernel<D, NW, MINB, KT>, grid, NW * 32, smem, st, p,
                            "prefill attention", err);
}

/* Variants: 0: 4 warps, registers for 2 CTAs per SM; 1: 4 warps squeezed to 3 CTAs per SM;
 * 2: 8 warps (128 query rows), 1 CTA per SM. */
template <int D, typename KT>
static int pf_dispatch_variant(const pf_params &p, const be_paged_batch *batch, int variant,
                               cudaStream_t st, base_err *err) {
    if (variant == 1) return pf_launch<D, 4, 3, KT>(p, batch, st, err);
    if (variant == 2) return pf_launch<D, 8, 1, KT>(p, batch, st, err);
    return pf_launch<D, 4, 2, KT>(p, batch, st, err);
}

bool cuda_attention_prefill_fits(const be_kv_layer *layer, const be_paged_batch *batch) {
    return (layer->head_dim == 64 || layer->head_dim == 128 || layer->head_dim == 256) &&
           (layer->dtype == BASE_DTYPE_F16 || layer->dtype == BASE_DTYPE_BF16) &&
           batch->n_seqs <= PF_GRID_YZ && (batch->max_q_len + 63) / 64 <= PF_GRID_YZ;
}

int cuda_attention_prefill_variant(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                                   const be_paged_batch *batch, int n_heads, be_attn attn,
                                   be_tensor *out, int variant, base_err *err) {
    pf_params p = {};
    p.q = q->data;
    p.q_dt = q->dtype;
    p.out = out->data;
    p.out_dt = out->dtype;
    p.k_pool = layer->k;
    p.v_pool = layer->v;
    p.n_kv_heads = layer->n_kv_heads;
    p.block_size = layer->block_size;
    p.block_shift = -1;
    for (int sh = 0; sh < 31; sh++)
        if (layer->block_size == 1 << sh) p.block_shift = sh;
    p.n_heads = n_heads;
    p.group = n_heads / layer->n_kv_heads;
    p.q_indptr = batch->q_indptr;
    p.kv_len = batch->kv_len;
    p.page_indptr = batch->page_indptr;
    p.page_indices = batch->page_indices;
    p.first_page_offset = batch->first_page_offset;
    p.scale_log2 = attn.scale * CUDA_LOG2E;
    p.softcap_log2 = attn.softcap * CUDA_LOG2E;
    p.window = attn.window;
    p.sinks = attn.sinks;
    cudaStream_t st = cuda_impl(be)->stream;
    const bool f16 = layer->dtype == BASE_DTYPE_F16;
    switch (layer->head_dim) {
    case 64:
        return f16 ? pf_dispatch_variant<64, __half>(p, batch, variant, st, err)
                   : pf_dispatch_variant<64, __nv_bfloat16>(p, batch, variant, st, err);
    case 128:
        return f16 ? pf_dispatch_variant<128, __half>(p, batch, variant, st, err)
                   : pf_dispatch_variant<128, __nv_bfloat16>(p, batch, variant, st, err);
    default:
        return f16 ? pf_dispatch_variant<256, __half>(p, batch, variant, st, err)
                   : pf_dispatch_variant<256, __nv_bfloat16>(p, batch, variant, st, err);
    }
}

int cuda_attention_prefill(be_backend *be, const be_tensor *q, const be_kv_layer *layer,
                           const be_paged_batch *batch, int n_heads, be_attn attn, be_tensor *out,
                           base_err *err) {
    return cuda_attention_prefill_variant(be, q, layer, batch, n_heads, attn, out, PF_VARIANT, err);
}
