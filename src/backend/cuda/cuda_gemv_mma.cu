/* The decode GEMV on the tensor cores: y = x W^T for 1 to 32 F32 rows of x against 4- or 8-bit
 * MLX affine weights, every row of x served by ONE pass over W (the single-row GEMV of
 * cuda_gemv.cu holds x in registers and serves one or two rows a pass). 4-bit groups of 32
 * take 16 rows a pass.
 *
 * Precision. A quantized value q is exact in F16, and a word of packed values becomes F16
 * pairs without conversions: (w & 0x000F000F) | 0x64006400 is the half2 (1024 + q0, 1024 + q4),
 * one packed subtraction leaves (q0, q4); the nibbles at bits 4..7 come out as 1024 + 16 q and
 * one packed FMA by (1/16, -64) leaves q. 8-bit bytes take the same path (1024 + q, q < 256).
 * x enters as f16(x'), x' = x 2^e, where the power of two e puts the largest |x'| of a row of
 * x over one CTA's k-range in [2^14, 2^15): nothing overflows whatever the row's range, each
 * value keeps a relative 2^-11 with an absolute floor of 2^-25 (F16's subnormals) against a
 * largest value of 2^14, finer than the BF16 (2^-9) of the GEMM path. (A second term, f16(x' -
 * hi), carried 22 bits up to 16 rows; it doubled the mmas and the fragments, and dropping it
 * took gate+up at 8 rows from 42.6 to 37-38 us and lm_head, whose fragments then fit one
 * k-range, from 186 to 123.) Products of q and x' are exact and the tensor core sums them in
 * F32. The affine form is folded per group:
 * y = sum_g s_g dot(q_g, x'_g) + b_g sum(x'_g), with sum(x'_g) computed once from the
 * unrounded x', and each partial sum is scaled back by 2^-e before the k-ranges meet. This
 * needs every mma's k-range inside one group.
 *
 * Layout. An m16n8k16 mma takes W as A (16 output rows) and x as B (8 columns, the rows of x).
 * Within an mma the k order is free as long as A and B agree: the quad of lane g (lanes 4g to
 * 4g + 3, t = lane % 4) takes one 32-byte sector of rows g and g + 8 of the tile, lane t the
 * 8 bytes at 8t of each (16 4-bit or 8 8-bit values, two words), and each word feeds two mmas
 * (4-bit) or one (8-bit). A sector is 64 4-bit values: one group of 64, half of one of 128, two
 * of 32. With groups of 32 the quad's lanes 0-1 hold one group and lanes 2-3 the next, so the
 * columns of an n-tile are split in two classes: column 2j takes row j of x against the first
 * group only (zeros in lanes 2-3 of B), column 2j + 1 against the second; an n-tile then serves
 * 4 rows of x instead of 8.
 *
 * Packed copy (cuda_pack_linear, once at load). The kernel streams a copy of W in the order its
 * lanes consume it: for m-tile T (16 rows, the last padded with zero rows) and sector s, 512
 * contiguous bytes, lane l's 16 at 16 l (its 8 bytes of row g, then of row g + 8), tile after
 * tile, each tile's sectors in k order; then the scales and biases, for tile T and group i the
 * 16 rows' (scale, bias) pairs side by side. A warp's load of a sector is one 16-byte load a
 * lane over 512 contiguous bytes, and a tile's k-range one contiguous run; a lane's scale and
 * bias of a row are one load. In the MLX layout the same sector was two 8-byte loads a lane 16
 * rows apart and each scale and bias a 2-byte load of its own.
 *
 * Work split. A CTA owns a k-range of the rows and an m-block of tiles. It first converts its
 * k-range of x into B fragments in shared memory (the order of the values in a register
 * follows the pairs of the weight word: values j and j + 4 of a 4-bit word, j and j + 2 of an
 * 8-bit one), with the sums of each column and one e per row of x. Each warp then streams its
 * tiles of the m-block (every GMMA_WARPS-th) over the k-range as one sequence of sectors, with
 * gmma_depth sectors' loads in flight across the tile boundaries, and no barrier; before the
 * fragments, while the kernel before it may still run (programmatic dependent launch), it has
 * already asked for its first sectors, which no kernel writes. The CTAs of one m-block (one per
 * k-range, as many as it takes to fill the device) write partial sums to scratch; the last of
 * them to finish (a counter per m-block) adds them in k order, deterministically, and writes
 * y with the bias, the GLU of gate/up (act(gate) * up, act from fz), and the output dtype.
 *
 * Fused forms (cuda_gemv_fuse). An RMSNorm before the product needs each row's whole sum of
 * squares, while a CTA sees one k-range: so the CTA multiplies x by the norm's weight as it
 * makes the fragments and leaves the sum of squares of its k-range beside its partials; the
 * last CTA adds those in k order and scales each row's sums by its 1/rms (a factor per row of
 * x commutes with the product). The residual add reads y in that last CTA's store.
 *
 * Measured (H200, bench/bench_cuda_gemv.cu, 4-bit group 64, BF16 scales, copy 4206 GB/s; us
 * for 1 / 8 / 16 / 32 rows, the MLX-layout kernel before the packed copy in brackets, from
 * 4243 GB/s): q+k+v 12.9 / 18.5 / 28.7 / 52.2 (17.6 / 27.1 / 37.7 / -), o 9.0 / 12.5 / 18.9 /
 * 33.4, gate+up 33.5 / 37.0 / 50.2 / 92.1 (62.7 / 70.0 / 86.5 / -), down 24.5 / 30.3 / 45.1 /
 * 79.5 (31.3 / 39.4 / 61.5 / -), lm_head 117.9 / 122.7 / 209.7 / 507.5 (232.8 / 285.0 / 431.8 /
 * -); a decode layer's four launches at 8 rows 106 us, 27% of copy. Decode of the 8B model after
 * 512 tokens (tok/s): 8 sequences 1779 (1188 before), 16 2560 (1844), 32 2924 (2710). At one
 * row this kernel stays slower than the one-row kernel (gate+up 33.5 against 21.0 us), so
 * cuda_gemv1 keeps 1 and 2 rows. Where it stands: ncu of gate+up at 8 rows shows DRAM at 33%,
 * L2 42%, the SMs 41%, 7.8 cycles per issued instruction at 16 warps an SM; about 70
 * instructions a warp per 512-byte sector, half of them the dequantization. Tried on the way:
 * the store of y inside the streaming loop of the same kernel for every k-split cost q+k+v,
 * o and down 25-50% (so the one-k-range form is a kernel of its own); a last-CTA reduction
 * that took 8 outputs at a time, with a division per output, was no faster; the CTAs of an
 * m-block as one thread-block cluster, meeting at its barrier and each reducing a share (no
 * counter, no last CTA), took q+k+v at 8 rows to 13.7 us but o to 15.4 and down to 43.4 (the
 * clusters of 8 to 16 CTAs fill the GPCs worse), 8-sequence decode 1648 tok/s. Past 32 rows: 64
 * rows in two passes of 32 read 2534 tok/s against 3000 on the GEMM path, 128 in four 2577
 * against 5459, so a pass stops at 4 n-tiles and 64 rows take cuBLAS. */
