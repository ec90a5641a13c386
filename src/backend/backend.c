/* Backend-independent entry points: destruction through the op table, and the CUDA
 * constructor's stand-in for builds without CUDA. */
#include "backend/backend.h"

void be_destroy(be_backend *be) {
    if (be) be->ops->destroy(be);
}

#ifndef MLXCEL_HAVE_CUDA
int be_cuda_create(int device, be_backend **out, base_err *err) {
    *out = NULL;
    return base_fail(err, "cuda device %d: mlxcel was built without CUDA", device);
}
#endif
