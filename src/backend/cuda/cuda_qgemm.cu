/* The quantized GEMM on the tensor cores: y = x W^T for CUDA_QGEMM_MIN_ROWS to
 * CUDA_QGEMM_MAX_ROWS rows of x (batched decode, short prefill chunks) against the packed copy
 * of a 4- or 8-bit MLX affine weight (cuda_packed.h, made at load by cuda_pack_linear), with
 * the GEMVs' jobs: up to three matrices on one x (Q, K, V), gate and up with the GLU, the
 * residual add, a folded RMSNorm.
 *
 * Why not the GEMV past 32 rows: the tensor-core GEMV dequantizes every weight once per pass
 * and feeds it to at most 4 n-tiles of 8 rows from registers, so its cost per weight grows with
 * the rows; and the GEMM path before this one dequantized all of W into BF16 (4 bytes written
 * and read again per weight, 9x the 4-bit weight's bytes) for cuBLAS on every call. Here a
 * dequantized A fragment feeds a warp's 4 n-tiles and x is shared by the CTA's 16 m-tiles
 * (256 weight rows) through shared memory, and nothing is written but y.
 *
 * Two kernels. qg_prep (once per call) scales each row of x by a power of two 2^e that puts its
 * largest value in [2^14, 2^15) (after the norm, when one is folded: the prep sees whole rows),
 * rounds it to F16 and writes it in the order of the mma's B fragments for the packed sectors:
 * for sector s and n-tile (8 rows of x) nt, PARTS uint4s a lane, lane after lane, so that a
 * stage of one sector for a CTA's n-tiles is one contiguous run and a lane reads its fragment
 * with one 16-byte shared load, free of bank conflicts; rows past x's are zeros. qg_kernel: a
 * CTA of 8 warps owns 16 m-tiles (2 a warp) and 8 n-tiles (64 rows of x, every warp all of
 * them) over a k-range of sectors; every sector's weights (16 tiles x 512
 * bytes, already in lane order), scales and biases and x fragments go through a QG_STAGES-deep
 * cp.async ring in shared memory; a warp dequantizes its A fragments in registers to F16 with
 * the group's scale and bias applied (w = s q + b, one F16 FMA a pair after the magic-number
 * conversion of cuda_packed.h) and runs m16n8k16 mmas with F32 accumulation.
 *
 * Precision: w and x' are each rounded to F16 once (relative 2^-11, F16's subnormals below
 * 2^-14 for w), their products are exact and summed in F32; the BF16 GEMM path rounded both to
 * 2^-9. Each output is scaled back by 2^-e.
 *
 * Work split: m-blocks x n-blocks CTAs, and where they do not fill the SMs the k-range is
 * split: each CTA writes F32 partial sums and the last of an output tile's CTAs (a counter per
 * tile) adds them in k order, deterministically, before the epilogue. The epilogue adds the
 * bias, applies act(gate) * up for gate/up (their tiles alternate, so a warp holds both), adds
 * y for the residual add, and stores the output dtype.
 *
 * On sm_90a the mmas are m64n64k16 wgmmas: each warp's dequantized fragments are the A operand
 * from registers (the wgmma's A layout per warp is the mma's), x the B operand from shared
 * memory, prepared K-major in core matrices of 8 rows x 16 bytes; one wgmma replaces 8
 * mma.syncs and their B fragment loads. The sm_90 PTX (newer GPUs) keeps the mma.sync form.
 * H200, wgmma form (us at 64 / 128 / 256 rows, cuBLAS path in brackets): gate+up 98.4 / 105.8 /
 * 191.6 (286.7 / 295.7 / 328.0), lm_head 499 / 986 / 1936 (1200 / 1196 / 1281), a decode layer
 * 361 / 420 / 646 (557 / 584 / 654); 8B decode at 128 sequences 7183-7247 tok/s against 6098 with
 * the mma.sync form, 64 level (4498-4506 against 4453). A warp waits for its wgmmas before it
 * dequantizes the next sector, so within a warpgroup dequantization and wgmma take turns.
 *
 * mma.sync form, measured before the wgmma (H200, bench/bench_cuda_gemv.cu, 4-bit group 64, us at
 * 64 / 128 rows, the cuBLAS path in brackets): gate+up 86.5 / 159.2 (287.0 / 295.2), lm_head 559 /
 * 1113 (1200 / 1196), a decode layer 366 / 516 (559 / 584); decode of the 8B model at 64 sequences
 * 4453 tok/s (3007). At 256 rows cuBLAS wins (a layer 647 against 799): the mma.sync rate and 2
 * warps a scheduler bind (ncu: 0.42 instructions issued a cycle), hence CUDA_QGEMM_MAX_ROWS. Tried:
 * 4 x 2 warps of 4 x 4 tiles (twice the dequantization a mma: 64 sequences 3838 tok/s), tiles of 32
 * rows of x at two CTAs an SM (gate+up slower, lm_head faster, a layer equal), two CTAs an SM of
 * this layout at 128 registers (64 sequences 3619 tok/s), the GEMM from 17 rows (the GEMV is faster
 * there but on lm_head). bench/RESULTS.md has the runs. */