#include "backend/cuda/cuda_mma.h"
#include "backend/cuda/cuda_packed.h"

/* Warps per CTA. */
#define GMMA_WARPS 8
/* Most rows of x one launch serves: 4 n-tiles of 8 (cuda_gemv1 slices more). */
#define GMMA_MAX_NX 32
/* Most m-blocks a launch may have. Their counters sit first in the scratch at a fixed size, so
 * a launch never finds another launch's partial sums where it expects a counter at zero. */
#define GMMA_MAX_MBLOCKS 4096
/* Shared memory a CTA may give its x fragments: the most two CTAs on an SM can share (fewer
 * k-ranges: fewer partial sums to write and add, none where one k-range fits). */
#define GMMA_SMEM_CAP (110 << 10)
/* Sectors whose loads a warp keeps in flight: 512 bytes each, so 16 warps an SM hold 24 to 64
 * KB of weights in flight, what the H200's bandwidth times its latency asks; fewer where the
 * fragments of more n-tiles, or two groups' scales a sector, take the registers (the most that
 * compile without spills under the 128 registers of two CTAs an SM). */
template <int C, int NT> __host__ __device__ constexpr int gmma_depth() {
    return NT == 1 ? 8 / C + 2 * (C - 1) : (NT == 2 ? 6 - 2 * (C - 1) : 2);
}

