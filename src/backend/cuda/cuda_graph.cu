/* Recording a sequence of ops as a CUDA graph and running it again: a decode step is a few
 * hundred small launches whose host-side cost is about what the GPU spends on many of them;
 * replaying the step's graph issues them all at once.
 *
 * Capture is thread-local, so that another thread's CUDA calls (a second backend, a copy)
 * neither break it nor get recorded. An op that cannot be recorded (one that allocates, say)
 * fails while capturing; capture_end then reports the capture as unusable and the caller runs
 * the step directly instead. */
#include "backend/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* Decided on first use rather than at backend creation so that the environment read stays
 * next to the launches it governs. Programmatic edges survive stream capture, so recorded
 * steps keep the overlap. */
bool cuda_pdl_enabled(cuda_backend *c) {
    if (c->pdl == 0) {
        int major = 0;
        const char *env = getenv("MLXCEL_PDL");
        bool off = env && strcmp(env, "0") == 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) !=
            cudaSuccess) {
            cudaGetLastError();
            major = 0;
        }
        c->pdl = !off && major >= 9 ? 1 : -1;
    }
    return c->pdl > 0;
}

struct be_graph {
    cudaGraphExec_t exec;
};

int cuda_capture_begin(be_backend *be, base_err *err) {
    cudaError_t e = cudaStreamBeginCapture(cuda_impl(be)->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: beginning a capture: %s", cudaGetErrorString(e));
    return 0;
}

int cuda_capture_end(be_backend *be, be_graph **graph, base_err *err) {
    *graph = NULL;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(cuda_impl(be)->stream, &g);
    /* A failed op leaves its error pending; clear it with the capture. */
    cudaGetLastError();
    if (e != cudaSuccess || !g) {
        if (g) cudaGraphDestroy(g);
        return base_fail(
            err, "cuda: the capture could not be recorded: %s",
            cudaGetErrorString(e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated));
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return base_fail(err, "cuda: instantiating a graph: %s", cudaGetErrorString(e));
    }
    be_graph *r = (be_graph *)malloc(sizeof *r);
    if (!r) {
        cudaGraphExecDestroy(exec);
        return base_fail(err, "cuda: out of host memory");
    }
    r->exec = exec;
    *graph = r;
    return 0;
}

int cuda_graph_launch(be_backend *be, be_graph *graph, base_err *err) {
    cudaError_t e = cudaGraphLaunch(graph->exec, cuda_impl(be)->stream);
    if (e != cudaSuccess)
        return base_fail(err, "cuda: launching a graph: %s", cudaGetErrorString(e));
    return 0;
}

void cuda_graph_free(be_backend *, be_graph *graph) {
    if (!graph) return;
    cudaGraphExecDestroy(graph->exec);
    free(graph);
}
