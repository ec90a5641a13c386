/* The CUDA backend object: device selection, memory, the op table. All work goes to one
 * stream owned by the backend, so ops are ordered without host synchronization; only
 * `download` and `sync` wait. */
#include "backend/cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>

/* Resident CTAs per SM of the tensor-core decode kernel (its launch bounds and shared memory
 * allow three): the plan's target counts CTAs, so the device is full at SMs times this, and a
 * larger target would leave a partial second wave. */
#define CUDA_CTAS_PER_SM 3
/* Paged attention shared-memory pipeline depth in pages, the best of bench/bench_attention's
 * sweep on the H200 (bench/RESULTS.md). */
#define CUDA_ATT_STAGES 2
/* cuBLAS's workspace, the size its documentation advises for Hopper. Given once, so that a
 * GEMM never allocates one itself: an allocation cannot be recorded in a graph. */
#define CUDA_BLAS_WORKSPACE (32u << 20)

int cuda_check_launch(const char *what, base_err *err) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return base_fail(err, "cuda: %s: %s", what, cudaGetErrorString(e));
    return 0;
}

static int cuda_fail(base_err *err, const char *what, cudaError_t e) {
    return base_fail(err, "cuda: %s: %s", what, cudaGetErrorString(e));
}

static void cuda_destroy(be_backend *be) {
    cuda_backend *c = cuda_impl(be);
    cudaStreamSynchronize(c->stream);
    cublasDestroy(c->blas);
    cudaFree(c->blas_ws);
    cudaFree(c->wtmp);
    cudaFree(c->xtmp);
    cudaFree(c->tk_buf);
    cudaFreeHost(c->tk_host);
    cudaFree(c->ftmp);
    cudaFree(c->gmma_buf);
    cudaFree(c->qg_buf);
    cudaFree(c->wide_buf);
    cudaFree(c->moe_buf);
    free(c->tmaps);
    cudaStreamDestroy(c->stream);
    free(c);
    free(be);
}

static int cuda_alloc(be_backend *, size_t bytes, void **ptr, base_err *err) {
    cudaError_t e = cudaMalloc(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        return base_fail(err, "cuda: allocating %zu bytes: %s", bytes, cudaGetErrorString(e));
    }
    return 0;
}

/* cudaFree waits for the device, so work still queued that reads ptr has finished. */
static void cuda_free(be_backend *, void *ptr) {
    if (ptr) cudaFree(ptr);
}

/* A pageable source is staged before cudaMemcpyAsync returns, so the caller may reuse it. */
static int cuda_upload(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_impl(be)->stream);
    return e == cudaSuccess ? 0 : cuda_fail(err, "upload", e);
}

static int cuda_download(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    cudaStream_t s = cuda_impl(be)->stream;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? 0 : cuda_fail(err, "download", e);
}

static int cuda_alloc_host(be_backend *, size_t bytes, void **ptr, base_err *err) {
    cudaError_t e = cudaMallocHost(ptr, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *ptr = NULL;
        return base_fail(err, "cuda: allocating %zu bytes of page-locked host memory: %s", bytes,
                         cudaGetErrorString(e));
    }
    return 0;
}

static void cuda_free_host(be_backend *, void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

static int cuda_download_async(be_backend *be, void *dst, const void *src, size_t bytes,
                               base_err *err) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cuda_impl(be)->stream);
    return e == cudaSuccess ? 0 : cuda_fail(err, "download_async", e);
}

static int cuda_copy(be_backend *be, void *dst, const void *src, size_t bytes, base_err *err) {
    cudaError_t e =
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_impl(be)->stream);
    return e == cudaSuccess ? 0 : cuda_fail(err, "copy", e);
}

/* The copy is synchronous: the host bytes may be unmapped as soon as this returns. The caller
 * frees *dev with `free`. */
static int cuda_map_weights(be_backend *be, const void *host, size_t bytes, const void **dev,
                            base_err *err) {
    void *d = NULL;
    if (cuda_alloc(be, bytes, &d, err)) return base_fail_wrap(err, "weights");
    cudaError_t e = cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        cudaFree(d);
        return cuda_fail(err, "uploading weights", e);
    }
    *dev = d;
    return 0;
}

static int cuda_sync(be_backend *be, base_err *err) {
    cudaError_t e = cudaStreamSynchronize(cuda_impl(be)->stream);
    return e == cudaSuccess ? 0 : cuda_fail(err, "sync", e);
}

static int cuda_bind_thread(be_backend *be, base_err *err) {
    cudaError_t e = cudaSetDevice(cuda_impl(be)->device);
    return e == cudaSuccess ? 0 : cuda_fail(err, "selecting the device for this thread", e);
}