struct gmma_job {
    cuda_gemv_mat m[3];
    const uint8_t *pk[3]; /* the matrices' packed copies */
    int64_t mt[3];        /* m-tiles of each matrix (0 past the n used) */
    base_dtype sdt;       /* scales and biases */
    int64_t in;           /* values per row of W and x */
    int64_t groups;       /* groups per row */
    int gshift;           /* log2(values per group) */
    int64_t sectors;      /* 32-byte sectors per row */
    int64_t rows;         /* PLAIN: the outs summed; GLU: out */
    int64_t tiles;        /* m-tiles: PLAIN the matrices' tiles in turn; GLU 2 ceil(out / 16),
                           * gate and up alternating */
    int64_t tpb;          /* m-tiles per m-block (even) */
    int nx;               /* rows of x */
    int ksplit;           /* k-ranges (CTAs per m-block) */
    int spc;              /* sectors per k-range */
    const float *x;       /* (nx, in) */
    float *part;          /* (ksplit, nx, tiles * 16) partial sums, by tile and row in it */
    float *ssq;           /* (m-blocks, ksplit, GMMA_MAX_NX) with a norm: x's sums of squares
                           * per k-range */
    unsigned *count;      /* (m-blocks) CTAs done, reset to 0 by the last */
    cuda_gemv_fuse fz;
};

/* The scratch: the m-block counters, then the partial sums. */
static size_t gmma_part_offset(void) {
    return (GMMA_MAX_MBLOCKS * sizeof(unsigned) + 255) & ~(size_t)255;
}

/* Partials of the rows of x against the CTA's k-range for its m-block's tiles; the last CTA of
 * the m-block reduces them into y. C: groups per sector (2 for 4-bit groups of 32), NT: n-tiles
 * of 8 / C rows of x; ONE (not with GLU, whose gate and up tiles other warps hold): one k-range,
 * whose sums are y's. A kernel of its own: the stores in the loop cost the other form its
 * speed. */