#include "backend/cuda/cuda_mma.h"
#include "backend/cuda/cuda_packed.h"

#define QG_WARPS 8
#define QG_WM    8 /* warps along m */
#define QG_WN    1 /* warps along n */
#define QG_MT    2 /* m-tiles a warp */
#define QG_NT    8 /* n-tiles a warp: 64 rows of x */
/* m-tiles a CTA: 256 rows of W. */
#define QG_TILES (QG_WM * QG_MT)
/* Sectors in flight in a CTA's ring: 512 bytes of weights a tile each, so 5 of them hold
 * 40 KB of weights in flight per SM, what the H200's bandwidth times its latency asks of each
 * of its SMs (4.8 TB/s x ~1 us / 132). */
#define QG_STAGES 6
/* Output tiles whose k-range may be split: only launches of fewer tiles than SMs split it, so
 * the counters of a launch fit here; they sit first in the scratch and every launch leaves
 * them at zero. */
#define QG_MAX_SPLIT_TILES 1024
/* Most k-ranges: the last CTA loads every k-range's partial of an output at once, for QG_RED
 * outputs a thread at a time. */
#define QG_MAX_KSPLIT 8
#define QG_RED        4
/* Sectors of x a prep CTA converts: a few loads in flight per thread, CTAs enough to fill the
 * SMs at 64 rows. */
#define QG_PREP_SECTORS 8

struct qg_job {
    cuda_gemv_mat m[3];
    const uint8_t *pk[3]; /* the matrices' packed copies */
    int64_t mt[3];        /* m-tiles of each matrix (0 past the n used) */
    int64_t in, sectors, groups;
    int gshift;        /* log2(values per group) */
    int64_t rows;      /* PLAIN: the outs summed; GLU: out */
    int64_t tiles;     /* m-tiles of the job (PLAIN: the matrices' in turn; GLU: 2 ceil(out / 16),
                        * gate and up alternating) */
    int nx;            /* rows of x */
    int ntx;           /* n-tiles of the prepared x (a multiple of a CTA's) */
    int ksplit, spc;   /* k-ranges, sectors per k-range */
    const uint4 *xh;   /* (sectors, ntx, PARTS, 32) the prepared x */
    const float *unsc; /* (ntx * 8) each row's 2^-e, 0 past the rows of x */
    float *part;       /* (ksplit, ntx * 8, tiles * 16) partial sums when ksplit > 1 */
    unsigned *count;   /* (QG_MAX_SPLIT_TILES) CTAs done per output tile */
    cuda_gemv_fuse fz; /* acc and act (the norm is folded by the prep) */
};

/* Four consecutive values of x from index i (a multiple of 4) as floats; x was written by an
 * earlier kernel, so plain loads. */
__device__ __forceinline__ float4 qg_load4(const void *x, base_dtype dt, size_t i) {
    if (dt == BASE_DTYPE_F32) return *(const float4 *)((const float *)x + i);
    return make_float4(cuda_load(x, dt, i), cuda_load(x, dt, i + 1), cuda_load(x, dt, i + 2),
                       cuda_load(x, dt, i + 3));
}

/* A CTA per n-tile of 8 rows of x and QG_PREP_SECTORS sectors, a warp a row: the row's norm
 * (fz.norm: x * w / rms) and scale first, from the whole row (each of the n-tile's CTAs reads
 * it: the rows are few and in L2), then the F16 fragments of the CTA's sectors. */