static int cuda_memory_info(be_backend *, uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

static const be_ops cuda_ops = {
    .destroy = cuda_destroy,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .upload = cuda_upload,
    .download = cuda_download,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .download_async = cuda_download_async,
    .copy = cuda_copy,
    .read_sum = NULL, /* the ceiling is the copy */
    .map_weights = cuda_map_weights,
    .pack_linear = cuda_pack_linear,
    .sync = cuda_sync,
    .bind_thread = cuda_bind_thread,
    .memory_info = cuda_memory_info,
    .embedding = cuda_embedding,
    .matmul = cuda_matmul,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .glu = cuda_glu,
    .scale = cuda_scale,
    .softcap = cuda_softcap,
    .rope = cuda_rope,
    .kv_append = cuda_kv_append,
    .attention = cuda_attention,
    .argmax = cuda_argmax,
    .topk_candidates = cuda_topk_candidates,
    .moe = cuda_moe,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_free = cuda_graph_free,
    .add_rmsnorm = cuda_add_rmsnorm,
    .rmsnorm_add = cuda_rmsnorm_add,
    .rmsnorm_pair = cuda_rmsnorm_pair,
    .matmul_qkv = cuda_matmul_qkv,
    .matmul_glu = cuda_matmul_glu,
    .rope_kv_append = cuda_rope_kv_append,
    .rope_kv_attention = cuda_rope_kv_attention,
    .matmul_add = cuda_matmul_add,
};

/* The caller owns *out and releases it with be_destroy (or ops->destroy). */
extern "C" int be_cuda_create(int device, be_backend **out, base_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: no usable device: %s", cudaGetErrorString(e));
    if (n == 0) return base_fail(err, "cuda: no CUDA device present");
    if (device < 0 || device >= n)
        return base_fail(err, "cuda: device %d out of range (%d present)", device, n);
    if ((e = cudaSetDevice(device)) != cudaSuccess) return cuda_fail(err, "selecting device", e);
    cudaDeviceProp prop;
    if ((e = cudaGetDeviceProperties(&prop, device)) != cudaSuccess)
        return cuda_fail(err, "reading device properties", e);
    cuda_backend *c = (cuda_backend *)calloc(1, sizeof *c);
    be_backend *be = (be_backend *)calloc(1, sizeof *be);
    if (!c || !be) {
        free(c);
        free(be);
        return base_fail(err, "cuda: out of host memory");
    }
    c->device = device;
    c->sm_count = prop.multiProcessorCount;
    c->att_stages = CUDA_ATT_STAGES;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        free(be);
        return cuda_fail(err, "creating stream", e);
    }
    if ((e = cudaMalloc(&c->blas_ws, CUDA_BLAS_WORKSPACE)) != cudaSuccess) {
        cudaStreamDestroy(c->stream);
        free(c);
        free(be);
        return cuda_fail(err, "allocating the cuBLAS workspace", e);
    }
    cublasStatus_t bs = cublasCreate(&c->blas);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(c->blas, c->stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(c->blas, c->blas_ws, CUDA_BLAS_WORKSPACE);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        if (c->blas) cublasDestroy(c->blas);
        cudaFree(c->blas_ws);
        cudaStreamDestroy(c->stream);
        free(c);
        free(be);
        return base_fail(err, "cuda: creating the cuBLAS handle: %s", cublasGetStatusString(bs));
    }
    be->name = "cuda";
    be->ops = &cuda_ops;
    snprintf(be->device, sizeof be->device, "%.127s", prop.name);
    /* F32 activations: BF16 storage of the residual stream, q and k cost the fixtures 1.5 to
     * 3.7e-2 relative error in their logits, F32 with BF16 only at the tensor cores' inputs
     * about 1e-2; the bytes are small next to the weights' in decode. */
    be->act_dtype = BASE_DTYPE_F32;
    be->n_threads = 1;
    /* its decode figures and issue targets are stated against the copy */
    be->ceiling = BE_CEILING_COPY;
    be->quant_kinds = 1u << BE_QUANT_AFFINE;
    be->moe_quant_kinds = 1u << BE_QUANT_AFFINE | 1u << BE_QUANT_MXFP4;
    be->target_parallelism = c->sm_count * CUDA_CTAS_PER_SM;
    /* The GEMM path dequantizes every weight once per matmul call, about 34 GB of traffic for
     * an 8B model: 2048 rows make that a small share of the step. */
    be->prefill_chunk = 2048;
    be->impl = c;
    *out = be;
    return 0;
}