template <int BITS, int C, int NT, bool GLU, bool ONE, typename S>
__global__ void __launch_bounds__(GMMA_WARPS * 32, 2) gmma_kernel(const gmma_job job) {
    constexpr int VPS = gmma_vps<BITS>(), VPL = gmma_vpl<BITS>(), XU = VPL / 2;
    constexpr int PARTS = gmma_parts<BITS>(), XR = 8 / C, Q = 4 / C, D = gmma_depth<C, NT>();
    constexpr int WV = 32 / BITS; /* values per word */
    using SB = gmma_sb_t<S>;
    extern __shared__ uint4 gmma_smem[];
    __shared__ int cmax[GMMA_MAX_NX];
    __shared__ float rinv[GMMA_MAX_NX]; /* one k-range: each row's 1/rms (1 without a norm) */
    __shared__ bool last;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int ks = blockIdx.x;
    const int64_t mb = blockIdx.y;
    const int64_t s_first = (int64_t)ks * job.spc;
    const int ns = (int)(job.sectors - s_first < job.spc ? job.sectors - s_first : job.spc);
    const int64_t k0 = s_first * VPS;
    const int64_t t_begin = mb * job.tpb;
    const int64_t t_end = t_begin + job.tpb < job.tiles ? t_begin + job.tpb : job.tiles;
    /* The warp's tiles: t_begin + warp, then every GMMA_WARPS-th, each over ns sectors. */
    const int64_t n_units =
        t_begin + warp < t_end ? (t_end - t_begin - warp + GMMA_WARPS - 1) / GMMA_WARPS : 0;
    const int64_t total = n_units * ns;

    /* One sector of one tile as a lane loads it: its 16 bytes of codes and, for each of its C
     * groups, the (scale, bias) of rows g and g + 8. */
    struct stage {
        uint4 w;
        SB sb[2][C];
    };
    /* The load cursor: sector ls of the warp's unit lu, whose codes and scales start at lw and
     * lsb. */
    int64_t lu = 0;
    int ls = 0;
    const uint8_t *lw = NULL;
    const SB *lsb = NULL;
    auto seek = [&](int64_t u) {
        int64_t lt = 0;
        const int mi = gmma_tile<GLU>(job, t_begin + warp + u * GMMA_WARPS, &lt);
        const uint8_t *pk = job.pk[0];
        int64_t mt = job.mt[0];
        if (mi == 1) pk = job.pk[1], mt = job.mt[1];
        if (mi == 2) pk = job.pk[2], mt = job.mt[2];
        lw = pk + gmma_code_bytes(lt, job.sectors) + s_first * GMMA_SECTOR_BYTES + lane * 16;
        lsb = (const SB *)(pk + gmma_code_bytes(mt, job.sectors)) + lt * job.groups * 16 + g;
    };
    auto load = [&](stage &st) {
        st.w = gmma_ld_nc(lw + ls * GMMA_SECTOR_BYTES);
#pragma unroll
        for (int c = 0; c < C; c++) {
            const int64_t gi = ((s_first + ls) * VPS + c * (VPS / C)) >> job.gshift;
            st.sb[0][c] = __ldg(lsb + gi * 16);
            st.sb[1][c] = __ldg(lsb + gi * 16 + 8);
        }
        if (++ls == ns) {
            ls = 0;
            if (++lu < n_units) seek(lu);
        }
    };
    /* The first sectors go out before the wait for the kernel before: no kernel writes W. */
    stage st[D];
    if (total > 0) seek(0);
#pragma unroll
    for (int d = 0; d < D; d++)
        if (d < total) load(st[d]);
    cuda_pdl_wait();

    /* Fragments (spc, NT, PARTS, 32 lanes), then the sums of each B column (spc, NT, 8). */
    uint4 *frag = gmma_smem;
    float *csum = (float *)(frag + (size_t)job.spc * NT * PARTS * 32);

    /* A norm scales each row of x by its weight here and by the row's 1/rms in the final sum:
     * a CTA sees only its k-range, so it leaves the sum of squares over it for the last CTA.
     * Then, with x' the values multiplied, the largest |x'| of each row over the k-range (as
     * bits: they order as the floats). One warp a row: both reductions in a fixed order. x
     * comes from the kernel before, so it is read coherently. */
    const int kq = ns * VPS / 4;
    for (int xr = warp; xr < job.nx; xr += GMMA_WARPS) {
        const float4 *src = (const float4 *)(job.x + xr * job.in + k0);
        float m = 0.0f, ss = 0.0f;
        for (int u = lane; u < kq; u += 32) {
            float4 f = src[u];
            if (job.fz.norm) {
                ss += f.x * f.x + f.y * f.y + f.z * f.z + f.w * f.w;
                float w4[4];
                cuda_load_ro<4>(job.fz.norm, job.fz.norm_dt, (size_t)(k0 + 4 * u), w4);
                f.x *= w4[0], f.y *= w4[1], f.z *= w4[2], f.w *= w4[3];
            }
            m = fmaxf(m, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
        }
        for (int o = 16; o > 0; o >>= 1) {
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
            ss += __shfl_xor_sync(0xffffffffu, ss, o);
        }
        if (lane == 0) {
            cmax[xr] = __float_as_int(m);
            if (job.fz.norm) job.ssq[(mb * job.ksplit + ks) * GMMA_MAX_NX + xr] = ss;
            rinv[xr] = job.fz.norm ? cuda_rms_inv(ss, job.in, job.fz.eps) : 1.0f;
        }
    }
    __syncthreads();
    /* Each lane's B fragments of every sector, as the warp's lane ln will read them, and the
     * column sums: the quad of a column is 4 consecutive lanes of one warp here too. */
    for (int u = tid; u < ns * NT * 32; u += blockDim.x) {
        const int ln = u & 31, nt = (u >> 5) % NT, sl = (u >> 5) / NT;
        const int lg = ln >> 2, lt = ln & 3, xr = nt * XR + lg / C;
        const bool on = xr < job.nx && lg % C == lt * C / 4;
        const float sc = on ? gmma_pow2(gmma_exp(cmax[xr])) : 0.0f;
        const float4 *src =
            (const float4 *)(job.x + (on ? xr : 0) * job.in + k0 + sl * VPS + lt * VPL);
        float xv[VPL], sum = 0.0f;
#pragma unroll
        for (int v = 0; v < VPL / 4; v++) {
            const float4 f = on ? src[v] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            float w4[4] = {1.0f, 1.0f, 1.0f, 1.0f};
            if (on && job.fz.norm)
                cuda_load_ro<4>(job.fz.norm, job.fz.norm_dt,
                                (size_t)(k0 + sl * VPS + lt * VPL + 4 * v), w4);
            xv[4 * v] = f.x * w4[0] * sc, xv[4 * v + 1] = f.y * w4[1] * sc,
                   xv[4 * v + 2] = f.z * w4[2] * sc, xv[4 * v + 3] = f.w * w4[3] * sc;
        }
        uint32_t hw[XU];
        /* Word wd's values j and j + WV / 2 make one register, low first. */
#pragma unroll
        for (int wd = 0; wd < 2; wd++)
#pragma unroll
            for (int p = 0; p < WV / 2; p++) {
                const float a = xv[wd * WV + p], b = xv[wd * WV + p + WV / 2];
                sum += a + b;
                const __half2 h = __floats2half2_rn(a, b);
                hw[wd * WV / 2 + p] = *(const uint32_t *)&h;
            }
        uint4 *dst = frag + (size_t)(sl * NT + nt) * PARTS * 32 + ln;
#pragma unroll
        for (int p = 0; p < PARTS; p++)
            dst[p * 32] = make_uint4(hw[4 * p], hw[4 * p + 1], hw[4 * p + 2], hw[4 * p + 3]);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (lt == 0) csum[(sl * NT + nt) * 8 + lg] = sum;
    }
    __syncthreads();

    /* 2^-e of the lane's accumulator columns 2t and 2t + 1. */
    float unscale[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int c = 0; c < 2; c++) {
            const int xr = C == 1 ? nt * 8 + 2 * t + c : nt * 4 + t;
            unscale[nt][c] = xr < job.nx ? gmma_pow2(-gmma_exp(cmax[xr])) : 0.0f;
        }

    const int64_t vrows = job.tiles * 16;
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
    /* The compute cursor: sector cs of unit cu. */
    int64_t cu = 0;
    int cs = 0;
    auto compute = [&](const stage &sg) {
        uint32_t xh[NT][XU];
        float xs[NT][2];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint4 *src = frag + (size_t)(cs * NT + nt) * PARTS * 32 + lane;
#pragma unroll
            for (int p = 0; p < PARTS; p++) {
                const uint4 h = src[p * 32];
                xh[nt][4 * p] = h.x, xh[nt][4 * p + 1] = h.y, xh[nt][4 * p + 2] = h.z,
                           xh[nt][4 * p + 3] = h.w;
            }
            const float2 cv = *(const float2 *)&csum[(cs * NT + nt) * 8 + 2 * t];
            xs[nt][0] = cv.x, xs[nt][1] = cv.y;
        }
        /* The sector's products, scaled into acc per group below. */
        float ch[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) ch[nt][i] = 0.0f;
#pragma unroll
        for (int wd = 0; wd < 2; wd++) {
            constexpr int PAIRS = BITS == 4 ? 4 : 2;
            uint32_t h0[PAIRS], h1[PAIRS];
            gmma_dq_rows<BITS>(sg.w, wd, h0, h1);
#pragma unroll
            for (int j = 0; j < PAIRS / 2; j++) {
                const uint32_t a[4] = {h0[2 * j], h1[2 * j], h0[2 * j + 1], h1[2 * j + 1]};
                const int u = wd * PAIRS + 2 * j;
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    cuda_mma16816<__half>(ch[nt], a, xh[nt][u], xh[nt][u + 1]);
            }
        }
        float2 sb[2][C];
#pragma unroll
        for (int rh = 0; rh < 2; rh++)
#pragma unroll
            for (int c = 0; c < C; c++) sb[rh][c] = gmma_sb<S>(sg.sb[rh][c]);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int rh = i >> 1, c = C == 2 ? (i & 1) : 0;
                acc[nt][i] =
                    fmaf(sb[rh][c].x, ch[nt][i], fmaf(sb[rh][c].y, xs[nt][i & 1], acc[nt][i]));
            }
        if (++cs < ns) return;
        /* The unit's k-range is done: its sums out, the accumulators cleared. */
        const int64_t tile = t_begin + warp + cu * GMMA_WARPS;
        int64_t lt = 0;
        const int mi = gmma_tile<GLU>(job, tile, &lt);
        const int64_t out_m = cuda_gemv_pick(job, mi, &cuda_gemv_mat::out);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int q = 0; q < Q; q++) {
                const float v =
                    C == 1 ? acc[nt][q] * unscale[nt][q & 1]
                           : acc[nt][2 * q] * unscale[nt][0] + acc[nt][2 * q + 1] * unscale[nt][1];
                const int rh = C == 1 ? q >> 1 : q;
                const int xr = C == 1 ? nt * 8 + 2 * t + (q & 1) : nt * 4 + t;
                if (xr >= job.nx) continue;
                if (ONE) {
                    const int64_t row = lt * 16 + g + 8 * rh;
                    if (row < out_m)
                        cuda_gemv_store(job, mi, xr, row, v * rinv[xr],
                                        cuda_gemv_prev(job, mi, xr, row));
                } else {
                    job.part[((int64_t)ks * job.nx + xr) * vrows + tile * 16 + g + 8 * rh] = v;
                }
            }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[nt][i] = 0.0f;
        cs = 0;
        cu++;
    };
    /* D sectors in flight: each stage's next load goes out as soon as it is consumed. */
    for (int64_t i0 = 0; i0 < total; i0 += D) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            if (i0 + d >= total) break;
            compute(st[d]);
            if (i0 + d + D < total) load(st[d]);
        }
    }
    cuda_pdl_trigger();
    if (ONE) return;

    /* The last CTA of the m-block to finish adds the k-ranges' partials in order. */
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(&job.count[mb], 1u) == (unsigned)job.ksplit - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* GLU: the m-block's pairs of gate and up tiles, by output row; PLAIN: its tiles' rows. */
    const int64_t span = GLU ? (t_end - t_begin) / 2 * 16 : (t_end - t_begin) * 16;
    for (int64_t u = tid; u < span * job.nx; u += blockDim.x) {
        const int xr = (int)(u / span);
        const int64_t o = u % span;
        int64_t v0, row;
        int mi = 0;
        if (GLU) {
            row = t_begin / 2 * 16 + o;
            v0 = (row / 16) * 32 + row % 16;
            if (row >= job.rows) continue;
        } else {
            v0 = t_begin * 16 + o;
            int64_t lt = 0;
            mi = gmma_tile<false>(job, v0 / 16, &lt);
            row = lt * 16 + v0 % 16;
            if (row >= cuda_gemv_pick(job, mi, &cuda_gemv_mat::out)) continue;
        }
        const float prev = GLU ? 0.0f : cuda_gemv_prev(job, mi, xr, row);
        /* The partials and, with a norm, the row's sums of squares, both in k order. */
        float v = 0.0f, v2 = 0.0f, ss = 0.0f;
        for (int k = 0; k < job.ksplit; k++) {
            const float *p = job.part + ((int64_t)k * job.nx + xr) * vrows + v0;
            v += __ldcg(p);
            if (GLU) v2 += __ldcg(p + 16);
            if (job.fz.norm) ss += __ldcg(&job.ssq[(mb * job.ksplit + k) * GMMA_MAX_NX + xr]);
        }
        if (job.fz.norm) {
            const float inv = cuda_rms_inv(ss, job.in, job.fz.eps);
            v *= inv, v2 *= inv;
        }
        if (GLU) {
            if (job.m[0].bias) v += cuda_load(job.m[0].bias, job.m[0].bias_dt, (size_t)row);
            if (job.m[1].bias) v2 += cuda_load(job.m[1].bias, job.m[1].bias_dt, (size_t)row);
            cuda_store(job.m[0].y, job.m[0].y_dt, (size_t)(xr * job.rows + row),
                       cuda_act(job.fz.act, v) * v2);
        } else {
            cuda_gemv_store(job, mi, xr, row, v, prev);
        }
    }
    if (tid == 0) job.count[mb] = 0;
}

