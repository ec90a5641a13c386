/* Collectives among the GPUs of one host over NCCL (loaded at run time, backend_nccl.c): one
 * communicator per rank, all made at once by this process (ncclCommInitAll), each rank's
 * collectives queued on its backend's stream by the thread that runs that rank, so a recorded
 * decode step holds them with its kernels. NVLink multicast (NVLS) is turned off before the
 * communicators exist: its buffers take GPU memory the KV pool is sized for, and the
 * all-reduces of a decode step are small enough that the ring and tree algorithms serve them. */
#include "backend/cuda/cuda_internal.h"

extern "C" {
#include "backend/nccl_abi.h"
}

#include <stdlib.h>
#include <string.h>

typedef struct nccl_rank {
    be_comm comm;
    be_nccl *nccl; /* not owned */
    ncclComm_t nc;
    int device;
    void
        *gather; /* (gather_bytes) all_gather_cols' parts, rank after rank, before the interleave */
    size_t gather_bytes;
} nccl_rank;

static int nccl_fail(const nccl_rank *r, base_err *err, const char *what, ncclResult_t rc) {
    return base_fail(err, "nccl: rank %d (cuda device %d): %s: %s", r->comm.rank, r->device, what,
                     r->nccl->get_error_string(rc));
}

static int nccl_dtype(base_dtype dt, ncclDataType_t *out) {
    switch (dt) {
    case BASE_DTYPE_F32:
        *out = ncclFloat32;
        return 0;
    case BASE_DTYPE_F16:
        *out = ncclFloat16;
        return 0;
    case BASE_DTYPE_BF16:
        *out = ncclBfloat16;
        return 0;
    default:
        return -1;
    }
}

static int nccl_all_reduce_sum(be_comm *c, be_backend *be, be_tensor *x, base_err *err) {
    nccl_rank *r = (nccl_rank *)c->impl;
    ncclDataType_t dt;
    if (nccl_dtype(x->dtype, &dt))
        return base_fail(err, "nccl: all_reduce_sum: dtype %s", base_dtype_name(x->dtype));
    size_t n = (size_t)x->rows * (size_t)x->cols;
    ncclResult_t rc =
        r->nccl->all_reduce(x->data, x->data, n, dt, ncclSum, r->nc, cuda_impl(be)->stream);
    return rc == ncclSuccess ? 0 : nccl_fail(r, err, "all-reduce", rc);
}

static int nccl_all_gather_cols(be_comm *c, be_backend *be, const be_tensor *part, be_tensor *full,
                                base_err *err) {
    nccl_rank *r = (nccl_rank *)c->impl;
    int nr = c->n_ranks;
    ncclDataType_t dt;
    if (nccl_dtype(part->dtype, &dt) || full->dtype != part->dtype || full->rows != part->rows ||
        full->cols != part->cols * nr)
        return base_fail(err,
                         "nccl: all_gather_cols: full [%lld, %lld] is not %d parts [%lld, %lld]",
                         (long long)full->rows, (long long)full->cols, nr, (long long)part->rows,
                         (long long)part->cols);
    size_t es = base_dtype_size(part->dtype), row = (size_t)part->cols * es;
    size_t n = (size_t)part->rows * (size_t)part->cols, bytes = n * es;
    cudaStream_t s = cuda_impl(be)->stream;
    if (cuda_scratch(be, &r->gather, &r->gather_bytes, bytes * (size_t)nr, "all_gather_cols", err))
        return -1;
    ncclResult_t rc = r->nccl->all_gather(part->data, r->gather, n, dt, r->nc, s);
    if (rc != ncclSuccess) return nccl_fail(r, err, "all-gather", rc);
    /* NCCL lays the parts end to end; each row of full takes one row of every part */
    for (int q = 0; q < nr; q++) {
        cudaError_t e = cudaMemcpy2DAsync((char *)full->data + (size_t)q * row, row * (size_t)nr,
                                          (const char *)r->gather + (size_t)q * bytes, row, row,
                                          (size_t)part->rows, cudaMemcpyDeviceToDevice, s);
        if (e != cudaSuccess)
            return base_fail(err, "nccl: all_gather_cols: interleaving: %s", cudaGetErrorString(e));
    }
    return 0;
}

/* A rank whose communicator saw an error aborts it rather than waiting on the others. */
static void nccl_destroy(be_comm *c) {
    nccl_rank *r = (nccl_rank *)c->impl;
    ncclResult_t async = ncclSuccess;
    cudaSetDevice(r->device);
    if (r->nccl->comm_get_async_error(r->nc, &async) != ncclSuccess || async != ncclSuccess)
        r->nccl->comm_abort(r->nc);
    else
        r->nccl->comm_destroy(r->nc);
    cudaFree(r->gather);
    free(r);
}

static const be_comm_ops g_nccl_ops = {
    nccl_all_reduce_sum,
    nccl_all_gather_cols,
    nccl_destroy,
};

extern "C" int be_cuda_device_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

extern "C" int be_comm_nccl_create(be_nccl *nccl, be_backend *const *bes, int n_ranks,
                                   be_comm **comms, base_err *err) {
    if (n_ranks < 1) return base_fail(err, "nccl: %d ranks", n_ranks);
    int *devs = (int *)calloc((size_t)n_ranks, sizeof *devs);
    ncclComm_t *ncs = (ncclComm_t *)calloc((size_t)n_ranks, sizeof *ncs);
    for (int i = 0; i < n_ranks; i++) {
        if (!bes[i] || strcmp(bes[i]->name, "cuda") != 0) {
            free(devs);
            free(ncs);
            return base_fail(err, "nccl: rank %d's backend is not CUDA", i);
        }
        devs[i] = cuda_impl(bes[i])->device;
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    ncclResult_t rc = nccl->comm_init_all(ncs, n_ranks, devs);
    if (rc != ncclSuccess) {
        free(devs);
        free(ncs);
        return base_fail(err, "nccl: making %d communicators: %s", n_ranks,
                         nccl->get_error_string(rc));
    }
    for (int i = 0; i < n_ranks; i++) {
        nccl_rank *r = (nccl_rank *)calloc(1, sizeof *r);
        r->nccl = nccl;
        r->nc = ncs[i];
        r->device = devs[i];
        r->comm.ops = &g_nccl_ops;
        r->comm.rank = i;
        r->comm.n_ranks = n_ranks;
        r->comm.impl = r;
        comms[i] = &r->comm;
    }
    free(devs);
    free(ncs);
    return 0;
}
