/* Pool offsets past 2^32 elements: a pool of 131,073 blocks of [32, 8, 128] f16 per side
 * (4,295,000,064 elements, 8.6 GB each). K/V are appended only into the last block, whose
 * first element sits at exactly 2^32, so a 32-bit offset would land in block 0. Decode v1
 * and v2 of NSEQ rows reading that block (24 CTAs: the tensor-core kernel, whose tensor maps
 * then span the whole pool) are checked against a host reference, and block 0 is checked
 * untouched. Runs only on a GPU with room for the pool; skipped otherwise. */
#include "test_cuda_util.h"

#include <math.h>

#define NBLOCKS 131073
#define BS      32
#define NKV     8
#define HD      128
#define GROUP   4
#define NTOK    29
#define NSEQ    3

int main(void) {
    be_backend *be = tc_backend();
    if (!be) return TEST_SKIP;
    const int width = NKV * HD, H = NKV * GROUP;
    const size_t block_elems = (size_t)BS * width;
    const size_t side_bytes = (size_t)NBLOCKS * block_elems * 2;
    uint64_t fr = 0, tot = 0;
    if (be->ops->memory_info(be, &fr, &tot) || fr < 2 * side_bytes + (1ull << 30)) {
        printf("skipped: the device has %llu bytes free, the pool needs %zu\n",
               (unsigned long long)fr, 2 * side_bytes);
        be->ops->destroy(be);
        return 0;
    }
    CHECK((uint64_t)NBLOCKS * block_elems > (1ull << 32));
    base_err err = {{0}};
    be_kv_layer layer = {NULL, NULL, BASE_DTYPE_F16, NBLOCKS, BS, NKV, HD};
    CHECK_MSG(be->ops->alloc(be, side_bytes, &layer.k, &err) == 0, "%s", err.msg);
    CHECK_MSG(be->ops->alloc(be, side_bytes, &layer.v, &err) == 0, "%s", err.msg);

    /* Block 0 of both sides holds a known pattern. */
    uint16_t *pattern = malloc(block_elems * 2);
    for (size_t i = 0; i < block_elems; i++) pattern[i] = (uint16_t)(0x3000 + (i % 997));
    CHECK(be->ops->upload(be, layer.k, pattern, block_elems * 2, &err) == 0);
    CHECK(be->ops->upload(be, layer.v, pattern, block_elems * 2, &err) == 0);

    /* One sequence of NTOK tokens, all in the last block, appended through kv_append. */
    const int32_t last = NBLOCKS - 1;
    int64_t slots[NTOK];
    for (int t = 0; t < NTOK; t++) slots[t] = (int64_t)last * BS + t;
    float *k = malloc(sizeof(float) * NTOK * width), *v = malloc(sizeof(float) * NTOK * width);
    tc_fill(k, (size_t)NTOK * width, 1.0f);
    tc_fill(v, (size_t)NTOK * width, 1.0f);
    tc_round(k, (size_t)NTOK * width, BASE_DTYPE_F16);
    tc_round(v, (size_t)NTOK * width, BASE_DTYPE_F16);
    be_tensor tk = tc_tensor(be, k, BASE_DTYPE_F32, NTOK, width);
    be_tensor tv = tc_tensor(be, v, BASE_DTYPE_F32, NTOK, width);
    /* NSEQ decode rows share the block, as sequences with a common prefix would */
    int32_t q_indptr[NSEQ + 1], kv_len[NSEQ], page_indptr[NSEQ + 1], pages[NSEQ], last_len[NSEQ];
    for (int r = 0; r <= NSEQ; r++) q_indptr[r] = page_indptr[r] = r;
    for (int r = 0; r < NSEQ; r++) kv_len[r] = last_len[r] = NTOK, pages[r] = last;
    be_paged_batch append = {.n_tokens = NTOK, .slots = tc_dev_bytes(be, slots, sizeof slots)};
    CHECK_MSG(be->ops->kv_append(be, &layer, &tk, &tv, &append, &err) == 0, "%s", err.msg);

    be_paged_batch db = {
        .n_seqs = NSEQ,
        .n_tokens = NSEQ,
        .max_q_len = 1,
        .max_kv_len = NTOK,
        .q_indptr = tc_dev_bytes(be, q_indptr, sizeof q_indptr),
        .kv_len = tc_dev_bytes(be, kv_len, sizeof kv_len),
        .page_indptr = tc_dev_bytes(be, page_indptr, sizeof page_indptr),
        .page_indices = tc_dev_bytes(be, pages, sizeof pages),
        .last_page_len = tc_dev_bytes(be, last_len, sizeof last_len),
    };
    float q[NSEQ * 32 * 128];
    tc_fill(q, (size_t)NSEQ * H * HD, 2.0f);
    float scale = 1.0f / sqrtf((float)HD);
    double ref[NSEQ * 32 * 128];
    for (int h = 0; h < NSEQ * H; h++) {
        int kvh = h % H / GROUP;
        double sc[NTOK], mx = -INFINITY, sum = 0;
        for (int t = 0; t < NTOK; t++) {
            double d = 0;
            for (int e = 0; e < HD; e++) d += (double)q[h * HD + e] * k[t * width + kvh * HD + e];
            sc[t] = d * scale;
            mx = sc[t] > mx ? sc[t] : mx;
        }
        for (int t = 0; t < NTOK; t++) sum += (sc[t] = exp(sc[t] - mx));
        for (int e = 0; e < HD; e++) {
            double o = 0;
            for (int t = 0; t < NTOK; t++) o += sc[t] / sum * v[t * width + kvh * HD + e];
            ref[h * HD + e] = o;
        }
    }
    be_tensor tq = tc_tensor(be, q, BASE_DTYPE_F32, NSEQ, (int64_t)H * HD);
    be_decode_plan plans[2] = {{.kind = BE_DECODE_V1},
                               {.kind = BE_DECODE_V2, .pages_per_chunk = 1, .max_chunks = 1}};
    plans[1].workspace_bytes = (uint64_t)NSEQ * H * (HD + 1) * sizeof(float);
    CHECK(be->ops->alloc(be, plans[1].workspace_bytes, &plans[1].workspace, &err) == 0);
    for (int p = 0; p < 2; p++) {
        be_tensor to = tc_poisoned(be, BASE_DTYPE_F32, NSEQ, (int64_t)H * HD);
        CHECK_MSG(be->ops->attention(be, &tq, &layer, &db, &plans[p], H, be_attn_plain(scale), &to,
                                     &err) == 0,
                  "%s", err.msg);
        double e = tc_err(be, &to, ref);
        CHECK_MSG(e < 1e-5, "past-2^32 attention plan %d: err %g", p, e);
        be->ops->free(be, to.data);
    }
    uint16_t *back = malloc(block_elems * 2);
    CHECK(be->ops->sync(be, &err) == 0);
    CHECK(be->ops->download(be, back, layer.k, block_elems * 2, &err) == 0);
    CHECK_MSG(memcmp(back, pattern, block_elems * 2) == 0, "block 0 of K was written");
    CHECK(be->ops->download(be, back, layer.v, block_elems * 2, &err) == 0);
    CHECK_MSG(memcmp(back, pattern, block_elems * 2) == 0, "block 0 of V was written");

    be->ops->free(be, plans[1].workspace);
    be->ops->free(be, tq.data);
    be->ops->free(be, tk.data);
    be->ops->free(be, tv.data);
    be->ops->free(be, (void *)append.slots);
    be->ops->free(be, (void *)db.q_indptr);
    be->ops->free(be, (void *)db.kv_len);
    be->ops->free(be, (void *)db.page_indptr);
    be->ops->free(be, (void *)db.page_indices);
    be->ops->free(be, (void *)db.last_page_len);
    be->ops->free(be, layer.k);
    be->ops->free(be, layer.v);
    free(pattern), free(back), free(k), free(v);
    be->ops->destroy(be);
    TEST_MAIN_END();
}