bool cuda_gemv_mma_fits(const be_tensor *x, const be_linear *w) {
    return x->rows >= 1 && x->rows <= GMMA_MAX_NX && x->dtype == BASE_DTYPE_F32 &&
           w->packed != NULL && ((uintptr_t)x->data & 15) == 0 &&
           (!w->bias || cuda_float_dtype(w->bias_dtype));
}

/* Lane-ordered sectors (the layout in the file's comment): thread i writes the 16 bytes of
 * lane i % 32 of sector i / 32 (tile-major), rows past `out` as zeros. */
__global__ void gmma_pack_codes(const uint8_t *w, int64_t out, int64_t row_bytes, int64_t sectors,
                                int64_t n, uint4 *dst) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int lane = (int)(i & 31), g = lane >> 2, t = lane & 3;
        const int64_t ts = i >> 5, tile = ts / sectors, s = ts % sectors;
        uint2 h[2];
        for (int rh = 0; rh < 2; rh++) {
            const int64_t row = tile * 16 + g + 8 * rh;
            h[rh] = row < out ? *(const uint2 *)(w + row * row_bytes + s * 32 + t * 8)
                              : make_uint2(0, 0);
        }
        dst[i] = make_uint4(h[0].x, h[0].y, h[1].x, h[1].y);
    }
}

