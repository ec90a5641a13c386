/* The part of NCCL's C interface mlxcel calls, declared here so that the library can be
 * loaded at run time (dlopen of libnccl.so.2) and a build without NCCL compiles unchanged. The
 * values and signatures follow nccl.h of NCCL 2.21 (the types, the enum values and these
 * entry points have kept their ABI since 2.10, where ncclBfloat16 came in); a library older
 * than 2.10 is refused at load. Streams are passed as cudaStream_t's bits (void *). */
#ifndef MLXCEL_NCCL_ABI_H
#define MLXCEL_NCCL_ABI_H

#include <stddef.h>

typedef struct ncclComm *ncclComm_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum { ncclSuccess = 0, ncclInProgress = 7 } ncclResult_t;

typedef enum {
    ncclInt32 = 2,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclBfloat16 = 9,
} ncclDataType_t;

typedef enum { ncclSum = 0 } ncclRedOp_t;

/* The first version whose ABI these declarations match (2.10.3). */
#define NCCL_ABI_MIN_VERSION 21003

typedef ncclResult_t (*nccl_get_version_fn)(int *version);
typedef const char *(*nccl_get_error_string_fn)(ncclResult_t result);
typedef ncclResult_t (*nccl_comm_init_all_fn)(ncclComm_t *comms, int ndev, const int *devlist);
typedef ncclResult_t (*nccl_comm_destroy_fn)(ncclComm_t comm);
typedef ncclResult_t (*nccl_comm_abort_fn)(ncclComm_t comm);
typedef ncclResult_t (*nccl_comm_get_async_error_fn)(ncclComm_t comm, ncclResult_t *async_error);
typedef ncclResult_t (*nccl_all_reduce_fn)(const void *sendbuff, void *recvbuff, size_t count,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           void *stream);
typedef ncclResult_t (*nccl_all_gather_fn)(const void *sendbuff, void *recvbuff, size_t sendcount,
                                           ncclDataType_t datatype, ncclComm_t comm, void *stream);
typedef ncclResult_t (*nccl_group_fn)(void);

/* The loaded library (backend_nccl.c): its handle and entry points. */
struct be_nccl {
    void *lib; /* dlopen handle */
    int version;
    nccl_get_error_string_fn get_error_string;
    nccl_comm_init_all_fn comm_init_all;
    nccl_comm_destroy_fn comm_destroy;
    nccl_comm_abort_fn comm_abort;
    nccl_comm_get_async_error_fn comm_get_async_error;
    nccl_all_reduce_fn all_reduce;
    nccl_all_gather_fn all_gather;
    nccl_group_fn group_start, group_end;
};

#endif