template <int BITS>
__global__ void __launch_bounds__(256)
    qg_prep(const void *x, base_dtype xdt, int64_t in, int nx, int ntx, int64_t sectors,
            cuda_gemv_fuse fz, uint4 *xh, float *unsc) {
    constexpr int VPS = gmma_vps<BITS>(), VPL = gmma_vpl<BITS>(), XU = VPL / 2;
    constexpr int PARTS = gmma_parts<BITS>(), WV = 32 / BITS;
    __shared__ float scale[8];
    cuda_pdl_wait();
    cuda_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nt = blockIdx.x;
    const int xr = nt * 8 + warp;
    if (xr < nx) {
        float m = 0.0f, ss = 0.0f;
        /* Unrolled so that several loads are in flight: the loop is the prep's latency. */
#pragma unroll 8
        for (int64_t k = 4 * lane; k < in; k += 128) {
            float4 f = qg_load4(x, xdt, (size_t)(xr * in + k));
            if (fz.norm) {
                ss += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
                float w4[4];
                cuda_load_ro<4>(fz.norm, fz.norm_dt, (size_t)k, w4);
                f.x *= w4[0], f.y *= w4[1], f.z *= w4[2], f.w *= w4[3];
            }
            m = fmaxf(m, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
        }
        for (int o = 16; o > 0; o >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        }
        const float rinv = fz.norm ? cuda_rms_inv(ss, in, fz.eps) : 1.0f;
        /* A NaN or inf in the row keeps e at 0 (gmma_exp) and reaches the row's outputs. */
        const int e = gmma_exp(__float_as_int(m * rinv));
        if (lane == 0) {
            scale[warp] = rinv * gmma_pow2(e);
            if (blockIdx.y == 0) unsc[xr] = gmma_pow2(-e);
        }
    } else if (lane == 0) {
        scale[warp] = 0.0f;
        if (blockIdx.y == 0) unsc[xr] = 0.0f;
    }
    __syncthreads();
    const int64_t sb = blockIdx.y * QG_PREP_SECTORS;
    const int64_t se = sb + QG_PREP_SECTORS < sectors ? sb + QG_PREP_SECTORS : sectors;
    for (int64_t u = sb * 32 + threadIdx.x; u < se * 32; u += blockDim.x) {
        const int ln = (int)(u & 31), lg = ln >> 2, lt = ln & 3;
        const int64_t s = u >> 5, row = nt * 8 + lg;
        const bool on = row < nx;
        const int64_t k0 = s * VPS + lt * VPL;
        const float sc = scale[lg];
        float xv[VPL];
#pragma unroll
        for (int v = 0; v < VPL / 4; v++) {
            float4 f = on ? qg_load4(x, xdt, (size_t)(row * in + k0 + 4 * v))
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float w4[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            if (on && fz.norm) cuda_load_ro<4>(fz.norm, fz.norm_dt, (size_t)(k0 + 4 * v), w4);
            xv[4 * v] = f.x * w4[0] * sc, xv[4 * v + 1] = f.y * w4[1] * sc;
            xv[4 * v + 2] = f.z * w4[2] * sc, xv[4 * v + 3] = f.w * w4[3] * sc;
        }
        /* Word wd's values j and j + WV / 2 make one register, low first, as the weight
         * word's pairs come out of gmma_dq4 / gmma_dq8. */
        uint32_t hw[XU];
#pragma unroll
        for (int wd = 0; wd < 2; wd++)
#pragma unroll
            for (int p = 0; p < WV / 2; p++)
                hw[wd * WV / 2 + p] = cuda_pack2<__half>(xv[wd * WV + p], xv[wd * WV + p + WV / 2]);
#if defined(CUDA_HAVE_WGMMA)
        /* The wgmma's B: for each k-step q of the sector (registers 2q and 2q + 1, the mma's
         * b0 and b1), the 16 x 64 tile of the CTA's rows of x K-major in core matrices of 8
         * rows x 8 values: (n-tile, half) at 256 n-tile + 128 half bytes, row g at 16 g, the
         * lane's pair at 4 t (qg_xstage). */
        uint32_t *dst = (uint32_t *)xh + (s * (ntx / QG_NT) + nt / QG_NT) * (XU / 2) * QG_NT * 64 +
                        (nt % QG_NT) * 64 + lg * 4 + lt;
#pragma unroll
        for (int q = 0; q < XU / 2; q++) {
            dst[q * QG_NT * 64] = hw[2 * q];
            dst[q * QG_NT * 64 + 32] = hw[2 * q + 1];
        }
#else
        uint4 *dst = xh + ((s * ntx + nt) * PARTS) * 32 + ln;
#pragma unroll
        for (int p = 0; p < PARTS; p++)
            dst[p * 32] = make_uint4(hw[4 * p], hw[4 * p + 1], hw[4 * p + 2], hw[4 * p + 3]);
#endif
    }
}

/* Output `row` of matrix mi (PLAIN) or of gate/up (GLU, v gate's and v2 up's) for row xr of x,
 * from the unscaled sums. */
template <bool GLU>
__device__ __forceinline__ void qg_store(const qg_job &j, int mi, int xr, int64_t row, float v,
                                         float v2) {
    if (GLU) {
        if (j.m[0].bias) v += cuda_load(j.m[0].bias, j.m[0].bias_dt, (size_t)row);
        if (j.m[1].bias) v2 += cuda_load(j.m[1].bias, j.m[1].bias_dt, (size_t)row);
        cuda_store(j.m[0].y, j.m[0].y_dt, (size_t)(xr * j.rows + row), cuda_act(j.fz.act, v) * v2);
    } else {
        cuda_gemv_store(j, mi, xr, row, v, cuda_gemv_prev(j, mi, xr, row));
    }
}

/* Matrix mi's packed copy and m-tiles, picked without indexing the parameter arrays. */
__device__ __forceinline__ const uint8_t *qg_pk(const qg_job &j, int mi) {
    return mi == 0 ? j.pk[0] : (mi == 1 ? j.pk[1] : j.pk[2]);
}
__device__ __forceinline__ int64_t qg_mt(const qg_job &j, int mi) {
    return mi == 0 ? j.mt[0] : (mi == 1 ? j.mt[1] : j.mt[2]);
}

/* Rows g and g + 8's (scale, bias) of one m-tile's group as F16 pairs, sp at row g's. */
template <typename S>
__device__ __forceinline__ void qg_sb_h2(const gmma_sb_t<S> *sp, uint32_t *sc, uint32_t *bi) {
#pragma unroll
    for (int rh = 0; rh < 2; rh++) {
        const float2 f = gmma_sb<S>(sp[8 * rh]);
        const __half2 hs = __float2half2_rn(f.x), hb = __float2half2_rn(f.y);
        sc[rh] = *(const uint32_t *)&hs;
        bi[rh] = *(const uint32_t *)&hb;
    }
}

/* Word wd of a lane's 16 bytes of a sector as the F16 pairs of rows g (h0) and g + 8 (h1),
 * w = s q + b applied. */
template <int BITS>
__device__ __forceinline__ void qg_dq(const uint4 &wa, int wd, const uint32_t *sc,
                                      const uint32_t *bi, uint32_t *h0, uint32_t *h1) {
    constexpr int PAIRS = BITS == 4 ? 4 : 2;
    gmma_dq_rows<BITS>(wa, wd, h0, h1);
#pragma unroll
    for (int p = 0; p < PAIRS; p++) {
        h0[p] = gmma_hfma(h0[p], sc[0], bi[0]);
        h1[p] = gmma_hfma(h1[p], sc[1], bi[1]);
    }
}

/* About 150 registers a thread: one CTA an SM. */
template <int BITS, bool GLU, typename S>
__global__ void __launch_bounds__(QG_WARPS * 32, 1) qg_kernel(const qg_job job) {
    constexpr int NT = QG_NT;
    constexpr int PARTS = gmma_parts<BITS>(), NTC = QG_WN * NT, VPS = gmma_vps<BITS>();
    constexpr int WB = QG_TILES * GMMA_SECTOR_BYTES;       /* a stage's weights */
    constexpr int XB = NTC * PARTS * 32 * 16;              /* its x fragments */
    constexpr int SB = QG_TILES * 16 * 2 * (int)sizeof(S); /* its scales and biases */
    constexpr int STB = WB + XB + SB, TH = QG_WARPS * 32;
    constexpr int WI = WB / 16 / TH, XI = (XB / 16 + TH - 1) / TH, SPT = SB / 16 / QG_TILES;
    using SBT = gmma_sb_t<S>;
    extern __shared__ uint4 qg_smem[];
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp % QG_WM, wn = warp / QG_WM;
    const int64_t mb = blockIdx.x;
    const int nb = blockIdx.y, ks = blockIdx.z;
    const int64_t s0 = (int64_t)ks * job.spc;
    const int ns = (int)(job.sectors - s0 < job.spc ? job.sectors - s0 : job.spc);

    /* This thread's copies of a stage, the same every sector: weight chunks c = tid + TH i
     * (tile c / 32, the 16 bytes of lane c % 32), scale chunks c = tid < SB / 16 (tile c / SPT,
     * 16 bytes of its 16 rows' pairs), x chunks c = tid + TH i < XB / 16. Tiles past the job's
     * are zero-filled: their rows' sums are 0 and never stored. */
    const uint8_t *wsrc[WI];
    bool wok[WI];
#pragma unroll
    for (int i = 0; i < WI; i++) {
        const int c = tid + i * TH;
        const int64_t vt = mb * QG_TILES + c / 32;
        wok[i] = vt < job.tiles;
        int64_t lt = 0;
        const int mi = wok[i] ? gmma_tile<GLU>(job, vt, &lt) : 0;
        wsrc[i] = qg_pk(job, mi) + gmma_code_bytes(lt, job.sectors) + (c % 32) * 16;
    }
    const uint8_t *ssrc = job.pk[0];
    bool sok = false;
    if (tid < SB / 16) {
        const int64_t vt = mb * QG_TILES + tid / SPT;
        sok = vt < job.tiles;
        int64_t lt = 0;
        const int mi = sok ? gmma_tile<GLU>(job, vt, &lt) : 0;
        ssrc = qg_pk(job, mi) + gmma_code_bytes(qg_mt(job, mi), job.sectors) +
               (size_t)lt * job.groups * 16 * sizeof(SBT) + (tid % SPT) * 16;
    }
    const uint4 *xsrc = job.xh + (size_t)nb * NTC * PARTS * 32;
    auto load = [&](int buf, int64_t s) {
        uint8_t *st = (uint8_t *)qg_smem + (size_t)buf * STB;
#pragma unroll
        for (int i = 0; i < WI; i++)
            cuda_cp_async16_zfill(st + (tid + i * TH) * 16,
                                  wok[i] ? wsrc[i] + s * GMMA_SECTOR_BYTES : job.pk[0], wok[i]);
        if (tid < SB / 16) {
            const int64_t gi = (s * VPS) >> job.gshift;
            cuda_cp_async16_zfill(st + WB + XB + tid * 16,
                                  sok ? ssrc + gi * 16 * sizeof(SBT) : job.pk[0], sok);
        }
#pragma unroll
        for (int i = 0; i < XI; i++) {
            const int c = tid + i * TH;
            if (XB / 16 % TH == 0 || c < XB / 16)
                cuda_cp_async16(st + WB + c * 16, xsrc + (size_t)s * job.ntx * PARTS * 32 + c);
        }
    };

    /* Stages loaded ahead of the one the warps read. */
    constexpr int LA = QG_STAGES - 1;
    /* The weights depend on no kernel, x's fragments on the prep before: wait in between. */
    cuda_pdl_wait();
#pragma unroll
    for (int i = 0; i < LA; i++) {
        if (i < ns) load(i, s0 + i);
        cuda_cp_async_commit();
    }

    float acc[QG_MT][NT][4];
#pragma unroll
    for (int a = 0; a < QG_MT; a++)
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[a][b][i] = 0.0f;

#if defined(CUDA_HAVE_WGMMA)
    /* Each warp dequantizes its two m-tiles' A fragments for the sector's k-steps and issues
     * the wgmmas, which run while the other warpgroup dequantizes: warp w of a warpgroup is
     * rows 16 w to 16 w + 15 of each 64-row wgmma, so a wgmma covers m-tile a of the group's
     * four warps and all 64 rows of x. A warp waits for its wgmmas before it writes the A
     * registers again (writing a second register set while they run made ptxas serialize
     * them). */
    static_assert(QG_NT == 8 && QG_WN == 1, "the wgmma is m64n64: 8 n-tiles, one warp along n");
    constexpr int KS = gmma_vpl<BITS>() / 4; /* k-steps of 16 a sector */
    /* The accumulators stay in place across the wgmmas: a write of them the compiler moved
     * into the loop would serialize the wgmmas, a read moved before the last wait be early. */
    auto hold_acc = [&]() {
#pragma unroll
        for (int a = 0; a < QG_MT; a++)
#pragma unroll
            for (int b = 0; b < NT; b++)
#pragma unroll
                for (int i = 0; i < 4; i++) cuda_wgmma_hold(acc[a][b][i]);
    };
    hold_acc();
    for (int i = 0; i < ns; i++) {
        /* Stage i - 1's wgmmas done in every warp (the barrier): its buffer is free. */
        cuda_wgmma_wait<0>();
        cuda_cp_async_wait<LA - 1>();
        /* This thread's copies of stage i, written in the generic proxy, are read by the
         * wgmmas in the async proxy. */
        cuda_fence_proxy_async();
        __syncthreads();
        if (i + LA < ns) load((i + LA) % QG_STAGES, s0 + i + LA);
        cuda_cp_async_commit();
        const uint8_t *st = (const uint8_t *)qg_smem + (size_t)(i % QG_STAGES) * STB;
        uint32_t af[QG_MT][KS][4];
#pragma unroll
        for (int a = 0; a < QG_MT; a++) {
            const int tt = wm * QG_MT + a;
            const uint4 wa = *(const uint4 *)(st + tt * GMMA_SECTOR_BYTES + lane * 16);
            uint32_t sc[2], bi[2];
            qg_sb_h2<S>((const SBT *)(st + WB + XB) + tt * 16 + g, sc, bi);
#pragma unroll
            for (int wd = 0; wd < 2; wd++) {
                constexpr int PAIRS = BITS == 4 ? 4 : 2;
                uint32_t h0[PAIRS], h1[PAIRS];
                qg_dq<BITS>(wa, wd, sc, bi, h0, h1);
#pragma unroll
                for (int j = 0; j < PAIRS / 2; j++) {
                    uint32_t *f = af[a][BITS == 4 ? 2 * wd + j : wd];
                    f[0] = h0[2 * j], f[1] = h1[2 * j], f[2] = h0[2 * j + 1], f[3] = h1[2 * j + 1];
                }
            }
        }
        cuda_wgmma_fence();
#pragma unroll
        for (int a = 0; a < QG_MT; a++)
#pragma unroll
            for (int q = 0; q < KS; q++)
                cuda_wgmma_m64n64k16(&acc[a][0][0], af[a][q],
                                     cuda_wgmma_desc(st + WB + q * QG_NT * 256, 128, 256));
        cuda_wgmma_commit();
    }
    cuda_wgmma_wait<0>();
    hold_acc();
#else
    for (int i = 0; i < ns; i++) {
        cuda_cp_async_wait<LA - 1>();
        __syncthreads();
        /* The buffer read at i - 1 is free once every warp has passed the barrier. */
        if (i + LA < ns) load((i + LA) % QG_STAGES, s0 + i + LA);
        cuda_cp_async_commit();
        const uint8_t *st = (const uint8_t *)qg_smem + (size_t)(i % QG_STAGES) * STB;
        uint4 wa[QG_MT];
        uint32_t sc[QG_MT][2], bi[QG_MT][2];
#pragma unroll
        for (int a = 0; a < QG_MT; a++) {
            const int tt = wm * QG_MT + a;
            wa[a] = *(const uint4 *)(st + tt * GMMA_SECTOR_BYTES + lane * 16);
            qg_sb_h2<S>((const SBT *)(st + WB + XB) + tt * 16 + g, sc[a], bi[a]);
        }
#pragma unroll
        for (int wd = 0; wd < 2; wd++) {
            uint4 bx[NT];
#pragma unroll
            for (int b = 0; b < NT; b++)
                bx[b] =
                    *(const uint4 *)(st + WB +
                                     (((wn * NT + b) * PARTS + (BITS == 4 ? wd : 0)) * 32 + lane) *
                                         16);
#pragma unroll
            for (int a = 0; a < QG_MT; a++) {
                constexpr int PAIRS = BITS == 4 ? 4 : 2;
                uint32_t h0[PAIRS], h1[PAIRS];
                qg_dq<BITS>(wa[a], wd, sc[a], bi[a], h0, h1);
#pragma unroll
                for (int j = 0; j < PAIRS / 2; j++) {
                    const uint32_t af[4] = {h0[2 * j], h1[2 * j], h0[2 * j + 1], h1[2 * j + 1]};
                    /* 4-bit: registers 2j, 2j + 1 of part wd; 8-bit: 2wd, 2wd + 1 of part 0 */
                    const int u = BITS == 4 ? 2 * j : 2 * wd;
#pragma unroll
                    for (int b = 0; b < NT; b++) {
                        const uint32_t r[4] = {bx[b].x, bx[b].y, bx[b].z, bx[b].w};
                        cuda_mma16816<__half>(acc[a][b], af, r[u], r[u + 1]);
                    }
                }
            }
        }
    }
#endif
    cuda_cp_async_wait<0>();
    cuda_pdl_trigger();

    /* Accumulator i of (a, b): row g + 8 (i / 2) of m-tile wm QG_MT + a, row of x
     * 2t + i % 2 of n-tile wn NT + b. */
    const int64_t vt0 = mb * QG_TILES + wm * QG_MT;
    const int xr0 = (nb * NTC + wn * NT) * 8 + 2 * t;
    if (job.ksplit == 1) {
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                const int xr = xr0 + 8 * b + c;
                if (xr >= job.nx) continue;
                const float us = job.unsc[xr];
#pragma unroll
                for (int a = 0; a < QG_MT; a += GLU ? 2 : 1)
#pragma unroll
                    for (int rh = 0; rh < 2; rh++) {
                        const int64_t vt = vt0 + a;
                        if (vt >= job.tiles) continue;
                        int64_t lt = 0;
                        const int mi = gmma_tile<GLU>(job, vt, &lt);
                        const int64_t row = lt * 16 + g + 8 * rh;
                        const int64_t out_m =
                            GLU ? job.rows : cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
                        if (row >= out_m) continue;
                        const float v = acc[a][b][2 * rh + c] * us;
                        const float v2 = GLU ? acc[a + (GLU ? 1 : 0)][b][2 * rh + c] * us : 0.0f;
                        qg_store<GLU>(job, mi, xr, row, v, v2);
                    }
            }
        return;
    }

    /* Split k: this CTA's partials out, then the last CTA of the tile adds them in k order. */
    const int64_t vrows = job.tiles * 16, xrows = (int64_t)job.ntx * 8;
#pragma unroll
    for (int a = 0; a < QG_MT; a++)
#pragma unroll
        for (int b = 0; b < NT; b++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t vt = vt0 + a;
                if (vt >= job.tiles) continue;
                const int xr = xr0 + 8 * b + (i & 1);
                job.part[((int64_t)ks * xrows + xr) * vrows + vt * 16 + g + 8 * (i >> 1)] =
                    acc[a][b][i];
            }
    __threadfence();
    __syncthreads();
    const unsigned ct = (unsigned)(mb * gridDim.y + nb);
    if (tid == 0) last = atomicAdd(&job.count[ct], 1u) == (unsigned)job.ksplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int64_t t0 = mb * QG_TILES;
    const int64_t t1 = t0 + QG_TILES < job.tiles ? t0 + QG_TILES : job.tiles;
    /* GLU: the tile pairs' output rows; PLAIN: the tiles' rows. QG_RED outputs a thread at a
     * time, every k-range's partial of each asked for before any is added (in k order): the
     * loads' latency, not their bytes, is this loop's cost. */
    const int64_t span = GLU ? (t1 - t0) / 2 * 16 : (t1 - t0) * 16, total = span * NTC * 8;
    for (int64_t u0 = tid; u0 < total; u0 += TH * QG_RED) {
        float pv[QG_RED][QG_MAX_KSPLIT], pv2[QG_RED][QG_MAX_KSPLIT];
        int64_t rows[QG_RED];
        int xrs[QG_RED], mis[QG_RED];
        bool ok[QG_RED];
#pragma unroll
        for (int j = 0; j < QG_RED; j++) {
            const int64_t u = u0 + (int64_t)j * TH;
            const int xr = nb * NTC * 8 + (int)(u / span);
            const int64_t o = u % span;
            int64_t v0 = 0, row = 0;
            int mi = 0;
            if (GLU) {
                row = t0 / 2 * 16 + o;
                v0 = (row / 16) * 32 + row % 16;
                ok[j] = row < job.rows;
            } else {
                v0 = t0 * 16 + o;
                int64_t lt = 0;
                mi = gmma_tile<false>(job, v0 / 16, &lt);
                row = lt * 16 + v0 % 16;
                ok[j] = row < cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
            }
            ok[j] = ok[j] && u < total && xr < job.nx;
            rows[j] = row, xrs[j] = xr, mis[j] = mi;
#pragma unroll
            for (int k = 0; k < QG_MAX_KSPLIT; k++) {
                const bool on = ok[j] && k < job.ksplit;
                const float *p = job.part + ((int64_t)k * xrows + xr) * vrows + v0;
                pv[j][k] = on ? __ldcg(p) : 0.0f;
                pv2[j][k] = on && GLU ? __ldcg(p + 16) : 0.0f;
            }
        }
#pragma unroll
        for (int j = 0; j < QG_RED; j++) {
            if (!ok[j]) continue;
            float v = 0.0f, v2 = 0.0f;
#pragma unroll
            for (int k = 0; k < QG_MAX_KSPLIT; k++) v += pv[j][k], v2 += pv2[j][k];
            const float us = job.unsc[xrs[j]];
            qg_store<GLU>(job, mis[j], xrs[j], rows[j], v * us, v2 * us);
        }
    }
    if (tid == 0) job.count[ct] = 0;
}

bool cuda_qgemm_fits(const be_tensor *x, const be_linear *w) {
    return x->rows >= 1 && cuda_float_dtype(x->dtype) && w->packed != NULL &&
           !(w->bits == 4 && w->group_size == 32) && ((uintptr_t)x->data & 15) == 0 &&
           (!w->bias || cuda_float_dtype(w->bias_dtype));
}

/* The scratch: the split tiles' counters, each row's 2^-e, the prepared x, the partials. */
struct qg_scratch {
    size_t unsc, xh, part, bytes;
};
static qg_scratch qg_layout(int64_t ntx, int64_t sectors, int parts, int ksplit, int64_t tiles) {
    qg_scratch l;
    l.unsc = (QG_MAX_SPLIT_TILES * sizeof(unsigned) + 255) & ~(size_t)255;
    l.xh = l.unsc + (((size_t)ntx * 8 * sizeof(float) + 255) & ~(size_t)255);
    l.part = l.xh + (size_t)sectors * ntx * parts * 512;
    l.bytes = l.part + (ksplit > 1 ? (size_t)ksplit * ntx * 8 * tiles * 16 * sizeof(float) : 0);
    return l;
}

template <int BITS, bool GLU, typename S>
static int qg_launch(be_backend *be, qg_job job, const be_tensor *x, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    constexpr int PARTS = gmma_parts<BITS>(), NTC = QG_WN * QG_NT;
    constexpr int STB =
        QG_TILES * GMMA_SECTOR_BYTES + NTC * PARTS * 512 + QG_TILES * 16 * 2 * (int)sizeof(S);
    constexpr size_t SMEM = (size_t)QG_STAGES * STB;
    auto kernel = qg_kernel<BITS, GLU, S>;
    static bool ready;
    if (!ready) {
        if (cuda_smem_limit(kernel, SMEM, "matmul (quantized GEMM)", err)) return -1;
        ready = true;
    }
    const int64_t ntc_blocks = (job.nx + NTC * 8 - 1) / (NTC * 8);
    job.ntx = (int)(ntc_blocks * NTC);
    const int64_t mblocks = (job.tiles + QG_TILES - 1) / QG_TILES;
    const int64_t ctas = mblocks * ntc_blocks;
    /* Split k where the tiles leave SMs idle, keeping 8 sectors or more a k-range. */
    int64_t ksplit = ctas < c->sm_count ? c->sm_count / ctas : 1;
    if (ksplit > job.sectors / 8) ksplit = job.sectors / 8;
    if (ksplit > QG_MAX_KSPLIT) ksplit = QG_MAX_KSPLIT;
    if (ksplit < 1 || ctas > QG_MAX_SPLIT_TILES) ksplit = 1;
    job.spc = (int)((job.sectors + ksplit - 1) / ksplit);
    job.ksplit = (int)((job.sectors + job.spc - 1) / job.spc);
    const qg_scratch l = qg_layout(job.ntx, job.sectors, PARTS, job.ksplit, job.tiles);
    const size_t cap = c->qg_bytes;
    if (cuda_scratch(be, &c->qg_buf, &c->qg_bytes, l.bytes, "quantized GEMM", err)) return -1;
    /* The counters start at zero once and every launch leaves them there. */
    if (c->qg_bytes != cap) {
        cudaError_t e = cudaMemsetAsync(c->qg_buf, 0, c->qg_bytes, c->stream);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: quantized GEMM scratch: %s",
                             cudaGetErrorString(e));
    }
    char *base = (char *)c->qg_buf;
    job.count = (unsigned *)base;
    job.unsc = (const float *)(base + l.unsc);
    job.xh = (const uint4 *)(base + l.xh);
    job.part = (float *)(base + l.part);
    const dim3 pgrid((unsigned)job.ntx,
                     (unsigned)((job.sectors + QG_PREP_SECTORS - 1) / QG_PREP_SECTORS));
    if (cuda_launch_pdl(c, qg_prep<BITS>, pgrid, dim3(256), 0, "matmul (quantized GEMM x)", err,
                        x->data, x->dtype, job.in, job.nx, job.ntx, job.sectors, job.fz,
                        (uint4 *)(base + l.xh), (float *)(base + l.unsc)))
        return -1;
    const dim3 grid((unsigned)mblocks, (unsigned)ntc_blocks, (unsigned)job.ksplit);
    return cuda_launch_pdl(c, kernel, grid, dim3(QG_WARPS * 32), SMEM, "matmul (quantized GEMM)",
                           err, job);
}