/* Per tile and group the 16 rows' (scale, bias) pairs, rows past `out` as zeros; T is the
 * dtype's bits as an unsigned type. */
template <typename T>
__global__ void gmma_pack_scales(const T *s, const T *b, int64_t out, int64_t groups, int64_t n,
                                 T *dst) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t tg = i >> 4, row = (tg / groups) * 16 + (i & 15), gi = tg % groups;
        dst[2 * i] = row < out ? s[row * groups + gi] : (T)0;
        dst[2 * i + 1] = row < out ? b[row * groups + gi] : (T)0;
    }
}

int cuda_pack_linear(be_backend *be, be_linear *w, base_err *err) {
    w->packed = NULL;
    if (w->quant != BE_QUANT_AFFINE || (w->bits != 4 && w->bits != 8) ||
        (w->group_size != 32 && w->group_size != 64 && w->group_size != 128) ||
        w->in % w->group_size || (w->in * w->bits) % 256 || !cuda_float_dtype(w->dtype) ||
        !w->biases || ((uintptr_t)w->weight & 7) || w->out == 0)
        return 0;
    const gmma_geom gm = gmma_geometry(w);
    const size_t ssz = base_dtype_size(w->dtype);
    const int64_t codes = gmma_code_bytes(gm.tiles, gm.sectors);
    const size_t bytes = (size_t)codes + (size_t)(gm.tiles * gm.groups * 32) * ssz;
    void *p = NULL;
    /* The copy only speeds the batched matmuls up: without the memory, w stays as it is. */
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    cudaStream_t st = cuda_impl(be)->stream;
    const int64_t nc = codes / 16, ns = gm.tiles * gm.groups * 16;
    gmma_pack_codes<<<cuda_elem_grid(nc), 256, 0, st>>>(
        (const uint8_t *)w->weight, w->out, w->in * w->bits / 8, gm.sectors, nc, (uint4 *)p);
    uint8_t *sp = (uint8_t *)p + codes;
    if (ssz == 4)
        gmma_pack_scales<uint32_t><<<cuda_elem_grid(ns), 256, 0, st>>>(
            (const uint32_t *)w->scales, (const uint32_t *)w->biases, w->out, gm.groups, ns,
            (uint32_t *)sp);
    else
        gmma_pack_scales<uint16_t><<<cuda_elem_grid(ns), 256, 0, st>>>(
            (const uint16_t *)w->scales, (const uint16_t *)w->biases, w->out, gm.groups, ns,
            (uint16_t *)sp);
    if (cuda_check_launch("packing a quantized weight", err)) {
        cudaFree(p);
        return -1;
    }
    /* The GEMV reads the packed copy before its programmatic-dependent wait (no kernel writes
     * weights once loaded), so the copy must be complete and visible before any kernel that
     * may follow: in tests that multiply right after packing, a GEMV overlapping these kernels
     * read stale sectors. */
    cudaError_t e = cudaStreamSynchronize(st);
    if (e != cudaSuccess) {
        cudaFree(p);
        return base_fail(err, "cuda: packing a quantized weight: %s", cudaGetErrorString(e));
    }
    w->packed = p;
    return 0;
}

