/* The CUDA backend's private parts shared by its .cu files (compiled as CUDA C by nvcc). */
#ifndef MLXCEL_BACKEND_CUDA_INTERNAL_H
#define MLXCEL_BACKEND_CUDA_INTERNAL_H

#ifdef __cplusplus
extern "C" {
#endif
#include "backend/backend.h"
#ifdef __cplusplus
}
#endif

#endif