template <bool GLU, typename S>
static int qg_dispatch_s(be_backend *be, const qg_job &job, const be_tensor *x, int bits,
                         base_err *err) {
    return bits == 8 ? qg_launch<8, GLU, S>(be, job, x, err)
                     : qg_launch<4, GLU, S>(be, job, x, err);
}

template <bool GLU>
static int qg_dispatch(be_backend *be, const qg_job &job, const be_tensor *x, int bits,
                       base_dtype sdt, base_err *err) {
    if (sdt == BASE_DTYPE_F32) return qg_dispatch_s<GLU, float>(be, job, x, bits, err);
    if (sdt == BASE_DTYPE_F16) return qg_dispatch_s<GLU, __half>(be, job, x, bits, err);
    return qg_dispatch_s<GLU, __nv_bfloat16>(be, job, x, bits, err);
}

int cuda_qgemm(be_backend *be, const be_tensor *x, const be_linear *const *ws, be_tensor *const *ys,
               int n, bool glu, const cuda_gemv_fuse *fz, base_err *err) {
    const be_linear *w = ws[0];
    qg_job job = {};
    if (gmma_job_init(&job, x, ws, ys, n, glu, fz) == 0) return 0;
    return glu ? qg_dispatch<true>(be, job, x, w->bits, w->dtype, err)
               : qg_dispatch<false>(be, job, x, w->bits, w->dtype, err);
}