template <int BITS, int C, int NT, bool GLU, typename S>
static int gmma_launch(be_backend *be, gmma_job job, base_err *err) {
    cuda_backend *c = cuda_impl(be);
    auto kernel = gmma_kernel<BITS, C, NT, GLU, false, S>;
    constexpr int SMEM = GMMA_SMEM_CAP;
    constexpr size_t per_sector = (size_t)NT * (gmma_parts<BITS>() * 32 * 16 + 8 * sizeof(float));
    /* The k-ranges: few enough that each CTA's fragments fit its shared memory, many enough
     * that the warps' tiles of one k-range fill the device's resident warps. */
    static int per_sm;
    if (per_sm == 0) {
        cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, GMMA_WARPS * 32,
                                                              SMEM);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: tensor-core GEMV occupancy: %s",
                             cudaGetErrorString(e));
        if (per_sm < 1) per_sm = 1;
    }
    const int64_t resident = (int64_t)per_sm * c->sm_count;
    const int64_t spc_most = SMEM / per_sector;
    int64_t ksplit = (job.sectors + spc_most - 1) / spc_most;
    const int64_t fill = (resident * GMMA_WARPS + job.tiles - 1) / job.tiles;
    if (ksplit < fill) ksplit = fill;
    if (ksplit > job.sectors) ksplit = job.sectors;
    job.spc = (int)((job.sectors + ksplit - 1) / ksplit);
    job.ksplit = (int)((job.sectors + job.spc - 1) / job.spc);
    /* One wave: m-blocks enough that their k-ranges fill the device once, each with tiles
     * for all its warps. */
    int64_t mblocks = (resident + job.ksplit - 1) / job.ksplit;
    const int64_t most = (job.tiles + GMMA_WARPS - 1) / GMMA_WARPS;
    if (mblocks > most) mblocks = most;
    if (mblocks < 1) mblocks = 1;
    if (mblocks > GMMA_MAX_MBLOCKS) mblocks = GMMA_MAX_MBLOCKS;
    int64_t tpb = (job.tiles + mblocks - 1) / mblocks;
    tpb = (tpb + 1) / 2 * 2;
    mblocks = (job.tiles + tpb - 1) / tpb;
    job.tpb = tpb;

    const size_t parts = (size_t)job.ksplit * job.nx * (size_t)job.tiles * 16;
    const size_t bytes =
        gmma_part_offset() + (parts + (size_t)mblocks * job.ksplit * GMMA_MAX_NX) * sizeof(float);
    const size_t cap = c->gmma_bytes;
    if (cuda_scratch(be, &c->gmma_buf, &c->gmma_bytes, bytes, "tensor-core GEMV", err)) return -1;
    /* The counters start at zero once and every launch leaves them there. */
    if (c->gmma_bytes != cap) {
        cudaError_t e = cudaMemsetAsync(c->gmma_buf, 0, c->gmma_bytes, c->stream);
        if (e != cudaSuccess)
            return base_fail(err, "cuda: matmul: tensor-core GEMV scratch: %s",
                             cudaGetErrorString(e));
    }
    job.count = (unsigned *)c->gmma_buf;
    job.part = (float *)((char *)c->gmma_buf + gmma_part_offset());
    job.ssq = job.part + parts;
    const size_t smem = (size_t)job.spc * per_sector;
    const dim3 grid((unsigned)job.ksplit, (unsigned)mblocks), block(GMMA_WARPS * 32);
    if constexpr (!GLU) {
        if (job.ksplit == 1) {
            auto one = gmma_kernel<BITS, C, NT, false, true, S>;
            static bool ready;
            if (!ready) {
                cudaError_t e =
                    cudaFuncSetAttribute(one, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);
                if (e != cudaSuccess)
                    return base_fail(err, "cuda: matmul: tensor-core GEMV: %s",
                                     cudaGetErrorString(e));
                ready = true;
            }
            return cuda_launch_pdl(c, one, grid, block, smem, "matmul (tensor-core GEMV)", err,
                                   job);
        }
    }
    return cuda_launch_pdl(c, kernel, grid, block, smem, "matmul (tensor-core GEMV)", err, job);
}

template <int BITS, int C, bool GLU, typename S>
static int gmma_dispatch_nt(be_backend *be, const gmma_job &job, base_err *err) {
    const int nt = (job.nx + 8 / C - 1) / (8 / C);
    if (nt == 1) return gmma_launch<BITS, C, 1, GLU, S>(be, job, err);
    if (nt == 2) return gmma_launch<BITS, C, 2, GLU, S>(be, job, err);
    return gmma_launch<BITS, C, 4, GLU, S>(be, job, err);
}

template <bool GLU, typename S>
static int gmma_dispatch_s(be_backend *be, const gmma_job &job, int bits, int gsize,
                           base_err *err) {
    if (bits == 8) return gmma_dispatch_nt<8, 1, GLU, S>(be, job, err);
    if (gsize == 32) return gmma_dispatch_nt<4, 2, GLU, S>(be, job, err);
    return gmma_dispatch_nt<4, 1, GLU, S>(be, job, err);
}

template <bool GLU>
static int gmma_dispatch(be_backend *be, const gmma_job &job, int bits, int gsize, base_err *err) {
    if (job.sdt == BASE_DTYPE_F32) return gmma_dispatch_s<GLU, float>(be, job, bits, gsize, err);
    if (job.sdt == BASE_DTYPE_F16) return gmma_dispatch_s<GLU, __half>(be, job, bits, gsize, err);
    return gmma_dispatch_s<GLU, __nv_bfloat16>(be, job, bits, gsize, err);
}

int cuda_gemv_mma(be_backend *be, const be_tensor *x, const be_linear *const *ws,
                  be_tensor *const *ys, int n, bool glu, const cuda_gemv_fuse *fz, base_err *err) {
    const be_linear *w = ws[0];
    /* 4-bit groups of 32 put 4 rows of x in an n-tile: 4 n-tiles serve 16 rows a pass. */
    const int64_t most = w->bits == 4 && w->group_size == 32 ? GMMA_MAX_NX / 2 : GMMA_MAX_NX;
    if (x->rows > most)
        return cuda_gemv_in_slices(be, x, ws, ys, n, glu, fz, most, cuda_gemv_mma, err);
    gmma_job job = {};
    if (gmma_job_init(&job, x, ws, ys, n, glu, fz) == 0) return 0;
    job.sdt = w->dtype;
    job.x = (const float *)x->data;
    return glu ? gmma_dispatch<true>(be, job, w->bits, w->group_size, err)
               : gmma_dispatch<false>(be, job, w->bits, w->group_size, err);
}
